//! Issue 30, the Linux NVMe/TCP host against `ipsan target --nvme-listen`: Debian 13's kernel
//! (6.12) under QEMU (`../shared/nvmevm`, TCG, ~45 s a run) runs `guest/nvme-test.sh` against
//! a RAM LUN served on this machine's loopback — `nvme discover`, `nvme connect`, mkfs.ext4,
//! a 64 MiB file and 300 small ones with their SHA-256, fsck, disconnect, connect again and
//! verify, O_DIRECT reads and writes — once plain, once with header and data digests and two
//! I/O queues; then against a target requiring DH-HMAC-CHAP (TP 8006): one-way, bidirectional
//! with digests, and a wrong secret refused; and with TLS 1.3 (TP 8011: the key made by `nvme
//! gen-tls-key`, inserted by `nvme check-tls-key`, the handshake by `tlshd`) together with
//! bidirectional DH-HMAC-CHAP, and a wrong TLS key refused. Two guest scripts of ours
//! (`crates/nvme-proto/tests/vm/`): `controller-admin.sh` (nvme-cli reads every admin structure,
//! Compare, Write Zeroes, DSM, `nvme reset`), and `keep-alive.sh` (the host's keep-alive timeout
//! while the test holds the target with SIGSTOP, then its reconnect). A missing harness or QEMU
//! fails the tests with the reason (`skip`). One VM at a time: the tests take a lock. Each test
//! boots the VM once: its scenarios against one target run one after another in that boot
//! (`run_guests`; a refused one first), so a boot's ~10 s under TCG is paid five times, not nine.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{spawn_ipsan_until, Proc};

const IQN: &str = "iqn.2026-11.org.ipsan:nvmevm";
const NQN: &str = "nqn.2026-11.org.ipsan:nvmevm";
/// The guest's host NQN (nvmevm's README).
const GUEST_HOSTNQN: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
/// Test secrets made by nvme-cli 2.13's `gen-dhchap-key` (`-m 1 --nqn GUEST_HOSTNQN`, `-m 2
/// --nqn NQN`, `-m 0`): the host's, the controller's, and one that is neither.
const HOST_SECRET: &str = "DHHC-1:01:nmYIwqxTLzzOol97bjJXtqV+LdIgrvtw6RcA6hwLr6ux1zNw:";
const CTRL_SECRET: &str =
    "DHHC-1:02:2jXsu5REC+/+iGEhSwk672YZWeldKDKjFveZ5ddNl4Fvz1LRSAiBmTFGC6tp+vQHw+2aaQ==:";
const WRONG_SECRET: &str = "DHHC-1:00:aBTraX76lFcUDME3h+EUQ7LMo3m5+aGVTuPbXbANUEAHZi8v:";
/// TLS keys made by nvme-cli 2.13's `gen-tls-key --hostnqn GUEST_HOSTNQN --subsysnqn NQN`
/// (twice: the target's, and one the target does not have).
const TLS_KEY: &str = "NVMeTLSkey-1:01:Qu4qQj0MpPsN7SWJMGrsFUMlKxAQYGMOVq/+5wudpm7bs6Pp:";
const WRONG_TLS_KEY: &str = "NVMeTLSkey-1:01:WoduifIsLG+dXfIlx41amgfSLUe3GZfdMs+jYx1evvJBZ5sK:";

/// One VM at a time (each takes 1.5 GB and two TCG vCPUs).
static VM: std::sync::Mutex<()> = std::sync::Mutex::new(());

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

/// `ipsan target` with a RAM LUN on loopback, iSCSI and NVMe/TCP on free ports, and `extra`
/// flags; returns the process and the NVMe/TCP port it announced.
fn target(log: &Path, extra: &[&str]) -> (Proc, u16) {
    let args = [
        &[
            "target",
            "--portal",
            "127.0.0.1:0",
            "--iqn",
            IQN,
            "--lun",
            "mem:256MiB",
            "--nvme-listen",
            "127.0.0.1:0",
        ][..],
        extra,
    ]
    .concat();
    spawn_ipsan_until(&args, log, "NVMe/TCP 'listening on'", |l| {
        (l.contains("listening on") && l.ends_with("(NVMe/TCP)")).then(|| {
            let addr = l.split_whitespace().rev().nth(1).unwrap();
            addr.rsplit(':').next().unwrap().parse().unwrap()
        })
    })
}

