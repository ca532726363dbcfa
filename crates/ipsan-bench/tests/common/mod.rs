//! Test helpers: a session configuration with short timeouts and a time-bounded runtime.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code)]

use std::time::Duration;

use ipsan_initiator::{LoginOptions, SessionConfig};

/// Session settings for loopback tests: quick to fail, quick to notice a dead peer.
pub fn config(login: LoginOptions) -> SessionConfig {
    SessionConfig {
        login,
        connect_timeout: Duration::from_secs(5),
        login_timeout: Duration::from_secs(10),
        nop_interval: Some(Duration::from_secs(2)),
        nop_timeout: Duration::from_secs(5),
        ..SessionConfig::default()
    }
}

/// Run an async test body with a hard time bound.
pub fn bounded<F: std::future::Future<Output = ()>>(secs: u64, f: F) {
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(secs), f)
            .await
            .expect("test exceeded its time bound");
    });
}

/// An in-process target on loopback with one 32 MiB RAM LUN named `iqn`, Seal allowed with
/// `secret` as its pre-shared key (plain logins too), one crypto worker.
pub async fn start_target(iqn: &str, secret: &[u8]) -> ipsan_target::ServerHandle {
    use ipsan_seal::{Psk, SealPolicy};
    use ipsan_target::config::{self as tconfig, Config, SealSettings, TargetConfig};
    let mut t = TargetConfig::new(
        iqn,
        tconfig::luns_from_specs(&["mem:32MiB".to_owned()]).unwrap(),
    );
    t.seal = SealSettings {
        policy: SealPolicy::Allowed,
        secret: Some(Psk::new(secret.to_vec()).unwrap()),
        initiators: Vec::new(),
    };
    let mut c = Config {
        portals: vec!["127.0.0.1:0".parse().unwrap()],
        crypto_workers: 1,
        targets: vec![t],
        ..Config::default()
    };
    c.validate().unwrap();
    ipsan_target::ServerHandle::start(&c).await.unwrap()
}
