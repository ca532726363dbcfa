//! `ipsan ctl`: inspect and change a running `ipsan target --control` (docs/operate.md).

use std::path::PathBuf;

use anyhow::Context;
use ipsan_target::control;
use serde_json::{json, Value};

/// Inspect and change a running target through its control socket.
///
/// Every change is validated like the configuration file (errors name the field), applied
/// atomically, and leaves sessions it does not concern alone. `save` writes the running
/// configuration back to TOML. Protocol and methods: docs/operate.md.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The target's control socket (before or after the subcommand).
    #[arg(long, value_name = "PATH", default_value = control::DEFAULT_CONTROL_PATH, env = "IPSAN_CONTROL", global = true)]
    control: PathBuf,
    /// Print the raw JSON answer instead of text (before or after the subcommand).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Debug, clap::Subcommand)]
enum Cmd {
    /// Portals, numbers of targets, LUNs and sessions, login-limit counters.
    Status,
    /// Targets with their LUNs (backend, size, state, I/O), allow-lists, CHAP user, Seal policy.
    #[command(alias = "ls")]
    Targets,
    /// Sessions: initiator, address, negotiated parameters, CHAP/Seal (cipher, key epoch),
    /// commands in flight, bytes and commands per direction, errors.
    Sessions,
    /// The listening portals.
    Portals,
    /// NVMe/TCP (docs/nvme.md): listeners, subsystems with their namespaces and host lists,
    /// and the live controllers (host NQN, I/O queues, reads and writes); `nvme hosts`
    /// changes a subsystem's host list.
    Nvme {
        #[command(subcommand)]
        command: Option<NvmeCmd>,
    },
    /// The running configuration as TOML (inline secrets redacted).
    Config,
    /// Add, remove or change a target.
    #[command(subcommand)]
    Target(TargetCmd),
    /// Add, remove or resize a LUN.
    #[command(subcommand)]
    Lun(LunCmd),
    /// End one session (its commands in flight finish first).
    #[command(subcommand)]
    Session(SessionCmd),
    /// Ask every session (of one target with --target) to log out, e.g. before maintenance:
    /// AsyncEvent 1 first, then sessions still there after --wait seconds are ended.
    LogoutAll {
        #[arg(long, value_name = "IQN")]
        target: Option<String>,
        /// Seconds the initiators get to log out before their sessions are ended.
        #[arg(long, default_value_t = 10)]
        wait: u64,
        /// End the sessions at once, without asking.
        #[arg(long)]
        now: bool,
    },
    /// Re-read the configuration file and apply it (like SIGHUP).
    Reload {
        /// Another file than the one the target started with.
        path: Option<PathBuf>,
        /// Apply even if it removes LUNs or targets in use (hosts are told).
        #[arg(long)]
        force: bool,
    },
    /// Write the running configuration to the file it came from (or PATH), mode 0600.
    Save { path: Option<PathBuf> },
    /// Send any method with JSON params (see docs/operate.md).
    Call {
        method: String,
        #[arg(default_value = "{}")]
        params: String,
    },
}

#[derive(Debug, clap::Subcommand)]
enum TargetCmd {
    /// Add a target with at least one LUN.
    Add {
        iqn: String,
        /// LUN backends, numbered from 0: mem:64MiB | file:/path.img,size=10GiB | null:1TiB.
        #[arg(long = "lun", value_name = "SPEC", required = true)]
        luns: Vec<String>,
        #[arg(long)]
        alias: Option<String>,
        /// Initiator names allowed (`*` suffix wildcard); default all.
        #[arg(long, value_name = "IQN")]
        allow: Vec<String>,
    },
    /// Remove a target (refused while sessions are logged in unless --force).
    Remove {
        iqn: String,
        #[arg(long)]
        force: bool,
    },
    /// Replace a target's allow-list (no names: allow everyone). Sessions of initiators no
    /// longer allowed are ended; others stay.
    Allow { iqn: String, names: Vec<String> },
    /// Set or remove a target's CHAP secret (new logins; sessions logged in stay).
    Chap {
        iqn: String,
        #[arg(long, required_unless_present = "off")]
        user: Option<String>,
        /// File holding the secret (mode 0600); secrets never travel on the socket.
        #[arg(long, value_name = "FILE", required_unless_present = "off")]
        secret_file: Option<PathBuf>,
        #[arg(long, requires = "mutual_secret_file")]
        mutual_user: Option<String>,
        #[arg(long, value_name = "FILE")]
        mutual_secret_file: Option<PathBuf>,
        /// Turn CHAP off for this target.
        #[arg(long, conflicts_with_all = ["user", "secret_file"])]
        off: bool,
    },
    /// Change a target's Seal policy or pre-shared secret (new logins).
    Seal {
        iqn: String,
        /// off | allowed | required
        #[arg(long)]
        policy: Option<String>,
        #[arg(long, value_name = "FILE")]
        secret_file: Option<PathBuf>,
    },
}

