//! The NVMe/TCP target (issue 30): the same targets and LUNs as the iSCSI side, served as NVM
//! subsystems and namespaces over NVMe/TCP (docs/nvme.md), beside the iSCSI portals and on the
//! same registry and block backends. The protocol is `nvme_proto`'s (the queue machine and the
//! controller, sans-IO); this module holds sockets, timers and wake-ups.
//!
//! - `config` (`crate::config::nvme`, part of the configuration below the registry): the
//!   `[nvme]` table (listeners, in-capsule size, subsystem NQNs), the NQN derived from a
//!   target's IQN, and the exposure rule (a listener beyond loopback must authenticate:
//!   refused until DH-HMAC-CHAP/TLS are configured).
//! - `subsystems`: the registry's targets as subsystems, LUN n as namespace n + 1 on the
//!   LU's own backend, and the discovery log's entries.
//! - `conn`: one connection: the queue machine, the connection's controller queue, block
//!   requests to the stores and the writes, one task per connection.
//! - `stats`: what is counted and shown: per-namespace counters, Connects per host, the
//!   `ipsan_nvme_*` metrics and `ipsan ctl nvme`'s status.
//! - here: [`NvmeServer`], the listeners, the accept loop and the task that runs the shared
//!   controller's timers (keep-alive) and delivers its events (asynchronous event
//!   completions, controllers to close) to the connections.
//!
//! DH-HMAC-CHAP (TP 8006) is the controller's, with the `[[nvme.host]]` secrets as its
//! `AuthPolicy` (set in [`NvmeServer::bind`]). The place for TLS (NL's `nvme-tls`) is
//! `NvmeServer::run`'s accept loop, before `conn::serve`.

pub use crate::config::nvme as config;
mod conn;
mod pool;
mod resv;
mod stats;
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
    check_exposure, derived_nqn, FileNvme, FileNvmeHost, FileNvmeSubsystem, HostSecrets,
    NvmeExposureError, NvmeSettings, TlsMode,
};
pub(crate) use stats::IoKind;
pub use stats::NsCounters;
pub use subsystems::nsid_of_lun;

