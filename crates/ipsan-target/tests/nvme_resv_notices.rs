//! Reservation notifications (issue 30, docs/nvme.md "Reservations"): the real target serves
//! one RAM LUN over iSCSI and NVMe/TCP; two NVMe hosts (raw hosts speaking `nvme-wire`, so the
//! test can hold an Asynchronous Event Request and read log page 80h itself) and ipsan's iSCSI
//! initiator share its reservation state. A host whose registration another NVMe host
//! preempts, or an iSCSI initiator preempts, or whose reservation an iSCSI initiator
//! releases, gets its Asynchronous Event Request completed (I/O Command Specific,
//! Reservation Log Page Available) and reads the notification from the Reservation
//! Notification log page; the Reservation Notification Mask (82h) keeps a masked type away.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::time::Duration;

use bytes::Bytes;
use ipsan_initiator::{DataDir, IscsiUrl, Session, SessionConfig};
use nvme_common::{start, Host, NQN};
use nvme_wire::entry::{Sgl, Sqe, Status};
use nvme_wire::fabrics::CNTLID_DYNAMIC;
use nvme_wire::pdu::{CapsuleCmd, Pdu};

const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0000-4000-8000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0000-4000-8000-00000000000b";
/// AER completion DW0: type I/O Command Specific (6h), Reservation Log Page Available (00h),
/// log page 80h.
const RESV_AEN: u32 = 6 | 0x80 << 16;
const CHECK_CONDITION: u8 = 0x02;

/// One NVMe host: its admin queue and one I/O queue.
struct NvmeHost {
    admin: Host,
    io: Host,
}

async fn nvme_host(addr: std::net::SocketAddr, hostnqn: &str) -> NvmeHost {
    let mut admin = Host::connect(addr, false, false).await;
    let c = admin
        .fabrics_connect_as(0, CNTLID_DYNAMIC, NQN, hostnqn, 30_000)
        .await;
    assert_eq!(c.status, Status::SUCCESS);
    let cntlid = (c.dw0 & 0xffff) as u16;
    assert_eq!(admin.enable().await.status, Status::SUCCESS);
    let mut io = Host::connect(addr, false, false).await;
    let c = io.fabrics_connect_as(1, cntlid, NQN, hostnqn, 0).await;
    assert_eq!(c.status, Status::SUCCESS);
    NvmeHost { admin, io }
}

impl NvmeHost {
    /// Sends an Asynchronous Event Request with `cid` (held by the controller).
    async fn aer(&mut self, cid: u16) {
        let sqe = Sqe::new(0x0c, cid, Sgl::Transport { length: 0 });
        self.admin
            .send(&Pdu::CapsuleCmd(CapsuleCmd {
                sqe,
                data: Bytes::new(),
            }))
            .await;
    }

    /// Waits (10 s at most) for the held AER `cid` to complete; its DW0.
    async fn aer_done(&mut self, cid: u16) -> u32 {
        match self.admin.recv().await {
            Some(Pdu::CapsuleResp(r)) => {
                assert_eq!(r.cqe.cid, cid);
                assert_eq!(r.cqe.status, Status::SUCCESS);
                r.cqe.dw0
            }
            other => panic!("expected the AER's completion, got {other:?}"),
        }
    }

    /// The Reservation Notification log page: (Log Page Count, type, more, NSID).
    async fn resv_log(&mut self) -> (u64, u8, u8, u32) {
        let cid = self.admin.cid();
        let mut sqe = Sqe::new(0x02, cid, Sgl::Transport { length: 64 });
        sqe.nsid = u32::MAX;
        sqe.cdw[0] = 0x80 | 15 << 16;
        let (cqe, d) = self.admin.command(sqe, Bytes::new()).await;
        assert_eq!(cqe.status, Status::SUCCESS);
        assert_eq!(d.len(), 64);
        (
            u64::from_le_bytes(d[0..8].try_into().unwrap()),
            d[8],
            d[9],
            u32::from_le_bytes(d[12..16].try_into().unwrap()),
        )
    }

    /// A reservation command on namespace 1 with its data; the status.
    async fn resv(&mut self, opcode: u8, cdw10: u32, data: Vec<u8>) -> Status {
        let cid = self.io.cid();
        let mut sqe = Sqe::new(opcode, cid, Sgl::Transport { length: 0 });
        sqe.nsid = 1;
        sqe.cdw[0] = cdw10;
        self.io.command(sqe, Bytes::from(data)).await.0.status
    }

    /// Reservation Register (RREGA 000b) with NRKEY `key`.
    async fn register(&mut self, key: u64) -> Status {
        self.resv(0x0d, 0, keys(0, key)).await
    }

