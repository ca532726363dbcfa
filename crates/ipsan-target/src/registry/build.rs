//! A target from its configuration: its LUNs' backends opened (or kept from the running
//! target when unchanged) and its policies set.

use super::*;

/// Opens one LUN's backend and builds its logical unit.
pub(super) fn build_lun(
    iqn: &str,
    l: &LunConfig,
    relative_port_id: u16,
) -> Result<(Arc<LogicalUnit>, Arc<dyn Backend>), BuildError> {
    let fail = |why: String| BuildError {
        target: iqn.to_owned(),
        lun: l.id,
        why,
    };
    let backend = ipsan_scsi::open(&l.backend).map_err(|e| fail(e.to_string()))?;
    // A shared store (an RBD image) names itself: every target exporting it reports the
    // same serial and NAA identifier (VPD 80h/83h), so multipath sees one disk.
    let serial = l
        .serial
        .clone()
        .unwrap_or_else(|| match backend.identity() {
            Some(id) => serial_for_identity(&id),
            None => serial_for(iqn, l.id),
        });
    let mut cfg = LuConfig::with_serial(&serial);
    cfg.block_size = l.block_size;
    cfg.read_only = l.read_only;
    cfg.write_cache = l.write_cache;
    cfg.relative_port = relative_port_id;
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::target_port_designator(
            iqn,
            PORTAL_GROUP_TAG,
        ));
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::relative_port_designator(
            relative_port_id,
        ));
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::target_port_group_designator(
            PORTAL_GROUP_TAG,
        ));
    cfg.extra_designators
        .push(ipsan_scsi::inquiry::target_device_designator(iqn));
    let lu = LogicalUnit::new(backend.clone(), cfg).map_err(|e| fail(e.to_string()))?;
    Ok((Arc::new(lu), backend))
}

/// Builds a target; LUNs found in `reuse` (id → the running LU, its backend) are kept as
/// they are (same reservations, same unit attentions, same open file).
pub(super) fn build_target(
    t: &TargetConfig,
    reuse: Option<(&Target, &std::collections::BTreeSet<u64>)>,
    relative_port_id: u16,
) -> Result<Target, BuildError> {
    let mut luns = BTreeMap::new();
    let mut backends = Vec::new();
    let mut lun_configs = BTreeMap::new();
    let lun_stats = reuse.map_or_else(
        || Arc::new(RwLock::new(BTreeMap::new())),
        |(old, _)| old.lun_stats.clone(),
    );
    let mut remotes = BTreeMap::new();
    for l in &t.luns {
        if let Some(r) = &l.remote {
            remotes.insert(l.id, r.clone());
            lun_configs.insert(l.id, l.clone());
            continue;
        }
        let kept = reuse.and_then(|(old, keep)| {
            keep.contains(&l.id).then(|| {
                let lu = old.luns.get(&l.id)?.clone();
                let be = old.backends.iter().find(|(id, _)| *id == l.id)?.1.clone();
                Some((lu, be))
            })?
        });
        let (lu, backend) = match kept {
            Some(x) => x,
            None => build_lun(&t.iqn, l, relative_port_id)?,
        };
        backends.push((l.id, backend));
        luns.insert(l.id, lu);
        lun_configs.insert(l.id, l.clone());
    }
    {
        let mut table = crate::write(&lun_stats);
        table.retain(|id, _| luns.contains_key(id));
        for (id, lu) in &luns {
            table
                .entry(*id)
                .or_insert_with(|| crate::metrics::lun_stats(lu.block_size()));
        }
    }
    Ok(Target {
        iqn: t.iqn.clone(),
        alias: t.alias.clone(),
        allow: t.allow.clone(),
        auth: if t.chap_relay() {
            Auth::Relay
        } else {
            t.chap.clone().map_or(Auth::None, Auth::Chap)
        },
        chap_hosts: t.chap_hosts.clone(),
        seal: t.seal.clone(),
        luns,
        backends,
        lun_configs,
        lun_stats,
        remotes,
    })
}

/// A stable serial number per target and LUN, so a restarted target presents the same disk.
/// The serial of a shared store: a hash of its identity (cluster, pool, image id).
pub(super) fn serial_for_identity(identity: &str) -> String {
    let id = ipsan_scsi::inquiry::device_id_from(identity.as_bytes());
    let h = u64::from_be_bytes([id[8], id[9], id[10], id[11], id[12], id[13], id[14], id[15]]);
    format!("IPSANRBD{h:016X}")
}

pub(super) fn serial_for(iqn: &str, lun: u64) -> String {
    // FNV-1a: stable across runs and builds (unlike std's hasher).
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in iqn.bytes().chain(lun.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("IPSAN{h:016X}")
}
