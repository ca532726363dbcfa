#![allow(clippy::unwrap_used, clippy::expect_used)]
//! Black-box tests of `LogicalUnit::execute`: every handler's happy path and rejections,
//! with CDBs as byte literals.

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use ipsan_scsi::backend::{Backend, MemBackend};
use ipsan_scsi::{
    CommandInfo, DataDirection, LogicalUnit, LuConfig, NexusId, ResetKind, ScsiRequest,
    ScsiResponse, ScsiStatus, SenseKey,
};

/// Wraps a backend, counting flushes and optionally failing writes with an OS error.
#[derive(Debug)]
struct Probe {
    inner: MemBackend,
    flushes: AtomicUsize,
    fail_write: Option<i32>,
}

impl Probe {
    fn new(size: u64) -> Arc<Self> {
        Arc::new(Self {
            inner: MemBackend::new(size),
            flushes: AtomicUsize::new(0),
            fail_write: None,
        })
    }
    fn failing(size: u64, errno: i32) -> Arc<Self> {
        Arc::new(Self {
            inner: MemBackend::new(size),
            flushes: AtomicUsize::new(0),
            fail_write: Some(errno),
        })
    }
    fn flushes(&self) -> usize {
        self.flushes.load(Ordering::SeqCst)
    }
}

impl Backend for Probe {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        if let Some(e) = self.fail_write {
            return Err(io::Error::from_raw_os_error(e));
        }
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        self.flushes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.unmap(offset, len)
    }
    fn kind(&self) -> &'static str {
        "mem"
    }
    fn supports_unmap(&self) -> bool {
        true
    }
    fn extent(&self, offset: u64) -> io::Result<ipsan_scsi::Extent> {
        self.inner.extent(offset)
    }
}

const BS: usize = 512;
const SIZE: u64 = 16 << 20; // 32768 blocks

fn lu_with(b: Arc<dyn Backend>, f: impl FnOnce(&mut LuConfig)) -> LogicalUnit {
    let mut cfg = LuConfig::with_serial("SN0001");
    f(&mut cfg);
    LogicalUnit::new(b, cfg).unwrap()
}

fn lu() -> (LogicalUnit, Arc<Probe>) {
    let p = Probe::new(SIZE);
    (lu_with(p.clone(), |_| {}), p)
}

fn a() -> NexusId {
    NexusId("iqn.2026-01.test:a,i,0x000000000001".into())
}
fn b() -> NexusId {
    NexusId("iqn.2026-01.test:b,i,0x000000000002".into())
}

fn run(lu: &LogicalUnit, cdb: &[u8], data: &[u8]) -> ScsiResponse {
    run_as(lu, &a(), cdb, data)
}
fn run_as(lu: &LogicalUnit, n: &NexusId, cdb: &[u8], data: &[u8]) -> ScsiResponse {
    let mut c = cdb.to_vec();
    c.resize(16, 0);
    lu.execute(&ScsiRequest {
        cdb: &c,
        data_out: data,
        nexus: n,
        lun: 0,
        tailroom: false,
    })
}

#[track_caller]
fn good(r: &ScsiResponse) {
    assert_eq!(r.status, ScsiStatus::GOOD, "sense: {:?}", r.sense);
}
#[track_caller]
fn check(r: &ScsiResponse, key: SenseKey, asc: u8, ascq: u8) {
    assert_eq!(r.status, ScsiStatus::CHECK_CONDITION);
    let s = r.sense.as_ref().unwrap();
    assert_eq!((s.key, s.asc, s.ascq), (key, asc, ascq), "{s:?}");
}
const IR: SenseKey = SenseKey::ILLEGAL_REQUEST;

fn rw10(op: u8, flags: u8, lba: u32, n: u16) -> Vec<u8> {
    let mut c = vec![op, flags];
    c.extend_from_slice(&lba.to_be_bytes());
    c.push(0);
    c.extend_from_slice(&n.to_be_bytes());
    c.push(0);
    c
}
fn rw16(op: u8, flags: u8, lba: u64, n: u32) -> Vec<u8> {
    let mut c = vec![op, flags];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&n.to_be_bytes());
    c.extend_from_slice(&[0, 0]);
    c
}
fn write(lu: &LogicalUnit, lba: u32, data: &[u8]) {
    good(&run(
        lu,
        &rw10(0x2A, 0, lba, (data.len() / BS) as u16),
        data,
    ));
}
fn read(lu: &LogicalUnit, lba: u32, n: u16) -> Vec<u8> {
    let r = run(lu, &rw10(0x28, 0, lba, n), &[]);
    good(&r);
    r.data_in.to_vec()
}
fn inquiry(lu: &LogicalUnit, evpd: bool, page: u8, alloc: u16) -> ScsiResponse {
    let [h, l] = alloc.to_be_bytes();
    run(lu, &[0x12, u8::from(evpd), page, h, l, 0], &[])
}
fn unmap_list(descs: &[(u64, u32)]) -> Vec<u8> {
    let mut v = vec![0u8; 8];
    v[0..2].copy_from_slice(&((6 + 16 * descs.len()) as u16).to_be_bytes());
    v[2..4].copy_from_slice(&((16 * descs.len()) as u16).to_be_bytes());
    for &(lba, n) in descs {
        v.extend_from_slice(&lba.to_be_bytes());
        v.extend_from_slice(&n.to_be_bytes());
        v.extend_from_slice(&[0; 4]);
    }
    v
}
fn unmap_cdb(len: u16) -> Vec<u8> {
    let [h, l] = len.to_be_bytes();
    vec![0x42, 0, 0, 0, 0, 0, 0, h, l, 0]
}

// ---------------------------------------------------------------------------- basics

#[test]
fn accepts_write_then_read_roundtrip_all_sizes() {
    let (lu, _) = lu();
    let data: Vec<u8> = (0..4 * BS).map(|i| (i % 251) as u8).collect();
    write(&lu, 7, &data);
    assert_eq!(read(&lu, 7, 4), data);
    // READ(6), READ(12), READ(16) see the same bytes.
    let r6 = run(&lu, &[0x08, 0, 0, 7, 4, 0], &[]);
    assert_eq!(r6.data_in.to_vec(), data);
    let r12 = run(&lu, &[0xA8, 0, 0, 0, 0, 7, 0, 0, 0, 4, 0, 0], &[]);
    assert_eq!(r12.data_in.to_vec(), data);
    let r16 = run(&lu, &rw16(0x88, 0, 7, 4), &[]);
    assert_eq!(r16.data_in.to_vec(), data);
    // WRITE(16) then READ(10).
    good(&run(&lu, &rw16(0x8A, 0, 100, 1), &[0x42; BS]));
    assert_eq!(read(&lu, 100, 1), vec![0x42; BS]);
    // WRITE(6) with transfer length 0 means 256 blocks.
    good(&run(&lu, &[0x0A, 0, 1, 0, 0, 0], &vec![9u8; 256 * BS]));
    assert_eq!(read(&lu, 256, 256), vec![9u8; 256 * BS]);
}

#[test]
fn rejects_lba_out_of_range() {
    let (lu, _) = lu();
    let n = lu.num_blocks();
    check(&run(&lu, &rw10(0x28, 0, n as u32, 1), &[]), IR, 0x21, 0);
    check(&run(&lu, &rw10(0x28, 0, n as u32 - 1, 2), &[]), IR, 0x21, 0);
    check(&run(&lu, &rw16(0x88, 0, u64::MAX, 2), &[]), IR, 0x21, 0);
    check(
        &run(&lu, &rw10(0x2A, 0, n as u32, 1), &[0; BS]),
        IR,
        0x21,
        0,
    );
    good(&run(&lu, &rw10(0x28, 0, n as u32 - 1, 1), &[]));
    // Zero-length transfers are fine inside the LU.
    good(&run(&lu, &rw10(0x28, 0, 0, 0), &[]));
}

#[test]
fn rejects_transfer_over_block_limits_max() {
    let lu = lu_with(Arc::new(MemBackend::new(1 << 30)), |_| {});
    let max = lu.limits().max_transfer;
    let r = run(&lu, &rw16(0x88, 0, 0, max + 1), &[]);
    check(&r, IR, 0x24, 0);
}

#[test]
fn rejects_short_data_out_and_writes_nothing() {
    let (lu, _) = lu();
    let r = run(&lu, &rw10(0x2A, 0, 0, 2), &[0xFF; BS]);
    assert_eq!(r.status, ScsiStatus::CHECK_CONDITION);
    assert_eq!(read(&lu, 0, 2), vec![0; 2 * BS]);
}

#[test]
fn rejects_unknown_opcode_with_invalid_command_operation_code() {
    let (lu, _) = lu();
    check(&run(&lu, &[0x04, 0, 0, 0, 0, 0], &[]), IR, 0x20, 0);
    check(&run(&lu, &[0xE8], &[]), IR, 0x20, 0);
}

