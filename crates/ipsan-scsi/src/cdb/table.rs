//! The one opcode table ([`OPS`]): for every opcode [`super::parse`] accepts, its name, its
//! family, where its extent lies and whether it may be sent again after a connection loss.
//! Every question the layers above ask of an opcode (Seal's extent, the metrics' kind, the
//! reissue policy, the LU's submit/complete path, the iSCSI overflow rule) is answered here.

use super::op;

/// What an opcode does, in the groups the layers above tell apart.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Family {
    /// READ(6/10/12/16).
    Read,
    /// WRITE(6/10/12/16).
    Write,
    /// WRITE AND VERIFY(10/12/16).
    WriteAndVerify,
    /// VERIFY(10/12/16).
    Verify,
    /// WRITE SAME(10/16).
    WriteSame,
    /// COMPARE AND WRITE.
    CompareAndWrite,
    /// ORWRITE(16).
    OrWrite,
    /// UNMAP.
    Unmap,
    /// SYNCHRONIZE CACHE(10/16).
    SynchronizeCache,
    /// PRE-FETCH(10/16).
    PreFetch,
    /// Everything else (SPC commands, capacity, reservations...).
    Other,
}

impl Family {
    /// Moves blocks between the medium and a data buffer: the commands whose extent Seal
    /// binds (docs/seal.md §4).
    #[must_use]
    pub fn is_media_access(self) -> bool {
        matches!(
            self,
            Family::Read
                | Family::Write
                | Family::WriteAndVerify
                | Family::Verify
                | Family::WriteSame
                | Family::CompareAndWrite
                | Family::OrWrite
        )
    }

    /// READ or WRITE proper (the `read`/`write` of the metrics include WRITE AND VERIFY:
    /// see [`Family::is_block_write`]).
    #[must_use]
    pub fn is_read_or_write(self) -> bool {
        matches!(self, Family::Read | Family::Write)
    }

    /// WRITE or WRITE AND VERIFY: a write of the data-out blocks as they are.
    #[must_use]
    pub fn is_block_write(self) -> bool {
        matches!(self, Family::Write | Family::WriteAndVerify)
    }
}

/// Where a CDB keeps its LOGICAL BLOCK ADDRESS and its block count (SBC-4 §5).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Field {
    /// No extent.
    None,
    /// 6-byte form: 21-bit LBA in bytes 1..4, 8-bit count in byte 4 (0 means 256).
    Six,
    /// 10-byte form: LBA in bytes 2..6, 16-bit count in bytes 7..9.
    Ten,
    /// 12-byte form: LBA in bytes 2..6, 32-bit count in bytes 6..10.
    Twelve,
    /// 16-byte form: LBA in bytes 2..10, 32-bit count in bytes 10..14.
    Sixteen,
    /// COMPARE AND WRITE: LBA in bytes 2..10, 8-bit count in byte 13.
    CompareAndWrite,
}

impl Field {
    /// The bytes of the block count field, for a caller that rewrites it.
    #[must_use]
    pub fn count_bytes(self) -> Option<std::ops::Range<usize>> {
        match self {
            Field::None => None,
            Field::Six => Some(4..5),
            Field::Ten => Some(7..9),
            Field::Twelve => Some(6..10),
            Field::Sixteen => Some(10..14),
            Field::CompareAndWrite => Some(13..14),
        }
    }
}

/// One row of the opcode table ([`OPS`]).
#[derive(Debug, PartialEq, Eq)]
pub struct OpEntry {
    /// Operation code.
    pub opcode: u8,
    /// Name (SPC-4 Annex D), e.g. `"READ(10)"`.
    pub name: &'static str,
    /// Family.
    pub family: Family,
    /// Where the extent is.
    pub field: Field,
    /// May be sent again after a connection loss without changing what it does: it may
    /// already have run once, in full or in part, on the old session (SAM-5 §5.6).
    ///
    /// Reads and inquiries change nothing; a WRITE, WRITE SAME or UNMAP of the same data to
    /// the same blocks leaves the medium as one run does (the target's reinstatement makes
    /// sure the old copy finished or was aborted before the new one runs, RFC 7143 §6.3.5);
    /// SYNCHRONIZE CACHE, VERIFY and PRE-FETCH may run any number of times. Not idempotent,
    /// so never sent twice: COMPARE AND WRITE (the second run compares against its own
    /// write), PERSISTENT RESERVE OUT (REGISTER AND IGNORE, PREEMPT, ... change keys),
    /// RESERVE and RELEASE, REQUEST SENSE (it consumes what it reports), MODE SELECT,
    /// ORWRITE, READ DEFECT DATA, and every opcode not in the table.
    pub idempotent: bool,
}

const fn row(opcode: u8, name: &'static str, family: Family, field: Field, idem: bool) -> OpEntry {
    OpEntry {
        opcode,
        name,
        family,
        field,
        idempotent: idem,
    }
}

