//! The plot model and its SVG rendering: line plots with linear, log or
//! category axes and bar charts, drawn by hand so the output is
//! deterministic (the report's snapshot tests compare it byte for byte) and
//! needs no fonts or network. Every series has a marker shape and a colour
//! of its own (a plot holds at most eight series, see [`crate::figure`])
//! and a dash pattern for what it shows of its stack (client, server, p99),
//! so plots stay readable when printed in grey. A point's 95% confidence
//! interval is drawn as a vertical bar with caps, clipped at the plot's
//! edges: a bar never sets the range of a log axis nor turns it linear.
//! Reference lines (the path's payload limit) are drawn across the plot.
//! The legend sits under the plot, one line per series, so long stack
//! labels fit.

use std::fmt::Write as _;

/// Width of every plot in SVG user units (pixels at 100%).
pub const WIDTH: f64 = 760.0;
/// Height of a line plot's drawing area with its axes (the legend below adds
/// [`LEGEND_ROW_HEIGHT`] per series), and the least height of a bar chart
/// (which grows by [`BAR_ROW_HEIGHT`] per row beyond what fits).
pub(crate) const HEIGHT: f64 = 440.0;
/// Height of one legend line under a line plot, in SVG user units.
pub(crate) const LEGEND_ROW_HEIGHT: f64 = 18.0;
/// Height given to each row of a bar chart, in SVG user units.
pub(crate) const BAR_ROW_HEIGHT: f64 = 30.0;

const LEFT: f64 = 78.0;
const RIGHT: f64 = 24.0;
const TOP: f64 = 40.0;
const BOTTOM: f64 = 58.0;

/// Okabe–Ito colours, distinguishable with common colour-vision deficiencies.
const COLOURS: [&str; 8] = [
    "#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#F0E442",
];
const DASHES: [&str; 4] = ["", "6 3", "2 3", "8 3 2 3"];
const MARKERS: usize = 8;

/// One axis of a line plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Axis {
    /// Label including the unit, e.g. `latency (µs, one-way)`.
    pub label: String,
    /// Logarithmic scale.
    pub log: bool,
    /// Values are sizes in bytes: ticks at powers of two with K/M/G labels.
    pub bytes: bool,
    /// Named categories (`1S/3C`, `3S/1C`): value `i` is drawn at the
    /// `i`-th name, evenly spaced; empty for a numeric axis.
    pub categories: Vec<String>,
}

impl Axis {
    /// A linear axis.
    pub fn linear(label: &str) -> Axis {
        Axis {
            label: label.to_string(),
            log: false,
            bytes: false,
            categories: Vec::new(),
        }
    }

    /// A logarithmic axis.
    pub fn log(label: &str) -> Axis {
        Axis {
            log: true,
            ..Axis::linear(label)
        }
    }

    /// A logarithmic axis when the positive `values` span more than a
    /// decade (so a stack 100 times faster does not flatten the others
    /// into the floor), else a linear one. Values that are zero or negative
    /// keep the axis linear, since a log axis could not show them.
    pub fn auto(label: &str, values: impl IntoIterator<Item = f64>) -> Axis {
        let (mut lo, mut hi, mut nonpositive) = (f64::MAX, f64::MIN, false);
        for v in values.into_iter().filter(|v| v.is_finite()) {
            if v <= 0.0 {
                nonpositive = true;
            }
            lo = lo.min(v);
            hi = hi.max(v);
        }
        if !nonpositive && lo > 0.0 && hi / lo > 10.0 {
            Axis::log(label)
        } else {
            Axis::linear(label)
        }
    }

    /// A logarithmic message-size axis in bytes.
    pub fn size() -> Axis {
        Axis {
            label: "message size (bytes; K = 1024)".to_string(),
            log: true,
            bytes: true,
            categories: Vec::new(),
        }
    }

    /// A logarithmic axis of sizes in bytes under `label`.
    pub fn bytes(label: &str) -> Axis {
        Axis {
            label: label.to_string(),
            ..Axis::size()
        }
    }

