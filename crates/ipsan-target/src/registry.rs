//! What the running target knows: its targets with their LUNs and policies, and the sessions
//! that are logged in (for TSIH assignment and session reinstatement, RFC 7143 §6.3.5).
//!
//! The target list is live: `ipsan ctl` and reloads swap in a new list atomically
//! ([`Registry::apply`]); connections look their target up per command, so a LUN added is
//! usable at once and a session of a target that did not change never notices.
//!
//! Files: this one holds the targets, the registry and its login limits; `registry/sessions.rs`
//! the session table (admission, registration, reinstatement, joining logins);
//! `registry/change.rs` live changes; `registry/build.rs` a target from its configuration;
//! `registry/directory.rs` what a login asks; `registry/tests.rs` the unit tests.

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
mod sessions;

use build::build_target;
pub use change::{ChangeError, ChangeReport};
pub use directory::LoginDirectory;
pub(crate) use sessions::SessionCore;
use sessions::Sessions;
pub use sessions::{
    Authentication, Outranked, Registration, SessionInfo, SessionSlot, SessionView, Strength,
};

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
}

#[cfg(test)]
mod tests;
