//! Record protection: every PDU of a sealed session is authenticated (docs/seal.md §4a).
//!
//! One sans-IO step between the PDU codec and the full-feature logic, the same for both roles:
//! the framed write calls [`RecordSealer::protect`] on each outgoing PDU, the framed read of
//! both roles is [`read_pdu`]: on a sealed connection it frames each incoming PDU (reading only
//! its lengths), verifies its tag with [`RecordOpener::open`], and only then checks its digests
//! and parses its header. Every failure is a [`Forgery`]: the connection is dropped, nothing
//! is answered (no Reject, RFC 7143 §11.17, whose copy of an unverified header would carry an
//! attacker's ITT back under a genuine tag).
//!
//! ```text
//! PDU on the wire:  BHS (TotalAHSLength counts the Seal AHS) | other AHS | Seal AHS | data
//! Seal AHS (20 bytes, RFC 7143 §11.2.1.2 AHS, type 63):
//!     AHSLength = 17 (2) | AHSType = 63 (1) | version = 1 (1) | tag (16)
//! tag = MAC_dir(counter_dir (8, big-endian) || BHS || other AHS || Seal AHS's first 4 bytes
//!               || data segment, except for SCSI Command, Data-Out and Data-In)
//! ```
//!
//! `counter_dir` is implicit: each direction counts its full-feature PDUs from 0, so a dropped,
//! replayed, reordered or injected PDU makes this and every later tag fail. The data of SCSI
//! Command (immediate data), SCSI Data-Out and SCSI Data-In is not MACed again: in a Seal
//! session it is a slice of a sealed transfer whose chunks are AEAD-authenticated (and bound to
//! LUN, LBA, ITT, opcode, length and position, §4) before any byte of it is used; the header
//! that frames it (offset, length, ITT, TTT, DataSN, F and S bits, status) is MACed here. Every
//! other PDU (sense in a SCSI Response, text, NOP ping data, Reject, Async Message) is MACed
//! whole. Sending costs one short MAC per PDU, not a second pass over the data.
//!
//! MAC: AES-256-GCM or ChaCha20-Poly1305 with an empty plaintext (GMAC / Poly1305 over the
//! AAD), nonce `iv_dir XOR counter`, as the session's cipher; HMAC-SHA256 truncated to 16 bytes
//! for the legacy 3DES cipher; `none` sends a zero tag and checks only the framing (a baseline).
//! Keys: see [`layer`]; every 2^24 PDUs the AEAD key changes (record key epochs).

use std::sync::atomic::{AtomicU64, Ordering};

use aws_lc_rs::{aead, digest, hmac};
use bytes::BytesMut;
use iscsi_wire::{Codec, Frame, Header, Pdu, WireError, BHS_LEN};
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::cipher::{epoch_key_material, hkdf_sha256, Cipher, IV_LEN};
use crate::error::{Forgery, NegotiationError, SealError};
use crate::frame::{Direction, Role};
use crate::schedule::TranscriptHash;

/// AHSType of the Seal AHS (RFC 7143 §11.2.1.2 leaves 3-63 unassigned; RFC 3720 §10.2.2.1 set
/// 60-63 aside for non-iSCSI extensions). Only ipsan peers that agreed to Seal send it.
pub const AHS_TYPE: u8 = 63;
/// Version of the record format, carried in the Seal AHS.
pub const RECORD_VERSION: u8 = 1;
/// Bytes of the record tag.
pub const TAG_LEN: usize = 16;
/// Bytes the Seal AHS adds to every PDU (5 words of TotalAHSLength).
pub const SEAL_AHS_LEN: usize = 4 + TAG_LEN;
/// AHSLength (2, big-endian: version byte + tag), AHSType, version.
const AHS_HEAD: [u8; 4] = [0, 1 + TAG_LEN as u8, AHS_TYPE, RECORD_VERSION];
/// PDUs per AEAD record key: GMAC over a few blocks per PDU, so about 2^27 blocks per key.
pub const EPOCH_PDUS: u64 = 1 << 24;
const EPOCH_SALT: &[u8] = b"ipsan-seal record epoch";

/// Forged PDUs detected by every record opener of this process (for logs and metrics).
static FORGED: AtomicU64 = AtomicU64::new(0);

/// How many forged (or altered, replayed, reordered, dropped) PDUs this process has detected.
pub fn forged_pdus() -> u64 {
    FORGED.load(Ordering::Relaxed)
}

/// Whether a PDU's data segment is part of a sealed transfer (authenticated per chunk, §4) and
/// so left out of the record MAC: SCSI Command (0x01), SCSI Data-Out (0x05), SCSI Data-In
/// (0x25).
#[must_use]
pub const fn data_is_sealed_transfer(opcode: u8) -> bool {
    matches!(opcode & 0x3f, 0x01 | 0x05 | 0x25)
}

/// The BHS of `header` as the codec will write it with `ahs_len` bytes of AHS and `dsl` bytes
/// of data (RFC 7143 §11.2.1: TotalAHSLength in words, 24-bit DataSegmentLength).
fn wire_bhs(header: &Header, ahs_len: usize, dsl: usize) -> [u8; BHS_LEN] {
    let mut b = [0u8; BHS_LEN];
    header.write(&mut b);
    b[4] = u8::try_from(ahs_len / 4).unwrap_or(u8::MAX);
    b[5] = (dsl >> 16) as u8;
    b[6] = (dsl >> 8) as u8;
    b[7] = dsl as u8;
    b
}

