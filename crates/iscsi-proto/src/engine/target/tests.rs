use super::*;
use iscsi_wire::header::{DataOut, NopOut, R2t, TaskMgmtRequest};

struct Disk;
impl LunDirectory for Disk {
    fn exists(&self, lun: u64) -> bool {
        lun == 0
    }
    fn size(&self, _itt: u32, _lun: u64, cdb: &[u8], _edtl: u32) -> Sizing {
        let need = if cdb[0] == 0x8a {
            u64::from(u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]])) * 512
        } else {
            0
        };
        Sizing {
            need,
            ..Sizing::default()
        }
    }
}

fn params() -> SessionParams {
    SessionParams {
        initial_r2t: true,
        immediate_data: false,
        max_burst_length: 4096,
        first_burst_length: 4096,
        max_outstanding_r2t: 1,
        ..SessionParams::default()
    }
}

fn write16(itt: u32, cmd_sn: u32, blocks: u32) -> Pdu {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x8a;
    cdb[10..14].copy_from_slice(&blocks.to_be_bytes());
    Pdu::new(
        ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: iscsi_wire::header::TaskAttr::SIMPLE,
            lun: 0,
            itt,
            expected_data_transfer_length: blocks * 512,
            cmd_sn,
            exp_stat_sn: 0,
            cdb,
        },
        Bytes::new(),
    )
}

fn r2ts<D>(c: &mut Connection<D>) -> Vec<R2t> {
    let mut v = Vec::new();
    while let Some(p) = c.poll_transmit() {
        if let Header::R2t(r) = p.header {
            v.push(r);
        }
    }
    v
}

/// A gateway's LUN: no device server sizes its CDBs.
struct Remote;
impl LunDirectory for Remote {
    fn exists(&self, _lun: u64) -> bool {
        true
    }
    fn size(&self, _itt: u32, _lun: u64, _cdb: &[u8], _edtl: u32) -> Sizing {
        unreachable!("a pass-through LUN is sized by EDTL")
    }
    fn passthrough(&self, _lun: u64) -> bool {
        true
    }
}

/// Issue 27: a response's Data-In trailer (a Seal `none` transfer's) goes in PDUs of its
/// own after the data, and the data's PDUs are slices of the device server's own buffer
/// (no copy), with DataSN, offsets, F and the collapsed status as for one buffer.
#[test]
fn accepts_a_data_in_trailer_sent_after_the_data_in_pdus_of_its_own() {
    let p = SessionParams {
        initiator_max_recv_data_segment_length: 4096,
        max_burst_length: 1 << 20,
        ..SessionParams::default()
    };
    let data = Bytes::from(vec![5u8; 10_000]);
    let resp = Response {
        data_in_trailer: Bytes::from(vec![0u8; 40]),
        ..Response::good(data.clone())
    };
    assert_eq!(resp.data_in_len(), 10_040);
    let mut pdus = Vec::new();
    status_pdus(&p, 9, 0, 10_040, 0, &resp, None, &mut |pdu| pdus.push(pdu));
    let got: Vec<(u32, u32, usize, bool, bool)> = pdus
        .iter()
        .map(|pdu| match &pdu.header {
            Header::DataIn(h) => (
                h.data_sn,
                h.buffer_offset,
                pdu.data.len(),
                h.final_,
                h.status_present,
            ),
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        got,
        [
            (0, 0, 4096, false, false),
            (1, 4096, 4096, false, false),
            (2, 8192, 1808, false, false),
            (3, 10_000, 40, true, true),
        ]
    );
    for (pdu, at) in pdus.iter().zip([0, 4096, 8192]) {
        assert_eq!(
            pdu.data.as_ptr(),
            data[at..].as_ptr(),
            "a slice, not a copy"
        );
    }
    let Header::DataIn(last) = &pdus[3].header else {
        unreachable!()
    };
    assert_eq!((last.residual_count, last.underflow), (0, false));
}

#[test]
fn accepts_passthrough_data_out_sized_by_edtl_and_reports_the_given_residual() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    // WRITE(16) of 1 block with EDTL 2 blocks: the pass-through solicits all of EDTL.
    let mut cmd = write16(1, 1, 1);
    if let Header::ScsiCommand(h) = &mut cmd.header {
        h.expected_data_transfer_length = 1024;
    }
    c.handle_pdu(now, &Remote, cmd);
    let r = r2ts(&mut c);
    assert_eq!(r.len(), 1);
    assert_eq!(r[0].desired_data_transfer_length, 1024);
    let d = DataOut {
        final_: true,
        lun: 0,
        itt: 1,
        ttt: r[0].ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    };
    c.handle_pdu(now, &Remote, Pdu::new(d, Bytes::from(vec![0u8; 1024])));
    let Some(Event::Execute(x)) = c.poll_event() else {
        panic!("no Execute")
    };
    assert_eq!((x.need, x.data_out.len(), x.early), (1024, 1024, None));
    assert!(x.write && !x.read, "the W bit goes with the command");
    // The remote target's underflow of one block goes to the host unchanged.
    assert!(c.complete_with_residual(1, Response::good(Bytes::new()), Some(512)));
    let p = c.poll_transmit().unwrap();
    let Header::ScsiResponse(h) = p.header else {
        panic!("no SCSI Response")
    };
    assert!(h.underflow && !h.overflow);
    assert_eq!(h.residual_count, 512);
}

