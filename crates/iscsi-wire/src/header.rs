//! Typed Basic Header Segments, one struct per PDU kind (RFC 7143 §11.2–§11.19).
//!
//! Each struct holds the opcode-specific fields. The fields every PDU shares on the wire —
//! opcode, TotalAHSLength and DataSegmentLength — are written by the [`crate::Codec`] from the
//! [`crate::Pdu`] that carries the header, so a header can never disagree with its payload.

use crate::{Opcode, WireError, BHS_LEN};

type Bhs = [u8; BHS_LEN];

fn be32(b: &Bhs, at: usize) -> u32 {
    u32::from_be_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}
fn be16(b: &Bhs, at: usize) -> u16 {
    u16::from_be_bytes([b[at], b[at + 1]])
}
fn be64(b: &Bhs, at: usize) -> u64 {
    let mut x = [0u8; 8];
    x.copy_from_slice(&b[at..at + 8]);
    u64::from_be_bytes(x)
}
fn put32(b: &mut Bhs, at: usize, v: u32) {
    b[at..at + 4].copy_from_slice(&v.to_be_bytes());
}
fn put16(b: &mut Bhs, at: usize, v: u16) {
    b[at..at + 2].copy_from_slice(&v.to_be_bytes());
}
fn put64(b: &mut Bhs, at: usize, v: u64) {
    b[at..at + 8].copy_from_slice(&v.to_be_bytes());
}

/// The I (immediate delivery) bit of byte 0 (RFC 7143 §11.2.1.1).
const IMMEDIATE: u8 = 0x40;
/// The F (final) bit of byte 1 on most PDUs.
const FINAL: u8 = 0x80;

/// Login stages (RFC 7143 §11.12.3): CSG and NSG values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Stage(pub u8);

impl Stage {
    pub const SECURITY_NEGOTIATION: Self = Self(0);
    pub const LOGIN_OPERATIONAL_NEGOTIATION: Self = Self(1);
    /// Value 2 is reserved.
    pub const FULL_FEATURE_PHASE: Self = Self(3);
}

/// SCSI Command task attributes (RFC 7143 §11.3.1, SAM).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskAttr(pub u8);

impl TaskAttr {
    pub const UNTAGGED: Self = Self(0);
    pub const SIMPLE: Self = Self(1);
    pub const ORDERED: Self = Self(2);
    pub const HEAD_OF_QUEUE: Self = Self(3);
    pub const ACA: Self = Self(4);
}

/// NOP-Out (RFC 7143 §11.18).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NopOut {
    pub immediate: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// SCSI Command (RFC 7143 §11.3).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScsiCommand {
    pub immediate: bool,
    /// F: no unsolicited Data-Out PDUs follow this command (§11.3.1).
    pub final_: bool,
    /// R: the command expects data from the target.
    pub read: bool,
    /// W: the command sends data to the target.
    pub write: bool,
    pub attr: TaskAttr,
    pub lun: u64,
    pub itt: u32,
    pub expected_data_transfer_length: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    /// The first 16 bytes of the CDB; longer CDBs continue in an Extended CDB AHS (§11.2.2.3).
    pub cdb: [u8; 16],
}

/// Task Management Function Request (RFC 7143 §11.5).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskMgmtRequest {
    pub immediate: bool,
    pub function: TmfFunction,
    pub lun: u64,
    pub itt: u32,
    pub referenced_task_tag: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
    pub ref_cmd_sn: u32,
    pub exp_data_sn: u32,
}

/// Task management function codes (RFC 7143 §11.5.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmfFunction(pub u8);

impl TmfFunction {
    pub const ABORT_TASK: Self = Self(1);
    pub const ABORT_TASK_SET: Self = Self(2);
    pub const CLEAR_ACA: Self = Self(3);
    pub const CLEAR_TASK_SET: Self = Self(4);
    pub const LOGICAL_UNIT_RESET: Self = Self(5);
    pub const TARGET_WARM_RESET: Self = Self(6);
    pub const TARGET_COLD_RESET: Self = Self(7);
    pub const TASK_REASSIGN: Self = Self(8);
}

