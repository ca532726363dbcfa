//! Calibration of the model's inputs for each link (issue 6 "Calibrate the inputs
//! automatically"): RTT from a TCP ping-pong, SOCKET from a bulk TCP transfer under the same
//! emulation, ENC/DEC from a microbenchmark of the cipher at the block size.
//!
//! The sockets are created inside the link's namespaces (through [`ipsan_wan::Link::run_in`]) and
//! then driven from ordinary threads: a socket stays in the namespace it was made in.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use ipsan_seal::{
    AnswerOutcome, Binding, Cipher, Psk, SealAnswer, SealOffer, SealSession, SessionIds,
    TargetSealConfig,
};

/// Where calibration sockets are made.
pub trait Sockets {
    /// A listener bound on the target side.
    fn listen(&self) -> std::io::Result<TcpListener>;
    /// A connection from the initiator side to `addr`.
    fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream>;
}

/// The result of a TCP ping-pong.
#[derive(Debug, Clone, Copy, serde::Serialize)]
pub struct Rtt {
    /// Median round trip, seconds.
    pub median_s: f64,
    /// Smallest.
    pub min_s: f64,
    /// Largest.
    pub max_s: f64,
}

fn io_err(what: &str, e: impl std::fmt::Display) -> std::io::Error {
    std::io::Error::other(format!("{what}: {e}"))
}

/// Median of 1-byte TCP round trips (`rounds` after two warm-ups), with Nagle off.
pub fn rtt(s: &dyn Sockets, rounds: usize) -> std::io::Result<Rtt> {
    let l = s.listen()?;
    let addr = l.local_addr()?;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut c, _) = l.accept()?;
        c.set_nodelay(true)?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut b = [0u8; 1];
        loop {
            match c.read(&mut b)? {
                0 => return Ok(()),
                _ => c.write_all(&b)?,
            }
        }
    });
    let mut c = s.connect(addr)?;
    c.set_nodelay(true)?;
    c.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut samples = Vec::with_capacity(rounds);
    let mut b = [0u8; 1];
    for i in 0..rounds + 2 {
        let t = Instant::now();
        c.write_all(&[i as u8])?;
        c.read_exact(&mut b)?;
        if i >= 2 {
            samples.push(t.elapsed().as_secs_f64());
        }
    }
    drop(c);
    server
        .join()
        .map_err(|_| io_err("ping-pong server", "panicked"))??;
    samples.sort_by(f64::total_cmp);
    let n = samples.len();
    if n == 0 {
        return Err(io_err("ping-pong", "no samples"));
    }
    Ok(Rtt {
        median_s: samples[n / 2],
        min_s: samples[0],
        max_s: samples[n - 1],
    })
}

/// Socket buffers asked for the SOCKET transfer: fixed, because the receiver's autotuning can
/// hold a 64 KiB window for seconds on a delayed link (the Aiken plan's calibration measured
/// 7.9 MB/s at 5 ms one way, 64 KiB per round trip, where iperf3 moved 108–285). Plain
/// `SO_RCVBUF`/`SO_SNDBUF`, so the kernel caps them at `net.core.{r,w}mem_max` — host-wide,
/// not settable inside the lab's namespaces: 4 MiB here, which the kernel doubles to 8 MiB.
/// Not ipsan-tcp's `TcpSettings`, which forces past the cap: with real 32 MiB buffers the
/// smoke plan's esp-emu calibration took minutes, and every committed run was calibrated
/// with the capped ones.
pub const SOCKET_BUFFER: usize = 32 << 20;

