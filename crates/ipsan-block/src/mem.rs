//! `mem:256MiB`: a sparse RAM store.
//!
//! Long reads hand out the store's own memory ([`Backend::read_shared`]): a chunk is a
//! `Bytes`, a read of 64 KiB or more inside one written chunk is a slice of it (no copy; the
//! socket's copy is the only one), and a write copies a chunk first only while such a slice of
//! it is still held (copy on write: the read keeps the bytes it was answered with).

use std::fmt;
use std::io;
use std::sync::RwLock;

use bytes::{Bytes, BytesMut};

use crate::backend::{check_range, poisoned, Backend, Extent, Whole};
use crate::request::Engine;

const CHUNK: usize = 1 << 20;

/// Reads at least this long are answered with a slice of the chunk ([`Backend::read_shared`]);
/// shorter ones are copied. A write to a chunk a slice still holds copies the chunk (1 MiB),
/// which saving the copy of a short read is not worth: small random reads and writes on a
/// small LUN would keep colliding.
const SHARED_READ_MIN: usize = 64 << 10;

/// Sparse RAM store: 1 MiB chunks allocated on first write, so `mem:64GiB` costs nothing
/// until written. Unmapping a whole chunk frees it.
pub struct MemBackend {
    size: u64,
    chunks: Box<[Chunk]>,
}

/// One 1 MiB page of a [`MemBackend`]; `None` until first written. Shared with the reads
/// answered from it ([`Backend::read_shared`]) until they are done with it.
type Chunk = RwLock<Option<Bytes>>;

/// The chunk in `slot`, writable: allocated (zeroed) on first write, copied first only when a
/// read still holds a slice of it (copy on write), otherwise taken back without a copy.
fn writable(slot: &mut Option<Bytes>) -> BytesMut {
    match slot.take() {
        None => BytesMut::zeroed(CHUNK),
        Some(b) => b
            .try_into_mut()
            .unwrap_or_else(|shared| BytesMut::from(&shared[..])),
    }
}

impl fmt::Debug for MemBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemBackend")
            .field("size", &self.size)
            .field("allocated_chunks", &self.allocated_chunks())
            .finish()
    }
}

impl MemBackend {
    /// A zero-filled store of `size` bytes.
    pub fn new(size: u64) -> Self {
        let n = size.div_ceil(CHUNK as u64) as usize;
        let chunks = (0..n).map(|_| RwLock::new(None)).collect();
        Self { size, chunks }
    }

    /// Number of 1 MiB chunks currently holding memory.
    pub fn allocated_chunks(&self) -> usize {
        self.chunks
            .iter()
            .filter(|c| c.read().map(|g| g.is_some()).unwrap_or(false))
            .count()
    }

    /// Calls `f(chunk index, offset in chunk, range in caller's buffer)` for each chunk
    /// piece of `[offset, offset+len)`.
    fn spans(
        offset: u64,
        len: u64,
        mut f: impl FnMut(usize, usize, std::ops::Range<usize>) -> io::Result<()>,
    ) -> io::Result<()> {
        let mut done = 0u64;
        while done < len {
            let pos = offset + done;
            let idx = (pos / CHUNK as u64) as usize;
            let in_chunk = (pos % CHUNK as u64) as usize;
            let n = (CHUNK - in_chunk).min((len - done) as usize);
            f(idx, in_chunk, done as usize..done as usize + n)?;
            done += n as u64;
        }
        Ok(())
    }
}

