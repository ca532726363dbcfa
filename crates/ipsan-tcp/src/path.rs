//! Long paths: what a connected socket gets when its handshake says the far end is across a
//! WAN ([`tune_for_path`]), on both ends of a connection (the initiator after `connect`, the
//! target at `accept`): the kernel paces it, and its send buffer is as large as the host lets
//! a socket option make it ([`SendBuffer`]).
//!
//! Issue 28's sweep (docs/results/mcs-sweep-6, -7): one sealed connection at 1 Gbit/s and
//! 32 ms one way lost packets at the emulator's 1000-packet queue in slow start and spent the
//! rest of the run regrowing its window, where `iperf3 -P 1` (the same 4 MiB autotuned send
//! buffer) lost none. ipsan's socket always held unsent data, so it was limited by its
//! congestion window, and slow start sent two segments per acknowledged one at line rate: the
//! bottleneck's queue grows by about the previous round's window, and a 1000-packet queue
//! overflows near a 2,000-segment window whatever the bandwidth-delay product. (iperf3's
//! stream was limited by its send buffer instead, one segment per acknowledged one.) Paced
//! (`SO_MAX_PACING_RATE`, [`crate::pace`]), each window leaves spread over the round trip at
//! twice cwnd/RTT in slow start: no overflow below the link's rate, and past it the send
//! buffer binds first. Both ends: the target sends a read's data.
//!
//! Pacing has a price when the send buffer binds (docs/results/mcs-sweep-8): after slow start
//! the kernel paces at 1.2 × cwnd/RTT, and cubic grows cwnd only while the window, not the
//! buffer, limits the connection. A connection limited by its autotuned 4 MiB buffer keeps the
//! cwnd it left slow start (or its last loss) with, so every refill of the buffer leaves at
//! that rate, waits in the socket unsent meanwhile and takes the buffer's room from data in
//! flight: 2.7–2.9 MB in flight against 3.05 for `iperf3 -P 1`, whose refills leave at line
//! rate, and at a cwnd of 2,181 segments (59 MB/s of pacing) the connection ran at 42 MB/s.
//! With a buffer larger than the autotuning ceiling the window binds again, cubic grows it, and
//! the pacing rate with it ([`SendBuffer::Path`]).
//!
//! That buffer is one connection's. The connections of one session share the path, and each
//! with the whole of it kept the rest queued unsent (two sealed connections at 1 Gbit/s, 32 ms:
//! 5.7–10.2 MB, docs/results/mcs-sweep-8), where their windows together were no larger than
//! one's: the bottleneck's queue, not the buffer, bounds them. [`share_send_buffer`] splits the
//! buffer across them as they join and leave, each keeping at least the autotuning ceiling
//! (what each stream of `iperf3 -P N` gets); on this VM 8 MiB for one, 4 MiB each for two or
//! more. Two connections then queued 1.3–2.4 MB unsent instead of 5.3–9.7, as `iperf3 -P 2`
//! does, at the same rate (quiet, docs/results/mcs-sweep-9).
//!
//! Not applied below [`LONG_PATH_RTT`]: on loopback and a LAN a window is microseconds of data
//! and pacing's timers would be cost with no gain.

use std::os::fd::AsFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use crate::{TcpError, TcpSettings};

/// A connection whose handshake round trip is at least this long is a long path (a WAN):
/// loopback measures tens of microseconds, a LAN well under a millisecond; `ipsan wan` at
/// 1 ms one way 2.2 ms.
pub const LONG_PATH_RTT: Duration = Duration::from_millis(2);

/// Whether [`tune_for_path`] may size a long path's send buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SendBuffer {
    /// As large as a plain `SO_SNDBUF` can make it (`net.core.wmem_max`, which the kernel
    /// doubles), where that is above the autotuning ceiling (`net.ipv4.tcp_wmem`'s maximum);
    /// left to autotuning otherwise (a fixed buffer below the ceiling would only shrink it).
    /// Fixing it turns the socket's send buffer autotuning off (`tcp(7)`): it is this size
    /// from the start, filled only as far as the connection has data queued.
    Path,
    /// Left as the caller set it (its own `sndbuf`).
    Keep,
}

impl SendBuffer {
    /// [`SendBuffer::Keep`] where `settings` choose the send buffer themselves (`sndbuf` a
    /// size, or `auto` with a known link), [`SendBuffer::Path`] otherwise.
    pub fn unless_set(settings: Option<&TcpSettings>) -> Self {
        match settings {
            Some(t) if t.sndbuf.bytes_for(t.link.as_ref()).is_some() => SendBuffer::Keep,
            _ => SendBuffer::Path,
        }
    }
}

