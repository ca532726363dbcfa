//! Calibration of the model's inputs for each link (issue 6 "Calibrate the inputs
//! automatically"): RTT from a TCP ping-pong, SOCKET from a bulk TCP transfer under the same
//! emulation, ENC/DEC from a microbenchmark of the cipher at the block size.
//!
//! The calibration file ([`CalibrationFile`]) keeps these per link and cipher, found for a
//! point by [`link_group_key`] and [`cipher_key`], with the carriers' and charons' costs
//! fitted over its own cost runs ([`StoredCosts`]).
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

use crate::plan::{tls_cipher, Direction, Point, Scheme};

/// Where calibration sockets are made.
pub trait Sockets {
    /// A listener bound on the target side.
    fn listen(&self) -> std::io::Result<TcpListener>;
    /// A connection from the initiator side to `addr`.
    fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream>;
}

/// The result of a TCP ping-pong.
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
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
/// When the sampler had no second-half window (on a loaded host it may first run after the
/// transfer ended), the whole transfer's rate, slow start included, stands in.
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
    let mut written = 0u64;
    let sent = (|| -> std::io::Result<()> {
        while t.elapsed() < duration {
            c.write_all(&buf)?;
            written += buf.len() as u64;
        }
        c.shutdown(std::net::Shutdown::Write)?;
        let mut sink = [0u8; 16];
        let _ = c.read(&mut sink);
        Ok(())
    })();
    // The whole transfer, start to the receiver's close: the fallback when the sampler got no
    // second-half window (a loaded host can run it only after the transfer ended).
    let whole = (written, t.elapsed().as_secs_f64());
    let received = server
        .join()
        .map_err(|_| io_err("bulk receiver", "panicked"));
    done.store(true, Ordering::Relaxed);
    let window = sampler
        .join()
        .map_err(|_| io_err("delivery sampler", "panicked"))??;
    sent?;
    received??;
    match window {
        Some((secs, bytes)) => Ok(bytes as f64 / secs),
        None if whole.0 > 0 && whole.1 > 0.0 => Ok(whole.0 as f64 / whole.1),
        None => Err(io_err("bulk transfer", "delivered nothing")),
    }
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

/// The schema of a calibration file ([`CalibrationFile`]).
pub const CALIBRATION_SCHEMA: &str = "ipsan-lab-calibration/1";

/// The name a results directory keeps its run's calibration file under (a byte-for-byte
/// copy, so its SHA-1 is the one each record carries).
pub const CALIBRATION_IN_RESULTS: &str = "calibration.json";

/// The key of a point's link: points that share it run on one link and share its
/// calibration (esp-emu's link has the ESP stage in it, so it is its own).
pub fn link_group_key(p: &Point) -> String {
    format!("{}|{}", p.link_key(), p.scheme == Scheme::EspEmu)
}

/// The cipher and size whose ENC/DEC a point's model uses: seal's cipher at the block size;
/// per-packet ciphers at a 1400-byte packet (TLS: a 16 KiB record); esp-emu from its own
/// stage. `None` without encryption.
pub fn cipher_key(p: &Point) -> Option<(String, u64)> {
    Some(match p.scheme {
        Scheme::Plain | Scheme::Iperf3 => return None,
        Scheme::Seal | Scheme::SealSeq => (p.cipher.clone(), p.block),
        Scheme::Wireguard => ("chacha20-poly1305".to_string(), 1536),
        Scheme::Tls => (tls_cipher(&p.cipher).0.to_string(), 16384),
        Scheme::Ipsec => (p.cipher.clone(), 1536),
        Scheme::EspEmu => ("esp-emu".to_string(), 1400),
    })
}

/// One link's calibration in a [`CalibrationFile`].
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct LinkCalibration {
    /// The runner's key for the link ([`link_group_key`]): the points that
    /// share it share the calibration.
    pub link: String,
    /// The link in words (delay, rate, impairments), for a reader.
    pub label: String,
    /// RTT, SOCKET, the cores the lab could get and the sysctls read back.
    pub calibration: crate::results::Calibration,
    /// Where the plan has IPsec on this link: the 1-byte ping-pong ([`rtt`]) through its
    /// tunnel, both charons up (`runner::calibrate_plan`). Each flight's crossing of two
    /// userspace charons and TUN devices, which the plain RTT does not see; the model's round
    /// trip for IPsec ([`crate::fit::model_here`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipsec_rtt: Option<Rtt>,
}