/// Task management responses (RFC 7143 §11.6.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TmfResponse(pub u8);

impl TmfResponse {
    pub const FUNCTION_COMPLETE: Self = Self(0);
    pub const TASK_DOES_NOT_EXIST: Self = Self(1);
    pub const LUN_DOES_NOT_EXIST: Self = Self(2);
    pub const TASK_STILL_ALLEGIANT: Self = Self(3);
    pub const TASK_ALLEGIANCE_REASSIGNMENT_NOT_SUPPORTED: Self = Self(4);
    pub const FUNCTION_NOT_SUPPORTED: Self = Self(5);
    pub const FUNCTION_AUTHORIZATION_FAILED: Self = Self(6);
    pub const FUNCTION_REJECTED: Self = Self(255);
}

/// Login Request (RFC 7143 §11.12).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginRequest {
    /// T: the initiator is ready to transit to `nsg`.
    pub transit: bool,
    /// C: the text is continued in the next PDU.
    pub continue_: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_min: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Text Request (RFC 7143 §11.10).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextRequest {
    pub immediate: bool,
    pub final_: bool,
    pub continue_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// SCSI Data-Out (RFC 7143 §11.7).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DataOut {
    pub final_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
}

/// Logout Request (RFC 7143 §11.14).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LogoutRequest {
    pub immediate: bool,
    pub reason: LogoutReason,
    pub itt: u32,
    pub cid: u16,
    pub cmd_sn: u32,
    pub exp_stat_sn: u32,
}

/// Logout reason codes (RFC 7143 §11.14.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogoutReason(pub u8);

impl LogoutReason {
    pub const CLOSE_SESSION: Self = Self(0);
    pub const CLOSE_CONNECTION: Self = Self(1);
    pub const REMOVE_CONNECTION_FOR_RECOVERY: Self = Self(2);
}

/// SNACK Request (RFC 7143 §11.16).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SnackRequest {
    pub snack_type: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub exp_stat_sn: u32,
    pub beg_run: u32,
    pub run_length: u32,
}

/// NOP-In (RFC 7143 §11.19).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct NopIn {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// SCSI Response (RFC 7143 §11.4).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct ScsiResponse {
    /// o: bidirectional read residual overflow.
    pub bidi_overflow: bool,
    /// u: bidirectional read residual underflow.
    pub bidi_underflow: bool,
    /// O: residual overflow.
    pub overflow: bool,
    /// U: residual underflow.
    pub underflow: bool,
    /// iSCSI service response (§11.4.3): 0x00 command completed at target, 0x01 target failure.
    pub response: u8,
    /// SCSI status (§11.4.2), valid when `response` is 0.
    pub status: u8,
    pub itt: u32,
    pub snack_tag: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub exp_data_sn: u32,
    pub bidi_read_residual_count: u32,
    pub residual_count: u32,
}

/// Task Management Function Response (RFC 7143 §11.6).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TaskMgmtResponse {
    pub response: TmfResponse,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// Login Response (RFC 7143 §11.13).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoginResponse {
    pub transit: bool,
    pub continue_: bool,
    pub csg: Stage,
    pub nsg: Stage,
    pub version_max: u8,
    pub version_active: u8,
    pub isid: [u8; 6],
    pub tsih: u16,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub status_class: u8,
    pub status_detail: u8,
}

/// Text Response (RFC 7143 §11.11).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TextResponse {
    pub final_: bool,
    pub continue_: bool,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
}

/// SCSI Data-In (RFC 7143 §11.7).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct DataIn {
    pub final_: bool,
    /// A: acknowledge requested (only with ErrorRecoveryLevel > 0).
    pub acknowledge: bool,
    pub overflow: bool,
    pub underflow: bool,
    /// S: this PDU carries the command's status (phase collapse, §11.7.3).
    pub status_present: bool,
    pub status: u8,
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn: u32,
    pub buffer_offset: u32,
    pub residual_count: u32,
}

