//! What the NVMe/TCP side counts and shows: every namespace's block requests and bytes
//! ([`NsCounters`]), admin-queue Connects per subsystem and host, the `ipsan_nvme_*` series
//! of the metrics and what `ipsan ctl nvme` prints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use nvme_proto::controller::{self, NamespaceConfig};

use super::subsystems::Stores;
use super::Shared;

/// What one namespace served: block requests that succeeded, by kind, with their bytes, and
/// those that failed (`ipsan_nvme_namespace_*` in the metrics).
#[derive(Debug, Default)]
pub struct NsCounters {
    pub reads: AtomicU64,
    pub writes: AtomicU64,
    pub others: AtomicU64,
    pub read_bytes: AtomicU64,
    pub written_bytes: AtomicU64,
    pub errors: AtomicU64,
}

/// The kind of a block request, for [`NsCounters`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IoKind {
    Read,
    Write,
    Other,
}

impl NsCounters {
    pub(crate) fn record(&self, kind: IoKind, bytes: u64) {
        let (n, b) = match kind {
            IoKind::Read => (&self.reads, Some(&self.read_bytes)),
            IoKind::Write => (&self.writes, Some(&self.written_bytes)),
            IoKind::Other => (&self.others, None),
        };
        n.fetch_add(1, Ordering::Relaxed);
        if let Some(b) = b {
            b.fetch_add(bytes, Ordering::Relaxed);
        }
    }
}

/// At most this many (subsystem, host, result) series of Connects; past it a new host NQN
/// counts as [`OTHER_HOSTS`] (a host NQN is whatever a host declares).
const MAX_CONNECT_SERIES: usize = 4096;

/// The host label of Connects past [`MAX_CONNECT_SERIES`].
const OTHER_HOSTS: &str = "(other)";

impl Shared {
    /// Counts an admin-queue Connect to subsystem `subnqn` from `hostnqn` (only for served
    /// subsystems: the discovery subsystem and unknown NQNs are not counted).
    pub(crate) fn count_connect(&self, subnqn: &str, hostnqn: &str, result: &'static str) {
        if !crate::lock(&self.served).contains_key(subnqn) {
            return;
        }
        let mut m = crate::lock(&self.connects);
        let key = (subnqn.to_owned(), hostnqn.to_owned(), result);
        if let Some(n) = m.get_mut(&key) {
            *n += 1;
            return;
        }
        let key = if m.len() < MAX_CONNECT_SERIES {
            key
        } else {
            (subnqn.to_owned(), OTHER_HOSTS.to_owned(), result)
        };
        *m.entry(key).or_default() += 1;
    }

    /// The counters of the namespaces in `stores` (created on first use).
    pub(super) fn ns_counters(
        &self,
        subnqn: &str,
        stores: &Stores,
    ) -> nvme_proto::idhash::IdMap<u32, Arc<NsCounters>> {
        let mut all = crate::lock(&self.counters);
        stores
            .keys()
            .map(|&nsid| {
                let c = all.entry((subnqn.to_owned(), nsid)).or_default();
                (nsid, Arc::clone(c))
            })
            .collect()
    }