/// The running hash of every Login PDU of one login (both directions, in order): what the key
/// confirmations and the record keys bind, so no login key can be edited on the path
/// (docs/seal.md §3). Each PDU adds `direction (1) || u32 AHS length || BHS || AHS ||
/// u32 data length || data` (data without padding) to a SHA-256.
#[derive(Clone)]
pub struct LoginTranscript {
    ctx: digest::Context,
    before_last: TranscriptHash,
    pdus: u32,
}

impl std::fmt::Debug for LoginTranscript {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LoginTranscript")
            .field("pdus", &self.pdus)
            .finish_non_exhaustive()
    }
}

impl Default for LoginTranscript {
    fn default() -> Self {
        Self::new()
    }
}

impl LoginTranscript {
    /// An empty transcript.
    #[must_use]
    pub fn new() -> Self {
        let ctx = digest::Context::new(&digest::SHA256);
        let before_last = finish(ctx.clone());
        Self {
            ctx,
            before_last,
            pdus: 0,
        }
    }

    /// Adds one Login PDU as it is on the wire.
    pub fn add(&mut self, dir: Direction, bhs: &[u8; BHS_LEN], ahs: &[u8], data: &[u8]) {
        self.before_last = self.hash();
        self.ctx.update(&[dir.id()]);
        self.ctx
            .update(&u32::try_from(ahs.len()).unwrap_or(u32::MAX).to_be_bytes());
        self.ctx.update(bhs);
        self.ctx.update(ahs);
        self.ctx
            .update(&u32::try_from(data.len()).unwrap_or(u32::MAX).to_be_bytes());
        self.ctx.update(data);
        self.pdus = self.pdus.saturating_add(1);
    }

    /// Adds a received Login PDU (its BHS exactly as received).
    pub fn add_received(&mut self, dir: Direction, pdu: &Pdu) {
        self.add(dir, pdu.raw_bhs(), &pdu.ahs, &pdu.data);
    }

    /// Adds a Login PDU this side sends (its BHS as the codec writes it).
    pub fn add_sent(&mut self, dir: Direction, pdu: &Pdu) {
        let bhs = wire_bhs(&pdu.header, pdu.ahs.len(), pdu.data.len());
        self.add(dir, &bhs, &pdu.ahs, &pdu.data);
    }

    /// The hash of every PDU added so far.
    #[must_use]
    pub fn hash(&self) -> TranscriptHash {
        finish(self.ctx.clone())
    }

    /// The hash of every PDU added before the last one.
    #[must_use]
    pub fn hash_before_last(&self) -> TranscriptHash {
        self.before_last
    }

    /// PDUs added so far.
    #[must_use]
    pub fn pdus(&self) -> u32 {
        self.pdus
    }
}

fn finish(ctx: digest::Context) -> TranscriptHash {
    let mut out = [0u8; 32];
    out.copy_from_slice(ctx.finish().as_ref());
    out
}

/// One direction's AEAD record key: the root, the IV and the current epoch's key.
struct AeadMac {
    alg: &'static aead::Algorithm,
    root: Zeroizing<[u8; 32]>,
    iv: Zeroizing<[u8; IV_LEN]>,
    epoch: u64,
    key: aead::LessSafeKey,
}

/// One direction's MAC key.
enum MacKey {
    Aead(Box<AeadMac>),
    Hmac(Box<hmac::Key>),
    None,
}

fn aead_epoch_key(
    alg: &'static aead::Algorithm,
    root: &[u8; 32],
    epoch: u64,
) -> Result<aead::LessSafeKey, SealError> {
    let mut k = Zeroizing::new([0u8; 32]);
    epoch_key_material(EPOCH_SALT, root, epoch, &mut *k).map_err(|_| SealError::KeySetup)?;
    let k = aead::UnboundKey::new(alg, &*k).map_err(|_| SealError::KeySetup)?;
    Ok(aead::LessSafeKey::new(k))
}

impl MacKey {
    fn new(
        cipher: Cipher,
        root: Zeroizing<[u8; 32]>,
        iv: Zeroizing<[u8; IV_LEN]>,
    ) -> Result<Self, SealError> {
        let alg = match cipher {
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Cipher::TripleDesCbcHmacSha1 => {
                return Ok(MacKey::Hmac(Box::new(hmac::Key::new(
                    hmac::HMAC_SHA256,
                    &*root,
                ))))
            }
            Cipher::None => return Ok(MacKey::None),
        };
        let key = aead_epoch_key(alg, &root, 0)?;
        Ok(MacKey::Aead(Box::new(AeadMac {
            alg,
            root,
            iv,
            epoch: 0,
            key,
        })))
    }

    /// The tag of `msg` (which starts with the counter) under counter `counter`.
    fn tag(&mut self, counter: u64, msg: &[u8]) -> Result<[u8; TAG_LEN], SealError> {
        let mut out = [0u8; TAG_LEN];
        match self {
            MacKey::Aead(m) => {
                let e = counter / EPOCH_PDUS;
                if e != m.epoch {
                    m.key = aead_epoch_key(m.alg, &m.root, e)?;
                    m.epoch = e;
                }
                let mut n = *m.iv;
                for (b, c) in n[IV_LEN - 8..].iter_mut().zip(counter.to_be_bytes()) {
                    *b ^= c;
                }
                let t = m
                    .key
                    .seal_in_place_separate_tag(
                        aead::Nonce::assume_unique_for_key(n),
                        aead::Aad::from(msg),
                        &mut [],
                    )
                    .map_err(|_| SealError::KeySetup)?;
                out.copy_from_slice(t.as_ref());
            }
            MacKey::Hmac(k) => out.copy_from_slice(&hmac::sign(k, msg).as_ref()[..TAG_LEN]),
            MacKey::None => {}
        }
        Ok(out)
    }
}

