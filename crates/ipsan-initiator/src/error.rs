//! Initiator errors, by scope (DEVELOPERS.md): a task error carries SCSI status and sense; a
//! connection error fails every command in flight; login errors say which step refused.

use crate::scsi::Sense;

/// Everything the initiator can fail with. Never carries secret material.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// TCP connect or socket I/O failed.
    #[error("I/O error: {0}")]
    Io(#[from] std::io::Error),
    /// A bad URL or secret source.
    #[error(transparent)]
    Url(#[from] crate::url::UrlError),
    /// The peer sent bytes that are not valid iSCSI.
    #[error("protocol error: {0}")]
    Wire(#[from] iscsi_wire::WireError),
    /// A PDU we tried to send could not be encoded (caller asked for something too large).
    #[error("cannot encode PDU: {0}")]
    Encode(#[from] iscsi_wire::codec::EncodeError),
    /// The target broke a protocol rule (RFC 7143) in a way we cannot continue from.
    #[error("protocol violation by target: {0}")]
    Protocol(String),
    /// Login was refused by the target (RFC 7143 §11.13.5 status class/detail).
    #[error("login refused by target: {message} (status class {class:#04x} detail {detail:#04x})")]
    LoginRefused {
        class: u8,
        detail: u8,
        message: &'static str,
    },
    /// Login negotiation failed on our side (bad key answer, CHAP failure, ...).
    #[error("login failed: {0}")]
    Login(String),
    /// CHAP computation or check failed.
    #[error("CHAP: {0}")]
    Chap(#[from] iscsi_proto::chap::ChapError),
    /// The command completed with a non-GOOD SCSI status.
    #[error("SCSI status {status:#04x}{}", sense.as_ref().map(|s| format!(": {s}")).unwrap_or_default())]
    Scsi { status: u8, sense: Option<Sense> },
    /// The target answered with an iSCSI response code other than "command completed".
    #[error("iSCSI response {0:#04x} (target failure)")]
    IscsiResponse(u8),
    /// The target broke a protocol rule for this command (an R2T outside the rules, say);
    /// the command was aborted and the session goes on.
    #[error("protocol violation by target: {0}")]
    TargetViolation(iscsi_proto::engine::Violation),
    /// The target rejected a PDU of this command (RFC 7143 §11.17).
    #[error("target rejected the PDU (reason {0:#04x})")]
    Rejected(u8),
    /// The connection is gone; every command in flight fails with this, and says why.
    #[error("connection lost: {0}")]
    ConnectionLost(ConnectionLoss),
    /// A PDU of a Seal session failed record protection (docs/seal.md §4a): forged, altered,
    /// replayed, reordered, injected or dropped on the path. Nothing of it acted; the
    /// connection was dropped and every command in flight fails with this (none is known to
    /// have completed: a write may or may not have reached the medium).
    #[error("connection dropped: {0}")]
    SealForgery(ipsan_seal::Forgery),
    /// An NVMe/TCP host operation failed ([`crate::nvme`]).
    #[error(transparent)]
    Nvme(#[from] crate::nvme::NvmeError),
    /// An operation did not finish in time.
    #[error("timed out: {0}")]
    Timeout(&'static str),
    /// A SCSI command got no status within [`crate::SessionConfig::command_timeout`]; the
    /// initiator aborted it with ABORT TASK (RFC 7143 §11.5.1) and the target confirmed, so
    /// the task is gone and the session goes on. A write may or may not have reached the
    /// medium (SAM-5 §5.6): the caller retries or reports, as after any aborted command.
    #[error("command timed out after {0:?} and was aborted (ABORT TASK)")]
    CommandTimedOut(std::time::Duration),
    /// The command was aborted by a task management function (e.g. this session's
    /// [`crate::Session::lun_reset`]) before it completed; no status will come for it.
    #[error("command aborted by {0}")]
    TaskAborted(String),
    /// The target answered a task management request with this response code instead of
    /// "function complete" (RFC 7143 §11.6.1: 1 task does not exist, 2 LUN does not exist,
    /// 5 function not supported, 6 authorization failed, 255 rejected).
    #[error("task management function not completed (response {0})")]
    TaskManagement(u8),
    /// The caller asked for something impossible (zero blocks, unaligned buffer, ...).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// The payload transform (e.g. seal) refused the data.
    #[error("payload transform: {0}")]
    Transform(String),
    /// The target asked this session to log out (RFC 7143 §11.9.1, AsyncEvent 1; ipsan's
    /// target does so when Seal's counters pass the re-key mark). Commands already in flight
    /// complete; new ones fail with this and are not sent. Open a new session (fresh keys).
    #[error("the target requested a logout (re-login needed, e.g. for fresh Seal keys)")]
    LogoutRequested,
    /// The connection failed while this command was in flight and the command is not
    /// idempotent ([`crate::recovery::is_idempotent`]: COMPARE AND WRITE, PERSISTENT RESERVE
    /// OUT, RESERVE, ...), so the recovering session did not send it again: it may or may not
    /// have run. `sense` is the retryable SCSI answer to hand to a host (CHECK CONDITION,
    /// ABORTED COMMAND, 4Bh/07h CONNECTION LOST: [`crate::recovery::not_reissued_sense`]).
    #[error("command {opcode:#04x} was in flight when the connection failed ({reason}); not idempotent, so not sent again")]
    NotReissued {
        opcode: u8,
        reason: ConnectionLoss,
        sense: Sense,
    },
    /// The session's connection failed and no new one logged in within
    /// [`crate::SessionConfig::recovery_timeout`] (RFC 7143 §6.3.5 reinstatement attempts go
    /// on in the background; later commands work again once one succeeds).
    #[error("session recovery did not complete within {after:?} (connection lost: {reason})")]
    RecoveryTimedOut {
        after: std::time::Duration,
        reason: ConnectionLoss,
    },
}

/// Why a connection ended (RFC 7143 §7: a connection-scope error), as every command in flight
/// on it reports it: who ended it and for which rule or condition, never free text.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnectionLoss {
    /// The target closed the TCP connection (a read returned end of stream).
    #[error("connection closed by the target")]
    PeerClosed,
    /// A socket read or write failed.
    #[error("{op} failed: {kind}")]
    Io { op: IoOp, kind: std::io::ErrorKind },
    /// A NOP-Out ping went unanswered and nothing else came from the target for this long
    /// (RFC 7143 §11.18).
    #[error("keepalive failed: no NOP-In answer to a NOP-Out within {0:?} (and nothing else from the target)")]
    KeepaliveTimeout(std::time::Duration),
    /// A PDU of a Seal session failed record protection (docs/seal.md §4a).
    #[error("forged PDU: {0}")]
    SealForgery(ipsan_seal::Forgery),
    /// Seal could not protect an outgoing PDU (its record counter is spent): the next PDU
    /// could not verify at the target.
    #[error("Seal cannot protect another PDU on this connection (record counter exhausted)")]
    SealExhausted,
    /// The target broke this rule of RFC 7143 in a way that leaves the connection unusable.
    #[error("protocol violation by the target: {0}")]
    Violation(iscsi_proto::engine::Violation),
    /// The target's byte stream could not be framed (bad digest, length, opcode).
    #[error("cannot decode the target's PDUs: {0}")]
    Framing(iscsi_wire::WireError),
    /// A PDU of ours could not be encoded.
    #[error("cannot encode a PDU: {0}")]
    Encode(iscsi_wire::codec::EncodeError),
    /// Any other end the engine records, with who ended it: a logout, the target announcing
    /// the drop (AsyncEvent 2/3), a task management request unanswered, a timed-out command
    /// the target would neither abort nor reset, ...
    #[error(transparent)]
    Engine(iscsi_proto::engine::ConnectionError),
    /// This side ended it.
    #[error("{0}")]
    Local(LocalClose),
}

impl ConnectionLoss {
    /// The typed form of the engine's reason.
    #[must_use]
    pub fn from_engine(e: iscsi_proto::engine::ConnectionError) -> Self {
        use iscsi_proto::engine::{CloseReason, Side};
        match (e.by, e.reason) {
            (_, CloseReason::PeerClosed) => Self::PeerClosed,
            (_, CloseReason::PingTimeout(d)) => Self::KeepaliveTimeout(d),
            (Side::Initiator, CloseReason::Violation(v)) => Self::Violation(v),
            _ => Self::Engine(e),
        }
    }
}

/// Which socket operation failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IoOp {
    Send,
    Receive,
}

impl std::fmt::Display for IoOp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            IoOp::Send => "send",
            IoOp::Receive => "receive",
        })
    }
}