/// A driver that decodes while sizing: the decoded command is the CDB's first byte and
/// the ITT, so the test sees which command's value came back with which task.
struct Decoding;
impl LunDirectory<(u8, u32)> for Decoding {
    fn exists(&self, lun: u64) -> bool {
        lun == 0
    }
    fn size(&self, itt: u32, lun: u64, cdb: &[u8], edtl: u32) -> Sizing<(u8, u32)> {
        Sizing {
            need: Disk.size(itt, lun, cdb, edtl).need,
            decoded: Some((cdb[0], itt)),
            ..Sizing::default()
        }
    }
}

#[test]
fn carries_what_sizing_decoded_to_each_commands_execute() {
    let now = Instant::now();
    let mut c: Connection<(u8, u32)> = Connection::carrying(Config::new(params(), 1, 1), now);
    // A WRITE waits for its data behind an R2T while a READ starts at once: each
    // Execute hands back its own command's value, not the one sized last.
    c.handle_pdu(now, &Decoding, write16(7, 1, 1));
    c.handle_pdu(now, &Decoding, read16(9, 2));
    let Some(Event::Execute(read)) = c.poll_event() else {
        panic!("no Execute for the READ")
    };
    assert_eq!((read.itt, read.decoded), (9, Some((0x88, 9))));
    let r = r2ts(&mut c);
    assert_eq!(r.len(), 1);
    let d = DataOut {
        final_: true,
        lun: 0,
        itt: 7,
        ttt: r[0].ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    };
    c.handle_pdu(now, &Decoding, Pdu::new(d, Bytes::from(vec![0u8; 512])));
    let Some(Event::Execute(write)) = c.poll_event() else {
        panic!("no Execute for the WRITE")
    };
    assert_eq!((write.itt, write.decoded), (7, Some((0x8a, 7))));
    assert_eq!(write.data_out.len(), 512);
}

#[test]
fn accepts_passthrough_reads_with_no_data_out_and_a_given_overflow() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x28;
    let read = ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: iscsi_wire::header::TaskAttr::SIMPLE,
        lun: 0,
        itt: 5,
        expected_data_transfer_length: 512,
        cmd_sn: 1,
        exp_stat_sn: 0,
        cdb,
    };
    c.handle_pdu(now, &Remote, Pdu::new(read, Bytes::new()));
    let Some(Event::Execute(x)) = c.poll_event() else {
        panic!("no Execute")
    };
    assert_eq!((x.need, x.write_without_w), (0, false));
    assert!(x.read && !x.write, "the R bit goes with the command");
    assert!(c.complete_with_residual(5, Response::good(Bytes::from(vec![7u8; 512])), Some(-512)));
    let p = c.poll_transmit().unwrap();
    let Header::DataIn(h) = p.header else {
        panic!("no Data-In")
    };
    assert!(h.status_present && h.overflow && !h.underflow);
    assert_eq!(h.residual_count, 512);
    assert_eq!(p.data.len(), 512);
}

