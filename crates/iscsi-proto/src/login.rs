//! The target side of login (RFC 7143 §6.3, §11.12–§11.13), as a state machine without I/O.
//!
//! ```text
//!   first Login Request
//!          │ version, InitiatorName, SessionType, TargetName checked; target looked up
//!          ▼
//!   SecurityNegotiation ── AuthMethod=None allowed ─┐
//!          │ AuthMethod=CHAP                          │
//!          ▼                                          │
//!   ChapExpectAlgorithm → ChapExpectResponse ─────────┤  (proof: `Authenticated`)
//!                                                     ▼
//!                                  LoginOperationalNegotiation
//!                                                     │ T=1, NSG=FullFeature
//!                                                     ▼
//!                                              FullFeature(LoginResult)
//! ```
//! Reaching operational negotiation or full feature phase needs an [`Authenticated`] value,
//! which only a verified CHAP response, a CHAP response another target verified for us
//! ([`Auth::Relay`], below) or a target configured without authentication can produce, so no
//! path skips authentication. The value is neither `Copy` nor `Clone` and only
//! this module makes one: a [`LoginResult`] (and the originator's
//! [`originator::Established`]) holds the one proof its login produced, so the full-feature
//! phase, built from those, cannot exist without it.
//!
//! **Relayed CHAP** ([`Auth::Relay`], a gateway's listening side, docs/gateway.md): the
//! engine does not judge the CHAP exchange itself but defers to its driver, which carries it
//! to another target (RFC 7143 §12.1.3 unchanged on both legs):
//!
//! ```text
//!   CHAP_A=<list>        ──► Outcome::Relay(Challenge{list})    driver: the remote target's
//!   CHAP_A,CHAP_I,CHAP_C ◄── relay_answer(Challenge{a, i, c})     CHAP_A/I/C for that list
//!   CHAP_N,CHAP_R[,I,C]  ──► Outcome::Relay(Response{n, r, ..})  driver: the remote target's
//!   [CHAP_N,CHAP_R]      ◄── relay_answer(Verified{mutual})        verdict (and mutual answer)
//! ```
//!
//! Only `Verified` (the remote target accepted the response) produces the proof; `Refused`
//! fails the login with the status given.
//!
//! The originator's side lives in [`originator`], folding the target's answers into the same
//! [`SessionParams`].

use std::collections::BTreeSet;

use iscsi_wire::header::{LoginRequest, LoginResponse, Stage};
use operational::encode;

use crate::chap::{ChallengeRecord, ChapAlgorithm, ChapSecret};
use crate::params::SessionParams;

mod operational;
pub mod originator;
mod security;

/// Login response status (RFC 7143 §11.13.5): class in the high byte, detail in the low.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LoginStatus(pub u16);

impl LoginStatus {
    pub const SUCCESS: Self = Self(0x0000);
    pub const INITIATOR_ERROR: Self = Self(0x0200);
    pub const AUTHENTICATION_FAILURE: Self = Self(0x0201);
    pub const AUTHORIZATION_FAILURE: Self = Self(0x0202);
    pub const NOT_FOUND: Self = Self(0x0203);
    pub const UNSUPPORTED_VERSION: Self = Self(0x0205);
    pub const TOO_MANY_CONNECTIONS: Self = Self(0x0206);
    pub const MISSING_PARAMETER: Self = Self(0x0207);
    pub const SESSION_TYPE_NOT_SUPPORTED: Self = Self(0x0209);
    pub const SESSION_DOES_NOT_EXIST: Self = Self(0x020a);
    pub const INVALID_DURING_LOGIN: Self = Self(0x020b);
    pub const TARGET_ERROR: Self = Self(0x0300);
    pub const SERVICE_UNAVAILABLE: Self = Self(0x0301);
    pub const OUT_OF_RESOURCES: Self = Self(0x0302);

    #[must_use]
    pub fn class(self) -> u8 {
        (self.0 >> 8) as u8
    }
    #[must_use]
    pub fn detail(self) -> u8 {
        self.0 as u8
    }
}

/// Why a login failed: the status for the initiator and a reason for the target's log. The
/// reason never contains a secret.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("login failed ({:#06x}): {reason}", status.0)]
pub struct LoginFailure {
    pub status: LoginStatus,
    pub reason: String,
}

