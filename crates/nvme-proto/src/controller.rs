//! The NVMe controller side without I/O (issue 30): Fabrics Connect, Property Get/Set and
//! Authentication dispatch (NVMe over Fabrics 1.1 §3), the admin commands a Linux host needs
//! (NVMe Base 2.0 §5), the NVM command set's I/O commands (NVM Command Set 1.0 §3), keep-alive,
//! asynchronous events and the discovery controller (NVMe over Fabrics 1.1 §5).
//!
//! # How a driver uses it
//! - One [`Target`] holds the subsystems (from [`TargetConfig`]) and their controllers.
//! - A queue's first command is Connect (NVMe over Fabrics 1.1 §3.3): [`Target::connect`]
//!   answers it and, on success, returns the connection's [`Queue`]. QID 0 creates a
//!   controller with a dynamic CNTLID; an I/O queue joins it by CNTLID.
//! - Admin commands (and every Fabrics command) go through [`Target::submit`]. I/O commands go
//!   through [`Queue::submit`], which needs no `&mut Target`: an I/O queue holds the
//!   namespaces as `Arc`s and the controller's liveness as atomics, so connections need no
//!   lock shared by all of them. [`Target::submit`] on an I/O queue delegates to it.
//! - I/O becomes [`BlockRequest`]s ([`Submitted::Block`]); each result comes back through
//!   [`Queue::block_done`] with the request's tag, and the last one yields the [`Completion`].
//! - Timers and events: [`Target::poll_timeout`], [`Target::handle_timeout`] (keep-alive
//!   expiry), [`Target::poll_event`] (AER completions for an admin queue, queues to close),
//!   [`Target::disconnect`] when a connection goes away.
//! - Authentication (TP 8006): an [`AuthPolicy`] decides per host whether Connect answers with
//!   AUTHREQ.ATR; until the queue's transaction succeeds, every command but Authentication
//!   Send/Receive completes with Authentication Required.

mod admin;
mod auth_hook;
mod config;
mod io;
mod pages;
mod resv;

pub use auth_hook::{AuthOutcome, AuthPolicy, AuthTransaction, DhchapHosts};
pub use config::{
    AllowedHosts, ConfigError, DiscoveryEntry, NamespaceConfig, SubsystemConfig, TargetConfig,
    DISCOVERY_NQN,
};
pub use io::{BlockError, BlockOp, BlockRequest};
pub use resv::{AcquireAction, RegisterAction, Registrant, Reservation, ReservationStatus, RTYPES};

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use nvme_wire::fabrics::{
    Auth, Connect, ConnectData, ConnectResponse, FabricsCommand, FabricsKind, CNTLID_DYNAMIC,
    SECP_NVME_AUTH, SPSP_DHCHAP,
};
use nvme_wire::{Cqe, Sgl, Status};

use crate::command::{Command, Completion};

/// What [`Target::submit`] or [`Queue::submit`] did with a command.
#[derive(Debug)]
pub enum Submitted {
    /// The command is complete: send this.
    Done(Completion),
    /// The command needs these block requests (one or more: DSM with several ranges, a Flush
    /// of every namespace). Hand each result to [`Queue::block_done`]; the last one returns
    /// the completion.
    Block(Vec<BlockRequest>),
    /// The command is held (an Asynchronous Event Request): its completion comes later as
    /// [`Event::AdminCompletion`].
    Held,
}

/// Something the driver must act on, from [`Target::poll_event`].
#[derive(Debug)]
pub enum Event {
    /// Send `completion` on the admin queue of controller `cntlid` (an Asynchronous Event
    /// Request completing).
    AdminCompletion { cntlid: u16, completion: Completion },
    /// Close every queue of controller `cntlid` (its connections); it no longer exists.
    CloseController { cntlid: u16, reason: CloseReason },
    /// Close the I/O queues of controller `cntlid`: CC.EN was cleared or a shutdown was
    /// requested (NVMe Base 2.0 §3.7); the admin queue stays.
    CloseIoQueues { cntlid: u16 },
}

/// Why a controller went away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CloseReason {
    /// No Keep Alive within KATO (NVMe Base 2.0 §3.9).
    KeepAliveExpired,
    /// Its admin queue was disconnected.
    AdminQueueGone,
    /// The target removed the subsystem.
    Removed,
    /// The subsystem's host list no longer allows its host ([`Target::set_allowed_hosts`]).
    HostNotAllowed,
    /// The host's DH-HMAC-CHAP secrets for the subsystem changed or were removed
    /// ([`Target::set_auth`]): it authenticated with secrets no longer configured.
    SecretsChanged,
}

/// Invalid Parameter Offset / Attribute of a Connect Invalid Parameters completion
/// (NVMe over Fabrics 1.1 §3.3, Connect response): IATTR (bit 16) 1 = the offset is in the
/// Connect data, 0 = in the SQE.
fn ipo_data(offset: u32) -> u32 {
    1 << 16 | offset
}
fn ipo_sqe(offset: u32) -> u32 {
    offset
}

/// A completion for `cid` with `status` and DNR set when it is an error.
pub(crate) fn done(cid: u16, status: Status) -> Completion {
    let mut cqe = Cqe::new(cid, status);
    cqe.dnr = !status.is_success();
    Completion {
        cqe,
        data: Bytes::new(),
    }
}

/// A successful completion with data.
pub(crate) fn done_data(cid: u16, data: Bytes) -> Completion {
    Completion {
        cqe: Cqe::new(cid, Status::SUCCESS),
        data,
    }
}

/// A successful completion with DW0.
pub(crate) fn done_dw0(cid: u16, dw0: u32) -> Completion {
    let mut cqe = Cqe::new(cid, Status::SUCCESS);
    cqe.dw0 = dw0;
    Completion {
        cqe,
        data: Bytes::new(),
    }
}

/// Command Aborted due to SQ Deletion (NVMe Base 2.0 §4.6.1.2.1, 08h): the queue's
/// controller was reset or is gone.
pub(crate) const ABORTED_SQ_DELETION: Status = Status { sct: 0, sc: 0x08 };

/// Highest CNTLID the dynamic model hands out (FFF0h..FFFFh are reserved, NVMe Base 2.0 §5.1).
const CNTLID_MAX: u16 = 0xffef;

/// A namespace as the controller serves it.
#[derive(Debug)]
pub(crate) struct Namespace {
    pub(crate) cfg: NamespaceConfig,
    /// log2 of the block size.
    pub(crate) shift: u32,
    /// Size in blocks (NSZE).
    pub(crate) blocks: u64,
}

/// A subsystem's namespaces, sorted by NSID; replaced whole when they change.
#[derive(Debug, Default)]
pub(crate) struct NsTable {
    pub(crate) list: Vec<Arc<Namespace>>,
}

impl NsTable {
    pub(crate) fn get(&self, nsid: u32) -> Option<&Arc<Namespace>> {
        self.list
            .binary_search_by_key(&nsid, |n| n.cfg.nsid)
            .ok()
            .and_then(|i| self.list.get(i))
    }
}

