//! Controller bring-up on the admin queue, as a host does it (NVMe over Fabrics 1.1 §3.3,
//! NVMe Base 2.0 §3.5.1 "Controller Initialization"), free of I/O: one command at a time out,
//! its completion in, time passed in.
//!
//! NVM subsystem: Connect (QID 0, dynamic controller, KATO), Property Get CAP and VS, Property
//! Set CC.EN = 1, Property Get CSTS until RDY (within CAP.TO), Identify Controller, Identify
//! active namespace list, Identify Namespace, Set Features Number of Queues. Discovery
//! subsystem: Connect, CAP, CC.EN, RDY, Identify Controller, then Get Log Page 70h: header,
//! the whole log, and the header again until GENCTR holds still (NVMe over Fabrics 1.1 §5.3).
//! [`KeepAlive`] then sends Keep Alive at half of KATO and notices when one goes unanswered.
//! I/O queues are connected by the driver with [`cmd::connect`] and the CNTLID found here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use nvme_wire::entry::Status;
use nvme_wire::fabrics::{ConnectData, ConnectResponse, Property, CNTLID_DYNAMIC};
use nvme_wire::{Cqe, Sqe};

use crate::auth::{AuthConfig, AuthState};

use super::authn::AuthRun;
use super::cmd::{
    self, Cap, DiscoveryEntry, DiscoveryHeader, IdentifyController, IdentifyNamespace, CC_ENABLE,
    CNS_ACTIVE_NS_LIST, CNS_CONTROLLER, CNS_NAMESPACE, CSTS_CFS, CSTS_RDY, DISCOVERY_NQN,
    DISCOVERY_RECORD_LEN, IDENTIFY_LEN, LID_DISCOVERY,
};

/// Entries of the Discovery log read at most (1 MiB of log).
pub const MAX_DISCOVERY_ENTRIES: u64 = 1023;
/// Times the Discovery log is read again when GENCTR changed under us.
const DISCOVERY_RETRIES: u32 = 8;
/// How often CSTS is polled while waiting for RDY.
const RDY_POLL: Duration = Duration::from_millis(20);

/// One command for the admin queue: its SQE (CID and SGL are the queue's), the data it sends
/// and how many bytes it reads.
#[derive(Debug, Clone)]
pub struct HostCommand {
    pub sqe: Sqe,
    pub data: Bytes,
    pub read_len: u32,
}

impl HostCommand {
    fn plain(sqe: Sqe) -> Self {
        Self {
            sqe,
            data: Bytes::new(),
            read_len: 0,
        }
    }
    fn read(sqe: Sqe, len: u32) -> Self {
        Self {
            sqe,
            data: Bytes::new(),
            read_len: len,
        }
    }
}

/// Who we are and what we connect to.
#[derive(Debug, Clone)]
pub struct BringupConfig {
    pub hostnqn: String,
    pub hostid: [u8; 16],
    /// The subsystem; [`DISCOVERY_NQN`] (or `discovery = true`) for discovery.
    pub subnqn: String,
    /// Read the Discovery log instead of identifying namespaces.
    pub discovery: bool,
    /// KATO in milliseconds (0: no keep alive).
    pub kato_ms: u32,
    /// The namespace wanted (`None`: the first active one; discovery: ignored).
    pub nsid: Option<u32>,
    /// I/O queues asked for.
    pub io_queues: u16,
    /// DH-HMAC-CHAP secrets, used when Connect answers AUTHREQ.ATR (TP 8006).
    pub auth: Option<Arc<AuthConfig>>,
}

impl BringupConfig {
    /// A discovery bring-up for `hostnqn`.
    #[must_use]
    pub fn discovery(hostnqn: String, hostid: [u8; 16]) -> Self {
        Self {
            hostnqn,
            hostid,
            subnqn: DISCOVERY_NQN.to_owned(),
            discovery: true,
            kato_ms: 0,
            nsid: None,
            io_queues: 0,
            auth: None,
        }
    }
}

