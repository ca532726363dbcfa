//! ipsan-block: the block layer under every front end — the SCSI logical unit
//! (`ipsan-scsi`) today, an NVMe namespace tomorrow. Stores addressed in bytes behind one
//! trait, with one submit/complete form, and no SCSI (or NVMe) type anywhere: a failure is an
//! [`IoError`], which each front end maps to its own status (ipsan-scsi: sense keys and ASCs,
//! `Sense::from_block_error`).
//!
//! # Layout
//! - [`request`]: what a request is — [`IoOp`], [`IoRequest`], [`IoCompletion`],
//!   [`IoError`], the [`Completer`] callback and the [`Engine`] a store asks for. The bottom
//!   module.
//! - [`backend`]: the [`Backend`] trait, the [`SharedRecord`] a store several servers export
//!   keeps next to its data (the SCSI front end's reservations), [`BackendError`] and
//!   [`run_blocking`].
//! - [`aio`]: the submit/complete form over any backend: [`submit`] (a runtime-agnostic
//!   future), [`wait`], [`block_on`].
//! - [`mem`], [`file`](mod@file), [`null`]: the local stores; [`disk`]: a RAM (or file) store
//!   whose requests take a single disk's time (a stated seek/rotation/transfer model).
//! - [`rbd`]: `rbd:pool/image` (Ceph RBD through librbd loaded at run time); `rbd/ffi.rs`
//!   and `rbd/ffi/image.rs` hold the crate's only FFI, `rbd/record.rs` the shared record.
//! - [`spec`]: the `mem:256MiB` / `file:/path,size=10GiB` / `null:1TiB` / `disk:4GiB` / `rbd:pool/image`
//!   parser ([`BackendSpec`]) and [`open`].
//!
//! Module dependencies point one way: `request` ← `backend` ← `aio`, the stores ← `spec`.
//!
//! # A remote LUN as a block device
//! The gateway's remote LUN (`ipsan-target/src/remote.rs`) is a SCSI pass-through: the host's
//! CDB goes to the remote target unchanged, which is right for a SCSI front end. A front end
//! that does not speak SCSI (the NVMe/TCP namespace) needs the remote LUN as a block device
//! instead: a [`Backend`] whose [`Backend::submit`] turns [`IoOp::Read`]/[`IoOp::Write`]
//! into READ(16)/WRITE(16), [`IoOp::Flush`] into SYNCHRONIZE CACHE(16), [`IoOp::Discard`] into
//! UNMAP, [`IoOp::WriteZeroes`] into WRITE SAME(16) and [`IoOp::CompareAndWrite`] into
//! COMPARE AND WRITE, sent through an `ipsan-initiator` session (`Session::command_to`) and
//! completed from the session's task ([`Engine::Async`]); the remote CHECK CONDITION maps
//! back to an [`IoError`] (MISCOMPARE → [`IoError::Miscompare`], the rest → `io::Error`
//! with its kind). It implements this crate's trait but lives above `ipsan-initiator` — in
//! `ipsan-target` — since `ipsan-initiator` depends on `ipsan-scsi`, which depends on this
//! crate: here it would close a dependency cycle. That backend is
//! `ipsan_target::remote_block::RemoteBlock` (`crates/ipsan-target/tests/remote_block.rs`
//! runs every operation against a real target, and a SCSI LU on top of it).

pub mod aio;
pub mod backend;
pub mod disk;
pub mod file;
pub mod mem;
pub mod null;
pub mod rbd;
pub mod request;
pub mod spec;

pub use aio::{block_on, submit, wait, IoFuture};
pub use backend::{run_blocking, Backend, BackendError, Extent, MemRecord, SharedRecord, Whole};
pub use disk::{DiskBackend, DiskModel};
pub use file::FileBackend;
pub use mem::MemBackend;
pub use null::NullBackend;
pub use rbd::{RbdBackend, RbdSpec};
pub use request::{Completer, Engine, IoCompletion, IoError, IoOp, IoRequest};
pub use spec::{open, parse_size, BackendKind, BackendSpec};
