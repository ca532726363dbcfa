//! The FUSE side of `ipsan attach`: a directory holding one regular file, `lun<N>`, whose bytes
//! are the LUN's blocks.
//!
//! FUSE calls arrive on fuser's session thread; read, write, fsync and flush hand the request
//! to a task on the tokio runtime and return at once, so the kernel's requests in flight
//! (readahead, writeback, a loop device's direct AIO) become SCSI commands in flight, up to
//! [`super::lun::LunIo`]'s depth. The task replies when its commands complete; any failure is
//! logged with its reason (status and decoded sense, or the lost connection) and answered with
//! EIO.

use std::ffi::{OsStr, OsString};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags,
    KernelConfig, LockOwner, OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty,
    ReplyEntry, ReplyOpen, ReplyWrite, Request, WriteFlags,
};

use super::lun::{IoError, LunIo, MAX_IO};

/// The LUN file's inode (the root directory is [`INodeNo::ROOT`]).
const LUN_INO: INodeNo = INodeNo(2);

/// The size never changes while mounted; the kernel may cache attributes for long.
const TTL: Duration = Duration::from_secs(60);

/// The mounted filesystem.
#[derive(Debug)]
pub struct LunFs {
    rt: tokio::runtime::Handle,
    io: Arc<LunIo>,
    name: OsString,
    dir: FileAttr,
    file: FileAttr,
    depth: usize,
}

impl LunFs {
    /// The file `name` over `io`; owned by `uid:gid` (those of the mount point), read and
    /// written only by its owner as a disk device would be.
    pub fn new(
        rt: tokio::runtime::Handle,
        io: Arc<LunIo>,
        name: String,
        depth: usize,
        uid: u32,
        gid: u32,
    ) -> Self {
        let now = SystemTime::now();
        let attr = |ino, kind, perm, size: u64, nlink| FileAttr {
            ino,
            size,
            blocks: size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind,
            perm,
            nlink,
            uid,
            gid,
            rdev: 0,
            flags: 0,
            blksize: u32::try_from(io.block_len()).unwrap_or(512),
        };
        let dir = attr(INodeNo::ROOT, FileType::Directory, 0o755, 0, 2);
        let file = attr(LUN_INO, FileType::RegularFile, 0o600, io.capacity(), 1);
        Self {
            rt,
            io,
            name: name.into(),
            dir,
            file,
            depth,
        }
    }
}

/// EIO for the kernel, the reason for the log.
fn fail(io: &LunIo, what: &str, e: &IoError) -> Errno {
    match e {
        IoError::PastEnd(_) => Errno::EFBIG,
        IoError::Command { .. } => {
            io.log_failure(what, e);
            Errno::EIO
        }
    }
}

