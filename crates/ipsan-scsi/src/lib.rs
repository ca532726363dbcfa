//! ipsan-scsi: the SCSI layer of the ipsan target — everything between a CDB and the bytes
//! on a backend. Sans-IO with respect to the network: the iSCSI layer hands in a CDB plus
//! Data-Out and gets back status, sense and Data-In.
//!
//! # Layout
//! - [`sense`]: sense keys, sense data (fixed/descriptor format) built by the target and parsed
//!   by the initiator, status codes (SPC-4 §4.5).
//! - [`cdb`]: the one opcode table ([`cdb::OPS`] in `cdb/table.rs`: name, family, extent
//!   field, idempotency) and CDB decoding, once, into the typed command [`CommandInfo`] (the decoded
//!   [`cdb::Command`], direction, transfer lengths, extent, FUA/DPO/IMMED) that the iSCSI
//!   layer, Seal, recovery, metrics and the LU read; bad fields become [`Sense`].
//! - [`aio`], [`backend`], [`rbd`]: the stores and their submit/complete form, re-exported
//!   from the `ipsan-block` crate under the paths they had when they lived here. A backend
//!   failure ([`IoError`]) becomes sense in one place, [`Sense::from_block_error`].
//! - [`lu`]: [`LogicalUnit`] — command execution (SBC-4), unit attentions, resets; split into
//!   `lu/dispatch.rs` (command → handler), `lu/path.rs` (the data path, once, for the blocking
//!   and the submit/complete forms), `lu/media.rs` (checks, VERIFY, ORWRITE, GET LBA STATUS)
//!   and `lu/submit.rs` (`execute_async`).
//! - [`config`]: [`LuConfig`], [`Limits`], and [`config::Unit`], the view of the LU the SPC
//!   handlers below get (so they never import `lu`).
//! - [`inquiry`]: standard INQUIRY data and VPD pages 00h/80h/83h/B0h/B1h/B2h.
//! - [`mode`]: MODE SENSE / MODE SELECT with the caching, control and IEC pages.
//! - [`opcodes`]: REPORT SUPPORTED OPERATION CODES table.
//! - [`pr`]: RESERVE(6)/RELEASE(6) and PERSISTENT RESERVE IN/OUT; the state in memory or in
//!   a backend's shared record ([`ipsan_block::SharedRecord`], an RBD image's object).
//! - [`lun`]: target-level helpers: REPORT LUNS, unknown-LUN answers, LUN encoding.
//! - [`response`]: [`NexusId`] and [`ScsiResponse`], shared by the handlers below `lu`.

pub mod cdb;
pub mod config;
pub mod inquiry;
pub mod lu;
pub mod lun;
pub mod mode;
pub mod opcodes;
pub mod pr;
pub mod response;
pub mod sense;

pub use ipsan_block::{aio, rbd};
/// The stores, under the path they had in this crate (now `ipsan_block`).
pub mod backend {
    pub use ipsan_block::{
        open, parse_size, Backend, BackendError, BackendKind, BackendSpec, Extent, FileBackend,
        MemBackend, MemRecord, NullBackend, SharedRecord,
    };
}

pub use cdb::{CommandInfo, DataDirection, Family};
pub use ipsan_block::{
    open, Backend, BackendError, BackendKind, BackendSpec, Engine, Extent, IoCompletion, IoError,
    IoOp, IoRequest, Whole,
};
pub use lu::{
    Limits, LogicalUnit, LuConfig, LuError, NexusId, OwnedRequest, ResetKind, ScsiRequest,
    ScsiResponse,
};
pub use lun::{decode_lun, encode_lun, no_such_lun, report_luns, report_luns_decoded};
pub use sense::{ScsiStatus, Sense, SenseKey};
