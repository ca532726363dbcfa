use super::*;
use iscsi_wire::header::{DataIn, R2t, ScsiResponse, TaskMgmtResponse, TmfFunction};

fn params() -> SessionParams {
    SessionParams {
        initial_r2t: true,
        immediate_data: false,
        max_burst_length: 4096,
        first_burst_length: 4096,
        max_outstanding_r2t: 1,
        target_max_recv_data_segment_length: 4096,
        ..SessionParams::default()
    }
}

fn conn() -> (Connection, Instant) {
    let now = Instant::now();
    let mut cfg = Config::new(params(), 1, 16, 1);
    cfg.nop_interval = None;
    (Connection::new(cfg, now), now)
}

fn write(c: &mut Connection, now: Instant, len: usize) -> u32 {
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x8a; 16],
                data: Data::Write(Bytes::from(vec![7u8; len])),
                timed: false,
            },
        )
        .unwrap();
    while c.poll_transmit().is_some() {}
    itt
}

fn r2t(itt: u32, ttt: u32, r2t_sn: u32, off: u32, len: u32) -> Pdu {
    Pdu::new(
        R2t {
            lun: 0,
            itt,
            ttt,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 16,
            r2t_sn,
            buffer_offset: off,
            desired_data_transfer_length: len,
        },
        Bytes::new(),
    )
}

fn violation(c: &mut Connection) -> Option<Violation> {
    while let Some(e) = c.poll_event() {
        if let Event::Completed {
            result: Err(TaskError::Violation(v)),
            ..
        } = e
        {
            return Some(v);
        }
    }
    None
}

/// A READ submitted with `buf`, and a Data-In answering all of it with status.
fn read_answered(c: &mut Connection, now: Instant, buf: BytesMut, data: Bytes) -> Completion {
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x88; 16],
                data: Data::Read {
                    buf,
                    len: data.len() as u32,
                },
                timed: false,
            },
        )
        .unwrap();
    while c.poll_transmit().is_some() {}
    let h = DataIn {
        final_: true,
        status_present: true,
        itt,
        ttt: RESERVED_TAG,
        stat_sn: 1,
        exp_cmd_sn: 2,
        max_cmd_sn: 16,
        ..DataIn::default()
    };
    c.handle_pdu(now, Pdu::new(h, data));
    loop {
        match c.poll_event() {
            Some(Event::Completed { result, .. }) => return result.unwrap(),
            Some(_) => {}
            None => panic!("no completion"),
        }
    }
}

/// Issue 27: a Data-In carrying a whole READ in a buffer nothing else holds becomes the
/// command's data (the same memory, no copy) and the caller's buffer is handed back for
/// the reader to receive into; a segment that shares its buffer is copied into the
/// caller's buffer, and nothing is handed back.
#[test]
fn accepts_a_whole_read_in_one_data_in_without_copying_it() {
    let (mut c, now) = conn();
    let mine = BytesMut::with_capacity(8192);
    let mine_at = mine.as_ptr();
    let data = Bytes::from(vec![5u8; 8192]);
    let at = data.as_ptr();
    let done = read_answered(&mut c, now, mine, data);
    assert_eq!(&done.data[..], &[5u8; 8192][..]);
    assert_eq!(done.data.as_ptr(), at, "the Data-In segment was copied");
    let back = c
        .take_spare_buffer()
        .expect("the caller's buffer comes back");
    assert_eq!(back.as_ptr(), mine_at);
    assert!(c.take_spare_buffer().is_none());

    let shared = Bytes::from(vec![6u8; 8192]);
    let keep = shared.clone();
    let done = read_answered(&mut c, now, back, shared);
    assert_eq!(&done.data[..], &keep[..]);
    assert_eq!(
        done.data.as_ptr(),
        mine_at,
        "copied into the caller's own buffer"
    );
    assert!(c.take_spare_buffer().is_none());
}