/// What a subsystem's I/O queues share with the [`Target`]: the namespace table, behind a
/// generation counter so that a queue takes the lock only after a change.
#[derive(Debug, Default)]
pub(crate) struct SubsysShared {
    ns: Mutex<Arc<NsTable>>,
    gen: AtomicU64,
}

impl SubsysShared {
    fn table(&self) -> Arc<NsTable> {
        match self.ns.lock() {
            Ok(t) => Arc::clone(&t),
            Err(p) => Arc::clone(&p.into_inner()),
        }
    }
    fn replace(&self, table: NsTable) {
        let table = Arc::new(table);
        match self.ns.lock() {
            Ok(mut t) => *t = table,
            Err(p) => *p.into_inner() = table,
        }
        self.gen.fetch_add(1, Ordering::AcqRel);
    }
}

/// Counters of one controller (SMART / Health Information, NVMe Base 2.0 §5.16.1.3).
#[derive(Debug, Default)]
pub(crate) struct Stats {
    pub(crate) read_cmds: AtomicU64,
    pub(crate) write_cmds: AtomicU64,
    pub(crate) read_bytes: AtomicU64,
    pub(crate) write_bytes: AtomicU64,
}

/// What a controller's I/O queues share with the [`Target`]: whether it is ready, the epoch
/// (bumped by every reset, so queues of an earlier enable are dead), and counters.
#[derive(Debug, Default)]
pub(crate) struct CtrlShared {
    ready: AtomicBool,
    dead: AtomicBool,
    epoch: AtomicU64,
    pub(crate) stats: Stats,
}

#[derive(Debug)]
struct Subsystem {
    cfg: SubsystemConfig,
    discovery: bool,
    shared: Arc<SubsysShared>,
}

/// One connection's queue of one controller, returned by [`Target::connect`].
#[derive(Debug)]
pub struct Queue {
    qid: u16,
    cntlid: u16,
    sqsize: u16,
    subnqn: Arc<str>,
    hostnqn: Arc<str>,
    hostid: [u8; 16],
    discovery: bool,
    ctrl: Arc<CtrlShared>,
    epoch: u64,
    subsys: Arc<SubsysShared>,
    pub(crate) ns: Arc<NsTable>,
    ns_gen: u64,
    /// The queue's DH-HMAC-CHAP state when Connect set AUTHREQ.ATR (TP 8006); it handles
    /// re-authentication itself.
    auth: Option<Box<dyn AuthTransaction>>,
    pub(crate) max_transfer: u32,
    pub(crate) io: io::Pending,
    sq_flow_disabled: bool,
}

impl Queue {
    /// The queue identifier (0 = admin).
    #[must_use]
    pub fn qid(&self) -> u16 {
        self.qid
    }
    /// The controller this queue belongs to.
    #[must_use]
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    /// Submission queue size in entries (Connect's SQSIZE + 1): the most commands the host
    /// may have outstanding on this queue.
    #[must_use]
    pub fn size(&self) -> u32 {
        u32::from(self.sqsize) + 1
    }
    /// The subsystem NQN.
    #[must_use]
    pub fn subnqn(&self) -> &str {
        &self.subnqn
    }
    /// The host NQN.
    #[must_use]
    pub fn hostnqn(&self) -> &str {
        &self.hostnqn
    }
    /// The host's Host Identifier (HOSTID of Connect, NVMe over Fabrics 1.1 §3.3): with the
    /// host NQN, the host's identity in a namespace's reservations (NVMe Base 2.0 §8.19).
    #[must_use]
    pub fn hostid(&self) -> [u8; 16] {
        self.hostid
    }
    /// Whether the host disabled SQ flow control (Connect CATTR bit 2, NVMe over Fabrics 1.1
    /// §3.3): completions then carry SQHD FFFFh and need not be paced by it.
    #[must_use]
    pub fn sq_flow_disabled(&self) -> bool {
        self.sq_flow_disabled
    }

    /// Whether this queue's controller is a discovery controller.
    #[must_use]
    pub fn is_discovery(&self) -> bool {
        self.discovery
    }
    /// Whether the host still has to complete an authentication transaction on this queue.
    #[must_use]
    pub fn auth_pending(&self) -> bool {
        self.auth
            .as_ref()
            .is_some_and(|t| t.outcome() != AuthOutcome::Succeeded)
    }
    /// Whether the queue can still run commands: its controller exists and has not been reset
    /// since the queue connected (the admin queue survives a reset, I/O queues do not).
    #[must_use]
    pub fn is_live(&self) -> bool {
        !self.ctrl.dead.load(Ordering::Acquire)
            && (self.qid == 0 || self.ctrl.epoch.load(Ordering::Acquire) == self.epoch)
    }

    /// Runs a command on an I/O queue without the [`Target`]: the NVM command set's I/O
    /// commands and Authentication Send/Receive. On the admin queue every command completes
    /// with Command Sequence Error: use [`Target::submit`] there.
    pub fn submit(&mut self, cmd: Command, _now: Instant) -> Submitted {
        let cid = cmd.sqe.cid;
        if self.qid == 0 {
            return Submitted::Done(done(cid, Status::COMMAND_SEQUENCE_ERROR));
        }
        if !self.is_live() || !self.ctrl.ready.load(Ordering::Acquire) {
            return Submitted::Done(done(cid, ABORTED_SQ_DELETION));
        }
        if cmd.sqe.opcode == nvme_wire::fabrics::OPCODE_FABRICS {
            return Submitted::Done(self.fabrics_on_io(&cmd));
        }
        if self.auth_pending() {
            return Submitted::Done(done(cid, Status::AUTHENTICATION_REQUIRED));
        }
        self.refresh_ns();
        io::submit(self, cmd)
    }

    /// Takes the subsystem's namespace table again if it changed since the last look (one
    /// atomic load when it did not).
    fn refresh_ns(&mut self) {
        let gen = self.subsys.gen.load(Ordering::Acquire);
        if gen != self.ns_gen {
            self.ns = self.subsys.table();
            self.ns_gen = gen;
        }
    }

    /// The result of the block request `tag`: the read bytes for [`BlockOp::Read`], empty
    /// for the others. Returns the command's completion once its last request is done;
    /// `None` while others are outstanding or for an unknown tag.
    pub fn block_done(
        &mut self,
        tag: u64,
        result: Result<Bytes, BlockError>,
    ) -> Option<Completion> {
        io::block_done(self, tag, result)
    }

