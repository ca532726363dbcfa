//! The runner: brings up each link once, calibrates it, and runs every point of the plan
//! through the real `ipsan target` and `ipsan bench` processes (and the real tunnel
//! processes for the lower-layer baselines), recording each run as ok, failed (with its
//! error) or skipped (with the reason). A failed run never stops the matrix.
//!
//! # Layout
//! - `runner.rs`: the plan's passes over its links, one run's steps (`try_run`), the target.
//! - `runner/carrier.rs`: what each scheme adds around the session (`carrier/`: IPsec, TLS,
//!   WireGuard tunnels).
//! - `runner/link.rs`: an emulated link brought up, calibrated and counted.
//! - `runner/measure.rs`: the `ipsan bench` command, its run and its result and trace.
//! - `runner/costs.rs`: the calibration's cost runs and `ipsan lab calibrate`.
//! - `runner/process.rs`, `runner/iperf3.rs`: child processes (bounded, watched), iperf3.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ipsan_seal::Cipher;
use ipsan_wan::config::QueueLimit;
use ipsan_wan::{DirConfig, ExtraStages, Link, LinkConfig, LossModel, Side};

use crate::calibrate::{self, cipher_key, link_group_key, Loopback, Sockets};
use crate::esp::{self, EspCounters};
use crate::model::{self, CryptoPlace, Inputs, Pipeline};
use crate::plan::{Backend, Depth, IscsiMode, Plan, Point, Scheme};
use crate::results::{Calibration, Environment, Record, Status};

mod carrier;
mod costs;
mod iperf3;
mod link;
mod measure;
mod process;

pub use costs::{calibrate_plan, cost_plan, COST_BLOCKS};
use measure::{measure, read_bench_result, Bench};

use iperf3::iperf3;
use link::{calibrate_link, enc_dec, LabLink, LinkCounters};
use process::{free_port, run_bounded, spawn_watch, wait_line, Procs};
pub use process::{help_mentions, proc_cpu_s};

/// How to run a plan.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// The `ipsan` binary to run as target and initiator.
    pub exe: PathBuf,
    /// Output directory.
    pub out: PathBuf,
    /// Show the progress line.
    pub progress: bool,
    /// Name prefix of the lab's namespaces (`<prefix>-ini`/`-tgt`).
    pub link_name: String,
    /// Third octet of the link's /24 in 10.231.0.0/16 (the WireGuard tunnel uses the next).
    pub subnet: u8,
    /// A calibration file (`ipsan lab run --calibration`): its RTT, SOCKET and cipher rates
    /// replace the per-link calibration and cipher benchmarks, fixed before any run starts.
    pub calibration: Option<Arc<crate::calibrate::LoadedCalibration>>,
}

impl RunConfig {
    /// Defaults for `exe` writing to `out`. The link name is `ipsanlab<pid>`, unique among
    /// live processes, and everything host-wide the lab creates (namespaces, wireguard-go's
    /// control sockets) is named from it, so two labs on one host cannot collide. The subnet
    /// only lives inside the link's own two namespaces, so equal subnets of two labs do not
    /// meet; it still varies with the pid to keep packet captures apart.
    pub fn new(exe: PathBuf, out: PathBuf) -> RunConfig {
        let pid = std::process::id();
        RunConfig {
            exe,
            out,
            progress: true,
            link_name: crate::guard::link_name_for_pid(pid),
            subnet: 200 + ((pid % 25) * 2) as u8,
            calibration: None,
        }
    }
}

const IQN: &str = "iqn.2026-11.org.ipsan:lab";
const PORT: u16 = 3260;
const TLS_PORT: u16 = 3261;
const WG_PORT: u16 = 51820;

