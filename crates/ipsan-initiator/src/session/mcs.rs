//! A session of several connections (RFC 7143 §4.2, MaxConnections > 1; issue 28): the tokio
//! driver of `iscsi_proto::engine::mcs`.
//!
//! ```text
//!  leading login (MaxConnections=N offered) ─► the target answers M <= N
//!  M-1 joining logins (the session's ISID and TSIH, CIDs 1..M, RFC 7143 §5.3.4), each with
//!  its own Seal login when sealed (its own CPace, record keys and counters)
//!  callers ──command──► [Mutex<engine::mcs::Session>] one CmdSN window, a connection chosen
//!                       (Spread: least outstanding bytes or round robin)
//!      per connection: writer (poll_transmit(cid)) ─► socket ─► reader (handle_pdu(cid))
//!      one timer for the session (keepalives, command timeouts of every connection)
//! ```
//! Sealed sessions: a command's data is sealed under the keys of the connection it goes on
//! ([`mcs::Session::pick`], then [`mcs::Session::submit_on`]), and a read's Data-In is opened
//! with the keys of the connection it came on (connection allegiance, §4.2.3).
//!
//! ErrorRecoveryLevel 0 (the default): a connection that ends ends the session (every other
//! connection is closed and every command fails with the first loss), as a one-connection
//! session without recovery does.
//!
//! ErrorRecoveryLevel 2 ([`LoginOptions::error_recovery_level`] = 2 and a target that agrees,
//! `[server] error_recovery_level = 2` for ipsan's; RFC 7143 §7.2, §7.4.3): a connection that
//! ends ends nothing. The engine holds its tasks and reassigns them to a live connection by
//! TASK REASSIGN after a Logout removing it for recovery (or to its CID's next login), and
//! sends again, with their CmdSNs, the commands the target never had; callers only wait. A
//! relogin task logs a connection in again for each lost one with backoff (`recovery::Backoff`),
//! under a fresh CID: a Logout for recovery naming the old CID may still be on its way to the
//! target, and would end a new connection that had taken it (§11.14.1 names connections by
//! CID alone). So the session returns to its connections; if none is open and
//! none comes back within [`SessionConfig::recovery_timeout`] (default 120 s) the session ends
//! and the waiting commands fail with [`Error::ConnectionLost`].
//!
//! Sealed sessions at ErrorRecoveryLevel 2 (docs/seal.md §3 "Several connections"): data
//! sealed for one connection never goes on another. The plaintext of every write in flight is
//! kept (the caller's `Bytes`, not a copy); before a failed connection's tasks go to connection
//! `to`, the engine asks for their write data again ([`mcs::Event::Reseal`]) and it is sealed
//! from the plaintext under `to`'s keys and counters (on this thread, under the session's
//! lock: recovery is rare, and the TASK REASSIGNs wait for it); a target collecting such a
//! write asks for all of it again. A read is opened under the keys of the connection it
//! completed on; a read the target adopted answers with Data-In it sealed for the failed
//! connection, which does not open there, and is then sent again as a new command (reads
//! change nothing). A command made for a connection that failed before it left, or picked
//! while none is open, is made again for another. Nothing sealed for one connection is opened
//! under another's keys, so a relay that replays a failed connection's records or data into
//! the reassigned task makes it fail, never succeed.
//!
//! Files: each connection's reader and writer are `mcs/conns.rs`; ERL 2's relogin task is
//! `mcs/relogin.rs`.
//!
//! A target that answers MaxConnections=1 gets one connection: the session is then the same
//! one connection as [`Session`] would make (without its session recovery).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use iscsi_proto::engine::initiator::Reassignment;
use iscsi_proto::engine::mcs::{self, Spread};
use iscsi_proto::login::originator::Join;
use serde::Serialize;

use super::*;

mod conns;
mod relogin;

use conns::start_conn;
use relogin::{mcs_relogin, Relogin};

/// How many connections, and how commands spread over them.
#[derive(Clone, Copy, Debug)]
pub struct McsConfig {
    /// Connections wanted (MaxConnections offered at the leading login); the target may
    /// grant fewer.
    pub connections: u16,
    pub spread: Spread,
}

impl Default for McsConfig {
    fn default() -> Self {
        Self {
            connections: 1,
            spread: Spread::LeastQueued,
        }
    }
}

/// What ErrorRecoveryLevel 2 did in a session of several connections
/// ([`McsSession::recovery`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct McsRecovery {
    /// Connections that ended while the session went on.
    pub connections_lost: u64,
    /// Connections logged in again after one ended.
    pub relogins: u64,
    /// Tasks moved to another connection by TASK REASSIGN (Function complete).
    pub reassigned: u64,
    /// Tasks the target never had, sent again with their CmdSN after TASK REASSIGN.
    pub retried: u64,
    /// Tasks whose TASK REASSIGN was refused (they failed back).
    pub refused: u64,
}

/// One connection's side of the driver.
struct McsConn {
    cid: u16,
    wake_writer: Notify,
    /// The payload transform its own login installed (Seal: keyed per connection).
    transform: Option<Arc<dyn PayloadTransform>>,
    /// Why the driver ended it (socket, framing, Seal), when it did.
    dead: OnceLock<ConnectionLoss>,
    io_tasks: Mutex<Vec<AbortHandle>>,
    /// Its socket, for `TCP_INFO` ([`Spread::LeastQueued`]); dropped when its reader or
    /// writer ends.
    sock: Mutex<Option<OwnedFd>>,
    /// Bytes its writer took from the engine and has not yet written into the socket.
    unflushed: AtomicU64,
    /// Its socket took [`COMMAND_RTO_MIN`] (Linux 6.15 and later).
    rto_floor: bool,
}

/// A command's end as its caller receives it (sealed sessions: which keys open its data).
struct McsDone {
    result: engine::TaskResult,
    /// The payload transform of the connection it ended on (Seal: its keys).
    transform: Option<Arc<dyn PayloadTransform>>,
    /// Reassigned by TASK REASSIGN and adopted by the target (ErrorRecoveryLevel 2): Data-In it
    /// sealed before may be under the failed connection's keys.
    adopted: bool,
    /// Made for a connection that stopped taking commands before it left: never sent.
    never_left: bool,
}

