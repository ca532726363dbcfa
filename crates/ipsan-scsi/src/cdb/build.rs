//! CDBs an initiator sends, built here beside the decoder ([`super::parse`]) so the bytes are
//! laid out by the same crate that reads them: each builder's CDB parses back into the command
//! it names (tested below). Every CDB is 16 bytes, the shorter forms zero-padded.

use super::op;

/// READ(16) (SBC-4 §5.16): the 16-byte form has no 2 TiB ceiling.
#[must_use]
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(op::READ_16, lba, blocks, false)
}

/// WRITE(16) (SBC-4 §5.40), optionally with FUA (force unit access).
#[must_use]
pub fn write16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    rw16(op::WRITE_16, lba, blocks, fua)
}

fn rw16(opcode: u8, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = opcode;
    if fua {
        c[1] = 0x08;
    }
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// SYNCHRONIZE CACHE(16) (SBC-4 §5.25) over `blocks` from `lba` (0 blocks: to the end).
#[must_use]
pub fn sync_cache16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(op::SYNCHRONIZE_CACHE_16, lba, blocks, false)
}

/// WRITE SAME(16) (SBC-4 §5.43): one block of data-out written over the extent.
#[must_use]
pub fn write_same16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(op::WRITE_SAME_16, lba, blocks, false)
}

/// UNMAP (SBC-4 §5.28) with a parameter list of `list_len` bytes.
#[must_use]
pub fn unmap(list_len: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::UNMAP;
    c[7..9].copy_from_slice(&list_len.to_be_bytes());
    c
}

/// COMPARE AND WRITE (SBC-4 §5.3) of `blocks` (1..=255) from `lba`: data-out is the compare
/// blocks, then the write blocks.
#[must_use]
pub fn compare_and_write(lba: u64, blocks: u8) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::COMPARE_AND_WRITE;
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[13] = blocks;
    c
}

/// TEST UNIT READY (SPC-5 §6.47).
#[must_use]
pub fn test_unit_ready() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::TEST_UNIT_READY;
    c
}

/// SYNCHRONIZE CACHE(10) over the whole medium (SBC-4 §5.24).
#[must_use]
pub fn sync_cache10() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::SYNCHRONIZE_CACHE_10;
    c
}

/// INQUIRY, standard data (SPC-5 §6.7).
#[must_use]
pub fn inquiry(alloc: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::INQUIRY;
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY(16) (SBC-4 §5.20).
#[must_use]
pub fn read_capacity16() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::SERVICE_ACTION_IN_16;
    c[1] = op::SA_READ_CAPACITY_16;
    c[10..14].copy_from_slice(&32u32.to_be_bytes());
    c
}

/// READ CAPACITY(10) (SBC-4 §5.18), the fallback for targets without (16).
#[must_use]
pub fn read_capacity10() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::READ_CAPACITY_10;
    c
}

/// REPORT LUNS (SPC-5 §6.33).
#[must_use]
pub fn report_luns(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op::REPORT_LUNS;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// The operation code of a CDB (SPC-5 §4.2.5.1); 0 (TEST UNIT READY) for an empty one.
#[must_use]
pub fn opcode(cdb: &[u8]) -> u8 {
    cdb.first().copied().unwrap_or(op::TEST_UNIT_READY)
}

#[cfg(test)]
mod tests {
    use super::super::{parse, BlockIo, Command};
    use super::*;

    #[test]
    fn lays_out_rw16_as_sbc_4_says() {
        let c = write16(0x0102_0304_0506_0708, 16, true);
        assert_eq!(c[0], 0x8a);
        assert_eq!(c[1], 0x08);
        assert_eq!(&c[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&c[10..14], &[0, 0, 0, 16]);
        assert_eq!(read16(0, 1)[0], 0x88);
        assert_eq!(read16(0, 1)[1], 0);
    }

    #[test]
    fn built_cdbs_parse_back_into_the_commands_they_name() {
        assert!(matches!(
            parse(&test_unit_ready()),
            Ok(Command::TestUnitReady)
        ));
        assert!(matches!(parse(&inquiry(96)), Ok(Command::Inquiry { .. })));
        assert!(matches!(
            parse(&report_luns(4096)),
            Ok(Command::ReportLuns { .. })
        ));
        assert!(matches!(
            parse(&read_capacity10()),
            Ok(Command::ReadCapacity10)
        ));
        assert!(matches!(
            parse(&read_capacity16()),
            Ok(Command::ReadCapacity16 { .. })
        ));
        assert!(matches!(
            parse(&sync_cache10()),
            Ok(Command::SynchronizeCache { .. })
        ));
        let io = |fua| BlockIo {
            lba: 7,
            blocks: 8,
            fua,
            dpo: false,
        };
        assert_eq!(parse(&read16(7, 8)), Ok(Command::Read(io(false))));
        assert_eq!(parse(&write16(7, 8, true)), Ok(Command::Write(io(true))));
        assert_eq!(opcode(&read16(7, 8)), op::READ_16);
        assert_eq!(opcode(&write16(7, 8, true)), op::WRITE_16);
        assert_eq!(opcode(&[]), op::TEST_UNIT_READY);
        assert!(matches!(
            parse(&sync_cache16(0, 0)),
            Ok(Command::SynchronizeCache { .. })
        ));
        assert!(matches!(
            parse(&write_same16(7, 8)),
            Ok(Command::WriteSame { .. })
        ));
        assert!(matches!(parse(&unmap(24)), Ok(Command::Unmap { .. })));
        assert!(matches!(
            parse(&compare_and_write(7, 2)),
            Ok(Command::CompareAndWrite { .. })
        ));
    }
}
