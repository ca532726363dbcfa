//! `--depth auto`: pick the number of commands in flight from live measurements (issue 6).
//!
//! Sans-IO: the bench feeds one [`Sample`] per measurement window (bytes and commands
//! completed, summed latency, the window's length) and gets the next [`Decision`] back: the
//! depth to run, how long to let the pipeline settle after a change, and how long the next
//! window lasts. Tests drive it against simulated throughput curves.
//!
//! The reasoning is the papers' and Little's law. At depth `d` with round-trip-bound commands
//! of latency `L`, throughput is `d·BLOCK/L` until some other limit binds (the link, the TCP
//! window, the crypto workers — Kamisaka et al. 2008 Eq. 6; Muknahallipatna et al. Table 1);
//! beyond it, more depth only adds queueing latency. So:
//!
//! 1. **Grow**: from the start depth (a model estimate or 1), double the depth while each
//!    step raises throughput by more than `gain` (5 %). When latency has not grown with depth
//!    (no queue yet), the bandwidth-delay product says how far the pipe is from full:
//!    `d·X_target/X`, so the controller may jump up to 4× in one step.
//! 2. **Refine**: when a step gains less, the knee lies between the last two depths; the best
//!    of them is kept, and if the deeper one did not help, one midpoint is tried.
//! 3. **Hold**: run at the best depth; every few windows probe one step deeper (+25 %) or
//!    shallower, and move there if it is better by more than `gain` than the median of the
//!    recent windows at the held depth. If that median falls by more than a third (the link
//!    changed), grow again from there.
//!
//! Two guards keep it from paying for its own measurements (issue 6's 64 ms runs):
//!
//! - **No downward probe while latency is at the unloaded round trip.** If the held depth's
//!   mean latency is within 25 % of the smallest latency seen, no queue has formed (Little's
//!   law: `X = d/L` with `L` at its floor), so fewer commands can only lower throughput.
//! - **Noise widens the window.** When the recent windows at the held depth spread by more
//!   than `4·gain` around their median, single windows cannot resolve a `gain` difference;
//!   the window doubles (up to 8×) so that each decision averages over more commands.
//!
//! Every window's measurement is kept in the trajectory reported in the bench JSON.

use std::time::Duration;

use serde::Serialize;

/// A window with fewer completed commands is not a measurement.
const MIN_OPS: u64 = 3;
/// Hold windows kept for the median and the spread.
const HOLD_HISTORY: usize = 5;
/// Largest window multiplier noise may ask for.
const MAX_WINDOW_SCALE: u32 = 8;
/// Latency within this factor of the smallest seen counts as unloaded (no queue).
const UNLOADED: f64 = 1.25;

/// Median of a slice (0 when empty).
fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    match v.len() {
        0 => 0.0,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

/// Settings of the controller.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AutoConfig {
    /// Depth of the first window.
    pub start: usize,
    /// Largest depth the controller may pick.
    pub max: usize,
    /// Shortest measurement window.
    pub min_window: Duration,
    /// A window lasts at least this many mean command latencies.
    pub window_latencies: f64,
    /// Relative throughput gain that counts as "better" (noise margin).
    pub gain: f64,
    /// Windows at the held depth between probes.
    pub probe_every: u32,
}

impl AutoConfig {
    /// Defaults for a start and a maximum depth.
    #[must_use]
    pub fn new(start: usize, max: usize) -> Self {
        let max = max.max(1);
        Self {
            start: start.clamp(1, max),
            max,
            min_window: Duration::from_millis(250),
            window_latencies: 3.0,
            gain: 0.05,
            probe_every: 4,
        }
    }
}

/// What one measurement window saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    /// How long the window lasted.
    pub duration: Duration,
    /// Bytes moved by commands completed in the window.
    pub bytes: u64,
    /// Commands completed in the window.
    pub ops: u64,
    /// Sum of those commands' latencies.
    pub latency_sum: Duration,
}

