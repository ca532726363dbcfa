//! Submission and completion queue entries (NVMe Base 2.0 §4.2, §4.6) and the SGL descriptors
//! NVMe/TCP uses (NVMe Base 2.0 §4.3.2; NVMe/TCP 1.0 §3.3.1, §3.4.1). All fields little-endian.

pub use crate::codes::Status;
use crate::error::WireError;

/// Length of a submission queue entry.
pub const SQE_LEN: usize = 64;
/// Length of a completion queue entry.
pub const CQE_LEN: usize = 16;
/// Length of an SGL descriptor.
pub const SGL_LEN: usize = 16;

/// CDW0.PSDT for SGLs, as NVMe over Fabrics requires (NVMe Base 2.0 §4.2: 01b in
/// bits 7:6 of the flags byte).
pub const PSDT_SGL: u8 = 0x40;
/// The PSDT bits of the flags byte.
pub const PSDT_MASK: u8 = 0xc0;
/// The FUSE bits of the flags byte.
pub const FUSE_MASK: u8 = 0x03;

/// SGL identifier (byte 15) of a Data Block descriptor with the Offset subtype: data in the
/// capsule, `address` an offset into it (NVMe Base 2.0 §4.3.2; NVMe/TCP 1.0 §3.3.1).
pub const SGL_ID_IN_CAPSULE: u8 = 0x01;
/// SGL identifier of a Transport SGL Data Block with the transport-specific subtype Ah: data
/// moved by H2CData/C2HData, address zero (NVMe/TCP 1.0 §3.4.1).
pub const SGL_ID_TRANSPORT: u8 = 0x5a;

/// The SGL descriptor in DPTR (SQE bytes 24..40). NVMe/TCP uses two kinds; anything else is
/// kept raw for the controller to refuse with [`Status::SGL_DESCRIPTOR_TYPE_INVALID`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sgl {
    /// In-capsule data: `length` bytes at `offset` into the capsule's data.
    InCapsule { offset: u64, length: u32 },
    /// Data through the transport (R2T/H2CData for writes, C2HData for reads).
    Transport { length: u32 },
    /// Any other descriptor, or one of the two above with non-zero reserved bytes.
    Other([u8; SGL_LEN]),
}

impl Sgl {
    /// Reads a descriptor.
    #[must_use]
    pub fn from_bytes(b: &[u8; SGL_LEN]) -> Self {
        let mut addr = [0u8; 8];
        addr.copy_from_slice(&b[..8]);
        let address = u64::from_le_bytes(addr);
        let length = u32::from_le_bytes([b[8], b[9], b[10], b[11]]);
        let reserved_zero = b[12..15] == [0, 0, 0];
        match b[15] {
            SGL_ID_IN_CAPSULE if reserved_zero => Self::InCapsule {
                offset: address,
                length,
            },
            SGL_ID_TRANSPORT if reserved_zero && address == 0 => Self::Transport { length },
            _ => Self::Other(*b),
        }
    }

    /// Writes the descriptor.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SGL_LEN] {
        let mut b = [0u8; SGL_LEN];
        match *self {
            Self::InCapsule { offset, length } => {
                b[..8].copy_from_slice(&offset.to_le_bytes());
                b[8..12].copy_from_slice(&length.to_le_bytes());
                b[15] = SGL_ID_IN_CAPSULE;
            }
            Self::Transport { length } => {
                b[8..12].copy_from_slice(&length.to_le_bytes());
                b[15] = SGL_ID_TRANSPORT;
            }
            Self::Other(raw) => b = raw,
        }
        b
    }

    /// The data length the descriptor describes (0 for an unknown one).
    #[must_use]
    pub fn length(&self) -> u32 {
        match *self {
            Self::InCapsule { length, .. } | Self::Transport { length } => length,
            Self::Other(_) => 0,
        }
    }
}

