//! The TUN forwarder: a thin driver that moves packets from one TUN device through a
//! [`Pipeline`] and a deadline heap to the other.
//!
//! One thread per direction. Each loop iteration releases every packet whose deadline has
//! passed, then reads a batch of arrivals (the TUN fd is non-blocking), then waits. tokio's
//! timer ticks in milliseconds, too coarse for sub-millisecond delays, so the wait is a
//! `ppoll` with a nanosecond timeout and 1 ns timer slack that ends a little before the next
//! deadline (twice the measured wake-up latency, at least [`SPIN_NS`]), followed by a short
//! spin. Packet buffers come from a per-direction pool
//! and are reused, so the steady state allocates nothing.

use crate::config::DirConfig;
use crate::cut::CutState;
use crate::pipeline::{DropReason, Nanos, Packet, Pipeline, Verdict};
use serde::{Deserialize, Serialize};
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::fs::File;
use std::io::{ErrorKind, Read, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The least time before a deadline at which the forwarder stops sleeping and spins.
pub const SPIN_NS: Nanos = 20_000;
/// The most: beyond this the CPU cost of spinning outweighs the precision gained.
const MAX_SPIN_NS: Nanos = 250_000;
/// Oversleeps longer than this (a preempted or throttled thread, not a wake-up latency) are
/// clipped before they enter the moving average, so one stall does not make us spin for long.
const MAX_OVERSLEEP_SAMPLE_NS: Nanos = 500_000;
/// Packets read per loop iteration before checking deadlines again.
const BATCH: usize = 32;
/// Memory the packet pool of one direction may grow to.
const POOL_BYTES: usize = 128 << 20;

/// Counters of one direction, updated by its forwarder thread.
#[derive(Debug, Default)]
pub struct DirCounters {
    packets_in: AtomicU64,
    bytes_in: AtomicU64,
    packets_out: AtomicU64,
    bytes_out: AtomicU64,
    dropped_loss: AtomicU64,
    dropped_queue: AtomicU64,
    dropped_other: AtomicU64,
    dropped_cut: AtomicU64,
    cut: AtomicBool,
    reordered: AtomicU64,
    corrupted: AtomicU64,
    duplicated: AtomicU64,
    queue_depth: AtomicU64,
    in_flight: AtomicU64,
    late_ns_sum: AtomicU64,
    late_ns_max: AtomicU64,
    late_hist: [AtomicU64; LATE_BUCKETS_US.len() + 1],
    path_ns: AtomicU64,
}

/// Upper bounds (µs) of the release-lateness histogram buckets; one more bucket holds the rest.
pub const LATE_BUCKETS_US: [u64; 9] = [10, 20, 50, 100, 200, 500, 1000, 2000, 5000];

/// A snapshot of one direction's counters.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DirStats {
    /// Packets read from the sending side.
    pub packets_in: u64,
    /// Bytes read from the sending side.
    pub bytes_in: u64,
    /// Packets delivered to the receiving side (duplicates included).
    pub packets_out: u64,
    /// Bytes delivered.
    pub bytes_out: u64,
    /// Dropped by the loss model.
    pub dropped_loss: u64,
    /// Tail-dropped by the bottleneck queue.
    pub dropped_queue: u64,
    /// Dropped for any other reason (pool exhausted, write error, a stage's rejection).
    pub dropped_other: u64,
    /// Lost to a link cut: arrived while cut, or still on the wire when a cut began.
    #[serde(default)]
    pub dropped_cut: u64,
    /// Whether the direction is cut right now (by its schedule or by `ipsan wan cut`).
    #[serde(default)]
    pub cut: bool,
    /// Held back behind later packets.
    pub reordered: u64,
    /// Had a bit flipped.
    pub corrupted: u64,
    /// Delivered twice.
    pub duplicated: u64,
    /// Packets in the bottleneck queue now.
    pub queue_depth: u64,
    /// Packets inside the emulator now (queued or on the delay line).
    pub in_flight: u64,
    /// Sum over released packets of (actual write time − scheduled release time), in ns:
    /// divided by `packets_out` it is the emulator's mean timing error.
    pub late_ns_sum: u64,
    /// The largest such lateness seen, in ns.
    pub late_ns_max: u64,
    /// Released packets per lateness bucket ([`LATE_BUCKETS_US`], then everything later).
    pub late_hist: [u64; LATE_BUCKETS_US.len() + 1],
    /// The path's own one-way latency, measured at link-up and taken off the set delay
    /// (0 when not compensated), in ns.
    #[serde(default)]
    pub path_ns: u64,
}

