#![allow(clippy::unwrap_used, clippy::expect_used)]

//! The initiator's session of several connections (`engine::mcs`, RFC 7143 §4.2; issue 28)
//! against the real target engine's session of several connections, in memory.
//!
//! The seeded simulation submits reads and writes (immediate, unsolicited and solicited data)
//! to a session of 1–4 connections spread by least outstanding bytes, in turn, or by the
//! driver's (random) reports of what each socket holds; each
//! connection is a pair of FIFOs (TCP), and every step moves one PDU on a random connection
//! in a random direction, or completes a random running command at the target. Connections
//! are added mid-run (a login with the session's TSIH and a new CID) and logged out one at a
//! time (reason 1, after their tasks drained). It checks that every command completes exactly
//! once with the right data (every written byte checked at the target, every read byte at the
//! initiator); that no command leaves with a CmdSN past the MaxCmdSN the target had sent on
//! any connection (the one window, §4.2.2.1); that CmdSNs are the session's (each used once,
//! ascending per connection); that a task's PDUs stay on its connection both ways
//! (allegiance); that the target never rejects or ignores anything, the initiator's tail
//! probes (half the seeds: a NOP-Out asking no answer after each burst) included; and that
//! every table is empty at the end. A failure names its seed: `MCS_INI_SIM_SEED=<n> cargo test -p
//! iscsi-proto --test mcs_initiator_sim`.

#[allow(dead_code)]
mod common;

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use bytes::Bytes;
use common::{
    answer, cdb16, check_good, initiator_conn, pattern_bytes, pick, random_first_sn, random_io,
    random_params, read, run_seeds, target_config, two_connections, Disk, BLOCK,
};
use ipsan_wan::rng::Rng;
use iscsi_proto::engine::initiator::{self, Command, Data};
use iscsi_proto::engine::mcs::{self, Spread};
use iscsi_proto::engine::target;
use iscsi_proto::engine::target::session::{ConnId, Session as TargetSession};
use iscsi_proto::engine::CloseReason;
use iscsi_proto::params::SessionParams;
use iscsi_proto::seq::{sn_le, sn_lt};
use iscsi_wire::{Header, Pdu};

/// MaxCmdSN of a target PDU that carries the window.
fn max_cmd_sn(h: &Header) -> Option<u32> {
    Some(match h {
        Header::ScsiResponse(r) => r.max_cmd_sn,
        Header::DataIn(d) => d.max_cmd_sn,
        Header::R2t(r) => r.max_cmd_sn,
        Header::TaskMgmtResponse(r) => r.max_cmd_sn,
        Header::LogoutResponse(r) => r.max_cmd_sn,
        Header::NopIn(n) => n.max_cmd_sn,
        _ => return None,
    })
}

/// One connection: both engines' ends of it and the two FIFOs between them.
struct Link {
    cid: u16,
    id: ConnId,
    to_target: VecDeque<Pdu>,
    to_initiator: VecDeque<Pdu>,
    /// Logged out: both ends are being taken down.
    leaving: bool,
    last_cmd_sn: Option<u32>,
}

struct Cmd {
    cid: Option<u16>,
    write: bool,
    lba: u64,
    blocks: u32,
    completions: u32,
}

/// What the seeds did, summed, to check the paths were taken: connections joined mid-run,
/// connections logged out, commands that went out on a connection other than 0.
static JOINED: AtomicU64 = AtomicU64::new(0);
static LOGGED_OUT: AtomicU64 = AtomicU64::new(0);
static NOT_ON_FIRST: AtomicU64 = AtomicU64::new(0);
/// Tail probes (NOP-Outs asking no answer) the initiator sent, in the seeds that turned them on.
static PROBES: AtomicU64 = AtomicU64::new(0);

/// What every login of a run shares.
struct World<'a> {
    p: &'a SessionParams,
    depth: u32,
    now: Instant,
}

impl World<'_> {
    /// A login with the session's TSIH on connection `cid`: both ends add it. The MaxCmdSN its
    /// Login Response carried.
    fn join(
        &self,
        tgt: &mut TargetSession,
        ini: &mut mcs::Session,
        links: &mut Vec<Link>,
        rng: &mut Rng,
        cid: u16,
    ) -> Result<u32, String> {
        let stat = rng.next_u64() as u32;
        let a = tgt
            .add_connection(
                target_config(self.p, cid, 0, stat, self.depth),
                self.now,
                &Disk,
            )
            .map_err(|e| format!("target: join {cid}: {e}"))?;
        let w = tgt.window();
        let (cmd_sn, _, _) = ini.window();
        ini.add_connection(
            self.now,
            cid,
            initiator_conn(
                self.p,
                self.now,
                (cmd_sn, w.exp_cmd_sn(), w.max_cmd_sn()),
                stat,
            ),
        )
        .map_err(|e| format!("initiator: join {cid}: {e}"))?;
        links.push(Link {
            cid,
            id: a.id,
            to_target: VecDeque::new(),
            to_initiator: VecDeque::new(),
            leaving: false,
            last_cmd_sn: None,
        });
        Ok(w.max_cmd_sn())
    }
}

