//! The submit/complete form of [`LogicalUnit`]'s execution ([`LogicalUnit::execute_async`]):
//! the data path (`path.rs`, shared with [`LogicalUnit::execute`]) over [`aio::submit`] for
//! an [`crate::aio::Engine::Async`] backend, holding no thread while the backend works.

use bytes::BytesMut;

use super::{path, LogicalUnit, OwnedRequest, ScsiResponse};
use crate::aio::{self, IoError, IoOp, IoRequest};
use crate::cdb::{self, Command, CommandInfo};
use crate::sense::Sense;

impl LogicalUnit {
    /// Executes one command through the backend's submit/complete interface: the future
    /// holds no thread while the backend works. The checks (unit attentions, reservations,
    /// ranges) are those of [`LogicalUnit::execute`]; commands [`LogicalUnit::runs_async`]
    /// does not cover run synchronously here, so call it only for those it does.
    pub async fn execute_async(&self, req: OwnedRequest) -> ScsiResponse {
        let opcode = req.cdb.first().copied().unwrap_or(0xFF);
        self.counted_parse();
        let cmd = cdb::parse(&req.cdb);
        self.execute_async_command(req, opcode, cmd).await
    }

    /// [`LogicalUnit::execute_async`] of a command decoded before
    /// ([`LogicalUnit::command_info`] on `req.cdb`): nothing parses the CDB again.
    pub async fn execute_async_decoded(
        &self,
        req: OwnedRequest,
        info: &CommandInfo,
    ) -> ScsiResponse {
        self.execute_async_command(req, info.opcode, Ok(info.command))
            .await
    }

    pub(super) async fn execute_async_command(
        &self,
        req: OwnedRequest,
        opcode: u8,
        cmd: Result<Command, Sense>,
    ) -> ScsiResponse {
        if let Some(r) = self.precheck_parsed(&req.nexus, opcode, cmd.as_ref()) {
            return r;
        }
        let cmd = match cmd {
            Ok(c) => c,
            Err(s) => return ScsiResponse::check(s),
        };
        let r = if path::is_data_path(&cmd) {
            let port = path::Submitted { tag: req.tag };
            let preq = path::PathRequest {
                view: req.borrowed(),
                shared: Some(&req.data_out),
                whole: None,
            };
            self.data_path(&port, &preq, cmd).await
        } else {
            self.dispatch(&req.borrowed(), cmd, None)
        };
        r.unwrap_or_else(ScsiResponse::check)
    }

    pub(super) async fn io(&self, tag: u64, op: IoOp) -> Result<Option<BytesMut>, (IoError, bool)> {
        let write = !matches!(op, IoOp::Read { .. });
        let name = op.name();
        let done = aio::submit(self.backend.as_ref(), IoRequest { tag, op }).await;
        done.result.map_err(|e| {
            if let IoError::Io(io) = &e {
                tracing::warn!(
                    serial = %self.cfg.serial,
                    tag,
                    op = name,
                    "backend {} failed: {io}",
                    self.backend.kind()
                );
            }
            (e, write)
        })
    }

    pub(super) async fn io_sense(&self, tag: u64, op: IoOp) -> Result<Option<BytesMut>, Sense> {
        self.io(tag, op)
            .await
            .map_err(|(e, write)| Sense::from_block_error(&e, write))
    }
}

/// The families [`LogicalUnit::execute_async`] completes through the backend's
/// submit/complete interface.
pub(super) fn async_family(f: cdb::Family) -> bool {
    use cdb::Family as F;
    matches!(
        f,
        F::Read | F::Write | F::SynchronizeCache | F::Unmap | F::WriteSame | F::CompareAndWrite
    )
}
