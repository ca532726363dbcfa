//! Remote iSCSI LUNs: the gateway's pass-through (`ipsan gateway`, docs/gateway.md).
//!
//! A gateway is this target engine and ipsan's initiator engine with a task mapping between
//! them, not a third copy of the protocol:
//!
//! ```text
//!  host ──► target engine (conn.rs) ──Execute{cdb, data}──► RemoteNexus::forward
//!                                                              │ Session::command_to
//!                                                              ▼ (initiator engine)
//!  host ◄── complete_with_residual ◄── status, sense, data, residual ◄── remote target
//! ```
//!
//! * One remote session per host session (the host's I_T nexus), opened while the host logs
//!   in and logged out when it ends, so reservations and unit attentions stay per host. The
//!   remote session logs in with the host's own InitiatorName and ISID (RFC 7143 §11.12.5):
//!   the remote array sees the host's I_T nexus, and its ACLs list host names.
//! * Every command is a tokio task awaiting the remote session; the host's commands in
//!   flight are commands in flight on the remote session, up to its CmdSN window (and
//!   `depth`, if set).
//! * The remote leg negotiates ipsan's fast keys (ImmediateData=Yes, InitialR2T=No, 256 KiB
//!   FirstBurstLength) whatever the host negotiated locally: a write costs one remote round
//!   trip up to FirstBurstLength. Nothing is acknowledged before the remote target answered.
//! * Several connections per remote session (RFC 7143 §4.2, issue 28) when the far end grants
//!   them: the first login to a remote target offers MaxConnections = `connections` (default
//!   [`DEFAULT_CONNECTIONS`]) on one connection; a far end that answers 1 (tgtd, LIO, most
//!   arrays) keeps that one-connection [`Session`] (and every later host session gets one),
//!   a far end that grants more (ipsan: `connections_per_session`, 4 by default) gets an
//!   [`McsSession`] of that many for this and every later host session. Relayed CHAP stays
//!   on one connection: the host answers one challenge, and every joining login would need
//!   another. Several connections offer ErrorRecoveryLevel 2 ([`DEFAULT_ERROR_RECOVERY_LEVEL`]):
//!   where the far end grants it, a lost connection's commands are reassigned to a live one
//!   and the connection logs in again inside the session (`McsSession`), so the host sees
//!   nothing. Where it answers 0 (ErrorRecoveryLevel 0: one lost connection ends the
//!   session), [`RemoteNexus::forward`] recovers here: the
//!   lost session is logged in again (a reinstating login with the host's ISID, §6.3.5)
//!   with backoff up to the recovery timeout, idempotent commands are sent again and the
//!   others answered with the retryable not-reissued sense, as [`Session`]'s recovery does.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipsan_initiator::{
    ConnectionLoss, DataDir, Error, IscsiUrl, LocalClose, McsConfig, McsSession, Negotiated,
    Passthrough, Session, SessionConfig, Spread,
};
use ipsan_seal::{Cipher, CryptoPool, Psk};
use iscsi_wire::header::TmfResponse;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

