//! Per-connection TCP settings: congestion control, socket buffers and `TCP_NODELAY`.
//!
//! The iFCP paper (Muknahallipatna et al., §3 and Table 1) shows that a single connection's throughput is
//! capped at window/RTT: 8 MB over 100 ms RTT is 80 MB/s whatever the link. So the buffers
//! have to cover the bandwidth-delay product, and the congestion control has to be chosen per
//! socket (this machine's default is BBR; ipsan never relies on the system default).
//!
//! Settings are written in a target config, a bench run or a lab plan as
//! ```toml
//! [tcp]
//! congestion = "ipsan_sf"     # cubic | bbr | reno | ipsan_sf | ipsan_sf_ss | ipsan_ss (or any the kernel has)
//! sndbuf = "auto"             # "auto" (bandwidth × RTT × 1.5 when the link is known), bytes, "8MiB", or "kernel"
//! rcvbuf = 8388608
//! nodelay = true
//! window_clamp = 8388480      # optional: pin the advertised receive window (65535 << 7)
//! ```
//! and applied with [`TcpSettings::apply`], which returns what is actually in force read back
//! from the socket (Linux doubles `SO_SNDBUF`/`SO_RCVBUF` for bookkeeping and caps them at
//! `net.core.wmem_max`/`rmem_max`; setting them also turns off buffer autotuning, `tcp(7)`).

use std::fmt;
use std::os::fd::{AsFd, AsRawFd};
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use socket2::SockRef;

use crate::bpf::{available_congestion_controls, OURS};
use crate::TcpError;

/// `auto` buffers are this many times the bandwidth-delay product (numerator / denominator).
/// Linux charges packet overhead (skb truesize) against the buffer, so a buffer of exactly one
/// BDP yields a window below one BDP; 1.5× leaves room for that and for retransmissions.
pub const AUTO_HEADROOM: (u64, u64) = (3, 2);

/// Largest buffer a socket option can carry: the kernel doubles the value and stores an `int`.
const MAX_BUF: u64 = (i32::MAX as u64) / 2;

/// Where the congestion control falls back when one of ours is asked for but not registered.
pub const FALLBACK_CONGESTION: &str = "reno";

/// How large a socket buffer should be.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(try_from = "RawBufSize", into = "RawBufSize")]
pub enum BufSize {
    /// Leave it to the kernel's autotuning (`tcp_rmem`/`tcp_wmem`). The default.
    #[default]
    Kernel,
    /// Bandwidth × RTT × [`AUTO_HEADROOM`] when the link is known ([`TcpSettings::link`]);
    /// kernel autotuning otherwise.
    Auto,
    /// Exactly this many bytes requested with `SO_SNDBUF`/`SO_RCVBUF`.
    Bytes(u64),
}

impl BufSize {
    /// The byte count to request for `link`, or `None` to leave the kernel in charge.
    pub fn bytes_for(self, link: Option<&Link>) -> Option<u64> {
        match self {
            BufSize::Kernel => None,
            BufSize::Bytes(n) => Some(n),
            BufSize::Auto => {
                link.map(|l| l.bdp_bytes().saturating_mul(AUTO_HEADROOM.0) / AUTO_HEADROOM.1)
            }
        }
    }
}

impl FromStr for BufSize {
    type Err = TcpError;

