//! The SCSI side of the initiator: the CDBs it sends (SBC-4, SPC-5; built by
//! `ipsan_scsi::cdb::build`) and what it decodes from the target's answers (sense data,
//! INQUIRY, READ CAPACITY, REPORT LUNS).

// Sense data, status codes and LUN encoding are ipsan-scsi's, shared with the target.
pub use ipsan_scsi::{encode_lun, ScsiStatus, Sense, SenseKey};

// The CDBs we send are built by ipsan-scsi, beside the decoder the target parses them with.
pub use ipsan_scsi::cdb::build::{
    inquiry, read16, read_capacity10, read_capacity16, report_luns, sync_cache10, test_unit_ready,
    write16,
};

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_binds_the_extent_of_the_cdbs_we_send() {
        let c = write16(0x0102_0304_0506_0708, 16, true);
        assert_eq!(c[0], ipsan_scsi::cdb::op::WRITE_16);
        assert_eq!(c[1], 0x08);
        assert_eq!(&c[2..10], &[1, 2, 3, 4, 5, 6, 7, 8]);
        assert_eq!(&c[10..14], &[0, 0, 0, 16]);
        assert_eq!(read16(0, 1)[0], ipsan_scsi::cdb::op::READ_16);
        assert_eq!(ipsan_scsi::cdb::extent(&c), (0x0102_0304_0506_0708, 16));
        assert_eq!(ipsan_scsi::cdb::extent(&inquiry(96)), (0, 0));
    }

    #[test]
    fn every_built_cdb_decodes_as_the_command_it_names() {
        let name = |c: [u8; 16]| ipsan_scsi::cdb::decode(&c, 512).unwrap().name();
        assert_eq!(name(read16(1, 2)), "READ(16)");
        assert_eq!(name(write16(1, 2, false)), "WRITE(16)");
        assert_eq!(name(test_unit_ready()), "TEST UNIT READY");
        assert_eq!(name(sync_cache10()), "SYNCHRONIZE CACHE(10)");
        assert_eq!(name(inquiry(96)), "INQUIRY");
        assert_eq!(name(read_capacity16()), "SERVICE ACTION IN(16)");
        assert_eq!(name(read_capacity10()), "READ CAPACITY(10)");
        assert_eq!(name(report_luns(4096)), "REPORT LUNS");
    }

    #[test]
    fn parses_capacity_and_luns() {
        let mut b = [0u8; 32];
        b[0..8].copy_from_slice(&2047u64.to_be_bytes());
        b[8..12].copy_from_slice(&512u32.to_be_bytes());
        let c = Capacity::parse16(&b).unwrap();
        assert_eq!((c.blocks, c.block_len, c.bytes()), (2048, 512, 1 << 20));
        let mut r = vec![0, 0, 0, 16, 0, 0, 0, 0];
        r.extend_from_slice(&encode_lun(0));
        r.extend_from_slice(&encode_lun(300));
        assert_eq!(parse_report_luns(&r), vec![0, 300]);
    }
}
