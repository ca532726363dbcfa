//! nvme-tls against GnuTLS, the library Linux's `tlshd` does NVMe/TCP's handshakes with:
//! its target against `gnutls-cli` and its host against `gnutls-serv --echo`, TLS 1.3 with the
//! PSK and (EC)DHE only, as tlshd's priority string asks. Needs `gnutls-bin` (apt-get install
//! gnutls-bin); fails with that hint when it is missing.
//!
//! GnuTLS 3.7 (Debian 12) binds PSKs to SHA-256 in TLS 1.3 (`gnutls_psk_allocate_*2` with
//! SHA-384 arrived in 3.8), so only `01` keys are tried here; `02` keys are tried against
//! Linux's tlshd (GnuTLS 3.8) in `linux_target.rs` and against nvme-tls itself in
//! `loopback.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Stdio;
use std::time::Duration;

use nvme_proto::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash, PskStore};
use nvme_tls::{accept, connect_with};
use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::process::{Child, Command};
use tokio::time::timeout;

const H: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
const S: &str = "nqn.2026-11.org.example:nvmet";
const T: Duration = Duration::from_secs(20);
/// tlshd's TLS 1.3 PSK priorities (ktls-utils 1.0 `tlshd_gnutls_priority_init`, SHA-256 keys):
/// AES-128-GCM, (EC)DHE-PSK only.
const PRIORITY: &str =
    "NORMAL:-VERS-ALL:+VERS-TLS1.3:-CIPHER-ALL:+AES-128-GCM:-KX-ALL:+ECDHE-PSK:+DHE-PSK:%NO_TICKETS";

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn need(bin: &str) {
    let ok = std::process::Command::new(bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "{bin} is missing: apt-get install gnutls-bin");
}

fn key() -> ConfiguredPsk {
    ConfiguredPsk::parse("NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:")
        .unwrap()
}

/// Runs gnutls-cli against 127.0.0.1:`port` with `identity` and `psk`, sends "hello\n", and
/// returns what it printed once it has seen the echo or exited.
async fn gnutls_cli(port: u16, identity: &str, psk_hex: &str) -> (bool, String) {
    need("gnutls-cli");
    let mut child = Command::new("gnutls-cli")
        .args([
            "--priority",
            PRIORITY,
            "--pskusername",
            identity,
            "--pskkey",
            psk_hex,
        ])
        .args(["-p", &port.to_string(), "127.0.0.1"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    stdin.write_all(b"hello\n").await.unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut seen = String::new();
    let mut echoed = false;
    let _ = timeout(T, async {
        while let Ok(Some(line)) = out.next_line().await {
            seen.push_str(&line);
            seen.push('\n');
            if line.starts_with("hello") {
                echoed = true;
                break;
            }
        }
    })
    .await;
    drop(stdin);
    let _ = timeout(T, child.wait()).await;
    let mut err = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = timeout(Duration::from_secs(2), e.read_to_string(&mut err)).await;
    }
    (echoed, format!("{seen}{err}"))
}

/// A target accepting one connection; echoes its first 5 bytes; returns the identity.
async fn target(store: PskStore) -> (u16, tokio::task::JoinHandle<Result<String, String>>) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    let task = tokio::spawn(async move {
        let (s, _) = l.accept().await.unwrap();
        let mut acc = accept(s, &store).await.map_err(|e| e.to_string())?;
        let mut buf = [0u8; 5];
        acc.stream
            .read_exact(&mut buf)
            .await
            .map_err(|e| e.to_string())?;
        acc.stream
            .write_all(&buf)
            .await
            .map_err(|e| e.to_string())?;
        acc.stream
            .write_all(b"\n")
            .await
            .map_err(|e| e.to_string())?;
        acc.stream.flush().await.map_err(|e| e.to_string())?;
        // Let gnutls-cli read before the close.
        let mut rest = [0u8; 16];
        let _ = timeout(Duration::from_secs(2), acc.stream.read(&mut rest)).await;
        Ok(format!(
            "{} {}",
            acc.identity,
            nvme_tls::cipher_name(&acc.stream).unwrap_or("?")
        ))
    });
    (port, task)
}

