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
    /// See [`FrameReader::yield_before_read`].
    yield_before_read: bool,
}

/// A data PDU (Data-In, Data-Out) whose segment can be placed
/// ([`FrameReader::long_segment_ahead`]).
#[derive(Debug)]
struct Ahead {
    header: Header,
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
            yield_before_read: false,
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
        self.next_placing_where(Opcode::SCSI_DATA_IN, |h, len| match h {
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
        self.next_placing_where(Opcode::SCSI_DATA_OUT, |h, len| match h {
            Header::DataOut(d) => lend(d, len),
            _ => None,
        })
        .await
    }

    async fn next_placing_where<F>(
        &mut self,
        opcode: Opcode,
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
                    .long_segment_ahead(opcode)
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
            if std::mem::take(&mut self.yield_before_read) {
                tokio::task::yield_now().await;
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

    /// Before [`FrameReader::next_placing`] next reads from the stream, it yields to the
    /// runtime once (`tokio::task::yield_now`); PDUs already received whole are taken first.
    /// The initiator's reader asks for it after a PDU that completed a command while others
    /// are still out (issue 27): the caller woken by that completion then submits its next
    /// command, and the writer sends it, before this reader goes on receiving the other
    /// commands' data. Without it a reader whose socket always has data (16 reads of 1 MiB in
    /// flight) receives up to tokio's whole task budget (128 reads) before anyone it woke
    /// runs, and the target's queue runs dry meanwhile. Once per call: the flag clears.
    pub fn yield_before_read(&mut self) {
        self.yield_before_read = true;
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

    /// The PDU of `opcode` (Data-In or Data-Out) at the front of the buffer, when its head is
    /// in, its segment is long enough to place and not yet whole here, and it has no AHS but
    /// the Seal AHS of a sealed session, whose record tag is verified here first (a failure
    /// is the error).
    fn long_segment_ahead(&mut self, opcode: Opcode) -> Result<Option<Ahead>, Forgery> {
        let Some(raw) = self.buf.get(..BHS_LEN) else {
            return Ok(None);
        };
        let mut bhs = [0u8; BHS_LEN];
        bhs.copy_from_slice(raw);
        let head = self.head_len();
        if Opcode(bhs[0] & 0x3f) != opcode || usize::from(bhs[4]) * 4 != head - BHS_LEN {
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
        // write's Data-Out likewise: the next receive takes one head, so their segments are
        // placed too. A one-PDU read (offset 0, final) arrives whole in one receive as a
        // rule, and hand-over mode spares its copy without a receive of its own for the head.
        let (final_, offset) = match &p.header {
            Header::DataIn(h) => (h.final_, h.buffer_offset),
            Header::DataOut(h) => (h.final_, h.buffer_offset),
            _ => (true, 0),
        };
        self.header_first = !(final_ && offset == 0);
        self.declined = false;
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
mod tests {
    use super::*;
    use iscsi_wire::header::NopOut;

    #[tokio::test]
    async fn accepts_what_the_writer_framed_back_in_order() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = FrameWriter::new(a);
        for i in 1..=3u32 {
            let nop = NopOut {
                itt: i,
                ..NopOut::default()
            };
            w.push(Pdu::new(nop, Bytes::from(vec![i as u8; 4000])))
                .unwrap();
        }
        w.flush().await.unwrap();
        w.shutdown().await.unwrap();
        let mut r = FrameReader::new(b);
        for i in 1..=3u32 {
            let p = r.next().await.unwrap().unwrap().unwrap();
            assert_eq!(p.header.itt(), i);
            assert_eq!(&p.data[..], &vec![i as u8; 4000][..]);
        }
        assert!(
            r.next().await.unwrap().is_none(),
            "a clean close after them"
        );
    }

    /// The initiator's use: one reader and writer from the login on, the codec switched to
    /// the negotiated digests after the last login PDU. A full feature phase PDU that came in
    /// the same segment as the login response is still in the reader's buffer and decodes
    /// under the new codec.
    #[tokio::test]
    async fn accepts_a_pdu_buffered_past_the_login_under_the_switched_codec() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = FrameWriter::new(a);
        let nop = |itt| NopOut {
            itt,
            ..NopOut::default()
        };
        w.push(Pdu::new(nop(1), Bytes::from_static(b"login")))
            .unwrap();
        let digests = Codec {
            header_digest: true,
            data_digest: true,
            ..Codec::default()
        };
        w.codec = digests.clone();
        w.push(Pdu::new(nop(2), Bytes::from(vec![7u8; 5000])))
            .unwrap();
        // Both in one write: the reader's first read takes both.
        w.flush().await.unwrap();
        w.shutdown().await.unwrap();
        let mut r = FrameReader::new(b);
        let first = r.next().await.unwrap().unwrap().unwrap();
        assert_eq!(first.header.itt(), 1);
        r.codec = digests;
        let second = r.next().await.unwrap().unwrap().unwrap();
        assert_eq!(second.header.itt(), 2);
        assert_eq!(&second.data[..], &[7u8; 5000][..]);
        assert!(r.next().await.unwrap().is_none());
    }

    /// Hand-over mode: a long data segment is the only holder of its receive buffer (it can
    /// become a READ's data without a copy), a short one is not moved out, a recycled buffer
    /// is received into next, and bytes received past the long PDU are not lost. Without the
    /// mode the segment shares the buffer (the target's reader: nothing changes there).
    #[tokio::test]
    async fn accepts_a_long_segment_handed_over_whole_in_hand_over_mode() {
        for mode in [true, false] {
            let (a, b) = tokio::io::duplex(1 << 20);
            let mut w = FrameWriter::new(a);
            let long = Bytes::from(vec![9u8; HAND_OVER_MIN]);
            let nop = |itt| NopOut {
                itt,
                ..NopOut::default()
            };
            // The long PDU and a short one in one read: the short one is carried over.
            w.push(Pdu::new(nop(1), long.clone())).unwrap();
            w.push(Pdu::new(nop(2), Bytes::from(vec![3u8; 100])))
                .unwrap();
            w.flush().await.unwrap();
            let mut r = FrameReader::new(b);
            // Past the login's 8 KiB default, as a full feature phase negotiates.
            r.codec.max_recv_data_segment_length = 256 * 1024;
            r.hand_over(mode);
            let first = r.next().await.unwrap().unwrap().unwrap();
            assert_eq!(first.header.itt(), 1);
            w.push(Pdu::new(nop(3), long.clone())).unwrap();
            w.flush().await.unwrap();
            w.shutdown().await.unwrap();
            let second = r.next().await.unwrap().unwrap().unwrap();
            assert_eq!(
                (second.header.itt(), &second.data[..]),
                (2, &[3u8; 100][..])
            );
            let owned = first.data.try_into_mut();
            assert_eq!(owned.is_ok(), mode, "hand-over {mode}");
            if let Ok(buf) = owned {
                assert_eq!(&buf[..], &long[..]);
                r.recycle(buf);
                assert!(r.spare.is_some(), "a buffer of the reader's size is kept");
            }
            let third = r.next().await.unwrap().unwrap().unwrap();
            assert_eq!((third.header.itt(), &third.data[..]), (3, &long[..]));
            assert!(r.next().await.unwrap().is_none());
        }
    }

    /// Placement (issue 27): a Data-In whose segment is not yet whole in the reader's buffer
    /// is received into the buffer the caller lends, every byte in order and nothing past
    /// the segment's end (the PDU after it is read as usual); two Data-In of one READ land
    /// back to back in the caller's one allocation. With digests nothing is placed (a digest
    /// covers bytes that would be spread over two buffers) and the same bytes come as PDUs.
    #[tokio::test]
    async fn accepts_a_data_in_segment_received_in_place_into_a_lent_buffer() {
        const LEN: usize = 40_000;
        let byte = |i: usize| (i % 251) as u8;
        for digests in [false, true] {
            // A pipe much smaller than a segment: the reader sees a BHS long before its data.
            let (a, b) = tokio::io::duplex(4096);
            let codec = Codec {
                header_digest: digests,
                data_digest: digests,
                max_recv_data_segment_length: 256 * 1024,
            };
            let mut w = FrameWriter::new(a);
            w.codec = codec.clone();
            let sender = tokio::spawn(async move {
                for n in 0..2u32 {
                    let h = DataIn {
                        final_: n == 1,
                        itt: 7,
                        data_sn: n,
                        buffer_offset: n * LEN as u32,
                        ..DataIn::default()
                    };
                    let data: Vec<u8> = (0..LEN).map(|i| byte(n as usize * LEN + i)).collect();
                    w.push(Pdu::new(h, Bytes::from(data))).unwrap();
                }
                let nop = NopOut {
                    itt: 9,
                    ..NopOut::default()
                };
                w.push(Pdu::new(nop, Bytes::from(vec![3u8; 100]))).unwrap();
                w.flush().await.unwrap();
                w.shutdown().await.unwrap();
            });
            let mut r = FrameReader::new(b);
            r.codec = codec;
            r.hand_over(true);
            let mut dest = BytesMut::with_capacity(2 * LEN);
            let dest_at = dest.as_ptr();
            let mut placed = 0;
            let mut lent = 0;
            let mut whole = Vec::new();
            loop {
                let got = r
                    .next_placing(|h, len| {
                        lent += 1;
                        assert_eq!((h.itt, h.buffer_offset as usize), (7, dest.len()));
                        assert_eq!(len, LEN);
                        let at = dest.len();
                        Some(dest.split_off(at))
                    })
                    .await
                    .unwrap();
                match got {
                    None => break,
                    Some(Received::Placed { pdu, data }) => {
                        placed += 1;
                        assert!(pdu.data.is_empty());
                        assert_eq!(data.len(), LEN);
                        dest.unsplit(data);
                    }
                    Some(Received::Pdu(pdu)) => {
                        let pdu = pdu.unwrap();
                        if pdu.header.itt() == 7 {
                            dest.extend_from_slice(&pdu.data);
                        }
                        whole.push((pdu.header.itt(), pdu.data.len()));
                    }
                }
            }
            sender.await.unwrap();
            let want: Vec<u8> = (0..2 * LEN).map(byte).collect();
            assert!(
                dest[..] == want[..],
                "digests {digests}: bytes out of place"
            );
            if digests {
                assert_eq!((lent, placed), (0, 0), "placed despite digests");
                assert_eq!(whole, [(7, LEN), (7, LEN), (9, 100)]);
            } else {
                assert_eq!((lent, placed), (2, 2));
                assert_eq!(dest.as_ptr(), dest_at, "one allocation, no copy");
                assert_eq!(whole, [(9, 100)], "the PDU after them as usual");
            }
        }
    }

    /// The target's placing (issue 27): after a WRITE that leaves 80,000 bytes to come by
    /// Data-Out, its two Data-Out PDUs are received into the write's one buffer, lent by the
    /// caller, every byte in order; the PDU after them comes as usual. The target's reader
    /// races the read against its timers: here a timer drops the placing read again and again
    /// while a slow peer trickles the bytes in, and each next call goes on where the dropped
    /// one stopped (nothing lost, nothing read twice).
    #[tokio::test]
    async fn accepts_data_out_placed_across_dropped_reads() {
        use iscsi_wire::header::{ScsiCommand, TaskAttr};
        const LEN: usize = 40_000;
        let byte = |i: usize| (i % 241) as u8;
        let codec = Codec {
            max_recv_data_segment_length: 256 * 1024,
            ..Codec::default()
        };
        // The wire bytes, framed by the writer.
        let (a, mut b) = tokio::io::duplex(1 << 20);
        let mut w = FrameWriter::new(a);
        w.codec = codec.clone();
        let cmd = ScsiCommand {
            immediate: false,
            final_: true,
            read: false,
            write: true,
            attr: TaskAttr::SIMPLE,
            lun: 0,
            itt: 7,
            expected_data_transfer_length: 2 * LEN as u32,
            cmd_sn: 1,
            exp_stat_sn: 1,
            cdb: [0; 16],
        };
        w.push(Pdu::new(cmd, Bytes::new())).unwrap();
        for n in 0..2u32 {
            let h = DataOut {
                final_: n == 1,
                lun: 0,
                itt: 7,
                ttt: 3,
                exp_stat_sn: 1,
                data_sn: n,
                buffer_offset: n * LEN as u32,
            };
            let data: Vec<u8> = (0..LEN).map(|i| byte(n as usize * LEN + i)).collect();
            w.push(Pdu::new(h, Bytes::from(data))).unwrap();
        }
        let nop = NopOut {
            itt: 9,
            ..NopOut::default()
        };
        w.push(Pdu::new(nop, Bytes::from(vec![3u8; 100]))).unwrap();
        w.flush().await.unwrap();
        w.shutdown().await.unwrap();
        let mut wire = Vec::new();
        b.read_to_end(&mut wire).await.unwrap();
        // A slow peer: 1,000 bytes a millisecond through a pipe of 4 KiB.
        let (mut tx, rx) = tokio::io::duplex(4096);
        let sender = tokio::spawn(async move {
            for piece in wire.chunks(1000) {
                tx.write_all(piece).await.unwrap();
                tokio::time::sleep(std::time::Duration::from_millis(1)).await;
            }
            tx.shutdown().await.unwrap();
        });
        let mut r = FrameReader::new(rx);
        r.codec = codec;
        let dest = std::cell::RefCell::new(BytesMut::with_capacity(2 * LEN));
        let dest_at = dest.borrow().as_ptr();
        let (mut lent, mut placed, mut dropped_mid_segment) = (0, 0, 0);
        let mut whole = Vec::new();
        loop {
            let got = tokio::select! {
                biased;
                got = r.next_placing_data_out(|h, len| {
                    lent += 1;
                    let mut d = dest.borrow_mut();
                    assert_eq!((h.itt, h.buffer_offset as usize, len), (7, d.len(), LEN));
                    let at = d.len();
                    Some(d.split_off(at))
                }) => got.unwrap(),
                () = tokio::time::sleep(std::time::Duration::from_micros(700)) => {
                    if r.placing.is_some() {
                        dropped_mid_segment += 1;
                    }
                    continue;
                }
            };
            match got {
                None => break,
                Some(Received::Placed { pdu, data }) => {
                    placed += 1;
                    assert!(pdu.data.is_empty());
                    assert_eq!(data.len(), LEN);
                    dest.borrow_mut().unsplit(data);
                }
                Some(Received::Pdu(pdu)) => {
                    let pdu = pdu.unwrap();
                    whole.push((pdu.header.opcode(), pdu.data.len()));
                }
            }
        }
        sender.await.unwrap();
        let want: Vec<u8> = (0..2 * LEN).map(byte).collect();
        let dest = dest.into_inner();
        assert!(dest[..] == want[..], "bytes out of place");
        assert_eq!((lent, placed), (2, 2));
        assert_eq!(dest.as_ptr(), dest_at, "one allocation, no copy");
        assert_eq!(
            whole,
            [(Opcode::SCSI_COMMAND, 0), (Opcode::NOP_OUT, 100)],
            "the PDUs around them as usual"
        );
        assert!(
            dropped_mid_segment > 0,
            "the test dropped no read in the middle of a segment"
        );
    }

    /// A sealed session's Data-In PDUs (AES-256-GCM record tags) and a NOP-In after them, as
    /// a peer writes them, through a pipe much smaller than a segment; `flip`: XOR 1 into
    /// byte `at` of PDU `n` on the wire first.
    fn sealed_stream(len: usize, flip: Option<(usize, usize)>) -> tokio::io::DuplexStream {
        let (mut sealer, _) = ipsan_seal::record::pair_for_test(ipsan_seal::Cipher::Aes256Gcm, 7);
        let codec = Codec {
            max_recv_data_segment_length: 256 * 1024,
            ..Codec::default()
        };
        let mut pdus = Vec::new();
        for n in 0..2u32 {
            let h = DataIn {
                final_: n == 1,
                itt: 7,
                data_sn: n,
                buffer_offset: n * len as u32,
                ..DataIn::default()
            };
            let data: Vec<u8> = (0..len)
                .map(|i| ((n as usize * len + i) % 251) as u8)
                .collect();
            pdus.push(Pdu::new(h, Bytes::from(data)));
        }
        let nop = iscsi_wire::header::NopIn {
            itt: 9,
            ..iscsi_wire::header::NopIn::default()
        };
        pdus.push(Pdu::new(nop, Bytes::from(vec![3u8; 100])));
        let mut wire = Vec::new();
        for (n, mut pdu) in pdus.into_iter().enumerate() {
            sealer.protect(&mut pdu).unwrap();
            let mut one = BytesMut::new();
            codec.encode(&pdu, &mut one).unwrap();
            if let Some((_, at)) = flip.filter(|(k, _)| *k == n) {
                one[at] ^= 1;
            }
            wire.extend_from_slice(&one);
        }
        let (mut a, b) = tokio::io::duplex(4096);
        tokio::spawn(async move {
            let _ = a.write_all(&wire).await;
            let _ = a.shutdown().await;
        });
        b
    }

    fn sealed_reader(stream: tokio::io::DuplexStream) -> FrameReader<tokio::io::DuplexStream> {
        let (_, opener) = ipsan_seal::record::pair_for_test(ipsan_seal::Cipher::Aes256Gcm, 7);
        let mut r = FrameReader::new(stream);
        r.codec.max_recv_data_segment_length = 256 * 1024;
        r.record = Some(opener);
        r.hand_over(true);
        r
    }

    /// Issue 27: in a sealed session a Data-In's segment is received in place too, once its
    /// head (BHS + Seal AHS) verified: both segments land back to back in the caller's one
    /// allocation, the Seal AHS is not in them, and the record counter advanced once per PDU
    /// (the NOP-In after them verifies under the next counter and arrives as a PDU).
    #[tokio::test]
    async fn accepts_a_sealed_data_in_received_in_place_once_its_head_verifies() {
        const LEN: usize = 40_000;
        let mut r = sealed_reader(sealed_stream(LEN, None));
        let mut dest = BytesMut::with_capacity(2 * LEN);
        let dest_at = dest.as_ptr();
        let (mut lent, mut placed, mut whole) = (0, 0, Vec::new());
        loop {
            let got = r
                .next_placing(|h, len| {
                    lent += 1;
                    assert_eq!((h.itt, h.buffer_offset as usize, len), (7, dest.len(), LEN));
                    let at = dest.len();
                    Some(dest.split_off(at))
                })
                .await
                .unwrap();
            match got {
                None => break,
                Some(Received::Placed { pdu, data }) => {
                    placed += 1;
                    assert!(pdu.data.is_empty() && pdu.ahs.is_empty());
                    dest.unsplit(data);
                }
                Some(Received::Pdu(pdu)) => {
                    let pdu = pdu.unwrap();
                    whole.push((pdu.header.itt(), pdu.data.len()));
                }
            }
        }
        let want: Vec<u8> = (0..2 * LEN).map(|i| (i % 251) as u8).collect();
        assert!(dest[..] == want[..], "bytes out of place");
        assert_eq!((lent, placed), (2, 2));
        assert_eq!(dest.as_ptr(), dest_at, "one allocation, no copy");
        assert_eq!(whole, [(9, 100)], "the NOP-In verified after them");
        assert_eq!(r.record.as_ref().unwrap().received(), 3);
    }

    /// A relay's edit of a placed Data-In's header (its buffer offset, its ITT, its Seal AHS)
    /// fails its record tag before anything is lent for it: the read side errs with a forgery
    /// and the caller was asked for the first, genuine PDU only.
    #[tokio::test]
    async fn rejects_an_altered_sealed_data_in_head_before_lending_for_it() {
        const LEN: usize = 40_000;
        // Byte 41 (buffer offset), 17 (ITT), 60 (the Seal AHS's tag).
        for at in [41, 17, 60] {
            let mut r = sealed_reader(sealed_stream(LEN, Some((1, at))));
            let mut dest = BytesMut::with_capacity(2 * LEN);
            let mut lent = 0;
            let err = loop {
                let got = r
                    .next_placing(|_, _| {
                        lent += 1;
                        let at = dest.len();
                        Some(dest.split_off(at))
                    })
                    .await;
                match got {
                    Ok(Some(Received::Placed { data, .. })) => dest.unsplit(data),
                    Ok(other) => panic!("byte {at}: {other:?} instead of a forgery"),
                    Err(e) => break e,
                }
            };
            assert!(forgery(&err).is_some(), "byte {at}: {err}");
            assert_eq!(lent, 1, "byte {at}: lent for the altered PDU");
            assert_eq!(dest.len(), LEN);
        }
    }

    /// After [`FrameReader::yield_before_read`] the next read from the stream first gives the
    /// runtime back once (the initiator's woken callers submit before the reader receives
    /// more, issue 27): a poll with a PDU waiting in the stream is pending once, then yields
    /// it; the flag clears, so the next PDU comes at the first poll. A PDU already received
    /// whole is handed out without yielding.
    #[tokio::test]
    async fn yields_once_before_reading_when_asked() {
        use std::future::Future;
        use std::task::{Context, Poll, Waker};
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = FrameWriter::new(a);
        for i in 1..=3u32 {
            let nop = NopOut {
                itt: i,
                ..NopOut::default()
            };
            w.push(Pdu::new(nop, Bytes::from(vec![i as u8; 100])))
                .unwrap();
        }
        w.flush().await.unwrap();
        let mut r = FrameReader::new(b);
        let mut cx = Context::from_waker(Waker::noop());
        let itt = |got: Poll<std::io::Result<Option<Received>>>| match got {
            Poll::Ready(Ok(Some(Received::Pdu(Ok(p))))) => Some(p.header.itt()),
            Poll::Pending => None,
            other => panic!("{other:?}"),
        };
        // The first read brings all three PDUs into the buffer.
        assert_eq!(
            itt(Box::pin(r.next_placing(|_, _| None)).as_mut().poll(&mut cx)),
            Some(1)
        );
        // Asked to yield, but the next PDU is here whole: no yield.
        r.yield_before_read();
        assert_eq!(
            itt(Box::pin(r.next_placing(|_, _| None)).as_mut().poll(&mut cx)),
            Some(2)
        );
        assert_eq!(
            itt(Box::pin(r.next_placing(|_, _| None)).as_mut().poll(&mut cx)),
            Some(3)
        );
        let nop = NopOut {
            itt: 4,
            ..NopOut::default()
        };
        w.push(Pdu::new(nop, Bytes::new())).unwrap();
        w.flush().await.unwrap();
        // Now it must read: the first poll yields, the second reads the PDU.
        r.yield_before_read();
        let mut next = Box::pin(r.next_placing(|_, _| None));
        assert_eq!(itt(next.as_mut().poll(&mut cx)), None, "did not yield");
        assert_eq!(itt(next.as_mut().poll(&mut cx)), Some(4));
        drop(next);
        // Once: the flag cleared.
        let nop = NopOut {
            itt: 5,
            ..NopOut::default()
        };
        w.push(Pdu::new(nop, Bytes::new())).unwrap();
        w.flush().await.unwrap();
        assert_eq!(
            itt(Box::pin(r.next_placing(|_, _| None)).as_mut().poll(&mut cx)),
            Some(5)
        );
    }

    /// The codec's errors on a plain connection reach the caller as a PDU error, not as an
    /// I/O error (the initiator drops the connection on it; the target answers a Reject).
    #[tokio::test]
    async fn rejects_a_pdu_whose_header_digest_is_wrong_as_a_wire_error() {
        let (a, b) = tokio::io::duplex(1 << 20);
        let mut w = FrameWriter::new(a);
        // Sent without digests, read expecting them: the 4 bytes after the first BHS are
        // the start of its data, not its CRC32C (a second PDU so the stream is long enough).
        for _ in 0..2 {
            w.push(Pdu::new(NopOut::default(), Bytes::from(vec![1u8; 64])))
                .unwrap();
        }
        w.flush().await.unwrap();
        w.shutdown().await.unwrap();
        let mut r = FrameReader::new(b);
        r.codec.header_digest = true;
        let got = r.next().await.unwrap();
        assert!(matches!(got, Some(Err(_))), "{got:?}");
    }
}
