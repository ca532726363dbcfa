//! Reservations over NVMe on the SCSI LU's own reservation state (issue 30, docs/nvme.md
//! "Reservations"): one state per LU whichever protocol changes it, in memory or in the
//! backend's `SharedRecord` (`ipsan_scsi::pr`), so an NVMe host's Reservation Acquire and an
//! iSCSI initiator's PERSISTENT RESERVE OUT conflict with each other.
//!
//! An NVMe host is a registrant under its Host Identifier and host NQN (NVMe Base 2.0 §8.19:
//! a host, whichever controller it uses), as the I_T nexus `"<hostnqn>,h,0x<hostid>"` of
//! relative target port 0, which no SCSI target port has. The NVMe commands map onto SPC-4's
//! service actions and run through the same rules ([`pr::out_action`]); the six reservation
//! types are the same, numbered differently ([`spc_kind`]).

use bytes::Bytes;
use ipsan_scsi::pr::{self, ItNexus, PrState};
use ipsan_scsi::response::{NexusId, ScsiResponse};
use ipsan_scsi::{LogicalUnit, ScsiStatus, Sense, SenseKey};
use nvme_proto::controller::{
    AcquireAction, BlockError, RegisterAction, Registrant, Reservation, ReservationStatus,
};
use tracing::warn;

/// The relative target port of NVMe hosts' registrations: 0 is reserved in SCSI (SPC-4
/// §7.8.6.8: relative port identifiers start at 1), so SCSI unit attentions are never queued
/// for them and REPORT FULL STATUS shows them apart.
pub(crate) const NVME_PORT: u16 = 0;

/// Marks the Host Identifier in an NVMe host's nexus name.
const HOSTID_TAG: &str = ",h,0x";

/// The reservation identity of the host with `hostnqn` and `hostid`. The NQN's blanks and
/// control characters become `_` (the shared state is text, one registration a line).
pub(crate) fn nexus(hostnqn: &str, hostid: &[u8; 16]) -> ItNexus {
    let mut id: String = hostnqn
        .chars()
        .map(|c| {
            if c.is_whitespace() || c.is_control() {
                '_'
            } else {
                c
            }
        })
        .collect();
    id.push_str(HOSTID_TAG);
    for b in hostid {
        id.push_str(&format!("{b:02x}"));
    }
    ItNexus {
        initiator: NexusId(id),
        port: NVME_PORT,
    }
}

/// The host NQN and Host Identifier of an NVMe host's nexus ([`nexus`]); `None` for an iSCSI
/// one.
pub(crate) fn host_of(n: &ItNexus) -> Option<(String, [u8; 16])> {
    if n.port != NVME_PORT {
        return None;
    }
    let (nqn, _) = n.initiator.0.rsplit_once(HOSTID_TAG)?;
    Some((nqn.to_owned(), hostid_of(n)))
}

/// The reservation notification (NVMe Base 2.0 §8.19) of a unit attention SPC-4 queues for a
/// registrant: RESERVATIONS PREEMPTED (2Ah/03h), RESERVATIONS RELEASED (2Ah/04h),
/// REGISTRATIONS PREEMPTED (2Ah/05h).
pub(crate) fn notice_of(asc: u8, ascq: u8) -> Option<nvme_proto::controller::ReservationNotice> {
    use nvme_proto::controller::ReservationNotice as N;
    match (asc, ascq) {
        (0x2A, 0x03) => Some(N::ReservationPreempted),
        (0x2A, 0x04) => Some(N::ReservationReleased),
        (0x2A, 0x05) => Some(N::RegistrationPreempted),
        _ => None,
    }
}

