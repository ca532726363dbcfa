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
        let s = crate::lock(&self.sessions);
        let mut v: Vec<SessionView> = s
            .by_key
            .values()
            .map(|e| SessionView {
                info: e.info.clone(),
                stats: e.stats.clone(),
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

    fn tsih_exists(&self, tsih: u16) -> bool {
        let s = crate::lock(&self.sessions);
        s.by_key.values().any(|e| e.tsih == tsih)
    }
}

/// Opens one LUN's backend and builds its logical unit.
fn build_lun(
    iqn: &str,
    l: &LunConfig,
    relative_port_id: u16,
) -> Result<(Arc<LogicalUnit>, Arc<dyn Backend>), BuildError> {
    let fail = |why: String| BuildError {
        target: iqn.to_owned(),
        lun: l.id,
        why,
    };
    let backend = ipsan_scsi::open(&l.backend).map_err(|e| fail(e.to_string()))?;
    // A shared store (an RBD image) names itself: every target exporting it reports the
    // same serial and NAA identifier (VPD 80h/83h), so multipath sees one disk.
    let serial = l
        .serial
        .clone()
        .unwrap_or_else(|| match backend.identity() {
            Some(id) => serial_for_identity(&id),
            None => serial_for(iqn, l.id),
        });
    let mut cfg = LuConfig::with_serial(&serial);
    cfg.block_size = l.block_size;
    cfg.read_only = l.read_only;
    cfg.write_cache = l.write_cache;
    cfg.relative_port = relative_port_id;
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::target_port_designator(
            iqn,
            PORTAL_GROUP_TAG,
        ));
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::relative_port_designator(
            relative_port_id,
        ));
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::target_port_group_designator(
            PORTAL_GROUP_TAG,
        ));
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::target_device_designator(iqn));
    let lu = LogicalUnit::new(backend.clone(), cfg).map_err(|e| fail(e.to_string()))?;
    Ok((Arc::new(lu), backend))
}

/// Builds a target; LUNs found in `reuse` (id → the running LU, its backend) are kept as
/// they are (same reservations, same unit attentions, same open file).
fn build_target(
    t: &TargetConfig,
    reuse: Option<(&Target, &std::collections::BTreeSet<u64>)>,
    relative_port_id: u16,
) -> Result<Target, BuildError> {
    let mut luns = BTreeMap::new();
    let mut backends = Vec::new();
    let mut lun_configs = BTreeMap::new();
    let lun_stats = reuse.map_or_else(
        || Arc::new(RwLock::new(BTreeMap::new())),
        |(old, _)| old.lun_stats.clone(),
    );
    let mut remotes = BTreeMap::new();
    for l in &t.luns {
        if let Some(r) = &l.remote {
            remotes.insert(l.id, r.clone());
            lun_configs.insert(l.id, l.clone());
            continue;
        }
        let kept = reuse.and_then(|(old, keep)| {
            keep.contains(&l.id).then(|| {
                let lu = old.luns.get(&l.id)?.clone();
                let be = old.backends.iter().find(|(id, _)| *id == l.id)?.1.clone();
                Some((lu, be))
            })?
        });
        let (lu, backend) = match kept {
            Some(x) => x,
            None => build_lun(&t.iqn, l, relative_port_id)?,
        };
        backends.push((l.id, backend));
        luns.insert(l.id, lu);
        lun_configs.insert(l.id, l.clone());
    }
    {
        let mut table = crate::write(&lun_stats);
        table.retain(|id, _| luns.contains_key(id));
        for (id, lu) in &luns {
            table
                .entry(*id)
                .or_insert_with(|| crate::metrics::lun_stats(lu.block_size()));
        }
    }
    Ok(Target {
        iqn: t.iqn.clone(),
        alias: t.alias.clone(),
        allow: t.allow.clone(),
        auth: if t.chap_relay() {
            Auth::Relay
        } else {
            t.chap.clone().map_or(Auth::None, Auth::Chap)
        },
        chap_hosts: t.chap_hosts.clone(),
        seal: t.seal.clone(),
        luns,
        backends,
        lun_configs,
        lun_stats,
        remotes,
    })
}

