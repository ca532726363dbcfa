//! Sliding anti-replay window on the explicit chunk counter, in the manner of IPsec ESP
//! (RFC 4303 §3.4.3, RFC 6479): commands complete out of order, so the receiver accepts any
//! counter it has not seen that is newer than `highest - WINDOW`, and each counter only once.
//! Counters are marked only after their chunks authenticated.

/// Window width in counters. With 64 KiB chunks this is 4 GiB of data: a command may be
/// overtaken by that much later-sealed data before it reaches the receiver. Counters are
/// reserved when sealing starts, ahead of the round trips (that is Seal's point), so the
/// order they arrive in is not the order they were taken in: a command whose sealing or
/// sending stalls (a crypto worker descheduled on a loaded host) is overtaken by every
/// command the other callers seal meanwhile. At 4096 (256 MiB) a stall of a few hundred
/// milliseconds at 1 MiB × 16 suffices, and a write on a loaded host failed with 74h/04h,
/// most likely so (docs/results/seal-cost/README.md); at 65536 it would have to last seconds. The
/// bitmap costs 8 KiB per session and direction. Replays inside the window are still refused
/// one by one, and the record layer's per-PDU counter refuses any replayed PDU anyway
/// (docs/seal.md §4a); what is older than the window is refused (failing closed).
pub const WINDOW: u64 = 1 << 16;
const WORDS: usize = (WINDOW / 64) as usize;

#[derive(Debug, Clone)]
pub(crate) struct ReplayWindow {
    /// Highest counter accepted so far, `None` before the first.
    highest: Option<u64>,
    /// Bit `c % WINDOW` is set when counter `c` (within the window) was accepted.
    bits: [u64; WORDS],
}

/// The counter was seen or is too old.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Rejected(pub u64);

impl ReplayWindow {
    pub(crate) fn new() -> Self {
        Self {
            highest: None,
            bits: [0; WORDS],
        }
    }

    fn slot(c: u64) -> (usize, u64) {
        let i = (c % WINDOW) as usize;
        (i / 64, 1u64 << (i % 64))
    }

    fn check(&self, c: u64) -> Result<(), Rejected> {
        match self.highest {
            None => Ok(()),
            Some(h) if c > h => Ok(()),
            Some(h) if h - c >= WINDOW => Err(Rejected(c)),
            Some(_) => {
                let (w, m) = Self::slot(c);
                if self.bits[w] & m == 0 {
                    Ok(())
                } else {
                    Err(Rejected(c))
                }
            }
        }
    }

    /// Whether every counter in `base..base+count` could still be accepted (no state change).
    pub(crate) fn check_range(&self, base: u64, count: u64) -> Result<(), Rejected> {
        let end = base.checked_add(count).ok_or(Rejected(base))?;
        if let Some(h) = self.highest {
            if base > h {
                return Ok(());
            }
        } else {
            return Ok(());
        }
        (base..end).try_for_each(|c| self.check(c))
    }

    /// Checks and marks `base..base+count` atomically: either all are accepted or none.
    pub(crate) fn accept_range(&mut self, base: u64, count: u64) -> Result<(), Rejected> {
        self.check_range(base, count)?;
        for c in base..base + count {
            self.mark(c);
        }
        Ok(())
    }

    fn mark(&mut self, c: u64) {
        match self.highest {
            Some(h) if c <= h => {}
            Some(h) => {
                // Slide: clear the slots of counters h+1..=c, which now stand for new counters.
                if c - h >= WINDOW {
                    self.bits = [0; WORDS];
                } else {
                    for x in h + 1..=c {
                        let (w, m) = Self::slot(x);
                        self.bits[w] &= !m;
                    }
                }
                self.highest = Some(c);
            }
            None => {
                self.highest = Some(c);
            }
        }
        let (w, m) = Self::slot(c);
        self.bits[w] |= m;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_a_counter_accepted_before() {
        let mut w = ReplayWindow::new();
        w.accept_range(5, 3).unwrap();
        assert_eq!(w.accept_range(6, 1), Err(Rejected(6)));
        assert_eq!(w.accept_range(7, 2), Err(Rejected(7)));
    }

    #[test]
    fn accepts_out_of_order_counters_inside_the_window() {
        let mut w = ReplayWindow::new();
        w.accept_range(100, 10).unwrap();
        w.accept_range(0, 10).unwrap();
        w.accept_range(50, 10).unwrap();
        assert!(w.accept_range(55, 1).is_err());
    }

    #[test]
    fn rejects_counters_behind_the_window() {
        let mut w = ReplayWindow::new();
        w.accept_range(WINDOW + 10, 1).unwrap();
        assert!(w.accept_range(5, 1).is_err());
        w.accept_range(11, 1).unwrap();
    }

    #[test]
    fn accepts_a_command_overtaken_by_256_mib_of_later_sealed_data() {
        // 1 MiB commands of 16 chunks: the one that took counters 0..16 stalls while 512 later
        // commands (512 MiB) are sealed, sent and opened; it still opens, once.
        let mut w = ReplayWindow::new();
        for k in 1..=512 {
            w.accept_range(k * 16, 16).unwrap();
        }
        w.accept_range(0, 16).unwrap();
        assert!(w.accept_range(0, 16).is_err());
    }

    #[test]
    fn rejects_a_partly_replayed_range_without_marking_any_of_it() {
        let mut w = ReplayWindow::new();
        w.accept_range(10, 1).unwrap();
        assert!(w.accept_range(8, 4).is_err());
        w.accept_range(8, 2).unwrap();
    }

    #[test]
    fn accepts_ranges_wider_than_the_window() {
        let mut w = ReplayWindow::new();
        w.accept_range(0, 3 * WINDOW).unwrap();
        assert!(w.accept_range(3 * WINDOW - 1, 1).is_err());
        w.accept_range(3 * WINDOW, 1).unwrap();
    }
}