    /// Block requests issued and not yet answered through [`Queue::block_done`].
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.io.outstanding()
    }

    fn fabrics_on_io(&mut self, cmd: &Command) -> Completion {
        let cid = cmd.sqe.cid;
        match FabricsCommand::decode(&cmd.sqe) {
            Err(e) => done(cid, e.status().unwrap_or(Status::INVALID_FIELD)),
            Ok(f) => match f.kind {
                FabricsKind::AuthSend(a) => self.auth_send(cid, a, &cmd.data),
                FabricsKind::AuthReceive(a) => self.auth_receive(cid, a, cmd.sqe.sgl),
                FabricsKind::Connect(_) => done(cid, Status::COMMAND_SEQUENCE_ERROR),
                // NVMe over Fabrics 1.1 §3.4-§3.5: properties are reached through the admin
                // queue only.
                FabricsKind::PropertyGet(_) | FabricsKind::PropertySet(_) => {
                    done(cid, Status::INVALID_OPCODE)
                }
            },
        }
    }

    fn auth_fields_ok(a: &Auth) -> bool {
        a.secp == SECP_NVME_AUTH && a.spsp0 == SPSP_DHCHAP && a.spsp1 == SPSP_DHCHAP
    }

    /// Authentication Send (NVMe over Fabrics 1.1 §3.6; TP 8006).
    fn auth_send(&mut self, cid: u16, a: Auth, data: &Bytes) -> Completion {
        if !Self::auth_fields_ok(&a) || a.len == 0 {
            return done(cid, Status::INVALID_FIELD);
        }
        if u64::from(a.len) != data.len() as u64 {
            return done(cid, Status::DATA_SGL_LENGTH_INVALID);
        }
        // No secret for this host: Connect did not ask for authentication.
        let Some(txn) = &mut self.auth else {
            return done(cid, Status::INVALID_OPCODE);
        };
        match txn.send(data) {
            Ok(()) => done(cid, Status::SUCCESS),
            Err(s) => done(cid, s),
        }
    }

    /// Authentication Receive (NVMe over Fabrics 1.1 §3.7; TP 8006).
    fn auth_receive(&mut self, cid: u16, a: Auth, sgl: Sgl) -> Completion {
        if !Self::auth_fields_ok(&a) || a.len == 0 {
            return done(cid, Status::INVALID_FIELD);
        }
        if sgl.length() < a.len {
            return done(cid, Status::DATA_SGL_LENGTH_INVALID);
        }
        let Some(txn) = &mut self.auth else {
            return done(cid, Status::INVALID_OPCODE);
        };
        match txn.receive(a.len) {
            Ok(mut msg) => {
                msg.truncate(a.len as usize);
                done_data(cid, msg)
            }
            Err(s) => done(cid, s),
        }
    }
}

/// One controller (NVMe Base 2.0 §3.1) and what only its admin queue changes.
#[derive(Debug)]
pub(crate) struct Ctrl {
    pub(crate) cntlid: u16,
    subsys: usize,
    pub(crate) discovery: bool,
    hostnqn: Arc<str>,
    pub(crate) hostid: [u8; 16],
    pub(crate) shared: Arc<CtrlShared>,
    pub(crate) cc: u32,
    pub(crate) csts: u32,
    /// Keep Alive Timeout in milliseconds; 0 = none.
    pub(crate) kato: u32,
    deadline: Option<Instant>,
    /// I/O queues granted by Number of Queues (I/O queue IDs 1..=this may connect).
    pub(crate) io_queues: u16,
    io_qids: BTreeSet<u16>,
    /// Asynchronous Event Configuration (Set Features 0Bh).
    pub(crate) aec: u32,
    /// Volatile Write Cache enable (Set Features 06h).
    pub(crate) wce: bool,
    /// The subsystem has a volatile write cache (VWC present).
    pub(crate) vwc_present: bool,
    pub(crate) arbitration: u32,
    /// Held Asynchronous Event Requests (CIDs).
    pub(crate) aers: VecDeque<u16>,
    /// Events to report, as AER completion DW0s.
    pub(crate) aen_queue: VecDeque<u32>,
    /// Log pages whose event was reported and not yet read (their events are masked).
    pub(crate) aen_masked: BTreeSet<u8>,
    /// Changed Namespace List (log page 04h); `None` = more than 1024 changed.
    pub(crate) changed_ns: Option<BTreeSet<u32>>,
    /// Reservation Notification Mask (Set Features 82h) per NSID; absent = 0.
    pub(crate) resv_mask: BTreeMap<u32, u32>,
    /// Reservation Notification log pages not read yet (log page 80h), oldest first.
    pub(crate) resv_log: VecDeque<ResvLogEntry>,
    /// The Log Page Count of the last notification (0: none yet).
    pub(crate) resv_count: u64,
}

/// One Reservation Notification log page (NVMe Base 2.0 §5.16.1.25).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ResvLogEntry {
    pub(crate) count: u64,
    pub(crate) notice: ReservationNotice,
    pub(crate) nsid: u32,
}

/// At most this many Reservation Notification log pages wait to be read per controller; a
/// later notification is lost (the host sees the gap in Log Page Count).
pub(crate) const RESV_LOG_MAX: usize = 255;

/// What a Reservation Notification log page reports (its Log Page Type, NVMe Base 2.0
/// §5.16.1.25; when each is generated: §8.19); the value is the type and the Reservation
/// Notification Mask (feature 82h) bit that masks it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum ReservationNotice {
    /// Another host preempted this host's registration (REGPRE).
    RegistrationPreempted = 1,
    /// The reservation was released, by its holder or with its last registration (RESREL).
    ReservationReleased = 2,
    /// The reservation was preempted or cleared by another host (RESPRE).
    ReservationPreempted = 3,
}

impl Ctrl {
    pub(crate) fn io_qids_connected(&self) -> bool {
        !self.io_qids.is_empty()
    }
}

/// What the transport knows about the connection a Connect arrives on.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Channel {
    /// The connection is TLS, keyed with a PSK whose identity names these NQNs (TP 8011);
    /// `None` on plain TCP.
    pub tls: Option<TlsPeer>,
}

/// The NQNs a TLS PSK identity names (`psk::PskIdentity`'s host and subsystem NQN).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsPeer {
    pub hostnqn: String,
    pub subnqn: String,
}

/// Information about a live controller (for `ipsan ctl` and metrics).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerInfo {
    pub cntlid: u16,
    pub subnqn: String,
    pub hostnqn: String,
    pub discovery: bool,
    /// Connected I/O queue IDs.
    pub io_queues: Vec<u16>,
    pub ready: bool,
    pub read_commands: u64,
    pub write_commands: u64,
    pub bytes_read: u64,
    pub bytes_written: u64,
}

/// The NVMe target: subsystems, their controllers and the discovery controller.
#[derive(Debug)]
pub struct Target {
    subsystems: Vec<Subsystem>,
    pub(crate) discovery: Vec<DiscoveryEntry>,
    pub(crate) genctr: u64,
    pub(crate) cfg: TargetConfig,
    ctrls: BTreeMap<u16, Ctrl>,
    next_cntlid: u16,
    events: VecDeque<Event>,
}

