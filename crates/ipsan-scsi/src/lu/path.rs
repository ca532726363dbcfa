//! The data path of [`LogicalUnit`], written once: READ, WRITE (and WRITE AND VERIFY),
//! SYNCHRONIZE CACHE, UNMAP, WRITE SAME and COMPARE AND WRITE over a [`Port`] to the backend.
//!
//! Two ports carry it. [`Blocking`] calls the backend's blocking methods on the caller's
//! thread under the LU's I/O lock (writes share it, COMPARE AND WRITE takes it exclusively);
//! its futures are ready when first polled, so [`LogicalUnit::execute`] drives them with one
//! poll and no allocation ([`drive`]). [`Submitted`] goes through the backend's
//! submit/complete interface ([`crate::aio::submit`]) for [`LogicalUnit::execute_async`],
//! holding no thread while the backend works; the store makes COMPARE AND WRITE atomic.

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use bytes::{Bytes, BytesMut};
use ipsan_block::Whole;

use super::media::first_difference;
use super::{data_out, read_tailroom, LogicalUnit, ScsiRequest, ScsiResponse};
use crate::aio::{self, IoOp, IoRequest};
use crate::cdb::{BlockIo, Command};
use crate::sense::Sense;

/// Data-out bytes as the request holds them: borrowed ([`LogicalUnit::execute`]) or shared
/// ([`LogicalUnit::execute_async`], whose backend may keep them until it completes).
pub(super) enum Data<'a> {
    Slice(&'a [u8]),
    Shared(Bytes),
    /// All of a buffer the caller handed over whole ([`LogicalUnit::execute_decoded_whole`]):
    /// the store may keep it ([`ipsan_block::Backend::write_whole`]).
    Whole(Whole),
}

impl Data<'_> {
    fn as_slice(&self) -> &[u8] {
        match self {
            Data::Slice(s) => s,
            Data::Shared(b) => b,
            Data::Whole(w) => w.as_bytes(),
        }
    }

    /// Owned bytes for a submitted request (a copy only for borrowed data, which the
    /// submitted path never has).
    fn into_bytes(self) -> Bytes {
        match self {
            Data::Slice(s) => Bytes::copy_from_slice(s),
            Data::Shared(b) => b,
            Data::Whole(w) => w.into_bytes(),
        }
    }
}

/// One data-path command's request: what the handlers read of it.
pub(super) struct PathRequest<'a> {
    /// The borrowed view (Data-Out, nexus, tailroom).
    pub view: ScsiRequest<'a>,
    /// The same Data-Out as shared bytes, when the request owns it.
    pub shared: Option<&'a Bytes>,
    /// The same Data-Out as a whole buffer the caller hands over, when it is one.
    pub whole: Option<&'a Whole>,
}

impl<'a> PathRequest<'a> {
    /// Data-Out bytes `from..to`, after [`data_out`] checked that they arrived: all of a
    /// whole buffer as that buffer, for the store to keep if it can.
    fn data(&self, from: usize, to: usize) -> Data<'a> {
        match (self.whole, self.shared) {
            (Some(w), _) if from == 0 && to == w.len() => Data::Whole(w.clone()),
            (_, Some(b)) => Data::Shared(b.slice(from..to)),
            _ => Data::Slice(&self.view.data_out[from..to]),
        }
    }
}

