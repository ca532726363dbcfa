//! The ipsan iSCSI target: a tokio runtime over the sans-IO protocol crates.
//!
//! # Layout
//! - [`config`]: the TOML file and command-line settings, validated up front.
//! - [`limits`]: CHAP failure backoff, sessions per initiator, connections per address (pure).
//! - [`registry`]: targets, LUNs, ACLs, and the logged-in sessions (TSIH, reinstatement);
//!   live changes applied atomically ([`registry::Registry::apply`]).
//! - [`control`]: the control socket (`ipsan ctl`): line-delimited JSON over a root-only
//!   Unix socket.
//! - [`metrics`]: per-target, per-LUN and per-session counters and the Prometheus text
//!   exposition (`--metrics`).
//! - [`server`]: listeners, the accept loop, connection limits and graceful shutdown.
//! - `conn`: one connection — login, then full feature phase (commands, R2T, Data-In, task
//!   management, text, logout, keepalive).
//! - [`task`]: the data-out bookkeeping of one write (immediate, unsolicited, R2T bursts), pure.

pub mod config;
mod conn;
pub mod control;
pub mod limits;
pub mod metrics;
pub mod registry;
mod seal_ext;
pub mod server;
pub mod task;

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
