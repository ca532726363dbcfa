//! `rbd:pool[/namespace]/image`: a Ceph RBD image as a block store, through librbd's
//! asynchronous API (`rbd_aio_*`), so requests in flight hold no thread ([`Engine::Async`]).
//!
//! # Layout
//! - this file: [`RbdSpec`], [`RbdBackend`] (open, submit, the watch and reopen threads);
//! - `record.rs`: the image's [`SharedRecord`] (a RADOS object next to it) and its cache;
//! - `ffi.rs`, `ffi/image.rs`: the only `unsafe` code — librados/librbd via `dlopen`.
//!
//! librbd and librados are loaded at run time (`dlopen` of `librbd.so.1` and
//! `librados.so.2`): ipsan builds without `librbd-dev`, and a machine without `librbd1`
//! gets "RBD unavailable" when an `rbd:` LUN is opened, not a link error at start.
//!
//! Semantics (docs/rbd.md has the SCSI view): the store's size is the image's, refreshed
//! when librbd's header watch fires (a SCSI LU then raises CAPACITY DATA HAS CHANGED);
//! [`IoOp::Discard`] and [`IoOp::WriteZeroes`] become `rbd_aio_write_zeroes` (a discard that
//! also zeroes partial objects, so reads of a discarded range return zeros); [`IoOp::Flush`]
//! becomes `rbd_aio_flush`; [`IoOp::CompareAndWrite`] becomes `rbd_aio_compare_and_write`,
//! atomic in the OSD, so it holds across several servers of one image. Operations are bounded
//! by `rados_osd_op_timeout` (default 30 s here, librados' own default is "forever"); a
//! timeout is an `ETIMEDOUT` error, which the SCSI front end answers with a retryable NOT
//! READY.

use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::Duration;

use crate::backend::{Backend, BackendError, SharedRecord};
use crate::request::{Completer, Engine, IoCompletion, IoError, IoOp, IoRequest};

/// The thin FFI layer: symbol loading, cluster and image handles, and the aio completion
/// trampoline. Everything `unsafe` in the RBD backend lives there.
#[allow(unsafe_code)]
mod ffi;
mod record;

use record::{RbdRecord, PR_REFRESH};

/// Where an RBD image lives and how to reach its cluster.
#[derive(Clone, PartialEq, Eq, Debug, Default)]
pub struct RbdSpec {
    /// Pool name.
    pub pool: String,
    /// RADOS namespace inside the pool (`pool/ns/image`), if any.
    pub namespace: Option<String>,
    /// Image name.
    pub image: String,
    /// ceph.conf path; `None`: the `CEPH_CONF` environment variable, then librados' default
    /// search path (`/etc/ceph/ceph.conf`, ...).
    pub conf: Option<PathBuf>,
    /// Client id without `client.` (e.g. `admin`); `None`: librados' default (`admin`).
    pub id: Option<String>,
    /// Keyring path; `None`: whatever the configuration names.
    pub keyring: Option<PathBuf>,
    /// Further librados/librbd options (`rbd_cache=false`, `rados_osd_op_timeout=10`), set
    /// after the configuration file is read.
    pub options: Vec<(String, String)>,
}

impl RbdSpec {
    /// Parses `pool/image` or `pool/namespace/image` (the part after `rbd:`).
    pub fn parse_path(path: &str) -> Result<Self, String> {
        let parts: Vec<&str> = path.split('/').collect();
        let ok = |s: &&str| !s.is_empty() && !s.contains('\0');
        let (pool, namespace, image) = match parts.as_slice() {
            [p, i] if ok(p) && ok(i) => (*p, None, *i),
            [p, n, i] if ok(p) && ok(n) && ok(i) => (*p, Some((*n).to_owned()), *i),
            _ => {
                return Err(format!(
                    "expected rbd:<pool>/<image> or rbd:<pool>/<namespace>/<image>, e.g. rbd:rbd/disk0; got {path:?}"
                ))
            }
        };
        Ok(Self {
            pool: pool.to_owned(),
            namespace,
            image: image.to_owned(),
            ..Self::default()
        })
    }

    /// `pool/[ns/]image`, for messages.
    pub fn path(&self) -> String {
        match &self.namespace {
            Some(ns) => format!("{}/{ns}/{}", self.pool, self.image),
            None => format!("{}/{}", self.pool, self.image),
        }
    }
}

