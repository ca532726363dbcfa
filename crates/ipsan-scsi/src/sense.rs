//! Sense data and status codes (SPC-4 §4.5, SAM-5 §5.3).
//!
//! A failed command answers CHECK CONDITION plus sense data; the iSCSI layer carries the bytes
//! from [`Sense::to_fixed`] in the SCSI Response data segment (RFC 7143 §11.4.7.2).

/// Sense key (SPC-4 §4.5.6, table 48). A newtype so unknown values survive a parse.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct SenseKey(pub u8);

impl SenseKey {
    /// No specific sense key information to report.
    pub const NO_SENSE: Self = Self(0x0);
    /// The command completed with recovery action.
    pub const RECOVERED_ERROR: Self = Self(0x1);
    /// The logical unit is not accessible.
    pub const NOT_READY: Self = Self(0x2);
    /// Non-recoverable error, probably a medium flaw.
    pub const MEDIUM_ERROR: Self = Self(0x3);
    /// Non-recoverable hardware failure.
    pub const HARDWARE_ERROR: Self = Self(0x4);
    /// Bad field in the CDB or parameter data.
    pub const ILLEGAL_REQUEST: Self = Self(0x5);
    /// A unit attention condition was established.
    pub const UNIT_ATTENTION: Self = Self(0x6);
    /// Write (or read) to a protected block.
    pub const DATA_PROTECT: Self = Self(0x7);
    /// Write once device found a non-blank block.
    pub const BLANK_CHECK: Self = Self(0x8);
    /// Vendor specific.
    pub const VENDOR_SPECIFIC: Self = Self(0x9);
    /// EXTENDED COPY was aborted.
    pub const COPY_ABORTED: Self = Self(0xA);
    /// The device server aborted the command.
    pub const ABORTED_COMMAND: Self = Self(0xB);
    /// Buffered data overflowed the medium.
    pub const VOLUME_OVERFLOW: Self = Self(0xD);
    /// Source data did not match the medium (VERIFY, COMPARE AND WRITE).
    pub const MISCOMPARE: Self = Self(0xE);
    /// Completed (SPC-4 §4.5.6).
    pub const COMPLETED: Self = Self(0xF);

    /// The key's name as SPC-4 table 48 spells it; "RESERVED" for 0Ch.
    pub const fn name(self) -> &'static str {
        match self.0 & 0x0F {
            0x0 => "NO SENSE",
            0x1 => "RECOVERED ERROR",
            0x2 => "NOT READY",
            0x3 => "MEDIUM ERROR",
            0x4 => "HARDWARE ERROR",
            0x5 => "ILLEGAL REQUEST",
            0x6 => "UNIT ATTENTION",
            0x7 => "DATA PROTECT",
            0x8 => "BLANK CHECK",
            0x9 => "VENDOR SPECIFIC",
            0xA => "COPY ABORTED",
            0xB => "ABORTED COMMAND",
            0xD => "VOLUME OVERFLOW",
            0xE => "MISCOMPARE",
            0xF => "COMPLETED",
            _ => "RESERVED",
        }
    }
}

/// SCSI status byte (SAM-5 §5.3.1, table 33).
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct ScsiStatus(pub u8);

impl ScsiStatus {
    /// The command completed.
    pub const GOOD: Self = Self(0x00);
    /// Sense data describes what went wrong.
    pub const CHECK_CONDITION: Self = Self(0x02);
    /// PRE-FETCH: the requested range fits in the cache.
    pub const CONDITION_MET: Self = Self(0x04);
    /// The logical unit is busy.
    pub const BUSY: Self = Self(0x08);
    /// The command conflicts with a reservation.
    pub const RESERVATION_CONFLICT: Self = Self(0x18);
    /// The task set is full.
    pub const TASK_SET_FULL: Self = Self(0x28);
    /// An ACA condition exists.
    pub const ACA_ACTIVE: Self = Self(0x30);
    /// The command was aborted by another I_T nexus.
    pub const TASK_ABORTED: Self = Self(0x40);
}

