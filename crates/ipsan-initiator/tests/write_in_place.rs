//! The target receives a long Data-Out straight into its write's own buffer (issue 27:
//! `FrameReader::next_placing_data_out`, the engine's `lend_write_buffer`), not into its
//! receive buffer to copy it over after. What that must not change: every byte of a write
//! lands where it belongs, however the bytes arrive. A relay between the real initiator and
//! the real target (in-process, loopback) hands the initiator's bytes on in pieces of 1 to
//! 9,000 bytes with pauses between, so the target sees Data-Out heads long before their data
//! and every segment in many receives; the 1 MiB writes (immediate data, then Data-Out of up
//! to 256 KiB) are read back through a direct session and compared.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::{bounded, config};
use ipsan_initiator::{IscsiUrl, LoginOptions, Session};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IQN: &str = "iqn.2026-11.org.ipsan:write-in-place";
const MIB: usize = 1 << 20;

fn pattern(len: usize, seed: u32) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(0x9e37_79b9)).to_le_bytes()[1])
        .collect::<Vec<u8>>()
        .into()
}

async fn target() -> ipsan_target::ServerHandle {
    use ipsan_target::config::{self as tconfig, Config, TargetConfig};
    let t = TargetConfig::new(
        IQN,
        tconfig::luns_from_specs(&["mem:32MiB".to_owned()]).unwrap(),
    );
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![t],
        ..Config::default()
    };
    c.validate().unwrap();
    ipsan_target::ServerHandle::start(&c).await.unwrap()
}

/// Frames (BHS, AHS, padded data; no digests) from the initiator: counts the Data-Out PDUs of
/// at least 32 KiB (the ones the target places) in `long_data_out`.
fn count_frames(buf: &mut Vec<u8>, long_data_out: &AtomicUsize) {
    loop {
        if buf.len() < 48 {
            return;
        }
        let ahs = usize::from(buf[4]) * 4;
        let dsl = (usize::from(buf[5]) << 16) | (usize::from(buf[6]) << 8) | usize::from(buf[7]);
        let n = 48 + ahs + dsl.div_ceil(4) * 4;
        if buf.len() < n {
            return;
        }
        if buf[0] & 0x3f == 0x05 && dsl >= 32 * 1024 {
            long_data_out.fetch_add(1, Ordering::Relaxed);
        }
        buf.drain(..n);
    }
}

/// A relay that hands the initiator's bytes to the target in small pieces with pauses, and
/// the target's back as they come.
async fn dribbling_relay(to: std::net::SocketAddr, long: Arc<AtomicUsize>) -> std::net::SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((a, _)) = l.accept().await {
            let Ok(b) = TcpStream::connect(to).await else {
                continue;
            };
            let _ = b.set_nodelay(true);
            let (mut ar, mut aw) = a.into_split();
            let (mut br, mut bw) = b.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut br, &mut aw).await;
                let _ = aw.shutdown().await;
            });
            let long = long.clone();
            tokio::spawn(async move {
                let mut chunk = vec![0u8; 64 * 1024];
                let mut seen = Vec::new();
                let mut step = 0usize;
                loop {
                    let n = match ar.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    seen.extend_from_slice(&chunk[..n]);
                    count_frames(&mut seen, &long);
                    let mut at = 0;
                    while at < n {
                        step += 1;
                        // 1 .. 9,000 bytes, a fixed but uneven sequence.
                        let piece = (1 + step.wrapping_mul(7_919) % 9_000).min(n - at);
                        if bw.write_all(&chunk[at..at + piece]).await.is_err() {
                            return;
                        }
                        at += piece;
                        if step % 5 == 0 {
                            tokio::time::sleep(Duration::from_micros(200)).await;
                        }
                    }
                }
                let _ = bw.shutdown().await;
            });
        }
    });
    addr
}

/// Eight 1 MiB writes through the dribbling relay, read back directly: every byte where it
/// was written. The relay saw long Data-Out PDUs (the ones placed), so the placing path ran.
#[test]
fn accepts_writes_whose_data_out_arrives_in_pieces_and_stores_every_byte_in_place() {
    bounded(60, async {
        let h = target().await;
        let long = Arc::new(AtomicUsize::new(0));
        let via = dribbling_relay(h.addrs[0], long.clone()).await;
        let relayed = IscsiUrl::parse(&format!("iscsi://{via}/{IQN}/0")).unwrap();
        let direct = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let w = Session::open(&relayed, &config(LoginOptions::default()))
            .await
            .unwrap();
        let blocks = (MIB / 512) as u32;
        let data: Vec<Bytes> = (0..8).map(|i| pattern(MIB, i + 1)).collect();
        // Two at a time: a Data-Out of one write can follow the other's command.
        for pair in data.chunks(2).enumerate() {
            let (p, d) = pair;
            let lba = |k: usize| ((2 * p + k) as u64) * u64::from(blocks);
            let (a, b) = tokio::join!(w.write(lba(0), d[0].clone()), w.write(lba(1), d[1].clone()));
            a.unwrap();
            b.unwrap();
        }
        w.logout().await.unwrap();
        let r = Session::open(&direct, &config(LoginOptions::default()))
            .await
            .unwrap();
        for (i, d) in data.iter().enumerate() {
            let got = r.read(i as u64 * u64::from(blocks), blocks).await.unwrap();
            assert!(got[..] == d[..], "write {i}: the bytes read back differ");
        }
        r.logout().await.unwrap();
        assert!(
            long.load(Ordering::Relaxed) >= 8,
            "the relay saw {} Data-Out PDUs of at least 32 KiB: the 1 MiB writes went without them",
            long.load(Ordering::Relaxed)
        );
        h.shutdown().await.unwrap();
    });
}
