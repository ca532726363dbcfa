//! The engine of `ipsan bench`: a workload generator, a latency histogram, CPU accounting and a
//! verifiable data pattern, measured the way the papers measure (Aiken et al.: throughput at a
//! fixed queue depth and block size; Kamisaka et al.: CPU utilisation as user+sys over wall).
//!
//! `depth` workers share one session (an iSCSI [`Session`] or an NVMe/TCP
//! [`ipsan_initiator::nvme::NvmeSession`], both [`BlockIo`]); each takes the next operation
//! from a shared counter, so `depth` commands are in flight at all times (bounded by the
//! target's CmdSN window, or NVMe's queues).
//! The JSON result schema ([`crate::report`]) is documented in `docs/bench.md`.
//!
//! Files: this one holds the workload, its runs and the workers; `workload/pattern.rs` the
//! `--verify` pattern, `--data-file` payloads and the operation stream; `workload/block_io.rs`
//! the sessions it runs on ([`BlockIo`]); `workload/tests.rs` the unit tests.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use hdrhistogram::Histogram;

use ipsan_initiator::nvme::NvmeSession;
use ipsan_initiator::scsi::Capacity;
use ipsan_initiator::{Error, McsSession, Session};

use crate::autodepth::{AutoConfig, AutoReport, DepthController};
use crate::report::{
    cpu_times, CpuUsage, Latency, Measured, RwMode, Sink, VerifyResult, WorkloadInfo,
};
use crate::trace::Trace;

mod block_io;
mod pattern;

pub use block_io::BlockIo;
use pattern::Written;
pub use pattern::{check_pattern, fill_pattern, splitmix64, Generator, Op, Payload};

/// When the run stops.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// Transfer this many bytes (rounded up to whole blocks).
    Bytes(u64),
    /// Run this long.
    Time(Duration),
}

/// What to run.
#[derive(Debug, Clone)]
pub struct Workload {
    pub mode: RwMode,
    /// Percent of operations that are reads, for `rw`/`randrw`.
    pub mix_read_percent: u8,
    /// Bytes per command; a multiple of the LUN's block length.
    pub block_size: u64,
    /// Commands in flight.
    pub depth: usize,
    /// Byte offset where the addressed region starts (block-aligned).
    pub offset: u64,
    pub limit: Limit,
    /// Write the LBA-stamped pattern and check it on read.
    pub verify: bool,
    /// Seed for random offsets, the read/write mix and the verify pattern.
    pub seed: u64,
    /// What writes send (`--data-file`): `None` writes the verify pattern with `verify`, else
    /// one fixed buffer. With a payload, `verify` checks reads against it.
    pub data: Option<Payload>,
    /// Offered load (`ipsan bench --rate`; Muknahallipatna et al.'s (002) Fig. 9, their
    /// FCLoad): bytes per second the run asks for. Command `i` starts no earlier than
    /// [`pace_at`] says, whatever the depth; a command already late starts at once, so the
    /// schedule, not the completions, sets the pace. `None`: as fast as the depth allows.
    pub rate: Option<u64>,
    /// What reads do with their data (`--sink`): keep it in the worker's buffer (checked with
    /// `verify`) or drop it as it arrives ([`Sink::Discard`], not with `verify`).
    pub sink: Sink,
}

impl From<&Workload> for WorkloadInfo {
    fn from(w: &Workload) -> Self {
        Self {
            rw: w.mode,
            mix_read_percent: w.mix_read_percent,
            block_size: w.block_size,
            depth: w.depth,
            offset: w.offset,
            size_bytes: match w.limit {
                Limit::Bytes(b) => Some(b),
                Limit::Time(_) => None,
            },
            time_s: match w.limit {
                Limit::Time(t) => Some(t.as_secs_f64()),
                Limit::Bytes(_) => None,
            },
            verify: w.verify,
            seed: w.seed,
            rate_bytes_per_s: w.rate,
            sink: w.sink,
        }
    }
}

