//! Errors found while framing or parsing NVMe/TCP PDUs and queue entries.
//!
//! A PDU error is a *fatal transport error* (NVMe/TCP 1.0 §3.6.2.4-§3.6.2.5, §3.8): the receiver
//! sends a C2HTermReq (controller) or H2CTermReq (host) carrying [`WireError::fes`] and
//! [`WireError::fei`] and closes the connection. Two kinds are not fatal: a data digest error
//! completes the command with Transient Transport Error (NVMe/TCP 1.0 §3.6.1), and an invalid
//! command field is answered in the completion with [`WireError::status`].

use crate::codes::{PduType, Status};

/// Fatal Error Status of a termination request (NVMe/TCP 1.0 §3.6.2.4-§3.6.2.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Fes {
    /// 01h: a header field is invalid; FEI is the byte offset of the field.
    InvalidHeaderField = 0x01,
    /// 02h: a PDU arrived that is not allowed in the current state.
    PduSequenceError = 0x02,
    /// 03h: the header digest did not match.
    HeaderDigestError = 0x03,
    /// 04h: data outside the range the command or R2T allows.
    DataTransferOutOfRange = 0x04,
    /// 05h: R2T limit exceeded (called Data Transfer Limit Exceeded since TP 8010: more data in
    /// one H2CData PDU than MAXH2CDATA).
    R2tLimitExceeded = 0x05,
    /// 06h: a parameter of ICReq/ICResp that the receiver does not support; FEI is its offset.
    UnsupportedParameter = 0x06,
}

impl Fes {
    /// The status for a wire value; `None` for reserved values.
    #[must_use]
    pub fn from_u16(v: u16) -> Option<Self> {
        Some(match v {
            0x01 => Self::InvalidHeaderField,
            0x02 => Self::PduSequenceError,
            0x03 => Self::HeaderDigestError,
            0x04 => Self::DataTransferOutOfRange,
            0x05 => Self::R2tLimitExceeded,
            0x06 => Self::UnsupportedParameter,
            _ => return None,
        })
    }
}

/// A malformed or unacceptable PDU or queue entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// A PDU header field is invalid (unknown type, HLEN, PDO, PLEN, flags, a reserved field
    /// that is not zero, ...). `offset` is the field's byte offset in the PDU header: the FEI.
    #[error("invalid header field at byte {offset} of a {pdu_type:#04x} PDU: {reason}")]
    InvalidHeaderField {
        pdu_type: u8,
        offset: u32,
        reason: &'static str,
    },
    /// The header digest did not match: nothing in the header can be trusted.
    #[error("header digest mismatch (expected {expected:#010x}, got {got:#010x})")]
    HeaderDigest { expected: u32, got: u32 },
    /// The data digest did not match. The PDU was consumed whole and the stream is intact; the
    /// command `cid` completes with Transient Transport Error.
    #[error("data digest mismatch on {pdu_type:?} PDU for command {cid}")]
    DataDigest {
        pdu_type: PduType,
        cid: u16,
        expected: u32,
        got: u32,
    },
    /// PLEN above the receiver's configured limit (or the 32-bit field). For H2CData this is
    /// more data than MAXH2CDATA (FES 05h); for other PDUs an invalid PLEN (FES 01h).
    #[error("{pdu_type:#04x} PDU of {plen} bytes exceeds the limit of {max}")]
    PduTooLong { pdu_type: u8, plen: u64, max: u32 },
    /// An ICReq/ICResp parameter outside what the receiver supports (PFV, PDA, digest bits,
    /// MAXH2CDATA). `offset` is the field's byte offset: the FEI.
    #[error("unsupported parameter at byte {offset}: {reason}")]
    UnsupportedParameter { offset: u32, reason: &'static str },
    /// A buffer given to a decoder has the wrong length (a caller error, not a peer's).
    #[error("{what} needs {expected} bytes, got {got}")]
    Length {
        what: &'static str,
        expected: usize,
        got: usize,
    },
    /// A command (submission queue entry or its data) with an invalid field: answered in the
    /// completion with `status` (NVMe Base 2.0 §4.6.1.2.1), not fatal to the connection.
    #[error("invalid command field at byte {offset}: {reason}")]
    InvalidCommand {
        offset: u32,
        reason: &'static str,
        status: Status,
    },
}

impl WireError {
    /// The Fatal Error Status a termination request carries for this error, or `None` when the
    /// error is not fatal to the connection.
    #[must_use]
    pub fn fes(&self) -> Option<Fes> {
        match self {
            Self::InvalidHeaderField { .. } => Some(Fes::InvalidHeaderField),
            Self::HeaderDigest { .. } => Some(Fes::HeaderDigestError),
            Self::PduTooLong { pdu_type, .. } if *pdu_type == PduType::H2cData as u8 => {
                Some(Fes::R2tLimitExceeded)
            }
            Self::PduTooLong { .. } => Some(Fes::InvalidHeaderField),
            Self::UnsupportedParameter { .. } => Some(Fes::UnsupportedParameter),
            Self::DataDigest { .. } | Self::Length { .. } | Self::InvalidCommand { .. } => None,
        }
    }

    /// The Fatal Error Information: the byte offset of the offending header field for FES 01h
    /// and 06h (NVMe/TCP 1.0 §3.6.2.4-§3.6.2.5), zero otherwise.
    #[must_use]
    pub fn fei(&self) -> u32 {
        match self {
            Self::InvalidHeaderField { offset, .. } | Self::UnsupportedParameter { offset, .. } => {
                *offset
            }
            Self::PduTooLong { pdu_type, .. } if *pdu_type != PduType::H2cData as u8 => 4,
            _ => 0,
        }
    }

    /// Whether the byte stream can still be used after this error.
    #[must_use]
    pub fn stream_intact(&self) -> bool {
        self.fes().is_none()
    }

    /// The completion status for a non-fatal error: Transient Transport Error for a data
    /// digest error, the carried status for an invalid command.
    #[must_use]
    pub fn status(&self) -> Option<Status> {
        match self {
            Self::DataDigest { .. } => Some(Status::TRANSIENT_TRANSPORT_ERROR),
            Self::InvalidCommand { status, .. } => Some(*status),
            _ => None,
        }
    }
}
