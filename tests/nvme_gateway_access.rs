//! Issue 30 (operators): `ipsan gateway --nvme-listen` authenticates NVMe/TCP hosts as
//! `ipsan target`'s NVMe listener does, and a gateway never widens access. Real processes on
//! loopback: a far `ipsan target` (iSCSI only) and an `ipsan gateway` in front of it serving
//! its LUN over NVMe/TCP; hosts are ipsan's NVMe/TCP host library in the test process, so a
//! test can choose the host NQN and the DH-HMAC-CHAP secret an attacker presents.
//!
//! - a gateway whose NVMe listener would face beyond loopback without host authentication
//!   refuses to start and says why; `--nvme-dhchap` lets it (it then fails only to bind the
//!   address, which is on no interface here);
//! - with `--nvme-dhchap` for hosts A and B and `--nvme-host A`: A with its secret writes
//!   through the gateway and the far LUN holds the data; A with B's secret, a host with no
//!   secret, a host claiming to be A with no secret, and B (right secret, not on the list) are
//!   all refused, so none of them reaches the far LUN;
//! - `ipsan ctl nvme hosts` changes the list live: B gets in, A's controller is closed and A
//!   cannot connect again.
//!
//! Every process is killed by a Drop guard; files live in a temporary directory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{spawn_ipsan, spawn_ipsan_until, Proc, BIN};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use ipsan_initiator::nvme::{
    AuthConfig, DhchapSecret, NvmeConfig, NvmeError, NvmeSession, NvmeUrl,
};
use ipsan_initiator::{IscsiUrl, Session, SessionConfig};

const FAR: &str = "iqn.2026-11.ex:far";
/// The gateway's subsystem: named after the far target's IQN (`--iqn` not given).
const GW_NQN: &str = "nqn.2026-11.ex:far";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0000-4000-8000-00000000000a";
const HOST_B: &str = "nqn.2014-08.org.nvmexpress:uuid:0b0b0b0b-0000-4000-8000-00000000000b";
const HOST_C: &str = "nqn.2014-08.org.nvmexpress:uuid:0c0c0c0c-0000-4000-8000-00000000000c";

fn secret(byte: u8) -> DhchapSecret {
    DhchapSecret::from_key(&[byte; 32], None).unwrap()
}

/// A `DHHC-1:` secret file, mode 0600.
fn secret_file(dir: &Path, name: &str, byte: u8) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, format!("{}\n", &*secret(byte).to_dhhc1())).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    p
}

/// The far target: one RAM LUN, iSCSI only.
fn far(dir: &Path) -> (Proc, u16) {
    spawn_ipsan(
        &[
            "target",
            "--portal",
            "127.0.0.1:0",
            "--iqn",
            FAR,
            "--lun",
            "mem:16MiB",
        ],
        &dir.join("far.log"),
    )
}

