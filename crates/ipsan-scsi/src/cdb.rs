//! CDB decoding (SPC-4 §4.2, SBC-4 §5): bytes in, a typed [`Command`] out, or the sense data
//! that rejects the CDB. No I/O and no LU state here; range checks against the capacity and
//! the block limits happen in `lu.rs`.

use crate::sense::Sense;

pub mod build;

/// Operation codes this crate knows (SPC-4 Annex D, SBC-4 table 14).
#[allow(missing_docs)]
pub mod op {
    pub const TEST_UNIT_READY: u8 = 0x00;
    pub const REQUEST_SENSE: u8 = 0x03;
    pub const READ_6: u8 = 0x08;
    pub const WRITE_6: u8 = 0x0A;
    pub const INQUIRY: u8 = 0x12;
    pub const MODE_SELECT_6: u8 = 0x15;
    pub const RESERVE_6: u8 = 0x16;
    pub const RELEASE_6: u8 = 0x17;
    pub const MODE_SENSE_6: u8 = 0x1A;
    pub const START_STOP_UNIT: u8 = 0x1B;
    pub const PREVENT_ALLOW_MEDIUM_REMOVAL: u8 = 0x1E;
    pub const READ_CAPACITY_10: u8 = 0x25;
    pub const READ_10: u8 = 0x28;
    pub const WRITE_10: u8 = 0x2A;
    pub const WRITE_AND_VERIFY_10: u8 = 0x2E;
    pub const VERIFY_10: u8 = 0x2F;
    pub const PRE_FETCH_10: u8 = 0x34;
    pub const SYNCHRONIZE_CACHE_10: u8 = 0x35;
    pub const READ_DEFECT_DATA_10: u8 = 0x37;
    pub const WRITE_SAME_10: u8 = 0x41;
    pub const UNMAP: u8 = 0x42;
    pub const MODE_SELECT_10: u8 = 0x55;
    pub const MODE_SENSE_10: u8 = 0x5A;
    pub const PERSISTENT_RESERVE_IN: u8 = 0x5E;
    pub const PERSISTENT_RESERVE_OUT: u8 = 0x5F;
    pub const READ_16: u8 = 0x88;
    pub const COMPARE_AND_WRITE: u8 = 0x89;
    pub const ORWRITE_16: u8 = 0x8B;
    pub const WRITE_16: u8 = 0x8A;
    pub const WRITE_AND_VERIFY_16: u8 = 0x8E;
    pub const VERIFY_16: u8 = 0x8F;
    pub const PRE_FETCH_16: u8 = 0x90;
    pub const SYNCHRONIZE_CACHE_16: u8 = 0x91;
    pub const WRITE_SAME_16: u8 = 0x93;
    pub const SERVICE_ACTION_IN_16: u8 = 0x9E;
    pub const REPORT_LUNS: u8 = 0xA0;
    pub const MAINTENANCE_IN: u8 = 0xA3;
    pub const READ_12: u8 = 0xA8;
    pub const WRITE_12: u8 = 0xAA;
    pub const WRITE_AND_VERIFY_12: u8 = 0xAE;
    pub const VERIFY_12: u8 = 0xAF;
    pub const READ_DEFECT_DATA_12: u8 = 0xB7;

    /// SERVICE ACTION IN(16) service actions.
    pub const SA_READ_CAPACITY_16: u8 = 0x10;
    pub const SA_GET_LBA_STATUS: u8 = 0x12;
    /// MAINTENANCE IN service action.
    pub const SA_REPORT_SUPPORTED_OPCODES: u8 = 0x0C;
}

/// Direction of a command's data transfer, seen from the initiator.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum DataDirection {
    /// No data.
    None,
    /// Data-In: target to initiator.
    Read,
    /// Data-Out: initiator to target.
    Write,
}

/// The typed command: a CDB parsed once ([`decode`]) with everything the layers above ask
/// of it: the iSCSI layer (direction, transfer lengths before the data arrives), Seal (the
/// extent it binds), session recovery (idempotency), metrics (the kind and name), and the LU
/// (the decoded [`Command`], so nothing parses again).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct CommandInfo {
    /// The decoded command.
    pub command: Command,
    /// Operation code (CDB byte 0).
    pub opcode: u8,
    /// Service action, for the opcodes that carry one (SERVICE ACTION IN(16), MAINTENANCE
    /// IN, PERSISTENT RESERVE IN/OUT).
    pub service_action: Option<u8>,
    /// Transfer direction.
    pub direction: DataDirection,
    /// Bytes the CDB wants from the initiator (0 unless `direction` is `Write`).
    pub data_out_len: u64,
    /// Bytes the CDB may return at most: the blocks of a READ, or the allocation length
    /// (0 unless `direction` is `Read`).
    pub data_in_len: u64,
    /// The block extent the CDB addresses as `(lba, blocks)` ([`extent`]: `(0, 0)` for a
    /// command that is not a [`Family::is_media_access`]).
    pub extent: (u64, u32),
    /// Immediate: the command may complete before the operation does (SYNCHRONIZE CACHE,
    /// PRE-FETCH, START STOP UNIT).
    pub immed: bool,
    /// Force unit access.
    pub fua: bool,
    /// Disable page out.
    pub dpo: bool,
    /// What the opcode table says of the opcode.
    pub op: &'static OpEntry,
}