#[derive(Debug, clap::Subcommand)]
enum LunCmd {
    /// Add a LUN; it is usable at once (hosts rescan to see it).
    Add {
        #[arg(long, value_name = "IQN")]
        target: String,
        /// mem:64MiB | file:/path.img,size=10GiB[,direct][,bs=4096] | null:1TiB
        backend: String,
        /// LUN number (default: the lowest free).
        #[arg(long)]
        id: Option<u64>,
        #[arg(long)]
        block_size: Option<u32>,
        #[arg(long)]
        read_only: bool,
    },
    /// Remove a LUN: refused while the target has sessions unless --force, which tells the
    /// hosts with REPORTED LUNS DATA HAS CHANGED.
    Remove {
        #[arg(long, value_name = "IQN")]
        target: String,
        id: u64,
        #[arg(long)]
        force: bool,
    },
    /// Grow a file or null LUN online (hosts get CAPACITY DATA HAS CHANGED).
    Resize {
        #[arg(long, value_name = "IQN")]
        target: String,
        id: u64,
        /// New size, e.g. 20GiB.
        size: String,
    },
}

#[derive(Debug, clap::Subcommand)]
enum NvmeCmd {
    /// Replace the host NQNs allowed to connect to a subsystem (no NQNs: every host the
    /// authentication lets in). Controllers of hosts taken off the list are closed; new
    /// Connects are checked at once, no restart.
    Hosts {
        /// The subsystem's NQN, or its target's IQN.
        subsystem: String,
        /// Host NQNs allowed to connect.
        hosts: Vec<String>,
    },
}

