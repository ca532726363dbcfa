//! What the running target knows: its targets with their LUNs and policies, and the sessions
//! that are logged in (for TSIH assignment and session reinstatement, RFC 7143 §6.3.5).
//!
//! The target list is live: `ipsan ctl` and reloads swap in a new list atomically
//! ([`Registry::apply`]); connections look their target up per command, so a LUN added is
//! usable at once and a session of a target that did not change never notices.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Instant, SystemTime};

use ipsan_scsi::{Backend, LogicalUnit, LuConfig};
use ipsan_seal::SealSession;
use iscsi_proto::login::{Auth, Directory, LoginFailure, LoginStatus, TargetPolicy};
use iscsi_proto::params::SessionParams;
use tokio_util::sync::CancellationToken;

use crate::config::{Config, FileConfig, LunConfig, TargetConfig};
use crate::limits::{AddressConnections, AuthLimiter, FailureVerdict, LimitStats, Limits};
use crate::metrics::{LunTable, Metrics, SessionStats};
use crate::remote::RemoteSpec;

mod build;
mod change;
mod directory;

use build::build_target;
pub use change::{ChangeError, ChangeReport};
pub use directory::LoginDirectory;

/// The portal group every portal of this target belongs to (RFC 7143 §13.9).
pub const PORTAL_GROUP_TAG: u16 = 1;

/// A target being served.
#[derive(Debug)]
pub struct Target {
    pub iqn: String,
    pub alias: Option<String>,
    pub allow: Vec<String>,
    /// The shared credential: authenticates every name no `chap_hosts` entry binds.
    pub auth: Auth,
    /// Per-host CHAP bound to initiator names (config.rs [`crate::config::HostChap`]).
    pub chap_hosts: Vec<crate::config::HostChap>,
    pub seal: crate::config::SealSettings,
    pub luns: BTreeMap<u64, Arc<LogicalUnit>>,
    /// The stores behind the LUNs, flushed at shutdown.
    pub backends: Vec<(u64, Arc<dyn Backend>)>,
    /// What each LUN was built from (to tell a resize from a replacement).
    pub lun_configs: BTreeMap<u64, LunConfig>,
    /// Per-LUN counters, shared with this target's sessions (metrics.rs).
    pub lun_stats: Arc<LunTable>,
    /// Remote iSCSI LUNs (a gateway's pass-through, remote.rs): every command to them is
    /// forwarded.
    pub remotes: BTreeMap<u64, Arc<RemoteSpec>>,
}

impl Target {
    /// The one remote target this target mirrors, if it has no LUN of its own and each of
    /// its LUNs is that remote target's LUN with the same number: then REPORT LUNS and
    /// commands to LUNs it does not list are forwarded too, so the host sees the remote
    /// target exactly.
    #[must_use]
    pub fn mirrored_remote(&self) -> Option<&Arc<RemoteSpec>> {
        if !self.luns.is_empty() {
            return None;
        }
        let mut it = self.remotes.iter();
        let (_, first) = it.next()?;
        let key = first.target_key();
        self.remotes
            .iter()
            .all(|(id, r)| r.target_key() == key && r.remote_lun() == *id)
            .then_some(first)
    }

    /// Where a command to LUN `lun` goes when it is not a local LU: the remote LUN's spec and
    /// its number on the remote target.
    #[must_use]
    pub fn remote_route(&self, lun: u64) -> Option<(Arc<RemoteSpec>, u64)> {
        if let Some(r) = self.remotes.get(&lun) {
            return Some((r.clone(), r.remote_lun()));
        }
        if self.luns.contains_key(&lun) {
            return None;
        }
        self.mirrored_remote().map(|r| (r.clone(), lun))
    }

    /// The remote targets this target's LUNs reach, one entry each.
    #[must_use]
    pub fn remote_targets(&self) -> Vec<Arc<RemoteSpec>> {
        let mut out: Vec<Arc<RemoteSpec>> = Vec::new();
        for r in self.remotes.values() {
            if !out.iter().any(|o| o.target_key() == r.target_key()) {
                out.push(r.clone());
            }
        }
        out
    }

    /// How a login declaring `initiator` must authenticate (RFC 7143 §12.1.3): with the CHAP
    /// credential bound to that name if one is, else with the target's shared one. A name no
    /// credential binds is refused when the target has per-host credentials and no shared
    /// one: per-host CHAP never leaves a name without authentication.
    pub fn auth_for(&self, initiator: &str) -> Result<Auth, LoginFailure> {
        if let Some(h) = self
            .chap_hosts
            .iter()
            .find(|h| h.names.iter().any(|n| n == initiator))
        {
            return Ok(Auth::Chap(h.policy.clone()));
        }
        if !self.chap_hosts.is_empty() && matches!(self.auth, Auth::None) {
            return Err(LoginFailure::new(
                LoginStatus::AUTHORIZATION_FAILURE,
                format!("{initiator} has no CHAP credential bound on {}", self.iqn),
            ));
        }
        Ok(self.auth.clone())
    }