/// Options ipsan sets unless the user does: bound every operation so a vanished cluster
/// becomes an error instead of a hang (librados waits forever by default), and no client
/// cache: a gateway is one of possibly several clients of the image, and data cached in one
/// would be stale for reads through another (docs/rbd.md). And zero-copy writes: by default
/// librbd copies every write buffer (`rbd_disable_zero_copy_writes`, there so a client that
/// changes its buffer while the write is in flight cannot cause a CRC mismatch); ours is an
/// immutable `Bytes` that `ffi::Image::aio` holds until the completion, and librbd delays
/// the completion until it dropped its last reference to the buffer, so the copy protects
/// nothing here. It was ~13 % of the target's CPU on 4 MiB writes
/// (docs/results/rbd/bench-cpu/summary.md).
const DEFAULT_OPTIONS: [(&str, &str); 5] = [
    ("rbd_cache", "false"),
    ("rbd_disable_zero_copy_writes", "false"),
    ("rados_osd_op_timeout", "30"),
    ("rados_mon_op_timeout", "30"),
    ("client_mount_timeout", "30"),
];

/// An open RBD image.
pub struct RbdBackend {
    inner: Arc<Inner>,
    watcher: Option<Watcher>,
    pr: Arc<RbdRecord>,
}

/// What the backend, its threads and its reservation store share.
struct Inner {
    lib: &'static ffi::Lib,
    spec: RbdSpec,
    /// The librados options every connection gets (defaults, keyring, the spec's).
    options: Vec<(String, String)>,
    path: String,
    identity: String,
    obj_size: u64,
    /// The RADOS object next to the image that holds the reservation state.
    pr_oid: String,
    /// The live connection; replaced when the client was blocklisted.
    conn: RwLock<Arc<Conn>>,
    size: AtomicU64,
    /// Whether a reopen (after blocklisting) is under way.
    reopening: AtomicBool,
    events: Arc<Events>,
    pr_cache: record::Cache,
}

/// What librados' watch callbacks and librbd's completion callbacks touch: nothing that
/// refers back to a connection. Whoever drops the last reference to a connection closes its
/// image (`rbd_close`) and shuts its client down, and that must never be a callback: librbd
/// runs a completion's callback on the image's own work queue and `rbd_close` waits for
/// that queue to drain, so a close from a callback waits for itself, for good, with the
/// image's exclusive lock and header watch still held. Another client of the image (the
/// next gateway) then never gets the lock, and its next write or flush never completes.
#[derive(Default)]
struct Events {
    /// `pool/[ns/]image`, for the callbacks' log lines.
    path: String,
    /// Whether the last completion said the cluster cannot be reached (logged on change).
    unreachable: AtomicBool,
    /// A completion failed with ESHUTDOWN (this client is blocklisted): the watch thread
    /// starts the reopen (a callback cannot: the reopen holds the connection).
    blocklisted: AtomicBool,
    /// Wakes the size thread (librbd's header watch fired).
    wake: (Mutex<bool>, Condvar),
    /// Bumped when another gateway announces a reservation change (or the watch failed):
    /// a cached state read before the bump is stale.
    pr_epoch: AtomicU64,
    /// The watch on the reservation object failed; the size thread re-registers it.
    pr_watch_broken: AtomicBool,
    /// Wakes the reservation refresher.
    pr_wake: (Mutex<bool>, Condvar),
}

fn signal(w: &(Mutex<bool>, Condvar)) {
    let (m, c) = w;
    *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
    c.notify_one();
}

/// Waits until `w` is signalled or `timeout` passes, and clears it.
fn wait_signal(w: &(Mutex<bool>, Condvar), timeout: Duration) {
    let (m, c) = w;
    let g = m.lock().unwrap_or_else(|p| p.into_inner());
    let (mut g, _) = c
        .wait_timeout_while(g, timeout, |n| !*n)
        .unwrap_or_else(|p| p.into_inner());
    *g = false;
}

impl Events {
    fn wake(&self) {
        signal(&self.wake);
    }
    fn wake_pr(&self) {
        signal(&self.pr_wake);
    }
}

