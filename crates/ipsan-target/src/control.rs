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

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde_json::{json, Value};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use crate::config::{FileChap, FileConfig, FileLun, FileSeal, FileTarget};
use crate::registry::{ChangeError, Registry};

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

fn str_param<'a>(p: &'a Value, name: &str) -> Result<&'a str, RpcError> {
    p.get(name)
        .and_then(Value::as_str)
        .ok_or_else(|| RpcError::params(format!("params.{name}: a string is required")))
}

fn opt_str(p: &Value, name: &str) -> Result<Option<String>, RpcError> {
    match p.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(RpcError::params(format!("params.{name}: must be a string"))),
    }
}

fn bool_param(p: &Value, name: &str) -> Result<bool, RpcError> {
    match p.get(name) {
        None | Some(Value::Null) => Ok(false),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(RpcError::params(format!(
            "params.{name}: must be true or false"
        ))),
    }
}

fn u64_param(p: &Value, name: &str) -> Result<Option<u64>, RpcError> {
    match p.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            RpcError::params(format!("params.{name}: must be a non-negative integer"))
        }),
    }
}

fn strings_param(p: &Value, name: &str) -> Result<Vec<String>, RpcError> {
    match p.get(name) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| {
                v.as_str()
                    .map(str::to_owned)
                    .ok_or_else(|| RpcError::params(format!("params.{name}: a list of strings")))
            })
            .collect(),
        Some(_) => Err(RpcError::params(format!(
            "params.{name}: a list of strings"
        ))),
    }
}

fn path_param(p: &Value, name: &str) -> Result<Option<PathBuf>, RpcError> {
    Ok(opt_str(p, name)?.map(PathBuf::from))
}

fn target_mut<'a>(f: &'a mut FileConfig, iqn: &str) -> Result<&'a mut FileTarget, ChangeError> {
    f.target
        .iter_mut()
        .find(|t| t.iqn == iqn)
        .ok_or_else(|| ChangeError::Refused {
            field: "params.target".into(),
            why: format!("no target {iqn}"),
        })
}

/// `nvme.hosts`: replaces the host list of the subsystem named by its NQN or its target's
/// IQN (`[[nvme.subsystem]] hosts`; empty: every host the authentication lets in).
fn set_nvme_hosts(
    f: &mut FileConfig,
    subsystem: &str,
    hosts: Vec<String>,
) -> Result<(), ChangeError> {
    let nqn_of = |iqn: &str| {
        f.nvme
            .subsystem
            .iter()
            .find(|s| s.target == iqn)
            .and_then(|s| s.nqn.clone())
            .unwrap_or_else(|| crate::nvme::derived_nqn(iqn))
    };
    let iqn = f
        .target
        .iter()
        .find(|t| t.iqn == subsystem || nqn_of(&t.iqn) == subsystem)
        .map(|t| t.iqn.clone())
        .ok_or_else(|| ChangeError::Refused {
            field: "params.subsystem".into(),
            why: format!("no subsystem {subsystem} (give its NQN or its target's IQN)"),
        })?;
    match f.nvme.subsystem.iter_mut().find(|s| s.target == iqn) {
        Some(s) => s.hosts = hosts,
        None if hosts.is_empty() => {}
        None => f.nvme.subsystem.push(crate::nvme::FileNvmeSubsystem {
            target: iqn,
            nqn: None,
            hosts,
        }),
    }
    f.nvme
        .subsystem
        .retain(|s| s.nqn.is_some() || !s.hosts.is_empty());
    Ok(())
}

fn change_result(r: Result<crate::registry::ChangeReport, ChangeError>) -> Result<Value, RpcError> {
    let report = r?;
    serde_json::to_value(report).map_err(|e| RpcError::new(-32603, e.to_string()))
}

