//! The crypto worker pool ("pre-processing" in the papers, 000 §3 and 001 §3): N OS threads seal
//! and open chunks while the runtime's network task keeps moving bytes.
//!
//! `seal`/`open` dispatch their jobs *immediately* (so an initiator that calls `seal` for the
//! next commands while earlier ones are on the wire gets them sealed ahead of time) and return a
//! future that completes when every chunk is done. The futures use `tokio::sync::oneshot`, which
//! needs no runtime: any executor can await them. Jobs are served first in, first out, so earlier
//! commands finish first.
//!
//! How a command is cut into jobs adapts to load: a command is split across as many workers as
//! are idle when it arrives (the chunks of one large command run in parallel, so a lone command
//! does not wait for one core), and becomes a single job when every worker is busy (the
//! parallelism then comes from the other commands in flight, and each hand-off between threads
//! that is saved is CPU left for the data).
//!
//! Hand-offs cost what they must and no more (issue 27): a job wakes one worker only if one is
//! asleep (a worker that finishes takes the next job without sleeping), and a command split into
//! parts wakes its waiting task once, when the last part is done, not once per part. Work that
//! has nothing per byte to do (`none` sealed or opened in place) never leaves the caller
//! ([`SealSession::crypto_inline_in_place`]).

use std::collections::VecDeque;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use crate::error::{OpenError, SealError};
use crate::frame::{Binding, COUNTER_LEN};
use crate::session::{Plan, SealSession};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// The parts of a transfer sealed on the workers (data, tags), and its trailer (the counter,
/// then room for the tags).
type SealedParts = (All<(BytesMut, BytesMut)>, BytesMut);

/// The job queue the workers share. A job wakes at most one worker, and only one that is
/// asleep: a worker that finishes a job takes the next without sleeping, and no worker is woken
/// to find nothing to do (issue 27: the pool used to hand one `mpsc` receiver around under a
/// mutex, so every job also woke the next idle worker just to block it again on the channel).
#[derive(Debug, Default)]
struct Queue {
    state: Mutex<QueueState>,
    ready: Condvar,
}

#[derive(Default)]
struct QueueState {
    jobs: VecDeque<Job>,
    /// Workers waiting on `ready`.
    sleeping: usize,
    /// Set when the pool is dropped: workers finish the queue, then exit.
    closed: bool,
}

impl std::fmt::Debug for QueueState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QueueState")
            .field("jobs", &self.jobs.len())
            .field("sleeping", &self.sleeping)
            .field("closed", &self.closed)
            .finish()
    }
}

impl Queue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // Jobs run outside the lock; nothing a holder does can leave the queue half-changed.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `job`; `false` once the pool is closed.
    fn push(&self, job: Job) -> bool {
        let wake = {
            let mut q = self.lock();
            if q.closed {
                return false;
            }
            q.jobs.push_back(job);
            q.sleeping > 0
        };
        if wake {
            self.ready.notify_one();
        }
        true
    }

    /// The next job, waiting for one; `None` once the pool is closed and the queue empty.
    fn pop(&self) -> Option<Job> {
        let mut q = self.lock();
        loop {
            if let Some(job) = q.jobs.pop_front() {
                return Some(job);
            }
            if q.closed {
                return None;
            }
            q.sleeping += 1;
            q = self.ready.wait(q).unwrap_or_else(|p| p.into_inner());
            q.sleeping -= 1;
        }
    }

    fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_all();
    }
}

/// A fixed pool of crypto threads (`--crypto-workers N`). Dropping it lets queued jobs finish,
/// then joins the threads.
#[derive(Debug)]
pub struct CryptoPool {
    queue: Arc<Queue>,
    workers: Vec<JoinHandle<()>>,
    /// Jobs queued or running.
    busy: Arc<AtomicUsize>,
}

