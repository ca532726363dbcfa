//! The tokio session runtime: login, then the full feature phase driven through the sans-IO
//! engine: `iscsi_proto::engine::session` (the task table that outlives a connection, ITTs
//! unique across connections, session recovery's reissue policy) over
//! `iscsi_proto::engine::initiator` (CmdSN window, immediate and unsolicited data, R2T
//! checking and answering, Data-In reassembly, task management, NOP-Out keepalive, logout).
//! This module does sockets, login, timers, reconnect backoff and waking callers; what the
//! protocol decides is decided in the engine.
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
//! One framed read (`reader`) and one framed write (`writer`) per connection: the points where
//! a per-PDU protection step hooks in. Kamisaka et al. overlap round trips with forked
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
use tokio::io::{AsyncReadExt, AsyncWriteExt};
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

mod passthrough;
pub use passthrough::Passthrough;

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
    /// Expect this many bytes; the buffer is reused (resized, not reallocated when large enough).
    Read(BytesMut, usize),
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
            TaskError::ConnectionLost(_) if self.refused.get().is_some() => {
                let (detail, message) = self.refused.get().copied().unwrap_or((0, ""));
                Err(Error::LoginRefused {
                    class: 2,
                    detail,
                    message,
                })
            }
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
        self.st.lost()
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

async fn connect_tcp(url: &IscsiUrl, cfg: &SessionConfig) -> Result<TcpStream> {
    let addr = url.socket_addr_string();
    let connect = async {
        let Some(tcp) = &cfg.tcp else {
            return TcpStream::connect(&addr).await;
        };
        let mut last = None;
        for sa in tokio::net::lookup_host(&addr).await? {
            let sock = if sa.is_ipv4() {
                tokio::net::TcpSocket::new_v4()?
            } else {
                tokio::net::TcpSocket::new_v6()?
            };
            // Buffers and the congestion control go on before the SYN.
            tcp.apply(&sock)
                .map_err(|e| std::io::Error::other(e.to_string()))?;
            match sock.connect(sa).await {
                Ok(s) => return Ok(s),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| std::io::Error::other(format!("{addr}: no address"))))
    };
    let stream = tokio::time::timeout(cfg.connect_timeout, connect)
        .await
        .map_err(|_| Error::Timeout("TCP connect"))??;
    if cfg.tcp.as_ref().and_then(|t| t.nodelay).is_none() {
        stream.set_nodelay(true)?;
    }
    Ok(stream)
}

/// What login leaves for the full feature phase.
struct LoggedIn {
    params: Negotiated,
    /// The values in force as login negotiated them: what the engine runs on.
    session_params: SessionParams,
    /// Installed before the first command (Seal: every command's data is sealed).
    transform: Option<Arc<dyn PayloadTransform>>,
    /// Seal's record protection for every PDU of the connection (docs/seal.md §4a).
    record: Option<crate::login::RecordLayer>,
    done: LoginDone,
}

/// Runs the login exchange on `conn` (RFC 7143 §6.3): iscsi-proto's [`LoginExchange`]
/// builds every Login Request and reads every response; here PDUs go out and come in, and
/// relayed CHAP's challenge and answer travel over the relay's channels.
async fn login(
    conn: &mut Conn,
    opts: LoginOptions,
    kind: SessionKind,
    ext: Option<Box<dyn OriginatorExtension>>,
    relay: Option<crate::login::ChapRelay>,
) -> Result<LoggedIn> {
    let isid = opts.isid.unwrap_or_else(originator::random_isid);
    let (mut machine, first, mut relay) = match relay {
        Some(r) => {
            let opts = LoginOptions {
                chap_algorithms: r.algorithms.clone(),
                ..opts
            };
            let (m, s) = LoginMachine::start_relayed(opts, kind);
            (m, s, Some(r))
        }
        None => {
            let (m, s) = LoginMachine::start(opts, kind);
            (m, s, None)
        }
    };
    if let Some(ext) = ext {
        machine.set_extension(ext, isid);
    }
    let mut x = LoginExchange::new(machine, first, isid);
    loop {
        while let Some(pdu) = x.poll_transmit() {
            conn.send_pdu(&pdu).await?;
        }
        let pdu = conn.recv().await?;
        let progress = x.handle_pdu(&pdu)?;
        if let (Some(verdict), Some(r)) = (x.take_relay_verdict(), relay.as_mut()) {
            // The target accepted the relayed response: the host hears it now.
            if let Some(tx) = r.accepted.take() {
                let _ = tx.send(verdict);
            }
        }
        match progress {
            LoginProgress::Send => {}
            LoginProgress::RelayChallenge {
                algorithm,
                id,
                challenge,
            } => {
                let r = relay
                    .as_mut()
                    .ok_or_else(|| Error::Login("relayed CHAP without a relay".into()))?;
                let (Some(tx), Some(rx)) = (r.challenge.take(), r.response.take()) else {
                    return Err(Error::Login("a second relayed CHAP challenge".into()));
                };
                tx.send((algorithm, id, challenge))
                    .map_err(|_| Error::Login("relayed CHAP: the host is gone".into()))?;
                let answer = rx
                    .await
                    .map_err(|_| Error::Login("relayed CHAP: the host did not answer".into()))?;
                x.relay_response(&answer.name, &answer.response, answer.mutual)?;
            }
            LoginProgress::Done(done) => {
                // Seal's record layer is keyed from the whole transcript, this final
                // response included (docs/seal.md §4a).
                let record = x
                    .extension_mut()
                    .and_then(|e| e.record_layer())
                    .transpose()
                    .map_err(Error::Login)?;
                let params = Negotiated::from_login(&done.established);
                tracing::debug!(?params, "login done");
                return Ok(LoggedIn {
                    params,
                    session_params: done.established.params.clone(),
                    record,
                    transform: x.extension_mut().and_then(|e| e.transform()),
                    done,
                });
            }
        }
    }
}