/// Issue 27: a READ whose data comes in several Data-In PDUs, each segment received in
/// place into the free end of the command's own buffer (`lend_read_buffer`): the data is
/// the caller's buffer, every byte where it belongs, and no segment was copied (each lent
/// piece is the memory right after the data before it). A lend for a Data-In that is not
/// the next one in order is refused, and what was lent and never given back (the
/// connection failed mid-segment) takes nothing from the data received before it.
#[test]
fn accepts_a_split_read_received_in_place_without_copying_it() {
    let (mut c, now) = conn();
    let mine = BytesMut::with_capacity(3 * 4096);
    let mine_at = mine.as_ptr();
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x88; 16],
                data: Data::Read {
                    buf: mine,
                    len: 3 * 4096,
                },
                timed: false,
            },
        )
        .unwrap();
    while c.poll_transmit().is_some() {}
    let data_in = |n: u32, last: bool| DataIn {
        final_: last,
        status_present: last,
        itt,
        ttt: RESERVED_TAG,
        stat_sn: 1,
        exp_cmd_sn: 2,
        max_cmd_sn: 16,
        data_sn: n,
        buffer_offset: n * 4096,
        ..DataIn::default()
    };
    assert!(
        c.lend_read_buffer(itt, 4096, 4096).is_none(),
        "offset 4096 before offset 0"
    );
    assert!(
        c.lend_read_buffer(itt, 0, 4 * 4096).is_none(),
        "past the read's end"
    );
    for n in 0..3u32 {
        let mut piece = c.lend_read_buffer(itt, n * 4096, 4096).unwrap();
        assert_eq!(
            piece.as_ptr(),
            mine_at.wrapping_add(n as usize * 4096),
            "lent right after the data so far"
        );
        piece.extend_from_slice(&[n as u8 + 1; 4096]);
        c.handle_placed_data_in(now, Pdu::new(data_in(n, n == 2), Bytes::new()), piece);
    }
    let done = loop {
        match c.poll_event() {
            Some(Event::Completed { result, .. }) => break result.unwrap(),
            Some(_) => {}
            None => panic!("no completion"),
        }
    };
    assert_eq!(done.data.as_ptr(), mine_at, "the caller's own buffer");
    let want: Vec<u8> = (1..=3u8).flat_map(|b| [b; 4096]).collect();
    assert_eq!(&done.data[..], &want[..]);

    // Lent and never given back (the connection failed while the segment came in):
    // the data before it stays the task's, and the segment received as usual follows it.
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x88; 16],
                data: Data::Read {
                    buf: BytesMut::new(),
                    len: 2 * 4096,
                },
                timed: false,
            },
        )
        .unwrap();
    while c.poll_transmit().is_some() {}
    let data_in = |n: u32| DataIn {
        final_: n == 1,
        status_present: n == 1,
        itt,
        ttt: RESERVED_TAG,
        stat_sn: 2,
        exp_cmd_sn: 3,
        max_cmd_sn: 17,
        data_sn: n,
        buffer_offset: n * 4096,
        ..DataIn::default()
    };
    let mut piece = c.lend_read_buffer(itt, 0, 4096).unwrap();
    piece.extend_from_slice(&[7u8; 4096]);
    c.handle_placed_data_in(now, Pdu::new(data_in(0), Bytes::new()), piece);
    drop(c.lend_read_buffer(itt, 4096, 4096).unwrap());
    c.handle_pdu(now, Pdu::new(data_in(1), Bytes::from(vec![8u8; 4096])));
    let done = loop {
        match c.poll_event() {
            Some(Event::Completed { result, .. }) => break result.unwrap(),
            Some(_) => {}
            None => panic!("no completion"),
        }
    };
    let want: Vec<u8> = [[7u8; 4096], [8u8; 4096]].concat();
    assert_eq!(&done.data[..], &want[..]);
}

#[test]
fn answers_an_r2t_with_data_out_slices() {
    let (mut c, now) = conn();
    let itt = write(&mut c, now, 8192);
    c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
    let p = c.poll_transmit().unwrap();
    let Header::DataOut(d) = p.header else {
        panic!()
    };
    assert_eq!(
        (d.ttt, d.buffer_offset, d.final_, p.data.len()),
        (5, 0, true, 4096)
    );
    assert!(c.closed().is_none());
}

#[test]
fn rejects_r2t_beyond_max_outstanding_r2t_while_the_first_is_unanswered() {
    let (mut c, now) = conn();
    let itt = write(&mut c, now, 8192);
    c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
    // The first R2T's Data-Out has not left yet: a second one breaks MaxOutstandingR2T=1.
    c.handle_pdu(now, r2t(itt, 6, 1, 4096, 4096));
    assert_eq!(
        violation(&mut c),
        Some(Violation::R2tOutstanding { max: 1 })
    );
    assert!(
        c.closed().is_none(),
        "the task ends, the connection goes on"
    );
    let mut abort = false;
    while let Some(p) = c.poll_transmit() {
        abort |= matches!(p.header, Header::TaskMgmtRequest(ref t) if t.function == TmfFunction::ABORT_TASK && t.referenced_task_tag == itt);
    }
    assert!(abort, "ABORT TASK cleans up the target's side");
}

