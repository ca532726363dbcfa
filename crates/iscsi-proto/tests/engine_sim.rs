//! Deterministic simulation of the full feature phase: a target engine and an initiator engine
//! paired in memory on a virtual clock, the pure `ipsan_wan` impairment model between them
//! (delay, rate, loss delivered the way TCP delivers it: late and in order, after a
//! retransmission timeout), and a memory disk behind the target.
//!
//! Each seed draws negotiated parameters around the burst limits, a link, and a workload of
//! reads, writes of every size around FirstBurstLength/MaxBurstLength/MaxRecvDataSegmentLength,
//! aborts, LUN resets, a link cut (NOP timeouts) or a logout. It checks that every submitted
//! command completes exactly once, with the right data or a typed error that the workload
//! explains; that no engine ever saw the other break a rule; that StatSN and CmdSN run in
//! sequence on the wire; and that nothing is left in either task table. A failure names its
//! seed: `ENGINE_SIM_SEED=<n> cargo test -p iscsi-proto --test engine_sim` replays it.

#[allow(dead_code)]
mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{
    cdb16, check_good, parse16, pattern, pick, run_seeds, Disk, Pipe, BLOCK, DISK_BLOCKS,
};
use ipsan_wan::rng::Rng;
use ipsan_wan::{DirConfig, LossModel};
use iscsi_proto::engine::initiator::{self, AbortedBy, Command, Data, TaskError};
use iscsi_proto::engine::target::{self, Response};
use iscsi_proto::engine::{CloseReason, Side};
use iscsi_proto::params::SessionParams;
use iscsi_wire::{Codec, Header};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Read,
    Write,
}

#[derive(Debug)]
struct Submitted {
    kind: Kind,
    lba: u64,
    blocks: u32,
    completions: u32,
    aborted: bool,
}

enum Action {
    Submit(Kind, u64, u32),
    Abort(usize),
    LunReset,
    Cut,
    Logout,
}

