//! The [`Backend`] trait every store implements (`mem`, `file`, `null`, `rbd`), the
//! [`SharedRecord`] a store that several servers may export keeps next to its data, and the
//! errors of opening one.
//!
//! A backend is addressed in bytes; the front end (the SCSI logical unit, an NVMe namespace)
//! turns LBAs into offsets and checks ranges before calling in, so backends only guard
//! against their own size.

use std::fmt;
use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use crate::request::{Completer, Engine, IoCompletion, IoError, IoOp, IoRequest};

/// Allocation state of the extent starting at an offset (used by GET LBA STATUS).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct Extent {
    /// `true`: backed by storage; `false`: deallocated (reads return zeros).
    pub mapped: bool,
    /// Length in bytes of the run with this state, starting at the queried offset.
    pub len: u64,
}

/// Write data that is the whole of its allocation: no slice of a larger buffer, no room past
/// its end. A store may keep it as its own memory ([`Backend::write_whole`]) without keeping
/// more memory alive than the bytes it holds. The caller may keep clones of it (they share
/// the same allocation, read-only).
#[derive(Clone, Debug)]
pub struct Whole(Bytes);

impl Whole {
    /// `buf` as a whole buffer when it is all of its allocation from its first byte (its
    /// capacity is its length and it starts where its allocation does); otherwise `buf` back.
    ///
    /// A `BytesMut`'s capacity counts from its first byte, so one advanced past the start of
    /// its allocation (or the tail half of a split) can have capacity = length and still keep
    /// the bytes before it alive: the allocation's own start and size are looked at here (as
    /// a `Vec`, which is where the allocation starts; when `buf` already starts there, taking
    /// it as one moves nothing).
    ///
    /// When other handles share `buf`'s allocation its bytes are copied into one of their own,
    /// which is whole (what a store's copy of them would cost).
    ///
    /// # Errors
    /// `buf` back when it has room past its end (unchanged) or does not start at its
    /// allocation's start (its bytes then moved to the front of it).
    pub fn new(buf: BytesMut) -> Result<Self, BytesMut> {
        if buf.capacity() != buf.len() {
            return Err(buf);
        }
        let v = Vec::from(buf);
        if v.capacity() == v.len() {
            Ok(Self(Bytes::from(v)))
        } else {
            Err(BytesMut::from(Bytes::from(v)))
        }
    }

    /// `data` as a whole buffer when it is the only handle on all of its allocation, from its
    /// first byte ([`Whole::new`]); otherwise `data` back as it was. How a front end offers a
    /// write it received into a buffer of its own to [`Backend::write_whole`].
    ///
    /// # Errors
    /// `data` itself, when it is shared or not all of its allocation.
    pub fn from_bytes(data: Bytes) -> Result<Self, Bytes> {
        match data.try_into_mut() {
            Ok(buf) => Self::new(buf).map_err(BytesMut::freeze),
            Err(shared) => Err(shared),
        }
    }

    /// The bytes, shared (a clone of the handle, not of the data).
    #[must_use]
    pub fn bytes(&self) -> &Bytes {
        &self.0
    }

    /// The bytes as a slice.
    #[must_use]
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    /// The bytes, as a store keeps them.
    #[must_use]
    pub fn into_bytes(self) -> Bytes {
        self.0
    }

    /// Its length in bytes.
    #[must_use]
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// Whether it holds no bytes.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
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
    /// `len` bytes from `offset` as the store's own memory, shared rather than copied, when
    /// the store can hand them out so (the RAM store: a long read inside one written chunk;
    /// it keeps its bytes whatever is written after). `None`: it cannot, use
    /// [`Backend::read_append`]. The default never can.
    fn read_shared(&self, len: usize, offset: u64) -> Option<io::Result<Bytes>> {
        let _ = (len, offset);
        None
    }
    /// Writes `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// [`Backend::write_at`] of a buffer that is all of its allocation ([`Whole`]): a store
    /// that keeps written memory may keep `data` itself rather than copy it (the RAM store,
    /// for a write of exactly one of its chunks: issue 27). The default copies.
    fn write_whole(&self, data: Whole, offset: u64) -> io::Result<()> {
        self.write_at(data.as_bytes(), offset)
    }
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
    /// How commands on this store should run (see [`crate::request`]). The default is the
    /// blocking pool.
    fn engine(&self) -> Engine {
        Engine::Blocking
    }
    /// Starts a request; `done` is called exactly once, from any thread, possibly before
    /// this returns. The default runs it at once with the blocking methods above; an
    /// [`Engine::Async`] store queues it and completes from its own completion thread.
    fn submit(&self, req: IoRequest, done: Completer) {
        done(run_blocking(self, req));
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
    /// Where a store that other servers may export too keeps the small state they must all
    /// see alike — the SCSI front end's reservations (RBD: an object next to the image).
    /// `None`: the front end keeps it in its own memory, and a store with an
    /// [`Backend::identity`] then refuses what needs it (reservations).
    fn shared_record(&self) -> Option<Arc<dyn SharedRecord>> {
        None
    }
}

pub(crate) fn check_range(size: u64, offset: u64, len: u64) -> io::Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("range {offset}+{len} beyond backend size {size}"),
        )),
    }
}

