//! Storage backends behind one trait: `mem` (sparse RAM), `file` (sparse file or block
//! device, pread/pwrite, optional O_DIRECT) and `null` (Aiken et al.'s diskless target:
//! writes are discarded, reads return zeros — the protocol's cost without a disk).
//!
//! A backend is addressed in bytes; the logical unit (`lu.rs`) turns LBAs into offsets and
//! checks ranges before calling in, so backends only guard against their own size.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, RwLock};

use bytes::BytesMut;

use crate::aio::{Completer, Engine, IoRequest};

/// Allocation state of the extent starting at an offset (used by GET LBA STATUS).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Extent {
    /// `true`: backed by storage; `false`: deallocated (reads return zeros).
    pub mapped: bool,
    /// Length in bytes of the run with this state, starting at the queried offset.
    pub len: u64,
}

/// One block store. Implementations are shared by all commands of a logical unit and are
/// called concurrently from several threads.
pub trait Backend: Send + Sync + fmt::Debug {
    /// Size in bytes.
    fn size(&self) -> u64;
    /// Fills `buf` from `offset`.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
    /// Appends `len` bytes from `offset` to `buf` (the device server's Data-In buffer); on
    /// error `buf` is left as it was. The default zero-fills the space and calls
    /// [`Backend::read_at`]; a memory backend copies straight in, sparing a 1 MiB read a
    /// 1 MiB memset.
    fn read_append(&self, buf: &mut BytesMut, len: usize, offset: u64) -> io::Result<()> {
        let at = buf.len();
        buf.resize(at + len, 0);
        let r = self.read_at(&mut buf[at..], offset);
        if r.is_err() {
            buf.truncate(at);
        }
        r
    }
    /// Writes `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Makes every completed write stable (fdatasync for files).
    fn flush(&self) -> io::Result<()>;
    /// Deallocates a range; later reads of it return zeros.
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()>;
    /// Writes zeros over a range (allocating it).
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        let zeros = vec![0u8; (len.min(1 << 20)) as usize];
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(zeros.len() as u64) as usize;
            self.write_at(&zeros[..n], offset + done)?;
            done += n as u64;
        }
        Ok(())
    }
    /// Grows the store to `size` bytes online (a LUN resize). Stores that cannot grow say so.
    fn grow(&self, size: u64) -> io::Result<()> {
        let _ = size;
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("a {} backend cannot be resized online", self.kind()),
        ))
    }
    /// Short name: `mem`, `file`, `null`.
    fn kind(&self) -> &'static str;
    /// Whether [`Backend::unmap`] really deallocates.
    fn supports_unmap(&self) -> bool;
    /// Allocation state of the run starting at `offset` (GET LBA STATUS, SBC-4 §5.7).
    /// The default says "all mapped".
    fn extent(&self, offset: u64) -> io::Result<Extent> {
        Ok(Extent {
            mapped: true,
            len: self.size().saturating_sub(offset),
        })
    }
    /// How commands on this store should run (see [`crate::aio`]). The default is the
    /// blocking pool.
    fn engine(&self) -> Engine {
        Engine::Blocking
    }
    /// Starts a request; `done` is called exactly once, from any thread, possibly before
    /// this returns. The default runs it at once with the blocking methods above; an
    /// [`Engine::Async`] store queues it and completes from its own completion thread.
    fn submit(&self, req: IoRequest, done: Completer) {
        done(crate::aio::run_blocking(self, req));
    }
    /// The store's natural I/O unit in bytes (RBD's object size), advertised as OPTIMAL
    /// TRANSFER LENGTH GRANULARITY and OPTIMAL UNMAP GRANULARITY; `None` keeps the LU's
    /// defaults.
    fn granularity(&self) -> Option<u64> {
        None
    }
    /// A name for the stored data that is the same wherever it is opened from (an RBD
    /// image's cluster, pool and image id): two targets exporting it derive the same device
    /// identity (VPD 80h/83h) from it, so multipath sees one disk. `None` for local stores.
    fn identity(&self) -> Option<String> {
        None
    }
    /// The most bytes one atomic compare-and-write may cover, when the store limits it
    /// (librbd 16 takes exactly one 512-byte sector); `None`: no limit of its own.
    fn max_compare_and_write(&self) -> Option<u64> {
        None
    }
    /// Where a store that other targets may serve too keeps SCSI reservations, so that all
    /// of them see one state (RBD: an object next to the image). `None`: the target's
    /// memory — and a store with an [`Backend::identity`] then refuses reservations.
    fn pr_store(&self) -> Option<Arc<dyn crate::pr::PrStore>> {
        None
    }
}

fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} beyond backend size {size}"),
        )),
    }
}

/// Errors opening a backend or parsing its spec.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BackendError {
    /// The spec string is malformed.
    #[error("invalid backend spec {spec:?}: {reason}")]
    Spec {
        /// The offending spec (contains no secrets).
        spec: String,
        /// What is wrong, with an example of what is expected.
        reason: String,
    },
    /// An I/O error while opening or sizing the backing store.
    #[error("{op} {path}: {source}")]
    Io {
        /// What we were doing.
        op: &'static str,
        /// The path involved.
        path: String,
        /// The OS error.
        #[source]
        source: io::Error,
    },
}

/// What kind of store a spec names.
#[derive(Clone, PartialEq, Eq, Debug)]
pub enum BackendKind {
    /// Sparse RAM store.
    Mem,
    /// Regular file (created sparse if missing) or block device.
    File {
        /// Path of the file or device.
        path: PathBuf,
        /// Open with O_DIRECT (bypass the page cache).
        direct: bool,
    },
    /// Discards writes, reads zeros.
    Null,
    /// A Ceph RBD image (`rbd:pool/image`), through librbd loaded at run time.
    Rbd(crate::rbd::RbdSpec),
}

/// A parsed backend spec: `mem:256MiB`, `file:/path/disk.img,size=10GiB[,direct][,bs=4096]`,
/// `null:1TiB[,bs=4096]`, `rbd:pool/image[,conf=/etc/ceph/ceph.conf][,id=admin]
/// [,keyring=PATH][,<librados option>=<value>...][,bs=4096]`.
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct BackendSpec {
    /// The store.
    pub kind: BackendKind,
    /// Size in bytes; required for `mem` and `null`, and for `file` when the file is new.
    pub size: Option<u64>,
    /// Suggested logical block size (`bs=`), 512 or 4096.
    pub block_size: Option<u32>,
}

/// A backend spec's size (`256MiB`, `10GiB`): the grammar every ipsan size uses.
pub fn parse_size(s: &str) -> Result<u64, String> {
    ipsan_units::parse_size(s).map_err(|e| e.to_string())
}

impl FromStr for BackendSpec {
    type Err = BackendError;

    fn from_str(spec: &str) -> Result<Self, Self::Err> {
        let err = |reason: String| BackendError::Spec {
            spec: spec.to_string(),
            reason,
        };
        let (kind, rest) = spec.split_once(':').ok_or_else(|| {
            err(
                "expected <kind>:<args>, e.g. mem:256MiB, file:/path,size=10GiB or null:1TiB"
                    .into(),
            )
        })?;
        let mut parts = rest.split(',');
        let first = parts.next().unwrap_or("");
        let mut size = None;
        let mut block_size = None;
        let mut direct = false;
        let mut kind = match kind {
            "mem" | "null" => {
                size = Some(parse_size(first).map_err(|e| err(format!("size: {e}")))?);
                if kind == "mem" {
                    BackendKind::Mem
                } else {
                    BackendKind::Null
                }
            }
            "rbd" => BackendKind::Rbd(crate::rbd::RbdSpec::parse_path(first).map_err(err)?),
            "file" => {
                if first.is_empty() {
                    return Err(err(
                        "file: expected a path, e.g. file:/var/lib/disk.img".into()
                    ));
                }
                BackendKind::File {
                    path: PathBuf::from(first),
                    direct: false,
                }
            }
            other => {
                return Err(err(format!(
                    "unknown backend kind {other:?} (expected mem, file, null or rbd)"
                )))
            }
        };
        for opt in parts {
            let (k, v) = match opt.split_once('=') {
                Some((k, v)) => (k, Some(v)),
                None => (opt, None),
            };
            match (k, v) {
                ("size", Some(v)) if !matches!(kind, BackendKind::Rbd(_)) => {
                    size = Some(parse_size(v).map_err(|e| err(format!("size: {e}")))?)
                }
                ("bs", Some(v)) => {
                    let bs: u32 = v
                        .parse()
                        .map_err(|_| err(format!("bs: {v:?} is not a number (512 or 4096)")))?;
                    if bs != 512 && bs != 4096 {
                        return Err(err(format!("bs: {bs} unsupported (512 or 4096)")));
                    }
                    block_size = Some(bs);
                }
                ("direct", None) if matches!(kind, BackendKind::File { .. }) => direct = true,
                ("size", _) if matches!(kind, BackendKind::Rbd(_)) => {
                    return Err(err(
                        "rbd: the LUN's size is the image's (grow it with `rbd resize`)".into(),
                    ))
                }
                (k, Some(v)) if matches!(kind, BackendKind::Rbd(_)) => {
                    if let BackendKind::Rbd(r) = &mut kind {
                        match k {
                            "conf" => r.conf = Some(PathBuf::from(v)),
                            "id" => r.id = Some(v.to_owned()),
                            "keyring" => r.keyring = Some(PathBuf::from(v)),
                            _ => r.options.push((k.to_owned(), v.to_owned())),
                        }
                    }
                }
                _ => return Err(err(format!("unknown option {opt:?}"))),
            }
        }
        let kind = match kind {
            BackendKind::File { path, .. } => BackendKind::File { path, direct },
            k => k,
        };
        if size == Some(0) {
            return Err(err("size: must be greater than zero".into()));
        }
        if let Some(sz) = size {
            if sz % 512 != 0 {
                return Err(err(format!("size: {sz} is not a multiple of 512 bytes")));
            }
        }
        Ok(BackendSpec {
            kind,
            size,
            block_size,
        })
    }
}