/// Connect and log in, bounded by the login timeout.
///
/// No CHAP fallback: a refused login is not retried with a narrower algorithm list, since a
/// forged "authentication failure" (anyone on the path can send one) would otherwise steer
/// the next login to SHA-1/MD5 (issue 31). A target that picks an algorithm it cannot finish
/// (tgtd 1.0.85 takes CHAP_A=7 but cannot read a 32-byte CHAP_R) is reached by offering the
/// algorithms it can do explicitly ([`LoginOptions::chap_algorithms`], `--chap-algorithms
/// sha1,md5` for tgtd).
async fn connect_and_login(
    url: &IscsiUrl,
    cfg: &SessionConfig,
    kind: SessionKind,
) -> Result<(Conn, LoggedIn)> {
    let stream = connect_tcp(url, cfg).await?;
    let mut conn = Conn::new(stream);
    let ext = cfg.extension.as_ref().map(|f| (f.0)());
    let opts = cfg.login.clone();
    let chap = opts.chap.is_some();
    let li = tokio::time::timeout(cfg.login_timeout, login(&mut conn, opts, kind, ext, None))
        .await
        .map_err(|_| Error::Timeout("login"))?;
    if let Err(Error::LoginRefused {
        class: 2,
        detail: 0,
        ..
    }) = &li
    {
        if chap {
            tracing::warn!(
                "login refused (initiator error) after CHAP; if the target cannot do the \
                 algorithm it picked (tgtd: SHA-256), offer the ones it can explicitly \
                 (tgtd 1.0.85: --chap-algorithms sha1,md5)"
            );
        }
    }
    Ok((conn, li?))
}

/// A target found by SendTargets discovery (RFC 7143 Appendix D).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DiscoveredTarget {
    pub name: String,
    /// `TargetAddress` values: `host:port,portal-group-tag`.
    pub addresses: Vec<String>,
}

impl From<discovery::DiscoveredTarget> for DiscoveredTarget {
    fn from(t: discovery::DiscoveredTarget) -> Self {
        Self {
            name: t.name,
            addresses: t.addresses,
        }
    }
}

/// Discovery results as pretty JSON (`[{"name": ..., "addresses": [...]}]`).
pub fn targets_json(t: &[DiscoveredTarget]) -> std::result::Result<String, serde_json::Error> {
    serde_json::to_string_pretty(t)
}

