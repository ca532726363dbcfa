//! ErrorRecoveryLevel 1 and 2 on the target's connection (RFC 7143 §7.1–§7.2, §11.16): what a
//! connection keeps of its completed tasks, SNACK, and the connection's side of task
//! reassignment (the session's side is [`super::session`]).
//!
//! - **Retention**: at ErrorRecoveryLevel >= 1 a completed task's [`Response`] is kept (its
//!   Data-In is a function of it, [`super::status_pdus`], so keeping the response keeps every
//!   PDU: `Bytes` the driver produced anyway, no copy) until the initiator acknowledges its
//!   status with an ExpStatSN past it (§4.2.2.2, §11.3). Bounded per connection by
//!   [`RETAIN_TASKS`] and [`RETAIN_BYTES`]: past either the oldest is dropped, and a SNACK or
//!   TASK REASSIGN naming it is refused. An initiator that acknowledges (every PDU it sends
//!   carries ExpStatSN) never reaches the bound; one that does not cannot grow it.
//! - **SNACK** (§11.16): Data/R2T SNACK resends the named Data-In PDUs of a retained task (same
//!   DataSNs, status in the last one with its original StatSN) or the named outstanding R2Ts of
//!   a task collecting data; Status SNACK resends retained statuses with their original StatSN;
//!   DataACK is accepted (this target never asks for one, A=0); R-Data SNACK and anything not
//!   retained are refused with Reject "SNACK reject" (§11.17.1).
//! - **Reassignment** (§11.5.1 TASK REASSIGN, ErrorRecoveryLevel 2): a failed connection's
//!   tasks leave it ([`Connection::take_for_recovery`]), and the connection a TASK REASSIGN
//!   arrives on takes one ([`Connection::adopt`]): a task collecting data is solicited again
//!   for what never arrived (recovery R2Ts), a running one answers here when it completes, a
//!   completed one resends its Data-In from the request's ExpDataSN and its status with a new
//!   StatSN of this connection.

use std::collections::VecDeque;

use iscsi_wire::header::{
    LogoutRequest, LogoutResponse, RejectReason, ScsiResponse, SnackRequest, TaskMgmtRequest,
    TaskMgmtResponse, TmfResponse,
};
use iscsi_wire::{Header, Pdu};

use super::{status_pdus, Connection, Response, Task, TaskState};
use crate::engine::{CloseReason, PeerTagMap, Side};
use crate::seq::sn_lt;

/// Completed tasks one connection keeps for SNACK and reassignment, at most.
pub(super) const RETAIN_TASKS: usize = 1024;
/// Bytes of Data-In those hold, at most.
pub(super) const RETAIN_BYTES: usize = 64 << 20;

/// SNACK types (RFC 7143 §11.16.1).
const SNACK_DATA_R2T: u8 = 0;
const SNACK_STATUS: u8 = 1;
const SNACK_DATA_ACK: u8 = 2;

/// A completed task whose status the initiator has not acknowledged.
#[derive(Debug)]
pub(super) struct Done {
    seq: u64,
    pub(super) lun: u64,
    edtl: u32,
    need: u64,
    resp: Response,
    residual: Option<i64>,
    /// The StatSN its status left with; `None` while it is queued.
    stat_sn: Option<u32>,
}

impl Done {
    /// A running task's answer, kept while the task has no connection.
    pub(super) fn of<D>(task: &Task<D>, resp: Response, residual: Option<i64>) -> Self {
        Self {
            seq: 0,
            lun: task.lun,
            edtl: task.edtl,
            need: task.need,
            resp,
            residual,
            stat_sn: None,
        }
    }

    fn bytes(&self) -> usize {
        self.resp.data_in_len()
    }

    fn pdus(&self, params: &crate::params::SessionParams, itt: u32) -> Vec<Pdu> {
        let mut v = Vec::new();
        status_pdus(
            params,
            itt,
            self.lun,
            self.edtl,
            self.need,
            &self.resp,
            self.residual,
            &mut |p| v.push(p),
        );
        v
    }
}

