//! The unit tests of [`super::WriteState`]: one write's data phase, fed PDUs by hand.

use super::*;

fn budget() -> ReserveBudget {
    ReserveBudget::new(64 << 20)
}

fn params(initial_r2t: bool, first_burst: u32, max_burst: u32, outstanding: u32) -> SessionParams {
    SessionParams {
        initial_r2t,
        immediate_data: true,
        first_burst_length: first_burst,
        max_burst_length: max_burst,
        max_outstanding_r2t: outstanding,
        ..SessionParams::default()
    }
}

fn cmd(edtl: u32, final_: bool) -> ScsiCommand {
    ScsiCommand {
        immediate: false,
        final_,
        read: false,
        write: true,
        attr: iscsi_wire::header::TaskAttr::SIMPLE,
        lun: 0,
        itt: 1,
        expected_data_transfer_length: edtl,
        cmd_sn: 0,
        exp_stat_sn: 0,
        cdb: [0; 16],
    }
}

fn dout(ttt: u32, data_sn: u32, offset: u32, final_: bool) -> DataOut {
    DataOut {
        final_,
        lun: 0,
        itt: 1,
        ttt,
        exp_stat_sn: 0,
        data_sn,
        buffer_offset: offset,
    }
}

#[test]
fn immediate_data_alone_completes() {
    let w = WriteState::new(
        &params(false, 65536, 262_144, 4),
        &cmd(4096, true),
        Bytes::from(vec![7u8; 4096]),
        4096,
        &budget(),
    )
    .unwrap();
    assert!(w.is_complete());
    assert_eq!(&w.into_data()[..], &[7u8; 4096][..]);
}

#[test]
fn passes_immediate_data_that_is_the_whole_transfer_on_without_a_copy() {
    let imm = Bytes::from(vec![7u8; 4096]);
    let at = imm.as_ptr();
    let w = WriteState::new(
        &params(false, 65536, 262_144, 4),
        &cmd(4096, true),
        imm,
        4096,
        &budget(),
    )
    .unwrap();
    let data = w.into_data();
    assert_eq!(data.as_ptr(), at, "the PDU's own bytes, not a copy");
    assert_eq!(data.len(), 4096);
}

#[test]
fn unsolicited_then_solicited_with_several_r2ts() {
    let p = params(false, 8192, 16384, 2);
    let mut w = WriteState::new(
        &p,
        &cmd(65536, false),
        Bytes::from(vec![1u8; 4096]),
        65536,
        &budget(),
    )
    .unwrap();
    let mut ttt = 100;
    assert!(w.plan_r2ts(|| 0).is_empty(), "unsolicited data still due");
    w.on_data_out(&dout(RESERVED_TAG, 0, 4096, true), &[2; 4096])
        .unwrap();
    let plans = w.plan_r2ts(|| {
        ttt += 1;
        ttt
    });
    assert_eq!(plans.len(), 2, "MaxOutstandingR2T");
    assert_eq!(
        (plans[0].offset, plans[0].len, plans[0].r2t_sn),
        (8192, 16384, 0)
    );
    assert_eq!(
        (plans[1].offset, plans[1].len, plans[1].r2t_sn),
        (24576, 16384, 1)
    );
    // Answer the second R2T first: sequences may complete in any order.
    w.on_data_out(&dout(plans[1].ttt, 0, 24576, false), &[4; 8192])
        .unwrap();
    w.on_data_out(&dout(plans[1].ttt, 1, 32768, true), &[4; 8192])
        .unwrap();
    let more = w.plan_r2ts(|| 999);
    assert_eq!(more.len(), 1);
    assert_eq!((more[0].offset, more[0].len), (40960, 16384));
    w.on_data_out(&dout(plans[0].ttt, 0, 8192, true), &[3; 16384])
        .unwrap();
    let last = w.plan_r2ts(|| 1000);
    assert_eq!((last[0].offset, last[0].len), (57344, 8192));
    w.on_data_out(&dout(999, 0, 40960, true), &[5; 16384])
        .unwrap();
    assert!(!w.is_complete());
    w.on_data_out(&dout(1000, 0, 57344, true), &[6; 8192])
        .unwrap();
    assert!(w.is_complete());
    let d = w.into_data();
    assert_eq!(
        (d[0], d[4096], d[8192], d[24576], d[40960], d[65535]),
        (1, 2, 3, 4, 5, 6)
    );
}

