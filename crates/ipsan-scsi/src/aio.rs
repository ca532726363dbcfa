//! The submit/complete form of the backend interface, after cloud-hypervisor's `block`
//! crate: a request carries a tag and owns its buffers until the backend completes it, so a
//! remote store (RBD through librbd's `rbd_aio_*` callbacks, later the gateway's remote iSCSI
//! LUN) keeps any number of commands in flight without holding a thread for each.
//!
//! Every backend picks an [`Engine`]: `mem`/`null` run inline on the caller's thread, `file`
//! keeps the blocking pool (pread/pwrite), `rbd` is [`Engine::Async`]. The completion is a
//! callback ([`Completer`]) called exactly once from whatever thread the backend completes on
//! (librbd's finisher thread for RBD); [`submit`] wraps it into a runtime-agnostic future, so
//! this crate needs no async runtime.

use std::fmt;
use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};

use crate::backend::Backend;

/// How a backend wants its commands run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Engine {
    /// Memory speed: run on the caller's thread (a hop to a pool costs more than the copy).
    Inline,
    /// Blocking system calls: run on a blocking pool, one thread per command in flight.
    Blocking,
    /// Queued remote I/O: [`Backend::submit`] returns at once and completes later.
    Async,
}

/// One block operation, addressed in bytes. Buffers are owned by the request: the backend
/// keeps them (and their addresses stable) until it completes.
#[derive(Debug)]
pub enum IoOp {
    /// Append `len` bytes read from `offset` to `buf`; completes with the buffer.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes to read.
        len: usize,
        /// Where they go (appended; `buf` may already hold a header).
        buf: BytesMut,
    },
    /// Write `data` at `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Make every completed write stable.
    Flush,
    /// Deallocate a range; reads of it return zeros afterwards (LBPRZ).
    Discard {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Write zeros over a range.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Atomically: if the range holds `compare`, write `write` over it (SBC-4 §5.3).
    CompareAndWrite {
        /// Byte offset.
        offset: u64,
        /// Expected contents.
        compare: Bytes,
        /// New contents (same length).
        write: Bytes,
    },
}

impl IoOp {
    /// Short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            IoOp::Read { .. } => "read",
            IoOp::Write { .. } => "write",
            IoOp::Flush => "flush",
            IoOp::Discard { .. } => "discard",
            IoOp::WriteZeroes { .. } => "write_zeroes",
            IoOp::CompareAndWrite { .. } => "compare_and_write",
        }
    }
}

/// A tagged request. The tag is the submitter's (the iSCSI layer uses the task tag), handed
/// back in the completion so a completion queue can match requests without a lookup.
#[derive(Debug)]
pub struct IoRequest {
    /// The submitter's tag.
    pub tag: u64,
    /// What to do.
    pub op: IoOp,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The store failed (errno or kind says how; see `Sense::from_*_error`).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// COMPARE AND WRITE found different data: `offset` is the first differing byte,
    /// counted from the start of the request.
    #[error("miscompare at byte {offset}")]
    Miscompare {
        /// First differing byte.
        offset: u64,
    },
}

/// The outcome of one request.
#[derive(Debug)]
pub struct IoCompletion {
    /// The request's tag.
    pub tag: u64,
    /// The read buffer for [`IoOp::Read`], `None` for the others; or the error.
    pub result: Result<Option<BytesMut>, IoError>,
}

/// Called exactly once with the completion, from any thread (possibly before `submit`
/// returns). It must not block: it runs on the backend's completion thread. Nor may it own
/// the last reference to the backend: dropping an RBD backend closes the image, which from
/// librbd's completion thread waits for itself for good (rbd.rs, `Events`).
pub type Completer = Box<dyn FnOnce(IoCompletion) + Send>;

/// Runs `req` with the blocking methods of `b` (what [`Backend::submit`] does by default).
pub fn run_blocking<B: Backend + ?Sized>(b: &B, req: IoRequest) -> IoCompletion {
    let tag = req.tag;
    let result = match req.op {
        IoOp::Read {
            offset,
            len,
            mut buf,
        } => b
            .read_append(&mut buf, len, offset)
            .map(|()| Some(buf))
            .map_err(IoError::from),
        IoOp::Write { offset, data } => {
            b.write_at(&data, offset).map(|()| None).map_err(Into::into)
        }
        IoOp::Flush => b.flush().map(|()| None).map_err(Into::into),
        IoOp::Discard { offset, len } => b.unmap(offset, len).map(|()| None).map_err(Into::into),
        IoOp::WriteZeroes { offset, len } => b
            .write_zeroes(offset, len)
            .map(|()| None)
            .map_err(Into::into),
        IoOp::CompareAndWrite {
            offset,
            compare,
            write,
        } => {
            // Atomic only against writers that serialize with the caller (the LU's I/O lock);
            // an async backend does this in the store itself.
            let mut cur = vec![0u8; compare.len()];
            match b.read_at(&mut cur, offset) {
                Err(e) => Err(e.into()),
                Ok(()) => match cur.iter().zip(compare.iter()).position(|(x, y)| x != y) {
                    Some(o) => Err(IoError::Miscompare { offset: o as u64 }),
                    None => b
                        .write_at(&write, offset)
                        .map(|()| None)
                        .map_err(Into::into),
                },
            }
        }
    };
    IoCompletion { tag, result }
}