/// What a connection keeps of its completed tasks ([`RETAIN_TASKS`], [`RETAIN_BYTES`]).
#[derive(Debug, Default)]
pub(super) struct Retained {
    /// By the initiator's ITTs: keyed hashing ([`crate::engine::PeerTags`]), at most
    /// [`RETAIN_TASKS`] entries.
    done: PeerTagMap<Done>,
    /// ITTs in the order their statuses were queued (and so stamped), with the `seq` of the
    /// entry they were pushed for (an entry removed early leaves a stale one here).
    order: VecDeque<(u32, u64)>,
    next_seq: u64,
    bytes: usize,
    /// The highest ExpStatSN the initiator sent on this connection.
    acked: Option<u32>,
}

impl Retained {
    /// Whether `itt` is a completed task kept here.
    pub(super) fn has(&self, itt: u32) -> bool {
        self.done.contains_key(&itt)
    }

    fn insert(&mut self, itt: u32, mut d: Done) {
        self.remove(itt);
        d.seq = self.next_seq;
        self.next_seq += 1;
        self.bytes += d.bytes();
        self.order.push_back((itt, d.seq));
        self.done.insert(itt, d);
        while self.order.len() > RETAIN_TASKS || self.bytes > RETAIN_BYTES {
            let Some((itt, seq)) = self.order.pop_front() else {
                break;
            };
            if self.done.get(&itt).is_some_and(|d| d.seq == seq) {
                self.remove(itt);
            }
        }
    }

    fn remove(&mut self, itt: u32) -> Option<Done> {
        let d = self.done.remove(&itt)?;
        self.bytes = self.bytes.saturating_sub(d.bytes());
        Some(d)
    }

    /// A PDU left: if it carries a retained task's status, note its StatSN.
    pub(super) fn stamped(&mut self, h: &Header) {
        if self.done.is_empty() {
            return;
        }
        let (itt, sn) = match h {
            Header::ScsiResponse(r) => (r.itt, r.stat_sn),
            Header::DataIn(d) if d.status_present => (d.itt, d.stat_sn),
            _ => return,
        };
        if let Some(d) = self.done.get_mut(&itt) {
            d.stat_sn.get_or_insert(sn);
        }
    }

    /// The initiator acknowledged every StatSN before `exp` (`next`: the StatSN this connection
    /// hands out next; an ExpStatSN beyond it or moving back acknowledges nothing).
    fn acknowledge(&mut self, exp: u32, next: u32) {
        if sn_lt(next, exp) || self.acked.is_some_and(|a| sn_lt(exp, a)) {
            return;
        }
        self.acked = Some(exp);
        while let Some(&(itt, seq)) = self.order.front() {
            let current = self.done.get(&itt).filter(|d| d.seq == seq);
            match current.map(|d| d.stat_sn) {
                // Removed early (acknowledged out of turn, its tag reused): a stale entry.
                None => {}
                Some(Some(sn)) if sn_lt(sn, exp) => {
                    self.remove(itt);
                }
                // Not acknowledged, or still queued: neither is anything after it.
                Some(_) => break,
            }
            self.order.pop_front();
        }
    }

    fn drain(&mut self) -> Vec<(u32, Done)> {
        self.order.clear();
        self.bytes = 0;
        self.done.drain().collect()
    }
}

/// A task leaving a failed connection for the one a TASK REASSIGN names.
#[derive(Debug)]
pub(super) enum Carried<D> {
    /// Collecting data (its outstanding R2Ts forgotten: [`crate::engine::r2t::WriteState::recover`])
    /// or running.
    Active(Task<D>),
    /// Completed, its status not acknowledged.
    Done(Box<Done>),
}

impl<D> Carried<D> {
    pub(super) fn lun(&self) -> u64 {
        match self {
            Carried::Active(t) => t.lun,
            Carried::Done(d) => d.lun,
        }
    }
}

