//! The host role of one NVMe/TCP connection (NVMe/TCP Transport 1.0 §3.3–§3.6), free of I/O:
//! bytes from the socket in, PDUs to send and completed commands out.
//!
//! A [`HostQueue`] sends ICReq, checks ICResp (digests, CPDA, MAXH2CDATA), then carries
//! commands: each gets a free CID, its write data goes in the capsule when it fits the
//! controller's in-capsule size (IOCCSZ; 8 KiB on the admin queue, NVMe/TCP 1.0 §3.3.1) and
//! otherwise waits for R2Ts, answered by H2CData PDUs of at most MAXH2CDATA bytes each. Write
//! data larger than [`COPY_MAX`] is not copied: [`HostQueue::poll_transmit`] hands out the
//! PDU's header and the caller's payload as separate buffers, for a vectored write. Read data
//! arrives as C2HData PDUs, in order: a command's data in one PDU (what ipsan's and Linux's
//! targets send) is handed over as that PDU's slice of the receive buffer, without a copy (a
//! long one alone in its buffer, which the caller owns and brings back with a later read:
//! [`HAND_OVER_MIN`]); data in several PDUs is gathered into a buffer of the command's own.
//! The buffers callers bring wait in the queue's pool and are taken when data arrives, the
//! one brought last first ([`POOL_MAX`]). The command completes with the CapsuleResp, or with
//! the last C2HData when it carries SUCCESS. Every fatal error
//! (a malformed PDU, data outside the command, a PDU out of sequence) is answered with an
//! H2CTermReq and ends the queue; a C2HTermReq from the controller ends it too.
//!
//! The controller bring-up (Connect, DH-HMAC-CHAP, properties, Identify, queues, Keep Alive)
//! and discovery are in [`bringup`]; one queue's DH-HMAC-CHAP transaction as commands in
//! [`authn`]; the command builders and the parsers of what they return in [`cmd`].

pub mod authn;
pub mod bringup;
pub mod cmd;

use std::collections::VecDeque;

use bytes::{Bytes, BytesMut};
use nvme_wire::entry::Status;
use nvme_wire::fabrics::OPCODE_FABRICS;
use nvme_wire::pdu::{CapsuleCmd, H2cData, IcReq, PduType, TermReq, FLAG_SUCCESS, PFV_1_0};
use nvme_wire::{Codec, Cqe, Fes, Pdu, Sgl, Sqe, WireError};

use crate::idhash::IdMap;

/// In-capsule data the admin queue always takes (NVMe/TCP 1.0 §3.3.1: 8 KiB).
pub const ADMIN_IN_CAPSULE: usize = 8192;

/// The least room a read gets in the receive buffer.
const RX_CHUNK: usize = 64 * 1024;

/// The most bytes one read takes while no long PDU is being received ([`HostQueue::recv_limit`]):
/// enough for a burst of short PDUs, never far into a long one's data.
const READ_MAX: usize = 256 * 1024;

/// A C2HData PDU carrying at least this much, all of its command's data, is handed over alone
/// in its receive buffer: receiving goes on in another buffer (from the pool, [`POOL_MAX`]),
/// so the caller owns the data (`Bytes::try_into_mut` succeeds) and can give it back with its
/// next read, into the pool again. Long reads then reuse a few buffers instead of allocating
/// (and the kernel zeroing) fresh memory per command.
pub const HAND_OVER_MIN: usize = 32 * 1024;

/// Read buffers a queue keeps in its pool at most, and never more than one past its depth
/// (the oldest goes first), as many as the commands in flight held before there was a pool.
/// A buffer a caller brings with a read joins the pool; receiving takes one when data
/// arrives (the next receive buffer after a hand-over, or the buffer a read's data in several
/// PDUs is gathered into), the one brought most recently, not the one its own read brought.
/// A caller that hands each read's data back with its next read (ipsan bench) then has the
/// same buffer or two go round, still in the cache, where with 16 reads of 1 MiB in flight
/// taking each read's own buffer put the socket's copy into 16 MiB of buffers in turn, each
/// long out of the cache when its turn came (as the iSCSI initiator's reads do since issue
/// 27, `iscsi_proto`'s `bind_read_buffer`).
pub const POOL_MAX: usize = 256;

