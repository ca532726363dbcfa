//! The report's figures: line charts with min–max bars, log axes (block sizes labelled in
//! KB, throughputs in decades), reference lines (the papers' numbers, ideal lines, predicted
//! limits), a ±band around y = x, grouped bar charts, and the legend in its own panel to the
//! right of the data so it never covers a point. SVG and PNG from the same drawing code.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;

/// Tableau 10: distinguishable and colour-blind tolerant.
pub const COLORS: [RGBColor; 10] = [
    RGBColor(31, 119, 180),
    RGBColor(255, 127, 14),
    RGBColor(44, 160, 44),
    RGBColor(214, 39, 40),
    RGBColor(148, 103, 189),
    RGBColor(140, 86, 75),
    RGBColor(227, 119, 194),
    RGBColor(127, 127, 127),
    RGBColor(188, 189, 34),
    RGBColor(23, 190, 207),
];

/// The colour of the papers' numbers on every figure.
pub const PAPER: RGBColor = RGBColor(0, 0, 0);

/// How an axis maps values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Axis {
    /// As is.
    Linear,
    /// Decades.
    Log10,
    /// Bytes on a log2 axis, labelled `16 KB`, `1 MB` (KB = 1024 bytes, as the papers).
    Log2Bytes,
}

impl Axis {
    fn fwd(self, v: f64) -> f64 {
        match self {
            Axis::Linear => v,
            Axis::Log10 => v.log10(),
            Axis::Log2Bytes => (v / 1024.0).log2(),
        }
    }

    fn label(self, t: f64) -> String {
        match self {
            Axis::Linear => num(t),
            Axis::Log10 => num(10f64.powf(t)),
            Axis::Log2Bytes => {
                if (t - t.round()).abs() > 0.01 {
                    return String::new();
                }
                let kib = 2f64.powf(t.round());
                if kib >= 1024.0 {
                    format!("{} MB", num(kib / 1024.0))
                } else {
                    format!("{} KB", num(kib))
                }
            }
        }
    }
}

fn num(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else if a >= 10.0 {
        format!("{v:.1}").trim_end_matches(".0").to_string()
    } else if a >= 1.0 {
        format!("{v:.2}")
            .trim_end_matches('0')
            .trim_end_matches('.')
            .to_string()
    } else {
        format!("{v:.2}")
    }
}

/// How a series is drawn.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Style {
    /// Measured: line through the medians, dots, min–max bars.
    Measured,
    /// Points only (scatter), with min–max bars.
    Scatter,
    /// The papers' numbers: triangles joined by a dashed line (black unless coloured to
    /// match the series they stand beside).
    Paper,
    /// A dashed line through the points (ideal, y = x).
    Dashed,
    /// A dashed horizontal line at the first point's y, across the plot.
    HLine,
    /// A dotted vertical line at the first point's x, across the plot.
    VLine,
}

/// One point: value with optional min–max (NaN when none).
#[derive(Debug, Clone, Copy)]
pub struct Pt {
    /// x, in data units.
    pub x: f64,
    /// y (median).
    pub y: f64,
    /// Smallest repetition.
    pub lo: f64,
    /// Largest repetition.
    pub hi: f64,
}

impl Pt {
    /// A point without a range.
    pub fn at(x: f64, y: f64) -> Pt {
        Pt {
            x,
            y,
            lo: f64::NAN,
            hi: f64::NAN,
        }
    }
}

/// One series.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Index into [`COLORS`] (ignored for [`Style::Paper`]).
    pub color: usize,
    /// Drawing style.
    pub style: Style,
    /// Points.
    pub pts: Vec<Pt>,
}

/// A line chart.
#[derive(Debug, Clone)]
pub struct Figure {
    /// Caption.
    pub title: String,
    /// x label.
    pub x_label: String,
    /// y label.
    pub y_label: String,
    /// x mapping.
    pub x: Axis,
    /// y mapping.
    pub y: Axis,
    /// Series.
    pub series: Vec<Series>,
    /// Shade y within ±this fraction of x (model vs measured).
    pub band: Option<f64>,
    /// y starts at zero (linear y only).
    pub y_from_zero: bool,
    /// Categorical x: the points' x are indices into these names (e.g. delays 0–64 ms,
    /// evenly spaced as in the papers' Fig. 11 and 14).
    pub x_names: Vec<String>,
}