/// A 64-byte submission queue entry (NVMe Base 2.0 §4.2), kept with every dword so
/// that it re-encodes byte for byte; [`crate::fabrics`] interprets the Fabrics ones.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sqe {
    /// CDW0 byte 0.
    pub opcode: u8,
    /// CDW0 byte 1: FUSE (bits 1:0), reserved (5:2), PSDT (7:6).
    pub flags: u8,
    /// CDW0 bytes 3:2, the command identifier.
    pub cid: u16,
    /// Namespace identifier (for Fabrics commands: FCTYPE in its low byte).
    pub nsid: u32,
    pub cdw2: u32,
    pub cdw3: u32,
    /// Metadata pointer.
    pub mptr: u64,
    /// DPTR: SGL1.
    pub sgl: Sgl,
    /// CDW10 to CDW15.
    pub cdw: [u32; 6],
}

fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

impl Sqe {
    /// An SGL command with all other fields zero.
    #[must_use]
    pub fn new(opcode: u8, cid: u16, sgl: Sgl) -> Self {
        Self {
            opcode,
            flags: PSDT_SGL,
            cid,
            nsid: 0,
            cdw2: 0,
            cdw3: 0,
            mptr: 0,
            sgl,
            cdw: [0; 6],
        }
    }

    /// Reads an entry.
    #[must_use]
    pub fn from_bytes(b: &[u8; SQE_LEN]) -> Self {
        let mut mptr = [0u8; 8];
        mptr.copy_from_slice(&b[16..24]);
        let mut sgl = [0u8; SGL_LEN];
        sgl.copy_from_slice(&b[24..40]);
        let mut cdw = [0u32; 6];
        for (i, d) in cdw.iter_mut().enumerate() {
            *d = le32(b, 40 + 4 * i);
        }
        Self {
            opcode: b[0],
            flags: b[1],
            cid: u16::from_le_bytes([b[2], b[3]]),
            nsid: le32(b, 4),
            cdw2: le32(b, 8),
            cdw3: le32(b, 12),
            mptr: u64::from_le_bytes(mptr),
            sgl: Sgl::from_bytes(&sgl),
            cdw,
        }
    }

    /// Writes the entry.
    #[must_use]
    pub fn to_bytes(&self) -> [u8; SQE_LEN] {
        let mut b = [0u8; SQE_LEN];
        b[0] = self.opcode;
        b[1] = self.flags;
        b[2..4].copy_from_slice(&self.cid.to_le_bytes());
        b[4..8].copy_from_slice(&self.nsid.to_le_bytes());
        b[8..12].copy_from_slice(&self.cdw2.to_le_bytes());
        b[12..16].copy_from_slice(&self.cdw3.to_le_bytes());
        b[16..24].copy_from_slice(&self.mptr.to_le_bytes());
        b[24..40].copy_from_slice(&self.sgl.to_bytes());
        for (i, d) in self.cdw.iter().enumerate() {
            b[40 + 4 * i..44 + 4 * i].copy_from_slice(&d.to_le_bytes());
        }
        b
    }

    /// Checks what NVMe/TCP requires of every command: SGLs (PSDT 01b, NVMe over Fabrics 1.1
    /// §2.1 / NVMe Base 2.0 §4.2), no reserved flag bits, and a data descriptor NVMe/TCP
    /// defines, whose in-capsule extent lies within `in_capsule_len` bytes of capsule data
    /// (NVMe/TCP 1.0 §3.3.1).
    ///
    /// # Errors
    /// [`WireError::InvalidCommand`] with the status the completion carries.
    pub fn check_tcp(&self, in_capsule_len: usize) -> Result<(), WireError> {
        let invalid = |offset, reason, status| {
            Err(WireError::InvalidCommand {
                offset,
                reason,
                status,
            })
        };
        if self.flags & PSDT_MASK != PSDT_SGL || self.flags & !(PSDT_MASK | FUSE_MASK) != 0 {
            return invalid(
                1,
                "PSDT is not SGL, or reserved bits set",
                Status::INVALID_FIELD,
            );
        }
        match self.sgl {
            Sgl::Other(_) => invalid(
                39,
                "SGL descriptor type NVMe/TCP does not use",
                Status::SGL_DESCRIPTOR_TYPE_INVALID,
            ),
            Sgl::InCapsule { offset, length } => {
                let end = offset.checked_add(u64::from(length));
                if end.is_none_or(|e| e > in_capsule_len as u64) {
                    let status = if offset == 0 {
                        Status::DATA_SGL_LENGTH_INVALID
                    } else {
                        Status::SGL_OFFSET_INVALID
                    };
                    return invalid(24, "in-capsule SGL beyond the capsule data", status);
                }
                Ok(())
            }
            Sgl::Transport { .. } if in_capsule_len != 0 => invalid(
                39,
                "in-capsule data with a transport SGL",
                Status::DATA_SGL_LENGTH_INVALID,
            ),
            Sgl::Transport { .. } => Ok(()),
        }
    }
}

