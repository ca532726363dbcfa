//! The storage-friendly TCP experiments of issue 7 (after the iFCP paper (Muknahallipatna et al.)), run through ipsan's WAN
//! emulator (`ipsan-wan`: two namespaces joined by the TUN forwarder; this kernel has no netem
//! and no fq, so there is no in-kernel delay).
//!
//! ```text
//! cargo run --release -p ipsan-tcp --example tcp_experiments -- [window|loss|fig10|fairness|iscsi|all] [--quick] [--seed N] [--reps N] [--out DIR]
//! ```
//! - `window`: 1 Gbit/s, receive window pinned to 8 MiB (`TCP_WINDOW_CLAMP`), RTT 80..200 ms;
//!   throughput should follow window/RTT (the iFCP paper (Muknahallipatna et al.) Table 1).
//! - `loss`: 25 ms RTT (12.5 ms each way), 900 Mbit/s offered (90 % of 1 Gbit/s, paced with
//!   `SO_MAX_PACING_RATE`), Bernoulli loss 0..1/1000 on the data direction, for reno, ipsan_sf,
//!   ipsan_ss, ipsan_sf_ss, cubic and bbr (the iFCP paper (Muknahallipatna et al.) Fig. 10).
//! - `fig10`: the paper's four series at its point (the `loss` path at 1/1000): reno, ipsan_sf
//!   (1/8 cut), ipsan_ss (congestion avoidance disabled alone), ipsan_sf_ss (both), alternated:
//!   repetition r runs them in the order rotated by r, `--reps` times (5; 2 with `--quick`),
//!   each with a fresh link. Every line also carries this process's CPU time over the run
//!   (the emulator's forwarder, the sender and the sink all run in it).
//! - `iscsi`: the loss sweep again with an iSCSI write stream through ipsan (`ipsan target`
//!   with a null LUN in the target namespace, `ipsan bench --rw write` in the initiator's).
//!   Neither selects an algorithm per socket yet, so the initiator namespace's default
//!   (`net.ipv4.tcp_congestion_control`, per namespace) is set to the one under test, which
//!   needs it in the host's `tcp_allowed_congestion_control` for the run (restored after); the
//!   binary is `$IPSAN_BIN` (default `target/release/ipsan`).
//! - `fairness`: two flows share the 1 Gbit/s bottleneck (25 ms RTT, BDP-sized queue):
//!   cubic+cubic, ipsan_sf+cubic, ipsan_ss+cubic, ipsan_sf_ss+cubic, reno+cubic; Jain's index.
//!
//! Each run writes one JSON line (settings in force, TCP_INFO, emulator counters) to
//! `DIR/<experiment>.jsonl`; `scripts/tcp-experiments plot` draws them. Needs root; the
//! storage-friendly algorithms are loaded with `ipsan_tcp::bpf::load` first (a run whose
//! algorithm fell back to reno says so in `in_force`).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipsan_tcp::bulk::{self, BulkResult, SendOptions};
use ipsan_tcp::{BufSize, TcpSettings};
use ipsan_wan::link::{Link, Side};
use ipsan_wan::{DirConfig, Engine, LinkConfig, LossModel, QueueLimit};

const PORT: u16 = 5201;
const LINK_BPS: u64 = 1_000_000_000;
/// The pinned receive window: 8 MiB - 128 B. On this kernel TCP_WINDOW_CLAMP chooses the
/// window scale but did not stop the advertised window growing to 65535 << wscale (with an
/// 8 MiB clamp, wscale 8, the window reached 16 MiB). 8 MiB - 128 B gives wscale 7, whose
/// largest window is exactly this, so the window is pinned by the header field itself.
const WINDOW: u32 = 65535 << 7;

struct Opts {
    quick: bool,
    /// Repetitions of `fig10` (`--reps`).
    reps: Option<usize>,
    out: PathBuf,
}

/// Seed of the emulator's loss sequence (`--seed`): the same seed replays the same losses.
static SEED: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(7);

