//! Host identities and the secret files an NVMe host reads: a random UUID, the UUID-based
//! host NQN (NVMe Base 2.0 §4.5), and the `DHHC-1:` and `NVMeTLSkey-1:` files, refused unless
//! only their owner may read them.

use super::{ConfiguredPsk, DhchapSecret, NvmeError};

/// A random (version 4) UUID.
#[must_use]
pub fn random_uuid() -> [u8; 16] {
    let mut b: [u8; 16] = rand::random();
    b[6] = (b[6] & 0x0f) | 0x40;
    b[8] = (b[8] & 0x3f) | 0x80;
    b
}

/// The UUID-based host NQN (NVMe Base 2.0 §4.5): `nqn.2014-08.org.nvmexpress:uuid:…`.
#[must_use]
pub fn hostnqn_for(uuid: &[u8; 16]) -> String {
    let h: String = uuid.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "nqn.2014-08.org.nvmexpress:uuid:{}-{}-{}-{}-{}",
        &h[0..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..32]
    )
}

/// Parses a textual UUID (`xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`).
///
/// # Errors
/// Anything else.
pub fn parse_uuid(s: &str) -> Result<[u8; 16], NvmeError> {
    let hex: String = s.chars().filter(|&c| c != '-').collect();
    let bad = || NvmeError::Invalid(format!("not a UUID: {s:?}"));
    if hex.len() != 32 || s.len() != 36 {
        return Err(bad());
    }
    let mut out = [0u8; 16];
    for (i, o) in out.iter_mut().enumerate() {
        *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
            .map_err(|_| bad())?;
    }
    Ok(out)
}

/// Reads a `DHHC-1:` secret from `path`, refused unless only its owner may read it (the same
/// check as every other secret file).
///
/// # Errors
/// The mode, an unreadable file, or text that is not a DHHC-1 secret (the error never holds
/// the secret).
pub fn dhchap_secret_from_file(path: &std::path::Path) -> Result<DhchapSecret, NvmeError> {
    secret_from_file(path, DhchapSecret::parse)
}

/// Reads an `NVMeTLSkey-1:` configured PSK from `path` (owner-only mode, like every secret
/// file).
///
/// # Errors
/// The mode, an unreadable file, or text that is not such a key (never printed).
pub fn tls_key_from_file(path: &std::path::Path) -> Result<ConfiguredPsk, NvmeError> {
    secret_from_file(path, ConfiguredPsk::parse)
}

/// The owner-only check, the read into memory that is zeroed when dropped, and `parse` on the
/// trimmed text; errors name the path and the parser's own message, never the text.
fn secret_from_file<T, E: std::fmt::Display>(
    path: &std::path::Path,
    parse: impl FnOnce(&str) -> Result<T, E>,
) -> Result<T, NvmeError> {
    crate::secret_file::check_mode(path).map_err(|e| NvmeError::Invalid(e.to_string()))?;
    let text = zeroize::Zeroizing::new(
        std::fs::read_to_string(path)
            .map_err(|e| NvmeError::Invalid(format!("{}: {e}", path.display())))?,
    );
    parse(text.trim()).map_err(|e| NvmeError::Invalid(format!("{}: {e}", path.display())))
}
