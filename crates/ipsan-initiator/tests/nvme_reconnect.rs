//! ipsan's NVMe/TCP host reconnects after a connection loss (issue 30; Linux's
//! `reconnect_delay` / `ctrl_loss_tmo`): ipsan's target in process, a loopback relay between
//! host and target that the test cuts (every relayed connection torn down, new ones refused
//! while it is down), and `NvmeSession` with `NvmeConfig::reconnect`.
//!
//! - a write and a read issued while the link is down complete once it is back, on a new
//!   controller, and the data is what the host wrote (checked straight at the target);
//! - a link down longer than `ctrl_loss_tmo` fails the commands, naming ctrl_loss_tmo;
//! - without `reconnect`, a lost connection fails the command as before;
//! - with queue runtimes (a copy of the session's queues per thread), the callers of every
//!   thread go on with the new controller after one reconnect.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{NvmeConfig, NvmeError, NvmeSession, NvmeUrl, Reconnect};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;

const IQN: &str = "iqn.2026-11.org.ipsan:nvme-reconnect";
const NQN: &str = "nqn.2026-11.org.ipsan:nvme-reconnect";

/// A loopback relay to the target that can be cut.
struct Relay {
    addr: SocketAddr,
    down: Arc<AtomicBool>,
    tasks: Arc<Mutex<Vec<JoinHandle<()>>>>,
}

impl Relay {
    async fn start(target: SocketAddr) -> Relay {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let down = Arc::new(AtomicBool::new(false));
        let tasks: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let (d, t) = (down.clone(), tasks.clone());
        tokio::spawn(async move {
            while let Ok((host, _)) = l.accept().await {
                if d.load(Ordering::Acquire) {
                    drop(host);
                    continue;
                }
                let Ok(tgt) = TcpStream::connect(target).await else {
                    continue;
                };
                let task = tokio::spawn(async move {
                    let (mut hr, mut hw) = host.into_split();
                    let (mut tr, mut tw) = tgt.into_split();
                    tokio::select! {
                        _ = tokio::io::copy(&mut hr, &mut tw) => {}
                        _ = tokio::io::copy(&mut tr, &mut hw) => {}
                    }
                });
                t.lock().unwrap().push(task);
            }
        });
        Relay { addr, down, tasks }
    }

    /// Tears every relayed connection down (both sides see it closed) and refuses new ones
    /// until [`Relay::up`].
    fn cut(&self) {
        self.down.store(true, Ordering::Release);
        for t in self.tasks.lock().unwrap().drain(..) {
            t.abort();
        }
    }

    fn up(&self) {
        self.down.store(false, Ordering::Release);
    }
}

fn url(addr: SocketAddr) -> NvmeUrl {
    NvmeUrl::parse(&format!("nvme+tcp://{addr}/{NQN}/1")).unwrap()
}

fn cfg(reconnect: Option<Reconnect>) -> NvmeConfig {
    NvmeConfig {
        queues: 2,
        kato: Duration::from_secs(5),
        connect_timeout: Duration::from_secs(5),
        command_timeout: Some(Duration::from_secs(30)),
        reconnect,
        ..NvmeConfig::default()
    }
}

