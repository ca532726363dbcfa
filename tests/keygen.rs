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