/// SCT 0h: generic command status.
pub const SCT_GENERIC: u8 = 0;
/// SCT 1h: command specific status (Fabrics statuses included).
pub const SCT_COMMAND_SPECIFIC: u8 = 1;
/// SCT 2h: media and data integrity errors.
pub const SCT_MEDIA: u8 = 2;
/// SCT 3h: path related status.
pub const SCT_PATH: u8 = 3;

// The statuses by name; the type is `crate::codes::Status`, below the errors that carry it.
impl Status {
    const fn g(sc: u8) -> Self {
        Self {
            sct: SCT_GENERIC,
            sc,
        }
    }
    const fn cs(sc: u8) -> Self {
        Self {
            sct: SCT_COMMAND_SPECIFIC,
            sc,
        }
    }
    const fn media(sc: u8) -> Self {
        Self { sct: SCT_MEDIA, sc }
    }

    // Generic command status (NVMe Base 2.0 §4.6.1.2.1).
    pub const SUCCESS: Self = Self::g(0x00);
    pub const INVALID_OPCODE: Self = Self::g(0x01);
    pub const INVALID_FIELD: Self = Self::g(0x02);
    pub const COMMAND_ID_CONFLICT: Self = Self::g(0x03);
    pub const DATA_TRANSFER_ERROR: Self = Self::g(0x04);
    pub const INTERNAL_ERROR: Self = Self::g(0x06);
    pub const ABORT_REQUESTED: Self = Self::g(0x07);
    pub const INVALID_NAMESPACE: Self = Self::g(0x0b);
    pub const COMMAND_SEQUENCE_ERROR: Self = Self::g(0x0c);
    pub const SGL_SEGMENT_DESCRIPTOR_INVALID: Self = Self::g(0x0d);
    pub const SGL_DESCRIPTOR_COUNT_INVALID: Self = Self::g(0x0e);
    pub const DATA_SGL_LENGTH_INVALID: Self = Self::g(0x0f);
    pub const METADATA_SGL_LENGTH_INVALID: Self = Self::g(0x10);
    pub const SGL_DESCRIPTOR_TYPE_INVALID: Self = Self::g(0x11);
    pub const SGL_OFFSET_INVALID: Self = Self::g(0x16);
    pub const KEEP_ALIVE_TIMEOUT_EXPIRED: Self = Self::g(0x19);
    pub const TRANSIENT_TRANSPORT_ERROR: Self = Self::g(0x22);
    pub const LBA_OUT_OF_RANGE: Self = Self::g(0x80);
    pub const CAPACITY_EXCEEDED: Self = Self::g(0x81);
    pub const NAMESPACE_NOT_READY: Self = Self::g(0x82);
    pub const RESERVATION_CONFLICT: Self = Self::g(0x83);

    // Command specific status (NVMe Base 2.0 §4.6.1.2.2).
    pub const INVALID_COMPLETION_QUEUE: Self = Self::cs(0x00);
    pub const INVALID_QUEUE_IDENTIFIER: Self = Self::cs(0x01);
    pub const INVALID_QUEUE_SIZE: Self = Self::cs(0x02);
    pub const ASYNC_EVENT_LIMIT_EXCEEDED: Self = Self::cs(0x05);
    pub const INVALID_LOG_PAGE: Self = Self::cs(0x09);
    pub const FEATURE_NOT_SAVEABLE: Self = Self::cs(0x0d);
    pub const FEATURE_NOT_CHANGEABLE: Self = Self::cs(0x0e);
    pub const FEATURE_NOT_NAMESPACE_SPECIFIC: Self = Self::cs(0x0f);

