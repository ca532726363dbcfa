//! `ipsan bench --trace` and `--depth auto` against ipsan's own target, in-process on
//! loopback: the trace holds every command whole and in causal order, sealed writes show
//! their seal and R2T phases, and the depth controller runs within its bounds.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{bounded, config};
use ipsan_bench::autodepth::AutoConfig;
use ipsan_bench::trace::{self, Kind, Trace};
use ipsan_bench::{self as bench, Limit, RwMode, Workload};
use ipsan_initiator::seal::SealRequest;
use ipsan_initiator::{IscsiUrl, LoginOptions, Session, SessionConfig};
use ipsan_seal::{Cipher, CryptoPool, Psk};
use ipsan_target::ServerHandle;

const IQN: &str = "iqn.2026-11.org.ipsan:trace";
const SECRET: &[u8] = b"trace-test-pre-shared-secret-0123456789";

async fn start() -> ServerHandle {
    common::start_target(IQN, SECRET).await
}

fn workload(mode: RwMode, depth: usize, ops: u64) -> Workload {
    Workload {
        mode,
        mix_read_percent: 50,
        block_size: 65536,
        depth,
        offset: 0,
        limit: Limit::Bytes(ops * 65536),
        verify: false,
        seed: 1,
        data: None,
        rate: None,
        sink: Default::default(),
    }
}

fn to_commands(t: &Trace) -> Vec<trace::CommandTrace> {
    let mut buf = Vec::new();
    t.write_jsonl(&mut buf, serde_json::Map::new()).unwrap();
    let f = trace::parse(std::str::from_utf8(&buf).unwrap()).unwrap();
    trace::commands(&f.lines)
}

#[test]
fn traces_sealed_two_round_trip_writes_and_reads_whole() {
    bounded(60, async {
        let h = start().await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let login = LoginOptions {
            initial_r2t: true,
            immediate_data: false,
            ..LoginOptions::default()
        };
        let req = SealRequest {
            ciphers: vec![Cipher::Aes256Gcm],
            chunk: ipsan_seal::DEFAULT_CHUNK,
            psk: Psk::new(SECRET.to_vec()).unwrap(),
            pool: Some(Arc::new(CryptoPool::new(2).unwrap())),
        };
        let cfg = SessionConfig {
            extension: Some(req.factory()),
            ..config(login)
        };
        let s = Arc::new(Session::open(&url, &cfg).await.unwrap());
        let t = Trace::new(1000);
        bench::run_traced(
            s.clone(),
            workload(RwMode::Write, 4, 40),
            None,
            None,
            Some(t.clone()),
        )
        .await
        .unwrap();
        assert!(
            !s.set_observer(Trace::new(1)),
            "the trace is the session's one observer"
        );
        let cmds = to_commands(&t);
        assert_eq!(cmds.len(), 40, "every write traced");
        trace::check(&cmds).unwrap();
        for c in &cmds {
            for k in [
                Kind::SealStart,
                Kind::SealEnd,
                Kind::CmdSent,
                Kind::R2t,
                Kind::DataOut,
                Kind::Status,
                Kind::Completed,
            ] {
                assert!(c.at(k).is_some(), "command {} lacks {k:?}", c.cmd);
            }
            // InitialR2T=Yes, ImmediateData=No: nothing rides in the command PDU.
            let sent = c.events.iter().find(|e| e.1 == Kind::CmdSent).unwrap();
            assert_eq!(sent.3, 0);
        }
        // Depth 4: some command is issued before the previous one completes.
        let overlap = cmds
            .windows(2)
            .any(|w| w[1].at(Kind::Issued).unwrap() < w[0].at(Kind::Completed).unwrap());
        assert!(overlap, "commands overlap at depth 4");
        // The trace stopped at the end of the run: later commands are not recorded.
        s.read(0, 128).await.unwrap();
        assert_eq!(to_commands(&t).len(), 40);
        assert_eq!(t.refused(), 1);
        h.shutdown().await.unwrap();
    });
}

#[test]
fn traces_plain_reads_with_data_in() {
    bounded(60, async {
        let h = start().await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let s = Arc::new(
            Session::open(&url, &config(LoginOptions::default()))
                .await
                .unwrap(),
        );
        let t = Trace::new(1000);
        bench::run_traced(
            s.clone(),
            workload(RwMode::Read, 2, 20),
            None,
            None,
            Some(t.clone()),
        )
        .await
        .unwrap();
        let cmds = to_commands(&t);
        assert_eq!(cmds.len(), 20);
        trace::check(&cmds).unwrap();
        for c in &cmds {
            assert!(c.at(Kind::DataInFirst).is_some() && c.at(Kind::DataInLast).is_some());
            assert!(
                c.at(Kind::SealStart).is_none(),
                "no transform, no seal events"
            );
        }
        h.shutdown().await.unwrap();
    });
}

#[test]
fn depth_auto_runs_within_its_bounds_and_reports_every_window() {
    bounded(60, async {
        let h = start().await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let s = Arc::new(
            Session::open(&url, &config(LoginOptions::default()))
                .await
                .unwrap(),
        );
        let mut w = workload(RwMode::Write, 1, 0);
        w.limit = Limit::Time(Duration::from_millis(1500));
        let mut cfg = AutoConfig::new(1, 16);
        cfg.min_window = Duration::from_millis(100);
        let (m, r) = bench::run_auto(s.clone(), w, cfg, None).await.unwrap();
        assert!(m.ops > 0 && m.bytes == m.ops * 65536);
        assert!(!r.trajectory.is_empty(), "windows measured");
        assert!((1..=16).contains(&r.chosen));
        assert!(r.trajectory.iter().all(|s| (1..=16).contains(&s.depth)));
        assert_eq!(r.trajectory[0].depth, 1, "starts at the start depth");
        assert!(r.trajectory.iter().any(|s| s.depth > 1), "it grew");
        // The run ended on time although workers were parked by the gate.
        assert!(m.duration_s < 5.0, "{}", m.duration_s);
        h.shutdown().await.unwrap();
    });
}

/// `--rate` (002 Fig. 9's offered load): eight commands in flight on loopback would finish
/// 40 writes of 64 KiB in milliseconds; offered 2 MiB/s, command i starts at i × 31.25 ms,
/// so the run takes at least 39 × 31.25 ms and its rate stays at the offered one.
#[test]
fn paces_commands_to_the_offered_rate_whatever_the_depth() {
    bounded(60, async {
        let h = start().await;
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let s = Arc::new(
            Session::open(&url, &config(LoginOptions::default()))
                .await
                .unwrap(),
        );
        let free = bench::run(s.clone(), workload(RwMode::Write, 8, 40), None)
            .await
            .unwrap();
        let mut w = workload(RwMode::Write, 8, 40);
        w.rate = Some(2 << 20);
        let paced = bench::run(s.clone(), w, None).await.unwrap();
        assert_eq!(paced.ops, 40);
        assert!(paced.duration_s >= 1.2, "{}", paced.duration_s);
        assert!(
            paced.throughput_mib_s <= 2.0 * 1.05,
            "offered 2 MiB/s, measured {}",
            paced.throughput_mib_s
        );
        assert!(
            free.duration_s < paced.duration_s / 2.0,
            "unpaced {} s, paced {} s",
            free.duration_s,
            paced.duration_s
        );
        h.shutdown().await.unwrap();
    });
}
