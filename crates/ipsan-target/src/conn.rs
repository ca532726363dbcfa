//! One iSCSI connection (RFC 7143): the login phase, then full feature phase.
//!
//! After login the protocol lives in the sans-IO engine, `iscsi_proto::engine::target`; this
//! file is its tokio driver: sockets, timers and wake-ups. One framed read
//! (`ipsan_transport::FrameReader`) feeds `handle_pdu`; one writer task (`writer_task`, through
//! `ipsan_transport::FrameWriter`) drains `poll_transmit`, whose PDUs carry StatSN, ExpCmdSN
//! and MaxCmdSN stamped as they leave, so status numbers are handed out in the order the
//! initiator sees them (RFC 7143 §4.2.2.2). Commands the engine hands out run concurrently
//! (`execute.rs`, the one place a command reaches a logical unit, through `unit.rs`) and
//! complete in any order. The login phase is `login.rs`; the session a completed login
//! registers or joins, before its final response leaves (RFC 7143 §5.3.4), `start.rs`; what the
//! engine asks about LUNs and targets while PDUs arrive is `luns.rs`; what task management does
//! to the LUs is `tmf.rs`.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipsan_scsi::NexusId;
use ipsan_seal::{CryptoPool, SealSession};
use ipsan_transport::{FrameReader, FrameWriter, Received};
use iscsi_proto::engine::target as engine;
use iscsi_proto::engine::target::session::ConnId;
use iscsi_proto::login::{LoginFailure, LoginStatus, TargetOffer};
use iscsi_proto::params::SessionParams;
use iscsi_wire::{Codec, Header, Pdu};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

mod execute;
mod login;
mod luns;
mod mcs;
mod start;
mod tmf;
mod unit;

pub(crate) use mcs::Core;

use login::{abandoned_seal_guess, login_phase};
use luns::{engine_response, Luns};

use crate::lock;
use crate::registry::{Registry, Target};
use crate::remote::RemoteNexus;
use crate::seal_ext::{GuessSlot, SealSlot, TranscriptSlot};

/// Settings every connection shares.
#[derive(Debug)]
pub struct Shared {
    pub registry: Arc<Registry>,
    /// Seal's crypto workers, shared by every session (docs/seal.md §6).
    pub pool: Arc<CryptoPool>,
    pub offer: TargetOffer,
    pub login_timeout: Duration,
    pub nop_interval: Option<Duration>,
    pub tcp: Option<ipsan_tcp::TcpSettings>,
    /// Agree to compress Seal data when an initiator offers it (docs/seal.md §4b).
    pub seal_compress: bool,
}

