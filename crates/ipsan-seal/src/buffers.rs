//! Sealed-transfer buffers, reused (docs/seal.md §8 *Cost*).
//!
//! A sealed copy needs a fresh `sealed_len(N)`-byte buffer per command. Allocated anew, each
//! 1 MiB buffer is faulted in page by page from the kernel (`clear_page`) and zero-filled before
//! the cipher may write into it (safe Rust hands the cipher only initialised memory): together
//! more CPU than the AES itself. A session keeps the buffers its sealed transfers come back
//! from: the [`Bytes`] it hands out owns a [`Recycled`] buffer that returns to the session's
//! free list when the last slice of the transfer is dropped (the PDUs have left). A reused
//! buffer's pages are mapped and its bytes initialised — they hold an earlier transfer's
//! *sealed* bytes (already on the wire), every one of which is overwritten before the new
//! transfer is handed out — so neither the page faults nor the zero-fill recur.
//!
//! Only transfers of at least [`MIN_LEN`] bytes are recycled (small ones are cheap to allocate
//! and would only pin memory), and a session keeps at most [`KEEP`] buffers of at most
//! [`MAX_LEN`] bytes each, [`KEEP_BYTES`] in all.

use std::sync::{Arc, Mutex};

use bytes::{Bytes, BytesMut};

/// Smallest transfer that gets a recycled buffer (smaller ones allocate as before).
pub(crate) const MIN_LEN: usize = 64 * 1024;
/// Largest buffer kept for reuse.
pub(crate) const MAX_LEN: usize = 16 * 1024 * 1024 + 64 * 1024;
/// Buffers kept per session: a queue depth's worth of 1 MiB transfers and a few more.
pub(crate) const KEEP: usize = 24;
/// Bytes of buffers kept per session (large transfers keep fewer buffers).
pub(crate) const KEEP_BYTES: usize = 32 * 1024 * 1024;

/// A session's free list of sealed-transfer buffers.
#[derive(Debug, Default)]
pub(crate) struct BufferPool {
    free: Mutex<Vec<BytesMut>>,
}

impl BufferPool {
    /// A buffer of exactly `len` initialised bytes (their values are unspecified: the caller
    /// overwrites every one). A kept buffer with room for `len` bytes and not much more is
    /// reused; otherwise one is allocated and zero-filled.
    pub(crate) fn take(&self, len: usize) -> BytesMut {
        if (MIN_LEN..=MAX_LEN).contains(&len) {
            let found = {
                let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
                // Most recently returned first: its pages are the likeliest to be in cache.
                free.iter()
                    .rposition(|b| b.capacity() >= len && b.capacity() <= len.saturating_mul(2))
                    .map(|i| free.swap_remove(i))
            };
            if let Some(mut b) = found {
                // Shrinks, or zero-fills only the bytes past the last transfer's end (within
                // capacity: no reallocation).
                b.resize(len, 0);
                return b;
            }
        }
        BytesMut::zeroed(len)
    }

    /// Freezes a transfer sealed into a buffer from [`Self::take`]; the buffer comes back to
    /// this pool when the returned `Bytes` and every slice of it are dropped.
    pub(crate) fn freeze(self: &Arc<Self>, buf: BytesMut) -> Bytes {
        if (MIN_LEN..=MAX_LEN).contains(&buf.len()) {
            Bytes::from_owner(Recycled {
                buf,
                home: Arc::clone(self),
            })
        } else {
            buf.freeze()
        }
    }

    fn put(&self, buf: BytesMut) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        let kept: usize = free.iter().map(BytesMut::capacity).sum();
        if free.len() < KEEP && kept.saturating_add(buf.capacity()) <= KEEP_BYTES {
            free.push(buf);
        }
    }

    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.free.lock().map(|f| f.len()).unwrap_or(0)
    }
}

/// A sealed transfer's buffer, owned by the `Bytes` that carries it.
#[derive(Debug)]
struct Recycled {
    buf: BytesMut,
    home: Arc<BufferPool>,
}

impl AsRef<[u8]> for Recycled {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Recycled {
    fn drop(&mut self) {
        self.home.put(std::mem::take(&mut self.buf));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dropped_transfer_returns_its_buffer_and_the_next_take_reuses_it() {
        let pool = Arc::new(BufferPool::default());
        let mut b = pool.take(1 << 20);
        assert_eq!(b.len(), 1 << 20);
        b[0] = 7;
        let ptr = b.as_ptr();
        let sealed = pool.freeze(b);
        let slice = sealed.slice(10..20);
        drop(sealed);
        assert_eq!(pool.kept(), 0, "a slice still holds the buffer");
        drop(slice);
        assert_eq!(pool.kept(), 1);
        let again = pool.take((1 << 20) - 100);
        assert_eq!(again.as_ptr(), ptr);
        assert_eq!(again.len(), (1 << 20) - 100);
        assert_eq!(pool.kept(), 0);
    }

    #[test]
    fn small_transfers_are_not_recycled() {
        let pool = Arc::new(BufferPool::default());
        let b = pool.take(4096);
        drop(pool.freeze(b));
        assert_eq!(pool.kept(), 0);
    }

    #[test]
    fn keeps_at_most_keep_buffers() {
        let pool = Arc::new(BufferPool::default());
        let all: Vec<Bytes> = (0..KEEP + 5)
            .map(|_| pool.freeze(pool.take(MIN_LEN)))
            .collect();
        drop(all);
        assert_eq!(pool.kept(), KEEP);
    }

    #[test]
    fn keeps_at_most_keep_bytes() {
        let pool = Arc::new(BufferPool::default());
        let all: Vec<Bytes> = (0..4).map(|_| pool.freeze(pool.take(MAX_LEN))).collect();
        drop(all);
        assert_eq!(pool.kept(), KEEP_BYTES / MAX_LEN);
    }

    #[test]
    fn a_much_larger_buffer_is_not_used_for_a_small_transfer() {
        let pool = Arc::new(BufferPool::default());
        drop(pool.freeze(pool.take(4 << 20)));
        assert!(pool.take(MIN_LEN).capacity() < (4 << 20));
        assert_eq!(pool.kept(), 1);
    }
}