/// When command `i` of a run offered `rate` bytes per second of `block_size`-byte commands
/// may start: `i × block_size ÷ rate` after the run's start (an open-loop load, as a traffic
/// generator offers it). `None` without a rate (or with a rate of 0).
pub fn pace_at(start: Instant, i: u64, block_size: u64, rate: Option<u64>) -> Option<Instant> {
    let rate = rate.filter(|&r| r > 0)?;
    let secs = i as f64 * block_size as f64 / rate as f64;
    Some(start + Duration::try_from_secs_f64(secs).unwrap_or(Duration::MAX / 4))
}

/// A live sample for progress display.
#[derive(Debug, Clone, Copy)]
pub struct Progress {
    pub elapsed: Duration,
    pub bytes: u64,
    pub ops: u64,
    /// Expected total bytes (size mode) or total duration (time mode).
    pub total_bytes: Option<u64>,
    pub total_time: Option<Duration>,
}

/// A failure of the benchmark itself.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BenchError {
    #[error("bad workload: {0}")]
    Workload(String),
    #[error("{op} at LBA {lba} ({blocks} blocks) failed: {source}")]
    Io {
        op: &'static str,
        lba: u64,
        blocks: u32,
        #[source]
        source: Error,
    },
    #[error(
        "verify failed: first bad LBA {lba} (expected LBA stamp {lba}, seed {seed:#x}; found stamp {found_lba}, seed {found_seed:#x})"
    )]
    Verify {
        lba: u64,
        seed: u64,
        found_lba: u64,
        found_seed: u64,
    },
    #[error("verify failed: first bad LBA {lba} (its data differs from --data-file's)")]
    VerifyData { lba: u64 },
}

#[derive(Debug)]
struct WorkerStats {
    all: Histogram<u64>,
    read: Histogram<u64>,
    write: Histogram<u64>,
    read_bytes: u64,
    write_bytes: u64,
    checked_blocks: u64,
}

fn histogram() -> Histogram<u64> {
    // 1 ns .. 1 hour at 3 significant digits: constant, valid bounds.
    #[allow(clippy::expect_used)]
    Histogram::new_with_bounds(1, 3_600_000_000_000, 3).expect("valid histogram bounds")
}

/// [`run`] or [`run_auto`] on any [`BlockIo`] (the NVMe/TCP session: no trace observer).
pub async fn run_on<S: BlockIo>(
    session: Arc<S>,
    w: Workload,
    auto: Option<AutoConfig>,
    tick: Option<Box<dyn FnMut(Progress) + Send>>,
) -> Result<(Measured, Option<AutoReport>), BenchError> {
    run_on_threads(session, w, auto, tick, &[]).await
}

/// [`run_on`] with worker `k` spawned on runtime `k mod n` of `spawn_on` (empty: the
/// caller's). With current-thread runtimes, one per thread, whose threads each run an NVMe/TCP
/// I/O queue ([`ipsan_initiator::nvme::NvmeConfig::queue_runtimes`]), each worker's commands
/// go on the queue of its own thread and nothing crosses between threads per command.
pub async fn run_on_threads<S: BlockIo>(
    session: Arc<S>,
    w: Workload,
    auto: Option<AutoConfig>,
    tick: Option<Box<dyn FnMut(Progress) + Send>>,
    spawn_on: &[tokio::runtime::Handle],
) -> Result<(Measured, Option<AutoReport>), BenchError> {
    let want_report = auto.is_some();
    let (m, r) = run_inner(session, w, auto, tick, None, spawn_on).await?;
    if want_report && r.is_none() {
        return Err(BenchError::Workload(
            "depth controller did not report".into(),
        ));
    }
    Ok((m, r))
}

/// Run the workload on `session` (which must have read its capacity). `tick` is called about
/// twice a second with live totals.
pub async fn run(
    session: Arc<Session>,
    w: Workload,
    tick: Option<Box<dyn FnMut(Progress) + Send>>,
) -> Result<Measured, BenchError> {
    Ok(run_inner(session, w, None, tick, None, &[]).await?.0)
}

