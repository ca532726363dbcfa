//! `iscsi://` URLs as libiscsi writes them:
//! `iscsi://[user[%password]@]host[:port]/target-iqn/lun`, IPv6 hosts in brackets (`[::1]`).
//!
//! A password in the URL itself is accepted (libiscsi does) but discouraged: it ends up in shell
//! history and `ps`. [`IscsiUrl::with_secret_from`] takes it from a file or an environment
//! variable instead. Either way the secret lives in a [`ChapSecret`]: never printed, zeroized.

use std::fmt;

use iscsi_proto::chap::ChapSecret;

/// The iSCSI well-known port (RFC 7143 §13.3 / IANA).
pub const DEFAULT_PORT: u16 = 3260;

/// A bad URL. Messages never contain the password.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum UrlError {
    #[error("URL must start with iscsi://")]
    Scheme,
    #[error("URL has no host")]
    NoHost,
    #[error("unterminated IPv6 address (missing ']')")]
    Ipv6Bracket,
    #[error("bad port {0:?}")]
    Port(String),
    #[error("URL needs a target name: iscsi://host[:port]/target-iqn/lun")]
    NoTarget,
    #[error("URL needs a LUN after the target name: iscsi://host[:port]/target-iqn/lun")]
    NoLun,
    #[error("bad LUN {0:?} (a number 0..=16383)")]
    Lun(String),
    #[error("URL has an empty user name before '@'")]
    EmptyUser,
    #[error("the password source: {0}")]
    Secret(String),
}

/// A parsed `iscsi://` URL.
#[derive(Clone, PartialEq, Eq)]
pub struct IscsiUrl {
    /// Host name or address, without IPv6 brackets.
    pub host: String,
    pub port: u16,
    /// Target IQN; `None` for a discovery URL (`iscsi://host[:port]`).
    pub target: Option<String>,
    /// Logical unit number; `None` when the URL has no LUN part.
    pub lun: Option<u16>,
    /// CHAP user name.
    pub user: Option<String>,
    password: Option<SecretString>,
}

/// Wraps a [`ChapSecret`] so `IscsiUrl` can derive equality without exposing the bytes.
#[derive(Clone)]
struct SecretString(ChapSecret);

impl PartialEq for SecretString {
    fn eq(&self, other: &Self) -> bool {
        self.0.ct_eq(&other.0)
    }
}
impl Eq for SecretString {}

impl IscsiUrl {
    /// Parse a URL. A target and LUN are optional here; use [`IscsiUrl::require_lun`] where one
    /// is needed.
    pub fn parse(s: &str) -> Result<Self, UrlError> {
        let rest = s
            .strip_prefix("iscsi://")
            .or_else(|| s.strip_prefix("ISCSI://"))
            .ok_or(UrlError::Scheme)?;
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        // The userinfo ends at the last '@' (a password may contain '@' only percent-escaped,
        // but be lenient the way libiscsi is).
        let (userinfo, hostport) = match authority.rfind('@') {
            Some(i) => (Some(&authority[..i]), &authority[i + 1..]),
            None => (None, authority),
        };
        let (user, password) = match userinfo {
            None => (None, None),
            Some(ui) => {
                let (u, p) = match ui.find('%') {
                    // libiscsi's separator is '%' (':' is ambiguous with IPv6 in its parser).
                    Some(i) => (&ui[..i], Some(&ui[i + 1..])),
                    None => (ui, None),
                };
                if u.is_empty() {
                    return Err(UrlError::EmptyUser);
                }
                let pw = match p {
                    Some(p) => Some(SecretString(
                        ChapSecret::new(p.as_bytes().to_vec())
                            .map_err(|e| UrlError::Secret(e.to_string()))?,
                    )),
                    None => None,
                };
                (Some(u.to_owned()), pw)
            }
        };
        let (host, port) = split_host_port(hostport)?;
        let mut parts = path.splitn(2, '/');
        let target = parts.next().filter(|t| !t.is_empty()).map(str::to_owned);
        let lun = match parts.next().map(|l| l.trim_end_matches('/')) {
            None | Some("") => None,
            Some(l) => Some(parse_lun(l)?),
        };
        if target.is_none() && lun.is_some() {
            return Err(UrlError::NoTarget);
        }
        Ok(Self {
            host,
            port,
            target,
            lun,
            user,
            password,
        })
    }

