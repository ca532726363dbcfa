//! Target configuration: the TOML file format and the flags of `ipsan target`, validated into
//! a [`Config`] before anything starts. A bad config is refused with a message that names the
//! field and why. Here the running configuration and its validation; `file` parses the file
//! form ([`FileConfig`]), `convert` turns its sections into this one, `flags` the command line
//! into the file form.
//!
//! ```toml
//! [server]
//! portals = ["127.0.0.1:3260"]    # default
//! max_connections = 1024
//! login_timeout_secs = 15
//! nop_interval_secs = 30          # NOP-In keepalive when idle; 0 = off
//! queue_depth = 128               # commands in flight per session (CmdSN window)
//! connections_per_session = 4     # MaxConnections offered (RFC 7143 §13.2); 1 = one per session
//! error_recovery_level = 0        # ErrorRecoveryLevel offered (RFC 7143 §13.20), 0..=2
//! max_sessions_per_initiator = 64 # per initiator name; more get login reject 0x0302
//! max_connections_per_address = 64  # open connections per source address (IPv6: per /64)
//! first_pdu_timeout_secs = 5      # close a connection with no complete Login Request by then
//! relative_port_id = 1            # VPD 83h port id: distinct per gateway sharing an RBD image
//!
//! [server.auth_backoff]           # CHAP failure backoff (crates/ipsan-target/src/limits.rs)
//! name_free_failures = 3          # failures of one name from one address before a lockout
//! address_free_failures = 10      # failures from one address (any name) before a lockout
//! lockout_base_ms = 1000          # first lockout, doubling per further failure
//! lockout_max_secs = 300
//! delay_base_ms = 100             # failing responses are held back, doubling per failure
//! delay_max_ms = 2000
//! forget_after_secs = 900         # a key with no failure this long is forgotten
//! max_tracked = 4096              # keys per table
//!
//! [server.tcp]                    # optional socket settings (docs/tcp.md)
//! congestion = "ipsan_sf"         # after `ipsan tcp load`; or cubic, bbr, reno
//! rcvbuf = 8388608                # bytes, or "kernel"
//! sndbuf = 8388608
//!
//! [discovery.chap]                # optional: CHAP for SendTargets discovery
//! user = "discover"
//! secret_file = "/etc/ipsan/discovery.secret"
//!
//! [[target]]
//! iqn = "iqn.2026-11.org.ipsan:disk0"
//! alias = "disk0"
//! allow = ["iqn.1994-05.com.redhat:*"]  # initiator allow-list (`*` suffix wildcard); empty = all
//!
//! [target.chap]
//! user = "alice"
//! secret_file = "/etc/ipsan/alice.secret"          # or: secret = "..."
//! mutual_user = "disk0"                            # optional mutual CHAP
//! mutual_secret_file = "/etc/ipsan/disk0.secret"
//!
//! [[target.chap_host]]           # per-host CHAP bound to the names it may claim (as LIO's
//! user = "host-a"                 # CHAP on an ACL): a host authenticating as host-a may log
//! secret_file = "/etc/ipsan/host-a.secret"   # in only as these names, and these names
//! names = ["iqn.1994-05.com.redhat:host-a"]  # only with this credential
//!
//! [target.seal]                  # Seal: encryption above SCSI (docs/seal.md)
//! policy = "allowed"              # off | allowed (default) | required
//! secret_file = "/etc/ipsan/seal.secret"          # default pre-shared secret for this target
//! [[target.seal.initiator]]       # per-initiator secrets override the default
//! name = "iqn.1994-05.com.redhat:host1"
//! secret_file = "/etc/ipsan/host1.seal"
//!
//! [[target.lun]]
//! id = 0
//! backend = "file:/var/lib/ipsan/disk0.img,size=10GiB"
//! block_size = 4096               # optional, default 512 (or bs= in the backend spec)
//! read_only = false
//! write_cache = true
//!
//! [[target.lun]]                  # a Ceph RBD image (docs/rbd.md)
//! id = 1
//! backend = "rbd:rbd/disk0"
//! conf = "/etc/ceph/ceph.conf"    # default: CEPH_CONF, then /etc/ceph/ceph.conf
//! ceph_id = "gateway"             # default admin
//! keyring = "/etc/ceph/ceph.client.gateway.keyring"
//! options = { rbd_cache = "false" }  # any librados/librbd option
//! ```

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ipsan_scsi::BackendSpec;
use ipsan_seal::{Psk, SealPolicy};
use iscsi_proto::chap::{ChapAlgorithm, ChapSecret};
use iscsi_proto::login::ChapPolicy;
use serde::{Deserialize, Serialize};