/// One bulk TCP stream for `duration`; returns the bytes/s the link delivered over the
/// second half (after slow start), the way the papers measured SOCKET "in a simple socket
/// communication without iSCSI". Both ends have fixed [`SOCKET_BUFFER`]s.
///
/// Delivered is the sender's `TCP_INFO` count of segments acknowledged or SACKed, times the
/// MSS, each reading paired with its own instant. Not the bytes the receiver read: when the
/// large window overflows a bottleneck queue, the receiver holds megabytes out of order behind
/// a hole and hands them over at once when the retransmission fills it, so the in-order count
/// credits the half-way window with bytes that crossed the link before it — SOCKET 12.5–14.7
/// MB/s on a 100 Mbit/s link that carries 12.07 MB/s of TCP payload (what iperf3 measured on
/// the same link, and this measure does).
pub fn socket_throughput(s: &dyn Sockets, duration: Duration) -> std::io::Result<f64> {
    let l = s.listen()?;
    crate::sockbuf::set_tcp_buffers(&l, SOCKET_BUFFER)?;
    let addr = l.local_addr()?;
    let half = duration / 2;
    let server = std::thread::spawn(move || -> std::io::Result<()> {
        let (mut c, _) = l.accept()?;
        c.set_read_timeout(Some(Duration::from_secs(10)))?;
        let mut buf = vec![0u8; 1 << 20];
        while c.read(&mut buf)? > 0 {}
        Ok(())
    });
    let mut c = s.connect(addr)?;
    crate::sockbuf::set_tcp_buffers(&c, SOCKET_BUFFER)?;
    c.set_write_timeout(Some(Duration::from_secs(10)))?;
    // A sampler reads the sender's delivered count every few milliseconds from the half-way
    // mark until the transfer ends: the window is the first reading at or after half-way to
    // the last reading at which the count still grew (the send buffer keeps the link busy
    // while it drains, so the drain counts at the link's rate). On a slow link a 1 MiB write
    // can block past the end of `duration`, so readings between writes would miss it.
    let probe = c.try_clone()?;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = {
        let done = done.clone();
        std::thread::spawn(move || -> std::io::Result<Option<(f64, u64)>> {
            let t = Instant::now();
            let delivered = |c: &std::net::TcpStream| {
                ipsan_tcp::tcp_info(c)
                    .map(|i| u64::from(i.delivered) * u64::from(i.snd_mss))
                    .map_err(|e| io_err("TCP_INFO", e))
            };
            while t.elapsed() < half && !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(2));
            }
            let (t0, b0) = (Instant::now(), delivered(&probe)?);
            let (mut t1, mut b1) = (t0, b0);
            while !done.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_millis(5));
                let b = delivered(&probe)?;
                if b > b1 {
                    (t1, b1) = (Instant::now(), b);
                }
            }
            let secs = t1.duration_since(t0).as_secs_f64();
            Ok((secs > 0.0 && b1 > b0).then(|| (secs, b1 - b0)))
        })
    };
    let buf = vec![0x5au8; 1 << 20];
    let t = Instant::now();
    let sent = (|| -> std::io::Result<()> {
        while t.elapsed() < duration {
            c.write_all(&buf)?;
        }
        c.shutdown(std::net::Shutdown::Write)?;
        let mut sink = [0u8; 16];
        let _ = c.read(&mut sink);
        Ok(())
    })();
    let received = server
        .join()
        .map_err(|_| io_err("bulk receiver", "panicked"));
    done.store(true, Ordering::Relaxed);
    let window = sampler
        .join()
        .map_err(|_| io_err("delivery sampler", "panicked"))??;
    sent?;
    received??;
    let Some((secs, bytes)) = window else {
        return Err(io_err(
            "bulk transfer",
            "delivered nothing in its second half",
        ));
    };
    Ok(bytes as f64 / secs)
}

