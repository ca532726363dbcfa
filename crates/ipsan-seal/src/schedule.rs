//! Pre-shared secrets and the key schedule (documented in `docs/seal.md` §3).
//!
//! ```text
//! CI       = lv_cat("ipsan-seal v4", InitiatorName, TargetName, ISID)
//! Ya, Yb, ISK = CPace(PRS = PSK, CI, sid = Ni)        (crate::cpace, draft-irtf-cfrg-cpace)
//! PRK      = HKDF-Extract(salt = Ni || Nt, IKM = ISK)                        RFC 5869 §2.2
//! context  = lp("ipsan-seal v4") || lp(cipher) || u32(chunk) || lp(InitiatorName)
//!            || lp(TargetName) || ISID(6) || lp(offer as sent by the initiator)
//! K_label  = HKDF-Expand(PRK, lp(label) || context, L)                       RFC 5869 §2.3
//! labels   : "i2t key", "i2t iv", "t2i key", "t2i iv", "confirm", "record"
//! confirm_t = HMAC-SHA256(K_confirm, "target" || H_t)
//! confirm_i = HMAC-SHA256(K_confirm, "initiator" || H_i)
//! ```
//! The PSK enters only as CPace's password: nothing sent on the wire is a function of the PSK
//! and public values alone, so neither a recorded login nor the target's answer to a probe
//! lets anyone test a guess offline (v3 keyed HKDF with the PSK directly, and `confirm_t` was
//! a dictionary oracle). `H_t`/`H_i` are login transcript hashes
//! ([`crate::record::LoginTranscript`]): every byte of every Login PDU exchanged before the PDU
//! that carries the confirmation, so a relay that edits any login key (not only Seal's) fails
//! key confirmation. `K("record")` is the root of the per-PDU record keys, which also bind the
//! whole transcript (docs/seal.md §3, §4a). `lp(x)` is a 2-byte big-endian length followed by
//! `x`. `Ni`/`Nt` are the 32-byte random values of `X-org.ipsan.SealNonce`. Binding the offer
//! as sent makes a stripped offer (a downgrade to a weaker cipher) fail key confirmation.

use std::fmt;
use std::path::Path;

use aws_lc_rs::hmac;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use crate::cipher::{hkdf_sha256, ChunkKey, Cipher, IV_LEN};
use crate::error::{NegotiationError, SecretError};

/// A pre-shared secret for one target/initiator pair. `Debug` prints `<redacted>`; the bytes are
/// zeroized on drop.
#[derive(Clone)]
pub struct Psk(Zeroizing<Vec<u8>>);

impl Psk {
    /// Minimum secret length in bytes (128 bits).
    pub const MIN_LEN: usize = 16;

    /// Whether two secrets are equal, in constant time (a changed secret is told apart
    /// without a timing side channel).
    #[must_use]
    pub fn ct_eq(&self, other: &Psk) -> bool {
        subtle::ConstantTimeEq::ct_eq(self.0.as_slice(), other.0.as_slice()).into()
    }

    /// Wraps secret bytes; rejects secrets shorter than [`Psk::MIN_LEN`].
    pub fn new(bytes: Vec<u8>) -> Result<Psk, SecretError> {
        let bytes = Zeroizing::new(bytes);
        if bytes.len() < Self::MIN_LEN {
            return Err(SecretError::TooShort {
                len: bytes.len(),
                min: Self::MIN_LEN,
            });
        }
        Ok(Psk(bytes))
    }

    /// Reads a secret file: its bytes, without trailing whitespace/newlines. A secret that
    /// looks guessable ([`weak_secret_warning`]) is logged as a warning (never its content).
    pub fn from_file(path: &Path) -> Result<Psk, SecretError> {
        let mut raw = Zeroizing::new(std::fs::read(path).map_err(|source| SecretError::Io {
            path: path.to_owned(),
            source,
        })?);
        while raw.last().is_some_and(|b| b.is_ascii_whitespace()) {
            raw.pop();
        }
        if let Some(w) = weak_secret_warning(&raw) {
            tracing::warn!(path = %path.display(), "{w}");
        }
        Psk::new(std::mem::take(&mut *raw))
    }

