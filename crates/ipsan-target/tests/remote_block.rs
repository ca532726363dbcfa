#![allow(clippy::unwrap_used, clippy::expect_used)]
//! A remote LUN as a block device (`ipsan_target::remote_block`): a real ipsan target on
//! loopback serving a `mem:` LUN, the real initiator, and every block operation through the
//! block layer's submit/complete form — then a SCSI logical unit on top of it, as a front
//! end other than the gateway's pass-through would use it.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::{DataDir, IscsiUrl, Session, SessionConfig};
use ipsan_scsi::aio::submit;
use ipsan_scsi::{Backend, IoCompletion, IoError, IoOp, IoRequest};
use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::remote_block::RemoteBlock;
use ipsan_target::ServerHandle;

const SIZE: u64 = 64 << 20;

async fn target() -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            "iqn.2026-11.test:remote-block",
            config::luns_from_specs(&["mem:64MiB".to_owned()]).unwrap(),
        )],
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

async fn session(t: &ServerHandle) -> Arc<Session> {
    let url = IscsiUrl::parse(&t.urls[0]).unwrap();
    let cfg = SessionConfig {
        command_timeout: Some(Duration::from_secs(30)),
        ..SessionConfig::default()
    };
    Arc::new(Session::open(&url, &cfg).await.unwrap())
}

async fn io(b: &RemoteBlock, tag: u64, op: IoOp) -> IoCompletion {
    let c = tokio::time::timeout(Duration::from_secs(30), submit(b, IoRequest { tag, op }))
        .await
        .expect("request completes");
    assert_eq!(c.tag, tag);
    c
}

async fn read(b: &RemoteBlock, offset: u64, len: usize) -> BytesMut {
    let buf = BytesMut::from(&b"hd"[..]);
    let mut got = io(b, 1, IoOp::Read { offset, len, buf })
        .await
        .result
        .unwrap()
        .unwrap();
    assert_eq!(&got[..2], b"hd", "read appends after what the buffer held");
    got.split_off(2)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_every_block_operation_against_a_remote_lun() {
    let t = target().await;
    let s = session(&t).await;
    let b = RemoteBlock::open(s.clone(), 0).await.unwrap();
    assert_eq!((b.size(), b.block_size()), (SIZE, 512));

    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 + 1) as u8).collect();
    let w = io(
        &b,
        2,
        IoOp::Write {
            offset: 4096,
            data: Bytes::from(data.clone()),
        },
    )
    .await;
    assert!(w.result.unwrap().is_none());
    assert_eq!(&read(&b, 4096, 8192).await[..], &data[..]);
    // What the block device wrote is what the remote LUN holds, read past the block layer.
    let direct = s
        .command(
            ipsan_initiator::scsi::read16(8, 16),
            DataDir::Read(BytesMut::new(), 8192),
        )
        .await
        .unwrap();
    assert_eq!(&direct.data[..], &data[..]);

    // COMPARE AND WRITE: a mismatch at byte 300 is reported at byte 300 and writes nothing.
    let mut stale = data[..512].to_vec();
    stale[300] ^= 0xFF;
    let c = io(
        &b,
        3,
        IoOp::CompareAndWrite {
            offset: 4096,
            compare: Bytes::from(stale),
            write: Bytes::from(vec![0xEE; 512]),
        },
    )
    .await;
    assert!(
        matches!(c.result, Err(IoError::Miscompare { offset: 300 })),
        "{:?}",
        c.result
    );
    assert_eq!(&read(&b, 4096, 512).await[..], &data[..512]);
    let c = io(
        &b,
        4,
        IoOp::CompareAndWrite {
            offset: 4096,
            compare: Bytes::copy_from_slice(&data[..512]),
            write: Bytes::from(vec![0xEE; 512]),
        },
    )
    .await;
    assert!(c.result.unwrap().is_none());
    assert!(read(&b, 4096, 512).await.iter().all(|&x| x == 0xEE));

    // Discard and write-zeroes both read back as zeros; flush completes.
    io(
        &b,
        5,
        IoOp::Discard {
            offset: 4096,
            len: 4096,
        },
    )
    .await
    .result
    .unwrap();
    assert!(read(&b, 4096, 4096).await.iter().all(|&x| x == 0));
    io(
        &b,
        6,
        IoOp::WriteZeroes {
            offset: 8192,
            len: 4096,
        },
    )
    .await
    .result
    .unwrap();
    assert!(read(&b, 8192, 4096).await.iter().all(|&x| x == 0));
    io(&b, 7, IoOp::Flush).await.result.unwrap();

    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_partial_blocks_and_ranges_past_the_remote_end() {
    let t = target().await;
    let b = RemoteBlock::open(session(&t).await, 0).await.unwrap();
    for (offset, len) in [
        (100, 512),
        (0, 100),
        (SIZE - 512, 1024),
        (u64::MAX - 511, 512),
    ] {
        let r = io(
            &b,
            9,
            IoOp::Read {
                offset,
                len,
                buf: BytesMut::new(),
            },
        )
        .await;
        match r.result {
            Err(IoError::Io(e)) => assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput),
            other => panic!("{offset}+{len}: {other:?}"),
        }
    }
    t.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn serves_a_scsi_logical_unit_on_a_remote_block_device() {
    let t = target().await;
    let b = Arc::new(RemoteBlock::open(session(&t).await, 0).await.unwrap());
    let lu = Arc::new(
        ipsan_scsi::LogicalUnit::new(b.clone(), ipsan_scsi::LuConfig::with_serial("remote"))
            .unwrap(),
    );
    assert_eq!(lu.num_blocks(), SIZE / 512);
    // WRITE(10) of 2 blocks at LBA 10 through the local LU, then READ(10) back.
    let nexus = ipsan_scsi::NexusId("iqn.test,i,0x000000000001".into());
    let mut w = [0u8; 16];
    w[0] = 0x2A;
    w[2..6].copy_from_slice(&10u32.to_be_bytes());
    w[7..9].copy_from_slice(&2u16.to_be_bytes());
    let data = Bytes::from(vec![0x5A; 1024]);
    let run = |cdb: &[u8], data: Bytes| {
        let (lu, nexus, cdb) = (lu.clone(), nexus.clone(), cdb.to_vec());
        async move {
            lu.execute_async(ipsan_scsi::OwnedRequest {
                cdb,
                data_out: data,
                nexus,
                lun: 0,
                tag: 1,
            })
            .await
        }
    };
    // TEST UNIT READY: consumes a power-on unit attention, if any.
    let _ = run(&[0; 6], Bytes::new()).await;
    let r = run(&w[..10], data.clone()).await;
    assert_eq!(r.status, ipsan_scsi::ScsiStatus::GOOD, "{:?}", r.sense);
    let mut rd = w;
    rd[0] = 0x28;
    let r = run(&rd[..10], Bytes::new()).await;
    assert_eq!(r.status, ipsan_scsi::ScsiStatus::GOOD, "{:?}", r.sense);
    assert_eq!(&r.data_in[..], &data[..]);
    // The bytes are on the remote LUN.
    assert_eq!(&read(&b, 10 * 512, 1024).await[..], &data[..]);
    t.shutdown().await.unwrap();
}