#[test]
fn never_allocates_the_reserved_ttt_across_commands_and_data_out() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    c.set_next_ttt(RESERVED_TAG - 1);
    c.handle_pdu(now, &Disk, write16(1, 1, 16));
    let first = r2ts(&mut c);
    assert_eq!(first.len(), 1);
    assert_eq!(first[0].ttt, RESERVED_TAG - 1);
    // Answer it: the next R2T (planned on Data-Out) must skip 0xffffffff.
    let d = DataOut {
        final_: true,
        lun: 0,
        itt: 1,
        ttt: first[0].ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    };
    c.handle_pdu(now, &Disk, Pdu::new(d, Bytes::from(vec![0u8; 4096])));
    let second = r2ts(&mut c);
    assert_eq!(second.len(), 1);
    assert_ne!(second[0].ttt, RESERVED_TAG);
    assert_eq!(second[0].ttt, 1);
}

#[test]
fn rejects_data_out_for_unknown_task_but_drops_it_for_an_aborted_one() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    c.handle_pdu(now, &Disk, write16(7, 1, 16));
    let _ = r2ts(&mut c);
    let tmf = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::ABORT_TASK,
        lun: 0,
        itt: 8,
        referenced_task_tag: 7,
        cmd_sn: 2,
        exp_stat_sn: 0,
        ref_cmd_sn: 1,
        exp_data_sn: 0,
    };
    c.handle_pdu(now, &Disk, Pdu::new(tmf, Bytes::new()));
    let p = c.poll_transmit().unwrap();
    assert!(
        matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_COMPLETE)
    );
    assert_eq!(c.tasks_in_flight(), 0);
    let late = DataOut {
        final_: true,
        lun: 0,
        itt: 7,
        ttt: 1,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    };
    c.handle_pdu(
        now,
        &Disk,
        Pdu::new(late.clone(), Bytes::from(vec![0u8; 512])),
    );
    assert!(
        c.poll_transmit().is_none(),
        "late data for an aborted task is dropped"
    );
    let stray = DataOut { itt: 99, ..late };
    c.handle_pdu(now, &Disk, Pdu::new(stray, Bytes::from(vec![0u8; 512])));
    assert!(matches!(
        c.poll_transmit().map(|p| p.header),
        Some(Header::Reject(_))
    ));
}

#[test]
fn holds_abort_response_until_the_running_task_finishes_and_suppresses_its_status() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    let mut cdb = [0u8; 16];
    cdb[0] = 0x88;
    let read = ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: iscsi_wire::header::TaskAttr::SIMPLE,
        lun: 0,
        itt: 3,
        expected_data_transfer_length: 512,
        cmd_sn: 1,
        exp_stat_sn: 0,
        cdb,
    };
    c.handle_pdu(now, &Disk, Pdu::new(read, Bytes::new()));
    assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
    let tmf = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::ABORT_TASK,
        lun: 0,
        itt: 4,
        referenced_task_tag: 3,
        cmd_sn: 2,
        exp_stat_sn: 0,
        ref_cmd_sn: 1,
        exp_data_sn: 0,
    };
    c.handle_pdu(now, &Disk, Pdu::new(tmf, Bytes::new()));
    assert!(c.poll_transmit().is_none(), "held while the task runs");
    assert!(c.complete(3, Response::good(Bytes::from(vec![1u8; 512]))));
    let p = c.poll_transmit().unwrap();
    assert!(
        matches!(p.header, Header::TaskMgmtResponse(_)),
        "no Data-In for the aborted task"
    );
    assert!(c.poll_transmit().is_none());
    assert_eq!(
        c.window().max_cmd_sn(),
        128 + 1,
        "its window slot is free again"
    );
}

