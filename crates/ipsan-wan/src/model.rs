//! The impairment model: a pure, seeded, clock-injected [`Stage`] (packet in, release time or
//! drop out).
//!
//! It follows a Dummynet pipe (Rizzo, "Dummynet: a simple approach to the evaluation of
//! network protocols", CCR 1997), the emulator the papers measured over: a packet first meets
//! the loss draw at the pipe's entrance, then a finite FIFO queue with tail drop, then a
//! serialiser at the configured rate, then the constant propagation delay. On top of that,
//! like netem: jitter, reordering, corruption and duplication. The pathologies the Aiken et
//! al. paper injects (2.7 % loss, 0.02 % corruption, 2 % reordering, after Paxson) are all
//! expressible here.
//!
//! Every random choice comes from one [`Rng`] per direction, drawn in a fixed order per packet,
//! so the same seed and the same packet arrivals give the same verdicts.

use crate::config::{DirConfig, JitterDist, LossModel, QueueLimit};
use crate::pipeline::{DropReason, Nanos, Packet, Stage, Verdict};
use crate::rng::Rng;
use std::collections::VecDeque;

/// One direction's impairments.
#[derive(Debug)]
pub struct Impairment {
    cfg: DirConfig,
    rng: Rng,
    /// Gilbert–Elliott state: `true` while in the Bad state.
    bad: bool,
    /// When the serialiser finishes the last accepted packet.
    busy_until: Nanos,
    /// `(transmission end, bytes)` of packets still queued or in service, oldest first.
    queue: VecDeque<(Nanos, u32)>,
    queue_bytes: u64,
    /// Release time of the last in-order packet: jitter never lets a packet overtake it.
    last_release: Nanos,
    /// The one-way latency the path adds outside the model (see [`Stage::set_path_latency`]),
    /// subtracted from the propagation delay (never below zero).
    path_ns: Nanos,
}

impl Impairment {
    /// A model with the given settings and seed.
    pub fn new(cfg: DirConfig, seed: u64) -> Self {
        Self {
            cfg,
            rng: Rng::new(seed),
            bad: false,
            busy_until: 0,
            queue: VecDeque::with_capacity(1024),
            queue_bytes: 0,
            last_release: 0,
            path_ns: 0,
        }
    }

    /// The settings in force.
    pub fn config(&self) -> &DirConfig {
        &self.cfg
    }

    fn lost(&mut self) -> bool {
        match self.cfg.loss {
            LossModel::None => false,
            LossModel::Bernoulli { p } => self.rng.chance(p),
            LossModel::Gilbert {
                p,
                r,
                loss_bad,
                loss_good,
            } => {
                // Transition first, then draw the loss in the state the packet finds.
                self.bad = if self.bad {
                    !self.rng.chance(r)
                } else {
                    self.rng.chance(p)
                };
                self.rng.chance(if self.bad { loss_bad } else { loss_good })
            }
        }
    }

    fn drain_queue(&mut self, now: Nanos) {
        while let Some(&(end, bytes)) = self.queue.front() {
            if end > now {
                break;
            }
            self.queue.pop_front();
            self.queue_bytes -= u64::from(bytes);
        }
    }

    /// Serialisation time of `len` bytes at the configured rate.
    fn tx_time(&self, len: usize) -> Nanos {
        if self.cfg.rate_bps == 0 {
            return 0;
        }
        let bits = len as u128 * 8 * 1_000_000_000;
        (bits / u128::from(self.cfg.rate_bps)) as Nanos
    }

    fn jittered(&mut self, base: Nanos, floor: Nanos) -> Nanos {
        let j = self.cfg.jitter.as_nanos() as f64;
        if j == 0.0 {
            return base;
        }
        let offset = match self.cfg.jitter_dist {
            JitterDist::Uniform => (2.0 * self.rng.next_f64() - 1.0) * j,
            JitterDist::Normal => self.rng.normal() * j,
        };
        let t = base as f64 + offset;
        if t <= floor as f64 {
            floor
        } else {
            t as Nanos
        }
    }
}

