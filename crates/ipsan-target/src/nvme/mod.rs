//! The NVMe/TCP target (issue 30): the same targets and LUNs as the iSCSI side, served as NVM
//! subsystems and namespaces over NVMe/TCP (docs/nvme.md), beside the iSCSI portals and on the
//! same registry and block backends. The protocol is `nvme_proto`'s (the queue machine and the
//! controller, sans-IO); this module holds sockets, timers and wake-ups.
//!
//! - `config`: the `[nvme]` table (listeners, in-capsule size, subsystem NQNs), the NQN
//!   derived from a target's IQN, and the exposure rule (a listener beyond loopback must
//!   authenticate: refused until DH-HMAC-CHAP/TLS are configured).
//! - `subsystems`: the registry's targets as subsystems, LUN n as namespace n + 1 on the
//!   LU's own backend, and the discovery log's entries.
//! - `conn`: one connection: the queue machine, the connection's controller queue, block
//!   requests to the stores, a writer task.
//! - here: [`NvmeServer`], the listeners, the accept loop and the task that runs the shared
//!   controller's timers (keep-alive) and delivers its events (asynchronous event
//!   completions, controllers to close) to the connections.
//!
//! The place for TLS (NL's `nvme-tls`) is `NvmeServer::run`'s accept loop, before
//! `conn::serve`; for DH-HMAC-CHAP, `controller::TargetConfig::auth` in [`NvmeServer::bind`].

pub mod config;
mod conn;
pub mod subsystems;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};
use std::time::{Duration, Instant};

use nvme_proto::controller::{self, Event, NamespaceConfig};
use nvme_proto::queue::QueueConfig;
use nvme_proto::Completion;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify};
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use config::{
    check_exposure, derived_nqn, FileNvme, FileNvmeSubsystem, NvmeExposureError, NvmeSettings,
};
pub use subsystems::nsid_of_lun;

use crate::registry::Registry;
use subsystems::Stores;

