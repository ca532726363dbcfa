//! The Fabrics commands NVMe/TCP needs (NVMe over Fabrics 1.1 §3; NVMe Base 2.0 §6 in the
//! merged 2.0 family): Connect with its 1024-byte data, Property Get/Set, and the headers of
//! Authentication Send/Receive (the DH-HMAC-CHAP messages they carry come later).
//!
//! A Fabrics command is an SQE with opcode 7Fh and FCTYPE in byte 4 (NVMe over Fabrics 1.1
//! §2.1). Its bytes 5..24 are reserved; the flags byte and SGL1 are checked with every
//! other command by [`Sqe::check_tcp`].

use crate::entry::{Sgl, Sqe, Status};
use crate::error::WireError;

/// The Fabrics command opcode.
pub const OPCODE_FABRICS: u8 = 0x7f;

/// FCTYPE values (NVMe over Fabrics 1.1 §3).
pub const FCTYPE_PROPERTY_SET: u8 = 0x00;
pub const FCTYPE_CONNECT: u8 = 0x01;
pub const FCTYPE_PROPERTY_GET: u8 = 0x04;
pub const FCTYPE_AUTH_SEND: u8 = 0x05;
pub const FCTYPE_AUTH_RECEIVE: u8 = 0x06;

/// SECP of in-band authentication: NVMe over Fabrics 1.1 §5.3 (TP 8006), E9h.
pub const SECP_NVME_AUTH: u8 = 0xe9;
/// SPSP0/SPSP1 of DH-HMAC-CHAP (TP 8006): 01h each.
pub const SPSP_DHCHAP: u8 = 0x01;

/// Length of the Connect command's data (NVMe over Fabrics 1.1 §3.3).
pub const CONNECT_DATA_LEN: usize = 1024;
/// NQN fields are 256 bytes, NUL-terminated UTF-8 of at most 223 bytes (NVMe Base 2.0 §4.5).
pub const NQN_FIELD_LEN: usize = 256;
/// Longest NQN.
pub const NQN_MAX_LEN: usize = 223;

/// CNTLID FFFFh in an admin queue Connect: the dynamic controller model, any controller.
pub const CNTLID_DYNAMIC: u16 = 0xffff;

/// Connect response DW0 bits 31:16, AUTHREQ (NVMe over Fabrics 1.1 §3.3;
/// TP 8006): bit 17 ATR, authentication transaction required.
pub const AUTHREQ_ATR: u32 = 1 << 17;
/// Bit 18 ASCR: authentication and secure channel (TLS) concatenation required (TP 8011).
pub const AUTHREQ_ASCR: u32 = 1 << 18;

/// Controller properties (NVMe Base 2.0 §3.1.4; NVMe over Fabrics 1.1 §3.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Property {
    /// 00h, Controller Capabilities, 8 bytes.
    Cap,
    /// 08h, Version, 4 bytes.
    Vs,
    /// 14h, Controller Configuration, 4 bytes.
    Cc,
    /// 1Ch, Controller Status, 4 bytes.
    Csts,
    /// 20h, NVM Subsystem Reset, 4 bytes.
    Nssr,
    /// Any other offset: the controller answers Invalid Field.
    Other(u32),
}

impl Property {
    /// The property at `offset`.
    #[must_use]
    pub fn from_offset(offset: u32) -> Self {
        match offset {
            0x00 => Self::Cap,
            0x08 => Self::Vs,
            0x14 => Self::Cc,
            0x1c => Self::Csts,
            0x20 => Self::Nssr,
            o => Self::Other(o),
        }
    }

    /// The property's offset.
    #[must_use]
    pub fn offset(self) -> u32 {
        match self {
            Self::Cap => 0x00,
            Self::Vs => 0x08,
            Self::Cc => 0x14,
            Self::Csts => 0x1c,
            Self::Nssr => 0x20,
            Self::Other(o) => o,
        }
    }

