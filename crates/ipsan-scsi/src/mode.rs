//! MODE SENSE / MODE SELECT (SPC-4 §6.9–§6.12) with the caching (08h, SBC-4 §6.5.5),
//! control (0Ah, SPC-4 §7.5.8) and informational exceptions control (1Ch, SPC-4 §7.5.14)
//! pages. Only WCE is changeable; nothing can be saved.

use crate::config::Unit;
use crate::response::NexusId;
use crate::sense::Sense;

/// Page control values (SPC-4 table 99).
const PC_CURRENT: u8 = 0;
const PC_CHANGEABLE: u8 = 1;
const PC_DEFAULT: u8 = 2;
const PC_SAVED: u8 = 3;

const PAGE_CACHING: u8 = 0x08;
const PAGE_CONTROL: u8 = 0x0A;
const PAGE_IEC: u8 = 0x1C;
const PAGE_ALL: u8 = 0x3F;

/// The page in the given page control form, including its 2-byte header.
fn page(lu: &dyn Unit, code: u8, pc: u8) -> Option<Vec<u8>> {
    let mut p = match code {
        PAGE_CACHING => {
            let mut p = vec![0u8; 20];
            p[1] = 0x12;
            let wce = match pc {
                PC_CHANGEABLE => true,
                PC_DEFAULT => lu.config().write_cache,
                _ => lu.write_cache(),
            };
            if wce {
                p[2] |= 0x04;
            }
            p
        }
        PAGE_CONTROL => {
            let mut p = vec![0u8; 12];
            p[1] = 0x0A;
            if pc != PC_CHANGEABLE {
                // TST 000b, D_SENSE 0; QUEUE ALGORITHM MODIFIER 1 (unrestricted), QERR 00b;
                // TAS 1 (aborted tasks get TASK ABORTED); BUSY TIMEOUT unlimited.
                p[3] = 0x10;
                p[5] = 0x40;
                p[8] = 0xFF;
                p[9] = 0xFF;
            }
            p
        }
        PAGE_IEC => {
            let mut p = vec![0u8; 12];
            p[1] = 0x0A;
            if pc != PC_CHANGEABLE {
                p[2] = 0x08; // DEXCPT: exception reporting disabled
            }
            p
        }
        _ => return None,
    };
    p[0] = code; // PS 0: not savable
    Some(p)
}

/// MODE SENSE(6)/(10) parameter data.
pub fn sense(
    lu: &dyn Unit,
    ten: bool,
    dbd: bool,
    llbaa: bool,
    pc: u8,
    code: u8,
    subpage: u8,
) -> Result<Vec<u8>, Sense> {
    if pc == PC_SAVED {
        return Err(Sense::saving_parameters_not_supported());
    }
    let pages: Vec<u8> = match (code, subpage) {
        (PAGE_ALL, 0x00 | 0xFF) => [PAGE_CACHING, PAGE_CONTROL, PAGE_IEC]
            .iter()
            .filter_map(|&c| page(lu, c, pc))
            .flatten()
            .collect(),
        (c, 0x00) => page(lu, c, pc).ok_or_else(|| Sense::invalid_field_in_cdb_at(2, Some(5)))?,
        _ => return Err(Sense::invalid_field_in_cdb_at(3, None)),
    };
    let nblocks = lu.num_blocks();
    let bs = lu.block_size();
    let bd: Vec<u8> = if dbd {
        Vec::new()
    } else if ten && llbaa {
        let mut d = nblocks.to_be_bytes().to_vec();
        d.extend_from_slice(&[0; 4]);
        d.extend_from_slice(&bs.to_be_bytes());
        d
    } else {
        // Short descriptor: NUMBER OF BLOCKS saturates at FFFFFFFFh (SBC-4 §6.4.2).
        let n = u32::try_from(nblocks).unwrap_or(u32::MAX);
        let mut d = n.to_be_bytes().to_vec();
        d.push(0);
        d.extend_from_slice(&bs.to_be_bytes()[1..]);
        d
    };
    // Device-specific parameter (SBC-4 §6.4.1): WP, DPOFUA.
    let dsp = if lu.config().read_only { 0x80 } else { 0 } | 0x10;
    let mut v = if ten {
        let mut h = vec![0u8; 8];
        h[3] = dsp;
        if llbaa && !dbd {
            h[4] = 0x01; // LONGLBA
        }
        h[6..8].copy_from_slice(&(bd.len() as u16).to_be_bytes());
        h
    } else {
        vec![0, 0, dsp, bd.len() as u8]
    };
    v.extend_from_slice(&bd);
    v.extend_from_slice(&pages);
    if ten {
        let l = (v.len() - 2) as u16;
        v[0..2].copy_from_slice(&l.to_be_bytes());
    } else {
        v[0] = (v.len() - 1) as u8;
    }
    Ok(v)
}

