#![allow(clippy::unwrap_used, clippy::expect_used)]

//! Connection recovery in the initiator's session of several connections (`engine::mcs` at
//! ErrorRecoveryLevel 2, RFC 7143 §7.2, §11.5.1 TASK REASSIGN, §11.14.1 Logout for recovery;
//! issue 28), against the real target engine's session, in memory.
//!
//! The seeded simulation submits reads and writes (immediate, unsolicited and solicited data)
//! to a session of 2–4 connections and cuts connections at random points: whatever is on a
//! cut connection's two FIFOs is lost (commands the target never got, Data-Out after an R2T,
//! Data-In half way, statuses, window updates). The initiator learns of the cut from its
//! socket; the target from its socket at once, or only later from the initiator's Logout for
//! recovery or from a login reinstating the CID. Lost connections log in again after a while,
//! with the same CID (a reinstatement) or a new one, and sometimes every connection is down at
//! once. Nothing but the engine decides what happens to the cut connections' tasks. It checks
//! that every command completes exactly once, successfully, with the right data (every
//! written byte checked at the target, every read byte at the initiator); that no command runs
//! twice at the target; that no connection closes except the cut ones (a PDU for a task on
//! the wrong connection would close it: allegiance); that a command keeps its CmdSN when it is
//! sent again; that no TASK REASSIGN is refused; that the target ends with every CmdSN
//! received, nothing orphaned and nothing held. A failure names its seed:
//! `MCS_ERL2_SIM_SEED=<n> cargo test -p iscsi-proto --test mcs_erl2_sim`.
//!
//! The sealed variant models Seal's per-connection keys (docs/seal.md §3): every login gets a
//! key of its own, write data is "sealed" (XORed) under the key of the connection it goes on
//! and "opened" at the target under the key of the connection the command runs from, read data
//! the other way round. A reassigned write must be made again for its new connection
//! (`Session::reseal_on_reassign`, `Event::Reseal`) and a target collecting it must ask for all
//! of it again (`target::Config::resolicit_reassigned_writes`): bytes sealed for the failed
//! connection never open. A read whose data came sealed under the failed connection's key is
//! sent again as a new command, as the driver does (`MCS_ERL2_SIM_SEALED_SEED=<n>`).

#[allow(dead_code)]
mod common;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use common::{
    cdb16, check_good, initiator_conn, parse16, pattern_bytes, pick, read, run_seeds,
    target_config, Disk, BLOCK,
};
use ipsan_wan::rng::Rng;
use iscsi_proto::engine::initiator::{Command, Data, Reassignment, TaskError};
use iscsi_proto::engine::mcs::{self, Spread};
use iscsi_proto::engine::target::session::{ConnId, Session as TargetSession};
use iscsi_proto::engine::target::{self, Response};
use iscsi_proto::engine::{CloseReason, Side};
use iscsi_proto::params::SessionParams;
use iscsi_proto::seq::sn_le;
use iscsi_wire::header::{
    LogoutReason, LogoutResponse, ScsiResponse, TaskMgmtResponse, TmfFunction, TmfResponse,
};
use iscsi_wire::{Header, Pdu};

/// The sealed variant's "seal": bytes XORed with the connection's key (0 in the plain run).
fn seal(data: &[u8], key: u8) -> Bytes {
    data.iter().map(|b| b ^ key).collect()
}

/// One connection: both engines' ends and the two FIFOs between them.
struct Link {
    cid: u16,
    id: ConnId,
    to_target: VecDeque<Pdu>,
    to_initiator: VecDeque<Pdu>,
    /// Cut: nothing moves on it any more.
    cut: bool,
}

struct Cmd {
    write: bool,
    lba: u64,
    blocks: u32,
    cmd_sn: Option<u32>,
    completions: u32,
    executions: u32,
}

/// Paths the seeds took, summed: each must be taken.
static CUTS: AtomicU64 = AtomicU64::new(0);
static ALL_DOWN: AtomicU64 = AtomicU64::new(0);
static ADOPTED: AtomicU64 = AtomicU64::new(0);
static RETRIED: AtomicU64 = AtomicU64::new(0);
static RECOVERY_LOGOUTS: AtomicU64 = AtomicU64::new(0);
static REINSTATED: AtomicU64 = AtomicU64::new(0);
/// R2Ts for a write after its TASK REASSIGN (recovery R2Ts, numbered on from the target's
/// last R2TSN, which the initiator may not have seen).
static RECOVERY_R2TS: AtomicU64 = AtomicU64::new(0);
/// Data-In for a read after its TASK REASSIGN from a DataSN above 0 (ExpDataSN kept).
static RESENT_FROM_EXP_DATA_SN: AtomicU64 = AtomicU64::new(0);
/// Sealed: writes made again for the connection they moved to.
static RESEALED: AtomicU64 = AtomicU64::new(0);
/// Sealed: reads whose data came sealed for a failed connection, sent again as new commands.
static READS_SENT_AGAIN: AtomicU64 = AtomicU64::new(0);
/// Sealed: commands made for a connection that failed before they left, made again.
static NEVER_SENT_AGAIN: AtomicU64 = AtomicU64::new(0);

