//! REPORT SUPPORTED OPERATION CODES (SPC-4 §6.35): the table of what `cdb::parse` accepts,
//! with the CDB usage bitmaps (bits a client may set) and command timeout descriptors.

use crate::config::Unit;
use crate::sense::Sense;

/// One supported command.
struct Entry {
    opcode: u8,
    sa: Option<u16>,
    /// CDB usage data: byte 0 is the opcode, each other byte marks the bits in use.
    usage: &'static [u8],
    /// Needs thin provisioning (UNMAP).
    thin_only: bool,
}

const fn e(opcode: u8, usage: &'static [u8]) -> Entry {
    Entry {
        opcode,
        sa: None,
        usage,
        thin_only: false,
    }
}
const fn s(opcode: u8, sa: u16, usage: &'static [u8]) -> Entry {
    Entry {
        opcode,
        sa: Some(sa),
        usage,
        thin_only: false,
    }
}

const F: u8 = 0xFF;

#[rustfmt::skip]
const TABLE: &[Entry] = &[
    e(0x00, &[0x00, 0, 0, 0, 0, 0]),
    e(0x03, &[0x03, 0x01, 0, 0, F, 0]),
    e(0x08, &[0x08, 0x1F, F, F, F, 0]),
    e(0x0A, &[0x0A, 0x1F, F, F, F, 0]),
    e(0x12, &[0x12, 0x01, F, F, F, 0]),
    e(0x15, &[0x15, 0x11, 0, 0, F, 0]),
    e(0x16, &[0x16, 0, 0, 0, 0, 0]),
    e(0x17, &[0x17, 0, 0, 0, 0, 0]),
    e(0x1A, &[0x1A, 0x08, F, F, F, 0]),
    e(0x1B, &[0x1B, 0x01, 0, 0x0F, 0xF7, 0]),
    e(0x1E, &[0x1E, 0, 0, 0, 0x03, 0]),
    e(0x25, &[0x25, 0, F, F, F, F, 0, 0, 0x01, 0]),
    e(0x28, &[0x28, 0x1E, F, F, F, F, 0x1F, F, F, 0]),
    e(0x2A, &[0x2A, 0x1A, F, F, F, F, 0x1F, F, F, 0]),
    e(0x2E, &[0x2E, 0x12, F, F, F, F, 0x1F, F, F, 0]),
    e(0x2F, &[0x2F, 0x16, F, F, F, F, 0x1F, F, F, 0]),
    e(0x34, &[0x34, 0x02, F, F, F, F, 0x1F, F, F, 0]),
    e(0x35, &[0x35, 0x02, F, F, F, F, 0x1F, F, F, 0]),
    e(0x37, &[0x37, 0, 0x1F, 0, 0, 0, 0, F, F, 0]),
    e(0x41, &[0x41, 0x08, F, F, F, F, 0x1F, F, F, 0]),
    Entry { opcode: 0x42, sa: None, usage: &[0x42, 0, 0, 0, 0, 0, 0x1F, F, F, 0], thin_only: true },
    e(0x55, &[0x55, 0x11, 0, 0, 0, 0, 0, F, F, 0]),
    e(0x5A, &[0x5A, 0x18, F, F, 0, 0, 0, F, F, 0]),
    s(0x5E, 0x00, &[0x5E, 0x1F, 0, 0, 0, 0, 0, F, F, 0]),
    s(0x5E, 0x01, &[0x5E, 0x1F, 0, 0, 0, 0, 0, F, F, 0]),
    s(0x5E, 0x02, &[0x5E, 0x1F, 0, 0, 0, 0, 0, F, F, 0]),
    s(0x5E, 0x03, &[0x5E, 0x1F, 0, 0, 0, 0, 0, F, F, 0]),
    s(0x5F, 0x00, &[0x5F, 0x1F, F, 0, 0, F, F, F, F, 0]),
    s(0x5F, 0x01, &[0x5F, 0x1F, F, 0, 0, F, F, F, F, 0]),
    s(0x5F, 0x02, &[0x5F, 0x1F, F, 0, 0, F, F, F, F, 0]),
    s(0x5F, 0x03, &[0x5F, 0x1F, F, 0, 0, F, F, F, F, 0]),
    s(0x5F, 0x04, &[0x5F, 0x1F, F, 0, 0, F, F, F, F, 0]),
    s(0x5F, 0x06, &[0x5F, 0x1F, F, 0, 0, F, F, F, F, 0]),
    e(0x88, &[0x88, 0x1E, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0x89, &[0x89, 0x18, F, F, F, F, F, F, F, F, 0, 0, 0, F, 0x1F, 0]),
    e(0x8A, &[0x8A, 0x1A, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0x8B, &[0x8B, 0x18, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0x8E, &[0x8E, 0x12, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0x8F, &[0x8F, 0x16, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0x90, &[0x90, 0x02, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0x91, &[0x91, 0x02, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0x93, &[0x93, 0x09, F, F, F, F, F, F, F, F, F, F, F, F, 0x1F, 0]),
    s(0x9E, 0x10, &[0x9E, 0x1F, 0, 0, 0, 0, 0, 0, 0, 0, F, F, F, F, 0, 0]),
    s(0x9E, 0x12, &[0x9E, 0x1F, F, F, F, F, F, F, F, F, F, F, F, F, 0, 0]),
    e(0xA0, &[0xA0, 0, F, 0, 0, 0, F, F, F, F, 0, 0]),
    s(0xA3, 0x0C, &[0xA3, 0x1F, 0x87, F, F, F, F, F, F, F, 0, 0]),
    e(0xA8, &[0xA8, 0x1E, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0xAA, &[0xAA, 0x1A, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0xAE, &[0xAE, 0x12, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0xAF, &[0xAF, 0x16, F, F, F, F, F, F, F, F, 0x1F, 0]),
    e(0xB7, &[0xB7, 0x1F, 0, 0, 0, 0, F, F, F, F, 0, 0]),
];

/// Command timeouts descriptor (SPC-4 §6.35.4): no nominal timeout, 30 s recommended.
fn timeouts() -> [u8; 12] {
    let mut t = [0u8; 12];
    t[0..2].copy_from_slice(&0x0Au16.to_be_bytes());
    t[8..12].copy_from_slice(&30u32.to_be_bytes());
    t
}

/// Whether the opcode (any service action) is in the table for this LU.
fn has_service_actions(opcode: u8) -> bool {
    TABLE.iter().any(|e| e.opcode == opcode && e.sa.is_some())
}

/// REPORT SUPPORTED OPERATION CODES parameter data (before allocation-length truncation).
pub fn report(
    lu: &dyn Unit,
    rctd: bool,
    options: u8,
    opcode: u8,
    sa: u16,
) -> Result<Vec<u8>, Sense> {
    // A shared store without a shared reservation store refuses RESERVE(6), RELEASE(6) and PERSISTENT RESERVE OUT; a store
    // whose atomic compare-and-write is smaller than a block refuses COMPARE AND WRITE.
    let refused = |op: u8| {
        (lu.refuses_reservations() && matches!(op, 0x16 | 0x17 | 0x5F))
            || (op == 0x89 && lu.limits().max_compare_and_write == 0)
    };
    let entries = || {
        TABLE
            .iter()
            .filter(|e| (!e.thin_only || lu.thin()) && !refused(e.opcode))
    };
    if options == 0 {
        let mut body = Vec::new();
        for e in entries() {
            body.push(e.opcode);
            body.push(0);
            body.extend_from_slice(&e.sa.unwrap_or(0).to_be_bytes());
            body.push(0);
            body.push(if rctd { 0x02 } else { 0 } | u8::from(e.sa.is_some()));
            body.extend_from_slice(&(e.usage.len() as u16).to_be_bytes());
            if rctd {
                body.extend_from_slice(&timeouts());
            }
        }
        let mut v = (body.len() as u32).to_be_bytes().to_vec();
        v.extend(body);
        return Ok(v);
    }
    let with_sa = has_service_actions(opcode);
    let found = match options {
        1 if with_sa => return Err(Sense::invalid_field_in_cdb_at(2, Some(2))),
        1 => entries().find(|e| e.opcode == opcode),
        2 if !with_sa => return Err(Sense::invalid_field_in_cdb_at(2, Some(2))),
        2 => entries().find(|e| e.opcode == opcode && e.sa == Some(sa)),
        // 3: match on the service action only when the opcode has service actions.
        _ => entries().find(|e| e.opcode == opcode && (!with_sa || e.sa == Some(sa))),
    };
    let Some(e) = found else {
        // SUPPORT 001b: not supported.
        return Ok(vec![0, 0x01, 0, 0]);
    };
    let mut v = vec![0, if rctd { 0x80 } else { 0 } | 0x03];
    v.extend_from_slice(&(e.usage.len() as u16).to_be_bytes());
    v.extend_from_slice(e.usage);
    if rctd {
        v.extend_from_slice(&timeouts());
    }
    Ok(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn table_usage_starts_with_opcode_and_matches_group_length() {
        for e in TABLE {
            assert_eq!(e.usage[0], e.opcode);
            assert_eq!(
                Some(e.usage.len()),
                crate::cdb::cdb_len(e.opcode),
                "{:#x}",
                e.opcode
            );
        }
    }

    #[test]
    fn reports_exactly_the_opcodes_of_the_one_opcode_table() {
        let mut listed: Vec<u8> = TABLE.iter().map(|e| e.opcode).collect();
        listed.dedup();
        let known: Vec<u8> = crate::cdb::OPS.iter().map(|e| e.opcode).collect();
        let mut known_sorted = known.clone();
        known_sorted.sort_unstable();
        assert_eq!(listed, known_sorted);
    }

    #[test]
    fn every_listed_opcode_parses() {
        for e in TABLE {
            let mut cdb = vec![0u8; 16];
            cdb[0] = e.opcode;
            if let Some(sa) = e.sa {
                cdb[1] = sa as u8;
            }
            if e.opcode == 0xA3 {
                cdb[2] = 0;
            }
            assert!(
                !matches!(crate::cdb::parse(&cdb), Err(ref s) if s.asc == 0x20),
                "{:#x}/{:?} listed but rejected as invalid opcode",
                e.opcode,
                e.sa
            );
        }
    }
}