impl LoginFailure {
    pub fn new(status: LoginStatus, reason: impl Into<String>) -> Self {
        Self {
            status,
            reason: reason.into(),
        }
    }
}

/// How initiators must authenticate to a target (or to discovery).
#[derive(Clone, Debug, Default)]
pub enum Auth {
    /// No authentication (AuthMethod=None).
    #[default]
    None,
    /// CHAP (RFC 7143 §12.1.3), one-way or mutual.
    Chap(ChapPolicy),
    /// CHAP, judged by another target: the driver relays the challenge, the response and the
    /// verdict ([`RelayRequest`], [`RelayAnswer`]); this engine holds no secret.
    Relay,
}

/// What a login under [`Auth::Relay`] needs from its driver ([`Outcome::Relay`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayRequest {
    /// The initiator offered these CHAP algorithms (CHAP_A, its order): answer with
    /// [`RelayAnswer::Challenge`], the other target's choice and challenge for this offer.
    Challenge { algorithms: Vec<ChapAlgorithm> },
    /// The initiator's answer to that challenge (CHAP_N, CHAP_R) and, for mutual CHAP, its
    /// own challenge (CHAP_I, CHAP_C): answer with the other target's verdict.
    Response {
        name: String,
        response: Vec<u8>,
        mutual: Option<(u8, Vec<u8>)>,
    },
}

/// The driver's answer to a [`RelayRequest`], given to [`TargetLogin::relay_answer`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RelayAnswer {
    /// The other target's CHAP_A, CHAP_I and CHAP_C.
    Challenge {
        algorithm: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    /// The other target accepted the response; for mutual CHAP, its CHAP_N and CHAP_R.
    Verified { mutual: Option<(String, Vec<u8>)> },
    /// The other target refused (or could not be asked): the login fails with this.
    Refused(LoginFailure),
}

/// CHAP credentials a target checks, and optionally the ones it answers with (mutual CHAP).
#[derive(Clone, Debug)]
pub struct ChapPolicy {
    /// The name the initiator must send in CHAP_N.
    pub user: String,
    pub secret: ChapSecret,
    /// For mutual CHAP: the name and secret the target answers the initiator's challenge with.
    pub mutual: Option<(String, ChapSecret)>,
    /// Algorithms accepted, strongest first.
    pub algorithms: Vec<ChapAlgorithm>,
}

/// What the runtime knows about the target an initiator asked for.
#[derive(Clone, Debug)]
pub struct TargetPolicy {
    pub auth: Auth,
    pub portal_group_tag: u16,
    pub alias: Option<String>,
}

/// The target's limits and preferences for operational keys (RFC 7143 §13), tuned for long
/// links: ImmediateData and InitialR2T=No when the initiator agrees, large bursts, several R2Ts.
#[derive(Clone, Debug)]
pub struct TargetOffer {
    pub header_digest: &'static str,
    pub data_digest: &'static str,
    pub max_recv_data_segment_length: u32,
    pub max_burst_length: u32,
    pub first_burst_length: u32,
    pub max_outstanding_r2t: u32,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    /// Commands the session may have in flight: MaxCmdSN in the final response is
    /// CmdSN + depth - 1 (RFC 7143 §4.2.2.1).
    pub cmd_window: u32,
    /// Connections a session may have (MaxConnections, RFC 7143 §13.2: the session gets the
    /// lower of both offers). 1 unless the driver runs sessions of several connections
    /// ([`crate::engine::target::session::Session`]).
    pub max_connections: u32,
    /// The highest ErrorRecoveryLevel the target accepts (RFC 7143 §13.20: the session gets
    /// the lower of both offers, so an initiator offering 0, as the Linux initiator and
    /// libiscsi do, gets 0 whatever this is). 0 unless the driver keeps a failed connection's
    /// tasks for TASK REASSIGN (level 2, [`crate::engine::target::session::Session`]); level 1
    /// (SNACK, §11.16) is the target engine's own.
    pub error_recovery_level: u32,
}

impl Default for TargetOffer {
    fn default() -> Self {
        Self {
            header_digest: "None,CRC32C",
            data_digest: "None,CRC32C",
            max_recv_data_segment_length: 262_144,
            max_burst_length: 16_776_192,
            first_burst_length: 16_776_192,
            max_outstanding_r2t: 32,
            initial_r2t: false,
            immediate_data: true,
            cmd_window: 128,
            max_connections: 1,
            error_recovery_level: 0,
        }
    }
}

