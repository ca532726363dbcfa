//! The originator side of login (RFC 7143 §6.3, §13), sans-IO, next to the target's
//! ([`super::TargetLogin`]): feed it each Login Response's header fields and keys, it tells you
//! what to send next or hands back the session's [`SessionParams`] — the same type the target
//! negotiates into — with the proof that authentication happened.
//!
//! ```text
//! SecurityNegotiation (CSG=0)            only when CHAP is configured or the target wants it
//!   -> AuthMethod=CHAP[,None] ... CHAP_A -> CHAP_A,CHAP_I,CHAP_C -> CHAP_N,CHAP_R[,CHAP_I,CHAP_C]
//!                                        proof: `Authenticated` (AuthMethod=None agreed, or
//!                                        CHAP answered and, when asked for, mutual CHAP verified)
//! LoginOperationalNegotiation (CSG=1)    our operational keys, T=1 NSG=3
//! FullFeaturePhase (3)                   `Established` (needs the proof)
//! ```
//!
//! [`LoginExchange`] wraps the machine at the PDU level (the Login Requests, the C bit,
//! StatSN), so a driver only moves PDUs.
//!
//! The results follow the key table of RFC 7143 §13: booleans combine with AND
//! (ImmediateData) or OR (InitialR2T, DataPDUInOrder, DataSequenceInOrder), numbers with min
//! (burst lengths, MaxOutstandingR2T, ErrorRecoveryLevel); MaxRecvDataSegmentLength is
//! declarative in each direction (§13.12).

use std::collections::HashMap;

use iscsi_wire::header::Stage;

use super::{Authenticated, ExtensionContext};
use crate::chap::{self, ChallengeRecord, ChapAlgorithm, ChapError, ChapSecret};
use crate::params::{SessionParams, SessionType, Side};

mod exchange;
pub use exchange::{random_isid, LoginDone, LoginExchange, LoginProgress, LOGIN_TEXT_LIMIT};

/// Why the originator's login failed. Each is a connection-scope failure: the caller drops
/// the connection (RFC 7143 §6.3).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OriginatorError {
    /// The target answered with a status class other than success (RFC 7143 §11.13.5).
    #[error("target refused the login: {} (class {class}, detail {detail})", status_message(*.class, *.detail))]
    Refused { class: u8, detail: u8 },
    /// A Login Response for another stage than the one we are in (RFC 7143 §6.3).
    #[error("login response for stage {got} while we are in stage {ours}")]
    WrongStage { got: u8, ours: u8 },
    /// The target moved to full feature phase without the operational stage we asked for.
    #[error("target skipped operational negotiation after we asked for it")]
    SkippedOperational,
    /// Authentication failed or the target's choice of method is not acceptable
    /// (RFC 7143 §12.1).
    #[error("{0}")]
    Auth(String),
    /// A key's answer breaks RFC 7143 §13's rules or asks for what we cannot do.
    #[error("{0}")]
    Negotiation(String),
    /// The login extension (e.g. Seal) refused.
    #[error("{0}")]
    Extension(String),
    /// A CHAP value was malformed or a challenge was reflected (RFC 7143 §12.1.3).
    #[error(transparent)]
    Chap(#[from] ChapError),
    /// A PDU other than a Login Response arrived during login (RFC 7143 §6.3).
    #[error("expected a Login Response, got {got}")]
    UnexpectedPdu { got: String },
    /// A response's text, continued over several PDUs (RFC 7143 §6.1, §11.13.3), grew past
    /// the bound we set ([`LOGIN_TEXT_LIMIT`]).
    #[error("login text over {} KiB", .limit / 1024)]
    TextTooLong { limit: usize },
    /// A response's text is not a valid key=value list (RFC 7143 §6.1).
    #[error("login text: {0}")]
    Text(#[from] iscsi_wire::WireError),
}

type Result<T, E = OriginatorError> = std::result::Result<T, E>;

/// Human text for a login status class/detail (RFC 7143 §11.13.5).
pub fn status_message(class: u8, detail: u8) -> &'static str {
    match (class, detail) {
        (1, _) => "target moved (redirect, not supported by this initiator)",
        (2, 0) => "initiator error",
        (2, 1) => "authentication failure",
        (2, 2) => "authorization failure",
        (2, 3) => "target not found",
        (2, 4) => "target removed",
        (2, 5) => "unsupported version",
        (2, 6) => "too many connections",
        (2, 7) => "missing parameter",
        (2, 8) => "cannot include in session",
        (2, 9) => "session type not supported",
        (2, 10) => "session does not exist",
        (2, 11) => "invalid during login",
        (2, _) => "initiator error (other)",
        (3, 0) => "target error",
        (3, 1) => "service unavailable",
        (3, 2) => "out of resources",
        (3, _) => "target error (other)",
        _ => "unknown status",
    }
}

/// CHAP credentials: a name and its secret.
#[derive(Debug, Clone)]
pub struct ChapCredentials {
    pub name: String,
    pub secret: ChapSecret,
}

/// Which digests to ask for (RFC 7143 §13.1). When asked for, only `CRC32C` is offered so a
/// target that cannot do it fails the login instead of silently measuring something else.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DigestChoice {
    #[default]
    None,
    Header,
    Data,
    Both,
}

impl DigestChoice {
    pub fn header(self) -> bool {
        matches!(self, Self::Header | Self::Both)
    }
    pub fn data(self) -> bool {
        matches!(self, Self::Data | Self::Both)
    }
}

impl std::str::FromStr for DigestChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        Ok(match s.to_ascii_lowercase().as_str() {
            "none" => Self::None,
            "header" => Self::Header,
            "data" => Self::Data,
            "both" | "crc32c" => Self::Both,
            _ => return Err(format!("digest must be none|header|data|both, not {s:?}")),
        })
    }
}

