//! `ipsan bench`: throughput, IOPS, latency percentiles and CPU of an iSCSI LUN, with several
//! commands in flight (issue 3). The JSON schema is documented in docs/bench.md.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use indicatif::{ProgressBar, ProgressStyle};
use ipsan_bench::trace::Trace;
use ipsan_bench::{self as bench, report, Limit, Progress, RwMode, Workload};
use ipsan_initiator::ChapSecret;
use ipsan_initiator::{
    ChapCredentials, DigestChoice, IscsiUrl, LoginOptions, Session, SessionConfig,
};

/// Connection and login flags shared by `bench`, `inquiry` and `discover`.
#[derive(Debug, clap::Args)]
pub struct ConnArgs {
    /// Our iSCSI name (InitiatorName).
    #[arg(long, default_value = "iqn.2026-11.org.ipsan:initiator")]
    pub initiator_name: String,
    /// Read the CHAP password from this file instead of the URL (one trailing newline dropped).
    #[arg(long, value_name = "FILE")]
    pub password_file: Option<PathBuf>,
    /// Read the CHAP password from this environment variable instead of the URL.
    #[arg(long, value_name = "VAR")]
    pub password_env: Option<String>,
    /// Mutual CHAP: the name the target must answer with.
    #[arg(long)]
    pub target_user: Option<String>,
    /// Mutual CHAP: file holding the target's secret.
    #[arg(long, value_name = "FILE")]
    pub target_password_file: Option<PathBuf>,
    /// Mutual CHAP: environment variable holding the target's secret.
    #[arg(long, value_name = "VAR")]
    pub target_password_env: Option<String>,
    /// CHAP algorithms to offer, in order (comma-separated: sha256, sha3-256, sha1, md5).
    /// Default: sha256,sha3-256,sha1; MD5 only when listed here. Never narrowed on a refusal.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    pub chap_algorithms: Vec<String>,
    /// Start from RFC 7143's conservative defaults (InitialR2T=Yes, 8 KiB segments, 256 KiB
    /// bursts, one R2T) instead of the fast ones; flags below still override.
    #[arg(long)]
    pub rfc_defaults: bool,
    /// InitialR2T: wait for an R2T before any data beyond immediate data (yes|no).
    #[arg(long, value_parser = parse_yes_no)]
    pub initial_r2t: Option<bool>,
    /// ImmediateData: send the first data in the command PDU (yes|no).
    #[arg(long, value_parser = parse_yes_no)]
    pub immediate_data: Option<bool>,
    /// FirstBurstLength (unsolicited data per command), e.g. 256KiB.
    #[arg(long, value_parser = parse_u32_size)]
    pub first_burst: Option<u32>,
    /// MaxBurstLength (data per R2T or Data-In sequence), e.g. 16MiB.
    #[arg(long, value_parser = parse_u32_size)]
    pub max_burst: Option<u32>,
    /// MaxRecvDataSegmentLength we declare, e.g. 256KiB.
    #[arg(long, value_parser = parse_u32_size)]
    pub max_recv_seg: Option<u32>,
    /// MaxOutstandingR2T.
    #[arg(long)]
    pub max_outstanding_r2t: Option<u32>,
    /// CRC32C digests: none|header|data|both.
    #[arg(long, default_value = "none")]
    pub digest: DigestChoice,
    /// NOP-Out keepalive interval in seconds (0 disables).
    #[arg(long, default_value_t = 5)]
    pub nop_interval: u64,
    /// Seconds a keepalive NOP-Out may stay unanswered before the connection is declared
    /// failed and every command in flight fails (a silently dead link is found within
    /// --nop-interval + --nop-timeout).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub nop_timeout: u64,
    /// Seconds a SCSI command may go without status before the initiator aborts it with ABORT
    /// TASK and fails it (0 waits forever). An abort the target does not confirm within 10 s
    /// drops the connection.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86400))]
    pub command_timeout: u64,
    /// Session recovery (RFC 7143 §6.3.5 reinstatement, docs/bench.md "Session recovery"):
    /// when the connection fails, reconnect with backoff, log in again with fresh keys and
    /// resend the idempotent commands in flight; commands wait up to this long (e.g. `120s`,
    /// `2m`; a bare number is seconds) before they fail. `0` turns recovery off: a lost
    /// connection fails every command at once.
    #[arg(long, value_name = "DURATION", default_value = "120s", value_parser = parse_recovery_timeout)]
    pub recovery_timeout: std::time::Duration,
    /// Seal every command's data (docs/seal.md): aes-256-gcm | chacha20-poly1305 |
    /// 3des-cbc-hmac-sha1 (legacy, the papers' cipher) | none (same framing, no protection).
    /// Without --seal the session is plain. The login fails if the target does not agree.
    #[arg(long, value_name = "CIPHER")]
    pub seal: Option<String>,
    /// Seal's pre-shared secret (at least 16 bytes; trailing whitespace ignored).
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// Threads that seal and open data (default: one per CPU).
    #[arg(long)]
    pub crypto_workers: Option<usize>,
    /// Seal's pipeline: `on` seals the next commands on the crypto workers while earlier ones
    /// wait for the network; `off` seals inline with one command in flight — the papers'
    /// "without optimization" cycle.
    #[arg(long, default_value = "on", value_parser = parse_on_off, action = clap::ArgAction::Set)]
    pub pipeline: bool,
    /// With --seal: offer to compress the data (LZ4 per chunk, before sealing; docs/seal.md
    /// §4b). On only if the target agrees (`ipsan target --compress`). Leave it off when an
    /// attacker can choose part of the data and see transfer sizes (the length side channel).
    #[arg(long, requires = "seal")]
    pub compress: bool,
    /// TCP congestion control for the connection: cubic | bbr | reno | ipsan_sf | ipsan_sf_ss
    /// (the last two after `ipsan tcp load`). Default: the kernel's.
    #[arg(long, value_name = "NAME")]
    pub tcp_congestion: Option<String>,
    /// SO_SNDBUF: bytes (e.g. 8MiB), `kernel` (autotuning, default).
    #[arg(long, value_name = "SIZE")]
    pub tcp_sndbuf: Option<ipsan_tcp::BufSize>,
    /// SO_RCVBUF: bytes (e.g. 8MiB), `kernel` (autotuning, default). Set before connecting, so
    /// the window scale fits.
    #[arg(long, value_name = "SIZE")]
    pub tcp_rcvbuf: Option<ipsan_tcp::BufSize>,
    /// TCP_NODELAY (default yes: iSCSI PDUs are latency-sensitive).
    #[arg(long, value_parser = parse_yes_no)]
    pub tcp_nodelay: Option<bool>,
}

