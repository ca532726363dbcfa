//! PDU opcodes (RFC 7143 §11.2.1.2).

/// A six-bit opcode. A newtype rather than an enum so that unknown values survive a parse and can
/// be answered with a Reject naming them.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Opcode(pub u8);

impl Opcode {
    // Initiator opcodes.
    pub const NOP_OUT: Self = Self(0x00);
    pub const SCSI_COMMAND: Self = Self(0x01);
    pub const TASK_MGMT_REQUEST: Self = Self(0x02);
    pub const LOGIN_REQUEST: Self = Self(0x03);
    pub const TEXT_REQUEST: Self = Self(0x04);
    pub const SCSI_DATA_OUT: Self = Self(0x05);
    pub const LOGOUT_REQUEST: Self = Self(0x06);
    pub const SNACK_REQUEST: Self = Self(0x10);
    // Target opcodes.
    pub const NOP_IN: Self = Self(0x20);
    pub const SCSI_RESPONSE: Self = Self(0x21);
    pub const TASK_MGMT_RESPONSE: Self = Self(0x22);
    pub const LOGIN_RESPONSE: Self = Self(0x23);
    pub const TEXT_RESPONSE: Self = Self(0x24);
    pub const SCSI_DATA_IN: Self = Self(0x25);
    pub const LOGOUT_RESPONSE: Self = Self(0x26);
    pub const R2T: Self = Self(0x31);
    pub const ASYNC_MESSAGE: Self = Self(0x32);
    pub const REJECT: Self = Self(0x3f);

    /// The RFC's name for this opcode, or `None` for an opcode RFC 7143 does not define.
    #[must_use]
    pub const fn name(self) -> Option<&'static str> {
        Some(match self.0 {
            0x00 => "NOP-Out",
            0x01 => "SCSI Command",
            0x02 => "Task Management Function Request",
            0x03 => "Login Request",
            0x04 => "Text Request",
            0x05 => "SCSI Data-Out",
            0x06 => "Logout Request",
            0x10 => "SNACK Request",
            0x20 => "NOP-In",
            0x21 => "SCSI Response",
            0x22 => "Task Management Function Response",
            0x23 => "Login Response",
            0x24 => "Text Response",
            0x25 => "SCSI Data-In",
            0x26 => "Logout Response",
            0x31 => "Ready To Transfer",
            0x32 => "Asynchronous Message",
            0x3f => "Reject",
            _ => return None,
        })
    }

    /// Whether an initiator sends this opcode (RFC 7143 §11.2.1.2: 0x00–0x1f).
    #[must_use]
    pub const fn is_initiator(self) -> bool {
        self.0 < 0x20
    }
}

impl std::fmt::Debug for Opcode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.name() {
            Some(n) => write!(f, "{n}"),
            None => write!(f, "Opcode({:#04x})", self.0),
        }
    }
}
