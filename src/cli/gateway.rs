//! `ipsan gateway`: sealed storage any host can use (issue 15, docs/gateway.md).
//!
//! A gateway is `ipsan target` whose LUNs are remote iSCSI LUNs (`iscsi://` backends,
//! `ipsan_target::remote`): this file asks the remote target for its LUNs (REPORT LUNS),
//! builds the target configuration that mirrors them, and runs the normal target. Hosts log in
//! to the listening side with their own initiators (open-iscsi, QEMU, Windows, VMware); every
//! host session gets its own session on the remote target, logged in with the host's
//! InitiatorName and ISID, negotiated by ipsan's initiator (ImmediateData, unsolicited data,
//! large bursts) and sealed if `--seal CIPHER` is given.
//!
//! ```text
//! # branch office: hosts log in plain to a local portal; the WAN leg is sealed
//! ipsan gateway --listen 127.0.0.1:3260 --to iscsi://dc:3260/iqn.2026-11.org.ipsan:disk0 \
//!     --seal aes-256-gcm --secret-file wan.key
//! # hosts authenticated by the array itself: CHAP relayed, no secret on the gateway
//! ipsan gateway --listen 10.0.0.2:3260 --chap-relay \
//!     --to iscsi://10.0.0.5:3260/iqn.2003-01.org.linux-iscsi.array:lun1/0
//! # data centre: a sealed front for a plain array
//! ipsan gateway --listen 0.0.0.0:3260 --seal required --seal-secret-file wan.key \
//!     --to iscsi://10.0.0.5:3260/iqn.2003-01.org.linux-iscsi.array:lun1
//! ```

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use ipsan_target::config::{self, Config, FileChap, FileConfig, FileLun, FileSeal, FileTarget};

/// `--seal`'s help here: the flag is `ipsan bench`'s, but the gateway also takes a policy
/// (the parser in `run`).
const SEAL_HELP: &str = "Either the Seal cipher of the remote leg (with --secret-file): \
aes-256-gcm | chacha20-poly1305 | 3des-cbc-hmac-sha1 | none; or the Seal policy of the \
listening side (with --seal-secret-file): off | allowed | required, the same as --listen-seal";

