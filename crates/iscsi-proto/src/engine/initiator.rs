//! The initiator's side of one connection in full feature phase (RFC 7143, MaxConnections=1,
//! ErrorRecoveryLevel=0).
//!
//! ```text
//!  submit ─► task table ─► window open? (CmdSN <= MaxCmdSN, §4.2.2.1) ─► SCSI Command with
//!            immediate data, unsolicited Data-Out up to FirstBurstLength (§13.10, §13.14)
//!  handle_pdu ─► ExpCmdSN/MaxCmdSN/StatSN ─► Data-In: DataSN, offsets, into the read buffer
//!                                         ─► R2T: checked (R2TSN, MaxOutstandingR2T, TTT,
//!                                            MaxBurstLength, bounds), answered with Data-Out
//!                                         ─► SCSI Response: status, sense, residual
//!  handle_timeout ─► a timed command past Config::command_timeout: ABORT TASK; refused:
//!                    LOGICAL UNIT RESET; refused or unanswered: the connection ends
//!  poll_event ◄── Completed { itt, result } exactly once per submitted command
//! ```
//!
//! A target whose R2T breaks a rule for one task loses that task, not the connection: the
//! task completes with [`TaskError::Violation`] and an ABORT TASK cleans up the target's side
//! (the initiator cannot Reject, §11.17 is the target's; ABORT TASK is how it ends a task
//! it no longer trusts). Breaches that leave data or the stream in doubt — a Data-In
//! sequence out of order or past its buffer (no SNACK at ErrorRecoveryLevel 0), PDUs for
//! tasks that never existed, unexpected opcodes — end the connection, and every task with it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{
    DataIn, DataOut, LogoutReason, LogoutRequest, NopIn, NopOut, R2t, RejectReason, ScsiCommand,
    ScsiResponse, TaskAttr, TaskMgmtRequest, TmfFunction, TmfResponse,
};
use iscsi_wire::{Header, Opcode, Pdu, BHS_LEN, RESERVED_TAG};

use super::{CloseReason, ConnectionError, OwnTagMap, OwnTagSet, Side, TagAllocator, Violation};
use crate::params::SessionParams;
use crate::seq::{sn_le, sn_lt};

/// Settings of one initiator connection.
#[derive(Clone, Debug)]
pub struct Config {
    /// The values negotiated at login (`target_max_recv_data_segment_length` limits our
    /// Data-Out, `initiator_max_recv_data_segment_length` the target's Data-In).
    pub params: SessionParams,
    /// The next CmdSN, the window and ExpStatSN from the last Login Response.
    pub cmd_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// Send a NOP-Out ping this long after the last one; `None` disables.
    pub nop_interval: Option<Duration>,
    /// The connection is dead when a ping is unanswered and nothing else arrived for this long.
    pub nop_timeout: Duration,
    /// A task management request unanswered this long ends the connection.
    pub tmf_timeout: Duration,
    /// Bytes of answers to the target's pings that may wait to leave (a target pinging faster
    /// than it reads would grow the queue without bound).
    pub max_queued_pong_bytes: usize,
    /// A command submitted with [`Command::timed`] and without status this long after its
    /// submission is aborted: ABORT TASK (RFC 7143 §11.5.1); if the target refuses, LOGICAL
    /// UNIT RESET (SAM-5 §7.7, as SCSI error handling escalates); if that is refused too, or
    /// either goes unanswered for [`Config::tmf_timeout`], the connection ends (its tasks
    /// cannot be trusted any more). An aborted command completes with
    /// [`TaskError::TimedOut`]. `None`: commands wait for as long as the connection lives
    /// (the keepalive still catches a dead one).
    pub command_timeout: Option<Duration>,
}

impl Config {
    #[must_use]
    pub fn new(params: SessionParams, cmd_sn: u32, max_cmd_sn: u32, exp_stat_sn: u32) -> Self {
        Self {
            params,
            cmd_sn,
            exp_cmd_sn: cmd_sn,
            max_cmd_sn,
            exp_stat_sn,
            nop_interval: Some(Duration::from_secs(5)),
            nop_timeout: Duration::from_secs(10),
            tmf_timeout: Duration::from_secs(10),
            max_queued_pong_bytes: 1024 * 1024,
            command_timeout: None,
        }
    }
}

/// A command's data.
#[derive(Debug)]
pub enum Data {
    None,
    /// Expect `len` bytes; `buf` is reused (cleared, not reallocated when large enough), by
    /// this read or another: the connection binds a read's buffer when its first data
    /// arrives, the one handed in most recently (issue 27; a buffer still in the cache). When
    /// one Data-In carries all `len` bytes in a buffer nothing else holds, that buffer is the
    /// command's data instead (no copy) and a buffer handed in is the driver's again
    /// ([`Connection::take_spare_buffer`]).
    Read {
        buf: BytesMut,
        len: u32,
    },
    Write(Bytes),
}

/// One SCSI command to send.
#[derive(Debug)]
pub struct Command {
    /// The raw 8-byte LUN field.
    pub lun: u64,
    pub cdb: [u8; 16],
    pub data: Data,
    /// Whether [`Config::command_timeout`] applies to this command (a gateway's pass-through
    /// leaves timing to the host on its other side and submits with `false`).
    pub timed: bool,
}

/// The status of a command that reached the device server.
#[derive(Debug, PartialEq, Eq)]
pub struct Completion {
    pub status: u8,
    /// Sense data from the SCSI Response (§11.4.7.2), without the length prefix.
    pub sense: Option<Bytes>,
    /// Data-In, truncated by the residual count for an underflow.
    pub data: BytesMut,
    /// Residual count (positive: underflow, negative: overflow).
    pub residual: i64,
}

/// Who aborted a task.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AbortedBy {
    AbortTask,
    LunReset,
}

/// A command that ended without a SCSI status.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum TaskError {
    /// iSCSI response other than "command completed at target" (§11.4.3).
    #[error("iSCSI response {0:#04x} (target failure)")]
    IscsiResponse(u8),
    /// The target rejected the command PDU (§11.17).
    #[error("target rejected the command (reason {0:?})")]
    Rejected(RejectReason),
    /// Aborted by task management; no status comes for it.
    #[error("aborted by {0:?}")]
    Aborted(AbortedBy),
    /// The target broke a rule for this task; it was aborted, the connection goes on.
    #[error("target broke a rule for this task: {0}")]
    Violation(Violation),
    /// No status within [`Config::command_timeout`]; the task is gone at the target, ended
    /// by the task management function `by` (`None`: it was still waiting for the CmdSN
    /// window and never left). The connection goes on. A write may or may not have reached
    /// the medium (SAM-5 §5.6).
    #[error("command timed out after {after:?} and was aborted{}", match by { Some(AbortedBy::AbortTask) => " (ABORT TASK)", Some(AbortedBy::LunReset) => " (LOGICAL UNIT RESET)", None => " before it was sent" })]
    TimedOut {
        after: Duration,
        by: Option<AbortedBy>,
    },
    /// The connection ended before the status came.
    #[error(transparent)]
    ConnectionLost(ConnectionError),
}

/// How a submitted command ended.
pub type TaskResult = Result<Completion, TaskError>;

/// Why [`Connection::submit`] refused a command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    #[error(transparent)]
    Closed(ConnectionError),
    /// The target asked for a logout (AsyncEvent 1): open a new session.
    #[error("the target requested a logout")]
    LogoutRequested,
    /// More than 4 GiB, or a tag already in use.
    #[error("invalid command")]
    Invalid,
}

/// What the driver must act on.
#[derive(Debug)]
pub enum Event {
    /// A submitted command ended: exactly one per [`Connection::submit`].
    Completed {
        itt: u32,
        result: Result<Completion, TaskError>,
    },
    /// The answer to [`Connection::abort`] or [`Connection::lun_reset`].
    TaskManagement { itt: u32, response: TmfResponse },
    /// The target asked for a logout (AsyncEvent 1) within this many seconds; new commands
    /// are refused, and the engine logs out once the commands in flight are done.
    LogoutRequested { within_secs: u16 },
    /// The target rejected a PDU that was not a command (its tasks go on).
    Rejected {
        reason: RejectReason,
        opcode: Opcode,
    },
    /// Command `itt` passed [`Config::command_timeout`] and the engine took this step to
    /// end it (for the driver's log; the command's `Completed` follows).
    TimeoutStep { itt: u32, step: TimeoutStep },
    /// The connection is over (every task has its `Completed` before this, or, held for
    /// ErrorRecoveryLevel 2, waits in [`Connection::take_held`]).
    Closed(ConnectionError),
    /// A TASK REASSIGN sent by [`Connection::reassign`] was answered (RFC 7143 §11.6.1): the
    /// task goes on here, or was sent again with its CmdSN (the target never had it). A
    /// refused one ends the task ([`TaskError::ConnectionLost`]) and says so here too.
    Reassigned { itt: u32, outcome: Reassignment },
    /// The Logout removing connection `cid` for recovery ([`Connection::logout_for_recovery`],
    /// RFC 7143 §11.14.1 reason 2) was answered with `response` (§11.15.1: 0 closed, 1 CID
    /// not found, 2 recovery not supported, 3 cleanup failed).
    RecoveryLogout { cid: u16, response: u8 },
}

/// How a TASK REASSIGN ended ([`Event::Reassigned`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reassignment {
    /// Function complete: the task is this connection's; what it misses comes here (Data-In
    /// from ExpDataSN, recovery R2Ts, its status; RFC 7143 §7.2.2).
    Adopted,
    /// Task does not exist and its CmdSN was never acknowledged: the target never had it, so
    /// the command went again, same ITT and CmdSN (a retry, RFC 7143 §6.2.1, §7.2.1).
    Retried,
    /// Refused with this response (or the target had the command and lost it): the task
    /// ended with [`TaskError::ConnectionLost`].
    Refused(TmfResponse),
}

/// What the engine does about a command past its timeout (see [`Config::command_timeout`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TimeoutStep {
    /// ABORT TASK sent.
    AbortTask,
    /// The target answered the ABORT TASK with this response; LOGICAL UNIT RESET sent.
    LunReset { abort_response: TmfResponse },
}

#[derive(Debug, PartialEq, Eq)]
enum Phase {
    /// Waiting for the window to open.
    Queued,
    /// Sent with this CmdSN.
    Sent(u32),
    /// Completed locally (violation); waiting for the ABORT TASK's answer to forget it.
    Abandoned,
}

#[derive(Debug)]
struct Task {
    lun: u64,
    cdb: [u8; 16],
    write: Bytes,
    /// Sent with the W bit: the caller gave write data (a pass-through may give none).
    write_bit: bool,
    read: Option<BytesMut>,
    read_len: u32,
    received: u32,
    next_data_sn: u32,
    next_r2t_sn: u32,
    /// R2Ts whose last Data-Out has not left yet: (TTT, Data-Out PDUs still queued).
    unsent_r2ts: Vec<(u32, u32)>,
    /// Byte ranges already solicited, to catch an R2T asking twice.
    solicited: Vec<(u32, u32)>,
    phase: Phase,
    /// When the command times out (its entry in `Connection::deadlines`).
    deadline: Option<Instant>,
    /// Past its deadline: the escalation runs, and an abort ends it with
    /// [`TaskError::TimedOut`].
    timed_out: bool,
    /// Reassigned to this connection (ErrorRecoveryLevel 2): the target's recovery R2Ts
    /// carry R2TSNs after the last it sent, some of which never reached us (RFC 7143 §7.2.2).
    reassigned: bool,
    /// TASK REASSIGNs it went through: a target that keeps failing the connections it lands
    /// on does not get to move it for ever ([`MAX_REASSIGNS`]).
    reassigns: u8,
}

