//! One queue's DH-HMAC-CHAP transaction (TP 8006) as host commands: [`crate::auth::HostAuth`]
//! decides the messages; this turns them into Fabrics Authentication Send (the message in the
//! capsule) and Authentication Receive (allocation length
//! [`RECEIVE_ALLOC_LEN`](crate::auth::RECEIVE_ALLOC_LEN)) commands, one at a time, for the
//! admin queue's bring-up ([`super::bringup`]) and for each I/O queue after its Connect.

use std::sync::Arc;

use bytes::Bytes;
use nvme_wire::entry::PSDT_SGL;
use nvme_wire::fabrics::{Auth, FabricsCommand, FabricsKind, SECP_NVME_AUTH, SPSP_DHCHAP};
use nvme_wire::{Cqe, Sgl};

use super::bringup::{BringupError, HostCommand};
use crate::auth::{AuthConfig, AuthState, HostAuth, HostStep, RECEIVE_ALLOC_LEN};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    Receive,
    Done,
}

#[derive(Debug)]
enum Next {
    Send(Bytes, After),
    Receive,
    Done,
}

/// A DH-HMAC-CHAP transaction on one queue, as commands.
pub struct AuthRun {
    host: HostAuth,
    next: Next,
    /// The command out: `Some(after)` for a Send, `None` for a Receive.
    pending: Option<Option<After>>,
}

impl std::fmt::Debug for AuthRun {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AuthRun")
            .field("state", &self.host.state())
            .finish_non_exhaustive()
    }
}

fn auth_cmd(send: bool, len: u32) -> nvme_wire::Sqe {
    let a = Auth {
        secp: SECP_NVME_AUTH,
        spsp0: SPSP_DHCHAP,
        spsp1: SPSP_DHCHAP,
        len,
    };
    FabricsCommand {
        cid: 0,
        flags: PSDT_SGL,
        sgl: Sgl::Transport { length: 0 },
        kind: if send {
            FabricsKind::AuthSend(a)
        } else {
            FabricsKind::AuthReceive(a)
        },
    }
    .to_sqe()
}

impl AuthRun {
    /// A transaction `t_id` for `hostnqn` on a queue connected to `subnqn`.
    #[must_use]
    pub fn new(config: Arc<AuthConfig>, hostnqn: &str, subnqn: &str, t_id: u16) -> Self {
        let mut host = HostAuth::new(config, hostnqn, subnqn, t_id);
        let negotiate = host.start();
        Self {
            host,
            next: Next::Send(negotiate, After::Receive),
            pending: None,
        }
    }

    /// Where the transaction stands.
    #[must_use]
    pub fn state(&self) -> AuthState {
        self.host.state()
    }

    /// Whether the queue is authenticated.
    #[must_use]
    pub fn is_done(&self) -> bool {
        matches!(self.next, Next::Done) && self.pending.is_none()
    }

    /// The next Authentication Send or Receive, if one is due.
    pub fn poll_command(&mut self) -> Option<HostCommand> {
        if self.pending.is_some() {
            return None;
        }
        match std::mem::replace(&mut self.next, Next::Done) {
            Next::Send(b, after) => {
                let len = u32::try_from(b.len()).unwrap_or(u32::MAX);
                self.pending = Some(Some(after));
                Some(HostCommand {
                    sqe: auth_cmd(true, len),
                    data: b,
                    read_len: 0,
                })
            }
            Next::Receive => {
                self.pending = Some(None);
                Some(HostCommand {
                    sqe: auth_cmd(false, RECEIVE_ALLOC_LEN),
                    data: Bytes::new(),
                    read_len: RECEIVE_ALLOC_LEN,
                })
            }
            Next::Done => None,
        }
    }

    /// The completion of the command [`AuthRun::poll_command`] gave out; `Ok(true)` once the
    /// queue is authenticated.
    ///
    /// # Errors
    /// A failed Authentication Send/Receive, or the transaction failed (the controller's
    /// Failure1, or its R2 did not verify: then no Failure2 is waited for, the caller drops
    /// the connection).
    pub fn handle_completion(&mut self, cqe: &Cqe, data: &[u8]) -> Result<bool, BringupError> {
        let Some(was) = self.pending.take() else {
            return Err(BringupError::Invalid(
                "an auth completion with no command out",
            ));
        };
        if !cqe.status.is_success() {
            return Err(BringupError::Status {
                step: if was.is_some() {
                    "Authentication Send"
                } else {
                    "Authentication Receive"
                },
                status: cqe.status,
                dnr: cqe.dnr,
            });
        }
        match was {
            Some(After::Receive) => {
                self.next = Next::Receive;
                Ok(false)
            }
            Some(After::Done) => {
                self.next = Next::Done;
                Ok(true)
            }
            None => match self.host.receive(data) {
                HostStep::SendThenReceive(b) => {
                    self.next = Next::Send(b, After::Receive);
                    Ok(false)
                }
                HostStep::SendThenDone(b) => {
                    self.next = Next::Send(b, After::Done);
                    Ok(false)
                }
                HostStep::Done => {
                    self.next = Next::Done;
                    Ok(true)
                }
                HostStep::SendFailure(_, f) | HostStep::Failed(f) => {
                    Err(BringupError::Authentication(f.to_string()))
                }
            },
        }
    }
}
