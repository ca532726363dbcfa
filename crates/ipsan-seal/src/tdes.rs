//! **Legacy** `3des-cbc-hmac-sha1`: three-key TDEA (NIST SP 800-67) in CBC mode (NIST SP 800-38A
//! §6.2) with HMAC-SHA1-96 (RFC 2104, RFC 2404), encrypt-then-MAC.
//!
//! This reproduces the papers' cipher (3DES) with the MAC IPsec usually paired with it; it exists
//! only so the lab can compare against the papers.
//!
//! **Key epochs.** A 64-bit block cipher leaks plaintext once about 2^32 blocks share a key
//! (birthday collisions, "Sweet32"); NIST SP 800-67 Rev. 2 therefore caps one key bundle at
//! 2^20 block encryptions (8 MiB). Each direction's key material from the schedule is not used
//! directly but as a root: chunk counter `c` belongs to epoch `e = c / epoch_chunks`, and epoch
//! `e`'s TDEA and MAC keys are `HKDF-SHA256(salt = "ipsan-seal 3des epoch", ikm = root,
//! info = e as 8 bytes big-endian)`. `epoch_chunks` is the most chunks whose block encryptions
//! (data blocks, the IV and a possible tail block: `chunk / 8 + 2` each) stay within 2^20, so no
//! key ever encrypts more than SP 800-67 allows; chunks are therefore at most [`MAX_CHUNK`].
//! Deriving an epoch's keys (an HKDF and three DES key schedules) is small against the
//! milliseconds 3DES spends on a chunk, so they are derived per chunk and nothing is cached.
//!
//! Chunk layout, so that ciphertext length equals plaintext length like the AEADs:
//! - IV = TDEA_K(counter as an 8-byte big-endian block XOR the direction's static IV): an
//!   unpredictable IV derived from a nonce with the forward cipher, as SP 800-38A Appendix C
//!   recommends;
//! - whole 8-byte blocks: CBC;
//! - a final partial block of r < 8 bytes: XORed with the first r bytes of TDEA_K(last
//!   ciphertext block, or the IV if there is none) ("residual block termination"). Its
//!   malleability is covered by the MAC;
//! - tag = first 12 bytes of HMAC-SHA1(mac key, AAD || ciphertext).

use des::cipher::generic_array::GenericArray;
use des::cipher::{BlockDecrypt, BlockEncrypt, KeyInit};
use des::TdesEde3;
use hmac::{Hmac, Mac};
use sha1::Sha1;
use zeroize::Zeroizing;

use crate::kdf::{epoch_key_material, BadKeyLength, BadTag, IV_LEN};

/// Three 8-byte DES keys.
pub(crate) const KEY_LEN: usize = 24;
/// HMAC-SHA1 key length (RFC 2404 §3: 160 bits).
pub(crate) const MAC_KEY_LEN: usize = 20;
/// HMAC-SHA1-96: the first 96 bits of the HMAC (RFC 2404 §2).
pub(crate) const TAG_LEN: usize = 12;
const BLOCK: usize = 8;
const SHA1_BLOCK: usize = 64;

/// NIST SP 800-67 Rev. 2: at most 2^20 64-bit blocks encrypted under one key bundle.
pub(crate) const KEY_BLOCK_LIMIT: u64 = 1 << 20;
/// Largest chunk for 3DES: one chunk (its blocks, IV and tail) must fit in a key epoch.
pub(crate) const MAX_CHUNK: u32 = 4 << 20;
/// HKDF salt that separates epoch keys from everything else the schedule derives.
const EPOCH_SALT: &[u8] = b"ipsan-seal 3des epoch";

/// Chunks per key epoch for `chunk_size`-byte chunks (at least 1 for chunks up to
/// [`MAX_CHUNK`]): each chunk costs up to `chunk_size / 8` data blocks, one IV block and one
/// residual-tail block.
pub(crate) fn epoch_chunks(chunk_size: u32) -> u64 {
    let per_chunk = u64::from(chunk_size).div_ceil(BLOCK as u64) + 2;
    (KEY_BLOCK_LIMIT / per_chunk).max(1)
}