fn ns_table(sub: &SubsystemConfig, list: &[NamespaceConfig]) -> Result<NsTable, ConfigError> {
    let mut out = Vec::with_capacity(list.len());
    for n in list {
        let bad = |reason| ConfigError::Namespace {
            subnqn: sub.nqn.clone(),
            nsid: n.nsid,
            reason,
        };
        if n.nsid == 0 || n.nsid >= 0xffff_fffe {
            return Err(bad("NSID must be 1..=0xFFFFFFFD"));
        }
        if !n.block_size.is_power_of_two() || !(512..=65536).contains(&n.block_size) {
            return Err(bad("block size must be a power of two in 512..=65536"));
        }
        let shift = n.block_size.trailing_zeros();
        out.push(Arc::new(Namespace {
            cfg: n.clone(),
            shift,
            blocks: n.size >> shift,
        }));
    }
    out.sort_by_key(|n| n.cfg.nsid);
    if out.windows(2).any(|w| w[0].cfg.nsid == w[1].cfg.nsid) {
        return Err(ConfigError::Namespace {
            subnqn: sub.nqn.clone(),
            nsid: 0,
            reason: "NSID used twice",
        });
    }
    Ok(NsTable { list: out })
}

fn valid_nqn(n: &str) -> bool {
    !n.is_empty() && n.len() <= nvme_wire::fabrics::NQN_MAX_LEN && !n.contains('\0')
}

impl Target {
    /// A target serving `cfg`.
    ///
    /// # Errors
    /// [`ConfigError`] for an NQN or namespace that cannot be served, or impossible limits.
    pub fn new(cfg: TargetConfig) -> Result<Self, ConfigError> {
        if cfg.queue_size < 2 || cfg.max_io_queues == 0 || cfg.max_io_queues == u16::MAX {
            return Err(ConfigError::Limits(
                "queue_size must be ≥ 2 and max_io_queues 1..=65534",
            ));
        }
        if cfg.max_transfer != 0 && (cfg.max_transfer < 4096 || !cfg.max_transfer.is_power_of_two())
        {
            return Err(ConfigError::Limits(
                "max_transfer must be 0 or a power of two ≥ 4096",
            ));
        }
        let disc = SubsystemConfig {
            nqn: DISCOVERY_NQN.to_owned(),
            serial: String::new(),
            model: "ipsan discovery".to_owned(),
            namespaces: Vec::new(),
            hosts: AllowedHosts::Any,
            auth_required: cfg.discovery_auth_required && !cfg.discovery_open,
            volatile_write_cache: false,
        };
        let mut subsystems = vec![Subsystem {
            cfg: disc,
            discovery: true,
            shared: Arc::default(),
        }];
        for s in &cfg.subsystems {
            if !valid_nqn(&s.nqn) || subsystems.iter().any(|x| x.cfg.nqn == s.nqn) {
                return Err(ConfigError::Nqn(s.nqn.clone()));
            }
            let table = ns_table(s, &s.namespaces)?;
            let shared = Arc::new(SubsysShared::default());
            shared.replace(table);
            subsystems.push(Subsystem {
                cfg: s.clone(),
                discovery: false,
                shared,
            });
        }
        Ok(Self {
            subsystems,
            discovery: cfg.discovery.clone(),
            genctr: 1,
            cfg,
            ctrls: BTreeMap::new(),
            next_cntlid: 1,
            events: VecDeque::new(),
        })
    }

    /// The in-capsule data size I/O queues accept (the queue machine's limit).
    #[must_use]
    pub fn in_capsule_data(&self) -> u32 {
        self.cfg.in_capsule_data
    }

    /// Answers a queue's first command, which must be Connect (NVMe over Fabrics 1.1 §3.3).
    /// On success the connection's [`Queue`] and the Connect completion (CNTLID, AUTHREQ);
    /// otherwise the completion refusing it (the connection may try again or close).
    ///
    /// # Errors
    /// The refusing completion: Connect Incompatible Format (RECFMT), Connect Invalid
    /// Parameters with IATTR/IPO in DW0 (unknown SUBNQN, CNTLID, QID, SQSIZE), Connect Invalid
    /// Host (host not allowed, or authentication required and no secret for it), Command
    /// Sequence Error (not a Connect; I/O queue before CC.EN).
    ///
    /// This is a Connect on a plain TCP connection; a connection keyed with TLS must use
    /// [`Target::connect_on`] so that its PSK identity is checked against the Connect.
    pub fn connect(
        &mut self,
        cmd: &Command,
        now: Instant,
    ) -> Result<(Queue, Completion), Completion> {
        self.connect_on(cmd, now, &Channel::default())
    }

    /// [`Target::connect`] on a connection the transport describes: with TLS (TP 8011), the
    /// PSK identity authenticated a host NQN and a subsystem NQN, and the Connect must name
    /// exactly those (otherwise Connect Invalid Host, IPO at the differing NQN); without it,
    /// a target with [`TargetConfig::require_tls`] refuses every subsystem but discovery
    /// (Connect Invalid Host).
    ///
    /// # Errors
    /// As [`Target::connect`], and the refusals above.
    pub fn connect_on(
        &mut self,
        cmd: &Command,
        now: Instant,
        channel: &Channel,
    ) -> Result<(Queue, Completion), Completion> {
        let cid = cmd.sqe.cid;
        let f = FabricsCommand::decode(&cmd.sqe)
            .map_err(|e| done(cid, e.status().unwrap_or(Status::INVALID_FIELD)))?;
        let FabricsKind::Connect(c) = f.kind else {
            return Err(done(cid, Status::COMMAND_SEQUENCE_ERROR));
        };
        let invalid = |ipo: u32| {
            let mut r = done(cid, Status::CONNECT_INVALID_PARAMETERS);
            r.cqe.dw0 = ipo;
            r
        };
        if c.recfmt != 0 {
            return Err(done(cid, Status::CONNECT_INCOMPATIBLE_FORMAT));
        }
        if cmd.data.len() != nvme_wire::fabrics::CONNECT_DATA_LEN
            || cmd.sqe.sgl.length() as usize != cmd.data.len()
        {
            return Err(done(cid, Status::DATA_SGL_LENGTH_INVALID));
        }
        let d = ConnectData::decode(&cmd.data).map_err(|e| match e {
            nvme_wire::WireError::InvalidCommand { offset, .. } => invalid(ipo_data(offset)),
            _ => done(cid, Status::DATA_SGL_LENGTH_INVALID),
        })?;
        let Some(si) = self.subsystems.iter().position(|s| s.cfg.nqn == d.subnqn) else {
            return Err(invalid(ipo_data(256)));
        };
        let host_refused = |ipo: u32| {
            let mut r = done(cid, Status::CONNECT_INVALID_HOST);
            r.cqe.dw0 = ipo;
            r
        };
        match &channel.tls {
            // TP 8011: the PSK authenticates the host its identity names, for the subsystem
            // it names; a Connect claiming others is refused (the same check as
            // `psk::PskIdentity::names`).
            Some(p) if p.hostnqn != d.hostnqn => return Err(host_refused(ipo_data(512))),
            Some(p) if p.subnqn != d.subnqn => return Err(host_refused(ipo_data(256))),
            None if self.cfg.require_tls && !self.subsystems[si].discovery => {
                return Err(host_refused(ipo_data(512)))
            }
            _ => {}
        }
        if !self.subsystems[si].cfg.hosts.allows(&d.hostnqn) {
            return Err(host_refused(ipo_data(512)));
        }
        // SQSIZE is 0's based; a queue of one entry is invalid (NVMe Base 2.0 §4.1.3).
        if c.sqsize == 0 || c.sqsize >= self.cfg.queue_size {
            return Err(invalid(ipo_sqe(44)));
        }
        let r = if c.qid == 0 {
            self.connect_admin(cmd, c, &d, si, now)
        } else {
            self.connect_io(cmd, c, &d, si)
        };
        r.map_err(|e| match e {
            ConnectRefusal::Invalid(ipo) => invalid(ipo),
            ConnectRefusal::Host(ipo) => host_refused(ipo),
            ConnectRefusal::Busy => done(cid, Status::CONNECT_CONTROLLER_BUSY),
            ConnectRefusal::Sequence => done(cid, Status::COMMAND_SEQUENCE_ERROR),
        })
    }