mod convert;
mod file;
mod flags;
pub mod nvme;

use convert::{chap_hosts, chap_policy, limits_from, lun_from, parse_portal, seal_settings};
pub use convert::{check_iqn, seal_secret_from_file};
pub use file::{
    check_secret_file, format_size, FileAuthBackoff, FileChap, FileChapHost, FileConfig,
    FileDiscovery, FileLun, FileSeal, FileSealInitiator, FileServer, FileTarget,
};
pub use flags::{apply_ceph_flags, chap_from_flags, chap_hosts_from_flags, luns_from_specs};

/// Whether hosts on other machines may reach `addr`: every address but loopback (127.0.0.0/8,
/// ::1, and ::ffff:127.0.0.0/104), so the wildcards 0.0.0.0 and :: are beyond loopback.
#[must_use]
pub fn beyond_loopback(addr: &SocketAddr) -> bool {
    !addr.ip().to_canonical().is_loopback()
}

/// The default target IQN when none is given.
pub const DEFAULT_IQN: &str = "iqn.2026-11.org.ipsan:disk0";
/// The default portal: loopback only, so a bare `ipsan target` exposes nothing.
pub const DEFAULT_PORTAL: &str = "127.0.0.1:3260";

/// A configuration error naming the field.
#[derive(Debug, thiserror::Error)]
#[error("{field}: {why}")]
pub struct ConfigError {
    pub field: String,
    pub why: String,
}

fn err(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        why: why.into(),
    }
}

/// One LUN to serve.
#[derive(Debug, Clone)]
pub struct LunConfig {
    pub id: u64,
    pub backend: BackendSpec,
    pub block_size: u32,
    pub read_only: bool,
    pub write_cache: bool,
    pub serial: Option<String>,
    /// A remote iSCSI LUN (`backend = "iscsi://…"`, docs/gateway.md): every command is
    /// forwarded to it; `backend` is then an unused placeholder.
    pub remote: Option<std::sync::Arc<crate::remote::RemoteSpec>>,
}

/// Seal settings of one target (docs/seal.md §2).
#[derive(Debug, Clone)]
pub struct SealSettings {
    pub policy: SealPolicy,
    /// Pre-shared secret for initiators without their own.
    pub secret: Option<Psk>,
    /// Per-initiator pre-shared secrets.
    pub initiators: Vec<(String, Psk)>,
}

impl Default for SealSettings {
    fn default() -> Self {
        Self {
            policy: SealPolicy::Allowed,
            secret: None,
            initiators: Vec::new(),
        }
    }
}

/// Which configured secret a sealed login proved (docs/seal.md §2, "Whose secret"): the
/// initiator's own, or the target-wide one. Ordered by what it proves: the target-wide secret
/// is a group secret (any holder may claim any name that has no secret of its own), a
/// per-initiator secret proves that one name.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum SealSecret {
    /// `[target.seal] secret`: shared by every initiator without its own.
    TargetWide,
    /// `[[target.seal.initiator]]`: this initiator name's own secret.
    Initiator,
}

impl SealSettings {
    /// The secret for `initiator`, if any.
    #[must_use]
    pub fn psk_for(&self, initiator: &str) -> Option<Psk> {
        self.secret_for(initiator).map(|(p, _)| p)
    }

    /// The secret for `initiator` and which one it is. A name with its own secret gets only
    /// that one: the target-wide secret never stands in for it, so its holders cannot claim
    /// the name. Names match without regard to ASCII case: iSCSI names are case-folded
    /// (RFC 7143 §4.2.7.2, RFC 3722), so `IQN.…:HOST-A` is `iqn.…:host-a` and must not fall
    /// back to the target-wide secret.
    #[must_use]
    pub fn secret_for(&self, initiator: &str) -> Option<(Psk, SealSecret)> {
        match self
            .initiators
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(initiator))
        {
            Some((_, p)) => Some((p.clone(), SealSecret::Initiator)),
            None => self.secret.clone().map(|p| (p, SealSecret::TargetWide)),
        }
    }
}