/// Errors starting the NVMe/TCP side.
#[derive(Debug, thiserror::Error)]
pub enum NvmeError {
    #[error("cannot listen for NVMe/TCP on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("NVMe/TCP subsystems: {0}")]
    Config(#[from] controller::ConfigError),
    #[error(transparent)]
    Exposed(#[from] NvmeExposureError),
}

/// One connection of a controller, for the events that concern it.
#[derive(Debug)]
pub(crate) struct ConnEntry {
    id: u64,
    qid: u16,
    close: CancellationToken,
    /// The admin queue's channel for asynchronous event completions.
    aer: Option<mpsc::UnboundedSender<Completion>>,
}

/// What every connection shares.
#[derive(Debug)]
pub(crate) struct Shared {
    target: Mutex<controller::Target>,
    /// The stores of each subsystem's namespaces, replaced when the registry changes.
    stores: RwLock<HashMap<String, Stores>>,
    /// Bumped on every replacement of `stores`: connections look their map up again.
    stores_gen: AtomicU64,
    /// The namespaces last given to the controller, per subsystem NQN.
    served: Mutex<HashMap<String, Vec<NamespaceConfig>>>,
    conns: Mutex<HashMap<u16, Vec<ConnEntry>>>,
    /// Something may have changed the controller's timers or queued an event.
    wake: Notify,
    queue_cfg: QueueConfig,
    ids: AtomicU64,
}

impl Shared {
    fn target(&self) -> MutexGuard<'_, controller::Target> {
        crate::lock(&self.target)
    }

    fn stores(&self, subnqn: &str) -> Stores {
        crate::read(&self.stores)
            .get(subnqn)
            .cloned()
            .unwrap_or_default()
    }

    /// Brings the subsystems' namespaces in line with the registry after a live change
    /// (`ipsan ctl lun add|remove|resize`, a reload): a LUN added is a new namespace, a LUN
    /// removed is gone, a grown LU is a larger namespace; the controller tells hosts that
    /// asked for it with a Namespace Attribute Changed event. A target added after start is
    /// not served over NVMe/TCP until a restart (logged once).
    fn refresh(&self, registry: &Registry, settings: &NvmeSettings) {
        let mut served = crate::lock(&self.served);
        let mut present = Vec::new();
        for t in registry.targets().iter() {
            let (s, st) = subsystems::subsystem(settings, t);
            present.push(s.nqn.clone());
            let Some(old) = served.get(&s.nqn) else {
                info!(target = %t.iqn, nqn = %s.nqn, "a target added live is served over NVMe/TCP after a restart");
                served.insert(s.nqn.clone(), s.namespaces.clone());
                continue;
            };
            if *old == s.namespaces {
                // Same namespaces; a LUN replaced by one just like it has a new store.
                let now = self.stores(&s.nqn);
                let same = now.len() == st.len()
                    && st
                        .iter()
                        .all(|(id, b)| now.get(id).is_some_and(|o| Arc::ptr_eq(o, b)));
                if !same {
                    crate::write(&self.stores).insert(s.nqn.clone(), st);
                    self.stores_gen.fetch_add(1, Ordering::AcqRel);
                }
                continue;
            }
            if let Err(e) = self.target().set_namespaces(&s.nqn, s.namespaces.clone()) {
                if !matches!(e, controller::ConfigError::Nqn(_)) {
                    warn!(nqn = %s.nqn, "namespaces not updated: {e}");
                }
                served.insert(s.nqn.clone(), s.namespaces.clone());
                continue;
            }
            info!(nqn = %s.nqn, namespaces = s.namespaces.len(), "NVMe namespaces updated");
            crate::write(&self.stores).insert(s.nqn.clone(), st);
            self.stores_gen.fetch_add(1, Ordering::AcqRel);
            served.insert(s.nqn, s.namespaces);
        }
        let gone: Vec<String> = served
            .keys()
            .filter(|n| !present.contains(n))
            .cloned()
            .collect();
        for nqn in gone {
            // A target removed live: its subsystem stays, with no namespace.
            if served.get(&nqn).is_some_and(|v| !v.is_empty())
                && self.target().set_namespaces(&nqn, Vec::new()).is_ok()
            {
                crate::write(&self.stores).remove(&nqn);
                self.stores_gen.fetch_add(1, Ordering::AcqRel);
            }
            served.insert(nqn, Vec::new());
        }
    }

    fn next_id(&self) -> u64 {
        self.ids.fetch_add(1, Ordering::Relaxed)
    }

    fn register(&self, cntlid: u16, e: ConnEntry) {
        crate::lock(&self.conns).entry(cntlid).or_default().push(e);
    }

    fn unregister(&self, cntlid: u16, id: u64) {
        let mut conns = crate::lock(&self.conns);
        if let Some(list) = conns.get_mut(&cntlid) {
            list.retain(|e| e.id != id);
            if list.is_empty() {
                conns.remove(&cntlid);
            }
        }
    }

    /// Acts on the controller's events.
    fn dispatch(&self, ev: Event) {
        let conns = crate::lock(&self.conns);
        match ev {
            Event::AdminCompletion { cntlid, completion } => {
                if let Some(tx) = conns
                    .get(&cntlid)
                    .and_then(|l| l.iter().find_map(|e| e.aer.as_ref()))
                {
                    let _ = tx.send(completion);
                }
            }
            Event::CloseController { cntlid, reason } => {
                info!(cntlid, ?reason, "NVMe controller closed");
                for e in conns.get(&cntlid).into_iter().flatten() {
                    e.close.cancel();
                }
            }
            Event::CloseIoQueues { cntlid } => {
                for e in conns.get(&cntlid).into_iter().flatten() {
                    if e.qid != 0 {
                        e.close.cancel();
                    }
                }
            }
        }
    }
}

/// The NVMe/TCP listeners of a target, bound and ready to run.
#[derive(Debug)]
pub struct NvmeServer {
    shared: Arc<Shared>,
    listeners: Vec<TcpListener>,
    subsystems: Vec<(String, Vec<u32>)>,
    settings: NvmeSettings,
}

/// The queue machine's settings for a controller configuration: the I/O in-capsule size and
/// the largest transfer must be the ones the controller announces (IOCCSZ, MDTS).
fn queue_config(c: &controller::TargetConfig) -> QueueConfig {
    QueueConfig {
        io_in_capsule: c.in_capsule_data,
        max_transfer: if c.max_transfer == 0 {
            QueueConfig::default().max_transfer
        } else {
            c.max_transfer
        },
        ..QueueConfig::default()
    }
}

impl NvmeServer {
    /// Builds the subsystems from `registry`'s targets and binds `settings.listen`.
    pub fn bind(
        settings: &NvmeSettings,
        registry: &Registry,
        tcp: Option<&ipsan_tcp::TcpSettings>,
    ) -> Result<Self, NvmeError> {
        let mut subsystems = Vec::new();
        let mut stores = HashMap::new();
        for t in registry.targets().iter() {
            let (s, st) = subsystems::subsystem(settings, t);
            stores.insert(s.nqn.clone(), st);
            subsystems.push(s);
        }
        let mut listeners = Vec::new();
        for &addr in &settings.listen {
            let l = crate::server::listen(addr, tcp)
                .map_err(|source| NvmeError::Bind { addr, source })?;
            listeners.push(l);
        }
        let bound: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let cfg = controller::TargetConfig {
            discovery: subsystems::discovery_entries(&subsystems, &bound),
            in_capsule_data: settings.in_capsule_data,
            subsystems: subsystems.clone(),
            ..controller::TargetConfig::default()
        };
        let queue_cfg = queue_config(&cfg);
        let target = controller::Target::new(cfg)?;
        let served = subsystems
            .iter()
            .map(|s| (s.nqn.clone(), s.namespaces.clone()))
            .collect();
        Ok(Self {
            settings: settings.clone(),
            subsystems: subsystems
                .iter()
                .map(|s| (s.nqn.clone(), s.namespaces.iter().map(|n| n.nsid).collect()))
                .collect(),
            shared: Arc::new(Shared {
                target: Mutex::new(target),
                stores: RwLock::new(stores),
                stores_gen: AtomicU64::new(0),
                served: Mutex::new(served),
                conns: Mutex::new(HashMap::new()),
                wake: Notify::new(),
                queue_cfg,
                ids: AtomicU64::new(1),
            }),
            listeners,
        })
    }

