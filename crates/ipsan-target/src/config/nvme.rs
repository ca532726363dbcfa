//! The NVMe/TCP side of the target's configuration: the `[nvme]` table of the TOML file
//! ([`FileNvme`]), validated into [`NvmeSettings`], how a target's subsystem NQN is derived,
//! and the exposure rule for NVMe listeners.
//!
//! ```toml
//! [nvme]
//! listen = ["127.0.0.1:4420"]     # NVMe/TCP listeners; none (default) = NVMe/TCP off
//! in_capsule_data = 65536         # bytes of in-capsule data an I/O queue takes (IOCCSZ)
//!
//! [[nvme.subsystem]]              # optional, per target
//! target = "iqn.2026-11.org.ipsan:disk0"
//! nqn = "nqn.2026-11.org.ipsan:disk0"   # optional: an NQN other than the derived one
//! hosts = ["nqn.2014-08.org.nvmexpress:uuid:…"]  # optional: only these hosts may connect
//!
//! [[nvme.host]]                   # one host NQN's secrets
//! nqn = "nqn.2014-08.org.nvmexpress:uuid:…"
//! dhchap_secret_file = "/etc/ipsan/host1.dhchap"      # DH-HMAC-CHAP (TP 8006), DHHC-1:…:
//! dhchap_ctrl_secret_file = "/etc/ipsan/ctrl.dhchap" # optional: bidirectional
//! tls_key_file = "/etc/ipsan/host1.tlskey"           # TLS (TP 8011), NVMeTLSkey-1:…:
//! subsystems = ["nqn.2026-11.org.ipsan:disk0"]       # optional: only these (default: all)
//! ```
//!
//! Once any host has a DH-HMAC-CHAP secret, every host must authenticate, on every subsystem
//! and on the discovery controller: a host NQN without a secret for the subsystem it names
//! is refused at Connect (Connect Invalid Host). A `[[nvme.host]]` with `subsystems` serves
//! only those (subsystem NQNs, target IQNs, or the discovery NQN
//! `nqn.2014-08.org.nvmexpress.discovery`); one host NQN may have several entries for
//! different subsystems and one without `subsystems` for the rest. `[nvme] tls` is `off` (the default
//! without TLS keys), `required` (the default with them: a connection that does not start a
//! TLS handshake is closed) or `allowed` (either).
//!
//! Every `[[target]]` is one NVM subsystem; its NQN is the IQN with `iqn.` replaced by `nqn.`
//! (`iqn.2026-11.org.ipsan:disk0` → `nqn.2026-11.org.ipsan:disk0`), or
//! `nqn.2026-11.org.ipsan:` followed by the name for `eui.`/`naa.` names, unless
//! `[[nvme.subsystem]]` names another. Its local LUN *n* is namespace *n + 1* (docs/nvme.md).
//! A subsystem's `hosts` list narrows who may connect (Connect Invalid Host for others, on
//! top of the authentication above); it can be changed live (`ipsan ctl nvme hosts`).

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use nvme_proto::auth::{AuthConfig, DhchapSecret};
use nvme_proto::psk::{ConfiguredPsk, Derivation, PskStore};
use zeroize::Zeroizing;

use crate::config::{Config, ConfigError};

/// Default in-capsule data size of an I/O queue (the admin queue's is fixed at 8 KiB): a
/// 64 KiB write goes in its command capsule instead of waiting for an R2T round trip, which
/// made 64 KiB × 1 writes 0.6× iSCSI's (immediate data) at 8 KiB (docs/nvme.md "In-capsule
/// data", the sweep in docs/results/nvme-speed). 1 MiB, every write in its capsule, was slower
/// at 1 MiB × 16 writes (0.94× MiB/s, the target's CPU per GB 0.24 against 0.18,
/// docs/results/nvme-speed-11). A queue holds at most its entries (Connect's SQSIZE + 1,
/// ≤ 128) × this of in-capsule data: 8 MiB.
pub const DEFAULT_IN_CAPSULE: u32 = 64 * 1024;

