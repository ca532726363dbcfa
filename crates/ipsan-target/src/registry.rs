//! What the running target knows: its targets with their LUNs and policies, and the sessions
//! that are logged in (for TSIH assignment and session reinstatement, RFC 7143 §6.3.5).

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use ipsan_scsi::{Backend, LogicalUnit, LuConfig};
use iscsi_proto::login::{Auth, Directory, LoginFailure, LoginStatus, TargetPolicy};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, TargetConfig};
use crate::limits::{AddressConnections, AuthLimiter, FailureVerdict, LimitStats, Limits};

/// The portal group every portal of this target belongs to (RFC 7143 §13.9).
pub const PORTAL_GROUP_TAG: u16 = 1;

/// A target being served.
#[derive(Debug)]
pub struct Target {
    pub iqn: String,
    pub alias: Option<String>,
    pub allow: Vec<String>,
    pub auth: Auth,
    pub seal: crate::config::SealSettings,
    pub luns: BTreeMap<u64, Arc<LogicalUnit>>,
    /// The stores behind the LUNs, flushed at shutdown.
    pub backends: Vec<(u64, Arc<dyn Backend>)>,
}

impl Target {
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

#[derive(Debug)]
struct SessionEntry {
    tsih: u16,
    /// Cancelled to end the session (reinstatement or shutdown).
    cancel: CancellationToken,
}

/// Shared state of the whole target.
#[derive(Debug)]
pub struct Registry {
    pub targets: Vec<Arc<Target>>,
    pub discovery_auth: Auth,
    sessions: Mutex<Sessions>,
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
    /// Logins past the session-count check that have not registered yet, per initiator.
    pending: HashMap<String, usize>,
}

/// A session slot taken by a login that passed `max_sessions_per_initiator`; it counts until
/// the session registers or the login fails (dropped), so concurrent logins cannot overshoot.
#[derive(Debug)]
pub struct SessionSlot {
    registry: Arc<Registry>,
    initiator: String,
}

impl Drop for SessionSlot {
    fn drop(&mut self) {
        let mut s = crate::lock(&self.registry.sessions);
        if let Some(n) = s.pending.get_mut(&self.initiator) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                s.pending.remove(&self.initiator);
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
            targets.push(Arc::new(build_target(t, config.relative_port_id)?));
        }
        Ok(Self {
            targets,
            discovery_auth: config.discovery_chap.clone().map_or(Auth::None, Auth::Chap),
            sessions: Mutex::new(Sessions::default()),
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
    /// CHAP is run.
    fn check_lockout(&self, initiator: &str, ip: IpAddr) -> Result<(), LoginFailure> {
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

    /// Takes a session slot for `initiator`, or refuses with 0x0302 (Out of Resources,
    /// RFC 7143 §11.13.5: "the target has insufficient session, connection, or other
    /// resources") when it already holds `max_sessions_per_initiator` sessions. 0x0206 (too
    /// many connections) is about connections within one session, so it does not fit. The
    /// session this login reinstates (same initiator, ISID and target) is not counted.
    fn reserve_session(
        self: &Arc<Self>,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
    ) -> Result<SessionSlot, LoginFailure> {
        let max = self.limits.max_sessions_per_initiator;
        let mut s = crate::lock(&self.sessions);
        let live = s
            .by_key
            .keys()
            .filter(|k| {
                k.initiator == initiator
                    && k.target.is_some()
                    && !(k.isid == isid && k.target.as_deref() == target)
            })
            .count();
        let pending = s.pending.get(initiator).copied().unwrap_or(0);
        if live + pending >= max {
            drop(s);
            LimitStats::bump(&self.stats.session_limit_rejects);
            return Err(LoginFailure::new(
                LoginStatus::OUT_OF_RESOURCES,
                format!("{initiator} already has {live} sessions (+{pending} logging in); max_sessions_per_initiator is {max}"),
            ));
        }
        *s.pending.entry(initiator.to_owned()).or_insert(0) += 1;
        Ok(SessionSlot {
            registry: self.clone(),
            initiator: initiator.to_owned(),
        })
    }

    #[must_use]
    pub fn target(&self, iqn: &str) -> Option<&Arc<Target>> {
        self.targets.iter().find(|t| t.iqn == iqn)
    }

    /// Records a new session after login; reinstates (ends) an older one with the same key.
    pub fn register(
        &self,
        initiator: &str,
        isid: [u8; 6],
        target: Option<&str>,
        tsih: u16,
    ) -> CancellationToken {
        let key = SessionKey {
            initiator: initiator.to_owned(),
            isid,
            target: target.map(str::to_owned),
        };
        let cancel = CancellationToken::new();
        let mut s = crate::lock(&self.sessions);
        if let Some(old) = s.by_key.insert(
            key,
            SessionEntry {
                tsih,
                cancel: cancel.clone(),
            },
        ) {
            tracing::info!(
                initiator,
                old_tsih = old.tsih,
                new_tsih = tsih,
                "session reinstatement"
            );
            old.cancel.cancel();
        }
        cancel
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

fn build_target(t: &TargetConfig, relative_port_id: u16) -> Result<Target, BuildError> {
    let mut luns = BTreeMap::new();
    let mut backends = Vec::new();
    for l in &t.luns {
        let fail = |why: String| BuildError {
            target: t.iqn.clone(),
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
                None => serial_for(&t.iqn, l.id),
            });
        let mut cfg = LuConfig::with_serial(&serial);
        cfg.block_size = l.block_size;
        cfg.read_only = l.read_only;
        cfg.write_cache = l.write_cache;
        cfg.extra_designators
            .push(ipsan_scsi::inquiry::target_port_designator(
                &t.iqn,
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
            .push(ipsan_scsi::inquiry::target_device_designator(&t.iqn));
        backends.push((l.id, backend.clone()));
        let lu = LogicalUnit::new(backend, cfg).map_err(|e| fail(e.to_string()))?;
        luns.insert(l.id, Arc::new(lu));
    }
    Ok(Target {
        iqn: t.iqn.clone(),
        alias: t.alias.clone(),
        allow: t.allow.clone(),
        auth: t.chap.clone().map_or(Auth::None, Auth::Chap),
        seal: t.seal.clone(),
        luns,
        backends,
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
    /// Held from TSIH assignment until the session registers.
    slot: Option<SessionSlot>,
}

impl LoginDirectory {
    #[must_use]
    pub fn new(registry: Arc<Registry>, peer: IpAddr) -> Self {
        Self {
            registry,
            peer,
            declared: Mutex::new(None),
            chap: std::sync::atomic::AtomicBool::new(false),
            slot: None,
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

    /// The session slot taken for a new session (keep it until the session registers).
    pub fn take_slot(&mut self) -> Option<SessionSlot> {
        self.slot.take()
    }

    fn declare(&self, initiator: &str, target: Option<&str>) {
        *crate::lock(&self.declared) = Some((initiator.to_owned(), target.map(str::to_owned)));
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
        if matches!(t.auth, Auth::Chap(_)) {
            self.chap.store(true, std::sync::atomic::Ordering::Relaxed);
            self.registry.check_lockout(initiator_name, self.peer)?;
        }
        Ok(TargetPolicy {
            auth: t.auth.clone(),
            portal_group_tag: PORTAL_GROUP_TAG,
            alias: t.alias.clone(),
        })
    }

    fn discovery(&self, initiator_name: &str) -> Result<TargetPolicy, LoginFailure> {
        self.declare(initiator_name, None);
        if matches!(self.registry.discovery_auth, Auth::Chap(_)) {
            self.chap.store(true, std::sync::atomic::Ordering::Relaxed);
            self.registry.check_lockout(initiator_name, self.peer)?;
        }
        Ok(TargetPolicy {
            auth: self.registry.discovery_auth.clone(),
            portal_group_tag: PORTAL_GROUP_TAG,
            alias: None,
        })
    }

    fn assign_tsih(
        &mut self,
        isid: [u8; 6],
        ini: &str,
        requested: u16,
    ) -> Result<u16, LoginFailure> {
        if requested == 0 {
            let target = crate::lock(&self.declared)
                .as_ref()
                .and_then(|(_, t)| t.clone());
            if target.is_some() {
                self.slot = Some(
                    self.registry
                        .reserve_session(ini, isid, target.as_deref())?,
                );
            }
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
