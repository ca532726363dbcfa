//! One logical unit: SBC-4 block commands over a [`Backend`], SPC-4 device management,
//! unit attentions (SAM-5 §5.14) and reservations.
//!
//! `execute` is blocking and thread-safe: the target calls it from a blocking pool, several
//! commands of one LU at once. Ordinary writes share `io_lock`; COMPARE AND WRITE takes it
//! exclusively, so its compare and write are atomic against every other write (SBC-4 §5.3).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bytes::{Bytes, BytesMut};

use crate::aio::{self, Engine, IoError, IoOp, IoRequest};
use crate::backend::Backend;
use crate::cdb::{self, op, BlockIo, Command, CommandInfo, DataDirection};
use crate::config::Unit;
pub use crate::config::{Limits, LuConfig};
use crate::pr::BackendPr as _;
use crate::response::truncate;
pub use crate::response::{NexusId, ScsiResponse};
use crate::sense::{ScsiStatus, Sense};
use crate::{inquiry, lun, mode, opcodes, pr};

/// Which reset happened (SAM-5 §6.3 task management functions, §6.3.x power on).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum ResetKind {
    /// LOGICAL UNIT RESET: UA 29h/03h BUS DEVICE RESET FUNCTION OCCURRED.
    LogicalUnit,
    /// TARGET WARM RESET: UA 29h/02h SCSI BUS RESET OCCURRED.
    TargetWarm,
    /// TARGET COLD RESET: UA 29h/01h POWER ON OCCURRED.
    TargetCold,
}

/// One SCSI command as the iSCSI layer hands it over.
#[derive(Clone, Copy, Debug)]
pub struct ScsiRequest<'a> {
    /// The CDB (may carry padding past the command's length).
    pub cdb: &'a [u8],
    /// All Data-Out bytes received for the command.
    pub data_out: &'a [u8],
    /// Who sent it.
    pub nexus: &'a NexusId,
    /// The LUN it addressed.
    pub lun: u64,
    /// Leave [`read_tailroom`] past a READ's data, for a payload transform that seals the
    /// buffer in place (a Seal session). Plain sessions pass `false`: they need no room, and
    /// 64 KiB plus room leaves the allocator's pooled size classes (mimalloc's medium objects
    /// end at 64 KiB) for a page of its own per read.
    pub tailroom: bool,
}

/// One command with owned buffers, for [`LogicalUnit::execute_async`]: the backend may keep
/// slices of `data_out` until it completes.
#[derive(Clone, Debug)]
pub struct OwnedRequest {
    /// The CDB.
    pub cdb: Vec<u8>,
    /// All Data-Out bytes received for the command.
    pub data_out: Bytes,
    /// Who sent it.
    pub nexus: NexusId,
    /// The LUN it addressed.
    pub lun: u64,
    /// The transport's tag for it (iSCSI: the initiator task tag), passed to the backend.
    pub tag: u64,
}

impl OwnedRequest {
    /// The borrowed form [`LogicalUnit::execute`] takes.
    pub fn borrowed(&self) -> ScsiRequest<'_> {
        ScsiRequest {
            cdb: &self.cdb,
            data_out: &self.data_out,
            nexus: &self.nexus,
            lun: self.lun,
            // The async path reads into buffers of its own (`read_async`).
            tailroom: false,
        }
    }
}

/// Why a logical unit could not be created.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LuError {
    /// Block size other than 512 or 4096.
    #[error("block size {0} unsupported (512 or 4096)")]
    BlockSize(u32),
    /// Backend smaller than one block or not a multiple of the block size.
    #[error("backend size {size} is not a positive multiple of the block size {block_size}")]
    Size {
        /// Backend size in bytes.
        size: u64,
        /// Requested block size.
        block_size: u32,
    },
    /// A text field holds characters INQUIRY may not carry (SPC-4 §4.3.1).
    #[error("{0} must be printable ASCII")]
    NotAscii(&'static str),
}

/// The largest transfer Linux's sd driver takes as optimal: sd.c (`sd_validate_opt_xfer_size`)
/// ignores an OPTIMAL TRANSFER LENGTH above 65535 blocks (SD_DEF_XFER_BLOCKS) or above the
/// device maximum, and warns at every attach. The largest power of two of blocks within both
/// is also a whole number of pages and of the 4 KiB granularity for 512- and 4096-byte blocks
/// (16 MiB and 64 MiB against a 64 MiB maximum).
#[must_use]
pub fn optimal_transfer(max_transfer: u32) -> u32 {
    const SD_DEF_XFER_BLOCKS: u32 = 0xffff;
    let cap = max_transfer.min(SD_DEF_XFER_BLOCKS);
    if cap == 0 {
        0
    } else {
        1 << cap.ilog2()
    }
}

/// Mutable per-LU state shared by all nexuses.
#[derive(Debug, Default)]
pub(crate) struct State {
    /// Nexuses that have sent at least one command.
    pub known: HashSet<NexusId>,
    /// Pending unit attentions per nexus, oldest first.
    pub ua: HashMap<NexusId, VecDeque<(u8, u8)>>,
    /// PREVENT ALLOW MEDIUM REMOVAL holders.
    pub prevent: HashSet<NexusId>,
}

/// How often a reservation update is retried when another writer (another target serving
/// the same image) stored first.
const PR_RETRIES: usize = 32;

/// Spare capacity a READ's data buffer gets past its data: room for a payload transform's
/// trailer, so Seal can seal the data in place instead of copying it into a new buffer (its
/// trailer is an 8-byte counter and a 16-byte tag per chunk: this covers chunks of 4 KiB and
/// up, docs/seal.md §4). Capacity that is never written costs no page faults. Reads under
/// 64 KiB get none: copying them is cheap, and their buffers stay exactly as before.
#[must_use]
pub const fn read_tailroom(len: usize) -> usize {
    if len < 64 * 1024 {
        0
    } else {
        len / 256 + 64
    }
}

