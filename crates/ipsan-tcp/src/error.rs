//! Errors from applying settings, reading socket state, and managing the BPF congestion controls.

use std::io;

/// Everything that can go wrong in this crate. Messages name the setting and what to do.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TcpError {
    /// A value in a configuration could not be parsed (`tcp.sndbuf = "lots"`).
    #[error("invalid {what} {value:?}: {reason}")]
    InvalidSetting {
        what: &'static str,
        value: String,
        reason: String,
    },
    /// The kernel does not offer the requested congestion control.
    #[error("congestion control {name:?} is not available (the kernel offers: {available}){hint}")]
    CongestionUnavailable {
        name: String,
        available: String,
        hint: &'static str,
    },
    /// A socket option call failed.
    #[error("{op} failed")]
    Socket {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    /// BPF congestion controls cannot be loaded here; the reason says why (not root, no BTF,
    /// not built, no bpftool). The built-in algorithms remain usable.
    #[error("BPF congestion controls unavailable: {0}")]
    BpfUnavailable(String),
    /// A bpftool or mount step failed while loading or unloading.
    #[error("{step} failed: {detail}")]
    Bpf { step: String, detail: String },
    /// Reading a /proc or /sys file failed.
    #[error("reading {path}")]
    Proc {
        path: &'static str,
        #[source]
        source: io::Error,
    },
}
