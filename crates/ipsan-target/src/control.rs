//! The control socket: inspect and change a running target (`ipsan ctl`).
//!
//! # Protocol
//! A Unix stream socket (default [`DEFAULT_CONTROL_PATH`]) carrying JSON-RPC 2.0, one JSON
//! object per line in each direction (docs/operate.md lists every method):
//!
//! ```text
//! → {"jsonrpc":"2.0","id":1,"method":"lun.add","params":{"target":"iqn…","backend":"mem:64MiB"}}
//! ← {"jsonrpc":"2.0","id":1,"result":{"changes":["target iqn… LUN 1 added"],…}}
//! ← {"jsonrpc":"2.0","id":2,"error":{"code":1,"message":"target[0].lun[1].id: LUN 0 is configured twice","data":{"field":"target[0].lun[1].id"}}}
//! ```
//!
//! Requests on one connection are answered in order; many connections are served at once,
//! and changes are serialized by the registry ([`Registry::change`]), each validated like
//! the file and applied atomically.
//!
//! # Who may connect
//! The socket is created mode 0600 in a directory of mode 0700, and every connection's peer
//! credentials (`SO_PEERCRED`) are checked: only root, or the user the target runs as, is
//! served; anyone else gets one error line and the connection is closed.
//!
//! # Limits
//! A request line may be at most [`MAX_REQUEST_BYTES`]; a longer one is answered with an
//! error and the connection closed. A connection idle for [`IDLE_TIMEOUT`] is closed, and at
//! most [`MAX_CLIENTS`] connections are served at once.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::registry::{ChangeError, Registry};

mod client;
mod dispatch;
mod views;

pub use client::{request, ClientError};
use dispatch::dispatch;

/// Where `ipsan target` listens and `ipsan ctl` connects unless told otherwise.
pub const DEFAULT_CONTROL_PATH: &str = "/run/ipsan/control.sock";
/// The longest request line accepted.
pub const MAX_REQUEST_BYTES: usize = 1 << 20;
/// A control connection with no request for this long is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// Control connections served at once.
pub const MAX_CLIENTS: usize = 256;

/// JSON-RPC error codes (JSON-RPC 2.0 §5.1) and ours.
pub mod code {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    /// The change was refused (invalid configuration, in use, cannot be done online).
    pub const REFUSED: i64 = 1;
    /// The caller is not allowed to use the socket.
    pub const FORBIDDEN: i64 = 2;
}

/// An error answer.
#[derive(Debug)]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    pub field: Option<String>,
}

impl RpcError {
    fn new(code: i64, message: impl Into<String>) -> Self {
        Self {
            code,
            message: message.into(),
            field: None,
        }
    }

    fn params(message: impl Into<String>) -> Self {
        Self::new(code::INVALID_PARAMS, message)
    }

    fn to_json(&self) -> Value {
        let mut e = json!({"code": self.code, "message": self.message});
        if let Some(f) = &self.field {
            e["data"] = json!({ "field": f });
        }
        e
    }
}

impl From<ChangeError> for RpcError {
    fn from(e: ChangeError) -> Self {
        let field = match &e {
            ChangeError::Config(c) => Some(c.field.clone()),
            ChangeError::Refused { field, .. } => Some(field.clone()),
            ChangeError::NoSource => None,
        };
        Self {
            code: code::REFUSED,
            message: e.to_string(),
            field,
        }
    }
}

/// Whether a peer with `peer_uid` may use a control socket served by `own_uid`: root, or
/// the user the target itself runs as.
#[must_use]
pub fn authorized(peer_uid: u32, own_uid: u32) -> bool {
    peer_uid == 0 || peer_uid == own_uid
}

/// The uid this process runs as, learned from a socket pair's peer credentials (no FFI).
fn own_uid() -> std::io::Result<u32> {
    let (a, _b) = std::os::unix::net::UnixStream::pair()?;
    a.set_nonblocking(true)?;
    Ok(UnixStream::from_std(a)?.peer_cred()?.uid())
}

