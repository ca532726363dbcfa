#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Connection recovery without a session failure on the target (ErrorRecoveryLevel 2, RFC 7143
//! §7.2, §11.5.1 TASK REASSIGN, §11.16 SNACK; issue 28), driven the way an initiator that
//! recovers connections drives it.
//!
//! The seeded simulation sends reads and writes over 2–4 connections and cuts connections at
//! random points: PDUs in flight both ways are lost (a command not yet received, Data-Out after
//! an R2T, Data-In half way, a status). The target learns of the cut from the socket or from a
//! login reinstating the CID. The initiator then reassigns every task of the cut connection to
//! a live one (TASK REASSIGN with ExpDataSN 0, or the Data-In it has, in order), answers the
//! recovery R2Ts, and retries a command the target says does not exist with its CmdSN. It
//! checks that every command completes exactly once with the right data, that no command runs
//! twice (no write applied twice), that a task's PDUs come on the connection it is allegiant
//! to, that resent Data-In starts at the ExpDataSN asked for, StatSN runs in sequence per
//! connection, and that at the end the window is whole and nothing is left in the session. A
//! failure names its seed: `ERL2_SIM_SEED=<n> cargo test -p iscsi-proto --test
//! target_erl2_sim`.
//!
//! The fixed tests take one rule each, including the attacker's: a TASK REASSIGN naming a task
//! of a live connection, or of another session, is refused; at ErrorRecoveryLevel 0 nothing
//! changes (SNACK is a protocol error, TASK REASSIGN not supported).

#[allow(dead_code)]
mod common;

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{
    answer, check_good, data_out, executes, pattern_bytes, pick, random_first_sn, random_params,
    run_seeds, scsi_command, target_config, target_session, Disk, BLOCK,
};
use ipsan_wan::rng::Rng;
use iscsi_proto::engine::target::session::{ConnId, Session};
use iscsi_proto::engine::target::{Connection, Event, Execute, Response};
use iscsi_proto::params::SessionParams;
use iscsi_proto::seq::{sn_le, sn_lt};
use iscsi_wire::header::{
    LogoutReason, LogoutRequest, NopOut, RejectReason, SnackRequest, TaskMgmtRequest, TmfFunction,
    TmfResponse,
};
use iscsi_wire::{Header, Pdu, RESERVED_TAG};

/// Sets a Data-Out's ExpStatSN: what the initiator has received on its connection.
fn acknowledge(p: &mut Pdu, exp_stat_sn: u32) {
    if let Header::DataOut(d) = &mut p.header {
        d.exp_stat_sn = exp_stat_sn;
    }
}

fn reassign(itt: u32, rtt: u32, cmd_sn: u32, exp_stat_sn: u32, exp_data_sn: u32) -> Pdu {
    Pdu::new(
        TaskMgmtRequest {
            immediate: true,
            function: TmfFunction::TASK_REASSIGN,
            lun: 0,
            itt,
            referenced_task_tag: rtt,
            cmd_sn,
            exp_stat_sn,
            ref_cmd_sn: 0,
            exp_data_sn,
        },
        Bytes::new(),
    )
}

fn snack(kind: u8, itt: u32, beg: u32, run: u32, exp_stat_sn: u32) -> Pdu {
    Pdu::new(
        SnackRequest {
            snack_type: kind,
            lun: 0,
            itt,
            ttt: RESERVED_TAG,
            exp_stat_sn,
            beg_run: beg,
            run_length: run,
        },
        Bytes::new(),
    )
}

/// StatSN of a target PDU that carries status.
fn stat_sn(h: &Header) -> Option<u32> {
    match h {
        Header::ScsiResponse(r) => Some(r.stat_sn),
        Header::DataIn(d) if d.status_present => Some(d.stat_sn),
        Header::TaskMgmtResponse(r) => Some(r.stat_sn),
        Header::LogoutResponse(r) => Some(r.stat_sn),
        Header::Reject(r) => Some(r.stat_sn),
        Header::NopIn(n) if n.itt != RESERVED_TAG => Some(n.stat_sn),
        _ => None,
    }
}

fn max_cmd_sn(h: &Header) -> Option<u32> {
    match h {
        Header::ScsiResponse(r) => Some(r.max_cmd_sn),
        Header::DataIn(d) => Some(d.max_cmd_sn),
        Header::R2t(r) => Some(r.max_cmd_sn),
        Header::TaskMgmtResponse(r) => Some(r.max_cmd_sn),
        Header::NopIn(n) => Some(n.max_cmd_sn),
        _ => None,
    }
}

fn params(max_connections: u32, erl: u32) -> SessionParams {
    SessionParams {
        max_connections,
        initial_r2t: false,
        immediate_data: true,
        first_burst_length: 4096,
        max_burst_length: 8192,
        initiator_max_recv_data_segment_length: 1024,
        target_max_recv_data_segment_length: 1024,
        max_outstanding_r2t: 1,
        error_recovery_level: erl,
        default_time2wait: 2,
        default_time2retain: 20,
        ..SessionParams::default()
    }
}

/// A session of `n` connections (CIDs 0..n), CmdSN 10, StatSN 100 on each, window 16.
fn session(n: u16, erl: u32) -> (Session, Vec<ConnId>, Instant) {
    let now = Instant::now();
    let p = params(u32::from(n).max(2), erl);
    let (mut s, first) = Session::new(target_config(&p, 0, 10, 100, 16), now);
    let mut ids = vec![first];
    for cid in 1..n {
        ids.push(
            s.add_connection(target_config(&p, cid, 10, 100, 16), now, &Disk)
                .unwrap()
                .id,
        );
    }
    (s, ids, now)
}

