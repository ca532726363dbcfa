//! What a block request is: the operation ([`IoOp`]), its tag ([`IoRequest`]), its outcome
//! ([`IoCompletion`], [`IoError`]), the callback that delivers it ([`Completer`]) and how a
//! store wants its requests run ([`Engine`]). The lowest module of the crate: no store, no
//! front end.

use std::io;

use bytes::{Bytes, BytesMut};

/// How a backend wants its commands run.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Engine {
    /// Memory speed: run on the caller's thread (a hop to a pool costs more than the copy).
    Inline,
    /// Blocking system calls: run on a blocking pool, one thread per command in flight.
    Blocking,
    /// Queued remote I/O: [`Backend::submit`](crate::Backend::submit) returns at once and completes later.
    Async,
}

/// One block operation, addressed in bytes. Buffers are owned by the request: the backend
/// keeps them (and their addresses stable) until it completes.
#[derive(Debug)]
pub enum IoOp {
    /// Append `len` bytes read from `offset` to `buf`; completes with the buffer.
    Read {
        /// Byte offset.
        offset: u64,
        /// Bytes to read.
        len: usize,
        /// Where they go (appended; `buf` may already hold a header).
        buf: BytesMut,
    },
    /// Write `data` at `offset`.
    Write {
        /// Byte offset.
        offset: u64,
        /// The bytes.
        data: Bytes,
    },
    /// Make every completed write stable.
    Flush,
    /// Deallocate a range; reads of it return zeros afterwards (LBPRZ).
    Discard {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Write zeros over a range.
    WriteZeroes {
        /// Byte offset.
        offset: u64,
        /// Length in bytes.
        len: u64,
    },
    /// Atomically: if the range holds `compare`, write `write` over it (SBC-4 §5.3).
    CompareAndWrite {
        /// Byte offset.
        offset: u64,
        /// Expected contents.
        compare: Bytes,
        /// New contents (same length).
        write: Bytes,
    },
}

impl IoOp {
    /// Short name for logs.
    pub fn name(&self) -> &'static str {
        match self {
            IoOp::Read { .. } => "read",
            IoOp::Write { .. } => "write",
            IoOp::Flush => "flush",
            IoOp::Discard { .. } => "discard",
            IoOp::WriteZeroes { .. } => "write_zeroes",
            IoOp::CompareAndWrite { .. } => "compare_and_write",
        }
    }
}

/// A tagged request. The tag is the submitter's (the iSCSI layer uses the task tag), handed
/// back in the completion so a completion queue can match requests without a lookup.
#[derive(Debug)]
pub struct IoRequest {
    /// The submitter's tag.
    pub tag: u64,
    /// What to do.
    pub op: IoOp,
}

/// Why a request failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum IoError {
    /// The store failed (errno or kind says how; a front end maps it, e.g.
    /// `ipsan_scsi::Sense::from_block_error`).
    #[error("{0}")]
    Io(#[from] io::Error),
    /// COMPARE AND WRITE found different data: `offset` is the first differing byte,
    /// counted from the start of the request.
    #[error("miscompare at byte {offset}")]
    Miscompare {
        /// First differing byte.
        offset: u64,
    },
}

/// The outcome of one request.
#[derive(Debug)]
pub struct IoCompletion {
    /// The request's tag.
    pub tag: u64,
    /// The read buffer for [`IoOp::Read`], `None` for the others; or the error.
    pub result: Result<Option<BytesMut>, IoError>,
}

/// Called exactly once with the completion, from any thread (possibly before `submit`
/// returns). It must not block: it runs on the backend's completion thread. Nor may it own
/// the last reference to the backend: dropping an RBD backend closes the image, which from
/// librbd's completion thread waits for itself for good (`rbd/mod.rs`, `Events`).
pub type Completer = Box<dyn FnOnce(IoCompletion) + Send>;