fn read16(itt: u32, cmd_sn: u32) -> Pdu {
    let mut cdb = [0u8; 16];
    cdb[0] = 0x88;
    let read = ScsiCommand {
        immediate: false,
        final_: true,
        read: true,
        write: false,
        attr: iscsi_wire::header::TaskAttr::SIMPLE,
        lun: 0,
        itt,
        expected_data_transfer_length: 512,
        cmd_sn,
        exp_stat_sn: 0,
        cdb,
    };
    Pdu::new(read, Bytes::new())
}

fn tmf(function: TmfFunction, itt: u32, rtt: u32, cmd_sn: u32) -> Pdu {
    let t = TaskMgmtRequest {
        immediate: true,
        function,
        lun: 0,
        itt,
        referenced_task_tag: rtt,
        cmd_sn,
        exp_stat_sn: 0,
        ref_cmd_sn: 1,
        exp_data_sn: 0,
    };
    Pdu::new(t, Bytes::new())
}

#[test]
fn abort_of_a_completed_task_is_task_does_not_exist_even_before_its_status_left() {
    // libiscsi's iSCSITMF.AbortTaskSimpleAsync: a WRITE, then ABORT TASK for it. When the
    // write completed first (its GOOD status queued or sent), the answer must be "Task
    // does not exist" (RFC 7143 §11.5.1 b: its CmdSN is no longer in the window), never
    // "Function complete" beside a GOOD status.
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    c.handle_pdu(now, &Remote, read16(3, 1));
    assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
    assert!(c.complete(3, Response::good(Bytes::from(vec![1u8; 512]))));
    c.handle_pdu(now, &Remote, tmf(TmfFunction::ABORT_TASK, 4, 3, 2));
    let mut answers = Vec::new();
    while let Some(p) = c.poll_transmit() {
        answers.push(p.header);
    }
    assert!(
        answers.iter().any(|h| matches!(h, Header::TaskMgmtResponse(r) if r.response == TmfResponse::TASK_DOES_NOT_EXIST)),
        "{answers:?}"
    );
    assert!(
        !answers.iter().any(|h| matches!(h, Header::TaskMgmtResponse(r) if r.response == TmfResponse::FUNCTION_COMPLETE)),
        "{answers:?}"
    );
}

#[test]
fn abort_of_a_command_not_received_yet_is_function_complete() {
    // RFC 7143 §11.5.1 a): the referenced CmdSN is in the window and before the request's
    // own: the target considers it received and answers "Function complete".
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    // The command with CmdSN 1 is lost on the way; the initiator's immediate ABORT TASK
    // for it carries the next CmdSN, 2, and RefCmdSN 1 (ExpCmdSN is still 1).
    c.handle_pdu(now, &Remote, tmf(TmfFunction::ABORT_TASK, 4, 9, 2));
    let p = c.poll_transmit().unwrap();
    assert!(
        matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_COMPLETE),
        "{:?}",
        p.header
    );
}

#[test]
fn asks_the_driver_to_forward_an_abort_of_a_passthrough_task_and_suppresses_its_status() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    c.handle_pdu(now, &Remote, read16(3, 1));
    c.handle_pdu(now, &Remote, read16(5, 2));
    assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
    assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
    c.handle_pdu(now, &Remote, tmf(TmfFunction::ABORT_TASK, 4, 3, 3));
    match c.poll_event() {
        Some(Event::Abort { itts }) => assert_eq!(itts, vec![3], "only the referenced task"),
        e => panic!("expected Event::Abort, got {e:?}"),
    }
    assert!(
        c.poll_transmit().is_none(),
        "held while the remote abort runs"
    );
    // The forwarded command ends (aborted remotely, or its status won the race).
    assert!(c.complete(3, Response::good(Bytes::from(vec![1u8; 512]))));
    let p = c.poll_transmit().unwrap();
    assert!(
        matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_COMPLETE),
        "the abort's response, and no Data-In or status for the aborted task"
    );
    assert!(c.poll_transmit().is_none());
    // The other task is untouched and still answers.
    assert!(c.complete(5, Response::good(Bytes::from(vec![2u8; 512]))));
    assert!(c.poll_transmit().is_some());
}

