//! A command out on the initiator's connection: submission, the CmdSN window (RFC 7143
//! §4.2.2.1), the SCSI Command with its immediate data and unsolicited Data-Out (§4.2.5.1,
//! §13.10, §13.14), and R2Ts checked and answered with Data-Out (§11.8, §11.7).

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{DataOut, R2t, ScsiCommand, TaskAttr};
use iscsi_wire::{Opcode, Pdu, RESERVED_TAG};

use super::{Command, Connection, Data, Phase, SubmitError, Task, READ_POOL_MAX};
use crate::engine::Violation;
use crate::seq::{sn_le, sn_lt};

impl Connection {
    /// Submits a command; it leaves as soon as the window allows.
    pub fn submit(&mut self, now: Instant, cmd: Command) -> Result<u32, SubmitError> {
        let itt = self.alloc_itt();
        self.submit_as(now, itt, cmd)
    }

    /// Submits a command under an ITT from [`Connection::alloc_itt`].
    pub fn submit_as(&mut self, now: Instant, itt: u32, cmd: Command) -> Result<u32, SubmitError> {
        if let Some(e) = self.closed {
            return Err(SubmitError::Closed(e));
        }
        if self.logout_asked || self.logout.is_some() {
            return Err(SubmitError::LogoutRequested);
        }
        if itt == RESERVED_TAG || self.tasks.contains_key(&itt) {
            return Err(SubmitError::Invalid);
        }
        if !self.reserved.is_empty() {
            self.reserved.remove(&itt);
        }
        let write_len = cmd.data.write_len();
        if write_len.is_some_and(|n| u32::try_from(n).is_err()) {
            return Err(SubmitError::Invalid);
        }
        let write_bit = write_len.is_some();
        let discard = matches!(cmd.data, Data::Discard { .. });
        let (write, write_tail, read, read_len) = match cmd.data {
            Data::None => (Bytes::new(), Bytes::new(), None, 0),
            Data::Write(b) => (b, Bytes::new(), None, 0),
            Data::WriteParts { data, tail } => (data, tail, None, 0),
            Data::Discard { len } => (Bytes::new(), Bytes::new(), Some(BytesMut::new()), len),
            Data::Read { mut buf, len } => {
                // Data-In arrives in order (DataPDUInOrder=Yes) and is appended: no memset of
                // the whole buffer ahead of the data, and nothing stale can leak. The buffer
                // joins the pool; the read takes one when its data arrives (issue 27).
                buf.clear();
                if buf.capacity() > 0 && self.read_pool.len() < READ_POOL_MAX {
                    self.read_pool.push(buf);
                }
                (Bytes::new(), Bytes::new(), Some(BytesMut::new()), len)
            }
        };
        let deadline = self
            .command_timeout
            .filter(|_| cmd.timed)
            .map(|limit| now + limit);
        if let Some(d) = deadline {
            self.deadlines.push_back((d, itt));
        }
        self.tasks.insert(
            itt,
            Task {
                lun: cmd.lun,
                cdb: cmd.cdb,
                write,
                write_tail,
                write_bit,
                read,
                read_len,
                discard,
                received: 0,
                next_data_sn: 0,
                next_r2t_sn: 0,
                unsent_r2ts: Vec::new(),
                solicited: Vec::new(),
                phase: Phase::Queued,
                deadline,
                timed_out: false,
                reassigned: false,
                reassigns: 0,
            },
        );
        self.queued.push_back(itt);
        self.flush_queued();
        Ok(itt)
    }

    /// Sends queued commands while the window is open.
    pub(super) fn flush_queued(&mut self) {
        while self.closed.is_none() && sn_le(self.cmd_sn, self.max_cmd_sn) {
            let Some(itt) = self.queued.pop_front() else {
                return;
            };
            let cmd_sn = self.cmd_sn;
            self.cmd_sn = self.cmd_sn.wrapping_add(1);
            self.send_command(itt, cmd_sn);
        }
    }