fn main() {
    let mut what = "all".to_string();
    let mut opts = Opts {
        quick: false,
        reps: None,
        out: PathBuf::from("docs/results/tcp"),
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--quick" => opts.quick = true,
            "--seed" => {
                let seed = args.next().and_then(|v| v.parse().ok()).expect("--seed N");
                SEED.store(seed, std::sync::atomic::Ordering::Relaxed);
            }
            "--out" => opts.out = PathBuf::from(args.next().expect("--out DIR")),
            "--reps" => {
                let reps = args.next().and_then(|v| v.parse().ok()).expect("--reps N");
                opts.reps = Some(reps);
            }
            w @ ("window" | "loss" | "fig10" | "fairness" | "iscsi" | "all") => {
                what = w.to_string()
            }
            other => {
                eprintln!("unknown argument {other}");
                std::process::exit(2);
            }
        }
    }
    if !ipsan_wan::link::is_root() {
        eprintln!("tcp_experiments: needs root (namespaces, TUN, BPF)");
        std::process::exit(1);
    }
    std::fs::create_dir_all(&opts.out).unwrap();
    match ipsan_tcp::bpf::load(Path::new(ipsan_tcp::bpf::DEFAULT_PIN_DIR)) {
        Ok(r) => eprintln!(
            "bpf: registered {:?}, already {:?}",
            r.registered, r.already
        ),
        Err(e) => eprintln!("bpf: {e}; ipsan_sf* runs will fall back to reno"),
    }
    if what == "window" || what == "all" {
        window(&opts);
    }
    if what == "loss" || what == "all" {
        loss(&opts);
    }
    if what == "fig10" || what == "all" {
        fig10(&opts);
    }
    if what == "fairness" || what == "all" {
        fairness(&opts);
    }
    if what == "iscsi" || what == "all" {
        iscsi(&opts);
    }
}

fn dir(one_way: Duration, loss: f64, queue: QueueLimit) -> DirConfig {
    DirConfig {
        delay: one_way,
        loss: if loss > 0.0 {
            LossModel::Bernoulli { p: loss }
        } else {
            LossModel::None
        },
        rate_bps: LINK_BPS,
        queue,
        ..DirConfig::default()
    }
}