fn dispatch(registry: &Registry, method: &str, p: &Value) -> Result<Value, RpcError> {
    let force = bool_param(p, "force")?;
    match method {
        "status" => Ok(status(registry)),
        "targets" => Ok(targets(registry)),
        "sessions" => Ok(sessions(registry)),
        "portals" => Ok(json!(portals(registry))),
        "nvme" => Ok(registry
            .nvme
            .get()
            .map_or_else(|| json!({ "enabled": false }), |n| n.status())),
        "config" => {
            let f = registry
                .running_config()
                .ok_or_else(|| RpcError::from(ChangeError::NoSource))?;
            let text = f
                .to_toml()
                .map_err(|e| RpcError::new(-32603, e.to_string()))?;
            Ok(json!({ "toml": redact_inline_secrets(&text) }))
        }
        "target.add" => {
            let iqn = str_param(p, "iqn")?.to_owned();
            let alias = opt_str(p, "alias")?;
            let allow = strings_param(p, "allow")?;
            let luns = strings_param(p, "luns")?;
            change_result(registry.change(force, |f| {
                if f.target_index(&iqn).is_some() {
                    return Err(ChangeError::Refused {
                        field: "params.iqn".into(),
                        why: format!("{iqn} is already configured"),
                    });
                }
                f.target.push(FileTarget {
                    iqn,
                    alias,
                    allow,
                    chap: None,
                    chap_host: Vec::new(),
                    seal: None,
                    lun: luns
                        .into_iter()
                        .enumerate()
                        .map(|(i, backend)| FileLun::new(i as u64, backend))
                        .collect(),
                });
                Ok(())
            }))
        }
        "target.remove" => {
            let iqn = str_param(p, "iqn")?.to_owned();
            change_result(registry.change(force, |f| {
                let i = f.target_index(&iqn).ok_or_else(|| ChangeError::Refused {
                    field: "params.iqn".into(),
                    why: format!("no target {iqn}"),
                })?;
                f.target.remove(i);
                Ok(())
            }))
        }
        "target.allow" => {
            let iqn = str_param(p, "target")?.to_owned();
            let allow = strings_param(p, "allow")?;
            change_result(registry.change(force, |f| {
                target_mut(f, &iqn)?.allow = allow;
                Ok(())
            }))
        }
        "target.chap" => {
            let iqn = str_param(p, "target")?.to_owned();
            let off = bool_param(p, "off")?;
            let chap = if off {
                None
            } else {
                Some(FileChap {
                    user: str_param(p, "user")?.to_owned(),
                    secret: None,
                    secret_file: Some(path_param(p, "secret_file")?.ok_or_else(|| {
                        RpcError::params("params.secret_file: a file holding the secret is required (secrets never travel on the socket)")
                    })?),
                    mutual_user: opt_str(p, "mutual_user")?,
                    mutual_secret: None,
                    mutual_secret_file: path_param(p, "mutual_secret_file")?,
                    algorithms: None,
                })
            };
            change_result(registry.change(force, |f| {
                let t = target_mut(f, &iqn)?;
                t.chap = match (chap, t.chap.take()) {
                    (Some(mut new), Some(old)) => {
                        new.algorithms = old.algorithms;
                        Some(new)
                    }
                    (new, _) => new,
                };
                Ok(())
            }))
        }
        "target.seal" => {
            let iqn = str_param(p, "target")?.to_owned();
            let policy = opt_str(p, "policy")?;
            let secret_file = path_param(p, "secret_file")?;
            change_result(registry.change(force, |f| {
                let t = target_mut(f, &iqn)?;
                let mut s = t.seal.take().unwrap_or(FileSeal {
                    policy: None,
                    secret: None,
                    secret_file: None,
                    initiator: Vec::new(),
                });
                if policy.is_some() {
                    s.policy = policy;
                }
                if secret_file.is_some() {
                    s.secret = None;
                    s.secret_file = secret_file;
                }
                t.seal = Some(s);
                Ok(())
            }))
        }
        "nvme.hosts" => {
            let subsystem = str_param(p, "subsystem")?.to_owned();
            let hosts = strings_param(p, "hosts")?;
            change_result(registry.change(force, |f| set_nvme_hosts(f, &subsystem, hosts)))
        }
        "lun.add" => {
            let iqn = str_param(p, "target")?.to_owned();
            let backend = str_param(p, "backend")?.to_owned();
            let id = u64_param(p, "id")?;
            let block_size = u64_param(p, "block_size")?
                .map(|b| {
                    u32::try_from(b).map_err(|_| RpcError::params("params.block_size: 512 or 4096"))
                })
                .transpose()?;
            let read_only = bool_param(p, "read_only")?;
            change_result(registry.change(force, |f| {
                let t = target_mut(f, &iqn)?;
                let id = id.unwrap_or_else(|| {
                    (0..)
                        .find(|i| !t.lun.iter().any(|l| l.id == *i))
                        .unwrap_or(0)
                });
                t.lun.push(FileLun {
                    block_size,
                    read_only,
                    ..FileLun::new(id, backend)
                });
                Ok(())
            }))
        }
        "lun.remove" => {
            let iqn = str_param(p, "target")?.to_owned();
            let id = u64_param(p, "id")?.ok_or_else(|| RpcError::params("params.id: required"))?;
            change_result(registry.change(force, |f| {
                let t = target_mut(f, &iqn)?;
                let before = t.lun.len();
                t.lun.retain(|l| l.id != id);
                if t.lun.len() == before {
                    return Err(ChangeError::Refused {
                        field: "params.id".into(),
                        why: format!("{iqn} has no LUN {id}"),
                    });
                }
                Ok(())
            }))
        }
        "lun.resize" => {
            let iqn = str_param(p, "target")?.to_owned();
            let id = u64_param(p, "id")?.ok_or_else(|| RpcError::params("params.id: required"))?;
            let size = match p.get("size") {
                Some(Value::String(s)) => ipsan_scsi::backend::parse_size(s)
                    .map_err(|e| RpcError::params(format!("params.size: {e}")))?,
                Some(v) => v
                    .as_u64()
                    .ok_or_else(|| RpcError::params("params.size: bytes or a size like 2GiB"))?,
                None => return Err(RpcError::params("params.size: required (e.g. 2GiB)")),
            };
            change_result(registry.change(force, |f| {
                let t = target_mut(f, &iqn)?;
                let l =
                    t.lun
                        .iter_mut()
                        .find(|l| l.id == id)
                        .ok_or_else(|| ChangeError::Refused {
                            field: "params.id".into(),
                            why: format!("{iqn} has no LUN {id}"),
                        })?;
                l.backend = l.resized_backend(size)?;
                Ok(())
            }))
        }
        "session.drop" => {
            let tsih =
                u64_param(p, "tsih")?.ok_or_else(|| RpcError::params("params.tsih: required"))?;
            let n = registry.drop_sessions(|s| u64::from(s.tsih) == tsih);
            if n == 0 {
                return Err(RpcError::params(format!("no session with TSIH {tsih}")));
            }
            info!(tsih, "control: session dropped");
            Ok(json!({ "sessions_dropped": n }))
        }
        "logout_all" => {
            let target = opt_str(p, "target")?;
            let now = bool_param(p, "now")?;
            let wait = Duration::from_secs(u64_param(p, "wait_secs")?.unwrap_or(10).min(100));
            let pick = |s: &crate::registry::SessionInfo| {
                target.is_none() || s.target.as_deref() == target.as_deref()
            };
            let tsihs: Vec<u16> = registry
                .sessions()
                .iter()
                .filter(|s| pick(&s.info))
                .map(|s| s.info.tsih)
                .collect();
            // Ask first (AsyncEvent 1), give the initiators `wait_secs` to log out, then end
            // whatever is left; `now` ends them at once.
            if !now {
                registry.request_logout(pick);
                let deadline = std::time::Instant::now() + wait;
                while std::time::Instant::now() < deadline
                    && registry
                        .sessions()
                        .iter()
                        .any(|s| pick(&s.info) && tsihs.contains(&s.info.tsih))
                {
                    std::thread::sleep(Duration::from_millis(50));
                }
            }
            let dropped = registry.drop_sessions(|s| pick(s) && tsihs.contains(&s.tsih));
            info!(
                sessions = tsihs.len(),
                dropped,
                target = target.as_deref().unwrap_or("(all)"),
                "control: logout-all"
            );
            Ok(
                json!({ "sessions": tsihs.len(), "logged_out": tsihs.len() - dropped, "sessions_dropped": dropped }),
            )
        }
        "reload" => {
            let path = path_param(p, "path")?
                .or_else(|| crate::lock(&registry.config_path).clone())
                .ok_or_else(|| {
                    RpcError::params(
                        "params.path: the target was not started with --config; name the file",
                    )
                })?;
            let next = FileConfig::read(&path).map_err(ChangeError::from)?;
            let r = registry.apply(next, force);
            if r.is_ok() {
                info!(path = %path.display(), "control: configuration reloaded");
            }
            change_result(r)
        }
        "save" => {
            let path = path_param(p, "path")?
                .or_else(|| crate::lock(&registry.config_path).clone())
                .ok_or_else(|| {
                    RpcError::params(
                        "params.path: the target was not started with --config; name the file",
                    )
                })?;
            let f = registry
                .running_config()
                .ok_or_else(|| RpcError::from(ChangeError::NoSource))?;
            let text = f
                .to_toml()
                .map_err(|e| RpcError::new(-32603, e.to_string()))?;
            let bytes = write_private(&path, &text)
                .map_err(|e| RpcError::new(code::REFUSED, format!("{}: {e}", path.display())))?;
            info!(path = %path.display(), bytes, "control: running configuration saved");
            Ok(json!({ "path": path.display().to_string(), "bytes": bytes }))
        }
        _ => Err(RpcError::new(
            code::METHOD_NOT_FOUND,
            format!("unknown method {method:?}; methods: {}", METHODS.join(", ")),
        )),
    }
}

