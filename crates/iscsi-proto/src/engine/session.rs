//! The initiator's session above its connection (RFC 7143 §4.4, MaxConnections=1,
//! ErrorRecoveryLevel=0): what outlives one TCP connection.
//!
//! ```text
//!  submit ─► task table (ITT, CDB, LUN, the caller's data as `Bytes`) ─► Connection::submit_as
//!  connection ends (Connection::closed) ─► per unfinished task:
//!      never left the engine, or idempotent (Config::idempotent) ─► kept, waits for attach
//!      sent and not idempotent ─► Completed(NotReissued): may or may not have run
//!      an ABORT TASK was asked for it ─► Completed(Aborted)
//!  attach(new Connection) (after the driver's reinstating login, §6.3.5)
//!      ─► kept tasks sent again under their ITT (bound ones: Event::Rebind first)
//!  recovery timeout passes while detached ─► kept tasks Completed(RecoveryTimedOut)
//!  poll_event ◄── Completed { itt, result } exactly once per accepted submission
//! ```
//!
//! Session reinstatement (RFC 7143 §6.3.5: a login with the old ISID and TSIH 0) makes the
//! target end the old session and its tasks before the new session's commands run, so a
//! command that may have run once can be sent again when running it twice leaves the same
//! state as running it once (SAM-5 §5.6: a command whose status never came may or may not
//! have been executed). Which commands those are the driver says ([`Config::idempotent`], from
//! the SCSI layer's opcode table); the rest end with
//! [`Failure::NotReissued`] and a retryable sense ([`NOT_REISSUED_SENSE`]) for a SCSI layer
//! above to decide.
//!
//! A task keeps its ITT across connections: the session hands ITTs out ([`Session::alloc_itt`])
//! and each attached connection continues the sequence where the last one stopped
//! ([`Connection::set_next_itt`]), with the ITTs of kept tasks reserved on it, so no ITT is
//! reused while a task holds it (§11.2.1.8). The driver's waiters stay keyed by ITT.
//!
//! Data the driver made for one connection (Seal seals write data under the login's keys and
//! the ITT) cannot be sent again as is: such a command is submitted with [`Binding::Bound`]
//! and on a reissue the session asks for its data again ([`Event::Rebind`],
//! [`Session::resubmit`]). Everything else is sent again from what the session kept: the
//! caller's `Bytes` (a reference, not a copy) or the read length.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{RejectReason, TmfResponse};
use iscsi_wire::{Opcode, Pdu, RESERVED_TAG};

use super::initiator::{
    self, AbortedBy, Command, Completion, Connection, Data, SubmitError as ConnSubmitError,
    TaskError, TimeoutStep,
};
use super::{CloseReason, ConnectionError, OwnTagMap, Side, TagAllocator};
use crate::params::SessionParams;

/// The default reissue policy ([`Config::idempotent`]): no command that the target may have
/// seen is sent again. Which commands may run twice is the SCSI layer's knowledge
/// (`ipsan_scsi::cdb::is_idempotent`, SAM-5 §5.6), passed in by the driver.
#[must_use]
pub fn never_idempotent(_opcode: u8) -> bool {
    false
}

/// The SCSI answer for a command that was in flight at a connection loss and is not
/// idempotent: CHECK CONDITION with sense key ABORTED COMMAND, ASC/ASCQ 4Bh/07h (SPC-4
/// Annex D), as (key, ASC, ASCQ).
///
/// Why this one: ABORTED COMMAND means "the device server aborted the command; the
/// application client may be able to recover by trying the command again" (SPC-4 §4.5.6,
/// table 28), which is exactly the state: the command may or may not have run. Linux's SCSI
/// midlayer (`scsi_check_sense`) retries ABORTED COMMAND, as after a path failure; a
/// clustered host that cares whether a COMPARE AND WRITE ran reads the data back. 4Bh/07h
/// names the cause (the transport's connection was lost) rather than 44h/00h INTERNAL TARGET
/// FAILURE, which hosts treat as a device fault.
pub const NOT_REISSUED_SENSE: (u8, u8, u8) = (0x0B, 0x4B, 0x07);

/// Settings of a session.
#[derive(Clone, Debug)]
pub struct Config {
    /// Session recovery: when the connection ends, keep the unfinished tasks that may be
    /// sent again for a new connection ([`Session::attach`]) for up to this long, then end
    /// them with [`Failure::RecoveryTimedOut`]. `None`: no recovery; every unfinished task
    /// ends with the connection ([`TaskError::ConnectionLost`]).
    pub recovery_timeout: Option<Duration>,
    /// Whether a command with this opcode (CDB byte 0) may be sent again after a connection
    /// loss without changing what it does: it may already have run once, in full or in part
    /// (SAM-5 §5.6). The others, once sent, end with [`Failure::NotReissued`]. The engine
    /// knows no CDB: the driver passes the SCSI layer's answer (`ipsan_scsi::cdb::
    /// is_idempotent`); the default, [`never_idempotent`], reissues only what was never sent.
    pub idempotent: fn(u8) -> bool,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            recovery_timeout: None,
            idempotent: never_idempotent,
        }
    }
}

/// How a command's data relates to the connection it is sent on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Binding {
    /// The data is the caller's: a reissue sends it again as it is.
    Free,
    /// The data was made for this connection and ITT (sealed under the login's keys): a
    /// reissue asks for it again ([`Event::Rebind`]).
    Bound,
}

