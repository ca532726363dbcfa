//! The per-command timeline (issue 6): one row per command, coloured segments per phase —
//! queued, sealed, waiting for the R2T, transferring until the status, opened — drawn from
//! `ipsan bench --trace` files, like the papers' packet visualisations (Kamisaka et al. 2006
//! (004), Fig. 5–6), so the overlap of pre-processing with the round trips shows at a glance.
//!
//! The runner leaves `timeline/<scheme>.jsonl` (schema `ipsan-trace/1`, docs/bench.md) and
//! `timeline/runs.json`; [`draw`] stacks one panel per trace on a common time axis.

use std::path::{Path, PathBuf};

use ipsan_bench::trace::{self, CommandTrace, Kind, TraceFile};
use plotters::prelude::*;

/// One trace to draw.
#[derive(Debug, Clone)]
pub struct Panel {
    /// Panel title.
    pub title: String,
    /// The commands, in issue order.
    pub commands: Vec<CommandTrace>,
}

/// Phases drawn, with their colours and legend names.
const PHASES: [(&str, RGBColor); 6] = [
    ("queued (window, workers)", RGBColor(200, 200, 200)),
    ("sealing", RGBColor(230, 126, 34)),
    ("command sent → R2T (round trip)", RGBColor(133, 193, 233)),
    ("data sent → status", RGBColor(40, 116, 166)),
    ("Data-In", RGBColor(22, 160, 133)),
    ("opening", RGBColor(142, 68, 173)),
];

/// A command's segments: (start µs, end µs, phase index).
pub fn segments(c: &CommandTrace) -> Vec<(f64, f64, usize)> {
    let mut out = Vec::new();
    let mut push = |a: Option<f64>, b: Option<f64>, k: usize| {
        if let (Some(a), Some(b)) = (a, b) {
            if b >= a {
                out.push((a, b, k));
            }
        }
    };
    let issued = c.at(Kind::Issued);
    let sent = c.at(Kind::CmdSent);
    let seal0 = c.at(Kind::SealStart);
    let seal1 = c.at(Kind::SealEnd);
    let r2t = c.at(Kind::R2t);
    let status = c.at(Kind::Status);
    let din0 = c.at(Kind::DataInFirst);
    let din1 = c.last(Kind::DataInLast);
    let end = c.last(Kind::Completed).or(c.last(Kind::Failed));
    push(issued, seal0.or(sent), 0);
    push(seal0, seal1, 1);
    push(seal1, sent, 0);
    match (r2t, din0) {
        (Some(r), _) => {
            push(sent, Some(r), 2);
            push(Some(r), status, 3);
        }
        (None, Some(d0)) => {
            push(sent, Some(d0), 2);
            push(Some(d0), din1.or(status), 4);
        }
        (None, None) => push(sent, status, 3),
    }
    let open0 = c.at(Kind::OpenStart);
    push(open0, c.at(Kind::OpenEnd), 5);
    let _ = end;
    out
}

