//! `rbd:pool[/namespace]/image`: a Ceph RBD image as a LUN, through librbd's asynchronous
//! API (`rbd_aio_*`), so commands in flight hold no thread ([`Engine::Async`]).
//!
//! librbd and librados are loaded at run time (`dlopen` of `librbd.so.1` and
//! `librados.so.2`): ipsan builds without `librbd-dev`, and a machine without `librbd1`
//! gets "RBD unavailable" when an `rbd:` LUN is opened, not a link error at start.
//!
//! Semantics (docs/rbd.md): the LUN's size is the image's, refreshed when librbd's header
//! watch fires (the LU raises CAPACITY DATA HAS CHANGED); UNMAP and WRITE SAME(UNMAP) become
//! `rbd_aio_write_zeroes` (a discard that also zeroes partial objects, so LBPRZ holds);
//! SYNCHRONIZE CACHE and FUA become `rbd_aio_flush`; COMPARE AND WRITE becomes
//! `rbd_aio_compare_and_write`, atomic in the OSD, so it holds across several targets
//! serving one image. Operations are bounded by `rados_osd_op_timeout` (default 30 s here,
//! librados' own default is "forever"), and a timeout becomes a retryable NOT READY sense.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::fmt;
use std::io;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock, RwLock};
use std::time::Duration;

use crate::aio::{Completer, Engine, IoCompletion, IoError, IoOp, IoRequest};
use crate::backend::{Backend, BackendError};
use crate::pr::{PrState, PrStore};

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
    pr: Arc<RbdPrStore>,
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
    pr_cache: PrCache,
}

/// The reservation state as last read by the refresher thread, for the access checks of
/// every command ([`PrStore::current`]), which never wait on the cluster themselves.
#[derive(Default)]
struct PrCache {
    m: Mutex<PrCacheState>,
    /// Signalled after each refresh.
    done: Condvar,
}

#[derive(Default)]
struct PrCacheState {
    entry: Option<PrCached>,
    /// When the refresh under way started.
    refreshing_since: Option<std::time::Instant>,
    /// The last refresh's error, while no refresh succeeded since.
    error: Option<(io::ErrorKind, Option<i32>, String)>,
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

