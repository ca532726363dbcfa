//! The framed, record-protected PDU transport both drivers share (the target's connection and
//! the initiator's session): bytes from a socket become PDUs only through [`FrameReader`]
//! (read, verify the Seal record, decode), and PDUs become bytes only through [`FrameWriter`]
//! (protect, encode, vectored write). The protocol stays in `iscsi-proto`'s engine; this is
//! the plumbing between it and a tokio stream.
//!
//! In a sealed session (docs/seal.md §4a) nothing of a PDU beyond its lengths is read before
//! its record tag verifies ([`ipsan_seal::read_pdu`]), and every PDU is protected after the
//! engine stamped it, in wire order: the record counters of the two sides advance together.
//!
//! Users: the target's connection (`ipsan-target` `conn.rs`, `conn/login.rs`) and the
//! initiator's session (`ipsan-initiator` `conn.rs` for login and discovery, then
//! `session/framed.rs`'s reader and writer tasks). A connection keeps one reader and one
//! writer from its first login PDU on; the full feature phase sets the negotiated
//! [`Codec`] and the record step on them, so bytes buffered past the last login response
//! are read under the new codec, not lost (digests start after login, RFC 7143 §13.1).
//!
//! # Layout
//! - [`FrameReader`]: one framed read side (buffer, codec, the record opener; hand-over mode,
//!   where a long data segment keeps its receive buffer to itself).
//! - [`FrameWriter`]: one framed write side (codec, the record sealer, a vectored batch).
//! - [`forgery`], [`PushError`]: what a sealed read or a push failed with.
//! - `tests.rs`: the unit tests.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ipsan_seal::record::SEAL_AHS_LEN;
use ipsan_seal::{Forgery, ReadError, RecordOpener, RecordSealer, VerifiedHead};
use iscsi_wire::header::{DataIn, DataOut};
use iscsi_wire::{Codec, Header, Opcode, Pdu, WireError, BHS_LEN};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// How much a [`FrameReader`] receives into at a time.
const RECEIVE_BUFFER: usize = 256 * 1024;

/// In hand-over mode ([`FrameReader::hand_over`]), a PDU whose data segment is at least this
/// long is left alone in its receive buffer: nothing else holds that buffer, so its owner can
/// take the segment as its own memory (`Bytes::try_into_mut`) instead of copying it.
pub const HAND_OVER_MIN: usize = 32 * 1024;

/// Bytes already received past such a PDU that are copied into the next receive buffer; with
/// more behind it (a burst of PDUs in one read) the buffer stays shared and nothing is handed
/// over.
const CARRY_MAX: usize = 4096;

/// The read side of a connection: PDUs out of a byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    rd: R,
    buf: BytesMut,
    /// Digests and the data segment limit in force (the login's codec is the default).
    pub codec: Codec,
    /// Seal record protection of a sealed session's full feature phase.
    pub record: Option<RecordOpener>,
    /// See [`FrameReader::hand_over`].
    hand_over: bool,
    /// The next receive buffer, given back by [`FrameReader::recycle`].
    spare: Option<BytesMut>,
    /// After a segment received in place ([`FrameReader::next_placing`]), the next receive
    /// into an empty buffer takes one Data-In head only (its BHS, and its Seal AHS in a sealed
    /// session): the PDU behind it is likely the same READ's
    /// next Data-In, whose segment should go in place too, not into this buffer.
    header_first: bool,
    /// The caller declined to place the PDU at the front of the buffer: not asked again.
    declined: bool,
    /// A segment being received in place ([`FrameReader::place`]), kept here across waits:
    /// a placing read dropped while it waits (the target's reader races it against its
    /// timers) goes on where it stopped when called again, nothing of the segment lost.
    placing: Option<Placing>,
}

/// A data PDU (Data-In, Data-Out) whose segment can be placed
/// ([`FrameReader::long_segment_ahead`]).
#[derive(Debug)]
struct Ahead {
    header: Header,
    /// Its BHS as received.
    raw: [u8; BHS_LEN],
    /// The segment's length.
    len: usize,
    /// Bytes of its head (BHS, Seal AHS).
    head: usize,
    /// A sealed session's verified head, counted once the segment is placed.
    verified: Option<VerifiedHead>,
}

/// A segment being received into a lent buffer.
#[derive(Debug)]
struct Placing {
    header: Header,
    /// Its BHS as received.
    raw: [u8; BHS_LEN],
    /// The lent buffer, holding what of the segment is in so far.
    data: BytesMut,
    /// The segment's length.
    len: usize,
}