/// The IANA port of NVMe/TCP I/O controllers (NVMe/TCP 1.0 §3.2; 8009 is discovery's).
pub const DEFAULT_NVME_PORT: u16 = 4420;

/// The prefix of derived NQNs for targets whose name is not an `iqn.` one.
pub const NQN_PREFIX: &str = "nqn.2026-11.org.ipsan:";

/// `[nvme]` in the file.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileNvme {
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub in_capsule_data: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsystem: Vec<FileNvmeSubsystem>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host: Vec<FileNvmeHost>,
    /// `off`, `allowed` or `required`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls: Option<String>,
    /// `false`: the discovery controller asks no host for DH-HMAC-CHAP (as Linux's nvmet),
    /// for hosts that cannot authenticate to one; default `true` once secrets are configured.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub discovery_auth: Option<bool>,
}

/// `[[nvme.host]]`: a host NQN and its DH-HMAC-CHAP secrets (files, mode 0600).
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileNvmeHost {
    pub nqn: String,
    /// The host's secret (`DHHC-1:…:`): the host proves it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhchap_secret_file: Option<std::path::PathBuf>,
    /// The controller's secret: with it the host may ask the target to prove itself too.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub dhchap_ctrl_secret_file: Option<std::path::PathBuf>,
    /// The host's configured TLS PSK (`NVMeTLSkey-1:…`), for every subsystem (the discovery
    /// subsystem too); version 0 identities are taken as libnvme derives them.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tls_key_file: Option<std::path::PathBuf>,
    /// The subsystems these secrets and key serve: subsystem NQNs, target IQNs, or the
    /// discovery NQN; empty: every subsystem without an entry of its own for this host, the
    /// discovery subsystem included.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subsystems: Vec<String>,
}

/// One host's DH-HMAC-CHAP secrets, for every subsystem or for some.
#[derive(Debug, Clone)]
pub struct HostSecrets {
    /// The host NQN.
    pub nqn: String,
    /// The subsystem NQNs they serve (resolved from the file's names); empty: every one.
    pub subsystems: Vec<String>,
    /// The host's secret and the controller's.
    pub auth: AuthConfig,
}

/// Whether connections use TLS 1.3 with a PSK (TP 8011).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TlsMode {
    /// Plain TCP only.
    Off,
    /// A connection whose first byte starts a TLS handshake gets one; others are plain.
    Allowed,
    /// Every connection must start with a TLS handshake; others are closed.
    Required,
}

impl FileNvme {
    /// Whether the table says nothing (then it is not written back).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self == &Self::default()
    }
}

/// `[[nvme.subsystem]]`: the NQN a target is served under and the hosts that may connect.
#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct FileNvmeSubsystem {
    /// The target's IQN.
    pub target: String,
    /// The subsystem NQN; default: derived from the IQN ([`derived_nqn`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nqn: Option<String>,
    /// Host NQNs allowed to connect (compared exactly); empty: every host the target's
    /// authentication lets in. Others are refused at Connect with Connect Invalid Host.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts: Vec<String>,
}

/// The validated NVMe/TCP settings.
#[derive(Debug, Clone)]
pub struct NvmeSettings {
    /// Listeners; empty: NVMe/TCP is off.
    pub listen: Vec<SocketAddr>,
    /// In-capsule data bytes of an I/O queue.
    pub in_capsule_data: u32,
    /// NQNs given explicitly: (IQN, NQN).
    pub nqns: Vec<(String, String)>,
    /// Host lists given explicitly: (IQN, allowed host NQNs); a target without one lets in
    /// every host the authentication policy does.
    pub allowed_hosts: Vec<(String, Vec<String>)>,
    /// DH-HMAC-CHAP secrets by host NQN (and subsystem); when any is configured every host
    /// must authenticate.
    pub hosts: Vec<HostSecrets>,
    /// TLS keys by host NQN.
    pub tls_keys: PskStore,
    pub tls: TlsMode,
    /// `[nvme] discovery_auth = false`: the discovery controller asks no host to
    /// authenticate (its log still lists only what the claimed host NQN has secrets for).
    pub discovery_open: bool,
}