/// Several runs of the guest's host test against one target in ONE VM boot (a boot under TCG
/// costs about ten seconds before the script starts), in the order given: `runs` are (name, its
/// settings, whether it must pass). A wrapper runs nvmevm's `guest/nvme-test.sh` once per entry,
/// each in a fresh shell with only its own settings, prints `== run NAME` / `== end NAME` around
/// it and prefixes its RESULT line with `RUN NAME`; it ends with one RESULT of its own, ok only
/// when every run passed or failed as listed. Returns each run's RESULT line (unprefixed) and its
/// part of the console log (the kernel's lines included), having checked each against `runs`.
fn run_guests(
    vm: &Path,
    dir: &Path,
    name: &str,
    port: u16,
    runs: &[(&str, &[&str], bool)],
) -> Vec<(String, String)> {
    let test = std::fs::read_to_string(vm.join("guest/nvme-test.sh")).unwrap();
    let mut sh = String::from("#!/bin/sh\n# tests/nvme_linux.rs: runs of guest/nvme-test.sh\n");
    sh += "cat >/tmp/nvme-test.sh <<'IPSAN_NVME_TEST_EOF'\n";
    sh += &test;
    sh += if test.ends_with('\n') { "" } else { "\n" };
    sh += "IPSAN_NVME_TEST_EOF\nverdict=ok\n";
    for (run, env, ok) in runs {
        assert!(run.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'));
        assert!(env.iter().all(|e| !e.contains('\'')));
        let export: String = env.iter().map(|e| format!(" '{e}'")).collect();
        let export = if env.is_empty() {
            String::new()
        } else {
            format!("export{export}; ")
        };
        let want = if *ok { "ok" } else { "fail" };
        sh += &format!(
            "echo '== run {run}'; rm -f /tmp/result\n\
             ({export}sh /tmp/nvme-test.sh) 2>&1 | while IFS= read -r l; do\n\
             case \"$l\" in RESULT*) printf 'RUN {run} %s\\n' \"$l\"; printf '%s\\n' \"$l\" >/tmp/result ;;\n\
             *) printf '%s\\n' \"$l\" ;; esac\n\
             done\n\
             r=$(cat /tmp/result 2>/dev/null); case \"$r\" in 'RESULT ok'*) got=ok ;; *) got=fail ;; esac\n\
             [ \"$got\" = {want} ] || [ \"$verdict\" != ok ] || verdict=\"fail run {run}: not {want}: ${{r:-no RESULT line}}\"\n\
             echo '== end {run}'\n"
        );
    }
    let names: Vec<&str> = runs.iter().map(|r| r.0).collect();
    sh += &format!(
        "if [ \"$verdict\" = ok ]; then echo 'RESULT ok runs={}'; else echo \"RESULT $verdict\"; fi\n",
        names.join(",")
    );
    let script = dir.join(format!("{name}-runs.sh"));
    std::fs::write(&script, sh).unwrap();
    run_script(vm, &script, dir, name, port, &[], true, &mut |_| {});
    let log = std::fs::read(dir.join(format!("vm-{name}.log"))).unwrap_or_default();
    let log = String::from_utf8_lossy(&log);
    runs.iter()
        .map(|(run, _, ok)| {
            let begin = format!("== run {run}");
            let end = format!("== end {run}");
            let part: String = log
                .lines()
                .skip_while(|l| l.trim_end() != begin)
                .take_while(|l| l.trim_end() != end)
                .map(|l| format!("{l}\n"))
                .collect();
            let prefix = format!("RUN {run} ");
            let result = part
                .lines()
                .find_map(|l| l.strip_prefix(prefix.as_str()))
                .unwrap_or("no RESULT line")
                .trim_end()
                .to_owned();
            println!("{name}/{run}: {result}");
            assert_eq!(
                result.starts_with("RESULT ok"),
                *ok,
                "the Linux NVMe/TCP host ({name}/{run}):\n{part}"
            );
            (result, part)
        })
        .collect()
}

/// One VM boot running the guest script `script` with `PORT`, `SUBNQN` and `env`; its RESULT
/// line, which must be `RESULT ok` when `ok`. `watch` sees each console line as it appears. A
/// boot whose guest kernel failed before "NVMEVM ready" boots once more (`common::guest`).
#[allow(clippy::too_many_arguments)]
fn run_script(
    vm: &Path,
    script: &Path,
    dir: &Path,
    name: &str,
    port: u16,
    env: &[&str],
    ok: bool,
    watch: &mut dyn FnMut(&str),
) -> String {
    let log = dir.join(format!("vm-{name}.log"));
    let boot = || -> Result<String, String> {
        let mut cmd = Command::new(vm.join("run.sh"));
        cmd.args(["-q", "--timeout", "600", "--log"])
            .arg(&log)
            .arg("--script")
            .arg(script)
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
        let (mut lines_seen, mut bytes_seen) = (0, 0);
        let mut watch_lines = |final_read: bool| {
            let text =
                String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
            if text.len() < bytes_seen {
                lines_seen = 0; // run.sh booted again (a TCG panic) and started the log afresh
            }
            bytes_seen = text.len();
            // complete lines only, unless the VM is gone
            let done = if final_read {
                text.as_str()
            } else {
                text.rsplit_once('\n').map_or("", |(d, _)| d)
            };
            for l in done.lines().skip(lines_seen) {
                lines_seen += 1;
                watch(l.trim_end());
            }
        };
        let status = loop {
            if let Some(s) = child.0.try_wait().unwrap() {
                watch_lines(true);
                break s;
            }
            watch_lines(false);
            if started.elapsed() >= Duration::from_secs(630) {
                common::guest::stop(&mut child.0);
                return Err(format!(
                    "nvmevm ({name}) did not finish within 630 s:\n{}",
                    String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default())
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        };
        let out = String::from_utf8_lossy(&std::fs::read(&log).unwrap_or_default()).into_owned();
        let result = out
            .lines()
            .find(|l| l.starts_with("RESULT"))
            .unwrap_or("no RESULT line")
            .to_owned();
        println!("{name}: {result}");
        if (status.success() && result.starts_with("RESULT ok")) == ok {
            Ok(result)
        } else {
            Err(format!("the Linux NVMe/TCP host ({name}): {status}\n{out}"))
        }
    };
    common::guest::boot_once_more_after_oops("NVMEVM ready", boot).unwrap_or_else(|e| panic!("{e}"))
}

/// The harness and QEMU, or why the test is skipped.
fn harness() -> Option<PathBuf> {
    let Some(vm) = nvmevm() else {
        skip("../shared/nvmevm not found");
        return None;
    };
    if !have("qemu-system-x86_64") {
        skip("qemu-system-x86_64 not installed (scripts/install-deps)");
        return None;
    }
    Some(vm)
}

fn secret_file(dir: &Path, name: &str, secret: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{secret}\n")).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    p
}

#[test]
fn linux_nvme_tcp_host_keeps_a_filesystem_on_ipsan_plain_and_with_digests() {
    let Some(vm) = harness() else { return };
    let _one = VM.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let tlog = dir.path().join("target.log");
    let (_target, port) = target(&tlog, &[]);
    let runs = run_guests(
        &vm,
        dir.path(),
        "plain",
        port,
        &[
            ("plain", &[], true),
            ("digests", &["DIGEST=1", "QUEUES=2"], true),
        ],
    );
    let (plain, digests) = (&runs[0].0, &runs[1].0);
    assert!(plain.contains("discover=ok"), "{plain}");
    assert!(
        digests.contains("digest=1") && digests.contains("queues=2"),
        "{digests}"
    );
    let tl = std::fs::read_to_string(&tlog).unwrap_or_default();
    assert!(!tl.contains("panicked"), "target log:\n{tl}");
}

#[test]
fn linux_nvme_tcp_host_authenticates_with_dh_hmac_chap_and_a_wrong_secret_is_refused() {
    let Some(vm) = harness() else { return };
    let _one = VM.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let host = secret_file(dir.path(), "host.dhchap", HOST_SECRET);
    let ctrl = secret_file(dir.path(), "ctrl.dhchap", CTRL_SECRET);
    let tlog = dir.path().join("target.log");
    let flag = format!("{GUEST_HOSTNQN},{},{}", host.display(), ctrl.display());
    let (_target, port) = target(&tlog, &["--nvme-dhchap", &flag]);
    let secret = format!("DHCHAP_SECRET={HOST_SECRET}");
    let ctrl_secret = format!("DHCHAP_CTRL_SECRET={CTRL_SECRET}");
    let wrong_secret = format!("DHCHAP_SECRET={WRONG_SECRET}");
    // one boot; the wrong secret first, so the kernel's refusal in its part of the console log
    // can only be its own
    let runs = run_guests(
        &vm,
        dir.path(),
        "dhchap",
        port,
        &[
            ("dhchap-wrong", &[&wrong_secret], false),
            ("dhchap", &[&secret], true),
            (
                "dhchap-bidirectional",
                &[&secret, &ctrl_secret, "DIGEST=1"],
                true,
            ),
        ],
    );
    let (wrong, log) = &runs[0];
    let (one_way, both) = (&runs[1].0, &runs[2].0);
    assert!(one_way.contains("dhchap=on"), "{one_way}");
    assert!(both.contains("dhchap=on,bidirectional"), "{both}");
    assert!(wrong.contains("RESULT fail connect"), "{wrong}");
    assert!(
        log.contains("qid 0: authentication failed"),
        "refused by DH-HMAC-CHAP, not something else:\n{log}"
    );
    let tl = std::fs::read_to_string(&tlog).unwrap_or_default();
    assert!(!tl.contains("panicked"), "target log:\n{tl}");
}

#[test]
fn linux_nvme_tcp_host_over_tls_with_dh_hmac_chap_and_a_wrong_tls_key_is_refused() {
    let Some(vm) = harness() else { return };
    let _one = VM.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let host = secret_file(dir.path(), "host.dhchap", HOST_SECRET);
    let ctrl = secret_file(dir.path(), "ctrl.dhchap", CTRL_SECRET);
    let key = secret_file(dir.path(), "host.tlskey", TLS_KEY);
    let tlog = dir.path().join("target.log");
    let dhchap = format!("{GUEST_HOSTNQN},{},{}", host.display(), ctrl.display());
    let tls = format!("{GUEST_HOSTNQN},{}", key.display());
    let (_target, port) = target(&tlog, &["--nvme-dhchap", &dhchap, "--nvme-tls-key", &tls]);
    let (tls_key, wrong_tls_key) = (
        format!("TLS_KEY={TLS_KEY}"),
        format!("TLS_KEY={WRONG_TLS_KEY}"),
    );
    let secret = format!("DHCHAP_SECRET={HOST_SECRET}");
    let ctrl_secret = format!("DHCHAP_CTRL_SECRET={CTRL_SECRET}");
    // one boot; the wrong key first, so no key of an earlier run is in the guest's keyring when
    // it is refused (one left over could only make the right run fail, never the wrong one pass)
    let runs = run_guests(
        &vm,
        dir.path(),
        "tls",
        port,
        &[
            ("tls-wrong-key", &[&wrong_tls_key, &secret], false),
            ("tls-dhchap", &[&tls_key, &secret, &ctrl_secret], true),
        ],
    );
    let (wrong, both) = (&runs[0].0, &runs[1].0);
    assert!(
        both.contains("tls=on") && both.contains("dhchap=on,bidirectional"),
        "{both}"
    );
    assert!(wrong.contains("RESULT fail connect"), "{wrong}");
    let tl = std::fs::read_to_string(&tlog).unwrap_or_default();
    assert!(
        tl.contains("NVMe/TCP connection refused") && tl.contains("TLS handshake failed"),
        "the target refused the handshake of the wrong key:\n{tl}"
    );
    assert!(!tl.contains("panicked"), "target log:\n{tl}");
}

/// A guest script of this repository's (`crates/nvme-proto/tests/vm/`).
fn our_script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("crates/nvme-proto/tests/vm")
        .join(name)
}

#[test]
fn linux_nvme_tcp_host_reads_every_admin_structure_compares_and_survives_nvme_reset() {
    let Some(vm) = harness() else { return };
    let _one = VM.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let tlog = dir.path().join("target.log");
    let (_target, port) = target(&tlog, &[]);
    let script = our_script("controller-admin.sh");
    let mut seen = Vec::new();
    let r = run_script(
        &vm,
        &script,
        dir.path(),
        "admin",
        port,
        &[],
        true,
        &mut |l| {
            if l.starts_with("== ") || l.starts_with("compare: ") || l.starts_with("resv-report: ")
            {
                seen.push(l.to_owned());
            }
        },
    );
    assert!(r.contains("admin-probe"), "{r}");
    // every step ran, in order, and Compare of different data failed as a miscompare
    let steps: Vec<&str> = seen.iter().filter_map(|l| l.strip_prefix("== ")).collect();
    assert_eq!(
        steps,
        [
            "id-ctrl",
            "id-ns",
            "ns-descs",
            "list-ns",
            "smart-log",
            "fw-log",
            "error-log",
            "effects-log",
            "get-feature",
            "compare",
            "write-zeroes + dsm",
            "reservations",
            "reset"
        ],
        "{seen:?}"
    );
    assert!(
        seen.iter().any(|l| l.starts_with("compare: equal ok")
            && l.to_ascii_lowercase()
                .replace('_', " ")
                .contains("compare fail")),
        "Compare of different data is a Compare Failure: {seen:?}"
    );
    // Linux's host registered key 0xa1 and holds Write Exclusive (docs/nvme.md
    // "Reservations"), as nvme-cli's JSON of the extended report shows.
    assert!(
        seen.iter().any(|l| l.starts_with("resv-report: ")
            && l.contains("\"rtype\":1")
            && (l.contains("\"rkey\":161") || l.contains("\"rkey\":\"0xa1\""))
            && l.contains("\"rcsts\":1")),
        "Reservation Report after register + acquire: {seen:?}"
    );
    let tl = std::fs::read_to_string(&tlog).unwrap_or_default();
    assert!(!tl.contains("panicked"), "target log:\n{tl}");
}

#[test]
fn linux_nvme_tcp_host_times_out_keep_alive_when_ipsan_stops_answering_and_reconnects() {
    const KATO: u64 = 5;
    let Some(vm) = harness() else { return };
    let _one = VM.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    let dir = tempfile::tempdir().unwrap();
    let tlog = dir.path().join("target.log");
    let (target, port) = target(&tlog, &[]);
    let pid = target.0.id().to_string();
    let signal = |sig: &str| {
        let s = Command::new("kill").args([sig, &pid]).status().unwrap();
        assert!(s.success(), "kill {sig} {pid}: {s}");
    };
    let script = our_script("keep-alive.sh");
    let (mut stopped, mut stopped_for) = (None::<Instant>, None);
    let env = format!("KATO={KATO}");
    let r = run_script(
        &vm,
        &script,
        dir.path(),
        "keep-alive",
        port,
        &[&env],
        true,
        &mut |l| {
            if l.contains("KATO stop:") && stopped.is_none() && stopped_for.is_none() {
                signal("-STOP");
                stopped = Some(Instant::now());
            } else if l.contains("KATO cont:") {
                if let Some(t) = stopped.take() {
                    signal("-CONT");
                    stopped_for = Some(t.elapsed());
                }
            }
        },
    );
    // the guest saw the timeout only while the target was stopped, and not before KATO passed
    let stopped_for = stopped_for.expect("the target was stopped and continued");
    assert!(
        stopped_for >= Duration::from_secs(KATO),
        "the host reported a keep-alive timeout after only {stopped_for:?} (KATO {KATO} s)"
    );
    assert!(r.contains("reconnected=") && r.contains("data=same"), "{r}");
    println!("keep-alive: the target was stopped for {stopped_for:?}");
    let tl = std::fs::read_to_string(&tlog).unwrap_or_default();
    assert!(!tl.contains("panicked"), "target log:\n{tl}");
}

/// `common::guest`'s retry, as these tests use it: a boot whose guest kernel oopsed or panicked
/// before the guest was ready boots once more, and only once; a failure without one, or with an
/// Oops only after the guest was ready (where it could be the target's doing), is the test's at
/// once, and a boot that passes is not repeated.
#[test]
fn accepts_one_more_boot_only_after_the_guest_kernel_failed_before_it_was_ready() {
    use common::guest::boot_once_more_after_oops;
    const READY: &str = "NVMEVM ready: uptime 9.80s";
    let oops = "[    9.12] Oops: int3: 0000 [#1] PREEMPT SMP NOPTI\n\
                [    9.12] RIP: 0010:crng_make_state+0x1/0x1e0\n";
    let panic = "[    8.40] Kernel panic - not syncing: Attempted to kill init!\n";
    let booted = "NVMEVM booted: kernel 6.12.48+deb13-amd64, uptime 8.10s\n";
    let before = format!("{booted}{oops}RESULT fail connect\n");
    let after = format!("{booted}{READY}\n{oops}RESULT fail connect\n");
    let clean = format!("{booted}{READY}\nRESULT fail connect\n");
    // What each boot shows: passed, or failed with its console.
    type Boots<'a> = &'a [Result<(), String>];
    // (the boots; how many of them run; passed in the end)
    let cases: [(Boots, usize, bool); 6] = [
        (&[Ok(())], 1, true),
        (&[Err(before.clone()), Ok(())], 2, true),
        (&[Err(panic.to_owned()), Ok(())], 2, true),
        (
            &[Err(before.clone()), Err(before.clone()), Ok(())],
            2,
            false,
        ),
        (&[Err(after), Ok(())], 1, false),
        (&[Err(clean), Ok(())], 1, false),
    ];
    for (i, (boots, want_boots, want_ok)) in cases.iter().enumerate() {
        let mut n = 0;
        let got = boot_once_more_after_oops(READY, || {
            n += 1;
            boots[n - 1].clone()
        });
        assert_eq!(
            (n, got.is_ok()),
            (*want_boots, *want_ok),
            "case {i}: {got:?}"
        );
    }
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