/// One seeded workload; `Err` says what went wrong.
#[allow(clippy::too_many_lines)]
fn run(seed: u64) -> Result<(), String> {
    let mut rng = Rng::new(seed);
    let max_conns = 1 + rng.below(4) as u16;
    let start_conns = 1 + rng.below(u64::from(max_conns)) as u16;
    let depth = pick(&mut rng, &[1, 2, 4, 8, 32]);
    let spread =
        [Spread::LeastBytes, Spread::RoundRobin, Spread::LeastQueued][rng.below(3) as usize];
    let mut p = SessionParams {
        max_connections: u32::from(max_conns),
        ..SessionParams::default()
    };
    random_params(&mut rng, &mut p, &[4096, 8192]);
    let first_sn = random_first_sn(&mut rng);
    let now = Instant::now();

    // The leading login, then the others with the session's TSIH.
    let stat = rng.next_u64() as u32;
    let (mut tgt, id0) = TargetSession::new(target_config(&p, 0, first_sn, stat, depth), now);
    let w = tgt.window();
    let window = (first_sn, w.exp_cmd_sn(), w.max_cmd_sn());
    let mut ini = mcs::Session::new(
        mcs::Config {
            spread,
            command_timeout: None,
        },
        0,
        initiator_conn(&p, now, window, stat),
    );
    // Half the seeds send a tail probe after every burst that ends with a command or Data-Out
    // (at once: time does not pass here), which the target must take without a word.
    let probes = rng.chance(0.5);
    if probes {
        ini.set_tail_probe(Some(std::time::Duration::ZERO));
    }
    let mut links = vec![Link {
        cid: 0,
        id: id0,
        to_target: VecDeque::new(),
        to_initiator: VecDeque::new(),
        leaving: false,
        last_cmd_sn: None,
    }];
    let mut next_cid = 1u16;
    // The highest MaxCmdSN the initiator heard on any connection (a Login Response included).
    let mut max_sent = window.2;
    let world = World { p: &p, depth, now };
    for _ in 1..start_conns {
        let m = world.join(&mut tgt, &mut ini, &mut links, &mut rng, next_cid)?;
        next_cid += 1;
        if sn_lt(max_sent, m) {
            max_sent = m;
        }
    }

    let total = 120 + rng.below(100) as usize;
    let mut cmds: HashMap<u32, Cmd> = HashMap::new();
    let mut submitted = 0usize;
    let mut settled = 0usize;
    let mut running: Vec<(ConnId, target::Execute)> = Vec::new();
    let mut cmd_sns: HashSet<u32> = HashSet::new();
    let mut used: HashSet<u16> = HashSet::new();
    let mut logouts = 0;
    let mut idle = 0u32;
    for _ in 0..2_000_000u32 {
        if settled == total {
            break;
        }
        let mut progressed = false;
        let c = rng.below(links.len() as u64) as usize;
        match rng.below(24) {
            // The host submits a command.
            0..=3 if submitted < total => {
                let (write, lba, blocks, cmd) = random_io(&mut rng);
                if spread == Spread::LeastQueued && rng.chance(0.7) {
                    // The driver's report of one socket: what waits to cross it, at a rate
                    // (0: unknown, the connection counts by its outstanding bytes).
                    let link = &links[c];
                    let report = mcs::QueueReport {
                        bytes: link
                            .to_target
                            .iter()
                            .map(|p| 48 + p.data.len() as u64)
                            .sum(),
                        per_sec: [0, 1000, 1 << 20][rng.below(3) as usize],
                    };
                    ini.report_queue(link.cid, report);
                }
                let itt = ini.submit(now, cmd).map_err(|e| format!("submit: {e}"))?;
                cmds.insert(
                    itt,
                    Cmd {
                        cid: None,
                        write,
                        lba,
                        blocks,
                        completions: 0,
                    },
                );
                submitted += 1;
                progressed = true;
            }
            // The initiator sends one PDU on a connection.
            4..=8 => {
                let link = &mut links[c];
                if let Some(pdu) = ini.poll_transmit(link.cid) {
                    if let Header::ScsiCommand(h) = &pdu.header {
                        if !sn_le(h.cmd_sn, max_sent) {
                            return Err(format!(
                                "CmdSN {} sent past MaxCmdSN {max_sent}",
                                h.cmd_sn
                            ));
                        }
                        if !cmd_sns.insert(h.cmd_sn) {
                            return Err(format!("CmdSN {} used twice", h.cmd_sn));
                        }
                        if link.last_cmd_sn.is_some_and(|l| !sn_lt(l, h.cmd_sn)) {
                            return Err(format!(
                                "connection {}: CmdSN {} after {:?}",
                                link.cid, h.cmd_sn, link.last_cmd_sn
                            ));
                        }
                        link.last_cmd_sn = Some(h.cmd_sn);
                        let x = cmds
                            .get_mut(&h.itt)
                            .ok_or_else(|| format!("unknown ITT {:#x} sent", h.itt))?;
                        if link.cid != 0 {
                            NOT_ON_FIRST.fetch_add(1, Ordering::Relaxed);
                        }
                        if x.cid.replace(link.cid).is_some() {
                            return Err(format!("ITT {:#x} sent twice", h.itt));
                        }
                        if ini.allegiance(h.itt) != Some(link.cid) {
                            return Err(format!("ITT {:#x}: allegiance elsewhere", h.itt));
                        }
                    }
                    if let Header::DataOut(d) = &pdu.header {
                        if cmds.get(&d.itt).and_then(|x| x.cid) != Some(link.cid) {
                            return Err(format!("ITT {:#x}: Data-Out on {}", d.itt, link.cid));
                        }
                    }
                    if let Header::NopOut(n) = &pdu.header {
                        if !probes || n.itt != u32::MAX || n.ttt != u32::MAX || !n.immediate {
                            return Err(format!("unexpected NOP-Out {n:?}"));
                        }
                        PROBES.fetch_add(1, Ordering::Relaxed);
                    }
                    link.to_target.push_back(pdu);
                    // Written: a burst that ended here arms the probe; the time is now.
                    ini.flushed(link.cid, now);
                    ini.handle_timeout(now);
                    progressed = true;
                }
            }
            // The target reads one PDU from a connection.
            9..=13 => {
                if let Some(pdu) = links[c].to_target.pop_front() {
                    tgt.handle_pdu(links[c].id, now, &Disk, pdu);
                    progressed = true;
                }
            }
            // A running command completes at the target.
            14..=16 if !running.is_empty() => {
                let k = rng.below(running.len() as u64) as usize;
                let (id, x) = running.swap_remove(k);
                let resp = answer(&x)?;
                if !tgt.complete(id, x.itt, resp) {
                    return Err(format!("ITT {:#x}: completion refused", x.itt));
                }
                progressed = true;
            }
            // The target sends one PDU on a connection.
            17..=19 => {
                let link = &mut links[c];
                if let Some(pdu) = tgt.poll_transmit(link.id) {
                    match &pdu.header {
                        Header::Reject(r) => return Err(format!("target rejected: {r:?}")),
                        Header::ScsiResponse(_) | Header::DataIn(_) | Header::R2t(_) => {
                            let itt = pdu.header.itt();
                            if cmds.get(&itt).and_then(|x| x.cid) != Some(link.cid) {
                                return Err(format!("ITT {itt:#x}: answered on {}", link.cid));
                            }
                        }
                        _ => {}
                    }
                    link.to_initiator.push_back(pdu);
                    progressed = true;
                }
            }
            // The initiator reads one PDU from a connection.
            20 | 21 => {
                let cid = links[c].cid;
                if let Some(pdu) = links[c].to_initiator.pop_front() {
                    if let Some(m) = max_cmd_sn(&pdu.header) {
                        if sn_lt(max_sent, m) {
                            max_sent = m;
                        }
                    }
                    ini.handle_pdu(cid, now, pdu);
                    progressed = true;
                }
            }
            // A connection joins the session.
            22 if ini.open_connections() < usize::from(max_conns) && next_cid < 12 => {
                let m = world.join(&mut tgt, &mut ini, &mut links, &mut rng, next_cid)?;
                next_cid += 1;
                if sn_lt(max_sent, m) {
                    max_sent = m;
                }
                JOINED.fetch_add(1, Ordering::Relaxed);
                progressed = true;
            }
            // A connection logs out, the session goes on over the others.
            23 if logouts < 2
                && !links[c].leaving
                && links.iter().filter(|l| !l.leaving).count() > 1 =>
            {
                if !ini.logout_connection(now, links[c].cid) {
                    return Err(format!("logout of {} refused", links[c].cid));
                }
                links[c].leaving = true;
                logouts += 1;
                progressed = true;
            }
            _ => {}
        }
        // Target events: commands to run, on the connection they came on.
        while let Some((id, ev)) = tgt.poll_event() {
            if let target::Event::Execute(x) = ev {
                let on = links.iter().find(|l| l.id == id).map(|l| l.cid);
                let sent_on = cmds.get(&x.itt).and_then(|c| c.cid);
                if on.is_none() || on != sent_on {
                    return Err(format!(
                        "ITT {:#x} runs on {on:?}, sent on {sent_on:?}",
                        x.itt
                    ));
                }
                running.push((id, x));
            }
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
                    if cid != x.cid {
                        return Err(format!(
                            "ITT {itt:#x} ended on {cid:?}, sent on {:?}",
                            x.cid
                        ));
                    }
                    let done = result.map_err(|e| format!("ITT {itt:#x}: {e}"))?;
                    let read = (!x.write).then_some((x.lba, x.blocks));
                    check_good(itt, done.status, read, &done.data)?;
                    settled += 1;
                }
                mcs::Event::ConnectionClosed { cid, error, .. } => {
                    if error.reason != CloseReason::Logout {
                        return Err(format!("connection {cid} closed: {error}"));
                    }
                    used.insert(cid);
                    LOGGED_OUT.fetch_add(1, Ordering::Relaxed);
                }
                other => return Err(format!("initiator: {other:?}")),
            }
        }
        // A logged-out connection whose FIFOs are empty goes on both sides.
        let mut k = 0;
        while k < links.len() {
            let l = &links[k];
            if l.leaving
                && used.contains(&l.cid)
                && l.to_target.is_empty()
                && l.to_initiator.is_empty()
                && tgt.connection(l.id).is_none_or(|t| !t.has_transmit())
            {
                tgt.remove(l.id, now, &Disk);
                ini.remove(now, l.cid);
                links.remove(k);
                progressed = true;
            } else {
                k += 1;
            }
        }
        idle = if progressed { 0 } else { idle + 1 };
        if idle > 20_000 {
            return Err(format!(
                "stuck: {settled} of {total} settled, {} in flight, window {:?}",
                ini.tasks_in_flight(),
                ini.window()
            ));
        }
    }
    if settled != total {
        return Err(format!("{settled} of {total} settled"));
    }
    if let Some((itt, _)) = cmds.iter().find(|(_, x)| x.completions != 1) {
        return Err(format!("ITT {itt:#x} not completed once"));
    }
    if ini.tasks_in_flight() != 0 || !running.is_empty() {
        return Err("tasks left".into());
    }
    if cmd_sns.len() != total {
        return Err(format!("{} CmdSNs for {total} commands", cmd_sns.len()));
    }
    let w = tgt.window();
    if w.exp_cmd_sn() != first_sn.wrapping_add(total as u32) {
        return Err(format!(
            "target ExpCmdSN {} after {total} commands from {first_sn}",
            w.exp_cmd_sn()
        ));
    }
    Ok(())
}

