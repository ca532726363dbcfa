//! One reservation state per LU across both protocols (issue 30, docs/nvme.md
//! "Reservations"): the real target serves one RAM LUN over iSCSI and NVMe/TCP; ipsan's own
//! NVMe/TCP host (`ipsan_initiator::nvme`) and ipsan's iSCSI initiator reserve it, and each
//! protocol's access is refused while the other holds a reservation — an iSCSI WRITE gets
//! RESERVATION CONFLICT under an NVMe host's Write Exclusive, an NVMe Write gets Reservation
//! Conflict under an iSCSI initiator's, and an NVMe host preempts the iSCSI one. A second
//! NVMe host claiming the first host's NQN with another Host Identifier is another
//! registrant and cannot release or write.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{NvmeConfig, NvmeError, NvmeSession, NvmeUrl};
use ipsan_initiator::{DataDir, IscsiUrl, Session, SessionConfig};
use nvme_common::{start, NQN};
use nvme_wire::entry::Status;

const GOOD: u8 = 0x00;
const CHECK_CONDITION: u8 = 0x02;
const RESERVATION_CONFLICT: u8 = 0x18;

async fn iscsi(h: &ipsan_target::ServerHandle) -> Session {
    let url = IscsiUrl::parse(&h.urls[0]).unwrap();
    let cfg = SessionConfig {
        command_timeout: Some(Duration::from_secs(30)),
        ..SessionConfig::default()
    };
    Session::open(&url, &cfg).await.unwrap()
}

async fn nvme(h: &ipsan_target::ServerHandle, cfg: &NvmeConfig) -> NvmeSession {
    let url = NvmeUrl::parse(&format!("nvme+tcp://{}/{NQN}/1", h.nvme_addrs[0])).unwrap();
    NvmeSession::open(&url, cfg).await.unwrap()
}

/// A CDB to LUN 0: its SCSI status and Data-In. A unit attention (a reservation change
/// reported to this nexus) is taken and the command sent again.
async fn scsi_data(s: &Session, cdb: &[u8], dir: impl Fn() -> DataDir) -> (u8, BytesMut) {
    let mut c = [0u8; 16];
    c[..cdb.len()].copy_from_slice(cdb);
    for _ in 0..4 {
        let p = s.command_to(0, c, dir()).await.unwrap();
        if p.status != CHECK_CONDITION {
            return (p.status, p.data);
        }
        let sense = p.sense.unwrap();
        // The sense key: byte 2 in fixed format, byte 1 in descriptor format; 6 = UNIT
        // ATTENTION.
        let key = if sense[0] & 0x7f >= 0x72 {
            sense[1]
        } else {
            sense[2]
        } & 0x0f;
        assert_eq!(key, 6, "a CHECK CONDITION other than a unit attention");
    }
    panic!("unit attentions did not clear");
}

async fn scsi(s: &Session, cdb: &[u8], dir: impl Fn() -> DataDir) -> u8 {
    scsi_data(s, cdb, dir).await.0
}

async fn scsi_write(s: &Session) -> u8 {
    let cdb = [0x2a, 0, 0, 0, 0, 8, 0, 0, 1, 0];
    scsi(s, &cdb, || DataDir::Write(Bytes::from(vec![0x5a; 512]))).await
}

async fn scsi_read(s: &Session) -> u8 {
    let cdb = [0x28, 0, 0, 0, 0, 8, 0, 0, 1, 0];
    scsi(s, &cdb, || DataDir::Read(BytesMut::new(), 512)).await
}

/// PERSISTENT RESERVE OUT (SPC-4 §6.16) with RESERVATION KEY `key` and SERVICE ACTION
/// RESERVATION KEY `sa_key`.
async fn pr_out(s: &Session, sa: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let cdb = [0x5f, sa, kind, 0, 0, 0, 0, 0, 24, 0];
    let mut data = key.to_be_bytes().to_vec();
    data.extend_from_slice(&sa_key.to_be_bytes());
    data.extend_from_slice(&[0; 8]);
    scsi(s, &cdb, || DataDir::Write(Bytes::from(data.clone()))).await
}

/// PERSISTENT RESERVE IN READ RESERVATION: the holder's key and the type, if any.
async fn read_reservation(s: &Session) -> Option<(u64, u8)> {
    let cdb = [0x5e, 0x01, 0, 0, 0, 0, 0, 0, 24, 0];
    let (status, d) = scsi_data(s, &cdb, || DataDir::Read(BytesMut::new(), 24)).await;
    assert_eq!(status, GOOD);
    let len = u32::from_be_bytes(d[4..8].try_into().unwrap());
    (len >= 16).then(|| {
        (
            u64::from_be_bytes(d[8..16].try_into().unwrap()),
            d[21] & 0x0f,
        )
    })
}