/// Opens (creating a sparse file if needed) the store a spec names.
pub fn open(spec: &BackendSpec) -> Result<Arc<dyn Backend>, BackendError> {
    let need_size = |what: &str| BackendError::Spec {
        spec: format!("{what}:"),
        reason: "size: required, e.g. 256MiB".into(),
    };
    match &spec.kind {
        BackendKind::Mem => Ok(Arc::new(MemBackend::new(
            spec.size.ok_or_else(|| need_size("mem"))?,
        ))),
        BackendKind::Null => Ok(Arc::new(NullBackend::new(
            spec.size.ok_or_else(|| need_size("null"))?,
        ))),
        BackendKind::File { path, direct } => Ok(Arc::new(FileBackend::open(
            path.clone(),
            spec.size,
            *direct,
        )?)),
        BackendKind::Rbd(r) => Ok(Arc::new(crate::rbd::RbdBackend::open(r)?)),
    }
}

// ---------------------------------------------------------------------------------------
// mem

const CHUNK: usize = 1 << 20;

/// Sparse RAM store: 1 MiB chunks allocated on first write, so `mem:64GiB` costs nothing
/// until written. Unmapping a whole chunk frees it.
pub struct MemBackend {
    size: u64,
    chunks: Box<[Chunk]>,
}

/// One 1 MiB page of a [`MemBackend`]; `None` until first written.
type Chunk = RwLock<Option<Box<[u8]>>>;

impl fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBackend")
            .field("size", &self.size)
            .field("allocated_chunks", &self.allocated_chunks())
            .finish()
    }
}

fn poisoned() -> io::Error {
    io::Error::other("backend lock poisoned")
}

