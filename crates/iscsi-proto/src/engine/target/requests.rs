//! The target connection's other requests: NOP-Out (§11.18), Text Requests with
//! continuation (§11.10, answered by [`super::super::text`]) and Logout (§11.14).

use std::time::Instant;

use bytes::Bytes;
use iscsi_wire::header::{
    LogoutReason, LogoutRequest, LogoutResponse, NopIn, NopOut, RejectReason, TextRequest,
    TextResponse,
};
use iscsi_wire::RESERVED_TAG;

use super::{Connection, LunDirectory, TaskState, MAX_TEXT};
use crate::engine::{CloseReason, Side};

impl<D> Connection<D> {
    /// The answer to a Text Request (one final Text Response).
    pub(super) fn text_response(&mut self, itt: u32, lun: u64, answer: &[(String, String)]) {
        let body = iscsi_wire::text::encode(answer).freeze();
        self.send_with(
            TextResponse {
                final_: true,
                continue_: false,
                lun,
                itt,
                ttt: RESERVED_TAG,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
            },
            body,
        );
    }

    pub(super) fn on_nop_out(&mut self, h: &NopOut, data: Bytes) {
        if h.itt == RESERVED_TAG {
            // The answer to our ping (§11.18.3); carries no CmdSN to admit.
            if self.ping.is_some_and(|p| p.ttt == h.ttt) {
                self.ping = None;
            }
            return;
        }
        if !self.admit(h.cmd_sn, h.immediate, false) {
            return;
        }
        // Echo the ping data (§11.19: the NOP-In returns the NOP-Out's data).
        self.send_with(
            NopIn {
                lun: h.lun,
                itt: h.itt,
                ttt: RESERVED_TAG,
                ..NopIn::default()
            },
            data,
        );
    }

    pub(super) fn on_text(
        &mut self,
        dir: &dyn LunDirectory<D>,
        h: &TextRequest,
        data: &[u8],
        raw: &[u8; 48],
    ) {
        if !self.admit(h.cmd_sn, h.immediate, false) {
            return;
        }
        if self.text_partial.len() + data.len() > MAX_TEXT {
            self.text_partial.clear();
            self.reject(RejectReason::PROTOCOL_ERROR, raw);
            return;
        }
        self.text_partial.extend_from_slice(data);
        if h.continue_ {
            let ttt = self.ttt.next_tag();
            self.send(TextResponse {
                final_: false,
                continue_: false,
                lun: h.lun,
                itt: h.itt,
                ttt,
                stat_sn: 0,
                exp_cmd_sn: 0,
                max_cmd_sn: 0,
            });
            return;
        }
        let text = std::mem::take(&mut self.text_partial);
        let Ok(keys) = iscsi_wire::text::parse(&text) else {
            self.reject(RejectReason::PROTOCOL_ERROR, raw);
            return;
        };
        for (k, v) in &keys {
            if k == "MaxRecvDataSegmentLength" {
                // Declarative, may change in full feature phase (§13.12).
                self.params.apply(k, v, crate::params::Side::Initiator);
            }
        }
        let answer = crate::engine::text::answer(
            &keys,
            &self.params.initiator_name,
            self.params.target_name.as_deref(),
            dir.directory(),
        );
        self.text_response(h.itt, h.lun, &answer);
    }

    pub(super) fn on_logout(&mut self, now: Instant, h: &LogoutRequest) {
        if !self.admit(h.cmd_sn, h.immediate, false) {
            return;
        }
        let response = match h.reason {
            LogoutReason::CLOSE_SESSION => {
                if !self.siblings.is_empty() {
                    self.logout_of = Some(None);
                }
                0
            }
            LogoutReason::CLOSE_CONNECTION if h.cid == self.cid => 0,
            LogoutReason::CLOSE_CONNECTION if self.siblings.contains(&h.cid) => {
                // Another connection of the session (§11.14.3, connection cleanup): the
                // session closes it; this one answers and stays.
                self.logout_of = Some(Some(h.cid));
                self.send(LogoutResponse {
                    response: 0,
                    itt: h.itt,
                    ..LogoutResponse::default()
                });
                return;
            }
            LogoutReason::CLOSE_CONNECTION => 1,
            LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY
                if self.params.error_recovery_level >= 2 =>
            {
                self.logout_for_recovery(h);
                return;
            }
            _ => 2,
        };
        if response != 0 {
            self.send(LogoutResponse {
                response,
                itt: h.itt,
                ..LogoutResponse::default()
            });
            return;
        }
        // Commands still collecting data never run; running ones answer before the Logout
        // Response (§11.14: the logout closes the connection after its tasks).
        let collecting: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, t)| matches!(t.state, TaskState::Collecting(_)))
            .map(|(i, _)| *i)
            .collect();
        for itt in collecting {
            if let Some(t) = self.tasks.remove(&itt) {
                if t.counted {
                    self.window.complete();
                }
            }
        }
        self.logout = Some((h.itt, now + self.drain_timeout));
        if !self.any_running() {
            self.answer_logout();
        }
    }

    pub(super) fn answer_logout(&mut self) {
        let Some((itt, _)) = self.logout.take() else {
            return;
        };
        self.send(LogoutResponse {
            response: 0,
            itt,
            ..LogoutResponse::default()
        });
        self.close(Side::Initiator, CloseReason::Logout);
    }
}