fn conflict<T: std::fmt::Debug>(r: Result<T, NvmeError>) -> bool {
    match r {
        Err(NvmeError::Status { status, .. }) => status == Status::RESERVATION_CONFLICT,
        other => panic!("expected Reservation Conflict, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_an_iscsi_write_while_an_nvme_host_holds_write_exclusive() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = start("4MiB").await;
        let cfg = NvmeConfig::default();
        let host = nvme(&h, &cfg).await;
        let s = iscsi(&h).await;
        assert_eq!(scsi_write(&s).await, GOOD, "no reservation yet");

        host.resv_register(0, false, 0, 0xa1).await.unwrap();
        host.resv_acquire(0, 1, 0xa1, 0).await.unwrap();
        let r = host.resv_report().await.unwrap();
        assert_eq!(r.rtype, 1, "Write Exclusive");
        assert_eq!(r.registrants.len(), 1);
        assert!(r.registrants[0].holds);
        assert_eq!(r.registrants[0].rkey, 0xa1);
        assert_eq!(r.registrants[0].hostid, cfg.hostid);

        // The SCSI side sees the NVMe host's reservation as its own kind: WRITE EXCLUSIVE.
        assert_eq!(read_reservation(&s).await, Some((0xa1, 1)));
        assert_eq!(scsi_write(&s).await, RESERVATION_CONFLICT);
        assert_eq!(
            scsi_read(&s).await,
            GOOD,
            "Write Exclusive lets others read"
        );
        // An iSCSI registrant cannot reserve over it either.
        assert_eq!(pr_out(&s, 0x00, 0, 0, 0xb2).await, GOOD, "REGISTER");
        assert_eq!(
            pr_out(&s, 0x01, 3, 0xb2, 0).await,
            RESERVATION_CONFLICT,
            "RESERVE Exclusive Access"
        );
        // The holder writes.
        host.write(8, Bytes::from(vec![1u8; 512])).await.unwrap();

        // A second host claiming the holder's NQN with another Host Identifier is not it.
        let impostor = NvmeConfig {
            hostnqn: cfg.hostnqn.clone(),
            ..NvmeConfig::default()
        };
        let other = nvme(&h, &impostor).await;
        assert!(conflict(other.resv_release(0, 1, 0xa1).await));
        assert!(conflict(other.write(8, Bytes::from(vec![2u8; 512])).await));
        assert_eq!(host.resv_report().await.unwrap().rtype, 1, "still held");

        host.resv_release(0, 1, 0xa1).await.unwrap();
        assert_eq!(read_reservation(&s).await, None);
        assert_eq!(scsi_write(&s).await, GOOD, "released");
        other.close().await.unwrap();
        host.close().await.unwrap();
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_an_nvme_write_while_an_iscsi_initiator_holds_write_exclusive() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = start("4MiB").await;
        let s = iscsi(&h).await;
        let host = nvme(&h, &NvmeConfig::default()).await;
        host.write(8, Bytes::from(vec![1u8; 512])).await.unwrap();

        assert_eq!(pr_out(&s, 0x00, 0, 0, 0xb2).await, GOOD, "REGISTER");
        assert_eq!(pr_out(&s, 0x01, 1, 0xb2, 0).await, GOOD, "RESERVE WE");
        assert!(conflict(host.write(8, Bytes::from(vec![2u8; 512])).await));
        host.read_into(8, 1, BytesMut::new()).await.unwrap();
        // The NVMe host sees the iSCSI registrant (no Host Identifier) holding it.
        let r = host.resv_report().await.unwrap();
        assert_eq!(r.rtype, 1);
        assert_eq!(r.registrants.len(), 1);
        assert_eq!(
            (r.registrants[0].rkey, r.registrants[0].holds),
            (0xb2, true)
        );
        assert_eq!(r.registrants[0].hostid, [0; 16]);
        assert_eq!(r.registrants[0].cntlid, 0xffff);
        // Registered, the NVMe host cannot acquire over it ...
        host.resv_register(0, false, 0, 0xc3).await.unwrap();
        assert!(conflict(host.resv_acquire(0, 1, 0xc3, 0).await));
        assert!(
            conflict(host.resv_acquire(0, 1, 0xbad, 0).await),
            "a wrong key"
        );
        // ... but preempts it (Exclusive Access now): the iSCSI side may not even read.
        host.resv_acquire(1, 2, 0xc3, 0xb2).await.unwrap();
        assert_eq!(read_reservation(&s).await, Some((0xc3, 3)));
        assert_eq!(scsi_read(&s).await, RESERVATION_CONFLICT);
        assert_eq!(scsi_write(&s).await, RESERVATION_CONFLICT);
        host.write(8, Bytes::from(vec![3u8; 512])).await.unwrap();
        let r = host.resv_report().await.unwrap();
        assert_eq!(
            (r.rtype, r.registrants.len()),
            (2, 1),
            "the iSCSI key is gone"
        );
        // Clear: everything goes, both protocols write again.
        host.resv_release(1, 0, 0xc3).await.unwrap();
        assert_eq!(scsi_write(&s).await, GOOD);
        host.write(8, Bytes::from(vec![4u8; 512])).await.unwrap();
        host.close().await.unwrap();
        s.logout().await.unwrap();
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
