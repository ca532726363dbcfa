//! DHHC-1 secrets made by another implementation (nvme-cli 2.13 / libnvme 1.13's
//! `gen-dhchap-key`, tests/data/dhchap-keys.txt says how): every one parses, round-trips, and
//! the keys nvme-cli made from a given secret with a transformation are the transformation this
//! crate computes (nvme-cli prints HMAC(secret, NQN || "NVMe-over-Fabrics"), the same function
//! Linux's `nvme_auth_transform_key` applies to a configured secret).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use nvme_proto::auth::{DhchapSecret, HashId, SecretError};

const KEYS: &str = include_str!("data/dhchap-keys.txt");

fn hash(m: &str) -> Option<HashId> {
    HashId::from_id(m.parse().unwrap())
}

fn unhex(h: &str) -> Vec<u8> {
    (0..h.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&h[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn accepts_every_secret_nvme_cli_made_and_writes_it_back_unchanged() {
    let mut n = 0;
    for line in KEYS
        .lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
    {
        let f: Vec<&str> = line.split(' ').collect();
        let text = f.last().unwrap();
        let s = DhchapSecret::parse(text).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert_eq!(s.transform(), hash(f[1]), "{line}");
        assert_eq!(s.key_len(), f[2].parse::<usize>().unwrap(), "{line}");
        assert_eq!(s.to_dhhc1().as_str(), *text, "{line}");
        n += 1;
    }
    assert_eq!(n, 21);
}

#[test]
fn computes_the_key_transformation_nvme_cli_computes() {
    let mut n = 0;
    for line in KEYS.lines().filter(|l| l.starts_with("fixed ")) {
        let f: Vec<&str> = line.split(' ').collect();
        let (m, nqn, raw, text) = (f[1], f[3], unhex(f[4]), f[5]);
        let printed = DhchapSecret::parse(text).unwrap();
        let ours = DhchapSecret::from_key(&raw, hash(m)).unwrap();
        let want = DhchapSecret::from_key(&ours.transformed(nqn), hash(m)).unwrap();
        assert_eq!(printed, want, "{line}");
        if m == "0" {
            assert_eq!(printed, ours, "{line}");
        } else {
            // The transformation depends on the NQN: the same secret for another NQN differs.
            let other = DhchapSecret::from_key(&ours.transformed("nqn.other"), hash(m)).unwrap();
            assert_ne!(printed, other, "{line}");
        }
        n += 1;
    }
    assert_eq!(n, 12);
}

#[test]
fn rejects_a_secret_whose_crc_does_not_match() {
    let good = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    assert!(DhchapSecret::parse(good).is_ok());
    // One key byte changed (the first base64 character: 00h -> 04h).
    let bad = good.replacen("AAEC", "BAEC", 1);
    assert_eq!(DhchapSecret::parse(&bad).unwrap_err(), SecretError::Crc);
    // The CRC's last character changed.
    let bad = good.replacen("KfiaR", "KfiaS", 1);
    assert_eq!(DhchapSecret::parse(&bad).unwrap_err(), SecretError::Crc);
}

#[test]
fn rejects_malformed_secrets_with_clear_errors_that_hold_no_key_material() {
    let good = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";
    // Truncated: 30 bytes decoded (26 of key), not 36, 52 or 68.
    let short = "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwd:";
    let cases = [
        (short, SecretError::Length { got: 26 }),
        (
            "DHHC-1:04:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            SecretError::Transform(4),
        ),
        (
            "DHHC-2:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            SecretError::Format,
        ),
        (
            "DHHC-1:0:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            SecretError::Format,
        ),
        (
            "DHHC-1:00:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+Kfia!:",
            SecretError::Base64,
        ),
        (
            "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:",
            SecretError::Format,
        ),
    ];
    for (text, want) in cases {
        let err = DhchapSecret::parse(text).unwrap_err();
        assert_eq!(err, want, "{text}");
        assert!(!err.to_string().contains("AAEC"), "{err}");
    }
    // The trailing colon is optional, as in Linux.
    assert!(DhchapSecret::parse(good.trim_end_matches(':')).is_ok());
    let s = DhchapSecret::parse(good).unwrap();
    assert_eq!(format!("{s:?}"), "<redacted>");
}