/// The control socket's directory must be owned by the target's user and closed to group and
/// others (mode 0700 or stricter), as docs/operate.md promises: otherwise someone else could
/// replace the socket between two starts, or see it at all. An existing directory that is
/// not is refused with the fix in the message, never chmod-ed: it may be shared (`/tmp`).
pub fn check_private_dir(dir: &Path, own_uid: u32) -> std::io::Result<()> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(dir)?;
    let mode = meta.mode() & 0o7777;
    if meta.uid() != own_uid {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the control socket's directory {} belongs to uid {}, not to this process (uid {own_uid}): choose a socket in a directory of your own, e.g. {DEFAULT_CONTROL_PATH} (created mode 0700)",
                dir.display(),
                meta.uid()
            ),
        ));
    }
    if mode & 0o077 != 0 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::PermissionDenied,
            format!(
                "the control socket's directory {} has mode {mode:04o}: group and others must have no access (chmod 700 {}), or choose a socket in a directory that does not exist yet (it is created mode 0700)",
                dir.display(),
                dir.display()
            ),
        ));
    }
    Ok(())
}

/// A bound control socket.
#[derive(Debug)]
pub struct Control {
    listener: UnixListener,
    path: PathBuf,
    registry: Arc<Registry>,
    own_uid: u32,
}

