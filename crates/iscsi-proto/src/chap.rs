//! CHAP authentication for iSCSI login (RFC 1994, RFC 7143 §12.1.3), usable from both sides.
//!
//! The exchange during the security negotiation stage (RFC 7143 §12.1.3):
//!
//! ```text
//! initiator -> target  CHAP_A=<A1,A2,...>            (offered algorithms, preferred first)
//! target -> initiator  CHAP_A=<A> CHAP_I=<I> CHAP_C=<C>
//! initiator -> target  CHAP_N=<N> CHAP_R=<R>         R = H(I || secret || C)
//!                      [CHAP_I=<I'> CHAP_C=<C'>]     (mutual CHAP: the initiator's challenge)
//! target -> initiator  [CHAP_N=<N'> CHAP_R=<R'>]     (mutual CHAP: the target's answer)
//! ```
//!
//! This module holds the pieces both sides need: the algorithm numbers ([`ChapAlgorithm`]), the
//! secret type ([`ChapSecret`], zeroized, never printed), the response computation
//! ([`response`]) and its constant-time check ([`verify`]), the binary value encoding of
//! RFC 7143 §6.1 ([`encode_binary`], [`decode_binary`]) and a [`ChallengeRecord`] that refuses a
//! challenge the peer reflects back at us or reuses (RFC 7143 §12.1.3: "the target MUST NOT
//! continue if the challenge it receives equals the one it sent").
//!
//! No I/O happens here except the explicit [`ChapSecret::from_file`] / [`ChapSecret::from_env`]
//! constructors; randomness comes from the operating system (`OsRng`).

use std::collections::VecDeque;
use std::fmt;
use std::path::Path;

use md5::Md5;
use rand::RngCore;
use sha1::Sha1;
use sha2::{Digest, Sha256};
use sha3::Sha3_256;
use subtle::ConstantTimeEq;
use zeroize::{Zeroize, ZeroizeOnDrop};

/// Longest challenge we accept or issue, in bytes. RFC 7143 §12.1.3 bounds CHAP_C by the
/// maximum length of a binary value in a text key; targets in the field use 16–1024 bytes.
pub const MAX_CHALLENGE_LEN: usize = 1024;

/// The shortest CHAP secret accepted, in bytes. RFC 7143 §12.1.3 asks for IPsec whenever a
/// secret has fewer than 96 random bits; 12 bytes is that much when random (`ipsan keygen`,
/// `openssl rand -base64 16`) and is also the Microsoft initiator's minimum, so no peer we
/// interoperate with needs less. Below it, an eavesdropper's offline search of a recorded
/// exchange is cheap whatever the hash.
pub const MIN_SECRET_LEN: usize = 12;

/// How many issued challenges a [`ChallengeRecord`] remembers, and how many received ones.
const RECORD_DEPTH: usize = 64;

/// Everything that can go wrong in a CHAP exchange. Never carries secret material.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ChapError {
    /// The peer named an algorithm number we do not implement.
    #[error("unsupported CHAP algorithm CHAP_A={0}")]
    UnsupportedAlgorithm(u32),
    /// None of the offered algorithms is acceptable to us.
    #[error("no acceptable CHAP algorithm in the offer")]
    NoCommonAlgorithm,
    /// A CHAP_A list item was not a decimal number.
    #[error("malformed CHAP_A value")]
    MalformedAlgorithmList,
    /// A CHAP_I value was not a decimal number in 0..=255.
    #[error("CHAP_I is not a decimal number in 0..=255")]
    MalformedIdentifier,
    /// A binary value (CHAP_C, CHAP_R) was not valid `0x` hex or `0b` base64.
    #[error("malformed binary value: {0}")]
    MalformedBinary(&'static str),
    /// A challenge was empty or longer than [`MAX_CHALLENGE_LEN`].
    #[error("challenge length {0} is outside 1..={max}", max = MAX_CHALLENGE_LEN)]
    ChallengeLength(usize),
    /// The peer sent back a challenge that we issued ourselves (a reflection attack).
    #[error("peer reflected our own CHAP challenge")]
    ReflectedChallenge,
    /// The peer reused a challenge it already sent in this session.
    #[error("peer reused a CHAP challenge")]
    ReusedChallenge,
    /// The secret was empty.
    #[error("CHAP secret is empty")]
    EmptySecret,
    /// A secret file anyone but its owner may read or write (the message says how to fix it).
    #[error("{0}")]
    SecretFile(String),
    /// The secret is shorter than [`MIN_SECRET_LEN`].
    #[error("CHAP secret is {0} bytes; at least {min} are required (RFC 7143 §12.1.3: 96 bits)", min = MIN_SECRET_LEN)]
    ShortSecret(usize),
    /// The secret could not be read; the message names the source, never the contents.
    #[error("cannot read CHAP secret from {source_name}: {reason}")]
    SecretSource {
        /// File path or environment variable name.
        source_name: String,
        /// Why it failed (I/O error kind, missing variable, ...).
        reason: String,
    },
}