/// The largest data-out buffer one command may ask for: bounds memory per command no matter
/// what the CDB or the EDTL claim.
const MAX_COMMAND_BYTES: u64 = 64 << 20;
/// How long shutdown waits for running commands before closing anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one accepted TCP connection to its end. Errors are logged here; nothing propagates.
/// `path_sized`: the accept loop sized the socket's send buffer for a long path
/// ([`ipsan_tcp::tune_for_path`]), so the session's connections split it (`mcs::Core::link`).
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
    path_sized: bool,
    shared: Arc<Shared>,
    shutdown: CancellationToken,
) {
    let _ = stream.set_nodelay(shared.tcp.as_ref().and_then(|t| t.nodelay).unwrap_or(true));
    if let Some(t) = &shared.tcp {
        // Congestion control and buffers are per socket (inherited from the listener on
        // Linux; applied again so a kernel that does not inherit still gets them).
        match t.apply(&stream) {
            Ok(f) => {
                debug!(%peer, congestion = %f.congestion, sndbuf = f.sndbuf, rcvbuf = f.rcvbuf, "connection TCP settings")
            }
            Err(e) => warn!(%peer, "TCP settings: {e}"),
        }
    }
    let local = stream.local_addr().ok();
    // A long path's socket whose buffer the accept loop sized: a second descriptor of it, to
    // split that buffer across the session's connections as they join and leave
    // (`mcs::Core::link`). Not on a short path (nothing to split there, and the socket then
    // closes with its stream's halves) nor where `[server.tcp] sndbuf` chose a buffer (the
    // accept loop sized nothing).
    let send_share = path_sized
        .then(|| {
            use std::os::fd::AsFd;
            stream.as_fd().try_clone_to_owned().ok()
        })
        .flatten();
    let (rd, wr) = stream.into_split();
    let mut conn = FrameReader::new(rd);
    let mut wr = FrameWriter::new(wr);
    let slot = SealSlot::default();
    let transcript = TranscriptSlot::default();
    let guess = GuessSlot::default();
    let login = tokio::time::timeout(
        shared.login_timeout,
        login_phase(
            &mut conn,
            &mut wr,
            &shared,
            &slot,
            &transcript,
            &guess,
            peer,
        ),
    );
    let (result, session_slot, remote, answer) = tokio::select! {
        r = login => match r {
            Ok(Ok(Some(result))) => result,
            Ok(Ok(None)) => { abandoned_seal_guess(&shared, peer, &guess); return; }
            Ok(Err(e)) => {
                debug!(%peer, "connection closed during login: {e}");
                abandoned_seal_guess(&shared, peer, &guess);
                return;
            }
            Err(_) => {
                warn!(%peer, "login did not complete within {:?}; closing", shared.login_timeout);
                abandoned_seal_guess(&shared, peer, &guess);
                return;
            }
        },
        () = shutdown.cancelled() => return,
    };
    let params = result.params.clone();
    let nexus = NexusId(format!(
        "{},i,0x{}",
        params.initiator_name,
        hex::encode(result.isid)
    ));
    // Each connection's Seal keys are its own login's (docs/seal.md): a connection that joins
    // a session negotiates its own, so no key or counter is shared between connections.
    let seal = lock(&slot).take().map(Arc::new);
    // Seal record protection (docs/seal.md §4a): keys bound to the whole login transcript,
    // the final response (held back below) included.
    let record = match seal
        .as_ref()
        .map(|s| s.record_layer(&lock(&transcript).hash()))
    {
        None => None,
        Some(Ok(layer)) => Some(layer),
        Some(Err(e)) => {
            let why = format!("seal: cannot set up record protection: {e}");
            let f = LoginFailure::new(LoginStatus::TARGET_ERROR, why);
            answer.refuse(&mut wr, f, peer).await;
            if let Some(r) = &remote {
                r.close().await;
            }
            return;
        }
    };
    // The session is joinable (registered, or this connection added to it) before the final
    // response leaves: the initiator may open its next connection with the TSIH at once.
    let joins = answer.joins;
    let started = start::start(
        &shared,
        start::Login {
            result: &result,
            params: &params,
            joins,
            session_slot,
            remote: remote.clone(),
            seal: seal.clone(),
            peer,
            local,
        },
    );
    let start::Started {
        core,
        id,
        reinstates,
        joined,
    } = match started {
        Ok(s) => s,
        Err(f) => {
            answer.refuse(&mut wr, f, peer).await;
            if let Some(r) = &remote {
                r.close().await;
            }
            return;
        }
    };
    // Not sent (the peer went away, or does not read): the connection closes at once below,
    // and with it, when it was the only one, the session it registered.
    let sent = match tokio::time::timeout(shared.login_timeout, answer.send(&mut wr)).await {
        Ok(Ok(())) => true,
        Ok(Err(e)) => {
            debug!(%peer, "final login response not sent: {e}");
            false
        }
        Err(_) => {
            warn!(%peer, "final login response not sent within {:?}", shared.login_timeout);
            false
        }
    };
    let sealed = seal.as_ref().map(|s| s.cipher().to_string());
    info!(
        %peer, seal = sealed.as_deref().unwrap_or("off"), initiator = %params.initiator_name, target = params.target_name.as_deref().unwrap_or("(discovery)"),
        tsih = result.tsih, cid = result.cid, header_digest = params.header_digest, data_digest = params.data_digest,
        immediate_data = params.immediate_data, initial_r2t = params.initial_r2t,
        max_burst = params.max_burst_length, first_burst = params.first_burst_length,
        max_connections = params.max_connections, joined,
        "login complete"
    );
    conn.codec = Codec {
        header_digest: params.header_digest,
        data_digest: params.data_digest,
        max_recv_data_segment_length: shared.offer.max_recv_data_segment_length,
    };
    // The record step sits between the codec and the engine (ipsan-transport): the writer
    // protects what `poll_transmit` hands out, the reader verifies before `handle_pdu` sees
    // anything. Set once the (plain) final login response is out.
    wr.codec = conn.codec.clone();
    if let Some((w, r)) = record {
        wr.sealer = Some(w);
        conn.record = Some(r);
    }
    let session = Arc::new(Session {
        shared: shared.clone(),
        core: core.clone(),
        id,
        wake_writer: Notify::new(),
        wake_reader: Notify::new(),
        written: Notify::new(),
        // A joining login negotiates no session-wide keys (RFC 7143 §13): the leading one's.
        params: if joined { core.params.clone() } else { params },
        stats: core.stats.clone(),
        nexus,
        local,
        seal,
        rekey_asked: AtomicBool::new(false),
        running: AtomicUsize::new(0),
        idle: Notify::new(),
        remote: core.remote.clone(),
        send_share,
    });
    core.link(id, &session);
    if !sent {
        session.engine().close_locally();
    }
    if let Some(old) = reinstates {
        // Session reinstatement (RFC 7143 §6.3.5): the old session's tasks end before this
        // one's commands execute, so an old WRITE still running cannot land after the
        // initiator's reissued copy (or a newer write). Nothing is read until then.
        tokio::select! {
            () = old.cancelled() => {}
            () = shutdown.cancelled() => {}
            () = core.cancel.cancelled() => {}
        }
        debug!(%peer, "reinstated session's commands are done; serving");
    }
    let writer = tokio::spawn(writer_task(wr, session.clone()));
    let end = session.run(&mut conn, &shutdown, &core.cancel).await;
    debug!(%peer, cid = result.cid, "connection ending: {end}");
    // The session ends with its last connection; the others leave it running. At
    // ErrorRecoveryLevel 2 that is decided once this connection is removed (below): its tasks
    // may keep the session for a connection that takes them over.
    let erl2 = core.params.error_recovery_level >= 2;
    let last = !erl2 && core.last_out();
    if last {
        session.nexus_lost();
    }
    // A reinstating session waits for this (RFC 7143 §6.3.5); `run` waited DRAIN_TIMEOUT
    // already, so only a hung backend gets here with commands running. Signalled before the
    // writer is joined: a writer stuck on a black-holed socket must not hold up the new
    // session. (Each connection waits for its own commands; the last one signals.)
    if tokio::time::timeout(2 * DRAIN_TIMEOUT, session.idle())
        .await
        .is_err()
    {
        warn!(%peer, "commands still running {:?} after the session ended; releasing it anyway", 2 * DRAIN_TIMEOUT);
    }
    if last {
        core.drained.cancel();
    }
    session.wake_writer.notify_one();
    let _ = writer.await;
    session.engine().remove();
    core.unlink(id);
    let last = last || (erl2 && session.linger(&shutdown).await);
    if !last {
        info!(%peer, tsih = result.tsih, cid = result.cid, "connection closed; its session goes on");
        return;
    }
    if erl2 {
        session.nexus_lost();
        core.drained.cancel();
    }
    if let Some(r) = &core.remote {
        // The host's I_T nexus is gone: so is its nexus on the remote targets.
        r.close().await;
    }
    shared.registry.unregister(
        &core.params.initiator_name,
        core.isid,
        core.params.target_name.as_deref(),
        core.tsih,
    );
    info!(%peer, tsih = core.tsih, "session closed");
}

