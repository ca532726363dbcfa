//! Deterministic simulation of session recovery (RFC 7143 §6.3.5): the initiator's
//! `engine::session::Session` and the target engine paired in memory on a virtual clock
//! (the `ipsan_wan` model between them, as in `engine_sim`), with the connection dropped at
//! random points — a reset the initiator sees at once, or a silent cut its keepalive finds —
//! and a new connection attached after a random delay, sometimes past the recovery timeout.
//! Each new connection meets a new target connection: the old one's tasks are gone, as a
//! reinstatement ends them.
//!
//! The workload mixes reads, writes (some bound to their connection, as Seal's are, and
//! given again on `Rebind`), TEST UNIT READY and COMPARE AND WRITE, with a few aborts. It
//! checks that every submitted command completes exactly once; reads with the right data,
//! writes with every byte checked at the backend; that a COMPARE AND WRITE never runs twice
//! and ends either with its status or, only when a loss caught it in flight, with
//! `NotReissued`; that an idempotent command never ends with `NotReissued` or a bare
//! connection loss; that `RecoveryTimedOut` comes only after a loss; that CmdSN and StatSN
//! run in sequence on every connection; and that nothing is left in any task table. A
//! failure names its seed: `SESSION_SIM_SEED=<n> cargo test -p iscsi-proto --test
//! session_sim` replays it.

#[allow(dead_code)]
mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use common::{
    cdb16, check_good, parse16, pattern, pick, run_seeds, Disk, Pipe, BLOCK, DISK_BLOCKS,
};
use ipsan_scsi::cdb::is_idempotent;
use ipsan_wan::rng::Rng;
use ipsan_wan::{DirConfig, LossModel};
use iscsi_proto::engine::initiator::{self, AbortedBy, Command, Data, TaskError};
use iscsi_proto::engine::session::{self, Binding, Failure, Session, SubmitError};
use iscsi_proto::engine::target::{self, Response};
use iscsi_proto::engine::CloseReason;
use iscsi_proto::params::SessionParams;
use iscsi_wire::{Codec, Header};

#[derive(Debug, Clone, Copy, PartialEq)]
enum Kind {
    Read,
    Write,
    BoundWrite,
    CompareAndWrite,
    TestUnitReady,
}

impl Kind {
    fn opcode(self) -> u8 {
        match self {
            Kind::Read => 0x88,
            Kind::Write | Kind::BoundWrite => 0x8a,
            Kind::CompareAndWrite => 0x89,
            Kind::TestUnitReady => 0x00,
        }
    }
}

struct Submitted {
    kind: Kind,
    lba: u64,
    blocks: u32,
    data: Bytes,
    completions: u32,
    aborted: bool,
    /// Connection losses while it was unfinished (1 when submitted with no connection).
    losses: u32,
}

impl std::fmt::Debug for Submitted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Submitted")
            .field("kind", &self.kind)
            .field("lba", &self.lba)
            .field("blocks", &self.blocks)
            .field("completions", &self.completions)
            .field("aborted", &self.aborted)
            .field("losses", &self.losses)
            .finish_non_exhaustive()
    }
}

enum Action {
    Submit(Kind, u64, u32),
    Abort(usize),
    /// Drop the connection: `true` a reset the initiator sees, `false` a silent cut.
    Cut(bool),
    Reconnect,
    /// The driver's data for a `Rebind`, made a while later (Seal seals it off the engine).
    Resubmit(u32),
    Logout,
}

/// What the seeds of one run did, summed to check the paths were taken.
#[derive(Default, Debug)]
struct Seen {
    reissued: u64,
    rebinds: u64,
    not_reissued: u64,
    recovery_timed_out: u64,
    losses: u64,
    ok: u64,
}

/// One connection's pair of engines and pipes.
struct Link {
    tgt: Option<target::Connection>,
    to_target: Pipe,
    to_initiator: Pipe,
    next_cmd_sn: u32,
    next_stat_sn: u32,
    /// The target's generation (its backend completions are dropped after a cut).
    generation: u64,
}

struct World {
    params: SessionParams,
    window: u32,
    dir: DirConfig,
    digests: bool,
}

