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