/// Seconds an initiator has to log out after AsyncEvent 1 (RFC 7143 §11.9.1 Parameter3).
const LOGOUT_WAIT_SECS: u16 = 10;

/// Bytes the engine may queue for sending before the reader stops taking new PDUs: a peer
/// that sends without reading its answers gets TCP backpressure instead of our memory.
const MAX_QUEUED_BYTES: usize = 16 << 20;

/// PDUs the reader takes in a row from what it has already received, before it waits again
/// with shutdown, wake-ups and the engine's timer in the race (`Session::run`).
const BURST_MAX: u32 = 64;

/// Commands moving at most this many bytes are first run on the reader's own task (see
/// `Session::events`); larger ones always get a task, so their copies run beside the reader
/// (plain sessions' writes: [`WRITE_INLINE_MAX`]).
const INLINE_MAX: u32 = 64 << 10;

/// In a plain session a write moving at most this many bytes is first run on the reader's
/// own task too: a RAM store keeps a whole chunk's write as it is (`unit.rs`, no copy), so it
/// completes at once, and a task of its own cost a cross-thread wake-up of the other worker
/// per write (issue 27, docs/results/per-command-cost-7: 1 MiB writes from `qemu-img bench`
/// made 0.25–0.46 futex and 0.5–1.7 eventfd writes per command on the target that way).
const WRITE_INLINE_MAX: u32 = 1 << 20;