#[test]
fn rejects_writes_to_read_only_lu() {
    let lu = lu_with(Probe::new(SIZE), |c| c.read_only = true);
    check(
        &run(&lu, &rw10(0x2A, 0, 0, 1), &[0; BS]),
        SenseKey::DATA_PROTECT,
        0x27,
        0,
    );
    let ms = run(&lu, &[0x1A, 0, 0x3F, 0, 255, 0], &[]);
    assert_eq!(ms.data_in[2] & 0x80, 0x80, "WP bit");
    check(
        &run(&lu, &rw16(0x93, 0x08, 0, 1), &[0; BS]),
        SenseKey::DATA_PROTECT,
        0x27,
        0,
    );
    let mut ws = rw16(0x93, 0x08, 0, 1);
    ws.resize(16, 0);
    let e = lu.command_info(&ws).unwrap_err();
    assert_eq!(
        (e.key, e.asc),
        (SenseKey::DATA_PROTECT, 0x27),
        "before any data moves"
    );
    let mut rd = rw10(0x28, 0, 0, 1);
    rd.resize(16, 0);
    assert!(lu.command_info(&rd).is_ok());
}

#[test]
fn maps_enospc_to_space_allocation_failed_write_protect() {
    let lu = lu_with(Probe::failing(SIZE, libc::ENOSPC), |_| {});
    check(
        &run(&lu, &rw10(0x2A, 0, 0, 1), &[1; BS]),
        SenseKey::DATA_PROTECT,
        0x27,
        0x07,
    );
    let lu = lu_with(Probe::failing(SIZE, libc::EIO), |_| {});
    check(
        &run(&lu, &rw10(0x2A, 0, 0, 1), &[1; BS]),
        SenseKey::MEDIUM_ERROR,
        0x0C,
        0x00,
    );
}

/// The typed command is the LU's only reading of a command: `execute_decoded` runs the
/// decoded command and never parses the CDB bytes again (here a garbage CDB rides along).
#[test]
fn accepts_a_decoded_command_without_parsing_its_cdb_again() {
    let (lu, _) = lu();
    good(&run(&lu, &rw10(0x2A, 0, 3, 1), &[0x5A; 512]));
    let mut read = rw10(0x28, 0, 3, 1);
    read.resize(16, 0);
    let info = lu.command_info(&read).unwrap();
    let garbage = [0xFFu8; 16];
    assert!(
        lu.command_info(&garbage).is_err(),
        "the bytes alone are refused"
    );
    let r = lu.execute_decoded(
        &ScsiRequest {
            cdb: &garbage,
            data_out: &[],
            nexus: &a(),
            lun: 0,
            tailroom: false,
        },
        &info,
    );
    good(&r);
    assert_eq!(
        &r.data_in[..],
        &[0x5A; 512][..],
        "the decoded READ(10) of LBA 3 ran"
    );
    // The submit/complete path too.
    let r = ipsan_scsi::aio::block_on(lu.execute_async_decoded(
        ipsan_scsi::OwnedRequest {
            cdb: garbage.to_vec(),
            data_out: bytes::Bytes::new(),
            nexus: a(),
            lun: 0,
            tag: 1,
        },
        &info,
    ));
    good(&r);
    assert_eq!(&r.data_in[..], &[0x5A; 512][..]);
}

#[test]
fn command_info_reports_direction_and_data_out_length() {
    let (lu, _) = lu();
    let w = |c: &[u8]| {
        let mut v = c.to_vec();
        v.resize(16, 0);
        lu.command_info(&v).unwrap()
    };
    let write: CommandInfo = w(&rw10(0x2A, 0, 0, 8));
    assert_eq!(
        (write.direction, write.data_out_len, write.extent),
        (DataDirection::Write, 8 * 512, (0, 8))
    );
    assert_eq!(w(&rw10(0x28, 0, 0, 8)).direction, DataDirection::Read);
    assert_eq!(w(&[0x00]).direction, DataDirection::None);
    let mut caw = rw16(0x89, 0, 0, 0);
    caw[13] = 2;
    caw[14] = 0;
    assert_eq!(w(&caw).data_out_len, 4 * 512);
    assert_eq!(w(&unmap_cdb(24)).data_out_len, 24);
    assert_eq!(
        w(&rw16(0x93, 0x01, 0, 5)).direction,
        DataDirection::None,
        "NDOB"
    );
    assert_eq!(w(&rw10(0x41, 0, 0, 5)).data_out_len, 512);
    assert_eq!(w(&rw10(0x2F, 0x02, 0, 3)).data_out_len, 3 * 512);
    assert_eq!(w(&rw10(0x2F, 0x06, 0, 3)).data_out_len, 512);
    assert_eq!(w(&rw10(0x2F, 0x00, 0, 3)).direction, DataDirection::None);
    assert!(lu
        .command_info(&[0x28, 0x20, 0, 0, 0, 0, 0, 0, 1, 0])
        .is_err());
}

// ---------------------------------------------------------------------------- FUA / flush

#[test]
fn fua_write_flushes_before_good() {
    let (lu, p) = lu();
    write(&lu, 0, &[1; BS]);
    assert_eq!(
        p.flushes(),
        0,
        "write-back cache: plain write does not flush"
    );
    good(&run(&lu, &rw10(0x2A, 0x08, 0, 1), &[1; BS]));
    assert_eq!(p.flushes(), 1);
    good(&run(&lu, &rw16(0x8A, 0x08, 0, 1), &[1; BS]));
    assert_eq!(p.flushes(), 2);
}

#[test]
fn write_through_lu_flushes_every_write() {
    let p = Probe::new(SIZE);
    let lu = lu_with(p.clone(), |c| c.write_cache = false);
    write(&lu, 0, &[1; BS]);
    assert_eq!(p.flushes(), 1);
    let ms = run(&lu, &[0x1A, 0x08, 0x08, 0, 255, 0], &[]);
    assert_eq!(ms.data_in[4 + 2] & 0x04, 0, "WCE clear");
}