/// Builds the MAC input `counter || BHS || AHS (Seal AHS without its tag) || covered data`
/// in `scratch`.
fn mac_input<'a>(
    scratch: &'a mut Vec<u8>,
    counter: u64,
    bhs: &[u8; BHS_LEN],
    ahs: &[u8],
    data: &[u8],
) -> &'a [u8] {
    scratch.clear();
    scratch.extend_from_slice(&counter.to_be_bytes());
    scratch.extend_from_slice(bhs);
    scratch.extend_from_slice(ahs);
    if !data_is_sealed_transfer(bhs[0]) {
        scratch.extend_from_slice(data);
    }
    scratch
}

/// Protects the PDUs one side sends, in send order. Owned by the connection's framed write
/// (one per connection); `Debug` shows only the counter.
pub struct RecordSealer {
    key: MacKey,
    next: u64,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for RecordSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordSealer")
            .field("next", &self.next)
            .finish_non_exhaustive()
    }
}

impl RecordSealer {
    /// Appends the Seal AHS to `pdu` (after any AHS it has) and consumes one counter. Call it
    /// exactly once per PDU, in the order the PDUs go on the wire, after every header field
    /// (StatSN, ExpCmdSN, MaxCmdSN...) has its final value.
    pub fn protect(&mut self, pdu: &mut Pdu) -> Result<(), SealError> {
        let mut ahs = BytesMut::with_capacity(pdu.ahs.len() + SEAL_AHS_LEN);
        ahs.extend_from_slice(&pdu.ahs);
        ahs.extend_from_slice(&AHS_HEAD);
        let bhs = wire_bhs(&pdu.header, ahs.len() + TAG_LEN, pdu.data.len());
        let tag = self.tag(&bhs, &ahs, &pdu.data)?;
        ahs.extend_from_slice(&tag);
        pdu.ahs = ahs.freeze();
        Ok(())
    }

    /// The byte-level core of [`RecordSealer::protect`]: the tag for a PDU whose BHS is `bhs`
    /// (TotalAHSLength already counting the Seal AHS) and whose AHS up to the tag is `ahs`
    /// (other AHS, then the Seal AHS's 4-byte head).
    pub fn tag(
        &mut self,
        bhs: &[u8; BHS_LEN],
        ahs: &[u8],
        data: &[u8],
    ) -> Result<[u8; TAG_LEN], SealError> {
        let counter = self.next;
        self.next = counter.checked_add(1).ok_or(SealError::CounterExhausted)?;
        if matches!(self.key, MacKey::None) {
            // `none`'s tag is zero whatever the input: no MAC input to build.
            return Ok([0; TAG_LEN]);
        }
        let msg = mac_input(&mut self.scratch, counter, bhs, ahs, data);
        self.key.tag(counter, msg)
    }

    /// PDUs protected so far.
    #[must_use]
    pub fn sent(&self) -> u64 {
        self.next
    }
}

/// Verifies the PDUs one side receives, in receive order. Owned by the connection's framed
/// read. After one failure it refuses everything: the connection must be dropped.
pub struct RecordOpener {
    key: MacKey,
    next: u64,
    failed: bool,
    scratch: Vec<u8>,
}

impl std::fmt::Debug for RecordOpener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RecordOpener")
            .field("next", &self.next)
            .field("failed", &self.failed)
            .finish_non_exhaustive()
    }
}

impl RecordOpener {
    /// Verifies `pdu` (as the codec decoded it: raw BHS, AHS with the Seal AHS last, data) and
    /// strips the Seal AHS, so the full-feature logic sees the PDU as the peer built it. On
    /// error nothing of the PDU may be used; the event is counted in [`forged_pdus`]. The
    /// codec has already parsed such a PDU: a connection's framed read uses [`read_pdu`].
    pub fn verify(&mut self, pdu: &mut Pdu) -> Result<(), Forgery> {
        let keep = self.verify_raw(pdu.raw_bhs(), &pdu.ahs, &pdu.data)?;
        pdu.ahs = pdu.ahs.slice(..keep);
        Ok(())
    }

    /// Verifies a PDU that the codec framed but did not interpret ([`Codec::frame`]), then
    /// checks its digests and parses it with the Seal AHS stripped. Nothing of the PDU beyond
    /// its lengths is read before the tag verifies; a digest, opcode or field error after that
    /// is [`Forgery::Unusable`]. After any error the opener refuses everything.
    pub fn open(&mut self, frame: Frame) -> Result<Pdu, Forgery> {
        let keep = self.verify_raw(frame.bhs(), frame.ahs(), frame.data())?;
        let opcode = frame.bhs()[0] & 0x3f;
        frame
            .decode_with_ahs(keep)
            .map_err(|error| self.refuse(self.next.saturating_sub(1), opcode, error))
    }

    /// Fails the opener for a PDU that cannot be used (counted in [`forged_pdus`] like a forgery).
    fn refuse(&mut self, counter: u64, opcode: u8, error: WireError) -> Forgery {
        if !self.failed {
            FORGED.fetch_add(1, Ordering::Relaxed);
        }
        self.failed = true;
        Forgery::Unusable {
            counter,
            opcode,
            error,
        }
    }

