//! One logical unit: SBC-4 block commands over a [`Backend`], SPC-4 device management,
//! unit attentions (SAM-5 §5.14) and reservations.
//!
//! `execute` is blocking and thread-safe: the target calls it from a blocking pool, several
//! commands of one LU at once. Ordinary writes share `io_lock`; COMPARE AND WRITE takes it
//! exclusively, so its compare and write are atomic against every other write (SBC-4 §5.3).
//!
//! A CDB is parsed once ([`LogicalUnit::command_info`], or inside `execute`); the checks
//! before a command runs (unit attentions, reservations) and the handlers take the decoded
//! [`Command`]. This file holds the LU's state, its front door (`execute`, `precheck`) and
//! resets; the rest is split by concern:
//! - `dispatch`: one decoded command to its SPC-4/SBC-4 handler.
//! - `path`: the data path (READ, WRITE, WRITE AND VERIFY, SYNCHRONIZE CACHE, UNMAP, WRITE
//!   SAME, COMPARE AND WRITE), written once over a port to the backend: its blocking methods
//!   (`execute`, one poll, no allocation) or its submit/complete interface (`execute_async`).
//! - `media`: the range, transfer and parameter checks, and the commands only the blocking
//!   form runs (VERIFY, ORWRITE, GET LBA STATUS).
//! - `submit`: [`LogicalUnit::execute_async`] and the backend submissions it awaits.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, RwLock};

use bytes::Bytes;
use ipsan_block::Whole;

use crate::aio::Engine;
use crate::backend::Backend;
use crate::cdb::{self, op, Command, CommandInfo};
use crate::config::Unit;
pub use crate::config::{Limits, LuConfig};
use crate::pr;
use crate::pr::BackendPr as _;
use crate::response::truncate;
pub use crate::response::{NexusId, ScsiResponse};
use crate::sense::{ScsiStatus, Sense};

mod dispatch;
mod media;
mod path;
mod submit;

use media::data_out;
use submit::async_family;

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
    /// Reservation notices owed to registrants of relative port 0, which no SCSI port has:
    /// a front end that is not SCSI (NVMe hosts) takes them ([`LogicalUnit::take_foreign_notices`]).
    pub foreign: VecDeque<pr::PendingUa>,
}