impl MemBackend {
    /// A zero-filled store of `size` bytes.
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK as u64) as usize;
        let chunks = (0..n).map(|_| RwLock::new(None)).collect();
        Self { size, chunks }
    }

    /// Number of 1 MiB chunks currently holding memory.
    pub fn allocated_chunks(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| c.read().map(|g| g.is_some()).unwrap_or(false))
            .count()
    }

    /// Calls `f(chunk index, offset in chunk, range in caller's buffer)` for each chunk
    /// piece of `[offset, offset+len)`.
    fn spans(
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let idx = (pos / CHUNK as u64) as usize;
            let in_chunk = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - in_chunk).min((len - done) as usize);
            f(idx, in_chunk, done as usize..done as usize + n)?;
            done += n as u64;
        }
        Ok(())
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::spans(offset, buf.len() as u64, |idx, at, r| {
            let g = self.chunks[idx].read().map_err(|_| poisoned())?;
            let n = r.len();
            match g.as_ref() {
                Some(c) => buf[r].copy_from_slice(&c[at..at + n]),
                None => buf[r].fill(0),
            }
            Ok(())
        })
    }

    fn read_append(&self, buf: &mut BytesMut, len: usize, offset: u64) -> io::Result<()> {
        check_range(self.size, offset, len as u64)?;
        let start = buf.len();
        buf.reserve(len);
        let r = Self::spans(offset, len as u64, |idx, at, r| {
            let g = self.chunks[idx].read().map_err(|_| poisoned())?;
            match g.as_ref() {
                Some(c) => buf.extend_from_slice(&c[at..at + r.len()]),
                None => buf.resize(buf.len() + r.len(), 0),
            }
            Ok(())
        });
        if r.is_err() {
            buf.truncate(start);
        }
        r
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::spans(offset, buf.len() as u64, |idx, at, r| {
            let mut g = self.chunks[idx].write().map_err(|_| poisoned())?;
            let n = r.len();
            let c = g.get_or_insert_with(|| vec![0u8; CHUNK].into_boxed_slice());
            c[at..at + n].copy_from_slice(&buf[r]);
            Ok(())
        })
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        Self::spans(offset, len, |idx, at, r| {
            let mut g = self.chunks[idx].write().map_err(|_| poisoned())?;
            let n = r.len();
            if at == 0 && n == CHUNK {
                *g = None;
            } else if let Some(c) = g.as_mut() {
                // A partly unmapped page stays allocated (zeroed range): scanning the whole
                // page for "all zero" on every small UNMAP made libiscsi's Unmap suite take
                // minutes. OPTIMAL UNMAP GRANULARITY tells initiators to send whole pages.
                c[at..at + n].fill(0);
            }
            Ok(())
        })
    }

    fn kind(&self) -> &'static str {
        "mem"
    }

    fn engine(&self) -> Engine {
        Engine::Inline
    }

    fn supports_unmap(&self) -> bool {
        true
    }

    fn extent(&self, offset: u64) -> io::Result<Extent> {
        check_range(self.size, offset, 0)?;
        let mut idx = (offset / CHUNK as u64) as usize;
        let state = |i: usize| -> io::Result<bool> {
            Ok(self.chunks[i].read().map_err(|_| poisoned())?.is_some())
        };
        if idx >= self.chunks.len() {
            return Ok(Extent {
                mapped: false,
                len: 0,
            });
        }
        let mapped = state(idx)?;
        idx += 1;
        while idx < self.chunks.len() && state(idx)? == mapped {
            idx += 1;
        }
        let end = (idx as u64 * CHUNK as u64).min(self.size);
        Ok(Extent {
            mapped,
            len: end - offset,
        })
    }
}

// ---------------------------------------------------------------------------------------
// null

/// Diskless store (Aiken et al.): writes vanish, reads are zeros, flush is free.
#[derive(Debug)]
pub struct NullBackend {
    size: std::sync::atomic::AtomicU64,
}

impl NullBackend {
    /// A null store that claims `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            size: std::sync::atomic::AtomicU64::new(size),
        }
    }
}

impl Backend for NullBackend {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)
    }
    fn kind(&self) -> &'static str {
        "null"
    }
    fn grow(&self, size: u64) -> io::Result<()> {
        self.size
            .fetch_max(size, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    fn engine(&self) -> Engine {
        Engine::Inline
    }
    fn supports_unmap(&self) -> bool {
        true
    }
    fn extent(&self, offset: u64) -> io::Result<Extent> {
        check_range(self.size(), offset, 0)?;
        Ok(Extent {
            mapped: false,
            len: self.size() - offset,
        })
    }
}

// ---------------------------------------------------------------------------------------
// file

/// Alignment for O_DIRECT transfers (covers 512- and 4096-byte sector devices).
const DIRECT_ALIGN: usize = 4096;

/// File or block-device store using positioned I/O (`pread`/`pwrite`), hole punching for
/// UNMAP and `fdatasync` for flush.
pub struct FileBackend {
    file: File,
    path: PathBuf,
    size: std::sync::atomic::AtomicU64,
    direct: bool,
    regular: bool,
    /// O_DIRECT read-modify-write of a partial aligned block must exclude other writes.
    rmw: RwLock<()>,
}

impl fmt::Debug for FileBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("FileBackend")
            .field("path", &self.path)
            .field("size", &self.size())
            .field("direct", &self.direct)
            .finish()
    }
}

/// A heap buffer whose usable part starts on a [`DIRECT_ALIGN`] boundary (no unsafe: we
/// over-allocate and skip to the first aligned byte).
struct AlignedBuf {
    v: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBuf {
    fn new(len: usize) -> Self {
        let v = vec![0u8; len + DIRECT_ALIGN];
        let start = v.as_ptr().align_offset(DIRECT_ALIGN);
        Self { v, start, len }
    }
    fn as_slice(&self) -> &[u8] {
        &self.v[self.start..self.start + self.len]
    }
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.v[self.start..self.start + self.len]
    }
}