/// How the data path reaches the backend.
pub(super) trait Port {
    /// Appends `len` bytes read at `offset` to `buf`.
    async fn read(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        len: usize,
        buf: BytesMut,
    ) -> Result<BytesMut, Sense>;
    /// `len` bytes read at `offset` as the store's own shared memory, no copy, when the store
    /// can ([`ipsan_block::Backend::read_shared`]); `None`: [`Port::read`] instead.
    fn read_shared(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        len: usize,
    ) -> Option<Result<Bytes, Sense>>;
    async fn write(&self, lu: &LogicalUnit, offset: u64, data: Data<'_>) -> Result<(), Sense>;
    async fn flush(&self, lu: &LogicalUnit) -> Result<(), Sense>;
    /// Starts a flush nobody waits for (IMMED): a failure is only logged.
    fn flush_behind(&self, lu: &LogicalUnit);
    async fn discard(&self, lu: &LogicalUnit, offset: u64, len: u64) -> Result<(), Sense>;
    async fn write_zeroes(&self, lu: &LogicalUnit, offset: u64, len: u64) -> Result<(), Sense>;
    /// Writes `write` at `offset` if the medium there holds `compare`, atomically against
    /// every other write; MISCOMPARE with the offset of the first difference otherwise.
    async fn compare_and_write(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        compare: Data<'_>,
        write: Data<'_>,
    ) -> Result<(), Sense>;
}

/// The backend's blocking methods on the caller's thread.
pub(super) struct Blocking;

impl Port for Blocking {
    async fn read(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        len: usize,
        mut buf: BytesMut,
    ) -> Result<BytesMut, Sense> {
        lu.backend
            .read_append(&mut buf, len, offset)
            .map_err(|e| Sense::from_read_error(&e))?;
        Ok(buf)
    }

    fn read_shared(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        len: usize,
    ) -> Option<Result<Bytes, Sense>> {
        lu.backend
            .read_shared(len, offset)
            .map(|r| r.map_err(|e| Sense::from_read_error(&e)))
    }

    async fn write(&self, lu: &LogicalUnit, offset: u64, data: Data<'_>) -> Result<(), Sense> {
        let _shared = lu.io_lock.read().unwrap_or_else(|p| p.into_inner());
        match data {
            Data::Whole(w) => lu.backend.write_whole(w, offset),
            d => lu.backend.write_at(d.as_slice(), offset),
        }
        .map_err(|e| Sense::from_write_error(&e))
    }

    async fn flush(&self, lu: &LogicalUnit) -> Result<(), Sense> {
        lu.backend.flush().map_err(|e| Sense::from_write_error(&e))
    }

    fn flush_behind(&self, lu: &LogicalUnit) {
        let b = Arc::clone(&lu.backend);
        std::thread::spawn(move || {
            if let Err(e) = b.flush() {
                tracing::warn!(error = %e, "background SYNCHRONIZE CACHE failed");
            }
        });
    }

    async fn discard(&self, lu: &LogicalUnit, offset: u64, len: u64) -> Result<(), Sense> {
        let _shared = lu.io_lock.read().unwrap_or_else(|p| p.into_inner());
        lu.backend
            .unmap(offset, len)
            .map_err(|e| Sense::from_write_error(&e))
    }

    async fn write_zeroes(&self, lu: &LogicalUnit, offset: u64, len: u64) -> Result<(), Sense> {
        let _shared = lu.io_lock.read().unwrap_or_else(|p| p.into_inner());
        lu.backend
            .write_zeroes(offset, len)
            .map_err(|e| Sense::from_write_error(&e))
    }

    async fn compare_and_write(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        compare: Data<'_>,
        write: Data<'_>,
    ) -> Result<(), Sense> {
        let compare = compare.as_slice();
        let _excl = lu.io_lock.write().unwrap_or_else(|p| p.into_inner());
        let mut cur = vec![0u8; compare.len()];
        lu.backend
            .read_at(&mut cur, offset)
            .map_err(|e| Sense::from_read_error(&e))?;
        if let Some(off) = first_difference(&cur, compare) {
            return Err(Sense::miscompare(off as u64));
        }
        lu.backend
            .write_at(write.as_slice(), offset)
            .map_err(|e| Sense::from_write_error(&e))
    }
}

/// The backend's submit/complete interface; `tag` is the transport's tag of the command.
pub(super) struct Submitted {
    pub tag: u64,
}

impl Port for Submitted {
    async fn read(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        len: usize,
        buf: BytesMut,
    ) -> Result<BytesMut, Sense> {
        let op = IoOp::Read { offset, len, buf };
        Ok(lu.io_sense(self.tag, op).await?.unwrap_or_default())
    }

    fn read_shared(&self, _: &LogicalUnit, _: u64, _: usize) -> Option<Result<Bytes, Sense>> {
        // A submitted request goes through the store's own queue.
        None
    }

