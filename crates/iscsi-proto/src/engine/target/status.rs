//! A command's answer on the target's connection: the device server's [`Response`] in
//! ([`Connection::complete`]), its Data-In and status out (§11.7, §11.4), with residuals
//! (§11.4.5).

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::DataIn;
use iscsi_wire::{Pdu, RESERVED_TAG};

use super::{Connection, Response, TaskState};
use crate::params::SessionParams;

impl<D> Connection<D> {
    /// The device server's answer to an [`Event::Execute`]. Unknown ITTs are ignored (false).
    pub fn complete(&mut self, itt: u32, resp: Response) -> bool {
        self.complete_with_residual(itt, resp, None)
    }

    /// [`Connection::complete`] with the residual decided by someone else: a pass-through
    /// LUN reports the remote target's residual (positive: underflow, negative: overflow;
    /// RFC 7143 §11.4.5) instead of one computed from EDTL and the data.
    pub fn complete_with_residual(
        &mut self,
        itt: u32,
        resp: Response,
        residual: Option<i64>,
    ) -> bool {
        // One lookup: a task still collecting its data goes back (the map's order is its
        // hasher's, random per process, so nothing depends on where it lands).
        let Some(task) = self.tasks.remove(&itt) else {
            return false;
        };
        let TaskState::Running { aborted } = task.state else {
            self.tasks.insert(itt, task);
            return false;
        };
        if task.counted {
            self.window.complete();
        }
        if !aborted && self.closed.is_none() {
            if self.params.error_recovery_level > 0 {
                self.retain(itt, &task, &resp, residual);
            }
            self.send_status(itt, task.lun, task.edtl, task.need, resp, residual);
        }
        self.release_held(itt);
        if self.logout.is_some() && !self.any_running() {
            self.answer_logout();
        }
        true
    }

    /// A command's Data-In and status (§11.7, §11.4): Data-In PDUs up to the initiator's
    /// MaxRecvDataSegmentLength, F at every MaxBurstLength boundary, and GOOD status collapsed
    /// into the last Data-In (§11.7.3); otherwise a SCSI Response carrying the sense data.
    /// Residuals (§11.4.5): data-out commands compare EDTL with what the CDB needs, data-in
    /// commands with what the device server produced.
    pub(super) fn send_status(
        &mut self,
        itt: u32,
        lun: u64,
        edtl: u32,
        need: u64,
        resp: Response,
        given: Option<i64>,
    ) {
        let (params, out, queued) = (&self.params, &mut self.out, &mut self.queued_bytes);
        status_pdus(params, itt, lun, edtl, need, &resp, given, &mut |pdu| {
            *queued += pdu.data.len();
            out.push_back((pdu, None));
        });
    }
}

/// A command's Data-In and status as PDUs, in order (see [`Connection::send_status`]): a
/// function of the response alone, so a retransmission (SNACK, TASK REASSIGN) regenerates the
/// same PDUs with the same DataSNs.
#[allow(clippy::too_many_arguments)]
pub(super) fn status_pdus(
    params: &SessionParams,
    itt: u32,
    lun: u64,
    edtl: u32,
    need: u64,
    resp: &Response,
    given: Option<i64>,
    emit: &mut dyn FnMut(Pdu),
) {
    let produced = u32::try_from(resp.data_in_len()).unwrap_or(u32::MAX);
    let base = if need > 0 {
        u32::try_from(need).unwrap_or(u32::MAX)
    } else {
        produced
    };
    let (overflow, underflow) = match given {
        Some(r) if r < 0 => (u32::try_from(-r).unwrap_or(u32::MAX), 0),
        Some(r) => (0, u32::try_from(r).unwrap_or(u32::MAX)),
        None => (base.saturating_sub(edtl), edtl.saturating_sub(base)),
    };
    let residual = overflow.max(underflow);
    let seg = params.initiator_max_recv_data_segment_length.max(512);
    let burst = params.max_burst_length.max(512);
    let data = resp.data_in.slice(..resp.data_in.len().min(edtl as usize));
    let room = (edtl as usize).saturating_sub(data.len());
    let trailer = resp
        .data_in_trailer
        .slice(..resp.data_in_trailer.len().min(room));
    let good = resp.status == Response::GOOD || resp.status == Response::CONDITION_MET;
    let collapse = good && resp.sense.is_none() && data.len() + trailer.len() > 0;
    let in_data = data.len() as u32;
    let total = (data.len() + trailer.len()) as u32;
    let mut offset = 0u32;
    let mut data_sn = 0u32;
    let mut in_burst = 0u32;
    while offset < total {
        let mut len = seg.min(total - offset).min(burst - in_burst);
        if offset < in_data {
            // No PDU carries bytes of both: each is a slice of one buffer.
            len = len.min(in_data - offset);
        }
        let last = offset + len == total;
        in_burst += len;
        let end_of_burst = in_burst == burst;
        if end_of_burst {
            in_burst = 0;
        }
        let status_here = last && collapse;
        let h = DataIn {
            final_: last || end_of_burst,
            acknowledge: false,
            overflow: status_here && overflow > 0,
            underflow: status_here && underflow > 0,
            status_present: status_here,
            status: if status_here { resp.status } else { 0 },
            lun,
            itt,
            ttt: RESERVED_TAG,
            data_sn,
            buffer_offset: offset,
            residual_count: if status_here { residual } else { 0 },
            ..DataIn::default()
        };
        let bytes = if offset < in_data {
            data.slice(offset as usize..(offset + len) as usize)
        } else {
            trailer.slice((offset - in_data) as usize..(offset - in_data + len) as usize)
        };
        emit(Pdu::new(h, bytes));
        offset += len;
        data_sn = data_sn.wrapping_add(1);
    }
    if collapse {
        return;
    }
    let body = match &resp.sense {
        Some(s) => {
            let mut b = BytesMut::with_capacity(s.len() + 2);
            b.extend_from_slice(&(s.len() as u16).to_be_bytes());
            b.extend_from_slice(s);
            b.freeze()
        }
        None => Bytes::new(),
    };
    emit(Pdu::new(
        iscsi_wire::header::ScsiResponse {
            overflow: overflow > 0,
            underflow: underflow > 0,
            response: 0,
            status: resp.status,
            itt,
            exp_data_sn: data_sn,
            residual_count: residual,
            ..iscsi_wire::header::ScsiResponse::default()
        },
        body,
    ));
}
