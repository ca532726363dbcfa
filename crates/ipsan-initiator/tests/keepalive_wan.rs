//! The target's keepalive across a slow link with MiBs of reads queued (issue 28): its NOP-In
//! ping leaves behind the Data-In written before it, and a live initiator must not be given up
//! on while the ping is still in the target's send buffer. `ipsan wan` between two namespaces
//! at 8 Mbit/s, 5 ms each way; the target pings after 1 s without a PDU and waits 1 s for the
//! answer; its send buffer holds 4 MiB (~4 s of this link). The initiator asks for 8 MiB of
//! reads at once and then has nothing to say for ~8 s: every read completes, and the
//! connection it logged in with still takes a command and a logout after. Waiting from when
//! the ping was written into the socket (the code before) closed the connection seconds
//! before the ping could reach the initiator: the reads already in the socket still arrived,
//! the command after them did not. Needs root and /dev/net/tun; otherwise it prints
//! `SKIPPED: <reason>` and returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::wan::{self, Guard};
use ipsan_initiator::{IscsiUrl, Session};
use ipsan_seal::Cipher;
use ipsan_wan::{DirConfig, Engine, Link, LinkConfig, Side};

const IQN: &str = "iqn.2026-11.org.ipsan:keepalive-wan";
const SECRET: &[u8] = b"keepalive-wan-pre-shared-secret-0123";

#[test]
fn a_ping_behind_queued_data_in_waits_until_it_reached_the_initiator() {
    if !wan::can_run() {
        return;
    }
    let name = format!("ka{}", std::process::id());
    let _g = Guard(name.clone());
    let mut cfg = LinkConfig::new(&name).symmetric(DirConfig {
        delay: Duration::from_millis(5),
        rate_bps: 8_000_000,
        ..Default::default()
    });
    cfg.engine = Engine::Builtin;
    // This test's own /24 of 10.231.0.0/16, away from the other suites'.
    cfg.subnet = 200 + (std::process::id() % 20) as u8;
    let l = Link::up(cfg).unwrap();
    let lr = &l;
    std::thread::scope(|scope| {
        let target = wan::sealed_target(scope, lr, IQN, SECRET, "mem:16MiB", |c| {
            c.nop_interval = Some(Duration::from_secs(1));
            c.tcp = Some(ipsan_tcp::TcpSettings {
                sndbuf: ipsan_tcp::BufSize::Bytes(4 << 20),
                ..Default::default()
            });
        });
        let addr = target.addr;
        let result = lr
            .run_in(Side::Ini, move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let url = IscsiUrl::parse(&format!("iscsi://{addr}/{IQN}/0")).unwrap();
                    // An initiator that sends nothing of its own while it waits (no NOP-Out
                    // keepalive): the target's ping is the only one.
                    let cfg = ipsan_initiator::SessionConfig {
                        nop_interval: None,
                        ..common::sealed_config(Cipher::Aes256Gcm, SECRET)
                    };
                    let s = Arc::new(Session::open(&url, &cfg).await.unwrap());
                    let started = Instant::now();
                    // 16 reads of 512 KiB at once: ~8 s of this link.
                    let mut reads = tokio::task::JoinSet::new();
                    for i in 0..16u64 {
                        let s = s.clone();
                        reads.spawn(async move { s.read_discard(i * 1024, 1024).await });
                    }
                    let mut failed = Vec::new();
                    while let Some(r) = reads.join_next().await {
                        if let Err(e) = r.unwrap() {
                            failed.push(e.to_string());
                        }
                    }
                    let took = started.elapsed();
                    // The connection is still there: one more command, then a clean logout.
                    if let Err(e) = s.read_discard(0, 8).await {
                        failed.push(format!("the read after: {e}"));
                    }
                    let s = Arc::try_unwrap(s).ok().unwrap();
                    if let Err(e) = s.logout().await {
                        failed.push(format!("logout: {e}"));
                    }
                    (failed, took)
                })
            })
            .unwrap();
        target.stop();
        let (failed, took) = result;
        assert!(
            failed.is_empty(),
            "the session failed after {took:?} (the target gave up on a live initiator): {failed:?}"
        );
        // The reads did wait behind the link long enough for the target to ping.
        assert!(took > Duration::from_secs(4), "took {took:?}");
    });
}