/// A stable serial number per target and LUN, so a restarted target presents the same disk.
/// The serial of a shared store: a hash of its identity (cluster, pool, image id).
fn serial_for_identity(identity: &str) -> String {
    let id = ipsan_scsi::inquiry::device_id_from(identity.as_bytes());
    let h = u64::from_be_bytes([id[8], id[9], id[10], id[11], id[12], id[13], id[14], id[15]]);
    format!("IPSANRBD{h:016X}")
}

fn serial_for(iqn: &str, lun: u64) -> String {
    // FNV-1a: stable across runs and builds (unlike std's hasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in iqn.bytes().chain(lun.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("IPSAN{h:016X}")
}

/// The [`Directory`] one login consults: target lookup, ACLs, CHAP lockouts, session
/// limits, TSIH. Lives for the whole login of one connection.
#[derive(Debug)]
pub struct LoginDirectory {
    pub registry: Arc<Registry>,
    /// The initiator's address, for the CHAP failure backoff.
    pub peer: IpAddr,
    /// (initiator name, target name) as declared in the first request, once consulted.
    declared: Mutex<Option<(String, Option<String>)>>,
    /// Whether the target (or discovery) this login asked for requires CHAP.
    chap: std::sync::atomic::AtomicBool,
    /// The CHAP user the login must answer for (the policy it was given).
    chap_user: Mutex<Option<String>>,
}

impl LoginDirectory {
    #[must_use]
    pub fn new(registry: Arc<Registry>, peer: IpAddr) -> Self {
        Self {
            registry,
            peer,
            declared: Mutex::new(None),
            chap: std::sync::atomic::AtomicBool::new(false),
            chap_user: Mutex::new(None),
        }
    }

    /// The initiator name the login declared, if the directory was consulted.
    #[must_use]
    pub fn initiator(&self) -> Option<String> {
        crate::lock(&self.declared).as_ref().map(|(i, _)| i.clone())
    }