    /// An axis of named categories, in the order given.
    pub fn categories(label: &str, names: Vec<String>) -> Axis {
        Axis {
            categories: names,
            ..Axis::linear(label)
        }
    }
}

/// A point to call out on a series (a dropout), with its note.
#[derive(Debug, Clone, PartialEq)]
pub struct Mark {
    /// x in the x axis' unit.
    pub x: f64,
    /// y in the y axis' unit.
    pub y: f64,
    /// Short note drawn next to it.
    pub note: String,
    /// A measurement fault (a result past its path's limit): drawn as a
    /// hollow marker of its own instead of a point of the line.
    pub fault: bool,
}

/// One line of a line plot.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Series {
    /// Legend text.
    pub name: String,
    /// Points in axis units, sorted by x.
    pub points: Vec<(f64, f64)>,
    /// The 95% confidence interval `(low, high)` of each point, in y axis
    /// units, in the order of `points`; `None` (or a shorter list) where a
    /// point has none.
    pub errors: Vec<Option<(f64, f64)>>,
    /// Points to call out.
    pub marks: Vec<Mark>,
    /// Colour index into the palette (taken modulo its length).
    pub colour: usize,
    /// Dash pattern index (solid, dashed, dotted, dash-dot; modulo).
    pub dash: usize,
}

/// A horizontal line across a plot at a known value: what the path allows.
#[derive(Debug, Clone, PartialEq)]
pub struct RefLine {
    /// y in the y axis' unit.
    pub y: f64,
    /// What the line is (`path limit 9.49 Gbit/s`).
    pub label: String,
}

/// A line plot: series of points against a common x axis.
#[derive(Debug, Clone, PartialEq)]
pub struct LinePlot {
    /// Title.
    pub title: String,
    /// The x axis.
    pub x: Axis,
    /// The y axis.
    pub y: Axis,
    /// Lines, drawn in order.
    pub series: Vec<Series>,
    /// Reference lines across the plot, drawn under the series.
    pub refs: Vec<RefLine>,
}

/// A horizontal bar chart: one row per category, one bar per group in it.
#[derive(Debug, Clone, PartialEq)]
pub struct BarChart {
    /// Title.
    pub title: String,
    /// Label of the value axis, with its unit.
    pub value_label: String,
    /// Names of the bars in every row (`client`, `server`).
    pub groups: Vec<String>,
    /// Rows: label and one value per group (`None` when not measured).
    pub rows: Vec<(String, Vec<Option<f64>>)>,
}

/// A plot of the report.
#[derive(Debug, Clone, PartialEq)]
pub enum Plot {
    /// Lines against x.
    Line(LinePlot),
    /// Bars per category.
    Bars(BarChart),
}

impl Plot {
    /// The title.
    pub fn title(&self) -> &str {
        match self {
            Plot::Line(p) => &p.title,
            Plot::Bars(b) => &b.title,
        }
    }

    /// The plot as a standalone SVG document.
    pub fn to_svg(&self) -> String {
        match self {
            Plot::Line(p) => line_svg(p),
            Plot::Bars(b) => bars_svg(b),
        }
    }
}