/// Runs `plan`, writing results as it goes; returns every record. With
/// [`RunConfig::calibration`], every input of the models comes from that file (checked to
/// cover the plan before the first run), which is copied into the output directory.
pub fn run_plan(plan: &Plan, cfg: &RunConfig) -> std::io::Result<Vec<Record>> {
    std::fs::create_dir_all(&cfg.out)?;
    let fixed = cfg.calibration.as_deref();
    if let Some(c) = fixed {
        c.file.covers(plan).map_err(std::io::Error::other)?;
        std::fs::write(
            cfg.out.join(crate::calibrate::CALIBRATION_IN_RESULTS),
            &c.bytes,
        )?;
    }
    // The resolved plan, so the results say exactly what was run.
    let plan_json = serde_json::to_string_pretty(plan).map_err(std::io::Error::other)?;
    std::fs::write(cfg.out.join("plan.json"), plan_json + "\n")?;
    let scratch = cfg.out.join("scratch");
    std::fs::create_dir_all(&scratch)?;
    let env = Environment::detect(&cfg.exe);
    let root = ipsan_wan::link::is_root();
    if root {
        for ns in crate::guard::sweep_stale() {
            tracing::info!("removed {ns}, left behind by a lab that was killed");
        }
    }
    let bench_has_seal = help_mentions(&cfg.exe, "bench", "--seal");
    let bench_has_auto = help_mentions(&cfg.exe, "bench", "--depth-start");
    let mut records: Vec<Record> = Vec::new();
    let total = plan.run_count();
    let started = Instant::now();
    let mut done = 0usize;
    let mut groups: Vec<(String, Vec<(&Point, u32)>)> = Vec::new();
    for (i, p) in plan.points.iter().enumerate() {
        let key = link_group_key(p);
        let entry = (p, plan.repetitions_of(i));
        match groups.last_mut() {
            Some((k, v)) if *k == key => v.push(entry),
            _ => groups.push((key, vec![entry])),
        }
    }
    let groups: Vec<Vec<(&Point, u32)>> = groups.into_iter().map(|(_, g)| g).collect();
    let mut enc_cache: BTreeMap<(String, u64), (f64, f64)> = BTreeMap::new();
    for (points, reps) in passes(&groups, |&(_, n)| n, plan.fresh_link) {
        let first = points[0].0;
        let impaired = first.delay_ms > 0.0
            || first.loss > 0.0
            || first.reorder > 0.0
            || first.corrupt > 0.0
            || first.rate_mbit > 0.0;
        let needs_ns = impaired
            || matches!(first.scheme, Scheme::EspEmu | Scheme::Iperf3)
            || first.scheme.lower_layer();
        let mut env_ctx = if root {
            match LabLink::up(first, cfg, plan.queue) {
                Ok(l) => Ok(Some(l)),
                Err(e) => Err(format!("bringing the link up: {e}")),
            }
        } else if needs_ns {
            Err("needs root: namespaces, the WAN emulator and tunnels (ran without root, loopback only)".into())
        } else {
            Ok(None)
        };
        let calib = match (&env_ctx, fixed) {
            (Err(e), _) => Err(e.clone()),
            // Checked by `covers` above.
            (Ok(_), Some(c)) => c
                .file
                .link(first)
                .cloned()
                .ok_or_else(|| "the calibration file has no entry for this link".to_string()),
            (Ok(l), None) => calibrate_link(l.as_ref(), first),
        };
        for &(p, point_reps) in points {
            for rep in reps.clone().take_while(|&r| r < point_reps) {
                let t0 = Instant::now();
                let label = p.label();
                if cfg.progress {
                    progress(done, total, started, &label);
                }
                let mut rec = Record::new(&plan.name, records.len(), rep, p, &env, root);
                match (&mut env_ctx, &calib) {
                    (Err(e), _) => {
                        rec.status = if root {
                            Status::Failed
                        } else {
                            Status::Skipped
                        };
                        rec.error = e.clone();
                    }
                    (Ok(_), Err(e)) => {
                        rec.status = Status::Failed;
                        rec.error = format!("calibration: {e}");
                    }
                    (Ok(link), Ok(c)) => {
                        rec.calibration = Some(c.clone());
                        let enc = match fixed {
                            Some(f) => {
                                rec.calibration_sha1 = f.sha1.clone();
                                f.file.cipher(p).unwrap_or((f64::NAN, f64::NAN))
                            }
                            None => enc_dec(&mut enc_cache, p),
                        };
                        let ctx = RunCtx {
                            cfg,
                            plan,
                            link: link.as_ref(),
                            calib: c,
                            enc,
                            scratch: &scratch,
                            bench_has_seal,
                            bench_has_auto,
                            trace: None,
                        };
                        run_one(&ctx, p, &mut rec);
                    }
                }
                // After Ctrl-C the run above was killed under us: record nothing more.
                crate::guard::stop_point();
                rec.wall_s = t0.elapsed().as_secs_f64();
                records.push(rec);
                done += 1;
                crate::results::write_all(&cfg.out, &records)?;
            }
        }
        if let Ok(Some(l)) = env_ctx {
            l.down();
        }
    }
    if let Some(tl) = &plan.timeline {
        if cfg.progress {
            eprint!("\r\x1b[2Klab: timeline runs (traced)");
        }
        run_timeline(plan, tl, cfg, &env, root, &scratch, bench_has_seal)?;
    }
    if cfg.progress {
        eprintln!(
            "\r\x1b[2Klab: {} runs in {:.0}s → {}",
            total,
            started.elapsed().as_secs_f64(),
            cfg.out.display()
        );
    }
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(records)
}