/// What one try of a command came to.
enum Attempt {
    Done(Passthrough),
    /// Made for a connection that is gone before it left, or a read whose data is sealed for a
    /// failed connection: made again, for another (ErrorRecoveryLevel 2).
    Again(&'static str),
    /// No connection is open (ErrorRecoveryLevel 2 logs one in): wait, then try again.
    Wait,
}

/// What the data of a read adopted by TASK REASSIGN (ErrorRecoveryLevel 2) came to.
#[derive(Debug)]
enum Adopted {
    /// It opened under the keys of the connection it completed on.
    Opened(BytesMut),
    /// Sealed for the connection the read was first sent on (the target sealed it before the
    /// reassignment): not forged, but never used on another connection; read again.
    Stale,
    /// It opens under neither: refused as a forgery (and read again).
    Forged,
}

/// Opens an adopted read's data under `keys`, the connection it completed on; what does not
/// open there is checked under `first`'s, the connection it was first sent on, only to tell
/// a stale Data-In from a forged one (that plaintext is dropped: nothing sealed for one
/// connection is used on another). Neither check logs a refusal; the caller says which it was.
async fn open_adopted(
    info: CommandInfo,
    data: BytesMut,
    keys: &Arc<dyn PayloadTransform>,
    first: &Arc<dyn PayloadTransform>,
) -> Adopted {
    let copy = (!Arc::ptr_eq(keys, first)).then(|| data.clone());
    if let Ok(d) = keys.inbound_quiet(info, data).await {
        return Adopted::Opened(d);
    }
    let stale = match copy {
        Some(c) => first.inbound_quiet(info, c).await.is_ok(),
        None => false,
    };
    if stale {
        Adopted::Stale
    } else {
        Adopted::Forged
    }
}

/// Tries of one command at most (each a new ITT), counting only [`Attempt::Again`].
const MAX_TRIES: u32 = 8;
impl McsConn {
    /// What its socket has yet to deliver and how fast it goes (`TCP_INFO`: bytes not sent,
    /// segments in flight, congestion window over smoothed RTT), plus what its writer holds.
    fn queue(&self) -> Option<mcs::QueueReport> {
        let g = self.sock.lock().ok()?;
        let info = ipsan_tcp::tcp_info(g.as_ref()?).ok()?;
        let mss = u64::from(info.snd_mss.max(1));
        let per_sec = if info.rtt_us == 0 {
            0
        } else {
            u64::from(info.cwnd) * mss * 1_000_000 / u64::from(info.rtt_us)
        };
        Some(mcs::QueueReport {
            bytes: u64::from(info.notsent_bytes)
                + u64::from(info.unacked) * mss
                + self.unflushed.load(Ordering::Relaxed),
            per_sec,
        })
    }

    /// Its reader or writer ended: no more `TCP_INFO` (and the socket is not kept open).
    fn forget_socket(&self) {
        if let Ok(mut g) = self.sock.lock() {
            g.take();
        }
    }
}

/// The minimum retransmission timeout of each connection's socket
/// ([`ipsan_tcp::set_rto_min`]; Linux's default is 200 ms). The target runs the session's
/// commands in one CmdSN order (RFC 7143 §4.2.2.1), so a command lost on one connection holds
/// every later command of every connection until TCP resends it. A read's command is a lone
/// small segment (its data comes the other way), which Linux resends only at its RTO (the
/// smoothed RTT plus at least the minimum) or a tail loss probe (2 × SRTT + the minimum),
/// whichever is first: the whole session stood still ~300 ms per lost command at 64 ms RTT,
/// 1–6 times in 10 s at 0.1 % loss; with 20 ms a lost lone request costs ~110 ms
/// (docs/results/mcs-sweep-3). A fast link's RTO stays far above its round trip's jitter.
pub(crate) const COMMAND_RTO_MIN: Duration = Duration::from_millis(20);

/// How long after a burst that ended with a command or Data-Out, with nothing heard for that
/// task, each connection of a session of several sends its tail probe (a NOP-Out that asks no
/// answer, RFC 7143 §11.18; `iscsi_proto::engine::initiator::Connection::set_tail_probe`),
/// by default only where the kernel refused [`COMMAND_RTO_MIN`]: TCP then resends a lost
/// command when the probe is acknowledged selectively (RACK, RFC 8985 §6), about a round trip
/// plus a quarter of the minimum one after the command left, where the kernel's timer waits
/// the round trip plus at least 200 ms (a lone lost request at 64 ms RTT: 282–290 ms longer
/// without the probe, 86 ms with it; docs/results/mcs-sweep-4 `lone-probe.txt`). With the
/// 20 ms floor the timer is nearly as quick (91–92 ms; 69–86 with the probe), and probes
/// measured no gain in the sweep (`probe-on-off/`: 1.03×, within the noise). Well inside
/// RACK's reordering window on a WAN, and past the time a near target answers.
pub(crate) const TAIL_PROBE_AFTER: Duration = Duration::from_millis(5);

/// How often, at most, [`Spread::LeastQueued`] reads every connection's `TCP_INFO`.
const QUEUE_PROBE_EVERY: Duration = Duration::from_millis(1);

struct McsInner {
    session: mcs::Session,
    conns: Vec<Arc<McsConn>>,
    waiters: HashMap<u32, oneshot::Sender<McsDone>>,
    /// Task management requests waiting for their response, by the TMF's ITT.
    tmf_waiters: HashMap<u32, oneshot::Sender<TmfResponse>>,
    /// Commands that ended on each connection so far, by CID.
    placed: HashMap<u16, u64>,
    /// The first connection loss: the session is over (ERL 0).
    ended: Option<ConnectionLoss>,
    timer_at: Option<Instant>,
    /// ErrorRecoveryLevel 2: CIDs whose connection ended, for the relogin task.
    relogin: Vec<u16>,
    recovery: McsRecovery,
    /// The session's Logout went: nothing is logged in again.
    logging_out: bool,
    /// The CID a relogin tries next (fresh: never one in use or recovering).
    next_cid: u16,
    /// Sealed, ErrorRecoveryLevel 2: the plaintext of every write in flight, by ITT, to seal
    /// it again for the connection it is reassigned to.
    plain: HashMap<u32, (CommandInfo, Bytes)>,
    /// [`mcs::Event::Reseal`]s whose connection's driver side is not started yet: (ITT, CID).
    reseals: Vec<(u32, u16)>,
    /// How each task's last TASK REASSIGN ended, by ITT.
    moved: HashMap<u32, Reassignment>,
    /// Seal on every connection (each with its own keys): a command's data is made for the
    /// connection it goes on.
    sealed: bool,
    /// [`Spread::LeastQueued`]: when the connections' sockets were last read.
    probed: Option<Instant>,
}

impl McsInner {
    /// [`Spread::LeastQueued`]: tells the engine what each connection's socket holds, at most
    /// every [`QUEUE_PROBE_EVERY`] (a `getsockopt` per connection).
    fn probe_queues(&mut self) {
        let now = Instant::now();
        if self
            .probed
            .is_some_and(|t| now.duration_since(t) < QUEUE_PROBE_EVERY)
        {
            return;
        }
        self.probed = Some(now);
        for c in &self.conns {
            if let Some(q) = c.queue() {
                self.session.report_queue(c.cid, q);
            }
        }
    }
}

impl McsInner {
    /// Whether `c` is still the driver of its CID (a relogin replaces it): a replaced one's
    /// reader and writer must never touch the engine connection that took its CID.
    fn current(&self, c: &McsConn) -> bool {
        self.conns.iter().any(|x| std::ptr::eq(Arc::as_ptr(x), c))
    }
}

struct McsCore {
    inner: Mutex<McsInner>,
    /// Commands go by [`Spread::LeastQueued`]: the sockets are read before the engine runs.
    least_queued: bool,
    wake_timer: Notify,
    /// The relogin task has CIDs to log in again.
    wake_relogin: Notify,
    /// The engine's tail probe is on (mirrors `Session::set_tail_probe`): without it a
    /// writer's flush has nothing to arm and takes no lock.
    probing: AtomicBool,
}

impl McsCore {
    fn lock(&self) -> Result<std::sync::MutexGuard<'_, McsInner>> {
        self.inner
            .lock()
            .map_err(|_| Error::ConnectionLost(ConnectionLoss::Local(LocalClose::Poisoned)))
    }