/// The results of a command's parts, collected where the workers leave them: the waiting task
/// is woken once, by the part that finishes last, instead of once per part.
struct Join<T> {
    left: AtomicUsize,
    slots: Mutex<Vec<Option<T>>>,
    done: Mutex<Option<oneshot::Sender<()>>>,
}

/// One part's place in a [`Join`]. Dropped with or without a result (a job that panicked, or
/// was never run because the pool closed), it counts the part as finished, so the waiting
/// task always wakes; a part without a result then fails the command with `PoolClosed`.
struct Slot<T> {
    join: Arc<Join<T>>,
    index: usize,
}

impl<T> Slot<T> {
    fn put(self, value: T) {
        if let Some(s) = self
            .join
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_mut(self.index)
        {
            *s = Some(value);
        }
    }
}

impl<T> Drop for Slot<T> {
    fn drop(&mut self) {
        if self.join.left.fetch_sub(1, Ordering::AcqRel) == 1 {
            let done = self
                .join
                .done
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take();
            if let Some(tx) = done {
                let _ = tx.send(());
            }
        }
    }
}

/// `parts` slots, and what waits for all of them.
fn join<T>(parts: usize) -> (Vec<Slot<T>>, All<T>) {
    let (tx, rx) = oneshot::channel();
    // No part: nothing will count down to the wake-up, so it is due now.
    let tx = if parts == 0 {
        let _ = tx.send(());
        None
    } else {
        Some(tx)
    };
    let join = Arc::new(Join {
        left: AtomicUsize::new(parts),
        slots: Mutex::new((0..parts).map(|_| None).collect()),
        done: Mutex::new(tx),
    });
    let slots = (0..parts)
        .map(|index| Slot {
            join: Arc::clone(&join),
            index,
        })
        .collect();
    (slots, All { rx, join })
}

/// Waits for every part of a [`join`].
struct All<T> {
    rx: oneshot::Receiver<()>,
    join: Arc<Join<T>>,
}

impl<T> All<T> {
    /// The parts' results in order; `None` if any part ended without one.
    async fn wait(self) -> Option<Vec<T>> {
        self.rx.await.ok()?;
        let slots = std::mem::take(&mut *self.join.slots.lock().unwrap_or_else(|p| p.into_inner()));
        slots.into_iter().collect()
    }
}

/// Chunk `first..last` of a command, one job's share.
#[derive(Clone, Copy, Debug)]
struct Part {
    first: u32,
    last: u32,
}