#[test]
fn rejects_r2t_with_a_wrong_r2tsn() {
    let (mut c, now) = conn();
    let itt = write(&mut c, now, 8192);
    c.handle_pdu(now, r2t(itt, 5, 1, 0, 4096));
    assert_eq!(
        violation(&mut c),
        Some(Violation::R2tSn {
            expected: 0,
            got: 1
        })
    );
}

#[test]
fn rejects_r2t_reusing_an_outstanding_ttt() {
    let (mut c, now) = conn();
    c.params.max_outstanding_r2t = 4;
    let itt = write(&mut c, now, 8192);
    c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
    c.handle_pdu(now, r2t(itt, 5, 1, 4096, 4096));
    assert_eq!(
        violation(&mut c),
        Some(Violation::R2tDuplicateTag { ttt: 5 })
    );
}

#[test]
fn rejects_r2t_asking_for_the_same_bytes_twice_and_the_reserved_ttt() {
    let (mut c, now) = conn();
    let itt = write(&mut c, now, 8192);
    c.handle_pdu(now, r2t(itt, 5, 0, 0, 4096));
    while c.poll_transmit().is_some() {}
    c.handle_pdu(now, r2t(itt, 6, 1, 2048, 4096));
    assert_eq!(
        violation(&mut c),
        Some(Violation::R2tOverlap {
            offset: 2048,
            len: 4096
        })
    );
    let itt = write(&mut c, now, 4096);
    c.handle_pdu(now, r2t(itt, RESERVED_TAG, 0, 0, 4096));
    assert_eq!(violation(&mut c), Some(Violation::R2tReservedTag));
}

#[test]
fn unknown_itt_ends_the_connection_and_fails_every_task_once() {
    let (mut c, now) = conn();
    let a = write(&mut c, now, 4096);
    c.handle_pdu(now, r2t(999, 5, 0, 0, 4096));
    assert!(c.closed().is_some());
    let mut done = Vec::new();
    while let Some(e) = c.poll_event() {
        if let Event::Completed { itt, result } = e {
            assert!(matches!(result, Err(TaskError::ConnectionLost(_))));
            done.push(itt);
        }
    }
    assert_eq!(done, vec![a]);
    assert_eq!(c.tasks_in_flight(), 0);
}

#[test]
fn holds_commands_until_the_window_opens() {
    let now = Instant::now();
    let mut cfg = Config::new(params(), 1, 1, 1);
    cfg.nop_interval = None;
    let mut c = Connection::new(cfg, now);
    let a = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0; 16],
                data: Data::None,
                timed: false,
            },
        )
        .unwrap();
    let b = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0; 16],
                data: Data::None,
                timed: false,
            },
        )
        .unwrap();
    let sent: Vec<u32> = std::iter::from_fn(|| c.poll_transmit())
        .map(|p| p.header.itt())
        .collect();
    assert_eq!(sent, vec![a], "MaxCmdSN 1 admits one");
    let resp = ScsiResponse {
        itt: a,
        stat_sn: 1,
        exp_cmd_sn: 2,
        max_cmd_sn: 2,
        ..ScsiResponse::default()
    };
    c.handle_pdu(now, Pdu::new(resp, Bytes::new()));
    let sent: Vec<u32> = std::iter::from_fn(|| c.poll_transmit())
        .map(|p| p.header.itt())
        .collect();
    assert_eq!(sent, vec![b]);
    assert_eq!(c.sequence().3, 2, "ExpStatSN advanced");
}

