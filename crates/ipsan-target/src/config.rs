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
mod tests {
    use super::*;

    /// A name with its own Seal secret gets only that one, however its letters are cased
    /// (iSCSI names are case-folded); other names get the target-wide secret.
    #[test]
    fn rejects_target_wide_secret_for_names_with_their_own() {
        let psk = |b: &[u8]| Psk::new(b.to_vec()).unwrap();
        let s = SealSettings {
            policy: SealPolicy::Allowed,
            secret: Some(psk(b"target-wide-secret-0123")),
            initiators: vec![(
                "iqn.2026-11.x:host-a".into(),
                psk(b"host-a-own-secret-0123"),
            )],
        };
        for name in ["iqn.2026-11.x:host-a", "IQN.2026-11.X:HOST-A"] {
            let (p, which) = s.secret_for(name).unwrap();
            assert_eq!(which, SealSecret::Initiator, "{name}");
            assert!(p.ct_eq(&psk(b"host-a-own-secret-0123")), "{name}");
        }
        let (p, which) = s.secret_for("iqn.2026-11.x:host-b").unwrap();
        assert_eq!(which, SealSecret::TargetWide);
        assert!(p.ct_eq(&psk(b"target-wide-secret-0123")));
    }

    fn remote_toml(key: &Path, lun1_extra: &str) -> String {
        format!(
            r#"
[[target]]
iqn = "iqn.2026-11.org.ipsan:gw"
[[target.lun]]
id = 0
backend = "iscsi://10.231.0.2:3260/iqn.2026-11.org.ipsan:disk0/0"
seal = "aes-256-gcm"
secret_file = "{k}"
depth = 8
[[target.lun]]
id = 1
backend = "iscsi://10.231.0.2:3260/iqn.2026-11.org.ipsan:disk0/1"
{lun1_extra}
"#,
            k = key.display()
        )
    }

    fn key_file(dir: &Path) -> PathBuf {
        let k = dir.join("wan.key");
        std::fs::write(&k, "0123456789abcdef0123456789abcdef").unwrap();
        std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        k
    }

    fn chap_host_toml(entries: &str) -> String {
        format!("[[target]]\niqn = \"iqn.2026-11.x:y\"\n{entries}[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n")
    }

