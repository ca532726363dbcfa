//! One iSCSI connection (RFC 7143): the login phase, then full feature phase.
//!
//! Reading and writing are separate tasks. The reader decodes PDUs and dispatches them;
//! commands run concurrently on the blocking pool and complete in any order. Every outgoing
//! PDU goes through one writer task, which stamps StatSN, ExpCmdSN and MaxCmdSN at the moment
//! of sending, so status numbers are always handed out in the order the initiator sees them
//! (RFC 7143 §4.2.2.2).

use std::collections::{HashMap, VecDeque};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_scsi::{
    decode_lun, no_such_lun, report_luns, DataDirection, LogicalUnit, NexusId, OwnedRequest,
    ResetKind, ScsiRequest, ScsiResponse, ScsiStatus, Sense, SenseKey,
};
use iscsi_proto::login::{Outcome, TargetLogin, TargetOffer};
use iscsi_proto::params::{SessionParams, SessionType, NOT_UNDERSTOOD, REJECT};
use iscsi_proto::seq::{sn_lt, Admit, CmdWindow};
use iscsi_wire::header::*;
use iscsi_wire::{Codec, Header, Pdu, WireError, RESERVED_TAG};
use tokio::io::{AsyncReadExt, AsyncWriteExt, BufWriter};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use crate::lock;
use crate::registry::{LoginDirectory, Registry, Target, PORTAL_GROUP_TAG};
use crate::seal_ext::{SealExtension, SealSlot, TranscriptSlot};
use crate::task::WriteState;
use ipsan_seal::{CryptoPool, Direction, Forgery, RecordOpener, RecordSealer, SealSession};

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
}

/// The largest data-out buffer one command may ask for: bounds memory per command no matter
/// what the CDB or the EDTL claim.
const MAX_COMMAND_BYTES: u64 = 64 << 20;
/// How long shutdown waits for running commands before closing anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// Serves one accepted TCP connection to its end. Errors are logged here; nothing propagates.
pub async fn serve(
    stream: TcpStream,
    peer: SocketAddr,
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
    let (rd, wr) = stream.into_split();
    let mut conn = Reader {
        rd,
        buf: BytesMut::with_capacity(256 * 1024),
        codec: Codec::default(),
        record: None,
    };
    let mut wr = wr;
    let slot = SealSlot::default();
    let transcript = TranscriptSlot::default();
    let login = tokio::time::timeout(
        shared.login_timeout,
        login_phase(&mut conn, &mut wr, &shared, &slot, &transcript, peer),
    );
    let (result, session_slot) = tokio::select! {
        r = login => match r {
            Ok(Ok(Some(result))) => result,
            Ok(Ok(None)) => return,
            Ok(Err(e)) => { debug!(%peer, "connection closed during login: {e}"); return; }
            Err(_) => { warn!(%peer, "login did not complete within {:?}; closing", shared.login_timeout); return; }
        },
        () = shutdown.cancelled() => return,
    };
    let params = result.params;
    let nexus = NexusId(format!(
        "{},i,0x{}",
        params.initiator_name,
        hex::encode(result.isid)
    ));
    let sealed = lock(&slot).as_ref().map(|s| s.cipher().to_string());
    info!(
        %peer, seal = sealed.as_deref().unwrap_or("off"), initiator = %params.initiator_name, target = params.target_name.as_deref().unwrap_or("(discovery)"),
        tsih = result.tsih, header_digest = params.header_digest, data_digest = params.data_digest,
        immediate_data = params.immediate_data, initial_r2t = params.initial_r2t,
        max_burst = params.max_burst_length, first_burst = params.first_burst_length,
        "login complete"
    );
    let seal = lock(&slot).take().map(Arc::new);
    let (session_cancel, stats) = shared.registry.register(crate::registry::SessionInfo::new(
        &params,
        result.isid,
        result.tsih,
        peer,
        local,
        seal.clone(),
    ));
    // Registered: the session counts itself now.
    drop(session_slot);

    conn.codec = Codec {
        header_digest: params.header_digest,
        data_digest: params.data_digest,
        max_recv_data_segment_length: shared.offer.max_recv_data_segment_length,
    };
    // Seal record protection (docs/seal.md §4a): keys bound to the whole login transcript.
    // `seal` was taken from the slot above, before registering (the slot is empty now).
    let mut sealer = None;
    if let Some(s) = &seal {
        let hash = lock(&transcript).hash();
        match s.record_layer(&hash) {
            Ok((w, r)) => {
                sealer = Some(w);
                conn.record = Some(r);
            }
            Err(e) => {
                warn!(%peer, "seal: cannot set up record protection: {e}; closing");
                return;
            }
        }
    }
    let window = Arc::new(Mutex::new(CmdWindow::new(
        result.cmd_sn,
        shared.offer.cmd_window,
    )));
    let (tx, rx) = mpsc::channel::<Out>(1024);
    let writer = tokio::spawn(writer_task(
        wr,
        rx,
        conn.codec.clone(),
        window.clone(),
        result.next_stat_sn,
        sealer,
    ));
    let mut session = Session {
        shared: shared.clone(),
        params,
        stats,
        nexus,
        window,
        tasks: Arc::new(Mutex::new(HashMap::new())),
        out: tx,
        next_ttt: 1,
        local,
        aborted: VecDeque::new(),
        text_partial: Vec::new(),
        ping: None,
        seal,
        rekey_asked: Arc::new(AtomicBool::new(false)),
    };
    let end = session
        .run(&mut conn, &shared, &shutdown, &session_cancel)
        .await;
    debug!(%peer, "session ending: {end}");
    session.drain().await;
    if let Some(t) = session.target() {
        // The I_T nexus is gone: release what it held (RESERVE, PREVENT; SAM-5 §5.9).
        for lu in t.luns.values() {
            lu.nexus_lost(&session.nexus);
        }
    }
    let _ = session.out.send(Out::Close).await;
    drop(session.out);
    let _ = writer.await;
    shared.registry.unregister(
        &session.params.initiator_name,
        result.isid,
        session.params.target_name.as_deref(),
        result.tsih,
    );
    info!(%peer, tsih = result.tsih, "session closed");
}

struct Reader {
    rd: OwnedReadHalf,
    buf: BytesMut,
    codec: Codec,
    /// Seal record protection of a sealed session's full feature phase (docs/seal.md §4a).
    record: Option<RecordOpener>,
}

