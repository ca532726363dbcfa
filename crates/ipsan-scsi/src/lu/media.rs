//! [`LogicalUnit`]'s checks of the block commands (range, transfer length, write protection,
//! WRITE SAME and UNMAP parameters) and the commands only the blocking form runs: VERIFY,
//! ORWRITE and GET LBA STATUS (SBC-4). The data path itself is `path.rs`.

use super::{LogicalUnit, ScsiRequest};
use crate::cdb::BlockIo;
use crate::sense::Sense;

impl LogicalUnit {
    pub(super) fn bytes(&self, blocks: u32) -> u64 {
        u64::from(blocks) * u64::from(self.cfg.block_size)
    }

    pub(super) fn offset(&self, lba: u64) -> u64 {
        lba * u64::from(self.cfg.block_size)
    }

    /// LBA range check (SBC-4 §4.5): LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub(crate) fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.num_blocks() && lba < self.num_blocks().max(1) => Ok(()),
            Some(_) if blocks == 0 && lba < self.num_blocks() => Ok(()),
            _ => Err(Sense::lba_out_of_range()),
        }
    }

    pub(super) fn check_transfer(&self, blocks: u32) -> Result<(), Sense> {
        if blocks > self.limits.max_transfer {
            // SBC-4 §4.5: more than MAXIMUM TRANSFER LENGTH is an invalid CDB field.
            return Err(Sense::invalid_field_in_cdb());
        }
        Ok(())
    }

    pub(super) fn check_writable(&self) -> Result<(), Sense> {
        if self.cfg.read_only {
            return Err(Sense::write_protected());
        }
        Ok(())
    }

    pub(super) fn flush_if_needed(&self, fua: bool) -> Result<(), Sense> {
        if fua || !self.write_cache() {
            self.backend
                .flush()
                .map_err(|e| Sense::from_write_error(&e))?;
        }
        Ok(())
    }

    pub(super) fn verify(
        &self,
        req: &ScsiRequest<'_>,
        io: BlockIo,
        bytchk: u8,
    ) -> Result<(), Sense> {
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        if io.blocks == 0 {
            return Ok(());
        }
        let bs = self.cfg.block_size as usize;
        let expect = match bytchk {
            1 => Some(data_out(req, self.bytes(io.blocks))?),
            3 => Some(data_out(req, bs as u64)?),
            _ => None,
        };
        let mut buf = vec![0u8; self.bytes(io.blocks) as usize];
        self.backend
            .read_at(&mut buf, self.offset(io.lba))
            .map_err(|e| Sense::from_read_error(&e))?;
        let Some(expect) = expect else {
            return Ok(());
        };
        let mismatch = if bytchk == 1 {
            first_difference(&buf, expect).map(|o| o as u64)
        } else {
            buf.chunks(bs)
                .enumerate()
                .find_map(|(i, blk)| first_difference(blk, expect).map(|o| (i * bs + o) as u64))
        };
        match mismatch {
            Some(off) => Err(Sense::miscompare(off)),
            None => Ok(()),
        }
    }

    /// The checks of WRITE SAME (SBC-4 §5.43) and what it writes: (the data block, byte
    /// offset, byte length).
    pub(super) fn write_same_plan(
        &self,
        req: &ScsiRequest<'_>,
        io: BlockIo,
        (anchor, lbdata, ndob): (bool, bool, bool),
    ) -> Result<(Vec<u8>, u64, u64), Sense> {
        if anchor {
            return Err(Sense::invalid_field_in_cdb_at(1, Some(4)));
        }
        if lbdata {
            // PBDATA / LBDATA (SBC-3 §5.42): not supported.
            return Err(Sense::invalid_field_in_cdb_at(1, Some(2)));
        }
        self.check_writable()?;
        if io.lba >= self.num_blocks() {
            return Err(Sense::lba_out_of_range());
        }
        // NUMBER OF LOGICAL BLOCKS 0: through the last LBA (SBC-4 §5.43, WSNZ=0).
        let blocks = if io.blocks == 0 {
            self.num_blocks() - io.lba
        } else {
            u64::from(io.blocks)
        };
        self.check_range(io.lba, blocks)?;
        if blocks > self.limits.max_write_same {
            return Err(Sense::invalid_field_in_cdb_at(10, None));
        }
        let bs = self.cfg.block_size as usize;
        let block: Vec<u8> = if ndob {
            vec![0u8; bs]
        } else {
            data_out(req, bs as u64)?.to_vec()
        };
        Ok((block, self.offset(io.lba), blocks * bs as u64))
    }

    /// The checks of UNMAP (SBC-4 §5.28) and its descriptors; `None`: nothing to do.
    pub(super) fn unmap_list(
        &self,
        req: &ScsiRequest<'_>,
        anchor: bool,
        param_len: u32,
    ) -> Result<Option<Vec<(u64, u32)>>, Sense> {
        if !self.thin {
            return Err(Sense::invalid_opcode());
        }
        if anchor {
            return Err(Sense::invalid_field_in_cdb_at(1, Some(0)));
        }
        self.check_writable()?;
        if param_len == 0 {
            return Ok(None);
        }
        if param_len < 8 {
            return Err(Sense::parameter_list_length_error());
        }
        let data = data_out(req, u64::from(param_len))?;
        let list = parse_unmap_list(data)?;
        if list.len() as u64 > u64::from(self.limits.max_unmap_descriptors) {
            return Err(Sense::invalid_field_in_parameter_list_at(2, None));
        }
        let mut total = 0u64;
        for (i, &(lba, n)) in list.iter().enumerate() {
            if lba
                .checked_add(u64::from(n))
                .is_none_or(|e| e > self.num_blocks())
            {
                return Err(Sense::lba_out_of_range());
            }
            if n > self.limits.max_unmap_lba {
                return Err(Sense::invalid_field_in_parameter_list_at(
                    (8 + 16 * i + 8) as u16,
                    None,
                ));
            }
            total += u64::from(n);
        }
        if total > u64::from(self.limits.max_unmap_lba) {
            return Err(Sense::invalid_field_in_parameter_list());
        }
        Ok(Some(list))
    }

    /// ORWRITE(16): read-OR-write under the exclusive I/O lock, so no other write lands
    /// between the read and the write (SBC-4 §5.9).
    pub(super) fn or_write(&self, req: &ScsiRequest<'_>, io: BlockIo) -> Result<(), Sense> {
        self.check_writable()?;
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        if io.blocks == 0 {
            return Ok(());
        }
        let data = data_out(req, self.bytes(io.blocks))?;
        {
            let _excl = self.io_lock.write().unwrap_or_else(|p| p.into_inner());
            let mut cur = vec![0u8; data.len()];
            self.backend
                .read_at(&mut cur, self.offset(io.lba))
                .map_err(|e| Sense::from_read_error(&e))?;
            for (c, d) in cur.iter_mut().zip(data) {
                *c |= d;
            }
            self.backend
                .write_at(&cur, self.offset(io.lba))
                .map_err(|e| Sense::from_write_error(&e))?;
        }
        self.flush_if_needed(io.fua)
    }

    pub(super) fn lba_status(&self, lba: u64) -> Result<Vec<u8>, Sense> {
        if lba >= self.num_blocks() {
            return Err(Sense::lba_out_of_range());
        }
        let bs = u64::from(self.cfg.block_size);
        let (mapped, len) = if self.thin {
            let e = self
                .backend
                .extent(self.offset(lba))
                .map_err(|e| Sense::from_read_error(&e))?;
            (e.mapped, e.len)
        } else {
            (true, (self.num_blocks() - lba) * bs)
        };
        let blocks = (len / bs).clamp(1, u64::from(u32::MAX)) as u32;
        let mut v = vec![0u8; 24];
        v[0..4].copy_from_slice(&20u32.to_be_bytes()); // PARAMETER DATA LENGTH = n - 3
        v[8..16].copy_from_slice(&lba.to_be_bytes());
        v[16..20].copy_from_slice(&blocks.to_be_bytes());
        v[20] = if mapped { 0 } else { 1 }; // PROVISIONING STATUS (SBC-4 table 48)
        Ok(v)
    }
}

