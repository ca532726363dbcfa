#![allow(clippy::unwrap_used, clippy::expect_used)]

//! A target session of several connections (RFC 7143 §4.2, MaxConnections > 1; issue 28),
//! driven the way an initiator spreading commands over its connections drives it.
//!
//! The seeded simulation sends reads and writes (immediate, unsolicited and solicited data)
//! over 2–4 connections; each connection is a FIFO (TCP), and the target reads the connections
//! in a random interleaving, completes commands in random order and sends on random
//! connections. It checks that every command completes exactly once with the right data; that
//! reads run in CmdSN order however the connections interleave; that a task's R2Ts, Data-In and
//! status come back on the connection its command went out on (allegiance); that StatSN runs in
//! sequence per connection while ExpCmdSN and MaxCmdSN (the session's window) never move back
//! on any of them; that the initiator, sending only within the MaxCmdSN it saw on any
//! connection, is never ignored; and that the window is whole again at the end. A failure names
//! its seed: `MCS_SIM_SEED=<n> cargo test -p iscsi-proto --test target_session_sim`.
//!
//! The fixed tests below take one rule each: a command sent ahead on another connection waits
//! for its predecessor, ITTs are the session's, MaxConnections and connection reinstatement,
//! a Logout of one connection, a lost connection's held commands, task management across
//! connections.

#[allow(dead_code)]
mod common;

use std::collections::{HashMap, VecDeque};
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use common::{
    answer, check_good, data_out, executes, pattern_bytes, pick, random_first_sn, random_params,
    run_seeds, scsi_command, target_config, target_session, Disk, BLOCK,
};
use ipsan_wan::rng::Rng;
use iscsi_proto::engine::target::session::{AddError, ConnId, Session};
use iscsi_proto::engine::target::{Event, Execute, Response};
use iscsi_proto::engine::CloseReason;
use iscsi_proto::params::SessionParams;
use iscsi_proto::seq::{sn_le, sn_lt};
use iscsi_wire::header::{
    LogoutReason, LogoutRequest, NopOut, TaskMgmtRequest, TmfFunction, TmfResponse,
};
use iscsi_wire::{Header, Pdu, RESERVED_TAG};

fn command(itt: u32, cmd_sn: u32, write: bool, lba: u64, blocks: u32, data: Bytes) -> Pdu {
    Pdu::new(scsi_command(itt, cmd_sn, write, lba, blocks), data)
}

fn logout(itt: u32, cmd_sn: u32, reason: LogoutReason, cid: u16) -> Pdu {
    Pdu::new(
        LogoutRequest {
            immediate: false,
            reason,
            itt,
            cid,
            cmd_sn,
            exp_stat_sn: 0,
        },
        Bytes::new(),
    )
}

fn tmf(itt: u32, cmd_sn: u32, function: TmfFunction) -> Pdu {
    Pdu::new(
        TaskMgmtRequest {
            immediate: true,
            function,
            lun: 0,
            itt,
            referenced_task_tag: RESERVED_TAG,
            cmd_sn,
            exp_stat_sn: 0,
            ref_cmd_sn: 0,
            exp_data_sn: 0,
        },
        Bytes::new(),
    )
}

/// StatSN (when the PDU carries status), ExpCmdSN and MaxCmdSN of a target PDU.
fn seqs(h: &Header) -> Option<(Option<u32>, u32, u32)> {
    Some(match h {
        Header::ScsiResponse(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn),
        Header::DataIn(d) => (
            d.status_present.then_some(d.stat_sn),
            d.exp_cmd_sn,
            d.max_cmd_sn,
        ),
        Header::R2t(r) => (None, r.exp_cmd_sn, r.max_cmd_sn),
        Header::TaskMgmtResponse(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn),
        Header::LogoutResponse(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn),
        Header::Reject(r) => (Some(r.stat_sn), r.exp_cmd_sn, r.max_cmd_sn),
        Header::NopIn(n) => (
            (n.itt != RESERVED_TAG).then_some(n.stat_sn),
            n.exp_cmd_sn,
            n.max_cmd_sn,
        ),
        _ => return None,
    })
}

fn params(max_connections: u32) -> SessionParams {
    SessionParams {
        max_connections,
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 4096,
        max_burst_length: 8192,
        initiator_max_recv_data_segment_length: 4096,
        target_max_recv_data_segment_length: 4096,
        max_outstanding_r2t: 1,
        ..SessionParams::default()
    }
}

