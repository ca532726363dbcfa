//! ipsan-tcp: storage-friendly TCP for ipsan's WAN leg.
//!
//! The iFCP paper (Muknahallipatna et al., *Experimental and Theoretical Analysis of Storage
//! Friendly TCP Performance in Distributed Storage Area Network*) shows that on a long, lossy
//! link the TCP stack sets the ceiling: throughput is
//! capped at window/RTT (its Table 1) and Reno's halving on every loss costs most of the link
//! (its Fig. 10). This crate gives ipsan's runtimes the kernel knobs to act on that, per socket.
//!
//! # Layout
//! - [`settings`]: [`TcpSettings`] (congestion control, send/receive buffers, `TCP_NODELAY`),
//!   applied to any socket with [`TcpSettings::apply`] and read back as [`InForce`].
//! - [`info`]: [`tcp_info`] takes a serde-serializable [`TcpInfoSnapshot`] from `TCP_INFO`
//!   (cwnd, ssthresh, RTT, retransmits, delivery rate) for bench and lab results.
//! - [`bpf`]: registers and removes the storage-friendly congestion controls `ipsan_sf`,
//!   `ipsan_sf_ss` and `ipsan_ss` (BPF `struct_ops` `tcp_congestion_ops`, source in
//!   `bpf/ipsan_sf.bpf.c`, built by `build.rs`), and lists what the kernel offers
//!   ([`available_congestion_controls`]); [`settings`] selects them per socket.
//! - [`bulk`]: a bulk sender and sink that report throughput with the settings and `TCP_INFO`
//!   behind it (the iFCP paper's experiments), and Jain's fairness index.
//! - [`path`]: [`tune_for_path`], what a connected socket gets when its handshake's round
//!   trip says it crosses a WAN (kernel pacing, a send buffer past the autotuning ceiling),
//!   on both ends, and [`share_send_buffer`], that buffer split across a session's
//!   connections.
//! - [`error`]: the crate's one error type, [`TcpError`].
//!
//! Everything here is a thin, synchronous layer over socket options; it works on std and tokio
//! sockets alike (anything that is `AsFd`).

use std::os::fd::{AsFd, AsRawFd};

pub mod bpf;
pub mod bulk;
pub mod error;
pub mod info;
pub mod path;
pub mod settings;
mod sys;
pub mod vectored;

pub use bpf::available_congestion_controls;
pub use error::TcpError;
pub use info::{send_progress, tcp_info, SendProgress, TcpInfoSnapshot};
pub use path::{share_send_buffer, tune_for_path, PathTuning, SendBuffer, SendShare};
pub use settings::{BufSize, InForce, Link, TcpSettings};

/// Sets the socket's minimum retransmission timeout (`TCP_RTO_MIN_US`, Linux 6.15; the
/// kernel's default is 200 ms, `net.ipv4.tcp_rto_min_us`). A lone unacknowledged segment (a
/// small request with nothing sent after it, so no duplicate ACK can report its loss) is
/// resent at the RTO (the smoothed RTT plus at least this) or by a tail loss probe (2 × SRTT
/// plus this), whichever comes first. Fails on older kernels (`ENOPROTOOPT`); callers that
/// only gain from it go on without.
pub fn set_rto_min<S: AsFd>(socket: &S, min: std::time::Duration) -> Result<(), TcpError> {
    let us = u32::try_from(min.as_micros()).map_err(|_| TcpError::InvalidSetting {
        what: "minimum RTO",
        value: format!("{min:?}"),
        reason: "too large".into(),
    })?;
    sys::set_rto_min_us(socket.as_fd().as_raw_fd(), us).map_err(|source| TcpError::Socket {
        op: "setsockopt(TCP_RTO_MIN_US)",
        source,
    })
}

