//! Listening portals, the accept loop and graceful shutdown.
//!
//! Like mini-redis, a server takes bound listeners and a shutdown future, so tests bind port 0
//! and run the real target in-process.

use std::net::SocketAddr;
use std::sync::Arc;

use iscsi_proto::login::TargetOffer;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::accept::{accept_loop, Accepting};
use crate::config::Config;
use crate::conn::{self, Shared};
use crate::registry::{BuildError, Registry};

/// How long shutdown waits for the backends' flush before it stops without it.
const SHUTDOWN_FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// Errors starting or running the target.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Build(#[from] BuildError),
    #[error("cannot start the crypto workers: {source}")]
    Pool { source: std::io::Error },
    #[error(transparent)]
    Exposed(#[from] crate::exposure::ExposureError),
    #[error(transparent)]
    Nvme(#[from] crate::nvme::NvmeError),
}

/// A target with its portals bound, ready to run.
#[derive(Debug)]
pub struct Server {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
    max_connections: usize,
    /// The NVMe/TCP listeners (`[nvme] listen`), when configured.
    nvme: Option<crate::nvme::NvmeServer>,
}

impl Server {
    /// Opens every LUN backend and binds every portal.
    pub async fn bind(config: &Config) -> Result<Self, ServerError> {
        // Before anything is opened or bound: a listener beyond loopback authenticates.
        for w in crate::exposure::check(config, &config.portals, config.insecure_no_auth)? {
            tracing::warn!("{w}");
        }
        // The same rule for NVMe/TCP listeners, before anything is opened.
        if let Some(w) =
            crate::nvme::check_exposure(config).map_err(crate::nvme::NvmeError::from)?
        {
            tracing::warn!("{w}");
        }
        let registry = Registry::build(config)?;
        let nvme = if config.nvme.listen.is_empty() {
            None
        } else {
            let mut nvme =
                crate::nvme::NvmeServer::bind(&config.nvme, &registry, config.tcp.as_ref())?;
            // Remote (gateway) LUNs become namespaces before anything is served.
            nvme.open_remotes(&registry).await;
            Some(nvme)
        };
        let mut listeners = Vec::new();
        for &addr in &config.portals {
            let l = crate::accept::listen(addr, config.tcp.as_ref())
                .map_err(|source| ServerError::Bind { addr, source })?;
            listeners.push(l);
        }
        *crate::write(&registry.portals) = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let offer = TargetOffer {
            cmd_window: config.queue_depth,
            max_connections: config.connections_per_session,
            error_recovery_level: config.error_recovery_level,
            ..TargetOffer::default()
        };
        Ok(Self {
            shared: Arc::new(Shared {
                registry: Arc::new(registry),
                pool: Arc::new(
                    ipsan_seal::CryptoPool::new(config.crypto_workers)
                        .map_err(|source| ServerError::Pool { source })?,
                ),
                offer,
                login_timeout: config.login_timeout,
                nop_interval: config.nop_interval,
                tcp: config.tcp.clone(),
                seal_compress: config.seal_compress,
            }),
            listeners,
            max_connections: config.max_connections,
            nvme,
        })
    }

    /// The live state: targets, sessions, counters; what the control socket and the
    /// metrics endpoint serve.
    #[must_use]
    pub fn registry(&self) -> Arc<Registry> {
        self.shared.registry.clone()
    }

    /// The addresses actually bound (port 0 resolved).
    #[must_use]
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The NVMe/TCP listeners actually bound (empty when NVMe/TCP is off).
    #[must_use]
    pub fn nvme_addrs(&self) -> Vec<SocketAddr> {
        self.nvme
            .as_ref()
            .map(crate::nvme::NvmeServer::local_addrs)
            .unwrap_or_default()
    }

    /// The `nvme+tcp://host:port/subsysnqn/nsid` URLs of every namespace.
    #[must_use]
    pub fn nvme_urls(&self) -> Vec<String> {
        self.nvme
            .as_ref()
            .map(crate::nvme::NvmeServer::urls)
            .unwrap_or_default()
    }

    /// The `iscsi://` URLs of every LUN, as libiscsi and `ipsan bench` take them.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        let mut urls = Vec::new();
        for addr in self.local_addrs() {
            let host = match addr {
                SocketAddr::V4(a) => a.to_string(),
                SocketAddr::V6(a) => format!("[{}]:{}", a.ip(), a.port()),
            };
            for t in self.shared.registry.targets().iter() {
                for lun in t.luns.keys().chain(t.remotes.keys()) {
                    urls.push(format!("iscsi://{host}/{}/{lun}", t.iqn));
                }
            }
        }
        urls
    }

    /// Serves until `shutdown` resolves, then stops accepting, lets running commands finish,
    /// flushes every backend and returns.
    pub async fn run(
        self,
        shutdown: impl std::future::Future<Output = ()>,
    ) -> Result<(), ServerError> {
        let cancel = CancellationToken::new();
        let accepting = Accepting {
            limit: Arc::new(Semaphore::new(self.max_connections)),
            registry: self.shared.registry.clone(),
            conns: Arc::new(tokio::sync::Mutex::new(JoinSet::new())),
            cancel: cancel.clone(),
            send_buffer: ipsan_tcp::SendBuffer::unless_set(self.shared.tcp.as_ref()),
        };
        let mut accepts = JoinSet::new();
        if let Some(nvme) = self.nvme {
            accepts.spawn(nvme.run(accepting.clone()));
        }
        for listener in self.listeners {
            let shared = self.shared.clone();
            let cancel = cancel.clone();
            accepts.spawn(accept_loop(
                listener,
                "iSCSI",
                accepting.clone(),
                move |stream, peer, sized| {
                    conn::serve(stream, peer, sized, shared.clone(), cancel.clone())
                },
            ));
        }
        shutdown.await;
        info!("shutting down: no new connections, finishing commands in flight");
        cancel.cancel();
        self.shared.registry.cancel_all();
        while accepts.join_next().await.is_some() {}
        let mut set = std::mem::take(&mut *accepting.conns.lock().await);
        while set.join_next().await.is_some() {}
        // The flush runs on a thread of its own and is waited for at most
        // SHUTDOWN_FLUSH_LIMIT: a backend whose flush never returns must not keep the process
        // from exiting. A tokio blocking task would, since the runtime waits for those when it
        // is dropped. (The RBD flush seen hanging in CI waited for the image's exclusive lock,
        // held by another target's client whose close had deadlocked inside a librbd
        // callback; fixed in ipsan-block's rbd/mod.rs.)
        // Nothing acknowledged is lost by not waiting: a file's dirty pages stay with the
        // kernel, and RBD writes are acknowledged by the cluster (no librbd cache by default).
        let shared = self.shared.clone();
        let (done, flushed) = tokio::sync::oneshot::channel();
        let started = std::thread::Builder::new()
            .name("shutdown-flush".into())
            .spawn(move || {
                for t in shared.registry.targets().iter() {
                    for (id, backend) in &t.backends {
                        if let Err(e) = backend.flush() {
                            warn!(target = %t.iqn, lun = id, "flush at shutdown failed: {e}");
                        }
                    }
                }
                let _ = done.send(());
            });
        match started {
            Err(e) => warn!("cannot start the flush at shutdown: {e}"),
            Ok(_) => match tokio::time::timeout(SHUTDOWN_FLUSH_LIMIT, flushed).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => warn!("flush at shutdown panicked"),
                Err(_) => warn!(
                    limit_secs = SHUTDOWN_FLUSH_LIMIT.as_secs(),
                    "flush at shutdown still running after {SHUTDOWN_FLUSH_LIMIT:?} (a backend \
                     that does not answer); stopping without it"
                ),
            },
        }
        info!("target stopped");
        Ok(())
    }
}

