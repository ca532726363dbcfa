//! The submit/complete form of [`LogicalUnit`]'s execution ([`LogicalUnit::execute_async`]):
//! the data-path commands of an [`crate::aio::Engine::Async`] backend as futures over
//! [`aio::submit`], holding no thread while the backend works.

use bytes::{Bytes, BytesMut};

use super::{data_out, LogicalUnit, OwnedRequest, ScsiResponse};
use crate::aio::{self, IoError, IoOp, IoRequest};
use crate::cdb::{self, BlockIo, Command, CommandInfo};
use crate::sense::Sense;

impl LogicalUnit {
    /// Executes one command through the backend's submit/complete interface: the future
    /// holds no thread while the backend works. The checks (unit attentions, reservations,
    /// ranges) are those of [`LogicalUnit::execute`]; commands [`LogicalUnit::runs_async`]
    /// does not cover run synchronously here, so call it only for those it does.
    pub async fn execute_async(&self, req: OwnedRequest) -> ScsiResponse {
        let opcode = req.cdb.first().copied().unwrap_or(0xFF);
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
        let r = match cmd {
            Command::Read(io) => self.read_async(&req, io).await.map(ScsiResponse::good),
            Command::Write(io) => self.write_async(&req, io).await,
            Command::SynchronizeCache { lba, blocks, immed } => {
                self.sync_cache_async(&req, lba, blocks, immed).await
            }
            Command::Unmap { anchor, param_len } => self.unmap_async(&req, anchor, param_len).await,
            Command::WriteSame {
                io,
                unmap,
                anchor,
                lbdata,
                ndob,
            } => {
                self.write_same_async(&req, io, unmap, (anchor, lbdata, ndob))
                    .await
            }
            Command::CompareAndWrite(io) => self.compare_and_write_async(&req, io).await,
            other => self.dispatch(&req.borrowed(), other),
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
        self.io(tag, op).await.map_err(|(e, write)| match e {
            IoError::Miscompare { offset } => Sense::miscompare(offset),
            IoError::Io(e) if write => Sense::from_write_error(&e),
            IoError::Io(e) => Sense::from_read_error(&e),
        })
    }

    pub(super) async fn flush_if_needed_async(&self, tag: u64, fua: bool) -> Result<(), Sense> {
        if fua || !self.write_cache() {
            self.io_sense(tag, IoOp::Flush).await?;
        }
        Ok(())
    }

    pub(super) async fn read_async(&self, req: &OwnedRequest, io: BlockIo) -> Result<Bytes, Sense> {
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        let len = self.bytes(io.blocks) as usize;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let buf = self
            .io_sense(
                req.tag,
                IoOp::Read {
                    offset: self.offset(io.lba),
                    len,
                    buf: BytesMut::with_capacity(len),
                },
            )
            .await?
            .unwrap_or_default();
        Ok(buf.freeze())
    }

    pub(super) async fn write_async(
        &self,
        req: &OwnedRequest,
        io: BlockIo,
    ) -> Result<ScsiResponse, Sense> {
        self.check_writable()?;
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        let n = self.bytes(io.blocks);
        data_out(&req.borrowed(), n)?;
        if io.blocks > 0 {
            let data = req.data_out.slice(..n as usize);
            self.io_sense(
                req.tag,
                IoOp::Write {
                    offset: self.offset(io.lba),
                    data,
                },
            )
            .await?;
            self.flush_if_needed_async(req.tag, io.fua).await?;
        }
        Ok(ScsiResponse::good(Bytes::new()))
    }

    pub(super) async fn sync_cache_async(
        &self,
        req: &OwnedRequest,
        lba: u64,
        blocks: u32,
        immed: bool,
    ) -> Result<ScsiResponse, Sense> {
        self.check_range(lba, u64::from(blocks))?;
        if immed {
            // IMMED (SBC-4 §5.26): GOOD once validated; the flush runs on in the backend
            // and a failure has nobody to report to but the log.
            self.backend.submit(
                IoRequest {
                    tag: req.tag,
                    op: IoOp::Flush,
                },
                Box::new(|c| {
                    if let Err(e) = c.result {
                        tracing::warn!(error = %e, "background SYNCHRONIZE CACHE failed");
                    }
                }),
            );
        } else {
            self.io_sense(req.tag, IoOp::Flush).await?;
        }
        Ok(ScsiResponse::good(Bytes::new()))
    }

    pub(super) async fn unmap_async(
        &self,
        req: &OwnedRequest,
        anchor: bool,
        param_len: u32,
    ) -> Result<ScsiResponse, Sense> {
        let list = match self.unmap_list(&req.borrowed(), anchor, param_len)? {
            Some(l) => l,
            None => return Ok(ScsiResponse::good(Bytes::new())),
        };
        for (lba, n) in list {
            if n > 0 {
                self.io_sense(
                    req.tag,
                    IoOp::Discard {
                        offset: self.offset(lba),
                        len: self.bytes(n),
                    },
                )
                .await?;
            }
        }
        Ok(ScsiResponse::good(Bytes::new()))
    }

    pub(super) async fn write_same_async(
        &self,
        req: &OwnedRequest,
        io: BlockIo,
        unmap: bool,
        flags: (bool, bool, bool),
    ) -> Result<ScsiResponse, Sense> {
        let (block, off, len) = self.write_same_plan(&req.borrowed(), io, flags)?;
        let zero = block.iter().all(|&b| b == 0);
        if unmap && self.thin {
            self.io_sense(req.tag, IoOp::Discard { offset: off, len })
                .await?;
        } else if zero {
            self.io_sense(req.tag, IoOp::WriteZeroes { offset: off, len })
                .await?;
        } else {
            let bs = block.len();
            let per = ((1usize << 20) / bs).max(1);
            let pattern: Bytes = block.iter().copied().cycle().take(per * bs).collect();
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(pattern.len() as u64) as usize;
                self.io_sense(
                    req.tag,
                    IoOp::Write {
                        offset: off + done,
                        data: pattern.slice(..n),
                    },
                )
                .await?;
                done += n as u64;
            }
        }
        self.flush_if_needed_async(req.tag, false).await?;
        Ok(ScsiResponse::good(Bytes::new()))
    }

    pub(super) async fn compare_and_write_async(
        &self,
        req: &OwnedRequest,
        io: BlockIo,
    ) -> Result<ScsiResponse, Sense> {
        if self.limits.max_compare_and_write == 0 {
            return Err(Sense::invalid_opcode());
        }
        self.check_writable()?;
        if io.blocks > u32::from(self.limits.max_compare_and_write) {
            return Err(Sense::invalid_field_in_cdb_at(13, None));
        }
        self.check_range(io.lba, u64::from(io.blocks))?;
        let n = self.bytes(io.blocks) as usize;
        data_out(&req.borrowed(), 2 * n as u64)?;
        if n > 0 {
            // The store compares and writes atomically (RBD: in the OSD), so this holds
            // against writers on other targets too.
            self.io_sense(
                req.tag,
                IoOp::CompareAndWrite {
                    offset: self.offset(io.lba),
                    compare: req.data_out.slice(..n),
                    write: req.data_out.slice(n..2 * n),
                },
            )
            .await?;
            self.flush_if_needed_async(req.tag, io.fua).await?;
        }
        Ok(ScsiResponse::good(Bytes::new()))
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