/// Data-Out received in place (issue 27): unsolicited and solicited Data-Out lent the
/// free end of the write's one buffer, given back and joined without a copy; the data is
/// the same as when stored by copy, in one allocation from the first byte on.
#[test]
fn accepts_data_out_placed_in_the_writes_own_buffer_without_a_copy() {
    let p = params(false, 16384, 65536, 1);
    let mut w = WriteState::new(
        &p,
        &cmd(65536, false),
        Bytes::from(vec![1u8; 4096]),
        65536,
        &budget(),
    )
    .unwrap();
    let place = |w: &mut WriteState, h: DataOut, byte: u8, len: usize| {
        let mut b = w.lend(&h, len).expect("lent");
        assert!(b.is_empty() && b.capacity() >= len);
        b.extend_from_slice(&vec![byte; len]);
        w.on_placed_data_out(&h, b).unwrap();
    };
    let at = w.buf.as_ptr();
    place(&mut w, dout(RESERVED_TAG, 0, 4096, false), 2, 4096);
    place(&mut w, dout(RESERVED_TAG, 1, 8192, true), 3, 8192);
    let plans = w.plan_r2ts(|| 7);
    assert_eq!((plans[0].offset, plans[0].len), (16384, 49152));
    place(&mut w, dout(7, 0, 16384, false), 4, 32768);
    place(&mut w, dout(7, 1, 49152, true), 5, 16384);
    assert!(w.is_complete());
    let d = w.into_data();
    assert_eq!(
        d.as_ptr(),
        at,
        "one buffer: every placed PDU joined in place"
    );
    assert_eq!(
        (
            d[0],
            d[4096],
            d[8192],
            d[16384],
            d[49151],
            d[49152],
            d.len()
        ),
        (1, 2, 3, 4, 4, 5, 65536)
    );
}

/// libiscsi's 1 MiB write (issue 27): 256 KiB of immediate data (FirstBurstLength and the
/// target's MaxRecvDataSegmentLength), then three R2Ts of MaxBurstLength 256 KiB, one at a
/// time. The first bytes reserve the whole write from the connection's budget, so the buffer
/// is never reallocated: Data-Out placed or stored by copy, the data handed on is the buffer
/// the immediate data went into, and the budget's share is back once it is handed on.
#[test]
fn reserves_a_multi_burst_write_whole_at_its_first_bytes_and_never_moves_it() {
    const K256: u32 = 256 * 1024;
    let p = params(false, K256, K256, 1);
    let budget = budget();
    for placed in [false, true] {
        let mut w = WriteState::new(
            &p,
            &cmd(4 * K256, true),
            Bytes::from(vec![1u8; K256 as usize]),
            4 * K256,
            &budget,
        )
        .unwrap();
        assert_eq!(budget.used(), 4 * K256 as usize, "the whole write, granted");
        assert!(w.buf.capacity() >= 4 * K256 as usize);
        let at = w.buf.as_ptr();
        let mut ttt = 10;
        for k in 1..4u8 {
            let plans = w.plan_r2ts(|| {
                ttt += 1;
                ttt
            });
            assert_eq!(plans.len(), 1, "MaxOutstandingR2T 1");
            assert_eq!((plans[0].offset, plans[0].len), (u32::from(k) * K256, K256));
            let h = dout(plans[0].ttt, 0, plans[0].offset, true);
            let data = vec![k + 1; K256 as usize];
            if placed {
                let mut b = w.lend(&h, data.len()).expect("lent");
                b.extend_from_slice(&data);
                w.on_placed_data_out(&h, b).unwrap();
            } else {
                w.on_data_out(&h, &data).unwrap();
            }
            assert_eq!(w.buf.as_ptr(), at, "never reallocated (placed: {placed})");
        }
        assert!(w.is_complete());
        let d = w.into_data();
        assert_eq!(d.as_ptr(), at, "the buffer the immediate data went into");
        assert_eq!(budget.used(), 0, "given back with the data");
        let k = K256 as usize;
        assert_eq!(
            (d[0], d[k], d[2 * k], d[4 * k - 1], d.len()),
            (1, 2, 3, 4, 4 * k)
        );
    }
}