impl Sample {
    fn throughput(&self) -> f64 {
        self.bytes as f64 / self.duration.as_secs_f64().max(1e-9)
    }
    fn mean_latency(&self) -> Option<Duration> {
        (self.ops > 0).then(|| self.latency_sum / u32::try_from(self.ops).unwrap_or(u32::MAX))
    }
}

/// What to do next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decision {
    /// Depth to run.
    pub depth: usize,
    /// Wait this long after applying the depth before the window starts (commands issued at
    /// the old depth drain, the new ones fill the pipe).
    pub settle: Duration,
    /// Length of the next window.
    pub window: Duration,
}

/// One window in the trajectory.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Step {
    /// Seconds since the run started when the window ended (as passed to `observe`).
    pub t_s: f64,
    /// Depth during the window.
    pub depth: usize,
    /// Measured throughput, MB/s (10^6 B/s).
    pub throughput_mb_s: f64,
    /// Mean command latency, microseconds (NaN → null when nothing completed).
    pub latency_us: f64,
    /// Commands completed.
    pub ops: u64,
    /// The controller's phase after this window: grow, refine, hold, probe, or wait (too few
    /// commands completed to judge: the same depth is measured again, twice as long).
    pub phase: &'static str,
}

#[derive(Debug, Clone, Copy, PartialEq)]
enum Phase {
    Grow,
    /// Trying the midpoint between `lo` (best so far) and a deeper depth that did not help.
    Refine,
    Hold {
        since_probe: u32,
    },
    /// One window a step deeper (`up`) or shallower than `held` (throughput `held_x` at the
    /// last hold window).
    Probe {
        held: usize,
        held_x: f64,
        up: bool,
    },
}

/// The controller.
#[derive(Debug, Clone)]
pub struct DepthController {
    cfg: AutoConfig,
    depth: usize,
    phase: Phase,
    /// Best (depth, throughput) measured so far in the current search.
    best: Option<(usize, f64)>,
    /// Latency at the smallest depth measured (the unloaded round trip).
    base_latency: Option<Duration>,
    last_latency: Option<Duration>,
    /// Throughput at the held depth when the hold began.
    hold_x: f64,
    /// Windows between probes: doubles after each probe that did not help (so probing
    /// costs less and less once the depth is right), back to `probe_every` after one that did.
    probe_interval: u32,
    /// Direction of the next probe.
    probe_up: bool,
    /// Throughputs of the latest windows at the held depth (newest last).
    hold_xs: Vec<f64>,
    /// Window multiplier (1, 2, 4, 8): grows while the hold windows are noisy.
    window_scale: u32,
    trajectory: Vec<Step>,
}

impl DepthController {
    /// A controller at `cfg.start`.
    #[must_use]
    pub fn new(cfg: AutoConfig) -> Self {
        Self {
            cfg,
            depth: cfg.start,
            phase: Phase::Grow,
            best: None,
            base_latency: None,
            last_latency: None,
            hold_x: 0.0,
            probe_interval: cfg.probe_every.max(1),
            probe_up: true,
            hold_xs: Vec::new(),
            window_scale: 1,
            trajectory: Vec::new(),
        }
    }

    /// The depth in force.
    pub fn depth(&self) -> usize {
        self.depth
    }

    /// The best depth found so far (what the run settled on).
    pub fn chosen(&self) -> usize {
        match self.phase {
            Phase::Probe { held, .. } => held,
            Phase::Hold { .. } => self.depth,
            _ => self.best.map_or(self.depth, |b| b.0),
        }
    }

    /// The current window multiplier (1 unless the measurements were noisy).
    pub fn window_scale(&self) -> u32 {
        self.window_scale
    }

    /// Every window so far.
    pub fn trajectory(&self) -> &[Step] {
        &self.trajectory
    }

    /// The first decision (before any sample).
    pub fn first(&self) -> Decision {
        self.decision(false)
    }