#[test]
fn holds_a_passthrough_lun_reset_response_until_the_driver_reset_the_remote_lu() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    c.handle_pdu(now, &Remote, read16(3, 1));
    assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
    c.handle_pdu(now, &Remote, tmf(TmfFunction::LOGICAL_UNIT_RESET, 9, 0, 2));
    match c.poll_event() {
        Some(Event::Reset {
            function: TmfFunction::LOGICAL_UNIT_RESET,
            answer: Some(9),
            ..
        }) => {}
        e => panic!("expected a Reset the driver answers, got {e:?}"),
    }
    assert!(c.complete(3, Response::good(Bytes::new())));
    assert!(c.poll_transmit().is_none(), "held until the driver answers");
    assert!(
        !c.reset_done(77, TmfResponse::FUNCTION_COMPLETE),
        "unknown ITT"
    );
    assert!(c.reset_done(9, TmfResponse::FUNCTION_REJECTED));
    let p = c.poll_transmit().unwrap();
    assert!(
        matches!(p.header, Header::TaskMgmtResponse(ref r) if r.response == TmfResponse::FUNCTION_REJECTED && r.itt == 9),
        "the driver's outcome, not a blind Function complete"
    );
    assert!(c.poll_transmit().is_none(), "no status for the reset task");
}

#[test]
fn answers_a_local_lun_reset_without_the_driver() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    c.handle_pdu(now, &Disk, tmf(TmfFunction::LOGICAL_UNIT_RESET, 9, 0, 1));
    assert!(matches!(
        c.poll_event(),
        Some(Event::Reset { answer: None, .. })
    ));
    assert!(matches!(
        c.poll_transmit().map(|p| p.header),
        Some(Header::TaskMgmtResponse(ref r)) if r.response == TmfResponse::FUNCTION_COMPLETE
    ));
}

#[test]
fn ignores_commands_outside_the_window_and_pings_when_idle() {
    let now = Instant::now();
    let mut cfg = Config::new(params(), 10, 1);
    cfg.cmd_window = 1;
    cfg.nop_interval = Some(Duration::from_secs(5));
    let mut c = Connection::new(cfg, now);
    c.handle_pdu(now, &Disk, write16(1, 11, 1));
    assert!(c.poll_transmit().is_none(), "CmdSN 11 beyond MaxCmdSN 10");
    assert_eq!(c.tasks_in_flight(), 0);
    let t = c.poll_timeout().unwrap();
    c.handle_timeout(t);
    assert!(
        matches!(c.poll_transmit().map(|p| p.header), Some(Header::NopIn(n)) if n.ttt != RESERVED_TAG)
    );
    let t = c.poll_timeout().unwrap();
    c.handle_timeout(t);
    assert!(matches!(
        c.poll_event(),
        Some(Event::Closed(ConnectionError {
            reason: CloseReason::PingTimeout(_),
            ..
        }))
    ));
}
/// The initiator's answer to the target's ping `ttt` (RFC 7143 §11.18.3).
fn pong(ttt: u32) -> Pdu {
    Pdu::new(
        NopOut {
            immediate: true,
            lun: 0,
            itt: RESERVED_TAG,
            ttt,
            cmd_sn: 0,
            exp_stat_sn: 0,
        },
        Bytes::new(),
    )
}

fn closed_by_ping(c: &mut Connection) -> bool {
    std::iter::from_fn(|| c.poll_event()).any(|e| {
        matches!(
            e,
            Event::Closed(ConnectionError {
                reason: CloseReason::PingTimeout(_),
                ..
            })
        )
    })
}

