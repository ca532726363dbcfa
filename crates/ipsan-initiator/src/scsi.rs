//! The SCSI side of the initiator: CDBs it builds (SBC-4, SPC-5) and what it decodes from the
//! target's answers (sense data, INQUIRY, READ CAPACITY, REPORT LUNS).

use std::fmt;

/// SCSI status codes (SAM-5 §5.3).
pub mod status {
    pub const GOOD: u8 = 0x00;
    pub const CHECK_CONDITION: u8 = 0x02;
    pub const CONDITION_MET: u8 = 0x04;
    pub const BUSY: u8 = 0x08;
    pub const RESERVATION_CONFLICT: u8 = 0x18;
    pub const TASK_SET_FULL: u8 = 0x28;
    pub const ACA_ACTIVE: u8 = 0x30;
    pub const TASK_ABORTED: u8 = 0x40;
}

/// Decoded sense data (SPC-5 §4.4): key, additional sense code and qualifier, and the
/// information field when valid (for a range error, usually the offending LBA).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sense {
    pub key: u8,
    pub asc: u8,
    pub ascq: u8,
    pub information: Option<u64>,
}

impl Sense {
    /// ILLEGAL REQUEST (SPC-5 Table 51).
    pub const KEY_ILLEGAL_REQUEST: u8 = 0x05;
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE (ASC/ASCQ 21h/00h).
    pub const ASC_LBA_OUT_OF_RANGE: (u8, u8) = (0x21, 0x00);

    /// Parse fixed (70h/71h) or descriptor (72h/73h) format sense data. `None` when the buffer
    /// is too short or the response code is unknown.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let code = buf.first()? & 0x7f;
        match code {
            0x70 | 0x71 => {
                if buf.len() < 14 {
                    // Some targets send only 8 bytes + key; take what is there.
                    let key = buf.get(2)? & 0x0f;
                    return Some(Self {
                        key,
                        asc: buf.get(12).copied().unwrap_or(0),
                        ascq: buf.get(13).copied().unwrap_or(0),
                        information: None,
                    });
                }
                let valid = buf[0] & 0x80 != 0;
                let info = u32::from_be_bytes([buf[3], buf[4], buf[5], buf[6]]);
                Some(Self {
                    key: buf[2] & 0x0f,
                    asc: buf[12],
                    ascq: buf[13],
                    information: valid.then_some(u64::from(info)),
                })
            }
            0x72 | 0x73 => {
                if buf.len() < 4 {
                    return None;
                }
                let mut information = None;
                // Descriptors start at byte 8; the information descriptor is type 00h.
                let add_len = usize::from(buf.get(7).copied().unwrap_or(0));
                let end = (8 + add_len).min(buf.len());
                let mut i = 8;
                while i + 2 <= end {
                    let dtype = buf[i];
                    let dlen = usize::from(buf[i + 1]);
                    if dtype == 0 && dlen >= 0x0a && i + 12 <= end && buf[i + 2] & 0x80 != 0 {
                        let mut b = [0u8; 8];
                        b.copy_from_slice(&buf[i + 4..i + 12]);
                        information = Some(u64::from_be_bytes(b));
                    }
                    i += 2 + dlen;
                }
                Some(Self {
                    key: buf[1] & 0x0f,
                    asc: buf[2],
                    ascq: buf[3],
                    information,
                })
            }
            _ => None,
        }
    }

    /// Whether this is ILLEGAL REQUEST / LBA OUT OF RANGE.
    pub fn is_lba_out_of_range(&self) -> bool {
        self.key == Self::KEY_ILLEGAL_REQUEST && (self.asc, self.ascq) == Self::ASC_LBA_OUT_OF_RANGE
    }

    fn key_name(&self) -> &'static str {
        match self.key {
            0x0 => "NO SENSE",
            0x1 => "RECOVERED ERROR",
            0x2 => "NOT READY",
            0x3 => "MEDIUM ERROR",
            0x4 => "HARDWARE ERROR",
            0x5 => "ILLEGAL REQUEST",
            0x6 => "UNIT ATTENTION",
            0x7 => "DATA PROTECT",
            0x8 => "BLANK CHECK",
            0xb => "ABORTED COMMAND",
            0xe => "MISCOMPARE",
            _ => "OTHER",
        }
    }
}