/// The one framed write of this connection: drains the engine's PDUs (sequence numbers are
/// stamped as they leave the engine) into the socket, many PDUs per syscall, until the
/// connection is over and everything queued has left. In a sealed session every PDU is
/// record-protected here, after the engine stamped it, in wire order (docs/seal.md §4a).
async fn writer_task(mut wr: FrameWriter<OwnedWriteHalf>, session: Arc<Session>) {
    let mut batch: Vec<Pdu> = Vec::with_capacity(64);
    // Our keepalive ping is in the socket and the initiator's TCP has not yet acknowledged it:
    // the socket's written-byte count just past it (`watch_ping`).
    let mut ping_mark: Option<u64> = None;
    loop {
        let notified = session.wake_writer.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let closed = {
            let mut e = session.engine();
            while batch.len() < 256 {
                match e.poll_transmit() {
                    Some(p) => batch.push(p),
                    None => break,
                }
            }
            e.closed().is_some()
        };
        if batch.is_empty() {
            if closed {
                break;
            }
            if ping_mark.is_some() {
                tokio::select! {
                    () = notified.as_mut() => {}
                    () = tokio::time::sleep(PING_DELIVERY_POLL) => {}
                }
                watch_ping(&wr, &session, &mut ping_mark);
            } else {
                notified.await;
            }
            continue;
        }
        let mut failed = false;
        for pdu in batch.drain(..) {
            if matches!(pdu.header, Header::R2t(_)) {
                session.stats.r2ts(1);
            }
            trace!(opcode = ?pdu.header.opcode(), itt = format!("{:#x}", pdu.header.itt()), len = pdu.data.len(), "send");
            if let Err(e) = wr.push(pdu) {
                warn!("{e}");
                if e.fatal() {
                    failed = true;
                    break;
                }
            }
        }
        // What was encoded before a failure still goes out (a status, say).
        if let Err(e) = wr.flush().await {
            debug!("write failed: {e}");
            writer_failed(&session);
            return;
        }
        if failed {
            writer_failed(&session);
            return;
        }
        watch_ping(&wr, &session, &mut ping_mark);
        session.written.notify_waiters();
    }
    let _ = wr.shutdown().await;
}

/// How often the writer looks whether its ping has reached the initiator, while it has.
const PING_DELIVERY_POLL: Duration = Duration::from_millis(100);

/// Our ping is in the socket: its answer is waited for from when the initiator's TCP has
/// acknowledged it (`engine::Connection::flushed`), so the reader's timer moves then. On a
/// slow lossy link a ping written behind MiBs of Data-In sat in an 8 MiB send buffer for
/// ~40 s, and waiting from its write gave a live initiator 30 s where it needed 70
/// (issue 28: one connection's reads at 1 Gbit/s, 1 % loss, 64 × 256 KiB in flight).
/// `mark` is the socket's written-byte count just past the ping, taken at the first look
/// after the write. Where the socket cannot be read, a written ping counts as delivered.
fn watch_ping(wr: &FrameWriter<OwnedWriteHalf>, session: &Session, mark: &mut Option<u64>) {
    if !session.engine().ping_leaving() {
        *mark = None;
        return;
    }
    let socket: &TcpStream = wr.get_ref().as_ref();
    match ipsan_tcp::send_progress(socket) {
        Ok(p) => {
            let m = *mark.get_or_insert(p.written);
            if !p.delivered(m) {
                return;
            }
        }
        Err(e) => debug!("ping delivery not watched: {e}"),
    }
    *mark = None;
    if session.engine().flushed(Instant::now()) {
        session.wake_reader.notify_one();
    }
}

/// The socket cannot take more: the connection is over, and a reader waiting for the queue
/// to drain must not wait for a writer that is gone.
fn writer_failed(session: &Session) {
    session.engine().peer_closed();
    session.wake_reader.notify_one();
    session.written.notify_waiters();
}