    /// Runs `f` on the engine, hands its events to the waiters and wakes the writers with
    /// work (and the timer when `timer` and the next deadline moved earlier).
    fn with<T>(&self, timer: bool, f: impl FnOnce(&mut McsInner) -> T) -> Result<T> {
        let mut g = self.lock()?;
        if self.least_queued {
            g.probe_queues();
        }
        let r = f(&mut g);
        Self::dispatch(&mut g);
        if !g.relogin.is_empty() {
            self.wake_relogin.notify_one();
        }
        for c in &g.conns {
            let closed = g
                .session
                .connection(c.cid)
                .is_none_or(|x| x.closed().is_some());
            if closed || g.session.has_transmit(c.cid) {
                c.wake_writer.notify_one();
            }
        }
        if timer {
            let earlier = match (g.session.poll_timeout(), g.timer_at) {
                (Some(d), Some(t)) => d < t,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if earlier {
                self.wake_timer.notify_one();
            }
        }
        Ok(r)
    }

    fn dispatch(g: &mut McsInner) {
        loop {
            let mut closed = Vec::new();
            while let Some(ev) = g.session.poll_event() {
                match ev {
                    mcs::Event::Completed { itt, cid, result } => {
                        if let Some(cid) = cid {
                            *g.placed.entry(cid).or_default() += 1;
                        }
                        g.plain.remove(&itt);
                        let adopted = matches!(g.moved.remove(&itt), Some(Reassignment::Adopted));
                        let never_left = g.session.take_never_left(itt);
                        let transform = cid
                            .and_then(|c| g.conns.iter().find(|x| x.cid == c))
                            .and_then(|x| x.transform.clone());
                        if let Some(tx) = g.waiters.remove(&itt) {
                            let _ = tx.send(McsDone {
                                result,
                                transform,
                                adopted,
                                never_left,
                            });
                        }
                    }
                    mcs::Event::Reseal { itt, to } => g.reseals.push((itt, to)),
                    mcs::Event::ConnectionClosed { cid, error, gap } => {
                        tracing::debug!(cid, ?error, gap, "connection ended");
                        let reason = g
                            .conns
                            .iter()
                            .find(|c| c.cid == cid)
                            .and_then(|c| c.dead.get().cloned())
                            .unwrap_or_else(|| ConnectionLoss::from_engine(error));
                        closed.push((cid, reason));
                    }
                    mcs::Event::LogoutRequested { cid, within_secs } => {
                        tracing::info!(cid, within_secs, "target requests logout (AsyncEvent 1)");
                    }
                    mcs::Event::Rejected {
                        cid,
                        reason,
                        opcode,
                    } => {
                        tracing::warn!(cid, reason = reason.0, ?opcode, "target rejected a PDU");
                    }
                    mcs::Event::TimeoutStep { cid, itt, step } => {
                        tracing::warn!(cid, itt, ?step, "command timed out");
                    }
                    mcs::Event::TaskManagement { itt, response, .. } => {
                        if let Some(tx) = g.tmf_waiters.remove(&itt) {
                            let _ = tx.send(response);
                        }
                    }
                    mcs::Event::Reassigned { itt, cid, outcome } => {
                        tracing::debug!(itt, cid, ?outcome, "task reassigned");
                        if g.waiters.contains_key(&itt) {
                            g.moved.insert(itt, outcome);
                        }
                        match outcome {
                            Reassignment::Adopted => g.recovery.reassigned += 1,
                            Reassignment::Retried => g.recovery.retried += 1,
                            Reassignment::Refused(r) => {
                                g.recovery.refused += 1;
                                tracing::warn!(itt, cid, response = r.0, "TASK REASSIGN refused");
                            }
                        }
                    }
                }
            }
            let resealed = Self::reseal(g);
            if closed.is_empty() {
                if resealed {
                    continue;
                }
                break;
            }
            if g.session.recovers_connections() && g.session.ended().is_none() {
                // ErrorRecoveryLevel 2: the engine reassigns the tasks; the CID logs in again.
                for (cid, reason) in closed {
                    tracing::info!(cid, %reason, "connection lost; its tasks are reassigned");
                    g.recovery.connections_lost += 1;
                    if !g.logging_out && !g.relogin.contains(&cid) {
                        g.relogin.push(cid);
                    }
                }
                continue;
            }
            // ErrorRecoveryLevel 0 (or a session given up): one connection's end is the
            // session's.
            for (_, reason) in closed {
                if g.ended.is_none() {
                    g.ended = Some(reason);
                }
            }
            let open: Vec<u16> = g.session.cids().collect();
            for cid in open {
                if g.session
                    .connection(cid)
                    .is_some_and(|c| c.closed().is_none())
                {
                    g.session
                        .close(Instant::now(), cid, Side::Initiator, CloseReason::Local);
                }
            }
        }
        if g.ended.is_some() {
            // Unanswered task management fails with the session.
            g.tmf_waiters.clear();
        }
        if g.ended.is_some() && g.session.open_connections() == 0 {
            // Whatever the engine did not end (nothing should be left) ends here.
            for (_, tx) in g.waiters.drain() {
                let _ = tx.send(McsDone {
                    result: Err(TaskError::ConnectionLost(ConnectionError {
                        by: Side::Initiator,
                        reason: CloseReason::Local,
                    })),
                    transform: None,
                    adopted: false,
                    never_left: false,
                });
            }
        }
    }

    /// Seals the write data of reassigned tasks again for the connection each goes to, from
    /// the plaintext kept (see the module notes); one whose connection's driver side has not
    /// started yet waits for it. True when the engine got an answer.
    fn reseal(g: &mut McsInner) -> bool {
        if g.reseals.is_empty() {
            return false;
        }
        let mut answered = false;
        let pending = std::mem::take(&mut g.reseals);
        for (itt, to) in pending {
            if g.session
                .connection(to)
                .is_none_or(|c| c.closed().is_some())
            {
                // Gone: the engine asks again for the next connection.
                continue;
            }
            let Some(t) = g
                .conns
                .iter()
                .find(|c| c.cid == to)
                .and_then(|c| c.transform.clone())
            else {
                g.reseals.push((itt, to));
                continue;
            };
            let data = match g.plain.get(&itt) {
                Some((info, plain)) => match t.outbound_now(*info, plain) {
                    Some(Ok(b)) => Some(b),
                    Some(Err(e)) => {
                        tracing::warn!(itt, to, "cannot seal a reassigned write again: {e}");
                        None
                    }
                    None => None,
                },
                None => {
                    tracing::warn!(itt, to, "no plaintext kept for a reassigned write");
                    None
                }
            };
            tracing::debug!(
                itt,
                to,
                ok = data.is_some(),
                "write sealed again for its new connection"
            );
            g.session.resealed(Instant::now(), itt, to, data);
            answered = true;
        }
        answered
    }

    fn lost(&self) -> Error {
        let reason = self
            .lock()
            .ok()
            .and_then(|g| g.ended.clone())
            .unwrap_or(ConnectionLoss::Local(LocalClose::Unknown));
        Error::ConnectionLost(reason)
    }

    /// Connection `c`'s writer wrote what it took into the socket: its tail probe is armed
    /// (the timer woken if that is now the first deadline).
    fn flushed(&self, c: &McsConn) {
        if !self.probing.load(Ordering::Relaxed) {
            return;
        }
        let Ok(mut g) = self.inner.lock() else {
            return;
        };
        if !g.current(c) {
            return;
        }
        g.session.flushed(c.cid, Instant::now());
        let earlier = match (g.session.poll_timeout(), g.timer_at) {
            (Some(d), Some(t)) => d < t,
            (Some(_), None) => true,
            (None, _) => false,
        };
        if earlier {
            self.wake_timer.notify_one();
        }
    }

    /// Ends connection `cid` for a reason the driver found itself.
    fn kill(&self, conn: &McsConn, reason: ConnectionLoss) {
        let _ = conn.dead.set(reason);
        let _ = self.with(false, |g| {
            if g.current(conn) {
                g.session.close(
                    Instant::now(),
                    conn.cid,
                    Side::Initiator,
                    CloseReason::Local,
                );
            }
        });
    }
}

/// A logged-in session of one or more connections in full feature phase (no session
/// recovery: a lost connection ends it, ErrorRecoveryLevel 0).
pub struct McsSession {
    core: Arc<McsCore>,
    lun: u64,
    capacity: OnceLock<Capacity>,
    params: Negotiated,
    timer: AbortHandle,
    /// ErrorRecoveryLevel 2's relogin task.
    relogin: Option<AbortHandle>,
    /// [`SessionConfig::command_timeout`] applies to the commands.
    timed: bool,
    /// How long a sealed command waits for a connection to be open (ErrorRecoveryLevel 2:
    /// [`SessionConfig::recovery_timeout`]).
    patience: Duration,
}

impl std::fmt::Debug for McsSession {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McsSession")
            .field("lun", &self.lun)
            .field("connections", &self.connections())
            .finish_non_exhaustive()
    }
}