#[test]
fn tells_which_commands_never_left_the_engine_when_the_connection_ends() {
    let now = Instant::now();
    let mut cfg = Config::new(params(), 1, 1, 1);
    cfg.nop_interval = None;
    let mut c = Connection::new(cfg, now);
    let cmd = || Command {
        lun: 0,
        cdb: [0; 16],
        data: Data::None,
        timed: false,
    };
    let sent = c.submit(now, cmd()).unwrap();
    let taken: Vec<u32> = std::iter::from_fn(|| c.poll_transmit())
        .map(|p| p.header.itt())
        .collect();
    assert_eq!(taken, vec![sent]);
    // MaxCmdSN 1: this one waits for the window.
    let held = c.submit(now, cmd()).unwrap();
    c.close(Side::Initiator, CloseReason::Local);
    let mut ended = Vec::new();
    while let Some(e) = c.poll_event() {
        if let Event::Completed { itt, result } = e {
            assert!(matches!(result, Err(TaskError::ConnectionLost(_))));
            ended.push(itt);
        }
    }
    ended.sort_unstable();
    assert_eq!(ended, vec![sent, held]);
    assert!(
        !c.never_sent(sent),
        "on the wire: the target may have run it"
    );
    assert!(c.never_sent(held));
}

#[test]
fn a_command_queued_for_the_writer_counts_as_never_sent() {
    let now = Instant::now();
    let mut cfg = Config::new(params(), 1, 8, 1);
    cfg.nop_interval = None;
    let mut c = Connection::new(cfg, now);
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0; 16],
                data: Data::None,
                timed: false,
            },
        )
        .unwrap();
    c.peer_closed();
    assert!(c.never_sent(itt));
    // And it stays unsent: a closed connection hands the driver nothing more, or a writer
    // still holding the socket could send a command that session recovery then sends
    // again on the next connection (found by the engine_session fuzz target: a COMPARE AND
    // WRITE on two connections).
    assert!(
        c.poll_transmit().is_none(),
        "a PDU left a closed connection"
    );
    assert!(!c.has_transmit());
}

// ---- command timeout and its escalation, on a virtual clock ----

const LIMIT: Duration = Duration::from_secs(30);

fn timed_conn() -> (Connection, Instant) {
    let now = Instant::now();
    let mut cfg = Config::new(params(), 1, 16, 1);
    cfg.nop_interval = None;
    cfg.command_timeout = Some(LIMIT);
    cfg.tmf_timeout = Duration::from_secs(10);
    (Connection::new(cfg, now), now)
}

fn tur(c: &mut Connection, now: Instant, timed: bool) -> u32 {
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0; 16],
                data: Data::None,
                timed,
            },
        )
        .unwrap();
    while c.poll_transmit().is_some() {}
    itt
}

/// Every TMF request queued: (its ITT, function, referenced task tag, RefCmdSN).
fn tmfs_sent(c: &mut Connection) -> Vec<(u32, TmfFunction, u32, u32)> {
    std::iter::from_fn(|| c.poll_transmit())
        .filter_map(|p| match p.header {
            Header::TaskMgmtRequest(t) => {
                Some((t.itt, t.function, t.referenced_task_tag, t.ref_cmd_sn))
            }
            _ => None,
        })
        .collect()
}

fn tmf_answer(itt: u32, response: TmfResponse) -> Pdu {
    Pdu::new(
        TaskMgmtResponse {
            response,
            itt,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 16,
        },
        Bytes::new(),
    )
}

fn good(itt: u32) -> Pdu {
    Pdu::new(
        ScsiResponse {
            itt,
            stat_sn: 1,
            exp_cmd_sn: 2,
            max_cmd_sn: 16,
            ..ScsiResponse::default()
        },
        Bytes::new(),
    )
}

/// The results of every `Completed` event, by ITT, in order.
fn completed(c: &mut Connection) -> Vec<(u32, Result<Completion, TaskError>)> {
    std::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            Event::Completed { itt, result } => Some((itt, result)),
            _ => None,
        })
        .collect()
}

#[test]
fn a_command_past_its_timeout_gets_an_abort_task_and_fails_with_timed_out_when_answered() {
    let (mut c, t0) = timed_conn();
    let itt = tur(&mut c, t0, true);
    assert_eq!(c.poll_timeout(), Some(t0 + LIMIT));
    c.handle_timeout(t0 + LIMIT - Duration::from_millis(1));
    assert!(tmfs_sent(&mut c).is_empty(), "not before the deadline");
    c.handle_timeout(t0 + LIMIT);
    let tmfs = tmfs_sent(&mut c);
    assert_eq!(tmfs.len(), 1);
    let (tmf, f, rtt, ref_sn) = tmfs[0];
    assert_eq!((f, rtt, ref_sn), (TmfFunction::ABORT_TASK, itt, 1));
    assert!(
        completed(&mut c).is_empty(),
        "waits for the target's answer"
    );
    c.handle_pdu(t0 + LIMIT, tmf_answer(tmf, TmfResponse::FUNCTION_COMPLETE));
    let done = completed(&mut c);
    assert_eq!(
        done,
        vec![(
            itt,
            Err(TaskError::TimedOut {
                after: LIMIT,
                by: Some(AbortedBy::AbortTask)
            })
        )]
    );
    assert!(c.closed().is_none(), "the connection goes on");
    assert_eq!((c.tasks_in_flight(), c.tmfs_in_flight()), (0, 0));
    assert_eq!(c.poll_timeout(), None, "nothing left to time");
}

