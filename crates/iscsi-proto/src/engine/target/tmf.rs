//! Task management on the target's connection (RFC 7143 §11.5, §11.6): aborts of tasks with
//! data in flight, LOGICAL UNIT RESET and the target resets, pass-through LUNs' aborts and
//! resets forwarded to the driver, and TMF responses held until the tasks they ended finish.

use std::collections::HashSet;

use iscsi_wire::header::{TaskMgmtRequest, TaskMgmtResponse, TmfFunction, TmfResponse};
use iscsi_wire::RESERVED_TAG;

use super::{Connection, Event, HeldTmf, LunDirectory, Task, TaskState};
use crate::engine::{CloseReason, Side};
use crate::seq::sn_lt;

impl<D> Connection<D> {
    /// Aborts the tasks `pick` selects: collecting ones are dropped at once, running ones
    /// have their answers suppressed. Returns the running ones to wait for.
    pub(super) fn abort_where(&mut self, pick: impl Fn(u32, &Task<D>) -> bool) -> HashSet<u32> {
        let itts: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(i, t)| pick(**i, t))
            .map(|(i, _)| *i)
            .collect();
        let mut waiting = HashSet::new();
        for itt in itts {
            let Some(task) = self.tasks.get_mut(&itt) else {
                continue;
            };
            match &mut task.state {
                TaskState::Collecting(_) => {
                    let counted = task.counted;
                    self.tasks.remove(&itt);
                    if counted {
                        self.window.complete();
                    }
                    self.remember_aborted(itt);
                }
                TaskState::Running { aborted } => {
                    *aborted = true;
                    waiting.insert(itt);
                }
            }
        }
        waiting
    }

    pub(super) fn on_tmf(&mut self, dir: &dyn LunDirectory<D>, h: &TaskMgmtRequest) {
        // The window as it was when the request arrived (a non-immediate request moves it).
        let exp_cmd_sn = self.window.exp_cmd_sn();
        if !self.admit(h.cmd_sn, h.immediate, false) {
            return;
        }
        let lun = h.lun;
        let none = HashSet::new;
        let mut driver = false;
        let (response, waiting, close) = match h.function {
            TmfFunction::ABORT_TASK => {
                let rtt = h.referenced_task_tag;
                if self.tasks.contains_key(&rtt) {
                    let w = self.abort_where(|i, _| i == rtt);
                    self.forward_aborts(dir, &w);
                    (TmfResponse::FUNCTION_COMPLETE, w, false)
                } else if !sn_lt(h.ref_cmd_sn, exp_cmd_sn) && sn_lt(h.ref_cmd_sn, h.cmd_sn) {
                    // §11.5.1 a): a command not received yet (its CmdSN still in the window,
                    // before this request's): considered received, Function complete.
                    (TmfResponse::FUNCTION_COMPLETE, none(), false)
                } else {
                    // §11.5.1 b): the CmdSN is outside the window. A task that completed
                    // already is this case: its status went out, or is queued to, so
                    // "Function complete" would tell the initiator that a command it sees
                    // answered GOOD was aborted.
                    (TmfResponse::TASK_DOES_NOT_EXIST, none(), false)
                }
            }
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET => {
                if dir.exists(lun) {
                    let w = self.abort_where(|_, t| t.lun == lun);
                    self.forward_aborts(dir, &w);
                    (TmfResponse::FUNCTION_COMPLETE, w, false)
                } else {
                    (TmfResponse::LUN_DOES_NOT_EXIST, none(), false)
                }
            }
            TmfFunction::LOGICAL_UNIT_RESET => {
                if dir.exists(lun) {
                    let w = self.abort_where(|_, t| t.lun == lun);
                    let answer = dir.passthrough(lun).then_some(h.itt);
                    driver = answer.is_some();
                    self.events.push_back(Event::Reset {
                        function: h.function,
                        lun,
                        answer,
                    });
                    (TmfResponse::FUNCTION_COMPLETE, w, false)
                } else {
                    (TmfResponse::LUN_DOES_NOT_EXIST, none(), false)
                }
            }
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET => {
                let w = self.abort_where(|_, _| true);
                self.events.push_back(Event::Reset {
                    function: h.function,
                    lun,
                    answer: None,
                });
                // §11.5.1: after a cold reset the target drops all connections.
                let cold = h.function == TmfFunction::TARGET_COLD_RESET;
                (TmfResponse::FUNCTION_COMPLETE, w, cold)
            }
            TmfFunction::CLEAR_ACA => (TmfResponse::FUNCTION_NOT_SUPPORTED, none(), false),
            // ErrorRecoveryLevel 2 (§11.5.1): the session reassigns the tasks of failed
            // connections before this; what reaches the connection is a task still allegiant
            // to it (§11.6.1: 3) or none the session knows.
            TmfFunction::TASK_REASSIGN if self.params.error_recovery_level >= 2 => {
                let rtt = h.referenced_task_tag;
                if self.tasks.contains_key(&rtt) || self.retained.has(rtt) {
                    (TmfResponse::TASK_STILL_ALLEGIANT, none(), false)
                } else {
                    (TmfResponse::TASK_DOES_NOT_EXIST, none(), false)
                }
            }
            TmfFunction::TASK_REASSIGN => (
                TmfResponse::TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED,
                none(),
                false,
            ),
            _ => (TmfResponse::FUNCTION_REJECTED, none(), false),
        };
        self.held_tmfs.push(HeldTmf {
            itt: h.itt,
            response,
            waiting,
            close,
            driver,
        });
        self.release_held(RESERVED_TAG);
    }

    /// Tells the driver which aborted running tasks belong to pass-through LUNs
    /// ([`Event::Abort`]).
    pub(super) fn forward_aborts(&mut self, dir: &dyn LunDirectory<D>, aborted: &HashSet<u32>) {
        let mut itts: Vec<u32> = aborted
            .iter()
            .copied()
            .filter(|i| self.tasks.get(i).is_some_and(|t| dir.passthrough(t.lun)))
            .collect();
        if !itts.is_empty() {
            itts.sort_unstable();
            self.events.push_back(Event::Abort { itts });
        }
    }

    /// The driver's outcome of a LOGICAL UNIT RESET it was asked to answer
    /// ([`Event::Reset`] with `answer`): `FUNCTION_COMPLETE` once the LU was reset, or the
    /// response that says why not (RFC 7143 §11.6.1). The response still waits for the
    /// connection's aborted tasks to finish. Unknown ITTs are ignored (false).
    pub fn reset_done(&mut self, tmf_itt: u32, response: TmfResponse) -> bool {
        let Some(t) = self
            .held_tmfs
            .iter_mut()
            .find(|t| t.itt == tmf_itt && t.driver)
        else {
            return false;
        };
        t.driver = false;
        t.response = response;
        self.release_held(RESERVED_TAG);
        true
    }

    /// Sends the TMF responses no longer waiting for `done` (or anything).
    pub(super) fn release_held(&mut self, done: u32) {
        let mut i = 0;
        while i < self.held_tmfs.len() {
            self.held_tmfs[i].waiting.remove(&done);
            if self.held_tmfs[i].waiting.is_empty() && !self.held_tmfs[i].driver {
                let t = self.held_tmfs.remove(i);
                self.send(TaskMgmtResponse {
                    response: t.response,
                    itt: t.itt,
                    stat_sn: 0,
                    exp_cmd_sn: 0,
                    max_cmd_sn: 0,
                });
                if t.close {
                    self.close(Side::Initiator, CloseReason::ColdReset);
                }
            } else {
                i += 1;
            }
        }
    }
}