/// Escapes text for XML.
pub(crate) fn escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A number for a tick label: up to 4 significant digits, no trailing zeros.
fn tick_label(v: f64) -> String {
    if v == 0.0 {
        return "0".into();
    }
    let digits = (3 - v.abs().log10().floor() as i32).clamp(0, 8) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// Maps axis values to pixels.
struct Scale {
    lo: f64,
    hi: f64,
    log: bool,
    p0: f64,
    p1: f64,
}

impl Scale {
    fn at(&self, v: f64) -> f64 {
        let (v, lo, hi) = if self.log {
            (v.log10(), self.lo.log10(), self.hi.log10())
        } else {
            (v, self.lo, self.hi)
        };
        let f = if hi > lo { (v - lo) / (hi - lo) } else { 0.5 };
        self.p0 + f * (self.p1 - self.p0)
    }
}

/// Range and tick positions of an axis over data `lo..=hi`.
fn ticks(axis: &Axis, lo: f64, hi: f64) -> (f64, f64, Vec<(f64, String)>) {
    if !axis.categories.is_empty() {
        let t = axis
            .categories
            .iter()
            .enumerate()
            .map(|(i, n)| (i as f64, n.clone()))
            .collect();
        return (-0.5, axis.categories.len() as f64 - 0.5, t);
    }
    if axis.bytes {
        let (a, b) = (
            lo.max(1.0).log2().floor(),
            hi.max(1.0).log2().ceil().max(1.0),
        );
        let span = b - a;
        let step = if span <= 8.0 {
            1.0
        } else if span <= 16.0 {
            2.0
        } else {
            4.0
        };
        let mut t = Vec::new();
        let mut e = a;
        while e <= b + 1e-9 {
            let v = 2f64.powf(e);
            t.push((v, netgap_core::units::format_size(v as u64)));
            e += step;
        }
        return (2f64.powf(a), 2f64.powf(b), t);
    }
    if axis.log {
        let (a, b) = (
            lo.log10().floor(),
            hi.log10().ceil().max(lo.log10().floor() + 1.0),
        );
        let mut t = Vec::new();
        let mut e = a;
        while e <= b + 1e-9 {
            let v = 10f64.powf(e);
            t.push((v, tick_label(v)));
            if b - a <= 2.0 {
                for m in [2.0f64, 5.0] {
                    if e + m.log10() < b {
                        t.push((v * m, tick_label(v * m)));
                    }
                }
            }
            e += 1.0;
        }
        return (10f64.powf(a), 10f64.powf(b), t);
    }
    let lo = lo.min(0.0);
    let hi = if hi > lo { hi } else { lo + 1.0 };
    let raw = (hi - lo) / 5.0;
    let mag = 10f64.powf(raw.log10().floor());
    let step = [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * mag)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * mag);
    let (a, b) = ((lo / step).floor() * step, (hi / step).ceil() * step);
    let mut t = Vec::new();
    let mut v = a;
    while v <= b + step * 1e-9 {
        t.push((v, tick_label(v)));
        v += step;
    }
    (a, b, t)
}

fn header(out: &mut String, title: &str, height: f64) {
    let _ = write!(
        out,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"plot\" width=\"{WIDTH}\" height=\"{height}\" \
         viewBox=\"0 0 {WIDTH} {height}\" font-family=\"DejaVu Sans, Liberation Sans, Arial, sans-serif\" font-size=\"12\">\n\
         <title>{t}</title>\n<rect width=\"{WIDTH}\" height=\"{height}\" fill=\"#ffffff\"/>\n\
         <text x=\"{cx:.1}\" y=\"22\" text-anchor=\"middle\" font-size=\"15\" font-weight=\"bold\">{t}</text>\n",
        t = escape(title),
        cx = WIDTH / 2.0,
    );
}