impl DirStats {
    /// The bucket bound (µs) below which at least fraction `q` of releases happened
    /// (`None` if nothing was released or it lies in the open last bucket).
    pub fn late_quantile_us(&self, q: f64) -> Option<u64> {
        let total: u64 = self.late_hist.iter().sum();
        if total == 0 {
            return None;
        }
        let mut acc = 0;
        for (i, n) in self.late_hist.iter().enumerate() {
            acc += n;
            if acc as f64 >= q * total as f64 {
                return LATE_BUCKETS_US.get(i).copied();
            }
        }
        None
    }
}

impl DirCounters {
    /// Reads every counter.
    pub fn snapshot(&self) -> DirStats {
        DirStats {
            packets_in: self.packets_in.load(Relaxed),
            bytes_in: self.bytes_in.load(Relaxed),
            packets_out: self.packets_out.load(Relaxed),
            bytes_out: self.bytes_out.load(Relaxed),
            dropped_loss: self.dropped_loss.load(Relaxed),
            dropped_queue: self.dropped_queue.load(Relaxed),
            dropped_other: self.dropped_other.load(Relaxed),
            dropped_cut: self.dropped_cut.load(Relaxed),
            cut: self.cut.load(Relaxed),
            reordered: self.reordered.load(Relaxed),
            corrupted: self.corrupted.load(Relaxed),
            duplicated: self.duplicated.load(Relaxed),
            queue_depth: self.queue_depth.load(Relaxed),
            in_flight: self.in_flight.load(Relaxed),
            late_ns_sum: self.late_ns_sum.load(Relaxed),
            late_ns_max: self.late_ns_max.load(Relaxed),
            late_hist: std::array::from_fn(|i| self.late_hist[i].load(Relaxed)),
            path_ns: self.path_ns.load(Relaxed),
        }
    }

    fn reset(&self) {
        for c in [
            &self.packets_in,
            &self.bytes_in,
            &self.packets_out,
            &self.bytes_out,
            &self.dropped_loss,
            &self.dropped_queue,
            &self.dropped_other,
            &self.dropped_cut,
            &self.reordered,
            &self.corrupted,
            &self.duplicated,
            &self.late_ns_sum,
            &self.late_ns_max,
        ] {
            c.store(0, Relaxed);
        }
        for c in &self.late_hist {
            c.store(0, Relaxed);
        }
    }
}

/// What the link's owner shares with one forwarder thread.
#[derive(Debug)]
pub struct Control {
    stop: AtomicBool,
    reset: AtomicBool,
    pending: Mutex<Option<DirConfig>>,
    has_pending: AtomicBool,
    /// New path latency for the pipeline ([`Control::set_path_latency`]).
    pending_path: Mutex<Option<Nanos>>,
    /// The manual cut the owner wants (`ipsan wan cut` / `restore`).
    want_cut: AtomicBool,
    /// The counters.
    pub counters: DirCounters,
    wake_tx: UnixStream,
}

impl Control {
    /// Asks the thread to stop.
    pub fn stop(&self) {
        self.stop.store(true, Relaxed);
        self.wake();
    }