impl Drop for McsSession {
    fn drop(&mut self) {
        self.timer.abort();
        if let Some(r) = &self.relogin {
            r.abort();
        }
        if let Ok(mut g) = self.core.lock() {
            for c in &g.conns {
                if let Ok(t) = c.io_tasks.lock() {
                    for h in t.iter() {
                        h.abort();
                    }
                }
            }
            g.conns.clear();
        }
    }
}

impl McsSession {
    /// Logs in `mcs.connections` connections to the URL's target (fewer if the target grants
    /// fewer: MaxConnections, RFC 7143 §13.2) and reads the LUN's capacity. With one
    /// connection the leading login offers no MaxConnections key beyond what [`Session`]
    /// sends.
    pub async fn open(url: &IscsiUrl, cfg: &SessionConfig, mcs_cfg: McsConfig) -> Result<Self> {
        let s = Self::connect(url, cfg, mcs_cfg).await?;
        io::past_unit_attention(|| s.read_capacity()).await?;
        Ok(s)
    }

    /// The logins, without touching the LUN.
    pub async fn connect(url: &IscsiUrl, cfg: &SessionConfig, mcs_cfg: McsConfig) -> Result<Self> {
        let target = url.require_target()?.to_owned();
        let lun = u64::from_be_bytes(scsi::encode_lun(u64::from(url.lun.unwrap_or(0))));
        let mut cfg = cfg.clone();
        cfg.login.isid = Some(cfg.login.isid.unwrap_or_else(originator::random_isid));
        cfg.login.max_connections = u32::from(mcs_cfg.connections.max(1));
        cfg.login.join = None;
        let lead = login_connection(url, &cfg, &target).await?;
        let granted = lead.li.session_params.max_connections;
        let tsih = lead.li.done.established.tsih;
        let params = lead.li.params.clone();
        let want = u32::from(mcs_cfg.connections.max(1)).min(granted.max(1));
        if want < u32::from(mcs_cfg.connections) {
            tracing::info!(
                wanted = mcs_cfg.connections,
                granted,
                "the target grants fewer connections (MaxConnections)"
            );
        }
        let session = mcs::Session::new(
            mcs::Config {
                spread: mcs_cfg.spread,
                command_timeout: cfg.command_timeout,
            },
            0,
            lead.engine(&cfg),
        );
        let core = Arc::new(McsCore {
            inner: Mutex::new(McsInner {
                session,
                conns: Vec::new(),
                waiters: HashMap::new(),
                tmf_waiters: HashMap::new(),
                placed: HashMap::new(),
                ended: None,
                timer_at: None,
                relogin: Vec::new(),
                recovery: McsRecovery::default(),
                logging_out: false,
                next_cid: 1,
                plain: HashMap::new(),
                reseals: Vec::new(),
                moved: HashMap::new(),
                sealed: lead.li.transform.is_some(),
                probed: None,
            }),
            least_queued: mcs_cfg.spread == Spread::LeastQueued,
            wake_timer: Notify::new(),
            wake_relogin: Notify::new(),
            probing: AtomicBool::new(false),
        });
        let erl2 = {
            let mut g = core.lock()?;
            // Sealed: data is made per connection, so a reassigned write is made again.
            let sealed = g.sealed;
            g.session.reseal_on_reassign(sealed);
            g.session.recovers_connections()
        };
        start_conn(&core, 0, lead)?;
        {
            // Tail probes where the kernel keeps its 200 ms minimum RTO (see TAIL_PROBE_AFTER).
            let mut g = core.lock()?;
            let floor = g.conns.first().is_none_or(|c| c.rto_floor);
            if want > 1 && !floor {
                g.session.set_tail_probe(Some(TAIL_PROBE_AFTER));
                core.probing.store(true, Ordering::Relaxed);
            }
        }
        let timer = tokio::spawn(mcs_timer(core.clone())).abort_handle();
        let relogin = erl2.then(|| {
            tokio::spawn(mcs_relogin(
                core.clone(),
                Relogin {
                    url: url.clone(),
                    cfg: cfg.clone(),
                    target: target.clone(),
                    tsih,
                },
            ))
            .abort_handle()
        });
        core.lock()?.next_cid = u16::try_from(want).unwrap_or(u16::MAX);
        let s = Self {
            core,
            lun,
            capacity: OnceLock::new(),
            params,
            timer,
            relogin,
            timed: cfg.command_timeout.is_some(),
            patience: cfg
                .recovery_timeout
                .unwrap_or(recovery::DEFAULT_RECOVERY_TIMEOUT),
        };
        for cid in 1..want {
            let cid = u16::try_from(cid).map_err(|_| Error::InvalidRequest("CID".into()))?;
            let mut jcfg = cfg.clone();
            jcfg.login.join = Some(Join { tsih, cid });
            let fresh = login_connection(url, &jcfg, &target).await?;
            if fresh.li.done.established.tsih != tsih {
                return Err(Error::Login(format!(
                    "connection {cid} joined session {:#x}, not {tsih:#x}",
                    fresh.li.done.established.tsih
                )));
            }
            let engine = fresh.engine(&jcfg);
            s.core.with(false, |g| {
                g.session
                    .add_connection(Instant::now(), cid, engine)
                    .map_err(|e| Error::Login(e.to_string()))
            })??;
            start_conn(&s.core, cid, fresh)?;
        }
        Ok(s)
    }

