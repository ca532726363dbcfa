//! Reservations (NVMe Base 2.0 §8.19; the commands §7.2 Reservation Acquire, §7.3 Register,
//! §7.4 Release, §7.5 Report): the controller decodes and checks the commands and leaves them
//! as a [`BlockOp::Reservation`](super::BlockOp::Reservation) block request, because the
//! reservation state is the namespace's store's business, not the controller's: the driver
//! keeps one state per LU for both protocols (`ipsan-target`, docs/nvme.md). The driver also
//! checks every I/O block request against that state. What comes back for a report is the
//! state as a [`ReservationStatus`], which [`ReservationStatus::encode`] lays out.

use bytes::Bytes;
use nvme_wire::Status;

/// Host Identifier Inconsistent Format (NVMe Base 2.0 §4.6.1.2.1, 18h): a Reservation Report
/// without the extended data structure from a host with a 128-bit Host Identifier, which every
/// fabrics host has.
pub(crate) const HOST_ID_INCONSISTENT: Status = Status { sct: 0, sc: 0x18 };

/// Reservation types (NVMe Base 2.0 §8.19.4, Figure "Reservation Type Encoding"): Write
/// Exclusive 1, Exclusive Access 2, Write Exclusive – Registrants Only 3, Exclusive Access –
/// Registrants Only 4, Write Exclusive – All Registrants 5, Exclusive Access – All
/// Registrants 6. The same six as SPC-4's, numbered differently.
pub const RTYPES: std::ops::RangeInclusive<u8> = 1..=6;

/// RESCAP of Identify Namespace (NVM Command Set 1.0 §4.1.5.1, byte 31): the six types (bits
/// 6:1) and IEKEY as NVMe 1.3 defines it (bit 7: Ignore Existing Key in Acquire and Release
/// is an error); Persist Through Power Loss (bit 0) is not supported.
pub(crate) const RESCAP: u8 = 0xfe;

/// What Reservation Register does (RREGA, CDW10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegisterAction {
    /// 000b: register NRKEY.
    Register,
    /// 001b: unregister.
    Unregister,
    /// 010b: replace CRKEY by NRKEY.
    Replace,
}

/// What Reservation Acquire does (RACQA, CDW10 bits 2:0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireAction {
    /// 000b: acquire a reservation.
    Acquire,
    /// 001b: preempt the registrants (and the holder) of PRKEY.
    Preempt,
    /// 010b: preempt and abort their commands. Commands here run to completion, so it is a
    /// preempt.
    PreemptAndAbort,
}

/// A reservation command, decoded and checked, for the namespace of its block request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reservation {
    /// Reservation Register (§7.3): CRKEY and NRKEY from the data; IEKEY skips the CRKEY
    /// check. NRKEY is never 0 for Register and Replace (refused as Invalid Field: the shared
    /// state takes key 0 as "not registered", as SPC-4 does).
    Register {
        action: RegisterAction,
        ignore_key: bool,
        crkey: u64,
        nrkey: u64,
    },
    /// Reservation Acquire (§7.2) of type `rtype` (in [`RTYPES`]).
    Acquire {
        action: AcquireAction,
        rtype: u8,
        crkey: u64,
        prkey: u64,
    },
    /// Reservation Release (§7.4): release the reservation of type `rtype`, or with `clear`
    /// every registration and the reservation.
    Release { clear: bool, rtype: u8, crkey: u64 },
    /// Reservation Report (§7.5), extended data structure (EDS 1) only; the answer is
    /// [`ReservationStatus::encode`]'s, cut to the host's length.
    Report,
}

fn le64(b: &[u8], at: usize) -> u64 {
    let mut v = [0u8; 8];
    if let Some(s) = b.get(at..at + 8) {
        v.copy_from_slice(s);
    }
    u64::from_le_bytes(v)
}