/// A link with `one_way` delay each way, `loss` on the data (initiator → target) direction.
fn link(tag: &str, one_way: Duration, loss: f64, queue: QueueLimit) -> Link {
    let name = format!("tcpx{}-{tag}", std::process::id());
    let _ = ipsan_wan::link::cleanup(&name);
    let mut cfg = LinkConfig::new(name);
    cfg.subnet = 200;
    cfg.engine = Engine::Builtin;
    cfg.seed = SEED.load(std::sync::atomic::Ordering::Relaxed);
    cfg.up = dir(one_way, loss, queue);
    cfg.down = dir(one_way, 0.0, queue);
    let link = Link::up(cfg).expect("link up");
    // Room for autotuning too; no ssthresh remembered between runs.
    for side in [Side::Ini, Side::Tgt] {
        // The TUN device's ring (txqueuelen, 1000 by default) overflowed during slow-start
        // bursts whenever the busy host delayed the forwarder: drops on the sender's own
        // interface that no real 1 Gbit/s path would have. Hold a whole window instead.
        let out = link
            .exec_in(side, &["ip", "link", "set", "wan0", "txqueuelen", "20000"])
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let out = link
            .exec_in(
                side,
                &[
                    "sysctl",
                    "-qw",
                    "net.ipv4.tcp_rmem=4096 131072 67108864",
                    "net.ipv4.tcp_wmem=4096 65536 67108864",
                    "net.ipv4.tcp_no_metrics_save=1",
                ],
            )
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    link
}

/// The receiver: a 32 MiB buffer (forced past the root namespace's 4 MiB cap; over the TUN
/// emulator each 1500-byte packet is charged a 4 KiB page, so the buffer must be several times
/// the window) with the advertised window pinned at 8 MiB, like the paper's gateways.
/// Autotuning is not used: over TUN it did not grow the window past about 80 KB.
fn sink_settings() -> TcpSettings {
    TcpSettings {
        rcvbuf: BufSize::Bytes(32 << 20),
        window_clamp: Some(WINDOW),
        ..TcpSettings::default()
    }
}

/// Starts a sink in the target namespace for `count` connections.
fn start_sink(link: &Link, count: usize) -> std::thread::JoinHandle<()> {
    let addr = SocketAddr::from((link.addr(Side::Tgt), PORT));
    let ns = link.netns(Side::Tgt);
    let (listener, _) = ipsan_wan::netns::run_in(&ns, move || bulk::listen(addr, &sink_settings()))
        .unwrap()
        .unwrap();
    std::thread::spawn(move || {
        let _ = bulk::sink(&listener, &sink_settings(), Some(count));
    })
}

fn send(link: &Link, cc: &str, secs: f64, omit: f64, rate: Option<u64>) -> BulkResult {
    let addr = SocketAddr::from((link.addr(Side::Tgt), PORT));
    let opts = SendOptions {
        settings: TcpSettings {
            sndbuf: BufSize::Bytes(32 << 20),
            ..TcpSettings::with_congestion(cc)
        },
        duration: Duration::from_secs_f64(secs),
        omit: Duration::from_secs_f64(omit),
        rate_bps: rate,
        connect_timeout: Duration::from_secs(5),
    };
    ipsan_wan::netns::run_in(&link.netns(Side::Ini), move || bulk::send(addr, &opts))
        .unwrap()
        .unwrap()
}

/// Appends one result line, stamped with the host's load average: the emulator forwards in
/// user space, so a busy machine shows up as queueing and drops in the emulator counters.
fn append(out: &Path, file: &str, mut line: serde_json::Value) {
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    line["host"] = serde_json::json!({
        "loadavg": load.split_whitespace().take(3).collect::<Vec<_>>().join(" "),
        "cpus": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
    });
    line["seed"] = serde_json::json!(SEED.load(std::sync::atomic::Ordering::Relaxed));
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(out.join(file))
        .unwrap();
    writeln!(f, "{line}").unwrap();
}

fn fresh(out: &Path, file: &str) {
    let _ = std::fs::remove_file(out.join(file));
}

fn ms(d: f64) -> Duration {
    Duration::from_secs_f64(d / 1000.0)
}

fn window(o: &Opts) {
    fresh(&o.out, "window.jsonl");
    let rtts: &[u32] = if o.quick {
        &[100, 200]
    } else {
        &[80, 100, 120, 140, 160, 180, 200]
    };
    let (secs, omit) = if o.quick { (4.0, 4.0) } else { (8.0, 6.0) };
    for &rtt in rtts {
        // The sender's TUN interface has no rate of its own, so a whole window can leave at
        // memory speed; a queue larger than the window stands in for the paper's 1 Gbit/s NIC
        // that would have spread it out. Any drop here is the emulator's, not the window's.
        let l = link(
            &format!("w{rtt}"),
            ms(f64::from(rtt) / 2.0),
            0.0,
            QueueLimit::Bytes(16 << 20),
        );
        let sink = start_sink(&l, 1);
        let r = send(&l, "cubic", secs, omit, None);
        sink.join().unwrap();
        let theory = f64::from(WINDOW) / (f64::from(rtt) / 1000.0) / 1e6;
        eprintln!(
            "window: RTT {rtt} ms: {:.1} MB/s (window/RTT {theory:.1}), srtt {} us, retrans {}",
            r.mbyte_per_s, r.end.rtt_us, r.retrans_segments
        );
        let tun_drops = tun_tx_dropped(&l);
        append(
            &o.out,
            "window.jsonl",
            serde_json::json!({
                "experiment": "window", "rtt_ms": rtt, "window_bytes": WINDOW,
                "link": {"rate_bps": LINK_BPS, "engine": "ipsan-wan builtin"},
                "emulator": l.stats(), "tun_tx_dropped": tun_drops, "result": r,
            }),
        );
    }
}

/// Packets the TUN devices dropped before the emulator read them (both sides).
fn tun_tx_dropped(l: &Link) -> u64 {
    [Side::Ini, Side::Tgt]
        .iter()
        .filter_map(|&side| {
            let p = format!(
                "/sys/class/net/{}/statistics/tx_dropped",
                ipsan_wan::link::IFNAME
            );
            let out = l.exec_in(side, &["cat", &p]).ok()?;
            String::from_utf8_lossy(&out.stdout)
                .trim()
                .parse::<u64>()
                .ok()
        })
        .sum()
}

fn loss(o: &Opts) {
    fresh(&o.out, "loss.jsonl");
    let losses: &[f64] = if o.quick {
        &[0.0, 0.001]
    } else {
        &[0.0, 0.00001, 0.0001, 0.0005, 0.001]
    };
    let ccs = [
        "reno",
        "ipsan_sf",
        "ipsan_ss",
        "ipsan_sf_ss",
        "cubic",
        "bbr",
    ];
    let (secs, omit) = if o.quick { (4.0, 2.0) } else { (10.0, 3.0) };
    for &p in losses {
        for cc in ccs {
            // Paced at 900 Mbit/s into 1 Gbit/s with a deep queue: only the random loss drops.
            let l = link(
                &format!("l{}", cc.len()),
                ms(12.5),
                p,
                QueueLimit::Bytes(16 << 20),
            );
            let sink = start_sink(&l, 1);
            let r = send(&l, cc, secs, omit, Some(900_000_000));
            sink.join().unwrap();
            eprintln!(
                "loss {p}: {cc} ({}): {:.1} MB/s, retrans {}, cwnd {} ssthresh {:?}",
                r.in_force.congestion,
                r.mbyte_per_s,
                r.retrans_segments,
                r.end.cwnd,
                r.end.ssthresh
            );
            append(
                &o.out,
                "loss.jsonl",
                serde_json::json!({
                    "experiment": "loss", "loss": p, "rtt_ms": 25, "cc": cc, "offered_bps": 900_000_000u64,
                    "emulator": l.stats(), "tun_tx_dropped": tun_tx_dropped(&l), "result": r,
                }),
            );
        }
    }
}

/// The paper's Fig. 10 series, in its order: standard TCP, the 1/8 cut, congestion avoidance
/// disabled alone, both.
const FIG10: [&str; 4] = ["reno", "ipsan_sf", "ipsan_ss", "ipsan_sf_ss"];

/// This process's user + system CPU time, seconds (`/proc/self/stat` fields 14 and 15, in
/// USER_HZ = 100 ticks per second on Linux).
fn process_cpu_s() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // The command name (field 2) may hold spaces; count fields after its closing parenthesis.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
    ticks as f64 / 100.0
}

