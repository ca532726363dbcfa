//! The controller-role NVMe/TCP connection machine, one per TCP connection (= one queue pair,
//! NVMe/TCP 1.0 §3.3), without I/O: bytes in, [`Command`]s and close events out,
//! [`Completion`]s in, PDUs out, time passed in.
//!
//! What it does, in the order a connection sees it:
//! - **Connection set-up** (§3.6.2.2-§3.6.2.3): the first PDU must be ICReq; the answer is an
//!   ICResp with PFV 0, our CPDA, the digests exactly as the host asked for them, and the
//!   MAXH2CDATA we accept. From then on the codec checks and writes the digests and aligns the
//!   data we send to the host's HPDA. The host's MAXR2T is kept: this machine never has more
//!   than one R2T outstanding per command, which every MAXR2T (0's based) allows.
//! - **Command capsules** (§3.3.1): in-capsule data up to the queue's in-capsule size — the
//!   admin queue's ([`QueueConfig::admin_in_capsule`], 8 KiB as Linux expects) or the I/O
//!   queues' ([`QueueConfig::io_in_capsule`], which the controller announces as IOCCSZ). The
//!   queue tells the two apart by the QID of the first command, which must be Connect (NVMe over
//!   Fabrics 1.1 §3.3); the controller refuses anything else. A write of at least
//!   [`QueueConfig::place_min`] bytes, in its capsule or in one H2CData, can be received into
//!   a buffer of its own ([`Queue::placement`]); the commands' write data held with the
//!   controller is counted ([`Queue::held`]) for the driver to bound.
//! - **Write data through the transport** (§3.4.1, §3.6.2.8, §3.6.2.10): a host-to-controller
//!   command with a transport SGL gets one R2T for its whole length (at most
//!   [`QueueConfig::max_transfer`]), and at most [`QueueConfig::max_r2t_commands`] commands
//!   receive data at once (later ones wait their turn, so a queue never buffers more than that
//!   many transfers). Every H2CData is checked: a TTAG we issued and its CCCID, DATAO exactly
//!   where the previous PDU ended, within the R2T, DATAL ≤ MAXH2CDATA, LAST_PDU set on the PDU
//!   that ends the R2T and on no other. Any violation is fatal.
//! - **Completions** (§3.6.2.7, §3.6.2.9): read data goes out as C2HData PDUs of at most
//!   [`QueueConfig::max_c2h_data`] bytes each (the payload is sliced, never copied), then the
//!   response capsule — or, when the host disabled SQ flow control at Connect (CATTR bit 2) and
//!   the command succeeded with nothing in DW0/DW1, the last C2HData carries SUCCESS and no
//!   capsule follows.
//! - **Errors**: a fatal transport error (a malformed PDU, a PDU out of sequence, data beyond
//!   an R2T, …) queues a C2HTermReq with the FES/FEI `nvme-wire` names and up to 128 bytes of
//!   the offending header (§3.6.2.4-§3.6.2.5), then reports [`Event::Closed`]; nothing more is
//!   read. A data digest error is not fatal (§3.6.1): the command completes with Transient
//!   Transport Error and never reaches the controller. An H2CTermReq from the host closes the
//!   connection without an answer.
//!
//! The queue never interprets an opcode beyond its data direction (bits 1:0 of the opcode, of
//! FCTYPE for Fabrics commands) and the QID/CATTR of the first Connect; everything else is the
//! controller's.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use nvme_wire::digest::{crc32c, to_wire};
use nvme_wire::entry::{Cqe, Sgl, Sqe, Status};
use nvme_wire::fabrics::{FabricsCommand, FabricsKind, OPCODE_FABRICS};
use nvme_wire::pdu::{
    CapsuleResp, Codec, IcResp, Pdu, PduType, R2t, TermReq, FLAG_DDGSTF, FLAG_HDGSTF,
    FLAG_LAST_PDU, FLAG_SUCCESS, MAX_PDA, MAX_TERM_DATA, MIN_MAXH2CDATA, PFV_1_0,
};
use nvme_wire::{Fes, WireError, CH_LEN, DIGEST_LEN};

use crate::command::{Command, Completion};
use crate::idhash::IdMap;

/// Connect's CATTR bit 2: the host disabled SQ flow control (NVMe over Fabrics 1.1 §3.3), so
/// a successful read may end with C2HData SUCCESS instead of a response capsule.
pub const CATTR_SQFLOW_DISABLE: u8 = 1 << 2;

/// The admin queue's in-capsule data size: 8 KiB, what Linux's host assumes for it
/// (`NVME_TCP_ADMIN_CCSZ`).
pub const ADMIN_IN_CAPSULE: u32 = 8192;

