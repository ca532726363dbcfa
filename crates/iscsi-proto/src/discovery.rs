//! The originator's discovery session after login, sans-IO: `SendTargets=All` over Text
//! Requests (RFC 7143 §11.10–§11.11, Appendix D), answers continued over several Text
//! Responses with a Target Transfer Tag, then the session's Logout (§11.14–§11.15).
//!
//! ```text
//! Text Request  SendTargets=All, TTT=0xffffffff, F=1   ─►
//!                                                      ◄─  Text Response F=0, TTT=t (part)
//! Text Request  (empty), TTT=t, CmdSN+1                 ─►
//!                                                      ◄─  Text Response F=1 (the rest)
//! Logout Request  close the session, immediate          ─►   (DiscoveryEvent::Targets)
//!                                                      ◄─  Logout Response (DiscoveryEvent::LoggedOut)
//! ```
//!
//! The driver moves PDUs ([`Discovery::poll_transmit`], [`Discovery::handle_pdu`]) and bounds
//! the whole exchange in time; waiting for the Logout Response is best effort
//! ([`LOGOUT_GRACE`]): it changes nothing for the caller.

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{LogoutReason, LogoutRequest, TextRequest};
use iscsi_wire::{Header, Pdu, RESERVED_TAG};

/// The most text a SendTargets answer may carry over all its PDUs.
pub const SEND_TARGETS_LIMIT: usize = 1024 * 1024;

/// The most Text Responses one answer may take: an answer of empty PDUs ends too.
pub const SEND_TARGETS_MAX_PDUS: usize = 4096;

/// How long a driver waits for the Logout Response before closing anyway.
pub const LOGOUT_GRACE: Duration = Duration::from_secs(2);

/// ITT of the SendTargets exchange and of the Logout.
const TEXT_ITT: u32 = 1;
const LOGOUT_ITT: u32 = 2;

/// A target found by SendTargets discovery (RFC 7143 Appendix D).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveredTarget {
    pub name: String,
    /// `TargetAddress` values: `host:port,portal-group-tag`.
    pub addresses: Vec<String>,
}

