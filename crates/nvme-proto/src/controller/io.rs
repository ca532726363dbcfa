//! The NVM command set's I/O commands (NVM Command Set 1.0 §3) turned into block requests,
//! and the block results turned back into completions.

use std::sync::atomic::Ordering;

use bytes::Bytes;
use nvme_wire::entry::FUSE_MASK;
use nvme_wire::{Sgl, Status};

use super::resv::{self, Reservation};
use super::{done, done_data, Namespace, Queue, Submitted};
use crate::command::{Command, Completion};
use crate::idhash::IdMap;

/// I/O opcodes (NVM Command Set 1.0 §3, Figure "Opcodes for NVM Commands").
pub(crate) const OP_FLUSH: u8 = 0x00;
pub(crate) const OP_WRITE: u8 = 0x01;
pub(crate) const OP_READ: u8 = 0x02;
pub(crate) const OP_COMPARE: u8 = 0x05;
pub(crate) const OP_WRITE_ZEROES: u8 = 0x08;
pub(crate) const OP_DSM: u8 = 0x09;
/// Reservation Register / Report / Acquire / Release (NVMe Base 2.0 §7.2-§7.5).
pub(crate) const OP_RESV_REGISTER: u8 = 0x0d;
pub(crate) const OP_RESV_REPORT: u8 = 0x0e;
pub(crate) const OP_RESV_ACQUIRE: u8 = 0x11;
pub(crate) const OP_RESV_RELEASE: u8 = 0x15;
pub(crate) const OP_RESV: [u8; 4] = [
    OP_RESV_REGISTER,
    OP_RESV_REPORT,
    OP_RESV_ACQUIRE,
    OP_RESV_RELEASE,
];
/// The largest Reservation Report answered (the status of 1023 registrants).
const REPORT_MAX: u64 = 64 * 1024;

/// Namespace is Write Protected (NVMe Base 2.0 §4.6.1.2.1, 20h).
const NS_WRITE_PROTECTED: Status = Status { sct: 0, sc: 0x20 };
/// Invalid Namespace or Format (0Bh).
const INVALID_NS: Status = Status::INVALID_NAMESPACE;

/// A block operation on one namespace, in bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BlockOp {
    /// Read `len` bytes at `offset`; the result carries them.
    Read { offset: u64, len: u64 },
    /// Write `data` at `offset`; with `fua` it must be stable before the result (Force Unit
    /// Access, NVM Command Set 1.0 §3.2.6).
    Write { offset: u64, data: Bytes, fua: bool },
    /// Make every completed write stable.
    Flush,
    /// Deallocate `len` bytes at `offset` (Dataset Management AD; Write Zeroes with DEAC when
    /// deallocated blocks read as zeroes).
    Discard { offset: u64, len: u64 },
    /// Zero `len` bytes at `offset`.
    WriteZeroes { offset: u64, len: u64 },
    /// A reservation command for the namespace's reservation state, from the host of the
    /// queue (its Host Identifier and NQN, [`super::Queue::hostid`]). A
    /// [`Reservation::Report`] answers with [`super::ReservationStatus::encode`]'s bytes;
    /// the others with nothing. Not a block operation, but the state belongs to the store
    /// (one per LU, shared with SCSI persistent reservations), so it travels the same way.
    Reservation(Reservation),
}

/// A block request the driver submits to the namespace's store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockRequest {
    /// Hand it back with the result to [`Queue::block_done`]; unique within the queue.
    pub tag: u64,
    pub nsid: u32,
    pub op: BlockOp,
}

/// Why a block request failed, as the completion reports it (NVMe Base 2.0 §4.6.1.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockError {
    /// The medium failed (EIO): Unrecovered Read Error for a read or compare, Write Fault
    /// for the rest.
    Media,
    /// No space left (ENOSPC, EDQUOT; a thin store is full): Capacity Exceeded.
    NoSpace,
    /// Beyond the store's end: LBA Out of Range.
    OutOfRange,
    /// The store refuses writes (EROFS, EPERM): Namespace is Write Protected.
    ReadOnly,
    /// Anything else: Internal Error.
    Internal,
    /// The namespace's reservation keeps this host from the request, or a reservation
    /// command's key does not match: Reservation Conflict (NVMe Base 2.0 §8.19.6).
    ReservationConflict,
    /// The reservation state refuses a reservation command's field (a Release of another
    /// type, a Preempt of key 0 without an all-registrants reservation): Invalid Field in
    /// Command.
    InvalidField,
}