/// What one queue accepts and announces.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QueueConfig {
    /// MAXH2CDATA announced in ICResp: the most data in one H2CData PDU (≥ 4096, a multiple
    /// of 4).
    pub maxh2cdata: u32,
    /// CPDA announced in ICResp: the host aligns the data it sends to `(cpda + 1) * 4` bytes.
    pub cpda: u8,
    /// In-capsule data size of the admin queue.
    pub admin_in_capsule: u32,
    /// In-capsule data size of the I/O queues; the controller's IOCCSZ must say the same
    /// (`(io_in_capsule + 64) / 16`).
    pub io_in_capsule: u32,
    /// The longest data transfer of one command through the transport (the controller's MDTS
    /// in bytes); a longer transport SGL completes with Data SGL Length Invalid.
    pub max_transfer: u32,
    /// The most data in one C2HData PDU.
    pub max_c2h_data: u32,
    /// Commands receiving H2C data at once (each has an R2T outstanding).
    pub max_r2t_commands: usize,
    /// Commands in flight on the queue (received and not yet completed) before its Connect
    /// says how many entries the queue has; one more is a fatal error. After Connect the
    /// limit is its SQSIZE + 1 (at most this), so the in-capsule data a queue holds is at most
    /// its entries × its in-capsule size.
    pub max_outstanding: usize,
    /// How long a new connection may take to send ICReq and its first command capsule.
    pub setup_timeout: Duration,
    /// An H2CData that carries all of a transfer of at least this many bytes, without a data
    /// digest, is received into a buffer of its own ([`Queue::placement`]), so the command's
    /// data is the whole of its allocation and a store may keep it without a copy (the RAM
    /// store's 1 MiB chunk, `ipsan_block::Whole`: issue 30). 0: never.
    pub place_min: u32,
}

impl Default for QueueConfig {
    fn default() -> Self {
        Self {
            maxh2cdata: 128 * 1024,
            cpda: 0,
            admin_in_capsule: ADMIN_IN_CAPSULE,
            io_in_capsule: 8192,
            max_transfer: 1024 * 1024,
            max_c2h_data: 128 * 1024,
            max_r2t_commands: 16,
            max_outstanding: 2048,
            setup_timeout: Duration::from_secs(10),
            place_min: 0,
        }
    }
}

/// The bytes [`Queue::prepare_recv`] has a read take, besides the longest PDU, while no long
/// PDU is being received: a burst of short PDUs in one system call.
pub const RECV_CHUNK: usize = 256 * 1024;

/// A PDU of at least this many bytes is read to its end and no further
/// ([`Queue::prepare_recv`]).
const LONG_PDU: usize = 32 * 1024;

/// Room for a PDU's header, digests and padding around its data (a capsule's 72-byte
/// header, two digests, a PDO of at most 128 bytes).
const PDU_OVERHEAD: usize = 256;

/// In-capsule data the receive buffer leaves room for ([`Queue::prepare_recv`]) until a
/// capsule carried more: with a 1 MiB in-capsule size, room for a whole 1 MiB capsule behind
/// every read (~2.3 MiB) had a buffer of that size allocated and given back to the OS over and
/// over at 4 KiB × 32 writes (mimalloc's `madvise` and page faults, docs/results/nvme-speed-11),
/// where 64 KiB of in-capsule data needed ~0.4 MiB.
const CAPSULE_ROOM: u32 = 64 * 1024;

/// The shortest header a host sends (H2CData's, a termination request's; a capsule's is 72):
/// a read of this many bytes at the start of a PDU takes none of its data.
const HEAD_MIN: usize = 24;

/// Why a queue closed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CloseReason {
    /// A fatal transport error on the host's side: a C2HTermReq with this FES was queued.
    Terminated { fes: Fes, fei: u32, reason: String },
    /// The host sent an H2CTermReq.
    HostTerminated { fes: Fes, fei: u32 },
    /// No ICReq and first command within [`QueueConfig::setup_timeout`].
    SetupTimeout,
    /// The driver asked ([`Queue::close`]).
    Local,
}

/// What the queue reports to its driver.
#[derive(Debug, Clone)]
pub enum Event {
    /// A command received in full, for the controller.
    Command(Command),
    /// The connection is over: send what [`Queue::poll_transmit`] still holds, then close the
    /// socket.
    Closed(CloseReason),
}

/// A driver's mistake when completing a command.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum QueueError {
    /// No command with this CID is with the controller.
    #[error("no command {cid} is with the controller")]
    UnknownCommand { cid: u16 },
}