#[test]
fn accepts_commands_spread_over_one_to_four_connections_exactly_once_within_one_window() {
    if run_seeds("MCS_INI_SIM_SEED", 200, run).is_some() {
        let seen =
            [&JOINED, &LOGGED_OUT, &NOT_ON_FIRST, &PROBES].map(|c| c.load(Ordering::Relaxed));
        assert!(
            seen.iter().all(|n| *n > 0),
            "joined, logged out, commands not on connection 0, tail probes: {seen:?}"
        );
    }
}

/// A session of two connections (CIDs 0 and 1), window 10..=41, as the fixed tests use it.
fn two(spread: Spread) -> (mcs::Session, Instant) {
    let p = SessionParams {
        max_connections: 2,
        ..SessionParams::default()
    };
    two_connections(spread, &p)
}

#[test]
fn spreads_each_command_to_the_connection_with_the_fewest_outstanding_bytes() {
    let (mut s, now) = two(Spread::LeastBytes);
    let big = s.submit(now, read(0, 128)).unwrap();
    let big_on = s.allegiance(big).unwrap();
    // 64 KiB outstanding there: the next small reads all go to the other connection.
    let small: Vec<u16> = (0..4)
        .map(|k| {
            let itt = s.submit(now, read(1000 + k, 8)).unwrap();
            s.allegiance(itt).unwrap()
        })
        .collect();
    assert!(small.iter().all(|c| *c != big_on), "{big_on} {small:?}");
    assert_eq!(s.outstanding_bytes(big_on), 48 + 65536);
    assert_eq!(
        s.window().0,
        15,
        "five CmdSNs from the session's one sequence"
    );
}

