//! Issue 31, item 5: every flag given beside `ipsan target --config` either applies (and the
//! startup line says so) or stops the start with an error naming it. Before, `--allow` and
//! `--seal required` beside `--config` were dropped without a word: the target admitted
//! everyone and served plaintext logins.
//!
//! Runs the real `ipsan` binary on loopback (port 0), each process killed on drop.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");
const IQN: &str = "iqn.2026-11.org.ipsan:flags";

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// What `ipsan target ARGS` did within 20 s.
enum Outcome {
    /// Exited; its stderr.
    Refused(String),
    /// Printed its `listening on` line; every stdout line up to it.
    Started(Vec<String>),
}

fn config(dir: &Path, extra: &str) -> PathBuf {
    let p = dir.join("ipsan.toml");
    std::fs::write(
        &p,
        format!(
            "[server]\nportals = [\"127.0.0.1:0\"]\n\n[[target]]\niqn = \"{IQN}\"\n{extra}[[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n"
        ),
    )
    .unwrap();
    p
}

fn secret(dir: &Path, name: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{name}-0123456789abcdef-secret")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
    p
}

fn run(args: &[&str]) -> Outcome {
    let mut child = Killed(
        Command::new(BIN)
            .arg("target")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    let out = child.0.stdout.take().unwrap();
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(line);
        }
    });
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut lines = Vec::new();
    loop {
        match rx.recv_timeout(Duration::from_millis(100)) {
            Ok(l) => {
                let listening = l.contains(": listening on ");
                lines.push(l);
                if listening {
                    return Outcome::Started(lines);
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = child.0.wait();
                let mut err = String::new();
                use std::io::Read as _;
                child
                    .0
                    .stderr
                    .take()
                    .unwrap()
                    .read_to_string(&mut err)
                    .unwrap();
                return Outcome::Refused(err);
            }
        }
        assert!(
            Instant::now() < deadline,
            "target neither started nor exited: {lines:?}"
        );
    }
}

/// `--config FILE FLAGS` must stop the start with an error naming `flag`.
fn assert_refused(flags: &[&str], flag: &str) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let mut args = vec!["--config", cfg.to_str().unwrap()];
    args.extend_from_slice(flags);
    match run(&args) {
        Outcome::Refused(err) => assert!(
            err.contains(flag) && err.contains("--config"),
            "error does not name {flag}: {err}"
        ),
        Outcome::Started(lines) => {
            panic!("started with {flags:?} beside --config, dropping it: {lines:?}")
        }
    }
}

#[test]
fn rejects_allow_beside_config() {
    assert_refused(&["--allow", "iqn.2000-01.com.nobody:x"], "--allow");
}

#[test]
fn rejects_seal_required_beside_config() {
    assert_refused(&["--seal", "required"], "--seal");
}

#[test]
fn rejects_seal_off_beside_config() {
    assert_refused(&["--seal", "off"], "--seal");
}

#[test]
fn rejects_seal_secret_file_beside_config() {
    let dir = tempfile::tempdir().unwrap();
    let s = secret(dir.path(), "seal.secret");
    assert_refused(
        &["--seal-secret-file", s.to_str().unwrap()],
        "--seal-secret-file",
    );
}

#[test]
fn rejects_chap_secret_file_beside_config() {
    let dir = tempfile::tempdir().unwrap();
    let s = secret(dir.path(), "chap.secret");
    assert_refused(
        &["--chap-secret-file", s.to_str().unwrap()],
        "--chap-secret-file",
    );
}

#[test]
fn rejects_mutual_secret_file_beside_config() {
    let dir = tempfile::tempdir().unwrap();
    let s = secret(dir.path(), "mutual.secret");
    assert_refused(
        &["--mutual-secret-file", s.to_str().unwrap()],
        "--mutual-secret-file",
    );
}

#[test]
fn rejects_iqn_lun_and_chap_user_beside_config() {
    assert_refused(&["--iqn", "iqn.2026-11.org.ipsan:other"], "--iqn");
    assert_refused(&["--lun", "mem:1MiB"], "--lun");
    let dir = tempfile::tempdir().unwrap();
    let s = secret(dir.path(), "chap.secret");
    assert_refused(
        &[
            "--chap-user",
            "alice",
            "--chap-secret-file",
            s.to_str().unwrap(),
        ],
        "--chap-user",
    );
}

#[test]
fn rejects_ceph_id_beside_a_config_without_rbd_luns() {
    assert_refused(&["--ceph-id", "ipsan"], "--ceph-id");
}

