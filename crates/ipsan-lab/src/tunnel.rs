//! Waiting for a tunnel between the lab's namespaces (WireGuard) to carry TCP, sized to the
//! link's round trip instead of a fixed few seconds.
//!
//! wireguard-go sends its first handshake initiation when the first packet wants to cross,
//! and when no response comes it sends the next only after `REKEY_TIMEOUT` (5 s) plus up to
//! 333 ms of jitter (WireGuard paper §6.1, wireguard-go `device/constants.go`). One lost or
//! unanswered initiation (a peer still starting on a busy 2-core host, a packet dropped in
//! front of a not yet raised UDP buffer) therefore costs more than 5 s before any TCP can
//! pass. The lab once waited 8 s in total with 1 s connect attempts: one run in 50 of the
//! quick plan on a fresh machine failed at 64 ms one way with "no TCP through the WireGuard
//! tunnel: connection timed out". [`TunnelWait`] waits for [`HANDSHAKE_TRIES`] initiations,
//! makes each connect attempt long enough for a handshake plus a SYN round trip at the
//! link's RTT, backs off in steps of the RTT, and [`wait`] says in its error what it tried
//! and what the tunnel reported.

use std::time::Duration;

/// wireguard-go's `RekeyTimeout`: the wait before a handshake initiation is sent again.
pub const WG_REKEY_TIMEOUT: Duration = Duration::from_secs(5);
/// wireguard-go's `RekeyTimeoutJitterMaxMs`: added at random to each retry.
pub const WG_REKEY_JITTER: Duration = Duration::from_millis(334);
/// Handshake initiations the wait covers: two may go unanswered.
pub const HANDSHAKE_TRIES: u32 = 3;
/// Time for wireguard-go (a Go program, seconds to start on a loaded host) to be ready to
/// answer after its interface exists.
const STARTUP_SLACK: Duration = Duration::from_secs(2);
/// The longest pause between connect attempts.
const MAX_BACKOFF: Duration = Duration::from_secs(1);

/// How long and how often to try a TCP connection through a tunnel over a link with round
/// trip `rtt`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TunnelWait {
    /// The link's round trip (both directions' delays).
    pub rtt: Duration,
    /// The longest the whole wait may take.
    pub budget: Duration,
}

impl TunnelWait {
    /// The wait for a WireGuard tunnel over a link with round trip `rtt`: long enough for
    /// [`HANDSHAKE_TRIES`] handshake initiations, the handshake's own round trip, then the
    /// longest pause and one whole connect attempt after it.
    pub fn wireguard(rtt: Duration) -> Self {
        let mut w = Self {
            rtt,
            budget: Duration::ZERO,
        };
        w.budget = (WG_REKEY_TIMEOUT + WG_REKEY_JITTER) * (HANDSHAKE_TRIES - 1)
            + STARTUP_SLACK
            + MAX_BACKOFF
            + w.attempt_timeout()
            + rtt * 2;
        w
    }

    /// One connect attempt's timeout: a handshake round trip, then the SYN's, with room for
    /// scheduling delay on a busy host; at least 1 s, TCP's initial retransmission timeout
    /// (RFC 6298 §2), so a connect sees its SYN retransmitted once in the worst case.
    pub fn attempt_timeout(&self) -> Duration {
        (self.rtt * 4 + Duration::from_millis(500)).max(Duration::from_secs(1))
    }

    /// The pause after failed attempt `n` (0-based): one RTT (at least 50 ms), doubling, at
    /// most 1 s.
    pub fn backoff(&self, n: u32) -> Duration {
        let base = self.rtt.max(Duration::from_millis(50));
        base.saturating_mul(1u32 << n.min(16)).min(MAX_BACKOFF)
    }
}

/// What [`wait`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WaitOutcome {
    /// Connect attempts made (the last one succeeded).
    pub attempts: u32,
    /// Time from the first attempt to the connection.
    pub took: Duration,
}

