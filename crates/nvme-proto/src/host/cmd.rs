//! The commands a host sends (their SQEs; the queue sets CID and SGL) and parsers of what the
//! controller returns: Identify Controller / Namespace / active namespace list (NVMe Base 2.0
//! §5.17), the Discovery log page (NVMe over Fabrics 1.1 §5.3, Log Page 70h), the properties
//! CAP and CSTS (NVMe Base 2.0 §3.1.4).

use nvme_wire::entry::PSDT_SGL;
use nvme_wire::fabrics::{
    Connect, ConnectData, FabricsCommand, FabricsKind, Property, PropertyGet, PropertySet,
    CONNECT_DATA_LEN,
};
use nvme_wire::{Sgl, Sqe, WireError};

pub use crate::queue::CATTR_SQFLOW_DISABLE;

/// The well-known discovery subsystem NQN (NVMe Base 2.0 §4.5).
pub const DISCOVERY_NQN: &str = "nqn.2014-08.org.nvmexpress.discovery";

/// Admin opcodes (NVMe Base 2.0 §5).
pub const ADMIN_GET_LOG_PAGE: u8 = 0x02;
pub const ADMIN_IDENTIFY: u8 = 0x06;
pub const ADMIN_SET_FEATURES: u8 = 0x09;
pub const ADMIN_KEEP_ALIVE: u8 = 0x18;
/// NVM command set opcodes (NVM Command Set 1.0 §3).
pub const NVM_FLUSH: u8 = 0x00;
pub const NVM_WRITE: u8 = 0x01;
pub const NVM_READ: u8 = 0x02;
/// Reservation Register / Report / Acquire / Release (NVMe Base 2.0 §7.2-§7.5).
pub const NVM_RESV_REGISTER: u8 = 0x0d;
pub const NVM_RESV_REPORT: u8 = 0x0e;
pub const NVM_RESV_ACQUIRE: u8 = 0x11;
pub const NVM_RESV_RELEASE: u8 = 0x15;

/// Identify CNS values.
pub const CNS_NAMESPACE: u32 = 0x00;
pub const CNS_CONTROLLER: u32 = 0x01;
pub const CNS_ACTIVE_NS_LIST: u32 = 0x02;
/// Identify data is always 4096 bytes.
pub const IDENTIFY_LEN: u32 = 4096;
/// Feature Identifier Number of Queues.
pub const FID_NUMBER_OF_QUEUES: u32 = 0x07;
/// Log page identifier of the Discovery log.
pub const LID_DISCOVERY: u8 = 0x70;
/// Discovery log header and each entry are 1024 bytes.
pub const DISCOVERY_RECORD_LEN: usize = 1024;

fn sqe(opcode: u8) -> Sqe {
    Sqe::new(opcode, 0, Sgl::Transport { length: 0 })
}

/// Connect (NVMe over Fabrics 1.1 §3.3) for queue `qid` with its 1024-byte data, which goes in
/// the capsule.
///
/// # Errors
/// An NQN that is empty, too long or holds a NUL.
pub fn connect(
    qid: u16,
    sqsize: u16,
    kato_ms: u32,
    data: &ConnectData,
) -> Result<(Sqe, [u8; CONNECT_DATA_LEN]), WireError> {
    connect_with_cattr(qid, sqsize, kato_ms, 0, data)
}

/// [`connect`] with Connect Attributes: [`CATTR_SQFLOW_DISABLE`] asks the controller to
/// disable SQ flow control on the queue (NVMe over Fabrics 1.1 §3.3; Linux's `nvme connect
/// --disable-sqflow`), so that a successful read may end with a C2HData carrying SUCCESS and
/// no response capsule (NVMe/TCP 1.0 §3.6.2.9).
///
/// # Errors
/// As [`connect`].
pub fn connect_with_cattr(
    qid: u16,
    sqsize: u16,
    kato_ms: u32,
    cattr: u8,
    data: &ConnectData,
) -> Result<(Sqe, [u8; CONNECT_DATA_LEN]), WireError> {
    let bytes = data.encode()?;
    let f = FabricsCommand {
        cid: 0,
        flags: PSDT_SGL,
        sgl: Sgl::Transport { length: 0 },
        kind: FabricsKind::Connect(Connect {
            recfmt: 0,
            qid,
            sqsize,
            cattr,
            kato: kato_ms,
        }),
    };
    Ok((f.to_sqe(), bytes))
}