/// A CHAP algorithm, as the number carried in `CHAP_A` (RFC 7143 §12.1.3; numbers from the
/// IANA PPP authentication algorithms registry, as used by open-iscsi and libiscsi).
///
/// A newtype so that an unknown number from the wire survives parsing and can be reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChapAlgorithm(pub u32);

impl ChapAlgorithm {
    /// MD5 (RFC 1994). Still the only one every target implements (libiscsi 1.19 offers
    /// nothing else); broken as a hash, so offered or accepted only when configured.
    pub const MD5: ChapAlgorithm = ChapAlgorithm(5);
    /// SHA-1.
    pub const SHA1: ChapAlgorithm = ChapAlgorithm(6);
    /// SHA-256.
    pub const SHA256: ChapAlgorithm = ChapAlgorithm(7);
    /// SHA3-256.
    pub const SHA3_256: ChapAlgorithm = ChapAlgorithm(8);

    /// Every algorithm we implement, strongest first.
    pub const ALL: [ChapAlgorithm; 4] = [Self::SHA3_256, Self::SHA256, Self::SHA1, Self::MD5];

    /// What we offer and accept unless told otherwise: SHA-256 first (the most widely
    /// implemented of the 32-byte ones: open-iscsi, LIO, Windows), then SHA3-256 and SHA-1.
    /// MD5 only when configured (RFC 7143 §12.1.3 keeps it mandatory to implement, not to use).
    pub const DEFAULT: [ChapAlgorithm; 3] = [Self::SHA256, Self::SHA3_256, Self::SHA1];

    /// An algorithm by name or number: `md5`/`5`, `sha1`/`sha-1`/`6`, `sha256`/`sha-256`/`7`,
    /// `sha3-256`/`8` (configuration files and flags).
    pub fn from_name(name: &str) -> Option<ChapAlgorithm> {
        match name.trim().to_ascii_lowercase().as_str() {
            "md5" | "5" => Some(Self::MD5),
            "sha1" | "sha-1" | "6" => Some(Self::SHA1),
            "sha256" | "sha-256" | "7" => Some(Self::SHA256),
            "sha3-256" | "sha3_256" | "8" => Some(Self::SHA3_256),
            _ => None,
        }
    }

    /// Digest length in bytes, or `None` for an algorithm we do not implement.
    pub fn digest_len(self) -> Option<usize> {
        match self.0 {
            5 => Some(16),
            6 => Some(20),
            7 | 8 => Some(32),
            _ => None,
        }
    }

    /// Whether we implement this algorithm.
    pub fn is_supported(self) -> bool {
        self.digest_len().is_some()
    }

    /// Short name for logs ("MD5", "SHA-256", ...).
    pub fn name(self) -> &'static str {
        match self.0 {
            5 => "MD5",
            6 => "SHA-1",
            7 => "SHA-256",
            8 => "SHA3-256",
            _ => "unknown",
        }
    }

    /// Parse a `CHAP_A` value: a comma-separated list of decimal numbers (RFC 7143 §6.1
    /// list-of-values). Unknown numbers are kept; see [`ChapAlgorithm::choose`].
    pub fn parse_list(value: &str) -> Result<Vec<ChapAlgorithm>, ChapError> {
        value
            .split(',')
            .map(|item| {
                let item = item.trim();
                if item.is_empty() || !item.bytes().all(|b| b.is_ascii_digit()) {
                    return Err(ChapError::MalformedAlgorithmList);
                }
                item.parse::<u32>()
                    .map(ChapAlgorithm)
                    .map_err(|_| ChapError::MalformedAlgorithmList)
            })
            .collect()
    }

    /// Format a list as a `CHAP_A` value.
    pub fn format_list(algs: &[ChapAlgorithm]) -> String {
        algs.iter()
            .map(|a| a.0.to_string())
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Responder side: pick the first algorithm in the originator's `offered` list (its order
    /// of preference, RFC 7143 §6.2) that also appears in `acceptable` and that we implement.
    pub fn choose(
        offered: &[ChapAlgorithm],
        acceptable: &[ChapAlgorithm],
    ) -> Result<ChapAlgorithm, ChapError> {
        offered
            .iter()
            .copied()
            .find(|a| a.is_supported() && acceptable.contains(a))
            .ok_or(ChapError::NoCommonAlgorithm)
    }
}

