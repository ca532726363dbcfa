//! A framed connection used before full feature phase (login, discovery text exchange,
//! logout of a discovery session), where one request is answered by one response and nothing
//! is pipelined. The PDUs are iscsi-proto's (`LoginExchange`, `Discovery`); this only frames
//! them.

use bytes::BytesMut;
use iscsi_wire::{Codec, Pdu};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::error::{ConnectionLoss, Error, Result};

/// A TCP stream plus the codec state for it.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) stream: TcpStream,
    pub(crate) rbuf: BytesMut,
    pub(crate) codec: Codec,
}

impl Conn {
    pub(crate) fn new(stream: TcpStream) -> Self {
        Self {
            stream,
            rbuf: BytesMut::with_capacity(64 * 1024),
            codec: Codec::default(),
        }
    }

    /// Writes one PDU (built by iscsi-proto's login and discovery machines).
    pub(crate) async fn send_pdu(&mut self, pdu: &Pdu) -> Result<()> {
        let mut out = BytesMut::with_capacity(64 + pdu.data.len());
        self.codec.encode(pdu, &mut out)?;
        self.stream.write_all(&out).await?;
        Ok(())
    }

    pub(crate) async fn recv(&mut self) -> Result<Pdu> {
        loop {
            if let Some(pdu) = self.codec.decode(&mut self.rbuf)? {
                return Ok(pdu);
            }
            self.rbuf.reserve(16 * 1024);
            let n = self.stream.read_buf(&mut self.rbuf).await?;
            if n == 0 {
                return Err(Error::ConnectionLost(ConnectionLoss::PeerClosed));
            }
        }
    }
}