/// The ExpStatSN a request carries.
fn exp_stat_sn(h: &Header) -> Option<u32> {
    Some(match h {
        Header::ScsiCommand(c) => c.exp_stat_sn,
        Header::DataOut(d) => d.exp_stat_sn,
        Header::TaskMgmtRequest(t) => t.exp_stat_sn,
        Header::NopOut(n) => n.exp_stat_sn,
        Header::TextRequest(t) => t.exp_stat_sn,
        Header::LogoutRequest(l) => l.exp_stat_sn,
        Header::SnackRequest(s) => s.exp_stat_sn,
        _ => return None,
    })
}

/// Whether `sn` is in the run `beg`.. of `run` numbers (0: every one from `beg` on).
fn in_run(sn: u32, beg: u32, run: u32) -> bool {
    let d = sn.wrapping_sub(beg);
    if run == 0 {
        d < 1 << 31
    } else {
        d < run
    }
}

impl<D> Connection<D> {
    /// The initiator's ExpStatSN on a PDU: statuses before it were received and are dropped.
    pub(super) fn acknowledged(&mut self, h: &Header) {
        if let Some(exp) = exp_stat_sn(h) {
            self.retained.acknowledge(exp, self.stat_sn);
        }
        if let Header::ScsiCommand(c) = h {
            // The initiator reuses a tag only for a task it saw end (§11.2.1.8).
            self.retained.remove(c.itt);
        }
    }

    /// Keeps a completed task's answer (ErrorRecoveryLevel >= 1).
    pub(super) fn retain(&mut self, itt: u32, task: &Task<D>, resp: &Response, r: Option<i64>) {
        self.retained.insert(itt, Done::of(task, resp.clone(), r));
    }

    /// Whether `itt` is a task of this connection, active or completed and kept.
    pub(super) fn knows(&self, itt: u32) -> bool {
        self.tasks.contains_key(&itt) || self.retained.has(itt)
    }

    /// Forgets a retained completed task (a new command reuses its tag on another connection).
    pub(super) fn forget_done(&mut self, itt: u32) {
        self.retained.remove(itt);
    }

    /// Whether the connection ended in a way that leaves its tasks to a new allegiance
    /// (ErrorRecoveryLevel 2): it failed, was reinstated or dropped, or logged out with reason
    /// 2. A Logout with reason 0 or 1, or a cold reset, ends its tasks (§11.14.1).
    pub(super) fn failed(&self) -> bool {
        match self.closed {
            None => false,
            Some(_) if self.for_recovery => true,
            Some(e) => !matches!(
                e.reason,
                CloseReason::Logout | CloseReason::LogoutRequested | CloseReason::ColdReset
            ),
        }
    }

