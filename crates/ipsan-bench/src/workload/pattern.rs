//! What `ipsan bench` writes and checks: the `--verify` pattern (each block stamped with its
//! LBA and the seed), `--data-file` payloads, the deterministic operation stream and the
//! bitmap of units written in a run.

use super::*;

/// Write data from a file (`ipsan bench --data-file`, e.g. a disk image, to measure
/// compression on real data): the region's unit `u` gets the payload's bytes
/// `[u * block_size mod len ..][.. block_size]`, so the region holds the file from its start,
/// repeated if the region is larger. Its length must be a multiple of the block size.
#[derive(Clone)]
pub struct Payload(Bytes);

impl std::fmt::Debug for Payload {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Payload({} bytes)", self.0.len())
    }
}

impl Payload {
    /// A payload of `bytes`.
    #[must_use]
    pub fn new(bytes: Bytes) -> Self {
        Payload(bytes)
    }

    /// Bytes in the payload.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether the payload is empty.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// What unit `unit` of `block_size` bytes holds (no copy). The length was checked
    /// against the block size before the run ([`Payload::fits`]).
    pub(super) fn unit(&self, unit: u64, block_size: u64) -> Bytes {
        let len = self.0.len() as u64;
        let start = (unit.wrapping_mul(block_size) % len.max(1)) as usize;
        let end = (start + block_size as usize).min(self.0.len());
        self.0.slice(start..end)
    }

    /// Whether units of `block_size` bytes tile the payload.
    pub(super) fn fits(&self, block_size: u64) -> bool {
        !self.0.is_empty() && block_size > 0 && (self.0.len() as u64) % block_size == 0
    }

    /// Checks a read of unit `unit` (LBA `lba`, blocks of `block_len` bytes) against it.
    pub(super) fn check(
        &self,
        buf: &[u8],
        unit: u64,
        block_size: u64,
        lba: u64,
        block_len: usize,
    ) -> Result<(), BenchError> {
        let want = self.unit(unit, block_size);
        match buf.iter().zip(want.iter()).position(|(a, b)| a != b) {
            None if buf.len() == want.len() => Ok(()),
            None => Err(BenchError::VerifyData {
                lba: lba + (buf.len().min(want.len()) / block_len.max(1)) as u64,
            }),
            Some(i) => Err(BenchError::VerifyData {
                lba: lba + (i / block_len.max(1)) as u64,
            }),
        }
    }
}

/// SplitMix64 (Steele et al.): a tiny, well-mixed hash for offsets, mix and pattern seeds.
pub fn splitmix64(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Fill `buf` (a whole number of `block_len` blocks starting at `lba`) with the verify
/// pattern: each block starts with its LBA and the seed (little-endian u64s), and the rest is a
/// xorshift stream seeded from both, so a block written to the wrong place, a stale block and a
/// flipped bit are all caught, and the first bad LBA can be named.
pub fn fill_pattern(buf: &mut [u8], lba: u64, block_len: usize, seed: u64) {
    for (i, block) in buf.chunks_mut(block_len).enumerate() {
        let l = lba + i as u64;
        block[..8].copy_from_slice(&l.to_le_bytes());
        block[8..16].copy_from_slice(&seed.to_le_bytes());
        let mut x = splitmix64(seed ^ splitmix64(l)) | 1;
        for w in block[16..].chunks_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            let b = x.to_le_bytes();
            w.copy_from_slice(&b[..w.len()]);
        }
    }
}

/// Check `buf` against the pattern; returns the first bad LBA with what its stamp said.
pub fn check_pattern(
    buf: &[u8],
    lba: u64,
    block_len: usize,
    seed: u64,
    scratch: &mut Vec<u8>,
) -> Result<(), BenchError> {
    scratch.resize(block_len, 0);
    for (i, block) in buf.chunks(block_len).enumerate() {
        let l = lba + i as u64;
        fill_pattern(scratch, l, block_len, seed);
        if block != scratch.as_slice() {
            let word = |r: std::ops::Range<usize>| {
                let mut b = [0u8; 8];
                b.copy_from_slice(&block[r]);
                u64::from_le_bytes(b)
            };
            return Err(BenchError::Verify {
                lba: l,
                seed,
                found_lba: word(0..8),
                found_seed: word(8..16),
            });
        }
    }
    Ok(())
}

/// One operation the generator hands out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Op {
    pub read: bool,
    /// Index of the block-size unit within the region.
    pub unit: u64,
}

/// Deterministic operation stream: op `i` depends only on `(workload, i)`.
#[derive(Debug, Clone)]
pub struct Generator {
    mode: RwMode,
    mix: u8,
    seed: u64,
    units: u64,
}

impl Generator {
    pub fn new(w: &Workload, units: u64) -> Self {
        Self {
            mode: w.mode,
            mix: w.mix_read_percent.min(100),
            seed: w.seed,
            units: units.max(1),
        }
    }

    pub fn op(&self, i: u64) -> Op {
        let read = match self.mode {
            RwMode::Read | RwMode::RandRead => true,
            RwMode::Write | RwMode::RandWrite => false,
            RwMode::Rw | RwMode::RandRw => {
                splitmix64(self.seed ^ i.wrapping_mul(0x2545_f491_4f6c_dd1d)) % 100
                    < u64::from(self.mix)
            }
        };
        let unit = if self.mode.is_random() {
            splitmix64(self.seed.wrapping_add(i)) % self.units
        } else {
            i % self.units
        };
        Op { read, unit }
    }
}

/// Bitmap of units written in this run (for `--verify` with mixed workloads).
#[derive(Debug)]
pub(super) struct Written(Vec<AtomicU64>);

impl Written {
    pub(super) fn new(units: u64) -> Self {
        Self((0..units.div_ceil(64)).map(|_| AtomicU64::new(0)).collect())
    }
    pub(super) fn set(&self, u: u64) {
        if let Some(w) = self.0.get((u / 64) as usize) {
            w.fetch_or(1 << (u % 64), Ordering::Relaxed);
        }
    }
    pub(super) fn get(&self, u: u64) -> bool {
        self.0
            .get((u / 64) as usize)
            .is_some_and(|w| w.load(Ordering::Relaxed) & (1 << (u % 64)) != 0)
    }
}
