//! Task management, timeouts and logout on the initiator's connection: ABORT TASK and
//! LOGICAL UNIT RESET (RFC 7143 §11.5), a command's timeout escalation (ABORT TASK, then
//! LOGICAL UNIT RESET, then the connection), a task abandoned for a broken rule, and Logout
//! (§11.14), also when the target asks for it (AsyncEvent 1).

use std::time::Instant;

use bytes::Bytes;
use iscsi_wire::header::{LogoutReason, LogoutRequest, TaskMgmtRequest, TmfFunction, TmfResponse};
use iscsi_wire::{Opcode, Pdu, RESERVED_TAG};

use super::{AbortedBy, Connection, Event, Phase, TaskError, TimeoutStep};
use crate::engine::{CloseReason, ConnectionError, Side, Violation};
use crate::seq::sn_lt;

impl Connection {
    /// Logout closing only this connection (reason 1, RFC 7143 §11.14), named by its `cid`:
    /// the session goes on over its others. As [`Connection::logout`] otherwise; a driver
    /// sends it once the connection's tasks are done (`engine::mcs` drains it first).
    pub fn logout_connection(&mut self, now: Instant, cid: u16) -> Option<u32> {
        self.logout_as(now, LogoutReason::CLOSE_CONNECTION, cid)
    }

    /// ABORT TASK for `itt` (§11.5.1). A command still waiting for the window is withdrawn
    /// at once. Returns the TMF's ITT when a request went out.
    pub fn abort(&mut self, now: Instant, itt: u32) -> Option<u32> {
        let phase = &self.tasks.get(&itt)?.phase;
        match *phase {
            Phase::Queued => {
                self.queued.retain(|i| *i != itt);
                self.finish(itt, Err(TaskError::Aborted(AbortedBy::AbortTask)));
                None
            }
            Phase::Sent(cmd_sn) => Some(self.send_tmf(
                now,
                TmfFunction::ABORT_TASK,
                TmfKind::Abort(itt),
                itt,
                cmd_sn,
            )),
            Phase::Abandoned => None,
        }
    }

    /// LOGICAL UNIT RESET of `lun` (§11.5.1): on FUNCTION COMPLETE every task of ours on it
    /// that was sent ends with [`AbortedBy::LunReset`].
    pub fn lun_reset(&mut self, now: Instant, lun: u64) -> u32 {
        self.send_tmf(
            now,
            TmfFunction::LOGICAL_UNIT_RESET,
            TmfKind::LunReset {
                lun,
                at: self.cmd_sn,
                escalation: None,
            },
            RESERVED_TAG,
            0,
        )
    }

    /// Logout, closing the session (§11.14). Queued commands fail; the connection ends with
    /// the Logout Response.
    pub fn logout(&mut self, now: Instant) -> Option<u32> {
        self.logout_as(now, LogoutReason::CLOSE_SESSION, 0)
    }

    pub(super) fn logout_as(
        &mut self,
        _now: Instant,
        reason: LogoutReason,
        cid: u16,
    ) -> Option<u32> {
        if self.closed.is_some() || self.logout.is_some() {
            return None;
        }
        let queued: Vec<u32> = self.queued.drain(..).collect();
        self.never_sent.extend(queued.iter().copied());
        for itt in queued {
            self.finish(
                itt,
                Err(TaskError::ConnectionLost(ConnectionError {
                    by: Side::Initiator,
                    reason: CloseReason::Logout,
                })),
            );
        }
        let itt = self.alloc_itt();
        self.logout = Some(itt);
        self.out.push_back(Pdu::new(
            LogoutRequest {
                immediate: true,
                reason,
                itt,
                cid,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
            },
            Bytes::new(),
        ));
        Some(itt)
    }