    fn begin_auth(
        &self,
        si: usize,
        hostnqn: &str,
        qid: u16,
        cntlid: u16,
    ) -> Result<Option<Box<dyn AuthTransaction>>, ConnectRefusal> {
        // The discovery controller too (its NQN is the subsystem NQN of the transaction):
        // with secrets configured, the log is read only by hosts that proved one.
        let sub = &self.subsystems[si];
        if sub.discovery && self.cfg.discovery_open {
            return Ok(None);
        }
        let txn = self
            .cfg
            .auth
            .as_ref()
            .and_then(|p| p.begin(&sub.cfg.nqn, hostnqn, qid, cntlid));
        match txn {
            None if sub.cfg.auth_required => Err(ConnectRefusal::Host(ipo_data(512))),
            t => Ok(t),
        }
    }

    fn new_queue(
        &self,
        si: usize,
        ctrl: &Ctrl,
        qid: u16,
        sqsize: u16,
        auth: Option<Box<dyn AuthTransaction>>,
    ) -> Queue {
        let sub = &self.subsystems[si];
        Queue {
            qid,
            cntlid: ctrl.cntlid,
            sqsize,
            subnqn: Arc::from(sub.cfg.nqn.as_str()),
            hostnqn: Arc::clone(&ctrl.hostnqn),
            hostid: ctrl.hostid,
            discovery: sub.discovery,
            ctrl: Arc::clone(&ctrl.shared),
            epoch: ctrl.shared.epoch.load(Ordering::Acquire),
            subsys: Arc::clone(&sub.shared),
            ns: sub.shared.table(),
            ns_gen: sub.shared.gen.load(Ordering::Acquire),
            auth,
            max_transfer: self.cfg.max_transfer,
            io: io::Pending::default(),
            sq_flow_disabled: false,
        }
    }

    fn connect_admin(
        &mut self,
        cmd: &Command,
        c: Connect,
        d: &ConnectData,
        si: usize,
        now: Instant,
    ) -> Result<(Queue, Completion), ConnectRefusal> {
        // The dynamic controller model only (NVMe over Fabrics 1.1 §4.2): CNTLID FFFFh.
        if d.cntlid != CNTLID_DYNAMIC {
            return Err(ConnectRefusal::Invalid(ipo_data(16)));
        }
        let Some(cntlid) = self.alloc_cntlid() else {
            return Err(ConnectRefusal::Busy);
        };
        let auth = self.begin_auth(si, &d.hostnqn, 0, cntlid)?;
        let atr = auth.is_some();
        let discovery = self.subsystems[si].discovery;
        let ctrl = Ctrl {
            cntlid,
            subsys: si,
            discovery,
            hostnqn: Arc::from(d.hostnqn.as_str()),
            hostid: d.hostid,
            shared: Arc::default(),
            cc: 0,
            csts: 0,
            kato: c.kato,
            deadline: (c.kato != 0).then(|| now + Duration::from_millis(u64::from(c.kato))),
            io_queues: if discovery { 0 } else { self.cfg.max_io_queues },
            io_qids: BTreeSet::new(),
            aec: 0,
            wce: self.subsystems[si].cfg.volatile_write_cache,
            vwc_present: self.subsystems[si].cfg.volatile_write_cache,
            arbitration: 0,
            aers: VecDeque::new(),
            aen_queue: VecDeque::new(),
            aen_masked: BTreeSet::new(),
            changed_ns: Some(BTreeSet::new()),
            resv_mask: BTreeMap::new(),
            resv_log: VecDeque::new(),
            resv_count: 0,
        };
        let mut q = self.new_queue(si, &ctrl, 0, c.sqsize, auth);
        q.sq_flow_disabled = c.cattr & CATTR_DISABLE_SQFLOW != 0;
        self.ctrls.insert(cntlid, ctrl);
        let mut r = done_dw0(
            cmd.sqe.cid,
            ConnectResponse {
                cntlid,
                atr,
                ascr: false,
            }
            .dw0(),
        );
        r.cqe.sqhd = if q.sq_flow_disabled { 0xffff } else { 0 };
        Ok((q, r))
    }

    fn connect_io(
        &mut self,
        cmd: &Command,
        c: Connect,
        d: &ConnectData,
        si: usize,
    ) -> Result<(Queue, Completion), ConnectRefusal> {
        let Some(ctrl) = self.ctrls.get(&d.cntlid) else {
            return Err(ConnectRefusal::Invalid(ipo_data(16)));
        };
        if ctrl.subsys != si || *ctrl.hostnqn != *d.hostnqn {
            return Err(ConnectRefusal::Invalid(ipo_data(16)));
        }
        // The same host: its Host Identifier must match the admin queue's (NVMe over
        // Fabrics 1.1 §3.3).
        if ctrl.hostid != d.hostid {
            return Err(ConnectRefusal::Host(ipo_data(0)));
        }
        if ctrl.discovery || c.qid > ctrl.io_queues {
            return Err(ConnectRefusal::Invalid(ipo_sqe(42)));
        }
        // A QID already connected: Command Sequence Error, as Linux's nvmet answers.
        if ctrl.io_qids.contains(&c.qid) {
            return Err(ConnectRefusal::Sequence);
        }
        if ctrl.csts & CSTS_RDY == 0 {
            return Err(ConnectRefusal::Sequence);
        }
        let auth = self.begin_auth(si, &d.hostnqn, c.qid, d.cntlid)?;
        let atr = auth.is_some();
        let mut q = self.new_queue(si, ctrl, c.qid, c.sqsize, auth);
        q.sq_flow_disabled = c.cattr & CATTR_DISABLE_SQFLOW != 0;
        if let Some(ctrl) = self.ctrls.get_mut(&d.cntlid) {
            ctrl.io_qids.insert(c.qid);
        }
        let mut r = done_dw0(
            cmd.sqe.cid,
            ConnectResponse {
                cntlid: d.cntlid,
                atr,
                ascr: false,
            }
            .dw0(),
        );
        if q.sq_flow_disabled {
            r.cqe.sqhd = 0xffff;
        }
        Ok((q, r))
    }