    /// Whether this login had to pass CHAP (only then does its success clear failures).
    #[must_use]
    pub fn chap_required(&self) -> bool {
        self.chap.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The CHAP user of the policy this login was given (it proved that user's secret once
    /// the login completes), `None` without CHAP.
    #[must_use]
    pub fn chap_user(&self) -> Option<String> {
        crate::lock(&self.chap_user).clone()
    }

    fn declare(&self, initiator: &str, target: Option<&str>) {
        *crate::lock(&self.declared) = Some((initiator.to_owned(), target.map(str::to_owned)));
    }

    /// Marks this login as one that must authenticate (CHAP here, or relayed to the remote
    /// target) and records the CHAP user a local CHAP policy binds it to.
    fn require_chap(&self, auth: &Auth) {
        match auth {
            Auth::None => {}
            Auth::Chap(p) => {
                self.chap.store(true, std::sync::atomic::Ordering::Relaxed);
                *crate::lock(&self.chap_user) = Some(p.user.clone());
            }
            _ => self.chap.store(true, std::sync::atomic::Ordering::Relaxed),
        }
    }
}

impl Directory for LoginDirectory {
    fn target(
        &self,
        target_name: &str,
        initiator_name: &str,
    ) -> Result<TargetPolicy, LoginFailure> {
        self.declare(initiator_name, Some(target_name));
        let t = self.registry.target(target_name).ok_or_else(|| {
            LoginFailure::new(LoginStatus::NOT_FOUND, format!("no target {target_name}"))
        })?;
        if !t.allows(initiator_name) {
            return Err(LoginFailure::new(
                LoginStatus::AUTHORIZATION_FAILURE,
                format!("{initiator_name} is not on {target_name}'s allow-list"),
            ));
        }
        let auth = t.auth_for(initiator_name)?;
        if !matches!(auth, Auth::None) {
            self.require_chap(&auth);
            self.registry.check_lockout(initiator_name, self.peer)?;
        }
        Ok(TargetPolicy {
            auth,
            portal_group_tag: PORTAL_GROUP_TAG,
            alias: t.alias.clone(),
        })
    }

    fn discovery(&self, initiator_name: &str) -> Result<TargetPolicy, LoginFailure> {
        self.declare(initiator_name, None);
        if !self
            .registry
            .discovery_enabled
            .load(std::sync::atomic::Ordering::Relaxed)
        {
            return Err(LoginFailure::new(
                LoginStatus::SESSION_TYPE_NOT_SUPPORTED,
                "discovery sessions are disabled ([discovery] enabled = false)",
            ));
        }
        let auth = self.registry.discovery_auth();
        if matches!(auth, Auth::Chap(_)) {
            self.require_chap(&auth);
            self.registry.check_lockout(initiator_name, self.peer)?;
        }
        Ok(TargetPolicy {
            auth,
            portal_group_tag: PORTAL_GROUP_TAG,
            alias: None,
        })
    }

    fn assign_tsih(
        &mut self,
        _isid: [u8; 6],
        _ini: &str,
        requested: u16,
    ) -> Result<u16, LoginFailure> {
        if requested == 0 {
            // The session quota and the strength check come once the login has proved
            // everything it will (`Registry::admit`, from the connection).
            return Ok(self.registry.allocate_tsih());
        }
        // MaxConnections=1: a second connection for an existing session is refused.
        if self.registry.tsih_exists(requested) {
            Err(LoginFailure::new(
                LoginStatus::TOO_MANY_CONNECTIONS,
                "MaxConnections is 1",
            ))
        } else {
            Err(LoginFailure::new(
                LoginStatus::SESSION_DOES_NOT_EXIST,
                format!("no session with TSIH {requested}"),
            ))
        }
    }
}

// ---------------------------------------------------------------------------------------
// Live changes (`ipsan ctl`, SIGHUP reloads)

/// Why a configuration change was refused; nothing was changed.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// The new configuration does not validate (the field is named, as for a file).
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    /// The change is valid but would hurt running sessions without `force`, or cannot be
    /// done online.
    #[error("{field}: {why}")]
    Refused { field: String, why: String },
    /// The target was built in code, without a file form to edit.
    #[error("this target was not started from a configuration file form; nothing to edit")]
    NoSource,
}

fn refused(field: impl Into<String>, why: impl Into<String>) -> ChangeError {
    ChangeError::Refused {
        field: field.into(),
        why: why.into(),
    }
}

/// What an applied change did.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ChangeReport {
    /// One line per change (target added, LUN resized, …).
    pub changes: Vec<String>,
    /// Sessions ended by the change (removed targets, initiators no longer allowed).
    pub sessions_dropped: usize,
    /// Settings that changed in the file but only take effect at the next start.
    pub restart_needed: Vec<String>,
}

/// Whether two LUN configurations differ at most in size (a resize, not a replacement).
fn same_but_size(a: &LunConfig, b: &LunConfig) -> bool {
    let unsized_ = |l: &LunConfig| ipsan_scsi::BackendSpec {
        size: None,
        ..l.backend.clone()
    };
    a.id == b.id
        && unsized_(a) == unsized_(b)
        && a.block_size == b.block_size
        && a.read_only == b.read_only
        && a.write_cache == b.write_cache
        && a.serial == b.serial
}

/// Whether two Seal settings are the same (secrets compared in constant time).
fn same_seal(a: &crate::config::SealSettings, b: &crate::config::SealSettings) -> bool {
    let same_psk = |x: &Option<ipsan_seal::Psk>, y: &Option<ipsan_seal::Psk>| match (x, y) {
        (Some(x), Some(y)) => x.ct_eq(y),
        (None, None) => true,
        _ => false,
    };
    a.policy == b.policy
        && same_psk(&a.secret, &b.secret)
        && a.initiators.len() == b.initiators.len()
        && a.initiators
            .iter()
            .zip(&b.initiators)
            .all(|((n, p), (m, q))| n == m && p.ct_eq(q))
}

