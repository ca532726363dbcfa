//! The host's side of DH-HMAC-CHAP on one queue.

use std::sync::Arc;

use bytes::Bytes;
use rand::rngs::OsRng;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::dh::{DhGroup, DhKey};
use super::hash::{augmented_challenge, response, HashId, Nqns, Role};
use super::message::{
    Challenge, Failure, FailureReason, Message, Negotiate, Reply, REASON_AUTH_FAILURE,
};
use super::{fresh_challenge, fresh_seqnum, AuthConfig, AuthFailure, AuthState};

/// What the host does next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostStep {
    /// Send this with Authentication Send, then issue an Authentication Receive (allocation
    /// length [`RECEIVE_ALLOC_LEN`](super::RECEIVE_ALLOC_LEN)) and pass its data to
    /// [`HostAuth::receive`].
    SendThenReceive(Bytes),
    /// Send this Success2 with Authentication Send; the queue is then authenticated (both
    /// ways).
    SendThenDone(Bytes),
    /// Send this Failure2 with Authentication Send; the transaction has failed.
    SendFailure(Bytes, AuthFailure),
    /// Authenticated; nothing more to send (unidirectional: no Success2).
    Done,
    /// The controller refused (Failure1), or the machine was used out of order; nothing to
    /// send.
    Failed(AuthFailure),
}

enum Step {
    Start,
    AwaitChallenge,
    AwaitSuccess1 {
        hash: HashId,
        group: DhGroup,
        /// The R2 a genuine controller sends, when bidirectional.
        expected_r2: Option<Zeroizing<Vec<u8>>>,
    },
    Done,
}

/// The host's side of DH-HMAC-CHAP on one queue (TP 8006), sans-IO: [`start`](Self::start)
/// gives the AUTH_Negotiate, [`receive`](Self::receive) takes each Authentication Receive's
/// data and returns the [`HostStep`]. Bidirectional when the configuration has a controller
/// secret: the host then sends C2 and accepts the controller only if its R2 verifies.
pub struct HostAuth {
    config: Arc<AuthConfig>,
    nqns: Nqns,
    t_id: u16,
    step: Step,
    state: AuthState,
}