impl FileBackend {
    /// Opens `path`, creating a sparse file of `size` bytes if it does not exist and growing
    /// a smaller regular file to `size`.
    pub fn open(path: PathBuf, size: Option<u64>, direct: bool) -> Result<Self, BackendError> {
        let io_err = |op: &'static str, source: io::Error| BackendError::Io {
            op,
            path: path.display().to_string(),
            source,
        };
        let exists = path.exists();
        if !exists && size.is_none() {
            return Err(BackendError::Spec {
                spec: format!("file:{}", path.display()),
                reason: "size: required when the file does not exist, e.g. size=10GiB".into(),
            });
        }
        let mut opts = OpenOptions::new();
        opts.read(true).write(true).create(size.is_some());
        if direct {
            opts.custom_flags(libc::O_DIRECT);
        }
        let file = opts.open(&path).map_err(|e| io_err("open", e))?;
        let meta = file.metadata().map_err(|e| io_err("stat", e))?;
        let regular = meta.file_type().is_file();
        let cur = if meta.file_type().is_block_device() {
            use std::io::{Seek, SeekFrom};
            let mut f = &file;
            f.seek(SeekFrom::End(0)).map_err(|e| io_err("seek", e))?
        } else {
            meta.len()
        };
        let size = match size {
            Some(want) if regular && want > cur => {
                // set_len extends without allocating: the new tail is a hole.
                file.set_len(want).map_err(|e| io_err("extend", e))?;
                want
            }
            Some(want) if want > cur => {
                return Err(io_err(
                    "size",
                    io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!("device holds {cur} bytes, {want} requested"),
                    ),
                ))
            }
            Some(want) => want,
            None => cur,
        };
        if size == 0 {
            return Err(io_err(
                "size",
                io::Error::new(io::ErrorKind::InvalidInput, "empty file"),
            ));
        }
        if direct && size % DIRECT_ALIGN as u64 != 0 {
            return Err(BackendError::Spec {
                spec: format!("file:{},direct", path.display()),
                reason: format!("size: {size} must be a multiple of {DIRECT_ALIGN} with direct"),
            });
        }
        Ok(Self {
            file,
            path,
            size: std::sync::atomic::AtomicU64::new(size),
            direct,
            regular,
            rmw: RwLock::new(()),
        })
    }

    fn aligned(offset: u64, len: usize) -> (u64, usize) {
        let a = DIRECT_ALIGN as u64;
        let start = offset / a * a;
        let end = (offset + len as u64).div_ceil(a) * a;
        (start, (end - start) as usize)
    }

    #[allow(unsafe_code)]
    fn punch_hole(&self, offset: u64, len: u64) -> io::Result<()> {
        use std::os::fd::AsRawFd;
        let (Ok(off), Ok(l)) = (libc::off_t::try_from(offset), libc::off_t::try_from(len)) else {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "range too large",
            ));
        };
        // SAFETY: fallocate takes a valid open descriptor (owned by `self.file` for the
        // whole call) and plain integers; it touches no memory of ours.
        let rc = unsafe {
            libc::fallocate(
                self.file.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                off,
                l,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(io::Error::last_os_error())
        }
    }

    #[allow(unsafe_code)]
    fn seek(&self, offset: u64, whence: libc::c_int) -> io::Result<Option<u64>> {
        use std::os::fd::AsRawFd;
        let off = libc::off_t::try_from(offset)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "offset too large"))?;
        // SAFETY: lseek takes a valid descriptor and integers. Moving the shared file
        // position is harmless: all data I/O here is positioned (pread/pwrite).
        let rc = unsafe { libc::lseek(self.file.as_raw_fd(), off, whence) };
        if rc >= 0 {
            return Ok(Some(rc as u64));
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() == Some(libc::ENXIO) {
            Ok(None)
        } else {
            Err(e)
        }
    }
}