/// What the initiator proposes at login. The defaults are the fast ones (ImmediateData=Yes,
/// InitialR2T=No, 256 KiB segments, 16 MiB bursts unsolicited or not, several R2Ts
/// outstanding), not RFC 7143's
/// conservative defaults; [`LoginOptions::rfc_defaults`] gives those, which reproduce the
/// papers' 2·RTT write cycle (Kamisaka Eq. (1)).
#[derive(Debug, Clone)]
pub struct LoginOptions {
    pub initiator_name: String,
    pub digest: DigestChoice,
    pub initial_r2t: bool,
    pub immediate_data: bool,
    pub first_burst_length: u32,
    pub max_burst_length: u32,
    /// What we declare we can receive per PDU (RFC 7143 §13.12).
    pub max_recv_data_segment_length: u32,
    pub max_outstanding_r2t: u32,
    /// CHAP: our name and secret, answering the target's challenge.
    pub chap: Option<ChapCredentials>,
    /// Mutual CHAP: the name and secret the target must prove.
    pub mutual_chap: Option<ChapCredentials>,
    /// CHAP algorithms offered, in preference order (default [`ChapAlgorithm::DEFAULT`]:
    /// SHA-256 first, no MD5). The same list on every attempt: nothing a peer answers
    /// narrows it (RFC 7143 §12.1.3).
    pub chap_algorithms: Vec<ChapAlgorithm>,
    /// The ISID to log in with (RFC 7143 §11.12.5); `None`: a random one per login. Logging in
    /// with the ISID of a live session reinstates it (RFC 7143 §6.3.5).
    pub isid: Option<[u8; 6]>,
    /// MaxConnections offered (RFC 7143 §13.2): 1, the default, for a session of one
    /// connection; more for a session spread over several (`engine::mcs`; the target answers
    /// the lower of its limit and this).
    pub max_connections: u32,
    /// Add a connection to a session instead of leading a new one (RFC 7143 §5.3.4): the
    /// session's TSIH and this connection's CID, with the session's ISID
    /// ([`LoginOptions::isid`]). `None`: a leading login (TSIH 0, CID 0).
    pub join: Option<Join>,
    /// ErrorRecoveryLevel offered (RFC 7143 §13.20; the session gets the lower of both
    /// offers): 0, the default, or 2 for a session of several connections whose failed
    /// connections' tasks are reassigned (`engine::mcs`, §7.2). Above 0 the initiator also
    /// offers DefaultTime2Retain 20 (the RFC's default, §13.16), so the target keeps a failed
    /// connection's tasks long enough to reassign them.
    pub error_recovery_level: u32,
}

/// A login that adds a connection to a running session ([`LoginOptions::join`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    /// The session's TSIH, from its leading login.
    pub tsih: u16,
    /// This connection's CID, unique among the session's connections (the CID of a live
    /// one reinstates it, RFC 7143 §6.3.4).
    pub cid: u16,
}

impl Default for LoginOptions {
    fn default() -> Self {
        Self {
            initiator_name: "iqn.2026-11.org.ipsan:initiator".into(),
            digest: DigestChoice::None,
            initial_r2t: false,
            immediate_data: true,
            // As large as a burst (the target's offer caps it): a write whose data passes
            // 256 KiB (any 256 KiB write once Seal adds its tags) otherwise waits one round
            // trip for an R2T for the rest, which on a long link halves what its commands
            // in flight carry (issue 28: sealed 256 KiB writes capped at 21-27 MB/s at
            // 1 Gbit/s and 64 ms, one R2T per write).
            first_burst_length: 16 * 1024 * 1024 - 1024,
            max_burst_length: 16 * 1024 * 1024 - 1024,
            max_recv_data_segment_length: 256 * 1024,
            max_outstanding_r2t: 16,
            chap: None,
            mutual_chap: None,
            chap_algorithms: ChapAlgorithm::DEFAULT.to_vec(),
            isid: None,
            max_connections: 1,
            join: None,
            error_recovery_level: 0,
        }
    }
}

impl LoginOptions {
    /// RFC 7143 §13 defaults for every operational key.
    pub fn rfc_defaults() -> Self {
        Self {
            initial_r2t: true,
            immediate_data: true,
            first_burst_length: 65536,
            max_burst_length: 262_144,
            max_recv_data_segment_length: 8192,
            max_outstanding_r2t: 1,
            ..Self::default()
        }
    }
}

/// A completed login: the values in force, what the target told about itself, and the
/// proof of authentication the full-feature phase is built from.
#[derive(Debug)]
pub struct Established {
    /// The operational values in force (RFC 7143 §13), negotiated into the same type the
    /// target uses.
    pub params: SessionParams,
    /// The TSIH the target assigned (RFC 7143 §11.13.4).
    pub tsih: u16,
    pub target_portal_group_tag: Option<u16>,
    pub target_alias: Option<String>,
    /// The CHAP algorithm used, if CHAP ran.
    pub chap_algorithm: Option<u32>,
    /// Whether the target proved its identity (mutual CHAP).
    pub target_authenticated: bool,
    auth: Authenticated,
}

impl Established {
    /// The proof that authentication ran (or that none was agreed).
    pub fn authenticated(&self) -> &Authenticated {
        &self.auth
    }
}

/// Session type (RFC 7143 §13.21).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionKind {
    Discovery,
    Normal { target_name: String },
}

/// One Login Request to send: stage bits and keys.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoginStep {
    pub csg: Stage,
    pub nsg: Stage,
    pub transit: bool,
    pub keys: Vec<(String, String)>,
}

/// What a Login Response carries that the machine needs.
#[derive(Debug, Clone)]
pub struct LoginReply {
    pub transit: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub status_class: u8,
    pub status_detail: u8,
    pub tsih: u16,
    pub keys: Vec<(String, String)>,
}

/// What to do after a response.
#[derive(Debug)]
pub enum LoginNext {
    Send(LoginStep),
    Done(Box<Established>),
    /// Relayed CHAP ([`LoginMachine::start_relayed`]): the target's challenge, to be answered
    /// by whoever holds the secret; continue with [`LoginMachine::relay_response`].
    RelayChallenge {
        algorithm: ChapAlgorithm,
        id: u8,
        challenge: Vec<u8>,
    },
}

#[derive(Debug)]
enum ChapState {
    NotStarted,
    /// Sent CHAP_A, waiting for CHAP_A/I/C.
    SentAlgorithms,
    /// Relayed CHAP: the challenge went to the driver, waiting for its response.
    RelayAwaitResponse {
        alg: ChapAlgorithm,
    },
    /// Sent CHAP_N/R (and our challenge when mutual), waiting for the target's answer.
    SentResponse {
        alg: ChapAlgorithm,
        our_id: Option<u8>,
        our_challenge: Option<Vec<u8>>,
    },
    Done,
}

/// Where the login stands. The operational stage can only be entered with the proof the
/// security stage produced, and the proof moves on into [`Established`] (rustls's typestate:
/// no path skips authentication).
#[derive(Debug)]
enum Phase {
    /// SecurityNegotiation (CSG=0); `Some` once authentication is settled: AuthMethod=None
    /// agreed, or our CHAP response accepted and, when asked for, mutual CHAP verified.
    Security(Option<Authenticated>),
    /// LoginOperationalNegotiation (CSG=1).
    Operational(Authenticated),
    /// Full feature phase reached, or the login failed: nothing more to handle.
    Done,
}

impl Phase {
    fn stage(&self) -> Stage {
        match self {
            Phase::Security(_) => Stage::SECURITY_NEGOTIATION,
            Phase::Operational(_) => Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            Phase::Done => Stage::FULL_FEATURE_PHASE,
        }
    }
}

