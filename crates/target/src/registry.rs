//! What the running target knows: its targets with their LUNs and policies, and the sessions
//! that are logged in (for TSIH assignment and session reinstatement, RFC 7143 §6.3.5).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use ipsan_scsi::{Backend, LogicalUnit, LuConfig};
use iscsi_proto::login::{Auth, Directory, LoginFailure, LoginStatus, TargetPolicy};
use tokio_util::sync::CancellationToken;

use crate::config::{Config, TargetConfig};

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
}

#[derive(Debug, Default)]
struct Sessions {
    by_key: HashMap<SessionKey, SessionEntry>,
    next_tsih: u16,
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
            targets.push(Arc::new(build_target(t)?));
        }
        Ok(Self {
            targets,
            discovery_auth: config.discovery_chap.clone().map_or(Auth::None, Auth::Chap),
            sessions: Mutex::new(Sessions::default()),
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

fn build_target(t: &TargetConfig) -> Result<Target, BuildError> {
    let mut luns = BTreeMap::new();
    let mut backends = Vec::new();
    for l in &t.luns {
        let fail = |why: String| BuildError {
            target: t.iqn.clone(),
            lun: l.id,
            why,
        };
        let backend = ipsan_scsi::open(&l.backend).map_err(|e| fail(e.to_string()))?;
        let serial = l.serial.clone().unwrap_or_else(|| serial_for(&t.iqn, l.id));
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
            .push(ipsan_scsi::inquiry::relative_port_designator(1));
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
fn serial_for(iqn: &str, lun: u64) -> String {
    // FNV-1a: stable across runs and builds (unlike std's hasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in iqn.bytes().chain(lun.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("IPSAN{h:016X}")
}

/// The [`Directory`] a login consults: target lookup, ACLs, TSIH.
#[derive(Debug)]
pub struct LoginDirectory<'a> {
    pub registry: &'a Registry,
}

impl Directory for LoginDirectory<'_> {
    fn target(
        &self,
        target_name: &str,
        initiator_name: &str,
    ) -> Result<TargetPolicy, LoginFailure> {
        let t = self.registry.target(target_name).ok_or_else(|| {
            LoginFailure::new(LoginStatus::NOT_FOUND, format!("no target {target_name}"))
        })?;
        if !t.allows(initiator_name) {
            return Err(LoginFailure::new(
                LoginStatus::AUTHORIZATION_FAILURE,
                format!("{initiator_name} is not on {target_name}'s allow-list"),
            ));
        }
        Ok(TargetPolicy {
            auth: t.auth.clone(),
            portal_group_tag: PORTAL_GROUP_TAG,
            alias: t.alias.clone(),
        })
    }

    fn discovery(&self, _initiator_name: &str) -> Result<TargetPolicy, LoginFailure> {
        Ok(TargetPolicy {
            auth: self.registry.discovery_auth.clone(),
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