/// Bytes received past a handed-over PDU that are copied into the next receive buffer; with
/// more behind it the PDU stays in the shared buffer ([`HostQueue::recv_limit`] keeps reads
/// from going past a long PDU, so this is rare).
const CARRY_MAX: usize = 4096;

/// Room for headers, digests and padding around the data of one PDU.
const PDU_OVERHEAD: u32 = 256;

/// Write data up to this many bytes is copied behind its PDU header (one buffer for small
/// commands); longer data goes out as its own buffer, never copied. The iSCSI drivers' bound
/// (`ipsan_tcp::vectored::SEGMENT_COPY_MAX`, 2 KiB: an iovec entry costs more than copying a
/// few bytes): a 4 KiB write's data is not copied, as an iSCSI WRITE's is not. At 4096 it
/// was, into the send buffer of a whole batch: at 4 KiB × 32 writes the host's instructions
/// per command fell from 6,268 to 5,058 without it (docs/results/nvme-speed-7).
pub const COPY_MAX: usize = 2047;

/// Settings of one host connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueConfig {
    /// Ask for header digests (ICReq DGST bit 0).
    pub header_digest: bool,
    /// Ask for data digests (ICReq DGST bit 1).
    pub data_digest: bool,
    /// The largest read this queue will issue, in bytes: C2HData PDUs up to this size (plus
    /// headers) are accepted, longer ones are a fatal error.
    pub max_transfer: u32,
    /// Write data up to this many bytes goes in the capsule (the controller's IOCCSZ × 16 − 64
    /// for an I/O queue, [`ADMIN_IN_CAPSULE`] for the admin queue).
    pub in_capsule: usize,
    /// Commands in flight at most: one less than the queue's entries (SQSIZE, 0's based, as
    /// Connect sent it), since a full submission queue keeps one entry free.
    pub depth: u16,
}

impl QueueConfig {
    /// An admin queue: 8 KiB in-capsule data, 32 entries (Connect's SQSIZE 31, so 31 in
    /// flight), reads up to 1 MiB (a whole Discovery log), no digests.
    #[must_use]
    pub fn admin() -> Self {
        Self {
            header_digest: false,
            data_digest: false,
            max_transfer: 1 << 20,
            in_capsule: ADMIN_IN_CAPSULE,
            depth: 31,
        }
    }
}