/// One seeded workload; `Err` says what went wrong.
#[allow(clippy::too_many_lines)]
fn run(seed: u64, sealed: bool) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    // Sealed: each login's key, by CID at the initiator and by ConnId at the target.
    let mut next_key = 0u8;
    let mut fresh_key = || {
        if sealed {
            next_key += 1;
        }
        next_key
    };
    let mut ini_key: HashMap<u16, u8> = HashMap::new();
    let mut tgt_key: HashMap<ConnId, u8> = HashMap::new();
    let n = 2 + rng.below(3) as u16;
    let depth = pick(&mut rng, &[2, 4, 8, 32]);
    let spread = if rng.chance(0.5) {
        Spread::LeastBytes
    } else {
        Spread::RoundRobin
    };
    let mut p = SessionParams {
        max_connections: u32::from(n) + 8,
        initial_r2t: rng.chance(0.5),
        immediate_data: rng.chance(0.5),
        first_burst_length: pick(&mut rng, &[512, 2048, 4096]),
        max_burst_length: pick(&mut rng, &[2048, 4096, 8192]),
        max_outstanding_r2t: pick(&mut rng, &[1, 2]),
        error_recovery_level: 2,
        default_time2wait: 0,
        default_time2retain: 20,
        ..SessionParams::default()
    };
    let mrdsl = pick(&mut rng, &[512, 1024, 4096]);
    p.initiator_max_recv_data_segment_length = mrdsl;
    p.target_max_recv_data_segment_length = mrdsl;
    let first_sn = if rng.chance(0.3) {
        u32::MAX - rng.below(40) as u32
    } else {
        rng.next_u64() as u32
    };
    let now = Instant::now();

    let stat = rng.next_u64() as u32;
    let tcfg = |cid: u16, cmd_sn: u32, stat_sn: u32| {
        let mut c = target_config(&p, cid, cmd_sn, stat_sn, depth);
        c.resolicit_reassigned_writes = sealed;
        c
    };
    let (mut tgt, id0) = TargetSession::new(tcfg(0, first_sn, stat), now);
    let k0 = fresh_key();
    ini_key.insert(0, k0);
    tgt_key.insert(id0, k0);
    let w = tgt.window();
    let mut ini = mcs::Session::new(
        mcs::Config {
            spread,
            command_timeout: None,
        },
        0,
        initiator_conn(&p, now, (first_sn, w.exp_cmd_sn(), w.max_cmd_sn()), stat),
    );
    if !ini.recovers_connections() {
        return Err("ErrorRecoveryLevel 2 not taken from the params".into());
    }
    ini.reseal_on_reassign(sealed);
    let mut links = vec![Link {
        cid: 0,
        id: id0,
        to_target: VecDeque::new(),
        to_initiator: VecDeque::new(),
        cut: false,
    }];
    // A login with the session's TSIH on CID `cid`: both ends add it.
    let join = |tgt: &mut TargetSession,
                ini: &mut mcs::Session,
                rng: &mut Rng,
                cid: u16|
     -> Result<(Link, Option<ConnId>), String> {
        let stat = rng.next_u64() as u32;
        let a = tgt
            .add_connection(tcfg(cid, 0, stat), now, &Disk)
            .map_err(|e| format!("target: join {cid}: {e}"))?;
        let w = tgt.window();
        let (cmd_sn, _, _) = ini.window();
        ini.add_connection(
            now,
            cid,
            initiator_conn(&p, now, (cmd_sn, w.exp_cmd_sn(), w.max_cmd_sn()), stat),
        )
        .map_err(|e| format!("initiator: join {cid}: {e}"))?;
        Ok((
            Link {
                cid,
                id: a.id,
                to_target: VecDeque::new(),
                to_initiator: VecDeque::new(),
                cut: false,
            },
            a.reinstated,
        ))
    };
    for cid in 1..n {
        let (l, _) = join(&mut tgt, &mut ini, &mut rng, cid)?;
        let k = fresh_key();
        ini_key.insert(cid, k);
        tgt_key.insert(l.id, k);
        links.push(l);
    }
    let mut next_cid = n;

    let mut total = 100 + rng.below(100) as usize;
    // Sealed: commands to make again (a read whose data came sealed for a failed connection,
    // a command made for a connection that failed before it left), as the driver does.
    let mut again: Vec<(bool, u64, u32)> = Vec::new();
    let max_cuts = 1 + rng.below(6);
    let mut cuts = 0;
    let mut cmds: HashMap<u32, Cmd> = HashMap::new();
    let mut submitted = 0usize;
    let mut settled = 0usize;
    let mut running: Vec<(ConnId, target::Execute)> = Vec::new();
    // Target connections of cut links it has not closed yet: whatever it sends there is lost.
    let mut zombies: Vec<ConnId> = Vec::new();
    // Tasks whose TASK REASSIGN was answered Function complete.
    let mut adopted: std::collections::HashSet<u32> = std::collections::HashSet::new();
    let mut idle = 0u32;
    for step in 0..3_000_000u32 {
        if settled == total {
            break;
        }
        let mut progressed = false;
        let c = rng.below(links.len() as u64) as usize;
        match rng.below(26) {
            // The host submits a command (sealed: on a connection picked first, its data made
            // for it; with none open it waits).
            0..=3 if submitted < total && (!sealed || ini.pick().is_some()) => {
                let (write, lba, blocks) = match again.pop() {
                    Some(x) => x,
                    None => {
                        let write = rng.chance(0.5);
                        let blocks = 1 + rng.below(16) as u32;
                        (write, rng.below(1 << 12), blocks)
                    }
                };
                let len = blocks * BLOCK as u32;
                let on = if sealed { ini.pick() } else { None };
                let key = on.map_or(0, |c| ini_key[&c]);
                let data = if write {
                    Data::Write(seal(&pattern_bytes(lba * BLOCK, len as usize), key))
                } else {
                    Data::Read {
                        buf: bytes::BytesMut::new(),
                        len,
                    }
                };
                let cmd = Command {
                    lun: 0,
                    cdb: cdb16(if write { 0x8a } else { 0x88 }, lba, blocks),
                    data,
                    timed: false,
                };
                let itt = match on {
                    Some(cid) => {
                        let itt = ini.alloc_itt();
                        ini.submit_on(now, cid, itt, cmd)
                    }
                    None => ini.submit(now, cmd),
                }
                .map_err(|e| format!("submit: {e}"))?;
                cmds.insert(
                    itt,
                    Cmd {
                        write,
                        lba,
                        blocks,
                        cmd_sn: None,
                        completions: 0,
                        executions: 0,
                    },
                );
                submitted += 1;
                progressed = true;
            }
            // The initiator sends one PDU on a connection.
            4..=8 if !links[c].cut => {
                let link = &mut links[c];
                if let Some(pdu) = ini.poll_transmit(link.cid) {
                    match &pdu.header {
                        Header::ScsiCommand(h) => {
                            let x = cmds
                                .get_mut(&h.itt)
                                .ok_or_else(|| format!("unknown ITT {:#x} sent", h.itt))?;
                            if *x.cmd_sn.get_or_insert(h.cmd_sn) != h.cmd_sn {
                                return Err(format!(
                                    "ITT {:#x} sent again with CmdSN {}, first {:?}",
                                    h.itt, h.cmd_sn, x.cmd_sn
                                ));
                            }
                            if ini.allegiance(h.itt) != Some(link.cid) {
                                return Err(format!("ITT {:#x}: allegiance elsewhere", h.itt));
                            }
                        }
                        Header::LogoutRequest(l)
                            if l.reason == LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY =>
                        {
                            RECOVERY_LOGOUTS.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                    link.to_target.push_back(pdu);
                    progressed = true;
                }
            }
            // The target reads one PDU from a connection.
            9..=13 if !links[c].cut => {
                if let Some(pdu) = links[c].to_target.pop_front() {
                    tgt.handle_pdu(links[c].id, now, &Disk, pdu);
                    progressed = true;
                }
            }
            // A running command completes at the target (on the connection it was handed out
            // on, which may have failed since: the session keeps or forwards the answer).
            14..=16 if !running.is_empty() => {
                let k = rng.below(running.len() as u64) as usize;
                let (id, x) = running.swap_remove(k);
                let (lba, blocks) = parse16(&x.cdb);
                let want = pattern_bytes(lba * BLOCK, (u64::from(blocks) * BLOCK) as usize);
                // Opened and sealed under the key of the connection it runs from.
                let key = tgt_key[&id];
                let resp = if x.write {
                    if seal(&x.data_out, key) != want {
                        let keys: Vec<u8> = x
                            .data_out
                            .iter()
                            .zip(want.iter())
                            .map(|(a, b)| a ^ b)
                            .step_by(512)
                            .collect();
                        return Err(format!(
                            "ITT {:#x}: write data wrong (runs from {id:?} key {key}, data keys \
                             per block {keys:?}, adopted {})",
                            x.itt,
                            adopted.contains(&x.itt)
                        ));
                    }
                    Response::good(Bytes::new())
                } else {
                    Response::good(seal(&want, key))
                };
                if !tgt.complete(id, x.itt, resp) {
                    return Err(format!("ITT {:#x}: completion refused", x.itt));
                }
                progressed = true;
            }
            // The target sends one PDU on a connection.
            17..=19 if !links[c].cut => {
                let link = &mut links[c];
                if let Some(pdu) = tgt.poll_transmit(link.id) {
                    if let Header::Reject(r) = &pdu.header {
                        return Err(format!("target rejected: {r:?}"));
                    }
                    link.to_initiator.push_back(pdu);
                    progressed = true;
                }
            }
            // The initiator reads one PDU from a connection.
            20 | 21 if !links[c].cut => {
                let cid = links[c].cid;
                if let Some(pdu) = links[c].to_initiator.pop_front() {
                    match &pdu.header {
                        Header::R2t(r) if adopted.contains(&r.itt) => {
                            RECOVERY_R2TS.fetch_add(1, Ordering::Relaxed);
                        }
                        Header::DataIn(d) if adopted.contains(&d.itt) && d.data_sn > 0 => {
                            RESENT_FROM_EXP_DATA_SN.fetch_add(1, Ordering::Relaxed);
                        }
                        _ => {}
                    }
                    ini.handle_pdu(cid, now, pdu);
                    progressed = true;
                }
            }
            // A connection is cut, whatever is in flight on it.
            22 if cuts < max_cuts && !links[c].cut => {
                cuts += 1;
                CUTS.fetch_add(1, Ordering::Relaxed);
                let link = &mut links[c];
                link.cut = true;
                link.to_target.clear();
                link.to_initiator.clear();
                ini.peer_closed(link.cid, now);
                if rng.chance(0.5) {
                    // The target sees the socket go.
                    tgt.peer_closed(link.id, now, &Disk);
                    while tgt.poll_transmit(link.id).is_some() {}
                    tgt.remove(link.id, now, &Disk);
                } else {
                    zombies.push(link.id);
                }
                if links.iter().all(|l| l.cut) {
                    ALL_DOWN.fetch_add(1, Ordering::Relaxed);
                }
                progressed = true;
            }
            // A cut connection logs in again: the same CID (a reinstatement) or a new one.
            23 | 24 if links[c].cut => {
                let old = links[c].cid;
                // The same CID (a reinstatement) only when no Logout for it is under way.
                let same = rng.chance(0.7) && ini.may_reuse_cid(old);
                let cid = if same {
                    old
                } else {
                    next_cid += 1;
                    next_cid - 1
                };
                if !same {
                    ini.remove(now, old);
                }
                let (l, reinstated) = join(&mut tgt, &mut ini, &mut rng, cid)?;
                let k = fresh_key();
                ini_key.insert(cid, k);
                tgt_key.insert(l.id, k);
                if let Some(r) = reinstated {
                    REINSTATED.fetch_add(1, Ordering::Relaxed);
                    while tgt.poll_transmit(r).is_some() {}
                    tgt.remove(r, now, &Disk);
                    zombies.retain(|z| *z != r);
                }
                links[c] = l;
                progressed = true;
            }
            _ => {}
        }
        // Target events: commands to run; the cut connections' ends.
        while let Some((id, ev)) = tgt.poll_event() {
            match ev {
                target::Event::Execute(x) => {
                    let cmd = cmds
                        .get_mut(&x.itt)
                        .ok_or_else(|| format!("Execute of unknown ITT {:#x}", x.itt))?;
                    cmd.executions += 1;
                    if cmd.executions > 1 {
                        return Err(format!("ITT {:#x} ran twice", x.itt));
                    }
                    running.push((id, x));
                }
                target::Event::Closed(e) => {
                    if links.iter().any(|l| l.id == id && !l.cut) {
                        return Err(format!("target closed live connection {id:?}: {e}"));
                    }
                    if zombies.contains(&id) {
                        // Logged out for recovery by another connection: now it goes.
                        while tgt.poll_transmit(id).is_some() {}
                        tgt.remove(id, now, &Disk);
                        zombies.retain(|z| *z != id);
                    }
                }
                other => return Err(format!("target: {id:?}: {other:?}")),
            }
        }
        // What a target connection nobody reads sends is lost.
        for z in &zombies {
            while tgt.poll_transmit(*z).is_some() {}
        }
        // Initiator events: completions exactly once, with the right data.
        while let Some(ev) = ini.poll_event() {
            match ev {
                mcs::Event::Completed { itt, cid, result } => {
                    let x = cmds
                        .get_mut(&itt)
                        .ok_or_else(|| format!("completion of unknown ITT {itt:#x}"))?;
                    x.completions += 1;
                    if x.completions > 1 {
                        return Err(format!("ITT {itt:#x} completed twice"));
                    }
                    if sealed && ini.take_never_left(itt) {
                        if x.cmd_sn.is_some() {
                            return Err(format!("ITT {itt:#x} left with a CmdSN, said never left"));
                        }
                        if let Err(TaskError::ConnectionLost(_)) = &result {
                            // Made for a connection that failed before it left: made again.
                            NEVER_SENT_AGAIN.fetch_add(1, Ordering::Relaxed);
                            again.push((x.write, x.lba, x.blocks));
                            total += 1;
                            settled += 1;
                            continue;
                        }
                    }
                    let done = result.map_err(|e| format!("ITT {itt:#x} failed back: {e}"))?;
                    let read = (!x.write).then_some((x.lba, x.blocks));
                    // Opened under the key of the connection it completed on.
                    let key = cid.map_or(0, |c| ini_key[&c]);
                    let data = seal(&done.data, key);
                    if sealed
                        && read.is_some()
                        && check_good(itt, done.status, read, &data).is_err()
                    {
                        if !adopted.contains(&itt) {
                            return Err(format!(
                                "ITT {itt:#x}: read data does not open under the keys of \
                                 connection {cid:?}, and it was never reassigned"
                            ));
                        }
                        // Sealed for the failed connection: never opened, read again.
                        READS_SENT_AGAIN.fetch_add(1, Ordering::Relaxed);
                        again.push((false, x.lba, x.blocks));
                        total += 1;
                        settled += 1;
                        continue;
                    }
                    check_good(itt, done.status, read, &data)?;
                    settled += 1;
                }
                mcs::Event::Reseal { itt, to } => {
                    let x = cmds
                        .get(&itt)
                        .ok_or_else(|| format!("reseal of unknown ITT {itt:#x}"))?;
                    if !sealed || !x.write {
                        return Err(format!("reseal of ITT {itt:#x} asked (sealed {sealed})"));
                    }
                    RESEALED.fetch_add(1, Ordering::Relaxed);
                    let plain =
                        pattern_bytes(x.lba * BLOCK, (u64::from(x.blocks) * BLOCK) as usize);
                    ini.resealed(now, itt, to, Some(seal(&plain, ini_key[&to])));
                }
                mcs::Event::ConnectionClosed { cid, error, .. } => {
                    let cut = links.iter().any(|l| l.cid == cid && l.cut);
                    if !cut || error.reason != CloseReason::PeerClosed {
                        return Err(format!("connection {cid} closed: {error}"));
                    }
                }
                mcs::Event::Reassigned { itt, outcome, .. } => match outcome {
                    Reassignment::Adopted => {
                        ADOPTED.fetch_add(1, Ordering::Relaxed);
                        adopted.insert(itt);
                    }
                    Reassignment::Retried => {
                        RETRIED.fetch_add(1, Ordering::Relaxed);
                    }
                    Reassignment::Refused(r) => {
                        return Err(format!("TASK REASSIGN of {itt:#x} refused: {r:?}"))
                    }
                },
                other => return Err(format!("initiator: {other:?}")),
            }
        }
        idle = if progressed { 0 } else { idle + 1 };
        if idle > 20_000 {
            return Err(format!(
                "stuck at step {step}: {settled} of {total} settled, {} in flight, {} held \
                 (recovering {:?}), {} running, {} orphans, window {:?}, links {:?}",
                ini.tasks_in_flight(),
                ini.held_tasks(),
                ini.recovering(),
                running.len(),
                tgt.orphans(),
                ini.window(),
                links.iter().map(|l| (l.cid, l.cut)).collect::<Vec<_>>()
            ) + &std::env::var("MCS_ERL2_SIM_DEBUG")
                .map(|_| {
                    format!(
                        "\n{ini:#?}\n{:?}",
                        links
                            .iter()
                            .map(|l| (l.to_target.len(), l.to_initiator.len()))
                            .collect::<Vec<_>>()
                    )
                })
                .unwrap_or_default());
        }
    }
    if settled != total {
        return Err(format!("{settled} of {total} settled"));
    }
    if let Some((itt, _)) = cmds.iter().find(|(_, x)| x.completions != 1) {
        return Err(format!("ITT {itt:#x} not completed once"));
    }
    if ini.tasks_in_flight() != 0 || ini.held_tasks() != 0 || !running.is_empty() {
        return Err("tasks left".into());
    }
    if ini.ended().is_some() {
        return Err(format!("the session ended: {:?}", ini.ended()));
    }
    let w = tgt.window();
    let numbered = cmds.values().filter(|x| x.cmd_sn.is_some()).count();
    if w.exp_cmd_sn() != first_sn.wrapping_add(numbered as u32) {
        return Err(format!(
            "target ExpCmdSN {} after {numbered} commands from {first_sn}",
            w.exp_cmd_sn()
        ));
    }
    // What is left at the target are completed tasks whose acknowledgement was lost with a
    // connection: kept for DefaultTime2Wait + DefaultTime2Retain, then dropped.
    tgt.handle_timeout(now + std::time::Duration::from_secs(21), &Disk);
    if tgt.orphans() != 0 {
        return Err(format!("{} orphans left at the target", tgt.orphans()));
    }
    Ok(())
}

#[test]
fn accepts_connections_cut_anywhere_and_completes_every_command_once_by_task_reassign() {
    if run_seeds("MCS_ERL2_SIM_SEED", 200, |seed| run(seed, false)).is_some() {
        let seen = [
            &CUTS,
            &ALL_DOWN,
            &ADOPTED,
            &RETRIED,
            &RECOVERY_LOGOUTS,
            &REINSTATED,
            &RECOVERY_R2TS,
            &RESENT_FROM_EXP_DATA_SN,
        ]
        .map(|c| c.load(Ordering::Relaxed));
        eprintln!(
            "cuts, all down, adopted, retried, recovery logouts, reinstated, recovery R2Ts, \
             Data-In resent from ExpDataSN: {seen:?}"
        );
        assert!(
            seen.iter().all(|n| *n > 0),
            "cuts, all down, adopted, retried, recovery logouts, reinstated, recovery R2Ts, \
             Data-In resent from ExpDataSN: {seen:?}"
        );
    }
}

#[test]
fn accepts_sealed_connections_cut_anywhere_and_never_opens_data_under_another_connections_keys() {
    if run_seeds("MCS_ERL2_SIM_SEALED_SEED", 200, |seed| run(seed, true)).is_some() {
        let seen = [
            &RESEALED,
            &READS_SENT_AGAIN,
            &NEVER_SENT_AGAIN,
            &RECOVERY_R2TS,
        ]
        .map(|c| c.load(Ordering::Relaxed));
        eprintln!(
            "sealed: writes made again for their new connection, reads sent again, commands \
             made again before they left, recovery R2Ts: {seen:?}"
        );
        assert!(
            seen[0] > 0 && seen[1] > 0,
            "resealed writes, reads sent again: {seen:?}"
        );
    }
}

// ---- fixed cases, the engine alone ----

fn params(erl: u32) -> SessionParams {
    SessionParams {
        max_connections: 2,
        error_recovery_level: erl,
        ..SessionParams::default()
    }
}

/// A session of two connections (CIDs 0 and 1), window 10..=41, round robin.
fn two(erl: u32) -> (mcs::Session, Instant) {
    let now = Instant::now();
    let p = params(erl);
    let mut s = mcs::Session::new(
        mcs::Config {
            spread: Spread::RoundRobin,
            command_timeout: None,
        },
        0,
        initiator_conn(&p, now, (10, 10, 41), 100),
    );
    s.add_connection(now, 1, initiator_conn(&p, now, (10, 10, 41), 500))
        .unwrap();
    (s, now)
}

fn sent(s: &mut mcs::Session, cid: u16) -> Vec<Pdu> {
    std::iter::from_fn(|| s.poll_transmit(cid)).collect()
}

/// Connection 0 dies with a read half answered: nothing fails; a Logout for recovery naming
/// CID 0 goes on connection 1, then TASK REASSIGN with ExpDataSN 1, and the rest of the data
/// and the status complete the read once, on connection 1.
#[test]
fn accepts_a_cut_connections_read_on_the_live_one_after_a_logout_for_recovery() {
    let (mut s, now) = two(2);
    let a = s.submit(now, read(0, 2)).unwrap();
    assert_eq!(s.allegiance(a), Some(0));
    sent(&mut s, 0);
    let half = iscsi_wire::header::DataIn {
        itt: a,
        data_sn: 0,
        buffer_offset: 0,
        exp_cmd_sn: 11,
        max_cmd_sn: 41,
        ..Default::default()
    };
    s.handle_pdu(0, now, Pdu::new(half, pattern_bytes(0, 512)));
    s.peer_closed(0, now);
    let events: Vec<mcs::Event> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(
        matches!(
            &events[..],
            [mcs::Event::ConnectionClosed {
                cid: 0,
                gap: false,
                ..
            }]
        ),
        "no completion, only the close: {events:?}"
    );
    assert_eq!(s.held_tasks(), 1);
    let out = sent(&mut s, 1);
    let logout = match &out[..] {
        [p] => match &p.header {
            Header::LogoutRequest(l) => l.clone(),
            h => panic!("{h:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(
        (logout.reason, logout.cid),
        (LogoutReason::REMOVE_CONNECTION_FOR_RECOVERY, 0)
    );
    let answer = LogoutResponse {
        itt: logout.itt,
        stat_sn: 500,
        exp_cmd_sn: 11,
        max_cmd_sn: 41,
        time2retain: 20,
        ..Default::default()
    };
    s.handle_pdu(1, now, Pdu::new(answer, Bytes::new()));
    let out = sent(&mut s, 1);
    let tmf = match &out[..] {
        [p] => match &p.header {
            Header::TaskMgmtRequest(t) => t.clone(),
            h => panic!("{h:?}"),
        },
        other => panic!("{other:?}"),
    };
    assert_eq!(tmf.function, TmfFunction::TASK_REASSIGN);
    assert_eq!(
        (tmf.referenced_task_tag, tmf.ref_cmd_sn, tmf.exp_data_sn),
        (a, 10, 1),
        "names the read, its CmdSN and the Data-In it has"
    );
    assert_eq!(s.allegiance(a), Some(1));
    let ok = TaskMgmtResponse {
        response: TmfResponse::FUNCTION_COMPLETE,
        itt: tmf.itt,
        stat_sn: 501,
        exp_cmd_sn: 11,
        max_cmd_sn: 41,
    };
    s.handle_pdu(1, now, Pdu::new(ok, Bytes::new()));
    let rest = iscsi_wire::header::DataIn {
        final_: true,
        status_present: true,
        itt: a,
        data_sn: 1,
        buffer_offset: 512,
        stat_sn: 502,
        exp_cmd_sn: 11,
        max_cmd_sn: 41,
        ..Default::default()
    };
    s.handle_pdu(1, now, Pdu::new(rest, pattern_bytes(512, 512)));
    let mut done = Vec::new();
    let mut adopted = false;
    while let Some(e) = s.poll_event() {
        match e {
            mcs::Event::Completed { itt, cid, result } => {
                done.push((itt, cid, result.unwrap().data.to_vec()));
            }
            mcs::Event::Reassigned {
                itt,
                cid: 1,
                outcome: Reassignment::Adopted,
            } if itt == a => adopted = true,
            other => panic!("{other:?}"),
        }
    }
    assert!(adopted);
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].0, done[0].1), (a, Some(1)));
    check_good(a, 0, Some((0, 2)), &done[0].2).unwrap();
    assert_eq!(s.tasks_in_flight(), 0);
}

