//! nvme-tls's target side against Linux's own NVMe/TCP host: Debian 13's kernel 6.12 with
//! `tlshd` (GnuTLS) doing the ClientHello, the configured key inserted by nvme-cli 2.13's
//! `check-tls-key --insert`, with a version 0 and then a version 1 identity
//! (`tests/vm/tls-connect.sh` under ../shared/nvmevm, reaching 127.0.0.1:54422 here as
//! 10.0.2.2:54422).
//!
//! There is no NVMe target behind this listener (that is ipsan-target's, tested there): it
//! proves the TLS half — Linux's host offers the identity nvme-proto expects, both derive the
//! same TLS PSK, the handshake completes with the cipher suite of the key, and the first bytes
//! decrypted on this side are the kernel's ICReq. The guest's `nvme connect` then fails (no
//! ICResp comes), which the test expects.
//!
//! `#[ignore]`d (boots the VM twice, ~20 s each): `cargo test -p nvme-tls --test linux_host -- --ignored`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bytes::BytesMut;
use nvme_proto::psk::{ConfiguredPsk, PskStore};
use nvme_wire::{Codec, Pdu};
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::time::{timeout, Instant};

const H: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
const S: &str = "nqn.2026-11.org.example:ipsan-tls";
/// NL's port range (54420-54429): the guest script takes a number.
const PORT: u16 = 54422;
const KEY01: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

/// The guest; dropping it sends run.sh SIGTERM (it then stops QEMU and cleans up).
struct Vm(std::process::Child);

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

#[derive(Debug)]
enum Seen {
    /// A connection that did not become a keyed TLS stream (the script's plain discover).
    Refused(#[allow(dead_code)] String),
    /// A keyed stream: identity, cipher suite, the first PDU read through it.
    Keyed(String, String, Option<Pdu>),
}

#[tokio::test]
#[ignore = "boots Linux under QEMU (../shared/nvmevm) twice, ~20 s each"]
async fn linux_host_keys_its_handshake_with_our_target() {
    for (version, digest) in [(0, false), (1, true)] {
        one_host(version, digest).await;
    }
}

async fn one_host(version: u8, digest: bool) {
    let vm_dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/nvmevm");
    assert!(
        vm_dir.join("run.sh").exists(),
        "../shared/nvmevm is missing"
    );
    let mut store = PskStore::new();
    store.insert(H, S, ConfiguredPsk::parse(KEY01).unwrap());

    let listener = TcpListener::bind(("127.0.0.1", PORT)).await.unwrap();
    let (tx, mut rx) = mpsc::unbounded_channel();
    let server = tokio::spawn(async move {
        loop {
            let Ok((sock, _)) = listener.accept().await else {
                return;
            };
            let (store, tx) = (store.clone(), tx.clone());
            tokio::spawn(async move {
                let seen =
                    match timeout(Duration::from_secs(60), nvme_tls::accept(sock, &store)).await {
                        Ok(Ok(mut acc)) => {
                            let codec = Codec::new(8192);
                            let mut buf = BytesMut::new();
                            let pdu = timeout(Duration::from_secs(30), async {
                                loop {
                                    if let Ok(Some(p)) = codec.decode_from(&mut buf) {
                                        return Some(p);
                                    }
                                    match acc.stream.read_buf(&mut buf).await {
                                        Ok(n) if n > 0 => {}
                                        _ => return None,
                                    }
                                }
                            })
                            .await
                            .ok()
                            .flatten();
                            Seen::Keyed(
                                format!("{} ({:?})", acc.identity, acc.derivation),
                                nvme_tls::cipher_name(&acc.stream).unwrap_or("?").to_owned(),
                                pdu,
                            )
                        }
                        Ok(Err(e)) => Seen::Refused(e.to_string()),
                        Err(_) => Seen::Refused("handshake timed out".into()),
                    };
                let _ = tx.send(seen);
            });
        }
    });

    let log = std::env::temp_dir().join(format!("nvme-tls-host-{}.log", std::process::id()));
    let _vm = Vm(std::process::Command::new(vm_dir.join("run.sh"))
        .arg("--script")
        .arg(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/vm/tls-connect.sh"))
        .args(["--env", &format!("PORT={PORT}")])
        .args(["--env", &format!("IDENTITY={version}")])
        .args(["--env", &format!("SUBNQN={S}")])
        .args(["--env", &format!("TLS_KEY={KEY01}")])
        .args(["--timeout", "240", "-q", "--log"])
        .arg(&log)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap());

    let deadline = Instant::now() + Duration::from_secs(240);
    let mut seen = Vec::new();
    let keyed = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match timeout(left, rx.recv()).await {
            Ok(Some(s @ Seen::Keyed(..))) => break s,
            Ok(Some(s)) => seen.push(s),
            _ => panic!(
                "no TLS connection from Linux's host; saw {seen:?}; guest: {}",
                std::fs::read_to_string(&log)
                    .unwrap_or_default()
                    .lines()
                    .filter(|l| l.contains("RESULT") || l.contains("nvme") || l.contains("tls"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            ),
        }
    };
    let _ = std::fs::remove_file(&log);
    server.abort();
    let _ = server.await;
    let Seen::Keyed(identity, cipher, pdu) = keyed else {
        unreachable!()
    };
    eprintln!("Linux host: identity {identity}, {cipher}, first PDU {pdu:?}; before it: {seen:?}");
    let prefix = format!("NVMe{version}R01 {H} {S}");
    if digest {
        // The digest libnvme 1.13 computed matched libnvme's derivation, not RFC 8446's.
        assert!(identity.starts_with(&format!("{prefix} ")), "{identity}");
        assert!(identity.ends_with(" (Libnvme)"), "{identity}");
    } else {
        assert_eq!(identity, format!("{prefix} (Libnvme)"));
    }
    assert_eq!(cipher, "TLS_AES_128_GCM_SHA256");
    let Some(Pdu::IcReq(icreq)) = pdu else {
        panic!("the first PDU through TLS was {pdu:?}, not an ICReq");
    };
    assert_eq!(icreq.pfv, nvme_wire::pdu::PFV_1_0);
}
