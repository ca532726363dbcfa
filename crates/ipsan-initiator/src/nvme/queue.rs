//! One NVMe/TCP queue's TCP connection: the tokio driver of `nvme_proto::host::HostQueue`.
//! The queue machine, the commands' callers and the socket's write half are one [`Core`]
//! behind a mutex. A caller submits its command itself when the queue has room (no hand-off to
//! another task) and, when it is the only call under way on the queue (depth 1), writes the
//! capsule itself too; with more calls under way it leaves the bytes for the dispatcher task,
//! which writes every command submitted meanwhile with one vectored write. The dispatcher task
//! reads the socket into the machine's buffer, answers each caller when its completion comes,
//! writes what is left to write (a pending write beside the reading, so a slow write never
//! stops the reading) and takes the requests that waited for room on a full queue.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io::IoSlice;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use nvme_proto::host::{HostEvent, HostQueue, QueueConfig};
use nvme_wire::{Cqe, Sqe};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{mpsc, oneshot};
use tokio_util::sync::{CancellationToken, WaitForCancellationFutureOwned};

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

/// A caller's command: submitted by the caller itself, or sent to the dispatcher to wait for
/// room on a full queue.
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

/// What the callers and the dispatcher share: the queue machine, the callers waiting for
/// their completions, the deadlines, the bytes not written yet and the socket's write half.
struct Core {
    q: HostQueue,
    pending: Pending,
    deadlines: Deadlines,
    /// Bytes the machine emitted that the socket has not taken yet, in order.
    out: VecDeque<Bytes>,
    /// Written since the last flush (a TLS stream may hold the last record back until then).
    unflushed: bool,
    wr: Wr,
    /// The dispatcher task's waker (from its last poll): a caller that leaves bytes to write
    /// or arms the timer wakes it, and a caller's own write registers it for write readiness.
    dispatcher: Option<Waker>,
    /// Why the queue ended, once it has.
    ended: Option<String>,
}

impl std::fmt::Debug for Core {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Core")
            .field("in_flight", &self.q.in_flight())
            .field("ended", &self.ended)
            .finish_non_exhaustive()
    }
}

/// Locks the core; a caller or dispatcher that panicked holding it left nothing half done
/// that the next one cannot see (the machine's own state is consistent between calls).
fn lock(core: &Mutex<Core>) -> MutexGuard<'_, Core> {
    core.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Core {
    /// Takes the machine's bytes to write.
    fn gather(&mut self) {
        while let Some(b) = self.q.poll_transmit() {
            self.out.push_back(b);
        }
    }

    /// Submits a request: its caller waits in `pending` for the completion.
    fn submit(&mut self, req: Request) -> bool {
        let armed = submit(&mut self.q, &mut self.pending, &mut self.deadlines, req);
        self.gather();
        armed
    }

    /// Writes (and flushes) what is queued until done or the socket takes no more; `Pending`
    /// leaves the rest for the dispatcher (the waker in `cx` is told when it can go on).
    fn poll_write_out(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), NvmeError>> {
        while !self.out.is_empty() || self.unflushed {
            match poll_send(&mut self.wr, &self.out, cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(Sent::Bytes(0))) => {
                    return Poll::Ready(Err(NvmeError::Io(std::io::ErrorKind::WriteZero.into())))
                }
                Poll::Ready(Ok(Sent::Bytes(n))) => {
                    advance(&mut self.out, n);
                    self.unflushed = true;
                }
                Poll::Ready(Ok(Sent::Flushed)) => self.unflushed = false,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(NvmeError::Io(e))),
            }
        }
        Poll::Ready(Ok(()))
    }

    /// Answers the callers of the completed commands; the queue's failure if it failed.
    fn deliver(&mut self) -> Option<NvmeError> {
        let mut failed = None;
        while let Some(ev) = self.q.poll_event() {
            match ev {
                HostEvent::Completed { cid, cqe, data } => {
                    if let Some((r, _)) = self.pending.remove(&cid) {
                        let _ = r.send(Ok((cqe, data)));
                    }
                }
                HostEvent::Failed(e) => failed = Some(NvmeError::Queue(e)),
                HostEvent::Connected { .. } => {}
            }
        }
        failed
    }

    fn wake_dispatcher(&self) {
        if let Some(w) = &self.dispatcher {
            w.wake_by_ref();
        }
    }
}

