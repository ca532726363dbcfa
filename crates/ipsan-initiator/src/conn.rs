//! A framed connection used before full feature phase (login, discovery text exchange,
//! logout of a discovery session), where one request is answered by one response and nothing
//! is pipelined. The PDUs are iscsi-proto's (`LoginExchange`, `Discovery`); the framing is
//! `ipsan-transport`'s, the same reader and writer the full feature phase then keeps (bytes
//! buffered past the last login response stay in the reader for the full feature phase).

use ipsan_transport::{FrameReader, FrameWriter, PushError};
use iscsi_wire::{Codec, Pdu};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;

use crate::error::{ConnectionLoss, Error, Result};

/// The two framed halves of one TCP connection.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) rd: FrameReader<OwnedReadHalf>,
    pub(crate) wr: FrameWriter<OwnedWriteHalf>,
}

impl Conn {
    pub(crate) fn new(stream: TcpStream) -> Self {
        let (rd, wr) = stream.into_split();
        Self {
            rd: FrameReader::new(rd),
            wr: FrameWriter::new(wr),
        }
    }

    /// The digests both halves use from now on (the negotiated ones once login completes).
    pub(crate) fn set_codec(&mut self, codec: &Codec) {
        self.rd.codec = codec.clone();
        self.wr.codec = codec.clone();
    }

    /// Writes one PDU (built by iscsi-proto's login and discovery machines).
    pub(crate) async fn send_pdu(&mut self, pdu: Pdu) -> Result<()> {
        self.wr.push(pdu).map_err(|e| match e {
            PushError::Encode(e, _) => Error::Encode(e),
            // No record protection before the full feature phase; kept total all the same.
            PushError::Protect(_) => Error::ConnectionLost(ConnectionLoss::SealExhausted),
        })?;
        self.wr.flush().await?;
        Ok(())
    }

    pub(crate) async fn recv(&mut self) -> Result<Pdu> {
        match self.rd.next().await? {
            Some(pdu) => Ok(pdu?),
            None => Err(Error::ConnectionLost(ConnectionLoss::PeerClosed)),
        }
    }
}
