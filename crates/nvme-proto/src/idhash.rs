//! The hash of the maps keyed by small integers on every command's path: command IDs (a
//! queue's commands in flight, its transfer tags) and block request tags. std's SipHash
//! guards maps whose keys an attacker picks freely from a large space; these keys are 16-bit
//! CIDs and TTAGs, and tags this crate hands out itself, at most a queue's depth of them at
//! once, so one multiplication by an odd constant (a bijection: distinct keys never share a
//! hash) is enough and SipHash's few tens of nanoseconds per lookup, several per command on
//! each side, are not (about 1-3 % of either side's CPU per 4 KiB command in
//! docs/results/nvme-speed-4). The low bits hashbrown indexes by mix only the key's low bits:
//! CIDs chosen to collide there share a group per 2^(16 - bits) keys, a bounded probe.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// Fibonacci hashing's multiplier, 2^64 / φ (odd).
const K: u64 = 0x9e37_79b9_7f4a_7c15;

/// A [`Hasher`] for integer keys (see the module documentation).
#[derive(Debug, Default, Clone, Copy)]
pub struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Not used by the integer keys below; any other key still hashes all of its bytes.
        for &b in bytes {
            self.0 = (self.0.rotate_left(8) ^ u64::from(b)).wrapping_mul(K);
        }
    }

    fn write_u16(&mut self, n: u16) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(K);
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0 ^ u64::from(n)).wrapping_mul(K);
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(K);
    }
}

/// A map keyed by CIDs, TTAGs or tags, hashed with [`IdHasher`].
pub type IdMap<K, V> = HashMap<K, V, BuildHasherDefault<IdHasher>>;

#[cfg(test)]
mod tests {
    use super::*;
    use std::hash::BuildHasher;

    #[test]
    fn distinct_cids_hash_apart_and_maps_work() {
        let b = BuildHasherDefault::<IdHasher>::default();
        let mut seen = std::collections::HashSet::new();
        for cid in 0..=u16::MAX {
            assert!(seen.insert(b.hash_one(cid)), "CID {cid} shares a hash");
        }
        let mut m: IdMap<u16, u32> = IdMap::default();
        for cid in (0..4096u16).rev() {
            m.insert(cid, u32::from(cid) * 3);
        }
        assert_eq!(m.len(), 4096);
        assert_eq!(m.get(&17), Some(&51));
        assert_eq!(m.remove(&4095), Some(12285));
        assert!(!m.contains_key(&4095));
    }
}