impl Default for NvmeSettings {
    fn default() -> Self {
        Self {
            listen: Vec::new(),
            in_capsule_data: DEFAULT_IN_CAPSULE,
            nqns: Vec::new(),
            allowed_hosts: Vec::new(),
            hosts: Vec::new(),
            tls_keys: PskStore::new(),
            tls: TlsMode::Off,
            discovery_open: false,
        }
    }
}

fn err(field: impl Into<String>, why: impl Into<String>) -> ConfigError {
    ConfigError {
        field: field.into(),
        why: why.into(),
    }
}

/// The NQN derived from an iSCSI name: `iqn.` becomes `nqn.` (same date and naming
/// authority), any other form is appended to [`NQN_PREFIX`].
#[must_use]
pub fn derived_nqn(iqn: &str) -> String {
    match iqn.strip_prefix("iqn.") {
        Some(rest) => format!("nqn.{rest}"),
        None => format!("{NQN_PREFIX}{iqn}"),
    }
}

/// Checks an NQN (NVMe Base 2.0 §4.5): `nqn.` form, at most 223 bytes, printable ASCII, and
/// not the discovery subsystem's.
pub fn check_nqn(field: &str, nqn: &str) -> Result<(), ConfigError> {
    let printable = nqn.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if !nqn.starts_with("nqn.") || nqn.len() > 223 || nqn.len() < 5 || !printable {
        return Err(err(
            field,
            format!("{nqn:?} is not an NVMe qualified name (nqn.YYYY-MM.reverse.domain:name, at most 223 bytes)"),
        ));
    }
    if nqn == "nqn.2014-08.org.nvmexpress.discovery" {
        return Err(err(field, "the discovery subsystem's NQN is reserved"));
    }
    Ok(())
}