/// Submits `req` to `backend` and returns a future of its completion. The future needs no
/// particular runtime: the completer stores the result and wakes whoever polled last.
pub fn submit(backend: &dyn Backend, req: IoRequest) -> IoFuture {
    let slot = Arc::new(Mutex::new(Slot::default()));
    let s = slot.clone();
    backend.submit(
        req,
        Box::new(move |c| {
            let waker = {
                let mut g = s.lock().unwrap_or_else(|p| p.into_inner());
                g.done = Some(c);
                g.waker.take()
            };
            if let Some(w) = waker {
                w.wake();
            }
        }),
    );
    IoFuture { slot }
}

#[derive(Default)]
struct Slot {
    done: Option<IoCompletion>,
    waker: Option<Waker>,
}

/// The completion of one submitted request (see [`submit`]).
pub struct IoFuture {
    slot: Arc<Mutex<Slot>>,
}

impl fmt::Debug for IoFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IoFuture").finish_non_exhaustive()
    }
}

impl Future for IoFuture {
    type Output = IoCompletion;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<IoCompletion> {
        let mut g = self.slot.lock().unwrap_or_else(|p| p.into_inner());
        match g.done.take() {
            Some(c) => Poll::Ready(c),
            None => {
                g.waker = Some(cx.waker().clone());
                Poll::Pending
            }
        }
    }
}

/// Runs `req` to completion on the current thread, parking until the backend's completer
/// fires: the blocking methods of an async backend are built on this.
pub fn wait(backend: &dyn Backend, req: IoRequest) -> IoCompletion {
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let tag = req.tag;
    backend.submit(
        req,
        Box::new(move |c| {
            let _ = tx.send(c);
        }),
    );
    rx.recv().unwrap_or(IoCompletion {
        tag,
        result: Err(IoError::Io(io::Error::other(
            "backend dropped a request without completing it",
        ))),
    })
}

/// Drives a future to completion on the current thread (tests and blocking callers).
pub fn block_on<F: Future>(f: F) -> F::Output {
    struct Unpark(std::thread::Thread);
    impl std::task::Wake for Unpark {
        fn wake(self: Arc<Self>) {
            self.0.unpark();
        }
    }
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    let mut f = std::pin::pin!(f);
    loop {
        if let Poll::Ready(v) = f.as_mut().poll(&mut cx) {
            return v;
        }
        std::thread::park();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::MemBackend;

    #[test]
    fn default_submit_completes_reads_writes_and_compare_and_write() {
        let m = MemBackend::new(1 << 20);
        let w = block_on(submit(
            &m,
            IoRequest {
                tag: 7,
                op: IoOp::Write {
                    offset: 4096,
                    data: Bytes::from(vec![0xAB; 512]),
                },
            },
        ));
        assert_eq!(w.tag, 7);
        assert!(w.result.unwrap().is_none());
        let r = block_on(submit(
            &m,
            IoRequest {
                tag: 8,
                op: IoOp::Read {
                    offset: 4096,
                    len: 512,
                    buf: BytesMut::from(&b"hd"[..]),
                },
            },
        ));
        let buf = r.result.unwrap().unwrap();
        assert_eq!(&buf[..2], b"hd");
        assert!(buf[2..].iter().all(|&b| b == 0xAB));
        let mut expect = vec![0xAB; 512];
        expect[300] = 1;
        let c = wait(
            &m,
            IoRequest {
                tag: 9,
                op: IoOp::CompareAndWrite {
                    offset: 4096,
                    compare: Bytes::from(expect),
                    write: Bytes::from(vec![0; 512]),
                },
            },
        );
        assert!(matches!(c.result, Err(IoError::Miscompare { offset: 300 })));
    }

    #[test]
    fn rejects_out_of_range_requests_through_the_completion() {
        let m = MemBackend::new(1 << 20);
        let r = wait(
            &m,
            IoRequest {
                tag: 1,
                op: IoOp::Discard {
                    offset: 1 << 20,
                    len: 512,
                },
            },
        );
        assert!(matches!(r.result, Err(IoError::Io(_))));
    }
}
