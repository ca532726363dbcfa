//! Admin commands (NVMe Base 2.0 §5) of I/O and discovery controllers, and Property Get.

use std::time::{Duration, Instant};

use bytes::Bytes;
use nvme_wire::fabrics::{Property, PropertyGet};
use nvme_wire::Status;

use super::pages::{self, CtrlIdentity};
use super::{done, done_data, done_dw0, Ctrl, Queue, Submitted, Target, CSTS_RDY};
use crate::command::{Command, Completion};

/// Admin opcodes (NVMe Base 2.0 §5, Figure "Opcodes for Admin Commands").
const OP_GET_LOG_PAGE: u8 = 0x02;
const OP_IDENTIFY: u8 = 0x06;
const OP_ABORT: u8 = 0x08;
const OP_SET_FEATURES: u8 = 0x09;
const OP_GET_FEATURES: u8 = 0x0a;
const OP_AER: u8 = 0x0c;
const OP_KEEP_ALIVE: u8 = 0x18;
/// What an I/O controller runs (also the Commands Supported and Effects log).
const IO_CTRL_OPS: [u8; 7] = [
    OP_GET_LOG_PAGE,
    OP_IDENTIFY,
    OP_ABORT,
    OP_SET_FEATURES,
    OP_GET_FEATURES,
    OP_AER,
    OP_KEEP_ALIVE,
];

/// Feature identifiers (NVMe Base 2.0 §5.27.1).
const FID_ARBITRATION: u8 = 0x01;
const FID_POWER_MGMT: u8 = 0x02;
const FID_VWC: u8 = 0x06;
const FID_NUM_QUEUES: u8 = 0x07;
const FID_ASYNC_EVENT: u8 = 0x0b;
const FID_KATO: u8 = 0x0f;
/// Host Identifier, Reservation Notification Mask, Reservation Persistence (NVMe Base 2.0
/// §5.27.1.24-§5.27.1.26; the last two per namespace).
const FID_HOST_ID: u8 = 0x81;
const FID_RESV_MASK: u8 = 0x82;
const FID_RESV_PERSIST: u8 = 0x83;
/// The Reservation Notification Mask's bits: Registration Preempted (1), Reservation
/// Released (2), Reservation Preempted (3).
const RESV_MASK_BITS: u32 = 0x0e;

/// Asynchronous Event Configuration bits (NVMe Base 2.0 §5.27.1.7): Namespace Attribute
/// Notices, Discovery Log Page Change Notices.
pub(crate) const AEC_NS_ATTR: u32 = 1 << 8;
pub(crate) const AEC_DISCOVERY: u32 = 1 << 31;

/// AER completion DW0 (NVMe Base 2.0 §5.2): type Notice (2h), the information and the log
/// page to read.
const fn aen(info: u8, lid: u8) -> u32 {
    2 | (info as u32) << 8 | (lid as u32) << 16
}
/// Namespace Attribute Changed → Changed Namespace List.
pub(crate) const AEN_NS_CHANGED: u32 = aen(0x00, LID_CHANGED_NS);
/// Discovery Log Page Change → the discovery log.
pub(crate) const AEN_DISCOVERY_CHANGED: u32 = aen(0xf0, LID_DISCOVERY);
/// Reservation Log Page Available (type I/O Command Specific, 6h; information 00h) → the
/// Reservation Notification log page (NVMe Base 2.0 §5.2, figure "Asynchronous Event
/// Information - I/O Command Specific Status").
pub(crate) const AEN_RESV_LOG: u32 = 6 | (LID_RESV_NOTIFICATION as u32) << 16;

/// Log page identifiers (NVMe Base 2.0 §5.16; NVMe over Fabrics 1.1 §5.3).
const LID_ERROR: u8 = 0x01;
const LID_SMART: u8 = 0x02;
const LID_FIRMWARE: u8 = 0x03;
const LID_CHANGED_NS: u8 = 0x04;
const LID_EFFECTS: u8 = 0x05;
const LID_DISCOVERY: u8 = 0x70;
/// Reservation Notification (NVMe Base 2.0 §5.16.1.25).
const LID_RESV_NOTIFICATION: u8 = 0x80;