/// The one opcode table: every opcode [`parse`] accepts, with what each layer asks of it.
#[rustfmt::skip]
pub static OPS: &[OpEntry] = {
    use Family as F;
    use Field as X;
    &[
        row(op::TEST_UNIT_READY, "TEST UNIT READY", F::Other, X::None, true),
        row(op::REQUEST_SENSE, "REQUEST SENSE", F::Other, X::None, false),
        row(op::READ_6, "READ(6)", F::Read, X::Six, true),
        row(op::WRITE_6, "WRITE(6)", F::Write, X::Six, true),
        row(op::INQUIRY, "INQUIRY", F::Other, X::None, true),
        row(op::MODE_SELECT_6, "MODE SELECT(6)", F::Other, X::None, false),
        row(op::RESERVE_6, "RESERVE(6)", F::Other, X::None, false),
        row(op::RELEASE_6, "RELEASE(6)", F::Other, X::None, false),
        row(op::MODE_SENSE_6, "MODE SENSE(6)", F::Other, X::None, true),
        row(op::START_STOP_UNIT, "START STOP UNIT", F::Other, X::None, true),
        row(op::PREVENT_ALLOW_MEDIUM_REMOVAL, "PREVENT ALLOW MEDIUM REMOVAL", F::Other, X::None, true),
        row(op::READ_CAPACITY_10, "READ CAPACITY(10)", F::Other, X::None, true),
        row(op::READ_10, "READ(10)", F::Read, X::Ten, true),
        row(op::WRITE_10, "WRITE(10)", F::Write, X::Ten, true),
        row(op::WRITE_AND_VERIFY_10, "WRITE AND VERIFY(10)", F::WriteAndVerify, X::Ten, true),
        row(op::VERIFY_10, "VERIFY(10)", F::Verify, X::Ten, true),
        row(op::PRE_FETCH_10, "PRE-FETCH(10)", F::PreFetch, X::Ten, true),
        row(op::SYNCHRONIZE_CACHE_10, "SYNCHRONIZE CACHE(10)", F::SynchronizeCache, X::Ten, true),
        row(op::READ_DEFECT_DATA_10, "READ DEFECT DATA(10)", F::Other, X::None, false),
        row(op::WRITE_SAME_10, "WRITE SAME(10)", F::WriteSame, X::Ten, true),
        row(op::UNMAP, "UNMAP", F::Unmap, X::None, true),
        row(op::MODE_SELECT_10, "MODE SELECT(10)", F::Other, X::None, false),
        row(op::MODE_SENSE_10, "MODE SENSE(10)", F::Other, X::None, true),
        row(op::PERSISTENT_RESERVE_IN, "PERSISTENT RESERVE IN", F::Other, X::None, true),
        row(op::PERSISTENT_RESERVE_OUT, "PERSISTENT RESERVE OUT", F::Other, X::None, false),
        row(op::READ_16, "READ(16)", F::Read, X::Sixteen, true),
        row(op::COMPARE_AND_WRITE, "COMPARE AND WRITE", F::CompareAndWrite, X::CompareAndWrite, false),
        row(op::WRITE_16, "WRITE(16)", F::Write, X::Sixteen, true),
        row(op::ORWRITE_16, "ORWRITE(16)", F::OrWrite, X::Sixteen, false),
        row(op::WRITE_AND_VERIFY_16, "WRITE AND VERIFY(16)", F::WriteAndVerify, X::Sixteen, true),
        row(op::VERIFY_16, "VERIFY(16)", F::Verify, X::Sixteen, true),
        row(op::PRE_FETCH_16, "PRE-FETCH(16)", F::PreFetch, X::Sixteen, true),
        row(op::SYNCHRONIZE_CACHE_16, "SYNCHRONIZE CACHE(16)", F::SynchronizeCache, X::Sixteen, true),
        row(op::WRITE_SAME_16, "WRITE SAME(16)", F::WriteSame, X::Sixteen, true),
        row(op::SERVICE_ACTION_IN_16, "SERVICE ACTION IN(16)", F::Other, X::None, true),
        row(op::REPORT_LUNS, "REPORT LUNS", F::Other, X::None, true),
        row(op::MAINTENANCE_IN, "MAINTENANCE IN", F::Other, X::None, true),
        row(op::READ_12, "READ(12)", F::Read, X::Twelve, true),
        row(op::WRITE_12, "WRITE(12)", F::Write, X::Twelve, true),
        row(op::WRITE_AND_VERIFY_12, "WRITE AND VERIFY(12)", F::WriteAndVerify, X::Twelve, true),
        row(op::VERIFY_12, "VERIFY(12)", F::Verify, X::Twelve, true),
        row(op::READ_DEFECT_DATA_12, "READ DEFECT DATA(12)", F::Other, X::None, false),
    ]
};