    /// Whether `initiator` may log in (an empty allow-list admits everyone).
    #[must_use]
    pub fn allows(&self, initiator: &str) -> bool {
        self.allow.is_empty()
            || self.allow.iter().any(|p| match p.strip_suffix('*') {
                Some(prefix) => initiator.starts_with(prefix),
                None => p == initiator,
            })
    }
}

/// Key of a session for reinstatement: the same initiator, ISID and target (RFC 7143 §6.3.5).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
struct SessionKey {
    initiator: String,
    isid: [u8; 6],
    target: Option<String>,
}

/// What a session's login proved about its initiator name (docs/target.md, "Sessions keep
/// their strength"): the CHAP user it answered for, and the Seal secret its keys came from.
/// Neither is a secret; both are decided by the target's configuration at login.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Authentication {
    /// The CHAP user (`CHAP_N`) the login proved the secret of, when the target required CHAP.
    pub chap_user: Option<String>,
    /// The Seal secret the login's keys were confirmed with, when the session is sealed.
    pub seal: Option<crate::config::SealSecret>,
}

/// How strongly a login proved its initiator name, weakest first: nothing, CHAP (one secret
/// per target, RFC 7143 §12.1.3), Seal with the target-wide (group) secret, Seal with the
/// name's own secret.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Strength {
    None,
    Chap,
    SealTargetWide,
    SealOwn,
}

impl Authentication {
    /// The strongest proof this login gave.
    #[must_use]
    pub fn strength(&self) -> Strength {
        match (self.seal, &self.chap_user) {
            (Some(crate::config::SealSecret::Initiator), _) => Strength::SealOwn,
            (Some(crate::config::SealSecret::TargetWide), _) => Strength::SealTargetWide,
            (None, Some(_)) => Strength::Chap,
            (None, None) => Strength::None,
        }
    }

    /// Whether a login that proved `self` may replace a session that proved `old` (session
    /// reinstatement, RFC 7143 §6.3.5): it must prove everything `old` proved — the same
    /// CHAP user, a Seal secret at least as specific — so it is never weaker and never
    /// another identity.
    #[must_use]
    pub fn covers(&self, old: &Self) -> bool {
        self.strength() >= old.strength()
            && old
                .chap_user
                .as_ref()
                .is_none_or(|u| self.chap_user.as_ref() == Some(u))
            && self.seal >= old.seal
    }
}

impl std::fmt::Display for Authentication {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let seal = match self.seal {
            Some(crate::config::SealSecret::Initiator) => "Seal (own secret)",
            Some(crate::config::SealSecret::TargetWide) => "Seal (target-wide secret)",
            None => "",
        };
        match (&self.chap_user, seal) {
            (None, "") => f.write_str("no authentication"),
            (None, s) => f.write_str(s),
            (Some(u), "") => write!(f, "CHAP user {u:?}"),
            (Some(u), s) => write!(f, "CHAP user {u:?} and {s}"),
        }
    }
}

/// A login refused by [`Registry::register`] because a session it would replace was
/// authenticated more strongly (a race with another login; [`Registry::admit`] refuses the
/// ordinary case before the login is answered).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Outranked(String);

#[derive(Debug)]
struct SessionEntry {
    tsih: u16,
    /// Cancelled to end the session (reinstatement, shutdown, `ipsan ctl session drop`).
    cancel: CancellationToken,
    /// Cancelled by the session once none of its commands runs any more.
    drained: CancellationToken,
    info: Arc<SessionInfo>,
    stats: Arc<SessionStats>,
    /// Its connections' shared state, for a login joining it (RFC 7143 §5.3.4).
    core: Option<std::sync::Weak<dyn SessionCore>>,
}

/// A session's shared connection state as the registry keeps it, weakly, for a login joining
/// the session (RFC 7143 §5.3.4; [`Registry::attach`], [`Registry::joining`]) and for `ipsan
/// ctl sessions`: the connection driver's own type (`conn::Core`), named by this trait so the
/// registry does not depend on the driver that depends on it.
pub(crate) trait SessionCore: std::any::Any + Send + Sync {
    /// How many connections the session has now.
    fn connections(&self) -> usize;
    /// Itself, for [`Registry::joining`] to hand back the driver's type.
    fn into_any(self: Arc<Self>) -> Arc<dyn std::any::Any + Send + Sync>;
}

