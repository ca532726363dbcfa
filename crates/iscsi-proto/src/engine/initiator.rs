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
use iscsi_wire::header::{NopIn, NopOut, RejectReason, TmfResponse};
use iscsi_wire::{Header, Opcode, Pdu, BHS_LEN, RESERVED_TAG};
use read::Segment;
use tmf::TmfKind;

use super::{CloseReason, ConnectionError, OwnTagMap, OwnTagSet, Side, TagAllocator, Violation};
use crate::params::SessionParams;
use crate::seq::{sn_le, sn_lt};

mod read;
mod recovery;
mod tmf;
mod write;

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
    /// Expect `len` bytes and keep none of them (issue 27: a benchmark that reads as libiscsi's
    /// `iscsi-perf` does). Every Data-In is checked as a read's (DataSN, offset, length,
    /// RFC 7143 §11.7) and counted, so a short or misordered answer fails as it would for
    /// [`Data::Read`]; its bytes are dropped. A segment received in place
    /// ([`Connection::lend_read_buffer`]) lands in one scratch buffer the connection lends
    /// again for the next, so every such read's data goes through the same few cache-warm
    /// bytes. The command's [`Completion::data`] is empty.
    Discard {
        len: u32,
    },
    Write(Bytes),
    /// Write data that goes on the wire as `data` followed by `tail`, neither copied into one
    /// buffer: Seal `none`'s plaintext as the caller gave it and its trailer (issue 27,
    /// docs/seal.md §4). A Data-Out that would hold bytes of both is cut in two at the join
    /// (RFC 7143 §11.7: a sequence's PDUs need not be full); immediate data (§11.3) that would
    /// stops at the join when the rest may follow as unsolicited Data-Out, and is otherwise
    /// joined (copied).
    WriteParts {
        data: Bytes,
        tail: Bytes,
    },
}

