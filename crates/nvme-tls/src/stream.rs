//! The encrypted stream: after OpenSSL's handshake, the records are sealed and opened by the
//! record layer of [`crate::records`] (the default: no copy beyond the kernel's and the
//! cipher's own, AWS-LC's AES-GCM) or, with [`crate::RecordLayer::OpenSsl`], by OpenSSL's
//! (through `tokio-openssl`, the reference the first is tested against). Both share what
//! this module does around them:
//!
//! - **One system call per batch of records, not per record.** OpenSSL hands its wire BIO
//!   one sealed record (≤ 16 KiB) at a time; written straight to the socket that was one
//!   `sendto` (and, with `TCP_NODELAY`, one loopback delivery and wake-up of the peer) per
//!   record. Here the records of one write call are collected in [`Sealed`] and go out
//!   together when the call ends (and on flush).
//! - **No copy of the plaintext to gather a batch.** The stream takes vectored writes: small
//!   pieces (PDU headers, digests, 4 KiB payloads) are packed into full 16 KiB records, and a
//!   large piece (a 1 MiB payload) is sealed straight from its own buffer, so the drivers no
//!   longer copy each batch into one flat buffer first.
//! - **One read call per burst, not per record.** `SSL_read` returns at most one record; a
//!   read here keeps taking records (OpenSSL reads the socket ahead, [`READ_BUFFER`] bytes at
//!   a time) until the caller's buffer is full or the socket has nothing more, so a driver
//!   runs its PDU machine once per burst instead of once per 16 KiB.
//!
//! With OpenSSL's record layer, what is left is the cipher, the kernel's copy both ways (as
//! for plain TCP), OpenSSL's copies of each record (the plaintext into its write buffer, the
//! opened record into the caller's buffer) and one copy of the sealed records into
//! [`Sealed`]'s buffer. With [`crate::records`], a record is sealed from the caller's buffer
//! straight into [`Sealed`]'s and opened from the receive buffer straight into the caller's.

use std::fmt;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{ready, Context, Poll};

use openssl::ssl::SslRef;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use crate::records::{Records, RECORD};

/// How much plaintext one write call seals before its records go to the socket (16 full
/// records): the batch one system call carries.
const BATCH: usize = 16 * RECORD;

/// OpenSSL's receive buffer with read-ahead: a batch of full records and their overhead, so
/// one read from the socket takes what one write of the peer sent.
pub(crate) const READ_BUFFER: usize = 16 * (RECORD + 256);

/// The wire side under OpenSSL: reads pass through to the stream; sealed records are
/// appended to a buffer (never refused, so `SSL_write` always completes) that only the
/// [`TlsStream`]'s write, flush and shutdown send, from the writer's task: the read side
/// never writes to the socket (and so never takes the socket's write wake-up from the
/// writer). A record OpenSSL writes while reading (a KeyUpdate's answer) waits in the buffer
/// for the next write or flush, which RFC 8446 §4.6.3 allows (it must precede the next
/// application data, and it does: the buffer is in order).
pub(crate) struct Sealed<S> {
    pub(crate) inner: S,
    pub(crate) out: Vec<u8>,
    /// How much of `out` the socket has taken.
    sent: usize,
}

impl<S> Sealed<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            out: Vec::new(),
            sent: 0,
        }
    }

    fn buffered(&self) -> usize {
        self.out.len() - self.sent
    }
}

impl<S: AsyncWrite + Unpin> Sealed<S> {
    /// Sends the buffered records; `Pending` (with the waker registered) while the socket
    /// cannot take them all.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while self.sent < self.out.len() {
            match ready!(Pin::new(&mut self.inner).poll_write(cx, &self.out[self.sent..])) {
                Ok(0) => return Poll::Ready(Err(io::ErrorKind::WriteZero.into())),
                Ok(n) => self.sent += n,
                Err(e) => return Poll::Ready(Err(e)),
            }
        }
        self.out.clear();
        self.sent = 0;
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncWrite + Unpin> Sealed<S> {
    /// Sends the buffered records and flushes the stream: a handshake flight must reach the
    /// peer also through a stream that buffers (a `BufWriter`).
    fn poll_send(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        ready!(self.poll_drain(cx))?;
        Pin::new(&mut self.inner).poll_flush(cx)
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Sealed<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Sealed<S> {
    /// OpenSSL's record out: kept for the [`TlsStream`] to send.
    fn poll_write(
        self: Pin<&mut Self>,
        _cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut().out.extend_from_slice(buf);
        Poll::Ready(Ok(buf.len()))
    }

    /// OpenSSL's `BIO_flush` (at the end of a handshake flight, after a KeyUpdate): nothing
    /// here. The handshake sends after every step and the stream on every write and flush;
    /// a flush that could say "would block" would make OpenSSL fail the connection.
    fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }

    /// After OpenSSL's close_notify: everything out, then the stream's own shutdown.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.poll_drain(cx))?;
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// The encrypted stream (OpenSSL's, over the caller's stream): an `AsyncRead +
/// AsyncWrite` with vectored writes. Like a `BufWriter`, what is written reaches the socket
/// when the write call returns if the socket takes it, and surely after `flush`.
pub struct TlsStream<S> {
    tls: tokio_openssl::SslStream<Sealed<S>>,
    /// Our record layer, once the handshake has handed over its secrets; `None`: OpenSSL's.
    own: Option<Box<Records>>,
    /// Small pieces of one write call, packed into one record.
    stage: Vec<u8>,
    /// close_notify is written (shutdown has begun).
    closing: bool,
    /// A read error met after records that were delivered first: the next read's answer.
    read_err: Option<io::Error>,
}

impl<S> fmt::Debug for TlsStream<S> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsStream")
            .field("version", &self.ssl().version_str())
            .field(
                "cipher",
                &self.ssl().current_cipher().map(|c| c.name()).unwrap_or("-"),
            )
            .finish_non_exhaustive()
    }
}