/// The passes over a plan's links: each brings one link up, runs its points' repetitions in
/// the range (a point stops at its own count, `reps(point)`), and takes the link down. By
/// default one pass per link with every repetition (back to back); with `fresh_link`, one
/// pass per link and repetition, the repetitions round-robin over the links
/// ([`crate::plan::PlanSpec::fresh_link`]), and no pass for a link none of whose points
/// wants that repetition.
fn passes<T>(
    groups: &[Vec<T>],
    reps: impl Fn(&T) -> u32,
    fresh_link: bool,
) -> Vec<(&[T], Range<u32>)> {
    let most = |g: &Vec<T>| g.iter().map(&reps).max().unwrap_or(0);
    if fresh_link {
        let all = groups.iter().map(most).max().unwrap_or(0);
        (0..all)
            .flat_map(|rep| {
                groups
                    .iter()
                    .filter(move |g| most(g) > rep)
                    .map(move |g| (g.as_slice(), rep..rep + 1))
            })
            .collect()
    } else {
        groups.iter().map(|g| (g.as_slice(), 0..most(g))).collect()
    }
}

/// The traced runs behind the command timeline: each scheme once on one link, its trace in
/// `timeline/<scheme>.jsonl` and its record in `timeline/runs.json` (not in results.json: a
/// short traced run is not a measurement point).
fn run_timeline(
    plan: &Plan,
    tl: &crate::plan::Timeline,
    cfg: &RunConfig,
    env: &Environment,
    root: bool,
    scratch: &Path,
    bench_has_seal: bool,
) -> std::io::Result<()> {
    let dir = cfg.out.join("timeline");
    std::fs::create_dir_all(&dir)?;
    let Some(first) = tl.points.first() else {
        return Ok(());
    };
    let mut short = Plan {
        run_time: tl.run_time,
        timeline: None,
        ..plan.clone()
    };
    short.set_repetitions(1);
    let link = if root {
        LabLink::up(first, cfg, plan.queue).map(Some)
    } else if first.delay_ms > 0.0 {
        Err("needs root: namespaces and the WAN emulator".to_string())
    } else {
        Ok(None)
    };
    let mut records = Vec::new();
    for (i, p) in tl.points.iter().enumerate() {
        let mut rec = Record::new(&plan.name, i, 0, p, env, root);
        match &link {
            Err(e) => {
                rec.status = Status::Skipped;
                rec.error = e.clone();
            }
            Ok(l) => {
                let calib = Calibration {
                    loopback: l.is_none(),
                    ..Calibration::default()
                };
                let path = dir.join(format!("{}.jsonl", p.scheme));
                let _ = std::fs::remove_file(&path);
                let ctx = RunCtx {
                    cfg,
                    plan: &short,
                    link: l.as_ref(),
                    calib: &calib,
                    enc: (f64::NAN, f64::NAN),
                    scratch,
                    bench_has_seal,
                    bench_has_auto: false,
                    trace: Some(path),
                };
                run_one(&ctx, p, &mut rec);
            }
        }
        records.push(rec);
    }
    if let Ok(Some(l)) = link {
        l.down();
    }
    let json = serde_json::to_string_pretty(&records).map_err(std::io::Error::other)?;
    std::fs::write(dir.join("runs.json"), json + "\n")
}

