//! Connection recovery without a session failure (ErrorRecoveryLevel 2, RFC 7143 §7.2, §7.4.3,
//! §11.5.1 TASK REASSIGN): the session keeps the tasks of a connection that failed, was
//! reinstated (same CID, §6.3.4) or logged out with reason 2, until a TASK REASSIGN on another
//! (or the reinstated) connection takes them, or DefaultTime2Wait + DefaultTime2Retain pass.
//!
//! ```text
//!  connection fails ─► its tasks leave it (Connection::take_for_recovery) ─► orphans
//!  TASK REASSIGN(rtt) on connection c ─► orphan rtt?  ─► c adopts it: Function complete, then
//!                                                         recovery R2Ts / its status later /
//!                                                         Data-In from ExpDataSN and status
//!                                      ─► an open connection's task? ─► Task still allegiant
//!                                      ─► otherwise ─► Task does not exist (the initiator
//!                                                      retries the command: it never ran)
//!  Time2Wait + Time2Retain pass ─► the orphan is dropped: its window slot is free again, a
//!                                  running pass-through task's abort is forwarded (Event::Abort)
//! ```
//!
//! What the session keeps is bounded: orphans are the failed connections' tasks (their window
//! slots bound the active ones; the retained completed ones are bounded per connection,
//! [`super::super::recovery`]) and at most [`MAX_ORPHANS`] in all; past it the oldest go.
//!
//! The driver keeps answering a running task on the connection it was handed out on: a
//! completion for a connection that failed is kept with the orphan, and one for a task
//! reassigned since goes to the task's new connection.
//!
//! Commands received on a failed connection but waiting there behind a CmdSN gap never ran: at
//! ErrorRecoveryLevel 2 their CmdSNs do *not* count as received (the initiator retries them
//! with the same CmdSN, §6.2.1), so the gap waits for the retry; a retried command may arrive
//! behind a later CmdSN on its connection and is let past it.

use std::time::{Duration, Instant};

use iscsi_wire::header::{LogoutReason, TaskMgmtRequest, TmfFunction, TmfResponse};
use iscsi_wire::Header;

use super::super::recovery::{Carried, Done};
use super::super::{Event, LunDirectory, Response, TaskState};
use super::{ConnId, Session};

/// Orphaned tasks a session keeps at most.
pub(super) const MAX_ORPHANS: usize = 4096;

/// A task of a failed connection, waiting for TASK REASSIGN.
#[derive(Debug)]
pub(super) struct Orphan<D> {
    /// The connection the driver knows the task by (its Execute's).
    driver: ConnId,
    /// The failed connection's CID.
    cid: u16,
    task: Carried<D>,
    deadline: Instant,
}

impl<D> Session<D> {
    fn erl2(&self) -> bool {
        self.params.error_recovery_level >= 2
    }

    /// Moves the tasks of failed connections into the orphans (ErrorRecoveryLevel 2).
    pub(super) fn collect_orphans(&mut self) {
        if !self.erl2() || self.ending.is_some() {
            return;
        }
        let t =
            u64::from(self.params.default_time2wait) + u64::from(self.params.default_time2retain);
        let deadline = self.clock + Duration::from_secs(t);
        let mut any = false;
        for i in 0..self.members.len() {
            let m = &mut self.members[i];
            if m.orphaned || !m.conn.failed() {
                continue;
            }
            m.orphaned = true;
            let (id, cid) = (m.id, m.conn.cid);
            for (itt, task) in m.conn.take_for_recovery() {
                let driver = self.moved.remove(&itt).map_or(id, |(d, _)| d);
                self.orphans.insert(
                    itt,
                    Orphan {
                        driver,
                        cid,
                        task,
                        deadline,
                    },
                );
                any = true;
            }
        }
        while self.orphans.len() > MAX_ORPHANS {
            let oldest = self
                .orphans
                .iter()
                .min_by_key(|(_, o)| o.deadline)
                .map(|(itt, _)| *itt);
            match oldest {
                Some(itt) => self.drop_orphan(itt, None),
                None => break,
            }
        }
        if any {
            self.update_siblings();
        }
    }