/// One librados client with the image open and its watches registered.
struct Conn {
    image: ffi::Image,
    update: Mutex<Option<ffi::WatchHandle>>,
    pr_watch: Mutex<Option<ffi::ObjWatch>>,
}

impl Conn {
    fn open(
        lib: &'static ffi::Lib,
        spec: &RbdSpec,
        options: &[(String, String)],
        events: &Arc<Events>,
    ) -> Result<Conn, (&'static str, io::Error)> {
        let cluster = ffi::Cluster::connect(lib, spec.conf.as_deref(), spec.id.as_deref(), options)
            .map_err(|e| ("connect to the Ceph cluster for", e))?;
        let image = ffi::Image::open(
            Arc::new(cluster),
            &spec.pool,
            spec.namespace.as_deref(),
            &spec.image,
        )
        .map_err(|e| ("open", e))?;
        let ev = events.clone();
        let update = image
            .update_watch(Box::new(move || ev.wake()))
            .map_err(|e| ("watch", e))?;
        Ok(Conn {
            image,
            update: Mutex::new(Some(update)),
            pr_watch: Mutex::new(None),
        })
    }

    /// Creates the record object if it is missing (empty contents, version 1) and watches
    /// it: another gateway's notify after a change bumps the epoch.
    fn watch_pr(&self, oid: &str, events: &Arc<Events>) -> io::Result<()> {
        // Exclusive create: EEXIST (someone made it) is fine.
        self.image.cas_obj(oid, None, b"1", b"1\n")?;
        let ev = events.clone();
        let w = self.image.watch_obj(
            oid,
            Box::new(move |err| {
                ev.pr_epoch.fetch_add(1, Ordering::AcqRel);
                ev.wake_pr();
                if err.is_some() {
                    ev.pr_watch_broken.store(true, Ordering::Release);
                    ev.wake();
                }
            }),
        )?;
        let old = self
            .pr_watch
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .replace(w);
        if let Some(old) = old {
            self.image.unwatch_obj(old);
        }
        Ok(())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let update = self
            .update
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(h) = update {
            self.image.update_unwatch(h);
        }
        let pr = self
            .pr_watch
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(w) = pr {
            self.image.unwatch_obj(w);
        }
    }
}

impl Inner {
    fn conn(&self) -> Arc<Conn> {
        self.conn.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// After an error from the cluster: a blocklisted client (EBLOCKLISTED = ESHUTDOWN)
    /// never recovers by itself, so start reopening with a new one.
    fn after_error(self: &Arc<Self>, e: &io::Error) {
        if e.raw_os_error() == Some(libc::ESHUTDOWN) {
            self.start_reopen();
        }
    }

    /// Opens a new client and the image again in the background (once at a time), then
    /// swaps it in; commands meanwhile fail with the old client's retryable NOT READY.
    fn start_reopen(self: &Arc<Self>) {
        if self.reopening.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::error!(
            image = %self.path,
            "rbd: this gateway's Ceph client was blocklisted (ESHUTDOWN); reopening the image \
             with a new client; commands fail with NOT READY (retryable) until it is open"
        );
        let inner = self.clone();
        let spawned = std::thread::Builder::new()
            .name("rbd-reopen".into())
            .spawn(move || inner.reopen());
        if let Err(e) = spawned {
            tracing::error!(image = %self.path, "rbd: cannot start the reopen thread: {e}");
            self.reopening.store(false, Ordering::Release);
        }
    }

    fn reopen(self: Arc<Self>) {
        let mut delay = Duration::from_millis(500);
        let conn = loop {
            let c = Conn::open(self.lib, &self.spec, &self.options, &self.events)
                .map_err(|(op, e)| io::Error::new(e.kind(), format!("{op}: {e}")))
                .and_then(|c| c.watch_pr(&self.pr_oid, &self.events).map(|()| c));
            match c {
                Ok(c) => break c,
                Err(e) => {
                    tracing::warn!(image = %self.path, "rbd: reopen failed, retrying in {delay:?}: {e}");
                    std::thread::sleep(delay);
                    delay = (delay * 2).min(Duration::from_secs(10));
                }
            }
        };
        let old = std::mem::replace(
            &mut *self.conn.write().unwrap_or_else(|p| p.into_inner()),
            Arc::new(conn),
        );
        self.events.pr_epoch.fetch_add(1, Ordering::AcqRel);
        self.events.pr_watch_broken.store(false, Ordering::Release);
        self.reopening.store(false, Ordering::Release);
        self.events.wake();
        self.events.wake_pr();
        tracing::info!(image = %self.path, "rbd: image reopened with a new Ceph client");
        // Close the old client here, not in whichever command drops the last reference
        // (rbd_close waits for its in-flight requests): wait a little for those to finish.
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while Arc::strong_count(&old) > 1 && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(100));
        }
        tracing::debug!(image = %self.path, users = Arc::strong_count(&old) - 1, "rbd: closing the old client");
        drop(old);
        tracing::debug!(image = %self.path, "rbd: old client closed");
    }
}

