//! The one mode check every secret file passes before it is read (CHAP secrets here, Seal
//! pre-shared secrets through `ipsan_initiator::psk_from_file`, the target's configuration):
//! a secret the group or the world can read or write is no secret, so such a file is refused,
//! with the fix (`chmod 600`) in the message and never its contents.

use std::path::Path;

/// Why a secret file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretFileError {
    /// The file could not be inspected (missing, unreadable).
    #[error("{path}: {reason}")]
    Unreadable {
        /// The file.
        path: String,
        /// The I/O error.
        reason: String,
    },
    /// The group or others may read or write it.
    #[error("{path} has mode {mode:04o}: a secret file must not be readable or writable by group or others (chmod 600 {path})")]
    Mode {
        /// The file.
        path: String,
        /// Its permission bits.
        mode: u32,
    },
}

/// Refuses `path` unless only its owner may read or write it (mode 0600 or 0400 and the like).
/// Follows symlinks: the mode of the file the secret is read from is what counts.
pub fn check_mode(path: &Path) -> Result<(), SecretFileError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|e| SecretFileError::Unreadable {
        path: path.display().to_string(),
        reason: e.to_string(),
    })?;
    let mode = meta.permissions().mode() & 0o777;
    if mode & 0o077 != 0 {
        return Err(SecretFileError::Mode {
            path: path.display().to_string(),
            mode,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn rejects_group_or_world_access_and_accepts_owner_only() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("s");
        std::fs::write(&p, "a-secret-of-some-length").unwrap();
        for mode in [0o640, 0o604, 0o660, 0o644, 0o602] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            let e = check_mode(&p).unwrap_err().to_string();
            assert!(
                e.contains(&format!("{mode:04o}")) && e.contains("chmod 600"),
                "{e}"
            );
            assert!(!e.contains("a-secret"), "{e}");
        }
        for mode in [0o600, 0o400] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            check_mode(&p).unwrap();
        }
        assert!(matches!(
            check_mode(&dir.path().join("missing")),
            Err(SecretFileError::Unreadable { .. })
        ));
    }
}