    fn alloc_cntlid(&mut self) -> Option<u16> {
        for _ in 0..CNTLID_MAX {
            let id = self.next_cntlid;
            self.next_cntlid = if id >= CNTLID_MAX { 1 } else { id + 1 };
            if !self.ctrls.contains_key(&id) {
                return Some(id);
            }
        }
        None
    }

    /// Runs a command on any queue: Fabrics commands and admin commands on the admin queue;
    /// on an I/O queue the same as [`Queue::submit`].
    pub fn submit(&mut self, q: &mut Queue, cmd: Command, now: Instant) -> Submitted {
        if q.qid != 0 {
            return q.submit(cmd, now);
        }
        let cid = cmd.sqe.cid;
        if !q.is_live() {
            return Submitted::Done(done(cid, ABORTED_SQ_DELETION));
        }
        if cmd.sqe.opcode == nvme_wire::fabrics::OPCODE_FABRICS {
            return Submitted::Done(self.fabrics_on_admin(q, &cmd));
        }
        if q.auth_pending() {
            return Submitted::Done(done(cid, Status::AUTHENTICATION_REQUIRED));
        }
        let Some(ctrl) = self.ctrls.get_mut(&q.cntlid) else {
            return Submitted::Done(done(cid, ABORTED_SQ_DELETION));
        };
        // Admin commands other than Fabrics ones need CC.EN = 1 and CSTS.RDY = 1 (NVMe Base
        // 2.0 §3.5.1); Linux's nvmet answers Command Sequence Error too.
        if ctrl.cc & CC_EN == 0 || ctrl.csts & CSTS_RDY == 0 {
            return Submitted::Done(done(cid, Status::COMMAND_SEQUENCE_ERROR));
        }
        q.refresh_ns();
        admin::submit(self, q, cmd, now)
    }

    fn fabrics_on_admin(&mut self, q: &mut Queue, cmd: &Command) -> Completion {
        let cid = cmd.sqe.cid;
        let f = match FabricsCommand::decode(&cmd.sqe) {
            Ok(f) => f,
            Err(e) => return done(cid, e.status().unwrap_or(Status::INVALID_FIELD)),
        };
        match f.kind {
            FabricsKind::AuthSend(a) => q.auth_send(cid, a, &cmd.data),
            FabricsKind::AuthReceive(a) => q.auth_receive(cid, a, cmd.sqe.sgl),
            FabricsKind::Connect(_) => done(cid, Status::COMMAND_SEQUENCE_ERROR),
            // TP 8006: until the transaction succeeds, everything else is refused.
            _ if q.auth_pending() => done(cid, Status::AUTHENTICATION_REQUIRED),
            FabricsKind::PropertyGet(p) => match self.ctrls.get(&q.cntlid) {
                Some(ctrl) => admin::property_get(self, ctrl, cid, p),
                None => done(cid, ABORTED_SQ_DELETION),
            },
            FabricsKind::PropertySet(p) => self.property_set(q.cntlid, cid, p),
        }
    }

    /// Property Set (NVMe over Fabrics 1.1 §3.5): only CC is writable.
    fn property_set(
        &mut self,
        cntlid: u16,
        cid: u16,
        p: nvme_wire::fabrics::PropertySet,
    ) -> Completion {
        use nvme_wire::fabrics::Property;
        if p.property != Property::Cc || p.size8 {
            return done(cid, Status::INVALID_FIELD);
        }
        let Some(ctrl) = self.ctrls.get_mut(&cntlid) else {
            return done(cid, ABORTED_SQ_DELETION);
        };
        let new = (p.value & 0xffff_ffff) as u32;
        let old = ctrl.cc;
        let mut close_io = false;
        if new & CC_EN != 0 && old & CC_EN == 0 {
            // Enable (NVMe Base 2.0 §3.5.1): the I/O queue entry sizes must be the NVM
            // command set's (64 and 16 bytes) on an I/O controller, the page size 4 KiB,
            // round robin and the NVM command set; otherwise Controller Fatal Status.
            let iosqes = (new >> 16) & 0xf;
            let iocqes = (new >> 20) & 0xf;
            let mps = (new >> 7) & 0xf;
            let ams = (new >> 11) & 0x7;
            let css = (new >> 4) & 0x7;
            let entries_ok =
                ctrl.discovery && iosqes == 0 && iocqes == 0 || iosqes == 6 && iocqes == 4;
            if entries_ok && mps == 0 && ams == 0 && css == 0 {
                ctrl.csts |= CSTS_RDY;
                ctrl.shared.ready.store(true, Ordering::Release);
            } else {
                ctrl.csts |= CSTS_CFS;
            }
        } else if new & CC_EN == 0 && old & CC_EN != 0 {
            // Reset (NVMe Base 2.0 §3.7.2): I/O queues are gone, RDY clears.
            close_io = true;
            ctrl.csts &= !(CSTS_RDY | CSTS_CFS);
        }
        let shn_new = (new >> 14) & 0x3;
        let shn_old = (old >> 14) & 0x3;
        if shn_new != 0 && shn_old == 0 {
            // Shutdown (NVMe Base 2.0 §3.6): done at once, nothing is cached here.
            close_io = true;
            ctrl.csts = (ctrl.csts & !(CSTS_RDY | CSTS_SHST_MASK)) | CSTS_SHST_COMPLETE;
        } else if shn_new == 0 && shn_old != 0 {
            ctrl.csts &= !CSTS_SHST_MASK;
        }
        ctrl.cc = new;
        if close_io {
            ctrl.shared.ready.store(false, Ordering::Release);
            ctrl.shared.epoch.fetch_add(1, Ordering::AcqRel);
            ctrl.io_qids.clear();
            self.events.push_back(Event::CloseIoQueues { cntlid });
        }
        done(cid, Status::SUCCESS)
    }

    /// Resets the keep-alive timer of `cntlid` (a Keep Alive command).
    pub(crate) fn keep_alive(&mut self, cntlid: u16, now: Instant) {
        if let Some(c) = self.ctrls.get_mut(&cntlid) {
            if c.kato != 0 {
                c.deadline = Some(now + Duration::from_millis(u64::from(c.kato)));
            }
        }
    }

    pub(crate) fn ctrl_mut(&mut self, cntlid: u16) -> Option<&mut Ctrl> {
        self.ctrls.get_mut(&cntlid)
    }

    pub(crate) fn ctrl(&self, cntlid: u16) -> Option<&Ctrl> {
        self.ctrls.get(&cntlid)
    }

    pub(crate) fn subsystem_cfg(&self, ctrl: &Ctrl) -> &SubsystemConfig {
        &self.subsystems[ctrl.subsys].cfg
    }

