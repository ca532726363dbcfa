//! The tokio session runtime: login, then the full feature phase driven through the sans-IO
//! engine: `iscsi_proto::engine::session` (the task table that outlives a connection, ITTs
//! unique across connections, session recovery's reissue policy) over
//! `iscsi_proto::engine::initiator` (CmdSN window, immediate and unsolicited data, R2T
//! checking and answering, Data-In reassembly, task management, NOP-Out keepalive, logout).
//! This module does sockets, timers, reconnect backoff and waking callers; what the protocol
//! decides is decided in the engine, and the login and discovery PDUs are built and read by
//! iscsi-proto's `LoginExchange` and `Discovery`.
//!
//! # Files
//! - this file: the session's types (config, the engine session behind its lock, a
//!   connection's state, the link a recovering session swaps connections on) and the
//!   dispatch of engine events to waiting callers.
//! - `login.rs`: TCP connect, the login exchange over the socket, a logged-in connection's
//!   engine connection and tasks. `discover.rs`: SendTargets discovery.
//! - `open.rs`: open/connect, what a session reports, which connection a command goes to,
//!   logout. `io.rs`: commands (the payload transform around each), the SCSI helpers,
//!   submission and waiting. `passthrough.rs`: any CDB, answered unchanged.
//! - `mcs.rs`: [`McsSession`], a session of several connections over `engine::mcs` (its own
//!   driver: no session recovery, ErrorRecoveryLevel 2's connection recovery, no observer
//!   yet); `mcs/` holds its concerns (`dispatch.rs`, `command.rs`, `conns.rs`, `relogin.rs`).
//! - `reconnect.rs`: the recovery supervisor. `framed.rs`: the reader, writer and timer tasks
//!   over `ipsan-transport`'s framed halves (the target's framing, not a copy).
//!
//! # Shape
//! ```text
//!  callers ──command──► [Mutex<engine session>] submit (ITT; queued until MaxCmdSN allows)
//!                          │ poll_transmit                      ▲ handle_pdu
//!                          ▼                                    │
//!                     writer task ──► socket ──► ... ──► reader task (framed read)
//!                     timer task: handle_timeout (keepalive, command and TMF timeouts)
//!  engine events ──► waiting callers (completion, TMF answer, connection end)
//! ```
//! One framed read (`reader`, over `ipsan_transport::FrameReader`) and one framed write
//! (`writer`, over `ipsan_transport::FrameWriter`) per connection: where the Seal record step
//! sits (docs/seal.md §4a), the same code as the target's. Kamisaka et al. overlap round trips with forked
//! processes each doing one synchronous command; here any number of tasks share one session,
//! each command tagged by its ITT, and the target's MaxCmdSN is the only limit.
//!
//! Connection loss: whoever notices first (reader EOF, writer error, the engine's keepalive or
//! a rule the target broke) records the reason once and the engine connection ends. Without
//! [`SessionConfig::recovery_timeout`] every command in flight fails with
//! [`Error::ConnectionLost`] and that reason. With it, the engine session keeps the commands
//! in flight, a supervisor task (`supervise`) makes a new connection (a reinstating login,
//! RFC 7143 §6.3.5) and attaches it to the engine session, which sends the idempotent ones
//! again under their ITTs and fails the others with [`Error::NotReissued`]
//! ([`crate::recovery`]); sealed write data is sealed again under the new keys when the engine
//! asks (`Rebind`). A session is one connection at a time, each with its own engine
//! connection and Seal keys.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use iscsi_proto::discovery::{self, Discovery, DiscoveryEvent};
use iscsi_proto::engine::initiator::{self as engine, AbortedBy, TaskError};
use iscsi_proto::engine::session::{self as proto, Binding, Failure};
use iscsi_proto::engine::{CloseReason, ConnectionError, OwnTagMap, Side};
use iscsi_proto::login::originator::{self, LoginDone, LoginExchange, LoginProgress};
use iscsi_proto::params::SessionParams;
use iscsi_wire::header::TmfResponse;
use iscsi_wire::{Codec, Header, Pdu};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{oneshot, watch, Notify};
use tokio::task::AbortHandle;
use tokio_util::sync::CancellationToken;

