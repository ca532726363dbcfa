//! Logs to the systemd journal as structured fields (its native protocol, no libsystemd):
//! each `tracing` event becomes one datagram to `/run/systemd/journal/socket` carrying
//! `MESSAGE`, `PRIORITY`, `SYSLOG_IDENTIFIER` and every event field as `IPSAN_<NAME>`, so
//! `journalctl -u ipsan-target IPSAN_INITIATOR=iqn…` or `-o json` finds them.
//!
//! Used when stderr is the journal (systemd sets `$JOURNAL_STREAM` to stderr's
//! device:inode); otherwise logs stay plain text on stderr. Protocol: systemd's
//! "Native Journal Protocol" — `KEY=value\n`, or for values with a newline
//! `KEY\n<64-bit little-endian length>value\n`.

use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;
use std::path::PathBuf;

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::Layer;

/// The journal's native socket.
pub const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Whether stderr is connected to the journal (`$JOURNAL_STREAM` names its device:inode).
pub fn stderr_is_journal() -> bool {
    use std::os::unix::fs::MetadataExt;
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// A layer writing every event to the journal.
#[derive(Debug)]
pub struct JournalLayer {
    sock: UnixDatagram,
    path: PathBuf,
    identifier: String,
}

impl JournalLayer {
    /// Connects to `path` (normally [`JOURNAL_SOCKET`]).
    pub fn new(path: impl Into<PathBuf>, identifier: &str) -> std::io::Result<Self> {
        let path = path.into();
        let sock = UnixDatagram::unbound()?;
        Ok(Self {
            sock,
            path,
            identifier: identifier.to_owned(),
        })
    }
}

/// Appends one field in the native format.
fn field(out: &mut Vec<u8>, key: &str, value: &str) {
    if value.contains('\n') {
        out.extend_from_slice(key.as_bytes());
        out.push(b'\n');
        out.extend_from_slice(&(value.len() as u64).to_le_bytes());
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    } else {
        out.extend_from_slice(key.as_bytes());
        out.push(b'=');
        out.extend_from_slice(value.as_bytes());
        out.push(b'\n');
    }
}

/// A journal field name: upper case letters, digits and `_`, not starting with `_` or a digit.
fn key(name: &str) -> String {
    let mut k = String::from("IPSAN_");
    for c in name.chars() {
        k.push(if c.is_ascii_alphanumeric() {
            c.to_ascii_uppercase()
        } else {
            '_'
        });
    }
    k
}

/// syslog priority of a tracing level.
fn priority(l: Level) -> &'static str {
    match l {
        Level::ERROR => "3",
        Level::WARN => "4",
        Level::INFO => "6",
        _ => "7",
    }
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_str(&mut self, f: &Field, v: &str) {
        if f.name() == "message" {
            self.message = v.to_owned();
        } else {
            self.rest.push((f.name().to_owned(), v.to_owned()));
        }
    }

    fn record_debug(&mut self, f: &Field, v: &dyn std::fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{v:?}");
        if f.name() == "message" {
            self.message = s;
        } else {
            self.rest.push((f.name().to_owned(), s));
        }
    }
}

/// The datagram for one event.
fn encode(identifier: &str, level: Level, target: &str, fields: &Fields) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    // MESSAGE carries the fields too, so a plain `journalctl` shows everything.
    let mut msg = fields.message.clone();
    for (k, v) in &fields.rest {
        let _ = write!(msg, " {k}={v}");
    }
    field(&mut out, "MESSAGE", &msg);
    field(&mut out, "PRIORITY", priority(level));
    field(&mut out, "SYSLOG_IDENTIFIER", identifier);
    field(&mut out, "IPSAN_MODULE", target);
    for (k, v) in &fields.rest {
        field(&mut out, &key(k), v);
    }
    out
}

impl<S: Subscriber> Layer<S> for JournalLayer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let meta = event.metadata();
        let d = encode(&self.identifier, *meta.level(), meta.target(), &f);
        if self.sock.send_to(&d, &self.path).is_err() {
            // The journal is gone or the entry too large: stderr still reaches it as text.
            eprintln!("{}", String::from_utf8_lossy(&d).replace('\n', " "));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::layer::SubscriberExt;

    #[test]
    fn sends_events_as_native_journal_fields() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("journal");
        let rx = UnixDatagram::bind(&path).unwrap();
        let layer = JournalLayer::new(&path, "ipsan-target").unwrap();
        let sub = tracing_subscriber::registry().with(layer);
        tracing::subscriber::with_default(sub, || {
            tracing::warn!(initiator = "iqn.x:y", tsih = 7, "login refused: two\nlines");
        });
        let mut buf = vec![0u8; 4096];
        let n = rx.recv(&mut buf).unwrap();
        let d = &buf[..n];
        let text = String::from_utf8_lossy(d);
        assert!(text.contains("PRIORITY=4\n"), "{text}");
        assert!(text.contains("SYSLOG_IDENTIFIER=ipsan-target\n"), "{text}");
        assert!(text.contains("IPSAN_INITIATOR=iqn.x:y\n"), "{text}");
        assert!(text.contains("IPSAN_TSIH=7\n"), "{text}");
        // The multi-line MESSAGE uses the length-prefixed form.
        let msg = "login refused: two\nlines initiator=iqn.x:y tsih=7";
        let mut want = b"MESSAGE\n".to_vec();
        want.extend_from_slice(&(msg.len() as u64).to_le_bytes());
        want.extend_from_slice(msg.as_bytes());
        assert!(d.windows(want.len()).any(|w| w == want), "{text}");
    }
}