fn write(lba: u64, blocks: u32) -> Command {
    Command {
        lun: 0,
        cdb: cdb16(0x8a, lba, blocks),
        data: Data::Write(pattern_bytes(lba * BLOCK, blocks as usize * BLOCK as usize)),
        timed: false,
    }
}

/// Issue 28, 0.1 % loss: the target runs writes in CmdSN order, so a write's status waits for
/// every earlier command, and outstanding bytes look alike on both connections while one of
/// them (its window just halved after a loss) still holds 256 KiB unsent. LeastQueued reads
/// that from the sockets' reports and keeps new writes off it until it drains; LeastBytes
/// splits them evenly, so every other write waits behind the slow socket.
#[test]
fn spreads_writes_away_from_a_connection_whose_socket_is_backed_up() {
    let place = |spread: Spread| -> Vec<u16> {
        let (mut s, now) = two(spread);
        // The same 32 KiB outstanding on both (completed by neither: they wait in order).
        let a = s.submit(now, write(0, 64)).unwrap();
        let b = s.submit(now, write(64, 64)).unwrap();
        assert_ne!(s.allegiance(a), s.allegiance(b));
        // CID 0 has 256 KiB not yet delivered at 1 MB/s; CID 1 delivered everything and
        // carries 4 MB/s.
        s.report_queue(
            0,
            mcs::QueueReport {
                bytes: 256 << 10,
                per_sec: 1_000_000,
            },
        );
        s.report_queue(
            1,
            mcs::QueueReport {
                bytes: 0,
                per_sec: 4_000_000,
            },
        );
        (0..8)
            .map(|k| {
                let itt = s.submit(now, write(1000 + k * 64, 64)).unwrap();
                s.allegiance(itt).unwrap()
            })
            .collect()
    };
    let queued = place(Spread::LeastQueued);
    // 0.29 s of data ahead on CID 0; CID 1 takes 32 KiB writes at 4 MB/s (8 ms each) until
    // its own backlog (placed since the report) passes that: all eight.
    assert_eq!(queued, vec![1; 8], "least-queued: {queued:?}");
    let even = place(Spread::LeastBytes);
    assert_eq!(
        even.iter().filter(|c| **c == 0).count(),
        4,
        "least-bytes splits evenly: {even:?}"
    );
}