use crate::accept::{accept_loop, Accepting};
use crate::registry::Registry;
use crate::remote_block::RemoteBlock;
use subsystems::{Lus, RemoteMap, RemoteNs, Stores};

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
    /// The LUs keeping each subsystem's namespaces' reservations, replaced with `stores`.
    lus: RwLock<HashMap<String, Lus>>,
    /// Bumped on every replacement of `stores`: connections look their map up again.
    stores_gen: AtomicU64,
    /// Every namespace's counters, by (subsystem NQN, NSID); kept across live changes.
    counters: Mutex<HashMap<(String, u32), Arc<NsCounters>>>,
    /// Open connections.
    connections: AtomicU64,
    /// The listeners (port 0 resolved).
    listen: Vec<SocketAddr>,
    /// The namespaces last given to the controller, per subsystem NQN.
    served: Mutex<HashMap<String, Vec<NamespaceConfig>>>,
    conns: Mutex<HashMap<u16, Vec<ConnEntry>>>,
    /// Something may have changed the controller's timers or queued an event.
    wake: Notify,
    queue_cfg: QueueConfig,
    ids: AtomicU64,
    /// TLS (TP 8011): off, allowed or required, and the hosts' keys.
    tls: TlsMode,
    /// The DH-HMAC-CHAP secrets the controller has now (a reload compares against them).
    dhchap: Mutex<controller::DhchapHosts>,
    tls_keys: nvme_proto::psk::PskStore,
    /// Remote (gateway) LUNs opened as namespaces (`open_remotes`).
    remote: Mutex<RemoteMap>,
    /// When each remote LUN that is not open was last tried.
    remote_tried: Mutex<HashMap<(String, u64), Instant>>,
    /// An `open_remotes` is running.
    remote_opening: std::sync::atomic::AtomicBool,
    /// The NQNs given explicitly as started, (IQN, NQN) (`NvmeSettings::nqns`: NQNs are not
    /// changed live).
    nqns: Vec<(String, String)>,
    /// Admin-queue Connects to a served subsystem by (subsystem NQN, host label, result):
    /// `ipsan_nvme_host_connects_total`.
    connects: Mutex<HashMap<(String, String, &'static str), u64>>,
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

    fn lus(&self, subnqn: &str) -> Lus {
        crate::read(&self.lus)
            .get(subnqn)
            .cloned()
            .unwrap_or_default()
    }

    /// Replaces a subsystem's stores and LUs; connections see them at their next request.
    fn install(&self, nqn: &str, stores: Stores, lus: Lus) {
        crate::write(&self.stores).insert(nqn.to_owned(), stores);
        crate::write(&self.lus).insert(nqn.to_owned(), lus);
        self.stores_gen.fetch_add(1, Ordering::AcqRel);
    }

    /// Brings the subsystems' namespaces in line with the registry after a live change
    /// (`ipsan ctl lun add|remove|resize`, a reload): a LUN added is a new namespace, a LUN
    /// removed is gone, a grown LU is a larger namespace; the controller tells hosts that
    /// asked for it with a Namespace Attribute Changed event. A target added after start is
    /// not served over NVMe/TCP until a restart (logged once).
    fn refresh(&self, registry: &Registry, settings: &NvmeSettings) {
        let remote = crate::lock(&self.remote).clone();
        let mut served = crate::lock(&self.served);
        let mut present = Vec::new();
        for t in registry.targets().iter() {
            let (s, st, lus) = subsystems::subsystem(settings, t, &remote);
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
                    self.install(&s.nqn, st, lus);
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
            self.install(&s.nqn, st, lus);
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
                crate::write(&self.lus).remove(&nqn);
                self.stores_gen.fetch_add(1, Ordering::AcqRel);
            }
            served.insert(nqn, Vec::new());
        }
    }

    /// Applies the subsystems' host lists of `settings` (a live change: `ipsan ctl nvme
    /// hosts`, a reload, SIGHUP): later Connects are checked against them, and controllers
    /// of hosts taken off a list are closed. A target not served since start is skipped.
    pub(crate) fn apply_hosts(
        &self,
        settings: &NvmeSettings,
        targets: &[crate::config::TargetConfig],
    ) {
        let mut changed = Vec::new();
        {
            let mut t = self.target();
            for target in targets {
                let nqn = self
                    .nqns
                    .iter()
                    .find(|(t, _)| *t == target.iqn)
                    .map_or_else(|| derived_nqn(&target.iqn), |(_, n)| n.clone());
                let want = settings.hosts_for(&target.iqn);
                if t.allowed_hosts(&nqn).is_none_or(|now| *now == want) {
                    continue;
                }
                if let Ok(ids) = t.set_allowed_hosts(&nqn, want) {
                    changed.push((nqn, ids.len()));
                }
            }
        }
        for (nqn, closed) in changed {
            info!(nqn = %nqn, controllers_closed = closed, "NVMe host list applied");
        }
        self.wake.notify_one();
    }

    /// Applies the hosts' DH-HMAC-CHAP secrets of `settings` (a live change: a reload,
    /// SIGHUP, `ipsan ctl reload`): later Connects prove the new secrets, and every controller
    /// whose host's secrets for its subsystem changed or went is closed (its host connects
    /// again with the new ones). Secrets are compared in constant time, never logged.
    /// Returns how many controllers were closed when the secrets changed, `None` when not.
    pub(crate) fn apply_secrets(&self, settings: &NvmeSettings) -> Option<usize> {
        let new = settings.dhchap_policy();
        let required = settings.auth_required();
        let subs = self.served_nqns();
        let closed = {
            let mut old = crate::lock(&self.dhchap);
            let same = |sub: &str, host: &str| old.same_secrets(&new, sub, host);
            let hosts: std::collections::BTreeSet<String> = old
                .keyed()
                .into_iter()
                .chain(new.keyed())
                .map(|(host, _, _)| host)
                .collect();
            if hosts
                .iter()
                .all(|h| subs.iter().all(|s| same(s.as_str(), h.as_str())))
            {
                return None;
            }
            let auth = required.then(|| Arc::new(new.clone()) as Arc<dyn controller::AuthPolicy>);
            let closed = self
                .target()
                .set_auth(auth, required, &|sub, host| !same(sub, host));
            *old = new;
            closed
        };
        info!(
            controllers_closed = closed.len(),
            "NVMe DH-HMAC-CHAP secrets applied"
        );
        self.wake.notify_one();
        Some(closed.len())
    }

    /// The exposure rule for a live change (`config::check_exposure` at start): a listener
    /// bound beyond loopback keeps host authentication, DH-HMAC-CHAP secrets or TLS required
    /// (as started), unless the target was started with `insecure_no_auth`.
    pub(crate) fn check_exposure(
        &self,
        settings: &NvmeSettings,
        insecure: bool,
    ) -> Result<(), NvmeExposureError> {
        let beyond: Vec<SocketAddr> = self
            .listen
            .iter()
            .copied()
            .filter(crate::exposure::beyond_loopback)
            .collect();
        if beyond.is_empty()
            || insecure
            || settings.auth_required()
            || self.tls == TlsMode::Required
        {
            return Ok(());
        }
        Err(NvmeExposureError { listen: beyond })
    }

    /// The NQNs of the subsystems served (the discovery subsystem's included).
    fn served_nqns(&self) -> Vec<String> {
        let mut v: Vec<String> = crate::lock(&self.served).keys().cloned().collect();
        v.push(controller::DISCOVERY_NQN.to_owned());
        v
    }

    /// Reservation notices the LUs owe NVMe hosts (`LogicalUnit::take_foreign_notices`: an
    /// iSCSI initiator's PERSISTENT RESERVE OUT or an NVMe host's reservation command
    /// preempted or released what the host had) become its controllers' Reservation
    /// Notification log pages and asynchronous events (docs/nvme.md "Reservations").
    fn deliver_resv_notices(&self) {
        let mut notices = Vec::new();
        for (nqn, lus) in crate::read(&self.lus).iter() {
            for (&nsid, lu) in lus.iter() {
                for (n, asc, ascq) in lu.take_foreign_notices() {
                    if let (Some(host), Some(notice)) =
                        (resv::host_of(&n), resv::notice_of(asc, ascq))
                    {
                        notices.push((nqn.clone(), host, nsid, notice));
                    }
                }
            }
        }
        if notices.is_empty() {
            return;
        }
        let mut t = self.target();
        for (nqn, (hostnqn, hostid), nsid, notice) in notices {
            let n = t.reservation_notice(&nqn, &hostnqn, &hostid, nsid, notice);
            tracing::debug!(nqn = %nqn, host = %hostnqn, nsid, ?notice, controllers = n, "reservation notice");
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

/// An H2CData carrying all of a write of at least this many bytes is received into a buffer
/// of its own (`Queue::placement`): the RAM store's chunk, the one write a store keeps as it
/// is (`Backend::write_whole`). A shorter write is copied by every store anyway, and placing
/// it would only cost the reads that stop at PDU heads while it may come.
const PLACE_MIN: u32 = 1 << 20;

/// The queue machine's settings for a controller configuration: the I/O in-capsule size and
/// the largest transfer must be the ones the controller announces (IOCCSZ, MDTS). A command's
/// data travels in one PDU each way (MAXH2CDATA and C2HData up to the largest transfer, as
/// Linux's nvmet announces 4 MiB): one H2CData reaches the store as it was received and one
/// C2HData reaches a host in one piece, neither gathered from several.
fn queue_config(c: &controller::TargetConfig) -> QueueConfig {
    let max_transfer = if c.max_transfer == 0 {
        QueueConfig::default().max_transfer
    } else {
        c.max_transfer
    };
    QueueConfig {
        io_in_capsule: c.in_capsule_data,
        max_transfer,
        maxh2cdata: max_transfer,
        max_c2h_data: max_transfer,
        place_min: PLACE_MIN,
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
        let mut lus = HashMap::new();
        for t in registry.targets().iter() {
            let (s, st, l) = subsystems::subsystem(settings, t, &RemoteMap::new());
            stores.insert(s.nqn.clone(), st);
            lus.insert(s.nqn.clone(), l);
            subsystems.push(s);
        }
        // DH-HMAC-CHAP (TP 8006): the hosts' secrets (for every subsystem or for some); with
        // any, every host must authenticate, on the discovery controller too.
        let dhchap = settings.dhchap_policy();
        let auth = settings
            .auth_required()
            .then(|| Arc::new(dhchap.clone()) as Arc<dyn controller::AuthPolicy>);
        let mut listeners = Vec::new();
        for &addr in &settings.listen {
            let l = crate::accept::listen(addr, tcp)
                .map_err(|source| NvmeError::Bind { addr, source })?;
            listeners.push(l);
        }
        let bound: Vec<SocketAddr> = listeners
            .iter()
            .filter_map(|l| l.local_addr().ok())
            .collect();
        let cfg = controller::TargetConfig {
            discovery: subsystems::discovery_entries(&subsystems, &bound, settings.tls),
            in_capsule_data: settings.in_capsule_data,
            subsystems: subsystems.clone(),
            auth,
            require_tls: settings.tls == TlsMode::Required,
            discovery_auth_required: settings.auth_required(),
            discovery_open: settings.discovery_open,
            tls_keys: (settings.tls == TlsMode::Required).then(|| settings.tls_keys.clone()),
            ..controller::TargetConfig::default()
        };
        let queue_cfg = queue_config(&cfg);
        let target = controller::Target::new(cfg)?;
        let served = subsystems
            .iter()
            .map(|s| (s.nqn.clone(), s.namespaces.clone()))
            .collect();
        let shared = Arc::new(Shared {
            target: Mutex::new(target),
            stores: RwLock::new(stores),
            lus: RwLock::new(lus),
            stores_gen: AtomicU64::new(0),
            served: Mutex::new(served),
            counters: Mutex::new(HashMap::new()),
            connections: AtomicU64::new(0),
            listen: bound.clone(),
            conns: Mutex::new(HashMap::new()),
            wake: Notify::new(),
            queue_cfg,
            ids: AtomicU64::new(1),
            tls: settings.tls,
            dhchap: Mutex::new(dhchap),
            tls_keys: settings.tls_keys.clone(),
            remote: Mutex::new(RemoteMap::new()),
            remote_tried: Mutex::new(HashMap::new()),
            remote_opening: std::sync::atomic::AtomicBool::new(false),
            nqns: settings.nqns.clone(),
            connects: Mutex::new(HashMap::new()),
        });
        // For the metrics and `ipsan ctl nvme`; one NVMe side per registry.
        let _ = registry.nvme.set(shared.clone());
        Ok(Self {
            settings: settings.clone(),
            subsystems: subsystems
                .iter()
                .map(|s| (s.nqn.clone(), s.namespaces.iter().map(|n| n.nsid).collect()))
                .collect(),
            shared,
            listeners,
        })
    }

    /// Opens the registry's remote (gateway) LUNs as namespaces (one iSCSI session each, as
    /// `remote_block` serves them) before the first host connects; one that fails is tried
    /// again every [`REMOTE_RETRY`] while serving.
    pub(crate) async fn open_remotes(&mut self, registry: &Registry) {
        open_remotes(&self.shared, registry).await;
        self.shared.refresh(registry, &self.settings);
        let served = crate::lock(&self.shared.served).clone();
        for (nqn, nsids) in &mut self.subsystems {
            if let Some(ns) = served.get(nqn) {
                *nsids = ns.iter().map(|n| n.nsid).collect();
            }
        }
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

    /// Serves until the server's cancel token fires. Connections run in the server's
    /// connection set under its limits (`crate::accept`, shared with iSCSI); the server waits
    /// for them after this returns.
    pub(crate) async fn run(self, accepting: Accepting) {
        let cancel = accepting.cancel.clone();
        let mut tasks = JoinSet::new();
        tasks.spawn(timers(
            self.shared.clone(),
            accepting.registry.clone(),
            self.settings,
            cancel.clone(),
        ));
        // Every connection runs on a thread of its own runtime (`pool`), one per CPU: no
        // wake-ups of the multi-thread runtime's other worker per batch.
        let cpus = std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get);
        let pool = match pool::Pool::new(cpus) {
            Ok(p) => Some(Arc::new(p)),
            Err(e) => {
                warn!("NVMe/TCP connection threads: {e}; serving on the main runtime");
                None
            }
        };
        for listener in self.listeners {
            let shared = self.shared.clone();
            let cancel = cancel.clone();
            let pool = pool.clone();
            tasks.spawn(accept_loop(
                listener,
                "NVMe/TCP",
                accepting.clone(),
                move |stream, peer, _sized| {
                    let shared = shared.clone();
                    let cancel = cancel.clone();
                    let conn = move |stream: tokio::net::TcpStream| async move {
                        let _ = stream.set_nodelay(true);
                        match tls_or_plain(stream, &shared).await {
                            Ok(Accepted::Plain(s)) => {
                                conn::serve(s, peer, shared, cancel, None).await
                            }
                            Ok(Accepted::Tls(a)) => {
                                conn::serve(a.stream, peer, shared, cancel, Some(a.identity)).await;
                            }
                            Err(why) => warn!(%peer, "NVMe/TCP connection refused: {why}"),
                        }
                    };
                    pool::serve_on(pool.as_deref(), stream, conn)
                },
            ));
        }
        cancel.cancelled().await;
        while tasks.join_next().await.is_some() {}
    }
}

/// How often the registry is compared with the namespaces served.
const REFRESH_EVERY: Duration = Duration::from_secs(1);

/// How long a remote LUN that could not be opened waits before the next try.
const REMOTE_RETRY: Duration = Duration::from_secs(10);

/// How long opening one remote LUN (login, READ CAPACITY) may take.
const REMOTE_OPEN_TIMEOUT: Duration = Duration::from_secs(10);

/// Logs in to a remote LUN's target under the spec's own initiator name and settings (Seal
/// on the remote leg as configured) and opens the LUN as a block store.
async fn open_remote(spec: &crate::remote::RemoteSpec) -> std::io::Result<RemoteBlock> {
    let mut cfg = spec.session.clone();
    if let Some((cipher, psk)) = &spec.seal {
        let req = ipsan_initiator::seal::SealRequest {
            ciphers: vec![*cipher],
            chunk: ipsan_seal::DEFAULT_CHUNK,
            psk: psk.clone(),
            pool: None,
        };
        cfg.extension = Some(req.factory());
    }
    let open = async {
        let session = ipsan_initiator::Session::connect(&spec.url, &cfg)
            .await
            .map_err(|e| std::io::Error::other(format!("login: {e}")))?;
        RemoteBlock::open(Arc::new(session), spec.remote_lun()).await
    };
    tokio::time::timeout(REMOTE_OPEN_TIMEOUT, open)
        .await
        .map_err(|_| std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out"))?
}

/// Opens every remote LUN of the registry's targets that is not open for its current spec
/// (and was not tried within [`REMOTE_RETRY`]); forgets those no longer configured. A remote
/// LUN whose hosts' CHAP is relayed cannot be opened without a host (docs/gateway.md) and
/// is not served over NVMe/TCP.
async fn open_remotes(shared: &Shared, registry: &Registry) {
    let mut wanted = Vec::new();
    for t in registry.targets().iter() {
        for (&lun, spec) in &t.remotes {
            wanted.push(((t.iqn.clone(), lun), Arc::clone(spec)));
        }
    }
    crate::lock(&shared.remote).retain(|k, _| wanted.iter().any(|(w, _)| w == k));
    for (key, spec) in wanted {
        let open = crate::lock(&shared.remote)
            .get(&key)
            .is_some_and(|r| r.source == spec.source);
        if open {
            continue;
        }
        let recent = {
            let mut tried = crate::lock(&shared.remote_tried);
            let recent = tried.get(&key).is_some_and(|t| t.elapsed() < REMOTE_RETRY);
            if !recent {
                tried.insert(key.clone(), Instant::now());
            }
            recent
        };
        if recent {
            continue;
        }
        if spec.chap_relay {
            warn!(target = %key.0, lun = key.1, "a remote LUN whose CHAP is relayed from iSCSI hosts is not served over NVMe/TCP");
            continue;
        }
        match open_remote(&spec).await {
            Ok(block) => {
                info!(target = %key.0, lun = key.1, remote = %spec.target_key(), "remote LUN opened for NVMe/TCP");
                let r = RemoteNs {
                    source: spec.source.clone(),
                    target_key: spec.target_key(),
                    remote_lun: spec.remote_lun(),
                    block: Arc::new(block),
                };
                crate::lock(&shared.remote).insert(key, r);
            }
            Err(e) => {
                warn!(target = %key.0, lun = key.1, remote = %spec.target_key(), "remote LUN not served over NVMe/TCP yet: {e}");
            }
        }
    }
}

/// A connection after its first bytes: plain NVMe/TCP, or TLS keyed by a host's PSK.
enum Accepted {
    Plain(tokio::net::TcpStream),
    Tls(nvme_tls::Accepted<tokio::net::TcpStream>),
}

/// The first byte of a TLS record carrying a handshake (RFC 8446 §5.1, ContentType 22); an
/// NVMe/TCP connection starts with ICReq, PDU type 0.
const TLS_HANDSHAKE: u8 = 0x16;

/// How long a connection may take to start (its first byte, the TLS handshake).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// TP 8011: with TLS on, a connection whose first byte starts a TLS handshake gets one keyed
/// by its host's PSK (the identity is kept: Connect must name it); with TLS required, any
/// other connection is refused.
async fn tls_or_plain(stream: tokio::net::TcpStream, shared: &Shared) -> Result<Accepted, String> {
    if shared.tls == TlsMode::Off {
        return Ok(Accepted::Plain(stream));
    }
    let mut first = [0u8; 1];
    let peeked = tokio::time::timeout(HANDSHAKE_TIMEOUT, stream.peek(&mut first))
        .await
        .map_err(|_| "nothing sent".to_owned())?
        .map_err(|e| e.to_string())?;
    if peeked == 0 {
        return Err("closed before its first byte".to_owned());
    }
    if first[0] != TLS_HANDSHAKE {
        return match shared.tls {
            TlsMode::Required => {
                Err("TLS is required and it did not start a TLS handshake".to_owned())
            }
            _ => Ok(Accepted::Plain(stream)),
        };
    }
    let a = tokio::time::timeout(
        HANDSHAKE_TIMEOUT,
        nvme_tls::accept(stream, &shared.tls_keys),
    )
    .await
    .map_err(|_| "TLS handshake not done in time".to_owned())?
    .map_err(|e| e.to_string())?;
    info!(hostnqn = %a.identity.hostnqn, subnqn = %a.identity.subnqn, "NVMe/TCP TLS connection");
    Ok(Accepted::Tls(a))
}

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
        shared.deliver_resv_notices();
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
            _ = refresh.tick() => {
                // Remote LUNs not open yet (or changed) are opened off this loop, whose
                // keep-alive timers must not wait for a login.
                let remotes = registry.targets().iter().any(|t| !t.remotes.is_empty());
                if remotes && !shared.remote_opening.swap(true, Ordering::AcqRel) {
                    let (s, r) = (shared.clone(), registry.clone());
                    tokio::spawn(async move {
                        open_remotes(&s, &r).await;
                        s.remote_opening.store(false, Ordering::Release);
                    });
                }
                shared.refresh(&registry, &settings);
            }
            () = cancel.cancelled() => return,
        }
    }
}
