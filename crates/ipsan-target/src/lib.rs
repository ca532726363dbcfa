//! The ipsan iSCSI target: a tokio runtime over the sans-IO protocol crates.
//!
//! # Layout
//! - [`config`]: the TOML file and command-line settings, validated up front (`config/`: the
//!   file form, its conversion section by section, the command-line flags).
//! - [`exposure`]: a listener beyond loopback authenticates: the check at start and on
//!   every live change.
//! - [`limits`]: CHAP failure backoff, sessions per initiator, connections per address (pure).
//! - [`registry`]: targets, LUNs, ACLs, and the logged-in sessions (TSIH, reinstatement);
//!   live changes applied atomically ([`registry::Registry::apply`]; `registry/`: building a
//!   target, the login directory, live changes one function per kind of change).
//! - [`control`]: the control socket (`ipsan ctl`): line-delimited JSON over a root-only
//!   Unix socket.
//! - [`metrics`]: per-target, per-LUN and per-session counters and the Prometheus text
//!   format; no dependency on the registry that holds them.
//! - [`scrape`]: the whole target's exposition from the [`registry`] and the HTTP endpoint
//!   (`--metrics`).
//! - [`remote`]: remote iSCSI LUNs, a gateway's pass-through (docs/gateway.md): one remote
//!   session per host session, through ipsan's initiator, commands forwarded unchanged.
//! - [`server`]: listeners, the accept loop, connection limits and graceful shutdown.
//! - `conn`: one connection — the login phase, then the tokio driver of the full feature phase:
//!   one framed read into `iscsi_proto::engine::target`, one writer draining its PDUs, and
//!   `execute`, where commands reach the logical units (Seal opens and seals there). The
//!   protocol itself (CmdSN window, R2T, Data-In, residuals, task management, text, logout,
//!   keepalive) lives in the engine.

pub mod config;
mod conn;
pub mod control;
pub mod exposure;
pub mod limits;
pub mod metrics;
pub mod registry;
pub mod remote;
pub mod scrape;
mod seal_ext;
pub mod server;

pub use config::Config;

/// Locks a mutex, carrying on past poisoning: the state these mutexes guard stays consistent
/// across a panicking holder (tables and counters updated in one step), and one failed task
/// must not take the whole target down.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Read-locks an `RwLock`, carrying on past poisoning (as [`lock`]).
pub(crate) fn read<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockReadGuard<'_, T> {
    m.read().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Write-locks an `RwLock`, carrying on past poisoning (as [`lock`]).
pub(crate) fn write<T>(m: &std::sync::RwLock<T>) -> std::sync::RwLockWriteGuard<'_, T> {
    m.write().unwrap_or_else(std::sync::PoisonError::into_inner)
}

pub use server::{Server, ServerHandle};