    /// Creates the reservation object if it is missing (empty state, version 1) and
    /// watches it: another gateway's notify after a change bumps the epoch.
    fn watch_pr(&self, oid: &str, events: &Arc<Events>) -> io::Result<()> {
        let empty = format!(
            "1\n{}",
            String::from_utf8_lossy(&PrState::default().encode())
        );
        // Exclusive create: EEXIST (someone made it) is fine.
        self.image.cas_obj(oid, None, b"1", empty.as_bytes())?;
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

    /// Reads the reservation object: the state and its version (0: no object).
    fn load_pr(self: &Arc<Self>) -> io::Result<(Arc<PrState>, u64)> {
        let bytes = self
            .conn()
            .image
            .read_obj(&self.pr_oid, PR_MAX_BYTES)
            .inspect_err(|e| self.after_error(e))?;
        let Some(bytes) = bytes else {
            return Ok((Arc::new(PrState::default()), 0));
        };
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "reservation object: bad version",
            )
        };
        let nl = bytes.iter().position(|&b| b == b'\n').ok_or_else(bad)?;
        let version: u64 = std::str::from_utf8(&bytes[..nl])
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(bad)?;
        Ok((Arc::new(PrState::decode(&bytes[nl + 1..])?), version))
    }

    /// One refresh of the cached reservation state (the refresher thread).
    fn refresh_pr(self: &Arc<Self>) {
        let epoch = self.events.pr_epoch.load(Ordering::Acquire);
        let read_at = std::time::Instant::now();
        self.pr_cache
            .m
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refreshing_since = Some(read_at);
        let r = self.load_pr();
        let mut g = self.pr_cache.m.lock().unwrap_or_else(|p| p.into_inner());
        g.refreshing_since = None;
        match r {
            Ok((state, _)) => {
                g.entry = Some(PrCached {
                    state,
                    read_at,
                    epoch,
                });
                g.error = None;
            }
            Err(e) => {
                tracing::warn!(image = %self.path, "rbd: cannot read the reservation state: {e}");
                g.error = Some((e.kind(), e.raw_os_error(), e.to_string()));
            }
        }
        drop(g);
        self.pr_cache.done.notify_all();
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

/// How long a gateway trusts its cached reservation state without reading the object
/// again (docs/rbd.md: why this bounds staleness only when a watch is lost unnoticed).
const PR_CACHE_TTL: Duration = Duration::from_secs(2);
/// How often the refresher reads the reservation object when nothing wakes it.
const PR_REFRESH: Duration = Duration::from_millis(700);
/// How long a command waits for a refresh under way before it fails with NOT READY.
const PR_WAIT: Duration = Duration::from_millis(200);
/// How long a reservation change waits for the other gateways to acknowledge it. Longer
/// than [`PR_CACHE_TTL`]: when it times out, every cache older than the change has expired.
const PR_NOTIFY_TIMEOUT_MS: u64 = 5_000;
/// The largest reservation state read back (about 2000 registrations).
const PR_MAX_BYTES: usize = 256 << 10;

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
            pr_cache: PrCache::default(),
        });
        let watcher = start_watcher(&inner).map_err(|e| fail("watch", e))?;
        Ok(Self {
            pr: Arc::new(RbdPrStore {
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

/// Reservation state in a RADOS object next to the image (`ipsan.pr.<image id>` in the
/// image's pool and namespace), shared by every gateway serving the image: the object holds
/// `<version>\n` and [`PrState::encode`]'s text, its `ipsan.ver` xattr the version.
/// [`PrStore::store`] is one RADOS write op (compare the xattr, write all, set the xattr),
/// atomic in the OSD, then a notify every gateway's watch acknowledges by dropping its
/// cached copy; [`PrStore::current`] serves the cached copy for at most
/// [`PR_CACHE_TTL`] (docs/rbd.md).
struct RbdPrStore {
    inner: Arc<Inner>,
}

struct PrCached {
    state: Arc<PrState>,
    /// When the read that produced it was issued.
    read_at: std::time::Instant,
    /// The notification epoch before that read.
    epoch: u64,
}

impl fmt::Debug for RbdPrStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdPrStore")
            .field("object", &self.inner.pr_oid)
            .finish_non_exhaustive()
    }
}

impl PrStore for RbdPrStore {
    /// The cached state while it is current (same notification epoch, younger than
    /// [`PR_CACHE_TTL`]); else waits up to [`PR_WAIT`] for the refresher, so a command never
    /// blocks on an unreachable cluster (it fails with NOT READY instead).
    fn current(&self) -> io::Result<Arc<PrState>> {
        let c = &self.inner.pr_cache;
        let deadline = std::time::Instant::now() + PR_WAIT;
        let mut g = c.m.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let epoch = self.inner.events.pr_epoch.load(Ordering::Acquire);
            if let Some(e) = &g.entry {
                if e.epoch == epoch && e.read_at.elapsed() < PR_CACHE_TTL {
                    return Ok(e.state.clone());
                }
            }
            let now = std::time::Instant::now();
            let stuck = g.refreshing_since.is_some_and(|t| now - t > PR_WAIT);
            if stuck || now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the reservation state could not be read in time",
                ));
            }
            if g.refreshing_since.is_none() {
                if let Some((kind, code, msg)) = &g.error {
                    // The last refresh failed and none is under way: fail now, retry soon.
                    self.inner.events.wake_pr();
                    return Err(match code {
                        Some(c) => io::Error::from_raw_os_error(*c),
                        None => io::Error::new(*kind, msg.clone()),
                    });
                }
                self.inner.events.wake_pr();
            }
            g = c
                .done
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn load(&self) -> io::Result<(Arc<PrState>, u64)> {
        self.inner.load_pr()
    }

    fn store(&self, new: &PrState, expected: u64) -> io::Result<bool> {
        let version = expected.wrapping_add(1).to_string();
        let mut data = format!("{version}\n").into_bytes();
        data.extend_from_slice(&new.encode());
        if data.len() > PR_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "reservation state too large",
            ));
        }
        let conn = self.inner.conn();
        let old = expected.to_string();
        let expect = (expected > 0).then_some(old.as_bytes());
        if !conn
            .image
            .cas_obj(&self.inner.pr_oid, expect, version.as_bytes(), &data)
            .inspect_err(|e| self.inner.after_error(e))?
        {
            return Ok(false);
        }
        let stored = std::time::Instant::now();
        self.inner.events.pr_epoch.fetch_add(1, Ordering::AcqRel);
        self.inner.events.wake_pr();
        // Every gateway's watch drops its cached copy before acknowledging; without the
        // acknowledgements, wait until any copy older than this change has expired.
        if let Err(e) = conn
            .image
            .notify_obj(&self.inner.pr_oid, PR_NOTIFY_TIMEOUT_MS)
        {
            tracing::warn!(image = %self.inner.path, "rbd: reservation change not acknowledged by every gateway: {e}");
            std::thread::sleep(PR_CACHE_TTL.saturating_sub(stored.elapsed()));
        }
        Ok(true)
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

    fn pr_store(&self) -> Option<Arc<dyn PrStore>> {
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

/// The thin FFI layer: symbol loading, cluster and image handles, and the aio completion
/// trampoline. Everything `unsafe` in the RBD backend lives here.
#[allow(unsafe_code)]
mod ffi {
    use super::*;

    type RadosT = *mut c_void;
    type IoctxT = *mut c_void;
    type ImageT = *mut c_void;
    type CompletionT = *mut c_void;
    type WriteOpT = *mut c_void;
    type RbdCallback = extern "C" fn(CompletionT, *mut c_void);
    type WatchCb2 = extern "C" fn(*mut c_void, u64, u64, u64, *mut c_void, usize);
    type WatchErrCb = extern "C" fn(*mut c_void, u64, c_int);

    /// librados.h: LIBRADOS_CREATE_EXCLUSIVE.
    const CREATE_EXCLUSIVE: c_int = 1;
    /// librados.h: LIBRADOS_CMPXATTR_OP_EQ.
    const CMPXATTR_OP_EQ: u8 = 1;
    type UpdateCallback = extern "C" fn(*mut c_void);

    /// `rbd_image_info_t` (librbd.h, unchanged since the first release).
    #[repr(C)]
    struct ImageInfo {
        size: u64,
        obj_size: u64,
        num_objs: u64,
        order: c_int,
        block_name_prefix: [c_char; 24],
        parent_pool: i64,
        parent_name: [c_char; 96],
    }

    /// The librados/librbd entry points we use, resolved once per process.
    pub(super) struct Lib {
        rados_create: unsafe extern "C" fn(*mut RadosT, *const c_char) -> c_int,
        rados_conf_read_file: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
        rados_conf_parse_env: unsafe extern "C" fn(RadosT, *const c_char) -> c_int,
        rados_conf_set: unsafe extern "C" fn(RadosT, *const c_char, *const c_char) -> c_int,
        rados_connect: unsafe extern "C" fn(RadosT) -> c_int,
        rados_shutdown: unsafe extern "C" fn(RadosT),
        rados_cluster_fsid: unsafe extern "C" fn(RadosT, *mut c_char, usize) -> c_int,
        rados_ioctx_create: unsafe extern "C" fn(RadosT, *const c_char, *mut IoctxT) -> c_int,
        rados_ioctx_destroy: unsafe extern "C" fn(IoctxT),
        rados_ioctx_set_namespace: unsafe extern "C" fn(IoctxT, *const c_char),
        rados_ioctx_get_id: unsafe extern "C" fn(IoctxT) -> i64,
        rados_read: unsafe extern "C" fn(IoctxT, *const c_char, *mut c_char, usize, u64) -> c_int,
        rados_create_write_op: unsafe extern "C" fn() -> WriteOpT,
        rados_release_write_op: unsafe extern "C" fn(WriteOpT),
        rados_write_op_create: unsafe extern "C" fn(WriteOpT, c_int, *const c_char),
        rados_write_op_cmpxattr:
            unsafe extern "C" fn(WriteOpT, *const c_char, u8, *const c_char, usize),
        rados_write_op_setxattr:
            unsafe extern "C" fn(WriteOpT, *const c_char, *const c_char, usize),
        rados_write_op_write_full: unsafe extern "C" fn(WriteOpT, *const c_char, usize),
        rados_write_op_operate: unsafe extern "C" fn(
            WriteOpT,
            IoctxT,
            *const c_char,
            *mut libc::time_t,
            c_int,
        ) -> c_int,
        rados_watch2: unsafe extern "C" fn(
            IoctxT,
            *const c_char,
            *mut u64,
            WatchCb2,
            WatchErrCb,
            *mut c_void,
        ) -> c_int,
        rados_unwatch2: unsafe extern "C" fn(IoctxT, u64) -> c_int,
        rados_watch_flush: unsafe extern "C" fn(RadosT) -> c_int,
        rados_notify2: unsafe extern "C" fn(
            IoctxT,
            *const c_char,
            *const c_char,
            c_int,
            u64,
            *mut *mut c_char,
            *mut usize,
        ) -> c_int,
        rados_notify_ack:
            unsafe extern "C" fn(IoctxT, *const c_char, u64, u64, *const c_char, c_int) -> c_int,
        rados_buffer_free: unsafe extern "C" fn(*mut c_char),
        rbd_open: unsafe extern "C" fn(IoctxT, *const c_char, *mut ImageT, *const c_char) -> c_int,
        rbd_close: unsafe extern "C" fn(ImageT) -> c_int,
        rbd_stat: unsafe extern "C" fn(ImageT, *mut ImageInfo, usize) -> c_int,
        rbd_get_size: unsafe extern "C" fn(ImageT, *mut u64) -> c_int,
        rbd_get_id: unsafe extern "C" fn(ImageT, *mut c_char, usize) -> c_int,
        rbd_update_watch:
            unsafe extern "C" fn(ImageT, *mut u64, UpdateCallback, *mut c_void) -> c_int,
        rbd_update_unwatch: unsafe extern "C" fn(ImageT, u64) -> c_int,
        rbd_aio_create_completion:
            unsafe extern "C" fn(*mut c_void, RbdCallback, *mut CompletionT) -> c_int,
        rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
        rbd_aio_release: unsafe extern "C" fn(CompletionT),
        rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
        rbd_aio_write:
            unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
        rbd_aio_flush: unsafe extern "C" fn(ImageT, CompletionT) -> c_int,
        rbd_aio_write_zeroes:
            unsafe extern "C" fn(ImageT, u64, usize, CompletionT, c_int, c_int) -> c_int,
        rbd_aio_compare_and_write: unsafe extern "C" fn(
            ImageT,
            u64,
            usize,
            *const c_char,
            *const c_char,
            CompletionT,
            *mut u64,
            c_int,
        ) -> isize,
    }

    static LIB: OnceLock<Result<Lib, String>> = OnceLock::new();

    /// librbd, loaded on first use.
    pub(super) fn lib() -> io::Result<&'static Lib> {
        LIB.get_or_init(load)
            .as_ref()
            .map_err(|e| io::Error::new(io::ErrorKind::Unsupported, e.clone()))
    }

    fn dlerror() -> String {
        // SAFETY: dlerror returns NULL or a NUL-terminated string owned by libc, valid until
        // the next dl* call on this thread; we copy it at once.
        let p = unsafe { libc::dlerror() };
        if p.is_null() {
            return "unknown error".into();
        }
        // SAFETY: p is non-NULL and NUL-terminated (above).
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }

    fn open_lib(name: &CStr) -> Result<*mut c_void, String> {
        // SAFETY: dlopen takes a NUL-terminated name; loading librados/librbd runs their
        // static constructors, which have no preconditions.
        let h = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if h.is_null() {
            Err(format!(
                "RBD is unavailable: cannot load {} ({}); install Debian's librbd1 (apt-get install librbd1)",
                name.to_string_lossy(),
                dlerror()
            ))
        } else {
            Ok(h)
        }
    }

    /// Reinterprets a symbol address as the function pointer type `F`.
    ///
    /// # Safety
    /// `p` must be the address of a function whose ABI and signature are exactly `F`.
    unsafe fn fn_from<F: Copy>(p: *mut c_void) -> F {
        const { assert!(std::mem::size_of::<F>() == std::mem::size_of::<*mut c_void>()) };
        // SAFETY: same size (checked at compile time); the caller vouches for the type.
        unsafe { std::mem::transmute_copy::<*mut c_void, F>(&p) }
    }

    fn load() -> Result<Lib, String> {
        let rados = open_lib(c"librados.so.2")?;
        let rbd = open_lib(c"librbd.so.1")?;
        macro_rules! sym {
            ($h:expr, $name:ident) => {{
                let n = concat!(stringify!($name), "\0");
                // SAFETY: `n` is NUL-terminated and `$h` a live handle from dlopen (never
                // closed: the library stays loaded for the life of the process).
                let p = unsafe { libc::dlsym($h, n.as_ptr().cast()) };
                if p.is_null() {
                    return Err(format!(
                        "RBD is unavailable: symbol {} missing ({}); librbd too old (ipsan needs Ceph 16 or later)",
                        stringify!($name),
                        dlerror()
                    ));
                }
                // SAFETY: the symbol is the C function declared in librados.h/librbd.h
                // with exactly the signature of the field it is stored in.
                unsafe { fn_from(p) }
            }};
        }
        Ok(Lib {
            rados_create: sym!(rados, rados_create),
            rados_conf_read_file: sym!(rados, rados_conf_read_file),
            rados_conf_parse_env: sym!(rados, rados_conf_parse_env),
            rados_conf_set: sym!(rados, rados_conf_set),
            rados_connect: sym!(rados, rados_connect),
            rados_shutdown: sym!(rados, rados_shutdown),
            rados_cluster_fsid: sym!(rados, rados_cluster_fsid),
            rados_ioctx_create: sym!(rados, rados_ioctx_create),
            rados_ioctx_destroy: sym!(rados, rados_ioctx_destroy),
            rados_ioctx_set_namespace: sym!(rados, rados_ioctx_set_namespace),
            rados_ioctx_get_id: sym!(rados, rados_ioctx_get_id),
            rados_read: sym!(rados, rados_read),
            rados_create_write_op: sym!(rados, rados_create_write_op),
            rados_release_write_op: sym!(rados, rados_release_write_op),
            rados_write_op_create: sym!(rados, rados_write_op_create),
            rados_write_op_cmpxattr: sym!(rados, rados_write_op_cmpxattr),
            rados_write_op_setxattr: sym!(rados, rados_write_op_setxattr),
            rados_write_op_write_full: sym!(rados, rados_write_op_write_full),
            rados_write_op_operate: sym!(rados, rados_write_op_operate),
            rados_watch2: sym!(rados, rados_watch2),
            rados_unwatch2: sym!(rados, rados_unwatch2),
            rados_watch_flush: sym!(rados, rados_watch_flush),
            rados_notify2: sym!(rados, rados_notify2),
            rados_notify_ack: sym!(rados, rados_notify_ack),
            rados_buffer_free: sym!(rados, rados_buffer_free),
            rbd_open: sym!(rbd, rbd_open),
            rbd_close: sym!(rbd, rbd_close),
            rbd_stat: sym!(rbd, rbd_stat),
            rbd_get_size: sym!(rbd, rbd_get_size),
            rbd_get_id: sym!(rbd, rbd_get_id),
            rbd_update_watch: sym!(rbd, rbd_update_watch),
            rbd_update_unwatch: sym!(rbd, rbd_update_unwatch),
            rbd_aio_create_completion: sym!(rbd, rbd_aio_create_completion),
            rbd_aio_get_return_value: sym!(rbd, rbd_aio_get_return_value),
            rbd_aio_release: sym!(rbd, rbd_aio_release),
            rbd_aio_read: sym!(rbd, rbd_aio_read),
            rbd_aio_write: sym!(rbd, rbd_aio_write),
            rbd_aio_flush: sym!(rbd, rbd_aio_flush),
            rbd_aio_write_zeroes: sym!(rbd, rbd_aio_write_zeroes),
            rbd_aio_compare_and_write: sym!(rbd, rbd_aio_compare_and_write),
        })
    }

    fn errno(r: i64) -> io::Error {
        let code = i32::try_from(-r).unwrap_or(libc::EIO);
        io::Error::from_raw_os_error(code)
    }

    fn check(r: c_int) -> io::Result<()> {
        if r < 0 {
            Err(errno(i64::from(r)))
        } else {
            Ok(())
        }
    }

    fn cstring(what: &str, s: &str) -> io::Result<CString> {
        CString::new(s).map_err(|_| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{what} contains a NUL byte"),
            )
        })
    }

    /// A connected `rados_t`.
    pub(super) struct Cluster {
        lib: &'static Lib,
        handle: RadosT,
    }

    // SAFETY: librados handles are documented thread-safe (librados.h: "the rados_t ...
    // may be used from multiple threads"); we only pass the pointer to librados.
    unsafe impl Send for Cluster {}
    // SAFETY: as above.
    unsafe impl Sync for Cluster {}

    impl Cluster {
        pub(super) fn connect(
            lib: &'static Lib,
            conf: Option<&std::path::Path>,
            id: Option<&str>,
            options: &[(String, String)],
        ) -> io::Result<Self> {
            let id = id.map(|s| cstring("ceph id", s)).transpose()?;
            let mut handle: RadosT = std::ptr::null_mut();
            // SAFETY: `handle` is a valid out-pointer; `id` is NULL or NUL-terminated and
            // outlives the call.
            check(unsafe {
                (lib.rados_create)(
                    &mut handle,
                    id.as_ref().map_or(std::ptr::null(), |c| c.as_ptr()),
                )
            })?;
            let c = Cluster { lib, handle };
            let conf_c = conf
                .map(|p| cstring("ceph conf path", &p.display().to_string()))
                .transpose()?;
            // SAFETY: handle was created above and not shut down; the path is NULL (search
            // CEPH_CONF and the default locations) or NUL-terminated.
            let r = unsafe {
                (lib.rados_conf_read_file)(
                    c.handle,
                    conf_c.as_ref().map_or(std::ptr::null(), |p| p.as_ptr()),
                )
            };
            if r < 0 {
                let where_ = conf.map_or_else(
                    || "CEPH_CONF or /etc/ceph/ceph.conf".to_owned(),
                    |p| p.display().to_string(),
                );
                return Err(io::Error::new(
                    errno(i64::from(r)).kind(),
                    format!("reading {where_}: {}", errno(i64::from(r))),
                ));
            }
            // SAFETY: valid handle; NULL means the CEPH_ARGS variable.
            check(unsafe { (lib.rados_conf_parse_env)(c.handle, std::ptr::null()) })?;
            for (k, v) in options {
                let (kc, vc) = (cstring("option", k)?, cstring("option value", v)?);
                // SAFETY: valid handle, both strings NUL-terminated and alive for the call.
                let r = unsafe { (lib.rados_conf_set)(c.handle, kc.as_ptr(), vc.as_ptr()) };
                if r < 0 {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("option {k}={v}: {}", errno(i64::from(r))),
                    ));
                }
            }
            // SAFETY: valid, configured, not yet connected handle. Blocks up to
            // client_mount_timeout.
            let r = unsafe { (lib.rados_connect)(c.handle) };
            if r < 0 {
                let e = errno(i64::from(r));
                return Err(io::Error::new(
                    e.kind(),
                    format!("{e} (is the cluster up, and the id/keyring right?)"),
                ));
            }
            Ok(c)
        }
    }

    impl Drop for Cluster {
        fn drop(&mut self) {
            // SAFETY: the handle is valid and every ioctx/image using it was dropped first
            // (they hold an Arc<Cluster>).
            unsafe { (self.lib.rados_shutdown)(self.handle) }
        }
    }

    /// An open `rbd_image_t` with its `rados_ioctx_t`.
    pub(super) struct Image {
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
    pub(super) struct WatchHandle {
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
    pub(super) struct ObjWatch {
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
        pub(super) fn open(
            cluster: Arc<Cluster>,
            pool: &str,
            namespace: Option<&str>,
            image: &str,
        ) -> io::Result<Self> {
            let lib = cluster.lib;
            let pool_c = cstring("pool", pool)?;
            let mut ioctx: IoctxT = std::ptr::null_mut();
            // SAFETY: connected cluster handle, NUL-terminated name, valid out-pointer.
            let r =
                unsafe { (lib.rados_ioctx_create)(cluster.handle, pool_c.as_ptr(), &mut ioctx) };
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
            let r =
                unsafe { (lib.rbd_open)(ioctx, name_c.as_ptr(), &mut handle, std::ptr::null()) };
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
        pub(super) fn stat(&self) -> io::Result<(u64, u64)> {
            // SAFETY: ImageInfo is plain integers and arrays: all-zero is a valid value.
            let mut info: ImageInfo = unsafe { std::mem::zeroed() };
            // SAFETY: valid image; `info` is a writable rbd_image_info_t of the size passed.
            check(unsafe {
                (self.lib.rbd_stat)(self.handle, &mut info, std::mem::size_of::<ImageInfo>())
            })?;
            Ok((info.size, info.obj_size))
        }

        pub(super) fn size(&self) -> io::Result<u64> {
            let mut n = 0u64;
            // SAFETY: valid image, valid out-pointer.
            check(unsafe { (self.lib.rbd_get_size)(self.handle, &mut n) })?;
            Ok(n)
        }

        pub(super) fn id(&self) -> io::Result<String> {
            let mut buf = [0 as c_char; 128];
            // SAFETY: valid image; librbd writes at most `buf.len()` bytes, NUL-terminated.
            check(unsafe { (self.lib.rbd_get_id)(self.handle, buf.as_mut_ptr(), buf.len()) })?;
            // SAFETY: NUL-terminated within `buf` on success.
            Ok(unsafe { CStr::from_ptr(buf.as_ptr()) }
                .to_string_lossy()
                .into_owned())
        }

        pub(super) fn pool_id(&self) -> i64 {
            // SAFETY: valid ioctx.
            unsafe { (self.lib.rados_ioctx_get_id)(self.ioctx) }
        }

        pub(super) fn cluster_fsid(&self) -> Option<String> {
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

        pub(super) fn update_watch(&self, f: WatchFn) -> io::Result<WatchHandle> {
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

        pub(super) fn update_unwatch(&self, w: WatchHandle) {
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
        pub(super) fn read_obj(&self, oid: &str, max: usize) -> io::Result<Option<Vec<u8>>> {
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
        pub(super) fn cas_obj(
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
                    None => {
                        (self.lib.rados_write_op_create)(op, CREATE_EXCLUSIVE, std::ptr::null())
                    }
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
        pub(super) fn watch_obj(&self, oid: &str, f: ObjWatchFn) -> io::Result<ObjWatch> {
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

        pub(super) fn unwatch_obj(&self, w: ObjWatch) {
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
        pub(super) fn notify_obj(&self, oid: &str, timeout_ms: u64) -> io::Result<()> {
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
        pub(super) fn aio(&self, req: IoRequest, done: Completer) {
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
                                (lib.rbd_aio_write_zeroes)(self.handle, *offset, l, comp, 0, 0)
                                    .into()
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
