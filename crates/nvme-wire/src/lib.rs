//! NVMe/TCP wire format, free of I/O: the counterpart of `iscsi-wire` for NVMe over TCP.
//!
//! # Layout
//! - [`pdu`]: the 8-byte common header and every PDU of NVMe/TCP Transport Specification 1.0
//!   §3.6.2 (ICReq, ICResp, H2CTermReq, C2HTermReq, CapsuleCmd, CapsuleResp, H2CData, C2HData,
//!   R2T), framed by PLEN, decoded with strict validation and encoded back, with the optional
//!   header and data digests and the PDU data alignment (PDO).
//! - [`entry`]: the 64-byte submission queue entry with its SGL descriptor and the 16-byte
//!   completion queue entry with typed status codes (NVMe Base 2.0 §4.2, §4.6, §4.4).
//! - [`fabrics`]: the Fabrics commands NVMe/TCP needs (NVMe over Fabrics 1.1 §3.3, §3.5):
//!   Connect with its 1024-byte data, Property Get/Set, Authentication Send/Receive.
//! - [`error`]: typed errors that name the fatal error status a C2HTermReq/H2CTermReq carries.
//! - [`codes`]: the PDU type and the completion status types, which the errors carry; below
//!   [`error`], [`pdu`] and [`entry`] (where their methods and named values are).
//! - [`digest`]: CRC32C as NVMe/TCP uses it (NVMe/TCP 1.0 §3.6.1).
//!
//! Payloads are handed out as [`bytes::Bytes`] slices of the receive buffer; nothing on the
//! data path is copied.
#![forbid(unsafe_code)]

pub mod codes;
pub mod digest;
pub mod entry;
pub mod error;
pub mod fabrics;
pub mod pdu;

pub use entry::{Cqe, Sgl, Sqe, Status};
pub use error::{Fes, WireError};
pub use pdu::{Codec, Pdu, PduType};

/// Length of the PDU common header, CH (NVMe/TCP 1.0 §3.6.2.1).
pub const CH_LEN: usize = 8;

/// Length of a header or data digest (NVMe/TCP 1.0 §3.6.1).
pub const DIGEST_LEN: usize = 4;

/// The well-known port of the NVMe/TCP discovery controller (NVMe/TCP 1.0 §3.2).
pub const DISCOVERY_PORT: u16 = 8009;