/// One target to serve.
#[derive(Debug, Clone)]
pub struct TargetConfig {
    pub iqn: String,
    pub alias: Option<String>,
    /// Initiator names allowed; `*` at the end matches any suffix. Empty allows all.
    pub allow: Vec<String>,
    pub chap: Option<ChapPolicy>,
    /// Per-host CHAP bound to initiator names (`[[target.chap_host]]`, `--chap-host`).
    pub chap_hosts: Vec<HostChap>,
    pub seal: SealSettings,
    pub luns: Vec<LunConfig>,
}

/// A CHAP credential bound to the initiator names its holder may claim, as LIO binds CHAP to
/// an ACL. A login declaring one of `names` must answer CHAP as `policy.user` with its secret;
/// the target's shared credential never authenticates these names.
#[derive(Debug, Clone)]
pub struct HostChap {
    pub names: Vec<String>,
    pub policy: ChapPolicy,
}

impl TargetConfig {
    /// How many distinct remote targets this target's LUNs reach.
    fn remote_target_count(&self) -> usize {
        let mut keys: Vec<String> = self
            .luns
            .iter()
            .filter_map(|l| l.remote.as_ref().map(|r| r.target_key()))
            .collect();
        keys.sort();
        keys.dedup();
        keys.len()
    }

    /// Whether hosts authenticate by CHAP relayed to the remote target (`chap_relay`).
    #[must_use]
    pub fn chap_relay(&self) -> bool {
        self.luns
            .iter()
            .any(|l| l.remote.as_ref().is_some_and(|r| r.chap_relay))
    }

    /// A target with default policies (no CHAP, all initiators, Seal allowed without secret).
    #[must_use]
    pub fn new(iqn: impl Into<String>, luns: Vec<LunConfig>) -> Self {
        Self {
            iqn: iqn.into(),
            alias: None,
            allow: Vec::new(),
            chap: None,
            chap_hosts: Vec::new(),
            seal: SealSettings::default(),
            luns,
        }
    }
}

/// Everything `ipsan target` needs, validated.
#[derive(Debug, Clone)]
pub struct Config {
    pub portals: Vec<SocketAddr>,
    pub max_connections: usize,
    pub login_timeout: std::time::Duration,
    pub nop_interval: Option<std::time::Duration>,
    pub queue_depth: u32,
    /// MaxConnections this target offers (RFC 7143 §13.2): a session gets the lower of this
    /// and the initiator's offer (the Linux initiator and libiscsi offer 1).
    pub connections_per_session: u32,
    /// ErrorRecoveryLevel this target offers (RFC 7143 §13.20, 0..=2; default 0): a session
    /// gets the lower of this and the initiator's offer. At 2 a session outlives its last
    /// connection by DefaultTime2Wait + DefaultTime2Retain, so a new connection can take its
    /// tasks over (TASK REASSIGN, §7.2).
    pub error_recovery_level: u32,
    /// RELATIVE TARGET PORT IDENTIFIER reported in VPD 83h (SPC-4 §7.8.6.6). Two ipsan
    /// processes exporting one shared image (RBD) must use distinct values, so a host's
    /// multipath sees one disk on two ports.
    pub relative_port_id: u16,
    /// Threads that seal and open Seal data (docs/seal.md §6).
    pub crypto_workers: usize,
    /// Socket settings for every connection (`[server.tcp]`: congestion, sndbuf, rcvbuf,
    /// nodelay, window_clamp; docs/tcp.md). `None`: kernel defaults with TCP_NODELAY.
    pub tcp: Option<ipsan_tcp::TcpSettings>,
    pub discovery_chap: Option<ChapPolicy>,
    /// Whether discovery sessions are served (`[discovery] enabled`, default true).
    pub discovery_enabled: bool,
    pub targets: Vec<TargetConfig>,
    /// Sessions per initiator, connections per address, CHAP failure backoff.
    pub limits: crate::limits::Limits,
    /// `[server] insecure_no_auth` / `--insecure-no-auth`: serve targets that authenticate no
    /// host beyond loopback, with a warning, instead of refusing to start
    /// ([`crate::exposure`]).
    pub insecure_no_auth: bool,
    /// `[server] seal_compress` / `--compress`: agree to compress Seal data (LZ4 per chunk,
    /// before sealing) when an initiator offers it (docs/seal.md §4b). Default false.
    pub seal_compress: bool,
    /// NVMe/TCP: listeners and subsystem NQNs (`[nvme]`, [`nvme`]); off by default.
    pub nvme: nvme::NvmeSettings,
    /// The file form this was validated from (`None` when built in code): what `ipsan ctl`
    /// edits and `ipsan ctl save` writes.
    pub source: Option<FileConfig>,
}

