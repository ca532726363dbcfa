//! `rbd_image_t` with its `rados_ioctx_t` ([`Image`]): aio submission and the completion
//! trampoline, header and object watches, and the RADOS object operations the shared record
//! (`record.rs`) is built on. Every `unsafe` block says why it is sound (`// SAFETY:`).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::sync::Arc;

use super::*;
use crate::request::{Completer, IoCompletion, IoError, IoOp, IoRequest};

/// An open `rbd_image_t` with its `rados_ioctx_t`.
pub(in crate::rbd) struct Image {
    lib: &'static Lib,
    cluster: Arc<Cluster>,
    ioctx: IoctxT,
    handle: ImageT,
}

// SAFETY: librbd image handles are thread-safe (concurrent aio from many threads is
// their intended use); the ioctx is only used at open and close.
unsafe impl Send for Image {}
// SAFETY: as above.
unsafe impl Sync for Image {}

/// A registered header watch: its handle and the boxed callback librbd calls.
pub(in crate::rbd) struct WatchHandle {
    handle: u64,
    arg: *mut WatchFn,
}

// SAFETY: only the handle value and a pointer we own move between threads; the pointee
// is `Send + Sync`.
unsafe impl Send for WatchHandle {}
// SAFETY: `&WatchHandle` gives no access to the pointee.
unsafe impl Sync for WatchHandle {}

type WatchFn = Box<dyn Fn() + Send + Sync>;

extern "C" fn watch_trampoline(arg: *mut c_void) {
    // SAFETY: `arg` is the `*mut WatchFn` registered in update_watch, freed only after
    // rbd_update_unwatch returned (no callback can be running or pending then).
    let f = unsafe { &*(arg as *const WatchFn) };
    f();
}

/// A watch on a RADOS object: its cookie and the state its callbacks use.
pub(in crate::rbd) struct ObjWatch {
    cookie: u64,
    arg: *mut ObjWatchArg,
}

// SAFETY: only the cookie and a pointer we own move between threads; the pointee is
// only read, and is Send + Sync (below).
unsafe impl Send for ObjWatch {}
// SAFETY: `&ObjWatch` gives no access to the pointee.
unsafe impl Sync for ObjWatch {}

/// Called with `None` on a notification, `Some(errno)` when the watch failed.
type ObjWatchFn = Box<dyn Fn(Option<i32>) + Send + Sync>;

struct ObjWatchArg {
    lib: &'static Lib,
    ioctx: IoctxT,
    oid: CString,
    f: ObjWatchFn,
}

extern "C" fn obj_watch_cb(
    arg: *mut c_void,
    notify_id: u64,
    cookie: u64,
    _notifier: u64,
    _data: *mut c_void,
    _len: usize,
) {
    // SAFETY: `arg` is the ObjWatchArg registered in watch_obj, freed only after
    // rados_unwatch2 and rados_watch_flush returned (no callback runs then).
    let a = unsafe { &*(arg as *const ObjWatchArg) };
    (a.f)(None);
    // SAFETY: the ioctx outlives the watch (unwatch_obj runs before the image closes);
    // the oid is NUL-terminated; no payload. librados queues the ack and returns.
    unsafe {
        (a.lib.rados_notify_ack)(
            a.ioctx,
            a.oid.as_ptr(),
            notify_id,
            cookie,
            std::ptr::null(),
            0,
        )
    };
}

extern "C" fn obj_watch_err(arg: *mut c_void, _cookie: u64, err: c_int) {
    // SAFETY: as in obj_watch_cb.
    let a = unsafe { &*(arg as *const ObjWatchArg) };
    (a.f)(Some(err));
}

