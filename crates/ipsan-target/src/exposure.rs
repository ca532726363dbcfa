//! A listener beyond loopback authenticates (issue 31): the one check `ipsan target`,
//! `ipsan gateway` and every live change (`ipsan ctl`, reload, SIGHUP) go through.
//!
//! An `allow` list is no authentication: it compares the InitiatorName a host *declares* in
//! its Login Request (RFC 7143 §13.5.1), which any host may set to anything. So a target
//! reachable from other machines must make each host prove something: CHAP (`[target.chap]`,
//! RFC 7143 §12.1.3), per-host CHAP bound to the names it may claim (`[[target.chap_host]]`),
//! CHAP relayed to the remote target a gateway's LUNs reach (`chap_relay`), or Seal
//! `policy = "required"` with a secret (the pre-shared secret enters CPace; docs/seal.md §2).
//! Otherwise the server refuses to start (before it binds anything) unless the operator
//! accepts the risk with `--insecure-no-auth` / `[server] insecure_no_auth = true`.
//!
//! Discovery is refused nothing here but warned about: a SendTargets session (RFC 7143
//! §4.3, Appendix C) returns target names and portal addresses, no data, and is never sealed
//! (docs/seal.md §1), so on a portal beyond loopback without `[discovery.chap]` it tells
//! anyone who reaches the portal the names of the targets the initiator name they declare
//! may use. `[discovery] enabled = false` (`--no-discovery`) or `[discovery.chap]` silences it.

use std::net::SocketAddr;

use ipsan_seal::SealPolicy;

pub use crate::config::beyond_loopback;
use crate::config::{Config, TargetConfig};

/// How `t` authenticates every host that logs in to it, or `None` when a host that declares
/// an allowed name gets in without proving anything.
#[must_use]
pub fn host_auth(t: &TargetConfig) -> Option<&'static str> {
    if !t.chap_hosts.is_empty() {
        // A name no chap_host binds needs the shared CHAP, or is refused without one.
        Some("per-host CHAP")
    } else if t.chap.is_some() {
        Some("CHAP")
    } else if t.chap_relay() {
        Some("CHAP relayed to the remote target")
    } else if t.seal.policy == SealPolicy::Required
        && (t.seal.secret.is_some() || !t.seal.initiators.is_empty())
    {
        // Initiators without a secret of their own cannot log in at all.
        Some("Seal required")
    } else {
        None
    }
}

/// A configuration that would serve unauthenticated targets beyond loopback.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "refusing to serve target(s) {targets} on {portals}: they authenticate no host, and {portals} is beyond loopback, so any host that reaches it may log in under any initiator name (`allow` only compares the name a host declares) and read and write their LUNs. \
     Give each of them host authentication: [target.chap] (--chap-user), [[target.chap_host]] (--chap-host NAME,USER,SECRET-FILE), chap_relay on its remote LUNs, or [target.seal] policy = \"required\" with a secret (--seal required --seal-secret-file); \
     or listen on loopback only (127.0.0.1); or accept the risk with --insecure-no-auth ([server] insecure_no_auth = true) (docs/target.md, \"Listening beyond loopback\")",
    targets = self.targets.join(", "),
    portals = join_addrs(&self.portals)
)]
pub struct ExposureError {
    /// The portals beyond loopback.
    pub portals: Vec<SocketAddr>,
    /// The targets that authenticate no host, by IQN.
    pub targets: Vec<String>,
}

fn join_addrs(a: &[SocketAddr]) -> String {
    a.iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(", ")
}

/// What the operator is told when [`check`] lets a configuration through beyond loopback.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ExposureWarning {
    /// `insecure_no_auth`: these targets authenticate no host.
    #[error(
        "insecure_no_auth: target(s) {targets} authenticate no host on {portals}: any host that reaches it may log in under any initiator name and read and write their LUNs",
        targets = targets.join(", "),
        portals = join_addrs(portals)
    )]
    Insecure {
        portals: Vec<SocketAddr>,
        targets: Vec<String>,
    },
    /// Discovery without `[discovery.chap]`.
    #[error(
        "discovery on {portals} is not authenticated (and never sealed): any host that reaches it learns, in the clear, the names of the targets the initiator name it declares may use and the portal addresses; set [discovery.chap] or [discovery] enabled = false (--no-discovery)",
        portals = join_addrs(portals)
    )]
    Discovery { portals: Vec<SocketAddr> },
}