impl World {
    fn codec(&self, max: u32) -> Codec {
        Codec {
            header_digest: self.digests,
            data_digest: self.digests,
            max_recv_data_segment_length: max,
        }
    }

    /// A fresh login: a target connection and an initiator connection that agree on the
    /// sequence numbers, with pipes between them.
    fn login(
        &self,
        rng: &mut Rng,
        seed: u64,
        now: Instant,
        generation: u64,
    ) -> (Link, initiator::Connection) {
        let cmd_sn = rng.next_u64() as u32;
        let stat_sn = rng.next_u64() as u32;
        let mut tcfg = target::Config::new(self.params.clone(), cmd_sn, stat_sn);
        tcfg.cmd_window = self.window;
        tcfg.nop_interval = Some(Duration::from_secs(2));
        let mut tgt = target::Connection::new(tcfg, now);
        tgt.set_next_ttt(u32::MAX - 1 - rng.below(4) as u32);
        let mut icfg = initiator::Config::new(
            self.params.clone(),
            cmd_sn,
            cmd_sn.wrapping_add(self.window - 1),
            stat_sn,
        );
        icfg.nop_interval = Some(Duration::from_millis(500));
        icfg.nop_timeout = Duration::from_secs(1);
        let ini = initiator::Connection::new(icfg, now);
        let salt = seed ^ (generation << 8);
        let link = Link {
            tgt: Some(tgt),
            to_target: Pipe::new(
                self.dir.clone(),
                salt ^ 1,
                self.codec(self.params.target_max_recv_data_segment_length),
            ),
            to_initiator: Pipe::new(
                self.dir.clone(),
                salt ^ 2,
                self.codec(self.params.initiator_max_recv_data_segment_length),
            ),
            next_cmd_sn: cmd_sn,
            next_stat_sn: stat_sn,
            generation,
        };
        (link, ini)
    }
}

fn write_data(kind: Kind, lba: u64, blocks: u32) -> Bytes {
    let start = lba * BLOCK;
    let len = u64::from(blocks) * BLOCK;
    let one: Vec<u8> = (start..start + len).map(pattern).collect();
    match kind {
        Kind::Write | Kind::BoundWrite => Bytes::from(one),
        // Verify data then write data: both the disk's content.
        Kind::CompareAndWrite => Bytes::from([one.clone(), one].concat()),
        Kind::Read | Kind::TestUnitReady => Bytes::new(),
    }
}

