//! ipsan-wan: a packet-level WAN emulator between two network namespaces.
//!
//! The papers measured iSCSI over Dummynet and the Click router, with the real TCP stacks of
//! both hosts reacting to delay and loss end to end. This kernel has no netem, so ipsan carries
//! its own emulator: two namespaces, each with a TUN interface, joined only through a user-space
//! forwarder that runs every packet through a pipeline of stages.
//!
//! # Layout
//! - [`config`]: what a link is (per-direction [`DirConfig`], link-wide [`LinkConfig`]) and the
//!   parsers for `8ms`, `0.1%`, `100mbit`, `gilbert:P,R`.
//! - [`rng`]: the seeded generator every random choice comes from.
//! - [`pipeline`]: [`Packet`], the [`Stage`] trait and the [`Pipeline`] that chains stages.
//! - [`model`]: [`Impairment`], the pure, clock-injected Dummynet-style stage (loss, queue, rate,
//!   delay, jitter, reorder, corrupt, duplicate), unit-tested on a virtual clock.
//! - [`cut`]: link cuts (scheduled `5s+3s` or `ipsan wan cut`/`restore`), pure like the model.
//! - [`forwarder`]: the thin TUN driver: one thread per direction, deadline heap, precise wait.
//! - [`link`]: [`Link`], the library API (`Link::up`, `set`, `stats`, `exec_in`, Drop = down).
//! - [`netns`]: namespaces through iproute2 and running code inside one.
//! - [`netem`]: the `tc netem` engine for kernels that have it.
//! - [`control`]: the daemon behind `ipsan wan up` and its control socket protocol.
//! - [`proxy`]: the unprivileged TCP-level delay relay (less faithful: it splits TCP).
//! - `sys`: the handful of syscalls (TUN, setns, ppoll, timer slack), each `unsafe` commented.

pub mod config;
pub mod control;
pub mod cut;
pub mod error;
pub mod forwarder;
pub mod link;
pub mod model;
pub mod netem;
pub mod netns;
pub mod pipeline;
pub mod proxy;
pub mod rng;
mod sys;

pub use config::{
    ConfigError, CutWindow, DirConfig, Engine, JitterDist, LinkConfig, LossModel, QueueLimit,
};
pub use error::LinkError;
pub use forwarder::DirStats;
pub use link::{DevStats, ExtraStages, IfStats, Link, LinkStats, Side};
pub use model::Impairment;
pub use pipeline::{DropReason, Nanos, Packet, Pipeline, Stage, Verdict};

/// Puts the calling thread in the `SCHED_FIFO` real-time class at `priority` (1-99). The
/// forwarder does this for itself; measurement threads (RTT probes in tests and the lab) can
/// do the same so that other load on the host does not add scheduling delay to what they
/// measure.
pub fn set_thread_realtime(priority: i32) -> std::io::Result<()> {
    sys::set_realtime(priority)
}