impl Reader {
    /// The next PDU, `Ok(None)` on a clean close. In a sealed session a PDU that fails record
    /// protection is an error of kind `InvalidData` wrapping a [`Forgery`]: nothing of it
    /// reaches the full-feature logic, and the connection must be dropped.
    async fn next(&mut self) -> std::io::Result<Option<Result<Pdu, WireError>>> {
        loop {
            match self.codec.decode(&mut self.buf) {
                Ok(Some(mut pdu)) => {
                    // ---- SEAL RECORD HOOK (framed read): verify, strip the Seal AHS ----
                    if let Some(r) = &mut self.record {
                        r.verify(&mut pdu)
                            .map_err(|f| std::io::Error::new(std::io::ErrorKind::InvalidData, f))?;
                    }
                    return Ok(Some(Ok(pdu)));
                }
                Ok(None) => {}
                Err(e) => return Ok(Some(Err(e))),
            }
            if self.buf.capacity() - self.buf.len() < 64 * 1024 {
                self.buf.reserve(256 * 1024);
            }
            if self.rd.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }
}

/// A completed login and the session slot it holds until the session registers.
type LoggedIn = (
    iscsi_proto::login::LoginResult,
    Option<crate::registry::SessionSlot>,
);

/// Runs the login; `Ok(None)` when it failed or the peer went away (already answered).
async fn login_phase(
    conn: &mut Reader,
    wr: &mut OwnedWriteHalf,
    shared: &Shared,
    slot: &SealSlot,
    transcript: &TranscriptSlot,
    peer: SocketAddr,
) -> std::io::Result<Option<LoggedIn>> {
    let ext = SealExtension::new(shared.registry.clone(), slot.clone(), transcript.clone());
    let mut login = TargetLogin::new(shared.offer.clone(), Some(Box::new(ext)));
    let codec = Codec::default();
    let mut dir = LoginDirectory::new(shared.registry.clone(), peer.ip());
    let mut first = true;
    loop {
        let next = if first {
            // A connection that does not even send its first Login Request soon is closed
            // long before login_timeout, so idle connections cannot hold every slot.
            let limit = shared.registry.limits.first_pdu_timeout;
            match tokio::time::timeout(limit, conn.next()).await {
                Ok(n) => n?,
                Err(_) => {
                    crate::limits::LimitStats::bump(&shared.registry.stats.first_pdu_timeouts);
                    debug!(%peer, "no Login Request within {limit:?}; closing");
                    return Ok(None);
                }
            }
        } else {
            conn.next().await?
        };
        first = false;
        let pdu = match next {
            None => return Ok(None),
            Some(Ok(pdu)) => pdu,
            Some(Err(e)) => {
                debug!("malformed PDU during login: {e}");
                return Ok(None);
            }
        };
        let Header::LoginRequest(req) = &pdu.header else {
            // RFC 7143 §6.3: only Login Requests until full feature phase.
            debug!("{:?} during login; closing", pdu.header.opcode());
            return Ok(None);
        };
        // Every Login PDU goes into the transcript Seal binds (docs/seal.md §3).
        lock(transcript).add_received(Direction::InitiatorToTarget, &pdu);
        let reply = login.handle(req, &pdu.data, &mut dir);
        if let Outcome::Failed(f) = &reply.outcome {
            shared.registry.count_login(&dir, Some(f.status.0));
            auth_failure_backoff(shared, &dir, peer, f).await;
        }
        let mut out = BytesMut::new();
        let resp = Pdu::new(reply.header, Bytes::from(reply.data));
        if codec.encode(&resp, &mut out).is_err() {
            return Ok(None);
        }
        lock(transcript).add_sent(Direction::TargetToInitiator, &resp);
        wr.write_all(&out).await?;
        match reply.outcome {
            Outcome::Continue => {}
            Outcome::Failed(f) => {
                warn!(%peer, initiator = dir.initiator().as_deref().unwrap_or("(not declared)"), initiator_isid = %hex::encode(req.isid), status = format!("{:#06x}", f.status.0), "login refused: {}", f.reason);
                let _ = wr.shutdown().await;
                return Ok(None);
            }
            Outcome::FullFeature(result) => {
                shared.registry.count_login(&dir, None);
                if dir.chap_required() {
                    shared
                        .registry
                        .auth_success(&result.params.initiator_name, peer.ip());
                }
                return Ok(Some((*result, dir.take_slot())));
            }
        }
    }
}

/// Counts an authentication failure (0x0201) against the initiator and its address, logs it
/// (who, from where, how many, the lockout; never the secret or the response) and holds the
/// failing response back by the backoff's delay (crates/ipsan-target/src/limits.rs).
async fn auth_failure_backoff(
    shared: &Shared,
    dir: &LoginDirectory,
    peer: SocketAddr,
    f: &iscsi_proto::login::LoginFailure,
) {
    if f.status != iscsi_proto::login::LoginStatus::AUTHENTICATION_FAILURE {
        return;
    }
    let Some(initiator) = dir.initiator() else {
        return;
    };
    let v = shared.registry.auth_failure(&initiator, peer.ip());
    warn!(
        %peer,
        initiator = %initiator,
        failures_name_here = v.failures_name_here,
        failures_address = v.failures_address,
        failures_name = v.failures_name,
        lockout_ms = v.lockout.map_or(0, |d| d.as_millis()),
        delay_ms = v.delay.as_millis(),
        "authentication failed{}",
        if v.lockout.is_some() { "; locked out" } else { "" }
    );
    // Never hold the answer past the login timeout (it would be dropped unanswered).
    tokio::time::sleep(v.delay.min(shared.login_timeout / 2)).await;
}

/// CHECK CONDITION, ABORTED COMMAND / SECURITY ERROR (0Bh/74h/00h): the answer when this
/// side cannot seal data-in, or when data-out's Seal counters run past the session's limit.
fn seal_security_error() -> ScsiResponse {
    ScsiResponse::check(Sense::new(SenseKey::ABORTED_COMMAND, 0x74, 0x00))
}

/// The answer to data-out whose Seal counters run past the session's limit
/// ([`seal_security_error`]); `None` for other open failures.
fn seal_limit_response(e: &ipsan_seal::OpenError) -> Option<ScsiResponse> {
    matches!(e, ipsan_seal::OpenError::CounterLimit { .. }).then(seal_security_error)
}

/// After a sealed command: at the hard counter limit close the connection (the command has
/// its CHECK CONDITION); past the high-water mark ask once for a logout with an Asynchronous
/// Message, AsyncEvent 1 "target requests logout" (RFC 7143 §11.9.1), so the initiator logs
/// in again and both sides derive fresh keys (docs/seal.md). Parameter3 is the time the
/// initiator has to log out, in seconds.
async fn seal_counter_watch(
    out: &mpsc::Sender<Out>,
    session: &SealSession,
    asked: &AtomicBool,
    exhausted: bool,
) {
    let (sent, received) = session.counters_used();
    if exhausted {
        warn!(
            sent,
            received,
            limit = session.counter_limit(),
            "seal: counter limit reached; closing the connection"
        );
        let _ = out.send(Out::Close).await;
        return;
    }
    if session.rekey_due() && !asked.swap(true, Ordering::AcqRel) {
        info!(
            sent,
            received,
            mark = session.rekey_mark(),
            "seal: counters past the re-key mark; asking the initiator to log out (AsyncEvent 1)"
        );
        let msg = iscsi_wire::header::AsyncMessage {
            async_event: 1,
            parameter3: LOGOUT_WAIT_SECS,
            ..Default::default()
        };
        let _ = out.send(Out::Pdu(Pdu::new(msg, Bytes::new()))).await;
    }
}

/// Seconds an initiator has to log out after AsyncEvent 1 (RFC 7143 §11.9.1 Parameter3).
const LOGOUT_WAIT_SECS: u16 = 10;

/// A message for the writer task.
#[derive(Debug)]
enum Out {
    Pdu(Pdu),
    Close,
}

fn stamp(h: &mut Header, stat_sn: &mut u32, exp: u32, max: u32) {
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

async fn writer_task(
    wr: OwnedWriteHalf,
    mut rx: mpsc::Receiver<Out>,
    codec: Codec,
    window: Arc<Mutex<CmdWindow>>,
    mut stat_sn: u32,
    mut sealer: Option<RecordSealer>,
) {
    let mut bw = BufWriter::with_capacity(256 * 1024, wr);
    let mut head = BytesMut::with_capacity(4096);
    'outer: while let Some(first) = rx.recv().await {
        let mut next = Some(first);
        while let Some(msg) = next.take() {
            next = rx.try_recv().ok();
            match msg {
                Out::Close => break 'outer,
                Out::Pdu(mut pdu) => {
                    let (exp, max) = {
                        let mut w = lock(&window);
                        w.refresh();
                        (w.exp_cmd_sn(), w.max_cmd_sn())
                    };
                    stamp(&mut pdu.header, &mut stat_sn, exp, max);
                    debug!(opcode = ?pdu.header.opcode(), itt = format!("{:#x}", pdu.header.itt()), len = pdu.data.len(), "send");
                    // ---- SEAL RECORD HOOK (framed write): after stamping, in wire order ----
                    if let Some(s) = &mut sealer {
                        if let Err(e) = s.protect(&mut pdu) {
                            warn!("seal: cannot protect a PDU: {e}; closing the connection");
                            break 'outer;
                        }
                    }
                    head.clear();
                    let Ok(trailer) = codec.encode_head(&pdu, &mut head) else {
                        warn!("cannot encode {:?}", pdu.header.opcode());
                        if sealer.is_some() {
                            // Its record counter is spent: the next PDU could not verify.
                            break 'outer;
                        }
                        continue;
                    };
                    let sent = async {
                        bw.write_all(&head).await?;
                        bw.write_all(&pdu.data).await?;
                        bw.write_all(trailer.as_bytes()).await
                    };
                    if let Err(e) = sent.await {
                        debug!("write failed: {e}");
                        break 'outer;
                    }
                }
            }
        }
        if bw.flush().await.is_err() {
            break;
        }
    }
    let _ = bw.flush().await;
    let _ = bw.into_inner().shutdown().await;
    // Drain so senders never block on a dead writer.
    rx.close();
    while rx.recv().await.is_some() {}
}

/// Who runs a command.
#[derive(Clone, Debug)]
enum Exec {
    /// The LU, and whether its backend works at memory speed (`mem`, `null`): small reads
    /// and writes then run inline instead of hopping to the blocking pool, which is most of a
    /// depth-1 command's latency on loopback.
    Lu(Arc<LogicalUnit>, bool),
    NoLun,
}

/// The largest READ/WRITE run inline on a memory-speed backend.
const INLINE_MAX_BYTES: u64 = 1 << 20;

/// Whether `cdb` is a READ/WRITE small enough to run on the network task for `exec`.
fn runs_inline(exec: &Exec, cdb: &[u8]) -> bool {
    let Exec::Lu(lu, true) = exec else {
        return false;
    };
    let rw = matches!(
        cdb.first(),
        Some(0x08 | 0x0a | 0x28 | 0x2a | 0x88 | 0x8a | 0xa8 | 0xaa)
    );
    let (_, blocks) = ipsan_seal::cdb::extent(cdb);
    rw && u64::from(blocks) * u64::from(lu.block_size()) <= INLINE_MAX_BYTES
}

/// Whether `cdb` goes through the LU's submit/complete path (`LogicalUnit::runs_async`).
fn runs_async(exec: &Exec, cdb: &[u8]) -> bool {
    matches!(exec, Exec::Lu(lu, _) if lu.runs_async(cdb))
}

#[derive(Debug)]
enum TaskState {
    /// Collecting Data-Out.
    Collecting(Box<Pending>),
    /// Executing (or sending its response).
    Running {
        abort: Arc<AtomicBool>,
        done: watch::Receiver<bool>,
    },
}

#[derive(Debug)]
struct TaskEntry {
    lun: u64,
    /// Whether it holds a CmdSN window slot (non-immediate).
    counted: bool,
    state: TaskState,
}

/// A command waiting for its data.
#[derive(Debug)]
struct Pending {
    exec: Exec,
    cdb: Vec<u8>,
    raw_lun: u64,
    write: WriteState,
    need: u64,
    /// A response decided before execution (bad CDB, overflow): sent once the data phase ends.
    pre: Option<ScsiResponse>,
}

/// Residual accounting for the final status (RFC 7143 §11.4.5).
#[derive(Clone, Copy, Debug, Default)]
struct Residual {
    overflow: u32,
    underflow: u32,
}

struct Session {
    shared: Arc<Shared>,
    params: SessionParams,
    /// This session's counters (metrics.rs, `ipsan ctl sessions`).
    stats: Arc<crate::metrics::SessionStats>,
    nexus: NexusId,
    window: Arc<Mutex<CmdWindow>>,
    tasks: Arc<Mutex<HashMap<u32, TaskEntry>>>,
    out: mpsc::Sender<Out>,
    next_ttt: u32,
    local: Option<SocketAddr>,
    /// ITTs of recently aborted tasks whose late Data-Out is dropped silently.
    aborted: VecDeque<u32>,
    text_partial: Vec<u8>,
    /// TTT and deadline of an unanswered NOP-In ping.
    ping: Option<(u32, tokio::time::Instant)>,
    /// The Seal session, when one was negotiated: every command's data is sealed.
    seal: Option<Arc<SealSession>>,
    /// Set once the target has asked this session to log out for fresh Seal keys.
    rekey_asked: Arc<AtomicBool>,
}

impl Session {
    /// The session's target as it is now (LUNs can be added or removed while it runs).
    fn target(&self) -> Option<Arc<Target>> {
        self.params
            .target_name
            .as_deref()
            .and_then(|n| self.shared.registry.target(n))
    }

