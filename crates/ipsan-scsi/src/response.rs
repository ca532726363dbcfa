//! What every command handler shares, below the logical unit: whom a command is for
//! ([`NexusId`]) and what it answers ([`ScsiResponse`], Data-In truncated to the allocation
//! length). Handlers (`lun`, `pr`, ...) import these from here, not from `lu`, which calls
//! them.

use bytes::Bytes;

use crate::sense::{ScsiStatus, Sense};

/// Identifies an I_T nexus (SAM-5 §4.6): `"iqn.initiator,i,0x<isid>"` — the key for unit
/// attentions and reservations.
#[derive(Clone, PartialEq, Eq, Hash, Debug)]
pub struct NexusId(pub String);

/// The outcome of one command.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct ScsiResponse {
    /// SCSI status.
    pub status: ScsiStatus,
    /// Sense data when `status` is CHECK CONDITION.
    pub sense: Option<Sense>,
    /// Data-In, already truncated to the CDB's allocation length.
    pub data_in: Bytes,
}

impl ScsiResponse {
    /// GOOD with Data-In.
    pub fn good(data_in: Bytes) -> Self {
        Self {
            status: ScsiStatus::GOOD,
            sense: None,
            data_in,
        }
    }
    /// CHECK CONDITION with sense.
    pub fn check(sense: Sense) -> Self {
        Self {
            status: ScsiStatus::CHECK_CONDITION,
            sense: Some(sense),
            data_in: Bytes::new(),
        }
    }
    /// A bare status (RESERVATION CONFLICT, BUSY...).
    pub fn status(status: ScsiStatus) -> Self {
        Self {
            status,
            sense: None,
            data_in: Bytes::new(),
        }
    }
}

/// Truncates Data-In to the allocation length (SPC-4 §4.2.5.6).
pub(crate) fn truncate(mut v: Vec<u8>, alloc: u32) -> Bytes {
    v.truncate(alloc as usize);
    Bytes::from(v)
}