use crate::conn::Conn;
use crate::error::{ConnectionLoss, Error, IoOp, LocalClose, Result};
use crate::login::{LoginMachine, LoginOptions, Negotiated, OriginatorExtension, SessionKind};
use crate::observe::{self, CommandEvent, CommandObserver, Observer};
use crate::recovery::{self, Backoff, Counters, RecoveryStats};
use crate::scsi::{self, Capacity, Inquiry, Sense, SenseKey};
use crate::transform::{CommandInfo, PayloadTransform};
use crate::url::IscsiUrl;

mod discover;
mod framed;
mod io;
mod login;
mod mcs;
mod open;
mod passthrough;
mod reconnect;
mod sealed;

pub use discover::{discover, targets_json, DiscoveredTarget};
use framed::{reader, timer, writer};
use login::{codec_for, connect_and_login, connect_tcp, login, login_connection, Fresh};
pub use mcs::{McsConfig, McsRecovery, McsSession};
pub use passthrough::Passthrough;
use reconnect::supervise;

/// Session settings beyond the negotiated keys.
#[derive(Debug, Clone)]
pub struct SessionConfig {
    pub login: LoginOptions,
    pub connect_timeout: Duration,
    pub login_timeout: Duration,
    /// Send a NOP-Out when this long has passed since the last ping; `None` disables.
    pub nop_interval: Option<Duration>,
    /// A NOP-Out unanswered for this long fails the connection.
    pub nop_timeout: Duration,
    /// Makes a fresh login extension (e.g. Seal's key negotiation) for each login attempt.
    pub extension: Option<ExtensionFactory>,
    /// Socket settings for the connection (congestion control, buffers, Nagle), applied before
    /// connecting so the receive window scale fits (RFC 7323 §2.2). `None`: kernel defaults
    /// with TCP_NODELAY.
    pub tcp: Option<ipsan_tcp::TcpSettings>,
    /// A SCSI command without status after this long is aborted with ABORT TASK
    /// (RFC 7143 §11.5.1) and fails with [`Error::CommandTimedOut`]; if the target refuses
    /// the abort, a LOGICAL UNIT RESET follows; if that is refused too, or either goes
    /// unanswered for [`TMF_TIMEOUT`], the connection is dropped (its tasks cannot be
    /// trusted any more) and the command fails as a connection loss (with recovery on, it is
    /// sent again on the next connection when idempotent). The engine runs this escalation
    /// (`iscsi_proto::engine::initiator::Config::command_timeout`); the timer task only
    /// passes the time in. `None` waits forever (the keepalive still catches a dead
    /// connection); [`Session::command_to`] never times out. Default 30 s, the Linux SCSI
    /// disk default.
    pub command_timeout: Option<Duration>,
    /// Session recovery ([`crate::recovery`]): when the connection fails, reconnect and
    /// reinstate the session (RFC 7143 §6.3.5), send the commands in flight again (the
    /// idempotent ones) and let commands wait for up to this long for the new connection
    /// before they fail with [`Error::RecoveryTimedOut`]. `None` (the library default, so a
    /// caller opts in) fails every command at once with [`Error::ConnectionLost`]; the CLI's
    /// `--recovery-timeout` defaults to [`crate::recovery::DEFAULT_RECOVERY_TIMEOUT`] (120 s).
    pub recovery_timeout: Option<Duration>,
}

/// How long a task management request may go unanswered before the connection is dropped.
pub const TMF_TIMEOUT: Duration = Duration::from_secs(10);

/// A target that pings (NOP-In with a TTT, RFC 7143 §11.19) faster than it reads the answers
/// would grow the send queue without bound (a 128 MiB flood grew RSS by 132 MiB before this
/// cap, `robust_hostile_target::nop_in_flood_from_a_target_that_never_reads_stays_bounded`).
/// Past this many queued bytes the connection fails instead. A polite target has one ping
/// outstanding at a time.
const MAX_QUEUED_PONG_BYTES: usize = 1024 * 1024;

