//! A command's answer on the initiator's connection: Data-In into the read buffer (DataSN,
//! offsets; buffers lent to the driver for data received in place, RFC 7143 §11.7) and the
//! SCSI Response with its status, sense and residual (§11.4).

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{DataIn, ScsiResponse};
use iscsi_wire::{Opcode, Pdu};

use super::{bind_read_buffer, Completion, Connection, Phase, TaskError};
use crate::engine::Violation;

impl Connection {
    /// A read buffer nobody uses any more: a command's own buffer, after a Data-In that carried
    /// the whole read was handed to it instead (no copy). The driver's reader receives into it
    /// next, so the buffers go round without an allocation per command.
    pub fn take_spare_buffer(&mut self) -> Option<BytesMut> {
        self.spare.take()
    }

    /// Where a Data-In segment of `len` bytes at `offset` for task `itt` can be received in
    /// place (issue 27: a READ whose data comes in several Data-In PDUs): the free end of the
    /// command's own buffer, from `offset` on, as a `BytesMut` of its own. The driver receives
    /// at most `len` bytes into it and gives it back with the PDU
    /// ([`Connection::handle_placed_data_in`]), which joins it to the data before it without a
    /// copy. `None` (receive the segment as usual) unless the task is sent, reads, and
    /// `offset` is where its data goes on (§13.18: DataPDUInOrder=Yes) with room for `len`
    /// bytes. Nothing is changed for the task: what it received so far stays in its buffer,
    /// so a segment lent and never given back (the connection failed) loses nothing of it.
    pub fn lend_read_buffer(&mut self, itt: u32, offset: u32, len: usize) -> Option<BytesMut> {
        if self.closed.is_some() {
            return None;
        }
        let t = self.tasks.get_mut(&itt)?;
        if !matches!(t.phase, Phase::Sent(_)) || offset != t.received {
            return None;
        }
        let end = u64::from(offset) + len as u64;
        if t.discard {
            // Checked and counted when it comes back, its bytes then dropped: every such
            // segment goes into the same scratch buffer (libiscsi's `iscsi-perf` receives
            // each Data-In into one heap block freed and reused at once).
            if end > u64::from(t.read_len) {
                return None;
            }
            let mut b = self.scratch.take().unwrap_or_default();
            b.clear();
            b.reserve(len);
            return Some(b);
        }
        let buf = t.read.as_mut()?;
        if offset == 0 {
            bind_read_buffer(buf, &mut self.read_pool, t.read_len as usize);
        }
        if buf.len() != offset as usize
            || end > u64::from(t.read_len)
            || buf.capacity() - buf.len() < len
        {
            return None;
        }
        let at = buf.len();
        Some(buf.split_off(at))
    }

    /// A Data-In PDU whose segment the driver received into the buffer
    /// [`Connection::lend_read_buffer`] lent (`data`: the segment's bytes, at the front of
    /// it; `pdu.data` is empty). Checked and accounted as [`Connection::handle_pdu`] does any
    /// Data-In; the segment joins the command's data in place.
    pub fn handle_placed_data_in(&mut self, now: Instant, pdu: Pdu, data: BytesMut) {
        self.handle(now, pdu, Some(data));
    }