    /// Whether the property is 8 bytes wide (ATTRIB.SIZE 1) rather than 4 (SIZE 0); `None`
    /// for an unknown one.
    #[must_use]
    pub fn is_8_bytes(self) -> Option<bool> {
        match self {
            Self::Cap => Some(true),
            Self::Vs | Self::Cc | Self::Csts | Self::Nssr => Some(false),
            Self::Other(_) => None,
        }
    }
}

/// Connect (NVMe over Fabrics 1.1 §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Connect {
    /// RECFMT, 0 for this revision.
    pub recfmt: u16,
    /// QID: 0 for the admin queue.
    pub qid: u16,
    /// SQSIZE, 0's based.
    pub sqsize: u16,
    /// CATTR (bit 2: I/O queue deletion; the rest as defined per transport).
    pub cattr: u8,
    /// KATO in milliseconds (admin queue only; 0 disables the keep alive timer).
    pub kato: u32,
}

/// Property Get (NVMe over Fabrics 1.1 §3.4); the value comes back in DW0/DW1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertyGet {
    /// ATTRIB.SIZE: an 8-byte property.
    pub size8: bool,
    pub property: Property,
}

/// Property Set (NVMe over Fabrics 1.1 §3.5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertySet {
    pub size8: bool,
    pub property: Property,
    /// The value (only the low 4 bytes for a 4-byte property).
    pub value: u64,
}

/// Authentication Send / Receive header fields (NVMe over Fabrics 1.1 §3.6-§3.7, TP 8006).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Auth {
    /// Security protocol, [`SECP_NVME_AUTH`].
    pub secp: u8,
    /// Security protocol specific fields, [`SPSP_DHCHAP`] each for DH-HMAC-CHAP.
    pub spsp0: u8,
    pub spsp1: u8,
    /// Transfer Length (Send) or Allocation Length (Receive) in bytes.
    pub len: u32,
}

/// A Fabrics command's type-specific part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FabricsKind {
    Connect(Connect),
    PropertyGet(PropertyGet),
    PropertySet(PropertySet),
    AuthSend(Auth),
    AuthReceive(Auth),
}

/// A decoded Fabrics command: the common SQE fields plus its type-specific part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FabricsCommand {
    pub cid: u16,
    /// The flags byte (PSDT 01b from a Linux host), kept for the round trip.
    pub flags: u8,
    /// SGL1 (Connect and Authentication carry data through it; Property commands ignore it).
    pub sgl: Sgl,
    pub kind: FabricsKind,
}

fn invalid(offset: u32, reason: &'static str) -> WireError {
    WireError::InvalidCommand {
        offset,
        reason,
        status: Status::INVALID_FIELD,
    }
}