/// The budget bounds what writes reserve ahead of their data: a write it has no room for
/// reserves burst by burst (and still completes with the right data); a write that ends
/// within its first burst takes nothing from it; a write dropped before its data phase ends
/// (aborted, its connection gone) gives its share back.
#[test]
fn reserves_burst_by_burst_beyond_the_budget_and_gives_shares_back_when_dropped() {
    let p = params(false, 8192, 16384, 1);
    let budget = ReserveBudget::new(65536);
    let first = WriteState::new(
        &p,
        &cmd(65536, false),
        Bytes::from(vec![1u8; 4096]),
        65536,
        &budget,
    )
    .unwrap();
    assert_eq!(budget.used(), 65536);
    let mut second = WriteState::new(
        &p,
        &cmd(65536, false),
        Bytes::from(vec![2u8; 4096]),
        65536,
        &budget,
    )
    .unwrap();
    assert_eq!(
        budget.used(),
        65536,
        "no room: the second reserves its burst only"
    );
    assert!(second.buf.capacity() < 65536);
    let small = WriteState::new(
        &p,
        &cmd(8192, false),
        Bytes::from(vec![3u8; 4096]),
        8192,
        &budget,
    )
    .unwrap();
    assert_eq!(
        budget.used(),
        65536,
        "a write within one burst takes nothing"
    );
    drop(small);
    drop(first);
    assert_eq!(budget.used(), 0, "a dropped write gives its share back");
    second
        .on_data_out(&dout(RESERVED_TAG, 0, 4096, true), &[2; 4096])
        .unwrap();
    assert_eq!(
        budget.used(),
        65536,
        "room again: granted at its next bytes"
    );
    let mut ttt = 0;
    let mut plans = second.plan_r2ts(|| {
        ttt += 1;
        ttt
    });
    while let Some(plan) = plans.pop() {
        second
            .on_data_out(
                &dout(plan.ttt, 0, plan.offset, true),
                &vec![4; plan.len as usize],
            )
            .unwrap();
        plans = second.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
    }
    assert!(second.is_complete());
    let d = second.into_data();
    assert_eq!(
        (d[0], d[8191], d[8192], d[65535], d.len()),
        (2, 2, 4, 4, 65536)
    );
    assert_eq!(budget.used(), 0);
}