/// Writes `text` to `path` atomically, mode 0600: a configuration may hold inline secrets.
/// The temporary file beside it gets a fresh name and is created with `O_CREAT|O_EXCL`
/// (`create_new`), so nothing planted at a predictable name (a symlink to another file, a
/// file someone else can read) is followed or reused; it is then renamed over `path`.
fn write_private(path: &Path, text: &str) -> std::io::Result<usize> {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let base = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "config".to_owned());
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let mut attempt = 0u32;
    let (tmp, mut f) = loop {
        let tmp = dir.join(format!(
            ".{base}.{}.{nanos:08x}{attempt}.tmp",
            std::process::id()
        ));
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(&tmp)
        {
            Ok(f) => break (tmp, f),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && attempt < 16 => {
                attempt += 1;
            }
            Err(e) => return Err(e),
        }
    };
    const HEADER: &[u8] =
        b"# Written by `ipsan ctl save`: the running configuration (docs/target.md).\n";
    let written = (|| {
        f.write_all(HEADER)?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)?;
        Ok(HEADER.len() + text.len())
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written
}

/// Whether a configuration key names a secret value (not a file reference to one).
fn is_secret_key(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    (k.contains("secret") || k.contains("password") || k.contains("psk") || k == "key")
        && !k.ends_with("_file")
}