fn transmit(s: &mut Session, id: ConnId) -> Vec<Pdu> {
    let mut v = Vec::new();
    while let Some(p) = s.poll_transmit(id) {
        v.push(p);
    }
    v
}

fn read_pdu(itt: u32, cmd_sn: u32, lba: u64, blocks: u32, exp_stat_sn: u32) -> Pdu {
    let mut c = scsi_command(itt, cmd_sn, false, lba, blocks);
    c.exp_stat_sn = exp_stat_sn;
    Pdu::new(c, Bytes::new())
}

fn tmf_response(p: &[Pdu]) -> Vec<TmfResponse> {
    p.iter()
        .filter_map(|p| match &p.header {
            Header::TaskMgmtResponse(r) => Some(r.response),
            _ => None,
        })
        .collect()
}

struct Cmd {
    /// The connection it is allegiant to, as the initiator last asked.
    conn: ConnId,
    cmd_sn: u32,
    write: bool,
    lba: u64,
    blocks: u32,
    completions: u32,
    executions: u32,
    data_in: BytesMut,
    /// Data-In PDUs received in order since the last (re)assignment.
    din: u32,
    /// Reassigned since it went out (and how much Data-In it kept then).
    reassigned: Option<u32>,
}

/// What the workloads went through, summed over seeds: each path must be taken.
#[derive(Default, Debug)]
struct Paths {
    cuts: u32,
    /// TASK REASSIGN answered Function complete / Task does not exist.
    adopted: u32,
    retried: u32,
    /// A reassigned write asked for its data again (recovery R2T).
    recovery_r2ts: u32,
    /// A reassigned read's Data-In resent from a DataSN above 0 (ExpDataSN kept).
    resent_from_exp_data_sn: u32,
    /// A reassigned task's status came on the new connection.
    completed_after_reassign: u32,
}

/// One connection as the initiator sees it.
struct Link {
    id: ConnId,
    cid: u16,
    live: bool,
    /// Initiator to target, in order (TCP).
    wire: VecDeque<Pdu>,
    next_stat_sn: u32,
}

struct Sim {
    rng: Rng,
    p: SessionParams,
    s: Session,
    links: Vec<Link>,
    cmds: HashMap<u32, Cmd>,
    /// TASK REASSIGN tags in flight: tag → the command's ITT.
    reassigns: HashMap<u32, u32>,
    next_tag: u32,
    settled: usize,
    max_seen: u32,
    now: Instant,
    ping_out: bool,
    paths: Paths,
}

impl Sim {
    /// Queues a command's PDUs (command, immediate and unsolicited data) on link `c`.
    fn send_command(&mut self, c: usize, itt: u32) {
        let x = &self.cmds[&itt];
        let (write, lba, blocks, sn) = (x.write, x.lba, x.blocks, x.cmd_sn);
        let p = &self.p;
        let len = (u64::from(blocks) * BLOCK) as usize;
        let start = lba * BLOCK;
        let seg = p.target_max_recv_data_segment_length as usize;
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
        let link = &mut self.links[c];
        let mut cmd = scsi_command(itt, sn, write, lba, blocks);
        cmd.final_ = unsolicited == imm;
        cmd.exp_stat_sn = link.next_stat_sn;
        link.wire
            .push_back(Pdu::new(cmd, pattern_bytes(start, imm)));
        let mut off = imm;
        let mut dsn = 0;
        while off < unsolicited {
            let l = seg.min(unsolicited - off);
            let mut d = data_out(
                itt,
                RESERVED_TAG,
                dsn,
                off as u32,
                off + l == unsolicited,
                pattern_bytes(start + off as u64, l),
            );
            acknowledge(&mut d, link.next_stat_sn);
            link.wire.push_back(d);
            off += l;
            dsn += 1;
        }
    }

    fn live(&self) -> Vec<usize> {
        (0..self.links.len())
            .filter(|&i| self.links[i].live)
            .collect()
    }

    /// Cuts link `c`: what is on its wires is lost. The target learns it from the socket, or
    /// (`reinstate`) from a login with the same CID. A new connection replaces it, and every
    /// task allegiant to it is reassigned to a live connection.
    fn cut(&mut self, c: usize, reinstate: bool) -> Result<(), String> {
        let old = self.links[c].id;
        let cid = self.links[c].cid;
        let stat = self.rng.next_u64() as u32;
        let new_cid = if reinstate { cid } else { cid.wrapping_add(16) };
        if !reinstate {
            self.s.peer_closed(old, self.now, &Disk);
        }
        let a = self
            .s
            .add_connection(target_config(&self.p, new_cid, 0, stat, 1), self.now, &Disk)
            .map_err(|e| format!("re-login: {e}"))?;
        if reinstate && a.reinstated != Some(old) {
            return Err(format!("CID {cid} did not reinstate {old:?}: {a:?}"));
        }
        // The driver drains the old connection's PDUs into the dead socket, and removes it.
        while self.s.poll_transmit(old).is_some() {}
        self.s.remove(old, self.now, &Disk);
        self.links[c] = Link {
            id: a.id,
            cid: new_cid,
            live: true,
            wire: VecDeque::new(),
            next_stat_sn: stat,
        };
        self.ping_out = false;
        let orphans: Vec<u32> = self
            .cmds
            .iter()
            .filter(|(_, x)| x.conn == old && x.completions == 0)
            .map(|(i, _)| *i)
            .collect();
        let live = self.live();
        for itt in orphans {
            let to = live[self.rng.below(live.len() as u64) as usize];
            let keep = self.rng.chance(0.5);
            let x = self.cmds.get_mut(&itt).ok_or("no command")?;
            if !keep {
                x.data_in.clear();
                x.din = 0;
            }
            x.reassigned = Some(x.din);
            x.conn = self.links[to].id;
            let tag = self.next_tag;
            self.next_tag += 1;
            self.reassigns.insert(tag, itt);
            let link = &mut self.links[to];
            let next_sn = self.max_seen; // immediate: any CmdSN in the window
            link.wire
                .push_back(reassign(tag, itt, next_sn, link.next_stat_sn, x.din));
        }
        Ok(())
    }