fn progress(done: usize, total: usize, started: Instant, label: &str) {
    let width = 24;
    let filled = (done * width)
        .checked_div(total)
        .unwrap_or(width)
        .min(width);
    let eta = if done == 0 {
        "?".to_string()
    } else {
        let per = started.elapsed().as_secs_f64() / done as f64;
        fmt_secs(per * (total - done) as f64)
    };
    eprint!(
        "\r\x1b[2K[{}{}] {}/{} ETA {} {}",
        "#".repeat(filled),
        "-".repeat(width - filled),
        done,
        total,
        eta,
        label
    );
}

fn fmt_secs(s: f64) -> String {
    let s = s.max(0.0) as u64;
    if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

struct RunCtx<'a> {
    cfg: &'a RunConfig,
    plan: &'a Plan,
    link: Option<&'a LabLink>,
    calib: &'a Calibration,
    enc: (f64, f64),
    scratch: &'a Path,
    bench_has_seal: bool,
    /// `ipsan bench --depth auto` exists: `depth = auto` adapts live from the model's start.
    bench_has_auto: bool,
    /// Write bench's per-command trace here.
    trace: Option<PathBuf>,
}

impl RunCtx<'_> {
    fn command(&self, side: Side, program: &str) -> Command {
        match self.link {
            Some(l) => l.link.command(side, program),
            None => Command::new(program),
        }
    }
    fn tgt_addr(&self) -> Ipv4Addr {
        self.link.map_or(Ipv4Addr::LOCALHOST, |l| l.tgt())
    }
    fn subnet(&self) -> u8 {
        self.cfg.subnet
    }
}

fn model_pipeline(p: &Point, depth: u32, first_burst: Option<u64>, cpus: u32) -> Pipeline {
    Pipeline {
        depth,
        round_trips: p.round_trips(first_burst),
        crypto_workers: p.seal_crypto_workers(cpus),
        window: None,
        crypto: match p.scheme {
            Scheme::Plain => CryptoPlace::None,
            Scheme::Seal | Scheme::SealSeq => CryptoPlace::Command,
            _ => CryptoPlace::Packet,
        },
    }
}

fn run_one(ctx: &RunCtx<'_>, p: &Point, rec: &mut Record) {
    match try_run(ctx, p, rec) {
        Ok(()) => rec.status = Status::Ok,
        Err(RunError::Skip(why)) => {
            rec.status = Status::Skipped;
            rec.error = why;
        }
        Err(RunError::Fail(why)) => {
            rec.status = Status::Failed;
            rec.error = why;
        }
    }
}

enum RunError {
    Skip(String),
    Fail(String),
}

fn fail(s: impl Into<String>) -> RunError {
    RunError::Fail(s.into())
}

/// One run: the model's inputs and starting depth, the target, the scheme's carrier, one
/// `ipsan bench` with the CPU of every process and the link's counters around it, then the
/// bench's result and the model's prediction for it.
fn try_run(ctx: &RunCtx<'_>, p: &Point, rec: &mut Record) -> Result<(), RunError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let inputs = model_inputs(ctx, p, rec);
    let depth = start_depth(ctx, p, &inputs, cpus)?;
    rec.depth_used = depth;
    let carrier = carrier::of(p.scheme);
    carrier.check(ctx)?;
    let run_time = ctx
        .plan
        .run_time_for(Duration::from_secs_f64(ctx.calib.rtt_ms.max(0.0) / 1e3));
    rec.run_time_s = run_time.as_secs_f64();
    if p.scheme == Scheme::Iperf3 {
        return iperf3(ctx, p, run_time, rec);
    }
    let mut procs = Procs(Vec::new(), Vec::new());
    let target = start_target(ctx, p, carrier, depth, &mut procs)?;
    let connect = carrier.connect(ctx, p, &mut procs, target)?;
    let bench = Bench::new(ctx, p, carrier, connect, depth, run_time);
    let out = measure(ctx, &procs, bench.cmd, run_time, rec)?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        return Err(fail(format!(
            "bench exited with {}: {}",
            out.status,
            last.trim()
        )));
    }
    read_bench_result(ctx, p, &bench.json, &bench.steady_trace, depth, rec)?;
    // Model prediction with the negotiated parameters.
    let pipeline = model_pipeline(p, rec.depth_used, rec.first_burst, cpus);
    if let Ok(pred) = model::predict(&inputs, &pipeline) {
        rec.model_mb_s = pred.throughput / 1e6;
        rec.model_limit = pred.limit.to_string();
        rec.model_err_pct = (rec.throughput_mb_s / rec.model_mb_s - 1.0) * 100.0;
    }
    Ok(())
}