/// A write's immediate data received into a buffer lent for the whole write (issue 27,
/// `ReserveBudget::lend`): that buffer becomes the write's own (same memory, nothing copied,
/// the Data-Out after it goes on in it), and the share of the budget it held is the write's
/// until its data is handed on. Room lent for another command, or a buffer someone else
/// still holds, is not taken: the share goes back and the data is stored as before.
#[test]
fn takes_a_buffer_lent_for_the_immediate_data_as_the_writes_own() {
    const K256: u32 = 256 << 10;
    let p = params(false, K256, K256, 1);
    let budget = ReserveBudget::new(4 << 20);
    let (lent, mut buf) = budget.lend(1, 4 * K256 as usize).unwrap();
    assert_eq!(budget.used(), 4 * K256 as usize);
    buf.extend_from_slice(&vec![1u8; K256 as usize]);
    let at = buf.as_ptr();
    let imm = buf.freeze();
    let mut w = WriteState::with_lent(
        &p,
        &cmd(4 * K256, false),
        imm,
        4 * K256,
        &budget,
        Some(lent),
    )
    .unwrap();
    assert_eq!(w.buf.as_ptr(), at, "the lent buffer, not a copy");
    assert_eq!(budget.used(), 4 * K256 as usize, "one share, the write's");
    let mut ttt = 0;
    let mut plans = w.plan_r2ts(|| {
        ttt += 1;
        ttt
    });
    let mut n = 1u8;
    while let Some(plan) = plans.pop() {
        n += 1;
        let h = dout(plan.ttt, 0, plan.offset, true);
        let mut place = w.lend(&h, plan.len as usize).unwrap();
        place.extend_from_slice(&vec![n; plan.len as usize]);
        w.on_placed_data_out(&h, place).unwrap();
        plans = w.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
    }
    assert!(w.is_complete());
    let d = w.into_data();
    let k = K256 as usize;
    assert_eq!(d.as_ptr(), at, "one buffer from the first byte to the last");
    assert_eq!((d[0], d[k], d[3 * k], d.len()), (1, 2, 4, 4 * k));
    assert_eq!(budget.used(), 0, "the share goes back with the data");

    // Lent for ITT 9, used by ITT 1: given back, the data copied as before.
    let (other, mut buf) = budget.lend(9, 4 * k).unwrap();
    buf.extend_from_slice(&vec![5u8; k]);
    let at = buf.as_ptr();
    let w = WriteState::with_lent(
        &p,
        &cmd(4 * K256, false),
        buf.freeze(),
        4 * K256,
        &budget,
        Some(other),
    )
    .unwrap();
    assert_ne!(w.buf.as_ptr(), at);
    assert_eq!(budget.used(), 4 * k, "the write's own share only");
    drop(w);
    // Still held elsewhere (a PDU kept for a retransmission, say): not taken.
    let (lent, mut buf) = budget.lend(1, 4 * k).unwrap();
    buf.extend_from_slice(&vec![6u8; k]);
    let imm = buf.freeze();
    let kept = imm.clone();
    let w = WriteState::with_lent(
        &p,
        &cmd(4 * K256, false),
        imm,
        4 * K256,
        &budget,
        Some(lent),
    )
    .unwrap();
    assert_ne!(w.buf.as_ptr(), kept.as_ptr());
    assert_eq!(budget.used(), 4 * k);
    assert_eq!(&w.into_data()[..k], &kept[..]);
    assert_eq!(budget.used(), 0);
}

/// What is not lent for (`None`: received and copied as before): data out of order, past
/// what the CDB keeps, or for an unknown TTT. A placed PDU the data phase refuses (DataSN
/// out of order) leaves the data stored so far as it was, and the right one is placed
/// after it.
#[test]
fn rejects_placed_data_out_out_of_order_and_keeps_the_data_before_it() {
    let p = params(false, 16384, 65536, 1);
    let mut w = WriteState::new(
        &p,
        &cmd(16384, false),
        Bytes::from(vec![1u8; 4096]),
        12288,
        &budget(),
    )
    .unwrap();
    assert!(
        w.lend(&dout(RESERVED_TAG, 0, 8192, false), 4096).is_none(),
        "a gap"
    );
    assert!(
        w.lend(&dout(RESERVED_TAG, 0, 4096, false), 12288).is_none(),
        "past keep"
    );
    assert!(
        w.lend(&dout(42, 0, 4096, false), 4096).is_none(),
        "unknown TTT"
    );
    let h = dout(RESERVED_TAG, 1, 4096, false);
    let mut b = w.lend(&h, 4096).unwrap();
    b.extend_from_slice(&[9; 4096]);
    assert!(w.on_placed_data_out(&h, b).is_err(), "DataSN 1 before 0");
    let h = dout(RESERVED_TAG, 0, 4096, false);
    let mut b = w.lend(&h, 4096).unwrap();
    b.extend_from_slice(&[2; 4096]);
    w.on_placed_data_out(&h, b).unwrap();
    w.on_data_out(&dout(RESERVED_TAG, 1, 8192, true), &[3; 8192])
        .unwrap();
    assert!(w.is_complete());
    let d = w.into_data();
    assert_eq!(
        (d[0], d[4095], d[4096], d[8191], d[8192], d.len()),
        (1, 1, 2, 2, 3, 12288)
    );
}