/// The check: `config`'s targets and discovery served on `portals` (the configured ones at
/// start, the bound ones for a live change), `insecure` the operator's explicit
/// `insecure_no_auth`. `Ok` carries the warnings to log (an accepted risk, unauthenticated
/// discovery); nothing is refused on loopback.
pub fn check(
    config: &Config,
    portals: &[SocketAddr],
    insecure: bool,
) -> Result<Vec<ExposureWarning>, ExposureError> {
    let beyond: Vec<SocketAddr> = portals.iter().copied().filter(beyond_loopback).collect();
    if beyond.is_empty() {
        return Ok(Vec::new());
    }
    let open: Vec<String> = config
        .targets
        .iter()
        .filter(|t| host_auth(t).is_none())
        .map(|t| t.iqn.clone())
        .collect();
    let mut warnings = Vec::new();
    if !open.is_empty() {
        if !insecure {
            return Err(ExposureError {
                portals: beyond,
                targets: open,
            });
        }
        warnings.push(ExposureWarning::Insecure {
            portals: beyond.clone(),
            targets: open,
        });
    }
    if config.discovery_enabled && config.discovery_chap.is_none() {
        warnings.push(ExposureWarning::Discovery { portals: beyond });
    }
    Ok(warnings)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::FileConfig;

    fn config(toml: &str) -> Config {
        Config::from_file_config(&FileConfig::parse(toml).unwrap()).unwrap()
    }

    const OPEN: &str = "[[target]]\niqn = \"iqn.2026-11.org.ipsan:open\"\nallow = [\"iqn.1994-05.com.redhat:*\"]\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n";

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rejects_unauthenticated_target_beyond_loopback() {
        let c = config(OPEN);
        for p in ["0.0.0.0:3260", "[::]:3260", "10.231.255.254:3260"] {
            let e = check(&c, &[addr("127.0.0.1:3260"), addr(p)], false).unwrap_err();
            assert_eq!(e.portals, vec![addr(p)]);
            assert_eq!(e.targets, vec!["iqn.2026-11.org.ipsan:open".to_owned()]);
            let text = e.to_string();
            assert!(
                text.contains(p) && text.contains("--insecure-no-auth"),
                "{text}"
            );
        }
    }

    #[test]
    fn accepts_unauthenticated_target_on_loopback_only() {
        let c = config(OPEN);
        let portals = [
            addr("127.0.0.1:3260"),
            addr("[::1]:3260"),
            addr("[::ffff:127.0.0.2]:1"),
        ];
        assert_eq!(check(&c, &portals, false), Ok(Vec::new()));
    }

    #[test]
    fn accepts_insecure_no_auth_with_a_warning() {
        let c = config(OPEN);
        let w = check(&c, &[addr("0.0.0.0:3260")], true).unwrap();
        assert!(
            w.iter()
                .any(|w| w.to_string().contains("iqn.2026-11.org.ipsan:open")),
            "{w:?}"
        );
    }

    #[test]
    fn accepts_every_kind_of_host_auth_and_warns_about_discovery() {
        let chap = "[target.chap]\nuser = \"u\"\nsecret = \"0123456789abcdef\"\n";
        let chap_host = "[[target.chap_host]]\nnames = [\"iqn.2026-11.org.ipsan:h\"]\nuser = \"h\"\nsecret = \"0123456789abcdef\"\n";
        let seal =
            "[target.seal]\npolicy = \"required\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n";
        let mem = "[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n";
        let relay = "[[target.lun]]\nid = 0\nbackend = \"iscsi://10.231.0.2:3260/iqn.2026-11.org.ipsan:disk0/0\"\nchap_relay = true\n";
        for (auth, lun) in [(chap, mem), (chap_host, mem), (seal, mem), ("", relay)] {
            let toml = format!("[[target]]\niqn = \"iqn.2026-11.org.ipsan:a\"\n{auth}{lun}");
            let c = config(&toml);
            assert!(host_auth(&c.targets[0]).is_some(), "{toml}");
            let w = check(&c, &[addr("0.0.0.0:3260")], false).unwrap();
            assert_eq!(
                w,
                vec![ExposureWarning::Discovery {
                    portals: vec![addr("0.0.0.0:3260")]
                }]
            );
        }
        // Seal required with no secret at all authenticates nobody.
        let toml = "[[target]]\niqn = \"iqn.2026-11.org.ipsan:a\"\n[target.seal]\npolicy = \"allowed\"\nsecret = \"0123456789abcdef0123456789abcdef\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n";
        assert!(check(&config(toml), &[addr("0.0.0.0:3260")], false).is_err());
    }

    /// The live path (`ipsan ctl`, reload, SIGHUP all go through `Registry::change`): a
    /// registry serving a portal beyond loopback (built, never bound) refuses a change that
    /// would expose a target, and keeps running what it ran.
    #[test]
    fn rejects_live_change_that_exposes_a_target() {
        use crate::registry::{ChangeError, Registry};
        let authed = "[server]\nportals = [\"10.231.255.254:3260\"]\n[[target]]\niqn = \"iqn.2026-11.org.ipsan:a\"\n[target.chap]\nuser = \"u\"\nsecret = \"0123456789abcdef\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n";
        let file = FileConfig::parse(authed).unwrap();
        let r = Registry::build(&Config::from_file_config(&file).unwrap()).unwrap();

        // The last authentication removed.
        let mut next = file.clone();
        next.target[0].chap = None;
        let e = r.apply(next, false).unwrap_err();
        assert!(matches!(e, ChangeError::Refused { .. }), "{e}");
        assert!(e.to_string().contains("iqn.2026-11.org.ipsan:a"), "{e}");
        // A target without authentication added (force does not override it).
        let mut next = file.clone();
        next.target.extend(FileConfig::parse(OPEN).unwrap().target);
        let e = r.apply(next, true).unwrap_err();
        assert!(
            e.to_string().contains("iqn.2026-11.org.ipsan:open")
                && e.to_string().contains("refusing"),
            "{e}"
        );
        assert_eq!(r.running_config(), Some(file.clone()));

        // A change that keeps every target authenticated goes through.
        let mut next = file.clone();
        next.target[0].allow = vec!["iqn.2026-11.org.ipsan:h".to_owned()];
        r.apply(next.clone(), false).unwrap();
        assert_eq!(r.running_config(), Some(next));
    }

    /// On loopback the same changes go through.
    #[test]
    fn accepts_live_change_on_loopback() {
        use crate::registry::Registry;
        let file = FileConfig::parse(&format!("[server]\nportals = [\"127.0.0.1:3260\"]\n{OPEN}"))
            .unwrap();
        let r = Registry::build(&Config::from_file_config(&file).unwrap()).unwrap();
        let mut next = file.clone();
        next.target[0].iqn = "iqn.2026-11.org.ipsan:other".to_owned();
        r.apply(next, false).unwrap();
    }
}