/// Where a remote LUN lives and how the gateway reaches it.
#[derive(Clone)]
pub struct RemoteSpec {
    /// `iscsi://host:port/target-iqn/lun` (the LUN is the remote LUN number).
    pub url: IscsiUrl,
    /// Login and connection settings of the remote session (InitiatorName and ISID are the
    /// host's, set per host session).
    pub session: SessionConfig,
    /// Seal on the remote leg: the cipher and the pre-shared secret (docs/seal.md).
    pub seal: Option<(Cipher, Psk)>,
    /// Commands in flight per remote session beyond which forwarded commands wait (`None`:
    /// only the remote target's CmdSN window limits them).
    pub depth: Option<usize>,
    /// The text this was configured from (`iscsi://…` and its settings), for comparisons
    /// and `ipsan ctl`.
    pub source: String,
    /// Hosts authenticate to the remote target itself: their CHAP is relayed during their
    /// login ([`RemoteNexus::open_relayed`]) and the gateway holds no host secret.
    pub chap_relay: bool,
    /// Offer compression on the sealed remote leg (`ipsan gateway --compress`, docs/seal.md
    /// §4b): on when the remote target agrees.
    pub compress: bool,
    /// Connections per remote session asked for (MaxConnections offered, RFC 7143 §13.2):
    /// used only when the far end grants more than one (see the module notes); 1 never offers
    /// more. `connections` in the config, `ipsan gateway --connections`.
    pub connections: u16,
    /// How commands spread over several connections.
    pub spread: Spread,
    /// ErrorRecoveryLevel offered by a session of several connections (RFC 7143 §7.2,
    /// §13.20; default 2, [`DEFAULT_ERROR_RECOVERY_LEVEL`]): where the far end grants 2 (ipsan
    /// with `[server] error_recovery_level = 2`, as `ipsan gateway` sets it) a lost connection's
    /// commands are reassigned to a live one and nothing reaches the host (sealed legs
    /// included: a moved write is sealed again under its new connection's keys); where it
    /// answers 0 the session recovers as below. One connection always offers 0.
    pub error_recovery_level: u32,
    /// What the far end answered to MaxConnections = `connections` at the first login (0: not
    /// asked yet), shared by every host session reaching it.
    pub granted: Arc<AtomicU32>,
}

/// Connections per remote session asked for unless configured: four carried 3.0–4.3× one
/// connection's rate at 1 % loss and 32 ms (docs/results/mcs-wan); docs/gateway.md says when
/// to use more or fewer.
pub const DEFAULT_CONNECTIONS: u16 = 4;

/// ErrorRecoveryLevel a remote session of several connections offers unless configured.
pub const DEFAULT_ERROR_RECOVERY_LEVEL: u32 = 2;

impl std::fmt::Debug for RemoteSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The session config holds CHAP secrets: only the redacted source text.
        f.debug_struct("RemoteSpec")
            .field("source", &self.source)
            .field("seal", &self.seal.as_ref().map(|(c, _)| c.to_string()))
            .field("depth", &self.depth)
            .field("connections", &self.connections)
            .finish_non_exhaustive()
    }
}

impl PartialEq for RemoteSpec {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl RemoteSpec {
    /// The remote target this LUN belongs to: one session per host reaches every LUN of it.
    #[must_use]
    pub fn target_key(&self) -> String {
        format!(
            "{}/{}",
            self.url.socket_addr_string(),
            self.url.target.as_deref().unwrap_or("")
        )
    }

    /// The remote LUN number.
    #[must_use]
    pub fn remote_lun(&self) -> u64 {
        u64::from(self.url.lun.unwrap_or(0))
    }
}

/// The raw 8-byte LUN field for LUN `id` (SAM-5 §4.7, flat space addressing).
fn raw_lun(id: u64) -> u64 {
    u64::from_be_bytes(ipsan_scsi::encode_lun(id))
}

/// How long a remote session's logout may take when its host session ends.
const LOGOUT_TIMEOUT: Duration = Duration::from_secs(5);

/// A remote session: one connection, or several (the far end granted them).
enum Link {
    One(Session),
    Many(McsSession),
}

impl Link {
    async fn command(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        abort: &CancellationToken,
    ) -> Result<Passthrough, Error> {
        match self {
            Link::One(s) => s.command_to_abortable(lun, cdb, dir, abort).await,
            Link::Many(s) => s.command_to_abortable(lun, cdb, dir, abort).await,
        }
    }

    async fn lun_reset(&self, lun: u64) -> Result<(), Error> {
        match self {
            Link::One(s) => s.lun_reset_to(lun).await,
            Link::Many(s) => s.lun_reset_to(lun).await,
        }
    }

    async fn logout(self) -> Result<(), Error> {
        match self {
            Link::One(s) => s.logout().await,
            Link::Many(s) => s.logout().await,
        }
    }

    fn params(&self) -> &Negotiated {
        match self {
            Link::One(s) => s.params(),
            Link::Many(s) => s.params(),
        }
    }

