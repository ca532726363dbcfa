//! Link cuts: a scheduled or commanded outage during which the link carries nothing.
//!
//! Issue 8 asks for "a link cut and restore" on top of Aiken et al.'s pathologies: the
//! initiator must ride out a short outage (TCP retransmits across it) and report a failed
//! connection after a long one, never hang. A cut here is what unplugging a cable does:
//!
//! - a packet that *arrives* at the emulator while the link is cut is dropped;
//! - a packet already *on the wire* (in the queue or the delay line) when a cut starts is
//!   lost too: a packet is delivered only if no cut overlapped any instant of its trip,
//!   from its arrival to its scheduled release.
//!
//! Cuts come from two sources: a schedule in the direction's settings (`cut = "5s+3s"`,
//! offsets counted from the moment the schedule took effect) and manual `cut`/`restore`
//! commands on a running link. [`CutState`] is pure and clock-injected like the rest of the
//! model: the forwarder passes `now` in and asks [`CutState::lost`] for every packet.

use crate::config::{ConfigError, CutWindow};
use crate::pipeline::Nanos;

/// At most this many manual cuts are remembered, oldest forgotten first. Only a cut that ended
/// after a packet arrived can still drop it, and nobody cuts a link by hand sixteen times
/// within one packet's trip; a short list keeps the per-packet check cheap.
const MAX_MANUAL: usize = 16;

/// The cut schedule and manual cuts of one direction.
#[derive(Debug, Clone, Default)]
pub struct CutState {
    /// Absolute `[start, end)` windows of the schedule in force.
    scheduled: Vec<(Nanos, Nanos)>,
    /// The schedule as configured (to tell whether a reconfiguration changed it).
    schedule_cfg: Vec<CutWindow>,
    /// Manual cuts, oldest first: `[start, end)`, `end = None` while the cut lasts.
    manual: Vec<(Nanos, Option<Nanos>)>,
}

impl CutState {
    /// No cuts.
    pub fn new() -> Self {
        Self::default()
    }

    /// Installs `schedule` with its offsets counted from `now`, unless it equals the schedule
    /// already in force (then nothing changes: `ipsan wan set --delay 8ms` re-sends the whole
    /// configuration and must not restart a running schedule). Returns whether it changed.
    pub fn set_schedule(&mut self, schedule: &[CutWindow], now: Nanos) -> bool {
        if schedule == self.schedule_cfg.as_slice() {
            return false;
        }
        self.schedule_cfg = schedule.to_vec();
        self.scheduled = schedule
            .iter()
            .map(|w| {
                let start = now.saturating_add(w.start.as_nanos() as Nanos);
                (start, start.saturating_add(w.len.as_nanos() as Nanos))
            })
            .collect();
        true
    }

    /// Cuts the link at `now` until [`CutState::restore`]. Cutting a cut link does nothing.
    pub fn cut(&mut self, now: Nanos) {
        if self.manual_cut() {
            return;
        }
        if self.manual.len() >= MAX_MANUAL {
            self.manual.remove(0);
        }
        self.manual.push((now, None));
    }

    /// Ends a manual cut at `now`. Restoring a link that is not manually cut does nothing
    /// (a scheduled cut ends on its own schedule).
    pub fn restore(&mut self, now: Nanos) {
        if let Some((start, end @ None)) = self.manual.last_mut() {
            *end = Some(now.max(*start));
        }
    }

    /// Whether a manual cut is in force.
    pub fn manual_cut(&self) -> bool {
        matches!(self.manual.last(), Some((_, None)))
    }

    /// Whether the link is cut at `now` (by the schedule or by hand).
    pub fn is_cut(&self, now: Nanos) -> bool {
        self.overlaps(now, now)
    }

    /// Whether a packet that arrived at `arrived` and is due out at `release` met a cut
    /// anywhere on its trip: then it is lost. The closed interval `[arrived, release]` is
    /// checked against every `[start, end)` window.
    pub fn lost(&self, arrived: Nanos, release: Nanos) -> bool {
        self.overlaps(arrived, release.max(arrived))
    }

    fn overlaps(&self, from: Nanos, to: Nanos) -> bool {
        let hit = |start: Nanos, end: Nanos| start <= to && from < end;
        self.scheduled.iter().any(|&(s, e)| hit(s, e))
            || self
                .manual
                .iter()
                .rev()
                .any(|&(s, e)| hit(s, e.unwrap_or(Nanos::MAX)))
    }

    /// The next scheduled start or end of a cut after `now`, so that an idle forwarder can
    /// wake up to report the change (`cut` in the stats).
    pub fn next_change(&self, now: Nanos) -> Option<Nanos> {
        self.scheduled
            .iter()
            .flat_map(|&(s, e)| [s, e])
            .filter(|&t| t > now)
            .min()
    }

    /// Whether anything could ever cut this direction (lets the forwarder skip the checks).
    pub fn is_idle(&self) -> bool {
        self.scheduled.is_empty() && self.manual.is_empty()
    }
}

