//! `esp-emu`: an **emulation** of IPsec ESP's per-packet processing inside the WAN emulator,
//! the baseline for the papers' 3DES figures on a kernel without ESP (as here).
//!
//! What it does, per IPv4 packet, in one [`EspEmu`] stage per direction (one forwarder thread
//! each, so packets of one direction are processed one at a time, as one IPsec SA is):
//! 1. Sender's work (RFC 4303 §3.1.1 transport mode, RFC 2451 3DES-CBC, RFC 2404
//!    HMAC-SHA1-96): take the IP payload, append ESP trailer padding, pad length and next
//!    header to a multiple of 8 bytes, encrypt it with 3DES-CBC under a fresh IV (the SPI and
//!    sequence number encrypted under the key, so never repeated within the SA), and compute
//!    HMAC-SHA1 over `SPI ‖ seq ‖ IV ‖ ciphertext`, truncated to 96 bits.
//! 2. Receiver's work: recompute the ICV and compare it in constant time, decrypt, check the
//!    padding, and put the plaintext back.
//! 3. The packet's release time moves later by the real time the two steps took, so the
//!    crypto adds latency as well as limiting throughput.
//!
//! What it does **not** do: the bytes on the emulated wire stay the original packet (the
//! receiving kernel has no ESP to strip a header), so the 8-byte ESP header, 8-byte IV, 2–9
//! bytes of trailer and 12-byte ICV are counted ([`EspCounters::overhead_bytes`]) but not
//! sent; with no rate limit on the link that costs nothing anyway. Both ends' work runs on
//! the emulator's thread for that direction rather than on the two hosts' CPUs, so the
//! crypto CPU shows up as emulator CPU in the results. It has not yet been checked against
//! kernel ESP (`ipsec`), which this kernel lacks.
//!
//! Scheduling: the emulator's forwarder threads run in `SCHED_FIFO` so host load does not
//! delay packet releases. The crypto must not inherit that, or on a loaded host the baseline's
//! 3DES would pre-empt everything while seal's 3DES (in the target and bench processes)
//! competes with the load: measured at load average 7–11, esp-emu got 65–75 % of a core at
//! OP-8 while seal's processes got 15–30 % each. So each packet's crypto runs in the normal
//! time-sharing class ([`FairShare`]), like the two hosts' crypto, and the thread returns to
//! its previous class for the delay emulation.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use cbc::cipher::block_padding::NoPadding;
use cbc::cipher::{BlockDecryptMut, BlockEncrypt, BlockEncryptMut, KeyInit, KeyIvInit};
use hmac::{Hmac, Mac};
use ipsan_wan::{DropReason, Nanos, Packet, Stage, Verdict};
use sha1::Sha1;

type Enc = cbc::Encryptor<des::TdesEde3>;
type Dec = cbc::Decryptor<des::TdesEde3>;

/// ESP header (SPI + sequence number) length.
const ESP_HDR: usize = 8;
/// 3DES block / IV length.
const IV_LEN: usize = 8;
/// HMAC-SHA1-96 ICV length (RFC 2404).
const ICV_LEN: usize = 12;

/// Counters shared with the runner.
#[derive(Debug, Default)]
pub struct EspCounters {
    /// Packets sealed and opened.
    pub packets: AtomicU64,
    /// IP payload bytes processed.
    pub payload_bytes: AtomicU64,
    /// ESP bytes that real ESP would have added on the wire.
    pub overhead_bytes: AtomicU64,
    /// Packets whose ICV or padding did not check (would be a bug: nothing tampers between).
    pub failures: AtomicU64,
    /// Nanoseconds spent on the crypto.
    pub busy_ns: AtomicU64,
}

/// The per-direction key material of one emulated SA. `Debug` never prints it.
pub struct SaKeys {
    enc: [u8; 24],
    auth: [u8; 20],
}

impl std::fmt::Debug for SaKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SaKeys(<redacted>)")
    }
}

impl Drop for SaKeys {
    fn drop(&mut self) {
        self.enc.fill(0);
        self.auth.fill(0);
    }
}

impl SaKeys {
    /// Fresh random keys from the kernel's RNG.
    pub fn random() -> std::io::Result<SaKeys> {
        use std::io::Read;
        let mut f = std::fs::File::open("/dev/urandom")?;
        let mut k = SaKeys {
            enc: [0; 24],
            auth: [0; 20],
        };
        f.read_exact(&mut k.enc)?;
        f.read_exact(&mut k.auth)?;
        Ok(k)
    }

    /// Fixed keys for tests.
    pub fn fixed(byte: u8) -> SaKeys {
        SaKeys {
            enc: [byte; 24],
            auth: [byte ^ 0x5a; 20],
        }
    }
}