/// Issue 28's lost 1-connection reads: 16 MiB of Data-In queued at 0.25 MB/s holds the
/// target's ping for a minute; the initiator (sending nothing, its commands all out) cannot
/// answer what has not reached it. The old engine closed the connection two intervals after
/// the ping was queued, while the socket was still busy with the data before it.
#[test]
fn accepts_a_late_ping_answer_when_the_ping_waited_behind_queued_data() {
    let t0 = Instant::now();
    let i = Duration::from_secs(30);
    let mut cfg = Config::new(params(), 10, 1);
    cfg.nop_interval = Some(i);
    let mut c = Connection::new(cfg, t0);
    // Idle for an interval: the ping is queued (behind data in a real driver).
    c.handle_timeout(t0 + i);
    let ttt = match c.poll_transmit().map(|p| p.header) {
        Some(Header::NopIn(n)) if n.ttt != RESERVED_TAG => n.ttt,
        other => panic!("expected a ping, got {other:?}"),
    };
    // The writer holds it in a batch behind a minute of Data-In: not yet in the socket.
    c.handle_timeout(t0 + 3 * i);
    assert!(
        !closed_by_ping(&mut c),
        "closed while the ping waited to leave"
    );
    assert!(c.closed().is_none());
    // The batch is written after 64 s: the answer is waited for from then.
    let left = t0 + i + Duration::from_secs(64);
    assert!(c.flushed(left), "the deadline moves to the write");
    assert_eq!(c.poll_timeout(), Some(left + i));
    c.handle_timeout(left + i - Duration::from_millis(1));
    assert!(c.closed().is_none());
    c.handle_pdu(left + Duration::from_secs(1), &Disk, pong(ttt));
    assert!(c.closed().is_none(), "answered");
    assert_eq!(
        c.poll_timeout(),
        Some(left + Duration::from_secs(1) + i),
        "the keepalive runs again from the answer"
    );
}

#[test]
fn closes_a_connection_whose_written_ping_goes_unanswered() {
    let t0 = Instant::now();
    let i = Duration::from_secs(5);
    let mut cfg = Config::new(params(), 10, 1);
    cfg.nop_interval = Some(i);
    let mut c = Connection::new(cfg, t0);
    c.handle_timeout(t0 + i);
    assert!(matches!(
        c.poll_transmit().map(|p| p.header),
        Some(Header::NopIn(_))
    ));
    assert!(c.flushed(t0 + i));
    assert!(!c.flushed(t0 + i + i), "reported once");
    // A command received while the ping is out proves the initiator alive.
    c.handle_pdu(t0 + i + Duration::from_secs(3), &Disk, read16(1, 10));
    c.handle_timeout(t0 + i + i);
    assert!(c.closed().is_none(), "heard from the initiator 2 s ago");
    let dead = t0 + i + Duration::from_secs(3) + i;
    assert_eq!(c.poll_timeout(), Some(dead));
    c.handle_timeout(dead);
    assert!(closed_by_ping(&mut c));
}

#[test]
fn closes_a_connection_whose_ping_never_leaves() {
    // A peer that keeps its window shut: the socket never takes the ping.
    let t0 = Instant::now();
    let i = Duration::from_secs(5);
    let mut cfg = Config::new(params(), 10, 1);
    cfg.nop_interval = Some(i);
    let mut c = Connection::new(cfg, t0);
    c.handle_timeout(t0 + i);
    assert!(c.poll_transmit().is_some());
    let bound = t0 + i + i * PING_LEAVE_INTERVALS;
    assert_eq!(c.poll_timeout(), Some(bound));
    c.handle_timeout(bound - Duration::from_millis(1));
    assert!(c.closed().is_none());
    c.handle_timeout(bound);
    assert!(closed_by_ping(&mut c));
}

