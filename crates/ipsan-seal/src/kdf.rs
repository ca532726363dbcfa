//! What the AEADs (`cipher`) and legacy 3DES (`tdes`) share below them: the HKDF
//! every key comes from (RFC 5869), a key epoch's key material (docs/seal.md §4 *Key epochs*),
//! the per-direction IV's length, and the two failures a chunk cipher reports. Imports nothing
//! of this crate but the negotiation error, so neither cipher module imports the other's items.

use aws_lc_rs::hkdf;

use crate::error::NegotiationError;

/// HKDF-SHA256 (RFC 5869): extract with `salt` over `ikm`, then expand `info` into `out`. The
/// one KDF under the chunk keys here, the key schedule and the record keys.
pub(crate) fn hkdf_sha256(
    salt: &[u8],
    ikm: &[u8],
    info: &[&[u8]],
    out: &mut [u8],
) -> Result<(), NegotiationError> {
    hkdf::Salt::new(hkdf::HKDF_SHA256, salt)
        .extract(ikm)
        .expand(info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .map_err(|_| NegotiationError::Crypto)
}

/// An HKDF output length (aws-lc-rs takes it as a key type).
struct Len(usize);
impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// Length of the per-direction static IV that counters are XORed into.
pub(crate) const IV_LEN: usize = 12;

/// Key epoch `epoch`'s key material from a direction's root (docs/seal.md §4 *Key epochs*):
/// `HKDF-SHA256(salt, IKM = root, info = epoch as 8 bytes big-endian)`, `out.len()` bytes.
pub(crate) fn epoch_key_material(
    salt: &[u8],
    root: &[u8],
    epoch: u64,
    out: &mut [u8],
) -> Result<(), BadKeyLength> {
    hkdf_sha256(salt, root, &[&epoch.to_be_bytes()], out).map_err(|_| BadKeyLength)
}

/// Key material of the wrong length reached a cipher (a bug in the key schedule).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadKeyLength;

/// The tag did not verify (deliberately carries nothing).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BadTag;