/// The originator's login state machine, with an optional login extension of type `X` (a
/// caller may use a richer trait object whose supertrait is [`OriginatorExtension`]).
#[derive(Debug)]
pub struct LoginMachine<X: ?Sized + OriginatorExtension = dyn OriginatorExtension> {
    opts: LoginOptions,
    kind: SessionKind,
    phase: Phase,
    chap: ChapState,
    record: ChallengeRecord,
    /// Operational keys we sent and have not seen answered.
    offered: HashMap<String, String>,
    /// The values in force so far: RFC 7143 defaults until answered.
    params: SessionParams,
    tsih: u16,
    target_portal_group_tag: Option<u16>,
    target_alias: Option<String>,
    chap_algorithm: Option<u32>,
    target_authenticated: bool,
    sent_operational: bool,
    ext: Option<Box<X>>,
    isid: [u8; 6],
    /// Relayed CHAP: the response comes from the driver and the target's verdict goes back
    /// to it (`relay_verdict`: `Some` once the target accepted, with its mutual answer).
    relay: bool,
    relay_verdict: Option<Option<(String, Vec<u8>)>>,
}

/// An originator-side login extension for vendor `X-` keys (RFC 7143 §13.5), the mirror of
/// [`super::Extension`] on the target: how Seal (docs/seal.md §2) negotiates its
/// cipher and keys during the operational stage without this crate knowing about it.
pub trait OriginatorExtension: Send + std::fmt::Debug {
    /// Whether `key` in a Login Response belongs to this extension.
    fn handles(&self, key: &str) -> bool;
    /// Keys to add to the first operational-stage Login Request.
    fn offer(&mut self, ctx: &ExtensionContext<'_>) -> Result<Vec<(String, String)>, String>;
    /// The keys it handles from one Login Response; returns keys for the next request.
    fn on_answer(
        &mut self,
        keys: &[(String, String)],
        ctx: &ExtensionContext<'_>,
    ) -> Result<Vec<(String, String)>, String>;
    /// The target is ready for full feature phase: refuse the login if not satisfied.
    fn finish(&mut self, ctx: &ExtensionContext<'_>) -> Result<(), String>;
    /// Whether the first operational request must leave T=0 so a later request can carry a
    /// reply to the target's answer (Seal's key confirmation, docs/seal.md §2).
    fn needs_second_request(&self) -> bool {
        false
    }
    /// Every Login PDU of this login, in order, as [`LoginExchange`] sends (`Sent`) or
    /// receives (`Received`) it — a received response before the machine handles it. Seal
    /// binds the whole login to its keys (docs/seal.md §3).
    fn observe_pdu(&mut self, _dir: PduDir, _pdu: &iscsi_wire::Pdu) {}
}

/// Which way a Login PDU went, from the originator's side.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PduDir {
    /// Initiator to target: as the codec will write it.
    Sent,
    /// Target to initiator: as it was read.
    Received,
}

const KEY_AUTH: &str = "AuthMethod";

impl<X: ?Sized + OriginatorExtension> LoginMachine<X> {
    /// Start a login; returns the machine and the first request.
    pub fn start(opts: LoginOptions, kind: SessionKind) -> (Self, LoginStep) {
        let mut keys = vec![
            ("InitiatorName".to_owned(), opts.initiator_name.clone()),
            (
                "SessionType".to_owned(),
                match kind {
                    SessionKind::Discovery => "Discovery".to_owned(),
                    SessionKind::Normal { .. } => "Normal".to_owned(),
                },
            ),
        ];
        if let SessionKind::Normal { target_name } = &kind {
            keys.push(("TargetName".to_owned(), target_name.clone()));
        }
        let auth = match (&opts.chap, &opts.mutual_chap) {
            (Some(_), Some(_)) => "CHAP",
            (Some(_), None) => "CHAP,None",
            (None, _) => "None",
        };
        keys.push((KEY_AUTH.to_owned(), auth.to_owned()));
        // With no CHAP we are ready to leave the security stage at once.
        let transit = opts.chap.is_none();
        let mut params = SessionParams {
            initiator_name: opts.initiator_name.clone(),
            ..SessionParams::default()
        };
        match &kind {
            SessionKind::Discovery => params.session_type = SessionType::Discovery,
            SessionKind::Normal { target_name } => params.target_name = Some(target_name.clone()),
        }
        let tsih = opts.join.map_or(0, |j| j.tsih);
        let m = Self {
            opts,
            kind,
            phase: Phase::Security(None),
            chap: ChapState::NotStarted,
            record: ChallengeRecord::new(),
            offered: HashMap::new(),
            params,
            tsih,
            target_portal_group_tag: None,
            target_alias: None,
            chap_algorithm: None,
            target_authenticated: false,
            sent_operational: false,
            ext: None,
            isid: [0; 6],
            relay: false,
            relay_verdict: None,
        };
        let step = LoginStep {
            csg: Stage::SECURITY_NEGOTIATION,
            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            transit,
            keys,
        };
        (m, step)
    }

    /// Start a login whose CHAP is relayed (a gateway's remote leg, docs/gateway.md): we offer
    /// `opts.chap_algorithms` (the host's CHAP_A list) and hold no secret; the target's
    /// challenge comes out as [`LoginNext::RelayChallenge`], the host's answer goes in through
    /// [`Self::relay_response`], and the target's acceptance (with its mutual CHAP answer, if
    /// the host asked for one) is [`Self::take_relay_verdict`]. A target that does not
    /// require CHAP fails the login: relaying nothing would authenticate nobody.
    pub fn start_relayed(mut opts: LoginOptions, kind: SessionKind) -> (Self, LoginStep) {
        opts.chap = None;
        opts.mutual_chap = None;
        let (mut m, mut step) = Self::start(opts, kind);
        m.relay = true;
        step.transit = false;
        for (k, v) in &mut step.keys {
            if k == KEY_AUTH {
                *v = "CHAP".into();
            }
        }
        (m, step)
    }

    /// Relayed CHAP: the answer to the challenge [`LoginNext::RelayChallenge`] gave (CHAP_N,
    /// CHAP_R and, for mutual CHAP, the host's CHAP_I and CHAP_C); returns the request.
    pub fn relay_response(
        &mut self,
        name: &str,
        response: &[u8],
        mutual: Option<(u8, Vec<u8>)>,
    ) -> Result<LoginStep> {
        let ChapState::RelayAwaitResponse { alg } =
            std::mem::replace(&mut self.chap, ChapState::Done)
        else {
            return Err(OriginatorError::Auth(
                "relayed CHAP response out of sequence".into(),
            ));
        };
        let mut keys = vec![
            ("CHAP_N".to_owned(), name.to_owned()),
            ("CHAP_R".to_owned(), chap::encode_binary(response)),
        ];
        let (our_id, our_challenge) = match mutual {
            Some((id, c)) => {
                keys.push(("CHAP_I".to_owned(), id.to_string()));
                keys.push(("CHAP_C".to_owned(), chap::encode_binary(&c)));
                (Some(id), Some(c))
            }
            None => (None, None),
        };
        self.chap_algorithm = Some(alg.0);
        self.chap = ChapState::SentResponse {
            alg,
            our_id,
            our_challenge,
        };
        Ok(LoginStep {
            csg: Stage::SECURITY_NEGOTIATION,
            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            transit: true,
            keys,
        })
    }