/// `--depth`: a fixed number of commands in flight or `auto`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DepthArg {
    Fixed(usize),
    Auto,
}

fn parse_depth(s: &str) -> Result<DepthArg, String> {
    if s.eq_ignore_ascii_case("auto") {
        return Ok(DepthArg::Auto);
    }
    match s.parse::<usize>() {
        Ok(n) if (1..=4096).contains(&n) => Ok(DepthArg::Fixed(n)),
        _ => Err(format!("expected 1..=4096 or auto, not {s:?}")),
    }
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    match s {
        "on" => Ok(true),
        "off" => Ok(false),
        _ => Err(format!("expected on or off, not {s:?}")),
    }
}

fn parse_yes_no(s: &str) -> Result<bool, String> {
    match s.to_ascii_lowercase().as_str() {
        "yes" | "y" | "true" | "1" => Ok(true),
        "no" | "n" | "false" | "0" => Ok(false),
        _ => Err(format!("expected yes or no, not {s:?}")),
    }
}

/// `--rate`: a size per second, at least one byte.
fn parse_rate(s: &str) -> Result<u64, String> {
    match bench::parse_size(s)? {
        0 => Err("--rate must be at least 1 byte per second (leave it out for no limit)".into()),
        v => Ok(v),
    }
}

fn parse_u32_size(s: &str) -> Result<u32, String> {
    let v = bench::parse_size(s)?;
    u32::try_from(v).map_err(|_| format!("{s} is over 4 GiB"))
}

impl ConnArgs {
    /// Refuses the iSCSI-only flags on an `nvme+tcp://` URL (they would do nothing there).
    pub fn refuse_for_nvme(&self) -> anyhow::Result<()> {
        let given = [
            ("--password-file", self.password_file.is_some()),
            ("--password-env", self.password_env.is_some()),
            ("--target-user", self.target_user.is_some()),
            ("--chap-algorithms", !self.chap_algorithms.is_empty()),
            ("--rfc-defaults", self.rfc_defaults),
            ("--initial-r2t", self.initial_r2t.is_some()),
            ("--immediate-data", self.immediate_data.is_some()),
            ("--first-burst", self.first_burst.is_some()),
            ("--max-burst", self.max_burst.is_some()),
            ("--max-recv-seg", self.max_recv_seg.is_some()),
            ("--max-outstanding-r2t", self.max_outstanding_r2t.is_some()),
            ("--seal", self.seal.is_some()),
            ("--secret-file", self.secret_file.is_some()),
            ("--tcp-*", self.tcp_settings().is_some()),
        ];
        if let Some((flag, _)) = given.iter().find(|(_, g)| *g) {
            anyhow::bail!("{flag} is for iscsi:// URLs, not nvme+tcp://");
        }
        Ok(())
    }

    /// The `--tcp-*` flags, if any was given.
    pub fn tcp_settings(&self) -> Option<ipsan_tcp::TcpSettings> {
        let any = self.tcp_congestion.is_some()
            || self.tcp_sndbuf.is_some()
            || self.tcp_rcvbuf.is_some()
            || self.tcp_nodelay.is_some();
        any.then(|| ipsan_tcp::TcpSettings {
            congestion: self.tcp_congestion.clone(),
            sndbuf: self.tcp_sndbuf.unwrap_or_default(),
            rcvbuf: self.tcp_rcvbuf.unwrap_or_default(),
            nodelay: Some(self.tcp_nodelay.unwrap_or(true)),
            ..ipsan_tcp::TcpSettings::default()
        })
    }

