//! One NVMe/TCP queue's TCP connection: the tokio driver of `nvme_proto::host::HostQueue`.
//! A dispatcher task owns the queue machine: it reads the socket into the machine's buffer,
//! takes requests while the queue has room (many commands in flight), and answers each
//! request when its completion comes; a writer task sends what the machine emits, so a slow
//! write never stops the reading.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
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
        let (wtx, wrx) = mpsc::unbounded_channel::<Bytes>();
        tokio::spawn(writer(wr, wrx, cancel.clone()));
        let ended = Arc::new(Mutex::new(None));
        tokio::spawn(dispatch(q, rd, rx, wtx, cfg.depth, cancel, ended.clone()));
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

/// How many bytes the writer gathers from several batches into one write (over TLS one
/// `SSL_write`, cut into full 16 KiB records, instead of a record and a system call per batch).
const GATHER: usize = 256 * 1024;

async fn writer(mut wr: Wr, mut rx: mpsc::UnboundedReceiver<Bytes>, cancel: CancellationToken) {
    let mut flat = BytesMut::new();
    // Both plain TCP and `nvme_tls::TlsStream` take vectored writes: the batch goes out as it is;
    // a stream without them would get one flat copy.
    let vectored = wr.is_write_vectored();
    loop {
        let b = tokio::select! {
            b = rx.recv() => b,
            () = cancel.cancelled() => None,
        };
        let Some(b) = b else { break };
        // Whatever else the dispatcher queued meanwhile goes out in the same write.
        let mut len = b.len();
        let mut batch = vec![b];
        while len < GATHER {
            match rx.try_recv() {
                Ok(next) => {
                    len += next.len();
                    batch.push(next);
                }
                Err(_) => break,
            }
        }
        let r = match batch.as_slice() {
            [one] => wr.write_all(one).await,
            many if vectored => write_all_vectored(&mut wr, many).await,
            many => {
                flat.clear();
                for x in many {
                    flat.extend_from_slice(x);
                }
                wr.write_all(&flat).await
            }
        };
        if r.is_err() || wr.flush().await.is_err() {
            break;
        }
    }
    let _ = wr.shutdown().await;
}

/// Writes all of `bufs`, in order, with vectored writes.
async fn write_all_vectored(wr: &mut Wr, bufs: &[Bytes]) -> std::io::Result<()> {
    let (mut i, mut off) = (0, 0);
    while i < bufs.len() {
        let first = bufs[i].slice(off..);
        let mut slices = vec![std::io::IoSlice::new(&first)];
        slices.extend(
            bufs[i + 1..]
                .iter()
                .take(63)
                .map(|b| std::io::IoSlice::new(b)),
        );
        let mut n = wr.write_vectored(&slices).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while n > 0 && i < bufs.len() {
            let left = bufs[i].len() - off;
            if n >= left {
                n -= left;
                i += 1;
                off = 0;
            } else {
                off += n;
                n = 0;
            }
        }
    }
    Ok(())
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

async fn dispatch(
    mut q: HostQueue,
    mut rd: Rd,
    mut rx: mpsc::Receiver<Request>,
    wtx: mpsc::UnboundedSender<Bytes>,
    depth: u16,
    cancel: CancellationToken,
    ended: Arc<Mutex<Option<String>>>,
) {
    let mut pending: HashMap<u16, Reply> = HashMap::new();
    let reason = loop {
        let room = q.in_flight() < usize::from(depth);
        tokio::select! {
            r = rd.read_buf(q.recv_buf()) => match r {
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
        while let Some(b) = q.poll_transmit() {
            if wtx.send(b).is_err() {
                failed.get_or_insert(NvmeError::Closed("connection write failed".into()));
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
    // Let the writer send a final H2CTermReq, then stop.
    drop(wtx);
}
