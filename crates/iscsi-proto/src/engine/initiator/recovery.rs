//! ErrorRecoveryLevel 2 on the initiator's connection (RFC 7143 §7.2): a failed
//! connection's tasks held, taken out with all they know and adopted by another connection of
//! the session, TASK REASSIGN (§11.5.1) and its answer, a command sent again with its CmdSN.

use std::time::Instant;

use bytes::Bytes;
use iscsi_wire::header::{LogoutReason, LogoutRequest, TaskMgmtRequest, TmfFunction, TmfResponse};
use iscsi_wire::{Header, Pdu};

use super::tmf::TmfKind;
use super::{Connection, Event, MovedTask, Phase, Reassignment, SubmitError, TaskError};
use crate::engine::{CloseReason, ConnectionError, Side};
use crate::seq::sn_le;

impl Connection {
    /// The ITTs of the tasks on this connection (queued, sent, or abandoned awaiting
    /// cleanup), ascending: what ErrorRecoveryLevel 2 would reassign when it fails.
    #[must_use]
    pub fn task_itts(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.tasks.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Takes task `itt` out of this connection with all it knows (Data-In received, R2Ts
    /// answered, its deadline), sending nothing and ending nothing: its allegiance is to move
    /// ([`Connection::adopt_task`]; RFC 7143 §7.2.2, TASK REASSIGN at ErrorRecoveryLevel 2).
    /// Data-Out queued for it here and not yet taken by the driver is dropped.
    pub fn take_task(&mut self, itt: u32) -> Option<MovedTask> {
        let task = self.tasks.remove(&itt)?;
        self.queued.retain(|i| *i != itt);
        self.out
            .retain(|p| !matches!(&p.header, Header::DataOut(d) if d.itt == itt));
        Some(MovedTask { itt, task })
    }

    /// Takes on a task from another connection of the session ([`Connection::take_task`]):
    /// its PDUs are this connection's from now on. A task that had not left yet waits for the
    /// window here. `Invalid` when its ITT is in use here.
    pub fn adopt_task(&mut self, moved: MovedTask) -> Result<u32, SubmitError> {
        if let Some(e) = self.closed {
            return Err(SubmitError::Closed(e));
        }
        let MovedTask { itt, mut task } = moved;
        if self.tasks.contains_key(&itt) || self.tmfs.contains_key(&itt) {
            return Err(SubmitError::Invalid);
        }
        self.reserved.remove(&itt);
        if let Some(d) = task.deadline {
            let at = self.deadlines.partition_point(|(x, _)| *x <= d);
            self.deadlines.insert(at, (d, itt));
        }
        // R2Ts it had not answered yet are the old connection's: ErrorRecoveryLevel 2 asks
        // for them again (a recovery R2T, §7.2.2).
        task.unsent_r2ts.clear();
        let queued = task.phase == Phase::Queued;
        self.tasks.insert(itt, task);
        if queued {
            self.queued.push_back(itt);
            self.flush_queued();
        }
        Ok(itt)
    }

    /// ErrorRecoveryLevel 2 (RFC 7143 §7.2): when this connection fails, its tasks are kept
    /// ([`Connection::take_held`]) for reassignment to another connection of the session,
    /// instead of ending with [`TaskError::ConnectionLost`]. A logout (reason 0 or 1, or the
    /// target's request) still ends them, as does a task moved [`MAX_REASSIGNS`] times.
    pub fn hold_tasks(&mut self, on: bool) {
        self.hold = on;
    }

    /// The tasks this connection kept when it failed ([`Connection::hold_tasks`]), in the
    /// order of their ITTs: each goes to another connection with [`Connection::reassign`].
    pub fn take_held(&mut self) -> Vec<MovedTask> {
        std::mem::take(&mut self.held)
    }

    /// Logout with reason 2, remove connection `cid` for recovery (RFC 7143 §11.14.1), sent
    /// on this connection for a failed other one: once answered ([`Event::RecoveryLogout`])
    /// the target holds that connection's tasks for TASK REASSIGN (§7.2.2 requires this, or
    /// the implicit logout of a login reinstating the CID, before a reassignment). Timed as a
    /// task management request. `None` when this connection is closed or logging out.
    pub fn logout_for_recovery(&mut self, now: Instant, cid: u16) -> Option<u32> {
        if self.closed.is_some() || self.logout.is_some() {
            return None;
        }
        let itt = self.alloc_itt();
        self.tmfs
            .insert(itt, (TmfKind::RecoveryLogout(cid), now + self.tmf_timeout));
        self.out.push_back(Pdu::new(
            LogoutRequest {
                immediate: true,
                reason: LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY,
                itt,
                cid,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
            },
            Bytes::new(),
        ));
        Some(itt)
    }

    /// Reassigns a task of a failed connection of the session to this one (ErrorRecoveryLevel
    /// 2, RFC 7143 §7.2.2, §11.5.1): it becomes this connection's ([`Connection::adopt_task`])
    /// and, if its command had left, a TASK REASSIGN names it with its CmdSN and, for a read,
    /// ExpDataSN = the Data-In it has (the target resends from there; the bytes received are
    /// kept). The answer ([`Event::Reassigned`]): Function complete, the task goes on here
    /// (recovery R2Ts for write data the target misses are answered from the write buffer);
    /// Task does not exist for a CmdSN the target never acknowledged, the command is sent
    /// again with its ITT and CmdSN (§6.2.1: it never arrived, or waited behind a gap on the
    /// failed connection and was dropped with it); anything else ends the task.
    pub fn reassign(&mut self, now: Instant, moved: MovedTask) -> Result<u32, SubmitError> {
        let itt = moved.itt;
        let sent = moved.cmd_sn();
        let (lun, exp_data_sn) = (moved.task.lun, moved.task.next_data_sn);
        self.adopt_task(moved)?;
        let Some(ref_cmd_sn) = sent else {
            // It had not left: it waits for the window here like any other.
            return Ok(itt);
        };
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.reassigned = true;
            t.reassigns = t.reassigns.saturating_add(1);
            // Recovery R2Ts ask again for what the target misses, wherever it was solicited.
            t.solicited.clear();
        }
        let tmf = self.alloc_itt();
        self.tmfs
            .insert(tmf, (TmfKind::Reassign(itt), now + self.tmf_timeout));
        self.out.push_back(Pdu::new(
            TaskMgmtRequest {
                immediate: true,
                function: TmfFunction::TASK_REASSIGN,
                lun,
                itt: tmf,
                referenced_task_tag: itt,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
                ref_cmd_sn,
                exp_data_sn,
            },
            Bytes::new(),
        ));
        Ok(itt)
    }

    /// Sends command `itt` again with its CmdSN, from the start (a retry, RFC 7143 §6.2.1):
    /// what it received is dropped, its data goes again.
    pub(super) fn retry(&mut self, itt: u32, cmd_sn: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.received = 0;
        t.next_data_sn = 0;
        t.next_r2t_sn = 0;
        t.unsent_r2ts.clear();
        t.solicited.clear();
        t.reassigned = false;
        if let Some(buf) = t.read.as_mut() {
            buf.clear();
        }
        self.send_command(itt, cmd_sn);
    }

    /// The answer to the TASK REASSIGN of `task` ([`Connection::reassign`]).
    pub(super) fn on_reassigned(&mut self, task: u32, response: TmfResponse) {
        let Some(sent) = self.tasks.get(&task).map(|t| match t.phase {
            Phase::Sent(sn) => Some(sn),
            _ => None,
        }) else {
            // Its status came first: it is over.
            return;
        };
        let outcome = match (response, sent) {
            (TmfResponse::FUNCTION_COMPLETE, _) => Reassignment::Adopted,
            // Never acknowledged (ExpCmdSN is not past it): the target never had it to run.
            (TmfResponse::TASK_DOES_NOT_EXIST, Some(sn)) if sn_le(self.exp_cmd_sn, sn) => {
                self.retry(task, sn);
                Reassignment::Retried
            }
            (other, _) => Reassignment::Refused(other),
        };
        if let Reassignment::Refused(r) = outcome {
            self.finish(
                task,
                Err(TaskError::ConnectionLost(ConnectionError {
                    by: Side::Target,
                    reason: CloseReason::ReassignRefused(r),
                })),
            );
        }
        self.events
            .push_back(Event::Reassigned { itt: task, outcome });
    }
}

impl MovedTask {
    /// The task's ITT (it keeps it: ITTs are the session's, §11.2.1.8).
    #[must_use]
    pub fn itt(&self) -> u32 {
        self.itt
    }

    /// The CmdSN it went with (`None`: it had not left).
    #[must_use]
    pub fn cmd_sn(&self) -> Option<u32> {
        match self.task.phase {
            Phase::Sent(sn) => Some(sn),
            _ => None,
        }
    }

    /// Bytes of write data it carries (0: none).
    #[must_use]
    pub fn write_len(&self) -> usize {
        self.task.write.len() + self.task.write_tail.len()
    }

    /// Replaces its write data with `data` of the same length: data made again for the
    /// connection it moves to (Seal seals under each connection's keys; the EDTL its command
    /// went with, and the offsets of R2Ts, stay right). False, and nothing changed, when the
    /// length differs.
    pub fn replace_write(&mut self, data: Bytes) -> bool {
        if data.len() != self.write_len() {
            return false;
        }
        self.task.write = data;
        self.task.write_tail = Bytes::new();
        true
    }
}
