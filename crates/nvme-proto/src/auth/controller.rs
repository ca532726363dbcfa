//! The controller's side of DH-HMAC-CHAP on one queue.

use std::sync::Arc;

use bytes::Bytes;
use rand::rngs::OsRng;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::dh::{DhGroup, DhKey};
use super::hash::{augmented_challenge, response, HashId, Nqns, Role};
use super::message::{
    Challenge, Failure, FailureReason, Message, Negotiate, Reply, Success1, REASON_AUTH_FAILURE,
};
use super::{fresh_challenge, fresh_seqnum, AuthCommandError, AuthConfig, AuthFailure, AuthState};

/// Where the transaction is.
enum Step {
    /// Waiting for an AUTH_Negotiate.
    Negotiate,
    /// Negotiated: the next Authentication Receive returns the Challenge.
    ChallengeDue {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
    },
    /// Challenge sent: waiting for the Reply.
    AwaitReply {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
        c1: Vec<u8>,
        s1: u32,
        key: Option<DhKey>,
    },
    /// The host's response verified: the next Authentication Receive returns Success1, with
    /// R2 when the host asked for bidirectional authentication.
    Success1Due {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
        r2: Option<Zeroizing<Vec<u8>>>,
    },
    /// Success1 with R2 sent: waiting for the host's Success2 (or Failure2).
    AwaitSuccess2 {
        t_id: u16,
        hash: HashId,
        group: DhGroup,
    },
    /// The next Authentication Receive returns Failure1.
    Failure1Due { t_id: u16, reason: FailureReason },
    /// The transaction is over ([`ControllerAuth::state`] says how).
    Done,
}

/// The controller's side of DH-HMAC-CHAP on one queue (TP 8006), sans-IO: the controller
/// passes it each Authentication Send's data and asks it for each Authentication Receive's.
///
/// Protocol failures are answered the way TP 8006 (and Linux's target) answers them: the
/// Authentication Send completes successfully and the next Authentication Receive returns
/// AUTH_Failure1 with the explanation; a wrong host response is "authentication failed" and
/// nothing else (never which part differed). A new AUTH_Negotiate starts a new transaction
/// at any point (re-authentication). Commands that are not DH-HMAC-CHAP at all
/// ([`AuthCommandError`]) are completed with an error status and change nothing.
pub struct ControllerAuth {
    config: Arc<AuthConfig>,
    nqns: Nqns,
    step: Step,
    state: AuthState,
    authenticated: bool,
    last_t_id: u16,
}

impl std::fmt::Debug for ControllerAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControllerAuth")
            .field("hostnqn", &self.nqns.host)
            .field("subnqn", &self.nqns.subsystem)
            .field("state", &self.state)
            .field("authenticated", &self.authenticated)
            .finish_non_exhaustive()
    }
}

impl ControllerAuth {
    /// A queue of the host `hostnqn` connected to `subnqn` (the Connect data's NQNs), whose
    /// configuration is `config`.
    #[must_use]
    pub fn new(config: Arc<AuthConfig>, hostnqn: &str, subnqn: &str) -> Self {
        Self {
            config,
            nqns: Nqns {
                host: hostnqn.to_owned(),
                subsystem: subnqn.to_owned(),
            },
            step: Step::Negotiate,
            state: AuthState::InProgress,
            authenticated: false,
            last_t_id: 0,
        }
    }

    /// Where the queue's authentication stands.
    #[must_use]
    pub fn state(&self) -> AuthState {
        self.state
    }

    /// Whether the host has authenticated (a transaction succeeded and none failed since): the
    /// controller runs commands other than Fabrics ones only then. Stays true while a
    /// re-authentication runs, as Linux's target does.
    #[must_use]
    pub fn is_authenticated(&self) -> bool {
        self.authenticated
    }

    /// Whether a transaction is under way (negotiated and not finished).
    #[must_use]
    pub fn in_transaction(&self) -> bool {
        !matches!(self.step, Step::Negotiate | Step::Done)
    }

