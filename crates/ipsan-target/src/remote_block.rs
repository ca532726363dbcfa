//! A remote iSCSI LUN as a block device: a [`Backend`] whose requests are READ(16),
//! WRITE(16), SYNCHRONIZE CACHE(16), UNMAP, WRITE SAME(16) and COMPARE AND WRITE sent through
//! an `ipsan-initiator` session, for a front end that does not speak SCSI (the NVMe/TCP
//! namespace) or a local LU that wants a remote store under its own SCSI semantics.
//!
//! The gateway's remote LUN (`remote.rs`) is something else: a SCSI pass-through, the host's
//! CDB forwarded unchanged. This one is addressed in bytes like every other store
//! (`ipsan-block`), and lives here rather than in `ipsan-block` because `ipsan-initiator`
//! depends on `ipsan-scsi`, which depends on `ipsan-block`.
//!
//! Requests are [`Engine::Async`]: [`Backend::submit`] spawns the command on the tokio
//! runtime the device was opened on and completes from its task. Each request is one command:
//! the front end's transfer limits must not exceed the remote LUN's (VPD B0h). A UNIT
//! ATTENTION is retried (it reports a change, not a failure of the request); MISCOMPARE
//! becomes [`IoError::Miscompare`] with the remote's INFORMATION field (SBC-4 §5.3); NOT
//! READY a `TimedOut` error (retryable NOT READY again at a SCSI front end); a lost session a
//! `NotConnected` one.

use ipsan_scsi::cdb::build;
use std::fmt;
use std::io;
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::{DataDir, Session};
use ipsan_scsi::aio::Completer;
use ipsan_scsi::{Backend, Engine, IoCompletion, IoError, IoOp, IoRequest, Sense, SenseKey};

/// How often a command that met a UNIT ATTENTION is sent again.
const UA_RETRIES: usize = 4;

/// One LUN of a remote target, as a block store.
pub struct RemoteBlock {
    session: Arc<Session>,
    /// The raw 8-byte LUN field (SAM-5 §4.7).
    lun: u64,
    size: u64,
    block_size: u32,
    rt: tokio::runtime::Handle,
}

impl fmt::Debug for RemoteBlock {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteBlock")
            .field("lun", &self.lun)
            .field("size", &self.size)
            .field("block_size", &self.block_size)
            .finish_non_exhaustive()
    }
}

impl RemoteBlock {
    /// LUN `lun` of `session`'s target: reads its capacity (READ CAPACITY(16), SBC-4 §5.20);
    /// requests will run on the current tokio runtime.
    pub async fn open(session: Arc<Session>, lun: u64) -> io::Result<Self> {
        let lun = u64::from_be_bytes(ipsan_scsi::encode_lun(lun));
        let cdb = build::read_capacity16();
        let d = exec(&session, lun, cdb, || DataDir::Read(BytesMut::new(), 32))
            .await
            .map_err(into_io)?;
        let bad = || io::Error::new(io::ErrorKind::InvalidData, "short READ CAPACITY data");
        let last_lba =
            u64::from_be_bytes(d.get(0..8).ok_or_else(bad)?.try_into().map_err(|_| bad())?);
        let block_size = u32::from_be_bytes(
            d.get(8..12)
                .ok_or_else(bad)?
                .try_into()
                .map_err(|_| bad())?,
        );
        let size = last_lba
            .checked_add(1)
            .and_then(|n| n.checked_mul(u64::from(block_size)))
            .filter(|_| block_size > 0)
            .ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidData, "remote capacity out of range")
            })?;
        Ok(Self {
            session,
            lun,
            size,
            block_size,
            rt: tokio::runtime::Handle::current(),
        })
    }

    /// The remote LUN's logical block size.
    pub fn block_size(&self) -> u32 {
        self.block_size
    }

    fn blocking(&self, op: IoOp) -> io::Result<Option<BytesMut>> {
        ipsan_scsi::aio::wait(self, IoRequest { tag: 0, op })
            .result
            .map_err(into_io)
    }
}

/// Sends `cdb` (again after a UNIT ATTENTION) and returns its Data-In; `dir` makes the
/// data direction afresh for each send.
async fn exec(
    session: &Session,
    lun: u64,
    cdb: [u8; 16],
    dir: impl Fn() -> DataDir,
) -> Result<BytesMut, IoError> {
    let mut tries = 0;
    loop {
        let p = session.command_to(lun, cdb, dir()).await.map_err(|e| {
            IoError::Io(io::Error::new(
                io::ErrorKind::NotConnected,
                format!("remote LUN: {e}"),
            ))
        })?;
        // GOOD or CONDITION MET (SAM-5 §5.3).
        if p.status == 0x00 || p.status == 0x04 {
            return Ok(p.data);
        }
        let sense = p.sense.as_deref().and_then(Sense::parse);
        match sense {
            Some(s) if s.key == SenseKey::UNIT_ATTENTION && tries < UA_RETRIES => tries += 1,
            Some(s) if s.key == SenseKey::MISCOMPARE => {
                return Err(IoError::Miscompare {
                    offset: s.information.unwrap_or(0),
                })
            }
            Some(s) => {
                let kind = match s.key {
                    SenseKey::NOT_READY => io::ErrorKind::TimedOut,
                    SenseKey::DATA_PROTECT if s.asc == 0x27 && s.ascq == 0x07 => {
                        io::ErrorKind::StorageFull
                    }
                    _ => io::ErrorKind::Other,
                };
                return Err(IoError::Io(io::Error::new(
                    kind,
                    format!("remote LUN: {s}"),
                )));
            }
            None => {
                return Err(IoError::Io(io::Error::other(format!(
                    "remote LUN: SCSI status {:#04x}",
                    p.status
                ))))
            }
        }
    }
}