    fn decision(&self, changed: bool) -> Decision {
        let lat = self.last_latency.unwrap_or(Duration::ZERO);
        let window = self
            .cfg
            .min_window
            .max(lat.mul_f64(self.cfg.window_latencies))
            * self.window_scale;
        Decision {
            depth: self.depth,
            // After a change, one mean latency lets the old commands drain and new ones fill.
            settle: if changed {
                lat.max(Duration::from_millis(20))
            } else {
                Duration::ZERO
            },
            window,
        }
    }

    fn grow_target(&self, x: f64, lat: Option<Duration>) -> usize {
        let d = self.depth;
        let mut next = d.saturating_mul(2);
        // Little's law: while latency stays near the unloaded round trip, throughput is
        // depth-bound, so jumping further is safe; cap the jump at 4×.
        if let (Some(l), Some(b)) = (lat, self.base_latency) {
            if l.as_secs_f64() < 1.25 * b.as_secs_f64() && x > 0.0 {
                next = d.saturating_mul(4);
            }
        }
        next.clamp(d + 1, self.cfg.max.max(d + 1)).min(self.cfg.max)
    }

    /// A probe from `held` (typical throughput `held_x`) to `self.depth`, unless there is
    /// nowhere to go.
    fn probe_phase(&mut self, held: usize, held_x: f64, up: bool) -> Phase {
        if self.depth == 0 || self.depth == held {
            self.depth = held;
            Phase::Hold { since_probe: 0 }
        } else {
            Phase::Probe { held, held_x, up }
        }
    }

    /// Doubles the window while the hold windows spread by more than `4·gain` around their
    /// median (up to [`MAX_WINDOW_SCALE`]); halves it again when they are tight.
    fn adapt_window(&mut self) {
        if self.hold_xs.len() < 3 {
            return;
        }
        let m = median(&self.hold_xs);
        let lo = self.hold_xs.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = self.hold_xs.iter().copied().fold(0.0, f64::max);
        if m <= 0.0 {
            return;
        }
        let spread = (hi - lo) / m;
        if spread > 4.0 * self.cfg.gain && self.window_scale < MAX_WINDOW_SCALE {
            self.window_scale *= 2;
            // The old windows were measured at the shorter length: judge the new ones afresh.
            let keep = self.hold_xs.len() - 1;
            self.hold_xs.drain(..keep);
        } else if spread < self.cfg.gain && self.window_scale > 1 {
            self.window_scale /= 2;
        }
    }

