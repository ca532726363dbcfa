//! A SCSI Command and its data-out on the target's connection: the CDB assembled (Extended
//! CDB AHS, RFC 7143 §11.2.2.3), the command sized by the driver's [`LunDirectory`], its
//! immediate and unsolicited data, R2Ts (§11.8) and Data-Out (§11.7) until the data phase is
//! over, then [`Event::Execute`].

use std::collections::VecDeque;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use iscsi_wire::header::{DataOut, Header, R2t, RejectReason, ScsiCommand};
use iscsi_wire::Pdu;

use super::{Collect, Connection, Event, Execute, LunDirectory, Response, Sizing, Task, TaskState};
use crate::engine::r2t::{DataError, R2tPlan, WriteState};
use crate::params::SessionType;

impl<D> Connection<D> {
    /// One R2T per plan of task `itt` (RFC 7143 §11.8): the first ones of a write, or a
    /// recovery's again (§7.2.2).
    pub(super) fn send_r2ts(&mut self, lun: u64, itt: u32, plans: Vec<R2tPlan>) {
        for p in plans {
            self.send(R2t {
                lun,
                itt,
                ttt: p.ttt,
                r2t_sn: p.r2t_sn,
                buffer_offset: p.offset,
                desired_data_transfer_length: p.len,
                ..R2t::default()
            });
        }
    }

    pub(super) fn on_command(
        &mut self,
        dir: &dyn LunDirectory<D>,
        cmd: ScsiCommand,
        ahs: &Bytes,
        data: Bytes,
        raw: &[u8; 48],
    ) {
        // Room reserved while its immediate data came in place, for this command only: any
        // other (or this one refused) gives it back.
        let lent = self.lent.take();
        if !self.admit(cmd.cmd_sn, cmd.immediate, true) {
            return;
        }
        let counted = !cmd.immediate;
        let refuse = |s: &mut Self, reason| {
            s.reject(reason, raw);
            if counted {
                s.window.complete();
            }
        };
        if self.tasks.contains_key(&cmd.itt) {
            // A task tag is unique among the session's active tasks (§11.2.1.8).
            return refuse(self, RejectReason::INVALID_PDU_FIELD);
        }
        if !counted && self.immediate_tasks() >= super::MAX_IMMEDIATE_TASKS {
            // The window does not bound immediate commands: this does (the task table's
            // bound, `Connection::tasks`; §4.2.2.1 lets a target refuse them).
            return refuse(self, RejectReason::IMMEDIATE_COMMAND_REJECT);
        }
        let Some(cdb) = assemble_cdb(&cmd, ahs) else {
            return refuse(self, RejectReason::PROTOCOL_ERROR);
        };
        let edtl = cmd.expected_data_transfer_length;
        let Sizing {
            need,
            mut early,
            transfer,
            decoded,
        } = if dir.passthrough(cmd.lun) {
            Sizing {
                need: if cmd.write { u64::from(edtl) } else { 0 },
                ..Sizing::default()
            }
        } else {
            dir.size(cmd.itt, cmd.lun, &cdb, edtl)
        };
        let need = if need > self.max_command_bytes {
            // INVALID FIELD IN CDB: no buffer this large on a CDB's say-so.
            early = Some(Response::check(0x05, 0x24, 0x00));
            0
        } else {
            need
        };
        let transfer = transfer.unwrap_or(need);
        if !cmd.write {
            if !data.is_empty() {
                // Immediate data on a command without the W bit (§11.3.1).
                return refuse(self, RejectReason::PROTOCOL_ERROR);
            }
            self.tasks.insert(
                cmd.itt,
                Task {
                    lun: cmd.lun,
                    counted,
                    edtl,
                    need,
                    state: TaskState::Running { aborted: false },
                },
            );
            self.events.push_back(Event::Execute(Execute {
                itt: cmd.itt,
                lun: cmd.lun,
                cdb,
                data_out: Bytes::new(),
                edtl,
                need,
                transfer,
                early,
                write_without_w: need > 0,
                read: cmd.read,
                write: false,
                decoded,
            }));
            return;
        }
        let need32 = u32::try_from(need).unwrap_or(u32::MAX);
        let write =
            match WriteState::with_lent(&self.params, &cmd, data, need32, &self.reserve, lent) {
                Ok(w) => w,
                Err(_) => return refuse(self, RejectReason::PROTOCOL_ERROR),
            };
        // Solicited with the task in hand as it goes in, not looked up again.
        let task = self
            .tasks
            .entry(cmd.itt)
            .insert_entry(Task {
                lun: cmd.lun,
                counted,
                edtl,
                need,
                state: TaskState::Collecting(Box::new(Collect {
                    cdb,
                    decoded,
                    need,
                    transfer,
                    early,
                    write,
                    read: cmd.read,
                })),
            })
            .into_mut();
        let plans = solicit_task(&mut self.ttt, &mut self.events, cmd.itt, task);
        self.send_r2ts(cmd.lun, cmd.itt, plans);
    }