/// Offset of the first byte where `a` and `b` differ.
pub(super) fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// The first `need` Data-Out bytes, or CHECK CONDITION when the initiator sent fewer.
pub(super) fn data_out<'a>(req: &ScsiRequest<'a>, need: u64) -> Result<&'a [u8], Sense> {
    let need = usize::try_from(need).map_err(|_| Sense::invalid_field_in_cdb())?;
    req.data_out.get(..need).ok_or_else(|| {
        // The iSCSI layer normally catches this first (RFC 7143 §11.4.5.2 residuals);
        // here the data are simply missing, so nothing is written.
        Sense::parameter_list_length_error()
    })
}

/// UNMAP parameter list (SBC-4 §5.28.2): (lba, blocks) per descriptor.
pub(super) fn parse_unmap_list(data: &[u8]) -> Result<Vec<(u64, u32)>, Sense> {
    let unmap_len = u16::from_be_bytes([data[0], data[1]]) as usize;
    let bd_len = u16::from_be_bytes([data[2], data[3]]) as usize;
    if unmap_len + 2 < 8 && unmap_len != 0 {
        return Err(Sense::parameter_list_length_error());
    }
    // Descriptors beyond the parameter list are missing; a trailing partial descriptor is
    // ignored (SBC-4 §5.28.2).
    let avail = data.len() - 8;
    let usable = bd_len.min(avail) / 16;
    let mut out = Vec::with_capacity(usable);
    for i in 0..usable {
        let d = &data[8 + 16 * i..8 + 16 * (i + 1)];
        let lba = u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
        let n = u32::from_be_bytes([d[8], d[9], d[10], d[11]]);
        out.push((lba, n));
    }
    Ok(out)
}
