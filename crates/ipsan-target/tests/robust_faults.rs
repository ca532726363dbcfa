//! Faults (issue 8): the target killed with SIGKILL in the middle of a FUA / SYNCHRONIZE
//! CACHE write stream keeps every write it acknowledged as stable; a file backend on a full
//! filesystem answers CHECK CONDITION with the SBC-4 sense and the session carries on.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod robust_common;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use iscsi_wire::Pdu;
use robust_common::*;

/// Kills and reaps a child process when dropped, so a failing test leaves nothing behind.
struct Reaped(Child);
impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Not a test of its own: the target process that `acknowledged_writes_survive_kill_9` starts
/// (this test binary re-executed) and kills. Serves `IPSAN_ROBUST_DISK` and prints its port.
#[test]
#[ignore = "helper process for acknowledged_writes_survive_kill_9"]
fn child_target_process() {
    let disk = std::env::var("IPSAN_ROBUST_DISK").expect("IPSAN_ROBUST_DISK");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let cfg = config(&[&format!("file:{disk},size=64MiB")], "");
        let t = start(&cfg).await;
        println!("PORT {}", t.addrs[0].port());
        std::future::pending::<()>().await;
    });
}

fn spawn_target(disk: &std::path::Path) -> (Reaped, std::net::SocketAddr) {
    let mut child = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "child_target_process",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("IPSAN_ROBUST_DISK", disk)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let child = Reaped(child);
    let mut lines = BufReader::new(out).lines();
    let port = loop {
        let l = lines.next().expect("child printed its port").unwrap();
        // The harness prints "test child_target_process ... " on the same line.
        if let Some(i) = l.find("PORT ") {
            break l[i + 5..].trim().parse::<u16>().unwrap();
        }
    };
    (child, ([127, 0, 0, 1], port).into())
}

/// 64 KiB of a pattern unique to (lba, generation).
fn pattern(lba: u64, generation: u32) -> Bytes {
    let mut v = vec![0u8; 65536];
    for (i, chunk) in v.chunks_mut(16).enumerate() {
        chunk[..8].copy_from_slice(&lba.to_be_bytes());
        chunk[8..12].copy_from_slice(&generation.to_be_bytes());
        chunk[12..16].copy_from_slice(&(i as u32).to_be_bytes());
    }
    Bytes::from(v)
}

const BLOCKS_PER_WRITE: u64 = 128;
const SLOTS: u64 = 512; // 32 MiB of the 64 MiB disk

#[test]
fn acknowledged_writes_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    let (child, addr) = spawn_target(&disk);
    let child = Arc::new(std::sync::Mutex::new(Some(child)));
    // slot -> generation acknowledged as stable (FUA GOOD, or GOOD then SYNCHRONIZE CACHE GOOD).
    let mut stable: Vec<Option<u32>> = vec![None; SLOTS as usize];
    let mut acked_unsynced: Vec<(usize, u32)> = Vec::new();
    let (mut fua_acks, mut synced_acks, mut in_flight_at_kill) = (0u32, 0u32, 0u32);
    bounded(120, async {
        let mut c = Raw::connect(addr).await;
        c.login([0x80, 0, 0, 0, 10, 1]).await;
        let killed = Arc::new(AtomicBool::new(false));
        let (k, ch) = (killed.clone(), child.clone());
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            k.store(true, Ordering::SeqCst);
            // SIGKILL: no shutdown, no flush.
            drop(ch.lock().unwrap().take());
        });
        let mut generation = 1u32;
        let mut itt = 1u32;
        'stream: loop {
            for slot in 0..SLOTS {
                let lba = slot * BLOCKS_PER_WRITE;
                let fua = (slot + u64::from(generation)) % 3 == 0;
                itt += 1;
                let cmd = c.command(
                    itt,
                    write16_cdb(lba, BLOCKS_PER_WRITE as u32, fua),
                    true,
                    65536,
                );
                c.send_maybe(&Pdu::new(cmd, pattern(lba, generation))).await;
                match c.recv_within(Duration::from_secs(5)).await {
                    Ok(Some(p)) if is_good(&Some(p.clone()), itt) => {
                        if fua {
                            stable[slot as usize] = Some(generation);
                            fua_acks += 1;
                        } else {
                            acked_unsynced.push((slot as usize, generation));
                        }
                    }
                    Ok(Some(p)) => panic!("write failed before the kill: {p:?}"),
                    _ => {
                        in_flight_at_kill += 1;
                        break 'stream;
                    }
                }
                if slot % 16 == 15 {
                    itt += 1;
                    let mut sync = [0u8; 16];
                    sync[0] = 0x35;
                    let cmd = c.command(itt, sync, false, 0);
                    c.send_maybe(&Pdu::new(cmd, Bytes::new())).await;
                    match c.recv_within(Duration::from_secs(5)).await {
                        Ok(Some(p)) if is_good(&Some(p.clone()), itt) => {
                            for (s, g) in acked_unsynced.drain(..) {
                                stable[s] = Some(g);
                                synced_acks += 1;
                            }
                        }
                        _ => break 'stream,
                    }
                }
            }
            generation += 1;
        }
        assert!(
            killed.load(Ordering::SeqCst),
            "the stream ended before the kill"
        );
    });
    let written = stable.iter().filter(|s| s.is_some()).count();
    assert!(
        written > 16,
        "too few stable writes before the kill ({written})"
    );

    // Restart on the same file and read every stable write back.
    let (_child2, addr2) = spawn_target(&disk);
    let mut mismatches = 0;
    bounded(120, async {
        let mut c = Raw::connect(addr2).await;
        c.login([0x80, 0, 0, 0, 10, 2]).await;
        for (slot, g) in stable.iter().enumerate() {
            let Some(g) = *g else { continue };
            let lba = slot as u64 * BLOCKS_PER_WRITE;
            let (data, st) = c
                .read16(100_000 + slot as u32, lba, BLOCKS_PER_WRITE as u32)
                .await;
            assert_eq!(st, 0);
            // A later generation may have landed (acknowledged or not); never an older one
            // or a torn mix.
            let got_g = u32::from_be_bytes(data[8..12].try_into().unwrap());
            let whole = data[..] == pattern(lba, got_g)[..];
            if got_g < g || !whole {
                mismatches += 1;
            }
        }
    });
    eprintln!(
        "kill -9: {written} slots stable ({fua_acks} FUA acks, {synced_acks} synced acks), {in_flight_at_kill} in flight at the kill, {mismatches} mismatches after restart"
    );
    assert_eq!(mismatches, 0, "acknowledged writes lost or torn");
}