    /// Takes an Authentication Send's data (its transfer length is `data.len()`).
    ///
    /// # Errors
    /// [`AuthCommandError::ZeroLength`] for empty data; protocol failures are not errors here
    /// (the next [`auth_receive`](Self::auth_receive) returns Failure1).
    pub fn auth_send(&mut self, data: &[u8]) -> Result<(), AuthCommandError> {
        if data.is_empty() {
            return Err(AuthCommandError::ZeroLength);
        }
        let msg = match Message::decode(data) {
            Ok(m) => m,
            Err(e) => {
                let t_id = if data.len() >= 6 {
                    u16::from_le_bytes([data[4], data[5]])
                } else {
                    self.last_t_id
                };
                self.fail_next(t_id, e.reason);
                return Ok(());
            }
        };
        if let Message::Negotiate(n) = msg {
            self.negotiate(&n);
            return Ok(());
        }
        let step = std::mem::replace(&mut self.step, Step::Done);
        let expected_t_id = match &step {
            Step::AwaitReply { t_id, .. } | Step::AwaitSuccess2 { t_id, .. } => Some(*t_id),
            _ => None,
        };
        if let (Some(t), false) = (expected_t_id, matches!(msg, Message::Failure2(_))) {
            if msg.t_id() != t {
                self.fail_next(t, FailureReason::IncorrectPayload);
                return Ok(());
            }
        }
        match (step, msg) {
            (
                Step::AwaitReply {
                    t_id,
                    hash,
                    group,
                    c1,
                    s1,
                    key,
                },
                Message::Reply(r),
            ) => self.reply(t_id, hash, group, &c1, s1, key.as_ref(), &r),
            (Step::AwaitSuccess2 { hash, group, .. }, Message::Success2 { .. }) => {
                self.succeed(hash, group, true);
            }
            (step, Message::Failure2(f)) if !matches!(step, Step::Negotiate | Step::Done) => {
                self.step = Step::Done;
                self.authenticated = false;
                self.state = AuthState::Failed(AuthFailure {
                    reason: f.reason,
                    local: false,
                });
            }
            (_, msg) => self.fail_next(msg.t_id(), FailureReason::IncorrectMessage),
        }
        Ok(())
    }

    /// Answers an Authentication Receive with allocation length `alloc_len`: the Challenge,
    /// Success1 or Failure1 the transaction is at (exactly the message; the transport sends
    /// no more than the host allocated). Asked at any other point, it answers Failure1
    /// "authentication failed" and the transaction fails, as Linux's target does.
    ///
    /// # Errors
    /// [`AuthCommandError::ZeroLength`], or [`AuthCommandError::AllocationTooSmall`] when the
    /// message does not fit (nothing changes; the host may ask again).
    pub fn auth_receive(&mut self, alloc_len: u32) -> Result<Bytes, AuthCommandError> {
        if alloc_len == 0 {
            return Err(AuthCommandError::ZeroLength);
        }
        let needed = match &self.step {
            Step::ChallengeDue { hash, group, .. } => 16 + hash.len() + group.value_len(),
            Step::Success1Due { r2, .. } => 16 + r2.as_ref().map_or(0, |r| r.len()),
            _ => 8,
        };
        if (alloc_len as usize) < needed {
            return Err(AuthCommandError::AllocationTooSmall {
                alloc: alloc_len,
                needed,
            });
        }
        let mut rng = OsRng;
        match std::mem::replace(&mut self.step, Step::Done) {
            Step::ChallengeDue { t_id, hash, group } => {
                let c1 = fresh_challenge(&mut rng, hash.len());
                let s1 = fresh_seqnum(&mut rng);
                let key = DhKey::generate(group, &mut rng);
                let msg = Message::Challenge(Challenge {
                    t_id,
                    hash,
                    dh_group: group,
                    seqnum: s1,
                    challenge: c1.clone(),
                    dh_value: key
                        .as_ref()
                        .map(|k| k.public().to_vec())
                        .unwrap_or_default(),
                });
                self.step = Step::AwaitReply {
                    t_id,
                    hash,
                    group,
                    c1,
                    s1,
                    key,
                };
                Ok(msg.encode())
            }
            Step::Success1Due {
                t_id,
                hash,
                group,
                r2,
            } => {
                let bidirectional = r2.is_some();
                let msg = Message::Success1(Success1 {
                    t_id,
                    hash_len: hash.len() as u8,
                    response: r2.as_ref().map(|r| r.to_vec()),
                });
                if bidirectional {
                    self.step = Step::AwaitSuccess2 { t_id, hash, group };
                } else {
                    self.succeed(hash, group, false);
                }
                Ok(msg.encode())
            }
            Step::Failure1Due { t_id, reason } => Ok(self.failure1(t_id, reason)),
            _ => Ok(self.failure1(self.last_t_id, FailureReason::Failed)),
        }
    }

