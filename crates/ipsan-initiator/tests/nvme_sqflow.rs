//! SQ flow control between ipsan's NVMe/TCP host and ipsan's target (in process, on
//! loopback), seen by a relay on the path that reads every PDU the target sends. By default
//! the host's I/O queue Connects disable SQ flow control (CATTR bit 2, NVMe over Fabrics 1.1
//! §3.3), and the target then ends each successful read with a C2HData carrying SUCCESS and
//! sends no response capsule for it (NVMe/TCP 1.0 §3.6.2.9); a host that keeps SQ flow
//! control (`NvmeConfig::sq_flow_control`) gets a response capsule for every read and never
//! SUCCESS. A relay that clears LAST_PDU on such a C2HData (SUCCESS without LAST_PDU) makes
//! the host refuse it: the read fails, the host sends an H2CTermReq, nothing is taken as read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{NvmeConfig, NvmeSession, NvmeUrl};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IQN: &str = "iqn.2026-11.org.ipsan:nvme-sqflow";
const NQN: &str = "nqn.2026-11.org.ipsan:nvme-sqflow";

/// PDU types (NVMe/TCP 1.0 §3.6.1) and C2HData flags.
const H2C_TERM_REQ: u8 = 0x02;
const CAPSULE_RESP: u8 = 0x05;
const C2H_DATA: u8 = 0x07;
const FLAG_LAST_PDU: u8 = 0x04;
const FLAG_SUCCESS: u8 = 0x08;

/// What the relay saw, over every connection.
#[derive(Default)]
struct Seen {
    /// Response capsules from the target.
    capsule_resps: AtomicUsize,
    /// C2HData PDUs from the target, and those with SUCCESS.
    c2h_data: AtomicUsize,
    c2h_success: AtomicUsize,
    /// H2CTermReqs from the host.
    h2c_term_reqs: AtomicUsize,
    /// While set, LAST_PDU is cleared on every C2HData carrying SUCCESS.
    clear_last: AtomicBool,
}

