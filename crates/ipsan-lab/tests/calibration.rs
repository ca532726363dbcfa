#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Issue 29, "Prediction, not fit", end to end: `ipsan lab calibrate`'s work on the `smoke`
//! plan (both links brought up and measured, the cipher rates, the carriers' cost runs), the
//! file written and read back, then the plan run with it through the real `ipsan` binary,
//! namespaces and emulator: every record carries the file's SHA-1 and the file's RTT, SOCKET
//! and cipher rates (not a calibration of its own), the file sits beside the records, and the
//! report predicts from it. Needs root and a built `ipsan` binary; prints SKIP otherwise.

mod common;
use common::ipsan_bin;

use std::sync::Arc;
use std::time::{Duration, Instant};

use ipsan_lab::calibrate::{LoadedCalibration, CALIBRATION_IN_RESULTS};
use ipsan_lab::plan::Plan;
use ipsan_lab::results::Status;
use ipsan_lab::runner::{calibrate_plan, run_plan, RunConfig};

#[test]
fn accepts_a_calibration_file_as_the_runs_only_inputs() {
    if !ipsan_wan::link::is_root() {
        eprintln!("SKIP accepts_a_calibration_file_as_the_runs_only_inputs: needs root");
        return;
    }
    let Some(exe) = ipsan_bin() else {
        eprintln!(
            "SKIP accepts_a_calibration_file_as_the_runs_only_inputs: no ipsan binary \
             (cargo build -p ipsan, or set IPSAN_BIN)"
        );
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let plan = Plan::load("smoke").unwrap();
    let mut cfg = RunConfig::new(exe, dir.path().join("cal-runs"));
    cfg.progress = false;
    cfg.link_name = format!("labcal{}", std::process::id() % 10_000);
    cfg.subnet = 188;
    let t = Instant::now();
    let file = calibrate_plan(&plan, &cfg).unwrap();
    assert_eq!(file.links.len(), 2, "plain at 0 ms, esp-emu at 8 ms");
    assert!(file.cores_avail > 0.0);
    assert!(file
        .ciphers
        .iter()
        .any(|c| c.cipher == "esp-emu" && c.enc_bytes_per_cpu_s > 0.0));
    // The cost runs: plain at the three cost blocks on the 0 ms link, priced per scheme.
    assert_eq!(file.cost_runs_ok, (3, 3), "{file:?}");
    assert!(
        file.costs.carriers.iter().any(|c| c.scheme == "plain"),
        "{:?}",
        file.costs
    );
    let cal = file.write(&dir.path().join("cal.json")).unwrap();
    let back = LoadedCalibration::read(&dir.path().join("cal.json")).unwrap();
    assert_eq!(back.sha1, cal.sha1);

    let out = dir.path().join("run");
    cfg.out = out.clone();
    cfg.calibration = Some(Arc::new(back));
    let records = run_plan(&plan, &cfg).unwrap();
    assert!(
        t.elapsed() < Duration::from_secs(180),
        "took {:?}",
        t.elapsed()
    );
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r.status, Status::Ok, "{}: {}", r.point.label(), r.error);
        assert_eq!(r.calibration_sha1, cal.sha1);
        // The file's numbers, bit for bit: the run did not calibrate its link again.
        let want = cal.file.link(&r.point).unwrap();
        let got = r.calibration.as_ref().unwrap();
        assert_eq!(got.rtt_ms.to_bits(), want.rtt_ms.to_bits());
        assert_eq!(got.socket_mb_s.to_bits(), want.socket_mb_s.to_bits());
        let (enc, _) = cal.file.cipher(&r.point).unwrap();
        if enc.is_finite() {
            assert_eq!((r.enc_mb_s * 1e6).to_bits(), enc.to_bits());
        }
    }
    assert_eq!(
        std::fs::read(out.join(CALIBRATION_IN_RESULTS)).unwrap(),
        cal.bytes
    );
    let rep = ipsan_lab::report::build(&out, &records).unwrap();
    let md = std::fs::read_to_string(rep.markdown).unwrap();
    assert!(md.contains("Prediction, out of sample"), "{md}");
    assert!(md.contains(&cal.sha1));
    assert!(out.join("prediction.csv").exists());
    let ns = std::process::Command::new("ip")
        .args(["netns", "list"])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&ns.stdout).contains(&cfg.link_name));
}