    /// The initiator reads what the target sent on link `c` (up to `budget` PDUs).
    fn receive(&mut self, c: usize, budget: u32) -> Result<bool, String> {
        let mut progressed = false;
        for _ in 0..budget {
            let Some(pdu) = self.s.poll_transmit(self.links[c].id) else {
                break;
            };
            progressed = true;
            let h = &pdu.header;
            let link = &mut self.links[c];
            if let Some(st) = stat_sn(h) {
                if st != link.next_stat_sn {
                    return Err(format!(
                        "link {c}: StatSN {st}, expected {} ({h:?})",
                        link.next_stat_sn
                    ));
                }
                link.next_stat_sn = st.wrapping_add(1);
            }
            if let Some(m) = max_cmd_sn(h) {
                if sn_lt(self.max_seen, m) {
                    self.max_seen = m;
                }
            }
            let itt = h.itt();
            let id = link.id;
            match h {
                Header::TaskMgmtResponse(r) => {
                    let cmd_itt = self
                        .reassigns
                        .remove(&itt)
                        .ok_or_else(|| format!("TMF response for unknown tag {itt:#x}"))?;
                    let x = self.cmds.get_mut(&cmd_itt).ok_or("no command")?;
                    match r.response {
                        TmfResponse::FUNCTION_COMPLETE => self.paths.adopted += 1,
                        TmfResponse::TASK_DOES_NOT_EXIST => {
                            // Never received (lost on the wire, or held behind a gap on the
                            // connection that failed): retry it with its CmdSN (§6.2.1).
                            if x.executions > 0 {
                                return Err(format!(
                                    "ITT {cmd_itt:#x} ran, yet its reassignment found no task"
                                ));
                            }
                            x.data_in.clear();
                            x.din = 0;
                            x.reassigned = None;
                            self.paths.retried += 1;
                            self.send_command(c, cmd_itt);
                        }
                        other => return Err(format!("TASK REASSIGN of {cmd_itt:#x}: {other:?}")),
                    }
                    continue;
                }
                Header::NopIn(_) => {
                    self.ping_out = false;
                    continue;
                }
                _ => {}
            }
            let x = self
                .cmds
                .get_mut(&itt)
                .ok_or_else(|| format!("{h:?} for unknown ITT {itt:#x}"))?;
            if x.conn != id {
                return Err(format!(
                    "ITT {itt:#x} allegiant to {:?}, answered on {id:?}: {h:?}",
                    x.conn
                ));
            }
            match h {
                Header::R2t(r) => {
                    if x.reassigned.is_some() {
                        self.paths.recovery_r2ts += 1;
                    }
                    let start = x.lba * BLOCK + u64::from(r.buffer_offset);
                    let seg = self.p.target_max_recv_data_segment_length;
                    let mut off = 0u32;
                    let mut dsn = 0;
                    while off < r.desired_data_transfer_length {
                        let l = seg.min(r.desired_data_transfer_length - off);
                        let mut d = data_out(
                            itt,
                            r.ttt,
                            dsn,
                            r.buffer_offset + off,
                            off + l == r.desired_data_transfer_length,
                            pattern_bytes(start + u64::from(off), l as usize),
                        );
                        acknowledge(&mut d, link.next_stat_sn);
                        link.wire.push_back(d);
                        off += l;
                        dsn += 1;
                    }
                }
                Header::DataIn(d) => {
                    if d.data_sn != x.din {
                        return Err(format!(
                            "ITT {itt:#x}: Data-In DataSN {}, expected {}",
                            d.data_sn, x.din
                        ));
                    }
                    if x.reassigned
                        .is_some_and(|kept| kept > 0 && kept == d.data_sn)
                    {
                        self.paths.resent_from_exp_data_sn += 1;
                    }
                    x.din += 1;
                    x.data_in.extend_from_slice(&pdu.data);
                    if d.status_present {
                        x.completions += 1;
                        self.settled += 1;
                        self.paths.completed_after_reassign += u32::from(x.reassigned.is_some());
                        check_good(itt, d.status, Some((x.lba, x.blocks)), &x.data_in)?;
                    }
                }
                Header::ScsiResponse(r) => {
                    x.completions += 1;
                    self.settled += 1;
                    self.paths.completed_after_reassign += u32::from(x.reassigned.is_some());
                    let read = (!x.write).then_some((x.lba, x.blocks));
                    check_good(itt, r.status, read, &x.data_in)?;
                }
                other => return Err(format!("unexpected {other:?}")),
            }
        }
        Ok(progressed)
    }
}