/// Every connection down: the session waits (commands are still taken); a login reinstating
/// CID 0 gets the held write by TASK REASSIGN at once (its implicit logout cleaned up), and
/// "Task does not exist" for a CmdSN the target never acknowledged sends the command again
/// with that CmdSN.
#[test]
fn accepts_every_connection_down_and_retries_a_command_the_target_never_had_with_its_cmdsn() {
    let (mut s, now) = two(2);
    let w = s
        .submit(
            now,
            Command {
                lun: 0,
                cdb: cdb16(0x8a, 0, 1),
                data: Data::Write(pattern_bytes(0, 512)),
                timed: false,
            },
        )
        .unwrap();
    assert_eq!(s.allegiance(w), Some(0));
    sent(&mut s, 0);
    s.peer_closed(0, now);
    s.peer_closed(1, now);
    assert_eq!(s.open_connections(), 0);
    assert_eq!(s.ended(), None, "ErrorRecoveryLevel 2: the session waits");
    let later = s.submit(now, read(8, 1)).unwrap();
    assert_eq!(s.allegiance(later), None, "waits for a connection");
    s.add_connection(now, 0, initiator_conn(&params(2), now, (11, 10, 41), 900))
        .unwrap();
    let out = sent(&mut s, 0);
    let tmf = out
        .iter()
        .find_map(|p| match &p.header {
            Header::TaskMgmtRequest(t) if t.function == TmfFunction::TASK_REASSIGN => {
                Some(t.clone())
            }
            _ => None,
        })
        .expect("TASK REASSIGN on the reinstated CID, no Logout first");
    assert!(out
        .iter()
        .all(|p| !matches!(p.header, Header::LogoutRequest(_))));
    assert_eq!((tmf.referenced_task_tag, tmf.ref_cmd_sn), (w, 10));
    let none = TaskMgmtResponse {
        response: TmfResponse::TASK_DOES_NOT_EXIST,
        itt: tmf.itt,
        stat_sn: 900,
        exp_cmd_sn: 10,
        max_cmd_sn: 41,
    };
    s.handle_pdu(0, now, Pdu::new(none, Bytes::new()));
    let again: Vec<(u32, u32, usize)> = sent(&mut s, 0)
        .iter()
        .filter_map(|p| match &p.header {
            Header::ScsiCommand(c) if c.itt == w => Some((c.itt, c.cmd_sn, p.data.len())),
            _ => None,
        })
        .collect();
    assert_eq!(
        again,
        vec![(w, 10, 512)],
        "the same ITT and CmdSN, its data again"
    );
    let ok = ScsiResponse {
        itt: w,
        stat_sn: 901,
        exp_cmd_sn: 11,
        max_cmd_sn: 41,
        ..Default::default()
    };
    s.handle_pdu(0, now, Pdu::new(ok, Bytes::new()));
    let done: Vec<u32> = std::iter::from_fn(|| s.poll_event())
        .filter_map(|e| match e {
            mcs::Event::Completed { itt, result, .. } => {
                assert!(result.is_ok(), "{result:?}");
                Some(itt)
            }
            _ => None,
        })
        .collect();
    assert_eq!(done, vec![w]);
}

