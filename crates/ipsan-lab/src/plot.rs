//! The report's figures: line charts with min–max bars, log axes (block sizes labelled in
//! KB, throughputs in decades, delays in ms on a log(1 + ms) axis with a labelled tick at each
//! delay), reference lines (ideal lines, predicted limits), the papers' numbers as markers at
//! the x they were measured at (never joined, so no line claims a value the paper did not
//! give), a ±band around y = x, grouped bar charts, and the legend in its own panel to the
//! right of the data so it never covers a point, its labels wrapped to the panel's width.
//! SVG and PNG from the same drawing code.

use std::path::{Path, PathBuf};

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

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
    /// A one-way delay in ms on a log2(1 + ms) axis: 0 ms is drawn, 1–64 ms spread as the
    /// papers' delays double. Ticks only at [`Figure::x_ticks`], labelled with the delay.
    DelayMs,
}

impl Axis {
    fn fwd(self, v: f64) -> f64 {
        match self {
            Axis::Linear => v,
            Axis::Log10 => v.log10(),
            Axis::Log2Bytes => (v / 1024.0).log2(),
            Axis::DelayMs => (1.0 + v).log2(),
        }
    }

    fn label(self, t: f64) -> String {
        match self {
            Axis::Linear => num(t),
            Axis::DelayMs => format!("{} ms", num(2f64.powf(t) - 1.0)),
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
    /// The papers' numbers: triangles at the points the paper gives, never joined (black
    /// unless coloured to match the series they stand beside).
    Paper,
    /// A bound the paper states ("below 1×", "at most 20 %"): a downward triangle at the
    /// bound with a short arrow under it.
    PaperBelow,
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
    /// Where x has labelled ticks, in data units ([`Axis::DelayMs`]: the delays run and
    /// the papers' delays); empty: the axis's own ticks.
    pub x_ticks: Vec<f64>,
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
            x_ticks: Vec::new(),
        }
    }
}

