//! One NVMe/TCP connection (one queue): the tokio driver of `nvme_proto::queue::Queue` (the
//! PDUs) and the connection's `nvme_proto::controller::Queue` (the commands). One task reads
//! the socket, runs both machines, submits block requests and writes the PDUs they produce
//! with vectored writes, a pending write beside the reading. Block requests go to the
//! namespace's store as its engine wants them (inline, on the blocking pool, or submitted to
//! an async store whose completer posts the result back here): never a thread per command. A
//! read the store can answer with its own memory (a RAM store's read of 64 KiB or more,
//! `Backend::read_shared`) goes out as that memory: no read buffer, no copy before the
//! socket's.
//!
//! The admin queue's commands take the shared `controller::Target`'s lock briefly; I/O queues
//! run their commands on their own `controller::Queue` with no lock shared by connections.

use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::io::IoSlice;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use ipsan_scsi::aio::{Engine, IoCompletion, IoError, IoOp, IoRequest};
use ipsan_scsi::Whole;
use nvme_proto::controller::{self, BlockError, BlockOp, BlockRequest, Submitted};
use nvme_proto::idhash::IdMap;
use nvme_proto::psk::PskIdentity;
use nvme_proto::queue::{Event, Queue};
use nvme_proto::{Command, Completion};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::subsystems::{Lus, Stores};
use super::{ConnEntry, IoKind, NsCounters, Shared};

/// A block request's outcome, posted back to the connection.
struct BlockDone {
    nsid: u32,
    kind: IoKind,
    /// Bytes the request reads or writes (for the counters).
    bytes: u64,
    completion: IoCompletion,
    /// A FUA write: flush before the result counts.
    then_flush: bool,
}

/// How long a closed connection keeps reading (and dropping) what the host still sends.
const LINGER: std::time::Duration = std::time::Duration::from_millis(500);

struct Conn {
    shared: Arc<Shared>,
    q: Queue,
    ctl: Option<controller::Queue>,
    stores: Stores,
    /// The LUs whose reservations the namespaces in `stores` share (`resv`).
    lus: Lus,
    /// The host's identity in those reservations, once connected.
    who: Option<ipsan_scsi::pr::ItNexus>,
    /// Results of reservation commands, which run on the blocking pool.
    resv_tx: mpsc::UnboundedSender<(u64, Result<Bytes, BlockError>)>,
    /// The counters of the namespaces in `stores`.
    counters: IdMap<u32, Arc<NsCounters>>,
    /// The `Shared::stores_gen` `stores` was looked up at.
    stores_gen: u64,
    io_tx: mpsc::UnboundedSender<BlockDone>,
    aer_tx: mpsc::UnboundedSender<Completion>,
    close: CancellationToken,
    id: u64,
    /// The TLS PSK identity of the connection, when it is TLS.
    identity: Option<PskIdentity>,
}