impl BlockError {
    /// The kind of a store's `io::Error`.
    #[must_use]
    pub fn from_io(e: &std::io::Error) -> Self {
        use std::io::ErrorKind as K;
        match (e.raw_os_error(), e.kind()) {
            (Some(5), _) => Self::Media,                                // EIO
            (Some(28 | 122), _) | (_, K::StorageFull) => Self::NoSpace, // ENOSPC, EDQUOT
            (Some(30 | 1), _) | (_, K::ReadOnlyFilesystem | K::PermissionDenied) => Self::ReadOnly,
            (_, K::UnexpectedEof | K::InvalidInput) => Self::OutOfRange,
            _ => Self::Internal,
        }
    }

    fn status(self, reading: bool) -> Status {
        match self {
            Self::Media if reading => Status::UNRECOVERED_READ_ERROR,
            Self::Media => Status::WRITE_FAULT,
            Self::NoSpace => Status::CAPACITY_EXCEEDED,
            Self::OutOfRange => Status::LBA_OUT_OF_RANGE,
            Self::ReadOnly => NS_WRITE_PROTECTED,
            Self::Internal => Status::INTERNAL_ERROR,
            Self::ReservationConflict => Status::RESERVATION_CONFLICT,
            Self::InvalidField => Status::INVALID_FIELD,
        }
    }
}

/// What a command waits for.
#[derive(Debug)]
enum Want {
    /// Success without data.
    Nothing,
    /// The read data, `len` bytes.
    Data(u64),
    /// The read data compared with these bytes (Compare).
    Compare(Bytes),
    /// Data of any length, cut or padded with zeroes to `len` bytes (a Reservation Report).
    Upto(u64),
}

#[derive(Debug)]
struct Group {
    cid: u16,
    left: u32,
    reading: bool,
    status: Status,
    want: Want,
    data: Bytes,
}

/// The commands of one queue waiting for block results.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    next_tag: u64,
    /// Tag → the tag of its command's first request (the group's key).
    tags: IdMap<u64, u64>,
    groups: IdMap<u64, Group>,
}

impl Pending {
    pub(crate) fn outstanding(&self) -> usize {
        self.tags.len()
    }

    fn issue(
        &mut self,
        cid: u16,
        reading: bool,
        want: Want,
        reqs: Vec<(u32, BlockOp)>,
    ) -> Submitted {
        let first = self.next_tag;
        let mut out = Vec::with_capacity(reqs.len());
        for (nsid, op) in reqs {
            let tag = self.next_tag;
            self.next_tag = self.next_tag.wrapping_add(1);
            self.tags.insert(tag, first);
            out.push(BlockRequest { tag, nsid, op });
        }
        if out.is_empty() {
            return Submitted::Done(done(cid, Status::SUCCESS));
        }
        self.groups.insert(
            first,
            Group {
                cid,
                left: out.len() as u32,
                reading,
                status: Status::SUCCESS,
                want,
                data: Bytes::new(),
            },
        );
        Submitted::Block(out)
    }
}

fn lba_range(ns: &Namespace, slba: u64, nlb: u64) -> Result<(u64, u64), Status> {
    let end = slba.checked_add(nlb).ok_or(Status::LBA_OUT_OF_RANGE)?;
    if end > ns.blocks {
        return Err(Status::LBA_OUT_OF_RANGE);
    }
    Ok((slba << ns.shift, nlb << ns.shift))
}

