//! `ipsan bench --sink discard` (issue 27) against ipsan's own target, in-process on
//! loopback: discarded reads are counted as reads, whole, plain and sealed; a kept read in
//! flight beside discarded ones still gets exactly its own bytes (the scratch buffer the
//! discarded data goes through is never a kept read's); and what cannot discard says so.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::{bounded, config};
use ipsan_bench::{self as bench, BenchError, Limit, RwMode, Sink, Workload};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, CryptoPool, Psk};
use ipsan_target::ServerHandle;

const IQN: &str = "iqn.2026-11.org.ipsan:sink";
const SECRET: &[u8] = b"sink-test-pre-shared-secret-0123456789";
const MIB: u64 = 1 << 20;

async fn start() -> ServerHandle {
    common::start_target(IQN, SECRET).await
}

async fn open(h: &ServerHandle, sealed: bool) -> Arc<Session> {
    let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
    let mut cfg = config(LoginOptions::default());
    if sealed {
        let req = SealRequest {
            ciphers: vec![Cipher::Aes256Gcm],
            chunk: ipsan_seal::DEFAULT_CHUNK,
            psk: Psk::new(SECRET.to_vec()).unwrap(),
            pool: Some(Arc::new(CryptoPool::new(2).unwrap())),
        };
        cfg = SessionConfig {
            extension: Some(req.factory()),
            ..cfg
        };
    }
    let s = Session::open(&url, &cfg).await.unwrap();
    s.read_capacity().await.unwrap();
    Arc::new(s)
}

fn reads(sink: Sink, bs: u64, depth: usize, ops: u64) -> Workload {
    Workload {
        mode: RwMode::Read,
        mix_read_percent: 100,
        block_size: bs,
        depth,
        offset: 0,
        limit: Limit::Bytes(ops * bs),
        verify: false,
        seed: 1,
        data: None,
        rate: None,
        sink,
    }
}

/// 1 MiB reads (four 256 KiB Data-In each, received in place) and 4 KiB reads (one PDU
/// each), 8 in flight, plain and sealed: every discarded read is counted whole, as many as
/// the kept run's, and the JSON names the sink.
#[test]
fn counts_discarded_reads_like_kept_ones() {
    bounded(90, async {
        let h = start().await;
        for sealed in [false, true] {
            let s = open(&h, sealed).await;
            for bs in [MIB, 4096] {
                let ops = if bs == MIB { 48 } else { 400 };
                for sink in [Sink::Keep, Sink::Discard] {
                    let m = bench::run(s.clone(), reads(sink, bs, 8, ops), None)
                        .await
                        .unwrap_or_else(|e| panic!("sealed={sealed} bs={bs} {sink:?}: {e}"));
                    assert_eq!(m.read_ops, ops, "sealed={sealed} bs={bs} {sink:?}");
                    assert_eq!(m.read_bytes, ops * bs, "sealed={sealed} bs={bs} {sink:?}");
                }
            }
        }
        let info = bench::report::WorkloadInfo::from(&reads(Sink::Discard, MIB, 8, 1));
        let json = serde_json::to_value(&info).unwrap();
        assert_eq!(json["sink"], "discard");
        let json = serde_json::to_value(bench::report::WorkloadInfo::from(&reads(
            Sink::Keep,
            MIB,
            8,
            1,
        )))
        .unwrap();
        assert!(json.get("sink").is_none(), "keep, the default, is left out");
        h.shutdown().await.unwrap();
    });
}

/// Byte `i` of the 1 MiB written at slot `k`.
fn byte(k: u64, i: u64) -> u8 {
    (i as u8) ^ (k as u8).wrapping_mul(37)
}

/// Kept 1 MiB reads in flight among discarded ones on one connection: each kept read
/// returns exactly the bytes written there, never the scratch buffer's.
#[test]
fn keeps_kept_reads_whole_beside_discarded_ones() {
    bounded(90, async {
        let h = start().await;
        let s = open(&h, false).await;
        let blocks = (MIB / 512) as u32;
        for k in 0..8u64 {
            let fill: Vec<u8> = (0..MIB).map(|i| byte(k, i)).collect();
            s.write(k * u64::from(blocks), Bytes::from(fill))
                .await
                .unwrap();
        }
        for round in 0..4u64 {
            let mut tasks = Vec::new();
            for k in 0..8u64 {
                let s = s.clone();
                tasks.push(tokio::spawn(async move {
                    let lba = k * u64::from(blocks);
                    if (k + round) % 2 == 0 {
                        s.read_discard(lba, blocks).await.unwrap();
                        None
                    } else {
                        Some((k, s.read(lba, blocks).await.unwrap()))
                    }
                }));
            }
            for t in tasks {
                if let Some((k, data)) = t.await.unwrap() {
                    assert_eq!(data.len() as u64, MIB);
                    let bad = (0..MIB).find(|&i| data[i as usize] != byte(k, i));
                    assert!(
                        bad.is_none(),
                        "round {round}: read {k} wrong at byte {bad:?}"
                    );
                }
            }
        }
        h.shutdown().await.unwrap();
    });
}

/// `--verify` checks what reads return: refused with the discard sink, before any command.
#[test]
fn refuses_verify_with_discard() {
    bounded(30, async {
        let h = start().await;
        let s = open(&h, false).await;
        let mut w = reads(Sink::Discard, 65536, 1, 4);
        w.verify = true;
        match bench::run(s, w, None).await {
            Err(BenchError::Workload(m)) => assert!(m.contains("--sink discard"), "{m}"),
            other => panic!("verify with discard ran: {other:?}"),
        }
        h.shutdown().await.unwrap();
    });
}
