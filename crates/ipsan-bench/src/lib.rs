//! ipsan-bench: the engine of `ipsan bench`, a product of its own on top of
//! `ipsan-initiator`: workloads measured the way the papers measure (Aiken et al.: throughput
//! at a fixed queue depth and block size; Kamisaka et al.: CPU utilisation as user+sys over
//! wall), `--depth auto`, the per-command trace and the JSON result schema. The initiator
//! library knows nothing of it: the trace watches a session through the initiator's
//! observer hook (`ipsan_initiator::observe`). The terminal progress display belongs to the
//! CLI (`src/cli/progress.rs`); the lab reads traces through [`trace`].
//!
//! # Layout
//! - [`workload`]: the workload generator and runner ([`run`], [`run_auto`]): `depth` workers
//!   over one session, latency histograms, the `--verify` data pattern, live [`Progress`]
//!   samples, and the size/duration flags (`ipsan-units`).
//! - [`autodepth`]: `--depth auto`, a sans-IO controller that adapts the depth from live
//!   throughput and latency.
//! - [`report`]: the JSON result schema (`ipsan-bench/1`, documented in `docs/bench.md`):
//!   latency, CPU, host, target, workload (with the access pattern's names, [`RwMode`]), and
//!   the trace header for the same run. Below [`workload`], which fills it in.
//! - [`trace`]: the per-command event trace behind `--trace` and the lab's command timeline,
//!   an observer of the session; its JSON-lines file format (`ipsan-trace/1`) and reader.

pub mod autodepth;
pub mod report;
pub mod trace;
pub mod workload;

pub use report::{Report, RwMode, Sink};
pub use workload::{
    parse_duration, parse_size, run, run_auto, run_on, run_on_threads, run_traced, BenchError,
    BlockIo, Limit, Progress, Workload,
};