/// The NVMe/TCP side as the registry sees it, once it runs ([`Registry::nvme`]; `crate::nvme`
/// registers itself): what a live change and a scrape ask of it. A trait here, so the registry
/// does not depend on the NVMe front end that depends on it.
pub(crate) trait NvmeSide: Send + Sync + std::fmt::Debug {
    /// A live change's subsystem host lists (the rest of `[nvme]` applies at the next start).
    fn apply_hosts(&self, settings: &crate::config::nvme::NvmeSettings, targets: &[TargetConfig]);
    /// A live change's DH-HMAC-CHAP secrets: how many controllers were closed when they
    /// changed, `None` when they did not.
    fn apply_secrets(&self, settings: &crate::config::nvme::NvmeSettings) -> Option<usize>;
    /// Whether a live change keeps host authentication on every listener beyond loopback.
    fn check_exposure(
        &self,
        settings: &crate::config::nvme::NvmeSettings,
        insecure: bool,
    ) -> Result<(), crate::config::nvme::NvmeExposureError>;
    /// The `ipsan_nvme_*` series of a scrape.
    fn render_metrics(&self, e: &mut crate::metrics::Exposition);
    /// What `ipsan ctl nvme` prints.
    fn status(&self) -> serde_json::Value;
}

/// What [`Registry::register`] hands a new session.
#[derive(Debug)]
pub struct Registration {
    /// Cancelled to end the session (reinstatement, shutdown, `ipsan ctl session drop`).
    pub cancel: CancellationToken,
    /// The session's counters.
    pub stats: Arc<SessionStats>,
    /// The session cancels this once none of its commands runs any more (after its end).
    pub drained: CancellationToken,
    /// The session this login reinstates (RFC 7143 §6.3.5): cancelled once that session's
    /// commands have all finished or been aborted. The new session must not execute a
    /// command before (an old WRITE still running could land after its reissued copy).
    pub reinstates: Option<CancellationToken>,
}

/// What a logged-in session is (for `ipsan ctl sessions` and the metrics): never a key.
#[derive(Debug)]
pub struct SessionInfo {
    pub initiator: String,
    pub isid: [u8; 6],
    pub target: Option<String>,
    pub tsih: u16,
    pub peer: SocketAddr,
    pub local: Option<SocketAddr>,
    /// The operational parameters negotiated (RFC 7143 §13), as key=value.
    pub params: Vec<(String, String)>,
    /// Whether the login passed CHAP (set by [`Registry::register`] from the target).
    pub chap: bool,
    /// What the login proved (the CHAP user, the Seal secret): a login replaces this session
    /// only if it proves as much ([`Authentication::covers`]).
    pub auth: Authentication,
    /// The Seal session (cipher, counters, key epochs are read from it), when negotiated.
    pub seal: Option<Arc<SealSession>>,
    pub since: SystemTime,
}

impl SessionInfo {
    /// The record of a session that just completed its login.
    #[must_use]
    pub fn new(
        params: &SessionParams,
        isid: [u8; 6],
        tsih: u16,
        peer: SocketAddr,
        local: Option<SocketAddr>,
        seal: Option<Arc<SealSession>>,
    ) -> Self {
        let yn = |b: bool| if b { "Yes" } else { "No" }.to_owned();
        let digest = |b: bool| if b { "CRC32C" } else { "None" }.to_owned();
        let p = vec![
            ("HeaderDigest".into(), digest(params.header_digest)),
            ("DataDigest".into(), digest(params.data_digest)),
            ("ImmediateData".into(), yn(params.immediate_data)),
            ("InitialR2T".into(), yn(params.initial_r2t)),
            ("MaxBurstLength".into(), params.max_burst_length.to_string()),
            (
                "FirstBurstLength".into(),
                params.first_burst_length.to_string(),
            ),
            (
                "MaxRecvDataSegmentLength(initiator)".into(),
                params.initiator_max_recv_data_segment_length.to_string(),
            ),
            (
                "MaxRecvDataSegmentLength(target)".into(),
                params.target_max_recv_data_segment_length.to_string(),
            ),
            (
                "MaxOutstandingR2T".into(),
                params.max_outstanding_r2t.to_string(),
            ),
            (
                "ErrorRecoveryLevel".into(),
                params.error_recovery_level.to_string(),
            ),
        ];
        Self {
            initiator: params.initiator_name.clone(),
            isid,
            target: params.target_name.clone(),
            tsih,
            peer,
            local,
            params: p,
            chap: false,
            auth: Authentication::default(),
            seal,
            since: SystemTime::now(),
        }
    }

    /// The same record with what its login proved.
    #[must_use]
    pub fn with_auth(mut self, auth: Authentication) -> Self {
        self.auth = auth;
        self
    }
}

/// One session as `ipsan ctl sessions` lists it.
#[derive(Debug, Clone)]
pub struct SessionView {
    pub info: Arc<SessionInfo>,
    pub stats: Arc<SessionStats>,
    /// Its open connections (RFC 7143 §4.2, MaxConnections).
    pub connections: usize,
}

