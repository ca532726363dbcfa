//! How nvme-tls's stream moves records, over real loopback TCP: a batch of records leaves in
//! one socket write, small pieces of a vectored write share one record, a burst of records
//! is read in one call; and none of that loses, reorders or lets through altered bytes (a
//! full-duplex run through small socket buffers, a relay that flips a bit mid-burst).
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[allow(dead_code)]
mod common;

use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use common::{bytes, read_pattern, read_until_error, relay_records, H, RECORD, S, T};
use nvme_proto::psk::{ConfiguredPsk, Derivation, IdentityVersion, PskHash, PskStore};
use nvme_tls::{accept, connect_with, TlsStream};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::time::timeout;

/// What sealing adds to a record ([`RECORD`] of plaintext at most): the 5-byte header, the
/// inner content type, the 16-byte AES-GCM tag.
const OVERHEAD: usize = 5 + 1 + 16;

/// Counts the writes (system calls) and bytes that reach the socket.
struct Counted<S> {
    inner: S,
    writes: Arc<AtomicUsize>,
    wire: Arc<AtomicUsize>,
}

/// `inner` with its writes counted: the stream, the writes counter, the bytes counter.
fn counted<S>(inner: S) -> (Counted<S>, Arc<AtomicUsize>, Arc<AtomicUsize>) {
    let (writes, wire) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let c = Counted {
        inner,
        writes: writes.clone(),
        wire: wire.clone(),
    };
    (c, writes, wire)
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r {
            self.writes.fetch_add(1, Ordering::Relaxed);
            self.wire.fetch_add(n, Ordering::Relaxed);
        }
        r
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// A loopback TCP pair (host end, target end); `buf` sets both ends' socket buffers.
async fn tcp_pair(buf: u32) -> (TcpStream, TcpStream) {
    let ls = TcpSocket::new_v4().unwrap();
    ls.set_send_buffer_size(buf).unwrap();
    ls.set_recv_buffer_size(buf).unwrap();
    ls.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let l: TcpListener = ls.listen(1).unwrap();
    let cs = TcpSocket::new_v4().unwrap();
    cs.set_send_buffer_size(buf).unwrap();
    cs.set_recv_buffer_size(buf).unwrap();
    let (c, a) = tokio::join!(cs.connect(l.local_addr().unwrap()), l.accept());
    let c = c.unwrap();
    c.set_nodelay(true).unwrap();
    let (s, _) = a.unwrap();
    s.set_nodelay(true).unwrap();
    (c, s)
}

/// The handshake over a pair of streams: (host, target).
async fn tls_pair<C, T2>(c: C, s: T2) -> (TlsStream<C>, TlsStream<T2>)
where
    C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    T2: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let key = ConfiguredPsk::new(Some(PskHash::Sha256), &[9u8; 32]).unwrap();
    let mut store = PskStore::new();
    store.insert(H, S, key.clone());
    let target = tokio::spawn(async move { accept(s, &store).await.map(|a| a.stream) });
    let (id, psk) = key.tls_psk(H, S, IdentityVersion::V0, Derivation::Libnvme);
    let host = timeout(T, connect_with(c, &id, &psk))
        .await
        .unwrap()
        .unwrap();
    let target = timeout(T, target).await.unwrap().unwrap().unwrap();
    (host, target)
}

/// 256 KiB written with one call are 16 records; they leave in one socket write, not one
/// write per record (what `SSL_write` straight onto the socket did).
#[tokio::test]
async fn sends_a_batch_of_records_with_one_socket_write() {
    let (c, s) = tcp_pair(1 << 20).await;
    let (c, writes, wire) = counted(c);
    let (mut host, mut target) = tls_pair(c, s).await;
    let len = 16 * RECORD;
    let reader = tokio::spawn(async move { read_pattern(&mut target, len, 1).await });
    writes.store(0, Ordering::Relaxed);
    wire.store(0, Ordering::Relaxed);
    host.write_all(&bytes(0, len, 1)).await.unwrap();
    host.flush().await.unwrap();
    timeout(T, reader).await.unwrap().unwrap();
    assert_eq!(wire.load(Ordering::Relaxed), len + 16 * OVERHEAD);
    let n = writes.load(Ordering::Relaxed);
    assert!(n <= 2, "16 records took {n} socket writes");
}