impl fmt::Display for Sense {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} (key {:#x}), ASC/ASCQ {:02x}h/{:02x}h",
            self.key_name(),
            self.key,
            self.asc,
            self.ascq
        )?;
        if self.is_lba_out_of_range() {
            f.write_str(" LOGICAL BLOCK ADDRESS OUT OF RANGE")?;
        }
        if let Some(i) = self.information {
            write!(f, ", information {i}")?;
        }
        Ok(())
    }
}

/// READ(16) (SBC-4 §5.16). We always use the 16-byte form: no 2 TiB ceiling, one code path.
pub fn read16(lba: u64, blocks: u32) -> [u8; 16] {
    rw16(0x88, lba, blocks, false)
}

/// WRITE(16) (SBC-4 §5.40), optionally with FUA (force unit access).
pub fn write16(lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    rw16(0x8a, lba, blocks, fua)
}

fn rw16(op: u8, lba: u64, blocks: u32, fua: bool) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = op;
    if fua {
        c[1] = 0x08;
    }
    c[2..10].copy_from_slice(&lba.to_be_bytes());
    c[10..14].copy_from_slice(&blocks.to_be_bytes());
    c
}

/// SYNCHRONIZE CACHE(10) over the whole medium (SBC-4 §5.24).
pub fn sync_cache10() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x35;
    c
}

/// INQUIRY, standard data (SPC-5 §6.7).
pub fn inquiry(alloc: u16) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x12;
    c[3..5].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// READ CAPACITY(16) (SBC-4 §5.20).
pub fn read_capacity16() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x9e;
    c[1] = 0x10;
    c[10..14].copy_from_slice(&32u32.to_be_bytes());
    c
}

/// READ CAPACITY(10) (SBC-4 §5.18), the fallback for targets without (16).
pub fn read_capacity10() -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0x25;
    c
}

/// REPORT LUNS (SPC-5 §6.33).
pub fn report_luns(alloc: u32) -> [u8; 16] {
    let mut c = [0u8; 16];
    c[0] = 0xa0;
    c[6..10].copy_from_slice(&alloc.to_be_bytes());
    c
}

/// Standard INQUIRY data, the parts people look at.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Inquiry {
    pub peripheral_type: u8,
    pub vendor: String,
    pub product: String,
    pub revision: String,
}

impl Inquiry {
    /// Parse standard INQUIRY data (SPC-5 §6.7.2); needs at least 36 bytes.
    pub fn parse(b: &[u8]) -> Option<Self> {
        if b.len() < 36 {
            return None;
        }
        let s = |r: std::ops::Range<usize>| String::from_utf8_lossy(&b[r]).trim().to_owned();
        Some(Self {
            peripheral_type: b[0] & 0x1f,
            vendor: s(8..16),
            product: s(16..32),
            revision: s(32..36),
        })
    }
}

/// Capacity of a logical unit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    /// Number of logical blocks (last LBA + 1).
    pub blocks: u64,
    /// Logical block length in bytes.
    pub block_len: u32,
}

impl Capacity {
    pub fn bytes(&self) -> u64 {
        self.blocks.saturating_mul(u64::from(self.block_len))
    }

    /// Parse READ CAPACITY(16) parameter data.
    pub fn parse16(b: &[u8]) -> Option<Self> {
        if b.len() < 12 {
            return None;
        }
        let mut l = [0u8; 8];
        l.copy_from_slice(&b[0..8]);
        Some(Self {
            blocks: u64::from_be_bytes(l).checked_add(1)?,
            block_len: u32::from_be_bytes([b[8], b[9], b[10], b[11]]),
        })
    }