/// Runs one I/O command (the queue checked liveness and authentication).
pub(crate) fn submit(q: &mut Queue, cmd: Command) -> Submitted {
    match run(q, cmd) {
        Ok(s) => s,
        Err((cid, status)) => Submitted::Done(done(cid, status)),
    }
}

fn run(q: &mut Queue, cmd: Command) -> Result<Submitted, (u16, Status)> {
    let sqe = &cmd.sqe;
    let cid = sqe.cid;
    let fail = |s: Status| (cid, s);
    if !OP_RESV.contains(&sqe.opcode)
        && !matches!(
            sqe.opcode,
            OP_FLUSH | OP_WRITE | OP_READ | OP_COMPARE | OP_WRITE_ZEROES | OP_DSM
        )
    {
        return Err(fail(Status::INVALID_OPCODE));
    }
    // Fused operations are not supported (FUSES = 0).
    if sqe.flags & FUSE_MASK != 0 {
        return Err(fail(Status::INVALID_FIELD));
    }
    if sqe.opcode == OP_FLUSH && sqe.nsid == 0xffff_ffff {
        // Flush of every namespace (VWC bits 2:1 = 11b).
        check_len(&cmd, 0).map_err(fail)?;
        let reqs =
            q.ns.list
                .iter()
                .map(|n| (n.cfg.nsid, BlockOp::Flush))
                .collect();
        return Ok(q.io.issue(cid, false, Want::Nothing, reqs));
    }
    let Some(ns) = q.ns.get(sqe.nsid).cloned() else {
        return Err(fail(INVALID_NS));
    };
    let nsid = ns.cfg.nsid;
    let [c10, c11, c12, ..] = sqe.cdw;
    let slba = u64::from(c10) | u64::from(c11) << 32;
    let nlb = u64::from(c12 & 0xffff) + 1;
    let fua = c12 & (1 << 30) != 0;
    let stats = &q.ctrl.stats;
    match sqe.opcode {
        OP_FLUSH => {
            check_len(&cmd, 0).map_err(fail)?;
            Ok(q.io.issue(cid, false, Want::Nothing, vec![(nsid, BlockOp::Flush)]))
        }
        OP_READ | OP_WRITE | OP_COMPARE => {
            let (offset, len) = lba_range(&ns, slba, nlb).map_err(fail)?;
            if q.max_transfer != 0 && len > u64::from(q.max_transfer) {
                return Err(fail(Status::INVALID_FIELD));
            }
            let writing = sqe.opcode == OP_WRITE;
            if writing && ns.cfg.read_only {
                return Err(fail(NS_WRITE_PROTECTED));
            }
            check_len(&cmd, len).map_err(fail)?;
            if sqe.opcode == OP_READ {
                stats.read_cmds.fetch_add(1, Ordering::Relaxed);
                stats.read_bytes.fetch_add(len, Ordering::Relaxed);
                Ok(q.io.issue(
                    cid,
                    true,
                    Want::Data(len),
                    vec![(nsid, BlockOp::Read { offset, len })],
                ))
            } else if writing {
                stats.write_cmds.fetch_add(1, Ordering::Relaxed);
                stats.write_bytes.fetch_add(len, Ordering::Relaxed);
                let op = BlockOp::Write {
                    offset,
                    data: cmd.data.clone(),
                    fua,
                };
                Ok(q.io.issue(cid, false, Want::Nothing, vec![(nsid, op)]))
            } else {
                let want = Want::Compare(cmd.data.clone());
                Ok(q.io.issue(cid, true, want, vec![(nsid, BlockOp::Read { offset, len })]))
            }
        }
        OP_WRITE_ZEROES => {
            check_len(&cmd, 0).map_err(fail)?;
            if ns.cfg.read_only {
                return Err(fail(NS_WRITE_PROTECTED));
            }
            let (offset, len) = lba_range(&ns, slba, nlb).map_err(fail)?;
            let deac = c12 & (1 << 25) != 0;
            let op = if deac && ns.cfg.deallocate_zeroes {
                BlockOp::Discard { offset, len }
            } else {
                BlockOp::WriteZeroes { offset, len }
            };
            Ok(q.io.issue(cid, false, Want::Nothing, vec![(nsid, op)]))
        }
        OP_DSM => dsm(q, &cmd, &ns),
        op if OP_RESV.contains(&op) => reservation(q, &cmd, &ns),
        _ => Err(fail(Status::INVALID_OPCODE)),
    }
}

