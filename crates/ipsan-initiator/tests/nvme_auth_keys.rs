//! DH-HMAC-CHAP secrets per subsystem and an authenticating discovery controller (issue 30,
//! docs/nvme.md "DH-HMAC-CHAP"), with ipsan's own NVMe/TCP host against ipsan's real target in
//! process on loopback, so a test chooses the host NQN and the secret an attacker presents.
//! The target serves subsystems A and B; host H has one secret for A and the discovery
//! controller and another for B; host C has a secret for A only.
//!
//! - H with its discovery secret reads a log that lists A and B; C (no secret for discovery)
//!   and a host with no secret are refused at Connect (Connect Invalid Host), a wrong secret
//!   fails the transaction: none of them gets an entry;
//! - H's secret for A does not open B and its secret for B does not open A (the transaction
//!   fails); C has no secret for B (Connect Invalid Host); each secret opens its own;
//! - a reload with another secret for H on A closes H's controller on A (its I/O fails), the
//!   old secret no longer opens A and the new one does, and H's controller on B, whose secret
//!   did not change, keeps serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{
    self, AuthConfig, DhchapSecret, NvmeConfig, NvmeError, NvmeSession, NvmeUrl,
};
use ipsan_target::ServerHandle;

const IQN_A: &str = "iqn.2026-11.org.ipsan:keys-a";
const NQN_A: &str = "nqn.2026-11.org.ipsan:keys-a";
const IQN_B: &str = "iqn.2026-11.org.ipsan:keys-b";
const NQN_B: &str = "nqn.2026-11.org.ipsan:keys-b";
const HOST_H: &str = "nqn.2014-08.org.nvmexpress:uuid:0d0d0d0d-0000-4000-8000-00000000000d";
const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000c";
const HOST_X: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-0000-4000-8000-00000000000e";

fn secret(byte: u8) -> DhchapSecret {
    DhchapSecret::from_key(&[byte; 32], None).unwrap()
}

fn write_secret(p: &Path, byte: u8) {
    std::fs::write(p, format!("{}\n", &*secret(byte).to_dhhc1())).unwrap();
    std::fs::set_permissions(p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
}

fn config_text(a: &Path, b: &Path, c: &Path) -> String {
    format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\n[nvme]\nlisten = [\"127.0.0.1:0\"]\n\
         [[nvme.host]]\nnqn = \"{HOST_H}\"\ndhchap_secret_file = \"{}\"\n\
         subsystems = [\"{IQN_A}\", \"nqn.2014-08.org.nvmexpress.discovery\"]\n\
         [[nvme.host]]\nnqn = \"{HOST_H}\"\ndhchap_secret_file = \"{}\"\nsubsystems = [\"{NQN_B}\"]\n\
         [[nvme.host]]\nnqn = \"{HOST_C}\"\ndhchap_secret_file = \"{}\"\nsubsystems = [\"{NQN_A}\"]\n\
         [[target]]\niqn = \"{IQN_A}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n\
         [[target]]\niqn = \"{IQN_B}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
        a.display(),
        b.display(),
        c.display()
    )
}

fn cfg(hostnqn: &str, key: Option<u8>) -> NvmeConfig {
    NvmeConfig {
        hostnqn: hostnqn.to_owned(),
        auth: key.map(|k| Arc::new(AuthConfig::new(secret(k), None))),
        ..NvmeConfig::default()
    }
}

async fn open(
    h: &ServerHandle,
    nqn: &str,
    host: &str,
    key: Option<u8>,
) -> Result<NvmeSession, NvmeError> {
    let url = NvmeUrl::parse(&format!("nvme+tcp://{}/{nqn}/1", h.nvme_addrs[0])).unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        NvmeSession::open(&url, &cfg(host, key)),
    )
    .await
    .expect("the target answers within 20 s")
}

async fn discover(h: &ServerHandle, host: &str, key: Option<u8>) -> Result<Vec<String>, NvmeError> {
    let url = NvmeUrl::parse(&format!("nvme+tcp://{}", h.nvme_addrs[0])).unwrap();
    tokio::time::timeout(
        Duration::from_secs(20),
        nvme::discover(&url, &cfg(host, key)),
    )
    .await
    .expect("the target answers within 20 s")
    .map(|(_, entries)| entries.into_iter().map(|e| e.subnqn).collect())
}

/// A Connect refused with Connect Invalid Host (SCT 1h, SC 84h).
fn assert_invalid_host<T>(r: Result<T, NvmeError>, what: &str) {
    match r {
        Err(e) => assert!(
            e.to_string().contains("SCT 0x1 SC 0x84"),
            "{what}: expected Connect Invalid Host, got {e}"
        ),
        Ok(_) => panic!("{what}: accepted"),
    }
}