impl CryptoPool {
    /// Starts `workers` threads (at least 1).
    pub fn new(workers: usize) -> std::io::Result<CryptoPool> {
        let queue = Arc::new(Queue::default());
        let busy = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for i in 0..workers.max(1) {
            let q = Arc::clone(&queue);
            let busy = Arc::clone(&busy);
            let spawned = std::thread::Builder::new()
                .name(format!("seal-crypto-{i}"))
                .spawn(move || {
                    while let Some(job) = q.pop() {
                        // A panicking job drops its result slot (its caller sees
                        // `PoolClosed`); the worker itself stays available.
                        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                        busy.fetch_sub(1, Ordering::Relaxed);
                    }
                });
            match spawned {
                Ok(h) => handles.push(h),
                Err(e) => {
                    // The threads already started must not wait forever for jobs.
                    queue.close();
                    for h in handles {
                        let _ = h.join();
                    }
                    return Err(e);
                }
            }
        }
        Ok(CryptoPool {
            queue,
            workers: handles,
            busy,
        })
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    fn submit(&self, job: Job) -> bool {
        self.busy.fetch_add(1, Ordering::Relaxed);
        if self.queue.push(job) {
            true
        } else {
            self.busy.fetch_sub(1, Ordering::Relaxed);
            false
        }
    }

    /// Cuts `count` chunks into one part per idle worker (at least one part).
    fn parts(&self, count: u32) -> impl Iterator<Item = Part> {
        let idle = self
            .workers()
            .saturating_sub(self.busy.load(Ordering::Relaxed))
            .max(1);
        let n = u32::try_from(idle).unwrap_or(u32::MAX).min(count).max(1);
        let per = count.div_ceil(n).max(1);
        (0..n)
            .map(move |p| Part {
                first: p * per,
                last: ((p + 1) * per).min(count),
            })
            .filter(|p| p.first < p.last)
    }

    /// Seals a command's data on the pool, in place. Counters are reserved now, in call order;
    /// the jobs are queued now; the returned future yields the sealed transfer (see
    /// [`SealSession::seal`]). Give `buf` capacity for the trailer
    /// ([`SealSession::sealed_len`]) to avoid a reallocation.
    pub fn seal(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        mut buf: BytesMut,
    ) -> impl Future<Output = Result<Bytes, SealError>> + Send + 'static {
        // Compressed (docs/seal.md §4b): the sealed form is a new buffer whose length only
        // the compression tells, built by one job from the plaintext.
        let compressed = (session.compression().is_on() && !session.crypto_inline(buf.len()))
            .then(|| self.seal_copy(session, binding, std::mem::take(&mut buf).freeze()));
        // A small command, or one whose cipher does nothing per byte in place (`none`), is
        // sealed here and now (`SealSession::crypto_inline_in_place`).
        let (done, prepared) = if compressed.is_some() {
            (None, Ok(None))
        } else if session.crypto_inline_in_place(buf.len()) {
            (Some(session.seal(&binding, buf)), Ok(None))
        } else {
            (None, self.seal_in_place(session, binding, buf))
        };
        async move {
            if let Some(compressed) = compressed {
                return compressed.await;
            }
            if let Some(done) = done {
                return done;
            }
            let Some((all, trailer)) = prepared? else {
                return Ok(Bytes::new());
            };
            Ok(gather(all, trailer).await?.freeze())
        }
    }

    fn seal_in_place(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        mut buf: BytesMut,
    ) -> Result<Option<SealedParts>, SealError> {
        let n = buf.len();
        let Some(plan) = session.plan(n)? else {
            return Ok(None);
        };
        let t = session.cipher().tag_len();
        let chunk = session.chunk_size() as usize;
        buf.resize(n + COUNTER_LEN + plan.count as usize * t, 0);
        let mut trailer = buf.split_off(n);
        trailer[..COUNTER_LEN].copy_from_slice(&plan.base.to_be_bytes());
        let mut tags = trailer.split_off(COUNTER_LEN);
        let parts: Vec<Part> = self.parts(plan.count).collect();
        let (slots, all) = join(parts.len());
        for (part, slot) in parts.into_iter().zip(slots) {
            let end = (part.last as usize * chunk).min(n);
            let mut data = buf.split_to(end - part.first as usize * chunk);
            let mut tag = tags.split_to((part.last - part.first) as usize * t);
            let s = Arc::clone(session);
            let sent = self.submit(Box::new(move || {
                for (k, (d, tg)) in data
                    .chunks_mut(chunk)
                    .zip(tag.chunks_exact_mut(t))
                    .enumerate()
                {
                    s.seal_chunk(&binding, plan, part.first + k as u32, d, tg);
                }
                slot.put((data, tag));
            }));
            if !sent {
                return Err(SealError::PoolClosed);
            }
        }
        Ok(Some((all, trailer)))
    }

