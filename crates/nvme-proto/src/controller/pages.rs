//! The data structures the admin commands return, built as bytes: Identify (NVMe Base 2.0
//! §5.17.2; NVM Command Set 1.0 §4.1.5), log pages (NVMe Base 2.0 §5.16.1) and the discovery
//! log (NVMe over Fabrics 1.1 §5.3). Field offsets are the specification's.

use bytes::{Bytes, BytesMut};

use super::config::DiscoveryEntry;
use super::io::{OP_COMPARE, OP_DSM, OP_FLUSH, OP_READ, OP_RESV, OP_WRITE, OP_WRITE_ZEROES};
use super::Namespace;

/// Identify data structures are 4096 bytes.
pub(crate) const IDENTIFY_LEN: usize = 4096;
/// VS and Identify Controller VER: NVMe 2.0.
pub(crate) const VERSION: u32 = 0x0002_0000;

fn put(b: &mut [u8], at: usize, v: &[u8]) {
    b[at..at + v.len()].copy_from_slice(v);
}

/// An ASCII field padded with spaces (SN, MN, FR, TRSVCID, TRADDR): other bytes become `_`,
/// longer text is cut.
fn put_ascii(b: &mut [u8], at: usize, len: usize, s: &str) {
    let field = &mut b[at..at + len];
    field.fill(b' ');
    for (d, c) in field.iter_mut().zip(s.bytes()) {
        *d = if (0x20..0x7f).contains(&c) { c } else { b'_' };
    }
}

/// Text in a NUL-padded field of `len` bytes (cut to fit).
fn put_str(b: &mut [u8], at: usize, len: usize, s: &str) {
    let n = s.len().min(len);
    b[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
}

/// A NUL-terminated NQN field of 256 bytes.
fn put_nqn(b: &mut [u8], at: usize, s: &str) {
    let n = s.len().min(255);
    b[at..at + n].copy_from_slice(&s.as_bytes()[..n]);
}

/// What Identify Controller reports, besides the subsystem's strings.
#[derive(Debug)]
pub(crate) struct CtrlIdentity<'a> {
    pub(crate) cntlid: u16,
    pub(crate) discovery: bool,
    pub(crate) serial: &'a str,
    pub(crate) model: &'a str,
    pub(crate) firmware: &'a str,
    pub(crate) subnqn: &'a str,
    pub(crate) max_transfer: u32,
    pub(crate) queue_size: u16,
    pub(crate) in_capsule_data: u32,
    pub(crate) nn: u32,
    pub(crate) vwc: bool,
}

/// Asynchronous Event Request Limit, 0's based: four held at once (AERL + 1).
pub(crate) const AERL: u8 = 3;
/// Keep Alive Support: granularity 100 ms × 10 (NVMe Base 2.0 §5.17.2.1, KAS).
const KAS: u16 = 10;

