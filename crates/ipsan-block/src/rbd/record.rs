//! The shared record of an RBD image ([`SharedRecord`]): a RADOS object next to the image
//! (`ipsan.pr.<image id>` in the image's pool and namespace; the name predates the record's
//! generality: the SCSI front end keeps its persistent reservations there), which every
//! gateway serving the image reads alike. A refresher thread keeps a cached copy for the
//! checks every command makes; stores are compare-and-swap in the OSD, then a notify every
//! gateway's watch acknowledges by dropping its copy (docs/rbd.md).

use std::fmt;
use std::io;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;

use super::Inner;
use crate::backend::SharedRecord;

/// How long a gateway trusts its cached reservation state without reading the object
/// again (docs/rbd.md: why this bounds staleness only when a watch is lost unnoticed).
pub(super) const PR_CACHE_TTL: Duration = Duration::from_secs(2);
/// How often the refresher reads the reservation object when nothing wakes it.
pub(super) const PR_REFRESH: Duration = Duration::from_millis(700);
/// How long a command waits for a refresh under way before it fails with NOT READY.
const PR_WAIT: Duration = Duration::from_millis(200);
/// How long a reservation change waits for the other gateways to acknowledge it. Longer
/// than [`PR_CACHE_TTL`]: when it times out, every cache older than the change has expired.
const PR_NOTIFY_TIMEOUT_MS: u64 = 5_000;
/// The largest record read back (about 2000 SCSI reservation registrations).
pub(super) const PR_MAX_BYTES: usize = 256 << 10;

/// The record as last read by the refresher thread, for the checks of every command
/// ([`SharedRecord::current`]), which never wait on the cluster themselves.
#[derive(Default)]
pub(super) struct Cache {
    m: Mutex<CacheState>,
    /// Signalled after each refresh.
    done: Condvar,
}

#[derive(Default)]
struct CacheState {
    entry: Option<Cached>,
    /// When the refresh under way started.
    refreshing_since: Option<std::time::Instant>,
    /// The last refresh's error, while no refresh succeeded since.
    error: Option<(io::ErrorKind, Option<i32>, String)>,
}

impl Inner {
    /// Reads the record object: its contents and version (0: no object, empty contents).
    fn load_pr(self: &Arc<Self>) -> io::Result<(Arc<[u8]>, u64)> {
        let bytes = self
            .conn()
            .image
            .read_obj(&self.pr_oid, PR_MAX_BYTES)
            .inspect_err(|e| self.after_error(e))?;
        let Some(bytes) = bytes else {
            return Ok((Arc::from(&[][..]), 0));
        };
        let bad = || {
            io::Error::new(
                io::ErrorKind::InvalidData,
                "reservation object: bad version",
            )
        };
        let nl = bytes.iter().position(|&b| b == b'\n').ok_or_else(bad)?;
        let version: u64 = std::str::from_utf8(&bytes[..nl])
            .ok()
            .and_then(|v| v.parse().ok())
            .ok_or_else(bad)?;
        Ok((Arc::from(&bytes[nl + 1..]), version))
    }

    /// One refresh of the cached record (the refresher thread).
    pub(super) fn refresh_pr(self: &Arc<Self>) {
        let epoch = self.events.pr_epoch.load(Ordering::Acquire);
        let read_at = std::time::Instant::now();
        self.pr_cache
            .m
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .refreshing_since = Some(read_at);
        let r = self.load_pr();
        let mut g = self.pr_cache.m.lock().unwrap_or_else(|p| p.into_inner());
        g.refreshing_since = None;
        match r {
            Ok((state, _)) => {
                // Keep the same `Arc` while the contents did not change, so that callers
                // keep what they decoded from it (`SharedRecord::current`).
                let state = match g.entry.take() {
                    Some(old) if *old.state == *state => old.state,
                    _ => state,
                };
                g.entry = Some(Cached {
                    state,
                    read_at,
                    epoch,
                });
                g.error = None;
            }
            Err(e) => {
                tracing::warn!(image = %self.path, "rbd: cannot read the reservation state: {e}");
                g.error = Some((e.kind(), e.raw_os_error(), e.to_string()));
            }
        }
        drop(g);
        self.pr_cache.done.notify_all();
    }
}