#[test]
fn accepts_a_status_that_arrives_before_the_abort_answer_as_the_commands_result() {
    let (mut c, t0) = timed_conn();
    let itt = tur(&mut c, t0, true);
    c.handle_timeout(t0 + LIMIT);
    let (tmf, ..) = tmfs_sent(&mut c)[0];
    c.handle_pdu(t0 + LIMIT, good(itt));
    c.handle_pdu(
        t0 + LIMIT,
        tmf_answer(tmf, TmfResponse::TASK_DOES_NOT_EXIST),
    );
    let done = completed(&mut c);
    assert_eq!(done.len(), 1);
    assert!(matches!(done[0].1, Ok(Completion { status: 0, .. })));
    assert!(tmfs_sent(&mut c).is_empty(), "no escalation");
    assert!(c.closed().is_none());
}

#[test]
fn a_refused_abort_escalates_to_a_lun_reset_that_ends_the_command_with_timed_out() {
    let (mut c, t0) = timed_conn();
    let late = tur(&mut c, t0, true);
    // Another task on the LUN, submitted later and untimed: the reset ends it too.
    let other = tur(&mut c, t0 + Duration::from_secs(1), false);
    c.handle_timeout(t0 + LIMIT);
    let (abort, ..) = tmfs_sent(&mut c)[0];
    c.handle_pdu(
        t0 + LIMIT,
        tmf_answer(abort, TmfResponse::FUNCTION_REJECTED),
    );
    let steps: Vec<TimeoutStep> = std::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            Event::TimeoutStep { itt, step } if itt == late => Some(step),
            _ => None,
        })
        .collect();
    assert_eq!(
        steps,
        vec![
            TimeoutStep::AbortTask,
            TimeoutStep::LunReset {
                abort_response: TmfResponse::FUNCTION_REJECTED
            }
        ]
    );
    let tmfs = tmfs_sent(&mut c);
    assert_eq!(tmfs.len(), 1);
    let (reset, f, rtt, _) = tmfs[0];
    assert_eq!((f, rtt), (TmfFunction::LOGICAL_UNIT_RESET, RESERVED_TAG));
    c.handle_pdu(
        t0 + LIMIT,
        tmf_answer(reset, TmfResponse::FUNCTION_COMPLETE),
    );
    let done = completed(&mut c);
    assert_eq!(
        done,
        vec![
            (
                late,
                Err(TaskError::TimedOut {
                    after: LIMIT,
                    by: Some(AbortedBy::LunReset)
                })
            ),
            (other, Err(TaskError::Aborted(AbortedBy::LunReset))),
        ]
    );
    assert!(
        std::iter::from_fn(|| c.poll_event()).all(|e| !matches!(e, Event::TaskManagement { .. })),
        "the engine's own TMFs are not reported as the caller's"
    );
    assert!(c.closed().is_none());
}

#[test]
fn a_refused_abort_and_a_refused_lun_reset_end_the_connection() {
    let (mut c, t0) = timed_conn();
    let itt = tur(&mut c, t0, true);
    c.handle_timeout(t0 + LIMIT);
    let (abort, ..) = tmfs_sent(&mut c)[0];
    c.handle_pdu(
        t0 + LIMIT,
        tmf_answer(abort, TmfResponse::FUNCTION_REJECTED),
    );
    let (reset, ..) = tmfs_sent(&mut c)[0];
    c.handle_pdu(
        t0 + LIMIT,
        tmf_answer(reset, TmfResponse::FUNCTION_REJECTED),
    );
    let e = ConnectionError {
        by: Side::Initiator,
        reason: CloseReason::AbortRefused {
            abort: TmfResponse::FUNCTION_REJECTED,
            reset: TmfResponse::FUNCTION_REJECTED,
        },
    };
    assert_eq!(c.closed(), Some(e));
    assert_eq!(
        completed(&mut c),
        vec![(itt, Err(TaskError::ConnectionLost(e)))],
        "a connection loss, so session recovery reissues it"
    );
    assert!(!c.never_sent(itt), "the target saw it");
}