    /// Parse the URL and turn the flags into a session configuration.
    pub fn config(&self, url: &str) -> anyhow::Result<(IscsiUrl, SessionConfig)> {
        let url = IscsiUrl::parse(url)?
            .with_secret_from(self.password_file.as_deref(), self.password_env.as_deref())?;
        let mut login = if self.rfc_defaults {
            LoginOptions::rfc_defaults()
        } else {
            LoginOptions::default()
        };
        login.initiator_name = self.initiator_name.clone();
        login.digest = self.digest;
        if let Some(v) = self.initial_r2t {
            login.initial_r2t = v;
        }
        if let Some(v) = self.immediate_data {
            login.immediate_data = v;
        }
        if let Some(v) = self.first_burst {
            login.first_burst_length = v;
        }
        if let Some(v) = self.max_burst {
            login.max_burst_length = v;
        }
        if let Some(v) = self.max_recv_seg {
            login.max_recv_data_segment_length = v;
        }
        if let Some(v) = self.max_outstanding_r2t {
            login.max_outstanding_r2t = v;
        }
        if let Some(user) = &url.user {
            let secret = url.password().cloned().context(
                "the URL names a CHAP user but no password was given \
                 (URL user%password, --password-file or --password-env)",
            )?;
            login.chap = Some(ChapCredentials {
                name: user.clone(),
                secret,
            });
        }
        if !self.chap_algorithms.is_empty() {
            login.chap_algorithms = self
                .chap_algorithms
                .iter()
                .map(|n| {
                    ipsan_initiator::ChapAlgorithm::from_name(n).with_context(|| {
                        format!("--chap-algorithms: unknown {n:?}; expected sha256, sha3-256, sha1 or md5")
                    })
                })
                .collect::<anyhow::Result<_>>()?;
        }
        if let Some(tu) = &self.target_user {
            let secret = if let Some(f) = &self.target_password_file {
                ChapSecret::from_file(f)?
            } else if let Some(v) = &self.target_password_env {
                ChapSecret::from_env(v)?
            } else {
                anyhow::bail!(
                    "--target-user needs --target-password-file or --target-password-env"
                );
            };
            anyhow::ensure!(
                login.chap.is_some(),
                "mutual CHAP needs a CHAP user in the URL"
            );
            login.mutual_chap = Some(ChapCredentials {
                name: tu.clone(),
                secret,
            });
        }
        if login.chap.is_some() || self.secret_file.is_some() {
            super::hold_secrets();
        }
        anyhow::ensure!(
            self.seal.is_none() || self.secret_file.is_some(),
            "--seal needs --secret-file (Seal's pre-shared secret)"
        );
        let extension = match (&self.seal, &self.secret_file) {
            (Some(name), Some(path)) => {
                let cipher = ipsan_seal::Cipher::from_name(name).with_context(|| {
                    format!("--seal {name}: expected aes-256-gcm, chacha20-poly1305, 3des-cbc-hmac-sha1 or none")
                })?;
                let psk = ipsan_initiator::psk_from_file(path)
                    .with_context(|| format!("--secret-file {}", path.display()))?;
                let workers = self.crypto_workers.unwrap_or_else(|| {
                    std::thread::available_parallelism().map_or(2, std::num::NonZeroUsize::get)
                });
                anyhow::ensure!(
                    (1..=256).contains(&workers),
                    "--crypto-workers: must be in 1..=256"
                );
                let pool = if self.pipeline {
                    Some(Arc::new(
                        ipsan_seal::CryptoPool::new(workers).context("crypto workers")?,
                    ))
                } else {
                    None
                };
                let req = ipsan_initiator::seal::SealRequest {
                    ciphers: vec![cipher],
                    chunk: ipsan_seal::DEFAULT_CHUNK,
                    psk,
                    pool,
                };
                Some(req.factory_with_compression(self.compress))
            }
            _ => None,
        };
        let cfg = SessionConfig {
            login,
            nop_interval: (self.nop_interval > 0)
                .then(|| std::time::Duration::from_secs(self.nop_interval)),
            nop_timeout: std::time::Duration::from_secs(self.nop_timeout),
            command_timeout: (self.command_timeout > 0)
                .then(|| std::time::Duration::from_secs(self.command_timeout)),
            extension,
            tcp: self.tcp_settings(),
            recovery_timeout: Some(self.recovery_timeout).filter(|d| !d.is_zero()),
            ..SessionConfig::default()
        };
        Ok((url, cfg))
    }
}

/// `--recovery-timeout`: a duration (`0` = off; a bare number is seconds).
fn parse_recovery_timeout(s: &str) -> Result<std::time::Duration, String> {
    ipsan_units::parse_duration_or_secs(s).map_err(|e| e.to_string())
}

