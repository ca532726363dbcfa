//! The initiator's session of several connections (RFC 7143 §4.2, MaxConnections > 1; issue
//! 28): what the target's `engine::target::session` is on the other side.
//!
//! ```text
//!  submit ─► pending (session order) ─► window open? (CmdSN <= MaxCmdSN, one window for the
//!            session, §4.2.2.1) ─► a connection chosen now (Spread) ─► Connection::submit_as
//!            with the session's next CmdSN
//!  handle_pdu(cid) ─► that connection's engine (its ExpStatSN, its tasks' R2Ts, Data-In and
//!                     status: connection allegiance, §4.2.3) ─► the window it carried is the
//!                     session's ─► pending commands go while it is open
//!  add_connection(cid) ─► after a login with the session's TSIH and a new CID (§5.3.4, §6.3)
//!  logout_connection(cid) ─► no new tasks there; once its tasks are done, Logout reason 1
//!  poll_event ◄── Completed { itt, .. } exactly once per accepted submission
//! ```
//!
//! What is the session's and what is a connection's:
//! - **One CmdSN window**: the session numbers its commands; each connection's engine keeps
//!   its own copy of the window, which the session hands it before every input
//!   ([`Connection::share_window`]) and reads back after. A command is given to a connection
//!   only when the window lets it go at once, so no connection ever holds commands behind the
//!   window and the choice of connection is made when the command leaves, on the outstanding
//!   bytes of that moment.
//! - **ExpStatSN per connection** (§4.2.2.2), kept by each [`Connection`].
//! - **ITTs unique in the session** (§11.2.1.8): commands take theirs from the session, below
//!   `COMMAND_ITTS`; each connection's own (pings, task management, logout) count from a
//!   range of its own above it.
//! - **Spread** ([`Spread`]): the open connection with the fewest outstanding bytes, or each
//!   in turn. A command whose data is made for one connection (Seal seals write data under
//!   that connection's own keys) is placed by the driver instead: [`Session::pick`] says
//!   where, [`Session::submit_on`] sends it there or nowhere.
//!
//! Connection loss at ErrorRecoveryLevel 0 and 1: the connection's tasks end with it
//! ([`TaskError::ConnectionLost`]); the others go on. A command it sent that the target never
//! received leaves a hole in the session's CmdSN sequence that stops every later command at the
//! target (§4.2.2.1) until the session is recovered: [`Event::ConnectionClosed`] says whether
//! that may be so (`gap`).
//!
//! Connection loss at ErrorRecoveryLevel 2 (negotiated at the leading login; §7.2, §7.4.3):
//! nothing ends. The failed connection's tasks are held with no allegiance
//! ([`initiator::Connection::hold_tasks`]) and the session moves them:
//!
//! ```text
//!  connection c fails ─► its tasks held (Recovery { cid: c })
//!    a login reinstating CID c was added ─► its implicit logout cleaned c up (§6.3.4)
//!    else a live connection d ─► Logout reason 2 for CID c on d (§11.14.1) ─► answered 0/1
//!    none ─► wait: the driver logs a connection in (same TSIH; the same or a new CID)
//!  cleaned up ─► each task, in CmdSN order: TASK REASSIGN on the connection (§11.5.1;
//!                ExpDataSN = the Data-In it has) ─► Function complete: it goes on there
//!                (recovery R2Ts, Data-In from ExpDataSN, its status; §7.2.2)
//!             ─► Task does not exist, CmdSN never acknowledged: sent again, same ITT and
//!                CmdSN (it never arrived, so its hole in the CmdSN sequence is filled; §6.2.1)
//!             ─► refused, or lost after it was acknowledged: it ends (ConnectionLost)
//! ```
//! Data made for one connection (Seal seals under each connection's own keys;
//! [`Session::reseal_on_reassign`]) never moves to another as it is: before the TASK REASSIGNs
//! go to connection `to`, every held task with write data is asked for it made again for `to`
//! ([`Event::Reseal`], answered by [`Session::resealed`]); a retried command then carries the
//! new data, and the answers to recovery R2Ts are cut from it (a target that cannot piece a
//! transfer together from two connections asks for all of it again).
//!
//! The session outlives its last connection while tasks wait for one; the driver ends the wait
//! with [`Session::give_up`]. Each task completes once: held tasks have no `Completed` until
//! they end on the connection they were moved to. [`Session::tasks_on`] and
//! [`Session::move_task`] move a task of a live connection.
//!
//! Task management: ABORT TASK goes on the task's connection (its allegiance). A LOGICAL UNIT
//! RESET goes on one connection and ends, at the target, the LU's tasks of every connection;
//! those of other connections then end by their own command timeout (ABORT TASK answered
//! "task does not exist").

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use iscsi_wire::header::{RejectReason, TmfResponse};
use iscsi_wire::{Opcode, Pdu, RESERVED_TAG};

use super::initiator::{
    self, Command, Connection, Data, MovedTask, Reassignment, SubmitError as ConnSubmitError,
    TaskError, TaskResult, TimeoutStep,
};
use super::{CloseReason, ConnectionError, OwnTagMap, Side};
use crate::params::SessionParams;
use crate::seq::{sn_le, sn_lt};

/// Commands' ITTs are below this; a connection's own count from `COMMAND_ITTS | CID << 16`.
const COMMAND_ITTS: u32 = 0x8000_0000;

/// Bytes a command costs in [`Spread::LeastBytes`] beyond its data (its PDU headers), so
/// commands without data spread too.
const COMMAND_COST: u64 = 48;

/// [`Spread::LeastQueued`] spreads by the sockets' reports only while the fastest socket
/// carries more than this many times the slowest; with rates closer it spreads as
/// [`Spread::LeastBytes`]. On a clean 1 Gbit/s link, 8 connections, whose windows differ only
/// by noise, moved 0.64× (writes) and 0.56× (reads) as much spread by the reports as by
/// outstanding bytes (docs/results/mcs-sweep-3); at 0.1 % loss, where the windows differ
/// fourfold, the reports are what keep writes off a connection a loss just slowed.
pub const RATES_APART: u64 = 2;

/// How the session chooses the connection a command goes on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Spread {
    /// The open connection with the fewest bytes outstanding (data of its unfinished
    /// commands, plus a header's worth each); ties go in turn.
    LeastBytes,
    /// Each open connection in turn.
    RoundRobin,
    /// The open connection that would deliver a new command soonest: the bytes its socket
    /// has yet to carry (what its driver reports it has not delivered, [`Session::report_queue`],
    /// plus what was placed on it since) over the bytes per second it carries (the congestion
    /// window over the round trip), plus its outstanding bytes at the session's fastest rate.
    /// Ties go in turn; until every connection reported a rate, and while the fastest
    /// carries at most [`RATES_APART`] times the slowest, it is [`Spread::LeastBytes`]; with
    /// nothing queued in any socket (reads) it chooses as LeastBytes does.
    ///
    /// Why (issue 28): the target runs commands in CmdSN order (RFC 7143 §4.2.2.1), so a
    /// write whose status waits behind an earlier command still crossing a slow connection
    /// completes as late as that one. Outstanding bytes then look alike on every connection,
    /// LeastBytes spreads evenly, and the session moves at N times its slowest connection
    /// (cubic halving one window after a loss). Data not yet delivered by each socket is what
    /// differs. The default: without reports it is LeastBytes.
    #[default]
    LeastQueued,
}