impl fmt::Display for ChapAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// A CHAP secret. Zeroized on drop; `Debug` prints `<redacted>`; never `Display`ed.
#[derive(Clone, Zeroize, ZeroizeOnDrop)]
pub struct ChapSecret(Vec<u8>);

impl ChapSecret {
    /// A secret from raw bytes. Refuses an empty secret and one shorter than
    /// [`MIN_SECRET_LEN`].
    pub fn new(bytes: impl Into<Vec<u8>>) -> Result<Self, ChapError> {
        let mut bytes = bytes.into();
        if bytes.is_empty() {
            return Err(ChapError::EmptySecret);
        }
        if bytes.len() < MIN_SECRET_LEN {
            let n = bytes.len();
            bytes.zeroize();
            return Err(ChapError::ShortSecret(n));
        }
        Ok(Self(bytes))
    }

    /// A secret read from a file; one trailing newline (`\n` or `\r\n`) is dropped so that
    /// `echo secret > file` works. A file the group or others may read or write is refused
    /// ([`crate::secret_file::check_mode`]). The error names the path, never the contents.
    pub fn from_file(path: &Path) -> Result<Self, ChapError> {
        crate::secret_file::check_mode(path).map_err(|e| match e {
            crate::secret_file::SecretFileError::Unreadable { .. } => ChapError::SecretSource {
                source_name: path.display().to_string(),
                reason: "cannot be read".into(),
            },
            mode @ crate::secret_file::SecretFileError::Mode { .. } => {
                ChapError::SecretFile(mode.to_string())
            }
        })?;
        let mut bytes = std::fs::read(path).map_err(|e| ChapError::SecretSource {
            source_name: path.display().to_string(),
            reason: e.kind().to_string(),
        })?;
        if bytes.last() == Some(&b'\n') {
            bytes.pop();
            if bytes.last() == Some(&b'\r') {
                bytes.pop();
            }
        }
        let secret = Self::new(std::mem::take(&mut bytes));
        bytes.zeroize();
        secret
    }

    /// A secret from an environment variable. The error names the variable, never the value.
    pub fn from_env(var: &str) -> Result<Self, ChapError> {
        let value = std::env::var_os(var).ok_or_else(|| ChapError::SecretSource {
            source_name: format!("${var}"),
            reason: "not set".into(),
        })?;
        let value = value.into_string().map_err(|_| ChapError::SecretSource {
            source_name: format!("${var}"),
            reason: "not valid UTF-8".into(),
        })?;
        Self::new(value.into_bytes())
    }

    /// The secret bytes, for computing a response.
    pub fn expose(&self) -> &[u8] {
        &self.0
    }

    /// RFC 7143 §12.1.3 asks for secrets of at least 96 bits (12 bytes) when CHAP runs over an
    /// unprotected network; callers may warn when this is false.
    pub fn meets_recommended_length(&self) -> bool {
        self.0.len() >= 12
    }

    /// Constant-time equality, e.g. to refuse a configuration where both directions of mutual
    /// CHAP share one secret (RFC 7143 §12.1.3).
    pub fn ct_eq(&self, other: &ChapSecret) -> bool {
        self.0.ct_eq(&other.0).into()
    }
}

impl fmt::Debug for ChapSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("ChapSecret(<redacted>)")
    }
}