#[test]
fn an_unanswered_abort_ends_the_connection_after_the_tmf_timeout() {
    let (mut c, t0) = timed_conn();
    let itt = tur(&mut c, t0, true);
    c.handle_timeout(t0 + LIMIT);
    assert_eq!(tmfs_sent(&mut c).len(), 1);
    let tmf_deadline = t0 + LIMIT + Duration::from_secs(10);
    assert_eq!(c.poll_timeout(), Some(tmf_deadline));
    c.handle_timeout(tmf_deadline - Duration::from_millis(1));
    assert!(c.closed().is_none());
    c.handle_timeout(tmf_deadline);
    let e = ConnectionError {
        by: Side::Initiator,
        reason: CloseReason::TaskManagementTimeout(Duration::from_secs(10)),
    };
    assert_eq!(c.closed(), Some(e));
    assert_eq!(
        completed(&mut c),
        vec![(itt, Err(TaskError::ConnectionLost(e)))]
    );
}

#[test]
fn an_unanswered_lun_reset_after_a_refused_abort_ends_the_connection() {
    let (mut c, t0) = timed_conn();
    let itt = tur(&mut c, t0, true);
    c.handle_timeout(t0 + LIMIT);
    let (abort, ..) = tmfs_sent(&mut c)[0];
    let t1 = t0 + LIMIT + Duration::from_secs(2);
    c.handle_pdu(t1, tmf_answer(abort, TmfResponse::FUNCTION_REJECTED));
    assert_eq!(tmfs_sent(&mut c)[0].1, TmfFunction::LOGICAL_UNIT_RESET);
    assert_eq!(c.poll_timeout(), Some(t1 + Duration::from_secs(10)));
    c.handle_timeout(t1 + Duration::from_secs(10));
    assert!(matches!(
        c.closed(),
        Some(ConnectionError {
            reason: CloseReason::TaskManagementTimeout(_),
            ..
        })
    ));
    assert!(matches!(
        completed(&mut c)[..],
        [(i, Err(TaskError::ConnectionLost(_)))] if i == itt
    ));
}

#[test]
fn accepts_an_untimed_command_waiting_past_the_timeout() {
    let (mut c, t0) = timed_conn();
    let itt = tur(&mut c, t0, false);
    assert_eq!(c.poll_timeout(), None);
    c.handle_timeout(t0 + LIMIT * 10);
    assert!(tmfs_sent(&mut c).is_empty());
    c.handle_pdu(t0 + LIMIT * 10, good(itt));
    assert!(matches!(completed(&mut c)[..], [(i, Ok(_))] if i == itt));
}

#[test]
fn a_command_still_waiting_for_the_window_times_out_without_a_tmf() {
    let now = Instant::now();
    let mut cfg = Config::new(params(), 1, 1, 1);
    cfg.nop_interval = None;
    cfg.command_timeout = Some(LIMIT);
    let mut c = Connection::new(cfg, now);
    let _sent = tur(&mut c, now, false);
    let held = tur(&mut c, now, true);
    c.handle_timeout(now + LIMIT);
    assert!(tmfs_sent(&mut c).is_empty());
    assert_eq!(
        completed(&mut c),
        vec![(
            held,
            Err(TaskError::TimedOut {
                after: LIMIT,
                by: None
            })
        )]
    );
    // The window opens later: the withdrawn command does not leave.
    c.handle_pdu(now + LIMIT, good(_sent));
    assert!(std::iter::from_fn(|| c.poll_transmit()).all(|p| p.header.itt() != held));
}

#[test]
fn the_next_timeout_follows_the_oldest_command_still_in_flight() {
    let (mut c, t0) = timed_conn();
    let a = tur(&mut c, t0, true);
    let b = tur(&mut c, t0 + Duration::from_secs(1), true);
    let cc = tur(&mut c, t0 + Duration::from_secs(2), true);
    assert_eq!(c.poll_timeout(), Some(t0 + LIMIT));
    // Out of order: b first changes nothing, then a uncovers c's (b's entry is stale).
    c.handle_pdu(t0, good(b));
    assert_eq!(c.poll_timeout(), Some(t0 + LIMIT));
    c.handle_pdu(t0, good(a));
    assert_eq!(c.poll_timeout(), Some(t0 + Duration::from_secs(2) + LIMIT));
    c.handle_pdu(t0, good(cc));
    assert_eq!(c.poll_timeout(), None);
    assert_eq!(completed(&mut c).len(), 3);
    assert!(tmfs_sent(&mut c).is_empty());
}

