//! Known-answer tests from published vectors (`testdata/`), run through Seal's own wiring
//! (nonce = static IV XOR counter, with counter 0 so the nonce equals the vector's IV).

use std::collections::HashMap;

use aws_lc_rs::aead;

use crate::cipher::hkdf_sha256;
use crate::cipher::{aead_open, aead_seal, Cipher, IV_LEN};
use crate::tdes::test_hooks;

fn records(file: &str) -> Vec<HashMap<String, String>> {
    let path = format!("{}/testdata/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    let mut cur = HashMap::new();
    for line in text.lines().chain(std::iter::once("")) {
        let line = line.trim();
        if line.starts_with('#') {
            continue;
        }
        if line.is_empty() {
            if !cur.is_empty() {
                out.push(std::mem::take(&mut cur));
            }
            continue;
        }
        let (k, v) = line.split_once('=').unwrap();
        cur.insert(k.trim().to_owned(), v.trim().to_owned());
    }
    assert!(!out.is_empty(), "{path} has no records");
    out
}

fn hx(r: &HashMap<String, String>, k: &str) -> Vec<u8> {
    hex::decode(&r[k]).unwrap()
}

fn aead_kat(cipher: Cipher, file: &str) {
    for r in records(file) {
        // The vectors' keys are used as they are: this checks the cipher calls Seal makes for
        // every chunk, with the key an epoch would derive (docs/seal.md §4) replaced by the
        // vector's.
        let iv: [u8; IV_LEN] = hx(&r, "iv").try_into().unwrap();
        let alg = match cipher {
            Cipher::Aes256Gcm => &aead::AES_256_GCM,
            Cipher::ChaCha20Poly1305 => &aead::CHACHA20_POLY1305,
            _ => unreachable!("AEAD vectors only"),
        };
        let key = aead::LessSafeKey::new(aead::UnboundKey::new(alg, &hx(&r, "key")).unwrap());
        let aad = hx(&r, "aad");
        let mut data = hx(&r, "plaintext");
        let mut tag = [0u8; 16];
        aead_seal(&key, &iv, 0, &aad, &mut data, &mut tag);
        assert_eq!(data, hx(&r, "ciphertext"), "{} ciphertext", r["name"]);
        assert_eq!(tag.to_vec(), hx(&r, "tag"), "{} tag", r["name"]);
        aead_open(&key, &iv, 0, &aad, &mut data, &tag).unwrap();
        assert_eq!(data, hx(&r, "plaintext"), "{} round trip", r["name"]);
    }
}

#[test]
fn aes_256_gcm_matches_gcm_spec_vectors() {
    aead_kat(Cipher::Aes256Gcm, "aes256gcm.txt");
}

#[test]
fn chacha20_poly1305_matches_rfc8439_vector() {
    aead_kat(Cipher::ChaCha20Poly1305, "chacha20poly1305.txt");
}

#[test]
fn tdea_matches_sp800_67_and_cbc_vectors() {
    for r in records("tdea.txt") {
        let key = hx(&r, "key");
        let mut data = hx(&r, "plaintext");
        match r["mode"].as_str() {
            "ecb" => test_hooks::ecb_encrypt(&key, &mut data),
            "cbc" => {
                let iv: [u8; 8] = hx(&r, "iv").try_into().unwrap();
                test_hooks::cbc_encrypt(&key, iv, &mut data);
                assert_eq!(data, hx(&r, "ciphertext"), "{}", r["name"]);
                test_hooks::cbc_decrypt(&key, iv, &mut data);
                assert_eq!(data, hx(&r, "plaintext"), "{} decrypt", r["name"]);
                continue;
            }
            m => panic!("unknown mode {m}"),
        }
        assert_eq!(data, hx(&r, "ciphertext"), "{}", r["name"]);
    }
}

#[test]
fn hmac_sha1_matches_rfc2202_vectors() {
    for r in records("hmac_sha1.txt") {
        let got = test_hooks::hmac_sha1(&hx(&r, "key"), &hx(&r, "data"));
        assert_eq!(got, hx(&r, "digest"), "{}", r["name"]);
    }
}

#[test]
fn hkdf_sha256_matches_rfc5869_vectors() {
    for r in records("hkdf_sha256.txt") {
        let want = hx(&r, "okm");
        let mut out = vec![0u8; want.len()];
        hkdf_sha256(
            &hx(&r, "salt"),
            &hx(&r, "ikm"),
            &[&hx(&r, "info")],
            &mut out,
        )
        .unwrap();
        assert_eq!(out, want, "{}", r["name"]);
    }
}

#[test]
fn tdes_residual_tail_round_trips_and_keeps_length() {
    // Lengths that are not whole 8-byte blocks use residual block termination.
    let key = [0x5au8; 24];
    for len in [1usize, 7, 8, 9, 15, 17, 100] {
        let plain: Vec<u8> = (0..len as u8).collect();
        let mut data = plain.clone();
        test_hooks::cbc_encrypt(&key, [3; 8], &mut data);
        assert_ne!(data, plain);
        test_hooks::cbc_decrypt(&key, [3; 8], &mut data);
        assert_eq!(data, plain, "len {len}");
    }
}