/// Log into a discovery session, ask `SendTargets=All`, log out: iscsi-proto's
/// [`Discovery`] builds the requests and reads the answers; here PDUs go out and come in.
pub async fn discover(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Vec<DiscoveredTarget>> {
    let fut = async {
        let (mut conn, li) = connect_and_login(url, cfg, SessionKind::Discovery).await?;
        conn.codec = codec_for(&li.params);
        let mut d = Discovery::new(li.done.exp_cmd_sn, li.done.exp_stat_sn);
        let targets = loop {
            while let Some(pdu) = d.poll_transmit() {
                conn.send_pdu(&pdu).await?;
            }
            if let DiscoveryEvent::Targets(t) = d.handle_pdu(&conn.recv().await?)? {
                break t;
            }
        };
        while let Some(pdu) = d.poll_transmit() {
            conn.send_pdu(&pdu).await?;
        }
        // Best effort: the answer to a discovery logout changes nothing for the caller.
        let _ = tokio::time::timeout(discovery::LOGOUT_GRACE, async {
            while !d.is_done() {
                d.handle_pdu(&conn.recv().await?)?;
            }
            Ok::<_, Error>(())
        })
        .await;
        Ok(targets.into_iter().map(DiscoveredTarget::from).collect())
    };
    tokio::time::timeout(cfg.login_timeout, fut)
        .await
        .map_err(|_| Error::Timeout("discovery"))?
}

/// The codec for the values a login negotiated (digests, RFC 7143 §13.1; what we declared
/// we receive, §13.12).
fn codec_for(params: &Negotiated) -> Codec {
    Codec {
        header_digest: params.header_digest,
        data_digest: params.data_digest,
        max_recv_data_segment_length: params.max_recv_data_segment_length,
    }
}

/// A logged-in connection whose full feature phase has not started.
struct Fresh {
    conn: Conn,
    li: LoggedIn,
}

/// Connect and log in (a first login, or a reinstating one).
async fn login_connection(url: &IscsiUrl, cfg: &SessionConfig, target: &str) -> Result<Fresh> {
    let (conn, li) = connect_and_login(
        url,
        cfg,
        SessionKind::Normal {
            target_name: target.to_owned(),
        },
    )
    .await?;
    Ok(Fresh { conn, li })
}

impl Fresh {
    /// The engine connection for this login.
    fn engine(&self, cfg: &SessionConfig) -> engine::Connection {
        let li = &self.li;
        let mut ecfg = engine::Config::new(
            li.session_params.clone(),
            li.done.exp_cmd_sn,
            li.done.max_cmd_sn,
            li.done.exp_stat_sn,
        );
        ecfg.exp_cmd_sn = li.done.exp_cmd_sn;
        ecfg.nop_interval = cfg.nop_interval;
        ecfg.nop_timeout = cfg.nop_timeout;
        ecfg.tmf_timeout = TMF_TIMEOUT;
        ecfg.max_queued_pong_bytes = MAX_QUEUED_PONG_BYTES;
        ecfg.command_timeout = cfg.command_timeout;
        engine::Connection::new(ecfg, Instant::now())
    }

    /// Starts the connection's tasks (writer, reader, timer) once its engine connection is
    /// the session's current one (`st`).
    fn start(self, core: Arc<Core>, st: Arc<ConnState>) -> Arc<Shared> {
        let Fresh { conn, li } = self;
        let params = li.params.clone();
        let codec = codec_for(&params);
        let Conn { stream, rbuf, .. } = conn;
        let socket = {
            use std::os::fd::AsFd;
            stream.as_fd().try_clone_to_owned().ok()
        };
        let (rd, wr) = stream.into_split();
        let shared = Arc::new(Shared {
            core,
            st,
            params,
            socket,
        });
        // The writer first: a closing engine stops the others but lets the writer flush.
        // The record step sits between the codec and the engine (docs/seal.md §4a).
        let (sealer, opener) = li.record.map_or((None, None), |(s, o)| (Some(s), Some(o)));
        let w = tokio::spawn(writer(wr, codec.clone(), shared.clone(), sealer));
        let r = tokio::spawn(reader(rd, rbuf, codec, shared.clone(), opener));
        let k = tokio::spawn(timer(shared.clone()));
        if let Ok(mut t) = shared.st.io_tasks.lock() {
            *t = vec![w.abort_handle(), r.abort_handle(), k.abort_handle()];
        }
        shared
    }
}

/// Passes the time in to the engine session while it has no connection, so commands kept
/// for recovery end with `RecoveryTimedOut` at the recovery timeout.
async fn recovery_clock(core: Arc<Core>) {
    loop {
        let Ok(Some(d)) = core.with(|g| g.session.poll_timeout()) else {
            return;
        };
        tokio::time::sleep_until(d.into()).await;
        if core
            .with(|g| g.session.handle_timeout(Instant::now()))
            .is_err()
        {
            return;
        }
    }
}

/// The recovery supervisor of a session ([`crate::recovery`]): waits for the connection to
/// end, then reconnects with backoff, reinstating the session (same InitiatorName and ISID,
/// TSIH 0: RFC 7143 §6.3.5) with a fresh login extension (fresh Seal keys), until a login
/// succeeds or is refused for good (status class 2). The engine session keeps the commands
/// in flight and sends them again on the new connection (`attach_quiet`, `reissue`); new
/// commands wait on [`Link::state`].
async fn supervise(link: Arc<Link>, url: IscsiUrl, cfg: SessionConfig, target: String, lun: u64) {
    let Some(limit) = link.recovery_timeout else {
        return;
    };
    let core = link.core.clone();
    loop {
        let Some(conn) = link.up() else { return };
        let mut ended = conn.st.ended.subscribe();
        if ended.wait_for(|e| *e).await.is_err() || link.closing.load(Ordering::Acquire) {
            return;
        }
        let since = Instant::now();
        let reason = conn
            .lost()
            .connection_loss()
            .unwrap_or(ConnectionLoss::Local(LocalClose::Unknown));
        let generation = conn.st.generation;
        drop(conn);
        let c = &core.counters;
        Counters::bump(&c.losses);
        let (reissued0, failed0) = (Counters::get(&c.reissued), Counters::get(&c.not_idempotent));
        tracing::warn!(
            %reason,
            "connection lost; recovering the session (RFC 7143 §6.3.5 reinstatement), commands wait up to {limit:?}"
        );
        link.state.send_replace(LinkState::Recovering {
            since,
            reason: reason.clone(),
        });
        let clock = AbortOnDrop(tokio::spawn(recovery_clock(core.clone())).abort_handle());
        let mut backoff = Backoff::new();
        let mut expired = false;
        let mut attempts = 0u64;
        let fresh = loop {
            if link.closing.load(Ordering::Acquire) {
                return;
            }
            Counters::bump(&c.reconnects);
            attempts += 1;
            match login_connection(&url, &cfg, &target).await {
                Ok(s) => break s,
                Err(Error::LoginRefused {
                    class: 2,
                    detail,
                    message,
                }) => {
                    tracing::error!(
                        "session recovery stopped: the reinstating login was refused ({message}, status class 2 detail {detail:#04x})"
                    );
                    let _ = core.refused.set((detail, message));
                    let _ = core.with(|g| {
                        g.session.end(
                            Instant::now(),
                            ConnectionError {
                                by: Side::Target,
                                reason: CloseReason::Local,
                            },
                        )
                    });
                    link.state.send_replace(LinkState::Refused {
                        class: 2,
                        detail,
                        message,
                    });
                    return;
                }
                Err(e) => tracing::debug!(attempts, "reconnect failed: {e}"),
            }
            if !expired && since.elapsed() >= limit {
                expired = true;
                tracing::warn!(
                    "session not recovered within {limit:?}: commands fail until a reconnect succeeds"
                );
            }
            tokio::time::sleep(backoff.next_wait()).await;
        };
        drop(clock);
        // The new connection becomes the engine session's current one; the commands kept
        // from the old one wait until the unit attention is cleared.
        let st = Arc::new(ConnState::new(generation + 1, fresh.li.transform.clone()));
        let engine_conn = fresh.engine(&cfg);
        let attached = core.with(|g| {
            g.conn = st.clone();
            g.timer_at = None;
            g.session.attach_quiet(Instant::now(), engine_conn);
        });
        if attached.is_err() {
            return;
        }
        let fresh = Unpublished(Some(fresh.start(core.clone(), st)));
        // A reinstated nexus is a new nexus to the target: it may report a unit attention
        // (POWER ON OR RESET, 29h/xxh) to its first command. Consume it here, as a host's
        // SCSI layer would, so reissued commands see only their own status.
        if let Some(s) = &fresh.0 {
            let mut ended = s.st.ended.subscribe();
            for _ in 0..4 {
                let Ok((itt, rx)) = s.submit(
                    lun,
                    scsi::test_unit_ready(),
                    DataDir::None,
                    None,
                    Binding::Free,
                    Until::Timeout,
                ) else {
                    break;
                };
                let answer = tokio::select! {
                    (r, _) = s.wait_ended(itt, rx, Until::Timeout) => r,
                    // Lost again: the engine would keep this TEST UNIT READY for the next
                    // connection, which only this task makes. It is not the caller's.
                    _ = ended.wait_for(|e| *e) => {
                        let _ = s.core.with(|g| g.session.withdraw(itt));
                        break;
                    }
                };
                let ua = matches!(
                    answer.and_then(Passthrough::into_completion),
                    Err(Error::Scsi { sense: Some(ref x), .. }) if x.key == SenseKey::UNIT_ATTENTION
                );
                if !ua {
                    break;
                }
            }
            let _ = s.core.with(|g| g.session.reissue(Instant::now()));
        }
        let mut fresh = fresh;
        let Some(s) = fresh.0.take() else { return };
        let took = since.elapsed();
        c.recovered(took);
        let tsih = s.params.tsih;
        link.state.send_replace(LinkState::Up(s));
        tracing::info!(
            took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
            attempts,
            tsih,
            reissued = Counters::get(&c.reissued) - reissued0,
            failed_not_idempotent = Counters::get(&c.not_idempotent) - failed0,
            "session recovered in {took:?}"
        );
    }
}

/// Aborts a task when dropped (the supervisor's recovery clock, whatever way it leaves).
struct AbortOnDrop(AbortHandle);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

impl Session {
    /// Connect, log in to the URL's target and LUN, and read its capacity (retrying the
    /// UNIT ATTENTION many targets report on a fresh nexus).
    pub async fn open(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Self> {
        let s = Self::connect(url, cfg).await?;
        let mut last = None;
        for _ in 0..4 {
            match s.read_capacity().await {
                Ok(_) => return Ok(s),
                Err(e) if e.sense().is_some_and(|s| s.key == SenseKey::UNIT_ATTENTION) => {
                    last = Some(e)
                }
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or(Error::Timeout("read capacity")))
    }

    /// Connect and log in, without touching the LUN. With
    /// [`SessionConfig::recovery_timeout`] set, a supervisor task recovers the session when
    /// its connection fails ([`crate::recovery`]).
    pub async fn connect(url: &IscsiUrl, cfg: &SessionConfig) -> Result<Self> {
        Self::connect_with(url, cfg, None).await
    }

    /// Connect and log in with relayed CHAP (a gateway's remote leg, docs/gateway.md): the
    /// target's challenge goes out through `relay`, the host's answer comes back through it,
    /// and the target's verdict goes out; `cfg.login.chap` is not used. Such a session has
    /// no session recovery whatever `cfg` says: a new login needs the host to answer again.
    pub async fn connect_relayed(
        url: &IscsiUrl,
        cfg: &SessionConfig,
        relay: crate::login::ChapRelay,
    ) -> Result<Self> {
        let cfg = SessionConfig {
            recovery_timeout: None,
            ..cfg.clone()
        };
        Self::connect_with(url, &cfg, Some(relay)).await
    }

    async fn connect_with(
        url: &IscsiUrl,
        cfg: &SessionConfig,
        relay: Option<crate::login::ChapRelay>,
    ) -> Result<Self> {
        let target = url.require_target()?.to_owned();
        let lun = u64::from_be_bytes(scsi::encode_lun(u64::from(url.lun.unwrap_or(0))));
        // One ISID for the session's life: a reconnect with the same ISID and TSIH 0
        // reinstates it (RFC 7143 §6.3.5).
        let mut cfg = cfg.clone();
        cfg.login.isid = Some(cfg.login.isid.unwrap_or_else(originator::random_isid));
        let recovery_timeout = cfg.recovery_timeout.filter(|d| !d.is_zero());
        let fresh = match relay {
            None => login_connection(url, &cfg, &target).await?,
            Some(relay) => {
                let stream = connect_tcp(url, &cfg).await?;
                let mut conn = Conn::new(stream);
                let ext = cfg.extension.as_ref().map(|f| (f.0)());
                let kind = SessionKind::Normal {
                    target_name: target.clone(),
                };
                let li = tokio::time::timeout(
                    cfg.login_timeout,
                    login(&mut conn, cfg.login.clone(), kind, ext, Some(relay)),
                )
                .await
                .map_err(|_| Error::Timeout("login"))??;
                Fresh { conn, li }
            }
        };
        let st = Arc::new(ConnState::new(0, fresh.li.transform.clone()));
        let session = proto::Session::new(proto::Config { recovery_timeout }, fresh.engine(&cfg));
        let core = Arc::new(Core {
            inner: Mutex::new(Inner {
                session,
                waiters: OwnTagMap::default(),
                tmf_waiters: OwnTagMap::default(),
                closed_waiters: Vec::new(),
                timer_at: None,
                conn: st.clone(),
            }),
            counters: Counters::default(),
            observer: Arc::new(OnceLock::new()),
            refused: OnceLock::new(),
        });
        let first = fresh.start(core.clone(), st);
        let params = first.params.clone();
        let link = Arc::new(Link {
            state: watch::channel(LinkState::Up(first)).0,
            core,
            recovery_timeout,
            closing: AtomicBool::new(false),
        });
        let supervisor = recovery_timeout.map(|_| {
            tokio::spawn(supervise(link.clone(), url.clone(), cfg, target, lun)).abort_handle()
        });
        Ok(Self {
            link,
            lun,
            capacity: OnceLock::new(),
            transform: None,
            params,
            supervisor,
        })
    }

    /// The parameters negotiated at the first login (a reinstating login asks the same).
    pub fn params(&self) -> &Negotiated {
        &self.params
    }

    /// Install a payload transform (Seal): from now on the data of every command goes through
    /// it (see [`crate::transform`]), instead of the one the login installed.
    pub fn set_transform(&mut self, t: Arc<dyn PayloadTransform>) {
        self.transform = Some(t);
    }

    /// Report every command's events from now on to `o` (see [`crate::observe`]; the
    /// benchmark's trace is one). A session has at most one observer; returns false if one was
    /// set already.
    pub fn set_observer(&self, o: Arc<dyn CommandObserver>) -> bool {
        self.link.core.observer.set(o).is_ok()
    }

    /// The observer set with [`Session::set_observer`].
    pub fn observer(&self) -> Option<&Arc<dyn CommandObserver>> {
        self.link.core.observer.get()
    }

    /// The connection's TCP settings as the kernel reports them.
    pub fn tcp_in_force(&self) -> Option<ipsan_tcp::InForce> {
        let c = self.link.up()?;
        c.socket
            .as_ref()
            .and_then(|s| ipsan_tcp::settings::read_back(s).ok())
    }

    /// A TCP_INFO snapshot of the connection (cwnd, ssthresh, RTT, retransmits, ...).
    pub fn tcp_info(&self) -> Option<ipsan_tcp::TcpInfoSnapshot> {
        let c = self.link.up()?;
        c.socket
            .as_ref()
            .and_then(|s| ipsan_tcp::info::tcp_info(s).ok())
    }

    /// The capacity from the last READ CAPACITY.
    pub fn capacity(&self) -> Option<Capacity> {
        self.capacity.get().copied()
    }

    /// Whether the target asked this session's connection to log out (AsyncEvent 1): new
    /// commands fail with [`Error::LogoutRequested`] (without recovery; with it, they wait
    /// for the next login).
    pub fn logout_requested(&self) -> bool {
        self.link
            .up()
            .is_some_and(|c| c.st.logout_asked.load(Ordering::Acquire))
    }

    /// Why the connection died, if it did (and, with recovery, has not been replaced yet).
    pub fn failure(&self) -> Option<String> {
        match &*self.link.state.borrow() {
            LinkState::Up(c) => c.st.dead.get().map(ToString::to_string),
            LinkState::Recovering { reason, .. } => Some(reason.to_string()),
            LinkState::Refused { message, .. } => Some((*message).to_owned()),
        }
    }

    /// The recovery counters ([`crate::recovery`]); all zero without recovery.
    pub fn recovery_stats(&self) -> RecoveryStats {
        self.link.core.counters.snapshot()
    }

    /// The connection to submit to: the current one, or while the session recovers the next
    /// one, waiting for it up to the recovery timeout; or the caller's abort.
    async fn connection_until(&self, until: Until<'_>) -> Result<Arc<Shared>> {
        let Until::Abort(abort) = until else {
            return self.connection().await;
        };
        tokio::select! {
            biased;
            () = abort.cancelled() => Err(Error::TaskAborted("ABORT TASK".into())),
            c = self.connection() => c,
        }
    }

    /// The connection to submit to: the current one (a command submitted as it dies is kept
    /// by the engine session for the next one, with recovery on), or while the session
    /// recovers the next one, waiting for it up to the recovery timeout.
    async fn connection(&self) -> Result<Arc<Shared>> {
        // The common case, without a receiver of its own.
        if let LinkState::Up(c) = &*self.link.state.borrow() {
            return Ok(c.clone());
        }
        let mut rx = self.link.state.subscribe();
        loop {
            let st = rx.borrow_and_update().clone();
            match st {
                LinkState::Up(c) => return Ok(c),
                LinkState::Recovering { since, reason, .. } => {
                    let limit = self.link.recovery_timeout.unwrap_or_default();
                    let timed_out = || {
                        Counters::bump(&self.link.core.counters.timed_out);
                        Error::RecoveryTimedOut {
                            after: limit,
                            reason: reason.clone(),
                        }
                    };
                    let deadline = since + limit;
                    if Instant::now() >= deadline {
                        return Err(timed_out());
                    }
                    match tokio::time::timeout_at(deadline.into(), rx.changed()).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) => {
                            return Err(Error::ConnectionLost(ConnectionLoss::Local(
                                LocalClose::SessionClosed,
                            )))
                        }
                        Err(_) => return Err(timed_out()),
                    }
                }
                LinkState::Refused {
                    class,
                    detail,
                    message,
                } => {
                    return Err(Error::LoginRefused {
                        class,
                        detail,
                        message,
                    })
                }
            }
        }
    }

    /// Send one SCSI command and wait for its completion. Waits (in the engine's queue) while
    /// the CmdSN window is closed. A non-GOOD status becomes [`Error::Scsi`]. With a payload
    /// transform installed, data-out is transformed before sending and Data-In after
    /// reassembly; a read's `len` is the plaintext length. With recovery on, a connection
    /// loss is ridden out as [`crate::recovery`] describes.
    pub async fn command(&self, cdb: [u8; 16], dir: DataDir) -> Result<Completion> {
        self.exchange(self.lun, cdb, dir, Until::Timeout)
            .await
            .and_then(Passthrough::into_completion)
    }

    /// One command to `lun` (the 8-byte LUN field as sent, SAM-5 §4.7), answered with any
    /// status: the one path [`Session::command`] and [`Session::command_to`] share, recovery
    /// included (the engine session sends it again on the next connection when it may).
    /// `until`: what may end the command before its status (see [`Until`]).
    async fn exchange(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        until: Until<'_>,
    ) -> Result<Passthrough> {
        let c = self.connection_until(until).await?;
        let tr = c.core.observer.get();
        let transform = self.transform.clone().or_else(|| c.st.transform.clone());
        if transform.is_none() && tr.is_none() {
            // Nothing binds to the ITT before it is sent: the submission allocates it, under
            // the same lock (a plain session's hot path).
            let (itt, rx) = c.submit(lun, cdb, dir, None, Binding::Free, until)?;
            return c.wait_ended(itt, rx, until).await.0;
        }
        // The ITT is fixed before the transform runs because the transform binds to it (and
        // the observer sees the command issued before it is sent). It stays the command's
        // ITT on every connection it is sent on.
        let itt = c.core.with(|g| g.session.alloc_itt())?;
        let pending = observe::Pending::issued(tr, itt);
        let Some(t) = transform else {
            let (itt, rx) = c.submit(lun, cdb, dir, Some(itt), Binding::Free, until)?;
            return pending.finish(c.wait_ended(itt, rx, until).await.0);
        };
        // The same extent rule the target binds with (ipsan_seal::cdb), for every CDB form.
        let (lba, blocks) = ipsan_seal::cdb::extent(&cdb);
        let info = CommandInfo {
            lun,
            lba,
            blocks,
            opcode: cdb[0],
            itt,
        };
        match dir {
            DataDir::None => {
                let (itt, rx) =
                    c.submit(lun, cdb, DataDir::None, Some(itt), Binding::Free, until)?;
                pending.finish(c.wait_ended(itt, rx, until).await.0)
            }
            DataDir::Write(plain) => {
                // Sealed under this connection's keys and the ITT: a reissue on another
                // connection seals the caller's plaintext again (Event::Rebind). The engine
                // does not keep the sealed copy; we keep the plaintext (a reference).
                observe::note(tr, itt, CommandEvent::SealStart, 0, plain.len() as u64);
                // Without recovery no reissue comes: no second reference to the plaintext.
                let keep = self.link.recovery_timeout.map(|_| plain.clone());
                let wire = t.outbound(info, plain).await?;
                observe::note(tr, itt, CommandEvent::SealEnd, 0, wire.len() as u64);
                let (itt, mut rx) = c.submit(
                    lun,
                    cdb,
                    DataDir::Write(wire),
                    Some(itt),
                    Binding::Bound,
                    until,
                )?;
                loop {
                    match c.wait(itt, rx, until).await {
                        Done::Ended(r, _) => return pending.finish(r),
                        Done::Rebind(fresh) => {
                            let Some(plain) = keep.clone() else {
                                return pending.finish(Err(c.lost()));
                            };
                            let t = self
                                .transform
                                .clone()
                                .or(fresh)
                                .unwrap_or_else(|| t.clone());
                            // The new waiter first: whatever ends the task meanwhile reaches it.
                            let (tx, next) = oneshot::channel();
                            c.core.with(|g| {
                                let generation = g.conn.generation;
                                g.waiters.insert(itt, (tx, generation))
                            })?;
                            rx = next;
                            match t.outbound(info, plain).await {
                                Ok(wire) => {
                                    // Refused when that connection is gone too: the next
                                    // one asks again.
                                    let _ = c.core.with_timer(|g| {
                                        g.session.resubmit(
                                            Instant::now(),
                                            itt,
                                            engine::Data::Write(wire),
                                        )
                                    })?;
                                }
                                Err(e) => {
                                    c.core.with(|g| {
                                        g.waiters.remove(&itt);
                                        g.session.withdraw(itt);
                                    })?;
                                    return pending.finish(Err(e));
                                }
                            }
                        }
                    }
                }
            }
            DataDir::Read(buf, len) => {
                let wire_len = t.wire_len(len).ok_or_else(|| {
                    Error::InvalidRequest(format!("{len} bytes cannot be carried by the transform"))
                })?;
                let (itt, rx) = c.submit(
                    lun,
                    cdb,
                    DataDir::Read(buf, wire_len),
                    Some(itt),
                    Binding::Free,
                    until,
                )?;
                let (r, on) = c.wait_ended(itt, rx, until).await;
                let mut done = r?;
                // Opened with the keys of the connection it completed on (a reissued read
                // completes on a later one).
                let t = self.transform.clone().or(on).unwrap_or(t);
                // A status without data (CHECK CONDITION, say) has nothing to open.
                if !done.data.is_empty() {
                    observe::note(tr, itt, CommandEvent::OpenStart, 0, done.data.len() as u64);
                    done.data = t.inbound(info, done.data).await?;
                    observe::note(tr, itt, CommandEvent::OpenEnd, 0, done.data.len() as u64);
                }
                pending.finish(Ok(done))
            }
        }
    }

    /// LOGICAL UNIT RESET of this session's LUN (RFC 7143 §11.5.1, SAM-5 §7.7): the target
    /// aborts every task on the LUN (from every initiator) and reports a unit attention to the
    /// other sessions' next command. This session's commands on the LUN that are still in
    /// flight fail with [`Error::TaskAborted`]: the target sends no status for them. Fails with
    /// [`Error::TaskManagement`] if the target does not complete the reset, and drops the
    /// connection if it does not answer within [`TMF_TIMEOUT`].
    pub async fn lun_reset(&self) -> Result<()> {
        let c = self.connection().await?;
        c.lun_reset(self.lun).await
    }

    fn block_len(&self) -> Result<u32> {
        self.capacity
            .get()
            .map(|c| c.block_len)
            .ok_or_else(|| Error::InvalidRequest("capacity unknown: call read_capacity".into()))
    }

    /// READ(16) of `blocks` blocks at `lba`, into a fresh buffer.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<BytesMut> {
        self.read_into(lba, blocks, BytesMut::new()).await
    }

    /// READ(16) reusing `buf` (resized to the transfer length).
    pub async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<BytesMut> {
        if blocks == 0 {
            return Err(Error::InvalidRequest("read of zero blocks".into()));
        }
        let len = blocks as usize * self.block_len()? as usize;
        let c = self
            .command(scsi::read16(lba, blocks), DataDir::Read(buf, len))
            .await?;
        if c.data.len() != len {
            return Err(Error::Protocol(format!(
                "READ returned {} of {len} bytes",
                c.data.len()
            )));
        }
        Ok(c.data)
    }

    async fn write_inner(&self, lba: u64, data: Bytes, fua: bool) -> Result<()> {
        let bl = self.block_len()? as usize;
        if data.is_empty() || data.len() % bl != 0 {
            return Err(Error::InvalidRequest(format!(
                "write of {} bytes is not a positive multiple of the {bl}-byte block",
                data.len()
            )));
        }
        let blocks = u32::try_from(data.len() / bl)
            .map_err(|_| Error::InvalidRequest("write too large".into()))?;
        self.command(scsi::write16(lba, blocks, fua), DataDir::Write(data))
            .await?;
        Ok(())
    }

    /// WRITE(16) of `data` (a whole number of blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: Bytes) -> Result<()> {
        self.write_inner(lba, data, false).await
    }

    /// WRITE(16) with FUA: the target must make it durable before answering.
    pub async fn write_fua(&self, lba: u64, data: Bytes) -> Result<()> {
        self.write_inner(lba, data, true).await
    }

    /// SYNCHRONIZE CACHE(10) over the whole LUN.
    pub async fn sync_cache(&self) -> Result<()> {
        self.command(scsi::sync_cache10(), DataDir::None).await?;
        Ok(())
    }

    /// Standard INQUIRY.
    pub async fn inquiry(&self) -> Result<Inquiry> {
        let c = self
            .command(scsi::inquiry(96), DataDir::Read(BytesMut::new(), 96))
            .await?;
        Inquiry::parse(&c.data).ok_or_else(|| Error::Protocol("short INQUIRY data".into()))
    }

    /// READ CAPACITY(16), falling back to (10); remembers the block length for read/write.
    pub async fn read_capacity(&self) -> Result<Capacity> {
        let cap = match self
            .command(scsi::read_capacity16(), DataDir::Read(BytesMut::new(), 32))
            .await
        {
            Ok(c) => Capacity::parse16(&c.data),
            Err(Error::Scsi { sense: Some(s), .. }) if s.key == SenseKey::ILLEGAL_REQUEST => {
                let c = self
                    .command(scsi::read_capacity10(), DataDir::Read(BytesMut::new(), 8))
                    .await?;
                Capacity::parse10(&c.data)
            }
            Err(e) => return Err(e),
        }
        .ok_or_else(|| Error::Protocol("short READ CAPACITY data".into()))?;
        if cap.block_len == 0 || cap.block_len % 512 != 0 {
            return Err(Error::Protocol(format!(
                "unsupported block length {}",
                cap.block_len
            )));
        }
        let _ = self.capacity.set(cap);
        Ok(cap)
    }

    /// REPORT LUNS.
    pub async fn report_luns(&self) -> Result<Vec<u64>> {
        let c = self
            .command(
                scsi::report_luns(4096),
                DataDir::Read(BytesMut::new(), 4096),
            )
            .await?;
        Ok(scsi::parse_report_luns(&c.data))
    }

    /// Log out (RFC 7143 §11.14) and close. Commands still in flight fail; recovery stops.
    pub async fn logout(self) -> Result<()> {
        self.link.closing.store(true, Ordering::Release);
        if let Some(h) = &self.supervisor {
            h.abort();
        }
        // Nothing to log out of while recovering: the old connection is gone and no new one
        // will come (the supervisor is stopped).
        let Some(c) = self.link.up() else {
            let reason = match &*self.link.state.borrow() {
                LinkState::Recovering { reason, .. } => reason.clone(),
                _ => ConnectionLoss::Local(LocalClose::Recovering),
            };
            // Commands kept for the next connection end with the session.
            let _ = self.link.core.with(|g| {
                g.session.end(
                    Instant::now(),
                    ConnectionError {
                        by: Side::Initiator,
                        reason: CloseReason::Logout,
                    },
                )
            });
            return Err(Error::ConnectionLost(reason));
        };
        c.logout().await
    }
}