    /// A fresh 256-bit secret from the system RNG as 64 lowercase hex digits, the form
    /// `ipsan keygen` writes and [`Psk::from_file`] reads (the 64 characters are the secret).
    pub fn generate_hex() -> Result<Zeroizing<String>, SecretError> {
        use aws_lc_rs::rand::{SecureRandom, SystemRandom};
        let mut bytes = Zeroizing::new([0u8; 32]);
        SystemRandom::new()
            .fill(&mut bytes[..])
            .map_err(|_| SecretError::Random)?;
        Ok(Zeroizing::new(hex::encode(&bytes[..])))
    }

    pub(crate) fn expose(&self) -> &[u8] {
        &self.0
    }
}

/// Below this estimate (bits) a secret gets [`weak_secret_warning`].
pub const WEAK_SECRET_BITS: f64 = 80.0;

/// A rough entropy estimate of a secret in bits, for a warning only (never a guarantee). The
/// secret is first cut to its shortest repeating unit (`Summer2024!Summer2024!` counts as
/// `Summer2024!`); then each run of three or more ASCII letters counts as one dictionary word,
/// min(14 bits (a ~16k-word list), +1 if it has capitals; its length × log2(pool)), and every
/// other byte log2(pool), where the pool is the sum of the character classes present (26 lower,
/// 26 upper, 10 digits, 33 ASCII punctuation and space, 128 for any other byte). A zxcvbn-like
/// lower bound on what a guesser must try, not a measurement.
#[must_use]
pub fn estimated_entropy_bits(secret: &[u8]) -> f64 {
    let period = (1..=secret.len())
        .find(|&p| (p..secret.len()).all(|i| secret[i] == secret[i - p]))
        .unwrap_or(secret.len());
    let unit = &secret[..period];
    let has = |f: fn(&u8) -> bool| unit.iter().any(f);
    let mut pool = 0.0;
    for (present, size) in [
        (has(u8::is_ascii_lowercase), 26.0),
        (has(u8::is_ascii_uppercase), 26.0),
        (has(u8::is_ascii_digit), 10.0),
        (has(|b| b.is_ascii_punctuation() || *b == b' '), 33.0),
        (
            has(|b| !(b.is_ascii_alphanumeric() || b.is_ascii_punctuation() || *b == b' ')),
            128.0,
        ),
    ] {
        if present {
            pool += size;
        }
    }
    let per_char = f64::log2(f64::max(pool, 2.0));
    let mut bits = 0.0;
    let mut i = 0;
    while i < unit.len() {
        let run = unit[i..]
            .iter()
            .take_while(|b| b.is_ascii_alphabetic())
            .count();
        if run >= 3 {
            let word = &unit[i..i + run];
            let caps = if word.iter().any(u8::is_ascii_uppercase) {
                1.0
            } else {
                0.0
            };
            bits += f64::min(14.0 + caps, run as f64 * per_char);
            i += run;
        } else {
            bits += per_char;
            i += 1;
        }
    }
    bits
}

/// The warning for a secret whose [`estimated_entropy_bits`] is below [`WEAK_SECRET_BITS`]:
/// it names the risk that remains with CPace (online guessing, one refused login per guess,
/// slowed only by the lockout) and the remedy. Never contains the secret.
#[must_use]
pub fn weak_secret_warning(secret: &[u8]) -> Option<String> {
    let bits = estimated_entropy_bits(secret);
    (bits < WEAK_SECRET_BITS).then(|| {
        format!(
            "seal: this pre-shared secret looks low-entropy (about {bits:.0} bits by a \
             character-class and word estimate, under {WEAK_SECRET_BITS:.0}): no recording or \
             probe tests it offline, but each online guess costs an attacker only one refused \
             login, slowed by the lockout ([server.auth_backoff]); a word list can still get \
             there. Use a random secret (`ipsan keygen --out FILE`)"
        )
    })
}

impl fmt::Debug for Psk {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Psk(<redacted>)")
    }
}

/// The login's identities that the keys are bound to (RFC 7143 §13.11, §13.12, §11.12.5).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct SessionIds {
    /// InitiatorName (an iqn./eui./naa. name).
    pub initiator_name: String,
    /// TargetName.
    pub target_name: String,
    /// The 6-byte ISID of the Login PDU.
    pub isid: [u8; 6],
}