impl std::str::FromStr for Spread {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "least-bytes" => Ok(Spread::LeastBytes),
            "round-robin" => Ok(Spread::RoundRobin),
            "least-queued" => Ok(Spread::LeastQueued),
            other => Err(format!(
                "{other}: the spread is least-bytes, least-queued or round-robin"
            )),
        }
    }
}

/// A connection [`Session::pick_for`] chose, holding its count until [`Session::unpick`].
#[derive(Debug, PartialEq, Eq)]
#[must_use = "the connection counts it until Session::unpick"]
pub struct Picked {
    pub cid: u16,
    /// Which login of `cid` (a reinstated connection with the same CID is another).
    serial: u64,
    cost: u64,
}

/// Settings of a session of several connections.
#[derive(Clone, Debug, Default)]
pub struct Config {
    pub spread: Spread,
    /// A command with [`Command::timed`] still waiting for the window this long after its
    /// submission ends with [`TaskError::TimedOut`] (`by: None`); once on a connection, that
    /// connection's own timeout runs it (give each connection the same).
    pub command_timeout: Option<Duration>,
}

/// Why [`Session::submit`] refused a command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// The session is over (logged out, or its last connection ended).
    #[error(transparent)]
    Closed(ConnectionError),
    /// More than 4 GiB, the reserved ITT, an ITT in use or not a command's.
    #[error("invalid command")]
    Invalid,
}

/// Why a connection cannot be added, or a task moved.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConnError {
    /// An open connection has this CID (reinstating one is a close, then an add).
    #[error("connection {0} is open")]
    CidInUse(u16),
    /// No such connection, or it is closed.
    #[error("no open connection {0}")]
    NoConnection(u16),
    /// No such task on a connection.
    #[error("no task {0:#x} on a connection")]
    NoTask(u32),
    /// The session is over.
    #[error("the session is over")]
    Ended,
}

/// What the driver must act on.
#[derive(Debug)]
pub enum Event {
    /// A submitted command ended: exactly one per accepted submission. `cid`: the connection
    /// it was on (`None`: it never left the session's queue).
    Completed {
        itt: u32,
        cid: Option<u16>,
        result: TaskResult,
    },
    /// The answer to [`Session::abort`] or [`Session::lun_reset`], on connection `cid`.
    TaskManagement {
        cid: u16,
        itt: u32,
        response: TmfResponse,
    },
    /// The target asked connection `cid` to log out (AsyncEvent 1) within this many seconds.
    LogoutRequested { cid: u16, within_secs: u16 },
    /// The target rejected a PDU that was not a command, on connection `cid`.
    Rejected {
        cid: u16,
        reason: RejectReason,
        opcode: Opcode,
    },
    /// A command passed its timeout and connection `cid` took this step to end it.
    TimeoutStep {
        cid: u16,
        itt: u32,
        step: TimeoutStep,
    },
    /// Connection `cid` ended (its tasks have their `Completed` before this); the driver
    /// [`Session::remove`]s it once its socket is done. `gap`: it had sent commands the target
    /// had not acknowledged receiving (CmdSN at or past ExpCmdSN): if one never arrived, every
    /// later command waits at the target for it, and at ErrorRecoveryLevel 0 only a session
    /// recovery ends that wait.
    ConnectionClosed {
        cid: u16,
        error: ConnectionError,
        gap: bool,
    },
    /// ErrorRecoveryLevel 2: task `itt` of a failed connection went to connection `cid` by
    /// TASK REASSIGN, and the target answered (RFC 7143 §11.6.1). `Refused`: it ended
    /// (its `Completed` came first).
    Reassigned {
        itt: u32,
        cid: u16,
        outcome: Reassignment,
    },
    /// ErrorRecoveryLevel 2 with data made per connection ([`Session::reseal_on_reassign`]):
    /// task `itt` of a failed connection goes to connection `to`, and its write data must be
    /// made again for it (Seal: sealed from the plaintext under `to`'s keys and counters).
    /// Answer with [`Session::resealed`]; the task waits (and the others of its recovery with
    /// it) until then.
    Reseal { itt: u32, to: u16 },
}

/// A failed connection's tasks on their way to another (ErrorRecoveryLevel 2).
#[derive(Debug)]
struct Recovery {
    /// The failed connection's CID.
    cid: u16,
    tasks: Vec<MovedTask>,
    step: Step,
    /// [`Session::reseal_on_reassign`]: the connection the tasks' write data was asked to be
    /// made for ([`Event::Reseal`]), and the tasks whose new data has not come yet.
    resealed_for: Option<u16>,
    waiting: Vec<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Step {
    /// The target may still count the tasks as the failed connection's: a Logout for recovery
    /// on a live connection, or a login reinstating the CID, comes first (§7.2.2).
    Cleanup,
    /// The Logout removing it for recovery went on connection `on`.
    LoggingOut { on: u16 },
    /// Cleaned up: the tasks go to connection `to` by TASK REASSIGN.
    Clean { to: u16 },
}

#[derive(Debug)]
struct Member {
    cid: u16,
    conn: Connection,
    /// No new tasks: logs out once its tasks are done.
    draining: bool,
    /// Its Logout went out.
    logout: Option<u32>,
    /// [`Spread::LeastBytes`]'s measure.
    bytes: u64,
    /// Bytes of commands made for this connection still waiting for the window
    /// ([`Session::submit_on`]): counted too, so picks while the window is shut spread.
    pinned: u64,
    /// Bytes of commands [`Session::pick_for`] chose it for and the driver has not submitted
    /// yet (their data is being made for it): counted too, so picks made in a burst, before
    /// the first of them is submitted, spread as submitted commands would.
    picked: u64,
    /// A task it had sent and the target had not acknowledged ended with it.
    gap: bool,
    /// Which login this is: a connection that later takes the same CID (a reinstatement) is
    /// another one, with other keys (commands made for this one never go there).
    serial: u64,
    /// Its socket as the driver last reported it ([`Spread::LeastQueued`]).
    queue: Option<Queue>,
}

/// What a connection's socket holds, from its driver ([`Session::report_queue`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct QueueReport {
    /// Bytes written for it and not yet acknowledged by the peer's TCP (not sent, in flight,
    /// and what the driver holds for it unwritten).
    pub bytes: u64,
    /// Bytes per second it carries now (congestion window over smoothed round trip); 0: not
    /// known (the connection counts as [`Spread::LeastBytes`] would).
    pub per_sec: u64,
}

#[derive(Clone, Copy, Debug)]
struct Queue {
    report: QueueReport,
    /// Bytes of commands placed on it since the report (their data, or a header's worth).
    since: u64,
}

impl Member {
    fn open(&self) -> bool {
        self.conn.closed().is_none()
    }

    /// Bytes outstanding, bytes made for it and waiting, and bytes picked for it.
    fn load(&self) -> u64 {
        self.bytes + self.pinned + self.picked
    }

    /// Its socket's reported rate, if it reported one.
    fn rate(&self) -> Option<u64> {
        self.queue.map(|q| q.report.per_sec).filter(|r| *r > 0)
    }