    /// Relayed CHAP: `Some` once the target accepted the relayed response (taken once), with
    /// its CHAP_N and CHAP_R when the host asked for mutual CHAP.
    pub fn take_relay_verdict(&mut self) -> Option<Option<(String, Vec<u8>)>> {
        self.relay_verdict.take()
    }

    /// Attach an extension; `isid` is the session's ISID (it binds extension keys to the
    /// session, e.g. Seal's key schedule).
    pub fn set_extension(&mut self, ext: Box<X>, isid: [u8; 6]) {
        self.ext = Some(ext);
        self.isid = isid;
    }

    /// The extension, e.g. to collect what it negotiated after a successful login.
    pub fn extension_mut(&mut self) -> Option<&mut X> {
        self.ext.as_deref_mut()
    }

    fn ctx(&self) -> ExtensionContext<'_> {
        ExtensionContext {
            initiator_name: &self.opts.initiator_name,
            target_name: match &self.kind {
                SessionKind::Normal { target_name } => Some(target_name),
                SessionKind::Discovery => None,
            },
            isid: self.isid,
            tsih: self.tsih,
        }
    }

    /// Process one Login Response.
    pub fn handle(&mut self, reply: LoginReply) -> Result<LoginNext> {
        if reply.status_class != 0 {
            return Err(OriginatorError::Refused {
                class: reply.status_class,
                detail: reply.status_detail,
            });
        }
        let ours = self.phase.stage();
        if reply.csg != ours || matches!(self.phase, Phase::Done) {
            return Err(OriginatorError::WrongStage {
                got: reply.csg.0,
                ours: ours.0,
            });
        }
        self.tsih = reply.tsih;
        match self.phase {
            Phase::Security(_) => self.handle_security(reply),
            _ => self.handle_operational(reply),
        }
    }

    fn handle_security(&mut self, reply: LoginReply) -> Result<LoginNext> {
        let keys: HashMap<&str, &str> = reply
            .keys
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        for (k, v) in &keys {
            if *v == "Reject" {
                return Err(OriginatorError::Negotiation(format!("target rejected {k}")));
            }
        }
        if let Some(v) = keys.get("TargetPortalGroupTag") {
            self.target_portal_group_tag = v.parse().ok();
        }
        if let Some(v) = keys.get("TargetAlias") {
            self.target_alias = Some((*v).to_owned());
        }
        match std::mem::replace(&mut self.chap, ChapState::Done) {
            ChapState::NotStarted => {
                match keys.get(KEY_AUTH).copied() {
                    Some("CHAP") => {
                        if self.opts.chap.is_none() && !self.relay {
                            return Err(OriginatorError::Auth(
                                "target requires CHAP but no credentials were given".into(),
                            ));
                        }
                        self.chap = ChapState::SentAlgorithms;
                        return Ok(LoginNext::Send(LoginStep {
                            csg: Stage::SECURITY_NEGOTIATION,
                            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
                            transit: false,
                            keys: vec![(
                                "CHAP_A".into(),
                                ChapAlgorithm::format_list(&self.opts.chap_algorithms),
                            )],
                        }));
                    }
                    Some("None") if self.relay => {
                        return Err(OriginatorError::Auth(
                            "relayed CHAP: the target chose no authentication".into(),
                        ));
                    }
                    Some("None") | None => {
                        if self.opts.mutual_chap.is_some() {
                            return Err(OriginatorError::Auth(
                                "mutual CHAP requested but the target chose no authentication"
                                    .into(),
                            ));
                        }
                        if !keys.contains_key(KEY_AUTH) && (self.opts.chap.is_some() || self.relay)
                        {
                            // Target ignored AuthMethod; keep waiting for it.
                            self.chap = ChapState::NotStarted;
                        } else {
                            // AuthMethod=None agreed (or never discussed without CHAP).
                            self.phase = Phase::Security(Some(Authenticated(())));
                        }
                    }
                    Some(other) => {
                        return Err(OriginatorError::Auth(format!(
                            "target chose an AuthMethod we did not offer: {other}"
                        )))
                    }
                }
            }
            ChapState::SentAlgorithms => return self.answer_challenge(&keys),
            ChapState::RelayAwaitResponse { .. } => {
                return Err(OriginatorError::Auth(
                    "a Login Response while the relayed CHAP response is pending".into(),
                ))
            }
            ChapState::SentResponse {
                our_id: Some(_), ..
            } if self.relay => {
                // Relayed mutual CHAP: the host, not us, checks the target's answer.
                let name = keys.get("CHAP_N").copied().ok_or_else(|| {
                    OriginatorError::Auth("mutual CHAP: target sent no CHAP_N".into())
                })?;
                let r = keys.get("CHAP_R").copied().ok_or_else(|| {
                    OriginatorError::Auth("mutual CHAP: target sent no CHAP_R".into())
                })?;
                self.relay_verdict = Some(Some((name.to_owned(), chap::decode_binary(r)?)));
                self.phase = Phase::Security(Some(Authenticated(())));
            }
            ChapState::SentResponse { .. } if self.relay => {
                self.relay_verdict = Some(None);
                self.phase = Phase::Security(Some(Authenticated(())));
            }
            ChapState::SentResponse {
                alg,
                our_id,
                our_challenge,
            } => {
                if let (Some(id), Some(ch), Some(m)) =
                    (our_id, our_challenge, self.opts.mutual_chap.as_ref())
                {
                    let name = keys.get("CHAP_N").copied().ok_or_else(|| {
                        OriginatorError::Auth("mutual CHAP: target sent no CHAP_N".into())
                    })?;
                    let r = keys.get("CHAP_R").copied().ok_or_else(|| {
                        OriginatorError::Auth("mutual CHAP: target sent no CHAP_R".into())
                    })?;
                    let r = chap::decode_binary(r)?;
                    if name != m.name || !chap::verify(alg, id, &m.secret, &ch, &r) {
                        return Err(OriginatorError::Auth(
                            "mutual CHAP: the target failed to authenticate".into(),
                        ));
                    }
                    self.target_authenticated = true;
                }
                // Our response was accepted (the target moved on) and any mutual answer holds.
                self.phase = Phase::Security(Some(Authenticated(())));
            }
            ChapState::Done => {}
        }
        if reply.transit {
            if reply.nsg == Stage::LOGIN_OPERATIONAL_NEGOTIATION {
                // The proof moves into the operational stage; without one there is none.
                let Phase::Security(Some(proof)) = std::mem::replace(&mut self.phase, Phase::Done)
                else {
                    return Err(OriginatorError::Auth(
                        "the target moved to operational negotiation before authentication".into(),
                    ));
                };
                self.phase = Phase::Operational(proof);
                return Ok(LoginNext::Send(self.operational_step()?));
            }
            if reply.nsg == Stage::FULL_FEATURE_PHASE {
                return Err(OriginatorError::SkippedOperational);
            }
        }
        // Still in the security stage: say we are ready to move on.
        Ok(LoginNext::Send(LoginStep {
            csg: Stage::SECURITY_NEGOTIATION,
            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            transit: matches!(self.chap, ChapState::Done),
            keys: Vec::new(),
        }))
    }