/// What [`tune_for_path`] found and did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PathTuning {
    /// The round trip it judged by (`TCP_INFO`'s lowest RTT, or the smoothed one while
    /// there is no lowest yet).
    pub rtt: Duration,
    /// At or past [`LONG_PATH_RTT`].
    pub long: bool,
    /// Paced by the kernel ([`crate::pace`]); only on a long path.
    pub paced: bool,
    /// The send buffer it fixed, bytes, as the kernel reports it (twice the request); `None`
    /// where it left the buffer alone ([`SendBuffer`]).
    pub sndbuf: Option<u64>,
}

/// Reads the connected socket's round trip (from the handshake on: the SYN and SYN-ACK on
/// the connecting side, the SYN-ACK and its ACK on the accepting side) and, on a long path
/// (at least [`LONG_PATH_RTT`]), has the kernel pace it and, with [`SendBuffer::Path`], sizes
/// its send buffer. A refused socket option leaves the socket as it was (`paced` and `sndbuf`
/// say what took); only an unreadable `TCP_INFO` is an error.
pub fn tune_for_path<S: AsFd>(socket: &S, buffer: SendBuffer) -> Result<PathTuning, TcpError> {
    let info = crate::tcp_info(socket)?;
    let rtt = path_rtt(info.min_rtt_us, info.rtt_us);
    let long = rtt >= LONG_PATH_RTT;
    let paced = long && crate::pace(socket).is_ok();
    let sndbuf = match buffer {
        SendBuffer::Path if long => host_send_buffer_limits()
            .and_then(|(wmem_max, tcp_wmem_max)| long_path_send_buffer(wmem_max, tcp_wmem_max))
            .and_then(|ask| {
                let sock = socket2::SockRef::from(socket);
                sock.set_send_buffer_size(usize::try_from(ask).ok()?).ok()?;
                sock.send_buffer_size().ok().map(|n| n as u64)
            }),
        _ => None,
    };
    Ok(PathTuning {
        rtt,
        long,
        paced,
        sndbuf,
    })
}

/// Sizes the send buffer of one of `connections` connections that share a long path (the
/// connections of one iSCSI session, issue 28) to its part of the path's send budget: the
/// buffer [`SendBuffer::Path`] gives one connection, split evenly, but never below the
/// autotuning ceiling (`net.ipv4.tcp_wmem`'s maximum, what each connection of `iperf3 -P N`
/// gets). Call it on every connection of the session when one is added or lost, and only on
/// sockets [`tune_for_path`] sized (not where the settings chose a buffer): it judges the path
/// again by the socket's round trip, and leaves a short path alone (`Ok(None)`), as it does a
/// host whose `wmem_max` is below the autotuning ceiling.
///
/// Why (docs/results/mcs-sweep-8, -9): one connection needs the whole buffer to keep its window
/// open on a long path, but the windows of a session's connections together stay near one
/// connection's (the bottleneck's queue bounds them), so with the whole buffer each kept MBs
/// unsent behind its window: two sealed connections at 1 Gbit/s, 32 ms, 5.9–6.6 MB (writes)
/// and 9.7–10.2 MB (reads) against 1.9–2.9 MB with their shares, with as much in flight.
pub fn share_send_buffer<S: AsFd>(socket: &S, connections: usize) -> Result<Option<u64>, TcpError> {
    let info = crate::tcp_info(socket)?;
    if path_rtt(info.min_rtt_us, info.rtt_us) < LONG_PATH_RTT {
        return Ok(None);
    }
    let Some(ask) = host_send_buffer_limits().and_then(|(wmem_max, tcp_wmem_max)| {
        shared_send_buffer(wmem_max, tcp_wmem_max, connections)
    }) else {
        return Ok(None);
    };
    let sock = socket2::SockRef::from(socket);
    let ask = usize::try_from(ask).map_err(|_| TcpError::InvalidSetting {
        what: "sndbuf",
        value: ask.to_string(),
        reason: "too large".into(),
    })?;
    sock.set_send_buffer_size(ask)
        .map_err(|source| TcpError::Socket {
            op: "setsockopt(SO_SNDBUF)",
            source,
        })?;
    let got = sock.send_buffer_size().map_err(|source| TcpError::Socket {
        op: "getsockopt(SO_SNDBUF)",
        source,
    })?;
    Ok(Some(got as u64))
}