impl Image {
    pub(in crate::rbd) fn open(
        cluster: Arc<Cluster>,
        pool: &str,
        namespace: Option<&str>,
        image: &str,
    ) -> io::Result<Self> {
        let lib = cluster.lib;
        let pool_c = cstring("pool", pool)?;
        let mut ioctx: IoctxT = std::ptr::null_mut();
        // SAFETY: connected cluster handle, NUL-terminated name, valid out-pointer.
        let r = unsafe { (lib.rados_ioctx_create)(cluster.handle, pool_c.as_ptr(), &mut ioctx) };
        if r < 0 {
            let e = errno(i64::from(r));
            return Err(io::Error::new(e.kind(), format!("pool {pool:?}: {e}")));
        }
        if let Some(ns) = namespace {
            let ns_c = cstring("namespace", ns)?;
            // SAFETY: valid ioctx; the namespace string is copied by librados.
            unsafe { (lib.rados_ioctx_set_namespace)(ioctx, ns_c.as_ptr()) };
        }
        let name_c = cstring("image", image)?;
        let mut handle: ImageT = std::ptr::null_mut();
        // SAFETY: valid ioctx, NUL-terminated name, valid out-pointer, NULL snapshot
        // (the writable head).
        let r = unsafe { (lib.rbd_open)(ioctx, name_c.as_ptr(), &mut handle, std::ptr::null()) };
        if r < 0 {
            // SAFETY: the ioctx is valid and nothing else uses it.
            unsafe { (lib.rados_ioctx_destroy)(ioctx) };
            let e = errno(i64::from(r));
            return Err(io::Error::new(e.kind(), format!("image {image:?}: {e}")));
        }
        Ok(Image {
            lib,
            cluster,
            ioctx,
            handle,
        })
    }

    /// (size, object size) in bytes.
    pub(in crate::rbd) fn stat(&self) -> io::Result<(u64, u64)> {
        // SAFETY: ImageInfo is plain integers and arrays: all-zero is a valid value.
        let mut info: ImageInfo = unsafe { std::mem::zeroed() };
        // SAFETY: valid image; `info` is a writable rbd_image_info_t of the size passed.
        check(unsafe {
            (self.lib.rbd_stat)(self.handle, &mut info, std::mem::size_of::<ImageInfo>())
        })?;
        Ok((info.size, info.obj_size))
    }

