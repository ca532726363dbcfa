#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A lab killed mid-run leaves nothing behind: SIGINT/SIGTERM remove its namespaces and
//! children at once; after SIGKILL its children still die (PR_SET_PDEATHSIG) and the next
//! lab's sweep removes the namespaces. Needs root and a built `ipsan` binary ($IPSAN_BIN,
//! else target/{debug,release}/ipsan); prints SKIP otherwise. Each case is bounded (~40 s).

mod common;
use common::ipsan_bin;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One plain write at 8 ms lasting 30 s: long enough to be killed in the middle.
const PLAN: &str = r#"
name = "kill-test"
repetitions = 1
run_time = "30s"
min_rtts = 0
lun = "mem:64MiB"

[[matrix]]
delay = ["8ms"]
scheme = ["plain"]
depth = ["2"]
"#;

fn namespaces_of(pid: u32) -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    let prefix = format!("ipsanlab{pid}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Direct children of `pid` (target, bench, tunnels), from /proc.
fn children_of(pid: u32) -> Vec<u32> {
    let mut v = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(n) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{n}/stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let ppid: Option<u32> = rest.split_whitespace().nth(1).and_then(|s| s.parse().ok());
        if ppid == Some(pid) {
            v.push(n);
        }
    }
    v
}

fn alive(pid: u32) -> bool {
    // A zombie counts as dead: it no longer runs anything.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            s.rsplit_once(')')
                .and_then(|(_, r)| r.split_whitespace().next())
                .is_some_and(|state| state != "Z")
        })
        .unwrap_or(false)
}

/// Starts a lab and waits until its bench is running (the target and bench are children).
fn start_lab(exe: &Path, dir: &Path) -> (Child, Vec<u32>) {
    let plan = dir.join("plan.toml");
    std::fs::write(&plan, PLAN).unwrap();
    let mut child = Command::new(exe)
        .args(["lab", "run", "--quiet", "--plan"])
        .arg(&plan)
        .arg("--out")
        .arg(dir.join("out"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let pid = child.id();
    let t = Instant::now();
    loop {
        let kids = children_of(pid);
        // The bench is up (so is the target): the run is in its measured part. Short-lived
        // `ip` helpers are children too, so look for the bench by its command line.
        let bench = kids.iter().any(|k| {
            std::fs::read(format!("/proc/{k}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == b"bench"))
        });
        if bench && kids.len() >= 2 && !namespaces_of(pid).is_empty() {
            return (child, kids);
        }
        if let Some(st) = child.try_wait().unwrap() {
            panic!("the lab exited early with {st}");
        }
        if t.elapsed() > Duration::from_secs(40) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("the lab did not start its runs within 40 s");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn wait_until(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let t = Instant::now();
    while t.elapsed() < limit {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    f()
}

fn setup() -> Option<PathBuf> {
    if !ipsan_wan::link::is_root() {
        eprintln!("SKIP: needs root (namespaces)");
        return None;
    }
    let exe = ipsan_bin();
    if exe.is_none() {
        eprintln!("SKIP: no ipsan binary (cargo build -p ipsan, or set IPSAN_BIN)");
    }
    exe
}

fn signal(pid: u32, sig: &str) {
    let st = Command::new("kill")
        .args([sig, &pid.to_string()])
        .status()
        .unwrap();
    assert!(st.success());
}

#[test]
fn sigint_removes_namespaces_and_children() {
    let Some(exe) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (mut lab, kids) = start_lab(&exe, dir.path());
    let pid = lab.id();
    signal(pid, "-INT");
    let exited = wait_until(Duration::from_secs(20), || {
        lab.try_wait().unwrap().is_some()
    });
    if !exited {
        let _ = lab.kill();
    }
    let st = lab.wait().unwrap();
    assert!(exited, "the lab ignored SIGINT for 20 s");
    assert_eq!(st.code(), Some(128 + 2), "exit status {st}");
    assert!(
        wait_until(Duration::from_secs(5), || kids.iter().all(|k| !alive(*k))),
        "children outlived the lab: {kids:?}"
    );
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "namespaces left");
}

#[test]
fn sigkill_children_die_and_the_sweep_removes_namespaces() {
    let Some(exe) = setup() else { return };
    let dir = tempfile::tempdir().unwrap();
    let (mut lab, kids) = start_lab(&exe, dir.path());
    let pid = lab.id();
    lab.kill().unwrap();
    lab.wait().unwrap();
    assert!(
        wait_until(Duration::from_secs(10), || kids.iter().all(|k| !alive(*k))),
        "children outlived a SIGKILLed lab: {kids:?}"
    );
    // Nobody could clean the namespaces up; the next lab's sweep does.
    assert!(!namespaces_of(pid).is_empty());
    let swept = ipsan_lab::guard::sweep_stale();
    assert!(
        swept
            .iter()
            .any(|n| n.starts_with(&format!("ipsanlab{pid}-"))),
        "{swept:?}"
    );
    assert_eq!(namespaces_of(pid), Vec::<String>::new(), "namespaces left");
}
