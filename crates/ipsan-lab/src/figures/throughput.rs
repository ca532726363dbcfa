//! 2008 (000) Fig. 9–11 (throughput vs block size; improvement over IPsec as the mean over
//! block sizes) and 2006 (001) Table 2 (read improvement per process count).

use super::*;

/// 2008 Fig. 9–10 (writes) and 2006 Fig. 4–6 (reads): throughput vs block size per delay.
pub(super) fn throughput_vs_block(
    dir: &Path,
    aggs: &[Agg],
    dirn: Direction,
    fonts: bool,
    out: &mut Out,
) {
    let mut delays: Vec<f64> = aggs
        .iter()
        .filter(|a| a.rec.point.direction == dirn && a.rec.point.scheme != Scheme::Iperf3)
        .map(|a| a.rec.point.delay_ms)
        .collect();
    delays.sort_by(f64::total_cmp);
    delays.dedup();
    for d in delays {
        let mut series: BTreeMap<(u8, u32, String), Vec<Pt>> = BTreeMap::new();
        for a in aggs.iter().filter(|a| {
            a.rec.point.direction == dirn
                && same_delay(a.rec.point.delay_ms, d)
                && a.rec.point.scheme != Scheme::Iperf3
        }) {
            let order = match a.rec.point.scheme {
                Scheme::Ipsec => 0,
                Scheme::SealSeq => 1,
                Scheme::Seal => 2,
                _ => 3,
            };
            let lun = match a.rec.point.backend {
                Backend::Mem => "",
                Backend::Null => ", null LUN",
                Backend::File => ", file LUN",
                Backend::Disk => ", disk LUN",
            };
            series
                .entry((order, a.rec.depth_used, format!("{}{lun}", paper_name(a))))
                .or_default()
                .push(pt(a.rec.point.block as f64, a));
        }
        // A block-size axis needs at least two block sizes in some series.
        let spans = |v: &Vec<Pt>| v.iter().any(|p| p.x != v[0].x);
        if !series.values().any(spans) {
            continue;
        }
        let (what, figs) = match dirn {
            Direction::Write => ("Write", "2008 Fig. 9–10"),
            Direction::Read => ("Read", "2006 Fig. 4–6"),
        };
        let mut fig = Figure::new(
            &format!("{what} throughput vs block size, {d} ms one way ({figs})"),
            "block size (log scale)",
            "MB/s (median, min–max bars)",
            Axis::Log2Bytes,
            Axis::Linear,
        );
        for (i, ((_, _, name), pts)) in series.into_iter().enumerate() {
            fig.series.push(Series {
                name,
                color: i,
                style: Style::Measured,
                pts,
            });
        }
        // The paper's maxima are 3DES writes: drawn only beside 3DES runs.
        let des = aggs.iter().any(|a| {
            a.rec.point.direction == dirn
                && same_delay(a.rec.point.delay_ms, d)
                && a.rec.point.cipher.starts_with("3des")
                && matches!(a.rec.point.scheme, Scheme::Seal | Scheme::Ipsec)
        });
        if dirn == Direction::Write && des {
            for (pd, ipsec, op10) in FIG9_10 {
                if same_delay(pd, d) {
                    fig.series.push(Series {
                        name: format!("paper: IPsec max {ipsec} MB/s"),
                        color: BLACK_IDX,
                        style: Style::HLine,
                        pts: vec![Pt::at(f64::NAN, ipsec)],
                    });
                    fig.series.push(Series {
                        name: format!("paper: OP-10 max {op10} MB/s"),
                        color: 7,
                        style: Style::HLine,
                        pts: vec![Pt::at(f64::NAN, op10)],
                    });
                }
            }
        }
        let stem = format!("throughput_vs_block_{}_{d}ms", dirn.name());
        let _ = writeln!(out.md, "### {}\n", fig.title);
        emit(dir, &stem, fig, fonts, out);
    }
}