/// What may end a command before its status arrives.
#[derive(Clone, Copy)]
enum Until<'a> {
    /// Nothing: the caller waits for the status (a gateway's host times its commands out).
    Status,
    /// [`SessionConfig::command_timeout`]: past it, the engine aborts it (RFC 7143 §11.5.1).
    Timeout,
    /// The caller's token: once cancelled, ABORT TASK; a command not sent yet is not sent.
    Abort(&'a CancellationToken),
}

impl Until<'_> {
    /// Whether the engine times the command out ([`engine::Command::timed`]).
    fn timed(self) -> bool {
        matches!(self, Until::Timeout)
    }
}

/// Whether an ABORT TASK response means the task is gone and nothing more comes for it
/// (RFC 7143 §11.6.1: done, or the target no longer knew it).
fn ends_the_task(r: TmfResponse) -> bool {
    matches!(
        r,
        TmfResponse::FUNCTION_COMPLETE | TmfResponse::TASK_DOES_NOT_EXIST
    )
}

/// Builds an [`OriginatorExtension`] per login attempt (a retried login needs fresh state).
#[derive(Clone)]
pub struct ExtensionFactory(pub Arc<dyn Fn() -> Box<dyn OriginatorExtension> + Send + Sync>);

impl std::fmt::Debug for ExtensionFactory {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ExtensionFactory")
    }
}

impl Default for SessionConfig {
    fn default() -> Self {
        Self {
            login: LoginOptions::default(),
            connect_timeout: Duration::from_secs(10),
            login_timeout: Duration::from_secs(15),
            nop_interval: Some(Duration::from_secs(5)),
            nop_timeout: Duration::from_secs(10),
            extension: None,
            tcp: None,
            command_timeout: Some(Duration::from_secs(30)),
            recovery_timeout: None,
        }
    }
}

/// The result of a SCSI command that reached the target.
#[derive(Debug)]
pub struct Completion {
    pub status: u8,
    pub sense: Option<Sense>,
    /// Data-In, truncated by the residual count for an underflow.
    pub data: BytesMut,
    /// Residual count (positive: underflow, negative: overflow).
    pub residual: i64,
}

/// Direction and buffer of a command's data.
#[derive(Debug)]
pub enum DataDir {
    None,
    /// Expect this many bytes; the buffer is reused (resized, not reallocated when large
    /// enough). A read whose data arrives in one Data-In PDU of at least
    /// [`ipsan_transport::HAND_OVER_MIN`] bytes is answered in the buffer it was received in
    /// (no copy; its capacity is the receive buffer's), and this one receives later PDUs.
    Read(BytesMut, usize),
    /// Expect this many bytes and keep none of them (issue 27: `ipsan bench --sink discard`,
    /// the work libiscsi's `iscsi-perf` does): each Data-In is checked and counted as a
    /// read's and dropped as it arrives, received into one scratch buffer of the connection
    /// rather than a buffer per read (`iscsi_proto`'s `Data::Discard`). The completion's data
    /// is empty. Through a payload transform (a sealed session) the data is opened (checked)
    /// first, in a buffer of its own, then dropped.
    Discard(usize),
    Write(Bytes),
}

/// A command's end as a waiting caller receives it, or a request for its data again.
enum Done {
    /// The command ended; `transform`: the payload transform of the connection it ended on
    /// (Data-In is opened with it).
    Ended(Result<Passthrough>, Option<Arc<dyn PayloadTransform>>),
    /// Session recovery sends the command again and its data was made for the old connection
    /// (sealed under its keys): make it again with this transform
    /// (`iscsi_proto::engine::session::Event::Rebind`).
    Rebind(Option<Arc<dyn PayloadTransform>>),
}

