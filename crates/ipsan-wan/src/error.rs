//! Errors of bringing up, changing and tearing down a link.

use crate::config::ConfigError;

/// What went wrong with a link.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LinkError {
    /// A setting is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// Namespaces and TUN devices need root (CAP_NET_ADMIN and CAP_SYS_ADMIN).
    #[error("the WAN emulator needs root to create namespaces and TUN devices")]
    NotRoot,
    /// A link with this name already exists.
    #[error("link {0:?} already exists (namespace {0}-ini or {0}-tgt is present); run `ipsan wan down --name {0}` first")]
    Exists(String),
    /// No link with this name is running.
    #[error("no running link named {0:?} (start one with `ipsan wan up`)")]
    NotRunning(String),
    /// An external command (`ip`, `tc`) failed.
    #[error("`{cmd}` failed: {stderr}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its standard error.
        stderr: String,
    },
    /// A system call failed.
    #[error("{op}: {source}")]
    Io {
        /// What we were doing.
        op: String,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `--engine netem` was asked for but the kernel has no netem qdisc.
    #[error("tc netem is not available on this kernel ({0}); use --engine builtin (or auto)")]
    NetemUnavailable(String),
    /// The link came up but did not pass traffic, or a namespace helper failed.
    #[error("link check failed: {0}")]
    Probe(String),
    /// The control socket answered with an error or garbage.
    #[error("control: {0}")]
    Control(String),
}

impl LinkError {
    /// Wraps an I/O error with what we were doing.
    pub fn io(op: impl Into<String>, source: std::io::Error) -> Self {
        LinkError::Io {
            op: op.into(),
            source,
        }
    }
}
