//! `ipsan target`: serve LUNs over iSCSI.

use std::path::PathBuf;

use anyhow::Context;
use ipsan_target::config::{self, Config, FileChap, FileConfig, FileLun, FileSeal, FileTarget};
use ipsan_target::control;
use tokio_util::sync::CancellationToken;

/// Serve LUNs over iSCSI (RFC 7143).
///
/// With no flags: one target, iqn.2026-11.org.ipsan:disk0, with a 256 MiB RAM LUN on
/// 127.0.0.1:3260. Prints the iscsi:// URL of every LUN once listening.
///
/// Running it as a service (systemd unit, control socket, metrics, reloads): docs/operate.md.
/// Every configuration field: docs/target.md.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on (repeatable). Port 0 picks a free port.
    #[arg(long, value_name = "ADDR:PORT")]
    portal: Vec<String>,
    /// Serve the targets over NVMe/TCP too, listening on ADDR:PORT (repeatable; the usual port
    /// is 4420). Each target is a subsystem (NQN: its IQN with `nqn.` for `iqn.`), LUN n its
    /// namespace n+1 (docs/nvme.md). Loopback only until NVMe authentication is configured,
    /// unless --insecure-no-auth. With --config also `[nvme] listen`.
    #[arg(long, value_name = "ADDR:PORT")]
    nvme_listen: Vec<String>,
    /// DH-HMAC-CHAP (TP 8006) for an NVMe/TCP host (repeatable):
    /// `HOSTNQN,SECRET-FILE[,CTRL-SECRET-FILE]`, files holding `DHHC-1:…:` secrets (mode 0600;
    /// `nvme gen-dhchap-key` makes them), the controller's for bidirectional authentication.
    /// Once one is given, every NVMe/TCP host must authenticate. With --config:
    /// `[[nvme.host]]`.
    #[arg(long, value_name = "HOSTNQN,FILE[,FILE]", conflicts_with = "config")]
    nvme_dhchap: Vec<String>,
    /// TLS 1.3 with a configured PSK (TP 8011) for an NVMe/TCP host (repeatable):
    /// `HOSTNQN,KEY-FILE`, the file holding its `NVMeTLSkey-1:…:` key (mode 0600; `nvme
    /// gen-tls-key` makes it), for every subsystem. With a key, TLS is required unless
    /// --nvme-tls says otherwise. With --config: `[[nvme.host]] tls_key_file`.
    #[arg(long, value_name = "HOSTNQN,FILE", conflicts_with = "config")]
    nvme_tls_key: Vec<String>,
    /// NVMe/TCP TLS: off | allowed (TLS or plain, by the connection's first byte) | required.
    /// Default: required with --nvme-tls-key, else off. With --config: `[nvme] tls`.
    #[arg(long, value_name = "MODE", value_parser = ["off", "allowed", "required"], conflicts_with = "config")]
    nvme_tls: Option<String>,
    /// In-capsule data an NVMe/TCP I/O queue takes (IOCCSZ): writes up to this size travel in
    /// the command capsule, larger ones wait for an R2T. A multiple of 16 bytes, at most 1MiB
    /// (default 64KiB; docs/nvme.md "In-capsule data"). With --config also `[nvme]
    /// in_capsule_data`.
    #[arg(long, value_name = "SIZE", value_parser = parse_in_capsule)]
    nvme_in_capsule: Option<u32>,
    /// Target name (IQN) of the single target defined on the command line.
    #[arg(long, default_value = config::DEFAULT_IQN)]
    iqn: String,
    /// A LUN, numbered from 0 in order: mem:256MiB | file:/path.img,size=10GiB[,direct][,bs=4096] | null:1TiB
    /// | rbd:pool/image[,rbd_cache=false] (Ceph RBD, docs/rbd.md).
    #[arg(long, value_name = "SPEC")]
    lun: Vec<String>,
    /// TOML configuration with several targets, LUNs, ACLs and CHAP (every field: docs/target.md).
    /// SIGHUP or `ipsan ctl reload` re-reads it without dropping sessions.
    #[arg(long, short = 'c', value_name = "FILE", conflicts_with_all = ["lun", "iqn", "chap_user"])]
    config: Option<PathBuf>,
    /// Serve the control socket `ipsan ctl` talks to (root-only Unix socket; docs/operate.md).
    /// Without a value: /run/ipsan/control.sock.
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = control::DEFAULT_CONTROL_PATH)]
    control: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at ADDR:PORT (GET /metrics), e.g. 127.0.0.1:9163.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// ceph.conf for rbd: LUNs (default: the CEPH_CONF variable, then /etc/ceph/ceph.conf).
    #[arg(long, value_name = "FILE", env = "CEPH_CONF")]
    ceph_conf: Option<PathBuf>,
    /// Ceph client id for rbd: LUNs, without `client.` (default: admin).
    #[arg(long, value_name = "ID")]
    ceph_id: Option<String>,
    /// RELATIVE TARGET PORT IDENTIFIER in VPD 83h: give each ipsan exporting one shared RBD
    /// image its own (1, 2, ...), so multipath sees one disk on several ports.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u16).range(1..))]
    relative_port_id: Option<u16>,
    /// Require CHAP with this user name (the secret comes from --chap-secret-file).
    #[arg(long, requires = "chap_secret_file")]
    chap_user: Option<String>,
    /// File holding the CHAP secret for --chap-user (mode 0600: a file others can read is refused).
    #[arg(long, value_name = "FILE", requires = "chap_user")]
    chap_secret_file: Option<PathBuf>,
    /// CHAP algorithms accepted for --chap-user and every --chap-host (comma-separated: sha256,
    /// sha3-256, sha1, md5). Default: sha256,sha3-256,sha1; MD5 only when listed (e.g. for
    /// libiscsi 1.19 or open-iscsi's default).
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    chap_algorithms: Vec<String>,
    /// Mutual CHAP: the name the target answers with.
    #[arg(long, requires_all = ["chap_user", "mutual_secret_file"])]
    mutual_user: Option<String>,
    /// File holding the target's mutual CHAP secret (mode 0600).
    #[arg(long, value_name = "FILE", requires = "mutual_user")]
    mutual_secret_file: Option<PathBuf>,
    /// Per-host CHAP bound to a name, as LIO binds CHAP to an ACL (repeatable):
    /// `INITIATOR-NAME,CHAP-USER,SECRET-FILE`. That name logs in only as that user with that
    /// secret; the user may claim only the names given with it. Without --chap-user, a name
    /// no --chap-host binds is refused.
    #[arg(long, value_name = "NAME,USER,FILE", conflicts_with = "config")]
    chap_host: Vec<String>,
    /// Initiator names allowed to log in (repeatable; `*` suffix wildcard). Default: all.
    /// With --config the file decides (`allow` of each target); giving it there is an error.
    #[arg(long, value_name = "IQN")]
    allow: Vec<String>,
    /// Refuse SendTargets discovery sessions (0x0209). Discovery is never sealed, even under
    /// `--seal required`: it lists the targets an initiator name may use in the clear
    /// (docs/seal.md §1). With --config: `[discovery] enabled = false`.
    #[arg(long)]
    no_discovery: bool,
    /// Commands in flight per session (the CmdSN window).
    #[arg(long)]
    queue_depth: Option<u32>,
    /// Seal (encryption above SCSI, docs/seal.md): off | allowed | required. Default: allowed.
    /// With --config the file decides (`[target.seal] policy`); giving it there is an error.
    #[arg(long)]
    seal: Option<ipsan_seal::SealPolicy>,
    /// Seal pre-shared secret for the command line's target, mode 0600 (per-initiator secrets: --config).
    #[arg(long, value_name = "FILE")]
    seal_secret_file: Option<PathBuf>,
    /// Threads that seal and open data (default: one per CPU).
    #[arg(long)]
    crypto_workers: Option<usize>,
    /// Agree to compress Seal data (LZ4 per chunk, before sealing; docs/seal.md §4b) when an
    /// initiator offers it (`ipsan bench --seal ... --compress`). Off by default: leave it off
    /// when an attacker can choose part of the data and see transfer sizes. With --config
    /// also `[server] seal_compress = true`.
    #[arg(long)]
    compress: bool,
    /// Serve targets that authenticate no host (no CHAP, per-host CHAP, relayed CHAP or
    /// `--seal required` with a secret) on portals beyond loopback, with a warning. Without
    /// it such a target is refused at start and on reloads: any host that reaches the portal
    /// could log in under any initiator name (docs/target.md, "Listening beyond loopback").
    /// With --config also `[server] insecure_no_auth = true`.
    #[arg(long)]
    insecure_no_auth: bool,
    /// TCP congestion control for every connection: cubic | bbr | reno | ipsan_sf |
    /// ipsan_sf_ss (after `ipsan tcp load`). Default: the kernel's.
    #[arg(long, value_name = "NAME")]
    tcp_congestion: Option<String>,
    /// SO_SNDBUF for every connection: bytes (e.g. 8MiB) or `kernel`.
    #[arg(long, value_name = "SIZE")]
    tcp_sndbuf: Option<ipsan_tcp::BufSize>,
    /// SO_RCVBUF for every connection: bytes (e.g. 8MiB) or `kernel`.
    #[arg(long, value_name = "SIZE")]
    tcp_rcvbuf: Option<ipsan_tcp::BufSize>,
}

