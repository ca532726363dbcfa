//! Data-Out bookkeeping for one write command (RFC 7143 §4.2.5 Data Transfer, §11.7 Data-Out,
//! §11.8 R2T): immediate data, the unsolicited first burst, then solicited bursts requested
//! with R2Ts, several outstanding at once. No I/O: the connection feeds it PDUs and sends the
//! R2Ts it plans.
//!
//! Bytes past what the CDB needs (an iSCSI underflow: EDTL larger than the SCSI transfer
//! length) are accepted and discarded; the buffer is sized by the CDB, never by a length field
//! from the network alone.

use crate::params::SessionParams;
use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{DataOut, ScsiCommand};
use iscsi_wire::RESERVED_TAG;

/// A violation of the data transfer rules. The connection answers with a Reject and ends the
/// command with CHECK CONDITION (ERL 0 has no recovery of the data phase).
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[error("data phase error: {0}")]
pub struct DataError(pub &'static str);

/// One R2T to send (RFC 7143 §11.8).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct R2tPlan {
    pub ttt: u32,
    pub r2t_sn: u32,
    pub offset: u32,
    pub len: u32,
}

#[derive(Clone, Copy, Debug)]
struct Outstanding {
    plan: R2tPlan,
    received: u32,
    next_data_sn: u32,
}

/// The data phase of one write.
#[derive(Debug)]
pub struct WriteState {
    edtl: u32,
    /// Bytes kept for the SCSI layer: min(EDTL, what the CDB needs).
    keep: u32,
    buf: BytesMut,
    /// The immediate data, when it is everything kept (a write of up to FirstBurstLength with
    /// ImmediateData): handed to the SCSI layer as it came, no copy. `buf` stays empty.
    whole: Option<Bytes>,
    /// End of the unsolicited region (immediate data plus unsolicited Data-Out).
    unsolicited_end: u32,
    unsolicited_received: u32,
    unsolicited_data_sn: u32,
    /// Whether unsolicited Data-Out PDUs may still arrive.
    unsolicited_open: bool,
    /// End of the region the target solicits with R2Ts.
    solicit_end: u32,
    next_r2t_offset: u32,
    next_r2t_sn: u32,
    outstanding: Vec<Outstanding>,
    /// Ranges (offset, length) to solicit again before `next_r2t_offset` moves on: what the
    /// R2Ts and unsolicited data of a failed connection asked for and never got
    /// ([`WriteState::recover`]).
    pending: Vec<(u32, u32)>,
    max_burst: u32,
    max_outstanding: u32,
}

impl WriteState {
    /// Starts the data phase for `cmd`, whose CDB needs `need` bytes, with the command's
    /// immediate data.
    pub fn new(
        params: &SessionParams,
        cmd: &ScsiCommand,
        immediate: Bytes,
        need: u32,
    ) -> Result<Self, DataError> {
        let edtl = cmd.expected_data_transfer_length;
        let imm =
            u32::try_from(immediate.len()).map_err(|_| DataError("immediate data too long"))?;
        if imm > 0 && !params.immediate_data {
            return Err(DataError("immediate data not negotiated"));
        }
        if imm > params.first_burst_length || imm > edtl {
            return Err(DataError("immediate data beyond FirstBurstLength or EDTL"));
        }
        let keep = edtl.min(need);
        // The buffer grows as data arrives (see `store`), never ahead of it: a CDB and EDTL
        // alone cannot make the target reserve memory (issue 8: 32 data-less 64 MiB writes
        // used to map 2 GiB).
        let n = imm.min(keep) as usize;
        // Immediate data is data already here: like the first bytes of a burst (see `store`),
        // it reserves one burst more, so the next burst does not reallocate and copy it.
        let cap = if n > 0 {
            keep.min(imm.saturating_add(params.max_burst_length)) as usize
        } else {
            0
        };
        // Immediate data that is all the SCSI layer keeps is passed on as it came (any later
        // Data-Out lies past `keep` and is not stored).
        let (buf, whole) = if n > 0 && n == keep as usize {
            (BytesMut::new(), Some(immediate.slice(..n)))
        } else {
            let mut buf = BytesMut::with_capacity(cap.max(n));
            buf.extend_from_slice(&immediate[..n]);
            (buf, None)
        };
        // §11.3.1: with F=0 and InitialR2T=No, unsolicited Data-Out follows up to
        // min(FirstBurstLength, EDTL) in total.
        let (unsolicited_end, unsolicited_open) = if !cmd.final_ && !params.initial_r2t {
            let end = edtl.min(params.first_burst_length);
            (end, end > imm)
        } else {
            (imm, false)
        };
        let solicit_end = keep.max(unsolicited_end);
        Ok(Self {
            edtl,
            keep,
            buf,
            whole,
            unsolicited_end,
            unsolicited_received: imm,
            unsolicited_data_sn: 0,
            unsolicited_open,
            solicit_end,
            next_r2t_offset: unsolicited_end,
            next_r2t_sn: 0,
            outstanding: Vec::new(),
            pending: Vec::new(),
            max_burst: params.max_burst_length.max(512),
            max_outstanding: params.max_outstanding_r2t.max(1),
        })
    }