/// Measure an iSCSI LUN or an NVMe/TCP namespace: `ipsan bench iscsi://host[:port]/iqn/lun
/// --rw write --bs 64KiB --depth 16 --size 1GiB`, `ipsan bench
/// nvme+tcp://host[:port]/subsysnqn/nsid --queues 2 ...`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// iscsi://[user[%password]@]host[:port]/target-iqn/lun or
    /// nvme+tcp://host[:port]/subsysnqn[/nsid]
    pub url: String,
    /// Access pattern: read|write|randread|randwrite|rw|randrw.
    #[arg(long, default_value = "read")]
    pub rw: RwMode,
    /// Percent of reads for rw/randrw.
    #[arg(long, default_value_t = 50, value_parser = clap::value_parser!(u8).range(0..=100))]
    pub mix: u8,
    /// Bytes per command (KiB/MiB/GiB binary, KB/MB/GB decimal).
    #[arg(long, default_value = "64KiB", value_parser = bench::parse_size)]
    pub bs: u64,
    /// Commands in flight: a number, or `auto` to adapt it from measured throughput and
    /// latency (see --max-depth, --depth-start).
    #[arg(long, default_value = "16", value_parser = parse_depth)]
    pub depth: DepthArg,
    /// With --depth auto: the largest depth it may pick.
    #[arg(long, default_value_t = 128, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub max_depth: u64,
    /// With --depth auto: the first depth tried (e.g. a model's estimate; default 1).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=4096))]
    pub depth_start: Option<u64>,
    /// Write a per-command event trace (JSON lines, schema ipsan-trace/1, docs/bench.md).
    #[arg(long, value_name = "FILE")]
    pub trace: Option<PathBuf>,
    /// With --trace: record at most this many commands (the first ones).
    #[arg(long, default_value_t = 100_000)]
    pub trace_commands: usize,
    /// Bytes to transfer (default: 1 GiB or the LUN, whichever is smaller).
    #[arg(long, value_parser = bench::parse_size, conflicts_with = "time")]
    pub size: Option<u64>,
    /// Run for this long instead (e.g. 30s).
    #[arg(long, value_parser = bench::parse_duration)]
    pub time: Option<std::time::Duration>,
    /// Byte offset into the LUN where the region starts.
    #[arg(long, default_value = "0", value_parser = bench::parse_size)]
    pub offset: u64,
    /// Offered load: bytes per second (e.g. 5MB: 5,000,000 B/s), command i starting
    /// i × bs ÷ rate after the start however many are in flight (002 Fig. 9's traffic
    /// generator). Default: as fast as --depth allows.
    #[arg(long, value_parser = parse_rate)]
    pub rate: Option<u64>,
    /// Write an LBA-stamped pattern and check it on read; reports the first bad LBA.
    #[arg(long)]
    pub verify: bool,
    /// Seed for random offsets, the mix and the verify pattern.
    #[arg(long, default_value_t = 0x5eed)]
    pub seed: u64,
    /// Write this file's bytes (e.g. a disk image) instead of a synthetic pattern: the
    /// region holds the file from its start, repeated if the region is larger. Its length
    /// must be a multiple of --bs. With --verify, reads are checked against it.
    #[arg(long, value_name = "FILE")]
    pub data_file: Option<PathBuf>,
    /// Write the full result as JSON (schema ipsan-bench/1, docs/bench.md). `-` for stdout.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// No progress display.
    #[arg(long)]
    pub quiet: bool,
    /// Runtime threads for the initiator (1: everything on one core).
    #[arg(long, default_value_t = 1)]
    pub threads: usize,
    /// iSCSI connections in the session (RFC 7143 §4.2, MaxConnections; docs/wan.md "Several
    /// connections per session"): the leading login offers this many, the others join with
    /// the session's TSIH (sealed: each with its own Seal login); the target may grant fewer.
    /// 1, the default, is the one-connection session with --recovery-timeout as before; with
    /// more, a lost connection ends the run (ErrorRecoveryLevel 0) unless --erl 2.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub connections: u16,
    /// ErrorRecoveryLevel to offer with --connections above 1 (RFC 7143 §7.2, §13.20): 0, the
    /// default, or 2: a lost connection's commands are reassigned to a live one (TASK
    /// REASSIGN) and the connection logs in again, nothing fails back (docs/wan.md
    /// "Connection recovery"). The target must allow it (`[server] error_recovery_level = 2`);
    /// not with --seal.
    #[arg(long = "erl", value_name = "LEVEL", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=2))]
    pub error_recovery_level: u32,
    /// With --connections above 1, which connection a command goes on: least-queued (the
    /// default: the one whose socket would deliver it soonest, its bytes not yet acknowledged
    /// by TCP over its rate), least-bytes (the fewest bytes outstanding) or round-robin.
    #[arg(long, default_value = "least-queued")]
    pub spread: ipsan_initiator::Spread,
    #[command(flatten)]
    pub conn: ConnArgs,
    #[command(flatten)]
    pub nvme: super::nvme::NvmeArgs,
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // One thread by default: every PDU hop (submitter → writer → socket → reader → submitter)
    // stays on one core with no cross-thread wake-ups, which is what keeps depth-1 latency low;
    // --threads adds workers for CPU-heavy payload transforms (seal).
    let rt = if args.threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(args.threads)
            .enable_all()
            .build()?
    };
    rt.block_on(run_async(args))
}

fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// The workload the flags ask for on a device of `cap`, and `--depth auto`'s settings.
fn workload(
    args: &Args,
    cap: ipsan_initiator::scsi::Capacity,
    sequential: bool,
) -> anyhow::Result<(Workload, Option<bench::autodepth::AutoConfig>)> {
    let data = match &args.data_file {
        Some(p) => {
            let bytes = std::fs::read(p).with_context(|| format!("--data-file {}", p.display()))?;
            anyhow::ensure!(
                !bytes.is_empty() && bytes.len() as u64 % args.bs == 0,
                "--data-file {}: its {} bytes are not a whole number of --bs {}-byte blocks",
                p.display(),
                bytes.len(),
                args.bs
            );
            Some(bench::workload::Payload::new(bytes.into()))
        }
        None => None,
    };
    let limit = match (args.time, args.size) {
        (Some(t), _) => Limit::Time(t),
        (None, Some(s)) => Limit::Bytes(s),
        (None, None) => Limit::Bytes((1u64 << 30).min(cap.bytes().saturating_sub(args.offset))),
    };
    let max_depth = usize::try_from(args.max_depth).unwrap_or(4096);
    let auto = match args.depth {
        DepthArg::Auto if !sequential => Some(bench::autodepth::AutoConfig::new(
            args.depth_start
                .map_or(1, |d| usize::try_from(d).unwrap_or(1)),
            max_depth,
        )),
        _ => None,
    };
    let depth = match args.depth {
        _ if sequential => 1,
        DepthArg::Fixed(n) => n,
        DepthArg::Auto => auto.map_or(1, |a| a.start),
    };
    let w = Workload {
        mode: args.rw,
        mix_read_percent: args.mix,
        block_size: args.bs,
        depth,
        offset: args.offset,
        limit,
        verify: args.verify,
        seed: args.seed,
        data,
        rate: args.rate,
    };
    Ok((w, auto))
}

/// `ipsan bench nvme+tcp://…`: the same workloads and report on an NVMe/TCP namespace.
async fn run_nvme(args: Args) -> anyhow::Result<()> {
    let (url, cfg) = args.nvme.config(&args.url, &args.conn)?;
    url.require_subsystem()?;
    anyhow::ensure!(
        args.connections == 1,
        "--connections is for iscsi:// URLs (NVMe/TCP: --queues)"
    );
    anyhow::ensure!(
        args.trace.is_none(),
        "--trace is for iscsi:// URLs (the NVMe/TCP host has no observer hook yet)"
    );
    let started_unix_s = unix_now();
    let session = ipsan_initiator::nvme::NvmeSession::open(&url, &cfg)
        .await
        .with_context(|| format!("cannot open {url}"))?;
    let cap = session
        .capacity()
        .context("the namespace's capacity is unknown")?;
    let (w, auto) = workload(&args, cap, false)?;
    let session = Arc::new(session);
    let tick = progress_reporter(!args.quiet);
    let (measured, depth_auto) = bench::run_on(session.clone(), w.clone(), auto, tick)
        .await
        .map_err(bench_failure)?;
    let mut w = w;
    if let Some(r) = &depth_auto {
        w.depth = r.chosen;
    }
    let info = session.info();
    let id = &info.identify;
    let (hd, dd, maxh2c) = session.transport();
    let report = bench::Report {
        schema: "ipsan-bench/1",
        tool: "ipsan bench",
        version: env!("CARGO_PKG_VERSION"),
        git_rev: report::git_rev().to_owned(),
        started_unix_s,
        host: report::Host::detect(),
        target: report::TargetInfo {
            url: url.to_string(),
            vendor: format!("NVMe {:04x}", id.vid),
            product: id.model.clone(),
            revision: id.firmware.clone(),
            capacity_bytes: cap.bytes(),
            block_len: cap.block_len,
        },
        workload: report::WorkloadInfo::from(&w),
        negotiated: None,
        nvme: Some(report::NvmeReport {
            subnqn: url.subnqn.clone().unwrap_or_default(),
            nsid: session.nsid(),
            cntlid: info.cntlid,
            model: id.model.clone(),
            serial: id.serial.clone(),
            firmware: id.firmware.clone(),
            version: id.version_string(),
            io_queues: session.queues(),
            header_digest: hd,
            data_digest: dd,
            maxh2cdata: maxh2c,
            max_transfer: session.max_transfer(),
            kato_ms: u64::try_from(cfg.kato.as_millis()).unwrap_or(u64::MAX),
            tls: session.tls(),
            authentication: session.authentication(),
        }),
        result: measured,
        tcp: None,
        depth_auto,
        recovery: None,
    };
    if let Ok(s) = Arc::try_unwrap(session) {
        if let Err(e) = s.close().await {
            tracing::debug!("shutdown: {e}");
        }
    }
    print_report(&report);
    write_json(&args, &report)
}

fn write_json(args: &Args, report: &bench::Report) -> anyhow::Result<()> {
    if let Some(path) = &args.json {
        let json = report.to_json()?;
        if path.as_os_str() == "-" {
            println!("{json}");
        } else {
            std::fs::write(path, json + "\n")
                .with_context(|| format!("cannot write {}", path.display()))?;
        }
    }
    Ok(())
}

