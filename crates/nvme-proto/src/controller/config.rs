//! What a [`super::Target`] serves: subsystems with their namespaces and allowed hosts, the
//! discovery log's entries, and the limits the controller announces.

use std::fmt;
use std::sync::Arc;

use super::auth_hook::AuthPolicy;

/// The well-known NQN of the discovery subsystem (NVMe Base 2.0 §4.5; NVMe over Fabrics 1.1
/// §5): a Connect to it creates a discovery controller.
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Which hosts may connect to a subsystem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum AllowedHosts {
    /// Any host NQN.
    Any,
    /// Only these host NQNs (compared exactly).
    Only(Vec<String>),
}

impl AllowedHosts {
    /// Whether `hostnqn` may connect.
    #[must_use]
    pub fn allows(&self, hostnqn: &str) -> bool {
        match self {
            Self::Any => true,
            Self::Only(list) => list.iter().any(|h| h == hostnqn),
        }
    }
}

/// One namespace: an LU served over NVMe (NVMe Base 2.0 §3.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamespaceConfig {
    /// NSID, 1..=0xFFFF_FFFE.
    pub nsid: u32,
    /// Size in bytes (a multiple of `block_size`; a tail is not served).
    pub size: u64,
    /// Logical block size in bytes, a power of two ≥ 512.
    pub block_size: u32,
    /// NGUID (Identify Namespace bytes 104..120, descriptor type 2), from the LU's identity.
    pub nguid: [u8; 16],
    /// Namespace UUID (descriptor type 3), from the LU's identity.
    pub uuid: [u8; 16],
    /// IEEE EUI-64 (Identify Namespace bytes 120..128, descriptor type 1); zero = none.
    pub eui64: [u8; 8],
    /// Deallocated blocks read as zeroes (the store's discard zeroes): DLFEAT 001b and
    /// Write Zeroes with DEAC may deallocate.
    pub deallocate_zeroes: bool,
    /// Refuse writes (Namespace is Write Protected).
    pub read_only: bool,
    /// The namespace offers reservations (RESCAP; NVMe Base 2.0 §8.19): the reservation
    /// commands become [`super::BlockOp::Reservation`] requests. Without, they complete with
    /// Invalid Opcode.
    pub reservations: bool,
}

/// One NVM subsystem (NVMe Base 2.0 §1.5): an NQN, its namespaces and who may connect.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubsystemConfig {
    /// The subsystem NQN (SUBNQN).
    pub nqn: String,
    /// Serial number (Identify Controller SN, ≤ 20 ASCII bytes).
    pub serial: String,
    /// Model number (MN, ≤ 40 ASCII bytes).
    pub model: String,
    pub namespaces: Vec<NamespaceConfig>,
    pub hosts: AllowedHosts,
    /// Every host must authenticate (DH-HMAC-CHAP, TP 8006): a host the [`AuthPolicy`] has no
    /// transaction for is refused at Connect with Connect Invalid Host.
    pub auth_required: bool,
    /// A volatile write cache is present (VWC bit 0; Flush then matters).
    pub volatile_write_cache: bool,
}

/// One entry of the discovery log page (NVMe over Fabrics 1.1 §5.3, Discovery Log Page Entry).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// SUBNQN: a configured subsystem's NQN, or [`DISCOVERY_NQN`] for this discovery service.
    pub subnqn: String,
    /// TRADDR, e.g. `127.0.0.1`.
    pub traddr: String,
    /// TRSVCID: the TCP port as text.
    pub trsvcid: String,
    /// ADRFAM: IPv6 instead of IPv4.
    pub ipv6: bool,
    /// PORTID.
    pub portid: u16,
    /// TREQ bits 1:0, secure channel: 0 not specified, 1 required, 2 not required.
    pub treq_secure_channel: u8,
    /// TSAS.SECTYPE for TCP: 0 none, 1 TLS 1.2 (reserved since TP 8011), 2 TLS 1.3.
    pub sectype: u8,
}