impl NvmeSettings {
    /// Validates `[nvme]` against the targets it serves.
    pub fn from_file(
        f: &FileNvme,
        targets: &[crate::config::TargetConfig],
    ) -> Result<Self, ConfigError> {
        let mut s = Self::default();
        for (i, l) in f.listen.iter().enumerate() {
            s.listen.push(l.parse().map_err(|_| {
                err(
                    format!("nvme.listen[{i}]"),
                    format!("{l:?} is not an address:port (e.g. 127.0.0.1:4420)"),
                )
            })?);
        }
        if let Some(n) = f.in_capsule_data {
            // IOCCSZ is in 16-byte units and covers the 64-byte SQE too; Linux maps up to
            // 1 MiB of in-capsule data.
            if n % 16 != 0 || n > 1 << 20 {
                return Err(err(
                    "nvme.in_capsule_data",
                    "must be a multiple of 16 bytes, at most 1MiB",
                ));
            }
            s.in_capsule_data = n;
        }
        for (i, sub) in f.subsystem.iter().enumerate() {
            let field = format!("nvme.subsystem[{i}]");
            if !targets.iter().any(|t| t.iqn == sub.target) {
                return Err(err(
                    format!("{field}.target"),
                    format!("no [[target]] is named {:?}", sub.target),
                ));
            }
            if f.subsystem[..i].iter().any(|o| o.target == sub.target) {
                return Err(err(
                    format!("{field}.target"),
                    format!("{} has two [[nvme.subsystem]] entries", sub.target),
                ));
            }
            if let Some(nqn) = &sub.nqn {
                check_nqn(&format!("{field}.nqn"), nqn)?;
                s.nqns.push((sub.target.clone(), nqn.clone()));
            }
            for (j, h) in sub.hosts.iter().enumerate() {
                check_host_nqn(&format!("{field}.hosts[{j}]"), h)?;
                if sub.hosts[..j].contains(h) {
                    return Err(err(
                        format!("{field}.hosts[{j}]"),
                        format!("{h} is listed twice"),
                    ));
                }
            }
            if !sub.hosts.is_empty() {
                s.allowed_hosts
                    .push((sub.target.clone(), sub.hosts.clone()));
            }
        }
        // Every subsystem's NQN, and the names a `[[nvme.host]] subsystems` entry may use.
        let served: Vec<(String, String)> = targets
            .iter()
            .map(|t| (t.iqn.clone(), s.nqn_for(&t.iqn)))
            .collect();
        let mut resolved: Vec<Vec<String>> = Vec::new();
        for (i, h) in f.host.iter().enumerate() {
            let field = format!("nvme.host[{i}]");
            check_host_nqn(&format!("{field}.nqn"), &h.nqn)?;
            let mut subs = Vec::new();
            for (j, name) in h.subsystems.iter().enumerate() {
                let nqn = if name == nvme_proto::controller::DISCOVERY_NQN {
                    name.clone()
                } else {
                    served
                        .iter()
                        .find(|(iqn, nqn)| iqn == name || nqn == name)
                        .map(|(_, nqn)| nqn.clone())
                        .ok_or_else(|| {
                            err(
                                format!("{field}.subsystems[{j}]"),
                                format!(
                                    "{name:?} is no subsystem served here (a subsystem NQN, a target's IQN, or {})",
                                    nvme_proto::controller::DISCOVERY_NQN
                                ),
                            )
                        })?
                };
                if subs.contains(&nqn) {
                    return Err(err(
                        format!("{field}.subsystems[{j}]"),
                        format!("{name} is listed twice"),
                    ));
                }
                subs.push(nqn);
            }
            // One entry per host for every subsystem, and at most one per host and subsystem.
            for (o, osubs) in f.host[..i].iter().zip(&resolved) {
                if o.nqn != h.nqn {
                    continue;
                }
                if subs.is_empty() && osubs.is_empty() {
                    return Err(err(
                        format!("{field}.nqn"),
                        format!("{} is configured twice for every subsystem", h.nqn),
                    ));
                }
                if let Some(both) = subs.iter().find(|n| osubs.contains(n)) {
                    return Err(err(
                        format!("{field}.subsystems"),
                        format!("{} has two entries for {both}", h.nqn),
                    ));
                }
            }
            resolved.push(subs.clone());
            match (&h.dhchap_secret_file, &h.dhchap_ctrl_secret_file, &h.tls_key_file) {
                (None, None, None) => {
                    return Err(err(field, "give dhchap_secret_file, tls_key_file or both"))
                }
                (None, Some(_), _) => {
                    return Err(err(
                        format!("{field}.dhchap_ctrl_secret_file"),
                        "needs dhchap_secret_file (bidirectional authentication is on top of the host's)",
                    ))
                }
                _ => {}
            }
            if let Some(p) = &h.dhchap_secret_file {
                let host = dhchap_secret(&format!("{field}.dhchap_secret_file"), p)?;
                let ctrl = h
                    .dhchap_ctrl_secret_file
                    .as_deref()
                    .map(|p| dhchap_secret(&format!("{field}.dhchap_ctrl_secret_file"), p))
                    .transpose()?;
                s.hosts.push(HostSecrets {
                    nqn: h.nqn.clone(),
                    subsystems: subs.clone(),
                    auth: AuthConfig::new(host, ctrl),
                });
            }
            if let Some(p) = &h.tls_key_file {
                // TP 8011: a PSK identity names the subsystem, so a key for some subsystems
                // keys only their identities (and the Connect must name the same one).
                let key = tls_key(&format!("{field}.tls_key_file"), p)?;
                if subs.is_empty() {
                    s.tls_keys.insert_host(&h.nqn, key, Derivation::Libnvme);
                } else {
                    for sub in &subs {
                        s.tls_keys
                            .insert_with(&h.nqn, sub, key.clone(), Derivation::Libnvme);
                    }
                }
            }
        }
        s.tls = match f.tls.as_deref() {
            None if s.tls_keys.is_empty() => TlsMode::Off,
            None | Some("required") => TlsMode::Required,
            Some("allowed") => TlsMode::Allowed,
            Some("off") => TlsMode::Off,
            Some(other) => {
                return Err(err(
                    "nvme.tls",
                    format!("{other:?}: expected off, allowed or required"),
                ))
            }
        };
        s.discovery_open = f.discovery_auth == Some(false);
        if s.tls != TlsMode::Off && s.tls_keys.is_empty() {
            return Err(err(
                "nvme.tls",
                "TLS needs a key: give a host tls_key_file ([[nvme.host]], --nvme-tls-key)",
            ));
        }
        let mut seen = std::collections::HashSet::new();
        for t in targets {
            let nqn = s.nqn_for(&t.iqn);
            check_nqn(&format!("the NQN of {}", t.iqn), &nqn)?;
            if !seen.insert(nqn.clone()) {
                return Err(err(
                    "nvme.subsystem",
                    format!("two targets would be served as {nqn}"),
                ));
            }
        }
        Ok(s)
    }