/// A handle on a queue; cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct QueueHandle {
    /// Requests that wait for room on a full queue.
    tx: mpsc::Sender<Request>,
    core: Arc<Mutex<Core>>,
    /// The queue's depth (commands in flight at most).
    depth: usize,
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
        let core = Arc::new(Mutex::new(Core {
            q,
            pending: Pending::default(),
            deadlines: Deadlines::new(),
            out: VecDeque::new(),
            unflushed: false,
            wr,
            dispatcher: None,
            ended: None,
        }));
        tokio::spawn(dispatch(Arc::clone(&core), rd, rx, cfg.depth, cancel));
        Ok(Self {
            tx,
            core,
            depth: usize::from(cfg.depth),
            calls: Arc::default(),
            digests: (hd, dd),
            maxh2cdata: maxh2c,
            home: std::thread::current().id(),
        })
    }

    /// Whether the queue's connection ended (closed, failed, or cancelled).
    pub(crate) fn is_ended(&self) -> bool {
        self.tx.is_closed() || lock(&self.core).ended.is_some()
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
        if let Some(req) = self.submit_here(req) {
            // Out of line (boxed): the common case's future stays small, without the room
            // wait's semaphore and timer in it.
            Box::pin(self.send_waiting(req)).await?;
        }
        rx.await.map_err(|_| self.closed())?
    }

    /// Why the queue ended, as a [`NvmeError::Closed`].
    fn closed(&self) -> NvmeError {
        let why = lock(&self.core).ended.clone();
        NvmeError::Closed(why.unwrap_or_else(|| "queue closed".into()))
    }

    /// Hands `req` to the dispatcher, waiting (until its deadline) for room on a full queue.
    async fn send_waiting(&self, req: Request) -> Result<(), NvmeError> {
        let deadline = req.deadline;
        match self.tx.try_send(req) {
            Ok(()) => Ok(()),
            Err(TrySendError::Closed(_)) => Err(self.closed()),
            Err(TrySendError::Full(req)) => {
                let send = self.tx.send(req);
                let sent = match deadline {
                    Some(d) => tokio::time::timeout_at(d.into(), send)
                        .await
                        .map_err(|_| NvmeError::Timeout("I/O command"))?,
                    None => send.await,
                };
                sent.map_err(|_| self.closed())
            }
        }
    }
}

impl QueueHandle {
    /// Submits `req` on the caller's task when the queue has room and no request waits for
    /// room before it (else gives it back, for the dispatcher's channel): no hand-off to the dispatcher
    /// and no wake-up of it per command. When this is the only call under way on the queue
    /// (depth 1: no other caller can join a batch), the capsule is written here too, with the
    /// dispatcher's waker for what the socket does not take at once; otherwise the dispatcher
    /// writes it, with whatever the other callers submit before it runs, in one write.
    fn submit_here(&self, req: Request) -> Option<Request> {
        let mut c = lock(&self.core);
        if let Some(msg) = c.ended.clone() {
            drop(c);
            let _ = req.reply.send(Err(NvmeError::Closed(msg)));
            return None;
        }
        let waiting = self.tx.capacity() < self.tx.max_capacity();
        if c.q.in_flight() >= self.depth || waiting {
            return Some(req);
        }
        let idle = c.out.is_empty() && !c.unflushed;
        let armed = c.submit(req);
        let alone = self.calls.load(Ordering::Relaxed) <= 1;
        if alone && idle && !armed {
            if let Some(w) = c.dispatcher.take() {
                let written = c.poll_write_out(&mut Context::from_waker(&w));
                c.dispatcher = Some(w);
                // An error or a socket that is full: the dispatcher goes on (or fails).
                if let Poll::Ready(Ok(())) = written {
                    return None;
                }
            }
        }
        // Not polled yet: its first poll writes.
        c.wake_dispatcher();
        None
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

    /// Arms the timer at `d` if that is earlier than it is armed at; whether it did.
    fn arm(&mut self, d: Instant) -> bool {
        if self.armed.is_none_or(|a| d < a) {
            self.timer.as_mut().reset(d.into());
            self.armed = Some(d);
            return true;
        }
        false
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
            let _ = self.arm(next);
        }
    }
}

/// Submits `req` to the machine; whether its deadline moved the timer (which the dispatcher
/// must then poll again).
fn submit(
    q: &mut HostQueue,
    pending: &mut Pending,
    deadlines: &mut Deadlines,
    req: Request,
) -> bool {
    match q.submit(req.sqe, req.write, req.read_len, req.read_buf) {
        Ok(cid) => {
            let armed = req.deadline.is_some_and(|d| deadlines.arm(d));
            pending.insert(cid, (req.reply, req.deadline));
            armed
        }
        Err(e) => {
            let _ = req.reply.send(Err(NvmeError::Queue(e)));
            false
        }
    }
}