/// Whether `piece` is memory of `part` (a slice of it, not a copy).
fn is_slice_of(piece: &Bytes, part: &Bytes) -> bool {
    let (p, a) = (piece.as_ptr() as usize, part.as_ptr() as usize);
    p >= a && p + piece.len() <= a + part.len()
}

/// The write's data PDUs as (offset, data): the command's immediate data at 0, then each
/// Data-Out, answering an R2T for each burst the command's PDUs leave unsent.
fn two_part_write_pdus(p: SessionParams, data: &Bytes, tail: &Bytes) -> Vec<(u32, Bytes)> {
    let now = Instant::now();
    let burst = p.max_burst_length;
    let mut cfg = Config::new(p, 1, 16, 1);
    cfg.nop_interval = None;
    let mut c = Connection::new(cfg, now);
    let total = (data.len() + tail.len()) as u32;
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x8a; 16],
                data: Data::WriteParts {
                    data: data.clone(),
                    tail: tail.clone(),
                },
                timed: false,
            },
        )
        .unwrap();
    let mut got = Vec::new();
    let mut next = 0u32;
    for r2t_sn in 0.. {
        while let Some(pdu) = c.poll_transmit() {
            let off = match &pdu.header {
                Header::ScsiCommand(h) => {
                    assert_eq!(h.expected_data_transfer_length, total);
                    0
                }
                Header::DataOut(h) => h.buffer_offset,
                other => panic!("unexpected {other:?}"),
            };
            if !pdu.data.is_empty() {
                assert_eq!(off, next, "in order, nothing skipped");
                next += pdu.data.len() as u32;
                got.push((off, pdu.data));
            }
        }
        if next == total {
            break;
        }
        let len = (total - next).min(burst);
        c.handle_pdu(now, r2t(itt, 100 + r2t_sn, r2t_sn, next, len));
    }
    assert!(c.closed().is_none());
    got
}

/// Issue 27: a write whose data goes as two parts (Seal `none`'s plaintext as the caller gave
/// it, then its trailer) is sent without joining them: every data PDU is a slice of one part
/// (the same memory, no copy) — the Data-Out that would straddle the join is cut there, the
/// tail goes in a PDU of its own — and together they carry data then tail, in order.
/// Immediate data stops at the join when unsolicited Data-Out may carry the rest; under
/// InitialR2T=Yes, where none may, the two are joined in the command PDU instead of waiting
/// for an R2T.
#[test]
fn sends_a_two_part_write_without_joining_its_parts() {
    let data = Bytes::from((0..10_000u32).map(|i| i as u8).collect::<Vec<u8>>());
    let tail = Bytes::from(vec![0xee; 40]);
    let want = [&data[..], &tail[..]].concat();
    let check = |pdus: &[(u32, Bytes)]| {
        let sent: Vec<u8> = pdus.iter().flat_map(|(_, d)| d.to_vec()).collect();
        assert_eq!(sent, want);
        for (off, d) in pdus {
            assert!(
                is_slice_of(d, &data) || is_slice_of(d, &tail),
                "the PDU at {off} ({} bytes) is a copy",
                d.len()
            );
        }
    };
    // Solicited by R2Ts of 4 KiB (params(): InitialR2T=Yes, no immediate data).
    let pdus = two_part_write_pdus(params(), &data, &tail);
    check(&pdus);
    let sizes: Vec<(u32, usize)> = pdus.iter().map(|(o, d)| (*o, d.len())).collect();
    assert_eq!(
        sizes,
        [(0, 4096), (4096, 4096), (8192, 1808), (10_000, 40)],
        "the last burst's Data-Out is cut at the join"
    );
    // Immediate data and unsolicited Data-Out (InitialR2T=No): the command PDU carries the
    // data, a Data-Out the tail.
    let small = data.slice(..3000);
    let unsolicited = SessionParams {
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 4096,
        ..params()
    };
    let pdus = two_part_write_pdus(unsolicited, &small, &tail);
    assert_eq!(pdus.len(), 2);
    assert_eq!(pdus[0].1.as_ptr(), small.as_ptr(), "immediate data copied");
    assert_eq!((pdus[1].0, pdus[1].1.as_ptr()), (3000, tail.as_ptr()));
    // InitialR2T=Yes with immediate data: no Data-Out may follow unsolicited, so the command
    // carries both parts joined (a round trip for 40 bytes would cost more than the copy).
    let immediate_only = SessionParams {
        immediate_data: true,
        ..params()
    };
    let pdus = two_part_write_pdus(immediate_only, &small, &tail);
    assert_eq!(pdus.len(), 1, "all of it immediate");
    assert_eq!(&pdus[0].1[..], &[&small[..], &tail[..]].concat()[..]);
}

