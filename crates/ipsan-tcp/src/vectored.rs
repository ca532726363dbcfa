//! Writing a queue of buffers to a socket without copying them together: the iSCSI drivers
//! of both roles send each PDU's header and its data segment (a `Bytes` slice of the
//! caller's or the backend's buffer) this way.

use std::collections::VecDeque;
use std::io::IoSlice;

use bytes::{Buf, Bytes};
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
        let slices: Vec<IoSlice<'_>> = segs
            .iter()
            .take(MAX_SLICES)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut n = wr.write_vectored(&slices).await?;
        drop(slices);
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