impl<S> TlsStream<S> {
    pub(crate) fn from_ssl(tls: tokio_openssl::SslStream<Sealed<S>>) -> Self {
        Self {
            tls,
            own: None,
            stage: Vec::new(),
            closing: false,
            read_err: None,
        }
    }

    /// The OpenSSL connection (for the negotiated cipher, the session).
    pub fn ssl(&self) -> &SslRef {
        self.tls.ssl()
    }

    /// The stream under TLS.
    pub fn get_ref(&self) -> &S {
        &self.tls.get_ref().inner
    }

    /// Moves the records to our own record layer (after the handshake).
    pub(crate) fn set_records(&mut self, records: Records) {
        self.own = Some(Box::new(records));
    }

    /// Which record layer seals and opens this stream's records.
    pub fn record_layer(&self) -> crate::RecordLayer {
        if self.own.is_some() {
            crate::RecordLayer::Own
        } else {
            crate::RecordLayer::OpenSsl
        }
    }

    /// How many times each direction's key was updated (RFC 8446 §4.6.3): (receive, send), by
    /// either side's KeyUpdate. `None` with OpenSSL's record layer (it does not say).
    pub fn key_generations(&self) -> Option<(u32, u32)> {
        self.own.as_ref().map(|r| r.generations())
    }