/// The attacker's (or a broken target's) refusal: a TASK REASSIGN answered "Task still
/// allegiant" ends that task with a connection loss naming the refusal, once; a target that
/// answers "Task does not exist" for a CmdSN it had acknowledged lost the task, and it is not
/// run again. `give_up` ends a session whose connections do not come back.
#[test]
fn rejects_a_refused_reassignment_and_ends_the_task_once() {
    let (mut s, now) = two(2);
    let a = s.submit(now, read(0, 1)).unwrap();
    let b = s.submit(now, read(8, 1)).unwrap();
    let c = s.submit(now, read(16, 1)).unwrap();
    assert_eq!(
        (s.allegiance(a), s.allegiance(b), s.allegiance(c)),
        (Some(0), Some(1), Some(0))
    );
    sent(&mut s, 0);
    s.peer_closed(0, now);
    let logout = sent(&mut s, 1)
        .into_iter()
        .find_map(|p| match p.header {
            Header::LogoutRequest(l) => Some(l),
            _ => None,
        })
        .unwrap();
    let answer = LogoutResponse {
        itt: logout.itt,
        stat_sn: 500,
        exp_cmd_sn: 13,
        max_cmd_sn: 44,
        ..Default::default()
    };
    s.handle_pdu(1, now, Pdu::new(answer, Bytes::new()));
    let tmfs: Vec<(u32, u32)> = sent(&mut s, 1)
        .into_iter()
        .filter_map(|p| match p.header {
            Header::TaskMgmtRequest(t) => Some((t.referenced_task_tag, t.itt)),
            _ => None,
        })
        .collect();
    assert_eq!(tmfs.iter().map(|t| t.0).collect::<Vec<_>>(), vec![a, c]);
    for ((_, tag), response) in tmfs.iter().zip([
        TmfResponse::TASK_STILL_ALLEGIANT,
        // ExpCmdSN 13: the target had c (CmdSN 12) and says it does not exist.
        TmfResponse::TASK_DOES_NOT_EXIST,
    ]) {
        let r = TaskMgmtResponse {
            response,
            itt: *tag,
            stat_sn: 501,
            exp_cmd_sn: 13,
            max_cmd_sn: 44,
        };
        s.handle_pdu(1, now, Pdu::new(r, Bytes::new()));
    }
    assert!(
        sent(&mut s, 1)
            .iter()
            .all(|p| !matches!(p.header, Header::ScsiCommand(_))),
        "nothing sent again"
    );
    let mut ended = Vec::new();
    while let Some(e) = s.poll_event() {
        if let mcs::Event::Completed { itt, result, .. } = e {
            match result {
                Err(TaskError::ConnectionLost(e)) => {
                    assert!(matches!(e.reason, CloseReason::ReassignRefused(_)), "{e}");
                    ended.push(itt);
                }
                other => panic!("{other:?}"),
            }
        }
    }
    ended.sort_unstable();
    assert_eq!(ended, vec![a, c]);
    assert_eq!(s.tasks_on(1), vec![b]);
    s.peer_closed(1, now);
    assert_eq!(s.held_tasks(), 1);
    s.give_up(
        now,
        iscsi_proto::engine::ConnectionError {
            by: Side::Initiator,
            reason: CloseReason::Local,
        },
    );
    let last: Vec<u32> = std::iter::from_fn(|| s.poll_event())
        .filter_map(|e| match e {
            mcs::Event::Completed {
                itt,
                result: Err(TaskError::ConnectionLost(_)),
                ..
            } => Some(itt),
            _ => None,
        })
        .collect();
    assert_eq!(last, vec![b]);
    assert!(s.ended().is_some());
    assert_eq!(s.tasks_in_flight(), 0);
}