    /// The target name, or an error saying the URL needs one.
    pub fn require_target(&self) -> Result<&str, UrlError> {
        self.target.as_deref().ok_or(UrlError::NoTarget)
    }

    /// The LUN, or an error saying the URL needs one.
    pub fn require_lun(&self) -> Result<u16, UrlError> {
        self.require_target()?;
        self.lun.ok_or(UrlError::NoLun)
    }

    /// `host:port` for connecting (IPv6 in brackets).
    pub fn socket_addr_string(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }

    /// The CHAP password, if any.
    pub fn password(&self) -> Option<&ChapSecret> {
        self.password.as_ref().map(|s| &s.0)
    }

    /// Replace the password with one from a file or an environment variable (the file wins
    /// when both are given). The URL's own password is kept when neither is given.
    pub fn with_secret_from(
        mut self,
        file: Option<&std::path::Path>,
        env: Option<&str>,
    ) -> Result<Self, UrlError> {
        let secret = if let Some(f) = file {
            Some(ChapSecret::from_file(f).map_err(|e| UrlError::Secret(e.to_string()))?)
        } else if let Some(v) = env {
            Some(ChapSecret::from_env(v).map_err(|e| UrlError::Secret(e.to_string()))?)
        } else {
            None
        };
        if let Some(s) = secret {
            self.password = Some(SecretString(s));
        }
        Ok(self)
    }

    /// Set the password directly.
    pub fn set_password(&mut self, secret: ChapSecret) {
        self.password = Some(SecretString(secret));
    }
}

/// Prints the URL with the password replaced by `<redacted>`.
impl fmt::Display for IscsiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("iscsi://")?;
        if let Some(u) = &self.user {
            f.write_str(u)?;
            if self.password.is_some() {
                f.write_str("%<redacted>")?;
            }
            f.write_str("@")?;
        }
        f.write_str(&self.socket_addr_string())?;
        if let Some(t) = &self.target {
            write!(f, "/{t}")?;
            if let Some(l) = self.lun {
                write!(f, "/{l}")?;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for IscsiUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "IscsiUrl({self})")
    }
}