impl Figure {
    /// A figure with no series yet.
    pub fn new(title: &str, x_label: &str, y_label: &str, x: Axis, y: Axis) -> Figure {
        Figure {
            title: title.into(),
            x_label: x_label.into(),
            y_label: y_label.into(),
            x,
            y,
            series: Vec::new(),
            band: None,
            y_from_zero: true,
            x_names: Vec::new(),
        }
    }
}

const W: u32 = 1000;
const H: u32 = 560;
const LEGEND_W: u32 = 290;

/// Draws `fig` as `<stem>.svg` and `<stem>.png` in `dir`.
pub fn draw(dir: &Path, stem: &str, fig: &Figure) -> Result<Vec<PathBuf>, String> {
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    {
        let root = SVGBackend::new(&svg, (W, H)).into_drawing_area();
        draw_on(&root, fig)?;
        root.present().map_err(|e| e.to_string())?;
    }
    {
        let root = BitMapBackend::new(&png, (W, H)).into_drawing_area();
        draw_on(&root, fig)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(vec![svg, png])
}

/// Series colour index meaning "the papers' black".
pub const BLACK_IDX: usize = usize::MAX;

fn color_of(s: &Series) -> RGBColor {
    if s.color == BLACK_IDX {
        PAPER
    } else {
        COLORS[s.color % COLORS.len()]
    }
}

fn draw_on<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, fig: &Figure) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (plot, legend) = root.split_horizontally(W - LEGEND_W);
    // Extents over finite points (after the axis mapping), ranges included.
    let fx = |v: f64| fig.x.fwd(v);
    let fy = |v: f64| fig.y.fwd(v);
    let (mut x0, mut x1, mut y0, mut y1) = (
        f64::INFINITY,
        f64::NEG_INFINITY,
        f64::INFINITY,
        f64::NEG_INFINITY,
    );
    for s in &fig.series {
        for p in &s.pts {
            if s.style != Style::HLine {
                let x = fx(p.x);
                if x.is_finite() {
                    x0 = x0.min(x);
                    x1 = x1.max(x);
                }
            }
            if s.style != Style::VLine {
                for v in [p.y, p.lo, p.hi] {
                    let y = fy(v);
                    if y.is_finite() {
                        y0 = y0.min(y);
                        y1 = y1.max(y);
                    }
                }
            }
        }
    }
    if !x0.is_finite() || !y0.is_finite() {
        return Err("no finite points".into());
    }
    if fig.band.is_some() {
        // y = x must be visible: same range on both axes.
        x0 = x0.min(y0);
        y0 = x0;
        x1 = x1.max(y1);
        y1 = x1;
    }
    if x1 <= x0 {
        x0 -= 0.5;
        x1 += 0.5;
    }
    if fig.y == Axis::Linear && fig.y_from_zero {
        y0 = y0.min(0.0);
    }
    if y1 <= y0 {
        y0 -= 0.5;
        y1 += 0.5;
    }
    let xp = (x1 - x0) * 0.06;
    let yp = (y1 - y0) * 0.08;
    let ylo = if fig.y == Axis::Linear && fig.y_from_zero && y0 >= 0.0 {
        0.0
    } else {
        y0 - yp
    };
    let (ax, ay) = (fig.x, fig.y);
    let names = fig.x_names.clone();
    let xf = move |v: &f64| {
        if names.is_empty() {
            return ax.label(*v);
        }
        let i = v.round();
        if (v - i).abs() < 0.01 && i >= 0.0 {
            names.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let yf = move |v: &f64| ay.label(*v);
    let mut chart = ChartBuilder::on(&plot)
        .caption(&fig.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(62)
        .build_cartesian_2d((x0 - xp)..(x1 + xp), ylo..(y1 + yp))
        .map_err(e)?;
    let xlabels = if !fig.x_names.is_empty() {
        fig.x_names.len() + 1
    } else if fig.x == Axis::Log2Bytes {
        ((x1 - x0).round() as usize + 2).max(2)
    } else {
        10
    };
    chart
        .configure_mesh()
        .x_desc(&fig.x_label)
        .y_desc(&fig.y_label)
        .x_labels(xlabels)
        .y_labels(10)
        .x_label_formatter(&xf)
        .y_label_formatter(&yf)
        .label_style(("sans-serif", 13))
        .light_line_style(RGBColor(246, 246, 246))
        .draw()
        .map_err(e)?;
    let (cx0, cx1) = (x0 - xp, x1 + xp);
    let (cy0, cy1) = (ylo, y1 + yp);
    if let Some(b) = fig.band {
        let (lo, hi) = ((1.0 - b).log10(), (1.0 + b).log10());
        let (lo, hi) = if fig.y == Axis::Log10 {
            (lo, hi)
        } else {
            (0.0, 0.0)
        };
        chart
            .draw_series(std::iter::once(Polygon::new(
                vec![
                    (cx0, cx0 + hi),
                    (cx1, cx1 + hi),
                    (cx1, cx1 + lo),
                    (cx0, cx0 + lo),
                ],
                RGBColor(120, 120, 120).mix(0.15).filled(),
            )))
            .map_err(e)?;
        chart
            .draw_series(LineSeries::new(
                vec![(cx0, cx0), (cx1, cx1)],
                RGBColor(90, 90, 90).stroke_width(1),
            ))
            .map_err(e)?;
    }
    let dx = (cx1 - cx0) * 0.006;
    for s in &fig.series {
        let c = color_of(s);
        let mut pts: Vec<(f64, f64, f64, f64)> = s
            .pts
            .iter()
            .map(|p| (fx(p.x), fy(p.y), fy(p.lo), fy(p.hi)))
            .collect();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let xy: Vec<(f64, f64)> = pts
            .iter()
            .filter(|p| p.0.is_finite() && p.1.is_finite())
            .map(|p| (p.0, p.1))
            .collect();
        match s.style {
            Style::Measured | Style::Scatter => {
                if s.style == Style::Measured && xy.len() > 1 {
                    chart
                        .draw_series(LineSeries::new(xy.clone(), c.stroke_width(2)))
                        .map_err(e)?;
                }
                chart
                    .draw_series(xy.iter().map(|p| Circle::new(*p, 3, c.filled())))
                    .map_err(e)?;
                for p in pts.iter().filter(|p| p.2.is_finite() && p.3.is_finite()) {
                    chart
                        .draw_series([
                            PathElement::new(vec![(p.0, p.2), (p.0, p.3)], c.stroke_width(1)),
                            PathElement::new(
                                vec![(p.0 - dx, p.2), (p.0 + dx, p.2)],
                                c.stroke_width(1),
                            ),
                            PathElement::new(
                                vec![(p.0 - dx, p.3), (p.0 + dx, p.3)],
                                c.stroke_width(1),
                            ),
                        ])
                        .map_err(e)?;
                }
            }
            Style::Paper => {
                if xy.len() > 1 {
                    chart
                        .draw_series(DashedLineSeries::new(xy.clone(), 6, 4, c.stroke_width(1)))
                        .map_err(e)?;
                }
                chart
                    .draw_series(xy.iter().map(|p| TriangleMarker::new(*p, 6, c.filled())))
                    .map_err(e)?;
            }
            Style::Dashed => {
                chart
                    .draw_series(DashedLineSeries::new(xy.clone(), 8, 5, c.stroke_width(2)))
                    .map_err(e)?;
            }
            Style::HLine => {
                if let Some(p) = pts.first().filter(|p| p.1.is_finite()) {
                    chart
                        .draw_series(DashedLineSeries::new(
                            vec![(cx0, p.1), (cx1, p.1)],
                            8,
                            5,
                            c.stroke_width(1),
                        ))
                        .map_err(e)?;
                }
            }
            Style::VLine => {
                if let Some(p) = pts.first().filter(|p| p.0.is_finite()) {
                    chart
                        .draw_series(DashedLineSeries::new(
                            vec![(p.0, cy0), (p.0, cy1)],
                            3,
                            4,
                            c.stroke_width(2),
                        ))
                        .map_err(e)?;
                }
            }
        }
    }
    let mut entries: Vec<(String, RGBColor, Style)> = fig
        .series
        .iter()
        .map(|s| (s.name.clone(), color_of(s), s.style))
        .collect();
    if let Some(b) = fig.band {
        entries.push((
            format!("y = x, ±{:.0} % shaded", b * 100.0),
            RGBColor(90, 90, 90),
            Style::Dashed,
        ));
    }
    draw_legend(&legend, &entries)
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, RGBColor, Style)],
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let rows = entries.len().max(1) as i32;
    let step = ((H as i32 - 60) / rows).clamp(12, 22);
    let font_px = if step < 16 { 10 } else { 12 };
    let mut y = 44;
    for (name, c, st) in entries {
        let c = *c;
        let (x, yy) = (6, y);
        match st {
            Style::Measured => {
                area.draw(&PathElement::new(
                    vec![(x, yy), (x + 26, yy)],
                    c.stroke_width(2),
                ))
                .map_err(e)?;
                area.draw(&Circle::new((x + 13, yy), 3, c.filled()))
                    .map_err(e)?;
            }
            Style::Scatter => {
                area.draw(&Circle::new((x + 13, yy), 3, c.filled()))
                    .map_err(e)?;
            }
            Style::Paper => {
                area.draw(&TriangleMarker::new((x + 13, yy), 6, c.filled()))
                    .map_err(e)?;
            }
            Style::Dashed | Style::HLine | Style::VLine => {
                for k in 0..3 {
                    area.draw(&PathElement::new(
                        vec![(x + k * 10, yy), (x + k * 10 + 6, yy)],
                        c.stroke_width(2),
                    ))
                    .map_err(e)?;
                }
            }
        }
        let mut label = name.clone();
        if label.chars().count() > 44 {
            label = label.chars().take(43).collect::<String>() + "…";
        }
        area.draw(&Text::new(
            label,
            (x + 32, yy - font_px / 2 - 1),
            ("sans-serif", font_px).into_font(),
        ))
        .map_err(e)?;
        y += step;
    }
    Ok(())
}

