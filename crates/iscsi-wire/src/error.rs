//! Errors found while framing or parsing PDUs. Each says which answer RFC 7143 wants: most
//! become a Reject PDU (§11.17) naming the offending header; a few leave the stream unusable and
//! end the connection.

use crate::BHS_LEN;

/// A malformed or unacceptable PDU.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum WireError {
    /// The header digest did not match: the header cannot be trusted, not even its lengths, so
    /// the stream is out of sync and the connection must be dropped (RFC 7143 §7.8).
    #[error("header digest mismatch (expected {expected:#010x}, got {got:#010x})")]
    HeaderDigest { expected: u32, got: u32 },
    /// The data digest did not match; the PDU was consumed and should be rejected with reason
    /// Data (payload) Digest Error (RFC 7143 §7.8, §11.17.1).
    #[error("data digest mismatch on {opcode:?} PDU")]
    DataDigest {
        bhs: Box<[u8; BHS_LEN]>,
        opcode: crate::Opcode,
    },
    /// DataSegmentLength over the negotiated MaxRecvDataSegmentLength (RFC 7143 §13.12). The
    /// data cannot be skipped safely without reading it, so this is a protocol error that ends
    /// the connection after a Reject.
    #[error("data segment of {len} bytes exceeds MaxRecvDataSegmentLength {max}")]
    DataSegmentTooLong {
        bhs: Box<[u8; BHS_LEN]>,
        len: u32,
        max: u32,
    },
    /// An opcode that RFC 7143 does not define, or one a target never receives. The whole PDU
    /// was consumed; answer with Reject reason Command not supported (0x05).
    #[error("unsupported opcode {opcode:?}")]
    UnsupportedOpcode {
        bhs: Box<[u8; BHS_LEN]>,
        opcode: crate::Opcode,
    },
    /// A header field violates the RFC in a way that makes the PDU meaningless (Reject reason
    /// Protocol Error, 0x04).
    #[error("invalid {opcode:?} PDU: {reason}")]
    InvalidField {
        bhs: Box<[u8; BHS_LEN]>,
        opcode: crate::Opcode,
        reason: &'static str,
    },
    /// A text segment that is not `key=value` NUL-separated UTF-8 (RFC 7143 §6.1).
    #[error("malformed text segment: {0}")]
    Text(&'static str),
}

impl WireError {
    /// The header of the PDU that caused the error, when it was read intact — what a Reject
    /// carries back (RFC 7143 §11.17).
    #[must_use]
    pub fn rejected_header(&self) -> Option<&[u8; BHS_LEN]> {
        match self {
            Self::DataDigest { bhs, .. }
            | Self::DataSegmentTooLong { bhs, .. }
            | Self::UnsupportedOpcode { bhs, .. }
            | Self::InvalidField { bhs, .. } => Some(bhs),
            Self::HeaderDigest { .. } | Self::Text(_) => None,
        }
    }

    /// Whether the byte stream can still be trusted after this error. When it cannot, the
    /// connection must be closed (after an optional Reject).
    #[must_use]
    pub fn stream_intact(&self) -> bool {
        match self {
            Self::DataDigest { .. }
            | Self::UnsupportedOpcode { .. }
            | Self::InvalidField { .. }
            | Self::Text(_) => true,
            Self::HeaderDigest { .. } | Self::DataSegmentTooLong { .. } => false,
        }
    }
}
