//! `disk:4GiB[,seek=8.5ms][,rpm=7200][,rate=30MB][,file=PATH]`: a store that takes the time
//! a single disk would (Aiken et al. (003) measured iSCSI against a diskless target *and* a
//! real disk; a `file:` LUN is the page cache, which answers in microseconds). The bytes live
//! in a RAM store (or the file `file=` names, through the page cache); the time each request
//! takes is the [`DiskModel`]'s:
//!
//! - **one head, a queue of one**: requests are served one after another in arrival order;
//!   a request that arrives while the head is busy waits for it ([`Head::schedule`]);
//! - **sequential**: a request that starts where the previous one ended pays only its
//!   transfer, `len / rate` (the head is already there; the drive's track buffer hides the
//!   rotation);
//! - **otherwise**: seek + rotational latency + transfer. The seek over a distance of `d`
//!   bytes on a disk of `S` bytes is `15/8 · seek · sqrt(d / S)` — the square-root law of
//!   short seeks (Ruemmler and Wilkes, "An introduction to disk drive modeling", 1994),
//!   scaled so that its mean over uniformly random pairs of positions (E[sqrt(x)] = 8/15 for
//!   the triangular distance distribution) is the stated average `seek`; the full stroke is
//!   15/8 of it. The rotational latency is its mean, half a revolution, `30 / rpm` s;
//! - no write cache: a write completes when the model says the media has it (Aiken et al.
//!   blame "the synchronous nature of disk writes"), so SYNCHRONIZE CACHE costs nothing.
//!
//! The defaults are a 2001 7200 rpm IDE drive of the kind Aiken et al.'s WAN hosts had (the
//! paper names only "a 20GB hard drive"): 8.5 ms average seek, 7200 rpm (4.17 ms half
//! revolution), 30 MB/s media rate. The model is a pure function of (head position, offset,
//! length) and the head's schedule a pure function of the time passed in; only
//! [`DiskBackend`] reads the clock and sleeps.

use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::BytesMut;

use crate::backend::{poisoned, Backend, BackendError, Extent};
use crate::file::FileBackend;
use crate::mem::MemBackend;
use crate::request::Engine;

/// The service-time model of one disk (see the module documentation).
#[derive(Clone, Copy, PartialEq, Debug)]
pub struct DiskModel {
    /// Mean seek time over uniformly random pairs of positions.
    pub seek: Duration,
    /// Spindle speed, revolutions per minute.
    pub rpm: u32,
    /// Media transfer rate, bytes per second.
    pub rate: u64,
    /// Capacity in bytes (the seek's full stroke).
    pub size: u64,
}

impl DiskModel {
    /// The defaults: 8.5 ms, 7200 rpm, 30 MB/s (a 2001 IDE drive).
    pub fn default_for(size: u64) -> DiskModel {
        DiskModel {
            seek: Duration::from_micros(8500),
            rpm: 7200,
            rate: 30_000_000,
            size,
        }
    }

    /// Seek over `distance` bytes: `15/8 · seek · sqrt(distance / size)`, 0 for no move.
    pub fn seek_time(&self, distance: u64) -> Duration {
        if distance == 0 || self.size == 0 {
            return Duration::ZERO;
        }
        let x = (distance.min(self.size) as f64 / self.size as f64).sqrt();
        self.seek.mul_f64(15.0 / 8.0 * x)
    }

    /// Mean rotational latency: half a revolution.
    pub fn rotation(&self) -> Duration {
        Duration::from_secs_f64(30.0 / f64::from(self.rpm.max(1)))
    }

    /// Moving `len` bytes past the head.
    pub fn transfer(&self, len: u64) -> Duration {
        Duration::from_secs_f64(len as f64 / self.rate.max(1) as f64)
    }

    /// Service time of a request of `len` bytes at `offset` with the head at `head` (the end
    /// of the previous request).
    pub fn service(&self, head: u64, offset: u64, len: u64) -> Duration {
        if offset == head {
            self.transfer(len)
        } else {
            self.seek_time(offset.abs_diff(head)) + self.rotation() + self.transfer(len)
        }
    }
}

