//! A listener beyond loopback authenticates (issue 31): the real `ipsan target` binary.
//!
//! - without host authentication a portal beyond loopback is refused at start, naming the
//!   portal, the target, why and the options, before anything is bound;
//! - each kind of host authentication (CHAP, per-host CHAP, Seal required with a secret,
//!   relayed CHAP from a file) gets past the check;
//! - `--insecure-no-auth` / `[server] insecure_no_auth = true` get past it with a warning;
//! - a loopback portal is served without authentication and without a warning.
//!
//! Nothing beyond loopback is ever bound: the address used, 10.231.255.254, is on no interface
//! of this machine, so a target past the check fails to bind it, with another message. Files
//! live in a temporary directory; every process is killed on drop or exits by itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");
const NOWHERE: &str = "10.231.255.254:0";
const DISK0: &str = "iqn.2026-11.org.ipsan:disk0";

/// A child process killed when dropped.
struct Proc(Child);
impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn secret_file(dir: &Path, name: &str, secret: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    p
}

/// Runs `ipsan target ARGS`, which must exit by itself (refused, or unable to bind
/// [`NOWHERE`]) within 30 s; returns its stderr.
fn target_start_error(args: &[&str]) -> String {
    let mut child = Command::new(BIN)
        .arg("target")
        .args(args)
        .env_remove("RUST_LOG")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut s = String::new();
        std::io::Read::read_to_string(&mut stderr, &mut s).unwrap();
        s
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let err = reader.join().unwrap();
            assert!(!status.success(), "target {args:?} exited 0: {err}");
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("target {args:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn assert_refused(err: &str, target: &str) {
    assert!(
        err.contains(&format!(
            "refusing to serve target(s) {target} on {NOWHERE}"
        )),
        "{err}"
    );
    for option in [
        "beyond loopback",
        "--chap-user",
        "--chap-host",
        "chap_relay",
        "--seal required",
        "--insecure-no-auth",
        "insecure_no_auth = true",
    ] {
        assert!(err.contains(option), "{option}: {err}");
    }
    assert!(
        !err.contains("cannot listen"),
        "bound before the check: {err}"
    );
}

/// Past the check: the start fails only to bind the address this machine does not have.
fn assert_past_the_check(err: &str, what: &str) {
    assert!(!err.contains("refusing"), "{what}: {err}");
    assert!(
        err.contains(&format!("cannot listen on {NOWHERE}")),
        "{what}: {err}"
    );
}

#[test]
fn rejects_target_beyond_loopback_without_host_auth() {
    // Flags: the issue's `ipsan target --portal 0.0.0.0:3260 --lun mem:1GiB`, and with an
    // allow list (a declared name, not authentication) beside a loopback portal.
    let err = target_start_error(&["--portal", NOWHERE, "--lun", "mem:1MiB"]);
    assert_refused(&err, DISK0);
    let err = target_start_error(&[
        "--portal",
        "127.0.0.1:0",
        "--portal",
        NOWHERE,
        "--allow",
        "iqn.1994-05.com.redhat:*",
        "--seal",
        "allowed",
    ]);
    assert_refused(&err, DISK0);

    // A file: only the target without authentication is named.
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("t.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nportals = [\"{NOWHERE}\"]\n\
             [[target]]\niqn = \"iqn.2026-11.ex:open\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n\
             [[target]]\niqn = \"iqn.2026-11.ex:chap\"\n[target.chap]\nuser = \"u\"\nsecret = \"chap-secret-0123456789\"\n\
             [[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&cfg, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let err = target_start_error(&["--config", cfg.to_str().unwrap()]);
    assert_refused(&err, "iqn.2026-11.ex:open");
    assert!(!err.contains("iqn.2026-11.ex:chap"), "{err}");
}

#[test]
fn accepts_each_kind_of_host_auth_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let chap = secret_file(dir.path(), "chap.sec", "chap-secret-0123456789");
    let seal = secret_file(
        dir.path(),
        "seal.sec",
        "seal-secret-0123456789-0123456789-0123456789",
    );
    let chap = chap.to_str().unwrap();
    let seal = seal.to_str().unwrap();
    let host = format!("iqn.2026-11.ex:host-a,host-a,{chap}");
    for extra in [
        vec!["--chap-user", "hosts", "--chap-secret-file", chap],
        vec!["--chap-host", host.as_str()],
        vec!["--seal", "required", "--seal-secret-file", seal],
    ] {
        let mut args = vec!["--portal", NOWHERE, "--lun", "mem:1MiB"];
        args.extend_from_slice(&extra);
        let err = target_start_error(&args);
        assert_past_the_check(&err, &format!("{extra:?}"));
    }
    // Relayed CHAP (a gateway's remote LUNs): from a file, as `ipsan gateway --chap-relay`
    // builds it.
    let cfg = dir.path().join("relay.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nportals = [\"{NOWHERE}\"]\n[[target]]\niqn = \"iqn.2026-11.ex:gw\"\n\
             [[target.lun]]\nid = 0\nbackend = \"iscsi://127.0.0.1:9/iqn.2026-11.ex:array/0\"\nchap_relay = true\n"
        ),
    )
    .unwrap();
    let err = target_start_error(&["--config", cfg.to_str().unwrap()]);
    assert_past_the_check(&err, "chap_relay");
}

#[test]
fn accepts_insecure_no_auth_with_a_warning() {
    let warning = format!("insecure_no_auth: target(s) {DISK0} authenticate no host on {NOWHERE}");
    let err = target_start_error(&["--portal", NOWHERE, "--insecure-no-auth"]);
    assert_past_the_check(&err, "--insecure-no-auth");
    assert!(err.contains(&warning), "{err}");
    assert!(err.contains("discovery on"), "{err}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("t.toml");
    std::fs::write(
        &cfg,
        format!(
            "[server]\nportals = [\"{NOWHERE}\"]\ninsecure_no_auth = true\n\
             [[target]]\niqn = \"{DISK0}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n"
        ),
    )
    .unwrap();
    let err = target_start_error(&["--config", cfg.to_str().unwrap()]);
    assert_past_the_check(&err, "insecure_no_auth = true");
    assert!(err.contains(&warning), "{err}");
}

#[test]
fn accepts_unauthenticated_target_on_loopback_without_warning() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("t.log");
    let mut child = Command::new(BIN)
        .args(["target", "--portal", "127.0.0.1:0", "--lun", "mem:1MiB"])
        .env_remove("RUST_LOG")
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let out = BufReader::new(child.stdout.take().unwrap());
    let _proc = Proc(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in out.lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let line = rx
            .recv_timeout(left)
            .unwrap_or_else(|_| panic!("no listening line: {:?}", std::fs::read_to_string(&log)));
        if line.contains("listening on 127.0.0.1:") {
            break;
        }
    }
    let err = std::fs::read_to_string(&log).unwrap();
    assert!(
        !err.contains("insecure_no_auth") && !err.contains("discovery on"),
        "{err}"
    );
}
