//! The papers' figures and tables beside ours, each with the papers' own metric: 2008 (000)
//! Fig. 9–11 (throughput vs block size; improvement over IPsec as the mean over block sizes),
//! Fig. 12–14 (CPU per host), Fig. 15 (model vs measurement), Fig. 16 / Eq. 6 (ratio to
//! OP-2 vs workers); 2006 (001) Tables 2–5 (read improvement per process count, target CPU,
//! model); Aiken et al. (003) (network vs diskless vs file LUN over delay; pathologies).
//! The papers' numbers are drawn on every figure that has them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::model::{self, Inputs};
use crate::plan::{fmt_size, Backend, Depth, Direction, IscsiMode, Scheme};
use crate::plot::{self, Axis, Bars, Figure, Pt, Series, Style, BLACK_IDX};
use crate::report::{median, Agg};

mod aiken;
mod cpu;
mod prediction;
mod throughput;

use aiken::{aiken, pathologies};
use cpu::{cpu, fig16};
use prediction::model_fig;
use throughput::{improvement, throughput_vs_block};

use crate::fit::unimpaired;
pub use crate::fit::{
    carrier_costs, carrier_fits, fit_cost, ipsec_fits, ipsec_rates, model_here, rates,
    rates_from_records, Cost, Rates, Unit,
};

/// 2008 (000) §IV-A, Fig. 11: OP-10's improvement over IPsec (mean over 16 KB–2 MB), as the
/// text states it: about 1.5× at 1 ms, 4.6× at 8 ms, 6.6× at 64 ms (slightly below 1 at 0 ms).
pub const FIG11_OP10: [(f64, f64); 3] = [(1.0, 1.5), (8.0, 4.6), (64.0, 6.6)];
/// 2008 (000) Fig. 9–10 as the text states them: (delay, IPsec max, OP-10 max) MB/s.
pub const FIG9_10: [(f64, f64, f64); 2] = [(8.0, 4.0, 8.8), (64.0, 0.6, 2.8)];
/// 2008 (000) §V-C: Eq. 6's worker limits at 64 ms: (block, n).
pub const EQ6_N: [(u64, f64); 3] = [(32 << 10, 15.7), (64 << 10, 7.9), (128 << 10, 4.1)];
/// 2006 (001) Table 2: read improvement over IPsec, rows 0/1/2/4/8 ms, 1–4 processes.
pub const TABLE2: [(f64, [f64; 4]); 5] = [
    (0.0, [0.606, 0.997, 1.120, 1.164]),
    (1.0, [0.667, 1.237, 1.608, 1.889]),
    (2.0, [0.696, 1.342, 1.796, 2.127]),
    (4.0, [0.800, 1.571, 2.194, 2.658]),
    (8.0, [0.777, 1.556, 2.239, 2.865]),
];
/// 2006 (001) Table 3: target CPU %: (delay, IPsec, 1–4 processes).
pub const TABLE3: [(f64, f64, [f64; 4]); 2] = [
    (0.0, 78.571, [68.491, 76.672, 77.768, 79.201]),
    (8.0, 24.632, [17.356, 35.389, 47.499, 56.387]),
];
/// 2006 (001) Tables 4–5, 0 ms, 64 KB: (processes, model, measured) MB/s.
pub const TABLE45: [(u32, f64, f64); 2] = [(1, 4.624, 4.446), (2, 8.546, 8.164)];
/// Aiken et al. (003) Table 1: netperf over their 100 Mbit/s WAN with all of Paxson's
/// pathologies, MB/s: the mean of its 12 cells (3.17–4.53).
pub const AIKEN_TABLE1_MEAN: f64 = 4.06;

/// The figures and tables written.
#[derive(Debug)]
pub struct Out {
    /// Markdown sections.
    pub md: String,
    /// Files written.
    pub plots: Vec<PathBuf>,
}

fn ms(d: f64) -> String {
    format!("{d} ms")
}

fn same_delay(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-6
}

/// The series name of a point in the papers' terms: `IPsec (1)`, `OP-4`, `seal-seq`.
fn paper_name(a: &Agg) -> String {
    let p = &a.rec.point;
    let cipher =
        if p.cipher.starts_with("3des") || matches!(p.scheme, Scheme::Plain | Scheme::Iperf3) {
            ""
        } else {
            " aes"
        };
    match (p.scheme, p.depth) {
        (Scheme::Seal, Depth::Fixed(n)) => format!("seal OP-{n}{cipher}"),
        (Scheme::Seal, Depth::Auto) => format!("seal auto{cipher}"),
        (Scheme::Ipsec, _) => format!("IPsec (strongSwan) @{}{cipher}", a.rec.depth_used),
        (s, _) => format!("{s} @{}{cipher}", a.rec.depth_used),
    }
}

fn pt(x: f64, a: &Agg) -> Pt {
    Pt {
        x,
        y: a.median,
        lo: a.min,
        hi: a.max,
    }
}

fn draw(dir: &Path, stem: &str, fig: &Figure, out: &mut Out) {
    match plot::draw(dir, stem, fig) {
        Ok(f) => {
            out.plots.extend(f);
            let _ = writeln!(out.md, "![{}]({stem}.png)\n", fig.title);
        }
        Err(e) => {
            let _ = writeln!(out.md, "({stem} not drawn: {e})\n");
        }
    }
}