    /// The command PDU with its immediate data, then unsolicited Data-Out (§4.2.5.1).
    pub(super) fn send_command(&mut self, itt: u32, cmd_sn: u32) {
        let Some(t) = self.tasks.get_mut(&itt) else {
            return;
        };
        t.phase = Phase::Sent(cmd_sn);
        let p = &self.params;
        let seg = p.target_max_recv_data_segment_length.max(512) as usize;
        let first_burst = p.first_burst_length as usize;
        let total = t.write.len() + t.write_tail.len();
        let mut imm = if p.immediate_data {
            total.min(first_burst).min(seg)
        } else {
            0
        };
        let unsolicited_end = if p.initial_r2t {
            imm
        } else {
            total.min(first_burst)
        };
        // A two-part write's immediate data stops at the join when Data-Out may carry the rest
        // unsolicited (the tail then goes in a Data-Out of its own, nothing copied); under
        // InitialR2T=Yes no Data-Out may, and the two are joined (`write_slice`).
        if !p.initial_r2t {
            imm = write_cut(&t.write, &t.write_tail, 0, imm);
        }
        let edtl = u32::try_from(total).unwrap_or(u32::MAX).max(t.read_len);
        t.solicited.push((0, unsolicited_end as u32));
        self.out.push_back(Pdu::new(
            ScsiCommand {
                immediate: false,
                final_: unsolicited_end == imm,
                // The R and W bits say what the caller asked for, even for 0 bytes (§11.3.1).
                read: t.read.is_some(),
                write: t.write_bit,
                attr: TaskAttr::SIMPLE,
                lun: t.lun,
                itt,
                expected_data_transfer_length: edtl,
                cmd_sn,
                exp_stat_sn: 0,
                cdb: t.cdb,
            },
            write_slice(&t.write, &t.write_tail, 0, imm),
        ));
        let mut off = imm;
        let mut data_sn = 0u32;
        while off < unsolicited_end {
            let end = write_cut(
                &t.write,
                &t.write_tail,
                off,
                (off + seg).min(unsolicited_end),
            );
            self.out.push_back(Pdu::new(
                DataOut {
                    final_: end == unsolicited_end,
                    lun: t.lun,
                    itt,
                    ttt: RESERVED_TAG,
                    exp_stat_sn: 0,
                    data_sn,
                    buffer_offset: off as u32,
                },
                write_slice(&t.write, &t.write_tail, off, end),
            ));
            data_sn = data_sn.wrapping_add(1);
            off = end;
        }
    }