    /// Whether every host must authenticate (DH-HMAC-CHAP): once any host has a secret, on
    /// every subsystem and on the discovery controller.
    #[must_use]
    pub fn auth_required(&self) -> bool {
        !self.hosts.is_empty()
    }

    /// The hosts' DH-HMAC-CHAP secrets as the controller's policy: a host's secret for a
    /// subsystem, else its secret for every subsystem.
    #[must_use]
    pub fn dhchap_policy(&self) -> nvme_proto::controller::DhchapHosts {
        let mut p = nvme_proto::controller::DhchapHosts::new();
        for h in &self.hosts {
            if h.subsystems.is_empty() {
                p.insert(h.nqn.clone(), h.auth.clone());
            } else {
                for sub in &h.subsystems {
                    p.insert_for(h.nqn.clone(), sub.clone(), h.auth.clone());
                }
            }
        }
        p
    }

    /// The hosts allowed to connect to the subsystem of the target named `iqn`.
    #[must_use]
    pub fn hosts_for(&self, iqn: &str) -> nvme_proto::controller::AllowedHosts {
        self.allowed_hosts
            .iter()
            .find(|(t, _)| t == iqn)
            .map_or(nvme_proto::controller::AllowedHosts::Any, |(_, h)| {
                nvme_proto::controller::AllowedHosts::Only(h.clone())
            })
    }

    /// The subsystem NQN of the target named `iqn`.
    #[must_use]
    pub fn nqn_for(&self, iqn: &str) -> String {
        self.nqns
            .iter()
            .find(|(t, _)| t == iqn)
            .map_or_else(|| derived_nqn(iqn), |(_, n)| n.clone())
    }
}

/// Checks a host NQN (NVMe Base 2.0 §4.5): `nqn.` form, at most 223 bytes, printable ASCII.
pub fn check_host_nqn(field: &str, nqn: &str) -> Result<(), ConfigError> {
    let printable = nqn.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if !nqn.starts_with("nqn.") || nqn.len() > 223 || !printable {
        return Err(err(field, format!("{nqn:?} is not a host NQN")));
    }
    Ok(())
}

/// A `DHHC-1:` secret from a file only its owner can read; the file's bytes are wiped after.
fn dhchap_secret(field: &str, path: &std::path::Path) -> Result<DhchapSecret, ConfigError> {
    crate::config::check_secret_file(field, path)?;
    let text = Zeroizing::new(
        std::fs::read(path).map_err(|e| err(field, format!("{}: {e}", path.display())))?,
    );
    let text = std::str::from_utf8(&text).map_err(|_| err(field, "not a DHHC-1 secret"))?;
    DhchapSecret::parse(text).map_err(|e| err(field, e.to_string()))
}

