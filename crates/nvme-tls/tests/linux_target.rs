//! nvme-tls's host against Linux's own NVMe/TCP target over TLS: Debian 13's kernel 6.12
//! nvmet with `tlshd` (GnuTLS 3.8) doing its handshakes, the configured key inserted by nvme-cli
//! 2.13's `check-tls-key --insert` (libnvme 1.13), booted under QEMU by ../shared/nvmevm
//! (`guest/nvmet-serve.sh`, TLS port forwarded to 127.0.0.1:54421).
//!
//! What it proves: Linux and nvme-tls derive the same TLS PSK and identity from one configured
//! key (an `01` key, TLS_AES_128_GCM_SHA256) — the TLS handshake succeeds and NVMe/TCP runs inside it (ICReq → ICResp, a Fabrics Connect of the
//! admin queue answered with success and a controller ID, through nvme-wire) — and that a
//! wrong key, or the same key derived by RFC 8446's label form (what libnvme ≥ 1.16 does),
//! is refused by that target.
//!
//! `02` (SHA-384) keys are not tried: Debian 13's tlshd (ktls-utils 1.0.0) binds every PSK to
//! SHA-256, so Linux's own host fails against Linux's own target with one
//! (`tests/vm/sha384-selftest.sh`); nvme-tls's `02` handshakes are tested in `loopback.rs`.
//!
//! Needs the VM (`../shared/nvmevm/build.sh` done, qemu-system-x86) and ~1 minute under
//! TCG, so it is `#[ignore]`d; run it with
//! `cargo test -p nvme-tls --test linux_target -- --ignored --nocapture`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use bytes::BytesMut;
use nvme_proto::psk::{ConfiguredPsk, Derivation, IdentityVersion};
use nvme_tls::connect_with;
use nvme_wire::fabrics::{
    ConnectData, ConnectResponse, FabricsCommand, FabricsKind, CNTLID_DYNAMIC,
};
use nvme_wire::pdu::{CapsuleCmd, IcReq, PFV_1_0};
use nvme_wire::{Codec, Pdu, Sgl};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::{sleep, timeout, Instant};

/// The guest's host NQN and ID (nvmevm README); nvmet-serve.sh keys the target for it.
const H: &str = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-766d-4000-8000-000000000001";
const HOSTID: [u8; 16] = [
    0x6e, 0x76, 0x6d, 0x65, 0x76, 0x6d, 0x40, 0x00, 0x80, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00, 0x01,
];
const S: &str = "nqn.2026-11.org.example:nvmet";
/// NL's port range (54420-54429), fixed because QEMU's forward needs a number.
const TLS_PORT: u16 = 54421;
/// Made by nvme-cli 2.13 `gen-tls-key --secret 000102…` (see nvme-proto's psk_vectors.rs).
const KEY01: &str = "NVMeTLSkey-1:01:AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh+KfiaR:";

fn nvmevm() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../shared/nvmevm")
}

/// The running guest. Dropping it (also when a test panics) sends run.sh SIGTERM, on which
/// it stops QEMU and removes its files; SIGKILL would leave QEMU holding the forwarded port.
struct Vm(std::process::Child);

impl Drop for Vm {
    fn drop(&mut self) {
        let _ = std::process::Command::new("kill")
            .args(["-TERM", &self.0.id().to_string()])
            .status();
        let _ = self.0.wait();
    }
}

/// Boots the guest serving Linux's target with `key` and waits for "NVMET ready".
async fn linux_target(key: &str, log: &std::path::Path) -> Vm {
    let vm = nvmevm();
    assert!(
        vm.join("run.sh").exists(),
        "../shared/nvmevm is missing (looked in {})",
        vm.display()
    );
    let mut child = Vm(std::process::Command::new(vm.join("run.sh"))
        .arg("--script")
        .arg(vm.join("guest/nvmet-serve.sh"))
        .args(["--hostfwd", &format!("{TLS_PORT}:4421")])
        .args(["--env", &format!("TLS_KEY={key}")])
        .args(["--env", "SERVE_SECONDS=240", "--timeout", "400", "-q"])
        .arg("--log")
        .arg(log)
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap());
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        if text.contains("NVMET ready") {
            break;
        }
        let last = || text.lines().rev().take(5).collect::<Vec<_>>().join(" | ");
        assert!(
            !text.contains("RESULT fail"),
            "the guest failed: {}",
            last()
        );
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "run.sh exited before the target was ready: {}",
            last()
        );
        assert!(
            Instant::now() < deadline,
            "the guest never got ready; see {}",
            log.display()
        );
        sleep(Duration::from_millis(500)).await;
    }
    child
}

async fn read_pdu<S: AsyncRead + Unpin>(s: &mut S, codec: &Codec, buf: &mut BytesMut) -> Pdu {
    loop {
        if let Some(p) = codec.decode_from(buf).unwrap() {
            return p;
        }
        let n = timeout(Duration::from_secs(60), s.read_buf(buf))
            .await
            .unwrap()
            .unwrap();
        assert!(n > 0, "the target closed the connection");
    }
}