impl Stage for Impairment {
    fn name(&self) -> &'static str {
        "impair"
    }

    fn process(&mut self, now: Nanos, pkt: &mut Packet) -> Verdict {
        // 1. Loss at the pipe's entrance.
        if self.lost() {
            return Verdict::Drop(DropReason::Loss);
        }
        // 2. Bottleneck queue with tail drop, 3. serialiser.
        let tx_end = if self.cfg.rate_bps == 0 {
            now
        } else {
            self.drain_queue(now);
            let len = pkt.len() as u64;
            let full = match self.cfg.queue {
                QueueLimit::Packets(n) => self.queue.len() >= n as usize,
                QueueLimit::Bytes(b) => self.queue_bytes + len > b,
            };
            if full {
                return Verdict::Drop(DropReason::Queue);
            }
            let start = self.busy_until.max(now);
            let end = start + self.tx_time(pkt.len());
            self.busy_until = end;
            self.queue.push_back((end, len as u32));
            self.queue_bytes += len;
            end
        };
        // 4. Propagation delay with jitter; in-order unless reordering picks this packet. The
        //    path's own latency is part of the delay the hosts see, so it is taken off here.
        let delay = (self.cfg.delay.as_nanos() as Nanos).saturating_sub(self.path_ns);
        let base = tx_end + delay;
        let t = self.jittered(base, tx_end).max(self.last_release);
        if self.rng.chance(self.cfg.reorder) {
            pkt.release_at = t + self.cfg.reorder_gap.as_nanos() as Nanos;
            pkt.reordered = true;
        } else {
            pkt.release_at = t;
            self.last_release = t;
        }
        // 5. Corruption: one random bit.
        if self.rng.chance(self.cfg.corrupt) && !pkt.is_empty() {
            let bit = self.rng.below(pkt.len() as u64 * 8) as usize;
            pkt.data_mut()[bit / 8] ^= 1 << (bit % 8);
            pkt.corrupted = true;
        }
        // 6. Duplication.
        if self.rng.chance(self.cfg.duplicate) {
            pkt.duplicate = true;
        }
        Verdict::Pass
    }

    fn reconfigure(&mut self, cfg: &DirConfig) {
        // Keep the queue, serialiser and Gilbert state: the link changes, the packets on it
        // stay where they are.
        self.cfg = cfg.clone();
    }

    fn set_path_latency(&mut self, ns: Nanos) {
        self.path_ns = ns;
    }

    fn queue_len(&self, now: Nanos) -> usize {
        self.queue.iter().filter(|(end, _)| *end > now).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    const MS: Nanos = 1_000_000;

    fn run(cfg: DirConfig, seed: u64, arrivals: &[Nanos], len: usize) -> Vec<(Verdict, Packet)> {
        let mut m = Impairment::new(cfg, seed);
        arrivals
            .iter()
            .map(|&t| {
                let mut p = Packet::from_slice(&vec![0xAB; len], len);
                p.reset(t);
                let v = m.process(t, &mut p);
                (v, p)
            })
            .collect()
    }

    /// 99 % two-sided binomial interval for `n` trials at probability `p`.
    fn binomial_99(n: u64, p: f64) -> (f64, f64) {
        let mean = n as f64 * p;
        let sd = (n as f64 * p * (1.0 - p)).sqrt();
        (mean - 2.576 * sd, mean + 2.576 * sd)
    }

    #[test]
    fn constant_delay_releases_exactly_delay_later() {
        let cfg = DirConfig {
            delay: Duration::from_millis(8),
            ..Default::default()
        };
        let arrivals: Vec<Nanos> = (0..100).map(|i| i * 137_000).collect();
        for ((v, p), t) in run(cfg, 1, &arrivals, 100).iter().zip(&arrivals) {
            assert_eq!(*v, Verdict::Pass);
            assert_eq!(p.release_at, t + 8 * MS);
        }
    }

    #[test]
    fn rate_serialises_back_to_back_packets() {
        let cfg = DirConfig {
            rate_bps: 100_000_000,
            delay: Duration::from_millis(1),
            ..Default::default()
        };
        // 100 packets of 1500 bytes all at t=0: 120 µs each on the wire.
        let out = run(cfg, 1, &[0; 100], 1500);
        for (i, (v, p)) in out.iter().enumerate() {
            assert_eq!(*v, Verdict::Pass);
            assert_eq!(p.release_at, (i as u64 + 1) * 120_000 + MS);
        }
    }

    #[test]
    fn full_queue_tail_drops_the_excess() {
        let cfg = DirConfig {
            rate_bps: 10_000_000,
            queue: QueueLimit::Packets(50),
            ..Default::default()
        };
        let out = run(cfg.clone(), 1, &[0; 80], 1000);
        let passed = out.iter().filter(|(v, _)| *v == Verdict::Pass).count();
        assert_eq!(passed, 50);
        assert!(out[50..]
            .iter()
            .all(|(v, _)| *v == Verdict::Drop(DropReason::Queue)));

        // Byte limit: 10 kB holds ten 1000-byte packets.
        let cfg = DirConfig {
            queue: QueueLimit::Bytes(10_000),
            ..cfg
        };
        let out = run(cfg, 1, &[0; 20], 1000);
        assert_eq!(out.iter().filter(|(v, _)| *v == Verdict::Pass).count(), 10);
    }

    #[test]
    fn queue_drains_as_the_serialiser_sends() {
        let cfg = DirConfig {
            rate_bps: 8_000_000, // 1 ms per 1000-byte packet
            queue: QueueLimit::Packets(2),
            ..Default::default()
        };
        let mut m = Impairment::new(cfg, 1);
        let mut p = Packet::from_slice(&[0; 1000], 1000);
        assert_eq!(m.process(0, &mut p), Verdict::Pass);
        assert_eq!(m.process(0, &mut p), Verdict::Pass);
        assert_eq!(m.process(0, &mut p), Verdict::Drop(DropReason::Queue));
        assert_eq!(m.queue_len(0), 2);
        // After the first packet leaves the wire there is room for one more.
        assert_eq!(m.process(MS, &mut p), Verdict::Pass);
        assert_eq!(p.release_at, 3 * MS);
    }

    #[test]
    fn bernoulli_loss_is_within_the_99_percent_binomial_interval() {
        for p in [0.001, 0.01, 0.1] {
            let cfg = DirConfig {
                loss: LossModel::Bernoulli { p },
                ..Default::default()
            };
            let n = 200_000u64;
            let arrivals: Vec<Nanos> = (0..n).collect();
            let lost = run(cfg, 7, &arrivals, 64)
                .iter()
                .filter(|(v, _)| *v == Verdict::Drop(DropReason::Loss))
                .count() as f64;
            let (lo, hi) = binomial_99(n, p);
            assert!(
                lo <= lost && lost <= hi,
                "p={p}: {lost} not in [{lo}, {hi}]"
            );
        }
    }

    #[test]
    fn gilbert_loss_comes_in_bursts_of_mean_length_one_over_r() {
        let (p, r) = (0.01, 0.25);
        let cfg = DirConfig {
            loss: LossModel::Gilbert {
                p,
                r,
                loss_bad: 1.0,
                loss_good: 0.0,
            },
            ..Default::default()
        };
        let n = 400_000u64;
        let arrivals: Vec<Nanos> = (0..n).collect();
        let lost: Vec<bool> = run(cfg, 3, &arrivals, 64)
            .iter()
            .map(|(v, _)| *v != Verdict::Pass)
            .collect();
        let total = lost.iter().filter(|&&l| l).count() as f64;
        let bursts = lost.windows(2).filter(|w| !w[0] && w[1]).count() as f64;
        let mean = total / n as f64;
        let burst_len = total / bursts;
        assert!((mean - p / (p + r)).abs() < 0.004, "mean loss {mean}");
        assert!(
            (burst_len - 1.0 / r).abs() < 0.2,
            "burst length {burst_len}"
        );
    }

    #[test]
    fn jitter_stays_in_bounds_and_keeps_order() {
        let cfg = DirConfig {
            delay: Duration::from_millis(8),
            jitter: Duration::from_micros(500),
            ..Default::default()
        };
        let arrivals: Vec<Nanos> = (0..20_000).map(|i| i * 1_000_000).collect();
        let out = run(cfg, 9, &arrivals, 100);
        let mut prev = 0;
        let mut sum = 0.0;
        for ((_, p), t) in out.iter().zip(&arrivals) {
            let d = p.release_at - t;
            assert!((7_500_000..=8_500_000).contains(&d), "delay {d}");
            assert!(p.release_at >= prev);
            prev = p.release_at;
            sum += d as f64;
        }
        let mean = sum / out.len() as f64;
        assert!((mean - 8e6).abs() < 10_000.0, "mean delay {mean}");
    }

    #[test]
    fn normal_jitter_never_releases_before_arrival() {
        let cfg = DirConfig {
            delay: Duration::from_micros(100),
            jitter: Duration::from_millis(1),
            jitter_dist: JitterDist::Normal,
            ..Default::default()
        };
        let arrivals: Vec<Nanos> = (0..10_000).map(|i| i * 10 * MS).collect();
        for ((_, p), t) in run(cfg, 2, &arrivals, 100).iter().zip(&arrivals) {
            assert!(p.release_at >= *t);
        }
    }

    #[test]
    fn reordered_packets_are_overtaken_by_later_ones() {
        let cfg = DirConfig {
            delay: Duration::from_millis(1),
            reorder: 0.02,
            reorder_gap: Duration::from_millis(1),
            ..Default::default()
        };
        let n = 100_000u64;
        let arrivals: Vec<Nanos> = (0..n).map(|i| i * 100_000).collect(); // every 100 µs
        let out = run(cfg, 5, &arrivals, 100);
        let held: Vec<usize> = (0..out.len()).filter(|&i| out[i].1.reordered).collect();
        let (lo, hi) = binomial_99(n, 0.02);
        assert!(
            (lo..=hi).contains(&(held.len() as f64)),
            "{} reordered",
            held.len()
        );
        for &i in &held {
            // The next packet that was not itself held overtakes this one.
            if let Some((_, next)) = out[i + 1..].iter().find(|(_, p)| !p.reordered) {
                assert!(next.release_at < out[i].1.release_at);
            }
        }
    }

    #[test]
    fn corruption_flips_exactly_one_bit() {
        let cfg = DirConfig {
            corrupt: 0.5,
            ..Default::default()
        };
        let out = run(cfg, 4, &[0; 2000], 200);
        let mut corrupted = 0;
        for (_, p) in &out {
            let flipped: u32 = p.data().iter().map(|b| (b ^ 0xAB).count_ones()).sum();
            assert_eq!(flipped, u32::from(p.corrupted));
            corrupted += usize::from(p.corrupted);
        }
        assert!((900..1100).contains(&corrupted), "{corrupted}");
    }

    #[test]
    fn duplication_marks_the_configured_fraction() {
        let cfg = DirConfig {
            duplicate: 0.1,
            ..Default::default()
        };
        let n = 100_000;
        let dups = run(cfg, 6, &vec![0; n], 64)
            .iter()
            .filter(|(_, p)| p.duplicate)
            .count() as f64;
        let (lo, hi) = binomial_99(n as u64, 0.1);
        assert!((lo..=hi).contains(&dups), "{dups}");
    }

    #[test]
    fn same_seed_replays_the_same_verdicts_and_other_seeds_differ() {
        let cfg = DirConfig {
            delay: Duration::from_millis(2),
            jitter: Duration::from_micros(300),
            loss: LossModel::Bernoulli { p: 0.05 },
            reorder: 0.05,
            corrupt: 0.05,
            duplicate: 0.05,
            rate_bps: 50_000_000,
            ..Default::default()
        };
        let arrivals: Vec<Nanos> = (0..5000).map(|i| i * 50_000).collect();
        let key = |seed| {
            run(cfg.clone(), seed, &arrivals, 300)
                .into_iter()
                .map(|(v, p)| (v, p.release_at, p.data().to_vec(), p.duplicate))
                .collect::<Vec<_>>()
        };
        assert_eq!(key(11), key(11));
        assert_ne!(key(11), key(12));
    }

    #[test]
    fn path_latency_is_taken_off_the_delay_but_never_below_zero() {
        let mut m = Impairment::new(
            DirConfig {
                delay: Duration::from_millis(8),
                rate_bps: 100_000_000,
                ..Default::default()
            },
            1,
        );
        m.set_path_latency(150_000);
        let mut p = Packet::from_slice(&[0; 1250], 1250);
        p.reset(0);
        m.process(0, &mut p);
        // 1250 bytes at 100 Mbit/s serialise in 100 µs; then 8 ms less the path's 150 µs.
        assert_eq!(p.release_at, 100_000 + 8 * MS - 150_000);
        // A second packet still waits for the serialiser: shaping is unchanged.
        let mut q = Packet::from_slice(&[0; 1250], 1250);
        q.reset(0);
        m.process(0, &mut q);
        assert_eq!(q.release_at - p.release_at, 100_000);
        // A path slower than the delay: released at once, never before it arrived.
        let mut m = Impairment::new(
            DirConfig {
                delay: Duration::from_millis(1),
                ..Default::default()
            },
            1,
        );
        m.set_path_latency(10 * MS);
        let mut r = Packet::from_slice(&[0; 64], 64);
        r.reset(5 * MS);
        m.process(5 * MS, &mut r);
        assert_eq!(r.release_at, 5 * MS);
    }

    #[test]
    fn reconfigure_changes_delay_for_later_packets_only() {
        let mut m = Impairment::new(
            DirConfig {
                delay: Duration::from_millis(8),
                ..Default::default()
            },
            1,
        );
        let mut p = Packet::from_slice(&[0; 10], 10);
        m.process(0, &mut p);
        assert_eq!(p.release_at, 8 * MS);
        m.reconfigure(&DirConfig {
            delay: Duration::from_millis(32),
            ..Default::default()
        });
        m.process(MS, &mut p);
        assert_eq!(p.release_at, 33 * MS);
    }
}
