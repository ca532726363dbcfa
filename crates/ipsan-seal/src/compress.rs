//! Compression inside Seal's chunk framing (issue 28; docs/seal.md §4b): negotiated at login
//! with `X-org.ipsan.Compression`, off unless both ends ask.
//!
//! Each chunk is compressed (LZ4 block format) *before* it is sealed and decompressed *after*
//! its tag verified, and stored raw when compression does not shrink it. A compressed transfer
//! carries its lengths in a header whose every field is authenticated (each chunk's associated
//! data holds its stored length and its flag, framing version 2):
//!
//! ```text
//! sealed = base counter (8) || N (4) || E_0 || ... || E_{n-1} || C_0 || ... || C_{n-1}
//! E_i    = stored length of C_i (4, big-endian; bit 31 set: C_i is LZ4-compressed) || T_i
//! ```
//!
//! `N` is the plaintext length (bound in every chunk's associated data, as in version 1), n =
//! ceil(N / chunk). A receiver checks every length before it opens anything (a raw chunk is
//! exactly its plaintext length, a compressed one shorter, and they add up to the transfer),
//! verifies each chunk's tag before it decompresses it, and decompresses into exactly the
//! chunk's plaintext length: an output that would be longer or shorter is refused
//! ([`crate::OpenError::Decompression`]), so no input can make it write more than `N` bytes
//! (no decompression bomb).
//!
//! On the iSCSI side a write's ExpectedDataTransferLength (RFC 7143 §11.3.4) is the length of
//! the compressed transfer, which only the sender knows; a read asks for
//! [`max_wire_len`] (every chunk raw) and the target sends what the compressed form takes,
//! reporting the rest as an underflow (§11.4.5.1) that the initiator cuts its Data-In by.

use crate::frame::{Framing, COUNTER_LEN};

/// The login key: the initiator offers `lz4,none`, the target answers `lz4` or `none`.
pub const KEY_COMPRESSION: &str = "X-org.ipsan.Compression";

/// How chunks are compressed in a session.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum Compression {
    /// Not compressed (framing version 1, unchanged).
    #[default]
    None,
    /// LZ4 block format per chunk (framing version 2).
    Lz4,
}

impl Compression {
    /// The name in the login key.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Compression::None => "none",
            Compression::Lz4 => "lz4",
        }
    }

    /// The codec named `name` in the login key.
    #[must_use]
    pub fn from_name(name: &str) -> Option<Compression> {
        match name {
            "none" => Some(Compression::None),
            "lz4" => Some(Compression::Lz4),
            _ => None,
        }
    }

    /// Whether chunks are compressed.
    #[must_use]
    pub const fn is_on(self) -> bool {
        !matches!(self, Compression::None)
    }
}

impl std::fmt::Display for Compression {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Bytes before the per-chunk entries: the base counter and the plaintext length.
pub const HEAD_LEN: usize = COUNTER_LEN + 4;
/// Bytes of a chunk's stored length (and flag) in its entry.
pub const LEN_LEN: usize = 4;
/// Bit 31 of a stored length: the chunk is LZ4-compressed.
pub const FLAG_LZ4: u32 = 1 << 31;

/// Bytes of one chunk's entry (stored length, tag).
pub(crate) fn entry_len(framing: &Framing) -> usize {
    LEN_LEN + framing.cipher.tag_len()
}

/// Bytes of the header of a compressed transfer of `plain` bytes.
pub(crate) fn header_len(framing: &Framing, plain: usize) -> Option<usize> {
    framing
        .chunks(plain)
        .checked_mul(entry_len(framing))?
        .checked_add(HEAD_LEN)
}

/// The longest compressed transfer of `plain` bytes (every chunk stored raw): what a read
/// asks for as ExpectedDataTransferLength. 0 stays 0.
#[must_use]
pub fn max_wire_len(framing: &Framing, plain: usize) -> Option<usize> {
    if plain == 0 {
        return Some(0);
    }
    header_len(framing, plain)?.checked_add(plain)
}

/// The plaintext length whose [`max_wire_len`] is exactly `wire`, if any.
#[must_use]
pub fn plain_len_of_max(framing: &Framing, wire: usize) -> Option<usize> {
    if wire == 0 {
        return Some(0);
    }
    let body = wire.checked_sub(HEAD_LEN)?;
    let per = framing.chunk_size as usize + entry_len(framing);
    let n = body.div_ceil(per);
    let plain = body.checked_sub(n.checked_mul(entry_len(framing))?)?;
    (plain > 0 && max_wire_len(framing, plain) == Some(wire)).then_some(plain)
}

/// The shortest possible compressed transfer (one chunk of one stored byte): a write's
/// ExpectedDataTransferLength below it (and above 0) carries no transfer.
#[must_use]
pub fn min_wire_len(framing: &Framing) -> usize {
    HEAD_LEN + entry_len(framing) + 1
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Cipher;

    #[test]
    fn plain_len_of_max_inverts_max_wire_len_for_every_small_length() {
        for cipher in Cipher::ALL {
            let f = Framing {
                cipher,
                chunk_size: 64,
            };
            let mut valid = std::collections::HashSet::new();
            for n in 0..2000 {
                let s = max_wire_len(&f, n).unwrap();
                assert_eq!(plain_len_of_max(&f, s), Some(n), "{cipher} n={n}");
                valid.insert(s);
            }
            for s in 0..2000 {
                if !valid.contains(&s) {
                    assert_eq!(plain_len_of_max(&f, s), None, "{cipher} s={s}");
                }
            }
        }
    }

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for c in [Compression::None, Compression::Lz4] {
            assert_eq!(Compression::from_name(c.name()), Some(c));
        }
        assert_eq!(Compression::from_name("zstd"), None);
    }
}