    async fn send(&self, header: impl Into<Header>, data: Bytes) {
        let _ = self.out.send(Out::Pdu(Pdu::new(header, data))).await;
    }

    async fn reject(&self, reason: RejectReason, bhs: &[u8; 48]) {
        debug!(?reason, opcode = bhs[0] & 0x3f, "Reject");
        self.send(
            Reject {
                reason,
                ..Reject::default()
            },
            Bytes::copy_from_slice(bhs),
        )
        .await;
    }

    fn is_discovery(&self) -> bool {
        self.params.session_type == SessionType::Discovery
    }

    fn alloc_ttt(&mut self) -> u32 {
        let t = self.next_ttt;
        self.next_ttt = self.next_ttt.wrapping_add(1);
        if self.next_ttt == RESERVED_TAG {
            self.next_ttt = 1;
        }
        t
    }

    /// The full feature phase loop; returns why it ended.
    async fn run(
        &mut self,
        conn: &mut Reader,
        shared: &Shared,
        shutdown: &CancellationToken,
        session_cancel: &CancellationToken,
    ) -> String {
        let interval = shared.nop_interval;
        let mut idle_deadline = interval.map(|i| tokio::time::Instant::now() + i);
        loop {
            let sleep_until = match (self.ping, idle_deadline) {
                (Some((_, d)), _) => Some(d),
                (None, d) => d,
            };
            let next = tokio::select! {
                r = conn.next() => r,
                () = shutdown.cancelled() => return "target shutting down".into(),
                () = session_cancel.cancelled() => return "session reinstated or cancelled".into(),
                () = self.stats.logout.notified() => {
                    // `ipsan ctl logout-all`: ask politely (RFC 7143 §11.9.1, AsyncEvent 1).
                    self.send(AsyncMessage { async_event: 1, parameter3: LOGOUT_WAIT_SECS, ..AsyncMessage::default() }, Bytes::new()).await;
                    continue;
                }
                () = async { match sleep_until { Some(d) => tokio::time::sleep_until(d).await, None => std::future::pending().await } } => {
                    if self.ping.is_some() {
                        return "NOP-In ping unanswered".into();
                    }
                    if let Some(i) = interval {
                        let ttt = self.alloc_ttt();
                        self.ping = Some((ttt, tokio::time::Instant::now() + i));
                        self.send(NopIn { lun: 0, itt: RESERVED_TAG, ttt, ..NopIn::default() }, Bytes::new()).await;
                    }
                    continue;
                }
            };
            idle_deadline = interval.map(|i| tokio::time::Instant::now() + i);
            let pdu = match next {
                Err(e) => {
                    if let Some(f) = e.get_ref().and_then(|x| x.downcast_ref::<Forgery>()) {
                        crate::limits::LimitStats::bump(&shared.registry.stats.forged_pdus);
                        warn!(
                            initiator = %self.params.initiator_name,
                            "{f}; nothing of it acts, dropping the connection"
                        );
                        return format!("forged PDU: {f}");
                    }
                    return format!("read error: {e}");
                }
                Ok(None) => return "connection closed by initiator".into(),
                Ok(Some(Ok(pdu))) => pdu,
                Ok(Some(Err(e))) => {
                    let reason = match &e {
                        WireError::DataDigest { .. } => RejectReason::DATA_DIGEST_ERROR,
                        WireError::UnsupportedOpcode { .. } => RejectReason::COMMAND_NOT_SUPPORTED,
                        _ => RejectReason::PROTOCOL_ERROR,
                    };
                    self.stats.pdu_error(&e);
                    if let Some(bhs) = e.rejected_header() {
                        self.reject(reason, bhs).await;
                    }
                    if !e.stream_intact() {
                        return format!("unrecoverable PDU error: {e}");
                    }
                    warn!("rejected PDU: {e}");
                    continue;
                }
            };
            debug!(opcode = ?pdu.header.opcode(), itt = format!("{:#x}", pdu.header.itt()), len = pdu.data.len(), "recv");
            match self.dispatch(pdu).await {
                Flow::Continue => {}
                Flow::Close(why) => return why,
            }
        }
    }

