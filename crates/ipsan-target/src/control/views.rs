//! What the read-only methods answer (status, targets, sessions, portals) and how `config`
//! and `save` keep secrets private (redaction, a file written mode 0600).

use std::io::Write;
use std::path::Path;

use serde_json::{json, Value};

use crate::registry::Registry;

/// Writes `text` to `path` atomically, mode 0600: a configuration may hold inline secrets.
/// The temporary file beside it gets a fresh name and is created with `O_CREAT|O_EXCL`
/// (`create_new`), so nothing planted at a predictable name (a symlink to another file, a
/// file someone else can read) is followed or reused; it is then renamed over `path`.
pub(super) fn write_private(path: &Path, text: &str) -> std::io::Result<usize> {
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
pub(super) fn redact_inline_secrets(text: &str) -> String {
    let Ok(mut v) = text.parse::<toml::Table>().map(toml::Value::Table) else {
        return "# <redacted: the running configuration did not parse>\n".to_owned();
    };
    redact_value(&mut v);
    toml::to_string(&v).unwrap_or_else(|_| {
        "# <redacted: the running configuration did not serialize>\n".to_owned()
    })
}

pub(super) fn portals(registry: &Registry) -> Vec<String> {
    crate::read(&registry.portals)
        .iter()
        .map(ToString::to_string)
        .collect()
}

pub(super) fn status(registry: &Registry) -> Value {
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

pub(super) fn targets(registry: &Registry) -> Value {
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

pub(super) fn sessions(registry: &Registry) -> Value {
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