    async fn write(&self, lu: &LogicalUnit, offset: u64, data: Data<'_>) -> Result<(), Sense> {
        let data = data.into_bytes();
        lu.io_sense(self.tag, IoOp::Write { offset, data }).await?;
        Ok(())
    }

    async fn flush(&self, lu: &LogicalUnit) -> Result<(), Sense> {
        lu.io_sense(self.tag, IoOp::Flush).await?;
        Ok(())
    }

    fn flush_behind(&self, lu: &LogicalUnit) {
        lu.backend.submit(
            IoRequest {
                tag: self.tag,
                op: IoOp::Flush,
            },
            Box::new(|c| {
                if let Err(e) = c.result {
                    tracing::warn!(error = %e, "background SYNCHRONIZE CACHE failed");
                }
            }),
        );
    }

    async fn discard(&self, lu: &LogicalUnit, offset: u64, len: u64) -> Result<(), Sense> {
        lu.io_sense(self.tag, IoOp::Discard { offset, len }).await?;
        Ok(())
    }

    async fn write_zeroes(&self, lu: &LogicalUnit, offset: u64, len: u64) -> Result<(), Sense> {
        lu.io_sense(self.tag, IoOp::WriteZeroes { offset, len })
            .await?;
        Ok(())
    }

    async fn compare_and_write(
        &self,
        lu: &LogicalUnit,
        offset: u64,
        compare: Data<'_>,
        write: Data<'_>,
    ) -> Result<(), Sense> {
        // The store compares and writes atomically (RBD: in the OSD), so this holds against
        // writers on other targets too.
        let op = IoOp::CompareAndWrite {
            offset,
            compare: compare.into_bytes(),
            write: write.into_bytes(),
        };
        lu.io_sense(self.tag, op).await?;
        Ok(())
    }
}

/// Runs a future of the [`Blocking`] port: ready at the first poll, so no waker is needed
/// and nothing is allocated; should one ever wait, the thread parks until it is done.
pub(super) fn drive<F: Future>(f: F) -> F::Output {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => aio::block_on(f),
    }
}

/// Whether `cmd` takes the data path (the others go to `dispatch`).
pub(super) fn is_data_path(cmd: &Command) -> bool {
    matches!(
        cmd,
        Command::Read(_)
            | Command::Write(_)
            | Command::WriteAndVerify { .. }
            | Command::SynchronizeCache { .. }
            | Command::Unmap { .. }
            | Command::WriteSame { .. }
            | Command::CompareAndWrite(_)
    )
}

impl LogicalUnit {
    /// Runs a data-path command ([`is_data_path`]) over `port`.
    pub(super) async fn data_path<P: Port>(
        &self,
        port: &P,
        req: &PathRequest<'_>,
        cmd: Command,
    ) -> Result<ScsiResponse, Sense> {
        let none = || ScsiResponse::good(Bytes::new());
        match cmd {
            Command::Read(io) => self.read_on(port, req, io).await.map(ScsiResponse::good),
            // Verification after our own write would compare the same bytes; the write path
            // already reports medium errors.
            Command::Write(io) | Command::WriteAndVerify { io, .. } => {
                self.write_on(port, req, io).await.map(|()| none())
            }
            Command::SynchronizeCache { lba, blocks, immed } => {
                self.check_range(lba, u64::from(blocks))?;
                if immed {
                    // IMMED (SBC-4 §5.26): GOOD once the command is validated; the flush
                    // runs on.
                    port.flush_behind(self);
                } else {
                    port.flush(self).await?;
                }
                Ok(none())
            }
            Command::Unmap { anchor, param_len } => {
                if let Some(list) = self.unmap_list(&req.view, anchor, param_len)? {
                    for (lba, n) in list {
                        if n > 0 {
                            port.discard(self, self.offset(lba), self.bytes(n)).await?;
                        }
                    }
                }
                Ok(none())
            }
            Command::WriteSame {
                io,
                unmap,
                anchor,
                lbdata,
                ndob,
            } => {
                self.write_same_on(port, req, io, unmap, (anchor, lbdata, ndob))
                    .await?;
                Ok(none())
            }
            Command::CompareAndWrite(io) => {
                self.compare_and_write_on(port, req, io).await?;
                Ok(none())
            }
            // `is_data_path` routes nothing else here.
            _ => Err(Sense::invalid_opcode()),
        }
    }

