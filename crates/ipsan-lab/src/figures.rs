//! The papers' figures and tables beside ours, each with the papers' own metric: 2008 (000)
//! Fig. 9–11 (throughput vs block size; improvement over IPsec as the mean over block sizes),
//! Fig. 12–14 (CPU per host), Fig. 15 (model vs measurement), Fig. 16 / Eq. 6 (ratio to
//! OP-2 vs workers); 2006 (001) Tables 2–5 (read improvement per process count, target CPU,
//! model); Aiken et al. (003) (network vs diskless vs file LUN over delay; pathologies).
//! The papers' numbers are drawn on every figure that has them.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use crate::aggregate::{median, Agg};
use crate::model::{self, Inputs};
use crate::plan::{fmt_size, Backend, Depth, Direction, IscsiMode, Point, Scheme};
use crate::plot::{self, Axis, Bars, Figure, Pt, Series, Style, BLACK_IDX};

mod aiken;
mod cpu;
pub(crate) mod prediction;
mod throughput;

use aiken::{aiken, pathologies};
use cpu::{cpu, fig16};
use prediction::{model_fig, prediction_section};
use throughput::{improvement, throughput_vs_block};

pub use crate::calibrate::Cost;
use crate::fit::unimpaired;
pub use crate::fit::{
    carrier_costs, carrier_fits, fit_cost, ipsec_fits, ipsec_rates, model_here, rates,
    rates_from_records, Rates, Unit,
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
/// 2006 (001) Table 4 (one process, Eq. 2) and Table 5 (two processes, Eq. 3), reads at
/// 0 ms: (block KB, calculated, measured) MB/s.
pub const TABLE4_001: [(u64, f64, f64); 8] = [
    (4, 3.867, 1.192),
    (8, 4.266, 4.844),
    (16, 4.348, 4.649),
    (32, 4.608, 4.547),
    (64, 4.624, 4.446),
    (128, 4.663, 4.381),
    (256, 4.698, 4.428),
    (512, 4.734, 4.477),
];
/// 2006 (001) Table 5: two processes, Eq. 3, reads at 0 ms: (block KB, calculated, measured).
pub const TABLE5_001: [(u64, f64, f64); 8] = [
    (4, 6.192, 1.284),
    (8, 7.301, 8.106),
    (16, 7.781, 7.995),
    (32, 8.409, 8.282),
    (64, 8.546, 8.164),
    (128, 8.672, 7.858),
    (256, 8.762, 8.150),
    (512, 8.840, 7.647),
];
/// 2006 (004, Japanese) Table 4: read improvement over IPsec, mean over blocks, rows
/// 0/1/2/4/8 ms, 1–4 processes (the same experiment as 001 Table 2, other numbers).
pub const TABLE4_004: [(f64, [f64; 4]); 5] = [
    (0.0, [0.752, 1.323, 1.465, 1.512]),
    (1.0, [0.719, 1.379, 1.825, 2.082]),
    (2.0, [0.772, 1.510, 2.093, 2.522]),
    (4.0, [0.804, 1.607, 2.382, 3.013]),
    (8.0, [0.894, 1.803, 2.692, 3.537]),
];
/// 2006 (004) Table 5: target CPU %, mean over blocks: (delay, IPsec, 1–4 processes).
pub const TABLE5_004: [(f64, f64, [f64; 4]); 5] = [
    (0.0, 81.148, [41.408, 66.428, 77.306, 71.375]),
    (1.0, 43.777, [29.066, 54.386, 73.014, 71.792]),
    (2.0, 33.593, [22.429, 43.092, 59.738, 67.348]),
    (4.0, 18.768, [14.305, 30.803, 42.707, 56.577]),
    (8.0, 12.899, [8.351, 21.642, 31.228, 41.915]),
];
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
    /// Every line chart's data by file stem, drawn or not (tests read them).
    pub figures: Vec<(String, Figure)>,
    /// Every bar chart's data by file stem.
    pub bars: Vec<(String, Bars)>,
}