/// ICReq/ICResp, then a Fabrics Connect of the admin queue; returns the CNTLID.
async fn nvme_connect<S: AsyncRead + AsyncWrite + Unpin>(s: &mut S) -> u16 {
    let codec = Codec::new(8192 + 128);
    let mut buf = BytesMut::new();
    let icreq = Pdu::IcReq(IcReq {
        pfv: PFV_1_0,
        hpda: 0,
        hdgst: false,
        ddgst: false,
        maxr2t: 0,
    });
    s.write_all(&codec.to_bytes(&icreq).unwrap()).await.unwrap();
    s.flush().await.unwrap();
    let Pdu::IcResp(resp) = read_pdu(s, &codec, &mut buf).await else {
        panic!("no ICResp");
    };
    assert_eq!(resp.pfv, PFV_1_0);
    assert!(resp.maxh2cdata >= 4096);
    let data = ConnectData {
        hostid: HOSTID,
        cntlid: CNTLID_DYNAMIC,
        subnqn: S.to_owned(),
        hostnqn: H.to_owned(),
    }
    .encode()
    .unwrap();
    let sqe = FabricsCommand {
        cid: 1,
        flags: nvme_wire::entry::PSDT_SGL,
        sgl: Sgl::InCapsule {
            offset: 0,
            length: data.len() as u32,
        },
        kind: FabricsKind::Connect(nvme_wire::fabrics::Connect {
            recfmt: 0,
            qid: 0,
            sqsize: 31,
            cattr: 0,
            kato: 30_000,
        }),
    }
    .to_sqe();
    let cmd = Pdu::CapsuleCmd(CapsuleCmd {
        sqe,
        data: bytes::Bytes::copy_from_slice(&data),
    });
    s.write_all(&codec.to_bytes(&cmd).unwrap()).await.unwrap();
    s.flush().await.unwrap();
    let Pdu::CapsuleResp(r) = read_pdu(s, &codec, &mut buf).await else {
        panic!("no CapsuleResp");
    };
    assert_eq!(r.cqe.cid, 1);
    assert!(
        r.cqe.status.is_success(),
        "Connect failed: {:?}",
        r.cqe.status
    );
    let c = ConnectResponse::from_dw0(r.cqe.dw0);
    assert!(!c.atr, "the target asked for DH-HMAC-CHAP");
    c.cntlid
}

async fn try_tls(version: IdentityVersion, key: &ConfiguredPsk, derivation: Derivation) -> bool {
    let (id, psk) = key.tls_psk(H, S, version, derivation);
    let s = TcpStream::connect(("127.0.0.1", TLS_PORT)).await.unwrap();
    match timeout(Duration::from_secs(60), connect_with(s, &id, &psk)).await {
        Ok(Ok(mut tls)) => {
            // Linux's target may also close right after a handshake it did not key; only an
            // answered ICReq counts.
            let mut probe = BytesMut::new();
            let codec = Codec::new(8192);
            let icreq = Pdu::IcReq(IcReq {
                pfv: PFV_1_0,
                hpda: 0,
                hdgst: false,
                ddgst: false,
                maxr2t: 0,
            });
            if tls
                .write_all(&codec.to_bytes(&icreq).unwrap())
                .await
                .is_err()
            {
                return false;
            }
            let _ = tls.flush().await;
            matches!(
                timeout(Duration::from_secs(30), tls.read_buf(&mut probe)).await,
                Ok(Ok(n)) if n > 0
            )
        }
        _ => false,
    }
}

#[tokio::test]
#[ignore = "boots Linux under QEMU (../shared/nvmevm), ~1 minute"]
async fn linux_target_accepts_our_host_keyed_as_nvme_cli_keys_it() {
    let dir = std::env::temp_dir().join(format!("nvme-tls-vm-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, text, suite) in [("01", KEY01, "TLS_AES_128_GCM_SHA256")] {
        let log = dir.join(format!("vm-{name}.log"));
        let vm = linux_target(text, &log).await;
        let key = ConfiguredPsk::parse(text).unwrap();

        // The identity `check-tls-key --insert` files the key under, libnvme 1.13's derivation.
        let (id, psk) = key.tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
        // nvmet-serve.sh starts tlshd in the background right before "NVMET ready"; until it
        // listens, the kernel refuses TLS ("failed to start TLS, err=-3" on the console) and
        // closes the connection. Only that is retried, and the console must say so.
        let mut tls = None;
        for _ in 0..15 {
            let s = TcpStream::connect(("127.0.0.1", TLS_PORT)).await.unwrap();
            match timeout(Duration::from_secs(60), connect_with(s, &id, &psk))
                .await
                .unwrap()
            {
                Ok(t) => {
                    tls = Some(t);
                    break;
                }
                Err(e) => {
                    let console = std::fs::read_to_string(&log).unwrap_or_default();
                    assert!(
                        console.contains("failed to start TLS, err=-3"),
                        "{name}: handshake with Linux failed: {e}"
                    );
                    sleep(Duration::from_secs(2)).await;
                }
            }
        }
        let mut tls = tls.unwrap_or_else(|| panic!("{name}: tlshd never answered"));
        assert_eq!(nvme_tls::cipher_name(&tls), Some(suite));
        let cntlid = nvme_connect(&mut tls).await;
        eprintln!("{name}: TLS {suite} with identity {id}; Connect → CNTLID {cntlid}");
        drop(tls);

        // A wrong key under the same identity.
        let wrong = ConfiguredPsk::new(key.transform(), &vec![0x5a; key.hash().key_len()]).unwrap();
        assert!(
            !try_tls(IdentityVersion::V0, &wrong, Derivation::Libnvme).await,
            "{name}: a wrong key was accepted"
        );
        // The right key derived by RFC 8446's HkdfLabel: another TLS PSK for Debian 13's tools.
        assert!(
            !try_tls(IdentityVersion::V0, &key, Derivation::Rfc8446).await,
            "{name}: the RFC 8446 derivation was accepted"
        );
        // And the right key once more (the target still serves after the failures).
        assert!(try_tls(IdentityVersion::V0, &key, Derivation::Libnvme).await);

        drop(vm);
    }
    let _ = std::fs::remove_dir_all(&dir);
}
