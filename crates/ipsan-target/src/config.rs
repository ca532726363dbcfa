//! Target configuration: the TOML file format and the flags of `ipsan target`, validated into
//! a [`Config`] before anything starts. A bad config is refused with a message that names the
//! field and why.
//!
//! ```toml
//! [server]
//! portals = ["127.0.0.1:3260"]    # default
//! max_connections = 1024
//! login_timeout_secs = 15
//! nop_interval_secs = 30          # NOP-In keepalive when idle; 0 = off
//! queue_depth = 128               # commands in flight per session (CmdSN window)
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

// The file form of the configuration. It is also the running configuration's canonical form:
// `ipsan ctl` edits it, validates it with [`Config::from_file_config`] exactly like a file,
// and `ipsan ctl save` writes it back (secrets stay `secret_file` references).
const fn is_false(b: &bool) -> bool {
    !*b
}

/// The whole TOML file (`docs/target.md`).
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileConfig {
    #[serde(default)]
    pub server: FileServer,
    #[serde(default, skip_serializing_if = "FileDiscovery::is_empty")]
    pub discovery: FileDiscovery,
    #[serde(default)]
    pub target: Vec<FileTarget>,
}

/// `[server]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileServer {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub portals: Option<Vec<String>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub login_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nop_interval_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub queue_depth: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub relative_port_id: Option<u16>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub crypto_workers: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_sessions_per_initiator: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_connections_per_address: Option<usize>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_pdu_timeout_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp: Option<ipsan_tcp::TcpSettings>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub auth_backoff: Option<FileAuthBackoff>,
    /// Serve targets that authenticate no host on portals beyond loopback, with a warning
    /// (default false: refused, [`crate::exposure`]).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub insecure_no_auth: Option<bool>,
}

/// `[server.auth_backoff]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileAuthBackoff {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name_free_failures: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub address_free_failures: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockout_base_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lockout_max_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_base_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub delay_max_ms: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forget_after_secs: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_tracked: Option<usize>,
}

/// `[discovery]`.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileDiscovery {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chap: Option<FileChap>,
    /// SendTargets discovery sessions (default true). Discovery is never sealed: it shows
    /// anyone who can claim an allowed initiator name (or holds the discovery CHAP secret)
    /// the names of the targets that name may use, in the clear (docs/seal.md §1). `false`
    /// refuses every discovery login with 0x0209 (session type not supported).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enabled: Option<bool>,
}

impl FileDiscovery {
    fn is_empty(&self) -> bool {
        self.chap.is_none() && self.enabled.is_none()
    }
}

/// One `[[target]]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileTarget {
    pub iqn: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub alias: Option<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub allow: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chap: Option<FileChap>,
    /// Per-host CHAP credentials, each bound to the initiator names it may claim.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub chap_host: Vec<FileChapHost>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seal: Option<FileSeal>,
    #[serde(default)]
    pub lun: Vec<FileLun>,
}

/// `[[target.chap_host]]`: one host's CHAP credential and the initiator names it may claim
/// (LIO binds CHAP to an ACL the same way). A name listed here logs in only with this
/// credential, never with the target's shared `[target.chap]` one.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileChapHost {
    /// The CHAP name (CHAP_N) the host presents.
    pub user: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// The InitiatorNames this credential may claim (exact names).
    pub names: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutual_user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutual_secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutual_secret_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithms: Option<Vec<String>>,
}

impl std::fmt::Debug for FileChapHost {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileChapHost")
            .field("user", &self.user)
            .field("secret", &redacted(&self.secret))
            .field("secret_file", &self.secret_file)
            .field("names", &self.names)
            .field("mutual_user", &self.mutual_user)
            .field("mutual_secret", &redacted(&self.mutual_secret))
            .field("mutual_secret_file", &self.mutual_secret_file)
            .field("algorithms", &self.algorithms)
            .finish()
    }
}