/// One seeded workload; `Err` says what went wrong.
#[allow(clippy::too_many_lines)]
fn run(seed: u64, paths: &mut Paths) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let n = 2 + rng.below(3) as usize;
    let depth = pick(&mut rng, &[2, 4, 8, 32]);
    let mut p = params(n as u32 + 1, 2);
    random_params(&mut rng, &mut p, &[2048, 4096, 8192]);
    let first_sn = random_first_sn(&mut rng);
    let now = Instant::now();
    let (s, conns) = target_session(&mut rng, &p, n, first_sn, depth, now)?;
    let links: Vec<Link> = conns
        .into_iter()
        .enumerate()
        .map(|(cid, (id, stat))| Link {
            id,
            cid: cid as u16,
            live: true,
            wire: VecDeque::new(),
            next_stat_sn: stat,
        })
        .collect();
    let mut sim = Sim {
        rng,
        p,
        s,
        links,
        cmds: HashMap::new(),
        reassigns: HashMap::new(),
        next_tag: 0x4000_0000,
        settled: 0,
        max_seen: first_sn.wrapping_add(depth - 1),
        now,
        ping_out: false,
        paths: Paths::default(),
    };
    let total = 120 + sim.rng.below(80) as usize;
    let mut running: Vec<(ConnId, Execute)> = Vec::new();
    let mut next_sn = first_sn;
    let mut cuts = 0;
    let max_cuts = 1 + sim.rng.below(6);
    let mut pings = 0u32;
    let mut idle_steps = 0u32;
    for step in 0..2_000_000u32 {
        if sim.settled == total {
            break;
        }
        let mut progressed = false;
        let c = sim.rng.below(n as u64) as usize;
        match sim.rng.below(24) {
            // The initiator sends a command within the window it saw, on any connection.
            0..=5 if sim.cmds.len() < total && sn_le(next_sn, sim.max_seen) => {
                let itt = sim.cmds.len() as u32 + 1;
                let write = sim.rng.chance(0.5);
                let blocks = 1 + sim.rng.below(16) as u32;
                let lba = sim.rng.below(1 << 12);
                sim.cmds.insert(
                    itt,
                    Cmd {
                        conn: sim.links[c].id,
                        cmd_sn: next_sn,
                        write,
                        lba,
                        blocks,
                        completions: 0,
                        executions: 0,
                        data_in: BytesMut::new(),
                        din: 0,
                        reassigned: None,
                    },
                );
                sim.send_command(c, itt);
                next_sn = next_sn.wrapping_add(1);
                progressed = true;
            }
            // The target reads one PDU from a connection.
            6..=11 => {
                if let Some(pdu) = sim.links[c].wire.pop_front() {
                    let id = sim.links[c].id;
                    sim.s.handle_pdu(id, now, &Disk, pdu);
                    progressed = true;
                }
            }
            // A running command completes, answered on the connection it was handed out on
            // (which may have failed since: the session keeps or forwards the answer).
            12..=14 if !running.is_empty() => {
                let k = sim.rng.below(running.len() as u64) as usize;
                let (id, x) = running.swap_remove(k);
                let resp = answer(&x)?;
                if !sim.s.complete(id, x.itt, resp) {
                    return Err(format!("ITT {:#x}: completion refused", x.itt));
                }
                progressed = true;
            }
            // A connection is cut, whatever is in flight on it.
            15 if cuts < max_cuts => {
                let reinstate = sim.rng.chance(0.5);
                sim.cut(c, reinstate)?;
                cuts += 1;
                sim.paths.cuts += 1;
                progressed = true;
            }
            // The window looks closed: an immediate NOP-Out asks for it.
            16 if !sim.ping_out && !sn_le(next_sn, sim.max_seen) => {
                pings += 1;
                sim.ping_out = true;
                let link = &mut sim.links[c];
                link.wire.push_back(Pdu::new(
                    NopOut {
                        immediate: true,
                        lun: 0,
                        itt: 0x8000_0000 + pings,
                        ttt: RESERVED_TAG,
                        cmd_sn: next_sn,
                        exp_stat_sn: link.next_stat_sn,
                    },
                    Bytes::new(),
                ));
                progressed = true;
            }
            // The target sends on a connection; the initiator reads some of it.
            _ => {
                let budget = 1 + sim.rng.below(6) as u32;
                progressed |= sim.receive(c, budget)?;
            }
        }
        while let Some((id, ev)) = sim.s.poll_event() {
            match ev {
                Event::Execute(x) => {
                    let cmd = sim
                        .cmds
                        .get_mut(&x.itt)
                        .ok_or_else(|| format!("Execute of unknown ITT {:#x}", x.itt))?;
                    cmd.executions += 1;
                    if cmd.executions > 1 {
                        return Err(format!(
                            "ITT {:#x} ({}) ran twice",
                            x.itt,
                            if cmd.write { "a write" } else { "a read" }
                        ));
                    }
                    running.push((id, x));
                }
                // The cut connections' ends; a live one must not close.
                Event::Closed(e) => {
                    if sim.links.iter().any(|l| l.id == id) {
                        return Err(format!("live connection {id:?} closed: {e}"));
                    }
                }
                other => return Err(format!("{id:?}: {other:?}")),
            }
        }
        idle_steps = if progressed { 0 } else { idle_steps + 1 };
        if idle_steps > 10_000 {
            return Err(format!(
                "stuck at step {step}: {}/{total} settled, {} running, {} orphans, held {:?}, window ({}, {}), next CmdSN {next_sn}, MaxCmdSN seen {}",
                sim.settled,
                running.len(),
                sim.s.orphans(),
                sim.links.iter().map(|l| sim.s.held(l.id)).collect::<Vec<_>>(),
                sim.s.window().exp_cmd_sn(),
                sim.s.window().max_cmd_sn(),
                sim.max_seen,
            ));
        }
    }
    if sim.settled != total {
        return Err(format!("{} of {total} commands settled", sim.settled));
    }
    for (itt, x) in &sim.cmds {
        if x.completions != 1 || x.executions != 1 {
            return Err(format!(
                "ITT {itt:#x} completed {} times, ran {} times",
                x.completions, x.executions
            ));
        }
    }
    // What is left are completed tasks of cut connections whose status the initiator had
    // received but not yet acknowledged: they go after Time2Wait + Time2Retain.
    sim.s.handle_timeout(now + Duration::from_secs(23), &Disk);
    if sim.s.orphans() != 0 {
        return Err(format!("{} orphans left", sim.s.orphans()));
    }
    let w = sim.s.window();
    if w.exp_cmd_sn() != next_sn || w.max_cmd_sn() != next_sn.wrapping_add(depth - 1) {
        return Err(format!(
            "window ({}, {}) at the end, expected ({next_sn}, {})",
            w.exp_cmd_sn(),
            w.max_cmd_sn(),
            next_sn.wrapping_add(depth - 1)
        ));
    }
    if sim.links.iter().any(|l| sim.s.held(l.id) > 0) {
        return Err("PDUs still held at the end".into());
    }
    let p = &sim.paths;
    paths.cuts += p.cuts;
    paths.adopted += p.adopted;
    paths.retried += p.retried;
    paths.recovery_r2ts += p.recovery_r2ts;
    paths.resent_from_exp_data_sn += p.resent_from_exp_data_sn;
    paths.completed_after_reassign += p.completed_after_reassign;
    Ok(())
}

