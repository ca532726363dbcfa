//! A hostile NVMe/TCP client against the real target: a capsule before ICReq, a huge PLEN, a
//! reserved PDU type, a wrong HLEN, data beyond the R2T, data for a transfer tag never issued.
//! Each gets a C2HTermReq with the FES the NVMe/TCP specification names and a closed
//! connection; a host connected beside it keeps reading and writing, and nothing the attacker
//! sent was written.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::time::Duration;

use bytes::Bytes;
use nvme_common::{controller, pattern, start, start_with, Host, BS};
use nvme_wire::entry::{Sgl, Sqe, Status};
use nvme_wire::pdu::{CapsuleCmd, H2cData, Pdu, TermReq};
use nvme_wire::Fes;
use tokio::io::AsyncWriteExt;

/// The attacker's termination request, and proof the connection is then closed.
async fn terminated(h: &mut Host) -> TermReq {
    let pdus = tokio::time::timeout(Duration::from_secs(15), h.until_closed())
        .await
        .expect("the target closes the connection");
    let term = pdus.iter().find_map(|p| match p {
        Pdu::C2hTermReq(t) => Some(t.clone()),
        _ => None,
    });
    term.unwrap_or_else(|| panic!("no C2HTermReq among {pdus:?}"))
}

/// A write of `len` bytes through the transport: the attacker gets the R2T.
async fn write_cmd(h: &mut Host, slba: u64, len: usize) -> (u16, u16) {
    let cid = h.cid();
    let mut sqe = Sqe::new(0x01, cid, Sgl::Transport { length: len as u32 });
    sqe.nsid = 1;
    sqe.cdw[0] = slba as u32;
    sqe.cdw[2] = (len / BS - 1) as u32;
    h.send(&Pdu::CapsuleCmd(CapsuleCmd {
        sqe,
        data: Bytes::new(),
    }))
    .await;
    let Some(Pdu::R2t(r)) = h.recv().await else {
        panic!("no R2T")
    };
    (cid, r.ttag)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_hostile_pdus_with_a_term_req_and_keeps_serving_another_host() {
    tokio::time::timeout(Duration::from_secs(90), async {
        let h = start("16MiB").await;
        let addr = h.nvme_addrs[0];
        let (_admin, mut good) = controller(addr, false).await;
        let before = pattern(8192, 0x11);
        assert_eq!(good.write(1, 0, &before).await.status, Status::SUCCESS);

        // A command capsule before ICReq.
        let mut a = Host::tcp(addr).await;
        let mut sqe = Sqe::new(0x02, 1, Sgl::Transport { length: 512 });
        sqe.nsid = 1;
        a.send(&Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: Bytes::new(),
        }))
        .await;
        assert_eq!(terminated(&mut a).await.fes, Fes::PduSequenceError);

        // A capsule header claiming 1 GiB: refused from its common header, nothing buffered.
        let mut a = Host::connect(addr, false, false).await;
        let mut ch = vec![0x04, 0x00, 72, 72];
        ch.extend_from_slice(&(1u32 << 30).to_le_bytes());
        a.send_raw(&ch).await;
        let t = terminated(&mut a).await;
        assert_eq!((t.fes, t.fei), (Fes::InvalidHeaderField, 4));
        assert_eq!(&t.data[..8], &ch[..], "the header in error comes back");

        // A reserved PDU type, and a CapsuleCmd with the wrong HLEN.
        let mut a = Host::connect(addr, false, false).await;
        a.send_raw(&[0x0a, 0, 24, 0, 24, 0, 0, 0]).await;
        a.send_raw(&[0u8; 16]).await;
        let t = terminated(&mut a).await;
        assert_eq!((t.fes, t.fei), (Fes::InvalidHeaderField, 0));
        let mut a = Host::connect(addr, false, false).await;
        let mut bad = vec![0x04, 0, 24, 0, 72, 0, 0, 0];
        bad.resize(72, 0);
        a.send_raw(&bad).await;
        let t = terminated(&mut a).await;
        assert_eq!((t.fes, t.fei), (Fes::InvalidHeaderField, 2));

        // Data beyond the R2T: 12 KiB into an 8 KiB transfer over LBAs 0..16.
        let (_a_admin, mut a) = controller(addr, false).await;
        let (cid, ttag) = write_cmd(&mut a, 0, 8192).await;
        a.send(&Pdu::H2cData(H2cData {
            cccid: cid,
            ttag,
            datao: 0,
            last: true,
            data: Bytes::from(pattern(12 * 1024, 0x66)),
        }))
        .await;
        assert_eq!(terminated(&mut a).await.fes, Fes::DataTransferOutOfRange);

        // Data for a transfer tag the target never issued, then the rest of a write at an
        // offset past where its data ended.
        let (_a_admin, mut a) = controller(addr, false).await;
        let (cid, ttag) = write_cmd(&mut a, 0, 8192).await;
        a.send(&Pdu::H2cData(H2cData {
            cccid: cid,
            ttag: ttag.wrapping_add(100),
            datao: 0,
            last: true,
            data: Bytes::from(pattern(8192, 0x77)),
        }))
        .await;
        let t = terminated(&mut a).await;
        assert_eq!((t.fes, t.fei), (Fes::InvalidHeaderField, 10));
        let (_a_admin, mut a) = controller(addr, false).await;
        let (cid, ttag) = write_cmd(&mut a, 0, 8192).await;
        a.send(&Pdu::H2cData(H2cData {
            cccid: cid,
            ttag,
            datao: 4096,
            last: true,
            data: Bytes::from(pattern(4096, 0x88)),
        }))
        .await;
        assert_eq!(terminated(&mut a).await.fes, Fes::DataTransferOutOfRange);

        // The host beside them: still served, and LBAs 0..16 hold what it wrote, none of the
        // attackers' bytes.
        let (c, got) = good.read(1, 0, 8192).await;
        assert_eq!(c.status, Status::SUCCESS);
        assert!(got == before, "nothing an attacker sent was written");
        let after = pattern(4096, 0x22);
        assert_eq!(good.write(1, 64, &after).await.status, Status::SUCCESS);
        assert!(good.read(1, 64, 4096).await.1 == after);
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_data_digest_error_as_a_transient_error_and_writes_nothing() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = start("16MiB").await;
        let (_admin, mut io) = controller(h.nvme_addrs[0], true).await;
        let (cid, ttag) = write_cmd(&mut io, 32, 8192).await;
        let mut pdu = io
            .codec
            .to_bytes(&Pdu::H2cData(H2cData {
                cccid: cid,
                ttag,
                datao: 0,
                last: true,
                data: Bytes::from(pattern(8192, 0x99)),
            }))
            .unwrap()
            .to_vec();
        // Flip a data byte: the data digest no longer matches (NVMe/TCP 1.0 §3.6.1).
        pdu[200] ^= 0x01;
        io.send_raw(&pdu).await;
        let Some(Pdu::CapsuleResp(r)) = io.recv().await else {
            panic!("no response capsule")
        };
        assert_eq!(r.cqe.status, Status::TRANSIENT_TRANSPORT_ERROR);
        // Not written; the connection goes on.
        let (c, got) = io.read(1, 32, 8192).await;
        assert_eq!(c.status, Status::SUCCESS);
        assert!(got.iter().all(|&b| b == 0));
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

/// A host that keeps sending after its fatal PDU still gets the termination request (the
/// target drains what follows for a moment instead of closing with unread bytes, which makes
/// the kernel send a reset; on loopback the request got through before that either way, so
/// this proves the behaviour, not the race).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_bad_pdu_followed_by_more_bytes_and_the_term_req_still_arrives() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let h = start("1MiB").await;
        let mut a = Host::connect(h.nvme_addrs[0], false, false).await;
        let mut bad = vec![0x0a, 0, 24, 0, 24, 0, 0, 0];
        bad.resize(24, 0);
        a.send_raw(&bad).await;
        // What a pipelining host has in flight behind it.
        let trailer = vec![0x5au8; 256 * 1024];
        let w = a.s.write_all(&trailer).await;
        assert!(w.is_ok(), "{w:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        let t = terminated(&mut a).await;
        assert_eq!((t.fes, t.fei), (Fes::InvalidHeaderField, 0));
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

/// The limits that bound what one queue makes the target hold: a host that has more commands
/// in flight than its Connect gave the queue entries (SQSIZE 31: 32) is cut off (before this
/// only a 2048-command ceiling did), and in-capsule data beyond what the controller announced
/// (IOCCSZ, 64 KiB) is refused without writing it. With the in-capsule size at 64 KiB these
/// keep a queue's in-capsule data within its entries × 64 KiB.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_more_commands_than_the_queue_has_entries_and_in_capsule_data_beyond_ioccsz() {
    tokio::time::timeout(Duration::from_secs(60), async {
        const IN_CAPSULE: u32 = 64 * 1024;
        let h = start_with("16MiB", Some(IN_CAPSULE)).await;
        let addr = h.nvme_addrs[0];
        let (_admin, mut good) = controller(addr, false).await;
        let before = pattern(4096, 0x31);
        assert_eq!(good.write(1, 128, &before).await.status, Status::SUCCESS);

        // 33 writes through the transport, pipelined, none of their data sent: each holds a
        // slot of the queue (16 get R2Ts, the rest wait for theirs).
        let (_a_admin, mut a) = controller(addr, false).await;
        let mut burst = Vec::new();
        for _ in 0..33 {
            let cid = a.cid();
            let mut sqe = Sqe::new(0x01, cid, Sgl::Transport { length: 4096 });
            sqe.nsid = 1;
            sqe.cdw[0] = 128;
            sqe.cdw[2] = (4096 / BS - 1) as u32;
            let pdu = Pdu::CapsuleCmd(CapsuleCmd {
                sqe,
                data: Bytes::new(),
            });
            burst.extend_from_slice(&a.codec.to_bytes(&pdu).unwrap());
        }
        a.send_raw(&burst).await;
        assert_eq!(terminated(&mut a).await.fes, Fes::PduSequenceError);

        // In-capsule data 512 bytes (one block) beyond the I/O queues' in-capsule size.
        let (_b_admin, mut b) = controller(addr, false).await;
        let len = IN_CAPSULE as usize + 512;
        let cid = b.cid();
        let mut sqe = Sqe::new(
            0x01,
            cid,
            Sgl::InCapsule {
                offset: 0,
                length: len as u32,
            },
        );
        sqe.nsid = 1;
        sqe.cdw[0] = 128;
        sqe.cdw[2] = (len / BS - 1) as u32;
        b.send(&Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: Bytes::from(pattern(len, 0x44)),
        }))
        .await;
        let Some(Pdu::CapsuleResp(r)) = b.recv().await else {
            panic!("no response capsule")
        };
        assert_eq!(r.cqe.status, Status::DATA_SGL_LENGTH_INVALID);

        // Nothing of either was written; the host beside them is served.
        let (c, got) = good.read(1, 128, 4096).await;
        assert_eq!(c.status, Status::SUCCESS);
        assert!(got == before, "nothing an attacker sent was written");
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