/// Shared state of the whole target.
#[derive(Debug)]
pub struct Registry {
    /// The live target list, swapped whole by [`Registry::apply`].
    targets: RwLock<Arc<Vec<Arc<Target>>>>,
    discovery_auth: RwLock<Auth>,
    /// `[discovery] enabled`: when false, discovery logins are refused (0x0209).
    discovery_enabled: std::sync::atomic::AtomicBool,
    sessions: Mutex<Sessions>,
    /// Counters that outlive sessions (metrics.rs).
    pub metrics: Metrics,
    /// The running configuration in file form (`None` when built in code); holding this lock
    /// serializes changes.
    running: Mutex<Option<FileConfig>>,
    /// The file `reload` and `save` use by default.
    pub config_path: Mutex<Option<std::path::PathBuf>>,
    /// The portals actually bound (port 0 resolved), set by the server.
    pub portals: RwLock<Vec<SocketAddr>>,
    /// `insecure_no_auth` as started: live changes are checked against it and the bound
    /// portals ([`crate::exposure`]; a changed `[server]` needs a restart).
    insecure_no_auth: bool,
    /// Login limits (docs/robustness.md, Security).
    pub limits: Limits,
    /// What the limits refused.
    pub stats: LimitStats,
    auth: Mutex<AuthLimiter>,
    conns: Mutex<AddressConnections>,
    /// The NVMe/TCP side, when it runs (crate::nvme): its controllers and namespace counters
    /// for the metrics.
    pub(crate) nvme: std::sync::OnceLock<Arc<dyn NvmeSide>>,
}

#[derive(Debug, Default)]
struct Sessions {
    by_key: HashMap<SessionKey, SessionEntry>,
    next_tsih: u16,
    /// Logins past the session-count check that have not registered yet, per initiator and
    /// strength.
    pending: HashMap<(String, Strength), usize>,
}

/// A session slot taken by a login that passed [`Registry::admit`]; it counts against
/// `max_sessions_per_initiator` until the session registers or the login fails (dropped), so
/// concurrent logins cannot overshoot.
#[derive(Debug)]
pub struct SessionSlot {
    registry: Arc<Registry>,
    /// (initiator, strength) counted in `pending`; `None` for a discovery session.
    counted: Option<(String, Strength)>,
    auth: Authentication,
}

impl SessionSlot {
    /// What the login that took this slot proved (for [`SessionInfo::with_auth`]).
    #[must_use]
    pub fn auth(&self) -> &Authentication {
        &self.auth
    }
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let Some(key) = self.counted.take() else {
            return;
        };
        let mut s = crate::lock(&self.registry.sessions);
        if let Some(n) = s.pending.get_mut(&key) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.pending.remove(&key);
            }
        }
    }
}

/// An open connection counted against `max_connections_per_address`; released on drop.
#[derive(Debug)]
pub struct AddressSlot {
    registry: Arc<Registry>,
    ip: IpAddr,
}

impl Drop for AddressSlot {
    fn drop(&mut self) {
        crate::lock(&self.registry.conns).close(self.ip);
    }
}

/// Errors opening LUN backends at start.
#[derive(Debug, thiserror::Error)]
#[error("{target} LUN {lun}: {why}")]
pub struct BuildError {
    pub target: String,
    pub lun: u64,
    pub why: String,
}

impl Registry {
    /// Opens every backend and builds the logical units.
    pub fn build(config: &Config) -> Result<Self, BuildError> {
        let mut targets = Vec::new();
        for t in &config.targets {
            targets.push(Arc::new(build_target(t, None, config.relative_port_id)?));
        }
        Ok(Self {
            targets: RwLock::new(Arc::new(targets)),
            discovery_auth: RwLock::new(
                config.discovery_chap.clone().map_or(Auth::None, Auth::Chap),
            ),
            discovery_enabled: std::sync::atomic::AtomicBool::new(config.discovery_enabled),
            sessions: Mutex::new(Sessions::default()),
            metrics: Metrics::default(),
            running: Mutex::new(config.source.clone()),
            config_path: Mutex::new(None),
            portals: RwLock::new(config.portals.clone()),
            insecure_no_auth: config.insecure_no_auth,
            limits: config.limits.clone(),
            stats: LimitStats::default(),
            auth: Mutex::new(AuthLimiter::new(config.limits.auth.clone())),
            conns: Mutex::new(AddressConnections::default()),
            nvme: std::sync::OnceLock::new(),
        })
    }