#[test]
fn accepts_connections_cut_anywhere_and_completes_every_command_once_by_task_reassign() {
    let mut paths = Paths::default();
    if let Some(n) = run_seeds("ERL2_SIM_SEED", 200, |seed| run(seed, &mut paths)) {
        assert!(n > 0);
        eprintln!("{n} workloads: {paths:?}");
        let p = &paths;
        assert!(
            p.cuts > 0
                && p.adopted > 0
                && p.retried > 0
                && p.recovery_r2ts > 0
                && p.resent_from_exp_data_sn > 0
                && p.completed_after_reassign > 0,
            "a recovery path was never taken: {p:?}"
        );
    }
}

/// A READ completes on connection 0, whose last Data-In (with the status) is lost with it. A
/// TASK REASSIGN on connection 1 with ExpDataSN 1 gets Function complete, then Data-In from
/// DataSN 1 and the status with connection 1's StatSN; the command ran once.
#[test]
fn accepts_task_reassign_of_a_completed_read_and_resends_from_exp_data_sn() {
    let (mut s, ids, now) = session(2, 2);
    s.handle_pdu(ids[0], now, &Disk, read_pdu(7, 10, 0, 4, 100));
    let ran = executes(&mut s);
    assert_eq!(ran.len(), 1);
    assert!(s.complete(ids[0], 7, Response::good(pattern_bytes(0, 2048))));
    // The first of its two Data-In reaches the initiator; the second, with the status, is lost
    // with the connection.
    let sent = transmit(&mut s, ids[0]);
    assert_eq!(sent.len(), 2048 / 1024, "MaxRecvDataSegmentLength 1024");
    s.peer_closed(ids[0], now, &Disk);
    s.remove(ids[0], now, &Disk);
    assert_eq!(s.orphans(), 1);
    s.handle_pdu(ids[1], now, &Disk, reassign(50, 7, 11, 100, 1));
    let out = transmit(&mut s, ids[1]);
    assert_eq!(tmf_response(&out), vec![TmfResponse::FUNCTION_COMPLETE]);
    assert!(
        matches!(out[0].header, Header::TaskMgmtResponse(_)),
        "the response first"
    );
    let data: Vec<(u32, bool, u32)> = out[1..]
        .iter()
        .map(|p| match &p.header {
            Header::DataIn(d) => (d.data_sn, d.status_present, d.stat_sn),
            h => panic!("{h:?}"),
        })
        .collect();
    assert_eq!(
        data,
        vec![(1, true, 101)],
        "DataSN 1 on, status with StatSN 101"
    );
    assert_eq!(&out[1].data[..], &pattern_bytes(1024, 1024)[..]);
    assert!(executes(&mut s).is_empty(), "it did not run again");
    assert_eq!(s.orphans(), 0);
}

/// A WRITE's R2T goes out on connection 0, which fails before the data arrives. Reassigned to
/// connection 1, the target asks again for what it never got (a recovery R2T) and runs the
/// write once, with the right data.
#[test]
fn accepts_task_reassign_of_a_write_collecting_data_with_recovery_r2ts() {
    let (mut s, ids, now) = session(2, 2);
    let cmd = scsi_command(9, 10, true, 8, 8);
    s.handle_pdu(ids[0], now, &Disk, Pdu::new(cmd, Bytes::new()));
    let first = transmit(&mut s, ids[0]);
    assert!(matches!(first[0].header, Header::R2t(_)), "{first:?}");
    s.peer_closed(ids[0], now, &Disk);
    s.remove(ids[0], now, &Disk);
    s.handle_pdu(ids[1], now, &Disk, reassign(51, 9, 11, 100, 0));
    let out = transmit(&mut s, ids[1]);
    assert_eq!(tmf_response(&out), vec![TmfResponse::FUNCTION_COMPLETE]);
    let r2ts: Vec<(u32, u32, u32)> = out
        .iter()
        .filter_map(|p| match &p.header {
            Header::R2t(r) => Some((r.ttt, r.buffer_offset, r.desired_data_transfer_length)),
            _ => None,
        })
        .collect();
    assert_eq!(r2ts.len(), 1, "{out:?}");
    let (ttt, off, len) = r2ts[0];
    assert_eq!(off, 0);
    assert!(len > 0);
    let mut at = 0;
    let mut total = 0u32;
    let mut r2t = Some((ttt, off, len));
    while let Some((ttt, off, len)) = r2t.take() {
        let mut dsn = 0;
        let mut o = 0;
        while o < len {
            let l = 1024.min(len - o);
            s.handle_pdu(
                ids[1],
                now,
                &Disk,
                data_out(
                    9,
                    ttt,
                    dsn,
                    off + o,
                    o + l == len,
                    pattern_bytes(8 * BLOCK + u64::from(off + o), l as usize),
                ),
            );
            o += l;
            dsn += 1;
        }
        total += len;
        at += 1;
        r2t = transmit(&mut s, ids[1])
            .iter()
            .find_map(|p| match &p.header {
                Header::R2t(r) => Some((r.ttt, r.buffer_offset, r.desired_data_transfer_length)),
                _ => None,
            });
        assert!(at < 10);
    }
    assert_eq!(total, 8 * 512);
    let ran = executes(&mut s);
    assert_eq!(ran.len(), 1);
    assert_eq!(ran[0].0, ids[1], "it runs where it is allegiant now");
    assert_eq!(ran[0].1.data_out, pattern_bytes(8 * BLOCK, 8 * 512));
    assert!(s.complete(ids[1], 9, Response::good(Bytes::new())));
    let out = transmit(&mut s, ids[1]);
    assert!(matches!(out.as_slice(), [p] if matches!(p.header, Header::ScsiResponse(_))));
}