    /// Accepts `auto`, `kernel`, a byte count, or a count with a `KiB`/`MiB`/`GiB`
    /// (or `K`/`M`/`G`, all powers of two) suffix.
    fn from_str(s: &str) -> Result<Self, TcpError> {
        let t = s.trim();
        let bad = |reason: &str| TcpError::InvalidSetting {
            what: "buffer size",
            value: s.to_string(),
            reason: reason.to_string(),
        };
        match t.to_ascii_lowercase().as_str() {
            "auto" => return Ok(BufSize::Auto),
            "kernel" | "default" => return Ok(BufSize::Kernel),
            _ => {}
        }
        // The one size grammar (ipsan_units): 8388608, 8MiB, 8M, 8MB (decimal).
        let bytes = ipsan_units::parse_size(t).map_err(|e| match e {
            ipsan_units::ParseError::TooLarge(_) => {
                bad("larger than the kernel accepts (1 GiB - 1 byte at most)")
            }
            ipsan_units::ParseError::UnknownUnit { .. } => {
                bad("unknown unit (use KiB, MiB or GiB)")
            }
            _ => bad("expected `auto`, `kernel`, or a byte count such as 8388608 or 8MiB"),
        });
        match bytes? {
            0 => Err(bad("a buffer of 0 bytes is not allowed")),
            b if b <= MAX_BUF => Ok(BufSize::Bytes(b)),
            _ => Err(bad(
                "larger than the kernel accepts (1 GiB - 1 byte at most)",
            )),
        }
    }
}

impl fmt::Display for BufSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BufSize::Kernel => f.write_str("kernel"),
            BufSize::Auto => f.write_str("auto"),
            BufSize::Bytes(n) => write!(f, "{n}"),
        }
    }
}

/// The serde form: an integer (bytes) or a string accepted by [`BufSize::from_str`].
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(untagged)]
enum RawBufSize {
    Bytes(u64),
    Text(String),
}

impl TryFrom<RawBufSize> for BufSize {
    type Error = TcpError;
    fn try_from(raw: RawBufSize) -> Result<Self, TcpError> {
        match raw {
            RawBufSize::Bytes(n) => BufSize::from_str(&n.to_string()),
            RawBufSize::Text(s) => BufSize::from_str(&s),
        }
    }
}

impl From<BufSize> for RawBufSize {
    fn from(b: BufSize) -> Self {
        match b {
            BufSize::Bytes(n) => RawBufSize::Bytes(n),
            other => RawBufSize::Text(other.to_string()),
        }
    }
}

/// The link a connection runs over, when the caller knows it (the lab does; `ipsan bench` may
/// be told). Used only to size `auto` buffers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Link {
    /// Bottleneck rate in bits per second.
    pub bandwidth_bps: u64,
    /// Round-trip time.
    #[serde(with = "micros")]
    pub rtt: Duration,
}

impl Link {
    /// Bandwidth-delay product in bytes (the iFCP paper (Muknahallipatna et al.) eq. (1) read backwards: the window needed
    /// to fill `bandwidth` at `rtt`).
    pub fn bdp_bytes(&self) -> u64 {
        let bits = u128::from(self.bandwidth_bps) * self.rtt.as_micros() / 1_000_000;
        u64::try_from(bits / 8).unwrap_or(u64::MAX)
    }
}

mod micros {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(u64::try_from(d.as_micros()).unwrap_or(u64::MAX))
    }
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        u64::deserialize(d).map(Duration::from_micros)
    }
}

/// Per-connection socket settings (`[tcp]` in configs). Every field defaults to "leave the
/// kernel's choice", except that callers are expected to always name a congestion control.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TcpSettings {
    /// `TCP_CONGESTION` name: `cubic`, `bbr`, `reno`, `ipsan_sf`, `ipsan_sf_ss`, `ipsan_ss`, ….
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub congestion: Option<String>,
    /// `SO_SNDBUF` request.
    #[serde(default)]
    pub sndbuf: BufSize,
    /// `SO_RCVBUF` request. Set it before `connect`/`listen` where you can: the window scale
    /// is chosen at the SYN (RFC 7323 §2.2).
    #[serde(default)]
    pub rcvbuf: BufSize,
    /// `TCP_NODELAY` (disable Nagle). iSCSI PDUs are latency-sensitive; the target sets it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nodelay: Option<bool>,
    /// `TCP_WINDOW_CLAMP`: the most this socket advertises as receive window, bytes, as
    /// the iFCP paper (Muknahallipatna et al.) Table 1 assumes (8 MB); the buffer must still be larger. On Linux 6.18 the
    /// clamp fixes the window scale at the SYN but the window still grew to 65535 << wscale,
    /// so to pin it exactly use a value of that form (8388480 = 65535 << 7, docs/tcp.md).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub window_clamp: Option<u32>,
    /// The link, if known, for `auto` buffers. Not part of a config file.
    #[serde(skip)]
    pub link: Option<Link>,
}