/// Why a bring-up failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum BringupError {
    /// A command failed with this status.
    #[error("{step} failed: status SCT {:#x} SC {:#04x}{}", status.sct, status.sc, if *dnr { " (do not retry)" } else { "" })]
    Status {
        step: &'static str,
        status: Status,
        dnr: bool,
    },
    /// The controller wants DH-HMAC-CHAP (Connect AUTHREQ.ATR) and none is configured.
    #[error("the controller requires in-band authentication (DH-HMAC-CHAP), not configured")]
    AuthenticationRequired,
    /// The controller wants secure channel concatenation (AUTHREQ.ASCR), not supported.
    #[error("the controller requires secure channel concatenation (TP 8006 SC_C), not supported")]
    ConcatenationRequired,
    /// The DH-HMAC-CHAP transaction failed (the reason, never a secret).
    #[error("{0}")]
    Authentication(String),
    /// CSTS.RDY did not come within CAP.TO, or CSTS.CFS was set.
    #[error("controller not ready: {0}")]
    NotReady(&'static str),
    /// The namespace asked for is not active (or no namespace is).
    #[error("namespace {0} is not an active namespace of the subsystem")]
    NoNamespace(u32),
    /// The Connect data could not be built (a bad NQN).
    #[error("cannot build Connect: {0}")]
    Connect(String),
    /// The controller answered something unusable.
    #[error("{0}")]
    Invalid(&'static str),
}

/// What the bring-up found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ControllerInfo {
    pub cntlid: u16,
    pub cap: Option<Cap>,
    /// VS.
    pub vs: u32,
    pub identify: IdentifyController,
    /// Active namespaces (not read for discovery).
    pub namespaces: Vec<u32>,
    /// The namespace chosen and its Identify data.
    pub namespace: Option<(u32, IdentifyNamespace)>,
    /// I/O queues the controller granted (≤ the ones asked for).
    pub io_queues: u16,
    /// The admin queue's DH-HMAC-CHAP outcome, when the controller asked for one.
    pub auth: Option<AuthState>,
    /// The Discovery log's GENCTR and entries (discovery only).
    pub genctr: u64,
    pub discovery: Vec<DiscoveryEntry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Connect,
    Authenticate,
    GetCap,
    GetVs,
    SetCc,
    GetCsts { deadline: Instant },
    IdentifyController,
    ActiveNs,
    IdentifyNs(u32),
    SetQueues,
    LogHeader,
    LogAll,
    LogRecheck,
    Done,
    Failed,
}

/// The bring-up state machine (see the module documentation).
#[derive(Debug)]
pub struct Bringup {
    cfg: BringupConfig,
    step: Step,
    /// A command of `step` is out.
    pending: bool,
    /// Do not send the next CSTS poll before this.
    wait_until: Option<Instant>,
    info: ControllerInfo,
    log_retries: u32,
    log_len: u32,
    auth: Option<AuthRun>,
}

impl Bringup {
    #[must_use]
    pub fn new(cfg: BringupConfig) -> Self {
        Self {
            cfg,
            step: Step::Connect,
            pending: false,
            wait_until: None,
            info: ControllerInfo::default(),
            log_retries: 0,
            log_len: 0,
            auth: None,
        }
    }

    /// Whether every step is done.
    #[must_use]
    pub fn is_done(&self) -> bool {
        self.step == Step::Done
    }

    /// What was found (complete once [`Bringup::is_done`]).
    #[must_use]
    pub fn info(&self) -> &ControllerInfo {
        &self.info
    }

    /// Takes what was found.
    #[must_use]
    pub fn into_info(self) -> ControllerInfo {
        self.info
    }