    /// Feed the window that just ended (at `now` since the run started); returns what to do.
    pub fn observe(&mut self, s: Sample, now: Duration) -> Decision {
        if s.ops < MIN_OPS {
            // Too few completions to measure anything (TCP's slow start at a long RTT, or a
            // stall): keep the depth and measure again over a window twice as long.
            self.trajectory.push(Step {
                t_s: now.as_secs_f64(),
                depth: self.depth,
                throughput_mb_s: s.throughput() / 1e6,
                latency_us: s.mean_latency().map_or(f64::NAN, |l| l.as_secs_f64() * 1e6),
                ops: s.ops,
                phase: "wait",
            });
            return Decision {
                depth: self.depth,
                settle: Duration::ZERO,
                window: (s.duration * 2).min(Duration::from_secs(8)),
            };
        }
        let x = s.throughput();
        let lat = s.mean_latency();
        if let Some(l) = lat {
            self.last_latency = Some(l);
            if self.base_latency.is_none_or(|b| l < b) {
                self.base_latency = Some(l);
            }
        }
        let measured_at = self.depth;
        let before = self.depth;
        self.phase = match self.phase {
            Phase::Grow => {
                let better = self
                    .best
                    .is_none_or(|(_, bx)| x > bx * (1.0 + self.cfg.gain));
                let prev = self.best;
                if self.best.is_none_or(|(_, bx)| x > bx) {
                    self.best = Some((self.depth, x));
                }
                if better && self.depth < self.cfg.max {
                    self.depth = self.grow_target(x, lat);
                    Phase::Grow
                } else if better {
                    Phase::Hold { since_probe: 0 }
                } else {
                    // The knee is between the previous best and this depth.
                    match prev {
                        Some((lo, _)) if lo < self.depth && self.best == prev => {
                            let mid = (lo + self.depth).div_ceil(2);
                            if mid > lo && mid < self.depth {
                                self.depth = mid;
                                Phase::Refine
                            } else {
                                self.depth = lo;
                                Phase::Hold { since_probe: 0 }
                            }
                        }
                        _ => Phase::Hold { since_probe: 0 },
                    }
                }
            }
            Phase::Refine => {
                if self.best.is_none_or(|(_, bx)| x > bx) {
                    self.best = Some((self.depth, x));
                }
                self.depth = self.best.map_or(self.depth, |b| b.0);
                Phase::Hold { since_probe: 0 }
            }
            Phase::Hold { since_probe } => {
                if self.hold_x <= 0.0 {
                    self.hold_x = x;
                }
                self.hold_xs.push(x);
                if self.hold_xs.len() > HOLD_HISTORY {
                    self.hold_xs.remove(0);
                }
                let recent = &self.hold_xs[self.hold_xs.len().saturating_sub(3)..];
                let fell = recent.len() >= 2 && median(recent) < self.hold_x * (2.0 / 3.0);
                let typical = median(&self.hold_xs);
                self.adapt_window();
                // Unloaded: latency still at the floor, so no queue to shorten.
                let unloaded = matches!(
                    (lat, self.base_latency),
                    (Some(l), Some(b)) if l.as_secs_f64() <= UNLOADED * b.as_secs_f64()
                );
                if fell {
                    // Conditions changed (on the median, not one noisy window): search again.
                    self.best = Some((self.depth, x));
                    self.hold_x = 0.0;
                    self.hold_xs.clear();
                    if self.depth < self.cfg.max {
                        self.depth = self.grow_target(x, lat);
                    }
                    Phase::Grow
                } else if since_probe + 1 >= self.probe_interval {
                    let held = self.depth;
                    let mut up = (self.probe_up || held == 1) && held < self.cfg.max;
                    self.probe_up = !self.probe_up;
                    if !up && unloaded {
                        // More depth cannot hurt yet; probe up if possible, else not at all.
                        up = held < self.cfg.max;
                        self.probe_up = true;
                    }
                    if !up && unloaded {
                        Phase::Hold { since_probe: 0 }
                    } else if up {
                        self.depth = (held + held.div_ceil(4)).min(self.cfg.max);
                        self.probe_phase(held, typical, up)
                    } else {
                        self.depth = (held - held / 4).max(1).min(held.saturating_sub(1));
                        self.probe_phase(held, typical, up)
                    }
                } else {
                    Phase::Hold {
                        since_probe: since_probe + 1,
                    }
                }
            }
            Phase::Probe { held, held_x, up } => {
                if x > held_x * (1.0 + self.cfg.gain) {
                    self.probe_interval = self.cfg.probe_every.max(1);
                    self.best = Some((self.depth, x));
                    self.hold_x = 0.0;
                    self.hold_xs.clear();
                    if up {
                        // Deeper is better after all: keep growing from here.
                        if self.depth < self.cfg.max {
                            self.depth = self.grow_target(x, lat);
                        }
                        Phase::Grow
                    } else {
                        // Shallower is better (depth was hurting): probe further down next.
                        self.probe_up = false;
                        Phase::Hold {
                            since_probe: self.probe_interval.saturating_sub(1),
                        }
                    }
                } else {
                    self.probe_interval = self.probe_interval.saturating_mul(2).min(64);
                    self.depth = held;
                    Phase::Hold { since_probe: 0 }
                }
            }
        };
        if matches!(self.phase, Phase::Hold { since_probe: 0 }) && self.depth != before {
            self.hold_x = 0.0;
            self.hold_xs.clear();
        }
        self.trajectory.push(Step {
            t_s: now.as_secs_f64(),
            depth: measured_at,
            throughput_mb_s: x / 1e6,
            latency_us: lat.map_or(f64::NAN, |l| l.as_secs_f64() * 1e6),
            ops: s.ops,
            phase: match self.phase {
                Phase::Grow => "grow",
                Phase::Refine => "refine",
                Phase::Hold { .. } => "hold",
                Phase::Probe { .. } => "probe",
            },
        });
        self.decision(self.depth != before)
    }
}