/// How many connections a session's long-path send buffer was last split across, which
/// decides when to split it again ([`SendShare::split`]); each end of a session of several
/// connections keeps one. It starts at 1: the first socket was sized for the whole path.
#[derive(Debug)]
pub struct SendShare(AtomicUsize);

impl Default for SendShare {
    fn default() -> Self {
        Self(AtomicUsize::new(1))
    }
}

impl SendShare {
    /// Splits the path's buffer across `sockets`, the session's open connections sized for a
    /// long path ([`share_send_buffer`] on each), when their number changed since the last
    /// split or one was `added` to several (a new socket comes with the whole buffer). Returns
    /// how many it split across, `None` when nothing was to be done.
    pub fn split<S: AsFd>(&self, sockets: &[S], added: bool) -> Option<usize> {
        let n = sockets.len();
        let before = self.0.load(Ordering::Relaxed);
        if n == 0 || (n == before && (!added || n == 1)) {
            return None;
        }
        self.0.store(n, Ordering::Relaxed);
        for s in sockets {
            match share_send_buffer(s, n) {
                Ok(Some(b)) => tracing::debug!(connections = n, sndbuf = b, "send buffer shared"),
                Ok(None) => {}
                Err(e) => tracing::debug!("send buffer not shared: {e}"),
            }
        }
        Some(n)
    }
}

/// The `SO_SNDBUF` request of one of `connections` connections sharing a long path
/// ([`share_send_buffer`]): [`long_path_send_buffer`]'s request split evenly, at least half
/// the autotuning ceiling `tcp_wmem_max` (the kernel doubles the request); `None` where the
/// one connection's buffer is left to autotuning.
fn shared_send_buffer(wmem_max: u64, tcp_wmem_max: u64, connections: usize) -> Option<u64> {
    let whole = long_path_send_buffer(wmem_max, tcp_wmem_max)?;
    let n = u64::try_from(connections.max(1)).unwrap_or(u64::MAX);
    Some((whole / n).max(tcp_wmem_max.div_ceil(2)).min(whole))
}

/// The `SO_SNDBUF` request for a long path: `net.core.wmem_max` (the most a plain request
/// gets; the kernel doubles it), where twice that is above the autotuning ceiling
/// `tcp_wmem_max`; `None` (autotuning) otherwise.
fn long_path_send_buffer(wmem_max: u64, tcp_wmem_max: u64) -> Option<u64> {
    // The kernel stores the doubled request in an int.
    let ask = wmem_max.min(i32::MAX as u64 / 2);
    (ask > 0 && ask * 2 > tcp_wmem_max).then_some(ask)
}

/// `net.core.wmem_max` and the maximum of `net.ipv4.tcp_wmem`, as this network namespace
/// has them; `None` if either cannot be read.
fn host_send_buffer_limits() -> Option<(u64, u64)> {
    let wmem_max = std::fs::read_to_string("/proc/sys/net/core/wmem_max").ok()?;
    let tcp_wmem = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_wmem").ok()?;
    Some((
        wmem_max.trim().parse().ok()?,
        tcp_wmem.split_whitespace().nth(2)?.parse().ok()?,
    ))
}