    /// What the leading login negotiated.
    pub fn params(&self) -> &Negotiated {
        &self.params
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        self.core
            .lock()
            .map(|g| g.session.open_connections())
            .unwrap_or(0)
    }

    /// Every connection's tail probe (by default [`TAIL_PROBE_AFTER`] in a session of several
    /// connections whose sockets the kernel refused [`COMMAND_RTO_MIN`], none otherwise):
    /// `None` turns it off.
    pub fn set_tail_probe(&self, after: Option<Duration>) {
        let _ = self.core.with(true, |g| {
            g.session.set_tail_probe(after);
            self.core.probing.store(after.is_some(), Ordering::Relaxed);
        });
    }

    /// What ErrorRecoveryLevel 2 did so far (all zero at level 0).
    pub fn recovery(&self) -> McsRecovery {
        self.core.lock().map(|g| g.recovery).unwrap_or_default()
    }

    /// Commands that ended on each connection so far (the connection each went on), by CID,
    /// ascending.
    pub fn commands_per_connection(&self) -> Vec<(u16, u64)> {
        let mut v: Vec<(u16, u64)> = self
            .core
            .lock()
            .map(|g| g.placed.iter().map(|(c, n)| (*c, *n)).collect())
            .unwrap_or_default();
        v.sort_unstable();
        v
    }