/// The settings a socket actually has, read back from the kernel.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InForce {
    /// `TCP_CONGESTION` as the kernel reports it.
    pub congestion: String,
    /// `SO_SNDBUF` as the kernel reports it (twice the request, see `socket(7)`).
    pub sndbuf: u64,
    /// `SO_RCVBUF` as the kernel reports it.
    pub rcvbuf: u64,
    /// `TCP_NODELAY`.
    pub nodelay: bool,
    /// `TCP_WINDOW_CLAMP` (0: none set).
    pub window_clamp: u32,
    /// What differs from the request, and why (a capped buffer, a fallback algorithm).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
}

impl TcpSettings {
    /// Settings that only choose the congestion control.
    pub fn with_congestion(name: &str) -> Self {
        TcpSettings {
            congestion: Some(name.to_string()),
            ..TcpSettings::default()
        }
    }

    /// The same settings with the link known, so `auto` buffers can be sized.
    pub fn for_link(mut self, link: Link) -> Self {
        self.link = Some(link);
        self
    }

    /// Checks the values without touching a socket (for config loading).
    pub fn validate(&self) -> Result<(), TcpError> {
        if let Some(name) = &self.congestion {
            validate_congestion_name(name)?;
        }
        Ok(())
    }

    /// Applies the settings to `socket` (a std or tokio `TcpStream`/`TcpListener`, or a
    /// `socket2::Socket`) and returns what is in force afterwards.
    ///
    /// A congestion control the kernel does not have is an error, except for ipsan's own
    /// ([`OURS`]) when they are not registered: then the socket falls back to
    /// [`FALLBACK_CONGESTION`] (Reno, which they modify) and [`InForce::notes`] says so, so the
    /// results never claim an algorithm that did not run.
    pub fn apply<S: AsFd>(&self, socket: &S) -> Result<InForce, TcpError> {
        self.validate()?;
        let sock = SockRef::from(socket);
        let mut notes = Vec::new();
        if let Some(name) = &self.congestion {
            set_congestion(&sock, name, &mut notes)?;
        }
        let snd = self.sndbuf.bytes_for(self.link.as_ref());
        let rcv = self.rcvbuf.bytes_for(self.link.as_ref());
        if let Some(n) = snd {
            let n = n.min(MAX_BUF);
            sock.set_send_buffer_size(n as usize)
                .map_err(|source| TcpError::Socket {
                    op: "setsockopt(SO_SNDBUF)",
                    source,
                })?;
        }
        if let Some(n) = rcv {
            let n = n.min(MAX_BUF);
            sock.set_recv_buffer_size(n as usize)
                .map_err(|source| TcpError::Socket {
                    op: "setsockopt(SO_RCVBUF)",
                    source,
                })?;
        }
        if (self.sndbuf == BufSize::Auto || self.rcvbuf == BufSize::Auto) && self.link.is_none() {
            notes.push("auto buffers: link not known, kernel autotuning left in charge".into());
        }
        if let Some(nodelay) = self.nodelay {
            sock.set_tcp_nodelay(nodelay)
                .map_err(|source| TcpError::Socket {
                    op: "setsockopt(TCP_NODELAY)",
                    source,
                })?;
        }
        let mut in_force = read_back(socket)?;
        // Past net.core.{w,r}mem_max the kernel silently caps the request. With CAP_NET_ADMIN
        // (the lab runs as root) the *FORCE options grant it anyway; otherwise say so.
        let fd = socket.as_fd().as_raw_fd();
        for (receive, asked, got) in [(false, snd, in_force.sndbuf), (true, rcv, in_force.rcvbuf)] {
            if let Some(asked) = asked.map(|a| a.min(MAX_BUF)) {
                if got < asked * 2 && crate::sys::set_buf_force(fd, receive, asked).is_ok() {
                    let (what, sysctl, opt) = if receive {
                        ("rcvbuf", "rmem_max", "SO_RCVBUFFORCE")
                    } else {
                        ("sndbuf", "wmem_max", "SO_SNDBUFFORCE")
                    };
                    notes.push(format!(
                        "{what}: {asked} bytes is above net.core.{sysctl}; granted with {opt}"
                    ));
                }
            }
        }
        // Last: changing the buffers can move the clamp.
        if let Some(clamp) = self.window_clamp {
            crate::sys::set_window_clamp(socket.as_fd().as_raw_fd(), clamp).map_err(|source| {
                TcpError::Socket {
                    op: "setsockopt(TCP_WINDOW_CLAMP)",
                    source,
                }
            })?;
        }
        let now = read_back(socket)?;
        in_force.sndbuf = now.sndbuf;
        in_force.rcvbuf = now.rcvbuf;
        in_force.window_clamp = now.window_clamp;
        for (what, asked, got, sysctl) in [
            ("sndbuf", snd, in_force.sndbuf, "net.core.wmem_max"),
            ("rcvbuf", rcv, in_force.rcvbuf, "net.core.rmem_max"),
        ] {
            if let Some(asked) = asked {
                if got < asked.min(MAX_BUF) * 2 {
                    notes.push(format!(
                        "{what}: asked for {asked} bytes, the kernel granted {} ({sysctl} caps it; \
                         the SO_*BUFFORCE options need CAP_NET_ADMIN)",
                        got / 2
                    ));
                }
            }
        }
        in_force.notes = notes;
        Ok(in_force)
    }
}