/// A vectored write of 100 pieces of 100 bytes (PDU headers, small payloads) is one record
/// on the wire, not a record per piece.
#[tokio::test]
async fn packs_small_pieces_of_a_vectored_write_into_one_record() {
    let (c, s) = tcp_pair(1 << 20).await;
    let (c, _, wire) = counted(c);
    let (mut host, mut target) = tls_pair(c, s).await;
    assert!(host.is_write_vectored());
    let data = bytes(0, 100 * 100, 2);
    let reader = tokio::spawn(async move { read_pattern(&mut target, 100 * 100, 2).await });
    wire.store(0, Ordering::Relaxed);
    let mut pieces: Vec<&[u8]> = data.chunks(100).collect();
    while !pieces.is_empty() {
        let slices: Vec<IoSlice<'_>> = pieces.iter().map(|p| IoSlice::new(p)).collect();
        let mut n = host.write_vectored(&slices).await.unwrap();
        assert!(n > 0);
        while n > 0 {
            let take = n.min(pieces[0].len());
            pieces[0] = &pieces[0][take..];
            n -= take;
            if pieces[0].is_empty() {
                pieces.remove(0);
            }
        }
    }
    host.flush().await.unwrap();
    timeout(T, reader).await.unwrap().unwrap();
    assert_eq!(
        wire.load(Ordering::Relaxed),
        100 * 100 + OVERHEAD,
        "not one record"
    );
}

