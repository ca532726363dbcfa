//! Issue 15, `ipsan gateway`: real processes on loopback, real peers.
//!
//! The gateway pair of docs/gateway.md — host → gateway A (plain listening side) → sealed
//! leg (aes-256-gcm) → gateway B (`--seal required`) → plain → an array — with the array an
//! `ipsan target` file LUN or Debian's tgtd:
//!
//! - `ipsan bench --verify` through the pair, identity (VPD 83h/80h) equal to the array's,
//!   and a plain login to B refused (so the middle leg really is sealed);
//! - `qemu-img convert` in and out through the pair, hashes equal;
//! - tgtd behind a `--seal required` gateway, reached sealed by `ipsan bench --seal` and
//!   plain through gateway A; the gateway in front of tgtd (which answers MaxConnections=1)
//!   stays on one connection, gateway A in front of it (ipsan) uses four;
//! - the pair's sealed leg on four connections per remote session (the default when the far
//!   end is ipsan; issue 28), each with its own Seal login, under a verified host run;
//! - the sealed leg cut for 3 s under a verified host run: gateway A's remote session recovers
//!   (at ErrorRecoveryLevel 2 its connections log in again and their tasks are reassigned; if
//!   the far end ended the session meanwhile, a reinstating login sends the commands again)
//!   and the host sees no error;
//! - one sealed WAN connection of four cut at a time, three times, under a verified host run
//!   (issue 28's connection recovery): the lost connections' tasks are reassigned and sealed
//!   again under a live connection's keys, the connections log in again, nothing reaches the
//!   host, and the remote session is never logged in anew;
//! - the array down: a run in flight ends with errors (not a hang), a new host login is
//!   refused with a target error, and after the array returns the same gateway serves again;
//! - the Linux kernel initiator (`../shared/linuxvm`, under QEMU) through the pair, when the
//!   harness and qemu-system-x86_64 exist.
//!
//! Every process is killed by a Drop guard; files live in a temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{spawn_ipsan, Proc, Relay, BIN};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const IQN: &str = "iqn.2026-11.org.ipsan:gwtest";

/// A child process killed when dropped.
fn have(tool: &str) -> bool {
    Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success())
}

fn key_file(dir: &Path) -> PathBuf {
    let k = dir.join("wan.key");
    std::fs::write(&k, "gateway-test-secret-0123456789abcdef\n").unwrap();
    std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    k
}

/// Gateway B: `--seal required` in front of `array` (an iscsi:// URL without LUN).
fn gateway_b(dir: &Path, array: &str) -> (Proc, u16) {
    let key = key_file(dir);
    spawn_ipsan(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--seal",
            "required",
            "--seal-secret-file",
            key.to_str().unwrap(),
            "--to",
            array,
        ],
        &dir.join("b.log"),
    )
}

/// Gateway A: plain for hosts, sealed (aes-256-gcm) towards gateway B at `b_port`.
fn gateway_a(dir: &Path, b_port: u16, iqn: &str) -> (Proc, u16) {
    let key = key_file(dir);
    spawn_ipsan(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--seal",
            "aes-256-gcm",
            "--secret-file",
            key.to_str().unwrap(),
            "--to",
            &format!("iscsi://127.0.0.1:{b_port}/{iqn}"),
        ],
        &dir.join("a.log"),
    )
}

/// An ipsan target with one file LUN, then the gateway pair in front of it.
struct Pair {
    dir: tempfile::TempDir,
    array_port: u16,
    b_port: u16,
    a_port: u16,
    /// The sealed leg's relay (A connects to B through it), when asked for.
    wan: Option<Relay>,
    _procs: Vec<Proc>,
}

fn pair(lun_size: &str) -> Pair {
    pair_with(lun_size, false)
}