    async fn dispatch(&mut self, pdu: Pdu) -> Flow {
        let raw = *pdu.raw_bhs();
        match pdu.header {
            Header::ScsiCommand(cmd) if !self.is_discovery() => {
                self.on_command(cmd, &pdu.ahs, pdu.data, &raw).await
            }
            Header::DataOut(h) if !self.is_discovery() => self.on_data_out(h, pdu.data, &raw).await,
            Header::TaskMgmtRequest(h) if !self.is_discovery() => return self.on_tmf(h).await,
            Header::NopOut(h) => self.on_nop_out(h, pdu.data).await,
            Header::TextRequest(h) => self.on_text(h, &pdu.data, &raw).await,
            Header::LogoutRequest(h) => return self.on_logout(h).await,
            Header::SnackRequest(_) => {
                // ErrorRecoveryLevel=0: SNACK is not supported (RFC 7143 §11.16).
                self.reject(RejectReason::PROTOCOL_ERROR, &raw).await;
            }
            _ => self.reject(RejectReason::PROTOCOL_ERROR, &raw).await,
        }
        Flow::Continue
    }

    /// Admits a CmdSN-carrying request; false when it must be ignored.
    fn admit(&self, cmd_sn: u32, immediate: bool) -> bool {
        let a = lock(&self.window).admit(cmd_sn, immediate);
        if a == Admit::Ignore {
            let w = lock(&self.window);
            debug!(
                cmd_sn,
                exp = w.exp_cmd_sn(),
                max = w.max_cmd_sn(),
                "CmdSN outside the window: ignored (RFC 7143 §4.2.2.1)"
            );
            return false;
        }
        true
    }

    async fn on_command(&mut self, cmd: ScsiCommand, ahs: &Bytes, data: Bytes, raw: &[u8; 48]) {
        if !self.admit(cmd.cmd_sn, cmd.immediate) {
            return;
        }
        let counted = !cmd.immediate;
        if lock(&self.tasks).contains_key(&cmd.itt) {
            // A task tag must be unique among the session's active tasks (RFC 7143 §11.2.1.8).
            self.reject(RejectReason::INVALID_PDU_FIELD, raw).await;
            if counted {
                lock(&self.window).complete();
            }
            return;
        }
        let cdb = match assemble_cdb(&cmd, ahs) {
            Ok(c) => c,
            Err(()) => {
                self.reject(RejectReason::PROTOCOL_ERROR, raw).await;
                if counted {
                    lock(&self.window).complete();
                }
                return;
            }
        };
        let lun = decode_lun(cmd.lun.to_be_bytes());
        let exec = match self.target().as_ref().and_then(|t| t.luns.get(&lun)) {
            Some(lu) => Exec::Lu(lu.clone(), self.fast_backend(lun)),
            None => Exec::NoLun,
        };
        let mut pre = None;
        let need = match &exec {
            Exec::Lu(lu, _) => match lu.command_info(&cdb) {
                Ok(info) if info.direction == DataDirection::Write => info.data_out_len,
                Ok(_) => 0,
                Err(sense) => {
                    pre = Some(ScsiResponse::check(sense));
                    0
                }
            },
            Exec::NoLun => 0,
        };
        // In a Seal session data travels sealed: EDTL and every offset count sealed bytes, and
        // a length that is not exactly the sealed size of what the CDB needs is refused
        // (sealed data cannot be truncated).
        let need = match (&self.seal, need) {
            (Some(seal), n) if n > 0 && pre.is_none() => {
                match seal.sealed_len(usize::try_from(n).unwrap_or(usize::MAX)) {
                    Some(sealed)
                        if sealed as u64 == u64::from(cmd.expected_data_transfer_length) =>
                    {
                        sealed as u64
                    }
                    _ => {
                        pre = Some(ScsiResponse::check(Sense::new(
                            SenseKey::ILLEGAL_REQUEST,
                            0x0e,
                            0x03,
                        )));
                        u64::from(cmd.expected_data_transfer_length)
                    }
                }
            }
            (_, n) => n,
        };
        let need = if need > MAX_COMMAND_BYTES {
            pre = Some(ScsiResponse::check(Sense::invalid_field_in_cdb()));
            0
        } else {
            need
        };
        if !cmd.write {
            if !data.is_empty() {
                // Immediate data on a command without the W bit (RFC 7143 §11.3.1).
                self.reject(RejectReason::PROTOCOL_ERROR, raw).await;
                if counted {
                    lock(&self.window).complete();
                }
                return;
            }
            let write_overflow = (need > 0).then_some(need);
            let mut cdb = cdb;
            if pre.is_none() && write_overflow.is_some() {
                // A data-out command sent without the W bit: EDTL 0, all of it overflows.
                pre = Some(match overflow_write(&exec, &mut cdb, 0) {
                    Some(_) => self.without_blocks(&exec, &cdb),
                    None => ScsiResponse::check(Sense::new(SenseKey::ILLEGAL_REQUEST, 0x0e, 0x03)),
                });
            }
            self.start(
                cmd.itt,
                lun,
                counted,
                exec,
                cdb,
                Bytes::new(),
                cmd.expected_data_transfer_length,
                cmd.lun,
                need,
                pre,
                write_overflow,
            );
            return;
        }
        let need32 = u32::try_from(need).unwrap_or(u32::MAX);
        let mut write = match WriteState::new(&self.params, &cmd, &data, need32) {
            Ok(w) => w,
            Err(e) => {
                warn!(itt = cmd.itt, "{e}");
                self.reject(RejectReason::PROTOCOL_ERROR, raw).await;
                if counted {
                    lock(&self.window).complete();
                }
                return;
            }
        };
        let plans = write.plan_r2ts(|| self.alloc_ttt());
        self.stats.r2ts(plans.len());
        for p in &plans {
            self.send(
                R2t {
                    lun: cmd.lun,
                    itt: cmd.itt,
                    ttt: p.ttt,
                    r2t_sn: p.r2t_sn,
                    buffer_offset: p.offset,
                    desired_data_transfer_length: p.len,
                    ..R2t::default()
                },
                Bytes::new(),
            )
            .await;
        }
        let pending = Pending {
            exec,
            cdb,
            raw_lun: cmd.lun,
            write,
            need,
            pre,
        };
        if pending.write.is_complete() {
            self.start_pending(cmd.itt, lun, counted, pending);
        } else {
            lock(&self.tasks).insert(
                cmd.itt,
                TaskEntry {
                    lun,
                    counted,
                    state: TaskState::Collecting(Box::new(pending)),
                },
            );
        }
    }

