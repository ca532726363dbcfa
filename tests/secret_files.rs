//! Issue 31, item 6: one secret-file loader with the mode check, used everywhere. Before,
//! only the target's own `--chap-secret-file`/`secret_file` were checked; a group- or
//! world-readable file was read without a word by `bench --secret-file`, `--password-file`
//! (bench, inquiry, attach, gateway), `--target-password-file`, a remote LUN's
//! `chap_secret_file`, and a TOML with inline secrets was read whatever its mode.
//!
//! Runs the real `ipsan` binary; nothing listens on the port the URLs name (port 1): every
//! refusal must come before any connection.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");
const SECRET: &str = "a-readable-secret-0123456789";

fn file(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
    p
}

/// Runs `ipsan ARGS` and returns (started or succeeded, stderr). A server that prints its
/// `listening on` line counts as started and is killed; anything is killed after 20 s.
fn run(args: &[&str]) -> (bool, String) {
    use std::io::{BufRead as _, Read as _};
    let mut child = Command::new(BIN)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(out).lines().map_while(Result::ok) {
            if line.contains(": listening on ") {
                let _ = tx.send(());
            }
        }
    });
    let t0 = Instant::now();
    loop {
        if rx.try_recv().is_ok() {
            let _ = child.kill();
            let _ = child.wait();
            return (true, "started".into());
        }
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            child
                .stderr
                .take()
                .unwrap()
                .read_to_string(&mut err)
                .unwrap();
            return (st.success(), err);
        }
        if t0.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            return (true, "still running after 20 s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// `ipsan ARGS` must stop, naming the mode and the fix, without the secret.
fn assert_mode_refused(args: &[&str]) {
    let (ok, err) = run(args);
    assert!(!ok, "{args:?} accepted a group-readable secret file: {err}");
    assert!(
        err.contains("mode 0640") && err.contains("chmod 600"),
        "{args:?}: {err}"
    );
    assert!(!err.contains(SECRET), "secret in the error: {err}");
}

const URL: &str = "iscsi://alice@127.0.0.1:1/iqn.2026-11.org.ipsan:x/0";

#[test]
fn rejects_a_group_readable_bench_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    let k = file(dir.path(), "seal.key", SECRET, 0o640);
    assert_mode_refused(&[
        "bench",
        "iscsi://127.0.0.1:1/iqn.2026-11.org.ipsan:x/0",
        "--seal",
        "aes-256-gcm",
        "--secret-file",
        k.to_str().unwrap(),
        "--time",
        "1s",
    ]);
}

#[test]
fn rejects_a_group_readable_password_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = file(dir.path(), "pw", SECRET, 0o640);
    assert_mode_refused(&["inquiry", URL, "--password-file", p.to_str().unwrap()]);
}

#[test]
fn rejects_a_group_readable_target_password_file() {
    let dir = tempfile::tempdir().unwrap();
    let ok = file(dir.path(), "pw", SECRET, 0o600);
    let t = file(dir.path(), "tpw", SECRET, 0o640);
    assert_mode_refused(&[
        "inquiry",
        URL,
        "--password-file",
        ok.to_str().unwrap(),
        "--target-user",
        "disk",
        "--target-password-file",
        t.to_str().unwrap(),
    ]);
}

#[test]
fn rejects_a_group_readable_gateway_password_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = file(dir.path(), "pw", SECRET, 0o640);
    assert_mode_refused(&[
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--to",
        "iscsi://alice@127.0.0.1:1/iqn.2026-11.org.ipsan:x/0",
        "--password-file",
        p.to_str().unwrap(),
    ]);
}