impl std::fmt::Debug for HostAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostAuth")
            .field("hostnqn", &self.nqns.host)
            .field("subnqn", &self.nqns.subsystem)
            .field("t_id", &self.t_id)
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl HostAuth {
    /// A transaction with identifier `t_id` (the host's choice; Linux counts them per
    /// controller) for the host `hostnqn` connected to `subnqn`.
    #[must_use]
    pub fn new(config: Arc<AuthConfig>, hostnqn: &str, subnqn: &str, t_id: u16) -> Self {
        Self {
            config,
            nqns: Nqns {
                host: hostnqn.to_owned(),
                subsystem: subnqn.to_owned(),
            },
            t_id,
            step: Step::Start,
            state: AuthState::InProgress,
        }
    }

    /// Where the transaction stands.
    #[must_use]
    pub fn state(&self) -> AuthState {
        self.state
    }

    /// The AUTH_Negotiate to send with the first Authentication Send (then receive the
    /// Challenge). Offers the configured hashes and groups, no secure channel concatenation.
    pub fn start(&mut self) -> Bytes {
        self.step = Step::AwaitChallenge;
        self.state = AuthState::InProgress;
        Message::Negotiate(Negotiate {
            t_id: self.t_id,
            sc_c: 0,
            hashes: self.config.hashes.iter().map(|h| h.id()).collect(),
            dh_groups: self.config.dh_groups.iter().map(|g| g.id()).collect(),
        })
        .encode()
    }

    /// Takes an Authentication Receive's data (trailing zero padding allowed).
    pub fn receive(&mut self, data: &[u8]) -> HostStep {
        let step = std::mem::replace(&mut self.step, Step::Done);
        if matches!(step, Step::Start | Step::Done) {
            return self.failed(FailureReason::IncorrectMessage, true);
        }
        let msg = match Message::decode_padded(data) {
            Ok(m) => m,
            Err(e) => return self.failure2(e.reason),
        };
        if let Message::Failure1(f) = msg {
            return self.failed(f.reason, false);
        }
        if msg.t_id() != self.t_id {
            return self.failure2(FailureReason::IncorrectMessage);
        }
        match (step, msg) {
            (Step::AwaitChallenge, Message::Challenge(c)) => self.challenge(&c),
            (
                Step::AwaitSuccess1 {
                    hash,
                    group,
                    expected_r2,
                },
                Message::Success1(s),
            ) => {
                if usize::from(s.hash_len) != hash.len() {
                    return self.failure2(FailureReason::HashUnusable);
                }
                match expected_r2 {
                    None => {
                        self.state = AuthState::Succeeded {
                            hash,
                            dh_group: group,
                            bidirectional: false,
                        };
                        HostStep::Done
                    }
                    Some(want) => {
                        let ok = s
                            .response
                            .as_ref()
                            .is_some_and(|r| bool::from(want.ct_eq(r)));
                        if !ok {
                            return self.failure2(FailureReason::Failed);
                        }
                        self.state = AuthState::Succeeded {
                            hash,
                            dh_group: group,
                            bidirectional: true,
                        };
                        HostStep::SendThenDone(Message::Success2 { t_id: self.t_id }.encode())
                    }
                }
            }
            _ => self.failure2(FailureReason::IncorrectMessage),
        }
    }

    fn challenge(&mut self, c: &Challenge) -> HostStep {
        if !self.config.hashes.contains(&c.hash) {
            return self.failure2(FailureReason::HashUnusable);
        }
        if !self.config.dh_groups.contains(&c.dh_group) {
            return self.failure2(FailureReason::DhGroupUnusable);
        }
        let mut rng = OsRng;
        let key = DhKey::generate(c.dh_group, &mut rng);
        let session_key = match &key {
            None => None,
            Some(k) => match k.shared_secret(&c.dh_value) {
                Ok(s) => Some(s),
                Err(_) => return self.failure2(FailureReason::DhGroupUnusable),
            },
        };
        let augment = |ch: &[u8]| match &session_key {
            Some(sk) => augmented_challenge(c.hash, sk, ch),
            None => Zeroizing::new(ch.to_vec()),
        };
        let key1 = self.config.host_secret.transformed(&self.nqns.host);
        let r1 = response(
            c.hash,
            &key1,
            &augment(&c.challenge),
            c.seqnum,
            self.t_id,
            Role::Host,
            &self.nqns,
        );
        let (c2, s2, expected_r2) = match &self.config.ctrl_secret {
            None => (None, 0, None),
            Some(ctrl) => {
                let c2 = fresh_challenge(&mut rng, c.hash.len());
                let s2 = fresh_seqnum(&mut rng);
                let key2 = ctrl.transformed(&self.nqns.subsystem);
                let r2 = response(
                    c.hash,
                    &key2,
                    &augment(&c2),
                    s2,
                    self.t_id,
                    Role::Controller,
                    &self.nqns,
                );
                (Some(c2), s2, Some(r2))
            }
        };
        self.step = Step::AwaitSuccess1 {
            hash: c.hash,
            group: c.dh_group,
            expected_r2,
        };
        HostStep::SendThenReceive(
            Message::Reply(Reply {
                t_id: self.t_id,
                response: r1.to_vec(),
                challenge: c2,
                seqnum: s2,
                dh_value: key
                    .as_ref()
                    .map(|k| k.public().to_vec())
                    .unwrap_or_default(),
            })
            .encode(),
        )
    }

    fn failed(&mut self, reason: FailureReason, local: bool) -> HostStep {
        self.step = Step::Done;
        let f = AuthFailure { reason, local };
        self.state = AuthState::Failed(f);
        HostStep::Failed(f)
    }

    fn failure2(&mut self, reason: FailureReason) -> HostStep {
        self.step = Step::Done;
        let f = AuthFailure {
            reason,
            local: true,
        };
        self.state = AuthState::Failed(f);
        HostStep::SendFailure(
            Message::Failure2(Failure {
                t_id: self.t_id,
                reason_code: REASON_AUTH_FAILURE,
                reason,
            })
            .encode(),
            f,
        )
    }
}