    /// Counts a new connection from `ip`; `None` when the address already has
    /// `max_connections_per_address` open.
    pub fn open_connection(self: &Arc<Self>, ip: IpAddr) -> Option<AddressSlot> {
        let max = self.limits.max_connections_per_address;
        if !crate::lock(&self.conns).try_open(ip, max) {
            let n = LimitStats::bump(&self.stats.address_limit_refusals);
            // Warn on the 1st, 2nd, 4th, 8th … refusal: a flood must not flood the log.
            if n.is_power_of_two() {
                tracing::warn!(%ip, refused_so_far = n, max, "connections from this address at max_connections_per_address; refusing");
            } else {
                tracing::debug!(%ip, "connection refused: max_connections_per_address");
            }
            return None;
        }
        Some(AddressSlot {
            registry: self.clone(),
            ip,
        })
    }

    /// Records an authentication failure of `initiator` from `ip` (limits.rs).
    pub fn auth_failure(&self, initiator: &str, ip: IpAddr) -> FailureVerdict {
        LimitStats::bump(&self.stats.auth_failures);
        crate::lock(&self.auth).failure(initiator, ip, Instant::now())
    }

    /// Records a successful login of `initiator` from `ip`.
    pub fn auth_success(&self, initiator: &str, ip: IpAddr) {
        crate::lock(&self.auth).success(initiator, ip);
    }

    /// Refuses a login that a running lockout covers (0x0301, RFC 7143 §11.13.5), before any
    /// CHAP is run or any Seal offer is answered.
    pub(crate) fn check_lockout(&self, initiator: &str, ip: IpAddr) -> Result<(), LoginFailure> {
        let locked = crate::lock(&self.auth).check(initiator, ip, Instant::now());
        match locked {
            None => Ok(()),
            Some(l) => {
                LimitStats::bump(&self.stats.lockout_rejects);
                let what = match l {
                    crate::limits::Lockout::Address(_) => "this address is",
                    crate::limits::Lockout::NameHere(_) => {
                        "this initiator name is, from this address,"
                    }
                };
                Err(LoginFailure::new(
                    LoginStatus::SERVICE_UNAVAILABLE,
                    format!(
                        "{what} locked out after repeated authentication failures ({} ms left)",
                        l.remaining().as_millis()
                    ),
                ))
            }
        }
    }

    /// Admits a login that completed everything else, before it is answered: refuses it if
    /// it would replace a session (same initiator, ISID and target: reinstatement, RFC 7143
    /// §6.3.5) that proved more than it did ([`Authentication::covers`]), then takes a session
    /// slot for it under `max_sessions_per_initiator`.
    ///
    /// A replacement that proves less gets 0x0201 (Authentication failure, RFC 7143
    /// §11.13.5): the name is authorized for the target (the allow-list said so, 0x0202 would
    /// be wrong), but the login did not authenticate as the identity that owns that I_T
    /// nexus; as a 0x0201 it counts toward the failure backoff and lockout (limits.rs). The
    /// old session is not touched.
    ///
    /// The quota counts, for a login of strength S, the initiator's sessions of strength S or
    /// more: a sealed login is never refused because of plaintext or CHAP sessions under its
    /// name (anyone may open those under `allowed`), a plaintext login counts everything. A
    /// name holds at most `max_sessions_per_initiator` sessions per strength. A full quota
    /// gets 0x0302 (Out of Resources: "the target has insufficient session, connection, or
    /// other resources"); 0x0206 (too many connections) is about connections within one
    /// session, so it does not fit. The session this login reinstates is not counted.
    pub fn admit(
        self: &Arc<Self>,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
        auth: &Authentication,
    ) -> Result<SessionSlot, LoginFailure> {
        let max = self.limits.max_sessions_per_initiator;
        let strength = auth.strength();
        let mut s = crate::lock(&self.sessions);
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        if let Some(old) = s.by_key.get(&key) {
            if !auth.covers(&old.info.auth) {
                let why = format!(
                    "would replace session TSIH {} authenticated by {}, with only {auth}",
                    old.tsih, old.info.auth
                );
                drop(s);
                LimitStats::bump(&self.stats.outranked_rejects);
                return Err(LoginFailure::new(LoginStatus::AUTHENTICATION_FAILURE, why));
            }
        }
        if target.is_none() {
            // Discovery sessions are not counted (they end after SendTargets).
            return Ok(SessionSlot {
                registry: self.clone(),
                counted: None,
                auth: auth.clone(),
            });
        }
        let live = s
            .by_key
            .iter()
            .filter(|(k, e)| {
                k.initiator == initiator
                    && k.target.is_some()
                    && **k != key
                    && e.info.auth.strength() >= strength
            })
            .count();
        let pending: usize = s
            .pending
            .iter()
            .filter(|((i, st), _)| i == initiator && *st >= strength)
            .map(|(_, n)| n)
            .sum();
        if live + pending >= max {
            drop(s);
            LimitStats::bump(&self.stats.session_limit_rejects);
            return Err(LoginFailure::new(
                LoginStatus::OUT_OF_RESOURCES,
                format!("{initiator} already has {live} sessions (+{pending} logging in) at least as strongly authenticated; max_sessions_per_initiator is {max}"),
            ));
        }
        let counted = (initiator.to_owned(), strength);
        *s.pending.entry(counted.clone()).or_insert(0) += 1;
        Ok(SessionSlot {
            registry: self.clone(),
            counted: Some(counted),
            auth: auth.clone(),
        })
    }