/// A tmpfs of `size` mounted in a private mount namespace held by a child process; the test
/// reaches it through `/proc/<pid>/root`. Nothing is mounted in the test's own namespace, and
/// the mount disappears with the child. `None` (with the reason) when not permitted.
fn private_tmpfs(size: &str) -> Option<(Reaped, std::path::PathBuf, tempfile::TempDir)> {
    let dir = tempfile::tempdir().unwrap();
    let script = format!(
        "mount -t tmpfs -o size={size} ipsan-robust '{}' && echo ready && exec sleep 600",
        dir.path().display()
    );
    let mut child = match Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("SKIP: unshare not available: {e}");
            return None;
        }
    };
    let out = child.stdout.take().unwrap();
    let pid = child.id();
    let mut child = Reaped(child);
    let mut line = String::new();
    BufReader::new(out).read_line(&mut line).unwrap();
    if line.trim() != "ready" {
        let mut err = String::new();
        if let Some(mut e) = child.0.stderr.take() {
            std::io::Read::read_to_string(&mut e, &mut err).unwrap();
        }
        eprintln!(
            "SKIP: cannot mount a private tmpfs (needs root): {}",
            err.trim()
        );
        return None;
    }
    let path = std::path::PathBuf::from(format!("/proc/{pid}/root{}", dir.path().display()));
    Some((child, path, dir))
}

#[test]
fn full_filesystem_gets_check_condition_and_session_continues() {
    let Some((_ns, mnt, _dir)) = private_tmpfs("4M") else {
        return;
    };
    let disk = mnt.join("disk.img");
    bounded(60, async {
        // 16 MiB sparse file on a 4 MiB filesystem.
        let cfg = config(&[&format!("file:{},size=16MiB", disk.display())], "");
        let t = start(&cfg).await;
        let mut c = Raw::connect(t.addrs[0]).await;
        c.login([0x80, 0, 0, 0, 11, 1]).await;
        let mut good = 0u64;
        let mut full = None;
        for slot in 0..256u64 {
            let lba = slot * 128;
            let p = c
                .write16(10 + slot as u32, lba, pattern(lba, 1), false)
                .await;
            let p = p.expect("answered");
            let st = scsi_status(&p).unwrap();
            if st.0 == 0 {
                good += 1;
            } else {
                full = Some((slot, st));
                break;
            }
        }
        let (slot, (status, key, asc, ascq)) = full.expect("the filesystem filled up");
        eprintln!("full disk after {good} x 64 KiB writes: status {status:#x} sense {key:#x}/{asc:#04x}/{ascq:#04x}");
        // SBC-4 §4.7.3.6: DATA PROTECT, SPACE ALLOCATION FAILED WRITE PROTECT.
        assert_eq!((status, key, asc, ascq), (2, 0x07, 0x27, 0x07));
        assert!(slot > 16, "filled after {slot} writes on a 4 MiB tmpfs");
        // The session continues: commands work and what was written reads back.
        assert!(is_good(&c.test_unit_ready(5000).await, 5000));
        let (data, st) = c.read16(5001, 0, 128).await;
        assert_eq!(st, 0);
        assert_eq!(&data[..], &pattern(0, 1)[..]);
        // A new session too.
        let mut d = Raw::connect(t.addrs[0]).await;
        d.login([0x80, 0, 0, 0, 11, 2]).await;
        assert!(is_good(&d.test_unit_ready(1).await, 1));
        t.shutdown().await.unwrap();
    });
}
