//! The registry's targets as NVM subsystems: one subsystem per iSCSI target (NQN from
//! [`super::NvmeSettings::nqn_for`]), its local LUN *n* as namespace *n + 1* on the very
//! backend the SCSI LU uses (`Target::backends`, never a second open), the namespace's
//! identifiers from the LU's (NGUID = the NAA device identifier of VPD 83h, UUID derived from
//! it), and the discovery log's entries from the bound listeners.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use ipsan_scsi::{Backend, LogicalUnit};
use nvme_proto::controller::{DiscoveryEntry, NamespaceConfig, SubsystemConfig};
use nvme_proto::idhash::IdMap;

use super::NvmeSettings;
use crate::registry::Target;

/// The stores behind one subsystem's namespaces, by NSID. Looked up on every command (with
/// [`Lus`] and the counters): hashed as CIDs are ([`IdMap`]), not with SipHash, whose three
/// lookups were ~340 of the target's ~8,000 instructions per 64 KiB read
/// (docs/results/nvme-speed-8). The maps are the configured namespaces, a few keys the host
/// does not choose; a host's NSID only looks one up.
pub(super) type Stores = Arc<IdMap<u32, Arc<dyn Backend>>>;

/// The LUs whose reservation state one subsystem's namespaces share (those that offer
/// reservations), by NSID.
pub(super) type Lus = Arc<IdMap<u32, Arc<LogicalUnit>>>;

/// The NSID of LUN `lun`: LUN 0 is namespace 1 (NSID 0 is not a namespace; NVMe Base 2.0
/// §3.2.1.2). LUN ids go up to 16383, so every one has an NSID.
#[must_use]
pub fn nsid_of_lun(lun: u64) -> u32 {
    u32::try_from(lun).map_or(0, |l| l.saturating_add(1))
}

/// A namespace UUID from the LU's 16-byte device identifier: the same bytes with the RFC 9562
/// version (8, "custom") and variant bits set, so it is stable wherever the LU is served.
fn uuid_from(id: &[u8; 16]) -> [u8; 16] {
    let mut u = *id;
    u[6] = (u[6] & 0x0f) | 0x80;
    u[8] = (u[8] & 0x3f) | 0x80;
    u
}