/// Queues an event unless one for the same log page is outstanding (reported and the page
/// not read yet: NVMe Base 2.0 §5.2, events of that type are masked until then).
pub(crate) fn queue_event(c: &mut Ctrl, dw0: u32) {
    let lid = (dw0 >> 16) as u8;
    if c.aen_masked.insert(lid) {
        c.aen_queue.push_back(dw0);
    }
}

/// Property Get (NVMe over Fabrics 1.1 §3.4): CAP (8 bytes), VS, CC, CSTS (4 bytes).
pub(crate) fn property_get(t: &Target, c: &Ctrl, cid: u16, p: PropertyGet) -> Completion {
    if p.property.is_8_bytes() != Some(p.size8) {
        return done(cid, Status::INVALID_FIELD);
    }
    let v: u64 = match p.property {
        Property::Cap => {
            // MQES (0's based), CQR 1, TO 15 × 500 ms, CSS bit 37 (NVM command set),
            // MPSMIN = MPSMAX = 0 (4 KiB).
            u64::from(t.cfg.queue_size - 1) | 1 << 16 | 15 << 24 | 1 << 37
        }
        Property::Vs => u64::from(pages::VERSION),
        Property::Cc => u64::from(c.cc),
        Property::Csts => u64::from(c.csts),
        Property::Nssr | Property::Other(_) => return done(cid, Status::INVALID_FIELD),
    };
    let mut r = done_dw0(cid, (v & 0xffff_ffff) as u32);
    r.cqe.dw1 = (v >> 32) as u32;
    r
}

/// Runs an admin command (the caller checked authentication and CC.EN/CSTS.RDY).
pub(crate) fn submit(t: &mut Target, q: &mut Queue, cmd: Command, now: Instant) -> Submitted {
    let cid = cmd.sqe.cid;
    let discovery = q.is_discovery();
    let r = match cmd.sqe.opcode {
        OP_IDENTIFY => identify(t, q, &cmd),
        OP_GET_LOG_PAGE => get_log_page(t, q, &cmd),
        OP_SET_FEATURES => set_features(t, q, &cmd, now),
        OP_GET_FEATURES => get_features(t, q, &cmd),
        OP_KEEP_ALIVE => {
            t.keep_alive(q.cntlid(), now);
            done(cid, Status::SUCCESS)
        }
        OP_AER => return aer(t, q.cntlid(), cid),
        // Abort (NVMe Base 2.0 §5.1): commands run to completion here, so none is aborted
        // (DW0 bit 0 = 1).
        OP_ABORT if !discovery => done_dw0(cid, 1),
        // Anything else, Reservation and queue creation included (queues are created by
        // Connect on fabrics): Invalid Command Opcode with DNR.
        _ => done(cid, Status::INVALID_OPCODE),
    };
    Submitted::Done(r)
}

/// The data of a controller-to-host admin command: the SGL must hold `len` bytes.
fn reply(cid: u16, cmd: &Command, data: Bytes) -> Completion {
    if cmd.sqe.sgl.length() as usize != data.len() || !cmd.data.is_empty() {
        return done(cid, Status::DATA_SGL_LENGTH_INVALID);
    }
    done_data(cid, data)
}

