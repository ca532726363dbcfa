//! A sealed session of several connections across `ipsan wan` (two namespaces, 5 ms each way,
//! a long path to both ends): the initiator's connections and the target's share the path's
//! send buffer (`ipsan_tcp::share_send_buffer`, issue 28, docs/results/mcs-sweep-9): each of
//! two gets its share, not the whole buffer one connection gets, on both ends. Read from
//! outside, as `ss -tm` sees each socket's send buffer (`skmem tb`). Needs root and
//! /dev/net/tun, and a host whose `net.core.wmem_max` sizes long paths past the autotuning
//! ceiling; otherwise it prints `SKIPPED: <reason>` and returns.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::wan::{self, Guard};
use ipsan_initiator::{IscsiUrl, McsConfig, McsSession, Spread};
use ipsan_seal::Cipher;
use ipsan_wan::{DirConfig, Engine, Link, LinkConfig, Side};

const IQN: &str = "iqn.2026-11.org.ipsan:mcs-wan";
const SECRET: &[u8] = b"mcs-wan-pre-shared-secret-0123456789";

fn sysctl(path: &str) -> u64 {
    std::fs::read_to_string(path)
        .unwrap()
        .split_whitespace()
        .last()
        .unwrap()
        .parse()
        .unwrap()
}

/// The send buffers (`skmem tb`) of the established sockets of `port` on `side`: the target's
/// (`sport`) or the initiator's (`dport`).
fn send_buffers(l: &Link, side: Side, port: u16) -> Vec<u64> {
    let filter = match side {
        Side::Tgt => format!("( sport = :{port} )"),
        Side::Ini => format!("( dport = :{port} )"),
    };
    let out = l
        .command(side, "ss")
        .args(["-tmnH", "state", "established", &filter])
        .output()
        .unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split("tb")
        .skip(1)
        .map(|s| {
            s.chars()
                .take_while(char::is_ascii_digit)
                .collect::<String>()
                .parse()
                .unwrap()
        })
        .collect()
}

#[test]
fn a_sessions_connections_share_the_long_paths_send_buffer_on_both_ends() {
    if !wan::can_run() {
        return;
    }
    if std::process::Command::new("ss").arg("-V").output().is_err() {
        println!("SKIPPED: needs ss (iproute2)");
        return;
    }
    let wmem_max = sysctl("/proc/sys/net/core/wmem_max");
    let tcp_wmem_max = sysctl("/proc/sys/net/ipv4/tcp_wmem");
    if wmem_max * 2 <= tcp_wmem_max {
        println!("SKIPPED: wmem_max {wmem_max}: long paths are left to autotuning here");
        return;
    }
    // Two connections: half the whole buffer each, down to the autotuning ceiling (the kernel
    // doubles the request).
    let share = (wmem_max / 2 * 2).max(tcp_wmem_max.next_multiple_of(2));
    let name = format!("mw{}", std::process::id());
    let _g = Guard(name.clone());
    let mut cfg = LinkConfig::new(&name).symmetric(DirConfig {
        delay: Duration::from_millis(5),
        ..Default::default()
    });
    cfg.engine = Engine::Builtin;
    // This test's own /24 of 10.231.0.0/16, away from the other suites'.
    cfg.subnet = 220 + (std::process::id() % 20) as u8;
    let l = Link::up(cfg).unwrap();
    let (open_tx, open_rx) = mpsc::channel();
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let lr = &l;
    std::thread::scope(|scope| {
        let target = wan::sealed_target(scope, lr, IQN, SECRET, "mem:16MiB", |c| {
            c.connections_per_session = 4;
        });
        let addr = target.addr;
        // The initiator, in its namespace: one session of two connections, held open.
        let initiator = scope.spawn(move || {
            lr.run_in(Side::Ini, move || {
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .enable_all()
                    .build()
                    .unwrap();
                rt.block_on(async move {
                    let url = IscsiUrl::parse(&format!("iscsi://{addr}/{IQN}/0")).unwrap();
                    let s = McsSession::open(
                        &url,
                        &common::sealed_config(Cipher::Aes256Gcm, SECRET),
                        McsConfig {
                            connections: 2,
                            spread: Spread::LeastQueued,
                        },
                    )
                    .await
                    .unwrap();
                    open_tx.send(s.connections()).unwrap();
                    tokio::task::spawn_blocking(move || done_rx.recv())
                        .await
                        .unwrap()
                        .unwrap();
                    s.logout().await.unwrap();
                });
            })
            .unwrap();
        });
        assert_eq!(open_rx.recv_timeout(Duration::from_secs(60)).unwrap(), 2);
        // Both ends resize as the second connection joins; give the target's side a moment.
        let deadline = Instant::now() + Duration::from_secs(5);
        let (ini, tgt) = loop {
            let ini = send_buffers(lr, Side::Ini, addr.port());
            let tgt = send_buffers(lr, Side::Tgt, addr.port());
            let settled = |v: &[u64]| v.len() == 2 && v.iter().all(|b| *b == share);
            if (settled(&ini) && settled(&tgt)) || Instant::now() > deadline {
                break (ini, tgt);
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        done_tx.send(()).unwrap();
        initiator.join().unwrap();
        target.stop();
        assert_eq!(
            ini,
            vec![share; 2],
            "the initiator's sockets (whole {})",
            wmem_max * 2
        );
        assert_eq!(
            tgt,
            vec![share; 2],
            "the target's sockets (whole {})",
            wmem_max * 2
        );
    });
}