fn into_io(e: IoError) -> io::Error {
    match e {
        IoError::Io(e) => e,
        other => io::Error::other(other.to_string()),
    }
}

/// Byte range → (LBA, blocks), refusing what is not whole blocks inside the LUN.
fn extent(size: u64, bs: u64, offset: u64, len: u64) -> Result<(u64, u32), IoError> {
    let invalid = |m: String| IoError::Io(io::Error::new(io::ErrorKind::InvalidInput, m));
    if offset % bs != 0 || len % bs != 0 {
        return Err(invalid(format!(
            "range {offset}+{len} is not whole {bs}-byte blocks"
        )));
    }
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(invalid(format!(
            "range {offset}+{len} beyond remote LUN size {size}"
        )));
    }
    let blocks = u32::try_from(len / bs)
        .map_err(|_| invalid(format!("{len} bytes is more than one command carries")))?;
    Ok((offset / bs, blocks))
}

async fn run(
    session: Arc<Session>,
    lun: u64,
    size: u64,
    bs: u64,
    op: IoOp,
) -> Result<Option<BytesMut>, IoError> {
    match op {
        IoOp::Read {
            offset,
            len,
            mut buf,
        } => {
            let (lba, n) = extent(size, bs, offset, len as u64)?;
            let d = exec(&session, lun, build::read16(lba, n), || {
                DataDir::Read(BytesMut::new(), len)
            })
            .await?;
            if d.len() != len {
                return Err(IoError::Io(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!("remote LUN: short read: {} of {len} bytes", d.len()),
                )));
            }
            buf.extend_from_slice(&d);
            Ok(Some(buf))
        }
        IoOp::Write { offset, data } => {
            let (lba, n) = extent(size, bs, offset, data.len() as u64)?;
            exec(&session, lun, build::write16(lba, n, false), || {
                DataDir::Write(data.clone())
            })
            .await
            .map(|_| None)
        }
        IoOp::Flush => exec(&session, lun, build::sync_cache16(0, 0), || DataDir::None)
            .await
            .map(|_| None),
        IoOp::Discard { offset, len } => {
            let (lba, n) = extent(size, bs, offset, len)?;
            // UNMAP parameter list (SBC-4 §5.30.2): header, one block descriptor.
            let mut p = Vec::with_capacity(24);
            p.extend_from_slice(&22u16.to_be_bytes());
            p.extend_from_slice(&16u16.to_be_bytes());
            p.extend_from_slice(&[0; 4]);
            p.extend_from_slice(&lba.to_be_bytes());
            p.extend_from_slice(&n.to_be_bytes());
            p.extend_from_slice(&[0; 4]);
            let p = Bytes::from(p);
            exec(&session, lun, build::unmap(24), || {
                DataDir::Write(p.clone())
            })
            .await
            .map(|_| None)
        }
        IoOp::WriteZeroes { offset, len } => {
            let (lba, n) = extent(size, bs, offset, len)?;
            let zeros = Bytes::from(vec![0u8; bs as usize]);
            exec(&session, lun, build::write_same16(lba, n), || {
                DataDir::Write(zeros.clone())
            })
            .await
            .map(|_| None)
        }
        IoOp::CompareAndWrite {
            offset,
            compare,
            write,
        } => {
            let (lba, n) = extent(size, bs, offset, compare.len() as u64)?;
            let n = u8::try_from(n).map_err(|_| {
                IoError::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "compare and write of more than 255 blocks",
                ))
            })?;
            if write.len() != compare.len() {
                return Err(IoError::Io(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    "compare and write buffers differ in length",
                )));
            }
            let mut both = BytesMut::with_capacity(2 * compare.len());
            both.extend_from_slice(&compare);
            both.extend_from_slice(&write);
            let both = both.freeze();
            exec(&session, lun, build::compare_and_write(lba, n), || {
                DataDir::Write(both.clone())
            })
            .await
            .map(|_| None)
        }
    }
}

impl Backend for RemoteBlock {
    fn size(&self) -> u64 {
        self.size
    }
    /// Blocking form: parks the calling thread, which must not be one of the runtime's.
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let got = self.blocking(IoOp::Read {
            offset,
            len: buf.len(),
            buf: BytesMut::with_capacity(buf.len()),
        })?;
        let got = got.ok_or_else(|| io::Error::other("read completed without data"))?;
        buf.copy_from_slice(&got);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.blocking(IoOp::Write {
            offset,
            data: Bytes::copy_from_slice(buf),
        })
        .map(drop)
    }
    fn flush(&self) -> io::Result<()> {
        self.blocking(IoOp::Flush).map(drop)
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.blocking(IoOp::Discard { offset, len }).map(drop)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.blocking(IoOp::WriteZeroes { offset, len }).map(drop)
    }
    fn kind(&self) -> &'static str {
        "iscsi"
    }
    fn supports_unmap(&self) -> bool {
        true
    }
    fn engine(&self) -> Engine {
        Engine::Async
    }
    fn submit(&self, req: IoRequest, done: Completer) {
        let (session, lun, size, bs) = (
            self.session.clone(),
            self.lun,
            self.size,
            u64::from(self.block_size),
        );
        self.rt.spawn(async move {
            let result = run(session, lun, size, bs, req.op).await;
            done(IoCompletion {
                tag: req.tag,
                result,
            });
        });
    }
}