/// How a session's task ended without a SCSI status, by scope: the connection's task errors,
/// or the session's decisions about a task a connection loss left in doubt.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Failure {
    /// The connection ended the task ([`TaskError`]); with recovery on, never
    /// [`TaskError::ConnectionLost`] unless the session itself ended.
    #[error(transparent)]
    Task(TaskError),
    /// In flight when the connection ended and not idempotent ([`Config::idempotent`]): not sent
    /// again, it may or may not have run. Hand a host [`NOT_REISSUED_SENSE`].
    #[error("command {opcode:#04x} was in flight when the connection ended ({lost}); not idempotent, so not sent again")]
    NotReissued { opcode: u8, lost: ConnectionError },
    /// No new connection within [`Config::recovery_timeout`] after `lost`.
    #[error("no new connection within {after:?} (connection lost: {lost})")]
    RecoveryTimedOut {
        after: Duration,
        lost: ConnectionError,
    },
    /// The driver gave up re-making the task's data ([`Session::withdraw`]).
    #[error("withdrawn by the driver before it was sent again")]
    Withdrawn,
}

/// How a submitted command ended.
pub type SessionResult = Result<Completion, Failure>;

/// Why [`Session::submit`] refused a command.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SubmitError {
    /// No connection, and no recovery (or the session ended).
    #[error(transparent)]
    Closed(ConnectionError),
    /// The target asked for a logout (AsyncEvent 1), or the connection ended with it, and
    /// there is no recovery to wait for.
    #[error("the target requested a logout")]
    LogoutRequested,
    /// The connection was lost and none came within [`Config::recovery_timeout`].
    #[error("no new connection within {after:?} (connection lost: {lost})")]
    RecoveryTimedOut {
        after: Duration,
        lost: ConnectionError,
    },
    /// More than 4 GiB, the reserved ITT, or an ITT in use.
    #[error("invalid command")]
    Invalid,
}

/// Why a submission finds no connection: the connection's end, or the logout the target
/// asked for (AsyncEvent 1: the caller opens a new session).
fn closed(e: ConnectionError) -> SubmitError {
    if e.reason == CloseReason::LogoutRequested {
        SubmitError::LogoutRequested
    } else {
        SubmitError::Closed(e)
    }
}

/// What the driver must act on.
#[derive(Debug)]
pub enum Event {
    /// A submitted command ended: exactly one per accepted submission, whatever the number
    /// of connections it took.
    Completed { itt: u32, result: SessionResult },
    /// Task `itt` was in flight at a loss and goes again on the new connection: sent now,
    /// or (a bound task) once the driver gives its data again after the [`Event::Rebind`]
    /// that follows.
    Reissued { itt: u32 },
    /// Task `itt` ([`Binding::Bound`]) goes again on the new connection: make its data for
    /// it and hand it to [`Session::resubmit`] (or give up with [`Session::withdraw`]).
    Rebind { itt: u32 },
    /// The answer to [`Session::abort`] or [`Session::lun_reset`].
    TaskManagement { itt: u32, response: TmfResponse },
    /// The target asked for a logout (AsyncEvent 1) within this many seconds.
    LogoutRequested { within_secs: u16 },
    /// The target rejected a PDU that was not a command.
    Rejected {
        reason: RejectReason,
        opcode: Opcode,
    },
    /// A command passed its timeout and the connection took this step to end it.
    TimeoutStep { itt: u32, step: TimeoutStep },
    /// The current connection ended (every task it ended has its `Completed`, or is kept
    /// for the next connection, before this). With recovery on, make a new one and
    /// [`Session::attach`] it.
    ConnectionClosed(ConnectionError),
}

/// Where a task is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Submitted to the current connection.
    OnConnection,
    /// No connection to send it on: waits for [`Session::attach`]. `sent`: the target may
    /// have seen it on an earlier connection.
    Kept { sent: bool },
    /// Attached, waiting for [`Session::resubmit`] with its data.
    Rebinding { sent: bool },
}

/// What a reissue sends again.
#[derive(Debug)]
enum Kept {
    None,
    Read(u32),
    Discard(u32),
    Write(Bytes),
    WriteParts(Bytes, Bytes),
}

#[derive(Debug)]
struct Task {
    lun: u64,
    cdb: [u8; 16],
    data: Kept,
    timed: bool,
    binding: Binding,
    state: State,
    /// An ABORT TASK was asked for it: it is not sent again.
    abort_asked: bool,
    /// Submission order: reissues go in the order the caller submitted.
    order: u64,
}

/// The session: a task table and the current connection.
#[derive(Debug)]
pub struct Session {
    cfg: Config,
    conn: Connection,
    /// Connections attached after the first.
    generation: u64,
    tasks: OwnTagMap<Task>,
    next_order: u64,
    /// Since when there is no live connection, and why.
    lost: Option<(Instant, ConnectionError)>,
    /// The recovery timeout passed for `lost`.
    expired: bool,
    /// A logout was asked: the connection's end is the session's.
    logging_out: bool,
    /// The session is over (see [`Session::end`]).
    ended: Option<ConnectionError>,
    /// ITTs while no connection is live (carried over to the next one).
    itt: TagAllocator,
    events: VecDeque<Event>,
}

