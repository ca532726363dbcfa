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
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::Duration;

use crate::aio::{Completer, Engine, IoCompletion, IoError, IoOp, IoRequest};
use crate::backend::{Backend, BackendError};

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
/// would be stale for reads through another (docs/rbd.md).
const DEFAULT_OPTIONS: [(&str, &str); 4] = [
    ("rbd_cache", "false"),
    ("rados_osd_op_timeout", "30"),
    ("rados_mon_op_timeout", "30"),
    ("client_mount_timeout", "30"),
];

/// An open RBD image.
pub struct RbdBackend {
    image: Arc<ffi::Image>,
    path: String,
    identity: String,
    obj_size: u64,
    size: Arc<AtomicU64>,
    watcher: Option<Watcher>,
    /// Whether the last completion said the cluster cannot be reached (logged on change).
    unreachable: Arc<AtomicBool>,
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
            .field("image", &self.path)
            .field("size", &self.size.load(Ordering::Relaxed))
            .field("obj_size", &self.obj_size)
            .finish_non_exhaustive()
    }
}

/// Refreshes the cached size when librbd's header watch fires (and every few seconds, in
/// case a notification was lost while the cluster was away).
struct Watcher {
    wake: Arc<(Mutex<bool>, Condvar)>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    handle: Option<ffi::WatchHandle>,
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
        let cluster =
            ffi::Cluster::connect(lib, spec.conf.as_deref(), spec.id.as_deref(), &options)
                .map_err(|e| fail("connect to the Ceph cluster for", e))?;
        let image = ffi::Image::open(
            Arc::new(cluster),
            &spec.pool,
            spec.namespace.as_deref(),
            &spec.image,
        )
        .map_err(|e| fail("open", e))?;
        let image = Arc::new(image);
        let (size, obj_size) = image.stat().map_err(|e| fail("stat", e))?;
        let identity = format!(
            "rbd:{}/{}/{}",
            image.cluster_fsid().unwrap_or_default(),
            image.pool_id(),
            image.id().map_err(|e| fail("get id of", e))?
        );
        let size = Arc::new(AtomicU64::new(size));
        let mut b = Self {
            image,
            path,
            identity,
            obj_size,
            size,
            watcher: None,
            unreachable: Arc::new(AtomicBool::new(false)),
        };
        b.watcher = Some(b.start_watcher().map_err(|e| fail("watch", e))?);
        Ok(b)
    }

    fn start_watcher(&self) -> io::Result<Watcher> {
        let wake = Arc::new((Mutex::new(false), Condvar::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let w = wake.clone();
        let handle = self.image.update_watch(Box::new(move || {
            let (m, c) = &*w;
            *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
            c.notify_one();
        }))?;
        let (image, size, wk, st, path) = (
            self.image.clone(),
            self.size.clone(),
            wake.clone(),
            stop.clone(),
            self.path.clone(),
        );
        let thread = std::thread::Builder::new()
            .name("rbd-watch".into())
            .spawn(move || {
                while !st.load(Ordering::Acquire) {
                    {
                        let (m, c) = &*wk;
                        let g = m.lock().unwrap_or_else(|p| p.into_inner());
                        let (mut g, _) = c
                            .wait_timeout_while(g, SIZE_POLL, |n| !*n)
                            .unwrap_or_else(|p| p.into_inner());
                        *g = false;
                    }
                    if st.load(Ordering::Acquire) {
                        break;
                    }
                    match image.size() {
                        Ok(n) => {
                            let old = size.swap(n, Ordering::AcqRel);
                            if old != n {
                                tracing::info!(image = %path, old, new = n, "rbd: image resized");
                            }
                        }
                        Err(e) => tracing::warn!(image = %path, "rbd: cannot read size: {e}"),
                    }
                }
            })?;
        Ok(Watcher {
            wake,
            stop,
            thread: Some(thread),
            handle: Some(handle),
        })
    }

    /// The RBD object size in bytes.
    pub fn object_size(&self) -> u64 {
        self.obj_size
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
        let (down, path) = (self.unreachable.clone(), self.path.clone());
        self.image.aio(
            req,
            Box::new(move |c| {
                note_reachability(&down, &path, &c);
                done(c)
            }),
        );
    }
}

impl Drop for RbdBackend {
    fn drop(&mut self) {
        if let Some(mut w) = self.watcher.take() {
            w.stop.store(true, Ordering::Release);
            {
                let (m, c) = &*w.wake;
                *m.lock().unwrap_or_else(|p| p.into_inner()) = true;
                c.notify_one();
            }
            if let Some(t) = w.thread.take() {
                let _ = t.join();
            }
            if let Some(h) = w.handle.take() {
                self.image.update_unwatch(h);
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
        self.size.load(Ordering::Acquire)
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
        Some(self.obj_size)
    }

    fn identity(&self) -> Option<String> {
        Some(self.identity.clone())
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
    type RbdCallback = extern "C" fn(CompletionT, *mut c_void);
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
            // unaliased until then. Lengths passed match the buffers.
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
            // callbacks need nothing from this struct) before returning.
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