/// The delays a figure's x axis labels: the ones the plan ran and the papers' own.
fn delay_ticks(ours: impl IntoIterator<Item = f64>, papers: &[f64]) -> Vec<f64> {
    let mut t: Vec<f64> = ours.into_iter().chain(papers.iter().copied()).collect();
    t.sort_by(f64::total_cmp);
    t.dedup_by(|a, b| same_delay(*a, *b));
    t
}

/// Min–max over repetitions of a statistic over several points: `stat(k)` is the statistic
/// of the points' k-th repetitions, for k below `n` (the repetitions every point has). NaN
/// (no bar) below two repetitions.
fn over_reps(n: usize, stat: impl Fn(usize) -> f64) -> (f64, f64) {
    if n < 2 {
        return (f64::NAN, f64::NAN);
    }
    (0..n)
        .map(stat)
        .filter(|v| v.is_finite())
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        })
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
    let workers = workers_suffix(p);
    match (p.scheme, p.depth) {
        (Scheme::Seal, Depth::Fixed(n)) => format!("seal OP-{n}{cipher}{workers}"),
        (Scheme::Seal, Depth::Auto) => format!("seal auto{cipher}{workers}"),
        (Scheme::Ipsec, _) => format!("IPsec (strongSwan) @{}{cipher}", a.rec.depth_used),
        (s, _) => format!("{s} @{}{cipher}{workers}", a.rec.depth_used),
    }
}

/// `, 1 worker` for a point that fixes seal's crypto workers per host (the plan's
/// `crypto_workers`), nothing for the default of one per CPU: a series or table row of its own.
pub(crate) fn workers_suffix(p: &Point) -> String {
    workers_label(p.crypto_workers)
}

