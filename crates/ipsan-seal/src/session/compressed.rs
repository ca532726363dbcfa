//! Sealing and opening compressed transfers (framing version 2, docs/seal.md §4b; the layout
//! is in [`crate::compress`]): compress, then seal, per chunk; verify, then decompress into
//! exactly the chunk's plaintext length.

use bytes::{Bytes, BytesMut};

use super::{Plan, SealSession};
use crate::compress::{self, FLAG_LZ4, HEAD_LEN, LEN_LEN};
use crate::error::OpenError;
use crate::frame::{aad, Binding, Direction, AAD_LEN, COUNTER_LEN};

/// Bytes of a version-2 chunk's associated data: version 1's fields, then the chunk's flag
/// (1), 3 zero bytes and its stored length (4).
pub(crate) const AAD2_LEN: usize = AAD_LEN + 8;
/// Framing version of compressed transfers, bound into every chunk's associated data.
const VERSION2: u8 = 2;

/// The most plaintext a compressed transfer bound to `b` may declare: what its command can
/// move — the CDB's transfer length in blocks of at most 4096 bytes (the largest block size
/// an ipsan LU has), twice for COMPARE AND WRITE's verify and write data — and 1 MiB for a
/// command that addresses no blocks (parameter lists, INQUIRY and the like); never more
/// than twice the LU's 64 MiB MAXIMUM TRANSFER LENGTH.
pub(crate) fn max_plain(b: &Binding) -> usize {
    const NO_BLOCKS: usize = 1 << 20;
    const CAP: usize = 128 << 20;
    if b.blocks == 0 {
        NO_BLOCKS
    } else {
        (b.blocks as usize).saturating_mul(2 * 4096).min(CAP)
    }
}

impl SealSession {
    /// Chunk `index`'s counter and version-2 associated data: `word` is its stored length
    /// with [`FLAG_LZ4`] when compressed.
    fn chunk_aad2(
        &self,
        dir: Direction,
        b: &Binding,
        plan: Plan,
        index: u32,
        word: u32,
    ) -> (u64, [u8; AAD2_LEN]) {
        let counter = plan.base.wrapping_add(u64::from(index));
        let a1 = aad(
            self.framing.cipher,
            dir,
            b,
            plan.plain_len,
            index,
            plan.count,
            counter,
        );
        let mut a = [0u8; AAD2_LEN];
        a[..AAD_LEN].copy_from_slice(&a1);
        a[0] = VERSION2;
        a[AAD_LEN] = u8::from(word & FLAG_LZ4 != 0);
        a[AAD_LEN + 4..].copy_from_slice(&(word & !FLAG_LZ4).to_be_bytes());
        (counter, a)
    }