/// What the driver's tasks share across the session's connections: the session engine
/// (`iscsi_proto::engine::session`: the task table, the current connection, the reissue
/// policy) and who waits for what.
struct Inner {
    session: proto::Session,
    /// Callers waiting for a command's end, by ITT (a task keeps its ITT across connections).
    /// With each, the generation of the connection it was registered on: a command that ends
    /// on that connection needs no transform from the completion (its caller has it).
    waiters: OwnTagMap<(oneshot::Sender<Done>, u64)>,
    /// Callers waiting for a task management response, by the TMF's ITT.
    tmf_waiters: OwnTagMap<oneshot::Sender<TmfResponse>>,
    /// Callers waiting for the connection's end (logout).
    closed_waiters: Vec<oneshot::Sender<()>>,
    /// The deadline the current connection's timer task sleeps until (`None`: until woken).
    timer_at: Option<Instant>,
    /// The driver's side of the engine's current connection.
    conn: Arc<ConnState>,
}

/// A session's state shared by its connections' tasks, its callers and its supervisor.
struct Core {
    inner: Mutex<Inner>,
    counters: Counters,
    /// Who watches each command's events, when asked for ([`Session::set_observer`]).
    observer: Arc<OnceLock<Observer>>,
    /// A reinstating login was refused for good: commands kept for recovery end with this.
    refused: OnceLock<(u8, &'static str)>,
}

/// One connection's side of the driver.
struct ConnState {
    /// This connection's number in the session (0: the first login; each recovery adds 1),
    /// equal to the engine session's `generation()` while it is the current one.
    generation: u64,
    /// PDUs are queued: the writer has work.
    wake_writer: Notify,
    /// The engine's next timeout may have moved earlier.
    wake_timer: Notify,
    /// Why the connection ended (first reason wins: the driver's for socket, framing and
    /// Seal errors, the engine's otherwise).
    dead: OnceLock<ConnectionLoss>,
    /// Set when the connection died of a forged PDU (docs/seal.md §4a): commands in flight
    /// fail with [`Error::SealForgery`]. Set before the engine closes, so every waiter woken
    /// by the close sees it.
    forged: OnceLock<ipsan_seal::Forgery>,
    io_tasks: Mutex<Vec<AbortHandle>>,
    /// Turns true when the connection has ended (the recovery supervisor waits for it).
    ended: watch::Sender<bool>,
    /// AsyncEvent 1 received (RFC 7143 §11.9.1): the engine refuses new commands and logs out
    /// once the commands in flight are done; with recovery on, new commands wait for the next
    /// login in the session engine.
    logout_asked: AtomicBool,
    /// The payload transform this connection's login installed (Seal, keyed per login).
    transform: Option<Arc<dyn PayloadTransform>>,
}

impl ConnState {
    fn new(generation: u64, transform: Option<Arc<dyn PayloadTransform>>) -> Self {
        Self {
            generation,
            wake_writer: Notify::new(),
            wake_timer: Notify::new(),
            dead: OnceLock::new(),
            forged: OnceLock::new(),
            io_tasks: Mutex::new(Vec::new()),
            ended: watch::channel(false).0,
            logout_asked: AtomicBool::new(false),
            transform,
        }
    }

    fn lost(&self) -> Error {
        if let Some(f) = self.forged.get() {
            return Error::SealForgery(f.clone());
        }
        Error::ConnectionLost(
            self.dead
                .get()
                .cloned()
                .unwrap_or(ConnectionLoss::Local(LocalClose::Unknown)),
        )
    }

    fn loss(&self, e: ConnectionError) -> ConnectionLoss {
        if let Some(f) = self.forged.get() {
            return ConnectionLoss::SealForgery(f.clone());
        }
        self.dead
            .get()
            .cloned()
            .unwrap_or_else(|| ConnectionLoss::from_engine(e))
    }
}

/// A connection as its tasks and callers see it.
struct Shared {
    core: Arc<Core>,
    st: Arc<ConnState>,
    params: Negotiated,
    /// A duplicate of the connection's socket, for reading TCP settings and TCP_INFO.
    socket: Option<std::os::fd::OwnedFd>,
}

impl Core {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>> {
        self.inner
            .lock()
            .map_err(|_| Error::ConnectionLost(ConnectionLoss::Local(LocalClose::Poisoned)))
    }