/// A session of `n` connections (CIDs 0..n) starting at CmdSN 10, window `depth`.
fn session(n: u16, depth: u32) -> (Session, Vec<ConnId>, Instant) {
    let now = Instant::now();
    let p = params(u32::from(n));
    let (mut s, first) = Session::new(target_config(&p, 0, 10, 100, depth), now);
    let mut ids = vec![first];
    for cid in 1..n {
        let a = s
            .add_connection(target_config(&p, cid, 10, 100, depth), now, &Disk)
            .unwrap();
        assert_eq!(a.reinstated, None);
        ids.push(a.id);
    }
    (s, ids, now)
}

fn transmit(s: &mut Session, id: ConnId) -> Vec<Header> {
    let mut v = Vec::new();
    while let Some(p) = s.poll_transmit(id) {
        v.push(p.header);
    }
    v
}

struct Cmd {
    /// The connection it went out on.
    conn: ConnId,
    cmd_sn: u32,
    write: bool,
    lba: u64,
    blocks: u32,
    completions: u32,
    /// Its connection was cut before its status arrived: it never completes.
    lost: bool,
    data_in: BytesMut,
}

/// One connection as the initiator sees it.
struct Link {
    id: ConnId,
    live: bool,
    /// Initiator to target, in order (TCP).
    wire: VecDeque<Pdu>,
    next_stat_sn: u32,
    seen: Option<(u32, u32)>,
}