/// An Identify Controller serial number (≤ 20 printable ASCII bytes) that is the same for
/// every controller of the subsystem: FNV-1a of its NQN in hex.
fn serial_of(nqn: &str) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in nqn.bytes() {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// A remote (gateway) LUN opened as a block store for NVMe (`crate::remote_block`), by
/// target IQN and local LUN id.
#[derive(Debug, Clone)]
pub(crate) struct RemoteNs {
    /// The `RemoteSpec` source it was opened from: a changed spec is opened again.
    pub(crate) source: String,
    /// The remote target and LUN, for the namespace's identity.
    pub(crate) target_key: String,
    pub(crate) remote_lun: u64,
    pub(crate) block: Arc<crate::remote_block::RemoteBlock>,
}

/// Remote LUNs opened for NVMe, by (target IQN, local LUN id).
pub(crate) type RemoteMap = HashMap<(String, u64), RemoteNs>;

/// A stable 16-byte identity for a remote LUN's namespace: FNV-1a (two seeds) of the remote
/// target's address, IQN and LUN, so every gateway in front of one remote LUN shows the same
/// NGUID.
fn remote_nguid(target_key: &str, lun: u64) -> [u8; 16] {
    let text = format!("ipsan-remote {target_key} {lun}");
    let mut out = [0u8; 16];
    for (i, seed) in [0xcbf2_9ce4_8422_2325u64, 0x6c62_272e_07bb_0142]
        .iter()
        .enumerate()
    {
        let mut h = *seed;
        for b in text.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        out[8 * i..8 * i + 8].copy_from_slice(&h.to_be_bytes());
    }
    out
}

/// One target as a subsystem, with the stores of its namespaces and the LUs that keep their
/// reservations (an LU that refuses reservations, on a shared store without a shared record,
/// offers none over NVMe either). A remote (gateway) LUN is a namespace once `remote` holds
/// it opened for its current spec (`remote_block`), without reservations (docs/nvme.md).
pub(super) fn subsystem(
    settings: &NvmeSettings,
    t: &Target,
    remote: &RemoteMap,
) -> (SubsystemConfig, Stores, Lus) {
    let nqn = settings.nqn_for(&t.iqn);
    let mut namespaces = Vec::new();
    let mut stores = IdMap::default();
    let mut lus = IdMap::default();
    let mut write_cache = false;
    for (&lun, lu) in &t.luns {
        let Some((_, backend)) = t.backends.iter().find(|(id, _)| *id == lun) else {
            continue;
        };
        let nsid = nsid_of_lun(lun);
        let cfg = lu.config();
        write_cache |= cfg.write_cache;
        namespaces.push(NamespaceConfig {
            nsid,
            size: lu.num_blocks() * u64::from(lu.block_size()),
            block_size: lu.block_size(),
            nguid: cfg.device_id,
            uuid: uuid_from(&cfg.device_id),
            eui64: [0; 8],
            deallocate_zeroes: lu.thin(),
            read_only: cfg.read_only,
            reservations: !lu.refuses_reservations(),
        });
        stores.insert(nsid, backend.clone());
        if !lu.refuses_reservations() {
            lus.insert(nsid, Arc::clone(lu));
        }
    }
    for (&lun, spec) in &t.remotes {
        let Some(r) = remote
            .get(&(t.iqn.clone(), lun))
            .filter(|r| r.source == spec.source)
        else {
            continue;
        };
        let nsid = nsid_of_lun(lun);
        let nguid = remote_nguid(&r.target_key, r.remote_lun);
        namespaces.push(NamespaceConfig {
            nsid,
            size: r.block.size(),
            block_size: r.block.block_size(),
            nguid,
            uuid: uuid_from(&nguid),
            eui64: [0; 8],
            deallocate_zeroes: false,
            read_only: false,
            reservations: false,
        });
        stores.insert(nsid, r.block.clone() as Arc<dyn Backend>);
    }
    (
        SubsystemConfig {
            serial: serial_of(&nqn),
            nqn,
            model: "ipsan".to_owned(),
            namespaces,
            // `[[nvme.subsystem]] hosts` as started; live changes go through
            // `Shared::apply_hosts`.
            hosts: settings.hosts_for(&t.iqn),
            // With DH-HMAC-CHAP secrets configured, a host without one is refused.
            auth_required: settings.auth_required(),
            volatile_write_cache: write_cache,
        },
        Arc::new(stores),
        Arc::new(lus),
    )
}

/// The discovery log: every subsystem on every listener, with TREQ's secure channel
/// (required with TLS required, else not required) and TSAS's security type (TLS 1.3 when TLS
/// is on; NVMe over Fabrics 1.1 §5.3, Discovery Log Page Entry).
pub(super) fn discovery_entries(
    subsystems: &[SubsystemConfig],
    listeners: &[SocketAddr],
    tls: super::TlsMode,
) -> Vec<DiscoveryEntry> {
    let mut out = Vec::new();
    for (i, addr) in listeners.iter().enumerate() {
        for s in subsystems {
            out.push(DiscoveryEntry {
                subnqn: s.nqn.clone(),
                traddr: addr.ip().to_string(),
                trsvcid: addr.port().to_string(),
                ipv6: addr.is_ipv6(),
                portid: u16::try_from(i + 1).unwrap_or(u16::MAX),
                treq_secure_channel: if tls == super::TlsMode::Required {
                    1
                } else {
                    2
                },
                sectype: if tls == super::TlsMode::Off { 0 } else { 2 },
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derives_one_remote_namespace_identity_per_remote_lun() {
        let a = remote_nguid("127.0.0.1:3260/iqn.x", 0);
        assert_eq!(a, remote_nguid("127.0.0.1:3260/iqn.x", 0));
        assert_ne!(a, remote_nguid("127.0.0.1:3260/iqn.x", 1));
        assert_ne!(a[..8], a[8..]);
    }

    #[test]
    fn numbers_namespaces_from_one() {
        assert_eq!(nsid_of_lun(0), 1);
        assert_eq!(nsid_of_lun(16383), 16384);
    }

    #[test]
    fn derives_a_version_8_uuid_and_a_stable_serial() {
        let u = uuid_from(&[0xff; 16]);
        assert_eq!(u[6] >> 4, 8);
        assert_eq!(u[8] >> 6, 0b10);
        assert_eq!(serial_of("nqn.a"), serial_of("nqn.a"));
        assert_ne!(serial_of("nqn.a"), serial_of("nqn.b"));
        assert!(serial_of("nqn.a").len() <= 20);
    }
}
