//! The packet path as a pipeline of stages.
//!
//! A [`Packet`] enters with `release_at = now`; each [`Stage`] may rewrite its bytes (within
//! the buffer's capacity), push its release time later, mark it, or drop it. The forwarder
//! only runs the pipeline and honours the release times, so a new stage (the lab's per-packet
//! ESP emulation, say) plugs in without touching the forwarder.
//!
//! Stages are sans-IO and clock-injected: time is a [`Nanos`] passed in, never read.

use crate::config::DirConfig;

/// Nanoseconds on the emulator's clock (virtual in tests, `CLOCK_MONOTONIC` in the forwarder).
pub type Nanos = u64;

/// One packet and what the stages decided about it so far.
#[derive(Debug)]
pub struct Packet {
    buf: Vec<u8>,
    len: usize,
    /// When the packet entered the emulator.
    pub arrived_at: Nanos,
    /// When the packet leaves the emulator (stages only move this later).
    pub release_at: Nanos,
    /// Set by a stage that held the packet back behind later ones.
    pub reordered: bool,
    /// Set by a stage that damaged the packet on purpose.
    pub corrupted: bool,
    /// Set by a stage that wants a second copy delivered right after this one.
    pub duplicate: bool,
}

impl Packet {
    /// An empty packet over a zeroed buffer of `capacity` bytes (allocated once, then reused).
    pub fn with_capacity(capacity: usize) -> Self {
        Self {
            buf: vec![0; capacity],
            len: 0,
            arrived_at: 0,
            release_at: 0,
            reordered: false,
            corrupted: false,
            duplicate: false,
        }
    }

    /// A packet holding a copy of `data` (for tests and tools; the forwarder reuses buffers).
    pub fn from_slice(data: &[u8], capacity: usize) -> Self {
        let mut p = Self::with_capacity(capacity.max(data.len()));
        p.buf[..data.len()].copy_from_slice(data);
        p.len = data.len();
        p
    }

    /// Clears the marks and sets the arrival time before reuse.
    pub fn reset(&mut self, now: Nanos) {
        self.arrived_at = now;
        self.release_at = now;
        self.reordered = false;
        self.corrupted = false;
        self.duplicate = false;
    }

    /// The packet's bytes.
    pub fn data(&self) -> &[u8] {
        &self.buf[..self.len]
    }

    /// The packet's bytes, writable.
    pub fn data_mut(&mut self) -> &mut [u8] {
        &mut self.buf[..self.len]
    }

    /// The whole buffer, for reading a packet into; follow with [`Packet::set_len`].
    pub fn buffer_mut(&mut self) -> &mut [u8] {
        &mut self.buf
    }

    /// Packet length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// `true` for a zero-length packet.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Buffer capacity: the longest packet this buffer can hold.
    pub fn capacity(&self) -> usize {
        self.buf.len()
    }

    /// Sets the length (clamped to the capacity); a stage that grows a packet (encapsulation)
    /// writes the new bytes through [`Packet::buffer_mut`] first.
    pub fn set_len(&mut self, len: usize) {
        self.len = len.min(self.buf.len());
    }

    /// Copies `other`'s bytes and release time into `self` (for duplicates).
    pub fn copy_from(&mut self, other: &Packet) {
        let n = other.len.min(self.buf.len());
        self.buf[..n].copy_from_slice(&other.buf[..n]);
        self.len = n;
        self.arrived_at = other.arrived_at;
        self.release_at = other.release_at;
        self.reordered = other.reordered;
        self.corrupted = other.corrupted;
        self.duplicate = false;
    }
}

/// Why a packet was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DropReason {
    /// The loss model chose it.
    Loss,
    /// The bottleneck queue was full (tail drop).
    Queue,
    /// Some other stage rejected it (malformed for that stage, say).
    Stage,
}

/// A stage's decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Keep going down the pipeline.
    Pass,
    /// Drop the packet.
    Drop(DropReason),
}

/// One step of the packet path.
pub trait Stage: Send + std::fmt::Debug {
    /// A short name for logs and stats.
    fn name(&self) -> &'static str;
    /// Handles one packet arriving at `now`.
    fn process(&mut self, now: Nanos, pkt: &mut Packet) -> Verdict;
    /// Takes new impairment settings on a running link (`ipsan wan set`); most stages ignore it.
    fn reconfigure(&mut self, _cfg: &DirConfig) {}
    /// The one-way latency the path adds outside the pipeline (TUN hops, wake-ups), which a
    /// delaying stage subtracts from its delay so that the delay is what the hosts see.
    fn set_path_latency(&mut self, _ns: Nanos) {}
    /// Packets this stage holds in a queue right now (for `stats`).
    fn queue_len(&self, _now: Nanos) -> usize {
        0
    }
}

/// Stages run in order; the first drop ends the packet's trip.
#[derive(Debug, Default)]
pub struct Pipeline {
    stages: Vec<Box<dyn Stage>>,
}

impl Pipeline {
    /// An empty pipeline (forwards everything at once).
    pub fn new() -> Self {
        Self::default()
    }

    /// Appends a stage.
    pub fn push(&mut self, stage: Box<dyn Stage>) {
        self.stages.push(stage);
    }

    /// Appends a stage, builder style.
    pub fn with(mut self, stage: Box<dyn Stage>) -> Self {
        self.push(stage);
        self
    }

    /// Runs the packet through every stage.
    pub fn process(&mut self, now: Nanos, pkt: &mut Packet) -> Verdict {
        pkt.reset(now);
        for s in &mut self.stages {
            if let v @ Verdict::Drop(_) = s.process(now, pkt) {
                return v;
            }
        }
        Verdict::Pass
    }

    /// Hands new settings to every stage.
    pub fn reconfigure(&mut self, cfg: &DirConfig) {
        for s in &mut self.stages {
            s.reconfigure(cfg);
        }
    }

    /// Tells every stage the path's own one-way latency ([`Stage::set_path_latency`]).
    pub fn set_path_latency(&mut self, ns: Nanos) {
        for s in &mut self.stages {
            s.set_path_latency(ns);
        }
    }

    /// Packets queued inside the stages.
    pub fn queue_len(&self, now: Nanos) -> usize {
        self.stages.iter().map(|s| s.queue_len(now)).sum()
    }

    /// The stage names, in order.
    pub fn names(&self) -> Vec<&'static str> {
        self.stages.iter().map(|s| s.name()).collect()
    }
}
