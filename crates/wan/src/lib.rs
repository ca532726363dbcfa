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

pub mod config;
pub mod model;
pub mod pipeline;
pub mod rng;

pub use config::{ConfigError, DirConfig, Engine, JitterDist, LinkConfig, LossModel, QueueLimit};
pub use model::Impairment;
pub use pipeline::{DropReason, Nanos, Packet, Pipeline, Stage, Verdict};