/// Serves one accepted connection until the host closes it, the queue terminates it, its
/// controller goes away or `cancel` fires.
/// `identity` is the TLS PSK identity the connection was keyed for (TP 8011): its Connect must
/// name the same host NQN and subsystem NQN.
///
/// One task reads, runs both machines and writes: what the machines emit is written from the
/// same poll that reads (a pending write beside the reading, as ipsan's host does in
/// `ipsan_initiator::nvme::queue`), so a completion leaves in the task turn that made it, with
/// no hand-off to a writer task and no wake-up of one (on a multi-threaded runtime often on
/// the other CPU). While more than [`MAX_UNSENT`] bytes wait for the socket, or the commands
/// hold more than [`MAX_HELD`] bytes of write data, the socket is not read: a host that sends
/// commands and never reads their answers, or writes faster than the store, cannot make the
/// target queue without bound.
pub(super) async fn serve<S>(
    stream: S,
    peer: SocketAddr,
    shared: Arc<Shared>,
    cancel: CancellationToken,
    identity: Option<PskIdentity>,
) where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    shared.connections.fetch_add(1, Ordering::Relaxed);
    let (mut rd, mut wr) = tokio::io::split(stream);
    let (io_tx, mut io_rx) = mpsc::unbounded_channel();
    let (aer_tx, mut aer_rx) = mpsc::unbounded_channel();
    let (resv_tx, mut resv_rx) = mpsc::unbounded_channel();
    let mut c = Conn {
        q: Queue::new(shared.queue_cfg.clone(), Instant::now()),
        ctl: None,
        stores: Arc::default(),
        lus: Arc::default(),
        who: None,
        resv_tx,
        counters: IdMap::default(),
        stores_gen: 0,
        io_tx,
        aer_tx,
        close: cancel.child_token(),
        id: shared.next_id(),
        shared,
        identity,
    };
    let mut buf = BytesMut::with_capacity(nvme_proto::queue::RECV_CHUNK);
    // A long H2CData's data being received into a buffer of its own (`Queue::placement`),
    // and its length.
    let mut placing: Option<(BytesMut, usize)> = None;
    let mut out = Unsent::default();
    // Written since the last flush (a TLS stream may hold its last record back until then).
    let mut unflushed = false;
    let mut closed = false;
    let mut peer_gone = false;
    // Made once: a `cancelled()` made and dropped on every turn registered and unregistered a
    // waiter each time (two locks more per turn).
    let closing = c.close.clone().cancelled_owned();
    tokio::pin!(closing);
    // The queue's setup deadline (`Queue::poll_timeout`) and its timer.
    let mut timer: Option<(Instant, Pin<Box<tokio::time::Sleep>>)> = None;
    loop {
        while let Some(ev) = c.q.poll_event() {
            match ev {
                Event::Command(cmd) => c.on_command(cmd),
                Event::Closed(reason) => {
                    debug!(%peer, ?reason, "NVMe/TCP connection closed");
                    closed = true;
                }
            }
        }
        while let Some(b) = c.q.poll_transmit() {
            out.push(b);
        }
        if closed {
            break;
        }
        let deadline = c.q.poll_timeout();
        if deadline.is_none() {
            timer = None;
        } else if let Some(d) = deadline.filter(|&d| timer.as_ref().is_none_or(|t| t.0 != d)) {
            timer = Some((d, Box::pin(tokio::time::sleep_until(d.into()))));
        }
        let reading = out.bytes <= MAX_UNSENT && c.q.held() <= MAX_HELD;
        let sending = !out.bufs.is_empty() || unflushed;
        // Room for the read, which ends where a long PDU does (`Queue::prepare_recv`): its
        // data is received where it stays, never moved. A whole 1 MiB write's data (in its
        // capsule or an H2CData) goes to a buffer of its own, exactly its length, which the
        // store may keep (issue 30).
        if reading && placing.is_none() {
            placing = c.q.placement(&buf).map(|n| (BytesMut::with_capacity(n), n));
        }
        let limit = match &placing {
            _ if !reading => 0,
            Some((data, n)) => n - data.len(),
            None => c.q.prepare_recv(&mut buf),
        };
        // One poll of every source in order (writes first): what a `select!` of them did,
        // without building and dropping a future per source on every turn.
        let turn = poll_fn(|cx| {
            if sending {
                if let Poll::Ready(r) = poll_send(&mut wr, &out, cx) {
                    return Poll::Ready(Turn::Sent(r));
                }
            }
            if reading {
                let into = match placing.as_mut() {
                    Some((data, _)) => data,
                    None => &mut buf,
                };
                let mut room = into.limit(limit);
                if let Poll::Ready(r) = std::pin::pin!(rd.read_buf(&mut room)).poll(cx) {
                    return Poll::Ready(Turn::Read(r));
                }
            }
            // A closed channel (never: `c` holds their senders) is a source that never wakes.
            if let Poll::Ready(Some(d)) = io_rx.poll_recv(cx) {
                return Poll::Ready(Turn::Done(d));
            }
            if let Poll::Ready(Some((tag, r))) = resv_rx.poll_recv(cx) {
                return Poll::Ready(Turn::Resv(tag, r));
            }
            if let Poll::Ready(Some(done)) = aer_rx.poll_recv(cx) {
                return Poll::Ready(Turn::Aer(done));
            }
            if let Some((_, t)) = timer.as_mut() {
                if t.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Turn::Timeout);
                }
            }
            if closing.as_mut().poll(cx).is_ready() {
                return Poll::Ready(Turn::Close);
            }
            Poll::Pending
        })
        .await;
        match turn {
            Turn::Sent(r) => match r {
                Ok(Sent::Bytes(0) | Sent::All(0)) | Err(_) => {
                    debug!(%peer, "NVMe/TCP write failed");
                    break;
                }
                Ok(Sent::Bytes(n)) => {
                    out.advance(n);
                    unflushed = true;
                }
                Ok(Sent::All(n)) => {
                    out.advance(n);
                    unflushed = false;
                }
                Ok(Sent::Flushed) => unflushed = false,
            },
            Turn::Read(r) => match r {
                Ok(0) => {
                    peer_gone = true;
                    break;
                }
                Ok(_) => match placing.take() {
                    Some((data, n)) if data.len() == n => {
                        c.q.receive_placed(&mut buf, data.freeze());
                    }
                    Some(part) => placing = Some(part),
                    None => c.q.receive(&mut buf),
                },
                Err(e) => {
                    debug!(%peer, "NVMe/TCP read: {e}");
                    break;
                }
            },
            Turn::Done(d) => {
                c.on_block_done(d);
                // Whatever else finished goes out in the same write.
                while let Ok(d) = io_rx.try_recv() {
                    c.on_block_done(d);
                }
            }
            Turn::Resv(tag, r) => {
                c.deliver(tag, r);
                // The change may owe other hosts reservation notices (`deliver_resv_notices`).
                c.shared.wake.notify_one();
            }
            Turn::Aer(done) => {
                if c.q.complete(done).is_err() {
                    warn!(%peer, "an asynchronous event for a command this queue does not hold");
                }
            }
            Turn::Timeout => c.q.handle_timeout(Instant::now()),
            Turn::Close => c.q.close(),
        }
    }
    c.disconnect();
    c.shared.connections.fetch_sub(1, Ordering::Relaxed);
    // The last PDUs (a C2HTermReq) go out, then a FIN; bounded, the host may not be reading.
    while let Some(b) = c.q.poll_transmit() {
        out.push(b);
    }
    let _ = tokio::time::timeout(FINAL_WRITE, async {
        for b in out.bufs {
            wr.write_all(&b).await?;
        }
        wr.flush().await?;
        wr.shutdown().await
    })
    .await;
    if !peer_gone {
        // Closing with unread bytes would make the kernel answer with a reset, which can
        // destroy the termination request before the host reads it: read and drop until the
        // host closes, briefly.
        let _ = tokio::time::timeout(LINGER, async {
            let mut sink = vec![0u8; 16 * 1024];
            while matches!(rd.read(&mut sink).await, Ok(n) if n > 0) {}
        })
        .await;
    }
}