/// Replaces every secret-bearing value in `v` (any depth, arrays of tables too).
fn redact_value(v: &mut toml::Value) {
    match v {
        toml::Value::Table(t) => {
            for (k, val) in t.iter_mut() {
                if is_secret_key(k) {
                    *val = toml::Value::String("<redacted>".to_owned());
                } else {
                    redact_value(val);
                }
            }
        }
        toml::Value::Array(a) => a.iter_mut().for_each(redact_value),
        _ => {}
    }
}

/// The TOML with every inline secret replaced by `<redacted>` (for `config`, which is shown):
/// parsed and rewritten structurally, so no quoting (a multi-line string, an escaped quote)
/// lets part of a secret through. Text that does not parse is withheld whole.
fn redact_inline_secrets(text: &str) -> String {
    let Ok(mut v) = text.parse::<toml::Table>().map(toml::Value::Table) else {
        return "# <redacted: the running configuration did not parse>\n".to_owned();
    };
    redact_value(&mut v);
    toml::to_string(&v).unwrap_or_else(|_| {
        "# <redacted: the running configuration did not serialize>\n".to_owned()
    })
}

fn portals(registry: &Registry) -> Vec<String> {
    crate::read(&registry.portals)
        .iter()
        .map(ToString::to_string)
        .collect()
}