    /// Seals a copy of `plaintext` on the pool (see [`SealSession::seal_copy`]): the caller
    /// keeps its data and its thread does no copying — the workers encrypt straight from the
    /// plaintext into the sealed buffer (out of place), chunk by chunk, split across the idle
    /// workers, or as one job that also freezes the buffer when they are busy (or the command
    /// is one chunk: no splitting and reassembly for small commands). Large transfers are sealed into a buffer the
    /// session has used before (no page faults, no zero-fill). Counters are reserved now, in
    /// call order.
    pub fn seal_copy(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        plaintext: Bytes,
    ) -> impl Future<Output = Result<Bytes, SealError>> + Send + 'static {
        enum Way {
            /// Sealed on the caller's thread (a small command, [`crate::Cipher::inline_max`]).
            Done(Bytes),
            /// One job seals the whole command into its buffer (workers busy, or one chunk).
            Whole(oneshot::Receiver<Bytes>),
            /// Parts on idle workers, reassembled here.
            Split(All<(BytesMut, BytesMut)>, BytesMut),
        }
        let prepared = (|| {
            let n = plaintext.len();
            if session.crypto_inline(n) {
                return Ok(Some(Way::Done(session.seal_copy(&binding, &plaintext)?)));
            }
            let count =
                u32::try_from(session.framing().chunks(n)).map_err(|_| SealError::TooLarge(n))?;
            // A compressed command is one job: its chunks' places are known only once each
            // is compressed.
            if count > 1 && !session.compression().is_on() && self.parts(count).count() > 1 {
                return Ok(self
                    .seal_copy_jobs(session, binding, &plaintext)?
                    .map(|(all, trailer)| Way::Split(all, trailer)));
            }
            let Some(plan) = session.plan(n)? else {
                return Ok(None);
            };
            let (tx, rx) = oneshot::channel();
            let s = Arc::clone(session);
            let sent = self.submit(Box::new(move || {
                let _ = tx.send(s.seal_copy_planned(&binding, plan, &plaintext));
            }));
            if !sent {
                return Err(SealError::PoolClosed);
            }
            Ok(Some(Way::Whole(rx)))
        })();
        let session = Arc::clone(session);
        async move {
            let (all, trailer) = match prepared? {
                None => return Ok(Bytes::new()),
                Some(Way::Done(sealed)) => return Ok(sealed),
                Some(Way::Whole(rx)) => return rx.await.map_err(|_| SealError::PoolClosed),
                Some(Way::Split(all, trailer)) => (all, trailer),
            };
            Ok(session.freeze_sealed(gather(all, trailer).await?))
        }
    }

    fn seal_copy_jobs(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        plaintext: &Bytes,
    ) -> Result<Option<SealedParts>, SealError> {
        let n = plaintext.len();
        let Some(plan) = session.plan(n)? else {
            return Ok(None);
        };
        let t = session.cipher().tag_len();
        let chunk = session.chunk_size() as usize;
        let mut buf = session.take_buffer(n + COUNTER_LEN + plan.count as usize * t);
        let mut trailer = buf.split_off(n);
        trailer[..COUNTER_LEN].copy_from_slice(&plan.base.to_be_bytes());
        let mut tags = trailer.split_off(COUNTER_LEN);
        let parts: Vec<Part> = self.parts(plan.count).collect();
        let (slots, all) = join(parts.len());
        for (part, slot) in parts.into_iter().zip(slots) {
            let start = part.first as usize * chunk;
            let end = (part.last as usize * chunk).min(n);
            let src = plaintext.slice(start..end);
            let mut data = buf.split_to(end - start);
            let mut tag = tags.split_to((part.last - part.first) as usize * t);
            let s = Arc::clone(session);
            let sent = self.submit(Box::new(move || {
                s.seal_chunks_into(&binding, plan, part.first, &src, &mut data, &mut tag);
                slot.put((data, tag));
            }));
            if !sent {
                return Err(SealError::PoolClosed);
            }
        }
        Ok(Some((all, trailer)))
    }

    /// Opens a sealed transfer on the pool, in place; the future yields the plaintext (see
    /// [`SealSession::open`]). The anti-replay window is checked now and updated once every
    /// chunk has verified.
    pub fn open(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        mut buf: BytesMut,
    ) -> impl Future<Output = Result<Bytes, OpenError>> + Send + 'static {
        let done = session
            .crypto_inline_in_place_sealed(buf.len())
            .then(|| session.open(&binding, std::mem::take(&mut buf)));
        // Compressed (docs/seal.md §4b): one job opens and decompresses the whole transfer.
        let compressed = (done.is_none() && session.compression().is_on()).then(|| {
            let (tx, rx) = oneshot::channel();
            let s = Arc::clone(session);
            let buf = std::mem::take(&mut buf);
            self.submit(Box::new(move || {
                let _ = tx.send(s.open(&binding, buf));
            }))
            .then_some(rx)
        });
        let prepared = (|| {
            if done.is_some() || compressed.is_some() {
                return Ok(None);
            }
            let Some(plan) = session.open_plan(&binding, &buf)? else {
                return Ok(None);
            };
            let n = plan.plain_len as usize;
            let t = session.cipher().tag_len();
            let chunk = session.chunk_size() as usize;
            let mut trailer = buf.split_off(n);
            let mut tags = trailer.split_off(COUNTER_LEN).freeze();
            let parts: Vec<Part> = self.parts(plan.count).collect();
            let (slots, all) = join(parts.len());
            for (part, slot) in parts.into_iter().zip(slots) {
                let end = (part.last as usize * chunk).min(n);
                let mut data = buf.split_to(end - part.first as usize * chunk);
                let tag = tags.split_to((part.last - part.first) as usize * t);
                let s = Arc::clone(session);
                let sent = self.submit(Box::new(move || {
                    let r = open_part(&s, &binding, plan, part, chunk, t, &mut data, &tag);
                    // Before the part is handed back: the last part wakes the waiting task,
                    // whose buffer is then the only holder of its memory (no copy when the
                    // caller takes it as its own, `BytesMut::from`; issue 27).
                    drop(tag);
                    slot.put(r.map(|()| data));
                }));
                if !sent {
                    return Err(OpenError::PoolClosed);
                }
            }
            Ok(Some((plan, all)))
        })();
        let session = Arc::clone(session);
        async move {
            if let Some(done) = done {
                return done;
            }
            if let Some(compressed) = compressed {
                let rx = compressed.ok_or(OpenError::PoolClosed)?;
                return rx.await.map_err(|_| OpenError::PoolClosed)?;
            }
            let Some((plan, all)) = prepared? else {
                return Ok(Bytes::new());
            };
            let parts = all.wait().await.ok_or(OpenError::PoolClosed)?;
            let mut data = BytesMut::new();
            let mut failed = None;
            for part in parts {
                match part {
                    Ok(d) if failed.is_none() => data.unsplit(d),
                    Ok(_) => {}
                    // Report the first failure once; every part has ended (none is left
                    // half-used).
                    Err(e) => {
                        if failed.is_none() {
                            failed = Some(e);
                        }
                    }
                }
            }
            if let Some(e) = failed {
                session.report(&binding, &e);
                return Err(e);
            }
            session.finish_open(&binding, plan)?;
            Ok(data.freeze())
        }
    }
}