/// Where one command is.
#[derive(Debug)]
enum Slot {
    /// Waiting for an R2T slot.
    WaitR2t { sqe: Sqe, len: u32 },
    /// An R2T is out; data arrives.
    Receiving(Box<Transfer>),
    /// With the controller; `held`: the bytes of host data it holds ([`Queue::held`]).
    AtController { c2h: bool, sgl_len: u32, held: u32 },
}

/// One R2T's transfer (always the command's whole data).
#[derive(Debug)]
struct Transfer {
    sqe: Sqe,
    len: u32,
    /// Bytes received so far (DATAO of the next PDU).
    next: u32,
    /// The first PDU's payload when it is the only one so far (no copy for one-PDU writes).
    first: Option<Bytes>,
    buf: BytesMut,
    /// A data digest failed: the command completes with this status, the data is dropped.
    failed: Option<Status>,
    /// Counted in [`Queue::placeable`] until it ends.
    placeable: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    AwaitIcReq,
    Ready,
    Closed,
}

/// The direction of a command's data: host to controller (bit 0 of the opcode, of FCTYPE for
/// Fabrics commands; NVMe Base 2.0 §5 "data transfer" bits, NVMe over Fabrics 1.1 §2.1).
#[must_use]
pub fn is_host_to_controller(sqe: &Sqe) -> bool {
    let code = if sqe.opcode == OPCODE_FABRICS {
        (sqe.nsid & 0xff) as u8
    } else {
        sqe.opcode
    };
    code & 0x01 != 0
}

/// The controller-role queue machine.
#[derive(Debug)]
pub struct Queue {
    cfg: QueueConfig,
    codec: Codec,
    phase: Phase,
    deadline: Option<Instant>,
    seen_first: bool,
    in_capsule: u32,
    /// Commands in flight at most: [`QueueConfig::max_outstanding`], then Connect's
    /// SQSIZE + 1.
    max_outstanding: usize,
    qid: Option<u16>,
    sqflow_disabled: bool,
    maxr2t: u32,
    slots: IdMap<u16, Slot>,
    r2t_wait: VecDeque<u16>,
    r2t_active: usize,
    /// Transfers with an R2T out whose one H2CData would be placed ([`Queue::placement`]):
    /// while there are any, reads stop at PDU heads ([`Queue::prepare_recv`]).
    placeable: usize,
    /// The last command capsule that carried data carried at least
    /// [`QueueConfig::place_min`] bytes: the next may too, so reads stop at PDU heads
    /// ([`Queue::prepare_recv`]) while capsules are placed ([`Queue::places_capsules`]).
    long_capsules: bool,
    /// A command capsule carried more than [`CAPSULE_ROOM`] bytes of data: reads leave room
    /// for the longest capsule the in-capsule size allows ([`Queue::prepare_recv`]), not
    /// only for `CAPSULE_ROOM`.
    big_capsules: bool,
    /// Bytes of host data (in-capsule or through R2Ts) that commands with the controller
    /// hold ([`Queue::held`]).
    held: usize,
    ttags: IdMap<u16, u16>,
    next_ttag: u16,
    events: VecDeque<Event>,
    tx: VecDeque<Bytes>,
    scratch: BytesMut,
}

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// A fatal error this machine finds above the codec.
fn fatal(fes: Fes, fei: u32, reason: &str) -> (Fes, u32, String) {
    (fes, fei, reason.to_owned())
}

impl Queue {
    /// A queue for a connection accepted at `now`.
    #[must_use]
    pub fn new(cfg: QueueConfig, now: Instant) -> Self {
        let mut cfg = cfg;
        cfg.maxh2cdata = (cfg.maxh2cdata.max(MIN_MAXH2CDATA) / 4) * 4;
        cfg.cpda = cfg.cpda.min(MAX_PDA);
        cfg.max_c2h_data = cfg.max_c2h_data.max(1);
        cfg.max_r2t_commands = cfg.max_r2t_commands.max(1);
        let in_capsule_max = cfg.admin_in_capsule.max(cfg.io_in_capsule);
        // The largest data PDU: header + digest + alignment padding + data + digest.
        let align = (u32::from(cfg.cpda) + 1) * 4;
        let max_pdu_len = in_capsule_max
            .max(cfg.maxh2cdata)
            .saturating_add(PduType::CapsuleCmd.hlen() as u32 + 2 * DIGEST_LEN as u32 + align);
        let deadline = now.checked_add(cfg.setup_timeout);
        Self {
            in_capsule: cfg.admin_in_capsule,
            max_outstanding: cfg.max_outstanding,
            codec: Codec::new(max_pdu_len),
            cfg,
            phase: Phase::AwaitIcReq,
            deadline,
            seen_first: false,
            qid: None,
            sqflow_disabled: false,
            maxr2t: 0,
            slots: IdMap::default(),
            r2t_wait: VecDeque::new(),
            r2t_active: 0,
            placeable: 0,
            long_capsules: false,
            big_capsules: false,
            held: 0,
            ttags: IdMap::default(),
            next_ttag: 0,
            events: VecDeque::new(),
            tx: VecDeque::new(),
            scratch: BytesMut::new(),
        }
    }

