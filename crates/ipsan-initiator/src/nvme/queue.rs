//! One NVMe/TCP queue's TCP connection: the tokio driver of `nvme_proto::host::HostQueue`.
//! One dispatcher task owns the queue machine and the socket: it reads the socket into the
//! machine's buffer, takes requests while the queue has room (many commands in flight),
//! answers each request when its completion comes, and writes what the machine emits, a
//! pending write beside the reading, so a slow write never stops the reading.

use std::collections::{HashMap, VecDeque};
use std::future::poll_fn;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use nvme_proto::host::{HostEvent, HostQueue, QueueConfig};
use nvme_wire::{Cqe, Sqe};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::CancellationToken;

use super::NvmeError;

type Reply = oneshot::Sender<Result<(Cqe, Bytes), NvmeError>>;
type Rd = Box<dyn AsyncRead + Send + Unpin>;
type Wr = Box<dyn AsyncWrite + Send + Unpin>;

/// TLS 1.3 with a configured PSK (TP 8011) for a queue: the key and the identity's NQNs.
#[derive(Debug, Clone)]
pub(crate) struct TlsParams {
    pub(crate) key: std::sync::Arc<nvme_proto::psk::ConfiguredPsk>,
    pub(crate) hostnqn: String,
    pub(crate) subnqn: String,
}

struct Request {
    sqe: Sqe,
    write: Bytes,
    read_len: u32,
    read_buf: BytesMut,
    reply: Reply,
}

/// A handle on a queue's dispatcher; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct QueueHandle {
    tx: mpsc::Sender<Request>,
    /// Why the queue ended, once it has.
    ended: Arc<Mutex<Option<String>>>,
    /// What ICResp enabled: header digest, data digest, MAXH2CDATA.
    pub(crate) digests: (bool, bool),
    pub(crate) maxh2cdata: u32,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("sqe", &self.sqe).finish()
    }
}