async fn run_async(args: Args) -> anyhow::Result<()> {
    if ipsan_initiator::nvme::NvmeUrl::is_nvme(&args.url) {
        return run_nvme(args).await;
    }
    args.nvme.refuse_for_iscsi()?;
    let (url, cfg) = args.conn.config(&args.url)?;
    url.require_lun()?;
    if args.connections > 1 {
        return run_mcs(args, url, cfg).await;
    }
    anyhow::ensure!(
        args.error_recovery_level == 0,
        "--erl 2 needs --connections 2 or more (one connection recovers with --recovery-timeout)"
    );
    let started_unix_s = unix_now();
    let session = Session::open(&url, &cfg)
        .await
        .with_context(|| format!("cannot open {url}"))?;
    let inq = session.inquiry().await.context("INQUIRY")?;
    let cap = session
        .capacity()
        .context("the LUN's capacity is unknown")?;
    let sequential = args.conn.seal.is_some() && !args.conn.pipeline;
    if sequential && args.depth != DepthArg::Fixed(1) {
        eprintln!("ipsan bench: --pipeline off runs one command at a time (depth 1)");
    }
    let (w, auto) = workload(&args, cap, sequential)?;
    let session = Arc::new(session);
    let trace = args.trace.as_ref().map(|_| Trace::new(args.trace_commands));
    let tick = progress_reporter(!args.quiet);
    let (measured, depth_auto) =
        bench::run_traced(session.clone(), w.clone(), auto, tick, trace.clone())
            .await
            .map_err(bench_failure)?;
    let mut w = w;
    if let Some(r) = &depth_auto {
        w.depth = r.chosen;
    }
    let mut report = iscsi_report(
        &url,
        inq,
        cap,
        &w,
        session.params(),
        (measured, depth_auto),
        started_unix_s,
    );
    report.tcp = Some(report::TcpReport {
        requested: args.conn.tcp_settings(),
        in_force: session.tcp_in_force(),
        info_end: session.tcp_info(),
    });
    report.recovery = cfg.recovery_timeout.map(|_| session.recovery_stats());
    if let (Some(t), Some(path)) = (&trace, &args.trace) {
        write_trace(t, path, &report, &args.conn)?;
    }
    if let Ok(s) = Arc::try_unwrap(session) {
        if let Err(e) = s.logout().await {
            tracing::debug!("logout: {e}");
        }
    }
    print_report(&report);
    write_json(&args, &report)
}

/// The report of an iSCSI run (one connection or several): what the target said it is, the
/// workload, the login's parameters and the measurement; TCP and recovery are the caller's.
fn iscsi_report(
    url: &IscsiUrl,
    inq: ipsan_initiator::scsi::Inquiry,
    cap: ipsan_initiator::scsi::Capacity,
    w: &Workload,
    params: &ipsan_initiator::Negotiated,
    (result, depth_auto): (report::Measured, Option<bench::autodepth::AutoReport>),
    started_unix_s: u64,
) -> bench::Report {
    bench::Report {
        schema: "ipsan-bench/1",
        tool: "ipsan bench",
        version: env!("CARGO_PKG_VERSION"),
        git_rev: report::git_rev().to_owned(),
        started_unix_s,
        host: report::Host::detect(),
        target: report::TargetInfo {
            url: url.to_string(),
            vendor: inq.vendor,
            product: inq.product,
            revision: inq.revision,
            capacity_bytes: cap.bytes(),
            block_len: cap.block_len,
        },
        workload: report::WorkloadInfo::from(w),
        negotiated: Some(params.clone()),
        nvme: None,
        result,
        tcp: None,
        depth_auto,
        recovery: None,
    }
}

/// `ipsan bench --connections N` (N > 1): the same workloads on a session of several
/// connections (`ipsan_initiator::McsSession`, issue 28).
async fn run_mcs(args: Args, url: IscsiUrl, cfg: SessionConfig) -> anyhow::Result<()> {
    anyhow::ensure!(
        args.trace.is_none(),
        "--trace needs --connections 1 (the observer hook is the one-connection session's)"
    );
    anyhow::ensure!(
        args.error_recovery_level == 0 || args.conn.seal.is_none(),
        "--erl 2 is not available with --seal yet (sealed data is bound to its connection's keys)"
    );
    anyhow::ensure!(
        args.error_recovery_level != 1,
        "--erl is 0 or 2 (ErrorRecoveryLevel 1, digest-error recovery by SNACK, is the target's only)"
    );
    let mut cfg = cfg;
    cfg.login.error_recovery_level = args.error_recovery_level;
    let started_unix_s = unix_now();
    let mcs = ipsan_initiator::McsConfig {
        connections: args.connections,
        spread: args.spread,
    };
    let session = ipsan_initiator::McsSession::open(&url, &cfg, mcs)
        .await
        .with_context(|| format!("cannot open {url}"))?;
    let inq = session.inquiry().await.context("INQUIRY")?;
    let cap = session
        .capacity()
        .context("the LUN's capacity is unknown")?;
    let granted = session.connections();
    let sequential = args.conn.seal.is_some() && !args.conn.pipeline;
    let (w, auto) = workload(&args, cap, sequential)?;
    let session = Arc::new(session);
    let tick = progress_reporter(!args.quiet);
    let (measured, depth_auto) = bench::run_on(session.clone(), w.clone(), auto, tick)
        .await
        .map_err(bench_failure)?;
    let mut w = w;
    if let Some(r) = &depth_auto {
        w.depth = r.chosen;
    }
    let placed = session.commands_per_connection();
    let recovery = session.recovery();
    let erl = session.params().error_recovery_level;
    let report = iscsi_report(
        &url,
        inq,
        cap,
        &w,
        session.params(),
        (measured, depth_auto),
        started_unix_s,
    );
    if let Ok(s) = Arc::try_unwrap(session) {
        if let Err(e) = s.logout().await {
            tracing::debug!("logout: {e}");
        }
    }
    print_report(&report);
    println!(
        "connections: {granted} of {} asked ({}), commands per connection (CID:n): {}",
        args.connections,
        match args.spread {
            ipsan_initiator::Spread::RoundRobin => "round-robin",
            ipsan_initiator::Spread::LeastQueued => "least-queued",
            _ => "least-bytes",
        },
        placed
            .iter()
            .map(|(c, n)| format!("{c}:{n}"))
            .collect::<Vec<_>>()
            .join(" ")
    );
    if args.error_recovery_level > 0 {
        println!(
            "ErrorRecoveryLevel {erl} (asked {}): {} connections lost, {} logged in again, {} tasks reassigned, {} sent again, {} refused",
            args.error_recovery_level,
            recovery.connections_lost,
            recovery.relogins,
            recovery.reassigned,
            recovery.retried,
            recovery.refused
        );
    }
    write_json(&args, &report)
}

