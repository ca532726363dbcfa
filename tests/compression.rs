//! Compression on a sealed session (issue 28, docs/seal.md §4b), end to end with the real
//! `ipsan target` and `ipsan bench --verify`, through a loopback relay that counts the bytes
//! each way: a data file of zeros, text and random blocks (every chunk kind) written and read
//! back intact, the wire far smaller than the data when both ends ask, and the data's full
//! size when either end does not.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{spawn_ipsan, BIN};
use std::io::{Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

const IQN: &str = "iqn.2026-11.org.ipsan:compress";
const MIB: u64 = 1 << 20;

/// A loopback relay to `to` that counts the bytes it carries: (initiator→target,
/// target→initiator). What an observer on the path sees of the transfer sizes.
struct CountingRelay {
    port: u16,
    up: Arc<AtomicU64>,
    down: Arc<AtomicU64>,
}

fn pump(mut from: TcpStream, mut to: TcpStream, count: Arc<AtomicU64>) {
    let mut buf = vec![0u8; 64 << 10];
    loop {
        match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                count.fetch_add(n as u64, Ordering::Relaxed);
                if to.write_all(&buf[..n]).is_err() {
                    break;
                }
            }
        }
    }
    let _ = to.shutdown(Shutdown::Both);
    let _ = from.shutdown(Shutdown::Both);
}

impl CountingRelay {
    fn start(to: u16) -> CountingRelay {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = l.local_addr().unwrap().port();
        let (up, down) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
        let (u, d) = (up.clone(), down.clone());
        std::thread::spawn(move || {
            for a in l.incoming() {
                let Ok(a) = a else { continue };
                let Ok(b) = TcpStream::connect(("127.0.0.1", to)) else {
                    continue;
                };
                let (a2, b2) = (a.try_clone().unwrap(), b.try_clone().unwrap());
                let (u, d) = (u.clone(), d.clone());
                std::thread::spawn(move || pump(a, b, u));
                std::thread::spawn(move || pump(b2, a2, d));
            }
        });
        CountingRelay { port, up, down }
    }

    fn counts(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        )
    }
}

fn key_file(dir: &Path) -> PathBuf {
    let k = dir.join("seal.key");
    std::fs::write(&k, "compression-test-secret-0123456789ab\n").unwrap();
    std::fs::set_permissions(&k, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    k
}

/// 4 MiB like a small disk image: mostly zeros, some text, some random 64 KiB blocks (so
/// every chunk kind travels: compressed, stored raw, and both in one command).
fn data_file(dir: &Path) -> PathBuf {
    let mut d = vec![0u8; 4 * MIB as usize];
    let text = b"fn main() { println!(\"compressible source text\"); }\n".repeat(3000);
    d[MIB as usize..MIB as usize + text.len()].copy_from_slice(&text);
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    for b in &mut d[3 * MIB as usize..3 * MIB as usize + 192 * 1024] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let p = dir.join("image.bin");
    std::fs::write(&p, d).unwrap();
    p
}

fn target(dir: &Path, compress: bool) -> (common::Proc, u16) {
    let key = key_file(dir);
    let mut args = vec![
        "target",
        "--portal",
        "127.0.0.1:0",
        "--iqn",
        IQN,
        "--lun",
        "mem:64MiB",
        "--seal",
        "required",
        "--seal-secret-file",
        key.to_str().unwrap(),
    ];
    if compress {
        args.push("--compress");
    }
    let log = dir.join(format!("target-{compress}.log"));
    spawn_ipsan(&args, &log)
}

/// `ipsan bench --verify` writing 16 MiB of the data file (4 passes over it) and reading it
/// back, through a counting relay; returns (bytes initiator→target, target→initiator).
fn bench(dir: &Path, port: u16, compress: bool) -> (u64, u64) {
    let relay = CountingRelay::start(port);
    let url = format!("iscsi://127.0.0.1:{}/{IQN}/0", relay.port);
    let key = key_file(dir);
    let data = data_file(dir);
    let mut args = vec![
        "bench",
        url.as_str(),
        "--rw",
        "write",
        "--bs",
        "1MiB",
        "--depth",
        "8",
        "--size",
        "16MiB",
        "--verify",
        "--quiet",
        "--seal",
        "aes-256-gcm",
        "--secret-file",
        key.to_str().unwrap(),
        "--data-file",
        data.to_str().unwrap(),
    ];
    if compress {
        args.push("--compress");
    }
    let o = Command::new(BIN)
        .args(&args)
        .env("RUST_LOG", "info")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("verify: OK"),
        "bench {args:?} failed ({}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    relay.counts()
}

#[test]
fn accepts_compressed_writes_and_reads_verified_when_both_ends_ask() {
    let dir = tempfile::tempdir().unwrap();
    let (_t, port) = target(dir.path(), true);
    let (up, down) = bench(dir.path(), port, true);
    // 16 MiB each way of data that is 92 % zeros and 4.7 % random: a fraction on the wire.
    assert!(up < 6 * MIB, "written 16 MiB as {up} bytes");
    assert!(down < 6 * MIB, "read back 16 MiB as {down} bytes");
    // The random blocks cannot shrink: more than their 4.7 % of the data travelled.
    assert!(up > 16 * MIB * 192 / 4096, "{up}");
}

#[test]
fn accepts_uncompressed_sessions_when_either_end_does_not_ask() {
    let dir = tempfile::tempdir().unwrap();
    // The target agrees, the initiator does not ask.
    let (_t, port) = target(dir.path(), true);
    let (up, down) = bench(dir.path(), port, false);
    assert!(up > 16 * MIB && down > 16 * MIB, "{up} {down}");
    // The initiator asks, the target is not configured to: off, and still verified.
    let (_t2, port) = target(dir.path(), false);
    let (up, down) = bench(dir.path(), port, true);
    assert!(up > 16 * MIB && down > 16 * MIB, "{up} {down}");
}

#[test]
fn accepts_a_gateways_compressed_remote_leg_with_a_plain_host_verified() {
    let dir = tempfile::tempdir().unwrap();
    let (_t, port) = target(dir.path(), true);
    // The WAN leg: gateway A's remote sessions cross the counting relay.
    let wan = CountingRelay::start(port);
    let key = key_file(dir.path());
    let to = format!("iscsi://127.0.0.1:{}/{IQN}", wan.port);
    let (_g, gw) = spawn_ipsan(
        &[
            "gateway",
            "--listen",
            "127.0.0.1:0",
            "--seal",
            "aes-256-gcm",
            "--secret-file",
            key.to_str().unwrap(),
            "--compress",
            "--to",
            to.as_str(),
        ],
        &dir.path().join("gateway.log"),
    );
    let data = data_file(dir.path());
    let url = format!("iscsi://127.0.0.1:{gw}/{IQN}/0");
    let args = [
        "bench",
        url.as_str(),
        "--rw",
        "write",
        "--bs",
        "1MiB",
        "--depth",
        "8",
        "--size",
        "16MiB",
        "--verify",
        "--quiet",
        "--data-file",
        data.to_str().unwrap(),
    ];
    let o = Command::new(BIN).args(args).output().unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        o.status.success() && out.contains("verify: OK"),
        "plain host through the gateway failed ({}):\n{out}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    let (up, down) = wan.counts();
    assert!(
        up < 6 * MIB,
        "the WAN carried 16 MiB of writes as {up} bytes"
    );
    assert!(
        down < 6 * MIB,
        "the WAN carried 16 MiB of reads as {down} bytes"
    );
}