    /// The addresses actually bound (port 0 resolved).
    #[must_use]
    pub fn local_addrs(&self) -> Vec<SocketAddr> {
        self.listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect()
    }

    /// The `nvme+tcp://host:port/subsysnqn/nsid` URL of every namespace.
    #[must_use]
    pub fn urls(&self) -> Vec<String> {
        let mut urls = Vec::new();
        for addr in self.local_addrs() {
            for (nqn, nsids) in &self.subsystems {
                for nsid in nsids {
                    urls.push(format!("nvme+tcp://{addr}/{nqn}/{nsid}"));
                }
            }
        }
        urls
    }

    /// Serves until `cancel` fires, then closes every connection and returns once they are
    /// gone. `registry` supplies the per-address connection limit shared with iSCSI.
    pub async fn run(
        self,
        registry: Arc<Registry>,
        max_connections: usize,
        cancel: CancellationToken,
    ) {
        let limit = Arc::new(tokio::sync::Semaphore::new(max_connections));
        let mut tasks = JoinSet::new();
        tasks.spawn(timers(
            self.shared.clone(),
            registry.clone(),
            self.settings,
            cancel.clone(),
        ));
        let conns = Arc::new(tokio::sync::Mutex::new(JoinSet::new()));
        for listener in self.listeners {
            let shared = self.shared.clone();
            let cancel = cancel.clone();
            let limit = limit.clone();
            let conns = conns.clone();
            let registry = registry.clone();
            tasks.spawn(async move {
                loop {
                    let accepted = tokio::select! {
                        a = listener.accept() => a,
                        () = cancel.cancelled() => return,
                    };
                    let (stream, peer) = match accepted {
                        Ok(x) => x,
                        Err(e) => {
                            warn!("NVMe/TCP accept failed: {e}");
                            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                            continue;
                        }
                    };
                    let Ok(permit) = limit.clone().try_acquire_owned() else {
                        warn!(%peer, "NVMe/TCP connection limit reached; refusing");
                        continue;
                    };
                    let Some(per_address) = registry.open_connection(peer.ip()) else {
                        continue;
                    };
                    // TLS (TP 8011) goes here, before the first PDU, once configured.
                    let shared = shared.clone();
                    let cancel = cancel.clone();
                    let mut set = conns.lock().await;
                    while set.try_join_next().is_some() {}
                    set.spawn(async move {
                        conn::serve(stream, peer, shared, cancel).await;
                        drop(per_address);
                        drop(permit);
                    });
                }
            });
        }
        cancel.cancelled().await;
        while tasks.join_next().await.is_some() {}
        let mut set = std::mem::take(&mut *conns.lock().await);
        while set.join_next().await.is_some() {}
    }
}

/// How often the registry is compared with the namespaces served.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// Runs the controller's timers (keep-alive expiry), delivers its events, and follows the
/// registry's live changes.
async fn timers(
    shared: Arc<Shared>,
    registry: Arc<Registry>,
    settings: NvmeSettings,
    cancel: CancellationToken,
) {
    let mut refresh = tokio::time::interval(REFRESH_EVERY);
    refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let (events, next) = {
            let mut t = shared.target();
            t.handle_timeout(Instant::now());
            let mut events = Vec::new();
            while let Some(e) = t.poll_event() {
                events.push(e);
            }
            (events, t.poll_timeout())
        };
        for e in events {
            shared.dispatch(e);
        }
        tokio::select! {
            () = async {
                match next {
                    Some(t) => tokio::time::sleep_until(t.into()).await,
                    None => std::future::pending().await,
                }
            } => {}
            () = shared.wake.notified() => {}
            _ = refresh.tick() => shared.refresh(&registry, &settings),
            () = cancel.cancelled() => return,
        }
    }
}