/// The queue's task: reads the socket into the machine and answers each caller when its
/// completion comes, writes what the callers left to write, takes the requests that waited
/// for room, and fails the commands past their deadline. Its one `poll` ([`drive`]) does all of
/// it under one lock of the core.
async fn dispatch(
    core: Arc<Mutex<Core>>,
    mut rd: Rd,
    mut rx: mpsc::Receiver<Request>,
    depth: u16,
    cancel: CancellationToken,
) {
    let depth = usize::from(depth);
    // Made once: a `cancelled()` made and dropped on every turn registered and unregistered a
    // waiter each time (two locks more per turn).
    let cancelled = cancel.cancelled_owned();
    tokio::pin!(cancelled);
    let reason = poll_fn(|cx| drive(&core, &mut rd, &mut rx, depth, cancelled.as_mut(), cx)).await;
    tracing::debug!("nvme queue ends: {reason}");
    let msg = match reason {
        NvmeError::Closed(m) => m,
        other => other.to_string(),
    };
    let mut c = lock(&core);
    c.ended = Some(msg.clone());
    for (_, (r, _)) in c.pending.drain() {
        let _ = r.send(Err(NvmeError::Closed(msg.clone())));
    }
    rx.close();
    while let Ok(req) = rx.try_recv() {
        let _ = req.reply.send(Err(NvmeError::Closed(msg.clone())));
    }
    // A final H2CTermReq still goes out.
    c.gather();
    let out = std::mem::take(&mut c.out);
    let wr = std::mem::replace(&mut c.wr, Box::new(tokio::io::sink()));
    c.dispatcher = None;
    drop(c);
    finish(wr, out);
}

/// One poll of the queue's task, in this order: writes as far as the socket takes them, the
/// socket's bytes into the machine (answering the callers), requests that waited for room, the
/// deadlines' timer, cancellation; each that did something starts the round again (so writes
/// go first, and a slow write never stops the reading). `Ready` is why the queue ends.
fn drive(
    core: &Mutex<Core>,
    rd: &mut Rd,
    rx: &mut mpsc::Receiver<Request>,
    depth: usize,
    mut cancelled: Pin<&mut WaitForCancellationFutureOwned>,
    cx: &mut Context<'_>,
) -> Poll<NvmeError> {
    let mut guard = lock(core);
    let c = &mut *guard;
    if !c
        .dispatcher
        .as_ref()
        .is_some_and(|w| w.will_wake(cx.waker()))
    {
        c.dispatcher = Some(cx.waker().clone());
    }
    loop {
        c.gather();
        if let Poll::Ready(Err(e)) = c.poll_write_out(cx) {
            return Poll::Ready(e);
        }
        // A long PDU is read up to its end and no further, so its data is handed over alone
        // in its buffer (`HostQueue::recv_limit`).
        let limit = c.q.recv_limit();
        let read = {
            let mut buf = c.q.recv_buf().limit(limit);
            std::pin::pin!(rd.read_buf(&mut buf)).poll(cx)
        };
        match read {
            Poll::Ready(Ok(0)) => {
                return Poll::Ready(NvmeError::Closed(
                    "connection closed by the controller".into(),
                ))
            }
            Poll::Ready(Ok(_)) => {
                c.q.process();
                if let Some(e) = c.deliver() {
                    return Poll::Ready(e);
                }
                continue;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(NvmeError::Io(e)),
            Poll::Pending => {}
        }
        if c.q.in_flight() < depth {
            match rx.poll_recv(cx) {
                Poll::Ready(None) => {
                    return Poll::Ready(NvmeError::Closed("session closed".into()))
                }
                Poll::Ready(Some(req)) => {
                    c.submit(req);
                    // Whatever else is waiting goes out in the same write.
                    while c.q.in_flight() < depth {
                        match rx.try_recv() {
                            Ok(req) => {
                                c.submit(req);
                            }
                            Err(_) => break,
                        }
                    }
                    continue;
                }
                Poll::Pending => {}
            }
        }
        if c.deadlines.armed.is_some() && c.deadlines.timer.as_mut().poll(cx).is_ready() {
            c.deadlines.expire(&mut c.pending);
            continue;
        }
        if cancelled.as_mut().poll(cx).is_ready() {
            return Poll::Ready(NvmeError::Closed("session closed".into()));
        }
        return Poll::Pending;
    }
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