    fn answer_challenge(&mut self, keys: &HashMap<&str, &str>) -> Result<LoginNext> {
        if self.relay {
            return self.relay_challenge(keys);
        }
        if self.opts.chap.is_none() {
            return Err(OriginatorError::Auth("no CHAP credentials".into()));
        }
        let (alg, id, challenge) = self.target_challenge(keys)?;
        let creds = self
            .opts
            .chap
            .as_ref()
            .ok_or_else(|| OriginatorError::Auth("no CHAP credentials".into()))?;
        let r = chap::response(alg, id, &creds.secret, &challenge)?;
        let mut out = vec![
            ("CHAP_N".to_owned(), creds.name.clone()),
            ("CHAP_R".to_owned(), chap::encode_binary(&r)),
        ];
        let (mut our_id, mut our_challenge) = (None, None);
        if let Some(m) = &self.opts.mutual_chap {
            if m.secret.ct_eq(&creds.secret) {
                return Err(OriginatorError::Auth(
                    "mutual CHAP: the two directions must use different secrets (RFC 7143 §12.1.3)"
                        .into(),
                ));
            }
            let len = alg.digest_len().unwrap_or(16).max(16);
            let c = self.record.issue(alg, len)?;
            out.push(("CHAP_I".to_owned(), c.id.to_string()));
            out.push(("CHAP_C".to_owned(), chap::encode_binary(&c.challenge)));
            our_id = Some(c.id);
            our_challenge = Some(c.challenge);
        }
        self.chap_algorithm = Some(alg.0);
        self.chap = ChapState::SentResponse {
            alg,
            our_id,
            our_challenge,
        };
        Ok(LoginNext::Send(LoginStep {
            csg: Stage::SECURITY_NEGOTIATION,
            nsg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            transit: true,
            keys: out,
        }))
    }

    /// The target's CHAP challenge (RFC 7143 §12.1.3): the one algorithm it chose, which must
    /// be one we offered and can compute, its identifier, and a challenge that is not a
    /// reflection of one we issued. Shared by the answering and the relaying paths.
    fn target_challenge(
        &mut self,
        keys: &HashMap<&str, &str>,
    ) -> Result<(ChapAlgorithm, u8, Vec<u8>)> {
        let a = keys
            .get("CHAP_A")
            .ok_or_else(|| OriginatorError::Auth("target sent no CHAP_A".into()))?;
        let algorithm = match ChapAlgorithm::parse_list(a)?.as_slice() {
            [one] if self.opts.chap_algorithms.contains(one) && one.is_supported() => *one,
            _ => {
                return Err(OriginatorError::Auth(format!(
                    "target chose CHAP_A={a}, which we did not offer"
                )))
            }
        };
        let id = chap::parse_identifier(
            keys.get("CHAP_I")
                .ok_or_else(|| OriginatorError::Auth("target sent no CHAP_I".into()))?,
        )?;
        let challenge = chap::decode_binary(
            keys.get("CHAP_C")
                .ok_or_else(|| OriginatorError::Auth("target sent no CHAP_C".into()))?,
        )?;
        self.record.accept_incoming(&challenge)?;
        Ok((algorithm, id, challenge))
    }

    /// Relayed CHAP: the target's challenge, checked as ours would be, goes to the driver.
    fn relay_challenge(&mut self, keys: &HashMap<&str, &str>) -> Result<LoginNext> {
        let (algorithm, id, challenge) = self.target_challenge(keys)?;
        self.chap = ChapState::RelayAwaitResponse { alg: algorithm };
        Ok(LoginNext::RelayChallenge {
            algorithm,
            id,
            challenge,
        })
    }

    fn operational_step(&mut self) -> Result<LoginStep> {
        let o = &self.opts;
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
        let dg = |b: bool| if b { "CRC32C" } else { "None" }.to_owned();
        let mut keys: Vec<(String, String)> = vec![
            ("HeaderDigest".into(), dg(o.digest.header())),
            ("DataDigest".into(), dg(o.digest.data())),
            (
                "MaxRecvDataSegmentLength".into(),
                o.max_recv_data_segment_length.to_string(),
            ),
        ];
        if matches!(self.kind, SessionKind::Normal { .. }) {
            keys.extend([
                (
                    "MaxConnections".into(),
                    o.max_connections.max(1).to_string(),
                ),
                ("InitialR2T".into(), yn(o.initial_r2t)),
                ("ImmediateData".into(), yn(o.immediate_data)),
                ("MaxBurstLength".into(), o.max_burst_length.to_string()),
                ("FirstBurstLength".into(), o.first_burst_length.to_string()),
                (
                    "MaxOutstandingR2T".into(),
                    o.max_outstanding_r2t.to_string(),
                ),
                ("DefaultTime2Wait".into(), "0".into()),
                (
                    "DefaultTime2Retain".into(),
                    if o.error_recovery_level > 0 {
                        "20"
                    } else {
                        "0"
                    }
                    .into(),
                ),
                ("DataPDUInOrder".into(), "Yes".into()),
                ("DataSequenceInOrder".into(), "Yes".into()),
                (
                    "ErrorRecoveryLevel".into(),
                    o.error_recovery_level.min(2).to_string(),
                ),
            ]);
        }
        self.params.initiator_max_recv_data_segment_length = o.max_recv_data_segment_length;
        for (k, v) in &keys {
            if k != "MaxRecvDataSegmentLength" {
                self.offered.insert(k.clone(), v.clone());
            }
        }
        self.sent_operational = true;
        let mut transit = true;
        if let Some(mut ext) = self.ext.take() {
            let r = ext.offer(&self.ctx());
            transit = !ext.needs_second_request();
            self.ext = Some(ext);
            keys.extend(r.map_err(OriginatorError::Extension)?);
        }
        Ok(LoginStep {
            csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            nsg: Stage::FULL_FEATURE_PHASE,
            transit,
            keys,
        })
    }