#[test]
fn rejects_a_chap_secret_file_without_chap_user_on_the_command_line() {
    // Without --config too: a secret file with no user would silently leave CHAP off.
    let dir = tempfile::tempdir().unwrap();
    let s = secret(dir.path(), "chap.secret");
    match run(&[
        "--portal",
        "127.0.0.1:0",
        "--chap-secret-file",
        s.to_str().unwrap(),
    ]) {
        Outcome::Refused(err) => assert!(err.contains("--chap-user"), "{err}"),
        Outcome::Started(l) => panic!("started with CHAP silently off: {l:?}"),
    }
}

/// The flags that apply beside `--config` do, and the startup line names each.
#[test]
fn accepts_server_flags_beside_config_and_names_them_in_the_startup_line() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let Outcome::Started(lines) = run(&[
        "--config",
        cfg.to_str().unwrap(),
        "--portal",
        "127.0.0.1:0",
        "--queue-depth",
        "8",
        "--relative-port-id",
        "3",
        "--crypto-workers",
        "2",
        "--tcp-sndbuf",
        "1MiB",
    ]) else {
        panic!("refused server flags beside --config")
    };
    let line = lines
        .iter()
        .find(|l| l.starts_with("ipsan target: configuration "))
        .unwrap_or_else(|| panic!("no configuration line: {lines:?}"));
    for flag in [
        "--portal 127.0.0.1:0",
        "--queue-depth 8",
        "--relative-port-id 3",
        "--crypto-workers 2",
        "--tcp-*",
    ] {
        assert!(line.contains(flag), "{flag} not named: {line}");
    }
    assert!(line.contains(cfg.to_str().unwrap()), "{line}");
}

/// The restrictions the file itself gives still start fine (the file is the place for them).
#[test]
fn accepts_allow_and_seal_required_from_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let s = secret(dir.path(), "seal.secret");
    let cfg = config(
        dir.path(),
        &format!(
            "allow = [\"iqn.2000-01.com.somebody:x\"]\n[target.seal]\npolicy = \"required\"\nsecret_file = \"{}\"\n",
            s.display()
        ),
    );
    let Outcome::Started(lines) = run(&["--config", cfg.to_str().unwrap()]) else {
        panic!("refused a valid file")
    };
    assert!(
        lines
            .iter()
            .any(|l| l == &format!("ipsan target: configuration {}", cfg.display())),
        "{lines:?}"
    );
}

/// Starts `ipsan target ARGS` and returns it with its portal.
fn start(args: &[&str]) -> (Killed, String) {
    let mut child = Killed(
        Command::new(BIN)
            .arg("target")
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let out = child.0.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let portal = lines
        .by_ref()
        .map_while(Result::ok)
        .find_map(|l| {
            l.strip_prefix("ipsan target: listening on ")
                .map(str::to_owned)
        })
        .expect("target did not start");
    // Keep draining stdout so the target never blocks on it.
    std::thread::spawn(move || for _ in lines.map_while(Result::ok) {});
    (child, portal)
}

fn discover(portal: &str) -> (bool, String) {
    let o = Command::new(BIN)
        .args(["discover", &format!("iscsi://{portal}")])
        .output()
        .unwrap();
    (
        o.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&o.stdout),
            String::from_utf8_lossy(&o.stderr)
        ),
    )
}

/// Discovery is never sealed (docs/seal.md §7): what it shows can be turned off, from the
/// command line and from the file, and is served by default.
#[test]
fn rejects_discovery_logins_when_discovery_is_turned_off() {
    let (_t, portal) = start(&["--portal", "127.0.0.1:0", "--lun", "mem:1MiB"]);
    let (ok, out) = discover(&portal);
    assert!(ok && out.contains("iqn.2026-11.org.ipsan:disk0"), "{out}");

    let (_t, portal) = start(&[
        "--portal",
        "127.0.0.1:0",
        "--lun",
        "mem:1MiB",
        "--no-discovery",
    ]);
    let (ok, out) = discover(&portal);
    assert!(!ok, "discovery served with --no-discovery: {out}");
    assert!(!out.contains("iqn.2026-11.org.ipsan:disk0"), "{out}");

    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), "");
    let text = std::fs::read_to_string(&cfg).unwrap();
    std::fs::write(&cfg, format!("[discovery]\nenabled = false\n\n{text}")).unwrap();
    let (_t, portal) = start(&["--config", cfg.to_str().unwrap()]);
    let (ok, out) = discover(&portal);
    assert!(
        !ok,
        "discovery served with [discovery] enabled = false: {out}"
    );
    assert!(!out.contains(IQN), "{out}");
}

#[test]
fn rejects_no_discovery_beside_config() {
    assert_refused(&["--no-discovery"], "--no-discovery");
}