/// Serve a remote iSCSI target's LUNs to hosts: plain or sealed on either side.
///
/// `--seal` names the Seal cipher of the remote leg (aes-256-gcm, chacha20-poly1305, ...,
/// with --secret-file) or, given as off|allowed|required, the Seal policy of the listening side
/// (with --seal-secret-file). Prints `ipsan gateway: listening on ADDR` and one
/// `ipsan gateway: serving iscsi://…` line per LUN once ready, as `ipsan target` does.
#[derive(Debug, clap::Args)]
#[command(mut_arg("seal", |a| {
    a.value_name("CIPHER|POLICY").help(SEAL_HELP).long_help(SEAL_HELP)
}))]
pub struct Args {
    /// Address hosts log in to (repeatable). Port 0 picks a free port.
    #[arg(long, value_name = "ADDR:PORT", default_value = "127.0.0.1:3260")]
    listen: Vec<String>,
    /// Serve the remote LUNs over NVMe/TCP too, listening on ADDR:PORT (repeatable): LUN n is
    /// namespace n+1 of the subsystem named after --iqn (docs/nvme.md "Remote LUNs"). NVMe
    /// hosts reach the remote target through one session of the gateway's own
    /// (--initiator-name), not under a name of theirs, so the gateway authenticates them:
    /// loopback only unless --nvme-dhchap (every host proves its secret) or --nvme-tls
    /// required with --nvme-tls-key, or --insecure-no-host-auth.
    #[arg(long, value_name = "ADDR:PORT")]
    nvme_listen: Vec<String>,
    /// DH-HMAC-CHAP (TP 8006) for an NVMe/TCP host (repeatable), as `ipsan target` takes it:
    /// `HOSTNQN,SECRET-FILE[,CTRL-SECRET-FILE]`, files holding `DHHC-1:…:` secrets (mode
    /// 0600). Once one is given, every NVMe/TCP host must authenticate.
    #[arg(long, value_name = "HOSTNQN,FILE[,FILE]", requires = "nvme_listen")]
    nvme_dhchap: Vec<String>,
    /// TLS 1.3 with a configured PSK (TP 8011) for an NVMe/TCP host (repeatable):
    /// `HOSTNQN,KEY-FILE` holding its `NVMeTLSkey-1:…:` key (mode 0600). With a key, TLS is
    /// required unless --nvme-tls says otherwise.
    #[arg(long, value_name = "HOSTNQN,FILE", requires = "nvme_listen")]
    nvme_tls_key: Vec<String>,
    /// NVMe/TCP TLS: off | allowed | required (default: required with --nvme-tls-key, else off).
    #[arg(long, value_name = "MODE", value_parser = ["off", "allowed", "required"], requires = "nvme_listen")]
    nvme_tls: Option<String>,
    /// Host NQN allowed to connect over NVMe/TCP (repeatable; default: every host the
    /// authentication lets in). Others are refused at Connect; `ipsan ctl nvme hosts` changes
    /// the list live.
    #[arg(long, value_name = "HOSTNQN", requires = "nvme_listen")]
    nvme_host: Vec<String>,
    /// The remote target: iscsi://[user@]host[:port]/target-iqn[/lun]. Without a LUN every LUN
    /// it reports (REPORT LUNS at start) is served under the same number.
    #[arg(long, value_name = "URL")]
    to: String,
    /// Commands in flight per remote session at most (default: the remote CmdSN window).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    depth: Option<u64>,
    /// iSCSI connections per remote session (RFC 7143 §4.2, docs/gateway.md "Several
    /// connections"): the first login to the remote target offers this many (MaxConnections);
    /// when it grants several (ipsan does, up to its connections_per_session) every remote
    /// session opens that many and spreads commands over them, each sealed with its own keys;
    /// a far end that answers 1 (tgtd, LIO) gets one. 1 never offers more. Several connections
    /// recover a lost one by --erl 2 where the far end grants it; where it does not, a lost
    /// connection ends the remote session, which the gateway logs in again within
    /// --recovery-timeout (idempotent commands sent again). Relayed CHAP (--chap-relay) always
    /// uses one.
    #[arg(long, default_value_t = ipsan_target::remote::DEFAULT_CONNECTIONS, value_parser = clap::value_parser!(u16).range(1..=64))]
    connections: u16,
    /// ErrorRecoveryLevel, 0 or 2 (RFC 7143 §7.2, §13.20; docs/gateway.md "Connection
    /// recovery"): offered by the remote leg's sessions of several connections, and granted by
    /// the listening side (to another gateway; Linux and libiscsi offer 0 and see no change).
    /// At 2, where the far end grants it, a lost WAN connection's commands are reassigned to a
    /// live one (TASK REASSIGN; sealed writes sealed again under its keys) and the connection
    /// logs in again: the host sees nothing. 0: a lost connection ends the remote session.
    #[arg(long = "erl", value_name = "LEVEL", default_value_t = ipsan_target::remote::DEFAULT_ERROR_RECOVERY_LEVEL,
          value_parser = clap::value_parser!(u32).range(0..=2))]
    error_recovery_level: u32,
    /// With several connections, which one a command goes on: least-queued (the default: the
    /// one whose socket would deliver it soonest, its bytes not yet acknowledged by TCP over
    /// its rate), least-bytes (the fewest bytes outstanding) or round-robin.
    #[arg(long, default_value = "least-queued")]
    spread: ipsan_initiator::Spread,
    /// Target name (IQN) hosts see (default: the remote target's name).
    #[arg(long)]
    iqn: Option<String>,
    /// Seal pre-shared secret of the listening side, mode 0600 (with --seal allowed|required).
    #[arg(long, value_name = "FILE")]
    seal_secret_file: Option<PathBuf>,
    /// Seal policy of the listening side, off|allowed|required (default allowed): the same as
    /// `--seal off|allowed|required`, for when `--seal` names the remote leg's cipher (both
    /// sides sealed).
    #[arg(long, value_name = "POLICY", value_parser = ["off", "allowed", "required"])]
    listen_seal: Option<String>,
    /// Require CHAP from hosts with this user name (the secret comes from --chap-secret-file).
    #[arg(long, requires = "chap_secret_file")]
    chap_user: Option<String>,
    /// File holding the hosts' CHAP secret for --chap-user (mode 0600).
    #[arg(long, value_name = "FILE")]
    chap_secret_file: Option<PathBuf>,
    /// Per-host CHAP on the listening side, bound to the name the host may claim (repeatable):
    /// `INITIATOR-NAME,CHAP-USER,SECRET-FILE`. The remote session logs in under that name, so
    /// a host can only reach what the array grants the name it authenticated as. Without
    /// --chap-user, a name no --chap-host binds is refused.
    #[arg(long, value_name = "NAME,USER,FILE")]
    chap_host: Vec<String>,
    /// Relay each host's CHAP to the remote target (mutual CHAP too): the remote target
    /// authenticates every host with the host's own secret, under the name it declares, and
    /// the gateway holds no host secret. A CHAP user in --to (with --password-file) is then
    /// used only for the REPORT LUNS at start.
    #[arg(long, conflicts_with_all = ["chap_user", "chap_host"])]
    chap_relay: bool,
    /// Listen beyond loopback without authenticating hosts (no --chap-host, --chap-user or
    /// --seal required): every host on the network may then claim any initiator name, and the
    /// remote session logs in under it with the gateway's own credentials. `ipsan target`
    /// calls it --insecure-no-auth, which is accepted here too.
    #[arg(long, alias = "insecure-no-auth")]
    insecure_no_host_auth: bool,
    /// Host names allowed to log in (repeatable; `*` suffix wildcard). Default: all.
    #[arg(long, value_name = "IQN")]
    allow: Vec<String>,
    /// Commands in flight per host session (the listening side's CmdSN window).
    #[arg(long)]
    queue_depth: Option<u32>,
    /// Serve the control socket `ipsan ctl` talks to (docs/operate.md).
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = ipsan_target::control::DEFAULT_CONTROL_PATH)]
    control: Option<PathBuf>,
    /// Serve Prometheus metrics over HTTP at ADDR:PORT (GET /metrics).
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<std::net::SocketAddr>,
    /// The remote leg: login, CHAP, Seal (`--seal CIPHER --secret-file`), TCP and keepalive
    /// flags, as `ipsan bench` takes them. `--initiator-name` is used only for the REPORT
    /// LUNS at start: host sessions log in to the remote target with the host's own name.
    #[command(flatten)]
    conn: super::bench::ConnArgs,
}