/// One session's connection: the engine and what the driver adds around it.
struct Session {
    shared: Arc<Shared>,
    /// What this connection shares with the others of its session (`mcs.rs`): the engine,
    /// whose tasks carry each local LU's command decoded once, when the engine sized it
    /// (`Luns::size`), to its execution (`execute.rs`), so nothing parses the CDB again.
    core: Arc<mcs::Core>,
    /// This connection in the engine's session.
    id: ConnId,
    /// PDUs queued: the writer has work.
    wake_writer: Notify,
    /// A command task closed the connection (Seal limits): the reader looks at the events.
    wake_reader: Notify,
    /// The writer handed a batch to the socket.
    written: Notify,
    params: SessionParams,
    /// This session's counters (metrics.rs, `ipsan ctl sessions`).
    stats: Arc<crate::metrics::SessionStats>,
    nexus: NexusId,
    local: Option<SocketAddr>,
    /// The Seal session, when one was negotiated: every command's data is sealed.
    seal: Option<Arc<SealSession>>,
    /// Set once the target has asked this session to log out for fresh Seal keys.
    rekey_asked: AtomicBool,
    /// Commands handed to `execute` and not finished.
    running: AtomicUsize,
    /// `running` fell to zero.
    idle: Notify,
    /// This host's sessions on the remote targets of remote LUNs (a gateway, remote.rs).
    remote: Option<Arc<RemoteNexus>>,
    /// Its socket, to size its send buffer (`mcs::Core::link`); `None` where the settings
    /// chose the buffer.
    send_share: Option<std::os::fd::OwnedFd>,
}