/// One direction's ESP emulation.
pub struct EspEmu {
    keys: SaKeys,
    spi: u32,
    seq: u64,
    scratch: Vec<u8>,
    counters: Arc<EspCounters>,
    #[cfg(test)]
    last_wire: Vec<u8>,
}

impl std::fmt::Debug for EspEmu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EspEmu")
            .field("spi", &self.spi)
            .field("seq", &self.seq)
            .field("keys", &self.keys)
            .finish()
    }
}

/// Why one packet failed the receiver's checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EspFailure {
    /// Not an IPv4 packet with a sane header.
    NotIpv4,
    /// The ICV did not verify.
    BadIcv,
    /// The padding or pad length was wrong after decryption.
    BadPadding,
}

impl EspEmu {
    /// A stage for one direction with its own SA.
    pub fn new(keys: SaKeys, spi: u32, counters: Arc<EspCounters>) -> EspEmu {
        EspEmu {
            keys,
            spi,
            seq: 0,
            scratch: Vec::with_capacity(2048),
            counters,
            #[cfg(test)]
            last_wire: Vec::new(),
        }
    }

    /// Seals and opens `payload` in place (sender then receiver), returning the bytes ESP
    /// would have added.
    pub fn roundtrip(&mut self, payload: &mut [u8], next_header: u8) -> Result<usize, EspFailure> {
        self.seq = self.seq.wrapping_add(1);
        // --- sender ---
        let body = payload.len() + 2;
        let pad = (8 - body % 8) % 8;
        let ct_len = body + pad;
        let total = ESP_HDR + IV_LEN + ct_len + ICV_LEN;
        self.scratch.clear();
        self.scratch.resize(total, 0);
        let (hdr, rest) = self.scratch.split_at_mut(ESP_HDR);
        hdr[..4].copy_from_slice(&self.spi.to_be_bytes());
        hdr[4..].copy_from_slice(&(self.seq as u32).to_be_bytes());
        let (iv, rest) = rest.split_at_mut(IV_LEN);
        // IV = E_K(SPI ‖ seq): unique per packet within the SA and unpredictable without K.
        let mut ivb = [0u8; 8];
        ivb[..4].copy_from_slice(&self.spi.to_be_bytes());
        ivb[4..].copy_from_slice(&(self.seq as u32).to_be_bytes());
        let block_cipher = des::TdesEde3::new((&self.keys.enc).into());
        let mut blk = ivb.into();
        block_cipher.encrypt_block(&mut blk);
        iv.copy_from_slice(&blk);
        let (ct, _icv) = rest.split_at_mut(ct_len);
        ct[..payload.len()].copy_from_slice(payload);
        for (i, b) in ct[payload.len()..payload.len() + pad]
            .iter_mut()
            .enumerate()
        {
            *b = (i + 1) as u8; // RFC 4303 §2.4 default padding 1, 2, 3, ...
        }
        ct[ct_len - 2] = pad as u8;
        ct[ct_len - 1] = next_header;
        Enc::new((&self.keys.enc).into(), (&*iv).into())
            .encrypt_padded_mut::<NoPadding>(ct, ct_len)
            .map_err(|_| EspFailure::BadPadding)?;
        let mut mac =
            <Hmac<Sha1> as Mac>::new_from_slice(&self.keys.auth).map_err(|_| EspFailure::BadIcv)?;
        mac.update(&self.scratch[..ESP_HDR + IV_LEN + ct_len]);
        let tag = mac.finalize().into_bytes();
        let icv_at = ESP_HDR + IV_LEN + ct_len;
        self.scratch[icv_at..].copy_from_slice(&tag[..ICV_LEN]);
        #[cfg(test)]
        {
            self.last_wire = self.scratch.clone();
        }
        // --- receiver ---
        let mut mac =
            <Hmac<Sha1> as Mac>::new_from_slice(&self.keys.auth).map_err(|_| EspFailure::BadIcv)?;
        mac.update(&self.scratch[..icv_at]);
        mac.verify_truncated_left(&self.scratch[icv_at..])
            .map_err(|_| EspFailure::BadIcv)?;
        let mut ivr = [0u8; IV_LEN];
        ivr.copy_from_slice(&self.scratch[ESP_HDR..ESP_HDR + IV_LEN]);
        let ct = &mut self.scratch[ESP_HDR + IV_LEN..icv_at];
        Dec::new((&self.keys.enc).into(), (&ivr).into())
            .decrypt_padded_mut::<NoPadding>(ct)
            .map_err(|_| EspFailure::BadPadding)?;
        let padlen = usize::from(ct[ct_len - 2]);
        if padlen != pad || ct[ct_len - 1] != next_header {
            return Err(EspFailure::BadPadding);
        }
        let plain_len = ct_len - 2 - padlen;
        if plain_len != payload.len() {
            return Err(EspFailure::BadPadding);
        }
        payload.copy_from_slice(&ct[..plain_len]);
        Ok(total)
    }
}

