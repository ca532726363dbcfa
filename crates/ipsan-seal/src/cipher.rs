//! The four Seal ciphers and the per-direction chunk keys.
//!
//! Every cipher seals a chunk *in place* (ciphertext length = plaintext length) and produces a
//! separate tag, so a command's sealed form is its ciphertext followed by a trailer of tags
//! (see [`crate::frame`]). Nonces are never chosen at random: each chunk's nonce is derived from
//! a per-direction counter ([`crate::SealSession`]) XORed into a per-direction static IV, as in
//! TLS 1.3 (RFC 8446 §5.3).

use std::fmt;
use std::str::FromStr;
use std::sync::RwLock;

use aws_lc_rs::aead;
use zeroize::Zeroizing;

pub(crate) use crate::kdf::{epoch_key_material, hkdf_sha256, IV_LEN};
use crate::kdf::{BadKeyLength, BadTag};
use crate::tdes::TdesHmacSha1;

/// Largest negotiable chunk size (16 MiB), the bound of every cipher but 3DES
/// ([`Cipher::max_chunk`]).
pub const MAX_CHUNK: u32 = 16 << 20;

/// A Seal cipher, as named in the `X-org.ipsan.Seal` login key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Cipher {
    /// AES-256-GCM (NIST SP 800-38D), the default; VAES/AVX-512 (or AES-NI + CLMUL)
    /// accelerated through `aws-lc-rs`.
    Aes256Gcm,
    /// ChaCha20-Poly1305 (RFC 8439), fast without AES hardware.
    ChaCha20Poly1305,
    /// **Legacy.** 3DES-CBC (NIST SP 800-67) with HMAC-SHA1-96 (RFC 2404), encrypt-then-MAC:
    /// the papers' cipher with IPsec's usual MAC, kept only to reproduce their experiments.
    /// 64-bit blocks: do not use it to protect data.
    TripleDesCbcHmacSha1,
    /// No protection, same framing and pipeline: the baseline that isolates what encryption
    /// costs. Tags are all-zero and are not checked.
    None,
}

impl Cipher {
    /// All ciphers, in the default preference order an initiator offers them.
    pub const ALL: [Cipher; 4] = [
        Cipher::Aes256Gcm,
        Cipher::ChaCha20Poly1305,
        Cipher::TripleDesCbcHmacSha1,
        Cipher::None,
    ];

    /// The name used on the wire and on the command line.
    pub const fn name(self) -> &'static str {
        match self {
            Cipher::Aes256Gcm => "aes-256-gcm",
            Cipher::ChaCha20Poly1305 => "chacha20-poly1305",
            Cipher::TripleDesCbcHmacSha1 => "3des-cbc-hmac-sha1",
            Cipher::None => "none",
        }
    }

    /// Parses a wire/CLI name (exact match: iSCSI values are case-sensitive, RFC 7143 §6.1).
    pub fn from_name(name: &str) -> Option<Cipher> {
        Cipher::ALL.into_iter().find(|c| c.name() == name)
    }

    /// Bytes of tag per chunk.
    pub const fn tag_len(self) -> usize {
        match self {
            Cipher::Aes256Gcm | Cipher::ChaCha20Poly1305 | Cipher::None => 16,
            Cipher::TripleDesCbcHmacSha1 => crate::tdes::TAG_LEN,
        }
    }

    /// Bytes of key material per direction (encryption key, plus MAC key for 3DES).
    pub(crate) const fn key_len(self) -> usize {
        match self {
            Cipher::Aes256Gcm | Cipher::ChaCha20Poly1305 => 32,
            Cipher::TripleDesCbcHmacSha1 => crate::tdes::KEY_LEN + crate::tdes::MAC_KEY_LEN,
            Cipher::None => 0,
        }
    }

    /// Largest chunk size this cipher may be used with: [`MAX_CHUNK`], or
    /// for 3DES the size whose blocks still fit in one key epoch (4 MiB; docs/seal.md §4).
    pub const fn max_chunk(self) -> u32 {
        match self {
            Cipher::TripleDesCbcHmacSha1 => crate::tdes::MAX_CHUNK,
            _ => MAX_CHUNK,
        }
    }

    /// Largest command (plaintext bytes) that [`crate::CryptoPool`] seals or opens on the
    /// caller's thread instead of handing it to a worker: where the hand-off (a channel send,
    /// a worker's wake-up, a oneshot wake-up of the waiting task: several microseconds of CPU
    /// on two threads, and a wake-up's latency) costs about as much as the crypto it moves.
    /// AES-256-GCM ran at 3.6 GiB/s per core on this project's VM without AVX-512 and 9.7
    /// with it (docs/seal.md §8), so 64 KiB is 6–17 µs of work; ChaCha20-Poly1305 (2.3 GiB/s)
    /// gets half that; 3DES (about 14 MB/s: 4 KiB is about 300 µs) is never inline. `none` follows AES-256-GCM, as it is the
    /// baseline of that pipeline. Measured in docs/results/seal-inline.
    pub const fn inline_max(self) -> usize {
        match self {
            Cipher::Aes256Gcm | Cipher::None => 64 << 10,
            Cipher::ChaCha20Poly1305 => 32 << 10,
            Cipher::TripleDesCbcHmacSha1 => 0,
        }
    }

    /// Whether the cipher protects anything (`none` does not).
    pub const fn protects(self) -> bool {
        !matches!(self, Cipher::None)
    }

    /// Whether the cipher is legacy (kept only to reproduce the papers).
    pub const fn is_legacy(self) -> bool {
        matches!(self, Cipher::TripleDesCbcHmacSha1)
    }

    /// One-byte identifier bound into every chunk's associated data.
    pub(crate) const fn id(self) -> u8 {
        match self {
            Cipher::Aes256Gcm => 1,
            Cipher::ChaCha20Poly1305 => 2,
            Cipher::TripleDesCbcHmacSha1 => 3,
            Cipher::None => 0xff,
        }
    }
}

