//! The target's task table is bounded whatever ITTs and CmdSNs the initiator sends: what makes
//! its keyed cheap hash safe (`engine::PeerTags`; the argument is at `Connection`'s `tasks`).
//! Non-immediate commands hold a CmdSN window slot until their status is queued, running ones
//! aborted included (RFC 7143 §4.2.2.1); immediate ones past
//! [`target::MAX_IMMEDIATE_TASKS`] are refused with Reject 0x06 (§11.17.1). A flood of
//! commands with tags chosen to collide (same low 16 or 20 bits, the bits a bucket index
//! takes) and CmdSNs past the window, of reads that run and writes that wait for data,
//! never grows the table past window + immediate cap, on one connection or over a session's
//! two.

#[allow(dead_code)]
mod common;

use std::time::Instant;

use bytes::Bytes;
use common::{scsi_command, Disk};
use iscsi_proto::engine::target::session::Session;
use iscsi_proto::engine::target::{self, Config, Connection, Event, Response, MAX_IMMEDIATE_TASKS};
use iscsi_proto::params::SessionParams;
use iscsi_wire::header::{RejectReason, ScsiCommand, TaskMgmtRequest, TmfFunction};
use iscsi_wire::{Header, Pdu};

const WINDOW: u32 = 8;

fn config() -> Config {
    let params = SessionParams {
        // Writes wait for an R2T's data: they stay in the table collecting.
        initial_r2t: true,
        immediate_data: false,
        max_connections: 2,
        ..SessionParams::default()
    };
    let mut cfg = Config::new(params, 1, 1);
    cfg.cmd_window = WINDOW;
    cfg
}

/// A READ(16) or a WRITE(16) of one block at LBA 0 (`common::scsi_command`), immediate or not.
fn command(itt: u32, cmd_sn: u32, immediate: bool, write: bool) -> Pdu {
    Pdu::new(
        ScsiCommand {
            immediate,
            ..scsi_command(itt, cmd_sn, write, 0, 1)
        },
        Bytes::new(),
    )
}

/// The k-th adversarial tag (k < 8192): the even ones share their low 16 bits, the odd ones
/// their low 20; all differ (bit 15 tells the kinds apart), none is the reserved 0xffffffff.
fn itt(k: u32) -> u32 {
    if k % 2 == 0 {
        (k << 16) | 0x5a5a
    } else {
        ((k >> 1) << 20) | 0x8_a5a5
    }
}

/// Rejects "Immediate command reject" among the PDUs queued.
fn immediate_rejects(c: &mut Connection) -> usize {
    std::iter::from_fn(|| c.poll_transmit())
        .filter(|p| {
            matches!(&p.header, Header::Reject(r) if r.reason == RejectReason::IMMEDIATE_COMMAND_REJECT)
        })
        .count()
}

const BOUND: usize = WINDOW as usize + MAX_IMMEDIATE_TASKS;

#[test]
fn a_flood_of_colliding_tags_never_grows_the_task_table_past_window_and_immediate_cap() {
    let now = Instant::now();
    let mut c = Connection::new(config(), now);
    let (mut immediates, mut rejected, mut most) = (0usize, 0usize, 0usize);
    let mut cmd_sn = 1u32;
    for k in 0..4000u32 {
        let immediate = k % 3 == 0;
        immediates += usize::from(immediate);
        // CmdSNs run on past MaxCmdSN: the window ignores those (§4.2.2.1).
        c.handle_pdu(now, &Disk, command(itt(k), cmd_sn, immediate, k % 2 == 1));
        cmd_sn += u32::from(!immediate);
        rejected += immediate_rejects(&mut c);
        most = most.max(c.tasks_in_flight());
        assert!(
            c.tasks_in_flight() <= BOUND,
            "{} tasks",
            c.tasks_in_flight()
        );
    }
    assert_eq!(
        most, BOUND,
        "the flood fills the table to its bound, no further"
    );
    assert_eq!(rejected, immediates - MAX_IMMEDIATE_TASKS);

    // ABORT TASK SET: collecting writes leave, running reads keep their slots (and so their
    // place in the table) until the driver completes them; a second flood finds no room.
    let abort = TaskMgmtRequest {
        immediate: true,
        function: TmfFunction::ABORT_TASK_SET,
        lun: 0,
        itt: 0xfeed,
        referenced_task_tag: 0xffff_ffff,
        cmd_sn: 0,
        exp_stat_sn: 0,
        ref_cmd_sn: 0,
        exp_data_sn: 0,
    };
    c.handle_pdu(now, &Disk, Pdu::new(abort, Bytes::new()));
    let running: Vec<u32> = std::iter::from_fn(|| c.poll_event())
        .filter_map(|e| match e {
            Event::Execute(x) => Some(x.itt),
            _ => None,
        })
        .collect();
    assert_eq!(c.tasks_in_flight(), running.len());
    let exp = c.window().exp_cmd_sn();
    for k in 4000..8000u32 {
        c.handle_pdu(
            now,
            &Disk,
            command(itt(k), exp + k - 4000, k % 3 == 0, k % 2 == 1),
        );
        let _ = immediate_rejects(&mut c);
        assert!(
            c.tasks_in_flight() <= BOUND,
            "{} tasks",
            c.tasks_in_flight()
        );
    }
    // The driver answers what it ran: the aborted ones' answers are suppressed, and every
    // slot comes back.
    for t in running {
        assert!(c.complete(t, Response::good(Bytes::new())));
    }
    let _ = std::iter::from_fn(|| c.poll_transmit()).count();
    assert!(c.tasks_in_flight() <= BOUND);
}

#[test]
fn a_session_of_two_connections_shares_one_window_bound() {
    let now = Instant::now();
    let (mut s, a) = Session::<()>::new(config(), now);
    let mut second = config();
    second.cid = 1;
    let b = s
        .add_connection(second, now, &Disk)
        .expect("MaxConnections 2")
        .id;
    assert_eq!(s.open_connections(), 2);
    for k in 0..4000u32 {
        let on = if k % 2 == 0 { a } else { b };
        // Both connections send the same CmdSNs' run: the one window admits each once.
        s.handle_pdu(
            on,
            now,
            &Disk,
            command(itt(k), 1 + k / 2, k % 5 == 0, k % 3 == 0),
        );
        while s.poll_transmit(a).is_some() {}
        while s.poll_transmit(b).is_some() {}
        let tasks = |id| {
            s.connection(id)
                .map_or(0, target::Connection::tasks_in_flight)
        };
        let total = tasks(a) + tasks(b);
        assert!(
            total <= WINDOW as usize + 2 * MAX_IMMEDIATE_TASKS,
            "{total} tasks over two connections"
        );
    }
}
