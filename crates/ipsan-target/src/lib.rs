//! The ipsan iSCSI target: a tokio runtime over the sans-IO protocol crates.
//!
//! # Layout
//! - [`config`]: the TOML file and command-line settings, validated up front (`config/`: the
//!   file form, its conversion section by section, the command-line flags, the `[nvme]` table).
//! - [`exposure`]: a listener beyond loopback authenticates: the check at start and on
//!   every live change.
//! - [`limits`]: CHAP failure backoff, sessions per initiator, connections per address (pure).
//! - [`registry`]: targets, LUNs, ACLs, and the logged-in sessions (TSIH, reinstatement);
//!   live changes applied atomically ([`registry::Registry::apply`]; `registry/`: building a
//!   target, the login directory, live changes one function per kind of change, the session
//!   table (admission by strength, registration, reinstatement, joining logins)).
//! - [`control`]: the control socket (`ipsan ctl`): line-delimited JSON over a root-only
//!   Unix socket (`control/`: the methods, the read-only views and redaction, the client).
//! - [`metrics`]: per-target, per-LUN and per-session counters and the Prometheus text
//!   format; no dependency on the registry that holds them.
//! - [`scrape`]: the whole target's exposition from the [`registry`] and the HTTP endpoint
//!   (`--metrics`).
//! - [`remote`]: remote iSCSI LUNs, a gateway's pass-through (docs/gateway.md): one remote
//!   session per host session, through ipsan's initiator, commands forwarded unchanged.
//! - [`remote_block`]: a remote iSCSI LUN as a block store (`ipsan_block::Backend`, READ/WRITE
//!   through ipsan's initiator), for front ends that do not forward SCSI (NVMe namespaces).
//! - [`server`]: listeners, the accept loop, connection limits and graceful shutdown.
//! - `conn`: one connection, the tokio driver of `iscsi_proto::engine::target`: sockets,
//!   timers and wake-ups. One framed read into the engine and one writer draining its PDUs,
//!   both through `ipsan_transport` (read, verify the Seal record, decode; protect, encode,
//!   vectored write); the session's wake-ups, task management and logout requests. Beside it:
//!   - `conn/login.rs`: the login phase through `iscsi_proto::login::TargetLogin` (relayed
//!     CHAP, a gateway's remote sessions, admission, the authentication-failure backoff);
//!   - `conn/luns.rs`: what the engine asks the driver (`LunDirectory`: which LUNs exist, how
//!     many bytes a CDB needs; `text::Directory`: what SendTargets lists, from the registry).
//!     Sizing is the one parse of a local LU's CDB: its typed command (`ipsan_scsi::CommandInfo`)
//!     travels with the engine's task (`Sizing::decoded`) until the command executes;
//!   - `conn/execute.rs`: one command from the engine's `Execute` to its answer: Seal opens
//!     data-out and seals data-in, the overflow/underflow rules (`engine::residual`) apply
//!     in plaintext bytes, the same for every session and unit; Seal's binding, the WRITE
//!     count field and the metrics kind read the typed command;
//!   - `conn/unit.rs`: the one LU interface the driver calls (`Unit::submit`): an emulated LU
//!     (ipsan-scsi), which executes the typed command without parsing the CDB again, or a
//!     pass-through remote LUN (`remote`), which forwards the CDB unparsed.
//!
//!   The protocol itself (CmdSN window, R2T, Data-In, residuals, task management, text and
//!   SendTargets, login refusals, logout, keepalive) lives in `iscsi-proto`.
//! - [`nvme`]: the NVMe/TCP target beside the iSCSI one (issue 30): the `[nvme]` settings,
//!   the listeners and one driver per connection around `nvme_proto`'s queue machine and
//!   controller, the registry's LUNs as namespaces on their `ipsan-block` backends.
//! - `seal_ext`: Seal's login extension (the offer, the transcript it binds, the guess limit).
//!
//! Imports between these modules run one way (`tests/layers.rs` fails on a circle): at the
//! bottom those that import none of the others (`limits`, `metrics`, `remote`, `remote_block`),
//! then `config`, `exposure`, the `registry` (which holds a session's connection state and the
//! NVMe side without naming their types: `SessionCore`, `NvmeSide`), `accept`, `seal_ext`,
//! `conn`, `nvme`, `scrape`, `control`, and `server` at the top.

mod accept;
pub mod config;
mod conn;
pub mod control;
pub mod exposure;
pub mod limits;
pub mod metrics;
pub mod nvme;
pub mod registry;
pub mod remote;
pub mod remote_block;
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
