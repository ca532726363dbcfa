//! [`LogicalUnit`]'s command dispatch: one decoded [`Command`] to its SPC-4/SBC-4 handler.

use bytes::Bytes;
use ipsan_block::Whole;

use super::{data_out, path, truncate, LogicalUnit, ScsiRequest, ScsiResponse};
use crate::cdb::Command;
use crate::sense::{ScsiStatus, Sense};
use crate::{inquiry, lun, mode, opcodes, pr};

impl LogicalUnit {
    pub(super) fn dispatch(
        &self,
        req: &ScsiRequest<'_>,
        cmd: Command,
        whole: Option<&Whole>,
    ) -> Result<ScsiResponse, Sense> {
        let ok = |b: Bytes| Ok(ScsiResponse::good(b));
        match cmd {
            Command::TestUnitReady => ok(Bytes::new()),
            Command::RequestSense { desc, alloc } => {
                let pending = self
                    .state()
                    .ua
                    .get_mut(req.nexus)
                    .and_then(|q| q.pop_front());
                let s = match pending {
                    Some((asc, ascq)) => Sense::unit_attention(asc, ascq),
                    None => Sense::no_sense(),
                };
                let b = if desc {
                    s.to_descriptor()
                } else {
                    s.to_fixed()
                };
                ok(truncate(b, alloc))
            }
            Command::Inquiry { evpd, page, alloc } => {
                let v = if evpd {
                    inquiry::vpd(self, page)?
                } else {
                    inquiry::standard(&self.cfg)
                };
                ok(truncate(v, alloc))
            }
            Command::ModeSense {
                ten,
                dbd,
                llbaa,
                pc,
                page,
                subpage,
                alloc,
            } => ok(truncate(
                mode::sense(self, ten, dbd, llbaa, pc, page, subpage)?,
                alloc,
            )),
            Command::ModeSelect {
                ten,
                pf,
                sp,
                param_len,
            } => {
                let data = data_out(req, u64::from(param_len))?;
                mode::select(self, req.nexus, ten, pf, sp, data)?;
                ok(Bytes::new())
            }
            Command::ReadCapacity10 => {
                let last = (self.num_blocks() - 1).min(u64::from(u32::MAX)) as u32;
                let mut v = last.to_be_bytes().to_vec();
                v.extend_from_slice(&self.cfg.block_size.to_be_bytes());
                ok(Bytes::from(v))
            }
            Command::ReadCapacity16 { alloc } => {
                let mut v = vec![0u8; 32];
                v[0..8].copy_from_slice(&(self.num_blocks() - 1).to_be_bytes());
                v[8..12].copy_from_slice(&self.cfg.block_size.to_be_bytes());
                // LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT stays 0: with 3 (512 on 4 KiB)
                // libiscsi's GetLbaStatus.UnmapSingle expects the first descriptor to start
                // at a rounded-up LBA, which SBC-4 §5.7.2 forbids (it must be the
                // requested STARTING LOGICAL BLOCK ADDRESS).
                if self.thin {
                    v[14] = 0x80 | 0x40; // LBPME, LBPRZ (SBC-4 §5.16.2)
                }
                ok(truncate(v, alloc))
            }
            c @ (Command::Read(_)
            | Command::Write(_)
            | Command::WriteAndVerify { .. }
            | Command::SynchronizeCache { .. }
            | Command::Unmap { .. }
            | Command::WriteSame { .. }
            | Command::CompareAndWrite(_)) => {
                let preq = path::PathRequest {
                    view: *req,
                    shared: None,
                    whole,
                };
                path::drive(self.data_path(&path::Blocking, &preq, c))
            }
            Command::Verify { io, bytchk } => {
                self.verify(req, io, bytchk)?;
                ok(Bytes::new())
            }
            Command::OrWrite(io) => {
                self.or_write(req, io)?;
                ok(Bytes::new())
            }
            Command::PreFetch { lba, blocks, .. } => {
                self.check_range(lba, u64::from(blocks))?;
                // Nothing to stage: GOOD means "not all of it was cached" (SBC-4 §5.10).
                ok(Bytes::new())
            }
            Command::GetLbaStatus { lba, alloc } => ok(truncate(self.lba_status(lba)?, alloc)),
            Command::StartStopUnit {
                power_condition,
                start,
                no_flush,
                ..
            } => {
                // Not removable, no power states: stopping only flushes the cache.
                if power_condition == 0 && !start && !no_flush {
                    self.backend
                        .flush()
                        .map_err(|e| Sense::from_write_error(&e))?;
                }
                ok(Bytes::new())
            }
            Command::PreventAllow { prevent } => {
                let mut st = self.state();
                match prevent {
                    0 => {
                        st.prevent.remove(req.nexus);
                    }
                    1 => {
                        st.prevent.insert(req.nexus.clone());
                    }
                    _ => return Err(Sense::invalid_field_in_cdb_at(4, Some(1))),
                }
                ok(Bytes::new())
            }
            Command::ReadDefectData {
                twelve,
                plist,
                glist,
                format,
                alloc,
            } => {
                // No defect lists: answer with empty lists in the requested format.
                let flags = (u8::from(plist) << 4) | (u8::from(glist) << 3) | format;
                let v = if twelve {
                    vec![0, flags, 0, 0, 0, 0, 0, 0]
                } else {
                    vec![0, flags, 0, 0]
                };
                ok(truncate(v, alloc))
            }
            Command::ReportLuns { select, alloc } => {
                Ok(lun::report_luns_decoded(&[req.lun], select, alloc))
            }
            Command::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                sa,
                alloc,
            } => ok(truncate(
                opcodes::report(self, rctd, options, opcode, sa)?,
                alloc,
            )),
            Command::Reserve6 | Command::Release6 | Command::PersistentReserveOut(_)
                if self.refuse_reservations =>
            {
                // A reservation held here would not bind the other targets serving the same
                // store: refuse rather than promise an exclusion we cannot keep (docs/rbd.md).
                Err(Sense::invalid_opcode())
            }
            Command::Reserve6 => {
                let me = self.it(req.nexus);
                self.pr_update(|p, _| {
                    if p.reserve6(&me) {
                        Ok(ScsiResponse::good(Bytes::new()))
                    } else {
                        Ok(ScsiResponse::status(ScsiStatus::RESERVATION_CONFLICT))
                    }
                })
            }
            Command::Release6 => {
                let me = self.it(req.nexus);
                self.pr_update(|p, _| {
                    p.release6(Some(&me));
                    Ok(ScsiResponse::good(Bytes::new()))
                })
            }
            Command::PersistentReserveIn { sa, alloc } => {
                let (p, _) = self.pr.load().map_err(|e| Sense::from_store_error(&e))?;
                Ok(ScsiResponse::good(truncate(p.read(sa)?, alloc)))
            }
            Command::PersistentReserveOut(p) => {
                let data = data_out(req, u64::from(p.param_len))?;
                let me = self.it(req.nexus);
                self.pr_update(|st, uas| pr::out(st, uas, &me, p, data))
            }
        }
    }
}
