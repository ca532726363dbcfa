//! Chunk framing: how a command's data of N plaintext bytes becomes `sealed_len(N)` bytes on the
//! wire, and what each chunk's associated data binds.
//!
//! ```text
//! sealed = C_0 || C_1 || ... || C_{n-1} || base counter (8, big-endian) || T_0 || ... || T_{n-1}
//! ```
//! `C_i` is chunk `i` encrypted in place (same length as its plaintext; every chunk is
//! `chunk_size` bytes except possibly the last), `T_i` its tag, and chunk `i`'s nonce counter is
//! `base + i`. Keeping ciphertext contiguous and tags in a trailer lets both sides seal and open in
//! place in one buffer with no copies: the receiver verifies and decrypts, then truncates the
//! trailer and hands the same buffer to the backend.
//!
//! The iSCSI layer sets ExpectedDataTransferLength (RFC 7143 §11.3.4) to `sealed_len(N)` and
//! moves the sealed bytes with the ordinary R2T / Data-Out / Data-In machinery (§11.7, §11.8),
//! never looking inside. The CDB keeps describing plaintext blocks.

use crate::cipher::Cipher;

/// Which end of the iSCSI session this is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Seals WRITE data (initiator→target), opens READ data.
    Initiator,
    /// Seals READ data (target→initiator), opens WRITE data.
    Target,
}

/// Which way the data flows. Each direction has its own key, IV and counter.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// Initiator to target: WRITE data (Data-Out, immediate and unsolicited data).
    InitiatorToTarget,
    /// Target to initiator: READ data (Data-In).
    TargetToInitiator,
}

impl Direction {
    pub(crate) const fn id(self) -> u8 {
        match self {
            Direction::InitiatorToTarget => 1,
            Direction::TargetToInitiator => 2,
        }
    }
}

/// What a command's data is bound to. Both sides build it from the SCSI Command PDU
/// (RFC 7143 §11.3) and its CDB; a chunk sealed under one binding does not open under another,
/// so it cannot be moved to another LUN, block range or command.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Binding {
    /// The LUN field of the SCSI Command PDU, as its raw 8 bytes read big-endian.
    pub lun: u64,
    /// First logical block (from the CDB; 0 for commands that address no blocks).
    pub lba: u64,
    /// Transfer length in logical blocks (from the CDB; 0 for commands that address no blocks).
    pub blocks: u32,
    /// CDB operation code (e.g. 0x2a WRITE(10), 0x88 READ(16)).
    pub opcode: u8,
    /// Initiator Task Tag (RFC 7143 §11.2.1.8): binds the data to one command instance, so the
    /// data of two in-flight commands to the same blocks cannot be swapped.
    pub task_tag: u32,
}

impl Binding {
    /// The binding of one command's data: the PDU's 8-byte LUN field, its task tag, and the
    /// CDB's opcode and `(lba, blocks)` extent. Both sides read the extent from the CDB with
    /// the same rule, `ipsan_scsi::cdb::extent` (docs/seal.md §4); Seal itself knows no CDB.
    #[must_use]
    pub fn of_command(lun: u64, task_tag: u32, opcode: u8, (lba, blocks): (u64, u32)) -> Self {
        Binding {
            lun,
            lba,
            blocks,
            opcode,
            task_tag,
        }
    }
}

/// Bytes of associated data per chunk.
pub(crate) const AAD_LEN: usize = 48;
/// Version of this framing, bound into the AAD.
pub(crate) const VERSION: u8 = 1;
/// Bytes of the explicit base counter in the trailer.
pub const COUNTER_LEN: usize = 8;