/// An answer the target should not have sent: the discovery fails (connection scope).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DiscoveryError {
    /// A PDU other than the one the exchange waits for.
    #[error("expected a {expected}, got {got}")]
    UnexpectedPdu { expected: &'static str, got: String },
    /// A response for another task than ours.
    #[error("Text Response for ITT {got:#x}, ours is {ours:#x}")]
    WrongItt { got: u32, ours: u32 },
    /// A response that continues (F=0) without a Target Transfer Tag to continue with
    /// (RFC 7143 §11.11.4), or that sets C=1 and F=1 together (§11.11.2).
    #[error("Text Response with F={final_}, C={continue_} and TTT {ttt:#x}")]
    BadContinuation {
        final_: bool,
        continue_: bool,
        ttt: u32,
    },
    /// The answer grew past [`SEND_TARGETS_LIMIT`] or [`SEND_TARGETS_MAX_PDUS`].
    #[error("SendTargets answer over 1 MiB or {SEND_TARGETS_MAX_PDUS} PDUs")]
    TooLong,
    /// The answer's text is not a key=value list (RFC 7143 §6.1).
    #[error("SendTargets answer: {0}")]
    Text(#[from] iscsi_wire::WireError),
    /// A `TargetAddress` before any `TargetName` (RFC 7143 Appendix D: addresses follow
    /// the name they belong to).
    #[error("TargetAddress {0:?} before any TargetName")]
    AddressWithoutName(String),
    /// The target rejected our request (RFC 7143 §11.17).
    #[error("target rejected the Text Request (reason {0:#04x})")]
    Rejected(u8),
}

/// What the exchange reached after a PDU.
#[derive(Debug, PartialEq, Eq)]
pub enum DiscoveryEvent {
    /// More to send ([`Discovery::poll_transmit`]) or to wait for.
    Pending,
    /// The whole answer; the Logout Request is ready to send.
    Targets(Vec<DiscoveredTarget>),
    /// The target answered the Logout (its response code, RFC 7143 §11.15.1): close.
    LoggedOut(u8),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Text,
    Logout,
    Done,
}

/// A discovery session's SendTargets exchange and logout, from the sequence numbers login
/// ended with.
#[derive(Debug)]
pub struct Discovery {
    state: State,
    cmd_sn: u32,
    exp_stat_sn: u32,
    text: BytesMut,
    pdus: usize,
    out: VecDeque<Pdu>,
}

impl Discovery {
    /// Starts with `cmd_sn` (the final Login Response's ExpCmdSN) and `exp_stat_sn` (its StatSN
    /// + 1); the `SendTargets=All` request is ready.
    #[must_use]
    pub fn new(cmd_sn: u32, exp_stat_sn: u32) -> Self {
        let mut d = Self {
            state: State::Text,
            cmd_sn,
            exp_stat_sn,
            text: BytesMut::new(),
            pdus: 0,
            out: VecDeque::new(),
        };
        let data = iscsi_wire::text::encode(&[("SendTargets", "All")]).freeze();
        d.text_request(RESERVED_TAG, data);
        d
    }

    fn text_request(&mut self, ttt: u32, data: Bytes) {
        let req = TextRequest {
            immediate: false,
            final_: true,
            continue_: false,
            lun: 0,
            itt: TEXT_ITT,
            ttt,
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        };
        self.out.push_back(Pdu::new(req, data));
    }

    /// The next request to send.
    pub fn poll_transmit(&mut self) -> Option<Pdu> {
        self.out.pop_front()
    }

    /// Whether the exchange is over (logged out, or failed).
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// One PDU from the target.
    pub fn handle_pdu(&mut self, pdu: &Pdu) -> Result<DiscoveryEvent, DiscoveryError> {
        let r = self.step(pdu);
        if r.is_err() {
            self.state = State::Done;
            self.out.clear();
        }
        r
    }

    fn step(&mut self, pdu: &Pdu) -> Result<DiscoveryEvent, DiscoveryError> {
        match (self.state, &pdu.header) {
            (State::Text, Header::TextResponse(r)) => {
                if r.itt != TEXT_ITT {
                    return Err(DiscoveryError::WrongItt {
                        got: r.itt,
                        ours: TEXT_ITT,
                    });
                }
                let more = !r.final_;
                if (more && r.ttt == RESERVED_TAG) || (r.final_ && r.continue_) {
                    return Err(DiscoveryError::BadContinuation {
                        final_: r.final_,
                        continue_: r.continue_,
                        ttt: r.ttt,
                    });
                }
                self.exp_stat_sn = r.stat_sn.wrapping_add(1);
                self.pdus += 1;
                self.text.extend_from_slice(&pdu.data);
                if self.text.len() > SEND_TARGETS_LIMIT || self.pdus > SEND_TARGETS_MAX_PDUS {
                    return Err(DiscoveryError::TooLong);
                }
                // The next request, continuing or not, takes the next CmdSN (§11.10: a
                // non-immediate request).
                self.cmd_sn = self.cmd_sn.wrapping_add(1);
                if more {
                    // Continue: an empty request echoing the target's TTT (§11.10.4).
                    self.text_request(r.ttt, Bytes::new());
                    return Ok(DiscoveryEvent::Pending);
                }
                let targets = parse_targets(&self.text)?;
                self.text.clear();
                // Immediate: it carries the CmdSN without advancing it (RFC 7143 §4.2.2).
                let req = LogoutRequest {
                    immediate: true,
                    reason: LogoutReason::CLOSE_SESSION,
                    itt: LOGOUT_ITT,
                    cid: 0,
                    cmd_sn: self.cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                };
                self.out.push_back(Pdu::new(req, Bytes::new()));
                self.state = State::Logout;
                Ok(DiscoveryEvent::Targets(targets))
            }
            (State::Text, Header::Reject(r)) => Err(DiscoveryError::Rejected(r.reason.0)),
            (State::Logout, Header::LogoutResponse(r)) if r.itt == LOGOUT_ITT => {
                self.state = State::Done;
                Ok(DiscoveryEvent::LoggedOut(r.response))
            }
            (State::Logout, _) => {
                // Whatever else comes while we leave is not ours to judge: the target may
                // still send an asynchronous message or a NOP-In.
                Ok(DiscoveryEvent::Pending)
            }
            (state, h) => Err(DiscoveryError::UnexpectedPdu {
                expected: match state {
                    State::Text => "Text Response",
                    _ => "nothing",
                },
                got: format!("{:?}", h.opcode()),
            }),
        }
    }
}

/// `TargetName` starts a target, the `TargetAddress` values after it are its portals
/// (RFC 7143 Appendix D); other keys are ignored.
fn parse_targets(text: &[u8]) -> Result<Vec<DiscoveredTarget>, DiscoveryError> {
    let mut out: Vec<DiscoveredTarget> = Vec::new();
    for (k, v) in iscsi_wire::text::parse(text)? {
        match k.as_str() {
            "TargetName" => out.push(DiscoveredTarget {
                name: v,
                addresses: Vec::new(),
            }),
            "TargetAddress" => match out.last_mut() {
                Some(t) => t.addresses.push(v),
                None => return Err(DiscoveryError::AddressWithoutName(v)),
            },
            _ => {}
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests;