    /// When to call [`Bringup::poll_command`] again while waiting for CSTS.RDY.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.pending {
            return None;
        }
        self.wait_until
    }

    /// The next command to send, if one is due.
    ///
    /// # Errors
    /// [`BringupError::Connect`] for NQNs Connect cannot carry, [`BringupError::NotReady`]
    /// when CAP.TO passed without CSTS.RDY.
    pub fn poll_command(&mut self, now: Instant) -> Result<Option<HostCommand>, BringupError> {
        if self.pending || matches!(self.step, Step::Done | Step::Failed) {
            return Ok(None);
        }
        if let Step::GetCsts { deadline } = self.step {
            if self.wait_until.is_some_and(|t| now < t) {
                return Ok(None);
            }
            if now > deadline {
                self.step = Step::Failed;
                return Err(BringupError::NotReady("CSTS.RDY not set within CAP.TO"));
            }
        }
        self.wait_until = None;
        let c = match self.step {
            Step::Connect => {
                let data = ConnectData {
                    hostid: self.cfg.hostid,
                    cntlid: CNTLID_DYNAMIC,
                    subnqn: self.cfg.subnqn.clone(),
                    hostnqn: self.cfg.hostnqn.clone(),
                };
                let (sqe, bytes) = cmd::connect(0, 31, self.cfg.kato_ms, &data)
                    .map_err(|e| BringupError::Connect(e.to_string()))?;
                HostCommand {
                    sqe,
                    data: Bytes::copy_from_slice(&bytes),
                    read_len: 0,
                }
            }
            Step::Authenticate => match self.auth.as_mut().and_then(AuthRun::poll_command) {
                Some(c) => c,
                None => return Err(BringupError::Invalid("authentication stalled")),
            },
            Step::GetCap => HostCommand::plain(cmd::property_get(Property::Cap)),
            Step::GetVs => HostCommand::plain(cmd::property_get(Property::Vs)),
            Step::SetCc => HostCommand::plain(cmd::property_set(Property::Cc, CC_ENABLE)),
            Step::GetCsts { .. } => HostCommand::plain(cmd::property_get(Property::Csts)),
            Step::IdentifyController => {
                HostCommand::read(cmd::identify(CNS_CONTROLLER, 0), IDENTIFY_LEN)
            }
            Step::ActiveNs => HostCommand::read(cmd::identify(CNS_ACTIVE_NS_LIST, 0), IDENTIFY_LEN),
            Step::IdentifyNs(n) => HostCommand::read(cmd::identify(CNS_NAMESPACE, n), IDENTIFY_LEN),
            Step::SetQueues => HostCommand::plain(cmd::set_number_of_queues(self.cfg.io_queues)),
            Step::LogHeader | Step::LogRecheck => HostCommand::read(
                cmd::get_log_page(LID_DISCOVERY, DISCOVERY_RECORD_LEN as u32, 0),
                DISCOVERY_RECORD_LEN as u32,
            ),
            Step::LogAll => HostCommand::read(
                cmd::get_log_page(LID_DISCOVERY, self.log_len, 0),
                self.log_len,
            ),
            Step::Done | Step::Failed => return Ok(None),
        };
        self.pending = true;
        Ok(Some(c))
    }

    fn step_name(&self) -> &'static str {
        match self.step {
            Step::Connect => "Connect (admin queue)",
            Step::Authenticate => "DH-HMAC-CHAP (admin queue)",
            Step::GetCap => "Property Get CAP",
            Step::GetVs => "Property Get VS",
            Step::SetCc => "Property Set CC.EN",
            Step::GetCsts { .. } => "Property Get CSTS",
            Step::IdentifyController => "Identify Controller",
            Step::ActiveNs => "Identify active namespace list",
            Step::IdentifyNs(_) => "Identify Namespace",
            Step::SetQueues => "Set Features Number of Queues",
            Step::LogHeader | Step::LogAll | Step::LogRecheck => "Get Log Page 70h (discovery)",
            Step::Done | Step::Failed => "bring-up",
        }
    }

    /// The completion of the command [`Bringup::poll_command`] gave out, with its read data.
    ///
    /// # Errors
    /// A failed status or an unusable answer; the bring-up is over.
    pub fn handle_completion(
        &mut self,
        cqe: &Cqe,
        data: &[u8],
        now: Instant,
    ) -> Result<(), BringupError> {
        if !self.pending {
            return Err(BringupError::Invalid("a completion with no command out"));
        }
        self.pending = false;
        let r = self.advance(cqe, data, now);
        if r.is_err() {
            self.step = Step::Failed;
        }
        r
    }

    fn advance(&mut self, cqe: &Cqe, data: &[u8], now: Instant) -> Result<(), BringupError> {
        if self.step == Step::Authenticate {
            let a = self
                .auth
                .as_mut()
                .ok_or(BringupError::Invalid("no authentication running"))?;
            let done = a.handle_completion(cqe, data);
            self.info.auth = Some(a.state());
            if done? {
                self.step = Step::GetCap;
            }
            return Ok(());
        }
        if !cqe.status.is_success() {
            return Err(BringupError::Status {
                step: self.step_name(),
                status: cqe.status,
                dnr: cqe.dnr,
            });
        }
        let value = u64::from(cqe.dw0) | u64::from(cqe.dw1) << 32;
        self.step = match self.step {
            Step::Connect => {
                let r = ConnectResponse::from_dw0(cqe.dw0);
                self.info.cntlid = r.cntlid;
                if r.ascr {
                    return Err(BringupError::ConcatenationRequired);
                }
                match (&self.cfg.auth, r.atr) {
                    (_, false) => Step::GetCap,
                    (None, true) => return Err(BringupError::AuthenticationRequired),
                    (Some(a), true) => {
                        self.auth = Some(AuthRun::new(
                            a.clone(),
                            &self.cfg.hostnqn,
                            &self.cfg.subnqn,
                            0,
                        ));
                        Step::Authenticate
                    }
                }
            }
            Step::GetCap => {
                self.info.cap = Some(Cap::from_u64(value));
                Step::GetVs
            }
            Step::GetVs => {
                self.info.vs = cqe.dw0;
                Step::SetCc
            }
            Step::SetCc => {
                let to = self.info.cap.map_or(1, |c| c.to.max(1));
                Step::GetCsts {
                    deadline: now + Duration::from_millis(500 * u64::from(to)),
                }
            }
            Step::GetCsts { deadline } => {
                if cqe.dw0 & CSTS_CFS != 0 {
                    return Err(BringupError::NotReady("CSTS.CFS: controller fatal status"));
                }
                if cqe.dw0 & CSTS_RDY == 0 {
                    self.wait_until = Some(now + RDY_POLL);
                    Step::GetCsts { deadline }
                } else {
                    Step::IdentifyController
                }
            }
            Step::IdentifyController => {
                self.info.identify = IdentifyController::parse(data);
                if self.cfg.discovery {
                    Step::LogHeader
                } else {
                    Step::ActiveNs
                }
            }
            Step::ActiveNs => {
                self.info.namespaces = cmd::parse_ns_list(data);
                let want = match self.cfg.nsid {
                    Some(n) if self.info.namespaces.contains(&n) => n,
                    Some(n) => return Err(BringupError::NoNamespace(n)),
                    None => *self
                        .info
                        .namespaces
                        .first()
                        .ok_or(BringupError::NoNamespace(0))?,
                };
                Step::IdentifyNs(want)
            }
            Step::IdentifyNs(n) => {
                let ns = IdentifyNamespace::parse(data).ok_or(BringupError::NoNamespace(n))?;
                self.info.namespace = Some((n, ns));
                if self.cfg.io_queues == 0 {
                    Step::Done
                } else {
                    Step::SetQueues
                }
            }
            Step::SetQueues => {
                let nsqa = (cqe.dw0 & 0xffff) as u16;
                let ncqa = (cqe.dw0 >> 16) as u16;
                self.info.io_queues = self
                    .cfg
                    .io_queues
                    .min(nsqa.saturating_add(1))
                    .min(ncqa.saturating_add(1));
                Step::Done
            }
            Step::LogHeader => {
                let h = DiscoveryHeader::parse(data);
                if h.numrec == 0 {
                    self.info.genctr = h.genctr;
                    self.info.discovery.clear();
                    Step::Done
                } else {
                    let n = h.numrec.min(MAX_DISCOVERY_ENTRIES);
                    self.log_len = ((n + 1) * DISCOVERY_RECORD_LEN as u64) as u32;
                    self.info.genctr = h.genctr;
                    Step::LogAll
                }
            }
            Step::LogAll => {
                let h = DiscoveryHeader::parse(data);
                let n = usize::try_from(h.numrec.min(MAX_DISCOVERY_ENTRIES)).unwrap_or(0);
                self.info.genctr = h.genctr;
                self.info.discovery = data
                    .chunks_exact(DISCOVERY_RECORD_LEN)
                    .skip(1)
                    .take(n)
                    .map(DiscoveryEntry::parse)
                    .collect();
                Step::LogRecheck
            }
            Step::LogRecheck => {
                let h = DiscoveryHeader::parse(data);
                if h.genctr == self.info.genctr {
                    Step::Done
                } else if self.log_retries < DISCOVERY_RETRIES {
                    self.log_retries += 1;
                    Step::LogHeader
                } else {
                    return Err(BringupError::Invalid(
                        "the Discovery log kept changing (GENCTR) while read",
                    ));
                }
            }
            Step::Authenticate | Step::Done | Step::Failed => {
                return Err(BringupError::Invalid("bring-up is over"))
            }
        };
        Ok(())
    }
}

