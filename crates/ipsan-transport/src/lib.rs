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
//! - [`FrameReader`]: one framed read side (buffer, codec, the record opener).
//! - [`FrameWriter`]: one framed write side (codec, the record sealer, a vectored batch).
//! - [`forgery`], [`PushError`]: what a sealed read or a push failed with.

use bytes::BytesMut;
use ipsan_seal::{Forgery, ReadError, RecordOpener, RecordSealer};
use iscsi_wire::{Codec, Pdu, WireError};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The read side of a connection: PDUs out of a byte stream.
#[derive(Debug)]
pub struct FrameReader<R> {
    rd: R,
    buf: BytesMut,
    /// Digests and the data segment limit in force (the login's codec is the default).
    pub codec: Codec,
    /// Seal record protection of a sealed session's full feature phase.
    pub record: Option<RecordOpener>,
}

impl<R: AsyncRead + Unpin> FrameReader<R> {
    /// A reader with the login's codec and no record protection.
    pub fn new(rd: R) -> Self {
        Self {
            rd,
            buf: BytesMut::with_capacity(256 * 1024),
            codec: Codec::default(),
            record: None,
        }
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
            match ipsan_seal::read_pdu(&self.codec, self.record.as_mut(), &mut self.buf) {
                Ok(Some(pdu)) => return Ok(Some(Ok(pdu))),
                Ok(None) => {}
                Err(ReadError::Wire(e)) => return Ok(Some(Err(e))),
                Err(ReadError::Sealed(f)) => {
                    return Err(std::io::Error::new(std::io::ErrorKind::InvalidData, f))
                }
            }
            if self.buf.capacity() - self.buf.len() < 64 * 1024 {
                self.buf.reserve(256 * 1024);
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
