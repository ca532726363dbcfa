//! Byte-addressed I/O on one LUN through an initiator session ([`Link`]: a [`Session`], or an
//! [`McsSession`] of several connections with `--connections`): what `ipsan attach`'s FUSE
//! file does for each read, write and sync, independent of FUSE.
//!
//! - Reads and writes are split into SCSI commands of at most `max_io` bytes; each command
//!   holds one permit of the depth semaphore while in flight, so at most `depth` commands of
//!   this LUN are outstanding (the session's CmdSN window may hold them back further).
//! - Offsets and lengths need not be block-aligned: a read fetches the covering blocks and
//!   returns the slice asked for; a write that starts or ends inside a block reads that edge
//!   block first and writes whole blocks back (read-modify-write, SBC-4 has no byte writes).
//!   Every write holds its block range in [`RangeLocks`] from the first read to the last
//!   write, so concurrent overlapping writes never lose each other's bytes.
//! - The file ends at the LUN's capacity (READ CAPACITY): reads past it return fewer bytes,
//!   writes past it are cut short (and fail with EFBIG when they start beyond it).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use ipsan_initiator::scsi::Capacity;
use ipsan_initiator::{DataDir, McsSession, Session};
use tokio::sync::Semaphore;

use super::ranges::RangeLocks;

/// The largest data transfer of one SCSI command (and FUSE's largest request).
pub const MAX_IO: usize = 1 << 20;

/// Why an I/O failed: the initiator error, and which command.
#[derive(Debug, thiserror::Error)]
pub enum IoError {
    /// A SCSI command failed (status + decoded sense, lost connection, timeout...).
    #[error("{op} of {blocks} block(s) at LBA {lba}: {source}")]
    Command {
        op: &'static str,
        lba: u64,
        blocks: u64,
        #[source]
        source: ipsan_initiator::Error,
    },
    /// The request starts past the end of the LUN.
    #[error("offset {0} is past the end of the LUN")]
    PastEnd(u64),
}

/// The session a mount's commands go on: one connection (with session recovery,
/// `--recovery-timeout`), or several (`--connections N`, RFC 7143 §4.2; a lost connection is
/// recovered inside the session at `--erl 2` where the target grants it, and ends the session
/// otherwise).
#[derive(Debug)]
pub enum Link {
    One(Session),
    Many(McsSession),
}

impl Link {
    /// The LUN's capacity READ CAPACITY found when the session opened.
    pub fn capacity(&self) -> Option<Capacity> {
        match self {
            Link::One(s) => s.capacity(),
            Link::Many(s) => s.capacity(),
        }
    }

    /// Connections open now.
    pub fn connections(&self) -> usize {
        match self {
            Link::One(_) => 1,
            Link::Many(s) => s.connections(),
        }
    }

    /// Why the session failed, if it did.
    pub fn failure(&self) -> Option<String> {
        match self {
            Link::One(s) => s.failure(),
            Link::Many(s) => s.failure(),
        }
    }

    async fn read(&self, lba: u64, blocks: u32) -> Result<BytesMut, ipsan_initiator::Error> {
        match self {
            Link::One(s) => s.read(lba, blocks).await,
            Link::Many(s) => s.read(lba, blocks).await,
        }
    }

    async fn write(&self, lba: u64, data: Bytes) -> Result<(), ipsan_initiator::Error> {
        match self {
            Link::One(s) => s.write(lba, data).await,
            Link::Many(s) => s.write(lba, data).await,
        }
    }

    async fn sync_cache(&self) -> Result<(), ipsan_initiator::Error> {
        match self {
            Link::One(s) => s.sync_cache().await,
            Link::Many(s) => s
                .command(ipsan_initiator::scsi::sync_cache10(), DataDir::None)
                .await
                .map(|_| ()),
        }
    }

    /// Logout (RFC 7143 §11.14).
    pub async fn logout(self) -> Result<(), ipsan_initiator::Error> {
        match self {
            Link::One(s) => s.logout().await,
            Link::Many(s) => s.logout().await,
        }
    }
}