impl CryptoPool {
    /// [`CryptoPool::open`] for a sealed transfer as received, which may be shared (immediate
    /// data is a slice of the receive buffer the next PDUs go into): one its holder has to
    /// itself is opened in place; a shared one small enough to open on the caller's thread
    /// ([`SealSession::crypto_inline_sealed`]) is opened out of place into a reused buffer
    /// ([`SealSession::open_copy`]), with no copy of the ciphertext first; a larger shared one
    /// is copied and opened in place on the workers, in parts.
    pub fn open_shared(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        sealed: Bytes,
    ) -> impl Future<Output = Result<Bytes, OpenError>> + Send + 'static {
        // Ok: a buffer to open in place on the workers; Err: opened here already.
        let opening = match sealed.try_into_mut() {
            Ok(buf) => Ok(buf),
            Err(shared) if session.crypto_inline_sealed(shared.len()) => {
                Err(session.open_copy(&binding, &shared))
            }
            Err(shared) => Ok(BytesMut::from(&shared[..])),
        }
        .map(|buf| self.open(session, binding, buf));
        async move {
            match opening {
                Ok(opening) => opening.await,
                Err(opened) => opened,
            }
        }
    }
}

/// Opens the chunks of one part; stops at the first that fails.
#[allow(clippy::too_many_arguments)]
fn open_part(
    s: &SealSession,
    binding: &Binding,
    plan: Plan,
    part: Part,
    chunk: usize,
    t: usize,
    data: &mut [u8],
    tags: &[u8],
) -> Result<(), OpenError> {
    for (k, (d, tg)) in data.chunks_mut(chunk).zip(tags.chunks_exact(t)).enumerate() {
        s.open_chunk(binding, plan, part.first + k as u32, d, tg)?;
    }
    Ok(())
}

