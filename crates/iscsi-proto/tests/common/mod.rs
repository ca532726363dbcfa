//! What the simulation tests share: a memory disk whose content is a pattern, CDBs, one
//! direction of a TCP connection on a virtual clock through the pure `ipsan_wan` impairment
//! model (loss delivered the way TCP delivers it: late and in order), and the pieces the
//! sessions-of-several-connections simulations build their runs from (connection configs,
//! random parameters and commands, the target's answer to a command, Data-Out PDUs).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipsan_wan::model::Impairment;
use ipsan_wan::pipeline::{Packet, Stage, Verdict};
use ipsan_wan::rng::Rng;
use ipsan_wan::DirConfig;
use iscsi_proto::engine::initiator::{self, Command, Connection, Data};
use iscsi_proto::engine::mcs::{self, Spread};
use iscsi_proto::engine::target::session::{ConnId, Session as TargetSession};
use iscsi_proto::engine::target::{self, Event, Execute, LunDirectory, Response, Sizing};
use iscsi_proto::params::SessionParams;
use iscsi_wire::header::{DataOut, ScsiCommand, TaskAttr};
use iscsi_wire::{Codec, Pdu};

pub const BLOCK: u64 = 512;
pub const DISK_BLOCKS: u64 = 1 << 16;
/// TCP's retransmission of a lost segment, as the receiver sees it: this much later.
pub const RTO: Duration = Duration::from_millis(200);

/// The disk's content never changes: writes write the same pattern, and the backend checks
/// every byte it receives, so both directions' data is verified.
pub fn pattern(offset: u64) -> u8 {
    (offset ^ (offset >> 9) ^ (offset >> 17)) as u8
}

/// `len` bytes of the disk's pattern from byte `start`.
pub fn pattern_bytes(start: u64, len: usize) -> Bytes {
    (0..len as u64).map(|k| pattern(start + k)).collect()
}

