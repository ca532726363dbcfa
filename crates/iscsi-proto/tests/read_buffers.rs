//! Where an initiator READ's data lands (issue 27): the initiator engine binds a read's buffer
//! when the read's first data arrives, taking the buffer a caller handed in most recently,
//! not the one its own caller handed in with it. With many reads in flight whose callers hand
//! each read's data back with their next read (as `ipsan bench` does), the same buffer goes
//! round, still in the cache when the next read's data is copied into it, instead of one
//! buffer per read in flight (at 1 MiB × 16, 16 MiB of buffers, each long evicted when its
//! turn comes). What it must not change: every read gets its own bytes, in one buffer of its
//! own while it is in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use iscsi_proto::engine::initiator::{Command, Completion, Config, Connection, Data, Event};
use iscsi_proto::params::SessionParams;
use iscsi_wire::header::DataIn;
use iscsi_wire::{Pdu, RESERVED_TAG};

const SEG: usize = 4096;
const LEN: usize = 3 * SEG;

fn conn() -> (Connection, Instant) {
    let now = Instant::now();
    let params = SessionParams {
        target_max_recv_data_segment_length: SEG as u32,
        ..SessionParams::default()
    };
    let mut cfg = Config::new(params, 1, 64, 1);
    cfg.nop_interval = None;
    (Connection::new(cfg, now), now)
}

fn submit_read(c: &mut Connection, now: Instant, buf: BytesMut) -> u32 {
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x88; 16],
                data: Data::Read {
                    buf,
                    len: LEN as u32,
                },
                timed: false,
            },
        )
        .unwrap();
    while c.poll_transmit().is_some() {}
    itt
}

/// The READ `itt`'s data (`fill`) in three Data-In PDUs, each received in place where the
/// engine lends (the driver's reader does the same), the last with status `stat_sn`.
fn answer_placed(c: &mut Connection, now: Instant, itt: u32, stat_sn: u32, fill: u8) -> Completion {
    for n in 0..3u32 {
        let last = n == 2;
        let h = DataIn {
            final_: last,
            status_present: last,
            itt,
            ttt: RESERVED_TAG,
            stat_sn,
            exp_cmd_sn: stat_sn + 1,
            max_cmd_sn: stat_sn + 64,
            data_sn: n,
            buffer_offset: n * SEG as u32,
            ..DataIn::default()
        };
        let mut piece = c
            .lend_read_buffer(itt, n * SEG as u32, SEG)
            .expect("a buffer lent for the next Data-In");
        piece.extend_from_slice(&[fill.wrapping_add(n as u8); SEG]);
        c.handle_placed_data_in(now, Pdu::new(h, Bytes::new()), piece);
    }
    loop {
        match c.poll_event() {
            Some(Event::Completed { itt: done, result }) => {
                assert_eq!(done, itt);
                return result.unwrap();
            }
            Some(_) => {}
            None => panic!("READ {itt:#x} did not complete"),
        }
    }
}

/// Four READs in flight, each caller handing its buffer in with its read and handing the
/// data back with its next read: every completed READ has its own bytes, and from the first
/// on they all land in one buffer, the one handed back last (before, each read used the
/// buffer its caller handed in: four buffers in turn).
#[test]
fn accepts_reads_in_flight_landing_in_the_buffer_handed_in_last() {
    let (mut c, now) = conn();
    let mut in_flight: std::collections::VecDeque<u32> = (0..4)
        .map(|_| submit_read(&mut c, now, BytesMut::with_capacity(LEN)))
        .collect();
    let mut seen = Vec::new();
    for k in 0..12u8 {
        let itt = in_flight.pop_front().unwrap();
        let stat_sn = u32::from(k) + 1;
        let done = answer_placed(&mut c, now, itt, stat_sn, k.wrapping_mul(3));
        let want: Vec<u8> = (0..3u8)
            .flat_map(|n| [k.wrapping_mul(3).wrapping_add(n); SEG])
            .collect();
        assert_eq!(&done.data[..], &want[..], "READ {k}: its own bytes");
        seen.push(done.data.as_ptr());
        // The caller takes the data and hands the buffer back with its next READ.
        in_flight.push_back(submit_read(&mut c, now, done.data));
    }
    assert!(
        seen.iter().all(|p| *p == seen[0]),
        "the reads' data landed in {} buffers in turn, not in the one handed back last",
        {
            let mut d = seen.clone();
            d.sort();
            d.dedup();
            d.len()
        }
    );
}

/// READs whose callers hand in no buffer (a fresh `BytesMut`), with no other caller's buffer
/// waiting, each get one of their own when their data arrives: two READs in flight never
/// share a buffer.
#[test]
fn accepts_reads_without_buffers_each_bound_to_a_buffer_of_its_own() {
    let (mut c, now) = conn();
    let a = submit_read(&mut c, now, BytesMut::new());
    let b = submit_read(&mut c, now, BytesMut::new());
    // A's first Data-In binds it a fresh buffer; B's then binds another.
    let mut pa = c.lend_read_buffer(a, 0, SEG).unwrap();
    let mut pb = c.lend_read_buffer(b, 0, SEG).unwrap();
    assert!(pa.capacity() >= SEG && pb.capacity() >= SEG);
    assert_ne!(pa.as_ptr(), pb.as_ptr(), "two reads in flight, one buffer");
    pa.extend_from_slice(&[1; SEG]);
    pb.extend_from_slice(&[2; SEG]);
    drop((pa, pb));
}