impl fmt::Display for Cipher {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The name is not one of [`Cipher::ALL`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown Seal cipher {0:?} (expected aes-256-gcm, chacha20-poly1305, 3des-cbc-hmac-sha1 or none)")]
pub struct UnknownCipher(pub String);

impl FromStr for Cipher {
    type Err = UnknownCipher;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Cipher::from_name(s).ok_or_else(|| UnknownCipher(s.to_owned()))
    }
}

/// Bytes one AEAD key protects before the next key epoch (64 GiB = 2^32 AES blocks): the
/// confidentiality bound of AES-GCM grows with the square of the blocks under one key, and at
/// 2^32 blocks it is about 2^-65 per key. RFC 8446 §5.5 stops a TLS 1.3 AES-GCM key at about
/// 2^38.5 bytes for a 2^-57 margin; a storage session moves that in minutes at 1 GB/s.
pub(crate) const AEAD_EPOCH_BYTES: u64 = 1 << 36;
/// HKDF salt that separates AEAD epoch keys from everything else the schedule derives.
const AEAD_EPOCH_SALT: &[u8] = b"ipsan-seal aead epoch";

/// Chunks per AEAD key epoch for `chunk_size`-byte chunks.
pub(crate) fn aead_epoch_chunks(chunk_size: u32) -> u64 {
    (AEAD_EPOCH_BYTES / u64::from(chunk_size.max(1))).max(1)
}

/// One direction's AEAD key: a root from which each key epoch's key is derived
/// (docs/seal.md §4 *Key epochs*), with the two most recently used epochs' keys cached so the
/// hot path does not run an AES key schedule per chunk. Commands in flight straddle at most
/// one boundary at a time (the replay window is far shorter than an epoch).
pub(crate) struct AeadKey {
    alg: &'static aead::Algorithm,
    root: Zeroizing<[u8; 32]>,
    iv: Zeroizing<[u8; IV_LEN]>,
    epoch_chunks: u64,
    cache: RwLock<[Option<(u64, aead::LessSafeKey)>; 2]>,
}

impl AeadKey {
    fn new(
        alg: &'static aead::Algorithm,
        material: &[u8],
        iv: Zeroizing<[u8; IV_LEN]>,
        chunk_size: u32,
    ) -> Result<Self, BadKeyLength> {
        let mut root = Zeroizing::new([0u8; 32]);
        if material.len() != root.len() || alg.key_len() != root.len() {
            return Err(BadKeyLength);
        }
        root.copy_from_slice(material);
        let k = Self {
            alg,
            root,
            iv,
            epoch_chunks: aead_epoch_chunks(chunk_size),
            cache: RwLock::new([None, None]),
        };
        // Epoch 0 up front: a bad key length shows at login, not at the first write.
        k.with_key(0, |_| ())?;
        Ok(k)
    }

