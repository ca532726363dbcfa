//! The data path is written once (`lu/path.rs`) and the blocking `execute` drives it with
//! one poll: this counts the heap allocations of a READ and a WRITE through `execute` (a
//! counting global allocator, hence a test binary of its own). Before the sync and async
//! twins were merged the counts were the same: WRITE 1, READ 2.
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
fn blocking_read_and_write_allocate_only_the_read_buffer_and_the_nexus_key() {
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
    // The LU clones the nexus key on every command (`known`); the READ adds its buffer.
    assert!(w <= 1, "WRITE: {w} allocations");
    assert!(r <= 2, "READ: {r} allocations");
}