/// A configured TLS PSK (`NVMeTLSkey-1:`) from a file only its owner can read.
fn tls_key(field: &str, path: &std::path::Path) -> Result<ConfiguredPsk, ConfigError> {
    crate::config::check_secret_file(field, path)?;
    let text = Zeroizing::new(
        std::fs::read(path).map_err(|e| err(field, format!("{}: {e}", path.display())))?,
    );
    let text = std::str::from_utf8(&text).map_err(|_| err(field, "not an NVMeTLSkey-1 key"))?;
    ConfiguredPsk::parse(text).map_err(|e| err(field, e.to_string()))
}

/// NVMe listeners beyond loopback that would serve subsystems nobody authenticates.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to serve NVMe/TCP on {listen}: it is beyond loopback and no host has to \
     authenticate, so any host that reaches it could connect under any host NQN and read and \
     write every namespace. Give each host a DH-HMAC-CHAP secret ([[nvme.host]], \
     --nvme-dhchap HOSTNQN,SECRET-FILE) or require TLS with its key (--nvme-tls-key \
     HOSTNQN,KEY-FILE), listen on loopback only (--nvme-listen \
     127.0.0.1:4420), or accept the risk with --insecure-no-auth ([server] insecure_no_auth = \
     true) (docs/nvme.md, \"Listening beyond loopback\")",
    listen = self.listen.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
)]
pub struct NvmeExposureError {
    pub listen: Vec<SocketAddr>,
}