/// Identify Controller (CNS 01h; NVMe Base 2.0 §5.17.2.1, Figure "Identify Controller Data
/// Structure"; NVMe over Fabrics 1.1 §4.1 for bytes 1792..2047).
pub(crate) fn identify_controller(id: &CtrlIdentity<'_>) -> Bytes {
    let mut b = vec![0u8; IDENTIFY_LEN];
    // VID/SSVID 0: no PCI vendor.
    put_ascii(&mut b, 4, 20, id.serial);
    put_ascii(&mut b, 24, 40, id.model);
    put_ascii(&mut b, 64, 8, id.firmware);
    b[72] = 0; // RAB
               // CMIC bit 1: the subsystem may have more than one controller (one per host connection).
    b[76] = if id.discovery { 0 } else { 1 << 1 };
    b[77] = if id.max_transfer == 0 {
        0
    } else {
        (id.max_transfer / 4096).trailing_zeros() as u8
    };
    put(&mut b, 78, &id.cntlid.to_le_bytes());
    put(&mut b, 80, &VERSION.to_le_bytes());
    // OAES: bit 8 Namespace Attribute Notices; bit 31 Discovery Log Page Change Notices.
    let oaes: u32 = if id.discovery { 1 << 31 } else { 1 << 8 };
    put(&mut b, 92, &oaes.to_le_bytes());
    // CTRATT bit 0: 128-bit Host Identifier (required by NVMe over Fabrics).
    put(&mut b, 96, &1u32.to_le_bytes());
    // CNTRLTYPE: 1 I/O controller, 2 discovery controller.
    b[111] = if id.discovery { 2 } else { 1 };
    // OACS 0: no optional admin commands.
    b[258] = 3; // ACL: four Aborts
    b[259] = AERL;
    b[260] = if id.discovery { 0 } else { 0x03 }; // FRMW: slot 1 read-only, one slot
                                                  // LPA: bit 1 Commands Supported and Effects, bit 2 extended data (LPOL/LPOU, NUMDU).
    b[261] = if id.discovery {
        1 << 2
    } else {
        (1 << 1) | (1 << 2)
    };
    b[262] = 0; // ELPE: one Error Information entry
    b[263] = 0; // NPSS: power state 0 only
    put(&mut b, 320, &KAS.to_le_bytes());
    put(&mut b, 514, &id.queue_size.to_le_bytes()); // MAXCMD
    if !id.discovery {
        b[512] = 0x66; // SQES: 64 bytes
        b[513] = 0x44; // CQES: 16 bytes
        put(&mut b, 516, &id.nn.to_le_bytes());
        // ONCS: Compare (bit 0), Dataset Management (bit 2), Write Zeroes (bit 3),
        // Reservations (bit 5; each namespace's RESCAP says whether it has them).
        put(&mut b, 520, &0x002du16.to_le_bytes());
        // VWC: present, and Flush with NSID FFFFFFFFh supported (bits 2:1 = 11b).
        b[525] = if id.vwc { 0x07 } else { 0 };
    }
    // SGLS: SGLs supported without alignment (bits 1:0 = 01b); bit 20: the address of a
    // Data Block descriptor may be an offset (in-capsule data).
    put(&mut b, 536, &(1u32 | 1 << 20).to_le_bytes());
    put_nqn(&mut b, 768, id.subnqn);
    if !id.discovery {
        // IOCCSZ/IORCSZ in 16-byte units: the SQE plus in-capsule data; the CQE.
        put(
            &mut b,
            1792,
            &((64 + id.in_capsule_data) / 16).to_le_bytes(),
        );
        put(&mut b, 1796, &1u32.to_le_bytes());
        // ICDOFF 0, FCATT 0 (dynamic model), MSDBD 1.
        b[1803] = 1;
    }
    // PSD0: maximum power 25 W (MP in 0.01 W), the only state.
    put(&mut b, 2048, &2500u16.to_le_bytes());
    Bytes::from(b)
}

/// Identify Namespace (CNS 00h; NVM Command Set 1.0 §4.1.5.1).
pub(crate) fn identify_namespace(ns: &Namespace) -> Bytes {
    let mut b = vec![0u8; IDENTIFY_LEN];
    put(&mut b, 0, &ns.blocks.to_le_bytes()); // NSZE
    put(&mut b, 8, &ns.blocks.to_le_bytes()); // NCAP
    put(&mut b, 16, &ns.blocks.to_le_bytes()); // NUSE
    b[25] = 0; // NLBAF: one format
    b[26] = 0; // FLBAS: format 0
    b[30] = 1; // NMIC: may be attached to several controllers
    if ns.cfg.reservations {
        b[31] = super::resv::RESCAP;
    }
    if ns.cfg.deallocate_zeroes {
        // DLFEAT: deallocated blocks read 0h (bits 2:0 = 001b), Write Zeroes may deallocate
        // (bit 3).
        b[33] = 0x09;
    }
    b[99] = u8::from(ns.cfg.read_only); // NSATTR bit 0: write protected
    put(&mut b, 104, &ns.cfg.nguid);
    put(&mut b, 120, &ns.cfg.eui64);
    // LBAF0: no metadata, LBADS = log2(block size), relative performance best.
    put(&mut b, 128, &(ns.shift << 16).to_le_bytes());
    Bytes::from(b)
}

/// Active Namespace ID list (CNS 02h): NSIDs above `after`, ascending, at most 1024.
pub(crate) fn active_ns_list<'a>(nsids: impl Iterator<Item = &'a Namespace>, after: u32) -> Bytes {
    let mut b = vec![0u8; IDENTIFY_LEN];
    for (i, ns) in nsids.filter(|n| n.cfg.nsid > after).take(1024).enumerate() {
        put(&mut b, i * 4, &ns.cfg.nsid.to_le_bytes());
    }
    Bytes::from(b)
}