    /// The codec in use (digests and alignments after ICReq).
    #[must_use]
    pub fn codec(&self) -> &Codec {
        &self.codec
    }

    /// The QID of the queue's Connect command, once one arrived.
    #[must_use]
    pub fn qid(&self) -> Option<u16> {
        self.qid
    }

    /// The host's MAXR2T (0's based), once ICReq arrived.
    #[must_use]
    pub fn maxr2t(&self) -> u32 {
        self.maxr2t
    }

    /// Whether the queue is closed (nothing more is read).
    #[must_use]
    pub fn is_closed(&self) -> bool {
        self.phase == Phase::Closed
    }

    /// Commands in flight (received, not completed).
    #[must_use]
    pub fn outstanding(&self) -> usize {
        self.slots.len()
    }

    /// Bytes of host data (in-capsule or received through R2Ts) that the commands with the
    /// controller hold until they complete: a driver stops reading above a bound of its own,
    /// so a host's writes to a slow store cannot make the queue hold its entries × the
    /// in-capsule size (TCP's flow control holds the host back meanwhile).
    #[must_use]
    pub fn held(&self) -> usize {
        self.held
    }

    /// How many more bytes `buf` needs before it holds a whole PDU (0 when it does or when
    /// the header is already bad: [`Queue::receive`] then reports the error).
    #[must_use]
    pub fn needed(&self, buf: &[u8]) -> usize {
        self.codec.needed(buf).unwrap_or(0)
    }

    /// Takes every whole PDU off the front of `buf` and acts on it. Stops at the first fatal
    /// error (the queue is then closed and `buf` is left as it is).
    pub fn receive(&mut self, buf: &mut BytesMut) {
        while self.phase != Phase::Closed {
            let plen = match self.codec.frame(buf) {
                Ok(Some(plen)) if plen <= buf.len() => plen,
                Ok(_) => return,
                Err(e) => {
                    let end = buf.len().min(MAX_TERM_DATA);
                    let header = buf[..end].to_vec();
                    self.wire_error(&e, &header);
                    return;
                }
            };
            let raw = buf.split_to(plen).freeze();
            let hlen = PduType::from_u8(raw[0]).map_or(CH_LEN, PduType::hlen);
            let header = raw.slice(..hlen.min(raw.len()).min(MAX_TERM_DATA));
            match self.codec.decode(raw.clone()) {
                Ok(pdu) => {
                    if let Err((fes, fei, reason)) = self.on_pdu(pdu) {
                        self.terminate(fes, fei, reason, &header);
                    }
                }
                Err(WireError::DataDigest { .. }) => {
                    if let Err((fes, fei, reason)) = self.on_data_digest_error(&raw) {
                        self.terminate(fes, fei, reason, &header);
                    }
                }
                Err(e) => self.wire_error(&e, &header),
            }
        }
    }

    /// The next event, if any.
    pub fn poll_event(&mut self) -> Option<Event> {
        self.events.pop_front()
    }