/// Keep Alive at half of KATO (NVMe Base 2.0 §3.9), with a check that each one is answered
/// within KATO.
#[derive(Debug, Clone)]
pub struct KeepAlive {
    kato: Duration,
    next: Instant,
    outstanding_since: Option<Instant>,
}

/// A Keep Alive stayed unanswered for KATO: the association is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("keep alive unanswered for {0:?} (KATO)")]
pub struct KeepAliveExpired(pub Duration);

impl KeepAlive {
    /// `None` when KATO is 0 (no keep alive).
    #[must_use]
    pub fn new(kato_ms: u32, now: Instant) -> Option<Self> {
        let kato = Duration::from_millis(u64::from(kato_ms));
        (kato_ms != 0).then(|| Self {
            kato,
            next: now + kato / 2,
            outstanding_since: None,
        })
    }

    /// When [`KeepAlive::handle_timeout`] wants to run.
    #[must_use]
    pub fn poll_timeout(&self) -> Instant {
        match self.outstanding_since {
            Some(t) => t + self.kato,
            None => self.next,
        }
    }

    /// A Keep Alive to send when one is due.
    ///
    /// # Errors
    /// The last one went unanswered for KATO.
    pub fn handle_timeout(
        &mut self,
        now: Instant,
    ) -> Result<Option<HostCommand>, KeepAliveExpired> {
        if let Some(t) = self.outstanding_since {
            if now >= t + self.kato {
                return Err(KeepAliveExpired(self.kato));
            }
            return Ok(None);
        }
        if now < self.next {
            return Ok(None);
        }
        self.outstanding_since = Some(now);
        Ok(Some(HostCommand::plain(cmd::keep_alive())))
    }

    /// The Keep Alive was answered.
    pub fn answered(&mut self, now: Instant) {
        self.outstanding_since = None;
        self.next = now + self.kato / 2;
    }
}
