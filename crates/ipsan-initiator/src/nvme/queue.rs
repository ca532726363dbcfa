//! One NVMe/TCP queue's TCP connection: the tokio driver of `nvme_proto::host::HostQueue`.
//! One dispatcher task owns the queue machine and the socket: it reads the socket into the
//! machine's buffer, takes requests while the queue has room (many commands in flight),
//! answers each request when its completion comes, and writes what the machine emits, a
//! pending write beside the reading, so a slow write never stops the reading.

use std::collections::VecDeque;
use std::future::poll_fn;
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use nvme_proto::host::{HostEvent, HostQueue, QueueConfig};
use nvme_wire::{Cqe, Sqe};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TrySendError;
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
    /// When the command fails with [`NvmeError::Timeout`] if no completion came
    /// ([`QueueHandle::call_until`]).
    deadline: Option<Instant>,
}

/// A handle on a queue's dispatcher; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct QueueHandle {
    tx: mpsc::Sender<Request>,
    /// Why the queue ended, once it has.
    ended: Arc<Mutex<Option<String>>>,
    /// Calls under way on the queue (sent or waiting to be), for [`pick`].
    calls: Arc<AtomicUsize>,
    /// What ICResp enabled: header digest, data digest, MAXH2CDATA.
    pub(crate) digests: (bool, bool),
    pub(crate) maxh2cdata: u32,
    /// The thread the queue's task was started on: where it runs for good when that is a
    /// current-thread runtime's ([`QueueHandle::connect_on`]).
    pub(crate) home: std::thread::ThreadId,
}

impl std::fmt::Debug for Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Request").field("sqe", &self.sqe).finish()
    }
}

impl QueueHandle {
    /// [`QueueHandle::connect`] run on the runtime `on` (its socket registered with that
    /// runtime's reactor and its task spawned there), or on the caller's with `None`. On a
    /// current-thread runtime the queue's socket, task and timer stay on that runtime's thread.
    pub(crate) async fn connect_on(
        on: Option<&tokio::runtime::Handle>,
        addr: &str,
        cfg: QueueConfig,
        tls: Option<&TlsParams>,
        timeout: Duration,
        cancel: CancellationToken,
    ) -> Result<Self, NvmeError> {
        let Some(h) = on else {
            return Self::connect(addr, cfg, tls, timeout, cancel).await;
        };
        let addr = addr.to_owned();
        let tls = tls.cloned();
        h.spawn(async move { Self::connect(&addr, cfg, tls.as_ref(), timeout, cancel).await })
            .await
            .map_err(|e| NvmeError::Closed(format!("the queue's runtime: {e}")))?
    }

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
            calls: Arc::default(),
            digests: (hd, dd),
            maxh2cdata: maxh2c,
            home: std::thread::current().id(),
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

    /// Calls under way on this queue: sent and not yet answered, or waiting to be sent.
    pub(crate) fn calls(&self) -> usize {
        self.calls.load(Ordering::Relaxed)
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
        self.call_until(sqe, write, read_len, read_buf, None).await
    }

    /// [`QueueHandle::call`] that fails with [`NvmeError::Timeout`] at `deadline` (`None`:
    /// never). The dispatcher keeps the deadline with the command and one timer for all of
    /// them, so a command arms no timer of its own (a tokio timeout per command was ~4 % of
    /// the host's CPU at 4 KiB, docs/results/nvme-speed-4); only a wait for room on a full
    /// queue has one. The command stays in flight on the wire until the controller answers
    /// (its CID is not reused before), as when a caller gives up on it.
    pub(crate) async fn call_until(
        &self,
        sqe: Sqe,
        write: Bytes,
        read_len: u32,
        read_buf: BytesMut,
        deadline: Option<Instant>,
    ) -> Result<(Cqe, Bytes), NvmeError> {
        let closed = || {
            let why = self.ended.lock().ok().and_then(|g| g.clone());
            NvmeError::Closed(why.unwrap_or_else(|| "queue closed".into()))
        };
        // Counted until this call returns or is dropped (a timeout), whatever its outcome.
        let _under_way = UnderWay::new(&self.calls);
        let (reply, rx) = oneshot::channel();
        let req = Request {
            sqe,
            write,
            read_len,
            read_buf,
            reply,
            deadline,
        };
        match self.tx.try_send(req) {
            Ok(()) => {}
            Err(TrySendError::Closed(_)) => return Err(closed()),
            Err(TrySendError::Full(req)) => {
                let send = self.tx.send(req);
                let sent = match deadline {
                    Some(d) => tokio::time::timeout_at(d.into(), send)
                        .await
                        .map_err(|_| NvmeError::Timeout("I/O command"))?,
                    None => send.await,
                };
                sent.map_err(|_| closed())?;
            }
        }
        rx.await.map_err(|_| closed())?
    }
}