impl Filesystem for LunFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let max = u32::try_from(MAX_IO).unwrap_or(u32::MAX);
        // Each is a request; a refusal leaves the kernel's (smaller) value, still correct.
        if let Err(v) = config.set_max_write(max) {
            let _ = config.set_max_write(v);
        }
        if let Err(v) = config.set_max_readahead(max) {
            let _ = config.set_max_readahead(v);
        }
        // A loop device with --direct-io=on sends asynchronous direct I/O; without
        // FUSE_ASYNC_DIO the kernel makes each such request synchronous, so the loop driver
        // sends its next request only once this one was answered: one at a time, one round
        // trip to the target each. (libfuse asks for it by default; fuser does not.)
        if let Err(v) = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO) {
            tracing::debug!(
                "kernel without FUSE_ASYNC_DIO ({v:?}): direct I/O one request at a time"
            );
        }
        // Asynchronous requests (readahead, writeback, direct AIO) the kernel keeps in flight.
        let bg = u16::try_from(self.depth).unwrap_or(u16::MAX).max(1);
        let _ = config.set_max_background(bg);
        let _ = config.set_congestion_threshold((bg - bg / 4).max(1));
        Ok(())
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        if parent == INodeNo::ROOT && name == self.name.as_os_str() {
            reply.entry(&TTL, &self.file, fuser::Generation(0));
        } else {
            reply.error(Errno::ENOENT);
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match ino {
            INodeNo::ROOT => reply.attr(&TTL, &self.dir),
            LUN_INO => reply.attr(&TTL, &self.file),
            _ => reply.error(Errno::ENOENT),
        }
    }

    /// The size is the LUN's: a truncation (`O_TRUNC`, `truncate`) is ignored, as on a block
    /// device; so are mode, owner and time changes.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if let Some(s) = size.filter(|&s| s != self.io.capacity()) {
            tracing::debug!("setattr: size {s} ignored (the LUN's size is fixed)");
        }
        self.getattr(_req, ino, None, reply);
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino == LUN_INO {
            // O_DIRECT writers (a loop device with --direct-io=on) need not queue on the inode
            // lock: overlapping writes are serialised by `LunIo` itself.
            reply.opened(FileHandle(0), FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES);
        } else {
            reply.error(Errno::EISDIR);
        }
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != LUN_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        tracing::trace!(offset, size, "read");
        let io = self.io.clone();
        self.rt.spawn(async move {
            match io.read(offset, size as usize).await {
                Ok(data) => reply.data(&data),
                Err(e) => reply.error(fail(&io, &format!("read {size}@{offset}"), &e)),
            }
        });
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != LUN_INO {
            reply.error(Errno::EISDIR);
            return;
        }
        // The request buffer is fuser's; the task needs its own copy (the only one for
        // whole-block writes).
        let data = bytes::Bytes::copy_from_slice(data);
        let len = data.len();
        tracing::trace!(offset, size = len, "write");
        let io = self.io.clone();
        self.rt.spawn(async move {
            match io.write(offset, data).await {
                Ok(n) => reply.written(u32::try_from(n).unwrap_or(u32::MAX)),
                Err(e) => reply.error(fail(&io, &format!("write {len}@{offset}"), &e)),
            }
        });
    }

    /// `close()`: SYNCHRONIZE CACHE, so a closed file's data is on the medium.
    fn flush(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _lock_owner: LockOwner,
        reply: ReplyEmpty,
    ) {
        self.sync(ino, "flush", reply);
    }

    fn fsync(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        _datasync: bool,
        reply: ReplyEmpty,
    ) {
        self.sync(ino, "fsync", reply);
    }

    fn readdir(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        mut reply: ReplyDirectory,
    ) {
        if ino != INodeNo::ROOT {
            reply.error(Errno::ENOTDIR);
            return;
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, OsStr::new(".")),
            (INodeNo::ROOT, FileType::Directory, OsStr::new("..")),
            (LUN_INO, FileType::RegularFile, self.name.as_os_str()),
        ];
        for (i, (ino, kind, name)) in entries.into_iter().enumerate() {
            let next = i as u64 + 1;
            if next <= offset {
                continue;
            }
            if reply.add(ino, next, kind, name) {
                break;
            }
        }
        reply.ok();
    }

    /// No extended attributes (answered quietly: the kernel then stops asking).
    fn getxattr(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _name: &OsStr,
        _size: u32,
        reply: fuser::ReplyXattr,
    ) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: fuser::ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    /// No discard yet: a loop device then reports no discard support.
    fn fallocate(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        _offset: u64,
        _length: u64,
        _mode: i32,
        reply: ReplyEmpty,
    ) {
        reply.error(Errno::EOPNOTSUPP);
    }
}

impl LunFs {
    fn sync(&self, ino: INodeNo, what: &'static str, reply: ReplyEmpty) {
        if ino != LUN_INO {
            reply.ok();
            return;
        }
        let io = self.io.clone();
        self.rt.spawn(async move {
            match io.sync().await {
                Ok(()) => reply.ok(),
                Err(e) => reply.error(fail(&io, what, &e)),
            }
        });
    }
}