/// TASK REASSIGNs one task goes through at most before it ends with its connection.
pub const MAX_REASSIGNS: u8 = 8;

#[derive(Debug, Clone, Copy)]
enum TmfKind {
    /// ABORT TASK from the caller (its answer is an event).
    Abort(u32),
    /// ABORT TASK for a task abandoned after a violation (answer consumed here).
    Cleanup(u32),
    /// ABORT TASK for a command past its timeout (answer consumed here).
    TimeoutAbort(u32),
    /// LOGICAL UNIT RESET of this LUN, sent when this was the next CmdSN: it ends the
    /// tasks sent before it, not those sent after (SAM-5 §7.7, RFC 7143 §11.5.1).
    /// `escalation`: sent by the engine because the target refused to abort this timed-out
    /// task with this response (answer consumed here), not by the caller.
    LunReset {
        lun: u64,
        at: u32,
        escalation: Option<(u32, TmfResponse)>,
    },
    /// TASK REASSIGN of this task to this connection (ErrorRecoveryLevel 2, §11.5.1).
    Reassign(u32),
    /// Not a TMF: a Logout removing connection `cid` for recovery (§11.14.1 reason 2),
    /// timed as one.
    RecoveryLogout(u16),
}

/// Read buffers a connection keeps for reads whose data has not arrived yet (beyond this the
/// caller's buffer is dropped, and a read allocates its own when its data comes).
const READ_POOL_MAX: usize = 256;

/// Binds a read's buffer when its first data arrives (issue 27): `buf`, the task's, still
/// unbound (no room), becomes the buffer a caller handed in most recently (`pool`'s last), or
/// a fresh one, with room for the read's `len` bytes. Taken then rather than at submission,
/// a read's data lands in the buffer whose data its caller took last, so with many reads
/// in flight the same few buffers go round, still in the cache, rather than one per read in
/// flight, long evicted (a 1 MiB × 16 read's copy into 16 MiB of buffers).
fn bind_read_buffer(buf: &mut BytesMut, pool: &mut Vec<BytesMut>, len: usize) {
    if buf.capacity() >= len {
        return;
    }
    if let Some(b) = pool.pop() {
        *buf = b;
    }
    buf.clear();
    buf.reserve(len);
}

/// A Data-In segment: received as bytes of its own, or received in place into the free end
/// of the task's buffer ([`Connection::lend_read_buffer`]).
enum Segment {
    Received(Bytes),
    Placed(BytesMut),
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Received(b) => b.len(),
            Segment::Placed(b) => b.len(),
        }
    }
}

/// A task taken out of its connection ([`Connection::take_task`]) to go on another
/// ([`Connection::adopt_task`]): ErrorRecoveryLevel 2's connection allegiance reassignment
/// (RFC 7143 §7.2.2) moves it whole.
#[derive(Debug)]
pub struct MovedTask {
    itt: u32,
    task: Task,
}

impl MovedTask {
    /// The task's ITT (it keeps it: ITTs are the session's, §11.2.1.8).
    #[must_use]
    pub fn itt(&self) -> u32 {
        self.itt
    }

    /// The CmdSN it went with (`None`: it had not left).
    #[must_use]
    pub fn cmd_sn(&self) -> Option<u32> {
        match self.task.phase {
            Phase::Sent(sn) => Some(sn),
            _ => None,
        }
    }

    /// Bytes of write data it carries (0: none).
    #[must_use]
    pub fn write_len(&self) -> usize {
        self.task.write.len()
    }

    /// Replaces its write data with `data` of the same length: data made again for the
    /// connection it moves to (Seal seals under each connection's keys; the EDTL its command
    /// went with, and the offsets of R2Ts, stay right). False, and nothing changed, when the
    /// length differs.
    pub fn replace_write(&mut self, data: Bytes) -> bool {
        if data.len() != self.task.write.len() {
            return false;
        }
        self.task.write = data;
        true
    }
}

/// The engine: one initiator connection in full feature phase.
#[derive(Debug)]
pub struct Connection {
    params: SessionParams,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    exp_stat_sn: u32,
    itt: TagAllocator,
    tasks: OwnTagMap<Task>,
    queued: VecDeque<u32>,
    tmfs: OwnTagMap<(TmfKind, Instant)>,
    ping: Option<(u32, Instant)>,
    next_ping: Option<Instant>,
    last_rx: Instant,
    nop_interval: Option<Duration>,
    nop_timeout: Duration,
    tmf_timeout: Duration,
    command_timeout: Option<Duration>,
    /// (deadline, ITT) of timed commands in submission order, so deadlines ascend; an entry
    /// whose task is gone or has another deadline is stale and skipped.
    deadlines: VecDeque<(Instant, u32)>,
    logout: Option<u32>,
    logout_asked: bool,
    pong_bytes: usize,
    max_pong_bytes: usize,
    out: VecDeque<Pdu>,
    events: VecDeque<Event>,
    closed: Option<ConnectionError>,
    /// Commands that ended with the connection before their command PDU left the engine
    /// (see [`Connection::never_sent`]).
    never_sent: OwnTagSet,
    /// ITTs the session holds for tasks it will submit here (see [`Connection::reserve_itt`]).
    reserved: OwnTagSet,
    /// A caller's read buffer that a Data-In segment replaced (see
    /// [`Connection::take_spare_buffer`]).
    spare: Option<BytesMut>,
    /// The buffers callers handed in with their reads, the most recent last: a read takes
    /// one when its first data arrives, not when it is submitted ([`bind_read_buffer`]).
    read_pool: Vec<BytesMut>,
    /// ErrorRecoveryLevel 2 ([`Connection::hold_tasks`]): when the connection fails, its
    /// tasks are kept for reassignment instead of ending with it.
    hold: bool,
    /// Tasks kept when it failed ([`Connection::take_held`]).
    held: Vec<MovedTask>,
}

impl Connection {
    #[must_use]
    pub fn new(cfg: Config, now: Instant) -> Self {
        Self {
            params: cfg.params,
            cmd_sn: cfg.cmd_sn,
            exp_cmd_sn: cfg.exp_cmd_sn,
            max_cmd_sn: cfg.max_cmd_sn,
            exp_stat_sn: cfg.exp_stat_sn,
            itt: TagAllocator::default(),
            tasks: OwnTagMap::default(),
            queued: VecDeque::new(),
            tmfs: OwnTagMap::default(),
            ping: None,
            next_ping: cfg.nop_interval.map(|i| now + i),
            last_rx: now,
            nop_interval: cfg.nop_interval,
            nop_timeout: cfg.nop_timeout,
            tmf_timeout: cfg.tmf_timeout,
            command_timeout: cfg.command_timeout,
            deadlines: VecDeque::new(),
            logout: None,
            logout_asked: false,
            pong_bytes: 0,
            max_pong_bytes: cfg.max_queued_pong_bytes,
            out: VecDeque::new(),
            events: VecDeque::new(),
            never_sent: OwnTagSet::default(),
            reserved: OwnTagSet::default(),
            closed: None,
            spare: None,
            read_pool: Vec::new(),
            hold: false,
            held: Vec::new(),
        }
    }

    // ---- getters ----

    #[must_use]
    pub fn params(&self) -> &SessionParams {
        &self.params
    }

    /// Commands submitted and not completed (queued, sent, or abandoned awaiting cleanup).
    #[must_use]
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Task management requests awaiting an answer.
    #[must_use]
    pub fn tmfs_in_flight(&self) -> usize {
        self.tmfs.len()
    }