/// Sense-key specific field pointer (SPC-4 §4.5.2.4.2): which byte (and bit) of the CDB or of
/// the parameter list was wrong.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub struct FieldPointer {
    /// `true`: the error is in the CDB; `false`: in the parameter data (C/D bit).
    pub in_cdb: bool,
    /// Byte offset of the offending field.
    pub byte: u16,
    /// Bit of the offending field's most significant bit, if known (BPV).
    pub bit: Option<u8>,
}

/// Sense data for one failed command (SPC-4 §4.5).
#[derive(Clone, PartialEq, Eq, Debug)]
pub struct Sense {
    /// Sense key.
    pub key: SenseKey,
    /// Additional sense code.
    pub asc: u8,
    /// Additional sense code qualifier.
    pub ascq: u8,
    /// INFORMATION field (e.g. the offset of the first miscompare); sets VALID.
    pub information: Option<u64>,
    /// Sense-key specific field pointer for ILLEGAL REQUEST.
    pub field: Option<FieldPointer>,
}

impl Sense {
    /// Sense with the given key, ASC and ASCQ, no INFORMATION and no field pointer.
    pub const fn new(key: SenseKey, asc: u8, ascq: u8) -> Self {
        Self {
            key,
            asc,
            ascq,
            information: None,
            field: None,
        }
    }

    /// Adds a CDB field pointer (byte, optional bit).
    pub fn with_cdb_field(mut self, byte: u16, bit: Option<u8>) -> Self {
        self.field = Some(FieldPointer {
            in_cdb: true,
            byte,
            bit,
        });
        self
    }

    /// Adds a parameter-list field pointer.
    pub fn with_param_field(mut self, byte: u16, bit: Option<u8>) -> Self {
        self.field = Some(FieldPointer {
            in_cdb: false,
            byte,
            bit,
        });
        self
    }

    /// Adds the INFORMATION field.
    pub fn with_information(mut self, info: u64) -> Self {
        self.information = Some(info);
        self
    }

    /// 18-byte fixed format sense data, response code 70h (SPC-4 §4.5.3, table 45).
    ///
    /// INFORMATION is 4 bytes in this format; a larger value clears VALID (SPC-4 §4.5.3) rather
    /// than reporting a truncated number.
    pub fn to_fixed(&self) -> Vec<u8> {
        let mut b = vec![0u8; 18];
        b[0] = 0x70;
        if let Some(info) = self.information {
            if let Ok(v) = u32::try_from(info) {
                b[0] |= 0x80;
                b[3..7].copy_from_slice(&v.to_be_bytes());
            }
        }
        b[2] = self.key.0 & 0x0F;
        b[7] = 10; // additional sense length: bytes 8..18
        b[12] = self.asc;
        b[13] = self.ascq;
        if let Some(f) = self.field {
            let mut v = 0x80; // SKSV
            if f.in_cdb {
                v |= 0x40;
            }
            if let Some(bit) = f.bit {
                v |= 0x08 | (bit & 0x07);
            }
            b[15] = v;
            b[16..18].copy_from_slice(&f.byte.to_be_bytes());
        }
        b
    }

    /// Descriptor format sense data, response code 72h (SPC-4 §4.5.2), used when the control
    /// mode page's D_SENSE bit is set. Carries INFORMATION (descriptor 00h) and the
    /// sense-key specific field (descriptor 02h).
    pub fn to_descriptor(&self) -> Vec<u8> {
        let mut b = vec![0x72, self.key.0 & 0x0F, self.asc, self.ascq, 0, 0, 0, 0];
        if let Some(info) = self.information {
            b.extend_from_slice(&[0x00, 0x0A, 0x80, 0x00]);
            b.extend_from_slice(&info.to_be_bytes());
        }
        if let Some(f) = self.field {
            let mut v = 0x80;
            if f.in_cdb {
                v |= 0x40;
            }
            if let Some(bit) = f.bit {
                v |= 0x08 | (bit & 0x07);
            }
            let [hi, lo] = f.byte.to_be_bytes();
            b.extend_from_slice(&[0x02, 0x06, 0, 0, v, hi, lo, 0]);
        }
        b[7] = (b.len() - 8) as u8;
        b
    }

