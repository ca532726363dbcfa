//! One iSCSI connection (RFC 7143): the login phase, then full feature phase.
//!
//! After login the protocol lives in the sans-IO engine, `iscsi_proto::engine::target`; this
//! file is its tokio driver. One framed read (`Reader::next`) feeds `handle_pdu`; one writer
//! task (`writer_task`) drains `poll_transmit`, whose PDUs carry StatSN, ExpCmdSN and MaxCmdSN
//! stamped as they leave, so status numbers are handed out in the order the initiator sees
//! them (RFC 7143 §4.2.2.2). Commands the engine hands out run concurrently (`execute`, the
//! one place a command reaches the logical unit) and complete in any order.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipsan_scsi::cdb::{self, op};
use ipsan_scsi::{
    decode_lun, no_such_lun, report_luns, DataDirection, LogicalUnit, NexusId, OwnedRequest,
    ResetKind, ScsiRequest, ScsiResponse, ScsiStatus, Sense, SenseKey,
};
use iscsi_proto::engine::target as engine;
use iscsi_proto::login::{Outcome, TargetLogin, TargetOffer};
use iscsi_proto::params::{SessionParams, NOT_UNDERSTOOD, REJECT};
use iscsi_wire::header::{TmfFunction, TmfResponse};
use iscsi_wire::{Codec, Header, Pdu, WireError};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, trace, warn};

use crate::lock;
use crate::registry::{LoginDirectory, Registry, Target, PORTAL_GROUP_TAG};
use crate::remote::{ForwardError, RemoteNexus, RemoteSpec};
use crate::seal_ext::{GuessSlot, SealExtension, SealSlot, TranscriptSlot};
use ipsan_seal::{
    CryptoPool, Direction, Forgery, ReadError, RecordOpener, RecordSealer, SealSession,
};

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
    let (result, session_slot, remote) = tokio::select! {
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
    let auth = session_slot
        .as_ref()
        .map(|s| s.auth().clone())
        .unwrap_or_default();
    let registered = shared.registry.register(
        crate::registry::SessionInfo::new(
            &params,
            result.isid,
            result.tsih,
            peer,
            local,
            seal.clone(),
        )
        .with_auth(auth),
    );
    // Registered (or refused): the session counts itself now.
    drop(session_slot);
    let crate::registry::Registration {
        cancel: session_cancel,
        stats,
        drained,
        reinstates,
    } = match registered {
        Ok(r) => r,
        Err(e) => {
            // A more strongly authenticated session with this key registered while this
            // login was being answered: it stays, this connection goes.
            warn!(%peer, "login refused after its answer: {e}; closing");
            if let Some(r) = &remote {
                r.close().await;
            }
            return;
        }
    };

    conn.codec = Codec {
        header_digest: params.header_digest,
        data_digest: params.data_digest,
        max_recv_data_segment_length: shared.offer.max_recv_data_segment_length,
    };
    // Seal record protection (docs/seal.md §4a): keys bound to the whole login transcript.
    // The record step sits between the codec and the engine: the writer protects what
    // `poll_transmit` hands out, `Reader::next` verifies before `handle_pdu` sees anything.
    // The Seal session is the one taken out of its slot for `register` above.
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
                drained.cancel();
                shared.registry.unregister(
                    &params.initiator_name,
                    result.isid,
                    params.target_name.as_deref(),
                    result.tsih,
                );
                return;
            }
        }
    }
    let mut cfg = engine::Config::new(params.clone(), result.cmd_sn, result.next_stat_sn);
    cfg.cmd_window = shared.offer.cmd_window;
    cfg.nop_interval = shared.nop_interval;
    cfg.drain_timeout = DRAIN_TIMEOUT;
    cfg.max_command_bytes = MAX_COMMAND_BYTES;
    let session = Arc::new(Session {
        shared: shared.clone(),
        engine: Mutex::new(engine::Connection::new(cfg, Instant::now())),
        wake_writer: Notify::new(),
        wake_reader: Notify::new(),
        written: Notify::new(),
        params,
        stats,
        nexus,
        local,
        seal,
        rekey_asked: AtomicBool::new(false),
        running: AtomicUsize::new(0),
        idle: Notify::new(),
        remote,
        forwarded: Mutex::new(HashMap::new()),
    });
    if let Some(old) = reinstates {
        // Session reinstatement (RFC 7143 §6.3.5): the old session's tasks end before this
        // one's commands execute, so an old WRITE still running cannot land after the
        // initiator's reissued copy (or a newer write). Nothing is read until then.
        tokio::select! {
            () = old.cancelled() => {}
            () = shutdown.cancelled() => {}
            () = session_cancel.cancelled() => {}
        }
        debug!(%peer, "reinstated session's commands are done; serving");
    }
    let writer = tokio::spawn(writer_task(wr, conn.codec.clone(), session.clone(), sealer));
    let end = session.run(&mut conn, &shutdown, &session_cancel).await;
    debug!(%peer, "session ending: {end}");
    if let Some(t) = session.target() {
        // The I_T nexus is gone: release what it held (RESERVE, PREVENT; SAM-5 §5.9).
        for lu in t.luns.values() {
            lu.nexus_lost(&session.nexus);
        }
    }
    // A reinstating session waits for this (RFC 7143 §6.3.5); `run` waited DRAIN_TIMEOUT
    // already, so only a hung backend gets here with commands running. Signalled before the
    // writer is joined: a writer stuck on a black-holed socket must not hold up the new
    // session.
    if tokio::time::timeout(2 * DRAIN_TIMEOUT, session.idle())
        .await
        .is_err()
    {
        warn!(%peer, "commands still running {:?} after the session ended; releasing it anyway", 2 * DRAIN_TIMEOUT);
    }
    drained.cancel();
    session.wake_writer.notify_one();
    let _ = writer.await;
    if let Some(r) = &session.remote {
        // The host's I_T nexus is gone: so is its nexus on the remote targets.
        r.close().await;
    }
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
    /// The next PDU, `Ok(None)` on a clean close. A plain connection's codec errors come back
    /// as `Ok(Some(Err(_)))` for the engine to answer (RFC 7143 §7.8, §11.17). In a sealed
    /// session nothing of a PDU beyond its lengths is read before its record tag verifies
    /// ([`ipsan_seal::read_pdu`]), and every failure (tag, digest, opcode, field, length) is
    /// an error of kind `InvalidData` wrapping a [`Forgery`]: nothing of it reaches the
    /// engine, nothing is answered, and the connection must be dropped.
    async fn next(&mut self) -> std::io::Result<Option<Result<Pdu, WireError>>> {
        loop {
            // ---- SEAL RECORD HOOK (framed read): verify, then decode ----
            match ipsan_seal::read_pdu(&self.codec, self.record.as_mut(), &mut self.buf) {
                Ok(Some(pdu)) => return Ok(Some(Ok(pdu))),
                Ok(None) => {}
                Err(ReadError::Wire(e)) => return Ok(Some(Err(e))),
                Err(ReadError::Sealed(f)) => {
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, f))
                }
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
    Option<Arc<RemoteNexus>>,
);