impl Shared {
    /// Submits one command to the engine session (ITT `itt`, or a fresh one); its end (or a
    /// request for its data again) comes on the returned receiver. While the connection is
    /// lost and recovery is on, the engine keeps it for the next connection.
    fn submit(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        itt: Option<u32>,
        binding: Binding,
        until: Until<'_>,
    ) -> Result<(u32, oneshot::Receiver<Done>)> {
        let data = match dir {
            DataDir::None => engine::Data::None,
            DataDir::Write(b) => engine::Data::Write(b),
            DataDir::Read(buf, len) => engine::Data::Read {
                buf,
                len: u32::try_from(len)
                    .map_err(|_| Error::InvalidRequest("transfer over 4 GiB".into()))?,
            },
        };
        let (tx, rx) = oneshot::channel();
        let cmd = engine::Command {
            lun,
            cdb,
            data,
            timed: until.timed(),
        };
        // One lock for the ITT (when the caller has none yet) and the submission.
        let counters = &self.core.counters;
        self.core.with_timer(|g| {
            let itt = itt.unwrap_or_else(|| g.session.alloc_itt());
            match g.session.submit_as(Instant::now(), itt, cmd, binding) {
                Ok(itt) => {
                    // The connection whose transform the caller holds (`self`), which may
                    // already have been replaced: then the completion brings the new one.
                    g.waiters.insert(itt, (tx, self.st.generation));
                    Ok((itt, rx))
                }
                Err(proto::SubmitError::LogoutRequested) => Err(Error::LogoutRequested),
                Err(proto::SubmitError::RecoveryTimedOut { after, lost }) => {
                    Counters::bump(&counters.timed_out);
                    Err(Error::RecoveryTimedOut {
                        after,
                        reason: g.conn.loss(lost),
                    })
                }
                Err(proto::SubmitError::Closed(_)) => Err(g.conn.lost()),
                Err(_) => Err(Error::InvalidRequest("transfer over 4 GiB".into())),
            }
        })?
    }