/// Drops the calling thread from `SCHED_FIFO`/`SCHED_RR` to `SCHED_OTHER` for its lifetime
/// and restores the previous class and priority on drop; does nothing for a thread that is
/// not real-time. Three syscalls, against ~350 µs of 3DES per 1400-byte packet.
struct FairShare {
    restore: Option<(libc::c_int, libc::c_int)>,
}

impl FairShare {
    #[allow(unsafe_code)]
    fn enter() -> FairShare {
        // SAFETY: pid 0 is the calling thread; `param` is a valid, writable sched_param.
        let restore = unsafe {
            let policy = libc::sched_getscheduler(0);
            let mut param: libc::sched_param = std::mem::zeroed();
            if (policy == libc::SCHED_FIFO || policy == libc::SCHED_RR)
                && libc::sched_getparam(0, &mut param) == 0
            {
                let normal = libc::sched_param { sched_priority: 0 };
                (libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal) == 0)
                    .then_some((policy, param.sched_priority))
            } else {
                None
            }
        };
        FairShare { restore }
    }
}

impl Drop for FairShare {
    #[allow(unsafe_code)]
    fn drop(&mut self) {
        if let Some((policy, prio)) = self.restore {
            let p = libc::sched_param {
                sched_priority: prio,
            };
            // SAFETY: pid 0 is the calling thread; `p` is a valid sched_param. We only
            // return to a class this thread was already allowed to be in.
            unsafe {
                libc::sched_setscheduler(0, policy, &p);
            }
        }
    }
}

impl Stage for EspEmu {
    fn name(&self) -> &'static str {
        "esp-emu"
    }

    fn process(&mut self, _now: Nanos, pkt: &mut Packet) -> Verdict {
        // The crypto competes for the CPU like the hosts' own would (module docs).
        let fair = FairShare::enter();
        let started = Instant::now();
        let data = pkt.data_mut();
        // IPv4 only (the lab's links are IPv4): header length from IHL, protocol at byte 9.
        let ok = data.len() >= 20 && data[0] >> 4 == 4 && usize::from(data[0] & 0x0f) * 4 >= 20;
        let ihl = usize::from(data.first().map_or(0, |b| b & 0x0f)) * 4;
        let result = if ok && ihl <= data.len() {
            let proto = data[9];
            let payload_len = data.len() - ihl;
            self.roundtrip(&mut data[ihl..], proto)
                .map(|total| (payload_len, total))
        } else {
            Err(EspFailure::NotIpv4)
        };
        let elapsed = started.elapsed().as_nanos() as u64;
        drop(fair);
        self.counters.busy_ns.fetch_add(elapsed, Ordering::Relaxed);
        // The crypto took real time on this direction's only thread; the packet leaves that
        // much later (later packets already waited for it while this thread was busy).
        pkt.release_at = pkt.release_at.saturating_add(elapsed);
        match result {
            Ok((payload, total)) => {
                self.counters.packets.fetch_add(1, Ordering::Relaxed);
                self.counters
                    .payload_bytes
                    .fetch_add(payload as u64, Ordering::Relaxed);
                self.counters
                    .overhead_bytes
                    .fetch_add((total - payload) as u64, Ordering::Relaxed);
                Verdict::Pass
            }
            Err(EspFailure::NotIpv4) => Verdict::Pass,
            Err(_) => {
                self.counters.failures.fetch_add(1, Ordering::Relaxed);
                Verdict::Drop(DropReason::Stage)
            }
        }
    }
}

/// The two stages of one emulated SA pair (initiator → target, target → initiator) and their
/// shared counters.
pub fn stages() -> std::io::Result<(EspEmu, EspEmu, Arc<EspCounters>)> {
    let c = Arc::new(EspCounters::default());
    Ok((
        EspEmu::new(SaKeys::random()?, 0x1000_0001, c.clone()),
        EspEmu::new(SaKeys::random()?, 0x1000_0002, c.clone()),
        c,
    ))
}