    /// [`Spread::LeastQueued`]'s measure, in microseconds: what its socket has yet to deliver
    /// at its own rate, plus its outstanding bytes at `best` (the session's fastest socket's
    /// rate, the same for every connection). Outstanding bytes are not this socket's to carry
    /// (a read's data comes the other way, a write's may be past it already), so they do not
    /// count at its own sending rate: with nothing queued anywhere (reads) the choice is
    /// exactly [`Spread::LeastBytes`]'s.
    fn delay_us(&self, best: u64) -> Option<u128> {
        let q = self.queue?;
        let rate = self.rate()?;
        let queued = u128::from(q.report.bytes) + u128::from(q.since) + u128::from(self.picked);
        Some(
            queued * 1_000_000 / u128::from(rate)
                + u128::from(self.load()) * 1_000_000 / u128::from(best.max(1)),
        )
    }

    fn takes_commands(&self) -> bool {
        self.open() && !self.draining && self.logout.is_none() && !self.conn.logout_requested()
    }
}

#[derive(Debug)]
struct Task {
    /// The connection it is on (`None`: waiting in the session's queue, or held for
    /// reassignment).
    cid: Option<u16>,
    cmd_sn: u32,
    cost: u64,
    /// Its connection failed and it waits for another (ErrorRecoveryLevel 2).
    held: bool,
    /// The raw LUN it addresses (a LOGICAL UNIT RESET ends the LU's tasks on every
    /// connection: [`Session::end_reset_lun`]).
    lun: u64,
}

#[derive(Debug)]
struct Pending {
    itt: u32,
    cmd: Command,
    deadline: Option<Instant>,
    /// Made for this connection ([`Session::submit_on`]; its CID and [`Member::serial`]): it
    /// goes there or nowhere.
    on: Option<(u16, u64)>,
}

/// The session: its connections, its window and its tasks' allegiance.
#[derive(Debug)]
pub struct Session {
    cfg: Config,
    members: Vec<Member>,
    cmd_sn: u32,
    exp_cmd_sn: u32,
    max_cmd_sn: u32,
    next_itt: u32,
    tasks: OwnTagMap<Task>,
    pending: VecDeque<Pending>,
    /// Where the next turn starts.
    turn: usize,
    /// A Logout closing the session went out.
    logging_out: bool,
    ended: Option<ConnectionError>,
    events: VecDeque<Event>,
    /// ErrorRecoveryLevel 2 was negotiated: failed connections' tasks are reassigned.
    erl2: bool,
    /// Failed connections' tasks waiting to be reassigned (ErrorRecoveryLevel 2).
    recoveries: Vec<Recovery>,
    /// Write data is made per connection: a reassigned task's is made again
    /// ([`Session::reseal_on_reassign`]).
    reseal: bool,
    /// Commands made for a connection that stopped taking commands before they left (never
    /// sent, no CmdSN), ended since ([`Session::take_never_left`]).
    never_left: std::collections::HashSet<u32>,
    /// The next connection's [`Member::serial`].
    next_serial: u64,
    /// Every connection's tail probe ([`Session::set_tail_probe`]).
    tail_probe: Option<Duration>,
    /// Picks ([`Session::pick_for`]) not yet given back ([`Session::unpick`]).
    picks: usize,
}

/// The first ITT of connection `cid`'s own.
fn own_itts(cid: u16) -> u32 {
    COMMAND_ITTS | (u32::from(cid) << 16)
}

fn cost(cmd: &Command) -> u64 {
    COMMAND_COST
        + match &cmd.data {
            Data::None => 0,
            Data::Read { len, .. } | Data::Discard { len } => u64::from(*len),
            Data::Write(_) | Data::WriteParts { .. } => cmd.data.write_len().unwrap_or(0) as u64,
        }
}

impl Session {
    /// The session of a leading login: its first connection `conn` (CID `cid`), whose window
    /// (from the Login Response) is the session's.
    #[must_use]
    pub fn new(cfg: Config, cid: u16, mut conn: Connection) -> Self {
        let (cmd_sn, exp_cmd_sn, max_cmd_sn, _) = conn.sequence();
        conn.set_next_itt(own_itts(cid));
        let erl2 = conn.params().error_recovery_level >= 2;
        conn.hold_tasks(erl2);
        Self {
            cfg,
            members: vec![Member {
                cid,
                conn,
                draining: false,
                logout: None,
                bytes: 0,
                pinned: 0,
                picked: 0,
                gap: false,
                serial: 0,
                queue: None,
            }],
            cmd_sn,
            exp_cmd_sn,
            max_cmd_sn,
            next_itt: 1,
            tasks: OwnTagMap::default(),
            pending: VecDeque::new(),
            turn: 0,
            logging_out: false,
            ended: None,
            events: VecDeque::new(),
            erl2,
            recoveries: Vec::new(),
            reseal: false,
            never_left: std::collections::HashSet::new(),
            next_serial: 1,
            tail_probe: None,
            picks: 0,
        }
    }

    /// A tail probe on every connection, those open and those added later
    /// ([`Connection::set_tail_probe`]; `None`, the default: none). In a session of several
    /// connections a command lost at the end of a burst holds every later command of every
    /// connection at the target (CmdSN order, RFC 7143 §4.2.2.1) until TCP resends it; the
    /// probe has it resent about a round trip after it left rather than at the
    /// retransmission timer.
    pub fn set_tail_probe(&mut self, after: Option<Duration>) {
        self.tail_probe = after;
        for m in &mut self.members {
            m.conn.set_tail_probe(after);
        }
    }

    /// Connection `cid`'s driver wrote every PDU it took into the socket
    /// ([`Connection::flushed`]: arms its tail probe).
    pub fn flushed(&mut self, cid: u16, now: Instant) {
        if let Some(i) = self.index(cid) {
            self.members[i].conn.flushed(now);
        }
    }

    /// Whether command `itt`, just ended with [`TaskError::ConnectionLost`], was made for a
    /// connection ([`Session::submit_on`]) that stopped taking commands before it left: it
    /// was never sent and took no CmdSN, so it may be made again for another connection. Asks
    /// once (the answer is forgotten).
    pub fn take_never_left(&mut self, itt: u32) -> bool {
        self.never_left.remove(&itt)
    }

    /// For a driver whose write data is made for one connection (Seal seals it under that
    /// connection's keys, docs/seal.md §3): at ErrorRecoveryLevel 2 a failed connection's
    /// tasks that carry write data do not go to another connection with the data made for
    /// the failed one. [`Event::Reseal`] asks for each task's data made again for the
    /// connection it goes to, and the TASK REASSIGNs (and the commands sent again) go once
    /// [`Session::resealed`] brought it: a retried command's immediate and unsolicited data
    /// and the answers to recovery R2Ts are then that connection's.
    pub fn reseal_on_reassign(&mut self, on: bool) {
        self.reseal = on;
    }

    /// The answer to [`Event::Reseal`]: task `itt`'s write data made for connection `to`, the
    /// one the event named (`None`: it cannot be, and the task ends with
    /// [`TaskError::ConnectionLost`]). Data of another length than the task's ends it too
    /// (its command's EDTL is on the wire already). An answer for a task no longer waiting
    /// (it ended, or its recovery started over for another connection) is ignored.
    pub fn resealed(&mut self, now: Instant, itt: u32, to: u16, data: Option<bytes::Bytes>) {
        let Some(k) = self
            .recoveries
            .iter()
            .position(|r| r.resealed_for == Some(to) && r.waiting.contains(&itt))
        else {
            return;
        };
        let r = &mut self.recoveries[k];
        r.waiting.retain(|i| *i != itt);
        let ok = match (data, r.tasks.iter_mut().find(|m| m.itt() == itt)) {
            (Some(d), Some(m)) => m.replace_write(d),
            _ => false,
        };
        if !ok {
            r.tasks.retain(|m| m.itt() != itt);
            let e = ConnectionError {
                by: Side::Initiator,
                reason: CloseReason::Local,
            };
            self.complete(itt, None, Err(TaskError::ConnectionLost(e)));
        }
        self.recover(now);
        self.dispatch(now);
    }