    /// The tasks of a failed connection, for reassignment: collecting ones (their outstanding
    /// R2Ts and unsolicited data forgotten, to be solicited again), running ones, and completed
    /// ones whose status was not acknowledged. Aborted tasks stay (they end here).
    pub(super) fn take_for_recovery(&mut self) -> Vec<(u32, Carried<D>)> {
        let itts: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, t)| !matches!(t.state, TaskState::Running { aborted: true }))
            .map(|(i, _)| *i)
            .collect();
        let mut v = Vec::with_capacity(itts.len());
        for itt in itts {
            if let Some(mut t) = self.tasks.remove(&itt) {
                if let TaskState::Collecting(c) = &mut t.state {
                    c.write.recover();
                }
                v.push((itt, Carried::Active(t)));
            }
        }
        v.extend(
            self.retained
                .drain()
                .into_iter()
                .map(|(i, d)| (i, Carried::Done(Box::new(d)))),
        );
        v
    }

    /// Answers a task management request with `response` (admitted as [`Connection::on_tmf`]
    /// would); false when its CmdSN is outside the window (ignored, §4.2.2.1).
    pub(super) fn answer_tmf(&mut self, h: &TaskMgmtRequest, response: TmfResponse) -> bool {
        if !self.admit(h.cmd_sn, h.immediate, false) {
            return false;
        }
        self.send(TaskMgmtResponse {
            response,
            itt: h.itt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        });
        true
    }

    /// TASK REASSIGN (§11.5.1) of a failed connection's task to this one: answered Function
    /// complete, then the task resumes here. A task collecting data gets R2Ts for what it never
    /// received (all of it with [`super::Config::resolicit_reassigned_writes`]); a running
    /// one answers here when it completes; a completed one resends its
    /// Data-In from the request's ExpDataSN (0: from the start, this target never asks for
    /// DataACK) and its status, with this connection's next StatSN. `Err`: the request was
    /// outside the window and is ignored; the task is handed back.
    pub(super) fn adopt(
        &mut self,
        h: &TaskMgmtRequest,
        task: Carried<D>,
    ) -> Result<(), Carried<D>> {
        if !self.answer_tmf(h, TmfResponse::FUNCTION_COMPLETE) {
            return Err(task);
        }
        let itt = h.referenced_task_tag;
        match task {
            Carried::Active(mut t) => {
                let collecting = match &mut t.state {
                    TaskState::Collecting(c) => {
                        if self.resolicit_reassigned_writes {
                            // Sealed per connection: nothing of the failed one's data is kept.
                            c.write.restart();
                        }
                        true
                    }
                    TaskState::Running { .. } => false,
                };
                self.tasks.insert(itt, t);
                if collecting {
                    self.solicit(itt);
                }
            }
            Carried::Done(d) => {
                let mut d = *d;
                let pdus = d.pdus(&self.params, itt);
                let data_in = pdus
                    .iter()
                    .filter(|p| matches!(p.header, Header::DataIn(_)))
                    .count() as u32;
                let mut status_sent = false;
                for p in pdus {
                    let (data_sn, status) = match &p.header {
                        Header::DataIn(x) => (Some(x.data_sn), x.status_present),
                        _ => (None, true),
                    };
                    if data_sn.is_some_and(|sn| sn < h.exp_data_sn) {
                        // Acknowledged by the initiator (§11.5.1 ExpDataSN).
                        continue;
                    }
                    status_sent |= status;
                    self.queue(p, None);
                }
                if !status_sent {
                    // The status went in the last Data-In, which the initiator acknowledged
                    // (ExpDataSN past it) yet never saw the status of: a SCSI Response alone.
                    let r = response_alone(itt, &d, data_in);
                    self.queue(Pdu::new(r, bytes::Bytes::new()), None);
                }
                d.stat_sn = None;
                self.retained.insert(itt, d);
            }
        }
        Ok(())
    }

    fn queue(&mut self, pdu: Pdu, stat_sn: Option<u32>) {
        self.queued_bytes += pdu.data.len();
        self.out.push_back((pdu, stat_sn));
    }

    /// SNACK (§11.16), ErrorRecoveryLevel >= 1.
    pub(super) fn on_snack(&mut self, h: &SnackRequest, raw: &[u8; 48]) {
        let ok = match h.snack_type {
            SNACK_DATA_R2T => self.resend_data_or_r2t(h),
            SNACK_STATUS => self.resend_status(h.beg_run, h.run_length),
            SNACK_DATA_ACK => true,
            // R-Data SNACK (resegmentation) is not offered.
            _ => false,
        };
        if !ok {
            self.reject(RejectReason::SNACK_REJECT, raw);
        }
    }

    fn resend_data_or_r2t(&mut self, h: &SnackRequest) -> bool {
        let itt = h.itt;
        if let Some(Task {
            lun,
            state: TaskState::Collecting(c),
            ..
        }) = self.tasks.get_mut(&itt)
        {
            let lun = *lun;
            let plans = c.write.resend(h.beg_run, h.run_length);
            let any = !plans.is_empty();
            self.send_r2ts(lun, itt, plans);
            return any;
        }
        let Some(d) = self.retained.done.get(&itt) else {
            return false;
        };
        let stat_sn = d.stat_sn;
        let pdus: Vec<Pdu> = d
            .pdus(&self.params, itt)
            .into_iter()
            .filter(|p| matches!(&p.header, Header::DataIn(x) if in_run(x.data_sn, h.beg_run, h.run_length)))
            .collect();
        if pdus.is_empty() {
            return false;
        }
        for p in pdus {
            let fixed = match &p.header {
                Header::DataIn(x) if x.status_present => stat_sn,
                _ => None,
            };
            if fixed.is_none() && matches!(&p.header, Header::DataIn(x) if x.status_present) {
                // Its status is still queued: the data goes again without it.
                let mut p = p;
                if let Header::DataIn(x) = &mut p.header {
                    x.status_present = false;
                    x.status = 0;
                    x.residual_count = 0;
                    (x.overflow, x.underflow) = (false, false);
                }
                self.queue(p, None);
            } else {
                self.queue(p, fixed.or(Some(0)));
            }
        }
        true
    }

    fn resend_status(&mut self, beg: u32, run: u32) -> bool {
        let mut hits: Vec<(u32, u32)> = self
            .retained
            .done
            .iter()
            .filter_map(|(itt, d)| d.stat_sn.map(|sn| (sn, *itt)))
            .filter(|(sn, _)| in_run(*sn, beg, run) && sn_lt(*sn, self.stat_sn))
            .collect();
        hits.sort_unstable_by_key(|(sn, _)| sn.wrapping_sub(beg));
        for &(sn, itt) in &hits {
            let Some(d) = self.retained.done.get(&itt) else {
                continue;
            };
            if let Some(p) = d.pdus(&self.params, itt).pop() {
                self.queue(p, Some(sn));
            }
        }
        !hits.is_empty()
    }

    /// Logout with reason 2, remove the connection for recovery (§11.14.1, ErrorRecoveryLevel
    /// 2): this connection or another (named by CID) closes and its tasks wait for TASK
    /// REASSIGN; the response gives Time2Wait and Time2Retain (§11.15.2, §11.15.3). A CID the
    /// session knows no tasks of is "CID not found" (1).
    pub(super) fn logout_for_recovery(&mut self, h: &LogoutRequest) {
        let (wait, retain) = (
            u16::try_from(self.params.default_time2wait).unwrap_or(3600),
            u16::try_from(self.params.default_time2retain).unwrap_or(3600),
        );
        let known = h.cid == self.cid
            || self.siblings.contains(&h.cid)
            || self.recoverable.contains(&h.cid);
        self.send(LogoutResponse {
            response: if known { 0 } else { 1 },
            itt: h.itt,
            time2wait: if known { wait } else { 0 },
            time2retain: if known { retain } else { 0 },
            ..LogoutResponse::default()
        });
        if h.cid == self.cid {
            self.for_recovery = true;
            self.close(Side::Initiator, CloseReason::Logout);
        } else if self.siblings.contains(&h.cid) {
            self.recovery_of = Some(h.cid);
        }
    }
}

/// The SCSI Response of a completed task whose status went in its last Data-In.
fn response_alone(itt: u32, d: &Done, data_in: u32) -> ScsiResponse {
    let mut r = ScsiResponse {
        status: d.resp.status,
        itt,
        exp_data_sn: data_in,
        ..ScsiResponse::default()
    };
    let produced = u32::try_from(d.resp.data_in_len()).unwrap_or(u32::MAX);
    let base = if d.need > 0 {
        u32::try_from(d.need).unwrap_or(u32::MAX)
    } else {
        produced
    };
    let (over, under) = match d.residual {
        Some(x) if x < 0 => (u32::try_from(-x).unwrap_or(u32::MAX), 0),
        Some(x) => (0, u32::try_from(x).unwrap_or(u32::MAX)),
        None => (base.saturating_sub(d.edtl), d.edtl.saturating_sub(base)),
    };
    r.overflow = over > 0;
    r.underflow = under > 0;
    r.residual_count = over.max(under);
    r
}