/// Parses a cut schedule: `START+LEN[,START+LEN...]`, e.g. `5s+3s` (cut 5 s after the
/// schedule takes effect, for 3 s) or `10s+2s,30s+60s`; `none` (or empty) for no cuts.
/// Windows must be given in order and must not overlap.
pub fn parse_cuts(what: &'static str, s: &str) -> Result<Vec<CutWindow>, ConfigError> {
    let s = s.trim();
    if s.is_empty() || s == "none" {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for part in s.split(',') {
        let Some((start, len)) = part.split_once('+') else {
            return Err(ConfigError::Parse {
                what,
                given: part.to_owned(),
                why: "expected START+LENGTH, e.g. 5s+3s",
            });
        };
        out.push(CutWindow {
            start: crate::config::parse_duration(what, start)?,
            len: crate::config::parse_duration(what, len)?,
        });
    }
    crate::config::validate_cuts(what, &out)?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const S: Nanos = 1_000_000_000;
    const MS: Nanos = 1_000_000;

    fn win(start_s: u64, len_s: u64) -> CutWindow {
        CutWindow {
            start: Duration::from_secs(start_s),
            len: Duration::from_secs(len_s),
        }
    }

    #[test]
    fn scheduled_cut_drops_arrivals_inside_the_window_only() {
        let mut c = CutState::new();
        assert!(c.set_schedule(&[win(5, 3)], 100 * MS));
        // Offsets count from when the schedule took effect (t = 100 ms).
        assert!(!c.is_cut(5 * S + 99 * MS));
        assert!(c.is_cut(5 * S + 100 * MS));
        assert!(c.is_cut(8 * S + 99 * MS));
        assert!(!c.is_cut(8 * S + 100 * MS));
        // Zero-delay packets: lost exactly when they arrive inside the window.
        for t in (0..12 * S).step_by(7 * MS as usize) {
            let inside = (5 * S + 100 * MS..8 * S + 100 * MS).contains(&t);
            assert_eq!(c.lost(t, t), inside, "t = {t}");
        }
    }

    #[test]
    fn packets_on_the_wire_when_the_cut_starts_are_lost() {
        let mut c = CutState::new();
        c.set_schedule(&[win(5, 3)], 0);
        // 64 ms delay line: a packet sent 10 ms before the cut is still travelling.
        assert!(c.lost(5 * S - 10 * MS, 5 * S + 54 * MS));
        // One that left the wire before the cut is delivered.
        assert!(!c.lost(5 * S - 70 * MS, 5 * S - 6 * MS));
        // One sent right at the restore is delivered.
        assert!(!c.lost(8 * S, 8 * S + 64 * MS));
        // A trip that spans a whole short cut is lost too.
        c.set_schedule(
            &[CutWindow {
                start: Duration::from_millis(100),
                len: Duration::from_millis(1),
            }],
            0,
        );
        assert!(c.lost(50 * MS, 150 * MS));
    }

    #[test]
    fn manual_cut_lasts_until_restored_and_hits_packets_in_flight() {
        let mut c = CutState::new();
        assert!(c.is_idle());
        assert!(!c.is_cut(S));
        c.cut(2 * S);
        assert!(c.manual_cut());
        assert!(c.is_cut(2 * S) && c.is_cut(1000 * S));
        // A packet that arrived before the cut and is released during it is lost.
        assert!(c.lost(2 * S - MS, 2 * S + MS));
        c.cut(3 * S); // no-op: already cut
        c.restore(4 * S);
        assert!(!c.manual_cut());
        assert!(!c.is_cut(4 * S));
        assert!(c.is_cut(4 * S - 1));
        // The history still decides for packets that were on the wire during the cut.
        assert!(c.lost(S, 3 * S));
        assert!(!c.lost(4 * S, 5 * S));
        c.restore(6 * S); // no-op: not cut
        assert!(!c.is_cut(6 * S));
        c.cut(7 * S);
        c.restore(7 * S);
        assert!(!c.is_cut(7 * S), "a zero-length cut cuts nothing");
    }

    #[test]
    fn resetting_the_same_schedule_does_not_restart_it() {
        let mut c = CutState::new();
        assert!(c.set_schedule(&[win(5, 3)], 0));
        assert!(!c.set_schedule(&[win(5, 3)], 4 * S));
        assert!(c.is_cut(5 * S));
        // A different schedule counts from its own start.
        assert!(c.set_schedule(&[win(1, 1)], 10 * S));
        assert!(!c.is_cut(5 * S));
        assert!(c.is_cut(11 * S));
        assert_eq!(c.next_change(10 * S), Some(11 * S));
        assert_eq!(c.next_change(11 * S), Some(12 * S));
        assert_eq!(c.next_change(12 * S), None);
        assert!(c.set_schedule(&[], 20 * S));
        assert!(!c.is_cut(11 * S));
    }

    #[test]
    fn manual_history_is_bounded() {
        let mut c = CutState::new();
        for i in 0..10_000u64 {
            c.cut(i * 10);
            c.restore(i * 10 + 5);
        }
        assert!(c.manual.len() <= MAX_MANUAL);
        assert!(c.is_cut(99_990 + 1));
    }

    #[test]
    fn parses_cut_schedules() {
        assert_eq!(parse_cuts("cut", "5s+3s").unwrap(), vec![win(5, 3)]);
        assert_eq!(
            parse_cuts("cut", "10s+2s, 30s+60s").unwrap(),
            vec![win(10, 2), win(30, 60)]
        );
        assert_eq!(parse_cuts("cut", "none").unwrap(), vec![]);
        assert_eq!(parse_cuts("cut", "").unwrap(), vec![]);
        for bad in [
            "5s",
            "5s+",
            "+3s",
            "5+3s",
            "5s+3s,6s+1s",
            "5s+0s",
            "9s+1s,2s+1s",
        ] {
            let e = parse_cuts("cut", bad).unwrap_err();
            assert!(e.to_string().starts_with("cut"), "{bad}: {e}");
        }
    }
}