    /// Runs `f` on the session engine, then hands its events to whoever waits for them and
    /// wakes the current connection's writer. Every engine call goes through here or
    /// [`Shared::with_io`].
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> Result<T> {
        self.with_wake(false, f)
    }

    /// [`Core::with`] for calls that may set an earlier deadline (a submission, task
    /// management, logout): wakes the timer when the engine's next deadline moved before the
    /// one it sleeps until.
    fn with_timer<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> Result<T> {
        self.with_wake(true, f)
    }

    fn with_wake<T>(&self, timer: bool, f: impl FnOnce(&mut Inner) -> T) -> Result<T> {
        let mut g = self.lock()?;
        let r = f(&mut g);
        self.dispatch(&mut g);
        Self::wake(&g, timer);
        Ok(r)
    }

    /// The error of a command that finds connection `conn` gone: once a reinstating login
    /// was refused for good, the refusal ([`LinkState::Refused`]: every command fails with
    /// it), whatever connection the command took; before, the connection's loss. A command
    /// that took the connection before its loss was seen and reaches the engine only after the
    /// refusal ended the session (a large write sealed meanwhile, or a caller descheduled
    /// between the two) would otherwise report the old connection's end.
    fn lost(&self, conn: &ConnState) -> Error {
        match self.refused.get().copied() {
            Some((detail, message)) => Error::LoginRefused {
                class: 2,
                detail,
                message,
            },
            None => conn.lost(),
        }
    }

    /// Wakes the current connection's writer when it has work, and its timer when the
    /// engine's next deadline moved before the one it sleeps until.
    fn wake(g: &Inner, timer: bool) {
        // A wakeup per received PDU with nothing to send would cost the writer a lock and a
        // task switch each time (measured: 30-40 % of read throughput).
        let conn = g.session.connection();
        let wake = g.session.has_transmit() || conn.closed().is_some();
        // Likewise the timer: woken only when the engine's next deadline moved before the
        // one it sleeps until. Only a submission (a command's deadline) or a task management
        // request can do that: a received PDU checks only while one is out (its answer may
        // start the next step of a timeout's escalation).
        let wake_timer = (timer || conn.tmfs_in_flight() > 0)
            && match (g.session.poll_timeout(), g.timer_at) {
                (Some(d), Some(t)) => d < t,
                (Some(_), None) => true,
                (None, _) => false,
            };
        if wake {
            g.conn.wake_writer.notify_one();
        }
        if wake_timer {
            g.conn.wake_timer.notify_one();
        }
    }