/// The record in a RADOS object next to the image (`ipsan.pr.<image id>` in the image's
/// pool and namespace), shared by every gateway serving the image: the object holds
/// `<version>\n` and the front end's bytes (`ipsan_scsi::pr::PrState::encode`'s text), its
/// `ipsan.ver` xattr the version. [`SharedRecord::store`] is one RADOS write op (compare the
/// xattr, write all, set the xattr), atomic in the OSD, then a notify every gateway's watch
/// acknowledges by dropping its cached copy; [`SharedRecord::current`] serves the cached
/// copy for at most [`PR_CACHE_TTL`] (docs/rbd.md).
pub(super) struct RbdRecord {
    pub(super) inner: Arc<Inner>,
}

struct Cached {
    state: Arc<[u8]>,
    /// When the read that produced it was issued.
    read_at: std::time::Instant,
    /// The notification epoch before that read.
    epoch: u64,
}

impl fmt::Debug for RbdRecord {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RbdRecord")
            .field("object", &self.inner.pr_oid)
            .finish_non_exhaustive()
    }
}

impl SharedRecord for RbdRecord {
    /// The cached record while it is current (same notification epoch, younger than
    /// [`PR_CACHE_TTL`]); else waits up to [`PR_WAIT`] for the refresher, so a command never
    /// blocks on an unreachable cluster (it fails with NOT READY instead).
    fn current(&self) -> io::Result<Arc<[u8]>> {
        let c = &self.inner.pr_cache;
        let deadline = std::time::Instant::now() + PR_WAIT;
        let mut g = c.m.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            let epoch = self.inner.events.pr_epoch.load(Ordering::Acquire);
            if let Some(e) = &g.entry {
                if e.epoch == epoch && e.read_at.elapsed() < PR_CACHE_TTL {
                    return Ok(e.state.clone());
                }
            }
            let now = std::time::Instant::now();
            let stuck = g.refreshing_since.is_some_and(|t| now - t > PR_WAIT);
            if stuck || now >= deadline {
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the reservation state could not be read in time",
                ));
            }
            if g.refreshing_since.is_none() {
                if let Some((kind, code, msg)) = &g.error {
                    // The last refresh failed and none is under way: fail now, retry soon.
                    self.inner.events.wake_pr();
                    return Err(match code {
                        Some(c) => io::Error::from_raw_os_error(*c),
                        None => io::Error::new(*kind, msg.clone()),
                    });
                }
                self.inner.events.wake_pr();
            }
            g = c
                .done
                .wait_timeout(g, deadline - now)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }

    fn load(&self) -> io::Result<(Arc<[u8]>, u64)> {
        self.inner.load_pr()
    }

    fn store(&self, new: &[u8], expected: u64) -> io::Result<bool> {
        let version = expected.wrapping_add(1).to_string();
        let mut data = format!("{version}\n").into_bytes();
        data.extend_from_slice(new);
        if data.len() > PR_MAX_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                "reservation state too large",
            ));
        }
        let conn = self.inner.conn();
        let old = expected.to_string();
        let expect = (expected > 0).then_some(old.as_bytes());
        if !conn
            .image
            .cas_obj(&self.inner.pr_oid, expect, version.as_bytes(), &data)
            .inspect_err(|e| self.inner.after_error(e))?
        {
            return Ok(false);
        }
        let stored = std::time::Instant::now();
        self.inner.events.pr_epoch.fetch_add(1, Ordering::AcqRel);
        self.inner.events.wake_pr();
        // Every gateway's watch drops its cached copy before acknowledging; without the
        // acknowledgements, wait until any copy older than this change has expired.
        if let Err(e) = conn
            .image
            .notify_obj(&self.inner.pr_oid, PR_NOTIFY_TIMEOUT_MS)
        {
            tracing::warn!(image = %self.inner.path, "rbd: reservation change not acknowledged by every gateway: {e}");
            std::thread::sleep(PR_CACHE_TTL.saturating_sub(stored.elapsed()));
        }
        Ok(true)
    }
}