const W: u32 = 1060;
const H: u32 = 560;
const LEGEND_W: u32 = 340;
/// Where legend text starts in its panel (after the marker).
const LEGEND_TEXT_X: i32 = 38;

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
    // Ticks the figure names (delays): included in the x range, drawn by hand below.
    let ticks: Vec<(f64, f64)> = fig
        .x_ticks
        .iter()
        .map(|v| (fx(*v), *v))
        .filter(|t| t.0.is_finite())
        .collect();
    for (t, _) in &ticks {
        x0 = x0.min(*t);
        x1 = x1.max(*t);
    }
    let xp = if ticks.is_empty() {
        xp
    } else {
        (x1 - x0) * 0.06
    };
    let (ax, ay) = (fig.x, fig.y);
    let xf = move |v: &f64| ax.label(*v);
    let yf = move |v: &f64| ay.label(*v);
    let mut chart = ChartBuilder::on(&plot)
        .caption(&fig.title, ("sans-serif", 17))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(62)
        .build_cartesian_2d((x0 - xp)..(x1 + xp), ylo..(y1 + yp))
        .map_err(e)?;
    let xlabels = if !ticks.is_empty() {
        0
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
    // The named ticks: a light grid line and the value under the axis.
    let tick_style = ("sans-serif", 13)
        .into_text_style(&plot)
        .pos(Pos::new(HPos::Center, VPos::Top));
    for (t, v) in &ticks {
        chart
            .draw_series(std::iter::once(PathElement::new(
                vec![(*t, cy0), (*t, cy1)],
                RGBColor(232, 232, 232).stroke_width(1),
            )))
            .map_err(e)?;
        let (px, py) = chart.backend_coord(&(*t, cy0));
        plot.draw(&PathElement::new(
            vec![(px, py), (px, py + 5)],
            BLACK.stroke_width(1),
        ))
        .map_err(e)?;
        plot.draw(&Text::new(num(*v), (px, py + 8), tick_style.clone()))
            .map_err(e)?;
    }
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
                chart
                    .draw_series(xy.iter().map(|p| TriangleMarker::new(*p, 7, c.filled())))
                    .map_err(e)?;
            }
            Style::PaperBelow => {
                for p in &xy {
                    let (px, py) = chart.backend_coord(p);
                    plot.draw(&Polygon::new(
                        vec![(px - 7, py - 6), (px + 7, py - 6), (px, py + 6)],
                        c.filled(),
                    ))
                    .map_err(e)?;
                    plot.draw(&PathElement::new(
                        vec![(px, py + 6), (px, py + 22)],
                        c.stroke_width(2),
                    ))
                    .map_err(e)?;
                    plot.draw(&PathElement::new(
                        vec![(px - 4, py + 17), (px, py + 22), (px + 4, py + 17)],
                        c.stroke_width(2),
                    ))
                    .map_err(e)?;
                }
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

/// A legend laid out in its panel: the font size, and per line the entry it belongs to, its
/// text and its y. Labels wrap at spaces to the panel's text width (`measure` gives a text's
/// width in pixels at a font size), so no label is cut off; the font shrinks from 12 to 9 px
/// until every line fits the panel's height.
pub(crate) fn layout_legend(
    names: &[String],
    measure: &dyn Fn(&str, u32) -> u32,
) -> (u32, Vec<(usize, String, i32)>) {
    let max_w = LEGEND_W.saturating_sub(LEGEND_TEXT_X as u32 + 8);
    let mut out = Vec::new();
    for font_px in [12u32, 11, 10, 9] {
        out.clear();
        let line_h = font_px as i32 + 3;
        let mut y = 44;
        for (i, name) in names.iter().enumerate() {
            for line in wrap(name, max_w, &|t: &str| measure(t, font_px)) {
                out.push((i, line, y));
                y += line_h;
            }
            y += font_px as i32 / 2 + 2;
        }
        if y <= H as i32 - 8 {
            return (font_px, out);
        }
    }
    (9, out)
}

/// `label` in lines no wider than `max_px` (a single word wider than that stands alone).
pub(crate) fn wrap(label: &str, max_px: u32, measure: &dyn Fn(&str) -> u32) -> Vec<String> {
    let mut lines: Vec<String> = Vec::new();
    let mut cur = String::new();
    for word in label.split(' ') {
        let cand = if cur.is_empty() {
            word.to_string()
        } else {
            format!("{cur} {word}")
        };
        if cur.is_empty() || measure(&cand) <= max_px {
            cur = cand;
        } else {
            lines.push(std::mem::take(&mut cur));
            cur = word.to_string();
        }
    }
    if !cur.is_empty() || lines.is_empty() {
        lines.push(cur);
    }
    lines
}

fn draw_legend<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    entries: &[(String, RGBColor, Style)],
) -> Result<(), String> {
    let e = |e: DrawingAreaErrorKind<DB::ErrorType>| e.to_string();
    let names: Vec<String> = entries.iter().map(|x| x.0.clone()).collect();
    let measure = |t: &str, px: u32| {
        area.estimate_text_size(t, &("sans-serif", px).into_text_style(area))
            .map_or(t.chars().count() as u32 * px * 6 / 10, |(w, _)| w)
    };
    let (font_px, lines) = layout_legend(&names, &measure);
    let mut marked = usize::MAX;
    for (i, line, yy) in lines {
        let (_, c, st) = &entries[i];
        let c = *c;
        let x = 6;
        if marked != i {
            marked = i;
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
                Style::PaperBelow => {
                    area.draw(&Polygon::new(
                        vec![(x + 7, yy - 5), (x + 19, yy - 5), (x + 13, yy + 5)],
                        c.filled(),
                    ))
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
        }
        area.draw(&Text::new(
            line,
            (LEGEND_TEXT_X, yy - font_px as i32 / 2 - 1),
            ("sans-serif", font_px).into_font(),
        ))
        .map_err(e)?;
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
        assert_eq!(Axis::DelayMs.label(Axis::DelayMs.fwd(8.0)), "8 ms");
        assert_eq!(Axis::DelayMs.label(Axis::DelayMs.fwd(0.0)), "0 ms");
    }

    /// A label longer than the legend panel is wrapped onto more lines, never cut off: every
    /// line fits the panel's text width, every word survives, and every line is inside the
    /// image's height even with many entries.
    #[test]
    fn legend_labels_wrap_inside_the_panel() {
        let measure = |t: &str, px: u32| t.chars().count() as u32 * px * 6 / 10;
        let long = "seal OP-10 3DES (bars: min–max over repetitions of the mean over blocks)";
        let mut names = vec![long.to_string()];
        names.extend((0..19).map(|i| format!("series number {i} with a fairly long name")));
        let (px, lines) = layout_legend(&names, &measure);
        let max_w = LEGEND_W - LEGEND_TEXT_X as u32 - 8;
        for (_, l, y) in &lines {
            assert!(measure(l, px) <= max_w, "{l:?} is wider than the panel");
            assert!(
                *y > 0 && *y < H as i32,
                "{l:?} at y {y} is outside the image"
            );
        }
        let first: Vec<&str> = lines
            .iter()
            .filter(|(i, _, _)| *i == 0)
            .map(|(_, l, _)| l.as_str())
            .collect();
        assert!(first.len() > 1, "the long label is wrapped: {first:?}");
        assert_eq!(first.join(" "), long, "no word is lost");
        assert!(!first.iter().any(|l| l.ends_with('…')));
    }
}
