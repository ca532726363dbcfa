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

use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

use bytes::Bytes;
use iscsi_wire::header::{
    AsyncMessage, NopIn, Reject, RejectReason, ScsiCommand, TmfFunction, TmfResponse,
};
use iscsi_wire::{Header, Pdu, WireError, RESERVED_TAG};

use super::r2t::{DataError, Lent, ReserveBudget, WriteState};
use super::{fixed_sense, CloseReason, ConnectionError, PeerTagMap, Side, TagAllocator, Violation};
use crate::params::{SessionParams, SessionType};
use crate::seq::{Admit, CmdWindow};

mod recovery;
mod requests;
mod sealed;
pub mod session;
mod status;
mod tmf;
mod write;

pub use sealed::SealedLengths;
use status::status_pdus;

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
    /// to the plaintext, against this ([`Sizing::sealed`] decides both). `None`: `need`.
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
    /// Refuse a data-out buffer above this many bytes, whatever the CDB or EDTL claim. Also
    /// the bytes this connection's writes may hold reserved whole ahead of their data
    /// ([`ReserveBudget`], issue 27): one largest command's worth.
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
    /// The tasks by the initiator's ITTs, hashed keyed ([`PeerTags`](super::PeerTags)) and
    /// bounded, whatever tags the initiator picks: a non-immediate task holds a CmdSN window
    /// slot from its admission until its status is queued (`counted`; a collecting task
    /// aborted gives it back as it leaves the table, a running one keeps it until the driver
    /// completes it), so the session's window (`Config::cmd_window`, at most 4096 in the
    /// target's configuration) bounds them over all its connections (RFC 7143 §4.2.2.1); an
    /// immediate command, which the window does not count, is refused with Reject 0x06 while
    /// the connection has [`MAX_IMMEDIATE_TASKS`] immediate tasks (RFC 7143 §4.2.2.1 allows
    /// it: "Immediate commands MAY be rejected ... due to a lack of resources"). Tasks adopted
    /// by TASK REASSIGN (ErrorRecoveryLevel 2) were another connection's, bounded alike.
    tasks: PeerTagMap<Task<D>>,
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
    /// What this connection's writes may reserve whole ([`Config::max_command_bytes`]).
    reserve: ReserveBudget,
    /// Room reserved for the write whose immediate data the driver is receiving in place
    /// (`Connection::lend_command_buffer`), until its command is handled.
    lent: Option<Lent>,
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

/// Immediate SCSI commands (I bit, outside the CmdSN window) one connection runs at once at
/// most; another is refused with Reject "Immediate command reject" (0x06, RFC 7143 §11.17.1).
/// RFC 7143 §4.2.2.1 asks a target to take at least one; ipsan's initiator sends none
/// (only its NOP-Outs and task management are immediate, and neither is a task here).
pub const MAX_IMMEDIATE_TASKS: usize = 16;

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
            tasks: PeerTagMap::default(),
            aborted: VecDeque::new(),
            held_tmfs: Vec::new(),
            text_partial: Vec::new(),
            logout: None,
            nop_interval: cfg.nop_interval,
            idle_deadline: cfg.nop_interval.map(|i| now + i),
            ping: None,
            drain_timeout: cfg.drain_timeout,
            max_command_bytes: cfg.max_command_bytes,
            reserve: ReserveBudget::new(
                usize::try_from(cfg.max_command_bytes).unwrap_or(usize::MAX),
            ),
            lent: None,
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

    /// Our ping was handed out ([`Connection::poll_transmit`]) and the driver has not yet
    /// reported it delivered ([`Connection::flushed`]): the driver watches its socket until the
    /// initiator's TCP has acknowledged the ping's bytes.
    #[must_use]
    pub fn ping_leaving(&self) -> bool {
        matches!(self.ping, Some(p) if p.taken && p.left.is_none())
    }

    /// Our ping has reached the initiator: the driver saw its socket's bytes up to the ping
    /// acknowledged (or, where it cannot tell, wrote it into the socket). The answer is waited
    /// for from here: on a slow lossy link the ping leaves behind MiBs of Data-In, and the
    /// initiator cannot answer what has not reached it (a 16 MiB read queue at 0.25 MB/s holds
    /// it for a minute; written into an 8 MiB send buffer it still waited ~40 s there). True
    /// when that moved [`Connection::poll_timeout`] earlier (a timer waiting for the old one
    /// should be woken).
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

    /// Immediate tasks of this connection (not counted by the window).
    fn immediate_tasks(&self) -> usize {
        self.tasks.values().filter(|t| !t.counted).count()
    }

    fn remember_aborted(&mut self, itt: u32) {
        if self.aborted.len() >= ABORTED_MEMORY {
            self.aborted.pop_front();
        }
        self.aborted.push_back(itt);
    }
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

/// For violations the target reports as task errors (kept for symmetry with the initiator).
impl From<DataError> for Violation {
    fn from(e: DataError) -> Self {
        Violation::DataPhase(e)
    }
}

#[cfg(test)]
mod tests;