    /// The capacity READ CAPACITY found.
    pub fn capacity(&self) -> Option<Capacity> {
        self.capacity.get().copied()
    }

    /// One SCSI command to the session's LUN; a non-GOOD status is [`Error::Scsi`]. With Seal,
    /// the data is sealed (and Data-In opened) under the keys of the connection it goes on.
    pub async fn command(&self, cdb: [u8; 16], dir: DataDir) -> Result<Completion> {
        self.exchange(self.lun, cdb, dir, self.timed, None)
            .await?
            .into_completion()
    }

    /// [`Session::command_to`] on this session: `cdb` to LUN `lun` (the raw 8-byte LUN field),
    /// answered as the target answered, whatever the status (a gateway's remote leg). No
    /// command timeout applies (the host times its commands out).
    pub async fn command_to(&self, lun: u64, cdb: [u8; 16], dir: DataDir) -> Result<Passthrough> {
        self.exchange(lun, cdb, dir, false, None).await
    }

    /// [`McsSession::command_to`] that `abort` can end: once it is cancelled, ABORT TASK goes
    /// on the command's connection (its allegiance, RFC 7143 §11.5.1) and the command ends
    /// with [`Error::TaskAborted`] when the target ended it, or with its own answer if that
    /// came first or the target refused the abort (§11.6.1). A gateway forwards its host's
    /// aborts this way.
    pub async fn command_to_abortable(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        abort: &tokio_util::sync::CancellationToken,
    ) -> Result<Passthrough> {
        self.exchange(lun, cdb, dir, false, Some(abort)).await
    }

    /// LOGICAL UNIT RESET of LUN `lun` (the raw 8-byte LUN field; RFC 7143 §11.5.1) on one
    /// connection. The target ends the LU's tasks of every connection; the engine ends this
    /// session's on the reset's connection, and those on the others end here with an ABORT
    /// TASK each (answered "task does not exist", §11.6.1), so none waits for a status that
    /// will not come. Fails with [`Error::TaskManagement`] if the target refuses the reset.
    pub async fn lun_reset_to(&self, lun: u64) -> Result<()> {
        let (tx, rx) = oneshot::channel();
        let cid = self.core.with(true, |g| {
            if let Some(e) = &g.ended {
                return Err(Error::ConnectionLost(e.clone()));
            }
            let (cid, itt) =
                g.session
                    .lun_reset(Instant::now(), lun)
                    .ok_or(Error::ConnectionLost(ConnectionLoss::Local(
                        LocalClose::Unknown,
                    )))?;
            g.tmf_waiters.insert(itt, tx);
            Ok(cid)
        })??;
        let response = rx.await.map_err(|_| self.core.lost())?;
        if response != TmfResponse::FUNCTION_COMPLETE {
            return Err(Error::TaskManagement(response.0));
        }
        self.core
            .with(true, |g| g.session.end_reset_lun(Instant::now(), cid, lun))?;
        Ok(())
    }

    /// Why the session ended, if it did.
    pub fn failure(&self) -> Option<String> {
        self.core
            .lock()
            .ok()
            .and_then(|g| g.ended.as_ref().map(ToString::to_string))
    }