/// `[target.seal]`.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileSeal {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub policy: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub initiator: Vec<FileSealInitiator>,
}

/// `[[target.seal.initiator]]`.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileSealInitiator {
    pub name: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
}

/// `[target.chap]` or `[discovery.chap]`.
#[derive(Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileChap {
    pub user: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutual_user: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutual_secret: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub mutual_secret_file: Option<PathBuf>,
    /// CHAP_A algorithms accepted (default: SHA-256, SHA3-256, SHA-1; MD5 only when listed).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub algorithms: Option<Vec<String>>,
}

/// Inline secrets never reach `Debug` output (logs, errors, panics).
fn redacted(s: &Option<String>) -> Option<&'static str> {
    s.as_ref().map(|_| "<redacted>")
}

impl std::fmt::Debug for FileChap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileChap")
            .field("user", &self.user)
            .field("secret", &redacted(&self.secret))
            .field("secret_file", &self.secret_file)
            .field("mutual_user", &self.mutual_user)
            .field("mutual_secret", &redacted(&self.mutual_secret))
            .field("mutual_secret_file", &self.mutual_secret_file)
            .field("algorithms", &self.algorithms)
            .finish()
    }
}

impl std::fmt::Debug for FileSeal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSeal")
            .field("policy", &self.policy)
            .field("secret", &redacted(&self.secret))
            .field("secret_file", &self.secret_file)
            .field("initiator", &self.initiator)
            .finish()
    }
}

impl std::fmt::Debug for FileSealInitiator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileSealInitiator")
            .field("name", &self.name)
            .field("secret", &redacted(&self.secret))
            .field("secret_file", &self.secret_file)
            .finish()
    }
}

/// One `[[target.lun]]`.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileLun {
    pub id: u64,
    pub backend: String,
    /// rbd: ceph.conf (default: CEPH_CONF, then /etc/ceph/ceph.conf).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub conf: Option<PathBuf>,
    /// rbd: client id without `client.` (default: admin).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ceph_id: Option<String>,
    /// rbd: keyring path.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub keyring: Option<PathBuf>,
    /// rbd: librados/librbd options, e.g. `{ rbd_cache = "false" }`.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub options: std::collections::BTreeMap<String, toml::Value>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub block_size: Option<u32>,
    #[serde(default, skip_serializing_if = "is_false")]
    pub read_only: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub write_cache: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub serial: Option<String>,
    /// iscsi: Seal cipher of the remote leg (aes-256-gcm, chacha20-poly1305, ...); needs
    /// `secret_file`. Absent: the remote leg is plain.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seal: Option<String>,
    /// iscsi: Seal pre-shared secret of the remote leg (mode 0600).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub secret_file: Option<PathBuf>,
    /// iscsi: commands in flight on the remote session at most (default: its CmdSN window).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub depth: Option<usize>,
    /// iscsi: TCP congestion control of the remote connection (cubic, bbr, ipsan_sf, ...).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tcp_congestion: Option<String>,
    /// iscsi: CHAP user the gateway logs in to the remote target with.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chap_user: Option<String>,
    /// iscsi: file holding that CHAP user's secret (mode 0600).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub chap_secret_file: Option<PathBuf>,
    /// iscsi: relay each host's CHAP to the remote target, which authenticates the host
    /// with its own secret (docs/gateway.md); the gateway holds no host secret. Then every LUN
    /// of the target reaches this one remote target and the target has no CHAP of its own.
    #[serde(default, skip_serializing_if = "is_false")]
    pub chap_relay: bool,
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

/// Reads a Seal pre-shared secret from a file (mode checked: [`check_secret_file`]).
pub fn seal_secret_from_file(field: &str, path: &Path) -> Result<Psk, ConfigError> {
    ipsan_initiator::psk_from_file(path).map_err(|e| err(field, e.to_string()))
}