/// A DH-HMAC-CHAP transaction that failed (the controller's AUTH_Failure1).
fn assert_auth_failed<T>(r: Result<T, NvmeError>, what: &str) {
    match r {
        Err(NvmeError::Bringup(e)) => assert!(
            format!("{e:?}").contains("Authentication("),
            "{what}: expected a failed transaction, got {e:?}"
        ),
        Err(e) => panic!("{what}: expected a failed transaction, got {e}"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_hosts_without_their_secret_for_discovery_and_each_subsystem() {
    let dir = tempfile::tempdir().unwrap();
    let p = |n: &str| -> PathBuf { dir.path().join(n) };
    write_secret(&p("a"), 0xa1);
    write_secret(&p("b"), 0xb2);
    write_secret(&p("c"), 0xc3);
    let c = ipsan_target::Config::from_toml(&config_text(&p("a"), &p("b"), &p("c"))).unwrap();
    let h = ServerHandle::start(&c).await.unwrap();

    // Discovery: H with its secret reads both subsystems; nobody else reads anything.
    let seen = discover(&h, HOST_H, Some(0xa1)).await.unwrap();
    assert!(
        seen.iter().any(|n| n == NQN_A) && seen.iter().any(|n| n == NQN_B),
        "{seen:?}"
    );
    assert_invalid_host(discover(&h, HOST_X, None).await, "discovery, no secret");
    assert_invalid_host(discover(&h, HOST_C, Some(0xc3)).await, "discovery, C");
    assert_auth_failed(
        discover(&h, HOST_H, Some(0xb2)).await,
        "discovery, H with B's secret",
    );
    assert_auth_failed(
        discover(&h, HOST_H, Some(0x77)).await,
        "discovery, a wrong secret",
    );
    match discover(&h, HOST_H, None).await {
        Err(e) => assert!(
            e.to_string().contains("authentication"),
            "H without a secret: {e}"
        ),
        Ok(seen) => panic!("H without a secret read {seen:?}"),
    }

    // Subsystems: each secret opens its own only.
    assert_auth_failed(
        open(&h, NQN_B, HOST_H, Some(0xa1)).await,
        "B with H's secret for A",
    );
    assert_auth_failed(
        open(&h, NQN_A, HOST_H, Some(0xb2)).await,
        "A with H's secret for B",
    );
    assert_invalid_host(open(&h, NQN_B, HOST_C, Some(0xc3)).await, "C on B");
    assert_invalid_host(open(&h, NQN_A, HOST_X, None).await, "no secret on A");
    let c_on_a = open(&h, NQN_A, HOST_C, Some(0xc3)).await.unwrap();
    let on_a = open(&h, NQN_A, HOST_H, Some(0xa1)).await.unwrap();
    let on_b = open(&h, NQN_B, HOST_H, Some(0xb2)).await.unwrap();
    let data = Bytes::from(vec![0x3c; 4096]);
    on_a.write(8, data.clone()).await.unwrap();
    assert!(c_on_a.read_into(8, 8, BytesMut::new()).await.unwrap()[..] == data[..]);
    on_b.write(8, data.clone()).await.unwrap();

    // A reload with another secret for H on A: H's controller on A goes, B's stays.
    write_secret(&p("a"), 0xa9);
    let next =
        ipsan_target::config::FileConfig::parse(&config_text(&p("a"), &p("b"), &p("c"))).unwrap();
    let report = h.registry().apply(next, false).unwrap();
    assert!(
        report.changes.iter().any(|c| c.contains("DH-HMAC-CHAP")),
        "{report:?}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while on_a.read_into(8, 8, BytesMut::new()).await.is_ok() {
        assert!(
            Instant::now() < deadline,
            "H's controller on A still serves 10 s after its secret changed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        on_b.read_into(8, 8, BytesMut::new()).await.unwrap()[..] == data[..],
        "H's controller on B, whose secret did not change, serves"
    );
    assert!(
        c_on_a.read_into(8, 8, BytesMut::new()).await.is_ok(),
        "C's controller on A, whose secret did not change, serves"
    );
    assert_auth_failed(
        open(&h, NQN_A, HOST_H, Some(0xa1)).await,
        "A with H's old secret",
    );
    let again = open(&h, NQN_A, HOST_H, Some(0xa9)).await.unwrap();
    assert!(again.read_into(8, 8, BytesMut::new()).await.unwrap()[..] == data[..]);
    h.shutdown().await.unwrap();
}