/// Tries `connect(timeout)` until it succeeds or `w.budget` is spent, pausing
/// [`TunnelWait::backoff`] between attempts. `now` is the time since the wait began and
/// `sleep` pauses (the real clock in the lab, a virtual one in tests); `diagnose` describes
/// the tunnel's state for the error (for WireGuard, `wg show`'s latest handshake).
pub fn wait(
    w: &TunnelWait,
    now: &mut dyn FnMut() -> Duration,
    sleep: &mut dyn FnMut(Duration),
    connect: &mut dyn FnMut(Duration) -> Result<(), String>,
    diagnose: &mut dyn FnMut() -> String,
) -> Result<WaitOutcome, String> {
    let mut attempts = 0u32;
    loop {
        let left = w.budget.saturating_sub(now());
        let timeout = w
            .attempt_timeout()
            .min(left)
            .max(Duration::from_millis(100));
        attempts += 1;
        let err = match connect(timeout) {
            Ok(()) => {
                return Ok(WaitOutcome {
                    attempts,
                    took: now(),
                })
            }
            Err(e) => e,
        };
        let pause = w.backoff(attempts - 1);
        if now() + pause >= w.budget {
            return Err(format!(
                "{err} after {attempts} attempts over {:.1} s (budget {:.1} s: {HANDSHAKE_TRIES} \
                 handshake initiations at RTT {:?}); tunnel state: {}",
                now().as_secs_f64(),
                w.budget.as_secs_f64(),
                w.rtt,
                diagnose()
            ));
        }
        sleep(pause);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::Cell;

    /// A tunnel whose handshake completes at `up_at` (virtual time): a connect attempt
    /// started before then fails after its whole timeout (the SYN waits in wireguard-go's
    /// queue); one started after succeeds in one round trip.
    fn simulate(w: &TunnelWait, up_at: Duration) -> Result<WaitOutcome, String> {
        let t = Cell::new(Duration::ZERO);
        wait(
            w,
            &mut || t.get(),
            &mut |d| t.set(t.get() + d),
            &mut |timeout| {
                if t.get() + timeout >= up_at + w.rtt {
                    // The handshake is done (or completes while this attempt waits, its SYN
                    // queued in wireguard-go): the SYN and SYN-ACK cross.
                    t.set(t.get().max(up_at) + w.rtt);
                    Ok(())
                } else {
                    t.set(t.get() + timeout);
                    Err("connection timed out".into())
                }
            },
            &mut || "latest handshake: never".into(),
        )
    }

    /// When the third initiation's answer arrives: two retries after the first, each with
    /// the most jitter, plus the start-up slack and the handshake's round trip.
    fn third_handshake(rtt: Duration) -> Duration {
        STARTUP_SLACK + (WG_REKEY_TIMEOUT + WG_REKEY_JITTER) * 2 + rtt
    }

    #[test]
    fn accepts_a_wireguard_tunnel_whose_third_handshake_succeeds_at_64ms() {
        let rtt = Duration::from_millis(128);
        let w = TunnelWait::wireguard(rtt);
        let up = third_handshake(rtt);
        let o = simulate(&w, up).unwrap();
        assert!(o.took >= up, "{o:?}");
        assert!(o.took <= w.budget, "{o:?} vs {w:?}");
    }

    #[test]
    fn accepts_a_third_handshake_at_every_delay_the_lab_sweeps() {
        for one_way_ms in [0u64, 1, 2, 8, 16, 32, 64, 128] {
            let rtt = Duration::from_millis(2 * one_way_ms);
            let w = TunnelWait::wireguard(rtt);
            // Wherever in the schedule the handshake lands, up to the third initiation.
            for ms in (0..=third_handshake(rtt).as_millis() as u64).step_by(37) {
                let o = simulate(&w, Duration::from_millis(ms));
                assert!(o.is_ok(), "{one_way_ms} ms one way, up at {ms} ms: {o:?}");
            }
        }
    }

    #[test]
    fn the_old_fixed_8s_wait_gave_up_before_the_second_retry_at_64ms() {
        // The check before this module: 1 s attempts, 100 ms pauses, 8 s in total.
        let old = TunnelWait {
            rtt: Duration::from_millis(100),
            budget: Duration::from_secs(8),
        };
        let err = simulate(&old, third_handshake(Duration::from_millis(128))).unwrap_err();
        assert!(err.contains("connection timed out"), "{err}");
        assert!(err.contains("latest handshake: never"), "{err}");
    }

    #[test]
    fn wireguard_wait_at_64ms_covers_three_initiations_and_a_connect() {
        let rtt = Duration::from_millis(128);
        let w = TunnelWait::wireguard(rtt);
        assert!(w.budget >= third_handshake(rtt) + MAX_BACKOFF + rtt + w.attempt_timeout());
        // Each attempt holds a handshake and a SYN round trip with room to spare.
        assert!(w.attempt_timeout() >= rtt * 4);
        assert!(w.attempt_timeout() >= Duration::from_secs(1));
        // Backoff starts at one RTT and is capped.
        assert_eq!(w.backoff(0), rtt);
        assert_eq!(w.backoff(1), rtt * 2);
        assert_eq!(w.backoff(30), MAX_BACKOFF);
        // Bounded: a tunnel that never comes up fails within the budget, saying so.
        let err = simulate(&w, Duration::from_secs(3600)).unwrap_err();
        assert!(err.contains("3 handshake initiations"), "{err}");
        assert!(w.budget < Duration::from_secs(25), "{w:?}");
    }
}
