//! The controller's side of in-band authentication (TP 8006; NVMe over Fabrics 1.1 §3.6-§3.7,
//! Authentication Send/Receive): the controller only gates and dispatches; the DH-HMAC-CHAP
//! transaction itself is the `auth` module's, behind these two traits.

use std::fmt;

use bytes::Bytes;
use nvme_wire::Status;

/// Where a queue's authentication transaction stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthOutcome {
    /// Messages are still being exchanged.
    InProgress,
    /// The host proved its identity (and the controller its own when bidirectional): the
    /// queue may run other commands.
    Succeeded,
    /// The transaction failed (after sending Failure1, or receiving Failure2); the queue stays
    /// unauthenticated and may start a new transaction.
    Failed,
}

/// One DH-HMAC-CHAP transaction on one queue, controller role.
pub trait AuthTransaction: Send + fmt::Debug {
    /// An Authentication Send's payload (AUTH_Negotiate, DH-HMAC-CHAP_Reply, _Success2,
    /// _Failure2).
    ///
    /// # Errors
    /// The completion status of the Authentication Send (Invalid Field for a malformed
    /// message). A protocol failure the host must learn of is not an error here: it is the
    /// Failure1 message the next Authentication Receive returns.
    fn send(&mut self, payload: &[u8]) -> Result<(), Status>;

    /// The message an Authentication Receive of `alloc_len` bytes returns (Challenge,
    /// Success1, Failure1).
    ///
    /// # Errors
    /// The completion status (Command Sequence Error when no message is due).
    fn receive(&mut self, alloc_len: u32) -> Result<Bytes, Status>;

    /// Where the transaction stands.
    fn outcome(&self) -> AuthOutcome;
}

/// Decides who must authenticate and starts transactions (filled by the `auth` module with
/// the configured `DHHC-1` secrets).
pub trait AuthPolicy: Send + Sync + fmt::Debug {
    /// A new transaction for `hostnqn` on queue `qid` of a controller of `subnqn`, or `None`
    /// when no secret is configured for this host (then Connect does not set AUTHREQ.ATR, or,
    /// if the subsystem requires authentication, the host is refused).
    fn begin(
        &self,
        subnqn: &str,
        hostnqn: &str,
        qid: u16,
        cntlid: u16,
    ) -> Option<Box<dyn AuthTransaction>>;
}