/// Ready To Transfer (RFC 7143 §11.8).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct R2t {
    pub lun: u64,
    pub itt: u32,
    pub ttt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub r2t_sn: u32,
    pub buffer_offset: u32,
    pub desired_data_transfer_length: u32,
}

/// Asynchronous Message (RFC 7143 §11.9).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct AsyncMessage {
    pub lun: u64,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub async_event: u8,
    pub async_vcode: u8,
    pub parameter1: u16,
    pub parameter2: u16,
    pub parameter3: u16,
}

/// Logout Response (RFC 7143 §11.15).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct LogoutResponse {
    /// 0 closed successfully, 1 CID not found, 2 recovery not supported, 3 cleanup failed.
    pub response: u8,
    pub itt: u32,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub time2wait: u16,
    pub time2retain: u16,
}

/// Reject (RFC 7143 §11.17). The data segment carries the rejected PDU's header.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Reject {
    pub reason: RejectReason,
    pub stat_sn: u32,
    pub exp_cmd_sn: u32,
    pub max_cmd_sn: u32,
    pub data_sn_or_r2t_sn: u32,
}

/// Reject reasons (RFC 7143 §11.17.1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RejectReason(pub u8);

impl RejectReason {
    pub const DATA_DIGEST_ERROR: Self = Self(0x02);
    pub const SNACK_REJECT: Self = Self(0x03);
    pub const PROTOCOL_ERROR: Self = Self(0x04);
    pub const COMMAND_NOT_SUPPORTED: Self = Self(0x05);
    pub const IMMEDIATE_COMMAND_REJECT: Self = Self(0x06);
    pub const TASK_IN_PROGRESS: Self = Self(0x07);
    pub const INVALID_DATA_ACK: Self = Self(0x08);
    pub const INVALID_PDU_FIELD: Self = Self(0x09);
    pub const LONG_OP_REJECT: Self = Self(0x0a);
    pub const DEPRECATED: Self = Self(0x0b);
    pub const WAITING_FOR_LOGOUT: Self = Self(0x0c);
}

/// A parsed Basic Header Segment.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Header {
    NopOut(NopOut),
    ScsiCommand(ScsiCommand),
    TaskMgmtRequest(TaskMgmtRequest),
    LoginRequest(LoginRequest),
    TextRequest(TextRequest),
    DataOut(DataOut),
    LogoutRequest(LogoutRequest),
    SnackRequest(SnackRequest),
    NopIn(NopIn),
    ScsiResponse(ScsiResponse),
    TaskMgmtResponse(TaskMgmtResponse),
    LoginResponse(LoginResponse),
    TextResponse(TextResponse),
    DataIn(DataIn),
    LogoutResponse(LogoutResponse),
    R2t(R2t),
    AsyncMessage(AsyncMessage),
    Reject(Reject),
}

impl Header {
    /// The opcode this header is sent with.
    #[must_use]
    pub fn opcode(&self) -> Opcode {
        match self {
            Self::NopOut(_) => Opcode::NOP_OUT,
            Self::ScsiCommand(_) => Opcode::SCSI_COMMAND,
            Self::TaskMgmtRequest(_) => Opcode::TASK_MGMT_REQUEST,
            Self::LoginRequest(_) => Opcode::LOGIN_REQUEST,
            Self::TextRequest(_) => Opcode::TEXT_REQUEST,
            Self::DataOut(_) => Opcode::SCSI_DATA_OUT,
            Self::LogoutRequest(_) => Opcode::LOGOUT_REQUEST,
            Self::SnackRequest(_) => Opcode::SNACK_REQUEST,
            Self::NopIn(_) => Opcode::NOP_IN,
            Self::ScsiResponse(_) => Opcode::SCSI_RESPONSE,
            Self::TaskMgmtResponse(_) => Opcode::TASK_MGMT_RESPONSE,
            Self::LoginResponse(_) => Opcode::LOGIN_RESPONSE,
            Self::TextResponse(_) => Opcode::TEXT_RESPONSE,
            Self::DataIn(_) => Opcode::SCSI_DATA_IN,
            Self::LogoutResponse(_) => Opcode::LOGOUT_RESPONSE,
            Self::R2t(_) => Opcode::R2T,
            Self::AsyncMessage(_) => Opcode::ASYNC_MESSAGE,
            Self::Reject(_) => Opcode::REJECT,
        }
    }