/// Reads the congestion control, buffers and `TCP_NODELAY` currently set on `socket`.
pub fn read_back<S: AsFd>(socket: &S) -> Result<InForce, TcpError> {
    let sock = SockRef::from(socket);
    let name = sock.tcp_congestion().map_err(|source| TcpError::Socket {
        op: "getsockopt(TCP_CONGESTION)",
        source,
    })?;
    let end = name.iter().position(|&b| b == 0).unwrap_or(name.len());
    let congestion = String::from_utf8_lossy(&name[..end]).into_owned();
    let sndbuf = sock.send_buffer_size().map_err(|source| TcpError::Socket {
        op: "getsockopt(SO_SNDBUF)",
        source,
    })?;
    let rcvbuf = sock.recv_buffer_size().map_err(|source| TcpError::Socket {
        op: "getsockopt(SO_RCVBUF)",
        source,
    })?;
    let nodelay = sock.tcp_nodelay().map_err(|source| TcpError::Socket {
        op: "getsockopt(TCP_NODELAY)",
        source,
    })?;
    let window_clamp = crate::sys::window_clamp(socket.as_fd().as_raw_fd()).map_err(|source| {
        TcpError::Socket {
            op: "getsockopt(TCP_WINDOW_CLAMP)",
            source,
        }
    })?;
    Ok(InForce {
        congestion,
        sndbuf: sndbuf as u64,
        rcvbuf: rcvbuf as u64,
        nodelay,
        window_clamp,
        notes: Vec::new(),
    })
}

/// Kernel names are at most 15 bytes (`TCP_CA_NAME_MAX` 16 with the NUL).
fn validate_congestion_name(name: &str) -> Result<(), TcpError> {
    let ok = !name.is_empty()
        && name.len() < 16
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if ok {
        Ok(())
    } else {
        Err(TcpError::InvalidSetting {
            what: "tcp.congestion",
            value: name.to_string(),
            reason: "expected a kernel algorithm name such as cubic, bbr, reno or ipsan_sf".into(),
        })
    }
}

