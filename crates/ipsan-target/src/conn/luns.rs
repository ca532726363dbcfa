//! What the target engine asks the driver while PDUs arrive ([`engine::LunDirectory`]): which
//! LUNs exist and which are pass-throughs, how many data-out bytes a CDB needs (sealed bytes in
//! a Seal session, by the engine's `Sizing::sealed`), and which targets and portals SendTargets lists ([`engine_text::Directory`],
//! from the registry). Sizing a command decodes its CDB, the one parse of it: the typed
//! command travels with the engine's task to its execution (`execute.rs`).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use ipsan_scsi::{decode_lun, CommandInfo, DataDirection, LogicalUnit, ScsiResponse};
use ipsan_seal::SealSession;
use iscsi_proto::engine::target as engine;
use iscsi_proto::engine::text as engine_text;

use crate::registry::{Registry, Target, PORTAL_GROUP_TAG};

/// What the engine asks about LUNs while a command arrives: which exist, and how many data-out
/// bytes a CDB needs (in a Seal session, the sealed size); and which targets SendTargets lists.
pub(super) struct Luns<'a> {
    pub target: Option<&'a Target>,
    pub seal: Option<&'a SealSession>,
    pub registry: &'a Registry,
    /// The portal this connection came in on: the address SendTargets gives.
    pub local: Option<SocketAddr>,
}

impl engine_text::Directory for Luns<'_> {
    fn targets(&self, initiator: &str) -> Vec<engine_text::Listed> {
        self.registry
            .targets()
            .iter()
            .filter(|t| t.allows(initiator))
            .map(|t| engine_text::Listed {
                name: t.iqn.clone(),
                portals: self
                    .local
                    .map(|a| (a, PORTAL_GROUP_TAG))
                    .into_iter()
                    .collect(),
            })
            .collect()
    }
}

impl Luns<'_> {
    fn lu(&self, raw: u64) -> Option<&Arc<LogicalUnit>> {
        self.target
            .and_then(|t| t.luns.get(&decode_lun(raw.to_be_bytes())))
    }
}

/// A device server's answer as the engine takes it.
pub(super) fn engine_response(r: ScsiResponse) -> engine::Response {
    engine::Response {
        status: r.status.0,
        sense: r.sense.map(|s| Bytes::from(s.to_fixed())),
        data_in: r.data_in,
        data_in_trailer: Bytes::new(),
    }
}

impl engine::LunDirectory<CommandInfo> for Luns<'_> {
    fn exists(&self, lun: u64) -> bool {
        self.lu(lun).is_some() || self.passthrough(lun)
    }

    fn directory(&self) -> Option<&dyn engine_text::Directory> {
        Some(self)
    }

    fn passthrough(&self, lun: u64) -> bool {
        self.target
            .is_some_and(|t| t.remote_route(decode_lun(lun.to_be_bytes())).is_some())
    }

    fn size(&self, _itt: u32, lun: u64, cdb: &[u8], edtl: u32) -> engine::Sizing<CommandInfo> {
        let mut early = None;
        // The one parse of the CDB: its typed command travels with the engine's task to
        // `Event::Execute` (`Sizing::decoded`). A CDB the LU refuses (or no LU) has none.
        let decoded = match self.lu(lun) {
            Some(lu) => match lu.command_info(cdb) {
                Ok(info) => Some(info),
                Err(sense) => {
                    early = Some(engine_response(ScsiResponse::check(sense)));
                    None
                }
            },
            None => None,
        };
        let need = decoded
            .filter(|i| i.direction == DataDirection::Write)
            .map_or(0, |i| i.data_out_len);
        let sizing = engine::Sizing {
            need,
            early,
            transfer: None,
            decoded,
        };
        // In a Seal session EDTL and every offset count sealed bytes: the engine's rule
        // (`Sizing::sealed`) collects a write's whole sealed EDTL and refuses an EDTL that
        // is no sealed length.
        match self.seal {
            Some(seal) => sizing.sealed(edtl, seal),
            None => sizing,
        }
    }
}