    /// The Initiator Task Tag, where the PDU has one (RFC 7143 §11.2.1.8).
    #[must_use]
    pub fn itt(&self) -> u32 {
        match self {
            Self::NopOut(h) => h.itt,
            Self::ScsiCommand(h) => h.itt,
            Self::TaskMgmtRequest(h) => h.itt,
            Self::LoginRequest(h) => h.itt,
            Self::TextRequest(h) => h.itt,
            Self::DataOut(h) => h.itt,
            Self::LogoutRequest(h) => h.itt,
            Self::SnackRequest(h) => h.itt,
            Self::NopIn(h) => h.itt,
            Self::ScsiResponse(h) => h.itt,
            Self::TaskMgmtResponse(h) => h.itt,
            Self::LoginResponse(h) => h.itt,
            Self::TextResponse(h) => h.itt,
            Self::DataIn(h) => h.itt,
            Self::LogoutResponse(h) => h.itt,
            Self::R2t(h) => h.itt,
            Self::AsyncMessage(_) | Self::Reject(_) => crate::RESERVED_TAG,
        }
    }

    /// Parses the opcode-specific fields of a BHS. TotalAHSLength and DataSegmentLength are
    /// read by the codec; this only interprets the rest.
    pub fn parse(b: &Bhs) -> Result<Self, WireError> {
        let opcode = Opcode(b[0] & 0x3f);
        let immediate = b[0] & IMMEDIATE != 0;
        let f = b[1] & FINAL != 0;
        let lun = be64(b, 8);
        let itt = be32(b, 16);
        let invalid = |reason| WireError::InvalidField {
            bhs: Box::new(*b),
            opcode,
            reason,
        };
        Ok(match opcode {
            Opcode::NOP_OUT => Self::NopOut(NopOut {
                immediate,
                lun,
                itt,
                ttt: be32(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
            }),
            Opcode::SCSI_COMMAND => {
                let mut cdb = [0u8; 16];
                cdb.copy_from_slice(&b[32..48]);
                Self::ScsiCommand(ScsiCommand {
                    immediate,
                    final_: f,
                    read: b[1] & 0x40 != 0,
                    write: b[1] & 0x20 != 0,
                    attr: TaskAttr(b[1] & 0x07),
                    lun,
                    itt,
                    expected_data_transfer_length: be32(b, 20),
                    cmd_sn: be32(b, 24),
                    exp_stat_sn: be32(b, 28),
                    cdb,
                })
            }
            Opcode::TASK_MGMT_REQUEST => Self::TaskMgmtRequest(TaskMgmtRequest {
                immediate,
                function: TmfFunction(b[1] & 0x7f),
                lun,
                itt,
                referenced_task_tag: be32(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
                ref_cmd_sn: be32(b, 32),
                exp_data_sn: be32(b, 36),
            }),
            Opcode::LOGIN_REQUEST => {
                let transit = f;
                let continue_ = b[1] & 0x40 != 0;
                if transit && continue_ {
                    // §11.12.2: T and C must not both be set.
                    return Err(invalid("T and C bits both set"));
                }
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Self::LoginRequest(LoginRequest {
                    transit,
                    continue_,
                    csg: Stage((b[1] >> 2) & 0x3),
                    nsg: Stage(b[1] & 0x3),
                    version_max: b[2],
                    version_min: b[3],
                    isid,
                    tsih: be16(b, 14),
                    itt,
                    cid: be16(b, 20),
                    cmd_sn: be32(b, 24),
                    exp_stat_sn: be32(b, 28),
                })
            }
            Opcode::TEXT_REQUEST => Self::TextRequest(TextRequest {
                immediate,
                final_: f,
                continue_: b[1] & 0x40 != 0,
                lun,
                itt,
                ttt: be32(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
            }),
            Opcode::SCSI_DATA_OUT => Self::DataOut(DataOut {
                final_: f,
                lun,
                itt,
                ttt: be32(b, 20),
                exp_stat_sn: be32(b, 28),
                data_sn: be32(b, 36),
                buffer_offset: be32(b, 40),
            }),
            Opcode::LOGOUT_REQUEST => Self::LogoutRequest(LogoutRequest {
                immediate,
                reason: LogoutReason(b[1] & 0x7f),
                itt,
                cid: be16(b, 20),
                cmd_sn: be32(b, 24),
                exp_stat_sn: be32(b, 28),
            }),
            Opcode::SNACK_REQUEST => Self::SnackRequest(SnackRequest {
                snack_type: b[1] & 0x0f,
                lun,
                itt,
                ttt: be32(b, 20),
                exp_stat_sn: be32(b, 28),
                beg_run: be32(b, 40),
                run_length: be32(b, 44),
            }),
            Opcode::NOP_IN => Self::NopIn(NopIn {
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
            }),
            Opcode::SCSI_RESPONSE => Self::ScsiResponse(ScsiResponse {
                bidi_overflow: b[1] & 0x10 != 0,
                bidi_underflow: b[1] & 0x08 != 0,
                overflow: b[1] & 0x04 != 0,
                underflow: b[1] & 0x02 != 0,
                response: b[2],
                status: b[3],
                itt,
                snack_tag: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                exp_data_sn: be32(b, 36),
                bidi_read_residual_count: be32(b, 40),
                residual_count: be32(b, 44),
            }),
            Opcode::TASK_MGMT_RESPONSE => Self::TaskMgmtResponse(TaskMgmtResponse {
                response: TmfResponse(b[2]),
                itt,
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
            }),
            Opcode::LOGIN_RESPONSE => {
                let mut isid = [0u8; 6];
                isid.copy_from_slice(&b[8..14]);
                Self::LoginResponse(LoginResponse {
                    transit: f,
                    continue_: b[1] & 0x40 != 0,
                    csg: Stage((b[1] >> 2) & 0x3),
                    nsg: Stage(b[1] & 0x3),
                    version_max: b[2],
                    version_active: b[3],
                    isid,
                    tsih: be16(b, 14),
                    itt,
                    stat_sn: be32(b, 24),
                    exp_cmd_sn: be32(b, 28),
                    max_cmd_sn: be32(b, 32),
                    status_class: b[36],
                    status_detail: b[37],
                })
            }
            Opcode::TEXT_RESPONSE => Self::TextResponse(TextResponse {
                final_: f,
                continue_: b[1] & 0x40 != 0,
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
            }),
            Opcode::SCSI_DATA_IN => Self::DataIn(DataIn {
                final_: f,
                acknowledge: b[1] & 0x40 != 0,
                overflow: b[1] & 0x04 != 0,
                underflow: b[1] & 0x02 != 0,
                status_present: b[1] & 0x01 != 0,
                status: b[3],
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                data_sn: be32(b, 36),
                buffer_offset: be32(b, 40),
                residual_count: be32(b, 44),
            }),
            Opcode::LOGOUT_RESPONSE => Self::LogoutResponse(LogoutResponse {
                response: b[2],
                itt,
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                time2wait: be16(b, 40),
                time2retain: be16(b, 42),
            }),
            Opcode::R2T => Self::R2t(R2t {
                lun,
                itt,
                ttt: be32(b, 20),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                r2t_sn: be32(b, 36),
                buffer_offset: be32(b, 40),
                desired_data_transfer_length: be32(b, 44),
            }),
            Opcode::ASYNC_MESSAGE => Self::AsyncMessage(AsyncMessage {
                lun,
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                async_event: b[36],
                async_vcode: b[37],
                parameter1: be16(b, 38),
                parameter2: be16(b, 40),
                parameter3: be16(b, 42),
            }),
            Opcode::REJECT => Self::Reject(Reject {
                reason: RejectReason(b[2]),
                stat_sn: be32(b, 24),
                exp_cmd_sn: be32(b, 28),
                max_cmd_sn: be32(b, 32),
                data_sn_or_r2t_sn: be32(b, 36),
            }),
            _ => {
                return Err(WireError::UnsupportedOpcode {
                    bhs: Box::new(*b),
                    opcode,
                })
            }
        })
    }

    /// Writes this header's fields into `b` (which the caller zeroed), excluding
    /// TotalAHSLength and DataSegmentLength.
    pub fn write(&self, b: &mut Bhs) {
        b[0] = self.opcode().0;
        let imm = |i: bool| if i { IMMEDIATE } else { 0 };
        let bit = |set: bool, v: u8| if set { v } else { 0 };
        match self {
            Self::NopOut(h) => {
                b[0] |= imm(h.immediate);
                b[1] = FINAL;
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 24, h.cmd_sn);
                put32(b, 28, h.exp_stat_sn);
            }
            Self::ScsiCommand(h) => {
                b[0] |= imm(h.immediate);
                b[1] = bit(h.final_, FINAL)
                    | bit(h.read, 0x40)
                    | bit(h.write, 0x20)
                    | (h.attr.0 & 0x07);
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.expected_data_transfer_length);
                put32(b, 24, h.cmd_sn);
                put32(b, 28, h.exp_stat_sn);
                b[32..48].copy_from_slice(&h.cdb);
            }
            Self::TaskMgmtRequest(h) => {
                b[0] |= imm(h.immediate);
                b[1] = FINAL | (h.function.0 & 0x7f);
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.referenced_task_tag);
                put32(b, 24, h.cmd_sn);
                put32(b, 28, h.exp_stat_sn);
                put32(b, 32, h.ref_cmd_sn);
                put32(b, 36, h.exp_data_sn);
            }
            Self::LoginRequest(h) => {
                // §11.12: the I bit is always 1 on Login Requests.
                b[0] |= IMMEDIATE;
                b[1] = bit(h.transit, FINAL)
                    | bit(h.continue_, 0x40)
                    | ((h.csg.0 & 3) << 2)
                    | (h.nsg.0 & 3);
                b[2] = h.version_max;
                b[3] = h.version_min;
                b[8..14].copy_from_slice(&h.isid);
                put16(b, 14, h.tsih);
                put32(b, 16, h.itt);
                put16(b, 20, h.cid);
                put32(b, 24, h.cmd_sn);
                put32(b, 28, h.exp_stat_sn);
            }
            Self::TextRequest(h) => {
                b[0] |= imm(h.immediate);
                b[1] = bit(h.final_, FINAL) | bit(h.continue_, 0x40);
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 24, h.cmd_sn);
                put32(b, 28, h.exp_stat_sn);
            }
            Self::DataOut(h) => {
                b[1] = bit(h.final_, FINAL);
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 28, h.exp_stat_sn);
                put32(b, 36, h.data_sn);
                put32(b, 40, h.buffer_offset);
            }
            Self::LogoutRequest(h) => {
                b[0] |= imm(h.immediate);
                b[1] = FINAL | (h.reason.0 & 0x7f);
                put32(b, 16, h.itt);
                put16(b, 20, h.cid);
                put32(b, 24, h.cmd_sn);
                put32(b, 28, h.exp_stat_sn);
            }
            Self::SnackRequest(h) => {
                b[1] = FINAL | (h.snack_type & 0x0f);
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 28, h.exp_stat_sn);
                put32(b, 40, h.beg_run);
                put32(b, 44, h.run_length);
            }
            Self::NopIn(h) => {
                b[1] = FINAL;
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
            }
            Self::ScsiResponse(h) => {
                b[1] = FINAL
                    | bit(h.bidi_overflow, 0x10)
                    | bit(h.bidi_underflow, 0x08)
                    | bit(h.overflow, 0x04)
                    | bit(h.underflow, 0x02);
                b[2] = h.response;
                b[3] = h.status;
                put32(b, 16, h.itt);
                put32(b, 20, h.snack_tag);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
                put32(b, 36, h.exp_data_sn);
                put32(b, 40, h.bidi_read_residual_count);
                put32(b, 44, h.residual_count);
            }
            Self::TaskMgmtResponse(h) => {
                b[1] = FINAL;
                b[2] = h.response.0;
                put32(b, 16, h.itt);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
            }
            Self::LoginResponse(h) => {
                b[1] = bit(h.transit, FINAL)
                    | bit(h.continue_, 0x40)
                    | ((h.csg.0 & 3) << 2)
                    | (h.nsg.0 & 3);
                b[2] = h.version_max;
                b[3] = h.version_active;
                b[8..14].copy_from_slice(&h.isid);
                put16(b, 14, h.tsih);
                put32(b, 16, h.itt);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
                b[36] = h.status_class;
                b[37] = h.status_detail;
            }
            Self::TextResponse(h) => {
                b[1] = bit(h.final_, FINAL) | bit(h.continue_, 0x40);
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
            }
            Self::DataIn(h) => {
                b[1] = bit(h.final_, FINAL)
                    | bit(h.acknowledge, 0x40)
                    | bit(h.overflow, 0x04)
                    | bit(h.underflow, 0x02)
                    | bit(h.status_present, 0x01);
                if h.status_present {
                    b[3] = h.status;
                }
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
                put32(b, 36, h.data_sn);
                put32(b, 40, h.buffer_offset);
                put32(b, 44, h.residual_count);
            }
            Self::LogoutResponse(h) => {
                b[1] = FINAL;
                b[2] = h.response;
                put32(b, 16, h.itt);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
                put16(b, 40, h.time2wait);
                put16(b, 42, h.time2retain);
            }
            Self::R2t(h) => {
                b[1] = FINAL;
                put64(b, 8, h.lun);
                put32(b, 16, h.itt);
                put32(b, 20, h.ttt);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
                put32(b, 36, h.r2t_sn);
                put32(b, 40, h.buffer_offset);
                put32(b, 44, h.desired_data_transfer_length);
            }
            Self::AsyncMessage(h) => {
                b[1] = FINAL;
                put64(b, 8, h.lun);
                put32(b, 16, crate::RESERVED_TAG);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
                b[36] = h.async_event;
                b[37] = h.async_vcode;
                put16(b, 38, h.parameter1);
                put16(b, 40, h.parameter2);
                put16(b, 42, h.parameter3);
            }
            Self::Reject(h) => {
                b[1] = FINAL;
                b[2] = h.reason.0;
                put32(b, 16, crate::RESERVED_TAG);
                put32(b, 24, h.stat_sn);
                put32(b, 28, h.exp_cmd_sn);
                put32(b, 32, h.max_cmd_sn);
                put32(b, 36, h.data_sn_or_r2t_sn);
            }
        }
    }
}

macro_rules! impl_from {
    ($($t:ident),*) => {$(
        impl From<$t> for Header {
            fn from(h: $t) -> Self { Self::$t(h) }
        }
    )*};
}
impl_from!(
    NopOut,
    ScsiCommand,
    TaskMgmtRequest,
    LoginRequest,
    TextRequest,
    DataOut,
    LogoutRequest,
    SnackRequest,
    NopIn,
    ScsiResponse,
    TaskMgmtResponse,
    LoginResponse,
    TextResponse,
    DataIn,
    LogoutResponse,
    R2t,
    AsyncMessage,
    Reject
);
