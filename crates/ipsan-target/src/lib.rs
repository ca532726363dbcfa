//! The ipsan iSCSI target: a tokio runtime over the sans-IO protocol crates.
//!
//! # Layout
//! - [`config`]: the TOML file and command-line settings, validated up front.
//! - [`limits`]: CHAP failure backoff, sessions per initiator, connections per address (pure).
//! - [`registry`]: targets, LUNs, ACLs, and the logged-in sessions (TSIH, reinstatement).
//! - [`server`]: listeners, the accept loop, connection limits and graceful shutdown.
//! - `conn`: one connection — the login phase, then the tokio driver of the full feature phase:
//!   one framed read into `iscsi_proto::engine::target`, one writer draining its PDUs, and
//!   `execute`, where commands reach the logical units (Seal opens and seals there). The
//!   protocol itself (CmdSN window, R2T, Data-In, residuals, task management, text, logout,
//!   keepalive) lives in the engine.

pub mod config;
mod conn;
pub mod limits;
pub mod registry;
mod seal_ext;
pub mod server;

pub use config::Config;

/// Locks a mutex, carrying on past poisoning: the state these mutexes guard stays consistent
/// across a panicking holder (tables and counters updated in one step), and one failed task
/// must not take the whole target down.
pub(crate) fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}
pub use server::{Server, ServerHandle};