/// The one head: where it is and when it is next free. Pure: the caller passes the time.
#[derive(Clone, Copy, Debug)]
pub struct Head {
    /// Byte position (the end of the last request).
    pub pos: u64,
    /// When the last scheduled request completes.
    pub free_at: Instant,
}

impl Head {
    /// A head at position 0, free at `now`.
    pub fn new(now: Instant) -> Head {
        Head {
            pos: 0,
            free_at: now,
        }
    }

    /// Queues a request arriving at `now`: it starts when the head is free (or now), takes
    /// the model's service time, and moves the head to its end. Returns its completion time.
    pub fn schedule(&mut self, model: &DiskModel, offset: u64, len: u64, now: Instant) -> Instant {
        let start = self.free_at.max(now);
        let done = start + model.service(self.pos, offset, len);
        self.pos = offset.saturating_add(len);
        self.free_at = done;
        done
    }
}

/// A store whose requests take the [`DiskModel`]'s time (`disk:` specs).
#[derive(Debug)]
pub struct DiskBackend {
    inner: Arc<dyn Backend>,
    model: DiskModel,
    head: Mutex<Head>,
}

impl DiskBackend {
    /// A disk of `model.size` bytes over a RAM store.
    pub fn new(model: DiskModel) -> DiskBackend {
        DiskBackend::over(Arc::new(MemBackend::new(model.size)), model)
    }

    /// A disk over the file at `path` (created sparse if missing).
    pub fn open_file(path: PathBuf, model: DiskModel) -> Result<DiskBackend, BackendError> {
        let f = FileBackend::open(path, Some(model.size), false)?;
        Ok(DiskBackend::over(Arc::new(f), model))
    }

    fn over(inner: Arc<dyn Backend>, model: DiskModel) -> DiskBackend {
        DiskBackend {
            inner,
            model,
            head: Mutex::new(Head::new(Instant::now())),
        }
    }

    /// The model in use.
    pub fn model(&self) -> &DiskModel {
        &self.model
    }

    /// Queues the request on the head and waits until the model says it is done. The lock
    /// is held only to schedule: requests are served in the order they took it.
    fn wait_for_head(&self, offset: u64, len: u64) -> io::Result<()> {
        let done = {
            let mut h = self.head.lock().map_err(|_| poisoned())?;
            h.schedule(&self.model, offset, len, Instant::now())
        };
        let now = Instant::now();
        if done > now {
            std::thread::sleep(done - now);
        }
        Ok(())
    }
}