impl FabricsCommand {
    /// Interprets an SQE with opcode 7Fh.
    ///
    /// # Errors
    /// [`WireError::InvalidCommand`]: another opcode or an unknown FCTYPE (Invalid Opcode), a
    /// reserved field that is not zero or a reserved ATTRIB size (Invalid Field).
    pub fn decode(sqe: &Sqe) -> Result<Self, WireError> {
        if sqe.opcode != OPCODE_FABRICS {
            return Err(WireError::InvalidCommand {
                offset: 0,
                reason: "not a Fabrics command",
                status: Status::INVALID_OPCODE,
            });
        }
        let fctype = (sqe.nsid & 0xff) as u8;
        if sqe.nsid >> 8 != 0 || sqe.cdw2 != 0 || sqe.cdw3 != 0 || sqe.mptr != 0 {
            return Err(invalid(5, "reserved bytes 5..24 not zero"));
        }
        let [c10, c11, c12, c13, c14, c15] = sqe.cdw;
        let kind = match fctype {
            FCTYPE_CONNECT => {
                if c11 >> 24 != 0 || c13 != 0 || c14 != 0 || c15 != 0 {
                    return Err(invalid(47, "reserved Connect bytes not zero"));
                }
                FabricsKind::Connect(Connect {
                    recfmt: (c10 & 0xffff) as u16,
                    qid: (c10 >> 16) as u16,
                    sqsize: (c11 & 0xffff) as u16,
                    cattr: ((c11 >> 16) & 0xff) as u8,
                    kato: c12,
                })
            }
            FCTYPE_PROPERTY_GET | FCTYPE_PROPERTY_SET => {
                if c10 & !1 != 0 {
                    return Err(invalid(40, "reserved ATTRIB bits or size"));
                }
                let size8 = c10 & 1 != 0;
                let property = Property::from_offset(c11);
                if fctype == FCTYPE_PROPERTY_GET {
                    if c12 != 0 || c13 != 0 || c14 != 0 || c15 != 0 {
                        return Err(invalid(48, "reserved Property Get bytes not zero"));
                    }
                    FabricsKind::PropertyGet(PropertyGet { size8, property })
                } else {
                    if c14 != 0 || c15 != 0 {
                        return Err(invalid(56, "reserved Property Set bytes not zero"));
                    }
                    FabricsKind::PropertySet(PropertySet {
                        size8,
                        property,
                        value: u64::from(c12) | u64::from(c13) << 32,
                    })
                }
            }
            FCTYPE_AUTH_SEND | FCTYPE_AUTH_RECEIVE => {
                if c10 & 0xff != 0 || c12 != 0 || c13 != 0 || c14 != 0 || c15 != 0 {
                    return Err(invalid(40, "reserved Authentication bytes not zero"));
                }
                let auth = Auth {
                    spsp0: ((c10 >> 8) & 0xff) as u8,
                    spsp1: ((c10 >> 16) & 0xff) as u8,
                    secp: (c10 >> 24) as u8,
                    len: c11,
                };
                if fctype == FCTYPE_AUTH_SEND {
                    FabricsKind::AuthSend(auth)
                } else {
                    FabricsKind::AuthReceive(auth)
                }
            }
            _ => {
                return Err(WireError::InvalidCommand {
                    offset: 4,
                    reason: "unknown FCTYPE",
                    status: Status::INVALID_OPCODE,
                })
            }
        };
        Ok(Self {
            cid: sqe.cid,
            flags: sqe.flags,
            sgl: sqe.sgl,
            kind,
        })
    }

    /// The SQE for this command.
    #[must_use]
    pub fn to_sqe(&self) -> Sqe {
        let (fctype, cdw) = match self.kind {
            FabricsKind::Connect(c) => (
                FCTYPE_CONNECT,
                [
                    u32::from(c.recfmt) | u32::from(c.qid) << 16,
                    u32::from(c.sqsize) | u32::from(c.cattr) << 16,
                    c.kato,
                    0,
                    0,
                    0,
                ],
            ),
            FabricsKind::PropertyGet(p) => (
                FCTYPE_PROPERTY_GET,
                [u32::from(p.size8), p.property.offset(), 0, 0, 0, 0],
            ),
            FabricsKind::PropertySet(p) => (
                FCTYPE_PROPERTY_SET,
                [
                    u32::from(p.size8),
                    p.property.offset(),
                    (p.value & 0xffff_ffff) as u32,
                    (p.value >> 32) as u32,
                    0,
                    0,
                ],
            ),
            FabricsKind::AuthSend(a) | FabricsKind::AuthReceive(a) => (
                if matches!(self.kind, FabricsKind::AuthSend(_)) {
                    FCTYPE_AUTH_SEND
                } else {
                    FCTYPE_AUTH_RECEIVE
                },
                [
                    u32::from(a.spsp0) << 8 | u32::from(a.spsp1) << 16 | u32::from(a.secp) << 24,
                    a.len,
                    0,
                    0,
                    0,
                    0,
                ],
            ),
        };
        Sqe {
            opcode: OPCODE_FABRICS,
            flags: self.flags,
            cid: self.cid,
            nsid: u32::from(fctype),
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            sgl: self.sgl,
            cdw,
        }
    }
}

/// The Connect command's data (NVMe over Fabrics 1.1 §3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectData {
    /// HOSTID, the host identifier (a UUID).
    pub hostid: [u8; 16],
    /// CNTLID: [`CNTLID_DYNAMIC`] on the admin queue, the controller's ID on I/O queues.
    pub cntlid: u16,
    /// SUBNQN, the subsystem the host connects to.
    pub subnqn: String,
    /// HOSTNQN.
    pub hostnqn: String,
}