/// One key epoch's TDEA key and MAC key.
struct EpochKeys {
    /// Zeroized on drop by `des`'s `zeroize` feature.
    cipher: TdesEde3,
    /// The 20-byte HMAC key zero-padded to SHA-1's 64-byte block, which is exactly how HMAC
    /// treats a short key (RFC 2104 §2), so building the MAC cannot fail.
    mac_key: Zeroizing<[u8; SHA1_BLOCK]>,
}

impl EpochKeys {
    /// `material` = 24 bytes of TDEA key followed by 20 bytes of MAC key.
    fn new(material: &[u8]) -> Result<Self, BadKeyLength> {
        if material.len() != KEY_LEN + MAC_KEY_LEN {
            return Err(BadKeyLength);
        }
        let (k, m) = material.split_at(KEY_LEN);
        let cipher = TdesEde3::new_from_slice(k).map_err(|_| BadKeyLength)?;
        let mut mac_key = Zeroizing::new([0u8; SHA1_BLOCK]);
        mac_key[..MAC_KEY_LEN].copy_from_slice(m);
        Ok(Self { cipher, mac_key })
    }

    fn encrypt_block(&self, block: &mut [u8; BLOCK]) {
        self.cipher
            .encrypt_block(GenericArray::from_mut_slice(block.as_mut_slice()));
    }

    fn mac(&self, aad: &[u8], ciphertext: &[u8]) -> Hmac<Sha1> {
        let mut mac = <Hmac<Sha1> as KeyInit>::new(GenericArray::from_slice(&*self.mac_key));
        mac.update(aad);
        mac.update(ciphertext);
        mac
    }
}

/// One direction's 3DES-CBC + HMAC-SHA1-96 key: the root of its key epochs.
pub(crate) struct TdesHmacSha1 {
    root: Zeroizing<[u8; KEY_LEN + MAC_KEY_LEN]>,
    iv_mask: Zeroizing<[u8; BLOCK]>,
    epoch_chunks: u64,
}

impl TdesHmacSha1 {
    /// `material` = the schedule's 44 bytes for this direction (the epochs' root);
    /// `chunk_size` sets the epoch length and must be at most [`MAX_CHUNK`].
    pub(crate) fn new(
        material: &[u8],
        iv: &[u8; IV_LEN],
        chunk_size: u32,
    ) -> Result<Self, BadKeyLength> {
        if chunk_size > MAX_CHUNK {
            return Err(BadKeyLength);
        }
        let mut root = Zeroizing::new([0u8; KEY_LEN + MAC_KEY_LEN]);
        if material.len() != root.len() {
            return Err(BadKeyLength);
        }
        root.copy_from_slice(material);
        let mut iv_mask = Zeroizing::new([0u8; BLOCK]);
        iv_mask.copy_from_slice(&iv[..BLOCK]);
        Ok(Self {
            root,
            iv_mask,
            epoch_chunks: epoch_chunks(chunk_size),
        })
    }

    /// The keys of the epoch that chunk counter `counter` belongs to.
    fn keys_for(&self, counter: u64) -> Result<EpochKeys, BadKeyLength> {
        let epoch = counter / self.epoch_chunks;
        let mut material = Zeroizing::new([0u8; KEY_LEN + MAC_KEY_LEN]);
        epoch_key_material(EPOCH_SALT, &*self.root, epoch, &mut *material)?;
        EpochKeys::new(&*material)
    }

    fn iv(&self, k: &EpochKeys, counter: u64) -> [u8; BLOCK] {
        let mut iv = counter.to_be_bytes();
        for (b, m) in iv.iter_mut().zip(self.iv_mask.iter()) {
            *b ^= m;
        }
        k.encrypt_block(&mut iv);
        iv
    }