/// Runs one seeded workload; `Err` says what went wrong.
fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let trace = std::env::var("ENGINE_SIM_TRACE").is_ok();
    let max_burst = pick(&mut rng, &[512, 4096, 8192, 16384, 65536]);
    let first_burst = pick(&mut rng, &[512, 4096, 8192, 65536]).min(max_burst);
    let params = SessionParams {
        initial_r2t: rng.chance(0.5),
        immediate_data: rng.chance(0.5),
        max_burst_length: max_burst,
        first_burst_length: first_burst,
        max_outstanding_r2t: pick(&mut rng, &[1, 2, 4]),
        initiator_max_recv_data_segment_length: pick(&mut rng, &[512, 1024, 8192, 65536]),
        target_max_recv_data_segment_length: pick(&mut rng, &[512, 1024, 8192, 65536]),
        ..SessionParams::default()
    };
    let window = pick(&mut rng, &[1, 2, 8, 32]);
    let digests = rng.chance(0.3);
    let codec = |max| Codec {
        header_digest: digests,
        data_digest: digests,
        max_recv_data_segment_length: max,
    };
    let dir = DirConfig {
        delay: Duration::from_micros(rng.below(20_000)),
        loss: if rng.chance(0.5) {
            LossModel::Bernoulli {
                p: rng.next_f64() * 0.05,
            }
        } else {
            LossModel::None
        },
        rate_bps: if rng.chance(0.3) { 100_000_000 } else { 0 },
        ..DirConfig::default()
    };
    // Initiator → target (decoded with the target's MaxRecvDataSegmentLength) and back.
    let mut to_target = Pipe::new(
        dir.clone(),
        seed ^ 1,
        codec(params.target_max_recv_data_segment_length),
    );
    let mut to_initiator = Pipe::new(
        dir,
        seed ^ 2,
        codec(params.initiator_max_recv_data_segment_length),
    );

    let base = Instant::now();
    let mut now = Duration::ZERO;
    let at = |d: Duration| base + d;
    let cmd_sn = rng.next_u64() as u32;
    let stat_sn = rng.next_u64() as u32;
    let mut tcfg = target::Config::new(params.clone(), cmd_sn, stat_sn);
    tcfg.cmd_window = window;
    tcfg.nop_interval = Some(Duration::from_secs(2));
    let mut tgt = target::Connection::new(tcfg, at(now));
    tgt.set_next_ttt(u32::MAX - 1 - rng.below(4) as u32);
    let mut icfg = initiator::Config::new(
        params.clone(),
        cmd_sn,
        cmd_sn.wrapping_add(window - 1),
        stat_sn,
    );
    icfg.nop_interval = Some(Duration::from_secs(1));
    icfg.nop_timeout = Duration::from_secs(3);
    let mut ini = initiator::Connection::new(icfg, at(now));

    // The workload: actions at virtual times.
    let mut actions: BTreeMap<Duration, Vec<Action>> = BTreeMap::new();
    let n = 5 + rng.below(40) as usize;
    let cut = rng.chance(0.1);
    let mut t = Duration::ZERO;
    let sizes = [
        512,
        first_burst.saturating_sub(512),
        first_burst,
        first_burst + 512,
        max_burst.saturating_sub(512),
        max_burst,
        max_burst + 512,
        2 * max_burst,
        params.target_max_recv_data_segment_length + 512,
        params.initiator_max_recv_data_segment_length,
        3 * max_burst + 1024,
    ];
    for i in 0..n {
        t += Duration::from_micros(rng.below(3000));
        let bytes = u64::from(pick(&mut rng, &sizes)).clamp(512, 256 * 1024);
        let blocks = bytes.div_ceil(BLOCK) as u32;
        let lba = rng.below(DISK_BLOCKS - u64::from(blocks));
        let kind = if rng.chance(0.5) {
            Kind::Read
        } else {
            Kind::Write
        };
        actions
            .entry(t)
            .or_default()
            .push(Action::Submit(kind, lba, blocks));
        if rng.chance(0.1) {
            let later = t + Duration::from_micros(rng.below(30_000));
            actions.entry(later).or_default().push(Action::Abort(i));
        }
    }
    if rng.chance(0.1) {
        let when = Duration::from_micros(rng.below(t.as_micros() as u64 + 1));
        actions.entry(when).or_default().push(Action::LunReset);
    }
    if cut {
        let when = Duration::from_micros(rng.below(t.as_micros() as u64 + 1));
        actions.entry(when).or_default().push(Action::Cut);
    } else {
        actions
            .entry(t + Duration::from_secs(1))
            .or_default()
            .push(Action::Logout);
    }

    let mut submitted: Vec<Submitted> = Vec::new();
    let mut by_itt: BTreeMap<u32, usize> = BTreeMap::new();
    let mut backend: BTreeMap<(Duration, u32), target::Execute> = BTreeMap::new();
    let mut reset_sent = false;
    let mut logged_out = false;
    let mut ini_closed = None;
    let mut tgt_closed = None;
    // Wire sequence checks.
    let mut next_stat_sn = stat_sn;
    let mut next_cmd_sn = cmd_sn;
    let limit = Duration::from_secs(300);

    loop {
        // Actions due.
        while let Some((&when, _)) = actions.first_key_value() {
            if when > now {
                break;
            }
            let (_, due) = actions.pop_first().ok_or("actions")?;
            for a in due {
                match a {
                    Action::Submit(kind, lba, blocks) => {
                        let (op, data) = match kind {
                            Kind::Read => (
                                0x88,
                                Data::Read {
                                    buf: BytesMut::new(),
                                    len: blocks * BLOCK as u32,
                                },
                            ),
                            Kind::Write => {
                                let start = lba * BLOCK;
                                let v: Vec<u8> = (start..start + u64::from(blocks) * BLOCK)
                                    .map(pattern)
                                    .collect();
                                (0x8a, Data::Write(Bytes::from(v)))
                            }
                        };
                        let cmd = Command {
                            lun: 0,
                            cdb: cdb16(op, lba, blocks),
                            data,
                            timed: false,
                        };
                        match ini.submit(at(now), cmd) {
                            Ok(itt) => {
                                by_itt.insert(itt, submitted.len());
                                submitted.push(Submitted {
                                    kind,
                                    lba,
                                    blocks,
                                    completions: 0,
                                    aborted: false,
                                });
                            }
                            Err(_) if ini.closed().is_some() || logged_out => {}
                            Err(e) => return Err(format!("submit refused: {e}")),
                        }
                    }
                    Action::Abort(i) => {
                        if let Some((&itt, _)) = by_itt.iter().find(|(_, &j)| j == i) {
                            if submitted[i].completions == 0 {
                                submitted[i].aborted = true;
                                ini.abort(at(now), itt);
                            }
                        }
                    }
                    Action::LunReset => {
                        if ini.closed().is_none() && !logged_out {
                            reset_sent = true;
                            ini.lun_reset(at(now), 0);
                        }
                    }
                    Action::Cut => {
                        to_target.cut = true;
                        to_initiator.cut = true;
                    }
                    Action::Logout => {
                        logged_out = true;
                        ini.logout(at(now));
                    }
                }
            }
        }
        // Backend completions due.
        while let Some((&(when, itt), _)) = backend.first_key_value() {
            if when > now {
                break;
            }
            let (_, x) = backend.pop_first().ok_or("backend")?;
            let (lba, blocks) = parse16(&x.cdb);
            let start = lba * BLOCK;
            let len = u64::from(blocks) * BLOCK;
            let resp = if x.cdb[0] == 0x8a {
                let want = u64::from(x.edtl).min(len);
                if x.data_out.len() as u64 != want {
                    return Err(format!(
                        "ITT {itt:#x}: backend got {} data-out bytes, want {want}",
                        x.data_out.len()
                    ));
                }
                for (k, b) in x.data_out.iter().enumerate() {
                    if *b != pattern(start + k as u64) {
                        return Err(format!("ITT {itt:#x}: data-out byte {k} corrupted"));
                    }
                }
                Response::good(Bytes::new())
            } else {
                let v: Vec<u8> = (start..start + len).map(pattern).collect();
                Response::good(Bytes::from(v))
            };
            tgt.complete(itt, resp);
        }
        // Engines' timers.
        if ini.poll_timeout().is_some_and(|d| d <= at(now)) {
            ini.handle_timeout(at(now));
        }
        if tgt.poll_timeout().is_some_and(|d| d <= at(now)) {
            tgt.handle_timeout(at(now));
        }
        // The wire, both ways, until quiet at this instant.
        loop {
            let mut moved = false;
            while let Some(p) = ini.poll_transmit() {
                if let Header::ScsiCommand(c) = &p.header {
                    if !c.immediate {
                        if c.cmd_sn != next_cmd_sn {
                            return Err(format!("CmdSN {} sent, expected {next_cmd_sn}", c.cmd_sn));
                        }
                        next_cmd_sn = next_cmd_sn.wrapping_add(1);
                    }
                }
                if trace {
                    eprintln!("{now:?} I->T {:?} itt={:#x}", p.header, p.header.itt());
                }
                to_target.send(now, &p)?;
                moved = true;
            }
            while let Some(p) = tgt.poll_transmit() {
                let s = match &p.header {
                    Header::ScsiResponse(h) => Some(h.stat_sn),
                    Header::DataIn(h) if h.status_present => Some(h.stat_sn),
                    Header::NopIn(h) if h.itt != u32::MAX => Some(h.stat_sn),
                    Header::TaskMgmtResponse(h) => Some(h.stat_sn),
                    Header::LogoutResponse(h) => Some(h.stat_sn),
                    Header::Reject(h) => Some(h.stat_sn),
                    Header::AsyncMessage(h) => Some(h.stat_sn),
                    _ => None,
                };
                if let Some(s) = s {
                    if s != next_stat_sn {
                        return Err(format!("StatSN {s} sent, expected {next_stat_sn}"));
                    }
                    next_stat_sn = next_stat_sn.wrapping_add(1);
                }
                if let Header::R2t(r) = &p.header {
                    if r.ttt == u32::MAX {
                        return Err("R2T with the reserved TTT".into());
                    }
                }
                if let Header::Reject(_) = &p.header {
                    return Err(format!("target rejected a PDU: {:?}", &p.data[..4]));
                }
                if trace {
                    eprintln!("{now:?} T->I {:?}", p.header);
                }
                to_initiator.send(now, &p)?;
                moved = true;
            }
            while let Some(p) = to_target.due(now) {
                tgt.handle_pdu(at(now), &Disk, p);
                moved = true;
            }
            while let Some(p) = to_initiator.due(now) {
                ini.handle_pdu(at(now), p);
                moved = true;
            }
            while let Some(e) = tgt.poll_event() {
                match e {
                    target::Event::Execute(x) => {
                        let lat = Duration::from_micros(rng.below(2000));
                        backend.insert((now + lat, x.itt), x);
                    }
                    target::Event::Reset { .. } | target::Event::Abort { .. } => {}
                    target::Event::Closed(c) => tgt_closed = Some(c),
                }
                moved = true;
            }
            while let Some(e) = ini.poll_event() {
                match e {
                    initiator::Event::Completed { itt, result } => {
                        let i = *by_itt
                            .get(&itt)
                            .ok_or(format!("completion for unknown ITT {itt:#x}"))?;
                        let s = &mut submitted[i];
                        s.completions += 1;
                        match result {
                            Ok(c) => {
                                let read = (s.kind == Kind::Read).then_some((s.lba, s.blocks));
                                check_good(itt, c.status, read, &c.data)?;
                            }
                            Err(TaskError::Aborted(AbortedBy::AbortTask)) if s.aborted => {}
                            Err(TaskError::Aborted(AbortedBy::LunReset)) if reset_sent => {}
                            Err(TaskError::ConnectionLost(_)) if cut || logged_out => {}
                            Err(e) => return Err(format!("ITT {itt:#x} ({s:?}): {e}")),
                        }
                    }
                    initiator::Event::Closed(c) => ini_closed = Some(c),
                    initiator::Event::TaskManagement { .. } => {}
                    other => return Err(format!("unexpected initiator event {other:?}")),
                }
                moved = true;
            }
            if !moved {
                break;
            }
        }
        if ini_closed.is_some() && (tgt_closed.is_some() || cut) && backend.is_empty() {
            break;
        }
        // Next instant anything happens.
        let next = [
            actions.first_key_value().map(|(t, _)| *t),
            backend.first_key_value().map(|((t, _), _)| *t),
            to_target.queue.front().map(|(t, _)| *t),
            to_initiator.queue.front().map(|(t, _)| *t),
            ini.poll_timeout().map(|d| d - base),
            tgt.poll_timeout().map(|d| d - base),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else {
            return Err("stalled: nothing left to happen, yet not closed".into());
        };
        now = next.max(now);
        if now > limit {
            return Err(format!(
                "still running after {limit:?} of virtual time ({} tasks at the initiator)",
                ini.tasks_in_flight()
            ));
        }
    }

    for (i, s) in submitted.iter().enumerate() {
        if s.completions != 1 {
            return Err(format!(
                "command {i} ({s:?}) completed {} times",
                s.completions
            ));
        }
    }
    let ic = ini_closed.ok_or("initiator not closed")?;
    if cut {
        if !matches!(ic.reason, CloseReason::PingTimeout(_)) {
            return Err(format!("cut link ended with {ic}, not a ping timeout"));
        }
    } else {
        let tc = tgt_closed.ok_or("target not closed")?;
        if ic.reason != CloseReason::Logout || tc.reason != CloseReason::Logout {
            return Err(format!("logout ended with {ic} / {tc}"));
        }
        if tc.by != Side::Initiator {
            return Err("logout attributed to the target".into());
        }
        if tgt.tasks_in_flight() != 0 {
            return Err(format!(
                "{} tasks leaked at the target",
                tgt.tasks_in_flight()
            ));
        }
        let w = tgt.window();
        let open = w.max_cmd_sn().wrapping_sub(w.exp_cmd_sn()).wrapping_add(1);
        if open != window {
            return Err(format!("window leaked: {open} of {window} slots open"));
        }
    }
    if ini.tasks_in_flight() != 0 || ini.tmfs_in_flight() != 0 {
        return Err("tasks leaked at the initiator".into());
    }
    Ok(())
}

#[test]
fn every_command_completes_exactly_once_over_thousands_of_seeded_workloads() {
    run_seeds("ENGINE_SIM_SEED", 500, run);
}