    /// The NVMe series of the metrics: connections, every namespace's block requests and
    /// bytes, and every live controller's commands and bytes by host NQN.
    pub(crate) fn render_metrics(&self, e: &mut crate::metrics::Exposition) {
        e.sample(
            "ipsan_nvme_connections",
            "Open NVMe/TCP connections (one per queue).",
            "gauge",
            &[],
            self.connections.load(Ordering::Relaxed) as f64,
        );
        let counters: Vec<((String, u32), Arc<NsCounters>)> = crate::lock(&self.counters)
            .iter()
            .map(|(k, v)| (k.clone(), Arc::clone(v)))
            .collect();
        for ((nqn, nsid), c) in &counters {
            let nsid = nsid.to_string();
            for (op, n, bytes) in [
                ("read", &c.reads, Some(&c.read_bytes)),
                ("write", &c.writes, Some(&c.written_bytes)),
                ("other", &c.others, None),
            ] {
                let labels = [
                    ("subsystem", nqn.as_str()),
                    ("nsid", nsid.as_str()),
                    ("op", op),
                ];
                e.sample(
                    "ipsan_nvme_namespace_requests_total",
                    "Block requests NVMe/TCP hosts' commands made of the namespace that succeeded, by kind (read, write, other: flush, deallocate, write zeroes).",
                    "counter",
                    &labels,
                    n.load(Ordering::Relaxed) as f64,
                );
                if let Some(b) = bytes {
                    e.sample(
                        "ipsan_nvme_namespace_bytes_total",
                        "Bytes NVMe/TCP hosts read from or wrote to the namespace.",
                        "counter",
                        &labels,
                        b.load(Ordering::Relaxed) as f64,
                    );
                }
            }
            e.sample(
                "ipsan_nvme_namespace_errors_total",
                "Block requests of the namespace that failed.",
                "counter",
                &[("subsystem", nqn.as_str()), ("nsid", nsid.as_str())],
                c.errors.load(Ordering::Relaxed) as f64,
            );
        }
        let connects: Vec<((String, String, &'static str), u64)> = crate::lock(&self.connects)
            .iter()
            .map(|(k, v)| (k.clone(), *v))
            .collect();
        for ((sub, host, result), n) in &connects {
            e.sample(
                "ipsan_nvme_host_connects_total",
                "Admin-queue Connects (one per controller) to a subsystem, per host NQN and result: accepted, refused_host (Connect Invalid Host: not on the subsystem's host list, no DH-HMAC-CHAP secret, or not the host its TLS key names), refused (any other refusal).",
                "counter",
                &[
                    ("subsystem", sub.as_str()),
                    ("host", host.as_str()),
                    ("result", result),
                ],
                *n as f64,
            );
        }
        for c in self.target().controllers() {
            let cntlid = c.cntlid.to_string();
            // Host NQNs are at most 223 bytes (NVMe Base 2.0 §4.5; Connect refuses longer).
            let host = c.hostnqn.as_str();
            for (op, n, bytes) in [
                ("read", c.read_commands, c.bytes_read),
                ("write", c.write_commands, c.bytes_written),
            ] {
                let labels = [
                    ("subsystem", c.subnqn.as_str()),
                    ("host", host),
                    ("cntlid", cntlid.as_str()),
                    ("op", op),
                ];
                e.sample(
                    "ipsan_nvme_controller_commands_total",
                    "Read and Write commands a live NVMe controller completed, per host.",
                    "counter",
                    &labels,
                    n as f64,
                );
                e.sample(
                    "ipsan_nvme_controller_bytes_total",
                    "Bytes a live NVMe controller's Read and Write commands moved, per host.",
                    "counter",
                    &labels,
                    bytes as f64,
                );
            }
        }
    }

    /// What `ipsan ctl nvme` shows: the listeners, every subsystem with its namespaces, and
    /// the live controllers (host NQN, I/O queues, reads and writes).
    pub(crate) fn status(&self) -> serde_json::Value {
        let served = crate::lock(&self.served).clone();
        let mut subsystems: Vec<(String, Vec<NamespaceConfig>)> = served.into_iter().collect();
        subsystems.sort_by(|a, b| a.0.cmp(&b.0));
        let hosts: HashMap<String, Option<Vec<String>>> = {
            let t = self.target();
            subsystems
                .iter()
                .map(|(nqn, _)| {
                    let h = match t.allowed_hosts(nqn) {
                        Some(controller::AllowedHosts::Only(l)) => Some(l.clone()),
                        _ => None,
                    };
                    (nqn.clone(), h)
                })
                .collect()
        };
        // Who has DH-HMAC-CHAP secrets for each subsystem (never the secrets).
        let dhchap: HashMap<String, Vec<String>> = {
            let p = crate::lock(&self.dhchap);
            let all = p.keyed();
            subsystems
                .iter()
                .map(|(nqn, _)| nqn.as_str())
                .chain([controller::DISCOVERY_NQN])
                .map(|nqn| {
                    let mut v: Vec<String> = all
                        .iter()
                        .filter(|(h, _, _)| p.secrets(nqn, h).is_some())
                        .map(|(h, _, _)| h.clone())
                        .collect();
                    v.dedup();
                    (nqn.to_owned(), v)
                })
                .collect()
        };
        let controllers: Vec<serde_json::Value> = self
            .target()
            .controllers()
            .into_iter()
            .map(|c| {
                serde_json::json!({
                    "cntlid": c.cntlid,
                    "subsystem": c.subnqn,
                    "host": c.hostnqn,
                    "discovery": c.discovery,
                    "ready": c.ready,
                    "io_queues": c.io_queues,
                    "read_commands": c.read_commands,
                    "write_commands": c.write_commands,
                    "bytes_read": c.bytes_read,
                    "bytes_written": c.bytes_written,
                })
            })
            .collect();
        serde_json::json!({
            "enabled": true,
            "listen": self.listen.iter().map(ToString::to_string).collect::<Vec<_>>(),
            "connections": self.connections.load(Ordering::Relaxed),
            "subsystems": subsystems.iter().map(|(nqn, ns)| serde_json::json!({
                "nqn": nqn,
                // null: every host the authentication lets in.
                "hosts": hosts.get(nqn).cloned().flatten(),
                // The hosts with DH-HMAC-CHAP secrets for it.
                "dhchap_hosts": dhchap.get(nqn),
                "namespaces": ns.iter().map(|n| serde_json::json!({
                    "nsid": n.nsid,
                    "size_bytes": n.size,
                    "block_size": n.block_size,
                    "read_only": n.read_only,
                })).collect::<Vec<_>>(),
            })).collect::<Vec<_>>(),
            "controllers": controllers,
            "discovery_dhchap_hosts": dhchap.get(controller::DISCOVERY_NQN),
        })
    }
}

/// What the registry asks of the NVMe/TCP side ([`crate::registry::NvmeSide`]: the registry
/// holds it without depending on this module).
impl crate::registry::NvmeSide for Shared {
    fn apply_hosts(
        &self,
        settings: &crate::config::nvme::NvmeSettings,
        targets: &[crate::config::TargetConfig],
    ) {
        Shared::apply_hosts(self, settings, targets);
    }

    fn apply_secrets(&self, settings: &crate::config::nvme::NvmeSettings) -> Option<usize> {
        Shared::apply_secrets(self, settings)
    }

    fn check_exposure(
        &self,
        settings: &crate::config::nvme::NvmeSettings,
        insecure: bool,
    ) -> Result<(), crate::config::nvme::NvmeExposureError> {
        Shared::check_exposure(self, settings, insecure)
    }

    fn render_metrics(&self, e: &mut crate::metrics::Exposition) {
        Shared::render_metrics(self, e);
    }

    fn status(&self) -> serde_json::Value {
        Shared::status(self)
    }
}
