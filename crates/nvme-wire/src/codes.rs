//! The two codes the PDUs, the queue entries and the errors all name: PDU-Type (NVMe/TCP 1.0
//! §3.6.2.1) and the completion status (NVMe Base 2.0 §4.6.1). Only the types are here, below
//! [`crate::error`] (which carries both); what the codec knows of a PDU type (HLEN, the flags
//! it may carry, its largest PLEN) is in [`crate::pdu`], the statuses by name in
//! [`crate::entry`], and each type is re-exported there ([`crate::pdu::PduType`],
//! [`crate::entry::Status`]).

/// PDU-Type, byte 0 of the common header (§3.6.2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2cTermReq = 0x02,
    C2hTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2cData = 0x06,
    C2hData = 0x07,
    R2t = 0x09,
}

/// A completion status: Status Code Type and Status Code (NVMe Base 2.0 §4.6.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status {
    /// SCT, 3 bits.
    pub sct: u8,
    /// SC.
    pub sc: u8,
}