    pub(crate) fn seal(&self, counter: u64, aad: &[u8], data: &mut [u8], tag: &mut [u8]) {
        let Ok(k) = self.keys_for(counter) else {
            // HKDF cannot fail for 44 bytes of output; if it did, leave nothing usable behind
            // (a zero tag never verifies against the peer's HMAC).
            data.fill(0);
            tag.fill(0);
            return;
        };
        cbc_rbt_encrypt(&k, self.iv(&k, counter), data);
        let full = k.mac(aad, data).finalize().into_bytes();
        tag.copy_from_slice(&full[..TAG_LEN]);
    }

    pub(crate) fn open(
        &self,
        counter: u64,
        aad: &[u8],
        data: &mut [u8],
        tag: &[u8],
    ) -> Result<(), BadTag> {
        if tag.len() != TAG_LEN {
            return Err(BadTag);
        }
        let k = self.keys_for(counter).map_err(|_| BadTag)?;
        // Encrypt-then-MAC: authenticate before touching the ciphertext (constant-time compare).
        k.mac(aad, data)
            .verify_truncated_left(tag)
            .map_err(|_| BadTag)?;
        cbc_rbt_decrypt(&k, self.iv(&k, counter), data);
        Ok(())
    }
}

/// CBC over whole blocks, residual block termination for the tail.
fn cbc_rbt_encrypt(k: &EpochKeys, iv: [u8; BLOCK], data: &mut [u8]) {
    let mut prev = iv;
    let mut blocks = data.chunks_exact_mut(BLOCK);
    for block in &mut blocks {
        for (b, p) in block.iter_mut().zip(prev) {
            *b ^= p;
        }
        k.cipher.encrypt_block(GenericArray::from_mut_slice(block));
        prev.copy_from_slice(block);
    }
    let tail = blocks.into_remainder();
    if !tail.is_empty() {
        k.encrypt_block(&mut prev);
        for (b, s) in tail.iter_mut().zip(prev) {
            *b ^= s;
        }
    }
}

fn cbc_rbt_decrypt(k: &EpochKeys, iv: [u8; BLOCK], data: &mut [u8]) {
    let whole = data.len() / BLOCK * BLOCK;
    // The tail's keystream depends on the last *ciphertext* block: compute it before decrypting.
    let (body, tail) = data.split_at_mut(whole);
    if !tail.is_empty() {
        let mut last = iv;
        if whole >= BLOCK {
            last.copy_from_slice(&body[whole - BLOCK..]);
        }
        k.encrypt_block(&mut last);
        for (b, s) in tail.iter_mut().zip(last) {
            *b ^= s;
        }
    }
    let mut prev = iv;
    for block in body.chunks_exact_mut(BLOCK) {
        let mut c = [0u8; BLOCK];
        c.copy_from_slice(block);
        k.cipher.decrypt_block(GenericArray::from_mut_slice(block));
        for (b, p) in block.iter_mut().zip(prev) {
            *b ^= p;
        }
        prev = c;
    }
}

#[cfg(test)]
pub(crate) mod test_hooks {
    //! Raw primitives for the known-answer tests.
    use super::*;

    fn key(key24: &[u8], mac: &[u8]) -> EpochKeys {
        let mut material = key24.to_vec();
        material.extend_from_slice(mac);
        EpochKeys::new(&material).unwrap()
    }

    pub(crate) fn ecb_encrypt(key24: &[u8], data: &mut [u8]) {
        let k = key(key24, &[0u8; MAC_KEY_LEN]);
        for b in data.chunks_exact_mut(BLOCK) {
            k.cipher.encrypt_block(GenericArray::from_mut_slice(b));
        }
    }

    pub(crate) fn cbc_encrypt(key24: &[u8], iv: [u8; BLOCK], data: &mut [u8]) {
        cbc_rbt_encrypt(&key(key24, &[0u8; MAC_KEY_LEN]), iv, data);
    }