/// Measures this machine's esp-emu throughput (payload bytes/s) on `packet_len`-byte IP
/// payloads for about `budget`: the ENC·DEC-combined rate the model's per-packet crypto term
/// needs.
pub fn bench(packet_len: usize, budget: std::time::Duration) -> f64 {
    let mut e = EspEmu::new(SaKeys::fixed(7), 1, Arc::new(EspCounters::default()));
    let mut buf = vec![0xa5u8; packet_len];
    let t = Instant::now();
    let mut n = 0u64;
    while t.elapsed() < budget || n < 16 {
        if e.roundtrip(&mut buf, 6).is_err() {
            return f64::NAN;
        }
        n += 1;
    }
    (n as f64 * packet_len as f64) / t.elapsed().as_secs_f64()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ipv4(payload: &[u8]) -> Vec<u8> {
        let mut p = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 10, 231, 0, 1, 10, 231, 0, 2,
        ];
        p.extend_from_slice(payload);
        p
    }

    #[test]
    fn roundtrip_restores_every_payload_length() {
        let mut e = EspEmu::new(SaKeys::fixed(1), 9, Arc::new(EspCounters::default()));
        for len in 0..64usize {
            let orig: Vec<u8> = (0..len).map(|i| (i * 7) as u8).collect();
            let mut buf = orig.clone();
            let total = e.roundtrip(&mut buf, 6).unwrap();
            assert_eq!(buf, orig, "len {len}");
            assert_eq!((total - ESP_HDR - IV_LEN - ICV_LEN) % 8, 0);
            assert!(total >= len + ESP_HDR + IV_LEN + ICV_LEN + 2);
        }
    }

    #[test]
    fn ciphertext_differs_from_plaintext_and_between_packets() {
        let mut e = EspEmu::new(SaKeys::fixed(2), 9, Arc::new(EspCounters::default()));
        let mut a = vec![0u8; 1400];
        e.roundtrip(&mut a, 6).unwrap();
        let first = e.last_wire.clone();
        e.roundtrip(&mut a, 6).unwrap();
        assert_eq!(a, vec![0u8; 1400]);
        assert_ne!(
            first, e.last_wire,
            "same plaintext, fresh IV, different wire bytes"
        );
        assert!(!first[ESP_HDR + IV_LEN..ESP_HDR + IV_LEN + 64]
            .iter()
            .all(|b| *b == 0));
    }

    #[test]
    fn stage_passes_packets_intact_and_counts_them() {
        let c = Arc::new(EspCounters::default());
        let mut e = EspEmu::new(SaKeys::fixed(3), 9, c.clone());
        let raw = ipv4(&[1u8; 1000]);
        let mut pkt = Packet::from_slice(&raw, 2048);
        pkt.reset(100);
        assert_eq!(e.process(100, &mut pkt), Verdict::Pass);
        assert_eq!(pkt.data(), &raw[..]);
        assert!(pkt.release_at > 100, "crypto time pushes the release later");
        assert_eq!(c.packets.load(Ordering::Relaxed), 1);
        assert_eq!(c.payload_bytes.load(Ordering::Relaxed), 1000);
        // Non-IPv4 bytes pass untouched and uncounted.
        let mut junk = Packet::from_slice(&[0x60, 0, 0], 64);
        assert_eq!(e.process(0, &mut junk), Verdict::Pass);
        assert_eq!(c.packets.load(Ordering::Relaxed), 1);
    }

    #[test]
    fn keys_never_show_in_debug() {
        let e = EspEmu::new(SaKeys::fixed(0x41), 9, Arc::new(EspCounters::default()));
        let s = format!("{e:?}");
        assert!(s.contains("redacted"));
        assert!(!s.contains("65"));
    }

    #[test]
    fn crypto_leaves_the_realtime_class_and_returns_to_it() {
        if ipsan_wan::set_thread_realtime(10).is_err() {
            eprintln!("SKIP: cannot enter SCHED_FIFO here (needs root)");
            return;
        }
        #[allow(unsafe_code)]
        // SAFETY: pid 0 is the calling thread.
        let policy = || unsafe { libc::sched_getscheduler(0) };
        assert_eq!(policy(), libc::SCHED_FIFO);
        {
            let _f = FairShare::enter();
            assert_eq!(policy(), libc::SCHED_OTHER);
        }
        assert_eq!(policy(), libc::SCHED_FIFO);
        // And a normal thread stays normal.
        let normal = libc::sched_param { sched_priority: 0 };
        #[allow(unsafe_code)]
        // SAFETY: pid 0 is the calling thread; `normal` is a valid sched_param.
        unsafe {
            libc::sched_setscheduler(0, libc::SCHED_OTHER, &normal);
        }
        drop(FairShare::enter());
        assert_eq!(policy(), libc::SCHED_OTHER);
    }
}