/// With 16 records waiting in the socket, one read call returns all of them, not one
/// record (what one `SSL_read` per call gave the drivers).
#[tokio::test]
async fn reads_a_burst_of_records_in_one_call() {
    let (c, s) = tcp_pair(1 << 20).await;
    let (mut host, mut target) = tls_pair(c, s).await;
    let len = 16 * RECORD;
    target.write_all(&bytes(0, len, 3)).await.unwrap();
    target.flush().await.unwrap();
    // Wait until the whole burst is in the host's socket.
    let mut peek = vec![0u8; len + 16 * OVERHEAD];
    timeout(T, async {
        while host.get_ref().peek(&mut peek).await.unwrap() < peek.len() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await
    .unwrap();
    let mut got = vec![0u8; 2 * len];
    let n = timeout(T, host.read(&mut got)).await.unwrap().unwrap();
    assert_eq!(n, len, "one read returned {n} of {len} bytes waiting");
    assert!(got[..n] == bytes(0, len, 3)[..]);
}

/// Both ends write and read at once through split halves (as the drivers do), pieces of
/// every size from 1 byte to 300 KiB in vectored writes, through 64 KiB socket buffers and a
/// reader that pauses (so writes find the socket full and leave records buffered): every
/// byte arrives, in order, and nothing stalls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delivers_every_byte_in_order_both_ways_through_full_sockets() {
    const TOTAL: usize = 16 << 20;
    let (c, s) = tcp_pair(64 * 1024).await;
    let (host, target) = tls_pair(c, s).await;
    let mut tasks = Vec::new();
    for (end, seed) in [(host, 10u32), (target, 20u32)] {
        let (mut rd, mut wr) = tokio::io::split(end);
        let peer_seed = if seed == 10 { 20 } else { 10 };
        tasks.push(tokio::spawn(async move {
            let mut x = seed.wrapping_mul(7919) | 1;
            let mut next = move || {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                x as usize
            };
            let mut off = 0;
            while off < TOTAL {
                let mut pieces = Vec::new();
                for _ in 0..1 + next() % 8 {
                    let len = match next() % 4 {
                        0 => 1 + next() % 64,
                        1 => 1 + next() % 8192,
                        2 => RECORD * (1 + next() % 4) + next() % 100,
                        _ => 1 + next() % (300 * 1024),
                    }
                    .min(TOTAL - off);
                    pieces.push(bytes(off, len, seed));
                    off += len;
                    if off == TOTAL {
                        break;
                    }
                }
                let mut i = 0;
                let mut at = 0;
                while i < pieces.len() {
                    let mut slices = vec![IoSlice::new(&pieces[i][at..])];
                    slices.extend(pieces[i + 1..].iter().map(|p| IoSlice::new(p)));
                    let mut n = wr.write_vectored(&slices).await.unwrap();
                    while n > 0 {
                        let take = n.min(pieces[i].len() - at);
                        at += take;
                        n -= take;
                        if at == pieces[i].len() {
                            i += 1;
                            at = 0;
                        }
                    }
                }
                wr.flush().await.unwrap();
            }
            drop(wr);
        }));
        tasks.push(tokio::spawn(async move {
            let mut got = 0;
            let mut buf = vec![0u8; 512 * 1024];
            let mut reads = 0u32;
            while got < TOTAL {
                let n = rd.read(&mut buf).await.unwrap();
                assert!(n > 0, "end of stream after {got} bytes");
                assert!(
                    buf[..n] == bytes(got, n, peer_seed)[..],
                    "bytes differ at {got}"
                );
                got += n;
                reads += 1;
                if reads % 16 == 0 {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            drop(rd);
        }));
    }
    for t in tasks {
        timeout(Duration::from_secs(120), t).await.unwrap().unwrap();
    }
}

/// A relay flips one bit in the fifth record of a 16-record burst from the host: the target
/// reads the four records before it, unchanged, and then an error, never altered bytes
/// (records opened in one read call are checked one by one).
#[tokio::test]
async fn rejects_a_record_a_relay_altered_in_the_middle_of_a_burst() {
    let (c, relay_host) = tcp_pair(1 << 20).await;
    let (relay_tgt, s) = tcp_pair(1 << 20).await;
    // host → target: count the records after the handshake's plaintext ones; the host's first
    // encrypted record (type 23 outside) is its Finished, the data follow.
    let relay = tokio::spawn(relay_records(relay_host, relay_tgt, |n, mut rec, _| {
        if n == 1 + 5 {
            let mid = 5 + (rec.len() - 5) / 2;
            rec[mid] ^= 0x10;
        }
        vec![rec]
    }));
    let (mut host, mut target) = tls_pair(c, s).await;
    let len = 16 * RECORD;
    host.write_all(&bytes(0, len, 4)).await.unwrap();
    host.flush().await.unwrap();
    let (got, err) = read_until_error(&mut target, 2 * len).await;
    assert!(
        err.is_some(),
        "the target read to the end: {} bytes",
        got.len()
    );
    assert_eq!(
        got.len(),
        4 * RECORD,
        "not the four records before the altered one"
    );
    assert!(
        got == bytes(0, got.len(), 4),
        "altered bytes were delivered"
    );
    relay.abort();
}

/// The handshake's flights reach the peer also when the stream under TLS buffers (a
/// `BufWriter` on both ends): each step's records are sent and the stream flushed.
#[tokio::test]
async fn accepts_a_handshake_through_buffered_streams() {
    let (c, s) = tcp_pair(1 << 20).await;
    let c = tokio::io::BufWriter::with_capacity(256 * 1024, c);
    let s = tokio::io::BufWriter::with_capacity(256 * 1024, s);
    let (mut host, mut target) = timeout(T, tls_pair(c, s)).await.unwrap();
    let reader = tokio::spawn(async move { read_pattern(&mut target, 3 * RECORD + 7, 5).await });
    host.write_all(&bytes(0, 3 * RECORD + 7, 5)).await.unwrap();
    host.flush().await.unwrap();
    timeout(T, reader).await.unwrap().unwrap();
}