/// One seeded workload; `Err` says what went wrong.
#[allow(clippy::too_many_lines)]
fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let trace = std::env::var("MCS_SIM_TRACE").is_ok();
    let p_trace = trace;
    let n = 2 + rng.below(3) as usize;
    let depth = pick(&mut rng, &[1, 2, 4, 8, 32]);
    let mut p = params(n as u32);
    random_params(&mut rng, &mut p, &[4096, 8192]);
    let mrdsl = p.target_max_recv_data_segment_length;
    // Connections cut (when nothing is in flight on their wire) and added again, or not.
    let churn = rng.chance(0.5);
    // Near the wrap of 32-bit serial numbers now and then.
    let first_sn = random_first_sn(&mut rng);
    if p_trace {
        eprintln!("params {p:?} mrdsl {mrdsl} depth {depth}");
    }
    let now = Instant::now();
    let (mut s, conns) = target_session(&mut rng, &p, n, first_sn, depth, now)?;
    let mut links: Vec<Link> = conns
        .into_iter()
        .map(|(id, stat)| Link {
            id,
            live: true,
            wire: VecDeque::new(),
            next_stat_sn: stat,
            seen: None,
        })
        .collect();
    let mut next_cid = n as u16;
    let total = 150 + rng.below(100) as usize;
    let mut cmds: HashMap<u32, Cmd> = HashMap::new();
    let mut running: Vec<(ConnId, Execute)> = Vec::new();
    let mut next_sn = first_sn;
    let mut max_seen = first_sn.wrapping_add(depth - 1);
    let mut last_read_sn: Option<u32> = None;
    let mut settled = 0usize;
    let mut cuts = 0;
    let mut pings = 0u32;
    let mut ping_out = false;
    let mut idle_steps = 0u32;
    let seg = mrdsl as usize;
    for step in 0..2_000_000u32 {
        if settled == total {
            break;
        }
        let mut progressed = false;
        let c = rng.below(n as u64) as usize;
        match rng.below(20) {
            // The initiator sends a command within the window it saw, on any connection.
            0..=5 if links[c].live && cmds.len() < total && sn_le(next_sn, max_seen) => {
                let itt = cmds.len() as u32 + 1;
                let write = rng.chance(0.5);
                let blocks = 1 + rng.below(16) as u32;
                let lba = rng.below(1 << 12);
                let len = (u64::from(blocks) * BLOCK) as usize;
                let start = lba * BLOCK;
                let imm = if write && p.immediate_data {
                    len.min(p.first_burst_length as usize).min(seg)
                } else {
                    0
                };
                let unsolicited = if write && !p.initial_r2t {
                    len.min(p.first_burst_length as usize)
                } else {
                    0
                }
                .max(imm);
                let wire = &mut links[c].wire;
                let mut cmd = command(itt, next_sn, write, lba, blocks, pattern_bytes(start, imm));
                if let Header::ScsiCommand(h) = &mut cmd.header {
                    // F: no unsolicited Data-Out follows (RFC 7143 §11.3.1).
                    h.final_ = unsolicited == imm;
                }
                wire.push_back(cmd);
                let mut off = imm;
                let mut dsn = 0;
                while off < unsolicited {
                    let l = seg.min(unsolicited - off);
                    wire.push_back(data_out(
                        itt,
                        RESERVED_TAG,
                        dsn,
                        off as u32,
                        off + l == unsolicited,
                        pattern_bytes(start + off as u64, l),
                    ));
                    off += l;
                    dsn += 1;
                }
                cmds.insert(
                    itt,
                    Cmd {
                        conn: links[c].id,
                        cmd_sn: next_sn,
                        write,
                        lba,
                        blocks,
                        completions: 0,
                        lost: false,
                        data_in: BytesMut::new(),
                    },
                );
                next_sn = next_sn.wrapping_add(1);
                progressed = true;
            }
            // The target reads one PDU from a connection.
            6..=11 => {
                if let Some(pdu) = links[c].wire.pop_front() {
                    if trace {
                        eprintln!(
                            "recv c{c} {:?} itt {} sn {:?} exp {} held {:?} len {}",
                            pdu.header,
                            pdu.header.itt(),
                            match &pdu.header {
                                Header::ScsiCommand(x) => Some(x.cmd_sn),
                                _ => None,
                            },
                            s.window().exp_cmd_sn(),
                            links.iter().map(|l| s.held(l.id)).collect::<Vec<_>>(),
                            pdu.data.len()
                        );
                    }
                    s.handle_pdu(links[c].id, now, &Disk, pdu);
                    progressed = true;
                }
            }
            // A running command completes (its connection may be gone by now).
            12..=14 if !running.is_empty() => {
                let k = rng.below(running.len() as u64) as usize;
                let (id, x) = running.swap_remove(k);
                let resp = answer(&x)?;
                let gone = cmds[&x.itt].lost;
                if s.complete(id, x.itt, resp) == gone {
                    return Err(format!(
                        "ITT {:#x}: complete answered {} on a connection {}",
                        x.itt,
                        !gone,
                        if gone { "cut" } else { "alive" }
                    ));
                }
                progressed = true;
            }
            // A connection is cut with nothing in flight on its wire (a lost command would
            // leave a CmdSN gap only ErrorRecoveryLevel 2 repairs); its tasks end with it.
            15 if churn
                && cuts < 3
                && links[c].live
                && links[c].wire.is_empty()
                && links.iter().filter(|l| l.live).count() > 1 =>
            {
                let id = links[c].id;
                s.peer_closed(id, now, &Disk);
                s.remove(id, now, &Disk);
                links[c].live = false;
                cuts += 1;
                // A ping's answer may have been lost with it.
                ping_out = false;
                running.retain(|(i, _)| *i != id);
                for x in cmds.values_mut() {
                    if x.conn == id && x.completions == 0 {
                        x.lost = true;
                        settled += 1;
                    }
                }
                if s.connection(id).is_some() || s.poll_transmit(id).is_some() {
                    return Err("a removed connection is still there".into());
                }
                progressed = true;
            }
            // A connection joins the session (a login with its TSIH and a new CID).
            16 if churn && !links[c].live => {
                let stat = rng.next_u64() as u32;
                let a = s
                    .add_connection(target_config(&p, next_cid, 0, stat, depth), now, &Disk)
                    .map_err(|e| format!("join: {e}"))?;
                next_cid += 1;
                links[c] = Link {
                    id: a.id,
                    live: true,
                    wire: VecDeque::new(),
                    next_stat_sn: stat,
                    seen: None,
                };
                progressed = true;
            }
            // The window looks closed: an immediate NOP-Out asks for it (the answer carries
            // MaxCmdSN; a slot freed with a connection that was cut told nobody).
            17 if links[c].live && !ping_out && !sn_le(next_sn, max_seen) => {
                pings += 1;
                ping_out = true;
                links[c].wire.push_back(Pdu::new(
                    NopOut {
                        immediate: true,
                        lun: 0,
                        itt: 0x8000_0000 + pings,
                        ttt: RESERVED_TAG,
                        cmd_sn: next_sn,
                        exp_stat_sn: 0,
                    },
                    Bytes::new(),
                ));
                progressed = true;
            }
            // The target sends on a connection; the initiator reads it.
            _ if links[c].live => {
                while let Some(pdu) = s.poll_transmit(links[c].id) {
                    progressed = true;
                    let link = &mut links[c];
                    let h = &pdu.header;
                    if let Some((st, exp, max)) = seqs(h) {
                        if let Some(st) = st {
                            if st != link.next_stat_sn {
                                return Err(format!(
                                    "connection {c}: StatSN {st}, expected {}",
                                    link.next_stat_sn
                                ));
                            }
                            link.next_stat_sn = st.wrapping_add(1);
                        }
                        if let Some((e0, m0)) = link.seen {
                            if sn_lt(exp, e0) || sn_lt(max, m0) {
                                return Err(format!(
                                    "connection {c}: window moved back ({e0},{m0}) -> ({exp},{max})"
                                ));
                            }
                        }
                        link.seen = Some((exp, max));
                        if sn_lt(max_seen, max) {
                            max_seen = max;
                        }
                    }
                    let itt = h.itt();
                    if let Some(x) = cmds.get(&itt) {
                        if x.conn != link.id {
                            return Err(format!(
                                "ITT {itt:#x} sent on {:?}, answered on {:?}: {h:?}",
                                x.conn, link.id
                            ));
                        }
                    }
                    match &pdu.header {
                        Header::R2t(r) => {
                            let start = cmds[&itt].lba * BLOCK + u64::from(r.buffer_offset);
                            let mut off = 0u32;
                            let mut dsn = 0;
                            while off < r.desired_data_transfer_length {
                                let l = mrdsl.min(r.desired_data_transfer_length - off);
                                link.wire.push_back(data_out(
                                    itt,
                                    r.ttt,
                                    dsn,
                                    r.buffer_offset + off,
                                    off + l == r.desired_data_transfer_length,
                                    pattern_bytes(start + u64::from(off), l as usize),
                                ));
                                off += l;
                                dsn += 1;
                            }
                        }
                        Header::DataIn(d) => {
                            let x = cmds
                                .get_mut(&itt)
                                .ok_or_else(|| format!("Data-In for unknown ITT {itt:#x}"))?;
                            x.data_in.extend_from_slice(&pdu.data);
                            if d.status_present {
                                x.completions += 1;
                                settled += 1;
                                check_good(itt, d.status, Some((x.lba, x.blocks)), &x.data_in)?;
                            }
                        }
                        Header::ScsiResponse(r) => {
                            let x = cmds
                                .get_mut(&itt)
                                .ok_or_else(|| format!("status for unknown ITT {itt:#x}"))?;
                            x.completions += 1;
                            settled += 1;
                            let read = (!x.write).then_some((x.lba, x.blocks));
                            check_good(itt, r.status, read, &x.data_in)?;
                        }
                        Header::NopIn(_) => ping_out = false,
                        other => return Err(format!("unexpected {other:?}")),
                    }
                }
            }
            _ => {}
        }
        while let Some((id, ev)) = s.poll_event() {
            match ev {
                Event::Execute(x) => {
                    let cmd = &cmds[&x.itt];
                    if trace {
                        eprintln!("exec {id:?} itt {} sn {}", x.itt, cmd.cmd_sn);
                    }
                    if cmd.conn != id {
                        return Err(format!("ITT {:#x} runs on {id:?}", x.itt));
                    }
                    if !cmd.write {
                        if let Some(l) = last_read_sn {
                            if !sn_lt(l, cmd.cmd_sn) {
                                return Err(format!(
                                    "read CmdSN {} ran after CmdSN {l}",
                                    cmd.cmd_sn
                                ));
                            }
                        }
                        last_read_sn = Some(cmd.cmd_sn);
                    }
                    running.push((id, x));
                }
                other => return Err(format!("{id:?}: {other:?}")),
            }
        }
        idle_steps = if progressed { 0 } else { idle_steps + 1 };
        if idle_steps > 10_000 {
            return Err(format!(
                "stuck at step {step}: {settled}/{total} settled, {} running, held {:?}, window ({}, {}), next CmdSN {next_sn}, MaxCmdSN seen {max_seen}",
                running.len(),
                links.iter().map(|l| s.held(l.id)).collect::<Vec<_>>(),
                s.window().exp_cmd_sn(),
                s.window().max_cmd_sn()
            ));
        }
    }
    if settled != total {
        return Err(format!("{settled} of {total} commands settled"));
    }
    for (itt, x) in &cmds {
        let want = u32::from(!x.lost);
        if x.completions != want {
            return Err(format!(
                "ITT {itt:#x} completed {} times (lost with its connection: {})",
                x.completions, x.lost
            ));
        }
    }
    let w = s.window();
    if w.exp_cmd_sn() != next_sn || w.max_cmd_sn() != next_sn.wrapping_add(depth - 1) {
        return Err(format!(
            "window ({}, {}) at the end, expected ({next_sn}, {})",
            w.exp_cmd_sn(),
            w.max_cmd_sn(),
            next_sn.wrapping_add(depth - 1)
        ));
    }
    if links.iter().any(|l| s.held(l.id) > 0) {
        return Err("PDUs still held at the end".into());
    }
    Ok(())
}

