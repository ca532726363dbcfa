//! One LUN served over iSCSI and NVMe/TCP at once by the real target: what ipsan's iSCSI
//! initiator writes, an NVMe/TCP host reads as namespace 1 (LUN 0), and back — in-capsule and
//! R2T-solicited writes, chunked reads, with and without header and data digests.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::time::Duration;

use bytes::Bytes;
use ipsan_initiator::{IscsiUrl, Session, SessionConfig};
use nvme_common::{controller, pattern, start, BS};
use nvme_wire::entry::Status;

async fn iscsi(h: &ipsan_target::ServerHandle) -> Session {
    let url = IscsiUrl::parse(&h.urls[0]).unwrap();
    let cfg = SessionConfig {
        command_timeout: Some(Duration::from_secs(30)),
        ..SessionConfig::default()
    };
    Session::open(&url, &cfg).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_the_same_lun_over_iscsi_and_nvme_tcp_both_ways() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = start("16MiB").await;
        let s = iscsi(&h).await;
        let nvme = h.nvme_addrs[0];
        for digests in [false, true] {
            let seed = u8::from(digests) * 0x55;
            let (_admin, mut io) = controller(nvme, digests).await;

            // iSCSI writes, NVMe reads: a small block and 300 KiB (several C2HData PDUs).
            let small = pattern(4096, seed ^ 1);
            let big = pattern(300 * 1024, seed ^ 2);
            s.write(8, Bytes::from(small.clone())).await.unwrap();
            s.write(1000, Bytes::from(big.clone())).await.unwrap();
            let (c, got) = io.read(1, 8, small.len()).await;
            assert_eq!(c.status, Status::SUCCESS);
            assert!(
                got == small,
                "NVMe reads what iSCSI wrote (4 KiB, digests {digests})"
            );
            let (c, got) = io.read(1, 1000, big.len()).await;
            assert_eq!(c.status, Status::SUCCESS);
            assert!(
                got == big,
                "NVMe reads what iSCSI wrote (300 KiB, digests {digests})"
            );

            // NVMe writes (in the capsule, and through an R2T in several H2CData PDUs),
            // iSCSI reads.
            let inline = pattern(2048, seed ^ 3);
            let solicited = pattern(520 * 1024, seed ^ 4);
            assert_eq!(io.write(1, 16, &inline).await.status, Status::SUCCESS);
            assert_eq!(io.write(1, 4000, &solicited).await.status, Status::SUCCESS);
            let got = s.read(16, (inline.len() / BS) as u32).await.unwrap();
            assert!(
                got[..] == inline[..],
                "iSCSI reads what NVMe wrote in the capsule"
            );
            let got = s.read(4000, (solicited.len() / BS) as u32).await.unwrap();
            assert!(
                got[..] == solicited[..],
                "iSCSI reads what NVMe wrote after an R2T"
            );
        }
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_reads_beyond_the_namespace_and_unknown_namespaces() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = start("1MiB").await;
        let (_admin, mut io) = controller(h.nvme_addrs[0], false).await;
        let (c, data) = io.read(1, 2047, 1024).await;
        assert_eq!(c.status, Status::LBA_OUT_OF_RANGE);
        assert!(data.is_empty());
        let (c, _) = io.read(2, 0, 512).await;
        assert_eq!(c.status, Status::INVALID_NAMESPACE);
        // The queue still works.
        assert_eq!(io.read(1, 2047, 512).await.0.status, Status::SUCCESS);
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