    fn start_pending(&self, itt: u32, lun: u64, counted: bool, p: Pending) {
        let edtl = p.write.edtl();
        let data = p.write.into_data();
        let mut pre = p.pre;
        let mut cdb = p.cdb;
        let mut data = data;
        if pre.is_none() && u64::from(edtl) < p.need {
            // iSCSI overflow on a write: EDTL shorter than the CDB's transfer.
            match overflow_write(&p.exec, &mut cdb, edtl) {
                // FCP-4 option (a): transfer and write only the whole blocks EDTL covers.
                Some(Some(bytes)) => data.truncate(bytes),
                Some(None) => pre = Some(self.without_blocks(&p.exec, &cdb)),
                // Not a block write: nothing is written (option b), INVALID FIELD IN COMMAND
                // INFORMATION UNIT.
                None => {
                    pre = Some(ScsiResponse::check(Sense::new(
                        SenseKey::ILLEGAL_REQUEST,
                        0x0e,
                        0x03,
                    )))
                }
            }
        }
        self.start(
            itt, lun, counted, p.exec, cdb, data, edtl, p.raw_lun, p.need, pre, None,
        );
    }

    /// Whether LUN `lun`'s backend works at memory speed.
    fn fast_backend(&self, lun: u64) -> bool {
        self.target().is_some_and(|t| {
            t.backends
                .iter()
                .any(|(id, b)| *id == lun && b.engine() == ipsan_scsi::Engine::Inline)
        })
    }

    /// The answer to a block write whose EDTL covers no whole block: nothing to write, but
    /// unit attentions, CDB checks and reservations still apply (SPC-4 §5.13), so an
    /// initiator without access gets its RESERVATION CONFLICT rather than GOOD.
    fn without_blocks(&self, exec: &Exec, cdb: &[u8]) -> ScsiResponse {
        match exec {
            Exec::Lu(lu, _) => lu
                .precheck(&self.nexus, cdb)
                .unwrap_or_else(|| ScsiResponse::good(Bytes::new())),
            Exec::NoLun => no_such_lun(cdb),
        }
    }