    /// Waits for command `itt` to end (or to need its data again). The engine ends it: with
    /// its status, or past the command timeout with `TimedOut` or the connection's end (its
    /// escalation, RFC 7143 §11.5.1), or a session recovery decision; or the caller aborts it.
    async fn wait(&self, itt: u32, rx: oneshot::Receiver<Done>, until: Until<'_>) -> Done {
        match until {
            Until::Abort(abort) => {
                let mut rx = rx;
                tokio::select! {
                    biased;
                    r = &mut rx => r.unwrap_or_else(|_| Done::Ended(Err(self.lost()), None)),
                    () = abort.cancelled() => Done::Ended(self.abort_asked(itt, rx).await, None),
                }
            }
            Until::Status | Until::Timeout => rx
                .await
                .unwrap_or_else(|_| Done::Ended(Err(self.lost()), None)),
        }
    }

    /// A command's end, as [`Shared::wait`] gives it, for a command whose data is not made
    /// per connection (a `Rebind` cannot come for it).
    async fn wait_ended(
        &self,
        itt: u32,
        rx: oneshot::Receiver<Done>,
        until: Until<'_>,
    ) -> (Result<Passthrough>, Option<Arc<dyn PayloadTransform>>) {
        match self.wait(itt, rx, until).await {
            Done::Ended(r, t) => (r, t),
            Done::Rebind(_) => (Err(self.lost()), None),
        }
    }