#[test]
fn rejects_a_group_readable_remote_lun_chap_secret_file() {
    let dir = tempfile::tempdir().unwrap();
    let p = file(dir.path(), "remote.secret", SECRET, 0o640);
    let cfg = file(
        dir.path(),
        "ipsan.toml",
        &format!(
            "[server]\nportals = [\"127.0.0.1:0\"]\n[[target]]\niqn = \"iqn.2026-11.org.ipsan:gw\"\n[[target.lun]]\nid = 0\nbackend = \"iscsi://127.0.0.1:1/iqn.2026-11.org.ipsan:x/0\"\nchap_user = \"alice\"\nchap_secret_file = \"{}\"\n",
            p.display()
        ),
        0o600,
    );
    assert_mode_refused(&["target", "--config", cfg.to_str().unwrap()]);
}

#[test]
fn rejects_inline_secrets_in_a_config_file_others_can_read() {
    let dir = tempfile::tempdir().unwrap();
    let text = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\n[[target]]\niqn = \"iqn.2026-11.org.ipsan:x\"\n[target.chap]\nuser = \"alice\"\nsecret = \"{SECRET}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n"
    );
    let cfg = file(dir.path(), "ipsan.toml", &text, 0o640);
    let (ok, err) = run(&["target", "--config", cfg.to_str().unwrap()]);
    assert!(
        !ok,
        "served inline secrets from a group-readable file: {err}"
    );
    assert!(
        err.contains("target[0].chap.secret") && err.contains("chmod 600"),
        "{err}"
    );
    assert!(!err.contains(SECRET), "secret in the error: {err}");
}

#[test]
fn accepts_a_config_file_without_inline_secrets_readable_by_the_group() {
    // docs/target.md: 0640 is fine for a file that only references secret files.
    let dir = tempfile::tempdir().unwrap();
    let s = file(dir.path(), "chap.secret", SECRET, 0o600);
    let text = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\n[[target]]\niqn = \"iqn.2026-11.org.ipsan:x\"\n[target.chap]\nuser = \"alice\"\nsecret_file = \"{}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n",
        s.display()
    );
    let cfg = file(dir.path(), "ipsan.toml", &text, 0o640);
    let (_, err) = run(&["target", "--config", cfg.to_str().unwrap()]);
    assert_eq!(err, "started", "refused: {err}");
}

/// Issue 31: nothing kept a process holding secrets from dumping core. `ipsan target` now
/// sets RLIMIT_CORE to 0 and PR_SET_DUMPABLE to 0 at start: its `/proc/PID/limits` says 0,
/// and (checked when the test runs as root, starting the target as `nobody`) its `/proc/PID`
/// belongs to root, which is what a non-dumpable process looks like from outside.
#[test]
fn target_process_forbids_core_dumps() {
    use std::io::BufRead as _;
    use std::os::unix::fs::MetadataExt;
    use std::os::unix::process::CommandExt;
    let root = std::fs::metadata("/proc/self").unwrap().uid() == 0;
    let mut cmd = Command::new(BIN);
    cmd.args(["target", "--portal", "127.0.0.1:0", "--lun", "mem:1MiB"])
        .current_dir("/")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if root {
        cmd.uid(65534).gid(65534);
    }
    let mut child = cmd.spawn().unwrap();
    struct Kill(std::process::Child);
    impl Drop for Kill {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let out = child.stdout.take().unwrap();
    let child = Kill(child);
    let mut lines = std::io::BufReader::new(out).lines();
    let started = lines
        .by_ref()
        .map_while(Result::ok)
        .any(|l| l.contains(": listening on "));
    assert!(started, "target did not start");
    let pid = child.0.id();
    let limits = std::fs::read_to_string(format!("/proc/{pid}/limits")).unwrap();
    let core = limits
        .lines()
        .find(|l| l.starts_with("Max core file size"))
        .unwrap();
    let fields: Vec<&str> = core.split_whitespace().collect();
    assert_eq!(&fields[4..6], &["0", "0"], "{core}");
    if root {
        let owner = std::fs::metadata(format!("/proc/{pid}/status"))
            .unwrap()
            .uid();
        assert_eq!(owner, 0, "/proc/{pid} of a dumpable process runs as nobody");
    } else {
        println!("not root: the PR_SET_DUMPABLE part is not checked");
    }
}
