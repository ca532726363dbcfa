//! The `iperf3` scheme: no iSCSI, one TCP stream through the same link (Aiken et al.'s
//! network baseline).

use super::*;

/// Aiken et al.'s network baseline: one iperf3 TCP stream from the initiator's namespace to
/// the target's through the same emulated link, for the run's duration, with the first half
/// omitted (`-O`: slow start and the buffers' autotuning ramp), and the plan's `tcp_buffer`,
/// if it has one, as iperf3's socket buffers (`-w`, as the iSCSI connections get it; Aiken et
/// al. set 500,000 bytes on both hosts), the point's block as the write length (`-l`, their
/// netperf send size) and, when the point has an offered load, that fraction of the link's
/// rate as iperf3's pacing (`-b`, 002 Fig. 9). The link's, TUN's and kernels' counters are recorded
/// as for every other scheme. Without a rate the emulator's forwarding thread is the
/// bottleneck, and an autotuned stream overfills the TUN ring in front of it (3–18 k drops in
/// a 3 s run here; single runs moved 0.04–366 MB/s): the Aiken plan has Aiken's 100 Mbit/s.
/// What the point adds to iperf3's client: its block as each write's length (`-l`, Aiken et
/// al.'s netperf send size: their Table 1 columns, 512 B to 16 KiB) and, with an offered
/// load on a rate-limited link (Muknahallipatna et al. (002) Fig. 9: FCLoad at 10-90 % of
/// the link), that many bits per second as iperf3's pacing (`-b`).
fn point_args(p: &Point) -> Vec<String> {
    let mut a = vec!["-l".to_string(), p.block.to_string()];
    if p.load > 0.0 && p.rate_mbit > 0.0 {
        a.push("-b".into());
        a.push(format!("{:.0}", p.load * p.rate_mbit * 1e6));
    }
    a
}

pub(in crate::runner) fn iperf3(
    ctx: &RunCtx<'_>,
    p: &Point,
    run_time: Duration,
    rec: &mut Record,
) -> Result<(), RunError> {
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
    c.args(point_args(p));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plan::Plan;

    /// 002 Fig. 9's offered load reaches iperf3 as its pacing: 30 % of 100 Mbit/s is
    /// `-b 30000000`; a point without a load is not paced; the block is the write length.
    #[test]
    fn offered_load_paces_iperf3_and_the_block_is_its_write_length() {
        let fig9 = Plan::load("offered-load").unwrap();
        let p = fig9
            .points
            .iter()
            .find(|x| (x.load - 0.3).abs() < 1e-9)
            .unwrap();
        assert_eq!(point_args(p), ["-l", "131072", "-b", "30000000"]);
        let t1 = Plan::load("aiken-table1").unwrap();
        let q = t1
            .points
            .iter()
            .find(|x| x.scheme == crate::plan::Scheme::Iperf3 && x.block == 512)
            .unwrap();
        assert_eq!(point_args(q), ["-l", "512"]);
    }
}
