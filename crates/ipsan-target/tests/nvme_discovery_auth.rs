//! The discovery controller authenticates, and DH-HMAC-CHAP secrets are per subsystem (issue
//! 30, docs/nvme.md "DH-HMAC-CHAP"), as an attacker meets them: a raw NVMe/TCP host (the
//! `nvme_common` one, which can skip steps a real host would not) against the real target on
//! loopback. The target serves two subsystems, A and B; host A has a secret for A and for
//! the discovery controller only, host G one for every subsystem.
//!
//! - a host with no secret gets no discovery controller (Connect Invalid Host, IPO at
//!   HOSTNQN), so no log;
//! - a host that claims host A's NQN gets a discovery controller that asks for
//!   authentication (AUTHREQ.ATR), and without the transaction its Get Log Page and Property
//!   Set complete with Authentication Required and carry no byte of the log;
//! - host A's NQN on subsystem B, which it has no secret for, is refused at Connect, and on A
//!   without the transaction no Write reaches the namespace.
//!
//! Before this change the discovery Connect succeeded without asking, the log was served to
//! any host, and `[[nvme.host]] subsystems` did not parse.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::path::Path;
use std::time::Duration;

use bytes::Bytes;
use nvme_common::Host;
use nvme_wire::entry::{Sgl, Sqe, Status};
use nvme_wire::fabrics::CNTLID_DYNAMIC;

const IQN_A: &str = "iqn.2026-11.org.ipsan:keys-a";
const NQN_A: &str = "nqn.2026-11.org.ipsan:keys-a";
const IQN_B: &str = "iqn.2026-11.org.ipsan:keys-b";
const NQN_B: &str = "nqn.2026-11.org.ipsan:keys-b";
const DISCOVERY: &str = "nqn.2014-08.org.nvmexpress.discovery";
const HOST_A: &str = "nqn.2014-08.org.nvmexpress:uuid:0a0a0a0a-0000-4000-8000-00000000000a";
const HOST_G: &str = "nqn.2014-08.org.nvmexpress:uuid:06060606-0000-4000-8000-000000000006";
const HOST_X: &str = "nqn.2014-08.org.nvmexpress:uuid:0e0e0e0e-0000-4000-8000-00000000000e";

/// AUTHREQ.ATR in a Connect response's DW0 (NVMe over Fabrics 1.1 §3.3).
const ATR: u32 = 1 << 17;

fn secret_file(dir: &Path, name: &str, byte: u8) -> String {
    let p = dir.join(name);
    let s = nvme_proto::auth::DhchapSecret::from_key(&[byte; 32], None).unwrap();
    std::fs::write(&p, format!("{}\n", &*s.to_dhhc1())).unwrap();
    std::fs::set_permissions(&p, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    p.display().to_string()
}

async fn start(dir: &Path) -> ipsan_target::ServerHandle {
    let a = secret_file(dir, "a.dhchap", 0xa1);
    let g = secret_file(dir, "g.dhchap", 0x61);
    let toml = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\n[nvme]\nlisten = [\"127.0.0.1:0\"]\n\
         [[nvme.host]]\nnqn = \"{HOST_A}\"\ndhchap_secret_file = \"{a}\"\n\
         subsystems = [\"{NQN_A}\", \"{DISCOVERY}\"]\n\
         [[nvme.host]]\nnqn = \"{HOST_G}\"\ndhchap_secret_file = \"{g}\"\n\
         [[target]]\niqn = \"{IQN_A}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n\
         [[target]]\niqn = \"{IQN_B}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n"
    );
    let c = ipsan_target::Config::from_toml(&toml).unwrap();
    ipsan_target::ServerHandle::start(&c).await.unwrap()
}

async fn connect_as(addr: std::net::SocketAddr, subnqn: &str, host: &str) -> (Host, u32, Status) {
    let mut h = Host::connect(addr, false, false).await;
    let c = h
        .fabrics_connect_as(0, CNTLID_DYNAMIC, subnqn, host, 30_000)
        .await;
    (h, c.dw0, c.status)
}

/// Get Log Page 70h (Discovery) of `len` bytes.
async fn discovery_log(h: &mut Host, len: u32) -> (Status, Vec<u8>) {
    let cid = h.cid();
    let mut sqe = Sqe::new(0x02, cid, Sgl::Transport { length: len });
    sqe.cdw[0] = 0x70 | (len / 4 - 1) << 16;
    let (cqe, data) = h.command(sqe, Bytes::new()).await;
    (cqe.status, data)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_discovery_and_subsystems_without_the_hosts_secret_for_them() {
    tokio::time::timeout(Duration::from_secs(60), async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let addr = h.nvme_addrs[0];

        // No secret: no discovery controller at all.
        let (_x, dw0, s) = connect_as(addr, DISCOVERY, HOST_X).await;
        assert_eq!(s, Status::CONNECT_INVALID_HOST, "a host with no secret");
        assert_eq!(dw0, 1 << 16 | 512, "IPO at HOSTNQN in the Connect data");

        // Host A's NQN, no transaction: asked to authenticate, and nothing is served.
        let (mut a, dw0, s) = connect_as(addr, DISCOVERY, HOST_A).await;
        assert_eq!(s, Status::SUCCESS);
        assert_ne!(
            dw0 & ATR,
            0,
            "the discovery Connect asks for authentication"
        );
        let (s, log) = discovery_log(&mut a, 4096).await;
        assert_eq!(s, Status::AUTHENTICATION_REQUIRED, "Get Log Page");
        assert!(log.is_empty(), "no byte of the log: {} bytes", log.len());
        assert_eq!(
            a.enable().await.status,
            Status::AUTHENTICATION_REQUIRED,
            "Property Set CC"
        );

        // Host A has no secret for B: refused there, while G (a secret for every subsystem)
        // is asked to authenticate on B.
        let (_b, dw0, s) = connect_as(addr, NQN_B, HOST_A).await;
        assert_eq!(s, Status::CONNECT_INVALID_HOST, "host A on subsystem B");
        assert_eq!(dw0, 1 << 16 | 512);
        let (_g, dw0, s) = connect_as(addr, NQN_B, HOST_G).await;
        assert_eq!(s, Status::SUCCESS);
        assert_ne!(dw0 & ATR, 0);

        // Host A's NQN on A without the transaction: no write reaches the namespace.
        let (mut a, dw0, s) = connect_as(addr, NQN_A, HOST_A).await;
        assert_eq!(s, Status::SUCCESS);
        assert_ne!(dw0 & ATR, 0);
        assert_eq!(a.enable().await.status, Status::AUTHENTICATION_REQUIRED);
        h.shutdown().await.unwrap();
    })
    .await
    .expect("done within 60 s");
}