    /// Whether [`Connection::poll_transmit`] has a PDU (drivers wake their writer only then).
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        !self.out.is_empty()
    }

    #[must_use]
    pub fn closed(&self) -> Option<ConnectionError> {
        self.closed
    }

    #[must_use]
    pub fn logout_requested(&self) -> bool {
        self.logout_asked
    }

    /// (CmdSN next, ExpCmdSN, MaxCmdSN, ExpStatSN).
    #[must_use]
    pub fn sequence(&self) -> (u32, u32, u32, u32) {
        (
            self.cmd_sn,
            self.exp_cmd_sn,
            self.max_cmd_sn,
            self.exp_stat_sn,
        )
    }

    /// Whether the window lets another command go now.
    #[must_use]
    pub fn window_open(&self) -> bool {
        sn_le(self.cmd_sn, self.max_cmd_sn) && self.queued.is_empty()
    }

    // ---- outputs ----

    /// The next PDU to send, ExpStatSN stamped now.
    pub fn poll_transmit(&mut self) -> Option<Pdu> {
        let mut pdu = self.out.pop_front()?;
        let e = self.exp_stat_sn;
        match &mut pdu.header {
            Header::ScsiCommand(h) => h.exp_stat_sn = e,
            Header::DataOut(h) => {
                h.exp_stat_sn = e;
                if h.final_ && h.ttt != RESERVED_TAG {
                    self.r2t_answered(h.itt, h.ttt);
                }
            }
            Header::NopOut(h) => {
                h.exp_stat_sn = e;
                if h.itt == RESERVED_TAG {
                    self.pong_bytes = self.pong_bytes.saturating_sub(BHS_LEN + pdu.data.len());
                }
            }
            Header::TaskMgmtRequest(h) => h.exp_stat_sn = e,
            Header::LogoutRequest(h) => h.exp_stat_sn = e,
            Header::TextRequest(h) => h.exp_stat_sn = e,
            _ => {}
        }
        Some(pdu)
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// A read buffer nobody uses any more: a command's own buffer, after a Data-In that carried
    /// the whole read was handed to it instead (no copy). The driver's reader receives into it
    /// next, so the buffers go round without an allocation per command.
    pub fn take_spare_buffer(&mut self) -> Option<BytesMut> {
        self.spare.take()
    }

    /// Where a Data-In segment of `len` bytes at `offset` for task `itt` can be received in
    /// place (issue 27: a READ whose data comes in several Data-In PDUs): the free end of the
    /// command's own buffer, from `offset` on, as a `BytesMut` of its own. The driver receives
    /// at most `len` bytes into it and gives it back with the PDU
    /// ([`Connection::handle_placed_data_in`]), which joins it to the data before it without a
    /// copy. `None` (receive the segment as usual) unless the task is sent, reads, and
    /// `offset` is where its data goes on (§13.18: DataPDUInOrder=Yes) with room for `len`
    /// bytes. Nothing is changed for the task: what it received so far stays in its buffer,
    /// so a segment lent and never given back (the connection failed) loses nothing of it.
    pub fn lend_read_buffer(&mut self, itt: u32, offset: u32, len: usize) -> Option<BytesMut> {
        if self.closed.is_some() {
            return None;
        }
        let t = self.tasks.get_mut(&itt)?;
        if !matches!(t.phase, Phase::Sent(_)) || offset != t.received {
            return None;
        }
        let end = u64::from(offset) + len as u64;
        let buf = t.read.as_mut()?;
        if offset == 0 {
            bind_read_buffer(buf, &mut self.read_pool, t.read_len as usize);
        }
        if buf.len() != offset as usize
            || end > u64::from(t.read_len)
            || buf.capacity() - buf.len() < len
        {
            return None;
        }
        let at = buf.len();
        Some(buf.split_off(at))
    }

    /// A Data-In PDU whose segment the driver received into the buffer
    /// [`Connection::lend_read_buffer`] lent (`data`: the segment's bytes, at the front of
    /// it; `pdu.data` is empty). Checked and accounted as [`Connection::handle_pdu`] does any
    /// Data-In; the segment joins the command's data in place.
    pub fn handle_placed_data_in(&mut self, now: Instant, pdu: Pdu, data: BytesMut) {
        self.handle(now, pdu, Some(data));
    }

    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.closed.is_some() {
            return None;
        }
        let ping = match self.ping {
            Some((_, sent)) => Some(sent.max(self.last_rx) + self.nop_timeout),
            None => self.next_ping,
        };
        let tmf = self.tmfs.values().map(|(_, d)| *d).min();
        let command = self.deadlines.front().map(|(d, _)| *d);
        [ping, tmf, command].into_iter().flatten().min()
    }

    // ---- role methods ----

    /// A fresh ITT, for callers that bind data to it before submitting (Seal).
    pub fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.itt.next_tag();
            if !self.tasks.contains_key(&itt)
                && !self.tmfs.contains_key(&itt)
                && !self.reserved.contains(&itt)
                && self.ping.is_none_or(|(p, _)| p != itt)
                && self.logout != Some(itt)
            {
                return itt;
            }
        }
    }

    /// The ITT [`Connection::alloc_itt`] tries next.
    #[must_use]
    pub fn next_itt(&self) -> u32 {
        self.itt.peek()
    }

    /// Continue the ITT sequence at `next` (a session's next connection carries on where the
    /// last one stopped, so no ITT of the session comes back while a task may still hold it;
    /// RFC 7143 §11.2.1.8: unique within the session).
    pub fn set_next_itt(&mut self, next: u32) {
        self.itt = TagAllocator::starting_at(next);
    }

    /// Keeps `itt` from [`Connection::alloc_itt`] until a command is submitted under it: a
    /// session's task waiting to be sent again here keeps its ITT.
    pub fn reserve_itt(&mut self, itt: u32) {
        self.reserved.insert(itt);
    }

    /// Takes the session's CmdSN window, for a connection of a session of several (RFC 7143
    /// §4.2.2.1: one window for all of them; `engine::mcs`): the next CmdSN as the session
    /// numbers it, and ExpCmdSN and MaxCmdSN as any of its connections last heard them
    /// (neither moves back). Commands queued behind the window go if it opened.
    pub fn share_window(&mut self, cmd_sn: u32, exp_cmd_sn: u32, max_cmd_sn: u32) {
        self.cmd_sn = cmd_sn;
        self.update_window(exp_cmd_sn, max_cmd_sn);
        self.flush_queued();
    }

    /// The ITTs of the tasks on this connection (queued, sent, or abandoned awaiting
    /// cleanup), ascending: what ErrorRecoveryLevel 2 would reassign when it fails.
    #[must_use]
    pub fn task_itts(&self) -> Vec<u32> {
        let mut v: Vec<u32> = self.tasks.keys().copied().collect();
        v.sort_unstable();
        v
    }

    /// Takes task `itt` out of this connection with all it knows (Data-In received, R2Ts
    /// answered, its deadline), sending nothing and ending nothing: its allegiance is to move
    /// ([`Connection::adopt_task`]; RFC 7143 §7.2.2, TASK REASSIGN at ErrorRecoveryLevel 2).
    /// Data-Out queued for it here and not yet taken by the driver is dropped.
    pub fn take_task(&mut self, itt: u32) -> Option<MovedTask> {
        let task = self.tasks.remove(&itt)?;
        self.queued.retain(|i| *i != itt);
        self.out
            .retain(|p| !matches!(&p.header, Header::DataOut(d) if d.itt == itt));
        Some(MovedTask { itt, task })
    }

    /// Takes on a task from another connection of the session ([`Connection::take_task`]):
    /// its PDUs are this connection's from now on. A task that had not left yet waits for the
    /// window here. `Invalid` when its ITT is in use here.
    pub fn adopt_task(&mut self, moved: MovedTask) -> Result<u32, SubmitError> {
        if let Some(e) = self.closed {
            return Err(SubmitError::Closed(e));
        }
        let MovedTask { itt, mut task } = moved;
        if self.tasks.contains_key(&itt) || self.tmfs.contains_key(&itt) {
            return Err(SubmitError::Invalid);
        }
        self.reserved.remove(&itt);
        if let Some(d) = task.deadline {
            let at = self.deadlines.partition_point(|(x, _)| *x <= d);
            self.deadlines.insert(at, (d, itt));
        }
        // R2Ts it had not answered yet are the old connection's: ErrorRecoveryLevel 2 asks
        // for them again (a recovery R2T, §7.2.2).
        task.unsent_r2ts.clear();
        let queued = task.phase == Phase::Queued;
        self.tasks.insert(itt, task);
        if queued {
            self.queued.push_back(itt);
            self.flush_queued();
        }
        Ok(itt)
    }

    /// ErrorRecoveryLevel 2 (RFC 7143 §7.2): when this connection fails, its tasks are kept
    /// ([`Connection::take_held`]) for reassignment to another connection of the session,
    /// instead of ending with [`TaskError::ConnectionLost`]. A logout (reason 0 or 1, or the
    /// target's request) still ends them, as does a task moved [`MAX_REASSIGNS`] times.
    pub fn hold_tasks(&mut self, on: bool) {
        self.hold = on;
    }

    /// The tasks this connection kept when it failed ([`Connection::hold_tasks`]), in the
    /// order of their ITTs: each goes to another connection with [`Connection::reassign`].
    pub fn take_held(&mut self) -> Vec<MovedTask> {
        std::mem::take(&mut self.held)
    }

    /// Logout with reason 2, remove connection `cid` for recovery (RFC 7143 §11.14.1), sent
    /// on this connection for a failed other one: once answered ([`Event::RecoveryLogout`])
    /// the target holds that connection's tasks for TASK REASSIGN (§7.2.2 requires this, or
    /// the implicit logout of a login reinstating the CID, before a reassignment). Timed as a
    /// task management request. `None` when this connection is closed or logging out.
    pub fn logout_for_recovery(&mut self, now: Instant, cid: u16) -> Option<u32> {
        if self.closed.is_some() || self.logout.is_some() {
            return None;
        }
        let itt = self.alloc_itt();
        self.tmfs
            .insert(itt, (TmfKind::RecoveryLogout(cid), now + self.tmf_timeout));
        self.out.push_back(Pdu::new(
            LogoutRequest {
                immediate: true,
                reason: LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY,
                itt,
                cid,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
            },
            Bytes::new(),
        ));
        Some(itt)
    }

    /// Reassigns a task of a failed connection of the session to this one (ErrorRecoveryLevel
    /// 2, RFC 7143 §7.2.2, §11.5.1): it becomes this connection's ([`Connection::adopt_task`])
    /// and, if its command had left, a TASK REASSIGN names it with its CmdSN and, for a read,
    /// ExpDataSN = the Data-In it has (the target resends from there; the bytes received are
    /// kept). The answer ([`Event::Reassigned`]): Function complete, the task goes on here
    /// (recovery R2Ts for write data the target misses are answered from the write buffer);
    /// Task does not exist for a CmdSN the target never acknowledged, the command is sent
    /// again with its ITT and CmdSN (§6.2.1: it never arrived, or waited behind a gap on the
    /// failed connection and was dropped with it); anything else ends the task.
    pub fn reassign(&mut self, now: Instant, moved: MovedTask) -> Result<u32, SubmitError> {
        let itt = moved.itt;
        let sent = moved.cmd_sn();
        let (lun, exp_data_sn) = (moved.task.lun, moved.task.next_data_sn);
        self.adopt_task(moved)?;
        let Some(ref_cmd_sn) = sent else {
            // It had not left: it waits for the window here like any other.
            return Ok(itt);
        };
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.reassigned = true;
            t.reassigns = t.reassigns.saturating_add(1);
            // Recovery R2Ts ask again for what the target misses, wherever it was solicited.
            t.solicited.clear();
        }
        let tmf = self.alloc_itt();
        self.tmfs
            .insert(tmf, (TmfKind::Reassign(itt), now + self.tmf_timeout));
        self.out.push_back(Pdu::new(
            TaskMgmtRequest {
                immediate: true,
                function: TmfFunction::TASK_REASSIGN,
                lun,
                itt: tmf,
                referenced_task_tag: itt,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
                ref_cmd_sn,
                exp_data_sn,
            },
            Bytes::new(),
        ));
        Ok(itt)
    }

    /// Sends command `itt` again with its CmdSN, from the start (a retry, RFC 7143 §6.2.1):
    /// what it received is dropped, its data goes again.
    fn retry(&mut self, itt: u32, cmd_sn: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.received = 0;
        t.next_data_sn = 0;
        t.next_r2t_sn = 0;
        t.unsent_r2ts.clear();
        t.solicited.clear();
        t.reassigned = false;
        if let Some(buf) = t.read.as_mut() {
            buf.clear();
        }
        self.send_command(itt, cmd_sn);
    }

    /// Logout closing only this connection (reason 1, RFC 7143 §11.14), named by its `cid`:
    /// the session goes on over its others. As [`Connection::logout`] otherwise; a driver
    /// sends it once the connection's tasks are done (`engine::mcs` drains it first).
    pub fn logout_connection(&mut self, now: Instant, cid: u16) -> Option<u32> {
        self.logout_as(now, LogoutReason::CLOSE_CONNECTION, cid)
    }

    /// Submits a command; it leaves as soon as the window allows.
    pub fn submit(&mut self, now: Instant, cmd: Command) -> Result<u32, SubmitError> {
        let itt = self.alloc_itt();
        self.submit_as(now, itt, cmd)
    }

    /// Submits a command under an ITT from [`Connection::alloc_itt`].
    pub fn submit_as(&mut self, now: Instant, itt: u32, cmd: Command) -> Result<u32, SubmitError> {
        if let Some(e) = self.closed {
            return Err(SubmitError::Closed(e));
        }
        if self.logout_asked || self.logout.is_some() {
            return Err(SubmitError::LogoutRequested);
        }
        if itt == RESERVED_TAG || self.tasks.contains_key(&itt) {
            return Err(SubmitError::Invalid);
        }
        if !self.reserved.is_empty() {
            self.reserved.remove(&itt);
        }
        let write_bit = matches!(cmd.data, Data::Write(_));
        let (write, read, read_len) = match cmd.data {
            Data::None => (Bytes::new(), None, 0),
            Data::Write(b) => {
                if u32::try_from(b.len()).is_err() {
                    return Err(SubmitError::Invalid);
                }
                (b, None, 0)
            }
            Data::Read { mut buf, len } => {
                // Data-In arrives in order (DataPDUInOrder=Yes) and is appended: no memset of
                // the whole buffer ahead of the data, and nothing stale can leak. The buffer
                // joins the pool; the read takes one when its data arrives (issue 27).
                buf.clear();
                if buf.capacity() > 0 && self.read_pool.len() < READ_POOL_MAX {
                    self.read_pool.push(buf);
                }
                (Bytes::new(), Some(BytesMut::new()), len)
            }
        };
        let deadline = self
            .command_timeout
            .filter(|_| cmd.timed)
            .map(|limit| now + limit);
        if let Some(d) = deadline {
            self.deadlines.push_back((d, itt));
        }
        self.tasks.insert(
            itt,
            Task {
                lun: cmd.lun,
                cdb: cmd.cdb,
                write,
                write_bit,
                read,
                read_len,
                received: 0,
                next_data_sn: 0,
                next_r2t_sn: 0,
                unsent_r2ts: Vec::new(),
                solicited: Vec::new(),
                phase: Phase::Queued,
                deadline,
                timed_out: false,
                reassigned: false,
                reassigns: 0,
            },
        );
        self.queued.push_back(itt);
        self.flush_queued();
        Ok(itt)
    }

    /// ABORT TASK for `itt` (§11.5.1). A command still waiting for the window is withdrawn
    /// at once. Returns the TMF's ITT when a request went out.
    pub fn abort(&mut self, now: Instant, itt: u32) -> Option<u32> {
        let phase = &self.tasks.get(&itt)?.phase;
        match *phase {
            Phase::Queued => {
                self.queued.retain(|i| *i != itt);
                self.finish(itt, Err(TaskError::Aborted(AbortedBy::AbortTask)));
                None
            }
            Phase::Sent(cmd_sn) => Some(self.send_tmf(
                now,
                TmfFunction::ABORT_TASK,
                TmfKind::Abort(itt),
                itt,
                cmd_sn,
            )),
            Phase::Abandoned => None,
        }
    }

    /// LOGICAL UNIT RESET of `lun` (§11.5.1): on FUNCTION COMPLETE every task of ours on it
    /// that was sent ends with [`AbortedBy::LunReset`].
    pub fn lun_reset(&mut self, now: Instant, lun: u64) -> u32 {
        self.send_tmf(
            now,
            TmfFunction::LOGICAL_UNIT_RESET,
            TmfKind::LunReset {
                lun,
                at: self.cmd_sn,
                escalation: None,
            },
            RESERVED_TAG,
            0,
        )
    }

    /// Logout, closing the session (§11.14). Queued commands fail; the connection ends with
    /// the Logout Response.
    pub fn logout(&mut self, now: Instant) -> Option<u32> {
        self.logout_as(now, LogoutReason::CLOSE_SESSION, 0)
    }

    fn logout_as(&mut self, _now: Instant, reason: LogoutReason, cid: u16) -> Option<u32> {
        if self.closed.is_some() || self.logout.is_some() {
            return None;
        }
        let queued: Vec<u32> = self.queued.drain(..).collect();
        self.never_sent.extend(queued.iter().copied());
        for itt in queued {
            self.finish(
                itt,
                Err(TaskError::ConnectionLost(ConnectionError {
                    by: Side::Initiator,
                    reason: CloseReason::Logout,
                })),
            );
        }
        let itt = self.alloc_itt();
        self.logout = Some(itt);
        self.out.push_back(Pdu::new(
            LogoutRequest {
                immediate: true,
                reason,
                itt,
                cid,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
            },
            Bytes::new(),
        ));
        Some(itt)
    }

    /// Whether command `itt` ended with the connection (or a logout) before its command PDU
    /// left the engine — queued behind the CmdSN window (RFC 7143 §3.2.2.1) or not yet taken
    /// by the driver's framed write — so the target never saw it. Session recovery sends such
    /// a command on the new connection whatever it does; one that was sent is resent only if
    /// it is idempotent.
    #[must_use]
    pub fn never_sent(&self, itt: u32) -> bool {
        self.never_sent.contains(&itt)
    }

    /// The driver ends the connection (caller dropped the session, socket error): every task
    /// fails with `reason`.
    pub fn close(&mut self, by: Side, reason: CloseReason) {
        if self.closed.is_some() {
            return;
        }
        let e = ConnectionError { by, reason };
        self.closed = Some(e);
        // What the target cannot have seen: still queued behind the CmdSN window, or queued
        // for the driver's framed write and not taken yet.
        let unsent = self
            .queued
            .drain(..)
            .chain(self.out.iter().filter_map(|p| match &p.header {
                Header::ScsiCommand(c) => Some(c.itt),
                _ => None,
            }));
        self.never_sent.extend(unsent);
        // Nothing leaves a closed connection: what was queued is counted as never sent above
        // and must stay so.
        self.out.clear();
        self.pong_bytes = 0;
        let mut itts: Vec<u32> = self.tasks.keys().copied().collect();
        itts.sort_unstable();
        // ErrorRecoveryLevel 2: a failed connection's tasks wait for another connection
        // (RFC 7143 §7.2); a logout ends them (§11.14.1 reasons 0 and 1).
        let hold =
            self.hold && !matches!(reason, CloseReason::Logout | CloseReason::LogoutRequested);
        for itt in itts {
            let keep = hold
                && self
                    .tasks
                    .get(&itt)
                    .is_some_and(|t| t.phase != Phase::Abandoned && t.reassigns < MAX_REASSIGNS);
            if keep {
                if let Some(task) = self.tasks.remove(&itt) {
                    self.held.push(MovedTask { itt, task });
                }
            } else {
                self.finish(itt, Err(TaskError::ConnectionLost(e)));
            }
        }
        self.tmfs.clear();
        self.deadlines.clear();
        self.events.push_back(Event::Closed(e));
    }

    // ---- inputs ----

    pub fn handle_timeout(&mut self, now: Instant) {
        if self.closed.is_some() {
            return;
        }
        if self.tmfs.values().any(|(_, d)| now >= *d) {
            self.close(
                Side::Initiator,
                CloseReason::TaskManagementTimeout(self.tmf_timeout),
            );
            return;
        }
        self.prune_deadlines();
        while let Some(&(d, itt)) = self.deadlines.front() {
            if now < d {
                break;
            }
            self.deadlines.pop_front();
            self.time_out(now, itt);
            self.prune_deadlines();
        }
        match self.ping {
            Some((_, sent)) => {
                // Dead when neither the answer nor anything else came for nop_timeout: on a
                // slow lossy link the ping waits behind MiBs of data, and R2Ts, Data-In and
                // status keep proving the target alive.
                if now >= sent.max(self.last_rx) + self.nop_timeout {
                    self.close(Side::Initiator, CloseReason::PingTimeout(self.nop_timeout));
                }
            }
            None => {
                if let (Some(d), Some(i)) = (self.next_ping, self.nop_interval) {
                    if now >= d {
                        let itt = self.alloc_itt();
                        self.ping = Some((itt, now));
                        self.next_ping = Some(now + i);
                        self.out.push_back(Pdu::new(
                            NopOut {
                                immediate: true,
                                lun: 0,
                                itt,
                                ttt: RESERVED_TAG,
                                cmd_sn: self.cmd_sn,
                                exp_stat_sn: 0,
                            },
                            Bytes::new(),
                        ));
                    }
                }
            }
        }
    }

    /// The stream could not be decoded: the connection is over.
    pub fn handle_wire_error(&mut self, _now: Instant) {
        self.close(Side::Target, CloseReason::Framing);
    }

    /// The target closed the connection.
    pub fn peer_closed(&mut self) {
        self.close(Side::Target, CloseReason::PeerClosed);
    }

    pub fn handle_pdu(&mut self, now: Instant, pdu: Pdu) {
        self.handle(now, pdu, None);
    }

    fn handle(&mut self, now: Instant, pdu: Pdu, placed: Option<BytesMut>) {
        if self.closed.is_some() {
            return;
        }
        self.last_rx = now;
        let (win, stat) = match &pdu.header {
            Header::ScsiResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
            Header::DataIn(h) => (
                Some((h.exp_cmd_sn, h.max_cmd_sn)),
                h.status_present.then_some(h.stat_sn),
            ),
            Header::R2t(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), None),
            Header::NopIn(h) => (
                Some((h.exp_cmd_sn, h.max_cmd_sn)),
                (h.itt != RESERVED_TAG).then_some(h.stat_sn),
            ),
            Header::AsyncMessage(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
            Header::Reject(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
            Header::LogoutResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
            Header::TextResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
            Header::TaskMgmtResponse(h) => (Some((h.exp_cmd_sn, h.max_cmd_sn)), Some(h.stat_sn)),
            _ => (None, None),
        };
        if let Some(s) = stat {
            let next = s.wrapping_add(1);
            if sn_lt(self.exp_stat_sn, next) {
                self.exp_stat_sn = next;
            }
        }
        if let Some((e, m)) = win {
            self.update_window(e, m);
        }
        let Pdu { header, data, .. } = pdu;
        match header {
            Header::DataIn(h) => match placed {
                Some(p) => self.on_data_in(&h, Segment::Placed(p)),
                None => self.on_data_in(&h, Segment::Received(data)),
            },
            Header::ScsiResponse(h) => self.on_response(&h, &data),
            Header::R2t(h) => self.on_r2t(now, &h),
            Header::NopIn(h) => self.on_nop_in(&h, &data),
            Header::Reject(h) => self.on_reject(h.reason, &data),
            Header::TaskMgmtResponse(h) => self.on_tmf_response(now, h.itt, h.response),
            Header::LogoutResponse(h) => {
                if self.logout == Some(h.itt) {
                    let reason = if self.logout_asked {
                        CloseReason::LogoutRequested
                    } else {
                        CloseReason::Logout
                    };
                    self.close(Side::Initiator, reason);
                } else if let Some((TmfKind::RecoveryLogout(cid), _)) = self.tmfs.get(&h.itt) {
                    let cid = *cid;
                    self.tmfs.remove(&h.itt);
                    self.events.push_back(Event::RecoveryLogout {
                        cid,
                        response: h.response,
                    });
                } else {
                    self.violation(Violation::UnknownTask {
                        opcode: Opcode::LOGOUT_RESPONSE,
                        itt: h.itt,
                    });
                }
            }
            Header::AsyncMessage(h) => match h.async_event {
                1 if !self.logout_asked => {
                    self.logout_asked = true;
                    self.events.push_back(Event::LogoutRequested {
                        within_secs: h.parameter3,
                    });
                }
                2 | 3 => self.close(Side::Target, CloseReason::AsyncDrop(h.async_event)),
                _ => {}
            },
            other => self.violation(Violation::UnexpectedPdu(other.opcode())),
        }
        self.flush_queued();
        self.honor_logout_request();
    }

    // ---- internals ----

    /// Window update (§4.2.2.1): ignore a MaxCmdSN below ExpCmdSN - 1, never move back.
    fn update_window(&mut self, exp: u32, max: u32) {
        if sn_lt(max, exp.wrapping_sub(1)) {
            return;
        }
        if sn_lt(self.exp_cmd_sn, exp) {
            self.exp_cmd_sn = exp;
        }
        if sn_lt(self.max_cmd_sn, max) {
            self.max_cmd_sn = max;
        }
    }

    /// A violation that leaves the connection unusable.
    fn violation(&mut self, v: Violation) {
        self.close(Side::Initiator, CloseReason::Violation(v));
    }

    fn finish(&mut self, itt: u32, result: Result<Completion, TaskError>) {
        if let Some(t) = self.tasks.remove(&itt) {
            if t.phase != Phase::Abandoned {
                self.events.push_back(Event::Completed { itt, result });
            }
            if t.deadline.is_some() {
                self.prune_deadlines();
            }
        }
    }

    /// Drops stale entries (their task ended) from the front of `deadlines`, so
    /// [`Connection::poll_timeout`] names a live command's deadline. Completions in
    /// submission order (depth 1, or a FIFO target) find their own entry at the front: O(1).
    fn prune_deadlines(&mut self) {
        while let Some(&(d, itt)) = self.deadlines.front() {
            if self.tasks.get(&itt).is_some_and(|t| t.deadline == Some(d)) {
                return;
            }
            self.deadlines.pop_front();
        }
    }

    /// Command `itt` passed its deadline: the first step of the escalation (see
    /// [`Config::command_timeout`]).
    fn time_out(&mut self, now: Instant, itt: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.deadline = None;
        t.timed_out = true;
        let after = self.command_timeout.unwrap_or_default();
        match t.phase {
            Phase::Queued => {
                // Still waiting for the window: withdrawn, the target never saw it.
                self.queued.retain(|i| *i != itt);
                self.finish(itt, Err(TaskError::TimedOut { after, by: None }));
            }
            Phase::Sent(cmd_sn) => {
                // Until the answer the task stays, so its Data-In, R2Ts or status are still
                // handled in order; a status that arrives first is the command's result.
                self.events.push_back(Event::TimeoutStep {
                    itt,
                    step: TimeoutStep::AbortTask,
                });
                self.send_tmf(
                    now,
                    TmfFunction::ABORT_TASK,
                    TmfKind::TimeoutAbort(itt),
                    itt,
                    cmd_sn,
                );
            }
            Phase::Abandoned => {}
        }
    }

    /// A rule broken for one task: it ends with the violation, and ABORT TASK cleans up.
    fn abandon(&mut self, now: Instant, itt: u32, v: Violation) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        let Phase::Sent(cmd_sn) = t.phase else {
            return;
        };
        t.phase = Phase::Abandoned;
        t.read = None;
        t.deadline = None;
        self.events.push_back(Event::Completed {
            itt,
            result: Err(TaskError::Violation(v)),
        });
        self.send_tmf(
            now,
            TmfFunction::ABORT_TASK,
            TmfKind::Cleanup(itt),
            itt,
            cmd_sn,
        );
    }

    fn send_tmf(
        &mut self,
        now: Instant,
        function: TmfFunction,
        kind: TmfKind,
        rtt: u32,
        ref_cmd_sn: u32,
    ) -> u32 {
        let itt = self.alloc_itt();
        let lun = match kind {
            TmfKind::Abort(t)
            | TmfKind::Cleanup(t)
            | TmfKind::TimeoutAbort(t)
            | TmfKind::Reassign(t) => self.tasks.get(&t).map_or(0, |t| t.lun),
            TmfKind::LunReset { lun, .. } => lun,
            TmfKind::RecoveryLogout(_) => 0,
        };
        self.tmfs.insert(itt, (kind, now + self.tmf_timeout));
        self.out.push_back(Pdu::new(
            TaskMgmtRequest {
                immediate: true,
                function,
                lun,
                itt,
                referenced_task_tag: rtt,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
                ref_cmd_sn,
                exp_data_sn: 0,
            },
            Bytes::new(),
        ));
        itt
    }

    /// Sends queued commands while the window is open.
    fn flush_queued(&mut self) {
        while self.closed.is_none() && sn_le(self.cmd_sn, self.max_cmd_sn) {
            let Some(itt) = self.queued.pop_front() else {
                return;
            };
            let cmd_sn = self.cmd_sn;
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
            self.send_command(itt, cmd_sn);
        }
    }

    /// The command PDU with its immediate data, then unsolicited Data-Out (§4.2.5.1).
    fn send_command(&mut self, itt: u32, cmd_sn: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.phase = Phase::Sent(cmd_sn);
        let p = &self.params;
        let seg = p.target_max_recv_data_segment_length.max(512) as usize;
        let first_burst = p.first_burst_length as usize;
        let total = t.write.len();
        let imm = if p.immediate_data {
            total.min(first_burst).min(seg)
        } else {
            0
        };
        let unsolicited_end = if p.initial_r2t {
            imm
        } else {
            total.min(first_burst)
        };
        let edtl = u32::try_from(total).unwrap_or(u32::MAX).max(t.read_len);
        t.solicited.push((0, unsolicited_end as u32));
        self.out.push_back(Pdu::new(
            ScsiCommand {
                immediate: false,
                final_: unsolicited_end == imm,
                // The R and W bits say what the caller asked for, even for 0 bytes (§11.3.1).
                read: t.read.is_some(),
                write: t.write_bit,
                attr: TaskAttr::SIMPLE,
                lun: t.lun,
                itt,
                expected_data_transfer_length: edtl,
                cmd_sn,
                exp_stat_sn: 0,
                cdb: t.cdb,
            },
            t.write.slice(..imm),
        ));
        let mut off = imm;
        let mut data_sn = 0u32;
        while off < unsolicited_end {
            let end = (off + seg).min(unsolicited_end);
            self.out.push_back(Pdu::new(
                DataOut {
                    final_: end == unsolicited_end,
                    lun: t.lun,
                    itt,
                    ttt: RESERVED_TAG,
                    exp_stat_sn: 0,
                    data_sn,
                    buffer_offset: off as u32,
                },
                t.write.slice(off..end),
            ));
            data_sn = data_sn.wrapping_add(1);
            off = end;
        }
    }

    /// The task named by a target PDU: `None` (and the PDU dropped) for an abandoned task;
    /// an unknown ITT ends the connection (it never existed, or the target's state is lost).
    fn live_task(&mut self, opcode: Opcode, itt: u32) -> Option<&mut Task> {
        match self.tasks.get(&itt).map(|t| &t.phase) {
            Some(Phase::Sent(_)) => self.tasks.get_mut(&itt),
            Some(Phase::Abandoned) => None,
            _ => {
                self.violation(Violation::UnknownTask { opcode, itt });
                None
            }
        }
    }

    fn on_data_in(&mut self, h: &DataIn, data: Segment) {
        let now_itt = h.itt;
        // Out of `self` while the task is borrowed (`bind_read_buffer`); put back below.
        let mut pool = std::mem::take(&mut self.read_pool);
        let Some(t) = self.live_task(Opcode::SCSI_DATA_IN, now_itt) else {
            self.read_pool = pool;
            return;
        };
        let off = h.buffer_offset;
        let len = data.len() as u64;
        let check = if t.read.is_none() {
            Err(Violation::DataInWithoutRead)
        } else if off != t.received {
            // DataPDUInOrder=Yes, DataSequenceInOrder=Yes (§13.18, §13.19).
            Err(Violation::DataInOffset {
                expected: t.received,
                got: off,
            })
        } else if u64::from(off) + len > u64::from(t.read_len) {
            Err(Violation::DataInPastEnd {
                end: u64::from(off) + len,
                len: t.read_len,
            })
        } else if h.data_sn != t.next_data_sn {
            Err(Violation::DataInSn {
                expected: t.next_data_sn,
                got: h.data_sn,
            })
        } else {
            Ok(())
        };
        if let Err(v) = check {
            // At ErrorRecoveryLevel 0 a Data-In sequence cannot be repaired (no SNACK,
            // §7.1.4): the connection ends, and every task with it.
            self.read_pool = pool;
            self.violation(v);
            return;
        }
        let n = data.len() as u32;
        let mut spare = None;
        let data = match data {
            Segment::Received(data) => data,
            Segment::Placed(tail) => {
                // Received into the free end of this buffer (`lend_read_buffer`): joined
                // without a copy (`unsplit` copies only if it is not that memory).
                if let Some(buf) = t.read.as_mut() {
                    buf.unsplit(tail);
                }
                Bytes::new()
            }
        };
        if data.is_empty() {
            // Placed above (or an empty segment): nothing to copy.
        } else if off == 0 && n == t.read_len && n > 0 {
            // The whole read in one PDU: its segment becomes the caller's data, no copy, when
            // nothing else holds the receive buffer it sits in (the driver's reader leaves it
            // so, `ipsan_transport::FrameReader::hand_over`); the caller's buffer then goes
            // back to the reader (`take_spare_buffer`). Otherwise it is copied (issue 27).
            // A buffer from the pool goes back to the reader instead of the task's unbound one.
            match data.try_into_mut() {
                Ok(whole) => {
                    spare = t
                        .read
                        .replace(whole)
                        .filter(|b| b.capacity() > 0)
                        .or_else(|| pool.pop());
                }
                Err(data) => {
                    if let Some(buf) = t.read.as_mut() {
                        bind_read_buffer(buf, &mut pool, t.read_len as usize);
                        buf.extend_from_slice(&data);
                    }
                }
            }
        } else if let Some(buf) = t.read.as_mut() {
            // `off == received == buf.len()`, checked above.
            if off == 0 {
                bind_read_buffer(buf, &mut pool, t.read_len as usize);
            }
            buf.extend_from_slice(&data);
        }
        t.received += n;
        t.next_data_sn = t.next_data_sn.wrapping_add(1);
        self.read_pool = pool;
        if spare.is_some() {
            self.spare = spare;
        }
        if h.status_present {
            let residual = residual_of(h.underflow, h.overflow, h.residual_count);
            self.status(now_itt, h.status, None, residual);
        }
    }

    fn on_response(&mut self, h: &ScsiResponse, data: &Bytes) {
        if self.live_task(Opcode::SCSI_RESPONSE, h.itt).is_none() {
            // Status for an abandoned task: its cleanup is moot, forget it.
            if self
                .tasks
                .get(&h.itt)
                .is_some_and(|t| t.phase == Phase::Abandoned)
            {
                self.tasks.remove(&h.itt);
            }
            return;
        }
        if h.response != 0 {
            self.finish(h.itt, Err(TaskError::IscsiResponse(h.response)));
            return;
        }
        // Sense data: 2-byte SenseLength, then the sense bytes (§11.4.7.2).
        let sense = (data.len() >= 2).then(|| {
            let sl = usize::from(u16::from_be_bytes([data[0], data[1]]));
            data.slice(2..(2 + sl).min(data.len()))
        });
        let sense = sense.filter(|s| !s.is_empty());
        let residual = residual_of(h.underflow, h.overflow, h.residual_count);
        self.status(h.itt, h.status, sense, residual);
    }

    fn status(&mut self, itt: u32, status: u8, sense: Option<Bytes>, residual: i64) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        // The data is what arrived, cut to what the target says it sent (underflow).
        let mut data = t.read.take().unwrap_or_default();
        let expected = if residual > 0 {
            (t.read_len as usize).saturating_sub(residual as usize)
        } else {
            t.read_len as usize
        };
        data.truncate(expected);
        let good = status == 0x00 || status == 0x04;
        let result = if good && (t.received as usize) < expected {
            // GOOD with fewer bytes than promised: the caller would get less than the
            // target says it sent.
            Err(TaskError::Violation(Violation::ShortRead {
                received: t.received,
                expected: expected as u32,
            }))
        } else {
            Ok(Completion {
                status,
                sense,
                data,
                residual,
            })
        };
        self.finish(itt, result);
    }

    /// Checks an R2T against RFC 7143 §11.8 and the negotiated limits, then answers it with
    /// Data-Out PDUs of at most the target's MaxRecvDataSegmentLength (slices of the write
    /// buffer, no copy).
    fn on_r2t(&mut self, now: Instant, h: &R2t) {
        let max_burst = self.params.max_burst_length;
        let max_outstanding = self.params.max_outstanding_r2t.max(1);
        let seg = self.params.target_max_recv_data_segment_length.max(512);
        let Some(t) = self.live_task(Opcode::R2T, h.itt) else {
            return;
        };
        let (off, len) = (h.buffer_offset, h.desired_data_transfer_length);
        let total = u32::try_from(t.write.len()).unwrap_or(u32::MAX);
        let end = u64::from(off) + u64::from(len);
        let check = if t.write.is_empty() {
            Err(Violation::R2tWithoutWrite)
        } else if h.ttt == RESERVED_TAG {
            Err(Violation::R2tReservedTag)
        } else if len == 0 || end > u64::from(total) {
            Err(Violation::R2tOutsideWrite {
                offset: off,
                len,
                total,
            })
        } else if len > max_burst {
            Err(Violation::R2tOverBurst {
                len,
                max: max_burst,
            })
        } else if if t.reassigned {
            // Recovery R2Ts number on from the last R2T the target sent, which may have been
            // lost with the failed connection (RFC 7143 §7.2.2): only never backwards.
            sn_lt(h.r2t_sn, t.next_r2t_sn)
        } else {
            h.r2t_sn != t.next_r2t_sn
        } {
            Err(Violation::R2tSn {
                expected: t.next_r2t_sn,
                got: h.r2t_sn,
            })
        } else if t.unsent_r2ts.iter().any(|(ttt, _)| *ttt == h.ttt) {
            Err(Violation::R2tDuplicateTag { ttt: h.ttt })
        } else if t.unsent_r2ts.len() as u32 >= max_outstanding {
            // The target cannot have seen the data of these yet: it has more than
            // MaxOutstandingR2T outstanding (§13.17).
            Err(Violation::R2tOutstanding {
                max: max_outstanding,
            })
        } else if t
            .solicited
            .iter()
            .any(|&(o, l)| off < o.saturating_add(l) && o < off.saturating_add(len))
        {
            Err(Violation::R2tOverlap { offset: off, len })
        } else {
            Ok(())
        };
        if let Err(v) = check {
            self.abandon(now, h.itt, v);
            return;
        }
        t.next_r2t_sn = h.r2t_sn.wrapping_add(1);
        t.solicited.push((off, len));
        let pdus = len.div_ceil(seg);
        t.unsent_r2ts.push((h.ttt, pdus));
        let (lun, write) = (t.lun, t.write.clone());
        let mut pos = off;
        let mut data_sn = 0u32;
        let stop = off + len;
        while pos < stop {
            let e = (pos + seg).min(stop);
            self.out.push_back(Pdu::new(
                DataOut {
                    final_: e == stop,
                    lun,
                    itt: h.itt,
                    ttt: h.ttt,
                    exp_stat_sn: 0,
                    data_sn,
                    buffer_offset: pos,
                },
                write.slice(pos as usize..e as usize),
            ));
            data_sn = data_sn.wrapping_add(1);
            pos = e;
        }
    }

    /// The last Data-Out answering `ttt` left: that R2T is no longer ours to answer.
    fn r2t_answered(&mut self, itt: u32, ttt: u32) {
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.unsent_r2ts.retain(|(x, _)| *x != ttt);
        }
    }

    fn on_nop_in(&mut self, h: &NopIn, data: &Bytes) {
        if h.itt != RESERVED_TAG {
            if self.ping.is_some_and(|(itt, _)| itt == h.itt) {
                self.ping = None;
            }
            return;
        }
        if h.ttt == RESERVED_TAG {
            return;
        }
        let cost = BHS_LEN + data.len();
        self.pong_bytes += cost;
        if self.pong_bytes > self.max_pong_bytes {
            let queued = self.pong_bytes;
            self.violation(Violation::PingFlood { queued });
            return;
        }
        // The target pings us: answer with its TTT and data (§11.18). The data is copied so
        // a queued answer does not pin the receive buffer.
        self.out.push_back(Pdu::new(
            NopOut {
                immediate: true,
                lun: h.lun,
                itt: RESERVED_TAG,
                ttt: h.ttt,
                cmd_sn: self.cmd_sn,
                exp_stat_sn: 0,
            },
            Bytes::copy_from_slice(data),
        ));
    }

    fn on_reject(&mut self, reason: RejectReason, data: &Bytes) {
        // The data segment holds the rejected header: its opcode and ITT name the task.
        let opcode = Opcode(data.first().copied().unwrap_or(0xff) & 0x3f);
        let itt = data
            .get(16..20)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]));
        match (opcode, itt) {
            (Opcode::SCSI_COMMAND, Some(itt)) if self.tasks.contains_key(&itt) => {
                // A rejected command never became a task at the target.
                self.finish(itt, Err(TaskError::Rejected(reason)));
            }
            // A rejected Data-Out: the target ends the command with CHECK CONDITION (ERL 0),
            // the status still comes.
            _ => self.events.push_back(Event::Rejected { reason, opcode }),
        }
    }

    fn on_tmf_response(&mut self, now: Instant, itt: u32, response: TmfResponse) {
        let kind = match self.tmfs.remove(&itt) {
            Some((TmfKind::RecoveryLogout(_), _)) | None => {
                self.violation(Violation::UnknownTask {
                    opcode: Opcode::TASK_MGMT_RESPONSE,
                    itt,
                });
                return;
            }
            Some((kind, _)) => kind,
        };
        let ends = matches!(
            response,
            TmfResponse::FUNCTION_COMPLETE | TmfResponse::TASK_DOES_NOT_EXIST
        );
        match kind {
            TmfKind::Abort(task) => {
                if ends {
                    // Nothing more comes for it (§11.6.1).
                    self.finish(task, Err(TaskError::Aborted(AbortedBy::AbortTask)));
                }
                self.events
                    .push_back(Event::TaskManagement { itt, response });
            }
            TmfKind::Cleanup(task) => {
                if ends {
                    self.tasks.remove(&task);
                }
            }
            TmfKind::Reassign(task) => self.on_reassigned(task, response),
            TmfKind::RecoveryLogout(_) => {}
            TmfKind::TimeoutAbort(task) => {
                // Gone already: its own status came first and is its result.
                let Some(t) = self.tasks.get(&task) else {
                    return;
                };
                let lun = t.lun;
                if ends {
                    let after = self.command_timeout.unwrap_or_default();
                    self.finish(
                        task,
                        Err(TaskError::TimedOut {
                            after,
                            by: Some(AbortedBy::AbortTask),
                        }),
                    );
                    return;
                }
                // Refused (§11.6.1): escalate as SCSI error handling does (SAM-5 §7); a LUN
                // reset ends every task on the LUN, this one included.
                self.events.push_back(Event::TimeoutStep {
                    itt: task,
                    step: TimeoutStep::LunReset {
                        abort_response: response,
                    },
                });
                self.send_tmf(
                    now,
                    TmfFunction::LOGICAL_UNIT_RESET,
                    TmfKind::LunReset {
                        lun,
                        at: self.cmd_sn,
                        escalation: Some((task, response)),
                    },
                    RESERVED_TAG,
                    0,
                );
            }
            TmfKind::LunReset {
                lun,
                at,
                escalation,
            } => {
                if response == TmfResponse::FUNCTION_COMPLETE {
                    let mut hit: Vec<u32> = self
                        .tasks
                        .iter()
                        .filter(|(_, t)| {
                            t.lun == lun && matches!(t.phase, Phase::Sent(sn) if sn_lt(sn, at))
                        })
                        .map(|(i, _)| *i)
                        .collect();
                    hit.sort_unstable();
                    let after = self.command_timeout.unwrap_or_default();
                    for t in hit {
                        let e = if self.tasks.get(&t).is_some_and(|t| t.timed_out) {
                            TaskError::TimedOut {
                                after,
                                by: Some(AbortedBy::LunReset),
                            }
                        } else {
                            TaskError::Aborted(AbortedBy::LunReset)
                        };
                        self.finish(t, Err(e));
                    }
                }
                match escalation {
                    None => self
                        .events
                        .push_back(Event::TaskManagement { itt, response }),
                    // Neither abort nor reset: nothing on this connection can be trusted.
                    Some((task, abort)) if self.tasks.contains_key(&task) => self.close(
                        Side::Initiator,
                        CloseReason::AbortRefused {
                            abort,
                            reset: response,
                        },
                    ),
                    Some(_) => {}
                }
            }
        }
    }

    /// The answer to the TASK REASSIGN of `task` ([`Connection::reassign`]).
    fn on_reassigned(&mut self, task: u32, response: TmfResponse) {
        let Some(sent) = self.tasks.get(&task).map(|t| match t.phase {
            Phase::Sent(sn) => Some(sn),
            _ => None,
        }) else {
            // Its status came first: it is over.
            return;
        };
        let outcome = match (response, sent) {
            (TmfResponse::FUNCTION_COMPLETE, _) => Reassignment::Adopted,
            // Never acknowledged (ExpCmdSN is not past it): the target never had it to run.
            (TmfResponse::TASK_DOES_NOT_EXIST, Some(sn)) if sn_le(self.exp_cmd_sn, sn) => {
                self.retry(task, sn);
                Reassignment::Retried
            }
            (other, _) => Reassignment::Refused(other),
        };
        if let Reassignment::Refused(r) = outcome {
            self.finish(
                task,
                Err(TaskError::ConnectionLost(ConnectionError {
                    by: Side::Target,
                    reason: CloseReason::ReassignRefused(r),
                })),
            );
        }
        self.events
            .push_back(Event::Reassigned { itt: task, outcome });
    }

    /// After AsyncEvent 1: the Logout goes once no command is in flight.
    fn honor_logout_request(&mut self) {
        if self.logout_asked
            && self.logout.is_none()
            && self.closed.is_none()
            && self.tasks.is_empty()
        {
            let itt = self.alloc_itt();
            self.logout = Some(itt);
            self.out.push_back(Pdu::new(
                LogoutRequest {
                    immediate: true,
                    reason: LogoutReason::CLOSE_SESSION,
                    itt,
                    cid: 0,
                    cmd_sn: self.cmd_sn,
                    exp_stat_sn: 0,
                },
                Bytes::new(),
            ));
        }
    }
}