impl CommandInfo {
    /// Whether the command may be sent again after a session recovery ([`OpEntry::idempotent`]).
    #[must_use]
    pub fn idempotent(&self) -> bool {
        self.op.idempotent
    }

    /// The opcode's family ([`Family`]).
    #[must_use]
    pub fn family(&self) -> Family {
        self.op.family
    }

    /// The command's name, e.g. `"WRITE(16)"`.
    #[must_use]
    pub fn name(&self) -> &'static str {
        self.op.name
    }

    /// Whether it reads or writes blocks of the medium with data ([`Family::is_media_access`]).
    #[must_use]
    pub fn is_media_access(&self) -> bool {
        self.op.family.is_media_access()
    }
}

mod table;

pub use table::{entry, extent, family, is_idempotent, Family, Field, OpEntry, OPS};

/// Parses `cdb` once into the typed command, with transfer lengths counted in blocks of
/// `block_size` bytes.
pub fn decode(cdb: &[u8], block_size: u32) -> Result<CommandInfo, Sense> {
    let command = parse(cdb)?;
    let opcode = cdb.first().copied().unwrap_or(0);
    let Some(op) = entry(opcode) else {
        return Err(Sense::invalid_opcode());
    };
    let bs = u64::from(block_size);
    let (direction, data_out_len, data_in_len) = command.transfer(bs);
    let service_action = match opcode {
        op::SERVICE_ACTION_IN_16
        | op::MAINTENANCE_IN
        | op::PERSISTENT_RESERVE_IN
        | op::PERSISTENT_RESERVE_OUT => Some(cdb[1] & 0x1F),
        _ => None,
    };
    let (fua, dpo) = command
        .block_io()
        .map_or((false, false), |io| (io.fua, io.dpo));
    let immed = matches!(
        command,
        Command::SynchronizeCache { immed: true, .. }
            | Command::PreFetch { immed: true, .. }
            | Command::StartStopUnit { immed: true, .. }
    );
    Ok(CommandInfo {
        command,
        opcode,
        service_action,
        direction,
        data_out_len,
        data_in_len,
        extent: extent(cdb),
        immed,
        fua,
        dpo,
        op,
    })
}

/// Fields shared by the block I/O commands (READ/WRITE/VERIFY/WRITE AND VERIFY/CAW).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct BlockIo {
    /// First logical block.
    pub lba: u64,
    /// Number of logical blocks.
    pub blocks: u32,
    /// Force unit access: the data reaches stable storage before GOOD.
    pub fua: bool,
    /// Disable page out (a cache hint; ignored).
    pub dpo: bool,
}

/// PERSISTENT RESERVE OUT fields (SPC-4 §6.16).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct PrOut {
    /// Service action.
    pub sa: u8,
    /// Scope (must be LU_SCOPE, 0).
    pub scope: u8,
    /// Reservation type.
    pub kind: u8,
    /// Parameter list length.
    pub param_len: u32,
}

