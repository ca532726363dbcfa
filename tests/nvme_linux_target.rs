//! ipsan's NVMe/TCP host against Linux's own target (issue 30): `../shared/nvmevm` boots
//! Debian 13's kernel under QEMU and serves `nvmet` (guest/nvmet-serve.sh: a 512 MiB
//! namespace under nqn.2026-11.org.example:nvmet) through host forwards to free loopback
//! ports here; the built `ipsan` binary then discovers it, identifies it, and writes and
//! verifies data with two I/O queues and header and data digests; a second guest requires
//! DH-HMAC-CHAP (keys made by nvme-cli's gen-dhchap-key) and serves a TLS port (a key made by
//! gen-tls-key), and the host must get in with the right keys, both ways, and be kept out
//! with a wrong one. One guest at a time (a lock), each test about 25-40 s.
//!
//! Needs the nvmevm cache (`../shared/nvmevm/build.sh`, /var/tmp/nvmevm) and
//! qemu-system-x86_64; fails with the reason when they are missing (never skips). The guest
//! boots under TCG: about 25 s on an idle machine (24 s measured), more when it is busy.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::Read;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// One guest at a time (each takes ~1.5 GB and two emulated CPUs).
static VM_LOCK: Mutex<()> = Mutex::new(());
/// The host NQN nvmet-serve.sh lets in when DH-HMAC-CHAP is on (the guest's own).
const GUEST_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");
const SUBNQN: &str = "nqn.2026-11.org.example:nvmet";

/// The guest serving nvmet; stopped (run.sh kills QEMU on SIGTERM) when dropped.
struct Vm {
    child: Child,
    log: PathBuf,
    /// The plain port (guest 4420) and the TLS port (guest 4421, when a TLS key is set).
    port: u16,
    tls_port: u16,
    _dir: tempfile::TempDir,
}

fn nvmevm() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../shared/nvmevm")
}

fn cache() -> PathBuf {
    PathBuf::from(std::env::var("NVMEVM_CACHE").unwrap_or_else(|_| "/var/tmp/nvmevm".into()))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Runs the nvme-cli the nvmevm cache unpacked (`gen-dhchap-key`, `gen-tls-key`) here.
fn nvme_cli(args: &[&str]) -> String {
    let e = cache().join("extract");
    let lib = e.join("usr/lib/x86_64-linux-gnu");
    let out = Command::new(lib.join("ld-linux-x86-64.so.2"))
        .arg("--library-path")
        .arg(&lib)
        .arg(e.join("usr/sbin/nvme"))
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "nvme {args:?}: {out:?}");
    String::from_utf8(out.stdout).unwrap().trim().to_owned()
}

/// Writes a secret to an owner-only file.
fn secret_file(dir: &std::path::Path, name: &str, text: &str) -> String {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("{text}\n")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p.to_str().unwrap().to_owned()
}