    /// The byte-level core of [`RecordOpener::verify`]: returns how many AHS bytes precede
    /// the Seal AHS.
    pub fn verify_raw(
        &mut self,
        bhs: &[u8; BHS_LEN],
        ahs: &[u8],
        data: &[u8],
    ) -> Result<usize, Forgery> {
        let r = self.check(bhs, ahs, data);
        if r.is_err() {
            if !self.failed {
                FORGED.fetch_add(1, Ordering::Relaxed);
            }
            self.failed = true;
        }
        r
    }

    /// Verifies a PDU's tag under the next counter and counts it.
    fn check(&mut self, bhs: &[u8; BHS_LEN], ahs: &[u8], data: &[u8]) -> Result<usize, Forgery> {
        let split = self.check_uncounted(bhs, ahs, data)?;
        self.next = self.next.checked_add(1).ok_or(Forgery::Exhausted)?;
        Ok(split)
    }

    /// Verifies a PDU's tag under the next counter without counting it: how many AHS bytes
    /// precede the Seal AHS.
    fn check_uncounted(
        &mut self,
        bhs: &[u8; BHS_LEN],
        ahs: &[u8],
        data: &[u8],
    ) -> Result<usize, Forgery> {
        let counter = self.next;
        let opcode = bhs[0] & 0x3f;
        if self.failed {
            return Err(Forgery::AlreadyFailed);
        }
        // TotalAHSLength must describe exactly the AHS the codec framed.
        let framed = usize::from(bhs[4]) * 4 == ahs.len();
        let Some(split) = ahs.len().checked_sub(SEAL_AHS_LEN).filter(|_| framed) else {
            return Err(Forgery::Missing { counter, opcode });
        };
        if ahs[split..split + 4] != AHS_HEAD {
            return Err(Forgery::Missing { counter, opcode });
        }
        let (head, tag) = ahs.split_at(split + 4);
        let expected = if matches!(self.key, MacKey::None) {
            // `none`'s tag is zero whatever the input (still checked to be zero below).
            [0; TAG_LEN]
        } else {
            let msg = mac_input(&mut self.scratch, counter, bhs, head, data);
            self.key
                .tag(counter, msg)
                .map_err(|_| Forgery::BadTag { counter, opcode })?
        };
        if !bool::from(expected.as_slice().ct_eq(tag)) {
            return Err(Forgery::BadTag { counter, opcode });
        }
        Ok(split)
    }

    /// Verifies the head (BHS and AHS, the Seal AHS last) of the next PDU before its data
    /// segment is received, for a PDU whose data the record tag does not cover (a Data-In,
    /// [`data_is_sealed_transfer`]: its data is a slice of a sealed transfer, authenticated by
    /// the transfer's chunk tags before any byte of it is used, docs/seal.md §4): the receiver
    /// may then receive that data straight into a buffer of its own (issue 27: a READ's data
    /// in place in the command's buffer) knowing the header it acts on is genuine.
    ///
    /// The PDU is not counted yet: [`RecordOpener::accept_head`] counts it when the caller
    /// takes its data that way; otherwise the PDU is received as usual ([`read_pdu`]), which
    /// verifies it again. A bad tag fails the opener as [`RecordOpener::verify_raw`] does. For
    /// a PDU whose data the tag covers, the tag is checked as if its data were empty, so one
    /// with data fails (closed: the opener refuses everything after).
    pub fn verify_head(
        &mut self,
        bhs: &[u8; BHS_LEN],
        ahs: &[u8],
    ) -> Result<VerifiedHead, Forgery> {
        match self.check_uncounted(bhs, ahs, &[]) {
            Ok(keep) => Ok(VerifiedHead {
                counter: self.next,
                keep,
            }),
            Err(e) => {
                if !self.failed {
                    FORGED.fetch_add(1, Ordering::Relaxed);
                }
                self.failed = true;
                Err(e)
            }
        }
    }

    /// Counts the PDU whose head [`RecordOpener::verify_head`] verified, once its caller takes
    /// its data: the next PDU is checked under the next counter. A head verified under
    /// another counter (the opener moved on meanwhile) fails the opener.
    pub fn accept_head(&mut self, head: VerifiedHead) -> Result<(), Forgery> {
        if self.failed {
            return Err(Forgery::AlreadyFailed);
        }
        if head.counter != self.next {
            self.failed = true;
            FORGED.fetch_add(1, Ordering::Relaxed);
            return Err(Forgery::BadTag {
                counter: self.next,
                opcode: 0,
            });
        }
        self.next = self.next.checked_add(1).ok_or(Forgery::Exhausted)?;
        Ok(())
    }

    /// PDUs verified so far.
    #[must_use]
    pub fn received(&self) -> u64 {
        self.next
    }
}

/// A PDU head verified ahead of its data ([`RecordOpener::verify_head`]): the counter it
/// verified under, for [`RecordOpener::accept_head`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VerifiedHead {
    counter: u64,
    keep: usize,
}

impl VerifiedHead {
    /// How many AHS bytes precede the Seal AHS (the AHS the peer built; none on a Data-In).
    #[must_use]
    pub fn keep(&self) -> usize {
        self.keep
    }
}

/// Why the framed read refused what it received ([`read_pdu`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReadError {
    /// A plain connection's codec error, answered as RFC 7143 says: a Reject naming the
    /// header when the stream is intact (§11.17), the end of the connection when it is not
    /// (§7.8, [`WireError::stream_intact`]).
    #[error(transparent)]
    Wire(WireError),
    /// A sealed connection's PDU failed (docs/seal.md §4a): nothing of it may be used or
    /// answered; drop the connection.
    #[error(transparent)]
    Sealed(Forgery),
}

