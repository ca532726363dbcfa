//! Issue 30, the Linux NVMe/TCP host against `ipsan target --nvme-listen`: Debian 13's kernel
//! (6.12) under QEMU (`../shared/nvmevm`, TCG, ~45 s a run) runs `guest/nvme-test.sh` against
//! a RAM LUN served on this machine's loopback — `nvme discover`, `nvme connect`, mkfs.ext4,
//! a 64 MiB file and 300 small ones with their SHA-256, fsck, disconnect, connect again and
//! verify, O_DIRECT reads and writes — once plain, once with header and data digests and two
//! I/O queues. Skipped (with a line saying so) when the harness or QEMU is missing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::{Proc, BIN};

const IQN: &str = "iqn.2026-11.org.ipsan:nvmevm";
const NQN: &str = "nqn.2026-11.org.ipsan:nvmevm";

/// The harness beside the clone (CI has `shared/` next to it), else this machine's.
fn nvmevm() -> Option<PathBuf> {
    [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/nvmevm"),
        PathBuf::from("/work/shared/nvmevm"),
    ]
    .into_iter()
    .find(|p| p.join("run.sh").exists())
}

fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

/// `ipsan target` with a RAM LUN on loopback, iSCSI and NVMe/TCP on free ports; returns the
/// process and the NVMe/TCP port it announced.
fn target(log: &Path) -> (Proc, u16) {
    let mut child = Command::new(BIN)
        .args([
            "target",
            "--portal",
            "127.0.0.1:0",
            "--iqn",
            IQN,
            "--lun",
            "mem:256MiB",
            "--nvme-listen",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let child = Proc(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut seen = Vec::new();
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if l.contains("listening on") && l.ends_with("(NVMe/TCP)") => {
                let addr = l.split_whitespace().rev().nth(1).unwrap();
                let port = addr.rsplit(':').next().unwrap().parse().unwrap();
                return (child, port);
            }
            Ok(l) => seen.push(l),
            Err(_) => panic!(
                "ipsan target: no NVMe/TCP 'listening on' line within 30 s:\n{}\n{}",
                seen.join("\n"),
                std::fs::read_to_string(log).unwrap_or_default()
            ),
        }
    }
}

/// One run of the guest's host test; its RESULT line.
fn run_guest(vm: &Path, dir: &Path, name: &str, port: u16, env: &[&str]) -> String {
    let log = dir.join(format!("vm-{name}.log"));
    let mut cmd = Command::new(vm.join("run.sh"));
    cmd.args(["-q", "--timeout", "300", "--log"])
        .arg(&log)
        .arg("--script")
        .arg(vm.join("guest/nvme-test.sh"))
        .args([
            "--env",
            &format!("PORT={port}"),
            "--env",
            &format!("SUBNQN={NQN}"),
        ]);
    for e in env {
        cmd.args(["--env", e]);
    }
    let mut child = Proc(
        cmd.stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let started = Instant::now();
    let status = loop {
        if let Some(s) = child.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(330),
            "nvmevm ({name}) did not finish within 330 s"
        );
        std::thread::sleep(Duration::from_millis(500));
    };
    let out = String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
    let result = out
        .lines()
        .find(|l| l.starts_with("RESULT"))
        .unwrap_or("no RESULT line")
        .to_owned();
    println!("{name}: {result}");
    assert!(
        status.success() && result.starts_with("RESULT ok"),
        "the Linux NVMe/TCP host ({name}): {status}\n{out}"
    );
    result
}

#[test]
fn linux_nvme_tcp_host_keeps_a_filesystem_on_ipsan_plain_and_with_digests() {
    let Some(vm) = nvmevm() else {
        println!("SKIP: ../shared/nvmevm not found");
        return;
    };
    if !have("qemu-system-x86_64") {
        println!("SKIP: qemu-system-x86_64 not installed (scripts/install-deps)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let tlog = dir.path().join("target.log");
    let (_target, port) = target(&tlog);
    let plain = run_guest(&vm, dir.path(), "plain", port, &[]);
    assert!(plain.contains("discover=ok"), "{plain}");
    let digests = run_guest(&vm, dir.path(), "digests", port, &["DIGEST=1", "QUEUES=2"]);
    assert!(
        digests.contains("digest=1") && digests.contains("queues=2"),
        "{digests}"
    );
    let tl = std::fs::read_to_string(&tlog).unwrap_or_default();
    assert!(!tl.contains("panicked"), "target log:\n{tl}");
}