pub fn run(mut args: Args) -> anyhow::Result<()> {
    // `--seal off|allowed|required` is the listening side's policy; a cipher is the WAN's.
    let listen_policy = match args.conn.seal.as_deref() {
        Some(p @ ("off" | "allowed" | "required")) => {
            anyhow::ensure!(
                args.listen_seal.is_none(),
                "--seal {p} and --listen-seal both set the listening side's policy"
            );
            let p = p.to_owned();
            args.conn.seal = None;
            p
        }
        _ => args
            .listen_seal
            .clone()
            .unwrap_or_else(|| "allowed".to_owned()),
    };
    check_host_auth(&args, &listen_policy)?;
    anyhow::ensure!(
        args.error_recovery_level != 1,
        "--erl is 0 or 2 (ErrorRecoveryLevel 1, digest-error recovery by SNACK, is the target's only)"
    );
    let wan_seal = args.conn.seal.clone();
    let url = ipsan_initiator::IscsiUrl::parse(&args.to).context("--to")?;
    let remote_iqn = url
        .require_target()
        .context("--to: the URL needs a target name")?
        .to_owned();
    let luns = match url.lun {
        Some(l) => vec![u64::from(l)],
        None => remote_luns(&args)?,
    };
    anyhow::ensure!(
        !luns.is_empty(),
        "{}: the remote target reports no LUN",
        args.to
    );
    let iqn = args.iqn.clone().unwrap_or_else(|| remote_iqn.clone());
    config::check_iqn("--iqn", &iqn)?;
    let base = format!("iscsi://{}/{remote_iqn}", url.socket_addr_string());
    if url.user.is_some() && args.conn.password_file.is_none() {
        anyhow::bail!("a CHAP user in --to needs --password-file (the gateway keeps no secret in its configuration)");
    }
    let file_luns = luns
        .iter()
        .map(|id| FileLun {
            seal: wan_seal.clone(),
            secret_file: wan_seal.as_ref().and(args.conn.secret_file.clone()),
            depth: args.depth.map(|d| d as usize),
            tcp_congestion: args.conn.tcp_congestion.clone(),
            chap_user: url.user.clone().filter(|_| !args.chap_relay),
            chap_secret_file: url
                .user
                .as_ref()
                .filter(|_| !args.chap_relay)
                .and(args.conn.password_file.clone()),
            chap_relay: args.chap_relay,
            connections: Some(args.connections),
            error_recovery_level: Some(args.error_recovery_level),
            ..FileLun::new(*id, format!("{base}/{id}"))
        })
        .collect();
    let mut file = FileConfig {
        target: vec![FileTarget {
            iqn,
            alias: None,
            allow: args.allow.clone(),
            chap_host: config::chap_hosts_from_flags(&args.chap_host)?,
            chap: args.chap_user.as_ref().map(|u| FileChap {
                user: u.clone(),
                secret: None,
                secret_file: args.chap_secret_file.clone(),
                mutual_user: None,
                mutual_secret: None,
                mutual_secret_file: None,
                algorithms: None,
            }),
            seal: Some(FileSeal {
                policy: Some(listen_policy),
                secret: None,
                secret_file: args.seal_secret_file.clone(),
                initiator: Vec::new(),
            }),
            lun: file_luns,
        }],
        ..FileConfig::default()
    };
    for p in &args.listen {
        p.parse::<std::net::SocketAddr>()
            .with_context(|| format!("--listen {p}: expected ADDR:PORT"))?;
    }
    file.server.portals = Some(args.listen.clone());
    for p in &args.nvme_listen {
        p.parse::<std::net::SocketAddr>()
            .with_context(|| format!("--nvme-listen {p}: expected ADDR:PORT"))?;
    }
    file.nvme.listen.clone_from(&args.nvme_listen);
    // The NVMe listener's host authentication: with it, `ipsan_target::nvme::check_exposure`
    // lets the listener face beyond loopback; without it the listener stays loopback only.
    super::target::nvme_auth_flags(
        &args.nvme_dhchap,
        &args.nvme_tls_key,
        args.nvme_tls.as_deref(),
        &mut file.nvme,
    )?;
    if !args.nvme_host.is_empty() {
        file.nvme
            .subsystem
            .push(ipsan_target::nvme::FileNvmeSubsystem {
                target: file.target[0].iqn.clone(),
                nqn: None,
                hosts: args.nvme_host.clone(),
            });
    }
    if let Some(d) = args.queue_depth {
        anyhow::ensure!(
            (1..=4096).contains(&d),
            "--queue-depth: must be in 1..=4096"
        );
        file.server.queue_depth = Some(d);
    }
    if let Some(n) = args.conn.crypto_workers {
        file.server.crypto_workers = Some(n);
    }
    // The listening side grants what the remote leg offers: a near gateway's WAN sessions
    // recover their connections at ErrorRecoveryLevel 2 when this far one grants it.
    file.server.error_recovery_level = Some(args.error_recovery_level);
    let mut config = Config::from_file_config(&file)?;
    // The target's own check (ipsan_target::exposure) runs again at bind; the flag that
    // passed `check_host_auth` above passes it too.
    config.insecure_no_auth = args.insecure_no_host_auth;
    // `--compress`: the sealed remote leg offers compression, and a sealed listening side
    // agrees to it when its hosts (another gateway) offer it (docs/seal.md §4b).
    config.seal_compress = args.conn.compress;
    // The file form carries the essentials; the remote sessions get every --to flag (digests,
    // bursts, keepalive, buffers) from the same code `ipsan bench` uses. Seal stays the file
    // form's: the target's crypto pool serves both sides.
    let seal_flag = args.conn.seal.take();
    let (_, session) = args.conn.config(&args.to)?;
    args.conn.seal = seal_flag;
    for t in &mut config.targets {
        for l in &mut t.luns {
            if let Some(r) = &l.remote {
                let mut spec = (**r).clone();
                spec.session = ipsan_initiator::SessionConfig {
                    extension: None,
                    ..session.clone()
                };
                spec.compress = args.conn.compress;
                spec.spread = args.spread;
                l.remote = Some(Arc::new(spec));
            }
        }
    }
    super::target::serve(config, args.control, args.metrics, None, "gateway")
}