    fn connections(&self) -> usize {
        match self {
            Link::One(_) => 1,
            Link::Many(s) => s.connections(),
        }
    }
}

/// One remote session and its depth limit.
struct Remote {
    session: Link,
    depth: Option<Semaphore>,
}

/// A remote session of several connections that ended: since when, and what its commands
/// did meanwhile (logged when the session is back).
#[derive(Default)]
struct Recovering {
    since: Option<Instant>,
    reissued: u64,
    not_idempotent: u64,
}

/// The remote sessions of one host session (its I_T nexus), one per remote target.
pub struct RemoteNexus {
    initiator: String,
    isid: [u8; 6],
    pool: Arc<CryptoPool>,
    sessions: std::sync::Mutex<HashMap<String, Arc<Remote>>>,
    /// Held while a remote session logs in: two logins with the host's ISID would reinstate
    /// each other on the remote target (RFC 7143 §6.3.5).
    opening: tokio::sync::Mutex<()>,
    /// Remote sessions of several connections being logged in again, by target key.
    recovering: std::sync::Mutex<HashMap<String, Recovering>>,
}

impl std::fmt::Debug for RemoteNexus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteNexus")
            .field("initiator", &self.initiator)
            .field("isid", &hex::encode(self.isid))
            .finish_non_exhaustive()
    }
}

/// Why a forwarded command has no remote status.
#[derive(Debug, thiserror::Error)]
pub enum ForwardError {
    /// The remote session is gone (connection lost, logout asked, never opened): the host's
    /// session ends too, so the host logs in again as after a path failure.
    #[error("remote session lost: {0}")]
    Lost(Error),
    /// The remote target aborted the command (a LUN reset forwarded from a host, say).
    #[error("remote task aborted: {0}")]
    Aborted(Error),
    /// The command cannot be carried (a CDB over 16 bytes, a length the transform refuses).
    #[error("cannot forward: {0}")]
    Refused(String),
}