impl Control {
    /// Creates the socket at `path`. Its directory is created 0700 if missing; an existing
    /// one must be ours and closed to group and others ([`check_private_dir`]): it is refused,
    /// never chmod-ed (it may be shared, like /tmp). A stale socket left by a crashed target is
    /// replaced, a live one is an error.
    pub fn bind(path: &Path, registry: Arc<Registry>) -> std::io::Result<Self> {
        use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
        let own_uid = own_uid()?;
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        };
        if !dir.exists() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)?;
        }
        check_private_dir(dir, own_uid)?;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            if !meta.file_type().is_socket() {
                // Never delete what is not a stale socket (a mistyped --control path).
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AlreadyExists,
                    format!("{} exists and is not a socket", path.display()),
                ));
            }
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::AddrInUse,
                    format!("{} is in use by a running target", path.display()),
                ));
            }
            std::fs::remove_file(path)?;
        }
        // A deep backlog: a burst of `ipsan ctl` calls (scripts, 100 at once in the tests)
        // must queue, not be refused (a full Unix socket backlog answers ECONNREFUSED).
        let sock = tokio::net::UnixSocket::new_stream()?;
        sock.bind(path)?;
        let listener = sock.listen(1024)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Self {
            listener,
            path: path.to_owned(),
            registry,
            own_uid,
        })
    }

    /// Serves until `stop` is cancelled, then removes the socket.
    pub async fn run(self, stop: CancellationToken) {
        let limit = Arc::new(tokio::sync::Semaphore::new(MAX_CLIENTS));
        loop {
            let accepted = tokio::select! {
                a = self.listener.accept() => a,
                () = stop.cancelled() => break,
            };
            let stream = match accepted {
                Ok((s, _)) => s,
                Err(e) => {
                    warn!("control socket accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            };
            let Ok(permit) = limit.clone().try_acquire_owned() else {
                debug!("control socket: too many clients; closing one");
                continue;
            };
            let registry = self.registry.clone();
            let own = self.own_uid;
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = serve_client(stream, registry, own) => {}
                    () = stop.cancelled() => {}
                }
                drop(permit);
            });
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

async fn serve_client(stream: UnixStream, registry: Arc<Registry>, own: u32) {
    let (rd, mut wr) = stream.into_split();
    let peer = wr.as_ref().peer_cred();
    let uid = peer.as_ref().map(tokio::net::unix::UCred::uid).ok();
    if !uid.is_some_and(|u| authorized(u, own)) {
        warn!(
            peer_uid = ?uid,
            pid = ?peer.ok().and_then(|p| p.pid()),
            "control socket: caller refused (only root or the target's own user)"
        );
        let e = RpcError::new(
            code::FORBIDDEN,
            "permission denied: the control socket serves root only",
        );
        let _ = write_line(&mut wr, &response(Value::Null, Err(e))).await;
        return;
    }
    let mut rd = tokio::io::BufReader::new(rd);
    let mut line = Vec::new();
    loop {
        line.clear();
        let mut limited = (&mut rd).take(MAX_REQUEST_BYTES as u64 + 1);
        let read = tokio::time::timeout(IDLE_TIMEOUT, limited.read_until(b'\n', &mut line)).await;
        let n = match read {
            Err(_) | Ok(Err(_)) | Ok(Ok(0)) => return,
            Ok(Ok(n)) => n,
        };
        if n > MAX_REQUEST_BYTES || (line.last() != Some(&b'\n') && n == MAX_REQUEST_BYTES + 1) {
            let e = RpcError::new(
                code::INVALID_REQUEST,
                format!("request longer than {MAX_REQUEST_BYTES} bytes"),
            );
            let _ = write_line(&mut wr, &response(Value::Null, Err(e))).await;
            return;
        }
        let text = line.clone();
        let registry = registry.clone();
        let answer = tokio::task::spawn_blocking(move || handle_line(&registry, &text))
            .await
            .unwrap_or_else(|_| {
                response(
                    Value::Null,
                    Err(RpcError::new(
                        -32603,
                        "internal error while handling the request",
                    )),
                )
            });
        if write_line(&mut wr, &answer).await.is_err() {
            return;
        }
    }
}

async fn write_line(wr: &mut tokio::net::unix::OwnedWriteHalf, v: &Value) -> std::io::Result<()> {
    let mut b = serde_json::to_vec(v).unwrap_or_default();
    b.push(b'\n');
    wr.write_all(&b).await
}

fn response(id: Value, r: Result<Value, RpcError>) -> Value {
    match r {
        Ok(v) => json!({"jsonrpc": "2.0", "id": id, "result": v}),
        Err(e) => json!({"jsonrpc": "2.0", "id": id, "error": e.to_json()}),
    }
}

/// Answers one request line (a JSON-RPC 2.0 request object).
#[must_use]
pub fn handle_line(registry: &Registry, line: &[u8]) -> Value {
    let req: Value = match serde_json::from_slice(line) {
        Ok(v) => v,
        Err(e) => {
            count(registry, false);
            return response(
                Value::Null,
                Err(RpcError::new(code::PARSE_ERROR, format!("not JSON: {e}"))),
            );
        }
    };
    let id = req.get("id").cloned().unwrap_or(Value::Null);
    let Some(method) = req.get("method").and_then(Value::as_str) else {
        count(registry, false);
        return response(
            id,
            Err(RpcError::new(
                code::INVALID_REQUEST,
                "a request is an object with \"method\" (a string) and optional \"params\" (an object)",
            )),
        );
    };
    let params = req.get("params").cloned().unwrap_or_else(|| json!({}));
    if !params.is_object() {
        count(registry, false);
        return response(id, Err(RpcError::params("params must be an object")));
    }
    let r = dispatch(registry, method, &params);
    count(registry, r.is_ok());
    match &r {
        Ok(_) if is_change(method) => info!(method, "control: change applied"),
        Err(e) if e.code == code::REFUSED => {
            info!(method, "control: change refused: {}", e.message)
        }
        _ => {}
    }
    response(id, r)
}

fn count(registry: &Registry, ok: bool) {
    use std::sync::atomic::Ordering;
    if ok {
        registry.metrics.control_ok.fetch_add(1, Ordering::Relaxed);
    } else {
        registry
            .metrics
            .control_errors
            .fetch_add(1, Ordering::Relaxed);
    }
}

fn is_change(method: &str) -> bool {
    !matches!(
        method,
        "status" | "targets" | "sessions" | "portals" | "config" | "metrics" | "nvme"
    )
}

/// The methods (docs/operate.md).
pub const METHODS: &[&str] = &[
    "status",
    "targets",
    "sessions",
    "portals",
    "nvme",
    "config",
    "target.add",
    "target.remove",
    "target.allow",
    "target.chap",
    "target.seal",
    "lun.add",
    "lun.remove",
    "lun.resize",
    "nvme.hosts",
    "session.drop",
    "logout_all",
    "reload",
    "save",
];

#[cfg(test)]
mod tests {
    use super::views::write_private;
    use super::*;

    fn registry() -> Registry {
        let c = crate::Config::from_toml(
            "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
        )
        .unwrap();
        Registry::build(&c).unwrap()
    }

    #[test]
    fn redacts_inline_secrets_from_the_shown_config() {
        let r = Registry::build(
            &crate::Config::from_toml(
                "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[target.chap]\nuser = \"u\"\nsecret = \"inline-secret-123456\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
            )
            .unwrap(),
        )
        .unwrap();
        let v = handle_line(&r, br#"{"method":"config"}"#);
        let toml = v["result"]["toml"].as_str().unwrap();
        assert!(!toml.contains("inline-secret"), "{toml}");
        assert!(toml.contains("secret = \"<redacted>\""), "{toml}");
        assert!(
            !format!("{r:?}").contains("inline-secret"),
            "secret in Debug"
        );
    }

    #[test]
    fn redacts_a_multi_line_inline_secret_from_the_shown_config() {
        // A secret holding a newline serializes as a TOML multi-line string; the old
        // line-based redaction replaced its first line only and showed the rest.
        let r = Registry::build(
            &crate::Config::from_toml(
                "[[target]]\niqn = \"iqn.2026-11.x:a\"\n[target.chap]\nuser = \"u\"\nsecret = \"\"\"\nfirst-line-of-it\nleaked-second-line-9\"\"\"\nmutual_user = \"t\"\nmutual_secret = \"mutual-one\\\"quoted\\nmore-mutual-9\"\n[target.seal]\nsecret = \"seal-line-1\\nseal-line-2-0123456789\"\n[[target.seal.initiator]]\nname = \"iqn.2026-11.x:h\"\nsecret = \"host-line-1\\nhost-line-2-0123456789\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
            )
            .unwrap(),
        )
        .unwrap();
        let v = handle_line(&r, br#"{"method":"config"}"#);
        let toml = v["result"]["toml"].as_str().unwrap();
        for part in [
            "first-line-of-it",
            "leaked-second-line",
            "mutual-one",
            "quoted",
            "more-mutual",
            "seal-line",
            "host-line",
        ] {
            assert!(!toml.contains(part), "{part} shown: {toml}");
        }
        assert_eq!(toml.matches("<redacted>").count(), 4, "{toml}");
        // Still the configuration: names and the LUN are shown.
        assert!(
            toml.contains("iqn.2026-11.x:h") && toml.contains("mem:4MiB"),
            "{toml}"
        );
    }

    #[test]
    fn save_does_not_follow_a_symlink_planted_at_the_temporary_name() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "keep me").unwrap();
        let path = dir.path().join("ipsan.toml");
        // The names the old code and a careless new one would use.
        for name in ["ipsan.toml.tmp", ".ipsan.toml.tmp"] {
            std::os::unix::fs::symlink(&victim, dir.path().join(name)).unwrap();
        }
        write_private(&path, "[server]\n").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me");
        let meta = std::fs::symlink_metadata(&path).unwrap();
        assert!(meta.file_type().is_file());
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert!(std::fs::read_to_string(&path).unwrap().contains("[server]"));
        // No temporary file is left behind.
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.ends_with(".tmp") && !n.contains("ipsan.toml.tmp"))
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    #[tokio::test]
    async fn refuses_to_replace_a_file_that_is_not_a_socket() {
        let dir = tempfile::tempdir().unwrap();
        // A private directory, so the file is what is refused (check_private_dir).
        std::fs::set_permissions(
            dir.path(),
            <std::fs::Permissions as std::os::unix::fs::PermissionsExt>::from_mode(0o700),
        )
        .unwrap();
        let p = dir.path().join("precious.toml");
        std::fs::write(&p, "keep me").unwrap();
        let e = Control::bind(&p, std::sync::Arc::new(registry())).unwrap_err();
        assert!(e.to_string().contains("not a socket"), "{e}");
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "keep me");
    }

    #[test]
    fn answers_every_mutated_request_with_a_result_or_an_error() {
        // Deterministic xorshift: truncations, bit flips and splices of valid requests, plus
        // random bytes; every one must get a well-formed answer (no panic).
        let r = registry();
        let valid: [&[u8]; 4] = [
            br#"{"jsonrpc":"2.0","id":1,"method":"lun.add","params":{"target":"iqn.2026-11.x:a","backend":"mem:1MiB","id":9}}"#,
            br#"{"id":2,"method":"lun.resize","params":{"target":"iqn.2026-11.x:a","id":0,"size":"8MiB"}}"#,
            br#"{"id":3,"method":"target.add","params":{"iqn":"iqn.2026-11.x:b","luns":["null:1MiB"]}}"#,
            br#"{"id":4,"method":"sessions"}"#,
        ];
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for i in 0..3000 {
            let base = valid[i % valid.len()];
            let mut m = base.to_vec();
            match next() % 4 {
                0 => m.truncate((next() as usize) % base.len()),
                1 => {
                    for _ in 0..1 + next() % 4 {
                        let at = (next() as usize) % m.len();
                        m[at] ^= 1 << (next() % 8);
                    }
                }
                2 => {
                    let other = valid[(next() as usize) % valid.len()];
                    let cut = (next() as usize) % m.len();
                    m.truncate(cut);
                    m.extend_from_slice(&other[(next() as usize) % other.len()..]);
                }
                _ => m = (0..next() % 64).map(|_| next() as u8).collect(),
            }
            let v = handle_line(&r, &m);
            assert!(
                v.get("result").is_some() != v.get("error").is_some(),
                "{:?} -> {v}",
                String::from_utf8_lossy(&m)
            );
        }
        // Whatever the mutations changed, the registry still agrees with its configuration.
        let f = r.running_config().unwrap();
        for t in r.targets().iter() {
            let ft = &f.target[f.target_index(&t.iqn).unwrap()];
            let ids: Vec<u64> = t.luns.keys().copied().collect();
            let mut want: Vec<u64> = ft.lun.iter().map(|l| l.id).collect();
            want.sort_unstable();
            assert_eq!(ids, want);
        }
    }

    #[test]
    fn authorizes_root_and_its_own_user_only() {
        assert!(authorized(0, 1000));
        assert!(authorized(1000, 1000));
        assert!(authorized(0, 0));
        assert!(!authorized(65534, 0));
        assert!(!authorized(1001, 1000));
    }

    #[test]
    fn rejects_malformed_requests_with_errors() {
        let r = registry();
        for (line, code) in [
            (&b"garbage"[..], code::PARSE_ERROR),
            (b"{\"method\":", code::PARSE_ERROR),
            (b"\xff\xfe\x00", code::PARSE_ERROR),
            (b"[1,2,3]", code::INVALID_REQUEST),
            (b"{\"id\":3}", code::INVALID_REQUEST),
            (b"{\"id\":3,\"method\":7}", code::INVALID_REQUEST),
            (b"{\"method\":\"targets\",\"params\":[1]}", code::INVALID_PARAMS),
            (b"{\"method\":\"nope\"}", code::METHOD_NOT_FOUND),
            (b"{\"method\":\"lun.add\",\"params\":{\"target\":5}}", code::INVALID_PARAMS),
            (b"{\"method\":\"lun.resize\",\"params\":{\"target\":\"iqn.2026-11.x:a\",\"id\":0,\"size\":-1}}", code::INVALID_PARAMS),
        ] {
            let v = handle_line(&r, line);
            assert_eq!(v["error"]["code"], json!(code), "{:?}: {v}", String::from_utf8_lossy(line));
        }
    }

    #[test]
    fn applies_lun_add_and_names_the_field_of_a_bad_change() {
        let r = registry();
        let v = handle_line(
            &r,
            br#"{"id":1,"method":"lun.add","params":{"target":"iqn.2026-11.x:a","backend":"mem:8MiB"}}"#,
        );
        assert!(
            v["result"]["changes"][0]
                .as_str()
                .unwrap()
                .contains("LUN 1 added"),
            "{v}"
        );
        assert_eq!(r.target("iqn.2026-11.x:a").unwrap().luns.len(), 2);
        let v = handle_line(
            &r,
            br#"{"id":2,"method":"lun.add","params":{"target":"iqn.2026-11.x:a","backend":"mem:lots"}}"#,
        );
        assert_eq!(
            v["error"]["data"]["field"],
            json!("target[0].lun[2].backend"),
            "{v}"
        );
        let v = handle_line(
            &r,
            br#"{"id":3,"method":"lun.add","params":{"target":"iqn.2026-11.x:a","backend":"mem:8MiB","id":1}}"#,
        );
        assert_eq!(
            v["error"]["data"]["field"],
            json!("target[0].lun[2].id"),
            "{v}"
        );
        // Nothing of the refused changes stuck.
        assert_eq!(r.target("iqn.2026-11.x:a").unwrap().luns.len(), 2);
        assert_eq!(r.running_config().unwrap().target[0].lun.len(), 2);
    }
}
