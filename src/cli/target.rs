//! `ipsan target`: serve LUNs over iSCSI.

use std::path::PathBuf;

use anyhow::Context;
use ipsan_target::config::{self, Config, TargetConfig};

/// Serve LUNs over iSCSI (RFC 7143).
///
/// With no flags: one target, iqn.2026-11.org.ipsan:disk0, with a 256 MiB RAM LUN on
/// 127.0.0.1:3260. Prints the iscsi:// URL of every LUN once listening.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Address to listen on (repeatable). Port 0 picks a free port.
    #[arg(long, value_name = "ADDR:PORT")]
    portal: Vec<String>,
    /// Target name (IQN) of the single target defined on the command line.
    #[arg(long, default_value = config::DEFAULT_IQN)]
    iqn: String,
    /// A LUN, numbered from 0 in order: mem:256MiB | file:/path.img,size=10GiB[,direct][,bs=4096] | null:1TiB
    /// | rbd:pool/image[,rbd_cache=false] (Ceph RBD, docs/rbd.md).
    #[arg(long, value_name = "SPEC")]
    lun: Vec<String>,
    /// TOML configuration with several targets, LUNs, ACLs and CHAP (see docs/target.md).
    #[arg(long, short = 'c', value_name = "FILE", conflicts_with_all = ["lun", "iqn", "chap_user"])]
    config: Option<PathBuf>,
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
    /// File holding the CHAP secret for --chap-user.
    #[arg(long, value_name = "FILE")]
    chap_secret_file: Option<PathBuf>,
    /// Mutual CHAP: the name the target answers with.
    #[arg(long, requires_all = ["chap_user", "mutual_secret_file"])]
    mutual_user: Option<String>,
    /// File holding the target's mutual CHAP secret.
    #[arg(long, value_name = "FILE")]
    mutual_secret_file: Option<PathBuf>,
    /// Initiator names allowed to log in (repeatable; `*` suffix wildcard). Default: all.
    #[arg(long, value_name = "IQN")]
    allow: Vec<String>,
    /// Commands in flight per session (the CmdSN window).
    #[arg(long)]
    queue_depth: Option<u32>,
    /// Seal (encryption above SCSI, docs/seal.md): off | allowed | required.
    #[arg(long, default_value = "allowed")]
    seal: ipsan_seal::SealPolicy,
    /// Seal pre-shared secret for the command line's target (per-initiator secrets: --config).
    #[arg(long, value_name = "FILE")]
    seal_secret_file: Option<PathBuf>,
    /// Threads that seal and open data (default: one per CPU).
    #[arg(long)]
    crypto_workers: Option<usize>,
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

pub fn run(args: Args) -> anyhow::Result<()> {
    let config = build_config(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("tokio runtime")?;
    rt.block_on(async move {
        let server = ipsan_target::Server::bind(&config).await?;
        for addr in server.local_addrs() {
            println!("ipsan target: listening on {addr}");
        }
        for url in server.urls() {
            println!("ipsan target: serving {url}");
        }
        server.run(shutdown_signal()).await?;
        Ok(())
    })
}

fn build_config(args: Args) -> anyhow::Result<Config> {
    let mut config = match &args.config {
        Some(path) => Config::from_file(path)?,
        None => {
            config::check_iqn("--iqn", &args.iqn)?;
            let specs = if args.lun.is_empty() {
                vec!["mem:256MiB".to_owned()]
            } else {
                args.lun.clone()
            };
            let chap = match (&args.chap_user, &args.chap_secret_file) {
                (Some(u), Some(f)) => Some(config::chap_from_flags(
                    u,
                    f,
                    args.mutual_user
                        .as_deref()
                        .zip(args.mutual_secret_file.as_deref()),
                )?),
                _ => None,
            };
            Config {
                targets: vec![TargetConfig {
                    iqn: args.iqn.clone(),
                    alias: None,
                    allow: args.allow.clone(),
                    chap,
                    seal: config::SealSettings {
                        policy: args.seal,
                        secret: args
                            .seal_secret_file
                            .as_deref()
                            .map(|p| config::seal_secret_from_file("--seal-secret-file", p))
                            .transpose()?,
                        initiators: Vec::new(),
                    },
                    luns: config::luns_from_specs(&specs)?,
                }],
                ..Config::default()
            }
        }
    };
    for t in &mut config.targets {
        config::apply_ceph_flags(
            &mut t.luns,
            args.ceph_conf.as_deref(),
            args.ceph_id.as_deref(),
        );
    }
    if let Some(id) = args.relative_port_id {
        config.relative_port_id = id;
    }
    if !args.portal.is_empty() {
        config.portals = args
            .portal
            .iter()
            .map(|p| {
                p.parse()
                    .with_context(|| format!("--portal {p}: expected ADDR:PORT"))
            })
            .collect::<anyhow::Result<_>>()?;
    }
    if let Some(d) = args.queue_depth {
        anyhow::ensure!(
            (1..=4096).contains(&d),
            "--queue-depth: must be in 1..=4096"
        );
        config.queue_depth = d;
    }
    if args.tcp_congestion.is_some() || args.tcp_sndbuf.is_some() || args.tcp_rcvbuf.is_some() {
        let mut t = config.tcp.clone().unwrap_or_default();
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
        config.tcp = Some(t);
    }
    if let Some(n) = args.crypto_workers {
        anyhow::ensure!(
            (1..=256).contains(&n),
            "--crypto-workers: must be in 1..=256"
        );
        config.crypto_workers = n;
    }
    config.validate()?;
    Ok(config)
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