/// The CHAP response `H(id || secret || challenge)` (RFC 1994 §4.1, RFC 7143 §12.1.3).
pub fn response(
    alg: ChapAlgorithm,
    id: u8,
    secret: &ChapSecret,
    challenge: &[u8],
) -> Result<Vec<u8>, ChapError> {
    fn run<D: Digest>(id: u8, secret: &[u8], challenge: &[u8]) -> Vec<u8> {
        let mut h = D::new();
        h.update([id]);
        h.update(secret);
        h.update(challenge);
        h.finalize().to_vec()
    }
    let s = secret.expose();
    Ok(match alg.0 {
        5 => run::<Md5>(id, s, challenge),
        6 => run::<Sha1>(id, s, challenge),
        7 => run::<Sha256>(id, s, challenge),
        8 => run::<Sha3_256>(id, s, challenge),
        n => return Err(ChapError::UnsupportedAlgorithm(n)),
    })
}

/// Check a peer's CHAP response in constant time (with respect to the response contents).
/// Returns false for a wrong length or an unsupported algorithm, never panics.
pub fn verify(
    alg: ChapAlgorithm,
    id: u8,
    secret: &ChapSecret,
    challenge: &[u8],
    received: &[u8],
) -> bool {
    match response(alg, id, secret, challenge) {
        Ok(mut expected) => {
            let ok: bool = expected.ct_eq(received).into();
            expected.zeroize();
            ok
        }
        Err(_) => false,
    }
}

/// Parse a `CHAP_I` value: a decimal number 0..=255 (RFC 7143 §12.1.3).
pub fn parse_identifier(value: &str) -> Result<u8, ChapError> {
    let v = value.trim();
    if v.is_empty() || v.len() > 3 || !v.bytes().all(|b| b.is_ascii_digit()) {
        return Err(ChapError::MalformedIdentifier);
    }
    v.parse::<u8>().map_err(|_| ChapError::MalformedIdentifier)
}

/// Encode a binary value as RFC 7143 §6.1 hex (`0x...`, lowercase), the form every target
/// accepts.
pub fn encode_binary(bytes: &[u8]) -> String {
    format!("0x{}", hex::encode(bytes))
}

/// Encode a binary value as RFC 7143 §6.1 base64 (`0b...`, RFC 4648 with padding).
pub fn encode_binary_base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::with_capacity(2 + bytes.len().div_ceil(3) * 4);
    out.push_str("0b");
    for chunk in bytes.chunks(3) {
        let b = [
            chunk[0],
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..4 {
            if i <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}

/// Decode an RFC 7143 §6.1 binary value: `0x`/`0X` followed by hex digits (an odd count gets
/// an implied leading zero nibble) or `0b`/`0B` followed by RFC 4648 base64 (padding optional).
pub fn decode_binary(value: &str) -> Result<Vec<u8>, ChapError> {
    let v = value.trim();
    if v.len() < 3 {
        return Err(ChapError::MalformedBinary("too short"));
    }
    if let Some(body) = v.strip_prefix("0x").or_else(|| v.strip_prefix("0X")) {
        let padded;
        let digits = if body.len() % 2 == 1 {
            padded = format!("0{body}");
            padded.as_str()
        } else {
            body
        };
        hex::decode(digits).map_err(|_| ChapError::MalformedBinary("bad hex digit"))
    } else if let Some(body) = v.strip_prefix("0b").or_else(|| v.strip_prefix("0B")) {
        decode_base64(body)
    } else {
        Err(ChapError::MalformedBinary("missing 0x or 0b prefix"))
    }
}

fn decode_base64(body: &str) -> Result<Vec<u8>, ChapError> {
    fn val(c: u8) -> Option<u32> {
        Some(u32::from(match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        }))
    }
    let trimmed = body.trim_end_matches('=');
    let pad = body.len() - trimmed.len();
    if pad > 2 || (pad > 0 && body.len() % 4 != 0) {
        return Err(ChapError::MalformedBinary("bad base64 padding"));
    }
    let data = trimmed.as_bytes();
    if data.len() % 4 == 1 {
        return Err(ChapError::MalformedBinary("truncated base64"));
    }
    let mut out = Vec::with_capacity(data.len() * 3 / 4);
    for chunk in data.chunks(4) {
        let mut n = 0u32;
        for (i, &c) in chunk.iter().enumerate() {
            let v = val(c).ok_or(ChapError::MalformedBinary("bad base64 character"))?;
            n |= v << (18 - 6 * i);
        }
        let bytes = n.to_be_bytes();
        out.extend_from_slice(&bytes[1..chunk.len()]);
    }
    Ok(out)
}

/// A fresh challenge as sent in `CHAP_I` / `CHAP_C`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// The algorithm the challenge is for.
    pub alg: ChapAlgorithm,
    /// The one-octet identifier (`CHAP_I`).
    pub id: u8,
    /// The challenge bytes (`CHAP_C`). Not secret; sent in the clear.
    pub challenge: Vec<u8>,
}