/// Decodes a reservation command's CDW10/CDW11 and data (the caller checked the data's
/// length: 16 bytes for Register and Acquire, 8 for Release).
pub(crate) fn decode(
    opcode: u8,
    cdw10: u32,
    cdw11: u32,
    data: &[u8],
) -> Result<Reservation, Status> {
    let action = cdw10 & 0x7;
    let iekey = cdw10 & (1 << 3) != 0;
    let rtype = ((cdw10 >> 8) & 0xff) as u8;
    match opcode {
        super::io::OP_RESV_REGISTER => {
            let action = match action {
                0 => RegisterAction::Register,
                1 => RegisterAction::Unregister,
                2 => RegisterAction::Replace,
                _ => return Err(Status::INVALID_FIELD),
            };
            // CPTPL (bits 31:30): 00b no change, 10b clear PTPL; 11b (set) is not supported
            // (RESCAP bit 0 clear) and 01b is reserved.
            if matches!(cdw10 >> 30, 1 | 3) {
                return Err(Status::INVALID_FIELD);
            }
            let nrkey = le64(data, 8);
            if nrkey == 0 && action != RegisterAction::Unregister {
                return Err(Status::INVALID_FIELD);
            }
            Ok(Reservation::Register {
                action,
                ignore_key: iekey,
                crkey: le64(data, 0),
                nrkey,
            })
        }
        super::io::OP_RESV_ACQUIRE => {
            let action = match action {
                0 => AcquireAction::Acquire,
                1 => AcquireAction::Preempt,
                2 => AcquireAction::PreemptAndAbort,
                _ => return Err(Status::INVALID_FIELD),
            };
            if iekey || !RTYPES.contains(&rtype) {
                return Err(Status::INVALID_FIELD);
            }
            Ok(Reservation::Acquire {
                action,
                rtype,
                crkey: le64(data, 0),
                prkey: le64(data, 8),
            })
        }
        super::io::OP_RESV_RELEASE => {
            let clear = match action {
                0 => false,
                1 => true,
                _ => return Err(Status::INVALID_FIELD),
            };
            if iekey || !clear && !RTYPES.contains(&rtype) {
                return Err(Status::INVALID_FIELD);
            }
            Ok(Reservation::Release {
                clear,
                rtype,
                crkey: le64(data, 0),
            })
        }
        _ => {
            // Report: EDS (CDW11 bit 0) must be set, a fabrics host's Host Identifier being
            // 128 bits (Linux's nvmet answers the same).
            if cdw11 & 1 == 0 {
                return Err(HOST_ID_INCONSISTENT);
            }
            Ok(Reservation::Report)
        }
    }
}

/// One registrant in a [`ReservationStatus`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Registrant {
    /// The host's 128-bit Host Identifier; zero for a registrant that is not an NVMe host
    /// (an iSCSI I_T nexus registered on the same LU).
    pub hostid: [u8; 16],
    /// Its reservation key.
    pub rkey: u64,
    /// It holds the reservation (RCSTS bit 0).
    pub holds: bool,
}

/// The reservation state a Reservation Report returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReservationStatus {
    /// GEN: bumped by every registration change and preemption.
    pub generation: u32,
    /// RTYPE of the reservation held, 0 for none.
    pub rtype: u8,
    pub registrants: Vec<Registrant>,
}