    fn derive(&self, epoch: u64) -> Result<aead::LessSafeKey, BadKeyLength> {
        let mut key = Zeroizing::new([0u8; 32]);
        epoch_key_material(AEAD_EPOCH_SALT, &*self.root, epoch, &mut *key)?;
        let key = aead::UnboundKey::new(self.alg, &*key).map_err(|_| BadKeyLength)?;
        Ok(aead::LessSafeKey::new(key))
    }

    /// Runs `f` with the key of the epoch chunk counter `counter` belongs to. A cached key is
    /// used under the read lock (no copy, no reference count on the hot path); a missing one is
    /// derived, used, then cached in place of the older epoch.
    fn with_key<R>(
        &self,
        counter: u64,
        f: impl FnOnce(&aead::LessSafeKey) -> R,
    ) -> Result<R, BadKeyLength> {
        let epoch = counter / self.epoch_chunks;
        if let Ok(cache) = self.cache.read() {
            if let Some((_, k)) = cache.iter().flatten().find(|(e, _)| *e == epoch) {
                return Ok(f(k));
            }
        }
        let key = self.derive(epoch)?;
        let out = f(&key);
        // A poisoned lock only loses the cache; the key was still right.
        if let Ok(mut cache) = self.cache.write() {
            if !cache.iter().flatten().any(|(e, _)| *e == epoch) {
                // Replace an empty slot, else the older epoch.
                let slot = match (&cache[0], &cache[1]) {
                    (None, _) => 0,
                    (_, None) => 1,
                    (Some((a, _)), Some((b, _))) => usize::from(b < a),
                };
                cache[slot] = Some((epoch, key));
            }
        }
        Ok(out)
    }
}

/// One direction's chunk key. Built only by the key schedule; `Debug` never shows key bytes.
pub(crate) enum ChunkKey {
    Aead(Box<AeadKey>),
    Tdes(Box<TdesHmacSha1>),
    None,
}

impl fmt::Debug for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChunkKey::Aead(_) => "ChunkKey::Aead(<redacted>)",
            ChunkKey::Tdes(_) => "ChunkKey::Tdes(<redacted>)",
            ChunkKey::None => "ChunkKey::None",
        })
    }
}

fn nonce(iv: &[u8; IV_LEN], counter: u64) -> aead::Nonce {
    let mut n = *iv;
    for (b, c) in n[IV_LEN - 8..].iter_mut().zip(counter.to_be_bytes()) {
        *b ^= c;
    }
    aead::Nonce::assume_unique_for_key(n)
}

/// AEAD seal in place with an explicit key (also what the known-answer tests call).
pub(crate) fn aead_seal(
    key: &aead::LessSafeKey,
    iv: &[u8; IV_LEN],
    counter: u64,
    aad: &[u8],
    data: &mut [u8],
    tag: &mut [u8],
) {
    // AWS-LC only fails for inputs longer than the AEAD's per-nonce limit (64 GiB for GCM); a
    // chunk is at most 16 MiB.
    if let Ok(t) = key.seal_in_place_separate_tag(nonce(iv, counter), aead::Aad::from(aad), data) {
        tag.copy_from_slice(t.as_ref());
    } else {
        // Never leave plaintext behind under a tag that could verify.
        data.fill(0);
        tag.fill(0);
    }
}

/// AEAD verify-and-decrypt in place with an explicit key.
pub(crate) fn aead_open(
    key: &aead::LessSafeKey,
    iv: &[u8; IV_LEN],
    counter: u64,
    aad: &[u8],
    data: &mut [u8],
    tag: &[u8],
) -> Result<(), BadTag> {
    key.open_in_place_separate_tag(nonce(iv, counter), aead::Aad::from(aad), tag, data)
        .map(|_| ())
        .map_err(|_| BadTag)
}