/// Property Get (NVMe over Fabrics 1.1 §3.4).
#[must_use]
pub fn property_get(property: Property) -> Sqe {
    FabricsCommand {
        cid: 0,
        flags: PSDT_SGL,
        sgl: Sgl::Transport { length: 0 },
        kind: FabricsKind::PropertyGet(PropertyGet {
            size8: property.is_8_bytes().unwrap_or(false),
            property,
        }),
    }
    .to_sqe()
}

/// Property Set (NVMe over Fabrics 1.1 §3.5) of a 4-byte property.
#[must_use]
pub fn property_set(property: Property, value: u32) -> Sqe {
    FabricsCommand {
        cid: 0,
        flags: PSDT_SGL,
        sgl: Sgl::Transport { length: 0 },
        kind: FabricsKind::PropertySet(PropertySet {
            size8: false,
            property,
            value: u64::from(value),
        }),
    }
    .to_sqe()
}

/// Identify with `cns` for `nsid` (4096 bytes come back).
#[must_use]
pub fn identify(cns: u32, nsid: u32) -> Sqe {
    let mut s = sqe(ADMIN_IDENTIFY);
    s.nsid = nsid;
    s.cdw[0] = cns;
    s
}

/// Set Features, Number of Queues: `n` I/O submission and completion queues.
#[must_use]
pub fn set_number_of_queues(n: u16) -> Sqe {
    let mut s = sqe(ADMIN_SET_FEATURES);
    let z = u32::from(n.max(1) - 1);
    s.cdw[0] = FID_NUMBER_OF_QUEUES;
    s.cdw[1] = z << 16 | z;
    s
}

/// Keep Alive (NVMe Base 2.0 §5.25).
#[must_use]
pub fn keep_alive() -> Sqe {
    sqe(ADMIN_KEEP_ALIVE)
}

/// Get Log Page `lid`: `len` bytes (a multiple of 4, at least 4) from byte `offset`.
#[must_use]
pub fn get_log_page(lid: u8, len: u32, offset: u64) -> Sqe {
    let mut s = sqe(ADMIN_GET_LOG_PAGE);
    let numd = (len / 4).max(1) - 1;
    s.cdw[0] = u32::from(lid) | (numd & 0xffff) << 16;
    s.cdw[1] = numd >> 16;
    s.cdw[2] = (offset & 0xffff_ffff) as u32;
    s.cdw[3] = (offset >> 32) as u32;
    s
}

/// Read or Write of `blocks` (1..=65536) logical blocks at `lba` of namespace `nsid`.
#[must_use]
pub fn rw(write: bool, nsid: u32, lba: u64, blocks: u32) -> Sqe {
    let mut s = sqe(if write { NVM_WRITE } else { NVM_READ });
    s.nsid = nsid;
    s.cdw[0] = (lba & 0xffff_ffff) as u32;
    s.cdw[1] = (lba >> 32) as u32;
    s.cdw[2] = blocks.saturating_sub(1) & 0xffff;
    s
}

/// Flush of namespace `nsid`.
#[must_use]
pub fn flush(nsid: u32) -> Sqe {
    let mut s = sqe(NVM_FLUSH);
    s.nsid = nsid;
    s
}

/// Reservation Register (NVMe Base 2.0 §7.3) on namespace `nsid`: RREGA 0 register `nrkey`,
/// 1 unregister, 2 replace `crkey` by `nrkey`; IEKEY; CPTPL "no change". Returns the SQE and
/// its 16 bytes of data (CRKEY, NRKEY).
#[must_use]
pub fn resv_register(nsid: u32, rrega: u8, iekey: bool, crkey: u64, nrkey: u64) -> (Sqe, [u8; 16]) {
    let mut s = sqe(NVM_RESV_REGISTER);
    s.nsid = nsid;
    s.cdw[0] = u32::from(rrega & 0x7) | u32::from(iekey) << 3;
    (s, keys(crkey, nrkey))
}