/// The pair, with gateway A's sealed leg to B through a [`Relay`] that a test can cut when
/// `cuttable`.
fn pair_with(lun_size: &str, cuttable: bool) -> Pair {
    let dir = tempfile::tempdir().unwrap();
    let img = dir.path().join("array.img");
    let (c, array_port) = spawn_ipsan(
        &[
            "target",
            "--portal",
            "127.0.0.1:0",
            "--iqn",
            IQN,
            "--lun",
            &format!("file:{},size={lun_size}", img.display()),
        ],
        &dir.path().join("c.log"),
    );
    let (b, b_port) = gateway_b(dir.path(), &format!("iscsi://127.0.0.1:{array_port}/{IQN}"));
    let wan = cuttable.then(|| Relay::start(b_port));
    let (a, a_port) = gateway_a(dir.path(), wan.as_ref().map_or(b_port, |r| r.port), IQN);
    Pair {
        dir,
        array_port,
        b_port,
        a_port,
        wan,
        _procs: vec![a, b, c],
    }
}

fn output(cmd: &str, args: &[&str]) -> std::process::Output {
    Command::new(cmd)
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("{cmd}: {e}"))
}

fn run_ok(cmd: &str, args: &[&str]) -> String {
    let o = output(cmd, args);
    assert!(
        o.status.success(),
        "{cmd} {args:?} failed ({}):\n{}{}",
        o.status,
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn bench_verify(url: &str, extra: &[&str]) -> String {
    let mut args = vec![
        "bench", url, "--rw", "randrw", "--bs", "64KiB", "--depth", "16", "--size", "16MiB",
        "--verify", "--quiet",
    ];
    args.extend_from_slice(extra);
    let out = run_ok(BIN, &args);
    assert!(out.contains("verify: OK"), "{out}");
    out
}

#[test]
fn gateway_pair_forwards_verified_io_and_the_arrays_identity() {
    let p = pair("64MiB");
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", p.a_port);
    let direct = format!("iscsi://127.0.0.1:{}/{IQN}/0", p.array_port);
    bench_verify(&via, &[]);
    // A host that asks for an R2T per write and no immediate data gets them on its own leg;
    // the remote leg negotiated ipsan's fast keys anyway (one WAN round trip per write).
    bench_verify(&via, &["--initial-r2t", "yes", "--immediate-data", "no"]);
    let a_log = std::fs::read_to_string(p.dir.path().join("a.log")).unwrap();
    assert!(
        a_log.contains("immediate_data=false initial_r2t=true"),
        "the host's keys: {a_log}"
    );
    let remote: Vec<&str> = a_log
        .lines()
        .filter(|l| l.contains("remote session open"))
        .collect();
    assert!(remote.len() >= 2, "{a_log}");
    for l in remote {
        assert!(l.contains("seal=\"aes-256-gcm\""), "{l}");
        assert!(l.contains("immediate_data=true initial_r2t=false"), "{l}");
    }
    if have("iscsi-inq") {
        for page in ["0x83", "0x80", "0xb0"] {
            let d = run_ok("iscsi-inq", &["-e", "1", "-c", page, &direct]);
            let g = run_ok("iscsi-inq", &["-e", "1", "-c", page, &via]);
            assert_eq!(d, g, "VPD {page} differs through the gateway pair");
        }
        // Gateway B requires Seal: a plain host login there is refused.
        let b = format!("iscsi://127.0.0.1:{}/{IQN}/0", p.b_port);
        assert!(!output("iscsi-inq", &[&b]).status.success());
    }
    // A host session's end logs its remote sessions out, at both gateways.
    std::thread::sleep(Duration::from_millis(300));
    let b_log = std::fs::read_to_string(p.dir.path().join("b.log")).unwrap();
    assert!(b_log.contains("remote session logged out"), "{b_log}");
}

/// The `key=value` fields of every log line holding `what`.
fn log_fields<'a>(log: &'a str, what: &str, key: &str) -> Vec<&'a str> {
    log.lines()
        .filter(|l| l.contains(what))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        })
        .collect()
}

