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
//! # Layout
//! - [`FrameReader`]: one framed read side (buffer, codec, the record opener).
//! - [`FrameWriter`]: one framed write side (codec, the record sealer, a vectored batch).

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
}