/// One clear line for a failed run: a lost connection says so first (issue 8: a dead link must
/// end in "connection to the target failed", not a hang or a bare I/O error). The message
/// already holds its cause, so the chain is not repeated.
fn bench_failure(e: bench::BenchError) -> anyhow::Error {
    use ipsan_initiator::Error;
    match &e {
        bench::BenchError::Io {
            source: Error::ConnectionLost(_) | Error::Io(_) | Error::Timeout(_),
            ..
        } => anyhow::anyhow!("connection to the target failed: {e}"),
        _ => anyhow::anyhow!("{e}"),
    }
}

/// The trace file: a header naming the run, then the events (docs/bench.md, `ipsan-trace/1`).
fn write_trace(
    t: &Trace,
    path: &std::path::Path,
    r: &bench::Report,
    conn: &ConnArgs,
) -> anyhow::Result<()> {
    let h = report::trace_header(r, conn.seal.as_deref(), conn.pipeline);
    let f =
        std::fs::File::create(path).with_context(|| format!("cannot write {}", path.display()))?;
    t.write_jsonl(std::io::BufWriter::new(f), h)
        .with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}

fn print_report(r: &bench::Report) {
    let m = &r.result;
    let w = &r.workload;
    println!(
        "ipsan bench {} ({}) → {} [{} {} rev {}], {} MiB LUN, {}-byte blocks",
        r.version,
        &r.git_rev[..r.git_rev.len().min(12)],
        r.target.url,
        r.target.vendor,
        r.target.product,
        r.target.revision,
        r.target.capacity_bytes >> 20,
        r.target.block_len
    );
    println!(
        "workload: {:?} bs={} depth={} offset={} {}{}",
        w.rw,
        w.block_size,
        w.depth,
        w.offset,
        match (w.size_bytes, w.time_s) {
            (Some(s), _) => format!("size={s}"),
            (None, Some(t)) => format!("time={t}s"),
            _ => String::new(),
        },
        if w.verify { " verify" } else { "" }
    );
    if let Some(n) = &r.negotiated {
        println!(
            "negotiated: InitialR2T={} ImmediateData={} FirstBurst={} MaxBurst={} MaxRecvDSL(ours/target)={}/{} MaxOutstandingR2T={} digests(h/d)={}/{}",
            yn(n.initial_r2t),
            yn(n.immediate_data),
            n.first_burst_length,
            n.max_burst_length,
            n.max_recv_data_segment_length,
            n.target_max_recv_data_segment_length,
            n.max_outstanding_r2t,
            yn(n.header_digest),
            yn(n.data_digest)
        );
    }
    if let Some(n) = &r.nvme {
        println!(
            "nvme: {} ns {} cntlid {} model {:?} serial {:?} fw {:?} NVMe {}; {} I/O queue(s), digests(h/d)={}/{}, MAXH2CDATA={} max transfer={} KATO={}ms, TLS={}{}",
            n.subnqn,
            n.nsid,
            n.cntlid,
            n.model,
            n.serial,
            n.firmware,
            n.version,
            n.io_queues,
            yn(n.header_digest),
            yn(n.data_digest),
            n.maxh2cdata,
            n.max_transfer,
            n.kato_ms,
            yn(n.tls),
            n.authentication
                .as_ref()
                .map(|a| format!(", {a}"))
                .unwrap_or_default()
        );
    }
    if let Some(t) = r.tcp.as_ref().and_then(|t| t.in_force.as_ref()) {
        let info = r.tcp.as_ref().and_then(|t| t.info_end.as_ref());
        println!(
            "tcp: congestion={} sndbuf={} rcvbuf={} nodelay={}{}",
            t.congestion,
            t.sndbuf,
            t.rcvbuf,
            yn(t.nodelay),
            info.map(|i| format!(
                " | at end: cwnd={} ssthresh={} rtt={}us retrans={}",
                i.cwnd,
                i.ssthresh.map_or_else(|| "-".to_owned(), |v| v.to_string()),
                i.rtt_us,
                i.total_retrans
            ))
            .unwrap_or_default()
        );
    }
    println!(
        "result: {:.1} MB/s ({:.1} MiB/s), {:.0} IOPS, {} ops in {:.2}s (read {} B, write {} B)",
        m.throughput_mb_s,
        m.throughput_mib_s,
        m.iops,
        m.ops,
        m.duration_s,
        m.read_bytes,
        m.write_bytes
    );
    if let Some(rs) = &r.recovery {
        println!(
            "recovery: {} connection losses, {} reconnects, {} recoveries, {} commands reissued, {} failed (not idempotent), {} failed (timeout), last {} ms, max {} ms",
            rs.connection_losses,
            rs.reconnects,
            rs.recoveries,
            rs.commands_reissued,
            rs.commands_failed_not_idempotent,
            rs.commands_failed_timeout,
            rs.last_recovery_ms.map_or_else(|| "-".to_owned(), |v| v.to_string()),
            rs.max_recovery_ms.map_or_else(|| "-".to_owned(), |v| v.to_string()),
        );
    }
    let l = &m.latency_us;
    println!(
        "latency µs: min {:.0} p50 {:.0} p90 {:.0} p99 {:.0} p99.9 {:.0} max {:.0} (mean {:.0})",
        l.min, l.p50, l.p90, l.p99, l.p99_9, l.max, l.mean
    );
    println!(
        "initiator CPU: {:.1}% of one core ({:.1}% of {} CPUs; user {:.2}s sys {:.2}s)",
        m.cpu.percent_of_one_core,
        m.cpu.percent_of_all_cores,
        m.cpu.cpus,
        m.cpu.user_s,
        m.cpu.sys_s
    );
    if let Some(a) = &r.depth_auto {
        let path: Vec<String> = a
            .trajectory
            .iter()
            .map(|s| format!("{}:{:.0}", s.depth, s.throughput_mb_s))
            .collect();
        println!(
            "depth auto: chose {} (start {}, max {}); windows depth:MB/s {}",
            a.chosen,
            a.start,
            a.max,
            path.join(" ")
        );
    }
    if m.verify.enabled {
        println!("verify: OK, {} blocks checked", m.verify.checked_blocks);
    }
}