    /// Runs a command on the blocking pool and sends its response.
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        itt: u32,
        lun: u64,
        counted: bool,
        exec: Exec,
        cdb: Vec<u8>,
        data_out: Bytes,
        edtl: u32,
        raw_lun: u64,
        need: u64,
        pre: Option<ScsiResponse>,
        write_without_w: Option<u64>,
    ) {
        let abort = Arc::new(AtomicBool::new(false));
        let (done_tx, done_rx) = watch::channel(false);
        lock(&self.tasks).insert(
            itt,
            TaskEntry {
                lun,
                counted,
                state: TaskState::Running {
                    abort: abort.clone(),
                    done: done_rx,
                },
            },
        );
        let tasks = self.tasks.clone();
        let window = self.window.clone();
        let out = self.out.clone();
        let nexus = self.nexus.clone();
        let seg = self.params.initiator_max_recv_data_segment_length.max(512);
        let burst = self.params.max_burst_length.max(512);
        let target = self.target();
        let timer = self.stats.start(lun);
        let seal = self.seal.clone().map(|s| {
            (
                s,
                self.shared.pool.clone(),
                ipsan_seal::cdb::binding(raw_lun, itt, &cdb),
            )
        });
        let rekey_asked = self.rekey_asked.clone();
        let stats = self.stats.clone();
        tokio::spawn(async move {
            // A Seal counter at its hard limit: this command fails, then the connection closes.
            let mut seal_exhausted = false;
            let mut pre = pre;
            let mut data_out = data_out;
            if let (Some((session, pool, binding)), None, false) =
                (&seal, &pre, data_out.is_empty())
            {
                // Verify and decrypt before anything reaches the backend (docs/seal.md §5).
                // The write buffer is uniquely owned: open it in place, no copy.
                let buf = std::mem::take(&mut data_out)
                    .try_into_mut()
                    .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
                match pool.open(session, *binding, buf).await {
                    Ok(plain) => data_out = plain,
                    Err(e) => {
                        stats.seal_open_failed(&e);
                        warn!(
                            itt,
                            lun,
                            lba = binding.lba,
                            blocks = binding.blocks,
                            opcode = binding.opcode,
                            "seal: data-out refused: {e}"
                        );
                        pre = Some(ScsiResponse::check(Sense::new(
                            SenseKey(ipsan_seal::sense::SENSE_KEY),
                            ipsan_seal::sense::ASC,
                            ipsan_seal::sense::ASCQ,
                        )));
                        if let Some(r) = seal_limit_response(&e) {
                            pre = Some(r);
                            seal_exhausted = true;
                        }
                    }
                }
            }
            let resp = match pre {
                Some(r) => r,
                // An async backend (RBD) completes data-path commands through callbacks: the
                // task awaits them and holds no thread (ipsan_scsi::aio).
                None if runs_async(&exec, &cdb) => match exec {
                    Exec::Lu(lu, _) => {
                        lu.execute_async(OwnedRequest {
                            cdb: cdb.clone(),
                            data_out,
                            nexus,
                            lun,
                            tag: u64::from(itt),
                        })
                        .await
                    }
                    Exec::NoLun => no_such_lun(&cdb),
                },
                None => {
                    let cdb2 = cdb.clone();
                    let inline = runs_inline(&exec, &cdb2);
                    let run = move || match exec {
                        // REPORT LUNS answers for the whole target, whichever LUN it addressed
                        // (SPC-4 §6.33).
                        _ if cdb2.first() == Some(&0xa0) => {
                            let luns: Vec<u64> = target
                                .map(|t| t.luns.keys().copied().collect())
                                .unwrap_or_default();
                            report_luns(&luns, &cdb2)
                        }
                        Exec::Lu(lu, _) => lu.execute(&ScsiRequest {
                            cdb: &cdb2,
                            data_out: &data_out,
                            nexus: &nexus,
                            lun,
                        }),
                        Exec::NoLun => no_such_lun(&cdb2),
                    };
                    if inline {
                        run()
                    } else {
                        tokio::task::spawn_blocking(run).await.unwrap_or_else(|_| {
                            ScsiResponse::check(Sense::new(SenseKey::HARDWARE_ERROR, 0x44, 0x00))
                        })
                    }
                }
            };
            let mut resp = resp;
            if let (Some((session, pool, binding)), false) = (&seal, resp.data_in.is_empty()) {
                // The device server's buffer has no room for the trailer: seal a copy, made
                // on the crypto worker chunk by chunk with the encryption.
                let plain = std::mem::take(&mut resp.data_in);
                match pool.seal_copy(session, *binding, plain).await {
                    Ok(sealed) => resp.data_in = sealed,
                    Err(e) => {
                        warn!(itt, "seal: cannot seal data-in: {e}");
                        resp = seal_security_error();
                        seal_exhausted = e == ipsan_seal::SealError::CounterExhausted;
                    }
                }
            }
            // Residuals (RFC 7143 §11.4.5): data-out commands compare EDTL with what the CDB
            // needed; data-in commands compare it with what the device server produced.
            let mut res = Residual::default();
            let needed = write_without_w.unwrap_or(need);
            if needed > 0 {
                let needed = u32::try_from(needed).unwrap_or(u32::MAX);
                if edtl < needed {
                    res.overflow = needed - edtl;
                } else if edtl > needed {
                    res.underflow = edtl - needed;
                }
            } else {
                let produced = u32::try_from(resp.data_in.len()).unwrap_or(u32::MAX);
                if produced > edtl {
                    res.overflow = produced - edtl;
                } else if produced < edtl {
                    res.underflow = edtl - produced;
                }
            }
            timer.done(&cdb, &resp);
            lock(&tasks).remove(&itt);
            if counted {
                lock(&window).complete();
            }
            if !abort.load(Ordering::Acquire) {
                send_status(&out, itt, raw_lun, resp, edtl, res, seg, burst).await;
            }
            if let Some((session, _, _)) = &seal {
                seal_counter_watch(&out, session, &rekey_asked, seal_exhausted).await;
            }
            let _ = done_tx.send(true);
        });
    }

    async fn on_data_out(&mut self, h: DataOut, data: Bytes, raw: &[u8; 48]) {
        let itt = h.itt;
        let result = {
            let mut tasks = lock(&self.tasks);
            match tasks.get_mut(&itt) {
                Some(TaskEntry {
                    state: TaskState::Collecting(p),
                    ..
                }) => Some(p.write.on_data_out(&h, &data)),
                Some(_) => Some(Err(crate::task::DataError(
                    "Data-Out for a command past its data phase",
                ))),
                None => None,
            }
        };
        match result {
            None => {
                if self.aborted.contains(&itt) {
                    trace!(itt, "late Data-Out for an aborted task dropped");
                } else {
                    self.reject(RejectReason::INVALID_PDU_FIELD, raw).await;
                }
            }
            Some(Err(e)) => {
                warn!(itt, "{e}");
                self.reject(RejectReason::PROTOCOL_ERROR, raw).await;
                // ERL 0 cannot repair a data phase: end the command with CHECK CONDITION.
                let entry = lock(&self.tasks).remove(&itt);
                if let Some(TaskEntry {
                    lun,
                    counted,
                    state: TaskState::Collecting(mut p),
                }) = entry
                {
                    p.pre = Some(ScsiResponse::check(Sense::new(
                        SenseKey::ABORTED_COMMAND,
                        0x4b,
                        0x00,
                    )));
                    self.remember_aborted(itt);
                    self.start_pending(itt, lun, counted, *p);
                }
            }
            Some(Ok(())) => {
                let mut ttt = self.next_ttt;
                let (plans, raw_lun, complete) = {
                    let mut tasks = lock(&self.tasks);
                    let Some(TaskEntry {
                        state: TaskState::Collecting(p),
                        ..
                    }) = tasks.get_mut(&itt)
                    else {
                        return;
                    };
                    let plans = p.write.plan_r2ts(|| {
                        let t = ttt;
                        ttt = ttt.wrapping_add(1).max(1);
                        t
                    });
                    (plans, p.raw_lun, p.write.is_complete())
                };
                self.next_ttt = ttt;
                self.stats.r2ts(plans.len());
                for p in plans {
                    self.send(
                        R2t {
                            lun: raw_lun,
                            itt,
                            ttt: p.ttt,
                            r2t_sn: p.r2t_sn,
                            buffer_offset: p.offset,
                            desired_data_transfer_length: p.len,
                            ..R2t::default()
                        },
                        Bytes::new(),
                    )
                    .await;
                }
                if complete {
                    let entry = lock(&self.tasks).remove(&itt);
                    if let Some(TaskEntry {
                        lun,
                        counted,
                        state: TaskState::Collecting(p),
                    }) = entry
                    {
                        self.start_pending(itt, lun, counted, *p);
                    }
                }
            }
        }
    }

    fn remember_aborted(&mut self, itt: u32) {
        if self.aborted.len() >= 256 {
            self.aborted.pop_front();
        }
        self.aborted.push_back(itt);
    }

    /// Aborts the tasks `pick` selects: collecting ones are dropped at once, running ones have
    /// their responses suppressed. Returns waiters for the running ones.
    fn abort_where(
        &mut self,
        pick: impl Fn(u32, &TaskEntry) -> bool,
    ) -> Vec<watch::Receiver<bool>> {
        let mut waiters = Vec::new();
        let mut dropped = Vec::new();
        {
            let mut tasks = lock(&self.tasks);
            let itts: Vec<u32> = tasks
                .iter()
                .filter(|(i, e)| pick(**i, e))
                .map(|(i, _)| *i)
                .collect();
            for itt in itts {
                let collecting = matches!(
                    tasks.get(&itt),
                    Some(TaskEntry {
                        state: TaskState::Collecting(_),
                        ..
                    })
                );
                if collecting {
                    if let Some(e) = tasks.remove(&itt) {
                        dropped.push((itt, e.counted));
                    }
                } else if let Some(TaskEntry {
                    state: TaskState::Running { abort, done },
                    ..
                }) = tasks.get(&itt)
                {
                    abort.store(true, Ordering::Release);
                    waiters.push(done.clone());
                }
            }
        }
        for (itt, counted) in dropped {
            if counted {
                lock(&self.window).complete();
            }
            self.remember_aborted(itt);
        }
        waiters
    }