impl Session {
    /// A session over its first connection (fresh from login).
    #[must_use]
    pub fn new(cfg: Config, conn: Connection) -> Self {
        Self {
            cfg,
            itt: TagAllocator::starting_at(conn.next_itt()),
            conn,
            generation: 0,
            tasks: OwnTagMap::default(),
            next_order: 0,
            lost: None,
            expired: false,
            logging_out: false,
            ended: None,
            events: VecDeque::new(),
        }
    }

    // ---- getters ----

    /// The current connection (possibly closed).
    #[must_use]
    pub fn connection(&self) -> &Connection {
        &self.conn
    }

    /// How many connections were attached after the first.
    #[must_use]
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// The negotiated values of the current connection's login.
    #[must_use]
    pub fn params(&self) -> &SessionParams {
        self.conn.params()
    }

    /// Commands submitted and not completed, on the connection or kept.
    #[must_use]
    pub fn tasks_in_flight(&self) -> usize {
        self.tasks.len()
    }

    /// Commands kept for the next connection (or waiting for their data again).
    #[must_use]
    pub fn tasks_kept(&self) -> usize {
        self.tasks
            .values()
            .filter(|t| t.state != State::OnConnection)
            .count()
    }

    /// Why the session has no live connection, when it has none.
    #[must_use]
    pub fn lost(&self) -> Option<ConnectionError> {
        self.lost.map(|(_, e)| e)
    }

    /// Whether the session ended ([`Session::end`], a logout, or a loss without recovery).
    #[must_use]
    pub fn ended(&self) -> Option<ConnectionError> {
        self.ended
    }

    /// Whether the recovery timeout passed without a new connection.
    #[must_use]
    pub fn recovery_expired(&self) -> bool {
        self.expired
    }

