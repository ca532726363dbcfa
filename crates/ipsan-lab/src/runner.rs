//! The runner: brings up each link once, calibrates it, and runs every point of the plan
//! through the real `ipsan target` and `ipsan bench` processes (and the real tunnel
//! processes for the lower-layer baselines), recording each run as ok, failed (with its
//! error) or skipped (with the reason). A failed run never stops the matrix.

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

use crate::calibrate::{self, Loopback, Sockets};
use crate::esp::{self, EspCounters};
use crate::model::{self, CryptoPlace, Inputs, Pipeline};
use crate::plan::{Backend, Depth, IscsiMode, Plan, Point, Scheme};
use crate::results::{Calibration, Environment, Record, Status};

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
        }
    }
}

const IQN: &str = "iqn.2026-11.org.ipsan:lab";
const PORT: u16 = 3260;
const TLS_PORT: u16 = 3261;
const WG_PORT: u16 = 51820;

/// Runs `plan`, writing results as it goes; returns every record.
pub fn run_plan(plan: &Plan, cfg: &RunConfig) -> std::io::Result<Vec<Record>> {
    std::fs::create_dir_all(&cfg.out)?;
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
        let key = format!("{}|{}", p.link_key(), p.scheme == Scheme::EspEmu);
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
        let calib = match &env_ctx {
            Ok(l) => calibrate_link(l.as_ref(), first),
            Err(e) => Err(e.clone()),
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
                        let enc = enc_dec(&mut enc_cache, p);
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

/// A lab link: the emulator plus what the lab set inside its namespaces.
struct LabLink {
    link: Link,
    esp: Option<Arc<EspCounters>>,
    sysctls: Vec<(String, String)>,
}

impl LabLink {
    fn up(p: &Point, cfg: &RunConfig, queue: QueueLimit) -> Result<LabLink, String> {
        let _ = ipsan_wan::link::cleanup(&cfg.link_name);
        crate::guard::register_link(&cfg.link_name);
        let dir = DirConfig {
            delay: Duration::from_secs_f64(p.delay_ms / 1e3),
            loss: if p.loss > 0.0 {
                LossModel::Bernoulli { p: p.loss }
            } else {
                LossModel::None
            },
            reorder: p.reorder,
            corrupt: p.corrupt,
            rate_bps: (p.rate_mbit * 1e6) as u64,
            queue,
            ..DirConfig::default()
        };
        let mut lc = LinkConfig::new(cfg.link_name.clone()).symmetric(dir);
        lc.subnet = cfg.subnet;
        let (extra, esp) = if p.scheme == Scheme::EspEmu {
            let (up, down, c) = esp::stages().map_err(|e| format!("esp-emu keys: {e}"))?;
            (
                ExtraStages {
                    up: vec![Box::new(up)],
                    down: vec![Box::new(down)],
                },
                Some(c),
            )
        } else {
            (ExtraStages::default(), None)
        };
        let link = Link::up_with(lc, extra).map_err(|e| e.to_string())?;
        let mut l = LabLink {
            link,
            esp,
            sysctls: Vec::new(),
        };
        // The papers' stacks were Reno-like; this kernel defaults to BBR. And the root
        // namespace caps socket buffers at 4 MiB, too small for 64 ms at these rates.
        let settings = [
            ("ipv4.tcp_congestion_control", p.cc.clone()),
            ("core.rmem_max", "67108864".to_string()),
            ("core.wmem_max", "67108864".to_string()),
            ("ipv4.tcp_rmem", "4096 131072 67108864".to_string()),
            ("ipv4.tcp_wmem", "4096 16384 67108864".to_string()),
        ];
        for side in [Side::Ini, Side::Tgt] {
            let ns = l.link.netns(side);
            let _ = run_quiet(Command::new("ip").args(["-n", &ns, "link", "set", "lo", "up"]));
            for (k, v) in &settings {
                let (k2, v2) = (k.to_string(), v.clone());
                let r = l
                    .link
                    .run_in(side, move || ipsan_wan::netns::write_net_sysctl(&k2, &v2))
                    .map_err(|e| e.to_string())
                    .and_then(|r| r.map_err(|e| e.to_string()));
                if let Err(e) = r {
                    if k.contains("congestion") {
                        return Err(format!("setting net.{k}={v} in {ns}: {e}"));
                    }
                }
            }
        }
        for (k, _) in &settings {
            let k2 = k.to_string();
            let got = l
                .link
                .run_in(Side::Ini, move || {
                    std::fs::read_to_string(
                        PathBuf::from("/proc/sys/net").join(k2.replace('.', "/")),
                    )
                    .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
                    .unwrap_or_else(|e| format!("unreadable: {e}"))
                })
                .unwrap_or_default();
            l.sysctls.push((format!("net.{k}"), got));
        }
        Ok(l)
    }

    fn down(self) {
        let LabLink { link, .. } = self;
        let name = link.netns(Side::Ini);
        if let Err(e) = link.down() {
            tracing::warn!("lab link down: {e}");
        }
        if let Some(n) = name.strip_suffix("-ini") {
            crate::guard::unregister_link(n);
        }
    }

    /// The largest buffer a plain `SO_RCVBUF`/`SO_SNDBUF` gets inside the namespaces:
    /// `net.core.{r,w}mem_max` as read back when the link came up (host-wide, so the lab's
    /// writes there may not have taken).
    fn socket_buffer_cap(&self) -> u64 {
        ["net.core.rmem_max", "net.core.wmem_max"]
            .iter()
            .map(|k| {
                self.sysctls
                    .iter()
                    .find(|(name, _)| name == k)
                    .and_then(|(_, v)| v.parse::<u64>().ok())
                    .unwrap_or(u64::MAX)
            })
            .min()
            .unwrap_or(u64::MAX)
    }

    fn tgt(&self) -> Ipv4Addr {
        self.link.addr(Side::Tgt)
    }
}

impl Sockets for LabLink {
    fn listen(&self) -> std::io::Result<TcpListener> {
        let a = SocketAddr::from((self.tgt(), 0));
        self.link
            .run_in(Side::Tgt, move || TcpListener::bind(a))
            .map_err(std::io::Error::other)?
    }
    fn connect(&self, addr: SocketAddr) -> std::io::Result<TcpStream> {
        self.link
            .run_in(Side::Ini, move || {
                TcpStream::connect_timeout(&addr, Duration::from_secs(10))
            })
            .map_err(std::io::Error::other)?
    }
}

fn calibrate_link(link: Option<&LabLink>, p: &Point) -> Result<Calibration, String> {
    let s: &dyn Sockets = match link {
        Some(l) => l,
        None => &Loopback,
    };
    let rtt = calibrate::rtt(s, 10).map_err(|e| format!("RTT ping-pong: {e}"))?;
    // Long enough for slow start to finish at the link's RTT, short enough for CI.
    let secs = (rtt.median_s * 30.0).clamp(1.0, 4.0);
    let secs = if p.loss > 0.0 || p.corrupt > 0.0 || p.reorder > 0.0 {
        secs.max(2.0)
    } else {
        secs
    };
    // Two transfers, the better one kept: on a shared host one transfer now and then stalls
    // (seen: 4.5 MB/s where the next gave 150 MB/s), and SOCKET is what the link can carry.
    let mut socket = 0.0f64;
    for _ in 0..2 {
        let s = calibrate::socket_throughput(s, Duration::from_secs_f64(secs))
            .map_err(|e| format!("bulk TCP: {e}"))?;
        socket = socket.max(s);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cores_avail = calibrate::available_cores(cpus, Duration::from_millis(500));
    Ok(Calibration {
        cores_avail,
        rtt_ms: rtt.median_s * 1e3,
        rtt_min_ms: rtt.min_s * 1e3,
        rtt_max_ms: rtt.max_s * 1e3,
        socket_mb_s: socket / 1e6,
        sysctls: link.map(|l| l.sysctls.clone()).unwrap_or_default(),
        loopback: link.is_none(),
    })
}

/// ENC/DEC for the scheme: seal's cipher at the block size; per-packet ciphers at a
/// 1400-byte packet (TLS: a 16 KiB record); esp-emu from its own stage.
fn enc_dec(cache: &mut BTreeMap<(String, u64), (f64, f64)>, p: &Point) -> (f64, f64) {
    let (cipher, size) = match p.scheme {
        Scheme::Plain | Scheme::Iperf3 => return (f64::INFINITY, f64::INFINITY),
        Scheme::Seal | Scheme::SealSeq => (p.cipher.clone(), p.block),
        Scheme::Wireguard => ("chacha20-poly1305".to_string(), 1536),
        Scheme::Tls => (tls_cipher(&p.cipher).0.to_string(), 16384),
        Scheme::Ipsec => (p.cipher.clone(), 1536),
        Scheme::EspEmu => ("esp-emu".to_string(), 1400),
    };
    *cache.entry((cipher.clone(), size)).or_insert_with(|| {
        if cipher == "esp-emu" {
            let r = esp::bench(size as usize, Duration::from_millis(300));
            return (r, r);
        }
        let c = Cipher::from_name(&cipher).unwrap_or(Cipher::Aes256Gcm);
        // Seal frames in 512-byte blocks; round the packet size up to that.
        let sz = (size as usize).div_ceil(512) * 512;
        calibrate::cipher_throughput(c, sz, Duration::from_millis(300))
            .unwrap_or((f64::NAN, f64::NAN))
    })
}

fn tls_cipher(seal_cipher: &str) -> (&'static str, &'static str) {
    if seal_cipher == "chacha20-poly1305" {
        ("chacha20-poly1305", "TLS_CHACHA20_POLY1305_SHA256")
    } else {
        ("aes-256-gcm", "TLS_AES_256_GCM_SHA384")
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
    fn ns(&self, side: Side) -> Option<String> {
        self.link.map(|l| l.link.netns(side))
    }
    fn tgt_addr(&self) -> Ipv4Addr {
        self.link.map_or(Ipv4Addr::LOCALHOST, |l| l.tgt())
    }
    fn subnet(&self) -> u8 {
        self.cfg.subnet
    }
}

/// Children killed on drop (and files they leave behind removed), so a failing run cleans up.
struct Procs(Vec<(String, Child)>, Vec<PathBuf>);

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
        for f in &self.1 {
            let _ = std::fs::remove_file(f);
            crate::guard::unregister_file(f);
        }
    }
}

fn model_pipeline(p: &Point, depth: u32, first_burst: Option<u64>, cpus: u32) -> Pipeline {
    Pipeline {
        depth,
        round_trips: p.round_trips(first_burst),
        crypto_workers: if p.scheme == Scheme::SealSeq {
            1
        } else {
            cpus.max(1)
        },
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

fn try_run(ctx: &RunCtx<'_>, p: &Point, rec: &mut Record) -> Result<(), RunError> {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u32;
    let inputs = Inputs {
        rtt_s: ctx.calib.rtt_ms / 1e3,
        block: p.block as f64,
        socket: ctx.calib.socket_mb_s * 1e6,
        enc: ctx.enc.0,
        dec: ctx.enc.1,
    };
    rec.enc_mb_s = ctx.enc.0 / 1e6;
    rec.dec_mb_s = ctx.enc.1 / 1e6;
    // `auto`: the model's estimate (rounded up when round-trip-bound); bench starts there and
    // adapts (when it can).
    let depth = match p.depth {
        Depth::Fixed(n) => n,
        Depth::Auto => model::auto_start(
            &inputs,
            &model_pipeline(p, 1, None, cpus),
            ctx.plan.max_depth,
        )
        .map_err(|e| fail(format!("auto depth: {e}")))?,
    };
    rec.depth_used = depth;
    match p.scheme {
        Scheme::Ipsec => {
            if let Some(why) = crate::ipsec::unavailable() {
                return Err(RunError::Skip(why));
            }
        }
        Scheme::Seal | Scheme::SealSeq if !ctx.bench_has_seal => {
            return Err(fail(
                "ipsan bench has no --seal flag yet (seal is being integrated into the initiator); not faked",
            ))
        }
        _ => {}
    }
    let run_time = ctx
        .plan
        .run_time_for(Duration::from_secs_f64(ctx.calib.rtt_ms.max(0.0) / 1e3));
    rec.run_time_s = run_time.as_secs_f64();
    if p.scheme == Scheme::Iperf3 {
        return iperf3(ctx, run_time, rec);
    }
    let mut procs = Procs(Vec::new(), Vec::new());
    // --- target ---
    let secret = ctx.scratch.join("seal.secret");
    if p.scheme.is_seal() {
        std::fs::write(
            &secret,
            b"ipsan lab run secret: 32+ bytes long, never reused\n",
        )
        .map_err(|e| fail(format!("writing the seal secret: {e}")))?;
        // The target refuses secret files others can read.
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .map_err(|e| fail(format!("chmod 600 the seal secret: {e}")))?;
    }
    let lun = match p.backend {
        Backend::Mem => format!("mem:{}", ctx.plan.lun_bytes),
        Backend::Null => format!("null:{}", ctx.plan.lun_bytes),
        Backend::File => format!(
            "file:{},size={}",
            ctx.scratch.join("lun.img").display(),
            ctx.plan.lun_bytes
        ),
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
    if p.scheme.is_seal() {
        tcmd.args(["--seal", "required", "--seal-secret-file"]);
        tcmd.arg(&secret);
    } else if ctx.link.is_some() {
        // 0.0.0.0 inside the target namespace this run made, reached only by its own
        // initiator namespace (or tunnel): no host authentication, said explicitly, as a
        // target beyond loopback refuses to start without it (docs/target.md).
        tcmd.arg("--insecure-no-auth");
    }
    let (target, lines) =
        spawn_watch(tcmd).map_err(|e| fail(format!("starting the target: {e}")))?;
    procs.0.push(("target".into(), target));
    wait_line(&lines, "listening on", Duration::from_secs(15))
        .map_err(|e| fail(format!("target did not start: {e}")))?;
    // --- tunnel ---
    let connect = match p.scheme {
        Scheme::Wireguard => wireguard(ctx, &mut procs)?,
        Scheme::Tls => tls(ctx, p, &mut procs)?,
        Scheme::Ipsec => ipsec(ctx, p, &mut procs)?,
        _ => SocketAddr::from((ctx.tgt_addr(), port)),
    };
    // --- bench ---
    let json = ctx.scratch.join("bench.json");
    let _ = std::fs::remove_file(&json);
    let url = format!("iscsi://{connect}/{IQN}/0");
    let live_auto = p.depth == Depth::Auto && ctx.bench_has_auto && p.scheme != Scheme::SealSeq;
    let depth_arg = if live_auto {
        "auto".to_string()
    } else {
        depth.to_string()
    };
    let mut b = ctx.command(Side::Ini, &ctx.cfg.exe.to_string_lossy());
    b.args([
        "bench",
        &url,
        "--rw",
        p.direction.name(),
        "--bs",
        &p.block.to_string(),
        "--depth",
        &depth_arg,
        "--time",
        &format!("{}ms", run_time.as_millis()),
        "--quiet",
        "--json",
    ]);
    b.arg(&json);
    if live_auto {
        // bench's controller starts at the model's estimate and adapts from there.
        b.args([
            "--depth-start",
            &depth.to_string(),
            "--max-depth",
            &ctx.plan.max_depth.to_string(),
        ]);
    }
    let steady_trace = ctx.scratch.join("steady.jsonl");
    if let Some(t) = &ctx.trace {
        b.arg("--trace").arg(t);
    } else if ctx.plan.steady {
        let _ = std::fs::remove_file(&steady_trace);
        b.arg("--trace").arg(&steady_trace);
    }
    if let Some(n) = ctx.plan.tcp_buffer {
        b.args([
            "--tcp-sndbuf",
            &n.to_string(),
            "--tcp-rcvbuf",
            &n.to_string(),
        ]);
    }
    if p.iscsi == IscsiMode::Paper {
        b.args(["--initial-r2t", "yes", "--immediate-data", "no"]);
    }
    if p.scheme.is_seal() {
        b.args(["--seal", &p.cipher, "--secret-file"]);
        b.arg(&secret);
        b.args(["--pipeline", if p.pipeline { "on" } else { "off" }]);
    }
    let watched: Vec<(String, u32)> = procs.0.iter().map(|(n, c)| (n.clone(), c.id())).collect();
    let before: Vec<f64> = watched.iter().map(|(_, pid)| proc_cpu_s(*pid)).collect();
    let self_before = proc_cpu_s(std::process::id());
    let counters = LinkCounters::start(ctx);
    let t = Instant::now();
    let out = run_bounded(b, run_time + Duration::from_secs(60))
        .map_err(|e| fail(format!("bench: {e}")))?;
    let wall = t.elapsed().as_secs_f64();
    rec.cpu_tunnel_ini_pct = 0.0;
    rec.cpu_tunnel_tgt_pct = 0.0;
    for (i, (name, pid)) in watched.iter().enumerate() {
        let pct = (proc_cpu_s(*pid) - before[i]) / wall * 100.0;
        if i == 0 {
            rec.cpu_target_pct = pct;
        } else {
            rec.cpu_tunnel_pct += pct;
            if name.ends_with("@ini") {
                rec.cpu_tunnel_ini_pct += pct;
            } else {
                rec.cpu_tunnel_tgt_pct += pct;
            }
        }
    }
    rec.cpu_emulator_pct = (proc_cpu_s(std::process::id()) - self_before) / wall * 100.0;
    counters.finish(ctx, rec);
    // Real IPsec: the initiator's CHILD_SA counters (the SA is fresh for each run).
    if let Some((_, pid)) = watched.iter().find(|(n, _)| n == "charon@ini") {
        rec.esp_packets = crate::ipsec::sa_packets(*pid)
            .map_err(|e| fail(format!("reading the SA's counters: {e}")))?;
    }
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
    let text = std::fs::read_to_string(&json).map_err(|e| fail(format!("bench JSON: {e}")))?;
    let v: serde_json::Value =
        serde_json::from_str(&text).map_err(|e| fail(format!("bench JSON: {e}")))?;
    let r = &v["result"];
    let f = |path: &[&str]| -> f64 {
        let mut x = r;
        for k in path {
            x = &x[*k];
        }
        x.as_f64().unwrap_or(f64::NAN)
    };
    rec.throughput_mb_s = f(&["throughput_mb_s"]);
    rec.throughput_total_mb_s = rec.throughput_mb_s;
    if ctx.plan.steady && ctx.trace.is_none() {
        // No command in the second half leaves the whole run's rate, in both fields.
        match second_half_throughput(&steady_trace, p.block) {
            Ok(v) => rec.throughput_mb_s = v,
            Err(e) => tracing::info!("second-half throughput: {e}; keeping the whole run's"),
        }
    }
    rec.tcp = v["tcp"]["info_end"].as_object().map(|o| o.clone().into());
    rec.iops = f(&["iops"]);
    rec.lat_p50_us = f(&["latency_us", "p50"]);
    rec.lat_p90_us = f(&["latency_us", "p90"]);
    rec.lat_p99_us = f(&["latency_us", "p99"]);
    rec.lat_max_us = f(&["latency_us", "max"]);
    rec.cpu_initiator_pct = f(&["cpu", "percent_of_one_core"]);
    rec.bytes = r["bytes"].as_u64().unwrap_or(0);
    if let Some(a) = v.get("depth_auto").filter(|a| !a.is_null()) {
        rec.depth_start = depth;
        rec.depth_used = a["chosen"]
            .as_u64()
            .and_then(|d| u32::try_from(d).ok())
            .unwrap_or(depth);
        rec.depth_trajectory = a["trajectory"]
            .as_array()
            .map(|t| {
                t.iter()
                    .map(|s| {
                        format!(
                            "{}:{:.1}",
                            s["depth"].as_u64().unwrap_or(0),
                            s["throughput_mb_s"].as_f64().unwrap_or(f64::NAN)
                        )
                    })
                    .collect::<Vec<_>>()
                    .join(" ")
            })
            .unwrap_or_default();
    }
    let depth = rec.depth_used;
    let n = &v["negotiated"];
    rec.initial_r2t = n["initial_r2t"].as_bool();
    rec.immediate_data = n["immediate_data"].as_bool();
    rec.first_burst = n["first_burst_length"].as_u64();
    // Model prediction with the negotiated parameters.
    if let Ok(pred) = model::predict(&inputs, &model_pipeline(p, depth, rec.first_burst, cpus)) {
        rec.model_mb_s = pred.throughput / 1e6;
        rec.model_limit = pred.limit.to_string();
        rec.model_err_pct = (rec.throughput_mb_s / rec.model_mb_s - 1.0) * 100.0;
    }
    let _ = ctx.ns(Side::Ini);
    Ok(())
}

/// Real IPsec: strongSwan's charon in each namespace (IKEv2 + PSK, userspace ESP in UDP,
/// tunnel mode with host-to-host selectors; see [`crate::ipsec`]). Returns the target's
/// address on the link: the iSCSI session goes to it as for `plain`, and charon's route
/// through its TUN device carries it inside ESP.
fn ipsec(ctx: &RunCtx<'_>, p: &Point, procs: &mut Procs) -> Result<SocketAddr, RunError> {
    let Some(link) = ctx.link else {
        return Err(RunError::Skip("ipsec needs namespaces (root)".into()));
    };
    let esp = crate::ipsec::esp_proposal(&p.cipher).map_err(RunError::Skip)?;
    // A fresh random PSK per run, only in the scratch files (never logged).
    let mut key = [0u8; 24];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
        .map_err(|e| fail(format!("reading /dev/urandom: {e}")))?;
    let psk: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut sides = Vec::new();
    for side in [Side::Ini, Side::Tgt] {
        let peer = if side == Side::Ini {
            Side::Tgt
        } else {
            Side::Ini
        };
        // Absolute: charon resolves STRONGSWAN_CONF after changing to "/" (a relative
        // `--out` made every CHILD_SA fail: charon ran without the plan's plugins).
        let dir = std::path::absolute(ctx.scratch.join(format!("ipsec-{}", side_name(side))))
            .map_err(|e| fail(format!("scratch path: {e}")))?;
        let _ = std::fs::remove_file(dir.join("charon.log"));
        let s =
            crate::ipsec::Side::write(&dir, link.link.addr(side), link.link.addr(peer), esp, &psk)
                .map_err(|e| fail(format!("strongSwan config: {e}")))?;
        let ns = link.link.netns(side);
        for rule in crate::ipsec::bypass_rules() {
            // Rules persist in the namespace across runs; a second add says "File exists".
            let mut c = Command::new("ip");
            c.args(["-n", &ns]).args(&rule);
            match run_quiet(&mut c) {
                Ok(_) => {}
                Err(e) if e.contains("File exists") => {}
                Err(e) => return Err(fail(format!("ip rule for IKE: {e}"))),
            }
        }
        let argv = s.charon_argv();
        let mut c = link.link.command(side, &argv[0]);
        c.args(&argv[1..]);
        crate::guard::guard_child(&mut c);
        c.stdout(Stdio::null()).stderr(Stdio::null());
        let child = c.spawn().map_err(|e| fail(format!("charon: {e}")))?;
        let pid = child.id();
        procs.0.push((format!("charon@{}", side_name(side)), child));
        // charon is up when swanctl can load the connection (seconds on a loaded host).
        let t = Instant::now();
        loop {
            let load = s.load_args();
            let args: Vec<&str> = load.iter().map(String::as_str).collect();
            match run_bounded(s.swanctl(pid, &args), Duration::from_secs(10)) {
                Ok(o) if o.status.success() => break,
                Ok(o) if t.elapsed() > Duration::from_secs(20) => {
                    return Err(fail(format!(
                        "swanctl --load-all in {ns}: {}",
                        String::from_utf8_lossy(&o.stderr).trim()
                    )))
                }
                Err(e) if t.elapsed() > Duration::from_secs(20) => {
                    return Err(fail(format!("swanctl --load-all in {ns}: {e}")))
                }
                _ => std::thread::sleep(Duration::from_millis(100)),
            }
        }
        sides.push((s, pid));
    }
    let (ini, ini_pid) = &sides[0];
    let mut tries = Vec::new();
    let o = run_bounded(
        ini.swanctl(
            *ini_pid,
            &["--initiate", "--child", "lab", "--timeout", "20"],
        ),
        Duration::from_secs(30),
    )
    .map_err(|e| fail(format!("swanctl --initiate: {e}")))?;
    if !o.status.success() {
        let out = String::from_utf8_lossy(&o.stdout);
        let err = String::from_utf8_lossy(&o.stderr);
        tries.push(format!(
            "{} {}",
            out.lines().last().unwrap_or("").trim(),
            err.lines().last().unwrap_or("").trim()
        ));
    }
    if !tries.is_empty() {
        let tail = |s: &crate::ipsec::Side| {
            let log = std::fs::read_to_string(s.dir.join("charon.log")).unwrap_or_default();
            let last: Vec<&str> = log.lines().rev().take(4).collect();
            last.join(" | ")
        };
        return Err(fail(format!(
            "IKE did not establish the CHILD_SA ({}); initiator's charon: {}; responder's: {}",
            tries.join("; "),
            tail(ini),
            tail(&sides[1].0)
        )));
    }
    // ESP-in-UDP arrives on charon's 4500 socket: 208 KiB of receive buffer overflows under
    // load (UdpRcvbufErrors), so raise it as upstream wireguard-go does.
    for (_, pid) in &sides {
        crate::sockbuf::force_udp_buffers(*pid, 4500, crate::sockbuf::WIREGUARD_SOCKET_BUFFER)
            .map_err(|e| fail(format!("raising charon's UDP buffers: {e}")))?;
    }
    // The inner TCP's packets wait for charon in `ipsec0`'s ring, 500 packets by default
    // (txqueuelen), and the TUN driver drops what does not fit: a 1 MiB write is ~750
    // packets in one burst, so at 64 ms 2–9 % of them were dropped there (ipsec0's TX
    // dropped counter) and Reno halved its window after every command. Kernel ESP, the
    // papers' baseline, seals inside the sender's transmit path and has no such queue.
    for side in [Side::Ini, Side::Tgt] {
        let ns = link.link.netns(side);
        run_quiet(Command::new("ip").args([
            "-n",
            &ns,
            "link",
            "set",
            "dev",
            crate::ipsec::TUN_DEVICE,
            "txqueuelen",
            &crate::ipsec::TUN_QUEUE.to_string(),
        ]))
        .map_err(|e| fail(format!("ipsec0's queue in {ns}: {e}")))?;
    }
    let addr = SocketAddr::from((link.tgt(), PORT));
    wait_connect(link, addr).map_err(|e| fail(format!("no TCP through the IPsec tunnel: {e}")))?;
    Ok(addr)
}

/// What the link and the kernels counted during one run: read before it starts
/// ([`LinkCounters::start`], which also zeroes the emulator's statistics) and turned into the
/// record's WAN, TUN, ESP and kernel TCP fields after it ([`LinkCounters::finish`]). Every
/// scheme, iperf3 included, is accounted the same way.
struct LinkCounters {
    kernel: Option<BTreeMap<String, i64>>,
    tun: Option<u64>,
    esp: Option<u64>,
}

impl LinkCounters {
    fn start(ctx: &RunCtx<'_>) -> Self {
        if let Some(l) = ctx.link {
            l.link.reset_stats();
        }
        Self {
            kernel: ctx.link.map(kernel_tcp_counters),
            tun: ctx.link.map(tun_drops),
            esp: ctx
                .link
                .and_then(|l| l.esp.as_ref())
                .map(|c| c.packets.load(std::sync::atomic::Ordering::Relaxed)),
        }
    }

    fn finish(self, ctx: &RunCtx<'_>, rec: &mut Record) {
        let Some(l) = ctx.link else { return };
        if let Some(before) = &self.kernel {
            rec.kernel_tcp = counter_delta(before, &kernel_tcp_counters(l));
        }
        if let Some(before) = self.tun {
            rec.tun_dropped = tun_drops(l).saturating_sub(before);
        }
        let s = l.link.stats();
        rec.wan_dropped = s.up.dropped_loss
            + s.down.dropped_loss
            + s.up.dropped_queue
            + s.down.dropped_queue
            + s.up.dropped_other
            + s.down.dropped_other;
        rec.wan_reordered = s.up.reordered + s.down.reordered;
        rec.wan_corrupted = s.up.corrupted + s.down.corrupted;
        rec.wan_packets = s.up.packets_in + s.down.packets_in;
        if let (Some(c), Some(b0)) = (&l.esp, self.esp) {
            rec.esp_packets = c
                .packets
                .load(std::sync::atomic::Ordering::Relaxed)
                .saturating_sub(b0);
        }
    }
}

/// The kernel's TCP counters in both namespaces (`Tcp:` of /proc/net/snmp, `TcpExt:` of
/// /proc/net/netstat), keyed `ini:Name` / `tgt:Name`. Read on a thread inside each namespace.
fn kernel_tcp_counters(link: &LabLink) -> BTreeMap<String, i64> {
    let mut out = BTreeMap::new();
    for side in [Side::Ini, Side::Tgt] {
        let texts = link
            .link
            .run_in(side, || {
                ["snmp", "netstat"]
                    .map(|f| std::fs::read_to_string(format!("/proc/thread-self/net/{f}")))
            })
            .unwrap_or_else(|_| [Ok(String::new()), Ok(String::new())]);
        for text in texts.into_iter().flatten() {
            for (k, v) in parse_proc_counters(&text, &["Tcp", "TcpExt"]) {
                out.insert(format!("{}:{k}", side_name(side)), v);
            }
        }
    }
    out
}

/// The `NAME: field field …` / `NAME: value value …` line pairs of /proc/net/snmp and
/// /proc/net/netstat, for the given table names.
fn parse_proc_counters(text: &str, tables: &[&str]) -> Vec<(String, i64)> {
    let mut out = Vec::new();
    let lines: Vec<&str> = text.lines().collect();
    for pair in lines.chunks(2) {
        let [head, vals] = pair else { continue };
        let (Some((t1, names)), Some((t2, values))) = (head.split_once(':'), vals.split_once(':'))
        else {
            continue;
        };
        if t1 != t2 || !tables.contains(&t1) {
            continue;
        }
        for (n, v) in names.split_whitespace().zip(values.split_whitespace()) {
            if let Ok(v) = v.parse::<i64>() {
                out.push((n.to_string(), v));
            }
        }
    }
    out
}

/// The counters that changed between two readings (gauges such as CurrEstab included).
fn counter_delta(
    before: &BTreeMap<String, i64>,
    after: &BTreeMap<String, i64>,
) -> BTreeMap<String, i64> {
    after
        .iter()
        .filter_map(|(k, v)| {
            let d = v - before.get(k).copied().unwrap_or(0);
            (d != 0).then(|| (k.clone(), d))
        })
        .collect()
}

/// Packets the kernel dropped at both TUN devices (rx and tx), 0 when unreadable.
fn tun_drops(link: &LabLink) -> u64 {
    link.link.device_stats().map_or(0, |d| {
        d.ini.rx_dropped + d.ini.tx_dropped + d.tgt.rx_dropped + d.tgt.tx_dropped
    })
}

/// Throughput over the second half of a traced run: the window runs from half the time of
/// the last issued command to that time, and each completed command's block is spread
/// evenly over its own life (issued → completed), counting the part inside the window.
/// Past slow start and the depth search, which a short whole-run average mixes in; and no
/// edge effect: at 64 ms eight 1 MiB commands complete together every 256 ms, so counting
/// completions in a 1.7 s window moved by ±1 burst (±15 %) with where the edges fell.
fn second_half_throughput(trace: &Path, block: u64) -> Result<f64, String> {
    let text = std::fs::read_to_string(trace).map_err(|e| format!("{}: {e}", trace.display()))?;
    let mut issued: BTreeMap<u64, f64> = BTreeMap::new();
    let mut lives: Vec<(f64, f64)> = Vec::new();
    for line in text.lines().skip(1) {
        let Ok(v) = serde_json::from_str::<serde_json::Value>(line) else {
            continue;
        };
        let (Some(cmd), Some(t)) = (v["cmd"].as_u64(), v["t_us"].as_f64()) else {
            continue;
        };
        let t = t / 1e6;
        if v["event"] == "issued" {
            issued.insert(cmd, t);
        } else if v["event"] == "completed" {
            if let Some(t0) = issued.get(&cmd) {
                lives.push((*t0, t));
            }
        }
    }
    let stop = issued.values().copied().fold(0.0f64, f64::max);
    spread_throughput(&lives, block, stop / 2.0, stop)
}

/// Bytes per second inside `[from, to]` when each command's `block` bytes are spread evenly
/// over its life `(issued, completed)`.
fn spread_throughput(lives: &[(f64, f64)], block: u64, from: f64, to: f64) -> Result<f64, String> {
    if to <= from {
        return Err("no second half: nothing issued".into());
    }
    let mut bytes = 0.0;
    let mut n = 0usize;
    for &(t0, t1) in lives {
        let overlap = t1.min(to) - t0.max(from);
        if t1 > t0 && overlap > 0.0 {
            bytes += block as f64 * overlap / (t1 - t0);
            n += 1;
        }
    }
    if n == 0 {
        return Err("no completed command overlaps the second half".into());
    }
    Ok(bytes / (to - from) / 1e6)
}

/// Aiken et al.'s network baseline: one iperf3 TCP stream from the initiator's namespace to
/// the target's through the same emulated link, for the run's duration, with the first half
/// omitted (`-O`: slow start and the buffers' autotuning ramp), and the plan's `tcp_buffer`,
/// if it has one, as iperf3's socket buffers (`-w`, as the iSCSI connections get it; Aiken et
/// al. set 500,000 bytes on both hosts). The link's, TUN's and kernels' counters are recorded
/// as for every other scheme. Without a rate the emulator's forwarding thread is the
/// bottleneck, and an autotuned stream overfills the TUN ring in front of it (3–18 k drops in
/// a 3 s run here; single runs moved 0.04–366 MB/s): the Aiken plan has Aiken's 100 Mbit/s.
fn iperf3(ctx: &RunCtx<'_>, run_time: Duration, rec: &mut Record) -> Result<(), RunError> {
    let Some(link) = ctx.link else {
        return Err(RunError::Skip("iperf3 needs namespaces (root)".into()));
    };
    let port = "5201";
    let mut s = link.link.command(Side::Tgt, "iperf3");
    s.args([
        "-s",
        "-1",
        "--forceflush",
        "-p",
        port,
        "-B",
        &link.tgt().to_string(),
    ]);
    let (server, lines) = spawn_watch(s).map_err(|e| fail(format!("iperf3 -s: {e}")))?;
    let _server = Procs(vec![("iperf3@tgt".into(), server)], Vec::new());
    wait_line(&lines, "listening", Duration::from_secs(10))
        .map_err(|e| fail(format!("iperf3 server: {e}")))?;
    let secs = run_time.as_secs_f64().ceil().max(2.0) as u64;
    let omit = secs / 2;
    let mut c = link.link.command(Side::Ini, "iperf3");
    c.args([
        "-c",
        &link.tgt().to_string(),
        "-p",
        port,
        "-O",
        &omit.to_string(),
        "-t",
        &(secs - omit).to_string(),
        "-J",
    ]);
    if let Some(n) = ctx.plan.tcp_buffer {
        // iperf3 sets plain SO_SNDBUF/SO_RCVBUF, which the kernel caps at the host-wide
        // net.core.{r,w}mem_max, and then exits because the buffer is not what it asked for.
        let cap = link.socket_buffer_cap();
        if n > cap {
            return Err(fail(format!(
                "tcp_buffer {n} B is above net.core.rmem_max/wmem_max ({cap} B): iperf3 -w \
                 cannot get it (the iSCSI connections force theirs past the cap)"
            )));
        }
        c.args(["-w", &n.to_string()]);
    }
    let self_before = proc_cpu_s(std::process::id());
    let counters = LinkCounters::start(ctx);
    let t = Instant::now();
    let out = run_bounded(c, run_time + Duration::from_secs(30))
        .map_err(|e| fail(format!("iperf3 -c: {e}")))?;
    let wall = t.elapsed().as_secs_f64();
    rec.cpu_emulator_pct = (proc_cpu_s(std::process::id()) - self_before) / wall * 100.0;
    counters.finish(ctx, rec);
    let v: serde_json::Value =
        serde_json::from_slice(&out.stdout).map_err(|e| fail(format!("iperf3 JSON: {e}")))?;
    if let Some(e) = v["error"].as_str() {
        return Err(fail(format!("iperf3: {e}")));
    }
    let bps = v["end"]["sum_received"]["bits_per_second"]
        .as_f64()
        .ok_or_else(|| fail("iperf3 JSON has no end.sum_received"))?;
    rec.throughput_mb_s = bps / 8e6;
    rec.bytes = v["end"]["sum_received"]["bytes"].as_u64().unwrap_or(0);
    rec.depth_used = 1;
    Ok(())
}

fn side_name(side: Side) -> &'static str {
    match side {
        Side::Ini => "ini",
        Side::Tgt => "tgt",
    }
}

/// wireguard-go in both namespaces, peers over the emulated link; returns the target's
/// address inside the tunnel.
fn wireguard(ctx: &RunCtx<'_>, procs: &mut Procs) -> Result<SocketAddr, RunError> {
    let Some(link) = ctx.link else {
        return Err(RunError::Skip("wireguard needs namespaces (root)".into()));
    };
    let tun = ctx.subnet().wrapping_add(1);
    let wg_ip = |side: Side| Ipv4Addr::new(10, 231, tun, if side == Side::Ini { 1 } else { 2 });
    let mut keys = Vec::new();
    for side in [Side::Ini, Side::Tgt] {
        let key = run_quiet(Command::new("wg").arg("genkey"))
            .map_err(|e| fail(format!("wg genkey: {e}")))?;
        let path = ctx.scratch.join(format!("wg-{side:?}.key"));
        std::fs::write(&path, &key).map_err(|e| fail(format!("writing a wg key: {e}")))?;
        let mut pc = Command::new("wg");
        pc.arg("pubkey")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped());
        let mut child = pc.spawn().map_err(|e| fail(format!("wg pubkey: {e}")))?;
        if let Some(mut si) = child.stdin.take() {
            use std::io::Write;
            let _ = si.write_all(key.as_bytes());
        }
        let o = child
            .wait_with_output()
            .map_err(|e| fail(format!("wg pubkey: {e}")))?;
        keys.push((path, String::from_utf8_lossy(&o.stdout).trim().to_string()));
    }
    for (i, side) in [Side::Ini, Side::Tgt].into_iter().enumerate() {
        // wireguard-go's control socket lives in the host-wide /var/run/wireguard/<if>.sock,
        // not per namespace: each side (and each lab on the host) needs its own name.
        // Named from the lab's pid (at most 10 of IFNAMSIZ's 15 characters).
        let ifname = format!(
            "wl{}{}",
            std::process::id(),
            if side == Side::Ini { 'i' } else { 't' }
        );
        let sock = PathBuf::from(format!("/var/run/wireguard/{ifname}.sock"));
        let _ = std::fs::remove_file(&sock);
        crate::guard::register_file(sock.clone());
        procs.1.push(sock);
        let mut c = link.link.command(side, "wireguard-go");
        crate::guard::guard_child(&mut c);
        c.args(["-f", &ifname])
            .env("WG_I_PREFER_BUGGY_USERSPACE_TO_POLISHED_KMOD", "1")
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = c.spawn().map_err(|e| fail(format!("wireguard-go: {e}")))?;
        let wg_pid = child.id();
        procs
            .0
            .push((format!("wireguard-go@{}", side_name(side)), child));
        let ns = link.link.netns(side);
        let t = Instant::now();
        while run_quiet(Command::new("ip").args(["-n", &ns, "link", "show", &ifname])).is_err() {
            // wireguard-go's start-up takes seconds on a loaded 2-core host.
            if t.elapsed() > Duration::from_secs(20) {
                return Err(fail(format!(
                    "wireguard-go did not create {ifname} within 20 s"
                )));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let peer = if side == Side::Ini {
            Side::Tgt
        } else {
            Side::Ini
        };
        let (key_path, _) = &keys[i];
        let (_, peer_pub) = &keys[1 - i];
        let endpoint = format!("{}:{WG_PORT}", link.link.addr(peer));
        let mut set = link.link.command(side, "wg");
        set.args([
            "set",
            &ifname,
            "listen-port",
            &WG_PORT.to_string(),
            "private-key",
        ])
        .arg(key_path)
        .args([
            "peer",
            peer_pub,
            "allowed-ips",
            &format!("{}/32", wg_ip(peer)),
            "endpoint",
            &endpoint,
        ]);
        run_quiet(&mut set).map_err(|e| fail(format!("wg set: {e}")))?;
        // Debian's wireguard-go keeps 208 KiB UDP buffers and drops the tunnel's packets
        // there (see crate::sockbuf); give it upstream's 7 MiB.
        crate::sockbuf::force_udp_buffers(wg_pid, WG_PORT, crate::sockbuf::WIREGUARD_SOCKET_BUFFER)
            .map_err(|e| fail(format!("raising wireguard-go's UDP buffers: {e}")))?;
        run_quiet(Command::new("ip").args([
            "-n",
            &ns,
            "addr",
            "add",
            &format!("{}/24", wg_ip(side)),
            "dev",
            &ifname,
        ]))
        .map_err(|e| fail(format!("wg address: {e}")))?;
        run_quiet(
            Command::new("ip").args(["-n", &ns, "link", "set", &ifname, "mtu", "1420", "up"]),
        )
        .map_err(|e| fail(format!("wg up: {e}")))?;
    }
    let addr = SocketAddr::from((wg_ip(Side::Tgt), PORT));
    wait_connect(link, addr)
        .map_err(|e| fail(format!("no TCP through the WireGuard tunnel: {e}")))?;
    Ok(addr)
}

/// stunnel (TLS 1.3) in both namespaces: the initiator talks to its local stunnel, which
/// carries the session over TLS to the target side's stunnel.
fn tls(ctx: &RunCtx<'_>, p: &Point, procs: &mut Procs) -> Result<SocketAddr, RunError> {
    let Some(link) = ctx.link else {
        return Err(RunError::Skip("tls needs namespaces (root)".into()));
    };
    let (_, suite) = tls_cipher(&p.cipher);
    let key = ctx.scratch.join("tls.key");
    let cert = ctx.scratch.join("tls.crt");
    if !cert.exists() {
        run_quiet(
            Command::new("openssl")
                .args([
                    "req",
                    "-x509",
                    "-newkey",
                    "ec",
                    "-pkeyopt",
                    "ec_paramgen_curve:prime256v1",
                    "-nodes",
                    "-days",
                    "2",
                    "-subj",
                    "/CN=ipsan-lab",
                    "-keyout",
                ])
                .arg(&key)
                .arg("-out")
                .arg(&cert),
        )
        .map_err(|e| fail(format!("openssl req: {e}")))?;
    }
    let tgt = link.tgt();
    let server = format!(
        "foreground = yes\npid =\nsyslog = no\n[iscsi]\naccept = {tgt}:{TLS_PORT}\nconnect = 127.0.0.1:{PORT}\ncert = {}\nkey = {}\nsslVersion = TLSv1.3\nciphersuites = {suite}\n",
        cert.display(),
        key.display()
    );
    let client = format!(
        "foreground = yes\npid =\nsyslog = no\n[iscsi]\nclient = yes\naccept = 127.0.0.1:{PORT}\nconnect = {tgt}:{TLS_PORT}\nsslVersion = TLSv1.3\nciphersuites = {suite}\n"
    );
    for (side, conf, name) in [
        (Side::Tgt, server, "stunnel-tgt.conf"),
        (Side::Ini, client, "stunnel-ini.conf"),
    ] {
        let path = ctx.scratch.join(name);
        std::fs::write(&path, conf).map_err(|e| fail(format!("stunnel config: {e}")))?;
        let mut c = link.link.command(side, "stunnel");
        crate::guard::guard_child(&mut c);
        c.arg(&path).stdout(Stdio::null()).stderr(Stdio::null());
        let child = c.spawn().map_err(|e| fail(format!("stunnel: {e}")))?;
        procs
            .0
            .push((format!("stunnel@{}", side_name(side)), child));
    }
    // The target-side stunnel first: the client side accepts at once and only then connects
    // upstream, so a bench arriving before the server listens got "connection reset" (seen
    // once in the quick plan at 0 ms).
    wait_connect(link, SocketAddr::from((tgt, TLS_PORT)))
        .map_err(|e| fail(format!("the target-side stunnel did not listen: {e}")))?;
    let local = SocketAddr::from((Ipv4Addr::LOCALHOST, PORT));
    // The initiator-side stunnel listens in the initiator's namespace.
    let t = Instant::now();
    loop {
        let ok = link
            .link
            .run_in(Side::Ini, move || {
                TcpStream::connect_timeout(&local, Duration::from_millis(300)).is_ok()
            })
            .unwrap_or(false);
        if ok {
            break;
        }
        if t.elapsed() > Duration::from_secs(5) {
            return Err(fail("stunnel did not listen within 5 s"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(local)
}

fn wait_connect(link: &LabLink, addr: SocketAddr) -> Result<(), String> {
    let t = Instant::now();
    loop {
        let r = link
            .link
            .run_in(Side::Ini, move || {
                TcpStream::connect_timeout(&addr, Duration::from_secs(1)).map(|_| ())
            })
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()));
        match r {
            Ok(()) => return Ok(()),
            Err(e) if t.elapsed() > Duration::from_secs(8) => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(100)),
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

fn run_quiet(c: &mut Command) -> Result<String, String> {
    let o = c.output().map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(String::from_utf8_lossy(&o.stdout).into_owned())
    } else {
        Err(format!(
            "{}: {}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

fn spawn_watch(mut c: Command) -> std::io::Result<(Child, mpsc::Receiver<String>)> {
    crate::guard::guard_child(&mut c);
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = c.spawn()?;
    let (tx, rx) = mpsc::channel();
    if let Some(out) = child.stdout.take() {
        let tx = tx.clone();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    if let Some(err) = child.stderr.take() {
        std::thread::spawn(move || {
            for l in BufReader::new(err).lines().map_while(Result::ok) {
                let _ = tx.send(l);
            }
        });
    }
    Ok((child, rx))
}

fn wait_line(rx: &mpsc::Receiver<String>, needle: &str, limit: Duration) -> Result<(), String> {
    let t = Instant::now();
    let mut last = String::new();
    while t.elapsed() < limit {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) if l.contains(needle) => return Ok(()),
            Ok(l) => last = l,
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Err(format!("exited; last output: {last}"))
            }
        }
    }
    Err(format!(
        "no {needle:?} within {limit:?}; last output: {last}"
    ))
}

/// Runs `c` to completion, killing it after `limit`.
fn run_bounded(mut c: Command, limit: Duration) -> Result<std::process::Output, String> {
    crate::guard::guard_child(&mut c);
    c.stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .stdin(Stdio::null());
    let mut child = c.spawn().map_err(|e| e.to_string())?;
    let t = Instant::now();
    loop {
        match child.try_wait() {
            Ok(Some(_)) => return child.wait_with_output().map_err(|e| e.to_string()),
            Ok(None) if t.elapsed() > limit => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("killed after {limit:?}"));
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            Err(e) => return Err(e.to_string()),
        }
    }
}

/// User + system CPU seconds of a process (all its threads), from /proc/PID/stat.
pub fn proc_cpu_s(pid: u32) -> f64 {
    let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return f64::NAN;
    };
    // The command name may hold spaces; fields resume after the last ')'.
    let Some(rest) = s.rsplit_once(')').map(|(_, r)| r) else {
        return f64::NAN;
    };
    let f: Vec<&str> = rest.split_whitespace().collect();
    // After ')': state is field 3, utime field 14, stime field 15 → indices 11 and 12.
    let ticks = |i: usize| {
        f.get(i)
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(f64::NAN)
    };
    (ticks(11) + ticks(12)) / clk_tck()
}

fn clk_tck() -> f64 {
    static TCK: std::sync::OnceLock<f64> = std::sync::OnceLock::new();
    *TCK.get_or_init(|| {
        Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .unwrap_or(100.0)
    })
}

/// Whether `exe <sub> --help` mentions `flag`.
pub fn help_mentions(exe: &Path, sub: &str, flag: &str) -> bool {
    Command::new(exe)
        .args([sub, "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
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
