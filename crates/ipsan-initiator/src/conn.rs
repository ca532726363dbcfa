//! A framed connection used before full feature phase (login, discovery text exchange,
//! logout of a discovery session), where one request is answered by one response and nothing
//! is pipelined.

use bytes::{Bytes, BytesMut};
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

    /// Sends one Login PDU and adds it to `transcript` (Seal binds every Login PDU,
    /// docs/seal.md §3).
    pub(crate) async fn send_login(
        &mut self,
        header: impl Into<iscsi_wire::Header>,
        data: Bytes,
        transcript: &mut ipsan_seal::LoginTranscript,
    ) -> Result<()> {
        let pdu = Pdu::new(header, data);
        transcript.add_sent(ipsan_seal::Direction::InitiatorToTarget, &pdu);
        self.send_pdu(&pdu).await
    }

    pub(crate) async fn send(
        &mut self,
        header: impl Into<iscsi_wire::Header>,
        data: Bytes,
    ) -> Result<()> {
        self.send_pdu(&Pdu::new(header, data)).await
    }

    async fn send_pdu(&mut self, pdu: &Pdu) -> Result<()> {
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