/// The row of `opcode`, `None` for an opcode this crate does not know.
#[must_use]
pub fn entry(opcode: u8) -> Option<&'static OpEntry> {
    // 256 entries indexed by opcode, built once at compile time from `OPS`.
    static INDEX: [u8; 256] = {
        let mut idx = [u8::MAX; 256];
        let mut i = 0;
        while i < OPS.len() {
            idx[OPS[i].opcode as usize] = i as u8;
            i += 1;
        }
        idx
    };
    OPS.get(usize::from(INDEX[usize::from(opcode)]))
}

/// The family of the opcode in `cdb[0]` ([`Family::Other`] for an empty CDB or an opcode not
/// in the table).
#[must_use]
pub fn family(cdb: &[u8]) -> Family {
    cdb.first()
        .and_then(|&o| entry(o))
        .map_or(Family::Other, |e| e.family)
}

/// Whether a command with this opcode may be sent again after a connection loss
/// ([`OpEntry::idempotent`]); `false` for opcodes not in the table.
#[must_use]
pub fn is_idempotent(opcode: u8) -> bool {
    entry(opcode).is_some_and(|e| e.idempotent)
}

/// The `(lba, blocks)` a CDB addresses, read from where the table says without validating
/// the rest: for the media access commands ([`Family::is_media_access`]) with a CDB long
/// enough, `(0, 0)` otherwise. Initiator and target derive Seal's binding from it
/// independently, so it must stay the same for every CDB (docs/seal.md §4).
#[must_use]
pub fn extent(cdb: &[u8]) -> (u64, u32) {
    let Some(e) = cdb.first().and_then(|&o| entry(o)) else {
        return (0, 0);
    };
    if !e.family.is_media_access() {
        return (0, 0);
    }
    field_extent(e.field, cdb).unwrap_or((0, 0))
}

