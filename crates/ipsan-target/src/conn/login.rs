//! The login phase of one connection (RFC 7143 §6): Login PDUs through the target's login
//! state machine (`iscsi_proto::login::TargetLogin`), the transcript Seal binds, relayed CHAP
//! and the remote sessions of a gateway's target, admission against the registry, and the
//! authentication-failure backoff (limits.rs).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use ipsan_seal::Direction;
use ipsan_transport::{FrameReader, FrameWriter};
use iscsi_proto::login::{LoginFailure, Outcome, Reply, TargetLogin};
use iscsi_wire::header::LoginResponse;
use iscsi_wire::{Header, Pdu};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tracing::{debug, warn};

use super::{Core, Shared};
use crate::lock;
use crate::registry::LoginDirectory;
use crate::remote::RemoteNexus;
use crate::seal_ext::{GuessSlot, SealExtension, SealSlot, TranscriptSlot};

/// A login that completed, its final response (T=1, the TSIH) not sent yet: the driver makes
/// the session joinable first — registers a new session, or adds this connection to the
/// session it names — and only then sends it ([`FinalAnswer::send`]), or refuses
/// ([`FinalAnswer::refuse`]). An initiator may open its next connection with the TSIH the
/// instant it reads the response (RFC 7143 §5.3.4); answered before the session was in the
/// table, that login was refused with 0x020a (issue 28). With the session slot it holds until
/// the session registers, and a gateway's remote sessions.
pub(super) type LoggedIn = (
    iscsi_proto::login::LoginResult,
    Option<crate::registry::SessionSlot>,
    Option<Arc<RemoteNexus>>,
    FinalAnswer,
);

/// The final Login Response of a completed login, held back until the session can be joined
/// (see [`LoggedIn`]). It is in the Seal transcript already: the record keys bind it.
pub(super) struct FinalAnswer {
    login: TargetLogin,
    /// What the login asked, for the login counters (counted when it is answered).
    dir: LoginDirectory,
    header: LoginResponse,
    data: Bytes,
    /// The login named a session by its TSIH: the connection joins it (RFC 7143 §5.3.4).
    pub(super) joins: bool,
}

impl FinalAnswer {
    /// Sends the response: full feature phase begins on this connection.
    pub(super) async fn send(self, wr: &mut FrameWriter<OwnedWriteHalf>) -> std::io::Result<()> {
        self.dir.registry.count_login(&self.dir, None);
        wr.send(Pdu::new(self.header, self.data)).await
    }