pub(crate) const NONCE_LEN: usize = 32;
/// The schedule's version label. v3: confirmations bind the login transcript and every PDU is
/// authenticated by the record layer. v4: the PSK enters only through CPace (a v3 peer sends
/// no `X-org.ipsan.SealShare` and fails the login with "missing parameter").
pub(crate) const SCHEDULE_LABEL: &[u8] = b"ipsan-seal v4";
/// Length of a login transcript hash (SHA-256).
pub const TRANSCRIPT_HASH_LEN: usize = 32;
/// A login transcript hash ([`crate::record::LoginTranscript::hash`]).
pub type TranscriptHash = [u8; TRANSCRIPT_HASH_LEN];
const CONFIRM_LEN: usize = 32;

fn lp(out: &mut Vec<u8>, x: &[u8]) {
    // Names and offers are bounded by the 8192-byte text limit, so the length fits 16 bits;
    // clamp anyway so a longer value cannot alias a shorter one.
    let n = u16::try_from(x.len()).unwrap_or(u16::MAX);
    out.extend_from_slice(&n.to_be_bytes());
    out.extend_from_slice(&x[..usize::from(n)]);
}

/// CPace's channel identifier (draft-irtf-cfrg-cpace §3.1): the schedule label and the
/// identities the keys are bound to, so a share made for one initiator/target/ISID pairing
/// fits no other.
pub(crate) fn cpace_ci(ids: &SessionIds) -> Vec<u8> {
    crate::cpace::lv_cat(&[
        SCHEDULE_LABEL,
        ids.initiator_name.as_bytes(),
        ids.target_name.as_bytes(),
        &ids.isid,
    ])
}

/// Everything both sides agree on, from which the keys are derived.
pub(crate) struct Transcript<'a> {
    pub cipher: Cipher,
    pub chunk_size: u32,
    pub ids: &'a SessionIds,
    pub offer: &'a str,
    pub nonce_i: &'a [u8; NONCE_LEN],
    pub nonce_t: &'a [u8; NONCE_LEN],
}

/// Keys for both directions, the confirmation key and the record root.
pub(crate) struct Derived {
    pub i2t: ChunkKey,
    pub t2i: ChunkKey,
    pub confirm: ConfirmKey,
    pub record: Zeroizing<[u8; 32]>,
}

/// `K_confirm`: computes `confirm_t`/`confirm_i` over a transcript hash.
pub(crate) struct ConfirmKey(hmac::Key);

impl ConfirmKey {
    fn tag(&self, who: &[u8], transcript: &TranscriptHash) -> Zeroizing<[u8; CONFIRM_LEN]> {
        let mut ctx = hmac::Context::with_key(&self.0);
        ctx.update(who);
        ctx.update(transcript);
        let mut out = Zeroizing::new([0u8; CONFIRM_LEN]);
        out.copy_from_slice(ctx.sign().as_ref());
        out
    }

    /// The target's confirmation over `H_t` (every login PDU before the response carrying it).
    pub fn target(&self, transcript: &TranscriptHash) -> Zeroizing<[u8; CONFIRM_LEN]> {
        self.tag(b"target", transcript)
    }

    /// The initiator's confirmation over `H_i` (every login PDU before the request carrying it).
    pub fn initiator(&self, transcript: &TranscriptHash) -> Zeroizing<[u8; CONFIRM_LEN]> {
        self.tag(b"initiator", transcript)
    }
}

/// The session keys from CPace's ISK and the transcript (the PSK is not an input here).
pub(crate) fn derive(
    isk: &crate::cpace::Isk,
    t: &Transcript<'_>,
) -> Result<Derived, NegotiationError> {
    let mut salt = [0u8; 2 * NONCE_LEN];
    salt[..NONCE_LEN].copy_from_slice(t.nonce_i);
    salt[NONCE_LEN..].copy_from_slice(t.nonce_t);

    let mut ctx = Vec::with_capacity(256);
    lp(&mut ctx, SCHEDULE_LABEL);
    lp(&mut ctx, t.cipher.name().as_bytes());
    ctx.extend_from_slice(&t.chunk_size.to_be_bytes());
    lp(&mut ctx, t.ids.initiator_name.as_bytes());
    lp(&mut ctx, t.ids.target_name.as_bytes());
    ctx.extend_from_slice(&t.ids.isid);
    lp(&mut ctx, t.offer.as_bytes());

    let expand = |label: &str, out: &mut [u8]| -> Result<(), NegotiationError> {
        let mut l = Vec::with_capacity(2 + label.len());
        lp(&mut l, label.as_bytes());
        hkdf_sha256(&salt, &isk[..], &[l.as_slice(), ctx.as_slice()], out)
    };

    let key_len = t.cipher.key_len();
    let mut key = Zeroizing::new(vec![0u8; key_len]);
    let mut iv = Zeroizing::new([0u8; IV_LEN]);
    expand("i2t key", &mut key)?;
    expand("i2t iv", &mut *iv)?;
    let i2t =
        ChunkKey::new(t.cipher, t.chunk_size, &key, *iv).map_err(|_| NegotiationError::Crypto)?;
    expand("t2i key", &mut key)?;
    expand("t2i iv", &mut *iv)?;
    let t2i =
        ChunkKey::new(t.cipher, t.chunk_size, &key, *iv).map_err(|_| NegotiationError::Crypto)?;

    let mut kc = Zeroizing::new([0u8; 32]);
    expand("confirm", &mut *kc)?;
    let mut record = Zeroizing::new([0u8; 32]);
    expand("record", &mut *record)?;
    Ok(Derived {
        i2t,
        t2i,
        confirm: ConfirmKey(hmac::Key::new(hmac::HMAC_SHA256, &*kc)),
        record,
    })
}

