//! TLS 1.3 with a configured PSK (TP 8011) on the real target, from a host using `nvme-tls`'s
//! host side: the keyed connection runs NVMe/TCP; a Connect naming another host than the PSK
//! identity is refused (the key authenticates the host it names, not whichever host Connect
//! claims); a plain connection to a TLS-required listener and a wrong key get nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use std::time::Duration;

use ipsan_target::{Config, ServerHandle};
use nvme_common::{pattern, Host, HOSTNQN, IQN, NQN};
use nvme_proto::psk::ConfiguredPsk;
use nvme_wire::entry::Status;
use nvme_wire::fabrics::CNTLID_DYNAMIC;
use nvme_wire::pdu::{IcReq, Pdu};
use tokio::net::TcpStream;

const KEY: &str = "NVMeTLSkey-1:01:Qu4qQj0MpPsN7SWJMGrsFUMlKxAQYGMOVq/+5wudpm7bs6Pp:";
const OTHER_KEY: &str = "NVMeTLSkey-1:01:WoduifIsLG+dXfIlx41amgfSLUe3GZfdMs+jYx1evvJBZ5sK:";

async fn start(dir: &std::path::Path) -> ServerHandle {
    let key = dir.join("host.tlskey");
    std::fs::write(&key, format!("{KEY}\n")).unwrap();
    std::fs::set_permissions(&key, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let toml = format!(
        "[server]\nportals = [\"127.0.0.1:0\"]\n[nvme]\nlisten = [\"127.0.0.1:0\"]\n\
         [[nvme.host]]\nnqn = \"{HOSTNQN}\"\ntls_key_file = \"{}\"\n\
         [[target]]\niqn = \"{IQN}\"\n[[target.lun]]\nid = 0\nbackend = \"mem:4MiB\"\n",
        key.display()
    );
    ServerHandle::start(&Config::from_toml(&toml).unwrap())
        .await
        .unwrap()
}

/// A TLS connection offering `key` for (HOSTNQN, `subnqn`), ICReq done.
async fn tls_host(addr: std::net::SocketAddr, key: &str, subnqn: &str) -> Result<Host, String> {
    let tcp = TcpStream::connect(addr).await.unwrap();
    let key = ConfiguredPsk::parse(key).unwrap();
    let s = tokio::time::timeout(
        Duration::from_secs(10),
        nvme_tls::connect(tcp, HOSTNQN, subnqn, &key),
    )
    .await
    .expect("the handshake ends")
    .map_err(|e| e.to_string())?;
    let mut h = Host::over(Box::new(s));
    h.ic(false, true).await;
    Ok(h)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_tls_host_whose_connect_names_its_identity() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let addr = h.nvme_addrs[0];
        let mut admin = tls_host(addr, KEY, NQN).await.unwrap();
        let c = admin.fabrics_connect(0, CNTLID_DYNAMIC, NQN).await;
        assert_eq!(c.status, Status::SUCCESS);
        let cntlid = (c.dw0 & 0xffff) as u16;
        assert_eq!(admin.enable().await.status, Status::SUCCESS);
        let mut io = tls_host(addr, KEY, NQN).await.unwrap();
        assert_eq!(
            io.fabrics_connect(1, cntlid, NQN).await.status,
            Status::SUCCESS
        );
        let data = pattern(300 * 1024, 9);
        assert_eq!(io.write(1, 0, &data).await.status, Status::SUCCESS);
        let (c, got) = io.read(1, 0, data.len()).await;
        assert_eq!(c.status, Status::SUCCESS);
        assert!(got == data, "what went through TLS came back");
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_connect_naming_another_host_than_the_tls_identity() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let mut a = tls_host(h.nvme_addrs[0], KEY, NQN).await.unwrap();
        let other = "nqn.2014-08.org.nvmexpress:uuid:6e766d65-0000-4000-8000-0000000000ff";
        let c = a
            .fabrics_connect_as(0, CNTLID_DYNAMIC, NQN, other, 30_000)
            .await;
        assert_eq!(c.status, Status::CONNECT_INVALID_HOST);
        // Nor another subsystem than the identity's (the discovery one here).
        let c = a
            .fabrics_connect(0, CNTLID_DYNAMIC, "nqn.2014-08.org.nvmexpress.discovery")
            .await;
        assert_eq!(c.status, Status::CONNECT_INVALID_HOST);
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_plain_tcp_and_a_wrong_key_when_tls_is_required() {
    tokio::time::timeout(Duration::from_secs(30), async {
        let dir = tempfile::tempdir().unwrap();
        let h = start(dir.path()).await;
        let addr = h.nvme_addrs[0];
        let mut plain = Host::tcp(addr).await;
        plain
            .send(&Pdu::IcReq(IcReq {
                pfv: 0,
                hpda: 0,
                hdgst: false,
                ddgst: false,
                maxr2t: 0,
            }))
            .await;
        assert!(plain.recv().await.is_none(), "no ICResp without TLS");
        let e = tls_host(addr, OTHER_KEY, NQN).await.err();
        assert!(e.is_some(), "a wrong key fails the handshake");
        h.shutdown().await.unwrap();
    })
    .await
    .expect("bounded");
}