    pub(crate) fn cbc_decrypt(key24: &[u8], iv: [u8; BLOCK], data: &mut [u8]) {
        cbc_rbt_decrypt(&key(key24, &[0u8; MAC_KEY_LEN]), iv, data);
    }

    pub(crate) fn hmac_sha1(mac_key20: &[u8], data: &[u8]) -> Vec<u8> {
        key(&[0x01; KEY_LEN], mac_key20)
            .mac(&[], data)
            .finalize()
            .into_bytes()
            .to_vec()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn key(chunk: u32) -> TdesHmacSha1 {
        TdesHmacSha1::new(&[0x42; KEY_LEN + MAC_KEY_LEN], &[0x17; IV_LEN], chunk).unwrap()
    }

    /// A fingerprint of an epoch's keys: the MAC of a fixed message and one encrypted block.
    fn fingerprint(k: &TdesHmacSha1, counter: u64) -> Vec<u8> {
        let e = k.keys_for(counter).unwrap();
        let mut block = [0u8; BLOCK];
        e.encrypt_block(&mut block);
        let mut out = e.mac(b"aad", b"data").finalize().into_bytes().to_vec();
        out.extend_from_slice(&block);
        out
    }

    #[test]
    fn no_key_encrypts_more_blocks_than_sp800_67_allows() {
        for chunk in (512..=MAX_CHUNK).step_by(512) {
            let per_chunk = u64::from(chunk) / 8 + 2;
            let e = epoch_chunks(chunk);
            assert!(e >= 1, "chunk {chunk}");
            assert!(
                e * per_chunk <= KEY_BLOCK_LIMIT,
                "chunk {chunk}: {e} chunks"
            );
            assert!(
                (e + 1) * per_chunk > KEY_BLOCK_LIMIT,
                "chunk {chunk}: epochs could be longer"
            );
        }
        assert_eq!(epoch_chunks(65536), 127);
    }

    #[test]
    fn refuses_chunks_larger_than_one_epoch() {
        let material = [0x42; KEY_LEN + MAC_KEY_LEN];
        assert!(TdesHmacSha1::new(&material, &[0; IV_LEN], MAX_CHUNK).is_ok());
        assert!(TdesHmacSha1::new(&material, &[0; IV_LEN], MAX_CHUNK + 512).is_err());
    }

    #[test]
    fn keys_change_exactly_at_epoch_boundaries() {
        let k = key(65536);
        let e = epoch_chunks(65536);
        let first = fingerprint(&k, 0);
        assert_eq!(first, fingerprint(&k, e - 1));
        let second = fingerprint(&k, e);
        assert_ne!(first, second);
        assert_eq!(second, fingerprint(&k, 2 * e - 1));
        let third = fingerprint(&k, 2 * e);
        assert_ne!(third, first);
        assert_ne!(third, second);
        // Derived, not the root itself.
        let root = EpochKeys::new(&[0x42; KEY_LEN + MAC_KEY_LEN]).unwrap();
        assert_ne!(
            first[..TAG_LEN],
            root.mac(b"aad", b"data").finalize().into_bytes()[..TAG_LEN]
        );
    }

    #[test]
    fn round_trips_on_both_sides_of_a_boundary_and_binds_the_epoch() {
        let k = key(4096);
        let e = epoch_chunks(4096);
        for counter in [0, e - 1, e, e + 1, 5 * e] {
            let plain: Vec<u8> = (0..4096u32).map(|i| (i * 7) as u8).collect();
            let mut data = plain.clone();
            let mut tag = [0u8; TAG_LEN];
            k.seal(counter, b"aad", &mut data, &mut tag);
            assert_ne!(data, plain);
            let mut copy = data.clone();
            k.open(counter, b"aad", &mut copy, &tag).unwrap();
            assert_eq!(copy, plain, "counter {counter}");
            // The same bytes and tag presented as a counter of the next epoch do not verify.
            let mut moved = data.clone();
            assert!(k.open(counter + e, b"aad", &mut moved, &tag).is_err());
        }
    }
}
