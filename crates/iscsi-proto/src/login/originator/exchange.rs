//! The originator's login as PDUs (RFC 7143 §6.3, §11.12–§11.13): [`LoginExchange`] wraps the
//! key-level [`LoginMachine`] and does what a driver would otherwise do by hand — it builds
//! each Login Request (ISID, TSIH, ITT, CID, CmdSN, ExpStatSN, the stage bits), answers a
//! response continued over several PDUs (C=1) with an empty request, caps a response's text
//! at [`LOGIN_TEXT_LIMIT`], tracks StatSN, and shows every Login PDU to the extension (Seal
//! binds the whole login, docs/seal.md §3). The driver only moves PDUs:
//!
//! ```text
//! poll_transmit() -> Login Request ─► socket ─► ... ─► Login Response -> handle_pdu()
//!   LoginProgress::Send            : poll_transmit again
//!   LoginProgress::RelayChallenge  : relayed CHAP, answer with relay_response()
//!   LoginProgress::Done(LoginDone) : full feature phase, with the sequence numbers to start at
//! ```

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{LoginRequest, Stage};
use iscsi_wire::{Header, Pdu};

use super::{
    Established, LoginMachine, LoginNext, LoginReply, LoginStep, OriginatorError,
    OriginatorExtension, PduDir,
};
use crate::chap::ChapAlgorithm;

type Result<T, E = OriginatorError> = std::result::Result<T, E>;

/// The most text one Login Response may carry over all its continued PDUs: 64 KiB, a bound of
/// ours (the key=value list of a login is small; without a bound a target could continue it
/// forever, RFC 7143 §11.13.3).
pub const LOGIN_TEXT_LIMIT: usize = 64 * 1024;

/// A random ISID in the "random" qualifier format, T=10b (RFC 7143 §11.12.5; the EN format
/// would need an enterprise number).
#[must_use]
pub fn random_isid() -> [u8; 6] {
    use rand::RngCore;
    let mut isid = [0u8; 6];
    rand::rngs::OsRng.fill_bytes(&mut isid);
    isid[0] = 0x80 | (isid[0] & 0x3f);
    isid
}

/// A finished login and where full feature phase starts (RFC 7143 §4.2.2, §11.13).
#[derive(Debug)]
pub struct LoginDone {
    pub established: Box<Established>,
    /// The final response's ExpCmdSN: the CmdSN of the first command.
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    /// The final response's StatSN + 1.
    pub exp_stat_sn: u32,
}

/// What the exchange needs after a PDU was handled.
#[derive(Debug)]
pub enum LoginProgress {
    /// A request is ready: [`LoginExchange::poll_transmit`].
    Send,
    /// Relayed CHAP ([`LoginMachine::start_relayed`]): the target's challenge, to be answered
    /// through [`LoginExchange::relay_response`].
    RelayChallenge {
        algorithm: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    /// Full feature phase.
    Done(LoginDone),
}

/// The originator's login over PDUs, one connection, sans-IO.
#[derive(Debug)]
pub struct LoginExchange<X: ?Sized + OriginatorExtension = dyn OriginatorExtension> {
    machine: LoginMachine<X>,
    isid: [u8; 6],
    /// Our ITT for every Login Request of this login (RFC 7143 §11.12.7).
    itt: u32,
    /// Login requests carry the same CmdSN throughout (RFC 7143 §11.12.8).
    cmd_sn: u32,
    /// 0 until the first response, then its StatSN + 1 (RFC 7143 §11.12.8).
    exp_stat_sn: u32,
    /// The stage of the request in flight: a continuation request repeats it.
    csg: Stage,
    /// The text of the response being received, over its continued PDUs.
    text: BytesMut,
    out: VecDeque<Pdu>,
    done: bool,
}

impl<X: ?Sized + OriginatorExtension> LoginExchange<X> {
    /// A login of `machine` (its extension already attached) whose first request is `first`,
    /// for the session `isid` with TSIH 0 (a new session, or a reinstating login of the same
    /// ISID: RFC 7143 §6.3.5) and CID 0, or the session's TSIH and a CID of its own when the
    /// machine's options join a running session ([`super::LoginOptions::join`], §5.3.4); ITT 0
    /// and CmdSN 1.
    pub fn new(machine: LoginMachine<X>, first: LoginStep, isid: [u8; 6]) -> Self {
        let mut x = Self {
            machine,
            isid,
            itt: 0,
            cmd_sn: 1,
            exp_stat_sn: 0,
            csg: first.csg,
            text: BytesMut::new(),
            out: VecDeque::new(),
            done: false,
        };
        x.queue(&first);
        x
    }