    /// Refuses the login instead (RFC 7143 §11.13.5), the protocol's refusal of this reply,
    /// and closes the write side.
    pub(super) async fn refuse(
        mut self,
        wr: &mut FrameWriter<OwnedWriteHalf>,
        failure: LoginFailure,
        peer: SocketAddr,
    ) {
        warn!(%peer, status = format!("{:#06x}", failure.status.0), "login refused after it completed: {}", failure.reason);
        self.dir
            .registry
            .count_login(&self.dir, Some(failure.status.0));
        // `refuse` keeps the reply's header fields (StatSN, ITT) and drops its keys.
        let reply = Reply {
            header: self.header,
            data: Vec::new(),
            outcome: Outcome::Continue,
        };
        let reply = self.login.refuse(reply, failure);
        if wr
            .send(Pdu::new(reply.header, Bytes::from(reply.data)))
            .await
            .is_ok()
        {
            let _ = wr.shutdown().await;
        }
    }
}

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
pub(super) async fn login_phase(
    conn: &mut FrameReader<OwnedReadHalf>,
    wr: &mut FrameWriter<OwnedWriteHalf>,
    shared: &Shared,
    slot: &SealSlot,
    transcript: &TranscriptSlot,
    guess: &GuessSlot,
    peer: SocketAddr,
) -> std::io::Result<Option<LoggedIn>> {
    let secret_used = crate::seal_ext::SecretUsedSlot::default();
    let ext = SealExtension::new(shared.registry.clone(), slot.clone(), transcript.clone())
        .recording_secret(secret_used.clone())
        .with_guess_limit(peer.ip(), guess.clone())
        .with_compression(shared.seal_compress);
    let mut login = TargetLogin::new(shared.offer.clone(), Some(Box::new(ext)));
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
        dir.cid.store(req.cid, std::sync::atomic::Ordering::Relaxed);
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
                Err(f) => reply = login.refuse(reply, f),
            }
        }
        if let (Outcome::FullFeature(result), Some(_), true) =
            (&reply.outcome, &session_slot, req.tsih != 0)
        {
            if let Err(f) = join_check(shared, result, req, slot) {
                reply = login.refuse(reply, f);
            }
        }
        // A login joining a session (its TSIH, RFC 7143 §5.3.4) uses the session's remote
        // sessions; it opens none.
        if let (Outcome::FullFeature(result), Some(_), 0) =
            (&reply.outcome, &session_slot, req.tsih)
        {
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
                    reply = login.refuse(
                        reply,
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
        if let (Outcome::FullFeature(result), true) = (&reply.outcome, req.tsih != 0) {
            // A connection joining a session: the window it sees is the session's, not one
            // counted from its Login's CmdSN (RFC 7143 §4.2.2.1, §11.13).
            let core = shared.registry.joining::<Core>(
                &result.params.initiator_name,
                result.isid,
                result.params.target_name.as_deref(),
                req.tsih,
            );
            if let Some(core) = core {
                let w = lock(&core.engine).window().clone();
                reply.header.exp_cmd_sn = w.exp_cmd_sn();
                reply.header.max_cmd_sn = w.max_cmd_sn();
            }
        }
        let resp = Pdu::new(reply.header, Bytes::from(reply.data));
        if let Outcome::FullFeature(result) = reply.outcome {
            // Sent by the driver once the session can be joined (`LoggedIn`).
            lock(transcript).add_sent(Direction::TargetToInitiator, &resp);
            // CHAP passed, or the Seal secret proven (its confirmation verified).
            if dir.chap_required() || lock(slot).is_some() {
                shared
                    .registry
                    .auth_success(&result.params.initiator_name, peer.ip());
            }
            let Header::LoginResponse(header) = resp.header else {
                return Ok(None);
            };
            let answer = FinalAnswer {
                login,
                dir,
                header,
                data: resp.data,
                joins: req.tsih != 0,
            };
            return Ok(Some((*result, session_slot, remote, answer)));
        }
        if wr.push(resp.clone()).is_err() {
            return Ok(None);
        }
        lock(transcript).add_sent(Direction::TargetToInitiator, &resp);
        wr.flush().await?;
        match reply.outcome {
            Outcome::Continue | Outcome::Relay(_) => {}
            Outcome::Failed(f) => {
                warn!(%peer, initiator = dir.initiator().as_deref().unwrap_or("(not declared)"), initiator_isid = %hex::encode(req.isid), status = format!("{:#06x}", f.status.0), "login refused: {}", f.reason);
                let _ = wr.shutdown().await;
                return Ok(None);
            }
            // Returned above, unsent.
            Outcome::FullFeature(_) => return Ok(None),
        }
    }
}

/// Whether a login that completed with a session's TSIH (RFC 7143 §5.3.4) may join it: the
/// session exists for this initiator, ISID and target (0x020a otherwise), the connection
/// negotiated Seal as the session's leading connection did (plaintext, or the same cipher and
/// chunk size under its own keys), and the session has room ([`crate::conn::Core::room`]:
/// 0x0206 at MaxConnections, 0x020a while it ends). Asked only once the login proved
/// everything it will (CHAP, Seal's confirmation) and `Registry::admit` found it proved at
/// least what the session did: a login that did not authenticate hears nothing of the
/// session, full or not (issue 28).
fn join_check(
    shared: &Shared,
    result: &iscsi_proto::login::LoginResult,
    req: &iscsi_wire::header::LoginRequest,
    slot: &SealSlot,
) -> Result<(), iscsi_proto::login::LoginFailure> {
    use iscsi_proto::login::{LoginFailure, LoginStatus};
    let core = shared
        .registry
        .joining::<Core>(
            &result.params.initiator_name,
            result.isid,
            result.params.target_name.as_deref(),
            req.tsih,
        )
        .ok_or_else(|| {
            LoginFailure::new(
                LoginStatus::SESSION_DOES_NOT_EXIST,
                format!(
                    "no session with TSIH {} for this initiator and ISID",
                    req.tsih
                ),
            )
        })?;
    let shape = lock(slot).as_ref().map(|s| (s.cipher(), s.chunk_size()));
    if core.seal_shape != shape {
        return Err(LoginFailure::new(
            LoginStatus::INITIATOR_ERROR,
            format!(
                "a connection joining session TSIH {} must negotiate its Seal cipher and chunk size ({:?}), not {shape:?}",
                core.tsih, core.seal_shape
            ),
        ));
    }
    core.room(req.cid)
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
pub(super) fn abandoned_seal_guess(shared: &Shared, peer: SocketAddr, guess: &GuessSlot) {
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