    #[must_use]
    pub fn edtl(&self) -> u32 {
        self.edtl
    }

    /// Accepts one Data-Out PDU.
    pub fn on_data_out(&mut self, h: &DataOut, data: &[u8]) -> Result<(), DataError> {
        let burst_end = self.accept(h, data.len())?;
        self.store(h.buffer_offset, data, burst_end);
        Ok(())
    }

    /// Where a Data-Out of `len` bytes can be received in place (issue 27): the free end of
    /// this write's buffer, as a `BytesMut` of its own, when the PDU's data goes right after
    /// what is stored so far (in order, DataPDUInOrder=Yes, §13.18) and all of it is kept.
    /// Room for the rest of its burst is reserved first, as [`WriteState::on_data_out`]
    /// reserves it when a burst's first bytes arrive (the PDU's head is here, its data is
    /// arriving). The PDU is not checked here: [`WriteState::on_placed_data_out`] checks it as
    /// [`WriteState::on_data_out`] does, then joins the buffer back without a copy. `None`:
    /// receive it as usual.
    pub fn lend(&mut self, h: &DataOut, len: usize) -> Option<BytesMut> {
        let offset = h.buffer_offset as usize;
        let end = offset.checked_add(len)?;
        if self.whole.is_some() || offset != self.buf.len() || end > self.keep as usize {
            return None;
        }
        let burst_end = if h.ttt == RESERVED_TAG {
            self.unsolicited_end
        } else {
            let o = self.outstanding.iter().find(|o| o.plan.ttt == h.ttt)?;
            o.plan.offset.saturating_add(o.plan.len)
        };
        let want = (burst_end.min(self.keep) as usize).max(end);
        if want > self.buf.capacity() {
            self.buf.reserve(want - self.buf.len());
        }
        let at = self.buf.len();
        Some(self.buf.split_off(at))
    }

    /// Whether Data-Out may come for this write now: its unsolicited data is still open or an
    /// R2T is outstanding (what is solicited later waits for its R2T).
    #[must_use]
    pub fn awaits_data_out(&self) -> bool {
        self.unsolicited_open || !self.outstanding.is_empty()
    }

    /// Accepts one Data-Out PDU whose data was received into the buffer
    /// [`WriteState::lend`] lent (`data`, exactly the PDU's data): checked as
    /// [`WriteState::on_data_out`] checks it, then joined to the data before it (no copy
    /// when it is that buffer's free end; copied otherwise). A PDU refused leaves the data
    /// stored so far as it was.
    pub fn on_placed_data_out(&mut self, h: &DataOut, data: BytesMut) -> Result<(), DataError> {
        let burst_end = self.accept(h, data.len())?;
        let start = h.buffer_offset as usize;
        if self.whole.is_none()
            && start == self.buf.len()
            && start + data.len() <= self.keep as usize
        {
            self.buf.unsplit(data);
        } else {
            self.store(h.buffer_offset, &data, burst_end);
        }
        Ok(())
    }