/// Reservation Acquire (§7.2): RACQA 0 acquire, 1 preempt, 2 preempt and abort, of type
/// `rtype` (1..=6); data CRKEY, PRKEY.
#[must_use]
pub fn resv_acquire(nsid: u32, racqa: u8, rtype: u8, crkey: u64, prkey: u64) -> (Sqe, [u8; 16]) {
    let mut s = sqe(NVM_RESV_ACQUIRE);
    s.nsid = nsid;
    s.cdw[0] = u32::from(racqa & 0x7) | u32::from(rtype) << 8;
    (s, keys(crkey, prkey))
}

/// Reservation Release (§7.4): RRELA 0 release the reservation of type `rtype`, 1 clear;
/// data CRKEY.
#[must_use]
pub fn resv_release(nsid: u32, rrela: u8, rtype: u8, crkey: u64) -> (Sqe, [u8; 8]) {
    let mut s = sqe(NVM_RESV_RELEASE);
    s.nsid = nsid;
    s.cdw[0] = u32::from(rrela & 0x7) | u32::from(rtype) << 8;
    (s, crkey.to_le_bytes())
}

/// Reservation Report (§7.5) of `len` bytes (a multiple of 4), extended data structure.
#[must_use]
pub fn resv_report(nsid: u32, len: u32) -> Sqe {
    let mut s = sqe(NVM_RESV_REPORT);
    s.nsid = nsid;
    s.cdw[0] = (len / 4).max(1) - 1;
    s.cdw[1] = 1;
    s
}

fn keys(a: u64, b: u64) -> [u8; 16] {
    let mut d = [0u8; 16];
    d[..8].copy_from_slice(&a.to_le_bytes());
    d[8..].copy_from_slice(&b.to_le_bytes());
    d
}

/// One registrant of a [`ResvReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ResvRegistrant {
    pub cntlid: u16,
    /// Holds the reservation (RCSTS bit 0).
    pub holds: bool,
    pub rkey: u64,
    pub hostid: [u8; 16],
}

/// The Reservation Status Extended Data Structure (§7.5) a Reservation Report returns.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResvReport {
    pub generation: u32,
    /// RTYPE, 0 for none.
    pub rtype: u8,
    pub registrants: Vec<ResvRegistrant>,
}

impl ResvReport {
    /// Parses as many registrants as REGCTL says and `b` holds.
    #[must_use]
    pub fn parse(b: &[u8]) -> Self {
        let n = usize::from(le16(b, 5));
        let registrants = (0..n)
            .map(|i| 64 + 64 * i)
            .take_while(|&at| b.len() >= at + 64)
            .map(|at| {
                let mut hostid = [0u8; 16];
                hostid.copy_from_slice(&b[at + 16..at + 32]);
                ResvRegistrant {
                    cntlid: le16(b, at),
                    holds: b[at + 2] & 1 != 0,
                    rkey: le64(b, at + 8),
                    hostid,
                }
            })
            .collect();
        Self {
            generation: le32(b, 0),
            rtype: b.get(4).copied().unwrap_or(0),
            registrants,
        }
    }
}

fn le16(b: &[u8], at: usize) -> u16 {
    b.get(at..at + 2)
        .map_or(0, |x| u16::from_le_bytes([x[0], x[1]]))
}

fn le32(b: &[u8], at: usize) -> u32 {
    b.get(at..at + 4)
        .map_or(0, |x| u32::from_le_bytes([x[0], x[1], x[2], x[3]]))
}

fn le64(b: &[u8], at: usize) -> u64 {
    u64::from(le32(b, at)) | u64::from(le32(b, at + 4)) << 32
}

/// An ASCII field, trailing blanks and NULs dropped, anything unprintable replaced.
fn text(b: &[u8], at: usize, len: usize) -> String {
    let f = b.get(at..at + len).unwrap_or(&[]);
    let end = f.iter().position(|&c| c == 0).unwrap_or(f.len());
    f[..end]
        .iter()
        .map(|&c| {
            if (0x20..0x7f).contains(&c) {
                c as char
            } else {
                '?'
            }
        })
        .collect::<String>()
        .trim_end()
        .to_owned()
}

/// CAP (NVMe Base 2.0 §3.1.4.1), the fields a host needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// MQES: largest queue size, 0's based.
    pub mqes: u16,
    /// TO: worst-case time to CSTS.RDY, in 500 ms units.
    pub to: u8,
    /// MPSMIN: the smallest memory page size is 2^(12 + MPSMIN).
    pub mpsmin: u8,
}