    /// CIDs of failed connections with orphans.
    pub(super) fn recoverable_cids(&self) -> Vec<u16> {
        let mut v: Vec<u16> = self.orphans.values().map(|o| o.cid).collect();
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Orphaned tasks waiting for TASK REASSIGN.
    #[must_use]
    pub fn orphans(&self) -> usize {
        self.orphans.len()
    }

    /// Forgets an orphan: its window slot is free again; a running pass-through task's abort
    /// goes to the driver.
    fn drop_orphan(&mut self, itt: u32, dir: Option<&dyn LunDirectory<D>>) {
        let Some(o) = self.orphans.remove(&itt) else {
            return;
        };
        if let Carried::Active(t) = o.task {
            if t.counted {
                self.window.complete();
            }
            let running = matches!(t.state, TaskState::Running { .. });
            if running && dir.is_some_and(|d| d.passthrough(t.lun)) {
                self.own_events
                    .push_back((o.driver, Event::Abort { itts: vec![itt] }));
            }
        }
    }

    /// Drops the orphans whose Time2Wait + Time2Retain passed.
    pub(super) fn expire_orphans(&mut self, now: Instant, dir: &dyn LunDirectory<D>) {
        let due: Vec<u32> = self
            .orphans
            .iter()
            .filter(|(_, o)| o.deadline <= now)
            .map(|(itt, _)| *itt)
            .collect();
        if due.is_empty() {
            return;
        }
        for itt in due {
            self.drop_orphan(itt, Some(dir));
        }
        self.update_siblings();
    }

    /// The earliest orphan deadline.
    pub(super) fn orphan_deadline(&self) -> Option<Instant> {
        self.orphans.values().map(|o| o.deadline).min()
    }

    /// A TASK MANAGEMENT FUNCTION that reaches a LU or the target (§11.5.1) ends the orphans
    /// it covers too.
    pub(super) fn tmf_orphans(&mut self, dir: &dyn LunDirectory<D>, all: bool, lun: u64) {
        let hit: Vec<u32> = self
            .orphans
            .iter()
            .filter(|(_, o)| all || o.task.lun() == lun)
            .map(|(itt, _)| *itt)
            .collect();
        for itt in hit {
            self.drop_orphan(itt, Some(dir));
        }
    }

    /// ABORT TASK naming an orphan: it is dropped (its connection cannot answer it).
    pub(super) fn abort_orphan(&mut self, dir: &dyn LunDirectory<D>, itt: u32) -> bool {
        if !self.orphans.contains_key(&itt) {
            return false;
        }
        self.drop_orphan(itt, Some(dir));
        true
    }

    /// TASK REASSIGN on connection `i` (§11.5.1) at ErrorRecoveryLevel 2: true when the session
    /// answered it (an orphan was adopted, or the task is allegiant to another open
    /// connection); false leaves it to the connection (its own task: still allegiant; none:
    /// does not exist). A task of another session is never found here.
    pub(super) fn reassign(&mut self, i: usize, h: &TaskMgmtRequest) -> bool {
        let rtt = h.referenced_task_tag;
        if let Some(o) = self.orphans.remove(&rtt) {
            let running = matches!(
                &o.task,
                Carried::Active(t) if matches!(t.state, TaskState::Running { .. })
            );
            let to = self.members[i].id;
            match self.with(i, |c| c.adopt(h, o.task)) {
                Ok(()) => {
                    if running {
                        self.moved.insert(rtt, (o.driver, to));
                    }
                }
                Err(task) => {
                    self.orphans.insert(rtt, Orphan { task, ..o });
                }
            }
            self.update_siblings();
            return true;
        }
        let elsewhere = self
            .members
            .iter()
            .enumerate()
            .any(|(j, m)| j != i && m.conn.closed.is_none() && m.conn.knows(rtt));
        if elsewhere {
            self.with(i, |c| c.answer_tmf(h, TmfResponse::TASK_STILL_ALLEGIANT));
            return true;
        }
        false
    }

    /// A completion the driver gives for connection `id` that no longer holds the task: kept
    /// with the orphan, or handed to the connection the task was reassigned to. `None`: not
    /// such a task.
    pub(super) fn complete_elsewhere(
        &mut self,
        id: ConnId,
        itt: u32,
        resp: Response,
        residual: Option<i64>,
    ) -> Option<bool> {
        if let Some(o) = self.orphans.get_mut(&itt) {
            if o.driver != id {
                return None;
            }
            let Carried::Active(t) = &o.task else {
                return Some(false);
            };
            if !matches!(t.state, TaskState::Running { aborted: false }) {
                return Some(false);
            }
            let counted = t.counted;
            o.task = Carried::Done(Box::new(Done::of(t, resp, residual)));
            if counted {
                self.window.complete();
            }
            return Some(true);
        }
        let (from, to) = *self.moved.get(&itt)?;
        if from != id {
            return None;
        }
        self.moved.remove(&itt);
        let j = self.index(to)?;
        Some(self.with(j, |c| c.complete_with_residual(itt, resp, residual)))
    }

    /// A new command reusing tag `itt` on connection `i`: an active orphan keeps it (the
    /// command is refused, true); a completed one is forgotten, as are completed tasks other
    /// connections kept (the initiator saw them end).
    pub(super) fn itt_reused(&mut self, i: usize, itt: u32) -> bool {
        if let Some(o) = self.orphans.get(&itt) {
            if matches!(o.task, Carried::Active(_)) {
                return true;
            }
            self.orphans.remove(&itt);
        }
        for (j, m) in self.members.iter_mut().enumerate() {
            if j != i {
                m.conn.forget_done(itt);
            }
        }
        false
    }

    /// Whether a PDU goes past the ones held on its connection: at ErrorRecoveryLevel 2 an
    /// immediate TASK REASSIGN, and the immediate Logout removing a failed connection for
    /// recovery that must come before it (§7.2.2): together they repair the gap the held ones
    /// wait behind (held behind it, the Logout would wait for ever).
    pub(super) fn bypasses_held(&self, h: &Header) -> bool {
        self.erl2()
            && match h {
                Header::TaskMgmtRequest(t) => {
                    t.immediate && t.function == TmfFunction::TASK_REASSIGN
                }
                Header::LogoutRequest(l) => {
                    l.immediate && l.reason == LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY
                }
                _ => false,
            }
    }
}