    /// Checks one Data-Out of `len` bytes against the data phase and counts it; returns where
    /// the burst it belongs to ends, for [`WriteState::store`].
    fn accept(&mut self, h: &DataOut, len: usize) -> Result<u32, DataError> {
        let len = u32::try_from(len).map_err(|_| DataError("Data-Out too long"))?;
        let offset = h.buffer_offset;
        let end = offset
            .checked_add(len)
            .ok_or(DataError("buffer offset overflow"))?;
        if h.ttt == RESERVED_TAG {
            if !self.unsolicited_open {
                return Err(DataError("unsolicited Data-Out not expected"));
            }
            if h.data_sn != self.unsolicited_data_sn {
                return Err(DataError("DataSN out of order"));
            }
            if offset != self.unsolicited_received {
                return Err(DataError("buffer offset out of order"));
            }
            if end > self.unsolicited_end {
                return Err(DataError("unsolicited data beyond FirstBurstLength"));
            }
            let burst_end = self.unsolicited_end;
            self.unsolicited_data_sn = self.unsolicited_data_sn.wrapping_add(1);
            self.unsolicited_received = end;
            if h.final_ || end == self.unsolicited_end {
                if end != self.unsolicited_end {
                    // The initiator ended its first burst early: solicit the rest.
                    self.unsolicited_end = end;
                    self.next_r2t_offset = end;
                    self.solicit_end = self.keep.max(end);
                }
                self.unsolicited_open = false;
            }
            return Ok(burst_end);
        }
        let idx = self
            .outstanding
            .iter()
            .position(|o| o.plan.ttt == h.ttt)
            .ok_or(DataError("Data-Out for an unknown Target Transfer Tag"))?;
        let o = &mut self.outstanding[idx];
        if h.data_sn != o.next_data_sn {
            return Err(DataError("DataSN out of order"));
        }
        if offset != o.plan.offset + o.received {
            return Err(DataError("buffer offset out of order"));
        }
        if end > o.plan.offset + o.plan.len {
            return Err(DataError("Data-Out beyond the R2T's desired length"));
        }
        o.received += len;
        o.next_data_sn = o.next_data_sn.wrapping_add(1);
        let done = o.received == o.plan.len;
        let burst_end = o.plan.offset + o.plan.len;
        if h.final_ != done {
            return Err(DataError(
                "F bit does not match the end of the R2T sequence",
            ));
        }
        if done {
            self.outstanding.swap_remove(idx);
        }
        Ok(burst_end)
    }

    /// Stores one Data-Out's bytes at `offset`; `burst_end` is where the burst they belong to
    /// ends (the R2T's offset + desired length, or the end of the unsolicited data).
    ///
    /// Memory is reserved when data arrives, never on a CDB's or R2T's say-so: the first bytes
    /// of a burst reserve the rest of that burst (at most MaxBurstLength, or FirstBurstLength
    /// for unsolicited data, RFC 7143 §13.13–14), so a 1 MiB write is one allocation, not a
    /// chain of doublings, and in-order data is appended with one copy (no zero-fill first).
    fn store(&mut self, offset: u32, data: &[u8], burst_end: u32) {
        let start = offset.min(self.keep) as usize;
        let end = (offset as usize + data.len()).min(self.keep as usize);
        if end <= start {
            return;
        }
        let want = (burst_end.min(self.keep) as usize).max(end);
        if want > self.buf.capacity() {
            self.buf.reserve(want - self.buf.len());
        }
        let data = &data[..end - start];
        if start == self.buf.len() {
            self.buf.extend_from_slice(data);
        } else {
            // Bursts of several outstanding R2Ts may complete out of order (§11.8): fill the
            // gap with zeros; the bytes arrive later and overwrite them.
            if self.buf.len() < end {
                self.buf.resize(end, 0);
            }
            self.buf[start..end].copy_from_slice(data);
        }
    }