fn fig10(o: &Opts) {
    fresh(&o.out, "fig10.jsonl");
    let reps = o.reps.unwrap_or(if o.quick { 2 } else { 5 });
    let (secs, omit) = if o.quick { (4.0, 2.0) } else { (10.0, 3.0) };
    let p = 0.001;
    for rep in 0..reps {
        for k in 0..FIG10.len() {
            let cc = FIG10[(rep + k) % FIG10.len()];
            let cpu0 = process_cpu_s();
            let t0 = std::time::Instant::now();
            let l = link(&format!("x{k}"), ms(12.5), p, QueueLimit::Bytes(16 << 20));
            let sink = start_sink(&l, 1);
            let r = send(&l, cc, secs, omit, Some(900_000_000));
            sink.join().unwrap();
            let stats = l.stats();
            let tun_drops = tun_tx_dropped(&l);
            drop(l);
            let cpu_s = process_cpu_s() - cpu0;
            let wall_s = t0.elapsed().as_secs_f64();
            // CPU over the whole run (link up to down) per GB acknowledged over the whole
            // connection (warm-up included).
            let cpu_s_per_gb = cpu_s / (r.end.bytes_acked.max(1) as f64 / 1e9);
            eprintln!(
                "fig10 rep {rep} #{k}: {cc} ({}): {:.1} MB/s, retrans {}, rto {}, cpu {cpu_s:.1} s \
                 of {wall_s:.1} s ({cpu_s_per_gb:.1} CPU-s/GB)",
                r.in_force.congestion, r.mbyte_per_s, r.retrans_segments, r.end.total_rto
            );
            append(
                &o.out,
                "fig10.jsonl",
                serde_json::json!({
                    "experiment": "fig10", "loss": p, "rtt_ms": 25, "cc": cc,
                    "offered_bps": 900_000_000u64, "rep": rep, "position": k,
                    "process_cpu_s": cpu_s, "wall_s": wall_s, "cpu_s_per_gb": cpu_s_per_gb,
                    "emulator": stats, "tun_tx_dropped": tun_drops, "result": r,
                }),
            );
        }
    }
}