/// What [`FrameReader::next_placing`] (or [`FrameReader::next_placing_data_out`]) received.
#[derive(Debug)]
pub enum Received {
    /// A PDU as [`FrameReader::next`] gives it (or the codec's error about it).
    Pdu(Result<Pdu, WireError>),
    /// A Data-In (Data-Out) whose segment was received into the buffer the caller lent
    /// (`data`, exactly the segment's bytes); `pdu.data` is empty.
    Placed {
        /// The Data-In (Data-Out) PDU, without its data.
        pdu: Pdu,
        /// The buffer the caller lent, holding the segment.
        data: BytesMut,
    },
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader with the login's codec and no record protection.
    pub fn new(rd: R) -> Self {
        Self {
            rd,
            buf: BytesMut::with_capacity(RECEIVE_BUFFER),
            codec: Codec::default(),
            record: None,
            hand_over: false,
            spare: None,
            header_first: false,
            declined: false,
            placing: None,
        }
    }

    /// [`FrameReader::next`] when the next PDU is already received whole (the rest of a burst
    /// that one read brought): it never reads and never waits. `None`: it must read.
    pub fn try_next(&mut self) -> Option<std::io::Result<Option<Result<Pdu, WireError>>>> {
        if self.placing.is_some() {
            // The segment being placed comes first ([`FrameReader::next_placing_data_out`]).
            return None;
        }
        match ipsan_seal::read_pdu(&self.codec, self.record.as_mut(), &mut self.buf) {
            Ok(Some(pdu)) => {
                if self.hand_over && pdu.data.len() >= HAND_OVER_MIN && self.buf.len() <= CARRY_MAX
                {
                    self.move_on();
                }
                Some(Ok(Some(Ok(pdu))))
            }
            Ok(None) => None,
            Err(ReadError::Wire(e)) => Some(Ok(Some(Err(e)))),
            Err(ReadError::Sealed(f)) => {
                Some(Err(std::io::Error::new(std::io::ErrorKind::InvalidData, f)))
            }
        }
    }

    /// Hand-over mode (the initiator's Data-In, issue 27): after a PDU with a data segment of
    /// at least [`HAND_OVER_MIN`] bytes, receiving goes on in another buffer, so the PDU's
    /// data is the only holder of its own and can become a READ's data without a copy.
    /// Buffers the caller no longer needs come back through [`FrameReader::recycle`]; without
    /// one a fresh buffer is allocated (as receiving does anyway every few PDUs).
    pub fn hand_over(&mut self, on: bool) {
        self.hand_over = on;
    }

    /// A buffer to receive into next, in hand-over mode (the read buffer a handed-over
    /// segment replaced); one too small to receive into is dropped.
    pub fn recycle(&mut self, mut buf: BytesMut) {
        if self.hand_over && buf.capacity() >= RECEIVE_BUFFER / 2 {
            buf.clear();
            self.spare = Some(buf);
        }
    }

    /// Receiving goes on in the spare buffer (or a fresh one), with the few bytes already
    /// received past the PDU just taken.
    fn move_on(&mut self) {
        let mut next = self
            .spare
            .take()
            .unwrap_or_else(|| BytesMut::with_capacity(RECEIVE_BUFFER));
        next.extend_from_slice(&self.buf);
        self.buf = next;
    }

    /// The stream it reads from (to query the socket under it).
    pub fn get_ref(&self) -> &R {
        &self.rd
    }

    /// [`FrameReader::next`], with a Data-In of at least [`HAND_OVER_MIN`] bytes received in
    /// place where `lend` gives a buffer for it (issue 27: a READ whose data comes in several
    /// Data-In PDUs is received into the command's own buffer, not copied there from this
    /// one). `lend(header, len)` is asked once the PDU's head is in and its segment is not
    /// yet whole in this reader's buffer; it returns an empty `BytesMut` with room for `len`
    /// bytes, or `None` to receive the PDU as usual.
    ///
    /// In a sealed session the head is the BHS and the Seal AHS, and its record tag is
    /// verified before `lend` sees the header ([`RecordOpener::verify_head`]): a Data-In's
    /// record tag covers its header but not its data, which is a slice of a sealed transfer
    /// whose chunk tags are verified, in the command's buffer, before the READ completes
    /// (docs/seal.md §4, §4a). A head that fails is a forgery like any other: the error comes
    /// back before anything of the PDU is used or lent for. Connections with digests do not
    /// place (a digest covers bytes that would then be spread over two buffers): there, and
    /// for every other PDU, this is [`FrameReader::next`].
    pub async fn next_placing<F>(&mut self, mut lend: F) -> std::io::Result<Option<Received>>
    where
        F: FnMut(&DataIn, usize) -> Option<BytesMut>,
    {
        self.next_placing_where(&[Opcode::SCSI_DATA_IN], |h, len| match h {
            Header::DataIn(d) => lend(d, len),
            _ => None,
        })
        .await
    }

