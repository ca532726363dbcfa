//! Writing a queue of buffers to a socket without copying them together: the iSCSI drivers
//! of both roles send each PDU's header and its data segment (a `Bytes` slice of the
//! caller's or the backend's buffer) this way.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncWrite, AsyncWriteExt};

/// Buffers handed to one `writev`: Linux's `IOV_MAX` is 1024; 64 covers a burst of PDUs
/// without building a long slice array per call.
const MAX_SLICES: usize = 64;

/// Writes every buffer of `segs` in order by vectored writes, popping each as it is fully
/// written (a partial write advances the front buffer). On error, `segs` holds what was not
/// written. A write that takes nothing is `WriteZero`.
pub async fn write_segments<W: AsyncWrite + Unpin>(
    wr: &mut W,
    segs: &mut VecDeque<Bytes>,
) -> std::io::Result<()> {
    while !segs.is_empty() {
        // On the stack: a heap `Vec` here was one allocation per flush, i.e. per command at
        // depth 1 (issue 27). A flush of a few buffers (at depth 1: a status alone, or a
        // command's header and its data) fills a short array: preparing all MAX_SLICES
        // entries cost about 180 instructions per flush (docs/results/refactor-ab/w64-counts).
        let mut n = if segs.len() <= FEW_SLICES {
            write_some::<_, FEW_SLICES>(wr, segs).await?
        } else {
            write_some::<_, MAX_SLICES>(wr, segs).await?
        };
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 {
            let Some(front) = segs.front_mut() else { break };
            if n >= front.len() {
                n -= front.len();
                segs.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
    Ok(())
}

/// What most flushes hold: a status, a header and its data segment, a few PDUs.
const FEW_SLICES: usize = 4;

/// One vectored write of the first `N` (or fewer) buffers of `segs`; the bytes it took.
async fn write_some<W: AsyncWrite + Unpin, const N: usize>(
    wr: &mut W,
    segs: &VecDeque<Bytes>,
) -> std::io::Result<usize> {
    let mut slices = [IoSlice::new(&[]); N];
    let mut k = 0;
    for (slot, b) in slices.iter_mut().zip(segs.iter()) {
        *slot = IoSlice::new(b);
        k += 1;
    }
    wr.write_vectored(&slices[..k]).await
}

/// Data segments at least this long are written from their own buffer; shorter ones are
/// copied next to their header (an iovec entry costs more than copying a few bytes).
pub const SEGMENT_COPY_MAX: usize = 2048;

/// A batch of PDUs on its way to the socket: headers, digests, padding and short data
/// segments are copied into one buffer; long data segments (a READ's Data-In, a WRITE's
/// Data-Out) stay in their own `Bytes` and go out by vectored write, never copied.
#[derive(Debug)]
pub struct Segments {
    head: BytesMut,
    segs: VecDeque<Bytes>,
}

impl Default for Segments {
    fn default() -> Self {
        Segments {
            head: BytesMut::with_capacity(64 * 1024),
            segs: VecDeque::new(),
        }
    }
}

impl Segments {
    /// Where the next PDU's header is encoded.
    pub fn head(&mut self) -> &mut BytesMut {
        &mut self.head
    }

    /// The data segment and trailer (digest, padding) of the PDU whose header was just
    /// encoded into [`Segments::head`].
    pub fn push_data(&mut self, data: Bytes, trailer: &[u8]) {
        if data.len() >= SEGMENT_COPY_MAX {
            self.segs.push_back(self.head.split().freeze());
            self.segs.push_back(data);
        } else {
            self.head.extend_from_slice(&data);
        }
        self.head.extend_from_slice(trailer);
    }

    /// Writes everything queued, in order ([`write_segments`]).
    pub async fn write_to<W: AsyncWrite + Unpin>(&mut self, wr: &mut W) -> std::io::Result<()> {
        if !self.head.is_empty() {
            self.segs.push_back(self.head.split().freeze());
        }
        write_segments(wr, &mut self.segs).await?;
        if self.head.capacity() < 4096 {
            self.head.reserve(64 * 1024);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writer that takes at most `chunk` bytes a call, across buffer boundaries.
    struct Trickle {
        out: Vec<u8>,
        chunk: usize,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &[u8],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let n = buf.len().min(self.chunk);
            self.out.extend_from_slice(&buf[..n]);
            std::task::Poll::Ready(Ok(n))
        }
        fn poll_write_vectored(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            bufs: &[IoSlice<'_>],
        ) -> std::task::Poll<std::io::Result<usize>> {
            let mut left = self.chunk;
            let mut n = 0;
            for b in bufs {
                let k = b.len().min(left);
                self.out.extend_from_slice(&b[..k]);
                n += k;
                left -= k;
                if left == 0 {
                    break;
                }
            }
            std::task::Poll::Ready(Ok(n))
        }
        fn is_write_vectored(&self) -> bool {
            true
        }
        fn poll_flush(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
        fn poll_shutdown(
            self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
        ) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn writes_every_byte_in_order_through_partial_writes() {
        let parts: Vec<Bytes> = (0..200u32)
            .map(|i| Bytes::from(vec![(i % 251) as u8; 1 + (i as usize * 37) % 300]))
            .collect();
        let want: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
        for chunk in [1, 7, 48, 4096, usize::MAX] {
            let mut segs: VecDeque<Bytes> = parts.iter().cloned().collect();
            let mut w = Trickle {
                out: Vec::new(),
                chunk,
            };
            write_segments(&mut w, &mut segs).await.unwrap();
            assert!(segs.is_empty());
            assert_eq!(w.out, want, "chunk {chunk}");
        }
    }

    /// A flush of a few buffers (the short array) and one of more (the long one), on either
    /// side of the switch between them, each through writes that stop anywhere: every byte
    /// in order, nothing left queued.
    #[tokio::test]
    async fn writes_few_and_many_buffers_in_order_through_partial_writes() {
        for count in 1..=FEW_SLICES + 2 {
            let parts: Vec<Bytes> = (0..count)
                .map(|i| Bytes::from(vec![i as u8 + 1; 48 + i * 1000]))
                .collect();
            let want: Vec<u8> = parts.iter().flat_map(|b| b.iter().copied()).collect();
            for chunk in [1, 47, 4096, usize::MAX] {
                let mut segs: VecDeque<Bytes> = parts.iter().cloned().collect();
                let mut w = Trickle {
                    out: Vec::new(),
                    chunk,
                };
                write_segments(&mut w, &mut segs).await.unwrap();
                assert!(segs.is_empty());
                assert_eq!(w.out, want, "{count} buffers, chunk {chunk}");
            }
        }
    }

    #[tokio::test]
    async fn segments_keep_pdu_order_whether_data_is_copied_or_not() {
        let mut s = Segments::default();
        let mut want = Vec::new();
        for (i, len) in [0usize, 10, SEGMENT_COPY_MAX, 5, 70_000]
            .into_iter()
            .enumerate()
        {
            let header = [i as u8; 48];
            let data = Bytes::from(vec![0x80 | i as u8; len]);
            let trailer = [0xee; 3];
            s.head().extend_from_slice(&header);
            s.push_data(data.clone(), &trailer);
            want.extend_from_slice(&header);
            want.extend_from_slice(&data);
            want.extend_from_slice(&trailer);
        }
        let mut w = Trickle {
            out: Vec::new(),
            chunk: 1000,
        };
        s.write_to(&mut w).await.unwrap();
        assert_eq!(w.out, want);
    }

    #[tokio::test]
    async fn rejects_a_writer_that_takes_nothing() {
        let mut segs: VecDeque<Bytes> = [Bytes::from_static(b"abc")].into_iter().collect();
        let mut w = Trickle {
            out: Vec::new(),
            chunk: 0,
        };
        let e = write_segments(&mut w, &mut segs).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::WriteZero);
        assert_eq!(segs.len(), 1, "nothing written, nothing popped");
    }
}