    pub(super) fn on_data_in(&mut self, h: &DataIn, data: Segment) {
        let now_itt = h.itt;
        // Out of `self` while the task is borrowed (`bind_read_buffer`, a discarded read's
        // scratch buffer); put back below.
        let mut pool = std::mem::take(&mut self.read_pool);
        let mut scratch = self.scratch.take();
        let spare_free = self.spare.is_none();
        let Some(t) = self.live_task(Opcode::SCSI_DATA_IN, now_itt) else {
            self.read_pool = pool;
            self.scratch = scratch;
            return;
        };
        let off = h.buffer_offset;
        let len = data.len() as u64;
        let check = if t.read.is_none() {
            Err(Violation::DataInWithoutRead)
        } else if off != t.received {
            // DataPDUInOrder=Yes, DataSequenceInOrder=Yes (§13.18, §13.19).
            Err(Violation::DataInOffset {
                expected: t.received,
                got: off,
            })
        } else if u64::from(off) + len > u64::from(t.read_len) {
            Err(Violation::DataInPastEnd {
                end: u64::from(off) + len,
                len: t.read_len,
            })
        } else if h.data_sn != t.next_data_sn {
            Err(Violation::DataInSn {
                expected: t.next_data_sn,
                got: h.data_sn,
            })
        } else {
            Ok(())
        };
        if let Err(v) = check {
            // At ErrorRecoveryLevel 0 a Data-In sequence cannot be repaired (no SNACK,
            // §7.1.4): the connection ends, and every task with it.
            self.read_pool = pool;
            self.scratch = scratch;
            self.violation(v);
            return;
        }
        let n = data.len() as u32;
        let mut spare = None;
        let data = match data {
            Segment::Placed(mut b) if t.discard => {
                // Checked above and counted below, its bytes dropped; the scratch buffer is
                // lent again for the next segment.
                b.clear();
                if scratch.as_ref().is_none_or(|s| s.capacity() < b.capacity()) {
                    scratch = Some(b);
                }
                Bytes::new()
            }
            Segment::Received(b) if t.discard => {
                // Received whole in the reader's buffer: that buffer goes back to the reader
                // when nothing else holds it (`take_spare_buffer`), its bytes dropped.
                if spare_free {
                    spare = b.try_into_mut().ok().filter(|b| b.capacity() > 0);
                }
                Bytes::new()
            }
            Segment::Received(data) => data,
            Segment::Placed(tail) => {
                // Received into the free end of this buffer (`lend_read_buffer`): joined
                // without a copy (`unsplit` copies only if it is not that memory).
                if let Some(buf) = t.read.as_mut() {
                    buf.unsplit(tail);
                }
                Bytes::new()
            }
        };
        if data.is_empty() {
            // Placed above (or an empty segment): nothing to copy.
        } else if off == 0 && n == t.read_len && n > 0 {
            // The whole read in one PDU: its segment becomes the caller's data, no copy, when
            // nothing else holds the receive buffer it sits in (the driver's reader leaves it
            // so, `ipsan_transport::FrameReader::hand_over`); the caller's buffer then goes
            // back to the reader (`take_spare_buffer`). Otherwise it is copied (issue 27).
            // A buffer from the pool goes back to the reader instead of the task's unbound one.
            match data.try_into_mut() {
                Ok(whole) => {
                    spare = t
                        .read
                        .replace(whole)
                        .filter(|b| b.capacity() > 0)
                        .or_else(|| pool.pop());
                }
                Err(data) => {
                    if let Some(buf) = t.read.as_mut() {
                        bind_read_buffer(buf, &mut pool, t.read_len as usize);
                        buf.extend_from_slice(&data);
                    }
                }
            }
        } else if let Some(buf) = t.read.as_mut() {
            // `off == received == buf.len()`, checked above.
            if off == 0 {
                bind_read_buffer(buf, &mut pool, t.read_len as usize);
            }
            buf.extend_from_slice(&data);
        }
        t.received += n;
        t.next_data_sn = t.next_data_sn.wrapping_add(1);
        self.read_pool = pool;
        self.scratch = scratch;
        if spare.is_some() {
            self.spare = spare;
        }
        if h.status_present {
            let residual = residual_of(h.underflow, h.overflow, h.residual_count);
            self.status(now_itt, h.status, None, residual);
        }
    }

    pub(super) fn on_response(&mut self, h: &ScsiResponse, data: &Bytes) {
        if self.live_task(Opcode::SCSI_RESPONSE, h.itt).is_none() {
            // Status for an abandoned task: its cleanup is moot, forget it.
            if self
                .tasks
                .get(&h.itt)
                .is_some_and(|t| t.phase == Phase::Abandoned)
            {
                self.tasks.remove(&h.itt);
            }
            return;
        }
        if h.response != 0 {
            self.finish(h.itt, Err(TaskError::IscsiResponse(h.response)));
            return;
        }
        // Sense data: 2-byte SenseLength, then the sense bytes (§11.4.7.2).
        let sense = (data.len() >= 2).then(|| {
            let sl = usize::from(u16::from_be_bytes([data[0], data[1]]));
            data.slice(2..(2 + sl).min(data.len()))
        });
        let sense = sense.filter(|s| !s.is_empty());
        let residual = residual_of(h.underflow, h.overflow, h.residual_count);
        self.status(h.itt, h.status, sense, residual);
    }

    pub(super) fn status(&mut self, itt: u32, status: u8, sense: Option<Bytes>, residual: i64) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        // The data is what arrived, cut to what the target says it sent (underflow).
        let mut data = t.read.take().unwrap_or_default();
        let expected = if residual > 0 {
            (t.read_len as usize).saturating_sub(residual as usize)
        } else {
            t.read_len as usize
        };
        data.truncate(expected);
        let good = status == 0x00 || status == 0x04;
        let result = if good && (t.received as usize) < expected {
            // GOOD with fewer bytes than promised: the caller would get less than the
            // target says it sent.
            Err(TaskError::Violation(Violation::ShortRead {
                received: t.received,
                expected: expected as u32,
            }))
        } else {
            Ok(Completion {
                status,
                sense,
                data,
                residual,
            })
        };
        self.finish(itt, result);
    }
}

/// A Data-In segment: received as bytes of its own, or received in place into the free end
/// of the task's buffer ([`Connection::lend_read_buffer`]).
pub(super) enum Segment {
    Received(Bytes),
    Placed(BytesMut),
}

impl Segment {
    fn len(&self) -> usize {
        match self {
            Segment::Received(b) => b.len(),
            Segment::Placed(b) => b.len(),
        }
    }
}

pub(super) fn residual_of(underflow: bool, overflow: bool, count: u32) -> i64 {
    if underflow {
        i64::from(count)
    } else if overflow {
        -i64::from(count)
    } else {
        0
    }
}
