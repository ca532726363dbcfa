//! `ipsan bench`: throughput, IOPS, latency percentiles and CPU of an iSCSI LUN, with several
//! commands in flight (issue 3). The JSON schema is documented in docs/bench.md.
//!
//! Beside it: `bench/conn.rs`, the connection and login flags the other initiator-side
//! commands share ([`ConnArgs`]); `bench/print.rs`, the printed report and live progress.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::Context;
use ipsan_bench::trace::Trace;
use ipsan_bench::{self as bench, report, Limit, RwMode, Workload};
use ipsan_initiator::{IscsiUrl, Session, SessionConfig};

mod conn;
mod print;

pub use conn::ConnArgs;
use print::{print_report, progress_reporter};

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

/// `--rate`: a size per second, at least one byte.
fn parse_rate(s: &str) -> Result<u64, String> {
    match bench::parse_size(s)? {
        0 => Err("--rate must be at least 1 byte per second (leave it out for no limit)".into()),
        v => Ok(v),
    }
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
    /// What reads do with their data: keep (each read's data delivered whole to its worker,
    /// what a user of the LUN gets) or discard (iscsi:// only: each Data-In is checked,
    /// counted and dropped as it arrives, into one scratch buffer: the work libiscsi's
    /// iscsi-perf does; not with --verify). docs/bench.md "What reads do with their data".
    #[arg(long, default_value = "keep")]
    pub sink: bench::Sink,
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
    /// Runtime threads for the initiator. Default: 1, everything on one core; for an
    /// nvme+tcp:// URL with several --queues and more than one command in flight, one per I/O
    /// queue up to the CPUs, so the queues' batches and data are handled in parallel. For
    /// nvme+tcp:// each thread is a runtime of its own running its I/O queues
    /// and the commands sent on them (queue i and command slot k on thread i and k mod
    /// --threads), so no command crosses between threads.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=256))]
    pub threads: Option<u64>,
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
    /// "Connection recovery"). The target must allow it (`[server] error_recovery_level = 2`).
    /// With --seal a moved write is sealed again under its new connection's keys (docs/seal.md
    /// §3).
    #[arg(long = "erl", value_name = "LEVEL", default_value_t = 0,
          value_parser = clap::value_parser!(u32).range(0..=2))]
    pub error_recovery_level: u32,
    /// With --connections above 1, which connection a command goes on: least-queued (the
    /// default: the one whose socket would deliver it soonest, its bytes not yet acknowledged
    /// by TCP over its rate), least-bytes (the fewest bytes outstanding) or round-robin.
    #[arg(long, default_value = "least-queued")]
    pub spread: ipsan_initiator::Spread,
    /// With --connections above 1: how long after a command (or Data-Out) that ended a burst,
    /// with nothing heard for it, its connection sends a NOP-Out that asks no answer, so TCP
    /// resends a lost command about a round trip after it left rather than at its timer
    /// (docs/wan.md "How many connections"). 0 turns it off. Default: 5ms where the kernel
    /// refuses the sockets' 20 ms minimum RTO (before Linux 6.15), off otherwise.
    #[arg(long, value_name = "DURATION", value_parser = parse_tail_probe)]
    pub tail_probe: Option<std::time::Duration>,
    #[command(flatten)]
    pub conn: ConnArgs,
    #[command(flatten)]
    pub nvme: super::nvme::NvmeArgs,
}

/// `--tail-probe`: a duration (`5ms`), 0 for none.
fn parse_tail_probe(s: &str) -> Result<std::time::Duration, String> {
    ipsan_units::parse_duration_or_secs(s).map_err(|e| e.to_string())
}

/// The initiator's runtime threads: `--threads`, else [`Args::threads`]' default.
fn threads(args: &Args) -> usize {
    if let Some(n) = args.threads {
        return usize::try_from(n).unwrap_or(1);
    }
    // NVMe/TCP with several queues and commands in flight: a thread per queue at any size.
    // Each thread is a current-thread runtime with its queue and the commands sent on it
    // (`run_nvme_threads`), so nothing crosses threads per command. With one thread for two
    // queues at 4 KiB × 32, a batch back from the target waited for the host's one thread to
    // finish the other queue's batch, and the two cores were ~70 % busy where iSCSI's were
    // 80–92 % (docs/results/nvme-speed-12).
    let queues = usize::from(args.nvme.queues.unwrap_or(1));
    let parallel = ipsan_initiator::nvme::NvmeUrl::is_nvme(&args.url)
        && queues > 1
        && args.depth != DepthArg::Fixed(1);
    if !parallel {
        return 1;
    }
    let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
    queues.min(cpus)
}

pub fn run(args: Args) -> anyhow::Result<()> {
    // One thread by default: every PDU hop (submitter → writer → socket → reader → submitter)
    // stays on one core with no cross-thread wake-ups, which is what keeps depth-1 latency low;
    // --threads adds workers for CPU-heavy payload transforms (seal). NVMe/TCP's I/O queues
    // are connections of their own: with several and more than one command in flight, one
    // thread per queue lets the host handle them in parallel (`threads`).
    let threads = threads(&args);
    if threads > 1 && ipsan_initiator::nvme::NvmeUrl::is_nvme(&args.url) {
        return run_nvme_threads(args, threads);
    }
    let rt = if threads <= 1 {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()?
    } else {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_all()
            .build()?
    };
    rt.block_on(run_async(args))
}

/// `ipsan bench nvme+tcp://…` on `threads` threads, each a current-thread runtime: this
/// thread's and `threads − 1` more. I/O queue `i` and worker `k` run on thread `i mod
/// threads` and `k mod threads`, and a worker sends on its own thread's queue
/// (`NvmeConfig::queue_runtimes`): each queue's data is received on its own core as on a
/// multi-thread runtime, without that runtime's wake-ups of its other worker per command (at
/// 1 MiB × 16 reads 0.3 futex calls and 0.14 eventfd writes per command,
/// docs/results/nvme-speed-5).
fn run_nvme_threads(args: Args, threads: usize) -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let extra = ipsan_initiator::nvme::RuntimeThreads::spawn(threads - 1, "nvme-queue")?;
    let mut handles = vec![rt.handle().clone()];
    handles.extend_from_slice(extra.handles());
    let r = rt.block_on(run_nvme(args, handles));
    drop(extra);
    r
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
        sink: args.sink,
    };
    Ok((w, auto))
}

/// `ipsan bench nvme+tcp://…`: the same workloads and report on an NVMe/TCP namespace.
async fn run_nvme(args: Args, runtimes: Vec<tokio::runtime::Handle>) -> anyhow::Result<()> {
    let (url, mut cfg) = args.nvme.config(&args.url, &args.conn)?;
    cfg.queue_runtimes.clone_from(&runtimes);
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
    let (measured, depth_auto) =
        bench::run_on_threads(session.clone(), w.clone(), auto, tick, &runtimes)
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
        return run_nvme(args, Vec::new()).await;
    }
    args.nvme.refuse_for_iscsi()?;
    let (url, cfg) = args.conn.config(&args.url)?;
    url.require_lun()?;
    if args.connections > 1 {
        return run_mcs(args, url, cfg).await;
    }
    anyhow::ensure!(
        args.tail_probe.is_none(),
        "--tail-probe needs --connections 2 or more"
    );
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
    if let Some(after) = args.tail_probe {
        session.set_tail_probe(Some(after).filter(|d| !d.is_zero()));
    }
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