    fn dispatch(&self, g: &mut Inner) {
        let Inner {
            session,
            waiters,
            tmf_waiters,
            closed_waiters,
            conn,
            ..
        } = g;
        // The reason first: callers woken below read it.
        if let Some(e) = session.connection().closed() {
            let _ = conn.dead.set(ConnectionLoss::from_engine(e));
            conn.ended.send_replace(true);
        }
        while let Some(ev) = session.poll_event() {
            match ev {
                proto::Event::Completed { itt, result } => {
                    match &result {
                        Err(Failure::NotReissued { opcode, .. }) => {
                            Counters::bump(&self.counters.not_idempotent);
                            tracing::debug!(
                                opcode,
                                "not idempotent: failing it instead of sending it again"
                            );
                        }
                        Err(Failure::RecoveryTimedOut { .. }) => {
                            Counters::bump(&self.counters.timed_out);
                        }
                        _ => {}
                    }
                    if let Some((tx, generation)) = waiters.remove(&itt) {
                        // The transform only when it ended on a later connection (a reissued
                        // read): a clone of a shared `Arc` per command is a contended atomic.
                        let moved = (generation != conn.generation)
                            .then(|| conn.transform.clone())
                            .flatten();
                        let _ = tx.send(Done::Ended(self.answer(result, conn), moved));
                    }
                }
                proto::Event::Reissued { .. } => {
                    Counters::bump(&self.counters.reissued);
                }
                proto::Event::Rebind { itt } => {
                    let sent = waiters.remove(&itt).is_some_and(|(tx, _)| {
                        tx.send(Done::Rebind(conn.transform.clone())).is_ok()
                    });
                    if !sent {
                        // Nobody to make its data again: it ends here.
                        session.withdraw(itt);
                    }
                }
                proto::Event::TaskManagement { itt, response } => {
                    if let Some(tx) = tmf_waiters.remove(&itt) {
                        let _ = tx.send(response);
                    }
                }
                proto::Event::LogoutRequested { within_secs } => {
                    tracing::info!(
                        within_secs,
                        "target requests logout (AsyncEvent 1); refusing new commands"
                    );
                    conn.logout_asked.store(true, Ordering::Release);
                }
                proto::Event::Rejected { reason, opcode } => {
                    tracing::warn!(reason = reason.0, ?opcode, "target rejected a PDU");
                }
                proto::Event::TimeoutStep { itt, step } => match step {
                    engine::TimeoutStep::AbortTask => {
                        tracing::warn!(itt, "command timed out; sending ABORT TASK");
                    }
                    engine::TimeoutStep::LunReset { abort_response } => tracing::warn!(
                        itt,
                        response = abort_response.0,
                        "target refused to abort a timed-out command; escalating to LOGICAL UNIT RESET"
                    ),
                },
                proto::Event::ConnectionClosed(e) => {
                    let _ = conn.dead.set(ConnectionLoss::from_engine(e));
                    conn.ended.send_replace(true);
                    tmf_waiters.clear();
                    for tx in closed_waiters.drain(..) {
                        let _ = tx.send(());
                    }
                    // The reader and the timer stop; the writer flushes what is queued (a
                    // Logout, say) and shuts the socket.
                    if let Ok(tasks) = conn.io_tasks.lock() {
                        for t in tasks.iter().skip(1) {
                            t.abort();
                        }
                    }
                }
            }
        }
    }

    /// A command's end as the target gave it: any SCSI status, with the raw sense bytes (a
    /// gateway hands them on unchanged); task errors are errors. `conn`: the connection the
    /// engine ended it on.
    fn answer(&self, r: proto::SessionResult, conn: &ConnState) -> Result<Passthrough> {
        let e = match r {
            Ok(c) => {
                return Ok(Passthrough {
                    status: c.status,
                    sense: c.sense,
                    data: c.data,
                    residual: c.residual,
                })
            }
            Err(Failure::Task(e)) => e,
            Err(Failure::NotReissued { opcode, lost }) => {
                return Err(Error::NotReissued {
                    opcode,
                    reason: conn.loss(lost),
                    sense: recovery::not_reissued_sense(),
                })
            }
            Err(Failure::RecoveryTimedOut { after, lost }) => {
                return Err(Error::RecoveryTimedOut {
                    after,
                    reason: conn.loss(lost),
                })
            }
            Err(_) => return Err(conn.lost()),
        };
        match e {
            TaskError::IscsiResponse(r) => Err(Error::IscsiResponse(r)),
            TaskError::Rejected(r) => Err(Error::Rejected(r.0)),
            TaskError::Aborted(AbortedBy::LunReset) => {
                Err(Error::TaskAborted("LOGICAL UNIT RESET".into()))
            }
            TaskError::Aborted(AbortedBy::AbortTask) => {
                Err(Error::TaskAborted("ABORT TASK".into()))
            }
            TaskError::Violation(v) => Err(Error::TargetViolation(v)),
            TaskError::TimedOut { after, .. } => Err(Error::CommandTimedOut(after)),
            TaskError::ConnectionLost(_) if self.refused.get().is_some() => Err(self.lost(conn)),
            TaskError::ConnectionLost(_) if conn.forged.get().is_some() => Err(conn.lost()),
            TaskError::ConnectionLost(e) => Err(Error::ConnectionLost(conn.loss(e))),
            _ => Err(conn.lost()),
        }
    }
}

impl Shared {
    /// [`Core::with`] for this connection's own tasks (reader, writer, timer) and its ends:
    /// nothing happens once a newer connection replaced it in the session. `quiet`: wakes
    /// nobody (the writer and the timer themselves).
    fn with_io<T>(&self, quiet: bool, f: impl FnOnce(&mut Inner) -> T) -> Result<T> {
        let mut g = self.core.lock()?;
        if g.conn.generation != self.st.generation {
            return Err(self.st.lost());
        }
        let r = f(&mut g);
        self.core.dispatch(&mut g);
        if !quiet {
            Core::wake(&g, false);
        }
        Ok(r)
    }