impl ChunkKey {
    /// Builds a key from `material` (`cipher.key_len()` bytes) and the static IV for chunks of
    /// `chunk_size` bytes (the chunk size sets how many chunks a key epoch holds). Fails only
    /// if `material` has the wrong length or a 3DES chunk is above [`Cipher::max_chunk`] (bugs
    /// in the schedule).
    pub(crate) fn new(
        cipher: Cipher,
        chunk_size: u32,
        material: &[u8],
        iv: [u8; IV_LEN],
    ) -> Result<ChunkKey, BadKeyLength> {
        let iv = Zeroizing::new(iv);
        let alg = match cipher {
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            Cipher::TripleDesCbcHmacSha1 => {
                return TdesHmacSha1::new(material, &iv, chunk_size)
                    .map(|k| ChunkKey::Tdes(Box::new(k)));
            }
            Cipher::None => return Ok(ChunkKey::None),
        };
        AeadKey::new(alg, material, iv, chunk_size).map(|k| ChunkKey::Aead(Box::new(k)))
    }

    /// Encrypts `data` in place and writes its tag into `tag` (`cipher.tag_len()` bytes).
    /// `counter` must be fresh for this key: the session guarantees it.
    pub(crate) fn seal(&self, counter: u64, aad: &[u8], data: &mut [u8], tag: &mut [u8]) {
        match self {
            ChunkKey::Aead(k) => {
                let done = k.with_key(counter, |key| {
                    aead_seal(key, &k.iv, counter, aad, data, tag);
                });
                if done.is_err() {
                    // HKDF cannot fail for 32 bytes of output; if it did, leave nothing usable.
                    data.fill(0);
                    tag.fill(0);
                }
            }
            ChunkKey::Tdes(k) => k.seal(counter, aad, data, tag),
            ChunkKey::None => tag.fill(0),
        }
    }

    /// Writes `src` sealed into `dst` (same length) and its tag into `tag`. The AEADs encrypt
    /// out of place, reading the plaintext where it lies (one pass over memory, not a copy and
    /// then a pass); `none` and 3DES copy and seal in place while the chunk is in cache. `dst`
    /// may hold anything (a reused buffer): every byte of it is overwritten. `counter` must be
    /// fresh for this key: the session guarantees it.
    pub(crate) fn seal_into(
        &self,
        counter: u64,
        aad: &[u8],
        src: &[u8],
        dst: &mut [u8],
        tag: &mut [u8],
    ) {
        let ChunkKey::Aead(k) = self else {
            dst.copy_from_slice(src);
            return self.seal(counter, aad, dst, tag);
        };
        let sealed = k.with_key(counter, |key| {
            // Fails only on mismatched lengths or inputs past the AEAD's per-nonce limit; a
            // chunk is at most 16 MiB.
            key.seal_out_of_place_scatter(
                nonce(&k.iv, counter),
                aead::Aad::from(aad),
                src,
                dst,
                &[],
                tag,
            )
            .is_ok()
        });
        if sealed != Ok(true) {
            // Never leave anything under a tag that could verify.
            dst.fill(0);
            tag.fill(0);
        }
    }

    /// Verifies `tag` over `aad` and `data`, then decrypts `data` in place. On failure `data`
    /// holds no usable plaintext and must be discarded.
    pub(crate) fn open(
        &self,
        counter: u64,
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8],
    ) -> Result<(), BadTag> {
        match self {
            ChunkKey::Aead(k) => k
                .with_key(counter, |key| {
                    aead_open(key, &k.iv, counter, aad, data, tag)
                })
                .map_err(|_| BadTag)?,
            ChunkKey::Tdes(k) => k.open(counter, aad, data, tag),
            ChunkKey::None => Ok(()),
        }
    }

    /// Verifies `tag` over `aad` and `src` and decrypts `src` into `dst` (same length): the
    /// AEADs out of place, reading the ciphertext where it lies (one pass, not a copy and then
    /// a pass); `none` and 3DES copy and open in place. On failure `dst` is zeroed: it holds
    /// nothing, verified or not.
    pub(crate) fn open_into(
        &self,
        counter: u64,
        aad: &[u8],
        src: &[u8],
        dst: &mut [u8],
        tag: &[u8],
    ) -> Result<(), BadTag> {
        let r = match self {
            ChunkKey::Aead(k) => k
                .with_key(counter, |key| {
                    key.open_separate_gather(
                        nonce(&k.iv, counter),
                        aead::Aad::from(aad),
                        src,
                        tag,
                        dst,
                    )
                    .map_err(|_| BadTag)
                })
                .map_err(|_| BadTag)
                .and_then(|r| r),
            _ => {
                dst.copy_from_slice(src);
                self.open(counter, aad, dst, tag)
            }
        };
        if r.is_err() {
            dst.fill(0);
        }
        r
    }
}