/// [`workers_suffix`] of a `crypto_workers` value.
pub(crate) fn workers_label(crypto_workers: u32) -> String {
    match crypto_workers {
        0 => String::new(),
        1 => ", 1 worker".into(),
        n => format!(", {n} workers"),
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

/// Keeps `fig` as `stem` and, with fonts, draws it and links it from the report.
fn emit(dir: &Path, stem: &str, fig: Figure, fonts: bool, out: &mut Out) {
    if fonts {
        match plot::draw(dir, stem, &fig) {
            Ok(f) => {
                out.plots.extend(f);
                let _ = writeln!(out.md, "![{}]({stem}.png)\n", fig.title);
            }
            Err(e) => {
                let _ = writeln!(out.md, "({stem} not drawn: {e})\n");
            }
        }
    }
    out.figures.push((stem.to_string(), fig));
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
        figures: Vec::new(),
        bars: Vec::new(),
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
    // A run with `--calibration` keeps its file beside the records: the prediction comes
    // from it alone, before the in-plan fit (an explanation, not a prediction).
    let cal = crate::calibrate::LoadedCalibration::read(
        &dir.join(crate::calibrate::CALIBRATION_IN_RESULTS),
    );
    match &cal {
        Ok(c) => prediction_section(dir, aggs, c, fonts, &mut out),
        Err(crate::calibrate::CalibrationError::Io { .. }) => {}
        Err(e) => {
            let _ = writeln!(out.md, "(No out-of-sample prediction: {e}.)\n");
        }
    }
    model_fig(dir, aggs, &rates, cal.is_ok(), fonts, &mut out);
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
    use crate::aggregate::aggregate;

    use crate::fit::tests::rec;
    use crate::results::Record;

    /// `r` once per throughput in `mbs`, as repetitions 0, 1, …
    fn reps(r: &Record, mbs: &[f64]) -> Vec<Record> {
        mbs.iter()
            .enumerate()
            .map(|(k, mb)| {
                let mut r = r.clone();
                r.rep = k as u32;
                r.throughput_mb_s = *mb;
                r
            })
            .collect()
    }

    fn figure<'a>(out: &'a Out, stem: &str) -> &'a Figure {
        let names: Vec<&String> = out.figures.iter().map(|f| &f.0).collect();
        &out.figures
            .iter()
            .find(|(s, _)| s == stem)
            .unwrap_or_else(|| panic!("no {stem} among {names:?}"))
            .1
    }

    /// The 2008 write matrix's delays, two blocks, seal OP-10 and IPsec @1, three
    /// repetitions each.
    fn write_matrix() -> Vec<Record> {
        let mut rs = Vec::new();
        for d in [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0] {
            for b in [16384, 1 << 20] {
                rs.extend(reps(&rec(Scheme::Seal, d, b, 10, 0.0), &[4.0, 4.2, 3.8]));
                rs.extend(reps(&rec(Scheme::Ipsec, d, b, 1, 0.0), &[1.0, 1.1, 0.9]));
            }
        }
        rs
    }

    /// Fig. 11 on a real delay axis: our points at the delays run (in ms, not category
    /// indices), each delay a labelled tick; the paper's OP-10 only at the three delays its
    /// text gives (1, 8, 64 ms: nothing drawn at 2, 4, 16 or 32), its "below 1×" at 0 ms
    /// as a bound at 1×.
    #[test]
    fn fig11_draws_the_papers_points_only_where_it_measured_on_a_delay_axis() {
        let out = all(
            Path::new("/nonexistent"),
            &aggregate(&write_matrix()),
            false,
        );
        let f = figure(&out, "improvement_vs_delay_write");
        assert_eq!(f.x, Axis::DelayMs);
        let ours = f
            .series
            .iter()
            .find(|s| s.style == Style::Measured)
            .unwrap();
        let xs: Vec<f64> = ours.pts.iter().map(|p| p.x).collect();
        assert_eq!(xs, [0.0, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0]);
        assert_eq!(f.x_ticks, xs, "a labelled tick at every delay");
        let paper: Vec<(f64, f64)> = f
            .series
            .iter()
            .filter(|s| s.style == Style::Paper)
            .flat_map(|s| s.pts.iter().map(|p| (p.x, p.y)))
            .collect();
        assert_eq!(paper, [(1.0, 1.5), (8.0, 4.6), (64.0, 6.6)]);
        let below: Vec<(f64, f64)> = f
            .series
            .iter()
            .filter(|s| s.style == Style::PaperBelow)
            .flat_map(|s| s.pts.iter().map(|p| (p.x, p.y)))
            .collect();
        assert_eq!(below, [(0.0, 1.0)], "the paper's below-1× at 0 ms is drawn");
    }

    /// The improvement's bars are the spread over repetitions of the mean over blocks, not
    /// the spread of the per-block ratios (1.5 to 4 here), and the legend says so.
    #[test]
    fn improvement_bars_are_the_spread_over_repetitions_not_over_blocks() {
        let mut rs = Vec::new();
        rs.extend(reps(
            &rec(Scheme::Seal, 8.0, 16384, 10, 0.0),
            &[3.8, 4.0, 4.2],
        ));
        rs.extend(reps(
            &rec(Scheme::Ipsec, 8.0, 16384, 1, 0.0),
            &[1.0, 1.0, 1.0],
        ));
        rs.extend(reps(
            &rec(Scheme::Seal, 8.0, 1 << 20, 10, 0.0),
            &[2.9, 3.0, 3.1],
        ));
        rs.extend(reps(
            &rec(Scheme::Ipsec, 8.0, 1 << 20, 1, 0.0),
            &[2.0, 2.0, 2.0],
        ));
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        let f = figure(&out, "improvement_vs_delay_write");
        let s = f
            .series
            .iter()
            .find(|s| s.style == Style::Measured)
            .unwrap();
        assert!(s.name.contains("over repetitions"), "{}", s.name);
        let p = s.pts[0];
        assert!((p.y - 2.75).abs() < 1e-9, "mean over blocks: {}", p.y);
        // Repetition 0: (3.8/1 + 2.9/2) / 2; repetition 2: (4.2/1 + 3.1/2) / 2.
        assert!((p.lo - 2.625).abs() < 1e-9, "{p:?}");
        assert!((p.hi - 2.875).abs() < 1e-9, "{p:?}");
        // One repetition: no bar rather than a spread over blocks.
        let one: Vec<Record> = rs.into_iter().filter(|r| r.rep == 0).collect();
        let out = all(Path::new("/nonexistent"), &aggregate(&one), false);
        let f = figure(&out, "improvement_vs_delay_write");
        let p = f.series[0].pts[0];
        assert!(p.lo.is_nan() && p.hi.is_nan(), "{p:?}");
    }

    /// The one-process read rows run seal @1 twice in one plan, with one crypto worker per
    /// host and with the default: Table 2's improvement keeps them apart (a column and a line
    /// each, the paper's column and line once), never averaging their blocks together.
    #[test]
    fn improvement_keeps_one_series_per_crypto_worker_setting() {
        let mut rs = Vec::new();
        for b in [16384, 1 << 20] {
            let read = |scheme, workers: u32, mb: &[f64]| {
                let mut r = rec(scheme, 8.0, b, 1, 0.0);
                r.point.direction = Direction::Read;
                r.point.crypto_workers = workers;
                reps(&r, mb)
            };
            rs.extend(read(Scheme::Ipsec, 0, &[2.0, 2.0]));
            rs.extend(read(Scheme::Seal, 0, &[3.0, 3.0]));
            rs.extend(read(Scheme::Seal, 1, &[1.0, 1.0]));
        }
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        let f = figure(&out, "improvement_vs_delay_read");
        let ours: Vec<(&str, f64)> = f
            .series
            .iter()
            .filter(|s| s.style == Style::Measured)
            .map(|s| (s.name.as_str(), s.pts[0].y))
            .collect();
        assert_eq!(ours.len(), 2, "{ours:?}");
        assert!(!ours[0].0.contains("worker") && (ours[0].1 - 1.5).abs() < 1e-9);
        assert!(ours[1].0.contains(", 1 worker") && (ours[1].1 - 0.5).abs() < 1e-9);
        let paper = f.series.iter().filter(|s| s.style == Style::Paper).count();
        assert_eq!(paper, 1, "the paper's one-process line once");
        let table: Vec<&str> = out
            .md
            .lines()
            .filter(|l| l.starts_with("| delay |") || l.starts_with("| 8 ms |"))
            .collect();
        assert_eq!(
            table[0],
            "| delay | processes 1 (ours) | processes 1, 1 worker (ours) | paper, processes 1 |"
        );
        // Two blocks per cell, not four: each cell holds its own series' blocks only.
        assert_eq!(
            table[1].matches("KiB").count() + table[1].matches("MiB").count(),
            4
        );
        assert!(table[1].contains("**1.50×**") && table[1].contains("**0.50×**"));
        assert!(table[1].ends_with(" 0.78× |"), "{}", table[1]);
    }

    /// Table 3's paper points beside a read plan's target CPU are the rows of the process
    /// counts the plan ran: a one-process plan gets the one-process row (68.5 / 17.4 %), not
    /// the four-process one (79.2 / 56.4 %), which measured something else.
    #[test]
    fn table3_draws_the_papers_rows_only_for_the_process_counts_run() {
        let mut rs = Vec::new();
        for d in [0.0, 8.0] {
            for (scheme, n) in [(Scheme::Ipsec, 1), (Scheme::Seal, 1)] {
                let mut r = rec(scheme, d, 65536, n, 5.0);
                r.point.direction = Direction::Read;
                r.cpu_initiator_pct = 30.0;
                r.cpu_target_pct = 40.0;
                rs.extend(reps(&r, &[5.0]));
            }
        }
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        let f = figure(&out, "cpu_target_host_read");
        let paper: Vec<(&str, Vec<f64>)> = f
            .series
            .iter()
            .filter(|s| s.style == Style::Paper)
            .map(|s| (s.name.as_str(), s.pts.iter().map(|p| p.y).collect()))
            .collect();
        assert_eq!(
            paper,
            [
                ("paper Table 3: IPsec", vec![78.571, 24.632]),
                ("paper Table 3: 1 process(es)", vec![68.491, 17.356]),
            ]
        );
    }

    /// Fig. 16's plan runs one delay and sixteen depths: its CPU figure is drawn against the
    /// commands in flight with one series per scheme, not sixteen series stacked at one x.
    #[test]
    fn cpu_of_one_delay_is_drawn_against_workers_one_series_per_scheme() {
        let mut rs = Vec::new();
        for n in 1..=16 {
            for b in [32768, 65536] {
                let mut r = rec(Scheme::Seal, 64.0, b, n, f64::from(n));
                r.cpu_initiator_pct = 5.0 * f64::from(n);
                r.cpu_target_pct = 4.0 * f64::from(n);
                rs.extend(reps(&r, &[f64::from(n), f64::from(n)]));
            }
        }
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        for stem in ["cpu_initiator_host_write", "cpu_target_host_write"] {
            let f = figure(&out, stem);
            assert!(f.x_label.contains("commands in flight"), "{}", f.x_label);
            assert_eq!(f.series.len(), 1, "one series per scheme: {:?}", f.series);
            let xs: Vec<f64> = f.series[0].pts.iter().map(|p| p.x).collect();
            assert_eq!(xs, (1..=16).map(f64::from).collect::<Vec<_>>());
        }
        // With several delays: x is the delay in ms, one point per delay per series.
        let mut two = rs.clone();
        for r in &rs {
            let mut r = r.clone();
            r.point.delay_ms = 8.0;
            two.push(r);
        }
        let out = all(Path::new("/nonexistent"), &aggregate(&two), false);
        let f = figure(&out, "cpu_initiator_host_write");
        assert_eq!(f.x, Axis::DelayMs);
        for s in f.series.iter().filter(|s| s.style == Style::Measured) {
            let xs: Vec<f64> = s.pts.iter().map(|p| p.x).collect();
            assert_eq!(xs, [8.0, 64.0], "{}", s.name);
        }
    }

    /// The papers' own equations predict from the calibration alone: OP-2 is 2008 Eq. 4,
    /// OP-n is n/2 × Eq. 4 until Eq. 6's n and flat beyond it, one command is Eq. 3, and a
    /// point the papers did not model (IPsec) gets none. Changing the measured throughput
    /// does not change the prediction.
    #[test]
    fn papers_equations_predict_from_the_calibration_alone() {
        let at = |scheme, depth: u32, mb: f64| {
            let mut r = rec(scheme, 64.0, 65536, depth, mb);
            r.enc_mb_s = 10.82;
            r.dec_mb_s = 10.82;
            r.calibration = Some(crate::results::Calibration {
                rtt_ms: 128.0,
                socket_mb_s: 2.42,
                ..Default::default()
            });
            r
        };
        let i = Inputs {
            rtt_s: 0.128,
            block: 65536.0,
            socket: 2.42e6,
            enc: 10.82e6,
            dec: 10.82e6,
        };
        let n6 = model::eq6_workers(&i);
        assert!((n6 - 7.9).abs() < 0.1, "the paper's 64 KB n: {n6}");
        let rs = vec![
            at(Scheme::Seal, 2, 1.0),
            at(Scheme::Seal, 16, 1.0),
            at(Scheme::SealSeq, 1, 1.0),
            at(Scheme::Ipsec, 1, 1.0),
        ];
        let aggs = aggregate(&rs);
        let rates = rates(Path::new("/nonexistent"), &aggs);
        let eq = |k: usize| prediction::papers_eq(&aggs[k], &rates).map(|x| x.0);
        let eq4 = model::write_preprocessed(&i) / 1e6;
        assert!((eq(0).unwrap() - eq4).abs() < 1e-9);
        assert!(
            (eq(1).unwrap() - eq4 * n6 / 2.0).abs() < 1e-9,
            "OP-16 stops at n"
        );
        assert!((eq(2).unwrap() - model::write_sequential(&i) / 1e6).abs() < 1e-9);
        assert_eq!(eq(3), None, "the papers did not model IPsec");
        let mut faster = rs.clone();
        faster[0].throughput_mb_s = 100.0;
        let aggs2 = aggregate(&faster);
        let again = prediction::papers_eq(&aggs2[0], &rates).map(|x| x.0);
        assert_eq!(again, eq(0), "nothing is fitted to the measurement");
    }

    /// Records of seal OP-2, OP-4, OP-16, seal-seq, IPsec and plain at 64 ms, 64 KiB, run
    /// with a calibration file of the 2008 paper's own inputs (RTT 128 ms, SOCKET 2.42 MB/s,
    /// 3DES at 10.82 MB/s): the file as loaded, and the records carrying its SHA-1, with
    /// measurements that no prediction should see (their own in-run calibration far off the
    /// file's, CPU accounting, throughput).
    fn calibrated_runs() -> (crate::calibrate::LoadedCalibration, Vec<Record>) {
        let mut rs = vec![
            rec(Scheme::Seal, 64.0, 65536, 2, 0.40),
            rec(Scheme::Seal, 64.0, 65536, 4, 0.80),
            rec(Scheme::Seal, 64.0, 65536, 16, 1.5),
            rec(Scheme::SealSeq, 64.0, 65536, 1, 0.22),
            rec(Scheme::Ipsec, 64.0, 65536, 1, 0.20),
            rec(Scheme::Plain, 64.0, 65536, 1, 0.45),
        ];
        let points: Vec<_> = rs.iter().map(|r| r.point.clone()).collect();
        let mut f = crate::calibrate::sample_file(&points, 128.0, 2.42, 10.82);
        // IPsec's charons as the cost runs measured them.
        f.costs.ipsec_rates.push(crate::calibrate::StoredIpsecRate {
            direction: Direction::Write,
            cipher: "3des-cbc-hmac-sha1".into(),
            enc_bytes_per_cpu_s: 19e6,
            dec_bytes_per_cpu_s: 20e6,
        });
        let cal = crate::calibrate::LoadedCalibration::from_bytes(f.to_bytes().unwrap()).unwrap();
        for (k, r) in rs.iter_mut().enumerate() {
            r.calibration_sha1 = cal.sha1.clone();
            // What the run itself measured: none of it may enter the prediction.
            r.calibration = Some(crate::results::Calibration {
                rtt_ms: 1.0,
                socket_mb_s: 900.0,
                cores_avail: 0.3,
                ..Default::default()
            });
            r.enc_mb_s = 500.0;
            r.dec_mb_s = 500.0;
            r.cpu_initiator_pct = 30.0 + k as f64;
            r.cpu_target_pct = 40.0;
            r.cpu_emulator_pct = 20.0;
            r.cpu_tunnel_ini_pct = 25.0;
            r.cpu_tunnel_tgt_pct = 25.0;
            r.cpu_tunnel_pct = 50.0;
        }
        (cal, rs)
    }

    /// A run with `--calibration` is predicted from the file alone: building the prediction
    /// never reads the plan's runs for a fit (the counter every in-run fit bumps stays at 0,
    /// and does count when the in-plan fit runs), and changing everything the runs measured
    /// (throughput, CPU, their own calibration, cipher rates) changes no prediction. Records
    /// run with another file (or none) are left out.
    #[test]
    fn prediction_with_a_calibration_never_calls_the_in_run_fit() {
        let (cal, rs) = calibrated_runs();
        let aggs = aggregate(&rs);
        crate::fit::IN_RUN_FITS.with(|c| c.set(0));
        let rows = prediction::out_of_sample(&aggs, &cal);
        assert_eq!(
            crate::fit::IN_RUN_FITS.with(|c| c.get()),
            0,
            "the prediction fitted costs over the plan's runs"
        );
        assert_eq!(rows.len(), 6);
        assert!(rows.iter().all(|r| r.ipsan.is_some()), "every point priced");
        // The counter is live: the in-plan fit (the explanation) does read the runs.
        let _ = crate::fit::rates_from_records(&aggs);
        assert!(crate::fit::IN_RUN_FITS.with(|c| c.get()) > 0);
        let predictions = |rows: &[prediction::OutOfSample]| {
            rows.iter()
                .map(|r| (r.papers.map(|x| x.0), r.ipsan.as_ref().map(|x| x.0)))
                .collect::<Vec<_>>()
        };
        let mut changed = rs.clone();
        for r in &mut changed {
            r.throughput_mb_s *= 10.0;
            r.cpu_initiator_pct *= 3.0;
            r.cpu_target_pct *= 0.1;
            r.cpu_emulator_pct = 90.0;
            r.cpu_tunnel_ini_pct = 5.0;
            r.enc_mb_s = 1.0;
            r.dec_mb_s = 1.0;
            r.calibration = Some(crate::results::Calibration {
                rtt_ms: 500.0,
                socket_mb_s: 0.5,
                cores_avail: 1.9,
                ..Default::default()
            });
        }
        let again = prediction::out_of_sample(&aggregate(&changed), &cal);
        assert_eq!(predictions(&again), predictions(&rows));
        // Measured against: the new medians.
        assert!((again[0].agg.median - 4.0).abs() < 1e-9);
        let mut other = rs.clone();
        other[0].calibration_sha1 = "0".repeat(40);
        other[1].calibration_sha1.clear();
        assert_eq!(prediction::out_of_sample(&aggregate(&other), &cal).len(), 4);
    }

    /// The numbers for a fixed calibration (RTT 128 ms, SOCKET 2.42 MB/s, ENC = DEC =
    /// 10.82 MB/s, 64 KiB two-round-trip writes), by hand:
    /// Eq. 3 = 65536 / (0.256 + 65536/2.42e6 + 2·65536/10.82e6) = 0.222009 MB/s;
    /// Eq. 4 = 65536 / (0.128 + 65536/2.42e6 + 65536/10.82e6) = 0.406707 MB/s;
    /// Eq. 6 n = (0.256 + 65536/10.82e6) / (65536/10.82e6 + 65536/2.42e6) = 7.908
    /// (the paper's 7.9 at 64 KB), so OP-4 = 2 × Eq. 4 = 0.813415 and OP-16 stops at n:
    /// n/2 × Eq. 4 = 1.608135 MB/s. ipsan's model at one command is Eq. 3 too (its cycle is
    /// Eq. 1's; two cores and no carrier costs do not bind).
    #[test]
    fn predicts_hand_computed_eq3_eq4_eq6_values_from_a_fixed_calibration() {
        let (cal, rs) = calibrated_runs();
        let rows = prediction::out_of_sample(&aggregate(&rs), &cal);
        let get = |scheme: Scheme, depth: u32| {
            rows.iter()
                .find(|r| r.agg.rec.point.scheme == scheme && r.agg.rec.depth_used == depth)
                .unwrap()
        };
        let close = |got: f64, want: f64| (got - want).abs() < 5e-6;
        let eq = |scheme, depth| get(scheme, depth).papers.unwrap();
        assert!(
            close(eq(Scheme::SealSeq, 1).0, 0.222009),
            "{:?}",
            eq(Scheme::SealSeq, 1)
        );
        assert_eq!(eq(Scheme::SealSeq, 1).1, "2008 Eq. 3");
        assert!(
            close(eq(Scheme::Seal, 2).0, 0.406707),
            "{:?}",
            eq(Scheme::Seal, 2)
        );
        assert!(
            close(eq(Scheme::Seal, 4).0, 0.813415),
            "{:?}",
            eq(Scheme::Seal, 4)
        );
        assert!(
            close(eq(Scheme::Seal, 16).0, 1.608135),
            "{:?}",
            eq(Scheme::Seal, 16)
        );
        let ipsan_seq = get(Scheme::SealSeq, 1).ipsan.clone().unwrap();
        assert!(close(ipsan_seq.0, 0.222009), "{ipsan_seq:?}");
        assert_eq!(ipsan_seq.1, "depth");
        // The papers modelled neither IPsec nor plain iSCSI; ipsan's model prices both.
        assert!(get(Scheme::Ipsec, 1).papers.is_none());
        assert!(get(Scheme::Plain, 1).papers.is_none());
        assert!(get(Scheme::Plain, 1).ipsan.is_some());
        // In the report: the section, its table and every point's CSV row.
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join(crate::calibrate::CALIBRATION_IN_RESULTS),
            &cal.bytes,
        )
        .unwrap();
        let out = all(dir.path(), &aggregate(&rs), false);
        assert!(out.md.contains("Prediction, out of sample"), "{}", out.md);
        assert!(out.md.contains(&cal.sha1));
        assert!(
            out.md
                .contains("| 2008 Fig. 10, 11, 16: writes, 64 ms | seal 3DES |"),
            "{}",
            out.md
        );
        assert!(out.md.contains("an explanation, not a prediction"));
        let csv = std::fs::read_to_string(dir.path().join("prediction.csv")).unwrap();
        assert_eq!(csv.lines().count(), 7, "{csv}");
        assert!(csv.contains(",0.222,"), "{csv}");
    }

    /// The papers' numbers are 3DES: an AES plan's figures (the demo's, depth auto's) carry
    /// neither Fig. 14's bound nor Fig. 9–10's maxima, and a plan without 64 ms no 64 ms tick.
    #[test]
    fn the_papers_3des_numbers_stay_off_other_ciphers_figures() {
        let mut rs = Vec::new();
        for d in [0.0, 8.0] {
            for b in [65536, 1 << 20] {
                for (scheme, n) in [(Scheme::Seal, 8), (Scheme::Ipsec, 1)] {
                    let mut r = rec(scheme, d, b, n, 10.0);
                    r.point.cipher = "aes-256-gcm".into();
                    r.cpu_initiator_pct = 20.0;
                    r.cpu_target_pct = 20.0;
                    rs.push(r);
                }
            }
        }
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        for (stem, f) in &out.figures {
            assert!(
                !f.series.iter().any(|s| s.name.starts_with("paper")),
                "{stem}: {:?}",
                f.series.iter().map(|s| &s.name).collect::<Vec<_>>()
            );
            assert!(!f.x_ticks.contains(&64.0), "{stem}: {:?}", f.x_ticks);
        }
        assert!(out
            .figures
            .iter()
            .any(|(s, _)| s == "cpu_initiator_host_write"));
    }

    /// The 2006 papers' Tables 4–5 are reads at 0 ms: the model figure of a write plan (or
    /// Fig. 16's, Aiken's, the pathologies') does not carry them; a read plan with seal at
    /// one or two commands at 0 ms does, all sixteen cells.
    #[test]
    fn the_2006_read_pairs_are_drawn_only_beside_reads_at_0_ms() {
        let plain = |dirn: Direction, d: f64| {
            let mut r = rec(Scheme::Plain, d, 65536, 1, 5.0);
            r.point.direction = dirn;
            r.calibration = Some(crate::results::Calibration {
                rtt_ms: 2.0 * d + 0.2,
                socket_mb_s: 100.0,
                ..Default::default()
            });
            r
        };
        let papers = |out: &Out| {
            figure(out, "model_vs_measured")
                .series
                .iter()
                .filter(|s| s.style == Style::Paper)
                .map(|s| s.pts.len())
                .sum::<usize>()
        };
        let writes = vec![plain(Direction::Write, 0.0), plain(Direction::Write, 8.0)];
        let out = all(Path::new("/nonexistent"), &aggregate(&writes), false);
        assert_eq!(papers(&out), 0, "no 2006 read points on a write plan");
        let mut reads = writes.clone();
        let mut seal = rec(Scheme::Seal, 0.0, 65536, 1, 4.0);
        seal.point.direction = Direction::Read;
        reads.push(seal);
        let out = all(Path::new("/nonexistent"), &aggregate(&reads), false);
        assert_eq!(papers(&out), 16, "Tables 4 and 5, eight blocks each");
    }

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

    /// Aiken's Table 1 gives no delay: the pathologies figure, drawn at the plan's one delay
    /// (10 ms), carries no paper line, and the text says why.
    #[test]
    fn pathologies_draw_no_paper_line_at_a_delay_the_paper_does_not_state() {
        let mut rs = Vec::new();
        for loss in [0.0, 0.027] {
            let mut r = rec(Scheme::Plain, 10.0, 65536, 8, 5.0);
            r.point.rate_mbit = 100.0;
            r.point.loss = loss;
            r.point.reorder = if loss > 0.0 { 0.02 } else { 0.0 };
            r.point.corrupt = if loss > 0.0 { 0.0002 } else { 0.0 };
            rs.push(r);
        }
        let out = all(Path::new("/nonexistent"), &aggregate(&rs), false);
        let (_, bars) = out
            .bars
            .iter()
            .find(|(s, _)| s == "pathologies")
            .expect("a pathologies figure");
        assert!(bars.paper.is_none(), "{:?}", bars.paper);
        assert!(
            out.md.contains("at a delay they do not state"),
            "{}",
            out.md
        );
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