/// Draws marker number `k` centred at (x, y).
fn marker(out: &mut String, k: usize, x: f64, y: f64, colour: &str) {
    let r = 4.0;
    let _ = match k % MARKERS {
        0 => writeln!(out, "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{r}\" fill=\"{colour}\"/>"),
        1 => writeln!(
            out,
            "<rect x=\"{:.1}\" y=\"{:.1}\" width=\"{w}\" height=\"{w}\" fill=\"{colour}\"/>",
            x - r,
            y - r,
            w = 2.0 * r
        ),
        2 => writeln!(
            out,
            "<path d=\"M{x:.1} {:.1}L{:.1} {:.1}L{:.1} {:.1}Z\" fill=\"{colour}\"/>",
            y - r - 1.0,
            x + r + 1.0,
            y + r,
            x - r - 1.0,
            y + r
        ),
        3 => writeln!(
            out,
            "<path d=\"M{x:.1} {:.1}L{:.1} {y:.1}L{x:.1} {:.1}L{:.1} {y:.1}Z\" fill=\"{colour}\"/>",
            y - r - 1.0,
            x + r + 1.0,
            y + r + 1.0,
            x - r - 1.0
        ),
        4 => writeln!(
            out,
            "<path d=\"M{:.1} {:.1}L{:.1} {:.1}M{:.1} {:.1}L{:.1} {:.1}\" stroke=\"{colour}\" stroke-width=\"2.2\"/>",
            x - r, y - r, x + r, y + r, x - r, y + r, x + r, y - r
        ),
        5 => writeln!(
            out,
            "<circle cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"{r}\" fill=\"#ffffff\" stroke=\"{colour}\" stroke-width=\"2\"/>"
        ),
        6 => writeln!(
            out,
            "<path d=\"M{x:.1} {:.1}L{:.1} {:.1}L{:.1} {:.1}Z\" fill=\"#ffffff\" stroke=\"{colour}\" stroke-width=\"2\"/>",
            y + r + 1.0,
            x + r + 1.0,
            y - r,
            x - r - 1.0,
            y - r
        ),
        _ => writeln!(
            out,
            "<path d=\"M{:.1} {y:.1}H{:.1}M{x:.1} {:.1}V{:.1}\" stroke=\"{colour}\" stroke-width=\"2.6\"/>",
            x - r - 1.0,
            x + r + 1.0,
            y - r - 1.0,
            y + r + 1.0
        ),
    };
}

/// Whether `v` can be drawn on axis `a` (a log axis has no place for 0
/// and below).
fn usable(a: &Axis, v: f64) -> bool {
    v.is_finite() && (!a.log || v > 0.0)
}

/// Every point the axes must reach: the series' points, the ends of their
/// confidence bars on a linear axis, the reference lines and the faults.
fn extent(p: &LinePlot) -> Vec<(f64, f64)> {
    let mut pts: Vec<(f64, f64)> = p
        .series
        .iter()
        .flat_map(|s| s.points.iter().copied())
        .filter(|(x, y)| usable(&p.x, *x) && usable(&p.y, *y))
        .collect();
    // A linear axis reaches the ends of the confidence bars, except below
    // zero when every point is at or above it (a bar past zero is clipped
    // there: a negative bandwidth or latency is no value). A log axis is
    // set by the points alone and clips the bars at its edges, so a wide
    // bar can neither stretch it over decades nor make it linear.
    let floor_zero = pts.iter().all(|(_, y)| *y >= 0.0);
    if !p.y.log {
        let bars: Vec<(f64, f64)> = p
            .series
            .iter()
            .flat_map(|s| s.points.iter().zip(&s.errors))
            .filter(|(pt, _)| usable(&p.x, pt.0) && usable(&p.y, pt.1))
            .filter_map(|(pt, e)| e.map(|(lo, hi)| [(pt.0, lo), (pt.0, hi)]))
            .flatten()
            .filter(|(_, y)| y.is_finite())
            .map(|(x, y)| (x, if floor_zero { y.max(0.0) } else { y }))
            .collect();
        pts.extend(bars);
    }
    let x_any = pts.first().map_or(1.0, |p| p.0);
    pts.extend(
        p.refs
            .iter()
            .filter(|r| usable(&p.y, r.y))
            .map(|r| (x_any, r.y)),
    );
    // A fault is drawn off its line, but inside the axes too.
    let faults: Vec<(f64, f64)> = p
        .series
        .iter()
        .flat_map(|s| s.marks.iter())
        .filter(|m| m.fault && usable(&p.x, m.x) && usable(&p.y, m.y))
        .map(|m| (m.x, m.y))
        .collect();
    pts.extend(faults);
    pts
}