/// One cipher's rates per CPU-second of one thread at one size
/// ([`cipher_throughput`], [`cipher_key`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct CipherRate {
    /// Cipher name (`3des-cbc-hmac-sha1`, `esp-emu`, …).
    pub cipher: String,
    /// Bytes per seal/open: seal's block; a packet or a TLS record for the lower layers.
    pub size: u64,
    /// Sealing, bytes per CPU-second.
    pub enc_bytes_per_cpu_s: f64,
    /// Opening, bytes per CPU-second.
    pub dec_bytes_per_cpu_s: f64,
}

/// One process group's CPU as `s_per_byte·bytes + s_per_flight·flights`
/// ([`crate::fit::fit_cost`]; flights: [`crate::model::Carrier`]).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Cost {
    /// CPU-seconds per payload byte.
    pub s_per_byte: f64,
    /// CPU-seconds per flight of a command beyond its bytes.
    pub s_per_flight: f64,
}

/// A scheme's carrier costs as a calibration file keeps them ([`StoredCosts`]): per scheme
/// and delay class, the per-byte medians of [`crate::fit::carrier_costs`] and the fits of
/// [`crate::fit::carrier_fits`].
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredCarrier {
    /// Scheme name.
    pub scheme: String,
    /// Runs with a delay (the emulator's delay line) or without.
    pub delayed: bool,
    /// The emulator's CPU-seconds per byte, median.
    pub emulator_s_per_byte: f64,
    /// The initiator's + target's CPU-seconds per byte, median.
    pub stacks_s_per_byte: f64,
    /// The emulator's per-byte + per-flight fit, where the runs separate them.
    pub emulator_fit: Option<Cost>,
    /// The stacks' per-byte + per-flight fit.
    pub stacks_fit: Option<Cost>,
}

/// IPsec's charon rates per CPU-second as a calibration file keeps them
/// ([`crate::fit::ipsec_rates`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredIpsecRate {
    /// Write or read.
    pub direction: Direction,
    /// Cipher.
    pub cipher: String,
    /// The sending charon, bytes per CPU-second.
    pub enc_bytes_per_cpu_s: f64,
    /// The receiving charon, bytes per CPU-second.
    pub dec_bytes_per_cpu_s: f64,
}

/// IPsec's charons' per-byte + per-flight fits as a calibration file keeps them
/// ([`crate::fit::ipsec_fits`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredIpsecFit {
    /// Write or read.
    pub direction: Direction,
    /// Cipher.
    pub cipher: String,
    /// Runs with a delay or without.
    pub delayed: bool,
    /// The sending charon.
    pub send: Cost,
    /// The receiving charon.
    pub recv: Cost,
}

/// The costs the model's CPU cap is priced with, fitted over a calibration's own short runs
/// (never the plan's it predicts) and kept in the calibration file
/// ([`CalibrationFile`]; written by [`StoredCosts::from_runs`]).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct StoredCosts {
    /// Per scheme and delay class.
    pub carriers: Vec<StoredCarrier>,
    /// IPsec's charon rates per direction and cipher.
    pub ipsec_rates: Vec<StoredIpsecRate>,
    /// IPsec's charons' fits per direction, cipher and delay class.
    pub ipsec_fits: Vec<StoredIpsecFit>,
}

