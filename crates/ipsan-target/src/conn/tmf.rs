//! Task management that reaches the logical units (SAM-5 §7, RFC 7143 §11.5): the aborts of
//! forwarded commands and the LU and target resets, for a session's LUs served here and for
//! the remote LUs a gateway forwards to. The engine decides which tasks a TMF affects and
//! when its response may leave; this file does what the units must do.

use std::sync::Arc;

use ipsan_scsi::{decode_lun, ResetKind};
use iscsi_wire::header::{TmfFunction, TmfResponse};
use tracing::info;

use super::{unit, Session};
use crate::lock;
use crate::remote::RemoteSpec;

impl Session {
    /// The host aborted these forwarded commands (ABORT TASK, ABORT TASK SET, CLEAR TASK
    /// SET): each is aborted on the remote session too (RFC 7143 §11.5.1), so the host's TMF
    /// response, held by the engine until the command ends, does not wait for the remote
    /// command to run to its end. Their statuses never reach the host (the engine suppresses
    /// them).
    pub(super) fn abort_forwarded(&self, itts: &[u32]) {
        let e = self.engine();
        let mut f = lock(&self.core.forwarded);
        for &itt in itts {
            // Not registered yet (its task has not reached `forward`): registered cancelled,
            // so it is never sent. Completed already: nothing to abort. A task this
            // connection does not hold (reassigned, or its connection gone: ErrorRecoveryLevel
            // 2) is aborted if it is being forwarded.
            if e.is_running(itt) {
                f.entry(itt).or_default().cancel();
            } else if let Some(t) = f.get(&itt) {
                t.cancel();
            }
        }
    }

    /// A task management function reaching the logical units (SAM-5 §7). `answer`: the TMF
    /// whose response waits for the outcome of a forwarded LOGICAL UNIT RESET.
    pub(super) fn reset(
        self: &Arc<Self>,
        function: TmfFunction,
        raw_lun: u64,
        answer: Option<u32>,
    ) {
        let lun = decode_lun(raw_lun.to_be_bytes());
        info!(function = function.0, lun, "task management reset");
        let Some(t) = self.target() else {
            if let Some(itt) = answer {
                self.reset_done(itt, TmfResponse::LUN_DOES_NOT_EXIST);
            }
            return;
        };
        let kind = match function {
            TmfFunction::LOGICAL_UNIT_RESET => {
                let unit = unit::Unit::resolve(Some(&*t), lun, &[]);
                match unit.lun_reset(&self.nexus, self.remote.as_ref()) {
                    unit::Reset::Now(r) => {
                        if let Some(itt) = answer {
                            self.reset_done(itt, r);
                        }
                    }
                    unit::Reset::Forwarded(f) => {
                        let s = self.clone();
                        tokio::spawn(async move {
                            let r = f.await;
                            if let Some(itt) = answer {
                                s.reset_done(itt, r);
                            }
                        });
                    }
                }
                return;
            }
            TmfFunction::TARGET_COLD_RESET => ResetKind::TargetCold,
            _ => ResetKind::TargetWarm,
        };
        for lu in t.luns.values() {
            lu.reset(kind, &self.nexus);
        }
        if let Some(nexus) = self.remote.clone() {
            // ipsan's initiator sends no target reset: each remote LU is reset instead, what
            // a target reset does to every LU (SAM-5 §7.8).
            let remotes: Vec<Arc<RemoteSpec>> = t.remotes.values().cloned().collect();
            if !remotes.is_empty() {
                tokio::spawn(async move {
                    for spec in remotes {
                        nexus.lun_reset(&spec, spec.remote_lun()).await;
                    }
                });
            }
        }
    }

    /// Hands the outcome of a forwarded LOGICAL UNIT RESET to the engine, which answers the
    /// host once the reset's aborted tasks have ended too.
    fn reset_done(&self, itt: u32, response: TmfResponse) {
        self.engine().reset_done(itt, response);
        self.wake_writer.notify_one();
    }
}