    fn negotiate(&mut self, n: &Negotiate) {
        self.last_t_id = n.t_id;
        if n.sc_c != 0 {
            return self.fail_next(n.t_id, FailureReason::ConcatMismatch);
        }
        let Some(hash) = self
            .config
            .hashes
            .iter()
            .copied()
            .find(|h| n.hashes.contains(&h.id()))
        else {
            return self.fail_next(n.t_id, FailureReason::HashUnusable);
        };
        let Some(group) = self
            .config
            .dh_groups
            .iter()
            .copied()
            .find(|g| n.dh_groups.contains(&g.id()))
        else {
            return self.fail_next(n.t_id, FailureReason::DhGroupUnusable);
        };
        self.state = AuthState::InProgress;
        self.step = Step::ChallengeDue {
            t_id: n.t_id,
            hash,
            group,
        };
    }

    #[allow(clippy::too_many_arguments)]
    fn reply(
        &mut self,
        t_id: u16,
        hash: HashId,
        group: DhGroup,
        c1: &[u8],
        s1: u32,
        key: Option<&DhKey>,
        r: &Reply,
    ) {
        if r.response.len() != hash.len() {
            return self.fail_next(t_id, FailureReason::IncorrectPayload);
        }
        let session_key = match key {
            None if r.dh_value.is_empty() => None,
            None => return self.fail_next(t_id, FailureReason::IncorrectPayload),
            Some(_) if r.dh_value.len() != group.value_len() => {
                return self.fail_next(t_id, FailureReason::IncorrectPayload)
            }
            Some(k) => match k.shared_secret(&r.dh_value) {
                Ok(s) => Some(s),
                Err(_) => return self.fail_next(t_id, FailureReason::DhGroupUnusable),
            },
        };
        let augment = |c: &[u8]| match &session_key {
            Some(sk) => augmented_challenge(hash, sk, c),
            None => Zeroizing::new(c.to_vec()),
        };
        let key1 = self.config.host_secret.transformed(&self.nqns.host);
        let expected = response(hash, &key1, &augment(c1), s1, t_id, Role::Host, &self.nqns);
        if !bool::from(expected.ct_eq(&r.response)) {
            return self.fail_next(t_id, FailureReason::Failed);
        }
        let r2 = match &r.challenge {
            None => None,
            Some(c2) => {
                // S2 = 0 with a C2 asks for a concatenation PSK only, which needs SC_C.
                if r.seqnum == 0 || c2.len() != hash.len() {
                    return self.fail_next(t_id, FailureReason::IncorrectPayload);
                }
                // A C2 equal to C1 would have this controller answer its own challenge.
                if bool::from(c2.ct_eq(c1)) {
                    return self.fail_next(t_id, FailureReason::Failed);
                }
                let Some(ctrl_secret) = &self.config.ctrl_secret else {
                    return self.fail_next(t_id, FailureReason::Failed);
                };
                let key2 = ctrl_secret.transformed(&self.nqns.subsystem);
                Some(response(
                    hash,
                    &key2,
                    &augment(c2),
                    r.seqnum,
                    t_id,
                    Role::Controller,
                    &self.nqns,
                ))
            }
        };
        self.step = Step::Success1Due {
            t_id,
            hash,
            group,
            r2,
        };
    }

    fn succeed(&mut self, hash: HashId, group: DhGroup, bidirectional: bool) {
        self.step = Step::Done;
        self.authenticated = true;
        self.state = AuthState::Succeeded {
            hash,
            dh_group: group,
            bidirectional,
        };
    }

    fn fail_next(&mut self, t_id: u16, reason: FailureReason) {
        self.authenticated = false;
        self.state = AuthState::InProgress;
        self.step = Step::Failure1Due { t_id, reason };
    }

    fn failure1(&mut self, t_id: u16, reason: FailureReason) -> Bytes {
        self.step = Step::Done;
        self.authenticated = false;
        self.state = AuthState::Failed(AuthFailure {
            reason,
            local: true,
        });
        Message::Failure1(Failure {
            t_id,
            reason_code: REASON_AUTH_FAILURE,
            reason,
        })
        .encode()
    }
}