/// `--nvme-dhchap HOSTNQN,SECRET-FILE[,CTRL-SECRET-FILE]`, `--nvme-tls-key HOSTNQN,KEY-FILE`
/// and `--nvme-tls MODE` into `[nvme]` (`[[nvme.host]]`, `tls`): the NVMe/TCP listener's host
/// authentication, the same flags for `ipsan target` and `ipsan gateway`.
pub(crate) fn nvme_auth_flags(
    dhchap: &[String],
    tls_keys: &[String],
    tls: Option<&str>,
    nvme: &mut ipsan_target::nvme::FileNvme,
) -> anyhow::Result<()> {
    for v in dhchap {
        let parts: Vec<&str> = v.split(',').collect();
        let (nqn, host, ctrl) = match parts.as_slice() {
            [n, h] if !n.is_empty() && !h.is_empty() => (*n, *h, None),
            [n, h, c] if !n.is_empty() && !h.is_empty() && !c.is_empty() => (*n, *h, Some(*c)),
            _ => anyhow::bail!(
                "--nvme-dhchap {v:?}: expected HOSTNQN,SECRET-FILE[,CTRL-SECRET-FILE]"
            ),
        };
        nvme.host.push(ipsan_target::nvme::FileNvmeHost {
            nqn: nqn.to_owned(),
            dhchap_secret_file: Some(PathBuf::from(host)),
            dhchap_ctrl_secret_file: ctrl.map(PathBuf::from),
            tls_key_file: None,
            subsystems: Vec::new(),
        });
    }
    for v in tls_keys {
        let Some((nqn, key)) = v
            .split_once(',')
            .filter(|(n, k)| !n.is_empty() && !k.is_empty())
        else {
            anyhow::bail!("--nvme-tls-key {v:?}: expected HOSTNQN,KEY-FILE");
        };
        match nvme
            .host
            .iter_mut()
            .find(|h| h.nqn == nqn && h.subsystems.is_empty())
        {
            Some(h) => h.tls_key_file = Some(PathBuf::from(key)),
            None => nvme.host.push(ipsan_target::nvme::FileNvmeHost {
                nqn: nqn.to_owned(),
                dhchap_secret_file: None,
                dhchap_ctrl_secret_file: None,
                tls_key_file: Some(PathBuf::from(key)),
                subsystems: Vec::new(),
            }),
        }
    }
    if let Some(m) = tls {
        nvme.tls = Some(m.to_owned());
    }
    Ok(())
}