/// What `--depth auto` reports in the bench JSON (`result.depth_auto`).
#[derive(Debug, Clone, Serialize)]
pub struct AutoReport {
    /// The first window's depth.
    pub start: usize,
    /// The largest depth allowed.
    pub max: usize,
    /// The depth the run settled on.
    pub chosen: usize,
    /// Every measurement window.
    pub trajectory: Vec<Step>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A simulated link: commands of `block` bytes, unloaded latency `rtt`, and a throughput
    /// ceiling `cap` (B/s); beyond the knee, latency grows with the queue (Little's law), and
    /// `overload` takes a share off per command past `bad_after` (e.g. crypto contention).
    struct Sim {
        block: f64,
        rtt: f64,
        cap: f64,
        bad_after: usize,
        overload: f64,
    }

    impl Sim {
        fn throughput(&self, d: usize) -> f64 {
            let x = (d as f64 * self.block / self.rtt).min(self.cap);
            let extra = d.saturating_sub(self.bad_after) as f64;
            x * (1.0 - self.overload * extra).max(0.1)
        }
        fn sample(&self, d: usize, window: Duration, noise: f64) -> Sample {
            let x = self.throughput(d) * (1.0 + noise);
            let lat = d as f64 * self.block / x;
            let bytes = (x * window.as_secs_f64()) as u64;
            let ops = (bytes as f64 / self.block).max(1.0) as u64;
            Sample {
                duration: window,
                bytes,
                ops,
                latency_sum: Duration::from_secs_f64(lat * ops as f64),
            }
        }
        fn best_fixed(&self, max: usize) -> f64 {
            (1..=max).map(|d| self.throughput(d)).fold(0.0, f64::max)
        }
    }

    /// Run the controller for `windows` windows with a deterministic ±`amp` noise pattern;
    /// returns (chosen depth, mean throughput over the last half of the windows).
    fn drive(
        sim: &Sim,
        cfg: AutoConfig,
        windows: usize,
        amp: f64,
    ) -> (usize, f64, DepthController) {
        let mut c = DepthController::new(cfg);
        let mut d = c.first();
        let mut t = Duration::ZERO;
        let mut late = Vec::new();
        for i in 0..windows {
            let noise = amp * [0.0, 1.0, -1.0, 0.5, -0.5][i % 5];
            t += d.settle + d.window;
            let s = sim.sample(d.depth, d.window, noise);
            if i >= windows / 2 {
                late.push(sim.throughput(d.depth));
            }
            d = c.observe(s, t);
            assert!((1..=cfg.max).contains(&d.depth), "{d:?}");
        }
        let mean = late.iter().sum::<f64>() / late.len() as f64;
        (c.chosen(), mean, c)
    }

    #[test]
    fn reaches_the_knee_of_a_round_trip_bound_link() {
        // 64 KiB at 128 ms RTT with a 100 MB/s link: the knee is at depth ~196 → max 128 binds.
        let sim = Sim {
            block: 65536.0,
            rtt: 0.128,
            cap: 100e6,
            bad_after: usize::MAX,
            overload: 0.0,
        };
        let (chosen, x, _) = drive(&sim, AutoConfig::new(1, 128), 30, 0.02);
        assert_eq!(chosen, 128);
        assert!(x >= 0.95 * sim.best_fixed(128), "{x}");
        // 1 MiB at 16 ms, 100 MB/s: knee at depth 1.5.
        let sim = Sim {
            block: 1048576.0,
            rtt: 0.016,
            ..sim
        };
        let (chosen, x, c) = drive(&sim, AutoConfig::new(1, 64), 30, 0.02);
        assert!((2..=8).contains(&chosen), "{chosen} {:?}", c.trajectory());
        assert!(x >= 0.95 * sim.best_fixed(64), "{x}");
    }