    /// Set Features Reservation Notification Mask (82h) of namespace 1.
    async fn mask(&mut self, bits: u32) -> Status {
        let cid = self.admin.cid();
        let mut sqe = Sqe::new(0x09, cid, Sgl::Transport { length: 0 });
        sqe.nsid = 1;
        sqe.cdw[0] = 0x82;
        sqe.cdw[1] = bits;
        self.admin.command(sqe, Bytes::new()).await.0.status
    }
}

fn keys(a: u64, b: u64) -> Vec<u8> {
    let mut d = a.to_le_bytes().to_vec();
    d.extend_from_slice(&b.to_le_bytes());
    d
}

/// PERSISTENT RESERVE OUT (SPC-4 §6.16) from the iSCSI initiator; unit attentions are taken
/// and the command sent again. The status.
async fn pr_out(s: &Session, sa: u8, kind: u8, key: u64, sa_key: u64) -> u8 {
    let mut cdb = [0u8; 16];
    cdb[..10].copy_from_slice(&[0x5f, sa, kind, 0, 0, 0, 0, 0, 24, 0]);
    let mut data = key.to_be_bytes().to_vec();
    data.extend_from_slice(&sa_key.to_be_bytes());
    data.extend_from_slice(&[0; 8]);
    for _ in 0..4 {
        let p = s
            .command_to(0, cdb, DataDir::Write(Bytes::from(data.clone())))
            .await
            .unwrap();
        if p.status != CHECK_CONDITION {
            return p.status;
        }
    }
    panic!("unit attentions did not clear");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_reservation_notices_from_nvme_and_iscsi_changes_as_async_events() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let h = start("4MiB").await;
        let addr = h.nvme_addrs[0];
        let mut a = nvme_host(addr, HOST_A).await;
        let mut b = nvme_host(addr, HOST_B).await;
        a.aer(0x100).await;
        b.aer(0x200).await;
        assert_eq!(a.register(0xa).await, Status::SUCCESS);
        assert_eq!(b.register(0xb).await, Status::SUCCESS);

        // B preempts A's registration (Acquire, RACQA 001b, Write Exclusive, PRKEY A's).
        let s = b.resv(0x11, 1 | 1 << 8, keys(0xb, 0xa)).await;
        assert_eq!(s, Status::SUCCESS);
        assert_eq!(a.aer_done(0x100).await, RESV_AEN, "A is told");
        assert_eq!(
            a.resv_log().await,
            (1, 1, 0, 1),
            "Registration Preempted, NSID 1"
        );
        assert_eq!(a.resv_log().await, (0, 0, 0, 0), "read: the empty page");

        // An iSCSI initiator preempts B's registration: B is told (the change is SCSI's).
        let url = IscsiUrl::parse(&h.urls[0]).unwrap();
        let iscsi = Session::open(
            &url,
            &SessionConfig {
                command_timeout: Some(Duration::from_secs(30)),
                ..SessionConfig::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(pr_out(&iscsi, 0x06, 0, 0, 0xc).await, 0, "REGISTER");
        assert_eq!(pr_out(&iscsi, 0x04, 1, 0xc, 0xb).await, 0, "PREEMPT B");
        assert_eq!(b.aer_done(0x200).await, RESV_AEN, "B is told");
        assert_eq!(b.resv_log().await, (1, 1, 0, 1), "Registration Preempted");

        // The iSCSI initiator reserves (Write Exclusive - Registrants Only) and releases:
        // A, registered again, is told the reservation was released.
        a.aer(0x101).await;
        assert_eq!(a.register(0xa2).await, Status::SUCCESS);
        assert_eq!(pr_out(&iscsi, 0x01, 5, 0xc, 0).await, 0, "RESERVE WE-RO");
        assert_eq!(pr_out(&iscsi, 0x02, 5, 0xc, 0).await, 0, "RELEASE");
        assert_eq!(a.aer_done(0x101).await, RESV_AEN);
        assert_eq!(a.resv_log().await, (2, 2, 0, 1), "Reservation Released");

        // Masked (82h bit 2, Reservation Released): the same again tells A nothing.
        assert_eq!(a.mask(0x04).await, Status::SUCCESS);
        a.aer(0x102).await;
        assert_eq!(pr_out(&iscsi, 0x01, 5, 0xc, 0).await, 0, "RESERVE WE-RO");
        assert_eq!(pr_out(&iscsi, 0x02, 5, 0xc, 0).await, 0, "RELEASE");
        tokio::time::sleep(Duration::from_millis(2500)).await;
        // A completion of AER 0x102 now would fail `command`'s CID check.
        assert_eq!(a.resv_log().await, (0, 0, 0, 0), "masked: no page");
        iscsi.logout().await.unwrap();
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