/// The NVMe side of [`crate::exposure::check`]: a listener beyond loopback must
/// authenticate its hosts. With DH-HMAC-CHAP secrets configured every host proves one (hosts
/// without are refused at Connect); with TLS required every connection is keyed by a host's
/// PSK (and its Connect must name that host). Otherwise a listener beyond loopback is refused
/// unless `insecure_no_auth`, and `Ok` carries the warning to log then.
pub fn check_exposure(config: &Config) -> Result<Option<String>, NvmeExposureError> {
    let beyond: Vec<SocketAddr> = config
        .nvme
        .listen
        .iter()
        .copied()
        .filter(crate::config::beyond_loopback)
        .collect();
    // Every host proves a DH-HMAC-CHAP secret, or every connection is keyed by a host's TLS PSK.
    if beyond.is_empty() || config.nvme.auth_required() || config.nvme.tls == TlsMode::Required {
        return Ok(None);
    }
    if !config.insecure_no_auth {
        return Err(NvmeExposureError { listen: beyond });
    }
    Ok(Some(format!(
        "insecure_no_auth: NVMe/TCP on {} authenticates no host: any host that reaches it may \
         read its discovery log, connect and read and write every namespace",
        beyond
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    fn config(toml: &str) -> Result<Config, ConfigError> {
        Config::from_file_config(&FileConfig::parse(toml)?)
    }

    const TARGET: &str =
        "[[target]]\niqn = \"iqn.2026-11.org.ipsan:disk0\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n";

    #[test]
    fn accepts_a_target_without_nvme_as_nvme_off() {
        let c = config(TARGET).unwrap();
        assert!(c.nvme.listen.is_empty());
        assert_eq!(
            c.nvme.nqn_for("iqn.2026-11.org.ipsan:disk0"),
            "nqn.2026-11.org.ipsan:disk0"
        );
    }

    #[test]
    fn accepts_listeners_and_an_explicit_nqn() {
        let c = config(&format!(
            "{TARGET}[nvme]\nlisten = [\"127.0.0.1:4420\"]\nin_capsule_data = 16384\n[[nvme.subsystem]]\ntarget = \"iqn.2026-11.org.ipsan:disk0\"\nnqn = \"nqn.2026-11.com.example:vol\"\n"
        ))
        .unwrap();
        assert_eq!(c.nvme.listen, vec!["127.0.0.1:4420".parse().unwrap()]);
        assert_eq!(c.nvme.in_capsule_data, 16384);
        assert_eq!(
            c.nvme.nqn_for("iqn.2026-11.org.ipsan:disk0"),
            "nqn.2026-11.com.example:vol"
        );
    }

    #[test]
    fn derives_nqns_from_every_iscsi_name_form() {
        assert_eq!(
            derived_nqn("iqn.2026-11.org.ipsan:a"),
            "nqn.2026-11.org.ipsan:a"
        );
        assert_eq!(
            derived_nqn("eui.0123456789abcdef"),
            "nqn.2026-11.org.ipsan:eui.0123456789abcdef"
        );
    }

    #[test]
    fn rejects_bad_nvme_settings() {
        for (extra, field) in [
            ("[nvme]\nlisten = [\"nowhere\"]\n", "nvme.listen[0]"),
            ("[nvme]\nin_capsule_data = 100\n", "nvme.in_capsule_data"),
            (
                "[[nvme.subsystem]]\ntarget = \"iqn.2026-11.org.ipsan:other\"\nnqn = \"nqn.2026-11.x:y\"\n",
                "nvme.subsystem[0].target",
            ),
            (
                "[[nvme.subsystem]]\ntarget = \"iqn.2026-11.org.ipsan:disk0\"\nnqn = \"iqn.2026-11.x:y\"\n",
                "nvme.subsystem[0].nqn",
            ),
            (
                "[[nvme.subsystem]]\ntarget = \"iqn.2026-11.org.ipsan:disk0\"\nnqn = \"nqn.2014-08.org.nvmexpress.discovery\"\n",
                "nvme.subsystem[0].nqn",
            ),
        ] {
            let e = config(&format!("{TARGET}{extra}")).unwrap_err();
            assert_eq!(e.field, field, "{extra}: {e}");
        }
    }

    #[test]
    fn accepts_a_host_list_per_subsystem_and_rejects_bad_ones() {
        const H: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001";
        let c = config(&format!(
            "{TARGET}[[nvme.subsystem]]\ntarget = \"iqn.2026-11.org.ipsan:disk0\"\nhosts = [\"{H}\"]\n"
        ))
        .unwrap();
        assert_eq!(
            c.nvme.hosts_for("iqn.2026-11.org.ipsan:disk0"),
            nvme_proto::controller::AllowedHosts::Only(vec![H.to_owned()])
        );
        assert_eq!(
            c.nvme.nqn_for("iqn.2026-11.org.ipsan:disk0"),
            "nqn.2026-11.org.ipsan:disk0",
            "no nqn: the derived one"
        );
        assert_eq!(
            config(TARGET)
                .unwrap()
                .nvme
                .hosts_for("iqn.2026-11.org.ipsan:disk0"),
            nvme_proto::controller::AllowedHosts::Any
        );
        let sub = "[[nvme.subsystem]]\ntarget = \"iqn.2026-11.org.ipsan:disk0\"\n";
        for (extra, field) in [
            (
                format!("{sub}hosts = [\"iqn.2026-11.x:not-an-nqn\"]\n"),
                "nvme.subsystem[0].hosts[0]",
            ),
            (
                format!("{sub}hosts = [\"{H}\", \"{H}\"]\n"),
                "nvme.subsystem[0].hosts[1]",
            ),
            (format!("{sub}{sub}"), "nvme.subsystem[1].target"),
        ] {
            let e = config(&format!("{TARGET}{extra}")).unwrap_err();
            assert_eq!(e.field, field, "{extra}: {e}");
        }
    }

    #[test]
    fn rejects_tls_without_a_key_and_an_unknown_mode() {
        for (extra, field) in [
            ("[nvme]\ntls = \"required\"\n", "nvme.tls"),
            ("[nvme]\ntls = \"allowed\"\n", "nvme.tls"),
            ("[nvme]\ntls = \"sometimes\"\n", "nvme.tls"),
            (
                "[[nvme.host]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:1\"\n",
                "nvme.host[0]",
            ),
        ] {
            let e = config(&format!("{TARGET}{extra}")).unwrap_err();
            assert_eq!(e.field, field, "{extra}: {e}");
        }
        assert_eq!(config(TARGET).unwrap().nvme.tls, TlsMode::Off);
    }

    #[test]
    fn accepts_secrets_per_subsystem_and_rejects_overlapping_or_unknown_ones() {
        const H: &str = "nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-000000000001";
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, byte: u8| {
            let p = dir.path().join(name);
            let s = DhchapSecret::from_key(&[byte; 32], None).unwrap();
            std::fs::write(&p, &*s.to_dhhc1()).unwrap();
            std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600))
                .unwrap();
            p.display().to_string()
        };
        let (a, g) = (file("a", 0xa1), file("g", 0x61));
        let two = format!(
            "{TARGET}[[target]]\niqn = \"iqn.2026-11.org.ipsan:disk1\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n"
        );
        let host = |secret: &str, subs: &str| {
            format!("[[nvme.host]]\nnqn = \"{H}\"\ndhchap_secret_file = \"{secret}\"\n{subs}")
        };
        // By IQN and by the discovery NQN, beside a secret for every other subsystem.
        let c = config(&format!(
            "{two}{}{}",
            host(
                &a,
                "subsystems = [\"iqn.2026-11.org.ipsan:disk0\", \"nqn.2014-08.org.nvmexpress.discovery\"]\n"
            ),
            host(&g, "")
        ))
        .unwrap();
        assert!(c.nvme.auth_required());
        let p = c.nvme.dhchap_policy();
        let secret_of = |sub: &str| p.secrets(sub, H).map(|c| c.host_secret.clone());
        let (sa, sg) = (
            DhchapSecret::from_key(&[0xa1; 32], None).unwrap(),
            DhchapSecret::from_key(&[0x61; 32], None).unwrap(),
        );
        assert_eq!(secret_of("nqn.2026-11.org.ipsan:disk0"), Some(sa.clone()));
        assert_eq!(secret_of("nqn.2014-08.org.nvmexpress.discovery"), Some(sa));
        assert_eq!(secret_of("nqn.2026-11.org.ipsan:disk1"), Some(sg));
        assert!(!c.nvme.discovery_open, "discovery authenticates by default");
        let open = config(&format!(
            "{two}[nvme]\ndiscovery_auth = false\n{}",
            host(&g, "")
        ))
        .unwrap();
        assert!(open.nvme.discovery_open && open.nvme.auth_required());
        for (extra, field) in [
            (
                host(&a, "subsystems = [\"nqn.2026-11.org.ipsan:nowhere\"]\n"),
                "nvme.host[0].subsystems[0]",
            ),
            (
                format!("{}{}", host(&a, ""), host(&g, "")),
                "nvme.host[1].nqn",
            ),
            (
                format!(
                    "{}{}",
                    host(&a, "subsystems = [\"iqn.2026-11.org.ipsan:disk0\"]\n"),
                    host(&g, "subsystems = [\"nqn.2026-11.org.ipsan:disk0\"]\n")
                ),
                "nvme.host[1].subsystems",
            ),
        ] {
            let e = config(&format!("{two}{extra}")).unwrap_err();
            assert_eq!(e.field, field, "{extra}: {e}");
        }
    }

    #[test]
    fn rejects_nvme_beyond_loopback_without_authentication() {
        let mut c = config(&format!("{TARGET}[nvme]\nlisten = [\"0.0.0.0:4420\"]\n")).unwrap();
        let e = check_exposure(&c).unwrap_err();
        assert!(e.to_string().contains("0.0.0.0:4420"), "{e}");
        c.insecure_no_auth = true;
        assert!(check_exposure(&c).unwrap().is_some());
        let c = config(&format!(
            "{TARGET}[nvme]\nlisten = [\"127.0.0.1:4420\", \"[::1]:4420\"]\n"
        ))
        .unwrap();
        assert_eq!(check_exposure(&c), Ok(None));
    }
}