    #[test]
    fn backs_off_when_depth_hurts() {
        // Knee at 8; every command past 10 costs 4 %: the best fixed depth is 8..10.
        let sim = Sim {
            block: 65536.0,
            rtt: 0.0042,
            cap: 125e6,
            bad_after: 10,
            overload: 0.04,
        };
        let (chosen, x, c) = drive(&sim, AutoConfig::new(1, 256), 40, 0.02);
        assert!((6..=16).contains(&chosen), "{chosen} {:?}", c.trajectory());
        assert!(
            x >= 0.95 * sim.best_fixed(256),
            "{x} vs {} {:?}",
            sim.best_fixed(256),
            c.trajectory()
        );
    }

    #[test]
    fn starts_from_a_model_hint_and_stays_within_bounds() {
        let sim = Sim {
            block: 65536.0,
            rtt: 0.016,
            cap: 100e6,
            bad_after: usize::MAX,
            overload: 0.0,
        };
        // The knee is at ~25; a hint of 24 should need no more than a few windows.
        let mut c = DepthController::new(AutoConfig::new(24, 64));
        let first = c.first();
        assert_eq!(first.depth, 24);
        assert_eq!(first.settle, Duration::ZERO);
        let mut d = first;
        for i in 0..4 {
            d = c.observe(sim.sample(d.depth, d.window, 0.0), Duration::from_secs(i));
        }
        assert!(c.chosen() >= 24 && c.chosen() <= 64, "{:?}", c.trajectory());
        assert_eq!(c.trajectory().len(), 4);
        // The config clamps its start into 1..=max.
        assert_eq!(AutoConfig::new(0, 8).start, 1);
        assert_eq!(AutoConfig::new(100, 8).start, 8);
    }

    #[test]
    fn windows_cover_several_latencies_and_settle_after_changes() {
        let mut c = DepthController::new(AutoConfig::new(1, 16));
        let s = Sample {
            duration: Duration::from_millis(300),
            bytes: 65536 * 4,
            ops: 4,
            latency_sum: Duration::from_millis(600),
        };
        let d = c.observe(s, Duration::from_millis(300));
        assert!(d.depth > 1);
        assert_eq!(d.settle, Duration::from_millis(150));
        assert_eq!(d.window, Duration::from_millis(450));
    }

    #[test]
    fn waits_out_windows_where_nothing_completes() {
        let mut c = DepthController::new(AutoConfig::new(4, 64));
        let quiet = Sample {
            duration: Duration::from_millis(250),
            bytes: 0,
            ops: 0,
            latency_sum: Duration::ZERO,
        };
        let d = c.observe(quiet, Duration::from_millis(250));
        assert_eq!(d.depth, 4, "no decision from an empty window");
        assert_eq!(d.window, Duration::from_millis(500));
        assert_eq!(c.trajectory()[0].phase, "wait");
        let busy = Sample {
            duration: Duration::from_millis(500),
            bytes: 65536 * 40,
            ops: 40,
            latency_sum: Duration::from_millis(40 * 20),
        };
        assert!(c.observe(busy, Duration::from_secs(1)).depth > 4);
    }

