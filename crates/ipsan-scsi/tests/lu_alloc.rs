//! The data path is written once (`lu/path.rs`) and the blocking `execute` drives it with
//! one poll: this counts the heap allocations of a READ and a WRITE through `execute` (a
//! counting global allocator, hence a test binary of its own). Before the sync and async
//! twins were merged the counts were the same: WRITE 1, READ 2 (the nexus key cloned per
//! command; since issue 27: WRITE 0, READ 1, and a long READ from a RAM store 0).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;
use std::sync::Arc;

use ipsan_scsi::backend::MemBackend;
use ipsan_scsi::{LogicalUnit, LuConfig, NexusId, ScsiRequest, ScsiStatus};

struct Counting;

thread_local! {
    static ALLOCS: Cell<usize> = const { Cell::new(0) };
}

// SAFETY: forwards to the system allocator; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        ALLOCS.with(|c| c.set(c.get() + 1));
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
}

#[global_allocator]
static A: Counting = Counting;

fn allocations(f: impl FnOnce()) -> usize {
    let before = ALLOCS.with(Cell::get);
    f();
    ALLOCS.with(Cell::get) - before
}

#[test]
fn blocking_read_and_write_allocate_only_the_read_buffer() {
    let mut cfg = LuConfig::with_serial("alloc0001");
    cfg.power_on_ua = false;
    cfg.write_cache = true;
    let lu = LogicalUnit::new(Arc::new(MemBackend::new(1 << 20)), cfg).unwrap();
    let nexus = NexusId("iqn.2026-11.test:a,i,0x000000000001".into());
    let mut write = [0u8; 16];
    write[0] = 0x2A;
    write[8] = 8;
    let mut read = write;
    read[0] = 0x28;
    let data = vec![0xA5u8; 8 * 512];
    let run = |cdb: &[u8], data: &[u8]| {
        lu.execute(&ScsiRequest {
            cdb,
            data_out: data,
            nexus: &nexus,
            lun: 0,
            tailroom: false,
        })
    };
    // Warm up: the nexus is known, the reservation state is loaded.
    assert_eq!(run(&write, &data).status, ScsiStatus::GOOD);
    let w = allocations(|| assert_eq!(run(&write, &data).status, ScsiStatus::GOOD));
    let r = allocations(|| assert_eq!(run(&read, &[]).data_in.len(), 8 * 512));
    println!("allocations per command: WRITE {w}, READ {r}");
    // Nothing per command but the READ's buffer: the nexus key is cloned only the first time
    // the LU sees the nexus (it was cloned on every command before issue 27: WRITE 1, READ 2).
    assert_eq!(w, 0, "WRITE: {w} allocations");
    assert!(r <= 1, "READ: {r} allocations");
}

/// A long READ from a RAM store is the store's own bytes (issue 27: one copy per side, the
/// socket's): no data buffer is allocated for it, and two reads of the same blocks answer
/// with the same memory. A sealed session's READ (tailroom) still gets a buffer of its own
/// to seal in place.
#[test]
fn accepts_a_long_ram_read_as_the_stores_own_bytes_without_a_copy() {
    let mut cfg = LuConfig::with_serial("alloc0002");
    cfg.power_on_ua = false;
    cfg.write_cache = true;
    let lu = LogicalUnit::new(Arc::new(MemBackend::new(4 << 20)), cfg).unwrap();
    let nexus = NexusId("iqn.2026-11.test:a,i,0x000000000002".into());
    // 64 KiB = 128 blocks at LBA 8.
    let mut write = [0u8; 10];
    write[0] = 0x2A;
    write[5] = 8;
    write[8] = 128;
    let mut read = write;
    read[0] = 0x28;
    let data: Vec<u8> = (0..64 * 1024).map(|i| (i % 253) as u8).collect();
    let run = |cdb: &[u8], data: &[u8], tailroom: bool| {
        lu.execute(&ScsiRequest {
            cdb,
            data_out: data,
            nexus: &nexus,
            lun: 0,
            tailroom,
        })
    };
    assert_eq!(run(&write, &data, false).status, ScsiStatus::GOOD);
    let first = run(&read, &[], false);
    assert_eq!(&first.data_in[..], &data[..]);
    let mut again = None;
    let r = allocations(|| again = Some(run(&read, &[], false)));
    let again = again.unwrap();
    assert_eq!(&again.data_in[..], &data[..]);
    assert_eq!(
        again.data_in.as_ptr(),
        first.data_in.as_ptr(),
        "the READ's data was copied out of the store"
    );
    println!("allocations of a 64 KiB READ: {r}");
    assert_eq!(r, 0, "64 KiB READ: {r} allocations");
    // What a READ answered with stays as it was when a WRITE changes the blocks after it.
    let other = vec![0x5Au8; 64 * 1024];
    assert_eq!(run(&write, &other, false).status, ScsiStatus::GOOD);
    assert_eq!(&first.data_in[..], &data[..]);
    let now = run(&read, &[], false);
    assert_eq!(&now.data_in[..], &other[..]);
    let sealed = run(&read, &[], true);
    assert_eq!(&sealed.data_in[..], &other[..]);
    assert_ne!(
        sealed.data_in.as_ptr(),
        now.data_in.as_ptr(),
        "a READ to be sealed in place got the store's shared bytes"
    );
}