/// Like [`run`], but the depth adapts from live measurements ([`crate::autodepth`]):
/// `w.depth` is ignored; up to `auto.max` workers exist and a semaphore lets the controller's
/// depth of them have a command in flight. Returns the measurement and the controller's report.
pub async fn run_auto(
    session: Arc<Session>,
    w: Workload,
    auto: AutoConfig,
    tick: Option<Box<dyn FnMut(Progress) + Send>>,
) -> Result<(Measured, AutoReport), BenchError> {
    let (m, r) = run_inner(session, w, Some(auto), tick, None, &[]).await?;
    let r = r.ok_or_else(|| BenchError::Workload("depth controller did not report".into()))?;
    Ok((m, r))
}

/// [`run`] (or [`run_auto`] with `auto`) recording every command of the timed run into
/// `trace`, which becomes the session's observer (`ipsan bench --trace`); the trace stops
/// admitting commands when the timed run ends, before any `--verify` read-back.
pub async fn run_traced(
    session: Arc<Session>,
    w: Workload,
    auto: Option<AutoConfig>,
    tick: Option<Box<dyn FnMut(Progress) + Send>>,
    trace: Option<Arc<Trace>>,
) -> Result<(Measured, Option<AutoReport>), BenchError> {
    if let Some(t) = &trace {
        if !session.set_observer(t.clone()) {
            return Err(BenchError::Workload(
                "the session has an observer already".into(),
            ));
        }
    }
    let want_report = auto.is_some();
    let (m, r) = run_inner(session, w, auto, tick, trace.as_deref(), &[]).await?;
    if want_report && r.is_none() {
        return Err(BenchError::Workload(
            "depth controller did not report".into(),
        ));
    }
    Ok((m, r))
}

/// Sleep `d`, waking every 50 ms to see whether `done` says the run is over; false if it is.
async fn sleep_unless_done(d: Duration, done: &(dyn Fn() -> bool + Send + Sync)) -> bool {
    let end = Instant::now() + d;
    loop {
        if done() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        tokio::time::sleep((end - now).min(Duration::from_millis(50))).await;
    }
}