impl RemoteNexus {
    /// The remote sessions of the host `initiator` with session id `isid`.
    #[must_use]
    pub fn new(initiator: &str, isid: [u8; 6], pool: Arc<CryptoPool>) -> Self {
        Self {
            initiator: initiator.to_owned(),
            isid,
            pool,
            sessions: std::sync::Mutex::new(HashMap::new()),
            opening: tokio::sync::Mutex::new(()),
            recovering: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn get(&self, spec: &RemoteSpec) -> Option<Arc<Remote>> {
        crate::lock(&self.sessions).get(&spec.target_key()).cloned()
    }

    /// Logs in to `spec`'s remote target as the host (its InitiatorName and ISID), unless a
    /// session to that target is open already.
    pub async fn open(&self, spec: &RemoteSpec) -> Result<(), Error> {
        self.open_with(spec, None).await
    }

    /// Logs in to `spec`'s remote target as the host, answering its CHAP challenge with the
    /// host's own answer (`relay`, driven by the host's login in conn.rs). The remote target
    /// authenticates the host; the gateway sees the exchange, never a secret. No session
    /// recovery: a new remote login needs the host to answer again, so a lost remote session
    /// ends the host's session and the host logs in again.
    pub async fn open_relayed(
        &self,
        spec: &RemoteSpec,
        relay: ipsan_initiator::ChapRelay,
    ) -> Result<(), Error> {
        self.open_with(spec, Some(relay)).await
    }

    async fn open_with(
        &self,
        spec: &RemoteSpec,
        relay: Option<ipsan_initiator::ChapRelay>,
    ) -> Result<(), Error> {
        let _one_login = self.opening.lock().await;
        if self.get(spec).is_some() {
            return Ok(());
        }
        if spec.chap_relay && relay.is_none() {
            // Only the host can answer the remote target's challenge.
            return Err(Error::Login(
                "CHAP is relayed for this remote target: only a host login opens its session"
                    .into(),
            ));
        }
        let mut cfg = spec.session.clone();
        cfg.login.initiator_name.clone_from(&self.initiator);
        cfg.login.isid = Some(self.isid);
        // The host times its commands out and sends its own task management.
        cfg.command_timeout = None;
        if let Some((cipher, psk)) = &spec.seal {
            let req = ipsan_initiator::seal::SealRequest {
                ciphers: vec![*cipher],
                chunk: ipsan_seal::DEFAULT_CHUNK,
                psk: psk.clone(),
                pool: Some(self.pool.clone()),
            };
            cfg.extension = Some(req.factory_with_compression(spec.compress));
        }
        let session = match relay {
            Some(relay) => {
                // The host answers one CHAP challenge: one connection.
                cfg.login.chap = None;
                cfg.login.mutual_chap = None;
                Link::One(Session::connect_relayed(&spec.url, &cfg, relay).await?)
            }
            None => Self::connect(spec, cfg).await?,
        };
        let p = session.params();
        info!(
            initiator = %self.initiator, isid = %hex::encode(self.isid), remote = %spec.target_key(),
            seal = spec.seal.as_ref().map_or("off".to_owned(), |(c, _)| c.to_string()),
            immediate_data = p.immediate_data, initial_r2t = p.initial_r2t,
            first_burst = p.first_burst_length, max_burst = p.max_burst_length,
            connections = session.connections(), erl = p.error_recovery_level,
            "remote session open"
        );
        let back = crate::lock(&self.recovering).remove(&spec.target_key());
        if let Some(Recovering {
            since: Some(since),
            reissued,
            not_idempotent,
        }) = back
        {
            let took = since.elapsed();
            info!(
                initiator = %self.initiator, remote = %spec.target_key(),
                took_ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX),
                reissued, failed_not_idempotent = not_idempotent,
                "remote session recovered in {took:?}"
            );
        }
        let remote = Arc::new(Remote {
            session,
            depth: spec.depth.map(Semaphore::new),
        });
        crate::lock(&self.sessions).insert(spec.target_key(), remote);
        Ok(())
    }

    /// Logs in to `spec`'s remote target with `cfg` (the host's name and ISID in it): one
    /// connection, or several when the far end grants them (see the module notes).
    async fn connect(spec: &RemoteSpec, mut cfg: SessionConfig) -> Result<Link, Error> {
        let want = spec.connections.max(1);
        let several = McsConfig {
            connections: want,
            spread: spec.spread,
        };
        match spec.granted.load(Ordering::Acquire) {
            _ if want == 1 => return Ok(Link::One(Session::connect(&spec.url, &cfg).await?)),
            0 => {}
            1 => return Ok(Link::One(Session::connect(&spec.url, &cfg).await?)),
            _ => return Self::connect_several(spec, &cfg, several).await,
        }
        // The first login to this far end: one connection, offering `want`; its answer says
        // whether the far end takes several (RFC 7143 §13.2: the lower of both offers).
        cfg.login.max_connections = u32::from(want);
        let s = Session::connect(&spec.url, &cfg).await?;
        let granted = s.params().max_connections.max(1);
        spec.granted.store(granted, Ordering::Release);
        info!(remote = %spec.target_key(), offered = want, granted, "the far end's MaxConnections");
        if granted == 1 {
            return Ok(Link::One(s));
        }
        // The login just made is the leading login of nothing: logged out, and the session of
        // several logs in afresh (its leading login offers `want` again).
        if tokio::time::timeout(LOGOUT_TIMEOUT, s.logout())
            .await
            .is_err()
        {
            warn!(remote = %spec.target_key(), "logout after the first login timed out");
        }
        Self::connect_several(spec, &cfg, several).await
    }

    /// A session of several connections; a far end that then refuses the joining logins
    /// gets one connection (logged).
    async fn connect_several(
        spec: &RemoteSpec,
        cfg: &SessionConfig,
        several: McsConfig,
    ) -> Result<Link, Error> {
        let mut mcs_cfg = cfg.clone();
        mcs_cfg.login.error_recovery_level = spec.error_recovery_level;
        match McsSession::connect(&spec.url, &mcs_cfg, several).await {
            Ok(s) => Ok(Link::Many(s)),
            // Unreachable: one connection would not fare better.
            Err(e @ (Error::Io(_) | Error::Timeout(_) | Error::ConnectionLost(_))) => Err(e),
            Err(e) => {
                warn!(remote = %spec.target_key(), "several connections failed ({e}); using one");
                Ok(Link::One(Session::connect(&spec.url, cfg).await?))
            }
        }
    }

    /// The remote session `lost` of several connections ended (at ErrorRecoveryLevel 0, with
    /// its first lost connection): it leaves the map, so the next command logs in again
    /// (reinstating it on the remote target, RFC 7143 §6.3.5). Returns when the loss began.
    fn retire(&self, spec: &RemoteSpec, lost: &Arc<Remote>, why: &Error) -> Instant {
        let key = spec.target_key();
        let current = {
            let mut m = crate::lock(&self.sessions);
            let current = m.get(&key).is_some_and(|r| Arc::ptr_eq(r, lost));
            if current {
                m.remove(&key);
            }
            current
        };
        let now = Instant::now();
        let mut r = crate::lock(&self.recovering);
        match r.get_mut(&key) {
            Some(e) => *e.since.get_or_insert(now),
            None if current => {
                warn!(initiator = %self.initiator, remote = %key, "remote session of several connections lost ({why}); logging in again");
                r.insert(
                    key,
                    Recovering {
                        since: Some(now),
                        ..Recovering::default()
                    },
                );
                now
            }
            // Replaced already: the session is back.
            None => now,
        }
    }

    /// Since when `spec`'s remote session of several connections has been recovering, if it
    /// is.
    fn recovering_since(&self, spec: &RemoteSpec) -> Option<Instant> {
        crate::lock(&self.recovering)
            .get(&spec.target_key())
            .and_then(|r| r.since)
    }

    /// Counts what a command did while its remote session of several connections recovers.
    fn note(&self, spec: &RemoteSpec, reissued: bool) {
        if let Some(e) = crate::lock(&self.recovering).get_mut(&spec.target_key()) {
            if reissued {
                e.reissued += 1;
            } else {
                e.not_idempotent += 1;
            }
        }
    }

    /// Forwards one host command to `route`: `spec`'s remote LUN `remote_lun` (an id, not the
    /// raw field): its CDB and data-out as they came, a read of `read_len` bytes, with the host's R
    /// and W bits (`bits`, kept even for 0 bytes: targets compute residuals from them). The
    /// answer is the remote target's, unchanged. Once `abort` is cancelled (the host's ABORT
    /// TASK, ABORT TASK SET or CLEAR TASK SET), the remote command is aborted too (RFC 7143
    /// §11.5.1) or, not sent yet, never sent.
    pub async fn forward(
        &self,
        (spec, remote_lun): (&RemoteSpec, u64),
        cdb: &[u8],
        data_out: Bytes,
        read_len: usize,
        (read, write): (bool, bool),
        abort: &CancellationToken,
    ) -> Result<Passthrough, ForwardError> {
        if cdb.len() > 16 {
            return Err(ForwardError::Refused(format!(
                "a {}-byte CDB (the remote leg carries up to 16)",
                cdb.len()
            )));
        }
        let mut c = [0u8; 16];
        c[..cdb.len()].copy_from_slice(cdb);
        // Set once a remote session of several connections was lost under this command.
        let mut lost_at: Option<Instant> = None;
        let mut backoff = ipsan_initiator::recovery::BACKOFF_START;
        loop {
            if abort.is_cancelled() && lost_at.is_some() {
                return Err(ForwardError::Aborted(Error::TaskAborted(
                    "ABORT TASK".into(),
                )));
            }
            if self.get(spec).is_none() {
                // A LUN added after the host logged in, a target reached by REPORT LUNS, or a
                // remote session of several connections being recovered.
                if let Err(e) = self.open(spec).await {
                    // A command that came while the session recovers waits for it too.
                    lost_at = lost_at.or_else(|| self.recovering_since(spec));
                    match (lost_at, spec.session.recovery_timeout) {
                        (Some(since), Some(limit)) if since.elapsed() < limit => {
                            tokio::time::sleep(backoff).await;
                            backoff = (backoff * 2).min(ipsan_initiator::recovery::BACKOFF_MAX);
                            continue;
                        }
                        _ => return Err(ForwardError::Lost(e)),
                    }
                }
            }
            let remote = self
                .get(spec)
                .ok_or_else(|| ForwardError::Refused("remote session not open".into()))?;
            let _permit = match &remote.depth {
                // A command waiting for the depth limit is aborted without reaching the remote.
                Some(s) => Some(tokio::select! {
                    biased;
                    () = abort.cancelled() => {
                        return Err(ForwardError::Aborted(Error::TaskAborted("ABORT TASK".into())))
                    }
                    p = s.acquire() => p.map_err(|_| {
                        ForwardError::Lost(Error::ConnectionLost(ConnectionLoss::Local(
                            LocalClose::SessionClosed,
                        )))
                    })?,
                }),
                None => None,
            };
            // A bidirectional command is carried as its write (ipsan's initiator has no
            // bidirectional form); neither bit with an EDTL is carried as a read.
            let dir = if write {
                DataDir::Write(data_out.clone())
            } else if read || read_len > 0 {
                DataDir::Read(BytesMut::new(), read_len)
            } else {
                DataDir::None
            };
            match remote
                .session
                .command(raw_lun(remote_lun), c, dir, abort)
                .await
            {
                Ok(p) => return Ok(p),
                // Several connections, one lost: the session is over (ErrorRecoveryLevel 0).
                // Logged in again by the next pass, within the recovery timeout; this command
                // goes again if it may run twice, as a one-connection session's recovery does.
                Err(e @ Error::ConnectionLost(_))
                    if matches!(remote.session, Link::Many(_))
                        && spec.session.recovery_timeout.is_some() =>
                {
                    let since = *lost_at.get_or_insert(self.retire(spec, &remote, &e));
                    let limit = spec.session.recovery_timeout.unwrap_or_default();
                    if !ipsan_initiator::recovery::is_idempotent(c[0]) {
                        self.note(spec, false);
                        return Ok(not_reissued(ipsan_initiator::recovery::not_reissued_sense()));
                    }
                    if since.elapsed() >= limit {
                        return Err(ForwardError::Lost(e));
                    }
                    self.note(spec, true);
                }
                // In flight when the remote connection failed and not safe to send twice
                // (COMPARE AND WRITE, PERSISTENT RESERVE OUT, ...): the retryable CHECK
                // CONDITION recovery gives it goes to the host, whose SCSI layer decides, as
                // after a path failure.
                Err(Error::NotReissued { sense, .. }) => return Ok(not_reissued(sense)),
                Err(e @ Error::TaskAborted(_)) => return Err(ForwardError::Aborted(e)),
                Err(e @ Error::InvalidRequest(_)) => {
                    return Err(ForwardError::Refused(e.to_string()))
                }
                Err(e) => return Err(ForwardError::Lost(e)),
            }
        }
    }

    /// Forwards a LOGICAL UNIT RESET from the host to the remote LUN (RFC 7143 §11.5.1) and
    /// returns the response for the host (§11.6.1): Function complete once the remote LU was
    /// reset, the remote target's own response if it refused, Function rejected if the remote
    /// session could not carry it.
    pub async fn lun_reset(&self, spec: &RemoteSpec, remote_lun: u64) -> TmfResponse {
        let r = match self.get(spec) {
            Some(remote) => remote.session.lun_reset(raw_lun(remote_lun)).await,
            None => Err(Error::ConnectionLost(ConnectionLoss::Local(
                LocalClose::SessionClosed,
            ))),
        };
        match r {
            Ok(()) => TmfResponse::FUNCTION_COMPLETE,
            Err(e) => {
                warn!(remote = %spec.target_key(), lun = remote_lun, "remote LOGICAL UNIT RESET failed: {e}");
                match e {
                    Error::TaskManagement(code) => TmfResponse(code),
                    _ => TmfResponse::FUNCTION_REJECTED,
                }
            }
        }
    }

    /// Logs every remote session out (the host's session ended), each bounded in time.
    pub async fn close(&self) {
        let all: Vec<(String, Arc<Remote>)> = crate::lock(&self.sessions).drain().collect();
        for (key, remote) in all {
            // The last holder logs out; a command task still holding it drops it later
            // (dropping a session closes its connection).
            let Ok(remote) = Arc::try_unwrap(remote) else {
                continue;
            };
            match tokio::time::timeout(LOGOUT_TIMEOUT, remote.session.logout()).await {
                Ok(Ok(())) => {
                    info!(initiator = %self.initiator, remote = %key, "remote session logged out")
                }
                Ok(Err(e)) => {
                    info!(initiator = %self.initiator, remote = %key, "remote session closed: {e}")
                }
                Err(_) => {
                    warn!(initiator = %self.initiator, remote = %key, "remote logout timed out; closed")
                }
            }
        }
    }
}

/// The answer to a command in flight at a connection loss that is not sent again: CHECK
/// CONDITION with the retryable not-reissued sense ([`ipsan_initiator::recovery`]).
fn not_reissued(sense: ipsan_initiator::scsi::Sense) -> Passthrough {
    Passthrough {
        status: ipsan_scsi::ScsiStatus::CHECK_CONDITION.0,
        sense: Some(Bytes::from(sense.to_fixed())),
        data: BytesMut::new(),
        residual: 0,
    }
}

/// The host's side of relayed CHAP during one host login (docs/gateway.md): the remote
/// login runs beside the host's, as the host (its InitiatorName and ISID), and the host's
/// login engine (`Auth::Relay`, iscsi-proto login.rs) asks this for the remote target's
/// challenge and verdict. conn/login.rs `login_phase` drives it.
pub struct HostRelay {
    nexus: Option<Arc<RemoteNexus>>,
    response: Option<tokio::sync::oneshot::Sender<ipsan_initiator::RelayedResponse>>,
    accepted: Option<tokio::sync::oneshot::Receiver<ipsan_initiator::RelayedVerdict>>,
    login: Option<tokio::task::JoinHandle<Result<(), Error>>>,
    limit: Duration,
}

impl std::fmt::Debug for HostRelay {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRelay")
            .field("nexus", &self.nexus)
            .finish_non_exhaustive()
    }
}

