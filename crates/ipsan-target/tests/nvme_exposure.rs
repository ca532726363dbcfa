//! An NVMe/TCP listener beyond loopback authenticates its hosts or the target does not start
//! (the iSCSI rule of `exposure.rs`, issue 31): until DH-HMAC-CHAP or TLS is configured for
//! NVMe/TCP, every such listener is refused before anything is bound, unless the operator
//! accepts the risk with `insecure_no_auth`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod nvme_common;

use ipsan_target::config::{self, Config, TargetConfig};
use ipsan_target::server::ServerError;
use ipsan_target::ServerHandle;

fn config(nvme: &str) -> Config {
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        targets: vec![TargetConfig::new(
            "iqn.2026-11.org.ipsan:exposed",
            config::luns_from_specs(&["mem:1MiB".to_owned()]).unwrap(),
        )],
        ..Config::default()
    };
    c.nvme.listen = vec![nvme.parse().unwrap()];
    c.validate().unwrap();
    c
}

#[tokio::test]
async fn rejects_an_nvme_listener_beyond_loopback_without_authentication() {
    let e = ServerHandle::start(&config("0.0.0.0:0")).await.unwrap_err();
    assert!(matches!(e, ServerError::Nvme(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains("0.0.0.0:0") && text.contains("--insecure-no-auth"),
        "the error says where and what to do: {text}"
    );
}

#[tokio::test]
async fn accepts_it_with_insecure_no_auth_and_on_loopback() {
    let mut c = config("0.0.0.0:0");
    c.insecure_no_auth = true;
    let h = ServerHandle::start(&c).await.unwrap();
    assert_eq!(h.nvme_addrs.len(), 1);
    h.shutdown().await.unwrap();
    let h = ServerHandle::start(&config("127.0.0.1:0")).await.unwrap();
    assert!(h.nvme_addrs[0].ip().is_loopback());
    h.shutdown().await.unwrap();
}

/// With DH-HMAC-CHAP secrets for the hosts (`[[nvme.host]]`) every host must authenticate, so
/// a listener beyond loopback starts; a host without a secret is refused at Connect.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn accepts_a_listener_beyond_loopback_when_every_host_must_authenticate() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("host.dhchap");
    std::fs::write(
        &secret,
        "DHHC-1:00:aBTraX76lFcUDME3h+EUQ7LMo3m5+aGVTuPbXbANUEAHZi8v:\n",
    )
    .unwrap();
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let toml = format!(
        "[nvme]\nlisten = [\"0.0.0.0:0\"]\n[[nvme.host]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa\"\n\
         dhchap_secret_file = \"{}\"\n[[target]]\niqn = \"iqn.2026-11.org.ipsan:exposed\"\n\
         [[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n",
        secret.display()
    );
    let c = Config::from_toml(&toml).unwrap();
    let h = ServerHandle::start(&c).await.unwrap();
    let port = h.nvme_addrs[0].port();
    // A host with no secret (the helper's host NQN) cannot connect.
    let addr: std::net::SocketAddr = format!("127.0.0.1:{port}").parse().unwrap();
    let mut host = nvme_common::Host::connect(addr, false, false).await;
    let r = host
        .fabrics_connect(
            0,
            nvme_wire::fabrics::CNTLID_DYNAMIC,
            "nqn.2026-11.org.ipsan:exposed",
        )
        .await;
    assert_eq!(r.status, nvme_wire::entry::Status::CONNECT_INVALID_HOST);
    h.shutdown().await.unwrap();

    // A secret file others can read is refused, as CHAP's are.
    std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o644)).unwrap();
    let e = Config::from_toml(&toml).unwrap_err();
    assert_eq!(e.field, "nvme.host[0].dhchap_secret_file", "{e}");
}

/// A reload may change a host's secret but not take the last one from a listener beyond
/// loopback: that change is refused whole and the listener keeps authenticating hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rejects_a_reload_that_takes_the_last_secret_from_a_listener_beyond_loopback() {
    let dir = tempfile::tempdir().unwrap();
    let secret = dir.path().join("host.dhchap");
    let write = |key: &str| {
        std::fs::write(&secret, key).unwrap();
        std::fs::set_permissions(&secret, std::os::unix::fs::PermissionsExt::from_mode(0o600))
            .unwrap();
    };
    write("DHHC-1:00:aBTraX76lFcUDME3h+EUQ7LMo3m5+aGVTuPbXbANUEAHZi8v:\n");
    let target = "[[target]]\niqn = \"iqn.2026-11.org.ipsan:exposed\"\n\
                  [[target.lun]]\nid = 0\nbackend = \"mem:1MiB\"\n";
    let host = format!(
        "[[nvme.host]]\nnqn = \"nqn.2014-08.org.nvmexpress:uuid:00000000-0000-4000-8000-0000000000aa\"\n\
         dhchap_secret_file = \"{}\"\n",
        secret.display()
    );
    let nvme = "[server]\nportals = [\"127.0.0.1:0\"]\n[nvme]\nlisten = [\"0.0.0.0:0\"]\n";
    let c = Config::from_toml(&format!("{nvme}{host}{target}")).unwrap();
    let h = ServerHandle::start(&c).await.unwrap();
    let parse = |t: &str| ipsan_target::config::FileConfig::parse(t).unwrap();
    let e = h
        .registry()
        .apply(parse(&format!("{nvme}{target}")), false)
        .unwrap_err();
    assert!(
        e.to_string().contains("nvme.host") && e.to_string().contains("0.0.0.0:"),
        "{e}"
    );
    // Another secret for the host is a change it may make.
    write("DHHC-1:00:0dHR0dHR0dHR0dHR0dHR0dHR0dHR0dHR0dHR0dHR0dHvNzk2:\n");
    let report = h
        .registry()
        .apply(parse(&format!("{nvme}{host}{target}")), false)
        .unwrap();
    assert!(
        report.changes.iter().any(|c| c.contains("DH-HMAC-CHAP")),
        "{report:?}"
    );
    h.shutdown().await.unwrap();
}