impl TargetOffer {
    fn ours(&self, key: &str) -> Option<String> {
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
        Some(match key {
            "HeaderDigest" => self.header_digest.to_owned(),
            "DataDigest" => self.data_digest.to_owned(),
            "MaxConnections" => self.max_connections.max(1).to_string(),
            "InitialR2T" => yn(self.initial_r2t),
            "ImmediateData" => yn(self.immediate_data),
            "MaxBurstLength" => self.max_burst_length.to_string(),
            "FirstBurstLength" => self.first_burst_length.to_string(),
            "DefaultTime2Wait" => "2".into(),
            "DefaultTime2Retain" => "20".into(),
            "MaxOutstandingR2T" => self.max_outstanding_r2t.to_string(),
            "DataPDUInOrder" | "DataSequenceInOrder" => "Yes".into(),
            "ErrorRecoveryLevel" => self.error_recovery_level.min(2).to_string(),
            "iSCSIProtocolLevel" => "1".into(),
            "IFMarker" | "OFMarker" => "No".into(),
            _ => return None,
        })
    }
}

/// Values a login extension (such as seal's vendor keys) needs to bind its answer to.
#[derive(Clone, Debug)]
pub struct ExtensionContext<'a> {
    pub initiator_name: &'a str,
    pub target_name: Option<&'a str>,
    pub isid: [u8; 6],
    /// Zero until the final response assigns it.
    pub tsih: u16,
}