/// The next PDU off the front of `src`, `Ok(None)` when more bytes are needed: the framed read
/// of both roles (the target's connection reader and the initiator's), so the order is decided
/// here once. Without `record` (a plain connection, or a login) it is [`Codec::decode`]. With
/// it, the PDU is framed from its lengths alone, its record tag is verified, and only then are
/// its digests checked and its header parsed ([`RecordOpener::open`]); a DataSegmentLength
/// over the limit, a missing or bad tag, a bad digest, an unknown opcode or a malformed field
/// all come back as [`ReadError::Sealed`].
pub fn read_pdu(
    codec: &Codec,
    record: Option<&mut RecordOpener>,
    src: &mut BytesMut,
) -> Result<Option<Pdu>, ReadError> {
    let Some(record) = record else {
        return codec.decode(src).map_err(ReadError::Wire);
    };
    match codec.frame(src) {
        Ok(Some(frame)) => record.open(frame).map(Some).map_err(ReadError::Sealed),
        Ok(None) => Ok(None),
        Err(e) => {
            let opcode = e.rejected_header().map_or(0, |b| b[0] & 0x3f);
            Err(ReadError::Sealed(record.refuse(record.next, opcode, e)))
        }
    }
}

fn lp(label: &str) -> Vec<u8> {
    let mut v = Vec::with_capacity(2 + label.len());
    v.extend_from_slice(&u16::try_from(label.len()).unwrap_or(u16::MAX).to_be_bytes());
    v.extend_from_slice(label.as_bytes());
    v
}

/// One direction's record key: `HKDF-SHA256(salt = H_transcript, IKM = K("record"),
/// info = lp("<dir> record key"), 32)` and `... lp("<dir> record iv"), 12)`.
fn direction_key(
    cipher: Cipher,
    root: &[u8; 32],
    transcript: &TranscriptHash,
    dir: &str,
) -> Result<MacKey, NegotiationError> {
    let mut k = Zeroizing::new([0u8; 32]);
    hkdf_sha256(
        transcript,
        root,
        &[&lp(&format!("{dir} record key"))],
        &mut *k,
    )?;
    let mut iv = Zeroizing::new([0u8; IV_LEN]);
    hkdf_sha256(
        transcript,
        root,
        &[&lp(&format!("{dir} record iv"))],
        &mut *iv,
    )?;
    MacKey::new(cipher, k, iv).map_err(|_| NegotiationError::Crypto)
}

/// The record layer of one side: a sealer for its send direction, an opener for its receive
/// direction. `root` is `K("record")` of the key schedule, `transcript` the hash of the whole
/// login (every Login PDU, the final response included): a relay that changed any byte of the
/// login gives the two sides different record keys, and the first PDU fails.
pub(crate) fn layer(
    cipher: Cipher,
    role: Role,
    root: &[u8; 32],
    transcript: &TranscriptHash,
) -> Result<(RecordSealer, RecordOpener), NegotiationError> {
    let i2t = direction_key(cipher, root, transcript, "i2t")?;
    let t2i = direction_key(cipher, root, transcript, "t2i")?;
    let (send, recv) = match role {
        Role::Initiator => (i2t, t2i),
        Role::Target => (t2i, i2t),
    };
    Ok((
        RecordSealer {
            key: send,
            next: 0,
            scratch: Vec::with_capacity(256),
        },
        RecordOpener {
            key: recv,
            next: 0,
            failed: false,
            scratch: Vec::with_capacity(256),
        },
    ))
}