/// Issue 28, a clean 1 Gbit/s link: the sockets' rates differ only by noise there, and
/// spreading by their reports moved 8 connections' writes and reads at 0.64× and 0.56× of
/// spreading by outstanding bytes (docs/results/mcs-sweep-3). While the fastest socket carries
/// at most `RATES_APART` (2) times the slowest, LeastQueued spreads as LeastBytes, backlog or
/// not; the rule before sent all eight writes away from the backed-up socket here.
#[test]
fn spreads_least_queued_by_outstanding_bytes_while_the_rates_are_within_twice_each_other() {
    assert_eq!(mcs::RATES_APART, 2);
    let place = |fast: u64| -> Vec<u16> {
        let (mut s, now) = two(Spread::LeastQueued);
        let a = s.submit(now, write(0, 64)).unwrap();
        let b = s.submit(now, write(64, 64)).unwrap();
        assert_ne!(s.allegiance(a), s.allegiance(b));
        s.report_queue(
            0,
            mcs::QueueReport {
                bytes: 256 << 10,
                per_sec: 1_000_000,
            },
        );
        s.report_queue(
            1,
            mcs::QueueReport {
                bytes: 0,
                per_sec: fast,
            },
        );
        (0..8)
            .map(|k| {
                let itt = s.submit(now, write(1000 + k * 64, 64)).unwrap();
                s.allegiance(itt).unwrap()
            })
            .collect()
    };
    for fast in [1_000_000, 1_500_000, 2_000_000] {
        let on = place(fast);
        assert_eq!(
            on.iter().filter(|c| **c == 0).count(),
            4,
            "rates 1 and {} MB/s: split evenly: {on:?}",
            fast as f64 / 1e6
        );
    }
    // Past twice: the reports decide (all eight off the backed-up socket).
    assert_eq!(place(2_000_001), vec![1; 8]);
}

/// Reads queue nothing in the initiator's sockets (their data comes the other way), so the
/// rate a socket sends at says nothing about them: with empty sockets LeastQueued chooses as
/// LeastBytes does, whatever the reported rates (the 1 Gbit/s run in
/// docs/results/mcs-sweep-2, 8-connection reads, was made before this).
#[test]
fn spreads_reads_by_outstanding_bytes_whatever_each_socket_sends_at() {
    let (mut s, now) = two(Spread::LeastQueued);
    let a = s.submit(now, read(0, 128)).unwrap();
    let b = s.submit(now, read(1000, 64)).unwrap();
    let (x, y) = (s.allegiance(a).unwrap(), s.allegiance(b).unwrap());
    assert_ne!(x, y);
    // X (64 KiB outstanding) sends fast, Y (32 KiB) slowly; neither socket holds anything.
    for (cid, per_sec) in [(x, 8_000_000), (y, 1_000_000)] {
        s.report_queue(cid, mcs::QueueReport { bytes: 0, per_sec });
    }
    let c = s.submit(now, read(2000, 8)).unwrap();
    assert_eq!(s.allegiance(c), Some(y), "the fewer outstanding bytes");
}

#[test]
fn spreads_least_queued_by_outstanding_bytes_until_every_connection_reports() {
    let (mut s, now) = two(Spread::LeastQueued);
    let big = s.submit(now, read(0, 128)).unwrap();
    let big_on = s.allegiance(big).unwrap();
    // Only the other connection reports an (empty) socket: no rates to compare, so the
    // outstanding bytes decide, as LeastBytes would.
    s.report_queue(
        1 - big_on,
        mcs::QueueReport {
            bytes: 0,
            per_sec: 1_000_000,
        },
    );
    let small = s.submit(now, read(1000, 8)).unwrap();
    assert_ne!(s.allegiance(small), Some(big_on));
}

#[test]
fn spreads_round_robin_in_turn_whatever_the_sizes() {
    let (mut s, now) = two(Spread::RoundRobin);
    let on: Vec<u16> = [128, 1, 1, 1]
        .iter()
        .enumerate()
        .map(|(k, b)| {
            let itt = s.submit(now, read(k as u64 * 200, *b)).unwrap();
            s.allegiance(itt).unwrap()
        })
        .collect();
    assert_eq!(on, vec![0, 1, 0, 1]);
}

#[test]
fn holds_commands_at_the_session_window_and_sends_them_on_any_connection_once_it_opens() {
    let now = Instant::now();
    let p = SessionParams {
        max_connections: 2,
        ..SessionParams::default()
    };
    let mut s = mcs::Session::new(
        mcs::Config::default(),
        0,
        initiator_conn(&p, now, (10, 10, 11), 100),
    );
    s.add_connection(now, 1, initiator_conn(&p, now, (10, 10, 11), 500))
        .unwrap();
    let a = s.submit(now, read(0, 1)).unwrap();
    let b = s.submit(now, read(8, 1)).unwrap();
    let c = s.submit(now, read(16, 1)).unwrap();
    assert!(s.allegiance(a).is_some() && s.allegiance(b).is_some());
    assert_eq!(
        s.allegiance(c),
        None,
        "MaxCmdSN 11: the third waits in the session"
    );
    // A status on b's connection opens the window: c goes, on the connection it is chosen for
    // now.
    let on_b = s.allegiance(b).unwrap();
    let resp = iscsi_wire::header::ScsiResponse {
        itt: b,
        stat_sn: if on_b == 0 { 100 } else { 500 },
        exp_cmd_sn: 12,
        max_cmd_sn: 12,
        ..Default::default()
    };
    s.handle_pdu(on_b, now, Pdu::new(resp, Bytes::new()));
    assert!(s.allegiance(c).is_some(), "sent once the window opened");
    let cids: Vec<u16> = s.cids().collect();
    let mut sent = Vec::new();
    for cid in cids {
        while let Some(p) = s.poll_transmit(cid) {
            if let Header::ScsiCommand(h) = p.header {
                sent.push(h.cmd_sn);
            }
        }
    }
    let mut sorted = sent.clone();
    sorted.sort_unstable();
    assert_eq!(
        sorted,
        vec![10, 11, 12],
        "one CmdSN sequence over both: {sent:?}"
    );
}

