//! Target-level helpers: REPORT LUNS (SPC-4 §6.33), answers for an unconfigured LUN
//! (SPC-4 §6.6.2, SAM-5 §5.11), and single level LUN encoding (SAM-5 §4.7).

use crate::cdb::op;
use crate::response::{truncate, ScsiResponse};
use crate::sense::Sense;

/// Encodes a LUN with SAM-5 single level addressing: peripheral device addressing (00b)
/// below 256, flat space addressing (01b) up to 16383. Larger values cannot be encoded in
/// single level form; they are clamped into the flat space's low 14 bits.
pub fn encode_lun(lun: u64) -> [u8; 8] {
    let mut b = [0u8; 8];
    if lun < 256 {
        b[1] = lun as u8;
    } else {
        let l = (lun & 0x3FFF) as u16;
        b[0] = 0x40 | (l >> 8) as u8;
        b[1] = l as u8;
    }
    b
}

/// Decodes the first level of an 8-byte LUN (peripheral or flat space addressing); other
/// address methods decode to their raw 14-bit field.
pub fn decode_lun(raw: [u8; 8]) -> u64 {
    match raw[0] >> 6 {
        0b00 => u64::from(raw[1]) | (u64::from(raw[0] & 0x3F) << 8),
        _ => (u64::from(raw[0] & 0x3F) << 8) | u64::from(raw[1]),
    }
}

/// REPORT LUNS parameter data for `luns`, honouring SELECT REPORT and the allocation length.
pub fn report_luns(luns: &[u64], cdb: &[u8]) -> ScsiResponse {
    if cdb.len() < 12 || cdb[0] != op::REPORT_LUNS {
        return ScsiResponse::check(Sense::invalid_field_in_cdb_at(0, None));
    }
    let select = cdb[2];
    let alloc = u32::from_be_bytes([cdb[6], cdb[7], cdb[8], cdb[9]]);
    report_luns_decoded(luns, select, alloc)
}

/// [`report_luns`] of a decoded REPORT LUNS (`cdb::Command::ReportLuns`).
pub fn report_luns_decoded(luns: &[u64], select: u8, alloc: u32) -> ScsiResponse {
    // SPC-4 §6.33: allocation length below 16 is an error.
    if alloc < 16 {
        return ScsiResponse::check(Sense::invalid_field_in_cdb_at(6, None));
    }
    let list: Vec<u64> = match select {
        0x00 | 0x02 => luns.to_vec(),
        // Only well-known LUNs: we have none.
        0x01 => Vec::new(),
        // 10h/11h/12h: administrative LUN relative selections; no administrative LUNs.
        0x10..=0x12 => Vec::new(),
        _ => return ScsiResponse::check(Sense::invalid_field_in_cdb_at(2, None)),
    };
    let mut v = Vec::with_capacity(8 + 8 * list.len());
    v.extend_from_slice(&((list.len() * 8) as u32).to_be_bytes());
    v.extend_from_slice(&[0; 4]);
    for l in list {
        v.extend_from_slice(&encode_lun(l));
    }
    ScsiResponse::good(truncate(v, alloc))
}

/// Response for a command addressed to a LUN that does not exist (SPC-4 §6.6.2, SAM-5
/// §5.11): INQUIRY answers peripheral qualifier 011b / device type 1Fh, REQUEST SENSE
/// returns LOGICAL UNIT NOT SUPPORTED sense data, REPORT LUNS is the target's job and
/// anything else is CHECK CONDITION ILLEGAL REQUEST 25h/00h.
pub fn no_such_lun(cdb: &[u8]) -> ScsiResponse {
    match cdb.first().copied() {
        Some(op::INQUIRY) if cdb.len() >= 6 => {
            let alloc = u32::from(u16::from_be_bytes([cdb[3], cdb[4]]));
            if cdb[1] & 0x01 != 0 {
                // No VPD for a LUN that is not there.
                return ScsiResponse::check(Sense::lun_not_supported());
            }
            let mut v = vec![0u8; 36];
            v[0] = 0x7F; // qualifier 011b, type 1Fh
            v[2] = 0x06;
            v[3] = 0x02;
            v[4] = 31;
            ScsiResponse::good(truncate(v, alloc))
        }
        Some(op::REQUEST_SENSE) if cdb.len() >= 6 => {
            let s = Sense::lun_not_supported();
            let b = if cdb[1] & 1 != 0 {
                s.to_descriptor()
            } else {
                s.to_fixed()
            };
            ScsiResponse::good(truncate(b, u32::from(cdb[4])))
        }
        _ => ScsiResponse::check(Sense::lun_not_supported()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sense::ScsiStatus;

    fn rl(select: u8, alloc: u32) -> Vec<u8> {
        let mut c = vec![0xA0, 0, select, 0, 0, 0];
        c.extend_from_slice(&alloc.to_be_bytes());
        c.extend_from_slice(&[0, 0]);
        c
    }

    #[test]
    fn encodes_and_decodes_luns() {
        assert_eq!(encode_lun(0), [0; 8]);
        assert_eq!(encode_lun(5), [0, 5, 0, 0, 0, 0, 0, 0]);
        assert_eq!(encode_lun(300), [0x41, 0x2C, 0, 0, 0, 0, 0, 0]);
        for l in [0u64, 1, 255, 256, 1000, 16383] {
            assert_eq!(decode_lun(encode_lun(l)), l);
        }
    }

    #[test]
    fn report_luns_lists_and_truncates() {
        let r = report_luns(&[0, 1, 300], &rl(0, 4096));
        assert_eq!(r.status, ScsiStatus::GOOD);
        assert_eq!(r.data_in.len(), 32);
        assert_eq!(&r.data_in[0..4], &24u32.to_be_bytes());
        assert_eq!(&r.data_in[16..18], &[0, 1]);
        assert_eq!(&r.data_in[24..26], &[0x41, 0x2C]);
        let r = report_luns(&[0, 1, 300], &rl(0, 16));
        assert_eq!(r.data_in.len(), 16);
        assert_eq!(
            &r.data_in[0..4],
            &24u32.to_be_bytes(),
            "length tells the full size"
        );
    }

    #[test]
    fn report_luns_select_report_and_bad_alloc() {
        let r = report_luns(&[0, 1], &rl(1, 64));
        assert_eq!(&r.data_in[0..4], &[0, 0, 0, 0]);
        let r = report_luns(&[0], &rl(0x42, 64));
        assert_eq!(r.status, ScsiStatus::CHECK_CONDITION);
        let r = report_luns(&[0], &rl(0, 8));
        assert_eq!(r.sense.unwrap().asc, 0x24);
    }

    #[test]
    fn no_such_lun_answers_inquiry_request_sense_and_others() {
        let r = no_such_lun(&[0x12, 0, 0, 0, 96, 0]);
        assert_eq!(r.status, ScsiStatus::GOOD);
        assert_eq!(r.data_in[0], 0x7F);
        let r = no_such_lun(&[0x03, 0, 0, 0, 18, 0]);
        assert_eq!(r.status, ScsiStatus::GOOD);
        assert_eq!((r.data_in[12], r.data_in[13]), (0x25, 0));
        let r = no_such_lun(&[0x28, 0, 0, 0, 0, 0, 0, 0, 1, 0]);
        assert_eq!(r.status, ScsiStatus::CHECK_CONDITION);
        assert_eq!(r.sense.unwrap().asc, 0x25);
    }
}