/// A normal session's remote sessions (a gateway's target, remote.rs): logged in, as the
/// host, to every remote target the session's target reaches, before the host's login is
/// answered. `Err` says why one could not be reached; the host's login is then refused.
async fn open_remotes(
    shared: &Shared,
    result: &iscsi_proto::login::LoginResult,
) -> Result<Option<Arc<RemoteNexus>>, String> {
    let Some(target) = result
        .params
        .target_name
        .as_deref()
        .and_then(|n| shared.registry.target(n))
    else {
        return Ok(None);
    };
    let nexus = Arc::new(RemoteNexus::new(
        &result.params.initiator_name,
        result.isid,
        shared.pool.clone(),
    ));
    for spec in target.remote_targets() {
        // Within the host's login timeout, so the host hears why.
        let limit = shared.login_timeout / 2;
        let why = match tokio::time::timeout(limit, nexus.open(&spec)).await {
            Ok(Ok(())) => continue,
            Ok(Err(e)) => e.to_string(),
            Err(_) => format!("no answer within {limit:?}"),
        };
        nexus.close().await;
        return Err(format!("remote target {}: {why}", spec.target_key()));
    }
    Ok(Some(nexus))
}

/// One step of relayed CHAP: the remote target's challenge for the host's CHAP_A offer
/// (starting the remote login as the host), or its verdict on the host's answer.
async fn relay_chap(
    shared: &Shared,
    relay: &mut Option<crate::remote::HostRelay>,
    (initiator, target, isid): (String, Option<String>, [u8; 6]),
    request: iscsi_proto::login::RelayRequest,
) -> iscsi_proto::login::RelayAnswer {
    use iscsi_proto::login::{LoginFailure, LoginStatus, RelayAnswer, RelayRequest};
    match request {
        RelayRequest::Challenge { algorithms } => {
            let spec = target
                .and_then(|t| shared.registry.target(&t))
                .and_then(|t| t.remote_targets().into_iter().next());
            let Some(spec) = spec else {
                return RelayAnswer::Refused(LoginFailure::new(
                    LoginStatus::TARGET_ERROR,
                    "relayed CHAP: the target reaches no remote target",
                ));
            };
            let (r, answer) = crate::remote::HostRelay::start(
                spec,
                (&initiator, isid),
                shared.pool.clone(),
                algorithms,
                shared.login_timeout / 2,
            )
            .await;
            *relay = Some(r);
            answer
        }
        RelayRequest::Response {
            name,
            response,
            mutual,
        } => match relay.as_mut() {
            Some(r) => r.respond(name, response, mutual).await,
            None => RelayAnswer::Refused(LoginFailure::new(
                LoginStatus::TARGET_ERROR,
                "relayed CHAP: a response before a challenge",
            )),
        },
    }
}