/// Why this side ended a connection or a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LocalClose {
    /// The [`crate::Session`] was dropped.
    #[error("session dropped")]
    SessionDropped,
    /// The session was dropped while its recovery was logging in a new connection.
    #[error("session dropped during recovery")]
    DroppedDuringRecovery,
    /// The session is logging out or closed: no connection will come.
    #[error("session closed")]
    SessionClosed,
    /// Nothing to log out of: the connection failed and recovery had not replaced it.
    #[error("session is recovering")]
    Recovering,
    /// A thread panicked holding the session's state.
    #[error("session state poisoned")]
    Poisoned,
    /// The connection ended and no reason was recorded.
    #[error("connection closed")]
    Unknown,
}

impl Error {
    /// The sense data, for a SCSI error.
    pub fn sense(&self) -> Option<&Sense> {
        match self {
            Error::Scsi { sense, .. } => sense.as_ref(),
            Error::NotReissued { sense, .. } => Some(sense),
            _ => None,
        }
    }

    /// The SCSI status this error stands for, when it is one a host's SCSI layer can be
    /// given: the target's own status, or CHECK CONDITION for [`Error::NotReissued`].
    pub fn scsi_status(&self) -> Option<u8> {
        match self {
            Error::Scsi { status, .. } => Some(*status),
            Error::NotReissued { .. } => Some(crate::scsi::ScsiStatus::CHECK_CONDITION.0),
            _ => None,
        }
    }

    /// Whether this error ended the connection (so a recovering session reconnects).
    pub fn is_connection_loss(&self) -> bool {
        self.connection_loss().is_some()
    }

    /// Why the connection ended, when this error says it did.
    pub fn connection_loss(&self) -> Option<ConnectionLoss> {
        match self {
            Error::ConnectionLost(l) => Some(l.clone()),
            Error::SealForgery(f) => Some(ConnectionLoss::SealForgery(f.clone())),
            _ => None,
        }
    }
}

/// Convenience alias.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Human text for a login status class/detail (RFC 7143 §11.13.5).
pub use iscsi_proto::login::originator::status_message as login_status_message;