/// A target running in the background (for tests and embedding): stop it with
/// [`ServerHandle::shutdown`].
#[derive(Debug)]
pub struct ServerHandle {
    pub addrs: Vec<SocketAddr>,
    /// The NVMe/TCP listeners (empty when NVMe/TCP is off).
    pub nvme_addrs: Vec<SocketAddr>,
    pub urls: Vec<String>,
    registry: Arc<Registry>,
    stop: CancellationToken,
    task: tokio::task::JoinHandle<Result<(), ServerError>>,
}

impl ServerHandle {
    /// Binds and starts `config` on the current tokio runtime.
    pub async fn start(config: &Config) -> Result<Self, ServerError> {
        let server = Server::bind(config).await?;
        let addrs = server.local_addrs();
        let nvme_addrs = server.nvme_addrs();
        let urls = server.urls();
        let registry = server.shared.registry.clone();
        let stop = CancellationToken::new();
        let s = stop.clone();
        let task = tokio::spawn(async move { server.run(s.cancelled_owned()).await });
        Ok(Self {
            addrs,
            nvme_addrs,
            urls,
            registry,
            stop,
            task,
        })
    }

    /// The live state (targets, sessions, counters).
    #[must_use]
    pub fn registry(&self) -> Arc<Registry> {
        self.registry.clone()
    }

    /// What the login limits have refused so far (limits.rs).
    #[must_use]
    pub fn limit_stats(&self) -> crate::limits::LimitCounts {
        self.registry.stats.snapshot()
    }

    /// Graceful shutdown; waits for it to finish.
    pub async fn shutdown(self) -> Result<(), ServerError> {
        self.stop.cancel();
        self.task.await.unwrap_or(Ok(()))
    }
}