    /// The target named `iqn`, as it is now.
    #[must_use]
    pub fn target(&self, iqn: &str) -> Option<Arc<Target>> {
        crate::read(&self.targets)
            .iter()
            .find(|t| t.iqn == iqn)
            .cloned()
    }

    /// Every target, as they are now.
    #[must_use]
    pub fn targets(&self) -> Arc<Vec<Arc<Target>>> {
        crate::read(&self.targets).clone()
    }

    /// The discovery session's authentication, as it is now.
    #[must_use]
    pub fn discovery_auth(&self) -> Auth {
        crate::read(&self.discovery_auth).clone()
    }

    /// Records a new session after login; reinstates (ends) an older one with the same key.
    /// Returns the token that ends this session, the counters it keeps and, for a
    /// reinstatement, the token that tells when the old session's commands are done.
    ///
    /// Refuses (and leaves the older session running) when the older one proved more than
    /// `info.auth` ([`Authentication::covers`]): [`Registry::admit`] refused that before the
    /// login was answered, unless the older session registered in between.
    pub fn register(&self, mut info: SessionInfo) -> Result<Registration, Outranked> {
        let target = info.target.as_deref().and_then(|t| self.target(t));
        info.chap = target.as_ref().is_some_and(|t| {
            matches!(t.auth_for(&info.initiator), Ok(Auth::Chap(_) | Auth::Relay))
        });
        let key = SessionKey {
            initiator: info.initiator.clone(),
            isid: info.isid,
            target: info.target.clone(),
        };
        let luns = target.map(|t| t.lun_stats.clone());
        let stats = Arc::new(SessionStats::new(luns));
        let cancel = CancellationToken::new();
        let drained = CancellationToken::new();
        let tsih = info.tsih;
        let initiator = info.initiator.clone();
        let mut s = crate::lock(&self.sessions);
        if let Some(old) = s.by_key.get(&key) {
            if !info.auth.covers(&old.info.auth) {
                let why = format!(
                    "{initiator}: would replace session TSIH {} authenticated by {}, with only {}",
                    old.tsih, old.info.auth, info.auth
                );
                drop(s);
                LimitStats::bump(&self.stats.outranked_rejects);
                return Err(Outranked(why));
            }
        }
        if let Some(old) = s.by_key.insert(
            key,
            SessionEntry {
                tsih,
                cancel: cancel.clone(),
                drained: drained.clone(),
                info: Arc::new(info),
                stats: stats.clone(),
                core: None,
            },
        ) {
            tracing::info!(
                initiator,
                old_tsih = old.tsih,
                new_tsih = tsih,
                "session reinstatement"
            );
            old.cancel.cancel();
            return Ok(Registration {
                cancel,
                stats,
                drained,
                reinstates: Some(old.drained),
            });
        }
        Ok(Registration {
            cancel,
            stats,
            drained,
            reinstates: None,
        })
    }

    /// Counts a finished login (`status` `None` for success) under its target, when that
    /// target is configured ("" otherwise: names from the wire never become labels).
    pub fn count_login(&self, dir: &LoginDirectory, status: Option<u16>) {
        let declared = crate::lock(&dir.declared)
            .as_ref()
            .and_then(|(_, t)| t.clone())
            .filter(|t| self.target(t).is_some())
            .unwrap_or_default();
        self.metrics
            .login(&declared, crate::metrics::login_result(status));
    }

    /// Every logged-in session.
    #[must_use]
    pub fn sessions(&self) -> Vec<SessionView> {
        let entries: Vec<_> = crate::lock(&self.sessions)
            .by_key
            .values()
            .map(|e| (e.info.clone(), e.stats.clone(), e.core.clone()))
            .collect();
        // Counted outside the table's lock: a session's engine is never locked under it.
        let mut v: Vec<SessionView> = entries
            .into_iter()
            .map(|(info, stats, core)| SessionView {
                info,
                stats,
                connections: core
                    .and_then(|c| c.upgrade())
                    .map_or(1, |c| c.connections()),
            })
            .collect();
        v.sort_by_key(|e| e.info.tsih);
        v
    }