/// A negotiation extension for vendor keys (RFC 7143 §13.5 allows `X-` keys).
pub trait Extension: Send + std::fmt::Debug {
    /// Whether this extension answers `key`.
    fn handles(&self, key: &str) -> bool;
    /// Answers the keys it handles from one request (operational stage).
    fn respond(
        &mut self,
        keys: &[(String, String)],
        ctx: &ExtensionContext<'_>,
    ) -> Result<Vec<(String, String)>, LoginFailure>;
    /// Called before the final response; may refuse the login (e.g. a required extension the
    /// initiator never negotiated) or add keys to the final response.
    fn finish(&mut self, ctx: &ExtensionContext<'_>)
        -> Result<Vec<(String, String)>, LoginFailure>;
}

/// The runtime's side of a login: target lookup, access control, TSIH assignment.
pub trait Directory {
    /// Finds the target a Normal session names and checks the initiator may use it.
    fn target(&self, target_name: &str, initiator_name: &str)
        -> Result<TargetPolicy, LoginFailure>;
    /// Authentication required for discovery sessions from this initiator.
    fn discovery(&self, initiator_name: &str) -> Result<TargetPolicy, LoginFailure>;
    /// Assigns the TSIH for a new session (`requested` = 0), or validates a requested one.
    fn assign_tsih(
        &mut self,
        isid: [u8; 6],
        initiator_name: &str,
        requested: u16,
    ) -> Result<u16, LoginFailure>;
}

/// Proof that the peer authenticated (or that no authentication was agreed). Only this module
/// makes one, and it is neither `Copy` nor `Clone`: it moves from the security stage into the
/// login's result.
#[derive(Debug)]
pub struct Authenticated(());

#[derive(Debug)]
enum State {
    /// Waiting for the first Login Request.
    Start,
    Security(SecurityState),
    Operational(Authenticated),
    Done,
}

#[derive(Debug)]
enum SecurityState {
    /// AuthMethod not yet agreed.
    Negotiating,
    /// AuthMethod=None agreed.
    NoAuth(Authenticated),
    /// AuthMethod=CHAP agreed, waiting for CHAP_A.
    ChapExpectAlgorithm,
    /// Challenge sent, waiting for CHAP_N/CHAP_R.
    ChapExpectResponse {
        alg: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
    /// Relayed CHAP: waiting for the driver's challenge for the initiator's CHAP_A offer.
    RelayAwaitChallenge {
        offered: Vec<ChapAlgorithm>,
    },
    /// Relayed CHAP: the challenge went out, waiting for CHAP_N/CHAP_R.
    RelayExpectResponse,
    /// Relayed CHAP: waiting for the driver's verdict; `mutual`: the initiator asked for
    /// mutual CHAP, so an accepting verdict must carry the other target's answer.
    RelayAwaitVerdict {
        mutual: bool,
    },
    Verified(Authenticated),
}

/// The result of a completed login.
#[derive(Debug)]
pub struct LoginResult {
    pub params: SessionParams,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub cid: u16,
    /// CmdSN of the login: the first CmdSN the command window expects.
    pub cmd_sn: u32,
    /// The StatSN for the first full-feature response.
    pub next_stat_sn: u32,
    /// The login's one proof of authentication: only this module can build a result.
    auth: Authenticated,
}

impl LoginResult {
    /// The proof that the initiator authenticated (or that no authentication was agreed).
    pub fn authenticated(&self) -> &Authenticated {
        &self.auth
    }
}

/// One step of the login: the response to send, and where the login stands.
#[derive(Debug)]
pub struct Reply {
    pub header: LoginResponse,
    pub data: Vec<u8>,
    pub outcome: Outcome,
}

#[derive(Debug)]
pub enum Outcome {
    /// Expect another Login Request.
    Continue,
    /// The login failed; close the connection after sending the reply.
    Failed(LoginFailure),
    /// Full feature phase begins after this reply.
    FullFeature(Box<LoginResult>),
    /// Relayed CHAP ([`Auth::Relay`]): nothing to send yet; get the answer to this request
    /// and pass it to [`TargetLogin::relay_answer`], whose reply is the one to send. This
    /// reply's header and data are placeholders and must not be sent.
    Relay(RelayRequest),
}

/// Target-side login for one connection.
#[derive(Debug)]
pub struct TargetLogin {
    state: State,
    offer: TargetOffer,
    params: SessionParams,
    policy: Option<TargetPolicy>,
    challenges: ChallengeRecord,
    extension: Option<Box<dyn Extension>>,
    /// Text from PDUs with the C bit, awaiting the rest (RFC 7143 §6.3: continuation).
    partial: Vec<u8>,
    isid: [u8; 6],
    tsih: u16,
    cid: u16,
    cmd_sn: u32,
    stat_sn: u32,
    negotiated: BTreeSet<String>,
    declared_mrdsl: bool,
    sent_tpgt: bool,
    /// Relayed CHAP: the request the current PDU raised, then that PDU (its header and the
    /// keys answered so far) while the driver gets the answer.
    relay: Option<RelayRequest>,
    deferred: Option<(LoginRequest, Vec<(String, String)>)>,
}

/// The longest login text we accept across continuations (RFC 7143 allows long values; this
/// bounds memory against an initiator that never clears the C bit).
const MAX_LOGIN_TEXT: usize = 64 * 1024;

impl TargetLogin {
    #[must_use]
    pub fn new(offer: TargetOffer, extension: Option<Box<dyn Extension>>) -> Self {
        Self {
            state: State::Start,
            offer,
            params: SessionParams::default(),
            policy: None,
            challenges: ChallengeRecord::new(),
            extension,
            partial: Vec::new(),
            isid: [0; 6],
            tsih: 0,
            cid: 0,
            cmd_sn: 0,
            stat_sn: 0,
            negotiated: BTreeSet::new(),
            declared_mrdsl: false,
            sent_tpgt: false,
            relay: None,
            deferred: None,
        }
    }

    /// The InitiatorName and TargetName the first request declared (empty / `None` before).
    #[must_use]
    pub fn declared(&self) -> (&str, Option<&str>) {
        (
            &self.params.initiator_name,
            self.params.target_name.as_deref(),
        )
    }

    /// Turns a reply this login produced into a refusal with `failure`'s status (RFC 7143
    /// §11.13.5): for the driver that learns only after the final step that the session
    /// cannot start (a quota, a remote target out of reach: 0x0301 "service unavailable",
    /// which the initiator retries later). The refusal keeps the reply's StatSN and ITT,
    /// carries no keys and no TSIH, and the login is over.
    #[must_use]
    pub fn refuse(&mut self, reply: Reply, failure: LoginFailure) -> Reply {
        self.state = State::Done;
        self.relay = None;
        self.deferred = None;
        let header = LoginResponse {
            transit: false,
            continue_: false,
            nsg: Stage(0),
            tsih: 0,
            status_class: failure.status.class(),
            status_detail: failure.status.detail(),
            ..reply.header
        };
        Reply {
            header,
            data: Vec::new(),
            outcome: Outcome::Failed(failure),
        }
    }

