//! The block extent a CDB addresses, for the [`Binding`] both sides compute independently.
//!
//! Initiator and target must derive the same LBA and block count from the same CDB, so the
//! rule lives here, next to the associated data it feeds (docs/seal.md §4). Commands that
//! address no block range bind LBA 0 and 0 blocks.

use crate::frame::Binding;

/// `(lba, blocks)` of the block commands of SBC-4 that carry data; `(0, 0)` otherwise.
#[must_use]
pub fn extent(cdb: &[u8]) -> (u64, u32) {
    let be = |r: std::ops::Range<usize>| -> u64 {
        cdb.get(r).map_or(0, |b| {
            b.iter().fold(0u64, |acc, &x| (acc << 8) | u64::from(x))
        })
    };
    match cdb.first() {
        // READ(6)/WRITE(6): 21-bit LBA, 0 blocks means 256.
        Some(0x08 | 0x0a) if cdb.len() >= 6 => {
            let lba = be(1..4) & 0x1f_ffff;
            let n = u32::from(cdb[4]);
            (lba, if n == 0 { 256 } else { n })
        }
        // READ/WRITE/WRITE AND VERIFY/VERIFY/PRE-FETCH/WRITE SAME (10).
        Some(0x28 | 0x2a | 0x2e | 0x2f | 0x41) if cdb.len() >= 10 => (be(2..6), be(7..9) as u32),
        // The 12-byte forms.
        Some(0xa8 | 0xaa | 0xae | 0xaf) if cdb.len() >= 12 => (be(2..6), be(6..10) as u32),
        // The 16-byte forms, ORWRITE(16), WRITE SAME(16).
        Some(0x88 | 0x8a | 0x8b | 0x8e | 0x8f | 0x93) if cdb.len() >= 16 => {
            (be(2..10), be(10..14) as u32)
        }
        // COMPARE AND WRITE: NUMBER OF LOGICAL BLOCKS in byte 13.
        Some(0x89) if cdb.len() >= 16 => (be(2..10), u32::from(cdb[13])),
        _ => (0, 0),
    }
}

/// The binding of one command's data: the PDU's 8-byte LUN field, its task tag, and the
/// CDB's opcode and extent.
#[must_use]
pub fn binding(lun: u64, task_tag: u32, cdb: &[u8]) -> Binding {
    let (lba, blocks) = extent(cdb);
    Binding {
        lun,
        lba,
        blocks,
        opcode: cdb.first().copied().unwrap_or(0),
        task_tag,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extents_of_read_write_forms() {
        assert_eq!(
            extent(&[0x28, 0, 0, 0, 0x12, 0x34, 0, 0, 8, 0]),
            (0x1234, 8)
        );
        assert_eq!(extent(&[0x0a, 0x01, 0x02, 0x03, 0, 0]), (0x010203, 256));
        let mut w16 = [0u8; 16];
        w16[0] = 0x8a;
        w16[9] = 7;
        w16[13] = 3;
        assert_eq!(extent(&w16), (7, 3));
        let mut caw = [0u8; 16];
        caw[0] = 0x89;
        caw[9] = 1;
        caw[13] = 2;
        assert_eq!(extent(&caw), (1, 2));
        // The forms the initiator once bound as (0, 0) (issue 13): WRITE(12), WRITE AND
        // VERIFY(10), WRITE SAME(10)/(16).
        assert_eq!(extent(&[0xaa, 0, 0, 0, 0, 20, 0, 0, 0, 3, 0, 0]), (20, 3));
        assert_eq!(extent(&[0x2e, 0, 0, 0, 0, 30, 0, 0, 2, 0]), (30, 2));
        assert_eq!(extent(&[0x41, 0, 0, 0, 0, 50, 0, 0, 4, 0]), (50, 4));
        let mut ws16 = [0u8; 16];
        ws16[0] = 0x93;
        ws16[9] = 60;
        ws16[13] = 3;
        assert_eq!(extent(&ws16), (60, 3));
        assert_eq!(
            extent(&[0x12, 0, 0, 0, 36, 0]),
            (0, 0),
            "INQUIRY addresses no blocks"
        );
        assert_eq!(extent(&[0x28, 0, 0]), (0, 0), "short CDB");
    }
}
