//! The host queue against a controller that misbehaves, PDU by PDU: the controller's side is
//! written with nvme-wire's own codec (what a hostile or broken controller would put on the
//! wire), the host is the real `HostQueue`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use nvme_proto::host::{HostError, HostEvent, HostQueue, QueueConfig};
use nvme_wire::entry::Status;
use nvme_wire::pdu::{C2hData, CapsuleResp, IcResp, R2t, PFV_1_0};
use nvme_wire::{Codec, Cqe, Fes, Pdu, Sgl, Sqe};

fn cfg(hd: bool, dd: bool) -> QueueConfig {
    QueueConfig {
        header_digest: hd,
        data_digest: dd,
        max_transfer: 64 * 1024,
        in_capsule: 4096,
        depth: 4,
    }
}

/// The controller's codec and a connected host queue.
fn connected(hd: bool, dd: bool) -> (Codec, HostQueue) {
    let mut q = HostQueue::new(cfg(hd, dd));
    let mut ctrl = Codec::new(1 << 20);
    let icreq = ctrl.decode(q.poll_transmit().unwrap()).unwrap();
    assert!(matches!(icreq, Pdu::IcReq(r) if r.hdgst == hd && r.ddgst == dd));
    let resp = Pdu::IcResp(IcResp {
        pfv: PFV_1_0,
        cpda: 0,
        hdgst: hd,
        ddgst: dd,
        maxh2cdata: 8192,
    });
    q.receive(&ctrl.to_bytes(&resp).unwrap());
    assert!(matches!(q.poll_event(), Some(HostEvent::Connected { .. })));
    ctrl.header_digest = hd;
    ctrl.data_digest = dd;
    (ctrl, q)
}

fn read_cmd(q: &mut HostQueue, len: u32) -> u16 {
    let sqe = Sqe::new(0x02, 0, Sgl::Transport { length: 0 });
    q.submit(sqe, Bytes::new(), len, BytesMut::new()).unwrap()
}

/// The PDUs the host sent since the last call.
fn sent(ctrl: &Codec, q: &mut HostQueue) -> Vec<Pdu> {
    let mut out = Vec::new();
    let mut buf = BytesMut::new();
    while let Some(b) = q.poll_transmit() {
        buf.extend_from_slice(&b);
    }
    while let Some(p) = ctrl.decode_from(&mut buf).unwrap() {
        out.push(p);
    }
    out
}

fn failed_with(q: &mut HostQueue) -> HostError {
    loop {
        match q.poll_event() {
            Some(HostEvent::Failed(e)) => return e,
            Some(_) => {}
            None => panic!("the queue did not fail"),
        }
    }
}