pub(crate) fn poisoned() -> io::Error {
    io::Error::other("backend lock poisoned")
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

/// A small record stored with the data, versioned, that every server of the store reads
/// alike: the front end keeps its cross-server state there (SCSI persistent reservations,
/// `ipsan_scsi::pr`) as opaque bytes. `version` counts stores: [`SharedRecord::store`]
/// succeeds only when the stored record is still at `expected`, so two writers (two targets
/// serving one shared image) never lose each other's update. Version 0 is "never stored"
/// (empty contents).
pub trait SharedRecord: Send + Sync + fmt::Debug {
    /// The contents for checks run before every command: may come from a cache, but must
    /// never be older than the last [`SharedRecord::store`] that returned (anywhere). The
    /// same `Arc` comes back while the contents did not change, so a caller may keep what it
    /// decoded from it ([`Arc::ptr_eq`]).
    fn current(&self) -> io::Result<Arc<[u8]>>;
    /// The contents as stored now, and their version.
    fn load(&self) -> io::Result<(Arc<[u8]>, u64)>;
    /// Replaces the contents at version `expected` with `new`; `Ok(false)` when the stored
    /// version moved on (reload and retry).
    fn store(&self, new: &[u8], expected: u64) -> io::Result<bool>;
}

/// A [`SharedRecord`] in this process's memory: for stores several front ends in one
/// process share (tests of two target ports on one store), and the model an out-of-process
/// record (RBD's object) must behave like.
#[derive(Debug)]
pub struct MemRecord {
    state: std::sync::Mutex<(Arc<[u8]>, u64)>,
}

impl Default for MemRecord {
    fn default() -> Self {
        Self {
            state: std::sync::Mutex::new((Arc::from(&[][..]), 0)),
        }
    }
}

impl SharedRecord for MemRecord {
    fn current(&self) -> io::Result<Arc<[u8]>> {
        Ok(self.load()?.0)
    }
    fn load(&self) -> io::Result<(Arc<[u8]>, u64)> {
        Ok(self.state.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
    fn store(&self, new: &[u8], expected: u64) -> io::Result<bool> {
        let mut g = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if g.1 != expected {
            return Ok(false);
        }
        *g = (Arc::from(new), expected.wrapping_add(1));
        Ok(true)
    }
}

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

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Buf;

    /// A [`Whole`] is all of its allocation from its first byte: a buffer with room past its
    /// end or with bytes before its start (advanced, or the tail of a split) is refused, even
    /// where its capacity (counted from its first byte) is its length.
    #[test]
    fn a_whole_buffer_is_all_of_its_allocation() {
        const N: usize = 4096;
        let mut b = BytesMut::with_capacity(N);
        b.resize(N, 1);
        let at = b.as_ptr();
        let w = Whole::new(b).unwrap();
        assert_eq!(w.as_bytes().as_ptr(), at, "an exact buffer was moved");
        assert_eq!(w.len(), N);

        let mut roomy = BytesMut::with_capacity(2 * N);
        roomy.resize(N, 2);
        let back = Whole::new(roomy).unwrap_err();
        assert_eq!(&back[..], &[2u8; N][..]);

        // Advanced past its allocation's start: capacity = length, 16 bytes kept before it.
        let mut advanced = BytesMut::with_capacity(N + 16);
        advanced.resize(N + 16, 3);
        advanced.advance(16);
        assert_eq!(advanced.capacity(), advanced.len());
        let back = Whole::new(advanced).unwrap_err();
        assert_eq!(&back[..], &[3u8; N][..]);

        // The tail of a split whose head is gone: the same.
        let mut b = BytesMut::with_capacity(N + 16);
        b.resize(N + 16, 4);
        let tail = b.split_off(16);
        drop(b);
        assert_eq!(tail.capacity(), tail.len());
        let back = Whole::new(tail).unwrap_err();
        assert_eq!(&back[..], &[4u8; N][..]);

        // A tail whose head lives on: its bytes copied into an allocation of their own.
        let mut head = BytesMut::with_capacity(N + 16);
        head.resize(N + 16, 5);
        let tail = head.split_off(16);
        let at = tail.as_ptr();
        let w = Whole::new(tail).unwrap();
        assert_ne!(w.as_bytes().as_ptr(), at);
        assert_eq!(w.as_bytes(), &[5u8; N][..]);
        assert_eq!(&head[..], &[5u8; 16][..]);
    }
}