/// A SCSI logical unit backed by one [`Backend`].
#[derive(Debug)]
pub struct LogicalUnit {
    backend: Arc<dyn Backend>,
    cfg: LuConfig,
    /// Capacity in blocks; grows with [`LogicalUnit::grow`] and follows the backend's size (an
    /// RBD image can be resized).
    num_blocks: AtomicU64,
    thin: bool,
    limits: Limits,
    write_cache: AtomicBool,
    refuse_reservations: bool,
    /// Where RESERVE(6) and persistent reservations live ([`pr::PrStore`]).
    pr: Arc<dyn pr::PrStore>,
    io_lock: RwLock<()>,
    state: Mutex<State>,
}

impl LogicalUnit {
    /// Creates an LU over `backend`; the capacity is the backend size in whole blocks.
    pub fn new(backend: Arc<dyn Backend>, cfg: LuConfig) -> Result<Self, LuError> {
        if cfg.block_size != 512 && cfg.block_size != 4096 {
            return Err(LuError::BlockSize(cfg.block_size));
        }
        let bs = u64::from(cfg.block_size);
        let size = backend.size();
        if size < bs || size % bs != 0 {
            return Err(LuError::Size {
                size,
                block_size: cfg.block_size,
            });
        }
        let printable = |s: &str| s.bytes().all(|b| (0x20..=0x7E).contains(&b));
        for (name, v) in [
            ("vendor", &cfg.vendor),
            ("product", &cfg.product),
            ("revision", &cfg.revision),
            ("serial", &cfg.serial),
        ] {
            if !printable(v) {
                return Err(LuError::NotAscii(name));
            }
        }
        let thin = cfg.thin_provisioning && backend.supports_unmap();
        let natural = backend.granularity();
        let gran = (natural.unwrap_or_else(|| backend_unmap_granularity(backend.kind())) / bs)
            .clamp(1, u64::from(u32::MAX)) as u32;
        let max_transfer = ((64u64 << 20) / bs) as u32;
        let limits = Limits {
            max_transfer,
            opt_transfer: optimal_transfer(max_transfer),
            // A store that limits atomic compare-and-write (RBD: one 512-byte sector) caps
            // MAXIMUM COMPARE AND WRITE LENGTH; 0 = COMPARE AND WRITE unsupported.
            max_compare_and_write: backend
                .max_compare_and_write()
                .map_or(255, |b| (b / bs).min(255) as u8),
            max_unmap_lba: if thin { 1 << 20 } else { 0 },
            max_unmap_descriptors: if thin { 2048 } else { 0 },
            unmap_granularity: if thin { gran } else { 0 },
            max_write_same: (128u64 << 20) / bs,
            // OPTIMAL TRANSFER LENGTH GRANULARITY (SBC-4 §6.6.4): the store's natural unit
            // (RBD's object size) where it has one.
            opt_granularity: (natural.unwrap_or(4096) / bs).clamp(1, u64::from(u16::MAX)) as u16,
        };
        Ok(Self {
            num_blocks: AtomicU64::new(size / bs),
            write_cache: AtomicBool::new(cfg.write_cache),
            // A store other targets may serve too (an RBD image) must keep reservations where
            // they all see them; without such a place they are refused (docs/rbd.md).
            refuse_reservations: backend.identity().is_some() && backend.pr_store().is_none(),
            pr: backend
                .pr_store()
                .unwrap_or_else(|| Arc::new(pr::MemPrStore::default())),
            backend,
            thin,
            limits,
            cfg,
            io_lock: RwLock::new(()),
            state: Mutex::new(State::default()),
        })
    }

    /// Logical block size in bytes.
    pub fn block_size(&self) -> u32 {
        self.cfg.block_size
    }
    /// Capacity in logical blocks.
    pub fn num_blocks(&self) -> u64 {
        self.num_blocks.load(Ordering::Acquire)
    }
    /// The configuration.
    pub fn config(&self) -> &LuConfig {
        &self.cfg
    }
    /// Whether thin provisioning is in effect.
    pub fn thin(&self) -> bool {
        self.thin
    }
    /// The advertised block limits.
    pub fn limits(&self) -> Limits {
        self.limits
    }
    /// Whether the volatile write cache is currently enabled (MODE SELECT can change it).
    pub fn write_cache(&self) -> bool {
        self.write_cache.load(Ordering::Relaxed)
    }
    pub(crate) fn set_write_cache(&self, on: bool) {
        self.write_cache.store(on, Ordering::Relaxed);
    }

    pub(crate) fn state(&self) -> MutexGuard<'_, State> {
        // A panic while holding the lock leaves plain data behind; keep serving.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Direction and Data-Out length of a CDB, before any data arrives. Errors are the
    /// CHECK CONDITION the command will get anyway, so the iSCSI layer may answer at once.
    pub fn command_info(&self, cdb: &[u8]) -> Result<CommandInfo, Sense> {
        let cmd = cdb::parse(cdb)?;
        if self.cfg.read_only
            && matches!(
                cmd,
                Command::Write(_)
                    | Command::WriteAndVerify { .. }
                    | Command::WriteSame { .. }
                    | Command::Unmap { .. }
                    | Command::CompareAndWrite(_)
                    | Command::OrWrite(_)
            )
        {
            // Known before any data moves: no point soliciting Data-Out (SBC-4 §4.11).
            return Err(Sense::write_protected());
        }
        let bs = u64::from(self.cfg.block_size);
        let write = |n: u64| CommandInfo {
            direction: if n == 0 {
                DataDirection::None
            } else {
                DataDirection::Write
            },
            data_out_len: n,
        };
        let read = CommandInfo {
            direction: DataDirection::Read,
            data_out_len: 0,
        };
        let none = CommandInfo {
            direction: DataDirection::None,
            data_out_len: 0,
        };
        Ok(match cmd {
            Command::Write(io) | Command::OrWrite(io) => write(u64::from(io.blocks) * bs),
            Command::WriteAndVerify { io, .. } => write(u64::from(io.blocks) * bs),
            Command::Verify { io, bytchk } => match bytchk {
                1 => write(u64::from(io.blocks) * bs),
                3 if io.blocks > 0 => write(bs),
                _ => none,
            },
            Command::WriteSame { ndob, .. } => write(if ndob { 0 } else { bs }),
            Command::CompareAndWrite(io) => write(2 * u64::from(io.blocks) * bs),
            Command::Unmap { param_len, .. } | Command::ModeSelect { param_len, .. } => {
                write(u64::from(param_len))
            }
            Command::PersistentReserveOut(p) => write(u64::from(p.param_len)),
            Command::TestUnitReady
            | Command::SynchronizeCache { .. }
            | Command::PreFetch { .. }
            | Command::StartStopUnit { .. }
            | Command::PreventAllow { .. }
            | Command::Reserve6
            | Command::Release6 => none,
            _ => read,
        })
    }