/// `--nvme-in-capsule`: a size (`64KiB`); the configuration checks its range.
fn parse_in_capsule(s: &str) -> Result<u32, String> {
    let n = ipsan_units::parse_size(s).map_err(|e| e.to_string())?;
    u32::try_from(n).map_err(|_| format!("{s}: at most 1MiB"))
}

/// Prints a startup line on stdout for scripts and tests to read. A closed stdout (the reader
/// went away) must not take a running storage server down, so write errors are ignored where
/// `println!` would panic.
macro_rules! announce {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, $($arg)*);
        let _ = out.flush();
    }};
}

pub fn run(args: Args) -> anyhow::Result<()> {
    let control_path = args.control.clone();
    let metrics_addr = args.metrics;
    // Absolute: `ipsan ctl reload`/`save` and SIGHUP use it later, whatever the cwd.
    let config_path = args
        .config
        .as_deref()
        .map(std::path::absolute)
        .transpose()?;
    let (config, overrides) = build_config(args)?;
    if let Some(path) = &config_path {
        // Say which flags changed what the file says (docs/target.md, "Flags beside --config").
        if overrides.is_empty() {
            announce!("ipsan target: configuration {}", path.display());
        } else {
            announce!(
                "ipsan target: configuration {}, with {} from the command line",
                path.display(),
                overrides.join(", ")
            );
        }
    }
    serve(config, control_path, metrics_addr, config_path, "target")
}