/// The round trip a connection is judged by: `TCP_INFO`'s lowest RTT, or its smoothed RTT
/// while there is no lowest (0, or `~0U` before the first sample).
fn path_rtt(min_rtt_us: u32, rtt_us: u32) -> Duration {
    let us = if min_rtt_us > 0 && min_rtt_us != u32::MAX {
        min_rtt_us
    } else {
        rtt_us
    };
    Duration::from_micros(u64::from(us))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Loopback is not a long path: nothing is set.
    #[test]
    fn leaves_a_loopback_connection_alone() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        for sock in [&c, &s] {
            let before = socket2::SockRef::from(sock).send_buffer_size().unwrap();
            let t = tune_for_path(sock, SendBuffer::Path).unwrap();
            assert!(t.rtt < LONG_PATH_RTT, "{t:?}");
            assert!(!t.long && !t.paced && t.sndbuf.is_none(), "{t:?}");
            assert_eq!(crate::max_pacing_rate(sock).unwrap(), u64::MAX, "unlimited");
            let after = socket2::SockRef::from(sock).send_buffer_size().unwrap();
            assert_eq!(before, after, "the send buffer is left to autotuning");
        }
    }

    #[test]
    fn sizes_the_send_buffer_only_past_the_autotuning_ceiling() {
        // This VM: wmem_max 4 MiB, tcp_wmem max 4 MiB: 8 MiB fixed beats 4 MiB autotuned.
        assert_eq!(long_path_send_buffer(4 << 20, 4 << 20), Some(4 << 20));
        // A distribution's defaults: 208 KiB fixed would cut the 4 MiB autotuning gives.
        assert_eq!(long_path_send_buffer(212_992, 4 << 20), None);
        // Exactly the ceiling twice over gains nothing.
        assert_eq!(long_path_send_buffer(2 << 20, 4 << 20), None);
        assert_eq!(long_path_send_buffer(0, 0), None);
        // The kernel's int: at most i32::MAX / 2 requested.
        assert_eq!(
            long_path_send_buffer(u64::MAX, 4 << 20),
            Some(i32::MAX as u64 / 2)
        );
    }

    #[test]
    fn splits_the_send_buffer_across_connections_down_to_the_autotuning_ceiling() {
        // This VM: one connection 8 MiB (4 MiB asked); two or more the ceiling, 4 MiB.
        for n in [0, 1] {
            assert_eq!(shared_send_buffer(4 << 20, 4 << 20, n), Some(4 << 20));
        }
        for n in [2, 4, 8, usize::MAX] {
            assert_eq!(
                shared_send_buffer(4 << 20, 4 << 20, n),
                Some(2 << 20),
                "{n}"
            );
        }
        // A host with a 16 MiB wmem_max: 32, 16, 8, then the 4 MiB ceiling.
        assert_eq!(shared_send_buffer(16 << 20, 4 << 20, 1), Some(16 << 20));
        assert_eq!(shared_send_buffer(16 << 20, 4 << 20, 2), Some(8 << 20));
        assert_eq!(shared_send_buffer(16 << 20, 4 << 20, 4), Some(4 << 20));
        assert_eq!(shared_send_buffer(16 << 20, 4 << 20, 8), Some(2 << 20));
        assert_eq!(shared_send_buffer(16 << 20, 4 << 20, 16), Some(2 << 20));
        // Where one connection's buffer is autotuned, so is every connection's.
        assert_eq!(shared_send_buffer(212_992, 4 << 20, 2), None);
        // An odd ceiling rounds up, never below it.
        assert_eq!(
            shared_send_buffer(4 << 20, (4 << 20) + 1, 8),
            Some((2 << 20) + 1)
        );
    }

    /// A short path is left alone, whatever the count.
    #[test]
    fn shares_nothing_on_loopback() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let before = socket2::SockRef::from(&c).send_buffer_size().unwrap();
        assert_eq!(share_send_buffer(&c, 2).unwrap(), None);
        assert_eq!(
            socket2::SockRef::from(&c).send_buffer_size().unwrap(),
            before
        );
    }

    #[test]
    fn keeps_a_send_buffer_the_settings_choose() {
        assert_eq!(SendBuffer::unless_set(None), SendBuffer::Path);
        let mut t = TcpSettings::default();
        assert_eq!(SendBuffer::unless_set(Some(&t)), SendBuffer::Path);
        t.sndbuf = crate::BufSize::Bytes(1 << 20);
        assert_eq!(SendBuffer::unless_set(Some(&t)), SendBuffer::Keep);
        // `auto` without a link is the kernel's autotuning: sized here.
        t.sndbuf = crate::BufSize::Auto;
        assert_eq!(SendBuffer::unless_set(Some(&t)), SendBuffer::Path);
        t.link = Some(crate::Link {
            bandwidth_bps: 1_000_000_000,
            rtt: Duration::from_millis(64),
        });
        assert_eq!(SendBuffer::unless_set(Some(&t)), SendBuffer::Keep);
    }

    #[test]
    fn judges_by_the_lowest_round_trip_and_falls_back_to_the_smoothed_one() {
        assert_eq!(path_rtt(64_000, 70_000), Duration::from_millis(64));
        assert_eq!(path_rtt(u32::MAX, 2_200), Duration::from_micros(2_200));
        assert_eq!(path_rtt(0, 0), Duration::ZERO);
        assert!(path_rtt(1_999, 5_000) < LONG_PATH_RTT);
        assert!(path_rtt(2_000, 1_000) >= LONG_PATH_RTT);
    }
}