/// 2008 Fig. 11 (writes, OP-n) and 2006 Table 2 (reads, 1–4 processes): seal over IPsec at
/// one command, as the mean over block sizes of the per-block ratios, per delay. The figure's
/// bars are the spread over repetitions (repetition k's ratio pairs repetition k of seal and
/// IPsec at every block), not over block sizes; its x axis is the delay in ms. One series
/// (table column, figure line) per meaning: the commands in flight and seal's crypto workers
/// per host (the plan's `crypto_workers`), so a one-worker seal @1 and the default seal @1 of
/// one run are never averaged together.
pub(super) fn improvement(dir: &Path, aggs: &[Agg], dirn: Direction, fonts: bool, out: &mut Out) {
    // (depth, crypto workers) → delay → [(block, ratio of medians, ratio per repetition)]
    type PerBlock = Vec<(u64, f64, Vec<f64>)>;
    let mut by: BTreeMap<(u32, u32), BTreeMap<i64, PerBlock>> = BTreeMap::new();
    for a in aggs.iter().filter(|a| {
        a.rec.point.direction == dirn
            && a.rec.point.scheme == Scheme::Seal
            && matches!(a.rec.point.depth, Depth::Fixed(_))
    }) {
        if let Some(b) = ipsec_at(aggs, a) {
            if b.median > 0.0 && a.median.is_finite() {
                let reps: Vec<f64> = a
                    .reps
                    .iter()
                    .zip(&b.reps)
                    .map(|(s, i)| s.mb_s / i.mb_s)
                    .collect();
                by.entry((a.rec.depth_used, a.rec.point.crypto_workers))
                    .or_default()
                    .entry((a.rec.point.delay_ms * 1000.0) as i64)
                    .or_default()
                    .push((a.rec.point.block, a.median / b.median, reps));
            }
        }
    }
    if by.is_empty() {
        return;
    }
    let mut delays: Vec<i64> = by.values().flat_map(|m| m.keys().copied()).collect();
    delays.sort();
    delays.dedup();
    let (title, unit, paper_ref) = match dirn {
        Direction::Write => (
            "Write improvement over IPsec @1, mean over block sizes (2008 Fig. 11)",
            "OP",
            "2008 (000) Fig. 11",
        ),
        Direction::Read => (
            "Read improvement over IPsec @1, mean over block sizes (2006 Table 2)",
            "processes",
            "2006 (001) Table 2",
        ),
    };
    let _ = writeln!(out.md, "### {title}\n");
    let _ = writeln!(
        out.md,
        "The papers' metric: for each delay, the mean over the block sizes run of \
         seal OP-n ÷ IPsec with one command in flight (same cipher, block and delay). \
         Per-block ratios follow in brackets. Papers: {paper_ref}. In the figure the bars \
         are the min–max over repetitions of that mean (repetition k of seal over \
         repetition k of IPsec at every block), and the paper's values are drawn only at \
         the delays it gives.\n"
    );
    // The paper's column (and line) once per number of commands, after that number's last
    // series of ours.
    let keys: Vec<(u32, u32)> = by.keys().copied().collect();
    let last_of_n = |i: usize| keys.get(i + 1).is_none_or(|k| k.0 != keys[i].0);
    let mut hdr = String::from("| delay |");
    let mut sep = String::from("|---|");
    for (i, &(n, w)) in keys.iter().enumerate() {
        let _ = write!(hdr, " {unit} {n}{} (ours) |", workers_label(w));
        sep.push_str("---|");
        if dirn == Direction::Read && (1..=4).contains(&n) && last_of_n(i) {
            let _ = write!(hdr, " paper, {unit} {n} |");
            sep.push_str("---|");
        }
        if dirn == Direction::Write && n == 10 && last_of_n(i) {
            let _ = write!(hdr, " paper OP-10 |");
            sep.push_str("---|");
        }
    }
    let _ = writeln!(out.md, "{hdr}\n{sep}");
    let mut fig = Figure::new(
        title,
        "one-way delay, ms (log scale of 1 + delay)",
        "improvement ratio (×)",
        Axis::DelayMs,
        Axis::Linear,
    );
    let paper_delays: Vec<f64> = match dirn {
        Direction::Read => TABLE2.iter().map(|r| r.0).collect(),
        Direction::Write if keys.iter().any(|k| k.0 == 10) => {
            let mut d: Vec<f64> = FIG11_OP10.iter().map(|r| r.0).collect();
            d.push(0.0);
            d
        }
        Direction::Write => Vec::new(),
    };
    fig.x_ticks = delay_ticks(delays.iter().map(|d| *d as f64 / 1000.0), &paper_delays);
    for (i, (&(n, w), per)) in by.iter().enumerate() {
        let mut pts = Vec::new();
        for (d, v) in per {
            let mean = v.iter().map(|x| x.1).sum::<f64>() / v.len() as f64;
            let k = v.iter().map(|x| x.2.len()).min().unwrap_or(0);
            let (lo, hi) = over_reps(k, |k| {
                v.iter().map(|x| x.2[k]).sum::<f64>() / v.len() as f64
            });
            pts.push(Pt {
                x: *d as f64 / 1000.0,
                y: mean,
                lo,
                hi,
            });
        }
        fig.series.push(Series {
            name: format!(
                "seal {unit}-{n}{} (bars: min–max over repetitions)",
                workers_label(w)
            ),
            color: i,
            style: Style::Measured,
            pts,
        });
        if dirn == Direction::Read && (1..=4).contains(&n) && last_of_n(i) {
            fig.series.push(Series {
                name: format!("paper Table 2, {n} process(es)"),
                color: i,
                style: Style::Paper,
                pts: TABLE2
                    .iter()
                    .map(|(d, r)| Pt::at(*d, r[n as usize - 1]))
                    .collect(),
            });
        }
        if dirn == Direction::Write && n == 10 && last_of_n(i) {
            fig.series.push(Series {
                name: "paper Fig. 11, OP-10 (its text: ≈1.5× at 1 ms, 4.6× at 8, 6.6× at 64)"
                    .into(),
                color: i,
                style: Style::Paper,
                pts: FIG11_OP10.iter().map(|(d, r)| Pt::at(*d, *r)).collect(),
            });
            fig.series.push(Series {
                name: "paper Fig. 11: below 1× at 0 ms (its text)".into(),
                color: i,
                style: Style::PaperBelow,
                pts: vec![Pt::at(0.0, 1.0)],
            });
        }
    }
    fig.series.push(Series {
        name: "parity with IPsec (1×)".into(),
        color: 7,
        style: Style::HLine,
        pts: vec![Pt::at(f64::NAN, 1.0)],
    });
    for d in &delays {
        let df = *d as f64 / 1000.0;
        let mut row = format!("| {} |", ms(df));
        for (i, (&(n, _), per)) in by.iter().enumerate() {
            match per.get(d) {
                Some(v) => {
                    let mean = v.iter().map(|x| x.1).sum::<f64>() / v.len() as f64;
                    let blocks: Vec<String> = v
                        .iter()
                        .map(|(b, r, _)| format!("{} {:.2}", fmt_size(*b), r))
                        .collect();
                    let _ = write!(row, " **{mean:.2}×** ({}) |", blocks.join(", "));
                }
                None => row.push_str(" – |"),
            }
            if dirn == Direction::Read && (1..=4).contains(&n) && last_of_n(i) {
                let p = TABLE2
                    .iter()
                    .find(|(pd, _)| same_delay(*pd, df))
                    .map_or("–".into(), |(_, r)| format!("{:.2}×", r[n as usize - 1]));
                let _ = write!(row, " {p} |");
            }
            if dirn == Direction::Write && n == 10 && last_of_n(i) {
                let p = FIG11_OP10
                    .iter()
                    .find(|(pd, _)| same_delay(*pd, df))
                    .map_or(
                        if df == 0.0 {
                            "< 1×".to_string()
                        } else {
                            "–".into()
                        },
                        |(_, r)| format!("≈{r}×"),
                    );
                let _ = write!(row, " {p} |");
            }
        }
        let _ = writeln!(out.md, "{row}");
    }
    let _ = writeln!(out.md);
    let stem = format!("improvement_vs_delay_{}", dirn.name());
    emit(dir, &stem, fig, fonts, out);
}
