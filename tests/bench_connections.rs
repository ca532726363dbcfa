//! `ipsan bench --connections N` (issue 28), end to end with the real `ipsan target` and
//! `ipsan bench --verify` processes: four connections of one session carry a verified
//! random read/write mix, plain and sealed (each connection with its own Seal login), with
//! either `--spread`; a target configured for one connection per session gets one; and the
//! default (`--connections 1`) is the one-connection session as before.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{spawn_ipsan, BIN};
use std::path::{Path, PathBuf};
use std::process::Command;

const IQN: &str = "iqn.2026-11.org.ipsan:connections";

fn key_file(dir: &Path) -> PathBuf {
    let k = dir.join("seal.key");
    std::fs::write(&k, "connections-test-secret-0123456789ab\n").unwrap();
    std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    k
}

fn target(dir: &Path, extra: &[&str], name: &str) -> (common::Proc, u16) {
    let mut args = vec!["target"];
    if !extra.contains(&"--config") {
        args.extend_from_slice(&[
            "--portal",
            "127.0.0.1:0",
            "--iqn",
            IQN,
            "--lun",
            "mem:64MiB",
        ]);
    }
    args.extend_from_slice(extra);
    spawn_ipsan(&args, &dir.join(format!("{name}.log")))
}

/// `ipsan bench --verify` (random mix, 16 MiB) with `extra` flags; its stdout.
fn bench(port: u16, extra: &[&str]) -> String {
    let url = format!("iscsi://127.0.0.1:{port}/{IQN}/0");
    let mut args = vec![
        "bench",
        url.as_str(),
        "--rw",
        "randrw",
        "--bs",
        "64KiB",
        "--depth",
        "16",
        "--size",
        "16MiB",
        "--verify",
        "--quiet",
    ];
    args.extend_from_slice(extra);
    let o = Command::new(BIN).args(&args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout).into_owned();
    assert!(
        o.status.success() && out.contains("verify: OK"),
        "bench {args:?} failed ({}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    out
}

/// The commands each connection carried, from bench's `connections:` line.
fn per_connection(out: &str) -> (usize, Vec<u64>) {
    let line = out
        .lines()
        .find(|l| l.starts_with("connections: "))
        .unwrap_or_else(|| panic!("no connections line:\n{out}"));
    let granted = line["connections: ".len()..]
        .split(' ')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let counts = line
        .rsplit("(CID:n): ")
        .next()
        .unwrap()
        .split(' ')
        .map(|p| p.split(':').nth(1).unwrap().parse().unwrap())
        .collect();
    (granted, counts)
}

#[test]
fn accepts_verified_bench_runs_over_four_connections_plain_and_sealed_with_either_spread() {
    let dir = tempfile::tempdir().unwrap();
    let key = key_file(dir.path());
    let key = key.to_str().unwrap();
    let (_plain, plain) = target(dir.path(), &[], "plain");
    let (_sealed, sealed) = target(
        dir.path(),
        &["--seal", "required", "--seal-secret-file", key],
        "sealed",
    );
    let seal = ["--seal", "aes-256-gcm", "--secret-file", key];
    for (port, is_sealed) in [(plain, false), (sealed, true)] {
        for spread in ["least-bytes", "round-robin"] {
            let mut extra = vec!["--connections", "4", "--spread", spread];
            if is_sealed {
                extra.extend_from_slice(&seal);
            }
            let out = bench(port, &extra);
            let (granted, counts) = per_connection(&out);
            assert_eq!(granted, 4, "{out}");
            assert_eq!(counts.len(), 4, "{out}");
            assert!(
                counts.iter().all(|n| *n >= 16),
                "sealed={is_sealed} {spread}: every connection carried commands: {out}"
            );
        }
    }
}

#[test]
fn accepts_a_target_with_one_connection_per_session_and_uses_one() {
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("target.toml");
    std::fs::write(
        &conf,
        format!(
            "[server]\nportals = [\"127.0.0.1:0\"]\nconnections_per_session = 1\n\
             [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:64MiB\"\n"
        ),
    )
    .unwrap();
    let (_t, port) = target(dir.path(), &["--config", conf.to_str().unwrap()], "one");
    let out = bench(port, &["--connections", "4"]);
    let (granted, counts) = per_connection(&out);
    assert_eq!((granted, counts.len()), (1, 1), "{out}");
    // The default is the one-connection session, with no connections line.
    let out = bench(port, &[]);
    assert!(!out.contains("connections: "), "{out}");
}