/// Makes the kernel pace the socket's sends itself (Linux 4.13+: `SO_MAX_PACING_RATE` set to
/// anything but "unlimited" turns on TCP's internal pacing, here with no cap of its own): each
/// window goes out spread over the round trip at the rate the congestion control sets
/// (twice cwnd/RTT in slow start, 1.2× after) instead of as a burst at line rate whenever the
/// window opens, as BBR's sends always are.
pub fn pace<S: AsFd>(socket: &S) -> Result<(), TcpError> {
    sys::set_max_pacing_rate(socket.as_fd().as_raw_fd(), u64::MAX - 1).map_err(|source| {
        TcpError::Socket {
            op: "setsockopt(SO_MAX_PACING_RATE)",
            source,
        }
    })
}

/// The socket's `SO_MAX_PACING_RATE`, bytes per second: `u64::MAX` is "unlimited" (the
/// kernel's default); anything else means the kernel paces the socket ([`pace`]).
pub fn max_pacing_rate<S: AsFd>(socket: &S) -> Result<u64, TcpError> {
    sys::max_pacing_rate(socket.as_fd().as_raw_fd()).map_err(|source| TcpError::Socket {
        op: "getsockopt(SO_MAX_PACING_RATE)",
        source,
    })
}

/// The socket's minimum retransmission timeout (`TCP_RTO_MIN_US`).
pub fn rto_min<S: AsFd>(socket: &S) -> Result<std::time::Duration, TcpError> {
    let us = sys::rto_min_us(socket.as_fd().as_raw_fd()).map_err(|source| TcpError::Socket {
        op: "getsockopt(TCP_RTO_MIN_US)",
        source,
    })?;
    Ok(std::time::Duration::from_micros(u64::from(us)))
}

/// What a socket has after [`TcpSettings::apply`], and its `TCP_INFO` at that moment: the
/// record bench and lab results carry per connection.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Probe {
    /// Settings read back from the socket.
    pub in_force: InForce,
    /// `TCP_INFO` snapshot.
    pub tcp_info: TcpInfoSnapshot,
}

/// Pretty JSON for any of this crate's reports (so callers need no JSON dependency).
pub fn to_json_pretty<T: serde::Serialize>(value: &T) -> Result<String, TcpError> {
    serde_json::to_string_pretty(value).map_err(|e| TcpError::InvalidSetting {
        what: "JSON output",
        value: String::new(),
        reason: e.to_string(),
    })
}

/// One-line JSON for any of this crate's reports (JSON-lines result files).
pub fn to_json_compact<T: serde::Serialize>(value: &T) -> Result<String, TcpError> {
    serde_json::to_string(value).map_err(|e| TcpError::InvalidSetting {
        what: "JSON output",
        value: String::new(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod rto_min_tests {
    use std::time::Duration;

    #[test]
    fn sets_and_reads_back_the_minimum_rto() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        match super::set_rto_min(&s, Duration::from_millis(20)) {
            Err(crate::TcpError::Socket { source, .. })
                if source.raw_os_error() == Some(libc::ENOPROTOOPT) =>
            {
                eprintln!("skipped: this kernel has no TCP_RTO_MIN_US (Linux < 6.15)");
                return;
            }
            r => r.unwrap(),
        }
        assert_eq!(super::rto_min(&s).unwrap(), Duration::from_millis(20));
        assert!(
            super::tcp_info(&s).unwrap().rto_us >= 20_000,
            "the RTO is at least the minimum"
        );
    }

    #[test]
    fn paces_with_a_cap_that_is_not_unlimited() {
        use std::os::fd::{AsFd, AsRawFd};
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let s = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let fd = s.as_fd().as_raw_fd();
        assert_eq!(
            crate::sys::max_pacing_rate(fd).unwrap(),
            u64::MAX,
            "unlimited"
        );
        super::pace(&s).unwrap();
        // Anything but u64::MAX turns the kernel's own pacing on (sk_pacing_status).
        assert_eq!(crate::sys::max_pacing_rate(fd).unwrap(), u64::MAX - 1);
    }
}