impl ReservationStatus {
    /// The Reservation Status Extended Data Structure (NVMe Base 2.0 §7.5, Figures
    /// "Reservation Status Extended Data Structure" and "Registrant Extended Data
    /// Structure"): a 64-byte header (GEN, RTYPE, REGCTL, PTPLS 0) and 64 bytes per
    /// registrant (CNTLID FFFFh: the dynamic controller model; RCSTS; RKEY; the 128-bit
    /// HOSTID).
    #[must_use]
    pub fn encode(&self) -> Bytes {
        let n = self.registrants.len().min(usize::from(u16::MAX));
        let mut b = vec![0u8; 64 + 64 * n];
        b[0..4].copy_from_slice(&self.generation.to_le_bytes());
        b[4] = self.rtype;
        b[5..7].copy_from_slice(&(n as u16).to_le_bytes());
        for (i, r) in self.registrants.iter().take(n).enumerate() {
            let e = &mut b[64 + 64 * i..128 + 64 * i];
            e[0..2].copy_from_slice(&0xffffu16.to_le_bytes());
            e[2] = u8::from(r.holds);
            e[8..16].copy_from_slice(&r.rkey.to_le_bytes());
            e[16..32].copy_from_slice(&r.hostid);
        }
        Bytes::from(b)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::io::{
        OP_RESV_ACQUIRE, OP_RESV_REGISTER, OP_RESV_RELEASE, OP_RESV_REPORT,
    };

    fn keys(a: u64, b: u64) -> Vec<u8> {
        let mut d = a.to_le_bytes().to_vec();
        d.extend_from_slice(&b.to_le_bytes());
        d
    }

    #[test]
    fn decodes_register_acquire_release_and_report() {
        assert_eq!(
            decode(OP_RESV_REGISTER, 2 | 1 << 3, 0, &keys(7, 9)),
            Ok(Reservation::Register {
                action: RegisterAction::Replace,
                ignore_key: true,
                crkey: 7,
                nrkey: 9
            })
        );
        assert_eq!(
            decode(OP_RESV_ACQUIRE, 1 | 5 << 8, 0, &keys(7, 9)),
            Ok(Reservation::Acquire {
                action: AcquireAction::Preempt,
                rtype: 5,
                crkey: 7,
                prkey: 9
            })
        );
        assert_eq!(
            decode(OP_RESV_RELEASE, 2 << 8, 0, &7u64.to_le_bytes()),
            Ok(Reservation::Release {
                clear: false,
                rtype: 2,
                crkey: 7
            })
        );
        assert_eq!(decode(OP_RESV_REPORT, 0, 1, &[]), Ok(Reservation::Report));
    }

    #[test]
    fn rejects_what_the_shared_state_cannot_take() {
        // Key 0, PTPL set, an unknown action, a type out of range, IEKEY on acquire and
        // release (NVMe 1.3: an error), a report without the extended structure.
        assert_eq!(
            decode(OP_RESV_REGISTER, 0, 0, &keys(0, 0)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            decode(OP_RESV_REGISTER, 3 << 30, 0, &keys(0, 1)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            decode(OP_RESV_REGISTER, 3, 0, &keys(0, 1)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            decode(OP_RESV_ACQUIRE, 7 << 8, 0, &keys(1, 0)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            decode(OP_RESV_ACQUIRE, 1 << 3 | 1 << 8, 0, &keys(1, 0)),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(
            decode(OP_RESV_RELEASE, 1 << 3 | 1 << 8, 0, &1u64.to_le_bytes()),
            Err(Status::INVALID_FIELD)
        );
        assert_eq!(decode(OP_RESV_REPORT, 0, 0, &[]), Err(HOST_ID_INCONSISTENT));
        // Clear ignores the type.
        assert!(decode(OP_RESV_RELEASE, 1, 0, &1u64.to_le_bytes()).is_ok());
    }

    #[test]
    fn encodes_the_extended_status_at_the_specified_offsets() {
        let s = ReservationStatus {
            generation: 3,
            rtype: 1,
            registrants: vec![
                Registrant {
                    hostid: [0xab; 16],
                    rkey: 0x1122,
                    holds: true,
                },
                Registrant {
                    hostid: [0; 16],
                    rkey: 5,
                    holds: false,
                },
            ],
        };
        let b = s.encode();
        assert_eq!(b.len(), 64 + 2 * 64);
        assert_eq!(&b[0..4], &3u32.to_le_bytes());
        assert_eq!(b[4], 1);
        assert_eq!(&b[5..7], &2u16.to_le_bytes());
        assert_eq!(&b[64..66], &[0xff, 0xff]);
        assert_eq!(b[66], 1);
        assert_eq!(&b[72..80], &0x1122u64.to_le_bytes());
        assert_eq!(&b[80..96], &[0xab; 16]);
        assert_eq!(b[128 + 2], 0);
        assert_eq!(&b[128 + 8..128 + 16], &5u64.to_le_bytes());
    }
}