/// What the host hears when the remote login failed: the remote target's own refusal when it
/// judged the host (class 02: authentication, authorization, ...), else "service
/// unavailable", which initiators retry (RFC 7143 §11.13.5).
fn relay_failure(e: &Error) -> iscsi_proto::login::LoginFailure {
    use iscsi_proto::login::{LoginFailure, LoginStatus};
    match e {
        Error::LoginRefused {
            class: 2, detail, ..
        } => LoginFailure::new(
            LoginStatus(0x0200 | u16::from(*detail)),
            format!("remote target refused the host: {e}"),
        ),
        _ => LoginFailure::new(
            LoginStatus::SERVICE_UNAVAILABLE,
            format!("relayed login to the remote target failed: {e}"),
        ),
    }
}

impl HostRelay {
    /// Starts the remote login for the host's CHAP_A offer `algorithms`; returns the relay
    /// and the remote target's challenge (or why there is none), within `limit`.
    pub async fn start(
        spec: Arc<RemoteSpec>,
        (initiator, isid): (&str, [u8; 6]),
        pool: Arc<CryptoPool>,
        algorithms: Vec<iscsi_proto::chap::ChapAlgorithm>,
        limit: Duration,
    ) -> (Self, iscsi_proto::login::RelayAnswer) {
        use iscsi_proto::login::RelayAnswer;
        let (ctx, crx) = tokio::sync::oneshot::channel();
        let (rtx, rrx) = tokio::sync::oneshot::channel();
        let (atx, arx) = tokio::sync::oneshot::channel();
        let relay = ipsan_initiator::ChapRelay {
            algorithms,
            challenge: Some(ctx),
            response: Some(rrx),
            accepted: Some(atx),
        };
        let nexus = Arc::new(RemoteNexus::new(initiator, isid, pool));
        let n = nexus.clone();
        let login = tokio::spawn(async move { n.open_relayed(&spec, relay).await });
        let mut me = Self {
            nexus: Some(nexus),
            response: Some(rtx),
            accepted: Some(arx),
            login: Some(login),
            limit,
        };
        let answer = match tokio::time::timeout(limit, crx).await {
            Ok(Ok((algorithm, id, challenge))) => RelayAnswer::Challenge {
                algorithm,
                id,
                challenge,
            },
            Ok(Err(_)) => RelayAnswer::Refused(me.login_error().await),
            Err(_) => RelayAnswer::Refused(iscsi_proto::login::LoginFailure::new(
                iscsi_proto::login::LoginStatus::SERVICE_UNAVAILABLE,
                format!("remote target: no CHAP challenge within {limit:?}"),
            )),
        };
        (me, answer)
    }