/// The Host Identifier of an NVMe host's nexus; zero for an iSCSI one.
fn hostid_of(n: &ItNexus) -> [u8; 16] {
    let mut id = [0u8; 16];
    if n.port != NVME_PORT {
        return id;
    }
    let Some((_, hex)) = n.initiator.0.rsplit_once(HOSTID_TAG) else {
        return id;
    };
    if hex.len() != 32 {
        return id;
    }
    for (i, b) in id.iter_mut().enumerate() {
        match hex.get(2 * i..2 * i + 2).map(|h| u8::from_str_radix(h, 16)) {
            Some(Ok(v)) => *b = v,
            _ => return [0; 16],
        }
    }
    id
}

/// SPC-4's reservation type (table 185) of an NVMe one (NVMe Base 2.0 §8.19.4): WE, EA,
/// WE-RO, EA-RO, WE-AR, EA-AR are 1..=6 in NVMe and 1, 3, 5, 6, 7, 8 in SPC-4.
fn spc_kind(rtype: u8) -> u8 {
    match rtype {
        1 => pr::kind::WE,
        2 => pr::kind::EA,
        3 => pr::kind::WE_RO,
        4 => pr::kind::EA_RO,
        5 => pr::kind::WE_AR,
        6 => pr::kind::EA_AR,
        _ => 0,
    }
}

/// NVMe's reservation type of an SPC-4 one.
fn nvme_kind(kind: u8) -> u8 {
    match kind {
        pr::kind::WE => 1,
        pr::kind::EA => 2,
        pr::kind::WE_RO => 3,
        pr::kind::EA_RO => 4,
        pr::kind::WE_AR => 5,
        pr::kind::EA_AR => 6,
        _ => 0,
    }
}

/// PERSISTENT RESERVE OUT service actions (SPC-4 §6.16.2).
mod sa {
    pub(super) const RESERVE: u8 = 1;
    pub(super) const RELEASE: u8 = 2;
    pub(super) const CLEAR: u8 = 3;
    pub(super) const PREEMPT: u8 = 4;
    pub(super) const REGISTER_AND_IGNORE: u8 = 6;
}

/// The access check of one block request from `who` on the LU's namespace: a read (Read,
/// Compare) or a write (Write, Write Zeroes, Dataset Management, Flush), as the NVMe
/// reservation types and SPC-4 table 68 say alike.
pub(crate) fn check(lu: &LogicalUnit, who: &ItNexus, write: bool) -> Result<(), BlockError> {
    match lu.reservations() {
        Ok(st) if st.is_empty() || st.allows_io(who, write) => Ok(()),
        Ok(_) => Err(BlockError::ReservationConflict),
        Err(e) => {
            warn!(serial = %lu.config().serial, "reservation state: {e}");
            Err(BlockError::Internal)
        }
    }
}

/// The reservation state as a Reservation Report shows it.
fn report(st: &PrState) -> ReservationStatus {
    ReservationStatus {
        generation: st.generation(),
        rtype: st.reservation_kind().map_or(0, nvme_kind),
        registrants: st
            .registrations()
            .map(|(n, rkey)| Registrant {
                hostid: hostid_of(n),
                rkey,
                holds: st.holds(n),
            })
            .collect(),
    }
}

fn good() -> Result<ScsiResponse, Sense> {
    Ok(ScsiResponse::good(Bytes::new()))
}

fn conflict() -> Result<ScsiResponse, Sense> {
    Ok(ScsiResponse::status(ScsiStatus::RESERVATION_CONFLICT))
}