fn set_congestion(sock: &SockRef<'_>, name: &str, notes: &mut Vec<String>) -> Result<(), TcpError> {
    let err = match sock.set_tcp_congestion(name.as_bytes()) {
        Ok(()) => return Ok(()),
        Err(e) => e,
    };
    let available = available_congestion_controls().unwrap_or_default();
    let ours = OURS.contains(&name);
    match err.raw_os_error() {
        Some(libc::ENOENT) if ours && !available.iter().any(|a| a == name) => {
            tracing::warn!(
                requested = name,
                fallback = FALLBACK_CONGESTION,
                "ipsan congestion control not registered (run `ipsan tcp load` as root); \
                 falling back"
            );
            sock.set_tcp_congestion(FALLBACK_CONGESTION.as_bytes())
                .map_err(|source| TcpError::Socket {
                    op: "setsockopt(TCP_CONGESTION)",
                    source,
                })?;
            notes.push(format!(
                "congestion: {name} is not registered (run `ipsan tcp load` as root), \
                 fell back to {FALLBACK_CONGESTION}"
            ));
            Ok(())
        }
        Some(libc::ENOENT) => Err(TcpError::CongestionUnavailable {
            name: name.to_string(),
            available: available.join(" "),
            hint: if ours {
                "; run `ipsan tcp load` as root"
            } else {
                ""
            },
        }),
        Some(libc::EPERM) => Err(TcpError::Socket {
            op: "setsockopt(TCP_CONGESTION): not in net.ipv4.tcp_allowed_congestion_control \
                 for unprivileged users",
            source: err,
        }),
        _ => Err(TcpError::Socket {
            op: "setsockopt(TCP_CONGESTION)",
            source: err,
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};

    #[test]
    fn parses_buffer_sizes() {
        assert_eq!("auto".parse::<BufSize>().unwrap(), BufSize::Auto);
        assert_eq!("Kernel".parse::<BufSize>().unwrap(), BufSize::Kernel);
        assert_eq!(
            "8388608".parse::<BufSize>().unwrap(),
            BufSize::Bytes(8 << 20)
        );
        assert_eq!("8MiB".parse::<BufSize>().unwrap(), BufSize::Bytes(8 << 20));
        assert_eq!(
            "64 KiB".parse::<BufSize>().unwrap(),
            BufSize::Bytes(64 << 10)
        );
        assert_eq!(
            "512M".parse::<BufSize>().unwrap(),
            BufSize::Bytes(512 << 20)
        );
    }

    #[test]
    fn rejects_bad_buffer_sizes() {
        for bad in [
            "",
            "lots",
            "0",
            "-5",
            "8 parsecs",
            "1GiB",
            "99999999999999999999999",
        ] {
            let err = bad.parse::<BufSize>().unwrap_err();
            assert!(err.to_string().contains("buffer size"), "{bad}: {err}");
        }
    }

    #[test]
    fn rejects_bad_congestion_names() {
        for bad in ["", "cubic; rm -rf", "a_name_that_is_far_too_long", "bbr\0"] {
            assert!(
                TcpSettings::with_congestion(bad).validate().is_err(),
                "{bad:?}"
            );
        }
        TcpSettings::with_congestion("ipsan_sf_ss")
            .validate()
            .unwrap();
    }

    #[test]
    fn auto_buffer_is_bdp_with_headroom() {
        // 1 Gbit/s × 100 ms = 12.5 MB BDP; × 1.5 headroom.
        let link = Link {
            bandwidth_bps: 1_000_000_000,
            rtt: Duration::from_millis(100),
        };
        assert_eq!(link.bdp_bytes(), 12_500_000);
        assert_eq!(BufSize::Auto.bytes_for(Some(&link)), Some(18_750_000));
        assert_eq!(BufSize::Auto.bytes_for(None), None);
        assert_eq!(BufSize::Kernel.bytes_for(Some(&link)), None);
    }

    #[test]
    fn settings_round_trip_through_toml_shaped_json() {
        let s: TcpSettings = serde_json::from_str(
            r#"{"congestion":"ipsan_sf","sndbuf":"auto","rcvbuf":8388608,"nodelay":true}"#,
        )
        .unwrap();
        assert_eq!(s.congestion.as_deref(), Some("ipsan_sf"));
        assert_eq!(s.sndbuf, BufSize::Auto);
        assert_eq!(s.rcvbuf, BufSize::Bytes(8 << 20));
        let back: TcpSettings = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
        let err = serde_json::from_str::<TcpSettings>(r#"{"sndbuf":"huge"}"#).unwrap_err();
        assert!(err.to_string().contains("buffer size"), "{err}");
        assert!(serde_json::from_str::<TcpSettings>(r#"{"congestoin":"bbr"}"#).is_err());
    }

    fn pair() -> (TcpStream, TcpStream) {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let c = TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, _) = l.accept().unwrap();
        (c, s)
    }

    #[test]
    fn applies_and_reads_back_on_loopback() {
        let (c, mut s) = pair();
        let settings = TcpSettings {
            congestion: Some("reno".into()),
            sndbuf: BufSize::Bytes(256 << 10),
            rcvbuf: BufSize::Bytes(128 << 10),
            nodelay: Some(true),
            window_clamp: Some(100_000),
            link: None,
        };
        let f = settings.apply(&c).unwrap();
        assert_eq!(f.window_clamp, 100_000);
        assert_eq!(f.congestion, "reno");
        assert_eq!(f.sndbuf, 512 << 10, "Linux doubles SO_SNDBUF");
        assert_eq!(f.rcvbuf, 256 << 10);
        assert!(f.nodelay);
        assert!(f.notes.is_empty(), "{:?}", f.notes);
        assert_eq!(read_back(&c).unwrap(), f);

        let cubic = TcpSettings::with_congestion("cubic").apply(&s).unwrap();
        assert_eq!(cubic.congestion, "cubic");
        (&c).write_all(b"ping").unwrap();
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).unwrap();
    }

    #[test]
    fn auto_without_link_leaves_kernel_in_charge_and_says_so() {
        let (c, _s) = pair();
        let before = read_back(&c).unwrap();
        let s = TcpSettings {
            sndbuf: BufSize::Auto,
            ..TcpSettings::default()
        };
        let f = s.apply(&c).unwrap();
        assert_eq!(f.sndbuf, before.sndbuf);
        assert!(
            f.notes.iter().any(|n| n.contains("link not known")),
            "{:?}",
            f.notes
        );
    }

    #[test]
    fn rejects_unknown_congestion_control_with_the_list() {
        let (c, _s) = pair();
        let err = TcpSettings::with_congestion("nosuchcc")
            .apply(&c)
            .unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("nosuchcc") && msg.contains("reno"), "{msg}");
        // The socket keeps working with what it had.
        assert!(!read_back(&c).unwrap().congestion.is_empty());
    }

    #[test]
    fn reports_a_capped_buffer() {
        let (c, _s) = pair();
        let wmem_max: u64 = std::fs::read_to_string("/proc/sys/net/core/wmem_max")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let ask = (wmem_max * 2).min(MAX_BUF);
        if ask <= wmem_max {
            return; // wmem_max is already at the socket option's ceiling
        }
        let s = TcpSettings {
            sndbuf: BufSize::Bytes(ask),
            ..TcpSettings::default()
        };
        let f = s.apply(&c).unwrap();
        // Forced past the cap (CAP_NET_ADMIN) or capped; the notes say which.
        assert!(f.sndbuf == ask * 2 || f.sndbuf == wmem_max * 2, "{f:?}");
        assert!(
            f.notes.iter().any(|n| n.contains("wmem_max")),
            "{:?}",
            f.notes
        );
    }
}