    pub(in crate::rbd) fn size(&self) -> io::Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid image, valid out-pointer.
        check(unsafe { (self.lib.rbd_get_size)(self.handle, &mut n) })?;
        Ok(n)
    }

    pub(in crate::rbd) fn id(&self) -> io::Result<String> {
        let mut buf = [0 as c_char; 128];
        // SAFETY: valid image; librbd writes at most `buf.len()` bytes, NUL-terminated.
        check(unsafe { (self.lib.rbd_get_id)(self.handle, buf.as_mut_ptr(), buf.len()) })?;
        // SAFETY: NUL-terminated within `buf` on success.
        Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
            .to_string_lossy()
            .into_owned())
    }

    pub(in crate::rbd) fn pool_id(&self) -> i64 {
        // SAFETY: valid ioctx.
        unsafe { (self.lib.rados_ioctx_get_id)(self.ioctx) }
    }

    pub(in crate::rbd) fn cluster_fsid(&self) -> Option<String> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: connected cluster; librados writes at most `buf.len()` bytes.
        let r = unsafe {
            (self.lib.rados_cluster_fsid)(self.cluster.handle, buf.as_mut_ptr(), buf.len())
        };
        if r < 0 {
            return None;
        }
        // SAFETY: NUL-terminated within `buf` on success.
        Some(
            unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned(),
        )
    }

    pub(in crate::rbd) fn update_watch(&self, f: WatchFn) -> io::Result<WatchHandle> {
        let arg = Box::into_raw(Box::new(f));
        let mut handle = 0u64;
        // SAFETY: valid image; `arg` stays allocated until update_unwatch (below) has
        // returned, and the trampoline only reads it.
        let r = unsafe {
            (self.lib.rbd_update_watch)(self.handle, &mut handle, watch_trampoline, arg.cast())
        };
        if r < 0 {
            // SAFETY: registration failed, so librbd holds no copy of `arg`.
            drop(unsafe { Box::from_raw(arg) });
            return Err(errno(i64::from(r)));
        }
        Ok(WatchHandle { handle, arg })
    }

    pub(in crate::rbd) fn update_unwatch(&self, w: WatchHandle) {
        // SAFETY: valid image and a handle from update_watch. librbd flushes pending
        // notifications before returning.
        let r = unsafe { (self.lib.rbd_update_unwatch)(self.handle, w.handle) };
        if r < 0 {
            // Keep the closure alive (leak it): a late callback must not see freed memory.
            tracing::warn!("rbd: update_unwatch failed: {}", errno(i64::from(r)));
            return;
        }
        // SAFETY: unregistered: no callback runs or will run with `arg`.
        drop(unsafe { Box::from_raw(w.arg) });
    }

    /// Reads a whole small object (at most `max` bytes); `None` when it does not exist.
    pub(in crate::rbd) fn read_obj(&self, oid: &str, max: usize) -> io::Result<Option<Vec<u8>>> {
        let oid_c = cstring("object", oid)?;
        let mut buf = vec![0u8; max + 1];
        // SAFETY: valid ioctx, NUL-terminated oid, `buf` writable for the length passed.
        let r = unsafe {
            (self.lib.rados_read)(
                self.ioctx,
                oid_c.as_ptr(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
            )
        };
        if r == -libc::ENOENT {
            return Ok(None);
        }
        check(r)?;
        let n = usize::try_from(r).unwrap_or(0);
        if n > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("object {oid} larger than {max} bytes"),
            ));
        }
        buf.truncate(n);
        Ok(Some(buf))
    }

    /// One atomic RADOS write op on `oid`: when `expect` is `None` create it exclusively,
    /// else require its `ipsan.ver` xattr to equal `expect`; then replace its data with
    /// `data` and set the xattr to `version`. `Ok(false)`: the condition failed.
    pub(in crate::rbd) fn cas_obj(
        &self,
        oid: &str,
        expect: Option<&[u8]>,
        version: &[u8],
        data: &[u8],
    ) -> io::Result<bool> {
        let oid_c = cstring("object", oid)?;
        let xattr = c"ipsan.ver";
        // SAFETY: no preconditions; NULL on allocation failure.
        let op = unsafe { (self.lib.rados_create_write_op)() };
        if op.is_null() {
            return Err(io::Error::from(io::ErrorKind::OutOfMemory));
        }
        // SAFETY: `op` is a fresh write op; every buffer passed outlives the operate call
        // below (librados copies them when the op is built or run); lengths match.
        let r = unsafe {
            match expect {
                None => (self.lib.rados_write_op_create)(op, CREATE_EXCLUSIVE, std::ptr::null()),
                Some(v) => (self.lib.rados_write_op_cmpxattr)(
                    op,
                    xattr.as_ptr(),
                    CMPXATTR_OP_EQ,
                    v.as_ptr().cast(),
                    v.len(),
                ),
            }
            (self.lib.rados_write_op_write_full)(op, data.as_ptr().cast(), data.len());
            (self.lib.rados_write_op_setxattr)(
                op,
                xattr.as_ptr(),
                version.as_ptr().cast(),
                version.len(),
            );
            let r = (self.lib.rados_write_op_operate)(
                op,
                self.ioctx,
                oid_c.as_ptr(),
                std::ptr::null_mut(),
                0,
            );
            (self.lib.rados_release_write_op)(op);
            r
        };
        // ECANCELED: the xattr differed; EEXIST: the object exists (create); ENOENT:
        // it vanished under a compare.
        if [libc::ECANCELED, libc::EEXIST, libc::ENOENT].contains(&-r) {
            return Ok(false);
        }
        check(r).map(|()| true)
    }

    /// Watches `oid`; `f` runs on librados' callback thread.
    pub(in crate::rbd) fn watch_obj(&self, oid: &str, f: ObjWatchFn) -> io::Result<ObjWatch> {
        let arg = Box::into_raw(Box::new(ObjWatchArg {
            lib: self.lib,
            ioctx: self.ioctx,
            oid: cstring("object", oid)?,
            f,
        }));
        let mut cookie = 0u64;
        // SAFETY: valid ioctx; the oid lives in `arg`, which stays allocated until
        // unwatch_obj has unregistered and flushed the callbacks.
        let r = unsafe {
            (self.lib.rados_watch2)(
                self.ioctx,
                (*arg).oid.as_ptr(),
                &mut cookie,
                obj_watch_cb,
                obj_watch_err,
                arg.cast(),
            )
        };
        if r < 0 {
            // SAFETY: registration failed: librados holds no copy of `arg`.
            drop(unsafe { Box::from_raw(arg) });
            return Err(errno(i64::from(r)));
        }
        Ok(ObjWatch { cookie, arg })
    }

    pub(in crate::rbd) fn unwatch_obj(&self, w: ObjWatch) {
        // SAFETY: valid ioctx and a cookie from watch_obj; rados_watch_flush then waits
        // for callbacks already queued, so none runs with `arg` after we free it.
        let r = unsafe {
            let r = (self.lib.rados_unwatch2)(self.ioctx, w.cookie);
            (self.lib.rados_watch_flush)(self.cluster.handle);
            r
        };
        if r < 0 && r != -libc::ENOTCONN && r != -libc::ESHUTDOWN {
            // Keep the state alive (leak it) when unsure a callback cannot come.
            tracing::warn!("rbd: unwatch failed: {}", errno(i64::from(r)));
            return;
        }
        // SAFETY: unregistered and flushed (above).
        drop(unsafe { Box::from_raw(w.arg) });
    }

    /// Notifies the watchers of `oid` and waits (up to `timeout_ms`) for all to
    /// acknowledge; ETIMEDOUT when some did not.
    pub(in crate::rbd) fn notify_obj(&self, oid: &str, timeout_ms: u64) -> io::Result<()> {
        let oid_c = cstring("object", oid)?;
        let mut reply: *mut c_char = std::ptr::null_mut();
        let mut reply_len = 0usize;
        // SAFETY: valid ioctx, NUL-terminated oid, empty payload, valid out-pointers.
        let r = unsafe {
            (self.lib.rados_notify2)(
                self.ioctx,
                oid_c.as_ptr(),
                std::ptr::null(),
                0,
                timeout_ms,
                &mut reply,
                &mut reply_len,
            )
        };
        if !reply.is_null() {
            // SAFETY: a reply buffer librados allocated for us; freed once.
            unsafe { (self.lib.rados_buffer_free)(reply) };
        }
        check(r)
    }

    /// Starts `req`; `done` runs on librbd's completion thread, or here if librbd
    /// refuses the request outright.
    pub(in crate::rbd) fn aio(&self, req: IoRequest, done: Completer) {
        let lib = self.lib;
        let tag = req.tag;
        let mut inflight = Box::new(InFlight {
            lib,
            tag,
            op: req.op,
            mismatch: 0,
            done: Some(done),
        });
        let mut comp: CompletionT = std::ptr::null_mut();
        let raw: *mut InFlight = &mut *inflight;
        // SAFETY: `raw` points into the box we hand to the completion below; the
        // callback is our trampoline, which takes the box back exactly once.
        let r = unsafe { (lib.rbd_aio_create_completion)(raw.cast(), complete, &mut comp) };
        if r < 0 {
            let done = inflight.done.take();
            if let Some(d) = done {
                d(IoCompletion {
                    tag,
                    result: Err(IoError::Io(errno(i64::from(r)))),
                });
            }
            return;
        }
        // From here the box belongs to the completion: the trampoline frees it.
        let inflight = Box::into_raw(inflight);
        // SAFETY: `inflight` is valid until the completion fires; the buffers it owns
        // (Bytes/BytesMut, heap memory that never moves while owned) stay alive and
        // unaliased until then. Lengths passed match the buffers. With zero-copy writes
        // (DEFAULT_OPTIONS) librbd keeps pointing into a write's `Bytes` after this call,
        // and fires the completion only once it released the last such reference, so the
        // box (and the buffer) outlives every use; `Bytes` is never written through.
        let r: i64 = unsafe {
            let f = &mut *inflight;
            match &mut f.op {
                IoOp::Read { offset, len, buf } => {
                    buf.reserve(*len);
                    let dst = buf.as_mut_ptr().add(buf.len());
                    (lib.rbd_aio_read)(self.handle, *offset, *len, dst.cast(), comp).into()
                }
                IoOp::Write { offset, data } => (lib.rbd_aio_write)(
                    self.handle,
                    *offset,
                    data.len(),
                    data.as_ptr().cast(),
                    comp,
                )
                .into(),
                IoOp::Flush => (lib.rbd_aio_flush)(self.handle, comp).into(),
                IoOp::Discard { offset, len } | IoOp::WriteZeroes { offset, len } => {
                    // Both deallocate where they can and zero the rest (librbd's
                    // write_zeroes is a discard with no granularity skipping), so
                    // reads return zeros afterwards (LBPRZ). A plain rbd_aio_discard
                    // skips partial 64 KiB units and would break that promise.
                    match usize::try_from(*len) {
                        Ok(l) => {
                            (lib.rbd_aio_write_zeroes)(self.handle, *offset, l, comp, 0, 0).into()
                        }
                        Err(_) => -i64::from(libc::EINVAL),
                    }
                }
                IoOp::CompareAndWrite {
                    offset,
                    compare,
                    write,
                } => (lib.rbd_aio_compare_and_write)(
                    self.handle,
                    *offset,
                    compare.len(),
                    compare.as_ptr().cast(),
                    write.as_ptr().cast(),
                    comp,
                    &mut f.mismatch,
                    0,
                ) as i64,
            }
        };
        if r < 0 {
            // librbd did not queue it: no callback will come. Take the box back.
            // SAFETY: the completion never fired, so we still own `inflight` and `comp`.
            let mut f = unsafe { Box::from_raw(inflight) };
            // SAFETY: a completion that was never submitted may be released.
            unsafe { (lib.rbd_aio_release)(comp) };
            if let Some(d) = f.done.take() {
                d(IoCompletion {
                    tag,
                    result: Err(IoError::Io(errno(r))),
                });
            }
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        // SAFETY: valid image and ioctx; rbd_close waits for in-flight aio (whose
        // callbacks need nothing from this struct) before returning. Never reached from
        // a librbd callback (no callback holds a connection, see `Events`): there
        // rbd_close would wait for that callback, forever.
        unsafe {
            (self.lib.rbd_close)(self.handle);
            (self.lib.rados_ioctx_destroy)(self.ioctx);
        }
    }
}