#[test]
fn accepts_commands_spread_over_connections_in_any_interleaving_exactly_once_in_cmdsn_order() {
    if let Some(n) = run_seeds("MCS_SIM_SEED", 200, run) {
        assert!(n > 0);
    }
}

/// §4.2.2.1: CmdSN 11 on connection 1 arrives before CmdSN 10 on connection 0; it waits, and
/// runs right after 10. Every PDU of either connection then carries the one window.
#[test]
fn holds_a_command_sent_ahead_on_another_connection_until_its_predecessor_arrives() {
    let (mut s, ids, now) = session(2, 8);
    s.handle_pdu(
        ids[1],
        now,
        &Disk,
        command(2, 11, false, 0, 1, Bytes::new()),
    );
    assert!(executes(&mut s).is_empty(), "CmdSN 11 ran before 10");
    assert_eq!(s.held(ids[1]), 1);
    assert_eq!(s.window().exp_cmd_sn(), 10);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        command(1, 10, false, 8, 1, Bytes::new()),
    );
    let ran: Vec<(ConnId, u32)> = executes(&mut s).iter().map(|(c, x)| (*c, x.itt)).collect();
    assert_eq!(ran, vec![(ids[0], 1), (ids[1], 2)]);
    assert_eq!(s.window().exp_cmd_sn(), 12);
    assert!(s.complete(ids[1], 2, Response::good(Bytes::from(vec![0; 512]))));
    assert!(
        !s.complete(ids[0], 2, Response::good(Bytes::new())),
        "not its task"
    );
    let out = transmit(&mut s, ids[1]);
    let Some(Header::DataIn(d)) = out.last() else {
        panic!("{out:?}")
    };
    assert!(d.status_present && d.itt == 2);
    assert_eq!((d.stat_sn, d.exp_cmd_sn, d.max_cmd_sn), (100, 12, 10 + 8));
    assert!(
        transmit(&mut s, ids[0]).is_empty(),
        "allegiance: nothing on 0"
    );
}