/// The gateway in front of the far target with an NVMe/TCP listener on loopback and `extra`
/// flags; returns it with its NVMe/TCP port.
fn gateway(dir: &Path, far_port: u16, extra: &[&str]) -> (Proc, u16) {
    let to = format!("iscsi://127.0.0.1:{far_port}/{FAR}/0");
    let mut args = vec![
        "gateway",
        "--listen",
        "127.0.0.1:0",
        "--to",
        &to,
        "--nvme-listen",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    spawn_ipsan_until(
        &args,
        &dir.join("gateway.log"),
        "NVMe/TCP 'listening on'",
        |l| {
            let rest = l.split("listening on ").nth(1)?;
            if !l.contains("(NVMe/TCP)") {
                return None;
            }
            let addr: std::net::SocketAddr = rest.split_whitespace().next()?.parse().ok()?;
            Some(addr.port())
        },
    )
}

/// Opens namespace 1 of the gateway's subsystem as `hostnqn`, proving `key` if given.
async fn open(port: u16, hostnqn: &str, key: Option<u8>) -> Result<NvmeSession, NvmeError> {
    let url = NvmeUrl::parse(&format!("nvme+tcp://127.0.0.1:{port}/{GW_NQN}/1")).unwrap();
    let cfg = NvmeConfig {
        hostnqn: hostnqn.to_owned(),
        auth: key.map(|k| Arc::new(AuthConfig::new(secret(k), None))),
        ..NvmeConfig::default()
    };
    tokio::time::timeout(Duration::from_secs(30), NvmeSession::open(&url, &cfg))
        .await
        .expect("the gateway answers within 30 s")
}

/// A Connect refused with Connect Invalid Host (SCT 1h, SC 84h).
fn assert_invalid_host(r: Result<NvmeSession, NvmeError>, what: &str) {
    match r {
        Err(e) => {
            let text = e.to_string();
            assert!(
                text.contains("SCT 0x1 SC 0x84"),
                "{what}: expected Connect Invalid Host, got {text}"
            );
        }
        Ok(_) => panic!("{what}: connected"),
    }
}

/// The far LUN over iSCSI, straight at the far target.
async fn far_read(far_port: u16, lba: u64, blocks: u32) -> BytesMut {
    let url = IscsiUrl::parse(&format!("iscsi://127.0.0.1:{far_port}/{FAR}/0")).unwrap();
    let s = Session::open(&url, &SessionConfig::default())
        .await
        .unwrap();
    let got = s.read(lba, blocks).await.unwrap();
    s.logout().await.unwrap();
    got
}

/// The error text of a gateway that must exit by itself.
fn gateway_start_error(far_port: u16, extra: &[&str]) -> String {
    let to = format!("iscsi://127.0.0.1:{far_port}/{FAR}/0");
    let mut args = vec!["gateway", "--listen", "127.0.0.1:0", "--to", &to];
    args.extend_from_slice(extra);
    let mut child = Command::new(BIN)
        .args(&args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().unwrap() {
            let mut err = String::new();
            std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
            assert!(!status.success(), "gateway {extra:?} exited 0: {err}");
            return err;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("gateway {extra:?} still running after 30 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn rejects_gateway_nvme_listener_beyond_loopback_without_host_auth() {
    let dir = tempfile::tempdir().unwrap();
    let (_far, far_port) = far(dir.path());
    // 10.231.255.254 is on no interface: a gateway that passed the check fails to bind.
    let err = gateway_start_error(far_port, &["--nvme-listen", "10.231.255.254:0"]);
    assert!(
        err.contains("refusing to serve NVMe/TCP on 10.231.255.254:0"),
        "{err}"
    );
    assert!(
        err.contains("--nvme-dhchap"),
        "the error says what to give: {err}"
    );
    let a = secret_file(dir.path(), "a.dhchap", 0xa1);
    let flag = format!("{HOST_A},{}", a.display());
    let err = gateway_start_error(
        far_port,
        &["--nvme-listen", "10.231.255.254:0", "--nvme-dhchap", &flag],
    );
    assert!(
        !err.contains("refusing to serve NVMe/TCP"),
        "with DH-HMAC-CHAP the listener may face beyond loopback: {err}"
    );
    assert!(
        err.contains("cannot listen for NVMe/TCP on 10.231.255.254:0"),
        "{err}"
    );
}

#[test]
fn accepts_only_authenticated_listed_hosts_through_the_gateway() {
    let dir = tempfile::tempdir().unwrap();
    let (_far, far_port) = far(dir.path());
    let a = secret_file(dir.path(), "a.dhchap", 0xa1);
    let b = secret_file(dir.path(), "b.dhchap", 0xb2);
    let (fa, fb) = (
        format!("{HOST_A},{}", a.display()),
        format!("{HOST_B},{}", b.display()),
    );
    let control = dir.path().join("ctl").join("control.sock");
    let control = control.to_str().unwrap();
    let (_gw, port) = gateway(
        dir.path(),
        far_port,
        &[
            "--nvme-dhchap",
            &fa,
            "--nvme-dhchap",
            &fb,
            "--nvme-host",
            HOST_A,
            "--control",
            control,
        ],
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        // A with its own secret: its write reaches the far LUN.
        let host_a = open(port, HOST_A, Some(0xa1)).await.unwrap();
        let data = Bytes::from(vec![0x5a; 4096]);
        host_a.write(64, data.clone()).await.unwrap();
        host_a.flush().await.unwrap();
        assert!(
            far_read(far_port, 64, 8).await[..] == data[..],
            "the far LUN holds what host A wrote"
        );

        // A with B's secret: the DH-HMAC-CHAP transaction fails.
        match open(port, HOST_A, Some(0xb2)).await {
            Err(NvmeError::Bringup(e)) => assert!(
                format!("{e:?}").contains("Authentication("),
                "A with B's secret: {e:?}"
            ),
            Err(e) => panic!("A with B's secret: expected an authentication failure, got {e}"),
            Ok(_) => panic!("A with B's secret connected"),
        }
        // No secret at all, as A or as a host the gateway does not know.
        match open(port, HOST_A, None).await {
            Err(e) => assert!(
                e.to_string().contains("authentication"),
                "A without a secret: {e}"
            ),
            Ok(_) => panic!("A without a secret connected"),
        }
        assert_invalid_host(open(port, HOST_C, Some(0xa1)).await, "C with A's secret");
        // B proves its secret but is not on the subsystem's host list.
        assert_invalid_host(open(port, HOST_B, Some(0xb2)).await, "B, not listed");
        let back = host_a.read_into(64, 8, BytesMut::new()).await.unwrap();
        assert!(back[..] == data[..], "nobody else wrote");

        // The list changed live with `ipsan ctl`: B gets in, A is out.
        let out = Command::new(BIN)
            .args(["ctl", "--control", control, "nvme", "hosts", GW_NQN, HOST_B])
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "ipsan ctl nvme hosts: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let deadline = Instant::now() + Duration::from_secs(10);
        while host_a.read_into(64, 8, BytesMut::new()).await.is_ok() {
            assert!(
                Instant::now() < deadline,
                "host A's controller still serves 10 s after it left the list"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_invalid_host(open(port, HOST_A, Some(0xa1)).await, "A, no longer listed");
        let host_b = open(port, HOST_B, Some(0xb2)).await.unwrap();
        assert!(
            host_b.read_into(64, 8, BytesMut::new()).await.unwrap()[..] == data[..],
            "B reads the far LUN through the gateway"
        );
        host_b.close().await.unwrap();
    });
}