#[test]
fn accepts_read_data_in_pieces_and_completes_on_success_flag() {
    let (ctrl, mut q) = connected(true, true);
    let cid = read_cmd(&mut q, 8192);
    let _ = sent(&ctrl, &mut q);
    for (off, last) in [(0u32, false), (4096, true)] {
        let pdu = Pdu::C2hData(C2hData {
            cccid: cid,
            datao: off,
            last,
            success: last,
            data: Bytes::from(vec![(off / 4096) as u8 + 1; 4096]),
        });
        q.receive(&ctrl.to_bytes(&pdu).unwrap());
    }
    match q.poll_event() {
        Some(HostEvent::Completed { cid: c, cqe, data }) => {
            assert_eq!(c, cid);
            assert!(cqe.status.is_success());
            assert_eq!(data.len(), 8192);
            assert_eq!(data[0], 1);
            assert_eq!(data[4096], 2);
        }
        e => panic!("expected a completion, got {e:?}"),
    }
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn rejects_read_data_beyond_the_command_with_a_termination_request() {
    let (ctrl, mut q) = connected(false, false);
    let cid = read_cmd(&mut q, 4096);
    let _ = sent(&ctrl, &mut q);
    // 4096 bytes fit; the controller sends 8192 (a buffer overflow if the host believed it).
    let pdu = Pdu::C2hData(C2hData {
        cccid: cid,
        datao: 0,
        last: true,
        success: false,
        data: Bytes::from(vec![0xee; 8192]),
    });
    q.receive(&ctrl.to_bytes(&pdu).unwrap());
    let e = failed_with(&mut q);
    assert!(
        matches!(e, HostError::Protocol(Fes::DataTransferOutOfRange, _)),
        "{e:?}"
    );
    let out = sent(&ctrl, &mut q);
    assert!(
        matches!(&out[..], [Pdu::H2cTermReq(t)] if t.fes == Fes::DataTransferOutOfRange),
        "{out:?}"
    );
    assert!(q.is_dead());
    assert_eq!(q.in_flight(), 0);
}

#[test]
fn rejects_an_r2t_outside_the_write_and_sends_no_data() {
    let (ctrl, mut q) = connected(false, false);
    let sqe = Sqe::new(0x01, 0, Sgl::Transport { length: 0 });
    // 16 KiB: more than the 4 KiB in-capsule limit, so it waits for R2Ts.
    let cid = q
        .submit(sqe, Bytes::from(vec![7u8; 16384]), 0, BytesMut::new())
        .unwrap();
    let out = sent(&ctrl, &mut q);
    assert!(
        matches!(&out[..], [Pdu::CapsuleCmd(c)] if c.data.is_empty() && c.sqe.sgl == Sgl::Transport { length: 16384 })
    );
    let r2t = Pdu::R2t(R2t {
        cccid: cid,
        ttag: 1,
        r2to: 12288,
        r2tl: 8192,
    });
    q.receive(&ctrl.to_bytes(&r2t).unwrap());
    let e = failed_with(&mut q);
    assert!(matches!(
        e,
        HostError::Protocol(Fes::DataTransferOutOfRange, _)
    ));
    let out = sent(&ctrl, &mut q);
    assert!(!out.iter().any(|p| matches!(p, Pdu::H2cData(_))), "{out:?}");
}

#[test]
fn accepts_an_r2t_and_answers_within_maxh2cdata() {
    let (ctrl, mut q) = connected(false, false);
    let sqe = Sqe::new(0x01, 0, Sgl::Transport { length: 0 });
    let data: Vec<u8> = (0..20000u32).map(|i| i as u8).collect();
    let cid = q
        .submit(sqe, Bytes::from(data.clone()), 0, BytesMut::new())
        .unwrap();
    let _ = sent(&ctrl, &mut q);
    let r2t = Pdu::R2t(R2t {
        cccid: cid,
        ttag: 9,
        r2to: 0,
        r2tl: 20000,
    });
    q.receive(&ctrl.to_bytes(&r2t).unwrap());
    let out = sent(&ctrl, &mut q);
    let mut got = Vec::new();
    for (i, p) in out.iter().enumerate() {
        let Pdu::H2cData(d) = p else { panic!("{p:?}") };
        assert!(d.data.len() <= 8192, "MAXH2CDATA is 8192");
        assert_eq!(d.ttag, 9);
        assert_eq!(d.datao as usize, got.len());
        assert_eq!(d.last, i == out.len() - 1);
        got.extend_from_slice(&d.data);
    }
    assert_eq!(got, data);
    assert_eq!(out.len(), 3);
}

/// A read whose data comes in one C2HData PDU (what ipsan's and Linux's targets send) is
/// handed over as that PDU's bytes in the receive buffer: the completion's data is the very
/// memory the socket was read into, not a copy.
#[test]
fn accepts_read_data_in_one_pdu_without_copying_it() {
    let (ctrl, mut q) = connected(false, true);
    let cid = read_cmd(&mut q, 65536);
    let _ = sent(&ctrl, &mut q);
    let data: Vec<u8> = (0..65536u32).map(|i| (i * 7) as u8).collect();
    let pdu = Pdu::C2hData(C2hData {
        cccid: cid,
        datao: 0,
        last: true,
        success: false,
        data: Bytes::from(data.clone()),
    });
    let wire = ctrl.to_bytes(&pdu).unwrap();
    // As a driver does: socket bytes into the queue's buffer, then process them.
    let buf = q.recv_buf();
    let start = buf.len();
    buf.extend_from_slice(&wire);
    // C2HData's header is 24 bytes; the data starts there (PDA 0), its digest follows it.
    let payload_at = buf[start + 24..].as_ptr();
    q.process();
    let resp = Pdu::CapsuleResp(CapsuleResp {
        cqe: Cqe::new(cid, Status::SUCCESS),
    });
    q.receive(&ctrl.to_bytes(&resp).unwrap());
    match q.poll_event() {
        Some(HostEvent::Completed { cqe, data: got, .. }) => {
            assert!(cqe.status.is_success());
            assert_eq!(&got[..], &data[..]);
            assert_eq!(
                got.as_ptr(),
                payload_at,
                "the receive buffer's bytes, not a copy"
            );
        }
        e => panic!("{e:?}"),
    }
}

/// Write data above `COPY_MAX` leaves the queue as the caller's own buffer between its PDU's
/// header and data digest, ready for a vectored write; the byte stream is still the PDUs.
#[test]
fn accepts_large_write_data_and_sends_it_without_copying_it() {
    let (ctrl, mut q) = connected(true, true);
    let sqe = Sqe::new(0x01, 0, Sgl::Transport { length: 0 });
    let data = Bytes::from((0..16384u32).map(|i| (i * 3) as u8).collect::<Vec<u8>>());
    let cid = q.submit(sqe, data.clone(), 0, BytesMut::new()).unwrap();
    let _ = sent(&ctrl, &mut q);
    let r2t = Pdu::R2t(R2t {
        cccid: cid,
        ttag: 3,
        r2to: 0,
        r2tl: 16384,
    });
    q.receive(&ctrl.to_bytes(&r2t).unwrap());
    let mut pieces = Vec::new();
    while let Some(b) = q.poll_transmit() {
        pieces.push(b);
    }
    // MAXH2CDATA 8192: two H2CData PDUs whose payloads are the caller's bytes at 0 and 8192.
    let ptrs: Vec<*const u8> = pieces.iter().map(|b| b.as_ptr()).collect();
    assert!(ptrs.contains(&data.as_ptr()), "first half not copied");
    assert!(
        ptrs.contains(&data[8192..].as_ptr()),
        "second half not copied"
    );
    let mut wire = BytesMut::new();
    for b in &pieces {
        wire.extend_from_slice(b);
    }
    let mut got = Vec::new();
    while let Some(p) = ctrl.decode_from(&mut wire).unwrap() {
        let Pdu::H2cData(d) = p else { panic!("{p:?}") };
        assert_eq!(d.datao as usize, got.len());
        got.extend_from_slice(&d.data);
    }
    assert_eq!(&got[..], &data[..], "digests and data decode as the PDUs");
}

/// A 4 KiB write in its capsule (the 4 KiB × 32 cell's) sends the caller's bytes between the
/// capsule's header and the next PDU, as an iSCSI WRITE's data segment goes; short data (a
/// Connect's 1 KiB) is still copied behind its header, one buffer.
#[test]
fn accepts_in_capsule_write_data_of_4_kib_and_sends_it_without_copying_it() {
    for dd in [false, true] {
        let (ctrl, mut q) = connected(false, dd);
        let data = Bytes::from((0..4096u32).map(|i| (i * 7) as u8).collect::<Vec<u8>>());
        let short = Bytes::from(vec![9u8; 1024]);
        let sqe = Sqe::new(0x01, 0, Sgl::Transport { length: 0 });
        q.submit(sqe, data.clone(), 0, BytesMut::new()).unwrap();
        q.submit(sqe, short.clone(), 0, BytesMut::new()).unwrap();
        let mut pieces = Vec::new();
        while let Some(b) = q.poll_transmit() {
            pieces.push(b);
        }
        assert!(
            pieces.iter().any(|b| b.as_ptr() == data.as_ptr()),
            "4 KiB not copied"
        );
        assert!(
            !pieces.iter().any(|b| b.as_ptr() == short.as_ptr()),
            "1 KiB copied behind its header"
        );
        let mut wire = BytesMut::new();
        for b in &pieces {
            wire.extend_from_slice(b);
        }
        let mut got = Vec::new();
        while let Some(p) = ctrl.decode_from(&mut wire).unwrap() {
            let Pdu::CapsuleCmd(c) = p else {
                panic!("{p:?}")
            };
            assert!(matches!(c.sqe.sgl, Sgl::InCapsule { offset: 0, .. }));
            got.push(c.data);
        }
        assert_eq!(got, [data, short], "the capsules decode with their data");
    }
}

#[test]
fn rejects_data_with_a_bad_digest_as_transient_transport_error() {
    let (ctrl, mut q) = connected(false, true);
    let cid = read_cmd(&mut q, 4096);
    let _ = sent(&ctrl, &mut q);
    let pdu = Pdu::C2hData(C2hData {
        cccid: cid,
        datao: 0,
        last: true,
        success: false,
        data: Bytes::from(vec![1u8; 4096]),
    });
    let mut wire = ctrl.to_bytes(&pdu).unwrap().to_vec();
    // Flip one data byte on the path: the data digest no longer matches.
    let n = wire.len();
    wire[n - 10] ^= 0x40;
    q.receive(&wire);
    let resp = Pdu::CapsuleResp(CapsuleResp {
        cqe: Cqe::new(cid, Status::SUCCESS),
    });
    q.receive(&ctrl.to_bytes(&resp).unwrap());
    match q.poll_event() {
        Some(HostEvent::Completed { cqe, .. }) => {
            assert_eq!(cqe.status, Status::TRANSIENT_TRANSPORT_ERROR);
        }
        e => panic!("{e:?}"),
    }
    assert!(!q.is_dead(), "a data digest error is not fatal");
}

#[test]
fn rejects_a_completion_for_no_command() {
    let (ctrl, mut q) = connected(false, false);
    let resp = Pdu::CapsuleResp(CapsuleResp {
        cqe: Cqe::new(77, Status::SUCCESS),
    });
    q.receive(&ctrl.to_bytes(&resp).unwrap());
    assert!(matches!(
        failed_with(&mut q),
        HostError::Protocol(Fes::PduSequenceError, _)
    ));
}

#[test]
fn rejects_a_digest_the_host_did_not_ask_for() {
    let mut q = HostQueue::new(cfg(false, false));
    let ctrl = Codec::new(1 << 20);
    let _ = q.poll_transmit();
    let resp = Pdu::IcResp(IcResp {
        pfv: PFV_1_0,
        cpda: 0,
        hdgst: true,
        ddgst: false,
        maxh2cdata: 8192,
    });
    q.receive(&ctrl.to_bytes(&resp).unwrap());
    assert!(matches!(failed_with(&mut q), HostError::Protocol(..)));
    assert!(!q.is_ready());
}

#[test]
fn rejects_data_with_a_bad_digest_in_a_success_pdu_and_still_completes_the_command() {
    let (ctrl, mut q) = connected(false, true);
    let cid = read_cmd(&mut q, 4096);
    let _ = sent(&ctrl, &mut q);
    // SUCCESS: no CapsuleResp will follow, so this PDU must complete the command.
    let pdu = Pdu::C2hData(C2hData {
        cccid: cid,
        datao: 0,
        last: true,
        success: true,
        data: Bytes::from(vec![1u8; 4096]),
    });
    let mut wire = ctrl.to_bytes(&pdu).unwrap().to_vec();
    let n = wire.len();
    wire[n - 100] ^= 0x01;
    q.receive(&wire);
    match q.poll_event() {
        Some(HostEvent::Completed { cid: c, cqe, .. }) => {
            assert_eq!(c, cid);
            assert_eq!(cqe.status, Status::TRANSIENT_TRANSPORT_ERROR);
        }
        e => panic!("the command must complete, got {e:?}"),
    }
    assert_eq!(q.in_flight(), 0);
    assert!(!q.is_dead());
}

/// One C2HData of `len` bytes for `cid` with SUCCESS (no CapsuleResp follows), received as a
/// driver does (into `recv_buf`, then `process`); the completed command's data.
fn receive_whole_read(ctrl: &Codec, q: &mut HostQueue, cid: u16, len: usize, seed: u8) -> Bytes {
    let data: Vec<u8> = (0..len).map(|i| (i as u8).wrapping_mul(seed)).collect();
    let pdu = Pdu::C2hData(C2hData {
        cccid: cid,
        datao: 0,
        last: true,
        success: true,
        data: Bytes::from(data.clone()),
    });
    q.recv_buf()
        .extend_from_slice(&ctrl.to_bytes(&pdu).unwrap());
    q.process();
    match q.poll_event() {
        Some(HostEvent::Completed {
            cid: c,
            cqe,
            data: got,
        }) => {
            assert_eq!(c, cid);
            assert!(cqe.status.is_success());
            assert_eq!(&got[..], &data[..]);
            got
        }
        e => panic!("expected a completion, got {e:?}"),
    }
}

/// A long read's data in one PDU is handed over alone in its receive buffer (the caller owns
/// it: `try_into_mut` succeeds, no copy), and the read buffer the caller brought, which that
/// data did not need, is where the queue receives next: buffers go round instead of a fresh
/// receive buffer per long read (issue 30: page zeroing was 43–46 % of the host's CPU at
/// 1 MiB reads). Both fail on a queue that keeps receiving into the shared buffer.
#[test]
fn accepts_long_read_data_as_the_callers_own_buffer_and_receives_into_the_one_given_back() {
    let (ctrl, mut q) = connected(false, false);
    let len = 64 * 1024;
    let sqe = Sqe::new(0x02, 0, Sgl::Transport { length: 0 });
    let brought = BytesMut::with_capacity(2 * len);
    let brought_at = brought.as_ptr();
    let cid = q.submit(sqe, Bytes::new(), len as u32, brought).unwrap();
    let _ = sent(&ctrl, &mut q);
    let got = receive_whole_read(&ctrl, &mut q, cid, len, 3);
    assert_eq!(
        q.recv_buf().as_ptr(),
        brought_at,
        "the next bytes are received into the buffer the read brought"
    );
    let owned = got
        .try_into_mut()
        .expect("the read's data shares its buffer with the queue");
    // The caller gives that buffer back with its next read: the queue receives into it after
    // the read it brought the buffer for.
    let mut again = owned;
    let given_back_at = again.as_ptr();
    again.clear();
    let cid = q.submit(sqe, Bytes::new(), len as u32, again).unwrap();
    let _ = sent(&ctrl, &mut q);
    let got = receive_whole_read(&ctrl, &mut q, cid, len, 5);
    // C2HData's header is 24 bytes (PDA 0, no digests); the data follows it.
    assert_eq!(
        got.as_ptr(),
        brought_at.wrapping_add(24),
        "the second read's data was received into the buffer the first read brought"
    );
    // Then into the buffer given back: its start, a PDU header (and whatever was received
    // before that PDU) ahead of the data it held.
    let at = q.recv_buf().as_ptr() as usize;
    let held = given_back_at as usize;
    assert!(
        at <= held && held - at < 4096,
        "receiving into {at:#x}, not the buffer given back (data at {held:#x})"
    );
    assert!(got.try_into_mut().is_ok());
}

/// The driver reads a long PDU up to its end and at most 4 KiB further (`recv_limit`), so
/// bytes behind it never keep its buffer shared; short PDUs are read in bursts.
#[test]
fn accepts_reads_limited_to_the_end_of_a_long_pdu() {
    let (ctrl, mut q) = connected(false, false);
    let cid = read_cmd(&mut q, 65536);
    let _ = sent(&ctrl, &mut q);
    assert!(q.recv_limit() >= 64 * 1024, "no PDU started: a burst");
    let pdu = Pdu::C2hData(C2hData {
        cccid: cid,
        datao: 0,
        last: true,
        success: true,
        data: Bytes::from(vec![7u8; 65536]),
    });
    let wire = ctrl.to_bytes(&pdu).unwrap();
    q.recv_buf().extend_from_slice(&wire[..100]);
    q.process();
    let rest = wire.len() - 100;
    let limit = q.recv_limit();
    assert!(
        (rest..=rest + 4096).contains(&limit),
        "{limit}: the rest of the PDU ({rest}) and at most 4 KiB past it"
    );
    q.recv_buf().extend_from_slice(&wire[100..]);
    q.process();
    assert!(matches!(q.poll_event(), Some(HostEvent::Completed { .. })));
    assert!(q.recv_limit() >= 64 * 1024);
}

/// With several long reads in flight, each one's data lands in the buffer a caller brought
/// most recently, not the one its own read brought: a caller that gives each read's data back
/// with its next read has one buffer go round, still in the cache, where taking each read's
/// own buffer put the data into one buffer per read in flight in turn (five here; with 16 reads
/// of 1 MiB in flight, 16 MiB of buffers, each long evicted when its turn came).
#[test]
fn accepts_reads_in_flight_landing_in_the_buffer_given_back_last() {
    let (ctrl, mut q) = connected(false, false);
    let len = 64 * 1024;
    let sqe = Sqe::new(0x02, 0, Sgl::Transport { length: 0 });
    let mut in_flight = std::collections::VecDeque::new();
    for _ in 0..4 {
        let cid = q
            .submit(
                sqe,
                Bytes::new(),
                len as u32,
                BytesMut::with_capacity(2 * len),
            )
            .unwrap();
        in_flight.push_back(cid);
    }
    let _ = sent(&ctrl, &mut q);
    let mut landed = Vec::new();
    for n in 0..12u8 {
        let cid = in_flight.pop_front().unwrap();
        let got = receive_whole_read(&ctrl, &mut q, cid, len, n | 1);
        landed.push(got.as_ptr() as usize);
        // The data back with the next read, as `ipsan bench` does.
        let back = got.try_into_mut().expect("handed over alone in its buffer");
        let cid = q.submit(sqe, Bytes::new(), len as u32, back).unwrap();
        let _ = sent(&ctrl, &mut q);
        in_flight.push_back(cid);
    }
    let mut distinct = landed[1..].to_vec();
    distinct.sort_unstable();
    distinct.dedup();
    assert_eq!(
        distinct.len(),
        1,
        "reads 2..12 landed in {} buffers ({landed:#x?}): not the one given back last",
        distinct.len()
    );
}

/// A read whose data comes in several PDUs gathers it into the buffer brought last (here the
/// second read's), taken when its first data arrives.
#[test]
fn accepts_read_data_in_pieces_gathered_into_the_buffer_brought_last() {
    let (ctrl, mut q) = connected(false, false);
    let sqe = Sqe::new(0x02, 0, Sgl::Transport { length: 0 });
    let first = BytesMut::with_capacity(128 * 1024);
    let last = BytesMut::with_capacity(128 * 1024);
    let last_at = last.as_ptr();
    let cid = q.submit(sqe, Bytes::new(), 8192, first).unwrap();
    let _ = q.submit(sqe, Bytes::new(), 8192, last).unwrap();
    let _ = sent(&ctrl, &mut q);
    for (off, end) in [(0u32, false), (4096, true)] {
        let pdu = Pdu::C2hData(C2hData {
            cccid: cid,
            datao: off,
            last: end,
            success: end,
            data: Bytes::from(vec![off as u8 | 1; 4096]),
        });
        q.receive(&ctrl.to_bytes(&pdu).unwrap());
    }
    match q.poll_event() {
        Some(HostEvent::Completed { cid: c, data, .. }) => {
            assert_eq!(c, cid);
            assert_eq!(data.len(), 8192);
            assert_eq!(
                data.as_ptr(),
                last_at,
                "not gathered into the buffer brought last"
            );
        }
        e => panic!("expected a completion, got {e:?}"),
    }
}
