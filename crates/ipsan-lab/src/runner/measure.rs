//! One run's measurement: the `ipsan bench` command ([`Bench`]), running it beside the
//! target and tunnel processes, and reading its result and trace (steady second-half
//! throughput).

use super::*;

/// The `ipsan bench` command of a run and the files it writes.
pub(super) struct Bench {
    pub(super) cmd: Command,
    /// Its JSON result.
    pub(super) json: PathBuf,
    /// Its per-command trace for a steady plan's second-half throughput.
    pub(super) steady_trace: PathBuf,
}

impl Bench {
    pub(super) fn new(
        ctx: &RunCtx<'_>,
        p: &Point,
        carrier: &dyn carrier::Carrier,
        connect: SocketAddr,
        depth: u32,
        run_time: Duration,
    ) -> Bench {
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
        // 002 Fig. 9: the offered load, as iperf3's -b is for the network alone.
        if let Some(rate) = p.offered_bytes_per_s() {
            b.args(["--rate", &rate.to_string()]);
        }
        carrier.bench_args(ctx, p, &mut b);
        Bench {
            cmd: b,
            json,
            steady_trace,
        }
    }
}

/// Runs `bench` (bounded), recording the CPU of the target, the tunnel processes per side
/// and the lab itself (the emulator) over it, and the link's counters.
pub(super) fn measure(
    ctx: &RunCtx<'_>,
    procs: &Procs,
    bench: Command,
    run_time: Duration,
    rec: &mut Record,
) -> Result<std::process::Output, RunError> {
    let watched: Vec<(String, u32)> = procs.0.iter().map(|(n, c)| (n.clone(), c.id())).collect();
    let before: Vec<f64> = watched.iter().map(|(_, pid)| proc_cpu_s(*pid)).collect();
    let self_before = proc_cpu_s(std::process::id());
    let counters = LinkCounters::start(ctx);
    let t = Instant::now();
    let out = run_bounded(bench, run_time + Duration::from_secs(60))
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
    Ok(out)
}

/// Bench's JSON result into the record: throughput (over the second half for a steady
/// plan), latency, CPU, the depth `auto` chose and the negotiated parameters.
pub(super) fn read_bench_result(
    ctx: &RunCtx<'_>,
    p: &Point,
    json: &Path,
    steady_trace: &Path,
    depth: u32,
    rec: &mut Record,
) -> Result<(), RunError> {
    let text = std::fs::read_to_string(json).map_err(|e| fail(format!("bench JSON: {e}")))?;
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
        match second_half_throughput(steady_trace, p.block) {
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
    let n = &v["negotiated"];
    rec.initial_r2t = n["initial_r2t"].as_bool();
    rec.immediate_data = n["immediate_data"].as_bool();
    rec.first_burst = n["first_burst_length"].as_u64();
    Ok(())
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
pub(super) fn spread_throughput(
    lives: &[(f64, f64)],
    block: u64,
    from: f64,
    to: f64,
) -> Result<f64, String> {
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