    /// The next bytes to write, in order: control PDUs (the response capsules and R2Ts of a
    /// batch together, one buffer) and data PDUs' headers, or a data PDU's payload (a slice
    /// of the completion's data).
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.tx
            .pop_front()
            .or_else(|| (!self.scratch.is_empty()).then(|| self.scratch.split().freeze()))
    }

    /// Whether anything waits to be written.
    #[must_use]
    pub fn has_transmit(&self) -> bool {
        !self.tx.is_empty() || !self.scratch.is_empty()
    }

    /// When [`Queue::handle_timeout`] wants to be called.
    #[must_use]
    pub fn poll_timeout(&self) -> Option<Instant> {
        if self.phase == Phase::Closed {
            None
        } else {
            self.deadline
        }
    }

    /// Time passed: a connection that has not sent ICReq and its first command by the set-up
    /// deadline is closed.
    pub fn handle_timeout(&mut self, now: Instant) {
        if self.phase != Phase::Closed && self.deadline.is_some_and(|d| now >= d) {
            self.close_with(CloseReason::SetupTimeout);
        }
    }

    /// Closes the queue from our side (shutdown, the controller failed): nothing more is read
    /// and [`Event::Closed`] is reported.
    pub fn close(&mut self) {
        if self.phase != Phase::Closed {
            self.close_with(CloseReason::Local);
        }
    }

    /// Closes the queue with a C2HTermReq (the controller found a fatal error it must report
    /// on this connection).
    pub fn terminate_with(&mut self, fes: Fes, fei: u32) {
        if self.phase != Phase::Closed {
            self.terminate(fes, fei, "closed by the controller".to_owned(), &[]);
        }
    }

    /// The controller's answer to a command [`Event::Command`] handed out: its data as C2HData
    /// (at most the command's SGL length), then the response capsule.
    ///
    /// # Errors
    /// [`QueueError::UnknownCommand`] when no command with the CID is with the controller.
    pub fn complete(&mut self, completion: Completion) -> Result<(), QueueError> {
        let cid = completion.cqe.cid;
        let Some(&Slot::AtController { c2h, sgl_len, held }) = self.slots.get(&cid) else {
            return Err(QueueError::UnknownCommand { cid });
        };
        self.slots.remove(&cid);
        self.held = self.held.saturating_sub(held as usize);
        if self.phase == Phase::Closed {
            return Ok(());
        }
        let mut data = completion.data;
        if !c2h {
            data = Bytes::new();
        }
        data.truncate(sgl_len as usize);
        let cqe = completion.cqe;
        let success_flag = self.sqflow_disabled
            && cqe.status.is_success()
            && cqe.dw0 == 0
            && cqe.dw1 == 0
            && !data.is_empty()
            // All the data the host's SGL asked for: a shorter transfer ends with a response
            // capsule, so a host never has to take SUCCESS as "done" for a partial read.
            && data.len() == sgl_len as usize;
        let chunk = self.cfg.max_c2h_data as usize;
        let total = data.len();
        let mut off = 0usize;
        while off < total {
            let end = (off + chunk).min(total);
            let last = end == total;
            self.push_c2h_data(
                cid,
                off as u32,
                last,
                last && success_flag,
                data.slice(off..end),
            );
            off = end;
        }
        if !success_flag {
            self.push_pdu(&Pdu::CapsuleResp(CapsuleResp { cqe }));
        }
        Ok(())
    }

    // ---------------------------------------------------------------- internals

    fn close_with(&mut self, reason: CloseReason) {
        self.phase = Phase::Closed;
        self.deadline = None;
        self.events.push_back(Event::Closed(reason));
    }

    fn wire_error(&mut self, e: &WireError, header: &[u8]) {
        let fes = e.fes().unwrap_or(Fes::InvalidHeaderField);
        self.terminate(fes, e.fei(), e.to_string(), header);
    }

    fn terminate(&mut self, fes: Fes, fei: u32, reason: String, header: &[u8]) {
        if self.phase == Phase::Closed {
            return;
        }
        let t = TermReq {
            fes,
            fei,
            data: Bytes::copy_from_slice(&header[..header.len().min(MAX_TERM_DATA)]),
        };
        self.push_pdu(&Pdu::C2hTermReq(t));
        self.close_with(CloseReason::Terminated { fes, fei, reason });
    }

    /// Appends a control PDU to `scratch`, behind what is already there: the completions of a
    /// batch leave as one buffer (one iovec entry, not one `Bytes` each; at 4 KiB × 32 writes
    /// 32 response capsules per batch), as the iSCSI target gathers its statuses
    /// (`ipsan_tcp::vectored::Segments`).
    fn push_pdu(&mut self, pdu: &Pdu) {
        // Only control PDUs go through here: their encoding cannot fail (no data, or a
        // termination request's ≤ 128 bytes).
        let mark = self.scratch.len();
        if self.codec.encode(pdu, &mut self.scratch).is_err() {
            self.scratch.truncate(mark);
        }
    }

    /// A C2HData PDU as header (+ digest + padding), the payload slice and its digest.
    fn push_c2h_data(&mut self, cccid: u16, datao: u32, last: bool, success: bool, data: Bytes) {
        let hlen = PduType::C2hData.hlen();
        let hdgst = self.codec.header_digest;
        let ddgst = self.codec.data_digest;
        let hd = if hdgst { DIGEST_LEN } else { 0 };
        let align = (usize::from(self.codec.tx_pda.min(MAX_PDA)) + 1) * 4;
        let pdo = (hlen + hd).div_ceil(align) * align;
        let plen = pdo + data.len() + if ddgst { DIGEST_LEN } else { 0 };
        let mut flags = 0;
        if hdgst {
            flags |= FLAG_HDGSTF;
        }
        if ddgst {
            flags |= FLAG_DDGSTF;
        }
        if last {
            flags |= FLAG_LAST_PDU;
        }
        if success {
            flags |= FLAG_SUCCESS;
        }
        let mut h = [0u8; 24];
        h[0] = PduType::C2hData as u8;
        h[1] = flags;
        h[2] = hlen as u8;
        h[3] = pdo as u8;
        h[4..8].copy_from_slice(&(plen as u32).to_le_bytes());
        h[8..10].copy_from_slice(&cccid.to_le_bytes());
        h[12..16].copy_from_slice(&datao.to_le_bytes());
        h[16..20].copy_from_slice(&(data.len() as u32).to_le_bytes());
        self.scratch.put_slice(&h);
        if hdgst {
            self.scratch.put_slice(&to_wire(crc32c(&h)));
        }
        self.scratch.put_bytes(0, pdo - hlen - hd);
        // The header leaves with the control PDUs before it; the data digest and what follows
        // gather behind the payload.
        self.tx.push_back(self.scratch.split().freeze());
        let digest = ddgst.then(|| to_wire(crc32c(&data)));
        self.tx.push_back(data);
        if let Some(d) = digest {
            self.scratch.put_slice(&d);
        }
    }

    fn respond(&mut self, cid: u16, status: Status) {
        let mut cqe = Cqe::new(cid, status);
        cqe.dnr = status != Status::TRANSIENT_TRANSPORT_ERROR;
        self.push_pdu(&Pdu::CapsuleResp(CapsuleResp { cqe }));
    }

    fn on_pdu(&mut self, pdu: Pdu) -> Result<(), (Fes, u32, String)> {
        match (self.phase, pdu) {
            (_, Pdu::H2cTermReq(t)) => {
                self.close_with(CloseReason::HostTerminated {
                    fes: t.fes,
                    fei: t.fei,
                });
                Ok(())
            }
            (Phase::AwaitIcReq, Pdu::IcReq(req)) => {
                let resp = IcResp {
                    pfv: PFV_1_0,
                    cpda: self.cfg.cpda,
                    hdgst: req.hdgst,
                    ddgst: req.ddgst,
                    maxh2cdata: self.cfg.maxh2cdata,
                };
                self.push_pdu(&Pdu::IcResp(resp));
                self.codec.header_digest = req.hdgst;
                self.codec.data_digest = req.ddgst;
                self.codec.tx_pda = req.hpda;
                self.codec.rx_pda = self.cfg.cpda;
                self.maxr2t = req.maxr2t;
                self.phase = Phase::Ready;
                Ok(())
            }
            (Phase::AwaitIcReq, _) => Err(fatal(
                Fes::PduSequenceError,
                0,
                "a PDU other than ICReq before the connection was set up",
            )),
            (Phase::Ready, Pdu::IcReq(_)) => Err(fatal(
                Fes::PduSequenceError,
                0,
                "ICReq on a connection already set up",
            )),
            (Phase::Ready, Pdu::CapsuleCmd(c)) => self.on_capsule(c.sqe, c.data),
            (Phase::Ready, Pdu::H2cData(d)) => {
                self.on_h2c_data(d.cccid, d.ttag, d.datao, d.last, Some(d.data))
            }
            (Phase::Ready, _) => Err(fatal(
                Fes::InvalidHeaderField,
                0,
                "a PDU type only a controller sends",
            )),
            (Phase::Closed, _) => Ok(()),
        }
    }

    /// A data digest mismatch (§3.6.1): the PDU was consumed whole; its command completes
    /// with Transient Transport Error.
    fn on_data_digest_error(&mut self, raw: &Bytes) -> Result<(), (Fes, u32, String)> {
        match PduType::from_u8(raw[0]) {
            Some(PduType::CapsuleCmd) if self.phase == Phase::Ready => {
                let Some(sqe) = raw[CH_LEN..]
                    .first_chunk::<{ nvme_wire::entry::SQE_LEN }>()
                    .map(Sqe::from_bytes)
                else {
                    return Err(fatal(Fes::InvalidHeaderField, 4, "short capsule"));
                };
                self.first_command(&sqe);
                if self.slots.contains_key(&sqe.cid) {
                    self.respond(sqe.cid, Status::COMMAND_ID_CONFLICT);
                } else {
                    self.respond(sqe.cid, Status::TRANSIENT_TRANSPORT_ERROR);
                }
                Ok(())
            }
            Some(PduType::H2cData) if self.phase == Phase::Ready => {
                // The codec checked PDO and that the data digest is present before the digest.
                let datal = le32(raw, 16);
                let carried = raw.len() - usize::from(raw[3]) - DIGEST_LEN;
                if datal as usize != carried {
                    return Err(fatal(
                        Fes::InvalidHeaderField,
                        16,
                        "DATAL does not match PLEN",
                    ));
                }
                let last = raw[1] & FLAG_LAST_PDU != 0;
                let (cccid, ttag, datao) = (le16(raw, 8), le16(raw, 10), le32(raw, 12));
                self.check_datal(datal)?;
                self.on_h2c_data_len(cccid, ttag, datao, last, datal, None)
            }
            _ => Err(fatal(
                Fes::PduSequenceError,
                0,
                "data digest on a PDU not expected now",
            )),
        }
    }

    /// Notes what the queue needs from the first command, which must be Connect: its QID
    /// (admin or I/O in-capsule size), its SQSIZE (the most commands the host may have in
    /// flight: SQSIZE + 1, 0's based, NVMe over Fabrics 1.1 §3.3) and whether SQ flow control
    /// is off.
    fn first_command(&mut self, sqe: &Sqe) {
        if self.seen_first {
            return;
        }
        self.seen_first = true;
        self.deadline = None;
        if let Ok(FabricsCommand {
            kind: FabricsKind::Connect(c),
            ..
        }) = FabricsCommand::decode(sqe)
        {
            self.qid = Some(c.qid);
            self.in_capsule = if c.qid == 0 {
                self.cfg.admin_in_capsule
            } else {
                self.cfg.io_in_capsule
            };
            self.sqflow_disabled = c.cattr & CATTR_SQFLOW_DISABLE != 0;
            self.max_outstanding = self
                .max_outstanding
                .min(usize::from(c.sqsize).saturating_add(1));
        }
    }

    fn on_capsule(&mut self, sqe: Sqe, data: Bytes) -> Result<(), (Fes, u32, String)> {
        self.first_command(&sqe);
        let cid = sqe.cid;
        if self.slots.contains_key(&cid) {
            self.respond(cid, Status::COMMAND_ID_CONFLICT);
            return Ok(());
        }
        if self.slots.len() >= self.max_outstanding {
            return Err(fatal(
                Fes::PduSequenceError,
                0,
                "more commands in flight than the queue allows",
            ));
        }
        if let Err(e) = sqe.check_tcp(data.len()) {
            self.respond(cid, e.status().unwrap_or(Status::INVALID_FIELD));
            return Ok(());
        }
        if data.len() > self.in_capsule as usize {
            self.respond(cid, Status::DATA_SGL_LENGTH_INVALID);
            return Ok(());
        }
        let h2c = is_host_to_controller(&sqe);
        if h2c && !data.is_empty() {
            self.long_capsules = data.len() >= self.cfg.place_min as usize;
            self.big_capsules |= data.len() > CAPSULE_ROOM as usize;
        }
        match sqe.sgl {
            Sgl::InCapsule { offset, length } => {
                // check_tcp: offset + length lies within the capsule's data. All of it is
                // handed over as it is (a placed capsule's buffer stays whole).
                let start = offset as usize;
                let data = if start == 0 && length as usize == data.len() {
                    data
                } else {
                    data.slice(start..start + length as usize)
                };
                self.hand_over(sqe, data);
            }
            Sgl::Transport { length } if h2c && length > 0 => {
                if length > self.cfg.max_transfer {
                    self.respond(cid, Status::DATA_SGL_LENGTH_INVALID);
                    return Ok(());
                }
                self.slots.insert(cid, Slot::WaitR2t { sqe, len: length });
                self.r2t_wait.push_back(cid);
                self.start_r2ts();
            }
            Sgl::Transport { length } => {
                if length > self.cfg.max_transfer {
                    self.respond(cid, Status::DATA_SGL_LENGTH_INVALID);
                    return Ok(());
                }
                self.hand_over(sqe, Bytes::new());
            }
            // check_tcp refused the other descriptors.
            Sgl::Other(_) => self.respond(cid, Status::SGL_DESCRIPTOR_TYPE_INVALID),
        }
        Ok(())
    }

    fn hand_over(&mut self, sqe: Sqe, data: Bytes) {
        // Within the codec's bound on a PDU (or the max transfer): fits a u32.
        let held = u32::try_from(data.len()).unwrap_or(u32::MAX);
        self.held += held as usize;
        self.slots.insert(
            sqe.cid,
            Slot::AtController {
                c2h: !is_host_to_controller(&sqe),
                sgl_len: sqe.sgl.length(),
                held,
            },
        );
        self.events.push_back(Event::Command(Command { sqe, data }));
    }

    /// Sends R2Ts to the waiting commands while slots are free.
    fn start_r2ts(&mut self) {
        while self.r2t_active < self.cfg.max_r2t_commands {
            let Some(cid) = self.r2t_wait.pop_front() else {
                return;
            };
            let Some(Slot::WaitR2t { sqe, len }) = self.slots.remove(&cid) else {
                continue;
            };
            let mut ttag = self.next_ttag;
            while self.ttags.contains_key(&ttag) {
                ttag = ttag.wrapping_add(1);
            }
            self.next_ttag = ttag.wrapping_add(1);
            self.ttags.insert(ttag, cid);
            self.r2t_active += 1;
            let cap = if len as usize <= self.cfg.maxh2cdata as usize {
                0
            } else {
                len as usize
            };
            // Its data may come as one H2CData received into a buffer of its own.
            let placeable = self.cfg.place_min > 0
                && len >= self.cfg.place_min
                && len <= self.cfg.maxh2cdata
                && !self.codec.data_digest;
            self.placeable += usize::from(placeable);
            self.slots.insert(
                cid,
                Slot::Receiving(Box::new(Transfer {
                    sqe,
                    len,
                    next: 0,
                    first: None,
                    buf: BytesMut::with_capacity(cap),
                    failed: None,
                    placeable,
                })),
            );
            self.push_pdu(&Pdu::R2t(R2t {
                cccid: cid,
                ttag,
                r2to: 0,
                r2tl: len,
            }));
        }
    }

    fn check_datal(&self, datal: u32) -> Result<(), (Fes, u32, String)> {
        if datal > self.cfg.maxh2cdata {
            return Err(fatal(
                Fes::R2tLimitExceeded,
                0,
                "H2CData with more data than MAXH2CDATA",
            ));
        }
        Ok(())
    }

    fn on_h2c_data(
        &mut self,
        cccid: u16,
        ttag: u16,
        datao: u32,
        last: bool,
        data: Option<Bytes>,
    ) -> Result<(), (Fes, u32, String)> {
        let datal = data.as_ref().map_or(0, |d| d.len() as u32);
        self.check_datal(datal)?;
        self.on_h2c_data_len(cccid, ttag, datao, last, datal, data)
    }

    /// One H2CData PDU (`data` is `None` when its data digest failed).
    fn on_h2c_data_len(
        &mut self,
        cccid: u16,
        ttag: u16,
        datao: u32,
        last: bool,
        datal: u32,
        data: Option<Bytes>,
    ) -> Result<(), (Fes, u32, String)> {
        let Some(&cid) = self.ttags.get(&ttag) else {
            return Err(fatal(
                Fes::InvalidHeaderField,
                10,
                "H2CData for a TTAG with no R2T outstanding",
            ));
        };
        if cid != cccid {
            return Err(fatal(
                Fes::InvalidHeaderField,
                8,
                "H2CData CCCID is not the command of its TTAG",
            ));
        }
        let Some(Slot::Receiving(t)) = self.slots.get_mut(&cid) else {
            return Err(fatal(Fes::InvalidHeaderField, 10, "TTAG without transfer"));
        };
        if datao != t.next {
            return Err(fatal(
                Fes::DataTransferOutOfRange,
                0,
                "H2CData DATAO is not where the previous data ended",
            ));
        }
        let end = u64::from(datao) + u64::from(datal);
        if end > u64::from(t.len) {
            return Err(fatal(
                Fes::DataTransferOutOfRange,
                0,
                "H2CData beyond the R2T",
            ));
        }
        let done = end == u64::from(t.len);
        if last != done {
            return Err(fatal(
                Fes::InvalidHeaderField,
                1,
                "LAST_PDU not set exactly on the PDU that ends the R2T",
            ));
        }
        t.next = end as u32;
        match data {
            None => t.failed = Some(Status::TRANSIENT_TRANSPORT_ERROR),
            Some(d) if t.failed.is_none() => {
                if datao == 0 && done {
                    t.first = Some(d);
                } else {
                    t.buf.extend_from_slice(&d);
                }
            }
            Some(_) => {}
        }
        if done {
            self.ttags.remove(&ttag);
            self.r2t_active -= 1;
            if let Some(Slot::Receiving(t)) = self.slots.remove(&cid) {
                let t = *t;
                self.placeable -= usize::from(t.placeable);
                match t.failed {
                    Some(status) => self.respond(cid, status),
                    None => {
                        let data = t.first.unwrap_or_else(|| t.buf.freeze());
                        self.hand_over(t.sqe, data);
                    }
                }
            }
            self.start_r2ts();
        }
        Ok(())
    }
}

mod recv;

#[cfg(test)]
mod tests;
