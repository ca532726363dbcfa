//! `null:1TiB`: Aiken et al.'s diskless target — writes are discarded, reads return zeros:
//! the protocol's cost without a disk.

use std::io;

use crate::backend::{check_range, Backend, Extent};
use crate::request::Engine;

/// Diskless store (Aiken et al.): writes vanish, reads are zeros, flush is free.
#[derive(Debug)]
pub struct NullBackend {
    size: std::sync::atomic::AtomicU64,
}

impl NullBackend {
    /// A null store that claims `size` bytes.
    pub fn new(size: u64) -> Self {
        Self {
            size: std::sync::atomic::AtomicU64::new(size),
        }
    }
}

impl Backend for NullBackend {
    fn size(&self) -> u64 {
        self.size.load(std::sync::atomic::Ordering::Acquire)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)?;
        buf.fill(0);
        Ok(())
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size(), offset, buf.len() as u64)
    }
    fn flush(&self) -> io::Result<()> {
        Ok(())
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size(), offset, len)
    }
    fn kind(&self) -> &'static str {
        "null"
    }
    fn grow(&self, size: u64) -> io::Result<()> {
        self.size
            .fetch_max(size, std::sync::atomic::Ordering::AcqRel);
        Ok(())
    }

    fn engine(&self) -> Engine {
        Engine::Inline
    }
    fn supports_unmap(&self) -> bool {
        true
    }
    fn extent(&self, offset: u64) -> io::Result<Extent> {
        check_range(self.size(), offset, 0)?;
        Ok(Extent {
            mapped: false,
            len: self.size() - offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_backend_discards_writes() {
        let n = NullBackend::new(1 << 30);
        n.write_at(&[9u8; 4096], 0).unwrap();
        let mut b = [1u8; 4096];
        n.read_at(&mut b, 0).unwrap();
        assert!(b.iter().all(|&x| x == 0));
        assert_eq!(n.kind(), "null");
    }
}