    fn handle_operational(&mut self, reply: LoginReply) -> Result<LoginNext> {
        let mut answers = Vec::new();
        let (ext_keys, keys): (Vec<_>, Vec<_>) = reply
            .keys
            .iter()
            .cloned()
            .partition(|(k, _)| self.ext.as_ref().is_some_and(|e| e.handles(k)));
        if let Some(mut ext) = self.ext.take() {
            let r = if ext_keys.is_empty() {
                Ok(Vec::new())
            } else {
                ext.on_answer(&ext_keys, &self.ctx())
            };
            let r = r.and_then(|more| {
                if reply.transit && reply.nsg == Stage::FULL_FEATURE_PHASE {
                    ext.finish(&self.ctx()).map(|()| more)
                } else {
                    Ok(more)
                }
            });
            self.ext = Some(ext);
            answers.extend(r.map_err(OriginatorError::Extension)?);
            self.params.extensions.extend(ext_keys.iter().cloned());
        }
        for (k, v) in &keys {
            if let Some(ours) = self.offered.remove(k) {
                self.apply_answer(k, &ours, v)?;
            } else if let Some(answer) = self.apply_declaration_or_offer(k, v)? {
                answers.push((k.clone(), answer));
            }
        }
        if reply.transit && reply.nsg == Stage::FULL_FEATURE_PHASE {
            // Keys the target never answered keep their RFC 7143 defaults, except the ones
            // whose defaults we override on purpose; an unanswered offer means "default" —
            // but a digest we insisted on must not fall back to None that way either (found
            // by the `initiator_login` fuzz target: a misspelt DataDigest answer).
            for key in ["HeaderDigest", "DataDigest"] {
                if let Some(ours) = self.offered.get(key).filter(|v| v.as_str() != "None") {
                    return Err(OriginatorError::Negotiation(format!(
                        "target never answered {key}={ours}"
                    )));
                }
            }
            self.offered.clear();
            self.validate()?;
            // The operational stage's proof moves into the result.
            let Phase::Operational(auth) = std::mem::replace(&mut self.phase, Phase::Done) else {
                return Err(OriginatorError::WrongStage {
                    got: reply.csg.0,
                    ours: Stage::FULL_FEATURE_PHASE.0,
                });
            };
            return Ok(LoginNext::Done(Box::new(Established {
                params: self.params.clone(),
                tsih: self.tsih,
                target_portal_group_tag: self.target_portal_group_tag,
                target_alias: self.target_alias.clone(),
                chap_algorithm: self.chap_algorithm,
                target_authenticated: self.target_authenticated,
                auth,
            })));
        }
        Ok(LoginNext::Send(LoginStep {
            csg: Stage::LOGIN_OPERATIONAL_NEGOTIATION,
            nsg: Stage::FULL_FEATURE_PHASE,
            transit: true,
            keys: answers,
        }))
    }