#[test]
fn synchronize_cache_flushes_and_honours_immed() {
    let (lu, p) = lu();
    good(&run(&lu, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    assert_eq!(p.flushes(), 1);
    good(&run(&lu, &rw16(0x91, 0, 0, 0), &[]));
    assert_eq!(p.flushes(), 2);
    good(&run(&lu, &[0x35, 0x02, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    let t0 = std::time::Instant::now();
    while p.flushes() < 3 && t0.elapsed() < std::time::Duration::from_secs(5) {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert_eq!(p.flushes(), 3, "IMMED flush still happens");
    check(
        &run(&lu, &rw10(0x35, 0, lu.num_blocks() as u32, 1), &[]),
        IR,
        0x21,
        0,
    );
}

// ---------------------------------------------------------------------------- INQUIRY

#[test]
fn standard_inquiry_claims_spc4_sbc3_and_is_ascii() {
    let (lu, _) = lu();
    let r = inquiry(&lu, false, 0, 255);
    good(&r);
    let d = &r.data_in;
    assert_eq!(d.len(), 96);
    assert_eq!(d[0], 0);
    assert_eq!(d[2], 6);
    assert_eq!(d[3] & 0x0F, 2);
    assert_eq!(d[4] as usize, d.len() - 5);
    assert_eq!(&d[8..16], b"IPSAN   ");
    assert!(d[8..36].iter().all(|&c| (0x20..=0x7E).contains(&c)));
    let vds: Vec<u16> = d[58..74]
        .chunks(2)
        .map(|c| u16::from_be_bytes([c[0], c[1]]))
        .collect();
    assert!(vds.contains(&0x0460) && vds.contains(&0x04C0));
    assert_eq!(
        inquiry(&lu, false, 0, 5).data_in.len(),
        5,
        "allocation length truncates"
    );
    check(&inquiry(&lu, false, 0x80, 255), IR, 0x24, 0);
}

#[test]
fn vpd_pages_are_listed_sorted_and_answer() {
    let (lu, _) = lu();
    let r = inquiry(&lu, true, 0, 255);
    let pages = r.data_in[4..].to_vec();
    assert_eq!(pages, vec![0x00, 0x80, 0x83, 0xB0, 0xB1, 0xB2]);
    for p in pages {
        let r = inquiry(&lu, true, p, 255);
        good(&r);
        assert_eq!(r.data_in[1], p);
        assert_eq!(
            u16::from_be_bytes([r.data_in[2], r.data_in[3]]) as usize + 4,
            r.data_in.len()
        );
    }
    check(&inquiry(&lu, true, 0x89, 255), IR, 0x24, 0);
    assert_eq!(&inquiry(&lu, true, 0x80, 255).data_in[4..], b"SN0001");
}

#[test]
fn vpd_83_has_naa_t10_and_caller_designators() {
    let p = Probe::new(SIZE);
    let extra = ipsan_scsi::inquiry::relative_port_designator(1);
    let lu = lu_with(p, |c| c.extra_designators = vec![extra.clone()]);
    let d = inquiry(&lu, true, 0x83, 1024).data_in;
    let mut i = 4;
    let mut seen = Vec::new();
    while i < d.len() {
        let len = d[i + 3] as usize;
        seen.push((d[i] & 0x0F, d[i + 1] & 0x0F, d[i + 1] >> 4 & 3));
        if d[i + 1] & 0x0F == 3 {
            assert_eq!(len, 16);
            assert_eq!(d[i + 4] >> 4, 6, "NAA 6");
        }
        i += 4 + len;
    }
    assert_eq!(i, d.len());
    assert_eq!(seen, vec![(1, 3, 0), (2, 1, 0), (1, 4, 1)]);
}

#[test]
fn vpd_block_limits_and_provisioning_reflect_thin() {
    let (lu, _) = lu();
    let b0 = inquiry(&lu, true, 0xB0, 255).data_in;
    assert_eq!(b0[3], 0x3C);
    assert_eq!(b0[5], 255, "max compare and write");
    let be32 = |o: usize| u32::from_be_bytes(b0[o..o + 4].try_into().unwrap());
    assert_eq!(be32(8), lu.limits().max_transfer);
    assert!(be32(20) > 0 && be32(20) <= 1 << 20, "max unmap lba count");
    assert!(be32(24) > 0, "max unmap descriptors");
    let b2 = inquiry(&lu, true, 0xB2, 255).data_in;
    assert_eq!(b2[5] & 0xE0, 0xE0, "LBPU LBPWS LBPWS10");
    assert_eq!(b2[5] & 0x04, 0x04, "LBPRZ");
    assert_eq!(b2[6] & 0x07, 2, "thin");
    let b1 = inquiry(&lu, true, 0xB1, 255).data_in;
    assert_eq!(u16::from_be_bytes([b1[4], b1[5]]), 1, "non-rotating");

    let thick = lu_with(Probe::new(SIZE), |c| c.thin_provisioning = false);
    let b0 = inquiry(&thick, true, 0xB0, 255).data_in;
    assert_eq!(&b0[20..28], &[0; 8], "no unmap limits without LBPU");
    assert_eq!(inquiry(&thick, true, 0xB2, 255).data_in[5], 0);
    check(
        &run(&thick, &unmap_cdb(24), &unmap_list(&[(0, 1)])),
        IR,
        0x20,
        0,
    );
}

// ---------------------------------------------------------------------------- capacity

#[test]
fn read_capacity_10_and_16() {
    let (lu, _) = lu();
    let r = run(&lu, &[0x25, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]);
    assert_eq!(
        r.data_in.to_vec(),
        [(32767u32).to_be_bytes(), 512u32.to_be_bytes()].concat()
    );
    let mut c = vec![0x9E, 0x10];
    c.extend_from_slice(&[0; 8]);
    c.extend_from_slice(&32u32.to_be_bytes());
    let r = run(&lu, &c, &[]);
    assert_eq!(r.data_in.len(), 32);
    assert_eq!(
        u64::from_be_bytes(r.data_in[0..8].try_into().unwrap()),
        32767
    );
    assert_eq!(r.data_in[14] & 0xC0, 0xC0, "LBPME LBPRZ");
    c[13] = 8;
    assert_eq!(run(&lu, &c, &[]).data_in.len(), 8);
    c[13] = 0;
    good(&run(&lu, &c, &[]));
}

// ---------------------------------------------------------------------------- VERIFY

#[test]
fn verify_bytchk_0_1_3_and_miscompare_offset() {
    let (lu, _) = lu();
    let data: Vec<u8> = (0..2 * BS).map(|i| i as u8).collect();
    write(&lu, 10, &data);
    good(&run(&lu, &rw10(0x2F, 0x00, 10, 2), &[]));
    good(&run(&lu, &rw10(0x2F, 0x02, 10, 2), &data));
    let mut bad = data.clone();
    bad[700] ^= 0x58;
    let r = run(&lu, &rw10(0x2F, 0x02, 10, 2), &bad);
    check(&r, SenseKey::MISCOMPARE, 0x1D, 0);
    assert_eq!(r.sense.unwrap().information, Some(700));
    // BYTCHK 3: one block compared against each block of the range.
    write(&lu, 20, &[7u8; 3 * BS]);
    good(&run(&lu, &rw16(0x8F, 0x06, 20, 3), &[7u8; BS]));
    write(&lu, 22, &[8u8; BS]);
    let r = run(&lu, &rw16(0x8F, 0x06, 20, 3), &[7u8; BS]);
    assert_eq!(r.sense.unwrap().information, Some(2 * BS as u64));
    check(
        &run(&lu, &rw10(0x2F, 0x02, lu.num_blocks() as u32, 1), &[0; BS]),
        IR,
        0x21,
        0,
    );
    check(&run(&lu, &rw10(0x2F, 0x40, 0, 1), &[]), IR, 0x24, 0);
}

#[test]
fn write_and_verify_writes() {
    let (lu, _) = lu();
    good(&run(&lu, &rw10(0x2E, 0x02, 3, 1), &[5; BS]));
    assert_eq!(read(&lu, 3, 1), vec![5; BS]);
    check(&run(&lu, &rw10(0x2E, 0x06, 3, 1), &[5; BS]), IR, 0x24, 0);
}

// ---------------------------------------------------------------------------- WRITE SAME / UNMAP

#[test]
fn write_same_repeats_the_block() {
    let (lu, _) = lu();
    let blk: Vec<u8> = (0..BS).map(|i| (i * 7) as u8).collect();
    good(&run(&lu, &rw10(0x41, 0, 5, 300), &blk));
    let back = read(&lu, 5, 300);
    for c in back.chunks(BS) {
        assert_eq!(c, &blk[..]);
    }
    assert_eq!(read(&lu, 305, 1), vec![0; BS]);
}

#[test]
fn write_same_unmap_deallocates_and_reads_zero() {
    let p = Probe::new(SIZE);
    let lu = lu_with(p.clone(), |_| {});
    write(&lu, 0, &vec![0xFF; 4096 * BS]); // 2 MiB = 2 chunks
    assert_eq!(p.inner.allocated_chunks(), 2);
    good(&run(&lu, &rw10(0x41, 0x08, 0, 4096), &[0; BS]));
    assert_eq!(p.inner.allocated_chunks(), 0, "pages freed");
    assert_eq!(read(&lu, 0, 8), vec![0; 8 * BS]);
    // NDOB + UNMAP (WRITE SAME 16)
    write(&lu, 0, &vec![0xFF; 2048 * BS]);
    good(&run(&lu, &rw16(0x93, 0x09, 0, 2048), &[]));
    assert_eq!(p.inner.allocated_chunks(), 0);
    // UNMAP deallocates whatever the data block holds; reads return zeros (LBPRZ).
    write(&lu, 0, &[3; BS]);
    good(&run(&lu, &rw10(0x41, 0x08, 0, 1), &[3; BS]));
    assert_eq!(read(&lu, 0, 1), vec![0; BS]);
    good(&run(&lu, &rw10(0x41, 0x08, 0, 2048), &[3; BS]));
    assert_eq!(p.inner.allocated_chunks(), 0);
    // Without UNMAP, zeros are written (allocating).
    good(&run(&lu, &rw10(0x41, 0x00, 0, 2048), &[0; BS]));
    assert_eq!(p.inner.allocated_chunks(), 1);
}

#[test]
fn write_same_zero_blocks_means_to_the_end_within_limits() {
    let (lu, _) = lu();
    let n = lu.num_blocks();
    write(&lu, n as u32 - 1, &[1; BS]);
    good(&run(&lu, &rw10(0x41, 0, n as u32 - 4, 0), &[0; BS]));
    assert_eq!(read(&lu, n as u32 - 1, 1), vec![0; BS]);
    check(
        &run(&lu, &rw10(0x41, 0, n as u32 + 1, 0), &[0; BS]),
        IR,
        0x21,
        0,
    );
    check(
        &run(&lu, &rw10(0x41, 0, u32::MAX, 0), &[0; BS]),
        IR,
        0x21,
        0,
    );
    // Bigger LU than MAXIMUM WRITE SAME LENGTH: 0 blocks from LBA 0 is too long.
    let big = lu_with(Arc::new(MemBackend::new(1 << 30)), |_| {});
    assert!(big.num_blocks() > big.limits().max_write_same);
    check(&run(&big, &rw10(0x41, 0, 0, 0), &[0; BS]), IR, 0x24, 0);
}

#[test]
fn write_same_rejects_anchor_and_lbdata() {
    let (lu, _) = lu();
    check(&run(&lu, &rw10(0x41, 0x18, 0, 1), &[0; BS]), IR, 0x24, 0);
    check(&run(&lu, &rw10(0x41, 0x02, 0, 1), &[0; BS]), IR, 0x24, 0);
}

#[test]
fn unmap_deallocates_listed_ranges() {
    let p = Probe::new(SIZE);
    let lu = lu_with(p.clone(), |_| {});
    write(&lu, 0, &vec![0xAA; 4096 * BS]);
    let list = unmap_list(&[(0, 2048), (2048, 2048)]);
    good(&run(&lu, &unmap_cdb(list.len() as u16), &list));
    assert_eq!(p.inner.allocated_chunks(), 0);
    assert_eq!(read(&lu, 100, 1), vec![0; BS]);
    // Sub-chunk unmap still reads back zeros.
    write(&lu, 0, &[0xAA; 4 * BS]);
    let list = unmap_list(&[(1, 2)]);
    good(&run(&lu, &unmap_cdb(list.len() as u16), &list));
    let back = read(&lu, 0, 4);
    assert_eq!(&back[..BS], &[0xAA; BS][..]);
    assert_eq!(&back[BS..3 * BS], &vec![0; 2 * BS][..]);
    assert_eq!(&back[3 * BS..], &[0xAA; BS][..]);
}

#[test]
fn unmap_validates_the_parameter_list() {
    let (lu, _) = lu();
    let n = lu.num_blocks();
    good(&run(&lu, &unmap_cdb(0), &[]));
    check(&run(&lu, &unmap_cdb(6), &[0; 6]), IR, 0x1A, 0);
    // Range check before anything is unmapped.
    write(&lu, 0, &[1; BS]);
    let list = unmap_list(&[(0, 1), (n - 1, 2)]);
    check(&run(&lu, &unmap_cdb(list.len() as u16), &list), IR, 0x21, 0);
    assert_eq!(read(&lu, 0, 1), vec![1; BS], "nothing unmapped on error");
    let list = unmap_list(&[(u64::MAX, 1)]);
    check(&run(&lu, &unmap_cdb(list.len() as u16), &list), IR, 0x21, 0);
    // Over MAXIMUM UNMAP LBA COUNT / DESCRIPTOR COUNT.
    let big = lu_with(Arc::new(MemBackend::new(4 << 30)), |_| {});
    let max = big.limits().max_unmap_lba;
    let list = unmap_list(&[(0, max + 1)]);
    check(
        &run(&big, &unmap_cdb(list.len() as u16), &list),
        IR,
        0x26,
        0,
    );
    let many: Vec<(u64, u32)> = (0..=big.limits().max_unmap_descriptors as u64)
        .map(|i| (i, 0))
        .collect();
    let list = unmap_list(&many);
    check(
        &run(&big, &unmap_cdb(list.len() as u16), &list),
        IR,
        0x26,
        0,
    );
    // Anchor is not supported.
    let mut c = unmap_cdb(24);
    c[1] = 1;
    check(&run(&lu, &c, &unmap_list(&[(0, 1)])), IR, 0x24, 0);
    // Zero-block descriptors, even at the last LBA, are fine.
    let list = unmap_list(&[(n, 0)]);
    good(&run(&lu, &unmap_cdb(list.len() as u16), &list));
}

#[test]
fn file_backed_unmap_punches_a_hole() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("lu.img");
    let spec = format!("file:{},size=16MiB", path.display())
        .parse()
        .unwrap();
    let lu = lu_with(ipsan_scsi::open(&spec).unwrap(), |_| {});
    write(&lu, 0, &vec![0x11; 8192 * BS]); // 4 MiB
    good(&run(&lu, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    let before = std::fs::metadata(&path).unwrap().blocks();
    let list = unmap_list(&[(0, 8192)]);
    good(&run(&lu, &unmap_cdb(list.len() as u16), &list));
    let after = std::fs::metadata(&path).unwrap().blocks();
    assert!(after + 8000 <= before, "{before} -> {after}");
    assert_eq!(read(&lu, 0, 8), vec![0; 8 * BS]);
    let st = get_lba_status(&lu, 0);
    assert_eq!(st[20], 1, "deallocated");
    write(&lu, 0, &[1; 8 * BS]);
    assert_eq!(get_lba_status(&lu, 0)[20], 0, "mapped again");
}

fn get_lba_status(lu: &LogicalUnit, lba: u64) -> Vec<u8> {
    let mut c = vec![0x9E, 0x12];
    c.extend_from_slice(&lba.to_be_bytes());
    c.extend_from_slice(&24u32.to_be_bytes());
    let r = run(lu, &c, &[]);
    good(&r);
    r.data_in.to_vec()
}

#[test]
fn get_lba_status_reports_mapped_and_deallocated() {
    let (lu, _) = lu();
    let d = get_lba_status(&lu, 5);
    assert_eq!(u64::from_be_bytes(d[8..16].try_into().unwrap()), 5);
    assert_eq!(d[20], 1, "never written: deallocated");
    write(&lu, 0, &[1; BS]);
    let d = get_lba_status(&lu, 5);
    assert_eq!(d[20], 0, "same 1 MiB page: mapped");
    assert_eq!(u32::from_be_bytes(d[16..20].try_into().unwrap()), 2048 - 5);
    let mut c = vec![0x9E, 0x12];
    c.extend_from_slice(&lu.num_blocks().to_be_bytes());
    c.extend_from_slice(&24u32.to_be_bytes());
    check(&run(&lu, &c, &[]), IR, 0x21, 0);
}

// ---------------------------------------------------------------------------- COMPARE AND WRITE

fn caw(lba: u64, n: u8) -> Vec<u8> {
    let mut c = rw16(0x89, 0, lba, 0);
    c[13] = n;
    c
}

#[test]
fn compare_and_write_writes_on_match_and_reports_offset_on_miscompare() {
    let (lu, _) = lu();
    write(&lu, 4, &[1; 2 * BS]);
    let mut data = vec![1u8; 2 * BS];
    data.extend(vec![2u8; 2 * BS]);
    good(&run(&lu, &caw(4, 2), &data));
    assert_eq!(read(&lu, 4, 2), vec![2; 2 * BS]);
    // Now the compare half (1s) no longer matches at byte 0.
    let r = run(&lu, &caw(4, 2), &data);
    check(&r, SenseKey::MISCOMPARE, 0x1D, 0);
    assert_eq!(r.sense.unwrap().information, Some(0));
    let mut d2 = vec![2u8; 2 * BS];
    d2[BS + 17] = 9;
    d2.extend(vec![3u8; 2 * BS]);
    let r = run(&lu, &caw(4, 2), &d2);
    assert_eq!(r.sense.unwrap().information, Some(BS as u64 + 17));
    assert_eq!(read(&lu, 4, 2), vec![2; 2 * BS], "no write on miscompare");
    check(
        &run(&lu, &caw(lu.num_blocks(), 1), &[0; 2 * BS]),
        IR,
        0x21,
        0,
    );
    // NLB 0: rejected (a truncated 256 is likelier than a deliberate no-op).
    check(&run(&lu, &caw(0, 0), &[]), IR, 0x24, 0);
    check(&run(&lu, &caw(0, 0), &[0; 2 * BS]), IR, 0x24, 0);
}

#[test]
fn compare_and_write_is_atomic_against_concurrent_caw() {
    let lu = Arc::new(lu().0);
    let threads = 4;
    let per = 200;
    let mut hs = Vec::new();
    for t in 0..threads {
        let lu = lu.clone();
        hs.push(std::thread::spawn(move || {
            let n = NexusId(format!("iqn.t{t},i,0x1"));
            let mut done = 0;
            while done < per {
                let cur = run_as(&lu, &n, &rw10(0x28, 0, 9, 1), &[]).data_in.to_vec();
                let v = u64::from_le_bytes(cur[..8].try_into().unwrap());
                let mut next = cur.clone();
                next[..8].copy_from_slice(&(v + 1).to_le_bytes());
                let mut d = cur;
                d.extend(next);
                let r = run_as(&lu, &n, &caw(9, 1), &d);
                if r.status == ScsiStatus::GOOD {
                    done += 1;
                } else {
                    assert_eq!(r.sense.unwrap().key, SenseKey::MISCOMPARE);
                }
            }
        }));
    }
    for h in hs {
        h.join().unwrap();
    }
    let v = u64::from_le_bytes(read(&lu, 9, 1)[..8].try_into().unwrap());
    assert_eq!(
        v,
        (threads * per) as u64,
        "every successful CAW counted exactly once"
    );
}

// ---------------------------------------------------------------------------- MODE

fn mode_sense6(lu: &LogicalUnit, flags: u8, pc_page: u8, alloc: u8) -> ScsiResponse {
    run(lu, &[0x1A, flags, pc_page, 0, alloc, 0], &[])
}

#[test]
fn mode_sense_pages_block_descriptors_and_page_control() {
    let (lu, _) = lu();
    let r = mode_sense6(&lu, 0, 0x3F, 255);
    good(&r);
    let d = &r.data_in;
    assert_eq!(d[0] as usize, d.len() - 1);
    assert_eq!(d[3], 8, "one short block descriptor");
    assert_eq!(u32::from_be_bytes(d[4..8].try_into().unwrap()), 32768);
    let pages: Vec<u8> = {
        let mut v = Vec::new();
        let mut i = 12;
        while i < d.len() {
            v.push(d[i] & 0x3F);
            i += d[i + 1] as usize + 2;
        }
        assert_eq!(i, d.len());
        v
    };
    assert_eq!(pages, vec![0x08, 0x0A, 0x1C]);
    // DBD, caching page, WCE set.
    let r = mode_sense6(&lu, 0x08, 0x08, 255);
    assert_eq!(r.data_in[3], 0);
    assert_eq!(r.data_in[4], 0x08);
    assert_eq!(r.data_in[6] & 0x04, 0x04);
    // Changeable: only WCE.
    let r = mode_sense6(&lu, 0x08, 0x48, 255);
    assert_eq!(r.data_in[6], 0x04);
    assert!(r.data_in[7..].iter().all(|&b| b == 0));
    // Saved: not supported.
    check(&mode_sense6(&lu, 0, 0xC8, 255), IR, 0x39, 0);
    check(&mode_sense6(&lu, 0, 0x19, 255), IR, 0x24, 0);
    // Truncated to the allocation length.
    assert_eq!(mode_sense6(&lu, 0, 0x3F, 4).data_in.len(), 4);
    // MODE SENSE(10) with LLBAA: 16-byte descriptor.
    let r = run(&lu, &[0x5A, 0x10, 0x0A, 0, 0, 0, 0, 0x01, 0x00, 0], &[]);
    good(&r);
    assert_eq!(r.data_in[4] & 1, 1);
    assert_eq!(u16::from_be_bytes([r.data_in[6], r.data_in[7]]), 16);
    assert_eq!(
        u16::from_be_bytes([r.data_in[0], r.data_in[1]]) as usize,
        r.data_in.len() - 2
    );
    assert_eq!(r.data_in[8 + 16] & 0x3F, 0x0A);
}

#[test]
fn mode_select_toggles_wce_and_raises_ua_for_others() {
    let (lu, p) = lu();
    good(&run_as(&lu, &b(), &[0x00, 0, 0, 0, 0, 0], &[])); // b is known
    let cur = mode_sense6(&lu, 0x08, 0x08, 255).data_in.to_vec();
    let mut list = vec![0, 0, 0, 0];
    list.extend_from_slice(&cur[4..]);
    list[4 + 2] &= !0x04;
    good(&run(&lu, &[0x15, 0x10, 0, 0, list.len() as u8, 0], &list));
    assert!(!lu.write_cache());
    assert_eq!(p.flushes(), 1, "cache flushed when turned off");
    assert_eq!(mode_sense6(&lu, 0x08, 0x08, 255).data_in[6] & 0x04, 0);
    check(
        &run_as(&lu, &b(), &[0, 0, 0, 0, 0, 0], &[]),
        SenseKey::UNIT_ATTENTION,
        0x2A,
        0x01,
    );
    good(&run(&lu, &[0, 0, 0, 0, 0, 0], &[]));
    // Changing a non-changeable bit (caching page byte 3) is rejected.
    list[4 + 3] = 0xFF;
    check(
        &run(&lu, &[0x15, 0x10, 0, 0, list.len() as u8, 0], &list),
        IR,
        0x26,
        0,
    );
    // SP=1 cannot be honoured.
    list[4 + 3] = 0;
    check(
        &run(&lu, &[0x15, 0x11, 0, 0, list.len() as u8, 0], &list),
        IR,
        0x24,
        0,
    );
    // Header shorter than 4 bytes.
    check(&run(&lu, &[0x15, 0x10, 0, 0, 2, 0], &[0, 0]), IR, 0x1A, 0);
}

// ---------------------------------------------------------------------------- misc

#[test]
fn report_supported_opcodes_all_and_one() {
    let (lu, _) = lu();
    let r = run(&lu, &[0xA3, 0x0C, 0x00, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[]);
    good(&r);
    let d = &r.data_in;
    let len = u32::from_be_bytes(d[0..4].try_into().unwrap()) as usize;
    assert_eq!(len + 4, d.len());
    let descs: Vec<&[u8]> = d[4..].chunks(8).collect();
    assert!(descs.iter().any(|x| x[0] == 0x28));
    assert!(descs
        .iter()
        .any(|x| x[0] == 0x9E && x[3] == 0x10 && x[5] & 1 == 1));
    assert!(descs.iter().all(|x| x[5] & 2 == 0), "no CTDP without RCTD");
    // RCTD: 20-byte descriptors each with a timeouts descriptor of length 0Ah.
    let r = run(&lu, &[0xA3, 0x0C, 0x80, 0, 0, 0, 0, 0, 0x10, 0, 0, 0], &[]);
    for x in r.data_in[4..].chunks(20) {
        assert_eq!(x[5] & 2, 2);
        assert_eq!(&x[8..10], &[0, 0x0A]);
    }
    // One command: READ(10).
    let r = run(&lu, &[0xA3, 0x0C, 0x01, 0x28, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    good(&r);
    assert_eq!(r.data_in[1] & 7, 3);
    assert_eq!(u16::from_be_bytes([r.data_in[2], r.data_in[3]]), 10);
    assert_eq!(r.data_in[4], 0x28);
    // Opcode with service actions asked without one, and vice versa.
    check(
        &run(
            &lu,
            &[0xA3, 0x0C, 0x01, 0x9E, 0, 0x10, 0, 0, 1, 0, 0, 0],
            &[],
        ),
        IR,
        0x24,
        0,
    );
    check(
        &run(&lu, &[0xA3, 0x0C, 0x02, 0x28, 0, 0, 0, 0, 1, 0, 0, 0], &[]),
        IR,
        0x24,
        0,
    );
    good(&run(
        &lu,
        &[0xA3, 0x0C, 0x02, 0x9E, 0, 0x10, 0, 0, 1, 0, 0, 0],
        &[],
    ));
    // Unsupported opcode: SUPPORT 001b.
    let r = run(&lu, &[0xA3, 0x0C, 0x01, 0x04, 0, 0, 0, 0, 1, 0, 0, 0], &[]);
    assert_eq!(r.data_in[1] & 7, 1);
}

#[test]
fn request_sense_reports_pending_ua_then_no_sense() {
    let (lu, _) = lu();
    good(&run_as(&lu, &b(), &[0, 0, 0, 0, 0, 0], &[]));
    lu.reset(ResetKind::LogicalUnit, &a());
    let r = run_as(&lu, &b(), &[0x03, 0, 0, 0, 252, 0], &[]);
    good(&r);
    assert_eq!(
        (r.data_in[2], r.data_in[12], r.data_in[13]),
        (0x06, 0x29, 0x03)
    );
    let r = run_as(&lu, &b(), &[0x03, 0, 0, 0, 252, 0], &[]);
    assert_eq!((r.data_in[2], r.data_in[12]), (0, 0));
}

#[test]
fn reset_sets_unit_attention_for_every_nexus() {
    let (lu, _) = lu();
    good(&run_as(&lu, &a(), &[0, 0, 0, 0, 0, 0], &[]));
    good(&run_as(&lu, &b(), &[0, 0, 0, 0, 0, 0], &[]));
    lu.reset(ResetKind::TargetWarm, &a());
    check(
        &run_as(&lu, &a(), &[0, 0, 0, 0, 0, 0], &[]),
        SenseKey::UNIT_ATTENTION,
        0x29,
        0x02,
    );
    good(&run_as(&lu, &a(), &[0, 0, 0, 0, 0, 0], &[]));
    // INQUIRY does not consume the UA.
    good(&inquiry_as(&lu, &b()));
    check(
        &run_as(&lu, &b(), &[0, 0, 0, 0, 0, 0], &[]),
        SenseKey::UNIT_ATTENTION,
        0x29,
        0x02,
    );
    good(&run_as(&lu, &b(), &[0, 0, 0, 0, 0, 0], &[]));
}

fn inquiry_as(lu: &LogicalUnit, n: &NexusId) -> ScsiResponse {
    run_as(lu, n, &[0x12, 0, 0, 0, 96, 0], &[])
}

#[test]
fn power_on_ua_is_reported_once_when_configured() {
    let lu = lu_with(Probe::new(SIZE), |c| c.power_on_ua = true);
    check(
        &run(&lu, &[0, 0, 0, 0, 0, 0], &[]),
        SenseKey::UNIT_ATTENTION,
        0x29,
        0x01,
    );
    good(&run(&lu, &[0, 0, 0, 0, 0, 0], &[]));
}

#[test]
fn reserve6_blocks_other_nexus_until_release_reset_or_loss() {
    let (lu, _) = lu();
    good(&run_as(&lu, &a(), &[0x16, 0, 0, 0, 0, 0], &[]));
    let r = run_as(&lu, &b(), &rw10(0x28, 0, 0, 1), &[]);
    assert_eq!(r.status, ScsiStatus::RESERVATION_CONFLICT);
    assert_eq!(
        run_as(&lu, &b(), &[0x16, 0, 0, 0, 0, 0], &[]).status,
        ScsiStatus::RESERVATION_CONFLICT
    );
    good(&inquiry_as(&lu, &b()));
    good(&run_as(&lu, &b(), &[0x17, 0, 0, 0, 0, 0], &[])); // not the holder: no-op
    assert_eq!(
        run_as(&lu, &b(), &rw10(0x28, 0, 0, 1), &[]).status,
        ScsiStatus::RESERVATION_CONFLICT
    );
    good(&run_as(&lu, &a(), &[0x17, 0, 0, 0, 0, 0], &[]));
    good(&run_as(&lu, &b(), &rw10(0x28, 0, 0, 1), &[]));
    good(&run_as(&lu, &a(), &[0x16, 0, 0, 0, 0, 0], &[]));
    lu.nexus_lost(&a());
    good(&run_as(&lu, &b(), &rw10(0x28, 0, 0, 1), &[]));
    good(&run_as(&lu, &b(), &[0x16, 0, 0, 0, 0, 0], &[]));
    lu.reset(ResetKind::LogicalUnit, &b());
    clear_ua(&lu, &a());
    good(&run_as(&lu, &a(), &[0x16, 0, 0, 0, 0, 0], &[]));
}

/// TEST UNIT READY until GOOD, as initiators do after a reset; returns how many UAs came.
fn clear_ua(lu: &LogicalUnit, n: &NexusId) -> usize {
    let mut uas = 0;
    loop {
        let r = run_as(lu, n, &[0, 0, 0, 0, 0, 0], &[]);
        if r.status == ScsiStatus::GOOD {
            return uas;
        }
        assert_eq!(r.sense.unwrap().key, SenseKey::UNIT_ATTENTION);
        uas += 1;
        assert!(uas < 10);
    }
}

fn prout(lu: &LogicalUnit, n: &NexusId, sa: u8, kind: u8, key: u64, sa_key: u64) -> ScsiResponse {
    let mut p = key.to_be_bytes().to_vec();
    p.extend_from_slice(&sa_key.to_be_bytes());
    p.extend_from_slice(&[0; 8]);
    run_as(lu, n, &[0x5F, sa, kind, 0, 0, 0, 0, 0, 24, 0], &p)
}
fn prin(lu: &LogicalUnit, n: &NexusId, sa: u8) -> Vec<u8> {
    let r = run_as(lu, n, &[0x5E, sa, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    good(&r);
    r.data_in.to_vec()
}

#[test]
fn persistent_reservations_register_reserve_access_preempt_clear() {
    let (lu, _) = lu();
    let conflict = ScsiStatus::RESERVATION_CONFLICT;
    good(&prout(&lu, &a(), 0, 0, 0, 0xA));
    good(&prout(&lu, &b(), 6, 0, 0, 0xB));
    // Wrong key on REGISTER: conflict.
    assert_eq!(prout(&lu, &b(), 0, 0, 0x99, 0xC).status, conflict);
    let keys = prin(&lu, &a(), 0);
    assert_eq!(u32::from_be_bytes(keys[4..8].try_into().unwrap()), 16);
    let gen0 = u32::from_be_bytes(keys[0..4].try_into().unwrap());
    // a reserves Write Exclusive; b may read, not write.
    good(&prout(&lu, &a(), 1, 0x01, 0xA, 0));
    let res = prin(&lu, &b(), 1);
    assert_eq!(&res[8..16], &0xAu64.to_be_bytes());
    assert_eq!(res[21], 0x01);
    good(&run_as(&lu, &b(), &rw10(0x28, 0, 0, 1), &[]));
    assert_eq!(
        run_as(&lu, &b(), &rw10(0x2A, 0, 0, 1), &[0; BS]).status,
        conflict
    );
    good(&run_as(&lu, &a(), &rw10(0x2A, 0, 0, 1), &[0; BS]));
    // b cannot reserve over it; RESERVE(6) conflicts with a PR.
    assert_eq!(prout(&lu, &b(), 1, 0x01, 0xB, 0).status, conflict);
    assert_eq!(
        run_as(&lu, &a(), &[0x16, 0, 0, 0, 0, 0], &[]).status,
        conflict
    );
    // Release with the wrong type is an error.
    check(&prout(&lu, &a(), 2, 0x03, 0xA, 0), IR, 0x26, 0x04);
    // b preempts a: a's registration and reservation go, a gets a UA.
    good(&prout(&lu, &b(), 4, 0x03, 0xB, 0xA));
    let keys = prin(&lu, &b(), 0);
    assert_eq!(u32::from_be_bytes(keys[0..4].try_into().unwrap()), gen0 + 1);
    assert_eq!(&keys[8..16], &0xBu64.to_be_bytes());
    check(
        &run_as(&lu, &a(), &[0, 0, 0, 0, 0, 0], &[]),
        SenseKey::UNIT_ATTENTION,
        0x2A,
        0x05,
    );
    // Exclusive Access now held by b: a can neither read nor write.
    assert_eq!(
        run_as(&lu, &a(), &rw10(0x28, 0, 0, 1), &[]).status,
        conflict
    );
    // Report capabilities: length 8, all types.
    let caps = prin(&lu, &a(), 2);
    assert_eq!(u16::from_be_bytes([caps[0], caps[1]]), 8);
    // CLEAR drops everything.
    good(&prout(&lu, &b(), 3, 0, 0xB, 0));
    assert_eq!(&prin(&lu, &a(), 0)[4..8], &[0, 0, 0, 0]);
    good(&run_as(&lu, &a(), &rw10(0x28, 0, 0, 1), &[]));
    // Bad parameter list length and bad service action.
    check(
        &run_as(&lu, &a(), &[0x5F, 0, 0, 0, 0, 0, 0, 0, 20, 0], &[0; 20]),
        IR,
        0x1A,
        0,
    );
    check(
        &run_as(&lu, &a(), &[0x5E, 0x07, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]),
        IR,
        0x24,
        0,
    );
}

#[test]
fn registrants_only_reservation_lets_registered_nexus_write() {
    let (lu, _) = lu();
    let c = NexusId("iqn.c,i,0x3".into());
    good(&prout(&lu, &a(), 6, 0, 0, 1));
    good(&prout(&lu, &b(), 6, 0, 0, 2));
    good(&prout(&lu, &a(), 1, 0x05, 1, 0)); // WE-RO
    good(&run_as(&lu, &b(), &rw10(0x2A, 0, 0, 1), &[0; BS]));
    good(&run_as(&lu, &c, &rw10(0x28, 0, 0, 1), &[]));
    assert_eq!(
        run_as(&lu, &c, &rw10(0x2A, 0, 0, 1), &[0; BS]).status,
        ScsiStatus::RESERVATION_CONFLICT
    );
    // Holder unregisters: reservation released.
    good(&prout(&lu, &a(), 0, 0, 1, 0));
    // Other registrants learn it through RESERVATIONS RELEASED (SPC-4 §5.13.11.2.2).
    check(
        &run_as(&lu, &b(), &[0, 0, 0, 0, 0, 0], &[]),
        SenseKey::UNIT_ATTENTION,
        0x2A,
        0x04,
    );
    assert_eq!(
        u32::from_be_bytes(prin(&lu, &b(), 1)[4..8].try_into().unwrap()),
        0
    );
}

#[test]
fn small_commands_answer() {
    let (lu, _) = lu();
    good(&run(&lu, &[0x00, 0, 0, 0, 0, 0], &[]));
    good(&run(&lu, &[0x1B, 0, 0, 0, 0x00, 0], &[])); // stop
    good(&run(&lu, &[0x1B, 0, 0, 0, 0x01, 0], &[])); // start
    good(&run(&lu, &[0x1E, 0, 0, 0, 1, 0], &[]));
    good(&run(&lu, &[0x1E, 0, 0, 0, 0, 0], &[]));
    check(&run(&lu, &[0x1E, 0, 0, 0, 2, 0], &[]), IR, 0x24, 0);
    good(&run(&lu, &rw10(0x34, 0x02, 0, 1), &[]));
    good(&run(&lu, &rw16(0x90, 0, 0, 1), &[]));
    check(
        &run(&lu, &rw10(0x34, 0, lu.num_blocks() as u32, 1), &[]),
        IR,
        0x21,
        0,
    );
    let r = run(&lu, &[0x37, 0, 0x18, 0, 0, 0, 0, 0, 32, 0], &[]);
    good(&r);
    assert_eq!(r.data_in.to_vec(), vec![0, 0x18, 0, 0]);
    let r = run(&lu, &[0xB7, 0x08, 0, 0, 0, 0, 0, 0, 0, 32, 0, 0], &[]);
    assert_eq!(r.data_in.len(), 8);
    let r = run(&lu, &[0xA0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 0, 0], &[]);
    assert_eq!(r.data_in.len(), 16);
}

#[test]
fn orwrite_ors_data_into_the_blocks() {
    let (lu, p) = lu();
    write(&lu, 2, &[0xA0; 2 * BS]);
    good(&run(&lu, &rw16(0x8B, 0, 2, 2), &[0x05; 2 * BS]));
    assert_eq!(read(&lu, 2, 2), vec![0xA5; 2 * BS]);
    good(&run(&lu, &rw16(0x8B, 0x08, 2, 1), &[0x5A; BS]));
    assert_eq!(read(&lu, 2, 1), vec![0xFF; BS]);
    assert_eq!(p.flushes(), 1, "FUA");
    check(&run(&lu, &rw16(0x8B, 0x20, 2, 1), &[0; BS]), IR, 0x24, 0);
    check(
        &run(&lu, &rw16(0x8B, 0, lu.num_blocks(), 1), &[0; BS]),
        IR,
        0x21,
        0,
    );
    good(&run(&lu, &rw16(0x8B, 0, 0, 0), &[]));
}

#[test]
fn write_exclusive_blocks_other_writers_at_4k_blocks() {
    let lu = lu_with(Probe::new(SIZE), |c| c.block_size = 4096);
    good(&prout(&lu, &a(), 6, 0, 0, 1));
    good(&prout(&lu, &b(), 6, 0, 0, 2));
    good(&prout(&lu, &a(), 1, 0x01, 1, 0));
    good(&run_as(&lu, &b(), &rw10(0x28, 0, 1, 1), &[]));
    let r = run_as(&lu, &b(), &rw10(0x2A, 0, 1, 1), &[0; 4096]);
    assert_eq!(r.status, ScsiStatus::RESERVATION_CONFLICT);
}

#[test]
fn precheck_reports_conflicts_and_unit_attentions_without_executing() {
    let (lu, _) = lu();
    let mut w = rw10(0x2A, 0, 1, 1);
    w.resize(16, 0);
    assert!(lu.precheck(&b(), &w).is_none());
    good(&prout(&lu, &a(), 6, 0, 0, 1));
    good(&prout(&lu, &a(), 1, 0x01, 1, 0));
    let r = lu.precheck(&b(), &w).unwrap();
    assert_eq!(r.status, ScsiStatus::RESERVATION_CONFLICT);
    assert!(lu.precheck(&a(), &w).is_none());
    lu.reset(ResetKind::LogicalUnit, &a());
    let r = lu.precheck(&a(), &w).unwrap();
    assert_eq!(r.sense.unwrap().key, SenseKey::UNIT_ATTENTION);
    assert!(lu.precheck(&a(), &w).is_none(), "UA consumed");
    let r = lu.precheck(&a(), &[0x04, 0, 0, 0, 0, 0]).unwrap();
    assert_eq!(r.sense.unwrap().asc, 0x20);
}

#[test]
fn write_same_unmap_on_file_and_null_backends() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let path = dir.path().join("ws.img");
    let spec = format!("file:{},size=16MiB", path.display())
        .parse()
        .unwrap();
    let lu = lu_with(ipsan_scsi::open(&spec).unwrap(), |_| {});
    write(&lu, 0, &vec![0x22; 4096 * BS]); // 2 MiB
    good(&run(&lu, &[0x35, 0, 0, 0, 0, 0, 0, 0, 0, 0], &[]));
    let before = std::fs::metadata(&path).unwrap().blocks();
    good(&run(&lu, &rw16(0x93, 0x09, 0, 4096), &[]));
    let after = std::fs::metadata(&path).unwrap().blocks();
    assert!(after + 4000 <= before, "{before} -> {after}");
    assert_eq!(read(&lu, 0, 16), vec![0; 16 * BS]);

    let null = lu_with(
        ipsan_scsi::open(&"null:1TiB".parse().unwrap()).unwrap(),
        |_| {},
    );
    assert_eq!(null.num_blocks(), (1u64 << 40) / 512);
    good(&run(&null, &rw16(0x8A, 0, (1 << 30) + 5, 1), &[7; BS]));
    let r = run(&null, &rw16(0x88, 0, (1 << 30) + 5, 1), &[]);
    assert_eq!(r.data_in.to_vec(), vec![0; BS], "null discards writes");
    good(&run(&null, &rw16(0x93, 0x08, 0, 1000), &[0; BS]));
    let list = unmap_list(&[(0, 8)]);
    good(&run(&null, &unmap_cdb(list.len() as u16), &list));
}

/// Linux's sd driver (drivers/scsi/sd.c, `sd_validate_opt_xfer_size`, 6.1 and later) ignores an
/// OPTIMAL TRANSFER LENGTH and warns at every attach unless it is at most the device maximum
/// (MAXIMUM TRANSFER LENGTH, capped at 65535 blocks for READ/WRITE(10) disks), at most
/// SD_DEF_XFER_BLOCKS (65535), at least a page, a multiple of the physical block and of the
/// OPTIMAL TRANSFER LENGTH GRANULARITY. `Err` carries sd.c's complaint.
fn linux_sd_accepts_optimal_transfer(b0: &[u8], block: u32, page: u32) -> Result<(), String> {
    const SD_DEF_XFER_BLOCKS: u32 = 0xffff;
    let be32 = |o: usize| u32::from_be_bytes(b0[o..o + 4].try_into().unwrap());
    let granularity = u32::from(u16::from_be_bytes([b0[6], b0[7]]));
    let (max, opt) = (be32(8), be32(12));
    // sd_revalidate_disk: dev_max = min_not_zero(SD_DEF_XFER_BLOCKS, max_xfer_blocks) for a
    // disk under 2^32 blocks (no READ/WRITE(16) by default).
    let dev_max = if max == 0 {
        SD_DEF_XFER_BLOCKS
    } else {
        max.min(SD_DEF_XFER_BLOCKS)
    };
    let bytes = u64::from(opt) * u64::from(block);
    if opt == 0 {
        return Err("no optimal transfer length".into());
    }
    if opt > dev_max {
        return Err(format!("{opt} logical blocks > dev_max ({dev_max})"));
    }
    if opt > SD_DEF_XFER_BLOCKS {
        return Err(format!("{opt} logical blocks > sd driver limit"));
    }
    if bytes < u64::from(page) {
        return Err(format!("{bytes} bytes < PAGE_SIZE ({page})"));
    }
    if granularity != 0 && bytes % (u64::from(granularity) * u64::from(block)) != 0 {
        return Err(format!("{bytes} bytes not a multiple of the granularity"));
    }
    // No LOGICAL BLOCKS PER PHYSICAL BLOCK EXPONENT: the physical block is the logical one.
    if bytes % u64::from(block) != 0 {
        return Err(format!(
            "{bytes} bytes not a multiple of the physical block"
        ));
    }
    Ok(())
}

#[test]
fn vpd_block_limits_optimal_transfer_is_one_linux_sd_accepts() {
    for block in [512u32, 4096] {
        let lu = lu_with(Probe::new(SIZE), |c| c.block_size = block);
        let b0 = inquiry(&lu, true, 0xB0, 255).data_in;
        // 4 KiB pages (x86-64) and 64 KiB pages (arm64/ppc64 kernels).
        for page in [4096, 65536] {
            linux_sd_accepts_optimal_transfer(&b0, block, page)
                .unwrap_or_else(|e| panic!("{block}-byte blocks, {page}-byte pages: {e}"));
        }
        let be32 = |o: usize| u32::from_be_bytes(b0[o..o + 4].try_into().unwrap());
        assert!(
            be32(12) <= be32(8),
            "optimal transfer length within the maximum (SBC-4 §6.6.4)"
        );
    }
}

/// A store that completes every request from another thread, as librbd does from its
/// finisher: the submit/complete path end to end without Ceph. Its size can change (as an
/// RBD image's does) and it names itself (as a shared image does).
#[derive(Debug)]
struct Threaded {
    inner: MemBackend,
    size: std::sync::atomic::AtomicU64,
}

impl Backend for Threaded {
    fn size(&self) -> u64 {
        self.size.load(Ordering::SeqCst)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.unmap(offset, len)
    }
    fn kind(&self) -> &'static str {
        "threaded"
    }
    fn supports_unmap(&self) -> bool {
        true
    }
    fn engine(&self) -> ipsan_scsi::Engine {
        ipsan_scsi::Engine::Async
    }
    fn submit(&self, req: ipsan_scsi::IoRequest, done: ipsan_scsi::aio::Completer) {
        let c = ipsan_scsi::aio::run_blocking(self, req);
        std::thread::spawn(move || done(c));
    }
    fn identity(&self) -> Option<String> {
        Some("threaded:test".into())
    }
}

fn run_async(lu: &LogicalUnit, cdb: &[u8], data: &[u8]) -> ScsiResponse {
    let mut c = cdb.to_vec();
    c.resize(16, 0);
    assert!(lu.runs_async(&c), "{:02x} should take the async path", c[0]);
    ipsan_scsi::aio::block_on(lu.execute_async(ipsan_scsi::OwnedRequest {
        cdb: c,
        data_out: bytes::Bytes::copy_from_slice(data),
        nexus: a(),
        lun: 0,
        tag: 1,
    }))
}

#[test]
fn async_backend_runs_the_data_path_through_submit_and_complete() {
    let t = Arc::new(Threaded {
        inner: MemBackend::new(2 * SIZE),
        size: std::sync::atomic::AtomicU64::new(SIZE),
    });
    let lu = lu_with(t.clone(), |_| {});
    // WRITE(10) and READ(16) through completions from another thread.
    let data: Vec<u8> = (0..4 * BS).map(|i| (i * 31 % 251) as u8).collect();
    good(&run_async(&lu, &rw10(0x2A, 0x08, 100, 4), &data));
    let r = run_async(&lu, &rw16(0x88, 0, 100, 4), &[]);
    good(&r);
    assert_eq!(&r.data_in[..], &data[..]);
    // Range checks are the synchronous path's.
    check(
        &run_async(&lu, &rw16(0x88, 0, SIZE / BS as u64, 1), &[]),
        IR,
        0x21,
        0,
    );
    // COMPARE AND WRITE: a miscompare names the first differing byte.
    let mut caw = vec![0u8; 16];
    caw[0] = 0x89;
    caw[2..10].copy_from_slice(&100u64.to_be_bytes());
    caw[13] = 1;
    let mut payload = data[..BS].to_vec();
    payload[7] ^= 1;
    payload.extend_from_slice(&[0xEE; BS]);
    let r = run_async(&lu, &caw, &payload);
    check(&r, SenseKey::MISCOMPARE, 0x1D, 0);
    assert_eq!(r.sense.as_ref().unwrap().information, Some(7));
    payload[7] ^= 1;
    good(&run_async(&lu, &caw, &payload));
    // UNMAP then reads return zeros; SYNCHRONIZE CACHE(16) with and without IMMED.
    good(&run_async(&lu, &unmap_cdb(24), &unmap_list(&[(100, 4)])));
    let r = run_async(&lu, &rw16(0x88, 0, 100, 4), &[]);
    assert!(r.data_in.iter().all(|&b| b == 0));
    good(&run_async(&lu, &[0x91, 0x02], &[]));
    good(&run_async(&lu, &[0x91, 0x00], &[]));
    // The shared store refuses reservations; non-data commands stay synchronous.
    assert!(!lu.runs_async(&[0x12, 0, 0, 0, 36, 0]));
    check(
        &run(&lu, &[0x5F, 0x00, 0, 0, 0, 0, 0, 0, 24, 0], &[0; 24]),
        IR,
        0x20,
        0,
    );
    check(&run(&lu, &[0x16, 0, 0, 0, 0, 0], &[]), IR, 0x20, 0);
    // The store grows: CAPACITY DATA HAS CHANGED once, then the new capacity.
    t.size.store(2 * SIZE, Ordering::SeqCst);
    check(
        &run_async(&lu, &rw16(0x88, 0, 0, 1), &[]),
        SenseKey::UNIT_ATTENTION,
        0x2A,
        0x09,
    );
    good(&run_async(&lu, &rw16(0x88, 0, SIZE / BS as u64, 1), &[]));
    assert_eq!(lu.num_blocks(), 2 * SIZE / BS as u64);
}

/// A store two targets serve (an RBD image, here RAM) with one shared record both keep
/// their reservations in: what the RBD backend provides with a RADOS object.
#[derive(Debug)]
struct SharedStore {
    inner: MemBackend,
    pr: Arc<ipsan_scsi::backend::MemRecord>,
}

impl Backend for SharedStore {
    fn size(&self) -> u64 {
        self.inner.size()
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.unmap(offset, len)
    }
    fn kind(&self) -> &'static str {
        "shared"
    }
    fn supports_unmap(&self) -> bool {
        true
    }
    fn identity(&self) -> Option<String> {
        Some("shared:0".into())
    }
    fn shared_record(&self) -> Option<Arc<dyn ipsan_scsi::backend::SharedRecord>> {
        Some(self.pr.clone())
    }
}

#[test]
fn accepts_reservations_on_a_shared_store_and_enforces_them_across_target_ports() {
    let store = Arc::new(SharedStore {
        inner: MemBackend::new(SIZE),
        pr: Arc::default(),
    });
    let gw1 = lu_with(store.clone(), |c| c.relative_port = 1);
    let gw2 = lu_with(store.clone(), |c| c.relative_port = 2);
    assert!(!gw1.refuses_reservations());
    let conflict = ScsiStatus::RESERVATION_CONFLICT;
    // a registers and reserves Write Exclusive through port 1; b writes through port 2.
    good(&prout(&gw1, &a(), 0, 0, 0, 0xA));
    good(&prout(&gw1, &a(), 1, 0x01, 0xA, 0));
    assert_eq!(
        run_as(&gw2, &b(), &rw10(0x2A, 0, 0, 1), &[0; BS]).status,
        conflict
    );
    good(&run_as(&gw2, &b(), &rw10(0x28, 0, 0, 1), &[]));
    let keys = prin(&gw2, &b(), 0);
    assert_eq!(u32::from_be_bytes(keys[4..8].try_into().unwrap()), 8);
    assert_eq!(&keys[8..16], &0xAu64.to_be_bytes());
    // READ FULL STATUS through port 2 names port 1 as the holder's.
    let full = run_as(&gw2, &b(), &[0x5E, 3, 0, 0, 0, 0, 0, 0x10, 0, 0], &[]);
    good(&full);
    let d = full.data_in;
    assert_eq!(&d[8..16], &0xAu64.to_be_bytes());
    assert_eq!(d[20] & 1, 1, "R_HOLDER");
    assert_eq!(u16::from_be_bytes([d[26], d[27]]), 1);
    // The same initiator port through port 2 is another I_T nexus: not the holder.
    assert_eq!(
        run_as(&gw2, &a(), &rw10(0x2A, 0, 0, 1), &[0; BS]).status,
        conflict
    );
    good(&prout(&gw1, &a(), 2, 0x01, 0xA, 0));
    good(&run_as(&gw2, &b(), &rw10(0x2A, 0, 0, 1), &[0; BS]));
    // RESERVE(6) through port 2 binds port 1.
    good(&run_as(&gw2, &b(), &[0x16, 0, 0, 0, 0, 0], &[]));
    assert_eq!(
        run_as(&gw1, &a(), &rw10(0x2A, 0, 0, 1), &[0; BS]).status,
        conflict
    );
    gw2.nexus_lost(&b());
    good(&run_as(&gw1, &a(), &rw10(0x2A, 0, 0, 1), &[0; BS]));
}

#[test]
fn keeps_every_registration_when_two_target_ports_register_at_once() {
    let store = Arc::new(SharedStore {
        inner: MemBackend::new(SIZE),
        pr: Arc::default(),
    });
    let gws = [
        Arc::new(lu_with(store.clone(), |c| c.relative_port = 1)),
        Arc::new(lu_with(store.clone(), |c| c.relative_port = 2)),
    ];
    let threads: Vec<_> = (0..16u64)
        .map(|i| {
            let gw = gws[(i % 2) as usize].clone();
            std::thread::spawn(move || {
                let n = NexusId(format!("iqn.2026-01.test:h{i},i,0x000000000001"));
                good(&prout(&gw, &n, 0, 0, 0, 0x100 + i));
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let keys = prin(&gws[0], &a(), 0);
    assert_eq!(
        u32::from_be_bytes(keys[0..4].try_into().unwrap()),
        16,
        "PRgeneration"
    );
    let mut got: Vec<u64> = keys[8..]
        .chunks(8)
        .take(16)
        .map(|k| u64::from_be_bytes(k.try_into().unwrap()))
        .collect();
    got.sort_unstable();
    assert_eq!(got, (0x100..0x110).collect::<Vec<u64>>());
}

/// A READ's buffer has room for Seal's trailer only when the request asks for it (a sealed
/// session): a plain 64 KiB read stays a 64 KiB allocation, in the allocator's pooled sizes.
#[test]
fn reads_leave_tail_room_only_when_asked() {
    let (lu, _) = lu();
    let len = 64 * 1024;
    let capacity = |tailroom: bool| {
        let r = lu.execute(&ScsiRequest {
            cdb: &rw16(0x88, 0, 0, (len / BS) as u32),
            data_out: &[],
            nexus: &a(),
            lun: 0,
            tailroom,
        });
        good(&r);
        assert_eq!(r.data_in.len(), len);
        r.data_in.try_into_mut().unwrap().capacity()
    };
    assert_eq!(capacity(false), len);
    assert!(capacity(true) >= len + ipsan_scsi::lu::read_tailroom(len));
    assert!(ipsan_scsi::lu::read_tailroom(len) > 0);
}
