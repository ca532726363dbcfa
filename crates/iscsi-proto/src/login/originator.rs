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
use crate::chap::{ChallengeRecord, ChapAlgorithm, ChapError, ChapSecret};
use crate::params::{SessionParams, SessionType};

mod exchange;
mod operational;
mod security;
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
mod tests;