/// What a turn of [`serve`]'s loop found ready, in the order it looks.
enum Turn {
    Sent(std::io::Result<Sent>),
    Read(std::io::Result<usize>),
    Done(BlockDone),
    Resv(u64, Result<Bytes, BlockError>),
    Aer(Completion),
    Timeout,
    Close,
}

/// Writes at least this long offer their data as a whole buffer ([`whole_write`]): the RAM
/// store's chunk, the one write a store keeps (`super::PLACE_MIN`); a shorter one is copied
/// by every store anyway, and in-capsule data is a slice of the receive buffer.
const WHOLE_MIN: usize = super::PLACE_MIN as usize;

/// A write's data as a [`Whole`] buffer when it is one: the only handle on all of its
/// allocation, from its first byte (an H2CData received into a buffer of its own,
/// `Queue::placement`); otherwise the data as it was.
fn whole_write(data: Bytes) -> Result<Whole, Bytes> {
    if data.len() < WHOLE_MIN {
        return Err(data);
    }
    Whole::from_bytes(data)
}

/// Bytes waiting for the socket past which the connection stops reading it (see [`serve`]).
const MAX_UNSENT: usize = 4 << 20;

/// Bytes of write data the connection's commands may hold with the store (`Queue::held`)
/// past which it stops reading the socket until some complete: 16 writes of 1 MiB, what the
/// R2Ts let in at once, now that a write of up to 1 MiB may come in its capsule (the
/// in-capsule size); a host's writes to a slow store are held back by TCP instead of
/// queueing here.
const MAX_HELD: usize = 16 << 20;

/// How long the last PDUs of a connection that ends (a C2HTermReq) may take to leave.
const FINAL_WRITE: std::time::Duration = std::time::Duration::from_secs(5);

/// Slices one vectored write takes at most.
const IOV_MAX: usize = 64;

/// What the machines emitted that the socket has not taken yet, in order: whole control PDUs,
/// and data PDUs as header, payload (a slice of the store's or the command's buffer) and
/// digest.
#[derive(Default)]
struct Unsent {
    bufs: VecDeque<Bytes>,
    bytes: usize,
}