    /// R2Ts to send now, up to MaxOutstandingR2T in flight, each at most MaxBurstLength
    /// (RFC 7143 §13.13, §13.17). Nothing is solicited while unsolicited data is still due.
    pub fn plan_r2ts(&mut self, mut next_ttt: impl FnMut() -> u32) -> Vec<R2tPlan> {
        let mut plans = Vec::new();
        if self.unsolicited_open {
            return plans;
        }
        // Recovery R2Ts first (RFC 7143 §7.2): the data a failed connection never brought.
        while (self.outstanding.len() as u32) < self.max_outstanding && !self.pending.is_empty() {
            let (offset, left) = self.pending[0];
            let len = left.min(self.max_burst);
            if len == left {
                self.pending.remove(0);
            } else {
                self.pending[0] = (offset + len, left - len);
            }
            let plan = R2tPlan {
                ttt: next_ttt(),
                r2t_sn: self.next_r2t_sn,
                offset,
                len,
            };
            self.next_r2t_sn = self.next_r2t_sn.wrapping_add(1);
            self.outstanding.push(Outstanding {
                plan,
                received: 0,
                next_data_sn: 0,
            });
            plans.push(plan);
        }
        while (self.outstanding.len() as u32) < self.max_outstanding
            && self.next_r2t_offset < self.solicit_end
        {
            let len = (self.solicit_end - self.next_r2t_offset).min(self.max_burst);
            let plan = R2tPlan {
                ttt: next_ttt(),
                r2t_sn: self.next_r2t_sn,
                offset: self.next_r2t_offset,
                len,
            };
            self.next_r2t_sn = self.next_r2t_sn.wrapping_add(1);
            self.next_r2t_offset += len;
            self.outstanding.push(Outstanding {
                plan,
                received: 0,
                next_data_sn: 0,
            });
            plans.push(plan);
        }
        plans
    }

    /// Whether every byte of the data phase has arrived.
    #[must_use]
    pub fn is_complete(&self) -> bool {
        !self.unsolicited_open
            && self.outstanding.is_empty()
            && self.pending.is_empty()
            && self.next_r2t_offset >= self.solicit_end
    }

    /// The connection the data phase ran on failed (RFC 7143 §7.2, ErrorRecoveryLevel 2):
    /// nothing more arrives for its outstanding R2Ts or its unsolicited data. What they asked
    /// for and did not get is solicited again, with new R2Ts (recovery R2Ts, new TTTs and
    /// R2TSNs after the last), once the task is reassigned to another connection
    /// ([`WriteState::plan_r2ts`]); bytes that arrived are kept.
    pub fn recover(&mut self) {
        let mut holes = Vec::new();
        if self.unsolicited_open {
            if self.unsolicited_received < self.unsolicited_end {
                holes.push((
                    self.unsolicited_received,
                    self.unsolicited_end - self.unsolicited_received,
                ));
            }
            self.unsolicited_open = false;
        }
        for o in self.outstanding.drain(..) {
            if o.received < o.plan.len {
                holes.push((o.plan.offset + o.received, o.plan.len - o.received));
            }
        }
        self.pending.extend(holes);
        self.pending.sort_unstable();
    }

    /// [`WriteState::recover`] for data that cannot be pieced together across connections
    /// (Seal: each connection seals under its own keys, so bytes that came on the failed
    /// connection and bytes sealed for the new one would never open as one transfer): every
    /// byte received is dropped and the whole data phase, immediate and unsolicited data
    /// included, is solicited again with recovery R2Ts (RFC 7143 §7.2.2; R2TSNs go on).
    pub fn restart(&mut self) {
        self.recover();
        self.buf.clear();
        self.whole = None;
        self.pending.clear();
        if self.solicit_end > 0 {
            self.pending.push((0, self.solicit_end));
        }
        self.next_r2t_offset = self.solicit_end;
        self.unsolicited_received = self.unsolicited_end;
    }