impl Backend for FileBackend {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        if !self.direct {
            return self.file.read_exact_at(buf, offset);
        }
        let (start, len) = Self::aligned(offset, buf.len());
        let mut b = AlignedBuf::new(len);
        self.file.read_exact_at(b.as_mut(), start)?;
        let skip = (offset - start) as usize;
        buf.copy_from_slice(&b.as_slice()[skip..skip + buf.len()]);
        Ok(())
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        if !self.direct {
            return self.file.write_all_at(buf, offset);
        }
        let (start, len) = Self::aligned(offset, buf.len());
        let mut b = AlignedBuf::new(len);
        if start == offset && len == buf.len() {
            let _shared = self.rmw.read().map_err(|_| poisoned())?;
            b.as_mut().copy_from_slice(buf);
            self.file.write_all_at(b.as_slice(), start)
        } else {
            let _excl = self.rmw.write().map_err(|_| poisoned())?;
            self.file.read_exact_at(b.as_mut(), start)?;
            let skip = (offset - start) as usize;
            b.as_mut()[skip..skip + buf.len()].copy_from_slice(buf);
            self.file.write_all_at(b.as_slice(), start)
        }
    }

    fn flush(&self) -> io::Result<()> {
        self.file.sync_data()
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if self.regular {
            match self.punch_hole(offset, len) {
                Ok(()) => return Ok(()),
                Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => {}
                Err(e) => return Err(e),
            }
        }
        // No hole punching here: zeros keep the "reads return zeros" promise.
        Backend::write_zeroes(self, offset, len)
    }

    fn kind(&self) -> &'static str {
        "file"
    }
    fn grow(&self, size: u64) -> io::Result<()> {
        if !self.regular {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "a block device grows with the device itself, not through ipsan",
            ));
        }
        if self.direct && size % DIRECT_ALIGN as u64 != 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{size} bytes is not a multiple of {DIRECT_ALIGN} (direct)"),
            ));
        }
        // set_len extends without allocating: the new tail is a hole. Size goes up only
        // after the file is long enough, so no I/O can pass the end of the file.
        if size > self.file.metadata()?.len() {
            self.file.set_len(size)?;
        }
        self.size
            .fetch_max(size, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    fn supports_unmap(&self) -> bool {
        self.regular
    }

    fn extent(&self, offset: u64) -> io::Result<Extent> {
        check_range(self.size(), offset, 0)?;
        if !self.regular || offset >= self.size() {
            return Ok(Extent {
                mapped: true,
                len: self.size().saturating_sub(offset),
            });
        }
        let data = self.seek(offset, libc::SEEK_DATA)?;
        match data {
            Some(d) if d == offset => {
                let hole = self.seek(offset, libc::SEEK_HOLE)?.unwrap_or(self.size());
                Ok(Extent {
                    mapped: true,
                    len: hole.min(self.size()) - offset,
                })
            }
            Some(d) => Ok(Extent {
                mapped: false,
                len: d.min(self.size()) - offset,
            }),
            None => Ok(Extent {
                mapped: false,
                len: self.size() - offset,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    #[test]
    fn parses_mem_null_and_file_specs() {
        let m: BackendSpec = "mem:256MiB".parse().unwrap();
        assert_eq!(m.kind, BackendKind::Mem);
        assert_eq!(m.size, Some(256 << 20));
        let n: BackendSpec = "null:1TiB,bs=4096".parse().unwrap();
        assert_eq!(n.kind, BackendKind::Null);
        assert_eq!((n.size, n.block_size), (Some(1 << 40), Some(4096)));
        let f: BackendSpec = "file:/tmp/x.img,size=10GiB,direct,bs=512".parse().unwrap();
        assert_eq!(
            f.kind,
            BackendKind::File {
                path: "/tmp/x.img".into(),
                direct: true
            }
        );
        assert_eq!((f.size, f.block_size), (Some(10 << 30), Some(512)));
    }

    #[test]
    fn parses_rbd_specs_with_ceph_settings_and_librados_options() {
        let r: BackendSpec =
            "rbd:rbd/disk0,conf=/etc/ceph/x.conf,id=gw,keyring=/k,rbd_cache=false,bs=4096"
                .parse()
                .unwrap();
        let BackendKind::Rbd(r0) = &r.kind else {
            panic!("{r:?}")
        };
        assert_eq!((r0.pool.as_str(), r0.image.as_str()), ("rbd", "disk0"));
        assert_eq!(
            r0.conf.as_deref(),
            Some(std::path::Path::new("/etc/ceph/x.conf"))
        );
        assert_eq!(r0.id.as_deref(), Some("gw"));
        assert_eq!(
            r0.options,
            vec![("rbd_cache".to_owned(), "false".to_owned())]
        );
        assert_eq!((r.size, r.block_size), (None, Some(4096)));
        let e = |s: &str| s.parse::<BackendSpec>().unwrap_err().to_string();
        assert!(e("rbd:disk0").contains("rbd:<pool>/<image>"));
        assert!(e("rbd:rbd/d,size=1GiB").contains("the image's"));
    }

    #[test]
    fn rbd_open_names_the_unreadable_ceph_conf() {
        let spec: BackendSpec = "rbd:rbd/disk0,conf=/nonexistent/ceph.conf".parse().unwrap();
        let e = open(&spec).unwrap_err().to_string();
        // Either librbd is missing here (said so) or the configuration is unreadable (named).
        assert!(
            e.contains("RBD is unavailable") || e.contains("/nonexistent/ceph.conf"),
            "{e}"
        );
    }

    #[test]
    fn rejects_bad_specs_with_clear_errors() {
        let e = |s: &str| s.parse::<BackendSpec>().unwrap_err().to_string();
        assert!(e("mem:lots").contains("size:"), "{}", e("mem:lots"));
        assert!(e("mem:12XB").contains("unknown size unit"));
        assert!(e("disk:1GiB").contains("unknown backend kind"));
        assert!(e("mem256").contains("expected <kind>:<args>"));
        assert!(e("file:").contains("expected a path"));
        assert!(e("mem:1GiB,bs=1024").contains("bs: 1024 unsupported"));
        assert!(e("mem:1GiB,direct").contains("unknown option"));
        assert!(e("mem:0").contains("greater than zero"));
        assert!(e("mem:1000").contains("multiple of 512"));
        assert!(e("null:99999999999999TiB").contains("too large"));
    }

    #[test]
    fn file_spec_without_size_needs_existing_file() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("missing.img");
        let spec: BackendSpec = format!("file:{}", p.display()).parse().unwrap();
        let err = open(&spec).unwrap_err().to_string();
        assert!(err.contains("size: required"), "{err}");
    }

    #[test]
    fn mem_backend_is_sparse_and_unmap_frees_chunks() {
        let m = MemBackend::new(64 << 30);
        assert_eq!(m.allocated_chunks(), 0);
        let mut buf = vec![1u8; 4096];
        m.read_at(&mut buf, 10 << 30).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(m.allocated_chunks(), 0, "reads must not allocate");
        // A write straddling a chunk boundary allocates exactly two chunks.
        m.write_at(&[0xAB; 8192], (1 << 20) - 4096).unwrap();
        assert_eq!(m.allocated_chunks(), 2);
        let mut back = vec![0u8; 8192];
        m.read_at(&mut back, (1 << 20) - 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0xAB));
        assert_eq!(
            m.extent(0).unwrap(),
            Extent {
                mapped: true,
                len: 2 << 20
            }
        );
        assert!(!m.extent(2 << 20).unwrap().mapped);
        m.unmap(0, 2 << 20).unwrap();
        assert_eq!(m.allocated_chunks(), 0);
        m.read_at(&mut back, (1 << 20) - 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    #[test]
    fn read_append_matches_read_at_across_chunks_holes_and_backends() {
        let mem = MemBackend::new(4 * CHUNK as u64);
        let data: Vec<u8> = (0..CHUNK + 5000).map(|i| (i * 7 + 3) as u8).collect();
        mem.write_at(&data, CHUNK as u64 / 2).unwrap();
        let null = NullBackend::new(4 * CHUNK as u64);
        let backends: [&dyn Backend; 2] = [&mem, &null];
        for b in backends {
            // Spans: inside one chunk, across two, over a never-written (sparse) chunk, to the end.
            for (off, len) in [
                (10u64, 100usize),
                (CHUNK as u64 - 7, 4096),
                (CHUNK as u64 / 2 - 3, CHUNK + 5006),
                (3 * CHUNK as u64 - 10, CHUNK + 10),
            ] {
                let mut want = vec![0xeeu8; len];
                b.read_at(&mut want, off).unwrap();
                let mut got = BytesMut::from(&b"head"[..]);
                b.read_append(&mut got, len, off).unwrap();
                assert_eq!(&got[..4], b"head", "{} {off}+{len}", b.kind());
                assert_eq!(&got[4..], &want[..], "{} {off}+{len}", b.kind());
            }
            // Out of range: an error and the buffer untouched.
            let mut got = BytesMut::from(&b"head"[..]);
            assert!(b.read_append(&mut got, 20, 4 * CHUNK as u64 - 10).is_err());
            assert_eq!(&got[..], b"head");
        }
    }

    #[test]
    fn mem_partial_unmap_zeroes_only_the_range() {
        let m = MemBackend::new(4 << 20);
        m.write_at(&[7u8; 8192], 0).unwrap();
        m.unmap(4096, 4096).unwrap();
        let mut b = vec![0u8; 8192];
        m.read_at(&mut b, 0).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 7));
        assert!(b[4096..].iter().all(|&x| x == 0));
    }

    #[test]
    fn rejects_io_beyond_size() {
        let m = MemBackend::new(1 << 20);
        assert!(m.write_at(&[0; 512], (1 << 20) - 256).is_err());
        let mut b = [0u8; 512];
        assert!(m.read_at(&mut b, u64::MAX - 10).is_err());
        let n = NullBackend::new(1 << 20);
        assert!(n.read_at(&mut b, 1 << 20).is_err());
    }

    #[test]
    fn null_backend_discards_writes() {
        let n = NullBackend::new(1 << 30);
        n.write_at(&[9u8; 4096], 0).unwrap();
        let mut b = [1u8; 4096];
        n.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(n.kind(), "null");
    }

    fn file_roundtrip(direct: bool) {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("disk.img");
        let spec: BackendSpec = format!(
            "file:{},size=16MiB{}",
            p.display(),
            if direct { ",direct" } else { "" }
        )
        .parse()
        .unwrap();
        let b = match open(&spec) {
            Ok(b) => b,
            // tmpfs does not support O_DIRECT; nothing to test there.
            Err(e) if direct && e.to_string().contains("Invalid argument") => return,
            Err(e) => panic!("{e}"),
        };
        assert_eq!(b.size(), 16 << 20);
        assert_eq!(std::fs::metadata(&p).unwrap().blocks(), 0, "created sparse");
        // Unaligned write exercises the O_DIRECT read-modify-write path.
        b.write_at(&[0x5A; 1000], 100).unwrap();
        b.write_at(&[0xA5; 1 << 20], 1 << 20).unwrap();
        b.flush().unwrap();
        let mut r = vec![0u8; 1100];
        b.read_at(&mut r, 0).unwrap();
        assert!(r[..100].iter().all(|&x| x == 0));
        assert!(r[100..].iter().all(|&x| x == 0x5A));
        assert!(std::fs::metadata(&p).unwrap().blocks() >= 2048);
    }

    #[test]
    fn file_backend_roundtrips_and_creates_sparse() {
        file_roundtrip(false);
    }

    #[test]
    fn file_backend_direct_roundtrips_unaligned_io() {
        file_roundtrip(true);
    }

    #[test]
    fn file_unmap_really_punches_a_hole() {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("thin.img");
        let b = FileBackend::open(p.clone(), Some(8 << 20), false).unwrap();
        b.write_at(&vec![0xEEu8; 4 << 20], 0).unwrap();
        b.flush().unwrap();
        let before = std::fs::metadata(&p).unwrap().blocks();
        assert!(
            before >= 8192,
            "4 MiB written => >= 8192 512-byte blocks, got {before}"
        );
        assert!(b.extent(0).unwrap().mapped);
        b.unmap(1 << 20, 2 << 20).unwrap();
        let after = std::fs::metadata(&p).unwrap().blocks();
        assert!(after + 4096 <= before, "hole punched: {before} -> {after}");
        // SEEK_DATA from the start of the hole lands after it.
        let e = b.extent(1 << 20).unwrap();
        assert_eq!(
            e,
            Extent {
                mapped: false,
                len: 2 << 20
            }
        );
        let mut r = vec![1u8; 2 << 20];
        b.read_at(&mut r, 1 << 20).unwrap();
        assert!(r.iter().all(|&x| x == 0));
        assert_eq!(b.size(), 8 << 20, "KEEP_SIZE");
    }

    #[test]
    fn spec_sizes_use_the_shared_grammar() {
        let m: BackendSpec = "mem:1.5MiB".parse().unwrap();
        assert_eq!(m, "mem:1536KiB".parse().unwrap());
        assert!("mem:lots".parse::<BackendSpec>().is_err());
        assert!("mem:-5".parse::<BackendSpec>().is_err());
    }
}