fn yn(b: bool) -> &'static str {
    if b {
        "Yes"
    } else {
        "No"
    }
}

/// Live progress (`--quiet` turns it off): an indicatif bar with throughput on a terminal, one
/// plain line every few seconds otherwise (logs, CI, pipes). The tick callback for
/// `ipsan_bench::run`; `enabled=false` prints nothing.
fn progress_reporter(enabled: bool) -> Option<Box<dyn FnMut(Progress) + Send>> {
    if !enabled {
        return None;
    }
    if std::io::stderr().is_terminal() {
        // Length 1 until the first sample sets the real one (0 would draw a full bar).
        let bar = ProgressBar::new(1);
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} {msg}",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar.enable_steady_tick(Duration::from_millis(200));
        let mut last = (Duration::ZERO, 0u64);
        Some(Box::new(move |p: Progress| {
            let rate = rate(&mut last, p);
            match (p.total_bytes, p.total_time) {
                (Some(t), _) => {
                    bar.set_length(t >> 20);
                    bar.set_position(p.bytes >> 20);
                }
                (None, Some(t)) => {
                    bar.set_length(t.as_secs());
                    bar.set_position(p.elapsed.as_secs());
                }
                _ => {}
            }
            bar.set_message(format!("{rate:.1} MiB/s, {} ops", p.ops));
            if p.total_bytes.is_some_and(|t| p.bytes >= t)
                || p.total_time.is_some_and(|t| p.elapsed >= t)
            {
                bar.finish_and_clear();
            }
        }))
    } else {
        let mut last = (Duration::ZERO, 0u64);
        let mut last_print = Duration::ZERO;
        Some(Box::new(move |p: Progress| {
            if p.elapsed.saturating_sub(last_print) < Duration::from_secs(5) {
                return;
            }
            last_print = p.elapsed;
            let r = rate(&mut last, p);
            eprintln!(
                "bench: {:>6.1}s {:>10.1} MiB done, {r:>8.1} MiB/s now, {} ops",
                p.elapsed.as_secs_f64(),
                p.bytes as f64 / 1048576.0,
                p.ops
            );
        }))
    }
}

fn rate(last: &mut (Duration, u64), p: Progress) -> f64 {
    let dt = p.elapsed.saturating_sub(last.0).as_secs_f64();
    let db = p.bytes.saturating_sub(last.1) as f64;
    *last = (p.elapsed, p.bytes);
    if dt > 0.0 {
        db / dt / 1048576.0
    } else {
        0.0
    }
}
