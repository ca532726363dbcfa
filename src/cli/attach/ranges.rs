//! Block-range locks for `ipsan attach`'s writes.
//!
//! A write that does not cover whole blocks is a read-modify-write: read the edge blocks, patch
//! the bytes, write the blocks back. Two such writes into the same block, or a RMW and a plain
//! write over it, would otherwise interleave as "A reads, B reads, A writes, B writes" and B
//! would put back the bytes A had just replaced. Every write therefore holds its block range
//! exclusively from its first read to its last write; writes to disjoint ranges run in
//! parallel, so depth is only lost where data would have been.

use std::sync::Mutex;

use tokio::sync::Notify;

/// The set of block ranges held by writes in flight.
#[derive(Debug, Default)]
pub struct RangeLocks {
    held: Mutex<Vec<(u64, u64)>>,
    released: Notify,
}

/// A held range `[start, end)` of blocks; dropping it releases the range and wakes waiters.
#[derive(Debug)]
pub struct RangeGuard<'a> {
    locks: &'a RangeLocks,
    range: (u64, u64),
}

impl RangeLocks {
    /// Wait until no held range overlaps `[start, end)`, then hold it.
    pub async fn lock(&self, start: u64, end: u64) -> RangeGuard<'_> {
        loop {
            // Register for the wake-up before looking, so a release between the look and the
            // wait is not missed.
            let released = self.released.notified();
            tokio::pin!(released);
            released.as_mut().enable();
            {
                let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
                if !held.iter().any(|&(s, e)| s < end && start < e) {
                    held.push((start, end));
                    return RangeGuard {
                        locks: self,
                        range: (start, end),
                    };
                }
            }
            released.await;
        }
    }

    /// How many ranges are held (for tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.held.lock().map(|h| h.len()).unwrap_or(0)
    }
}

impl Drop for RangeGuard<'_> {
    fn drop(&mut self) {
        {
            let mut held = self.locks.held.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(i) = held.iter().position(|&r| r == self.range) {
                held.swap_remove(i);
            }
        }
        self.locks.released.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[tokio::test]
    async fn disjoint_ranges_are_held_together() {
        let l = RangeLocks::default();
        let a = l.lock(0, 4).await;
        let b = l.lock(4, 8).await;
        assert_eq!(l.held(), 2);
        drop((a, b));
        assert_eq!(l.held(), 0);
    }

    #[tokio::test]
    async fn overlapping_range_waits_for_release() {
        let l = Arc::new(RangeLocks::default());
        let a = l.lock(0, 4).await;
        let l2 = l.clone();
        let waiter = tokio::spawn(async move {
            let _g = l2.lock(3, 5).await;
        });
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(!waiter.is_finished(), "an overlapping range was granted");
        drop(a);
        tokio::time::timeout(Duration::from_secs(5), waiter)
            .await
            .expect("the waiter was not woken by the release")
            .unwrap();
        assert_eq!(l.held(), 0);
    }
}