impl Vm {
    fn start(env: &[(&str, &str)]) -> Self {
        let nvmevm = nvmevm();
        let cache = cache().display().to_string();
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
        let (port, tls_port) = (free_port(), free_port());
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("console.log");
        let mut cmd = Command::new(nvmevm.join("run.sh"));
        for (k, v) in env {
            cmd.args(["--env", &format!("{k}={v}")]);
        }
        let child = cmd
            .args(["--script"])
            .arg(nvmevm.join("guest/nvmet-serve.sh"))
            .args(["--hostfwd", &format!("{port}:4420")])
            .args(["--hostfwd", &format!("{tls_port}:4421")])
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
            tls_port,
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

    /// A VM whose nvmet is ready. The guest kernel under QEMU's TCG has been seen to oops
    /// while booting, before any NVMe (`int3` in `crng_make_state` under `modprobe`, seen once,
    /// 2026-11-27): such a boot is logged and tried once more; any other failure is the test's
    /// (`common::guest`).
    fn start_ready(env: &[(&str, &str)], within: Duration) -> Self {
        common::guest::boot_once_more_after_oops("NVMET ready", || {
            let mut vm = Self::start(env);
            vm.try_wait_ready(within).map(|()| vm)
        })
        .unwrap_or_else(|c| panic!("{c}"))
    }

    fn try_wait_ready(&mut self, within: Duration) -> Result<(), String> {
        let end = Instant::now() + within;
        loop {
            let c = self.console();
            if c.contains("NVMET ready") {
                return Ok(());
            }
            if c.contains("RESULT fail") {
                return Err(format!("nvmet-serve failed:\n{c}"));
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                return Err(format!("the VM exited ({st}) before nvmet was ready:\n{c}"));
            }
            if Instant::now() >= end {
                return Err(format!("nvmet not ready within {within:?}:\n{c}"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }
}

impl Drop for Vm {
    fn drop(&mut self) {
        common::guest::stop(&mut self.child);
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
    let _one = VM_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let vm = Vm::start_ready(&[], Duration::from_secs(240));
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

#[test]
fn accepts_linux_nvmet_with_tls_and_dh_hmac_chap_and_refuses_wrong_keys() {
    let _one = VM_LOCK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    assert!(
        cache().join("extract/usr/sbin/nvme").exists(),
        "nvmevm is not built: run {}/build.sh once",
        nvmevm().display()
    );
    let keys = tempfile::tempdir().unwrap();
    let k = keys.path();
    let host_key = nvme_cli(&["gen-dhchap-key", "--nqn", GUEST_HOSTNQN, "--hmac", "1"]);
    let ctrl_key = nvme_cli(&["gen-dhchap-key", "--nqn", SUBNQN, "--hmac", "2"]);
    let tls_key = nvme_cli(&[
        "gen-tls-key",
        "--hostnqn",
        GUEST_HOSTNQN,
        "--subsysnqn",
        SUBNQN,
    ]);
    let other_dhchap = nvme_cli(&["gen-dhchap-key", "--nqn", GUEST_HOSTNQN, "--hmac", "1"]);
    let other_tls = nvme_cli(&[
        "gen-tls-key",
        "--hostnqn",
        GUEST_HOSTNQN,
        "--subsysnqn",
        SUBNQN,
    ]);
    let hf = secret_file(k, "host", &host_key);
    let cf = secret_file(k, "ctrl", &ctrl_key);
    let tf = secret_file(k, "tls", &tls_key);
    let wrong_dhchap = secret_file(k, "wrong-dhchap", &other_dhchap);
    let wrong_tls = secret_file(k, "wrong-tls", &other_tls);

    let vm = Vm::start_ready(
        &[
            ("DHCHAP_SECRET", &host_key),
            ("DHCHAP_CTRL_SECRET", &ctrl_key),
            ("TLS_KEY", &tls_key),
        ],
        Duration::from_secs(240),
    );
    let plain = format!("nvme+tcp://127.0.0.1:{}/{SUBNQN}/1", vm.port);
    let tls = format!("nvme+tcp://127.0.0.1:{}/{SUBNQN}/1", vm.tls_port);
    let who = ["--hostnqn", GUEST_HOSTNQN];

    // Without a secret: Connect answers ATR and the host says what is missing.
    let (ok, _, err) = ipsan(&[&["inquiry", &plain][..], &who].concat());
    assert!(!ok);
    assert!(err.contains("requires in-band authentication"), "{err}");

    // Bidirectional DH-HMAC-CHAP on the plain port.
    let (ok, out, err) = ipsan(
        &[
            &["inquiry", &plain][..],
            &who,
            &[
                "--dhchap-secret-file",
                &hf,
                "--dhchap-ctrl-secret-file",
                &cf,
            ],
        ]
        .concat(),
    );
    assert!(ok, "inquiry with DH-HMAC-CHAP failed: {err}");
    assert!(
        out.contains("security:   TLS off, DH-HMAC-CHAP") && out.contains("bidirectional"),
        "{out}"
    );

    // A secret Linux does not hold: Linux refuses (Failure1).
    let (ok, _, err) = ipsan(
        &[
            &["inquiry", &plain][..],
            &who,
            &["--dhchap-secret-file", &wrong_dhchap],
        ]
        .concat(),
    );
    assert!(!ok);
    // Linux answers the Reply with Failure1 and then fails the controller; on a loaded machine
    // the teardown can win over the Failure1 read (seen once in a fresh-clone CI run), so the
    // refusal arrives as the controller closing the connection instead.
    assert!(
        err.contains("DH-HMAC-CHAP refused by the peer")
            || err.contains("connection closed by the controller"),
        "{err}"
    );

    // A controller secret Linux does not hold: this host refuses Linux's answer (R2).
    let (ok, _, err) = ipsan(
        &[
            &["inquiry", &plain][..],
            &who,
            &[
                "--dhchap-secret-file",
                &hf,
                "--dhchap-ctrl-secret-file",
                &wrong_dhchap,
            ],
        ]
        .concat(),
    );
    assert!(!ok);
    assert!(err.contains("DH-HMAC-CHAP failed"), "{err}");

    // TLS 1.3 with the PSK plus DH-HMAC-CHAP both ways, two queues, both digests: written and
    // read back. tlshd starts in the guest right before "NVMET ready": the first handshakes
    // may find the kernel not yet able to do TLS, so those are retried for a while.
    let bench = [
        &["bench", &tls][..],
        &who,
        &[
            "--tls-key-file",
            &tf,
            "--dhchap-secret-file",
            &hf,
            "--dhchap-ctrl-secret-file",
            &cf,
        ],
        &[
            "--queues", "2", "--digest", "both", "--rw", "write", "--bs", "128KiB",
        ],
        &["--depth", "8", "--size", "8MiB", "--verify", "--quiet"],
    ]
    .concat();
    let mut last = String::new();
    let mut passed = None;
    for _ in 0..15 {
        let (ok, out, err) = ipsan(&bench);
        if ok {
            passed = Some(out);
            break;
        }
        assert!(
            err.contains("TLS handshake") || err.contains("closed"),
            "TLS bench failed: {err}"
        );
        last = err;
        std::thread::sleep(Duration::from_secs(2));
    }
    let out = passed.unwrap_or_else(|| panic!("TLS never came up: {last}\n{}", vm.console()));
    assert!(out.contains("verify: OK, 2048 blocks checked"), "{out}");
    assert!(
        out.contains("2 I/O queue(s), digests(h/d)=Yes/Yes"),
        "{out}"
    );
    assert!(
        out.contains("TLS=Yes, DH-HMAC-CHAP") && out.contains("bidirectional"),
        "{out}"
    );

    // Another TLS key for the same identity: the handshake fails, nothing is connected.
    let (ok, _, err) = ipsan(
        &[
            &["inquiry", &tls][..],
            &who,
            &["--tls-key-file", &wrong_tls, "--dhchap-secret-file", &hf],
        ]
        .concat(),
    );
    assert!(!ok);
    assert!(err.contains("TLS handshake failed"), "{err}");
}
