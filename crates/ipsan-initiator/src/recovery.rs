//! Session recovery: what a session does when its connection fails and
//! [`crate::SessionConfig::recovery_timeout`] is set.
//!
//! The session reconnects with exponential backoff ([`Backoff`]), logs in again with the same
//! InitiatorName and ISID and TSIH 0 — a *session reinstatement* (RFC 7143 §6.3.5): the target
//! ends the old session and its tasks before the new one's commands run — agrees fresh keys
//! (Seal's login extension is made afresh per login), and the commands that had not completed
//! are sent again under their ITT (sealed afresh from the caller's plaintext under the new
//! keys). Only commands that may run twice are sent again ([`is_idempotent`]); the others fail
//! with [`crate::Error::NotReissued`], which carries a retryable SCSI answer
//! ([`not_reissued_sense`]) for a SCSI layer above to retry, as after a path failure. What is
//! kept and what is sent again is decided by iscsi-proto's `engine::session`; this module
//! holds the driver's side (backoff, counters).
//! While recovering, commands wait (latency, not errors) up to the recovery timeout, as
//! open-iscsi's `replacement_timeout` does; then they fail with
//! [`crate::Error::RecoveryTimedOut`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::Serialize;

use crate::scsi::{Sense, SenseKey};

/// How long commands wait for a recovering session by default: open-iscsi's
/// `node.session.timeo.replacement_timeout` default (120 s).
pub const DEFAULT_RECOVERY_TIMEOUT: Duration = Duration::from_secs(120);

/// First wait between reconnect attempts.
pub const BACKOFF_START: Duration = Duration::from_millis(100);
/// Longest wait between reconnect attempts.
pub const BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Whether a command may be sent again after a connection loss: the SCSI layer's opcode table
/// (`ipsan_scsi::cdb::OPS`), which the session engine is given to decide what a recovering
/// session sends again.
pub use ipsan_scsi::cdb::is_idempotent;

/// The SCSI answer a command that was in flight at a connection loss and is not idempotent
/// fails with: CHECK CONDITION, sense key ABORTED COMMAND, ASC/ASCQ 4Bh/07h CONNECTION LOST
/// (SPC-4 Annex D, "DATA PHASE ERROR" family).
///
/// Why this one: ABORTED COMMAND means "the device server aborted the command; the
/// application client may be able to recover by trying the command again" (SPC-4 §4.5.6,
/// table 28), which is exactly the state: the command may or may not have run. Linux's SCSI
/// midlayer (`scsi_check_sense`) retries ABORTED COMMAND, as after a path failure; a
/// clustered host that cares whether a COMPARE AND WRITE ran reads the data back. 4Bh/07h
/// names the cause (the transport's connection was lost) rather than 44h/00h INTERNAL TARGET
/// FAILURE, which hosts treat as a device fault.
/// The values are the engine's ([`iscsi_proto::engine::session::NOT_REISSUED_SENSE`]).
#[must_use]
pub fn not_reissued_sense() -> Sense {
    let (key, asc, ascq) = iscsi_proto::engine::session::NOT_REISSUED_SENSE;
    Sense::new(SenseKey(key), asc, ascq)
}

/// Recovery counters of one session ([`crate::Session::recovery_stats`]).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct RecoveryStats {
    /// Connections that failed (TCP error or EOF, keepalive timeout, Seal forgery, ...).
    pub connection_losses: u64,
    /// Reconnect attempts (TCP connect and login), successful or not.
    pub reconnects: u64,
    /// Recoveries completed: a new connection logged in, reinstating the session.
    pub recoveries: u64,
    /// Commands sent again on a new connection after a loss.
    pub commands_reissued: u64,
    /// Commands in flight at a loss that were not sent again because they are not idempotent
    /// ([`crate::Error::NotReissued`]).
    pub commands_failed_not_idempotent: u64,
    /// Commands that failed because no new connection came within the recovery timeout
    /// ([`crate::Error::RecoveryTimedOut`]).
    pub commands_failed_timeout: u64,
    /// How long the last recovery took, from the loss to the new login, in milliseconds.
    pub last_recovery_ms: Option<u64>,
    /// The longest recovery, in milliseconds.
    pub max_recovery_ms: Option<u64>,
}

/// The counters as the session keeps them (updated from many tasks).
#[derive(Debug, Default)]
pub(crate) struct Counters {
    pub(crate) losses: AtomicU64,
    pub(crate) reconnects: AtomicU64,
    pub(crate) recoveries: AtomicU64,
    pub(crate) reissued: AtomicU64,
    pub(crate) not_idempotent: AtomicU64,
    pub(crate) timed_out: AtomicU64,
    /// Milliseconds + 1 (0: none yet).
    pub(crate) last_ms: AtomicU64,
    pub(crate) max_ms: AtomicU64,
}

impl Counters {
    pub(crate) fn bump(c: &AtomicU64) -> u64 {
        c.fetch_add(1, Ordering::Relaxed) + 1
    }

    pub(crate) fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }

    pub(crate) fn recovered(&self, took: Duration) {
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX - 1);
        self.last_ms.store(ms + 1, Ordering::Relaxed);
        self.max_ms.fetch_max(ms + 1, Ordering::Relaxed);
        Self::bump(&self.recoveries);
    }

    pub(crate) fn snapshot(&self) -> RecoveryStats {
        let ms = |c: &AtomicU64| Self::get(c).checked_sub(1);
        RecoveryStats {
            connection_losses: Self::get(&self.losses),
            reconnects: Self::get(&self.reconnects),
            recoveries: Self::get(&self.recoveries),
            commands_reissued: Self::get(&self.reissued),
            commands_failed_not_idempotent: Self::get(&self.not_idempotent),
            commands_failed_timeout: Self::get(&self.timed_out),
            last_recovery_ms: ms(&self.last_ms),
            max_recovery_ms: ms(&self.max_ms),
        }
    }
}

/// Exponential backoff between reconnect attempts: [`BACKOFF_START`] doubling to
/// [`BACKOFF_MAX`], each wait drawn uniformly from its upper half (jitter, so the sessions of
/// many hosts cut by the same WAN failure do not all log in at the same instant).
#[derive(Debug)]
pub(crate) struct Backoff {
    next: Duration,
}

impl Backoff {
    pub(crate) fn new() -> Self {
        Self {
            next: BACKOFF_START,
        }
    }

    pub(crate) fn next_wait(&mut self) -> Duration {
        use rand::Rng;
        let cap = self.next;
        self.next = (self.next * 2).min(BACKOFF_MAX);
        let half = cap / 2;
        half + half.mul_f64(rand::thread_rng().gen_range(0.0..=1.0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_to_its_cap_with_jitter_below_each_step() {
        let mut b = Backoff::new();
        let waits: Vec<Duration> = (0..10).map(|_| b.next_wait()).collect();
        assert!(waits[0] >= BACKOFF_START / 2 && waits[0] <= BACKOFF_START);
        assert!(waits[1] >= BACKOFF_START && waits[1] <= BACKOFF_START * 2);
        for w in &waits {
            assert!(*w <= BACKOFF_MAX);
        }
        assert!(waits[9] >= BACKOFF_MAX / 2);
    }

    #[test]
    fn not_reissued_answer_is_a_retryable_aborted_command() {
        let s = not_reissued_sense();
        assert_eq!(
            (s.key, s.asc, s.ascq),
            (SenseKey::ABORTED_COMMAND, 0x4B, 0x07)
        );
        let fixed = s.to_fixed();
        assert_eq!(fixed[2] & 0x0F, 0x0B);
    }
}