/// Identify (NVMe Base 2.0 §5.17): CNS 00h, 01h, 02h, 03h; 06h for the NVM command set.
fn identify(t: &Target, q: &Queue, cmd: &Command) -> Completion {
    let cid = cmd.sqe.cid;
    let cns = (cmd.sqe.cdw[0] & 0xff) as u8;
    let csi = (cmd.sqe.cdw[1] >> 24) as u8;
    let nsid = cmd.sqe.nsid;
    let Some(c) = t.ctrl(q.cntlid()) else {
        return done(cid, super::ABORTED_SQ_DELETION);
    };
    let sub = t.subsystem_cfg(c);
    if q.is_discovery() && cns != 0x01 {
        return done(cid, Status::INVALID_FIELD);
    }
    let data = match cns {
        0x00 => {
            if nsid == 0 || nsid == u32::MAX {
                return done(cid, Status::INVALID_NAMESPACE);
            }
            // An inactive NSID reads as zeroes (NVMe Base 2.0 §5.17.2.1), as nvmet does.
            match q.ns.get(nsid) {
                Some(ns) => pages::identify_namespace(ns),
                None => Bytes::from(vec![0u8; pages::IDENTIFY_LEN]),
            }
        }
        0x01 => {
            let nn =
                q.ns.list
                    .last()
                    .map_or(0, |n| n.cfg.nsid)
                    .max(if q.is_discovery() { 0 } else { 1024 });
            pages::identify_controller(&CtrlIdentity {
                cntlid: c.cntlid,
                discovery: q.is_discovery(),
                serial: &sub.serial,
                model: &sub.model,
                firmware: &t.cfg.firmware,
                subnqn: &sub.nqn,
                max_transfer: t.cfg.max_transfer,
                queue_size: t.cfg.queue_size,
                in_capsule_data: t.cfg.in_capsule_data,
                nn,
                vwc: sub.volatile_write_cache,
            })
        }
        0x02 => {
            if nsid >= 0xffff_fffe {
                return done(cid, Status::INVALID_NAMESPACE);
            }
            pages::active_ns_list(q.ns.list.iter().map(|n| &**n), nsid)
        }
        0x03 => match q.ns.get(nsid) {
            Some(ns) => pages::ns_descriptors(ns),
            None => return done(cid, Status::INVALID_NAMESPACE),
        },
        // I/O Command Set specific Identify Controller for NVM (NVM Command Set 1.0
        // §4.1.5.3): no limits to report, all zero.
        0x06 if csi == 0 => Bytes::from(vec![0u8; pages::IDENTIFY_LEN]),
        _ => return done(cid, Status::INVALID_FIELD),
    };
    reply(cid, cmd, data)
}

/// Get Log Page (NVMe Base 2.0 §5.16).
fn get_log_page(t: &mut Target, q: &Queue, cmd: &Command) -> Completion {
    let cid = cmd.sqe.cid;
    let [c10, c11, c12, c13, ..] = cmd.sqe.cdw;
    let lid = (c10 & 0xff) as u8;
    let rae = c10 & (1 << 15) != 0;
    let numd = (u64::from(c11 & 0xffff) << 16 | u64::from(c10 >> 16)) + 1;
    let len = numd * 4;
    let offset = u64::from(c12) | u64::from(c13) << 32;
    if offset % 4 != 0 {
        return done(cid, Status::INVALID_FIELD);
    }
    let cap = if t.cfg.max_transfer == 0 {
        16 << 20
    } else {
        u64::from(t.cfg.max_transfer)
    };
    if len > cap {
        return done(cid, Status::INVALID_FIELD);
    }
    let nsid = cmd.sqe.nsid;
    let cntlid = q.cntlid();
    let page: Vec<u8> = match (q.is_discovery(), lid) {
        (true, LID_DISCOVERY) => {
            let hostnqn = t.hostnqn_of(cntlid).unwrap_or_else(|| "".into());
            let entries = t
                .discovery
                .iter()
                .filter(|e| t.host_may_see(&e.subnqn, &hostnqn));
            pages::discovery_log(t.genctr, entries)
        }
        (false, LID_ERROR) => vec![0u8; 64],
        (false, LID_SMART) => {
            // Controller-wide only (LPA bit 0 clear): NSID 0 or FFFFFFFFh.
            if nsid != 0 && nsid != u32::MAX {
                return done(cid, Status::INVALID_FIELD);
            }
            let s = &q.ctrl.stats;
            let get =
                |a: &std::sync::atomic::AtomicU64| a.load(std::sync::atomic::Ordering::Relaxed);
            pages::smart(
                get(&s.read_bytes),
                get(&s.write_bytes),
                get(&s.read_cmds),
                get(&s.write_cmds),
            )
        }
        (false, LID_FIRMWARE) => pages::firmware_slots(&t.cfg.firmware),
        (false, LID_CHANGED_NS) => {
            let Some(c) = t.ctrl_mut(cntlid) else {
                return done(cid, super::ABORTED_SQ_DELETION);
            };
            let page = pages::changed_ns(c.changed_ns.as_ref());
            c.changed_ns = Some(Default::default());
            page
        }
        (false, LID_EFFECTS) => pages::effects(&IO_CTRL_OPS),
        // One notification per read, oldest first (NVMe Base 2.0 §5.16.1.25); none left:
        // the empty page (Log Page Count 0, type 0h "Empty Log Page").
        (false, LID_RESV_NOTIFICATION) => {
            let Some(c) = t.ctrl_mut(cntlid) else {
                return done(cid, super::ABORTED_SQ_DELETION);
            };
            let entry = if offset == 0 {
                c.resv_log.pop_front()
            } else {
                c.resv_log.front().copied()
            };
            pages::resv_notification(entry.as_ref(), c.resv_log.len())
        }
        _ => return done(cid, Status::INVALID_LOG_PAGE),
    };
    if offset > page.len() as u64 {
        return done(cid, Status::INVALID_FIELD);
    }
    if !rae {
        if let Some(c) = t.ctrl_mut(cntlid) {
            c.aen_masked.remove(&lid);
            // Reservation notifications still unread: their event again.
            if lid == LID_RESV_NOTIFICATION && !c.resv_log.is_empty() && !q.is_discovery() {
                queue_event(c, AEN_RESV_LOG);
            }
        }
        t.deliver_events(cntlid);
    }
    let start = offset as usize;
    let mut out = vec![0u8; len as usize];
    let avail = &page[start..];
    let n = avail.len().min(out.len());
    out[..n].copy_from_slice(&avail[..n]);
    reply(cid, cmd, Bytes::from(out))
}