/// A READ is running when connection 0 fails; the driver answers it on connection 0 after the
/// task was reassigned to connection 1: the status goes out on connection 1.
#[test]
fn accepts_task_reassign_of_a_running_task_and_answers_on_the_new_connection() {
    let (mut s, ids, now) = session(2, 2);
    s.handle_pdu(ids[0], now, &Disk, read_pdu(3, 10, 0, 1, 100));
    assert_eq!(executes(&mut s).len(), 1);
    s.peer_closed(ids[0], now, &Disk);
    s.remove(ids[0], now, &Disk);
    s.handle_pdu(ids[1], now, &Disk, reassign(52, 3, 11, 100, 0));
    let out = transmit(&mut s, ids[1]);
    assert_eq!(tmf_response(&out), vec![TmfResponse::FUNCTION_COMPLETE]);
    assert!(s.complete(ids[0], 3, Response::good(pattern_bytes(0, 512))));
    let out = transmit(&mut s, ids[1]);
    assert!(
        matches!(out.as_slice(), [p] if matches!(&p.header, Header::DataIn(d) if d.status_present && d.itt == 3)),
        "{out:?}"
    );
    assert_eq!(
        s.window().max_cmd_sn(),
        11 + 15,
        "its window slot is free again"
    );
}

/// The attacker's view: a TASK REASSIGN naming a task allegiant to a live connection is
/// refused (Task still allegiant, RFC 7143 §11.6.1), and the task stays where it is; one naming
/// a task of another session finds nothing (Task does not exist).
#[test]
fn rejects_task_reassign_of_a_live_connections_task_or_another_sessions() {
    let (mut s, ids, now) = session(2, 2);
    s.handle_pdu(ids[0], now, &Disk, read_pdu(3, 10, 0, 1, 100));
    assert_eq!(executes(&mut s).len(), 1);
    s.handle_pdu(ids[1], now, &Disk, reassign(53, 3, 11, 100, 0));
    assert_eq!(
        tmf_response(&transmit(&mut s, ids[1])),
        vec![TmfResponse::TASK_STILL_ALLEGIANT]
    );
    // Its own connection: still allegiant too.
    s.handle_pdu(ids[0], now, &Disk, reassign(54, 3, 11, 100, 0));
    assert_eq!(
        tmf_response(&transmit(&mut s, ids[0])),
        vec![TmfResponse::TASK_STILL_ALLEGIANT]
    );
    assert!(s.complete(ids[0], 3, Response::good(pattern_bytes(0, 512))));
    let out = transmit(&mut s, ids[0]);
    assert!(
        out.iter().any(|p| p.header.itt() == 3),
        "still answered on 0"
    );
    assert!(transmit(&mut s, ids[1]).is_empty());

    // Another session's task, orphaned there, is not this session's to take.
    let (mut victim, vids, _) = session(2, 2);
    victim.handle_pdu(vids[0], now, &Disk, read_pdu(8, 10, 0, 1, 100));
    assert_eq!(executes(&mut victim).len(), 1);
    victim.peer_closed(vids[0], now, &Disk);
    victim.remove(vids[0], now, &Disk);
    assert_eq!(victim.orphans(), 1);
    s.handle_pdu(ids[1], now, &Disk, reassign(55, 8, 11, 100, 0));
    assert_eq!(
        tmf_response(&transmit(&mut s, ids[1])),
        vec![TmfResponse::TASK_DOES_NOT_EXIST]
    );
    assert_eq!(victim.orphans(), 1, "the victim's task is untouched");
}

/// ErrorRecoveryLevel 0 keeps today's behaviour: a failed connection's tasks end with it, TASK
/// REASSIGN is "Task allegiance reassignment not supported" and SNACK a protocol error.
#[test]
fn rejects_task_reassign_and_snack_at_error_recovery_level_0() {
    let (mut s, ids, now) = session(2, 0);
    s.handle_pdu(ids[0], now, &Disk, read_pdu(3, 10, 0, 1, 100));
    assert_eq!(executes(&mut s).len(), 1);
    s.peer_closed(ids[0], now, &Disk);
    s.remove(ids[0], now, &Disk);
    assert_eq!(s.orphans(), 0);
    assert!(!s.complete(ids[0], 3, Response::good(pattern_bytes(0, 512))));
    s.handle_pdu(ids[1], now, &Disk, reassign(56, 3, 11, 100, 0));
    assert_eq!(
        tmf_response(&transmit(&mut s, ids[1])),
        vec![TmfResponse::TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED]
    );
    s.handle_pdu(ids[1], now, &Disk, snack(1, RESERVED_TAG, 100, 0, 100));
    let out = transmit(&mut s, ids[1]);
    assert!(
        matches!(out.as_slice(), [p] if matches!(&p.header, Header::Reject(r) if r.reason == RejectReason::PROTOCOL_ERROR)),
        "{out:?}"
    );
}