    /// Whether [`Session::poll_transmit`] has a PDU.
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        self.conn.has_transmit()
    }

    // ---- outputs ----

    /// The current connection's next PDU (see [`Connection::poll_transmit`]).
    pub fn poll_transmit(&mut self) -> Option<Pdu> {
        self.conn.poll_transmit()
    }

    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The connection's next deadline, or the recovery timeout's while detached.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        let recovery = match (self.lost, self.cfg.recovery_timeout) {
            (Some((since, _)), Some(limit)) if !self.expired && self.ended.is_none() => {
                Some(since + limit)
            }
            _ => None,
        };
        [self.conn.poll_timeout(), recovery]
            .into_iter()
            .flatten()
            .min()
    }

    // ---- inputs ----

    pub fn handle_pdu(&mut self, now: Instant, pdu: Pdu) {
        self.conn.handle_pdu(now, pdu);
        self.pump(now);
    }

    /// The current connection's [`Connection::take_spare_buffer`].
    pub fn take_spare_buffer(&mut self) -> Option<BytesMut> {
        self.conn.take_spare_buffer()
    }

    /// The current connection's [`Connection::lend_read_buffer`].
    pub fn lend_read_buffer(&mut self, itt: u32, offset: u32, len: usize) -> Option<BytesMut> {
        self.conn.lend_read_buffer(itt, offset, len)
    }

    /// [`Session::handle_pdu`] of a Data-In received in place
    /// ([`Connection::handle_placed_data_in`]).
    pub fn handle_placed_data_in(&mut self, now: Instant, pdu: Pdu, data: BytesMut) {
        self.conn.handle_placed_data_in(now, pdu, data);
        self.pump(now);
    }

    pub fn handle_timeout(&mut self, now: Instant) {
        self.conn.handle_timeout(now);
        self.pump(now);
        if let (Some((since, lost)), Some(limit)) = (self.lost, self.cfg.recovery_timeout) {
            if !self.expired && self.ended.is_none() && now >= since + limit {
                self.expired = true;
                let failure = Failure::RecoveryTimedOut { after: limit, lost };
                for itt in self.kept_in_order() {
                    self.complete(itt, Err(failure.clone()));
                }
            }
        }
    }

    /// The stream could not be decoded: the connection is over.
    pub fn handle_wire_error(&mut self, now: Instant) {
        self.conn.handle_wire_error(now);
        self.pump(now);
    }

    /// The target closed the connection.
    pub fn peer_closed(&mut self, now: Instant) {
        self.conn.peer_closed();
        self.pump(now);
    }

    /// The driver ends the current connection (socket error, Seal failure, ...); with
    /// recovery on, its tasks are kept as for any loss.
    pub fn close(&mut self, now: Instant, by: Side, reason: CloseReason) {
        self.conn.close(by, reason);
        self.pump(now);
    }

    // ---- role methods ----

    /// A fresh ITT, for a driver that binds data to it before submitting (Seal, an
    /// observer): unique within the session across its connections.
    pub fn alloc_itt(&mut self) -> u32 {
        if self.conn.closed().is_none() {
            return self.conn.alloc_itt();
        }
        loop {
            let itt = self.itt.next_tag();
            if !self.tasks.contains_key(&itt) {
                return itt;
            }
        }
    }

    /// Submits a command under a fresh ITT ([`Binding::Free`]).
    pub fn submit(&mut self, now: Instant, cmd: Command) -> Result<u32, SubmitError> {
        let itt = self.alloc_itt();
        self.submit_as(now, itt, cmd, Binding::Free)
    }

    /// Submits a command under `itt` (from [`Session::alloc_itt`]). It goes to the current
    /// connection; while there is none and recovery is on, it waits for the next one.
    pub fn submit_as(
        &mut self,
        now: Instant,
        itt: u32,
        cmd: Command,
        binding: Binding,
    ) -> Result<u32, SubmitError> {
        if let Some(e) = self.ended {
            return Err(closed(e));
        }
        if itt == RESERVED_TAG || self.tasks.contains_key(&itt) {
            return Err(SubmitError::Invalid);
        }
        let recovery = self.cfg.recovery_timeout.is_some();
        if cmd
            .data
            .write_len()
            .is_some_and(|n| u32::try_from(n).is_err())
        {
            return Err(SubmitError::Invalid);
        }
        // What a reissue needs. Without recovery nothing is kept: no reference to the
        // caller's buffer outlives the connection's. A bound write's data is made again
        // ([`Event::Rebind`]).
        let free = recovery && binding == Binding::Free;
        let data = match &cmd.data {
            Data::Read { len, .. } => Kept::Read(*len),
            Data::Discard { len } => Kept::Discard(*len),
            Data::Write(b) if free => Kept::Write(b.clone()),
            Data::WriteParts { data, tail } if free => Kept::WriteParts(data.clone(), tail.clone()),
            Data::None | Data::Write(_) | Data::WriteParts { .. } => Kept::None,
        };
        let (lun, cdb, timed) = (cmd.lun, cmd.cdb, cmd.timed);
        let live = self.conn.closed().is_none() && !self.conn.logout_requested();
        let state = if live {
            match self.conn.submit_as(now, itt, cmd) {
                Ok(_) => State::OnConnection,
                Err(ConnSubmitError::Invalid) => return Err(SubmitError::Invalid),
                // Not live after all: the checks above cover these.
                Err(ConnSubmitError::Closed(e)) => return Err(SubmitError::Closed(e)),
                Err(ConnSubmitError::LogoutRequested) => return Err(SubmitError::LogoutRequested),
            }
        } else {
            if !recovery || self.logging_out {
                return Err(self
                    .conn
                    .closed()
                    .map_or(SubmitError::LogoutRequested, closed));
            }
            if self.expired {
                if let (Some((_, lost)), Some(after)) = (self.lost, self.cfg.recovery_timeout) {
                    return Err(SubmitError::RecoveryTimedOut { after, lost });
                }
            }
            // Kept for the next connection; a bound command's data is made again for it.
            State::Kept { sent: false }
        };
        let order = self.next_order;
        self.next_order += 1;
        self.tasks.insert(
            itt,
            Task {
                lun,
                cdb,
                data,
                timed,
                binding,
                state,
                abort_asked: false,
                order,
            },
        );
        self.pump(now);
        Ok(itt)
    }

    /// The data of a [`Event::Rebind`] task, made for the current connection: it is sent.
    /// `Invalid` when the task is not waiting for it (ended, or its connection was lost
    /// meanwhile: another `Rebind` comes with the next connection).
    pub fn resubmit(&mut self, now: Instant, itt: u32, data: Data) -> Result<(), SubmitError> {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return Err(SubmitError::Invalid);
        };
        let State::Rebinding { sent } = t.state else {
            return Err(SubmitError::Invalid);
        };
        if self.conn.closed().is_some() {
            // Lost again meanwhile: it waits for the next connection.
            t.state = State::Kept { sent };
            return Ok(());
        }
        let cmd = Command {
            lun: t.lun,
            cdb: t.cdb,
            data,
            timed: t.timed,
        };
        match self.conn.submit_as(now, itt, cmd) {
            Ok(_) => t.state = State::OnConnection,
            Err(_) => t.state = State::Kept { sent },
        }
        self.pump(now);
        Ok(())
    }

    /// Ends a task that is not on a connection (kept, or waiting for its data again) with
    /// [`Failure::Withdrawn`]: the driver could not make its data again. False if it is not
    /// such a task.
    pub fn withdraw(&mut self, itt: u32) -> bool {
        if self
            .tasks
            .get(&itt)
            .is_some_and(|t| t.state != State::OnConnection)
        {
            self.complete(itt, Err(Failure::Withdrawn));
            return true;
        }
        false
    }

    /// ABORT TASK for `itt` (RFC 7143 §11.5.1). A task not on a connection (kept for the
    /// next one) ends at once with [`AbortedBy::AbortTask`]; one on the connection gets the
    /// request and is not sent again if the connection ends before the answer. Returns the
    /// TMF's ITT when a request went out.
    pub fn abort(&mut self, now: Instant, itt: u32) -> Option<u32> {
        let t = self.tasks.get_mut(&itt)?;
        t.abort_asked = true;
        if t.state != State::OnConnection {
            self.complete(
                itt,
                Err(Failure::Task(TaskError::Aborted(AbortedBy::AbortTask))),
            );
            return None;
        }
        let r = self.conn.abort(now, itt);
        self.pump(now);
        r
    }

    /// LOGICAL UNIT RESET of `lun` on the current connection (§11.5.1); `None` without one.
    pub fn lun_reset(&mut self, now: Instant, lun: u64) -> Option<u32> {
        if self.conn.closed().is_some() {
            return None;
        }
        let r = self.conn.lun_reset(now, lun);
        self.pump(now);
        Some(r)
    }

    /// Logout closing the session (§11.14): its end is the session's, nothing is kept.
    pub fn logout(&mut self, now: Instant) -> Option<u32> {
        self.logging_out = true;
        let r = self.conn.logout(now);
        self.pump(now);
        if r.is_none() {
            // No connection to log out of: the session ends here.
            let e = self.lost().unwrap_or(ConnectionError {
                by: Side::Initiator,
                reason: CloseReason::Logout,
            });
            self.end(now, e);
        }
        r
    }

    /// Ends the session for good (dropped, or recovery refused): the connection closes and
    /// every unfinished task ends with [`TaskError::ConnectionLost`]`(e)`.
    pub fn end(&mut self, now: Instant, e: ConnectionError) {
        self.logging_out = true;
        self.conn.close(e.by, e.reason);
        self.pump(now);
        if self.ended.is_none() {
            self.ended = Some(e);
        }
        for itt in self.kept_in_order() {
            self.complete(itt, Err(Failure::Task(TaskError::ConnectionLost(e))));
        }
    }

    /// A new connection after the driver's reinstating login (RFC 7143 §6.3.5): kept tasks
    /// go on it, in the order they were submitted, under their ITTs; bound ones after an
    /// [`Event::Rebind`]. The old connection, if still live, is closed first.
    pub fn attach(&mut self, now: Instant, conn: Connection) {
        self.attach_quiet(now, conn);
        self.reissue(now);
    }

    /// [`Session::attach`] without sending the kept tasks yet: new submissions go on the
    /// connection, kept tasks wait for [`Session::reissue`]. A driver clears the unit
    /// attention a reinstated nexus may report (SAM-5 §5.14) in between, as a host's SCSI
    /// layer would, so the reissued commands see only their own status.
    pub fn attach_quiet(&mut self, now: Instant, conn: Connection) {
        if self.ended.is_some() {
            return;
        }
        if self.conn.closed().is_none() {
            self.conn.close(Side::Initiator, CloseReason::Local);
            self.pump(now);
        }
        let next = if self.lost.is_some() {
            self.itt.peek()
        } else {
            self.conn.next_itt()
        };
        self.conn = conn;
        self.conn.set_next_itt(next);
        self.generation += 1;
        self.lost = None;
        self.expired = false;
        for itt in self.kept_in_order() {
            self.conn.reserve_itt(itt);
        }
    }

    /// Sends the kept tasks on the connection attached with [`Session::attach_quiet`].
    pub fn reissue(&mut self, now: Instant) {
        if self.conn.closed().is_some() {
            return;
        }
        for itt in self.kept_in_order() {
            let Some(t) = self.tasks.get_mut(&itt) else {
                continue;
            };
            let sent = match t.state {
                State::Kept { sent } => sent,
                State::Rebinding { .. } | State::OnConnection => continue,
            };
            if t.binding == Binding::Bound {
                t.state = State::Rebinding { sent };
                // Decided here: counted now, not when the driver's data comes.
                if sent {
                    self.events.push_back(Event::Reissued { itt });
                }
                self.events.push_back(Event::Rebind { itt });
                continue;
            }
            // A free write's data is always kept with recovery on (a bound one took the
            // `Rebind` path above), so `Kept::None` is a command without data.
            let data = match &t.data {
                Kept::None => Data::None,
                // The first buffer went with the first connection's answer; a reissue
                // allocates (only on this path).
                Kept::Read(len) => Data::Read {
                    buf: BytesMut::new(),
                    len: *len,
                },
                Kept::Discard(len) => Data::Discard { len: *len },
                Kept::Write(b) => Data::Write(b.clone()),
                Kept::WriteParts(data, tail) => Data::WriteParts {
                    data: data.clone(),
                    tail: tail.clone(),
                },
            };
            let cmd = Command {
                lun: t.lun,
                cdb: t.cdb,
                data,
                timed: t.timed,
            };
            if self.conn.submit_as(now, itt, cmd).is_ok() {
                t.state = State::OnConnection;
                if sent {
                    self.events.push_back(Event::Reissued { itt });
                }
            }
        }
        self.pump(now);
    }

    // ---- internals ----

    /// Kept and rebinding tasks, in submission order.
    fn kept_in_order(&self) -> Vec<u32> {
        let mut v: Vec<(u64, u32)> = self
            .tasks
            .iter()
            .filter(|(_, t)| t.state != State::OnConnection)
            .map(|(i, t)| (t.order, *i))
            .collect();
        v.sort_unstable();
        v.into_iter().map(|(_, i)| i).collect()
    }

    fn complete(&mut self, itt: u32, result: SessionResult) {
        if self.tasks.remove(&itt).is_some() {
            self.events.push_back(Event::Completed { itt, result });
        }
    }

    /// The connection's events, through the session's policy.
    fn pump(&mut self, now: Instant) {
        while let Some(ev) = self.conn.poll_event() {
            match ev {
                initiator::Event::Completed {
                    itt,
                    result: Err(TaskError::ConnectionLost(e)),
                } => self.on_lost(itt, e),
                initiator::Event::Completed { itt, result } => {
                    self.complete(itt, result.map_err(Failure::Task));
                }
                initiator::Event::Closed(e) => {
                    // Data made for this connection is no good for the next: asked again.
                    for t in self.tasks.values_mut() {
                        if let State::Rebinding { sent } = t.state {
                            t.state = State::Kept { sent };
                        }
                    }
                    if self.lost.is_none() {
                        self.lost = Some((now, e));
                        self.itt = TagAllocator::starting_at(self.conn.next_itt());
                    }
                    if self.cfg.recovery_timeout.is_none() || self.logging_out {
                        self.ended.get_or_insert(e);
                        for itt in self.kept_in_order() {
                            self.complete(itt, Err(Failure::Task(TaskError::ConnectionLost(e))));
                        }
                    }
                    self.events.push_back(Event::ConnectionClosed(e));
                }
                initiator::Event::TaskManagement { itt, response } => {
                    self.events
                        .push_back(Event::TaskManagement { itt, response });
                }
                initiator::Event::LogoutRequested { within_secs } => {
                    self.events
                        .push_back(Event::LogoutRequested { within_secs });
                }
                initiator::Event::Rejected { reason, opcode } => {
                    self.events.push_back(Event::Rejected { reason, opcode });
                }
                initiator::Event::TimeoutStep { itt, step } => {
                    self.events.push_back(Event::TimeoutStep { itt, step });
                }
                // ErrorRecoveryLevel 2 is the session of several connections' (`engine::mcs`);
                // this session never holds tasks or reassigns them.
                initiator::Event::Reassigned { .. } | initiator::Event::RecoveryLogout { .. } => {}
            }
        }
    }

    /// Task `itt` ended with its connection: keep it for the next one, or end it.
    fn on_lost(&mut self, itt: u32, e: ConnectionError) {
        let never_sent = self.conn.never_sent(itt);
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        let recovery = self.cfg.recovery_timeout.is_some() && !self.logging_out;
        let result = if !recovery {
            Err(Failure::Task(TaskError::ConnectionLost(e)))
        } else if t.abort_asked {
            // The caller wanted it gone; the target ends it with the old session.
            Err(Failure::Task(TaskError::Aborted(AbortedBy::AbortTask)))
        } else if never_sent {
            // The target never saw it: it goes on the next connection whatever it does.
            t.state = State::Kept { sent: false };
            return;
        } else if (self.cfg.idempotent)(t.cdb[0]) {
            t.state = State::Kept { sent: true };
            return;
        } else {
            // It may or may not have run: sending it again could run it twice.
            Err(Failure::NotReissued {
                opcode: t.cdb[0],
                lost: e,
            })
        };
        self.complete(itt, result);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::initiator::Config as ConnConfig;
    use iscsi_wire::header::ScsiResponse;
    use iscsi_wire::Header;

    fn conn(now: Instant, cmd_sn: u32, window: u32) -> Connection {
        let mut cfg = ConnConfig::new(
            SessionParams::default(),
            cmd_sn,
            cmd_sn.wrapping_add(window - 1),
            1,
        );
        cfg.nop_interval = None;
        Connection::new(cfg, now)
    }

    /// Recovery on, with the SCSI layer's reissue policy as ipsan's initiator passes it.
    fn recovering(limit: Duration) -> Config {
        Config {
            recovery_timeout: Some(limit),
            idempotent: ipsan_scsi::cdb::is_idempotent,
        }
    }

    fn read(op: u8, len: u32) -> Command {
        cmd(
            op,
            Data::Read {
                buf: BytesMut::new(),
                len,
            },
        )
    }

    fn cmd(op: u8, data: Data) -> Command {
        let mut cdb = [0u8; 16];
        cdb[0] = op;
        Command {
            lun: 0,
            cdb,
            data,
            timed: false,
        }
    }

    /// The (ITT, opcode) of every SCSI Command PDU queued.
    fn commands_sent(s: &mut Session) -> Vec<(u32, u8)> {
        std::iter::from_fn(|| s.poll_transmit())
            .filter_map(|p| match p.header {
                Header::ScsiCommand(c) => Some((c.itt, c.cdb[0])),
                _ => None,
            })
            .collect()
    }

    fn completed(s: &mut Session) -> Vec<(u32, SessionResult)> {
        std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                Event::Completed { itt, result } => Some((itt, result)),
                _ => None,
            })
            .collect()
    }

    const LOST: ConnectionError = ConnectionError {
        by: Side::Target,
        reason: CloseReason::PeerClosed,
    };

    #[test]
    fn rejects_reissuing_a_sent_read_without_a_policy_that_calls_it_idempotent() {
        assert_eq!(NOT_REISSUED_SENSE, (0x0B, 0x4B, 0x07));
        let t0 = Instant::now();
        let cfg = Config {
            recovery_timeout: Some(Duration::from_secs(60)),
            ..Config::default()
        };
        let mut s = Session::new(cfg, conn(t0, 1, 8));
        let r = s.submit(t0, read(0x88, 512)).unwrap();
        assert_eq!(commands_sent(&mut s), vec![(r, 0x88)]);
        s.peer_closed(t0);
        assert_eq!(
            completed(&mut s),
            vec![(
                r,
                Err(Failure::NotReissued {
                    opcode: 0x88,
                    lost: LOST
                })
            )],
            "the engine decides nothing about CDBs: the default policy reissues nothing sent"
        );
        assert_eq!(s.tasks_kept(), 0);
    }

    #[test]
    fn compare_and_write_in_flight_at_a_loss_is_not_sent_again_but_a_read_is() {
        let t0 = Instant::now();
        let mut s = Session::new(recovering(Duration::from_secs(60)), conn(t0, 1, 8));
        let caw = s
            .submit(t0, cmd(0x89, Data::Write(Bytes::from_static(&[7; 1024]))))
            .unwrap();
        let read = s.submit(t0, read(0x88, 512)).unwrap();
        assert_eq!(commands_sent(&mut s), vec![(caw, 0x89), (read, 0x88)]);
        s.peer_closed(t0);
        let done = completed(&mut s);
        assert_eq!(
            done,
            vec![(
                caw,
                Err(Failure::NotReissued {
                    opcode: 0x89,
                    lost: LOST
                })
            )],
            "the COMPARE AND WRITE ends at the loss; the read waits"
        );
        assert_eq!(s.tasks_kept(), 1);
        s.attach(t0, conn(t0, 100, 8));
        assert_eq!(
            commands_sent(&mut s),
            vec![(read, 0x88)],
            "only the read goes again, under its ITT"
        );
        let reissued: Vec<u32> = std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                Event::Reissued { itt } => Some(itt),
                _ => None,
            })
            .collect();
        assert_eq!(reissued, vec![read]);
        let mut resp = ScsiResponse {
            itt: read,
            stat_sn: 1,
            exp_cmd_sn: 101,
            max_cmd_sn: 108,
            ..ScsiResponse::default()
        };
        resp.underflow = true;
        resp.residual_count = 512;
        s.handle_pdu(t0, Pdu::new(resp, Bytes::new()));
        assert!(matches!(&completed(&mut s)[..], [(i, Ok(_))] if *i == read));
        assert_eq!(s.tasks_in_flight(), 0);
    }

    #[test]
    fn a_command_that_never_left_goes_on_the_next_connection_whatever_it_is() {
        let t0 = Instant::now();
        // MaxCmdSN admits one: the COMPARE AND WRITE waits for the window.
        let mut s = Session::new(recovering(Duration::from_secs(60)), conn(t0, 1, 1));
        let first = s.submit(t0, cmd(0x00, Data::None)).unwrap();
        let caw = s
            .submit(t0, cmd(0x89, Data::Write(Bytes::from_static(&[1; 1024]))))
            .unwrap();
        assert_eq!(commands_sent(&mut s), vec![(first, 0x00)]);
        s.close(t0, Side::Initiator, CloseReason::Local);
        assert!(completed(&mut s).is_empty());
        s.attach(t0, conn(t0, 50, 8));
        assert_eq!(commands_sent(&mut s), vec![(first, 0x00), (caw, 0x89)]);
        let reissued = std::iter::from_fn(|| s.poll_event())
            .filter(|e| matches!(e, Event::Reissued { .. }))
            .count();
        assert_eq!(
            reissued, 1,
            "the COMPARE AND WRITE was never sent: no reissue"
        );
    }

    #[test]
    fn kept_tasks_end_with_recovery_timed_out_when_no_connection_comes() {
        let t0 = Instant::now();
        let limit = Duration::from_secs(5);
        let mut s = Session::new(recovering(limit), conn(t0, 1, 8));
        let a = s.submit(t0, cmd(0x00, Data::None)).unwrap();
        commands_sent(&mut s);
        let t1 = t0 + Duration::from_secs(1);
        s.peer_closed(t1);
        assert_eq!(s.poll_timeout(), Some(t1 + limit));
        // Submitted while detached: kept too.
        let b = s.submit(t1, read(0x28, 512)).unwrap();
        assert_ne!(a, b);
        s.handle_timeout(t1 + limit - Duration::from_millis(1));
        assert!(completed(&mut s).is_empty());
        s.handle_timeout(t1 + limit);
        let want = Failure::RecoveryTimedOut {
            after: limit,
            lost: LOST,
        };
        assert_eq!(
            completed(&mut s),
            vec![(a, Err(want.clone())), (b, Err(want))]
        );
        assert!(matches!(
            s.submit(t1 + limit, cmd(0x00, Data::None)),
            Err(SubmitError::RecoveryTimedOut { .. })
        ));
        // A later connection serves new commands again.
        s.attach(t1 + limit, conn(t1 + limit, 9, 8));
        let c = s.submit(t1 + limit, cmd(0x00, Data::None)).unwrap();
        assert_eq!(commands_sent(&mut s), vec![(c, 0x00)]);
        assert_eq!(s.tasks_in_flight(), 1);
    }

    #[test]
    fn without_recovery_every_task_ends_with_the_connection() {
        let t0 = Instant::now();
        let mut s = Session::new(Config::default(), conn(t0, 1, 8));
        let a = s.submit(t0, read(0x88, 512)).unwrap();
        s.peer_closed(t0);
        assert_eq!(
            completed(&mut s),
            vec![(a, Err(Failure::Task(TaskError::ConnectionLost(LOST))))]
        );
        assert_eq!(s.ended(), Some(LOST));
        assert!(matches!(
            s.submit(t0, cmd(0x00, Data::None)),
            Err(SubmitError::Closed(_))
        ));
    }

    #[test]
    fn without_recovery_a_logout_the_target_asked_for_refuses_new_commands_as_such() {
        let t0 = Instant::now();
        let mut s = Session::new(Config::default(), conn(t0, 1, 8));
        s.close(t0, Side::Initiator, CloseReason::LogoutRequested);
        assert_eq!(
            s.submit(t0, cmd(0x00, Data::None)),
            Err(SubmitError::LogoutRequested)
        );
    }

    #[test]
    fn a_bound_task_asks_for_its_data_again_and_keeps_its_itt() {
        let t0 = Instant::now();
        let mut s = Session::new(recovering(Duration::from_secs(60)), conn(t0, 1, 8));
        let itt = s.alloc_itt();
        s.submit_as(
            t0,
            itt,
            cmd(0x8a, Data::Write(Bytes::from_static(b"sealed-under-key-1"))),
            Binding::Bound,
        )
        .unwrap();
        commands_sent(&mut s);
        s.peer_closed(t0);
        s.attach(t0, conn(t0, 1, 8));
        assert!(
            commands_sent(&mut s).is_empty(),
            "a bound task waits for its data"
        );
        let asked: Vec<u32> = std::iter::from_fn(|| s.poll_event())
            .filter_map(|e| match e {
                Event::Rebind { itt } => Some(itt),
                _ => None,
            })
            .collect();
        assert_eq!(asked, vec![itt]);
        s.resubmit(
            t0,
            itt,
            Data::Write(Bytes::from_static(b"sealed-under-key-2")),
        )
        .unwrap();
        let pdus: Vec<Pdu> = std::iter::from_fn(|| s.poll_transmit()).collect();
        assert_eq!(pdus[0].header.itt(), itt);
        assert_eq!(&pdus[0].data[..], b"sealed-under-key-2");
        // The new connection's own tags never collide with a kept task's.
        let other = s.alloc_itt();
        assert_ne!(other, itt);
    }

    #[test]
    fn an_aborted_kept_task_ends_at_once_and_is_not_sent() {
        let t0 = Instant::now();
        let mut s = Session::new(recovering(Duration::from_secs(60)), conn(t0, 1, 8));
        let a = s.submit(t0, read(0x28, 512)).unwrap();
        commands_sent(&mut s);
        s.peer_closed(t0);
        assert_eq!(s.abort(t0, a), None);
        assert_eq!(
            completed(&mut s),
            vec![(
                a,
                Err(Failure::Task(TaskError::Aborted(AbortedBy::AbortTask)))
            )]
        );
        s.attach(t0, conn(t0, 1, 8));
        assert!(commands_sent(&mut s).is_empty());
        assert_eq!(s.tasks_in_flight(), 0);
    }

    #[test]
    fn attach_quiet_lets_a_command_go_before_the_kept_ones() {
        let t0 = Instant::now();
        let mut s = Session::new(recovering(Duration::from_secs(60)), conn(t0, 1, 8));
        let read = s.submit(t0, read(0x88, 512)).unwrap();
        commands_sent(&mut s);
        s.peer_closed(t0);
        s.attach_quiet(t0, conn(t0, 1, 8));
        let tur = s.submit(t0, cmd(0x00, Data::None)).unwrap();
        assert_ne!(tur, read, "the kept task's ITT is reserved");
        assert_eq!(commands_sent(&mut s), vec![(tur, 0x00)]);
        s.reissue(t0);
        assert_eq!(commands_sent(&mut s), vec![(read, 0x88)]);
    }

    #[test]
    fn a_rebind_outstanding_when_the_connection_is_lost_is_asked_again_on_the_next() {
        let t0 = Instant::now();
        let mut s = Session::new(recovering(Duration::from_secs(60)), conn(t0, 1, 8));
        let itt = s.alloc_itt();
        let w = cmd(0x8a, Data::Write(Bytes::from_static(b"key-1")));
        s.submit_as(t0, itt, w, Binding::Bound).unwrap();
        s.peer_closed(t0);
        s.attach(t0, conn(t0, 1, 8));
        s.peer_closed(t0);
        // Made for the connection that is gone: refused.
        assert_eq!(
            s.resubmit(t0, itt, Data::Write(Bytes::from_static(b"key-2"))),
            Err(SubmitError::Invalid)
        );
        while s.poll_event().is_some() {}
        s.attach(t0, conn(t0, 1, 8));
        let asked = std::iter::from_fn(|| s.poll_event())
            .filter(|e| matches!(e, Event::Rebind { itt: i } if *i == itt))
            .count();
        assert_eq!(asked, 1);
        s.resubmit(t0, itt, Data::Write(Bytes::from_static(b"key-3")))
            .unwrap();
        let p = s.poll_transmit().unwrap();
        assert_eq!(&p.data[..], b"key-3");
    }

    #[test]
    fn itts_continue_across_connections() {
        let t0 = Instant::now();
        let mut s = Session::new(recovering(Duration::from_secs(60)), conn(t0, 1, 8));
        let a = s.submit(t0, cmd(0x00, Data::None)).unwrap();
        s.peer_closed(t0);
        let b = s.alloc_itt();
        s.attach(t0, conn(t0, 1, 8));
        let c = s.alloc_itt();
        assert!(a < b && b < c, "{a} {b} {c}");
    }
}
