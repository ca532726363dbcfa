//! Between a completed login and its final response: the connection's place in its session.
//! A login with TSIH 0 registers a new session (reinstating an older one with the same key,
//! RFC 7143 §6.3.5) and makes it joinable; a login with a session's TSIH adds the connection
//! to that session (§5.3.4; the same CID reinstates that connection, §6.3.4). Both happen
//! before the final Login Response leaves (`conn.rs`'s `serve`): an initiator may open its
//! next connection with the TSIH the instant it reads that response, and the session must be
//! in the table by then (issue 28). What cannot start is refused with a Login Response, not
//! answered and then closed.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use ipsan_seal::SealSession;
use iscsi_proto::engine::target as engine;
use iscsi_proto::engine::target::session::ConnId;
use iscsi_proto::login::{LoginFailure, LoginResult, LoginStatus};
use iscsi_proto::params::SessionParams;
use tokio_util::sync::CancellationToken;

use super::luns::Luns;
use super::{mcs, Core, Shared};
use crate::registry::SessionSlot;
use crate::remote::RemoteNexus;

/// The connection's place in its session, made before its login is answered.
pub(super) struct Started {
    pub core: Arc<Core>,
    pub id: ConnId,
    /// The session this one reinstates: its commands end before this one's run (§6.3.5).
    pub reinstates: Option<CancellationToken>,
    /// The connection joined a running session (its session-wide values are the leading
    /// login's).
    pub joined: bool,
}

/// What a completed login brings to [`start`].
pub(super) struct Login<'a> {
    pub result: &'a LoginResult,
    pub params: &'a SessionParams,
    /// The login named a session by its TSIH.
    pub joins: bool,
    pub session_slot: Option<SessionSlot>,
    pub remote: Option<Arc<RemoteNexus>>,
    pub seal: Option<Arc<SealSession>>,
    pub peer: SocketAddr,
    pub local: Option<SocketAddr>,
}

/// Registers the login's new session or adds the connection to the session it joins; the
/// refusal to answer with otherwise (RFC 7143 §11.13.5).
pub(super) fn start(shared: &Shared, l: Login<'_>) -> Result<Started, LoginFailure> {
    let Login {
        result,
        params,
        joins,
        session_slot,
        remote,
        seal,
        peer,
        local,
    } = l;
    let mut cfg = engine::Config::new(params.clone(), result.cmd_sn, result.next_stat_sn);
    cfg.cmd_window = shared.offer.cmd_window;
    cfg.nop_interval = shared.nop_interval;
    cfg.drain_timeout = super::DRAIN_TIMEOUT;
    cfg.max_command_bytes = super::MAX_COMMAND_BYTES;
    cfg.cid = result.cid;
    // Sealed data is sealed under each connection's own keys: a write reassigned here (ERL 2)
    // is asked for whole, sealed under this connection's keys (docs/seal.md §3).
    cfg.resolicit_reassigned_writes = seal.is_some();
    if joins {
        // The login directory checked whose session it is and that it had room; it may have
        // ended or filled up since (0x020a, 0x0206).
        let core = shared
            .registry
            .joining::<Core>(
                &params.initiator_name,
                result.isid,
                params.target_name.as_deref(),
                result.tsih,
            )
            .ok_or_else(|| {
                LoginFailure::new(
                    LoginStatus::SESSION_DOES_NOT_EXIST,
                    format!("session TSIH {} ended during the login", result.tsih),
                )
            })?;
        let target = params
            .target_name
            .as_deref()
            .and_then(|n| shared.registry.target(n));
        let luns = Luns {
            target: target.as_deref(),
            seal: seal.as_deref(),
            registry: &shared.registry,
            local,
        };
        let added = core
            .add_connection(cfg, Instant::now(), &luns)
            .map_err(|e| e.login_failure())?;
        if added.reinstated.is_some() {
            // Connection reinstatement (RFC 7143 §6.3.4): the old one is closed.
            core.wake_others(added.id);
        }
        return Ok(Started {
            core,
            id: added.id,
            reinstates: None,
            joined: true,
        });
    }
    let auth = session_slot
        .as_ref()
        .map(|s| s.auth().clone())
        .unwrap_or_default();
    let reg = shared
        .registry
        .register(
            crate::registry::SessionInfo::new(
                params,
                result.isid,
                result.tsih,
                peer,
                local,
                seal.clone(),
            )
            .with_auth(auth),
        )
        // A more strongly authenticated session with this key registered while this login
        // was being decided: it stays, this login is refused (as `Registry::admit` would).
        .map_err(|e| LoginFailure::new(LoginStatus::AUTHENTICATION_FAILURE, e.to_string()))?;
    // Registered: the session counts itself now.
    drop(session_slot);
    let (sess, id) = engine::session::Session::new(cfg, Instant::now());
    let core = Arc::new(mcs::Core::new(
        sess,
        &reg,
        remote,
        params.clone(),
        result.isid,
        result.tsih,
        seal.as_ref().map(|s| (s.cipher(), s.chunk_size())),
    ));
    shared.registry.attach(
        &params.initiator_name,
        result.isid,
        params.target_name.as_deref(),
        result.tsih,
        &core,
    );
    Ok(Started {
        core,
        id,
        reinstates: reg.reinstates,
        joined: false,
    })
}