/// Logs once when the cluster stops answering and once when it answers again, so an outage
/// reads as two clear lines rather than one warning per failed command.
fn note_reachability(down: &AtomicBool, path: &str, c: &IoCompletion) {
    let unreachable = match &c.result {
        Err(IoError::Io(e)) => e.raw_os_error().is_some_and(|code| {
            [
                libc::ETIMEDOUT,
                libc::ESHUTDOWN,
                libc::ENOTCONN,
                libc::ECONNREFUSED,
                libc::ECONNRESET,
                libc::EHOSTUNREACH,
            ]
            .contains(&code)
        }),
        _ => false,
    };
    if unreachable {
        if !down.swap(true, Ordering::AcqRel) {
            if let Err(IoError::Io(e)) = &c.result {
                tracing::error!(
                    image = %path,
                    "rbd: the Ceph cluster does not answer ({e}); commands fail with NOT READY \
                     (retryable) until it does"
                );
            }
        }
    } else if c.result.is_ok() && down.swap(false, Ordering::AcqRel) {
        tracing::info!(image = %path, "rbd: the Ceph cluster answers again");
    }
}

impl fmt::Debug for RbdBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdBackend")
            .field("image", &self.inner.path)
            .field("size", &self.inner.size.load(Ordering::Relaxed))
            .field("obj_size", &self.inner.obj_size)
            .finish_non_exhaustive()
    }
}

/// Refreshes the cached size when librbd's header watch fires (and every few seconds, in
/// case a notification was lost while the cluster was away), and re-registers a failed
/// watch on the reservation object.
struct Watcher {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
}

const SIZE_POLL: Duration = Duration::from_secs(5);