/// Runs the login; `Ok(None)` when it failed or the peer went away (already answered).
async fn login_phase(
    conn: &mut Reader,
    wr: &mut OwnedWriteHalf,
    shared: &Shared,
    slot: &SealSlot,
    transcript: &TranscriptSlot,
    guess: &GuessSlot,
    peer: SocketAddr,
) -> std::io::Result<Option<LoggedIn>> {
    let secret_used = crate::seal_ext::SecretUsedSlot::default();
    let ext = SealExtension::new(shared.registry.clone(), slot.clone(), transcript.clone())
        .recording_secret(secret_used.clone())
        .with_guess_limit(peer.ip(), guess.clone());
    let mut login = TargetLogin::new(shared.offer.clone(), Some(Box::new(ext)));
    let codec = Codec::default();
    let mut dir = LoginDirectory::new(shared.registry.clone(), peer.ip());
    let mut relay: Option<crate::remote::HostRelay> = None;
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
        let mut reply = login.handle(req, &pdu.data, &mut dir);
        if let Outcome::Relay(request) = reply.outcome {
            // CHAP relayed to the remote target (a gateway, remote.rs HostRelay).
            let (ini, tgt) = login.declared();
            let who = (ini.to_owned(), tgt.map(str::to_owned), req.isid);
            let answer = relay_chap(shared, &mut relay, who, request).await;
            reply = login.relay_answer(answer, &mut dir);
        }
        let mut remote = None;
        let mut session_slot = None;
        if let Outcome::FullFeature(result) = &reply.outcome {
            // What this login proved, now that it proved everything it will: a session it
            // would replace must not have proved more, and the session quota counts by
            // strength (Registry::admit). Before the remote sessions: a refused login must
            // not reinstate the host's sessions on the remote targets either.
            let auth = crate::registry::Authentication {
                chap_user: dir.chap_user(),
                seal: if lock(slot).is_some() {
                    *lock(&secret_used)
                } else {
                    None
                },
            };
            let admitted = shared.registry.admit(
                &result.params.initiator_name,
                result.isid,
                result.params.target_name.as_deref(),
                &auth,
            );
            match admitted {
                Ok(s) => session_slot = Some(s),
                Err(f) => refuse(&mut reply, f),
            }
        }
        if let (Outcome::FullFeature(result), Some(_)) = (&reply.outcome, &session_slot) {
            let opened = match relay.take() {
                Some(r) => r.finish().await.map(Some),
                None => open_remotes(shared, result).await,
            };
            match opened {
                Ok(r) => remote = r,
                Err(why) => {
                    // RFC 7143 §11.13.5: 0x0301 "service unavailable", a target error the
                    // initiator retries later (as after a path failure).
                    warn!(%peer, initiator = %result.params.initiator_name, "{why}; refusing the login");
                    refuse(
                        &mut reply,
                        iscsi_proto::login::LoginFailure::new(
                            iscsi_proto::login::LoginStatus::SERVICE_UNAVAILABLE,
                            why,
                        ),
                    );
                }
            }
        }
        if let Outcome::Failed(f) = &reply.outcome {
            shared.registry.count_login(&dir, Some(f.status.0));
            let seal_guess = lock(guess).take().is_some();
            auth_failure_backoff(shared, &dir, peer, f, seal_guess).await;
        }
        let mut out = BytesMut::new();
        let resp = Pdu::new(reply.header, Bytes::from(reply.data));
        if codec.encode(&resp, &mut out).is_err() {
            return Ok(None);
        }
        lock(transcript).add_sent(Direction::TargetToInitiator, &resp);
        wr.write_all(&out).await?;
        match reply.outcome {
            Outcome::Continue | Outcome::Relay(_) => {}
            Outcome::Failed(f) => {
                warn!(%peer, initiator = dir.initiator().as_deref().unwrap_or("(not declared)"), initiator_isid = %hex::encode(req.isid), status = format!("{:#06x}", f.status.0), "login refused: {}", f.reason);
                let _ = wr.shutdown().await;
                return Ok(None);
            }
            Outcome::FullFeature(result) => {
                shared.registry.count_login(&dir, None);
                // CHAP passed, or the Seal secret proven (its confirmation verified).
                if dir.chap_required() || lock(slot).is_some() {
                    shared
                        .registry
                        .auth_success(&result.params.initiator_name, peer.ip());
                }
                return Ok(Some((*result, session_slot, remote)));
            }
        }
    }
}

/// Turns the final (successful) Login Response of `reply` into a refusal with `f`'s status.
fn refuse(reply: &mut iscsi_proto::login::Reply, f: iscsi_proto::login::LoginFailure) {
    reply.header.transit = false;
    reply.header.nsg = iscsi_wire::header::Stage(0);
    reply.header.tsih = 0;
    reply.header.status_class = f.status.class();
    reply.header.status_detail = f.status.detail();
    reply.data.clear();
    reply.outcome = Outcome::Failed(f);
}

/// Counts an authentication failure (0x0201, or any refusal after the target answered a Seal
/// offer without the initiator proving the secret: a failed guess of the PSK) against the
/// initiator and its address, logs it (who, from where, how many, the lockout; never the
/// secret or the response) and holds the failing response back by the backoff's delay
/// (crates/ipsan-target/src/limits.rs).
async fn auth_failure_backoff(
    shared: &Shared,
    dir: &LoginDirectory,
    peer: SocketAddr,
    f: &iscsi_proto::login::LoginFailure,
    seal_guess: bool,
) {
    if f.status != iscsi_proto::login::LoginStatus::AUTHENTICATION_FAILURE && !seal_guess {
        return;
    }
    let Some(initiator) = dir.initiator() else {
        return;
    };
    let what = if seal_guess {
        "authentication failed (a Seal guess: the secret was never proven)"
    } else {
        "authentication failed"
    };
    let v = count_auth_failure(shared, &initiator, peer, what);
    // Never hold the answer past the login timeout (it would be dropped unanswered).
    tokio::time::sleep(v.delay.min(shared.login_timeout / 2)).await;
}

/// A login that ended (peer gone, timeout, malformed PDU) after the target answered a Seal
/// offer and before the initiator proved the secret: a prober took the answer, which tells it
/// whether its one guess was right (docs/seal.md §2). Counted like a refused guess.
fn abandoned_seal_guess(shared: &Shared, peer: SocketAddr, guess: &GuessSlot) {
    let Some(initiator) = lock(guess).take() else {
        return;
    };
    count_auth_failure(
        shared,
        &initiator,
        peer,
        "seal: login abandoned after the target's answer, secret never proven; counted as an authentication failure",
    );
}

