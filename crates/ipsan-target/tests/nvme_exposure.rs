//! An NVMe/TCP listener beyond loopback authenticates its hosts or the target does not start
//! (the iSCSI rule of `exposure.rs`, issue 31): until DH-HMAC-CHAP or TLS is configured for
//! NVMe/TCP, every such listener is refused before anything is bound, unless the operator
//! accepts the risk with `insecure_no_auth`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

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