    fn fail(&mut self, req: &LoginRequest, failure: LoginFailure) -> Reply {
        self.state = State::Done;
        self.relay = None;
        self.deferred = None;
        let mut header = self.response_header(req, false, req.csg, req.csg);
        header.status_class = failure.status.class();
        header.status_detail = failure.status.detail();
        Reply {
            header,
            data: Vec::new(),
            outcome: Outcome::Failed(failure),
        }
    }

    /// Handles one Login Request and its data segment.
    pub fn handle(&mut self, req: &LoginRequest, data: &[u8], dir: &mut dyn Directory) -> Reply {
        if self.deferred.is_some() {
            return self.fail(
                req,
                LoginFailure::new(
                    LoginStatus::TARGET_ERROR,
                    "Login Request while a relayed CHAP step is pending",
                ),
            );
        }
        match self.step(req, data, dir) {
            Ok(reply) => reply,
            Err(failure) => self.fail(req, failure),
        }
    }

    /// A header that consumes no StatSN: the placeholder of an [`Outcome::Relay`] reply.
    fn bare_header(&self, isid: [u8; 6], itt: u32, csg: Stage) -> LoginResponse {
        LoginResponse {
            transit: false,
            continue_: false,
            csg,
            nsg: Stage(0),
            version_max: 0,
            version_active: 0,
            isid,
            tsih: self.tsih,
            itt,
            stat_sn: self.stat_sn,
            exp_cmd_sn: self.cmd_sn,
            max_cmd_sn: self.cmd_sn,
            status_class: 0,
            status_detail: 0,
        }
    }

    fn response_header(
        &mut self,
        req: &LoginRequest,
        transit: bool,
        csg: Stage,
        nsg: Stage,
    ) -> LoginResponse {
        let stat_sn = self.stat_sn;
        self.stat_sn = self.stat_sn.wrapping_add(1);
        LoginResponse {
            transit,
            continue_: false,
            csg,
            nsg: if transit { nsg } else { Stage(0) },
            version_max: 0,
            version_active: 0,
            isid: req.isid,
            tsih: self.tsih,
            itt: req.itt,
            stat_sn,
            exp_cmd_sn: self.cmd_sn,
            max_cmd_sn: self.cmd_sn,
            status_class: 0,
            status_detail: 0,
        }
    }