fn pattern(len: usize, seed: u8) -> Bytes {
    (0..len)
        .map(|i| (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[1] ^ seed)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_commands_across_a_cut_connection_after_reconnecting() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = common::nvme_target(IQN, "mem:16MiB").await;
        let relay = Relay::start(h.nvme_addrs[0]).await;
        let rc = Reconnect {
            delay: Duration::from_millis(200),
            ctrl_loss_tmo: Duration::from_secs(20),
        };
        let host = Arc::new(
            NvmeSession::open(&url(relay.addr), &cfg(Some(rc)))
                .await
                .unwrap(),
        );
        let before = pattern(64 * 1024, 1);
        host.write(0, before.clone()).await.unwrap();

        // The link goes down; a write and a read are issued while it is down.
        relay.cut();
        let during = pattern(32 * 1024, 2);
        let (w, r) = {
            let (h1, h2, d) = (host.clone(), host.clone(), during.clone());
            (
                tokio::spawn(async move { h1.write(512, d).await }),
                tokio::spawn(async move { h2.read_into(0, 128, BytesMut::new()).await }),
            )
        };
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(
            !w.is_finished() && !r.is_finished(),
            "they wait for the controller"
        );
        relay.up();
        w.await
            .unwrap()
            .expect("the write completes on the new controller");
        let got = r
            .await
            .unwrap()
            .expect("the read completes on the new controller");
        assert!(
            got[..] == before[..],
            "the read returns what was written before"
        );
        assert!(host.reconnects() >= 1, "a new controller was connected");
        assert_eq!(host.queues(), 2, "with its I/O queues");

        // Straight at the target, not through the relay: the data is there.
        let direct = NvmeSession::open(&url(h.nvme_addrs[0]), &cfg(None))
            .await
            .unwrap();
        let got = direct.read_into(512, 64, BytesMut::new()).await.unwrap();
        assert!(
            got[..] == during[..],
            "the write made while the link was down"
        );
        direct.close().await.unwrap();

        // More I/O on the reconnected session.
        host.flush().await.unwrap();
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_commands_once_the_controller_is_lost_past_ctrl_loss_tmo() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = common::nvme_target(IQN, "mem:16MiB").await;
        let relay = Relay::start(h.nvme_addrs[0]).await;
        let rc = Reconnect {
            delay: Duration::from_millis(200),
            ctrl_loss_tmo: Duration::from_secs(1),
        };
        let host = NvmeSession::open(&url(relay.addr), &cfg(Some(rc)))
            .await
            .unwrap();
        host.write(0, pattern(4096, 3)).await.unwrap();
        relay.cut();
        let t0 = std::time::Instant::now();
        match host.read_into(0, 8, BytesMut::new()).await {
            Err(NvmeError::Closed(why)) => assert!(why.contains("ctrl_loss_tmo"), "{why}"),
            other => panic!("expected the controller lost, got {other:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
        // It stays lost, even with the link back.
        relay.up();
        assert!(matches!(
            host.read_into(0, 8, BytesMut::new()).await,
            Err(NvmeError::Closed(_))
        ));

        // Without reconnect: the command fails with the connection.
        let plain = NvmeSession::open(&url(relay.addr), &cfg(None))
            .await
            .unwrap();
        relay.cut();
        assert!(plain.read_into(0, 8, BytesMut::new()).await.is_err());
        assert_eq!(plain.reconnects(), 0);
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

/// With `queue_runtimes` each runtime thread reads its own copy of the session's queues: after
/// a cut, a reconnect must replace every copy, or a thread that still holds the lost
/// controller's queues would find them dead and connect yet another controller for each of its
/// commands. A write from one thread and a read from the other wait across the cut; then 16
/// commands from each thread complete, with exactly one reconnect in all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnects_once_for_the_callers_of_every_queue_thread() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = common::nvme_target(IQN, "mem:16MiB").await;
        let relay = Relay::start(h.nvme_addrs[0]).await;
        let rc = Reconnect {
            delay: Duration::from_millis(200),
            ctrl_loss_tmo: Duration::from_secs(20),
        };
        let threads = ipsan_initiator::nvme::RuntimeThreads::spawn(2, "reconnect").unwrap();
        let rts = threads.handles().to_vec();
        let config = NvmeConfig {
            queue_runtimes: rts.clone(),
            ..cfg(Some(rc))
        };
        let host = Arc::new(NvmeSession::open(&url(relay.addr), &config).await.unwrap());
        let data = pattern(16 * 1024, 4);
        let (h0, d0) = (host.clone(), data.clone());
        rts[0]
            .spawn(async move { h0.write(0, d0).await })
            .await
            .unwrap()
            .unwrap();

        relay.cut();
        let (h1, h2, d) = (host.clone(), host.clone(), data.clone());
        let w = rts[0].spawn(async move { h1.write(64, d).await });
        let r = rts[1].spawn(async move { h2.read_into(0, 32, BytesMut::new()).await });
        tokio::time::sleep(Duration::from_millis(500)).await;
        relay.up();
        w.await
            .unwrap()
            .expect("the write completes after the reconnect");
        let got = r
            .await
            .unwrap()
            .expect("the read completes after the reconnect");
        assert!(
            got[..] == data[..],
            "the read returns what was written before"
        );

        for rt in &rts {
            let tasks: Vec<_> = (0..16u64)
                .map(|i| {
                    let s = host.clone();
                    rt.spawn(async move { s.read_into(i * 32, 32, BytesMut::new()).await })
                })
                .collect();
            for t in tasks {
                t.await.unwrap().expect("a read on the new controller");
            }
        }
        assert_eq!(
            host.reconnects(),
            1,
            "one new controller for every thread's callers"
        );
        drop(host);
        drop(threads);
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