/// The SGL must describe exactly the command's data, and the transport must have brought
/// all of it for a write (NVMe Base 2.0 §4.3.2: Data SGL Length Invalid).
fn check_len(cmd: &Command, expected: u64) -> Result<(), Status> {
    check_sgl(cmd, expected, false)
}

/// With `at_least`, the SGL may describe more than the command needs: Dataset Management,
/// whose range list Linux's host always sends as 4096 bytes (room for 256 ranges, because
/// some devices read that much whatever NR says), and which Linux's nvmet accepts likewise.
fn check_sgl(cmd: &Command, expected: u64, at_least: bool) -> Result<(), Status> {
    let sgl_len = u64::from(cmd.sqe.sgl.length());
    if matches!(cmd.sqe.sgl, Sgl::Other(_)) {
        return Err(Status::SGL_DESCRIPTOR_TYPE_INVALID);
    }
    if sgl_len < expected || sgl_len != expected && !at_least {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    let host_to_ctrl = matches!(
        cmd.sqe.opcode,
        OP_WRITE | OP_COMPARE | OP_DSM | OP_RESV_REGISTER | OP_RESV_ACQUIRE | OP_RESV_RELEASE
    );
    if host_to_ctrl && cmd.data.len() as u64 != sgl_len || !host_to_ctrl && !cmd.data.is_empty() {
        return Err(Status::DATA_SGL_LENGTH_INVALID);
    }
    Ok(())
}

/// Dataset Management (NVM Command Set 1.0 §3.2.3): with AD, each range is deallocated.
fn dsm(q: &mut Queue, cmd: &Command, ns: &Namespace) -> Result<Submitted, (u16, Status)> {
    let cid = cmd.sqe.cid;
    let nr = (cmd.sqe.cdw[0] & 0xff) as usize + 1;
    let ad = cmd.sqe.cdw[1] & (1 << 2) != 0;
    check_sgl(cmd, (nr * 16) as u64, true).map_err(|s| (cid, s))?;
    if !ad {
        return Ok(Submitted::Done(done(cid, Status::SUCCESS)));
    }
    if ns.cfg.read_only {
        return Err((cid, NS_WRITE_PROTECTED));
    }
    let mut reqs = Vec::with_capacity(nr);
    for r in cmd.data.chunks_exact(16).take(nr) {
        let nlb = u64::from(u32::from_le_bytes([r[4], r[5], r[6], r[7]]));
        let mut s = [0u8; 8];
        s.copy_from_slice(&r[8..16]);
        let slba = u64::from_le_bytes(s);
        if nlb == 0 {
            continue;
        }
        let (offset, len) = lba_range(ns, slba, nlb).map_err(|s| (cid, s))?;
        reqs.push((ns.cfg.nsid, BlockOp::Discard { offset, len }));
    }
    Ok(q.io.issue(cid, false, Want::Nothing, reqs))
}

/// A reservation command (NVMe Base 2.0 §7.2-§7.5) on a namespace that offers reservations
/// (RESCAP): decoded and checked here, run by the driver on the namespace's reservation state.
/// A namespace without them answers Invalid Opcode, as Linux's nvmet does.
fn reservation(q: &mut Queue, cmd: &Command, ns: &Namespace) -> Result<Submitted, (u16, Status)> {
    let cid = cmd.sqe.cid;
    if !ns.cfg.reservations {
        return Err((cid, Status::INVALID_OPCODE));
    }
    let [c10, c11, ..] = cmd.sqe.cdw;
    let (len, want) = match cmd.sqe.opcode {
        OP_RESV_REGISTER | OP_RESV_ACQUIRE => (16, Want::Nothing),
        OP_RESV_RELEASE => (8, Want::Nothing),
        _ => {
            // NUMD, 0's based dwords.
            let len = (u64::from(c10) + 1) * 4;
            if len > REPORT_MAX {
                return Err((cid, Status::INVALID_FIELD));
            }
            (len, Want::Upto(len))
        }
    };
    check_len(cmd, len).map_err(|s| (cid, s))?;
    let r = resv::decode(cmd.sqe.opcode, c10, c11, &cmd.data).map_err(|s| (cid, s))?;
    let nsid = ns.cfg.nsid;
    Ok(q.io.issue(cid, false, want, vec![(nsid, BlockOp::Reservation(r))]))
}

/// One block result; the completion when it was the command's last.
pub(crate) fn block_done(
    q: &mut Queue,
    tag: u64,
    result: Result<Bytes, BlockError>,
) -> Option<Completion> {
    let first = q.io.tags.remove(&tag)?;
    let g = q.io.groups.get_mut(&first)?;
    g.left -= 1;
    match result {
        Ok(data) => {
            if !matches!(g.want, Want::Nothing) {
                g.data = data;
            }
        }
        Err(e) => {
            if g.status.is_success() {
                g.status = e.status(g.reading);
            }
        }
    }
    if g.left > 0 {
        return None;
    }
    let g = q.io.groups.remove(&first)?;
    if !g.status.is_success() {
        return Some(done(g.cid, g.status));
    }
    Some(match g.want {
        Want::Nothing => done(g.cid, Status::SUCCESS),
        Want::Data(len) if g.data.len() as u64 == len => done_data(g.cid, g.data),
        Want::Data(_) => done(g.cid, Status::INTERNAL_ERROR),
        Want::Compare(expected) if g.data.len() != expected.len() => {
            done(g.cid, Status::INTERNAL_ERROR)
        }
        Want::Compare(expected) if g.data == expected => done(g.cid, Status::SUCCESS),
        Want::Compare(_) => done(g.cid, Status::COMPARE_FAILURE),
        Want::Upto(len) => {
            let mut d = g.data.to_vec();
            d.resize(len as usize, 0);
            done_data(g.cid, Bytes::from(d))
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controller::NamespaceConfig;

    #[test]
    fn block_errors_from_the_store_map_by_errno_and_kind() {
        use std::io::{Error, ErrorKind};
        let os = Error::from_raw_os_error;
        assert_eq!(BlockError::from_io(&os(5)), BlockError::Media);
        assert_eq!(BlockError::from_io(&os(28)), BlockError::NoSpace);
        assert_eq!(BlockError::from_io(&os(122)), BlockError::NoSpace);
        assert_eq!(BlockError::from_io(&os(30)), BlockError::ReadOnly);
        assert_eq!(
            BlockError::from_io(&Error::from(ErrorKind::UnexpectedEof)),
            BlockError::OutOfRange
        );
        assert_eq!(
            BlockError::from_io(&Error::other("x")),
            BlockError::Internal
        );
        assert_eq!(
            BlockError::Media.status(true),
            Status::UNRECOVERED_READ_ERROR
        );
        assert_eq!(BlockError::Media.status(false), Status::WRITE_FAULT);
    }

    #[test]
    fn lba_ranges_stop_at_the_end_and_never_overflow() {
        let ns = Namespace {
            cfg: NamespaceConfig {
                nsid: 1,
                size: 8 * 4096,
                block_size: 4096,
                nguid: [0; 16],
                uuid: [0; 16],
                eui64: [0; 8],
                deallocate_zeroes: false,
                read_only: false,
                reservations: false,
            },
            shift: 12,
            blocks: 8,
        };
        assert_eq!(lba_range(&ns, 7, 1), Ok((7 * 4096, 4096)));
        assert_eq!(lba_range(&ns, 7, 2), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(lba_range(&ns, u64::MAX, 2), Err(Status::LBA_OUT_OF_RANGE));
        assert_eq!(lba_range(&ns, 1 << 62, 1), Err(Status::LBA_OUT_OF_RANGE));
    }
}