    fn request(&self, transit: bool, csg: Stage, nsg: Stage) -> LoginRequest {
        LoginRequest {
            transit,
            continue_: false,
            csg,
            // NSG is reserved unless T=1 (RFC 7143 §11.12.3).
            nsg: if transit { nsg } else { Stage(0) },
            version_max: 0,
            version_min: 0,
            isid: self.isid,
            tsih: self.machine.opts.join.map_or(0, |j| j.tsih),
            itt: self.itt,
            cid: self.machine.opts.join.map_or(0, |j| j.cid),
            cmd_sn: self.cmd_sn,
            exp_stat_sn: self.exp_stat_sn,
        }
    }

    fn queue(&mut self, step: &LoginStep) {
        self.csg = step.csg;
        let data = iscsi_wire::text::encode(&step.keys).freeze();
        let req = self.request(step.transit, step.csg, step.nsg);
        self.out.push_back(Pdu::new(req, data));
    }

    /// The next Login Request to send, shown to the extension as it leaves.
    pub fn poll_transmit(&mut self) -> Option<Pdu> {
        let pdu = self.out.pop_front()?;
        if let Some(e) = self.machine.extension_mut() {
            e.observe_pdu(PduDir::Sent, &pdu);
        }
        Some(pdu)
    }

    /// One PDU from the target. A Login Response with C=1 is answered with an empty request
    /// for the rest (RFC 7143 §6.3, §11.13.3); a whole response goes to the machine.
    pub fn handle_pdu(&mut self, pdu: &Pdu) -> Result<LoginProgress> {
        if let Some(e) = self.machine.extension_mut() {
            e.observe_pdu(PduDir::Received, pdu);
        }
        let Header::LoginResponse(r) = &pdu.header else {
            return Err(OriginatorError::UnexpectedPdu {
                got: format!("{:?}", pdu.header.opcode()),
            });
        };
        if self.done {
            return Err(OriginatorError::UnexpectedPdu {
                got: "a Login Response after the login ended".into(),
            });
        }
        self.exp_stat_sn = r.stat_sn.wrapping_add(1);
        self.text.extend_from_slice(&pdu.data);
        if self.text.len() > LOGIN_TEXT_LIMIT {
            return Err(OriginatorError::TextTooLong {
                limit: LOGIN_TEXT_LIMIT,
            });
        }
        if r.continue_ && r.status_class == 0 {
            let more = self.request(false, self.csg, Stage(0));
            self.out.push_back(Pdu::new(more, Bytes::new()));
            return Ok(LoginProgress::Send);
        }
        let text = std::mem::take(&mut self.text);
        let reply = LoginReply {
            transit: r.transit,
            csg: r.csg,
            nsg: r.nsg,
            status_class: r.status_class,
            status_detail: r.status_detail,
            tsih: r.tsih,
            keys: iscsi_wire::text::parse(&text)?,
        };
        let (exp_cmd_sn, max_cmd_sn) = (r.exp_cmd_sn, r.max_cmd_sn);
        match self.machine.handle(reply) {
            Ok(LoginNext::Send(step)) => {
                self.queue(&step);
                Ok(LoginProgress::Send)
            }
            Ok(LoginNext::RelayChallenge {
                algorithm,
                id,
                challenge,
            }) => Ok(LoginProgress::RelayChallenge {
                algorithm,
                id,
                challenge,
            }),
            Ok(LoginNext::Done(established)) => {
                self.done = true;
                Ok(LoginProgress::Done(LoginDone {
                    established,
                    exp_cmd_sn,
                    max_cmd_sn,
                    exp_stat_sn: self.exp_stat_sn,
                }))
            }
            Err(e) => {
                self.done = true;
                Err(e)
            }
        }
    }

    /// Relayed CHAP: the host's answer to the challenge [`LoginProgress::RelayChallenge`]
    /// gave; the request carrying it is then ready.
    pub fn relay_response(
        &mut self,
        name: &str,
        response: &[u8],
        mutual: Option<(u8, Vec<u8>)>,
    ) -> Result<()> {
        let step = self.machine.relay_response(name, response, mutual)?;
        self.queue(&step);
        Ok(())
    }

    /// Relayed CHAP: `Some` once the target accepted the relayed response (taken once).
    pub fn take_relay_verdict(&mut self) -> Option<Option<(String, Vec<u8>)>> {
        self.machine.take_relay_verdict()
    }

    /// The extension, e.g. to collect what it negotiated after a successful login.
    pub fn extension_mut(&mut self) -> Option<&mut X> {
        self.machine.extension_mut()
    }

    /// The ISID this login uses.
    pub fn isid(&self) -> [u8; 6] {
        self.isid
    }
}

#[cfg(test)]
mod tests;