/// One LUN behind a logged-in session.
#[derive(Debug)]
pub struct LunIo {
    session: Arc<Link>,
    block_len: u64,
    capacity: u64,
    max_io: u64,
    depth: Semaphore,
    writes: RangeLocks,
    /// Set once the connection is gone, so the cause is logged once, not per request.
    lost_logged: AtomicBool,
}

impl LunIo {
    /// I/O on `session`'s LUN with at most `depth` commands in flight.
    pub fn new(session: Arc<Link>, cap: Capacity, depth: usize) -> Self {
        let block_len = u64::from(cap.block_len);
        // A whole number of blocks, at least one.
        let max_io = (MAX_IO as u64 / block_len).max(1) * block_len;
        Self {
            session,
            block_len,
            capacity: cap.bytes(),
            max_io,
            depth: Semaphore::new(depth.max(1)),
            writes: RangeLocks::default(),
            lost_logged: AtomicBool::new(false),
        }
    }

    /// The LUN's size in bytes.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The LUN's logical block length in bytes.
    pub fn block_len(&self) -> u64 {
        self.block_len
    }

    /// Read `len` bytes at `offset`; fewer at the end of the LUN, none past it.
    pub async fn read(&self, offset: u64, len: usize) -> Result<Bytes, IoError> {
        let end = offset.saturating_add(len as u64).min(self.capacity);
        if offset >= end {
            return Ok(Bytes::new());
        }
        let first = offset / self.block_len;
        let last = end.div_ceil(self.block_len);
        let mut buf = self.read_blocks(first, last).await?;
        let skip = usize::try_from(offset - first * self.block_len).unwrap_or(0);
        let take = usize::try_from(end - offset).unwrap_or(0);
        let mut out = buf.split_off(skip);
        out.truncate(take);
        Ok(out.freeze())
    }

    /// Write `data` at `offset`; returns how many bytes were written (fewer at the end of the
    /// LUN). Whole blocks go out as they are; partial ones are read, patched and written back,
    /// all under the write range lock.
    pub async fn write(&self, offset: u64, data: Bytes) -> Result<usize, IoError> {
        if data.is_empty() {
            return Ok(0);
        }
        if offset >= self.capacity {
            return Err(IoError::PastEnd(offset));
        }
        let end = offset.saturating_add(data.len() as u64).min(self.capacity);
        let n = usize::try_from(end - offset).unwrap_or(0);
        let data = data.slice(..n);
        let bl = self.block_len;
        let first = offset / bl;
        let last = end.div_ceil(bl);
        let _held = self.writes.lock(first, last).await;
        let head = offset % bl != 0;
        let tail = end % bl != 0;
        if !head && !tail {
            self.write_blocks(first, data).await?;
            return Ok(n);
        }
        let whole = usize::try_from((last - first) * bl).unwrap_or(0);
        let mut buf = BytesMut::zeroed(whole);
        let blk = usize::try_from(bl).unwrap_or(0);
        if head {
            let b = self.read_blocks(first, first + 1).await?;
            buf[..blk].copy_from_slice(&b);
        }
        if tail && (last - 1 != first || !head) {
            let b = self.read_blocks(last - 1, last).await?;
            buf[whole - blk..].copy_from_slice(&b);
        }
        let at = usize::try_from(offset - first * bl).unwrap_or(0);
        buf[at..at + n].copy_from_slice(&data);
        self.write_blocks(first, buf.freeze()).await?;
        Ok(n)
    }

    /// SYNCHRONIZE CACHE: everything acknowledged so far is on the medium when this returns.
    pub async fn sync(&self) -> Result<(), IoError> {
        let _permit = self.depth.acquire().await;
        self.session
            .sync_cache()
            .await
            .map_err(|source| IoError::Command {
                op: "SYNCHRONIZE CACHE",
                lba: 0,
                blocks: 0,
                source,
            })
    }