impl std::str::FromStr for IscsiUrl {
    type Err = UrlError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

fn split_host_port(hostport: &str) -> Result<(String, u16), UrlError> {
    host_port(hostport, DEFAULT_PORT)
}

/// `host[:port]` or `[v6]:port` with `default_port` when none is given (shared with the
/// `nvme+tcp://` parser, `crate::nvme::url`).
pub(crate) fn host_port(hostport: &str, default_port: u16) -> Result<(String, u16), UrlError> {
    let (host, port) = if let Some(rest) = hostport.strip_prefix('[') {
        let end = rest.find(']').ok_or(UrlError::Ipv6Bracket)?;
        let host = &rest[..end];
        let after = &rest[end + 1..];
        let port = match after.strip_prefix(':') {
            Some(p) => Some(p),
            None if after.is_empty() => None,
            None => return Err(UrlError::Port(after.to_owned())),
        };
        (host, port)
    } else {
        match hostport.rfind(':') {
            Some(i) => (&hostport[..i], Some(&hostport[i + 1..])),
            None => (hostport, None),
        }
    };
    if host.is_empty() {
        return Err(UrlError::NoHost);
    }
    let port = match port {
        None => default_port,
        Some(p) => match p.parse::<u16>() {
            Ok(n) if n != 0 && p.bytes().all(|b| b.is_ascii_digit()) => n,
            _ => return Err(UrlError::Port(p.to_owned())),
        },
    };
    Ok((host.to_owned(), port))
}

fn parse_lun(l: &str) -> Result<u16, UrlError> {
    match l.parse::<u16>() {
        // SAM-5 peripheral/flat addressing covers 0..=16383 with the single-level format.
        Ok(n) if n < 16384 && l.bytes().all(|b| b.is_ascii_digit()) => Ok(n),
        _ => Err(UrlError::Lun(l.to_owned())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_full_libiscsi_url() {
        let u = IscsiUrl::parse(
            "iscsi://alice%s3cret-pass-12@127.0.0.1:3261/iqn.2026-11.org.ipsan:disk0/3",
        )
        .unwrap();
        assert_eq!(u.host, "127.0.0.1");
        assert_eq!(u.port, 3261);
        assert_eq!(u.target.as_deref(), Some("iqn.2026-11.org.ipsan:disk0"));
        assert_eq!(u.lun, Some(3));
        assert_eq!(u.user.as_deref(), Some("alice"));
        assert_eq!(u.password().unwrap().expose(), b"s3cret-pass-12");
    }

    #[test]
    fn accepts_ipv6_and_default_port() {
        let u = IscsiUrl::parse("iscsi://[::1]/iqn.x/0").unwrap();
        assert_eq!(u.host, "::1");
        assert_eq!(u.port, DEFAULT_PORT);
        assert_eq!(u.socket_addr_string(), "[::1]:3260");
        let u = IscsiUrl::parse("iscsi://[fe80::1]:3262/iqn.x/1").unwrap();
        assert_eq!(u.port, 3262);
    }

    #[test]
    fn accepts_discovery_url_without_target() {
        let u = IscsiUrl::parse("iscsi://10.231.0.2:3260").unwrap();
        assert_eq!(u.target, None);
        assert_eq!(u.lun, None);
        assert!(u.require_lun().is_err());
        let u = IscsiUrl::parse("iscsi://10.231.0.2/").unwrap();
        assert_eq!(u.target, None);
    }

    #[test]
    fn display_and_debug_redact_the_password() {
        let u = IscsiUrl::parse("iscsi://bob%hunter2hunter2@h/iqn.x/0").unwrap();
        for s in [u.to_string(), format!("{u:?}")] {
            assert!(!s.contains("hunter2"), "{s}");
            assert!(s.contains("<redacted>"), "{s}");
        }
        assert_eq!(u.to_string(), "iscsi://bob%<redacted>@h:3260/iqn.x/0");
    }

    #[test]
    fn rejects_malformed_urls() {
        for bad in [
            "http://h/iqn/0",
            "iscsi:///iqn/0",
            "iscsi://h:/iqn/0",
            "iscsi://h:0/iqn/0",
            "iscsi://h:99999/iqn/0",
            "iscsi://h:12a/iqn/0",
            "iscsi://[::1/iqn/0",
            "iscsi://[::1]x/iqn/0",
            "iscsi://h/iqn/lun",
            "iscsi://h/iqn/16384",
            "iscsi://h/iqn/-1",
            "iscsi://%pw@h/iqn/0",
        ] {
            assert!(IscsiUrl::parse(bad).is_err(), "{bad}");
        }
        assert_eq!(
            IscsiUrl::parse("iscsi://h/iqn.x").unwrap().require_lun(),
            Err(UrlError::NoLun)
        );
    }

    #[test]
    fn secret_from_file_overrides_url_password() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("pw");
        std::fs::write(&p, "from-file-secret\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let u = IscsiUrl::parse("iscsi://u%inline-secret@h/iqn.x/0")
            .unwrap()
            .with_secret_from(Some(&p), None)
            .unwrap();
        assert_eq!(u.password().unwrap().expose(), b"from-file-secret");
        let err = IscsiUrl::parse("iscsi://u@h/iqn.x/0")
            .unwrap()
            .with_secret_from(None, Some("IPSAN_SURELY_UNSET_VAR_FOR_TEST"))
            .unwrap_err();
        assert!(err.to_string().contains("IPSAN_SURELY_UNSET_VAR_FOR_TEST"));
    }
}