    // Fabrics command status (NVMe over Fabrics 1.1 §2.2.1; SCT 1h).
    pub const CONNECT_INCOMPATIBLE_FORMAT: Self = Self::cs(0x80);
    pub const CONNECT_CONTROLLER_BUSY: Self = Self::cs(0x81);
    pub const CONNECT_INVALID_PARAMETERS: Self = Self::cs(0x82);
    pub const CONNECT_RESTART_DISCOVERY: Self = Self::cs(0x83);
    pub const CONNECT_INVALID_HOST: Self = Self::cs(0x84);
    pub const INVALID_QUEUE_TYPE: Self = Self::cs(0x85);
    pub const DISCOVER_RESTART: Self = Self::cs(0x90);
    pub const AUTHENTICATION_REQUIRED: Self = Self::cs(0x91);

    // Media and data integrity errors (NVMe Base 2.0 §4.6.1.2.3).
    pub const WRITE_FAULT: Self = Self::media(0x80);
    pub const UNRECOVERED_READ_ERROR: Self = Self::media(0x81);
    pub const COMPARE_FAILURE: Self = Self::media(0x85);
    pub const ACCESS_DENIED: Self = Self::media(0x86);

    /// Whether this is Successful Completion.
    #[must_use]
    pub fn is_success(self) -> bool {
        self == Self::SUCCESS
    }
}

/// A 16-byte completion queue entry (NVMe Base 2.0 §4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cqe {
    /// DW0, command specific (Connect: CNTLID and AUTHREQ; Property Get: the value's low half).
    pub dw0: u32,
    /// DW1, command specific (Property Get: the value's high half).
    pub dw1: u32,
    /// SQ Head Pointer.
    pub sqhd: u16,
    /// SQ Identifier.
    pub sqid: u16,
    /// The command's CID.
    pub cid: u16,
    pub status: Status,
    /// Phase tag, bit 0 of the status field (ignored on fabrics, kept for the round trip).
    pub phase: bool,
    /// Command Retry Delay, bits 13:12.
    pub crd: u8,
    /// More: a log page has more information, bit 14.
    pub more: bool,
    /// Do Not Retry, bit 15.
    pub dnr: bool,
}

impl Cqe {
    /// A completion for `cid` with `status`, everything else zero.
    #[must_use]
    pub fn new(cid: u16, status: Status) -> Self {
        Self {
            dw0: 0,
            dw1: 0,
            sqhd: 0,
            sqid: 0,
            cid,
            status,
            phase: false,
            crd: 0,
            more: false,
            dnr: false,
        }
    }

    /// Reads an entry.
    #[must_use]
    pub fn from_bytes(b: &[u8; CQE_LEN]) -> Self {
        let sf = u16::from_le_bytes([b[14], b[15]]);
        Self {
            dw0: le32(b, 0),
            dw1: le32(b, 4),
            sqhd: u16::from_le_bytes([b[8], b[9]]),
            sqid: u16::from_le_bytes([b[10], b[11]]),
            cid: u16::from_le_bytes([b[12], b[13]]),
            status: Status {
                sct: ((sf >> 9) & 0x7) as u8,
                sc: ((sf >> 1) & 0xff) as u8,
            },
            phase: sf & 1 != 0,
            crd: ((sf >> 12) & 0x3) as u8,
            more: sf & (1 << 14) != 0,
            dnr: sf & (1 << 15) != 0,
        }
    }

    /// Writes the entry (SCT and CRD are truncated to their 3 and 2 bits).
    #[must_use]
    pub fn to_bytes(&self) -> [u8; CQE_LEN] {
        let sf = u16::from(self.phase)
            | u16::from(self.status.sc) << 1
            | u16::from(self.status.sct & 0x7) << 9
            | u16::from(self.crd & 0x3) << 12
            | u16::from(self.more) << 14
            | u16::from(self.dnr) << 15;
        let mut b = [0u8; CQE_LEN];
        b[0..4].copy_from_slice(&self.dw0.to_le_bytes());
        b[4..8].copy_from_slice(&self.dw1.to_le_bytes());
        b[8..10].copy_from_slice(&self.sqhd.to_le_bytes());
        b[10..12].copy_from_slice(&self.sqid.to_le_bytes());
        b[12..14].copy_from_slice(&self.cid.to_le_bytes());
        b[14..16].copy_from_slice(&sf.to_le_bytes());
        b
    }
}