/// REPORTED LUNS DATA HAS CHANGED (SPC-4 §7.5.5 / Table 49: 3Fh/0Eh).
const REPORTED_LUNS_CHANGED: (u8, u8) = (0x3F, 0x0E);

impl Registry {
    /// The running configuration in file form (`None` when built in code).
    #[must_use]
    pub fn running_config(&self) -> Option<FileConfig> {
        crate::lock(&self.running).clone()
    }

    /// Edits the running configuration with `edit` and applies the result like a reload:
    /// validated as a file is, then swapped in atomically. Changes are serialized.
    pub fn change(
        &self,
        force: bool,
        edit: impl FnOnce(&mut FileConfig) -> Result<(), ChangeError>,
    ) -> Result<ChangeReport, ChangeError> {
        let mut running = crate::lock(&self.running);
        let r = (|| {
            let current = running.as_ref().ok_or(ChangeError::NoSource)?;
            let mut next = current.clone();
            edit(&mut next)?;
            let report = self.apply_locked(current, &next, force)?;
            Ok((next, report))
        })();
        let counter = match &r {
            Ok(_) => &self.metrics.config_changes,
            Err(ChangeError::Config(_)) => &self.metrics.config_changes_invalid,
            Err(_) => &self.metrics.config_changes_refused,
        };
        counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let (next, report) = r?;
        *running = Some(next);
        Ok(report)
    }

    /// Replaces the running configuration with `next` (a reload).
    pub fn apply(&self, next: FileConfig, force: bool) -> Result<ChangeReport, ChangeError> {
        self.change(force, |f| {
            *f = next;
            Ok(())
        })
    }

