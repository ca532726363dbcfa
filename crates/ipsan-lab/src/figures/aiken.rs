//! Aiken et al. (003): network vs diskless vs file LUN over delay, and the pathologies figure.

use super::*;

/// Aiken et al.: the network alone vs iSCSI to a null and a file LUN, over delay.
pub(super) fn aiken(dir: &Path, aggs: &[Agg], fonts: bool, out: &mut Out) {
    if !aggs.iter().any(|a| a.rec.point.scheme == Scheme::Iperf3) {
        return;
    }
    let mut per: BTreeMap<String, Vec<Pt>> = BTreeMap::new();
    for a in aggs
        .iter()
        .filter(|a| matches!(a.rec.point.scheme, Scheme::Iperf3 | Scheme::Plain))
    {
        // One series per meaning: a read and a write, or two offered loads (002 Fig. 9), at
        // one delay are different points, never one line.
        let load = if a.rec.point.load > 0.0 {
            format!(", offered {:.0} %", a.rec.point.load * 100.0)
        } else {
            String::new()
        };
        let name = if a.rec.point.scheme == Scheme::Iperf3 {
            format!("network alone (iperf3, one TCP stream){load}")
        } else {
            format!(
                "iSCSI {} {} LUN, {} @{}{load}",
                a.rec.point.direction.name(),
                match a.rec.point.backend {
                    Backend::Null => "diskless (null)",
                    Backend::File => "file",
                    Backend::Mem => "RAM",
                    Backend::Disk => "disk-model",
                },
                fmt_size(a.rec.point.block),
                a.rec.depth_used
            )
        };
        per.entry(name)
            .or_default()
            .push(pt(a.rec.point.delay_ms, a));
    }
    let offered = aggs.iter().any(|a| a.rec.point.load > 0.0);
    let mut fig = Figure::new(
        if offered {
            "Throughput per offered load over delay (Muknahallipatna et al. Fig. 9)"
        } else {
            "Network vs diskless vs file-backed iSCSI over delay (Aiken et al. Fig. 10–13)"
        },
        "one-way delay, ms",
        "MB/s (median, min–max bars)",
        Axis::Linear,
        Axis::Linear,
    );
    let _ = writeln!(
        out.md,
        "### {}\n\n| series | {} |\n|---|{}",
        fig.title,
        per.values()
            .next()
            .map(|v| {
                let mut d: Vec<f64> = v.iter().map(|p| p.x).collect();
                d.sort_by(f64::total_cmp);
                d.iter()
                    .map(|x| format!("{x} ms"))
                    .collect::<Vec<_>>()
                    .join(" | ")
            })
            .unwrap_or_default(),
        per.values()
            .next()
            .map(|v| "---|".repeat(v.len()))
            .unwrap_or_default()
    );
    for (i, (k, mut pts)) in per.into_iter().enumerate() {
        pts.sort_by(|a, b| a.x.total_cmp(&b.x));
        let cells: Vec<String> = pts.iter().map(|p| format!("{:.1}", p.y)).collect();
        let _ = writeln!(out.md, "| {k} | {} |", cells.join(" | "));
        fig.series.push(Series {
            name: k,
            color: i,
            style: Style::Measured,
            pts,
        });
    }
    let _ = writeln!(
        out.md,
        "{}",
        if offered {
            "\nMuknahallipatna et al. (002) Fig. 9: throughput follows the offered load up to \
             80 ms RTT, then stays at window ÷ RTT (their Table 1). The delay here is one way.\n"
        } else {
            "\nAiken et al. give this experiment as figures only (no numbers in the text): iSCSI \
             to the diskless target fell quickly with delay while the network held up, which \
             they put down to iSCSI's synchronous command cycle wasting the bandwidth-delay \
             product.\n"
        }
    );
    emit(dir, "aiken_vs_delay", fig, fonts, out);
}

/// Paxson's pathologies as grouped bars, with Aiken et al.'s network number.
pub(super) fn pathologies(dir: &Path, aggs: &[Agg], fonts: bool, out: &mut Out) {
    let imp: Vec<&Agg> = aggs
        .iter()
        .filter(|a| a.rec.point.rate_mbit > 0.0)
        .collect();
    if imp.is_empty() {
        return;
    }
    let cond = |a: &Agg| {
        let p = &a.rec.point;
        match (p.loss > 0.0, p.reorder > 0.0, p.corrupt > 0.0) {
            (false, false, false) => "clean".to_string(),
            (true, false, false) => format!("loss {}%", p.loss * 100.0),
            (false, true, false) => format!("reorder {}%", p.reorder * 100.0),
            (false, false, true) => format!("corrupt {}%", p.corrupt * 100.0),
            _ => "all three".to_string(),
        }
    };
    let mut groups: Vec<String> = Vec::new();
    for a in &imp {
        let c = cond(a);
        if !groups.contains(&c) {
            groups.push(c);
        }
    }
    let order = ["clean", "loss", "reorder", "corrupt", "all"];
    groups.sort_by_key(|g| order.iter().position(|o| g.starts_with(o)).unwrap_or(9));
    let mut names: Vec<String> = Vec::new();
    for a in &imp {
        let n = paper_name(a);
        if !names.contains(&n) {
            names.push(n);
        }
    }
    names.sort_by_key(|n| (!n.starts_with("iperf3"), n.clone()));
    let mut series = Vec::new();
    let mut md = format!(
        "### Paxson's pathologies, {} Mbit/s, {} ms one way (Aiken et al. §5)\n\n| series | {} |\n|---|{}\n",
        imp[0].rec.point.rate_mbit,
        imp[0].rec.point.delay_ms,
        groups.join(" | "),
        "---|".repeat(groups.len())
    );
    for n in &names {
        let mut v = Vec::new();
        let mut row = format!("| {n} |");
        for g in &groups {
            let a = imp.iter().find(|a| paper_name(a) == *n && cond(a) == *g);
            v.push(a.map_or((f64::NAN, f64::NAN, f64::NAN), |a| (a.median, a.min, a.max)));
            let _ = write!(
                row,
                " {} |",
                a.map_or("–".into(), |a| format!("{:.2}", a.median))
            );
        }
        md.push_str(&row);
        md.push('\n');
        series.push((n.replace("iperf3 @1", "network alone (iperf3)"), v));
    }
    let _ = writeln!(
        md,
        "\nAiken et al. Table 1: netperf over their 100 Mbit/s link with all three pathologies \
         gave 3.17–4.53 MB/s (mean {AIKEN_TABLE1_MEAN}) at a delay they do not state, so the \
         figure draws no line of theirs beside ours; they expected iSCSI to do at least 2× \
         worse than the network and did not measure it.\n"
    );
    out.md.push_str(&md);
    let bars = Bars {
        title: format!(
            "Pathologies at {} Mbit/s, {} ms one way (Aiken et al. §5)",
            imp[0].rec.point.rate_mbit, imp[0].rec.point.delay_ms
        ),
        y_label: "MB/s (median, min–max)".into(),
        groups,
        series,
        // Their Table 1 states no delay: a line of theirs over our one delay's bars would
        // compare a number with a regime it was not measured in.
        paper: None,
    };
    out.bars.push(("pathologies".into(), bars.clone()));
    if fonts {
        match plot::draw_bars(dir, "pathologies", &bars) {
            Ok(f) => {
                out.plots.extend(f);
                let _ = writeln!(out.md, "![{}](pathologies.png)\n", bars.title);
            }
            Err(e) => {
                let _ = writeln!(out.md, "(pathologies not drawn: {e})\n");
            }
        }
    }
}