/// One call counted in [`QueueHandle::calls`] while it lives.
struct UnderWay<'a>(&'a AtomicUsize);

impl<'a> UnderWay<'a> {
    fn new(calls: &'a AtomicUsize) -> Self {
        calls.fetch_add(1, Ordering::Relaxed);
        Self(calls)
    }
}

impl Drop for UnderWay<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The queue of `n` a command goes on: the one with the fewest calls under way (`calls(i)`),
/// looking from `start` on, so ties go round. Callers that just got their answer from a queue
/// send their next command on it (it has room now): a round of completions read from one
/// connection becomes one batch of commands on that connection, one vectored write on each
/// side for all of them, where sending them round robin would halve every batch (twice the
/// system calls per command on host and target alike, and on loopback TCP's receive
/// processing once per write), and the queues stay evenly loaded.
pub(crate) fn pick(n: usize, start: usize, calls: impl Fn(usize) -> usize) -> usize {
    let mut best = start % n.max(1);
    let mut least = usize::MAX;
    for k in 0..n {
        let i = start.wrapping_add(k) % n;
        let c = calls(i);
        if c < least {
            least = c;
            best = i;
        }
    }
    best
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

/// The callers waiting for the commands in flight, by CID, with their deadlines.
type Pending = nvme_proto::idhash::IdMap<u16, (Reply, Option<Instant>)>;

/// The one timer of a queue's command deadlines: armed at the earliest deadline it knows of,
/// moved only earlier when a command comes with one, and when it fires every command past
/// its deadline fails and it is armed at the earliest one left.
struct Deadlines {
    timer: Pin<Box<tokio::time::Sleep>>,
    armed: Option<Instant>,
}

impl Deadlines {
    fn new() -> Self {
        Self {
            timer: Box::pin(tokio::time::sleep(Duration::from_secs(3600))),
            armed: None,
        }
    }

    fn arm(&mut self, d: Instant) {
        if self.armed.is_none_or(|a| d < a) {
            self.timer.as_mut().reset(d.into());
            self.armed = Some(d);
        }
    }

    /// Fails the commands of `pending` whose deadline passed; arms at the next one.
    fn expire(&mut self, pending: &mut Pending) {
        let now = Instant::now();
        let late: Vec<u16> = pending
            .iter()
            .filter(|(_, (_, d))| d.is_some_and(|d| d <= now))
            .map(|(&cid, _)| cid)
            .collect();
        for cid in late {
            if let Some((r, _)) = pending.remove(&cid) {
                let _ = r.send(Err(NvmeError::Timeout("I/O command")));
            }
        }
        self.armed = None;
        if let Some(next) = pending.values().filter_map(|(_, d)| *d).min() {
            self.arm(next);
        }
    }
}

fn submit(q: &mut HostQueue, pending: &mut Pending, deadlines: &mut Deadlines, req: Request) {
    match q.submit(req.sqe, req.write, req.read_len, req.read_buf) {
        Ok(cid) => {
            if let Some(d) = req.deadline {
                deadlines.arm(d);
            }
            pending.insert(cid, (req.reply, req.deadline));
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
    let mut pending = Pending::default();
    let mut deadlines = Deadlines::new();
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
                submit(&mut q, &mut pending, &mut deadlines, req);
                // Whatever else is waiting goes out in the same write.
                while q.in_flight() < usize::from(depth) {
                    match rx.try_recv() {
                        Ok(req) => submit(&mut q, &mut pending, &mut deadlines, req),
                        Err(_) => break,
                    }
                }
            }
            () = &mut deadlines.timer, if deadlines.armed.is_some() => {
                deadlines.expire(&mut pending);
            }
            () = cancel.cancelled() => break NvmeError::Closed("session closed".into()),
        }
        let mut failed = None;
        while let Some(ev) = q.poll_event() {
            match ev {
                HostEvent::Completed { cid, cqe, data } => {
                    if let Some((r, _)) = pending.remove(&cid) {
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
    for (_, (r, _)) in pending.drain() {
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

#[cfg(test)]
mod tests {
    use super::pick;

    #[test]
    fn picks_the_queue_with_the_fewest_calls_and_goes_round_on_ties() {
        let calls = [3, 1, 2];
        for start in 0..6 {
            assert_eq!(pick(3, start, |i| calls[i]), 1);
        }
        let even = [2, 2, 2];
        let picked: Vec<usize> = (0..6).map(|s| pick(3, s, |i| even[i])).collect();
        assert_eq!(picked, [0, 1, 2, 0, 1, 2]);
        assert_eq!(pick(2, usize::MAX, |i| [5, 5][i]), 1);
        assert_eq!(pick(1, 7, |_| 9), 0);
    }
}
