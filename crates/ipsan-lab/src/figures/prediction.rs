//! 2008 (000) Fig. 15 / 2006 (001) Tables 4–5: the model on this machine against measurement
//! (the costs it is priced with come from [`crate::fit`]).

use super::*;

/// The papers' own equations at a seal point's calibrated inputs, nothing fitted to any run:
/// 2008 Eq. (3) for a two-round-trip write with one command, Eq. (4) for OP-2 and n/2 × Eq. (4)
/// for OP-n up to Eq. (6)'s n (Fig. 16's ideal line, flat beyond); 2006 Eq. (2) for one read
/// process, Eq. (3) for two, n/2 × Eq. (3) beyond (the 2006 papers give no limit). RTT and
/// SOCKET are the point's calibration, ENC and DEC the cipher's rates per CPU-second
/// ([`Rates`]). `None` for IPsec, plain, `depth = auto` and one-round-trip writes, which the
/// papers did not model.
pub(crate) fn papers_eq(a: &Agg, rates: &Rates) -> Option<(f64, &'static str)> {
    let r = &a.rec;
    let p = &r.point;
    if !matches!(p.scheme, Scheme::Seal | Scheme::SealSeq) || p.depth == Depth::Auto {
        return None;
    }
    let cal = r.calibration.as_ref()?;
    let (enc, dec) = *rates.enc.get(&(p.cipher.clone(), p.block))?;
    let i = Inputs {
        rtt_s: cal.rtt_ms / 1e3,
        block: p.block as f64,
        socket: cal.socket_mb_s * 1e6,
        enc,
        dec,
    };
    i.validate().ok()?;
    let n = f64::from(r.depth_used.max(1));
    let one = p.scheme == Scheme::SealSeq || n < 2.0;
    let (v, eq) = match p.direction {
        Direction::Write if p.iscsi != IscsiMode::Paper => return None,
        Direction::Write if one => (model::write_sequential(&i), "2008 Eq. 3"),
        Direction::Write => {
            let n = n.min(model::eq6_workers(&i).max(2.0));
            (
                model::write_preprocessed(&i) * n / 2.0,
                "2008 n/2 × Eq. 4 up to Eq. 6 n",
            )
        }
        Direction::Read if one => (model::read_sequential(&i), "2006 Eq. 2"),
        Direction::Read => (model::read_preprocessed(&i) * n / 2.0, "2006 n/2 × Eq. 3"),
    };
    (v.is_finite() && v > 0.0).then_some((v / 1e6, eq))
}