/// One NVMe reservation command on the state: Register's rules (NVMe Base 2.0 §7.3: a host
/// registers once, registering the key it holds again changes nothing, unregister and replace
/// need the current key unless IEKEY) in front of SPC-4's REGISTER AND IGNORE EXISTING KEY;
/// Acquire as RESERVE or PREEMPT; Release as RELEASE or CLEAR.
fn apply(
    st: &mut PrState,
    uas: &mut Vec<pr::PendingUa>,
    who: &ItNexus,
    r: Reservation,
) -> Result<ScsiResponse, Sense> {
    match r {
        Reservation::Register {
            action,
            ignore_key,
            crkey,
            nrkey,
        } => {
            let mine = st.registration(who);
            let key_ok = |k: u64| ignore_key || k == crkey;
            match (action, mine) {
                (RegisterAction::Register, None) => {
                    pr::out_action(st, uas, who, sa::REGISTER_AND_IGNORE, 0, 0, nrkey)
                }
                (RegisterAction::Register, Some(k)) if k == nrkey => good(),
                (RegisterAction::Unregister, Some(k)) if key_ok(k) => {
                    pr::out_action(st, uas, who, sa::REGISTER_AND_IGNORE, 0, 0, 0)
                }
                (RegisterAction::Replace, Some(k)) if key_ok(k) => {
                    pr::out_action(st, uas, who, sa::REGISTER_AND_IGNORE, 0, 0, nrkey)
                }
                _ => conflict(),
            }
        }
        Reservation::Acquire {
            action,
            rtype,
            crkey,
            prkey,
        } => match action {
            AcquireAction::Acquire => {
                pr::out_action(st, uas, who, sa::RESERVE, spc_kind(rtype), crkey, 0)
            }
            // Commands run to completion here: Preempt and Abort aborts nothing.
            AcquireAction::Preempt | AcquireAction::PreemptAndAbort => {
                pr::out_action(st, uas, who, sa::PREEMPT, spc_kind(rtype), crkey, prkey)
            }
        },
        Reservation::Release {
            clear: true, crkey, ..
        } => pr::out_action(st, uas, who, sa::CLEAR, 0, crkey, 0),
        Reservation::Release {
            clear: false,
            rtype,
            crkey,
        } => pr::out_action(st, uas, who, sa::RELEASE, spc_kind(rtype), crkey, 0),
        Reservation::Report => good(),
    }
}

/// Runs one reservation command from `who` on `lu`'s state (may block on a shared store):
/// a report's bytes, or nothing.
pub(crate) fn run(lu: &LogicalUnit, who: &ItNexus, r: Reservation) -> Result<Bytes, BlockError> {
    let store_err = |e: std::io::Error| {
        warn!(serial = %lu.config().serial, "reservation state: {e}");
        BlockError::Internal
    };
    if r == Reservation::Report {
        let st = lu.reservations_stored().map_err(store_err)?;
        return Ok(report(&st).encode());
    }
    match lu.update_reservations(|st, uas| apply(st, uas, who, r)) {
        Ok(resp) if resp.status == ScsiStatus::GOOD => Ok(Bytes::new()),
        Ok(resp) if resp.status == ScsiStatus::RESERVATION_CONFLICT => {
            Err(BlockError::ReservationConflict)
        }
        Ok(_) => Err(BlockError::Internal),
        Err(s) if s.key == SenseKey::ILLEGAL_REQUEST => Err(BlockError::InvalidField),
        Err(s) => {
            warn!(serial = %lu.config().serial, "reservation state: {s}");
            Err(BlockError::Internal)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_the_six_reservation_types_both_ways() {
        for rtype in 1..=6 {
            assert_eq!(nvme_kind(spc_kind(rtype)), rtype);
        }
        assert_eq!(spc_kind(2), pr::kind::EA);
        assert_eq!(spc_kind(0), 0);
    }

    #[test]
    fn names_a_host_by_nqn_and_host_identifier_and_reads_the_identifier_back() {
        let id = [0x5a; 16];
        let n = nexus("nqn.2014-08.org.nvmexpress:uuid:x y\n", &id);
        assert_eq!(n.port, NVME_PORT);
        assert!(!n.initiator.0.contains(char::is_whitespace));
        assert_eq!(hostid_of(&n), id);
        assert_ne!(n, nexus("nqn.2014-08.org.nvmexpress:uuid:x y\n", &[0; 16]));
        let iscsi = ItNexus {
            initiator: NexusId("iqn.a,i,0x000000000001".into()),
            port: 1,
        };
        assert_eq!(hostid_of(&iscsi), [0; 16]);
    }
}