/// DefaultTime2Wait + DefaultTime2Retain after the failure (2 + 20 s here) the orphans go: a
/// reassignment then finds nothing, and their window slots are free again.
#[test]
fn drops_orphans_after_time2wait_and_time2retain_and_frees_their_window_slots() {
    let (mut s, ids, now) = session(2, 2);
    s.handle_pdu(ids[0], now, &Disk, read_pdu(3, 10, 0, 1, 100));
    assert_eq!(executes(&mut s).len(), 1);
    let max = s.window().max_cmd_sn();
    s.peer_closed(ids[0], now, &Disk);
    s.remove(ids[0], now, &Disk);
    assert_eq!(s.orphans(), 1);
    let due = s.poll_timeout().unwrap();
    assert_eq!(due, now + Duration::from_secs(22));
    s.handle_timeout(now + Duration::from_secs(21), &Disk);
    assert_eq!(s.orphans(), 1, "not yet");
    s.handle_timeout(due, &Disk);
    assert_eq!(s.orphans(), 0);
    assert!(
        !s.complete(ids[0], 3, Response::good(Bytes::new())),
        "its late answer goes nowhere"
    );
    s.handle_pdu(ids[1], due, &Disk, reassign(57, 3, 11, 100, 0));
    let out = transmit(&mut s, ids[1]);
    assert_eq!(tmf_response(&out), vec![TmfResponse::TASK_DOES_NOT_EXIST]);
    let Header::TaskMgmtResponse(r) = &out[0].header else {
        panic!()
    };
    assert_eq!(r.max_cmd_sn, max.wrapping_add(1), "its slot came back");
}

/// Logout with reason 2 (remove the connection for recovery, §11.14.1) for another connection:
/// "closed successfully" with Time2Wait and Time2Retain, and that connection's running task
/// waits for reassignment instead of ending.
#[test]
fn accepts_logout_for_recovery_and_keeps_the_connections_tasks() {
    let (mut s, ids, now) = session(2, 2);
    s.handle_pdu(ids[0], now, &Disk, read_pdu(3, 10, 0, 1, 100));
    assert_eq!(executes(&mut s).len(), 1);
    let logout = LogoutRequest {
        immediate: true,
        reason: LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY,
        itt: 70,
        cid: 0,
        cmd_sn: 11,
        exp_stat_sn: 100,
    };
    s.handle_pdu(ids[1], now, &Disk, Pdu::new(logout, Bytes::new()));
    let out = transmit(&mut s, ids[1]);
    let [p] = out.as_slice() else {
        panic!("{out:?}")
    };
    let Header::LogoutResponse(r) = &p.header else {
        panic!("{out:?}")
    };
    assert_eq!((r.response, r.time2wait, r.time2retain), (0, 2, 20));
    assert!(s.connection(ids[0]).unwrap().closed().is_some());
    assert_eq!(s.orphans(), 1);
    s.handle_pdu(ids[1], now, &Disk, reassign(58, 3, 11, 100, 0));
    assert_eq!(
        tmf_response(&transmit(&mut s, ids[1])),
        vec![TmfResponse::FUNCTION_COMPLETE]
    );
}

/// The Logout removing a failed connection for recovery is answered at once even when the
/// connection it comes on holds commands behind a CmdSN gap (the gap the failed connection
/// left, which only the TASK REASSIGNs after this Logout repair): held behind them it was
/// never answered and the initiator's recovery stuck (issue 28, `mcs_erl2_sim`).
#[test]
fn accepts_logout_for_recovery_past_commands_held_behind_a_gap() {
    let (mut s, ids, now) = session(2, 2);
    // Connection 1 holds CmdSN 11: 10 went on connection 0 and never arrived.
    s.handle_pdu(ids[1], now, &Disk, read_pdu(2, 11, 0, 1, 100));
    assert!(executes(&mut s).is_empty());
    let logout = LogoutRequest {
        immediate: true,
        reason: LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY,
        itt: 71,
        cid: 0,
        cmd_sn: 12,
        exp_stat_sn: 100,
    };
    s.handle_pdu(ids[1], now, &Disk, Pdu::new(logout, Bytes::new()));
    let out = transmit(&mut s, ids[1]);
    assert!(
        matches!(out.as_slice(), [p] if matches!(&p.header, Header::LogoutResponse(r) if r.response == 0 && r.itt == 71)),
        "answered (closed for recovery) past the held command: {out:?}"
    );
    assert!(s.connection(ids[0]).unwrap().closed().is_some());
    // The retry of 10 then lets 11 run.
    s.handle_pdu(ids[1], now, &Disk, read_pdu(1, 10, 0, 1, 100));
    let ran: Vec<u32> = executes(&mut s).iter().map(|(_, x)| x.itt).collect();
    assert_eq!(ran, vec![1, 2]);
}