    /// The target's [`FrameReader::next_placing`] (issue 27): a Data-Out of at least
    /// [`HAND_OVER_MIN`] bytes is received in place where `lend(header, len)` gives a buffer
    /// for it (the free end of the write's own buffer, `iscsi_proto`'s
    /// `Connection::lend_write_buffer`), so a write's data is not received here and copied
    /// into that buffer after. After a placed Data-Out, and after [`FrameReader::head_first`],
    /// the next receive into an empty buffer takes one head only, so a Data-Out behind it is
    /// placed whole. The same rules as
    /// [`FrameReader::next_placing`] otherwise (sealed heads verified first, nothing placed
    /// with digests). Dropping the returned future loses nothing: a segment being placed is
    /// received on at the next call.
    pub async fn next_placing_data_out<F>(
        &mut self,
        mut lend: F,
    ) -> std::io::Result<Option<Received>>
    where
        F: FnMut(&DataOut, usize) -> Option<BytesMut>,
    {
        self.next_placing_where(&[Opcode::SCSI_DATA_OUT], |h, len| match h {
            Header::DataOut(d) => lend(d, len),
            _ => None,
        })
        .await
    }

    /// [`FrameReader::next_placing_data_out`], and a SCSI Command's immediate data of at least
    /// [`HAND_OVER_MIN`] bytes received in place too (issue 27), where `lend(header, len)`
    /// gives a buffer for it (`header` is the Data-Out or the SCSI Command): a write's
    /// immediate data can then go straight into a buffer with room for the whole write, not
    /// into this reader's buffer to be copied there after. A command so received comes back
    /// as [`Received::Pdu`], its data the lent buffer (frozen, so its owner can take it back
    /// with `Bytes::try_into_mut`), its [`Pdu::raw_bhs`] the BHS as received. Commands are
    /// placed only on a connection without record protection and only without an AHS (a
    /// sealed PDU's data and an extended CDB take the usual path).
    pub async fn next_placing_writes<F>(&mut self, mut lend: F) -> std::io::Result<Option<Received>>
    where
        F: FnMut(&Header, usize) -> Option<BytesMut>,
    {
        let both = [Opcode::SCSI_DATA_OUT, Opcode::SCSI_COMMAND];
        let opcodes: &[Opcode] = if self.record.is_some() {
            &both[..1]
        } else {
            &both
        };
        self.next_placing_where(opcodes, |h, len| match h {
            Header::DataOut(_) => lend(h, len),
            Header::ScsiCommand(c) if c.write => lend(h, len),
            _ => None,
        })
        .await
    }

    async fn next_placing_where<F>(
        &mut self,
        opcodes: &[Opcode],
        mut lend: F,
    ) -> std::io::Result<Option<Received>>
    where
        F: FnMut(&Header, usize) -> Option<BytesMut>,
    {
        if self.placing.is_some() {
            return self.finish_placing().await.map(Some);
        }
        let may_place = !self.codec.header_digest && !self.codec.data_digest;
        if !may_place {
            return Ok(self.next().await?.map(Received::Pdu));
        }
        loop {
            if !self.declined {
                let ahead = self
                    .long_segment_ahead(opcodes)
                    .map_err(|f| std::io::Error::new(std::io::ErrorKind::InvalidData, f))?;
                if let Some(a) = ahead {
                    match lend(&a.header, a.len) {
                        Some(data) => return self.place(a, data).await.map(Some),
                        None => self.declined = true,
                    }
                }
            }
            if let Some(r) = self.try_next() {
                self.declined = false;
                return r.map(|o| o.map(Received::Pdu));
            }
            if self.buf.capacity() - self.buf.len() < 64 * 1024 {
                self.buf.reserve(RECEIVE_BUFFER);
            }
            let n = if self.header_first && self.buf.is_empty() {
                self.header_first = false;
                let head = self.head_len();
                let mut bhs = (&mut self.buf).limit(head);
                self.rd.read_buf(&mut bhs).await?
            } else {
                self.rd.read_buf(&mut self.buf).await?
            };
            if n == 0 {
                return Ok(None);
            }
        }
    }

    /// The next receive into an empty buffer takes one PDU head only: the caller expects a
    /// long Data-In or Data-Out next (the target: a write waits for its data), whose segment
    /// can then be received in place whole rather than mostly into this reader's buffer.
    pub fn head_first(&mut self) {
        self.header_first = true;
    }