#[cfg(test)]
mod epoch_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn aead(cipher: Cipher, chunk: u32) -> Box<AeadKey> {
        match ChunkKey::new(cipher, chunk, &[0x42; 32], [0x17; IV_LEN]).unwrap() {
            ChunkKey::Aead(k) => k,
            other => panic!("{other:?}"),
        }
    }

    /// What a key does to a fixed input: same key, same output.
    fn fingerprint(key: &aead::LessSafeKey) -> Vec<u8> {
        let mut data = *b"sixteen bytes!!!";
        let mut tag = [0u8; 16];
        aead_seal(key, &[0; IV_LEN], 0, b"aad", &mut data, &mut tag);
        [data.as_slice(), tag.as_slice()].concat()
    }

    #[test]
    fn an_aead_key_protects_at_most_64_gib() {
        for chunk in [512u32, 4096, 65536, 1 << 20, 16 << 20] {
            let e = aead_epoch_chunks(chunk);
            assert!(e >= 1);
            assert!(e * u64::from(chunk) <= AEAD_EPOCH_BYTES, "chunk {chunk}");
            assert!(
                (e + 1) * u64::from(chunk) > AEAD_EPOCH_BYTES,
                "chunk {chunk}"
            );
        }
        assert_eq!(aead_epoch_chunks(65536), 1 << 20);
    }

    fn fp(k: &AeadKey, counter: u64) -> Vec<u8> {
        k.with_key(counter, fingerprint).unwrap()
    }

    #[test]
    fn aead_keys_change_exactly_at_epoch_boundaries() {
        for cipher in [Cipher::Aes256Gcm, Cipher::ChaCha20Poly1305] {
            let k = aead(cipher, 65536);
            let e = k.epoch_chunks;
            let first = fp(&k, 0);
            assert_eq!(first, fp(&k, e - 1));
            let second = fp(&k, e);
            assert_ne!(first, second, "{cipher}");
            assert_eq!(second, fp(&k, 2 * e - 1));
            let third = fp(&k, 2 * e);
            assert_ne!(third, first);
            assert_ne!(third, second);
            // Derived, never the root itself.
            let root = aead::LessSafeKey::new(aead::UnboundKey::new(k.alg, &[0x42; 32]).unwrap());
            assert_ne!(first, fingerprint(&root), "{cipher}");
        }
    }

    #[test]
    fn the_cache_keeps_two_epochs_and_rederives_the_same_key_after_eviction() {
        let k = aead(Cipher::Aes256Gcm, 65536);
        let e = k.epoch_chunks;
        let cached = |k: &AeadKey| -> Vec<u64> {
            let mut v: Vec<u64> = k
                .cache
                .read()
                .unwrap()
                .iter()
                .flatten()
                .map(|(e, _)| *e)
                .collect();
            v.sort_unstable();
            v
        };
        let a = fp(&k, 0);
        assert_eq!(cached(&k), vec![0]);
        let b = fp(&k, e);
        assert_eq!(cached(&k), vec![0, 1]);
        assert_eq!(fp(&k, 1), a, "epoch 0 served from the cache");
        // A third epoch evicts the older one; epoch 0 derived again is the same key.
        let _c = fp(&k, 2 * e);
        assert_eq!(cached(&k), vec![1, 2]);
        assert_eq!(fp(&k, 0), a);
        assert_eq!(fp(&k, e + 5), b);
    }

    #[test]
    fn sealed_under_one_epoch_does_not_open_as_another() {
        let k = ChunkKey::new(Cipher::Aes256Gcm, 65536, &[0x42; 32], [0x17; IV_LEN]).unwrap();
        let e = aead_epoch_chunks(65536);
        for counter in [0, e - 1, e, 3 * e + 7] {
            let mut data = vec![0x5a; 1000];
            let mut tag = [0u8; 16];
            k.seal(counter, b"aad", &mut data, &mut tag);
            let mut copy = data.clone();
            k.open(counter, b"aad", &mut copy, &tag).unwrap();
            assert_eq!(copy, vec![0x5a; 1000]);
            let mut moved = data.clone();
            assert!(k.open(counter + e, b"aad", &mut moved, &tag).is_err());
        }
    }
}