/// The plot's grid, ticks, reference lines, frame and axis labels.
fn axes(
    out: &mut String,
    p: &LinePlot,
    (sx, xt): (&Scale, &[(f64, String)]),
    (sy, yt): (&Scale, &[(f64, String)]),
) {
    let (px0, px1, py0, py1) = (sx.p0, sx.p1, sy.p0, sy.p1);
    // Grid and ticks.
    for (v, label) in xt {
        let x = sx.at(*v);
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{py1:.1}\" x2=\"{x:.1}\" y2=\"{py0:.1}\" stroke=\"#e0e0e0\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            py0 + 16.0,
            escape(label)
        );
    }
    for (v, label) in yt {
        let y = sy.at(*v);
        let _ = writeln!(
            out,
            "<line x1=\"{px0:.1}\" y1=\"{y:.1}\" x2=\"{px1:.1}\" y2=\"{y:.1}\" stroke=\"#e0e0e0\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\">{}</text>",
            px0 - 6.0,
            y + 4.0,
            escape(label)
        );
    }
    let _ = writeln!(
        out,
        "<g class=\"axes\" data-x-scale=\"{}\" data-y-scale=\"{}\"></g>",
        scale_name(&p.x),
        scale_name(&p.y)
    );
    for r in p.refs.iter().filter(|r| usable(&p.y, r.y)) {
        let y = sy.at(r.y);
        let _ = writeln!(
            out,
            "<g class=\"reference\" data-value=\"{}\"><line x1=\"{px0:.1}\" y1=\"{y:.1}\" x2=\"{px1:.1}\" y2=\"{y:.1}\" stroke=\"#C00000\" stroke-width=\"1.4\" stroke-dasharray=\"10 4\"/>\
             <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" fill=\"#C00000\" font-size=\"11\">{}</text></g>",
            tick_label(r.y),
            px1 - 4.0,
            y - 4.0,
            escape(&r.label)
        );
    }
    let _ = writeln!(
        out,
        "<rect x=\"{px0:.1}\" y=\"{py1:.1}\" width=\"{:.1}\" height=\"{:.1}\" fill=\"none\" stroke=\"#333333\"/>\n\
         <text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>\n\
         <text transform=\"translate(16 {:.1}) rotate(-90)\" text-anchor=\"middle\">{}</text>",
        px1 - px0,
        py0 - py1,
        (px0 + px1) / 2.0,
        HEIGHT - 14.0,
        escape(&p.x.label),
        (py0 + py1) / 2.0,
        escape(&p.y.label)
    );
}