/// Set Features (NVMe Base 2.0 §5.27).
fn set_features(t: &mut Target, q: &Queue, cmd: &Command, now: Instant) -> Completion {
    let cid = cmd.sqe.cid;
    let [c10, c11, ..] = cmd.sqe.cdw;
    let fid = (c10 & 0xff) as u8;
    let discovery = q.is_discovery();
    if c10 & (1 << 31) != 0 {
        return done(cid, Status::FEATURE_NOT_SAVEABLE);
    }
    let max_q = t.cfg.max_io_queues;
    let nsid = cmd.sqe.nsid;
    let Some(c) = t.ctrl_mut(q.cntlid()) else {
        return done(cid, super::ABORTED_SQ_DELETION);
    };
    match (discovery, fid) {
        // The Host Identifier of a fabrics host is the one its Connect gave (NVMe over
        // Fabrics 1.1 §3.3): Command Sequence Error, as Linux's nvmet answers.
        (false, FID_HOST_ID) => done(cid, Status::COMMAND_SEQUENCE_ERROR),
        (false, FID_RESV_MASK) => {
            if c11 & !RESV_MASK_BITS != 0 {
                return done(cid, Status::INVALID_FIELD);
            }
            if nsid == u32::MAX {
                for n in &q.ns.list {
                    c.resv_mask.insert(n.cfg.nsid, c11);
                }
            } else if q.ns.get(nsid).is_some() {
                c.resv_mask.insert(nsid, c11);
            } else {
                return done(cid, Status::INVALID_NAMESPACE);
            }
            done(cid, Status::SUCCESS)
        }
        // Persist Through Power Loss is not supported (RESCAP bit 0 clear): only 0.
        (false, FID_RESV_PERSIST) if c11 & 1 == 0 => done(cid, Status::SUCCESS),
        (_, FID_KATO) => {
            c.kato = c11;
            c.deadline = (c11 != 0).then(|| now + Duration::from_millis(u64::from(c11)));
            done(cid, Status::SUCCESS)
        }
        (_, FID_ASYNC_EVENT) => {
            let supported = if discovery {
                AEC_DISCOVERY
            } else {
                AEC_NS_ATTR
            };
            if c11 & !supported != 0 {
                return done(cid, Status::INVALID_FIELD);
            }
            c.aec = c11;
            done(cid, Status::SUCCESS)
        }
        (false, FID_NUM_QUEUES) => {
            let nsqr = c11 & 0xffff;
            let ncqr = c11 >> 16;
            if nsqr == 0xffff || ncqr == 0xffff {
                return done(cid, Status::INVALID_FIELD);
            }
            if c.csts & CSTS_RDY != 0 && c.io_qids_connected() {
                return done(cid, Status::COMMAND_SEQUENCE_ERROR);
            }
            // SQs and CQs come in pairs on fabrics: the smaller request, capped.
            let want = nsqr.min(ncqr) + 1;
            let granted = want.min(u32::from(max_q)) as u16;
            c.io_queues = granted;
            let g = u32::from(granted - 1);
            done_dw0(cid, g | g << 16)
        }
        (false, FID_VWC) => {
            if !c.vwc_present {
                return done(cid, Status::INVALID_FIELD);
            }
            c.wce = c11 & 1 != 0;
            done(cid, Status::SUCCESS)
        }
        (false, FID_ARBITRATION) => {
            c.arbitration = c11;
            done(cid, Status::SUCCESS)
        }
        (false, FID_POWER_MGMT) => {
            // Power state 0 is the only one (NPSS 0); no workload hint.
            if c11 != 0 {
                return done(cid, Status::INVALID_FIELD);
            }
            done(cid, Status::SUCCESS)
        }
        _ => done(cid, Status::INVALID_FIELD),
    }
}