fn fairness(o: &Opts) {
    fresh(&o.out, "fairness.jsonl");
    let (secs, omit) = if o.quick { (6.0, 2.0) } else { (20.0, 5.0) };
    // BDP at 1 Gbit/s × 25 ms is about 3.1 MB: a BDP-sized bottleneck queue.
    for pair in [
        ["cubic", "cubic"],
        ["ipsan_sf", "cubic"],
        ["ipsan_ss", "cubic"],
        ["ipsan_sf_ss", "cubic"],
        ["reno", "cubic"],
    ] {
        let l = link("f", ms(12.5), 0.0, QueueLimit::Bytes(3_125_000));
        let sink = start_sink(&l, 2);
        let results: Vec<BulkResult> = std::thread::scope(|s| {
            let hs: Vec<_> = pair
                .iter()
                .map(|cc| s.spawn(|| send(&l, cc, secs, omit, None)))
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        sink.join().unwrap();
        let x: Vec<f64> = results.iter().map(|r| r.mbyte_per_s).collect();
        let jain = bulk::jain_index(&x);
        eprintln!(
            "fairness {} vs {}: {:.1} / {:.1} MB/s, Jain {:?}",
            pair[0], pair[1], x[0], x[1], jain
        );
        append(
            &o.out,
            "fairness.jsonl",
            serde_json::json!({
                "experiment": "fairness", "flows": pair, "rtt_ms": 25, "jain": jain,
                "emulator": l.stats(), "tun_tx_dropped": tun_tx_dropped(&l), "results": results,
            }),
        );
    }
}

/// Runs `f` until it returns true or `timeout` passes.
fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = std::time::Instant::now() + timeout;
    while std::time::Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    false
}

/// Kills a child process on drop, so a failed run never leaves a target behind.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Adds algorithms to `net.ipv4.tcp_allowed_congestion_control` (host-wide) and restores the
/// old list on drop. A namespace may only make an *allowed* algorithm its default, and the
/// iSCSI runs pick the algorithm through the initiator namespace's default.
struct AllowedCc(String);

const ALLOWED: &str = "/proc/sys/net/ipv4/tcp_allowed_congestion_control";

impl AllowedCc {
    fn widen(extra: &[&str]) -> AllowedCc {
        let old = std::fs::read_to_string(ALLOWED).unwrap().trim().to_string();
        let mut list: Vec<&str> = old.split_whitespace().collect();
        for e in extra {
            if !list.contains(e) {
                list.push(e);
            }
        }
        std::fs::write(ALLOWED, list.join(" ")).unwrap();
        AllowedCc(old)
    }
}

impl Drop for AllowedCc {
    fn drop(&mut self) {
        let _ = std::fs::write(ALLOWED, &self.0);
    }
}

fn iscsi(o: &Opts) {
    fresh(&o.out, "iscsi.jsonl");
    let _allowed = AllowedCc::widen(&[
        "reno",
        "ipsan_sf",
        "ipsan_ss",
        "ipsan_sf_ss",
        "cubic",
        "bbr",
    ]);
    let bin = std::env::var("IPSAN_BIN").unwrap_or_else(|_| "target/release/ipsan".into());
    if !Path::new(&bin).exists() {
        eprintln!("iscsi: {bin} not found (set IPSAN_BIN); skipped");
        return;
    }
    let losses: &[f64] = if o.quick {
        &[0.0, 0.001]
    } else {
        &[0.0, 0.0001, 0.0005, 0.001]
    };
    let ccs = [
        "reno",
        "ipsan_sf",
        "ipsan_ss",
        "ipsan_sf_ss",
        "cubic",
        "bbr",
    ];
    let secs = if o.quick { "6s" } else { "12s" };
    for &p in losses {
        for cc in ccs {
            let l = link(
                &format!("i{}", cc.len()),
                ms(12.5),
                p,
                QueueLimit::Bytes(16 << 20),
            );
            // The target's receive buffer starts large (tcp_rmem[1]): over the TUN emulator
            // autotuning did not grow the window, and the target does not set SO_RCVBUF yet.
            for (side, kv) in [
                (Side::Tgt, "net.ipv4.tcp_rmem=4096 33554432 67108864"),
                (Side::Ini, "net.ipv4.tcp_wmem=4096 33554432 67108864"),
            ] {
                let out = l.exec_in(side, &["sysctl", "-qw", kv]).unwrap();
                assert!(
                    out.status.success(),
                    "{}",
                    String::from_utf8_lossy(&out.stderr)
                );
            }
            let key = format!("net.ipv4.tcp_congestion_control={cc}");
            let out = l.exec_in(Side::Ini, &["sysctl", "-qw", &key]).unwrap();
            if !out.status.success() {
                eprintln!(
                    "iscsi: cannot make {cc} the default: {}",
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
            let portal = format!("{}:3260", l.addr(Side::Tgt));
            let _target = Reaped(
                l.command(Side::Tgt, &bin)
                    .args(["target", "--portal", &portal, "--lun", "null:1TiB"])
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .spawn()
                    .unwrap(),
            );
            let up = wait_until(Duration::from_secs(10), || {
                l.exec_in(
                    Side::Ini,
                    &[
                        "bash",
                        "-c",
                        &format!("exec 3<>/dev/tcp/{}/3260", l.addr(Side::Tgt)),
                    ],
                )
                .map(|o| o.status.success())
                .unwrap_or(false)
            });
            assert!(up, "target did not come up");
            let url = format!("iscsi://{portal}/iqn.2026-11.org.ipsan:disk0/0");
            let json_path =
                std::env::temp_dir().join(format!("ipsan-tcpx-{}.json", std::process::id()));
            let _ = std::fs::remove_file(&json_path);
            let out = l
                .command(Side::Ini, &bin)
                .args([
                    "bench", &url, "--rw", "write", "--bs", "1MiB", "--depth", "32",
                ])
                .args(["--time", secs, "--quiet", "--json"])
                .arg(&json_path)
                .output()
                .unwrap();
            let text = std::fs::read_to_string(&json_path).unwrap_or_default();
            let _ = std::fs::remove_file(&json_path);
            if !out.status.success() || text.is_empty() {
                eprintln!(
                    "iscsi: bench failed ({}): {}",
                    out.status,
                    String::from_utf8_lossy(&out.stderr)
                );
                continue;
            }
            let bench: serde_json::Value = serde_json::from_str(&text).unwrap();
            let mb = bench["result"]["throughput_mb_s"]
                .as_f64()
                .unwrap_or(f64::NAN);
            eprintln!("iscsi loss {p}: {cc}: {mb:.1} MB/s write");
            append(
                &o.out,
                "iscsi.jsonl",
                serde_json::json!({
                    "experiment": "iscsi", "loss": p, "rtt_ms": 25, "cc": cc,
                    "emulator": l.stats(), "tun_tx_dropped": tun_tx_dropped(&l), "bench": bench,
                }),
            );
        }
    }
}