/// One request librbd is working on: it owns the buffers until the completion.
struct InFlight {
    lib: &'static Lib,
    tag: u64,
    op: IoOp,
    mismatch: u64,
    done: Option<Completer>,
}

extern "C" fn complete(c: CompletionT, arg: *mut c_void) {
    // SAFETY: `arg` is the Box<InFlight> leaked in `aio`; librbd calls this exactly
    // once per completion, so the box is reclaimed exactly once.
    let mut f = unsafe { Box::from_raw(arg.cast::<InFlight>()) };
    // SAFETY: `c` is the completion this callback belongs to; read, then release it
    // (the last use).
    let r = unsafe { (f.lib.rbd_aio_get_return_value)(c) } as i64;
    // SAFETY: as above; not used after this.
    unsafe { (f.lib.rbd_aio_release)(c) };
    let result = match (std::mem::replace(&mut f.op, IoOp::Flush), r) {
        (IoOp::Read { len, mut buf, .. }, r) if r >= 0 => {
            if usize::try_from(r).ok() == Some(len) {
                let at = buf.len();
                // SAFETY: librbd wrote exactly `len` bytes after the initialized part
                // (the capacity reserved in `aio`); reads of holes come back zeroed.
                unsafe { buf.set_len(at + len) };
                Ok(Some(buf))
            } else {
                Err(IoError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("short read: {r} of {len} bytes"),
                )))
            }
        }
        (IoOp::CompareAndWrite { .. }, r) if r == -i64::from(libc::EILSEQ) => {
            // librbd (16.2) reports the first differing byte counted from the start of
            // the request, as SBC-4 wants it (tests/rbd.rs checks this against a real
            // cluster).
            Err(IoError::Miscompare { offset: f.mismatch })
        }
        (_, r) if r < 0 => Err(IoError::Io(errno(r))),
        _ => Ok(None),
    };
    if let Some(d) = f.done.take() {
        d(IoCompletion { tag: f.tag, result });
    }
}