    /// Parses fixed (70h/71h, SPC-4 §4.5.3) or descriptor (72h/73h, SPC-4 §4.5.2) format
    /// sense data as a target sent it: key, ASC/ASCQ, INFORMATION when VALID, and the field
    /// pointer of an ILLEGAL REQUEST. Fixed data shorter than 18 bytes (some targets send 8
    /// bytes and the key) yields what is there. `None` when the buffer is too short or the
    /// response code is unknown. Never panics on any input.
    pub fn parse(buf: &[u8]) -> Option<Self> {
        let field_pointer = |key: SenseKey, sks: &[u8]| -> Option<FieldPointer> {
            let [v, hi, lo] = *sks else { return None };
            (key == SenseKey::ILLEGAL_REQUEST && v & 0x80 != 0).then(|| FieldPointer {
                in_cdb: v & 0x40 != 0,
                byte: u16::from_be_bytes([hi, lo]),
                bit: (v & 0x08 != 0).then_some(v & 0x07),
            })
        };
        match buf.first()? & 0x7F {
            0x70 | 0x71 => {
                let key = SenseKey(buf.get(2)? & 0x0F);
                let valid = buf[0] & 0x80 != 0;
                let information = buf
                    .get(3..7)
                    .filter(|_| valid)
                    .map(|b| u64::from(u32::from_be_bytes([b[0], b[1], b[2], b[3]])));
                Some(Self {
                    key,
                    asc: buf.get(12).copied().unwrap_or(0),
                    ascq: buf.get(13).copied().unwrap_or(0),
                    information,
                    field: buf.get(15..18).and_then(|sks| field_pointer(key, sks)),
                })
            }
            0x72 | 0x73 => {
                let key = SenseKey(buf.get(1)? & 0x0F);
                let mut sense = Self::new(key, *buf.get(2)?, *buf.get(3)?);
                // Descriptors start at byte 8 (SPC-4 §4.5.2.1).
                let end = (8 + usize::from(buf.get(7).copied().unwrap_or(0))).min(buf.len());
                let mut i = 8;
                while i + 2 <= end {
                    let (dtype, dlen) = (buf[i], usize::from(buf[i + 1]));
                    let body = buf.get(i + 2..(i + 2 + dlen).min(end)).unwrap_or(&[]);
                    match dtype {
                        // Information (§4.5.2.2): VALID, reserved, 8-byte INFORMATION.
                        0x00 if body.len() >= 10 && body[0] & 0x80 != 0 => {
                            let mut b = [0u8; 8];
                            b.copy_from_slice(&body[2..10]);
                            sense.information = Some(u64::from_be_bytes(b));
                        }
                        // Sense-key specific (§4.5.2.4): 2 reserved bytes, then the 3 bytes.
                        0x02 if body.len() >= 5 => sense.field = field_pointer(key, &body[2..5]),
                        _ => {}
                    }
                    i += 2 + dlen;
                }
                Some(sense)
            }
            _ => None,
        }
    }

    /// Whether this is ILLEGAL REQUEST, LOGICAL BLOCK ADDRESS OUT OF RANGE (21h/00h).
    pub fn is_lba_out_of_range(&self) -> bool {
        self.key == SenseKey::ILLEGAL_REQUEST && (self.asc, self.ascq) == (0x21, 0x00)
    }

