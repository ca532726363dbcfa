//! Long paths: what a connected socket gets when its handshake says the far end is across a
//! WAN ([`tune_for_path`]), on both ends of a connection (the initiator after `connect`, the
//! target at `accept`): the kernel paces it.
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
//! Not applied below [`LONG_PATH_RTT`]: on loopback and a LAN a window is microseconds of data
//! and pacing's timers would be cost with no gain.

use std::os::fd::AsFd;
use std::time::Duration;

use crate::TcpError;

/// A connection whose handshake round trip is at least this long is a long path (a WAN):
/// loopback measures tens of microseconds, a LAN well under a millisecond; `ipsan wan` at
/// 1 ms one way 2.2 ms.
pub const LONG_PATH_RTT: Duration = Duration::from_millis(2);

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
}

/// Reads the connected socket's round trip (from the handshake on: the SYN and SYN-ACK on
/// the connecting side, the SYN-ACK and its ACK on the accepting side) and, on a long path
/// (at least [`LONG_PATH_RTT`]), has the kernel pace it. A refused socket option leaves the
/// socket as it was (`paced` says whether it took); only an unreadable `TCP_INFO` is an error.
pub fn tune_for_path<S: AsFd>(socket: &S) -> Result<PathTuning, TcpError> {
    let info = crate::tcp_info(socket)?;
    let rtt = path_rtt(info.min_rtt_us, info.rtt_us);
    let long = rtt >= LONG_PATH_RTT;
    let paced = long && crate::pace(socket).is_ok();
    Ok(PathTuning { rtt, long, paced })
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
            let t = tune_for_path(sock).unwrap();
            assert!(t.rtt < LONG_PATH_RTT, "{t:?}");
            assert!(!t.long && !t.paced, "{t:?}");
            assert_eq!(crate::max_pacing_rate(sock).unwrap(), u64::MAX, "unlimited");
        }
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