    async fn flush_if_needed_on<P: Port>(&self, port: &P, fua: bool) -> Result<(), Sense> {
        if fua || !self.write_cache() {
            port.flush(self).await?;
        }
        Ok(())
    }

    async fn read_on<P: Port>(
        &self,
        port: &P,
        req: &PathRequest<'_>,
        io: BlockIo,
    ) -> Result<Bytes, Sense> {
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        let len = self.bytes(io.blocks) as usize;
        if len == 0 {
            return Ok(Bytes::new());
        }
        let room = if req.view.tailroom {
            read_tailroom(len)
        } else {
            0
        };
        if !req.view.tailroom {
            // The store's own bytes when it can share them (a RAM store): the socket's copy
            // is then the only one on the target (issue 27). A Seal session seals in place in
            // room past the data, so it gets a buffer of its own.
            if let Some(r) = port.read_shared(self, self.offset(io.lba), len) {
                return r;
            }
        }
        let buf = BytesMut::with_capacity(len.saturating_add(room));
        let buf = port.read(self, self.offset(io.lba), len, buf).await?;
        Ok(buf.freeze())
    }

    /// Writes the data-out blocks; flushes for FUA or when the write cache is off.
    async fn write_on<P: Port>(
        &self,
        port: &P,
        req: &PathRequest<'_>,
        io: BlockIo,
    ) -> Result<(), Sense> {
        self.check_writable()?;
        self.check_range(io.lba, u64::from(io.blocks))?;
        let n = self.bytes(io.blocks);
        data_out(&req.view, n)?;
        self.check_transfer(io.blocks)?;
        if io.blocks == 0 {
            return Ok(());
        }
        let data = req.data(0, n as usize);
        port.write(self, self.offset(io.lba), data).await?;
        self.flush_if_needed_on(port, io.fua).await
    }

    async fn write_same_on<P: Port>(
        &self,
        port: &P,
        req: &PathRequest<'_>,
        io: BlockIo,
        unmap: bool,
        flags: (bool, bool, bool),
    ) -> Result<(), Sense> {
        let (block, off, len) = self.write_same_plan(&req.view, io, flags)?;
        let zero = block.iter().all(|&b| b == 0);
        // UNMAP set on a thin LU deallocates whatever the data block holds: reads then
        // return zeros (LBPRZ), which libiscsi's unmap tests check (SBC-3 §5.43).
        if unmap && self.thin {
            port.discard(self, off, len).await?;
        } else if zero {
            port.write_zeroes(self, off, len).await?;
        } else {
            let bs = block.len();
            let per = ((1usize << 20) / bs).max(1);
            let pattern: Bytes = block.iter().copied().cycle().take(per * bs).collect();
            let mut done = 0u64;
            while done < len {
                let n = (len - done).min(pattern.len() as u64) as usize;
                port.write(self, off + done, Data::Shared(pattern.slice(..n)))
                    .await?;
                done += n as u64;
            }
        }
        self.flush_if_needed_on(port, false).await
    }

    async fn compare_and_write_on<P: Port>(
        &self,
        port: &P,
        req: &PathRequest<'_>,
        io: BlockIo,
    ) -> Result<(), Sense> {
        if self.limits.max_compare_and_write == 0 {
            return Err(Sense::invalid_opcode());
        }
        self.check_writable()?;
        if io.blocks > u32::from(self.limits.max_compare_and_write) {
            return Err(Sense::invalid_field_in_cdb_at(13, None));
        }
        self.check_range(io.lba, u64::from(io.blocks))?;
        let n = self.bytes(io.blocks) as usize;
        data_out(&req.view, 2 * n as u64)?;
        if n > 0 {
            let (compare, write) = (req.data(0, n), req.data(n, 2 * n));
            port.compare_and_write(self, self.offset(io.lba), compare, write)
                .await?;
            self.flush_if_needed_on(port, io.fua).await?;
        }
        Ok(())
    }
}