    /// The "nothing to report" sense (REQUEST SENSE with no pending condition).
    pub const fn no_sense() -> Self {
        Self::new(SenseKey::NO_SENSE, 0x00, 0x00)
    }
    /// INVALID COMMAND OPERATION CODE (20h/00h).
    pub fn invalid_opcode() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x20, 0x00).with_cdb_field(0, Some(7))
    }
    /// INVALID FIELD IN CDB (24h/00h) without a field pointer.
    pub const fn invalid_field_in_cdb() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x24, 0x00)
    }
    /// INVALID FIELD IN CDB (24h/00h) pointing at `byte` (and `bit`, the field's top bit).
    pub fn invalid_field_in_cdb_at(byte: u16, bit: Option<u8>) -> Self {
        Self::invalid_field_in_cdb().with_cdb_field(byte, bit)
    }
    /// LOGICAL BLOCK ADDRESS OUT OF RANGE (21h/00h).
    pub const fn lba_out_of_range() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x21, 0x00)
    }
    /// INVALID FIELD IN PARAMETER LIST (26h/00h).
    pub const fn invalid_field_in_parameter_list() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x26, 0x00)
    }
    /// INVALID FIELD IN PARAMETER LIST (26h/00h) pointing at a parameter byte.
    pub fn invalid_field_in_parameter_list_at(byte: u16, bit: Option<u8>) -> Self {
        Self::invalid_field_in_parameter_list().with_param_field(byte, bit)
    }
    /// PARAMETER LIST LENGTH ERROR (1Ah/00h).
    pub const fn parameter_list_length_error() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x1A, 0x00)
    }
    /// LOGICAL UNIT NOT SUPPORTED (25h/00h).
    pub const fn lun_not_supported() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x25, 0x00)
    }
    /// SAVING PARAMETERS NOT SUPPORTED (39h/00h).
    pub const fn saving_parameters_not_supported() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x39, 0x00)
    }
    /// MISCOMPARE DURING VERIFY OPERATION (1Dh/00h); INFORMATION = offset of the first
    /// differing byte (SBC-4 §5.3, COMPARE AND WRITE / VERIFY).
    pub fn miscompare(offset: u64) -> Self {
        Self::new(SenseKey::MISCOMPARE, 0x1D, 0x00).with_information(offset)
    }
    /// WRITE ERROR (MEDIUM ERROR 0Ch/00h).
    pub const fn write_error() -> Self {
        Self::new(SenseKey::MEDIUM_ERROR, 0x0C, 0x00)
    }
    /// UNRECOVERED READ ERROR (MEDIUM ERROR 11h/00h).
    pub const fn unrecovered_read_error() -> Self {
        Self::new(SenseKey::MEDIUM_ERROR, 0x11, 0x00)
    }
    /// SPACE ALLOCATION FAILED WRITE PROTECT (DATA PROTECT 27h/07h): the thin-provisioned
    /// LU ran out of backing space (SBC-4 §4.7.3.6).
    pub const fn space_allocation_failed_write_protect() -> Self {
        Self::new(SenseKey::DATA_PROTECT, 0x27, 0x07)
    }
    /// WRITE PROTECTED (DATA PROTECT 27h/00h): the LU is read-only.
    pub const fn write_protected() -> Self {
        Self::new(SenseKey::DATA_PROTECT, 0x27, 0x00)
    }
    /// INTERNAL TARGET FAILURE (HARDWARE ERROR 44h/00h).
    pub const fn internal_target_failure() -> Self {
        Self::new(SenseKey::HARDWARE_ERROR, 0x44, 0x00)
    }
    /// ABORTED COMMAND, no additional sense (0Bh 00h/00h).
    pub const fn aborted_command() -> Self {
        Self::new(SenseKey::ABORTED_COMMAND, 0x00, 0x00)
    }
    /// ABORTED COMMAND, INITIATOR DETECTED ERROR MESSAGE RECEIVED (48h/00h).
    pub const fn aborted_command_initiator_detected_error() -> Self {
        Self::new(SenseKey::ABORTED_COMMAND, 0x48, 0x00)
    }
    /// ABORTED COMMAND, DATA PHASE ERROR (4Bh/00h): the initiator sent too little data.
    pub const fn aborted_command_data_phase_error() -> Self {
        Self::new(SenseKey::ABORTED_COMMAND, 0x4B, 0x00)
    }
    /// ABORTED COMMAND, COMMANDS CLEARED BY ANOTHER INITIATOR (2Fh/00h).
    pub const fn aborted_command_cleared_by_another_initiator() -> Self {
        Self::new(SenseKey::ABORTED_COMMAND, 0x2F, 0x00)
    }
    /// UNIT ATTENTION with the given ASC/ASCQ (e.g. 29h/00h power on or reset).
    pub const fn unit_attention(asc: u8, ascq: u8) -> Self {
        Self::new(SenseKey::UNIT_ATTENTION, asc, ascq)
    }
    /// MEDIUM REMOVAL PREVENTED (ILLEGAL REQUEST 53h/02h).
    pub const fn medium_removal_prevented() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x53, 0x02)
    }
    /// INSUFFICIENT REGISTRATION RESOURCES (ILLEGAL REQUEST 55h/04h).
    pub const fn insufficient_registration_resources() -> Self {
        Self::new(SenseKey::ILLEGAL_REQUEST, 0x55, 0x04)
    }
    /// LOGICAL UNIT NOT READY, INITIALIZING COMMAND REQUIRED (NOT READY 04h/02h): the unit was
    /// stopped by START STOP UNIT.
    pub const fn not_ready_initializing_command_required() -> Self {
        Self::new(SenseKey::NOT_READY, 0x04, 0x02)
    }

    /// LOGICAL UNIT IS IN PROCESS OF BECOMING READY (NOT READY 04h/01h): the backing store
    /// is unreachable for now (a Ceph cluster down, an operation timed out). Initiators
    /// retry this after a delay (Linux: ACTION_DELAYED_RETRY) instead of failing the I/O.
    pub const fn not_ready_becoming_ready() -> Self {
        Self::new(SenseKey::NOT_READY, 0x04, 0x01)
    }

    /// The retryable sense for a store that cannot be reached (timeouts, lost
    /// connections, a blocklisted client), or `None` for other errors. A write that timed out
    /// may or may not have landed; retrying it is what the initiator must do either way.
    fn unreachable(e: &std::io::Error) -> Option<Self> {
        let code = e.raw_os_error();
        let unreachable = [
            libc::ETIMEDOUT,
            libc::ENOTCONN,
            libc::ECONNREFUSED,
            libc::ECONNRESET,
            libc::ESHUTDOWN,
            libc::EHOSTUNREACH,
        ];
        if code.is_some_and(|c| unreachable.contains(&c))
            || matches!(
                e.kind(),
                std::io::ErrorKind::TimedOut
                    | std::io::ErrorKind::NotConnected
                    | std::io::ErrorKind::ConnectionRefused
                    | std::io::ErrorKind::ConnectionReset
            )
        {
            Some(Self::not_ready_becoming_ready())
        } else {
            None
        }
    }

    /// Maps an I/O error from a backend write to sense (SBC-4 §4.7.3.6 for ENOSPC).
    pub fn from_write_error(e: &std::io::Error) -> Self {
        if let Some(s) = Self::unreachable(e) {
            return s;
        }
        match e.raw_os_error() {
            Some(code) if code == libc::ENOSPC || code == libc::EDQUOT => {
                Self::space_allocation_failed_write_protect()
            }
            Some(code) if code == libc::EROFS => Self::write_protected(),
            _ if e.kind() == std::io::ErrorKind::StorageFull => {
                Self::space_allocation_failed_write_protect()
            }
            _ => Self::write_error(),
        }
    }

    /// Maps an I/O error from a backend read to sense.
    pub fn from_read_error(e: &std::io::Error) -> Self {
        Self::unreachable(e).unwrap_or(Self::unrecovered_read_error())
    }
    /// The one map from a block-layer failure ([`ipsan_block::IoError`]) to sense, for
    /// every command that reached a backend: MISCOMPARE (SBC-4 §5.3) for a compare that
    /// failed, else the write or read error sense of the store's `io::Error`.
    pub fn from_block_error(e: &ipsan_block::IoError, write: bool) -> Self {
        match e {
            ipsan_block::IoError::Miscompare { offset } => Self::miscompare(*offset),
            ipsan_block::IoError::Io(e) if write => Self::from_write_error(e),
            ipsan_block::IoError::Io(e) => Self::from_read_error(e),
            // `IoError` is non-exhaustive: a failure this crate does not know yet.
            _ => Self::internal_target_failure(),
        }
    }
    /// Sense for a failure to read or update the persistent reservation state kept in a
    /// shared store ([`crate::pr::PrStore`]): retryable NOT READY when the store cannot be
    /// reached, else INTERNAL TARGET FAILURE.
    pub fn from_store_error(e: &std::io::Error) -> Self {
        Self::unreachable(e).unwrap_or(Self::internal_target_failure())
    }
}