/// Runs the target built from `config` until SIGINT/SIGTERM, announcing itself on stdout as
/// `ipsan <who>: listening on …` / `ipsan <who>: serving iscsi://…` (scripts wait for them).
pub(super) fn serve(
    config: Config,
    control_path: Option<PathBuf>,
    metrics_addr: Option<std::net::SocketAddr>,
    config_path: Option<PathBuf>,
    who: &'static str,
) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let server = ipsan_target::Server::bind(&config).await?;
        let registry = server.registry();
        *registry
            .config_path
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = config_path.clone();
        let stop = CancellationToken::new();
        let mut side = tokio::task::JoinSet::new();
        if let Some(path) = &control_path {
            let ctl = control::Control::bind(path, registry.clone())
                .with_context(|| format!("--control {}", path.display()))?;
            announce!("ipsan {who}: control socket {}", path.display());
            side.spawn(ctl.run(stop.clone()));
        }
        if let Some(addr) = metrics_addr {
            let l = tokio::net::TcpListener::bind(addr)
                .await
                .with_context(|| format!("--metrics {addr}"))?;
            let bound = l.local_addr().unwrap_or(addr);
            announce!("ipsan {who}: metrics http://{bound}/metrics");
            side.spawn(ipsan_target::scrape::serve_http(
                l,
                registry.clone(),
                stop.clone(),
            ));
        }
        side.spawn(reload_on_sighup(registry.clone(), stop.clone()));
        for addr in server.local_addrs() {
            announce!("ipsan {who}: listening on {addr}");
        }
        for addr in server.nvme_addrs() {
            announce!("ipsan {who}: listening on {addr} (NVMe/TCP)");
        }
        for url in server.urls().into_iter().chain(server.nvme_urls()) {
            announce!("ipsan {who}: serving {url}");
        }
        let luns: usize = registry.targets().iter().map(|t| t.luns.len()).sum();
        super::notify::notify(&format!(
            "READY=1\nSTATUS=serving {} target(s), {luns} LUN(s)",
            registry.targets().len()
        ));
        let result = server
            .run(async {
                shutdown_signal().await;
                super::notify::notify("STOPPING=1");
            })
            .await;
        stop.cancel();
        while side.join_next().await.is_some() {}
        result?;
        Ok(())
    })
}

/// SIGHUP: re-read the configuration file and apply it like `ipsan ctl reload` (validated,
/// atomic, sessions of unchanged targets untouched; a change that would hurt running sessions
/// is refused and logged).
async fn reload_on_sighup(
    registry: std::sync::Arc<ipsan_target::registry::Registry>,
    stop: CancellationToken,
) {
    let Ok(mut hup) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()) else {
        return;
    };
    loop {
        tokio::select! {
            r = hup.recv() => if r.is_none() { return },
            () = stop.cancelled() => return,
        }
        let path = registry
            .config_path
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone();
        let Some(path) = path else {
            tracing::warn!("SIGHUP: started without --config; nothing to reload");
            continue;
        };
        super::notify::notify("RELOADING=1");
        let r = tokio::task::spawn_blocking({
            let registry = registry.clone();
            let path = path.clone();
            move || {
                let next = FileConfig::read(&path)?;
                registry.apply(next, false).map_err(anyhow::Error::from)
            }
        })
        .await;
        match r {
            Ok(Ok(report)) => {
                tracing::info!(path = %path.display(), changes = report.changes.len(), sessions_dropped = report.sessions_dropped, "SIGHUP: configuration reloaded")
            }
            Ok(Err(e)) => {
                tracing::error!(path = %path.display(), "SIGHUP: reload refused, running configuration unchanged: {e:#}")
            }
            Err(e) => tracing::error!("SIGHUP: reload task failed: {e}"),
        }
        super::notify::notify("READY=1");
    }
}

