//! The target's side of one connection in full feature phase (RFC 7143; ErrorRecoveryLevel 0,
//! and 1–2 where `target/recovery.rs` says).
//! A session of one connection drives a [`Connection`] alone; a session of several
//! (MaxConnections > 1, RFC 7143 §4.2) drives them through [`session::Session`], which owns
//! the session's one CmdSN window and delivers commands from every connection in CmdSN order.
//!
//! ```text
//!  handle_pdu ─► admit CmdSN (§4.2.2.1) ─► SCSI Command ─► size it (LunDirectory) ─┐
//!                                       ─► Data-Out ─► WriteState (r2t.rs) ─────────┤
//!                                       ─► TMF / NOP-Out / Text / Logout            │
//!  poll_event ◄── Execute { cdb, data } ◄── data phase complete ◄───────────────────┘
//!  complete(itt, Response) ─► Data-In segments (MaxRecvDataSegmentLength, MaxBurstLength),
//!                             status, residuals ─► queue ─► poll_transmit stamps StatSN,
//!                             ExpCmdSN, MaxCmdSN at the moment the PDU leaves (§4.2.2.2)
//! ```
//!
//! What the engine does not know — which LUNs exist and how many bytes a CDB transfers — it
//! asks the driver's [`LunDirectory`]; what it cannot do — run the command — it hands out as
//! [`Event::Execute`] and takes back with [`Connection::complete`].
//!
//! What the driver learns while sizing a command (its decoded CDB, type `D`) travels with the
//! task: [`Sizing::decoded`] in, [`Execute::decoded`] out, so a driver keeps no table of its own
//! per ITT and the CDB is parsed once. `D` is `()` for a driver that keeps nothing.

use std::collections::{HashMap, HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{
    AsyncMessage, DataIn, DataOut, LogoutReason, LogoutRequest, LogoutResponse, NopIn, NopOut, R2t,
    Reject, RejectReason, ScsiCommand, TaskMgmtRequest, TaskMgmtResponse, TextRequest,
    TextResponse, TmfFunction, TmfResponse,
};
use iscsi_wire::{Header, Pdu, WireError, RESERVED_TAG};

use super::r2t::{DataError, R2tPlan, WriteState};
use super::{fixed_sense, CloseReason, ConnectionError, Side, TagAllocator, Violation};
use crate::params::{SessionParams, SessionType};
use crate::seq::{sn_lt, Admit, CmdWindow};

mod recovery;
pub mod session;

/// What the target knows about its logical units, asked while a command arrives. `D`: what
/// [`LunDirectory::size`] decodes of a command, handed back with its [`Event::Execute`].
pub trait LunDirectory<D = ()> {
    /// Whether the LUN (the raw 8-byte LUN field) exists.
    fn exists(&self, lun: u64) -> bool;
    /// How many data-out bytes `cdb` needs for `lun` (0 for reads and non-data commands), and
    /// an answer decided before any data moves (bad CDB, a transfer the target refuses).
    ///
    /// Asked once per SCSI Command of a LUN that is not a [`LunDirectory::passthrough`], before
    /// its [`Event::Execute`] with the same `itt` (the Initiator Task Tag, unique among the
    /// session's active tasks, RFC 7143 §11.2.1.8): a driver that parses the CDB here returns
    /// what it decoded in [`Sizing::decoded`], and the engine keeps it in the task and hands it
    /// back in [`Execute::decoded`], so the command is parsed once. A command refused after
    /// this (or aborted before its data phase ends) gets no event and its decoded command is
    /// dropped with its task.
    fn size(&self, itt: u32, lun: u64, cdb: &[u8], edtl: u32) -> Sizing<D>;
    /// Whether the LUN is a pass-through to another target (a gateway's remote LUN): no local
    /// device server parses the CDB, so its data-out is sized by EDTL when the W bit is set
    /// and by nothing otherwise, as pass-through targets do (RFC 7143 §11.3.1, §11.4.5).
    fn passthrough(&self, _lun: u64) -> bool {
        false
    }
    /// The targets and portals SendTargets lists ([`super::text`]); `None` lists none.
    fn directory(&self) -> Option<&dyn super::text::Directory> {
        None
    }
}

/// The data-out a command needs, as the device server sees it.
#[derive(Clone, Debug)]
pub struct Sizing<D = ()> {
    /// Bytes of data-out the target solicits and collects: at most this many.
    pub need: u64,
    /// A response decided before execution; sent once the data phase ends.
    pub early: Option<Response>,
    /// Bytes of data-out the CDB transfers as the device server counts them, when that is
    /// not `need`: in a Seal session the wire carries sealed bytes, so the driver collects
    /// the whole sealed EDTL (`need`) and applies the overflow rules ([`super::residual`])
    /// to the plaintext, against this. `None`: `need`.
    pub transfer: Option<u64>,
    /// What the driver decoded of the command, carried with the task to its
    /// [`Execute::decoded`].
    pub decoded: Option<D>,
}

impl<D> Default for Sizing<D> {
    fn default() -> Self {
        Self {
            need: 0,
            early: None,
            transfer: None,
            decoded: None,
        }
    }
}

/// A command's answer from the device server.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Response {
    /// SCSI status (SAM-5 §5.3).
    pub status: u8,
    /// Fixed-format sense data, sent in the SCSI Response's data segment (§11.4.7.2).
    pub sense: Option<Bytes>,
    /// Data-In the device server produced (truncated to EDTL on the wire).
    pub data_in: Bytes,
    /// Bytes sent after `data_in` in the same Data-In sequence, in PDUs of their own (a Seal
    /// `none` transfer's trailer, issue 27: the data stays the device server's own memory,
    /// not copied into one buffer with it). Usually empty.
    pub data_in_trailer: Bytes,
}

impl Response {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const CONDITION_MET: u8 = 0x04;

    /// GOOD with this data.
    #[must_use]
    pub fn good(data_in: Bytes) -> Self {
        Self {
            status: Self::GOOD,
            sense: None,
            data_in,
            data_in_trailer: Bytes::new(),
        }
    }

    /// Bytes of Data-In in all: `data_in` and its trailer.
    #[must_use]
    pub fn data_in_len(&self) -> usize {
        self.data_in.len() + self.data_in_trailer.len()
    }

    /// CHECK CONDITION with fixed-format sense (key, ASC, ASCQ).
    #[must_use]
    pub fn check(key: u8, asc: u8, ascq: u8) -> Self {
        Self {
            status: Self::CHECK_CONDITION,
            sense: Some(fixed_sense(key, asc, ascq)),
            data_in: Bytes::new(),
            data_in_trailer: Bytes::new(),
        }
    }
}

/// One command ready to run: its data phase is over.
#[derive(Clone, Debug)]
pub struct Execute<D = ()> {
    pub itt: u32,
    /// The raw 8-byte LUN field.
    pub lun: u64,
    /// The whole CDB (BHS plus Extended CDB AHS).
    pub cdb: Vec<u8>,
    /// The data-out received, at most `min(EDTL, need)` bytes.
    pub data_out: Bytes,
    pub edtl: u32,
    /// What the target collected for the CDB (see [`Sizing::need`]).
    pub need: u64,
    /// What the CDB transfers as the device server counts them (see [`Sizing::transfer`]).
    pub transfer: u64,
    /// The answer decided before execution, if any: send it instead of running the command.
    pub early: Option<Response>,
    /// A data-out command sent without the W bit (EDTL counts as 0 for it).
    pub write_without_w: bool,
    /// The command's R and W bits (§11.3.1), for a pass-through that forwards them.
    pub read: bool,
    pub write: bool,
    /// What [`LunDirectory::size`] decoded ([`Sizing::decoded`]); `None` for a pass-through.
    pub decoded: Option<D>,
}

/// What the driver must act on.
#[derive(Clone, Debug)]
pub enum Event<D = ()> {
    /// Run this command and answer with [`Connection::complete`].
    Execute(Execute<D>),
    /// A task management function that resets state beyond this connection (LOGICAL UNIT
    /// RESET, TARGET WARM/COLD RESET): the driver resets its logical units. The tasks of this
    /// connection it ends are already aborted (their answers will be suppressed).
    ///
    /// `answer`: for a LOGICAL UNIT RESET of a pass-through LUN ([`LunDirectory::passthrough`],
    /// a gateway's remote LUN), the TMF's ITT: the response is held until the driver has reset
    /// the remote LU and calls [`Connection::reset_done`] with the outcome (RFC 7143 §11.6.1:
    /// Function complete means the LU was reset). `None`: answered by the engine.
    Reset {
        function: TmfFunction,
        lun: u64,
        answer: Option<u32>,
    },
    /// ABORT TASK, ABORT TASK SET or CLEAR TASK SET (RFC 7143 §11.5.1) ended these running
    /// tasks of pass-through LUNs: the driver forwards the abort to where they run. Their
    /// answers are suppressed already and the TMF response waits until each is completed
    /// (with [`Connection::complete`], whatever the outcome), so the initiator never sees a
    /// status after the abort's response.
    Abort { itts: Vec<u32> },
    /// The connection is over: flush what [`Connection::poll_transmit`] still yields, then
    /// close the socket.
    Closed(ConnectionError),
}