/// Namespace Identification Descriptor list (CNS 03h; NVMe Base 2.0 §5.17.2.3): EUI-64
/// (type 1), NGUID (2), UUID (3) when not zero, and the Command Set Identifier (4) NVM.
pub(crate) fn ns_descriptors(ns: &Namespace) -> Bytes {
    let mut b = BytesMut::zeroed(IDENTIFY_LEN);
    let mut at = 0;
    let mut add = |nidt: u8, nid: &[u8]| {
        b[at] = nidt;
        b[at + 1] = nid.len() as u8;
        b[at + 4..at + 4 + nid.len()].copy_from_slice(nid);
        at += 4 + nid.len();
    };
    if ns.cfg.eui64 != [0; 8] {
        add(1, &ns.cfg.eui64);
    }
    if ns.cfg.nguid != [0; 16] {
        add(2, &ns.cfg.nguid);
    }
    if ns.cfg.uuid != [0; 16] {
        add(3, &ns.cfg.uuid);
    }
    add(4, &[0]);
    b.freeze()
}

/// SMART / Health Information (log 02h; NVMe Base 2.0 §5.16.1.3), 512 bytes.
pub(crate) fn smart(read_bytes: u64, write_bytes: u64, reads: u64, writes: u64) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[3] = 100; // Available Spare
    b[4] = 10; // Available Spare Threshold
               // Data Units Read/Written: thousands of 512-byte units, rounded up.
    let units = |bytes: u64| u128::from(bytes / 512).div_ceil(1000);
    put(&mut b, 32, &units(read_bytes).to_le_bytes());
    put(&mut b, 48, &units(write_bytes).to_le_bytes());
    put(&mut b, 64, &u128::from(reads).to_le_bytes());
    put(&mut b, 80, &u128::from(writes).to_le_bytes());
    b
}

/// The Reservation Notification log page (NVMe Base 2.0 §5.16.1.25, 64 bytes): Log Page
/// Count (0: empty), the type, how many more wait (at most 255), the NSID; `None`: the empty
/// page.
pub(crate) fn resv_notification(entry: Option<&super::ResvLogEntry>, more: usize) -> Vec<u8> {
    let mut b = vec![0u8; 64];
    if let Some(e) = entry {
        b[0..8].copy_from_slice(&e.count.to_le_bytes());
        b[8] = e.notice as u8;
        b[9] = u8::try_from(more).unwrap_or(u8::MAX);
        b[12..16].copy_from_slice(&e.nsid.to_le_bytes());
    }
    b
}

/// Firmware Slot Information (log 03h; NVMe Base 2.0 §5.16.1.4), 512 bytes.
pub(crate) fn firmware_slots(firmware: &str) -> Vec<u8> {
    let mut b = vec![0u8; 512];
    b[0] = 1; // AFI: slot 1 active
    put_ascii(&mut b, 8, 8, firmware);
    b
}

/// Changed Namespace List (log 04h; NVMe Base 2.0 §5.16.1.5): `None` = more than 1024
/// changed (first entry FFFFFFFFh).
pub(crate) fn changed_ns(list: Option<&std::collections::BTreeSet<u32>>) -> Vec<u8> {
    let mut b = vec![0u8; 4096];
    match list {
        None => put(&mut b, 0, &u32::MAX.to_le_bytes()),
        Some(l) => {
            for (i, nsid) in l.iter().take(1024).enumerate() {
                put(&mut b, i * 4, &nsid.to_le_bytes());
            }
        }
    }
    b
}

/// Commands Supported and Effects (log 05h; NVMe Base 2.0 §5.16.1.6): CSUPP for what this
/// controller runs, LBCC for the commands that change blocks.
pub(crate) fn effects(admin_ops: &[u8]) -> Vec<u8> {
    const CSUPP: u32 = 1;
    const LBCC: u32 = 1 << 1;
    let mut b = vec![0u8; 4096];
    for &op in admin_ops {
        put(&mut b, usize::from(op) * 4, &CSUPP.to_le_bytes());
    }
    for (op, e) in [
        (OP_FLUSH, CSUPP),
        (OP_WRITE, CSUPP | LBCC),
        (OP_READ, CSUPP),
        (OP_COMPARE, CSUPP),
        (OP_WRITE_ZEROES, CSUPP | LBCC),
        (OP_DSM, CSUPP | LBCC),
    ] {
        put(&mut b, 1024 + usize::from(op) * 4, &e.to_le_bytes());
    }
    for op in OP_RESV {
        put(&mut b, 1024 + usize::from(op) * 4, &CSUPP.to_le_bytes());
    }
    b
}

/// TRTYPE TCP (NVMe over Fabrics 1.1 §5.3, Discovery Log Page Entry).
const TRTYPE_TCP: u8 = 3;
/// SUBTYPE: an NVM subsystem / the current discovery subsystem (TP 8013).
const SUBTYPE_NVM: u8 = 2;
const SUBTYPE_CURRENT_DISCOVERY: u8 = 3;

