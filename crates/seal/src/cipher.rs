//! The four Seal ciphers and the per-direction chunk keys.
//!
//! Every cipher seals a chunk *in place* (ciphertext length = plaintext length) and produces a
//! separate tag, so a command's sealed form is its ciphertext followed by a trailer of tags
//! (see [`crate::frame`]). Nonces are never chosen at random: each chunk's nonce is derived from
//! a per-direction counter ([`crate::SealSession`]) XORed into a per-direction static IV, as in
//! TLS 1.3 (RFC 8446 §5.3).

use std::fmt;
use std::str::FromStr;

use aws_lc_rs::aead;
use bytes::BytesMut;
use zeroize::Zeroizing;

use crate::tdes::TdesHmacSha1;

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

    /// Largest chunk size this cipher may be used with: [`crate::negotiate::MAX_CHUNK`], or for 3DES the
    /// size whose blocks still fit in one key epoch (`tdes::MAX_CHUNK`, 4 MiB; docs/seal.md §4).
    pub const fn max_chunk(self) -> u32 {
        match self {
            Cipher::TripleDesCbcHmacSha1 => crate::tdes::MAX_CHUNK,
            _ => crate::negotiate::MAX_CHUNK,
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

/// Length of the per-direction static IV that counters are XORed into.
pub(crate) const IV_LEN: usize = 12;

/// One direction's chunk key. Built only by the key schedule; `Debug` never shows key bytes.
pub(crate) enum ChunkKey {
    Aead {
        key: Box<aead::LessSafeKey>,
        iv: Zeroizing<[u8; IV_LEN]>,
    },
    Tdes(Box<TdesHmacSha1>),
    None,
}

impl fmt::Debug for ChunkKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ChunkKey::Aead { .. } => "ChunkKey::Aead(<redacted>)",
            ChunkKey::Tdes(_) => "ChunkKey::Tdes(<redacted>)",
            ChunkKey::None => "ChunkKey::None",
        })
    }
}

/// Key material of the wrong length reached a cipher (a bug in the key schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadKeyLength;

/// The tag did not verify (deliberately carries nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadTag;

impl ChunkKey {
    /// Builds a key from `material` (`cipher.key_len()` bytes) and the static IV for chunks of
    /// `chunk_size` bytes (3DES changes keys every so many chunks). Fails only if `material`
    /// has the wrong length or the chunk is above [`Cipher::max_chunk`] (bugs in the schedule).
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
        let key = aead::UnboundKey::new(alg, material).map_err(|_| BadKeyLength)?;
        Ok(ChunkKey::Aead {
            key: Box::new(aead::LessSafeKey::new(key)),
            iv,
        })
    }

    fn nonce(iv: &[u8; IV_LEN], counter: u64) -> aead::Nonce {
        let mut n = *iv;
        for (b, c) in n[IV_LEN - 8..].iter_mut().zip(counter.to_be_bytes()) {
            *b ^= c;
        }
        aead::Nonce::assume_unique_for_key(n)
    }

    /// Encrypts `data` in place and writes its tag into `tag` (`cipher.tag_len()` bytes).
    /// `counter` must be fresh for this key: the session guarantees it.
    pub(crate) fn seal(&self, counter: u64, aad: &[u8], data: &mut [u8], tag: &mut [u8]) {
        match self {
            ChunkKey::Aead { key, iv } => {
                let nonce = Self::nonce(iv, counter);
                // AWS-LC only fails for inputs longer than the AEAD's per-nonce limit (64 GiB for
                // GCM); a chunk is at most 16 MiB.
                if let Ok(t) = key.seal_in_place_separate_tag(nonce, aead::Aad::from(aad), data) {
                    tag.copy_from_slice(t.as_ref());
                } else {
                    // Never leave plaintext behind under a tag that could verify.
                    data.fill(0);
                    tag.fill(0);
                }
            }
            ChunkKey::Tdes(k) => k.seal(counter, aad, data, tag),
            ChunkKey::None => tag.fill(0),
        }
    }

    /// Appends `src` sealed to `out` and writes its tag into `tag`. The AEADs encrypt out of
    /// place, reading the plaintext where it lies (one pass over memory, not a copy and then a
    /// pass); `none` and 3DES append a copy and seal it in place while it is in cache.
    /// `counter` must be fresh for this key: the session guarantees it.
    pub(crate) fn seal_append(
        &self,
        counter: u64,
        aad: &[u8],
        src: &[u8],
        out: &mut BytesMut,
        tag: &mut [u8],
    ) {
        let at = out.len();
        let ChunkKey::Aead { key, iv } = self else {
            out.extend_from_slice(src);
            return self.seal(counter, aad, &mut out[at..], tag);
        };
        // Zero-filling a chunk that is about to be overwritten stays in cache; safe Rust
        // cannot hand the cipher uninitialised memory.
        out.resize(at + src.len(), 0);
        let dst = &mut out[at..];
        let nonce = Self::nonce(iv, counter);
        // Fails only on mismatched lengths (equal here) or inputs past the AEAD's per-nonce
        // limit; a chunk is at most 16 MiB.
        let sealed = key.seal_out_of_place_scatter(nonce, aead::Aad::from(aad), src, dst, &[], tag);
        if sealed.is_err() {
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
            ChunkKey::Aead { key, iv } => {
                let nonce = Self::nonce(iv, counter);
                key.open_in_place_separate_tag(nonce, aead::Aad::from(aad), tag, data)
                    .map(|_| ())
                    .map_err(|_| BadTag)
            }
            ChunkKey::Tdes(k) => k.open(counter, aad, data, tag),
            ChunkKey::None => Ok(()),
        }
    }
}