async fn run_inner<S: BlockIo>(
    session: Arc<S>,
    w: Workload,
    auto: Option<AutoConfig>,
    mut tick: Option<Box<dyn FnMut(Progress) + Send>>,
    trace: Option<&Trace>,
    spawn_on: &[tokio::runtime::Handle],
) -> Result<(Measured, Option<AutoReport>), BenchError> {
    let cap = session
        .capacity()
        .ok_or_else(|| BenchError::Workload("LUN capacity unknown".into()))?;
    let bl = u64::from(cap.block_len);
    if w.block_size == 0 || w.block_size % bl != 0 {
        return Err(BenchError::Workload(format!(
            "block size {} is not a multiple of the LUN's {bl}-byte blocks",
            w.block_size
        )));
    }
    if w.offset % bl != 0 {
        return Err(BenchError::Workload(format!(
            "offset {} is not a multiple of {bl}",
            w.offset
        )));
    }
    let workers = auto.map_or(w.depth, |a| a.max);
    if workers == 0 {
        return Err(BenchError::Workload("depth must be at least 1".into()));
    }
    let lun_bytes = cap.bytes();
    if w.offset >= lun_bytes {
        return Err(BenchError::Workload(format!(
            "offset {} is past the end of the {lun_bytes}-byte LUN",
            w.offset
        )));
    }
    let avail = lun_bytes - w.offset;
    let region = match w.limit {
        Limit::Bytes(b) => b.min(avail),
        Limit::Time(_) => avail,
    };
    let units = region / w.block_size;
    if units == 0 {
        return Err(BenchError::Workload(format!(
            "region of {region} bytes holds no {}-byte block",
            w.block_size
        )));
    }
    let total_ops = match w.limit {
        Limit::Bytes(b) => Some(b.div_ceil(w.block_size)),
        Limit::Time(_) => None,
    };
    let deadline_after = match w.limit {
        Limit::Time(t) => Some(t),
        Limit::Bytes(_) => None,
    };
    let blocks = u32::try_from(w.block_size / bl)
        .map_err(|_| BenchError::Workload("block size too large".into()))?;
    if let Some(p) = &w.data {
        if !p.fits(w.block_size) {
            return Err(BenchError::Workload(format!(
                "the data file's {} bytes are not a whole number of {}-byte blocks",
                p.len(),
                w.block_size
            )));
        }
    }
    if w.sink == Sink::Discard {
        if w.verify {
            return Err(BenchError::Workload(
                "--verify checks what reads return: not with --sink discard".into(),
            ));
        }
        if !session.drops_data() {
            return Err(BenchError::Workload(
                "--sink discard needs an iSCSI session (this one keeps what it reads)".into(),
            ));
        }
    }
    let gen = Arc::new(Generator::new(&w, units));
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let bytes_done = Arc::new(AtomicU64::new(0));
    let ops_done = Arc::new(AtomicU64::new(0));
    let lat_sum_ns = Arc::new(AtomicU64::new(0));
    // --depth auto: `workers` tasks exist, the controller's depth of them hold a permit.
    let gate = auto.map(|a| Arc::new(tokio::sync::Semaphore::new(a.start)));
    let written = Arc::new(Written::new(if w.verify && w.mode.writes() {
        units
    } else {
        0
    }));
    let first_error: Arc<Mutex<Option<BenchError>>> = Arc::new(Mutex::new(None));
    // Without --verify every write sends the same buffer: no per-op pattern cost. One buffer
    // per runtime the workers are spread over (`spawn_on`; one without): a write's clone and
    // drop of it write its reference count, which the threads would otherwise share.
    let plains: Vec<Bytes> = (0..spawn_on.len().max(1))
        .map(|_| Bytes::from(vec![0xa5u8; w.block_size as usize]))
        .collect();

    let start_cpu = cpu_times();
    let start = Instant::now();
    let deadline = deadline_after.map(|d| start + d);
    let mut handles = Vec::with_capacity(workers);
    for k in 0..workers {
        let session = session.clone();
        let gate = gate.clone();
        let lat_sum_ns = lat_sum_ns.clone();
        let gen = gen.clone();
        let next = next.clone();
        let stop = stop.clone();
        let bytes_done = bytes_done.clone();
        let ops_done = ops_done.clone();
        let written = written.clone();
        let first_error = first_error.clone();
        let plain = plains[k % plains.len()].clone();
        let w = w.clone();
        let worker = async move {
            let mut st = WorkerStats {
                all: histogram(),
                read: histogram(),
                write: histogram(),
                read_bytes: 0,
                write_bytes: 0,
                checked_blocks: 0,
            };
            let mut rbuf = BytesMut::with_capacity(w.block_size as usize);
            let mut scratch = Vec::new();
            let verify_all_reads = !w.mode.writes();
            loop {
                // Closed when the run ends: a worker parked by a lower depth stops too.
                let _permit = match &gate {
                    Some(g) => match g.acquire().await {
                        Ok(p) => Some(p),
                        Err(_) => break,
                    },
                    None => None,
                };
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                if deadline.is_some_and(|d| Instant::now() >= d) {
                    break;
                }
                let i = next.fetch_add(1, Ordering::Relaxed);
                if total_ops.is_some_and(|t| i >= t) {
                    break;
                }
                if let Some(due) = pace_at(start, i, w.block_size, w.rate) {
                    if deadline.is_some_and(|d| due >= d) {
                        break;
                    }
                    if due > Instant::now() {
                        tokio::time::sleep_until(due.into()).await;
                    }
                }
                let op = gen.op(i);
                let lba = (w.offset + op.unit * w.block_size) / bl;
                let t0 = Instant::now();
                // Whether this unit was written *before* the read was issued: a write still in
                // flight may land after the read saw the old data (issue 8 soak: false
                // "found stamp 0" reports under randrw).
                let check_read = w.verify && (verify_all_reads || written.get(op.unit));
                let res = if op.read && w.sink == Sink::Discard {
                    match session.read_discard(lba, blocks).await {
                        Ok(()) => {
                            let ns = t0.elapsed().as_nanos() as u64;
                            let _ = st.read.record(ns.max(1));
                            let _ = st.all.record(ns.max(1));
                            st.read_bytes += w.block_size;
                            Ok(())
                        }
                        Err(e) => Err(BenchError::Io {
                            op: "read",
                            lba,
                            blocks,
                            source: e,
                        }),
                    }
                } else if op.read {
                    match session
                        .read_into(lba, blocks, std::mem::take(&mut rbuf))
                        .await
                    {
                        Ok(buf) => {
                            let ns = t0.elapsed().as_nanos() as u64;
                            let _ = st.read.record(ns.max(1));
                            let _ = st.all.record(ns.max(1));
                            st.read_bytes += w.block_size;
                            let mut r = Ok(());
                            if check_read {
                                r = match &w.data {
                                    Some(p) => {
                                        p.check(&buf, op.unit, w.block_size, lba, bl as usize)
                                    }
                                    None => {
                                        check_pattern(&buf, lba, bl as usize, w.seed, &mut scratch)
                                    }
                                };
                                st.checked_blocks += u64::from(blocks);
                            }
                            // The buffer back for the next read, unless the data was the
                            // transport's own (then nothing was allocated for it).
                            rbuf = buf.try_into_mut().unwrap_or_default();
                            r
                        }
                        Err(e) => Err(BenchError::Io {
                            op: "read",
                            lba,
                            blocks,
                            source: e,
                        }),
                    }
                } else {
                    let data = if let Some(p) = &w.data {
                        p.unit(op.unit, w.block_size)
                    } else if w.verify {
                        let mut b = vec![0u8; w.block_size as usize];
                        fill_pattern(&mut b, lba, bl as usize, w.seed);
                        Bytes::from(b)
                    } else {
                        plain.clone()
                    };
                    let t0 = Instant::now();
                    match session.write(lba, data).await {
                        Ok(()) => {
                            let ns = t0.elapsed().as_nanos() as u64;
                            let _ = st.write.record(ns.max(1));
                            let _ = st.all.record(ns.max(1));
                            st.write_bytes += w.block_size;
                            if w.verify {
                                written.set(op.unit);
                            }
                            Ok(())
                        }
                        Err(e) => Err(BenchError::Io {
                            op: "write",
                            lba,
                            blocks,
                            source: e,
                        }),
                    }
                };
                if let Err(e) = res {
                    stop.store(true, Ordering::Relaxed);
                    if let Ok(mut f) = first_error.lock() {
                        f.get_or_insert(e);
                    }
                    break;
                }
                lat_sum_ns.fetch_add(t0.elapsed().as_nanos() as u64, Ordering::Relaxed);
                bytes_done.fetch_add(w.block_size, Ordering::Relaxed);
                ops_done.fetch_add(1, Ordering::Relaxed);
            }
            st
        };
        handles.push(match spawn_on.get(k % spawn_on.len().max(1)) {
            Some(rt) => rt.spawn(worker),
            None => tokio::spawn(worker),
        });
    }

    // The depth controller: measure a window, decide, apply; close the gate when the run ends.
    let controller = match (auto, gate.clone()) {
        (Some(cfg), Some(gate)) => {
            let next = next.clone();
            let stop = stop.clone();
            let bytes_done = bytes_done.clone();
            let ops_done = ops_done.clone();
            let lat_sum_ns = lat_sum_ns.clone();
            Some(tokio::spawn(async move {
                let done = move || {
                    stop.load(Ordering::Relaxed)
                        || deadline.is_some_and(|d| Instant::now() >= d)
                        || total_ops.is_some_and(|t| next.load(Ordering::Relaxed) >= t)
                };
                let snap = || {
                    (
                        Instant::now(),
                        bytes_done.load(Ordering::Relaxed),
                        ops_done.load(Ordering::Relaxed),
                        lat_sum_ns.load(Ordering::Relaxed),
                    )
                };
                let mut ctl = DepthController::new(cfg);
                let mut d = ctl.first();
                let mut cur = d.depth;
                loop {
                    if !sleep_unless_done(d.settle, &done).await {
                        break;
                    }
                    let a = snap();
                    if !sleep_unless_done(d.window, &done).await {
                        break;
                    }
                    let b = snap();
                    let sample = crate::autodepth::Sample {
                        duration: b.0 - a.0,
                        bytes: b.1 - a.1,
                        ops: b.2 - a.2,
                        latency_sum: Duration::from_nanos(b.3 - a.3),
                    };
                    d = ctl.observe(sample, start.elapsed());
                    if d.depth > cur {
                        gate.add_permits(d.depth - cur);
                    } else if d.depth < cur {
                        // Take the permits back as commands complete.
                        let n = u32::try_from(cur - d.depth).unwrap_or(u32::MAX);
                        match gate.clone().acquire_many_owned(n).await {
                            Ok(p) => p.forget(),
                            Err(_) => break,
                        }
                    }
                    cur = d.depth;
                }
                gate.close();
                AutoReport {
                    start: cfg.start,
                    max: cfg.max,
                    chosen: ctl.chosen(),
                    trajectory: ctl.trajectory().to_vec(),
                }
            }))
        }
        _ => None,
    };

    // Progress ticks until every worker is done.
    let total_bytes = total_ops.map(|o| o * w.block_size);
    let mut all = Box::pin(async move {
        let mut out = Vec::with_capacity(handles.len());
        for h in handles {
            out.push(h.await);
        }
        out
    });
    let mut interval = tokio::time::interval(Duration::from_millis(500));
    interval.tick().await;
    let stats = loop {
        tokio::select! {
            r = &mut all => break r,
            _ = interval.tick() => {
                if let Some(t) = tick.as_mut() {
                    t(Progress {
                        elapsed: start.elapsed(),
                        bytes: bytes_done.load(Ordering::Relaxed),
                        ops: ops_done.load(Ordering::Relaxed),
                        total_bytes,
                        total_time: deadline_after,
                    });
                }
            }
        }
    };
    let wall = start.elapsed();
    let cpu = CpuUsage::between(start_cpu, cpu_times(), wall);
    let auto_report = match controller {
        Some(c) => Some(
            c.await
                .map_err(|e| BenchError::Workload(format!("depth controller panicked: {e}")))?,
        ),
        None => None,
    };
    // The trace covers the timed run, not the verify read-back.
    if let Some(t) = trace {
        t.stop();
    }
    if let Some(e) = first_error.lock().ok().and_then(|mut f| f.take()) {
        return Err(e);
    }
    let mut agg = WorkerStats {
        all: histogram(),
        read: histogram(),
        write: histogram(),
        read_bytes: 0,
        write_bytes: 0,
        checked_blocks: 0,
    };
    for s in stats {
        let s = s.map_err(|e| BenchError::Workload(format!("worker panicked: {e}")))?;
        let _ = agg.all.add(&s.all);
        let _ = agg.read.add(&s.read);
        let _ = agg.write.add(&s.write);
        agg.read_bytes += s.read_bytes;
        agg.write_bytes += s.write_bytes;
        agg.checked_blocks += s.checked_blocks;
    }

    // --verify with writes: read back everything written in this run (not timed), with the
    // workload's depth in flight: one read at a time made a 1 GiB read-back over a lossy WAN
    // take ten times the write (issue 8), since every tail loss waits for a retransmit timeout.
    if w.verify && w.mode.writes() {
        agg.checked_blocks += read_back(&session, &written, units, &w, bl, blocks, w.depth).await?;
    }

    let secs = wall.as_secs_f64().max(1e-9);
    let bytes = agg.read_bytes + agg.write_bytes;
    let ops = agg.all.len();
    let lat = |h: &Histogram<u64>| (!h.is_empty()).then(|| Latency::from_histogram(h));
    let m = Measured {
        duration_s: secs,
        ops,
        read_ops: agg.read.len(),
        write_ops: agg.write.len(),
        bytes,
        read_bytes: agg.read_bytes,
        write_bytes: agg.write_bytes,
        throughput_mb_s: bytes as f64 / secs / 1e6,
        throughput_mib_s: bytes as f64 / secs / (1024.0 * 1024.0),
        iops: ops as f64 / secs,
        latency_us: Latency::from_histogram(&agg.all),
        read_latency_us: lat(&agg.read),
        write_latency_us: lat(&agg.write),
        cpu,
        verify: VerifyResult {
            enabled: w.verify,
            checked_blocks: agg.checked_blocks,
        },
    };
    Ok((m, auto_report))
}