    /// Carries the host's answer to the remote target; returns its verdict.
    pub async fn respond(
        &mut self,
        name: String,
        response: Vec<u8>,
        mutual: Option<(u8, Vec<u8>)>,
    ) -> iscsi_proto::login::RelayAnswer {
        use iscsi_proto::login::{LoginFailure, LoginStatus, RelayAnswer};
        let (Some(tx), Some(rx)) = (self.response.take(), self.accepted.take()) else {
            return RelayAnswer::Refused(LoginFailure::new(
                LoginStatus::TARGET_ERROR,
                "relayed CHAP: a second response",
            ));
        };
        if tx
            .send(ipsan_initiator::RelayedResponse {
                name,
                response,
                mutual,
            })
            .is_err()
        {
            return RelayAnswer::Refused(self.login_error().await);
        }
        match tokio::time::timeout(self.limit, rx).await {
            Ok(Ok(mutual)) => RelayAnswer::Verified { mutual },
            Ok(Err(_)) => RelayAnswer::Refused(self.login_error().await),
            Err(_) => RelayAnswer::Refused(LoginFailure::new(
                LoginStatus::SERVICE_UNAVAILABLE,
                format!("remote target: no CHAP verdict within {:?}", self.limit),
            )),
        }
    }

    /// The host's login reached full feature phase: waits for the remote login to finish
    /// (its operational stage); the nexus then holds the remote session.
    pub async fn finish(mut self) -> Result<Arc<RemoteNexus>, String> {
        let Some(login) = self.login.take() else {
            return Err("relayed login not started".into());
        };
        match tokio::time::timeout(self.limit, login).await {
            Ok(Ok(Ok(()))) => self
                .nexus
                .take()
                .ok_or_else(|| "relayed login lost its nexus".to_owned()),
            Ok(Ok(Err(e))) => Err(relay_failure(&e).reason),
            Ok(Err(e)) => Err(format!("relayed login task: {e}")),
            Err(_) => Err(format!(
                "remote login did not finish within {:?}",
                self.limit
            )),
        }
    }

    async fn login_error(&mut self) -> iscsi_proto::login::LoginFailure {
        use iscsi_proto::login::{LoginFailure, LoginStatus};
        let Some(login) = self.login.take() else {
            return LoginFailure::new(LoginStatus::TARGET_ERROR, "relayed login not started");
        };
        match tokio::time::timeout(self.limit, login).await {
            Ok(Ok(Err(e))) => relay_failure(&e),
            _ => LoginFailure::new(
                LoginStatus::SERVICE_UNAVAILABLE,
                "relayed login to the remote target failed",
            ),
        }
    }
}

impl Drop for HostRelay {
    /// The host's login did not complete: the remote session, if it opened, is logged out.
    fn drop(&mut self) {
        if let Some(login) = self.login.take() {
            login.abort();
        }
        if let (Some(nexus), Ok(rt)) = (self.nexus.take(), tokio::runtime::Handle::try_current()) {
            rt.spawn(async move { nexus.close().await });
        }
    }
}