/// The flags that restrict a target (who may log in, how) and so belong to the file beside
/// `--config`: each is refused there rather than dropped, since a dropped restriction
/// silently widens access (issue 31, item 5). `--iqn`, `--lun` and `--chap-user` are refused
/// by clap (`conflicts_with_all`).
fn refuse_target_flags_beside_config(args: &Args, path: &std::path::Path) -> anyhow::Result<()> {
    let mut refused = Vec::new();
    if !args.allow.is_empty() {
        refused.push("--allow (set `allow = [\"IQN\", ...]` in each [[target]])");
    }
    if args.seal.is_some() {
        refused.push("--seal (set `policy` in each [target.seal])");
    }
    if args.seal_secret_file.is_some() {
        refused.push("--seal-secret-file (set `secret_file` in each [target.seal])");
    }
    if args.chap_secret_file.is_some() {
        refused.push("--chap-secret-file (set [target.chap])");
    }
    if args.no_discovery {
        refused.push("--no-discovery (set `enabled = false` in [discovery])");
    }
    if !args.chap_algorithms.is_empty() {
        refused.push("--chap-algorithms (set `algorithms` in [target.chap])");
    }
    if args.mutual_user.is_some() || args.mutual_secret_file.is_some() {
        refused.push("--mutual-user/--mutual-secret-file (set [target.chap])");
    }
    anyhow::ensure!(
        refused.is_empty(),
        "--config {}: the file decides every target's access and Seal, so these flags would not apply: {}; \
         put them in the file instead (docs/target.md)",
        path.display(),
        refused.join("; ")
    );
    Ok(())
}