/// One bar: (median, min, max); NaN median draws no bar.
pub type Bar = (f64, f64, f64);

/// Grouped bars: one group per condition, one bar per series, min–max whiskers, and the
/// papers' numbers as black triangles over their group.
#[derive(Debug, Clone)]
pub struct Bars {
    /// Caption.
    pub title: String,
    /// y label.
    pub y_label: String,
    /// Group names (x axis).
    pub groups: Vec<String>,
    /// Series: name and per-group bars.
    pub series: Vec<(String, Vec<Bar>)>,
    /// The papers' numbers: (group, value) and the legend text.
    pub paper: Option<(String, Vec<(usize, f64)>)>,
}

/// Draws `bars` as `<stem>.svg` and `<stem>.png` in `dir`.
pub fn draw_bars(dir: &Path, stem: &str, bars: &Bars) -> Result<Vec<PathBuf>, String> {
    let svg = dir.join(format!("{stem}.svg"));
    let png = dir.join(format!("{stem}.png"));
    {
        let root = SVGBackend::new(&svg, (W, H)).into_drawing_area();
        bars_on(&root, bars)?;
        root.present().map_err(|e| e.to_string())?;
    }
    {
        let root = BitMapBackend::new(&png, (W, H)).into_drawing_area();
        bars_on(&root, bars)?;
        root.present().map_err(|e| e.to_string())?;
    }
    Ok(vec![svg, png])
}

