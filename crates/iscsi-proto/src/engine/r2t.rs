//! Data-Out bookkeeping for one write command (RFC 7143 §4.2.5 Data Transfer, §11.7 Data-Out,
//! §11.8 R2T): immediate data, the unsolicited first burst, then solicited bursts requested
//! with R2Ts, several outstanding at once. No I/O: the connection feeds it PDUs and sends the
//! R2Ts it plans.
//!
//! Bytes past what the CDB needs (an iSCSI underflow: EDTL larger than the SCSI transfer
//! length) are accepted and discarded; the buffer is sized by the CDB, never by a length field
//! from the network alone.
//!
//! A write's data is stored in one buffer. Room is made when data arrives, never on a CDB's
//! say-so: at a write's first bytes the whole write is reserved at once when the connection's
//! [`ReserveBudget`] grants it (issue 27: reserving burst by burst reallocated and copied the
//! data so far at every burst a libiscsi 1 MiB write's R2Ts asked for), otherwise the rest of
//! the burst at hand.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

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

/// How many bytes one connection's writes may hold reserved whole, ahead of their data
/// (issue 27). A write whose first bytes have arrived reserves its whole length at once when
/// the budget has room for it, and gives it back when its data goes to the SCSI layer or the
/// write is dropped; without room it reserves burst by burst, as it did before. So what a
/// peer can make the target reserve beyond the bytes it sent is this budget plus one burst per
/// write at most (MaxBurstLength, RFC 7143 §13.13), whatever the CDBs and EDTLs claim.
#[derive(Clone, Debug)]
pub struct ReserveBudget {
    used: Arc<AtomicUsize>,
    limit: usize,
}

impl ReserveBudget {
    /// A budget of `limit` bytes.
    #[must_use]
    pub fn new(limit: usize) -> Self {
        Self {
            used: Arc::new(AtomicUsize::new(0)),
            limit,
        }
    }

    /// Bytes granted and not given back.
    #[must_use]
    pub fn used(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// `n` bytes, if they fit.
    fn grant(&self, n: usize) -> Option<Grant> {
        let mut used = self.used.load(Ordering::Relaxed);
        loop {
            let after = used.checked_add(n).filter(|a| *a <= self.limit)?;
            match self
                .used
                .compare_exchange_weak(used, after, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => {
                    return Some(Grant {
                        used: self.used.clone(),
                        n,
                    })
                }
                Err(now) => used = now,
            }
        }
    }
}

/// Room for a whole write reserved before its SCSI Command is handled (issue 27): the driver
/// receives the command's immediate data into a buffer with room for all of the write's data
/// ([`ReserveBudget::lend`]); [`WriteState::new`] takes that buffer as the write's own, with
/// this share of the budget, instead of copying the immediate data into a buffer of its own.
/// Dropped unused, the share goes back.
#[derive(Debug)]
pub struct Lent {
    itt: u32,
    grant: Grant,
}

impl ReserveBudget {
    /// An empty buffer with room for `n` bytes, the data of write `itt`, and the share of the
    /// budget it holds; `None` when the budget has no room for it.
    #[must_use]
    pub fn lend(&self, itt: u32, n: usize) -> Option<(Lent, BytesMut)> {
        let grant = self.grant(n)?;
        Some((Lent { itt, grant }, BytesMut::with_capacity(n)))
    }
}

/// Bytes of a [`ReserveBudget`] one write holds; given back when dropped.
#[derive(Debug)]
struct Grant {
    used: Arc<AtomicUsize>,
    n: usize,
}

impl Drop for Grant {
    fn drop(&mut self) {
        self.used.fetch_sub(self.n, Ordering::Relaxed);
    }
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
    /// The connection's budget for reserving a write whole ([`WriteState::make_room`]).
    budget: ReserveBudget,
    /// This write's share of it, once its whole length is reserved.
    grant: Option<Grant>,
}

impl WriteState {
    /// Starts the data phase for `cmd`, whose CDB needs `need` bytes, with the command's
    /// immediate data; `budget` is the connection's, for reserving the write whole.
    pub fn new(
        params: &SessionParams,
        cmd: &ScsiCommand,
        immediate: Bytes,
        need: u32,
        budget: &ReserveBudget,
    ) -> Result<Self, DataError> {
        Self::with_lent(params, cmd, immediate, need, budget, None)
    }