/// The model's inputs from the link's calibration (the cipher rates also go to the record).
fn model_inputs(ctx: &RunCtx<'_>, p: &Point, rec: &mut Record) -> Inputs {
    rec.enc_mb_s = ctx.enc.0 / 1e6;
    rec.dec_mb_s = ctx.enc.1 / 1e6;
    Inputs {
        rtt_s: ctx.calib.rtt_ms / 1e3,
        block: p.block as f64,
        socket: ctx.calib.socket_mb_s * 1e6,
        enc: ctx.enc.0,
        dec: ctx.enc.1,
    }
}

/// The depth the run starts at: the point's, or for `auto` the model's estimate (rounded up
/// when round-trip-bound); bench starts there and adapts (when it can).
fn start_depth(ctx: &RunCtx<'_>, p: &Point, inputs: &Inputs, cpus: u32) -> Result<u32, RunError> {
    match p.depth {
        Depth::Fixed(n) => Ok(n),
        Depth::Auto => model::auto_start(
            inputs,
            &model_pipeline(p, 1, None, cpus),
            ctx.plan.max_depth,
        )
        .map_err(|e| fail(format!("auto depth: {e}"))),
    }
}

/// Starts `ipsan target` with the plan's LUN, queue depth and socket buffers and the
/// carrier's flags, and waits until it listens; returns its address.
fn start_target(
    ctx: &RunCtx<'_>,
    p: &Point,
    carrier: &dyn carrier::Carrier,
    depth: u32,
    procs: &mut Procs,
) -> Result<SocketAddr, RunError> {
    let lun = match p.backend {
        Backend::Mem => format!("mem:{}", ctx.plan.lun_bytes),
        Backend::Null => format!("null:{}", ctx.plan.lun_bytes),
        Backend::File => format!(
            "file:{},size={}",
            ctx.scratch.join("lun.img").display(),
            ctx.plan.lun_bytes
        ),
        // ipsan-block's defaults: 8.5 ms average seek, 7200 rpm, 30 MB/s (docs/lab.md).
        Backend::Disk => format!("disk:{}", ctx.plan.lun_bytes),
    };
    let bind = if ctx.link.is_some() {
        "0.0.0.0"
    } else {
        "127.0.0.1"
    };
    let port = if ctx.link.is_some() {
        PORT
    } else {
        free_port().map_err(|e| fail(format!("no free port: {e}")))?
    };
    let mut tcmd = ctx.command(Side::Tgt, &ctx.cfg.exe.to_string_lossy());
    tcmd.args([
        "target",
        "--portal",
        &format!("{bind}:{port}"),
        "--iqn",
        IQN,
        "--lun",
        &lun,
        "--queue-depth",
        // `auto` may go up to the plan's max_depth: the CmdSN window must not be the limit.
        &if p.depth == Depth::Auto {
            depth.max(ctx.plan.max_depth)
        } else {
            depth
        }
        .max(32)
        .to_string(),
    ]);
    if let Some(n) = ctx.plan.tcp_buffer {
        tcmd.args([
            "--tcp-sndbuf",
            &n.to_string(),
            "--tcp-rcvbuf",
            &n.to_string(),
        ]);
    }
    carrier.target_args(ctx, p, &mut tcmd)?;
    let (target, lines) =
        spawn_watch(tcmd).map_err(|e| fail(format!("starting the target: {e}")))?;
    procs.0.push(("target".into(), target));
    wait_line(&lines, "listening on", Duration::from_secs(15))
        .map_err(|e| fail(format!("target did not start: {e}")))?;
    Ok(SocketAddr::from((ctx.tgt_addr(), port)))
}

