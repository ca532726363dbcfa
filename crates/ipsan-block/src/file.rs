//! `file:/path,size=10GiB[,direct]`: a sparse file or a block device, pread/pwrite,
//! optional O_DIRECT, hole punching for discard.

use std::fmt;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, FileTypeExt, OpenOptionsExt};
use std::path::PathBuf;
use std::sync::RwLock;

use crate::backend::{check_range, poisoned, Backend, BackendError, Extent};

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

    fn file_roundtrip(direct: bool) {
        let dir = tempfile::tempdir_in("/var/tmp").unwrap();
        let p = dir.path().join("disk.img");
        let b = match FileBackend::open(p.clone(), Some(16 << 20), direct) {
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
}
