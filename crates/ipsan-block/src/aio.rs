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

pub use crate::backend::run_blocking;
use crate::backend::Backend;
pub use crate::request::{Completer, Engine, IoCompletion, IoError, IoOp, IoRequest};

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
    use crate::mem::MemBackend;
    use bytes::{Bytes, BytesMut};

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
