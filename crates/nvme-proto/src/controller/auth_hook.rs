//! The controller's side of in-band authentication (TP 8006; NVMe over Fabrics 1.1 §3.6-§3.7,
//! Authentication Send/Receive): the controller only gates and dispatches; the DH-HMAC-CHAP
//! transaction itself is the `auth` module's, behind these two traits.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use bytes::Bytes;
use nvme_wire::Status;

use crate::auth::{AuthCommandError, AuthConfig, AuthState, ControllerAuth};

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

/// The DH-HMAC-CHAP state of one queue, controller role: every transaction the host runs on
/// it (the first after Connect, re-authentications later).
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

    /// Where the queue stands: [`AuthOutcome::Succeeded`] while the host is authenticated
    /// (also during a re-authentication), which is when other commands may run.
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

/// The `auth` module's controller role is a queue's transaction: one [`ControllerAuth`] per
/// queue runs every transaction of it, re-authentication included.
impl AuthTransaction for ControllerAuth {
    fn send(&mut self, payload: &[u8]) -> Result<(), Status> {
        self.auth_send(payload).map_err(AuthCommandError::status)
    }

    fn receive(&mut self, alloc_len: u32) -> Result<Bytes, Status> {
        self.auth_receive(alloc_len)
            .map_err(AuthCommandError::status)
    }

    fn outcome(&self) -> AuthOutcome {
        if self.is_authenticated() {
            AuthOutcome::Succeeded
        } else if matches!(self.state(), AuthState::Failed(_)) {
            AuthOutcome::Failed
        } else {
            AuthOutcome::InProgress
        }
    }
}

/// DH-HMAC-CHAP secrets by host NQN (as Linux's nvmet keeps them per host): the
/// [`AuthPolicy`] a target configures. A host in the map must authenticate; others need not,
/// unless their subsystem requires it ([`super::SubsystemConfig::auth_required`]).
#[derive(Debug, Clone, Default)]
pub struct DhchapHosts {
    hosts: HashMap<String, Arc<AuthConfig>>,
}

impl DhchapHosts {
    /// No hosts.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The secrets of `hostnqn` (its own, and the controller's for bidirectional
    /// authentication).
    pub fn insert(&mut self, hostnqn: impl Into<String>, config: AuthConfig) {
        self.hosts.insert(hostnqn.into(), Arc::new(config));
    }
}

impl AuthPolicy for DhchapHosts {
    fn begin(
        &self,
        subnqn: &str,
        hostnqn: &str,
        _qid: u16,
        _cntlid: u16,
    ) -> Option<Box<dyn AuthTransaction>> {
        let config = self.hosts.get(hostnqn)?;
        Some(Box::new(ControllerAuth::new(
            Arc::clone(config),
            hostnqn,
            subnqn,
        )))
    }
}