/// A READ of 4 KiB submitted and taken by the driver: its ITT.
fn read_sent(c: &mut Connection, now: Instant) -> u32 {
    let itt = c
        .submit(
            now,
            Command {
                lun: 0,
                cdb: [0x88; 16],
                data: Data::Read {
                    buf: BytesMut::new(),
                    len: 4096,
                },
                timed: false,
            },
        )
        .unwrap();
    assert!(matches!(
        c.poll_transmit().map(|p| p.header),
        Some(Header::ScsiCommand(_))
    ));
    itt
}

/// Issue 28: a lone command that nothing follows on its connection, unanswered past the tail
/// probe's delay, is followed by a NOP-Out asking no answer (ITT and TTT 0xffffffff,
/// immediate, RFC 7143 §11.18) that does not take the CmdSN the next command gets; one probe
/// per burst.
#[test]
fn sends_a_tail_probe_after_a_lone_command_that_nothing_answered() {
    let (mut c, now) = conn();
    c.set_tail_probe(Some(Duration::from_millis(5)));
    read_sent(&mut c, now);
    assert_eq!(c.poll_timeout(), None, "armed only once written");
    c.flushed(now);
    assert_eq!(c.poll_timeout(), Some(now + Duration::from_millis(5)));
    c.handle_timeout(now + Duration::from_millis(4));
    assert!(c.poll_transmit().is_none(), "not before its time");
    c.handle_timeout(now + Duration::from_millis(5));
    let p = c.poll_transmit().expect("the tail probe");
    let Header::NopOut(h) = p.header else {
        panic!("not a NOP-Out: {:?}", p.header);
    };
    assert!(h.immediate);
    assert_eq!((h.itt, h.ttt), (RESERVED_TAG, RESERVED_TAG));
    assert_eq!(h.cmd_sn, 2, "the next CmdSN, not advanced");
    assert!(p.data.is_empty());
    // The probe ends the burst: no second one.
    c.flushed(now + Duration::from_millis(5));
    assert_eq!(c.poll_timeout(), None);
    let itt = read_sent(&mut c, now);
    assert_eq!(c.tasks.get(&itt).map(|t| &t.phase), Some(&Phase::Sent(2)));
}

/// No probe once the target said something for the task (its command arrived), none while
/// more waits to leave (that is the later segment), none when off (the default).
#[test]
fn sends_no_tail_probe_once_the_target_answered_or_when_off() {
    let (mut c, now) = conn();
    c.set_tail_probe(Some(Duration::from_millis(5)));
    let itt = read_sent(&mut c, now);
    c.flushed(now);
    let h = DataIn {
        itt,
        ttt: RESERVED_TAG,
        stat_sn: 1,
        exp_cmd_sn: 2,
        max_cmd_sn: 16,
        ..DataIn::default()
    };
    c.handle_pdu(now, Pdu::new(h, Bytes::from(vec![1u8; 512])));
    c.handle_timeout(now + Duration::from_millis(10));
    assert!(c.poll_transmit().is_none(), "the target has the command");

    // A command taken while another waits behind it does not end the burst.
    for _ in 0..2 {
        c.submit(
            now,
            Command {
                lun: 0,
                cdb: [0x00; 16],
                data: Data::None,
                timed: false,
            },
        )
        .unwrap();
    }
    assert!(c.poll_transmit().is_some());
    c.flushed(now);
    assert_eq!(c.poll_timeout(), None);

    let (mut off, now) = conn();
    read_sent(&mut off, now);
    off.flushed(now);
    off.handle_timeout(now + Duration::from_secs(1));
    assert!(off.poll_transmit().is_none(), "off by default");
}
