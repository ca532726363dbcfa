//! Pass-through commands for a gateway (`ipsan gateway`, issue 15): any CDB to any LUN of the
//! session's target, answered with the target's status, raw sense bytes, data and residual
//! exactly as they came (RFC 7143 §11.4), whatever the status. [`Session::command`] is the
//! form for callers that want a non-GOOD status as an error; this one is for a target that
//! forwards its host's commands and hands the answer back unchanged.

use std::time::Instant;

use bytes::{Bytes, BytesMut};
use iscsi_proto::engine::initiator::{self as engine, SubmitError};
use tokio::sync::oneshot;

use super::{DataDir, Session};
use crate::error::{Error, Result};
use crate::observe::{self, CommandEvent};
use crate::transform::CommandInfo;

/// A forwarded command's answer: every SCSI status, not only GOOD.
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

impl Session {
    /// Sends `cdb` to LUN `lun` (the raw 8-byte LUN field) of this session's target and
    /// returns the target's answer unchanged, whatever its status: the form a gateway
    /// forwards its hosts' commands with. Task errors (aborted, rejected, connection lost)
    /// are errors. With a payload transform (Seal), data-out is sealed and Data-In opened
    /// as in [`Session::command`], bound to `lun`. No command timeout applies: the host that
    /// issued the command times it out and sends its own task management.
    pub async fn command_to(&self, lun: u64, cdb: [u8; 16], dir: DataDir) -> Result<Passthrough> {
        let tr = self.shared.observer.get();
        self.refuse_after_logout_request()?;
        let itt = self.shared.with(|g| g.engine.alloc_itt())?;
        let g = observe::Pending::issued(tr, itt);
        let Some(t) = self.transform.clone() else {
            return g.finish(self.passthrough_raw(lun, cdb, dir, itt).await);
        };
        let (lba, blocks) = ipsan_seal::cdb::extent(&cdb);
        let info = CommandInfo {
            lun,
            lba,
            blocks,
            opcode: cdb[0],
            itt,
        };
        match dir {
            DataDir::None => g.finish(self.passthrough_raw(lun, cdb, DataDir::None, itt).await),
            DataDir::Write(plain) => {
                observe::note(tr, itt, CommandEvent::SealStart, 0, plain.len() as u64);
                let wire = t.outbound(info, plain).await?;
                observe::note(tr, itt, CommandEvent::SealEnd, 0, wire.len() as u64);
                g.finish(
                    self.passthrough_raw(lun, cdb, DataDir::Write(wire), itt)
                        .await,
                )
            }
            DataDir::Read(buf, len) => {
                let wire_len = t.wire_len(len).ok_or_else(|| {
                    Error::InvalidRequest(format!("{len} bytes cannot be carried by the transform"))
                })?;
                let mut c = self
                    .passthrough_raw(lun, cdb, DataDir::Read(buf, wire_len), itt)
                    .await?;
                if !c.data.is_empty() {
                    observe::note(tr, itt, CommandEvent::OpenStart, 0, c.data.len() as u64);
                    c.data = t.inbound(info, c.data).await?;
                    observe::note(tr, itt, CommandEvent::OpenEnd, 0, c.data.len() as u64);
                }
                g.finish(Ok(c))
            }
        }
    }

    async fn passthrough_raw(
        &self,
        lun: u64,
        cdb: [u8; 16],
        dir: DataDir,
        itt: u32,
    ) -> Result<Passthrough> {
        let data = match dir {
            DataDir::None => engine::Data::None,
            DataDir::Write(b) => engine::Data::Write(b),
            DataDir::Read(buf, len) => engine::Data::Read {
                buf,
                len: u32::try_from(len)
                    .map_err(|_| Error::InvalidRequest("transfer over 4 GiB".into()))?,
            },
        };
        let (tx, rx) = oneshot::channel();
        let cmd = engine::Command { lun, cdb, data };
        let submitted = self.shared.with(|g| {
            let r = g.engine.submit_as(Instant::now(), itt, cmd);
            if r.is_ok() {
                g.waiters.insert(itt, tx);
            }
            r
        })?;
        match submitted {
            Ok(_) => {}
            Err(SubmitError::Closed(_)) => return Err(self.shared.lost()),
            Err(SubmitError::LogoutRequested) => return Err(Error::LogoutRequested),
            Err(_) => return Err(Error::InvalidRequest("transfer over 4 GiB".into())),
        }
        match rx.await {
            Ok(Ok(c)) => Ok(Passthrough {
                status: c.status,
                sense: c.sense,
                data: c.data,
                residual: c.residual,
            }),
            // Task errors word themselves as for any command.
            Ok(Err(e)) => match self.shared.result(Err(e)) {
                Err(e) => Err(e),
                Ok(_) => Err(self.shared.lost()),
            },
            Err(_) => Err(self.shared.lost()),
        }
    }

    /// LOGICAL UNIT RESET of LUN `lun` (the raw 8-byte LUN field) of this session's target,
    /// as [`Session::lun_reset`] does for the session's own LUN: a gateway forwards its
    /// hosts' resets with it (RFC 7143 §11.5.1).
    pub async fn lun_reset_to(&self, lun: u64) -> Result<()> {
        use iscsi_wire::header::TmfResponse;
        let (tx, rx) = oneshot::channel();
        self.shared.with_timer(|g| {
            if g.engine.closed().is_some() {
                return;
            }
            let itt = g.engine.lun_reset(Instant::now(), lun);
            g.tmf_waiters.insert(itt, tx);
        })?;
        match rx.await {
            Ok(TmfResponse::FUNCTION_COMPLETE) => Ok(()),
            Ok(other) => Err(Error::TaskManagement(other.0)),
            Err(_) => Err(self.shared.lost()),
        }
    }
}
