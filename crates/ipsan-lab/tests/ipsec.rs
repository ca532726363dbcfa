#![allow(clippy::unwrap_used, clippy::expect_used)]
//! The `ipsec` scheme against real strongSwan: charon in each of the lab's namespaces
//! (IKEv2 + PSK, userspace ESP in UDP), iSCSI writes through the tunnel with 3DES-CBC +
//! HMAC-SHA1-96 and AES-256-GCM, then nothing left behind. Needs root, strongSwan
//! (scripts/install-deps) and a built `ipsan` binary; prints SKIP and the reason otherwise.
//! Bounded: two 1-second runs plus IKE and calibration, asserted under two minutes.

mod common;
use common::ipsan_bin;

use std::time::{Duration, Instant};

use ipsan_lab::plan::Plan;
use ipsan_lab::results::Status;
use ipsan_lab::runner::{run_plan, RunConfig};

const PLAN: &str = r#"
name = "ipsec-test"
description = "real IPsec: both ciphers, 2 ms one way"
repetitions = 1
run_time = "1s"
min_rtts = 1
lun = "mem:64MiB"

[[matrix]]
delay = ["2ms"]
block = ["1MiB"]
scheme = ["ipsec"]
depth = ["2"]
cipher = ["3des-cbc-hmac-sha1", "aes-256-gcm"]
"#;

/// Processes whose command line or environment mentions `needle` (charon finds its
/// configuration through STRONGSWAN_CONF in its environment).
fn procs_mentioning(needle: &str) -> Vec<String> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        for f in ["cmdline", "environ"] {
            if let Ok(c) = std::fs::read(e.path().join(f)) {
                let c = String::from_utf8_lossy(&c).replace('\0', " ");
                if c.contains(needle) {
                    v.push(format!("{}: {c}", e.path().display()));
                }
            }
        }
    }
    v
}

#[test]
fn moves_iscsi_writes_through_strongswan_esp_and_cleans_up() {
    if !ipsan_wan::link::is_root() {
        eprintln!("SKIP moves_iscsi_writes_through_strongswan_esp_and_cleans_up: needs root");
        return;
    }
    if let Some(why) = ipsan_lab::ipsec::unavailable() {
        eprintln!("SKIP moves_iscsi_writes_through_strongswan_esp_and_cleans_up: {why}");
        return;
    }
    let Some(exe) = ipsan_bin() else {
        eprintln!("SKIP moves_iscsi_writes_through_strongswan_esp_and_cleans_up: no ipsan binary");
        return;
    };
    let tmp = tempfile::tempdir().unwrap();
    // A relative output directory, as `ipsan lab run --out results/x` gives: charon must
    // still find its configuration (it resolves paths after changing to "/").
    std::env::set_current_dir(tmp.path()).unwrap();
    let out = tmp.path().join("rel-out");
    let plan = Plan::parse("ipsec-test", PLAN).unwrap();
    let mut cfg = RunConfig::new(exe, "rel-out".into());
    cfg.progress = false;
    cfg.link_name = format!("labipsec{}", std::process::id() % 10_000);
    cfg.subnet = 192;
    let t = Instant::now();
    let records = run_plan(&plan, &cfg).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(120),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.status, Status::Ok, "{}: {}", r.point.label(), r.error);
        assert!(r.bytes > 0 && r.throughput_mb_s > 0.0);
        // The data went through ESP: the CHILD_SA counted at least one packet per 1400 bytes.
        assert!(
            r.esp_packets as f64 >= r.bytes as f64 / 1400.0,
            "{}: {} ESP packets for {} bytes",
            r.point.label(),
            r.esp_packets,
            r.bytes
        );
        // Each host's charon did crypto work, counted as that host's CPU.
        assert!(r.cpu_tunnel_ini_pct > 0.0 && r.cpu_tunnel_tgt_pct > 0.0);
        assert!(r.cpu_tgt_host_pct() > r.cpu_target_pct);
        // Nothing on this path may drop: the emulated link is loss-free and the tunnel's
        // queues hold a burst (ipsec0's TUN ring dropped 2-9 % of 1 MiB bursts at its
        // default 500 packets, each drop a retransmission of the inner TCP).
        // (A tail-loss probe may resend a segment now and then on a loaded host, so the
        // bound is 0.5 % of the bytes, far below what the drops cost.)
        let tcp = r
            .tcp
            .as_ref()
            .expect("bench reports the connection's TCP_INFO");
        let (resent, sent) = (
            tcp["bytes_retrans"].as_u64().unwrap_or(u64::MAX),
            tcp["bytes_sent"].as_u64().unwrap_or(0),
        );
        eprintln!("{}: resent {resent} of {sent} bytes", r.point.label());
        assert!(
            resent.saturating_mul(200) < sent,
            "{}: resent {resent} of {sent} bytes",
            r.point.label()
        );
    }
    // Nothing left: no charon from this run, no namespace.
    let scratch = out.join("scratch");
    let left = procs_mentioning(&scratch.display().to_string());
    assert!(left.is_empty(), "left running: {left:?}");
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ns.stdout).contains(&cfg.link_name));
}
