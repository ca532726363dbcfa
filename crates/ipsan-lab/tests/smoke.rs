#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The lab's CI smoke test: the `smoke` plan (plain on a clean link, esp-emu at 8 ms) through
//! the real `ipsan` binary, namespaces and emulator, then the report. Needs root and a built
//! `ipsan` binary ($IPSAN_BIN, else target/{debug,release}/ipsan); prints SKIP and the reason
//! otherwise. Bounded: two 1-second runs plus calibration, well under a minute.

mod common;
use common::ipsan_bin;

use std::time::{Duration, Instant};

use ipsan_lab::plan::{Plan, Scheme};
use ipsan_lab::results::Status;
use ipsan_lab::runner::{run_plan, RunConfig};

#[test]
fn smoke_plan_runs_end_to_end_through_namespaces() {
    if !ipsan_wan::link::is_root() {
        eprintln!("SKIP smoke_plan_runs_end_to_end_through_namespaces: needs root (namespaces)");
        return;
    }
    let Some(exe) = ipsan_bin() else {
        eprintln!(
            "SKIP smoke_plan_runs_end_to_end_through_namespaces: no ipsan binary \
             (cargo build -p ipsan, or set IPSAN_BIN)"
        );
        return;
    };
    let out = tempfile::tempdir().unwrap();
    let plan = Plan::load("smoke").unwrap();
    let mut cfg = RunConfig::new(exe, out.path().to_path_buf());
    cfg.progress = false;
    // Our own link name and subnet so a concurrent lab on the host does not collide.
    cfg.link_name = format!("labsmoke{}", std::process::id() % 10_000);
    cfg.subnet = 190;
    let t = Instant::now();
    let records = run_plan(&plan, &cfg).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(90),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.status, Status::Ok, "{}: {}", r.point.label(), r.error);
        assert!(r.throughput_mb_s > 0.0);
        assert!(r.bytes > 0);
        assert!(r.model_mb_s.is_finite());
        assert!(r.cpu_target_pct.is_finite());
    }
    let esp = records
        .iter()
        .find(|r| r.point.scheme == Scheme::EspEmu)
        .unwrap();
    assert!(esp.esp_packets > 0, "esp-emu processed no packets");
    let c = esp.calibration.as_ref().unwrap();
    assert!(c.rtt_ms >= 15.0, "8 ms each way, RTT {} ms", c.rtt_ms);
    assert!(c
        .sysctls
        .iter()
        .any(|(k, v)| k == "net.ipv4.tcp_congestion_control" && v == "reno"));
    let csv = std::fs::read_to_string(out.path().join("results.csv")).unwrap();
    assert_eq!(csv.lines().count(), 3);
    let rep = ipsan_lab::report::build(out.path(), &records).unwrap();
    assert!(rep.html.exists());
    // The namespaces are gone.
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ns.stdout).contains(&cfg.link_name));
}