impl Data {
    /// Bytes of write data on the wire (`None`: not a write).
    #[must_use]
    pub fn write_len(&self) -> Option<usize> {
        match self {
            Data::Write(b) => Some(b.len()),
            Data::WriteParts { data, tail } => Some(data.len() + tail.len()),
            Data::None | Data::Read { .. } | Data::Discard { .. } => None,
        }
    }
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
    /// Write data sent after `write`, not joined to it ([`Data::WriteParts`]); empty for
    /// most writes.
    write_tail: Bytes,
    /// Sent with the W bit: the caller gave write data (a pass-through may give none).
    write_bit: bool,
    read: Option<BytesMut>,
    read_len: u32,
    /// [`Data::Discard`]: Data-In is checked and counted, never kept (`read` stays empty).
    discard: bool,
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

/// A task taken out of its connection ([`Connection::take_task`]) to go on another
/// ([`Connection::adopt_task`]): ErrorRecoveryLevel 2's connection allegiance reassignment
/// (RFC 7143 §7.2.2) moves it whole.
#[derive(Debug)]
pub struct MovedTask {
    itt: u32,
    task: Task,
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
    /// The buffer [`Data::Discard`] reads' segments are received into in place, lent again
    /// for the next ([`Connection::lend_read_buffer`]).
    scratch: Option<BytesMut>,
    /// ErrorRecoveryLevel 2 ([`Connection::hold_tasks`]): when the connection fails, its
    /// tasks are kept for reassignment instead of ending with it.
    hold: bool,
    /// Tasks kept when it failed ([`Connection::take_held`]).
    held: Vec<MovedTask>,
    /// [`Connection::set_tail_probe`]: how long after the last PDU of a burst left the tail
    /// probe follows it (`None`: never).
    tail_probe: Option<Duration>,
    /// The last PDU handed out ended a burst (a command or Data-Out, nothing queued behind
    /// it): its task and what had come for the task by then; armed by [`Connection::flushed`].
    tail: Option<(u32, Heard)>,
    /// When the tail probe goes, for which task, and what had come for it when it left.
    probe_at: Option<(Instant, u32, Heard)>,
}

/// What had come from the target for a task: Data-In bytes, the next DataSN and R2TSN. A
/// tail probe goes only while this has not moved (nothing proves the target has the task).
type Heard = (u32, u32, u32);

fn heard(t: &Task) -> Heard {
    (t.received, t.next_data_sn, t.next_r2t_sn)
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
            scratch: None,
            hold: false,
            held: Vec::new(),
            tail_probe: None,
            tail: None,
            probe_at: None,
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
        if self.tail_probe.is_some() {
            // Whatever leaves now follows the burst before it: no probe for that one.
            self.probe_at = None;
            let itt = match &pdu.header {
                Header::ScsiCommand(h) => Some(h.itt),
                Header::DataOut(h) => Some(h.itt),
                _ => None,
            };
            self.tail = itt
                .filter(|_| self.out.is_empty())
                .and_then(|itt| self.tasks.get(&itt).map(|t| (itt, heard(t))));
        }
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
                // An answer to the target's ping (not a tail probe, whose TTT is reserved too).
                if h.itt == RESERVED_TAG && h.ttt != RESERVED_TAG {
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
        let probe = self.probe_at.map(|(d, _, _)| d);
        [ping, tmf, command, probe].into_iter().flatten().min()
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

    /// A tail probe `after` each burst (`None`, the default: none). A read's command is one
    /// small segment and its data comes the other way, so nothing follows it on this
    /// connection: lost, TCP learns of it only by its retransmission timer or a tail loss
    /// probe (RFC 8985 §7: about two round trips), and in a session of several connections the
    /// target holds every later command of every connection meanwhile (CmdSN order, RFC 7143
    /// §4.2.2.1). A NOP-Out that asks no answer (§11.18), `after` the driver wrote a burst
    /// that ended with a command or Data-Out ([`Connection::flushed`]) and while nothing has
    /// come for that task, is a later segment: the target's TCP acknowledges it selectively
    /// and RACK (RFC 8985 §6) resends the lost one about a round trip after it left. It
    /// carries no CmdSN of its own and needs no answer; in a sealed session it is sealed as
    /// every PDU is.
    pub fn set_tail_probe(&mut self, after: Option<Duration>) {
        self.tail_probe = after;
        if after.is_none() {
            self.tail = None;
            self.probe_at = None;
        }
    }

    /// The driver wrote into its socket every PDU it took so far: a burst that ended with a
    /// command or Data-Out arms the tail probe ([`Connection::set_tail_probe`]), unless more
    /// waits to leave.
    pub fn flushed(&mut self, now: Instant) {
        let Some(after) = self.tail_probe else {
            return;
        };
        if let Some((itt, mark)) = self.tail.take() {
            if self.out.is_empty() {
                self.probe_at = Some((now + after, itt, mark));
            }
        }
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
        self.tail_probe_due(now);
    }

    /// The tail probe whose time came ([`Connection::set_tail_probe`]): a NOP-Out that asks
    /// no answer (ITT and TTT 0xffffffff, immediate, CmdSN not advanced; RFC 7143 §11.18),
    /// sent only while nothing else waits to leave and nothing has come for the task that
    /// ended the burst.
    fn tail_probe_due(&mut self, now: Instant) {
        let Some((at, itt, mark)) = self.probe_at else {
            return;
        };
        if now < at || self.closed.is_some() {
            return;
        }
        self.probe_at = None;
        let unheard = self
            .tasks
            .get(&itt)
            .is_some_and(|t| matches!(t.phase, Phase::Sent(_)) && heard(t) == mark);
        if unheard && self.out.is_empty() {
            self.out.push_back(Pdu::new(
                NopOut {
                    immediate: true,
                    lun: 0,
                    itt: RESERVED_TAG,
                    ttt: RESERVED_TAG,
                    cmd_sn: self.cmd_sn,
                    exp_stat_sn: 0,
                },
                Bytes::new(),
            ));
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
}

#[cfg(test)]
mod tests;