#[test]
fn gateway_pair_carries_the_sealed_leg_on_four_connections_and_verifies_reads_and_writes() {
    // Default flags: gateway A's first login to B offers MaxConnections=4; B (ipsan) grants 4,
    // so every remote session of A is four sealed connections (each its own Seal login), and
    // B's remote sessions to the array (ipsan too) are four plain ones.
    let p = pair("64MiB");
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", p.a_port);
    bench_verify(&via, &[]);
    // Larger commands too (1 MiB, several Data-In/Data-Out PDUs each, spread over the four).
    let out = run_ok(
        BIN,
        &[
            "bench", &via, "--rw", "randrw", "--bs", "1MiB", "--depth", "8", "--size", "32MiB",
            "--verify", "--quiet",
        ],
    );
    assert!(out.contains("verify: OK"), "{out}");
    let a_log = std::fs::read_to_string(p.dir.path().join("a.log")).unwrap();
    let b_log = std::fs::read_to_string(p.dir.path().join("b.log")).unwrap();
    let granted = log_fields(&a_log, "the far end's MaxConnections", "granted");
    assert!(
        !granted.is_empty() && granted.iter().all(|n| *n == "4"),
        "A asks what B grants: {a_log}"
    );
    let a_open = log_fields(&a_log, "remote session open", "connections");
    assert!(
        a_open.len() >= 2 && a_open.iter().all(|n| *n == "4"),
        "every remote session of A on four connections: {a_log}"
    );
    for l in a_log.lines().filter(|l| l.contains("remote session open")) {
        assert!(l.contains("seal=\"aes-256-gcm\""), "{l}");
    }
    let b_open = log_fields(&b_log, "remote session open", "connections");
    assert!(
        !b_open.is_empty() && b_open.iter().all(|n| *n == "4"),
        "B's remote sessions to the array (ipsan) on four connections: {b_log}"
    );
    // No remote session fell back to one connection (B took every joining login).
    assert!(!a_log.contains("using one"), "{a_log}");
}

#[test]
fn gateway_with_connections_1_offers_one_connection_and_verifies() {
    // `--connections 1` keeps the one-connection remote session (with its own session
    // recovery), never asking the far end for more.
    let dir = tempfile::tempdir().unwrap();
    let (_c, array_port) = array(dir.path(), "127.0.0.1:0");
    let (_a, a_port) = spawn_ipsan(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--connections",
            "1",
            "--to",
            &format!("iscsi://127.0.0.1:{array_port}/{IQN}/0"),
        ],
        &dir.path().join("a.log"),
    );
    bench_verify(&format!("iscsi://127.0.0.1:{a_port}/{IQN}/0"), &[]);
    let a_log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    assert!(
        log_fields(&a_log, "the far end's MaxConnections", "granted").is_empty(),
        "{a_log}"
    );
    let open = log_fields(&a_log, "remote session open", "connections");
    assert!(
        !open.is_empty() && open.iter().all(|n| *n == "1"),
        "{a_log}"
    );
}

#[test]
fn qemu_img_convert_round_trips_through_the_gateway_pair() {
    if !have("qemu-img") {
        skip("qemu-img not installed (scripts/install-deps)");
        return;
    }
    let p = pair("8MiB");
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", p.a_port);
    let src = p.dir.path().join("src.raw");
    let back = p.dir.path().join("back.raw");
    let data: Vec<u8> = (0..8u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    std::fs::write(&src, &data).unwrap();
    run_ok(
        "qemu-img",
        &[
            "convert",
            "-n",
            "-f",
            "raw",
            "-O",
            "raw",
            src.to_str().unwrap(),
            &via,
        ],
    );
    run_ok(
        "qemu-img",
        &[
            "convert",
            "-f",
            "raw",
            "-O",
            "raw",
            &via,
            back.to_str().unwrap(),
        ],
    );
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len(), data.len());
    assert!(
        got == data,
        "data read back through the gateway pair differs"
    );
}

