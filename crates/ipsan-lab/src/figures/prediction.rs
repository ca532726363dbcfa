//! 2008 (000) Fig. 15 / 2006 (001) Tables 4–5: the model on this machine against measurement
//! (the costs it is priced with come from [`crate::fit`]).

use super::*;
use crate::calibrate::{CalibrationFile, LoadedCalibration, CALIBRATION_IN_RESULTS as CALIBRATION};

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

/// Which of the papers' figures and tables a point belongs to, for the error per figure:
/// the 2008 paper's two-round-trip 3DES writes (Fig. 9 at 8 ms, Fig. 10 and 16 at 64 ms,
/// Fig. 11 at every delay), the 2006 papers' 3DES reads (Table 2 at every delay, Tables 4–5
/// at 0 ms), and ours elsewhere (ipsan's one-round-trip writes, other ciphers).
pub(crate) fn figure_of(a: &Agg) -> String {
    let p = &a.rec.point;
    // The link: its delay, and its rate where it has one (the papers' regime).
    let d = if p.rate_mbit > 0.0 {
        format!("{} ms, {} Mbit/s", p.delay_ms, p.rate_mbit)
    } else {
        format!("{} ms", p.delay_ms)
    };
    let des = p.cipher.starts_with("3des") || p.scheme == Scheme::Plain;
    match p.direction {
        Direction::Write if des && p.iscsi == IscsiMode::Paper => {
            let fig = if same_delay(p.delay_ms, 8.0) {
                "Fig. 9, 11"
            } else if same_delay(p.delay_ms, 64.0) {
                "Fig. 10, 11, 16"
            } else {
                "Fig. 11"
            };
            format!("2008 {fig}: writes, {d}")
        }
        Direction::Write => format!("ours: writes, {d}, {}", short(&p.cipher)),
        Direction::Read if des => {
            let t = if same_delay(p.delay_ms, 0.0) {
                "Tables 2, 4–5"
            } else {
                "Table 2"
            };
            format!("2006 {t}: reads, {d}")
        }
        Direction::Read => format!("ours: reads, {d}, {}", short(&p.cipher)),
    }
}