    /// See [`Session::lun_reset`].
    async fn lun_reset(&self, lun: u64) -> Result<()> {
        self.refuse_after_logout_request()?;
        let (tx, rx) = oneshot::channel();
        self.core.with_timer(|g| {
            if let Some(itt) = g.session.lun_reset(Instant::now(), lun) {
                g.tmf_waiters.insert(itt, tx);
            }
        })?;
        // The engine drops the connection when the answer does not come within TMF_TIMEOUT.
        match rx.await {
            Ok(TmfResponse::FUNCTION_COMPLETE) => Ok(()),
            Ok(other) => Err(Error::TaskManagement(other.0)),
            Err(_) => Err(self.lost()),
        }
    }

    fn refuse_after_logout_request(&self) -> Result<()> {
        if self.st.logout_asked.load(Ordering::Acquire) {
            return Err(Error::LogoutRequested);
        }
        Ok(())
    }

    /// ABORT TASK asked by the caller ([`Until::Abort`]; RFC 7143 §11.5.1): a gateway
    /// forwarding its host's ABORT TASK. The task stays in the engine until the response, so
    /// its PDUs are still handled in order. Ends with [`Error::TaskAborted`] when the target
    /// ended the task (Function complete, or Task does not exist: it finished and its status
    /// crossed the abort), or with the command's own answer when that came first or the
    /// target refused the abort (the command then runs to its end; §11.6.1). A command kept
    /// for the next connection ends at once, never sent again.
    async fn abort_asked(&self, itt: u32, mut rx: oneshot::Receiver<Done>) -> Result<Passthrough> {
        tracing::debug!(itt, "ABORT TASK asked by the caller");
        let (tx, mut tmf_rx) = oneshot::channel();
        self.core.with_timer(|g| {
            if let Some(t) = g.session.abort(Instant::now(), itt) {
                g.tmf_waiters.insert(t, tx);
            }
        })?;
        let ended = |d: std::result::Result<Done, oneshot::error::RecvError>| match d {
            Ok(Done::Ended(r, _)) => r,
            _ => Err(self.lost()),
        };
        let first = tokio::select! {
            biased;
            r = &mut rx => Ok(r),
            t = &mut tmf_rx => Err(t),
        };
        match first {
            Ok(r) => ended(r),
            Err(Ok(response)) if ends_the_task(response) => {
                Err(Error::TaskAborted("ABORT TASK".into()))
            }
            // Refused, or no TMF sent (the task had ended): the command's own answer.
            Err(_) => ended(rx.await),
        }
    }