/// Every input the models need for one plan, measured before the plan runs (issue 29,
/// "Prediction, not fit"): RTT and SOCKET per link, the ciphers' ENC/DEC per CPU-second, the
/// cores the lab could get, and the carriers' and IPsec's charons' costs per byte and per
/// flight fitted over separate short runs (never the plan's own). Written by
/// `ipsan lab calibrate`, read by `ipsan lab run --calibration`, which fixes these inputs for
/// every run and records the file's SHA-1 in each record.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct CalibrationFile {
    /// [`CALIBRATION_SCHEMA`].
    pub schema: String,
    /// The plan it was measured for.
    pub plan: String,
    /// Machine, revision, `ipsan` binary and load average when the calibration started.
    pub measured_by: crate::results::Environment,
    /// `/proc/loadavg` when it finished.
    pub loadavg_end: String,
    /// Seconds since the epoch when it started.
    pub started_unix_s: u64,
    /// Seconds since the epoch when it finished.
    pub finished_unix_s: u64,
    /// Cores the lab could get: the median of the links' [`available_cores`] readings. The
    /// out-of-sample model's CPU, in place of what each run got.
    pub cores_avail: f64,
    /// One entry per link of the plan.
    pub links: Vec<LinkCalibration>,
    /// One entry per (cipher, size) the plan's points use.
    pub ciphers: Vec<CipherRate>,
    /// The carriers' and charons' costs from the separate cost runs.
    pub costs: StoredCosts,
    /// Where the cost runs' records were written (relative to the file, as given).
    pub cost_runs: String,
    /// How many cost runs there were, and how many ended ok.
    pub cost_runs_ok: (usize, usize),
}

/// A calibration file that cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum CalibrationError {
    /// Unreadable.
    #[error("calibration file {path}: {source}")]
    Io {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// Not a calibration file of this schema.
    #[error("calibration file: {0}")]
    Invalid(String),
    /// It lacks something the plan needs.
    #[error("calibration file (plan {file_plan}) lacks what plan {plan} needs: {missing}; run `ipsan lab calibrate --plan {plan}`")]
    Missing {
        /// The plan the file was measured for.
        file_plan: String,
        /// The plan to run.
        plan: String,
        /// What is missing.
        missing: String,
    },
}

/// A calibration file as read: its contents, its bytes and their SHA-1.
#[derive(Debug, Clone)]
pub struct LoadedCalibration {
    /// The contents.
    pub file: CalibrationFile,
    /// SHA-1 of the bytes, lower-case hex: what each record of a run with it carries.
    pub sha1: String,
    /// The bytes as read (copied unchanged into the results directory).
    pub bytes: Vec<u8>,
}