impl std::fmt::Display for Sense {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{} (key {:#x}), ASC/ASCQ {:02x}h/{:02x}h",
            self.key.name(),
            self.key.0,
            self.asc,
            self.ascq
        )?;
        if self.is_lba_out_of_range() {
            f.write_str(" LOGICAL BLOCK ADDRESS OUT OF RANGE")?;
        }
        if let Some(i) = self.information {
            write!(f, ", information {i}")?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_format_has_key_asc_ascq_and_length() {
        let b = Sense::lba_out_of_range().to_fixed();
        assert_eq!(b.len(), 18);
        assert_eq!(b[0], 0x70);
        assert_eq!(b[2], 0x05);
        assert_eq!(b[7], 10);
        assert_eq!((b[12], b[13]), (0x21, 0x00));
        assert_eq!(b[15], 0, "no SKSV without a field pointer");
    }

    #[test]
    fn fixed_format_sets_valid_and_information() {
        let b = Sense::miscompare(0x1234).to_fixed();
        assert_eq!(b[0], 0xF0);
        assert_eq!(b[2], 0x0E);
        assert_eq!(&b[3..7], &[0, 0, 0x12, 0x34]);
        assert_eq!((b[12], b[13]), (0x1D, 0x00));
    }

    #[test]
    fn fixed_format_clears_valid_when_information_too_big() {
        let b = Sense::miscompare(1 << 40).to_fixed();
        assert_eq!(b[0], 0x70);
        assert_eq!(&b[3..7], &[0, 0, 0, 0]);
    }

    #[test]
    fn field_pointer_encodes_cd_bpv_and_byte() {
        let b = Sense::invalid_field_in_cdb_at(1, Some(3)).to_fixed();
        assert_eq!(b[15], 0x80 | 0x40 | 0x08 | 3);
        assert_eq!(&b[16..18], &[0, 1]);
        let p = Sense::invalid_field_in_parameter_list_at(0x102, None).to_fixed();
        assert_eq!(p[15], 0x80);
        assert_eq!(&p[16..18], &[1, 2]);
    }

    #[test]
    fn descriptor_format_carries_information() {
        let b = Sense::miscompare(1 << 40).to_descriptor();
        assert_eq!(b[0], 0x72);
        assert_eq!((b[1], b[2], b[3]), (0x0E, 0x1D, 0x00));
        assert_eq!(b[7] as usize, b.len() - 8);
        assert_eq!(&b[8..12], &[0x00, 0x0A, 0x80, 0x00]);
        assert_eq!(u64::from_be_bytes(b[12..20].try_into().unwrap()), 1 << 40);
    }

    #[test]
    fn enospc_maps_to_space_allocation_failed() {
        let e = std::io::Error::from_raw_os_error(libc::ENOSPC);
        let s = Sense::from_write_error(&e);
        assert_eq!(s.key, SenseKey::DATA_PROTECT);
        assert_eq!((s.asc, s.ascq), (0x27, 0x07));
        let e = std::io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(Sense::from_write_error(&e), Sense::write_error());
    }

    #[test]
    fn block_errors_map_to_miscompare_write_and_read_sense() {
        use ipsan_block::IoError;
        let m = Sense::from_block_error(&IoError::Miscompare { offset: 300 }, true);
        assert_eq!(m, Sense::miscompare(300));
        let full = || IoError::Io(std::io::Error::from_raw_os_error(libc::ENOSPC));
        assert_eq!(
            Sense::from_block_error(&full(), true),
            Sense::space_allocation_failed_write_protect()
        );
        assert_eq!(
            Sense::from_block_error(&full(), false),
            Sense::unrecovered_read_error()
        );
        let gone = IoError::Io(std::io::Error::from_raw_os_error(libc::ETIMEDOUT));
        assert_eq!(
            Sense::from_block_error(&gone, false),
            Sense::not_ready_becoming_ready()
        );
    }

    #[test]
    fn parses_what_it_encodes_in_both_formats() {
        for sense in [
            Sense::lba_out_of_range().with_information(1234),
            Sense::invalid_field_in_cdb_at(1, Some(3)),
            Sense::invalid_field_in_parameter_list_at(0x102, None),
            Sense::miscompare(7),
            Sense::unit_attention(0x29, 0x00),
        ] {
            assert_eq!(Sense::parse(&sense.to_fixed()), Some(sense.clone()));
            assert_eq!(Sense::parse(&sense.to_descriptor()), Some(sense.clone()));
        }
        let big = Sense::miscompare(1 << 40);
        assert_eq!(Sense::parse(&big.to_descriptor()), Some(big));
    }

    #[test]
    fn parses_short_fixed_sense_and_rejects_unknown_codes() {
        let s = Sense::parse(&[0x70, 0, 0x06, 0, 0, 0, 0, 0]).unwrap();
        assert_eq!((s.key, s.asc, s.ascq), (SenseKey::UNIT_ATTENTION, 0, 0));
        assert_eq!(Sense::parse(&[]), None);
        assert_eq!(Sense::parse(&[0x70]), None);
        assert_eq!(Sense::parse(&[0x7f, 0, 5]), None);
        assert_eq!(Sense::parse(&[0x72, 0]), None);
        // A descriptor length running past the end must not panic.
        assert!(Sense::parse(&[0x72, 5, 0x21, 0, 0, 0, 0, 200, 0, 250, 0x80]).is_some());
        assert!(Sense::parse(&[0x72, 5, 0x21, 0, 0, 0, 0, 4, 2, 2, 0x80, 0]).is_some());
    }

    #[test]
    fn displays_key_name_asc_and_information() {
        let s = Sense::lba_out_of_range().with_information(9);
        assert!(s.is_lba_out_of_range());
        assert_eq!(
            s.to_string(),
            "ILLEGAL REQUEST (key 0x5), ASC/ASCQ 21h/00h LOGICAL BLOCK ADDRESS OUT OF RANGE, \
             information 9"
        );
    }

    #[test]
    fn unreachable_store_errors_map_to_retryable_not_ready() {
        for code in [libc::ETIMEDOUT, libc::ESHUTDOWN, libc::ENOTCONN] {
            let e = std::io::Error::from_raw_os_error(code);
            for s in [Sense::from_write_error(&e), Sense::from_read_error(&e)] {
                assert_eq!(s.key, SenseKey::NOT_READY, "errno {code}");
                assert_eq!((s.asc, s.ascq), (0x04, 0x01));
            }
        }
        let e = std::io::Error::from_raw_os_error(libc::EIO);
        assert_eq!(Sense::from_read_error(&e), Sense::unrecovered_read_error());
    }
}