/// §11.2.1.8: an ITT is unique in the session; a command reusing one active on another
/// connection is rejected, and its CmdSN still counts.
#[test]
fn rejects_an_itt_active_on_another_connection() {
    let (mut s, ids, now) = session(2, 8);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        command(7, 10, false, 0, 1, Bytes::new()),
    );
    s.handle_pdu(
        ids[1],
        now,
        &Disk,
        command(7, 11, false, 0, 1, Bytes::new()),
    );
    let ran = executes(&mut s);
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].0, ids[0]);
    let out = transmit(&mut s, ids[1]);
    assert!(matches!(out.as_slice(), [Header::Reject(_)]), "{out:?}");
    assert_eq!(s.window().exp_cmd_sn(), 12);
}

/// §6.3.4 / §13.2: MaxConnections bounds the session; a login with the CID of a live
/// connection reinstates it (the old one closes, the new one takes its place).
#[test]
fn refuses_a_connection_beyond_max_connections_and_reinstates_the_same_cid() {
    let (mut s, ids, now) = session(2, 8);
    let p = params(2);
    let refused = s.add_connection(target_config(&p, 5, 10, 1, 8), now, &Disk);
    assert_eq!(refused, Err(AddError::TooManyConnections { max: 2 }));
    // The login that cannot join is refused with 0x0206 (RFC 7143 §11.13.5); one for a
    // session that is ending, with 0x020a.
    let status = |e: AddError| e.login_failure().status;
    assert_eq!(
        refused.map_err(status),
        Err(iscsi_proto::login::LoginStatus::TOO_MANY_CONNECTIONS)
    );
    assert_eq!(
        status(AddError::Ending),
        iscsi_proto::login::LoginStatus::SESSION_DOES_NOT_EXIST
    );
    let a = s
        .add_connection(target_config(&p, 1, 10, 1, 8), now, &Disk)
        .unwrap();
    assert_eq!(a.reinstated, Some(ids[1]));
    assert!(s.connection(ids[1]).unwrap().closed().is_some());
    assert_eq!(s.open_connections(), 2);
    s.remove(ids[1], now, &Disk);
    s.handle_pdu(a.id, now, &Disk, command(1, 10, false, 0, 1, Bytes::new()));
    assert_eq!(executes(&mut s).len(), 1);
}

