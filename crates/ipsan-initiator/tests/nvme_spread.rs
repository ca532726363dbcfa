//! Which I/O queue ipsan's NVMe/TCP host sends a command on (the target in process, on
//! loopback, a relay on the path). Each command goes to the queue with the fewest commands
//! under way, so a queue whose connection holds a command back (a stalled path, a slow
//! target connection) gets no more while another queue is idle; sent round robin, every
//! second command would queue behind the held one.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{NvmeConfig, NvmeSession, NvmeUrl};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Notify;

const IQN: &str = "iqn.2026-11.org.ipsan:nvme-spread";
const NQN: &str = "nqn.2026-11.org.ipsan:nvme-spread";

/// The command capsule's PDU type (NVMe/TCP 1.0 §3.6.1) and the Read opcode (NVM Command Set
/// 1.0), the first byte of the SQE behind the 8-byte common header.
const CAPSULE_CMD: u8 = 0x04;
const OP_READ: u8 = 0x02;

/// The relay's state, over every connection (numbered in accept order).
#[derive(Default)]
struct Path {
    /// While set, the first connection a Read goes up on is held: nothing more from the
    /// target reaches the host on it until `release`.
    arm: AtomicBool,
    held: Mutex<Option<usize>>,
    release: Notify,
    released: AtomicBool,
    /// Reads sent per connection.
    reads: Mutex<HashMap<usize, usize>>,
}

impl Path {
    fn held(&self) -> Option<usize> {
        *self.held.lock().unwrap()
    }
}

/// Forwards whole PDUs (PLEN from the common header) from `from` to `to`, calling `look` on
/// each before it goes; `hold` says whether to stop forwarding (until `path.release`).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    path: Arc<Path>,
    look: impl Fn(&[u8]),
    hold: impl Fn() -> bool,
) {
    let mut buf = BytesMut::new();
    loop {
        while buf.len() >= 8 {
            let plen = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
            if buf.len() < plen {
                break;
            }
            let pdu = buf.split_to(plen);
            look(&pdu);
            while hold() && !path.released.load(Ordering::Acquire) {
                let wait = path.release.notified();
                if path.released.load(Ordering::Acquire) {
                    break;
                }
                wait.await;
            }
            if to.write_all(&pdu).await.is_err() {
                return;
            }
        }
        match from.read_buf(&mut buf).await {
            Ok(0) | Err(_) => return,
            Ok(_) => {}
        }
    }
}

async fn relay(target: SocketAddr, path: Arc<Path>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        let mut n = 0;
        while let Ok((host, _)) = l.accept().await {
            let id = n;
            n += 1;
            let t = TcpStream::connect(target).await.unwrap();
            let (hr, hw) = host.into_split();
            let (tr, tw) = t.into_split();
            let up = path.clone();
            tokio::spawn(pump(
                hr,
                tw,
                path.clone(),
                move |pdu| {
                    if pdu[0] == CAPSULE_CMD && pdu.len() > 8 && pdu[8] == OP_READ {
                        *up.reads.lock().unwrap().entry(id).or_default() += 1;
                        if up.arm.load(Ordering::Acquire) {
                            up.held.lock().unwrap().get_or_insert(id);
                        }
                    }
                },
                || false,
            ));
            let down = path.clone();
            tokio::spawn(pump(
                tr,
                hw,
                path.clone(),
                |_| {},
                move || down.held() == Some(id),
            ));
        }
    });
    addr
}

fn pattern(len: usize) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 11) as u8)
        .collect::<Vec<u8>>()
        .into()
}