/// 2008 Fig. 15 / 2006 Tables 4–5: the model on this machine vs measurement, log–log, ±25 %
/// band, colour per scheme; and the error per scheme, beside the papers' own equations'.
pub(super) fn model_fig(dir: &Path, aggs: &[Agg], rates: &Rates, fonts: bool, out: &mut Out) {
    let mut per: BTreeMap<String, Vec<Pt>> = BTreeMap::new();
    let mut errs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut old: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    let mut stall: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    // The papers' equations, nothing fitted: error per scheme.
    let mut paper_errs: BTreeMap<String, Vec<f64>> = BTreeMap::new();
    // Every point's inputs and prediction, so a reader can see where the model misses.
    let mut csv = String::from(
        "scheme,cipher,direction,iscsi,block,delay_ms,depth,measured_mb_s,min_mb_s,max_mb_s,\
         predicted_mb_s,limit,error_pct,rtt_ms,socket_mb_s,cores_got,papers_eq_mb_s,papers_eq,\
         papers_eq_error_pct\n",
    );
    for a in aggs {
        let Some((m, limit)) = model_here(a, rates) else {
            continue;
        };
        if !(m > 0.0 && a.median > 0.0) {
            continue;
        }
        let p = &a.rec.point;
        let (rtt, sock) = a
            .rec
            .calibration
            .as_ref()
            .map_or((f64::NAN, f64::NAN), |c| (c.rtt_ms, c.socket_mb_s));
        let peq = papers_eq(a, rates);
        let _ = writeln!(
            csv,
            "{},{},{},{:?},{},{},{},{:.3},{:.3},{:.3},{:.3},{},{:.1},{:.3},{:.1},{:.3},{},{},{}",
            p.scheme,
            p.cipher,
            p.direction.name(),
            p.iscsi,
            p.block,
            p.delay_ms,
            a.rec.depth_used,
            a.median,
            a.min,
            a.max,
            m,
            limit,
            (a.median / m - 1.0) * 100.0,
            rtt,
            sock,
            a.cores_got,
            peq.map_or(String::new(), |(v, _)| format!("{v:.3}")),
            peq.map_or("", |(_, e)| e),
            peq.map_or(String::new(), |(v, _)| format!(
                "{:.1}",
                (a.median / v - 1.0) * 100.0
            )),
        );
        let key = format!(
            "{} {}",
            a.rec.point.scheme,
            if a.rec.point.scheme == Scheme::Plain {
                ""
            } else {
                short(&a.rec.point.cipher)
            }
        )
        .trim()
        .to_string();
        if let Some((v, _)) = peq {
            paper_errs
                .entry(key.clone())
                .or_default()
                .push((a.median / v - 1.0) * 100.0);
        }
        per.entry(key.clone()).or_default().push(Pt {
            x: m,
            y: a.median,
            lo: a.min,
            hi: a.max,
        });
        errs.entry(key.clone())
            .or_default()
            .push((a.median / m - 1.0) * 100.0);
        // How much of the mean time per command (depth × BLOCK ÷ throughput) the median
        // command latency accounts for; the rest is stalls (scheduling on the shared host,
        // retransmits) that a model of the typical cycle cannot see.
        let r = &a.rec;
        if r.lat_p50_us > 0.0 && r.throughput_mb_s > 0.0 {
            let per_cmd_us = f64::from(r.depth_used.max(1)) * p.block as f64 / r.throughput_mb_s;
            stall
                .entry(key.clone())
                .or_default()
                .push(r.lat_p50_us / per_cmd_us);
        }
        if a.rec.model_mb_s > 0.0 {
            old.entry(key)
                .or_default()
                .push((a.median / a.rec.model_mb_s - 1.0) * 100.0);
        }
    }
    if per.is_empty() {
        return;
    }
    let csv_note = if std::fs::write(dir.join("model.csv"), &csv).is_ok() {
        " Every point's inputs, prediction and error: `model.csv`."
    } else {
        ""
    };
    let _ = writeln!(
        out.md,
        "### The model on this machine (2008 Fig. 15, 2006 Tables 4–5)\n\n\
         Both ends, their crypto and the emulator share this host's 2 vCPUs with other \
         engineers' builds, so the papers' model (own idle cores per host) cannot hold here. \
         `figures::model_here`: the papers' generalised model at the calibrated RTT and \
         SOCKET with crypto rates per CPU-second (seal: the best ENC/DEC any calibration in \
         the plan measured for that cipher and block, i.e. the least contended; IPsec: the \
         rates its charons reached per CPU-second, throughput ÷ each host's charon CPU, median \
         per cipher and direction — userspace ESP's per-packet cost, which no cipher \
         microbenchmark shows), capped by what the CPU the run actually got can carry: \
         `cores_got / (1/ENC + 1/DEC + EMU + STACKS)`, with `cores_got` the CPU every lab \
         process (initiator, target, tunnels, emulator) received during the run, EMU the \
         emulator's and STACKS the initiator's + target's CPU per byte, measured in the \
         plan's runs of that scheme with and without a delay (median; seal's STACKS are plain \
         iSCSI's from the same plan, its own processes' CPU being mostly its crypto, or the \
         best SOCKET without plain runs). With a delay the \
         emulator wakes before each release, and ESP's packets leave charon one at a time: \
         IPsec's EMU is several times TCP's. Where the plan has several block sizes, EMU, \
         STACKS and IPsec's charons are fitted as `a·bytes + c·flights` (least squares over \
         the plan's points; c ≥ 0 or the per-byte median stands) and each command adds \
         c × flights / BLOCK per byte. A flight is one leg of the command's exchange, which \
         starts as a separate small send: two for a read (command; Data-In with the status) \
         or a write whose data all goes unsolicited, four for a write that waits for an R2T \
         (command, R2T, Data-Out, response). The cap is an \
         accounting identity when the run is CPU-bound; the error then tests whether the \
         per-byte costs are right. Goal: median |error| ≤ 15 % per scheme.{csv_note}\n\n\
         The last column is the median, over the scheme's points, of the median command \
         latency ÷ the mean time per command (depth × BLOCK ÷ throughput): 1 means every \
         command took the typical time; below 1, stalls (a descheduled process, a \
         retransmit) took the rest, and the model, which predicts the typical cycle, \
         over-predicts by about that much.\n\n\
         The papers' column is their own equations with nothing fitted to any run \
         (`figures::papers_eq`: 2008 Eq. 3 for one write command, n/2 × Eq. 4 up to Eq. 6's \
         n for OP-n; 2006 Eq. 2 for one read process, n/2 × Eq. 3 for more) at each point's \
         calibrated RTT and SOCKET and the cipher's rates per CPU-second: a prediction made \
         before the run's throughput or CPU is known, for the seal points the papers \
         modelled. ipsan's column uses each run's measured CPU and the plan's carrier costs, \
         so it is in sample.\n\n\
         | scheme | points | median abs error | median signed | within 25 % | median abs error, runner's model (own cores) | median latency ÷ time per command | papers' equations, nothing fitted: points, median abs error (signed) |\n|---|---|---|---|---|---|---|---|"
    );
    for (k, e) in &errs {
        let mut abs: Vec<f64> = e.iter().map(|x| x.abs()).collect();
        let within = abs.iter().filter(|x| **x <= 25.0).count();
        let mut signed = e.clone();
        let mut o: Vec<f64> = old
            .get(k)
            .map(|v| v.iter().map(|x| x.abs()).collect())
            .unwrap_or_default();
        let mut st = stall.get(k).cloned().unwrap_or_default();
        let st = if st.is_empty() {
            "–".to_string()
        } else {
            format!("{:.2}", median(&mut st))
        };
        let pe = match paper_errs.get(k) {
            Some(v) if !v.is_empty() => {
                let mut abs: Vec<f64> = v.iter().map(|x| x.abs()).collect();
                let mut signed = v.clone();
                format!(
                    "{}, {:.0} % ({:+.0} %)",
                    v.len(),
                    median(&mut abs),
                    median(&mut signed)
                )
            }
            _ => "–".to_string(),
        };
        let _ = writeln!(
            out.md,
            "| {k} | {} | {:.0} % | {:+.0} % | {}/{} | {} | {st} | {pe} |",
            e.len(),
            median(&mut abs),
            median(&mut signed),
            within,
            e.len(),
            if o.is_empty() {
                "–".to_string()
            } else {
                format!("{:.0} %", median(&mut o))
            }
        );
    }
    for ((c, b), (e, d)) in &rates.enc {
        let _ = writeln!(
            out.md,
            "\nSeal {} at {}: ENC {:.1} MB/s, DEC {:.1} MB/s per CPU-second.",
            short(c),
            fmt_size(*b),
            e / 1e6,
            d / 1e6
        );
    }
    for ((d, c), (e, dd)) in &rates.ipsec {
        let _ = writeln!(
            out.md,
            "\nIPsec {} {}: charon reached {:.1} MB/s per CPU-second sending, {:.1} receiving.",
            d.name(),
            short(c),
            e / 1e6,
            dd / 1e6
        );
    }
    // The 2006 papers' model-vs-measurement pairs are reads at 0 ms with one and two
    // processes: drawn only beside such points of ours, never over writes or other delays.
    let reads_at_0 = aggs.iter().any(|a| {
        a.rec.point.direction == Direction::Read
            && a.rec.point.scheme == Scheme::Seal
            && same_delay(a.rec.point.delay_ms, 0.0)
            && matches!(a.rec.depth_used, 1 | 2)
    });
    if reads_at_0 {
        let _ = writeln!(
            out.md,
            "\nPaper (2006 (001) Tables 4–5, reads at 0 ms, 4–512 KB): Eq. 2 vs measured with \
             one process (e.g. 64 KB: 4.624 vs 4.446 MB/s), Eq. 3 vs measured with two (8.546 vs \
             8.164); black and grey triangles. Their 4 KB cells (3.867 vs 1.192, 6.192 vs 1.284) \
             are the ones the paper says the model misses.\n"
        );
    }
    let mut fig = Figure::new(
        "Model vs measurement, log–log (2008 Fig. 15; 2006 Tables 4–5)",
        "predicted MB/s (log)",
        "measured MB/s (log; bars: min–max)",
        Axis::Log10,
        Axis::Log10,
    );
    fig.band = Some(0.25);
    for (i, (k, pts)) in per.into_iter().enumerate() {
        fig.series.push(Series {
            name: k,
            color: i,
            style: Style::Scatter,
            pts,
        });
    }
    if reads_at_0 {
        fig.series.push(Series {
            name: "paper 2006 Table 4: reads, 0 ms, 1 process (Eq. 2)".into(),
            color: BLACK_IDX,
            style: Style::Paper,
            pts: TABLE4_001.iter().map(|(_, m, v)| Pt::at(*m, *v)).collect(),
        });
        fig.series.push(Series {
            name: "paper 2006 Table 5: reads, 0 ms, 2 processes (Eq. 3)".into(),
            color: 7,
            style: Style::Paper,
            pts: TABLE5_001.iter().map(|(_, m, v)| Pt::at(*m, *v)).collect(),
        });
    }
    emit(dir, "model_vs_measured", fig, fonts, out);
}