    /// Whether `hostnqn` may connect to the subsystem `nqn` (for the discovery log): its host
    /// list allows it, where authentication is required the host has a secret for it, and
    /// where TLS is required a key (a host keyed for one subsystem does not learn the others'
    /// NQNs).
    pub(crate) fn host_may_see(&self, nqn: &str, hostnqn: &str) -> bool {
        self.subsystems
            .iter()
            .find(|s| s.cfg.nqn == nqn)
            .is_some_and(|s| {
                s.discovery
                    || s.cfg.hosts.allows(hostnqn)
                        && (!s.cfg.auth_required
                            || self
                                .cfg
                                .auth
                                .as_ref()
                                .is_some_and(|p| p.covers(nqn, hostnqn)))
                        && (!self.cfg.require_tls
                            || self
                                .cfg
                                .tls_keys
                                .as_ref()
                                .is_none_or(|k| k.has_key(hostnqn, nqn)))
            })
    }

    /// The queue's controller's host NQN.
    pub(crate) fn hostnqn_of(&self, cntlid: u16) -> Option<Arc<str>> {
        self.ctrls.get(&cntlid).map(|c| Arc::clone(&c.hostnqn))
    }

    /// When [`Target::handle_timeout`] must next run: the earliest keep-alive deadline.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        self.ctrls.values().filter_map(|c| c.deadline).min()
    }

    /// Fails every controller whose Keep Alive Timeout passed without a Keep Alive (NVMe Base
    /// 2.0 §3.9: the controller is failed, CSTS.CFS, and its queues closed): reported as
    /// [`Event::CloseController`].
    pub fn handle_timeout(&mut self, now: Instant) {
        let expired: Vec<u16> = self
            .ctrls
            .values()
            .filter(|c| c.deadline.is_some_and(|d| d <= now))
            .map(|c| c.cntlid)
            .collect();
        for cntlid in expired {
            self.remove_ctrl(cntlid, CloseReason::KeepAliveExpired);
        }
    }

    fn remove_ctrl(&mut self, cntlid: u16, reason: CloseReason) {
        if let Some(mut c) = self.ctrls.remove(&cntlid) {
            c.csts |= CSTS_CFS;
            c.shared.ready.store(false, Ordering::Release);
            c.shared.dead.store(true, Ordering::Release);
            self.events
                .push_back(Event::CloseController { cntlid, reason });
        }
    }

    /// The next thing the driver must do, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// A connection went away. Losing the admin queue ends its controller (its I/O queues are
    /// reported in [`Event::CloseController`]); losing an I/O queue frees its QID.
    pub fn disconnect(&mut self, q: &Queue) {
        if q.qid == 0 {
            if self
                .ctrls
                .get(&q.cntlid)
                .is_some_and(|c| Arc::ptr_eq(&c.shared, &q.ctrl))
            {
                self.remove_ctrl(q.cntlid, CloseReason::AdminQueueGone);
            }
        } else if let Some(c) = self.ctrls.get_mut(&q.cntlid) {
            if Arc::ptr_eq(&c.shared, &q.ctrl) && c.shared.epoch.load(Ordering::Acquire) == q.epoch
            {
                c.io_qids.remove(&q.qid);
            }
        }
    }

    /// Live controllers.
    #[must_use]
    pub fn controllers(&self) -> Vec<ControllerInfo> {
        self.ctrls
            .values()
            .map(|c| ControllerInfo {
                cntlid: c.cntlid,
                subnqn: self.subsystems[c.subsys].cfg.nqn.clone(),
                hostnqn: c.hostnqn.to_string(),
                discovery: c.discovery,
                io_queues: c.io_qids.iter().copied().collect(),
                ready: c.csts & CSTS_RDY != 0,
                read_commands: c.shared.stats.read_cmds.load(Ordering::Relaxed),
                write_commands: c.shared.stats.write_cmds.load(Ordering::Relaxed),
                bytes_read: c.shared.stats.read_bytes.load(Ordering::Relaxed),
                bytes_written: c.shared.stats.write_bytes.load(Ordering::Relaxed),
            })
            .collect()
    }

    /// Replaces the namespaces of subsystem `subnqn` (an LU added, removed or resized).
    /// Controllers with Namespace Attribute Notices enabled get an asynchronous event
    /// (NVMe Base 2.0 §5.2, Namespace Attribute Changed) and the Changed Namespace List.
    ///
    /// # Errors
    /// [`ConfigError`] for an unknown subsystem or a namespace that cannot be served.
    pub fn set_namespaces(
        &mut self,
        subnqn: &str,
        namespaces: Vec<NamespaceConfig>,
    ) -> Result<(), ConfigError> {
        let Some(si) = self
            .subsystems
            .iter()
            .position(|s| !s.discovery && s.cfg.nqn == subnqn)
        else {
            return Err(ConfigError::Nqn(subnqn.to_owned()));
        };
        let table = ns_table(&self.subsystems[si].cfg, &namespaces)?;
        let old = self.subsystems[si].shared.table();
        let mut changed = BTreeSet::new();
        for n in &table.list {
            if old.get(n.cfg.nsid).is_none_or(|o| o.cfg != n.cfg) {
                changed.insert(n.cfg.nsid);
            }
        }
        for o in &old.list {
            if table.get(o.cfg.nsid).is_none() {
                changed.insert(o.cfg.nsid);
            }
        }
        self.subsystems[si].shared.replace(table);
        self.subsystems[si].cfg.namespaces = namespaces;
        if changed.is_empty() {
            return Ok(());
        }
        let ids: Vec<u16> = self
            .ctrls
            .values()
            .filter(|c| c.subsys == si)
            .map(|c| c.cntlid)
            .collect();
        for id in ids {
            if let Some(c) = self.ctrls.get_mut(&id) {
                if let Some(list) = &mut c.changed_ns {
                    list.extend(changed.iter().copied());
                    if list.len() > 1024 {
                        c.changed_ns = None;
                    }
                }
                if c.aec & admin::AEC_NS_ATTR != 0 {
                    admin::queue_event(c, admin::AEN_NS_CHANGED);
                }
            }
            self.deliver_events(id);
        }
        Ok(())
    }

    /// Replaces the hosts allowed to connect to subsystem `subnqn` (a live change of its host
    /// list): later Connects are checked against `hosts` (Connect Invalid Host, NVMe over
    /// Fabrics 1.1 §3.3), and every live controller of a host no longer allowed is closed
    /// ([`Event::CloseController`] with [`CloseReason::HostNotAllowed`]). The discovery log a
    /// host reads lists only the subsystems it may connect to, so its generation counter moves
    /// and discovery controllers that asked for it get a Discovery Log Page Change event.
    /// Returns the CNTLIDs closed.
    ///
    /// # Errors
    /// [`ConfigError::Nqn`] for an unknown subsystem (or the discovery subsystem).
    pub fn set_allowed_hosts(
        &mut self,
        subnqn: &str,
        hosts: AllowedHosts,
    ) -> Result<Vec<u16>, ConfigError> {
        let Some(si) = self
            .subsystems
            .iter()
            .position(|s| !s.discovery && s.cfg.nqn == subnqn)
        else {
            return Err(ConfigError::Nqn(subnqn.to_owned()));
        };
        if self.subsystems[si].cfg.hosts == hosts {
            return Ok(Vec::new());
        }
        let closed: Vec<u16> = self
            .ctrls
            .values()
            .filter(|c| c.subsys == si && !hosts.allows(&c.hostnqn))
            .map(|c| c.cntlid)
            .collect();
        self.subsystems[si].cfg.hosts = hosts;
        for &id in &closed {
            self.remove_ctrl(id, CloseReason::HostNotAllowed);
        }
        self.discovery_changed();
        Ok(closed)
    }

    /// Replaces the DH-HMAC-CHAP policy (a live change of the hosts' secrets: a reload) and
    /// whether every subsystem and the discovery controller require authentication. Later
    /// Connects use the new secrets; every live controller whose host's secrets for its
    /// subsystem changed (`stale(subnqn, hostnqn)`, which the caller decides by comparing
    /// the old and new secrets) or who now has none where authentication is required is
    /// closed ([`Event::CloseController`] with [`CloseReason::SecretsChanged`]): it proved
    /// secrets that are no longer configured. The discovery log a host reads lists only the
    /// subsystems it has secrets for, so its generation moves. Returns the CNTLIDs closed.
    pub fn set_auth(
        &mut self,
        auth: Option<Arc<dyn AuthPolicy>>,
        required: bool,
        stale: &dyn Fn(&str, &str) -> bool,
    ) -> Vec<u16> {
        self.cfg.auth = auth;
        self.cfg.discovery_auth_required = required;
        let open = self.cfg.discovery_open;
        for s in &mut self.subsystems {
            s.cfg.auth_required = required && !(s.discovery && open);
        }
        let closed: Vec<u16> = self
            .ctrls
            .values()
            .filter(|c| {
                let subnqn = self.subsystems[c.subsys].cfg.nqn.as_str();
                stale(subnqn, &c.hostnqn)
                    || required
                        && !self
                            .cfg
                            .auth
                            .as_ref()
                            .is_some_and(|p| p.covers(subnqn, &c.hostnqn))
            })
            .map(|c| c.cntlid)
            .collect();
        for &id in &closed {
            self.remove_ctrl(id, CloseReason::SecretsChanged);
        }
        self.discovery_changed();
        closed
    }

    /// A reservation notification for the host `hostnqn`/`hostid` on namespace `nsid` of
    /// subsystem `subnqn` (the shared reservation state changed under it, by a command of an
    /// NVMe host or an iSCSI initiator): every controller of that host in that subsystem
    /// whose Reservation Notification Mask (feature 82h) does not mask it gets a Reservation
    /// Notification log page (80h) and an Asynchronous Event (type I/O Command Specific,
    /// Reservation Log Page Available; NVMe Base 2.0 §5.2, §8.19). Returns how many
    /// controllers were notified.
    pub fn reservation_notice(
        &mut self,
        subnqn: &str,
        hostnqn: &str,
        hostid: &[u8; 16],
        nsid: u32,
        notice: ReservationNotice,
    ) -> usize {
        let Some(si) = self
            .subsystems
            .iter()
            .position(|s| !s.discovery && s.cfg.nqn == subnqn)
        else {
            return 0;
        };
        let bit = 1u32 << (notice as u8);
        let ids: Vec<u16> = self
            .ctrls
            .values()
            .filter(|c| c.subsys == si && *c.hostnqn == *hostnqn && c.hostid == *hostid)
            .filter(|c| c.resv_mask.get(&nsid).copied().unwrap_or(0) & bit == 0)
            .map(|c| c.cntlid)
            .collect();
        for &id in &ids {
            if let Some(c) = self.ctrls.get_mut(&id) {
                c.resv_count = if c.resv_count == u64::MAX {
                    1
                } else {
                    c.resv_count + 1
                };
                if c.resv_log.len() < RESV_LOG_MAX {
                    c.resv_log.push_back(ResvLogEntry {
                        count: c.resv_count,
                        notice,
                        nsid,
                    });
                }
                admin::queue_event(c, admin::AEN_RESV_LOG);
            }
            self.deliver_events(id);
        }
        ids.len()
    }

    /// The hosts allowed to connect to subsystem `subnqn`, if it is served.
    #[must_use]
    pub fn allowed_hosts(&self, subnqn: &str) -> Option<&AllowedHosts> {
        self.subsystems
            .iter()
            .find(|s| !s.discovery && s.cfg.nqn == subnqn)
            .map(|s| &s.cfg.hosts)
    }

    /// Replaces the discovery log's entries; discovery controllers that enabled Discovery Log
    /// Page Change notices get an asynchronous event.
    pub fn set_discovery_entries(&mut self, entries: Vec<DiscoveryEntry>) {
        if entries == self.discovery {
            return;
        }
        self.discovery = entries;
        self.discovery_changed();
    }

    /// A new generation of the discovery log: discovery controllers that enabled Discovery Log
    /// Page Change notices get an asynchronous event.
    fn discovery_changed(&mut self) {
        self.genctr = self.genctr.wrapping_add(1);
        let ids: Vec<u16> = self
            .ctrls
            .values()
            .filter(|c| c.discovery)
            .map(|c| c.cntlid)
            .collect();
        for id in ids {
            if let Some(c) = self.ctrls.get_mut(&id) {
                if c.aec & admin::AEC_DISCOVERY != 0 {
                    admin::queue_event(c, admin::AEN_DISCOVERY_CHANGED);
                }
            }
            self.deliver_events(id);
        }
    }

    /// Pairs held AERs with queued events of `cntlid` into [`Event::AdminCompletion`]s.
    pub(crate) fn deliver_events(&mut self, cntlid: u16) {
        let Some(c) = self.ctrls.get_mut(&cntlid) else {
            return;
        };
        while !c.aers.is_empty() && !c.aen_queue.is_empty() {
            if let (Some(cid), Some(dw0)) = (c.aers.pop_front(), c.aen_queue.pop_front()) {
                self.events.push_back(Event::AdminCompletion {
                    cntlid,
                    completion: done_dw0(cid, dw0),
                });
            }
        }
    }
}

#[derive(Debug)]
enum ConnectRefusal {
    Invalid(u32),
    Host(u32),
    Busy,
    Sequence,
}

/// Connect CATTR bit 2: disable SQ flow control (NVMe over Fabrics 1.1 §3.3).
const CATTR_DISABLE_SQFLOW: u8 = 1 << 2;

/// CC.EN (NVMe Base 2.0 §3.1.5).
pub(crate) const CC_EN: u32 = 1;
/// CSTS.RDY.
pub(crate) const CSTS_RDY: u32 = 1;
/// CSTS.CFS, Controller Fatal Status.
pub(crate) const CSTS_CFS: u32 = 1 << 1;
/// CSTS.SHST.
const CSTS_SHST_MASK: u32 = 0x3 << 2;
/// CSTS.SHST 10b: shutdown processing complete.
const CSTS_SHST_COMPLETE: u32 = 0x2 << 2;