/// The configuration, always through its file form so that flags, files, `ipsan ctl` edits
/// and reloads are validated by the same code and `ipsan ctl save` can write it back. Beside
/// `--config`, also the flags that changed the file's settings, for the startup line.
fn build_config(args: Args) -> anyhow::Result<(Config, Vec<String>)> {
    let mut overrides = Vec::new();
    let mut file = match &args.config {
        Some(path) => {
            refuse_target_flags_beside_config(&args, path)?;
            FileConfig::read(path)?
        }
        None => {
            config::check_iqn("--iqn", &args.iqn)?;
            let specs = if args.lun.is_empty() {
                vec!["mem:256MiB".to_owned()]
            } else {
                args.lun.clone()
            };
            anyhow::ensure!(
                args.chap_algorithms.is_empty()
                    || args.chap_user.is_some()
                    || !args.chap_host.is_empty(),
                "--chap-algorithms applies to --chap-user or --chap-host; give one of them"
            );
            let algorithms =
                (!args.chap_algorithms.is_empty()).then(|| args.chap_algorithms.clone());
            let mut chap_hosts = config::chap_hosts_from_flags(&args.chap_host)?;
            for h in &mut chap_hosts {
                h.algorithms.clone_from(&algorithms);
            }
            let chap = args.chap_user.as_ref().map(|u| FileChap {
                user: u.clone(),
                secret: None,
                secret_file: args.chap_secret_file.clone(),
                mutual_user: args.mutual_user.clone(),
                mutual_secret: None,
                mutual_secret_file: args.mutual_secret_file.clone(),
                algorithms: algorithms.clone(),
            });
            FileConfig {
                target: vec![FileTarget {
                    iqn: args.iqn.clone(),
                    alias: None,
                    allow: args.allow.clone(),
                    chap,
                    chap_host: chap_hosts,
                    seal: Some(FileSeal {
                        policy: Some(
                            seal_policy_name(args.seal.unwrap_or(ipsan_seal::SealPolicy::Allowed))
                                .to_owned(),
                        ),
                        secret: None,
                        secret_file: args.seal_secret_file.clone(),
                        initiator: Vec::new(),
                    }),
                    lun: specs
                        .iter()
                        .enumerate()
                        .map(|(i, s)| FileLun::new(i as u64, s.clone()))
                        .collect(),
                }],
                discovery: config::FileDiscovery {
                    enabled: args.no_discovery.then_some(false),
                    ..config::FileDiscovery::default()
                },
                ..FileConfig::default()
            }
        }
    };
    // --ceph-conf / --ceph-id apply to every rbd: LUN that does not name its own.
    let mut ceph_applied = (false, false);
    for l in file.target.iter_mut().flat_map(|t| t.lun.iter_mut()) {
        if l.backend.starts_with("rbd:") {
            if l.conf.is_none() && args.ceph_conf.is_some() {
                l.conf.clone_from(&args.ceph_conf);
                ceph_applied.0 = true;
            }
            if l.ceph_id.is_none() && args.ceph_id.is_some() {
                l.ceph_id.clone_from(&args.ceph_id);
                ceph_applied.1 = true;
            }
        }
    }
    if ceph_applied.0 {
        overrides.push("--ceph-conf (rbd: LUNs without `conf`)".to_owned());
    }
    if ceph_applied.1 {
        overrides.push("--ceph-id (rbd: LUNs without `ceph_id`)".to_owned());
    }
    if args.config.is_some() && args.ceph_id.is_some() && !ceph_applied.1 {
        // Only rbd: LUNs take it; beside a file without one it would do nothing.
        anyhow::bail!("--ceph-id: no rbd: LUN of the --config file lacks its own `ceph_id`; it would not apply");
    }
    if let Some(id) = args.relative_port_id {
        file.server.relative_port_id = Some(id);
        overrides.push(format!("--relative-port-id {id}"));
    }
    if !args.portal.is_empty() {
        for p in &args.portal {
            p.parse::<std::net::SocketAddr>()
                .with_context(|| format!("--portal {p}: expected ADDR:PORT"))?;
        }
        file.server.portals = Some(args.portal.clone());
        overrides.push(format!("--portal {}", args.portal.join(" --portal ")));
    }
    if !args.nvme_listen.is_empty() {
        for p in &args.nvme_listen {
            p.parse::<std::net::SocketAddr>()
                .with_context(|| format!("--nvme-listen {p}: expected ADDR:PORT"))?;
        }
        file.nvme.listen.clone_from(&args.nvme_listen);
        overrides.push(format!(
            "--nvme-listen {}",
            args.nvme_listen.join(" --nvme-listen ")
        ));
    }
    nvme_auth_flags(
        &args.nvme_dhchap,
        &args.nvme_tls_key,
        args.nvme_tls.as_deref(),
        &mut file.nvme,
    )?;
    if let Some(n) = args.nvme_in_capsule {
        file.nvme.in_capsule_data = Some(n);
        overrides.push(format!("--nvme-in-capsule {n}"));
    }
    if let Some(d) = args.queue_depth {
        anyhow::ensure!(
            (1..=4096).contains(&d),
            "--queue-depth: must be in 1..=4096"
        );
        file.server.queue_depth = Some(d);
        overrides.push(format!("--queue-depth {d}"));
    }
    if args.tcp_congestion.is_some() || args.tcp_sndbuf.is_some() || args.tcp_rcvbuf.is_some() {
        let mut t = file.server.tcp.clone().unwrap_or_default();
        if let Some(c) = &args.tcp_congestion {
            t.congestion = Some(c.clone());
        }
        if let Some(b) = args.tcp_sndbuf {
            t.sndbuf = b;
        }
        if let Some(b) = args.tcp_rcvbuf {
            t.rcvbuf = b;
        }
        t.validate().map_err(|e| anyhow::anyhow!("--tcp-*: {e}"))?;
        file.server.tcp = Some(t);
        overrides.push("--tcp-* (server.tcp)".to_owned());
    }
    if let Some(n) = args.crypto_workers {
        anyhow::ensure!(
            (1..=256).contains(&n),
            "--crypto-workers: must be in 1..=256"
        );
        file.server.crypto_workers = Some(n);
        overrides.push(format!("--crypto-workers {n}"));
    }
    if args.config.is_none() {
        overrides.clear();
    }
    let mut config = Config::from_file_config(&file)?;
    if args.compress {
        config.seal_compress = true;
        if args.config.is_some() {
            overrides.push("--compress".to_owned());
        }
    }
    if args.insecure_no_auth {
        // Not written into the file form: `ipsan ctl save` keeps the file's own choice.
        config.insecure_no_auth = true;
        if args.config.is_some() {
            overrides.push("--insecure-no-auth".to_owned());
        }
    }
    Ok((config, overrides))
}

pub(super) fn seal_policy_name(p: ipsan_seal::SealPolicy) -> &'static str {
    match p {
        ipsan_seal::SealPolicy::Off => "off",
        ipsan_seal::SealPolicy::Allowed => "allowed",
        ipsan_seal::SealPolicy::Required => "required",
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn shutdown_signal() {
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        () = term => {}
    }
}