#[test]
fn tgtd_behind_a_seal_required_gateway_verifies_reads_and_writes_on_one_connection() {
    if !have("tgtd") || !have("tgtadm") {
        skip("tgtd not installed (scripts/install-deps)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ctl = (20000 + u32::from(port) % 10000).to_string();
    let img = dir.path().join("tgt.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let tgtd = Proc(
        Command::new("tgtd")
            .args([
                "-f",
                "-C",
                &ctl,
                "--iscsi",
                &format!("portal=127.0.0.1:{port}"),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let tiqn = "iqn.2026-11.org.ipsan:gwtest-tgtd";
    let adm = |args: &[&str]| {
        let mut a = vec!["-C", ctl.as_str(), "--lld", "iscsi"];
        a.extend_from_slice(args);
        output("tgtadm", &a).status.success()
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while !adm(&[
        "--mode",
        "target",
        "--op",
        "new",
        "--tid",
        "1",
        "--targetname",
        tiqn,
    ]) {
        assert!(Instant::now() < deadline, "tgtd did not come up");
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(adm(&[
        "--mode",
        "logicalunit",
        "--op",
        "new",
        "--tid",
        "1",
        "--lun",
        "1",
        "--backing-store",
        img.to_str().unwrap()
    ]));
    assert!(adm(&[
        "--mode",
        "target",
        "--op",
        "bind",
        "--tid",
        "1",
        "--initiator-address",
        "ALL"
    ]));
    let (b, b_port) = gateway_b(dir.path(), &format!("iscsi://127.0.0.1:{port}/{tiqn}"));
    let key = dir.path().join("wan.key");
    // ipsan's own initiator, sealed, straight to the gateway in front of tgtd.
    bench_verify(
        &format!("iscsi://127.0.0.1:{b_port}/{tiqn}/1"),
        &[
            "--seal",
            "aes-256-gcm",
            "--secret-file",
            key.to_str().unwrap(),
        ],
    );
    // And a plain host through the whole pair.
    let (a, a_port) = gateway_a(dir.path(), b_port, tiqn);
    bench_verify(&format!("iscsi://127.0.0.1:{a_port}/{tiqn}/1"), &[]);
    // tgtd answers MaxConnections=1: gateway B asked once and stays on one connection; A in
    // front of B (ipsan) gets four.
    let b_log = std::fs::read_to_string(dir.path().join("b.log")).unwrap();
    let a_log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    let granted = log_fields(&b_log, "the far end's MaxConnections", "granted");
    assert!(
        !granted.is_empty() && granted.iter().all(|n| *n == "1"),
        "{b_log}"
    );
    let b_open = log_fields(&b_log, "remote session open", "connections");
    assert!(
        b_open.len() >= 2 && b_open.iter().all(|n| *n == "1"),
        "every remote session to tgtd on one connection: {b_log}"
    );
    let a_open = log_fields(&a_log, "remote session open", "connections");
    assert!(
        !a_open.is_empty() && a_open.iter().all(|n| *n == "4"),
        "{a_log}"
    );
    drop((a, b, tgtd));
}

/// The array: an ipsan target with a 64 MiB file LUN in `dir` (kept across restarts) on
/// `portal`, logging to `dir/c.log`.
fn array(dir: &Path, portal: &str) -> (Proc, u16) {
    let lun = format!("file:{},size=64MiB", dir.join("array.img").display());
    spawn_ipsan(
        &["target", "--portal", portal, "--iqn", IQN, "--lun", &lun],
        &dir.join("c.log"),
    )
}

#[test]
fn array_down_fails_commands_and_refuses_logins_then_serves_again() {
    let dir = tempfile::tempdir().unwrap();
    let start_array = |portal: &str| array(dir.path(), portal);
    let (c, array_port) = start_array("127.0.0.1:0");
    // With the LUN in the URL the gateway starts without asking the array anything.
    let (_a, a_port) = spawn_ipsan(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--to",
            &format!("iscsi://127.0.0.1:{array_port}/{IQN}/0"),
            // The remote leg gives up after 3 s (default 120 s) ...
            "--recovery-timeout",
            "3s",
        ],
        &dir.path().join("a.log"),
    );
    let via = format!("iscsi://127.0.0.1:{a_port}/{IQN}/0");
    bench_verify(&via, &[]);
    // A run in flight when the array dies ends, with an error, well before its 60 s (the host
    // does not recover either: it sees the path failure).
    let started = Instant::now();
    let mut run = Proc(
        Command::new(BIN)
            .args(["bench", &via, "--rw", "write", "--time", "60s", "--quiet"])
            .args(["--recovery-timeout", "0"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    std::thread::sleep(Duration::from_secs(2));
    drop(c);
    let status = loop {
        if let Some(s) = run.0.try_wait().unwrap() {
            break s;
        }
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the host's run hangs after the array died"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(
        !status.success(),
        "the run reported success with the array gone"
    );
    // ... and so its remote session is gone: a new host login is refused with a target error
    // while the array is down.
    let o = output(BIN, &["inquiry", &via]);
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("0x0301") || err.to_lowercase().contains("unavailable"),
        "{err}"
    );
    let a_log = std::fs::read_to_string(dir.path().join("a.log")).unwrap();
    assert!(a_log.contains("refusing the login"), "{a_log}");
    // The array back on its port: the same gateway serves new sessions.
    let (_c2, _) = start_array(&format!("127.0.0.1:{array_port}"));
    bench_verify(&via, &[]);
}

/// A host's `ipsan bench` writing 64 KiB at depth 16 through `url` and verifying it, with no
/// session recovery of its own (what a host that knows nothing of ipsan would do), for the
/// tests that break something behind the gateway while it runs. `amount`: `--size` or `--time`.
fn spawn_verified_writes(url: &str, amount: &[&str]) -> Child {
    Command::new(BIN)
        .args([
            "bench", url, "--rw", "write", "--bs", "64KiB", "--depth", "16",
        ])
        .args(amount)
        .args(["--verify", "--quiet", "--recovery-timeout", "0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn array_restart_within_the_recovery_timeout_is_invisible_to_a_sealed_host_run() {
    // A plain host -> gateway A -> sealed leg -> gateway B -> array; the array is killed in the
    // middle of a verified run and comes back on its port 3 s later. Gateway B's remote
    // session to the array recovers (reinstating login, commands sent again) and the host's
    // run completes with every block verified: latency, not errors.
    let dir = tempfile::tempdir().unwrap();
    let start_array = |portal: &str| array(dir.path(), portal);
    let (c, array_port) = start_array("127.0.0.1:0");
    let (b, b_port) = gateway_b(
        dir.path(),
        &format!("iscsi://127.0.0.1:{array_port}/{IQN}/0"),
    );
    let (a, a_port) = gateway_a(dir.path(), b_port, IQN);
    let via = format!("iscsi://127.0.0.1:{a_port}/{IQN}/0");
    let run = spawn_verified_writes(&via, &["--size", "48MiB"]);
    std::thread::sleep(Duration::from_millis(700));
    drop(c);
    std::thread::sleep(Duration::from_secs(3));
    let (_c2, _) = start_array(&format!("127.0.0.1:{array_port}"));
    let out = run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let b_log = std::fs::read_to_string(dir.path().join("b.log")).unwrap_or_default();
    assert!(
        out.status.success() && stdout.contains("verify: OK"),
        "host run failed across the array restart:\n{stdout}\n{}\ngateway B:\n{b_log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        b_log.contains("recovered"),
        "gateway B did not recover its remote session:\n{b_log}"
    );
    drop((a, b));
}

#[test]
fn sealed_leg_cut_under_a_verified_host_run_is_recovered_by_gateway_a() {
    // Host (plain `ipsan bench --verify`, no recovery of its own) -> gateway A -> relay
    // standing for the WAN -> gateway B -> array. Once the writes flow, the relay closes the
    // sealed connection and refuses new ones for 3 s. Gateway A's remote session must recover
    // by itself (reinstating login with fresh Seal keys, the host's forwarded commands sent
    // again) so the host's run ends with every block verified, and A fails nothing back to
    // the host.
    let p = pair_with("256MiB", true);
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", p.a_port);
    let mut run = spawn_verified_writes(&via, &["--time", "7s"]);
    // Cut once the host's writes are flowing through the pair (the array's file has taken
    // 32 MiB), not at a fixed time: on a loaded machine the host's login through A (and A's
    // own remote login) can take longer than any fixed wait, and a cut before the traffic
    // starts tests nothing.
    let img = p.dir.path().join("array.img");
    let flowing = Instant::now();
    while std::fs::metadata(&img).map_or(0, |m| std::os::unix::fs::MetadataExt::blocks(&m) * 512)
        < 8 << 20
    {
        assert!(
            run.try_wait().unwrap().is_none(),
            "the host run ended before its writes reached the array"
        );
        assert!(
            flowing.elapsed() < Duration::from_secs(60),
            "no write reached the array within 60 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p.wan.as_ref().unwrap().ctl.cut_for(Duration::from_secs(3));
    // The run (7 s of writes from its start) outlived the 3 s cut, so the cut met a busy
    // session rather than the end of the run.
    let after_cut = run.try_wait().unwrap();
    let out = run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let a_log = std::fs::read_to_string(p.dir.path().join("a.log")).unwrap_or_default();
    assert!(
        out.status.success() && stdout.contains("verify: OK"),
        "host run failed across the cut of the sealed leg:\n{stdout}\n{}\ngateway A:\n{a_log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        after_cut.is_none(),
        "the host run ended during the cut ({after_cut:?}):\n{stdout}"
    );
    let recovered: Vec<&str> = a_log
        .lines()
        .filter(|l| l.contains("session recovered"))
        .collect();
    if recovered.is_empty() {
        // ErrorRecoveryLevel 2 (the default between two ipsan gateways): the session outlived
        // the cut at both ends, its connections logged in again and their tasks were
        // reassigned; nothing was failed back (the host run verified, above).
        assert!(
            a_log.contains("connection logged in again"),
            "gateway A recovered neither its connections nor its session:\n{a_log}"
        );
        assert!(!a_log.contains("TASK REASSIGN refused"), "{a_log}");
        println!("gateway A: the remote session's connections were recovered at ERL 2");
        return;
    }
    // The far end ended the session meanwhile (none of its tasks held when its last
    // connection went): a new login, commands sent again.
    assert_eq!(
        recovered.len(),
        1,
        "gateway A should recover its remote session exactly once:\n{a_log}"
    );
    let reissued: u64 = recovered[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("reissued="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no reissued= count in {:?}", recovered[0]));
    let failed: u64 = recovered[0]
        .split_whitespace()
        .find_map(|w| w.strip_prefix("failed_not_idempotent="))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no failed_not_idempotent= count in {:?}", recovered[0]));
    println!("gateway A: {}", recovered[0]);
    // How many of the host's forwarded commands A had on the wire at the cut is timing: since
    // the CPace key exchange (issue 31), a loaded machine sometimes cuts while every command A
    // holds is still queued behind gateway B's CmdSN window (the engine counts those as never
    // sent), so none needs sending again (reissued=0 in about 1 of 3 loaded runs, with the host
    // run verified and nothing failed; cause of the shift not found yet, see the closing note
    // of issue 31). What must hold either way: nothing was failed back, every block verified
    // (above). That commands in flight at a loss are sent again is asserted deterministically
    // by iscsi-proto's session tests and crates/ipsan-initiator/tests/recovery.rs.
    assert_eq!(
        failed, 0,
        "a cut must fail nothing back to the host: {}\ngateway A:\n{a_log}",
        recovered[0]
    );
    if reissued == 0 {
        println!("note: no command was on the wire at the cut (all queued behind the window)");
    }
}

/// Issue 28's evidence, shortened: host (plain `ipsan bench --verify`, no recovery of its own)
/// -> gateway A -> relay standing for the WAN -> gateway B -> array, gateway A's remote
/// session on four sealed connections at ErrorRecoveryLevel 2 (both gateways' default). Once
/// the host's I/O flows, the relay cuts one WAN connection (the oldest running) three times,
/// `IPSAN_CUT_EVERY` apart (default 2 s). Each cut's tasks are reassigned to a live
/// connection (writes sealed again under its keys) and the connection logs in again: the
/// host's run verifies with no error, gateway A never logs its remote session in anew (the
/// ERL 0 path) and no TASK REASSIGN is refused. The full-minute run (a cut every 10 s) is in
/// docs/results/gateway-cuts.
#[test]
fn gateway_pair_wan_connections_cut_one_at_a_time_fail_nothing_back_to_a_verified_host() {
    let every = std::env::var("IPSAN_CUT_EVERY")
        .ok()
        .and_then(|s| s.parse().ok())
        .map_or(Duration::from_secs(2), Duration::from_secs_f64);
    let cuts: usize = std::env::var("IPSAN_CUTS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(3);
    let p = pair_with("256MiB", true);
    let wan = p.wan.as_ref().unwrap();
    let via = format!("iscsi://127.0.0.1:{}/{IQN}/0", p.a_port);
    let trace = p.dir.path().join("host.trace");
    let secs = format!("{:.1}s", every.as_secs_f64() * (cuts as f64 + 1.5));
    let mut run = Command::new(BIN)
        .args([
            "bench",
            via.as_str(),
            "--rw",
            "randrw",
            "--bs",
            "64KiB",
            "--depth",
            "16",
            "--time",
            secs.as_str(),
            "--verify",
            "--quiet",
            "--recovery-timeout",
            "0",
            "--trace",
            trace.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let start = Instant::now();
    let unix = || {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64()
    };
    let spawned_unix = unix();
    let mut made_unix = Vec::new();
    while wan.ctl.running() < 4 {
        assert!(
            run.try_wait().unwrap().is_none(),
            "the host run ended before gateway A's four WAN connections were up"
        );
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "gateway A's remote session never had four connections through the relay"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let mut made = Vec::new();
    for _ in 0..cuts {
        std::thread::sleep(every);
        assert!(wan.ctl.cut_one(), "no WAN connection running to cut");
        made.push(start.elapsed());
        made_unix.push(unix());
    }
    let after_cuts = run.try_wait().unwrap();
    let out = run.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let a_log = std::fs::read_to_string(p.dir.path().join("a.log")).unwrap_or_default();
    assert!(
        out.status.success() && stdout.contains("verify: OK"),
        "host run failed across the WAN connection cuts:\n{stdout}\n{}\ngateway A:\n{a_log}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        after_cuts.is_none(),
        "the host run ended before the last cut ({after_cuts:?}): the cuts met no I/O"
    );
    let erl = log_fields(&a_log, "remote session open", "erl");
    let conns = log_fields(&a_log, "remote session open", "connections");
    assert!(
        !erl.is_empty() && erl.iter().all(|e| *e == "2") && conns.iter().all(|n| *n == "4"),
        "gateway A's remote sessions: four connections at ErrorRecoveryLevel 2:\n{a_log}"
    );
    let lost = a_log
        .lines()
        .filter(|l| l.contains("connection lost; its tasks are reassigned"))
        .count();
    let back = a_log
        .lines()
        .filter(|l| l.contains("connection logged in again"))
        .count();
    assert!(
        lost >= cuts && back >= cuts,
        "{cuts} cuts: {lost} connections lost, {back} logged in again:\n{a_log}"
    );
    assert!(
        !a_log.contains("session recovered") && !a_log.contains("logging in again"),
        "the remote session was logged in anew (ERL 0's recovery), not its connections:\n{a_log}"
    );
    assert!(!a_log.contains("TASK REASSIGN refused"), "{a_log}");
    // The throughput around each cut, from the host's trace (completed commands per 0.5 s).
    let text = std::fs::read_to_string(&trace).unwrap();
    let mut bins = std::collections::BTreeMap::<u64, u64>::new();
    for l in text.lines().skip(1) {
        if l.contains("\"event\":\"completed\"") {
            let t: f64 = l
                .split("\"t_us\":")
                .nth(1)
                .and_then(|r| r.split(',').next())
                .and_then(|n| n.parse().ok())
                .unwrap();
            *bins.entry((t / 500_000.0) as u64).or_default() += 1;
        }
    }
    println!(
        "cuts at {made:?}; {lost} connections lost, {back} logged in again; commands completed \
         per 0.5 s: {:?}",
        bins.values().collect::<Vec<_>>()
    );
    // The full-minute run of docs/results/gateway-cuts keeps its raw data.
    if let Some(out_dir) = std::env::var_os("IPSAN_CUTS_OUT") {
        let out_dir = PathBuf::from(out_dir);
        std::fs::create_dir_all(&out_dir).unwrap();
        std::fs::copy(&trace, out_dir.join("host.trace.jsonl")).unwrap();
        for log in ["a.log", "b.log", "c.log"] {
            let _ = std::fs::copy(p.dir.path().join(log), out_dir.join(log));
        }
        let cuts_at: Vec<String> = made_unix.iter().map(|t| format!("{t:.3}")).collect();
        std::fs::write(
            out_dir.join("cuts.txt"),
            format!(
                "# unix time of the host run's start, then of each cut (seconds)\n{spawned_unix:.3}\n{}\n",
                cuts_at.join("\n")
            ),
        )
        .unwrap();
        std::fs::write(out_dir.join("host.stdout"), stdout.as_bytes()).unwrap();
    }
}

/// The harness beside the clone (CI has `shared/` next to it), else this machine's.
fn linuxvm() -> Option<PathBuf> {
    [
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/linuxvm"),
        PathBuf::from("/work/shared/linuxvm"),
    ]
    .into_iter()
    .find(|p| p.join("run.sh").exists())
}

#[test]
fn linux_kernel_initiator_stores_a_filesystem_through_a_sealed_gateway_pair() {
    let Some(vm) = linuxvm() else {
        skip("../shared/linuxvm not found");
        return;
    };
    if !have("qemu-system-x86_64") {
        skip("qemu-system-x86_64 not installed (scripts/install-deps)");
        return;
    }
    let p = pair("256MiB");
    let log = p.dir.path().join("vm.log");
    // A guest kernel that fails before "LINUXVM ready" boots once more (`common::guest`).
    common::guest::boot_once_more_after_oops("LINUXVM ready", || {
        let mut run_sh = Command::new(vm.join("run.sh"));
        run_sh.args([&format!("127.0.0.1:{}", p.a_port), IQN]);
        common::guest::linuxvm_result(run_sh, &log, "through the gateway pair")
    })
    .unwrap_or_else(|e| panic!("{e}"));
    // The kernel's one connection to gateway A; the WAN leg behind it on four (issue 28).
    let a_log = std::fs::read_to_string(p.dir.path().join("a.log")).unwrap_or_default();
    let conns = log_fields(&a_log, "remote session open", "connections");
    assert!(
        !conns.is_empty() && conns.iter().all(|n| *n == "4"),
        "the WAN leg behind the Linux initiator runs four connections:\n{a_log}"
    );
}

/// A peer this test needs is missing: fail with the reason (CI installs everything through
/// scripts/install-deps), unless IPSAN_ALLOW_SKIP=1 says a skip is wanted on this machine, in
/// which case it says so and the test returns — a skip is never silent.
fn skip(reason: &str) {
    if std::env::var_os("IPSAN_ALLOW_SKIP").is_some_and(|v| v == "1") {
        println!("SKIP (IPSAN_ALLOW_SKIP=1): {reason}");
    } else {
        panic!("{reason}; set IPSAN_ALLOW_SKIP=1 to skip this test on purpose");
    }
}