    /// Hands new settings to the thread's pipeline.
    pub fn reconfigure(&self, cfg: DirConfig) {
        if let Ok(mut p) = self.pending.lock() {
            *p = Some(cfg);
        }
        self.has_pending.store(true, Relaxed);
        self.wake();
    }

    /// Tells the pipeline the path's own one-way latency, to be taken off the set delay.
    pub fn set_path_latency(&self, ns: Nanos) {
        if let Ok(mut p) = self.pending_path.lock() {
            *p = Some(ns);
        }
        self.has_pending.store(true, Relaxed);
        self.wake();
    }

    /// Cuts the direction (`true`) until restored (`false`); see [`crate::cut`].
    pub fn set_cut(&self, cut: bool) {
        self.want_cut.store(cut, Relaxed);
        self.wake();
    }

    /// Zeroes the counters (the thread does it, so no update is lost half-way).
    pub fn reset_counters(&self) {
        self.reset.store(true, Relaxed);
        self.wake();
    }

    fn wake(&self) {
        // A full socket buffer already means "wake up"; nothing to do on error.
        let _ = (&self.wake_tx).write(&[1]);
    }
}

/// The monotonic clock the forwarders share, as [`Nanos`] since the link came up.
#[derive(Debug, Clone, Copy)]
pub struct Clock(Instant);

impl Clock {
    /// A clock starting now.
    pub fn new() -> Self {
        Clock(Instant::now())
    }

    /// Nanoseconds since the clock started.
    pub fn now(&self) -> Nanos {
        self.0.elapsed().as_nanos() as Nanos
    }
}

impl Default for Clock {
    fn default() -> Self {
        Self::new()
    }
}