/// Settings of one target connection.
#[derive(Clone, Debug)]
pub struct Config {
    /// The values negotiated at login.
    pub params: SessionParams,
    /// Commands the window grants (MaxCmdSN - ExpCmdSN + 1 when idle).
    pub cmd_window: u32,
    /// CmdSN of the leading login.
    pub initial_cmd_sn: u32,
    /// StatSN of the first response after login.
    pub next_stat_sn: u32,
    /// Ping the initiator after this long without a PDU from it, and close when the ping
    /// is unanswered for as long again (RFC 7143 §11.19). `None`: no pings.
    pub nop_interval: Option<Duration>,
    /// How long a Logout waits for running commands before answering anyway.
    pub drain_timeout: Duration,
    /// Refuse a data-out buffer above this many bytes, whatever the CDB or EDTL claim.
    pub max_command_bytes: u64,
    /// The connection's CID from its login (RFC 7143 §11.12.4): a Logout that closes the
    /// connection names it (§11.14.3).
    pub cid: u16,
    /// A write reassigned to this connection while it collects data (TASK REASSIGN,
    /// ErrorRecoveryLevel 2) is solicited again whole, dropping what came on the failed
    /// connection ([`crate::engine::r2t::WriteState::restart`]), instead of only what never
    /// came: for data sealed per connection (Seal), whose pieces from two connections never
    /// open as one transfer.
    pub resolicit_reassigned_writes: bool,
}

impl Config {
    /// Defaults for the rest around negotiated `params`.
    #[must_use]
    pub fn new(params: SessionParams, initial_cmd_sn: u32, next_stat_sn: u32) -> Self {
        Self {
            params,
            cmd_window: 128,
            initial_cmd_sn,
            next_stat_sn,
            nop_interval: None,
            drain_timeout: Duration::from_secs(10),
            max_command_bytes: 64 << 20,
            cid: 0,
            resolicit_reassigned_writes: false,
        }
    }
}

#[derive(Debug)]
enum TaskState<D> {
    Collecting(Box<Collect<D>>),
    Running { aborted: bool },
}

#[derive(Debug)]
struct Collect<D> {
    cdb: Vec<u8>,
    decoded: Option<D>,
    need: u64,
    transfer: u64,
    early: Option<Response>,
    write: WriteState,
    /// The command's R bit (a bidirectional command).
    read: bool,
}

#[derive(Debug)]
struct Task<D> {
    lun: u64,
    /// Holds a CmdSN window slot (non-immediate).
    counted: bool,
    edtl: u32,
    need: u64,
    state: TaskState<D>,
}

/// A TMF response held until the running tasks it aborted have finished (§11.6: the response
/// comes after every affected task's last PDU).
#[derive(Debug)]
struct HeldTmf {
    itt: u32,
    response: TmfResponse,
    waiting: HashSet<u32>,
    close: bool,
    /// Waiting for the driver too ([`Connection::reset_done`]).
    driver: bool,
}

/// The engine: one target connection in full feature phase. `D`: what the driver's
/// [`LunDirectory`] decodes of a command, carried with its task.
#[derive(Debug)]
pub struct Connection<D = ()> {
    params: SessionParams,
    window: CmdWindow,
    stat_sn: u32,
    ttt: TagAllocator,
    tasks: HashMap<u32, Task<D>>,
    /// ITTs of recently aborted tasks whose late Data-Out is dropped silently.
    aborted: VecDeque<u32>,
    held_tmfs: Vec<HeldTmf>,
    text_partial: Vec<u8>,
    /// A Logout waiting for running commands: its ITT and deadline.
    logout: Option<(u32, Instant)>,
    nop_interval: Option<Duration>,
    idle_deadline: Option<Instant>,
    ping: Option<Ping>,
    drain_timeout: Duration,
    max_command_bytes: u64,
    /// [`Config::resolicit_reassigned_writes`].
    resolicit_reassigned_writes: bool,
    /// PDUs to send, each with the StatSN it keeps when it is a retransmission (a SNACK's
    /// answer, RFC 7143 §11.16), `None`: stamped with the next one.
    out: VecDeque<(Pdu, Option<u32>)>,
    queued_bytes: usize,
    events: VecDeque<Event<D>>,
    closed: Option<ConnectionError>,
    cid: u16,
    /// The CIDs of the other connections of this session ([`session::Session`] keeps it
    /// current): a Logout naming one of them closes that connection, not this one (§11.14.3).
    siblings: Vec<u16>,
    /// A Logout this connection answered that closes a sibling connection (its CID), or the
    /// whole session (`Some(None)`); taken by [`session::Session`], which acts on it.
    logout_of: Option<Option<u16>>,
    /// Completed tasks kept until the initiator acknowledges their status (ErrorRecoveryLevel
    /// >= 1): what a SNACK or a TASK REASSIGN is answered from ([`recovery`]).
    retained: recovery::Retained,
    /// Closed by a Logout with reason 2 (remove the connection for recovery, RFC 7143
    /// §11.14.1): its tasks wait for a new allegiance.
    for_recovery: bool,
    /// A Logout with reason 2 this connection answered for another connection (its CID);
    /// taken by [`session::Session`], which closes that one for recovery.
    recovery_of: Option<u16>,
    /// CIDs of failed connections whose tasks the session keeps for reassignment: a Logout
    /// with reason 2 naming one is answered "closed successfully".
    recoverable: Vec<u16>,
}

/// Aborted ITTs remembered for dropping their late Data-Out.
const ABORTED_MEMORY: usize = 256;

/// How many NOP-In intervals a ping may wait to leave (behind Data-In queued before it) before
/// an initiator that neither answers nor sends anything is given up on: the bound for a peer
/// that keeps its TCP window shut, whose socket never takes the ping.
const PING_LEAVE_INTERVALS: u32 = 10;

/// The target's NOP-In ping (RFC 7143 §11.19, a TTT other than 0xffffffff asks for a NOP-Out
/// answer), sent after `nop_interval` without a PDU from the initiator. The connection is
/// dead when neither the answer nor any other PDU came for `nop_interval` after the ping was
/// written to the socket ([`Connection::flushed`]); a ping still waiting to be written (data
/// queued before it) waits up to [`PING_LEAVE_INTERVALS`] intervals.
#[derive(Clone, Copy, Debug)]
struct Ping {
    ttt: u32,
    /// When it was queued.
    queued: Instant,
    /// [`Connection::poll_transmit`] handed it out.
    taken: bool,
    /// When the driver reported it written ([`Connection::flushed`]).
    left: Option<Instant>,
    /// The last PDU received since it was queued (or when it was queued).
    heard: Instant,
}

impl Ping {
    fn deadline(&self, interval: Duration) -> Instant {
        match self.left {
            Some(left) => left.max(self.heard) + interval,
            None => self.queued.max(self.heard) + interval.saturating_mul(PING_LEAVE_INTERVALS),
        }
    }
}

/// Text Request data accumulated over continuations (§11.10.2) at most.
const MAX_TEXT: usize = 64 * 1024;

impl Connection {
    /// A connection whose driver decodes nothing while sizing ([`Connection::carrying`]).
    #[must_use]
    pub fn new(cfg: Config, now: Instant) -> Self {
        Self::carrying(cfg, now)
    }
}

impl<D> Connection<D> {
    /// A connection whose tasks carry what the driver's [`LunDirectory::size`] decodes (`D`)
    /// from the command's arrival to its [`Event::Execute`].
    #[must_use]
    pub fn carrying(cfg: Config, now: Instant) -> Self {
        Self {
            window: CmdWindow::new(cfg.initial_cmd_sn, cfg.cmd_window),
            params: cfg.params,
            stat_sn: cfg.next_stat_sn,
            ttt: TagAllocator::default(),
            tasks: HashMap::new(),
            aborted: VecDeque::new(),
            held_tmfs: Vec::new(),
            text_partial: Vec::new(),
            logout: None,
            nop_interval: cfg.nop_interval,
            idle_deadline: cfg.nop_interval.map(|i| now + i),
            ping: None,
            drain_timeout: cfg.drain_timeout,
            max_command_bytes: cfg.max_command_bytes,
            resolicit_reassigned_writes: cfg.resolicit_reassigned_writes,
            out: VecDeque::new(),
            queued_bytes: 0,
            events: VecDeque::new(),
            closed: None,
            cid: cfg.cid,
            siblings: Vec::new(),
            logout_of: None,
            retained: recovery::Retained::default(),
            for_recovery: false,
            recovery_of: None,
            recoverable: Vec::new(),
        }
    }