    /// The target's answer to a key we offered.
    fn apply_answer(&mut self, key: &str, ours: &str, v: &str) -> Result<()> {
        if matches!(v, "NotUnderstood" | "Irrelevant") {
            return Ok(());
        }
        if v == "Reject" {
            // Digests we insisted on must not silently fall back to None.
            if key.ends_with("Digest") && ours != "None" {
                return Err(OriginatorError::Negotiation(format!(
                    "target refused {key}={ours}"
                )));
            }
            return Ok(());
        }
        // The result functions of RFC 7143 §6.2 (AND/OR/min/list membership) are checked by
        // the shared key table in iscsi-proto; an answer that breaks them fails the login.
        let v = match crate::params::spec(key) {
            Some(spec) => crate::params::check_answer(spec, ours, v).map_err(|e| {
                OriginatorError::Negotiation(format!("target answered {e} to our {key}={ours}"))
            })?,
            None => v.to_owned(),
        };
        let v = v.as_str();
        let bad = || {
            OriginatorError::Negotiation(format!("target answered {key}={v} to our {key}={ours}"))
        };
        let num = |s: &str| s.parse::<u32>().map_err(|_| bad());
        let boolean = |s: &str| match s {
            "Yes" => Ok(true),
            "No" => Ok(false),
            _ => Err(bad()),
        };
        let r = &mut self.params;
        match key {
            "HeaderDigest" | "DataDigest" => {
                let on = match v {
                    "CRC32C" => true,
                    "None" => false,
                    _ => return Err(bad()),
                };
                if on != (ours == "CRC32C") {
                    return Err(bad());
                }
                if key == "HeaderDigest" {
                    r.header_digest = on;
                } else {
                    r.data_digest = on;
                }
            }
            // OR: the answer may only turn a No into Yes.
            "InitialR2T" | "DataPDUInOrder" | "DataSequenceInOrder" => {
                let b = boolean(v)?;
                if ours == "Yes" && !b {
                    return Err(bad());
                }
                match key {
                    "InitialR2T" => r.initial_r2t = b,
                    "DataPDUInOrder" => r.data_pdu_in_order = b,
                    _ => r.data_sequence_in_order = b,
                }
            }
            // AND: the answer may only turn a Yes into No.
            "ImmediateData" => {
                let b = boolean(v)?;
                if ours == "No" && b {
                    return Err(bad());
                }
                r.immediate_data = b;
            }
            // min: the answer may not exceed our offer.
            "MaxBurstLength" | "FirstBurstLength" | "MaxOutstandingR2T" | "MaxConnections"
            | "ErrorRecoveryLevel" | "DefaultTime2Retain" => {
                let n = num(v)?;
                if n > num(ours)? {
                    return Err(bad());
                }
                match key {
                    "MaxBurstLength" => r.max_burst_length = n,
                    "FirstBurstLength" => r.first_burst_length = n,
                    "MaxOutstandingR2T" => r.max_outstanding_r2t = n,
                    "MaxConnections" => r.max_connections = n,
                    "ErrorRecoveryLevel" => r.error_recovery_level = n,
                    _ => {}
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// A key the target sent on its own: a declaration, or an offer we must answer.
    fn apply_declaration_or_offer(&mut self, key: &str, v: &str) -> Result<Option<String>> {
        let r = &mut self.params;
        match key {
            "MaxRecvDataSegmentLength" => {
                let n: u32 = v.parse().map_err(|_| {
                    OriginatorError::Negotiation(format!("bad MaxRecvDataSegmentLength={v}"))
                })?;
                if !(512..=16_777_215).contains(&n) {
                    return Err(OriginatorError::Negotiation(format!(
                        "MaxRecvDataSegmentLength={n} outside 512..=2^24-1 (RFC 7143 §13.12)"
                    )));
                }
                r.apply(key, v, Side::Target);
                Ok(None)
            }
            "TargetPortalGroupTag" => {
                self.target_portal_group_tag = v.parse().ok();
                Ok(None)
            }
            "TargetAlias" => {
                self.target_alias = Some(v.to_owned());
                Ok(None)
            }
            "TargetAddress" | "DefaultTime2Wait" | "DefaultTime2Retain" => Ok(None),
            // A target-initiated offer for a key we would have sent anyway: accept its value
            // within our limits.
            "MaxBurstLength" | "FirstBurstLength" | "MaxOutstandingR2T" => {
                let n: u32 = v
                    .parse()
                    .map_err(|_| OriginatorError::Negotiation(format!("bad {key}={v}")))?;
                let ours = match key {
                    "MaxBurstLength" => self.opts.max_burst_length,
                    "FirstBurstLength" => self.opts.first_burst_length,
                    _ => self.opts.max_outstanding_r2t,
                };
                let m = n.min(ours);
                match key {
                    "MaxBurstLength" => r.max_burst_length = m,
                    "FirstBurstLength" => r.first_burst_length = m,
                    _ => r.max_outstanding_r2t = m,
                }
                Ok(Some(m.to_string()))
            }
            _ => Ok(Some("NotUnderstood".to_owned())),
        }
    }

    fn validate(&mut self) -> Result<()> {
        let r = &mut self.params;
        if r.error_recovery_level > self.opts.error_recovery_level.min(2) {
            return Err(OriginatorError::Negotiation(format!(
                "target insists on ErrorRecoveryLevel {} (offered {})",
                r.error_recovery_level,
                self.opts.error_recovery_level.min(2)
            )));
        }
        if !r.data_pdu_in_order || !r.data_sequence_in_order {
            return Err(OriginatorError::Negotiation(
                "out-of-order data PDUs/sequences are not supported by this initiator".into(),
            ));
        }
        if r.max_burst_length < 512 || r.first_burst_length < 512 {
            return Err(OriginatorError::Negotiation(
                "burst length below 512 bytes".into(),
            ));
        }
        // RFC 7143 §13.14: FirstBurstLength must not exceed MaxBurstLength.
        r.first_burst_length = r.first_burst_length.min(r.max_burst_length);
        r.max_outstanding_r2t = r.max_outstanding_r2t.max(1);
        Ok(())
    }

    /// The values as negotiated so far (RFC 7143 defaults for keys not yet answered).
    pub fn params_so_far(&self) -> &SessionParams {
        &self.params
    }

    /// Whether this is a discovery session.
    pub fn is_discovery(&self) -> bool {
        self.kind == SessionKind::Discovery
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::chap;

    fn reply(csg: Stage, nsg: Stage, transit: bool, keys: &[(&str, &str)]) -> LoginReply {
        LoginReply {
            transit,
            csg,
            nsg,
            status_class: 0,
            status_detail: 0,
            tsih: 7,
            keys: keys
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn get<'a>(step: &'a LoginStep, key: &str) -> Option<&'a str> {
        step.keys
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    const SEC: Stage = Stage::SECURITY_NEGOTIATION;
    const OP: Stage = Stage::LOGIN_OPERATIONAL_NEGOTIATION;
    const FF: Stage = Stage::FULL_FEATURE_PHASE;

    #[test]
    fn accepts_plain_login_and_takes_target_values() {
        let kind = SessionKind::Normal {
            target_name: "iqn.t".into(),
        };
        let (mut m, first) = <LoginMachine>::start(LoginOptions::default(), kind);
        assert_eq!(get(&first, "AuthMethod"), Some("None"));
        assert!(first.transit);
        let LoginNext::Send(op) = m
            .handle(reply(SEC, OP, true, &[("AuthMethod", "None")]))
            .unwrap()
        else {
            panic!("expected operational step")
        };
        assert_eq!(op.csg, OP);
        assert_eq!(get(&op, "InitialR2T"), Some("No"));
        let LoginNext::Done(n) = m
            .handle(reply(
                OP,
                FF,
                true,
                &[
                    ("HeaderDigest", "None"),
                    ("DataDigest", "None"),
                    ("MaxRecvDataSegmentLength", "65536"),
                    ("InitialR2T", "Yes"),
                    ("ImmediateData", "Yes"),
                    ("MaxBurstLength", "262144"),
                    ("FirstBurstLength", "65536"),
                    ("MaxOutstandingR2T", "1"),
                ],
            ))
            .unwrap()
        else {
            panic!("expected done")
        };
        assert!(n.params.initial_r2t);
        assert_eq!(n.params.target_max_recv_data_segment_length, 65536);
        assert_eq!(n.params.max_burst_length, 262_144);
        assert_eq!(n.params.max_outstanding_r2t, 1);
        assert_eq!(n.tsih, 7);
    }

    #[test]
    fn rejects_answer_above_our_min_offer() {
        let kind = SessionKind::Normal {
            target_name: "iqn.t".into(),
        };
        let (mut m, _) = <LoginMachine>::start(LoginOptions::rfc_defaults(), kind);
        m.handle(reply(SEC, OP, true, &[])).unwrap();
        let err = m
            .handle(reply(OP, FF, true, &[("MaxBurstLength", "99999999")]))
            .unwrap_err();
        assert!(err.to_string().contains("MaxBurstLength"));
    }

    #[test]
    fn rejects_refused_digest() {
        let opts = LoginOptions {
            digest: DigestChoice::Both,
            ..LoginOptions::default()
        };
        let (mut m, _) = <LoginMachine>::start(opts, SessionKind::Discovery);
        m.handle(reply(SEC, OP, true, &[])).unwrap();
        assert!(m
            .handle(reply(OP, FF, true, &[("HeaderDigest", "None")]))
            .is_err());
    }

    #[test]
    fn rejects_unanswered_digest_instead_of_falling_back() {
        // Regression (fuzz target initiator_login): the target answered `DataDigesf=CRC32C`
        // and went to full feature phase; the session came up without the data digest.
        let opts = LoginOptions {
            digest: DigestChoice::Both,
            ..LoginOptions::default()
        };
        let (mut m, _) = <LoginMachine>::start(opts, SessionKind::Discovery);
        m.handle(reply(SEC, OP, true, &[])).unwrap();
        let err = m
            .handle(reply(
                OP,
                FF,
                true,
                &[("HeaderDigest", "CRC32C"), ("DataDigesf", "CRC32C")],
            ))
            .unwrap_err();
        assert!(err.to_string().contains("DataDigest=CRC32C"), "{err}");
        // Not insisting on a digest: an unanswered offer of None still means None.
        let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), SessionKind::Discovery);
        m.handle(reply(SEC, OP, true, &[])).unwrap();
        assert!(matches!(
            m.handle(reply(OP, FF, true, &[])).unwrap(),
            LoginNext::Done(n) if !n.params.data_digest && !n.params.header_digest
        ));
    }

    #[test]
    fn answers_chap_and_verifies_mutual_response() {
        let secret = ChapSecret::new(b"initiator-secret".to_vec()).unwrap();
        let tsecret = ChapSecret::new(b"target-secret-xx".to_vec()).unwrap();
        let opts = LoginOptions {
            chap: Some(ChapCredentials {
                name: "alice".into(),
                secret: secret.clone(),
            }),
            mutual_chap: Some(ChapCredentials {
                name: "tgt".into(),
                secret: tsecret.clone(),
            }),
            ..LoginOptions::default()
        };
        let (mut m, first) = <LoginMachine>::start(opts, SessionKind::Discovery);
        assert_eq!(get(&first, "AuthMethod"), Some("CHAP"));
        assert!(!first.transit);
        let LoginNext::Send(a) = m
            .handle(reply(SEC, OP, false, &[("AuthMethod", "CHAP")]))
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(get(&a, "CHAP_A"), Some("7,8,6"));
        let tc = [9u8; 16];
        let LoginNext::Send(r) = m
            .handle(reply(
                SEC,
                OP,
                false,
                &[
                    ("CHAP_A", "7"),
                    ("CHAP_I", "3"),
                    ("CHAP_C", &chap::encode_binary(&tc)),
                ],
            ))
            .unwrap()
        else {
            panic!()
        };
        let resp = chap::decode_binary(get(&r, "CHAP_R").unwrap()).unwrap();
        assert!(chap::verify(ChapAlgorithm::SHA256, 3, &secret, &tc, &resp));
        let our_id = chap::parse_identifier(get(&r, "CHAP_I").unwrap()).unwrap();
        let our_c = chap::decode_binary(get(&r, "CHAP_C").unwrap()).unwrap();
        // A wrong mutual answer is refused.
        let (mut m2, _) = <LoginMachine>::start(m.opts.clone(), SessionKind::Discovery);
        m2.chap = ChapState::SentResponse {
            alg: ChapAlgorithm::SHA256,
            our_id: Some(our_id),
            our_challenge: Some(our_c.clone()),
        };
        let wrong = chap::response(ChapAlgorithm::SHA256, our_id, &secret, &our_c).unwrap();
        assert!(m2
            .handle(reply(
                SEC,
                OP,
                true,
                &[("CHAP_N", "tgt"), ("CHAP_R", &chap::encode_binary(&wrong))]
            ))
            .is_err());
        // The right one is accepted and login moves on.
        let right = chap::response(ChapAlgorithm::SHA256, our_id, &tsecret, &our_c).unwrap();
        let next = m
            .handle(reply(
                SEC,
                OP,
                true,
                &[("CHAP_N", "tgt"), ("CHAP_R", &chap::encode_binary(&right))],
            ))
            .unwrap();
        assert!(matches!(next, LoginNext::Send(s) if s.csg == OP));
        assert!(m.target_authenticated);
    }

    #[test]
    fn refuses_operational_stage_without_authentication() {
        // CHAP configured, the target never settles AuthMethod and jumps to operational
        // negotiation: no proof, no operational stage, no session.
        let opts = LoginOptions {
            chap: Some(ChapCredentials {
                name: "alice".into(),
                secret: ChapSecret::new(b"initiator-secret".to_vec()).unwrap(),
            }),
            ..LoginOptions::default()
        };
        let (mut m, _) = <LoginMachine>::start(opts, SessionKind::Discovery);
        let e = m.handle(reply(SEC, OP, true, &[])).unwrap_err();
        assert!(matches!(e, OriginatorError::Auth(_)), "{e}");
        // And the machine takes nothing after that.
        assert!(m.handle(reply(OP, FF, true, &[])).is_err());
    }

    #[test]
    fn rejects_login_status_failure() {
        let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), SessionKind::Discovery);
        let mut r = reply(SEC, OP, false, &[]);
        r.status_class = 2;
        r.status_detail = 1;
        let e = m.handle(r).unwrap_err();
        assert!(e.to_string().contains("authentication failure"));
    }

    #[derive(Debug, Default)]
    struct Echo {
        answered: bool,
        confirmed: bool,
    }

    impl OriginatorExtension for Echo {
        fn handles(&self, key: &str) -> bool {
            key.starts_with("X-test.")
        }
        fn offer(
            &mut self,
            ctx: &ExtensionContext<'_>,
        ) -> std::result::Result<Vec<(String, String)>, String> {
            assert_eq!(ctx.isid, [0x80, 1, 2, 3, 4, 5]);
            Ok(vec![("X-test.Offer".into(), "1".into())])
        }
        fn on_answer(
            &mut self,
            keys: &[(String, String)],
            _: &ExtensionContext<'_>,
        ) -> std::result::Result<Vec<(String, String)>, String> {
            assert_eq!(keys, &[("X-test.Answer".to_owned(), "2".to_owned())]);
            self.answered = true;
            Ok(vec![("X-test.Confirm".into(), "3".into())])
        }
        fn finish(&mut self, _: &ExtensionContext<'_>) -> std::result::Result<(), String> {
            self.confirmed = true;
            if self.answered {
                Ok(())
            } else {
                Err("extension never answered".into())
            }
        }
    }

    #[test]
    fn extension_keys_are_offered_answered_and_confirmed() {
        let kind = SessionKind::Normal {
            target_name: "iqn.t".into(),
        };
        let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), kind.clone());
        m.set_extension(Box::<Echo>::default(), [0x80, 1, 2, 3, 4, 5]);
        let LoginNext::Send(op) = m.handle(reply(SEC, OP, true, &[])).unwrap() else {
            panic!()
        };
        assert_eq!(get(&op, "X-test.Offer"), Some("1"));
        // The target answers with T=0 and its extension keys (never NotUnderstood'ed by us).
        let LoginNext::Send(next) = m
            .handle(reply(OP, FF, false, &[("X-test.Answer", "2")]))
            .unwrap()
        else {
            panic!()
        };
        assert_eq!(
            next.keys,
            vec![("X-test.Confirm".to_owned(), "3".to_owned())]
        );
        assert!(matches!(
            m.handle(reply(OP, FF, true, &[])).unwrap(),
            LoginNext::Done(_)
        ));

        // An extension that is not satisfied fails the login.
        let (mut m, _) = <LoginMachine>::start(LoginOptions::default(), kind);
        m.set_extension(Box::<Echo>::default(), [0x80, 1, 2, 3, 4, 5]);
        m.handle(reply(SEC, OP, true, &[])).unwrap();
        let e = m.handle(reply(OP, FF, true, &[])).unwrap_err();
        assert!(e.to_string().contains("never answered"), "{e}");
    }
}