/// Runs one seeded workload; `Err` says what went wrong.
fn run(seed: u64, seen: &mut Seen) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let trace = std::env::var("SESSION_SIM_TRACE").is_ok();
    let max_burst = pick(&mut rng, &[512, 4096, 16384, 65536]);
    let first_burst = pick(&mut rng, &[512, 4096, 65536]).min(max_burst);
    let params = SessionParams {
        initial_r2t: rng.chance(0.5),
        immediate_data: rng.chance(0.5),
        max_burst_length: max_burst,
        first_burst_length: first_burst,
        max_outstanding_r2t: pick(&mut rng, &[1, 2, 4]),
        initiator_max_recv_data_segment_length: pick(&mut rng, &[512, 8192, 65536]),
        target_max_recv_data_segment_length: pick(&mut rng, &[512, 8192, 65536]),
        ..SessionParams::default()
    };
    let world = World {
        window: pick(&mut rng, &[1, 2, 8, 32]),
        digests: rng.chance(0.3),
        dir: DirConfig {
            delay: Duration::from_micros(rng.below(10_000)),
            loss: if rng.chance(0.3) {
                LossModel::Bernoulli {
                    p: rng.next_f64() * 0.03,
                }
            } else {
                LossModel::None
            },
            ..DirConfig::default()
        },
        params,
    };
    let recovery = Duration::from_millis(u64::from(pick(&mut rng, &[300, 1000, 5000])));

    let base = Instant::now();
    let mut now = Duration::ZERO;
    let at = |d: Duration| base + d;
    let mut generation = 0u64;
    let (mut link, ini) = world.login(&mut rng, seed, at(now), generation);
    let mut s = Session::new(
        session::Config {
            recovery_timeout: Some(recovery),
            idempotent: is_idempotent,
        },
        ini,
    );

    // The workload.
    let mut actions: BTreeMap<Duration, Vec<Action>> = BTreeMap::new();
    let n = 5 + rng.below(40) as usize;
    let span = Duration::from_millis(200 + rng.below(3000));
    let sizes = [
        512,
        first_burst,
        first_burst + 512,
        max_burst,
        2 * max_burst + 512,
    ];
    for i in 0..n {
        let t = Duration::from_micros(rng.below(span.as_micros() as u64));
        let kind = match rng.below(10) {
            0..=2 => Kind::Read,
            3..=4 => Kind::Write,
            5 => Kind::BoundWrite,
            6..=7 => Kind::CompareAndWrite,
            _ => Kind::TestUnitReady,
        };
        let bytes = u64::from(pick(&mut rng, &sizes)).clamp(512, 128 * 1024);
        let blocks = match kind {
            // COMPARE AND WRITE's NUMBER OF LOGICAL BLOCKS is one byte.
            Kind::CompareAndWrite => bytes.div_ceil(BLOCK).min(255) as u32,
            Kind::TestUnitReady => 0,
            _ => bytes.div_ceil(BLOCK) as u32,
        };
        let lba = rng.below(DISK_BLOCKS - u64::from(blocks));
        actions
            .entry(t)
            .or_default()
            .push(Action::Submit(kind, lba, blocks));
        if rng.chance(0.05) {
            let later = t + Duration::from_micros(rng.below(20_000));
            actions.entry(later).or_default().push(Action::Abort(i));
        }
    }
    for _ in 0..1 + rng.below(3) {
        let when = Duration::from_micros(rng.below(span.as_micros() as u64 + 1));
        actions
            .entry(when)
            .or_default()
            .push(Action::Cut(rng.chance(0.5)));
    }
    actions
        .entry(span + Duration::from_secs(2))
        .or_default()
        .push(Action::Logout);

    let mut submitted: Vec<Submitted> = Vec::new();
    let mut by_itt: HashMap<u32, usize> = HashMap::new();
    let mut backend: BTreeMap<(Duration, u32), (u64, target::Execute)> = BTreeMap::new();
    // How often each COMPARE AND WRITE reached a target's backend.
    let mut caw_runs: HashMap<u32, u32> = HashMap::new();
    let mut logged_out = false;
    let mut reconnect_pending = false;
    let limit = Duration::from_secs(600);

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
                        let data = write_data(kind, lba, blocks);
                        let (d, binding) = match kind {
                            Kind::Read => (
                                Data::Read {
                                    buf: BytesMut::new(),
                                    len: blocks * BLOCK as u32,
                                },
                                Binding::Free,
                            ),
                            Kind::TestUnitReady => (Data::None, Binding::Free),
                            Kind::BoundWrite => (Data::Write(data.clone()), Binding::Bound),
                            Kind::Write | Kind::CompareAndWrite => {
                                (Data::Write(data.clone()), Binding::Free)
                            }
                        };
                        let cdb = if kind == Kind::TestUnitReady {
                            [0u8; 16]
                        } else {
                            cdb16(kind.opcode(), lba, blocks)
                        };
                        let cmd = Command {
                            lun: 0,
                            cdb,
                            data: d,
                            timed: false,
                        };
                        let itt = s.alloc_itt();
                        match s.submit_as(at(now), itt, cmd, binding) {
                            Ok(itt) => {
                                if by_itt.insert(itt, submitted.len()).is_some() {
                                    return Err(format!("ITT {itt:#x} handed out twice"));
                                }
                                submitted.push(Submitted {
                                    kind,
                                    lba,
                                    blocks,
                                    data,
                                    completions: 0,
                                    aborted: false,
                                    losses: u32::from(s.lost().is_some()),
                                });
                            }
                            Err(SubmitError::RecoveryTimedOut { .. }) if s.recovery_expired() => {}
                            Err(e) => return Err(format!("submit refused: {e}")),
                        }
                    }
                    Action::Abort(i) => {
                        if let Some((&itt, _)) = by_itt.iter().find(|(_, &j)| j == i) {
                            if submitted[i].completions == 0 {
                                submitted[i].aborted = true;
                                s.abort(at(now), itt);
                            }
                        }
                    }
                    Action::Cut(reset) => {
                        if s.lost().is_none() {
                            // The TCP connection is gone both ways; the target's side of
                            // it goes with it.
                            link.to_target.queue.clear();
                            link.to_target.cut = true;
                            link.to_initiator.queue.clear();
                            link.to_initiator.cut = true;
                            link.tgt = None;
                            if reset {
                                s.peer_closed(at(now));
                            }
                        }
                    }
                    Action::Reconnect => {
                        reconnect_pending = false;
                        generation += 1;
                        let (l, ini) = world.login(&mut rng, seed, at(now), generation);
                        link = l;
                        if trace {
                            eprintln!("{now:?} attach generation {generation}");
                        }
                        s.attach(at(now), ini);
                    }
                    Action::Resubmit(itt) => {
                        let i = *by_itt.get(&itt).ok_or("resubmit of an unknown ITT")?;
                        // Refused when the connection it was made for is gone meanwhile:
                        // another Rebind comes with the next one.
                        let _ = s.resubmit(at(now), itt, Data::Write(submitted[i].data.clone()));
                    }
                    Action::Logout => {
                        if s.lost().is_some() || reconnect_pending || s.tasks_in_flight() > 0 {
                            // Log out of a live, quiet connection: wait for the recovery and
                            // the reissued commands.
                            actions
                                .entry(now + Duration::from_millis(100))
                                .or_default()
                                .push(Action::Logout);
                        } else {
                            logged_out = true;
                            s.logout(at(now));
                        }
                    }
                }
            }
        }
        // Backend completions due.
        while let Some((&(when, itt), _)) = backend.first_key_value() {
            if when > now {
                break;
            }
            let (_, (g, x)) = backend.pop_first().ok_or("backend")?;
            if g != link.generation {
                continue;
            }
            let Some(tgt) = link.tgt.as_mut() else {
                continue;
            };
            let (lba, blocks) = parse16(&x.cdb);
            let start = lba * BLOCK;
            let len = u64::from(blocks) * BLOCK;
            let resp = match x.cdb[0] {
                0x8a | 0x89 => {
                    let want = if x.cdb[0] == 0x89 { 2 * len } else { len };
                    if x.data_out.len() as u64 != want {
                        return Err(format!(
                            "ITT {itt:#x}: backend got {} data-out bytes, want {want}",
                            x.data_out.len()
                        ));
                    }
                    for (k, b) in x.data_out.iter().enumerate() {
                        if *b != pattern(start + (k as u64 % len)) {
                            return Err(format!("ITT {itt:#x}: data-out byte {k} corrupted"));
                        }
                    }
                    Response::good(Bytes::new())
                }
                0x88 => Response::good(Bytes::from(
                    (start..start + len).map(pattern).collect::<Vec<u8>>(),
                )),
                _ => Response::good(Bytes::new()),
            };
            tgt.complete(itt, resp);
        }
        // Timers.
        if s.poll_timeout().is_some_and(|d| d <= at(now)) {
            s.handle_timeout(at(now));
        }
        if let Some(tgt) = link.tgt.as_mut() {
            if tgt.poll_timeout().is_some_and(|d| d <= at(now)) {
                tgt.handle_timeout(at(now));
            }
        }
        // The wire, both ways, and the events, until quiet at this instant.
        loop {
            let mut moved = false;
            while let Some(p) = s.poll_transmit() {
                if let Header::ScsiCommand(c) = &p.header {
                    if !c.immediate && !link.to_target.cut {
                        if c.cmd_sn != link.next_cmd_sn {
                            return Err(format!(
                                "CmdSN {} sent, expected {}",
                                c.cmd_sn, link.next_cmd_sn
                            ));
                        }
                        link.next_cmd_sn = link.next_cmd_sn.wrapping_add(1);
                    }
                }
                if trace {
                    eprintln!("{now:?} I->T {:?}", p.header);
                }
                link.to_target.send(now, &p)?;
                moved = true;
            }
            if let Some(tgt) = link.tgt.as_mut() {
                while let Some(p) = tgt.poll_transmit() {
                    let sn = match &p.header {
                        Header::ScsiResponse(h) => Some(h.stat_sn),
                        Header::DataIn(h) if h.status_present => Some(h.stat_sn),
                        Header::NopIn(h) if h.itt != u32::MAX => Some(h.stat_sn),
                        Header::TaskMgmtResponse(h) => Some(h.stat_sn),
                        Header::LogoutResponse(h) => Some(h.stat_sn),
                        Header::Reject(h) => Some(h.stat_sn),
                        _ => None,
                    };
                    if let Some(sn) = sn {
                        if sn != link.next_stat_sn {
                            return Err(format!(
                                "StatSN {sn} sent, expected {}",
                                link.next_stat_sn
                            ));
                        }
                        link.next_stat_sn = link.next_stat_sn.wrapping_add(1);
                    }
                    if let Header::Reject(r) = &p.header {
                        return Err(format!(
                            "target rejected a PDU ({:?}): {:02x?}",
                            r.reason,
                            &p.data[..p.data.len().min(48)]
                        ));
                    }
                    if trace {
                        eprintln!("{now:?} T->I {:?}", p.header);
                    }
                    link.to_initiator.send(now, &p)?;
                    moved = true;
                }
            }
            while let Some(p) = link.to_target.due(now) {
                if let Some(tgt) = link.tgt.as_mut() {
                    tgt.handle_pdu(at(now), &Disk, p);
                }
                moved = true;
            }
            while let Some(p) = link.to_initiator.due(now) {
                s.handle_pdu(at(now), p);
                moved = true;
            }
            if let Some(tgt) = link.tgt.as_mut() {
                while let Some(e) = tgt.poll_event() {
                    if let target::Event::Execute(x) = e {
                        if x.cdb[0] == 0x89 {
                            let runs = caw_runs.entry(x.itt).or_default();
                            *runs += 1;
                            if *runs > 1 {
                                return Err(format!(
                                    "COMPARE AND WRITE ITT {:#x} ran twice",
                                    x.itt
                                ));
                            }
                        }
                        let lat = Duration::from_micros(rng.below(2000));
                        backend.insert((now + lat, x.itt), (link.generation, x));
                    }
                    moved = true;
                }
            }
            while let Some(e) = s.poll_event() {
                moved = true;
                match e {
                    session::Event::Completed { itt, result } => {
                        let i = *by_itt
                            .get(&itt)
                            .ok_or(format!("completion for unknown ITT {itt:#x}"))?;
                        let sub = &mut submitted[i];
                        sub.completions += 1;
                        let idempotent = is_idempotent(sub.kind.opcode());
                        match result {
                            Ok(c) => {
                                seen.ok += 1;
                                let read =
                                    (sub.kind == Kind::Read).then_some((sub.lba, sub.blocks));
                                check_good(itt, c.status, read, &c.data)?;
                            }
                            // Ended at the loss, before the session reports the loss.
                            Err(Failure::NotReissued { opcode, .. })
                                if !idempotent && s.lost().is_some() && opcode == 0x89 =>
                            {
                                seen.not_reissued += 1;
                            }
                            Err(Failure::RecoveryTimedOut { .. }) if sub.losses > 0 => {
                                seen.recovery_timed_out += 1;
                            }
                            Err(Failure::Task(TaskError::Aborted(AbortedBy::AbortTask)))
                                if sub.aborted => {}
                            Err(Failure::Task(TaskError::ConnectionLost(_))) if logged_out => {}
                            Err(e) => {
                                return Err(format!("ITT {itt:#x} ({sub:?}): {e}"));
                            }
                        }
                    }
                    session::Event::Reissued { itt } => {
                        seen.reissued += 1;
                        let i = *by_itt.get(&itt).ok_or("reissue of an unknown ITT")?;
                        if !is_idempotent(submitted[i].kind.opcode()) {
                            return Err(format!("ITT {itt:#x}: not idempotent, reissued"));
                        }
                    }
                    session::Event::Rebind { itt } => {
                        seen.rebinds += 1;
                        let i = *by_itt.get(&itt).ok_or("rebind of an unknown ITT")?;
                        if rng.chance(0.5) {
                            let data = submitted[i].data.clone();
                            s.resubmit(at(now), itt, Data::Write(data))
                                .map_err(|e| format!("resubmit: {e}"))?;
                        } else {
                            let later = now + Duration::from_micros(rng.below(50_000));
                            actions
                                .entry(later)
                                .or_default()
                                .push(Action::Resubmit(itt));
                        }
                    }
                    session::Event::ConnectionClosed(e) => {
                        if trace {
                            eprintln!("{now:?} connection closed: {e}");
                        }
                        if e.reason == CloseReason::Logout {
                            continue;
                        }
                        seen.losses += 1;
                        for sub in submitted.iter_mut().filter(|x| x.completions == 0) {
                            sub.losses += 1;
                        }
                        link.tgt = None;
                        // The driver's reconnect: sometimes slower than the recovery
                        // timeout.
                        let delay =
                            Duration::from_micros(rng.below(recovery.as_micros() as u64 * 3 / 2));
                        reconnect_pending = true;
                        actions
                            .entry(now + delay)
                            .or_default()
                            .push(Action::Reconnect);
                    }
                    session::Event::TaskManagement { .. } => {}
                    other => return Err(format!("unexpected session event {other:?}")),
                }
            }
            if !moved {
                break;
            }
        }
        if s.ended().is_some() && actions.is_empty() {
            break;
        }
        let next = [
            actions.first_key_value().map(|(t, _)| *t),
            backend.first_key_value().map(|((t, _), _)| *t),
            link.to_target.queue.front().map(|(t, _)| *t),
            link.to_initiator.queue.front().map(|(t, _)| *t),
            s.poll_timeout().map(|d| d - base),
            link.tgt
                .as_ref()
                .and_then(|t| t.poll_timeout())
                .map(|d| d - base),
        ]
        .into_iter()
        .flatten()
        .min();
        let Some(next) = next else {
            return Err("stalled: nothing left to happen, yet not ended".into());
        };
        now = next.max(now);
        if now > limit {
            return Err(format!(
                "still running after {limit:?} of virtual time ({} tasks in the session)",
                s.tasks_in_flight()
            ));
        }
    }

    for (i, sub) in submitted.iter().enumerate() {
        if sub.completions != 1 {
            return Err(format!(
                "command {i} ({sub:?}) completed {} times",
                sub.completions
            ));
        }
    }
    if s.tasks_in_flight() != 0 {
        return Err(format!(
            "{} tasks leaked in the session",
            s.tasks_in_flight()
        ));
    }
    let c = s.connection();
    if c.tasks_in_flight() != 0 || c.tmfs_in_flight() != 0 {
        return Err("tasks leaked in the last connection".into());
    }
    if let Some(tgt) = &link.tgt {
        if tgt.tasks_in_flight() != 0 {
            return Err(format!(
                "{} tasks leaked at the target",
                tgt.tasks_in_flight()
            ));
        }
    }
    Ok(())
}

#[test]
fn every_command_completes_exactly_once_across_reconnections_and_none_runs_twice_unless_idempotent()
{
    let mut seen = Seen::default();
    let seeds = run_seeds("SESSION_SIM_SEED", 300, |seed| run(seed, &mut seen));
    let Some(seeds) = seeds else {
        eprintln!("{seen:?}");
        return;
    };
    // The paths under test were taken, not skipped by an unlucky workload.
    eprintln!("{seen:?}");
    assert!(seen.losses >= seeds, "{seen:?}");
    assert!(seen.reissued > 0, "no reissue: {seen:?}");
    assert!(seen.rebinds > 0, "no rebind: {seen:?}");
    assert!(
        seen.not_reissued > 0,
        "no COMPARE AND WRITE caught: {seen:?}"
    );
    assert!(seen.recovery_timed_out > 0, "no recovery timeout: {seen:?}");
}
