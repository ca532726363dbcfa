//! What `ipsan bench` prints: the human-readable report and the live progress line.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};
use ipsan_bench::{self as bench, Progress};

pub(super) fn print_report(r: &bench::Report) {
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
        "workload: {:?} bs={} depth={} offset={} {}{}{}",
        w.rw,
        w.block_size,
        w.depth,
        w.offset,
        match (w.size_bytes, w.time_s) {
            (Some(s), _) => format!("size={s}"),
            (None, Some(t)) => format!("time={t}s"),
            _ => String::new(),
        },
        if w.verify { " verify" } else { "" },
        if w.sink == ipsan_bench::Sink::Discard {
            " sink=discard"
        } else {
            ""
        }
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
pub(super) fn progress_reporter(enabled: bool) -> Option<Box<dyn FnMut(Progress) + Send>> {
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