    /// Starts a KeyUpdate (RFC 8446 §4.6.3): this side's sending key changes, and with
    /// `request_peer` the peer is asked to change its own. The message goes out with the next
    /// write or flush. The NVMe/TCP drivers never call this (Linux 6.12's kTLS host cannot take
    /// a KeyUpdate); it is here for tests and peers that can.
    pub fn key_update(&mut self, request_peer: bool) -> io::Result<()> {
        match &mut self.own {
            Some(r) => r.key_update(&mut self.tls.get_mut().out, request_peer),
            None if crate::ffi::key_update(self.tls.ssl(), request_peer) => {
                // OpenSSL sends it with the next SSL_write (an empty one does not count).
                Ok(())
            }
            None => Err(io::Error::other("SSL_key_update failed")),
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> TlsStream<S> {
    /// Runs one handshake step (`step`: accept or connect) and sends what it wrote; done
    /// when the handshake is and its last flight is on the wire. Also on failure, the alert
    /// OpenSSL wrote is sent (best effort) before the error is returned.
    pub(crate) async fn handshake<F>(&mut self, mut step: F) -> Result<(), String>
    where
        F: FnMut(
            Pin<&mut tokio_openssl::SslStream<Sealed<S>>>,
            &mut Context<'_>,
        ) -> Poll<Result<(), openssl::ssl::Error>>,
    {
        std::future::poll_fn(|cx| {
            let r = step(Pin::new(&mut self.tls), cx);
            let sent = self.tls.get_mut().poll_send(cx);
            match (r, sent) {
                (Poll::Ready(Err(e)), _) => Poll::Ready(Err(e.to_string())),
                (_, Poll::Ready(Err(e))) => Poll::Ready(Err(e.to_string())),
                (Poll::Ready(Ok(())), Poll::Ready(Ok(()))) => Poll::Ready(Ok(())),
                _ => Poll::Pending,
            }
        })
        .await
    }

    /// Seals all of `data` (cut into records) into [`Sealed`]'s buffer.
    fn seal(
        own: &mut Option<Box<Records>>,
        tls: &mut tokio_openssl::SslStream<Sealed<S>>,
        cx: &mut Context<'_>,
        mut data: &[u8],
    ) -> io::Result<()> {
        if let Some(r) = own {
            return r.seal_data(&mut tls.get_mut().out, data);
        }
        while !data.is_empty() {
            match Pin::new(&mut *tls).poll_write(cx, data) {
                Poll::Ready(Ok(0)) => return Err(io::ErrorKind::WriteZero.into()),
                Poll::Ready(Ok(n)) => data = data.get(n..).unwrap_or_default(),
                Poll::Ready(Err(e)) => return Err(e),
                // The sink below never refuses a record and TLS 1.3 has no renegotiation, so
                // SSL_write has nothing to wait for.
                Poll::Pending => return Err(io::Error::other("TLS write waited on nothing")),
            }
        }
        Ok(())
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncRead for TlsStream<S> {
    /// Opens records into `buf` until it is full or no whole record is left to read.
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Some(r) = &mut this.own {
            let sealed = this.tls.get_mut();
            return r.poll_read(&mut sealed.inner, &mut sealed.out, cx, buf);
        }
        if let Some(e) = this.read_err.take() {
            return Poll::Ready(Err(e));
        }
        let start = buf.filled().len();
        loop {
            let before = buf.filled().len();
            match Pin::new(&mut this.tls).poll_read(cx, buf) {
                // End of stream (or a full buffer): report what this call read first.
                Poll::Ready(Ok(())) if buf.filled().len() == before || buf.remaining() == 0 => {
                    return Poll::Ready(Ok(()))
                }
                Poll::Ready(Ok(())) => {}
                // The records opened before the error (a record that does not open, a
                // broken socket) are delivered first, the error with the next call.
                Poll::Ready(Err(e)) if buf.filled().len() == start => return Poll::Ready(Err(e)),
                Poll::Ready(Err(e)) => {
                    this.read_err = Some(e);
                    return Poll::Ready(Ok(()));
                }
                Poll::Pending if buf.filled().len() == start => return Poll::Pending,
                Poll::Pending => return Poll::Ready(Ok(())),
            }
        }
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> AsyncWrite for TlsStream<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.poll_write_vectored(cx, &[IoSlice::new(buf)])
    }

    /// Seals up to [`BATCH`] bytes of `bufs` (small pieces packed into full records, large
    /// ones sealed in place) and sends the records with one write if the socket takes them.
    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        // Records from an earlier call the socket did not take go first.
        if this.tls.get_ref().buffered() >= BATCH {
            ready!(this.tls.get_mut().poll_drain(cx))?;
        }
        let mut taken = 0;
        for b in bufs {
            let room = BATCH - taken;
            if room == 0 {
                break;
            }
            let b: &[u8] = b;
            let mut b = &b[..b.len().min(room)];
            taken += b.len();
            while !b.is_empty() {
                if this.stage.is_empty() && b.len() >= RECORD {
                    let whole = b.len() / RECORD * RECORD;
                    let (now, rest) = b.split_at(whole);
                    Self::seal(&mut this.own, &mut this.tls, cx, now)?;
                    b = rest;
                } else {
                    let n = (RECORD - this.stage.len()).min(b.len());
                    let (now, rest) = b.split_at(n);
                    this.stage.extend_from_slice(now);
                    b = rest;
                    if this.stage.len() == RECORD {
                        Self::seal(&mut this.own, &mut this.tls, cx, &this.stage)?;
                        this.stage.clear();
                    }
                }
            }
        }
        if !this.stage.is_empty() {
            Self::seal(&mut this.own, &mut this.tls, cx, &this.stage)?;
            this.stage.clear();
        }
        // One system call for the call's records; what the socket does not take now goes
        // with the next write or the flush.
        if let Poll::Ready(Err(e)) = this.tls.get_mut().poll_drain(cx) {
            return Poll::Ready(Err(e));
        }
        Poll::Ready(Ok(taken))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().tls.get_mut().poll_send(cx)
    }

    /// Sends what is buffered, then close_notify, then shuts the stream down.
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        ready!(this.tls.get_mut().poll_drain(cx))?;
        if let Some(r) = &mut this.own {
            if !this.closing {
                this.closing = true;
                let sealed = this.tls.get_mut();
                r.close_notify(&mut sealed.out)?;
                ready!(sealed.poll_drain(cx))?;
            }
            return Pin::new(this.tls.get_mut()).poll_shutdown(cx);
        }
        if !this.closing {
            // SSL_shutdown once: it seals close_notify into the buffer (which never refuses),
            // then the buffer is sent and the stream shut down. Called again, it would wait
            // for the peer's close_notify instead.
            this.closing = true;
            return Pin::new(&mut this.tls).poll_shutdown(cx);
        }
        Pin::new(this.tls.get_mut()).poll_shutdown(cx)
    }
}
