//! `ipsan keygen` (issue 31 item 2): a 256-bit random secret that `Psk::from_file` reads,
//! written with O_EXCL and mode 0600, never over an existing file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::os::unix::fs::PermissionsExt;
use std::process::Command;

const BIN: &str = env!("CARGO_BIN_EXE_ipsan");

fn keygen(args: &[&str]) -> std::process::Output {
    Command::new(BIN).arg("keygen").args(args).output().unwrap()
}

#[test]
fn accepts_a_new_file_with_mode_0600_that_the_secret_loader_reads() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seal.key");
    let out = keygen(&["--out", path.to_str().unwrap()]);
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty(), "the secret must not go to stdout");
    let meta = std::fs::metadata(&path).unwrap();
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let text = std::fs::read_to_string(&path).unwrap();
    let hex = text.trim_end();
    assert_eq!(hex.len(), 64, "{text:?}");
    assert!(hex.bytes().all(|b| b.is_ascii_hexdigit()));
    ipsan_seal::Psk::from_file(&path).unwrap();
    assert!(ipsan_seal::schedule::weak_secret_warning(hex.as_bytes()).is_none());
}

#[test]
fn rejects_overwriting_an_existing_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("seal.key");
    std::fs::write(&path, b"keep me\n").unwrap();
    let out = keygen(&["--out", path.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("never overwrites"), "{err}");
    assert_eq!(std::fs::read(&path).unwrap(), b"keep me\n");
}

#[test]
fn accepts_stdout_and_never_repeats_a_secret() {
    let a = keygen(&[]);
    let b = keygen(&[]);
    assert!(a.status.success() && b.status.success());
    let (a, b) = (
        String::from_utf8(a.stdout).unwrap(),
        String::from_utf8(b.stdout).unwrap(),
    );
    assert_eq!(a.trim_end().len(), 64);
    assert_ne!(a, b);
}

/// Where a secret file is loaded (`Psk::from_file`, here through `ipsan inquiry --secret-file`)
/// a human-chosen secret gets a warning that names the remaining risk and never shows the
/// secret; a `keygen` secret loads without one.
#[test]
fn warns_when_a_loaded_secret_looks_human_chosen() {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = tempfile::tempdir().unwrap();
    let weak = dir.path().join("weak.key");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&weak)
        .unwrap();
    std::io::Write::write_all(&mut f, b"Summer2024!Summer2024!\n").unwrap();
    let strong = dir.path().join("strong.key");
    assert!(keygen(&["--out", strong.to_str().unwrap()])
        .status
        .success());
    let load = |path: &std::path::Path| {
        // Nothing listens on port 1: the secret is loaded, then the connection fails.
        let out = Command::new(BIN)
            .args([
                "inquiry",
                "iscsi://127.0.0.1:1/iqn.2026-11.org.ipsan:nobody/0",
                "--seal",
                "aes-256-gcm",
                "--secret-file",
                path.to_str().unwrap(),
            ])
            .output()
            .unwrap();
        assert!(!out.status.success());
        String::from_utf8_lossy(&out.stderr).into_owned()
    };
    let err = load(&weak);
    assert!(
        err.contains("looks low-entropy") && err.contains("online guess"),
        "{err}"
    );
    assert!(!err.contains("Summer2024"), "the secret leaked: {err}");
    let err = load(&strong);
    assert!(!err.contains("low-entropy"), "{err}");
}