/// Series `k`: its line, confidence bars, markers, marks and legend entry.
fn series_svg(out: &mut String, p: &LinePlot, k: usize, s: &Series, sx: &Scale, sy: &Scale) {
    let (py0, py1) = (sy.p0, sy.p1);
    let colour = COLOURS[s.colour % COLOURS.len()];
    let dash = DASHES[s.dash % DASHES.len()];
    let visible: Vec<(f64, f64)> = s
        .points
        .iter()
        .copied()
        .filter(|(x, y)| usable(&p.x, *x) && usable(&p.y, *y))
        .map(|(x, y)| (sx.at(x), sy.at(y)))
        .collect();
    let errors: Vec<(f64, f64, f64)> = s
        .points
        .iter()
        .zip(&s.errors)
        .filter(|(pt, _)| usable(&p.x, pt.0) && usable(&p.y, pt.1))
        .filter_map(|(pt, e)| {
            let (lo, hi) = (*e)?;
            // A bar is clipped at the plot's edges; a low end a log
            // axis cannot show runs to the floor.
            let lo = if usable(&p.y, lo) {
                sy.at(lo).min(py0)
            } else {
                py0
            };
            let hi = if usable(&p.y, hi) {
                sy.at(hi).max(py1).min(py0)
            } else {
                return None;
            };
            let lo = lo.max(py1);
            Some((sx.at(pt.0), lo, hi))
        })
        .collect();
    let _ = writeln!(
        out,
        "<g class=\"series\" data-name=\"{}\">",
        escape(&s.name)
    );
    if visible.len() > 1 {
        let d: Vec<String> = visible
            .iter()
            .map(|(x, y)| format!("{x:.1},{y:.1}"))
            .collect();
        let _ = writeln!(
            out,
            "<polyline points=\"{}\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"1.6\" stroke-dasharray=\"{dash}\"/>",
            d.join(" ")
        );
    }
    for (x, lo, hi) in &errors {
        let _ = writeln!(
            out,
            "<path class=\"errorbar\" d=\"M{x:.1} {lo:.1}V{hi:.1}M{:.1} {lo:.1}H{:.1}M{:.1} {hi:.1}H{:.1}\" stroke=\"{colour}\" stroke-width=\"1.2\" fill=\"none\"/>",
            x - 5.0,
            x + 5.0,
            x - 5.0,
            x + 5.0
        );
    }
    for (x, y) in &visible {
        marker(out, k, *x, *y, colour);
    }
    for m in s
        .marks
        .iter()
        .filter(|m| usable(&p.x, m.x) && usable(&p.y, m.y))
    {
        let (x, y) = (sx.at(m.x), sy.at(m.y));
        if m.fault {
            let _ = writeln!(
                out,
                "<rect class=\"fault\" x=\"{:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"3 2\"/>\
                 <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#C00000\" font-size=\"11\">{}</text>",
                x - 6.0,
                y - 6.0,
                y - 11.0,
                escape(&m.note)
            );
            continue;
        }
        let _ = writeln!(
            out,
            "<circle class=\"mark\" cx=\"{x:.1}\" cy=\"{y:.1}\" r=\"9\" fill=\"none\" stroke=\"#C00000\" stroke-width=\"2\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\" fill=\"#C00000\" font-size=\"11\">{}</text>",
            y - 13.0,
            escape(&m.note)
        );
    }
    // Legend entry, under the x axis label.
    let ly = HEIGHT + 4.0 + LEGEND_ROW_HEIGHT * k as f64;
    let lx = LEFT;
    let _ = writeln!(
        out,
        "<line x1=\"{lx:.1}\" y1=\"{ly:.1}\" x2=\"{:.1}\" y2=\"{ly:.1}\" stroke=\"{colour}\" stroke-width=\"1.6\" stroke-dasharray=\"{dash}\"/>",
        lx + 28.0
    );
    marker(out, k, lx + 14.0, ly, colour);
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\">{}</text>\n</g>",
        lx + 34.0,
        ly + 4.0,
        escape(&s.name)
    );
}

fn line_svg(p: &LinePlot) -> String {
    let pts = extent(p);
    let mut out = String::new();
    let height = HEIGHT + LEGEND_ROW_HEIGHT * p.series.len() as f64;
    header(&mut out, &p.title, height);
    if pts.is_empty() {
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">no points to plot</text>\n</svg>",
            WIDTH / 2.0,
            HEIGHT / 2.0
        );
        return out;
    }
    let fold = |f: fn(f64, f64) -> f64, init: f64, sel: fn(&(f64, f64)) -> f64| {
        pts.iter().map(sel).fold(init, f)
    };
    let (x_lo, x_hi) = (
        fold(f64::min, f64::MAX, |p| p.0),
        fold(f64::max, f64::MIN, |p| p.0),
    );
    let (y_lo, y_hi) = (
        fold(f64::min, f64::MAX, |p| p.1),
        fold(f64::max, f64::MIN, |p| p.1),
    );
    let (xa, xb, xt) = ticks(&p.x, x_lo, x_hi);
    let (ya, yb, yt) = ticks(&p.y, y_lo, y_hi);
    let (px0, px1) = (LEFT, WIDTH - RIGHT);
    let (py0, py1) = (HEIGHT - BOTTOM, TOP);
    let sx = Scale {
        lo: xa,
        hi: xb,
        log: p.x.log,
        p0: px0,
        p1: px1,
    };
    let sy = Scale {
        lo: ya,
        hi: yb,
        log: p.y.log,
        p0: py0,
        p1: py1,
    };
    axes(&mut out, p, (&sx, &xt), (&sy, &yt));
    for (k, s) in p.series.iter().enumerate() {
        series_svg(&mut out, p, k, s, &sx, &sy);
    }
    out.push_str("</svg>\n");
    out
}