    #[test]
    fn slow_start_then_flat_never_probes_below_a_generous_start() {
        // 1 MiB at 128 ms RTT after a TCP slow start that completes nothing for 3 s, started
        // at 64 (the model's estimate rounded up). First a link that caps at 160 MB/s (knee
        // ~20: every depth from the start on is on the plateau), then one that stays
        // round-trip-bound up to the cap of 64: the controller must not lose throughput to
        // its search, and in the second case never run a window below the start.
        let sim = Sim {
            block: 1_048_576.0,
            rtt: 0.128,
            cap: 160e6,
            bad_after: usize::MAX,
            overload: 0.0,
        };
        let flat_far = Sim {
            cap: 2e9,
            ..Sim { ..sim }
        };
        for (sim, max) in [(&sim, 128), (&flat_far, 64)] {
            let mut c = DepthController::new(AutoConfig::new(64, max));
            let mut d = c.first();
            let mut t = Duration::ZERO;
            let mut moved = 0.0;
            let mut elapsed = 0.0;
            while t < Duration::from_secs(20) {
                t += d.settle + d.window;
                let s = if t < Duration::from_secs(3) {
                    Sample {
                        duration: d.window,
                        bytes: 0,
                        ops: 0,
                        latency_sum: Duration::ZERO,
                    }
                } else {
                    // The pipe keeps flowing while the depth settles.
                    moved += sim.throughput(d.depth) * (d.settle + d.window).as_secs_f64();
                    elapsed += (d.settle + d.window).as_secs_f64();
                    sim.sample(d.depth, d.window, 0.0)
                };
                d = c.observe(s, t);
            }
            let tr = c.trajectory();
            assert!(tr[0].phase == "wait", "{tr:?}");
            if sim.cap > 1e9 {
                // Round-trip-bound all the way: latency never leaves the floor, so no window
                // may run below the start.
                assert!(tr.iter().all(|s| s.depth >= 64), "{tr:?}");
                assert_eq!(c.chosen(), 64);
            }
            let x = moved / elapsed;
            assert!(x >= 0.95 * sim.best_fixed(max), "{x} {tr:?}");
        }
    }

    #[test]
    fn noisy_plateau_widens_the_window_and_keeps_throughput() {
        // 0 ms-like: the knee is at 2 and everything deeper is CPU-bound and flat, with ±30 %
        // window-to-window noise that shrinks with the square root of the window length.
        let sim = Sim {
            block: 65_536.0,
            rtt: 0.0006,
            cap: 200e6,
            bad_after: usize::MAX,
            overload: 0.0,
        };
        let mut c = DepthController::new(AutoConfig::new(3, 64));
        let mut d = c.first();
        let mut t = Duration::ZERO;
        let pattern = [0.0, 1.0, -1.0, 0.5, -0.5, 0.8, -0.8];
        let mut late = Vec::new();
        let mut fell_back = 0;
        for i in 0..80 {
            t += d.settle + d.window;
            let shrink = (d.window.as_secs_f64() / 0.25).sqrt();
            let noise = 0.3 * pattern[i % pattern.len()] / shrink;
            let before = c.depth();
            d = c.observe(sim.sample(d.depth, d.window, noise), t);
            if c.trajectory().last().map(|s| s.phase) == Some("grow") && d.depth > before && i > 10
            {
                fell_back += 1;
            }
            if i >= 40 {
                late.push(sim.throughput(d.depth));
            }
        }
        assert!(c.window_scale() > 1, "{:?}", c.trajectory());
        let x = late.iter().sum::<f64>() / late.len() as f64;
        assert!(x >= 0.95 * sim.best_fixed(64), "{x} {:?}", c.trajectory());
        // The median guards the "link changed" test: noise alone rarely restarts the search.
        assert!(fell_back <= 2, "{fell_back} {:?}", c.trajectory());
    }

    #[test]
    fn median_of_windows() {
        assert_eq!(median(&[]), 0.0);
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 2.0, 3.0]), 2.5);
    }

    #[test]
    fn grows_again_when_the_link_improves() {
        let slow = Sim {
            block: 65536.0,
            rtt: 0.016,
            cap: 20e6,
            bad_after: usize::MAX,
            overload: 0.0,
        };
        let fast = Sim { cap: 200e6, ..slow };
        let cfg = AutoConfig::new(1, 128);
        let mut c = DepthController::new(cfg);
        let mut d = c.first();
        let mut t = Duration::ZERO;
        for _ in 0..20 {
            t += d.window;
            d = c.observe(slow.sample(d.depth, d.window, 0.0), t);
        }
        let before = c.chosen();
        for _ in 0..40 {
            t += d.window;
            d = c.observe(fast.sample(d.depth, d.window, 0.0), t);
        }
        assert!(
            c.chosen() > before,
            "{before} → {} {:?}",
            c.chosen(),
            c.trajectory()
        );
        assert!(fast.throughput(c.chosen()) >= 0.95 * fast.best_fixed(128));
    }
}