/// The IPsec baseline for a seal point: same direction, delay, block, cipher, one command.
fn ipsec_at<'a>(aggs: &'a [Agg], a: &Agg) -> Option<&'a Agg> {
    let p = &a.rec.point;
    aggs.iter().find(|b| {
        let q = &b.rec.point;
        q.scheme == Scheme::Ipsec
            && b.rec.depth_used == 1
            && q.direction == p.direction
            && same_delay(q.delay_ms, p.delay_ms)
            && q.block == p.block
            && q.cipher == p.cipher
            && q.iscsi == p.iscsi
            && q.rate_mbit == p.rate_mbit
            && q.loss + q.reorder + q.corrupt == 0.0
    })
}

/// Every figure and table the records support.
pub fn all(dir: &Path, aggs: &[Agg], fonts: bool) -> Out {
    let mut out = Out {
        md: String::new(),
        plots: Vec::new(),
    };
    // A plan with pathologies (loss, reordering, corruption) gets its own figure, its clean
    // rate-limited points as the baseline there; elsewhere a rate is just the link's speed
    // (the demo's 1 Gbit/s) and its points are drawn like any other.
    let pathological = aggs.iter().any(|a| !unimpaired(a));
    let clean: Vec<Agg> = aggs
        .iter()
        .filter(|a| unimpaired(a) && (a.rec.point.rate_mbit == 0.0 || !pathological))
        .cloned()
        .collect();
    for dirn in [Direction::Write, Direction::Read] {
        throughput_vs_block(dir, &clean, dirn, fonts, &mut out);
    }
    improvement(dir, &clean, Direction::Write, fonts, &mut out);
    improvement(dir, &clean, Direction::Read, fonts, &mut out);
    cpu(dir, &clean, fonts, &mut out);
    let rates = rates(dir, aggs);
    fig16(dir, &clean, &rates, fonts, &mut out);
    model_fig(dir, aggs, &rates, fonts, &mut out);
    aiken(dir, &clean, fonts, &mut out);
    if pathological {
        pathologies(dir, aggs, fonts, &mut out);
    }
    out
}

fn short(c: &str) -> &str {
    if c.starts_with("3des") {
        "3DES"
    } else if c.starts_with("aes") {
        "AES-GCM"
    } else {
        c
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::aggregate;

    use crate::fit::tests::rec;

    /// A rate alone is the link's speed: the demo's 1 Gbit/s points get the improvement
    /// table and no pathologies figure; a plan with loss gets the figure and keeps its
    /// rate-limited points out of the improvement table.
    #[test]
    fn a_rate_limited_plan_is_drawn_like_any_other_unless_it_has_pathologies() {
        let at = |scheme, depth, mb, loss: f64| {
            let mut r = rec(scheme, 8.0, 1 << 20, depth, mb);
            r.point.rate_mbit = 1000.0;
            r.point.loss = loss;
            r
        };
        let demo = vec![
            at(Scheme::Seal, 8, 30.0, 0.0),
            at(Scheme::Ipsec, 1, 3.0, 0.0),
        ];
        let out = all(Path::new("/nonexistent"), &aggregate(&demo), false);
        assert!(out.md.contains("**10.00×**"), "{}", out.md);
        assert!(!out.md.contains("pathologies"), "{}", out.md);
        let mut lossy = demo.clone();
        lossy.push(at(Scheme::Seal, 8, 1.0, 0.027));
        let out = all(Path::new("/nonexistent"), &aggregate(&lossy), false);
        assert!(!out.md.contains("**10.00×**"), "{}", out.md);
        assert!(out.md.to_lowercase().contains("patholog"), "{}", out.md);
    }

    #[test]
    fn improvement_is_the_mean_over_blocks_of_per_block_ratios() {
        let rs = vec![
            rec(Scheme::Seal, 8.0, 16384, 10, 4.0),
            rec(Scheme::Ipsec, 8.0, 16384, 1, 1.0),
            rec(Scheme::Seal, 8.0, 1 << 20, 10, 3.0),
            rec(Scheme::Ipsec, 8.0, 1 << 20, 1, 2.0),
            // Another cipher's IPsec must not be the baseline.
            {
                let mut r = rec(Scheme::Ipsec, 8.0, 16384, 1, 100.0);
                r.point.cipher = "aes-256-gcm".into();
                r
            },
        ];
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        // (4/1 + 3/2) / 2 = 2.75, not the best block's 4.
        assert!(
            out.md.contains("**2.75×** (16KiB 4.00, 1MiB 1.50)"),
            "{}",
            out.md
        );
        assert!(
            out.md.contains("≈4.6×"),
            "the paper's OP-10 at 8 ms beside ours"
        );
    }

    #[test]
    fn fig16_never_divides_across_write_cycles() {
        let mut one_rtt = rec(Scheme::Seal, 64.0, 65536, 8, 0.1);
        one_rtt.point.iscsi = IscsiMode::Ipsan;
        let rs = vec![
            rec(Scheme::Seal, 64.0, 65536, 2, 1.0),
            rec(Scheme::Seal, 64.0, 65536, 4, 2.0),
            one_rtt,
        ];
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        assert!(out.md.contains("| 64KiB | 3DES |"), "{}", out.md);
        // The one-round-trip OP-8 has no OP-2 of its own cycle: no row of its own, and it
        // does not make a knee at OP-8 in the two-round-trip row (0.1 / 1.0 ≪ 8 / 2).
        assert_eq!(out.md.matches("| 64KiB | 3DES |").count(), 1, "{}", out.md);
        assert!(out.md.contains("none up to the largest n"), "{}", out.md);
    }
}
