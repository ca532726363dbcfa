//! The registry's targets as NVM subsystems: one subsystem per iSCSI target (NQN from
//! [`super::NvmeSettings::nqn_for`]), its local LUN *n* as namespace *n + 1* on the very
//! backend the SCSI LU uses (`Target::backends`, never a second open), the namespace's
//! identifiers from the LU's (NGUID = the NAA device identifier of VPD 83h, UUID derived from
//! it), and the discovery log's entries from the bound listeners.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use ipsan_scsi::Backend;
use nvme_proto::controller::{AllowedHosts, DiscoveryEntry, NamespaceConfig, SubsystemConfig};

use super::NvmeSettings;
use crate::registry::Target;

/// The stores behind one subsystem's namespaces, by NSID.
pub(super) type Stores = Arc<HashMap<u32, Arc<dyn Backend>>>;

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

/// One target as a subsystem, with the stores of its namespaces. Remote (pass-through) LUNs
/// are not served over NVMe (docs/nvme.md).
pub(super) fn subsystem(settings: &NvmeSettings, t: &Target) -> (SubsystemConfig, Stores) {
    let nqn = settings.nqn_for(&t.iqn);
    let mut namespaces = Vec::new();
    let mut stores = HashMap::new();
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
        });
        stores.insert(nsid, backend.clone());
    }
    (
        SubsystemConfig {
            serial: serial_of(&nqn),
            nqn,
            model: "ipsan".to_owned(),
            namespaces,
            hosts: AllowedHosts::Any,
            auth_required: false,
            volatile_write_cache: write_cache,
        },
        Arc::new(stores),
    )
}

/// The discovery log: every subsystem on every listener (TREQ: secure channel not required,
/// no TLS until it is configured).
pub(super) fn discovery_entries(
    subsystems: &[SubsystemConfig],
    listeners: &[SocketAddr],
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
                treq_secure_channel: 2,
                sectype: 0,
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

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