#[test]
fn logs_a_connection_out_only_once_its_tasks_are_done_and_moves_a_task_whole() {
    let (mut s, now) = two(Spread::RoundRobin);
    let a = s.submit(now, read(0, 1)).unwrap();
    let b = s.submit(now, read(8, 1)).unwrap();
    assert_eq!((s.allegiance(a), s.allegiance(b)), (Some(0), Some(1)));
    for cid in [0, 1] {
        while s.poll_transmit(cid).is_some() {}
    }
    // ErrorRecoveryLevel 2's seam: b's task, listed on connection 1, moves to connection 0
    // with what it received.
    assert_eq!(s.tasks_on(1), vec![b]);
    let half = iscsi_wire::header::DataIn {
        itt: b,
        data_sn: 0,
        buffer_offset: 0,
        exp_cmd_sn: 12,
        max_cmd_sn: 41,
        ..Default::default()
    };
    s.handle_pdu(1, now, Pdu::new(half, pattern_bytes(8 * BLOCK, 256)));
    s.move_task(b, 0).unwrap();
    assert_eq!(s.tasks_on(0), vec![a, b]);
    assert_eq!(s.allegiance(b), Some(0));
    // New commands go to 0 only while 1 drains; 1 has no task left, so its Logout leaves now.
    assert!(s.logout_connection(now, 1));
    let logout = std::iter::from_fn(|| s.poll_transmit(1))
        .find_map(|p| match p.header {
            Header::LogoutRequest(l) => Some(l),
            _ => None,
        })
        .expect("a Logout on connection 1");
    assert_eq!(
        (logout.reason.0, logout.cid),
        (1, 1),
        "close the connection, CID 1"
    );
    let c = s.submit(now, read(16, 1)).unwrap();
    assert_eq!(
        s.allegiance(c),
        Some(0),
        "a draining connection takes no command"
    );
    // The rest of b's data and its status come on 0, where it lives now.
    let rest = iscsi_wire::header::DataIn {
        final_: true,
        status_present: true,
        itt: b,
        data_sn: 1,
        buffer_offset: 256,
        stat_sn: 100,
        exp_cmd_sn: 13,
        max_cmd_sn: 41,
        ..Default::default()
    };
    s.handle_pdu(0, now, Pdu::new(rest, pattern_bytes(8 * BLOCK + 256, 256)));
    let done: Vec<(u32, Option<u16>, Vec<u8>)> = std::iter::from_fn(|| s.poll_event())
        .filter_map(|e| match e {
            mcs::Event::Completed { itt, cid, result } => {
                Some((itt, cid, result.unwrap().data.to_vec()))
            }
            _ => None,
        })
        .collect();
    assert_eq!(done.len(), 1);
    assert_eq!((done[0].0, done[0].1), (b, Some(0)));
    check_good(b, 0, Some((8, 1)), &done[0].2).unwrap();
}

#[test]
fn a_cut_connection_ends_only_its_tasks_says_a_cmdsn_may_be_missing_and_the_rest_go_on() {
    let (mut s, now) = two(Spread::RoundRobin);
    let a = s.submit(now, read(0, 1)).unwrap();
    let b = s.submit(now, read(8, 1)).unwrap();
    assert_eq!((s.allegiance(a), s.allegiance(b)), (Some(0), Some(1)));
    for cid in [0, 1] {
        while s.poll_transmit(cid).is_some() {}
    }
    // Connection 0 is cut before the target acknowledged a's CmdSN (ExpCmdSN still 10).
    s.peer_closed(0, now);
    let events: Vec<mcs::Event> = std::iter::from_fn(|| s.poll_event()).collect();
    assert!(
        matches!(&events[..], [
            mcs::Event::Completed { itt, cid: Some(0), result: Err(initiator::TaskError::ConnectionLost(_)) },
            mcs::Event::ConnectionClosed { cid: 0, gap: true, .. },
        ] if *itt == a),
        "{events:?}"
    );
    // b goes on over 1, and new commands go there.
    let c = s.submit(now, read(16, 1)).unwrap();
    assert_eq!(s.allegiance(c), Some(1));
    // Good, with nothing read (an underflow of the whole length).
    let resp = iscsi_wire::header::ScsiResponse {
        itt: b,
        stat_sn: 500,
        exp_cmd_sn: 12,
        max_cmd_sn: 41,
        underflow: true,
        residual_count: 512,
        ..Default::default()
    };
    s.handle_pdu(1, now, Pdu::new(resp, Bytes::new()));
    let ev = s.poll_event();
    assert!(
        matches!(
            &ev,
            Some(mcs::Event::Completed { itt, cid: Some(1), result: Ok(_) }) if *itt == b
        ),
        "{ev:?}"
    );
    assert_eq!(s.tasks_on(1), vec![c]);
    assert_eq!(s.ended(), None);
}