    /// Sends the R2Ts a collecting task may have outstanding now, or starts it when its data
    /// is all here.
    pub(super) fn solicit(&mut self, itt: u32) {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        let lun = task.lun;
        let plans = solicit_task(&mut self.ttt, &mut self.events, itt, task);
        self.send_r2ts(lun, itt, plans);
    }

    /// The data phase is over: hand the command to the driver.
    pub(super) fn start(&mut self, itt: u32, fail: Option<Response>) {
        let Some(task) = self.tasks.get_mut(&itt) else {
            return;
        };
        start_task(&mut self.events, itt, task, fail);
    }

    /// Where a Data-Out of `len` bytes can be received in place (issue 27): the free end of
    /// its write's own buffer ([`WriteState::lend`]), so the driver receives the data there
    /// instead of copying it from its receive buffer; it gives the buffer back with the PDU
    /// ([`Connection::handle_placed_data_out`]). `None`: receive it as usual. Nothing is
    /// changed for the task but room reserved: a buffer never given back loses nothing.
    pub fn lend_write_buffer(&mut self, h: &DataOut, len: usize) -> Option<BytesMut> {
        if self.closed.is_some() || self.params.session_type == SessionType::Discovery {
            return None;
        }
        match self.tasks.get_mut(&h.itt) {
            Some(Task {
                state: TaskState::Collecting(c),
                ..
            }) => c.write.lend(h, len),
            _ => None,
        }
    }

    /// Where a write command's immediate data of `len` bytes can be received in place
    /// (issue 27): an empty buffer with room for the whole write, its EDTL (at most
    /// [`Config::max_command_bytes`](super::Config)), reserved from the connection's
    /// [`ReserveBudget`] as a write's first bytes reserve it ([`WriteState::with_lent`] takes
    /// the buffer as the write's own when the command comes with it, so the immediate data is
    /// not copied from the driver's receive buffer, nor the Data-Out after it moved). Only
    /// for a write whose Data-Out follows (EDTL beyond the immediate data; a write that is
    /// all immediate data is passed on as it came) and only when the budget has room: a
    /// CDB's say-so reserves nothing beyond it. `None`: receive it as usual. The share goes
    /// back with the next command this connection handles, whichever it is.
    pub fn lend_command_buffer(&mut self, cmd: &ScsiCommand, len: usize) -> Option<BytesMut> {
        if self.closed.is_some()
            || self.params.session_type == SessionType::Discovery
            || !cmd.write
            || !self.params.immediate_data
            || len > self.params.first_burst_length as usize
            || self.tasks.contains_key(&cmd.itt)
        {
            return None;
        }
        let edtl = u64::from(cmd.expected_data_transfer_length);
        if edtl <= len as u64 || edtl > self.max_command_bytes {
            return None;
        }
        self.lent = None;
        let (lent, buf) = self.reserve.lend(cmd.itt, usize::try_from(edtl).ok()?)?;
        self.lent = Some(lent);
        Some(buf)
    }

    /// Whether a Data-Out may come for one of this connection's writes now (unsolicited data
    /// open, or an R2T outstanding): the driver then reads the next PDU's head alone, so a
    /// long one is received in place whole ([`Connection::lend_write_buffer`]).
    #[must_use]
    pub fn awaits_data_out(&self) -> bool {
        self.tasks
            .values()
            .any(|t| matches!(&t.state, TaskState::Collecting(c) if c.write.awaits_data_out()))
    }