impl Default for Config {
    fn default() -> Self {
        Self {
            portals: Vec::new(),
            max_connections: 1024,
            login_timeout: std::time::Duration::from_secs(15),
            nop_interval: Some(std::time::Duration::from_secs(30)),
            queue_depth: 128,
            connections_per_session: 4,
            error_recovery_level: 0,
            relative_port_id: 1,
            crypto_workers: std::thread::available_parallelism()
                .map_or(2, std::num::NonZeroUsize::get),
            tcp: None,
            discovery_chap: None,
            discovery_enabled: true,
            targets: Vec::new(),
            limits: crate::limits::Limits::default(),
            insecure_no_auth: false,
            seal_compress: false,
            nvme: nvme::NvmeSettings::default(),
            source: None,
        }
    }
}

impl Config {
    /// Parses and validates a TOML config.
    pub fn from_toml(text: &str) -> Result<Self, ConfigError> {
        Self::from_file_config(&FileConfig::parse(text)?)
    }

    /// Validates the file form (the one path every configuration takes: the file, the
    /// command line, `ipsan ctl` edits and reloads).
    pub fn from_file_config(f: &FileConfig) -> Result<Self, ConfigError> {
        let mut c = Config::default();
        if let Some(p) = &f.server.portals {
            c.portals = p
                .iter()
                .map(|s| parse_portal("server.portals", s))
                .collect::<Result<_, _>>()?;
        }
        if let Some(n) = f.server.max_connections {
            if n == 0 {
                return Err(err("server.max_connections", "must be at least 1"));
            }
            c.max_connections = n;
        }
        if let Some(s) = f.server.login_timeout_secs {
            if s == 0 {
                return Err(err("server.login_timeout_secs", "must be at least 1"));
            }
            c.login_timeout = std::time::Duration::from_secs(s);
        }
        if let Some(s) = f.server.nop_interval_secs {
            c.nop_interval = (s > 0).then(|| std::time::Duration::from_secs(s));
        }
        if let Some(d) = f.server.queue_depth {
            if !(1..=4096).contains(&d) {
                return Err(err("server.queue_depth", "must be in 1..=4096"));
            }
            c.queue_depth = d;
        }
        if let Some(n) = f.server.connections_per_session {
            if !(1..=64).contains(&n) {
                return Err(err("server.connections_per_session", "must be in 1..=64"));
            }
            c.connections_per_session = n;
        }
        if let Some(n) = f.server.error_recovery_level {
            if n > 2 {
                return Err(err("server.error_recovery_level", "must be in 0..=2"));
            }
            c.error_recovery_level = n;
        }
        if let Some(id) = f.server.relative_port_id {
            if id == 0 {
                return Err(err(
                    "server.relative_port_id",
                    "must be in 1..=65535 (0 is reserved)",
                ));
            }
            c.relative_port_id = id;
        }
        if let Some(n) = f.server.crypto_workers {
            if !(1..=256).contains(&n) {
                return Err(err("server.crypto_workers", "must be in 1..=256"));
            }
            c.crypto_workers = n;
        }
        if let Some(t) = &f.server.tcp {
            t.validate().map_err(|e| err("server.tcp", e.to_string()))?;
            c.tcp = Some(t.clone());
        }
        limits_from(&f.server, &mut c.limits)?;
        c.insecure_no_auth = f.server.insecure_no_auth.unwrap_or(false);
        c.seal_compress = f.server.seal_compress.unwrap_or(false);
        c.discovery_enabled = f.discovery.enabled.unwrap_or(true);
        if let Some(ch) = &f.discovery.chap {
            c.discovery_chap = Some(chap_policy("discovery.chap", ch)?);
        }
        for (i, t) in f.target.iter().enumerate() {
            let field = format!("target[{i}]");
            check_iqn(&format!("{field}.iqn"), &t.iqn)?;
            let chap = t
                .chap
                .as_ref()
                .map(|ch| chap_policy(&format!("{field}.chap"), ch))
                .transpose()?;
            let chap_hosts = chap_hosts(&field, &t.chap_host)?;
            let luns = t
                .lun
                .iter()
                .enumerate()
                .map(|(j, l)| lun_from(&format!("{field}.lun[{j}]"), l))
                .collect::<Result<Vec<_>, _>>()?;
            let seal = t
                .seal
                .as_ref()
                .map(|s| seal_settings(&format!("{field}.seal"), s))
                .transpose()?
                .unwrap_or_default();
            c.targets.push(TargetConfig {
                iqn: t.iqn.clone(),
                alias: t.alias.clone(),
                allow: t.allow.clone(),
                chap,
                chap_hosts,
                seal,
                luns,
            });
        }
        c.nvme = nvme::NvmeSettings::from_file(&f.nvme, &c.targets)?;
        c.validate()?;
        c.source = Some(f.clone());
        Ok(c)
    }