/// A point's predictions from a calibration file alone, beside what it measured.
#[derive(Debug, Clone)]
pub(crate) struct OutOfSample {
    /// The point's figure ([`figure_of`]).
    pub figure: String,
    /// Scheme and cipher, as the error tables name them.
    pub scheme: String,
    /// The point, aggregated over its repetitions (what was measured).
    pub agg: Agg,
    /// The papers' Eq. 1–6 ([`papers_eq`]) at the file's inputs.
    pub papers: Option<(f64, &'static str)>,
    /// ipsan's model ([`model_here`]) at the file's inputs, costs and cores.
    pub ipsan: Option<(f64, String)>,
}

/// The point `a` as the calibration file alone describes it: its settings (scheme, block,
/// depth, delay, the negotiated FirstBurstLength) kept, every measurement of the run dropped,
/// RTT and SOCKET from the file's entry for its link, ENC/DEC from the file's cipher rates,
/// and the cores the file measured in place of the CPU the run got. `None` when the file
/// does not have the point's link.
fn as_calibrated(a: &Agg, cal: &CalibrationFile) -> Option<Agg> {
    let r = &a.rec;
    let mut clean =
        crate::results::Record::new(&r.plan, r.run, r.rep, &r.point, &cal.measured_by, r.root);
    clean.status = crate::results::Status::Ok;
    clean.depth_used = r.depth_used;
    clean.first_burst = r.first_burst;
    clean.calibration = Some(cal.link(&r.point)?.clone());
    if let Some((e, d)) = cal.cipher(&r.point) {
        clean.enc_mb_s = e / 1e6;
        clean.dec_mb_s = d / 1e6;
    }
    Some(Agg {
        rec: clean,
        median: f64::NAN,
        min: f64::NAN,
        max: f64::NAN,
        n: 0,
        cpu_ini_host: f64::NAN,
        cpu_tgt_host: f64::NAN,
        cores_got: cal.cores_avail,
        reps: Vec::new(),
    })
}

/// Every point's out-of-sample predictions: the papers' equations and ipsan's model, both
/// priced with `cal` and nothing else ([`Rates::from_calibration`], [`as_calibrated`]) — no
/// fit over the plan's runs, no run's CPU or throughput. Only the points whose records
/// carry `cal`'s SHA-1 (run with it).
pub(crate) fn out_of_sample(aggs: &[Agg], cal: &LoadedCalibration) -> Vec<OutOfSample> {
    let rates = Rates::from_calibration(&cal.file);
    aggs.iter()
        .filter(|a| a.rec.calibration_sha1 == cal.sha1)
        .filter_map(|a| {
            let c = as_calibrated(a, &cal.file)?;
            Some(OutOfSample {
                figure: figure_of(a),
                scheme: scheme_key(a),
                papers: papers_eq(&c, &rates),
                ipsan: model_here(&c, &rates),
                agg: a.clone(),
            })
        })
        .collect()
}

/// Where the file has IPsec's round trips through its tunnel: each link's, beside the plain
/// one, and IPsec's error with the plain RTT instead (the model before the tunnel's round trip
/// was calibrated), from the same file.
fn tunnel_note(rows: &[OutOfSample], cal: &LoadedCalibration, out: &mut Out) {
    let f = &cal.file;
    let tunnels: Vec<String> = f
        .links
        .iter()
        .filter_map(|l| {
            l.ipsec_rtt.map(|t| {
                format!(
                    "{} {:.3} ms (plain {:.3})",
                    l.label,
                    t.median_s * 1e3,
                    l.calibration.rtt_ms
                )
            })
        })
        .collect();
    if tunnels.is_empty() {
        return;
    }
    let plain = Rates::from_calibration(f).without_ipsec_rtt();
    let before: Vec<f64> = rows
        .iter()
        .filter(|r| r.agg.rec.point.scheme == Scheme::Ipsec && r.agg.median > 0.0)
        .filter_map(|r| {
            let c = as_calibrated(&r.agg, f)?;
            let v = model_here(&c, &plain)?.0;
            (v > 0.0).then(|| (r.agg.median / v - 1.0) * 100.0)
        })
        .collect();
    let _ = writeln!(
        out.md,
        "IPsec's round trip through its tunnel, calibrated (a 1-byte TCP ping-pong inside ESP, \
         both charons up): {}. ipsan's model prices IPsec's round trips with it; with the \
         plain RTT instead (the model before), IPsec: {}.\n",
        tunnels.join("; "),
        err_cell(&before)
    );
}

/// `seal 3DES`, `plain`: the error tables' row names.
fn scheme_key(a: &Agg) -> String {
    let p = &a.rec.point;
    if p.scheme == Scheme::Plain {
        p.scheme.to_string()
    } else {
        format!("{} {}{}", p.scheme, short(&p.cipher), workers_suffix(p))
    }
}

/// `n, median / worst abs error (median signed)` of `errs` (%), or `–`.
fn err_cell(errs: &[f64]) -> String {
    if errs.is_empty() {
        return "–".into();
    }
    let mut abs: Vec<f64> = errs.iter().map(|e| e.abs()).collect();
    let worst = abs.iter().copied().fold(0.0, f64::max);
    let mut signed = errs.to_vec();
    format!(
        "{}: {:.1} % / {:.1} % ({:+.1} %)",
        errs.len(),
        median(&mut abs),
        worst,
        median(&mut signed)
    )
}

/// The out-of-sample section: where the file came from, the error of the papers' Eq. 1–6 and
/// of ipsan's model per figure and scheme (median and worst), every point in
/// `prediction.csv`, and both predictions against measurement, log–log.
pub(super) fn prediction_section(
    dir: &Path,
    aggs: &[Agg],
    cal: &LoadedCalibration,
    fonts: bool,
    out: &mut Out,
) {
    let rows = out_of_sample(aggs, cal);
    let f = &cal.file;
    let others = aggs
        .iter()
        .filter(|a| a.rec.calibration_sha1 != cal.sha1)
        .count();
    let _ = writeln!(
        out.md,
        "### Prediction, out of sample: the papers' Eq. 1–6 and ipsan's model from the calibration\n\n\
         Every input below comes from `{CALIBRATION}` (SHA-1 `{}`), measured by `ipsan lab \
         calibrate --plan {}` before this plan ran: on {} ({} CPUs), git {}, load average {} at \
         its start and {} at its end, {}–{} (Unix seconds). RTT and SOCKET per link ({} links), \
         ENC/DEC per CPU-second ({} cipher sizes), {:.2} cores available, and the carriers' and \
         IPsec's charons' per-byte + per-flight costs fitted over its own {} cost runs ({} ok; \
         records in `{}`). Nothing measured in this plan's runs (throughput, CPU, the \
         carriers' costs) enters these predictions; the depth is the run's (for `depth = \
         auto`, the one it settled on). The papers' column is 2008 Eq. 3, n/2 × Eq. 4 up to \
         Eq. 6's n, 2006 Eq. 2, n/2 × Eq. 3 (`figures::papers_eq`; seal at a fixed depth, the \
         papers' two-round-trip writes and reads); ipsan's is the generalised model capped by \
         the calibrated cores (`fit::model_here`). Error = measured ÷ predicted − 1; cells: \
         points: median / worst |error| (median signed).{}\n",
        cal.sha1,
        f.plan,
        f.measured_by.hostname,
        f.measured_by.cpus,
        f.measured_by.git_rev,
        f.measured_by.loadavg,
        f.loadavg_end,
        f.started_unix_s,
        f.finished_unix_s,
        f.links.len(),
        f.ciphers.len(),
        f.cores_avail,
        f.cost_runs_ok.1,
        f.cost_runs_ok.0,
        f.cost_runs,
        if others > 0 {
            format!(
                " {others} points were run without this file (another calibration or their \
                 own) and are left out."
            )
        } else {
            String::new()
        }
    );
    if rows.is_empty() {
        let _ = writeln!(out.md, "No point was run with this calibration.\n");
        return;
    }
    let err = |m: f64, v: Option<f64>| {
        v.filter(|v| *v > 0.0 && m > 0.0)
            .map(|v| (m / v - 1.0) * 100.0)
    };
    // (figure, scheme) → (papers' errors, ipsan's errors); "all figures" per scheme too.
    let mut cells: BTreeMap<(String, String), (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut csv = String::from(
        "figure,scheme,cipher,direction,iscsi,block,delay_ms,depth,measured_mb_s,min_mb_s,\
         max_mb_s,papers_eq,papers_eq_mb_s,papers_eq_error_pct,ipsan_mb_s,ipsan_limit,\
         ipsan_error_pct,crypto_workers\n",
    );
    for r in &rows {
        let a = &r.agg;
        let p = &a.rec.point;
        let pe = err(a.median, r.papers.map(|x| x.0));
        let ie = err(a.median, r.ipsan.as_ref().map(|x| x.0));
        let _ = writeln!(
            csv,
            "\"{}\",{},{},{},{:?},{},{},{},{:.3},{:.3},{:.3},{},{},{},{},{},{},{}",
            r.figure,
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
            r.papers.map_or("", |x| x.1),
            r.papers.map_or(String::new(), |x| format!("{:.3}", x.0)),
            pe.map_or(String::new(), |e| format!("{e:.1}")),
            r.ipsan
                .as_ref()
                .map_or(String::new(), |x| format!("{:.3}", x.0)),
            r.ipsan.as_ref().map_or("", |x| x.1.as_str()),
            ie.map_or(String::new(), |e| format!("{e:.1}")),
            p.crypto_workers,
        );
        for fig in [r.figure.clone(), "all figures".to_string()] {
            let c = cells.entry((fig, r.scheme.clone())).or_default();
            c.0.extend(pe);
            c.1.extend(ie);
        }
    }
    let csv_note = if std::fs::write(dir.join("prediction.csv"), &csv).is_ok() {
        " Every point: `prediction.csv`."
    } else {
        ""
    };
    let _ = writeln!(
        out.md,
        "| figure | scheme | papers' Eq. 1–6 | ipsan's model |\n|---|---|---|---|"
    );
    // "all figures" last.
    let mut keys: Vec<&(String, String)> = cells.keys().collect();
    keys.sort_by_key(|(f, s)| (f == "all figures", f.clone(), s.clone()));
    for k in keys {
        let (pe, ie) = &cells[k];
        let _ = writeln!(
            out.md,
            "| {} | {} | {} | {} |",
            k.0,
            k.1,
            err_cell(pe),
            err_cell(ie)
        );
    }
    let _ = writeln!(out.md, "\n{csv_note}\n");
    tunnel_note(&rows, cal, out);
    let mut fig = Figure::new(
        "Prediction from the calibration vs measurement, log–log (out of sample)",
        "predicted MB/s (log)",
        "measured MB/s (log; bars: min–max)",
        Axis::Log10,
        Axis::Log10,
    );
    fig.band = Some(0.25);
    let mut per: BTreeMap<String, Vec<Pt>> = BTreeMap::new();
    for r in &rows {
        let a = &r.agg;
        if a.median.is_nan() || a.median <= 0.0 {
            continue;
        }
        let at = |x: f64| Pt {
            x,
            y: a.median,
            lo: a.min,
            hi: a.max,
        };
        if let Some((v, _)) = r.papers {
            per.entry(format!("papers' Eq.: {}", r.scheme))
                .or_default()
                .push(at(v));
        }
        if let Some((v, _)) = &r.ipsan {
            per.entry(format!("ipsan's model: {}", r.scheme))
                .or_default()
                .push(at(*v));
        }
    }
    for (i, (name, pts)) in per.into_iter().enumerate() {
        fig.series.push(Series {
            name,
            color: i,
            style: Style::Scatter,
            pts,
        });
    }
    if !fig.series.is_empty() {
        emit(dir, "prediction_vs_measured", fig, fonts, out);
    }
}

/// 2008 Fig. 15 / 2006 Tables 4–5: the model on this machine vs measurement, log–log, ±25 %
/// band, colour per scheme; and the error per scheme, beside the papers' own equations'.
pub(super) fn model_fig(
    dir: &Path,
    aggs: &[Agg],
    rates: &Rates,
    calibrated: bool,
    fonts: bool,
    out: &mut Out,
) {
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
         papers_eq_error_pct,crypto_workers\n",
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
            "{},{},{},{:?},{},{},{},{:.3},{:.3},{:.3},{:.3},{},{:.1},{:.3},{:.1},{:.3},{},{},{},{}",
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
            p.crypto_workers,
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
        "### The model fitted on this plan's runs: an explanation, not a prediction (2008 Fig. 15, 2006 Tables 4–5)\n\n{}\
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
         | scheme | points | median abs error | median signed | within 25 % | median abs error, runner's model (own cores) | median latency ÷ time per command | papers' equations, nothing fitted: points, median abs error (signed) |\n|---|---|---|---|---|---|---|---|",
        if calibrated {
            "The prediction is the section above, from the calibration file alone. This \
             section prices the same model with costs fitted over this plan's own runs and the \
             CPU each run got: it explains the measurements, it does not predict them.\n\n"
        } else {
            "This plan ran without a calibration file (`ipsan lab calibrate`, then `ipsan lab \
             run --calibration`), so there is no prediction out of sample; this section prices \
             the model with costs fitted over this plan's own runs and the CPU each run got: \
             it explains the measurements, it does not predict them.\n\n"
        }
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