impl Session {
    /// The engine, locked, as this connection sees it.
    fn engine(&self) -> mcs::Eng<'_> {
        mcs::Eng::new(self)
    }

    /// What the engine asks about LUNs, for this connection.
    fn luns<'a>(&'a self, target: Option<&'a Target>) -> Luns<'a> {
        Luns {
            target,
            seal: self.seal.as_deref(),
            registry: &self.shared.registry,
            local: self.local,
        }
    }

    /// The session's target as it is now (LUNs can be added or removed while it runs).
    fn target(&self) -> Option<Arc<Target>> {
        self.params
            .target_name
            .as_deref()
            .and_then(|n| self.shared.registry.target(n))
    }

    /// The full feature phase loop; returns why it ended. Reads PDUs into the engine, runs
    /// its events, and after the end waits (bounded) for commands still running.
    async fn run(
        self: &Arc<Self>,
        conn: &mut FrameReader<OwnedReadHalf>,
        shutdown: &CancellationToken,
        session_cancel: &CancellationToken,
    ) -> String {
        // PDUs handled in a row from what one read brought, without the full wait below.
        let mut burst = 0u32;
        let end = loop {
            if let Some(why) = self.events() {
                break why;
            }
            // Backpressure: a peer that does not read its answers stops being read. Checked
            // before a waiter is registered: registering one per PDU cost two locks of
            // `written` each time, with the writer notifying it from the other thread.
            let room =
                |e: &mcs::Eng<'_>| e.queued_bytes() <= MAX_QUEUED_BYTES || e.closed().is_some();
            while !room(&self.engine()) {
                let written = self.written.notified();
                tokio::pin!(written);
                written.as_mut().enable();
                if room(&self.engine()) {
                    break;
                }
                written.await;
            }
            // The rest of a burst that one read brought is taken without a wait: racing a PDU
            // that is already here against shutdown, wake-ups and the engine's timer would
            // register and drop their waiters and a timer for every PDU (issue 27). Every
            // BURST_MAX PDUs the full wait runs anyway, so none of them waits long.
            let buffered = if burst < BURST_MAX {
                conn.try_next()
            } else {
                None
            };
            let next = if let Some(r) = buffered {
                burst += 1;
                r.map(|o| o.map(Received::Pdu))
            } else {
                burst = 0;
                let (deadline, awaits_data_out) = {
                    let e = self.engine();
                    (e.poll_timeout(), e.awaits_data_out())
                };
                if awaits_data_out {
                    // A write waits for its data: take the next head alone, so a long
                    // Data-Out behind it is received in place whole.
                    conn.head_first();
                }
                // A long Data-Out is received straight into its write's buffer (issue 27), not
                // copied there from the receive buffer, and a long write's immediate data
                // into a buffer for the whole write; dropped by another branch, the read goes
                // on where it stopped at the next turn.
                let lend = |h: &Header, len: usize| match h {
                    Header::DataOut(d) => self.engine().lend_write_buffer(d, len),
                    Header::ScsiCommand(c) => self.engine().lend_command_buffer(c, len),
                    _ => None,
                };
                tokio::select! {
                    r = conn.next_placing_writes(lend) => r,
                    () = shutdown.cancelled() => {
                        self.engine().close_locally();
                        self.wake_writer.notify_one();
                        break "target shutting down".to_owned();
                    }
                    () = session_cancel.cancelled() => {
                        self.engine().close_locally();
                        self.wake_writer.notify_one();
                        break "session reinstated or cancelled".to_owned();
                    }
                    () = self.wake_reader.notified() => continue,
                    () = self.stats.logout.notified() => {
                        // `ipsan ctl logout-all`: ask politely (RFC 7143 §11.9.1, AsyncEvent 1).
                        self.engine().request_logout(LOGOUT_WAIT_SECS);
                        self.wake_writer.notify_one();
                        continue;
                    }
                    () = async { match deadline { Some(d) => tokio::time::sleep_until(d.into()).await, None => std::future::pending().await } } => {
                        self.engine().handle_timeout(Instant::now());
                        self.wake_writer.notify_one();
                        continue;
                    }
                }
            };
            let now = Instant::now();
            let target = self.target();
            let luns = Luns {
                target: target.as_deref(),
                seal: self.seal.as_deref(),
                registry: &self.shared.registry,
                local: self.local,
            };
            if let Some(f) = next.as_ref().err().and_then(ipsan_transport::forgery) {
                // Nothing of a forged PDU reaches the engine: the connection is dropped.
                crate::limits::LimitStats::bump(&self.shared.registry.stats.forged_pdus);
                warn!(
                    initiator = %self.params.initiator_name,
                    "{f}; nothing of it acts, dropping the connection"
                );
                self.engine().close_locally();
                self.wake_writer.notify_one();
                break format!("forged PDU: {f}");
            }
            {
                let mut e = self.engine();
                match next {
                    Err(_) | Ok(None) => e.peer_closed(),
                    Ok(Some(Received::Pdu(Ok(pdu)))) => {
                        trace!(opcode = ?pdu.header.opcode(), itt = format!("{:#x}", pdu.header.itt()), len = pdu.data.len(), "recv");
                        e.handle_pdu(now, &luns, pdu);
                    }
                    Ok(Some(Received::Placed { pdu, data })) => {
                        trace!(opcode = ?pdu.header.opcode(), itt = format!("{:#x}", pdu.header.itt()), len = data.len(), "recv (placed)");
                        e.handle_placed_data_out(now, &luns, pdu, data);
                    }
                    Ok(Some(Received::Pdu(Err(err)))) => {
                        warn!("rejected PDU: {err}");
                        self.stats.pdu_error(&err);
                        e.handle_wire_error(now, &err);
                    }
                }
                if !e.has_transmit() {
                    // Nothing to send (a Data-Out, say): no writer wakeup per PDU.
                    continue;
                }
            }
            self.wake_writer.notify_one();
        };
        if self.params.error_recovery_level >= 2 {
            // A command handed out before the end still runs: at ErrorRecoveryLevel 2 its
            // task waits in the session for TASK REASSIGN (RFC 7143 §7.2), and one never run
            // would wait there until Time2Retain ran out.
            for _ in 0..4 {
                if self.events().is_none() {
                    break;
                }
            }
        }
        // Commands still running finish (bounded) before the nexus is released.
        if tokio::time::timeout(DRAIN_TIMEOUT, self.idle())
            .await
            .is_err()
        {
            warn!("commands still running after {DRAIN_TIMEOUT:?}; closing anyway");
        }
        end
    }

    /// The I_T nexus is gone with the session: release what it held (RESERVE, PREVENT;
    /// SAM-5 §5.9).
    fn nexus_lost(&self) {
        if let Some(t) = self.target() {
            for lu in t.luns.values() {
                lu.nexus_lost(&self.nexus);
            }
        }
    }

    /// ErrorRecoveryLevel 2, after this connection was removed: while no connection is open
    /// and tasks of failed connections wait for TASK REASSIGN (RFC 7143 §7.2, §11.5.1), the
    /// session stays registered, so a connection may log in with its TSIH (the same CID or
    /// another) and take them over; their DefaultTime2Wait + DefaultTime2Retain run out here
    /// (an expired pass-through task's abort is forwarded). True when the session ends now
    /// and this connection ends it; false when another connection carries it on.
    async fn linger(&self, shutdown: &CancellationToken) -> bool {
        let core = &self.core;
        let mut lingered = false;
        loop {
            let force = shutdown.is_cancelled() || core.cancel.is_cancelled();
            match core.ends_after_last(force) {
                Some(end) => {
                    if lingered && !end {
                        info!(tsih = core.tsih, "a connection joined the session; its failed connection's tasks wait for it");
                    }
                    return end;
                }
                None if !lingered => {
                    info!(tsih = core.tsih, "the session's last connection failed; its tasks wait for TASK REASSIGN (ErrorRecoveryLevel 2)");
                    lingered = true;
                }
                None => {}
            }
            // A login joining the session is not announced: look again within 100 ms.
            let mut wake = Instant::now() + Duration::from_millis(100);
            if let Some(d) = self.engine().poll_timeout() {
                wake = wake.min(d);
            }
            tokio::select! {
                () = tokio::time::sleep_until(wake.into()) => {}
                () = shutdown.cancelled() => {}
                () = core.cancel.cancelled() => {}
            }
            if core.connections() > 0 {
                // The joined connection's reader keeps the session's time now.
                continue;
            }
            self.engine().handle_timeout(Instant::now());
            while let Some(ev) = self.engine().poll_event() {
                if let engine::Event::Abort { itts } = ev {
                    self.abort_forwarded(&itts);
                }
            }
        }
    }

    /// Returns once no command of this session runs.
    async fn idle(&self) {
        loop {
            let idle = self.idle.notified();
            tokio::pin!(idle);
            idle.as_mut().enable();
            if self.running.load(Ordering::Acquire) == 0 {
                break;
            }
            idle.await;
        }
    }

    /// Acts on the engine's events; `Some(why)` once the connection is over.
    fn events(self: &Arc<Self>) -> Option<String> {
        loop {
            let ev = self.engine().poll_event()?;
            match ev {
                engine::Event::Execute(x) => {
                    let s = self.clone();
                    // Counted rather than joined: a join set would wake this loop once per
                    // command, a full loop iteration (locks, a timer) on the small-read path.
                    self.running.fetch_add(1, Ordering::AcqRel);
                    let small = match self.seal.as_deref() {
                        None => {
                            let max = if x.transfer > 0 {
                                WRITE_INLINE_MAX
                            } else {
                                INLINE_MAX
                            };
                            x.edtl <= max && x.data_out.len() <= max as usize
                        }
                        // Sealed: sized by the plaintext the device server moves (a 64 KiB
                        // write's sealed EDTL is 24 bytes longer), and only if the crypto pool
                        // opens and seals it on this thread; otherwise it would wait for a
                        // worker.
                        Some(s) => [x.edtl as usize, x.data_out.len()].into_iter().all(|n| {
                            s.plain_len(n)
                                .is_some_and(|p| p <= INLINE_MAX as usize && s.crypto_inline(p))
                        }),
                    };
                    let mut task = Box::pin(async move {
                        s.clone().execute(x).await;
                        if s.running.fetch_sub(1, Ordering::AcqRel) == 1 {
                            s.idle.notify_waiters();
                        }
                    });
                    // A small command on an in-memory LU in a plain session never waits: it
                    // completes on its first poll, here, without a task of its own (a spawn,
                    // a wake-up and often a hop to the other worker thread per command), and
                    // the writer then sends the answers of a whole batch of commands at once.
                    // Any other command is pending at its first wait (blocking pool, remote
                    // session) and goes on as a task; the noop waker it may have registered
                    // is replaced at the task's first poll, as the Future contract requires
                    // of every future. A sealed command takes this path only when it is
                    // small enough for the crypto pool to open and seal it on the caller's
                    // thread ([`ipsan_seal::Cipher::inline_max`]); a larger one would wait
                    // for a worker, making the first poll wasted work.
                    if small
                        && task
                            .as_mut()
                            .poll(&mut std::task::Context::from_waker(std::task::Waker::noop()))
                            .is_ready()
                    {
                        continue;
                    }
                    tokio::spawn(task);
                }
                engine::Event::Reset {
                    function,
                    lun,
                    answer,
                } => self.reset(function, lun, answer),
                engine::Event::Abort { itts } => self.abort_forwarded(&itts),
                engine::Event::Closed(e) => {
                    self.wake_writer.notify_one();
                    return Some(e.to_string());
                }
            }
        }
    }
}