    /// See [`Session::logout`].
    async fn logout(&self) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        let sent = self.core.with_timer(|g| {
            let itt = g.session.logout(Instant::now());
            if itt.is_some() {
                g.closed_waiters.push(tx);
            }
            itt
        })?;
        if sent.is_none() {
            return Err(self.lost());
        }
        match tokio::time::timeout(Duration::from_secs(5), rx).await {
            Ok(Ok(())) => {
                let ok = self
                    .core
                    .with(|g| g.session.connection().closed())?
                    .is_some_and(|e| e.reason == CloseReason::Logout);
                if ok {
                    Ok(())
                } else {
                    Err(self.lost())
                }
            }
            Ok(Err(_)) => Err(self.lost()),
            Err(_) => Err(Error::Timeout("logout")),
        }
    }
}

/// Runs the engine's timers: NOP-Out keepalive and its timeout, command timeouts and their
/// escalation, task management timeouts. It only passes the time in.
async fn timer(shared: Arc<Shared>) {
    loop {
        let woken = shared.st.wake_timer.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let Ok(deadline) = shared.with_io(true, |g| {
            let d = g.session.poll_timeout();
            g.timer_at = d;
            d
        }) else {
            return;
        };
        match deadline {
            Some(d) => {
                tokio::select! {
                    () = tokio::time::sleep_until(d.into()) => {
                        if shared
                            .with_io(false, |g| g.session.handle_timeout(Instant::now()))
                            .is_err()
                        {
                            return;
                        }
                    }
                    () = &mut woken => {}
                }
            }
            None => woken.await,
        }
    }
}