    /// [`WriteState::new`], with `lent`: room reserved for this write before its command was
    /// handled ([`Lent`]). When the immediate data is the only holder of a buffer with room
    /// for everything kept, that buffer becomes the write's, nothing copied; otherwise the
    /// share goes back and the data is stored as [`WriteState::new`] stores it.
    pub fn with_lent(
        params: &SessionParams,
        cmd: &ScsiCommand,
        immediate: Bytes,
        need: u32,
        budget: &ReserveBudget,
        lent: Option<Lent>,
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
        let n = imm.min(keep) as usize;
        // Immediate data that is all the SCSI layer keeps is passed on as it came (any later
        // Data-Out lies past `keep` and is not stored).
        let whole = (n > 0 && n == keep as usize).then(|| immediate.slice(..n));
        // §11.3.1: with F=0 and InitialR2T=No, unsolicited Data-Out follows up to
        // min(FirstBurstLength, EDTL) in total.
        let (unsolicited_end, unsolicited_open) = if !cmd.final_ && !params.initial_r2t {
            let end = edtl.min(params.first_burst_length);
            (end, end > imm)
        } else {
            (imm, false)
        };
        let solicit_end = keep.max(unsolicited_end);
        let mut w = Self {
            edtl,
            keep,
            buf: BytesMut::new(),
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
            budget: budget.clone(),
            grant: None,
        };
        let mut immediate = immediate;
        if let Some(l) = lent.filter(|l| l.itt == cmd.itt && n > 0 && w.whole.is_none()) {
            // The immediate data was received into a buffer reserved for the whole write
            // (`imm` < `keep` here: `whole` is `None`).
            match immediate.try_into_mut() {
                Ok(buf) if buf.capacity() >= w.keep as usize && buf.len() == n => {
                    w.buf = buf;
                    w.grant = Some(l.grant);
                    return Ok(w);
                }
                Ok(buf) => immediate = buf.freeze(),
                Err(b) => immediate = b,
            }
        }
        if n > 0 && w.whole.is_none() {
            // Immediate data is data already here: like the first bytes of a burst (see
            // `store`), it makes room for what follows, so the next burst does not reallocate
            // and copy it.
            let burst_end = imm.saturating_add(params.max_burst_length);
            w.make_room(n, burst_end);
            w.buf.extend_from_slice(&immediate[..n]);
        }
        Ok(w)
    }

    /// Makes room in the buffer for data up to `end`, in a burst that ends at `burst_end`:
    /// the whole write at once when the connection's [`ReserveBudget`] grants it (issue 27:
    /// one allocation per write, nothing copied again), otherwise the rest of that burst
    /// (at most MaxBurstLength or FirstBurstLength, RFC 7143 §13.13–14). Called only when
    /// data is here: a CDB and EDTL alone never reserve memory (issue 8: 32 data-less 64 MiB
    /// writes used to map 2 GiB).
    fn make_room(&mut self, end: usize, burst_end: u32) {
        let keep = self.keep as usize;
        if self.buf.capacity() >= keep {
            return;
        }
        let burst = (burst_end.min(self.keep) as usize).max(end);
        // A write that ends within this burst needs nothing of the budget.
        if burst < keep && self.grant.is_none() {
            if let Some(g) = self.budget.grant(keep) {
                self.grant = Some(g);
                self.buf.reserve(keep - self.buf.len());
                return;
            }
        }
        if burst > self.buf.capacity() {
            self.buf.reserve(burst - self.buf.len());
        }
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
        self.make_room(end, burst_end);
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
    /// Memory is reserved when data arrives, never on a CDB's or R2T's say-so
    /// ([`WriteState::make_room`]): the whole write, or the rest of the burst, so in-order
    /// data is appended with one copy (no zero-fill first) and never moved again.
    fn store(&mut self, offset: u32, data: &[u8], burst_end: u32) {
        let start = offset.min(self.keep) as usize;
        let end = (offset as usize + data.len()).min(self.keep as usize);
        if end <= start {
            return;
        }
        self.make_room(end, burst_end);
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
        // The budget's share is given back as `self` goes: the buffer is all data now.
        let mut buf = self.buf;
        buf.resize(self.keep as usize, 0);
        buf.freeze()
    }
}

#[cfg(test)]
mod tests;