#[derive(Debug, clap::Subcommand)]
enum SessionCmd {
    /// End the session with this TSIH (`ipsan ctl sessions` lists them).
    Drop { tsih: u16 },
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let (method, params) = match &args.command {
        Cmd::Status => ("status", json!({})),
        Cmd::Targets => ("targets", json!({})),
        Cmd::Sessions => ("sessions", json!({})),
        Cmd::Portals => ("portals", json!({})),
        Cmd::Nvme { command: None } => ("nvme", json!({})),
        Cmd::Nvme {
            command: Some(NvmeCmd::Hosts { subsystem, hosts }),
        } => (
            "nvme.hosts",
            json!({"subsystem": subsystem, "hosts": hosts}),
        ),
        Cmd::Config => ("config", json!({})),
        Cmd::Target(TargetCmd::Add {
            iqn,
            luns,
            alias,
            allow,
        }) => (
            "target.add",
            json!({"iqn": iqn, "luns": luns, "alias": alias, "allow": allow}),
        ),
        Cmd::Target(TargetCmd::Remove { iqn, force }) => {
            ("target.remove", json!({"iqn": iqn, "force": force}))
        }
        Cmd::Target(TargetCmd::Allow { iqn, names }) => {
            ("target.allow", json!({"target": iqn, "allow": names}))
        }
        Cmd::Target(TargetCmd::Chap {
            iqn,
            user,
            secret_file,
            mutual_user,
            mutual_secret_file,
            off,
        }) => (
            "target.chap",
            json!({"target": iqn, "user": user, "secret_file": abs(secret_file.as_ref())?,
                   "mutual_user": mutual_user, "mutual_secret_file": abs(mutual_secret_file.as_ref())?, "off": off}),
        ),
        Cmd::Target(TargetCmd::Seal {
            iqn,
            policy,
            secret_file,
        }) => (
            "target.seal",
            json!({"target": iqn, "policy": policy, "secret_file": abs(secret_file.as_ref())?}),
        ),
        Cmd::Lun(LunCmd::Add {
            target,
            backend,
            id,
            block_size,
            read_only,
        }) => (
            "lun.add",
            json!({"target": target, "backend": backend, "id": id, "block_size": block_size, "read_only": read_only}),
        ),
        Cmd::Lun(LunCmd::Remove { target, id, force }) => (
            "lun.remove",
            json!({"target": target, "id": id, "force": force}),
        ),
        Cmd::Lun(LunCmd::Resize { target, id, size }) => (
            "lun.resize",
            json!({"target": target, "id": id, "size": size}),
        ),
        Cmd::Session(SessionCmd::Drop { tsih }) => ("session.drop", json!({"tsih": tsih})),
        Cmd::LogoutAll { target, wait, now } => (
            "logout_all",
            json!({"target": target, "wait_secs": wait, "now": now}),
        ),
        Cmd::Reload { path, force } => (
            "reload",
            json!({"path": abs(path.as_ref())?, "force": force}),
        ),
        Cmd::Save { path } => ("save", json!({"path": abs(path.as_ref())?})),
        Cmd::Call { method, params } => (
            method.as_str(),
            serde_json::from_str(params).context("params: not JSON")?,
        ),
    };
    let result = control::request(&args.control, method, params)
        .map_err(|e| anyhow::anyhow!("{method}: {e}"))?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
        return Ok(());
    }
    match &args.command {
        Cmd::Status => print_status(&result),
        Cmd::Targets => print_targets(&result),
        Cmd::Sessions => print_sessions(&result),
        Cmd::Portals => print_list(&result),
        Cmd::Nvme { command: None } => print_nvme(&result),
        Cmd::Config => print!("{}", result["toml"].as_str().unwrap_or_default()),
        Cmd::Save { .. } => println!(
            "saved {} bytes to {}",
            result["bytes"],
            result["path"].as_str().unwrap_or_default()
        ),
        // `call` is the raw protocol: its answer is shown as it came.
        Cmd::Call { .. } => println!("{}", serde_json::to_string_pretty(&result)?),
        _ => print_generic(&result),
    }
    Ok(())
}

/// A JSON value as text: strings without quotes, lists comma-separated, `-` for null.
fn text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => "-".to_owned(),
        Value::Array(a) if a.is_empty() => "none".to_owned(),
        Value::Array(a) => a.iter().map(text).collect::<Vec<_>>().join(", "),
        Value::Object(o) => o
            .iter()
            .map(|(k, v)| format!("{k}={}", text(v)))
            .collect::<Vec<_>>()
            .join(" "),
        other => other.to_string(),
    }
}

fn print_nvme(v: &Value) {
    if v["enabled"].as_bool() != Some(true) {
        println!("NVMe/TCP is off (no [nvme] listen / --nvme-listen)");
        return;
    }
    println!(
        "listen: {}  connections={}",
        text(&v["listen"]),
        v["connections"]
    );
    for s in v["subsystems"].as_array().into_iter().flatten() {
        println!("{}", text(&s["nqn"]));
        if s["hosts"].is_array() {
            println!("  hosts: {}", text(&s["hosts"]));
        }
        if s["dhchap_hosts"].as_array().is_some_and(|a| !a.is_empty()) {
            println!("  DH-HMAC-CHAP secrets: {}", text(&s["dhchap_hosts"]));
        }
        for n in s["namespaces"].as_array().into_iter().flatten() {
            println!(
                "  nsid {}  {} bytes  block {}{}",
                n["nsid"],
                n["size_bytes"],
                n["block_size"],
                if n["read_only"].as_bool() == Some(true) {
                    "  read-only"
                } else {
                    ""
                }
            );
        }
    }
    for c in v["controllers"].as_array().into_iter().flatten() {
        println!(
            "controller {}  {}  host {}  io_queues={}  reads={} ({} bytes)  writes={} ({} bytes)",
            c["cntlid"],
            text(&c["subsystem"]),
            text(&c["host"]),
            text(&c["io_queues"]),
            c["read_commands"],
            c["bytes_read"],
            c["write_commands"],
            c["bytes_written"]
        );
    }
}