/// How many cores this process can get right now: `threads` threads spin for `duration`
/// and the CPU time they were given (from `/proc/thread-self/schedstat`) is divided by the wall
/// time. On an idle 2-core host it is about 2; with other work on the host (other
/// engineers compiling) less. The model's crypto runs on what is left.
pub fn available_cores(threads: usize, duration: Duration) -> f64 {
    let handles: Vec<_> = (0..threads.max(1))
        .map(|_| {
            std::thread::spawn(move || {
                let t = Instant::now();
                let a = thread_cpu_s();
                let mut x = 1u64;
                while t.elapsed() < duration {
                    for _ in 0..10_000 {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    }
                    std::hint::black_box(x);
                }
                (thread_cpu_s() - a) / t.elapsed().as_secs_f64()
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap_or(0.0))
        .filter(|c| c.is_finite())
        .sum()
}

/// This thread's time on a CPU, seconds, from `/proc/thread-self/schedstat` (nanoseconds;
/// NaN where unavailable).
pub fn thread_cpu_s() -> f64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| {
            s.split_whitespace()
                .next()
                .and_then(|v| v.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |ns| ns / 1e9)
}

/// Seal/open throughput of `cipher` at `block` bytes per command per CPU-second of one
/// thread: (ENC, DEC) in bytes/s, sealing for about `budget` of wall time. `none` gives
/// infinities.
pub fn cipher_throughput(
    cipher: Cipher,
    block: usize,
    budget: Duration,
) -> Result<(f64, f64), String> {
    if cipher == Cipher::None {
        return Ok((f64::INFINITY, f64::INFINITY));
    }
    let (ini, tgt) = seal_pair(cipher)?;
    let b = Binding {
        lun: 0,
        lba: 0,
        blocks: u32::try_from(block / 512).map_err(|_| "block too large".to_string())?,
        opcode: 0x8a,
        task_tag: 1,
    };
    let plain = vec![0xa5u8; block];
    let mut sealed = Vec::new();
    // Per CPU-second, not per wall second: on a shared host a wall-clock rate is the
    // cipher's speed times whatever share of a core this thread got (3DES measured 0.8 MB/s
    // at load 17 against about 20 MB/s per CPU-second).
    let t = Instant::now();
    let c0 = thread_cpu_s();
    while t.elapsed() < budget || sealed.len() < 4 {
        let mut buf = BytesMut::with_capacity(ini.sealed_len(block).unwrap_or(block * 2));
        buf.extend_from_slice(&plain);
        let out = ini.seal(&b, buf).map_err(|e| e.to_string())?;
        sealed.push(out);
        if sealed.len() >= 4096 {
            break;
        }
    }
    let c1 = thread_cpu_s();
    let n = sealed.len();
    for s in sealed {
        let buf = BytesMut::from(&s[..]);
        tgt.open(&b, buf).map_err(|e| e.to_string())?;
    }
    let c2 = thread_cpu_s();
    let (seal_time, open_time) = if c2.is_finite() {
        (
            Duration::from_secs_f64((c1 - c0).max(1e-9)),
            Duration::from_secs_f64((c2 - c1).max(1e-9)),
        )
    } else {
        // No schedstat: wall time (an underestimate of the rate on a busy host).
        let w = t.elapsed();
        (w / 2, w / 2)
    };
    let bytes = (n * block) as f64;
    Ok((
        bytes / seal_time.as_secs_f64().max(1e-9),
        bytes / open_time.as_secs_f64().max(1e-9),
    ))
}

fn seal_pair(cipher: Cipher) -> Result<(Arc<SealSession>, Arc<SealSession>), String> {
    // A throwaway calibration key: nothing sealed with it leaves this function's caller.
    let psk = || Psk::new(b"ipsan lab calibration, not a key".to_vec()).map_err(|e| e.to_string());
    let ids = SessionIds {
        initiator_name: "iqn.2026-11.org.ipsan:lab".into(),
        target_name: "iqn.2026-11.org.ipsan:lab-target".into(),
        isid: [0; 6],
    };
    let offer =
        SealOffer::new(vec![cipher], 65536, psk()?, ids.clone()).map_err(|e| e.to_string())?;
    let pending =
        match SealAnswer::handle_offer(&TargetSealConfig::default(), &offer.keys(), &ids, |_| {
            psk().ok()
        })
        .map_err(|e| e.to_string())?
        {
            AnswerOutcome::Pending(p) => p,
            _ => return Err("calibration seal negotiation did not agree".into()),
        };
    let (i, c) = offer
        .handle_answer(pending.keys())
        .map_err(|e| e.to_string())?;
    let t = pending.handle_confirm(&c).map_err(|e| e.to_string())?;
    Ok((Arc::new(i), Arc::new(t)))
}

/// Loopback sockets (no namespaces).
#[derive(Debug)]
pub struct Loopback;

impl Sockets for Loopback {
    fn listen(&self) -> std::io::Result<TcpListener> {
        TcpListener::bind("127.0.0.1:0")
    }
    fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        TcpStream::connect_timeout(&addr, Duration::from_secs(5))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_rtt_and_socket_are_plausible() {
        let r = rtt(&Loopback, 20).unwrap();
        assert!(r.median_s > 0.0 && r.median_s < 0.05, "{r:?}");
        assert!(r.min_s <= r.median_s && r.median_s <= r.max_s);
        let s = socket_throughput(&Loopback, Duration::from_millis(400)).unwrap();
        assert!(s > 10e6, "loopback moves more than 10 MB/s: {s}");
    }

    #[test]
    fn cipher_bench_orders_ciphers() {
        let (e_aes, d_aes) =
            cipher_throughput(Cipher::Aes256Gcm, 65536, Duration::from_millis(100)).unwrap();
        let (e_3des, _) = cipher_throughput(
            Cipher::TripleDesCbcHmacSha1,
            65536,
            Duration::from_millis(100),
        )
        .unwrap();
        assert!(e_aes > 0.0 && d_aes > 0.0);
        assert!(e_aes > e_3des, "AES-GCM {e_aes} should beat 3DES {e_3des}");
        let (n, _) = cipher_throughput(Cipher::None, 4096, Duration::ZERO).unwrap();
        assert!(n.is_infinite());
    }
}