    /// Bytes of a Data-In's (Data-Out's) head: its BHS, and in a sealed session the Seal AHS
    /// after it (neither has another AHS).
    fn head_len(&self) -> usize {
        BHS_LEN
            + if self.record.is_some() {
                SEAL_AHS_LEN
            } else {
                0
            }
    }

    /// The PDU of one of `opcodes` (Data-In, Data-Out, SCSI Command) at the front of the
    /// buffer, when its head is in, its segment is long enough to place and not yet whole
    /// here, and it has no AHS but the Seal AHS of a sealed session, whose record tag is
    /// verified here first (a failure is the error).
    fn long_segment_ahead(&mut self, opcodes: &[Opcode]) -> Result<Option<Ahead>, Forgery> {
        let Some(raw) = self.buf.get(..BHS_LEN) else {
            return Ok(None);
        };
        let mut bhs = [0u8; BHS_LEN];
        bhs.copy_from_slice(raw);
        let head = self.head_len();
        let opcode = Opcode(bhs[0] & 0x3f);
        if !opcodes.contains(&opcode) || usize::from(bhs[4]) * 4 != head - BHS_LEN {
            return Ok(None);
        }
        let dsl = (usize::from(bhs[5]) << 16) | (usize::from(bhs[6]) << 8) | usize::from(bhs[7]);
        if dsl < HAND_OVER_MIN
            || dsl > self.codec.max_recv_data_segment_length as usize
            || self.buf.len() < head
            || self.buf.len() >= head + iscsi_wire::pad4(dsl)
        {
            // Too short to be worth it, refused by the codec (`try_next` reports it), not in
            // yet, or already here whole (`try_next` takes it; hand-over mode avoids its copy).
            return Ok(None);
        }
        let verified = match self.record.as_mut() {
            Some(r) => Some(r.verify_head(&bhs, &self.buf[BHS_LEN..head])?),
            None => None,
        };
        match Header::parse(&bhs) {
            Ok(header) if header.opcode() == opcode => Ok(Some(Ahead {
                header,
                raw: bhs,
                len: dsl,
                head,
                verified,
            })),
            _ => {
                // A field the codec refuses: `try_next` reports it once the PDU is in.
                self.declined = true;
                Ok(None)
            }
        }
    }

    /// Receives the PDU at the front of the buffer (see [`FrameReader::long_segment_ahead`])
    /// into `data`: what of its segment is already here is copied, the rest is read from the
    /// stream straight into `data`, never past the segment's end. A sealed PDU is counted by
    /// the record opener first: its head verified, its data is taken.
    async fn place(&mut self, a: Ahead, mut data: BytesMut) -> std::io::Result<Received> {
        if let (Some(r), Some(v)) = (self.record.as_mut(), a.verified) {
            r.accept_head(v)
                .map_err(|f| std::io::Error::new(std::io::ErrorKind::InvalidData, f))?;
        }
        self.buf.advance(a.head);
        let here = self.buf.len().min(a.len);
        data.extend_from_slice(&self.buf[..here]);
        self.buf.advance(here);
        self.placing = Some(Placing {
            header: a.header,
            raw: a.raw,
            data,
            len: a.len,
        });
        self.finish_placing().await
    }