fn status(registry: &Registry) -> Value {
    let targets = registry.targets();
    json!({
        "version": env!("CARGO_PKG_VERSION"),
        "portals": portals(registry),
        "targets": targets.len(),
        "luns": targets.iter().map(|t| t.luns.len()).sum::<usize>(),
        "sessions": registry.session_count(),
        "config_path": crate::lock(&registry.config_path).as_ref().map(|p| p.display().to_string()),
        "editable": registry.running_config().is_some(),
        "limits": registry.stats.snapshot(),
    })
}

fn targets(registry: &Registry) -> Value {
    let sessions = registry.sessions();
    let list: Vec<Value> = registry
        .targets()
        .iter()
        .map(|t| {
            let stats = crate::read(&t.lun_stats);
            let luns: Vec<Value> = t
                .luns
                .iter()
                .map(|(id, lu)| {
                    let cfg = t.lun_configs.get(id);
                    let kind = t
                        .backends
                        .iter()
                        .find(|(i, _)| i == id)
                        .map_or("?", |(_, b)| b.kind());
                    json!({
                        "id": id,
                        "backend": cfg.map(|c| describe_backend(&c.backend)),
                        "kind": kind,
                        "size_bytes": lu.num_blocks() * u64::from(lu.block_size()),
                        "block_size": lu.block_size(),
                        "read_only": cfg.is_some_and(|c| c.read_only),
                        "write_cache": lu.write_cache(),
                        "state": "online",
                        "io": stats.get(id).map(|s| s.counts()),
                    })
                })
                .collect();
            let (chap_user, mutual_user) = match &t.auth {
                iscsi_proto::login::Auth::Chap(c) => {
                    (Some(c.user.clone()), c.mutual.as_ref().map(|m| m.0.clone()))
                }
                iscsi_proto::login::Auth::None | iscsi_proto::login::Auth::Relay => (None, None),
            };
            json!({
                "iqn": t.iqn,
                "alias": t.alias,
                "allow": t.allow,
                "chap_user": chap_user,
                "mutual_chap_user": mutual_user,
                "seal_policy": format!("{:?}", t.seal.policy).to_lowercase(),
                "seal_initiator_secrets": t.seal.initiators.len(),
                "sessions": sessions.iter().filter(|s| s.info.target.as_deref() == Some(t.iqn.as_str())).count(),
                "luns": luns,
            })
        })
        .collect();
    json!(list)
}

fn describe_backend(b: &ipsan_scsi::BackendSpec) -> String {
    let size = b.size.map(crate::config::format_size);
    match &b.kind {
        ipsan_scsi::BackendKind::Mem => format!("mem:{}", size.unwrap_or_default()),
        ipsan_scsi::BackendKind::Null => format!("null:{}", size.unwrap_or_default()),
        ipsan_scsi::BackendKind::File { path, direct } => format!(
            "file:{}{}{}",
            path.display(),
            size.map(|s| format!(",size={s}")).unwrap_or_default(),
            if *direct { ",direct" } else { "" }
        ),
        ipsan_scsi::BackendKind::Disk {
            file,
            seek,
            rpm,
            rate,
        } => format!(
            "disk:{},seek={}us,rpm={rpm},rate={rate}{}",
            size.unwrap_or_default(),
            seek.as_micros(),
            file.as_ref()
                .map(|f| format!(",file={}", f.display()))
                .unwrap_or_default()
        ),
        ipsan_scsi::BackendKind::Rbd(r) => format!(
            "rbd:{}/{}{}",
            r.pool,
            r.namespace
                .as_deref()
                .map(|n| format!("{n}/"))
                .unwrap_or_default(),
            r.image
        ),
    }
}