/// Forwards whole PDUs from `from` to `to` (PLEN from the common header), calling `look` on
/// each (it may alter it).
async fn pump<F>(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    look: F,
) where
    F: Fn(&mut [u8]),
{
    let mut buf = BytesMut::new();
    loop {
        while buf.len() >= 8 {
            let plen = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
            if buf.len() < plen {
                break;
            }
            let mut pdu = buf.split_to(plen);
            look(&mut pdu);
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

/// A relay to `target` that counts what passes into `seen`.
async fn relay(target: SocketAddr, seen: Arc<Seen>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((host, _)) = l.accept().await {
            let t = TcpStream::connect(target).await.unwrap();
            let (hr, hw) = host.into_split();
            let (tr, tw) = t.into_split();
            let up = seen.clone();
            tokio::spawn(pump(hr, tw, move |pdu| {
                if pdu[0] == H2C_TERM_REQ {
                    up.h2c_term_reqs.fetch_add(1, Ordering::Relaxed);
                }
            }));
            let down = seen.clone();
            tokio::spawn(pump(tr, hw, move |pdu| match pdu[0] {
                CAPSULE_RESP => {
                    down.capsule_resps.fetch_add(1, Ordering::Relaxed);
                }
                C2H_DATA => {
                    down.c2h_data.fetch_add(1, Ordering::Relaxed);
                    if pdu[1] & FLAG_SUCCESS != 0 {
                        down.c2h_success.fetch_add(1, Ordering::Relaxed);
                        if down.clear_last.load(Ordering::Relaxed) {
                            pdu[1] &= !FLAG_LAST_PDU;
                        }
                    }
                }
                _ => {}
            }));
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

async fn session(addr: SocketAddr, sq_flow_control: bool) -> NvmeSession {
    let url = NvmeUrl::parse(&format!("nvme+tcp://{addr}/{NQN}/1")).unwrap();
    let cfg = NvmeConfig {
        queues: 2,
        sq_flow_control,
        // No Keep Alive: its completions would be response capsules of their own.
        kato: Duration::ZERO,
        ..NvmeConfig::default()
    };
    tokio::time::timeout(Duration::from_secs(10), NvmeSession::open(&url, &cfg))
        .await
        .unwrap()
        .unwrap()
}

/// Reads of 4 KiB, 64 KiB and 1 MiB (and one of each again, so both queues see each size),
/// each checked against what was written.
async fn reads(s: &NvmeSession, data: &Bytes) -> usize {
    let mut n = 0;
    for blocks in [8u32, 128, 2048, 8, 128, 2048] {
        let back = s.read_into(0, blocks, BytesMut::new()).await.unwrap();
        assert_eq!(&back[..], &data[..blocks as usize * 512]);
        n += 1;
    }
    n
}

#[tokio::test]
async fn accepts_reads_ended_by_c2h_success_without_response_capsules_by_default() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let seen = Arc::new(Seen::default());
    let addr = relay(h.nvme_addrs[0], seen.clone()).await;
    let s = session(addr, false).await;
    let data = pattern(1 << 20);
    s.write(0, data.clone()).await.unwrap();

    // The bring-up's reads (Identify) went on the admin queue, whose Connect keeps SQ flow
    // control: they ended with response capsules.
    assert_eq!(seen.c2h_success.load(Ordering::Relaxed), 0);
    let (resps, c2h) = (
        seen.capsule_resps.load(Ordering::Relaxed),
        seen.c2h_data.load(Ordering::Relaxed),
    );
    let n = reads(&s, &data).await;
    assert_eq!(
        seen.c2h_data.load(Ordering::Relaxed),
        c2h + n,
        "one C2HData per read"
    );
    assert_eq!(
        seen.c2h_success.load(Ordering::Relaxed),
        n,
        "every read ends with SUCCESS"
    );
    assert_eq!(
        seen.capsule_resps.load(Ordering::Relaxed),
        resps,
        "no response capsule for a read that ended with SUCCESS"
    );
    // Commands without data still complete with a response capsule.
    s.flush().await.unwrap();
    assert_eq!(seen.capsule_resps.load(Ordering::Relaxed), resps + 1);
    s.close().await.unwrap();
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn accepts_a_response_capsule_for_every_read_when_the_host_keeps_sq_flow_control() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let seen = Arc::new(Seen::default());
    let addr = relay(h.nvme_addrs[0], seen.clone()).await;
    let s = session(addr, true).await;
    let data = pattern(1 << 20);
    s.write(0, data.clone()).await.unwrap();

    let (resps, c2h) = (
        seen.capsule_resps.load(Ordering::Relaxed),
        seen.c2h_data.load(Ordering::Relaxed),
    );
    let n = reads(&s, &data).await;
    assert_eq!(seen.c2h_data.load(Ordering::Relaxed), c2h + n);
    assert_eq!(
        seen.c2h_success.load(Ordering::Relaxed),
        0,
        "SUCCESS only when the host disabled SQ flow control"
    );
    assert_eq!(seen.capsule_resps.load(Ordering::Relaxed), resps + n);
    s.close().await.unwrap();
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn rejects_c2h_success_without_last_pdu_altered_on_the_path() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let seen = Arc::new(Seen::default());
    let addr = relay(h.nvme_addrs[0], seen.clone()).await;
    let s = session(addr, false).await;
    let data = pattern(65536);
    s.write(0, data.clone()).await.unwrap();
    // A clean read first: the path works.
    let back = s.read_into(0, 128, BytesMut::new()).await.unwrap();
    assert_eq!(&back[..], &data[..]);

    seen.clear_last.store(true, Ordering::Relaxed);
    let r = tokio::time::timeout(
        Duration::from_secs(10),
        s.read_into(0, 128, BytesMut::new()),
    )
    .await
    .expect("the read neither completed nor failed");
    assert!(
        r.is_err(),
        "a C2HData with SUCCESS and without LAST_PDU was taken as a completed read"
    );
    // The host ended the queue with an H2CTermReq (it arrives soon after the failure).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while seen.h2c_term_reqs.load(Ordering::Relaxed) == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no H2CTermReq from the host"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(s);
    h.shutdown().await.unwrap();
}