/// The `(lba, blocks)` at `field` of `cdb`; `None` when the CDB is shorter than its form.
fn field_extent(field: Field, cdb: &[u8]) -> Option<(u64, u32)> {
    let len = match field {
        Field::None => return Some((0, 0)),
        Field::Six => 6,
        Field::Ten => 10,
        Field::Twelve => 12,
        Field::Sixteen | Field::CompareAndWrite => 16,
    };
    let c = cdb.get(..len)?;
    let be =
        |r: std::ops::Range<usize>| c[r].iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x));
    Some(match field {
        Field::Six => {
            let n = u32::from(c[4]);
            (be(1..4) & 0x1f_ffff, if n == 0 { 256 } else { n })
        }
        Field::Ten => (be(2..6), be(7..9) as u32),
        Field::Twelve => (be(2..6), be(6..10) as u32),
        Field::CompareAndWrite => (be(2..10), u32::from(c[13])),
        Field::None | Field::Sixteen => (be(2..10), be(10..14) as u32),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cdb::parse;

    /// The opcode tables the other crates held before this table replaced them (issue 32),
    /// frozen here as they were: the one table must answer every question as they did.
    mod old {
        /// iscsi-proto `engine::session::is_idempotent`.
        pub fn is_idempotent(opcode: u8) -> bool {
            matches!(
                opcode,
                0x00 | 0x08
                    | 0x0A
                    | 0x12
                    | 0x1A
                    | 0x1B
                    | 0x1E
                    | 0x25
                    | 0x28
                    | 0x2A
                    | 0x2E
                    | 0x2F
                    | 0x34
                    | 0x35
                    | 0x41
                    | 0x42
                    | 0x5A
                    | 0x5E
                    | 0x88
                    | 0x8A
                    | 0x8E
                    | 0x8F
                    | 0x90
                    | 0x91
                    | 0x93
                    | 0x9E
                    | 0xA0
                    | 0xA3
                    | 0xA8
                    | 0xAA
                    | 0xAE
                    | 0xAF
            )
        }
        /// ipsan-target `metrics::Op::of`: 1 read, 2 write, 0 other.
        pub fn metrics_op(opcode: u8) -> u8 {
            match opcode {
                0x08 | 0x28 | 0xa8 | 0x88 => 1,
                0x0a | 0x2a | 0xaa | 0x8a | 0x2e | 0xae | 0x8e => 2,
                _ => 0,
            }
        }
        /// ipsan-target `conn::runs_inline`'s READ/WRITE set.
        pub fn conn_rw(opcode: u8) -> bool {
            matches!(
                opcode,
                0x08 | 0x0a | 0x28 | 0x2a | 0x88 | 0x8a | 0xa8 | 0xaa
            )
        }
        /// ipsan-target `conn.rs` forward's READ set.
        pub fn conn_read(opcode: u8) -> bool {
            matches!(opcode, 0x08 | 0x28 | 0xa8 | 0x88)
        }
        /// ipsan-target `conn::overflow_write`'s count field.
        pub fn overflow_field(opcode: u8) -> Option<std::ops::Range<usize>> {
            match opcode {
                0x2a | 0x2e => Some(7..9),
                0xaa | 0xae => Some(6..10),
                0x8a | 0x8e => Some(10..14),
                0x0a => Some(4..5),
                _ => None,
            }
        }
        /// ipsan-scsi `LogicalUnit::runs_async`'s opcode set.
        pub fn lu_async(opcode: u8) -> bool {
            matches!(
                opcode,
                0x08 | 0x28
                    | 0xA8
                    | 0x88
                    | 0x0A
                    | 0x2A
                    | 0xAA
                    | 0x8A
                    | 0x35
                    | 0x91
                    | 0x42
                    | 0x41
                    | 0x93
                    | 0x89
            )
        }
        /// ipsan-seal `cdb::extent`.
        pub fn extent(cdb: &[u8]) -> (u64, u32) {
            let be = |r: std::ops::Range<usize>| -> u64 {
                cdb.get(r).map_or(0, |b| {
                    b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
                })
            };
            match cdb.first() {
                Some(0x08 | 0x0a) if cdb.len() >= 6 => {
                    let lba = be(1..4) & 0x1f_ffff;
                    let n = u32::from(cdb[4]);
                    (lba, if n == 0 { 256 } else { n })
                }
                Some(0x28 | 0x2a | 0x2e | 0x2f | 0x41) if cdb.len() >= 10 => {
                    (be(2..6), be(7..9) as u32)
                }
                Some(0xa8 | 0xaa | 0xae | 0xaf) if cdb.len() >= 12 => (be(2..6), be(6..10) as u32),
                Some(0x88 | 0x8a | 0x8b | 0x8e | 0x8f | 0x93) if cdb.len() >= 16 => {
                    (be(2..10), be(10..14) as u32)
                }
                Some(0x89) if cdb.len() >= 16 => (be(2..10), u32::from(cdb[13])),
                _ => (0, 0),
            }
        }
    }

    #[test]
    fn one_table_answers_as_the_old_tables_for_every_opcode() {
        for opcode in 0..=255u8 {
            let e = entry(opcode);
            let family = e.map_or(Family::Other, |e| e.family);
            assert_eq!(
                is_idempotent(opcode),
                old::is_idempotent(opcode),
                "{opcode:#04x}"
            );
            let metrics = match family {
                Family::Read => 1,
                f if f.is_block_write() => 2,
                _ => 0,
            };
            assert_eq!(metrics, old::metrics_op(opcode), "{opcode:#04x}");
            assert_eq!(
                family.is_read_or_write(),
                old::conn_rw(opcode),
                "{opcode:#04x}"
            );
            assert_eq!(
                family == Family::Read,
                old::conn_read(opcode),
                "{opcode:#04x}"
            );
            let field = e
                .filter(|e| e.family.is_block_write())
                .and_then(|e| e.field.count_bytes());
            assert_eq!(field, old::overflow_field(opcode), "{opcode:#04x}");
            let asynch = matches!(
                family,
                Family::Read
                    | Family::Write
                    | Family::SynchronizeCache
                    | Family::Unmap
                    | Family::WriteSame
                    | Family::CompareAndWrite
            );
            assert_eq!(asynch, old::lu_async(opcode), "{opcode:#04x}");
            // The extent, for CDBs of every length with bytes that differ per position.
            for len in [0, 3, 5, 6, 9, 10, 11, 12, 15, 16, 32] {
                let mut cdb: Vec<u8> = (0..len as u8).map(|i| i.wrapping_mul(37) ^ 0x5A).collect();
                if let Some(b) = cdb.first_mut() {
                    *b = opcode;
                }
                assert_eq!(extent(&cdb), old::extent(&cdb), "{opcode:#04x} len {len}");
                if len > 4 {
                    cdb[4] = 0;
                    assert_eq!(extent(&cdb), old::extent(&cdb), "{opcode:#04x} len {len}");
                }
            }
        }
    }

    #[test]
    fn table_lists_each_opcode_once_and_every_opcode_parse_accepts() {
        for (i, e) in OPS.iter().enumerate() {
            assert!(
                OPS[i + 1..].iter().all(|o| o.opcode != e.opcode),
                "{:#04x} twice",
                e.opcode
            );
            assert_eq!(entry(e.opcode), Some(e));
        }
        for opcode in 0..=255u8 {
            let mut cdb = [0u8; 16];
            cdb[0] = opcode;
            let known = !matches!(parse(&cdb), Err(ref s) if s.asc == 0x20 && s.ascq == 0);
            assert_eq!(known, entry(opcode).is_some(), "{opcode:#04x}");
        }
    }
}