/// Remembers the challenges we issued and those we received, so that a peer cannot reflect
/// our own challenge back at us nor replay one (RFC 7143 §12.1.3). One record per session on
/// either side; bounded memory.
#[derive(Debug, Default)]
pub struct ChallengeRecord {
    issued: VecDeque<Vec<u8>>,
    received: VecDeque<Vec<u8>>,
}

impl ChallengeRecord {
    /// An empty record.
    pub fn new() -> Self {
        Self::default()
    }

    /// Issue a new random challenge of `len` bytes (at least the digest length is
    /// customary; 16 for MD5) with a random identifier, and remember it.
    pub fn issue(&mut self, alg: ChapAlgorithm, len: usize) -> Result<Challenge, ChapError> {
        if !alg.is_supported() {
            return Err(ChapError::UnsupportedAlgorithm(alg.0));
        }
        if len == 0 || len > MAX_CHALLENGE_LEN {
            return Err(ChapError::ChallengeLength(len));
        }
        let mut rng = rand::rngs::OsRng;
        let mut challenge = vec![0u8; len];
        rng.fill_bytes(&mut challenge);
        let mut id = [0u8; 1];
        rng.fill_bytes(&mut id);
        push_bounded(&mut self.issued, challenge.clone());
        Ok(Challenge {
            alg,
            id: id[0],
            challenge,
        })
    }

    /// Accept a challenge from the peer: refuses one outside the length bounds, one equal to a
    /// challenge we issued (reflection), or one the peer already sent (reuse).
    pub fn accept_incoming(&mut self, challenge: &[u8]) -> Result<(), ChapError> {
        if challenge.is_empty() || challenge.len() > MAX_CHALLENGE_LEN {
            return Err(ChapError::ChallengeLength(challenge.len()));
        }
        if self.issued.iter().any(|c| c.as_slice() == challenge) {
            return Err(ChapError::ReflectedChallenge);
        }
        if self.received.iter().any(|c| c.as_slice() == challenge) {
            return Err(ChapError::ReusedChallenge);
        }
        push_bounded(&mut self.received, challenge.to_vec());
        Ok(())
    }
}