    /// Compresses and seals `plaintext` (counters reserved in `plan`) into a fresh buffer:
    /// each chunk LZ4-compressed when that makes it shorter, stored raw otherwise.
    pub(super) fn seal_compressed(&self, b: &Binding, plan: Plan, plaintext: &[u8]) -> Bytes {
        let t = self.framing.cipher.tag_len();
        let chunk = self.framing.chunk_size as usize;
        let entry = LEN_LEN + t;
        let head = HEAD_LEN + plan.count as usize * entry;
        let mut out = BytesMut::with_capacity(head + plaintext.len() + plaintext.len() / 64);
        out.resize(head, 0);
        out[..COUNTER_LEN].copy_from_slice(&plan.base.to_be_bytes());
        out[COUNTER_LEN..HEAD_LEN].copy_from_slice(&plan.plain_len.to_be_bytes());
        for (i, src) in plaintext.chunks(chunk).enumerate() {
            let start = out.len();
            out.resize(
                start + lz4_flex::block::get_maximum_output_size(src.len()),
                0,
            );
            let packed = lz4_flex::block::compress_into(src, &mut out[start..])
                .ok()
                .filter(|&m| m < src.len());
            let word = match packed {
                Some(m) => m as u32 | FLAG_LZ4,
                None => {
                    out[start..start + src.len()].copy_from_slice(src);
                    src.len() as u32
                }
            };
            let stored = (word & !FLAG_LZ4) as usize;
            out.truncate(start + stored);
            let (counter, a) = self.chunk_aad2(self.send_direction(), b, plan, i as u32, word);
            let (h, body) = out.split_at_mut(start);
            let e = HEAD_LEN + i * entry;
            h[e..e + LEN_LEN].copy_from_slice(&word.to_be_bytes());
            self.send_key.seal(
                counter,
                &a,
                &mut body[..stored],
                &mut h[e + LEN_LEN..e + entry],
            );
            self.stats
                .sealed
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        out.freeze()
    }

    /// Checks a compressed transfer's header: every length before any chunk is opened.
    /// Returns the plan and each chunk's stored-length word.
    fn compressed_plan(&self, sealed: &[u8]) -> Result<(Plan, Vec<u32>), OpenError> {
        let s = sealed.len();
        let bad = OpenError::BadLength(s);
        if s < HEAD_LEN {
            return Err(bad);
        }
        let mut c = [0u8; COUNTER_LEN];
        c.copy_from_slice(&sealed[..COUNTER_LEN]);
        let base = u64::from_be_bytes(c);
        let mut l = [0u8; 4];
        l.copy_from_slice(&sealed[COUNTER_LEN..HEAD_LEN]);
        let plain_len = u32::from_be_bytes(l);
        let n = plain_len as usize;
        if n == 0 {
            return Err(bad);
        }
        let head = compress::header_len(&self.framing, n).ok_or(OpenError::BadLength(s))?;
        if head > s {
            return Err(bad);
        }
        let count = u32::try_from(self.framing.chunks(n)).map_err(|_| OpenError::BadLength(s))?;
        let chunk = self.framing.chunk_size as usize;
        let entry = compress::entry_len(&self.framing);
        let mut words = Vec::with_capacity(count as usize);
        let mut total = head;
        for i in 0..count as usize {
            let e = HEAD_LEN + i * entry;
            l.copy_from_slice(&sealed[e..e + LEN_LEN]);
            let word = u32::from_be_bytes(l);
            let stored = (word & !FLAG_LZ4) as usize;
            let expect = (n - i * chunk).min(chunk);
            // A raw chunk is its plaintext; a compressed one is shorter (or it would be raw).
            let fits = if word & FLAG_LZ4 != 0 {
                stored < expect
            } else {
                stored == expect
            };
            if !fits {
                return Err(OpenError::BadLength(s));
            }
            total = total.checked_add(stored).ok_or(OpenError::BadLength(s))?;
            words.push(word);
        }
        if total != s {
            return Err(bad);
        }
        Ok((
            Plan {
                base,
                count,
                plain_len,
            },
            words,
        ))
    }

    /// Opens a compressed transfer: checks its lengths, verifies (and decrypts in place)
    /// every chunk's tag over its stored bytes (and its length and flag, in the associated
    /// data), and only when all of them verified allocates the plaintext and decompresses each
    /// chunk into exactly its plaintext length. Returns the plaintext (a new buffer); on any
    /// error nothing. A transfer that did not come from a holder of the keys costs one pass
    /// of AEAD over what arrived and no allocation of its declared length.
    pub(super) fn open_compressed(
        &self,
        b: &Binding,
        sealed: &mut BytesMut,
    ) -> Result<Bytes, OpenError> {
        if sealed.is_empty() {
            return Ok(Bytes::new());
        }
        let (plan, words) = match self.compressed_plan(sealed) {
            Ok(p) => p,
            Err(e) => {
                self.report(b, &e);
                return Err(e);
            }
        };
        // The declared plaintext is allocated below: never more than the command itself
        // can move, so a peer that holds the keys cannot make this side allocate 4 GiB for
        // a small compressed write (a decompression bomb by declaration).
        if plan.plain_len as usize > max_plain(b) {
            let e = OpenError::BadLength(sealed.len());
            self.report(b, &e);
            return Err(e);
        }
        let plan = self.check_received(b, plan)?;
        let n = plan.plain_len as usize;
        let t = self.framing.cipher.tag_len();
        let chunk = self.framing.chunk_size as usize;
        let entry = LEN_LEN + t;
        let head = HEAD_LEN + plan.count as usize * entry;
        let (h, body) = sealed.split_at_mut(head);
        let mut off = 0;
        for (i, &word) in words.iter().enumerate() {
            let index = i as u32;
            let stored = (word & !FLAG_LZ4) as usize;
            let e = HEAD_LEN + i * entry;
            let tag = &h[e + LEN_LEN..e + entry];
            let data = &mut body[off..off + stored];
            off += stored;
            let (counter, a) = self.chunk_aad2(self.recv_direction(), b, plan, index, word);
            if self.recv_key.open(counter, &a, data, tag).is_err() {
                let e = OpenError::Authentication { chunk: index };
                self.report(b, &e);
                return Err(e);
            }
        }
        let mut out = BytesMut::zeroed(n);
        let mut off = 0;
        for (i, &word) in words.iter().enumerate() {
            let index = i as u32;
            let stored = (word & !FLAG_LZ4) as usize;
            let data = &body[off..off + stored];
            off += stored;
            let dst = &mut out[i * chunk..(i * chunk + chunk).min(n)];
            if word & FLAG_LZ4 != 0 {
                // Bounded by `dst`: an output longer than the chunk fails in the decoder.
                let want = dst.len();
                let got = lz4_flex::block::decompress_into(data, dst);
                if !matches!(got, Ok(m) if m == want) {
                    let e = OpenError::Decompression { chunk: index };
                    self.report(b, &e);
                    return Err(e);
                }
            } else {
                dst.copy_from_slice(data);
            }
            self.stats
                .opened
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        self.finish_open(b, plan)?;
        Ok(out.freeze())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::cipher::{ChunkKey, IV_LEN};
    use crate::compress::Compression;
    use crate::frame::{Framing, Role};
    use crate::Cipher;

    const CHUNK: u32 = 4096;

    fn pair_with(cipher: Cipher, compression: Compression) -> (SealSession, SealSession) {
        let key = |seed: u8| {
            ChunkKey::new(cipher, CHUNK, &vec![seed; cipher.key_len()], [seed; IV_LEN]).unwrap()
        };
        let f = Framing {
            cipher,
            chunk_size: CHUNK,
        };
        let root = || zeroize::Zeroizing::new([9u8; 32]);
        (
            SealSession::new(f, Role::Initiator, key(1), key(2), root())
                .with_compression(compression),
            SealSession::new(f, Role::Target, key(1), key(2), root()).with_compression(compression),
        )
    }

    fn pair(cipher: Cipher) -> (SealSession, SealSession) {
        pair_with(cipher, Compression::Lz4)
    }

    fn binding() -> Binding {
        Binding::of_command(0, 7, 0x2a, (100, 64))
    }

    /// Bytes that LZ4 cannot shrink (a counter-mode-like stream from a simple LCG).
    fn noise(n: usize, seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        (0..n)
            .map(|_| {
                x = x
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                (x >> 56) as u8
            })
            .collect()
    }

    fn words(f: &Framing, sealed: &[u8]) -> Vec<u32> {
        let n = u32::from_be_bytes(sealed[8..12].try_into().unwrap()) as usize;
        let e = compress::entry_len(f);
        (0..f.chunks(n))
            .map(|i| {
                let at = HEAD_LEN + i * e;
                u32::from_be_bytes(sealed[at..at + 4].try_into().unwrap())
            })
            .collect()
    }

    #[test]
    fn accepts_compressed_raw_mixed_and_partial_chunks_round_trip_for_every_cipher() {
        for cipher in Cipher::ALL {
            let (i, t) = pair(cipher);
            let c = CHUNK as usize;
            let zeros = vec![0u8; 2 * c];
            let text = b"the quick brown fox jumps over the lazy dog. ".repeat(400);
            let mut mixed = vec![0u8; c];
            mixed.extend(noise(c, 3));
            mixed.extend_from_slice(&text[..c / 2 + 17]);
            for (what, plain) in [
                ("zeros", zeros),
                ("text", text[..3 * c + 5].to_vec()),
                ("noise", noise(2 * c + 1, 4)),
                ("mixed", mixed),
                ("one byte", vec![42u8]),
            ] {
                let sealed = i.seal_copy(&binding(), &plain).unwrap();
                let opened = t.open(&binding(), BytesMut::from(&sealed[..])).unwrap();
                assert_eq!(&opened[..], &plain[..], "{cipher} {what}");
                assert!(
                    sealed.len() <= i.sealed_len(plain.len()).unwrap(),
                    "{cipher} {what}: never longer than the read's EDTL"
                );
            }
        }
    }

    #[test]
    fn accepts_an_incompressible_chunk_stored_raw_beside_a_compressed_one() {
        let (i, t) = pair(Cipher::Aes256Gcm);
        let c = CHUNK as usize;
        let mut plain = noise(c, 5);
        plain.extend(vec![0u8; c]);
        let sealed = i.seal_copy(&binding(), &plain).unwrap();
        let w = words(&i.framing(), &sealed);
        assert_eq!(w[0], CHUNK, "noise: stored raw, flag clear, its own length");
        assert_ne!(w[1] & FLAG_LZ4, 0, "zeros: compressed");
        assert!(
            (w[1] & !FLAG_LZ4) < 100,
            "4 KiB of zeros in {} bytes",
            w[1] & !FLAG_LZ4
        );
        assert_eq!(
            sealed.len(),
            HEAD_LEN + 2 * (4 + 16) + c + (w[1] & !FLAG_LZ4) as usize
        );
        // Raw chunks are encrypted too: the plaintext noise is not on the wire.
        let at = HEAD_LEN + 2 * 20;
        assert_ne!(&sealed[at..at + 64], &plain[..64]);
        assert_eq!(
            &t.open(&binding(), BytesMut::from(&sealed[..])).unwrap()[..],
            &plain[..]
        );
    }

    #[test]
    fn rejects_tampered_compressed_records_before_decompressing_them() {
        let (i, t) = pair(Cipher::Aes256Gcm);
        let plain = vec![0u8; 3 * CHUNK as usize];
        let sealed = i.seal_copy(&binding(), &plain).unwrap();
        let head = HEAD_LEN + 3 * 20;
        // A flipped bit in a compressed body: the tag fails; the decoder never runs (it would
        // report Decompression for bytes that are not the compressed stream).
        for at in [head, head + 5, sealed.len() - 1] {
            let mut bad = BytesMut::from(&sealed[..]);
            bad[at] ^= 0x01;
            assert_eq!(
                t.open(&binding(), bad),
                Err(OpenError::Authentication {
                    chunk: if at == head || at == head + 5 { 0 } else { 2 }
                }),
                "byte {at}"
            );
        }
        // The body of chunk 0 replaced by a valid LZ4 stream of the same length (an attacker
        // without the key): refused by the tag, not decompressed.
        let w0 = (words(&i.framing(), &sealed)[0] & !FLAG_LZ4) as usize;
        let mut forged = BytesMut::from(&sealed[..]);
        let other = lz4_flex::block::compress(&vec![7u8; CHUNK as usize]);
        if other.len() == w0 {
            forged[head..head + w0].copy_from_slice(&other);
            assert_eq!(
                t.open(&binding(), forged),
                Err(OpenError::Authentication { chunk: 0 })
            );
        }
        // A stored length or flag edited in the header: lengths no longer add up, or the tag
        // (which covers length and flag) fails.
        for (at, bit) in [(HEAD_LEN + 3, 0x01u8), (HEAD_LEN, 0x80)] {
            let mut bad = BytesMut::from(&sealed[..]);
            bad[at] ^= bit;
            assert!(
                matches!(
                    t.open(&binding(), bad),
                    Err(OpenError::BadLength(_) | OpenError::Authentication { .. })
                ),
                "header byte {at}"
            );
        }
        // The declared plaintext length edited: bound in every chunk's associated data.
        let mut bad = BytesMut::from(&sealed[..]);
        bad[11] ^= 0x01;
        assert!(t.open(&binding(), bad).is_err());
        // Truncated, or extended by a byte.
        let short = BytesMut::from(&sealed[..sealed.len() - 1]);
        assert_eq!(
            t.open(&binding(), short),
            Err(OpenError::BadLength(sealed.len() - 1))
        );
        let mut long = BytesMut::from(&sealed[..]);
        long.extend_from_slice(&[0]);
        assert_eq!(
            t.open(&binding(), long),
            Err(OpenError::BadLength(sealed.len() + 1))
        );
        // The genuine transfer still opens (nothing above consumed its counters).
        assert_eq!(
            &t.open(&binding(), BytesMut::from(&sealed[..])).unwrap()[..],
            &plain[..]
        );
    }

    /// A transfer whose one chunk is `stored` (flag `lz4`), declared as `declared` plaintext
    /// bytes, sealed with the genuine key: what a peer that holds the keys could send.
    fn sealed_by_peer(i: &SealSession, declared: usize, stored: &[u8], lz4: bool) -> BytesMut {
        let plan = i.plan(declared).unwrap().unwrap();
        assert_eq!(plan.count, 1);
        let word = stored.len() as u32 | if lz4 { FLAG_LZ4 } else { 0 };
        let mut out = BytesMut::new();
        out.extend_from_slice(&plan.base.to_be_bytes());
        out.extend_from_slice(&plan.plain_len.to_be_bytes());
        out.extend_from_slice(&word.to_be_bytes());
        out.extend_from_slice(&[0u8; 16]);
        out.extend_from_slice(stored);
        let (counter, a) = i.chunk_aad2(i.send_direction(), &binding(), plan, 0, word);
        let (h, body) = out.split_at_mut(HEAD_LEN + 20);
        i.send_key
            .seal(counter, &a, body, &mut h[HEAD_LEN + 4..HEAD_LEN + 20]);
        out
    }

    #[test]
    fn rejects_a_declared_plaintext_beyond_what_the_command_moves_before_allocating_it() {
        let (i, t) = pair(Cipher::Aes256Gcm);
        // A WRITE of one block (at most 4096 bytes, 8192 with COMPARE AND WRITE) whose
        // compressed transfer declares 16000 bytes: refused before anything is opened.
        let one_block = Binding::of_command(0, 7, 0x2a, (100, 1));
        let sealed = i
            .seal(&one_block, BytesMut::from(&vec![0u8; 16000][..]))
            .unwrap();
        let len = sealed.len();
        assert!(len < 1000, "{len}");
        assert_eq!(
            t.open(&one_block, BytesMut::from(&sealed[..])),
            Err(OpenError::BadLength(len))
        );
        assert_eq!(max_plain(&one_block), 8192);
        // A command without blocks may declare up to 1 MiB, a large one up to 128 MiB.
        assert_eq!(max_plain(&Binding::of_command(0, 7, 0x12, (0, 0))), 1 << 20);
        assert_eq!(
            max_plain(&Binding::of_command(0, 7, 0x8a, (0, u32::MAX))),
            128 << 20
        );
        // Sealed for a command of four blocks (up to 32 KiB), the same data opens.
        let four = Binding::of_command(0, 8, 0x2a, (100, 4));
        let sealed = i
            .seal(&four, BytesMut::from(&vec![0u8; 16000][..]))
            .unwrap();
        assert_eq!(
            &t.open(&four, BytesMut::from(&sealed[..])).unwrap()[..],
            &[0u8; 16000][..]
        );
    }

    #[test]
    fn rejects_a_decompression_bomb_and_a_short_chunk_from_a_peer_with_the_keys() {
        let (i, t) = pair(Cipher::Aes256Gcm);
        // 64 KiB of zeros compress to a few hundred bytes: declared as a 1000-byte chunk
        // (so the stored length is valid), it would expand to 65536 bytes.
        let bomb = lz4_flex::block::compress(&vec![0u8; 65536]);
        assert!(bomb.len() < 1000, "{}", bomb.len());
        let sealed = sealed_by_peer(&i, 1000, &bomb, true);
        assert_eq!(
            t.open(&binding(), sealed),
            Err(OpenError::Decompression { chunk: 0 })
        );
        // Decompressing to fewer bytes than declared is refused too (no uninitialised tail).
        let short = lz4_flex::block::compress(&vec![0u8; 500]);
        let sealed = sealed_by_peer(&i, 1000, &short, true);
        assert_eq!(
            t.open(&binding(), sealed),
            Err(OpenError::Decompression { chunk: 0 })
        );
        // Garbage flagged as compressed.
        let sealed = sealed_by_peer(&i, 1000, &[0xff; 40], true);
        assert_eq!(
            t.open(&binding(), sealed),
            Err(OpenError::Decompression { chunk: 0 })
        );
        // A "compressed" chunk as long as its plaintext is refused before anything is opened.
        let sealed = sealed_by_peer(&i, 1000, &[0u8; 1000], true);
        assert_eq!(
            t.open(&binding(), sealed),
            Err(OpenError::BadLength(HEAD_LEN + 20 + 1000))
        );
        // The same construction with an honest chunk opens: the test's sealing is genuine.
        let honest = lz4_flex::block::compress(&vec![0u8; 1000]);
        let sealed = sealed_by_peer(&i, 1000, &honest, true);
        assert_eq!(&t.open(&binding(), sealed).unwrap()[..], &[0u8; 1000][..]);
    }

    #[test]
    fn rejects_a_compressed_transfer_in_an_uncompressed_session_and_back() {
        let (ic, _) = pair(Cipher::Aes256Gcm);
        let (ip, tp) = pair_with(Cipher::Aes256Gcm, Compression::None);
        let (_, tc) = pair(Cipher::Aes256Gcm);
        let plain = vec![0u8; 8192];
        let c = ic.seal_copy(&binding(), &plain).unwrap();
        assert!(tp.open(&binding(), BytesMut::from(&c[..])).is_err());
        let p = ip.seal_copy(&binding(), &plain).unwrap();
        assert!(tc.open(&binding(), BytesMut::from(&p[..])).is_err());
    }

    #[test]
    fn rejects_a_replayed_compressed_transfer() {
        let (i, t) = pair(Cipher::Aes256Gcm);
        let sealed = i.seal_copy(&binding(), &[1u8; 5000]).unwrap();
        t.open(&binding(), BytesMut::from(&sealed[..])).unwrap();
        assert!(matches!(
            t.open(&binding(), BytesMut::from(&sealed[..])),
            Err(OpenError::Replay { .. })
        ));
    }
}
