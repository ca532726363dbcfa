//! RFC 7143 iSCSI wire format, free of I/O.
//!
//! # Layout
//! - [`opcode`]: the opcode newtype and its named values (RFC 7143 §11.2.1.2).
//! - [`header`]: one typed struct per PDU kind, parsed from and written to the 48-byte Basic
//!   Header Segment (RFC 7143 §11.2), collected in the [`Header`] enum.
//! - [`codec`]: frames whole PDUs out of a byte stream and writes them back, with AHS, padding
//!   and the optional CRC32C header and data digests (RFC 7143 §11.2, §13.1).
//! - [`text`]: `key=value` data segments of Login and Text PDUs (RFC 7143 §6.1).
//! - [`digest`]: CRC32C as iSCSI uses it (RFC 7143 Appendix A... §13.1).
//!
//! The codec hands payloads out as [`bytes::Bytes`] slices of the receive buffer; nothing on
//! the data path is copied.
#![forbid(unsafe_code)]

pub mod codec;
pub mod digest;
pub mod error;
pub mod header;
pub mod opcode;
pub mod text;

pub use codec::{Codec, Frame, Pdu};
pub use error::WireError;
pub use header::Header;
pub use opcode::Opcode;

/// Length of the Basic Header Segment (RFC 7143 §11.2).
pub const BHS_LEN: usize = 48;

/// The reserved "no task" tag (RFC 7143 §11.2.1.8): 0xffffffff.
pub const RESERVED_TAG: u32 = 0xffff_ffff;

/// Rounds a length up to the 4-byte boundary that every PDU segment is padded to
/// (RFC 7143 §11.2.3).
#[must_use]
pub const fn pad4(len: usize) -> usize {
    (len + 3) & !3
}