fn print_status(v: &Value) {
    println!("ipsan target {}", text(&v["version"]));
    println!("portals: {}", text(&v["portals"]));
    println!(
        "targets={} luns={} sessions={}",
        v["targets"], v["luns"], v["sessions"]
    );
    println!(
        "config: {}{}",
        text(&v["config_path"]),
        if v["editable"].as_bool() == Some(true) {
            " (editable)"
        } else {
            ""
        }
    );
    println!("limits: {}", text(&v["limits"]));
}

fn print_list(v: &Value) {
    for item in v.as_array().into_iter().flatten() {
        println!("{}", text(item));
    }
}

/// Paths go to the target as absolute paths (it does not share our working directory).
fn abs(p: Option<&PathBuf>) -> anyhow::Result<Option<String>> {
    p.map(|p| {
        std::path::absolute(p)
            .map(|a| a.display().to_string())
            .with_context(|| p.display().to_string())
    })
    .transpose()
}

fn print_generic(v: &Value) {
    if let Some(changes) = v.get("changes").and_then(Value::as_array) {
        if changes.is_empty() {
            println!("no change");
        }
        for c in changes {
            println!("{}", c.as_str().unwrap_or_default());
        }
        if let Some(n) = v.get("sessions_dropped").and_then(Value::as_u64) {
            if n > 0 {
                println!("{n} session(s) ended");
            }
        }
        for r in v
            .get("restart_needed")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            println!(
                "note: {} changed; takes effect at the next start",
                r.as_str().unwrap_or_default()
            );
        }
        return;
    }
    match v.as_object() {
        Some(o) => {
            for (k, v) in o {
                println!("{k}: {}", text(v));
            }
        }
        None => println!("{}", text(v)),
    }
}

fn print_targets(v: &Value) {
    for t in v.as_array().into_iter().flatten() {
        println!(
            "{}  sessions={}  allow={}  chap={}  seal={}",
            t["iqn"].as_str().unwrap_or_default(),
            t["sessions"],
            if t["allow"].as_array().is_some_and(|a| !a.is_empty()) {
                t["allow"].to_string()
            } else {
                "all".into()
            },
            t["chap_user"].as_str().unwrap_or("off"),
            t["seal_policy"].as_str().unwrap_or_default(),
        );
        for l in t["luns"].as_array().into_iter().flatten() {
            let io = &l["io"];
            println!(
                "  lun {:<3} {:<8} {:>14} bytes  bs={}  {}  {}  read={}B/{} write={}B/{} in_flight={} errors={}",
                l["id"],
                l["kind"].as_str().unwrap_or_default(),
                l["size_bytes"],
                l["block_size"],
                l["state"].as_str().unwrap_or_default(),
                l["backend"].as_str().unwrap_or_default(),
                io["read_bytes"],
                io["read_commands"],
                io["write_bytes"],
                io["write_commands"],
                io["in_flight"],
                io["errors"],
            );
        }
    }
}

fn print_sessions(v: &Value) {
    let list = v.as_array().cloned().unwrap_or_default();
    if list.is_empty() {
        println!("no sessions");
    }
    for s in list {
        let seal = match s["seal"].as_object() {
            Some(x) => format!(
                "seal={} epoch={}/{} forgeries={}",
                x["cipher"].as_str().unwrap_or_default(),
                x["key_epoch_send"],
                x["key_epoch_recv"],
                x["forgeries_detected"]
            ),
            None => "seal=off".into(),
        };
        let io = &s["io"];
        println!(
            "tsih {}  {} -> {}  from {}  chap={}  {seal}",
            s["tsih"],
            s["initiator"].as_str().unwrap_or_default(),
            s["target"].as_str().unwrap_or("(discovery)"),
            s["peer"].as_str().unwrap_or_default(),
            s["chap"],
        );
        println!(
            "  in_flight={} read={}B/{} write={}B/{} other={} errors={} r2ts={} digest_errors={} seal_open_failures={}",
            io["in_flight"],
            io["read_bytes"],
            io["read_commands"],
            io["write_bytes"],
            io["write_commands"],
            io["other_commands"],
            io["errors"],
            s["r2ts"],
            s["digest_errors"],
            s["seal_open_failures"],
        );
        if let Some(p) = s["params"].as_object() {
            let kv: Vec<String> = p
                .iter()
                .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                .collect();
            println!("  {}", kv.join(" "));
        }
    }
}