/// Lower-case hex SHA-1 of `bytes`.
pub fn sha1_hex(bytes: &[u8]) -> String {
    use sha1::Digest;
    sha1::Sha1::digest(bytes)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

impl CalibrationFile {
    /// Pretty JSON with a final newline: the bytes [`CalibrationFile::write`] writes.
    pub fn to_bytes(&self) -> Result<Vec<u8>, CalibrationError> {
        let mut b = serde_json::to_vec_pretty(self)
            .map_err(|e| CalibrationError::Invalid(format!("not serialisable: {e}")))?;
        b.push(b'\n');
        Ok(b)
    }

    /// Writes the file; returns it as loaded (with its SHA-1).
    pub fn write(&self, path: &std::path::Path) -> Result<LoadedCalibration, CalibrationError> {
        let bytes = self.to_bytes()?;
        std::fs::write(path, &bytes).map_err(|source| CalibrationError::Io {
            path: path.display().to_string(),
            source,
        })?;
        LoadedCalibration::from_bytes(bytes)
    }

    /// The calibration of `p`'s link.
    pub fn link(&self, p: &crate::plan::Point) -> Option<&crate::results::Calibration> {
        let key = link_group_key(p);
        self.links
            .iter()
            .find(|l| l.link == key)
            .map(|l| &l.calibration)
    }

    /// (ENC, DEC) per CPU-second for `p`'s scheme: infinite for no encryption, `None` when
    /// the file does not have it.
    pub fn cipher(&self, p: &crate::plan::Point) -> Option<(f64, f64)> {
        let Some((cipher, size)) = cipher_key(p) else {
            return Some((f64::INFINITY, f64::INFINITY));
        };
        self.ciphers
            .iter()
            .find(|c| c.cipher == cipher && c.size == size)
            .map(|c| (c.enc_bytes_per_cpu_s, c.dec_bytes_per_cpu_s))
    }

    /// Checks that the file has every link and cipher rate `plan` needs, before any run.
    pub fn covers(&self, plan: &crate::plan::Plan) -> Result<(), CalibrationError> {
        let mut missing: Vec<String> = Vec::new();
        for p in &plan.points {
            if self.link(p).is_none() {
                missing.push(format!("the link of {}", p.label()));
            } else if self.cipher(p).is_none() {
                missing.push(format!("the cipher rates of {}", p.label()));
            }
        }
        missing.dedup();
        if missing.is_empty() {
            return Ok(());
        }
        let n = missing.len();
        missing.truncate(3);
        Err(CalibrationError::Missing {
            file_plan: self.plan.clone(),
            plan: plan.name.clone(),
            missing: format!(
                "{}{}",
                missing.join("; "),
                if n > 3 {
                    format!(" (and {} more)", n - 3)
                } else {
                    String::new()
                }
            ),
        })
    }
}

impl LoadedCalibration {
    /// Reads and checks a calibration file.
    pub fn read(path: &std::path::Path) -> Result<LoadedCalibration, CalibrationError> {
        let bytes = std::fs::read(path).map_err(|source| CalibrationError::Io {
            path: path.display().to_string(),
            source,
        })?;
        LoadedCalibration::from_bytes(bytes)
    }

    /// Parses and checks a calibration file's bytes.
    pub fn from_bytes(bytes: Vec<u8>) -> Result<LoadedCalibration, CalibrationError> {
        let file: CalibrationFile = serde_json::from_slice(&bytes)
            .map_err(|e| CalibrationError::Invalid(format!("not a calibration file: {e}")))?;
        if file.schema != CALIBRATION_SCHEMA {
            return Err(CalibrationError::Invalid(format!(
                "schema {:?}, expected {CALIBRATION_SCHEMA:?}",
                file.schema
            )));
        }
        if !(file.cores_avail.is_finite() && file.cores_avail > 0.0) {
            return Err(CalibrationError::Invalid(format!(
                "cores_avail must be a positive number, not {}",
                file.cores_avail
            )));
        }
        for c in &file.ciphers {
            if !(c.enc_bytes_per_cpu_s > 0.0 && c.dec_bytes_per_cpu_s > 0.0) {
                return Err(CalibrationError::Invalid(format!(
                    "cipher {} at {} bytes: rates must be positive",
                    c.cipher, c.size
                )));
            }
        }
        Ok(LoadedCalibration {
            sha1: sha1_hex(&bytes),
            file,
            bytes,
        })
    }
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

/// A calibration file for `points` (tests): every link at `rtt_ms` and `socket_mb_s`, every
/// cipher at `enc_mb_s` both ways, two cores, no carrier costs.
#[cfg(test)]
pub(crate) fn sample_file(
    points: &[crate::plan::Point],
    rtt_ms: f64,
    socket_mb_s: f64,
    enc_mb_s: f64,
) -> CalibrationFile {
    let mut links: Vec<LinkCalibration> = Vec::new();
    let mut ciphers: Vec<CipherRate> = Vec::new();
    for p in points {
        let link = link_group_key(p);
        if !links.iter().any(|l| l.link == link) {
            links.push(LinkCalibration {
                link,
                label: format!("{} ms one way", p.delay_ms),
                calibration: crate::results::Calibration {
                    rtt_ms,
                    rtt_min_ms: rtt_ms,
                    rtt_max_ms: rtt_ms,
                    socket_mb_s,
                    cores_avail: 2.0,
                    sysctls: vec![("net.ipv4.tcp_congestion_control".into(), "reno".into())],
                    loopback: false,
                },
                ipsec_rtt: None,
            });
        }
        if let Some((cipher, size)) = cipher_key(p) {
            let c = CipherRate {
                cipher,
                size,
                enc_bytes_per_cpu_s: enc_mb_s * 1e6,
                dec_bytes_per_cpu_s: enc_mb_s * 1e6,
            };
            if !ciphers.contains(&c) {
                ciphers.push(c);
            }
        }
    }
    CalibrationFile {
        schema: CALIBRATION_SCHEMA.into(),
        plan: "t".into(),
        measured_by: crate::results::Environment {
            git_rev: "0123abc".into(),
            hostname: "lab".into(),
            cpus: 2,
            loadavg: "0.10 0.20 0.30 1/100 42".into(),
            ..Default::default()
        },
        loadavg_end: "0.20 0.20 0.30 1/100 43".into(),
        started_unix_s: 1_790_000_000,
        finished_unix_s: 1_790_000_100,
        cores_avail: 2.0,
        links,
        ciphers,
        costs: StoredCosts::default(),
        cost_runs: "cal-runs".into(),
        cost_runs_ok: (0, 0),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What `ipsan lab calibrate` writes is what `ipsan lab run --calibration` reads: every
    /// input back unchanged, the same bytes when written again, and a SHA-1 of exactly those
    /// bytes (the one each record carries). A file of another schema, or with no cores, is
    /// refused.
    #[test]
    fn accepts_its_own_calibration_file_back_unchanged_with_its_hash() {
        let plan = crate::plan::Plan::load("paper-regime").unwrap();
        let mut f = sample_file(&plan.points, 128.5, 2.42, 10.82);
        f.costs.carriers.push(StoredCarrier {
            scheme: "plain".into(),
            delayed: true,
            emulator_s_per_byte: 9e-9,
            stacks_s_per_byte: 3e-9,
            emulator_fit: Some(Cost {
                s_per_byte: 8e-9,
                s_per_flight: 40e-6,
            }),
            stacks_fit: None,
        });
        let tunnel = Rtt {
            median_s: 0.1295,
            min_s: 0.1289,
            max_s: 0.1331,
        };
        f.links[0].ipsec_rtt = Some(tunnel);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cal.json");
        let written = f.write(&path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        let back = LoadedCalibration::read(&path).unwrap();
        assert_eq!(back.sha1, written.sha1);
        assert_eq!(back.sha1, sha1_hex(&bytes));
        assert_eq!(back.sha1.len(), 40);
        assert_eq!(back.bytes, bytes);
        assert_eq!(
            back.file.to_bytes().unwrap(),
            bytes,
            "written again: same bytes"
        );
        assert_eq!(back.file.ciphers, f.ciphers);
        assert_eq!(back.file.costs, f.costs);
        assert_eq!(
            back.file.links.len(),
            2,
            "paper-regime's 64 ms and 8 ms links"
        );
        let p = &plan.points[0];
        let c = back.file.link(p).unwrap();
        assert_eq!((c.rtt_ms, c.socket_mb_s, c.cores_avail), (128.5, 2.42, 2.0));
        assert_eq!(back.file.cipher(p), Some((10.82 * 1e6, 10.82 * 1e6)));
        // The tunnel's round trip where it was measured, and no entry (not a zero) where not.
        let tunnels: Vec<_> = back.file.links.iter().map(|l| l.ipsec_rtt).collect();
        assert_eq!(tunnels, [Some(tunnel), None]);
        assert!(!String::from_utf8_lossy(&bytes[..]).contains("\"ipsec_rtt\": null"));
        assert_eq!(back.file.measured_by.git_rev, "0123abc");
        assert!(back.file.covers(&plan).is_ok());
        // One byte more is another file.
        let mut other = bytes.clone();
        other.push(b'\n');
        assert_ne!(
            LoadedCalibration::from_bytes(other).unwrap().sha1,
            back.sha1
        );
        let wrong = String::from_utf8(bytes.clone())
            .unwrap()
            .replace(CALIBRATION_SCHEMA, "ipsan-lab-calibration/0");
        assert!(LoadedCalibration::from_bytes(wrong.into_bytes()).is_err());
        let mut none = f.clone();
        none.cores_avail = 0.0;
        assert!(LoadedCalibration::from_bytes(none.to_bytes().unwrap()).is_err());
        assert!(LoadedCalibration::from_bytes(b"{}".to_vec()).is_err());
    }

    /// A file measured for one plan does not silently price another: the links and ciphers
    /// it lacks are named before anything runs.
    #[test]
    fn rejects_a_plan_whose_links_or_ciphers_the_file_lacks() {
        let regime = crate::plan::Plan::load("paper-regime").unwrap();
        let quick = crate::plan::Plan::load("quick").unwrap();
        let f = sample_file(&regime.points, 128.0, 2.42, 10.82);
        let e = f.covers(&quick).unwrap_err().to_string();
        assert!(e.contains("the link of"), "{e}");
        assert!(e.contains("ipsan lab calibrate --plan quick"), "{e}");
        // Same links, one cipher fewer.
        let mut g = sample_file(&quick.points, 1.0, 100.0, 100.0);
        g.ciphers.retain(|c| !c.cipher.starts_with("3des"));
        let e = g.covers(&quick).unwrap_err().to_string();
        assert!(e.contains("cipher rates of"), "{e}");
    }

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
