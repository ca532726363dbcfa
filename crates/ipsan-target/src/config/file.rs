//! The file form of the configuration (parsing): the TOML sections as serde types. It is also
//! the running configuration's canonical form: `ipsan ctl` edits it, validates it with
//! [`Config::from_file_config`] exactly like a file, and `ipsan ctl save` writes it back
//! (secrets stay `secret_file` references).

use super::*;

pub(super) const fn is_false(b: &bool) -> bool {
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
    /// `[nvme]`: NVMe/TCP listeners and subsystem names (crate::config::nvme).
    #[serde(default, skip_serializing_if = "super::nvme::FileNvme::is_empty")]
    pub nvme: super::nvme::FileNvme,
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
    pub connections_per_session: Option<u32>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_recovery_level: Option<u32>,
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
    /// Agree to compress Seal data when an initiator offers it (docs/seal.md §4b).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub seal_compress: Option<bool>,
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
    pub(super) fn is_empty(&self) -> bool {
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
pub(super) fn redacted(s: &Option<String>) -> Option<&'static str> {
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
    /// iscsi: connections per remote session asked for (MaxConnections offered, RFC 7143
    /// §4.2), 1..=64, default 4: used when the far end grants several (ipsan does; tgtd and
    /// LIO answer 1); 1 never offers more (docs/gateway.md "Several connections").
    #[serde(skip_serializing_if = "Option::is_none")]
    pub connections: Option<u16>,
    /// iscsi: ErrorRecoveryLevel a remote session of several connections offers (RFC 7143
    /// §7.2, §13.20), 0 or 2, default 2 (`ipsan gateway --erl`): at 2 a lost connection's
    /// commands move to a live one where the far end grants it (docs/gateway.md).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error_recovery_level: Option<u32>,
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
    pub(super) fn inline_secret_field(&self) -> Option<String> {
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
            connections: None,
            error_recovery_level: None,
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