    /// Parse READ CAPACITY(10) parameter data.
    pub fn parse10(b: &[u8]) -> Option<Self> {
        if b.len() < 8 {
            return None;
        }
        Some(Self {
            blocks: u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])) + 1,
            block_len: u32::from_be_bytes([b[4], b[5], b[6], b[7]]),
        })
    }
}

/// Parse REPORT LUNS parameter data into LUN numbers (single-level peripheral and flat
/// addressing, SAM-5 §4.7).
pub fn parse_report_luns(b: &[u8]) -> Vec<u64> {
    if b.len() < 8 {
        return Vec::new();
    }
    let len = u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize;
    b[8..]
        .chunks_exact(8)
        .take(len / 8)
        .map(|e| {
            let method = e[0] >> 6;
            let hi = u64::from(e[0] & 0x3f);
            match method {
                0 | 1 => (hi << 8) | u64::from(e[1]),
                _ => u64::from_be_bytes([e[0], e[1], e[2], e[3], e[4], e[5], e[6], e[7]]),
            }
        })
        .collect()
}

/// Encode a LUN into the 8-byte iSCSI LUN field (SAM-5 §4.7: peripheral addressing below 256,
/// flat space addressing up to 16383).
pub fn encode_lun(lun: u16) -> u64 {
    let v: u64 = if lun < 256 {
        u64::from(lun) << 48
    } else {
        (0x4000 | u64::from(lun & 0x3fff)) << 48
    };
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_fixed_sense_lba_out_of_range() {
        let mut s = [0u8; 18];
        s[0] = 0xf0;
        s[2] = 0x05;
        s[3..7].copy_from_slice(&1234u32.to_be_bytes());
        s[7] = 10;
        s[12] = 0x21;
        let sense = Sense::parse(&s).unwrap();
        assert!(sense.is_lba_out_of_range());
        assert_eq!(sense.information, Some(1234));
        assert!(sense.to_string().contains("OUT OF RANGE"));
    }

    #[test]
    fn parses_descriptor_sense() {
        let mut s = vec![0x72, 0x05, 0x21, 0x00, 0, 0, 0, 12];
        s.extend_from_slice(&[0x00, 0x0a, 0x80, 0]);
        s.extend_from_slice(&99u64.to_be_bytes());
        let sense = Sense::parse(&s).unwrap();
        assert!(sense.is_lba_out_of_range());
        assert_eq!(sense.information, Some(99));
    }

    #[test]
    fn rejects_garbage_sense() {
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x12, 0, 0]), None);
        assert_eq!(Sense::parse(&[0x72, 0]), None);
        // a descriptor length running past the end must not panic
        assert!(Sense::parse(&[0x72, 5, 0x21, 0, 0, 0, 0, 200, 0, 250, 0x80]).is_some());
    }

    #[test]
    fn builds_rw16_cdbs() {
        let c = write16(0x0102_0304_0506_0708, 16, true);
        assert_eq!(c[0], 0x8a);
        assert_eq!(c[1], 0x08);
        assert_eq!(&c[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&c[10..14], &[0, 0, 0, 16]);
        assert_eq!(read16(0, 1)[0], 0x88);
        assert_eq!(ipsan_seal::cdb::extent(&c), (0x0102_0304_0506_0708, 16));
        assert_eq!(ipsan_seal::cdb::extent(&inquiry(96)), (0, 0));
    }

    #[test]
    fn parses_capacity_and_luns() {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&2047u64.to_be_bytes());
        b[8..12].copy_from_slice(&512u32.to_be_bytes());
        let c = Capacity::parse16(&b).unwrap();
        assert_eq!((c.blocks, c.block_len, c.bytes()), (2048, 512, 1 << 20));
        let mut r = vec![0, 0, 0, 16, 0, 0, 0, 0];
        r.extend_from_slice(&encode_lun(0).to_be_bytes());
        r.extend_from_slice(&encode_lun(300).to_be_bytes());
        assert_eq!(parse_report_luns(&r), vec![0, 300]);
    }
}
