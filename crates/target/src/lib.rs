//! The ipsan iSCSI target: a tokio runtime over the sans-IO protocol crates.
//!
//! # Layout
//! - [`config`]: the TOML file and command-line settings, validated up front.
//! - [`registry`]: targets, LUNs, ACLs, and the logged-in sessions (TSIH, reinstatement).
//! - [`server`]: listeners, the accept loop, connection limits and graceful shutdown.
//! - `conn`: one connection — login, then full feature phase (commands, R2T, Data-In, task
//!   management, text, logout, keepalive).
//! - [`task`]: the data-out bookkeeping of one write (immediate, unsolicited, R2T bursts), pure.

pub mod config;
mod conn;
pub mod registry;
mod seal_ext;
pub mod server;
pub mod task;

pub use config::Config;
pub use server::{Server, ServerHandle};