fn residual_of(underflow: bool, overflow: bool, count: u32) -> i64 {
    if underflow {
        i64::from(count)
    } else if overflow {
        -i64::from(count)
    } else {
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use iscsi_wire::header::TaskMgmtResponse;

    fn params() -> SessionParams {
        SessionParams {
            initial_r2t: true,
            immediate_data: false,
            max_burst_length: 4096,
            first_burst_length: 4096,
            max_outstanding_r2t: 1,
            target_max_recv_data_segment_length: 4096,
            ..SessionParams::default()
        }
    }

    fn conn() -> (Connection, Instant) {
        let now = Instant::now();
        let mut cfg = Config::new(params(), 1, 16, 1);
        cfg.nop_interval = None;
        (Connection::new(cfg, now), now)
    }

    fn write(c: &mut Connection, now: Instant, len: usize) -> u32 {
        let itt = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0x8a; 16],
                    data: Data::Write(Bytes::from(vec![7u8; len])),
                    timed: false,
                },
            )
            .unwrap();
        while c.poll_transmit().is_some() {}
        itt
    }

    fn r2t(itt: u32, ttt: u32, r2t_sn: u32, off: u32, len: u32) -> Pdu {
        Pdu::new(
            R2t {
                lun: 0,
                itt,
                ttt,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 16,
                r2t_sn,
                buffer_offset: off,
                desired_data_transfer_length: len,
            },
            Bytes::new(),
        )
    }

    fn violation(c: &mut Connection) -> Option<Violation> {
        while let Some(e) = c.poll_event() {
            if let Event::Completed {
                result: Err(TaskError::Violation(v)),
                ..
            } = e
            {
                return Some(v);
            }
        }
        None
    }

    /// A READ submitted with `buf`, and a Data-In answering all of it with status.
    fn read_answered(c: &mut Connection, now: Instant, buf: BytesMut, data: Bytes) -> Completion {
        let itt = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0x88; 16],
                    data: Data::Read {
                        buf,
                        len: data.len() as u32,
                    },
                    timed: false,
                },
            )
            .unwrap();
        while c.poll_transmit().is_some() {}
        let h = DataIn {
            final_: true,
            status_present: true,
            itt,
            ttt: RESERVED_TAG,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 16,
            ..DataIn::default()
        };
        c.handle_pdu(now, Pdu::new(h, data));
        loop {
            match c.poll_event() {
                Some(Event::Completed { result, .. }) => return result.unwrap(),
                Some(_) => {}
                None => panic!("no completion"),
            }
        }
    }

    /// Issue 27: a Data-In carrying a whole READ in a buffer nothing else holds becomes the
    /// command's data (the same memory, no copy) and the caller's buffer is handed back for
    /// the reader to receive into; a segment that shares its buffer is copied into the
    /// caller's buffer, and nothing is handed back.
    #[test]
    fn accepts_a_whole_read_in_one_data_in_without_copying_it() {
        let (mut c, now) = conn();
        let mine = BytesMut::with_capacity(8192);
        let mine_at = mine.as_ptr();
        let data = Bytes::from(vec![5u8; 8192]);
        let at = data.as_ptr();
        let done = read_answered(&mut c, now, mine, data);
        assert_eq!(&done.data[..], &[5u8; 8192][..]);
        assert_eq!(done.data.as_ptr(), at, "the Data-In segment was copied");
        let back = c
            .take_spare_buffer()
            .expect("the caller's buffer comes back");
        assert_eq!(back.as_ptr(), mine_at);
        assert!(c.take_spare_buffer().is_none());

        let shared = Bytes::from(vec![6u8; 8192]);
        let keep = shared.clone();
        let done = read_answered(&mut c, now, back, shared);
        assert_eq!(&done.data[..], &keep[..]);
        assert_eq!(
            done.data.as_ptr(),
            mine_at,
            "copied into the caller's own buffer"
        );
        assert!(c.take_spare_buffer().is_none());
    }

    /// Issue 27: a READ whose data comes in several Data-In PDUs, each segment received in
    /// place into the free end of the command's own buffer (`lend_read_buffer`): the data is
    /// the caller's buffer, every byte where it belongs, and no segment was copied (each lent
    /// piece is the memory right after the data before it). A lend for a Data-In that is not
    /// the next one in order is refused, and what was lent and never given back (the
    /// connection failed mid-segment) takes nothing from the data received before it.
    #[test]
    fn accepts_a_split_read_received_in_place_without_copying_it() {
        let (mut c, now) = conn();
        let mine = BytesMut::with_capacity(3 * 4096);
        let mine_at = mine.as_ptr();
        let itt = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0x88; 16],
                    data: Data::Read {
                        buf: mine,
                        len: 3 * 4096,
                    },
                    timed: false,
                },
            )
            .unwrap();
        while c.poll_transmit().is_some() {}
        let data_in = |n: u32, last: bool| DataIn {
            final_: last,
            status_present: last,
            itt,
            ttt: RESERVED_TAG,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 16,
            data_sn: n,
            buffer_offset: n * 4096,
            ..DataIn::default()
        };
        assert!(
            c.lend_read_buffer(itt, 4096, 4096).is_none(),
            "offset 4096 before offset 0"
        );
        assert!(
            c.lend_read_buffer(itt, 0, 4 * 4096).is_none(),
            "past the read's end"
        );
        for n in 0..3u32 {
            let mut piece = c.lend_read_buffer(itt, n * 4096, 4096).unwrap();
            assert_eq!(
                piece.as_ptr(),
                mine_at.wrapping_add(n as usize * 4096),
                "lent right after the data so far"
            );
            piece.extend_from_slice(&[n as u8 + 1; 4096]);
            c.handle_placed_data_in(now, Pdu::new(data_in(n, n == 2), Bytes::new()), piece);
        }
        let done = loop {
            match c.poll_event() {
                Some(Event::Completed { result, .. }) => break result.unwrap(),
                Some(_) => {}
                None => panic!("no completion"),
            }
        };
        assert_eq!(done.data.as_ptr(), mine_at, "the caller's own buffer");
        let want: Vec<u8> = (1..=3u8).flat_map(|b| [b; 4096]).collect();
        assert_eq!(&done.data[..], &want[..]);

        // Lent and never given back (the connection failed while the segment came in):
        // the data before it stays the task's, and the segment received as usual follows it.
        let itt = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0x88; 16],
                    data: Data::Read {
                        buf: BytesMut::new(),
                        len: 2 * 4096,
                    },
                    timed: false,
                },
            )
            .unwrap();
        while c.poll_transmit().is_some() {}
        let data_in = |n: u32| DataIn {
            final_: n == 1,
            status_present: n == 1,
            itt,
            ttt: RESERVED_TAG,
            stat_sn: 2,
            exp_cmd_sn: 3,
            max_cmd_sn: 17,
            data_sn: n,
            buffer_offset: n * 4096,
            ..DataIn::default()
        };
        let mut piece = c.lend_read_buffer(itt, 0, 4096).unwrap();
        piece.extend_from_slice(&[7u8; 4096]);
        c.handle_placed_data_in(now, Pdu::new(data_in(0), Bytes::new()), piece);
        drop(c.lend_read_buffer(itt, 4096, 4096).unwrap());
        c.handle_pdu(now, Pdu::new(data_in(1), Bytes::from(vec![8u8; 4096])));
        let done = loop {
            match c.poll_event() {
                Some(Event::Completed { result, .. }) => break result.unwrap(),
                Some(_) => {}
                None => panic!("no completion"),
            }
        };
        let want: Vec<u8> = [[7u8; 4096], [8u8; 4096]].concat();
        assert_eq!(&done.data[..], &want[..]);
    }

    #[test]
    fn answers_an_r2t_with_data_out_slices() {
        let (mut c, now) = conn();
        let itt = write(&mut c, now, 8192);
        c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
        let p = c.poll_transmit().unwrap();
        let Header::DataOut(d) = p.header else {
            panic!()
        };
        assert_eq!(
            (d.ttt, d.buffer_offset, d.final_, p.data.len()),
            (5, 0, true, 4096)
        );
        assert!(c.closed().is_none());
    }

    #[test]
    fn rejects_r2t_beyond_max_outstanding_r2t_while_the_first_is_unanswered() {
        let (mut c, now) = conn();
        let itt = write(&mut c, now, 8192);
        c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
        // The first R2T's Data-Out has not left yet: a second one breaks MaxOutstandingR2T=1.
        c.handle_pdu(now, r2t(itt, 6, 1, 4096, 4096));
        assert_eq!(
            violation(&mut c),
            Some(Violation::R2tOutstanding { max: 1 })
        );
        assert!(
            c.closed().is_none(),
            "the task ends, the connection goes on"
        );
        let mut abort = false;
        while let Some(p) = c.poll_transmit() {
            abort |= matches!(p.header, Header::TaskMgmtRequest(ref t) if t.function == TmfFunction::ABORT_TASK && t.referenced_task_tag == itt);
        }
        assert!(abort, "ABORT TASK cleans up the target's side");
    }

    #[test]
    fn rejects_r2t_with_a_wrong_r2tsn() {
        let (mut c, now) = conn();
        let itt = write(&mut c, now, 8192);
        c.handle_pdu(now, r2t(itt, 5, 1, 0, 4096));
        assert_eq!(
            violation(&mut c),
            Some(Violation::R2tSn {
                expected: 0,
                got: 1
            })
        );
    }

    #[test]
    fn rejects_r2t_reusing_an_outstanding_ttt() {
        let (mut c, now) = conn();
        c.params.max_outstanding_r2t = 4;
        let itt = write(&mut c, now, 8192);
        c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
        c.handle_pdu(now, r2t(itt, 5, 1, 4096, 4096));
        assert_eq!(
            violation(&mut c),
            Some(Violation::R2tDuplicateTag { ttt: 5 })
        );
    }

    #[test]
    fn rejects_r2t_asking_for_the_same_bytes_twice_and_the_reserved_ttt() {
        let (mut c, now) = conn();
        let itt = write(&mut c, now, 8192);
        c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
        while c.poll_transmit().is_some() {}
        c.handle_pdu(now, r2t(itt, 6, 1, 2048, 4096));
        assert_eq!(
            violation(&mut c),
            Some(Violation::R2tOverlap {
                offset: 2048,
                len: 4096
            })
        );
        let itt = write(&mut c, now, 4096);
        c.handle_pdu(now, r2t(itt, RESERVED_TAG, 0, 0, 4096));
        assert_eq!(violation(&mut c), Some(Violation::R2tReservedTag));
    }

    #[test]
    fn unknown_itt_ends_the_connection_and_fails_every_task_once() {
        let (mut c, now) = conn();
        let a = write(&mut c, now, 4096);
        c.handle_pdu(now, r2t(999, 5, 0, 0, 4096));
        assert!(c.closed().is_some());
        let mut done = Vec::new();
        while let Some(e) = c.poll_event() {
            if let Event::Completed { itt, result } = e {
                assert!(matches!(result, Err(TaskError::ConnectionLost(_))));
                done.push(itt);
            }
        }
        assert_eq!(done, vec![a]);
        assert_eq!(c.tasks_in_flight(), 0);
    }

    #[test]
    fn holds_commands_until_the_window_opens() {
        let now = Instant::now();
        let mut cfg = Config::new(params(), 1, 1, 1);
        cfg.nop_interval = None;
        let mut c = Connection::new(cfg, now);
        let a = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0; 16],
                    data: Data::None,
                    timed: false,
                },
            )
            .unwrap();
        let b = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0; 16],
                    data: Data::None,
                    timed: false,
                },
            )
            .unwrap();
        let sent: Vec<u32> = std::iter::from_fn(|| c.poll_transmit())
            .map(|p| p.header.itt())
            .collect();
        assert_eq!(sent, vec![a], "MaxCmdSN 1 admits one");
        let resp = ScsiResponse {
            itt: a,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 2,
            ..ScsiResponse::default()
        };
        c.handle_pdu(now, Pdu::new(resp, Bytes::new()));
        let sent: Vec<u32> = std::iter::from_fn(|| c.poll_transmit())
            .map(|p| p.header.itt())
            .collect();
        assert_eq!(sent, vec![b]);
        assert_eq!(c.sequence().3, 2, "ExpStatSN advanced");
    }

    #[test]
    fn tells_which_commands_never_left_the_engine_when_the_connection_ends() {
        let now = Instant::now();
        let mut cfg = Config::new(params(), 1, 1, 1);
        cfg.nop_interval = None;
        let mut c = Connection::new(cfg, now);
        let cmd = || Command {
            lun: 0,
            cdb: [0; 16],
            data: Data::None,
            timed: false,
        };
        let sent = c.submit(now, cmd()).unwrap();
        let taken: Vec<u32> = std::iter::from_fn(|| c.poll_transmit())
            .map(|p| p.header.itt())
            .collect();
        assert_eq!(taken, vec![sent]);
        // MaxCmdSN 1: this one waits for the window.
        let held = c.submit(now, cmd()).unwrap();
        c.close(Side::Initiator, CloseReason::Local);
        let mut ended = Vec::new();
        while let Some(e) = c.poll_event() {
            if let Event::Completed { itt, result } = e {
                assert!(matches!(result, Err(TaskError::ConnectionLost(_))));
                ended.push(itt);
            }
        }
        ended.sort_unstable();
        assert_eq!(ended, vec![sent, held]);
        assert!(
            !c.never_sent(sent),
            "on the wire: the target may have run it"
        );
        assert!(c.never_sent(held));
    }

    #[test]
    fn a_command_queued_for_the_writer_counts_as_never_sent() {
        let now = Instant::now();
        let mut cfg = Config::new(params(), 1, 8, 1);
        cfg.nop_interval = None;
        let mut c = Connection::new(cfg, now);
        let itt = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0; 16],
                    data: Data::None,
                    timed: false,
                },
            )
            .unwrap();
        c.peer_closed();
        assert!(c.never_sent(itt));
        // And it stays unsent: a closed connection hands the driver nothing more, or a writer
        // still holding the socket could send a command that session recovery then sends
        // again on the next connection (found by the engine_session fuzz target: a COMPARE AND
        // WRITE on two connections).
        assert!(
            c.poll_transmit().is_none(),
            "a PDU left a closed connection"
        );
        assert!(!c.has_transmit());
    }

    // ---- command timeout and its escalation, on a virtual clock ----

    const LIMIT: Duration = Duration::from_secs(30);

    fn timed_conn() -> (Connection, Instant) {
        let now = Instant::now();
        let mut cfg = Config::new(params(), 1, 16, 1);
        cfg.nop_interval = None;
        cfg.command_timeout = Some(LIMIT);
        cfg.tmf_timeout = Duration::from_secs(10);
        (Connection::new(cfg, now), now)
    }

    fn tur(c: &mut Connection, now: Instant, timed: bool) -> u32 {
        let itt = c
            .submit(
                now,
                Command {
                    lun: 0,
                    cdb: [0; 16],
                    data: Data::None,
                    timed,
                },
            )
            .unwrap();
        while c.poll_transmit().is_some() {}
        itt
    }

    /// Every TMF request queued: (its ITT, function, referenced task tag, RefCmdSN).
    fn tmfs_sent(c: &mut Connection) -> Vec<(u32, TmfFunction, u32, u32)> {
        std::iter::from_fn(|| c.poll_transmit())
            .filter_map(|p| match p.header {
                Header::TaskMgmtRequest(t) => {
                    Some((t.itt, t.function, t.referenced_task_tag, t.ref_cmd_sn))
                }
                _ => None,
            })
            .collect()
    }

    fn tmf_answer(itt: u32, response: TmfResponse) -> Pdu {
        Pdu::new(
            TaskMgmtResponse {
                response,
                itt,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 16,
            },
            Bytes::new(),
        )
    }

    fn good(itt: u32) -> Pdu {
        Pdu::new(
            ScsiResponse {
                itt,
                stat_sn: 1,
                exp_cmd_sn: 2,
                max_cmd_sn: 16,
                ..ScsiResponse::default()
            },
            Bytes::new(),
        )
    }

    /// The results of every `Completed` event, by ITT, in order.
    fn completed(c: &mut Connection) -> Vec<(u32, Result<Completion, TaskError>)> {
        std::iter::from_fn(|| c.poll_event())
            .filter_map(|e| match e {
                Event::Completed { itt, result } => Some((itt, result)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn a_command_past_its_timeout_gets_an_abort_task_and_fails_with_timed_out_when_answered() {
        let (mut c, t0) = timed_conn();
        let itt = tur(&mut c, t0, true);
        assert_eq!(c.poll_timeout(), Some(t0 + LIMIT));
        c.handle_timeout(t0 + LIMIT - Duration::from_millis(1));
        assert!(tmfs_sent(&mut c).is_empty(), "not before the deadline");
        c.handle_timeout(t0 + LIMIT);
        let tmfs = tmfs_sent(&mut c);
        assert_eq!(tmfs.len(), 1);
        let (tmf, f, rtt, ref_sn) = tmfs[0];
        assert_eq!((f, rtt, ref_sn), (TmfFunction::ABORT_TASK, itt, 1));
        assert!(
            completed(&mut c).is_empty(),
            "waits for the target's answer"
        );
        c.handle_pdu(t0 + LIMIT, tmf_answer(tmf, TmfResponse::FUNCTION_COMPLETE));
        let done = completed(&mut c);
        assert_eq!(
            done,
            vec![(
                itt,
                Err(TaskError::TimedOut {
                    after: LIMIT,
                    by: Some(AbortedBy::AbortTask)
                })
            )]
        );
        assert!(c.closed().is_none(), "the connection goes on");
        assert_eq!((c.tasks_in_flight(), c.tmfs_in_flight()), (0, 0));
        assert_eq!(c.poll_timeout(), None, "nothing left to time");
    }

    #[test]
    fn accepts_a_status_that_arrives_before_the_abort_answer_as_the_commands_result() {
        let (mut c, t0) = timed_conn();
        let itt = tur(&mut c, t0, true);
        c.handle_timeout(t0 + LIMIT);
        let (tmf, ..) = tmfs_sent(&mut c)[0];
        c.handle_pdu(t0 + LIMIT, good(itt));
        c.handle_pdu(
            t0 + LIMIT,
            tmf_answer(tmf, TmfResponse::TASK_DOES_NOT_EXIST),
        );
        let done = completed(&mut c);
        assert_eq!(done.len(), 1);
        assert!(matches!(done[0].1, Ok(Completion { status: 0, .. })));
        assert!(tmfs_sent(&mut c).is_empty(), "no escalation");
        assert!(c.closed().is_none());
    }

    #[test]
    fn a_refused_abort_escalates_to_a_lun_reset_that_ends_the_command_with_timed_out() {
        let (mut c, t0) = timed_conn();
        let late = tur(&mut c, t0, true);
        // Another task on the LUN, submitted later and untimed: the reset ends it too.
        let other = tur(&mut c, t0 + Duration::from_secs(1), false);
        c.handle_timeout(t0 + LIMIT);
        let (abort, ..) = tmfs_sent(&mut c)[0];
        c.handle_pdu(
            t0 + LIMIT,
            tmf_answer(abort, TmfResponse::FUNCTION_REJECTED),
        );
        let steps: Vec<TimeoutStep> = std::iter::from_fn(|| c.poll_event())
            .filter_map(|e| match e {
                Event::TimeoutStep { itt, step } if itt == late => Some(step),
                _ => None,
            })
            .collect();
        assert_eq!(
            steps,
            vec![
                TimeoutStep::AbortTask,
                TimeoutStep::LunReset {
                    abort_response: TmfResponse::FUNCTION_REJECTED
                }
            ]
        );
        let tmfs = tmfs_sent(&mut c);
        assert_eq!(tmfs.len(), 1);
        let (reset, f, rtt, _) = tmfs[0];
        assert_eq!((f, rtt), (TmfFunction::LOGICAL_UNIT_RESET, RESERVED_TAG));
        c.handle_pdu(
            t0 + LIMIT,
            tmf_answer(reset, TmfResponse::FUNCTION_COMPLETE),
        );
        let done = completed(&mut c);
        assert_eq!(
            done,
            vec![
                (
                    late,
                    Err(TaskError::TimedOut {
                        after: LIMIT,
                        by: Some(AbortedBy::LunReset)
                    })
                ),
                (other, Err(TaskError::Aborted(AbortedBy::LunReset))),
            ]
        );
        assert!(
            std::iter::from_fn(|| c.poll_event())
                .all(|e| !matches!(e, Event::TaskManagement { .. })),
            "the engine's own TMFs are not reported as the caller's"
        );
        assert!(c.closed().is_none());
    }

    #[test]
    fn a_refused_abort_and_a_refused_lun_reset_end_the_connection() {
        let (mut c, t0) = timed_conn();
        let itt = tur(&mut c, t0, true);
        c.handle_timeout(t0 + LIMIT);
        let (abort, ..) = tmfs_sent(&mut c)[0];
        c.handle_pdu(
            t0 + LIMIT,
            tmf_answer(abort, TmfResponse::FUNCTION_REJECTED),
        );
        let (reset, ..) = tmfs_sent(&mut c)[0];
        c.handle_pdu(
            t0 + LIMIT,
            tmf_answer(reset, TmfResponse::FUNCTION_REJECTED),
        );
        let e = ConnectionError {
            by: Side::Initiator,
            reason: CloseReason::AbortRefused {
                abort: TmfResponse::FUNCTION_REJECTED,
                reset: TmfResponse::FUNCTION_REJECTED,
            },
        };
        assert_eq!(c.closed(), Some(e));
        assert_eq!(
            completed(&mut c),
            vec![(itt, Err(TaskError::ConnectionLost(e)))],
            "a connection loss, so session recovery reissues it"
        );
        assert!(!c.never_sent(itt), "the target saw it");
    }

    #[test]
    fn an_unanswered_abort_ends_the_connection_after_the_tmf_timeout() {
        let (mut c, t0) = timed_conn();
        let itt = tur(&mut c, t0, true);
        c.handle_timeout(t0 + LIMIT);
        assert_eq!(tmfs_sent(&mut c).len(), 1);
        let tmf_deadline = t0 + LIMIT + Duration::from_secs(10);
        assert_eq!(c.poll_timeout(), Some(tmf_deadline));
        c.handle_timeout(tmf_deadline - Duration::from_millis(1));
        assert!(c.closed().is_none());
        c.handle_timeout(tmf_deadline);
        let e = ConnectionError {
            by: Side::Initiator,
            reason: CloseReason::TaskManagementTimeout(Duration::from_secs(10)),
        };
        assert_eq!(c.closed(), Some(e));
        assert_eq!(
            completed(&mut c),
            vec![(itt, Err(TaskError::ConnectionLost(e)))]
        );
    }

    #[test]
    fn an_unanswered_lun_reset_after_a_refused_abort_ends_the_connection() {
        let (mut c, t0) = timed_conn();
        let itt = tur(&mut c, t0, true);
        c.handle_timeout(t0 + LIMIT);
        let (abort, ..) = tmfs_sent(&mut c)[0];
        let t1 = t0 + LIMIT + Duration::from_secs(2);
        c.handle_pdu(t1, tmf_answer(abort, TmfResponse::FUNCTION_REJECTED));
        assert_eq!(tmfs_sent(&mut c)[0].1, TmfFunction::LOGICAL_UNIT_RESET);
        assert_eq!(c.poll_timeout(), Some(t1 + Duration::from_secs(10)));
        c.handle_timeout(t1 + Duration::from_secs(10));
        assert!(matches!(
            c.closed(),
            Some(ConnectionError {
                reason: CloseReason::TaskManagementTimeout(_),
                ..
            })
        ));
        assert!(matches!(
            completed(&mut c)[..],
            [(i, Err(TaskError::ConnectionLost(_)))] if i == itt
        ));
    }

    #[test]
    fn accepts_an_untimed_command_waiting_past_the_timeout() {
        let (mut c, t0) = timed_conn();
        let itt = tur(&mut c, t0, false);
        assert_eq!(c.poll_timeout(), None);
        c.handle_timeout(t0 + LIMIT * 10);
        assert!(tmfs_sent(&mut c).is_empty());
        c.handle_pdu(t0 + LIMIT * 10, good(itt));
        assert!(matches!(completed(&mut c)[..], [(i, Ok(_))] if i == itt));
    }

    #[test]
    fn a_command_still_waiting_for_the_window_times_out_without_a_tmf() {
        let now = Instant::now();
        let mut cfg = Config::new(params(), 1, 1, 1);
        cfg.nop_interval = None;
        cfg.command_timeout = Some(LIMIT);
        let mut c = Connection::new(cfg, now);
        let _sent = tur(&mut c, now, false);
        let held = tur(&mut c, now, true);
        c.handle_timeout(now + LIMIT);
        assert!(tmfs_sent(&mut c).is_empty());
        assert_eq!(
            completed(&mut c),
            vec![(
                held,
                Err(TaskError::TimedOut {
                    after: LIMIT,
                    by: None
                })
            )]
        );
        // The window opens later: the withdrawn command does not leave.
        c.handle_pdu(now + LIMIT, good(_sent));
        assert!(std::iter::from_fn(|| c.poll_transmit()).all(|p| p.header.itt() != held));
    }

    #[test]
    fn the_next_timeout_follows_the_oldest_command_still_in_flight() {
        let (mut c, t0) = timed_conn();
        let a = tur(&mut c, t0, true);
        let b = tur(&mut c, t0 + Duration::from_secs(1), true);
        let cc = tur(&mut c, t0 + Duration::from_secs(2), true);
        assert_eq!(c.poll_timeout(), Some(t0 + LIMIT));
        // Out of order: b first changes nothing, then a uncovers c's (b's entry is stale).
        c.handle_pdu(t0, good(b));
        assert_eq!(c.poll_timeout(), Some(t0 + LIMIT));
        c.handle_pdu(t0, good(a));
        assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(2) + LIMIT));
        c.handle_pdu(t0, good(cc));
        assert_eq!(c.poll_timeout(), None);
        assert_eq!(completed(&mut c).len(), 3);
        assert!(tmfs_sent(&mut c).is_empty());
    }
}
