//! `nvme+tcp://host[:port]/subsysnqn/nsid` URLs, the one parser every subcommand uses:
//! `ipsan bench` and `ipsan inquiry` need the subsystem (the namespace defaults to the first
//! active one), `ipsan discover` takes `nvme+tcp://host[:port]` and reads the Discovery log.
//! IPv6 hosts go in brackets (`[::1]`). The port defaults to 4420 (the IANA NVMe/TCP port)
//! with a subsystem and to 8009 (the discovery port, NVMe/TCP 1.0 §3.2) without one.

use std::fmt;

use crate::url::UrlError;

/// The URL scheme.
pub const SCHEME: &str = "nvme+tcp://";
/// The NVMe/TCP I/O controller port (IANA).
pub const DEFAULT_PORT: u16 = 4420;

/// A parsed `nvme+tcp://` URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NvmeUrl {
    /// Host name or address, without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// The subsystem NQN; `None` for a discovery URL.
    pub subnqn: Option<String>,
    /// The namespace ID; `None`: the first active namespace.
    pub nsid: Option<u32>,
}

impl NvmeUrl {
    /// Whether `s` is an `nvme+tcp://` URL (so the caller picks NVMe over iSCSI).
    #[must_use]
    pub fn is_nvme(s: &str) -> bool {
        s.get(..SCHEME.len())
            .is_some_and(|p| p.eq_ignore_ascii_case(SCHEME))
    }

    /// Parses a URL.
    ///
    /// # Errors
    /// [`UrlError`]: another scheme, no host, a bad port, an NQN longer than 223 bytes, a
    /// namespace ID that is not 1..=0xFFFFFFFE.
    pub fn parse(s: &str) -> Result<Self, UrlError> {
        if !Self::is_nvme(s) {
            return Err(UrlError::Scheme);
        }
        let rest = &s[SCHEME.len()..];
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let mut parts = path.splitn(2, '/');
        let subnqn = parts.next().filter(|t| !t.is_empty()).map(str::to_owned);
        if subnqn.as_ref().is_some_and(|n| n.len() > 223) {
            return Err(UrlError::NoTarget);
        }
        let nsid = match parts.next().map(|l| l.trim_end_matches('/')) {
            None | Some("") => None,
            Some(n) => match n.parse::<u32>() {
                Ok(v) if v != 0 && v != u32::MAX && n.bytes().all(|b| b.is_ascii_digit()) => {
                    Some(v)
                }
                _ => return Err(UrlError::Lun(n.to_owned())),
            },
        };
        let default = if subnqn.is_some() {
            DEFAULT_PORT
        } else {
            nvme_wire::DISCOVERY_PORT
        };
        let (host, port) = crate::url::host_port(authority, default)?;
        Ok(Self {
            host,
            port,
            subnqn,
            nsid,
        })
    }

    /// The subsystem NQN, or an error for a discovery URL.
    ///
    /// # Errors
    /// [`UrlError::NoTarget`].
    pub fn require_subsystem(&self) -> Result<&str, UrlError> {
        self.subnqn.as_deref().ok_or(UrlError::NoTarget)
    }

    /// `host:port` for connecting (IPv6 in brackets).
    #[must_use]
    pub fn addr(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

impl fmt::Display for NvmeUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{SCHEME}{}", self.addr())?;
        if let Some(n) = &self.subnqn {
            write!(f, "/{n}")?;
            if let Some(ns) = self.nsid {
                write!(f, "/{ns}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_subsystem_and_namespace() {
        let u =
            NvmeUrl::parse("nvme+tcp://127.0.0.1:14420/nqn.2026-11.org.example:nvmet/1").unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.port, 14420);
        assert_eq!(u.subnqn.as_deref(), Some("nqn.2026-11.org.example:nvmet"));
        assert_eq!(u.nsid, Some(1));
        assert_eq!(
            u.to_string(),
            "nvme+tcp://127.0.0.1:14420/nqn.2026-11.org.example:nvmet/1"
        );
    }

    #[test]
    fn accepts_discovery_url_with_port_8009_by_default() {
        let u = NvmeUrl::parse("nvme+tcp://[::1]").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, 8009);
        assert!(u.subnqn.is_none());
        let u = NvmeUrl::parse("NVME+TCP://h/nqn.x").unwrap();
        assert_eq!(u.port, 4420);
        assert_eq!(u.nsid, None);
    }

    #[test]
    fn rejects_bad_namespace_port_and_scheme() {
        assert!(NvmeUrl::parse("nvme+tcp://h/nqn.x/0").is_err());
        assert!(NvmeUrl::parse("nvme+tcp://h/nqn.x/4294967295").is_err());
        assert!(NvmeUrl::parse("nvme+tcp://h/nqn.x/+1").is_err());
        assert!(NvmeUrl::parse("nvme+tcp://h:0/nqn.x").is_err());
        assert!(NvmeUrl::parse("nvme+tcp:///nqn.x").is_err());
        assert!(NvmeUrl::parse("iscsi://h/iqn.x/0").is_err());
    }
}