    async fn on_tmf(&mut self, h: TaskMgmtRequest) -> Flow {
        if !self.admit(h.cmd_sn, h.immediate) {
            return Flow::Continue;
        }
        if !h.immediate {
            lock(&self.window).complete();
        }
        let lun = decode_lun(h.lun.to_be_bytes());
        let lu = self.target().and_then(|t| t.luns.get(&lun).cloned());
        let respond = |response: TmfResponse| TaskMgmtResponse {
            response,
            itt: h.itt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        };
        let (response, waiters, close) = match h.function {
            TmfFunction::ABORT_TASK => {
                let rtt = h.referenced_task_tag;
                let exists = lock(&self.tasks).contains_key(&rtt);
                if exists {
                    (
                        TmfResponse::FUNCTION_COMPLETE,
                        self.abort_where(|i, _| i == rtt),
                        false,
                    )
                } else {
                    // RFC 7143 §11.5.1: a task already completed (RefCmdSN below this request's
                    // CmdSN) counts as aborted; one never received does not exist.
                    let r = if sn_lt(h.ref_cmd_sn, h.cmd_sn) {
                        TmfResponse::FUNCTION_COMPLETE
                    } else {
                        TmfResponse::TASK_DOES_NOT_EXIST
                    };
                    (r, Vec::new(), false)
                }
            }
            TmfFunction::ABORT_TASK_SET | TmfFunction::CLEAR_TASK_SET => {
                if lu.is_none() {
                    (TmfResponse::LUN_DOES_NOT_EXIST, Vec::new(), false)
                } else {
                    (
                        TmfResponse::FUNCTION_COMPLETE,
                        self.abort_where(|_, e| e.lun == lun),
                        false,
                    )
                }
            }
            TmfFunction::LOGICAL_UNIT_RESET => match &lu {
                None => (TmfResponse::LUN_DOES_NOT_EXIST, Vec::new(), false),
                Some(lu) => {
                    let w = self.abort_where(|_, e| e.lun == lun);
                    lu.reset(ResetKind::LogicalUnit, &self.nexus);
                    (TmfResponse::FUNCTION_COMPLETE, w, false)
                }
            },
            TmfFunction::TARGET_WARM_RESET | TmfFunction::TARGET_COLD_RESET => {
                let cold = h.function == TmfFunction::TARGET_COLD_RESET;
                let w = self.abort_where(|_, _| true);
                if let Some(t) = self.target() {
                    for lu in t.luns.values() {
                        lu.reset(
                            if cold {
                                ResetKind::TargetCold
                            } else {
                                ResetKind::TargetWarm
                            },
                            &self.nexus,
                        );
                    }
                }
                // RFC 7143 §11.5.1: after a cold reset the target drops all connections.
                (TmfResponse::FUNCTION_COMPLETE, w, cold)
            }
            TmfFunction::CLEAR_ACA => (TmfResponse::FUNCTION_NOT_SUPPORTED, Vec::new(), false),
            TmfFunction::TASK_REASSIGN => (
                TmfResponse::TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED,
                Vec::new(),
                false,
            ),
            _ => (TmfResponse::FUNCTION_REJECTED, Vec::new(), false),
        };
        info!(
            function = h.function.0,
            lun,
            response = response.0,
            "task management"
        );
        let out = self.out.clone();
        let resp = respond(response);
        let fut = async move {
            for mut w in waiters {
                let _ = w.wait_for(|d| *d).await;
            }
            let _ = out.send(Out::Pdu(Pdu::new(resp, Bytes::new()))).await;
        };
        if close {
            fut.await;
            return Flow::Close("target cold reset".into());
        }
        tokio::spawn(fut);
        Flow::Continue
    }

    async fn on_nop_out(&mut self, h: NopOut, data: Bytes) {
        if h.itt != RESERVED_TAG || !h.immediate {
            if !self.admit(h.cmd_sn, h.immediate) {
                return;
            }
            if !h.immediate {
                lock(&self.window).complete();
            }
        }
        if h.itt == RESERVED_TAG {
            // The answer to our ping (RFC 7143 §11.18.3).
            if self.ping.is_some_and(|(ttt, _)| ttt == h.ttt) {
                self.ping = None;
            }
            return;
        }
        // Echo the ping data (RFC 7143 §11.19: the NOP-In returns the NOP-Out's data).
        self.send(
            NopIn {
                lun: h.lun,
                itt: h.itt,
                ttt: RESERVED_TAG,
                ..NopIn::default()
            },
            data,
        )
        .await;
    }

    async fn on_text(&mut self, h: TextRequest, data: &[u8], raw: &[u8; 48]) {
        if !self.admit(h.cmd_sn, h.immediate) {
            return;
        }
        if !h.immediate {
            lock(&self.window).complete();
        }
        if self.text_partial.len() + data.len() > 64 * 1024 {
            self.text_partial.clear();
            self.reject(RejectReason::PROTOCOL_ERROR, raw).await;
            return;
        }
        self.text_partial.extend_from_slice(data);
        let resp = |final_: bool, ttt: u32| TextResponse {
            final_,
            continue_: false,
            lun: h.lun,
            itt: h.itt,
            ttt,
            stat_sn: 0,
            exp_cmd_sn: 0,
            max_cmd_sn: 0,
        };
        if h.continue_ {
            let ttt = self.alloc_ttt();
            self.send(resp(false, ttt), Bytes::new()).await;
            return;
        }
        let text = std::mem::take(&mut self.text_partial);
        let Ok(keys) = iscsi_wire::text::parse(&text) else {
            self.reject(RejectReason::PROTOCOL_ERROR, raw).await;
            return;
        };
        let mut answer: Vec<(String, String)> = Vec::new();
        for (k, v) in &keys {
            match k.as_str() {
                "SendTargets" => self.send_targets(v, &mut answer),
                "MaxRecvDataSegmentLength" => {
                    // Declarative, may change in full feature phase (RFC 7143 §13.12).
                    self.params
                        .apply(k, v, iscsi_proto::params::Side::Initiator);
                }
                _ if iscsi_proto::params::spec(k).is_some() => {
                    answer.push((k.clone(), REJECT.into()))
                }
                _ => answer.push((k.clone(), NOT_UNDERSTOOD.into())),
            }
        }
        let body = iscsi_wire::text::encode(&answer).freeze();
        self.send(resp(true, RESERVED_TAG), body).await;
    }