    // ---- getters ----

    /// The leading connection's negotiated values (session-wide keys are the same on all).
    #[must_use]
    pub fn params(&self) -> Option<&SessionParams> {
        self.members.first().map(|m| m.conn.params())
    }

    /// (next CmdSN, ExpCmdSN, MaxCmdSN) of the session.
    #[must_use]
    pub fn window(&self) -> (u32, u32, u32) {
        (self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn)
    }

    /// Connection `cid`, open or closed and not removed yet.
    #[must_use]
    pub fn connection(&self, cid: u16) -> Option<&Connection> {
        self.index(cid).map(|i| &self.members[i].conn)
    }

    /// The CIDs of the connections not removed yet.
    pub fn cids(&self) -> impl Iterator<Item = u16> + '_ {
        self.members.iter().map(|m| m.cid)
    }

    /// Connections not closed.
    #[must_use]
    pub fn open_connections(&self) -> usize {
        self.members.iter().filter(|m| m.open()).count()
    }

    /// Commands submitted and not completed (on a connection or waiting for the window).
    #[must_use]
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Bytes outstanding on connection `cid` ([`Spread::LeastBytes`]'s measure).
    #[must_use]
    pub fn outstanding_bytes(&self, cid: u16) -> u64 {
        self.index(cid).map_or(0, |i| self.members[i].bytes)
    }

    /// What connection `cid`'s socket holds now, from its driver ([`Spread::LeastQueued`]'s
    /// measure; the commands placed on it after this count on top until the next report).
    pub fn report_queue(&mut self, cid: u16, report: QueueReport) {
        if let Some(i) = self.index(cid) {
            self.members[i].queue = Some(Queue { report, since: 0 });
        }
    }

    /// The ITTs of connection `cid`'s tasks, ascending (ErrorRecoveryLevel 2's seam: what it
    /// reassigns when that connection fails).
    #[must_use]
    pub fn tasks_on(&self, cid: u16) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.cid == Some(cid))
            .map(|(i, _)| *i)
            .collect();
        v.sort_unstable();
        v
    }

    /// The connection task `itt` is on (`None`: waiting for the window, or not a task).
    #[must_use]
    pub fn allegiance(&self, itt: u32) -> Option<u16> {
        self.tasks.get(&itt).and_then(|t| t.cid)
    }

    /// Whether the session is over.
    #[must_use]
    pub fn ended(&self) -> Option<ConnectionError> {
        self.ended
    }

    /// Whether failed connections' tasks are reassigned (ErrorRecoveryLevel 2 negotiated at
    /// the leading login).
    #[must_use]
    pub fn recovers_connections(&self) -> bool {
        self.erl2
    }

    /// Tasks of failed connections waiting to be reassigned (ErrorRecoveryLevel 2).
    #[must_use]
    pub fn held_tasks(&self) -> usize {
        self.recoveries.iter().map(|r| r.tasks.len()).sum()
    }

    /// CIDs of failed connections whose tasks wait (ErrorRecoveryLevel 2): a login with one of
    /// them reinstates it, and its tasks go there.
    #[must_use]
    pub fn recovering(&self) -> Vec<u16> {
        self.recoveries.iter().map(|r| r.cid).collect()
    }

    /// Whether a login may reuse CID `cid` now: not while a Logout removing it for recovery
    /// may still reach the target, which would end the new connection instead (§11.14.1
    /// names the connection by CID alone). A driver that logs in with fresh CIDs never asks.
    #[must_use]
    pub fn may_reuse_cid(&self, cid: u16) -> bool {
        !self.members.iter().any(|m| m.cid == cid && m.open())
            && !self
                .recoveries
                .iter()
                .any(|r| r.cid == cid && matches!(r.step, Step::LoggingOut { .. }))
    }

    /// Whether connection `cid` has a PDU to send.
    #[must_use]
    pub fn has_transmit(&self, cid: u16) -> bool {
        self.index(cid)
            .is_some_and(|i| self.members[i].conn.has_transmit())
    }

    // ---- outputs ----

    /// Connection `cid`'s next PDU.
    pub fn poll_transmit(&mut self, cid: u16) -> Option<Pdu> {
        let i = self.index(cid)?;
        self.members[i].conn.poll_transmit()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The earliest deadline of any connection and of the commands waiting for the window.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let conns = self.members.iter().filter_map(|m| m.conn.poll_timeout());
        let queued = self.pending.iter().filter_map(|p| p.deadline);
        conns.chain(queued).min()
    }

    // ---- connections ----

    /// A connection logged in with the session's TSIH and CID `cid` (RFC 7143 §5.3.4, §6.3):
    /// the window its Login Response carried joins the session's; commands waiting for the
    /// window may go on it at once.
    pub fn add_connection(
        &mut self,
        now: Instant,
        cid: u16,
        mut conn: Connection,
    ) -> Result<(), ConnError> {
        if self.ended.is_some() || self.logging_out {
            return Err(ConnError::Ended);
        }
        if self.members.iter().any(|m| m.cid == cid && m.open()) {
            return Err(ConnError::CidInUse(cid));
        }
        // A closed one with the same CID is replaced.
        self.members.retain(|m| m.cid != cid);
        let (_, exp, max, _) = conn.sequence();
        self.merge(exp, max);
        conn.set_next_itt(own_itts(cid));
        conn.hold_tasks(self.erl2);
        conn.set_tail_probe(self.tail_probe);
        conn.share_window(self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn);
        self.members.push(Member {
            cid,
            conn,
            draining: false,
            logout: None,
            bytes: 0,
            pinned: 0,
            picked: 0,
            gap: false,
            serial: self.next_serial,
            queue: None,
        });
        self.next_serial += 1;
        self.recover(now);
        self.dispatch(now);
        Ok(())
    }

    /// Closes connection `cid` alone, cleanly: it takes no new commands and, once its tasks
    /// are done, sends a Logout with reason 1 (close the connection, §11.14). False when
    /// there is no such open connection.
    pub fn logout_connection(&mut self, now: Instant, cid: u16) -> bool {
        let Some(i) = self.index(cid).filter(|&i| self.members[i].open()) else {
            return false;
        };
        self.members[i].draining = true;
        self.after(i, now);
        true
    }

    /// Forgets connection `cid` (closed, its socket done; one still open is closed first).
    pub fn remove(&mut self, now: Instant, cid: u16) {
        self.close(now, cid, Side::Initiator, CloseReason::Local);
        if let Some(i) = self.index(cid) {
            self.members.remove(i);
        }
    }

    /// ErrorRecoveryLevel 2's seam: moves task `itt`, whole, to connection `to` (allegiance
    /// reassignment, RFC 7143 §7.2.2). Sends nothing: the TASK REASSIGN request and what
    /// follows it are ERL 2's.
    pub fn move_task(&mut self, itt: u32, to: u16) -> Result<(), ConnError> {
        let from = self
            .tasks
            .get(&itt)
            .and_then(|t| t.cid)
            .ok_or(ConnError::NoTask(itt))?;
        let j = self
            .index(to)
            .filter(|&j| self.members[j].open())
            .ok_or(ConnError::NoConnection(to))?;
        let i = self.index(from).ok_or(ConnError::NoTask(itt))?;
        if i == j {
            return Ok(());
        }
        let moved = self.members[i]
            .conn
            .take_task(itt)
            .ok_or(ConnError::NoTask(itt))?;
        self.members[j]
            .conn
            .adopt_task(moved)
            .map_err(|_| ConnError::NoConnection(to))?;
        let c = self.tasks.get_mut(&itt).map_or(0, |t| {
            t.cid = Some(to);
            t.cost
        });
        self.members[i].bytes = self.members[i].bytes.saturating_sub(c);
        self.members[j].bytes += c;
        Ok(())
    }

    // ---- commands ----

    /// A fresh command ITT, unique in the session.
    pub fn alloc_itt(&mut self) -> u32 {
        loop {
            let itt = self.next_itt;
            self.next_itt = if itt + 1 >= COMMAND_ITTS { 1 } else { itt + 1 };
            if !self.tasks.contains_key(&itt) {
                return itt;
            }
        }
    }

    /// Submits a command under a fresh ITT.
    pub fn submit(&mut self, now: Instant, cmd: Command) -> Result<u32, SubmitError> {
        let itt = self.alloc_itt();
        self.submit_as(now, itt, cmd)
    }

    /// Submits a command under `itt` (from [`Session::alloc_itt`]): it goes on a connection
    /// as soon as the session's window lets it.
    pub fn submit_as(&mut self, now: Instant, itt: u32, cmd: Command) -> Result<u32, SubmitError> {
        self.enqueue(now, itt, cmd, None)
    }

    fn enqueue(
        &mut self,
        now: Instant,
        itt: u32,
        cmd: Command,
        on: Option<u16>,
    ) -> Result<u32, SubmitError> {
        if let Some(e) = self.ended {
            return Err(SubmitError::Closed(e));
        }
        if self.logging_out {
            return Err(SubmitError::Closed(ConnectionError {
                by: Side::Initiator,
                reason: CloseReason::Logout,
            }));
        }
        if itt == RESERVED_TAG || itt >= COMMAND_ITTS || self.tasks.contains_key(&itt) {
            return Err(SubmitError::Invalid);
        }
        if cmd
            .data
            .write_len()
            .is_some_and(|n| u32::try_from(n).is_err())
        {
            return Err(SubmitError::Invalid);
        }
        let deadline = self
            .cfg
            .command_timeout
            .filter(|_| cmd.timed)
            .map(|d| now + d);
        self.tasks.insert(
            itt,
            Task {
                cid: None,
                cmd_sn: 0,
                cost: cost(&cmd),
                held: false,
                lun: cmd.lun,
            },
        );
        let on = match on.and_then(|c| self.index(c)) {
            Some(i) => {
                self.members[i].pinned += cost(&cmd);
                Some((self.members[i].cid, self.members[i].serial))
            }
            None => None,
        };
        self.pending.push_back(Pending {
            itt,
            cmd,
            deadline,
            on,
        });
        self.dispatch(now);
        Ok(itt)
    }

    /// The connection the next command would go on now ([`Spread`]), for a driver that makes
    /// a command's data for one connection (Seal seals write data under that connection's
    /// keys) and then submits it there with [`Session::submit_on`]. `None`: no connection
    /// takes commands.
    pub fn pick(&mut self) -> Option<u16> {
        self.choose().map(|i| self.members[i].cid)
    }

    /// [`Session::pick`] for a command of `len` bytes of data (a write's, or a read's
    /// length; 0 without data) that the driver makes before it submits it (Seal seals a
    /// write under the connection's keys, on a crypto worker): the connection counts it as
    /// its own from now until [`Session::unpick`]. Without that, every command picked while
    /// the first is still being made would go to the same connection (its measure unchanged
    /// until a submission; issue 28: a burst of completions sent 2.4 MB of writes to one of 8
    /// connections while the others ran dry, and every later write waited behind it in CmdSN
    /// order, docs/results/mcs-sweep-6).
    pub fn pick_for(&mut self, len: u64) -> Option<Picked> {
        let i = self.choose()?;
        let cost = COMMAND_COST + len;
        self.picks += 1;
        let m = &mut self.members[i];
        m.picked += cost;
        Some(Picked {
            cid: m.cid,
            serial: m.serial,
            cost,
        })
    }

    /// The connection of `p` stops counting it: call it when the command is submitted (just
    /// before [`Session::submit_on`], which counts it as its own) or given up.
    pub fn unpick(&mut self, p: Picked) {
        self.picks = self.picks.saturating_sub(1);
        if let Some(i) = self.pinned_index((p.cid, p.serial)) {
            let m = &mut self.members[i];
            m.picked = m.picked.saturating_sub(p.cost);
        }
    }

    /// Commands the window would let go now beyond those already waiting for it and those
    /// picked and not yet submitted ([`Session::pick_for`]): MaxCmdSN - CmdSN + 1 (RFC 7143
    /// §4.2.2.1) less both, 0 while the window is shut.
    ///
    /// A driver that makes a command's data for the connection it picks (Seal) picks only
    /// while this is above 0 (issue 28): a command picked while the window is shut waits on
    /// its connection, chosen on what the sockets held then, until the window lets it go; with
    /// a queue deeper than the target's window (256 commands against 128) every command waited
    /// there a whole window's time, and a connection a loss had slowed since kept its share,
    /// holding every later command at the target (docs/results/mcs-depth).
    #[must_use]
    pub fn free_slots(&self) -> u32 {
        if !sn_le(self.cmd_sn, self.max_cmd_sn) {
            return 0;
        }
        let room = self.max_cmd_sn.wrapping_sub(self.cmd_sn).wrapping_add(1);
        let taken =
            u32::try_from(self.pending.len().saturating_add(self.picks)).unwrap_or(u32::MAX);
        room.saturating_sub(taken)
    }

    /// Bytes picked for connection `cid` and not yet submitted ([`Session::pick_for`]).
    #[must_use]
    pub fn picked_bytes(&self, cid: u16) -> u64 {
        self.index(cid).map_or(0, |i| self.members[i].picked)
    }

    /// [`Session::submit_as`] on connection `cid` only (its data was made for it): it goes
    /// there when the window lets it, in submission order with the others. If `cid` stops
    /// taking commands first (closed, draining), the command ends with
    /// [`TaskError::ConnectionLost`] and was never sent.
    pub fn submit_on(
        &mut self,
        now: Instant,
        cid: u16,
        itt: u32,
        cmd: Command,
    ) -> Result<u32, SubmitError> {
        if self
            .index(cid)
            .is_none_or(|i| !self.members[i].takes_commands())
        {
            return Err(SubmitError::Invalid);
        }
        self.enqueue(now, itt, cmd, Some(cid))
    }

    /// ABORT TASK for `itt` (RFC 7143 §11.5.1), on the task's connection. A command still
    /// waiting for the window ends at once. The TMF's (CID, ITT) when a request went out.
    pub fn abort(&mut self, now: Instant, itt: u32) -> Option<(u16, u32)> {
        let t = self.tasks.get(&itt)?;
        if t.held {
            // No connection to ask on until it is reassigned (it may run at the target).
            return None;
        }
        let Some(cid) = t.cid else {
            self.drop_pending(itt);
            self.complete(
                itt,
                None,
                Err(TaskError::Aborted(initiator::AbortedBy::AbortTask)),
            );
            return None;
        };
        let i = self.index(cid)?;
        self.with(i, now, |c| c.abort(now, itt)).map(|t| (cid, t))
    }

    /// LOGICAL UNIT RESET of `lun` (§11.5.1) on an open connection: its (CID, ITT).
    pub fn lun_reset(&mut self, now: Instant, lun: u64) -> Option<(u16, u32)> {
        let i = self.members.iter().position(Member::open)?;
        let cid = self.members[i].cid;
        Some((cid, self.with(i, now, |c| c.lun_reset(now, lun))))
    }

    /// After LOGICAL UNIT RESET of `lun`, answered Function complete on connection `cid`: the
    /// target ended the LU's tasks on every connection of the session (SAM-5, LOGICAL UNIT
    /// RESET), but only `cid`'s engine saw the reset. Each of `lun`'s tasks on another
    /// connection gets an ABORT TASK there (§11.5.1; the target answers "task does not
    /// exist"), so it ends here too instead of waiting for a status that will not come.
    pub fn end_reset_lun(&mut self, now: Instant, cid: u16, lun: u64) {
        let others: Vec<u32> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.lun == lun && t.cid.is_some_and(|c| c != cid))
            .map(|(itt, _)| *itt)
            .collect();
        for itt in others {
            self.abort(now, itt);
        }
    }

    /// Logout closing the session (§11.14), on an open connection: commands waiting for the
    /// window end; the target closes every connection once it answers. The Logout's (CID,
    /// ITT); `None` without an open connection (the session ends here).
    pub fn logout(&mut self, now: Instant) -> Option<(u16, u32)> {
        self.logging_out = true;
        let e = ConnectionError {
            by: Side::Initiator,
            reason: CloseReason::Logout,
        };
        self.fail_pending(e);
        self.fail_held(e);
        for m in &mut self.members {
            m.conn.hold_tasks(false);
        }
        let Some(i) = self.members.iter().position(Member::open) else {
            self.ended.get_or_insert(e);
            return None;
        };
        let cid = self.members[i].cid;
        self.with(i, now, |c| c.logout(now)).map(|t| (cid, t))
    }

    // ---- inputs ----

    /// A PDU received on connection `cid`.
    pub fn handle_pdu(&mut self, cid: u16, now: Instant, pdu: Pdu) {
        if let Some(i) = self.index(cid) {
            self.with(i, now, |c| c.handle_pdu(now, pdu));
        }
    }

    /// Connection `cid`'s stream could not be decoded: it is over.
    pub fn handle_wire_error(&mut self, cid: u16, now: Instant) {
        if let Some(i) = self.index(cid) {
            self.with(i, now, |c| c.handle_wire_error(now));
        }
    }

    /// The target closed connection `cid`.
    pub fn peer_closed(&mut self, cid: u16, now: Instant) {
        if let Some(i) = self.index(cid) {
            self.with(i, now, Connection::peer_closed);
        }
    }

    /// The driver ends connection `cid` (socket error, Seal failure, ...).
    pub fn close(&mut self, now: Instant, cid: u16, by: Side, reason: CloseReason) {
        if let Some(i) = self.index(cid) {
            self.with(i, now, |c| c.close(by, reason));
        }
    }

    /// Every connection's timers, and commands waiting for the window past their timeout.
    pub fn handle_timeout(&mut self, now: Instant) {
        let cids: Vec<u16> = self.members.iter().map(|m| m.cid).collect();
        for cid in cids {
            if let Some(i) = self.index(cid) {
                self.with(i, now, |c| c.handle_timeout(now));
            }
        }
        let Some(after) = self.cfg.command_timeout else {
            return;
        };
        let late: Vec<u32> = self
            .pending
            .iter()
            .filter(|p| p.deadline.is_some_and(|d| now >= d))
            .map(|p| p.itt)
            .collect();
        for itt in late {
            self.drop_pending(itt);
            self.complete(itt, None, Err(TaskError::TimedOut { after, by: None }));
        }
    }

    // ---- internals ----

    fn index(&self, cid: u16) -> Option<usize> {
        self.members.iter().position(|m| m.cid == cid)
    }

    /// Runs `f` on member `i`'s engine with the session's window in it, then takes back what
    /// it did: the window, its events, the commands that may go now.
    fn with<T>(&mut self, i: usize, now: Instant, f: impl FnOnce(&mut Connection) -> T) -> T {
        let (c, e, m) = (self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn);
        let conn = &mut self.members[i].conn;
        conn.share_window(c, e, m);
        let r = f(conn);
        self.after(i, now);
        r
    }

    /// After member `i`'s engine ran: its window, its events, a drained connection's Logout,
    /// and the commands the window lets go.
    fn after(&mut self, i: usize, now: Instant) {
        self.absorb(i);
        self.pump(i);
        let m = &mut self.members[i];
        if m.draining && m.logout.is_none() && m.open() && m.conn.tasks_in_flight() == 0 {
            let cid = m.cid;
            m.conn
                .share_window(self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn);
            m.logout = m.conn.logout_connection(now, cid);
            self.absorb(i);
            self.pump(i);
        }
        self.recover(now);
        self.dispatch(now);
    }

    /// Member `i`'s window into the session's.
    fn absorb(&mut self, i: usize) {
        let (c, e, m, _) = self.members[i].conn.sequence();
        if sn_lt(self.cmd_sn, c) {
            self.cmd_sn = c;
        }
        self.merge(e, m);
    }

    /// A window heard on any connection (§4.2.2.1): ignore a MaxCmdSN below ExpCmdSN - 1,
    /// never move back.
    fn merge(&mut self, exp: u32, max: u32) {
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

    /// The member the next command goes on.
    fn choose(&mut self) -> Option<usize> {
        let n = self.members.len();
        let start = self.turn % n.max(1);
        let order = (0..n).map(|k| (start + k) % n);
        let pick = match self.cfg.spread {
            Spread::RoundRobin => {
                let mut order = order;
                order.find(|&i| self.members[i].takes_commands())
            }
            Spread::LeastQueued if self.rates_apart() => {
                let fastest = self
                    .members
                    .iter()
                    .filter(|m| m.takes_commands())
                    .filter_map(Member::rate)
                    .max()
                    .unwrap_or(1);
                let mut best: Option<(usize, u128)> = None;
                for i in order {
                    let m = &self.members[i];
                    if !m.takes_commands() {
                        continue;
                    }
                    let d = m.delay_us(fastest).unwrap_or(u128::MAX);
                    if best.is_none_or(|(_, b)| d < b) {
                        best = Some((i, d));
                    }
                }
                best.map(|(i, _)| i)
            }
            Spread::LeastBytes | Spread::LeastQueued => {
                let mut best: Option<usize> = None;
                for i in order {
                    let m = &self.members[i];
                    if m.takes_commands() && best.is_none_or(|b| m.load() < self.members[b].load())
                    {
                        best = Some(i);
                    }
                }
                best
            }
        }?;
        self.turn = pick + 1;
        Some(pick)
    }

    /// [`Spread::LeastQueued`] decides by the sockets' reports: every connection that takes
    /// commands reported a rate, and the fastest carries more than [`RATES_APART`] times the
    /// slowest. Otherwise the outstanding bytes decide, as [`Spread::LeastBytes`].
    fn rates_apart(&self) -> bool {
        let mut lo = u64::MAX;
        let mut hi = 0;
        for m in self.members.iter().filter(|m| m.takes_commands()) {
            let Some(r) = m.rate() else {
                return false;
            };
            lo = lo.min(r);
            hi = hi.max(r);
        }
        hi > 0 && u128::from(hi) > u128::from(lo) * u128::from(RATES_APART)
    }

    /// Commands waiting for the window go while it is open and a connection takes them.
    fn dispatch(&mut self, now: Instant) {
        // Made for a connection that takes no more commands (closed, draining, or replaced by
        // another login with its CID): never sent, whether the window is open or not.
        let stale: Vec<u32> = self
            .pending
            .iter()
            .filter(|p| {
                p.on.is_some_and(|on| {
                    self.pinned_index(on)
                        .is_none_or(|i| !self.members[i].takes_commands())
                })
            })
            .map(|p| p.itt)
            .collect();
        for itt in stale {
            let lost = self
                .pending
                .iter()
                .find(|p| p.itt == itt)
                .and_then(|p| p.on)
                .and_then(|on| self.pinned_index(on))
                .and_then(|i| self.members[i].conn.closed())
                .unwrap_or(ConnectionError {
                    by: Side::Initiator,
                    reason: CloseReason::Local,
                });
            self.drop_pending(itt);
            self.never_left.insert(itt);
            self.complete(itt, None, Err(TaskError::ConnectionLost(lost)));
        }
        while sn_le(self.cmd_sn, self.max_cmd_sn) && !self.pending.is_empty() {
            let pinned = self.pending.front().and_then(|p| p.on);
            let i = match pinned {
                Some(on) => match self
                    .pinned_index(on)
                    .filter(|&i| self.members[i].takes_commands())
                {
                    Some(i) => i,
                    // Failed above; cannot happen in between.
                    None => break,
                },
                None => match self.choose() {
                    Some(i) => i,
                    None => break,
                },
            };
            let Some(p) = self.pending.pop_front() else {
                break;
            };
            self.unpin(&p);
            // What the command adds to its connection's socket: its data if a write.
            let sends = COMMAND_COST + p.cmd.data.write_len().unwrap_or(0) as u64;
            let cmd_sn = self.cmd_sn;
            let (c, e, m) = (self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn);
            let member = &mut self.members[i];
            member.conn.share_window(c, e, m);
            let cid = member.cid;
            match member.conn.submit_as(now, p.itt, p.cmd) {
                Ok(_) => {
                    if let Some(t) = self.tasks.get_mut(&p.itt) {
                        t.cid = Some(cid);
                        t.cmd_sn = cmd_sn;
                        member.bytes += t.cost;
                    }
                    if let Some(q) = &mut member.queue {
                        q.since += sends;
                    }
                }
                Err(err) => {
                    let lost = match err {
                        ConnSubmitError::Closed(e) => e,
                        _ => ConnectionError {
                            by: Side::Initiator,
                            reason: CloseReason::Local,
                        },
                    };
                    self.complete(p.itt, None, Err(TaskError::ConnectionLost(lost)));
                }
            }
            self.absorb(i);
            self.pump(i);
        }
        if self.members.iter().all(|m| !m.open())
            && self.ended.is_none()
            && (!self.erl2 || self.logging_out)
        {
            // No connection left: the session is over (ErrorRecoveryLevel 0 and 1; at 2 it
            // waits for a new one, or the driver's give_up).
            let e = ConnectionError {
                by: Side::Initiator,
                reason: CloseReason::Local,
            };
            self.ended = Some(e);
            self.fail_pending(e);
        }
    }

    /// The member that is the connection a command was made for (its CID and serial).
    fn pinned_index(&self, (cid, serial): (u16, u64)) -> Option<usize> {
        self.members
            .iter()
            .position(|m| m.cid == cid && m.serial == serial)
    }

    /// A pending command leaves the queue: the connection it was made for stops counting it.
    fn unpin(&mut self, p: &Pending) {
        if let Some(i) = p.on.and_then(|on| self.pinned_index(on)) {
            let m = &mut self.members[i];
            m.pinned = m.pinned.saturating_sub(cost(&p.cmd));
        }
    }

    /// Takes command `itt` out of the queue (aborted, timed out).
    fn drop_pending(&mut self, itt: u32) {
        if let Some(k) = self.pending.iter().position(|p| p.itt == itt) {
            if let Some(p) = self.pending.remove(k) {
                self.unpin(&p);
            }
        }
    }

    fn fail_pending(&mut self, e: ConnectionError) {
        let gone: Vec<Pending> = self.pending.drain(..).collect();
        for p in &gone {
            self.unpin(p);
        }
        let itts: Vec<u32> = gone.iter().map(|p| p.itt).collect();
        for itt in itts {
            self.complete(itt, None, Err(TaskError::ConnectionLost(e)));
        }
    }

    fn complete(&mut self, itt: u32, cid: Option<u16>, result: TaskResult) {
        if let Some(t) = self.tasks.remove(&itt) {
            if let Some(i) = t.cid.and_then(|c| self.index(c)) {
                let m = &mut self.members[i];
                m.bytes = m.bytes.saturating_sub(t.cost);
            }
            self.events.push_back(Event::Completed { itt, cid, result });
        }
    }

    /// Member `i`'s events, as the session's.
    fn pump(&mut self, i: usize) {
        let cid = self.members[i].cid;
        while let Some(ev) = self.members[i].conn.poll_event() {
            match ev {
                initiator::Event::Completed { itt, result } => {
                    if let Err(TaskError::ConnectionLost(_)) = &result {
                        let sent_unacked = !self.members[i].conn.never_sent(itt)
                            && self
                                .tasks
                                .get(&itt)
                                .is_some_and(|t| sn_le(self.exp_cmd_sn, t.cmd_sn));
                        self.members[i].gap |= sent_unacked;
                    }
                    self.complete(itt, Some(cid), result);
                }
                initiator::Event::TaskManagement { itt, response } => {
                    self.events
                        .push_back(Event::TaskManagement { cid, itt, response });
                }
                initiator::Event::LogoutRequested { within_secs } => {
                    self.events
                        .push_back(Event::LogoutRequested { cid, within_secs });
                }
                initiator::Event::Rejected { reason, opcode } => {
                    self.events.push_back(Event::Rejected {
                        cid,
                        reason,
                        opcode,
                    });
                }
                initiator::Event::TimeoutStep { itt, step } => {
                    self.events.push_back(Event::TimeoutStep { cid, itt, step });
                }
                initiator::Event::Closed(error) => {
                    if self.logging_out && error.reason == CloseReason::Logout {
                        self.ended.get_or_insert(error);
                    }
                    // A recovery step that waited on this connection starts over: its Logout
                    // or TASK REASSIGNs may be lost with it (and a later connection with the
                    // same CID is another one).
                    for r in &mut self.recoveries {
                        if matches!(r.step, Step::LoggingOut { on: c } | Step::Clean { to: c } if c == cid)
                        {
                            r.step = Step::Cleanup;
                        }
                        if r.resealed_for == Some(cid) {
                            // Made for a connection that is gone: made again for the next.
                            r.resealed_for = None;
                            r.waiting.clear();
                        }
                    }
                    let held = self.members[i].conn.take_held();
                    if !held.is_empty() {
                        self.hold(cid, held, error);
                    }
                    let gap = self.members[i].gap;
                    self.events
                        .push_back(Event::ConnectionClosed { cid, error, gap });
                }
                initiator::Event::Reassigned { itt, outcome } => {
                    self.events
                        .push_back(Event::Reassigned { itt, cid, outcome });
                }
                initiator::Event::RecoveryLogout {
                    cid: failed,
                    response,
                } => {
                    self.on_recovery_logout(cid, failed, response);
                }
            }
        }
    }

    // ---- ErrorRecoveryLevel 2 ----

    /// Failed connection `cid`'s tasks wait for another connection.
    fn hold(&mut self, cid: u16, held: Vec<MovedTask>, error: ConnectionError) {
        if self.logging_out || self.ended.is_some() {
            for m in held {
                self.complete(m.itt(), Some(cid), Err(TaskError::ConnectionLost(error)));
            }
            return;
        }
        for m in &held {
            if let Some(t) = self.tasks.get_mut(&m.itt()) {
                t.cid = None;
                t.held = true;
            }
        }
        if let Some(i) = self.index(cid) {
            self.members[i].bytes = 0;
        }
        match self.recoveries.iter_mut().find(|r| r.cid == cid) {
            Some(r) => {
                r.tasks.extend(held);
                r.step = Step::Cleanup;
                r.resealed_for = None;
                r.waiting.clear();
            }
            None => self.recoveries.push(Recovery {
                cid,
                tasks: held,
                step: Step::Cleanup,
                resealed_for: None,
                waiting: Vec::new(),
            }),
        }
    }

    /// Connection `on` got the answer to its Logout removing `failed` for recovery.
    fn on_recovery_logout(&mut self, on: u16, failed: u16, response: u8) {
        let Some(k) = self
            .recoveries
            .iter()
            .position(|r| r.cid == failed && r.step == Step::LoggingOut { on })
        else {
            return;
        };
        // 0: closed; 1: CID not found (the target holds nothing for it: what it never had is
        // sent again, what it had and lost ends, as TASK REASSIGN answers say).
        if response <= 1 {
            self.recoveries[k].step = Step::Clean { to: on };
            return;
        }
        let r = self.recoveries.remove(k);
        let e = ConnectionError {
            by: Side::Target,
            reason: CloseReason::RecoveryLogoutRefused(response),
        };
        for m in r.tasks {
            self.complete(m.itt(), None, Err(TaskError::ConnectionLost(e)));
        }
    }

    /// The open connection that takes commands with the fewest outstanding bytes.
    fn least_loaded(&self) -> Option<usize> {
        (0..self.members.len())
            .filter(|&i| self.members[i].takes_commands())
            .min_by_key(|&i| self.members[i].load())
    }

    /// Moves the held tasks on: cleanup first, then TASK REASSIGN (see the module's notes).
    fn recover(&mut self, now: Instant) {
        let mut k = 0;
        while k < self.recoveries.len() {
            let cid = self.recoveries[k].cid;
            match self.recoveries[k].step {
                Step::Cleanup => {
                    let reinstated = self
                        .members
                        .iter()
                        .any(|m| m.cid == cid && m.takes_commands());
                    if reinstated {
                        // A login with its CID: its implicit logout cleaned up (§6.3.4).
                        self.recoveries[k].step = Step::Clean { to: cid };
                        continue;
                    }
                    if let Some(j) = self.least_loaded() {
                        let on = self.members[j].cid;
                        let (c, e, m) = (self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn);
                        let conn = &mut self.members[j].conn;
                        conn.share_window(c, e, m);
                        if conn.logout_for_recovery(now, cid).is_some() {
                            self.recoveries[k].step = Step::LoggingOut { on };
                        }
                    }
                    k += 1;
                }
                Step::LoggingOut { on } => {
                    if self.members.iter().any(|m| m.cid == on && m.open()) {
                        k += 1;
                    } else {
                        self.recoveries[k].step = Step::Cleanup;
                        k += 1;
                    }
                }
                Step::Clean { to } => {
                    let Some(j) = self
                        .members
                        .iter()
                        .position(|m| m.cid == to && m.takes_commands())
                    else {
                        // Gone before the tasks moved: cleanup again elsewhere (the target
                        // answers a second Logout for the CID "not found", harmless).
                        self.recoveries[k].step = Step::Cleanup;
                        k += 1;
                        continue;
                    };
                    if self.reseal {
                        // Data made for the failed connection goes nowhere else: made again
                        // for `to` first (Event::Reseal), then every task moves at once.
                        let r = &mut self.recoveries[k];
                        if r.resealed_for != Some(to) {
                            r.resealed_for = Some(to);
                            r.waiting = r
                                .tasks
                                .iter()
                                .filter(|m| m.write_len() > 0)
                                .map(MovedTask::itt)
                                .collect();
                            for &itt in &r.waiting {
                                self.events.push_back(Event::Reseal { itt, to });
                            }
                        }
                        if !self.recoveries[k].waiting.is_empty() {
                            k += 1;
                            continue;
                        }
                    }
                    let r = self.recoveries.remove(k);
                    self.reassign_all(now, j, r.tasks);
                }
            }
        }
    }

    /// TASK REASSIGN of `tasks` to member `j`, in CmdSN order (retries fill the CmdSN holes in
    /// order).
    fn reassign_all(&mut self, now: Instant, j: usize, mut tasks: Vec<MovedTask>) {
        // Serial number order (RFC 1982): every task's CmdSN is within 2^31 below the next.
        let base = self.cmd_sn.wrapping_sub(1 << 31);
        tasks.sort_by_key(|m| m.cmd_sn().map_or(u32::MAX, |sn| sn.wrapping_sub(base)));
        let to = self.members[j].cid;
        let (c, e, m) = (self.cmd_sn, self.exp_cmd_sn, self.max_cmd_sn);
        self.members[j].conn.share_window(c, e, m);
        for moved in tasks {
            let itt = moved.itt();
            match self.members[j].conn.reassign(now, moved) {
                Ok(_) => {
                    if let Some(t) = self.tasks.get_mut(&itt) {
                        t.cid = Some(to);
                        t.held = false;
                        self.members[j].bytes += t.cost;
                    }
                }
                Err(err) => {
                    let lost = match err {
                        ConnSubmitError::Closed(e) => e,
                        _ => ConnectionError {
                            by: Side::Initiator,
                            reason: CloseReason::Local,
                        },
                    };
                    self.complete(itt, None, Err(TaskError::ConnectionLost(lost)));
                }
            }
        }
        self.absorb(j);
        self.pump(j);
    }

    /// Ends the tasks waiting for reassignment.
    fn fail_held(&mut self, e: ConnectionError) {
        let held: Vec<Recovery> = self.recoveries.drain(..).collect();
        for r in held {
            for m in r.tasks {
                self.complete(m.itt(), None, Err(TaskError::ConnectionLost(e)));
            }
        }
    }

    /// ErrorRecoveryLevel 2: the driver cannot bring a connection back (its logins failed for
    /// long enough). The session ends: held tasks and commands waiting for the window end
    /// with [`TaskError::ConnectionLost`], open connections are closed.
    pub fn give_up(&mut self, now: Instant, error: ConnectionError) {
        self.ended.get_or_insert(error);
        for m in &mut self.members {
            m.conn.hold_tasks(false);
        }
        self.fail_pending(error);
        self.fail_held(error);
        let cids: Vec<u16> = self.members.iter().map(|m| m.cid).collect();
        for cid in cids {
            self.close(now, cid, error.by, error.reason);
        }
    }
}