impl Unsent {
    fn push(&mut self, b: Bytes) {
        self.bytes += b.len();
        self.bufs.push_back(b);
    }

    /// Drops the `n` bytes a write took off the front.
    fn advance(&mut self, mut n: usize) {
        self.bytes = self.bytes.saturating_sub(n);
        while n > 0 {
            let Some(front) = self.bufs.front_mut() else {
                return;
            };
            if front.len() <= n {
                n -= front.len();
                self.bufs.pop_front();
            } else {
                front.advance(n);
                n = 0;
            }
        }
    }
}

/// What one [`poll_send`] did.
enum Sent {
    /// A write took this many bytes off the front.
    Bytes(usize),
    /// A write took all of them and the flush behind it is done (plain TCP's always is: no
    /// turn of the loop for it).
    All(usize),
    /// Nothing was queued; what was written is flushed.
    Flushed,
}

/// Polls one vectored write of the front of `out` (up to [`IOV_MAX`] pieces: a batch of
/// completions in one system call; TLS (`nvme_tls::TlsStream`) packs them into full records
/// and sends those with one), or a flush when `out` is empty. Cancel-safe: `Pending` wrote
/// nothing, and a flush resumes where it stopped.
fn poll_send<W: AsyncWrite + Unpin>(
    wr: &mut W,
    out: &Unsent,
    cx: &mut Context<'_>,
) -> Poll<std::io::Result<Sent>> {
    if out.bufs.is_empty() {
        return Pin::new(wr).poll_flush(cx).map_ok(|()| Sent::Flushed);
    }
    let mut slices = [IoSlice::new(&[]); IOV_MAX];
    let mut n = 0;
    for (s, b) in slices.iter_mut().zip(out.bufs.iter()) {
        *s = IoSlice::new(b);
        n += 1;
    }
    let written = std::task::ready!(Pin::new(&mut *wr).poll_write_vectored(cx, &slices[..n]))?;
    if written != out.bytes {
        return Poll::Ready(Ok(Sent::Bytes(written)));
    }
    // All written: the flush now rather than on the next turn (`Pending` only leaves it for
    // then).
    Poll::Ready(Ok(match Pin::new(wr).poll_flush(cx) {
        Poll::Ready(Ok(())) => Sent::All(written),
        Poll::Ready(Err(_)) | Poll::Pending => Sent::Bytes(written),
    }))
}

impl Conn {
    fn on_command(&mut self, cmd: Command) {
        let now = Instant::now();
        let Some(ctl) = self.ctl.as_mut() else {
            // A queue's first command: Connect (NVMe over Fabrics 1.1 §3.3). On a TLS
            // connection the controller checks that it names the host and subsystem whose key
            // keyed the connection (TP 8011).
            let channel = controller::Channel {
                tls: self.identity.as_ref().map(|id| controller::TlsPeer {
                    hostnqn: id.hostnqn.clone(),
                    subnqn: id.subnqn.clone(),
                }),
            };
            let r = self.shared.target().connect_on(&cmd, now, &channel);
            self.shared.wake.notify_one();
            self.count_connect(&cmd, &r);
            match r {
                Ok((ctl, done)) => {
                    self.stores_gen = self.shared.stores_gen.load(Ordering::Acquire);
                    self.stores = self.shared.stores(ctl.subnqn());
                    self.lus = self.shared.lus(ctl.subnqn());
                    self.who = Some(super::resv::nexus(ctl.hostnqn(), &ctl.hostid()));
                    self.counters = self.shared.ns_counters(ctl.subnqn(), &self.stores);
                    self.shared.register(
                        ctl.cntlid(),
                        ConnEntry {
                            id: self.id,
                            qid: ctl.qid(),
                            close: self.close.clone(),
                            aer: (ctl.qid() == 0).then(|| self.aer_tx.clone()),
                        },
                    );
                    self.ctl = Some(ctl);
                    self.complete(done);
                }
                Err(done) => self.complete(done),
            }
            return;
        };
        let submitted = if ctl.qid() == 0 {
            let s = self.shared.target().submit(ctl, cmd, now);
            self.shared.wake.notify_one();
            s
        } else {
            ctl.submit(cmd, now)
        };
        match submitted {
            Submitted::Done(done) => self.complete(done),
            Submitted::Block(reqs) => {
                for r in reqs {
                    self.start_block(r);
                }
            }
            Submitted::Held => {}
        }
    }