/// The Discovery log page (log 70h; NVMe over Fabrics 1.1 §5.3): a 1024-byte header
/// (GENCTR, NUMREC, RECFMT) and one 1024-byte entry per record.
pub(crate) fn discovery_log<'a>(
    genctr: u64,
    entries: impl Iterator<Item = &'a DiscoveryEntry>,
) -> Vec<u8> {
    let entries: Vec<_> = entries.collect();
    let mut b = vec![0u8; 1024 * (1 + entries.len())];
    put(&mut b, 0, &genctr.to_le_bytes());
    put(&mut b, 8, &(entries.len() as u64).to_le_bytes());
    for (i, e) in entries.iter().enumerate() {
        let at = 1024 * (i + 1);
        let r = &mut b[at..at + 1024];
        r[0] = TRTYPE_TCP;
        r[1] = if e.ipv6 { 2 } else { 1 }; // ADRFAM
        r[2] = if e.subnqn == super::DISCOVERY_NQN {
            SUBTYPE_CURRENT_DISCOVERY
        } else {
            SUBTYPE_NVM
        };
        r[3] = e.treq_secure_channel & 0x3; // TREQ
        put(r, 4, &e.portid.to_le_bytes());
        put(r, 6, &0xffffu16.to_le_bytes()); // CNTLID: dynamic
        put(r, 8, &32u16.to_le_bytes()); // ASQSZ
                                         // TRSVCID and TRADDR NUL-padded, as Linux's nvmet writes them (libnvme strips
                                         // trailing NULs and spaces alike).
        put_str(r, 32, 32, &e.trsvcid);
        put_nqn(r, 256, &e.subnqn);
        put_str(r, 512, 256, &e.traddr);
        r[768] = e.sectype; // TSAS.SECTYPE (NVMe/TCP 1.0 §4.1)
    }
    b
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(ipv6: bool) -> DiscoveryEntry {
        DiscoveryEntry {
            subnqn: "nqn.2026-01.io.ipsan:a".into(),
            traddr: "::1".into(),
            trsvcid: "4420".into(),
            ipv6,
            portid: 7,
            treq_secure_channel: 1,
            sectype: 2,
        }
    }

    #[test]
    fn discovery_entries_sit_at_their_offsets() {
        let e = [entry(true), entry(false)];
        let b = discovery_log(9, e.iter());
        assert_eq!(b.len(), 3 * 1024);
        assert_eq!(u64::from_le_bytes(b[0..8].try_into().unwrap()), 9, "GENCTR");
        assert_eq!(
            u64::from_le_bytes(b[8..16].try_into().unwrap()),
            2,
            "NUMREC"
        );
        let r = &b[1024..2048];
        assert_eq!(
            (r[0], r[1], r[2], r[3]),
            (3, 2, 2, 1),
            "TCP, IPv6, NVM, TLS required"
        );
        assert_eq!(u16::from_le_bytes([r[4], r[5]]), 7, "PORTID");
        assert_eq!(&r[32..37], b"4420\0", "TRSVCID NUL-padded");
        assert_eq!(&r[512..516], b"::1\0");
        assert_eq!(r[768], 2, "SECTYPE TLS 1.3");
        assert_eq!(b[2048 + 1], 1, "IPv4");
    }

    #[test]
    fn ascii_fields_are_space_padded_and_non_ascii_replaced() {
        let id = CtrlIdentity {
            cntlid: 1,
            discovery: false,
            serial: "é1",
            model: "m",
            firmware: "0.1.0-long-version",
            subnqn: "nqn.x",
            max_transfer: 0,
            queue_size: 32,
            in_capsule_data: 0,
            nn: 1,
            vwc: false,
        };
        let b = identify_controller(&id);
        assert_eq!(&b[4..9], b"__1  ", "two UTF-8 bytes of é become _");
        assert_eq!(&b[64..72], b"0.1.0-lo", "FR cut to 8 bytes");
        assert_eq!(b[77], 0, "MDTS 0: no limit");
        assert_eq!(b[525], 0, "no volatile write cache");
        assert_eq!(
            u32::from_le_bytes(b[1792..1796].try_into().unwrap()),
            4,
            "IOCCSZ: the SQE"
        );
    }

    #[test]
    fn changed_ns_list_overflow_is_ffffffff() {
        let b = changed_ns(None);
        assert_eq!(&b[0..8], &[0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        let l: std::collections::BTreeSet<u32> = [3, 1].into();
        let b = changed_ns(Some(&l));
        assert_eq!(&b[0..12], &[1, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0]);
    }
}