/// Reads back and checks every unit in `written`, `depth` reads in flight; returns the blocks
/// checked. The first failure (I/O or a wrong pattern) stops the other readers.
async fn read_back<S: BlockIo>(
    session: &Arc<S>,
    written: &Arc<Written>,
    units: u64,
    w: &Workload,
    bl: u64,
    blocks: u32,
    depth: usize,
) -> Result<u64, BenchError> {
    let next = Arc::new(AtomicU64::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let mut readers = Vec::with_capacity(depth);
    for _ in 0..depth.max(1) {
        let (session, written, next, stop) =
            (session.clone(), written.clone(), next.clone(), stop.clone());
        let (offset, block_size, seed) = (w.offset, w.block_size, w.seed);
        let data = w.data.clone();
        readers.push(tokio::spawn(async move {
            let mut scratch = Vec::new();
            let mut buf = BytesMut::new();
            let mut checked = 0u64;
            loop {
                let u = next.fetch_add(1, Ordering::Relaxed);
                if u >= units || stop.load(Ordering::Relaxed) {
                    return Ok(checked);
                }
                if !written.get(u) {
                    continue;
                }
                let lba = (offset + u * block_size) / bl;
                let r = match session.read_into(lba, blocks, buf).await {
                    Ok(b) => {
                        let r = match &data {
                            Some(p) => p.check(&b, u, block_size, lba, bl as usize),
                            None => check_pattern(&b, lba, bl as usize, seed, &mut scratch),
                        };
                        buf = b.try_into_mut().unwrap_or_default();
                        r
                    }
                    Err(e) => {
                        buf = BytesMut::new();
                        Err(BenchError::Io {
                            op: "verify read",
                            lba,
                            blocks,
                            source: e,
                        })
                    }
                };
                if let Err(e) = r {
                    stop.store(true, Ordering::Relaxed);
                    return Err(e);
                }
                checked += u64::from(blocks);
            }
        }));
    }
    let mut total = 0;
    let mut first_err = None;
    for r in readers {
        match r.await {
            Ok(Ok(n)) => total += n,
            Ok(Err(e)) => {
                first_err.get_or_insert(e);
            }
            Err(e) => {
                first_err
                    .get_or_insert(BenchError::Workload(format!("verify reader panicked: {e}")));
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(total),
    }
}

/// Parse sizes like `64KiB`, `1MiB`, `1GiB`, `4k`, `512`, `1MB` (decimal with SI suffixes):
/// [`ipsan_units::parse_size`].
pub fn parse_size(s: &str) -> Result<u64, String> {
    ipsan_units::parse_size(s).map_err(|e| e.to_string())
}

/// Parse durations like `30s`, `2m`, `500ms`, `1h`, `10` (seconds), which must be positive:
/// [`ipsan_units::parse_duration_or_secs`].
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    let d = ipsan_units::parse_duration_or_secs(s).map_err(|e| e.to_string())?;
    if d.is_zero() {
        return Err(format!("duration {s:?} must be positive"));
    }
    Ok(d)
}

#[cfg(test)]
mod tests;
