//! The crypto worker pool ("pre-processing" in the papers, 000 §3 and 001 §3): N OS threads seal
//! and open chunks while the runtime's network task keeps moving bytes.
//!
//! `seal`/`open` dispatch one job per chunk *immediately* (so an initiator that calls `seal` for
//! the next commands while earlier ones are on the wire gets them sealed ahead of time) and
//! return a future that completes when every chunk is done. The futures use
//! `tokio::sync::oneshot`, which needs no runtime: any executor can await them. The chunks of one
//! large command run in parallel across the workers; jobs are served first in, first out, so
//! earlier commands finish first.

use std::future::Future;
use std::sync::mpsc;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use bytes::{Bytes, BytesMut};
use tokio::sync::oneshot;

use crate::error::{OpenError, SealError};
use crate::frame::{Binding, COUNTER_LEN};
use crate::session::SealSession;

type Job = Box<dyn FnOnce() + Send + 'static>;

/// A fixed pool of crypto threads (`--crypto-workers N`). Dropping it lets queued jobs finish,
/// then joins the threads.
#[derive(Debug)]
pub struct CryptoPool {
    tx: Option<mpsc::Sender<Job>>,
    workers: Vec<JoinHandle<()>>,
}

impl CryptoPool {
    /// Starts `workers` threads (at least 1).
    pub fn new(workers: usize) -> std::io::Result<CryptoPool> {
        let (tx, rx) = mpsc::channel::<Job>();
        let rx = Arc::new(Mutex::new(rx));
        let mut handles = Vec::new();
        for i in 0..workers.max(1) {
            let rx = Arc::clone(&rx);
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
                        }
                        Err(_) => return, // pool dropped
                    }
                })?;
            handles.push(h);
        }
        Ok(CryptoPool {
            tx: Some(tx),
            workers: handles,
        })
    }

    /// Number of worker threads.
    pub fn workers(&self) -> usize {
        self.workers.len()
    }

    fn submit(&self, job: Job) -> bool {
        self.tx.as_ref().is_some_and(|tx| tx.send(job).is_ok())
    }

    /// Seals a command's data on the pool. Counters are reserved now, in call order; the chunks
    /// are queued now; the returned future yields the sealed transfer (see
    /// [`SealSession::seal`]).
    pub fn seal(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        mut buf: BytesMut,
    ) -> impl Future<Output = Result<Bytes, SealError>> + Send + 'static {
        let prepared = (|| {
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
            let mut pending = Vec::with_capacity(plan.count as usize);
            for i in 0..plan.count {
                let mut data = buf.split_to(chunk.min(buf.len()));
                let mut tag = tags.split_to(t);
                let (tx, rx) = oneshot::channel();
                let s = Arc::clone(session);
                let sent = self.submit(Box::new(move || {
                    s.seal_chunk(&binding, plan, i, &mut data, &mut tag);
                    let _ = tx.send((data, tag));
                }));
                if !sent {
                    return Err(SealError::PoolClosed);
                }
                pending.push(rx);
            }
            Ok(Some((pending, trailer)))
        })();
        async move {
            let Some((pending, trailer)) = prepared? else {
                return Ok(Bytes::new());
            };
            let mut data = BytesMut::new();
            let mut tags = BytesMut::new();
            for rx in pending {
                let (d, t) = rx.await.map_err(|_| SealError::PoolClosed)?;
                data.unsplit(d);
                tags.unsplit(t);
            }
            data.unsplit(trailer);
            data.unsplit(tags);
            Ok(data.freeze())
        }
    }

    /// Opens a sealed transfer on the pool; the future yields the plaintext (see
    /// [`SealSession::open`]). The anti-replay window is checked now and updated once every
    /// chunk has verified.
    pub fn open(
        &self,
        session: &Arc<SealSession>,
        binding: Binding,
        mut buf: BytesMut,
    ) -> impl Future<Output = Result<Bytes, OpenError>> + Send + 'static {
        let prepared = (|| {
            let Some(plan) = session.open_plan(&binding, &buf)? else {
                return Ok(None);
            };
            let n = plan.plain_len as usize;
            let t = session.cipher().tag_len();
            let chunk = session.chunk_size() as usize;
            let mut trailer = buf.split_off(n);
            let mut tags = trailer.split_off(COUNTER_LEN).freeze();
            let mut pending = Vec::with_capacity(plan.count as usize);
            for i in 0..plan.count {
                let mut data = buf.split_to(chunk.min(buf.len()));
                let tag = tags.split_to(t);
                let (tx, rx) = oneshot::channel();
                let s = Arc::clone(session);
                let sent = self.submit(Box::new(move || {
                    let r = s.open_chunk(&binding, plan, i, &mut data, &tag);
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

impl Drop for CryptoPool {
    fn drop(&mut self) {
        self.tx = None;
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
    }
}