    /// Receives the rest of the segment being placed (and its padding); the state stays in
    /// `self.placing` across every wait, so a dropped call loses nothing.
    async fn finish_placing(&mut self) -> std::io::Result<Received> {
        let len = loop {
            let Some(p) = self.placing.as_mut() else {
                return Err(std::io::ErrorKind::InvalidInput.into());
            };
            let left = p.len - p.data.len();
            if left == 0 {
                break p.len;
            }
            let mut rest = (&mut p.data).limit(left);
            if self.rd.read_buf(&mut rest).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        };
        let pad = iscsi_wire::pad4(len) - len;
        while self.buf.len() < pad {
            if self.rd.read_buf(&mut self.buf).await? == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
        self.buf.advance(pad);
        let Some(p) = self.placing.take() else {
            return Err(std::io::ErrorKind::InvalidInput.into());
        };
        // A split READ's Data-In is followed by more (its own rest, or the next READ's), a
        // write's Data-Out likewise, and a long write command by its Data-Out or the next
        // write: the next receive takes one head, so their segments are placed too. A one-PDU
        // read (offset 0, final) arrives whole in one receive as a rule, and hand-over mode
        // spares its copy without a receive of its own for the head.
        let (final_, offset) = match &p.header {
            Header::DataIn(h) => (h.final_, h.buffer_offset),
            Header::DataOut(h) => (h.final_, h.buffer_offset),
            Header::ScsiCommand(_) => (false, 0),
            _ => (true, 0),
        };
        self.header_first = !(final_ && offset == 0);
        self.declined = false;
        if matches!(p.header, Header::ScsiCommand(_)) {
            return Ok(Received::Pdu(Ok(Pdu::received(
                p.header,
                p.raw,
                p.data.freeze(),
            ))));
        }
        Ok(Received::Placed {
            pdu: Pdu::new(p.header, Bytes::new()),
            data: p.data,
        })
    }

    /// The next PDU, `Ok(None)` on a clean close. A plain connection's codec errors come back
    /// as `Ok(Some(Err(_)))` for the engine to answer (RFC 7143 §7.8, §11.17). In a sealed
    /// session every failure (tag, digest, opcode, field, length) is an error of kind
    /// `InvalidData` wrapping a [`Forgery`] ([`forgery`]): nothing of it may reach the
    /// engine, nothing is answered, and the connection must be dropped.
    pub async fn next(&mut self) -> std::io::Result<Option<Result<Pdu, WireError>>> {
        loop {
            if let Some(r) = self.try_next() {
                return r;
            }
            if self.buf.capacity() - self.buf.len() < 64 * 1024 {
                self.buf.reserve(RECEIVE_BUFFER);
            }
            if self.rd.read_buf(&mut self.buf).await? == 0 {
                return Ok(None);
            }
        }
    }
}

/// The [`Forgery`] a [`FrameReader::next`] error carries, if it is one.
#[must_use]
pub fn forgery(e: &std::io::Error) -> Option<&Forgery> {
    e.get_ref().and_then(|x| x.downcast_ref::<Forgery>())
}

/// Why a PDU could not be queued ([`FrameWriter::push`]).
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    /// Seal could not protect it: the connection must close.
    #[error("seal: cannot protect a PDU: {0}")]
    Protect(ipsan_seal::SealError),
    /// The codec refused it. In a sealed session its record counter is spent and the next PDU
    /// could not verify: [`PushError::fatal`].
    #[error("cannot encode a PDU: {0}")]
    Encode(iscsi_wire::codec::EncodeError, bool),
}

impl PushError {
    /// Whether the connection must close (anything but a plain session's encode error).
    #[must_use]
    pub fn fatal(&self) -> bool {
        match self {
            Self::Protect(_) => true,
            Self::Encode(_, sealed) => *sealed,
        }
    }
}

/// The write side of a connection: PDUs into a byte stream, many per syscall. Headers and
/// short segments are copied into one buffer; long data segments go out by vectored write.
#[derive(Debug)]
pub struct FrameWriter<W> {
    wr: W,
    /// Digests in force (the login's codec is the default).
    pub codec: Codec,
    /// Seal record protection of a sealed session's full feature phase.
    pub sealer: Option<RecordSealer>,
    out: ipsan_tcp::vectored::Segments,
}

impl<W: AsyncWrite + Unpin> FrameWriter<W> {
    /// A writer with the login's codec and no record protection.
    pub fn new(wr: W) -> Self {
        Self {
            wr,
            codec: Codec::default(),
            sealer: None,
            out: ipsan_tcp::vectored::Segments::default(),
        }
    }

    /// The stream it writes to (to query the socket under it).
    pub fn get_ref(&self) -> &W {
        &self.wr
    }

    /// Protects (sealed) and encodes one PDU into the batch [`FrameWriter::flush`] writes.
    pub fn push(&mut self, mut pdu: Pdu) -> Result<(), PushError> {
        if let Some(s) = &mut self.sealer {
            s.protect(&mut pdu).map_err(PushError::Protect)?;
        }
        let trailer = self
            .codec
            .encode_head(&pdu, self.out.head())
            .map_err(|e| PushError::Encode(e, self.sealer.is_some()))?;
        self.out.push_data(pdu.data, trailer.as_bytes());
        Ok(())
    }

    /// Writes everything pushed, in order.
    pub async fn flush(&mut self) -> std::io::Result<()> {
        self.out.write_to(&mut self.wr).await
    }

    /// Pushes one PDU and writes it (a login's responses).
    pub async fn send(&mut self, pdu: Pdu) -> std::io::Result<()> {
        self.push(pdu)
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?;
        self.flush().await
    }

    /// Closes the write side (FIN) once everything is written.
    pub async fn shutdown(&mut self) -> std::io::Result<()> {
        self.wr.shutdown().await
    }
}

#[cfg(test)]
mod tests;