/// A running direction: its control block and thread.
#[derive(Debug)]
pub struct Direction {
    /// Shared with the thread.
    pub control: Arc<Control>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Direction {
    /// Starts a forwarder thread reading `input`, running `pipeline`, writing `output`.
    /// `buf_cap` must hold the largest packet the input interface can carry. With `realtime`
    /// the thread asks for `SCHED_FIFO` so ordinary load on the host does not delay releases.
    pub fn start(
        name: &str,
        input: Arc<File>,
        output: Arc<File>,
        pipeline: Pipeline,
        buf_cap: usize,
        clock: Clock,
        realtime: bool,
    ) -> std::io::Result<Self> {
        let (wake_tx, wake_rx) = UnixStream::pair()?;
        wake_tx.set_nonblocking(true)?;
        wake_rx.set_nonblocking(true)?;
        let control = Arc::new(Control {
            stop: AtomicBool::new(false),
            reset: AtomicBool::new(false),
            pending: Mutex::new(None),
            has_pending: AtomicBool::new(false),
            pending_path: Mutex::new(None),
            want_cut: AtomicBool::new(false),
            counters: DirCounters::default(),
            wake_tx,
        });
        let c = control.clone();
        let thread = std::thread::Builder::new()
            .name(format!("wan-{name}"))
            .spawn(move || {
                let mut fw = Forwarder {
                    input,
                    output,
                    pipeline,
                    control: c,
                    wake_rx,
                    clock,
                    buf_cap,
                    max_slots: (POOL_BYTES / buf_cap).max(1024),
                    slots: Vec::new(),
                    free: Vec::new(),
                    heap: BinaryHeap::new(),
                    seq: 0,
                    scratch: Packet::with_capacity(buf_cap),
                    oversleep_ewma: 50_000,
                    realtime,
                    cuts: CutState::new(),
                };
                if let Err(e) = fw.run() {
                    tracing::error!(
                        "forwarder {} stopped: {e}",
                        std::thread::current().name().unwrap_or("?")
                    );
                }
            })?;
        Ok(Self {
            control,
            thread: Some(thread),
        })
    }

    /// Stops the thread and waits for it.
    pub fn stop(&mut self) {
        self.control.stop();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for Direction {
    fn drop(&mut self) {
        self.stop();
    }
}

struct Forwarder {
    input: Arc<File>,
    output: Arc<File>,
    pipeline: Pipeline,
    control: Arc<Control>,
    wake_rx: UnixStream,
    clock: Clock,
    buf_cap: usize,
    max_slots: usize,
    slots: Vec<Packet>,
    free: Vec<u32>,
    /// `(release time, arrival sequence, slot)`: ties leave in arrival order.
    heap: BinaryHeap<Reverse<(Nanos, u64, u32)>>,
    seq: u64,
    scratch: Packet,
    /// Moving average of how late `ppoll` wakes after a timed sleep, in ns. The host's
    /// wake-up latency (tens of µs here, more after a long idle in a VM) decides how early
    /// we must stop sleeping and spin.
    oversleep_ewma: Nanos,
    realtime: bool,
    /// Scheduled and manual link cuts.
    cuts: CutState,
}

impl Forwarder {
    fn run(&mut self) -> std::io::Result<()> {
        crate::sys::set_timer_slack_ns(1);
        let mut rt = RtGovernor::new(self.realtime, self.clock.now());
        let fds = [self.input.as_raw_fd(), self.wake_rx.as_raw_fd()];
        let c = self.control.clone();
        loop {
            if c.stop.load(Relaxed) {
                return Ok(());
            }
            if c.has_pending.swap(false, Relaxed) {
                let cfg = c.pending.lock().ok().and_then(|mut p| p.take());
                if let Some(cfg) = cfg {
                    self.pipeline.reconfigure(&cfg);
                    self.cuts.set_schedule(&cfg.cuts, self.clock.now());
                }
                let path = c.pending_path.lock().ok().and_then(|mut p| p.take());
                if let Some(ns) = path {
                    self.pipeline.set_path_latency(ns);
                    c.counters.path_ns.store(ns, Relaxed);
                }
            }
            let want_cut = c.want_cut.load(Relaxed);
            if want_cut != self.cuts.manual_cut() {
                let now = self.clock.now();
                if want_cut {
                    self.cuts.cut(now);
                } else {
                    self.cuts.restore(now);
                }
            }
            if c.reset.swap(false, Relaxed) {
                c.counters.reset();
            }
            let now = self.release_due();
            rt.tick(now);
            let got = self.read_batch()?;
            let now = if got > 0 { self.clock.now() } else { now };
            c.counters
                .queue_depth
                .store(self.pipeline.queue_len(now) as u64, Relaxed);
            c.counters.in_flight.store(self.heap.len() as u64, Relaxed);
            c.counters
                .cut
                .store(!self.cuts.is_idle() && self.cuts.is_cut(now), Relaxed);
            if got > 0 {
                continue;
            }
            let margin = if rt.frugal {
                SPIN_NS
            } else {
                (2 * self.oversleep_ewma + SPIN_NS).min(MAX_SPIN_NS)
            };
            // An idle forwarder still wakes when a scheduled cut starts or ends, to update
            // the `cut` gauge.
            let cut_change = self.cuts.next_change(now).map(|t| t + margin);
            match self.heap.peek().map(|r| r.0 .0).or(cut_change) {
                Some(t) if t <= now + margin => std::hint::spin_loop(),
                Some(t) => {
                    let t = cut_change.map_or(t, |c| c.min(t));
                    let timeout = t - now - margin;
                    if !self.sleep(&fds, Some(timeout))? {
                        let over = self
                            .clock
                            .now()
                            .saturating_sub(now + timeout)
                            .min(MAX_OVERSLEEP_SAMPLE_NS);
                        self.oversleep_ewma = (7 * self.oversleep_ewma + over) / 8;
                    }
                }
                None => {
                    self.sleep(&fds, None)?;
                }
            }
        }
    }

    /// Waits for input or the timeout; returns whether input woke it.
    fn sleep(&mut self, fds: &[i32], timeout: Option<Nanos>) -> std::io::Result<bool> {
        let woke = crate::sys::poll_readable(fds, timeout)?;
        if woke {
            let mut sink = [0u8; 64];
            while matches!((&self.wake_rx).read(&mut sink), Ok(n) if n > 0) {}
        }
        Ok(woke)
    }

    /// Writes every packet whose time has come; returns the time it last looked at.
    fn release_due(&mut self) -> Nanos {
        let mut now = self.clock.now();
        let counters = &self.control.counters;
        while let Some(&Reverse((t, _, slot))) = self.heap.peek() {
            if t > now {
                now = self.clock.now();
                if t > now {
                    break;
                }
            }
            self.heap.pop();
            if !self.cuts.is_idle() && self.cuts.lost(self.slots[slot as usize].arrived_at, t) {
                // On the wire when the link was cut.
                counters.dropped_cut.fetch_add(1, Relaxed);
                self.free.push(slot);
                continue;
            }
            let late = now - t;
            counters.late_ns_sum.fetch_add(late, Relaxed);
            counters.late_ns_max.fetch_max(late, Relaxed);
            let b = LATE_BUCKETS_US
                .iter()
                .position(|&us| late < us * 1000)
                .unwrap_or(LATE_BUCKETS_US.len());
            counters.late_hist[b].fetch_add(1, Relaxed);
            let pkt = &self.slots[slot as usize];
            match (&*self.output).write(pkt.data()) {
                Ok(_) => {
                    counters.packets_out.fetch_add(1, Relaxed);
                    counters.bytes_out.fetch_add(pkt.len() as u64, Relaxed);
                }
                Err(e) => {
                    tracing::debug!("tun write failed: {e}");
                    counters.dropped_other.fetch_add(1, Relaxed);
                }
            }
            self.free.push(slot);
        }
        now
    }

    fn take_slot(&mut self) -> Option<u32> {
        if let Some(s) = self.free.pop() {
            return Some(s);
        }
        if self.slots.len() < self.max_slots {
            self.slots.push(Packet::with_capacity(self.buf_cap));
            return Some((self.slots.len() - 1) as u32);
        }
        None
    }

    /// Reads up to [`BATCH`] packets and runs each through the pipeline.
    fn read_batch(&mut self) -> std::io::Result<usize> {
        let mut got = 0;
        while got < BATCH {
            let slot = self.take_slot();
            let pkt = match slot {
                Some(s) => &mut self.slots[s as usize],
                None => &mut self.scratch,
            };
            let n = match (&*self.input).read(pkt.buffer_mut()) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    if let Some(s) = slot {
                        self.free.push(s);
                    }
                    return Ok(got);
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            got += 1;
            pkt.set_len(n);
            let control = self.control.clone();
            let counters = &control.counters;
            counters.packets_in.fetch_add(1, Relaxed);
            counters.bytes_in.fetch_add(n as u64, Relaxed);
            let Some(slot) = slot else {
                // Pool exhausted: the delay line is longer than POOL_BYTES allows.
                counters.dropped_other.fetch_add(1, Relaxed);
                continue;
            };
            let now = self.clock.now();
            if !self.cuts.is_idle() && self.cuts.is_cut(now) {
                // The link is cut: nothing enters, and the model draws nothing for it.
                counters.dropped_cut.fetch_add(1, Relaxed);
                self.free.push(slot);
                continue;
            }
            let pkt = &mut self.slots[slot as usize];
            match self.pipeline.process(now, pkt) {
                Verdict::Drop(reason) => {
                    let c = match reason {
                        DropReason::Loss => &counters.dropped_loss,
                        DropReason::Queue => &counters.dropped_queue,
                        DropReason::Stage => &counters.dropped_other,
                    };
                    c.fetch_add(1, Relaxed);
                    self.free.push(slot);
                }
                Verdict::Pass => {
                    let (at, dup, reordered, corrupted) =
                        (pkt.release_at, pkt.duplicate, pkt.reordered, pkt.corrupted);
                    counters.reordered.fetch_add(u64::from(reordered), Relaxed);
                    counters.corrupted.fetch_add(u64::from(corrupted), Relaxed);
                    self.heap.push(Reverse((at, self.seq, slot)));
                    self.seq += 1;
                    if dup {
                        if let Some(d) = self.take_slot() {
                            let (a, b) = two_mut(&mut self.slots, slot as usize, d as usize);
                            b.copy_from(a);
                            self.heap.push(Reverse((at, self.seq, d)));
                            self.seq += 1;
                            counters.duplicated.fetch_add(1, Relaxed);
                        }
                    }
                }
            }
        }
        Ok(got)
    }
}

/// Keeps a forwarder's CPU use in check.
///
/// `SCHED_FIFO` makes releases punctual when the host is loaded, but a real-time thread that
/// is busy most of the time (spinning before dense deadlines, or bulk traffic at its ceiling)
/// runs into the kernel's RT throttling (`sched_rt_runtime_us`: at most 95 % of each second),
/// which stalls *every* RT thread on that CPU for tens of milliseconds. So every
/// [`RT_WINDOW_NS`] the forwarder measures its own CPU use: above [`FRUGAL_BUSY`] it stops
/// spinning early (only [`SPIN_NS`] before a deadline), above [`RT_MAX_BUSY`] it also leaves
/// the RT class; it returns when use falls below half those levels. A forwarder that busy is
/// awake anyway, so little precision is lost.
struct RtGovernor {
    wanted: bool,
    on: bool,
    /// Spin as little as possible.
    frugal: bool,
    window_start: Nanos,
    cpu_start: u64,
}

/// How often the governor looks at the forwarder's CPU use.
const RT_WINDOW_NS: Nanos = 50_000_000;
/// Above this fraction of one CPU the forwarder stops spinning early.
const FRUGAL_BUSY: f64 = 0.5;
/// Above this it leaves the RT class.
const RT_MAX_BUSY: f64 = 0.8;

impl RtGovernor {
    fn new(wanted: bool, now: Nanos) -> Self {
        let mut g = Self {
            wanted,
            on: false,
            frugal: false,
            window_start: now,
            cpu_start: crate::sys::thread_cpu_ns(),
        };
        if wanted {
            g.set(true);
        }
        g
    }

    fn set(&mut self, on: bool) {
        let r = if on {
            crate::sys::set_realtime(10)
        } else {
            crate::sys::set_normal_sched()
        };
        match r {
            Ok(()) => self.on = on,
            Err(e) => {
                tracing::warn!("forwarder: cannot change scheduling class: {e}");
                self.wanted = false;
            }
        }
    }

    fn tick(&mut self, now: Nanos) {
        if now < self.window_start + RT_WINDOW_NS {
            return;
        }
        let cpu = crate::sys::thread_cpu_ns();
        let busy = cpu.saturating_sub(self.cpu_start) as f64 / (now - self.window_start) as f64;
        if busy > FRUGAL_BUSY {
            self.frugal = true;
        } else if busy < FRUGAL_BUSY / 2.0 {
            self.frugal = false;
        }
        if self.wanted {
            if self.on && busy > RT_MAX_BUSY {
                self.set(false);
            } else if !self.on && busy < RT_MAX_BUSY / 2.0 {
                self.set(true);
            }
        }
        self.window_start = now;
        self.cpu_start = cpu;
    }
}

fn two_mut<T>(v: &mut [T], a: usize, b: usize) -> (&mut T, &mut T) {
    debug_assert_ne!(a, b);
    if a < b {
        let (lo, hi) = v.split_at_mut(b);
        (&mut lo[a], &mut hi[0])
    } else {
        let (lo, hi) = v.split_at_mut(a);
        (&mut hi[0], &mut lo[b])
    }
}