/// How an axis is scaled, as the page's figures state it for readers and
/// tests: `log`, `linear` or `category`.
fn scale_name(a: &Axis) -> &'static str {
    if !a.categories.is_empty() {
        "category"
    } else if a.log {
        "log"
    } else {
        "linear"
    }
}

fn bars_svg(b: &BarChart) -> String {
    let mut out = String::new();
    let height = HEIGHT.max(TOP + BOTTOM + 6.0 + BAR_ROW_HEIGHT * b.rows.len() as f64);
    header(&mut out, &b.title, height);
    let max = b
        .rows
        .iter()
        .flat_map(|(_, v)| v.iter().flatten().copied())
        .filter(|v| v.is_finite())
        .fold(0.0, f64::max);
    let (lo, hi, ticks) = ticks(&Axis::linear(&b.value_label), 0.0, max);
    let (px0, px1) = (250.0, WIDTH - 110.0);
    let (py0, py1) = (TOP + 6.0, height - BOTTOM);
    let sx = Scale {
        lo,
        hi,
        log: false,
        p0: px0,
        p1: px1,
    };
    let rows = b.rows.len().max(1) as f64;
    let row_h = (py1 - py0) / rows;
    let groups = b.groups.len().max(1) as f64;
    let bar_h = (row_h * 0.8 / groups).min(14.0);
    for (v, label) in &ticks {
        let x = sx.at(*v);
        let _ = writeln!(
            out,
            "<line x1=\"{x:.1}\" y1=\"{py0:.1}\" x2=\"{x:.1}\" y2=\"{py1:.1}\" stroke=\"#e0e0e0\"/>\
             <text x=\"{x:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            py1 + 16.0,
            escape(label)
        );
    }
    let _ = writeln!(
        out,
        "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
        (px0 + px1) / 2.0,
        height - 14.0,
        escape(&b.value_label)
    );
    for (i, (label, values)) in b.rows.iter().enumerate() {
        let top = py0 + row_h * i as f64 + row_h * 0.1;
        let _ = writeln!(
            out,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"end\" font-size=\"11\">{}</text>",
            px0 - 6.0,
            top + bar_h * groups / 2.0 + 4.0,
            escape(label)
        );
        for (g, v) in values.iter().enumerate() {
            let y = top + bar_h * g as f64;
            let colour = COLOURS[g % COLOURS.len()];
            match v {
                Some(v) if v.is_finite() => {
                    let w = (sx.at(*v) - px0).max(0.5);
                    // Hatching on every other group keeps groups apart in grey print.
                    let stroke = if g % 2 == 1 {
                        " stroke=\"#000000\" stroke-width=\"0.8\""
                    } else {
                        ""
                    };
                    let _ = writeln!(
                        out,
                        "<rect class=\"bar\" x=\"{px0:.1}\" y=\"{y:.1}\" width=\"{w:.1}\" height=\"{:.1}\" fill=\"{colour}\"{stroke}/>\
                         <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\">{}</text>",
                        bar_h - 1.0,
                        px0 + w + 3.0,
                        y + bar_h - 3.0,
                        tick_label(*v)
                    );
                }
                _ => {
                    let _ = writeln!(
                        out,
                        "<text x=\"{:.1}\" y=\"{:.1}\" font-size=\"10\" fill=\"#777777\">not measured</text>",
                        px0 + 3.0,
                        y + bar_h - 3.0
                    );
                }
            }
        }
    }
    for (g, name) in b.groups.iter().enumerate() {
        let colour = COLOURS[g % COLOURS.len()];
        let lx = WIDTH - 100.0;
        let ly = TOP + 10.0 + 18.0 * g as f64;
        let _ = writeln!(
            out,
            "<rect x=\"{lx:.1}\" y=\"{:.1}\" width=\"12\" height=\"12\" fill=\"{colour}\"/><text x=\"{:.1}\" y=\"{:.1}\">{}</text>",
            ly - 8.0,
            lx + 16.0,
            ly + 2.0,
            escape(name)
        );
    }
    out.push_str("</svg>\n");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tick_labels_are_short() {
        assert_eq!(tick_label(1000.0), "1000");
        assert_eq!(tick_label(0.1), "0.1");
        assert_eq!(tick_label(2.5), "2.5");
        assert_eq!(tick_label(0.0), "0");
    }

    #[test]
    fn size_ticks_are_powers_of_two() {
        let (lo, hi, t) = ticks(&Axis::size(), 1.0, 4.0 * 1024.0 * 1024.0);
        assert_eq!((lo, hi), (1.0, 4194304.0));
        let labels: Vec<&str> = t.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["1", "16", "256", "4K", "64K", "1M"]);
    }

    #[test]
    fn a_fault_is_drawn_as_its_own_hollow_mark_even_alone() {
        let p = Plot::Line(LinePlot {
            title: "t".into(),
            x: Axis::size(),
            y: Axis::linear("y"),
            series: vec![Series {
                name: "a".into(),
                marks: vec![Mark {
                    x: 65536.0,
                    y: 1.2,
                    note: "fault".into(),
                    fault: true,
                }],
                ..Series::default()
            }],
            refs: Vec::new(),
        });
        let svg = p.to_svg();
        assert!(!svg.contains("no points to plot"), "{svg}");
        assert_eq!(svg.matches("class=\"fault\"").count(), 1, "{svg}");
        // Only the legend's marker is a filled circle: the fault is none.
        assert_eq!(svg.matches("<circle").count(), 1, "{svg}");
    }

    #[test]
    fn a_bar_below_zero_neither_makes_a_log_axis_linear_nor_reaches_below_zero() {
        let series = vec![Series {
            name: "a".into(),
            points: vec![(1.0, 6.7), (2.0, 5400.0)],
            errors: vec![Some((-5000.0, 15000.0)), Some((5000.0, 5800.0))],
            ..Series::default()
        }];
        let log = Plot::Line(LinePlot {
            title: "t".into(),
            x: Axis::size(),
            y: Axis::log("y"),
            series: series.clone(),
            refs: vec![RefLine {
                y: 100.0,
                label: "limit".into(),
            }],
        })
        .to_svg();
        assert!(log.contains("data-y-scale=\"log\""), "{log}");
        assert!(log.contains("class=\"reference\""), "{log}");
        // The axis runs from the points' decades: 1 to 10000.
        assert!(
            log.contains(">10000</text>") && !log.contains(">-5000<"),
            "{log}"
        );
        let linear = Plot::Line(LinePlot {
            title: "t".into(),
            x: Axis::size(),
            y: Axis::linear("y"),
            series,
            refs: Vec::new(),
        })
        .to_svg();
        assert!(!linear.contains(">-"), "no negative tick: {linear}");
    }

    #[test]
    fn a_category_axis_names_each_category_once() {
        let (lo, hi, t) = ticks(
            &Axis::categories("shape", vec!["1S/3C".into(), "3S/1C".into()]),
            0.0,
            1.0,
        );
        assert_eq!((lo, hi), (-0.5, 1.5));
        let labels: Vec<&str> = t.iter().map(|(_, l)| l.as_str()).collect();
        assert_eq!(labels, ["1S/3C", "3S/1C"]);
    }

    #[test]
    fn points_that_a_log_axis_cannot_show_are_left_out() {
        let p = Plot::Line(LinePlot {
            title: "t".into(),
            x: Axis::size(),
            y: Axis::log("y"),
            series: vec![Series {
                name: "a".into(),
                points: vec![(0.0, 1.0), (1.0, 2.0), (2.0, -1.0)],
                ..Series::default()
            }],
            refs: Vec::new(),
        });
        let svg = p.to_svg();
        assert_eq!(
            svg.matches("<circle").count(),
            2,
            "one point and its legend"
        );
    }
}
