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

/// `ipsan ctl lun add` (a live change of the running configuration) reaches NVMe/TCP: the
/// new LUN 1 becomes namespace 2 on the same connection, and what NVMe writes there iSCSI
/// reads from LUN 1; removing it makes the namespace go away.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_lun_added_live_as_a_new_namespace() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let toml = format!(
            "[server]\nportals = [\"127.0.0.1:0\"]\n[nvme]\nlisten = [\"127.0.0.1:0\"]\n\
             [[target]]\niqn = \"{}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
            nvme_common::IQN
        );
        let c = ipsan_target::Config::from_toml(&toml).unwrap();
        let h = ipsan_target::ServerHandle::start(&c).await.unwrap();
        let (_admin, mut io) = controller(h.nvme_addrs[0], false).await;
        assert_eq!(io.read(1, 0, 512).await.0.status, Status::SUCCESS);
        assert_eq!(io.read(2, 0, 512).await.0.status, Status::INVALID_NAMESPACE);

        h.registry()
            .change(false, |f| {
                f.target[0]
                    .lun
                    .push(ipsan_target::config::FileLun::new(1, "mem:2MiB".into()));
                Ok(())
            })
            .unwrap();
        let data = pattern(4096, 0x42);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let c = io.write(2, 8, &data).await;
            if c.status == Status::SUCCESS {
                break;
            }
            assert_eq!(c.status, Status::INVALID_NAMESPACE);
            assert!(
                tokio::time::Instant::now() < deadline,
                "namespace 2 never appeared"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let url = IscsiUrl::parse(&format!("{}1", h.urls[0].strip_suffix('0').unwrap())).unwrap();
        let s = Session::open(&url, &SessionConfig::default())
            .await
            .unwrap();
        let got = s.read(8, (data.len() / BS) as u32).await.unwrap();
        assert!(
            got[..] == data[..],
            "iSCSI LUN 1 holds what NVMe wrote to namespace 2"
        );
        s.logout().await.unwrap();

        h.registry()
            .change(true, |f| {
                f.target[0].lun.retain(|l| l.id == 0);
                Ok(())
            })
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while io.read(2, 0, 512).await.0.status == Status::SUCCESS {
            assert!(
                tokio::time::Instant::now() < deadline,
                "namespace 2 never went away"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(io.read(1, 0, 512).await.0.status, Status::SUCCESS);
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