    /// Counts an admin-queue Connect per subsystem and host (`Shared::count_connect`).
    fn count_connect(
        &self,
        cmd: &Command,
        r: &Result<(controller::Queue, Completion), Completion>,
    ) {
        use nvme_wire::fabrics::{ConnectData, FabricsCommand, FabricsKind};
        let admin = matches!(
            FabricsCommand::decode(&cmd.sqe).map(|f| f.kind),
            Ok(FabricsKind::Connect(c)) if c.qid == 0
        );
        let Some(d) = admin.then(|| ConnectData::decode(&cmd.data).ok()).flatten() else {
            return;
        };
        let result = match r {
            Ok(_) => "accepted",
            Err(c) if c.cqe.status == nvme_wire::Status::CONNECT_INVALID_HOST => "refused_host",
            Err(_) => "refused",
        };
        self.shared.count_connect(&d.subnqn, &d.hostnqn, result);
    }

    fn complete(&mut self, done: Completion) {
        if let Err(e) = self.q.complete(done) {
            warn!("NVMe completion dropped: {e}");
        }
    }

    fn start_block(&mut self, r: BlockRequest) {
        // A live change replaced the stores (a LUN added or removed): look them up again.
        let gen = self.shared.stores_gen.load(Ordering::Acquire);
        if gen != self.stores_gen {
            if let Some(ctl) = &self.ctl {
                self.stores = self.shared.stores(ctl.subnqn());
                self.lus = self.shared.lus(ctl.subnqn());
                self.counters = self.shared.ns_counters(ctl.subnqn(), &self.stores);
            }
            self.stores_gen = gen;
        }
        // Reservations: the LU's state, shared with SCSI (docs/nvme.md "Reservations").
        if let Some(lu) = self.lus.get(&r.nsid) {
            if let BlockOp::Reservation(op) = r.op {
                let lu = Arc::clone(lu);
                let Some(who) = self.who.clone() else {
                    return self.deliver(r.tag, Err(BlockError::Internal));
                };
                // It may wait for a shared store (RBD's record object): off this task.
                let (tx, tag) = (self.resv_tx.clone(), r.tag);
                drop(tokio::task::spawn_blocking(move || {
                    let _ = tx.send((tag, super::resv::run(&lu, &who, op)));
                }));
                return;
            }
            let write = !matches!(r.op, BlockOp::Read { .. });
            let verdict = match &self.who {
                Some(who) => super::resv::check(lu, who, write),
                None => Err(BlockError::Internal),
            };
            if let Err(e) = verdict {
                return self.deliver(r.tag, Err(e));
            }
        }
        let (kind, bytes) = match &r.op {
            BlockOp::Read { len, .. } => (IoKind::Read, *len),
            BlockOp::Write { data, .. } => (IoKind::Write, data.len() as u64),
            _ => (IoKind::Other, 0),
        };
        let op = match r.op {
            BlockOp::Read { offset, len } => {
                let Ok(len) = usize::try_from(len) else {
                    return self.deliver(r.tag, Err(BlockError::Internal));
                };
                // The store's own bytes when it can share them (a RAM store's long read,
                // `Backend::read_shared`): no buffer and no copy here, the socket's copy (or
                // TLS sealing from them into its send buffer) is the only one, as on the
                // iSCSI side (issue 27).
                let shared = self
                    .stores
                    .get(&r.nsid)
                    .and_then(|b| b.read_shared(len, offset));
                if let Some(res) = shared {
                    self.count(r.nsid, kind, bytes, res.is_ok());
                    let res = res.map_err(|e| BlockError::from_io(&e));
                    return self.deliver(r.tag, res);
                }
                IoOp::Read {
                    offset,
                    len,
                    buf: BytesMut::with_capacity(len),
                }
            }
            BlockOp::Write { offset, data, fua } => {
                return self.submit_io(
                    r.nsid,
                    (kind, bytes),
                    IoRequest {
                        tag: r.tag,
                        op: IoOp::Write { offset, data },
                    },
                    fua,
                );
            }
            BlockOp::Flush => IoOp::Flush,
            BlockOp::Discard { offset, len } => {
                if !self.stores.get(&r.nsid).is_some_and(|b| b.supports_unmap()) {
                    // Deallocation is advisory (NVM Command Set 1.0 §3.2.3.2.1): a store that
                    // cannot discard keeps the data.
                    return self.deliver(r.tag, Ok(Bytes::new()));
                }
                IoOp::Discard { offset, len }
            }
            BlockOp::WriteZeroes { offset, len } => IoOp::WriteZeroes { offset, len },
            // Only a namespace that offers reservations (an LU in `lus`) gets these.
            BlockOp::Reservation(_) => return self.deliver(r.tag, Err(BlockError::Internal)),
        };
        self.submit_io(r.nsid, (kind, bytes), IoRequest { tag: r.tag, op }, false);
    }