impl Backend for DiskBackend {
    fn size(&self) -> u64 {
        self.model.size
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        self.inner.read_at(buf, offset)?;
        self.wait_for_head(offset, buf.len() as u64)
    }
    fn read_append(&self, buf: &mut BytesMut, len: usize, offset: u64) -> io::Result<()> {
        self.inner.read_append(buf, len, offset)?;
        self.wait_for_head(offset, len as u64)
    }
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.inner.write_at(buf, offset)?;
        self.wait_for_head(offset, buf.len() as u64)
    }
    fn flush(&self) -> io::Result<()> {
        // No write cache: every completed write is on the (modelled) media already.
        self.inner.flush()
    }
    fn unmap(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.unmap(offset, len)
    }
    fn write_zeroes(&self, offset: u64, len: u64) -> io::Result<()> {
        self.inner.write_zeroes(offset, len)?;
        self.wait_for_head(offset, len)
    }
    fn kind(&self) -> &'static str {
        "disk"
    }
    fn supports_unmap(&self) -> bool {
        self.inner.supports_unmap()
    }
    fn extent(&self, offset: u64) -> io::Result<Extent> {
        self.inner.extent(offset)
    }
    fn engine(&self) -> Engine {
        // Each request sleeps for its service time: on the blocking pool, never inline.
        Engine::Blocking
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn model() -> DiskModel {
        DiskModel::default_for(20 << 30)
    }

    fn close(a: Duration, b: Duration) -> bool {
        a.abs_diff(b) <= Duration::from_nanos(2)
    }

    #[test]
    fn sequential_access_costs_only_the_transfer() {
        let m = model();
        let t = m.service(1 << 20, 1 << 20, 1 << 20);
        assert!(close(t, Duration::from_secs_f64(1048576.0 / 30e6)), "{t:?}");
        // 30 MB/s: a sequential 64 KiB request is 2.18 ms.
        assert!(close(
            m.service(0, 0, 65536),
            Duration::from_secs_f64(65536.0 / 30e6)
        ));
    }

    #[test]
    fn random_access_adds_seek_and_half_a_revolution() {
        let m = model();
        let d = m.size / 4;
        let want = m.seek.mul_f64(15.0 / 8.0 * 0.5)
            + Duration::from_secs_f64(30.0 / 7200.0)
            + Duration::from_secs_f64(4096.0 / 30e6);
        let got = m.service(0, d, 4096);
        assert!(close(got, want), "{got:?} vs {want:?}");
        // The same distance backwards costs the same.
        assert!(close(m.service(2 * d, d, 4096), want));
        // Half a revolution at 7200 rpm is 4.17 ms; the full stroke 15/8 of 8.5 ms.
        assert_eq!(m.rotation().as_micros(), 4166);
        assert_eq!(m.seek_time(m.size).as_micros(), 15937);
        assert_eq!(m.seek_time(0), Duration::ZERO);
    }

    /// The stated `seek` is the mean over uniformly random pairs of positions.
    #[test]
    fn mean_seek_over_random_pairs_is_the_stated_average() {
        let m = model();
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m.size
        };
        let n = 200_000u32;
        let mut sum = Duration::ZERO;
        for _ in 0..n {
            let (a, b) = (next(), next());
            sum += m.seek_time(a.abs_diff(b));
        }
        let mean = sum / n;
        let err = (mean.as_secs_f64() / m.seek.as_secs_f64() - 1.0).abs();
        assert!(err < 0.01, "mean seek {mean:?} vs {:?}", m.seek);
    }

    /// One head: requests arriving together are served one after another, each from where
    /// the previous left the head; a request arriving at an idle head starts at once.
    #[test]
    fn head_serves_one_request_at_a_time() {
        let m = model();
        let t0 = Instant::now();
        let mut h = Head::new(t0);
        let a = h.schedule(&m, 0, 65536, t0);
        let b = h.schedule(&m, 65536, 65536, t0);
        let c = h.schedule(&m, m.size / 2, 4096, t0);
        assert!(close(a - t0, m.transfer(65536)));
        assert!(close(b - a, m.transfer(65536)), "sequential after a");
        assert!(close(c - b, m.service(131072, m.size / 2, 4096)));
        let later = c + Duration::from_secs(1);
        let d = h.schedule(&m, 0, 4096, later);
        assert!(close(d - later, m.service(m.size / 2 + 4096, 0, 4096)));
    }

    /// On the real clock: random reads from two threads at once take at least the sum of
    /// their service times (one head), and the data written comes back.
    #[test]
    fn random_requests_take_the_models_time_one_at_a_time() {
        let m = DiskModel {
            seek: Duration::from_millis(2),
            rpm: 15000,
            rate: 50_000_000,
            size: 64 << 20,
        };
        let d = Arc::new(DiskBackend::new(m));
        d.write_at(&[7u8; 4096], 32 << 20).unwrap();
        let mut b = [0u8; 4096];
        d.read_at(&mut b, 32 << 20).unwrap();
        assert!(b.iter().all(|&x| x == 7));
        let t = Instant::now();
        let threads: Vec<_> = (0..2u64)
            .map(|k| {
                let d = d.clone();
                std::thread::spawn(move || {
                    let mut buf = [0u8; 4096];
                    for i in 0..10u64 {
                        let off = if (i + k) % 2 == 0 {
                            0
                        } else {
                            (64 << 20) - 4096
                        };
                        d.read_at(&mut buf, off).unwrap();
                    }
                })
            })
            .collect();
        for th in threads {
            th.join().unwrap();
        }
        let took = t.elapsed();
        // 20 requests; at worst half of them are sequential repeats of the same spot, which
        // still pay the half revolution (offset != head: the head is past the block).
        let floor = (m.rotation() + m.transfer(4096)) * 20;
        assert!(took >= floor, "{took:?} < {floor:?}");
        assert_eq!(d.kind(), "disk");
    }
}