/// ErrorRecoveryLevel 0 stays as it was: a cut connection's tasks end with it, nothing is
/// reassigned, no Logout for recovery goes anywhere.
#[test]
fn keeps_error_recovery_level_0_unchanged_a_cut_connection_ends_its_tasks() {
    let (mut s, now) = two(0);
    let a = s.submit(now, read(0, 1)).unwrap();
    sent(&mut s, 0);
    s.peer_closed(0, now);
    let lost: Vec<u32> = std::iter::from_fn(|| s.poll_event())
        .filter_map(|e| match e {
            mcs::Event::Completed {
                itt,
                result: Err(TaskError::ConnectionLost(_)),
                ..
            } => Some(itt),
            _ => None,
        })
        .collect();
    assert_eq!(lost, vec![a]);
    assert!(sent(&mut s, 1).is_empty());
    assert_eq!(s.held_tasks(), 0);
    assert!(!s.recovers_connections());
}

#[test]
fn accepts_a_retry_with_its_first_cmdsn_without_taking_a_new_one() {
    // The retried command keeps its CmdSN, inside the window it first went in: the session's
    // next CmdSN does not move for it.
    let (mut s, now) = two(2);
    let a = s.submit(now, read(0, 1)).unwrap();
    sent(&mut s, 0);
    let next = s.window().0;
    s.peer_closed(0, now);
    let logout = sent(&mut s, 1)
        .into_iter()
        .find_map(|p| match p.header {
            Header::LogoutRequest(l) => Some(l),
            _ => None,
        })
        .unwrap();
    s.handle_pdu(
        1,
        now,
        Pdu::new(
            LogoutResponse {
                itt: logout.itt,
                stat_sn: 500,
                exp_cmd_sn: 10,
                max_cmd_sn: 41,
                ..Default::default()
            },
            Bytes::new(),
        ),
    );
    let tag = sent(&mut s, 1)
        .into_iter()
        .find_map(|p| match p.header {
            Header::TaskMgmtRequest(t) => Some(t.itt),
            _ => None,
        })
        .unwrap();
    s.handle_pdu(
        1,
        now,
        Pdu::new(
            TaskMgmtResponse {
                response: TmfResponse::TASK_DOES_NOT_EXIST,
                itt: tag,
                stat_sn: 501,
                exp_cmd_sn: 10,
                max_cmd_sn: 41,
            },
            Bytes::new(),
        ),
    );
    let sns: Vec<u32> = sent(&mut s, 1)
        .into_iter()
        .filter_map(|p| match p.header {
            Header::ScsiCommand(c) if c.itt == a => Some(c.cmd_sn),
            _ => None,
        })
        .collect();
    assert_eq!(sns, vec![10]);
    assert_eq!(s.window().0, next);
    assert!(sn_le(10, s.window().2));
}