    /// SendTargets (RFC 7143 Appendix C): every target this initiator may use, with the
    /// portal it connected to. `All` lists every target; an empty value (normal sessions) or a
    /// name lists that one.
    fn send_targets(&self, value: &str, answer: &mut Vec<(String, String)>) {
        let ini = &self.params.initiator_name;
        let address = self.local.map(|a| match a {
            SocketAddr::V4(v4) => format!("{v4},{PORTAL_GROUP_TAG}"),
            SocketAddr::V6(v6) => format!("[{}]:{},{PORTAL_GROUP_TAG}", v6.ip(), v6.port()),
        });
        for t in self.shared.registry.targets().iter() {
            let wanted = match value {
                "All" => true,
                "" => self.params.target_name.as_deref() == Some(t.iqn.as_str()),
                name => name == t.iqn,
            };
            if wanted && t.allows(ini) {
                answer.push(("TargetName".into(), t.iqn.clone()));
                if let Some(a) = &address {
                    answer.push(("TargetAddress".into(), a.clone()));
                }
            }
        }
    }

    async fn on_logout(&mut self, h: LogoutRequest) -> Flow {
        if !self.admit(h.cmd_sn, h.immediate) {
            return Flow::Continue;
        }
        if !h.immediate {
            lock(&self.window).complete();
        }
        let response = match h.reason {
            LogoutReason::CLOSE_SESSION => 0,
            LogoutReason::CLOSE_CONNECTION if h.cid == 0 => 0,
            LogoutReason::CLOSE_CONNECTION => 1,
            _ => 2,
        };
        if response == 0 {
            // Commands still running finish and answer before the Logout Response.
            self.drain().await;
        }
        self.send(
            LogoutResponse {
                response,
                itt: h.itt,
                time2wait: 0,
                time2retain: 0,
                ..LogoutResponse::default()
            },
            Bytes::new(),
        )
        .await;
        if response == 0 {
            Flow::Close("logout".into())
        } else {
            Flow::Continue
        }
    }

    /// Waits (bounded) for running commands; drops commands still collecting data.
    async fn drain(&mut self) {
        let waiters: Vec<watch::Receiver<bool>> = {
            let mut tasks = lock(&self.tasks);
            tasks.retain(|_, e| !matches!(e.state, TaskState::Collecting(_)));
            tasks
                .values()
                .filter_map(|e| match &e.state {
                    TaskState::Running { done, .. } => Some(done.clone()),
                    TaskState::Collecting(_) => None,
                })
                .collect()
        };
        let all = async {
            for mut w in waiters {
                let _ = w.wait_for(|d| *d).await;
            }
        };
        if tokio::time::timeout(DRAIN_TIMEOUT, all).await.is_err() {
            warn!("commands still running after {DRAIN_TIMEOUT:?}; closing anyway");
        }
    }
}

enum Flow {
    Continue,
    Close(String),
}

/// For a block write (WRITE, WRITE AND VERIFY) whose EDTL covers less than its transfer
/// length, rewrites the CDB to the whole blocks EDTL covers: `Some(Some(bytes))` to write,
/// `Some(None)` when not one whole block is covered. `None` for other commands.
fn overflow_write(exec: &Exec, cdb: &mut [u8], edtl: u32) -> Option<Option<usize>> {
    let Exec::Lu(lu, _) = exec else { return None };
    let bs = lu.block_size().max(1);
    let blocks = edtl / bs;
    let field = match cdb.first()? {
        0x2a | 0x2e => 7..9,
        0xaa | 0xae => 6..10,
        0x8a | 0x8e => 10..14,
        // WRITE(6) counts 1..=255 blocks (0 means 256).
        0x0a if (1..=255).contains(&blocks) => 4..5,
        0x0a if blocks == 0 => return Some(None),
        _ => return None,
    };
    if cdb.len() < field.end {
        return None;
    }
    if blocks == 0 {
        return Some(None);
    }
    let bytes = blocks.to_be_bytes();
    let width = field.len();
    cdb[field].copy_from_slice(&bytes[4 - width..]);
    Some(Some((blocks * bs) as usize))
}

/// The CDB: 16 bytes in the BHS, continued in an Extended CDB AHS (RFC 7143 §11.2.2.3).
fn assemble_cdb(cmd: &ScsiCommand, ahs: &Bytes) -> Result<Vec<u8>, ()> {
    let mut cdb = cmd.cdb.to_vec();
    let mut rest = &ahs[..];
    while rest.len() >= 4 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let kind = rest[2];
        let total = iscsi_wire::pad4(3 + len);
        if total > rest.len() || len == 0 {
            return Err(());
        }
        if kind == 1 {
            // AHSLength counts the reserved byte plus the CDB continuation.
            cdb.extend_from_slice(&rest[4..3 + len]);
        }
        rest = &rest[total..];
    }
    Ok(cdb)
}

/// Sends a command's Data-In and status (RFC 7143 §11.7, §11.4): Data-In PDUs up to the
/// initiator's MaxRecvDataSegmentLength, F at every MaxBurstLength boundary, and GOOD status
/// collapsed into the last Data-In; otherwise a SCSI Response carrying the sense data.
#[allow(clippy::too_many_arguments)]
async fn send_status(
    out: &mpsc::Sender<Out>,
    itt: u32,
    lun: u64,
    resp: ScsiResponse,
    edtl: u32,
    res: Residual,
    seg: u32,
    burst: u32,
) {
    let data = resp.data_in.slice(..resp.data_in.len().min(edtl as usize));
    let good = resp.status == ScsiStatus::GOOD || resp.status == ScsiStatus::CONDITION_MET;
    let collapse = good && resp.sense.is_none() && !data.is_empty();
    let total = data.len() as u32;
    let mut offset = 0u32;
    let mut data_sn = 0u32;
    let mut in_burst = 0u32;
    while offset < total {
        let len = seg.min(total - offset).min(burst - in_burst);
        let last = offset + len == total;
        in_burst += len;
        let end_of_burst = in_burst == burst;
        if end_of_burst {
            in_burst = 0;
        }
        let status_here = last && collapse;
        let h = DataIn {
            final_: last || end_of_burst,
            acknowledge: false,
            overflow: status_here && res.overflow > 0,
            underflow: status_here && res.underflow > 0,
            status_present: status_here,
            status: if status_here { resp.status.0 } else { 0 },
            lun,
            itt,
            ttt: RESERVED_TAG,
            data_sn,
            buffer_offset: offset,
            residual_count: if status_here {
                res.overflow.max(res.underflow)
            } else {
                0
            },
            ..DataIn::default()
        };
        let _ = out
            .send(Out::Pdu(Pdu::new(
                h,
                data.slice(offset as usize..(offset + len) as usize),
            )))
            .await;
        offset += len;
        data_sn = data_sn.wrapping_add(1);
    }
    if collapse {
        return;
    }
    let body = match &resp.sense {
        Some(s) => {
            let sense = s.to_fixed();
            let mut b = BytesMut::with_capacity(sense.len() + 2);
            b.extend_from_slice(&(sense.len() as u16).to_be_bytes());
            b.extend_from_slice(&sense);
            b.freeze()
        }
        None => Bytes::new(),
    };
    let h = iscsi_wire::header::ScsiResponse {
        overflow: res.overflow > 0,
        underflow: res.underflow > 0,
        response: 0,
        status: resp.status.0,
        itt,
        exp_data_sn: data_sn,
        residual_count: res.overflow.max(res.underflow),
        ..iscsi_wire::header::ScsiResponse::default()
    };
    let _ = out.send(Out::Pdu(Pdu::new(h, body))).await;
}