    /// Command `itt` passed its deadline: the first step of the escalation (see
    /// [`Config::command_timeout`]).
    pub(super) fn time_out(&mut self, now: Instant, itt: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.deadline = None;
        t.timed_out = true;
        let after = self.command_timeout.unwrap_or_default();
        match t.phase {
            Phase::Queued => {
                // Still waiting for the window: withdrawn, the target never saw it.
                self.queued.retain(|i| *i != itt);
                self.finish(itt, Err(TaskError::TimedOut { after, by: None }));
            }
            Phase::Sent(cmd_sn) => {
                // Until the answer the task stays, so its Data-In, R2Ts or status are still
                // handled in order; a status that arrives first is the command's result.
                self.events.push_back(Event::TimeoutStep {
                    itt,
                    step: TimeoutStep::AbortTask,
                });
                self.send_tmf(
                    now,
                    TmfFunction::ABORT_TASK,
                    TmfKind::TimeoutAbort(itt),
                    itt,
                    cmd_sn,
                );
            }
            Phase::Abandoned => {}
        }
    }

    /// A rule broken for one task: it ends with the violation, and ABORT TASK cleans up.
    pub(super) fn abandon(&mut self, now: Instant, itt: u32, v: Violation) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        let Phase::Sent(cmd_sn) = t.phase else {
            return;
        };
        t.phase = Phase::Abandoned;
        t.read = None;
        t.deadline = None;
        self.events.push_back(Event::Completed {
            itt,
            result: Err(TaskError::Violation(v)),
        });
        self.send_tmf(
            now,
            TmfFunction::ABORT_TASK,
            TmfKind::Cleanup(itt),
            itt,
            cmd_sn,
        );
    }

    pub(super) fn send_tmf(
        &mut self,
        now: Instant,
        function: TmfFunction,
        kind: TmfKind,
        rtt: u32,
        ref_cmd_sn: u32,
    ) -> u32 {
        let itt = self.alloc_itt();
        let lun = match kind {
            TmfKind::Abort(t)
            | TmfKind::Cleanup(t)
            | TmfKind::TimeoutAbort(t)
            | TmfKind::Reassign(t) => self.tasks.get(&t).map_or(0, |t| t.lun),
            TmfKind::LunReset { lun, .. } => lun,
            TmfKind::RecoveryLogout(_) => 0,
        };
        self.tmfs.insert(itt, (kind, now + self.tmf_timeout));
        self.out.push_back(Pdu::new(
            TaskMgmtRequest {
                immediate: true,
                function,
                lun,
                itt,
                referenced_task_tag: rtt,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
                ref_cmd_sn,
                exp_data_sn: 0,
            },
            Bytes::new(),
        ));
        itt
    }

    pub(super) fn on_tmf_response(&mut self, now: Instant, itt: u32, response: TmfResponse) {
        let kind = match self.tmfs.remove(&itt) {
            Some((TmfKind::RecoveryLogout(_), _)) | None => {
                self.violation(Violation::UnknownTask {
                    opcode: Opcode::TASK_MGMT_RESPONSE,
                    itt,
                });
                return;
            }
            Some((kind, _)) => kind,
        };
        let ends = matches!(
            response,
            TmfResponse::FUNCTION_COMPLETE | TmfResponse::TASK_DOES_NOT_EXIST
        );
        match kind {
            TmfKind::Abort(task) => {
                if ends {
                    // Nothing more comes for it (§11.6.1).
                    self.finish(task, Err(TaskError::Aborted(AbortedBy::AbortTask)));
                }
                self.events
                    .push_back(Event::TaskManagement { itt, response });
            }
            TmfKind::Cleanup(task) => {
                if ends {
                    self.tasks.remove(&task);
                }
            }
            TmfKind::Reassign(task) => self.on_reassigned(task, response),
            TmfKind::RecoveryLogout(_) => {}
            TmfKind::TimeoutAbort(task) => {
                // Gone already: its own status came first and is its result.
                let Some(t) = self.tasks.get(&task) else {
                    return;
                };
                let lun = t.lun;
                if ends {
                    let after = self.command_timeout.unwrap_or_default();
                    self.finish(
                        task,
                        Err(TaskError::TimedOut {
                            after,
                            by: Some(AbortedBy::AbortTask),
                        }),
                    );
                    return;
                }
                // Refused (§11.6.1): escalate as SCSI error handling does (SAM-5 §7); a LUN
                // reset ends every task on the LUN, this one included.
                self.events.push_back(Event::TimeoutStep {
                    itt: task,
                    step: TimeoutStep::LunReset {
                        abort_response: response,
                    },
                });
                self.send_tmf(
                    now,
                    TmfFunction::LOGICAL_UNIT_RESET,
                    TmfKind::LunReset {
                        lun,
                        at: self.cmd_sn,
                        escalation: Some((task, response)),
                    },
                    RESERVED_TAG,
                    0,
                );
            }
            TmfKind::LunReset {
                lun,
                at,
                escalation,
            } => {
                if response == TmfResponse::FUNCTION_COMPLETE {
                    let mut hit: Vec<u32> = self
                        .tasks
                        .iter()
                        .filter(|(_, t)| {
                            t.lun == lun && matches!(t.phase, Phase::Sent(sn) if sn_lt(sn, at))
                        })
                        .map(|(i, _)| *i)
                        .collect();
                    hit.sort_unstable();
                    let after = self.command_timeout.unwrap_or_default();
                    for t in hit {
                        let e = if self.tasks.get(&t).is_some_and(|t| t.timed_out) {
                            TaskError::TimedOut {
                                after,
                                by: Some(AbortedBy::LunReset),
                            }
                        } else {
                            TaskError::Aborted(AbortedBy::LunReset)
                        };
                        self.finish(t, Err(e));
                    }
                }
                match escalation {
                    None => self
                        .events
                        .push_back(Event::TaskManagement { itt, response }),
                    // Neither abort nor reset: nothing on this connection can be trusted.
                    Some((task, abort)) if self.tasks.contains_key(&task) => self.close(
                        Side::Initiator,
                        CloseReason::AbortRefused {
                            abort,
                            reset: response,
                        },
                    ),
                    Some(_) => {}
                }
            }
        }
    }

    /// After AsyncEvent 1: the Logout goes once no command is in flight.
    pub(super) fn honor_logout_request(&mut self) {
        if self.logout_asked
            && self.logout.is_none()
            && self.closed.is_none()
            && self.tasks.is_empty()
        {
            let itt = self.alloc_itt();
            self.logout = Some(itt);
            self.out.push_back(Pdu::new(
                LogoutRequest {
                    immediate: true,
                    reason: LogoutReason::CLOSE_SESSION,
                    itt,
                    cid: 0,
                    cmd_sn: self.cmd_sn,
                    exp_stat_sn: 0,
                },
                Bytes::new(),
            ));
        }
    }
}

#[derive(Debug, Clone, Copy)]
pub(super) enum TmfKind {
    /// ABORT TASK from the caller (its answer is an event).
    Abort(u32),
    /// ABORT TASK for a task abandoned after a violation (answer consumed here).
    Cleanup(u32),
    /// ABORT TASK for a command past its timeout (answer consumed here).
    TimeoutAbort(u32),
    /// LOGICAL UNIT RESET of this LUN, sent when this was the next CmdSN: it ends the
    /// tasks sent before it, not those sent after (SAM-5 §7.7, RFC 7143 §11.5.1).
    /// `escalation`: sent by the engine because the target refused to abort this timed-out
    /// task with this response (answer consumed here), not by the caller.
    LunReset {
        lun: u64,
        at: u32,
        escalation: Option<(u32, TmfResponse)>,
    },
    /// TASK REASSIGN of this task to this connection (ErrorRecoveryLevel 2, §11.5.1).
    Reassign(u32),
    /// Not a TMF: a Logout removing connection `cid` for recovery (§11.14.1 reason 2),
    /// timed as one.
    RecoveryLogout(u16),
}
