//! An attacker on the path between ipsan's NVMe/TCP host and ipsan's target (in process, on
//! loopback): a relay that flips one bit of read data in every C2HData PDU it forwards. With
//! data digests the host refuses the altered data (the read fails with Transient Transport
//! Error and the connection goes on); without them the altered data reaches the caller,
//! which is what the digest is for.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{NvmeConfig, NvmeError, NvmeSession, NvmeUrl};
use nvme_wire::entry::Status;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IQN: &str = "iqn.2026-11.org.ipsan:nvme-relay";
const NQN: &str = "nqn.2026-11.org.ipsan:nvme-relay";

/// A relay to `target`; while `flip` is set, the first data byte of every C2HData PDU from
/// the target is altered.
async fn relay(target: SocketAddr, flip: Arc<AtomicBool>) -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = l.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((host, _)) = l.accept().await {
            let t = TcpStream::connect(target).await.unwrap();
            let (mut hr, mut hw) = host.into_split();
            let (mut tr, mut tw) = t.into_split();
            tokio::spawn(async move {
                let _ = tokio::io::copy(&mut hr, &mut tw).await;
            });
            let flip = flip.clone();
            tokio::spawn(async move {
                let mut buf = BytesMut::new();
                loop {
                    // Forward whole PDUs (PLEN from the common header).
                    while buf.len() >= 8 {
                        let plen = u32::from_le_bytes([buf[4], buf[5], buf[6], buf[7]]) as usize;
                        if buf.len() < plen {
                            break;
                        }
                        let mut pdu = buf.split_to(plen);
                        let pdo = usize::from(pdu[3]);
                        if pdu[0] == 0x07 && pdo != 0 && flip.load(Ordering::Relaxed) {
                            pdu[pdo] ^= 0x01;
                        }
                        if hw.write_all(&pdu).await.is_err() {
                            return;
                        }
                    }
                    match tr.read_buf(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(_) => {}
                    }
                }
            });
        }
    });
    addr
}

fn pattern(len: usize) -> Bytes {
    (0..len as u32)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect::<Vec<u8>>()
        .into()
}

async fn session(addr: SocketAddr, data_digest: bool) -> NvmeSession {
    let url = NvmeUrl::parse(&format!("nvme+tcp://{addr}/{NQN}/1")).unwrap();
    let cfg = NvmeConfig {
        header_digest: true,
        data_digest,
        ..NvmeConfig::default()
    };
    NvmeSession::open(&url, &cfg).await.unwrap()
}

#[tokio::test]
async fn rejects_read_data_altered_on_the_path_when_data_digests_are_on() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let flip = Arc::new(AtomicBool::new(false));
    let addr = relay(h.nvme_addrs[0], flip.clone()).await;
    let s = session(addr, true).await;
    assert!(s.transport().1, "data digests in force");
    let data = pattern(65536);
    s.write(0, data.clone()).await.unwrap();

    flip.store(true, Ordering::Relaxed);
    let r = s.read_into(0, 128, BytesMut::new()).await;
    match r {
        Err(NvmeError::Status { status, .. }) => {
            assert_eq!(status, Status::TRANSIENT_TRANSPORT_ERROR);
        }
        other => panic!("altered data was not refused: {other:?}"),
    }

    // A data digest error fails the command, not the connection.
    flip.store(false, Ordering::Relaxed);
    let back = s.read_into(0, 128, BytesMut::new()).await.unwrap();
    assert_eq!(&back[..], &data[..]);
    s.close().await.unwrap();
    h.shutdown().await.unwrap();
}

#[tokio::test]
async fn accepts_altered_read_data_without_data_digests_which_is_what_they_are_for() {
    let h = common::nvme_target(IQN, "mem:16MiB").await;
    let flip = Arc::new(AtomicBool::new(false));
    let addr = relay(h.nvme_addrs[0], flip.clone()).await;
    let s = session(addr, false).await;
    let data = pattern(65536);
    s.write(0, data.clone()).await.unwrap();
    flip.store(true, Ordering::Relaxed);
    let back = s.read_into(0, 128, BytesMut::new()).await.unwrap();
    assert_ne!(&back[..], &data[..], "the relay altered nothing");
    assert_eq!(back[0], data[0] ^ 0x01);
    s.close().await.unwrap();
    h.shutdown().await.unwrap();
}