    /// Ends the connection for a reason the driver finds itself (socket error, framing, Seal):
    /// with recovery, its commands wait for the next connection; without, they fail with it.
    fn kill(&self, reason: ConnectionLoss) {
        let _ = self.st.dead.set(reason);
        let _ = self.with_io(false, |g| {
            g.session
                .close(Instant::now(), Side::Initiator, CloseReason::Local)
        });
    }

    /// Ends the connection and stops its tasks at once (the session is going away).
    fn shutdown(&self, why: LocalClose) {
        self.kill(ConnectionLoss::Local(why));
        if let Ok(tasks) = self.st.io_tasks.lock() {
            for t in tasks.iter() {
                t.abort();
            }
        }
    }

    fn lost(&self) -> Error {
        self.core.lost(&self.st)
    }
}

/// The connection a session currently has, as its commands see it.
#[derive(Clone)]
enum LinkState {
    /// Logged in: commands go to this connection.
    Up(Arc<Shared>),
    /// The connection failed at `since` for `reason`; a new one is being made.
    Recovering {
        since: Instant,
        reason: ConnectionLoss,
    },
    /// A reinstating login was refused for good (status class 2, RFC 7143 §11.13.5):
    /// recovery stopped, every command fails with this.
    Refused {
        class: u8,
        detail: u8,
        message: &'static str,
    },
}

/// What a session keeps across its connections.
struct Link {
    state: watch::Sender<LinkState>,
    /// The engine session and its waiters, shared with the connections' tasks.
    core: Arc<Core>,
    /// [`SessionConfig::recovery_timeout`]; `None`: no recovery.
    recovery_timeout: Option<Duration>,
    /// Logout or drop under way: a connection end is not a failure to recover from.
    closing: AtomicBool,
}

impl Link {
    /// The connection, if one is up.
    fn up(&self) -> Option<Arc<Shared>> {
        match &*self.state.borrow() {
            LinkState::Up(c) => Some(c.clone()),
            _ => None,
        }
    }
}

/// A logged-in iSCSI session in full feature phase: one connection at a time, replaced by a
/// reinstating login when it fails and recovery is on ([`SessionConfig::recovery_timeout`]).
pub struct Session {
    link: Arc<Link>,
    lun: u64,
    capacity: OnceLock<Capacity>,
    /// A transform set with [`Session::set_transform`]; otherwise each connection's own.
    transform: Option<Arc<dyn PayloadTransform>>,
    /// What the first login negotiated.
    params: Negotiated,
    /// The recovery supervisor, when recovery is on.
    supervisor: Option<AbortHandle>,
}

impl std::fmt::Debug for Session {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Session")
            .field("lun", &self.lun)
            .field("params", &self.params)
            .field("failure", &self.failure())
            .finish_non_exhaustive()
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        self.link.closing.store(true, Ordering::Release);
        if let Some(h) = &self.supervisor {
            h.abort();
        }
        if let Some(c) = self.link.up() {
            c.shutdown(LocalClose::SessionDropped);
        }
        // Commands kept for a recovery that will not come end now.
        let _ = self.link.core.with(|g| {
            g.session.end(
                Instant::now(),
                ConnectionError {
                    by: Side::Initiator,
                    reason: CloseReason::Local,
                },
            )
        });
    }
}

/// Kills a connection made by the supervisor unless it was handed over (an aborted
/// supervisor must not leave a logged-in connection pinging on its own).
struct Unpublished(Option<Arc<Shared>>);

impl Drop for Unpublished {
    fn drop(&mut self) {
        if let Some(c) = self.0.take() {
            c.shutdown(LocalClose::DroppedDuringRecovery);
        }
    }
}