/// Counts one failed authentication of `initiator` from `peer` (limits.rs) and logs it with
/// `what`: who, from where, how many, the lockout; never the secret or the response.
fn count_auth_failure(
    shared: &Shared,
    initiator: &str,
    peer: SocketAddr,
    what: &str,
) -> crate::limits::FailureVerdict {
    let v = shared.registry.auth_failure(initiator, peer.ip());
    warn!(
        %peer,
        initiator = %initiator,
        failures_name_here = v.failures_name_here,
        failures_address = v.failures_address,
        failures_name = v.failures_name,
        lockout_ms = v.lockout.map_or(0, |d| d.as_millis()),
        delay_ms = v.delay.as_millis(),
        "{what}{}",
        if v.lockout.is_some() { "; locked out" } else { "" }
    );
    v
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

/// Seconds an initiator has to log out after AsyncEvent 1 (RFC 7143 §11.9.1 Parameter3).
const LOGOUT_WAIT_SECS: u16 = 10;

/// Bytes the engine may queue for sending before the reader stops taking new PDUs: a peer
/// that sends without reading its answers gets TCP backpressure instead of our memory.
const MAX_QUEUED_BYTES: usize = 16 << 20;

/// Commands moving at most this many bytes are first run on the reader's own task (see
/// `Session::events`); larger ones always get a task, so their copies run beside the reader.
const INLINE_MAX: u32 = 64 << 10;

/// The one framed write of this connection: drains the engine's PDUs (sequence numbers are
/// stamped as they leave the engine) into the socket, many PDUs per syscall, until the
/// connection is over and everything queued has left. In a sealed session every PDU is
/// record-protected here, after the engine stamped it, in wire order (docs/seal.md §4a).
async fn writer_task(
    wr: OwnedWriteHalf,
    codec: Codec,
    session: Arc<Session>,
    mut sealer: Option<RecordSealer>,
) {
    let mut wr = wr;
    // A READ's Data-In goes to the socket as it is, by vectored write (`Segments`).
    let mut out = ipsan_tcp::vectored::Segments::default();
    let mut batch: Vec<Pdu> = Vec::with_capacity(64);
    loop {
        let notified = session.wake_writer.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let closed = {
            let mut e = lock(&session.engine);
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
            notified.await;
            continue;
        }
        let mut failed = false;
        for mut pdu in batch.drain(..) {
            if matches!(pdu.header, Header::R2t(_)) {
                session.stats.r2ts(1);
            }
            trace!(opcode = ?pdu.header.opcode(), itt = format!("{:#x}", pdu.header.itt()), len = pdu.data.len(), "send");
            // ---- SEAL RECORD HOOK (framed write): after stamping, in wire order ----
            if let Some(s) = &mut sealer {
                if let Err(e) = s.protect(&mut pdu) {
                    warn!("seal: cannot protect a PDU: {e}; closing the connection");
                    failed = true;
                    break;
                }
            }
            let Ok(trailer) = codec.encode_head(&pdu, out.head()) else {
                warn!("cannot encode {:?}", pdu.header.opcode());
                if sealer.is_some() {
                    // Its record counter is spent: the next PDU could not verify.
                    failed = true;
                    break;
                }
                continue;
            };
            out.push_data(pdu.data, trailer.as_bytes());
        }
        // What was encoded before a failure still goes out (a status, say).
        if let Err(e) = out.write_to(&mut wr).await {
            debug!("write failed: {e}");
            writer_failed(&session);
            return;
        }
        if failed {
            writer_failed(&session);
            return;
        }
        session.written.notify_waiters();
    }
    let _ = wr.shutdown().await;
}

/// The socket cannot take more: the connection is over, and a reader waiting for the queue
/// to drain must not wait for a writer that is gone.
fn writer_failed(session: &Session) {
    lock(&session.engine).peer_closed();
    session.wake_reader.notify_one();
    session.written.notify_waiters();
}

/// Who runs a command.
#[derive(Clone, Debug)]
enum Exec {
    /// The LU, and whether its backend works at memory speed (`mem`, `null`): small reads
    /// and writes then run inline instead of hopping to the blocking pool, which is most of a
    /// depth-1 command's latency on loopback.
    Lu(Arc<LogicalUnit>, bool),
    /// A remote iSCSI LUN (remote.rs): the command is forwarded with its CDB and data, and
    /// the remote status, sense, data and residual come back unchanged. The remote LUN number.
    Remote(Arc<RemoteSpec>, u64),
    NoLun,
}

/// The largest READ/WRITE run inline on a memory-speed backend.
const INLINE_MAX_BYTES: u64 = 1 << 20;

/// Whether `cdb` is a READ/WRITE small enough to run on the network task for `exec`.
fn runs_inline(exec: &Exec, cdb: &[u8]) -> bool {
    let Exec::Lu(lu, true) = exec else {
        return false;
    };
    let rw = cdb::family(cdb).is_read_or_write();
    let (_, blocks) = cdb::extent(cdb);
    rw && u64::from(blocks) * u64::from(lu.block_size()) <= INLINE_MAX_BYTES
}

/// Whether `cdb` goes through the LU's submit/complete path (`LogicalUnit::runs_async`).
fn runs_async(exec: &Exec, cdb: &[u8]) -> bool {
    matches!(exec, Exec::Lu(lu, _) if lu.runs_async(cdb))
}

/// What the engine asks about LUNs while a command arrives: which exist, and how many data-out
/// bytes a CDB needs (in a Seal session, the sealed size).
struct Luns<'a> {
    target: Option<&'a Target>,
    seal: Option<&'a SealSession>,
}

impl Luns<'_> {
    fn lu(&self, raw: u64) -> Option<&Arc<LogicalUnit>> {
        self.target
            .and_then(|t| t.luns.get(&decode_lun(raw.to_be_bytes())))
    }
}

fn engine_response(r: ScsiResponse) -> engine::Response {
    engine::Response {
        status: r.status.0,
        sense: r.sense.map(|s| Bytes::from(s.to_fixed())),
        data_in: r.data_in,
    }
}

impl engine::LunDirectory for Luns<'_> {
    fn exists(&self, lun: u64) -> bool {
        self.lu(lun).is_some() || self.passthrough(lun)
    }

    fn passthrough(&self, lun: u64) -> bool {
        self.target
            .is_some_and(|t| t.remote_route(decode_lun(lun.to_be_bytes())).is_some())
    }

    fn size(&self, lun: u64, cdb: &[u8], edtl: u32) -> engine::Sizing {
        let mut early = None;
        let need = match self.lu(lun) {
            Some(lu) => match lu.command_info(cdb) {
                Ok(info) if info.direction == DataDirection::Write => info.data_out_len,
                Ok(_) => 0,
                Err(sense) => {
                    early = Some(engine_response(ScsiResponse::check(sense)));
                    0
                }
            },
            None => 0,
        };
        // In a Seal session data travels sealed: EDTL and every offset count sealed bytes, and
        // a length that is not exactly the sealed size of what the CDB needs is refused
        // (sealed data cannot be truncated).
        let need = match (self.seal, need) {
            (Some(seal), n) if n > 0 && early.is_none() => {
                match seal.sealed_len(usize::try_from(n).unwrap_or(usize::MAX)) {
                    Some(sealed) if sealed as u64 == u64::from(edtl) => sealed as u64,
                    _ => {
                        early = Some(engine_response(ScsiResponse::check(Sense::new(
                            SenseKey::ILLEGAL_REQUEST,
                            0x0e,
                            0x03,
                        ))));
                        u64::from(edtl)
                    }
                }
            }
            (_, n) => n,
        };
        engine::Sizing { need, early }
    }
}

