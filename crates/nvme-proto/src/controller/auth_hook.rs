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

    /// Whether `hostnqn` has a secret for `subnqn` (a Connect of it would get a transaction):
    /// a subsystem that requires authentication is left out of the discovery log of a host
    /// that has none for it.
    fn covers(&self, subnqn: &str, hostnqn: &str) -> bool {
        self.begin(subnqn, hostnqn, 0, 0).is_some()
    }
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

/// DH-HMAC-CHAP secrets by host NQN, for every subsystem or for one (as Linux's nvmet keeps a
/// host's key per host and SPDK per subsystem and host): the [`AuthPolicy`] a target
/// configures. A host's secret for one subsystem (the discovery subsystem,
/// [`super::DISCOVERY_NQN`], included) is used there instead of its secret for every
/// subsystem, and only there: a host keyed for subsystem A alone has no transaction on B. A
/// host with a secret must authenticate; others need not, unless their subsystem requires it
/// ([`super::SubsystemConfig::auth_required`]).
#[derive(Debug, Clone, Default)]
pub struct DhchapHosts {
    hosts: HashMap<String, Arc<AuthConfig>>,
    per_subsystem: HashMap<(String, String), Arc<AuthConfig>>,
}

impl DhchapHosts {
    /// No hosts.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// The secrets of `hostnqn` (its own, and the controller's for bidirectional
    /// authentication) for every subsystem without a secret of its own for this host.
    pub fn insert(&mut self, hostnqn: impl Into<String>, config: AuthConfig) {
        self.hosts.insert(hostnqn.into(), Arc::new(config));
    }

    /// The secrets of `hostnqn` for the subsystem `subnqn` only.
    pub fn insert_for(
        &mut self,
        hostnqn: impl Into<String>,
        subnqn: impl Into<String>,
        config: AuthConfig,
    ) {
        self.per_subsystem
            .insert((hostnqn.into(), subnqn.into()), Arc::new(config));
    }

    /// Whether no host has a secret.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.hosts.is_empty() && self.per_subsystem.is_empty()
    }

    /// The secrets `hostnqn` proves on `subnqn`: its own for that subsystem, else its secret
    /// for every subsystem.
    #[must_use]
    pub fn secrets(&self, subnqn: &str, hostnqn: &str) -> Option<&Arc<AuthConfig>> {
        self.per_subsystem
            .get(&(hostnqn.to_owned(), subnqn.to_owned()))
            .or_else(|| self.hosts.get(hostnqn))
    }

    /// Whether `hostnqn` proves the same secrets on `subnqn` under `self` as under `other`
    /// (none under both counts as the same); secrets are compared in constant time.
    #[must_use]
    pub fn same_secrets(&self, other: &DhchapHosts, subnqn: &str, hostnqn: &str) -> bool {
        match (
            self.secrets(subnqn, hostnqn),
            other.secrets(subnqn, hostnqn),
        ) {
            (None, None) => true,
            (Some(a), Some(b)) => {
                // Both comparisons run (`&`, not `&&`), each in constant time.
                let host = a.host_secret == b.host_secret;
                let ctrl = match (&a.ctrl_secret, &b.ctrl_secret) {
                    (None, None) => true,
                    (Some(x), Some(y)) => x == y,
                    _ => false,
                };
                host & ctrl && a.hashes == b.hashes && a.dh_groups == b.dh_groups
            }
            _ => false,
        }
    }

    /// Every (host NQN, subsystem NQN or `None` for every subsystem) with a secret, and
    /// whether its controller secret allows bidirectional authentication; sorted. No secret
    /// is in it (for `ipsan ctl` and logs).
    #[must_use]
    pub fn keyed(&self) -> Vec<(String, Option<String>, bool)> {
        let mut v: Vec<(String, Option<String>, bool)> = self
            .hosts
            .iter()
            .map(|(h, c)| (h.clone(), None, c.ctrl_secret.is_some()))
            .chain(
                self.per_subsystem
                    .iter()
                    .map(|((h, s), c)| (h.clone(), Some(s.clone()), c.ctrl_secret.is_some())),
            )
            .collect();
        v.sort();
        v
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
        let config = self.secrets(subnqn, hostnqn)?;
        Some(Box::new(ControllerAuth::new(
            Arc::clone(config),
            hostnqn,
            subnqn,
        )))
    }

    fn covers(&self, subnqn: &str, hostnqn: &str) -> bool {
        self.secrets(subnqn, hostnqn).is_some()
    }
}