    fn step(
        &mut self,
        req: &LoginRequest,
        data: &[u8],
        dir: &mut dyn Directory,
    ) -> Result<Reply, LoginFailure> {
        let initiator_error = |why: &str| LoginFailure::new(LoginStatus::INITIATOR_ERROR, why);
        if matches!(self.state, State::Done) {
            return Err(initiator_error("login already finished"));
        }
        let first = matches!(self.state, State::Start);
        if first {
            // RFC 7143 §11.12.4: version 0 is the only one defined.
            if req.version_min > 0 {
                return Err(LoginFailure::new(
                    LoginStatus::UNSUPPORTED_VERSION,
                    format!("VersionMin {} unsupported", req.version_min),
                ));
            }
            self.isid = req.isid;
            self.tsih = req.tsih;
            self.cid = req.cid;
            self.cmd_sn = req.cmd_sn;
            self.stat_sn = req.exp_stat_sn;
        } else if req.isid != self.isid || req.tsih != self.tsih || req.cid != self.cid {
            // §11.12: these stay fixed for the whole login.
            return Err(initiator_error("ISID, TSIH or CID changed during login"));
        }
        if req.csg == Stage(2) || (req.transit && (req.nsg == Stage(2) || req.nsg <= req.csg)) {
            return Err(initiator_error("invalid CSG/NSG"));
        }
        let stage_ok = match &self.state {
            State::Start => true,
            State::Security(_) => {
                req.csg == Stage::SECURITY_NEGOTIATION
                    || req.csg == Stage::LOGIN_OPERATIONAL_NEGOTIATION
            }
            State::Operational(_) => req.csg == Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            State::Done => false,
        };
        if !stage_ok || req.csg == Stage::FULL_FEATURE_PHASE {
            return Err(initiator_error("Login Request for a stage already left"));
        }

        // Reassemble continued text (C bit): answer with an empty response and wait.
        if self.partial.len() + data.len() > MAX_LOGIN_TEXT {
            return Err(initiator_error("login text too long"));
        }
        self.partial.extend_from_slice(data);
        if req.continue_ {
            if first {
                self.state = State::Security(SecurityState::Negotiating);
            }
            let header = self.response_header(req, false, req.csg, req.csg);
            return Ok(Reply {
                header,
                data: Vec::new(),
                outcome: Outcome::Continue,
            });
        }
        let text = std::mem::take(&mut self.partial);
        let keys = iscsi_wire::text::parse(&text)
            .map_err(|e| initiator_error(&format!("malformed login text: {e}")))?;

        let mut out: Vec<(String, String)> = Vec::new();
        // The first *complete* request decides the policy: a first PDU sent in pieces (C bit)
        // must not skip the directory lookup (issue 8: that let AuthMethod=None through).
        if self.policy.is_none() {
            self.first_request(&keys, dir, &mut out)?;
        }

        // Leaving the security stage directly for operational or full feature phase.
        if req.csg == Stage::LOGIN_OPERATIONAL_NEGOTIATION
            && matches!(self.state, State::Security(_))
        {
            let no_auth = self.requires_no_auth();
            // The proof moves from the security state into the operational one.
            let proof = match std::mem::replace(&mut self.state, State::Done) {
                State::Security(SecurityState::NoAuth(p) | SecurityState::Verified(p)) => p,
                State::Security(SecurityState::Negotiating) if no_auth => Authenticated(()),
                other => {
                    self.state = other;
                    return Err(LoginFailure::new(
                        LoginStatus::AUTHENTICATION_FAILURE,
                        "operational stage requested before authentication",
                    ));
                }
            };
            self.state = State::Operational(proof);
        }

        match req.csg {
            Stage::SECURITY_NEGOTIATION => self.security_keys(&keys, &mut out)?,
            _ => self.operational_keys(&keys, &mut out)?,
        }
        if let Some(r) = self.relay.take() {
            // The rest of this PDU waits for the driver's answer (relay_answer).
            self.deferred = Some((req.clone(), out));
            let header = self.bare_header(req.isid, req.itt, req.csg);
            return Ok(Reply {
                header,
                data: Vec::new(),
                outcome: Outcome::Relay(r),
            });
        }
        self.conclude(req, out, dir)
    }

    /// The end of one request: stage transition, full feature phase, the reply.
    fn conclude(
        &mut self,
        req: &LoginRequest,
        mut out: Vec<(String, String)>,
        dir: &mut dyn Directory,
    ) -> Result<Reply, LoginFailure> {
        // Decide whether to transit.
        let mut transit = false;
        if req.transit {
            let no_auth = self.requires_no_auth();
            let to_operational = req.nsg == Stage::LOGIN_OPERATIONAL_NEGOTIATION;
            self.state = match std::mem::replace(&mut self.state, State::Done) {
                State::Security(SecurityState::NoAuth(p) | SecurityState::Verified(p))
                    if to_operational =>
                {
                    transit = true;
                    State::Operational(p)
                }
                s @ State::Security(SecurityState::NoAuth(_) | SecurityState::Verified(_)) => {
                    transit = true;
                    s
                }
                // The initiator sent no AuthMethod; None is the only possible outcome.
                State::Security(SecurityState::Negotiating) if no_auth && to_operational => {
                    transit = true;
                    State::Operational(Authenticated(()))
                }
                s @ State::Security(SecurityState::Negotiating) if no_auth => {
                    transit = true;
                    s
                }
                s @ State::Operational(_) => {
                    transit = true;
                    s
                }
                s => s,
            };
        }
        if transit && req.nsg == Stage::FULL_FEATURE_PHASE {
            return self.finish(req, out, dir);
        }
        if !self.declared_mrdsl && req.csg == Stage::LOGIN_OPERATIONAL_NEGOTIATION {
            self.declared_mrdsl = true;
            out.push((
                "MaxRecvDataSegmentLength".into(),
                self.offer.max_recv_data_segment_length.to_string(),
            ));
        }
        let header = self.response_header(req, transit, req.csg, req.nsg);
        Ok(Reply {
            header,
            data: encode(&out),
            outcome: Outcome::Continue,
        })
    }
}

#[cfg(test)]
mod tests;