impl Backend for MemBackend {
    fn size(&self) -> u64 {
        self.size
    }

    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::spans(offset, buf.len() as u64, |idx, at, r| {
            let g = self.chunks[idx].read().map_err(|_| poisoned())?;
            let n = r.len();
            match g.as_ref() {
                Some(c) => buf[r].copy_from_slice(&c[at..at + n]),
                None => buf[r].fill(0),
            }
            Ok(())
        })
    }

    fn read_append(&self, buf: &mut BytesMut, len: usize, offset: u64) -> io::Result<()> {
        check_range(self.size, offset, len as u64)?;
        let start = buf.len();
        buf.reserve(len);
        let r = Self::spans(offset, len as u64, |idx, at, r| {
            let g = self.chunks[idx].read().map_err(|_| poisoned())?;
            match g.as_ref() {
                Some(c) => buf.extend_from_slice(&c[at..at + r.len()]),
                None => buf.resize(buf.len() + r.len(), 0),
            }
            Ok(())
        });
        if r.is_err() {
            buf.truncate(start);
        }
        r
    }

    fn read_shared(&self, len: usize, offset: u64) -> Option<io::Result<Bytes>> {
        if len < SHARED_READ_MIN {
            return None;
        }
        if let Err(e) = check_range(self.size, offset, len as u64) {
            return Some(Err(e));
        }
        let (idx, at) = (
            (offset / CHUNK as u64) as usize,
            (offset % CHUNK as u64) as usize,
        );
        if at + len > CHUNK {
            return None;
        }
        let g = match self.chunks[idx].read() {
            Ok(g) => g,
            Err(_) => return Some(Err(poisoned())),
        };
        // A chunk never written reads as zeros: the caller's zero fill, nothing to share.
        g.as_ref().map(|c| Ok(c.slice(at..at + len)))
    }

    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        check_range(self.size, offset, buf.len() as u64)?;
        Self::spans(offset, buf.len() as u64, |idx, at, r| {
            let mut g = self.chunks[idx].write().map_err(|_| poisoned())?;
            let n = r.len();
            let mut c = writable(&mut g);
            c[at..at + n].copy_from_slice(&buf[r]);
            *g = Some(c.freeze());
            Ok(())
        })
    }

    /// A write of exactly one chunk, at its start, keeps the caller's buffer as the chunk (no
    /// copy: issue 27's 1 MiB writes); the chunk it replaces is freed once no read holds a
    /// slice of it. Any other write copies ([`Backend::write_at`]).
    fn write_whole(&self, data: Whole, offset: u64) -> io::Result<()> {
        if data.len() != CHUNK || offset % CHUNK as u64 != 0 {
            return self.write_at(data.as_bytes(), offset);
        }
        check_range(self.size, offset, CHUNK as u64)?;
        let idx = (offset / CHUNK as u64) as usize;
        let old = {
            let mut g = self.chunks[idx].write().map_err(|_| poisoned())?;
            g.replace(data.into_bytes())
        };
        // Freed outside the lock.
        drop(old);
        Ok(())
    }

    fn flush(&self) -> io::Result<()> {
        Ok(())
    }

    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        check_range(self.size, offset, len)?;
        Self::spans(offset, len, |idx, at, r| {
            let mut g = self.chunks[idx].write().map_err(|_| poisoned())?;
            let n = r.len();
            if at == 0 && n == CHUNK {
                *g = None;
            } else if g.is_some() {
                // A partly unmapped page stays allocated (zeroed range): scanning the whole
                // page for "all zero" on every small UNMAP made libiscsi's Unmap suite take
                // minutes. OPTIMAL UNMAP GRANULARITY tells initiators to send whole pages.
                let mut c = writable(&mut g);
                c[at..at + n].fill(0);
                *g = Some(c.freeze());
            }
            Ok(())
        })
    }

    fn kind(&self) -> &'static str {
        "mem"
    }

    fn engine(&self) -> Engine {
        Engine::Inline
    }

    fn supports_unmap(&self) -> bool {
        true
    }

    fn extent(&self, offset: u64) -> io::Result<Extent> {
        check_range(self.size, offset, 0)?;
        let mut idx = (offset / CHUNK as u64) as usize;
        let state = |i: usize| -> io::Result<bool> {
            Ok(self.chunks[i].read().map_err(|_| poisoned())?.is_some())
        };
        if idx >= self.chunks.len() {
            return Ok(Extent {
                mapped: false,
                len: 0,
            });
        }
        let mapped = state(idx)?;
        idx += 1;
        while idx < self.chunks.len() && state(idx)? == mapped {
            idx += 1;
        }
        let end = (idx as u64 * CHUNK as u64).min(self.size);
        Ok(Extent {
            mapped,
            len: end - offset,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::null::NullBackend;

    #[test]
    fn mem_backend_is_sparse_and_unmap_frees_chunks() {
        let m = MemBackend::new(64 << 30);
        assert_eq!(m.allocated_chunks(), 0);
        let mut buf = vec![1u8; 4096];
        m.read_at(&mut buf, 10 << 30).unwrap();
        assert!(buf.iter().all(|&b| b == 0));
        assert_eq!(m.allocated_chunks(), 0, "reads must not allocate");
        // A write straddling a chunk boundary allocates exactly two chunks.
        m.write_at(&[0xAB; 8192], (1 << 20) - 4096).unwrap();
        assert_eq!(m.allocated_chunks(), 2);
        let mut back = vec![0u8; 8192];
        m.read_at(&mut back, (1 << 20) - 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0xAB));
        assert_eq!(
            m.extent(0).unwrap(),
            Extent {
                mapped: true,
                len: 2 << 20
            }
        );
        assert!(!m.extent(2 << 20).unwrap().mapped);
        m.unmap(0, 2 << 20).unwrap();
        assert_eq!(m.allocated_chunks(), 0);
        m.read_at(&mut back, (1 << 20) - 4096).unwrap();
        assert!(back.iter().all(|&b| b == 0));
    }

    #[test]
    fn read_append_matches_read_at_across_chunks_holes_and_backends() {
        let mem = MemBackend::new(4 * CHUNK as u64);
        let data: Vec<u8> = (0..CHUNK + 5000).map(|i| (i * 7 + 3) as u8).collect();
        mem.write_at(&data, CHUNK as u64 / 2).unwrap();
        let null = NullBackend::new(4 * CHUNK as u64);
        let backends: [&dyn Backend; 2] = [&mem, &null];
        for b in backends {
            // Spans: inside one chunk, across two, over a never-written (sparse) chunk, to the end.
            for (off, len) in [
                (10u64, 100usize),
                (CHUNK as u64 - 7, 4096),
                (CHUNK as u64 / 2 - 3, CHUNK + 5006),
                (3 * CHUNK as u64 - 10, CHUNK + 10),
            ] {
                let mut want = vec![0xeeu8; len];
                b.read_at(&mut want, off).unwrap();
                let mut got = BytesMut::from(&b"head"[..]);
                b.read_append(&mut got, len, off).unwrap();
                assert_eq!(&got[..4], b"head", "{} {off}+{len}", b.kind());
                assert_eq!(&got[4..], &want[..], "{} {off}+{len}", b.kind());
            }
            // Out of range: an error and the buffer untouched.
            let mut got = BytesMut::from(&b"head"[..]);
            assert!(b.read_append(&mut got, 20, 4 * CHUNK as u64 - 10).is_err());
            assert_eq!(&got[..], b"head");
        }
    }

    /// A long read is a slice of the store's chunk (no copy), and it keeps the bytes it was
    /// answered with: a write (or a partial UNMAP) after it copies the chunk instead of
    /// changing them, and later reads see the write.
    #[test]
    fn accepts_a_shared_read_that_keeps_its_bytes_across_later_writes() {
        let m = MemBackend::new(4 * CHUNK as u64);
        let len = SHARED_READ_MIN;
        let off = CHUNK as u64 + 4096;
        m.write_at(&vec![1u8; len], off).unwrap();
        let a = m.read_shared(len, off).unwrap().unwrap();
        assert_eq!(a.len(), len);
        assert!(a.iter().all(|&b| b == 1));
        m.write_at(&vec![2u8; len], off).unwrap();
        m.unmap(off, 512).unwrap();
        assert!(
            a.iter().all(|&b| b == 1),
            "the earlier read's bytes changed under it"
        );
        let b = m.read_shared(len, off).unwrap().unwrap();
        assert!(b[..512].iter().all(|&x| x == 0));
        assert!(b[512..].iter().all(|&x| x == 2));
        let mut back = vec![0u8; len];
        m.read_at(&mut back, off).unwrap();
        assert_eq!(&back[..], &b[..]);
        // Once no read holds the chunk, a write changes it in place (no copy): same memory.
        let before = b.as_ptr();
        drop((a, b));
        m.write_at(&[3u8; 512], off).unwrap();
        let c = m.read_shared(len, off).unwrap().unwrap();
        assert_eq!(
            c.as_ptr(),
            before,
            "the chunk was copied though nothing held it"
        );
        assert!(c[..512].iter().all(|&x| x == 3));
    }

    /// What cannot be a slice of one written chunk is not offered as one: a short read, a
    /// read across two chunks, a chunk never written (zeros); out of range is an error.
    #[test]
    fn rejects_sharing_a_short_straddling_or_unwritten_read() {
        let m = MemBackend::new(4 * CHUNK as u64);
        m.write_at(&vec![5u8; 2 * CHUNK], 0).unwrap();
        assert!(m.read_shared(SHARED_READ_MIN - 512, 0).is_none());
        assert!(m
            .read_shared(SHARED_READ_MIN, CHUNK as u64 - 4096)
            .is_none());
        assert!(m.read_shared(SHARED_READ_MIN, 3 * CHUNK as u64).is_none());
        assert!(matches!(
            m.read_shared(SHARED_READ_MIN, 4 * CHUNK as u64),
            Some(Err(_))
        ));
        assert!(m.read_shared(CHUNK, CHUNK as u64).is_some());
    }

    /// A write of exactly one chunk at its start keeps the caller's buffer (the chunk is then
    /// that memory, no copy); a read answered before it keeps its bytes, later writes into
    /// the kept chunk land, and a whole write that is not one chunk is copied as usual.
    #[test]
    fn keeps_a_whole_chunk_write_as_the_chunk() {
        let m = MemBackend::new(4 * CHUNK as u64);
        m.write_at(&vec![1u8; CHUNK], CHUNK as u64).unwrap();
        let before = m.read_shared(CHUNK, CHUNK as u64).unwrap().unwrap();
        let mut buf = BytesMut::with_capacity(CHUNK);
        buf.resize(CHUNK, 2);
        let whole = Whole::new(buf).unwrap();
        let ptr = whole.as_bytes().as_ptr();
        m.write_whole(whole, CHUNK as u64).unwrap();
        assert!(before.iter().all(|&b| b == 1), "an earlier read changed");
        let kept = m.read_shared(CHUNK, CHUNK as u64).unwrap().unwrap();
        assert_eq!(kept.as_ptr(), ptr, "the chunk was copied, not kept");
        assert!(kept.iter().all(|&b| b == 2));
        drop(kept);
        // A later write into the kept chunk changes it (copy on write if a read held it).
        m.write_at(&[3u8; 512], CHUNK as u64 + 512).unwrap();
        let mut back = vec![0u8; 2048];
        m.read_at(&mut back, CHUNK as u64).unwrap();
        assert!(back[..512].iter().all(|&b| b == 2));
        assert!(back[512..1024].iter().all(|&b| b == 3));
        assert!(back[1024..].iter().all(|&b| b == 2));
        // Not one chunk at its start: copied (the buffer is not the chunk).
        for (len, off) in [
            (CHUNK, 4096u64),
            (CHUNK / 2, 0),
            (2 * CHUNK, 2 * CHUNK as u64),
        ] {
            let mut buf = BytesMut::with_capacity(len);
            buf.resize(len, 4);
            let whole = Whole::new(buf).unwrap();
            let ptr = whole.as_bytes().as_ptr();
            m.write_whole(whole, off).unwrap();
            let mut back = vec![0u8; len];
            m.read_at(&mut back, off).unwrap();
            assert!(back.iter().all(|&b| b == 4), "{len} at {off}");
            let idx = (off / CHUNK as u64) as usize;
            let g = m.chunks[idx].read().unwrap();
            assert_ne!(g.as_ref().map(|c| c.as_ptr()), Some(ptr), "{len} at {off}");
        }
        // Out of range: an error, nothing kept.
        let mut buf = BytesMut::with_capacity(CHUNK);
        buf.resize(CHUNK, 5);
        assert!(m
            .write_whole(Whole::new(buf).unwrap(), 4 * CHUNK as u64)
            .is_err());
        // A buffer with room past its end is no whole buffer.
        let mut roomy = BytesMut::with_capacity(2 * CHUNK);
        roomy.resize(CHUNK, 6);
        assert!(Whole::new(roomy).is_err());
    }

    #[test]
    fn mem_partial_unmap_zeroes_only_the_range() {
        let m = MemBackend::new(4 << 20);
        m.write_at(&[7u8; 8192], 0).unwrap();
        m.unmap(4096, 4096).unwrap();
        let mut b = vec![0u8; 8192];
        m.read_at(&mut b, 0).unwrap();
        assert!(b[..4096].iter().all(|&x| x == 7));
        assert!(b[4096..].iter().all(|&x| x == 0));
    }

    #[test]
    fn rejects_io_beyond_size() {
        let m = MemBackend::new(1 << 20);
        assert!(m.write_at(&[0; 512], (1 << 20) - 256).is_err());
        let mut b = [0u8; 512];
        assert!(m.read_at(&mut b, u64::MAX - 10).is_err());
        let n = NullBackend::new(1 << 20);
        assert!(n.read_at(&mut b, 1 << 20).is_err());
    }
}
