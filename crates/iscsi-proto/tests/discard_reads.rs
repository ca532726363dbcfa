//! A READ that keeps none of its data (`Data::Discard`, issue 27: `ipsan bench --sink
//! discard`, the work libiscsi's `iscsi-perf` does). What it must do: check and count every
//! Data-In exactly as a kept read's (a short, misordered or overlong answer fails the same
//! way), complete with no data, and receive the segments it places into one scratch buffer
//! that goes round, whatever the read.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Instant;

use bytes::Bytes;
use iscsi_proto::engine::initiator::{
    Command, Completion, Config, Connection, Data, Event, TaskError,
};
use iscsi_proto::engine::Violation;
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

fn submit_discard(c: &mut Connection, now: Instant) -> u32 {
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x88; 16],
                data: Data::Discard { len: LEN as u32 },
                timed: false,
            },
        )
        .unwrap();
    while c.poll_transmit().is_some() {}
    itt
}

fn data_in(itt: u32, n: u32, stat_sn: u32, last: bool) -> DataIn {
    DataIn {
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
    }
}

fn completion(c: &mut Connection, itt: u32) -> Result<Completion, TaskError> {
    loop {
        match c.poll_event() {
            Some(Event::Completed { itt: done, result }) => {
                assert_eq!(done, itt);
                return result;
            }
            Some(_) => {}
            None => panic!("READ {itt:#x} did not complete"),
        }
    }
}

/// Twelve discarded READs, four in flight, each answered in three Data-In received in place
/// where the engine lends: every one completes GOOD with no data, and every segment of every
/// read was lent the same scratch buffer (a kept read lends the free end of its own buffer).
#[test]
fn accepts_discarded_reads_received_into_one_scratch_buffer() {
    let (mut c, now) = conn();
    let mut in_flight: std::collections::VecDeque<u32> =
        (0..4).map(|_| submit_discard(&mut c, now)).collect();
    let mut lent = Vec::new();
    for k in 0..12u32 {
        let itt = in_flight.pop_front().unwrap();
        for n in 0..3u32 {
            let mut piece = c
                .lend_read_buffer(itt, n * SEG as u32, SEG)
                .expect("the scratch buffer lent for the next Data-In");
            assert!(piece.is_empty() && piece.capacity() >= SEG);
            lent.push(piece.as_ptr());
            piece.extend_from_slice(&[k as u8; SEG]);
            let h = data_in(itt, n, k + 1, n == 2);
            c.handle_placed_data_in(now, Pdu::new(h, Bytes::new()), piece);
        }
        let done = completion(&mut c, itt).expect("GOOD");
        assert_eq!(done.status, 0);
        assert!(done.data.is_empty(), "a discarded read keeps no data");
        in_flight.push_back(submit_discard(&mut c, now));
    }
    assert!(
        lent.iter().all(|p| *p == lent[0]),
        "segments landed in more than one buffer"
    );
}

/// A discarded READ whose Data-In comes whole in the reader's buffer (not placed) is counted
/// the same: GOOD, no data.
#[test]
fn accepts_discarded_read_received_unplaced() {
    let (mut c, now) = conn();
    let itt = submit_discard(&mut c, now);
    for n in 0..3u32 {
        let h = data_in(itt, n, 1, n == 2);
        c.handle_pdu(now, Pdu::new(h, Bytes::from(vec![7u8; SEG])));
    }
    let done = completion(&mut c, itt).expect("GOOD");
    assert!(done.data.is_empty());
}

/// GOOD status after two of the three segments: the read fails as a kept one does
/// (`ShortRead`), although no byte was kept to count.
#[test]
fn rejects_discarded_read_answered_short() {
    let (mut c, now) = conn();
    let itt = submit_discard(&mut c, now);
    for n in 0..2u32 {
        let h = data_in(itt, n, 1, n == 1);
        c.handle_pdu(now, Pdu::new(h, Bytes::from(vec![7u8; SEG])));
    }
    match completion(&mut c, itt) {
        Err(TaskError::Violation(Violation::ShortRead { received, expected })) => {
            assert_eq!((received, expected), (2 * SEG as u32, LEN as u32));
        }
        other => panic!("a short discarded read was taken: {other:?}"),
    }
}

/// A Data-In at the wrong offset (the second segment skipped) ends the connection and the
/// read with it, as for a kept read (DataPDUInOrder=Yes, RFC 7143 §13.18); nothing is lent
/// for it either.
#[test]
fn rejects_discarded_read_out_of_order() {
    let (mut c, now) = conn();
    let itt = submit_discard(&mut c, now);
    c.handle_pdu(
        now,
        Pdu::new(data_in(itt, 0, 1, false), Bytes::from(vec![7u8; SEG])),
    );
    assert!(
        c.lend_read_buffer(itt, 2 * SEG as u32, SEG).is_none(),
        "lent for a segment past the one expected"
    );
    let mut h = data_in(itt, 1, 1, true);
    h.buffer_offset = 2 * SEG as u32;
    c.handle_pdu(now, Pdu::new(h, Bytes::from(vec![7u8; SEG])));
    assert!(
        completion(&mut c, itt).is_err(),
        "an out-of-order answer taken"
    );
    assert!(
        c.closed().is_some(),
        "the connection goes on after a broken sequence"
    );
}