/// A completion for a write still collecting its data is refused (false) and the task is
/// kept whole (the completion looks the task up once, and a refused one puts it back): its
/// Data-Out is taken, it executes once with all of it, and the completion after that sends
/// its status and ends it.
#[test]
fn rejects_a_completion_for_a_write_still_collecting_and_keeps_the_task() {
    let now = Instant::now();
    let mut c = Connection::new(Config::new(params(), 1, 1), now);
    c.handle_pdu(now, &Disk, write16(7, 1, 8));
    let r = r2ts(&mut c);
    assert_eq!(r.len(), 1);
    assert!(
        !c.complete(7, Response::good(Bytes::new())),
        "a write collecting its data is not running"
    );
    assert_eq!(c.tasks_in_flight(), 1);
    assert!(c.poll_event().is_none() && c.poll_transmit().is_none());
    let d = DataOut {
        final_: true,
        lun: 0,
        itt: 7,
        ttt: r[0].ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 0,
    };
    c.handle_pdu(now, &Disk, Pdu::new(d, Bytes::from(vec![3u8; 4096])));
    let Some(Event::Execute(x)) = c.poll_event() else {
        panic!("the write did not execute")
    };
    assert_eq!((x.itt, x.data_out.len(), x.data_out[4095]), (7, 4096, 3));
    assert!(c.poll_event().is_none(), "executed once");
    assert!(c.complete(7, Response::good(Bytes::new())));
    let p = c.poll_transmit().unwrap();
    let Header::ScsiResponse(h) = p.header else {
        panic!("{:?}", p.header)
    };
    assert_eq!(h.itt, 7);
    assert_eq!(c.tasks_in_flight(), 0);
}

/// Issue 27: a long write's immediate data received into the buffer the connection lent for
/// the whole write (`lend_command_buffer`), then its Data-Out placed after it: the data the
/// command executes with is that one buffer, nothing copied. Nothing is lent for a write that
/// is all immediate data, nor beyond what the connection may reserve (one command's largest,
/// or what writes collecting their data leave of the budget).
#[test]
fn executes_a_write_with_the_buffer_lent_for_its_immediate_data() {
    let now = Instant::now();
    let p = SessionParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 65536,
        max_burst_length: 65536,
        ..params()
    };
    let mut cfg = Config::new(p, 1, 1);
    cfg.max_command_bytes = 192 << 10;
    let mut c = Connection::new(cfg, now);
    let cmd = |itt, cmd_sn, blocks| {
        let Header::ScsiCommand(h) = write16(itt, cmd_sn, blocks).header else {
            unreachable!()
        };
        h
    };
    let all_immediate = cmd(2, 1, 128);
    assert!(c.lend_command_buffer(&all_immediate, 65536).is_none());
    let too_big = cmd(2, 1, 512);
    assert!(c.lend_command_buffer(&too_big, 65536).is_none());
    // 128 KiB: 64 KiB immediate, 64 KiB solicited.
    let h = cmd(1, 1, 256);
    let mut buf = c.lend_command_buffer(&h, 65536).expect("lent");
    assert!(buf.capacity() >= 128 << 10);
    let at = buf.as_ptr();
    buf.extend_from_slice(&[1u8; 65536]);
    let mut raw = [0u8; 48];
    Header::ScsiCommand(h.clone()).write(&mut raw);
    c.handle_pdu(
        now,
        &Disk,
        Pdu::received(Header::ScsiCommand(h), raw, buf.freeze()),
    );
    let r = r2ts(&mut c);
    assert_eq!((r.len(), r[0].buffer_offset), (1, 65536));
    // The write holds its 128 KiB of the 192 KiB budget until its data is handed on: no room
    // to lend for a second one.
    assert!(c.lend_command_buffer(&cmd(3, 2, 256), 65536).is_none());
    let d = DataOut {
        final_: true,
        lun: 0,
        itt: 1,
        ttt: r[0].ttt,
        exp_stat_sn: 0,
        data_sn: 0,
        buffer_offset: 65536,
    };
    let mut place = c.lend_write_buffer(&d, 65536).expect("Data-Out lent for");
    assert_eq!(
        place.as_ptr(),
        at.wrapping_add(65536),
        "right after the immediate data"
    );
    place.extend_from_slice(&[2u8; 65536]);
    c.handle_placed_data_out(now, Pdu::new(d, Bytes::new()), place);
    let Some(Event::Execute(x)) = c.poll_event() else {
        panic!("no Execute")
    };
    assert_eq!(x.data_out.as_ptr(), at, "the lent buffer, nothing copied");
    assert_eq!(
        (x.data_out.len(), x.data_out[65535], x.data_out[65536]),
        (128 << 10, 1, 2)
    );
}