    /// Cross-field checks shared by the file and the command line.
    pub fn validate(&mut self) -> Result<(), ConfigError> {
        if self.portals.is_empty() {
            self.portals.push(parse_portal("portal", DEFAULT_PORTAL)?);
        }
        if self.targets.is_empty() {
            return Err(err(
                "target",
                "no target configured (give --lun or a [[target]] table)",
            ));
        }
        let mut names = std::collections::HashSet::new();
        for (i, t) in self.targets.iter().enumerate() {
            if !names.insert(t.iqn.as_str()) {
                return Err(err(
                    format!("target[{i}].iqn"),
                    format!("{} is configured twice", t.iqn),
                ));
            }
            if t.luns.is_empty() {
                return Err(err(
                    format!("target[{i}].lun"),
                    "a target needs at least one LUN",
                ));
            }
            let relays = t
                .luns
                .iter()
                .filter(|l| l.remote.as_ref().is_some_and(|r| r.chap_relay))
                .count();
            if relays > 0 {
                // The remote target authenticates every host: nothing else may be reachable.
                if relays != t.luns.len() || t.remote_target_count() != 1 {
                    return Err(err(
                        format!("target[{i}].lun"),
                        "with chap_relay, every LUN of the target reaches one remote target with chap_relay",
                    ));
                }
                if t.chap.is_some() || !t.chap_hosts.is_empty() {
                    return Err(err(
                        format!("target[{i}].chap"),
                        "a target whose LUNs relay CHAP to the remote target has no CHAP of its own",
                    ));
                }
            }
            let mut ids = std::collections::HashSet::new();
            let mut remotes: std::collections::HashMap<String, &str> =
                std::collections::HashMap::new();
            for (j, l) in t.luns.iter().enumerate() {
                if let Some(r) = &l.remote {
                    // One session per host reaches every LUN of a remote target.
                    let settings = r.source.split_once(' ').map_or("", |(_, s)| s);
                    if let Some(prev) = remotes.insert(r.target_key(), settings) {
                        if prev != settings {
                            return Err(err(
                                format!("target[{i}].lun[{j}]"),
                                format!(
                                    "LUNs reaching {} must share seal, depth, tcp_congestion, chap, connections and error_recovery_level settings",
                                    r.target_key()
                                ),
                            ));
                        }
                    }
                }
                if l.id > 16383 {
                    return Err(err(
                        format!("target[{i}].lun[{j}].id"),
                        "LUN ids go up to 16383 (flat space addressing)",
                    ));
                }
                if !ids.insert(l.id) {
                    return Err(err(
                        format!("target[{i}].lun[{j}].id"),
                        format!("LUN {} is configured twice", l.id),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reads a config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        Self::from_file_config(&FileConfig::read(path)?)
    }
}

#[cfg(test)]
mod tests;