    /// A Data-Out whose data the driver received into the buffer
    /// [`Connection::lend_write_buffer`] lent (`data`: exactly its data; `pdu.data` is
    /// empty): handled as [`Connection::handle_pdu`] handles any Data-Out (§11.7), the data
    /// joined to the write's without a copy.
    pub fn handle_placed_data_out(&mut self, now: Instant, pdu: Pdu, data: BytesMut) {
        if self.closed.is_some() {
            return;
        }
        self.heard(now);
        if self.params.error_recovery_level > 0 {
            self.acknowledged(&pdu.header);
        }
        // A placed PDU has no received BHS: a Reject carries the header as decoded.
        let mut raw = [0u8; 48];
        pdu.header.write(&mut raw);
        match pdu.header {
            Header::DataOut(h) if self.params.session_type != SessionType::Discovery => {
                self.on_data_out(&h, &[], Some(data), &raw)
            }
            _ => self.reject(RejectReason::PROTOCOL_ERROR, &raw),
        }
    }

    /// `placed`: the data, received in place ([`Connection::handle_placed_data_out`]).
    pub(super) fn on_data_out(
        &mut self,
        h: &DataOut,
        data: &[u8],
        placed: Option<BytesMut>,
        raw: &[u8; 48],
    ) {
        let result = match self.tasks.get_mut(&h.itt) {
            Some(Task {
                state: TaskState::Collecting(c),
                ..
            }) => match placed {
                Some(p) => c.write.on_placed_data_out(h, p),
                None => c.write.on_data_out(h, data),
            },
            Some(_) => Err(DataError("Data-Out for a command past its data phase")),
            None => {
                if !self.aborted.contains(&h.itt) {
                    self.reject(RejectReason::INVALID_PDU_FIELD, raw);
                }
                return;
            }
        };
        match result {
            Ok(()) => self.solicit(h.itt),
            Err(_) => {
                self.reject(RejectReason::PROTOCOL_ERROR, raw);
                // ERL 0 cannot repair a data phase: the command ends with CHECK CONDITION,
                // ABORTED COMMAND / DATA PHASE ERROR (4Bh/00h) once the PDUs in flight for it
                // are dropped.
                if matches!(
                    self.tasks.get(&h.itt).map(|t| &t.state),
                    Some(TaskState::Collecting(_))
                ) {
                    self.remember_aborted(h.itt);
                    self.start(h.itt, Some(Response::check(0x0b, 0x4b, 0x00)));
                }
            }
        }
    }
}

/// The CDB: 16 bytes in the BHS, continued in an Extended CDB AHS (§11.2.2.3).
pub(super) fn assemble_cdb(cmd: &ScsiCommand, ahs: &Bytes) -> Option<Vec<u8>> {
    let mut cdb = cmd.cdb.to_vec();
    let mut rest = &ahs[..];
    while rest.len() >= 4 {
        let len = usize::from(u16::from_be_bytes([rest[0], rest[1]]));
        let kind = rest[2];
        let total = iscsi_wire::pad4(3 + len);
        if total > rest.len() || len == 0 {
            return None;
        }
        if kind == 1 {
            // AHSLength counts the reserved byte plus the CDB continuation.
            cdb.extend_from_slice(&rest[4..3 + len]);
        }
        rest = &rest[total..];
    }
    Some(cdb)
}

/// [`Connection::solicit`] with the task in hand: the R2Ts a collecting task may have
/// outstanding now (for [`Connection::send_r2ts`]), and its [`Event::Execute`] when its data is
/// all here (the R2T queue and the events are apart: the order of the two changes no output).
fn solicit_task<D>(
    ttt: &mut super::TagAllocator,
    events: &mut VecDeque<Event<D>>,
    itt: u32,
    task: &mut Task<D>,
) -> Vec<R2tPlan> {
    let TaskState::Collecting(c) = &mut task.state else {
        return Vec::new();
    };
    let plans = c.write.plan_r2ts(|| ttt.next_tag());
    if c.write.is_complete() {
        start_task(events, itt, task, None);
    }
    plans
}

/// [`Connection::start`] with the task in hand: a collecting task's [`Event::Execute`].
fn start_task<D>(
    events: &mut VecDeque<Event<D>>,
    itt: u32,
    task: &mut Task<D>,
    fail: Option<Response>,
) {
    let lun = task.lun;
    let state = std::mem::replace(&mut task.state, TaskState::Running { aborted: false });
    let TaskState::Collecting(c) = state else {
        task.state = state;
        return;
    };
    let edtl = c.write.edtl();
    events.push_back(Event::Execute(Execute {
        itt,
        lun,
        cdb: c.cdb,
        data_out: c.write.into_data(),
        edtl,
        need: c.need,
        transfer: c.transfer,
        early: fail.or(c.early),
        write_without_w: false,
        read: c.read,
        write: true,
        decoded: c.decoded,
    }));
}