    /// An R2T SNACK (RFC 7143 §11.16.1, ErrorRecoveryLevel >= 1) for R2TSNs `beg`.. (`run` of
    /// them; 0: all from `beg`): the outstanding R2Ts among them, to send again. Each starts
    /// over (its burst is answered from its first byte again, DataSN 0).
    pub fn resend(&mut self, beg: u32, run: u32) -> Vec<R2tPlan> {
        let mut plans = Vec::new();
        for o in &mut self.outstanding {
            let d = o.plan.r2t_sn.wrapping_sub(beg);
            if (run == 0 && d < 1 << 31) || (run > 0 && d < run) {
                o.received = 0;
                o.next_data_sn = 0;
                plans.push(o.plan);
            }
        }
        plans.sort_unstable_by_key(|p| p.r2t_sn.wrapping_sub(beg));
        plans
    }

    /// The data for the SCSI layer.
    #[must_use]
    pub fn into_data(self) -> Bytes {
        if let Some(whole) = self.whole {
            return whole;
        }
        let mut buf = self.buf;
        buf.resize(self.keep as usize, 0);
        buf.freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(
        initial_r2t: bool,
        first_burst: u32,
        max_burst: u32,
        outstanding: u32,
    ) -> SessionParams {
        SessionParams {
            initial_r2t,
            immediate_data: true,
            first_burst_length: first_burst,
            max_burst_length: max_burst,
            max_outstanding_r2t: outstanding,
            ..SessionParams::default()
        }
    }

    fn cmd(edtl: u32, final_: bool) -> ScsiCommand {
        ScsiCommand {
            immediate: false,
            final_,
            read: false,
            write: true,
            attr: iscsi_wire::header::TaskAttr::SIMPLE,
            lun: 0,
            itt: 1,
            expected_data_transfer_length: edtl,
            cmd_sn: 0,
            exp_stat_sn: 0,
            cdb: [0; 16],
        }
    }

    fn dout(ttt: u32, data_sn: u32, offset: u32, final_: bool) -> DataOut {
        DataOut {
            final_,
            lun: 0,
            itt: 1,
            ttt,
            exp_stat_sn: 0,
            data_sn,
            buffer_offset: offset,
        }
    }

    #[test]
    fn immediate_data_alone_completes() {
        let w = WriteState::new(
            &params(false, 65536, 262_144, 4),
            &cmd(4096, true),
            Bytes::from(vec![7u8; 4096]),
            4096,
        )
        .unwrap();
        assert!(w.is_complete());
        assert_eq!(&w.into_data()[..], &[7u8; 4096][..]);
    }

    #[test]
    fn passes_immediate_data_that_is_the_whole_transfer_on_without_a_copy() {
        let imm = Bytes::from(vec![7u8; 4096]);
        let at = imm.as_ptr();
        let w = WriteState::new(
            &params(false, 65536, 262_144, 4),
            &cmd(4096, true),
            imm,
            4096,
        )
        .unwrap();
        let data = w.into_data();
        assert_eq!(data.as_ptr(), at, "the PDU's own bytes, not a copy");
        assert_eq!(data.len(), 4096);
    }

    #[test]
    fn unsolicited_then_solicited_with_several_r2ts() {
        let p = params(false, 8192, 16384, 2);
        let mut w =
            WriteState::new(&p, &cmd(65536, false), Bytes::from(vec![1u8; 4096]), 65536).unwrap();
        let mut ttt = 100;
        assert!(w.plan_r2ts(|| 0).is_empty(), "unsolicited data still due");
        w.on_data_out(&dout(RESERVED_TAG, 0, 4096, true), &[2; 4096])
            .unwrap();
        let plans = w.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
        assert_eq!(plans.len(), 2, "MaxOutstandingR2T");
        assert_eq!(
            (plans[0].offset, plans[0].len, plans[0].r2t_sn),
            (8192, 16384, 0)
        );
        assert_eq!(
            (plans[1].offset, plans[1].len, plans[1].r2t_sn),
            (24576, 16384, 1)
        );
        // Answer the second R2T first: sequences may complete in any order.
        w.on_data_out(&dout(plans[1].ttt, 0, 24576, false), &[4; 8192])
            .unwrap();
        w.on_data_out(&dout(plans[1].ttt, 1, 32768, true), &[4; 8192])
            .unwrap();
        let more = w.plan_r2ts(|| 999);
        assert_eq!(more.len(), 1);
        assert_eq!((more[0].offset, more[0].len), (40960, 16384));
        w.on_data_out(&dout(plans[0].ttt, 0, 8192, true), &[3; 16384])
            .unwrap();
        let last = w.plan_r2ts(|| 1000);
        assert_eq!((last[0].offset, last[0].len), (57344, 8192));
        w.on_data_out(&dout(999, 0, 40960, true), &[5; 16384])
            .unwrap();
        assert!(!w.is_complete());
        w.on_data_out(&dout(1000, 0, 57344, true), &[6; 8192])
            .unwrap();
        assert!(w.is_complete());
        let d = w.into_data();
        assert_eq!(
            (d[0], d[4096], d[8192], d[24576], d[40960], d[65535]),
            (1, 2, 3, 4, 5, 6)
        );
    }

    /// Data-Out received in place (issue 27): unsolicited and solicited Data-Out lent the
    /// free end of the write's one buffer, given back and joined without a copy; the data is
    /// the same as when stored by copy, in one allocation from the first byte on.
    #[test]
    fn accepts_data_out_placed_in_the_writes_own_buffer_without_a_copy() {
        let p = params(false, 16384, 65536, 1);
        let mut w =
            WriteState::new(&p, &cmd(65536, false), Bytes::from(vec![1u8; 4096]), 65536).unwrap();
        let place = |w: &mut WriteState, h: DataOut, byte: u8, len: usize| {
            let mut b = w.lend(&h, len).expect("lent");
            assert!(b.is_empty() && b.capacity() >= len);
            b.extend_from_slice(&vec![byte; len]);
            w.on_placed_data_out(&h, b).unwrap();
        };
        let at = w.buf.as_ptr();
        place(&mut w, dout(RESERVED_TAG, 0, 4096, false), 2, 4096);
        place(&mut w, dout(RESERVED_TAG, 1, 8192, true), 3, 8192);
        let plans = w.plan_r2ts(|| 7);
        assert_eq!((plans[0].offset, plans[0].len), (16384, 49152));
        place(&mut w, dout(7, 0, 16384, false), 4, 32768);
        place(&mut w, dout(7, 1, 49152, true), 5, 16384);
        assert!(w.is_complete());
        let d = w.into_data();
        assert_eq!(
            d.as_ptr(),
            at,
            "one buffer: every placed PDU joined in place"
        );
        assert_eq!(
            (
                d[0],
                d[4096],
                d[8192],
                d[16384],
                d[49151],
                d[49152],
                d.len()
            ),
            (1, 2, 3, 4, 4, 5, 65536)
        );
    }

    /// What is not lent for (`None`: received and copied as before): data out of order, past
    /// what the CDB keeps, or for an unknown TTT. A placed PDU the data phase refuses (DataSN
    /// out of order) leaves the data stored so far as it was, and the right one is placed
    /// after it.
    #[test]
    fn rejects_placed_data_out_out_of_order_and_keeps_the_data_before_it() {
        let p = params(false, 16384, 65536, 1);
        let mut w =
            WriteState::new(&p, &cmd(16384, false), Bytes::from(vec![1u8; 4096]), 12288).unwrap();
        assert!(
            w.lend(&dout(RESERVED_TAG, 0, 8192, false), 4096).is_none(),
            "a gap"
        );
        assert!(
            w.lend(&dout(RESERVED_TAG, 0, 4096, false), 12288).is_none(),
            "past keep"
        );
        assert!(
            w.lend(&dout(42, 0, 4096, false), 4096).is_none(),
            "unknown TTT"
        );
        let h = dout(RESERVED_TAG, 1, 4096, false);
        let mut b = w.lend(&h, 4096).unwrap();
        b.extend_from_slice(&[9; 4096]);
        assert!(w.on_placed_data_out(&h, b).is_err(), "DataSN 1 before 0");
        let h = dout(RESERVED_TAG, 0, 4096, false);
        let mut b = w.lend(&h, 4096).unwrap();
        b.extend_from_slice(&[2; 4096]);
        w.on_placed_data_out(&h, b).unwrap();
        w.on_data_out(&dout(RESERVED_TAG, 1, 8192, true), &[3; 8192])
            .unwrap();
        assert!(w.is_complete());
        let d = w.into_data();
        assert_eq!(
            (d[0], d[4095], d[4096], d[8191], d[8192], d.len()),
            (1, 1, 2, 2, 3, 12288)
        );
    }

    #[test]
    fn initial_r2t_yes_solicits_everything_after_immediate() {
        let p = params(true, 65536, 262_144, 1);
        let mut w = WriteState::new(&p, &cmd(8192, false), Bytes::new(), 8192).unwrap();
        let plans = w.plan_r2ts(|| 5);
        assert_eq!(
            plans,
            vec![R2tPlan {
                ttt: 5,
                r2t_sn: 0,
                offset: 0,
                len: 8192
            }]
        );
        assert!(w
            .on_data_out(&dout(RESERVED_TAG, 0, 0, true), &[0; 512])
            .is_err());
    }

    #[test]
    fn rejects_bad_data_sn_offset_and_overrun() {
        let p = params(false, 65536, 262_144, 1);
        let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048).unwrap();
        assert!(
            w.on_data_out(&dout(RESERVED_TAG, 1, 0, false), &[0; 512])
                .is_err(),
            "DataSN 1 first"
        );
        let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048).unwrap();
        assert!(
            w.on_data_out(&dout(RESERVED_TAG, 0, 512, false), &[0; 512])
                .is_err(),
            "gap"
        );
        let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048).unwrap();
        assert!(
            w.on_data_out(&dout(RESERVED_TAG, 0, 0, true), &[0; 4096])
                .is_err(),
            "overrun"
        );
        let mut w = WriteState::new(&p, &cmd(2048, false), Bytes::new(), 2048).unwrap();
        w.on_data_out(&dout(RESERVED_TAG, 0, 0, false), &[0; 1024])
            .unwrap();
        assert!(
            w.on_data_out(&dout(RESERVED_TAG, 0, 1024, true), &[0; 1024])
                .is_err(),
            "DataSN 0 twice"
        );
    }

    #[test]
    fn underflow_discards_extra_bytes_and_overflow_keeps_edtl() {
        // EDTL 10000 for a one-block write: keep 512, accept and drop the rest.
        let p = params(false, 65536, 262_144, 1);
        let mut w =
            WriteState::new(&p, &cmd(10000, false), Bytes::from(vec![9u8; 512]), 512).unwrap();
        w.on_data_out(&dout(RESERVED_TAG, 0, 512, true), &[8; 9488])
            .unwrap();
        assert!(w.is_complete());
        assert_eq!(w.into_data().len(), 512);
        // EDTL 200 for a one-block write: only 200 bytes can come.
        let w = WriteState::new(&p, &cmd(200, true), Bytes::from(vec![1u8; 200]), 512).unwrap();
        assert!(w.is_complete());
        assert_eq!(w.into_data().len(), 200);
    }

    #[test]
    fn recover_solicits_again_only_what_a_failed_connection_never_brought() {
        // Unsolicited data cut after 1024 of 4096 bytes, then two R2Ts, the first half answered.
        let p = params(false, 4096, 4096, 2);
        let mut w =
            WriteState::new(&p, &cmd(16384, false), Bytes::from(vec![1u8; 512]), 16384).unwrap();
        w.on_data_out(&dout(RESERVED_TAG, 0, 512, false), &[1; 512])
            .unwrap();
        w.recover();
        let mut ttt = 10;
        let plans = w.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
        assert_eq!(
            plans.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
            vec![(1024, 3072), (4096, 4096)],
            "the rest of the unsolicited burst first, then the solicited data"
        );
        w.on_data_out(&dout(plans[1].ttt, 0, 4096, false), &[2; 2048])
            .unwrap();
        w.recover();
        let again = w.plan_r2ts(|| 99);
        assert_eq!(
            again.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
            vec![(1024, 3072), (6144, 2048)],
            "only the bytes that never came; R2TSNs go on"
        );
        assert_eq!(again[0].r2t_sn, 2);
        assert!(!w.is_complete());
    }

    #[test]
    fn restart_solicits_the_whole_transfer_again_and_keeps_nothing_of_the_failed_connection() {
        // 512 bytes immediate, unsolicited data to 1024 of 4096, then a half-answered R2T:
        // what came on the failed connection is dropped, 0..16384 is asked for again.
        let p = params(false, 4096, 4096, 2);
        let mut w =
            WriteState::new(&p, &cmd(16384, false), Bytes::from(vec![1u8; 512]), 16384).unwrap();
        w.on_data_out(&dout(RESERVED_TAG, 0, 512, false), &[1; 512])
            .unwrap();
        w.recover();
        let mut ttt = 10;
        let plans = w.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
        w.on_data_out(&dout(plans[0].ttt, 0, 1024, false), &[1; 1024])
            .unwrap();
        w.restart();
        let mut ttt = 20;
        let again = w.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
        assert_eq!(
            again.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
            vec![(0, 4096), (4096, 4096)],
            "from byte 0, immediate data included, MaxOutstandingR2T at a time"
        );
        assert!(again[0].r2t_sn > plans[1].r2t_sn, "R2TSNs go on");
        for (k, plan) in again.iter().enumerate() {
            let fill = [7 + u8::try_from(k).unwrap(); 4096];
            w.on_data_out(&dout(plan.ttt, 0, plan.offset, true), &fill)
                .unwrap();
        }
        assert!(!w.is_complete());
        let mut ttt = 30;
        let rest = w.plan_r2ts(|| {
            ttt += 1;
            ttt
        });
        assert_eq!(
            rest.iter().map(|p| (p.offset, p.len)).collect::<Vec<_>>(),
            vec![(8192, 4096), (12288, 4096)]
        );
        let mut plans = rest;
        let mut fill = 9u8;
        while !plans.is_empty() {
            for plan in &plans {
                w.on_data_out(&dout(plan.ttt, 0, plan.offset, true), &vec![fill; 4096])
                    .unwrap();
                fill += 1;
            }
            plans = w.plan_r2ts(|| {
                ttt += 1;
                ttt
            });
        }
        assert!(w.is_complete());
        let data = w.into_data();
        assert_eq!(data.len(), 16384);
        assert!(
            data[..4096].iter().all(|b| *b == 7),
            "no byte of the old immediate or unsolicited data is left"
        );
        assert!(data[4096..8192].iter().all(|b| *b == 8));
    }

    #[test]
    fn resend_names_outstanding_r2ts_by_r2tsn_and_restarts_their_burst() {
        let p = params(true, 65536, 2048, 2);
        let mut w = WriteState::new(&p, &cmd(8192, false), Bytes::new(), 8192).unwrap();
        let plans = w.plan_r2ts(|| 7);
        assert_eq!(plans.len(), 2);
        w.on_data_out(&dout(7, 0, 0, false), &[0; 1024]).unwrap();
        let again = w.resend(0, 1);
        assert_eq!(again, vec![plans[0]]);
        // The burst is answered from its first byte again.
        w.on_data_out(&dout(7, 0, 0, false), &[0; 1024]).unwrap();
        assert_eq!(w.resend(1, 0), vec![plans[1]]);
        assert!(w.resend(5, 1).is_empty());
    }

    #[test]
    fn rejects_immediate_data_beyond_first_burst() {
        let p = params(false, 512, 262_144, 1);
        assert!(WriteState::new(&p, &cmd(4096, true), Bytes::from(vec![0u8; 1024]), 4096).is_err());
    }
}