impl Cap {
    /// From the property's 8 bytes.
    #[must_use]
    pub fn from_u64(v: u64) -> Self {
        Self {
            mqes: (v & 0xffff) as u16,
            to: ((v >> 24) & 0xff) as u8,
            mpsmin: ((v >> 48) & 0xf) as u8,
        }
    }
}

/// CC for enabling a controller: EN, NVM command set, 4 KiB pages, 64-byte SQEs (IOSQES 6),
/// 16-byte CQEs (IOCQES 4) (NVMe Base 2.0 §3.1.4.5).
pub const CC_ENABLE: u32 = 1 | 6 << 16 | 4 << 20;
/// CC.SHN = 01b, normal shutdown, with the enable bits kept.
pub const CC_SHUTDOWN: u32 = CC_ENABLE | 1 << 14;
/// CSTS.RDY.
pub const CSTS_RDY: u32 = 1;
/// CSTS.CFS, controller fatal status.
pub const CSTS_CFS: u32 = 2;

/// Identify Controller (NVMe Base 2.0 §5.17.2.1), the fields ipsan reports and uses.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyController {
    pub vid: u16,
    pub serial: String,
    pub model: String,
    pub firmware: String,
    /// MDTS: the largest transfer is 2^MDTS minimum pages (0: no limit).
    pub mdts: u8,
    pub cntlid: u16,
    /// VER.
    pub version: u32,
    /// KAS: keep-alive granularity in 100 ms units.
    pub kas: u16,
    /// MAXCMD (fabrics): commands per queue at most (0: not reported).
    pub maxcmd: u16,
    /// NN: the largest namespace ID.
    pub nn: u32,
    pub subnqn: String,
    /// IOCCSZ: I/O command capsule size in 16-byte units (SQE included).
    pub ioccsz: u32,
}

impl IdentifyController {
    /// Parses the 4096-byte data (short data reads as zeros).
    #[must_use]
    pub fn parse(b: &[u8]) -> Self {
        Self {
            vid: le16(b, 0),
            serial: text(b, 4, 20),
            model: text(b, 24, 40),
            firmware: text(b, 64, 8),
            mdts: b.get(77).copied().unwrap_or(0),
            cntlid: le16(b, 78),
            version: le32(b, 80),
            kas: le16(b, 320),
            maxcmd: le16(b, 514),
            nn: le32(b, 516),
            subnqn: text(b, 768, 256),
            ioccsz: le32(b, 1792),
        }
    }

    /// In-capsule data bytes an I/O command may carry (IOCCSZ × 16 − 64).
    #[must_use]
    pub fn in_capsule_bytes(&self) -> usize {
        (self.ioccsz as usize * 16).saturating_sub(64)
    }

    /// VER as `major.minor.tertiary`.
    #[must_use]
    pub fn version_string(&self) -> String {
        format!(
            "{}.{}.{}",
            self.version >> 16,
            (self.version >> 8) & 0xff,
            self.version & 0xff
        )
    }
}

/// Identify Namespace (NVM Command Set 1.0 §4.1.5.1), size and format.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct IdentifyNamespace {
    /// NSZE: size in logical blocks.
    pub nsze: u64,
    /// NCAP.
    pub ncap: u64,
    /// The logical block size of the format in use (2^LBADS).
    pub block_len: u32,
    /// Metadata bytes per block of the format in use.
    pub metadata: u16,
    pub nguid: [u8; 16],
    pub eui64: [u8; 8],
}

impl IdentifyNamespace {
    /// Parses the 4096-byte data; `None` when the LBA format in use is not valid (LBADS below
    /// 9 or above 16, or an inactive namespace with NSZE 0).
    #[must_use]
    pub fn parse(b: &[u8]) -> Option<Self> {
        let nsze = le64(b, 0);
        let nlbaf = b.get(25).copied().unwrap_or(0);
        let flbas = b.get(26).copied().unwrap_or(0);
        let mut idx = usize::from(flbas & 0x0f);
        if nlbaf >= 16 {
            idx |= usize::from((flbas >> 5) & 0x3) << 4;
        }
        let lbaf = 128 + 4 * idx;
        let lbads = b.get(lbaf + 2).copied().unwrap_or(0);
        if nsze == 0 || !(9..=16).contains(&lbads) {
            return None;
        }
        let mut nguid = [0u8; 16];
        nguid.copy_from_slice(b.get(104..120)?);
        let mut eui64 = [0u8; 8];
        eui64.copy_from_slice(b.get(120..128)?);
        Some(Self {
            nsze,
            ncap: le64(b, 8),
            block_len: 1 << lbads,
            metadata: le16(b, lbaf),
            nguid,
            eui64,
        })
    }
}