#[tokio::test]
async fn accepts_gnutls_cli_with_either_identity_version() {
    for version in [IdentityVersion::V0, IdentityVersion::V1] {
        let mut store = PskStore::new();
        store.insert(H, S, key());
        let (port, task) = target(store).await;
        let (id, psk) = key().tls_psk(H, S, version, Derivation::Libnvme);
        let (echoed, log) = gnutls_cli(port, &id.to_string(), &hex(psk.expose())).await;
        let got = timeout(T, task).await.unwrap().unwrap();
        assert!(
            echoed,
            "{version:?}: gnutls-cli saw no echo: {log}\ntarget: {got:?}"
        );
        assert_eq!(got.unwrap(), format!("{id} TLS_AES_128_GCM_SHA256"));
    }
}

#[tokio::test]
async fn rejects_gnutls_cli_with_another_key() {
    let mut store = PskStore::new();
    store.insert(H, S, key());
    let (port, task) = target(store).await;
    let (id, _) = key().tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    let (echoed, log) = gnutls_cli(port, &id.to_string(), &"42".repeat(32)).await;
    assert!(!echoed, "{log}");
    assert!(timeout(T, task).await.unwrap().unwrap().is_err());
}

/// gnutls-serv --echo with one PSK user; the identity is hex-encoded (`#…`) in its password
/// file because NQNs hold colons, its field separator.
async fn gnutls_serv(identity: &str, psk_hex: &str) -> (u16, Child, tempfile_dir::Dir) {
    need("gnutls-serv");
    let dir = tempfile_dir::Dir::new();
    let file = dir.path().join("psk.txt");
    std::fs::write(&file, format!("#{}:{psk_hex}\n", hex(identity.as_bytes()))).unwrap();
    // A free port: bind 0, read it, release it (gnutls-serv takes a number only).
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let child = Command::new("gnutls-serv")
        .args(["--echo", "--priority", PRIORITY, "--pskpasswd"])
        .arg(&file)
        .args(["-p", &port.to_string()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // Its "listening" line sits in a pipe buffer; wait until the port takes connections (the
    // probe's empty connection is a failed handshake it logs and forgets).
    timeout(T, async {
        while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    })
    .await
    .expect("gnutls-serv did not start");
    (port, child, dir)
}

#[tokio::test]
async fn connects_to_gnutls_serv_with_either_identity_version() {
    for version in [IdentityVersion::V0, IdentityVersion::V1] {
        let (id, psk) = key().tls_psk(H, S, version, Derivation::Libnvme);
        let (port, mut child, _dir) = gnutls_serv(&id.to_string(), &hex(psk.expose())).await;
        let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
        let mut tls = timeout(T, connect_with(s, &id, &psk))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(nvme_tls::cipher_name(&tls), Some("TLS_AES_128_GCM_SHA256"));
        tls.write_all(b"ping\n").await.unwrap();
        tls.flush().await.unwrap();
        let mut buf = [0u8; 5];
        timeout(T, tls.read_exact(&mut buf)).await.unwrap().unwrap();
        assert_eq!(&buf, b"ping\n");
        child.kill().await.unwrap();
    }
}

#[tokio::test]
async fn fails_against_gnutls_serv_holding_another_key() {
    let (id, psk) = key().tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    let (port, mut child, _dir) = gnutls_serv(&id.to_string(), &"42".repeat(32)).await;
    let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert!(timeout(T, connect_with(s, &id, &psk))
        .await
        .unwrap()
        .is_err());
    // And with the right key but a 48-byte one of another hash, there is nothing to agree on.
    let other = ConfiguredPsk::new(Some(PskHash::Sha384), &[1u8; 48]).unwrap();
    let (id2, psk2) = other.tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    let s = TcpStream::connect(("127.0.0.1", port)).await.unwrap();
    assert!(timeout(T, connect_with(s, &id2, &psk2))
        .await
        .unwrap()
        .is_err());
    child.kill().await.unwrap();
}

/// A temporary directory removed on drop (no extra dependency for one file).
mod tempfile_dir {
    use std::path::{Path, PathBuf};

    pub struct Dir(PathBuf);

    impl Dir {
        pub fn new() -> Self {
            let p = std::env::temp_dir().join(format!(
                "nvme-tls-gnutls-{}-{}",
                std::process::id(),
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .unwrap()
                    .as_nanos()
            ));
            std::fs::create_dir_all(&p).unwrap();
            Self(p)
        }

        pub fn path(&self) -> &Path {
            &self.0
        }
    }

    impl Drop for Dir {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
