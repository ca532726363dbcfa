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
//! On a long path the connections share one send buffer (`McsCore::share_send_buffers`,
//! `ipsan_tcp::share_send_buffer`): the whole buffer for one, its share (at least the
//! autotuning ceiling) for each of several, sized again as connections open and end.
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
//! Files: this one holds the types (the session, its connections, the engine behind its lock),
//! the logins that open a session, what it reports and its logout; `mcs/dispatch.rs` runs the
//! engine under the lock and hands its events out (completions, TASK REASSIGN outcomes, sealed
//! writes made again, connection ends) and drives the session's timer; `mcs/command.rs` makes,
//! submits and awaits commands (and makes one again after a reassignment), with the SCSI
//! helpers and task management; `mcs/conns.rs` is each connection's reader and writer;
//! `mcs/relogin.rs` is ERL 2's relogin task; `mcs/tests.rs` the unit tests.
//!
//! A target that answers MaxConnections=1 gets one connection: the session is then the same
//! one connection as [`Session`] would make (without its session recovery).

use std::collections::{HashMap, VecDeque};
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use iscsi_proto::engine::initiator::Reassignment;
use iscsi_proto::engine::mcs::{self, Spread};
use iscsi_proto::login::originator::Join;
use serde::Serialize;

use super::*;

mod command;
mod conns;
mod dispatch;
mod relogin;

use conns::start_conn;
use dispatch::mcs_timer;
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

/// How often a joining login refused with "session does not exist" is tried again, waiting
/// 20, 40, 80, 160 ms in between ([`join_login`]).
const JOIN_RETRIES: u32 = 4;

/// A joining login (the session's TSIH, a new CID; RFC 7143 §5.3.4) refused with "session does
/// not exist" (0x020a, §11.13.5) just after the leading login succeeded is tried again a few
/// times: a target may send the leading login's final response before the session can be
/// joined (ipsan's target did until issue 28's fix: it registered the session just after, and a
/// joining login under load arrived in between; it registers it before now). Any other
/// outcome, and the last try's, is the caller's.
async fn join_login(url: &IscsiUrl, cfg: &SessionConfig, target: &str) -> Result<Fresh> {
    let mut wait = Duration::from_millis(20);
    for _ in 0..JOIN_RETRIES {
        match login_connection(url, cfg, target).await {
            Err(Error::LoginRefused {
                class: 2,
                detail: 0x0a,
                ..
            }) => {
                tokio::time::sleep(wait).await;
                wait *= 2;
            }
            r => return r,
        }
    }
    login_connection(url, cfg, target).await
}

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
    /// Sealed: commands waiting for the session's window before they pick a connection, in
    /// arrival order (`McsCore::open_gate`, issue 28).
    gate: VecDeque<oneshot::Sender<()>>,
    /// Of those, let through and not yet picked: each holds a slot of the window.
    let_through: u32,
    /// Sealed commands that waited for the window after their connection was picked
    /// ([`McsSession::waited_pinned`]).
    waited_pinned: u64,
}

struct McsCore {
    inner: Mutex<McsInner>,
    /// Commands go by [`Spread::LeastQueued`]: the sockets are read before the engine runs.
    least_queued: bool,
    /// The session is sealed (`McsInner::sealed`, fixed at login): read without the lock on
    /// every command's way in.
    sealed: bool,
    wake_timer: Notify,
    /// The relogin task has CIDs to log in again.
    wake_relogin: Notify,
    /// The engine's tail probe is on (mirrors `Session::set_tail_probe`): without it a
    /// writer's flush has nothing to arm and takes no lock.
    probing: AtomicBool,
    /// Long paths: the sockets' send buffers are sized here, the path's split across the
    /// connections (`ipsan_tcp::SendBuffer::Path`: `[tcp] sndbuf` chose none).
    share_buffers: bool,
    /// What the path's send buffer was last split across (`McsCore::share_send_buffers`).
    send_share: ipsan_tcp::SendShare,
}

/// A logged-in session of one or more connections in full feature phase (no session
/// recovery: at ErrorRecoveryLevel 0 a lost connection ends it; at 2 it is logged in again
/// and its tasks reassigned, see the module notes).
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
    /// [`SessionConfig::command_timeout`].
    command_timeout: Option<Duration>,
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
                gate: VecDeque::new(),
                let_through: 0,
                waited_pinned: 0,
            }),
            least_queued: mcs_cfg.spread == Spread::LeastQueued,
            sealed: lead.li.transform.is_some(),
            wake_timer: Notify::new(),
            wake_relogin: Notify::new(),
            probing: AtomicBool::new(false),
            share_buffers: ipsan_tcp::SendBuffer::unless_set(cfg.tcp.as_ref())
                == ipsan_tcp::SendBuffer::Path,
            // The leading connection's socket has the whole buffer (`connect_tcp`).
            send_share: ipsan_tcp::SendShare::default(),
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
            command_timeout: cfg.command_timeout,
            patience: cfg
                .recovery_timeout
                .unwrap_or(recovery::DEFAULT_RECOVERY_TIMEOUT),
        };
        for cid in 1..want {
            let cid = u16::try_from(cid).map_err(|_| Error::InvalidRequest("CID".into()))?;
            let mut jcfg = cfg.clone();
            jcfg.login.join = Some(Join { tsih, cid });
            let fresh = join_login(url, &jcfg, &target).await?;
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

    /// Bytes of commands picked for a connection whose data is still being made for it (Seal
    /// seals a write on a crypto worker between its pick and its submission), summed over the
    /// connections: each counts on its connection's load meanwhile, so commands picked in a
    /// burst spread (`engine::mcs::Session::pick_for`). 0 once no command is between the two.
    pub fn picked_bytes(&self) -> u64 {
        self.core
            .lock()
            .map(|g| g.conns.iter().map(|c| g.session.picked_bytes(c.cid)).sum())
            .unwrap_or(0)
    }

    /// Sealed commands that, once made for their connection, waited for the session's window
    /// (`engine::mcs::Session::free_slots`): 0 while every command picks its connection only
    /// when the window has room for it (issue 28; a target window smaller than the queue
    /// shows it).
    pub fn waited_pinned(&self) -> u64 {
        self.core.lock().map(|g| g.waited_pinned).unwrap_or(0)
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

    /// Why the session ended, if it did.
    pub fn failure(&self) -> Option<String> {
        self.core
            .lock()
            .ok()
            .and_then(|g| g.ended.as_ref().map(ToString::to_string))
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

#[cfg(test)]
mod tests;