/// One session's connection: the engine and what the driver adds around it.
struct Session {
    shared: Arc<Shared>,
    engine: Mutex<engine::Connection>,
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
    /// Commands forwarded to a remote LUN and not completed, by ITT: cancelling one forwards
    /// the host's ABORT TASK to the remote session. Locked after `engine`, never before.
    forwarded: Mutex<HashMap<u32, CancellationToken>>,
}

impl Session {
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
        conn: &mut Reader,
        shutdown: &CancellationToken,
        session_cancel: &CancellationToken,
    ) -> String {
        let end = loop {
            if let Some(why) = self.events() {
                break why;
            }
            // Backpressure: a peer that does not read its answers stops being read.
            loop {
                let written = self.written.notified();
                tokio::pin!(written);
                written.as_mut().enable();
                {
                    let e = lock(&self.engine);
                    if e.queued_bytes() <= MAX_QUEUED_BYTES || e.closed().is_some() {
                        break;
                    }
                }
                written.await;
            }
            let deadline = lock(&self.engine).poll_timeout();
            let next = tokio::select! {
                r = conn.next() => r,
                () = shutdown.cancelled() => {
                    lock(&self.engine).close_locally();
                    self.wake_writer.notify_one();
                    break "target shutting down".to_owned();
                }
                () = session_cancel.cancelled() => {
                    lock(&self.engine).close_locally();
                    self.wake_writer.notify_one();
                    break "session reinstated or cancelled".to_owned();
                }
                () = self.wake_reader.notified() => continue,
                () = self.stats.logout.notified() => {
                    // `ipsan ctl logout-all`: ask politely (RFC 7143 §11.9.1, AsyncEvent 1).
                    lock(&self.engine).request_logout(LOGOUT_WAIT_SECS);
                    self.wake_writer.notify_one();
                    continue;
                }
                () = async { match deadline { Some(d) => tokio::time::sleep_until(d.into()).await, None => std::future::pending().await } } => {
                    lock(&self.engine).handle_timeout(Instant::now());
                    self.wake_writer.notify_one();
                    continue;
                }
            };
            let now = Instant::now();
            let target = self.target();
            let luns = Luns {
                target: target.as_deref(),
                seal: self.seal.as_deref(),
            };
            if let Some(f) = next
                .as_ref()
                .err()
                .and_then(|e| e.get_ref())
                .and_then(|x| x.downcast_ref::<Forgery>())
            {
                // Nothing of a forged PDU reaches the engine: the connection is dropped.
                crate::limits::LimitStats::bump(&self.shared.registry.stats.forged_pdus);
                warn!(
                    initiator = %self.params.initiator_name,
                    "{f}; nothing of it acts, dropping the connection"
                );
                lock(&self.engine).close_locally();
                self.wake_writer.notify_one();
                break format!("forged PDU: {f}");
            }
            {
                let mut e = lock(&self.engine);
                match next {
                    Err(_) | Ok(None) => e.peer_closed(),
                    Ok(Some(Ok(pdu))) => {
                        trace!(opcode = ?pdu.header.opcode(), itt = format!("{:#x}", pdu.header.itt()), len = pdu.data.len(), "recv");
                        e.handle_pdu(now, &luns, pdu);
                    }
                    Ok(Some(Err(err))) => {
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
        // Commands still running finish (bounded) before the nexus is released.
        if tokio::time::timeout(DRAIN_TIMEOUT, self.idle())
            .await
            .is_err()
        {
            warn!("commands still running after {DRAIN_TIMEOUT:?}; closing anyway");
        }
        end
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
            let ev = lock(&self.engine).poll_event()?;
            match ev {
                engine::Event::Execute(x) => {
                    let s = self.clone();
                    // Counted rather than joined: a join set would wake this loop once per
                    // command, a full loop iteration (locks, a timer) on the small-read path.
                    self.running.fetch_add(1, Ordering::AcqRel);
                    let small = x.edtl <= INLINE_MAX
                        && x.data_out.len() <= INLINE_MAX as usize
                        // Sealed: only if the crypto pool opens and seals it on this thread;
                        // otherwise it would wait for a worker.
                        && self.seal.as_ref().is_none_or(|s| {
                            s.crypto_inline_sealed(x.edtl as usize)
                                && s.crypto_inline_sealed(x.data_out.len())
                        });
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
                engine::Event::Text { itt, lun, keys } => {
                    let answer = self.text_answer(&keys);
                    lock(&self.engine).text_response(itt, lun, &answer);
                    self.wake_writer.notify_one();
                }
                engine::Event::Closed(e) => {
                    self.wake_writer.notify_one();
                    return Some(e.to_string());
                }
            }
        }
    }

    /// The host aborted these forwarded commands (ABORT TASK, ABORT TASK SET, CLEAR TASK
    /// SET): each is aborted on the remote session too (RFC 7143 §11.5.1), so the host's TMF
    /// response, held by the engine until the command ends, does not wait for the remote
    /// command to run to its end. Their statuses never reach the host (the engine suppresses
    /// them).
    fn abort_forwarded(&self, itts: &[u32]) {
        let e = lock(&self.engine);
        let mut f = lock(&self.forwarded);
        for &itt in itts {
            // Not registered yet (its task has not reached `forward`): registered cancelled,
            // so it is never sent. Completed already: nothing to abort.
            if e.is_running(itt) {
                f.entry(itt).or_default().cancel();
            }
        }
    }

    /// A task management function reaching the logical units (SAM-5 §7). `answer`: the TMF
    /// whose response waits for the outcome of a forwarded LOGICAL UNIT RESET.
    fn reset(self: &Arc<Self>, function: TmfFunction, raw_lun: u64, answer: Option<u32>) {
        let lun = decode_lun(raw_lun.to_be_bytes());
        info!(function = function.0, lun, "task management reset");
        let Some(t) = self.target() else {
            if let Some(itt) = answer {
                self.reset_done(itt, TmfResponse::LUN_DOES_NOT_EXIST);
            }
            return;
        };
        let kind = match function {
            TmfFunction::LOGICAL_UNIT_RESET => {
                if let Some(lu) = t.luns.get(&lun) {
                    lu.reset(ResetKind::LogicalUnit, &self.nexus);
                    if let Some(itt) = answer {
                        self.reset_done(itt, TmfResponse::FUNCTION_COMPLETE);
                    }
                } else if let (Some((spec, remote_lun)), Some(nexus)) =
                    (t.remote_route(lun), self.remote.clone())
                {
                    // Forwarded: the remote LU resets, its tasks for this host end (their
                    // answers here are suppressed by the engine) and other hosts get their
                    // unit attention from the remote target. The host's response says how
                    // the remote reset went (RFC 7143 §11.6.1).
                    let s = self.clone();
                    tokio::spawn(async move {
                        let r = nexus.lun_reset(&spec, remote_lun).await;
                        if let Some(itt) = answer {
                            s.reset_done(itt, r);
                        }
                    });
                } else if let Some(itt) = answer {
                    self.reset_done(itt, TmfResponse::LUN_DOES_NOT_EXIST);
                }
                return;
            }
            TmfFunction::TARGET_COLD_RESET => ResetKind::TargetCold,
            _ => ResetKind::TargetWarm,
        };
        for lu in t.luns.values() {
            lu.reset(kind, &self.nexus);
        }
        if let Some(nexus) = self.remote.clone() {
            // ipsan's initiator sends no target reset: each remote LU is reset instead, what
            // a target reset does to every LU (SAM-5 §7.8).
            let remotes: Vec<Arc<RemoteSpec>> = t.remotes.values().cloned().collect();
            if !remotes.is_empty() {
                tokio::spawn(async move {
                    for spec in remotes {
                        nexus.lun_reset(&spec, spec.remote_lun()).await;
                    }
                });
            }
        }
    }

    /// Hands the outcome of a forwarded LOGICAL UNIT RESET to the engine, which answers the
    /// host once the reset's aborted tasks have ended too.
    fn reset_done(&self, itt: u32, response: TmfResponse) {
        lock(&self.engine).reset_done(itt, response);
        self.wake_writer.notify_one();
    }

    fn text_answer(&self, keys: &[(String, String)]) -> Vec<(String, String)> {
        let mut answer: Vec<(String, String)> = Vec::new();
        for (k, v) in keys {
            match k.as_str() {
                "SendTargets" => self.send_targets(v, &mut answer),
                // Declarative, applied by the engine (RFC 7143 §13.12).
                "MaxRecvDataSegmentLength" => {}
                _ if iscsi_proto::params::spec(k).is_some() => {
                    answer.push((k.clone(), REJECT.into()))
                }
                _ => answer.push((k.clone(), NOT_UNDERSTOOD.into())),
            }
        }
        answer
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

    /// Whether LUN `lun`'s backend works at memory speed.
    fn fast_backend(t: &Target, lun: u64) -> bool {
        t.backends
            .iter()
            .any(|(id, b)| *id == lun && b.engine() == ipsan_scsi::Engine::Inline)
    }

    /// The answer to a block write whose EDTL covers no whole block: nothing to write, but
    /// unit attentions, CDB checks and reservations still apply (SPC-4 §5.13), so an
    /// initiator without access gets its RESERVATION CONFLICT rather than GOOD.
    fn without_blocks(&self, exec: &Exec, cdb: &[u8]) -> ScsiResponse {
        match exec {
            Exec::Lu(lu, _) => lu
                .precheck(&self.nexus, cdb)
                .unwrap_or_else(|| ScsiResponse::good(Bytes::new())),
            Exec::Remote(..) => ScsiResponse::good(Bytes::new()),
            Exec::NoLun => no_such_lun(cdb),
        }
    }

    /// Runs one command whose data phase is over and hands its answer to the engine: the one
    /// place a command reaches the logical unit. Seal opens data-out before the backend sees
    /// it and seals data-in after.
    async fn execute(self: Arc<Self>, x: engine::Execute) {
        let itt = x.itt;
        let lun = decode_lun(x.lun.to_be_bytes());
        let target = self.target();
        let timer = self.stats.start(lun);
        let exec = match target.as_ref().and_then(|t| t.luns.get(&lun)) {
            // One registry lookup per command (`target`), not one per question.
            Some(lu) => Exec::Lu(
                lu.clone(),
                target
                    .as_deref()
                    .is_some_and(|t| Self::fast_backend(t, lun)),
            ),
            // REPORT LUNS goes to the remote target only when this target mirrors it;
            // otherwise it lists this target's LUNs, local and remote (SPC-4 §6.33).
            None => match target.as_ref().and_then(|t| {
                t.remote_route(lun).filter(|_| {
                    x.cdb.first() != Some(&op::REPORT_LUNS) || t.mirrored_remote().is_some()
                })
            }) {
                Some((spec, remote_lun)) => Exec::Remote(spec, remote_lun),
                None => Exec::NoLun,
            },
        };
        let remote_exec = matches!(exec, Exec::Remote(..));
        // A remote LUN's residual is the remote target's (None: computed by the engine).
        let mut residual: Option<i64> = None;
        // The remote session is gone: this host's session ends after this answer.
        let mut remote_lost = false;
        let mut cdb = x.cdb;
        let mut data_out = x.data_out;
        let mut pre: Option<ScsiResponse> = None;
        let mut early = x.early;
        if early.is_none() && x.write_without_w {
            // A data-out command sent without the W bit: EDTL 0, all of it overflows.
            pre = Some(match overflow_write(&exec, &mut cdb, 0) {
                Some(_) => self.without_blocks(&exec, &cdb),
                None => ScsiResponse::check(Sense::new(SenseKey::ILLEGAL_REQUEST, 0x0e, 0x03)),
            });
        } else if early.is_none() && x.need > 0 && u64::from(x.edtl) < x.need {
            // iSCSI overflow on a write: EDTL shorter than the CDB's transfer.
            match overflow_write(&exec, &mut cdb, x.edtl) {
                // FCP-4 option (a): transfer and write only the whole blocks EDTL covers.
                Some(Some(bytes)) => data_out.truncate(bytes),
                Some(None) => pre = Some(self.without_blocks(&exec, &cdb)),
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
        let seal = self.seal.clone().map(|s| {
            (
                s,
                self.shared.pool.clone(),
                ipsan_seal::Binding::of_command(
                    x.lun,
                    itt,
                    cdb.first().copied().unwrap_or(0),
                    cdb::extent(&cdb),
                ),
            )
        });
        // A Seal counter at its hard limit: this command fails, then the connection closes.
        let mut seal_exhausted = false;
        if let (Some((session, pool, binding)), None, None, false) =
            (&seal, &early, &pre, data_out.is_empty())
        {
            // Verify and decrypt before anything reaches the backend (docs/seal.md §5).
            // The write buffer is uniquely owned: open it in place, no copy.
            let buf = std::mem::take(&mut data_out)
                .try_into_mut()
                .unwrap_or_else(|shared| BytesMut::from(&shared[..]));
            match Box::pin(pool.open(session, *binding, buf)).await {
                Ok(plain) => data_out = plain,
                Err(e) => {
                    self.stats.seal_open_failed(&e);
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
        let mut resp = match (early.take(), pre) {
            (Some(r), _) => r,
            (None, Some(r)) => engine_response(r),
            (None, None) if matches!(exec, Exec::Remote(..)) => {
                // Boxed (as every rarely taken sub-future here): an inline future would make
                // every command's task as large as the largest path, copied at each spawn.
                let (r, res, lost) = Box::pin(self.forward(
                    itt,
                    &exec,
                    &cdb,
                    data_out,
                    (x.need, x.edtl, x.read, x.write),
                ))
                .await;
                residual = res;
                remote_lost = lost;
                r
            }
            // An async backend (RBD) completes data-path commands through callbacks: the task
            // awaits them and holds no thread (ipsan_scsi::aio).
            (None, None) if runs_async(&exec, &cdb) => match &exec {
                Exec::Lu(lu, _) => engine_response(
                    Box::pin(lu.execute_async(OwnedRequest {
                        cdb: cdb.clone(),
                        data_out,
                        nexus: self.nexus.clone(),
                        lun,
                        tag: u64::from(itt),
                    }))
                    .await,
                ),
                Exec::Remote(..) | Exec::NoLun => engine_response(no_such_lun(&cdb)),
            },
            (None, None) => {
                let cdb = cdb.clone();
                let nexus = self.nexus.clone();
                let inline = runs_inline(&exec, &cdb);
                // Room to seal a READ's buffer in place, in sealed sessions only.
                let tailroom = seal.is_some();
                let run = move || match exec {
                    // REPORT LUNS answers for the whole target, whichever LUN it addressed
                    // (SPC-4 §6.33).
                    _ if cdb.first() == Some(&op::REPORT_LUNS) => {
                        let luns: Vec<u64> = target
                            .map(|t| t.luns.keys().chain(t.remotes.keys()).copied().collect())
                            .unwrap_or_default();
                        report_luns(&luns, &cdb)
                    }
                    Exec::Lu(lu, _) => lu.execute(&ScsiRequest {
                        cdb: &cdb,
                        data_out: &data_out,
                        nexus: &nexus,
                        lun,
                        tailroom,
                    }),
                    Exec::Remote(..) | Exec::NoLun => no_such_lun(&cdb),
                };
                let r = if inline {
                    run()
                } else {
                    tokio::task::spawn_blocking(run).await.unwrap_or_else(|_| {
                        ScsiResponse::check(Sense::new(SenseKey::HARDWARE_ERROR, 0x44, 0x00))
                    })
                };
                engine_response(r)
            }
        };
        if let (Some((session, pool, binding)), false) = (&seal, resp.data_in.is_empty()) {
            // The device server leaves room past the data (`read_tailroom`): seal its
            // buffer in place, no copy. Otherwise (shared, or too little room) seal a copy,
            // encrypted out of place on the crypto workers into a reused buffer.
            let plain = std::mem::take(&mut resp.data_in);
            let room = session.sealed_len(plain.len()).unwrap_or(usize::MAX);
            let sealed = match plain.try_into_mut() {
                Ok(buf) if buf.capacity() >= room => {
                    Box::pin(pool.seal(session, *binding, buf)).await
                }
                Ok(buf) => Box::pin(pool.seal_copy(session, *binding, buf.freeze())).await,
                Err(shared) => Box::pin(pool.seal_copy(session, *binding, shared)).await,
            };
            match sealed {
                Ok(sealed) => resp.data_in = sealed,
                Err(e) => {
                    warn!(itt, "seal: cannot seal data-in: {e}");
                    resp = engine_response(seal_security_error());
                    seal_exhausted = e == ipsan_seal::SealError::CounterExhausted;
                }
            }
        }
        timer.done(
            &cdb,
            ScsiStatus(resp.status),
            resp.sense
                .as_ref()
                .and_then(|s| s.get(2))
                .map(|k| SenseKey(k & 0x0f)),
        );
        let closed = {
            let mut e = lock(&self.engine);
            e.complete_with_residual(itt, resp, residual);
            if remote_exec {
                // Under the engine lock: an abort sees the task running or the token gone.
                lock(&self.forwarded).remove(&itt);
            }
            if let Some((session, _, _)) = &seal {
                self.seal_counter_watch(&mut e, session, seal_exhausted);
            }
            if remote_lost {
                e.close_locally();
            }
            e.closed().is_some()
        };
        self.wake_writer.notify_one();
        if closed {
            // Closed here (Seal limits): the reader must see the event.
            self.wake_reader.notify_one();
        }
    }

    /// A command to a remote LUN (`Exec::Remote`): forwarded with its CDB and data-out
    /// (already opened if this session is sealed), answered with the remote target's status,
    /// sense, data and residual. Returns the answer, the residual to report, and whether the
    /// remote session is lost (the host's session then ends, so its initiator logs in again
    /// as after a path failure: RFC 7143 §6.3.5, open-iscsi's replacement_timeout).
    async fn forward(
        &self,
        itt: u32,
        exec: &Exec,
        cdb: &[u8],
        data_out: Bytes,
        (need, edtl, read, write): (u64, u32, bool, bool),
    ) -> (engine::Response, Option<i64>, bool) {
        let (Exec::Remote(spec, remote_lun), Some(nexus)) = (exec, &self.remote) else {
            return (engine_response(no_such_lun(cdb)), None, false);
        };
        // A READ sent with the W bit (libiscsi's Read*Invalid): ipsan's initiator carries
        // no bidirectional command, and Data-In for a write would end the remote connection;
        // forwarded as the read it is, its data-out dropped (a target reads no data for it).
        let (need, data_out, read, write) = if write && cdb::family(cdb) == cdb::Family::Read {
            (0, Bytes::new(), true, false)
        } else {
            (need, data_out, read, write)
        };
        // The host's EDTL counts sealed bytes in a sealed session: read the plaintext.
        let read_len = match (&self.seal, need) {
            (_, n) if n > 0 => 0,
            (Some(seal), _) => match seal.plain_len(edtl as usize) {
                Some(n) => n,
                None => {
                    let r = ScsiResponse::check(Sense::new(SenseKey::ILLEGAL_REQUEST, 0x0e, 0x03));
                    return (engine_response(r), None, false);
                }
            },
            (None, _) => edtl as usize,
        };
        // A host's ABORT TASK may have come before this (registered cancelled).
        let abort = lock(&self.forwarded).entry(itt).or_default().clone();
        match nexus
            .forward(
                (spec, *remote_lun),
                cdb,
                data_out,
                read_len,
                (read, write),
                &abort,
            )
            .await
        {
            Ok(p) => {
                // A write's residual and a read's overflow are the remote target's. A read's
                // underflow the engine measures from the Data-In it sends: in a sealed
                // session (here or on the remote leg) the remote's count is in other units.
                let residual = (need > 0 || p.residual < 0).then_some(p.residual);
                let r = engine::Response {
                    status: p.status,
                    sense: p.sense,
                    data_in: p.data.freeze(),
                };
                (r, residual, false)
            }
            Err(e) => {
                let lost = matches!(e, ForwardError::Lost(_));
                warn!(initiator = %self.params.initiator_name, lun = remote_lun, remote = %spec.target_key(), opcode = cdb.first().copied().unwrap_or(0), "{e}");
                let sense = match e {
                    // LOGICAL UNIT COMMUNICATION FAILURE: retryable, the host decides.
                    ForwardError::Lost(_) | ForwardError::Aborted(_) => {
                        Sense::new(SenseKey::ABORTED_COMMAND, 0x08, 0x00)
                    }
                    // INVALID COMMAND OPERATION CODE (a CDB the remote leg cannot carry).
                    ForwardError::Refused(_) => Sense::new(SenseKey::ILLEGAL_REQUEST, 0x20, 0x00),
                };
                (engine_response(ScsiResponse::check(sense)), None, lost)
            }
        }
    }

    /// After a sealed command: at the hard counter limit close the connection (the command has
    /// its CHECK CONDITION); past the high-water mark ask once for a logout with an
    /// Asynchronous Message, AsyncEvent 1 "target requests logout" (RFC 7143 §11.9.1), so the
    /// initiator logs in again and both sides derive fresh keys (docs/seal.md).
    fn seal_counter_watch(
        &self,
        e: &mut engine::Connection,
        session: &SealSession,
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
            e.close_locally();
            return;
        }
        if session.rekey_due() && !self.rekey_asked.swap(true, Ordering::AcqRel) {
            info!(
                sent,
                received,
                mark = session.rekey_mark(),
                "seal: counters past the re-key mark; asking the initiator to log out (AsyncEvent 1)"
            );
            e.request_logout(LOGOUT_WAIT_SECS);
        }
    }
}

/// For a block write (WRITE, WRITE AND VERIFY) whose EDTL covers less than its transfer
/// length, rewrites the CDB to the whole blocks EDTL covers: `Some(Some(bytes))` to write,
/// `Some(None)` when not one whole block is covered. `None` for other commands.
fn overflow_write(exec: &Exec, cdb: &mut [u8], edtl: u32) -> Option<Option<usize>> {
    let Exec::Lu(lu, _) = exec else { return None };
    let bs = lu.block_size().max(1);
    let blocks = edtl / bs;
    let e = cdb::entry(*cdb.first()?).filter(|e| e.family.is_block_write())?;
    let field = e.field.count_bytes()?;
    // WRITE(6) counts 1..=255 blocks (0 means 256).
    if e.field == cdb::Field::Six && !(1..=255).contains(&blocks) {
        return (blocks == 0).then_some(None);
    }
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