/// MODE SELECT(6)/(10): validates the whole list before changing anything; only the caching
/// page's WCE may differ from the current values.
pub fn select(
    lu: &dyn Unit,
    nexus: &NexusId,
    ten: bool,
    _pf: bool,
    sp: bool,
    data: &[u8],
) -> Result<(), Sense> {
    if sp {
        // No savable pages (SPC-4 §6.9).
        return Err(Sense::invalid_field_in_cdb_at(1, Some(0)));
    }
    if data.is_empty() {
        return Ok(());
    }
    let hdr = if ten { 8 } else { 4 };
    if data.len() < hdr {
        return Err(Sense::parameter_list_length_error());
    }
    let bdl = if ten {
        usize::from(u16::from_be_bytes([data[6], data[7]]))
    } else {
        usize::from(data[3])
    };
    let mut pos = hdr;
    let Some(bd) = data.get(pos..pos + bdl) else {
        return Err(Sense::parameter_list_length_error());
    };
    // Block descriptors may restate, not change, the capacity and block length.
    let long = ten && data[4] & 0x01 != 0;
    let step = if long { 16 } else { 8 };
    if bdl % step != 0 {
        return Err(Sense::invalid_field_in_parameter_list_at(
            if ten { 6 } else { 3 },
            None,
        ));
    }
    for d in bd.chunks(step) {
        let blen = if long {
            u32::from_be_bytes([d[12], d[13], d[14], d[15]])
        } else {
            u32::from_be_bytes([0, d[5], d[6], d[7]])
        };
        if blen != lu.block_size() {
            return Err(Sense::invalid_field_in_parameter_list_at(pos as u16, None));
        }
    }
    pos += bdl;
    let mut new_wce = None;
    while pos < data.len() {
        let p = &data[pos..];
        if p.len() < 2 {
            return Err(Sense::parameter_list_length_error());
        }
        if p[0] & 0x40 != 0 {
            // SPF: no subpages here.
            return Err(Sense::invalid_field_in_parameter_list_at(
                pos as u16,
                Some(6),
            ));
        }
        let code = p[0] & 0x3F;
        let len = usize::from(p[1]) + 2;
        let Some(p) = p.get(..len) else {
            return Err(Sense::parameter_list_length_error());
        };
        let (Some(cur), Some(chg)) = (page(lu, code, PC_CURRENT), page(lu, code, PC_CHANGEABLE))
        else {
            return Err(Sense::invalid_field_in_parameter_list_at(
                pos as u16,
                Some(5),
            ));
        };
        if cur.len() != len {
            return Err(Sense::invalid_field_in_parameter_list_at(
                pos as u16 + 1,
                None,
            ));
        }
        for i in 2..len {
            if (p[i] ^ cur[i]) & !chg[i] != 0 {
                return Err(Sense::invalid_field_in_parameter_list_at(
                    (pos + i) as u16,
                    None,
                ));
            }
        }
        if code == PAGE_CACHING {
            new_wce = Some(p[2] & 0x04 != 0);
        }
        pos += len;
    }
    if let Some(wce) = new_wce {
        if wce != lu.write_cache() {
            lu.change_write_cache(wce, nexus)?;
        }
    }
    Ok(())
}