    /// Checks an R2T against RFC 7143 §11.8 and the negotiated limits, then answers it with
    /// Data-Out PDUs of at most the target's MaxRecvDataSegmentLength (slices of the write
    /// buffer, no copy).
    pub(super) fn on_r2t(&mut self, now: Instant, h: &R2t) {
        let max_burst = self.params.max_burst_length;
        let max_outstanding = self.params.max_outstanding_r2t.max(1);
        let seg = self.params.target_max_recv_data_segment_length.max(512);
        let Some(t) = self.live_task(Opcode::R2T, h.itt) else {
            return;
        };
        let (off, len) = (h.buffer_offset, h.desired_data_transfer_length);
        let total = u32::try_from(t.write.len() + t.write_tail.len()).unwrap_or(u32::MAX);
        let end = u64::from(off) + u64::from(len);
        let check = if total == 0 {
            Err(Violation::R2tWithoutWrite)
        } else if h.ttt == RESERVED_TAG {
            Err(Violation::R2tReservedTag)
        } else if len == 0 || end > u64::from(total) {
            Err(Violation::R2tOutsideWrite {
                offset: off,
                len,
                total,
            })
        } else if len > max_burst {
            Err(Violation::R2tOverBurst {
                len,
                max: max_burst,
            })
        } else if if t.reassigned {
            // Recovery R2Ts number on from the last R2T the target sent, which may have been
            // lost with the failed connection (RFC 7143 §7.2.2): only never backwards.
            sn_lt(h.r2t_sn, t.next_r2t_sn)
        } else {
            h.r2t_sn != t.next_r2t_sn
        } {
            Err(Violation::R2tSn {
                expected: t.next_r2t_sn,
                got: h.r2t_sn,
            })
        } else if t.unsent_r2ts.iter().any(|(ttt, _)| *ttt == h.ttt) {
            Err(Violation::R2tDuplicateTag { ttt: h.ttt })
        } else if t.unsent_r2ts.len() as u32 >= max_outstanding {
            // The target cannot have seen the data of these yet: it has more than
            // MaxOutstandingR2T outstanding (§13.17).
            Err(Violation::R2tOutstanding {
                max: max_outstanding,
            })
        } else if t
            .solicited
            .iter()
            .any(|&(o, l)| off < o.saturating_add(l) && o < off.saturating_add(len))
        {
            Err(Violation::R2tOverlap { offset: off, len })
        } else {
            Ok(())
        };
        if let Err(v) = check {
            self.abandon(now, h.itt, v);
            return;
        }
        t.next_r2t_sn = h.r2t_sn.wrapping_add(1);
        t.solicited.push((off, len));
        let (lun, write, tail) = (t.lun, t.write.clone(), t.write_tail.clone());
        // The PDUs are counted from the join of a two-part write on when it falls inside.
        let join = u32::try_from(write.len()).unwrap_or(u32::MAX);
        let pdus = if !tail.is_empty() && off < join && join < off + len {
            (join - off).div_ceil(seg) + (off + len - join).div_ceil(seg)
        } else {
            len.div_ceil(seg)
        };
        t.unsent_r2ts.push((h.ttt, pdus));
        let mut pos = off;
        let mut data_sn = 0u32;
        let stop = off + len;
        while pos < stop {
            let e = (pos + seg).min(stop);
            let e = write_cut(&write, &tail, pos as usize, e as usize) as u32;
            self.out.push_back(Pdu::new(
                DataOut {
                    final_: e == stop,
                    lun,
                    itt: h.itt,
                    ttt: h.ttt,
                    exp_stat_sn: 0,
                    data_sn,
                    buffer_offset: pos,
                },
                write_slice(&write, &tail, pos as usize, e as usize),
            ));
            data_sn = data_sn.wrapping_add(1);
            pos = e;
        }
    }

    /// The last Data-Out answering `ttt` left: that R2T is no longer ours to answer.
    pub(super) fn r2t_answered(&mut self, itt: u32, ttt: u32) {
        if let Some(t) = self.tasks.get_mut(&itt) {
            t.unsent_r2ts.retain(|(x, _)| *x != ttt);
        }
    }
}

/// Where a PDU of write data that starts at `from` ends, at most at `to`: at the join of a
/// two-part write ([`Data::WriteParts`]: `data`, then `tail`) when the join falls between, so
/// that no PDU holds bytes of both parts.
fn write_cut(data: &Bytes, tail: &Bytes, from: usize, to: usize) -> usize {
    let join = data.len();
    if tail.is_empty() || from >= join || to <= join {
        to
    } else {
        join
    }
}

/// Write data `a..b` of `data` followed by `tail`: a slice of one part (no copy), or, for a
/// range over the join (only immediate data under InitialR2T=Yes), both parts' bytes joined.
fn write_slice(data: &Bytes, tail: &Bytes, a: usize, b: usize) -> Bytes {
    let join = data.len();
    if b <= join {
        data.slice(a..b)
    } else if a >= join {
        tail.slice(a - join..b - join)
    } else {
        let mut joined = BytesMut::with_capacity(b - a);
        joined.extend_from_slice(&data[a..]);
        joined.extend_from_slice(&tail[..b - join]);
        joined.freeze()
    }
}
