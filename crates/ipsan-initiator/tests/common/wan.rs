//! Across `ipsan wan`: two network namespaces joined by the emulator, a sealed ipsan target in
//! one of them, for the tests that need a long or slow path (root and /dev/net/tun).

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread::{Scope, ScopedJoinHandle};
use std::time::Duration;

use ipsan_seal::{Psk, SealPolicy};
use ipsan_target::config::{self as tconfig, Config, TargetConfig};
use ipsan_target::ServerHandle;
use ipsan_wan::{link, Link, Side};

/// Removes the link's namespaces when dropped, also when the test fails.
pub struct Guard(pub String);

impl Drop for Guard {
    fn drop(&mut self) {
        let _ = link::cleanup(&self.0);
    }
}

/// Root and /dev/net/tun are there; otherwise prints `SKIPPED: <reason>` and says no.
pub fn can_run() -> bool {
    if link::is_root() && std::path::Path::new("/dev/net/tun").exists() {
        return true;
    }
    println!("SKIPPED: needs root and /dev/net/tun (namespaces, TUN)");
    false
}

/// A sealed target running in `l`'s target namespace (its runtime's threads there).
pub struct WanTarget<'s> {
    /// Where it listens.
    pub addr: SocketAddr,
    stop: mpsc::Sender<()>,
    thread: ScopedJoinHandle<'s, ()>,
}

impl WanTarget<'_> {
    /// Shuts the target down and waits for it.
    pub fn stop(self) {
        let _ = self.stop.send(());
        self.thread.join().unwrap();
    }
}

/// Starts a target for `iqn` with one LUN (`lun`, e.g. `mem:16MiB`) that requires Seal with the
/// pre-shared `secret`, on the target side of `l`, after `tweak` changed its configuration.
pub fn sealed_target<'s>(
    scope: &'s Scope<'s, '_>,
    l: &'s Link,
    iqn: &'static str,
    secret: &'static [u8],
    lun: &'static str,
    tweak: impl FnOnce(&mut Config) + Send + 'static,
) -> WanTarget<'s> {
    let tgt = l.addr(Side::Tgt);
    let (addr_tx, addr_rx) = mpsc::channel();
    let (stop, stop_rx) = mpsc::channel::<()>();
    let thread = scope.spawn(move || {
        l.run_in(Side::Tgt, move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async move {
                let mut t =
                    TargetConfig::new(iqn, tconfig::luns_from_specs(&[lun.to_owned()]).unwrap());
                t.seal = tconfig::SealSettings {
                    policy: SealPolicy::Required,
                    secret: Some(Psk::new(secret.to_vec()).unwrap()),
                    initiators: Vec::new(),
                };
                let mut c = Config {
                    portals: vec![SocketAddr::from((tgt, 0))],
                    targets: vec![t],
                    ..Config::default()
                };
                tweak(&mut c);
                c.validate().unwrap();
                let h = ServerHandle::start(&c).await.unwrap();
                addr_tx.send(h.addrs[0]).unwrap();
                tokio::task::spawn_blocking(move || stop_rx.recv())
                    .await
                    .unwrap()
                    .unwrap();
                h.shutdown().await.unwrap();
            });
        })
        .unwrap();
    });
    let addr = addr_rx.recv_timeout(Duration::from_secs(30)).unwrap();
    WanTarget { addr, stop, thread }
}