/// What a host queue failed with. Each one ends the queue; every command in flight on it is
/// lost (the driver fails them).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum HostError {
    /// The controller sent bytes that are not a valid PDU (we answered with an H2CTermReq).
    #[error("invalid PDU from the controller: {0}")]
    Wire(#[from] WireError),
    /// The controller broke a rule of NVMe/TCP (we answered with an H2CTermReq carrying the
    /// FES).
    #[error("protocol violation by the controller: {1}")]
    Protocol(Fes, &'static str),
    /// The controller ended the connection with a C2HTermReq.
    #[error("the controller terminated the connection: {fes:?} (FEI {fei:#x})")]
    Terminated { fes: Fes, fei: u32 },
    /// A command could not be sent: the queue is full, not connected, or the command is bad.
    #[error("cannot submit: {0}")]
    Submit(&'static str),
}

/// Something the driver acts on.
#[derive(Debug)]
pub enum HostEvent {
    /// ICResp accepted: commands may be submitted.
    Connected {
        header_digest: bool,
        data_digest: bool,
        maxh2cdata: u32,
    },
    /// A command finished: its CQE (a synthesized successful one after C2HData with SUCCESS;
    /// Transient Transport Error when its data failed the data digest) and its read data: the
    /// one C2HData PDU's payload as received, or the command's buffer when the data came in
    /// several PDUs.
    Completed { cid: u16, cqe: Cqe, data: Bytes },
    /// The queue is dead; nothing more will complete on it.
    Failed(HostError),
}

#[derive(Debug, PartialEq, Eq, Clone, Copy)]
enum State {
    AwaitIcResp,
    Ready,
    Dead,
}

#[derive(Debug)]
struct Inflight {
    /// Write data waiting for R2Ts (empty once in the capsule or for reads).
    write: Bytes,
    /// The read data when one C2HData PDU carried all of it (no copy).
    whole: Option<Bytes>,
    /// Read data gathered from several C2HData PDUs (a buffer from the pool, taken when the
    /// first of them arrives).
    read: BytesMut,
    /// Read bytes received so far (DATAO of the next C2HData).
    received: usize,
    /// Bytes the command reads.
    read_len: usize,
    /// A data PDU of this command failed its data digest.
    digest_error: bool,
}

impl Inflight {
    /// The read data received, without a copy.
    fn into_data(self) -> Bytes {
        self.whole.unwrap_or_else(|| self.read.freeze())
    }
}

/// One NVMe/TCP connection, host side (see the module documentation).
#[derive(Debug)]
pub struct HostQueue {
    cfg: QueueConfig,
    codec: Codec,
    state: State,
    rx: BytesMut,
    /// Bytes ready to write, in order; `scratch` (headers and small PDUs being gathered)
    /// follows them.
    tx: VecDeque<Bytes>,
    scratch: BytesMut,
    maxh2cdata: u32,
    inflight: IdMap<u16, Inflight>,
    next_cid: u16,
    events: VecDeque<HostEvent>,
    /// The read buffers callers brought, the most recent last ([`POOL_MAX`]).
    pool: Vec<BytesMut>,
}

impl HostQueue {
    /// A new connection; its ICReq is already queued for sending.
    #[must_use]
    pub fn new(cfg: QueueConfig) -> Self {
        let codec = Codec::new(cfg.max_transfer.saturating_add(PDU_OVERHEAD).max(16 * 1024));
        let mut q = Self {
            cfg,
            codec,
            state: State::AwaitIcResp,
            rx: BytesMut::with_capacity(READ_MAX),
            tx: VecDeque::new(),
            scratch: BytesMut::new(),
            maxh2cdata: 0,
            inflight: IdMap::default(),
            next_cid: 0,
            events: VecDeque::new(),
            pool: Vec::new(),
        };
        let icreq = Pdu::IcReq(IcReq {
            pfv: PFV_1_0,
            hpda: 0,
            hdgst: cfg.header_digest,
            ddgst: cfg.data_digest,
            maxr2t: 0,
        });
        // An ICReq always encodes (fixed size, no data).
        let _ = q.codec.encode(&icreq, &mut q.scratch);
        q
    }

    /// Whether ICResp was accepted and the queue is not dead.
    #[must_use]
    pub fn is_ready(&self) -> bool {
        self.state == State::Ready
    }

    /// Whether the queue failed.
    #[must_use]
    pub fn is_dead(&self) -> bool {
        self.state == State::Dead
    }

    /// Commands in flight.
    #[must_use]
    pub fn in_flight(&self) -> usize {
        self.inflight.len()
    }

    /// The in-capsule data limit (set from IOCCSZ once Identify Controller is known).
    pub fn set_in_capsule(&mut self, bytes: usize) {
        self.cfg.in_capsule = bytes;
    }

    /// MAXH2CDATA from ICResp (0 before it).
    #[must_use]
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata
    }

    /// The receive buffer: the driver reads socket bytes into it, then calls
    /// [`HostQueue::process`]. It has room for the rest of the PDU being received (at least
    /// 64 KiB), so a read is never a few bytes at a time; when it must grow, it grows to
    /// 256 KiB at least, so a 64 KiB read's data and response come in one read, as one
    /// system call. After a hand-over it is the buffer brought last, taken now ([`POOL_MAX`]).
    pub fn recv_buf(&mut self) -> &mut BytesMut {
        self.bind_rx();
        let want = self
            .codec
            .needed(&self.rx)
            .unwrap_or(0)
            .saturating_add(CARRY_MAX)
            .max(RX_CHUNK);
        if self.rx.capacity() - self.rx.len() < want {
            self.rx.reserve(want.max(READ_MAX));
        }
        &mut self.rx
    }

    /// How many bytes the driver's next read into [`HostQueue::recv_buf`] should take at
    /// most: the rest of a long PDU being received and at most 4 KiB past it (a response
    /// capsule behind it still comes with the same read, and the data can be handed over
    /// alone, [`HAND_OVER_MIN`]), otherwise up to 256 KiB.
    #[must_use]
    pub fn recv_limit(&self) -> usize {
        match self.codec.frame(&self.rx) {
            Ok(Some(plen)) if plen >= HAND_OVER_MIN && plen > self.rx.len() => {
                plen - self.rx.len() + CARRY_MAX
            }
            _ => READ_MAX,
        }
    }

    /// Keeps `buf` (a buffer a caller brought with a read) on top of the pool when it is large
    /// enough to receive into; a full pool drops its oldest.
    fn pool_push(&mut self, mut buf: BytesMut) {
        buf.clear();
        // Takes back the room before the start (a handed-over PDU's header), never allocates.
        let _ = buf.try_reclaim(buf.capacity() + 1);
        if buf.capacity() < RX_CHUNK {
            return;
        }
        if self.pool.len() >= POOL_MAX.min(usize::from(self.cfg.depth) + 1) {
            self.pool.remove(0);
        }
        self.pool.push(buf);
    }

    /// Receiving goes on in another buffer, with the few bytes already received past the PDU
    /// just taken: the PDU's data is the only holder of its buffer. Which buffer is chosen
    /// when the next bytes are received ([`HostQueue::bind_rx`]), unless some already were:
    /// by then a caller may have given the data before back (at one read in flight it has,
    /// with the next read), and that buffer is received into again.
    fn move_on(&mut self) {
        let rest = std::mem::take(&mut self.rx);
        if !rest.is_empty() {
            self.bind_rx();
            self.rx.extend_from_slice(&rest);
        }
    }

    /// A receive buffer after a hand-over ([`HostQueue::move_on`] leaves none): the buffer
    /// brought last, or a fresh one.
    fn bind_rx(&mut self) {
        if self.rx.capacity() == 0 {
            self.rx = self
                .pool
                .pop()
                .unwrap_or_else(|| BytesMut::with_capacity(READ_MAX));
        }
    }

    /// Appends received bytes and processes them (for drivers that read into their own buffer).
    pub fn receive(&mut self, bytes: &[u8]) {
        self.bind_rx();
        self.rx.extend_from_slice(bytes);
        self.process();
    }

    /// Bytes to write to the socket, if any: call until `None` and write them in order (a
    /// data PDU's payload comes as its own buffer, between its header and what follows).
    pub fn poll_transmit(&mut self) -> Option<Bytes> {
        self.tx
            .pop_front()
            .or_else(|| (!self.scratch.is_empty()).then(|| self.scratch.split().freeze()))
    }

    /// Queues a PDU carrying `data` (its [`Pdu::data`]): small data is copied behind the
    /// header, larger data queued as it is between the header and the data digest.
    fn push_data_pdu(&mut self, pdu: &Pdu, data: &Bytes) -> Result<(), WireError> {
        if data.len() <= COPY_MAX {
            return self.codec.encode(pdu, &mut self.scratch);
        }
        let digest = self.codec.encode_header(pdu, &mut self.scratch)?;
        self.tx.push_back(self.scratch.split().freeze());
        self.tx.push_back(data.clone());
        if let Some(d) = digest {
            self.scratch.extend_from_slice(&d);
        }
        Ok(())
    }

    /// The next event.
    pub fn poll_event(&mut self) -> Option<HostEvent> {
        self.events.pop_front()
    }

    /// Sends `sqe` (its CID and SGL are set here) with `write` as its data (empty for none),
    /// expecting `read_len` bytes of read data; `read_buf` joins the queue's pool of buffers
    /// (its contents dropped), where this read or another takes it when data arrives
    /// ([`POOL_MAX`]). Returns the CID.
    ///
    /// # Errors
    /// [`HostError::Submit`] when the queue is not ready, full, or asked to both read and write.
    pub fn submit(
        &mut self,
        mut sqe: Sqe,
        write: Bytes,
        read_len: u32,
        read_buf: BytesMut,
    ) -> Result<u16, HostError> {
        if self.state != State::Ready {
            return Err(HostError::Submit("queue not connected"));
        }
        if self.inflight.len() >= usize::from(self.cfg.depth) {
            return Err(HostError::Submit("queue full"));
        }
        if !write.is_empty() && read_len != 0 {
            return Err(HostError::Submit("a command both reading and writing"));
        }
        if read_len > self.cfg.max_transfer {
            return Err(HostError::Submit(
                "read longer than the queue's max transfer",
            ));
        }
        let wlen = u32::try_from(write.len()).map_err(|_| HostError::Submit("write too long"))?;
        let cid = self.free_cid();
        sqe.cid = cid;
        // Fabrics commands (Connect's 1024 bytes, Authentication Send) carry their data in
        // the capsule on every queue (NVMe over Fabrics 1.1 §3.3), IOCCSZ or not.
        let limit = if sqe.opcode == OPCODE_FABRICS {
            self.cfg.in_capsule.max(ADMIN_IN_CAPSULE)
        } else {
            self.cfg.in_capsule
        };
        let in_capsule = !write.is_empty() && write.len() <= limit;
        sqe.sgl = if in_capsule {
            Sgl::InCapsule {
                offset: 0,
                length: wlen,
            }
        } else {
            Sgl::Transport {
                length: wlen.max(read_len),
            }
        };
        let data = if in_capsule {
            write.clone()
        } else {
            Bytes::new()
        };
        let capsule = Pdu::CapsuleCmd(CapsuleCmd {
            sqe,
            data: data.clone(),
        });
        self.push_data_pdu(&capsule, &data)
            .map_err(|_| HostError::Submit("capsule does not encode"))?;
        // A buffer is taken from the pool only when the data comes in several C2HData PDUs (one
        // is handed over as received).
        if read_buf.capacity() > 0 {
            self.pool_push(read_buf);
        }
        self.inflight.insert(
            cid,
            Inflight {
                write: if in_capsule { Bytes::new() } else { write },
                whole: None,
                read: BytesMut::new(),
                received: 0,
                read_len: read_len as usize,
                digest_error: false,
            },
        );
        Ok(cid)
    }

    fn free_cid(&mut self) -> u16 {
        // At most `depth` (≤ 65535) are in flight, so a free one is found.
        loop {
            let c = self.next_cid;
            self.next_cid = self.next_cid.wrapping_add(1);
            if !self.inflight.contains_key(&c) {
                return c;
            }
        }
    }

    /// Decodes and handles every whole PDU in the receive buffer.
    pub fn process(&mut self) {
        while self.state != State::Dead {
            let mut header = [0u8; 128];
            let hl = self.rx.len().min(header.len());
            header[..hl].copy_from_slice(&self.rx[..hl]);
            let header = &header[..hl];
            match self.codec.decode_from(&mut self.rx) {
                Ok(None) => break,
                Ok(Some(pdu)) => {
                    if self.hands_over(&pdu) {
                        self.move_on();
                    }
                    if let Err(e) = self.handle_pdu(pdu) {
                        self.fail(e, header);
                    }
                }
                Err(WireError::DataDigest { cid, pdu_type, .. }) => {
                    // The stream is intact; the command fails with Transient Transport Error
                    // when it completes (NVMe/TCP 1.0 §3.6.1). The header passed its digest,
                    // so its flags hold: a C2HData with SUCCESS is the command's completion
                    // (no CapsuleResp follows).
                    let success = pdu_type == PduType::C2hData
                        && header.get(1).is_some_and(|f| f & FLAG_SUCCESS != 0);
                    if success {
                        if let Some(c) = self.inflight.remove(&cid) {
                            self.events.push_back(HostEvent::Completed {
                                cid,
                                cqe: Cqe::new(cid, Status::TRANSIENT_TRANSPORT_ERROR),
                                data: c.into_data(),
                            });
                        }
                    } else if let Some(c) = self.inflight.get_mut(&cid) {
                        c.digest_error = true;
                    }
                }
                Err(e) => self.fail(HostError::Wire(e), header),
            }
        }
    }

    /// Whether `pdu` is a long C2HData carrying all of its command's data with little received
    /// behind it: it then keeps its receive buffer to itself ([`HAND_OVER_MIN`]).
    fn hands_over(&self, pdu: &Pdu) -> bool {
        let Pdu::C2hData(d) = pdu else {
            return false;
        };
        d.data.len() >= HAND_OVER_MIN
            && d.datao == 0
            && self.rx.len() <= CARRY_MAX
            && self
                .inflight
                .get(&d.cccid)
                .is_some_and(|c| c.received == 0 && c.read_len == d.data.len())
    }

    /// Ends the queue: an H2CTermReq for errors we found, and a Failed event.
    fn fail(&mut self, e: HostError, header: &[u8]) {
        let term = match &e {
            HostError::Wire(w) => TermReq::for_error(w, header),
            HostError::Protocol(fes, _) => Some(TermReq {
                fes: *fes,
                fei: 0,
                data: Bytes::copy_from_slice(&header[..header.len().min(24)]),
            }),
            _ => None,
        };
        if let Some(t) = term {
            let _ = self.codec.encode(&Pdu::H2cTermReq(t), &mut self.scratch);
        }
        self.state = State::Dead;
        self.inflight.clear();
        self.events.push_back(HostEvent::Failed(e));
    }

    fn handle_pdu(&mut self, pdu: Pdu) -> Result<(), HostError> {
        match (self.state, pdu) {
            (_, Pdu::C2hTermReq(t)) => {
                self.state = State::Dead;
                self.inflight.clear();
                self.events
                    .push_back(HostEvent::Failed(HostError::Terminated {
                        fes: t.fes,
                        fei: t.fei,
                    }));
                Ok(())
            }
            (State::AwaitIcResp, Pdu::IcResp(r)) => {
                if (r.hdgst && !self.cfg.header_digest) || (r.ddgst && !self.cfg.data_digest) {
                    return Err(HostError::Protocol(
                        Fes::PduSequenceError,
                        "ICResp enables a digest we did not ask",
                    ));
                }
                self.codec.header_digest = r.hdgst;
                self.codec.data_digest = r.ddgst;
                self.codec.tx_pda = r.cpda;
                self.maxh2cdata = r.maxh2cdata;
                self.state = State::Ready;
                self.events.push_back(HostEvent::Connected {
                    header_digest: r.hdgst,
                    data_digest: r.ddgst,
                    maxh2cdata: r.maxh2cdata,
                });
                Ok(())
            }
            (State::Ready, Pdu::CapsuleResp(r)) => {
                let cid = r.cqe.cid;
                let c = self.inflight.remove(&cid).ok_or(HostError::Protocol(
                    Fes::PduSequenceError,
                    "CapsuleResp for a command not in flight",
                ))?;
                let mut cqe = r.cqe;
                if c.digest_error && cqe.status.is_success() {
                    cqe.status = Status::TRANSIENT_TRANSPORT_ERROR;
                }
                self.events.push_back(HostEvent::Completed {
                    cid,
                    cqe,
                    data: c.into_data(),
                });
                Ok(())
            }
            (State::Ready, Pdu::C2hData(d)) => {
                let pool = &mut self.pool;
                let c = self.inflight.get_mut(&d.cccid).ok_or(HostError::Protocol(
                    Fes::PduSequenceError,
                    "C2HData for a command not in flight",
                ))?;
                let off = d.datao as usize;
                if off != c.received {
                    return Err(HostError::Protocol(
                        Fes::DataTransferOutOfRange,
                        "C2HData out of order or out of range",
                    ));
                }
                if off + d.data.len() > c.read_len {
                    return Err(HostError::Protocol(
                        Fes::DataTransferOutOfRange,
                        "C2HData out of range of the command",
                    ));
                }
                c.received += d.data.len();
                if off == 0 && d.data.len() == c.read_len {
                    // All of the command's data in one PDU: handed over as received.
                    c.whole = Some(d.data);
                } else {
                    if c.read.is_empty() && c.read.capacity() < c.read_len {
                        // The first of several PDUs: gathered into the buffer brought last.
                        if let Some(b) = pool.pop() {
                            c.read = b;
                        }
                        c.read.reserve(c.read_len);
                    }
                    c.read.extend_from_slice(&d.data);
                }
                if d.success {
                    if c.received != c.read_len {
                        return Err(HostError::Protocol(
                            Fes::PduSequenceError,
                            "SUCCESS before all data",
                        ));
                    }
                    let cid = d.cccid;
                    if let Some(c) = self.inflight.remove(&cid) {
                        let status = if c.digest_error {
                            Status::TRANSIENT_TRANSPORT_ERROR
                        } else {
                            Status::SUCCESS
                        };
                        self.events.push_back(HostEvent::Completed {
                            cid,
                            cqe: Cqe::new(cid, status),
                            data: c.into_data(),
                        });
                    }
                }
                Ok(())
            }
            (State::Ready, Pdu::R2t(r)) => {
                let c = self.inflight.get(&r.cccid).ok_or(HostError::Protocol(
                    Fes::PduSequenceError,
                    "R2T for a command not in flight",
                ))?;
                let start = r.r2to as usize;
                let end = start
                    .checked_add(r.r2tl as usize)
                    .filter(|&e| e <= c.write.len())
                    .ok_or(HostError::Protocol(
                        Fes::DataTransferOutOfRange,
                        "R2T out of range of the command's data",
                    ))?;
                let data = c.write.slice(start..end);
                let chunk = self.maxh2cdata.max(4096) as usize;
                let mut at = 0;
                while at < data.len() {
                    let n = chunk.min(data.len() - at);
                    let payload = data.slice(at..at + n);
                    let pdu = Pdu::H2cData(H2cData {
                        cccid: r.cccid,
                        ttag: r.ttag,
                        datao: r.r2to + at as u32,
                        last: at + n == data.len(),
                        data: payload.clone(),
                    });
                    self.push_data_pdu(&pdu, &payload).map_err(|_| {
                        HostError::Protocol(Fes::PduSequenceError, "H2CData does not encode")
                    })?;
                    at += n;
                }
                Ok(())
            }
            (State::AwaitIcResp, _) => Err(HostError::Protocol(
                Fes::PduSequenceError,
                "a PDU before ICResp",
            )),
            (State::Ready, _) => Err(HostError::Protocol(
                Fes::PduSequenceError,
                "a PDU a host never receives",
            )),
            (State::Dead, _) => Ok(()),
        }
    }
}