    /// Asks the sessions `pick` selects to log out (AsyncEvent 1, RFC 7143 §11.9.1); they
    /// stay until the initiator does. Returns how many were asked.
    pub fn request_logout(&self, pick: impl Fn(&SessionInfo) -> bool) -> usize {
        let s = crate::lock(&self.sessions);
        let mut n = 0;
        for e in s.by_key.values() {
            if pick(&e.info) {
                e.stats.logout.notify_one();
                n += 1;
            }
        }
        n
    }

    /// Ends the sessions `pick` selects (commands in flight finish first); returns how many.
    pub fn drop_sessions(&self, pick: impl Fn(&SessionInfo) -> bool) -> usize {
        let s = crate::lock(&self.sessions);
        let mut n = 0;
        for e in s.by_key.values() {
            if pick(&e.info) {
                e.cancel.cancel();
                n += 1;
            }
        }
        n
    }

    /// Forgets a session that ended (if it is still the registered one).
    pub fn unregister(&self, initiator: &str, isid: [u8; 6], target: Option<&str>, tsih: u16) {
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        let mut s = crate::lock(&self.sessions);
        if s.by_key.get(&key).is_some_and(|e| e.tsih == tsih) {
            s.by_key.remove(&key);
        }
    }

    /// Ends every session (shutdown).
    pub fn cancel_all(&self) {
        let s = crate::lock(&self.sessions);
        for e in s.by_key.values() {
            e.cancel.cancel();
        }
    }

    /// Number of sessions logged in.
    #[must_use]
    pub fn session_count(&self) -> usize {
        crate::lock(&self.sessions).by_key.len()
    }

    fn allocate_tsih(&self) -> u16 {
        let mut s = crate::lock(&self.sessions);
        loop {
            s.next_tsih = s.next_tsih.wrapping_add(1);
            let candidate = s.next_tsih;
            // TSIH 0 is reserved for "new session" (RFC 7143 §11.12.6).
            if candidate != 0 && !s.by_key.values().any(|e| e.tsih == candidate) {
                return candidate;
            }
        }
    }

    /// Records the shared state of a registered session's connections, so a login with its
    /// TSIH can join it.
    pub(crate) fn attach<C: SessionCore>(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
        tsih: u16,
        core: &Arc<C>,
    ) {
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        if let Some(e) = crate::lock(&self.sessions)
            .by_key
            .get_mut(&key)
            .filter(|e| e.tsih == tsih)
        {
            let core: std::sync::Weak<C> = Arc::downgrade(core);
            e.core = Some(core);
        }
    }

    /// The session a login with `tsih` joins: only the one of this initiator, ISID and target
    /// (RFC 7143 §5.3.4), and only while it runs.
    pub(crate) fn joining<C: SessionCore>(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
        tsih: u16,
    ) -> Option<Arc<C>> {
        if tsih == 0 {
            return None;
        }
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        crate::lock(&self.sessions)
            .by_key
            .get(&key)
            .filter(|e| e.tsih == tsih)
            .and_then(|e| e.core.as_ref())
            .and_then(std::sync::Weak::upgrade)
            .and_then(|core| core.into_any().downcast::<C>().ok())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(tsih: u16) -> SessionInfo {
        let params = iscsi_proto::params::SessionParams {
            initiator_name: "iqn.2026-11.x:ini".into(),
            target_name: Some("iqn.2026-11.x:a".into()),
            ..Default::default()
        };
        SessionInfo::new(
            &params,
            [0x80, 1, 2, 3, 4, 5],
            tsih,
            "127.0.0.1:1".parse().unwrap(),
            None,
            None,
        )
    }

    /// RFC 7143 §6.3.5: a login with the same InitiatorName, ISID and target ends the old
    /// session, and the new one learns when the old one's commands are all done.
    #[test]
    fn reinstating_login_ends_the_old_session_and_waits_for_its_commands() {
        let r = Registry::build(
            &crate::Config::from_toml(
                "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
            )
            .unwrap(),
        )
        .unwrap();
        let old = r.register(info(1)).unwrap();
        assert!(old.reinstates.is_none());
        let new = r.register(info(2)).unwrap();
        assert!(old.cancel.is_cancelled(), "the old session is told to end");
        let waits = new.reinstates.expect("a reinstatement");
        assert!(
            !waits.is_cancelled(),
            "the old session's commands still run"
        );
        old.drained.cancel();
        assert!(waits.is_cancelled());
        assert!(!new.cancel.is_cancelled());
        // The old session's late unregister leaves the new one registered.
        r.unregister(
            "iqn.2026-11.x:ini",
            [0x80, 1, 2, 3, 4, 5],
            Some("iqn.2026-11.x:a"),
            1,
        );
        assert_eq!(r.session_count(), 1);
    }

    fn registry(max_sessions: usize) -> Arc<Registry> {
        let mut c = crate::Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
        )
        .unwrap();
        c.limits.max_sessions_per_initiator = max_sessions;
        Arc::new(Registry::build(&c).unwrap())
    }