fn bars_on<DB: DrawingBackend>(root: &DrawingArea<DB, Shift>, b: &Bars) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    root.fill(&WHITE).map_err(e)?;
    let (plot, legend) = root.split_horizontally(W - LEGEND_W);
    let mut ymax = 0.0f64;
    for (_, v) in &b.series {
        for (m, _, hi) in v {
            for x in [*m, *hi] {
                if x.is_finite() {
                    ymax = ymax.max(x);
                }
            }
        }
    }
    if let Some((_, p)) = &b.paper {
        for (_, v) in p {
            ymax = ymax.max(*v);
        }
    }
    if ymax <= 0.0 {
        return Err("no bars".into());
    }
    let n = b.groups.len();
    let groups = b.groups.clone();
    let xf = move |v: &f64| {
        let i = v.round();
        if (v - i).abs() < 0.01 && i >= 0.0 {
            groups.get(i as usize).cloned().unwrap_or_default()
        } else {
            String::new()
        }
    };
    let mut chart = ChartBuilder::on(&plot)
        .caption(&b.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(62)
        .build_cartesian_2d(-0.5..(n as f64 - 0.5), 0.0..ymax * 1.12)
        .map_err(e)?;
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(n.max(2) * 2 + 1)
        .x_label_formatter(&xf)
        .y_desc(&b.y_label)
        .label_style(("sans-serif", 12))
        .light_line_style(RGBColor(246, 246, 246))
        .draw()
        .map_err(e)?;
    let k = b.series.len().max(1) as f64;
    let w = 0.8 / k;
    for (si, (_, v)) in b.series.iter().enumerate() {
        let c = COLORS[si % COLORS.len()];
        for (g, (m, lo, hi)) in v.iter().enumerate() {
            if !m.is_finite() {
                continue;
            }
            let xl = g as f64 - 0.4 + si as f64 * w;
            chart
                .draw_series(std::iter::once(Rectangle::new(
                    [(xl + w * 0.08, 0.0), (xl + w * 0.92, *m)],
                    c.filled(),
                )))
                .map_err(e)?;
            if lo.is_finite() && hi.is_finite() {
                let xm = xl + w / 2.0;
                chart
                    .draw_series([
                        PathElement::new(vec![(xm, *lo), (xm, *hi)], BLACK.stroke_width(1)),
                        PathElement::new(
                            vec![(xm - w * 0.2, *lo), (xm + w * 0.2, *lo)],
                            BLACK.stroke_width(1),
                        ),
                        PathElement::new(
                            vec![(xm - w * 0.2, *hi), (xm + w * 0.2, *hi)],
                            BLACK.stroke_width(1),
                        ),
                    ])
                    .map_err(e)?;
            }
        }
    }
    let mut entries: Vec<(String, RGBColor, Style)> = b
        .series
        .iter()
        .enumerate()
        .map(|(i, (n, _))| (n.clone(), COLORS[i % COLORS.len()], Style::Measured))
        .collect();
    if let Some((name, p)) = &b.paper {
        for (g, v) in p {
            let x = *g as f64;
            chart
                .draw_series(DashedLineSeries::new(
                    vec![(x - 0.45, *v), (x + 0.45, *v)],
                    5,
                    3,
                    PAPER.stroke_width(2),
                ))
                .map_err(e)?;
        }
        entries.push((name.clone(), PAPER, Style::Dashed));
    }
    draw_legend(&legend, &entries)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_block_sizes_in_kb_and_mb_and_decades() {
        assert_eq!(Axis::Log2Bytes.label(Axis::Log2Bytes.fwd(16384.0)), "16 KB");
        assert_eq!(
            Axis::Log2Bytes.label(Axis::Log2Bytes.fwd(2097152.0)),
            "2 MB"
        );
        assert_eq!(Axis::Log2Bytes.label(4.5), "");
        assert_eq!(Axis::Log10.label(1.0), "10.0".trim_end_matches(".0"));
        assert_eq!(Axis::Log10.label(-1.0), "0.10");
    }
}