impl QueueHandle {
    /// Connects to `addr` (with a TLS handshake first when `tls` is set), exchanges
    /// ICReq/ICResp within `timeout` and starts the tasks. The queue stops when `cancel`
    /// fires or the connection fails.
    pub(crate) async fn connect(
        addr: &str,
        cfg: QueueConfig,
        tls: Option<&TlsParams>,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<Self, NvmeError> {
        let stream = tokio::time::timeout(timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| NvmeError::Timeout("TCP connect"))??;
        stream.set_nodelay(true)?;
        let (mut rd, mut wr): (Rd, Wr) = match tls {
            None => {
                let (r, w) = stream.into_split();
                (Box::new(r), Box::new(w))
            }
            Some(t) => {
                let s = tokio::time::timeout(
                    timeout,
                    nvme_tls::connect(stream, &t.hostnqn, &t.subnqn, &t.key),
                )
                .await
                .map_err(|_| NvmeError::Timeout("TLS handshake"))?
                .map_err(|e| NvmeError::Tls(e.to_string()))?;
                let (r, w) = tokio::io::split(s);
                (Box::new(r), Box::new(w))
            }
        };
        let mut q = HostQueue::new(cfg);
        // ICReq out, ICResp in.
        let (hd, dd, maxh2c) = tokio::time::timeout(timeout, async {
            while let Some(b) = q.poll_transmit() {
                wr.write_all(&b).await?;
            }
            loop {
                if rd.read_buf(q.recv_buf()).await? == 0 {
                    return Err(NvmeError::Closed(
                        "the controller closed the connection before ICResp (a port that \
                         requires TLS? see --tls-key-file)"
                            .into(),
                    ));
                }
                q.process();
                while let Some(b) = q.poll_transmit() {
                    wr.write_all(&b).await?;
                }
                match q.poll_event() {
                    Some(HostEvent::Connected {
                        header_digest,
                        data_digest,
                        maxh2cdata,
                    }) => return Ok((header_digest, data_digest, maxh2cdata)),
                    Some(HostEvent::Failed(e)) => return Err(NvmeError::Queue(e)),
                    Some(HostEvent::Completed { .. }) | None => {}
                }
            }
        })
        .await
        .map_err(|_| NvmeError::Timeout("ICResp"))??;

        let (tx, rx) = mpsc::channel(usize::from(cfg.depth).max(1) * 2);
        let ended = Arc::new(Mutex::new(None));
        tokio::spawn(dispatch(q, rd, wr, rx, cfg.depth, cancel, ended.clone()));
        Ok(Self {
            tx,
            ended,
            digests: (hd, dd),
            maxh2cdata: maxh2c,
        })
    }

    /// Whether the queue's connection ended (closed, failed, or cancelled).
    pub(crate) fn is_ended(&self) -> bool {
        self.tx.is_closed()
            || match self.ended.lock() {
                Ok(g) => g.is_some(),
                Err(_) => true,
            }
    }

    /// Sends one command and waits for its completion (any status) and read data (`read_buf`
    /// holds it only when it came in several PDUs; one PDU's data is handed over as received).
    pub(crate) async fn call(
        &self,
        sqe: Sqe,
        write: Bytes,
        read_len: u32,
        read_buf: BytesMut,
    ) -> Result<(Cqe, Bytes), NvmeError> {
        let closed = || {
            let why = self.ended.lock().ok().and_then(|g| g.clone());
            NvmeError::Closed(why.unwrap_or_else(|| "queue closed".into()))
        };
        let (reply, rx) = oneshot::channel();
        self.tx
            .send(Request {
                sqe,
                write,
                read_len,
                read_buf,
                reply,
            })
            .await
            .map_err(|_| closed())?;
        rx.await.map_err(|_| closed())?
    }
}

/// How long the bytes still queued when a queue ends (a final H2CTermReq) may take to leave.
const FINAL_WRITE: Duration = Duration::from_secs(5);

/// Slices of `out` one vectored write takes at most.
const IOV_MAX: usize = 64;

/// What one [`poll_send`] did.
enum Sent {
    /// A write took this many bytes off the front.
    Bytes(usize),
    /// Nothing was queued; what was written is flushed.
    Flushed,
}

/// Polls one vectored write of the front of `out`, or a flush when `out` is empty
/// (cancel-safe: `Pending` wrote nothing, and a flush resumes where it stopped).
fn poll_send(
    wr: &mut Wr,
    out: &VecDeque<Bytes>,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<Sent>> {
    if out.is_empty() {
        return Pin::new(wr).poll_flush(cx).map_ok(|()| Sent::Flushed);
    }
    let mut slices = [IoSlice::new(&[]); IOV_MAX];
    let mut n = 0;
    for (s, b) in slices.iter_mut().zip(out.iter()) {
        *s = IoSlice::new(b);
        n += 1;
    }
    Pin::new(wr)
        .poll_write_vectored(cx, &slices[..n])
        .map_ok(Sent::Bytes)
}

/// Drops the `n` bytes a write took off the front of `out`.
fn advance(out: &mut VecDeque<Bytes>, mut n: usize) {
    while n > 0 {
        let Some(front) = out.front_mut() else {
            return;
        };
        if front.len() <= n {
            n -= front.len();
            out.pop_front();
        } else {
            front.advance(n);
            n = 0;
        }
    }
}

/// Sends what is still queued when the queue ends (a final H2CTermReq), then closes the
/// write side; bounded by [`FINAL_WRITE`].
fn finish(mut wr: Wr, out: VecDeque<Bytes>) {
    tokio::spawn(async move {
        let _ = tokio::time::timeout(FINAL_WRITE, async {
            for b in out {
                wr.write_all(&b).await?;
            }
            wr.flush().await?;
            wr.shutdown().await
        })
        .await;
    });
}

fn submit(q: &mut HostQueue, pending: &mut HashMap<u16, Reply>, req: Request) {
    match q.submit(req.sqe, req.write, req.read_len, req.read_buf) {
        Ok(cid) => {
            pending.insert(cid, req.reply);
        }
        Err(e) => {
            let _ = req.reply.send(Err(NvmeError::Queue(e)));
        }
    }
}

/// The queue's one task: reads the socket into the machine, takes requests while the queue
/// has room, answers each when its completion comes, and writes what the machine emits. The
/// writes happen here too, not on a writer task of their own: a command's capsule leaves in
/// the same task turn that took the request (no hand-off and wake-up per command, which at one
/// command in flight is part of every command's latency), and a write the socket cannot take
/// yet waits beside the reading in the same `select!`, so a slow write never stops the reading.
async fn dispatch(
    mut q: HostQueue,
    mut rd: Rd,
    mut wr: Wr,
    mut rx: mpsc::Receiver<Request>,
    depth: u16,
    cancel: CancellationToken,
    ended: Arc<Mutex<Option<String>>>,
) {
    let mut pending: HashMap<u16, Reply> = HashMap::new();
    // Bytes the machine emitted that the socket has not taken yet, in order.
    let mut out: VecDeque<Bytes> = VecDeque::new();
    // Written since the last flush (a TLS stream may hold the last record back until then).
    let mut unflushed = false;
    let reason = loop {
        while let Some(b) = q.poll_transmit() {
            out.push_back(b);
        }
        let room = q.in_flight() < usize::from(depth);
        // A long PDU is read up to its end and no further, so its data is handed over alone
        // in its buffer (`HostQueue::recv_limit`).
        let limit = q.recv_limit();
        tokio::select! {
            biased;
            r = poll_fn(|cx| poll_send(&mut wr, &out, cx)), if !out.is_empty() || unflushed => {
                match r {
                    Ok(Sent::Bytes(0)) => {
                        break NvmeError::Io(std::io::ErrorKind::WriteZero.into())
                    }
                    Ok(Sent::Bytes(n)) => {
                        advance(&mut out, n);
                        unflushed = true;
                        continue;
                    }
                    Ok(Sent::Flushed) => {
                        unflushed = false;
                        continue;
                    }
                    Err(e) => break NvmeError::Io(e),
                }
            }
            r = async {
                let mut buf = q.recv_buf().limit(limit);
                rd.read_buf(&mut buf).await
            } => match r {
                Ok(0) => break NvmeError::Closed("connection closed by the controller".into()),
                Ok(_) => q.process(),
                Err(e) => break NvmeError::Io(e),
            },
            req = rx.recv(), if room => {
                let Some(req) = req else { break NvmeError::Closed("session closed".into()) };
                submit(&mut q, &mut pending, req);
                // Whatever else is waiting goes out in the same write.
                while q.in_flight() < usize::from(depth) {
                    match rx.try_recv() {
                        Ok(req) => submit(&mut q, &mut pending, req),
                        Err(_) => break,
                    }
                }
            }
            () = cancel.cancelled() => break NvmeError::Closed("session closed".into()),
        }
        let mut failed = None;
        while let Some(ev) = q.poll_event() {
            match ev {
                HostEvent::Completed { cid, cqe, data } => {
                    if let Some(r) = pending.remove(&cid) {
                        let _ = r.send(Ok((cqe, data)));
                    }
                }
                HostEvent::Failed(e) => failed = Some(NvmeError::Queue(e)),
                HostEvent::Connected { .. } => {}
            }
        }
        if let Some(e) = failed {
            break e;
        }
    };
    tracing::debug!("nvme queue ends: {reason}");
    let msg = match reason {
        NvmeError::Closed(m) => m,
        other => other.to_string(),
    };
    if let Ok(mut g) = ended.lock() {
        *g = Some(msg.clone());
    }
    for (_, r) in pending.drain() {
        let _ = r.send(Err(NvmeError::Closed(msg.clone())));
    }
    rx.close();
    while let Ok(req) = rx.try_recv() {
        let _ = req.reply.send(Err(NvmeError::Closed(msg.clone())));
    }
    // A final H2CTermReq still goes out.
    while let Some(b) = q.poll_transmit() {
        out.push_back(b);
    }
    finish(wr, out);
}