/// Load the traces in `dir/timeline/`, titled from `runs.json` when present (the scheme,
/// depth and measured throughput), seal-seq first.
pub fn load(dir: &Path) -> Result<Vec<Panel>, String> {
    let tdir = dir.join("timeline");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&tdir)
        .map_err(|e| format!("{}: {e}", tdir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    let order = |p: &PathBuf| {
        let s = p.file_stem().map(|s| s.to_string_lossy().into_owned());
        match s.as_deref() {
            Some("plain") => 0,
            Some("seal-seq") => 1,
            Some("seal") => 2,
            _ => 3,
        }
    };
    files.sort_by_key(|p| (order(p), p.clone()));
    // The runs' records say the link (one-way delay) the traces ran over.
    let delays: Vec<(String, f64)> = std::fs::read_to_string(tdir.join("runs.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<Vec<crate::results::Record>>(&t).ok())
        .unwrap_or_default()
        .iter()
        .map(|r| (r.point.scheme.to_string(), r.point.delay_ms))
        .collect();
    let mut panels = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).map_err(|e| format!("{}: {e}", f.display()))?;
        let t = trace::parse(&text).map_err(|e| format!("{}: {e}", f.display()))?;
        let mut p = panel(&f, &t)?;
        let stem = f.file_stem().map(|s| s.to_string_lossy().into_owned());
        if let Some((_, d)) = delays.iter().find(|(s, _)| Some(s) == stem.as_ref()) {
            p.title = p.title.replacen(": ", &format!(" at {d} ms one-way: "), 1);
        }
        panels.push(p);
    }
    if panels.is_empty() {
        return Err(format!("no traces in {}", tdir.display()));
    }
    Ok(panels)
}

fn panel(f: &Path, t: &TraceFile) -> Result<Panel, String> {
    let commands = trace::commands(&t.lines);
    trace::check(&commands).map_err(|e| format!("{}: {e}", f.display()))?;
    let h = &t.header;
    let scheme = f
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    let num = |k: &str| h.get(k).and_then(serde_json::Value::as_f64);
    let yes = |k: &str| h.get(k).and_then(serde_json::Value::as_bool);
    let title = format!(
        "{scheme}: {} {}, depth {}, {} KiB writes, {}{} — {:.1} MB/s over the run",
        h.get("seal").and_then(|s| s.as_str()).unwrap_or("no seal"),
        if yes("pipeline") == Some(false) {
            "inline (pipeline off)"
        } else {
            "on crypto workers"
        },
        num("depth").unwrap_or(f64::NAN),
        num("block_size").unwrap_or(0.0) / 1024.0,
        if yes("initial_r2t") == Some(true) {
            "InitialR2T=Yes"
        } else {
            "InitialR2T=No"
        },
        if yes("immediate_data") == Some(false) {
            " ImmediateData=No"
        } else {
            ""
        },
        num("throughput_mb_s").unwrap_or(f64::NAN)
    );
    Ok(Panel { title, commands })
}

/// The common window: from the issue of command `skip` in each panel (past TCP's start-up),
/// `span_ms` long, at most `max_rows` commands per panel.
fn window(p: &Panel, skip: usize, span_us: f64, max_rows: usize) -> (f64, Vec<&CommandTrace>) {
    let t0 = p
        .commands
        .get(skip.min(p.commands.len().saturating_sub(1)))
        .and_then(|c| c.at(Kind::Issued))
        .unwrap_or(0.0);
    let rows = p
        .commands
        .iter()
        .filter(|c| {
            let s = c.at(Kind::Issued).unwrap_or(f64::NAN);
            s >= t0 && s < t0 + span_us
        })
        .take(max_rows)
        .collect();
    (t0, rows)
}

/// Draw `panels` stacked, on one time axis, into `dir/<stem>.svg` and `.png`.
pub fn draw(dir: &Path, stem: &str, panels: &[Panel]) -> Result<Vec<PathBuf>, String> {
    // Span: long enough for a handful of the slowest panel's commands.
    let cycle = |p: &Panel| {
        let lat: Vec<f64> = p
            .commands
            .iter()
            .filter_map(|c| Some(c.last(Kind::Completed)? - c.at(Kind::Issued)?))
            .collect();
        lat.iter().sum::<f64>() / lat.len().max(1) as f64
    };
    let slowest = panels.iter().map(cycle).fold(0.0, f64::max);
    let span_us = (slowest * 6.0).clamp(2_000.0, 2_000_000.0);
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    let h = 150 + 330 * panels.len() as u32;
    {
        let root = SVGBackend::new(&svg, (1100, h)).into_drawing_area();
        draw_on(&root, panels, span_us)?;
        root.present().map_err(|e| e.to_string())?;
    }
    {
        let root = BitMapBackend::new(&png, (1100, h)).into_drawing_area();
        draw_on(&root, panels, span_us)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(vec![svg, png])
}

fn draw_on<DB: DrawingBackend>(
    root: &DrawingArea<DB, plotters::coord::Shift>,
    panels: &[Panel],
    span_us: f64,
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (top, rest) = root.split_vertically(40);
    top.draw(&Text::new(
        "Per-command timeline (one row per command, time since the window start)",
        (12, 10),
        ("sans-serif", 18).into_font(),
    ))
    .map_err(e)?;
    let (body, legend) = rest.split_vertically(rest.dim_in_pixel().1 - 70);
    let areas = body.split_evenly((panels.len(), 1));
    for (p, area) in panels.iter().zip(areas.iter()) {
        let (t0, rows) = window(p, 4, span_us, 48);
        let n = rows.len().max(1);
        let mut chart = ChartBuilder::on(area)
            .caption(&p.title, ("sans-serif", 14))
            .margin(8)
            .x_label_area_size(32)
            .y_label_area_size(50)
            .build_cartesian_2d(0.0..span_us / 1e3, -0.5..(n as f64 - 0.5))
            .map_err(e)?;
        chart
            .configure_mesh()
            .x_desc("ms")
            .y_desc("command")
            .y_label_formatter(&|y| format!("{}", n as i64 - 1 - y.round() as i64))
            .label_style(("sans-serif", 12))
            .light_line_style(WHITE.mix(0.0))
            .draw()
            .map_err(e)?;
        for (i, c) in rows.iter().enumerate() {
            let y = (n - 1 - i) as f64;
            for (a, b, k) in segments(c) {
                let a = ((a - t0) / 1e3).max(0.0);
                let b = ((b - t0) / 1e3).min(span_us / 1e3);
                if b <= a && b < span_us / 1e3 && a > 0.0 {
                    // Zero-length phases (e.g. a status on the last Data-In) are not drawn.
                    continue;
                }
                let b = if b <= a { a + span_us / 1e3 * 0.002 } else { b };
                if a >= span_us / 1e3 {
                    continue;
                }
                chart
                    .draw_series(std::iter::once(Rectangle::new(
                        [(a, y - 0.38), (b, y + 0.38)],
                        PHASES[k].1.filled(),
                    )))
                    .map_err(e)?;
            }
            if let Some(done) = c.last(Kind::Completed) {
                let x = (done - t0) / 1e3;
                if x <= span_us / 1e3 {
                    chart
                        .draw_series(std::iter::once(PathElement::new(
                            vec![(x, y - 0.45), (x, y + 0.45)],
                            BLACK.stroke_width(1),
                        )))
                        .map_err(e)?;
                }
            }
        }
    }
    // Legend.
    let mut x = 12;
    for (name, color) in PHASES {
        legend
            .draw(&Rectangle::new([(x, 20), (x + 18, 34)], color.filled()))
            .map_err(e)?;
        legend
            .draw(&Text::new(
                name,
                (x + 24, 20),
                ("sans-serif", 13).into_font(),
            ))
            .map_err(e)?;
        x += 30 + 7 * name.len() as i32;
    }
    legend
        .draw(&PathElement::new(
            vec![(x, 18), (x, 36)],
            BLACK.stroke_width(1),
        ))
        .map_err(e)?;
    legend
        .draw(&Text::new(
            "completed",
            (x + 8, 20),
            ("sans-serif", 13).into_font(),
        ))
        .map_err(e)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use ipsan_bench::trace::Trace;

    /// A small synthetic trace through the real recorder and file format: a sequential
    /// (seal, send, R2T, data, status) cycle and a pipelined one with overlapping seals.
    fn write_trace(path: &Path, pipelined: bool) {
        let t = Trace::new(100);
        let cmds: u32 = 12;
        for i in 0..cmds {
            let itt = i + 1;
            t.record(itt, Kind::Issued, 0, 0);
            t.record(itt, Kind::SealStart, 0, 65536);
            std::thread::sleep(std::time::Duration::from_micros(300));
            t.record(itt, Kind::SealEnd, 0, 65560);
            t.record(itt, Kind::CmdSent, 0, 0);
            if pipelined && i % 4 != 3 {
                continue;
            }
            let first = if pipelined { itt - 3 } else { itt };
            for j in first..=itt {
                std::thread::sleep(std::time::Duration::from_micros(200));
                t.record(j, Kind::R2t, 0, 65560);
                t.record(j, Kind::DataOut, 0, 65560);
            }
            for j in first..=itt {
                std::thread::sleep(std::time::Duration::from_micros(200));
                t.record(j, Kind::Status, 0, 0);
                t.record(j, Kind::Completed, 0, 0);
            }
        }
        let mut h = serde_json::Map::new();
        h.insert("seal".into(), "3des-cbc-hmac-sha1".into());
        h.insert("pipeline".into(), pipelined.into());
        h.insert("depth".into(), if pipelined { 4 } else { 1 }.into());
        h.insert("block_size".into(), 65536.into());
        h.insert("initial_r2t".into(), true.into());
        h.insert("immediate_data".into(), false.into());
        h.insert("throughput_mb_s".into(), 1.5.into());
        let f = std::fs::File::create(path).unwrap();
        t.write_jsonl(f, h).unwrap();
    }

    #[test]
    fn draws_a_small_trace_as_svg_and_png() {
        let dir = tempfile::tempdir().unwrap();
        let tdir = dir.path().join("timeline");
        std::fs::create_dir_all(&tdir).unwrap();
        write_trace(&tdir.join("seal.jsonl"), true);
        write_trace(&tdir.join("seal-seq.jsonl"), false);
        let panels = load(dir.path()).unwrap();
        assert_eq!(panels.len(), 2);
        assert!(
            panels[0].title.starts_with("seal-seq:"),
            "{}",
            panels[0].title
        );
        assert!(panels[1].title.contains("depth 4"), "{}", panels[1].title);
        assert_eq!(panels[0].commands.len(), 12);
        // Every command of the sequential trace has a sealing and an R2T phase.
        for c in &panels[0].commands {
            let kinds: Vec<usize> = segments(c).iter().map(|s| s.2).collect();
            assert!(
                kinds.contains(&1) && kinds.contains(&2) && kinds.contains(&3),
                "{kinds:?}"
            );
        }
        if crate::report::font_ready().is_err() {
            return;
        }
        let files = draw(dir.path(), "timeline", &panels).unwrap();
        for f in &files {
            assert!(
                std::fs::metadata(f).unwrap().len() > 1000,
                "{}",
                f.display()
            );
        }
        let svg = std::fs::read_to_string(&files[0]).unwrap();
        assert!(svg.contains("<rect"), "segments are drawn");
        assert!(svg.contains("seal-seq"), "panel titles");
    }

    #[test]
    fn rejects_a_directory_without_traces_and_a_broken_trace() {
        let dir = tempfile::tempdir().unwrap();
        assert!(load(dir.path()).is_err());
        let tdir = dir.path().join("timeline");
        std::fs::create_dir_all(&tdir).unwrap();
        std::fs::write(
            tdir.join("seal.jsonl"),
            "{\"schema\":\"ipsan-trace/1\"}\n{\"t_us\":1.0,\"cmd\":0,\"itt\":1,\"event\":\"issued\",\"offset\":0,\"len\":0}\n",
        )
        .unwrap();
        let e = load(dir.path()).unwrap_err();
        assert!(e.contains("does not end"), "{e}");
    }
}