fn nqn(field: &[u8], offset: u32) -> Result<String, WireError> {
    let end = field
        .iter()
        .position(|&b| b == 0)
        .ok_or(invalid(offset, "NQN not NUL-terminated"))?;
    if end == 0 || end > NQN_MAX_LEN {
        return Err(invalid(offset, "NQN empty or longer than 223 bytes"));
    }
    if field[end..].iter().any(|&b| b != 0) {
        return Err(invalid(offset, "bytes after the NQN's NUL not zero"));
    }
    std::str::from_utf8(&field[..end])
        .map(str::to_owned)
        .map_err(|_| invalid(offset, "NQN not UTF-8"))
}

impl ConnectData {
    /// Reads the 1024-byte data.
    ///
    /// # Errors
    /// [`WireError::Length`] for another length; [`WireError::InvalidCommand`] (Connect Invalid
    /// Parameters) for a malformed NQN or non-zero reserved bytes; the offset is in the data.
    pub fn decode(b: &[u8]) -> Result<Self, WireError> {
        if b.len() != CONNECT_DATA_LEN {
            return Err(WireError::Length {
                what: "Connect data",
                expected: CONNECT_DATA_LEN,
                got: b.len(),
            });
        }
        let params = |e: WireError| match e {
            WireError::InvalidCommand { offset, reason, .. } => WireError::InvalidCommand {
                offset,
                reason,
                status: Status::CONNECT_INVALID_PARAMETERS,
            },
            e => e,
        };
        if b[18..256].iter().any(|&x| x != 0) || b[768..].iter().any(|&x| x != 0) {
            return Err(params(invalid(18, "reserved Connect data not zero")));
        }
        let mut hostid = [0u8; 16];
        hostid.copy_from_slice(&b[..16]);
        Ok(Self {
            hostid,
            cntlid: u16::from_le_bytes([b[16], b[17]]),
            subnqn: nqn(&b[256..512], 256).map_err(params)?,
            hostnqn: nqn(&b[512..768], 512).map_err(params)?,
        })
    }

    /// Writes the 1024-byte data.
    ///
    /// # Errors
    /// [`WireError::Length`] when an NQN is empty, longer than 223 bytes or contains a NUL.
    pub fn encode(&self) -> Result<[u8; CONNECT_DATA_LEN], WireError> {
        let mut b = [0u8; CONNECT_DATA_LEN];
        b[..16].copy_from_slice(&self.hostid);
        b[16..18].copy_from_slice(&self.cntlid.to_le_bytes());
        for (s, at) in [(&self.subnqn, 256), (&self.hostnqn, 512)] {
            if s.is_empty() || s.len() > NQN_MAX_LEN || s.contains('\0') {
                return Err(WireError::Length {
                    what: "NQN (1..=223 bytes, no NUL)",
                    expected: NQN_MAX_LEN,
                    got: s.len(),
                });
            }
            b[at..at + s.len()].copy_from_slice(s.as_bytes());
        }
        Ok(b)
    }
}

/// The Connect response's DW0 (NVMe over Fabrics 1.1 §3.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectResponse {
    /// CNTLID the controller allocated (admin queue).
    pub cntlid: u16,
    /// AUTHREQ.ATR: the host must authenticate before any other command.
    pub atr: bool,
    /// AUTHREQ.ASCR: authentication and secure channel concatenation required.
    pub ascr: bool,
}

impl ConnectResponse {
    /// Reads DW0 (other AUTHREQ bits are reserved and ignored).
    #[must_use]
    pub fn from_dw0(dw0: u32) -> Self {
        Self {
            cntlid: (dw0 & 0xffff) as u16,
            atr: dw0 & AUTHREQ_ATR != 0,
            ascr: dw0 & AUTHREQ_ASCR != 0,
        }
    }

    /// Writes DW0.
    #[must_use]
    pub fn dw0(self) -> u32 {
        u32::from(self.cntlid)
            | if self.atr { AUTHREQ_ATR } else { 0 }
            | if self.ascr { AUTHREQ_ASCR } else { 0 }
    }
}