    /// Starts the TTT allocator at `first` (tests of the wrap past 0xfffffffe).
    pub fn set_next_ttt(&mut self, first: u32) {
        self.ttt = TagAllocator::starting_at(first);
    }

    // ---- getters ----

    /// The session values in force (MaxRecvDataSegmentLength may change by Text).
    #[must_use]
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Tasks known (collecting data or running).
    #[must_use]
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Whether `itt` is a task of this connection (collecting data or running).
    #[must_use]
    pub fn has_task(&self, itt: u32) -> bool {
        self.tasks.contains_key(&itt)
    }

    /// Whether `itt` was handed to the driver ([`Event::Execute`]) and is not completed yet.
    #[must_use]
    pub fn is_running(&self, itt: u32) -> bool {
        matches!(
            self.tasks.get(&itt).map(|t| &t.state),
            Some(TaskState::Running { .. })
        )
    }

    /// Bytes of data queued for [`Connection::poll_transmit`].
    #[must_use]
    pub fn queued_bytes(&self) -> usize {
        self.queued_bytes
    }

    /// Whether [`Connection::poll_transmit`] has a PDU (drivers wake their writer only then).
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        !self.out.is_empty()
    }

    /// Why the connection ended, once it did.
    #[must_use]
    pub fn closed(&self) -> Option<ConnectionError> {
        self.closed
    }

    #[must_use]
    pub fn window(&self) -> &CmdWindow {
        &self.window
    }

    // ---- outputs ----

    /// The next PDU to send, its StatSN, ExpCmdSN and MaxCmdSN stamped now.
    pub fn poll_transmit(&mut self) -> Option<Pdu> {
        let (mut pdu, fixed) = self.out.pop_front()?;
        self.queued_bytes = self.queued_bytes.saturating_sub(pdu.data.len());
        if let (Some(p), Header::NopIn(n)) = (&mut self.ping, &pdu.header) {
            if n.itt == RESERVED_TAG && n.ttt == p.ttt {
                p.taken = true;
            }
        }
        self.window.refresh();
        let (exp, max) = (self.window.exp_cmd_sn(), self.window.max_cmd_sn());
        match fixed {
            Some(mut sn) => stamp(&mut pdu.header, &mut sn, exp, max),
            None => {
                stamp(&mut pdu.header, &mut self.stat_sn, exp, max);
                self.retained.stamped(&pdu.header);
            }
        }
        Some(pdu)
    }

    /// The driver wrote every PDU [`Connection::poll_transmit`] handed out so far into its
    /// socket. Our ping's answer is waited for from the moment the ping was written: on a slow
    /// lossy link it leaves behind MiBs of Data-In, and the initiator cannot answer what has
    /// not reached it (a 16 MiB read queue at 0.25 MB/s holds it for a minute). True when that
    /// moved [`Connection::poll_timeout`] earlier (a timer waiting for the old one should be
    /// woken).
    pub fn flushed(&mut self, now: Instant) -> bool {
        match &mut self.ping {
            Some(p) if p.taken && p.left.is_none() => {
                p.left = Some(now);
                true
            }
            _ => false,
        }
    }

    /// A PDU arrived from the initiator (given to the engine or held by the session for its
    /// CmdSN's turn): it is alive, so the keepalive restarts, and a ping waiting for its
    /// answer waits from now.
    pub(crate) fn heard(&mut self, now: Instant) {
        self.idle_deadline = self.nop_interval.map(|i| now + i);
        if let Some(p) = &mut self.ping {
            p.heard = p.heard.max(now);
        }
    }

    /// The next thing for the driver to do.
    pub fn poll_event(&mut self) -> Option<Event<D>> {
        self.events.pop_front()
    }

    /// When [`Connection::handle_timeout`] wants to run next.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed.is_some() {
            return None;
        }
        let ping = self
            .ping
            .map(|p| p.deadline(self.nop_interval.unwrap_or_default()))
            .or(self.idle_deadline);
        let logout = self.logout.map(|(_, d)| d);
        match (ping, logout) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    // ---- inputs ----

    /// Time passed: pings, an unanswered ping, a Logout that waited long enough.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        if let Some((_, d)) = self.logout {
            if now >= d {
                self.answer_logout();
                return;
            }
        }
        if let Some(p) = self.ping {
            let waited = self.nop_interval.unwrap_or_default();
            if now >= p.deadline(waited) {
                self.close(Side::Target, CloseReason::PingTimeout(waited));
            }
            return;
        }
        if let (Some(d), Some(_)) = (self.idle_deadline, self.nop_interval) {
            if now >= d {
                let ttt = self.ttt.next_tag();
                self.ping = Some(Ping {
                    ttt,
                    queued: now,
                    taken: false,
                    left: None,
                    heard: now,
                });
                self.idle_deadline = None;
                self.send(NopIn {
                    lun: 0,
                    itt: RESERVED_TAG,
                    ttt,
                    ..NopIn::default()
                });
            }
        }
    }

    /// The driver ends the connection (shutdown, reinstatement, Seal limits).
    pub fn close_locally(&mut self) {
        self.close(Side::Target, CloseReason::Local);
    }

    /// The initiator closed its side, or the socket failed.
    pub fn peer_closed(&mut self) {
        self.close(Side::Initiator, CloseReason::PeerClosed);
    }

    /// Asks the initiator to log out (AsyncEvent 1, §11.9.1) within `within_secs` seconds.
    pub fn request_logout(&mut self, within_secs: u16) {
        self.send(AsyncMessage {
            async_event: 1,
            parameter3: within_secs,
            ..AsyncMessage::default()
        });
    }

    /// A PDU that could not be decoded: a Reject naming it when its header is intact, and the
    /// end of the connection when the stream is out of step (§7.8, §11.17). Plain connections
    /// only: on a sealed one the driver drops the connection instead, without a Reject, since
    /// the header was not verified (docs/seal.md §4a, `ipsan_seal::read_pdu`).
    pub fn handle_wire_error(&mut self, _now: Instant, e: &WireError) {
        if self.closed.is_some() {
            return;
        }
        let reason = match e {
            WireError::DataDigest { .. } => RejectReason::DATA_DIGEST_ERROR,
            WireError::UnsupportedOpcode { .. } => RejectReason::COMMAND_NOT_SUPPORTED,
            _ => RejectReason::PROTOCOL_ERROR,
        };
        if let Some(bhs) = e.rejected_header() {
            self.reject(reason, bhs);
        }
        if !e.stream_intact() {
            self.close(Side::Initiator, CloseReason::Framing);
        }
    }

    /// One PDU from the initiator.
    pub fn handle_pdu(&mut self, now: Instant, dir: &dyn LunDirectory<D>, pdu: Pdu) {
        if self.closed.is_some() {
            return;
        }
        self.heard(now);
        if self.params.error_recovery_level > 0 {
            self.acknowledged(&pdu.header);
        }
        let raw = *pdu.raw_bhs();
        let discovery = self.params.session_type == SessionType::Discovery;
        match pdu.header {
            Header::ScsiCommand(cmd) if !discovery => {
                self.on_command(dir, cmd, &pdu.ahs, pdu.data, &raw);
            }
            Header::DataOut(h) if !discovery => self.on_data_out(&h, &pdu.data, None, &raw),
            Header::TaskMgmtRequest(h) if !discovery => self.on_tmf(dir, &h),
            Header::NopOut(h) => self.on_nop_out(&h, pdu.data),
            Header::TextRequest(h) => self.on_text(dir, &h, &pdu.data, &raw),
            Header::LogoutRequest(h) => self.on_logout(now, &h),
            // SNACK needs ErrorRecoveryLevel > 0 (§11.16).
            Header::SnackRequest(h) if !discovery && self.params.error_recovery_level > 0 => {
                self.on_snack(&h, &raw);
            }
            _ => self.reject(RejectReason::PROTOCOL_ERROR, &raw),
        }
    }

    /// Where a Data-Out of `len` bytes can be received in place (issue 27): the free end of
    /// its write's own buffer ([`WriteState::lend`]), so the driver receives the data there
    /// instead of copying it from its receive buffer; it gives the buffer back with the PDU
    /// ([`Connection::handle_placed_data_out`]). `None`: receive it as usual. Nothing is
    /// changed for the task but room reserved: a buffer never given back loses nothing.
    pub fn lend_write_buffer(&mut self, h: &DataOut, len: usize) -> Option<BytesMut> {
        if self.closed.is_some() || self.params.session_type == SessionType::Discovery {
            return None;
        }
        match self.tasks.get_mut(&h.itt) {
            Some(Task {
                state: TaskState::Collecting(c),
                ..
            }) => c.write.lend(h, len),
            _ => None,
        }
    }

    /// Whether a Data-Out may come for one of this connection's writes now (unsolicited data
    /// open, or an R2T outstanding): the driver then reads the next PDU's head alone, so a
    /// long one is received in place whole ([`Connection::lend_write_buffer`]).
    #[must_use]
    pub fn awaits_data_out(&self) -> bool {
        self.tasks
            .values()
            .any(|t| matches!(&t.state, TaskState::Collecting(c) if c.write.awaits_data_out()))
    }

    /// A Data-Out whose data the driver received into the buffer
    /// [`Connection::lend_write_buffer`] lent (`data`: exactly its data; `pdu.data` is
    /// empty): handled as [`Connection::handle_pdu`] handles any Data-Out (§11.7), the data
    /// joined to the write's without a copy.
    pub fn handle_placed_data_out(&mut self, now: Instant, pdu: Pdu, data: BytesMut) {
        if self.closed.is_some() {
            return;
        }
        self.heard(now);
        if self.params.error_recovery_level > 0 {
            self.acknowledged(&pdu.header);
        }
        // A placed PDU has no received BHS: a Reject carries the header as decoded.
        let mut raw = [0u8; 48];
        pdu.header.write(&mut raw);
        match pdu.header {
            Header::DataOut(h) if self.params.session_type != SessionType::Discovery => {
                self.on_data_out(&h, &[], Some(data), &raw)
            }
            _ => self.reject(RejectReason::PROTOCOL_ERROR, &raw),
        }
    }

    /// The device server's answer to an [`Event::Execute`]. Unknown ITTs are ignored (false).
    pub fn complete(&mut self, itt: u32, resp: Response) -> bool {
        self.complete_with_residual(itt, resp, None)
    }

    /// [`Connection::complete`] with the residual decided by someone else: a pass-through
    /// LUN reports the remote target's residual (positive: underflow, negative: overflow;
    /// RFC 7143 §11.4.5) instead of one computed from EDTL and the data.
    pub fn complete_with_residual(
        &mut self,
        itt: u32,
        resp: Response,
        residual: Option<i64>,
    ) -> bool {
        let Some(task) = self.tasks.get(&itt) else {
            return false;
        };
        let TaskState::Running { aborted } = task.state else {
            return false;
        };
        let Some(task) = self.tasks.remove(&itt) else {
            return false;
        };
        if task.counted {
            self.window.complete();
        }
        if !aborted && self.closed.is_none() {
            if self.params.error_recovery_level > 0 {
                self.retain(itt, &task, &resp, residual);
            }
            self.send_status(itt, task.lun, task.edtl, task.need, resp, residual);
        }
        self.release_held(itt);
        if self.logout.is_some() && !self.any_running() {
            self.answer_logout();
        }
        true
    }

    /// The answer to a Text Request (one final Text Response).
    fn text_response(&mut self, itt: u32, lun: u64, answer: &[(String, String)]) {
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

    // ---- internals ----

    fn close(&mut self, by: Side, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        let e = ConnectionError { by, reason };
        self.closed = Some(e);
        self.events.push_back(Event::Closed(e));
    }

    fn send(&mut self, header: impl Into<Header>) {
        self.send_with(header, Bytes::new());
    }

    /// One R2T per plan of task `itt` (RFC 7143 §11.8): the first ones of a write, or a
    /// recovery's again (§7.2.2).
    fn send_r2ts(&mut self, lun: u64, itt: u32, plans: Vec<R2tPlan>) {
        for p in plans {
            self.send(R2t {
                lun,
                itt,
                ttt: p.ttt,
                r2t_sn: p.r2t_sn,
                buffer_offset: p.offset,
                desired_data_transfer_length: p.len,
                ..R2t::default()
            });
        }
    }

    fn send_with(&mut self, header: impl Into<Header>, data: Bytes) {
        self.queued_bytes += data.len();
        self.out.push_back((Pdu::new(header, data), None));
    }

    fn reject(&mut self, reason: RejectReason, bhs: &[u8; 48]) {
        self.send_with(
            Reject {
                reason,
                ..Reject::default()
            },
            Bytes::copy_from_slice(bhs),
        );
    }

    fn any_running(&self) -> bool {
        self.tasks
            .values()
            .any(|t| matches!(t.state, TaskState::Running { .. }))
    }

    /// Admits a CmdSN-carrying request; false when it must be ignored (§4.2.2.1). A
    /// non-immediate request that is not a task frees its slot at once.
    fn admit(&mut self, cmd_sn: u32, immediate: bool, is_task: bool) -> bool {
        if self.window.admit(cmd_sn, immediate) == Admit::Ignore {
            return false;
        }
        if !immediate && !is_task {
            self.window.complete();
        }
        true
    }

    /// A SCSI Command whose ITT is an active task of another connection of the session (ITTs
    /// are unique in the session, §11.2.1.8): admitted in CmdSN order, then rejected.
    fn reject_command(&mut self, cmd: &ScsiCommand, raw: &[u8; 48]) {
        if self.admit(cmd.cmd_sn, cmd.immediate, false) {
            self.reject(RejectReason::INVALID_PDU_FIELD, raw);
        }
    }

    /// Window slots held by this connection's tasks (non-immediate ones not completed).
    fn counted_tasks(&self) -> u32 {
        self.tasks.values().filter(|t| t.counted).count() as u32
    }

    fn remember_aborted(&mut self, itt: u32) {
        if self.aborted.len() >= ABORTED_MEMORY {
            self.aborted.pop_front();
        }
        self.aborted.push_back(itt);
    }

    fn on_command(
        &mut self,
        dir: &dyn LunDirectory<D>,
        cmd: ScsiCommand,
        ahs: &Bytes,
        data: Bytes,
        raw: &[u8; 48],
    ) {
        if !self.admit(cmd.cmd_sn, cmd.immediate, true) {
            return;
        }
        let counted = !cmd.immediate;
        let refuse = |s: &mut Self, reason| {
            s.reject(reason, raw);
            if counted {
                s.window.complete();
            }
        };
        if self.tasks.contains_key(&cmd.itt) {
            // A task tag is unique among the session's active tasks (§11.2.1.8).
            return refuse(self, RejectReason::INVALID_PDU_FIELD);
        }
        let Some(cdb) = assemble_cdb(&cmd, ahs) else {
            return refuse(self, RejectReason::PROTOCOL_ERROR);
        };
        let edtl = cmd.expected_data_transfer_length;
        let Sizing {
            need,
            mut early,
            transfer,
            decoded,
        } = if dir.passthrough(cmd.lun) {
            Sizing {
                need: if cmd.write { u64::from(edtl) } else { 0 },
                ..Sizing::default()
            }
        } else {
            dir.size(cmd.itt, cmd.lun, &cdb, edtl)
        };
        let need = if need > self.max_command_bytes {
            // INVALID FIELD IN CDB: no buffer this large on a CDB's say-so.
            early = Some(Response::check(0x05, 0x24, 0x00));
            0
        } else {
            need
        };
        let transfer = transfer.unwrap_or(need);
        if !cmd.write {
            if !data.is_empty() {
                // Immediate data on a command without the W bit (§11.3.1).
                return refuse(self, RejectReason::PROTOCOL_ERROR);
            }
            self.tasks.insert(
                cmd.itt,
                Task {
                    lun: cmd.lun,
                    counted,
                    edtl,
                    need,
                    state: TaskState::Running { aborted: false },
                },
            );
            self.events.push_back(Event::Execute(Execute {
                itt: cmd.itt,
                lun: cmd.lun,
                cdb,
                data_out: Bytes::new(),
                edtl,
                need,
                transfer,
                early,
                write_without_w: need > 0,
                read: cmd.read,
                write: false,
                decoded,
            }));
            return;
        }
        let need32 = u32::try_from(need).unwrap_or(u32::MAX);
        let write = match WriteState::new(&self.params, &cmd, data, need32) {
            Ok(w) => w,
            Err(_) => return refuse(self, RejectReason::PROTOCOL_ERROR),
        };
        self.tasks.insert(
            cmd.itt,
            Task {
                lun: cmd.lun,
                counted,
                edtl,
                need,
                state: TaskState::Collecting(Box::new(Collect {
                    cdb,
                    decoded,
                    need,
                    transfer,
                    early,
                    write,
                    read: cmd.read,
                })),
            },
        );
        self.solicit(cmd.itt);
    }

    /// Sends the R2Ts a collecting task may have outstanding now, or starts it when its data
    /// is all here.
    fn solicit(&mut self, itt: u32) {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        let lun = task.lun;
        let TaskState::Collecting(c) = &mut task.state else {
            return;
        };
        let ttt = &mut self.ttt;
        let plans = c.write.plan_r2ts(|| ttt.next_tag());
        let complete = c.write.is_complete();
        self.send_r2ts(lun, itt, plans);
        if complete {
            self.start(itt, None);
        }
    }

    /// The data phase is over: hand the command to the driver.
    fn start(&mut self, itt: u32, fail: Option<Response>) {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        let lun = task.lun;
        let state = std::mem::replace(&mut task.state, TaskState::Running { aborted: false });
        let TaskState::Collecting(c) = state else {
            task.state = state;
            return;
        };
        let edtl = c.write.edtl();
        self.events.push_back(Event::Execute(Execute {
            itt,
            lun,
            cdb: c.cdb,
            data_out: c.write.into_data(),
            edtl,
            need: c.need,
            transfer: c.transfer,
            early: fail.or(c.early),
            write_without_w: false,
            read: c.read,
            write: true,
            decoded: c.decoded,
        }));
    }

    /// `placed`: the data, received in place ([`Connection::handle_placed_data_out`]).
    fn on_data_out(&mut self, h: &DataOut, data: &[u8], placed: Option<BytesMut>, raw: &[u8; 48]) {
        let result = match self.tasks.get_mut(&h.itt) {
            Some(Task {
                state: TaskState::Collecting(c),
                ..
            }) => match placed {
                Some(p) => c.write.on_placed_data_out(h, p),
                None => c.write.on_data_out(h, data),
            },
            Some(_) => Err(DataError("Data-Out for a command past its data phase")),
            None => {
                if !self.aborted.contains(&h.itt) {
                    self.reject(RejectReason::INVALID_PDU_FIELD, raw);
                }
                return;
            }
        };
        match result {
            Ok(()) => self.solicit(h.itt),
            Err(_) => {
                self.reject(RejectReason::PROTOCOL_ERROR, raw);
                // ERL 0 cannot repair a data phase: the command ends with CHECK CONDITION,
                // ABORTED COMMAND / DATA PHASE ERROR (4Bh/00h) once the PDUs in flight for it
                // are dropped.
                if matches!(
                    self.tasks.get(&h.itt).map(|t| &t.state),
                    Some(TaskState::Collecting(_))
                ) {
                    self.remember_aborted(h.itt);
                    self.start(h.itt, Some(Response::check(0x0b, 0x4b, 0x00)));
                }
            }
        }
    }

    /// Aborts the tasks `pick` selects: collecting ones are dropped at once, running ones
    /// have their answers suppressed. Returns the running ones to wait for.
    fn abort_where(&mut self, pick: impl Fn(u32, &Task<D>) -> bool) -> HashSet<u32> {
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

    fn on_tmf(&mut self, dir: &dyn LunDirectory<D>, h: &TaskMgmtRequest) {
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
    fn forward_aborts(&mut self, dir: &dyn LunDirectory<D>, aborted: &HashSet<u32>) {
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
    fn release_held(&mut self, done: u32) {
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

    fn on_nop_out(&mut self, h: &NopOut, data: Bytes) {
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

    fn on_text(&mut self, dir: &dyn LunDirectory<D>, h: &TextRequest, data: &[u8], raw: &[u8; 48]) {
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
        let answer = super::text::answer(
            &keys,
            &self.params.initiator_name,
            self.params.target_name.as_deref(),
            dir.directory(),
        );
        self.text_response(h.itt, h.lun, &answer);
    }

    fn on_logout(&mut self, now: Instant, h: &LogoutRequest) {
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

    fn answer_logout(&mut self) {
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

    /// A command's Data-In and status (§11.7, §11.4): Data-In PDUs up to the initiator's
    /// MaxRecvDataSegmentLength, F at every MaxBurstLength boundary, and GOOD status collapsed
    /// into the last Data-In (§11.7.3); otherwise a SCSI Response carrying the sense data.
    /// Residuals (§11.4.5): data-out commands compare EDTL with what the CDB needs, data-in
    /// commands with what the device server produced.
    fn send_status(
        &mut self,
        itt: u32,
        lun: u64,
        edtl: u32,
        need: u64,
        resp: Response,
        given: Option<i64>,
    ) {
        let (params, out, queued) = (&self.params, &mut self.out, &mut self.queued_bytes);
        status_pdus(params, itt, lun, edtl, need, &resp, given, &mut |pdu| {
            *queued += pdu.data.len();
            out.push_back((pdu, None));
        });
    }
}

/// A command's Data-In and status as PDUs, in order (see [`Connection::send_status`]): a
/// function of the response alone, so a retransmission (SNACK, TASK REASSIGN) regenerates the
/// same PDUs with the same DataSNs.
#[allow(clippy::too_many_arguments)]
fn status_pdus(
    params: &SessionParams,
    itt: u32,
    lun: u64,
    edtl: u32,
    need: u64,
    resp: &Response,
    given: Option<i64>,
    emit: &mut dyn FnMut(Pdu),
) {
    let produced = u32::try_from(resp.data_in_len()).unwrap_or(u32::MAX);
    let base = if need > 0 {
        u32::try_from(need).unwrap_or(u32::MAX)
    } else {
        produced
    };
    let (overflow, underflow) = match given {
        Some(r) if r < 0 => (u32::try_from(-r).unwrap_or(u32::MAX), 0),
        Some(r) => (0, u32::try_from(r).unwrap_or(u32::MAX)),
        None => (base.saturating_sub(edtl), edtl.saturating_sub(base)),
    };
    let residual = overflow.max(underflow);
    let seg = params.initiator_max_recv_data_segment_length.max(512);
    let burst = params.max_burst_length.max(512);
    let data = resp.data_in.slice(..resp.data_in.len().min(edtl as usize));
    let room = (edtl as usize).saturating_sub(data.len());
    let trailer = resp
        .data_in_trailer
        .slice(..resp.data_in_trailer.len().min(room));
    let good = resp.status == Response::GOOD || resp.status == Response::CONDITION_MET;
    let collapse = good && resp.sense.is_none() && data.len() + trailer.len() > 0;
    let in_data = data.len() as u32;
    let total = (data.len() + trailer.len()) as u32;
    let mut offset = 0u32;
    let mut data_sn = 0u32;
    let mut in_burst = 0u32;
    while offset < total {
        let mut len = seg.min(total - offset).min(burst - in_burst);
        if offset < in_data {
            // No PDU carries bytes of both: each is a slice of one buffer.
            len = len.min(in_data - offset);
        }
        let last = offset + len == total;
        in_burst += len;
        let end_of_burst = in_burst == burst;
        if end_of_burst {
            in_burst = 0;
        }
        let status_here = last && collapse;
        let h = DataIn {
            final_: last || end_of_burst,
            acknowledge: false,
            overflow: status_here && overflow > 0,
            underflow: status_here && underflow > 0,
            status_present: status_here,
            status: if status_here { resp.status } else { 0 },
            lun,
            itt,
            ttt: RESERVED_TAG,
            data_sn,
            buffer_offset: offset,
            residual_count: if status_here { residual } else { 0 },
            ..DataIn::default()
        };
        let bytes = if offset < in_data {
            data.slice(offset as usize..(offset + len) as usize)
        } else {
            trailer.slice((offset - in_data) as usize..(offset - in_data + len) as usize)
        };
        emit(Pdu::new(h, bytes));
        offset += len;
        data_sn = data_sn.wrapping_add(1);
    }
    if collapse {
        return;
    }
    let body = match &resp.sense {
        Some(s) => {
            let mut b = BytesMut::with_capacity(s.len() + 2);
            b.extend_from_slice(&(s.len() as u16).to_be_bytes());
            b.extend_from_slice(s);
            b.freeze()
        }
        None => Bytes::new(),
    };
    emit(Pdu::new(
        iscsi_wire::header::ScsiResponse {
            overflow: overflow > 0,
            underflow: underflow > 0,
            response: 0,
            status: resp.status,
            itt,
            exp_data_sn: data_sn,
            residual_count: residual,
            ..iscsi_wire::header::ScsiResponse::default()
        },
        body,
    ));
}

/// Stamps the sequence numbers of a target PDU at the moment it is sent (§4.2.2.2): StatSN
/// advances for every PDU that carries status, ExpCmdSN and MaxCmdSN are the window's now.
pub fn stamp(h: &mut Header, stat_sn: &mut u32, exp: u32, max: u32) {
    let mut advance = || {
        let s = *stat_sn;
        *stat_sn = stat_sn.wrapping_add(1);
        s
    };
    match h {
        Header::ScsiResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (advance(), exp, max),
        Header::DataIn(d) => {
            d.stat_sn = if d.status_present { advance() } else { 0 };
            (d.exp_cmd_sn, d.max_cmd_sn) = (exp, max);
        }
        Header::R2t(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (*stat_sn, exp, max),
        Header::NopIn(n) => {
            n.stat_sn = if n.itt == RESERVED_TAG {
                *stat_sn
            } else {
                advance()
            };
            (n.exp_cmd_sn, n.max_cmd_sn) = (exp, max);
        }
        Header::TaskMgmtResponse(r) => {
            (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (advance(), exp, max)
        }
        Header::TextResponse(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (advance(), exp, max),
        Header::LogoutResponse(r) => {
            (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (advance(), exp, max)
        }
        Header::Reject(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (advance(), exp, max),
        Header::AsyncMessage(r) => (r.stat_sn, r.exp_cmd_sn, r.max_cmd_sn) = (advance(), exp, max),
        _ => {}
    }
}

/// The CDB: 16 bytes in the BHS, continued in an Extended CDB AHS (§11.2.2.3).
fn assemble_cdb(cmd: &ScsiCommand, ahs: &Bytes) -> Option<Vec<u8>> {
    let mut cdb = cmd.cdb.to_vec();
    let mut rest = &ahs[..];
    while rest.len() >= 4 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let kind = rest[2];
        let total = iscsi_wire::pad4(3 + len);
        if total > rest.len() || len == 0 {
            return None;
        }
        if kind == 1 {
            // AHSLength counts the reserved byte plus the CDB continuation.
            cdb.extend_from_slice(&rest[4..3 + len]);
        }
        rest = &rest[total..];
    }
    Some(cdb)
}

/// For violations the target reports as task errors (kept for symmetry with the initiator).
impl From<DataError> for Violation {
    fn from(e: DataError) -> Self {
        Violation::DataPhase(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Disk;
    impl LunDirectory for Disk {
        fn exists(&self, lun: u64) -> bool {
            lun == 0
        }
        fn size(&self, _itt: u32, _lun: u64, cdb: &[u8], _edtl: u32) -> Sizing {
            let need = if cdb[0] == 0x8a {
                u64::from(u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]])) * 512
            } else {
                0
            };
            Sizing {
                need,
                ..Sizing::default()
            }
        }
    }

    fn params() -> SessionParams {
        SessionParams {
            initial_r2t: true,
            immediate_data: false,
            max_burst_length: 4096,
            first_burst_length: 4096,
            max_outstanding_r2t: 1,
            ..SessionParams::default()
        }
    }

    fn write16(itt: u32, cmd_sn: u32, blocks: u32) -> Pdu {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8a;
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        Pdu::new(
            ScsiCommand {
                immediate: false,
                final_: true,
                read: false,
                write: true,
                attr: iscsi_wire::header::TaskAttr::SIMPLE,
                lun: 0,
                itt,
                expected_data_transfer_length: blocks * 512,
                cmd_sn,
                exp_stat_sn: 0,
                cdb,
            },
            Bytes::new(),
        )
    }

    fn r2ts<D>(c: &mut Connection<D>) -> Vec<R2t> {
        let mut v = Vec::new();
        while let Some(p) = c.poll_transmit() {
            if let Header::R2t(r) = p.header {
                v.push(r);
            }
        }
        v
    }

    /// A gateway's LUN: no device server sizes its CDBs.
    struct Remote;
    impl LunDirectory for Remote {
        fn exists(&self, _lun: u64) -> bool {
            true
        }
        fn size(&self, _itt: u32, _lun: u64, _cdb: &[u8], _edtl: u32) -> Sizing {
            unreachable!("a pass-through LUN is sized by EDTL")
        }
        fn passthrough(&self, _lun: u64) -> bool {
            true
        }
    }

    /// Issue 27: a response's Data-In trailer (a Seal `none` transfer's) goes in PDUs of its
    /// own after the data, and the data's PDUs are slices of the device server's own buffer
    /// (no copy), with DataSN, offsets, F and the collapsed status as for one buffer.
    #[test]
    fn accepts_a_data_in_trailer_sent_after_the_data_in_pdus_of_its_own() {
        let p = SessionParams {
            initiator_max_recv_data_segment_length: 4096,
            max_burst_length: 1 << 20,
            ..SessionParams::default()
        };
        let data = Bytes::from(vec![5u8; 10_000]);
        let resp = Response {
            data_in_trailer: Bytes::from(vec![0u8; 40]),
            ..Response::good(data.clone())
        };
        assert_eq!(resp.data_in_len(), 10_040);
        let mut pdus = Vec::new();
        status_pdus(&p, 9, 0, 10_040, 0, &resp, None, &mut |pdu| pdus.push(pdu));
        let got: Vec<(u32, u32, usize, bool, bool)> = pdus
            .iter()
            .map(|pdu| match &pdu.header {
                Header::DataIn(h) => (
                    h.data_sn,
                    h.buffer_offset,
                    pdu.data.len(),
                    h.final_,
                    h.status_present,
                ),
                other => panic!("{other:?}"),
            })
            .collect();
        assert_eq!(
            got,
            [
                (0, 0, 4096, false, false),
                (1, 4096, 4096, false, false),
                (2, 8192, 1808, false, false),
                (3, 10_000, 40, true, true),
            ]
        );
        for (pdu, at) in pdus.iter().zip([0, 4096, 8192]) {
            assert_eq!(
                pdu.data.as_ptr(),
                data[at..].as_ptr(),
                "a slice, not a copy"
            );
        }
        let Header::DataIn(last) = &pdus[3].header else {
            unreachable!()
        };
        assert_eq!((last.residual_count, last.underflow), (0, false));
    }

    #[test]
    fn accepts_passthrough_data_out_sized_by_edtl_and_reports_the_given_residual() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        // WRITE(16) of 1 block with EDTL 2 blocks: the pass-through solicits all of EDTL.
        let mut cmd = write16(1, 1, 1);
        if let Header::ScsiCommand(h) = &mut cmd.header {
            h.expected_data_transfer_length = 1024;
        }
        c.handle_pdu(now, &Remote, cmd);
        let r = r2ts(&mut c);
        assert_eq!(r.len(), 1);
        assert_eq!(r[0].desired_data_transfer_length, 1024);
        let d = DataOut {
            final_: true,
            lun: 0,
            itt: 1,
            ttt: r[0].ttt,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        };
        c.handle_pdu(now, &Remote, Pdu::new(d, Bytes::from(vec![0u8; 1024])));
        let Some(Event::Execute(x)) = c.poll_event() else {
            panic!("no Execute")
        };
        assert_eq!((x.need, x.data_out.len(), x.early), (1024, 1024, None));
        assert!(x.write && !x.read, "the W bit goes with the command");
        // The remote target's underflow of one block goes to the host unchanged.
        assert!(c.complete_with_residual(1, Response::good(Bytes::new()), Some(512)));
        let p = c.poll_transmit().unwrap();
        let Header::ScsiResponse(h) = p.header else {
            panic!("no SCSI Response")
        };
        assert!(h.underflow && !h.overflow);
        assert_eq!(h.residual_count, 512);
    }

    /// A driver that decodes while sizing: the decoded command is the CDB's first byte and
    /// the ITT, so the test sees which command's value came back with which task.
    struct Decoding;
    impl LunDirectory<(u8, u32)> for Decoding {
        fn exists(&self, lun: u64) -> bool {
            lun == 0
        }
        fn size(&self, itt: u32, lun: u64, cdb: &[u8], edtl: u32) -> Sizing<(u8, u32)> {
            Sizing {
                need: Disk.size(itt, lun, cdb, edtl).need,
                decoded: Some((cdb[0], itt)),
                ..Sizing::default()
            }
        }
    }

    #[test]
    fn carries_what_sizing_decoded_to_each_commands_execute() {
        let now = Instant::now();
        let mut c: Connection<(u8, u32)> = Connection::carrying(Config::new(params(), 1, 1), now);
        // A WRITE waits for its data behind an R2T while a READ starts at once: each
        // Execute hands back its own command's value, not the one sized last.
        c.handle_pdu(now, &Decoding, write16(7, 1, 1));
        c.handle_pdu(now, &Decoding, read16(9, 2));
        let Some(Event::Execute(read)) = c.poll_event() else {
            panic!("no Execute for the READ")
        };
        assert_eq!((read.itt, read.decoded), (9, Some((0x88, 9))));
        let r = r2ts(&mut c);
        assert_eq!(r.len(), 1);
        let d = DataOut {
            final_: true,
            lun: 0,
            itt: 7,
            ttt: r[0].ttt,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        };
        c.handle_pdu(now, &Decoding, Pdu::new(d, Bytes::from(vec![0u8; 512])));
        let Some(Event::Execute(write)) = c.poll_event() else {
            panic!("no Execute for the WRITE")
        };
        assert_eq!((write.itt, write.decoded), (7, Some((0x8a, 7))));
        assert_eq!(write.data_out.len(), 512);
    }

    #[test]
    fn accepts_passthrough_reads_with_no_data_out_and_a_given_overflow() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        let mut cdb = [0u8; 16];
        cdb[0] = 0x28;
        let read = ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: iscsi_wire::header::TaskAttr::SIMPLE,
            lun: 0,
            itt: 5,
            expected_data_transfer_length: 512,
            cmd_sn: 1,
            exp_stat_sn: 0,
            cdb,
        };
        c.handle_pdu(now, &Remote, Pdu::new(read, Bytes::new()));
        let Some(Event::Execute(x)) = c.poll_event() else {
            panic!("no Execute")
        };
        assert_eq!((x.need, x.write_without_w), (0, false));
        assert!(x.read && !x.write, "the R bit goes with the command");
        assert!(c.complete_with_residual(
            5,
            Response::good(Bytes::from(vec![7u8; 512])),
            Some(-512)
        ));
        let p = c.poll_transmit().unwrap();
        let Header::DataIn(h) = p.header else {
            panic!("no Data-In")
        };
        assert!(h.status_present && h.overflow && !h.underflow);
        assert_eq!(h.residual_count, 512);
        assert_eq!(p.data.len(), 512);
    }

    #[test]
    fn never_allocates_the_reserved_ttt_across_commands_and_data_out() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        c.set_next_ttt(RESERVED_TAG - 1);
        c.handle_pdu(now, &Disk, write16(1, 1, 16));
        let first = r2ts(&mut c);
        assert_eq!(first.len(), 1);
        assert_eq!(first[0].ttt, RESERVED_TAG - 1);
        // Answer it: the next R2T (planned on Data-Out) must skip 0xffffffff.
        let d = DataOut {
            final_: true,
            lun: 0,
            itt: 1,
            ttt: first[0].ttt,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        };
        c.handle_pdu(now, &Disk, Pdu::new(d, Bytes::from(vec![0u8; 4096])));
        let second = r2ts(&mut c);
        assert_eq!(second.len(), 1);
        assert_ne!(second[0].ttt, RESERVED_TAG);
        assert_eq!(second[0].ttt, 1);
    }

    #[test]
    fn rejects_data_out_for_unknown_task_but_drops_it_for_an_aborted_one() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        c.handle_pdu(now, &Disk, write16(7, 1, 16));
        let _ = r2ts(&mut c);
        let tmf = TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::ABORT_TASK,
            lun: 0,
            itt: 8,
            referenced_task_tag: 7,
            cmd_sn: 2,
            exp_stat_sn: 0,
            ref_cmd_sn: 1,
            exp_data_sn: 0,
        };
        c.handle_pdu(now, &Disk, Pdu::new(tmf, Bytes::new()));
        let p = c.poll_transmit().unwrap();
        assert!(
            matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_COMPLETE)
        );
        assert_eq!(c.tasks_in_flight(), 0);
        let late = DataOut {
            final_: true,
            lun: 0,
            itt: 7,
            ttt: 1,
            exp_stat_sn: 0,
            data_sn: 0,
            buffer_offset: 0,
        };
        c.handle_pdu(
            now,
            &Disk,
            Pdu::new(late.clone(), Bytes::from(vec![0u8; 512])),
        );
        assert!(
            c.poll_transmit().is_none(),
            "late data for an aborted task is dropped"
        );
        let stray = DataOut { itt: 99, ..late };
        c.handle_pdu(now, &Disk, Pdu::new(stray, Bytes::from(vec![0u8; 512])));
        assert!(matches!(
            c.poll_transmit().map(|p| p.header),
            Some(Header::Reject(_))
        ));
    }

    #[test]
    fn holds_abort_response_until_the_running_task_finishes_and_suppresses_its_status() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        let read = ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: iscsi_wire::header::TaskAttr::SIMPLE,
            lun: 0,
            itt: 3,
            expected_data_transfer_length: 512,
            cmd_sn: 1,
            exp_stat_sn: 0,
            cdb,
        };
        c.handle_pdu(now, &Disk, Pdu::new(read, Bytes::new()));
        assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
        let tmf = TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::ABORT_TASK,
            lun: 0,
            itt: 4,
            referenced_task_tag: 3,
            cmd_sn: 2,
            exp_stat_sn: 0,
            ref_cmd_sn: 1,
            exp_data_sn: 0,
        };
        c.handle_pdu(now, &Disk, Pdu::new(tmf, Bytes::new()));
        assert!(c.poll_transmit().is_none(), "held while the task runs");
        assert!(c.complete(3, Response::good(Bytes::from(vec![1u8; 512]))));
        let p = c.poll_transmit().unwrap();
        assert!(
            matches!(p.header, Header::TaskMgmtResponse(_)),
            "no Data-In for the aborted task"
        );
        assert!(c.poll_transmit().is_none());
        assert_eq!(
            c.window().max_cmd_sn(),
            128 + 1,
            "its window slot is free again"
        );
    }

    fn read16(itt: u32, cmd_sn: u32) -> Pdu {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x88;
        let read = ScsiCommand {
            immediate: false,
            final_: true,
            read: true,
            write: false,
            attr: iscsi_wire::header::TaskAttr::SIMPLE,
            lun: 0,
            itt,
            expected_data_transfer_length: 512,
            cmd_sn,
            exp_stat_sn: 0,
            cdb,
        };
        Pdu::new(read, Bytes::new())
    }

    fn tmf(function: TmfFunction, itt: u32, rtt: u32, cmd_sn: u32) -> Pdu {
        let t = TaskMgmtRequest {
            immediate: true,
            function,
            lun: 0,
            itt,
            referenced_task_tag: rtt,
            cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: 1,
            exp_data_sn: 0,
        };
        Pdu::new(t, Bytes::new())
    }

    #[test]
    fn abort_of_a_completed_task_is_task_does_not_exist_even_before_its_status_left() {
        // libiscsi's iSCSITMF.AbortTaskSimpleAsync: a WRITE, then ABORT TASK for it. When the
        // write completed first (its GOOD status queued or sent), the answer must be "Task
        // does not exist" (RFC 7143 §11.5.1 b: its CmdSN is no longer in the window), never
        // "Function complete" beside a GOOD status.
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        c.handle_pdu(now, &Remote, read16(3, 1));
        assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
        assert!(c.complete(3, Response::good(Bytes::from(vec![1u8; 512]))));
        c.handle_pdu(now, &Remote, tmf(TmfFunction::ABORT_TASK, 4, 3, 2));
        let mut answers = Vec::new();
        while let Some(p) = c.poll_transmit() {
            answers.push(p.header);
        }
        assert!(
            answers.iter().any(|h| matches!(h, Header::TaskMgmtResponse(r) if r.response == TmfResponse::TASK_DOES_NOT_EXIST)),
            "{answers:?}"
        );
        assert!(
            !answers.iter().any(|h| matches!(h, Header::TaskMgmtResponse(r) if r.response == TmfResponse::FUNCTION_COMPLETE)),
            "{answers:?}"
        );
    }

    #[test]
    fn abort_of_a_command_not_received_yet_is_function_complete() {
        // RFC 7143 §11.5.1 a): the referenced CmdSN is in the window and before the request's
        // own: the target considers it received and answers "Function complete".
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        // The command with CmdSN 1 is lost on the way; the initiator's immediate ABORT TASK
        // for it carries the next CmdSN, 2, and RefCmdSN 1 (ExpCmdSN is still 1).
        c.handle_pdu(now, &Remote, tmf(TmfFunction::ABORT_TASK, 4, 9, 2));
        let p = c.poll_transmit().unwrap();
        assert!(
            matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_COMPLETE),
            "{:?}",
            p.header
        );
    }

    #[test]
    fn asks_the_driver_to_forward_an_abort_of_a_passthrough_task_and_suppresses_its_status() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        c.handle_pdu(now, &Remote, read16(3, 1));
        c.handle_pdu(now, &Remote, read16(5, 2));
        assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
        assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
        c.handle_pdu(now, &Remote, tmf(TmfFunction::ABORT_TASK, 4, 3, 3));
        match c.poll_event() {
            Some(Event::Abort { itts }) => assert_eq!(itts, vec![3], "only the referenced task"),
            e => panic!("expected Event::Abort, got {e:?}"),
        }
        assert!(
            c.poll_transmit().is_none(),
            "held while the remote abort runs"
        );
        // The forwarded command ends (aborted remotely, or its status won the race).
        assert!(c.complete(3, Response::good(Bytes::from(vec![1u8; 512]))));
        let p = c.poll_transmit().unwrap();
        assert!(
            matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_COMPLETE),
            "the abort's response, and no Data-In or status for the aborted task"
        );
        assert!(c.poll_transmit().is_none());
        // The other task is untouched and still answers.
        assert!(c.complete(5, Response::good(Bytes::from(vec![2u8; 512]))));
        assert!(c.poll_transmit().is_some());
    }

    #[test]
    fn holds_a_passthrough_lun_reset_response_until_the_driver_reset_the_remote_lu() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        c.handle_pdu(now, &Remote, read16(3, 1));
        assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
        c.handle_pdu(now, &Remote, tmf(TmfFunction::LOGICAL_UNIT_RESET, 9, 0, 2));
        match c.poll_event() {
            Some(Event::Reset {
                function: TmfFunction::LOGICAL_UNIT_RESET,
                answer: Some(9),
                ..
            }) => {}
            e => panic!("expected a Reset the driver answers, got {e:?}"),
        }
        assert!(c.complete(3, Response::good(Bytes::new())));
        assert!(c.poll_transmit().is_none(), "held until the driver answers");
        assert!(
            !c.reset_done(77, TmfResponse::FUNCTION_COMPLETE),
            "unknown ITT"
        );
        assert!(c.reset_done(9, TmfResponse::FUNCTION_REJECTED));
        let p = c.poll_transmit().unwrap();
        assert!(
            matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_REJECTED && r.itt == 9),
            "the driver's outcome, not a blind Function complete"
        );
        assert!(c.poll_transmit().is_none(), "no status for the reset task");
    }

    #[test]
    fn answers_a_local_lun_reset_without_the_driver() {
        let now = Instant::now();
        let mut c = Connection::new(Config::new(params(), 1, 1), now);
        c.handle_pdu(now, &Disk, tmf(TmfFunction::LOGICAL_UNIT_RESET, 9, 0, 1));
        assert!(matches!(
            c.poll_event(),
            Some(Event::Reset { answer: None, .. })
        ));
        assert!(matches!(
            c.poll_transmit().map(|p| p.header),
            Some(Header::TaskMgmtResponse(ref r)) if r.response == TmfResponse::FUNCTION_COMPLETE
        ));
    }

    #[test]
    fn ignores_commands_outside_the_window_and_pings_when_idle() {
        let now = Instant::now();
        let mut cfg = Config::new(params(), 10, 1);
        cfg.cmd_window = 1;
        cfg.nop_interval = Some(Duration::from_secs(5));
        let mut c = Connection::new(cfg, now);
        c.handle_pdu(now, &Disk, write16(1, 11, 1));
        assert!(c.poll_transmit().is_none(), "CmdSN 11 beyond MaxCmdSN 10");
        assert_eq!(c.tasks_in_flight(), 0);
        let t = c.poll_timeout().unwrap();
        c.handle_timeout(t);
        assert!(
            matches!(c.poll_transmit().map(|p| p.header), Some(Header::NopIn(n)) if n.ttt != RESERVED_TAG)
        );
        let t = c.poll_timeout().unwrap();
        c.handle_timeout(t);
        assert!(matches!(
            c.poll_event(),
            Some(Event::Closed(ConnectionError {
                reason: CloseReason::PingTimeout(_),
                ..
            }))
        ));
    }
    /// The initiator's answer to the target's ping `ttt` (RFC 7143 §11.18.3).
    fn pong(ttt: u32) -> Pdu {
        Pdu::new(
            NopOut {
                immediate: true,
                lun: 0,
                itt: RESERVED_TAG,
                ttt,
                cmd_sn: 0,
                exp_stat_sn: 0,
            },
            Bytes::new(),
        )
    }

    fn closed_by_ping(c: &mut Connection) -> bool {
        std::iter::from_fn(|| c.poll_event()).any(|e| {
            matches!(
                e,
                Event::Closed(ConnectionError {
                    reason: CloseReason::PingTimeout(_),
                    ..
                })
            )
        })
    }

    /// Issue 28's lost 1-connection reads: 16 MiB of Data-In queued at 0.25 MB/s holds the
    /// target's ping for a minute; the initiator (sending nothing, its commands all out) cannot
    /// answer what has not reached it. The old engine closed the connection two intervals after
    /// the ping was queued, while the socket was still busy with the data before it.
    #[test]
    fn accepts_a_late_ping_answer_when_the_ping_waited_behind_queued_data() {
        let t0 = Instant::now();
        let i = Duration::from_secs(30);
        let mut cfg = Config::new(params(), 10, 1);
        cfg.nop_interval = Some(i);
        let mut c = Connection::new(cfg, t0);
        // Idle for an interval: the ping is queued (behind data in a real driver).
        c.handle_timeout(t0 + i);
        let ttt = match c.poll_transmit().map(|p| p.header) {
            Some(Header::NopIn(n)) if n.ttt != RESERVED_TAG => n.ttt,
            other => panic!("expected a ping, got {other:?}"),
        };
        // The writer holds it in a batch behind a minute of Data-In: not yet in the socket.
        c.handle_timeout(t0 + 3 * i);
        assert!(
            !closed_by_ping(&mut c),
            "closed while the ping waited to leave"
        );
        assert!(c.closed().is_none());
        // The batch is written after 64 s: the answer is waited for from then.
        let left = t0 + i + Duration::from_secs(64);
        assert!(c.flushed(left), "the deadline moves to the write");
        assert_eq!(c.poll_timeout(), Some(left + i));
        c.handle_timeout(left + i - Duration::from_millis(1));
        assert!(c.closed().is_none());
        c.handle_pdu(left + Duration::from_secs(1), &Disk, pong(ttt));
        assert!(c.closed().is_none(), "answered");
        assert_eq!(
            c.poll_timeout(),
            Some(left + Duration::from_secs(1) + i),
            "the keepalive runs again from the answer"
        );
    }

    #[test]
    fn closes_a_connection_whose_written_ping_goes_unanswered() {
        let t0 = Instant::now();
        let i = Duration::from_secs(5);
        let mut cfg = Config::new(params(), 10, 1);
        cfg.nop_interval = Some(i);
        let mut c = Connection::new(cfg, t0);
        c.handle_timeout(t0 + i);
        assert!(matches!(
            c.poll_transmit().map(|p| p.header),
            Some(Header::NopIn(_))
        ));
        assert!(c.flushed(t0 + i));
        assert!(!c.flushed(t0 + i + i), "reported once");
        // A command received while the ping is out proves the initiator alive.
        c.handle_pdu(t0 + i + Duration::from_secs(3), &Disk, read16(1, 10));
        c.handle_timeout(t0 + i + i);
        assert!(c.closed().is_none(), "heard from the initiator 2 s ago");
        let dead = t0 + i + Duration::from_secs(3) + i;
        assert_eq!(c.poll_timeout(), Some(dead));
        c.handle_timeout(dead);
        assert!(closed_by_ping(&mut c));
    }

    #[test]
    fn closes_a_connection_whose_ping_never_leaves() {
        // A peer that keeps its window shut: the socket never takes the ping.
        let t0 = Instant::now();
        let i = Duration::from_secs(5);
        let mut cfg = Config::new(params(), 10, 1);
        cfg.nop_interval = Some(i);
        let mut c = Connection::new(cfg, t0);
        c.handle_timeout(t0 + i);
        assert!(c.poll_transmit().is_some());
        let bound = t0 + i + i * PING_LEAVE_INTERVALS;
        assert_eq!(c.poll_timeout(), Some(bound));
        c.handle_timeout(bound - Duration::from_millis(1));
        assert!(c.closed().is_none());
        c.handle_timeout(bound);
        assert!(closed_by_ping(&mut c));
    }
}