/// A decoded CDB.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
#[non_exhaustive]
pub enum Command {
    /// TEST UNIT READY (SPC-4 §6.47).
    TestUnitReady,
    /// REQUEST SENSE (SPC-4 §6.39).
    RequestSense {
        /// Descriptor format requested.
        desc: bool,
        /// Allocation length.
        alloc: u32,
    },
    /// INQUIRY (SPC-4 §6.6).
    Inquiry {
        /// Vital product data requested.
        evpd: bool,
        /// VPD page code.
        page: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// MODE SENSE(6/10) (SPC-4 §6.11, §6.12).
    ModeSense {
        /// The 10-byte form.
        ten: bool,
        /// Disable block descriptors.
        dbd: bool,
        /// Long LBA block descriptors (10-byte form only).
        llbaa: bool,
        /// Page control: 0 current, 1 changeable, 2 default, 3 saved.
        pc: u8,
        /// Page code (3Fh: all).
        page: u8,
        /// Subpage code.
        subpage: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// MODE SELECT(6/10) (SPC-4 §6.9, §6.10).
    ModeSelect {
        /// The 10-byte form.
        ten: bool,
        /// Page format.
        pf: bool,
        /// Save pages.
        sp: bool,
        /// Parameter list length.
        param_len: u32,
    },
    /// READ(6/10/12/16) (SBC-4 §5.13ff).
    Read(BlockIo),
    /// WRITE(6/10/12/16) (SBC-4 §5.35ff).
    Write(BlockIo),
    /// VERIFY(10/12/16) (SBC-4 §5.29ff).
    Verify {
        /// Range.
        io: BlockIo,
        /// 0: medium check only; 1: compare blocks; 3: compare one block against all.
        bytchk: u8,
    },
    /// WRITE AND VERIFY(10/12/16) (SBC-4 §5.40ff).
    WriteAndVerify {
        /// Range.
        io: BlockIo,
        /// 0: verify medium; 1: also compare.
        bytchk: u8,
    },
    /// WRITE SAME(10/16) (SBC-4 §5.43, §5.44).
    WriteSame {
        /// Range (`blocks` 0 means "to the end", bounded by the block limits).
        io: BlockIo,
        /// Deallocate instead of writing.
        unmap: bool,
        /// Anchor (unsupported, rejected).
        anchor: bool,
        /// PBDATA or LBDATA (byte 1 bits 2..1; unsupported, rejected, SBC-3 §5.42).
        lbdata: bool,
        /// No data-out buffer: the block is zeros (16-byte form only).
        ndob: bool,
    },
    /// UNMAP (SBC-4 §5.28).
    Unmap {
        /// Anchor (unsupported, rejected).
        anchor: bool,
        /// Parameter list length.
        param_len: u32,
    },
    /// COMPARE AND WRITE (SBC-4 §5.3).
    CompareAndWrite(BlockIo),
    /// ORWRITE(16) (SBC-4 §5.9): new block = old block OR data.
    OrWrite(BlockIo),
    /// SYNCHRONIZE CACHE(10/16) (SBC-4 §5.26, §5.27).
    SynchronizeCache {
        /// First block (0 with `blocks` 0: everything).
        lba: u64,
        /// Number of blocks, 0 = to the end.
        blocks: u32,
        /// Return before the flush completes.
        immed: bool,
    },
    /// PRE-FETCH(10/16) (SBC-4 §5.10, §5.11).
    PreFetch {
        /// First block.
        lba: u64,
        /// Number of blocks, 0 = to the end.
        blocks: u32,
        /// Return immediately.
        immed: bool,
    },
    /// READ CAPACITY(10) (SBC-4 §5.15).
    ReadCapacity10,
    /// READ CAPACITY(16) (SBC-4 §5.16).
    ReadCapacity16 {
        /// Allocation length.
        alloc: u32,
    },
    /// GET LBA STATUS (SBC-4 §5.7).
    GetLbaStatus {
        /// Starting LBA.
        lba: u64,
        /// Allocation length.
        alloc: u32,
    },
    /// START STOP UNIT (SBC-4 §5.25).
    StartStopUnit {
        /// Return before completion.
        immed: bool,
        /// Power condition field.
        power_condition: u8,
        /// Load/eject.
        loej: bool,
        /// Start (1) or stop (0).
        start: bool,
        /// Do not flush the cache when stopping.
        no_flush: bool,
    },
    /// PREVENT ALLOW MEDIUM REMOVAL (SBC-4 §5.12).
    PreventAllow {
        /// Prevent field (0 allow, 1 prevent).
        prevent: u8,
    },
    /// READ DEFECT DATA(10/12) (SBC-4 §5.20, §5.21).
    ReadDefectData {
        /// The 12-byte form.
        twelve: bool,
        /// Primary list requested.
        plist: bool,
        /// Grown list requested.
        glist: bool,
        /// Defect list format.
        format: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT LUNS (SPC-4 §6.33).
    ReportLuns {
        /// SELECT REPORT.
        select: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35).
    ReportSupportedOpcodes {
        /// Return command timeouts descriptor.
        rctd: bool,
        /// Reporting options (0 all, 1 opcode, 2 opcode+SA, 3 either).
        options: u8,
        /// Requested operation code.
        opcode: u8,
        /// Requested service action.
        sa: u16,
        /// Allocation length.
        alloc: u32,
    },
    /// RESERVE(6) (SPC-2 §7.21).
    Reserve6,
    /// RELEASE(6) (SPC-2 §7.17).
    Release6,
    /// PERSISTENT RESERVE IN (SPC-4 §6.15).
    PersistentReserveIn {
        /// Service action.
        sa: u8,
        /// Allocation length.
        alloc: u32,
    },
    /// PERSISTENT RESERVE OUT (SPC-4 §6.16).
    PersistentReserveOut(PrOut),
}

impl Command {
    /// The block range of READ, WRITE, VERIFY, WRITE AND VERIFY, WRITE SAME, COMPARE AND
    /// WRITE and ORWRITE.
    #[must_use]
    pub fn block_io(&self) -> Option<BlockIo> {
        match *self {
            Command::Read(io)
            | Command::Write(io)
            | Command::CompareAndWrite(io)
            | Command::OrWrite(io)
            | Command::Verify { io, .. }
            | Command::WriteAndVerify { io, .. }
            | Command::WriteSame { io, .. } => Some(io),
            _ => None,
        }
    }

    /// Direction, Data-Out bytes and the most Data-In bytes, with blocks of `bs` bytes.
    fn transfer(&self, bs: u64) -> (DataDirection, u64, u64) {
        let write = |n: u64| {
            let d = if n == 0 {
                DataDirection::None
            } else {
                DataDirection::Write
            };
            (d, n, 0)
        };
        let read = |n: u64| (DataDirection::Read, 0, n);
        let none = (DataDirection::None, 0, 0);
        match *self {
            Command::Write(io) | Command::OrWrite(io) => write(u64::from(io.blocks) * bs),
            Command::WriteAndVerify { io, .. } => write(u64::from(io.blocks) * bs),
            Command::Verify { io, bytchk } => match bytchk {
                1 => write(u64::from(io.blocks) * bs),
                3 if io.blocks > 0 => write(bs),
                _ => none,
            },
            Command::WriteSame { ndob, .. } => write(if ndob { 0 } else { bs }),
            Command::CompareAndWrite(io) => write(2 * u64::from(io.blocks) * bs),
            Command::Unmap { param_len, .. } | Command::ModeSelect { param_len, .. } => {
                write(u64::from(param_len))
            }
            Command::PersistentReserveOut(p) => write(u64::from(p.param_len)),
            Command::TestUnitReady
            | Command::SynchronizeCache { .. }
            | Command::PreFetch { .. }
            | Command::StartStopUnit { .. }
            | Command::PreventAllow { .. }
            | Command::Reserve6
            | Command::Release6 => none,
            Command::Read(io) => read(u64::from(io.blocks) * bs),
            Command::ReadCapacity10 => read(8),
            Command::RequestSense { alloc, .. }
            | Command::Inquiry { alloc, .. }
            | Command::ModeSense { alloc, .. }
            | Command::ReadCapacity16 { alloc }
            | Command::GetLbaStatus { alloc, .. }
            | Command::ReadDefectData { alloc, .. }
            | Command::ReportLuns { alloc, .. }
            | Command::ReportSupportedOpcodes { alloc, .. }
            | Command::PersistentReserveIn { alloc, .. } => read(u64::from(alloc)),
        }
    }

    /// Whether it changes the medium (refused on a read-only LU, SBC-4 §4.11).
    #[must_use]
    pub fn writes_medium(&self) -> bool {
        matches!(
            self,
            Command::Write(_)
                | Command::WriteAndVerify { .. }
                | Command::WriteSame { .. }
                | Command::Unmap { .. }
                | Command::CompareAndWrite(_)
                | Command::OrWrite(_)
        )
    }
}

fn be16(b: &[u8]) -> u32 {
    u32::from(u16::from_be_bytes([b[0], b[1]]))
}
fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes([b[0], b[1], b[2], b[3]])
}
fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

/// The operation code of `cdb` (its first byte, SPC-4 §4.2.5.1), for a command that is not
/// decoded here (a remote LU's, forwarded as it came); `None` for an empty CDB.
pub fn opcode(cdb: &[u8]) -> Option<u8> {
    cdb.first().copied()
}

/// Whether `cdb` is REPORT LUNS (SPC-4 §6.33), which a target answers for all its LUNs.
pub fn is_report_luns(cdb: &[u8]) -> bool {
    opcode(cdb) == Some(op::REPORT_LUNS)
}

/// CDB length implied by the group code in the top 3 bits of the opcode (SPC-4 §4.2.5.1).
pub fn cdb_len(opcode: u8) -> Option<usize> {
    match opcode >> 5 {
        0 => Some(6),
        1 | 2 => Some(10),
        4 => Some(16),
        5 => Some(12),
        _ => None,
    }
}

/// Rejects a nonzero protection field (RDPROTECT/WRPROTECT/VRPROTECT, byte 1 bits 7..5):
/// this LU has no protection information (SBC-4 §4.22).
fn no_protect(cdb: &[u8]) -> Result<(), Sense> {
    if cdb[1] & 0xE0 != 0 {
        Err(Sense::invalid_field_in_cdb_at(1, Some(7)))
    } else {
        Ok(())
    }
}

/// Decodes a CDB. `cdb` may carry padding past the command's length (iSCSI always sends 16
/// bytes); a CDB shorter than its opcode requires is rejected.
pub fn parse(cdb: &[u8]) -> Result<Command, Sense> {
    let Some(&opcode) = cdb.first() else {
        return Err(Sense::invalid_opcode());
    };
    let need = cdb_len(opcode).ok_or_else(Sense::invalid_opcode)?;
    if cdb.len() < need {
        return Err(Sense::invalid_field_in_cdb_at(0, None));
    }
    // CONTROL byte: NACA (bit 2) is not supported (SAM-5 §5.10); LINK (bit 0) is obsolete.
    if cdb[need - 1] & 0x05 != 0 {
        return Err(Sense::invalid_field_in_cdb_at(need as u16 - 1, Some(2)));
    }
    let rw10 = |c: &[u8]| BlockIo {
        lba: u64::from(be32(&c[2..6])),
        blocks: be16(&c[7..9]),
        fua: c[1] & 0x08 != 0,
        dpo: c[1] & 0x10 != 0,
    };
    let rw12 = |c: &[u8]| BlockIo {
        lba: u64::from(be32(&c[2..6])),
        blocks: be32(&c[6..10]),
        fua: c[1] & 0x08 != 0,
        dpo: c[1] & 0x10 != 0,
    };
    let rw16 = |c: &[u8]| BlockIo {
        lba: be64(&c[2..10]),
        blocks: be32(&c[10..14]),
        fua: c[1] & 0x08 != 0,
        dpo: c[1] & 0x10 != 0,
    };
    use op::*;
    let cmd = match opcode {
        TEST_UNIT_READY => Command::TestUnitReady,
        REQUEST_SENSE => Command::RequestSense {
            desc: cdb[1] & 0x01 != 0,
            alloc: u32::from(cdb[4]),
        },
        READ_6 | WRITE_6 => {
            let blocks = match cdb[4] {
                0 => 256,
                n => u32::from(n),
            };
            let io = BlockIo {
                lba: u64::from(cdb[1] & 0x1F) << 16 | u64::from(cdb[2]) << 8 | u64::from(cdb[3]),
                blocks,
                fua: false,
                dpo: false,
            };
            if opcode == READ_6 {
                Command::Read(io)
            } else {
                Command::Write(io)
            }
        }
        INQUIRY => {
            let evpd = cdb[1] & 0x01 != 0;
            if cdb[1] & 0x02 != 0 {
                // CMDDT is obsolete (SPC-4 §6.6.1).
                return Err(Sense::invalid_field_in_cdb_at(1, Some(1)));
            }
            if !evpd && cdb[2] != 0 {
                return Err(Sense::invalid_field_in_cdb_at(2, Some(7)));
            }
            Command::Inquiry {
                evpd,
                page: cdb[2],
                alloc: be16(&cdb[3..5]),
            }
        }
        MODE_SENSE_6 | MODE_SENSE_10 => {
            let ten = opcode == MODE_SENSE_10;
            Command::ModeSense {
                ten,
                dbd: cdb[1] & 0x08 != 0,
                llbaa: ten && cdb[1] & 0x10 != 0,
                pc: cdb[2] >> 6,
                page: cdb[2] & 0x3F,
                subpage: cdb[3],
                alloc: if ten {
                    be16(&cdb[7..9])
                } else {
                    u32::from(cdb[4])
                },
            }
        }
        MODE_SELECT_6 | MODE_SELECT_10 => {
            let ten = opcode == MODE_SELECT_10;
            Command::ModeSelect {
                ten,
                pf: cdb[1] & 0x10 != 0,
                sp: cdb[1] & 0x01 != 0,
                param_len: if ten {
                    be16(&cdb[7..9])
                } else {
                    u32::from(cdb[4])
                },
            }
        }
        READ_10 | READ_12 | READ_16 | WRITE_10 | WRITE_12 | WRITE_16 => {
            no_protect(cdb)?;
            let io = match opcode {
                READ_10 | WRITE_10 => rw10(cdb),
                READ_12 | WRITE_12 => rw12(cdb),
                _ => rw16(cdb),
            };
            if matches!(opcode, READ_10 | READ_12 | READ_16) {
                Command::Read(io)
            } else {
                Command::Write(io)
            }
        }
        VERIFY_10 | VERIFY_12 | VERIFY_16 | WRITE_AND_VERIFY_10 | WRITE_AND_VERIFY_12
        | WRITE_AND_VERIFY_16 => {
            no_protect(cdb)?;
            let mut io = match opcode {
                VERIFY_10 | WRITE_AND_VERIFY_10 => rw10(cdb),
                VERIFY_12 | WRITE_AND_VERIFY_12 => rw12(cdb),
                _ => rw16(cdb),
            };
            // Bit 3 is reserved in VERIFY/WRITE AND VERIFY (no FUA): verification itself
            // reads the medium.
            io.fua = false;
            let bytchk = (cdb[1] >> 1) & 0x03;
            let verify = matches!(opcode, VERIFY_10 | VERIFY_12 | VERIFY_16);
            // BYTCHK 10b is reserved; WRITE AND VERIFY also reserves 11b (SBC-4 table 59).
            if bytchk == 2 || (!verify && bytchk == 3) {
                return Err(Sense::invalid_field_in_cdb_at(1, Some(2)));
            }
            if verify {
                Command::Verify { io, bytchk }
            } else {
                Command::WriteAndVerify { io, bytchk }
            }
        }
        WRITE_SAME_10 | WRITE_SAME_16 => {
            no_protect(cdb)?;
            let mut io = if opcode == WRITE_SAME_10 {
                rw10(cdb)
            } else {
                rw16(cdb)
            };
            io.fua = false;
            let ndob = opcode == WRITE_SAME_16 && cdb[1] & 0x01 != 0;
            Command::WriteSame {
                io,
                unmap: cdb[1] & 0x08 != 0,
                anchor: cdb[1] & 0x10 != 0,
                lbdata: cdb[1] & 0x06 != 0,
                ndob,
            }
        }
        UNMAP => Command::Unmap {
            anchor: cdb[1] & 0x01 != 0,
            param_len: be16(&cdb[7..9]),
        },
        COMPARE_AND_WRITE => {
            no_protect(cdb)?;
            // Deliberate deviation: SBC-4 §5.3 lets NUMBER OF LOGICAL BLOCKS 0 be a no-op,
            // but a 0 in this 8-bit field is far more often a truncated 256 (libiscsi's
            // conformance suite sends exactly that and expects INVALID FIELD IN CDB);
            // answering GOOD would report a compare-and-write that never happened.
            if cdb[13] == 0 {
                return Err(Sense::invalid_field_in_cdb_at(13, Some(7)));
            }
            Command::CompareAndWrite(BlockIo {
                lba: be64(&cdb[2..10]),
                blocks: u32::from(cdb[13]),
                fua: cdb[1] & 0x08 != 0,
                dpo: cdb[1] & 0x10 != 0,
            })
        }
        ORWRITE_16 => {
            no_protect(cdb)?;
            Command::OrWrite(rw16(cdb))
        }
        SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16 | PRE_FETCH_10 | PRE_FETCH_16 => {
            let (lba, blocks) = if matches!(opcode, SYNCHRONIZE_CACHE_10 | PRE_FETCH_10) {
                (u64::from(be32(&cdb[2..6])), be16(&cdb[7..9]))
            } else {
                (be64(&cdb[2..10]), be32(&cdb[10..14]))
            };
            let immed = cdb[1] & 0x02 != 0;
            if matches!(opcode, SYNCHRONIZE_CACHE_10 | SYNCHRONIZE_CACHE_16) {
                Command::SynchronizeCache { lba, blocks, immed }
            } else {
                Command::PreFetch { lba, blocks, immed }
            }
        }
        READ_CAPACITY_10 => {
            // PMI is obsolete; with PMI 0 the LBA field must be 0 (SBC-3 §5.15).
            if cdb[8] & 0x01 == 0 && be32(&cdb[2..6]) != 0 {
                return Err(Sense::invalid_field_in_cdb_at(2, None));
            }
            Command::ReadCapacity10
        }
        SERVICE_ACTION_IN_16 => match cdb[1] & 0x1F {
            SA_READ_CAPACITY_16 => Command::ReadCapacity16 {
                alloc: be32(&cdb[10..14]),
            },
            SA_GET_LBA_STATUS => Command::GetLbaStatus {
                lba: be64(&cdb[2..10]),
                alloc: be32(&cdb[10..14]),
            },
            _ => return Err(Sense::invalid_field_in_cdb_at(1, Some(4))),
        },
        START_STOP_UNIT => Command::StartStopUnit {
            immed: cdb[1] & 0x01 != 0,
            power_condition: cdb[4] >> 4,
            loej: cdb[4] & 0x02 != 0,
            start: cdb[4] & 0x01 != 0,
            no_flush: cdb[4] & 0x04 != 0,
        },
        PREVENT_ALLOW_MEDIUM_REMOVAL => Command::PreventAllow {
            prevent: cdb[4] & 0x03,
        },
        READ_DEFECT_DATA_10 | READ_DEFECT_DATA_12 => {
            let twelve = opcode == READ_DEFECT_DATA_12;
            let flags = if twelve { cdb[1] } else { cdb[2] };
            Command::ReadDefectData {
                twelve,
                plist: flags & 0x10 != 0,
                glist: flags & 0x08 != 0,
                format: flags & 0x07,
                alloc: if twelve {
                    be32(&cdb[6..10])
                } else {
                    be16(&cdb[7..9])
                },
            }
        }
        REPORT_LUNS => Command::ReportLuns {
            select: cdb[2],
            alloc: be32(&cdb[6..10]),
        },
        MAINTENANCE_IN => match cdb[1] & 0x1F {
            SA_REPORT_SUPPORTED_OPCODES => {
                let options = cdb[2] & 0x07;
                if options > 3 {
                    return Err(Sense::invalid_field_in_cdb_at(2, Some(2)));
                }
                Command::ReportSupportedOpcodes {
                    rctd: cdb[2] & 0x80 != 0,
                    options,
                    opcode: cdb[3],
                    sa: be16(&cdb[4..6]) as u16,
                    alloc: be32(&cdb[6..10]),
                }
            }
            _ => return Err(Sense::invalid_field_in_cdb_at(1, Some(4))),
        },
        RESERVE_6 => {
            // Third-party and extent reservations are obsolete/unsupported.
            if cdb[1] & 0x13 != 0 {
                return Err(Sense::invalid_field_in_cdb_at(1, None));
            }
            Command::Reserve6
        }
        RELEASE_6 => {
            if cdb[1] & 0x13 != 0 {
                return Err(Sense::invalid_field_in_cdb_at(1, None));
            }
            Command::Release6
        }
        PERSISTENT_RESERVE_IN => Command::PersistentReserveIn {
            sa: cdb[1] & 0x1F,
            alloc: be16(&cdb[7..9]),
        },
        PERSISTENT_RESERVE_OUT => Command::PersistentReserveOut(PrOut {
            sa: cdb[1] & 0x1F,
            scope: cdb[2] >> 4,
            kind: cdb[2] & 0x0F,
            param_len: be32(&cdb[5..9]),
        }),
        _ => return Err(Sense::invalid_opcode()),
    };
    Ok(cmd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decodes_a_write_once_into_everything_the_layers_ask() {
        let cdb = build::write16(0x0102_0304_0506_0708, 16, true);
        let c = decode(&cdb, 4096).unwrap();
        assert_eq!(c.opcode, op::WRITE_16);
        assert_eq!(c.name(), "WRITE(16)");
        assert_eq!(c.direction, DataDirection::Write);
        assert_eq!(c.data_out_len, 16 * 4096);
        assert_eq!(c.data_in_len, 0);
        assert_eq!(c.extent, (0x0102_0304_0506_0708, 16));
        assert!(c.fua && !c.dpo && !c.immed);
        assert!(c.idempotent() && c.is_media_access());
        assert_eq!(c.family(), Family::Write);
        let r = decode(&build::read16(7, 2), 512).unwrap();
        assert_eq!(
            (r.direction, r.data_in_len, r.extent),
            (DataDirection::Read, 1024, (7, 2))
        );
        let sync = decode(&[0x35, 0x02, 0, 0, 0, 9, 0, 0, 1, 0], 512).unwrap();
        assert!(sync.immed && !sync.is_media_access());
        assert_eq!(
            sync.extent,
            (0, 0),
            "Seal binds no extent for SYNCHRONIZE CACHE"
        );
        let caw = decode(&pad(&[0x89, 0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1]), 512).unwrap();
        assert!(!caw.idempotent());
        assert_eq!(caw.data_out_len, 1024);
        let pr = decode(&[0x5E, 0x01, 0, 0, 0, 0, 0, 0, 8, 0], 512).unwrap();
        assert_eq!(pr.service_action, Some(1));
        assert!(decode(&pad(&[0x04]), 512).is_err());
    }

    fn pad(b: &[u8]) -> Vec<u8> {
        let mut v = b.to_vec();
        v.resize(16, 0);
        v
    }

    #[test]
    fn decodes_read6_with_zero_meaning_256() {
        let c = parse(&pad(&[0x08, 0x1F, 0xFF, 0xFE, 0x00, 0x00])).unwrap();
        assert_eq!(
            c,
            Command::Read(BlockIo {
                lba: 0x1FFFFE,
                blocks: 256,
                fua: false,
                dpo: false
            })
        );
    }

    #[test]
    fn decodes_write10_with_fua_dpo() {
        let c = parse(&[0x2A, 0x18, 0, 0, 0x12, 0x34, 0, 0x00, 0x08, 0]).unwrap();
        assert_eq!(
            c,
            Command::Write(BlockIo {
                lba: 0x1234,
                blocks: 8,
                fua: true,
                dpo: true
            })
        );
    }

    #[test]
    fn decodes_read12_and_read16() {
        let c = parse(&[0xA8, 0, 0, 0, 0, 1, 0, 0, 1, 0, 0, 0]).unwrap();
        assert!(matches!(
            c,
            Command::Read(BlockIo {
                lba: 1,
                blocks: 0x100,
                ..
            })
        ));
        let c = parse(&[0x88, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0]).unwrap();
        assert!(matches!(
            c,
            Command::Read(BlockIo {
                lba: 0x1_0000_0000,
                blocks: 2,
                ..
            })
        ));
    }

    #[test]
    fn rejects_rdprotect_and_wrprotect() {
        let s = parse(&[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x24, 0x00));
        assert!(parse(&pad(&[0x8A, 0xE0])).is_err());
        assert!(parse(&pad(&[0x41, 0x40])).is_err());
        assert!(parse(&pad(&[0x89, 0x20])).is_err());
    }

    #[test]
    fn rejects_unknown_opcode_and_short_cdb() {
        let s = parse(&pad(&[0x04])).unwrap_err();
        assert_eq!((s.asc, s.ascq), (0x20, 0x00));
        let s = parse(&[0x28, 0, 0]).unwrap_err();
        assert_eq!(s.asc, 0x24);
        assert_eq!(parse(&[]).unwrap_err().asc, 0x20);
        assert_eq!(
            parse(&pad(&[0xC0])).unwrap_err().asc,
            0x20,
            "vendor group 6"
        );
    }

    #[test]
    fn rejects_naca_in_control_byte() {
        let s = parse(&[0x00, 0, 0, 0, 0, 0x04]).unwrap_err();
        assert_eq!(s.asc, 0x24);
    }

    #[test]
    fn decodes_inquiry_and_rejects_page_without_evpd() {
        assert_eq!(
            parse(&[0x12, 1, 0x83, 0x01, 0x00, 0]).unwrap(),
            Command::Inquiry {
                evpd: true,
                page: 0x83,
                alloc: 256
            }
        );
        assert_eq!(parse(&[0x12, 0, 0x83, 0, 0xFF, 0]).unwrap_err().asc, 0x24);
        assert_eq!(parse(&[0x12, 2, 0, 0, 0xFF, 0]).unwrap_err().asc, 0x24);
    }

    #[test]
    fn decodes_mode_sense_6_and_10() {
        assert_eq!(
            parse(&[0x1A, 0x08, 0x48, 0, 0xFF, 0]).unwrap(),
            Command::ModeSense {
                ten: false,
                dbd: true,
                llbaa: false,
                pc: 1,
                page: 8,
                subpage: 0,
                alloc: 255
            }
        );
        assert_eq!(
            parse(&[0x5A, 0x10, 0x3F, 0xFF, 0, 0, 0, 0x10, 0x00, 0]).unwrap(),
            Command::ModeSense {
                ten: true,
                dbd: false,
                llbaa: true,
                pc: 0,
                page: 0x3F,
                subpage: 0xFF,
                alloc: 4096
            }
        );
    }

    #[test]
    fn decodes_mode_select() {
        assert_eq!(
            parse(&[0x15, 0x11, 0, 0, 24, 0]).unwrap(),
            Command::ModeSelect {
                ten: false,
                pf: true,
                sp: true,
                param_len: 24
            }
        );
        assert_eq!(
            parse(&[0x55, 0x10, 0, 0, 0, 0, 0, 0x01, 0x00, 0]).unwrap(),
            Command::ModeSelect {
                ten: true,
                pf: true,
                sp: false,
                param_len: 256
            }
        );
    }

    #[test]
    fn decodes_verify_bytchk_and_rejects_reserved_values() {
        let c = parse(&[0x2F, 0x02, 0, 0, 0, 9, 0, 0, 1, 0]).unwrap();
        assert!(matches!(
            c,
            Command::Verify {
                bytchk: 1,
                io: BlockIo {
                    lba: 9,
                    blocks: 1,
                    ..
                }
            }
        ));
        let c = parse(&pad(&[0x8F, 0x06])).unwrap();
        assert!(matches!(c, Command::Verify { bytchk: 3, .. }));
        assert!(parse(&[0xAF, 0x04, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0]).is_err());
        assert!(
            parse(&[0x2E, 0x06, 0, 0, 0, 0, 0, 0, 1, 0]).is_err(),
            "WRITE AND VERIFY bytchk 3"
        );
        let c = parse(&[0x2E, 0x02, 0, 0, 0, 0, 0, 0, 1, 0]).unwrap();
        assert!(matches!(c, Command::WriteAndVerify { bytchk: 1, .. }));
    }

    #[test]
    fn decodes_write_same_flags() {
        let c = parse(&pad(&[0x93, 0x09, 0, 0, 0, 0, 0, 0, 0, 5, 0, 0, 0, 7])).unwrap();
        assert_eq!(
            c,
            Command::WriteSame {
                io: BlockIo {
                    lba: 5,
                    blocks: 7,
                    fua: false,
                    dpo: false
                },
                unmap: true,
                anchor: false,
                lbdata: false,
                ndob: true
            }
        );
        let c = parse(&[0x41, 0x11, 0, 0, 0, 1, 0, 0, 2, 0]).unwrap();
        assert!(matches!(
            c,
            Command::WriteSame {
                anchor: true,
                lbdata: false,
                ndob: false,
                ..
            }
        ));
        let c = parse(&[0x41, 0x04, 0, 0, 0, 1, 0, 0, 2, 0]).unwrap();
        assert!(matches!(c, Command::WriteSame { lbdata: true, .. }));
    }

    #[test]
    fn decodes_unmap_caw_sync_prefetch() {
        assert_eq!(
            parse(&[0x42, 0, 0, 0, 0, 0, 0, 0, 24, 0]).unwrap(),
            Command::Unmap {
                anchor: false,
                param_len: 24
            }
        );
        let c = parse(&pad(&[0x89, 0x08, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 1])).unwrap();
        assert_eq!(
            c,
            Command::CompareAndWrite(BlockIo {
                lba: 3,
                blocks: 1,
                fua: true,
                dpo: false
            })
        );
        assert_eq!(
            parse(&[0x35, 0x02, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap(),
            Command::SynchronizeCache {
                lba: 0,
                blocks: 0,
                immed: true
            }
        );
        assert_eq!(
            parse(&pad(&[0x90, 0x02, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 2])).unwrap(),
            Command::PreFetch {
                lba: 4,
                blocks: 2,
                immed: true
            }
        );
    }

    #[test]
    fn decodes_service_action_in_and_maintenance_in() {
        assert_eq!(
            parse(&pad(&[0x9E, 0x10, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 32])).unwrap(),
            Command::ReadCapacity16 { alloc: 32 }
        );
        assert_eq!(
            parse(&pad(&[0x9E, 0x12, 0, 0, 0, 0, 0, 0, 0, 8, 0, 0, 0, 24])).unwrap(),
            Command::GetLbaStatus { lba: 8, alloc: 24 }
        );
        assert!(parse(&pad(&[0x9E, 0x11])).is_err());
        assert_eq!(
            parse(&[0xA3, 0x0C, 0x82, 0x9E, 0, 0x10, 0, 0, 1, 0, 0, 0]).unwrap(),
            Command::ReportSupportedOpcodes {
                rctd: true,
                options: 2,
                opcode: 0x9E,
                sa: 0x10,
                alloc: 256
            }
        );
        assert!(parse(&[0xA3, 0x0C, 0x07, 0, 0, 0, 0, 0, 1, 0, 0, 0]).is_err());
        assert!(parse(&[0xA3, 0x0A, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0]).is_err());
    }

    #[test]
    fn decodes_read_capacity10_and_rejects_lba_without_pmi() {
        assert_eq!(
            parse(&[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap(),
            Command::ReadCapacity10
        );
        assert!(parse(&[0x25, 0, 0, 0, 0, 1, 0, 0, 0, 0]).is_err());
        assert!(parse(&[0x25, 0, 0, 0, 0, 1, 0, 0, 1, 0]).is_ok());
    }

    #[test]
    fn decodes_misc_commands() {
        assert_eq!(parse(&[0, 0, 0, 0, 0, 0]).unwrap(), Command::TestUnitReady);
        assert_eq!(
            parse(&[0x03, 1, 0, 0, 252, 0]).unwrap(),
            Command::RequestSense {
                desc: true,
                alloc: 252
            }
        );
        assert_eq!(
            parse(&[0x1B, 1, 0, 0, 0x13, 0]).unwrap(),
            Command::StartStopUnit {
                immed: true,
                power_condition: 1,
                loej: true,
                start: true,
                no_flush: false
            }
        );
        assert_eq!(
            parse(&[0x1E, 0, 0, 0, 1, 0]).unwrap(),
            Command::PreventAllow { prevent: 1 }
        );
        assert_eq!(
            parse(&[0x37, 0, 0x1D, 0, 0, 0, 0, 0, 32, 0]).unwrap(),
            Command::ReadDefectData {
                twelve: false,
                plist: true,
                glist: true,
                format: 5,
                alloc: 32
            }
        );
        assert_eq!(
            parse(&[0xA0, 0, 2, 0, 0, 0, 0, 0, 0, 16, 0, 0]).unwrap(),
            Command::ReportLuns {
                select: 2,
                alloc: 16
            }
        );
        assert_eq!(parse(&[0x16, 0, 0, 0, 0, 0]).unwrap(), Command::Reserve6);
        assert!(
            parse(&[0x16, 0x10, 0, 0, 0, 0]).is_err(),
            "third-party reserve"
        );
        assert_eq!(
            parse(&[0x5F, 0x01, 0x03, 0, 0, 0, 0, 0, 24, 0]).unwrap(),
            Command::PersistentReserveOut(PrOut {
                sa: 1,
                scope: 0,
                kind: 3,
                param_len: 24
            })
        );
        assert_eq!(
            parse(&[0x5E, 0x00, 0, 0, 0, 0, 0, 0x20, 0, 0]).unwrap(),
            Command::PersistentReserveIn {
                sa: 0,
                alloc: 0x2000
            }
        );
    }
}
