#![allow(clippy::unwrap_used, clippy::expect_used)]
// The LU counts its own parses in debug builds only (`LogicalUnit::cdb_parses`).
#![cfg(debug_assertions)]
//! A CDB is parsed once per command (issue 32): the real target on loopback decodes it when
//! the engine sizes the command, and the typed command travels with the task to the LU, which
//! executes it without parsing the bytes again — the overflow rewrite of a WRITE included.

use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::scsi::{read16, read_capacity16, test_unit_ready, write16};
use ipsan_initiator::{DataDir, IscsiUrl, Session, SessionConfig};
use ipsan_scsi::LogicalUnit;
use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::ServerHandle;

const IQN: &str = "iqn.2026-11.test:parse-once";
const BS: usize = 512;

async fn target() -> ServerHandle {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            IQN,
            config::luns_from_specs(&["mem:16MiB".to_owned()]).unwrap(),
        )],
        ..Config::default()
    };
    c.validate().unwrap();
    ServerHandle::start(&c).await.unwrap()
}

async fn session(t: &ServerHandle) -> Session {
    let url = IscsiUrl::parse(&t.urls[0]).unwrap();
    let cfg = SessionConfig {
        command_timeout: Some(Duration::from_secs(30)),
        ..SessionConfig::default()
    };
    Session::open(&url, &cfg).await.unwrap()
}

fn lu(t: &ServerHandle) -> Arc<LogicalUnit> {
    t.registry().target(IQN).unwrap().luns[&0].clone()
}

async fn read(s: &Session, lba: u64, blocks: u32) -> BytesMut {
    let len = blocks as usize * BS;
    s.command(read16(lba, blocks), DataDir::Read(BytesMut::new(), len))
        .await
        .unwrap()
        .data
}

/// Writes, reads and non-data commands through the engine and the driver: the LU parses
/// each CDB once (when the engine sizes it), not once more when it executes it. The old
/// driver handed the LU the raw CDB to execute: two parses per command.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_each_command_with_one_parse_of_its_cdb() {
    let t = tokio::time::timeout(Duration::from_secs(30), target())
        .await
        .unwrap();
    let s = session(&t).await;
    let lu = lu(&t);
    let before = lu.cdb_parses();
    let mut sent = 0u64;
    for i in 0..4u8 {
        let data = Bytes::from(vec![i + 1; 8 * BS]);
        s.command(write16(u64::from(i) * 8, 8, false), DataDir::Write(data))
            .await
            .unwrap();
        sent += 1;
    }
    for i in 0..4u8 {
        let got = read(&s, u64::from(i) * 8, 8).await;
        assert!(got.iter().all(|&b| b == i + 1), "block run {i} reads back");
        sent += 1;
    }
    s.command(test_unit_ready(), DataDir::None).await.unwrap();
    s.command(read_capacity16(), DataDir::Read(BytesMut::new(), 32))
        .await
        .unwrap();
    sent += 2;
    assert_eq!(
        lu.cdb_parses() - before,
        sent,
        "one parse of each CDB, none at execution"
    );
    t.shutdown().await.unwrap();
}

/// A WRITE(16) of 4 blocks sent with 3½ blocks of data (EDTL < the CDB's transfer, RFC 7143
/// §11.4.5.1): the target rewrites the TRANSFER LENGTH to the 3 whole blocks EDTL covers and
/// the typed command follows the rewrite, so the LU writes those 3 blocks and leaves the 4th
/// as it was — still with one parse of the CDB by the LU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_an_overflowing_write_as_its_whole_blocks_with_one_parse() {
    let t = tokio::time::timeout(Duration::from_secs(30), target())
        .await
        .unwrap();
    let s = session(&t).await;
    let lu = lu(&t);
    s.command(
        write16(100, 4, false),
        DataDir::Write(Bytes::from(vec![0xAA; 4 * BS])),
    )
    .await
    .unwrap();
    let before = lu.cdb_parses();
    let c = s
        .command(
            write16(100, 4, false),
            DataDir::Write(Bytes::from(vec![0x55; 3 * BS + BS / 2])),
        )
        .await
        .unwrap();
    assert_eq!(
        c.residual,
        -(BS as i64 / 2),
        "overflow by the half block EDTL lacks"
    );
    assert_eq!(lu.cdb_parses() - before, 1, "the LU parsed the WRITE once");
    let got = read(&s, 100, 4).await;
    assert!(
        got[..3 * BS].iter().all(|&b| b == 0x55),
        "the 3 whole blocks are written"
    );
    assert!(
        got[3 * BS..].iter().all(|&b| b == 0xAA),
        "the 4th block, which EDTL covers only half of, is untouched"
    );
    t.shutdown().await.unwrap();
}