#[test]
fn initial_r2t_yes_solicits_everything_after_immediate() {
    let p = params(true, 65536, 262_144, 1);
    let mut w = WriteState::new(&p, &cmd(8192, false), Bytes::new(), 8192, &budget()).unwrap();
    let plans = w.plan_r2ts(|| 5);
    assert_eq!(
        plans,
        vec![R2tPlan {
            ttt: 5,
            r2t_sn: 0,
            offset: 0,
            len: 8192
        }]
    );
    assert!(w
        .on_data_out(&dout(RESERVED_TAG, 0, 0, true), &[0; 512])
        .is_err());
}

#[test]
fn rejects_bad_data_sn_offset_and_overrun() {
    let p = params(false, 65536, 262_144, 1);
    let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048, &budget()).unwrap();
    assert!(
        w.on_data_out(&dout(RESERVED_TAG, 1, 0, false), &[0; 512])
            .is_err(),
        "DataSN 1 first"
    );
    let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048, &budget()).unwrap();
    assert!(
        w.on_data_out(&dout(RESERVED_TAG, 0, 512, false), &[0; 512])
            .is_err(),
        "gap"
    );
    let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048, &budget()).unwrap();
    assert!(
        w.on_data_out(&dout(RESERVED_TAG, 0, 0, true), &[0; 4096])
            .is_err(),
        "overrun"
    );
    let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048, &budget()).unwrap();
    w.on_data_out(&dout(RESERVED_TAG, 0, 0, false), &[0; 1024])
        .unwrap();
    assert!(
        w.on_data_out(&dout(RESERVED_TAG, 0, 1024, true), &[0; 1024])
            .is_err(),
        "DataSN 0 twice"
    );
}

#[test]
fn underflow_discards_extra_bytes_and_overflow_keeps_edtl() {
    // EDTL 10000 for a one-block write: keep 512, accept and drop the rest.
    let p = params(false, 65536, 262_144, 1);
    let mut w = WriteState::new(
        &p,
        &cmd(10000, false),
        Bytes::from(vec![9u8; 512]),
        512,
        &budget(),
    )
    .unwrap();
    w.on_data_out(&dout(RESERVED_TAG, 0, 512, true), &[8; 9488])
        .unwrap();
    assert!(w.is_complete());
    assert_eq!(w.into_data().len(), 512);
    // EDTL 200 for a one-block write: only 200 bytes can come.
    let w = WriteState::new(
        &p,
        &cmd(200, true),
        Bytes::from(vec![1u8; 200]),
        512,
        &budget(),
    )
    .unwrap();
    assert!(w.is_complete());
    assert_eq!(w.into_data().len(), 200);
}

#[test]
fn recover_solicits_again_only_what_a_failed_connection_never_brought() {
    // Unsolicited data cut after 1024 of 4096 bytes, then two R2Ts, the first half answered.
    let p = params(false, 4096, 4096, 2);
    let mut w = WriteState::new(
        &p,
        &cmd(16384, false),
        Bytes::from(vec![1u8; 512]),
        16384,
        &budget(),
    )
    .unwrap();
    w.on_data_out(&dout(RESERVED_TAG, 0, 512, false), &[1; 512])
        .unwrap();
    w.recover();
    let mut ttt = 10;
    let plans = w.plan_r2ts(|| {
        ttt += 1;
        ttt
    });
    assert_eq!(
        plans.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
        vec![(1024, 3072), (4096, 4096)],
        "the rest of the unsolicited burst first, then the solicited data"
    );
    w.on_data_out(&dout(plans[1].ttt, 0, 4096, false), &[2; 2048])
        .unwrap();
    w.recover();
    let again = w.plan_r2ts(|| 99);
    assert_eq!(
        again.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
        vec![(1024, 3072), (6144, 2048)],
        "only the bytes that never came; R2TSNs go on"
    );
    assert_eq!(again[0].r2t_sn, 2);
    assert!(!w.is_complete());
}

