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
//! - [`aio`]: the submit/complete form of the backend interface ([`aio::Engine`],
//!   [`aio::IoRequest`], completions), and a runtime-agnostic future over it.
//! - [`rbd`]: the `rbd:pool/image` backend (Ceph RBD via librbd loaded at run time).
//! - [`backend`]: the [`Backend`] trait and the `mem`, `file` and `null` stores, plus the
//!   `mem:256MiB` / `file:/path,size=10GiB` / `null:1TiB` spec parser.
//! - [`lu`]: [`LogicalUnit`] — command execution (SBC-4), unit attentions, resets; split into
//!   `lu/dispatch.rs` (command → handler), `lu/path.rs` (the data path, once, for the blocking
//!   and the submit/complete forms), `lu/media.rs` (checks, VERIFY, ORWRITE, GET LBA STATUS)
//!   and `lu/submit.rs` (`execute_async`).
//! - [`inquiry`]: standard INQUIRY data and VPD pages 00h/80h/83h/B0h/B1h/B2h.
//! - [`mode`]: MODE SENSE / MODE SELECT with the caching, control and IEC pages.
//! - [`opcodes`]: REPORT SUPPORTED OPERATION CODES table.
//! - [`pr`]: RESERVE(6)/RELEASE(6) and PERSISTENT RESERVE IN/OUT.
//! - [`lun`]: target-level helpers: REPORT LUNS, unknown-LUN answers, LUN encoding.

pub mod aio;
pub mod backend;
pub mod cdb;
pub mod inquiry;
pub mod lu;
pub mod lun;
pub mod mode;
pub mod opcodes;
pub mod pr;
pub mod rbd;
pub mod sense;

pub use aio::{Engine, IoCompletion, IoError, IoOp, IoRequest};
pub use backend::{open, Backend, BackendError, BackendKind, BackendSpec, Extent};
pub use cdb::{CommandInfo, DataDirection, Family};
pub use lu::{
    Limits, LogicalUnit, LuConfig, LuError, NexusId, OwnedRequest, ResetKind, ScsiRequest,
    ScsiResponse,
};
pub use lun::{decode_lun, encode_lun, no_such_lun, report_luns};
pub use sense::{ScsiStatus, Sense, SenseKey};
