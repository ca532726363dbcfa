//! The methods: each request's parameters read and checked, then answered from the registry
//! or applied to it as one change ([`Registry::change`]).

use std::path::PathBuf;
use std::time::Duration;

use serde_json::{json, Value};
use tracing::info;

use super::views::{portals, redact_inline_secrets, sessions, status, targets, write_private};
use super::{code, RpcError, METHODS};
use crate::config::{FileChap, FileConfig, FileLun, FileSeal, FileTarget};
use crate::registry::{ChangeError, Registry};

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

pub(super) fn dispatch(registry: &Registry, method: &str, p: &Value) -> Result<Value, RpcError> {
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