    /// One command, answered with any status (the one path of [`McsSession::command`] and
    /// [`McsSession::command_to`]). `timed`: [`SessionConfig::command_timeout`] applies;
    /// `abort`: the caller's token (see [`McsSession::command_to_abortable`]).
    async fn exchange(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        timed: bool,
        abort: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Passthrough> {
        let (mut write, mut read) = match dir {
            DataDir::None => (None, None),
            DataDir::Write(b) => (Some(b), None),
            DataDir::Read(buf, len) => (None, Some((buf, len))),
        };
        let mut tries = 0u32;
        let mut waiting_since: Option<tokio::time::Instant> = None;
        loop {
            if abort.is_some_and(tokio_util::sync::CancellationToken::is_cancelled) {
                return Err(Error::TaskAborted("ABORT TASK".into()));
            }
            // Another try gets a fresh read buffer (the last one went with the engine's task).
            let dir = match (write.take(), read.take()) {
                (Some(b), _) => {
                    write = Some(b.clone());
                    DataDir::Write(b)
                }
                (None, Some((buf, len))) => {
                    read = Some((BytesMut::new(), len));
                    DataDir::Read(buf, len)
                }
                (None, None) => DataDir::None,
            };
            match self.exchange_once(lun, cdb, dir, timed, abort).await? {
                Attempt::Done(p) => return Ok(p),
                Attempt::Wait => {
                    // ErrorRecoveryLevel 2 logs a connection in, or the session ends.
                    let since = *waiting_since.get_or_insert_with(tokio::time::Instant::now);
                    if since.elapsed() > self.patience {
                        return Err(self.core.lost());
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Attempt::Again(why) => {
                    tries += 1;
                    if tries >= MAX_TRIES {
                        return Err(Error::ConnectionLost(ConnectionLoss::Local(
                            LocalClose::Unknown,
                        )));
                    }
                    tracing::debug!(tries, "command made again: {why}");
                }
            }
        }
    }

    /// One try of [`McsSession::exchange`], under a fresh ITT.
    async fn exchange_once(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        timed: bool,
        abort: Option<&tokio_util::sync::CancellationToken>,
    ) -> Result<Attempt> {
        // Sealed: the connection first (its data is made for it, under its keys). Plain: the
        // engine places the command when the window lets it go, on the load of that moment.
        let picked = self.core.with(false, |g| {
            if let Some(e) = &g.ended {
                return Err(Error::ConnectionLost(e.clone()));
            }
            if !g.sealed {
                return Ok(Some((None, g.session.alloc_itt(), None)));
            }
            let Some(cid) = g.session.pick() else {
                if g.session.recovers_connections() && g.session.ended().is_none() {
                    // None open now: ErrorRecoveryLevel 2 logs one in.
                    return Ok(None);
                }
                return Err(Error::ConnectionLost(ConnectionLoss::Local(
                    LocalClose::Unknown,
                )));
            };
            let Some(t) = g
                .conns
                .iter()
                .find(|c| c.cid == cid)
                .and_then(|c| c.transform.clone())
            else {
                // Logged in again a moment ago, its driver side not started yet: never
                // unsealed, wait for it.
                return Ok(None);
            };
            Ok(Some((Some(cid), g.session.alloc_itt(), Some(t))))
        })??;
        let Some((cid, itt, t)) = picked else {
            return Ok(Attempt::Wait);
        };
        let info = CommandInfo::of(lun, itt, &cdb);
        let mut plain = None;
        let (data, read_len) = match dir {
            DataDir::None => (engine::Data::None, None),
            DataDir::Write(p) => {
                let wire = match &t {
                    Some(t) => {
                        plain = Some(p.clone());
                        super::sealed::wire_data(&**t, info, p).await?
                    }
                    None => engine::Data::Write(p),
                };
                (wire, None)
            }
            DataDir::Read(buf, len) => {
                let wire_len = match &t {
                    Some(t) => t.wire_len(len).ok_or_else(|| {
                        Error::InvalidRequest(format!(
                            "{len} bytes cannot be carried by the transform"
                        ))
                    })?,
                    None => len,
                };
                let wire_len = u32::try_from(wire_len)
                    .map_err(|_| Error::InvalidRequest("read too large".into()))?;
                (engine::Data::Read { buf, len: wire_len }, Some(len))
            }
        };
        let cmd = engine::Command {
            lun,
            cdb,
            data,
            timed,
        };
        let (tx, rx) = oneshot::channel();
        let submitted = self.core.with(true, |g| {
            let now = Instant::now();
            let recovering = g.session.recovers_connections()
                && g.session.ended().is_none()
                && g.ended.is_none();
            let r = match cid {
                Some(cid) => g.session.submit_on(now, cid, itt, cmd),
                None => g.session.submit_as(now, itt, cmd),
            };
            match r {
                Ok(_) => {}
                // The connection it was sealed for stopped taking commands while it was
                // sealed: made again for another.
                Err(mcs::SubmitError::Invalid) if cid.is_some() && recovering => {
                    return Ok(false);
                }
                Err(mcs::SubmitError::Closed(e)) => {
                    return Err(Error::ConnectionLost(
                        g.ended
                            .clone()
                            .unwrap_or_else(|| ConnectionLoss::from_engine(e)),
                    ))
                }
                Err(e) => return Err(Error::InvalidRequest(format!("submit: {e}"))),
            }
            if let (Some(p), true) = (plain, recovering) {
                // ErrorRecoveryLevel 2 seals it again if it is reassigned.
                g.plain.insert(itt, (info, p));
            }
            g.waiters.insert(itt, tx);
            Ok::<_, Error>(true)
        })??;
        if !submitted {
            return Ok(Attempt::Again(
                "its connection was lost while it was sealed",
            ));
        }
        let r = match abort {
            None => rx.await,
            Some(a) => {
                let mut rx = rx;
                tokio::select! {
                    biased;
                    r = &mut rx => r,
                    () = a.cancelled() => {
                        // The engine ends the task when the target confirms the abort; a
                        // refused abort leaves it to its own answer.
                        tracing::debug!(itt, "ABORT TASK asked by the caller");
                        self.core.with(true, |g| g.session.abort(Instant::now(), itt))?;
                        rx.await
                    }
                }
            }
        }
        .map_err(|_| self.core.lost())?;
        let c = match r.result {
            Ok(c) => c,
            Err(TaskError::ConnectionLost(_)) if r.never_left && self.recovering() => {
                // Sealed for a connection that failed before it left (never sent).
                return Ok(Attempt::Again("its connection failed before it left"));
            }
            Err(e) => return Err(self.task_error(e)),
        };
        let mut p = Passthrough {
            status: c.status,
            sense: c.sense,
            data: c.data,
            residual: c.residual,
        };
        if let (Some(t), Some(_)) = (&t, read_len) {
            // Whatever the status: data that came is sealed (a status without data has none),
            // under the keys of the connection it came on (reassigned: the new one's).
            if !p.data.is_empty() {
                let keys = r.transform.as_ref().unwrap_or(t);
                if r.adopted {
                    return Ok(match open_adopted(info, p.data, keys, t).await {
                        Adopted::Opened(d) => {
                            p.data = d;
                            Attempt::Done(p)
                        }
                        Adopted::Stale => {
                            tracing::debug!(
                                itt = info.itt,
                                "seal: a reassigned read's Data-In was sealed for its failed connection (stale, not forged): read again"
                            );
                            Attempt::Again(
                                "a reassigned read's data was sealed for the failed connection",
                            )
                        }
                        Adopted::Forged => {
                            tracing::warn!(
                                itt = info.itt,
                                "seal: data-in refused: a reassigned read's Data-In opened under neither its connection's keys nor its failed connection's"
                            );
                            Attempt::Again("a reassigned read's data did not open")
                        }
                    });
                }
                p.data = keys.inbound(info, p.data).await?;
            }
        }
        Ok(Attempt::Done(p))
    }

    /// ErrorRecoveryLevel 2 is on and the session goes on.
    fn recovering(&self) -> bool {
        self.core.lock().is_ok_and(|g| {
            g.session.recovers_connections() && g.session.ended().is_none() && g.ended.is_none()
        })
    }

    fn task_error(&self, e: TaskError) -> Error {
        match e {
            TaskError::IscsiResponse(r) => Error::IscsiResponse(r),
            TaskError::Rejected(r) => Error::Rejected(r.0),
            TaskError::Aborted(AbortedBy::LunReset) => {
                Error::TaskAborted("LOGICAL UNIT RESET".into())
            }
            TaskError::Aborted(AbortedBy::AbortTask) => Error::TaskAborted("ABORT TASK".into()),
            TaskError::Violation(v) => Error::TargetViolation(v),
            TaskError::TimedOut { after, .. } => Error::CommandTimedOut(after),
            TaskError::ConnectionLost(e) => Error::ConnectionLost(
                self.core
                    .lock()
                    .ok()
                    .and_then(|g| g.ended.clone())
                    .unwrap_or_else(|| ConnectionLoss::from_engine(e)),
            ),
            _ => self.core.lost(),
        }
    }

    /// READ(16) of `blocks` blocks at `lba`, into a fresh buffer.
    pub async fn read(&self, lba: u64, blocks: u32) -> Result<BytesMut> {
        self.read_into(lba, blocks, BytesMut::new()).await
    }

    /// READ(16) of `blocks` blocks at `lba`, reusing `buf`.
    pub async fn read_into(&self, lba: u64, blocks: u32, buf: BytesMut) -> Result<BytesMut> {
        let len = io::read_len(&self.capacity, blocks)?;
        let c = self
            .command(scsi::read16(lba, blocks), DataDir::Read(buf, len))
            .await?;
        io::read_data(c, len)
    }

    /// WRITE(16) of `data` (a whole number of blocks) at `lba`.
    pub async fn write(&self, lba: u64, data: Bytes) -> Result<()> {
        let blocks = io::write_blocks(&self.capacity, &data)?;
        self.command(scsi::write16(lba, blocks, false), DataDir::Write(data))
            .await?;
        Ok(())
    }

    /// Standard INQUIRY.
    pub async fn inquiry(&self) -> Result<Inquiry> {
        let c = self
            .command(scsi::inquiry(96), DataDir::Read(BytesMut::new(), 96))
            .await?;
        io::inquiry_data(&c)
    }

    /// READ CAPACITY(16); remembers the block length for read/write.
    pub async fn read_capacity(&self) -> Result<Capacity> {
        let c = self
            .command(scsi::read_capacity16(), DataDir::Read(BytesMut::new(), 32))
            .await?;
        io::remember_capacity(&self.capacity, Capacity::parse16(&c.data))
    }

    /// Logout closing the session (RFC 7143 §11.14) on one connection; the target closes
    /// them all once it answers. Bounded: 5 s.
    pub async fn logout(self) -> Result<()> {
        let sent = self.core.with(false, |g| {
            g.logging_out = true;
            g.relogin.clear();
            g.session.logout(Instant::now()).is_some()
        })?;
        if !sent {
            return Ok(());
        }
        let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
        while tokio::time::Instant::now() < deadline {
            if self.core.lock()?.session.open_connections() == 0 {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        Err(Error::Timeout("logout"))
    }
}

/// Passes the time in to every connection's engine (keepalives, command timeouts).
async fn mcs_timer(core: Arc<McsCore>) {
    framed::drive_timer(
        &core.wake_timer,
        || {
            core.lock().map(|mut g| {
                let d = g.session.poll_timeout();
                g.timer_at = d;
                d
            })
        },
        || core.with(false, |g| g.session.handle_timeout(Instant::now())),
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::TransformFuture;

    /// Keys that open only data made for them (its first byte), as Seal's open only what was
    /// sealed under the same connection's keys.
    #[derive(Debug)]
    struct Keyed(u8);

    impl PayloadTransform for Keyed {
        fn wire_len(&self, plain_len: usize) -> Option<usize> {
            Some(plain_len + 1)
        }
        fn outbound(&self, _cmd: CommandInfo, data: Bytes) -> TransformFuture<Bytes> {
            let k = self.0;
            Box::pin(async move { Ok([&[k][..], &data[..]].concat().into()) })
        }
        fn inbound(&self, _cmd: CommandInfo, data: BytesMut) -> TransformFuture<BytesMut> {
            let k = self.0;
            Box::pin(async move {
                match data.first() {
                    Some(&b) if b == k => Ok(BytesMut::from(&data[1..])),
                    _ => Err(Error::Transform("refused".into())),
                }
            })
        }
    }

    fn info() -> CommandInfo {
        CommandInfo {
            lun: 0,
            lba: 0,
            blocks: 1,
            opcode: 0x88,
            itt: 7,
        }
    }

    fn keys(k: u8) -> Arc<dyn PayloadTransform> {
        Arc::new(Keyed(k))
    }

    #[tokio::test]
    async fn accepts_an_adopted_reads_data_made_for_its_new_connection() {
        let (new, first) = (keys(2), keys(1));
        let r = open_adopted(info(), BytesMut::from(&[2, 9, 9][..]), &new, &first).await;
        assert!(matches!(&r, Adopted::Opened(d) if d[..] == [9, 9]), "{r:?}");
    }

    #[tokio::test]
    async fn tells_an_adopted_reads_data_sealed_for_its_failed_connection_from_a_forgery() {
        let (new, first) = (keys(2), keys(1));
        // What the target sealed before the reassignment: stale, refused, not a forgery.
        let r = open_adopted(info(), BytesMut::from(&[1, 9, 9][..]), &new, &first).await;
        assert!(matches!(r, Adopted::Stale), "{r:?}");
        // Made under neither connection's keys: a forgery, refused as one.
        let r = open_adopted(info(), BytesMut::from(&[3, 9, 9][..]), &new, &first).await;
        assert!(matches!(r, Adopted::Forged), "{r:?}");
        // Completed where it was first sent (no other keys to tell it by): a forgery.
        let r = open_adopted(info(), BytesMut::from(&[3, 9, 9][..]), &first, &first).await;
        assert!(matches!(r, Adopted::Forged), "{r:?}");
    }
}