    /// Hands one request to the namespace's store the way its engine wants.
    fn submit_io(&mut self, nsid: u32, what: (IoKind, u64), req: IoRequest, then_flush: bool) {
        let (kind, bytes) = what;
        let Some(backend) = self.stores.get(&nsid).cloned() else {
            return self.deliver(req.tag, Err(BlockError::Internal));
        };
        let tx = self.io_tx.clone();
        match backend.engine() {
            Engine::Inline => {
                // Memory speed: the store's blocking methods right here, as the SCSI side runs
                // them (`aio::wait` would add a channel and a boxed completer per command).
                // A long write whose data is the whole of its buffer (`Queue::placement`)
                // goes as that buffer, which a RAM store keeps as its chunk: no copy.
                let completion = match req.op {
                    IoOp::Write { offset, data } => match whole_write(data) {
                        Ok(w) => IoCompletion {
                            tag: req.tag,
                            result: backend
                                .write_whole(w, offset)
                                .map(|()| None)
                                .map_err(Into::into),
                        },
                        Err(data) => ipsan_scsi::aio::run_blocking(
                            &*backend,
                            IoRequest {
                                tag: req.tag,
                                op: IoOp::Write { offset, data },
                            },
                        ),
                    },
                    op => ipsan_scsi::aio::run_blocking(&*backend, IoRequest { tag: req.tag, op }),
                };
                self.on_block_done(BlockDone {
                    nsid,
                    kind,
                    bytes,
                    completion,
                    then_flush,
                });
            }
            Engine::Blocking => {
                drop(tokio::task::spawn_blocking(move || {
                    let completion = ipsan_scsi::aio::run_blocking(&*backend, req);
                    let _ = tx.send(BlockDone {
                        nsid,
                        kind,
                        bytes,
                        completion,
                        then_flush,
                    });
                }));
            }
            Engine::Async => backend.submit(
                req,
                Box::new(move |completion| {
                    let _ = tx.send(BlockDone {
                        nsid,
                        kind,
                        bytes,
                        completion,
                        then_flush,
                    });
                }),
            ),
        }
    }

    /// Counts one finished block request of namespace `nsid`.
    fn count(&self, nsid: u32, kind: IoKind, bytes: u64, ok: bool) {
        if let Some(c) = self.counters.get(&nsid) {
            if ok {
                c.record(kind, bytes);
            } else {
                c.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    fn on_block_done(&mut self, d: BlockDone) {
        let tag = d.completion.tag;
        match &d.completion.result {
            Err(_) => self.count(d.nsid, d.kind, d.bytes, false),
            // A FUA write counts once its flush is done too.
            Ok(_) if !d.then_flush => self.count(d.nsid, d.kind, d.bytes, true),
            Ok(_) => {}
        }
        match d.completion.result {
            Ok(_) if d.then_flush => self.submit_io(
                d.nsid,
                (d.kind, d.bytes),
                IoRequest {
                    tag,
                    op: IoOp::Flush,
                },
                false,
            ),
            Ok(buf) => self.deliver(tag, Ok(buf.map(BytesMut::freeze).unwrap_or_default())),
            Err(IoError::Io(e)) => self.deliver(tag, Err(BlockError::from_io(&e))),
            Err(_) => self.deliver(tag, Err(BlockError::Internal)),
        }
    }

    fn deliver(&mut self, tag: u64, result: Result<Bytes, BlockError>) {
        let Some(ctl) = self.ctl.as_mut() else {
            return;
        };
        if let Some(done) = ctl.block_done(tag, result) {
            self.complete(done);
        }
    }

    fn disconnect(&mut self) {
        if let Some(ctl) = self.ctl.take() {
            self.shared.target().disconnect(&ctl);
            self.shared.unregister(ctl.cntlid(), self.id);
            self.shared.wake.notify_one();
        }
    }
}