impl Drop for CryptoPool {
    fn drop(&mut self) {
        self.queue.close();
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Reassembles a transfer sealed in parts: the parts' data in order, then the trailer, then the
/// parts' tags. The parts are contiguous pieces of one buffer, so each `unsplit` is O(1).
async fn gather(all: All<(BytesMut, BytesMut)>, trailer: BytesMut) -> Result<BytesMut, SealError> {
    let parts = all.wait().await.ok_or(SealError::PoolClosed)?;
    let mut data = BytesMut::new();
    let mut tags = BytesMut::new();
    for (d, t) in parts {
        data.unsplit(d);
        tags.unsplit(t);
    }
    data.unsplit(trailer);
    data.unsplit(tags);
    Ok(data)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn now<F: Future>(f: F) -> Option<F::Output> {
        use std::task::{Context, Poll, Waker};
        match std::pin::pin!(f).poll(&mut Context::from_waker(Waker::noop())) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        }
    }

    #[test]
    fn a_join_yields_every_part_in_order_once_the_last_one_is_in() {
        let (mut slots, all) = join::<u32>(3);
        let last = slots.pop().unwrap();
        // Finished out of order.
        slots.pop().unwrap().put(1);
        last.put(2);
        let (tx, rx) = std::sync::mpsc::channel();
        let first = slots.pop().unwrap();
        std::thread::spawn(move || {
            first.put(0);
            tx.send(()).unwrap();
        });
        rx.recv().unwrap();
        assert_eq!(now(all.wait()), Some(Some(vec![0, 1, 2])));
    }

    #[test]
    fn rejects_a_join_whose_part_ended_without_a_result_instead_of_waiting_forever() {
        // A job that panicked or was never run drops its slot: the command fails
        // (`PoolClosed` for the caller) and the waiting task is still woken.
        let (mut slots, all) = join::<u32>(2);
        slots.pop().unwrap().put(1);
        drop(slots);
        assert_eq!(now(all.wait()), Some(None));
    }

    #[test]
    fn serves_jobs_first_in_first_out_and_refuses_new_ones_once_closed() {
        let q = Queue::default();
        let order = Arc::new(Mutex::new(Vec::new()));
        for i in 0..3 {
            let order = Arc::clone(&order);
            assert!(q.push(Box::new(move || order.lock().unwrap().push(i))));
        }
        // Nobody sleeps: each job is taken without waiting.
        assert_eq!(q.lock().sleeping, 0);
        q.close();
        assert!(!q.push(Box::new(|| {})), "closed: refused");
        // What was queued before the close still runs.
        while let Some(job) = q.pop() {
            job();
        }
        assert_eq!(*order.lock().unwrap(), vec![0, 1, 2]);
    }

    #[test]
    fn dropping_the_pool_runs_the_queued_jobs_first() {
        let pool = CryptoPool::new(1).unwrap();
        let ran = Arc::new(AtomicUsize::new(0));
        for _ in 0..50 {
            let ran = Arc::clone(&ran);
            assert!(pool.submit(Box::new(move || {
                ran.fetch_add(1, Ordering::Relaxed);
            })));
        }
        drop(pool);
        assert_eq!(ran.load(Ordering::Relaxed), 50);
    }
}