fn sessions(registry: &Registry) -> Value {
    use std::sync::atomic::Ordering;
    let list: Vec<Value> = registry
        .sessions()
        .iter()
        .map(|s| {
            let i = &s.info;
            let st = &s.stats;
            let seal = i.seal.as_ref().map(|x| {
                let (sent, received) = x.counters_used();
                let (epoch_send, epoch_recv) = x.key_epochs();
                let ss = x.stats();
                json!({
                    "cipher": x.cipher().to_string(),
                    "chunk_size": x.chunk_size(),
                    "key_epoch_send": epoch_send,
                    "key_epoch_recv": epoch_recv,
                    "counters_sent": sent,
                    "counters_received": received,
                    "chunks_sealed": ss.sealed_chunks,
                    "chunks_opened": ss.opened_chunks,
                    "forgeries_detected": ss.auth_failures,
                    "replays_detected": ss.replays,
                })
            });
            let since = i
                .since
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            json!({
                "tsih": i.tsih,
                "initiator": i.initiator,
                "isid": hex::encode(i.isid),
                "target": i.target,
                "peer": i.peer.to_string(),
                "local": i.local.map(|a| a.to_string()),
                "since_unix": since,
                "connections": s.connections,
                "chap": i.chap,
                "authenticated": i.auth.to_string(),
                "seal": seal,
                "params": i.params.iter().map(|(k, v)| (k.clone(), json!(v))).collect::<serde_json::Map<_, _>>(),
                "io": st.io.counts(),
                "r2ts": st.r2ts.load(Ordering::Relaxed),
                "digest_errors": st.digest_errors.load(Ordering::Relaxed),
                "pdu_errors": st.pdu_errors.load(Ordering::Relaxed),
                "seal_open_failures": st.seal_open_failures.load(Ordering::Relaxed),
            })
        })
        .collect();
    json!(list)
}

// ---------------------------------------------------------------------------------------
// Client

/// Sends one request to the control socket at `path` and returns its `result`, or the error
/// the target answered with (message, field).
pub fn request(path: &Path, method: &str, params: Value) -> Result<Value, ClientError> {
    // A busy target's backlog may be full for a moment: retry a refused connect briefly.
    let mut tries = 0u32;
    let mut s = loop {
        match std::os::unix::net::UnixStream::connect(path) {
            Ok(s) => break s,
            Err(e)
                if tries < 10
                    && matches!(
                        e.kind(),
                        std::io::ErrorKind::ConnectionRefused | std::io::ErrorKind::WouldBlock
                    )
                    && path.exists() =>
            {
                tries += 1;
                std::thread::sleep(Duration::from_millis(10 << tries.min(5)));
            }
            Err(e) => {
                return Err(ClientError::Connect {
                    path: path.to_owned(),
                    source: e,
                })
            }
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(120)))
        .map_err(ClientError::Io)?;
    let req = json!({"jsonrpc": "2.0", "id": 1, "method": method, "params": params});
    let mut line = serde_json::to_vec(&req).map_err(|e| ClientError::Protocol(e.to_string()))?;
    line.push(b'\n');
    s.write_all(&line).map_err(ClientError::Io)?;
    let mut answer = String::new();
    BufReader::new(&s)
        .read_line(&mut answer)
        .map_err(ClientError::Io)?;
    let v: Value = serde_json::from_str(&answer)
        .map_err(|e| ClientError::Protocol(format!("answer is not JSON ({e}): {answer:?}")))?;
    if let Some(e) = v.get("error") {
        return Err(ClientError::Remote {
            code: e.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: e
                .get("message")
                .and_then(Value::as_str)
                .unwrap_or("error")
                .to_owned(),
        });
    }
    Ok(v.get("result").cloned().unwrap_or(Value::Null))
}

/// Errors of [`request`].
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to the control socket {path}: {source}. Is `ipsan target --control {path}` running, and are you root or its user? `ipsan ctl` uses --control PATH, else $IPSAN_CONTROL, else /run/ipsan/control.sock")]
    Connect {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("control socket: {0}")]
    Io(std::io::Error),
    #[error("control socket: {0}")]
    Protocol(String),
    #[error("{message}")]
    Remote { code: i64, message: String },
}

#[cfg(test)]
mod tests {
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