fn seal_psk(field: &str, inline: Option<&str>, file: Option<&Path>) -> Result<Psk, ConfigError> {
    match (inline, file) {
        (Some(s), None) => Psk::new(s.as_bytes().to_vec()).map_err(|e| err(field, e.to_string())),
        (None, Some(p)) => seal_secret_from_file(field, p),
        (Some(_), Some(_)) => Err(err(field, "give either secret or secret_file, not both")),
        (None, None) => Err(err(field, "a secret or secret_file is required")),
    }
}

fn seal_settings(field: &str, f: &FileSeal) -> Result<SealSettings, ConfigError> {
    let policy = match &f.policy {
        None => SealPolicy::Allowed,
        Some(p) => p.parse().map_err(|_| {
            err(
                format!("{field}.policy"),
                format!("{p:?}: expected off, allowed or required"),
            )
        })?,
    };
    let secret = match (&f.secret, &f.secret_file) {
        (None, None) => None,
        (s, p) => Some(seal_psk(
            &format!("{field}.secret"),
            s.as_deref(),
            p.as_deref(),
        )?),
    };
    let initiators = f
        .initiator
        .iter()
        .enumerate()
        .map(|(i, ini)| {
            Ok((
                ini.name.clone(),
                seal_psk(
                    &format!("{field}.initiator[{i}].secret"),
                    ini.secret.as_deref(),
                    ini.secret_file.as_deref(),
                )?,
            ))
        })
        .collect::<Result<Vec<_>, ConfigError>>()?;
    if policy == SealPolicy::Required && secret.is_none() && initiators.is_empty() {
        return Err(err(
            format!("{field}.policy"),
            "required, but no secret or initiator secrets are configured",
        ));
    }
    Ok(SealSettings {
        policy,
        secret,
        initiators,
    })
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
            relative_port_id: 1,
            crypto_workers: std::thread::available_parallelism()
                .map_or(2, std::num::NonZeroUsize::get),
            tcp: None,
            discovery_chap: None,
            discovery_enabled: true,
            targets: Vec::new(),
            limits: crate::limits::Limits::default(),
            insecure_no_auth: false,
            source: None,
        }
    }
}

fn parse_portal(field: &str, s: &str) -> Result<SocketAddr, ConfigError> {
    s.parse().map_err(|_| {
        err(
            field,
            format!("{s:?} is not an address:port (e.g. 127.0.0.1:3260)"),
        )
    })
}

/// Checks an iSCSI name (RFC 7143 §4.2.7): `iqn.`, `eui.` or `naa.` form, at most 223 bytes.
pub fn check_iqn(field: &str, iqn: &str) -> Result<(), ConfigError> {
    let ok_prefix = iqn.starts_with("iqn.") || iqn.starts_with("eui.") || iqn.starts_with("naa.");
    if !ok_prefix || iqn.len() > 223 || iqn.len() < 5 {
        return Err(err(
            field,
            format!("{iqn:?} is not an iSCSI name (iqn.YYYY-MM.reverse.domain:name)"),
        ));
    }
    if !iqn
        .bytes()
        .all(|c| c.is_ascii_alphanumeric() || b".-:".contains(&c))
        || iqn.bytes().any(|c| c.is_ascii_uppercase())
    {
        return Err(err(
            field,
            format!("{iqn:?} has characters an iSCSI name may not contain"),
        ));
    }
    Ok(())
}

fn load_secret(
    field: &str,
    inline: Option<&str>,
    file: Option<&Path>,
) -> Result<ChapSecret, ConfigError> {
    match (inline, file) {
        (Some(s), None) => {
            ChapSecret::new(s.as_bytes().to_vec()).map_err(|e| err(field, e.to_string()))
        }
        (None, Some(p)) => {
            check_secret_file(field, p)?;
            ChapSecret::from_file(p).map_err(|e| err(field, e.to_string()))
        }
        (Some(_), Some(_)) => Err(err(field, "give either secret or secret_file, not both")),
        (None, None) => Err(err(field, "a secret or secret_file is required")),
    }
}