    fn apply_locked(
        &self,
        old_file: &FileConfig,
        new_file: &FileConfig,
        force: bool,
    ) -> Result<ChangeReport, ChangeError> {
        use std::collections::BTreeSet;
        let cfg = Config::from_file_config(new_file)?;
        // A listener beyond loopback authenticates: no change may add a target that
        // authenticates no host, or take the last authentication from one, while a bound
        // portal is beyond loopback (crate::exposure; `insecure_no_auth` as started).
        let portals = crate::read(&self.portals).clone();
        match crate::exposure::check(&cfg, &portals, self.insecure_no_auth) {
            Err(e) => {
                return Err(refused(
                    format!("target {}", e.targets.join(", ")),
                    e.to_string(),
                ))
            }
            Ok(warnings) => {
                for w in warnings {
                    if matches!(w, crate::exposure::ExposureWarning::Insecure { .. }) {
                        tracing::warn!("{w}");
                    }
                }
            }
        }
        let old = self.targets();
        let sessions = self.sessions();
        let in_use = |iqn: &str| {
            sessions
                .iter()
                .filter(|s| s.info.target.as_deref() == Some(iqn))
                .count()
        };
        let mut report = ChangeReport::default();
        if old_file.server != new_file.server {
            report
                .restart_needed
                .push("server (portals, limits, queue depth, TCP settings)".into());
        }

        // Plan and check everything before changing anything.
        for t in old.iter() {
            if !cfg.targets.iter().any(|n| n.iqn == t.iqn) {
                let n = in_use(&t.iqn);
                if n > 0 && !force {
                    return Err(refused(
                        format!("target {}", t.iqn),
                        format!("{n} session(s) logged in; force to remove it and drop them"),
                    ));
                }
                report.changes.push(format!("target {} removed", t.iqn));
            }
        }
        struct Plan {
            keep: BTreeSet<u64>,
            gone: Vec<u64>,
            grow: Vec<(Arc<LogicalUnit>, u64, String)>,
        }
        let mut plans = Vec::new();
        for (i, t) in cfg.targets.iter().enumerate() {
            let mut plan = Plan {
                keep: BTreeSet::new(),
                gone: Vec::new(),
                grow: Vec::new(),
            };
            let Some(o) = old.iter().find(|x| x.iqn == t.iqn) else {
                report.changes.push(format!(
                    "target {} added with LUN(s) {:?}",
                    t.iqn,
                    t.luns.iter().map(|l| l.id).collect::<Vec<_>>()
                ));
                plans.push(plan);
                continue;
            };
            let sessions_here = in_use(&t.iqn);
            for (j, l) in t.luns.iter().enumerate() {
                let field = format!("target[{i}].lun[{j}]");
                match o.lun_configs.get(&l.id) {
                    Some(ol) if same_but_size(ol, l) => {
                        plan.keep.insert(l.id);
                        let Some(lu) = o.luns.get(&l.id) else {
                            continue;
                        };
                        let now = lu.num_blocks() * u64::from(lu.block_size());
                        match l.backend.size {
                            Some(want) if want < now => {
                                return Err(refused(
                                    format!("{field}.backend"),
                                    format!("shrinking LUN {} from {now} to {want} bytes is refused: hosts may be using those blocks", l.id),
                                ))
                            }
                            Some(want) if want > now => {
                                if matches!(l.backend.kind, ipsan_scsi::BackendKind::Mem) {
                                    return Err(refused(
                                        format!("{field}.backend"),
                                        "a mem LUN cannot be resized online (file and null LUNs can)",
                                    ));
                                }
                                if want % u64::from(lu.block_size()) != 0 {
                                    return Err(refused(
                                        format!("{field}.backend"),
                                        format!("{want} bytes is not a whole number of {}-byte blocks", lu.block_size()),
                                    ));
                                }
                                plan.grow.push((lu.clone(), want, format!("{field}.backend")));
                                report.changes.push(format!(
                                    "target {} LUN {} resized from {now} to {want} bytes",
                                    t.iqn, l.id
                                ));
                            }
                            _ => {}
                        }
                    }
                    Some(_) => {
                        if sessions_here > 0 && !force {
                            return Err(refused(
                                field,
                                format!("LUN {} is in use by {sessions_here} session(s) and this change replaces it (only the size can change online); force to replace it", l.id),
                            ));
                        }
                        plan.gone.push(l.id);
                        report
                            .changes
                            .push(format!("target {} LUN {} replaced", t.iqn, l.id));
                    }
                    None => report
                        .changes
                        .push(format!("target {} LUN {} added", t.iqn, l.id)),
                }
            }
            for id in o.luns.keys() {
                if t.luns.iter().any(|l| l.id == *id) {
                    continue;
                }
                if sessions_here > 0 && !force {
                    return Err(refused(
                        format!("target[{i}].lun"),
                        format!("LUN {id} is in use by {sessions_here} session(s); force to remove it (hosts get REPORTED LUNS DATA HAS CHANGED)"),
                    ));
                }
                plan.gone.push(*id);
                report
                    .changes
                    .push(format!("target {} LUN {id} removed", t.iqn));
            }
            if o.allow != t.allow {
                report
                    .changes
                    .push(format!("target {} allow-list changed", t.iqn));
            }
            let chap_changed = match (&o.auth, &t.chap) {
                (Auth::Chap(a), Some(b)) => {
                    a.user != b.user
                        || !a.secret.ct_eq(&b.secret)
                        || a.mutual.as_ref().map(|m| &m.0) != b.mutual.as_ref().map(|m| &m.0)
                        || match (&a.mutual, &b.mutual) {
                            (Some(x), Some(y)) => !x.1.ct_eq(&y.1),
                            (None, None) => false,
                            _ => true,
                        }
                }
                (Auth::None, None) => false,
                _ => true,
            };
            let hosts_changed = o.chap_hosts.len() != t.chap_hosts.len()
                || o.chap_hosts.iter().zip(&t.chap_hosts).any(|(a, b)| {
                    a.names != b.names
                        || a.policy.user != b.policy.user
                        || !a.policy.secret.ct_eq(&b.policy.secret)
                });
            if chap_changed || hosts_changed {
                report.changes.push(format!(
                    "target {} CHAP changed (new logins; sessions logged in stay)",
                    t.iqn
                ));
            }
            if !same_seal(&o.seal, &t.seal) {
                report.changes.push(format!(
                    "target {} Seal settings changed (new logins; sessions logged in keep their keys)",
                    t.iqn
                ));
            }
            plans.push(plan);
        }

        // Open new backends (fallible, nothing visible yet).
        let mut built = Vec::new();
        for (i, (t, plan)) in cfg.targets.iter().zip(&plans).enumerate() {
            let o = old.iter().find(|x| x.iqn == t.iqn);
            let target = build_target(t, o.map(|o| (o.as_ref(), &plan.keep)), cfg.relative_port_id)
                .map_err(|e| {
                    let j = t.luns.iter().position(|l| l.id == e.lun).unwrap_or(0);
                    refused(format!("target[{i}].lun[{j}].backend"), e.why)
                })?;
            built.push(target);
        }
        // Grow files (I/O; a failure here stops before the swap, earlier grows stay: a
        // larger file is harmless and the LU reports its new size only once grown).
        for plan in &plans {
            for (lu, want, field) in &plan.grow {
                lu.grow(*want)
                    .map_err(|e| refused(field.clone(), format!("resize failed: {e}")))?;
            }
        }

        // Commit: one swap.
        for t in &built {
            let mut table = crate::write(&t.lun_stats);
            table.retain(|id, _| t.luns.contains_key(id));
            for (id, lu) in &t.luns {
                table
                    .entry(*id)
                    .or_insert_with(|| crate::metrics::lun_stats(lu.block_size()));
            }
        }
        let built: Vec<Arc<Target>> = built.into_iter().map(Arc::new).collect();
        *crate::write(&self.targets) = Arc::new(built.clone());
        *crate::write(&self.discovery_auth) =
            cfg.discovery_chap.clone().map_or(Auth::None, Auth::Chap);
        self.discovery_enabled
            .store(cfg.discovery_enabled, std::sync::atomic::Ordering::Relaxed);

        // Tell whom it concerns.
        for (t, plan) in built.iter().zip(&plans) {
            if !plan.gone.is_empty() {
                for lu in t.luns.values() {
                    lu.unit_attention_all(REPORTED_LUNS_CHANGED.0, REPORTED_LUNS_CHANGED.1);
                }
            }
        }
        let removed: Vec<String> = old
            .iter()
            .filter(|o| !built.iter().any(|n| n.iqn == o.iqn))
            .map(|o| o.iqn.clone())
            .collect();
        for iqn in &removed {
            self.metrics.forget_target(iqn);
        }
        report.sessions_dropped = self.drop_sessions(|s| match s.target.as_deref() {
            None => false,
            Some(iqn) => match built.iter().find(|t| t.iqn == iqn) {
                None => true,
                Some(t) => !t.allows(&s.initiator),
            },
        });
        // Flush what is no longer served (its last commands finish on their own Arcs).
        for o in old.iter() {
            for (id, backend) in &o.backends {
                let still = built
                    .iter()
                    .find(|n| n.iqn == o.iqn)
                    .and_then(|n| n.backends.iter().find(|(i, _)| i == id))
                    .is_some_and(|(_, b)| Arc::ptr_eq(b, backend));
                if !still {
                    if let Err(e) = backend.flush() {
                        tracing::warn!(target = %o.iqn, lun = id, "flush of a removed LUN failed: {e}");
                    }
                }
            }
        }
        for c in &report.changes {
            tracing::info!(change = %c, "configuration changed");
        }
        if report.sessions_dropped > 0 {
            tracing::info!(
                sessions = report.sessions_dropped,
                "sessions ended by the change"
            );
        }
        for r in &report.restart_needed {
            tracing::warn!(setting = %r, "changed in the configuration; takes effect at restart");
        }
        Ok(report)
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
