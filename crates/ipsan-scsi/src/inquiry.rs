//! INQUIRY data: the standard page (SPC-4 §6.6.2) and the VPD pages (SPC-4 §7.8, SBC-4
//! §6.6): 00h supported pages, 80h unit serial number, 83h device identification, B0h block
//! limits, B1h block device characteristics, B2h logical block provisioning.

pub use crate::config::device_id_from;
use crate::config::{LuConfig, Unit};
use crate::sense::Sense;

/// VPD pages we answer, ascending (SPC-4 §7.8.18 requires ascending order).
pub const VPD_PAGES: [u8; 6] = [0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2];

/// Version descriptors (SPC-4 table 147 / T10 list): SAM-5, SPC-4, SBC-3, iSCSI.
const VERSION_DESCRIPTORS: [u16; 4] = [0x00A0, 0x0460, 0x04C0, 0x0960];

fn pad_ascii(out: &mut Vec<u8>, s: &str, n: usize) {
    let b = s.as_bytes();
    for i in 0..n {
        out.push(*b.get(i).unwrap_or(&b' '));
    }
}

/// Standard INQUIRY data, 96 bytes (SPC-4 table 142).
pub fn standard(cfg: &LuConfig) -> Vec<u8> {
    let mut v = Vec::with_capacity(96);
    v.push(0x00); // qualifier 000b, direct access block device
    v.push(0x00); // RMB 0: not removable
    v.push(0x06); // VERSION: SPC-4
    v.push(0x10 | 0x02); // HISUP, RESPONSE DATA FORMAT 2
    v.push(0); // ADDITIONAL LENGTH, set below
    v.push(0x00); // SCCS ACC TPGS 3PC PROTECT all 0
    v.push(0x00);
    v.push(0x02); // CMDQUE
    pad_ascii(&mut v, &cfg.vendor, 8);
    pad_ascii(&mut v, &cfg.product, 16);
    pad_ascii(&mut v, &cfg.revision, 4);
    v.resize(58, 0); // vendor specific 36..56, byte 56 clocking, 57 reserved
    for d in VERSION_DESCRIPTORS {
        v.extend_from_slice(&d.to_be_bytes());
    }
    v.resize(96, 0);
    v[4] = (v.len() - 5) as u8;
    v
}

/// A designation descriptor (SPC-4 §7.8.6.1, table 459).
pub fn designator(code_set: u8, piv_assoc: u8, kind: u8, id: &[u8]) -> Vec<u8> {
    let mut d = vec![
        code_set & 0x0F,
        piv_assoc | (kind & 0x0F),
        0,
        id.len() as u8,
    ];
    d.extend_from_slice(id);
    d
}

/// Relative target port designator (type 4h, association target port, PIV set for iSCSI).
pub fn relative_port_designator(port: u16) -> Vec<u8> {
    let [hi, lo] = port.to_be_bytes();
    designator(0x51, 0x80 | 0x10, 0x4, &[0, 0, hi, lo])
}

/// Target port group designator (type 5h).
pub fn target_port_group_designator(group: u16) -> Vec<u8> {
    let [hi, lo] = group.to_be_bytes();
    designator(0x51, 0x80 | 0x10, 0x5, &[0, 0, hi, lo])
}

/// SCSI name string designator for an iSCSI target port, `"<iqn>,t,0x<tpgt>"`
/// (RFC 7143 §13.13 / SPC-4 §7.8.6.11), UTF-8, NUL-terminated and padded to 4 bytes.
pub fn target_port_designator(target_name: &str, tpgt: u16) -> Vec<u8> {
    let mut s = format!("{target_name},t,0x{tpgt:04x}").into_bytes();
    s.push(0);
    while s.len() % 4 != 0 {
        s.push(0);
    }
    designator(0x53, 0x80 | 0x10, 0x8, &s)
}

/// SCSI name string designator for the target device (association 2h).
pub fn target_device_designator(target_name: &str) -> Vec<u8> {
    let mut s = target_name.as_bytes().to_vec();
    s.push(0);
    while s.len() % 4 != 0 {
        s.push(0);
    }
    designator(0x53, 0x80 | 0x20, 0x8, &s)
}

fn page(code: u8, body: Vec<u8>) -> Vec<u8> {
    let mut v = vec![0x00, code];
    v.extend_from_slice(&(body.len() as u16).to_be_bytes());
    v.extend_from_slice(&body);
    v
}

/// A VPD page, or INVALID FIELD IN CDB for one we do not have.
pub fn vpd(lu: &dyn Unit, code: u8) -> Result<Vec<u8>, Sense> {
    let cfg = lu.config();
    let lim = lu.limits();
    let body = match code {
        0x00 => VPD_PAGES.to_vec(),
        0x80 => cfg.serial.as_bytes().to_vec(),
        0x83 => {
            let mut b = Vec::new();
            let mut naa = cfg.device_id;
            naa[0] = 0x60 | (naa[0] & 0x0F);
            b.extend(designator(0x1, 0x00, 0x3, &naa));
            let mut t10 = Vec::new();
            pad_ascii(&mut t10, &cfg.vendor, 8);
            t10.extend_from_slice(cfg.product.trim_end().as_bytes());
            t10.push(b':');
            t10.extend_from_slice(cfg.serial.as_bytes());
            b.extend(designator(0x2, 0x00, 0x1, &t10));
            for d in &cfg.extra_designators {
                b.extend_from_slice(d);
            }
            b
        }
        0xB0 => {
            let mut b = vec![0u8; 0x3C];
            // b[0]: WSNZ 0 — WRITE SAME with 0 blocks means "to the end".
            b[1] = lim.max_compare_and_write;
            b[2..4].copy_from_slice(&lim.opt_granularity.to_be_bytes());
            b[4..8].copy_from_slice(&lim.max_transfer.to_be_bytes());
            b[8..12].copy_from_slice(&lim.opt_transfer.to_be_bytes()); // OPTIMAL TRANSFER
            b[12..16].copy_from_slice(&lim.max_transfer.to_be_bytes()); // MAX PREFETCH
            b[16..20].copy_from_slice(&lim.max_unmap_lba.to_be_bytes());
            b[20..24].copy_from_slice(&lim.max_unmap_descriptors.to_be_bytes());
            b[24..28].copy_from_slice(&lim.unmap_granularity.to_be_bytes());
            if lu.thin() {
                b[28] = 0x80; // UGAVALID, alignment 0
            }
            b[32..40].copy_from_slice(&lim.max_write_same.to_be_bytes());
            b
        }
        0xB1 => {
            let mut b = vec![0u8; 0x3C];
            b[0..2].copy_from_slice(&1u16.to_be_bytes()); // non-rotating medium
            b
        }
        0xB2 => {
            let mut b = vec![0u8; 4];
            if lu.thin() {
                // LBPU, LBPWS, LBPWS10, LBPRZ=001b (SBC-4 table 262), ANC_SUP 0.
                b[1] = 0x80 | 0x40 | 0x20 | 0x04;
                b[2] = 0x02; // PROVISIONING TYPE: thin
            }
            b
        }
        _ => return Err(Sense::invalid_field_in_cdb_at(2, None)),
    };
    Ok(page(code, body))
}