/// A WRITE of exactly one RAM chunk (1 MiB at a 1 MiB boundary) whose data is a whole buffer
/// of its own is kept by the store as that chunk (issue 27: the target's 1 MiB writes): no
/// copy, no data buffer allocated, and a READ of it answers with that memory. A WRITE not on
/// a chunk boundary, or a `whole` that is not the request's data, is copied as before; every
/// READ returns what was written.
#[test]
fn keeps_a_whole_chunk_write_as_the_stores_memory_without_a_copy() {
    let mut cfg = LuConfig::with_serial("alloc0003");
    cfg.power_on_ua = false;
    cfg.write_cache = true;
    let lu = LogicalUnit::new(Arc::new(MemBackend::new(4 << 20)), cfg).unwrap();
    let nexus = NexusId("iqn.2026-11.test:a,i,0x000000000003".into());
    // WRITE(10)/READ(10) of 2048 blocks (1 MiB) at `lba`.
    let cdb = |op: u8, lba: u32| {
        let mut c = [0u8; 10];
        c[0] = op;
        c[2..6].copy_from_slice(&lba.to_be_bytes());
        c[7..9].copy_from_slice(&2048u16.to_be_bytes());
        c
    };
    let whole_of = |fill: u8| {
        let mut b = bytes::BytesMut::with_capacity(1 << 20);
        b.resize(1 << 20, fill);
        ipsan_scsi::Whole::new(b).unwrap()
    };
    let write = |lba: u32, w: &ipsan_scsi::Whole, data: &[u8]| {
        let c = cdb(0x2A, lba);
        let info = lu.command_info(&c).unwrap();
        let req = ScsiRequest {
            cdb: &c,
            data_out: data,
            nexus: &nexus,
            lun: 0,
            tailroom: false,
        };
        lu.execute_decoded_whole(&req, &info, w).status
    };
    let read = |lba: u32| {
        lu.execute(&ScsiRequest {
            cdb: &cdb(0x28, lba),
            data_out: &[],
            nexus: &nexus,
            lun: 0,
            tailroom: false,
        })
        .data_in
    };
    // Warm up: the nexus is known, the reservation state is loaded.
    let w0 = whole_of(1);
    assert_eq!(write(2048, &w0, w0.as_bytes()), ScsiStatus::GOOD);
    let w = whole_of(2);
    let ptr = w.as_bytes().as_ptr();
    let mut status = None;
    let n = allocations(|| status = Some(write(2048, &w, w.as_bytes())));
    assert_eq!(status, Some(ScsiStatus::GOOD));
    drop(w);
    let got = read(2048);
    assert!(got.iter().all(|&b| b == 2));
    assert_eq!(
        got.as_ptr(),
        ptr,
        "the 1 MiB WRITE was copied into the store"
    );
    println!("allocations of a whole 1 MiB WRITE: {n}");
    // At most the shared count `bytes` allocates when a buffer's handle is first cloned (the
    // store's handle beside the caller's); never a data buffer.
    assert!(n <= 1, "whole 1 MiB WRITE: {n} allocations");
    // Not on a chunk boundary: copied, the data lands.
    let w = whole_of(3);
    assert_eq!(write(1024, &w, w.as_bytes()), ScsiStatus::GOOD);
    let got = read(1024);
    assert!(got.iter().all(|&b| b == 3));
    assert_ne!(got.as_ptr(), w.as_bytes().as_ptr());
    // A `whole` that is not the request's data is ignored: the request's data is written.
    let w = whole_of(4);
    let other = vec![5u8; 1 << 20];
    assert_eq!(write(4096, &w, &other), ScsiStatus::GOOD);
    let got = read(4096);
    assert!(got.iter().all(|&b| b == 5));
    assert_ne!(got.as_ptr(), w.as_bytes().as_ptr());
}
