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

use bytes::BytesMut;
use ipsan_seal::{Forgery, ReadError, RecordOpener, RecordSealer};
use iscsi_wire::{Codec, Pdu, WireError};
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
        }
    }

    /// [`FrameReader::next`] when the next PDU is already received whole (the rest of a burst
    /// that one read brought): it never reads and never waits. `None`: it must read.
    pub fn try_next(&mut self) -> Option<std::io::Result<Option<Result<Pdu, WireError>>>> {
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
    use bytes::Bytes;
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