impl RbdBackend {
    /// Connects to the cluster and opens the image.
    pub fn open(spec: &RbdSpec) -> Result<Self, BackendError> {
        let path = spec.path();
        let shown = format!("rbd:{path}");
        let fail = |op: &'static str, e: io::Error| BackendError::Io {
            op,
            path: shown.clone(),
            source: e,
        };
        let lib = ffi::lib().map_err(|e| fail("RBD unavailable", e))?;
        let mut options: Vec<(String, String)> = DEFAULT_OPTIONS
            .iter()
            .filter(|(k, _)| !spec.options.iter().any(|(u, _)| u == k))
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect();
        if let Some(k) = &spec.keyring {
            options.push(("keyring".into(), k.display().to_string()));
        }
        options.extend(spec.options.iter().cloned());
        let events = Arc::new(Events {
            path: path.clone(),
            ..Events::default()
        });
        let conn = Conn::open(lib, spec, &options, &events).map_err(|(op, e)| fail(op, e))?;
        let (size, obj_size) = conn.image.stat().map_err(|e| fail("stat", e))?;
        let id = conn.image.id().map_err(|e| fail("get id of", e))?;
        let identity = format!(
            "rbd:{}/{}/{id}",
            conn.image.cluster_fsid().unwrap_or_default(),
            conn.image.pool_id(),
        );
        let pr_oid = format!("ipsan.pr.{id}");
        conn.watch_pr(&pr_oid, &events)
            .map_err(|e| fail("set up the reservation object of", e))?;
        let inner = Arc::new(Inner {
            lib,
            spec: spec.clone(),
            options,
            path,
            identity,
            obj_size,
            pr_oid,
            conn: RwLock::new(Arc::new(conn)),
            size: AtomicU64::new(size),
            reopening: AtomicBool::new(false),
            events,
            pr_cache: record::Cache::default(),
        });
        let watcher = start_watcher(&inner).map_err(|e| fail("watch", e))?;
        Ok(Self {
            pr: Arc::new(RbdRecord {
                inner: inner.clone(),
            }),
            inner,
            watcher: Some(watcher),
        })
    }

    /// The RBD object size in bytes.
    pub fn object_size(&self) -> u64 {
        self.inner.obj_size
    }

    fn submit_op(&self, req: IoRequest, done: Completer) {
        let size = self.size();
        let range = |offset: u64, len: u64| -> io::Result<()> {
            match offset.checked_add(len) {
                Some(end) if end <= size => Ok(()),
                _ => Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("range {offset}+{len} beyond image size {size}"),
                )),
            }
        };
        let check = match &req.op {
            IoOp::Read { offset, len, .. } => range(*offset, *len as u64),
            IoOp::Write { offset, data } => range(*offset, data.len() as u64),
            IoOp::Discard { offset, len } | IoOp::WriteZeroes { offset, len } => {
                range(*offset, *len)
            }
            IoOp::CompareAndWrite {
                offset,
                compare,
                write,
            } => {
                if compare.len() != write.len() {
                    Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        "compare and write buffers differ in length",
                    ))
                } else {
                    range(*offset, compare.len() as u64)
                }
            }
            IoOp::Flush => Ok(()),
        };
        if let Err(e) = check {
            done(IoCompletion {
                tag: req.tag,
                result: Err(IoError::Io(e)),
            });
            return;
        }
        // The callback holds the events only, never `self.inner`: were it the last holder
        // (the backend dropped while librbd runs the callback, as at a target's shutdown
        // right after its final flush), dropping it there would close the image from inside
        // librbd's callback, which never returns (see `Events`).
        let events = self.inner.events.clone();
        self.inner.conn().image.aio(
            req,
            Box::new(move |c| {
                note_reachability(&events.unreachable, &events.path, &c);
                if let Err(IoError::Io(e)) = &c.result {
                    if e.raw_os_error() == Some(libc::ESHUTDOWN) {
                        events.blocklisted.store(true, Ordering::Release);
                        events.wake();
                    }
                }
                done(c)
            }),
        );
    }
}

fn start_watcher(inner: &Arc<Inner>) -> io::Result<Watcher> {
    let stop = Arc::new(AtomicBool::new(false));
    let (sizer, st) = (inner.clone(), stop.clone());
    let thread = std::thread::Builder::new()
        .name("rbd-watch".into())
        .spawn(move || {
            while !st.load(Ordering::Acquire) {
                wait_signal(&sizer.events.wake, SIZE_POLL);
                if st.load(Ordering::Acquire) {
                    break;
                }
                if sizer.events.blocklisted.swap(false, Ordering::AcqRel) {
                    // A command's completion saw ESHUTDOWN (the callback cannot reopen).
                    sizer.start_reopen();
                }
                if sizer.reopening.load(Ordering::Acquire) {
                    continue;
                }
                let conn = sizer.conn();
                match conn.image.size() {
                    Ok(n) => {
                        let old = sizer.size.swap(n, Ordering::AcqRel);
                        if old != n {
                            tracing::info!(image = %sizer.path, old, new = n, "rbd: image resized");
                        }
                    }
                    Err(e) => {
                        tracing::warn!(image = %sizer.path, "rbd: cannot read size: {e}");
                        sizer.after_error(&e);
                    }
                }
                if sizer.events.pr_watch_broken.load(Ordering::Acquire) {
                    match conn.watch_pr(&sizer.pr_oid, &sizer.events) {
                        Ok(()) => {
                            sizer.events.pr_watch_broken.store(false, Ordering::Release);
                            tracing::info!(image = %sizer.path, "rbd: reservation watch re-registered");
                        }
                        Err(e) => {
                            tracing::warn!(image = %sizer.path, "rbd: cannot watch the reservation object: {e}");
                            sizer.after_error(&e);
                        }
                    }
                }
            }
        })?;
    let (inner2, st) = (inner.clone(), stop.clone());
    let refresher = std::thread::Builder::new()
        .name("rbd-pr".into())
        .spawn(move || {
            while !st.load(Ordering::Acquire) {
                inner2.refresh_pr();
                wait_signal(&inner2.events.pr_wake, PR_REFRESH);
            }
        });
    let refresher = match refresher {
        Ok(t) => t,
        Err(e) => {
            stop.store(true, Ordering::Release);
            inner.events.wake();
            let _ = thread.join();
            return Err(e);
        }
    };
    Ok(Watcher {
        stop,
        threads: vec![thread, refresher],
    })
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        if let Some(mut w) = self.watcher.take() {
            w.stop.store(true, Ordering::Release);
            self.inner.events.wake();
            self.inner.events.wake_pr();
            for t in w.threads.drain(..) {
                let _ = t.join();
            }
        }
    }
}

