//! **Legacy** `3des-cbc-hmac-sha1`: three-key TDEA (NIST SP 800-67) in CBC mode (NIST SP 800-38A
//! §6.2) with HMAC-SHA1-96 (RFC 2104, RFC 2404), encrypt-then-MAC.
//!
//! This reproduces the papers' cipher (3DES) with the MAC IPsec usually paired with it; it exists
//! only so the lab can compare against the papers. Its 64-bit block limits how much data one key
//! may safely protect (SP 800-67 Rev. 2 caps a key at 2^20 blocks = 8 MiB); Seal does not enforce
//! that cap, which is one more reason never to use this cipher for real data.
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

use crate::cipher::{BadKeyLength, BadTag, IV_LEN};

/// Three 8-byte DES keys.
pub(crate) const KEY_LEN: usize = 24;
/// HMAC-SHA1 key length (RFC 2404 §3: 160 bits).
pub(crate) const MAC_KEY_LEN: usize = 20;
/// HMAC-SHA1-96: the first 96 bits of the HMAC (RFC 2404 §2).
pub(crate) const TAG_LEN: usize = 12;
const BLOCK: usize = 8;
const SHA1_BLOCK: usize = 64;

pub(crate) struct TdesHmacSha1 {
    /// Zeroized on drop by `des`'s `zeroize` feature.
    cipher: TdesEde3,
    /// The 20-byte HMAC key zero-padded to SHA-1's 64-byte block, which is exactly how HMAC
    /// treats a short key (RFC 2104 §2), so building the MAC cannot fail.
    mac_key: Zeroizing<[u8; SHA1_BLOCK]>,
    iv_mask: Zeroizing<[u8; BLOCK]>,
}

impl TdesHmacSha1 {
    /// `material` = 24 bytes of TDEA key followed by 20 bytes of MAC key.
    pub(crate) fn new(material: &[u8], iv: &[u8; IV_LEN]) -> Result<Self, BadKeyLength> {
        if material.len() != KEY_LEN + MAC_KEY_LEN {
            return Err(BadKeyLength);
        }
        let (k, m) = material.split_at(KEY_LEN);
        let cipher = TdesEde3::new_from_slice(k).map_err(|_| BadKeyLength)?;
        let mut mac_key = Zeroizing::new([0u8; SHA1_BLOCK]);
        mac_key[..MAC_KEY_LEN].copy_from_slice(m);
        let mut iv_mask = Zeroizing::new([0u8; BLOCK]);
        iv_mask.copy_from_slice(&iv[..BLOCK]);
        Ok(Self {
            cipher,
            mac_key,
            iv_mask,
        })
    }

    fn encrypt_block(&self, block: &mut [u8; BLOCK]) {
        self.cipher
            .encrypt_block(GenericArray::from_mut_slice(block.as_mut_slice()));
    }

    fn iv(&self, counter: u64) -> [u8; BLOCK] {
        let mut iv = counter.to_be_bytes();
        for (b, m) in iv.iter_mut().zip(self.iv_mask.iter()) {
            *b ^= m;
        }
        self.encrypt_block(&mut iv);
        iv
    }

    fn mac(&self, aad: &[u8], ciphertext: &[u8]) -> Hmac<Sha1> {
        let mut mac = <Hmac<Sha1> as KeyInit>::new(GenericArray::from_slice(&*self.mac_key));
        mac.update(aad);
        mac.update(ciphertext);
        mac
    }

    pub(crate) fn seal(&self, counter: u64, aad: &[u8], data: &mut [u8], tag: &mut [u8]) {
        cbc_rbt_encrypt(self, self.iv(counter), data);
        let full = self.mac(aad, data).finalize().into_bytes();
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
        // Encrypt-then-MAC: authenticate before touching the ciphertext (constant-time compare).
        self.mac(aad, data)
            .verify_truncated_left(tag)
            .map_err(|_| BadTag)?;
        cbc_rbt_decrypt(self, self.iv(counter), data);
        Ok(())
    }
}

/// CBC over whole blocks, residual block termination for the tail.
fn cbc_rbt_encrypt(k: &TdesHmacSha1, iv: [u8; BLOCK], data: &mut [u8]) {
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

fn cbc_rbt_decrypt(k: &TdesHmacSha1, iv: [u8; BLOCK], data: &mut [u8]) {
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

    fn key(key24: &[u8], mac: &[u8]) -> TdesHmacSha1 {
        let mut material = key24.to_vec();
        material.extend_from_slice(mac);
        TdesHmacSha1::new(&material, &[0u8; IV_LEN]).unwrap()
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