/// A login with the failed connection's CID reinstates it (§6.3.4); its tasks go to the new
/// connection by TASK REASSIGN there.
#[test]
fn accepts_task_reassign_to_the_reinstated_connection() {
    let (mut s, ids, now) = session(2, 2);
    s.handle_pdu(ids[0], now, &Disk, read_pdu(3, 10, 0, 1, 100));
    assert_eq!(executes(&mut s).len(), 1);
    assert!(s.complete(ids[0], 3, Response::good(pattern_bytes(0, 512))));
    let p = params(2, 2);
    let a = s
        .add_connection(target_config(&p, 0, 10, 500, 16), now, &Disk)
        .unwrap();
    assert_eq!(a.reinstated, Some(ids[0]));
    s.remove(ids[0], now, &Disk);
    s.handle_pdu(a.id, now, &Disk, reassign(59, 3, 11, 500, 0));
    let out = transmit(&mut s, a.id);
    assert_eq!(tmf_response(&out), vec![TmfResponse::FUNCTION_COMPLETE]);
    assert!(
        matches!(&out[1].header, Header::DataIn(d) if d.status_present && d.stat_sn == 501),
        "{out:?}"
    );
}

/// A command retried after the connection it was held on failed (its CmdSN waited behind a
/// gap there): at ErrorRecoveryLevel 2 the gap is not filled by the failure, so the retry with
/// the same CmdSN runs, also behind a later command on the retry's own connection.
#[test]
fn accepts_a_retried_command_whose_first_copy_was_held_on_a_failed_connection() {
    let (mut s, ids, now) = session(3, 2);
    // Connection 1 holds CmdSN 11 (10 never came); connection 2 holds 12.
    s.handle_pdu(ids[1], now, &Disk, read_pdu(2, 11, 0, 1, 100));
    s.handle_pdu(ids[2], now, &Disk, read_pdu(3, 12, 0, 1, 100));
    s.peer_closed(ids[1], now, &Disk);
    s.remove(ids[1], now, &Disk);
    assert!(executes(&mut s).is_empty());
    // The TASK REASSIGN for ITT 2 finds nothing; the initiator retries 2 with CmdSN 11 on
    // connection 2 (behind 12), and sends 10, lost before, on connection 0.
    s.handle_pdu(ids[2], now, &Disk, reassign(60, 2, 13, 100, 0));
    assert_eq!(
        tmf_response(&transmit(&mut s, ids[2])),
        vec![TmfResponse::TASK_DOES_NOT_EXIST]
    );
    s.handle_pdu(ids[2], now, &Disk, read_pdu(2, 11, 0, 1, 100));
    s.handle_pdu(ids[0], now, &Disk, read_pdu(1, 10, 0, 1, 100));
    let ran: Vec<u32> = executes(&mut s).iter().map(|(_, x)| x.itt).collect();
    assert_eq!(ran, vec![1, 2, 3], "in CmdSN order, each once");
    assert_eq!(s.window().exp_cmd_sn(), 13);
}

/// Status SNACK (§11.16, ErrorRecoveryLevel 1) resends a status with its original StatSN
/// until the initiator acknowledges it with ExpStatSN; Data SNACK resends the named Data-In.
#[test]
fn accepts_status_and_data_snack_until_the_status_is_acknowledged() {
    let now = Instant::now();
    let mut c = Connection::new(target_config(&params(1, 1), 0, 10, 100, 16), now);
    c.handle_pdu(now, &Disk, read_pdu(7, 10, 0, 4, 100));
    assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
    assert!(c.complete(7, Response::good(pattern_bytes(0, 2048))));
    let mut sent = Vec::new();
    while let Some(p) = c.poll_transmit() {
        sent.push(p);
    }
    assert_eq!(sent.len(), 2);
    c.handle_pdu(now, &Disk, snack(1, RESERVED_TAG, 100, 1, 100));
    let again = c.poll_transmit().unwrap();
    assert_eq!(
        again.header, sent[1].header,
        "the same PDU, StatSN 100 again"
    );
    c.handle_pdu(now, &Disk, snack(0, 7, 0, 1, 100));
    let d = c.poll_transmit().unwrap();
    assert_eq!(
        (d.header.clone(), d.data.clone()),
        (sent[0].header.clone(), sent[0].data.clone())
    );
    assert!(c.poll_transmit().is_none());
    // Acknowledged (ExpStatSN 101 on the next command): gone, and a SNACK is refused.
    c.handle_pdu(now, &Disk, read_pdu(8, 11, 0, 1, 101));
    let _ = c.poll_event();
    c.handle_pdu(now, &Disk, snack(1, RESERVED_TAG, 100, 1, 101));
    assert!(
        matches!(c.poll_transmit().map(|p| p.header), Some(Header::Reject(r)) if r.reason == RejectReason::SNACK_REJECT)
    );
}

/// An initiator that never acknowledges cannot make the target keep every status: a
/// connection keeps at most 1024 completed tasks, the oldest go first.
#[test]
fn bounds_the_completed_tasks_kept_for_snack() {
    let now = Instant::now();
    let mut c = Connection::new(target_config(&params(1, 1), 0, 10, 100, 16), now);
    for k in 0..1100u32 {
        c.handle_pdu(now, &Disk, read_pdu(k + 1, 10 + k, 0, 1, 100));
        assert!(matches!(c.poll_event(), Some(Event::Execute(_))));
        assert!(c.complete(k + 1, Response::good(pattern_bytes(0, 512))));
        while c.poll_transmit().is_some() {}
    }
    // StatSN 100 (the first) is gone; 100 + 1099 (the last) is kept.
    c.handle_pdu(now, &Disk, snack(1, RESERVED_TAG, 100, 1, 100));
    assert!(matches!(
        c.poll_transmit().map(|p| p.header),
        Some(Header::Reject(r)) if r.reason == RejectReason::SNACK_REJECT
    ));
    c.handle_pdu(now, &Disk, snack(1, RESERVED_TAG, 100 + 1099, 1, 100));
    assert!(matches!(
        c.poll_transmit().map(|p| p.header),
        Some(Header::DataIn(d)) if d.stat_sn == 100 + 1099
    ));
}
