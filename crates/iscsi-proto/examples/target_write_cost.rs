//! The target engine's own work per WRITE, for counting instructions
//! (docs/results/refactor-ab/w64-counts): N WRITE(16) commands of 64 KiB, each with its data
//! as immediate data, one at a time through a one-connection session as the target's driver
//! uses it (`handle_pdu`, the `Execute` event, `complete_with_residual`, the status out), no
//! I/O. Run it under `valgrind --tool=callgrind` with two N and subtract: what is left is the
//! engine's instructions per command.
//!
//! `cargo run --release -p iscsi-proto --example target_write_cost -- 3000`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use bytes::Bytes;
use iscsi_proto::engine::target::session::Session;
use iscsi_proto::engine::target::{Config, Event, LunDirectory, Response, Sizing};
use iscsi_proto::params::SessionParams;
use iscsi_wire::header::{ScsiCommand, TaskAttr};
use iscsi_wire::Pdu;

/// One LUN whose WRITE(16)s need the bytes their CDB says.
struct Disk;

impl LunDirectory for Disk {
    fn exists(&self, lun: u64) -> bool {
        lun == 0
    }
    fn size(&self, _itt: u32, _lun: u64, cdb: &[u8], _edtl: u32) -> Sizing {
        let blocks = u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]]);
        Sizing {
            need: u64::from(blocks) * 512,
            ..Sizing::default()
        }
    }
}

fn main() {
    let n: u32 = std::env::args()
        .nth(1)
        .map(|a| a.parse().expect("a number of commands"))
        .unwrap_or(1000);
    // What `ipsan bench` and the target negotiate (ImmediateData=Yes, InitialR2T=No, 256 KiB
    // segments): a 64 KiB WRITE is one PDU.
    let params = SessionParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 16 << 20,
        max_burst_length: 16 << 20,
        initiator_max_recv_data_segment_length: 256 << 10,
        target_max_recv_data_segment_length: 256 << 10,
        ..SessionParams::default()
    };
    let now = Instant::now();
    let (mut s, id) = Session::<()>::new(Config::new(params, 1, 1), now);
    let data = Bytes::from(vec![7u8; 64 << 10]);
    let blocks: u32 = 128;
    for i in 0..n {
        let mut cdb = [0u8; 16];
        cdb[0] = 0x8a;
        cdb[2..10].copy_from_slice(&u64::from(i * blocks).to_be_bytes());
        cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt: i + 1,
            expected_data_transfer_length: blocks * 512,
            cmd_sn: i + 1,
            exp_stat_sn: i + 1,
            cdb,
        };
        s.handle_pdu(id, now, &Disk, Pdu::new(cmd, data.clone()));
        let Some(Event::Execute(x)) = s.poll_event_of(id) else {
            panic!("command {i} did not execute")
        };
        assert_eq!(x.data_out.len(), data.len());
        assert!(s.complete_with_residual(id, x.itt, Response::good(Bytes::new()), None));
        let mut sent = 0;
        while let Some(p) = s.poll_transmit(id) {
            std::hint::black_box(&p);
            sent += 1;
        }
        assert_eq!(sent, 1, "one status per command");
        let _ = s.take_touched();
    }
    println!("{n} writes");
}