    /// Log an error once per cause class: every I/O fails the same way after the connection
    /// is lost, so that is logged once with its reason, the rest at debug level.
    pub fn log_failure(&self, what: &str, e: &IoError) {
        if let Some(why) = self.session.failure() {
            if !self.lost_logged.swap(true, Ordering::Relaxed) {
                tracing::error!(
                    "{what}: EIO: connection to the target lost ({why}); \
                     every further request fails with EIO until unmounted"
                );
            } else {
                tracing::debug!("{what}: EIO: {e}");
            }
            return;
        }
        tracing::error!("{what}: EIO: {e}");
    }

    /// READ blocks `[first, last)`, in commands of at most `max_io` bytes, all in flight at
    /// once (each under its own depth permit).
    async fn read_blocks(&self, first: u64, last: u64) -> Result<BytesMut, IoError> {
        let per = self.max_io / self.block_len;
        let chunks: Vec<(u64, u64)> = (first..last)
            .step_by(usize::try_from(per).unwrap_or(1))
            .map(|lba| (lba, (lba + per).min(last)))
            .collect();
        let mut parts = Vec::with_capacity(chunks.len());
        for r in join_all(
            chunks
                .iter()
                .map(|&(lba, end)| self.read_command(lba, end - lba)),
        )
        .await
        {
            parts.push(r?);
        }
        let mut out = parts.into_iter();
        let mut buf = out.next().unwrap_or_default();
        for p in out {
            buf.unsplit(p);
        }
        Ok(buf)
    }

    async fn read_command(&self, lba: u64, blocks: u64) -> Result<BytesMut, IoError> {
        let _permit = self.depth.acquire().await;
        let n = u32::try_from(blocks).unwrap_or(u32::MAX);
        self.session
            .read(lba, n)
            .await
            .map_err(|source| IoError::Command {
                op: "READ(16)",
                lba,
                blocks,
                source,
            })
    }

    /// WRITE whole blocks at `first`, in commands of at most `max_io` bytes, all in flight.
    async fn write_blocks(&self, first: u64, data: Bytes) -> Result<(), IoError> {
        let per = usize::try_from(self.max_io).unwrap_or(MAX_IO);
        let blk = usize::try_from(self.block_len).unwrap_or(512);
        let cmds = (0..data.len()).step_by(per).map(|at| {
            let part = data.slice(at..(at + per).min(data.len()));
            let lba = first + (at / blk) as u64;
            self.write_command(lba, part)
        });
        for r in join_all(cmds).await {
            r?;
        }
        Ok(())
    }

    async fn write_command(&self, lba: u64, data: Bytes) -> Result<(), IoError> {
        let _permit = self.depth.acquire().await;
        let blocks = data.len() as u64 / self.block_len;
        self.session
            .write(lba, data)
            .await
            .map_err(|source| IoError::Command {
                op: "WRITE(16)",
                lba,
                blocks,
                source,
            })
    }
}