fn chap_policy(field: &str, c: &FileChap) -> Result<ChapPolicy, ConfigError> {
    let secret = load_secret(
        &format!("{field}.secret"),
        c.secret.as_deref(),
        c.secret_file.as_deref(),
    )?;
    let mutual = match (
        &c.mutual_user,
        c.mutual_secret.is_some() || c.mutual_secret_file.is_some(),
    ) {
        (Some(u), true) => Some((
            u.clone(),
            load_secret(
                &format!("{field}.mutual_secret"),
                c.mutual_secret.as_deref(),
                c.mutual_secret_file.as_deref(),
            )?,
        )),
        (None, false) => None,
        _ => {
            return Err(err(
                format!("{field}.mutual_user"),
                "mutual CHAP needs both mutual_user and a mutual secret",
            ))
        }
    };
    if let Some((_, m)) = &mutual {
        if m.ct_eq(&secret) {
            // RFC 7143 §12.1.3: the two directions must use different secrets.
            return Err(err(
                format!("{field}.mutual_secret"),
                "must differ from the initiator's secret",
            ));
        }
    }
    let algorithms = match &c.algorithms {
        None => ChapAlgorithm::DEFAULT.to_vec(),
        Some(names) => names
            .iter()
            .map(|n| {
                ChapAlgorithm::from_name(n).ok_or_else(|| {
                    err(
                        format!("{field}.algorithms"),
                        format!(
                            "unknown CHAP algorithm {n:?}: expected sha256, sha3-256, sha1 or md5"
                        ),
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?,
    };
    Ok(ChapPolicy {
        user: c.user.clone(),
        secret,
        mutual,
        algorithms,
    })
}

/// The `[[target.chap_host]]` entries of `field`, checked: every name a valid iSCSI name bound
/// to one credential only, every user name with one secret only.
fn chap_hosts(field: &str, hosts: &[FileChapHost]) -> Result<Vec<HostChap>, ConfigError> {
    let mut out: Vec<HostChap> = Vec::new();
    let mut bound = std::collections::HashMap::new();
    for (k, h) in hosts.iter().enumerate() {
        let f = format!("{field}.chap_host[{k}]");
        if h.names.is_empty() {
            return Err(err(
                format!("{f}.names"),
                "list the initiator names this credential may claim",
            ));
        }
        for n in &h.names {
            check_iqn(&format!("{f}.names"), n)?;
            if let Some(prev) = bound.insert(n.clone(), h.user.clone()) {
                return Err(err(
                    format!("{f}.names"),
                    format!(
                        "{n} is already bound to CHAP user {prev:?}: a name has one credential"
                    ),
                ));
            }
        }
        if out.iter().any(|o| o.policy.user == h.user) {
            return Err(err(
                format!("{f}.user"),
                format!(
                    "CHAP user {:?} is configured twice: list all its names in one entry",
                    h.user
                ),
            ));
        }
        let policy = chap_policy(
            &f,
            &FileChap {
                user: h.user.clone(),
                secret: h.secret.clone(),
                secret_file: h.secret_file.clone(),
                mutual_user: h.mutual_user.clone(),
                mutual_secret: h.mutual_secret.clone(),
                mutual_secret_file: h.mutual_secret_file.clone(),
                algorithms: h.algorithms.clone(),
            },
        )?;
        out.push(HostChap {
            names: h.names.clone(),
            policy,
        });
    }
    Ok(out)
}

/// Parses `--chap-host NAME,USER,SECRET_FILE` flags into `[[target.chap_host]]` entries; one
/// user given for several names becomes one entry listing them (its file must be the same).
pub fn chap_hosts_from_flags(flags: &[String]) -> Result<Vec<FileChapHost>, ConfigError> {
    let mut out: Vec<FileChapHost> = Vec::new();
    for v in flags {
        let mut it = v.splitn(3, ',');
        let (Some(name), Some(user), Some(file)) = (it.next(), it.next(), it.next()) else {
            return Err(err(
                "--chap-host",
                format!("{v:?}: expected INITIATOR-NAME,CHAP-USER,SECRET-FILE"),
            ));
        };
        if user.is_empty() || file.is_empty() {
            return Err(err(
                "--chap-host",
                format!("{v:?}: expected INITIATOR-NAME,CHAP-USER,SECRET-FILE"),
            ));
        }
        let file = PathBuf::from(file);
        if let Some(e) = out.iter_mut().find(|e| e.user == user) {
            if e.secret_file.as_ref() != Some(&file) {
                return Err(err(
                    "--chap-host",
                    format!("CHAP user {user:?} is given with two secret files"),
                ));
            }
            e.names.push(name.to_owned());
            continue;
        }
        out.push(FileChapHost {
            user: user.to_owned(),
            secret: None,
            secret_file: Some(file),
            names: vec![name.to_owned()],
            mutual_user: None,
            mutual_secret: None,
            mutual_secret_file: None,
            algorithms: None,
        });
    }
    Ok(out)
}

/// The settings of a remote iSCSI LUN (`backend = "iscsi://host:port/iqn/lun"`).
fn remote_from(field: &str, l: &FileLun) -> Result<crate::remote::RemoteSpec, ConfigError> {
    let url = ipsan_initiator::IscsiUrl::parse(&l.backend)
        .map_err(|e| err(format!("{field}.backend"), e.to_string()))?;
    if url.target.is_none() || url.lun.is_none() {
        return Err(err(
            format!("{field}.backend"),
            "expected iscsi://host[:port]/target-iqn/lun",
        ));
    }
    if url.user.is_some() {
        return Err(err(
            format!("{field}.backend"),
            "no CHAP user in the URL: use chap_user and chap_secret_file",
        ));
    }
    let mut session = ipsan_initiator::SessionConfig {
        // A remote leg rides out WAN failures (docs/gateway.md): open-iscsi's
        // replacement_timeout, as `ipsan gateway --recovery-timeout` defaults to.
        recovery_timeout: Some(ipsan_initiator::recovery::DEFAULT_RECOVERY_TIMEOUT),
        ..ipsan_initiator::SessionConfig::default()
    };
    match (&l.chap_user, &l.chap_secret_file) {
        (None, None) => {}
        (Some(user), Some(path)) => {
            let secret = ipsan_initiator::ChapSecret::from_file(path)
                .map_err(|e| err(format!("{field}.chap_secret_file"), e.to_string()))?;
            session.login.chap = Some(ipsan_initiator::ChapCredentials {
                name: user.clone(),
                secret,
            });
        }
        _ => {
            return Err(err(
                format!("{field}.chap_user"),
                "chap_user and chap_secret_file go together",
            ))
        }
    }
    let seal = match (&l.seal, &l.secret_file) {
        (None, None) => None,
        (Some(name), Some(path)) => {
            let cipher = ipsan_seal::Cipher::from_name(name).ok_or_else(|| {
                err(
                    format!("{field}.seal"),
                    format!("{name:?}: expected aes-256-gcm, chacha20-poly1305, 3des-cbc-hmac-sha1 or none"),
                )
            })?;
            Some((
                cipher,
                seal_secret_from_file(&format!("{field}.secret_file"), path)?,
            ))
        }
        _ => {
            return Err(err(
                format!("{field}.seal"),
                "seal and secret_file go together",
            ))
        }
    };
    if let Some(d) = l.depth {
        if !(1..=4096).contains(&d) {
            return Err(err(format!("{field}.depth"), "must be in 1..=4096"));
        }
    }
    if let Some(c) = &l.tcp_congestion {
        let t = ipsan_tcp::TcpSettings {
            congestion: Some(c.clone()),
            nodelay: Some(true),
            ..ipsan_tcp::TcpSettings::default()
        };
        t.validate()
            .map_err(|e| err(format!("{field}.tcp_congestion"), e.to_string()))?;
        session.tcp = Some(t);
    }
    if l.chap_relay && l.chap_user.is_some() {
        return Err(err(
            format!("{field}.chap_relay"),
            "a relayed login answers CHAP with the host's credential: no chap_user",
        ));
    }
    let source = format!(
        "{} seal={} depth={} tcp={} chap={}",
        l.backend,
        l.seal.as_deref().unwrap_or("off"),
        l.depth.map_or("window".to_owned(), |d| d.to_string()),
        l.tcp_congestion.as_deref().unwrap_or("kernel"),
        if l.chap_relay {
            "relay"
        } else {
            l.chap_user.as_deref().unwrap_or("none")
        },
    );
    Ok(crate::remote::RemoteSpec {
        url,
        session,
        seal,
        depth: l.depth,
        source,
        chap_relay: l.chap_relay,
    })
}

fn lun_from(field: &str, l: &FileLun) -> Result<LunConfig, ConfigError> {
    let remote_only = l.seal.is_some()
        || l.secret_file.is_some()
        || l.depth.is_some()
        || l.tcp_congestion.is_some()
        || l.chap_user.is_some()
        || l.chap_secret_file.is_some()
        || l.chap_relay;
    if l.backend.starts_with("iscsi://") {
        let remote = remote_from(field, l)?;
        return Ok(LunConfig {
            id: l.id,
            backend: BackendSpec {
                kind: ipsan_scsi::BackendKind::Null,
                size: Some(0),
                block_size: None,
            },
            block_size: 512,
            read_only: l.read_only,
            write_cache: true,
            serial: None,
            remote: Some(std::sync::Arc::new(remote)),
        });
    }
    if remote_only {
        return Err(err(
            field.to_owned(),
            "seal, secret_file, depth, tcp_congestion, chap_user, chap_secret_file and chap_relay apply to iscsi:// backends only",
        ));
    }
    let mut backend: BackendSpec = l
        .backend
        .parse()
        .map_err(|e| err(format!("{field}.backend"), format!("{e}")))?;
    let rbd_only = l.conf.is_some() || l.ceph_id.is_some() || l.keyring.is_some();
    match &mut backend.kind {
        ipsan_scsi::BackendKind::Rbd(r) => {
            if let Some(c) = &l.conf {
                r.conf = Some(c.clone());
            }
            if let Some(i) = &l.ceph_id {
                r.id = Some(i.clone());
            }
            if let Some(k) = &l.keyring {
                r.keyring = Some(k.clone());
            }
            for (k, v) in &l.options {
                let v = match v {
                    toml::Value::String(s) => s.clone(),
                    toml::Value::Integer(_) | toml::Value::Float(_) | toml::Value::Boolean(_) => {
                        v.to_string()
                    }
                    _ => {
                        return Err(err(
                            format!("{field}.options.{k}"),
                            "must be a string, number or boolean",
                        ))
                    }
                };
                r.options.push((k.clone(), v));
            }
        }
        _ if rbd_only || !l.options.is_empty() => {
            return Err(err(
                field.to_owned(),
                "conf, ceph_id, keyring and options apply to rbd: backends only",
            ))
        }
        _ => {}
    }
    let block_size = l.block_size.or(backend.block_size).unwrap_or(512);
    if block_size != 512 && block_size != 4096 {
        return Err(err(format!("{field}.block_size"), "must be 512 or 4096"));
    }
    Ok(LunConfig {
        id: l.id,
        backend,
        block_size,
        read_only: l.read_only,
        write_cache: l.write_cache.unwrap_or(true),
        serial: l.serial.clone(),
        remote: None,
    })
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
                                    "LUNs reaching {} must share seal, depth, tcp_congestion and chap settings",
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

impl FileConfig {
    /// Parses TOML without validating it (see [`Config::from_file_config`]).
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        toml::from_str(text).map_err(|e| {
            let msg = e.message().to_owned();
            let at = e
                .span()
                .map(|s| format!("at byte {}", s.start))
                .unwrap_or_default();
            err(format!("config {at}").trim().to_owned(), msg)
        })
    }

    /// Reads and parses a file. A file holding inline secrets (`secret`, `mutual_secret`) is
    /// refused when anyone but its owner may read or write it, as a secret file would be.
    pub fn read(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| err(path.display().to_string(), e.to_string()))?;
        let f = Self::parse(&text)?;
        if let Some(field) = f.inline_secret_field() {
            iscsi_proto::secret_file::check_mode(path).map_err(|e| {
                err(
                    field,
                    format!(
                        "an inline secret in a file others can access: {e} (or use secret_file)"
                    ),
                )
            })?;
        }
        Ok(f)
    }

    /// The first field holding an inline secret, if any.
    fn inline_secret_field(&self) -> Option<String> {
        let chap = |c: &Option<FileChap>, at: &str| {
            c.as_ref().and_then(|c| {
                if c.secret.is_some() {
                    Some(format!("{at}.chap.secret"))
                } else if c.mutual_secret.is_some() {
                    Some(format!("{at}.chap.mutual_secret"))
                } else {
                    None
                }
            })
        };
        chap(&self.discovery.chap, "discovery").or_else(|| {
            self.target.iter().enumerate().find_map(|(i, t)| {
                let at = format!("target[{i}]");
                chap(&t.chap, &at).or_else(|| {
                    let s = t.seal.as_ref()?;
                    if s.secret.is_some() {
                        return Some(format!("{at}.seal.secret"));
                    }
                    s.initiator
                        .iter()
                        .position(|n| n.secret.is_some())
                        .map(|j| format!("{at}.seal.initiator[{j}].secret"))
                })
            })
        })
    }

    /// The TOML text (`ipsan ctl save`): what was given, secrets as given (file references
    /// stay references).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| err("config", e.to_string()))
    }

    /// The index of target `iqn`.
    #[must_use]
    pub fn target_index(&self, iqn: &str) -> Option<usize> {
        self.target.iter().position(|t| t.iqn == iqn)
    }
}

/// Refuses a secret file that anyone but its owner can read or write (a CHAP or Seal secret
/// readable by the group or the world is no secret). `chmod 600 FILE` fixes it.
pub fn check_secret_file(field: &str, path: &Path) -> Result<(), ConfigError> {
    iscsi_proto::secret_file::check_mode(path).map_err(|e| err(field, e.to_string()))
}

impl FileLun {
    /// LUN `id` on `backend` with every other field at its default.
    pub fn new(id: u64, backend: String) -> Self {
        Self {
            id,
            backend,
            conf: None,
            ceph_id: None,
            keyring: None,
            options: std::collections::BTreeMap::new(),
            block_size: None,
            read_only: false,
            write_cache: None,
            serial: None,
            seal: None,
            secret_file: None,
            depth: None,
            tcp_congestion: None,
            chap_user: None,
            chap_secret_file: None,
            chap_relay: false,
        }
    }

    /// The backend spec with its size set to `bytes` (`ipsan ctl lun resize`).
    pub fn resized_backend(&self, bytes: u64) -> Result<String, ConfigError> {
        let field = "backend";
        let (kind, rest) = self
            .backend
            .split_once(':')
            .ok_or_else(|| err(field, "not a backend spec"))?;
        let size = format_size(bytes);
        let mut parts: Vec<String> = rest.split(',').map(str::to_owned).collect();
        match kind {
            "file" => {
                parts.retain(|p| !p.starts_with("size="));
                parts.insert(1.min(parts.len()), format!("size={size}"));
            }
            "mem" | "null" => match parts.first_mut() {
                Some(first) => *first = size,
                None => parts.push(size),
            },
            other => return Err(err(field, format!("unknown backend kind {other:?}"))),
        }
        Ok(format!("{kind}:{}", parts.join(",")))
    }
}

/// A size as a backend spec writes it: the largest binary unit that divides it.
#[must_use]
pub fn format_size(bytes: u64) -> String {
    for (unit, shift) in [("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes % (1 << shift) == 0 {
            return format!("{}{unit}", bytes >> shift);
        }
    }
    bytes.to_string()
}

fn limits_from(f: &FileServer, l: &mut crate::limits::Limits) -> Result<(), ConfigError> {
    use std::time::Duration;
    let at_least_1 = |field: &str, v: u64| {
        if v == 0 {
            Err(err(field, "must be at least 1"))
        } else {
            Ok(v)
        }
    };
    if let Some(n) = f.max_sessions_per_initiator {
        l.max_sessions_per_initiator =
            at_least_1("server.max_sessions_per_initiator", n as u64)? as usize;
    }
    if let Some(n) = f.max_connections_per_address {
        l.max_connections_per_address =
            at_least_1("server.max_connections_per_address", n as u64)? as usize;
    }
    if let Some(s) = f.first_pdu_timeout_secs {
        l.first_pdu_timeout = Duration::from_secs(at_least_1("server.first_pdu_timeout_secs", s)?);
    }
    let Some(b) = &f.auth_backoff else {
        return Ok(());
    };
    let a = &mut l.auth;
    if let Some(n) = b.name_free_failures {
        a.name_free_failures = n;
    }
    if let Some(n) = b.address_free_failures {
        a.address_free_failures = n;
    }
    if let Some(ms) = b.lockout_base_ms {
        a.lockout_base =
            Duration::from_millis(at_least_1("server.auth_backoff.lockout_base_ms", ms)?);
    }
    if let Some(s) = b.lockout_max_secs {
        a.lockout_max = Duration::from_secs(s);
    }
    if let Some(ms) = b.delay_base_ms {
        a.delay_base = Duration::from_millis(ms);
    }
    if let Some(ms) = b.delay_max_ms {
        a.delay_max = Duration::from_millis(ms);
    }
    if let Some(s) = b.forget_after_secs {
        a.forget_after =
            Duration::from_secs(at_least_1("server.auth_backoff.forget_after_secs", s)?);
    }
    if let Some(n) = b.max_tracked {
        a.max_tracked = at_least_1("server.auth_backoff.max_tracked", n as u64)? as usize;
    }
    if a.lockout_max < a.lockout_base {
        return Err(err(
            "server.auth_backoff.lockout_max_secs",
            "must not be shorter than lockout_base_ms",
        ));
    }
    if a.delay_max > Duration::from_secs(10) {
        return Err(err(
            "server.auth_backoff.delay_max_ms",
            "at most 10000 (a held-back response keeps a connection open)",
        ));
    }
    Ok(())
}

/// Builds the LUN list of the command line's single target from `--lun` specs (ids 0, 1, …).
pub fn luns_from_specs(specs: &[String]) -> Result<Vec<LunConfig>, ConfigError> {
    specs
        .iter()
        .enumerate()
        .map(|(i, s)| lun_from(&format!("--lun {s}"), &FileLun::new(i as u64, s.clone())))
        .collect()
}

/// Applies `--ceph-conf` / `--ceph-id` to every `rbd:` LUN that does not name its own.
pub fn apply_ceph_flags(luns: &mut [LunConfig], conf: Option<&Path>, id: Option<&str>) {
    for l in luns {
        if let ipsan_scsi::BackendKind::Rbd(r) = &mut l.backend.kind {
            if r.conf.is_none() {
                r.conf = conf.map(Path::to_path_buf);
            }
            if r.id.is_none() {
                r.id = id.map(str::to_owned);
            }
        }
    }
}

/// Builds a CHAP policy from command-line values.
pub fn chap_from_flags(
    user: &str,
    secret_file: &Path,
    mutual: Option<(&str, &Path)>,
) -> Result<ChapPolicy, ConfigError> {
    chap_policy(
        "--chap",
        &FileChap {
            user: user.to_owned(),
            secret: None,
            secret_file: Some(secret_file.to_owned()),
            mutual_user: mutual.map(|(u, _)| u.to_owned()),
            mutual_secret: None,
            mutual_secret_file: mutual.map(|(_, p)| p.to_owned()),
            algorithms: None,
        },
    )
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
