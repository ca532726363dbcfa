//! ipsan's NVMe/TCP host against Linux's own target (issue 30): `../shared/nvmevm` boots
//! Debian 13's kernel under QEMU and serves `nvmet` (guest/nvmet-serve.sh: a 512 MiB
//! namespace under nqn.2026-11.org.example:nvmet) through a host forward to a free loopback
//! port here; the built `ipsan` binary then discovers it, identifies it, and writes and
//! verifies data with two I/O queues and header and data digests.
//!
//! Needs the nvmevm cache (`../shared/nvmevm/build.sh`, /var/tmp/nvmevm) and
//! qemu-system-x86_64; fails with the reason when they are missing (never skips). The guest
//! boots under TCG: about 25 s on an idle machine (24 s measured), more when it is busy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");
const SUBNQN: &str = "nqn.2026-11.org.example:nvmet";

/// The guest serving nvmet; stopped (run.sh kills QEMU on SIGTERM) when dropped.
struct Vm {
    child: Child,
    log: PathBuf,
    port: u16,
    _dir: tempfile::TempDir,
}

impl Vm {
    fn start() -> Self {
        let nvmevm = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/nvmevm");
        let cache = std::env::var("NVMEVM_CACHE").unwrap_or_else(|_| "/var/tmp/nvmevm".into());
        assert!(
            nvmevm.join("run.sh").exists(),
            "nvmevm not found at {} (the shared NVMe/TCP VM scripts)",
            nvmevm.display()
        );
        assert!(
            PathBuf::from(&cache).join("initramfs.cpio.gz").exists(),
            "nvmevm is not built: run {}/build.sh once (fills {cache})",
            nvmevm.display()
        );
        assert!(
            Command::new("qemu-system-x86_64")
                .arg("--version")
                .stdout(Stdio::null())
                .status()
                .is_ok_and(|s| s.success()),
            "qemu-system-x86_64 missing (apt-get install -y qemu-system-x86)"
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        let child = Command::new(nvmevm.join("run.sh"))
            .args(["--script"])
            .arg(nvmevm.join("guest/nvmet-serve.sh"))
            .args(["--hostfwd", &format!("{port}:4420")])
            .args(["--env", "SERVE_SECONDS=300", "--timeout", "360", "-q"])
            .arg("--log")
            .arg(&log)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("run.sh");
        Self {
            child,
            log,
            port,
            _dir: dir,
        }
    }

    fn console(&self) -> String {
        let mut s = String::new();
        if let Ok(mut f) = std::fs::File::open(&self.log) {
            let mut b = Vec::new();
            let _ = f.read_to_end(&mut b);
            s = String::from_utf8_lossy(&b).into_owned();
        }
        s
    }

    fn wait_ready(&mut self, within: Duration) {
        let end = Instant::now() + within;
        loop {
            let c = self.console();
            if c.contains("NVMET ready") {
                return;
            }
            assert!(!c.contains("RESULT fail"), "nvmet-serve failed:\n{c}");
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!("the VM exited ({st}) before nvmet was ready:\n{c}");
            }
            assert!(
                Instant::now() < end,
                "nvmet not ready within {within:?}:\n{c}"
            );
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-TERM", &self.child.id().to_string()])
            .status();
        let end = Instant::now() + Duration::from_secs(20);
        while Instant::now() < end {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Runs `ipsan ARGS` (bounded in time); returns (success, stdout, stderr).
fn ipsan(args: &[&str]) -> (bool, String, String) {
    let out = Command::new("timeout")
        .arg("120")
        .arg(BIN)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn accepts_linux_nvmet_for_discover_inquiry_and_verified_bench() {
    let mut vm = Vm::start();
    vm.wait_ready(Duration::from_secs(240));
    let port = vm.port;

    // Discovery: the Discovery log lists the subsystem (nvmet serves discovery on every port).
    let (ok, out, err) = ipsan(&["discover", &format!("nvme+tcp://127.0.0.1:{port}")]);
    assert!(ok, "discover failed: {err}");
    assert!(
        out.lines()
            .any(|l| l.starts_with("tcp ") && l.contains(SUBNQN) && l.contains("nvme subsystem")),
        "{out}"
    );

    // Identify: the 512 MiB namespace 1 of 4 KiB blocks.
    let url = format!("nvme+tcp://127.0.0.1:{port}/{SUBNQN}");
    let (ok, out, err) = ipsan(&["inquiry", &url]);
    assert!(ok, "inquiry failed: {err}");
    assert!(out.contains("namespaces: [1]"), "{out}");
    assert!(
        out.contains("1: 131072 blocks × 4096 bytes = 536870912 bytes"),
        "{out}"
    );
    assert!(out.contains("model:      Linux"), "{out}");

    // A namespace the subsystem does not have is refused by name.
    let (ok, _, err) = ipsan(&["inquiry", &format!("{url}/2")]);
    assert!(!ok);
    assert!(
        err.contains("namespace 2 is not an active namespace"),
        "{err}"
    );

    // Writes through R2T/H2CData (1 MiB) on two queues with both digests, read back and
    // checked; the JSON report says what ran.
    let json = tempfile::NamedTempFile::new().unwrap();
    let (ok, out, err) = ipsan(&[
        "bench",
        &format!("{url}/1"),
        "--rw",
        "write",
        "--bs",
        "1MiB",
        "--depth",
        "4",
        "--size",
        "16MiB",
        "--verify",
        "--queues",
        "2",
        "--digest",
        "both",
        "--quiet",
        "--json",
        json.path().to_str().unwrap(),
    ]);
    assert!(ok, "bench write 1MiB failed: {err}\n{out}");
    assert!(out.contains("verify: OK, 4096 blocks checked"), "{out}");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(json.path()).unwrap()).unwrap();
    assert_eq!(v["schema"], "ipsan-bench/1");
    assert_eq!(v["nvme"]["io_queues"], 2);
    assert_eq!(v["nvme"]["header_digest"], true);
    assert_eq!(v["nvme"]["data_digest"], true);
    assert_eq!(v["result"]["write_bytes"], 16 << 20);
    assert!(v.get("negotiated").is_none(), "no iSCSI login to report");

    // Small random writes go in the capsule (4 KiB ≤ nvmet's 16 KiB IOCCSZ), 32 in flight,
    // with keep alive running across the read-back.
    let (ok, out, err) = ipsan(&[
        "bench",
        &format!("{url}/1"),
        "--rw",
        "randwrite",
        "--bs",
        "4KiB",
        "--depth",
        "32",
        "--size",
        "8MiB",
        "--offset",
        "64MiB",
        "--verify",
        "--queues",
        "2",
        "--quiet",
    ]);
    assert!(ok, "bench randwrite 4KiB failed: {err}\n{out}");
    assert!(out.contains("verify: OK"), "{out}");
    assert!(out.contains("2 I/O queue(s)"), "{out}");

    // The first run's data is still there, read by a new controller with one queue.
    let (ok, out, err) = ipsan(&[
        "bench",
        &format!("{url}/1"),
        "--rw",
        "read",
        "--bs",
        "64KiB",
        "--depth",
        "8",
        "--size",
        "16MiB",
        "--verify",
        "--quiet",
    ]);
    assert!(ok, "bench read 64KiB failed: {err}\n{out}");
    assert!(out.contains("verify: OK, 4096 blocks checked"), "{out}");
}
