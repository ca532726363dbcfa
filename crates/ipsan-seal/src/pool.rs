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

use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use crate::error::{OpenError, SealError};
use crate::frame::{Binding, COUNTER_LEN};
use crate::session::{Plan, SealSession};

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed pool of crypto threads (`--crypto-workers N`). Dropping it lets queued jobs finish,
/// then joins the threads.
#[derive(Debug)]
pub struct CryptoPool {
    tx: Option<mpsc::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
    /// Jobs queued or running.
    busy: Arc<AtomicUsize>,
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
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let busy = Arc::new(AtomicUsize::new(0));
        let mut handles = Vec::new();
        for i in 0..workers.max(1) {
            let rx = Arc::clone(&rx);
            let busy = Arc::clone(&busy);
            let h = std::thread::Builder::new()
                .name(format!("seal-crypto-{i}"))
                .spawn(move || loop {
                    // Hold the lock only while taking one job.
                    let job = {
                        let guard = rx.lock().unwrap_or_else(|p| p.into_inner());
                        guard.recv()
                    };
                    match job {
                        // A panicking job drops its result sender (its caller sees
                        // `PoolClosed`); the worker itself stays available.
                        Ok(job) => {
                            let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                            busy.fetch_sub(1, Ordering::Relaxed);
                        }
                        Err(_) => return, // pool dropped
                    }
                })?;
            handles.push(h);
        }
        Ok(CryptoPool {
            tx: Some(tx),
            workers: handles,
            busy,
        })
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    fn submit(&self, job: Job) -> bool {
        let Some(tx) = self.tx.as_ref() else {
            return false;
        };
        self.busy.fetch_add(1, Ordering::Relaxed);
        if tx.send(job).is_ok() {
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
        // A small command is sealed here and now (`SealSession::crypto_inline`).
        let (done, prepared) = if compressed.is_some() {
            (None, Ok(None))
        } else if session.crypto_inline(buf.len()) {
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
            let Some((pending, trailer)) = prepared? else {
                return Ok(Bytes::new());
            };
            Ok(gather(pending, trailer).await?.freeze())
        }
    }

    #[allow(clippy::type_complexity)]
    fn seal_in_place(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        mut buf: BytesMut,
    ) -> Result<Option<(Vec<oneshot::Receiver<(BytesMut, BytesMut)>>, BytesMut)>, SealError> {
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
        let mut pending = Vec::new();
        for part in self.parts(plan.count) {
            let end = (part.last as usize * chunk).min(n);
            let mut data = buf.split_to(end - part.first as usize * chunk);
            let mut tag = tags.split_to((part.last - part.first) as usize * t);
            let (tx, rx) = oneshot::channel();
            let s = Arc::clone(session);
            let sent = self.submit(Box::new(move || {
                for (k, (d, tg)) in data
                    .chunks_mut(chunk)
                    .zip(tag.chunks_exact_mut(t))
                    .enumerate()
                {
                    s.seal_chunk(&binding, plan, part.first + k as u32, d, tg);
                }
                let _ = tx.send((data, tag));
            }));
            if !sent {
                return Err(SealError::PoolClosed);
            }
            pending.push(rx);
        }
        Ok(Some((pending, trailer)))
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
            Split(Vec<oneshot::Receiver<(BytesMut, BytesMut)>>, BytesMut),
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
                    .map(|(pending, trailer)| Way::Split(pending, trailer)));
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
            let (pending, trailer) = match prepared? {
                None => return Ok(Bytes::new()),
                Some(Way::Done(sealed)) => return Ok(sealed),
                Some(Way::Whole(rx)) => return rx.await.map_err(|_| SealError::PoolClosed),
                Some(Way::Split(pending, trailer)) => (pending, trailer),
            };
            Ok(session.freeze_sealed(gather(pending, trailer).await?))
        }
    }

    #[allow(clippy::type_complexity)]
    fn seal_copy_jobs(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        plaintext: &Bytes,
    ) -> Result<Option<(Vec<oneshot::Receiver<(BytesMut, BytesMut)>>, BytesMut)>, SealError> {
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
        let mut pending = Vec::new();
        for part in self.parts(plan.count) {
            let start = part.first as usize * chunk;
            let end = (part.last as usize * chunk).min(n);
            let src = plaintext.slice(start..end);
            let mut data = buf.split_to(end - start);
            let mut tag = tags.split_to((part.last - part.first) as usize * t);
            let (tx, rx) = oneshot::channel();
            let s = Arc::clone(session);
            let sent = self.submit(Box::new(move || {
                s.seal_chunks_into(&binding, plan, part.first, &src, &mut data, &mut tag);
                let _ = tx.send((data, tag));
            }));
            if !sent {
                return Err(SealError::PoolClosed);
            }
            pending.push(rx);
        }
        Ok(Some((pending, trailer)))
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
            .crypto_inline_sealed(buf.len())
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
            let mut pending = Vec::new();
            for part in self.parts(plan.count) {
                let end = (part.last as usize * chunk).min(n);
                let mut data = buf.split_to(end - part.first as usize * chunk);
                let tag = tags.split_to((part.last - part.first) as usize * t);
                let (tx, rx) = oneshot::channel();
                let s = Arc::clone(session);
                let sent = self.submit(Box::new(move || {
                    let r = open_part(&s, &binding, plan, part, chunk, t, &mut data, &tag);
                    let _ = tx.send(r.map(|()| data));
                }));
                if !sent {
                    return Err(OpenError::PoolClosed);
                }
                pending.push(rx);
            }
            Ok(Some((plan, pending)))
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
            let Some((plan, pending)) = prepared? else {
                return Ok(Bytes::new());
            };
            let mut data = BytesMut::new();
            let mut failed = None;
            for rx in pending {
                match rx.await.map_err(|_| OpenError::PoolClosed)? {
                    Ok(d) if failed.is_none() => data.unsplit(d),
                    Ok(_) => {}
                    Err(e) => {
                        // Keep draining so no worker result is left half-used; report once.
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
        self.tx = None;
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}

/// Reassembles a transfer sealed in parts: the parts' data in order, then the trailer, then the
/// parts' tags. The parts are contiguous pieces of one buffer, so each `unsplit` is O(1).
async fn gather(
    pending: Vec<oneshot::Receiver<(BytesMut, BytesMut)>>,
    trailer: BytesMut,
) -> Result<BytesMut, SealError> {
    let mut data = BytesMut::new();
    let mut tags = BytesMut::new();
    for rx in pending {
        let (d, t) = rx.await.map_err(|_| SealError::PoolClosed)?;
        data.unsplit(d);
        tags.unsplit(t);
    }
    data.unsplit(trailer);
    data.unsplit(tags);
    Ok(data)
}
