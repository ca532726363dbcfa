//! The target's overflow and underflow rules (RFC 7143 §11.4.5.1, SPC-4 §4.2.5.6), in one
//! place every path of a target applies them from: a local LU's command in a plain session,
//! the same command in a Seal session (once its data-out is opened, in plaintext bytes), and
//! a gateway's front of a sealed target. The driver calls [`fit_write`] before the device
//! server runs a data-out command and reports [`residual`] with the status.
//!
//! An *overflow* is an EDTL shorter than what the CDB transfers; an *underflow* a longer one.
//! For a block write that overflows, the target takes FCP-4's option (a): it transfers and
//! writes only the whole blocks EDTL covers (the CDB's transfer length is rewritten to them),
//! and reports the rest as the residual; any other data-out command that overflows is
//! refused with INVALID FIELD IN COMMAND INFORMATION UNIT, nothing written (option (b)).

/// What becomes of a data-out command, given its EDTL ([`fit_write`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteFit {
    /// EDTL covers the CDB's whole transfer (an underflow's extra bytes are not written).
    Whole,
    /// EDTL covers `bytes` (whole blocks) of a block write: the CDB now transfers only those.
    Truncated {
        /// Bytes of data-out to write.
        bytes: usize,
    },
    /// EDTL covers no whole block of a block write: nothing is written, but the command's
    /// checks (unit attention, reservations, the CDB's fields) still answer (SPC-4 §5.13).
    NoBlocks,
    /// An overflowing data-out command that is not a block write: nothing is written,
    /// CHECK CONDITION, ILLEGAL REQUEST / INVALID FIELD IN COMMAND INFORMATION UNIT
    /// ([`REFUSED_SENSE`]).
    Refused,
}

/// Sense key, ASC and ASCQ of [`WriteFit::Refused`]: ILLEGAL REQUEST / INVALID FIELD IN
/// COMMAND INFORMATION UNIT (0Eh/03h).
pub const REFUSED_SENSE: (u8, u8, u8) = (0x05, 0x0e, 0x03);

/// Decides a data-out command whose CDB transfers `need` bytes and whose EDTL is `edtl`
/// bytes (both as the device server counts them: plaintext in a Seal session). For a block
/// write (WRITE, WRITE AND VERIFY) that overflows, rewrites `cdb`'s TRANSFER LENGTH to the
/// whole blocks of `block_size` bytes that EDTL covers. `count` is where that TRANSFER
/// LENGTH sits in the CDB when the command is a block write (the SCSI layer's one opcode
/// table says, `ipsan_scsi::cdb::entry`), `None` for any other command.
pub fn fit_write(
    cdb: &mut [u8],
    count: Option<std::ops::Range<usize>>,
    block_size: u32,
    need: u64,
    edtl: u64,
) -> WriteFit {
    if edtl >= need {
        return WriteFit::Whole;
    }
    let bs = u64::from(block_size.max(1));
    let blocks = u32::try_from(edtl / bs).unwrap_or(u32::MAX);
    let Some(field) = count else {
        return WriteFit::Refused;
    };
    // A one-byte count (WRITE(6)) holds 1..=255 blocks (0 means 256).
    if field.len() == 1 && blocks > 255 {
        return WriteFit::Refused;
    }
    if cdb.len() < field.end {
        return WriteFit::Refused;
    }
    if blocks == 0 {
        return WriteFit::NoBlocks;
    }
    let width = field.len();
    let bytes = blocks.to_be_bytes();
    cdb[field].copy_from_slice(&bytes[4 - width..]);
    WriteFit::Truncated {
        bytes: usize::try_from(u64::from(blocks) * bs).unwrap_or(usize::MAX),
    }
}

/// The residual a status reports (RFC 7143 §11.4.5.1): EDTL against the bytes the CDB
/// transfers (data-out) or the device server produced (data-in); positive is an underflow,
/// negative an overflow, the form [`super::target::Connection::complete_with_residual`] takes.
#[must_use]
pub fn residual(transferred: u64, edtl: u64) -> i64 {
    let d = i128::from(edtl) - i128::from(transferred);
    i64::try_from(d.clamp(i128::from(i64::MIN), i128::from(i64::MAX))).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_a_write_whose_edtl_covers_its_transfer() {
        let mut cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 2, 0];
        assert_eq!(
            fit_write(&mut cdb, Some(7..9), 512, 1024, 1536),
            WriteFit::Whole
        );
        assert_eq!(cdb[8], 2, "the CDB is left alone");
        assert_eq!(residual(1024, 1536), 512);
    }

    #[test]
    fn truncates_an_overflowing_block_write_to_the_whole_blocks_edtl_covers() {
        for (mut cdb, at) in [
            (vec![0x2a, 0, 0, 0, 0, 0, 0, 0, 4, 0], 7..9),
            (vec![0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0], 6..10),
            (
                vec![0x8a, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0],
                10..14,
            ),
        ] {
            assert_eq!(
                fit_write(&mut cdb, Some(at.clone()), 512, 2048, 1100),
                WriteFit::Truncated { bytes: 1024 }
            );
            let len = cdb[at].iter().fold(0u32, |a, b| a << 8 | u32::from(*b));
            assert_eq!(len, 2, "opcode {:#x}", cdb[0]);
        }
        assert_eq!(residual(2048, 1100), -948);
    }

    #[test]
    fn answers_a_block_write_whose_edtl_covers_no_block_without_writing() {
        let mut cdb = [0x2a, 0, 0, 0, 0, 0, 0, 0, 1, 0];
        assert_eq!(
            fit_write(&mut cdb, Some(7..9), 512, 512, 100),
            WriteFit::NoBlocks
        );
        let mut w6 = [0x0a, 0, 0, 0, 1, 0];
        assert_eq!(
            fit_write(&mut w6, Some(4..5), 512, 512, 0),
            WriteFit::NoBlocks
        );
        // WRITE(6)'s one-byte count cannot say 256 or more blocks.
        let mut w6 = [0x0a, 0, 0, 0, 0, 0];
        assert_eq!(
            fit_write(&mut w6, Some(4..5), 512, 512 * 300, 512 * 256),
            WriteFit::Refused
        );
    }

    #[test]
    fn rejects_an_overflowing_write_that_is_not_a_block_write() {
        // MODE SELECT(10) with a parameter list longer than EDTL.
        let mut cdb = [0x55, 0x10, 0, 0, 0, 0, 0, 0, 24, 0];
        assert_eq!(fit_write(&mut cdb, None, 512, 24, 12), WriteFit::Refused);
    }
}