#[test]
fn restart_solicits_the_whole_transfer_again_and_keeps_nothing_of_the_failed_connection() {
    // 512 bytes immediate, unsolicited data to 1024 of 4096, then a half-answered R2T:
    // what came on the failed connection is dropped, 0..16384 is asked for again.
    let p = params(false, 4096, 4096, 2);
    let mut w = WriteState::new(
        &p,
        &cmd(16384, false),
        Bytes::from(vec![1u8; 512]),
        16384,
        &budget(),
    )
    .unwrap();
    w.on_data_out(&dout(RESERVED_TAG, 0, 512, false), &[1; 512])
        .unwrap();
    w.recover();
    let mut ttt = 10;
    let plans = w.plan_r2ts(|| {
        ttt += 1;
        ttt
    });
    w.on_data_out(&dout(plans[0].ttt, 0, 1024, false), &[1; 1024])
        .unwrap();
    w.restart();
    let mut ttt = 20;
    let again = w.plan_r2ts(|| {
        ttt += 1;
        ttt
    });
    assert_eq!(
        again.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
        vec![(0, 4096), (4096, 4096)],
        "from byte 0, immediate data included, MaxOutstandingR2T at a time"
    );
    assert!(again[0].r2t_sn > plans[1].r2t_sn, "R2TSNs go on");
    for (k, plan) in again.iter().enumerate() {
        let fill = [7 + u8::try_from(k).unwrap(); 4096];
        w.on_data_out(&dout(plan.ttt, 0, plan.offset, true), &fill)
            .unwrap();
    }
    assert!(!w.is_complete());
    let mut ttt = 30;
    let rest = w.plan_r2ts(|| {
        ttt += 1;
        ttt
    });
    assert_eq!(
        rest.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
        vec![(8192, 4096), (12288, 4096)]
    );
    let mut plans = rest;
    let mut fill = 9u8;
    while !plans.is_empty() {
        for plan in &plans {
            w.on_data_out(&dout(plan.ttt, 0, plan.offset, true), &vec![fill; 4096])
                .unwrap();
            fill += 1;
        }
        plans = w.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
    }
    assert!(w.is_complete());
    let data = w.into_data();
    assert_eq!(data.len(), 16384);
    assert!(
        data[..4096].iter().all(|b| *b == 7),
        "no byte of the old immediate or unsolicited data is left"
    );
    assert!(data[4096..8192].iter().all(|b| *b == 8));
}

#[test]
fn resend_names_outstanding_r2ts_by_r2tsn_and_restarts_their_burst() {
    let p = params(true, 65536, 2048, 2);
    let mut w = WriteState::new(&p, &cmd(8192, false), Bytes::new(), 8192, &budget()).unwrap();
    let plans = w.plan_r2ts(|| 7);
    assert_eq!(plans.len(), 2);
    w.on_data_out(&dout(7, 0, 0, false), &[0; 1024]).unwrap();
    let again = w.resend(0, 1);
    assert_eq!(again, vec![plans[0]]);
    // The burst is answered from its first byte again.
    w.on_data_out(&dout(7, 0, 0, false), &[0; 1024]).unwrap();
    assert_eq!(w.resend(1, 0), vec![plans[1]]);
    assert!(w.resend(5, 1).is_empty());
}

#[test]
fn rejects_immediate_data_beyond_first_burst() {
    let p = params(false, 512, 262_144, 1);
    assert!(WriteState::new(
        &p,
        &cmd(4096, true),
        Bytes::from(vec![0u8; 1024]),
        4096,
        &budget()
    )
    .is_err());
}