/// §11.14: a Logout with reason 1 closes its connection and leaves the session: the other
/// connection goes on with the next CmdSN.
#[test]
fn accepts_a_logout_of_one_connection_and_the_session_goes_on() {
    let (mut s, ids, now) = session(2, 8);
    s.handle_pdu(
        ids[1],
        now,
        &Disk,
        logout(9, 10, LogoutReason::CLOSE_CONNECTION, 1),
    );
    let out = transmit(&mut s, ids[1]);
    let [Header::LogoutResponse(r)] = out.as_slice() else {
        panic!("{out:?}")
    };
    assert_eq!(r.response, 0);
    let mut closed = Vec::new();
    while let Some((id, ev)) = s.poll_event() {
        if let Event::Closed(e) = ev {
            closed.push((id, e.reason));
        }
    }
    assert_eq!(closed, vec![(ids[1], CloseReason::Logout)]);
    s.remove(ids[1], now, &Disk);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        command(1, 11, false, 0, 1, Bytes::new()),
    );
    assert_eq!(executes(&mut s).len(), 1);
    assert_eq!(s.window().exp_cmd_sn(), 12);
    assert!(s.connection(ids[0]).unwrap().closed().is_none());
}

/// Connection cleanup (§11.14.3): a Logout on connection 0 naming CID 1 closes connection 1.
#[test]
fn accepts_a_logout_naming_another_connection_and_closes_that_one() {
    let (mut s, ids, now) = session(3, 8);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        logout(9, 10, LogoutReason::CLOSE_CONNECTION, 1),
    );
    let out = transmit(&mut s, ids[0]);
    assert!(
        matches!(out.as_slice(), [Header::LogoutResponse(r)] if r.response == 0),
        "{out:?}"
    );
    assert!(s.connection(ids[1]).unwrap().closed().is_some());
    assert!(s.connection(ids[0]).unwrap().closed().is_none());
    assert!(s.connection(ids[2]).unwrap().closed().is_none());
}

/// A connection that closes with commands held behind a gap: they never run, their CmdSNs
/// count as received, and the window moves on for the others.
#[test]
fn accepts_the_next_command_after_a_connection_with_held_commands_closes() {
    let (mut s, ids, now) = session(3, 8);
    // Connection 1 got CmdSN 11 and 12 ahead of 10 and then died.
    s.handle_pdu(
        ids[1],
        now,
        &Disk,
        command(2, 11, false, 0, 1, Bytes::new()),
    );
    s.handle_pdu(
        ids[1],
        now,
        &Disk,
        command(3, 12, false, 0, 1, Bytes::new()),
    );
    assert_eq!(s.held(ids[1]), 2);
    s.peer_closed(ids[1], now, &Disk);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        command(1, 10, false, 0, 1, Bytes::new()),
    );
    s.handle_pdu(
        ids[2],
        now,
        &Disk,
        command(4, 13, false, 0, 1, Bytes::new()),
    );
    let ran: Vec<u32> = executes(&mut s).iter().map(|(_, x)| x.itt).collect();
    assert_eq!(ran, vec![1, 4], "the dead connection's commands never run");
    assert_eq!(s.window().exp_cmd_sn(), 14);
}