#[test]
fn sends_a_command_made_for_one_connection_only_there_and_ends_it_unsent_if_that_one_goes() {
    let now = Instant::now();
    let p = SessionParams {
        max_connections: 2,
        ..SessionParams::default()
    };
    let mut s = mcs::Session::new(
        mcs::Config {
            spread: Spread::RoundRobin,
            command_timeout: None,
        },
        0,
        initiator_conn(&p, now, (10, 10, 10), 100),
    );
    s.add_connection(now, 1, initiator_conn(&p, now, (10, 10, 10), 500))
        .unwrap();
    // The driver asks where the next command goes, makes its data for that connection (Seal)
    // and submits it there.
    let first = s.pick().unwrap();
    let itt = s.alloc_itt();
    s.submit_on(now, first, itt, read(0, 1)).unwrap();
    assert_eq!(
        s.allegiance(itt),
        Some(first),
        "sent at once, where it was made for"
    );
    // MaxCmdSN 10: the next one, made for the other connection, waits; that connection ends
    // meanwhile, so it ends unsent instead of going out on another.
    let other = s.pick().unwrap();
    assert_ne!(other, first);
    let waiting = s.alloc_itt();
    s.submit_on(now, other, waiting, read(8, 1)).unwrap();
    assert_eq!(s.allegiance(waiting), None);
    s.peer_closed(other, now);
    let resp = iscsi_wire::header::ScsiResponse {
        itt,
        stat_sn: if first == 0 { 100 } else { 500 },
        exp_cmd_sn: 11,
        max_cmd_sn: 11,
        underflow: true,
        residual_count: 512,
        ..Default::default()
    };
    s.handle_pdu(first, now, Pdu::new(resp, Bytes::new()));
    let ended: Vec<(u32, Option<u16>, bool)> = std::iter::from_fn(|| s.poll_event())
        .filter_map(|e| match e {
            mcs::Event::Completed { itt, cid, result } => Some((itt, cid, result.is_ok())),
            _ => None,
        })
        .collect();
    // The waiting one ended as its connection did (not when the window next opened).
    assert_eq!(
        ended,
        vec![(waiting, None, false), (itt, Some(first), true)]
    );
    assert!(
        std::iter::from_fn(|| s.poll_transmit(first)).all(|p| p.header.itt() != waiting),
        "never sent on another connection"
    );
    let next = s.alloc_itt();
    assert_eq!(
        s.submit_on(now, other, next, read(16, 1)),
        Err(mcs::SubmitError::Invalid),
        "a closed connection takes nothing"
    );
}

#[test]
fn picks_spread_by_bytes_even_while_the_window_holds_the_commands_back() {
    let now = Instant::now();
    let p = SessionParams {
        max_connections: 2,
        ..SessionParams::default()
    };
    // MaxCmdSN below CmdSN: the window is shut, every command waits in the session.
    let mut s = mcs::Session::new(
        mcs::Config::default(),
        0,
        initiator_conn(&p, now, (10, 10, 9), 100),
    );
    s.add_connection(now, 1, initiator_conn(&p, now, (10, 10, 9), 500))
        .unwrap();
    let mut placed = Vec::new();
    for (k, blocks) in [128u32, 32, 32, 32].into_iter().enumerate() {
        let cid = s.pick().unwrap();
        let itt = s.alloc_itt();
        s.submit_on(now, cid, itt, read(k as u64 * 200, blocks))
            .unwrap();
        assert_eq!(s.allegiance(itt), None, "held by the window");
        placed.push(cid);
    }
    // 64 KiB made for one connection: the three 16 KiB ones go to the other (taking turns
    // would put one of them behind the 64 KiB).
    assert_eq!(placed[1..], [1 - placed[0]; 3], "{placed:?}");
}

/// Issue 28, 1 Gbit/s sealed writes: Seal makes a write's data for its connection (on a
/// crypto worker) between the pick and the submission, so a burst of completions has many
/// commands picked before the first is submitted. [`mcs::Session::pick`] alone sees the same
/// measure each time and sends the whole burst to one connection; `pick_for` counts each
/// pick on its connection until `unpick`, so the burst spreads as submitted commands would.
#[test]
fn picks_made_before_their_commands_are_submitted_spread_as_submitted_ones_would() {
    let burst = |reserving: bool| -> (mcs::Session, u16, Vec<u16>) {
        let (mut s, now) = two(Spread::LeastBytes);
        // 64 KiB outstanding on one connection, nothing on the other.
        let big = s.submit(now, write(0, 128)).unwrap();
        let big_on = s.allegiance(big).unwrap();
        let on = (0..4)
            .map(|_| {
                if reserving {
                    // Counted on its connection until it is submitted (not here).
                    s.pick_for(32 << 10).unwrap().cid
                } else {
                    s.pick().unwrap()
                }
            })
            .collect();
        (s, big_on, on)
    };
    let (_, big_on, herd) = burst(false);
    assert_eq!(
        herd,
        vec![1 - big_on; 4],
        "pick alone: one connection takes all"
    );
    let (s, big_on, spread) = burst(true);
    let other = 1 - big_on;
    // 32 KiB each: the other connection until it has more than the 64 KiB one.
    assert_eq!(spread, vec![other, other, big_on, other], "{spread:?}");
    assert_eq!(s.picked_bytes(other), 3 * (48 + (32 << 10)));
    assert_eq!(s.picked_bytes(big_on), 48 + (32 << 10));
}

