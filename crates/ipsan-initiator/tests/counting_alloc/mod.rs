//! A global allocator that forwards to the system's and calls a test's hook with the size of
//! every allocation and reallocation (the tests that prove data is received without a buffer
//! per command count the large ones).

use std::alloc::{GlobalAlloc, Layout, System};

/// The system allocator, with `.0` called on each allocation's size before it is made.
pub struct Counting(pub fn(usize));

// SAFETY: forwards to the system allocator; only counts.
#[allow(unsafe_code)]
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        (self.0)(l.size());
        // SAFETY: the caller's layout contract is passed on unchanged.
        unsafe { System.alloc(l) }
    }
    unsafe fn alloc_zeroed(&self, l: Layout) -> *mut u8 {
        (self.0)(l.size());
        // SAFETY: as `alloc`.
        unsafe { System.alloc_zeroed(l) }
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        (self.0)(new);
        // SAFETY: `p` came from this allocator with `l`; the caller's contract is passed on.
        unsafe { System.realloc(p, l, new) }
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        // SAFETY: `p` came from `System.alloc` with `l`.
        unsafe { System.dealloc(p, l) }
    }
}

use std::cell::Cell;
use std::sync::atomic::{AtomicUsize, Ordering};

/// An allocation at least this large is a data or receive buffer (the reader's receive buffer
/// is 256 KiB; nothing else a side allocates per command comes near).
pub const LARGE: usize = 200 * 1024;

thread_local! {
    static MARKED: Cell<bool> = const { Cell::new(false) };
}

static MARKED_LARGE: AtomicUsize = AtomicUsize::new(0);

/// The hook of a test that counts the [`LARGE`] allocations of the threads it [`mark`]s.
#[allow(dead_code)] // not every test binary of this directory counts this way
pub fn count_marked_large(size: usize) {
    // `try_with`: a thread being torn down has no thread-locals left.
    if size >= LARGE && MARKED.try_with(Cell::get).unwrap_or(false) {
        MARKED_LARGE.fetch_add(1, Ordering::Relaxed);
    }
}

/// Counts (or stops counting) the calling thread's [`LARGE`] allocations.
#[allow(dead_code)]
pub fn mark(on: bool) {
    MARKED.with(|m| m.set(on));
}

/// [`LARGE`] allocations made on marked threads so far.
#[allow(dead_code)]
pub fn marked_large() -> usize {
    MARKED_LARGE.load(Ordering::Relaxed)
}