/// Get Features (NVMe Base 2.0 §5.15): current, default and saved values are the same here;
/// SEL 3 reports every supported feature as changeable, not saveable.
fn get_features(t: &Target, q: &Queue, cmd: &Command) -> Completion {
    let cid = cmd.sqe.cid;
    let c10 = cmd.sqe.cdw[0];
    let fid = (c10 & 0xff) as u8;
    let sel = (c10 >> 8) & 0x7;
    let discovery = q.is_discovery();
    let Some(c) = t.ctrl(q.cntlid()) else {
        return done(cid, super::ABORTED_SQ_DELETION);
    };
    let nsid = cmd.sqe.nsid;
    if !discovery && fid == FID_HOST_ID {
        // The 128-bit Host Identifier as data; EXHID (CDW11 bit 0) must ask for 128 bits.
        if sel == 3 {
            return done_dw0(cid, 0);
        }
        if cmd.sqe.cdw[1] & 1 == 0 {
            return done(cid, Status::INVALID_FIELD);
        }
        return reply(cid, cmd, Bytes::copy_from_slice(&c.hostid));
    }
    if !discovery && matches!(fid, FID_RESV_MASK | FID_RESV_PERSIST) {
        if q.ns.get(nsid).is_none() {
            return done(cid, Status::INVALID_NAMESPACE);
        }
        // SEL 3: namespace specific (bit 1), the mask changeable (bit 2).
        let (value, caps) = if fid == FID_RESV_MASK {
            (c.resv_mask.get(&nsid).copied().unwrap_or(0), 0x6)
        } else {
            (0, 0x2)
        };
        return match sel {
            0..=2 => done_dw0(cid, value),
            3 => done_dw0(cid, caps),
            _ => done(cid, Status::INVALID_FIELD),
        };
    }
    let value = match (discovery, fid) {
        (_, FID_KATO) => c.kato,
        (_, FID_ASYNC_EVENT) => c.aec,
        (false, FID_NUM_QUEUES) => {
            let g = u32::from(c.io_queues.max(1) - 1);
            g | g << 16
        }
        (false, FID_VWC) if c.vwc_present => u32::from(c.wce),
        (false, FID_ARBITRATION) => c.arbitration,
        (false, FID_POWER_MGMT) => 0,
        _ => return done(cid, Status::INVALID_FIELD),
    };
    match sel {
        0..=2 => done_dw0(cid, value),
        3 => done_dw0(cid, 1 << 2),
        _ => done(cid, Status::INVALID_FIELD),
    }
}

/// Asynchronous Event Request (NVMe Base 2.0 §5.2): held until an event; at most AERL + 1.
fn aer(t: &mut Target, cntlid: u16, cid: u16) -> Submitted {
    let Some(c) = t.ctrl_mut(cntlid) else {
        return Submitted::Done(done(cid, super::ABORTED_SQ_DELETION));
    };
    if c.aers.len() > usize::from(pages::AERL) {
        return Submitted::Done(done(cid, Status::ASYNC_EVENT_LIMIT_EXCEEDED));
    }
    c.aers.push_back(cid);
    t.deliver_events(cntlid);
    Submitted::Held
}