/// At most this many notices wait for a front end that is not SCSI; older ones are dropped
/// (an LU whose NVMe side is not running still keeps NVMe hosts' registrations).
const FOREIGN_NOTICES_MAX: usize = 1024;

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
    /// CDBs this LU parsed (debug builds): lets a transport's tests prove it hands over the
    /// typed command it decoded rather than the bytes to parse again.
    #[cfg(debug_assertions)]
    parses: AtomicU64,
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
            #[cfg(debug_assertions)]
            parses: AtomicU64::new(0),
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
        self.counted_parse();
        let info = cdb::decode(cdb, self.cfg.block_size)?;
        if self.cfg.read_only && info.command.writes_medium() {
            // Known before any data moves: no point soliciting Data-Out (SBC-4 §4.11).
            return Err(Sense::write_protected());
        }
        Ok(info)
    }

    /// Executes one command to completion (blocking). Parses the CDB once; a caller that
    /// holds the typed command already calls [`LogicalUnit::execute_decoded`].
    pub fn execute(&self, req: &ScsiRequest<'_>) -> ScsiResponse {
        let opcode = req.cdb.first().copied().unwrap_or(0xFF);
        self.counted_parse();
        self.execute_command(req, opcode, cdb::parse(req.cdb), None)
    }

    /// [`LogicalUnit::execute`] of a command decoded before ([`LogicalUnit::command_info`]
    /// on `req.cdb`): nothing parses the CDB again.
    pub fn execute_decoded(&self, req: &ScsiRequest<'_>, info: &CommandInfo) -> ScsiResponse {
        self.execute_command(req, info.opcode, Ok(info.command), None)
    }

    /// [`LogicalUnit::execute_decoded`] of a command whose Data-Out, `req.data_out`, is the
    /// whole buffer `whole` (the same bytes; anything else runs as `execute_decoded`): a
    /// WRITE of all of it hands the buffer to the store, which may keep it rather than copy
    /// it ([`ipsan_block::Backend::write_whole`]; issue 27).
    pub fn execute_decoded_whole(
        &self,
        req: &ScsiRequest<'_>,
        info: &CommandInfo,
        whole: &Whole,
    ) -> ScsiResponse {
        let same = std::ptr::eq(whole.as_bytes(), req.data_out);
        self.execute_command(req, info.opcode, Ok(info.command), same.then_some(whole))
    }

    fn execute_command(
        &self,
        req: &ScsiRequest<'_>,
        opcode: u8,
        cmd: Result<Command, Sense>,
        whole: Option<&Whole>,
    ) -> ScsiResponse {
        if let Some(r) = self.precheck_parsed(req.nexus, opcode, cmd.as_ref()) {
            return r;
        }
        let r = match cmd {
            Ok(cmd) => self.dispatch(req, cmd, whole),
            Err(s) => Err(s),
        };
        r.unwrap_or_else(ScsiResponse::check)
    }

    /// The checks that come before a command may touch the medium: a pending unit attention
    /// (reported and consumed, SAM-5 §5.14), CDB validity and reservation conflicts
    /// (SPC-4 §5.13). `None` means the command may proceed. [`LogicalUnit::execute`] runs
    /// this itself; a transport that answers a command without executing it (e.g. an iSCSI
    /// write whose EDTL covers no whole block) must call it first, or it would report GOOD
    /// to an initiator that holds no access.
    pub fn precheck(&self, nexus: &NexusId, cdb: &[u8]) -> Option<ScsiResponse> {
        let opcode = cdb.first().copied().unwrap_or(0xFF);
        self.counted_parse();
        self.precheck_parsed(nexus, opcode, cdb::parse(cdb).as_ref())
    }

    /// [`LogicalUnit::precheck`] of a command decoded before ([`LogicalUnit::command_info`]):
    /// nothing parses the CDB again.
    pub fn precheck_decoded(&self, nexus: &NexusId, info: &CommandInfo) -> Option<ScsiResponse> {
        self.precheck_parsed(nexus, info.opcode, Ok(&info.command))
    }

    /// How many CDBs this LU parsed itself ([`LogicalUnit::command_info`], and
    /// [`LogicalUnit::execute`], [`LogicalUnit::execute_async`] and
    /// [`LogicalUnit::precheck`] of raw bytes); debug builds only.
    #[cfg(debug_assertions)]
    pub fn cdb_parses(&self) -> u64 {
        self.parses.load(Ordering::Relaxed)
    }

    /// Counts one parse of a CDB (debug builds; nothing in release builds).
    #[inline]
    pub(crate) fn counted_parse(&self) {
        #[cfg(debug_assertions)]
        self.parses.fetch_add(1, Ordering::Relaxed);
    }

    /// [`LogicalUnit::precheck`] of a command parsed before (`Err`: the CDB's own sense).
    fn precheck_parsed(
        &self,
        nexus: &NexusId,
        opcode: u8,
        cmd: Result<&Command, &Sense>,
    ) -> Option<ScsiResponse> {
        self.follow_capacity();
        // Unit attention (SAM-5 §5.14): reported once, before anything else, except to
        // INQUIRY, REPORT LUNS and REQUEST SENSE.
        {
            let mut st = self.state();
            // Looked up first: the key is cloned (allocated) only for a nexus seen the first
            // time, not on every command (issue 27).
            if !st.known.contains(nexus) {
                st.known.insert(nexus.clone());
                if self.cfg.power_on_ua {
                    st.ua
                        .entry(nexus.clone())
                        .or_default()
                        .push_back((0x29, 0x01));
                }
            }
            if !matches!(opcode, op::INQUIRY | op::REPORT_LUNS | op::REQUEST_SENSE) {
                if let Some(q) = st.ua.get_mut(nexus) {
                    if let Some((asc, ascq)) = q.pop_front() {
                        return Some(ScsiResponse::check(Sense::unit_attention(asc, ascq)));
                    }
                }
            }
        }
        let cmd = match cmd {
            Ok(c) => c,
            Err(s) => return Some(ScsiResponse::check(s.clone())),
        };
        match self.access_allowed(nexus, cmd) {
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

    /// The reservation state as every command's access check sees it, for a front end that
    /// is not SCSI (an NVMe namespace on this LU, docs/nvme.md): one state per LU, whichever
    /// protocol changes it.
    ///
    /// # Errors
    /// The state cannot be read (a shared store unreachable).
    pub fn reservations(&self) -> std::io::Result<Arc<pr::PrState>> {
        self.pr.current()
    }

    /// The reservation state as stored now (not a cached copy), for a report.
    ///
    /// # Errors
    /// As [`LogicalUnit::reservations`].
    pub fn reservations_stored(&self) -> std::io::Result<Arc<pr::PrState>> {
        self.pr.load().map(|(s, _)| s)
    }

    /// Applies `f` to the reservation state and stores the result, as PERSISTENT RESERVE OUT
    /// does (compare-and-swap, retried; stored only on GOOD), for a front end that is not
    /// SCSI. The caller checks [`LogicalUnit::refuses_reservations`] first.
    ///
    /// # Errors
    /// The sense `f` answered, or the store's failure as sense.
    pub fn update_reservations(
        &self,
        f: impl Fn(&mut pr::PrState, &mut Vec<pr::PendingUa>) -> Result<ScsiResponse, Sense>,
    ) -> Result<ScsiResponse, Sense> {
        self.pr_update(f)
    }

    /// The reservation notices owed to registrants of relative port 0 (a front end that is
    /// not SCSI: NVMe hosts, docs/nvme.md "Reservations"), oldest first, as the unit attentions
    /// a SCSI nexus would get: RESERVATIONS PREEMPTED (2Ah/03h), RESERVATIONS RELEASED
    /// (2Ah/04h), REGISTRATIONS PREEMPTED (2Ah/05h). Whichever protocol's command changed the
    /// state queues them; taking them empties the queue.
    pub fn take_foreign_notices(&self) -> Vec<pr::PendingUa> {
        self.state().foreign.drain(..).collect()
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
                    } else if n.port == 0 {
                        if st.foreign.len() >= FOREIGN_NOTICES_MAX {
                            st.foreign.pop_front();
                        }
                        st.foreign.push_back((n, asc, ascq));
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
            && cdb
                .first()
                .and_then(|&o| cdb::entry(o))
                .is_some_and(|e| async_family(e.family))
    }

    /// [`LogicalUnit::runs_async`] of a decoded command.
    pub fn runs_async_decoded(&self, info: &CommandInfo) -> bool {
        self.engine() == Engine::Async && async_family(info.family())
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
}

fn backend_unmap_granularity(kind: &str) -> u64 {
    match kind {
        "mem" => 1 << 20,
        _ => 4096,
    }
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