#[tokio::test]
async fn sends_commands_to_the_idle_queue_while_the_other_holds_one() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let path = Arc::new(Path::default());
    let addr = relay(h.nvme_addrs[0], path.clone()).await;
    let url = NvmeUrl::parse(&format!("nvme+tcp://{addr}/{NQN}/1")).unwrap();
    let cfg = NvmeConfig {
        queues: 2,
        kato: Duration::ZERO,
        ..NvmeConfig::default()
    };
    let s = Arc::new(
        tokio::time::timeout(Duration::from_secs(10), NvmeSession::open(&url, &cfg))
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(s.queues(), 2);
    let data = pattern(65536);
    s.write(0, data.clone()).await.unwrap();

    // One read whose answer the path holds back on its queue's connection.
    path.arm.store(true, Ordering::Release);
    let held = {
        let s = s.clone();
        tokio::spawn(async move { s.read_into(0, 128, BytesMut::new()).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    let held_conn = loop {
        if let Some(c) = path.held() {
            break c;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first read never went out"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let before = path.reads.lock().unwrap().get(&held_conn).copied();

    // Reads one after the other meanwhile: each finds one queue holding a command and the
    // other idle, and goes to the idle one.
    for i in 0..8 {
        let back =
            tokio::time::timeout(Duration::from_secs(5), s.read_into(0, 128, BytesMut::new()))
                .await
                .unwrap_or_else(|_| panic!("read {i} waited behind the held command"))
                .unwrap();
        assert_eq!(&back[..], &data[..]);
    }
    assert_eq!(
        path.reads.lock().unwrap().get(&held_conn).copied(),
        before,
        "a read went to the queue that held a command while the other was idle"
    );

    // Released, the held read completes with the right data.
    path.released.store(true, Ordering::Release);
    path.release.notify_waiters();
    let back = tokio::time::timeout(Duration::from_secs(5), held)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&back[..], &data[..]);
    drop(s);
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn fails_a_held_command_at_its_deadline_and_serves_again_once_released() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let path = Arc::new(Path::default());
    let addr = relay(h.nvme_addrs[0], path.clone()).await;
    let url = NvmeUrl::parse(&format!("nvme+tcp://{addr}/{NQN}/1")).unwrap();
    let cfg = NvmeConfig {
        queues: 2,
        kato: Duration::ZERO,
        command_timeout: Some(Duration::from_millis(500)),
        ..NvmeConfig::default()
    };
    let s = tokio::time::timeout(Duration::from_secs(10), NvmeSession::open(&url, &cfg))
        .await
        .unwrap()
        .unwrap();
    let data = pattern(65536);
    s.write(0, data.clone()).await.unwrap();

    // The read the path holds fails at its deadline (the queue's timer), not before and not
    // much after.
    path.arm.store(true, Ordering::Release);
    let t0 = tokio::time::Instant::now();
    let r = tokio::time::timeout(Duration::from_secs(5), s.read_into(0, 128, BytesMut::new()))
        .await
        .expect("a held command never failed");
    let waited = t0.elapsed();
    assert!(
        matches!(r, Err(ipsan_initiator::nvme::NvmeError::Timeout(_))),
        "{r:?}"
    );
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(3),
        "failed after {waited:?}"
    );
    assert!(path.held().is_some());

    // Released, the queues serve again: eight reads at once, each within its deadline.
    path.released.store(true, Ordering::Release);
    path.release.notify_waiters();
    let before: usize = path.reads.lock().unwrap().values().sum();
    let mut tasks = Vec::new();
    let s = Arc::new(s);
    for _ in 0..8 {
        let s = s.clone();
        tasks.push(tokio::spawn(async move {
            s.read_into(0, 128, BytesMut::new()).await
        }));
    }
    for t in tasks {
        let back = t.await.unwrap().unwrap();
        assert_eq!(&back[..], &data[..]);
    }
    let after: usize = path.reads.lock().unwrap().values().sum();
    assert_eq!(after, before + 8);
    drop(s);
    h.shutdown().await.unwrap();
}

/// With `queue_runtimes` (current-thread runtimes, one per thread, as `ipsan bench --threads`
/// runs NVMe/TCP), a command goes on the queue whose task runs on the caller's thread: a
/// burst of reads from either thread all go up that thread's queue's connection, none on the
/// other's, where the least-busy choice alone spreads them over both.
#[tokio::test]
async fn sends_a_threads_commands_on_the_queue_that_runs_on_that_thread() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let path = Arc::new(Path::default());
    let addr = relay(h.nvme_addrs[0], path.clone()).await;
    let url = NvmeUrl::parse(&format!("nvme+tcp://{addr}/{NQN}/1")).unwrap();
    let thread = ipsan_initiator::nvme::RuntimeThreads::spawn(1, "test").unwrap();
    let other = thread.handles()[0].clone();
    let cfg = NvmeConfig {
        queues: 2,
        kato: Duration::ZERO,
        queue_runtimes: vec![tokio::runtime::Handle::current(), other.clone()],
        ..NvmeConfig::default()
    };
    let s = Arc::new(
        tokio::time::timeout(Duration::from_secs(10), NvmeSession::open(&url, &cfg))
            .await
            .unwrap()
            .unwrap(),
    );
    assert_eq!(s.queues(), 2);
    let data = pattern(65536);
    s.write(0, data.clone()).await.unwrap();
    // The relay numbers connections as they come: 0 the admin queue, 1 and 2 the I/O queues
    // (queue 1 on this thread's runtime, queue 2 on the other's).
    let reads = |c: usize| path.reads.lock().unwrap().get(&c).copied().unwrap_or(0);
    for (rt, mine, theirs) in [
        (other.clone(), 2, 1),
        (tokio::runtime::Handle::current(), 1, 2),
    ] {
        let (m0, t0) = (reads(mine), reads(theirs));
        let tasks: Vec<_> = (0..16)
            .map(|_| {
                let s = s.clone();
                rt.spawn(async move { s.read_into(0, 128, BytesMut::new()).await })
            })
            .collect();
        for t in tasks {
            let back = tokio::time::timeout(Duration::from_secs(10), t)
                .await
                .unwrap()
                .unwrap()
                .unwrap();
            assert_eq!(&back[..], &data[..]);
        }
        assert_eq!(reads(mine) - m0, 16, "reads on the caller's thread's queue");
        assert_eq!(reads(theirs), t0, "no read on the other thread's queue");
    }
    drop(s);
    drop(thread);
    h.shutdown().await.unwrap();
}