/// The active namespace list: NSIDs in increasing order, up to the first zero.
#[must_use]
pub fn parse_ns_list(b: &[u8]) -> Vec<u32> {
    b.chunks_exact(4)
        .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .take_while(|&n| n != 0)
        .collect()
}

/// The Discovery log page header (NVMe over Fabrics 1.1 §5.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiscoveryHeader {
    /// GENCTR: changes whenever the log changes.
    pub genctr: u64,
    /// NUMREC: entries in the log.
    pub numrec: u64,
    pub recfmt: u16,
}

impl DiscoveryHeader {
    /// From the first 18 bytes of the log.
    #[must_use]
    pub fn parse(b: &[u8]) -> Self {
        Self {
            genctr: le64(b, 0),
            numrec: le64(b, 8),
            recfmt: le16(b, 16),
        }
    }
}

/// One Discovery log page entry (1024 bytes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DiscoveryEntry {
    /// TRTYPE: 3 is TCP.
    pub trtype: u8,
    /// ADRFAM: 1 IPv4, 2 IPv6.
    pub adrfam: u8,
    /// SUBTYPE: 1 a referral to another discovery subsystem, 2 an NVM subsystem, 3 the current
    /// discovery subsystem.
    pub subtype: u8,
    /// TREQ: bits 1:0 secure channel (00b not specified, 01b required, 10b not required).
    pub treq: u8,
    pub portid: u16,
    pub cntlid: u16,
    pub asqsz: u16,
    pub trsvcid: String,
    pub subnqn: String,
    pub traddr: String,
    /// TSAS for TCP: byte 0 SECTYPE (0 none, 1 TLS 1.2, 2 TLS 1.3).
    pub sectype: u8,
}

impl DiscoveryEntry {
    /// From one 1024-byte entry.
    #[must_use]
    pub fn parse(b: &[u8]) -> Self {
        Self {
            trtype: b.first().copied().unwrap_or(0),
            adrfam: b.get(1).copied().unwrap_or(0),
            subtype: b.get(2).copied().unwrap_or(0),
            treq: b.get(3).copied().unwrap_or(0),
            portid: le16(b, 4),
            cntlid: le16(b, 6),
            asqsz: le16(b, 8),
            trsvcid: text(b, 32, 32),
            subnqn: text(b, 256, 256),
            traddr: text(b, 512, 256),
            sectype: b.get(768).copied().unwrap_or(0),
        }
    }

    /// SUBTYPE as a word.
    #[must_use]
    pub fn subtype_name(&self) -> &'static str {
        match self.subtype {
            1 => "referral",
            2 => "nvme subsystem",
            3 => "current discovery subsystem",
            _ => "unknown",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_command_encodes_slba_and_zero_based_nlb() {
        let s = rw(false, 1, 0x1_0000_0002, 8);
        assert_eq!(s.opcode, NVM_READ);
        assert_eq!(s.nsid, 1);
        assert_eq!(s.cdw[0], 2);
        assert_eq!(s.cdw[1], 1);
        assert_eq!(s.cdw[2], 7);
    }

    #[test]
    fn get_log_page_counts_dwords_zero_based() {
        let s = get_log_page(LID_DISCOVERY, 4096, 1024);
        assert_eq!(s.cdw[0], 0x70 | 1023 << 16);
        assert_eq!(s.cdw[2], 1024);
    }

    #[test]
    fn identify_namespace_reads_the_format_in_use() {
        let mut b = vec![0u8; 4096];
        b[0..8].copy_from_slice(&1000u64.to_le_bytes());
        b[25] = 1; // two formats
        b[26] = 1; // the second in use
        b[128 + 2] = 9;
        b[132 + 2] = 12;
        let ns = IdentifyNamespace::parse(&b).unwrap();
        assert_eq!(ns.block_len, 4096);
        assert_eq!(ns.nsze, 1000);
        b[132 + 2] = 30;
        assert!(IdentifyNamespace::parse(&b).is_none());
    }
}