    #[test]
    fn accepts_per_host_chap_bound_to_names() {
        let c = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"iqn.2026-11.x:a\", \"iqn.2026-11.x:a2\"]\n[[target.chap_host]]\nuser = \"b\"\nsecret = \"secret-of-host-b\"\nnames = [\"iqn.2026-11.x:b\"]\n",
        ))
        .unwrap();
        let h = &c.targets[0].chap_hosts;
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].policy.user, "a");
        assert_eq!(h[0].names, ["iqn.2026-11.x:a", "iqn.2026-11.x:a2"]);
        assert!(c.targets[0].chap.is_none());
        // The file form round-trips (ipsan ctl save).
        let again = Config::from_toml(&c.source.unwrap().to_toml().unwrap()).unwrap();
        assert_eq!(again.targets[0].chap_hosts.len(), 2);
    }

    #[test]
    fn rejects_a_name_bound_twice_a_user_twice_and_no_names() {
        let twice = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"iqn.2026-11.x:a\"]\n[[target.chap_host]]\nuser = \"b\"\nsecret = \"secret-of-host-b\"\nnames = [\"iqn.2026-11.x:a\"]\n",
        ))
        .unwrap_err();
        assert_eq!(twice.field, "target[0].chap_host[1].names");
        let user = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"iqn.2026-11.x:a\"]\n[[target.chap_host]]\nuser = \"a\"\nsecret = \"another-secret-a\"\nnames = [\"iqn.2026-11.x:b\"]\n",
        ))
        .unwrap_err();
        assert_eq!(user.field, "target[0].chap_host[1].user");
        let none = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = []\n",
        ))
        .unwrap_err();
        assert_eq!(none.field, "target[0].chap_host[0].names");
        let bad = Config::from_toml(&chap_host_toml(
            "[[target.chap_host]]\nuser = \"a\"\nsecret = \"secret-of-host-a\"\nnames = [\"host-a\"]\n",
        ))
        .unwrap_err();
        assert_eq!(bad.field, "target[0].chap_host[0].names");
    }

    #[test]
    fn accepts_chap_host_flags_merging_one_users_names() {
        let h = chap_hosts_from_flags(&[
            "iqn.2026-11.x:a,ua,/k/a".into(),
            "iqn.2026-11.x:a2,ua,/k/a".into(),
            "iqn.2026-11.x:b,ub,/k/b,with,commas".into(),
        ])
        .unwrap();
        assert_eq!(h.len(), 2);
        assert_eq!(h[0].names, ["iqn.2026-11.x:a", "iqn.2026-11.x:a2"]);
        assert_eq!(
            h[1].secret_file.as_deref(),
            Some(Path::new("/k/b,with,commas"))
        );
        assert!(chap_hosts_from_flags(&["iqn.2026-11.x:a,ua".into()]).is_err());
        assert!(chap_hosts_from_flags(&[
            "iqn.2026-11.x:a,ua,/k/a".into(),
            "iqn.2026-11.x:b,ua,/k/other".into()
        ])
        .is_err());
    }

    #[test]
    fn accepts_remote_iscsi_luns_mirroring_one_remote_target() {
        let dir = tempfile::tempdir().unwrap();
        let k = key_file(dir.path());
        let extra = format!(
            "seal = \"aes-256-gcm\"\nsecret_file = \"{}\"\ndepth = 8",
            k.display()
        );
        let c = Config::from_toml(&remote_toml(&k, &extra)).unwrap();
        let luns = &c.targets[0].luns;
        let r = luns[1].remote.as_ref().unwrap();
        assert_eq!(r.remote_lun(), 1);
        assert_eq!(r.depth, Some(8));
        assert_eq!(
            r.seal.as_ref().map(|(c, _)| *c),
            ipsan_seal::Cipher::from_name("aes-256-gcm")
        );
        assert_eq!(
            r.target_key(),
            "10.231.0.2:3260/iqn.2026-11.org.ipsan:disk0"
        );
        // The secret never shows in Debug.
        assert!(!format!("{r:?}").contains("0123456789abcdef"));
        let t = crate::registry::Registry::build(&c).unwrap().targets()[0].clone();
        assert!(t.luns.is_empty());
        assert_eq!(t.remotes.len(), 2);
        assert!(t.mirrored_remote().is_some());
        // A LUN the gateway does not list still goes to the mirrored remote target.
        assert_eq!(t.remote_route(7).map(|(_, l)| l), Some(7));
        assert_eq!(t.remote_targets().len(), 1);
    }

    #[test]
    fn accepts_a_remote_luns_error_recovery_level_and_rejects_1_or_one_on_a_local_lun() {
        let dir = tempfile::tempdir().unwrap();
        let k = key_file(dir.path());
        let both = |lun0: &str, lun1: &str| {
            remote_toml(&k, "").replace(
                "depth = 8\n[[target.lun]]",
                &format!("depth = 8\n{lun0}\n[[target.lun]]"),
            ) + &format!(
                "seal = \"aes-256-gcm\"\nsecret_file = \"{}\"\ndepth = 8\n{lun1}\n",
                k.display()
            )
        };
        let erl = |toml: &str| -> Vec<u32> {
            Config::from_toml(toml).unwrap().targets[0]
                .luns
                .iter()
                .map(|l| l.remote.as_ref().unwrap().error_recovery_level)
                .collect()
        };
        assert_eq!(erl(&both("", "")), [2, 2], "the default, as --erl's");
        let zero = "error_recovery_level = 0";
        assert_eq!(erl(&both(zero, zero)), [0, 0]);
        let e = Config::from_toml(&both(
            "error_recovery_level = 1",
            "error_recovery_level = 1",
        ))
        .unwrap_err();
        assert!(e.to_string().contains("must be 0 or 2"), "{e}");
        let e = Config::from_toml(&both(zero, "")).unwrap_err();
        assert!(e.to_string().contains("must share"), "{e}");
        let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\nerror_recovery_level = 2\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("iscsi:// backends only"), "{e}");
    }

    #[test]
    fn rejects_remote_luns_of_one_remote_target_with_different_settings() {
        let dir = tempfile::tempdir().unwrap();
        let k = key_file(dir.path());
        let e = Config::from_toml(&remote_toml(&k, "")).unwrap_err();
        assert!(e.to_string().contains("must share"), "{e}");
    }

    #[test]
    fn rejects_remote_settings_on_a_local_backend_and_a_url_without_lun() {
        let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\ndepth = 4\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("iscsi:// backends only"), "{e}");
        let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"iscsi://10.231.0.2/iqn.2026-11.org.ipsan:disk0\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("target-iqn/lun"), "{e}");
        let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"iscsi://10.231.0.2/iqn.2026-11.org.ipsan:disk0/0\"\nseal = \"aes-256-gcm\"\n",
        )
        .unwrap_err();
        assert!(e.to_string().contains("go together"), "{e}");
    }

    #[test]
    fn accepts_rbd_luns_with_ceph_settings_and_flags_fill_the_gaps() {
        let c = Config::from_toml(
            r#"
[server]
relative_port_id = 2
[[target]]
iqn = "iqn.2026-11.org.ipsan:rbd"
[[target.lun]]
id = 0
backend = "rbd:rbd/disk0,rbd_cache=false"
conf = "/etc/ceph/a.conf"
keyring = "/etc/ceph/a.keyring"
options = { rados_osd_op_timeout = 10, rbd_read_from_replica_policy = "balance" }
[[target.lun]]
id = 1
backend = "rbd:pool/ns/img"
"#,
        )
        .unwrap();
        assert_eq!(c.relative_port_id, 2);
        let mut luns = c.targets[0].luns.clone();
        apply_ceph_flags(&mut luns, Some(Path::new("/etc/ceph/b.conf")), Some("gw"));
        let rbd = |i: usize| match &luns[i].backend.kind {
            ipsan_scsi::BackendKind::Rbd(r) => r.clone(),
            other => panic!("{other:?}"),
        };
        let a = rbd(0);
        assert_eq!(
            a.conf.as_deref(),
            Some(Path::new("/etc/ceph/a.conf")),
            "the LUN's own wins"
        );
        assert_eq!(a.id.as_deref(), Some("gw"));
        assert_eq!(a.keyring.as_deref(), Some(Path::new("/etc/ceph/a.keyring")));
        assert!(a.options.contains(&("rbd_cache".into(), "false".into())));
        assert!(a
            .options
            .contains(&("rados_osd_op_timeout".into(), "10".into())));
        let b = rbd(1);
        assert_eq!(
            (b.pool.as_str(), b.namespace.as_deref(), b.image.as_str()),
            ("pool", Some("ns"), "img")
        );
        assert_eq!(b.conf.as_deref(), Some(Path::new("/etc/ceph/b.conf")));
    }

    #[test]
    fn rejects_ceph_settings_on_other_backends_and_port_id_zero() {
        let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:x\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\nconf = \"/x\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("rbd: backends only"), "{e}");
        let e = Config::from_toml("[server]\nrelative_port_id = 0\n")
            .unwrap_err()
            .to_string();
        assert!(e.contains("server.relative_port_id"), "{e}");
        let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.org.ipsan:x\"\n[[target.lun]]\nid = 0\nbackend = \"rbd:rbd/x,size=1GiB\"\n",
        )
        .unwrap_err()
        .to_string();
        assert!(e.contains("the image's"), "{e}");
    }

    #[test]
    fn accepts_full_example() {
        let dir = tempfile::tempdir().unwrap();
        let s = dir.path().join("s");
        std::fs::write(&s, "a-secret-of-16-bytes").unwrap();
        std::fs::set_permissions(&s, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let text = format!(
            r#"
[server]
portals = ["127.0.0.1:3261"]
queue_depth = 64
[[target]]
iqn = "iqn.2026-11.org.ipsan:a"
allow = ["iqn.1994-05.com.redhat:*"]
[target.chap]
user = "alice"
secret_file = "{}"
[[target.lun]]
id = 0
backend = "mem:64MiB"
[[target.lun]]
id = 3
backend = "null:1TiB"
block_size = 4096
"#,
            s.display()
        );
        let c = Config::from_toml(&text).unwrap();
        assert_eq!(c.portals[0].port(), 3261);
        assert_eq!(c.queue_depth, 64);
        assert_eq!(c.targets[0].luns[1].block_size, 4096);
        assert_eq!(c.targets[0].chap.as_ref().unwrap().user, "alice");
        assert!(
            !format!("{c:?}").contains("a-secret-of-16"),
            "secret leaked into Debug"
        );
    }

    #[test]
    fn accepts_limits_and_refuses_unsafe_values() {
        let base =
            "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n";
        let c = Config::from_toml(base).unwrap();
        assert_eq!(c.limits, crate::limits::Limits::default());
        let c = Config::from_toml(&format!(
            "[server]\nmax_sessions_per_initiator = 8\nmax_connections_per_address = 16\nfirst_pdu_timeout_secs = 2\n[server.auth_backoff]\nname_free_failures = 1\nlockout_base_ms = 250\nlockout_max_secs = 60\n{base}"
        ))
        .unwrap();
        assert_eq!(c.limits.max_sessions_per_initiator, 8);
        assert_eq!(c.limits.max_connections_per_address, 16);
        assert_eq!(c.limits.first_pdu_timeout.as_secs(), 2);
        assert_eq!(c.limits.auth.name_free_failures, 1);
        assert_eq!(c.limits.auth.lockout_base.as_millis(), 250);
        assert_eq!(c.limits.auth.lockout_max.as_secs(), 60);
        for (bad, field) in [
            (
                "[server]\nmax_sessions_per_initiator = 0\n",
                "server.max_sessions_per_initiator",
            ),
            (
                "[server]\nmax_connections_per_address = 0\n",
                "server.max_connections_per_address",
            ),
            (
                "[server]\nfirst_pdu_timeout_secs = 0\n",
                "server.first_pdu_timeout_secs",
            ),
            (
                "[server.auth_backoff]\nlockout_base_ms = 0\n",
                "server.auth_backoff.lockout_base_ms",
            ),
            (
                "[server.auth_backoff]\nlockout_base_ms = 5000\nlockout_max_secs = 1\n",
                "server.auth_backoff.lockout_max_secs",
            ),
            (
                "[server.auth_backoff]\ndelay_max_ms = 60000\n",
                "server.auth_backoff.delay_max_ms",
            ),
        ] {
            let e = Config::from_toml(&format!("{bad}{base}")).unwrap_err();
            assert_eq!(e.field, field, "{bad}");
        }
    }

    #[test]
    fn rejects_bad_fields_naming_them() {
        let e = Config::from_toml(
            "[[target]]\niqn = \"bad name\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n",
        )
        .unwrap_err();
        assert_eq!(e.field, "target[0].iqn");
        let e = Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid=0\nbackend=\"mem:lots\"\n",
        )
        .unwrap_err();
        assert_eq!(e.field, "target[0].lun[0].backend");
        let e = Config::from_toml("[[target]]\niqn = \"iqn.2026-11.x:y\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n").unwrap_err();
        assert_eq!(e.field, "target[0].lun[1].id");
        let e = Config::from_toml("[server]\nportals=[\"nowhere\"]\n").unwrap_err();
        assert_eq!(e.field, "server.portals");
        let e = Config::from_toml("[server]\nbogus = 1\n").unwrap_err();
        assert!(e.why.contains("bogus"), "{e}");
        let e = Config::from_toml("[[target]]\niqn = \"iqn.2026-11.x:y\"\n[target.chap]\nuser=\"u\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n").unwrap_err();
        assert_eq!(e.field, "target[0].chap.secret");
    }

    #[test]
    fn rejects_group_or_world_readable_secret_files_naming_the_field() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let s = dir.path().join("s");
        std::fs::write(&s, "a-secret-of-16-bytes").unwrap();
        let text = |kind: &str| {
            format!(
                "[[target]]\niqn = \"iqn.2026-11.x:y\"\n[target.{kind}]\n{}secret_file = \"{}\"\n[[target.lun]]\nid=0\nbackend=\"mem:1MiB\"\n",
                if kind == "chap" { "user = \"u\"\n" } else { "" },
                s.display()
            )
        };
        for (mode, ok) in [
            (0o644, false),
            (0o640, false),
            (0o604, false),
            (0o600, true),
            (0o400, true),
        ] {
            std::fs::set_permissions(&s, std::fs::Permissions::from_mode(mode)).unwrap();
            for (kind, field) in [
                ("chap", "target[0].chap.secret"),
                ("seal", "target[0].seal.secret"),
            ] {
                match Config::from_toml(&text(kind)) {
                    Ok(_) => assert!(ok, "{kind} secret with mode {mode:o} accepted"),
                    Err(e) => {
                        assert!(!ok, "{kind} secret with mode {mode:o} refused: {e}");
                        assert_eq!(e.field, field);
                        assert!(e.why.contains("chmod 600"), "{e}");
                    }
                }
            }
        }
    }

    #[test]
    fn accepts_its_own_saved_form() {
        let text = "[server]\nportals = [\"127.0.0.1:3261\"]\n[[target]]\niqn = \"iqn.2026-11.x:y\"\nallow = [\"iqn.a:*\"]\n[target.chap]\nuser = \"u\"\nsecret_file = \"/etc/ipsan/u.secret\"\n[[target.lun]]\nid = 0\nbackend = \"file:/tmp/x.img,size=1GiB\"\n[[target.lun]]\nid = 2\nbackend = \"mem:64MiB\"\nread_only = true\n";
        let f = FileConfig::parse(text).unwrap();
        let saved = f.to_toml().unwrap();
        assert_eq!(FileConfig::parse(&saved).unwrap(), f, "{saved}");
        assert!(
            saved.contains("secret_file = \"/etc/ipsan/u.secret\""),
            "{saved}"
        );
        assert_eq!(
            f.target[0].lun[0].resized_backend(2 << 30).unwrap(),
            "file:/tmp/x.img,size=2GiB"
        );
        assert_eq!(
            f.target[0].lun[1].resized_backend(96 << 20).unwrap(),
            "mem:96MiB"
        );
    }
}
