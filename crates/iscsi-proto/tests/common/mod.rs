//! What the simulation tests share: a memory disk whose content is a pattern, CDBs, and one
//! direction of a TCP connection on a virtual clock through the pure `ipsan_wan` impairment
//! model (loss delivered the way TCP delivers it: late and in order).

use std::collections::VecDeque;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use ipsan_wan::model::Impairment;
use ipsan_wan::pipeline::{Packet, Stage, Verdict};
use ipsan_wan::rng::Rng;
use ipsan_wan::DirConfig;
use iscsi_proto::engine::target::{LunDirectory, Sizing};
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