    /// Executes one command to completion (blocking).
    pub fn execute(&self, req: &ScsiRequest<'_>) -> ScsiResponse {
        if let Some(r) = self.precheck(req.nexus, req.cdb) {
            return r;
        }
        let cmd = match cdb::parse(req.cdb) {
            Ok(c) => c,
            Err(s) => return ScsiResponse::check(s),
        };
        match self.dispatch(req, cmd) {
            Ok(r) => r,
            Err(s) => ScsiResponse::check(s),
        }
    }

    /// The checks that come before a command may touch the medium: a pending unit attention
    /// (reported and consumed, SAM-5 §5.14), CDB validity and reservation conflicts
    /// (SPC-4 §5.13). `None` means the command may proceed. [`LogicalUnit::execute`] runs
    /// this itself; a transport that answers a command without executing it (e.g. an iSCSI
    /// write whose EDTL covers no whole block) must call it first, or it would report GOOD
    /// to an initiator that holds no access.
    pub fn precheck(&self, nexus: &NexusId, cdb: &[u8]) -> Option<ScsiResponse> {
        self.follow_capacity();
        let opcode = cdb.first().copied().unwrap_or(0xFF);
        // Unit attention (SAM-5 §5.14): reported once, before anything else, except to
        // INQUIRY, REPORT LUNS and REQUEST SENSE.
        {
            let mut st = self.state();
            if st.known.insert(nexus.clone()) && self.cfg.power_on_ua {
                st.ua
                    .entry(nexus.clone())
                    .or_default()
                    .push_back((0x29, 0x01));
            }
            if !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE) {
                if let Some(q) = st.ua.get_mut(nexus) {
                    if let Some((asc, ascq)) = q.pop_front() {
                        return Some(ScsiResponse::check(Sense::unit_attention(asc, ascq)));
                    }
                }
            }
        }
        let cmd = match cdb::parse(cdb) {
            Ok(c) => c,
            Err(s) => return Some(ScsiResponse::check(s)),
        };
        match self.access_allowed(nexus, &cmd) {
            Ok(true) => None,
            Ok(false) => Some(ScsiResponse::status(ScsiStatus::RESERVATION_CONFLICT)),
            Err(s) => Some(ScsiResponse::check(s)),
        }
    }

    /// Follows the backend's size: when it changed (an RBD image resized), the capacity
    /// follows and every known I_T nexus gets CAPACITY DATA HAS CHANGED (2Ah/09h, SBC-4
    /// §4.9 / SPC-4 annex), as a disk array reports a grown volume.
    fn follow_capacity(&self) {
        let bs = u64::from(self.cfg.block_size);
        let now = self.backend.size() / bs;
        let cur = self.num_blocks.load(Ordering::Acquire);
        if now == cur || now == 0 {
            return;
        }
        if self
            .num_blocks
            .compare_exchange(cur, now, Ordering::AcqRel, Ordering::Acquire)
            .is_ok()
        {
            tracing::info!(
                serial = %self.cfg.serial,
                old_blocks = cur,
                new_blocks = now,
                "capacity changed"
            );
            let mut st = self.state();
            LogicalUnit::ua_others(&mut st, None, 0x2A, 0x09);
        }
    }

    /// How the backend wants commands run ([`Engine`]).
    pub fn engine(&self) -> Engine {
        self.backend.engine()
    }

    /// Whether RESERVE(6), RELEASE(6) and PERSISTENT RESERVE OUT are refused: the backend
    /// may be shared with other targets and offers no shared [`pr::PrStore`], so a
    /// reservation kept in this process could not bind the others (docs/rbd.md).
    pub fn refuses_reservations(&self) -> bool {
        self.refuse_reservations
    }

    fn it(&self, nexus: &NexusId) -> pr::ItNexus {
        pr::ItNexus {
            initiator: nexus.clone(),
            port: self.cfg.relative_port,
        }
    }

    /// Applies `f` to the reservation state and stores the result (compare-and-swap on the
    /// store's version, retried when another target stored first). Nothing is stored
    /// unless `f` answers GOOD and changed something; the unit attentions it queues reach
    /// the nexuses of this target port (those of other ports are not delivered).
    fn pr_update(
        &self,
        f: impl Fn(&mut pr::PrState, &mut Vec<pr::PendingUa>) -> Result<ScsiResponse, Sense>,
    ) -> Result<ScsiResponse, Sense> {
        let store_err = |e: std::io::Error| {
            tracing::warn!(serial = %self.cfg.serial, "reservation state: {e}");
            Sense::from_store_error(&e)
        };
        for _ in 0..PR_RETRIES {
            let (cur, version) = self.pr.load().map_err(store_err)?;
            let mut next = (*cur).clone();
            let mut uas = Vec::new();
            let r = f(&mut next, &mut uas)?;
            if r.status != ScsiStatus::GOOD || next == *cur {
                return Ok(r);
            }
            if self.pr.store(&next, version).map_err(store_err)? {
                let mut st = self.state();
                for (n, asc, ascq) in uas {
                    if n.port == self.cfg.relative_port {
                        st.ua.entry(n.initiator).or_default().push_back((asc, ascq));
                    }
                }
                return Ok(r);
            }
        }
        tracing::warn!(serial = %self.cfg.serial, "reservation state: too many concurrent updates");
        Err(Sense::not_ready_becoming_ready())
    }

    /// Ends the RESERVE(6) of `holder` (of anyone when `None`), if there is one: after a
    /// reset or when the holder's nexus is gone (SPC-2 §5.5.1).
    fn end_reserve6(&self, holder: Option<&pr::ItNexus>) {
        // Only when the (cached) state shows one: no store round trip on every logout, and
        // none that could block a reset while a shared store is unreachable.
        let held = match self.pr.current() {
            Ok(p) => p
                .reserve6_holder()
                .is_some_and(|h| holder.is_none_or(|n| n == h)),
            Err(e) => {
                tracing::warn!(serial = %self.cfg.serial, "reservation state unknown, RESERVE(6) not ended: {e}");
                false
            }
        };
        if held {
            let r = self.pr_update(|p, _| {
                p.release6(holder);
                Ok(ScsiResponse::good(Bytes::new()))
            });
            if let Err(s) = r {
                tracing::warn!(serial = %self.cfg.serial, "could not end a RESERVE(6): {s}");
            }
        }
    }

    /// Whether [`LogicalUnit::execute_async`] completes `cdb` without blocking: the data-path
    /// commands (READ, WRITE, SYNCHRONIZE CACHE, UNMAP, WRITE SAME, COMPARE AND WRITE) on an
    /// [`Engine::Async`] backend. Other commands go through [`LogicalUnit::execute`] on a
    /// blocking pool.
    pub fn runs_async(&self, cdb: &[u8]) -> bool {
        self.engine() == Engine::Async
            && matches!(
                cdb.first().copied(),
                Some(
                    op::READ_6
                        | op::READ_10
                        | op::READ_12
                        | op::READ_16
                        | op::WRITE_6
                        | op::WRITE_10
                        | op::WRITE_12
                        | op::WRITE_16
                        | op::SYNCHRONIZE_CACHE_10
                        | op::SYNCHRONIZE_CACHE_16
                        | op::UNMAP
                        | op::WRITE_SAME_10
                        | op::WRITE_SAME_16
                        | op::COMPARE_AND_WRITE
                )
            )
    }

    /// Executes one command through the backend's submit/complete interface: the future
    /// holds no thread while the backend works. The checks (unit attentions, reservations,
    /// ranges) are those of [`LogicalUnit::execute`]; commands [`LogicalUnit::runs_async`]
    /// does not cover run synchronously here, so call it only for those it does.
    pub async fn execute_async(&self, req: OwnedRequest) -> ScsiResponse {
        if let Some(r) = self.precheck(&req.nexus, &req.cdb) {
            return r;
        }
        let cmd = match cdb::parse(&req.cdb) {
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
                ndob,
            } => self.write_same_async(&req, io, unmap, anchor, ndob).await,
            Command::CompareAndWrite(io) => self.compare_and_write_async(&req, io).await,
            other => self.dispatch(&req.borrowed(), other),
        };
        r.unwrap_or_else(ScsiResponse::check)
    }

    async fn io(&self, tag: u64, op: IoOp) -> Result<Option<BytesMut>, (IoError, bool)> {
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

    async fn io_sense(&self, tag: u64, op: IoOp) -> Result<Option<BytesMut>, Sense> {
        self.io(tag, op)
            .await
            .map_err(|(e, write)| Sense::from_block_error(&e, write))
    }

    async fn flush_if_needed_async(&self, tag: u64, fua: bool) -> Result<(), Sense> {
        if fua || !self.write_cache() {
            self.io_sense(tag, IoOp::Flush).await?;
        }
        Ok(())
    }

    async fn read_async(&self, req: &OwnedRequest, io: BlockIo) -> Result<Bytes, Sense> {
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

    async fn write_async(&self, req: &OwnedRequest, io: BlockIo) -> Result<ScsiResponse, Sense> {
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

    async fn sync_cache_async(
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

    async fn unmap_async(
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

    async fn write_same_async(
        &self,
        req: &OwnedRequest,
        io: BlockIo,
        unmap: bool,
        anchor: bool,
        ndob: bool,
    ) -> Result<ScsiResponse, Sense> {
        let (block, off, len) = self.write_same_plan(&req.borrowed(), io, anchor, ndob)?;
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

    async fn compare_and_write_async(
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

    /// Task management effects (SAM-5 §6.3): RESERVE(6) reservations and PREVENT holds are
    /// cleared, and every known I_T nexus — the requester included, as SAM-5 §6.3.3 says
    /// and libiscsi's MultipathIO.Reset checks — gets a unit attention. `from` is also
    /// recorded as known so it sees the UA even if it never sent a command. Persistent
    /// reservations survive resets (SPC-4 §5.13.1).
    pub fn reset(&self, kind: ResetKind, from: &NexusId) {
        let ua = match kind {
            ResetKind::LogicalUnit => (0x29, 0x03),
            ResetKind::TargetWarm => (0x29, 0x02),
            ResetKind::TargetCold => (0x29, 0x01),
        };
        self.end_reserve6(None);
        let mut st = self.state();
        st.prevent.clear();
        st.known.insert(from.clone());
        LogicalUnit::ua_others(&mut st, None, ua.0, ua.1);
    }

    /// Grows the LU to `bytes` (a whole number of blocks) online: the backend grows first,
    /// then the capacity READ CAPACITY reports, then every nexus that knows this LU gets
    /// CAPACITY DATA HAS CHANGED (2Ah/09h, SBC-4 §4.10) so hosts re-read it. Shrinking is
    /// refused: blocks a host may still use would vanish under it.
    pub fn grow(&self, bytes: u64) -> std::io::Result<()> {
        let bs = u64::from(self.cfg.block_size);
        let invalid = |m: String| std::io::Error::new(std::io::ErrorKind::InvalidInput, m);
        if bytes % bs != 0 {
            return Err(invalid(format!(
                "{bytes} bytes is not a whole number of {bs}-byte blocks"
            )));
        }
        let now = self.num_blocks() * bs;
        if bytes < now {
            return Err(invalid(format!(
                "shrinking from {now} to {bytes} bytes is refused (hosts may use those blocks)"
            )));
        }
        if bytes == now {
            return Ok(());
        }
        self.backend.grow(bytes)?;
        self.num_blocks.store(bytes / bs, Ordering::Release);
        self.unit_attention_all(0x2A, 0x09);
        Ok(())
    }

    /// Queues a unit attention (`asc`/`ascq`) for every I_T nexus that knows this LU, e.g.
    /// REPORTED LUNS DATA HAS CHANGED (3Fh/0Eh, SPC-4 §7.5.5) when the target's LUN
    /// inventory changes.
    pub fn unit_attention_all(&self, asc: u8, ascq: u8) {
        let mut st = self.state();
        LogicalUnit::ua_others(&mut st, None, asc, ascq);
    }

    /// The I_T nexus is gone (session closed or dropped): its RESERVE(6) reservation and
    /// PREVENT hold end, pending unit attentions are dropped (SPC-2 §5.5.1). Persistent
    /// registrations stay.
    pub fn nexus_lost(&self, nexus: &NexusId) {
        self.end_reserve6(Some(&self.it(nexus)));
        let mut st = self.state();
        st.prevent.remove(nexus);
        st.ua.remove(nexus);
        st.known.remove(nexus);
    }

    /// Queues a unit attention for every known nexus except `except`.
    pub(crate) fn ua_others(st: &mut State, except: Option<&NexusId>, asc: u8, ascq: u8) {
        let others: Vec<NexusId> = st
            .known
            .iter()
            .filter(|n| Some(*n) != except)
            .cloned()
            .collect();
        for n in others {
            let q = st.ua.entry(n).or_default();
            if !q.contains(&(asc, ascq)) {
                q.push_back((asc, ascq));
            }
        }
    }

    fn access_allowed(&self, nexus: &NexusId, cmd: &Command) -> Result<bool, Sense> {
        if pr::allowed_under_reserve6(cmd) {
            // No reservation of any kind blocks these (SPC-2 table 13, SPC-4 table 68): they
            // need no look at a shared store, so INQUIRY answers while a cluster is away.
            return Ok(true);
        }
        let p = self.pr.current().map_err(|e| {
            tracing::warn!(serial = %self.cfg.serial, "reservation state: {e}");
            Sense::from_store_error(&e)
        })?;
        Ok(p.is_empty() || p.allows(&self.it(nexus), cmd))
    }

    fn dispatch(&self, req: &ScsiRequest<'_>, cmd: Command) -> Result<ScsiResponse, Sense> {
        let ok = |b: Bytes| Ok(ScsiResponse::good(b));
        match cmd {
            Command::TestUnitReady => ok(Bytes::new()),
            Command::RequestSense { desc, alloc } => {
                let pending = self
                    .state()
                    .ua
                    .get_mut(req.nexus)
                    .and_then(|q| q.pop_front());
                let s = match pending {
                    Some((asc, ascq)) => Sense::unit_attention(asc, ascq),
                    None => Sense::no_sense(),
                };
                let b = if desc {
                    s.to_descriptor()
                } else {
                    s.to_fixed()
                };
                ok(truncate(b, alloc))
            }
            Command::Inquiry { evpd, page, alloc } => {
                let v = if evpd {
                    inquiry::vpd(self, page)?
                } else {
                    inquiry::standard(&self.cfg)
                };
                ok(truncate(v, alloc))
            }
            Command::ModeSense {
                ten,
                dbd,
                llbaa,
                pc,
                page,
                subpage,
                alloc,
            } => ok(truncate(
                mode::sense(self, ten, dbd, llbaa, pc, page, subpage)?,
                alloc,
            )),
            Command::ModeSelect {
                ten,
                pf,
                sp,
                param_len,
            } => {
                let data = data_out(req, u64::from(param_len))?;
                mode::select(self, req.nexus, ten, pf, sp, data)?;
                ok(Bytes::new())
            }
            Command::ReadCapacity10 => {
                let last = (self.num_blocks() - 1).min(u64::from(u32::MAX)) as u32;
                let mut v = last.to_be_bytes().to_vec();
                v.extend_from_slice(&self.cfg.block_size.to_be_bytes());
                ok(Bytes::from(v))
            }
            Command::ReadCapacity16 { alloc } => {
                let mut v = vec![0u8; 32];
                v[0..8].copy_from_slice(&(self.num_blocks() - 1).to_be_bytes());
                v[8..12].copy_from_slice(&self.cfg.block_size.to_be_bytes());
                // LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT stays 0: with 3 (512 on 4 KiB)
                // libiscsi's GetLbaStatus.UnmapSingle expects the first descriptor to start
                // at a rounded-up LBA, which SBC-4 §5.7.2 forbids (it must be the
                // requested STARTING LOGICAL BLOCK ADDRESS).
                if self.thin {
                    v[14] = 0x80 | 0x40; // LBPME, LBPRZ (SBC-4 §5.16.2)
                }
                ok(truncate(v, alloc))
            }
            Command::Read(io) => self.read(io, req.tailroom).map(ScsiResponse::good),
            Command::Write(io) => {
                self.check_writable()?;
                self.check_range(io.lba, u64::from(io.blocks))?;
                let data = data_out(req, self.bytes(io.blocks))?;
                self.write(io, data)?;
                ok(Bytes::new())
            }
            Command::WriteAndVerify { io, .. } => {
                self.check_writable()?;
                self.check_range(io.lba, u64::from(io.blocks))?;
                let data = data_out(req, self.bytes(io.blocks))?;
                // Verification after our own write would compare the same bytes; the
                // write path already reports medium errors.
                self.write(io, data)?;
                ok(Bytes::new())
            }
            Command::Verify { io, bytchk } => {
                self.verify(req, io, bytchk)?;
                ok(Bytes::new())
            }
            Command::WriteSame {
                io,
                unmap,
                anchor,
                ndob,
            } => {
                self.write_same(req, io, unmap, anchor, ndob)?;
                ok(Bytes::new())
            }
            Command::Unmap { anchor, param_len } => {
                self.unmap(req, anchor, param_len)?;
                ok(Bytes::new())
            }
            Command::CompareAndWrite(io) => {
                self.compare_and_write(req, io)?;
                ok(Bytes::new())
            }
            Command::OrWrite(io) => {
                self.or_write(req, io)?;
                ok(Bytes::new())
            }
            Command::SynchronizeCache { lba, blocks, immed } => {
                self.check_range(lba, u64::from(blocks))?;
                if immed {
                    let b = Arc::clone(&self.backend);
                    // IMMED (SBC-4 §5.26): GOOD once the command is validated; the flush
                    // runs on. A failure there has nobody to report to but the log.
                    std::thread::spawn(move || {
                        if let Err(e) = b.flush() {
                            tracing::warn!(error = %e, "background SYNCHRONIZE CACHE failed");
                        }
                    });
                } else {
                    self.backend
                        .flush()
                        .map_err(|e| Sense::from_write_error(&e))?;
                }
                ok(Bytes::new())
            }
            Command::PreFetch { lba, blocks, .. } => {
                self.check_range(lba, u64::from(blocks))?;
                // Nothing to stage: GOOD means "not all of it was cached" (SBC-4 §5.10).
                ok(Bytes::new())
            }
            Command::GetLbaStatus { lba, alloc } => ok(truncate(self.lba_status(lba)?, alloc)),
            Command::StartStopUnit {
                power_condition,
                start,
                no_flush,
                ..
            } => {
                // Not removable, no power states: stopping only flushes the cache.
                if power_condition == 0 && !start && !no_flush {
                    self.backend
                        .flush()
                        .map_err(|e| Sense::from_write_error(&e))?;
                }
                ok(Bytes::new())
            }
            Command::PreventAllow { prevent } => {
                let mut st = self.state();
                match prevent {
                    0 => {
                        st.prevent.remove(req.nexus);
                    }
                    1 => {
                        st.prevent.insert(req.nexus.clone());
                    }
                    _ => return Err(Sense::invalid_field_in_cdb_at(4, Some(1))),
                }
                ok(Bytes::new())
            }
            Command::ReadDefectData {
                twelve,
                plist,
                glist,
                format,
                alloc,
            } => {
                // No defect lists: answer with empty lists in the requested format.
                let flags = (u8::from(plist) << 4) | (u8::from(glist) << 3) | format;
                let v = if twelve {
                    vec![0, flags, 0, 0, 0, 0, 0, 0]
                } else {
                    vec![0, flags, 0, 0]
                };
                ok(truncate(v, alloc))
            }
            Command::ReportLuns { .. } => Ok(lun::report_luns(&[req.lun], req.cdb)),
            Command::ReportSupportedOpcodes {
                rctd,
                options,
                opcode,
                sa,
                alloc,
            } => ok(truncate(
                opcodes::report(self, rctd, options, opcode, sa)?,
                alloc,
            )),
            Command::Reserve6 | Command::Release6 | Command::PersistentReserveOut(_)
                if self.refuse_reservations =>
            {
                // A reservation held here would not bind the other targets serving the same
                // store: refuse rather than promise an exclusion we cannot keep (docs/rbd.md).
                Err(Sense::invalid_opcode())
            }
            Command::Reserve6 => {
                let me = self.it(req.nexus);
                self.pr_update(|p, _| {
                    if p.reserve6(&me) {
                        Ok(ScsiResponse::good(Bytes::new()))
                    } else {
                        Ok(ScsiResponse::status(ScsiStatus::RESERVATION_CONFLICT))
                    }
                })
            }
            Command::Release6 => {
                let me = self.it(req.nexus);
                self.pr_update(|p, _| {
                    p.release6(Some(&me));
                    Ok(ScsiResponse::good(Bytes::new()))
                })
            }
            Command::PersistentReserveIn { sa, alloc } => {
                let (p, _) = self.pr.load().map_err(|e| Sense::from_store_error(&e))?;
                Ok(ScsiResponse::good(truncate(p.read(sa)?, alloc)))
            }
            Command::PersistentReserveOut(p) => {
                let data = data_out(req, u64::from(p.param_len))?;
                let me = self.it(req.nexus);
                self.pr_update(|st, uas| pr::out(st, uas, &me, p, data))
            }
        }
    }

    fn bytes(&self, blocks: u32) -> u64 {
        u64::from(blocks) * u64::from(self.cfg.block_size)
    }

    fn offset(&self, lba: u64) -> u64 {
        lba * u64::from(self.cfg.block_size)
    }

    /// LBA range check (SBC-4 §4.5): LOGICAL BLOCK ADDRESS OUT OF RANGE.
    pub(crate) fn check_range(&self, lba: u64, blocks: u64) -> Result<(), Sense> {
        match lba.checked_add(blocks) {
            Some(end) if end <= self.num_blocks() && lba < self.num_blocks().max(1) => Ok(()),
            Some(_) if blocks == 0 && lba < self.num_blocks() => Ok(()),
            _ => Err(Sense::lba_out_of_range()),
        }
    }

    fn check_transfer(&self, blocks: u32) -> Result<(), Sense> {
        if blocks > self.limits.max_transfer {
            // SBC-4 §4.5: more than MAXIMUM TRANSFER LENGTH is an invalid CDB field.
            return Err(Sense::invalid_field_in_cdb());
        }
        Ok(())
    }

    fn check_writable(&self) -> Result<(), Sense> {
        if self.cfg.read_only {
            return Err(Sense::write_protected());
        }
        Ok(())
    }

    fn read(&self, io: BlockIo, tailroom: bool) -> Result<Bytes, Sense> {
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        let len = self.bytes(io.blocks) as usize;
        let room = if tailroom { read_tailroom(len) } else { 0 };
        let mut buf = BytesMut::with_capacity(len.saturating_add(room));
        self.backend
            .read_append(&mut buf, len, self.offset(io.lba))
            .map_err(|e| Sense::from_read_error(&e))?;
        Ok(buf.freeze())
    }

    /// Writes validated data; flushes for FUA or when the write cache is off.
    fn write(&self, io: BlockIo, data: &[u8]) -> Result<(), Sense> {
        self.check_transfer(io.blocks)?;
        if io.blocks == 0 {
            return Ok(());
        }
        {
            let _shared = self.io_lock.read().unwrap_or_else(|p| p.into_inner());
            self.backend
                .write_at(data, self.offset(io.lba))
                .map_err(|e| Sense::from_write_error(&e))?;
        }
        self.flush_if_needed(io.fua)
    }

    fn flush_if_needed(&self, fua: bool) -> Result<(), Sense> {
        if fua || !self.write_cache() {
            self.backend
                .flush()
                .map_err(|e| Sense::from_write_error(&e))?;
        }
        Ok(())
    }

    fn verify(&self, req: &ScsiRequest<'_>, io: BlockIo, bytchk: u8) -> Result<(), Sense> {
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        if io.blocks == 0 {
            return Ok(());
        }
        let bs = self.cfg.block_size as usize;
        let expect = match bytchk {
            1 => Some(data_out(req, self.bytes(io.blocks))?),
            3 => Some(data_out(req, bs as u64)?),
            _ => None,
        };
        let mut buf = vec![0u8; self.bytes(io.blocks) as usize];
        self.backend
            .read_at(&mut buf, self.offset(io.lba))
            .map_err(|e| Sense::from_read_error(&e))?;
        let Some(expect) = expect else {
            return Ok(());
        };
        let mismatch = if bytchk == 1 {
            first_difference(&buf, expect).map(|o| o as u64)
        } else {
            buf.chunks(bs)
                .enumerate()
                .find_map(|(i, blk)| first_difference(blk, expect).map(|o| (i * bs + o) as u64))
        };
        match mismatch {
            Some(off) => Err(Sense::miscompare(off)),
            None => Ok(()),
        }
    }

    /// The checks of WRITE SAME (SBC-4 §5.43) and what it writes: (the data block, byte
    /// offset, byte length).
    fn write_same_plan(
        &self,
        req: &ScsiRequest<'_>,
        io: BlockIo,
        anchor: bool,
        ndob: bool,
    ) -> Result<(Vec<u8>, u64, u64), Sense> {
        if anchor {
            return Err(Sense::invalid_field_in_cdb_at(1, Some(4)));
        }
        if req.cdb[1] & 0x06 != 0 {
            // PBDATA / LBDATA (SBC-3 §5.42): not supported.
            return Err(Sense::invalid_field_in_cdb_at(1, Some(2)));
        }
        self.check_writable()?;
        if io.lba >= self.num_blocks() {
            return Err(Sense::lba_out_of_range());
        }
        // NUMBER OF LOGICAL BLOCKS 0: through the last LBA (SBC-4 §5.43, WSNZ=0).
        let blocks = if io.blocks == 0 {
            self.num_blocks() - io.lba
        } else {
            u64::from(io.blocks)
        };
        self.check_range(io.lba, blocks)?;
        if blocks > self.limits.max_write_same {
            return Err(Sense::invalid_field_in_cdb_at(10, None));
        }
        let bs = self.cfg.block_size as usize;
        let block: Vec<u8> = if ndob {
            vec![0u8; bs]
        } else {
            data_out(req, bs as u64)?.to_vec()
        };
        Ok((block, self.offset(io.lba), blocks * bs as u64))
    }

    fn write_same(
        &self,
        req: &ScsiRequest<'_>,
        io: BlockIo,
        unmap: bool,
        anchor: bool,
        ndob: bool,
    ) -> Result<(), Sense> {
        let (block, off, len) = self.write_same_plan(req, io, anchor, ndob)?;
        let bs = block.len();
        let zero = block.iter().all(|&b| b == 0);
        {
            let _shared = self.io_lock.read().unwrap_or_else(|p| p.into_inner());
            // UNMAP set on a thin LU deallocates whatever the data block holds: reads then
            // return zeros (LBPRZ), which libiscsi's unmap tests check (SBC-3 §5.43).
            if unmap && self.thin {
                self.backend
                    .unmap(off, len)
                    .map_err(|e| Sense::from_write_error(&e))?;
            } else if zero {
                self.backend
                    .write_zeroes(off, len)
                    .map_err(|e| Sense::from_write_error(&e))?;
            } else {
                let per = ((1usize << 20) / bs).max(1);
                let pattern: Vec<u8> = block.iter().copied().cycle().take(per * bs).collect();
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(pattern.len() as u64) as usize;
                    self.backend
                        .write_at(&pattern[..n], off + done)
                        .map_err(|e| Sense::from_write_error(&e))?;
                    done += n as u64;
                }
            }
        }
        self.flush_if_needed(false)
    }

    /// The checks of UNMAP (SBC-4 §5.28) and its descriptors; `None`: nothing to do.
    fn unmap_list(
        &self,
        req: &ScsiRequest<'_>,
        anchor: bool,
        param_len: u32,
    ) -> Result<Option<Vec<(u64, u32)>>, Sense> {
        if !self.thin {
            return Err(Sense::invalid_opcode());
        }
        if anchor {
            return Err(Sense::invalid_field_in_cdb_at(1, Some(0)));
        }
        self.check_writable()?;
        if param_len == 0 {
            return Ok(None);
        }
        if param_len < 8 {
            return Err(Sense::parameter_list_length_error());
        }
        let data = data_out(req, u64::from(param_len))?;
        let list = parse_unmap_list(data)?;
        if list.len() as u64 > u64::from(self.limits.max_unmap_descriptors) {
            return Err(Sense::invalid_field_in_parameter_list_at(2, None));
        }
        let mut total = 0u64;
        for (i, &(lba, n)) in list.iter().enumerate() {
            if lba
                .checked_add(u64::from(n))
                .is_none_or(|e| e > self.num_blocks())
            {
                return Err(Sense::lba_out_of_range());
            }
            if n > self.limits.max_unmap_lba {
                return Err(Sense::invalid_field_in_parameter_list_at(
                    (8 + 16 * i + 8) as u16,
                    None,
                ));
            }
            total += u64::from(n);
        }
        if total > u64::from(self.limits.max_unmap_lba) {
            return Err(Sense::invalid_field_in_parameter_list());
        }
        Ok(Some(list))
    }

    fn unmap(&self, req: &ScsiRequest<'_>, anchor: bool, param_len: u32) -> Result<(), Sense> {
        let Some(list) = self.unmap_list(req, anchor, param_len)? else {
            return Ok(());
        };
        let _shared = self.io_lock.read().unwrap_or_else(|p| p.into_inner());
        for (lba, n) in list {
            if n > 0 {
                self.backend
                    .unmap(self.offset(lba), self.bytes(n))
                    .map_err(|e| Sense::from_write_error(&e))?;
            }
        }
        Ok(())
    }

    fn compare_and_write(&self, req: &ScsiRequest<'_>, io: BlockIo) -> Result<(), Sense> {
        if self.limits.max_compare_and_write == 0 {
            return Err(Sense::invalid_opcode());
        }
        self.check_writable()?;
        if io.blocks > u32::from(self.limits.max_compare_and_write) {
            return Err(Sense::invalid_field_in_cdb_at(13, None));
        }
        self.check_range(io.lba, u64::from(io.blocks))?;
        let n = self.bytes(io.blocks) as usize;
        let data = data_out(req, 2 * n as u64)?;
        let (verify, write) = data.split_at(n);
        {
            let _excl = self.io_lock.write().unwrap_or_else(|p| p.into_inner());
            let mut cur = vec![0u8; n];
            self.backend
                .read_at(&mut cur, self.offset(io.lba))
                .map_err(|e| Sense::from_read_error(&e))?;
            if let Some(off) = first_difference(&cur, verify) {
                return Err(Sense::miscompare(off as u64));
            }
            self.backend
                .write_at(write, self.offset(io.lba))
                .map_err(|e| Sense::from_write_error(&e))?;
        }
        self.flush_if_needed(io.fua)
    }

    /// ORWRITE(16): read-OR-write under the exclusive I/O lock, so no other write lands
    /// between the read and the write (SBC-4 §5.9).
    fn or_write(&self, req: &ScsiRequest<'_>, io: BlockIo) -> Result<(), Sense> {
        self.check_writable()?;
        self.check_range(io.lba, u64::from(io.blocks))?;
        self.check_transfer(io.blocks)?;
        if io.blocks == 0 {
            return Ok(());
        }
        let data = data_out(req, self.bytes(io.blocks))?;
        {
            let _excl = self.io_lock.write().unwrap_or_else(|p| p.into_inner());
            let mut cur = vec![0u8; data.len()];
            self.backend
                .read_at(&mut cur, self.offset(io.lba))
                .map_err(|e| Sense::from_read_error(&e))?;
            for (c, d) in cur.iter_mut().zip(data) {
                *c |= d;
            }
            self.backend
                .write_at(&cur, self.offset(io.lba))
                .map_err(|e| Sense::from_write_error(&e))?;
        }
        self.flush_if_needed(io.fua)
    }

    fn lba_status(&self, lba: u64) -> Result<Vec<u8>, Sense> {
        if lba >= self.num_blocks() {
            return Err(Sense::lba_out_of_range());
        }
        let bs = u64::from(self.cfg.block_size);
        let (mapped, len) = if self.thin {
            let e = self
                .backend
                .extent(self.offset(lba))
                .map_err(|e| Sense::from_read_error(&e))?;
            (e.mapped, e.len)
        } else {
            (true, (self.num_blocks() - lba) * bs)
        };
        let blocks = (len / bs).clamp(1, u64::from(u32::MAX)) as u32;
        let mut v = vec![0u8; 24];
        v[0..4].copy_from_slice(&20u32.to_be_bytes()); // PARAMETER DATA LENGTH = n - 3
        v[8..16].copy_from_slice(&lba.to_be_bytes());
        v[16..20].copy_from_slice(&blocks.to_be_bytes());
        v[20] = if mapped { 0 } else { 1 }; // PROVISIONING STATUS (SBC-4 table 48)
        Ok(v)
    }
}

fn backend_unmap_granularity(kind: &str) -> u64 {
    match kind {
        "mem" => 1 << 20,
        _ => 4096,
    }
}

/// Offset of the first byte where `a` and `b` differ.
fn first_difference(a: &[u8], b: &[u8]) -> Option<usize> {
    a.iter().zip(b).position(|(x, y)| x != y)
}

/// The first `need` Data-Out bytes, or CHECK CONDITION when the initiator sent fewer.
fn data_out<'a>(req: &ScsiRequest<'a>, need: u64) -> Result<&'a [u8], Sense> {
    let need = usize::try_from(need).map_err(|_| Sense::invalid_field_in_cdb())?;
    req.data_out.get(..need).ok_or_else(|| {
        // The iSCSI layer normally catches this first (RFC 7143 §11.4.5.2 residuals);
        // here the data are simply missing, so nothing is written.
        Sense::parameter_list_length_error()
    })
}

/// UNMAP parameter list (SBC-4 §5.28.2): (lba, blocks) per descriptor.
fn parse_unmap_list(data: &[u8]) -> Result<Vec<(u64, u32)>, Sense> {
    let unmap_len = u16::from_be_bytes([data[0], data[1]]) as usize;
    let bd_len = u16::from_be_bytes([data[2], data[3]]) as usize;
    if unmap_len + 2 < 8 && unmap_len != 0 {
        return Err(Sense::parameter_list_length_error());
    }
    // Descriptors beyond the parameter list are missing; a trailing partial descriptor is
    // ignored (SBC-4 §5.28.2).
    let avail = data.len() - 8;
    let usable = bd_len.min(avail) / 16;
    let mut out = Vec::with_capacity(usable);
    for i in 0..usable {
        let d = &data[8 + 16 * i..8 + 16 * (i + 1)];
        let lba = u64::from_be_bytes([d[0], d[1], d[2], d[3], d[4], d[5], d[6], d[7]]);
        let n = u32::from_be_bytes([d[8], d[9], d[10], d[11]]);
        out.push((lba, n));
    }
    Ok(out)
}

/// The view the SPC handlers (`inquiry`, `mode`, `opcodes`) have of the LU that calls them.
impl Unit for LogicalUnit {
    fn config(&self) -> &LuConfig {
        LogicalUnit::config(self)
    }
    fn limits(&self) -> Limits {
        LogicalUnit::limits(self)
    }
    fn thin(&self) -> bool {
        LogicalUnit::thin(self)
    }
    fn num_blocks(&self) -> u64 {
        LogicalUnit::num_blocks(self)
    }
    fn block_size(&self) -> u32 {
        LogicalUnit::block_size(self)
    }
    fn write_cache(&self) -> bool {
        LogicalUnit::write_cache(self)
    }
    fn refuses_reservations(&self) -> bool {
        LogicalUnit::refuses_reservations(self)
    }
    fn change_write_cache(&self, wce: bool, by: &NexusId) -> Result<(), Sense> {
        if !wce {
            // Turning the cache off: what it holds must reach the medium now.
            self.backend
                .flush()
                .map_err(|e| Sense::from_write_error(&e))?;
        }
        self.set_write_cache(wce);
        let mut st = self.state();
        // MODE PARAMETERS CHANGED for everyone else (SPC-4 §6.9).
        Self::ua_others(&mut st, Some(by), 0x2A, 0x01);
        Ok(())
    }
}