fn wait_blocking(b: &RbdBackend, op: IoOp) -> io::Result<Option<bytes::BytesMut>> {
    match crate::aio::wait(b, IoRequest { tag: 0, op }).result {
        Ok(v) => Ok(v),
        Err(IoError::Io(e)) => Err(e),
        Err(IoError::Miscompare { offset }) => {
            Err(io::Error::other(format!("miscompare at byte {offset}")))
        }
    }
}

impl Backend for RbdBackend {
    fn size(&self) -> u64 {
        self.inner.size.load(Ordering::Acquire)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let got = wait_blocking(
            self,
            IoOp::Read {
                offset,
                len: buf.len(),
                buf: bytes::BytesMut::with_capacity(buf.len()),
            },
        )?;
        let got = got.ok_or_else(|| io::Error::other("read completed without data"))?;
        buf.copy_from_slice(&got);
        Ok(())
    }

    fn read_append(&self, buf: &mut bytes::BytesMut, len: usize, offset: u64) -> io::Result<()> {
        let got = wait_blocking(
            self,
            IoOp::Read {
                offset,
                len,
                buf: std::mem::take(buf),
            },
        )?;
        *buf = got.ok_or_else(|| io::Error::other("read completed without data"))?;
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        wait_blocking(
            self,
            IoOp::Write {
                offset,
                data: bytes::Bytes::copy_from_slice(buf),
            },
        )
        .map(drop)
    }

    fn flush(&self) -> io::Result<()> {
        wait_blocking(self, IoOp::Flush).map(drop)
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        wait_blocking(self, IoOp::Discard { offset, len }).map(drop)
    }

    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        wait_blocking(self, IoOp::WriteZeroes { offset, len }).map(drop)
    }

    fn kind(&self) -> &'static str {
        "rbd"
    }

    fn supports_unmap(&self) -> bool {
        true
    }

    fn engine(&self) -> Engine {
        Engine::Async
    }

    fn submit(&self, req: IoRequest, done: Completer) {
        self.submit_op(req, done);
    }

    fn granularity(&self) -> Option<u64> {
        Some(self.inner.obj_size)
    }

    fn identity(&self) -> Option<String> {
        Some(self.inner.identity.clone())
    }

    fn shared_record(&self) -> Option<Arc<dyn SharedRecord>> {
        Some(self.pr.clone())
    }

    fn max_compare_and_write(&self) -> Option<u64> {
        // librbd 16.2 refuses (EINVAL) a compare-and-write of more than one 512-byte
        // sector; tests/rbd.rs checks the limit we advertise against a real cluster.
        Some(512)
    }
}

/// Whether librbd can be loaded here (for tests and `ipsan target --help` style checks).
pub fn available() -> Result<(), String> {
    ffi::lib().map(drop).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pool_namespace_and_image() {
        let s = RbdSpec::parse_path("rbd/disk0").unwrap();
        assert_eq!((s.pool.as_str(), s.image.as_str()), ("rbd", "disk0"));
        assert_eq!(s.namespace, None);
        let s = RbdSpec::parse_path("p/ns/img").unwrap();
        assert_eq!(s.namespace.as_deref(), Some("ns"));
        assert_eq!(s.path(), "p/ns/img");
    }

    #[test]
    fn rejects_malformed_image_paths() {
        for bad in ["", "rbd", "rbd/", "/disk", "a/b/c/d", "a//b"] {
            let e = RbdSpec::parse_path(bad).unwrap_err();
            assert!(e.contains("rbd:<pool>/<image>"), "{bad}: {e}");
        }
    }
}