fn push_bounded(q: &mut VecDeque<Vec<u8>>, v: Vec<u8>) {
    if q.len() == RECORD_DEPTH {
        q.pop_front();
    }
    q.push_back(v);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secret() -> ChapSecret {
        ChapSecret::new(b"ipsan-secret-0123".to_vec()).unwrap()
    }

    fn challenge16() -> Vec<u8> {
        (0u8..16).collect()
    }

    // Expected values computed independently with python3 hashlib:
    //   hashlib.<alg>(bytes([0x2a]) + b"ipsan-secret-0123" + bytes(range(16))).hexdigest()
    #[test]
    fn md5_response_matches_rfc1994_construction() {
        let r = response(ChapAlgorithm::MD5, 0x2a, &secret(), &challenge16()).unwrap();
        assert_eq!(hex::encode(r), "eebb93880d82b6fe4802eff71ecc473b");
        // hashlib.md5(b"\x01" + b"twelve-bytes" + b"\xde\xad\xbe\xef").hexdigest()
        let s = ChapSecret::new(b"twelve-bytes".to_vec()).unwrap();
        let r = response(ChapAlgorithm::MD5, 1, &s, &[0xde, 0xad, 0xbe, 0xef]).unwrap();
        assert_eq!(hex::encode(r), "be73f26040db7a6888cb6377853f71ac");
    }

    #[test]
    fn sha_family_responses_match_hashlib() {
        let cases = [
            (
                ChapAlgorithm::SHA1,
                "33b5be91eee1252d07512e46aa720ebfbd43a71b",
            ),
            (
                ChapAlgorithm::SHA256,
                "89e971e717c84f02ff9d4f1d7c4bf7e73a6b9833b1970d3eae4e1f639c7e88ec",
            ),
            (
                ChapAlgorithm::SHA3_256,
                "8cee73b427ac44007a34467c968b6fc699b12986f06ff304a6ac7255edd853a8",
            ),
        ];
        for (alg, want) in cases {
            let r = response(alg, 0x2a, &secret(), &challenge16()).unwrap();
            assert_eq!(r.len(), alg.digest_len().unwrap());
            assert_eq!(hex::encode(r), want, "{alg}");
        }
    }

    #[test]
    fn verify_accepts_right_and_rejects_wrong_responses() {
        let c = challenge16();
        for alg in ChapAlgorithm::ALL {
            let r = response(alg, 7, &secret(), &c).unwrap();
            assert!(verify(alg, 7, &secret(), &c, &r));
            let mut bad = r.clone();
            bad[0] ^= 1;
            assert!(!verify(alg, 7, &secret(), &c, &bad));
            assert!(!verify(alg, 8, &secret(), &c, &r), "identifier is bound");
            assert!(!verify(alg, 7, &secret(), &c, &r[..r.len() - 1]));
            let other = ChapSecret::new(b"another-secret!!".to_vec()).unwrap();
            assert!(!verify(alg, 7, &other, &c, &r));
        }
    }

    #[test]
    fn rejects_unsupported_algorithm() {
        assert_eq!(
            response(ChapAlgorithm(9), 0, &secret(), b"x"),
            Err(ChapError::UnsupportedAlgorithm(9))
        );
        assert!(!verify(ChapAlgorithm(9), 0, &secret(), b"x", b""));
    }

    #[test]
    fn secret_debug_is_redacted() {
        let s = secret();
        let dbg = format!("{s:?}");
        assert!(!dbg.contains("ipsan-secret"));
        assert!(dbg.contains("<redacted>"));
    }

    #[test]
    fn rejects_empty_secret() {
        assert_eq!(
            ChapSecret::new(Vec::new()).err(),
            Some(ChapError::EmptySecret)
        );
    }

    #[test]
    fn rejects_secrets_shorter_than_96_bits() {
        assert_eq!(
            ChapSecret::new(b"eleven-byte".to_vec()).err(),
            Some(ChapError::ShortSecret(11))
        );
        assert!(ChapSecret::new(b"twelve-bytes".to_vec()).is_ok());
        let e = ChapSecret::new(b"eleven-byte".to_vec())
            .unwrap_err()
            .to_string();
        assert!(e.contains("12") && !e.contains("eleven"), "{e}");
    }

    #[test]
    fn default_offer_prefers_sha256_and_leaves_md5_out() {
        assert_eq!(ChapAlgorithm::DEFAULT[0], ChapAlgorithm::SHA256);
        assert!(!ChapAlgorithm::DEFAULT.contains(&ChapAlgorithm::MD5));
        assert_eq!(ChapAlgorithm::from_name("MD5"), Some(ChapAlgorithm::MD5));
        assert_eq!(
            ChapAlgorithm::from_name("sha-256"),
            Some(ChapAlgorithm::SHA256)
        );
        assert_eq!(ChapAlgorithm::from_name("sha512"), None);
    }

    #[test]
    fn secret_from_file_drops_one_trailing_newline() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, b"hunter2hunter2\r\n").unwrap();
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
        let s = ChapSecret::from_file(&p).unwrap();
        assert_eq!(s.expose(), b"hunter2hunter2");
        // The same file readable by the group is refused, naming the fix, not the secret.
        std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
        let e = ChapSecret::from_file(&p).unwrap_err().to_string();
        assert!(e.contains("chmod 600") && !e.contains("hunter2"), "{e}");
        let missing = ChapSecret::from_file(&dir.path().join("nope")).unwrap_err();
        assert!(matches!(missing, ChapError::SecretSource { .. }));
    }

    #[test]
    fn secret_from_env_names_the_variable_not_the_value() {
        let err = ChapSecret::from_env("IPSAN_TEST_CHAP_SECRET_SURELY_UNSET").unwrap_err();
        assert!(err
            .to_string()
            .contains("IPSAN_TEST_CHAP_SECRET_SURELY_UNSET"));
    }

    #[test]
    fn binary_values_round_trip_hex_and_base64() {
        let c = challenge16();
        assert_eq!(encode_binary(&c), "0x000102030405060708090a0b0c0d0e0f");
        // base64.b64encode(bytes(range(16))) == b'AAECAwQFBgcICQoLDA0ODw=='
        assert_eq!(encode_binary_base64(&c), "0bAAECAwQFBgcICQoLDA0ODw==");
        assert_eq!(encode_binary_base64(b"ab"), "0bYWI=");
        assert_eq!(encode_binary_base64(b"abc"), "0bYWJj");
        assert_eq!(encode_binary_base64(b"a"), "0bYQ==");
        for v in [&c[..], b"a", b"ab", b"abc", b"abcd"] {
            assert_eq!(decode_binary(&encode_binary(v)).unwrap(), v);
            assert_eq!(decode_binary(&encode_binary_base64(v)).unwrap(), v);
        }
        assert_eq!(decode_binary("0XABcd").unwrap(), vec![0xab, 0xcd]);
        assert_eq!(decode_binary("0xabc").unwrap(), vec![0x0a, 0xbc]);
        assert_eq!(decode_binary("0bYWI").unwrap(), b"ab");
    }

    #[test]
    fn rejects_malformed_binary_values() {
        for bad in [
            "", "0x", "abcd", "0xzz", "0b!!!!", "0bY", "0bYQ===", "0bY=Q=", "0éab", "0béé",
        ] {
            assert!(decode_binary(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn algorithm_lists_parse_and_choose_in_offer_order() {
        let offered = ChapAlgorithm::parse_list("9, 7,5").unwrap();
        assert_eq!(
            offered,
            vec![ChapAlgorithm(9), ChapAlgorithm::SHA256, ChapAlgorithm::MD5]
        );
        assert_eq!(
            ChapAlgorithm::choose(&offered, &ChapAlgorithm::ALL),
            Ok(ChapAlgorithm::SHA256)
        );
        assert_eq!(
            ChapAlgorithm::choose(&offered, &[ChapAlgorithm::SHA1]),
            Err(ChapError::NoCommonAlgorithm)
        );
        assert!(ChapAlgorithm::parse_list("5,,7").is_err());
        assert!(ChapAlgorithm::parse_list("md5").is_err());
        assert_eq!(ChapAlgorithm::format_list(&ChapAlgorithm::ALL), "8,7,6,5");
    }

    #[test]
    fn identifier_parses_only_octets() {
        assert_eq!(parse_identifier("0"), Ok(0));
        assert_eq!(parse_identifier("255"), Ok(255));
        for bad in ["256", "-1", "", "0x10", "1000"] {
            assert!(parse_identifier(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn rejects_reflected_challenge() {
        let mut rec = ChallengeRecord::new();
        let ours = rec.issue(ChapAlgorithm::MD5, 16).unwrap();
        assert_eq!(ours.challenge.len(), 16);
        assert_eq!(
            rec.accept_incoming(&ours.challenge),
            Err(ChapError::ReflectedChallenge)
        );
    }

    #[test]
    fn rejects_reused_challenge() {
        let mut rec = ChallengeRecord::new();
        rec.accept_incoming(b"peer challenge 1").unwrap();
        assert_eq!(
            rec.accept_incoming(b"peer challenge 1"),
            Err(ChapError::ReusedChallenge)
        );
        rec.accept_incoming(b"peer challenge 2").unwrap();
    }

    #[test]
    fn rejects_challenge_lengths_out_of_bounds() {
        let mut rec = ChallengeRecord::new();
        assert!(rec.issue(ChapAlgorithm::MD5, 0).is_err());
        assert!(rec
            .issue(ChapAlgorithm::MD5, MAX_CHALLENGE_LEN + 1)
            .is_err());
        assert!(rec.accept_incoming(&[]).is_err());
        assert!(rec
            .accept_incoming(&vec![1; MAX_CHALLENGE_LEN + 1])
            .is_err());
    }

    #[test]
    fn issued_challenges_differ() {
        let mut rec = ChallengeRecord::new();
        let a = rec.issue(ChapAlgorithm::SHA256, 32).unwrap();
        let b = rec.issue(ChapAlgorithm::SHA256, 32).unwrap();
        assert_ne!(a.challenge, b.challenge);
    }
}