/// Everything a [`super::Target`] is built from.
#[derive(Clone)]
pub struct TargetConfig {
    pub subsystems: Vec<SubsystemConfig>,
    /// The discovery log's entries (the target driver fills them from its listeners); a host
    /// sees those of subsystems it may connect to, and the discovery ones.
    pub discovery: Vec<DiscoveryEntry>,
    /// Largest I/O queue count a host may ask for (Number of Queues).
    pub max_io_queues: u16,
    /// Entries per queue (CAP.MQES + 1 and MAXCMD).
    pub queue_size: u16,
    /// In-capsule data bytes an I/O queue accepts (IOCCSZ = (64 + this) / 16); the queue
    /// machine must use the same value.
    pub in_capsule_data: u32,
    /// Largest transfer in bytes, a power of two ≥ 4096 (MDTS); 0 = no limit.
    pub max_transfer: u32,
    /// Firmware revision (FR, ≤ 8 bytes).
    pub firmware: String,
    /// Decides, per host, whether Connect asks for DH-HMAC-CHAP and runs the transactions.
    pub auth: Option<Arc<dyn AuthPolicy>>,
    /// Refuse Connects on plain TCP to every subsystem but discovery (`--tls required`):
    /// defence in depth behind a listener that only speaks TLS.
    pub require_tls: bool,
    /// The discovery controller requires DH-HMAC-CHAP too (TP 8006; NVMe over Fabrics 1.1
    /// §5): its Connect asks for authentication (AUTHREQ.ATR) of a host the [`AuthPolicy`]
    /// has a transaction for on [`DISCOVERY_NQN`], and refuses any other host with Connect
    /// Invalid Host; the log is read only after the transaction succeeds.
    pub discovery_auth_required: bool,
    /// The discovery controller asks no host to authenticate even when the I/O controllers
    /// do (`[nvme] discovery_auth = false`), as Linux's nvmet: for hosts whose tools cannot
    /// authenticate to a discovery controller (Debian 13's nvme-cli 2.13 `nvme discover`
    /// hands it no secret). The log a host reads still lists only the subsystems its host
    /// NQN has a secret (and, with TLS required, a key) for — the NQN it claims, unproven.
    pub discovery_open: bool,
    /// The hosts' TLS keys (TP 8011), when TLS is required: the discovery log a host reads
    /// lists only the subsystems it has a key for, the others' handshakes would fail.
    pub tls_keys: Option<crate::psk::PskStore>,
}

impl fmt::Debug for TargetConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TargetConfig")
            .field("subsystems", &self.subsystems)
            .field("discovery", &self.discovery)
            .field("max_io_queues", &self.max_io_queues)
            .field("queue_size", &self.queue_size)
            .field("in_capsule_data", &self.in_capsule_data)
            .field("max_transfer", &self.max_transfer)
            .field("firmware", &self.firmware)
            .field("auth", &self.auth.is_some())
            .field("require_tls", &self.require_tls)
            .field("discovery_auth_required", &self.discovery_auth_required)
            .field("discovery_open", &self.discovery_open)
            .field(
                "tls_keys",
                &self.tls_keys.as_ref().map(crate::psk::PskStore::len),
            )
            .finish()
    }
}

impl Default for TargetConfig {
    fn default() -> Self {
        Self {
            subsystems: Vec::new(),
            discovery: Vec::new(),
            max_io_queues: 8,
            queue_size: 128,
            in_capsule_data: 8192,
            max_transfer: 1 << 20,
            firmware: env!("CARGO_PKG_VERSION").to_owned(),
            auth: None,
            require_tls: false,
            discovery_auth_required: false,
            discovery_open: false,
            tls_keys: None,
        }
    }
}

/// A [`TargetConfig`] that cannot be served.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("subsystem NQN {0:?} is empty, longer than 223 bytes, repeated or the discovery NQN")]
    Nqn(String),
    #[error("namespace {nsid} of {subnqn}: {reason}")]
    Namespace {
        subnqn: String,
        nsid: u32,
        reason: &'static str,
    },
    #[error("{0}")]
    Limits(&'static str),
}