/// Await every future, concurrently, results in order. Requests are at most a couple of
/// commands (FUSE sends ≤ 1 MiB), so a plain poll-all loop is enough.
async fn join_all<F: std::future::Future>(futs: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futs: Vec<_> = futs.into_iter().map(Box::pin).collect();
    let mut out: Vec<Option<F::Output>> = futs.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut pending = false;
        for (f, o) in futs.iter_mut().zip(out.iter_mut()) {
            if o.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *o = Some(v),
                    std::task::Poll::Pending => pending = true,
                }
            }
        }
        if pending {
            std::task::Poll::Pending
        } else {
            std::task::Poll::Ready(())
        }
    })
    .await;
    out.into_iter().flatten().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsan_initiator::{IscsiUrl, SessionConfig};
    use ipsan_target::config::{self as tconfig, Config, TargetConfig};
    use ipsan_target::ServerHandle;

    const IQN: &str = "iqn.2026-11.org.ipsan:attach-unit";

    async fn lun(depth: usize) -> (ServerHandle, Arc<LunIo>) {
        let mut c = Config {
            portals: vec!["127.0.0.1:0".parse().unwrap()],
            targets: vec![TargetConfig {
                iqn: IQN.into(),
                alias: None,
                allow: Vec::new(),
                chap: None,
                chap_hosts: Vec::new(),
                seal: Default::default(),
                luns: tconfig::luns_from_specs(&["mem:4MiB".to_owned()]).unwrap(),
            }],
            ..Config::default()
        };
        c.validate().unwrap();
        let h = ServerHandle::start(&c).await.unwrap();
        let url = IscsiUrl::parse(&format!("iscsi://{}/{IQN}/0", h.addrs[0])).unwrap();
        let s = Session::open(&url, &SessionConfig::default())
            .await
            .unwrap();
        let cap = s.capacity().unwrap();
        (h, Arc::new(LunIo::new(Arc::new(Link::One(s)), cap, depth)))
    }

    fn pattern(seed: u8, len: usize) -> Vec<u8> {
        (0..len)
            .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed))
            .collect()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_unaligned_writes_into_shared_blocks_lose_nothing() {
        let work = async {
            let (_h, io) = lun(32).await;
            // Eight writers, each owning every eighth 37-byte slot of a 64 KiB region: every
            // 512-byte block is read-modified-written by all of them at once.
            let (base, len, slot, writers) = (4096u64 + 3, 64 * 1024usize, 37usize, 8usize);
            let mut tasks = Vec::new();
            for w in 0..writers {
                let io = io.clone();
                tasks.push(tokio::spawn(async move {
                    let p = pattern(w as u8 + 1, len);
                    let mut slots = Vec::new();
                    for k in (w..len / slot).step_by(writers) {
                        let at = k * slot;
                        let io = io.clone();
                        let bytes = p[at..at + slot].to_vec();
                        slots.push(tokio::spawn(async move {
                            io.write(base + at as u64, bytes.into()).await.unwrap()
                        }));
                    }
                    for s in slots {
                        assert_eq!(s.await.unwrap(), slot);
                    }
                }));
            }
            for t in tasks {
                t.await.unwrap();
            }
            let back = io.read(base, len).await.unwrap();
            for k in 0..len / slot {
                let at = k * slot;
                let want = &pattern((k % writers) as u8 + 1, len)[at..at + slot];
                assert_eq!(&back[at..at + slot], want, "slot {k} (offset {at}) lost");
            }
        };
        tokio::time::timeout(std::time::Duration::from_secs(60), work)
            .await
            .expect("bounded");
    }

    #[tokio::test]
    async fn reads_and_writes_stop_at_the_end_of_the_lun() {
        let (_h, io) = lun(4).await;
        let cap = io.capacity();
        assert_eq!(
            io.write(cap - 10, Bytes::from_static(&[7u8; 30]))
                .await
                .unwrap(),
            10
        );
        let tail = io.read(cap - 12, 100).await.unwrap();
        assert_eq!(&tail[..], &[0, 0, 7, 7, 7, 7, 7, 7, 7, 7, 7, 7]);
        assert!(io.read(cap, 10).await.unwrap().is_empty());
        assert!(matches!(
            io.write(cap, Bytes::from_static(&[1])).await,
            Err(IoError::PastEnd(_))
        ));
        // A write spanning more than one command's worth, unaligned at both ends.
        let big = pattern(9, MAX_IO + 1000);
        assert_eq!(
            io.write(777, Bytes::from(big.clone())).await.unwrap(),
            big.len()
        );
        assert_eq!(&io.read(777, big.len()).await.unwrap()[..], &big[..]);
        io.sync().await.unwrap();
    }

    #[tokio::test]
    async fn a_failed_command_reports_its_decoded_sense() {
        let (_h, io) = lun(4).await;
        let past = io.capacity() / io.block_len();
        let e = io.read_command(past, 1).await.unwrap_err();
        let text = e.to_string();
        assert!(
            text.contains("READ(16)") && text.contains(&format!("LBA {past}")),
            "{text}"
        );
        assert!(
            text.contains("ILLEGAL REQUEST") && text.contains("OUT OF RANGE"),
            "the sense is not decoded: {text}"
        );
    }
}