/// The one framed write of this connection: drains the engine's PDUs (ExpStatSN stamped as
/// they leave it) into the socket, batching what is queued into vectored writes. In a sealed
/// session every PDU is record-protected here, in wire order (docs/seal.md §4a).
async fn writer(
    wr: OwnedWriteHalf,
    codec: Codec,
    shared: Arc<Shared>,
    sealer: Option<ipsan_seal::RecordSealer>,
) {
    if let Err(e) = writer_inner(wr, codec, &shared, sealer).await {
        shared.kill(e);
    }
}

async fn writer_inner(
    mut wr: OwnedWriteHalf,
    codec: Codec,
    shared: &Shared,
    mut sealer: Option<ipsan_seal::RecordSealer>,
) -> std::result::Result<(), ConnectionLoss> {
    let io = |e: std::io::Error| ConnectionLoss::Io {
        op: IoOp::Send,
        kind: e.kind(),
    };
    let mut out = ipsan_tcp::vectored::Segments::default();
    let mut batch: Vec<Pdu> = Vec::with_capacity(512);
    loop {
        let woken = shared.st.wake_writer.notified();
        tokio::pin!(woken);
        woken.as_mut().enable();
        let closed = shared
            .with_io(true, |g| {
                let mut bytes = 0usize;
                // Batch what is queued so many small PDUs go out in one syscall.
                while bytes < 4 * 1024 * 1024 && batch.len() < 512 {
                    let Some(p) = g.session.poll_transmit() else {
                        break;
                    };
                    bytes += p.data.len();
                    batch.push(p);
                }
                g.session.connection().closed().is_some()
            })
            .map_err(|_| ConnectionLoss::Local(LocalClose::Poisoned))?;
        if batch.is_empty() {
            if closed {
                break;
            }
            woken.await;
            continue;
        }
        let tr = shared.core.observer.get();
        for mut pdu in batch.drain(..) {
            observe_sent(tr, &pdu);
            // ---- SEAL RECORD HOOK (framed write): one tag per PDU, in wire order ----
            if let Some(s) = &mut sealer {
                s.protect(&mut pdu).map_err(|e| {
                    tracing::warn!("seal: cannot protect a PDU: {e}; dropping the connection");
                    ConnectionLoss::SealExhausted
                })?;
            }
            let trailer = codec
                .encode_head(&pdu, out.head())
                .map_err(ConnectionLoss::Encode)?;
            out.push_data(pdu.data, trailer.as_bytes());
        }
        out.write_to(&mut wr).await.map_err(io)?;
    }
    let _ = wr.shutdown().await;
    Ok(())
}

/// Observer events for a PDU leaving (see [`crate::observe`]).
fn observe_sent(tr: Option<&Observer>, pdu: &Pdu) {
    let Some(tr) = tr else { return };
    match &pdu.header {
        Header::ScsiCommand(c) => {
            tr.on_event(c.itt, CommandEvent::CmdSent, 0, pdu.data.len() as u64)
        }
        Header::DataOut(d) if d.final_ => tr.on_event(
            d.itt,
            CommandEvent::DataOut,
            u64::from(d.buffer_offset),
            pdu.data.len() as u64,
        ),
        _ => {}
    }
}

/// Observer events for a PDU arriving (see [`crate::observe`]).
fn observe_received(tr: Option<&Observer>, pdu: &Pdu) {
    let Some(tr) = tr else { return };
    match &pdu.header {
        Header::DataIn(h) => {
            let len = pdu.data.len() as u64;
            if h.buffer_offset == 0 {
                tr.on_event(h.itt, CommandEvent::DataInFirst, 0, len);
            }
            if h.final_ || h.status_present {
                tr.on_event(
                    h.itt,
                    CommandEvent::DataInLast,
                    u64::from(h.buffer_offset),
                    len,
                );
            }
            if h.status_present {
                tr.on_event(h.itt, CommandEvent::Status, 0, 0);
            }
        }
        Header::ScsiResponse(h) => tr.on_event(h.itt, CommandEvent::Status, 0, 0),
        Header::R2t(h) => tr.on_event(
            h.itt,
            CommandEvent::R2t,
            u64::from(h.buffer_offset),
            u64::from(h.desired_data_transfer_length),
        ),
        _ => {}
    }
}

/// The one framed read of this connection: PDUs into the engine until it ends. In a sealed
/// session nothing of a PDU beyond its lengths is read before its record tag verifies
/// ([`ipsan_seal::read_pdu`], the same step as the target's); any failure (tag, digest,
/// opcode, field, length) drops the connection, and every command in flight fails with
/// [`Error::SealForgery`].
async fn reader(
    mut rd: OwnedReadHalf,
    mut buf: BytesMut,
    codec: Codec,
    shared: Arc<Shared>,
    mut opener: Option<ipsan_seal::RecordOpener>,
) {
    let tr = shared.core.observer.get().cloned();
    loop {
        loop {
            // ---- SEAL RECORD HOOK (framed read): nothing unverified reaches the engine ----
            match ipsan_seal::read_pdu(&codec, opener.as_mut(), &mut buf) {
                Err(ipsan_seal::ReadError::Sealed(f)) => {
                    tracing::warn!(
                        "{f}; nothing of it acted, dropping the connection and failing every command in flight"
                    );
                    let _ = shared.st.forged.set(f.clone());
                    shared.kill(ConnectionLoss::SealForgery(f));
                    return;
                }
                Ok(Some(pdu)) => {
                    observe_received(shared.core.observer.get().or(tr.as_ref()), &pdu);
                    if shared
                        .with_io(false, |g| g.session.handle_pdu(Instant::now(), pdu))
                        .is_err()
                    {
                        return;
                    }
                }
                Ok(None) => break,
                Err(ipsan_seal::ReadError::Wire(e)) => {
                    shared.kill(ConnectionLoss::Framing(e));
                    return;
                }
            }
        }
        if buf.capacity() - buf.len() < 64 * 1024 {
            buf.reserve(256 * 1024);
        }
        match rd.read_buf(&mut buf).await {
            Ok(0) => {
                let _ = shared.with_io(false, |g| g.session.peer_closed(Instant::now()));
                return;
            }
            Ok(_) => {}
            Err(e) => {
                shared.kill(ConnectionLoss::Io {
                    op: IoOp::Receive,
                    kind: e.kind(),
                });
                return;
            }
        }
    }
}