/// Issue 28: while a gap in CmdSN is open (10 ran on connection 0, 11 was lost on its way over
/// connection 1), a command after the gap waits on connection 0, and so does the initiator's
/// tail probe behind it (a NOP-Out asking no answer, RFC 7143 §11.18), but the Data-In and
/// status of 10, already running, still go out on connection 0. Once 11 comes, 12 runs; the
/// probe takes no CmdSN, and nothing answers it.
#[test]
fn sends_the_data_of_an_admitted_command_while_a_later_one_waits_behind_a_gap() {
    let (mut s, ids, now) = session(2, 8);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        command(1, 10, false, 0, 1, Bytes::new()),
    );
    let ran: Vec<u32> = executes(&mut s).iter().map(|(_, x)| x.itt).collect();
    assert_eq!(ran, vec![1]);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        command(3, 12, false, 8, 1, Bytes::new()),
    );
    let probe = NopOut {
        immediate: true,
        lun: 0,
        itt: RESERVED_TAG,
        ttt: RESERVED_TAG,
        cmd_sn: 13,
        exp_stat_sn: 0,
    };
    s.handle_pdu(ids[0], now, &Disk, Pdu::new(probe, Bytes::new()));
    assert_eq!(s.held(ids[0]), 2, "12 and the probe behind it wait");
    assert!(s.complete(ids[0], 1, Response::good(Bytes::from(vec![0; 512]))));
    let out = transmit(&mut s, ids[0]);
    assert!(
        matches!(out.last(), Some(Header::DataIn(d)) if d.itt == 1 && d.status_present),
        "10's data waits for the gap: {out:?}"
    );
    s.handle_pdu(
        ids[1],
        now,
        &Disk,
        command(2, 11, false, 16, 1, Bytes::new()),
    );
    let ran: Vec<(ConnId, u32)> = executes(&mut s).iter().map(|(c, x)| (*c, x.itt)).collect();
    assert_eq!(ran, vec![(ids[1], 2), (ids[0], 3)]);
    assert_eq!(s.held(ids[0]), 0);
    assert_eq!(s.window().exp_cmd_sn(), 13, "the probe took no CmdSN");
    assert!(
        transmit(&mut s, ids[0]).is_empty(),
        "the probe was answered"
    );
}

/// §11.5.1: a LOGICAL UNIT RESET on one connection aborts the LU's tasks on the others: the
/// aborted task's status never goes out.
#[test]
fn lun_reset_on_one_connection_aborts_the_tasks_of_the_others() {
    let (mut s, ids, now) = session(2, 8);
    s.handle_pdu(
        ids[1],
        now,
        &Disk,
        command(2, 10, false, 0, 1, Bytes::new()),
    );
    assert_eq!(executes(&mut s).len(), 1);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        tmf(5, 11, TmfFunction::LOGICAL_UNIT_RESET),
    );
    let out = transmit(&mut s, ids[0]);
    assert!(
        matches!(out.as_slice(), [Header::TaskMgmtResponse(r)] if r.response == TmfResponse::FUNCTION_COMPLETE),
        "{out:?}"
    );
    s.complete(ids[1], 2, Response::good(Bytes::from(vec![0; 512])));
    assert!(
        transmit(&mut s, ids[1]).is_empty(),
        "an aborted task's status went out"
    );
    assert_eq!(s.window().max_cmd_sn(), 11 + 7, "its slot is free again");
}

/// MaxConnections=1 (the Linux initiator, libiscsi): the session is its one connection, as
/// before: nothing is held, a CmdSN ahead of ExpCmdSN runs at once.
#[test]
fn accepts_a_single_connection_session_unchanged() {
    let (mut s, ids, now) = session(1, 8);
    s.handle_pdu(
        ids[0],
        now,
        &Disk,
        command(1, 12, false, 0, 1, Bytes::new()),
    );
    assert_eq!(executes(&mut s).len(), 1);
    assert_eq!(s.held(ids[0]), 0);
    assert_eq!(s.window().exp_cmd_sn(), 13);
    let p = params(1);
    assert_eq!(
        s.add_connection(target_config(&p, 1, 10, 1, 8), now, &Disk),
        Err(AddError::TooManyConnections { max: 1 })
    );
}