#[cfg(test)]
mod tests {
    use super::measure::spread_throughput;
    use super::*;

    type Passes<'a> = Vec<(&'a [(&'a str, u32)], Range<u32>)>;

    /// Each pass as its points' names joined with `+`, and its repetitions.
    fn flat(v: Passes) -> Vec<(String, Range<u32>)> {
        v.into_iter()
            .map(|(g, r)| (g.iter().map(|p| p.0).collect::<Vec<_>>().join("+"), r))
            .collect()
    }

    /// Back to back: one pass per link with every repetition. Fresh links: a pass per link
    /// and repetition, every link's first repetition before any second one.
    #[test]
    fn passes_run_repetitions_back_to_back_or_round_robin() {
        let groups = vec![vec![("a2ms", 3), ("b2ms", 3)], vec![("a64ms", 3)]];
        assert_eq!(
            flat(passes(&groups, |p| p.1, false)),
            [("a2ms+b2ms".to_string(), 0..3), ("a64ms".to_string(), 0..3)]
        );
        assert_eq!(
            flat(passes(&groups, |_| 2, true)),
            [
                ("a2ms+b2ms".to_string(), 0..1),
                ("a64ms".to_string(), 0..1),
                ("a2ms+b2ms".to_string(), 1..2),
                ("a64ms".to_string(), 1..2),
            ]
        );
    }

    /// A table's own repetitions: its link's pass runs as many as its most-repeated point
    /// wants; with fresh links, the links whose points are done get no more passes.
    #[test]
    fn passes_follow_each_points_own_repetitions() {
        let groups = vec![vec![("a2ms", 3), ("b2ms", 5)], vec![("a64ms", 2)]];
        assert_eq!(
            flat(passes(&groups, |p| p.1, false)),
            [("a2ms+b2ms".to_string(), 0..5), ("a64ms".to_string(), 0..2)]
        );
        let fresh = flat(passes(&groups, |p| p.1, true));
        let count = |k: &str| fresh.iter().filter(|(g, _)| g == k).count();
        assert_eq!((count("a2ms+b2ms"), count("a64ms")), (5, 2));
        assert_eq!(fresh.last(), Some(&("a2ms+b2ms".to_string(), 4..5)));
    }

    /// paper-regime's calibration prices its carriers on separate runs: seal, plain (seal's
    /// stacks) and IPsec, each at the three cost blocks, on its shortest delayed link (8 ms,
    /// 80 Mbit/s), one command in flight (seal four).
    #[test]
    fn cost_runs_are_separate_short_runs_on_the_plans_links() {
        let plan = Plan::load("paper-regime").unwrap();
        let c = cost_plan(&plan);
        assert_eq!(c.points.len(), 9, "{:#?}", c.points);
        assert_eq!(c.point_repetitions, vec![1; 9]);
        assert!(c.timeline.is_none());
        for p in &c.points {
            assert_eq!((p.delay_ms, p.rate_mbit), (8.0, 80.0));
            assert!(COST_BLOCKS.contains(&p.block));
            let want = if p.scheme == Scheme::Seal { 4 } else { 1 };
            assert_eq!(p.depth, Depth::Fixed(want));
        }
        for s in [Scheme::Seal, Scheme::Plain, Scheme::Ipsec] {
            assert_eq!(c.points.iter().filter(|p| p.scheme == s).count(), 3);
        }
        // quick: both delay classes, the zero-delay link first; no iperf3 anywhere.
        let q = cost_plan(&Plan::load("quick").unwrap());
        assert!(q.points.iter().all(|p| p.scheme != Scheme::Iperf3));
        assert_eq!(q.points[0].delay_ms, 0.0);
        assert!(q.points.iter().any(|p| p.delay_ms == 8.0));
        assert!(q.points.iter().all(|p| p.delay_ms != 64.0));
    }

    /// A plan's `crypto_workers` reaches both ends of a seal run as `--crypto-workers`
    /// (the target's and `ipsan bench`'s flag); without it neither command gets the flag and
    /// both keep their default of one worker per CPU.
    #[test]
    fn passes_crypto_workers_to_both_seal_ends_only_when_the_plan_sets_them() {
        let plan = Plan::parse(
            "t",
            "name='t'\n[[matrix]]\ndirection=['read']\nscheme=['seal','seal-seq']\ncrypto_workers=[0,1]\n",
        )
        .unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cfg = RunConfig::new(PathBuf::from("ipsan"), dir.path().to_path_buf());
        let calib = Calibration::default();
        let ctx = RunCtx {
            cfg: &cfg,
            plan: &plan,
            link: None,
            calib: &calib,
            enc: (1e7, 1e7),
            scratch: dir.path(),
            bench_has_seal: true,
            bench_has_auto: true,
            trace: None,
        };
        let workers_flag = |c: &Command| {
            let args: Vec<String> = c
                .get_args()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            args.windows(2)
                .find(|w| w[0] == "--crypto-workers")
                .map(|w| w[1].clone())
        };
        assert_eq!(plan.points.len(), 4);
        for p in &plan.points {
            let carrier = carrier::of(p.scheme);
            let mut target = Command::new("ipsan");
            assert!(carrier.target_args(&ctx, p, &mut target).is_ok());
            let bench = Bench::new(
                &ctx,
                p,
                carrier,
                SocketAddr::from((Ipv4Addr::LOCALHOST, 3260)),
                1,
                Duration::from_secs(1),
            );
            let want = (p.crypto_workers > 0).then(|| p.crypto_workers.to_string());
            assert_eq!(workers_flag(&target), want, "target: {}", p.label());
            assert_eq!(workers_flag(&bench.cmd), want, "bench: {}", p.label());
        }
    }

    #[test]
    fn reads_own_cpu_time() {
        // Spin until the kernel has charged us 50 ms (the host may be busy: bounded by 20 s).
        let a = proc_cpu_s(std::process::id());
        assert!(a.is_finite());
        let t = Instant::now();
        let mut x = 0u64;
        let mut b = a;
        while b - a < 0.05 && t.elapsed() < Duration::from_secs(20) {
            for _ in 0..1_000_000 {
                x = x.wrapping_mul(31).wrapping_add(7);
            }
            b = proc_cpu_s(std::process::id());
        }
        std::hint::black_box(x);
        assert!(b - a >= 0.05, "{a} → {b}");
        assert!(proc_cpu_s(u32::MAX).is_nan());
    }

    #[test]
    fn spreads_bursty_completions_without_edge_effects() {
        // Eight commands in flight, all completing together every 0.25 s (1 MiB each): the
        // rate is 8 MiB / 0.25 s wherever the window's edges fall.
        let block = 1u64 << 20;
        let mut lives = Vec::new();
        for k in 0..40 {
            for _ in 0..8 {
                lives.push((k as f64 * 0.25, (k + 1) as f64 * 0.25));
            }
        }
        let want = 8.0 * block as f64 / 0.25 / 1e6;
        for from in [2.0, 2.1, 2.2, 2.37] {
            let got = spread_throughput(&lives, block, from, from + 1.7).unwrap();
            assert!((got / want - 1.0).abs() < 1e-9, "{from}: {got} vs {want}");
        }
        assert!(spread_throughput(&lives, block, 20.0, 21.0).is_err());
        assert!(spread_throughput(&lives, block, 1.0, 1.0).is_err());
    }

    #[test]
    fn bounded_run_kills_a_hang() {
        let mut c = Command::new("sleep");
        c.arg("30");
        let t = Instant::now();
        assert!(run_bounded(c, Duration::from_millis(200)).is_err());
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
