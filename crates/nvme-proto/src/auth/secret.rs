//! DH-HMAC-CHAP secrets in the `DHHC-1` interchange format (NVMe Base 2.0's secret
//! representation, as nvme-cli's `gen-dhchap-key` writes them and Linux's
//! `nvme_auth_extract_key` reads them):
//!
//! ```text
//! DHHC-1:XX:<base64(key || le32(crc32(key)))>:
//! ```
//!
//! XX is the key transformation hash (00 none, 01 SHA-256, 02 SHA-384, 03 SHA-512), the key is
//! 32, 48 or 64 bytes, and the CRC is the ordinary CRC-32 (IEEE 802.3) of the key, little
//! endian. The key never appears in an error or in `Debug`.

use std::fmt;
use std::str::FromStr;

use base64::engine::general_purpose::STANDARD;
use base64::Engine as _;
use subtle::ConstantTimeEq;
use zeroize::Zeroizing;

use super::hash::HashId;

/// Why a `DHHC-1` secret was refused. None of the texts contains any part of the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("not a DH-HMAC-CHAP secret: expected DHHC-1:XX:<base64>: with XX 00, 01, 02 or 03")]
    Format,
    #[error("DHHC-1 key transformation {0:#04x} is not 00 (none), 01 (SHA-256), 02 (SHA-384) or 03 (SHA-512)")]
    Transform(u8),
    #[error("DHHC-1 secret is not valid base64")]
    Base64,
    #[error("DHHC-1 key is {got} bytes; keys are 32, 48 or 64 bytes followed by a 4-byte CRC-32")]
    Length { got: usize },
    #[error("DHHC-1 secret's CRC-32 does not match its key (mistyped or truncated secret)")]
    Crc,
}

/// A DH-HMAC-CHAP secret: the key and its transformation hash. `Debug` prints
/// `<redacted>`, the key is zeroized on drop, and equality is constant-time.
#[derive(Clone)]
pub struct DhchapSecret {
    key: Zeroizing<Vec<u8>>,
    transform: Option<HashId>,
}

impl fmt::Debug for DhchapSecret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

impl PartialEq for DhchapSecret {
    fn eq(&self, other: &Self) -> bool {
        self.transform == other.transform && bool::from(self.key.ct_eq(&other.key))
    }
}

impl Eq for DhchapSecret {}

impl DhchapSecret {
    /// A secret from raw key bytes.
    ///
    /// # Errors
    /// [`SecretError::Length`] unless the key is 32, 48 or 64 bytes.
    pub fn from_key(key: &[u8], transform: Option<HashId>) -> Result<Self, SecretError> {
        if !matches!(key.len(), 32 | 48 | 64) {
            return Err(SecretError::Length { got: key.len() });
        }
        Ok(Self {
            key: Zeroizing::new(key.to_vec()),
            transform,
        })
    }

    /// Parses `DHHC-1:XX:<base64>:` (the trailing colon may be left out, as Linux allows).
    ///
    /// # Errors
    /// [`SecretError`]: not the format, an unknown transformation, bad base64, a key of
    /// another length, or a CRC that does not match.
    pub fn parse(text: &str) -> Result<Self, SecretError> {
        let rest = text
            .trim()
            .strip_prefix("DHHC-1:")
            .ok_or(SecretError::Format)?;
        let (xx, rest) = rest.split_once(':').ok_or(SecretError::Format)?;
        if xx.len() != 2 || !xx.bytes().all(|b| b.is_ascii_digit()) {
            return Err(SecretError::Format);
        }
        let transform = match xx {
            "00" => None,
            "01" => Some(HashId::Sha256),
            "02" => Some(HashId::Sha384),
            "03" => Some(HashId::Sha512),
            other => {
                return Err(SecretError::Transform(other.parse().unwrap_or(u8::MAX)));
            }
        };
        let b64 = rest.strip_suffix(':').unwrap_or(rest);
        if b64.contains(':') {
            return Err(SecretError::Format);
        }
        let decoded = Zeroizing::new(STANDARD.decode(b64).map_err(|_| SecretError::Base64)?);
        if !matches!(decoded.len(), 36 | 52 | 68) {
            return Err(SecretError::Length {
                got: decoded.len().saturating_sub(4),
            });
        }
        let (key, crc) = decoded.split_at(decoded.len() - 4);
        let want = crc32fast::hash(key).to_le_bytes();
        if !bool::from(want.ct_eq(crc)) {
            return Err(SecretError::Crc);
        }
        Self::from_key(key, transform)
    }

    /// The secret in the interchange format, `DHHC-1:XX:<base64>:`.
    #[must_use]
    pub fn to_dhhc1(&self) -> Zeroizing<String> {
        let mut raw = Zeroizing::new(self.key.to_vec());
        raw.extend_from_slice(&crc32fast::hash(&self.key).to_le_bytes());
        Zeroizing::new(format!(
            "DHHC-1:{:02x}:{}:",
            self.transform.map_or(0, HashId::id),
            STANDARD.encode(&raw)
        ))
    }

    /// The key transformation hash (`None` for 00).
    #[must_use]
    pub fn transform(&self) -> Option<HashId> {
        self.transform
    }

    /// The key length in bytes (32, 48 or 64).
    #[must_use]
    pub fn key_len(&self) -> usize {
        self.key.len()
    }

    /// The transformed key used as the HMAC key of a response (TP 8006), as Linux's
    /// `nvme_auth_transform_key` computes it: the key itself for transformation 00, else
    /// `HMAC_XX(key, NQN || "NVMe-over-Fabrics")` with the transformation's hash (not the
    /// negotiated one). The host's secret is transformed with the host NQN, the controller's
    /// with the subsystem NQN.
    #[must_use]
    pub fn transformed(&self, nqn: &str) -> Zeroizing<Vec<u8>> {
        match self.transform {
            None => self.key.clone(),
            Some(hash) => hash.hmac(&self.key, &[nqn.as_bytes(), b"NVMe-over-Fabrics"]),
        }
    }
}

impl FromStr for DhchapSecret {
    type Err = SecretError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}