/// The per-chunk associated data (all integers big-endian):
///
/// | offset | bytes | field |
/// |---|---|---|
/// | 0 | 1 | framing version (1) |
/// | 1 | 1 | cipher id |
/// | 2 | 1 | direction (1 = initiator→target, 2 = target→initiator) |
/// | 3 | 1 | CDB opcode |
/// | 4 | 4 | Initiator Task Tag |
/// | 8 | 8 | LUN |
/// | 16 | 8 | LBA |
/// | 24 | 4 | transfer length in blocks |
/// | 28 | 4 | plaintext transfer length in bytes |
/// | 32 | 4 | chunk index |
/// | 36 | 4 | chunk count |
/// | 40 | 8 | chunk counter (base + index) |
#[allow(clippy::too_many_arguments)]
pub(crate) fn aad(
    cipher: Cipher,
    dir: Direction,
    b: &Binding,
    plain_len: u32,
    index: u32,
    count: u32,
    counter: u64,
) -> [u8; AAD_LEN] {
    let mut a = [0u8; AAD_LEN];
    a[0] = VERSION;
    a[1] = cipher.id();
    a[2] = dir.id();
    a[3] = b.opcode;
    a[4..8].copy_from_slice(&b.task_tag.to_be_bytes());
    a[8..16].copy_from_slice(&b.lun.to_be_bytes());
    a[16..24].copy_from_slice(&b.lba.to_be_bytes());
    a[24..28].copy_from_slice(&b.blocks.to_be_bytes());
    a[28..32].copy_from_slice(&plain_len.to_be_bytes());
    a[32..36].copy_from_slice(&index.to_be_bytes());
    a[36..40].copy_from_slice(&count.to_be_bytes());
    a[40..48].copy_from_slice(&counter.to_be_bytes());
    a
}

/// Framing parameters fixed at login: cipher and chunk size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Framing {
    /// The negotiated cipher.
    pub cipher: Cipher,
    /// The negotiated chunk size in bytes.
    pub chunk_size: u32,
}

impl Framing {
    /// Number of chunks for `plain` bytes.
    pub fn chunks(&self, plain: usize) -> usize {
        plain.div_ceil(self.chunk_size as usize)
    }

    /// Sealed length of `plain` plaintext bytes (0 stays 0: no data, nothing to seal).
    /// Returns `None` if it overflows `usize`.
    pub fn sealed_len(&self, plain: usize) -> Option<usize> {
        if plain == 0 {
            return Some(0);
        }
        let tags = self.chunks(plain).checked_mul(self.cipher.tag_len())?;
        plain.checked_add(COUNTER_LEN)?.checked_add(tags)
    }

    /// Plaintext length of a `sealed`-byte transfer, or `None` if no plaintext length seals to
    /// exactly `sealed` bytes.
    pub fn plain_len(&self, sealed: usize) -> Option<usize> {
        if sealed == 0 {
            return Some(0);
        }
        let body = sealed.checked_sub(COUNTER_LEN)?;
        let per = self.chunk_size as usize + self.cipher.tag_len();
        // n chunks carry between (n-1)*chunk+1 and n*chunk plaintext bytes.
        let n = body.div_ceil(per);
        let plain = body.checked_sub(n.checked_mul(self.cipher.tag_len())?)?;
        (plain > 0 && self.sealed_len(plain) == Some(sealed)).then_some(plain)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn plain_len_inverts_sealed_len_for_every_small_length() {
        for cipher in Cipher::ALL {
            let f = Framing {
                cipher,
                chunk_size: 64,
            };
            let mut valid = std::collections::HashSet::new();
            for n in 0..2000 {
                let s = f.sealed_len(n).unwrap();
                assert_eq!(f.plain_len(s), Some(n), "{cipher} n={n}");
                valid.insert(s);
            }
            for s in 0..2000 {
                if !valid.contains(&s) {
                    assert_eq!(f.plain_len(s), None, "{cipher} s={s}");
                }
            }
        }
    }

    #[test]
    fn sealed_len_of_one_mebibyte_in_64k_chunks_adds_16_tags_and_a_counter() {
        let f = Framing {
            cipher: Cipher::Aes256Gcm,
            chunk_size: 65536,
        };
        assert_eq!(f.sealed_len(1 << 20), Some((1 << 20) + 8 + 16 * 16));
    }
}
