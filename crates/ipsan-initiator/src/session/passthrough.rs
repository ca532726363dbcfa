//! Pass-through commands for a gateway (`ipsan gateway`, issue 15): any CDB to any LUN of the
//! session's target, answered with the target's status, raw sense bytes, data and residual
//! exactly as they came (RFC 7143 §11.4), whatever the status. [`Session::command`] is the
//! form for callers that want a non-GOOD status as an error; both go through the same path,
//! so a gateway's commands ride out a connection loss by session recovery
//! ([`crate::recovery`]) like everyone else's.

use bytes::{Bytes, BytesMut};

use super::{Completion, DataDir, Session};
use crate::error::{Error, Result};
use crate::scsi::{ScsiStatus, Sense};

/// A command's answer as the target gave it: every SCSI status, not only GOOD.
#[derive(Debug)]
pub struct Passthrough {
    /// SCSI status (SAM-5 §5.3).
    pub status: u8,
    /// The sense data as the target sent it (fixed or descriptor format), without the
    /// length prefix of the SCSI Response's data segment (RFC 7143 §11.4.7.2).
    pub sense: Option<Bytes>,
    /// Data-In (plaintext in a Seal session), truncated by the residual for an underflow.
    pub data: BytesMut,
    /// Residual count (positive: underflow, negative: overflow; RFC 7143 §11.4.5).
    pub residual: i64,
}

impl Passthrough {
    /// The caller's view ([`Session::command`]): GOOD and CONDITION MET complete, any other
    /// status is [`Error::Scsi`] with the sense decoded.
    pub(crate) fn into_completion(self) -> Result<Completion> {
        let sense = self.sense.as_deref().and_then(Sense::parse);
        if self.status == ScsiStatus::GOOD.0 || self.status == ScsiStatus::CONDITION_MET.0 {
            Ok(Completion {
                status: self.status,
                sense,
                data: self.data,
                residual: self.residual,
            })
        } else {
            Err(Error::Scsi {
                status: self.status,
                sense,
            })
        }
    }
}

impl Session {
    /// Sends `cdb` to LUN `lun` (the raw 8-byte LUN field) of this session's target and
    /// returns the target's answer unchanged, whatever its status: the form a gateway
    /// forwards its hosts' commands with. Task errors (aborted, rejected, connection lost
    /// past recovery) are errors. With a payload transform (Seal), data-out is sealed and
    /// Data-In opened as in [`Session::command`], bound to `lun`. No command timeout applies:
    /// the host that issued the command times it out and sends its own task management.
    pub async fn command_to(&self, lun: u64, cdb: [u8; 16], dir: DataDir) -> Result<Passthrough> {
        self.exchange(lun, cdb, dir, super::Until::Status).await
    }

    /// [`Session::command_to`] that `abort` can end: once it is cancelled, the command is
    /// aborted with ABORT TASK (RFC 7143 §11.5.1) and ends with [`crate::Error::TaskAborted`]
    /// if the target ended it, or with its own answer if that came first or the target refused
    /// the abort (§11.6.1). A command not sent yet (waiting for session recovery) is not sent.
    /// A gateway forwards its host's ABORT TASK this way.
    pub async fn command_to_abortable(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        abort: &tokio_util::sync::CancellationToken,
    ) -> Result<Passthrough> {
        self.exchange(lun, cdb, dir, super::Until::Abort(abort))
            .await
    }

    /// LOGICAL UNIT RESET of LUN `lun` (the raw 8-byte LUN field), as [`Session::lun_reset`]
    /// does for the session's own LUN: a gateway forwards its host's resets with it.
    pub async fn lun_reset_to(&self, lun: u64) -> Result<()> {
        let c = self.connection().await?;
        c.lun_reset(lun).await
    }
}