/// A gateway never widens access (issue 31): the remote session logs in under the name the
/// host declares, with the gateway's credentials, so a listening side that authenticates
/// nobody lets any host that reaches it claim any name the array admits. Refused beyond
/// loopback unless `--insecure-no-host-auth`; shared credentials are warned about, as they
/// let each holder claim every name no `--chap-host` binds.
fn check_host_auth(args: &Args, listen_policy: &str) -> anyhow::Result<()> {
    let shared = args.chap_user.is_some() || listen_policy == "required";
    let per_host = !args.chap_host.is_empty() || args.chap_relay;
    let beyond_loopback: Vec<&str> = args
        .listen
        .iter()
        .filter(|p| {
            p.parse::<std::net::SocketAddr>()
                .is_ok_and(|a| ipsan_target::exposure::beyond_loopback(&a))
        })
        .map(String::as_str)
        .collect();
    if !shared && !per_host {
        if beyond_loopback.is_empty() || args.insecure_no_host_auth {
            if !beyond_loopback.is_empty() {
                tracing::warn!(
                    "--insecure-no-host-auth: hosts are not authenticated on {}; any host that reaches it may claim any initiator name and act as it on the remote target",
                    beyond_loopback.join(", ")
                );
            }
            return Ok(());
        }
        anyhow::bail!(
            "refusing to listen on {} without authenticating hosts: the remote session logs in under whatever initiator name a host declares, with the gateway's own credentials, so any host that reaches the gateway could act as any host the remote target admits. Let the remote target authenticate each host (--chap-relay), or bind each host's name to its own CHAP credential (--chap-host NAME,USER,SECRET-FILE), or give --chap-user/--seal required, or pass --insecure-no-host-auth to accept the risk",
            beyond_loopback.join(", ")
        );
    }
    if shared && !per_host {
        tracing::warn!(
            "hosts share one credential on the listening side (--chap-user or --seal required): each holder may claim any initiator name and act as it on the remote target; bind names with --chap-host"
        );
    }
    Ok(())
}

/// The remote target's LUNs, by REPORT LUNS over a session of the gateway's own
/// (`--initiator-name`), logged out again.
fn remote_luns(args: &Args) -> anyhow::Result<Vec<u64>> {
    let (url, cfg) = args.conn.config(&args.to)?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async {
        let s = ipsan_initiator::Session::connect(&url, &cfg)
            .await
            .with_context(|| format!("--to {}: cannot log in", args.to))?;
        // A fresh nexus may first report a unit attention.
        let mut luns = None;
        for _ in 0..4 {
            match s.report_luns().await {
                Ok(l) => {
                    luns = Some(l);
                    break;
                }
                Err(e)
                    if e.sense().is_some_and(|s| {
                        s.key == ipsan_initiator::scsi::SenseKey::UNIT_ATTENTION
                    }) => {}
                Err(e) => return Err(anyhow::Error::from(e).context("REPORT LUNS")),
            }
        }
        let _ = s.logout().await;
        luns.context("REPORT LUNS: unit attentions did not clear")
    })
}