/// `unpick` takes back exactly what `pick_for` counted, whether the command is then submitted
/// (its outstanding bytes count instead) or given up; a pick for a connection that is gone
/// changes nothing.
#[test]
fn unpick_returns_a_connections_count_to_what_its_submitted_commands_make() {
    let (mut s, now) = two(Spread::LeastBytes);
    let a = s.pick_for(32 << 10).unwrap();
    let b = s.pick_for(32 << 10).unwrap();
    assert_ne!(a.cid, b.cid, "the second pick sees the first");
    let (a_cid, b_cid) = (a.cid, b.cid);
    // `a` is submitted: its count moves from picked to outstanding.
    s.unpick(a);
    let itt = s.alloc_itt();
    s.submit_on(now, a_cid, itt, write(0, 64)).unwrap();
    assert_eq!(s.allegiance(itt), Some(a_cid));
    assert_eq!(s.picked_bytes(a_cid), 0);
    assert_eq!(s.outstanding_bytes(a_cid), 48 + (32 << 10));
    // `b` is given up (its data could not be made): nothing stays counted.
    assert_eq!(s.picked_bytes(b_cid), 48 + (32 << 10));
    s.unpick(b);
    assert_eq!((s.picked_bytes(b_cid), s.outstanding_bytes(b_cid)), (0, 0));
    // The next pick goes where the fewest bytes are: `b`'s connection.
    let c = s.pick_for(0).unwrap();
    assert_eq!(c.cid, b_cid);
    s.unpick(c);
}

/// Issue 28, sealed writes queued deeper than the target's window (docs/results/mcs-depth): a
/// command made for one connection is picked when it is made, and if the window is shut then
/// it waits there, on the connection chosen on what the sockets held at the pick. Here both
/// sockets were empty at the picks (one of them the faster), so the picks split by bytes; by
/// the time the window opens connection 0 has 256 KiB backed up (a loss halved its window),
/// and its pinned write still goes there, behind it. A pick made when the window has room
/// (`free_slots` > 0, what the driver now waits for) sees the backlog and goes to the other.
#[test]
fn a_command_picked_while_the_window_is_shut_goes_where_it_was_picked_however_that_socket_changed()
{
    let now = Instant::now();
    let p = SessionParams {
        max_connections: 2,
        ..SessionParams::default()
    };
    // MaxCmdSN 9 below CmdSN 10: shut.
    let mut s = mcs::Session::new(
        mcs::Config::default(),
        0,
        initiator_conn(&p, now, (10, 10, 9), 100),
    );
    s.add_connection(now, 1, initiator_conn(&p, now, (10, 10, 9), 500))
        .unwrap();
    let report = |s: &mut mcs::Session, cid: u16, bytes: u64, per_sec: u64| {
        s.report_queue(cid, mcs::QueueReport { bytes, per_sec });
    };
    report(&mut s, 0, 0, 4_000_000);
    report(&mut s, 1, 0, 1_000_000);
    assert_eq!(s.free_slots(), 0, "shut");
    let mut pinned = Vec::new();
    for k in 0..2u64 {
        let p = s.pick_for(32 << 10).unwrap();
        assert_eq!(s.free_slots(), 0);
        let cid = p.cid;
        s.unpick(p);
        let itt = s.alloc_itt();
        s.submit_on(now, cid, itt, write(k * 64, 64)).unwrap();
        assert_eq!(s.allegiance(itt), None, "waits for the window");
        pinned.push((itt, cid));
    }
    let on_0 = pinned.iter().find(|(_, c)| *c == 0).map(|(itt, _)| *itt);
    assert!(on_0.is_some(), "empty sockets: split by bytes {pinned:?}");
    // Connection 0's socket backs up; then a NOP-In opens the window by three.
    report(&mut s, 0, 256 << 10, 1_000_000);
    report(&mut s, 1, 0, 4_000_000);
    let nop = iscsi_wire::header::NopIn {
        itt: iscsi_wire::RESERVED_TAG,
        ttt: iscsi_wire::RESERVED_TAG,
        stat_sn: 500,
        exp_cmd_sn: 10,
        max_cmd_sn: 12,
        ..Default::default()
    };
    s.handle_pdu(1, now, Pdu::new(nop, Bytes::new()));
    assert_eq!(
        s.allegiance(on_0.unwrap()),
        Some(0),
        "the pinned write went behind the backlog"
    );
    assert_eq!(s.free_slots(), 1, "two of the three slots went to them");
    let fresh = s.pick_for(32 << 10).unwrap();
    assert_eq!(s.free_slots(), 0, "the pick holds the last slot");
    assert_eq!(fresh.cid, 1, "picked with room: away from the backlog");
    s.unpick(fresh);
    assert_eq!(s.free_slots(), 1);
}