/// A matching sealer/opener pair for one direction (initiator→target) from a fixed root:
/// tests and the fuzz target only.
#[doc(hidden)]
pub fn pair_for_test(cipher: Cipher, seed: u8) -> (RecordSealer, RecordOpener) {
    let root = [seed; 32];
    let transcript = [seed ^ 0x5a; 32];
    let mk = |role| layer(cipher, role, &root, &transcript);
    match (mk(Role::Initiator), mk(Role::Target)) {
        (Ok((sealer, _)), Ok((_, opener))) => (sealer, opener),
        _ => unreachable!("HKDF of 32 and 12 bytes cannot fail"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use iscsi_wire::header::{DataOut, NopIn, ScsiCommand, ScsiResponse, TaskAttr};
    use iscsi_wire::Codec;

    fn roundtrip(sealer: &mut RecordSealer, pdu: Pdu) -> Pdu {
        let mut pdu = pdu;
        sealer.protect(&mut pdu).unwrap();
        let mut wire = BytesMut::new();
        Codec::default().encode(&pdu, &mut wire).unwrap();
        Codec::default().decode(&mut wire).unwrap().unwrap()
    }

    fn cmd(itt: u32, cdb0: u8) -> Pdu {
        let mut cdb = [0u8; 16];
        cdb[0] = cdb0;
        Pdu::new(
            ScsiCommand {
                immediate: false,
                final_: true,
                read: false,
                write: true,
                attr: TaskAttr::UNTAGGED,
                lun: 1 << 48,
                itt,
                expected_data_transfer_length: 4096,
                cmd_sn: itt,
                exp_stat_sn: 0,
                cdb,
            },
            Bytes::new(),
        )
    }

    #[test]
    fn accepts_pdus_in_order_and_strips_the_seal_ahs() {
        for cipher in Cipher::ALL {
            let (mut s, mut o) = pair_for_test(cipher, 1);
            for itt in 0..5 {
                let mut rx = roundtrip(&mut s, cmd(itt, 0x2a));
                assert_eq!(rx.ahs.len(), SEAL_AHS_LEN);
                o.verify(&mut rx).unwrap();
                assert!(rx.ahs.is_empty(), "{cipher}");
                assert_eq!(rx.header.itt(), itt);
            }
            assert_eq!(o.received(), 5);
        }
    }

    #[test]
    fn rejects_every_single_bit_flip_in_the_header_for_protecting_ciphers() {
        for cipher in [
            Cipher::Aes256Gcm,
            Cipher::ChaCha20Poly1305,
            Cipher::TripleDesCbcHmacSha1,
        ] {
            let (mut s, _) = pair_for_test(cipher, 2);
            let mut pdu = cmd(7, 0x28);
            s.protect(&mut pdu).unwrap();
            let mut wire = BytesMut::new();
            Codec::default().encode(&pdu, &mut wire).unwrap();
            for byte in 0..wire.len() {
                // Bytes 4 (TotalAHSLength) flips break framing; the rest must fail the MAC.
                let mut w = wire.clone();
                w[byte] ^= 0x01;
                let (_, mut o) = pair_for_test(cipher, 2);
                let decoded = Codec::default().decode(&mut w);
                if let Ok(Some(mut p)) = decoded {
                    assert!(o.verify(&mut p).is_err(), "{cipher}: flip at byte {byte}");
                }
            }
        }
    }

    #[test]
    fn rejects_replayed_dropped_reordered_and_injected_pdus() {
        let (mut s, _) = pair_for_test(Cipher::Aes256Gcm, 3);
        let p: Vec<Pdu> = (0..3).map(|i| roundtrip(&mut s, cmd(i, 0x2a))).collect();
        // Replay: the first PDU twice.
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 3);
        o.verify(&mut p[0].clone()).unwrap();
        assert!(matches!(
            o.verify(&mut p[0].clone()),
            Err(Forgery::BadTag { counter: 1, .. })
        ));
        // After a failure, even a genuine PDU is refused.
        assert_eq!(o.verify(&mut p[1].clone()), Err(Forgery::AlreadyFailed));
        // Drop: the second PDU never arrives.
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 3);
        o.verify(&mut p[0].clone()).unwrap();
        assert!(o.verify(&mut p[2].clone()).is_err());
        // Swap.
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 3);
        assert!(o.verify(&mut p[1].clone()).is_err());
        // Injected: a PDU without a Seal AHS, and one sealed under another key.
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 3);
        let mut bare = cmd(9, 0x93);
        let mut wire = BytesMut::new();
        Codec::default().encode(&bare, &mut wire).unwrap();
        bare = Codec::default().decode(&mut wire).unwrap().unwrap();
        assert!(matches!(o.verify(&mut bare), Err(Forgery::Missing { .. })));
        let (mut other, _) = pair_for_test(Cipher::Aes256Gcm, 4);
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 3);
        let mut forged = roundtrip(&mut other, cmd(0, 0x2a));
        assert!(matches!(o.verify(&mut forged), Err(Forgery::BadTag { .. })));
    }

    #[test]
    fn rejects_altered_sense_but_not_altered_sealed_transfer_bytes() {
        let (mut s, _) = pair_for_test(Cipher::Aes256Gcm, 5);
        let resp = Pdu::new(
            ScsiResponse {
                itt: 1,
                status: 2,
                ..ScsiResponse::default()
            },
            Bytes::from_static(&[
                0, 18, 0x70, 0, 5, 0, 0, 0, 0, 10, 0, 0, 0, 0, 0x24, 0, 0, 0, 0, 0,
            ]),
        );
        let mut rx = roundtrip(&mut s, resp);
        let mut d = rx.data.to_vec();
        d[4] ^= 1;
        rx.data = Bytes::from(d);
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 5);
        assert!(o.verify(&mut rx).is_err(), "sense is MACed");

        // Data-Out bytes are covered by the chunk AEAD (§4), not again here.
        let (mut s, _) = pair_for_test(Cipher::Aes256Gcm, 6);
        let dout = Pdu::new(
            DataOut {
                final_: true,
                lun: 0,
                itt: 1,
                ttt: 0xffff_ffff,
                exp_stat_sn: 0,
                data_sn: 0,
                buffer_offset: 0,
            },
            Bytes::from(vec![7u8; 64]),
        );
        let mut rx = roundtrip(&mut s, dout);
        let mut d = rx.data.to_vec();
        d[0] ^= 1;
        rx.data = Bytes::from(d);
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 6);
        assert!(o.verify(&mut rx).is_ok());
    }

    /// Issue 27: a Data-In's head (BHS + Seal AHS) verifies before its data is received, and
    /// counts once: after `accept_head` the next PDU verifies under the next counter; without
    /// it (the receiver declined to place the data) the whole PDU verifies as usual. A flipped
    /// head fails and the opener refuses everything after; a head verified under a counter
    /// the opener has since left is refused; a NOP-In whose data the tag covers fails.
    #[test]
    fn accepts_a_data_in_head_verified_before_its_data_and_rejects_a_flipped_one() {
        use iscsi_wire::header::DataIn;
        let data_in = |n: u32| {
            Pdu::new(
                DataIn {
                    itt: 3,
                    data_sn: n,
                    buffer_offset: n * 64,
                    ..DataIn::default()
                },
                Bytes::from(vec![n as u8; 64]),
            )
        };
        let codec = Codec::default();
        let head = |w: &BytesMut| -> ([u8; BHS_LEN], Vec<u8>) {
            let bhs: [u8; BHS_LEN] = w[..BHS_LEN].try_into().unwrap();
            (bhs, w[BHS_LEN..BHS_LEN + SEAL_AHS_LEN].to_vec())
        };
        let (mut s, mut o) = pair_for_test(Cipher::Aes256Gcm, 11);
        // Placed: verified ahead, counted once.
        let w0 = sealed_wire(&mut s, &codec, data_in(0));
        let (bhs, ahs) = head(&w0);
        let v = o.verify_head(&bhs, &ahs).unwrap();
        assert_eq!((v.keep(), o.received()), (0, 0), "not counted yet");
        o.accept_head(v).unwrap();
        assert_eq!(o.received(), 1);
        assert!(o.accept_head(v).is_err(), "a head counts once");
        let (mut s, mut o) = pair_for_test(Cipher::Aes256Gcm, 11);
        let w0 = sealed_wire(&mut s, &codec, data_in(0));
        let (bhs, ahs) = head(&w0);
        let v = o.verify_head(&bhs, &ahs).unwrap();
        o.accept_head(v).unwrap();
        // Declined: verified ahead, then received whole and verified again.
        let mut w1 = sealed_wire(&mut s, &codec, data_in(1));
        let (bhs, ahs) = head(&w1);
        o.verify_head(&bhs, &ahs).unwrap();
        let p = read_pdu(&codec, Some(&mut o), &mut w1).unwrap().unwrap();
        assert_eq!((p.data.len(), p.ahs.len(), o.received()), (64, 0, 2));
        // A NOP-In whose data the tag covers cannot verify without its data.
        let nop = Pdu::new(
            NopIn {
                itt: 9,
                ..NopIn::default()
            },
            Bytes::from_static(b"ping"),
        );
        let w2 = sealed_wire(&mut s, &codec, nop);
        let (bhs, ahs) = head(&w2);
        assert!(o.verify_head(&bhs, &ahs).is_err(), "data it covers");
        assert!(matches!(
            o.verify_head(&bhs, &ahs),
            Err(Forgery::AlreadyFailed)
        ));
        // Every byte of a Data-In head is covered: a flip fails before any data is read.
        for at in 0..BHS_LEN + 4 {
            let (mut s, mut o) = pair_for_test(Cipher::Aes256Gcm, 12);
            let w = sealed_wire(&mut s, &codec, data_in(0));
            let (mut bhs, mut ahs) = head(&w);
            if at < BHS_LEN {
                bhs[at] ^= 1;
            } else {
                ahs[at - BHS_LEN] ^= 1;
            }
            assert!(o.verify_head(&bhs, &ahs).is_err(), "flip at byte {at}");
            let ok = sealed_wire(&mut s, &codec, data_in(1));
            let (bhs, ahs) = head(&ok);
            assert!(
                o.verify_head(&bhs, &ahs).is_err(),
                "the opener refuses everything after a failure"
            );
        }
    }

    fn digests() -> Codec {
        Codec {
            header_digest: true,
            data_digest: true,
            max_recv_data_segment_length: 8192,
        }
    }

    fn sealed_wire(sealer: &mut RecordSealer, codec: &Codec, pdu: Pdu) -> BytesMut {
        let mut pdu = pdu;
        sealer.protect(&mut pdu).unwrap();
        let mut wire = BytesMut::new();
        codec.encode(&pdu, &mut wire).unwrap();
        wire
    }

    /// A PDU with an opcode RFC 7143 does not define, tagged as a genuine peer would tag it.
    fn tagged_unknown_opcode(sealer: &mut RecordSealer) -> BytesMut {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = 0x3d;
        bhs[4] = (SEAL_AHS_LEN / 4) as u8;
        let tag = sealer.tag(&bhs, &AHS_HEAD, &[]).unwrap();
        let mut wire = BytesMut::from(&bhs[..]);
        wire.extend_from_slice(&AHS_HEAD);
        wire.extend_from_slice(&tag);
        wire
    }

    #[test]
    fn rejects_a_bare_unknown_opcode_on_a_sealed_connection_as_missing_its_tag() {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = 0x3d;
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 9);
        let mut wire = BytesMut::from(&bhs[..]);
        let r = read_pdu(&Codec::default(), Some(&mut o), &mut wire);
        assert!(
            matches!(
                r,
                Err(ReadError::Sealed(Forgery::Missing {
                    counter: 0,
                    opcode: 0x3d
                }))
            ),
            "{r:?}"
        );
        assert!(wire.is_empty(), "the frame was consumed");
        // A plain connection keeps RFC 7143's answer: an error that leads to a Reject.
        let mut wire = BytesMut::from(&bhs[..]);
        let r = read_pdu(&Codec::default(), None, &mut wire);
        assert!(
            matches!(
                &r,
                Err(ReadError::Wire(WireError::UnsupportedOpcode { .. }))
            ),
            "{r:?}"
        );
    }

    #[test]
    fn rejects_a_bad_digest_on_an_unverified_pdu_as_a_forgery_not_a_digest_error() {
        let codec = digests();
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 10);
        // Sealed under another key, then its data digest broken: the tag fails first.
        let (mut other, _) = pair_for_test(Cipher::Aes256Gcm, 11);
        let resp = Pdu::new(
            ScsiResponse {
                itt: 1,
                ..ScsiResponse::default()
            },
            Bytes::from_static(&[0, 2, 0x70, 0]),
        );
        let mut wire = sealed_wire(&mut other, &codec, resp);
        let n = wire.len();
        wire[n - 1] ^= 1;
        let r = read_pdu(&codec, Some(&mut o), &mut wire);
        assert!(
            matches!(
                r,
                Err(ReadError::Sealed(Forgery::BadTag { counter: 0, .. }))
            ),
            "{r:?}"
        );
    }

    #[test]
    fn rejects_a_verified_pdu_with_a_bad_digest_or_unknown_opcode_without_a_reject() {
        let codec = digests();
        // Data-Out's data is not MACed (a sealed transfer): its tag verifies, its digest not.
        let (mut s, mut o) = pair_for_test(Cipher::Aes256Gcm, 12);
        let dout = Pdu::new(
            DataOut {
                final_: true,
                lun: 0,
                itt: 1,
                ttt: 0xffff_ffff,
                exp_stat_sn: 0,
                data_sn: 0,
                buffer_offset: 0,
            },
            Bytes::from(vec![7u8; 64]),
        );
        let mut wire = sealed_wire(&mut s, &codec, dout);
        wire[BHS_LEN + SEAL_AHS_LEN + 4] ^= 1;
        let r = read_pdu(&codec, Some(&mut o), &mut wire);
        assert!(
            matches!(
                &r,
                Err(ReadError::Sealed(Forgery::Unusable {
                    counter: 0,
                    opcode: 0x05,
                    error: WireError::DataDigest { .. }
                }))
            ),
            "{r:?}"
        );
        // The opener is spent: the next genuine PDU is refused too.
        let mut next = sealed_wire(&mut s, &codec, Pdu::new(NopIn::default(), Bytes::new()));
        assert_eq!(
            read_pdu(&codec, Some(&mut o), &mut next),
            Err(ReadError::Sealed(Forgery::AlreadyFailed))
        );
        // A genuine peer's undefined opcode: the tag verifies, the PDU is still refused.
        let (mut s, mut o) = pair_for_test(Cipher::Aes256Gcm, 13);
        let mut wire = tagged_unknown_opcode(&mut s);
        let r = read_pdu(&Codec::default(), Some(&mut o), &mut wire);
        assert!(
            matches!(
                &r,
                Err(ReadError::Sealed(Forgery::Unusable {
                    opcode: 0x3d,
                    error: WireError::UnsupportedOpcode { .. },
                    ..
                }))
            ),
            "{r:?}"
        );
    }

    #[test]
    fn rejects_an_oversized_data_segment_on_a_sealed_connection_before_buffering_it() {
        let mut bhs = [0u8; BHS_LEN];
        bhs[0] = 0x05;
        bhs[5] = 0xff;
        let (_, mut o) = pair_for_test(Cipher::Aes256Gcm, 14);
        let mut wire = BytesMut::from(&bhs[..]);
        let r = read_pdu(&Codec::default(), Some(&mut o), &mut wire);
        assert!(
            matches!(
                &r,
                Err(ReadError::Sealed(Forgery::Unusable {
                    error: WireError::DataSegmentTooLong { .. },
                    ..
                }))
            ),
            "{r:?}"
        );
    }

    #[test]
    fn accepts_sealed_pdus_with_digests_and_strips_the_seal_ahs() {
        let codec = digests();
        let (mut s, mut o) = pair_for_test(Cipher::ChaCha20Poly1305, 15);
        let mut wire = BytesMut::new();
        for itt in 0..3 {
            wire.extend_from_slice(&sealed_wire(&mut s, &codec, cmd(itt, 0x2a)));
        }
        for itt in 0..3 {
            let p = read_pdu(&codec, Some(&mut o), &mut wire).unwrap().unwrap();
            assert!(p.ahs.is_empty());
            assert_eq!(p.header.itt(), itt);
        }
        assert_eq!(read_pdu(&codec, Some(&mut o), &mut wire), Ok(None));
    }

    #[test]
    fn none_sends_the_same_bytes_without_protection() {
        let (mut s, mut o) = pair_for_test(Cipher::None, 7);
        let mut rx = roundtrip(&mut s, Pdu::new(NopIn::default(), Bytes::new()));
        assert_eq!(rx.ahs.len(), SEAL_AHS_LEN);
        o.verify(&mut rx).unwrap();
    }

    #[test]
    fn aead_record_keys_change_at_epoch_boundaries_and_both_sides_follow() {
        let (mut s, mut o) = pair_for_test(Cipher::Aes256Gcm, 8);
        s.next = EPOCH_PDUS - 1;
        o.next = EPOCH_PDUS - 1;
        for i in 0..3 {
            let mut rx = roundtrip(&mut s, cmd(i, 0));
            o.verify(&mut rx).unwrap();
        }
        assert_eq!(o.received(), EPOCH_PDUS + 2);
    }

    #[test]
    fn transcript_hash_changes_with_any_byte_and_keeps_the_previous_hash() {
        let mut t = LoginTranscript::new();
        let empty = t.hash();
        let bhs = [1u8; BHS_LEN];
        t.add(Direction::InitiatorToTarget, &bhs, &[], b"A=1\0");
        assert_eq!(t.hash_before_last(), empty);
        let one = t.hash();
        let mut u = LoginTranscript::new();
        u.add(Direction::InitiatorToTarget, &bhs, &[], b"A=2\0");
        assert_ne!(u.hash(), one);
        let mut v = LoginTranscript::new();
        v.add(Direction::TargetToInitiator, &bhs, &[], b"A=1\0");
        assert_ne!(v.hash(), one, "direction is bound");
    }
}