    const NONE: Authentication = Authentication {
        chap_user: None,
        seal: None,
    };

    fn chap(user: &str) -> Authentication {
        Authentication {
            chap_user: Some(user.into()),
            seal: None,
        }
    }

    fn sealed(which: crate::config::SealSecret) -> Authentication {
        Authentication {
            chap_user: None,
            seal: Some(which),
        }
    }

    /// The order of proofs: a replacement proves everything the old session proved.
    #[test]
    fn accepts_only_replacements_that_prove_as_much() {
        use crate::config::SealSecret::{Initiator, TargetWide};
        let both = Authentication {
            chap_user: Some("alice".into()),
            seal: Some(TargetWide),
        };
        for (new, old, ok) in [
            (&NONE, &NONE, true),
            (&chap("alice"), &NONE, true),
            (&NONE, &chap("alice"), false),
            (&chap("bob"), &chap("alice"), false),
            (&chap("alice"), &chap("alice"), true),
            (&sealed(TargetWide), &sealed(TargetWide), true),
            (&sealed(Initiator), &sealed(TargetWide), true),
            (&sealed(TargetWide), &sealed(Initiator), false),
            (&NONE, &sealed(TargetWide), false),
            (&chap("alice"), &sealed(TargetWide), false),
            (&sealed(TargetWide), &both, false),
            (&chap("alice"), &both, false),
            (&both, &both, true),
        ] {
            assert_eq!(new.covers(old), ok, "{new} replacing {old}");
        }
    }

    /// A login that would reinstate a sealed session without Seal is refused with 0x0201
    /// before it is answered, and again at registration if it raced past that; the sealed
    /// session is never told to end. The same proof reinstates it.
    #[test]
    fn rejects_a_weaker_reinstatement_and_leaves_the_old_session_running() {
        let r = registry(8);
        let own = sealed(crate::config::SealSecret::Initiator);
        let old = r.register(info(1).with_auth(own.clone())).unwrap();
        let isid = [0x80, 1, 2, 3, 4, 5];
        let f = r
            .admit("iqn.2026-11.x:ini", isid, Some("iqn.2026-11.x:a"), &NONE)
            .unwrap_err();
        assert_eq!(f.status, LoginStatus::AUTHENTICATION_FAILURE);
        assert!(r.register(info(2)).is_err(), "the raced registration");
        assert!(!old.cancel.is_cancelled(), "the sealed session runs on");
        assert_eq!(r.stats.snapshot().outranked_rejects, 2);
        // Another ISID is another session: no replacement, admitted.
        let other = r.admit(
            "iqn.2026-11.x:ini",
            [0x80, 9, 9, 9, 9, 9],
            Some("iqn.2026-11.x:a"),
            &NONE,
        );
        assert!(other.is_ok());
        let slot = r
            .admit("iqn.2026-11.x:ini", isid, Some("iqn.2026-11.x:a"), &own)
            .unwrap();
        let new = r.register(info(3).with_auth(slot.auth().clone())).unwrap();
        assert!(old.cancel.is_cancelled(), "the same proof reinstates");
        assert!(new.reinstates.is_some());
    }

    /// The quota counts, for a login, the name's sessions at least as strong as it: weaker
    /// sessions (and weaker logins in progress) never use up a stronger login's room.
    #[test]
    fn rejects_over_quota_only_among_sessions_at_least_as_strong() {
        let r = registry(2);
        let t = Some("iqn.2026-11.x:a");
        let ini = "iqn.2026-11.x:ini";
        let own = sealed(crate::config::SealSecret::Initiator);
        for (i, tsih) in [(1u8, 1u16), (2, 2)] {
            let mut x = info(tsih);
            x.isid[5] = i;
            r.register(x).unwrap();
        }
        let pending = r.admit(ini, [0x80, 0, 0, 0, 0, 3], t, &NONE);
        assert_eq!(
            pending.unwrap_err().status,
            LoginStatus::OUT_OF_RESOURCES,
            "plaintext counts every session"
        );
        let a = r.admit(ini, [0x80, 0, 0, 0, 0, 4], t, &own).unwrap();
        let b = r.admit(ini, [0x80, 0, 0, 0, 0, 5], t, &own).unwrap();
        assert_eq!(
            r.admit(ini, [0x80, 0, 0, 0, 0, 6], t, &own)
                .unwrap_err()
                .status,
            LoginStatus::OUT_OF_RESOURCES,
            "sealed logins in progress count for sealed logins"
        );
        drop((a, b));
        assert!(r.admit(ini, [0x80, 0, 0, 0, 0, 6], t, &own).is_ok());
    }
}
