//! The thin FFI layer: librados and librbd loaded with `dlopen` (ipsan builds without
//! `librbd-dev`), their symbols resolved once per process ([`Lib`]), and the cluster handle
//! ([`Cluster`]). The image handle, watches and the aio completion trampoline are in
//! [`image`]. Everything `unsafe` in the RBD backend lives in these two files, each block
//! with its `// SAFETY:` reason (the parent module opts in with `#[allow(unsafe_code)]`).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::sync::OnceLock;

mod image;

pub(super) use image::{Image, ObjWatch, WatchHandle};
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
    rados_write_op_setxattr: unsafe extern "C" fn(WriteOpT, *const c_char, *const c_char, usize),
    rados_write_op_write_full: unsafe extern "C" fn(WriteOpT, *const c_char, usize),
    rados_write_op_operate:
        unsafe extern "C" fn(WriteOpT, IoctxT, *const c_char, *mut libc::time_t, c_int) -> c_int,
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
    rbd_update_watch: unsafe extern "C" fn(ImageT, *mut u64, UpdateCallback, *mut c_void) -> c_int,
    rbd_update_unwatch: unsafe extern "C" fn(ImageT, u64) -> c_int,
    rbd_aio_create_completion:
        unsafe extern "C" fn(*mut c_void, RbdCallback, *mut CompletionT) -> c_int,
    rbd_aio_get_return_value: unsafe extern "C" fn(CompletionT) -> isize,
    rbd_aio_release: unsafe extern "C" fn(CompletionT),
    rbd_aio_read: unsafe extern "C" fn(ImageT, u64, usize, *mut c_char, CompletionT) -> c_int,
    rbd_aio_write: unsafe extern "C" fn(ImageT, u64, usize, *const c_char, CompletionT) -> c_int,
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