pub fn cdb16(op: u8, lba: u64, blocks: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

pub fn parse16(cdb: &[u8]) -> (u64, u32) {
    let mut lba = [0u8; 8];
    lba.copy_from_slice(&cdb[2..10]);
    (
        u64::from_be_bytes(lba),
        u32::from_be_bytes([cdb[10], cdb[11], cdb[12], cdb[13]]),
    )
}

pub struct Disk;

impl LunDirectory for Disk {
    fn exists(&self, lun: u64) -> bool {
        lun == 0
    }
    fn size(&self, _itt: u32, _lun: u64, cdb: &[u8], _edtl: u32) -> Sizing {
        let need = match cdb[0] {
            0x8a => u64::from(parse16(cdb).1) * BLOCK,
            // COMPARE AND WRITE: the verify data, then the write data (SBC-4 §5.3).
            0x89 => 2 * u64::from(parse16(cdb).1) * BLOCK,
            _ => 0,
        };
        Sizing {
            need,
            early: None,
            transfer: None,
            decoded: None,
        }
    }
}

/// One direction of the TCP connection.
pub struct Pipe {
    model: Impairment,
    codec: Codec,
    pub queue: VecDeque<(Duration, Bytes)>,
    last: Duration,
    pub cut: bool,
}

impl Pipe {
    pub fn new(cfg: DirConfig, seed: u64, codec: Codec) -> Self {
        Self {
            model: Impairment::new(cfg, seed),
            codec,
            queue: VecDeque::new(),
            last: Duration::ZERO,
            cut: false,
        }
    }

    pub fn send(&mut self, now: Duration, pdu: &Pdu) -> Result<(), String> {
        let mut b = BytesMut::new();
        self.codec
            .encode(pdu, &mut b)
            .map_err(|e| format!("encode {:?}: {e}", pdu.header.opcode()))?;
        if self.cut {
            return Ok(());
        }
        let mut pkt = Packet::with_capacity(b.len().min(9000));
        pkt.set_len(b.len().min(9000));
        let n = now.as_nanos() as u64;
        pkt.reset(n);
        let at = match self.model.process(n, &mut pkt) {
            Verdict::Pass => Duration::from_nanos(pkt.release_at),
            // Lost: TCP retransmits it; everything behind waits (in order).
            Verdict::Drop(_) => Duration::from_nanos(n) + self.model.config().delay + RTO,
        };
        let at = at.max(self.last);
        self.last = at;
        self.queue.push_back((at, b.freeze()));
        Ok(())
    }

    pub fn due(&mut self, now: Duration) -> Option<Pdu> {
        if self.queue.front().is_some_and(|(t, _)| *t <= now) {
            let (_, b) = self.queue.pop_front()?;
            let mut buf = BytesMut::from(&b[..]);
            let pdu = self.codec.decode(&mut buf).ok().flatten()?;
            return Some(pdu);
        }
        None
    }
}

pub fn pick(rng: &mut Rng, xs: &[u32]) -> u32 {
    xs[rng.below(xs.len() as u64) as usize]
}

/// The good status of command `itt` and, for a read of `blocks` at `lba`, its data: every byte
/// the disk's pattern.
pub fn check_good(
    itt: u32,
    status: u8,
    read: Option<(u64, u32)>,
    data: &[u8],
) -> Result<(), String> {
    if status != 0 {
        return Err(format!("ITT {itt:#x}: status {status:#x}"));
    }
    if let Some((lba, blocks)) = read {
        let start = lba * BLOCK;
        if data.len() as u64 != u64::from(blocks) * BLOCK {
            return Err(format!("ITT {itt:#x}: short read"));
        }
        if let Some(k) = (0..data.len()).find(|&k| data[k] != pattern(start + k as u64)) {
            return Err(format!("ITT {itt:#x}: read byte {k} wrong"));
        }
    }
    Ok(())
}

/// Runs `run` for seeds 0..`<VAR>S` (default `default`) and fails naming every failed seed;
/// the number of seeds run. With `<VAR>` set, only that seed (a replay): `None`.
pub fn run_seeds(
    var: &str,
    default: u64,
    mut run: impl FnMut(u64) -> Result<(), String>,
) -> Option<u64> {
    if let Ok(s) = std::env::var(var) {
        let seed: u64 = s.parse().unwrap_or_else(|_| panic!("{var} is a number"));
        if let Err(e) = run(seed) {
            panic!("seed {seed}: {e}");
        }
        return None;
    }
    let seeds: u64 = std::env::var(format!("{var}S"))
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(default);
    let failed: Vec<String> = (0..seeds)
        .filter_map(|seed| run(seed).err().map(|e| format!("seed {seed}: {e}")))
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {seeds} workloads failed (replay one with {var}=<seed>):\n{}",
        failed.len(),
        failed
            .iter()
            .take(20)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
    Some(seeds)
}

/// The target engine's configuration of connection `cid`: CmdSN and StatSN to start from, a
/// CmdSN window of `depth`.
pub fn target_config(
    p: &SessionParams,
    cid: u16,
    cmd_sn: u32,
    stat_sn: u32,
    depth: u32,
) -> target::Config {
    let mut c = target::Config::new(p.clone(), cmd_sn, stat_sn);
    c.cid = cid;
    c.cmd_window = depth;
    c
}

/// The initiator's connection as its login left it: the window (CmdSN, ExpCmdSN, MaxCmdSN)
/// and the StatSN the Login Response carried; no NOP-Outs.
pub fn initiator_conn(
    p: &SessionParams,
    now: Instant,
    window: (u32, u32, u32),
    stat_sn: u32,
) -> Connection {
    let (cmd_sn, exp, max) = window;
    let mut c = initiator::Config::new(p.clone(), cmd_sn, max, stat_sn);
    c.exp_cmd_sn = exp;
    c.nop_interval = None;
    Connection::new(c, now)
}

/// A READ(16) of `blocks` blocks at `lba` on LUN 0, untimed.
pub fn read(lba: u64, blocks: u32) -> Command {
    Command {
        lun: 0,
        cdb: cdb16(0x88, lba, blocks),
        data: Data::Read {
            buf: bytes::BytesMut::new(),
            len: blocks * BLOCK as u32,
        },
        timed: false,
    }
}

/// A random READ(16) or WRITE(16) of 1–16 blocks in the first 4,096 (a write carries the
/// disk's pattern): whether it writes, its LBA and blocks, and the command.
pub fn random_io(rng: &mut Rng) -> (bool, u64, u32, Command) {
    let write = rng.chance(0.5);
    let blocks = 1 + rng.below(16) as u32;
    let lba = rng.below(1 << 12);
    let len = blocks * BLOCK as u32;
    let data = if write {
        Data::Write(pattern_bytes(lba * BLOCK, len as usize))
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
    (write, lba, blocks, cmd)
}

/// Random data-phase parameters, drawn in this order: InitialR2T, ImmediateData,
/// FirstBurstLength, MaxBurstLength (one of `max_bursts`), MaxOutstandingR2T, and one
/// MaxRecvDataSegmentLength for both directions.
pub fn random_params(rng: &mut Rng, p: &mut SessionParams, max_bursts: &[u32]) {
    p.initial_r2t = rng.chance(0.5);
    p.immediate_data = rng.chance(0.5);
    p.first_burst_length = pick(rng, &[512, 2048, 4096]);
    p.max_burst_length = pick(rng, max_bursts);
    p.max_outstanding_r2t = pick(rng, &[1, 2]);
    let mrdsl = pick(rng, &[512, 1024, 4096]);
    p.initiator_max_recv_data_segment_length = mrdsl;
    p.target_max_recv_data_segment_length = mrdsl;
}

/// The first CmdSN of a run: near the wrap of 32-bit serial numbers now and then.
pub fn random_first_sn(rng: &mut Rng) -> u32 {
    if rng.chance(0.3) {
        u32::MAX - rng.below(40) as u32
    } else {
        rng.next_u64() as u32
    }
}

/// The disk's answer to a command the target engine handed out: a write's data must be the
/// pattern; a read gets the pattern.
pub fn answer(x: &Execute) -> Result<Response, String> {
    let (lba, blocks) = parse16(&x.cdb);
    let want = pattern_bytes(lba * BLOCK, (u64::from(blocks) * BLOCK) as usize);
    Ok(if x.write {
        if x.data_out != want {
            return Err(format!("ITT {:#x}: write data wrong", x.itt));
        }
        Response::good(Bytes::new())
    } else {
        Response::good(want)
    })
}

/// A Data-Out PDU on LUN 0 (ExpStatSN 0).
pub fn data_out(itt: u32, ttt: u32, data_sn: u32, offset: u32, final_: bool, data: Bytes) -> Pdu {
    Pdu::new(
        DataOut {
            final_,
            lun: 0,
            itt,
            ttt,
            exp_stat_sn: 0,
            data_sn,
            buffer_offset: offset,
        },
        data,
    )
}

/// The commands the target session hands out for execution, and the connection of each.
pub fn executes(s: &mut TargetSession) -> Vec<(ConnId, Execute)> {
    let mut v = Vec::new();
    while let Some((id, ev)) = s.poll_event() {
        if let Event::Execute(x) = ev {
            v.push((id, x));
        }
    }
    v
}

/// An initiator session of two connections (CIDs 0 and 1, StatSN 100 and 500), window
/// 10..=41, as the fixed tests use it.
pub fn two_connections(spread: Spread, p: &SessionParams) -> (mcs::Session, Instant) {
    let now = Instant::now();
    let mut s = mcs::Session::new(
        mcs::Config {
            spread,
            command_timeout: None,
        },
        0,
        initiator_conn(p, now, (10, 10, 41), 100),
    );
    s.add_connection(now, 1, initiator_conn(p, now, (10, 10, 41), 500))
        .unwrap();
    (s, now)
}

/// A target session of `n` connections (CIDs 0..n) starting at CmdSN `first_sn` with a
/// window of `depth`, each connection's first StatSN drawn at random: the session and each
/// connection's id and StatSN, in CID order.
pub fn target_session(
    rng: &mut Rng,
    p: &SessionParams,
    n: usize,
    first_sn: u32,
    depth: u32,
    now: Instant,
) -> Result<(TargetSession, Vec<(ConnId, u32)>), String> {
    let mut conns = Vec::new();
    let mut s: Option<TargetSession> = None;
    for cid in 0..n {
        let stat = rng.next_u64() as u32;
        let cfg = target_config(p, cid as u16, first_sn, stat, depth);
        let id = match s.as_mut() {
            None => {
                let (sess, id) = TargetSession::new(cfg, now);
                s = Some(sess);
                id
            }
            Some(sess) => {
                sess.add_connection(cfg, now, &Disk)
                    .map_err(|e| format!("add connection {cid}: {e}"))?
                    .id
            }
        };
        conns.push((id, stat));
    }
    Ok((s.ok_or("no session")?, conns))
}

/// A READ(16) or WRITE(16) SCSI Command on LUN 0 (final, simple, ExpStatSN 0).
pub fn scsi_command(itt: u32, cmd_sn: u32, write: bool, lba: u64, blocks: u32) -> ScsiCommand {
    ScsiCommand {
        immediate: false,
        final_: true,
        read: !write,
        write,
        attr: TaskAttr::SIMPLE,
        lun: 0,
        itt,
        expected_data_transfer_length: blocks * BLOCK as u32,
        cmd_sn,
        exp_stat_sn: 0,
        cdb: cdb16(if write { 0x8a } else { 0x88 }, lba, blocks),
    }
}