/// Constant-time comparison of a received confirmation value.
pub(crate) fn confirm_matches(expected: &[u8; CONFIRM_LEN], received: &[u8]) -> bool {
    received.len() == CONFIRM_LEN && bool::from(expected.as_slice().ct_eq(received))
}

/// RFC 7143 §6.1 hex-constant: `0x` followed by hex digits.
pub(crate) fn to_hex_constant(bytes: &[u8]) -> String {
    format!("0x{}", hex::encode(bytes))
}

pub(crate) fn from_hex_constant(s: &str) -> Option<Vec<u8>> {
    let digits = s.strip_prefix("0x").or_else(|| s.strip_prefix("0X"))?;
    hex::decode(digits).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn psk_debug_is_redacted() {
        let p = Psk::new(b"correct horse battery staple".to_vec()).unwrap();
        let d = format!("{p:?}");
        assert_eq!(d, "Psk(<redacted>)");
    }

    #[test]
    fn rejects_short_secrets() {
        assert!(matches!(
            Psk::new(b"short".to_vec()),
            Err(SecretError::TooShort { len: 5, min: 16 })
        ));
    }

    #[test]
    fn psk_file_strips_trailing_newline() {
        let dir = std::env::temp_dir().join(format!("seal-psk-{}", std::process::id()));
        std::fs::write(&dir, b"0123456789abcdef\n").unwrap();
        let p = Psk::from_file(&dir).unwrap();
        std::fs::remove_file(&dir).unwrap();
        assert_eq!(p.expose(), b"0123456789abcdef");
    }

    #[test]
    fn warns_about_human_chosen_secrets_and_not_about_generated_ones() {
        for weak in [
            "Summer2024!Summer2024!",
            "correct horse battery staple",
            "aaaaaaaaaaaaaaaaaaaaaaaa",
            "0123456789abcdef",
            "PasswordPassword1",
        ] {
            let w = weak_secret_warning(weak.as_bytes());
            assert!(
                w.is_some(),
                "{weak}: {}",
                estimated_entropy_bits(weak.as_bytes())
            );
            let w = w.unwrap();
            assert!(!w.contains(weak) && w.contains("online guess"), "{w}");
        }
        for _ in 0..20 {
            let g = Psk::generate_hex().unwrap();
            assert_eq!(g.len(), 64);
            assert!(
                weak_secret_warning(g.as_bytes()).is_none(),
                "{}",
                estimated_entropy_bits(g.as_bytes())
            );
        }
        assert!(weak_secret_warning(&[
            0x5a, 0x13, 0xf7, 0x88, 0x01, 0xc4, 0x9e, 0x3b, 0x70, 0x2d, 0xe1, 0x46, 0xbb, 0x0f,
            0x92, 0x6c
        ])
        .is_none());
        assert!(weak_secret_warning(b"kT9#vQ2!mZ7$wR4&xP8").is_none());
    }

    #[test]
    fn hex_constants_round_trip_and_reject_missing_prefix() {
        assert_eq!(to_hex_constant(&[0xab, 0x01]), "0xab01");
        assert_eq!(from_hex_constant("0XAB01"), Some(vec![0xab, 0x01]));
        assert_eq!(from_hex_constant("ab01"), None);
        assert_eq!(from_hex_constant("0xzz"), None);
    }
}
