//! Figures as the studies draw them: a metric against the study's x axis
//! (message size, clients, streams, links, hosts, file size, Zipf alpha,
//! unit-of-work size, the pio shapes), one series per identity
//! ([`SeriesKey`]: the stack, the hosts and every option that changes what
//! was measured), labelled by what sets the series of a plot apart.
//!
//! The report draws its own sections with this module, and other callers
//! (a study's figures) name what they want in a [`FigureSpec`] and call
//! [`figures`], [`figure_svg`] or [`figure_svgs`] on the records they chose:
//!
//! ```
//! use netgap_report::figure::{figure_svg, FigureSpec, Reference, XAxis};
//! let spec = FigureSpec {
//!     metrics: vec!["bandwidth_gbps".into()],
//!     reference: Reference::PayloadLimit,
//!     ..FigureSpec::new("Figure 3: stream bandwidth", XAxis::MessageSize)
//! };
//! let fragment = figure_svg(&spec, &[]);
//! assert!(fragment.is_empty(), "no records, no plot");
//! ```
//!
//! Rules every figure follows:
//! - what the x axis does not show but varies among the records (the size
//!   on a plot against clients, the clients on a plot against size) is
//!   part of each series, never merged into one line;
//! - a plot holds at most [`FigureSpec::max_series`] series (default
//!   [`MAX_SERIES`]); more are split into several plots by what they share:
//!   one plot per stack measured under several conditions ("conditions"),
//!   and one per condition for the stacks measured under it ("stacks"),
//!   each titled by what its series share;
//! - every series of a plot has its own colour and marker;
//! - the value axis is logarithmic when the points span more than a decade
//!   ([`YScale::Auto`]); confidence bars never decide that;
//! - a bandwidth plot draws the path's payload limit
//!   (`physics.payload_limit_gbps` of the records) as a reference line
//!   ([`Reference::PayloadLimit`]).

use crate::load::Loaded;
use crate::stacks::{self, SeriesKey};
use crate::svg::{Axis, LinePlot, Mark, Plot, RefLine, Series};
use netgap_core::record::ResultRecord;
use netgap_core::spec::Mode;
use netgap_core::units::format_size;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;

/// Most series one plot holds by default: more are split into several
/// plots, so colours and markers stay distinct.
pub const MAX_SERIES: usize = 8;

/// Plots shown side by side: a metric and the CPU that went with it, or a
/// single plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The panels, left to right.
    pub panels: Vec<Plot>,
}

/// What a figure plots along its x axis.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum XAxis {
    /// The message size, bytes (log scale, powers of two).
    MessageSize,
    /// The web workload's file size: the record's size, bytes.
    FileSize,
    /// The pipeline's unit-of-work size: the record's size, bytes.
    UnitSize,
    /// Concurrent clients of a workload point.
    Clients,
    /// Parallel streams (`multistream`).
    Streams,
    /// Links used (`multirail`).
    Links,
    /// Hosts (or sources) of the point (`gather`, `pipeline`).
    Hosts,
    /// The Zipf exponent of the web workload (`--alpha`).
    Alpha,
    /// The pio shape, `1S/3C` (one I/O server, three clients): categories
    /// ordered by servers, then clients.
    PioShape,
    /// Any numeric workload option, by its flag name (`copies`).
    Option(String),
}

/// A point's place on the x axis.
#[derive(Debug, Clone, PartialEq)]
enum XValue {
    Num(f64),
    /// A category with its sort key.
    Cat(String, (u64, u64)),
}

/// The value of a workload option of a record, as the record has it.
fn app_option<'a>(l: &'a Loaded, name: &str) -> Option<&'a serde_json::Value> {
    l.record
        .workload
        .as_ref()
        .and_then(|w| w.app.as_ref())
        .and_then(|a| a.options.get(name))
}

impl XAxis {
    /// The axis label, with its unit.
    pub fn label(&self) -> String {
        match self {
            XAxis::MessageSize => "message size (bytes; K = 1024)".into(),
            XAxis::FileSize => "file size (bytes; K = 1024)".into(),
            XAxis::UnitSize => "unit-of-work size (bytes; K = 1024)".into(),
            XAxis::Clients => "concurrent clients".into(),
            XAxis::Streams => "parallel streams".into(),
            XAxis::Links => "links".into(),
            XAxis::Hosts => "hosts".into(),
            XAxis::Alpha => "Zipf alpha (request popularity skew)".into(),
            XAxis::PioShape => "I/O servers S / clients C".into(),
            XAxis::Option(n) => n.replace('-', " "),
        }
    }

    /// Short name for titles: `size`, `clients`, `alpha`.
    pub fn name(&self) -> String {
        match self {
            XAxis::MessageSize => "size".into(),
            XAxis::FileSize => "file size".into(),
            XAxis::UnitSize => "unit-of-work size".into(),
            XAxis::Clients => "clients".into(),
            XAxis::Streams => "streams".into(),
            XAxis::Links => "links".into(),
            XAxis::Hosts => "hosts".into(),
            XAxis::Alpha => "alpha".into(),
            XAxis::PioShape => "servers/clients".into(),
            XAxis::Option(n) => n.clone(),
        }
    }

    fn is_size(&self) -> bool {
        matches!(self, XAxis::MessageSize | XAxis::FileSize | XAxis::UnitSize)
    }

    fn is_count(&self) -> bool {
        matches!(
            self,
            XAxis::Clients | XAxis::Streams | XAxis::Links | XAxis::Hosts | XAxis::PioShape
        )
    }

    /// The workload option the axis consumes: it is no part of a series.
    fn option(&self) -> Option<&str> {
        match self {
            XAxis::Alpha => Some("alpha"),
            XAxis::PioShape => Some("servers"),
            XAxis::Option(n) => Some(n),
            _ => None,
        }
    }

    fn value(&self, l: &Loaded) -> Option<XValue> {
        if self.is_size() {
            return Some(XValue::Num(l.record.size_bytes as f64));
        }
        match self {
            XAxis::PioShape => {
                let servers = app_option(l, "servers")
                    .and_then(|v| v.as_u64())
                    .unwrap_or(1);
                let clients = u64::from(l.record.clients()?);
                Some(XValue::Cat(
                    format!("{servers}S/{clients}C"),
                    (servers, clients),
                ))
            }
            _ if self.is_count() => l.record.clients().map(|c| XValue::Num(f64::from(c))),
            // A zipf point run without `--alpha` ran the web workload's
            // default exponent, 1.0.
            XAxis::Alpha if app_option(l, "alpha").is_none() => {
                let zipf = app_option(l, "trace").and_then(|v| v.as_str()) == Some("zipf");
                zipf.then_some(XValue::Num(1.0))
            }
            _ => {
                let name = self.option()?;
                app_option(l, name)
                    .and_then(|v| {
                        v.as_f64()
                            .or_else(|| v.as_str().and_then(|s| s.parse().ok()))
                    })
                    .map(XValue::Num)
            }
        }
    }

    fn axis(&self, categories: Vec<String>) -> Axis {
        if self.is_size() {
            return if *self == XAxis::MessageSize {
                Axis::size()
            } else {
                Axis::bytes(&self.label())
            };
        }
        if !categories.is_empty() {
            return Axis::categories(&self.label(), categories);
        }
        Axis::linear(&self.label())
    }
}

/// How a figure's value axis is scaled.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum YScale {
    /// Logarithmic when the points span more than a decade, else linear.
    #[default]
    Auto,
    /// Always linear.
    Linear,
    /// Always logarithmic (points at or below zero are left out).
    Log,
}

/// A reference line across a figure's value plots.
#[derive(Debug, Clone, PartialEq, Default)]
pub enum Reference {
    /// None.
    None,
    /// The path's payload limit the records carry
    /// (`physics.payload_limit_gbps`), on plots of a `_gbps` metric.
    #[default]
    PayloadLimit,
    /// A fixed value in the metric's unit, with its label.
    Value {
        /// The value.
        y: f64,
        /// What it is (`published: 4.2 Gbit/s`).
        label: String,
    },
}

/// What one figure shows. Build it with [`FigureSpec::new`] and change the
/// fields that differ from the defaults.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureSpec {
    /// Title of the figure's plots (a split plot adds what its series
    /// share).
    pub title: String,
    /// What the x axis shows.
    pub x: XAxis,
    /// The metrics plotted, one plot (or row of plots) each: a record's
    /// headline metric (`bandwidth_gbps`) or one of an application's own
    /// figures (`app.metrics`, such as `payload_gbps`). Empty: every
    /// headline metric of the records.
    pub metrics: Vec<String>,
    /// The value axis' scale.
    pub y_scale: YScale,
    /// The reference line.
    pub reference: Reference,
    /// Draw the CPU of both ends (or of the server and client hosts)
    /// beside each value plot, as the studies put CPU beside bandwidth.
    pub cpu_beside: bool,
    /// Most series a plot holds before it is split.
    pub max_series: usize,
}

impl FigureSpec {
    /// A figure titled `title` against `x`: every headline metric, auto
    /// scale, the path's limit drawn, CPU beside, at most [`MAX_SERIES`]
    /// series a plot.
    pub fn new(title: &str, x: XAxis) -> FigureSpec {
        FigureSpec {
            title: title.to_string(),
            x,
            metrics: Vec::new(),
            y_scale: YScale::Auto,
            reference: Reference::PayloadLimit,
            cpu_beside: true,
            max_series: MAX_SERIES,
        }
    }
}

/// The figure's plots over `records` (taken as they are: choose the
/// records of the figure first), each a row of a value plot and the CPU
/// beside it. Empty when no record has the metric and an x value.
pub fn figures(spec: &FigureSpec, records: &[ResultRecord]) -> Vec<Figure> {
    let loaded: Vec<Loaded> = records
        .iter()
        .enumerate()
        .map(|(i, r)| Loaded::from_record(r.clone(), PathBuf::from("records"), i + 1))
        .collect();
    let refs: Vec<&Loaded> = loaded.iter().collect();
    build(spec, &refs)
}

/// Every plot of the figure as inline SVG elements, one after another: a
/// fragment to put in an HTML page. Empty when there is nothing to plot.
pub fn figure_svg(spec: &FigureSpec, records: &[ResultRecord]) -> String {
    figure_svgs(spec, records).concat()
}

/// Every plot of the figure as a standalone SVG document, in order.
pub fn figure_svgs(spec: &FigureSpec, records: &[ResultRecord]) -> Vec<String> {
    figures(spec, records)
        .iter()
        .flat_map(|f| f.panels.iter().map(Plot::to_svg))
        .collect()
}

/// One point of a series being built.
pub(crate) struct Item {
    pub(crate) key: SeriesKey,
    /// What the line shows of its series beyond the metric (`client`,
    /// `p99`), with its rank: the dash pattern.
    pub(crate) sub: (usize, String),
    pub(crate) x: f64,
    pub(crate) y: f64,
    pub(crate) ci: Option<(f64, f64)>,
    pub(crate) mark: Option<Mark>,
    /// The record's result passes its path's limit: drawn as a fault, not
    /// as a point of the line.
    pub(crate) fault: bool,
}

impl Item {
    pub(crate) fn new(key: SeriesKey, l: &Loaded, x: f64, y: f64) -> Item {
        Item {
            key,
            sub: (0, String::new()),
            x,
            y,
            ci: None,
            mark: None,
            fault: l.record.fault().is_some(),
        }
    }

    pub(crate) fn sub(mut self, rank: usize, name: impl Into<String>) -> Item {
        self.sub = (rank, name.into());
        self
    }
}

/// The series of one plot: the items of `keys`, one colour and marker per
/// key (in key order, a stack's modes adjacent), a dash per sub-line. A
/// repeated x in a line (the same point in two files) keeps the later
/// record; the report's warnings name the one set aside.
pub(crate) fn series(items: &[&Item], keys: &[SeriesKey]) -> Vec<Series> {
    type Pts = Vec<(f64, f64, Option<(f64, f64)>, Option<Mark>)>;
    let labels = stacks::labels(keys.iter());
    type Line = (usize, (usize, String));
    let mut by: BTreeMap<Line, (Pts, Vec<Mark>)> = BTreeMap::new();
    for it in items {
        let Some(k) = keys.iter().position(|k| *k == it.key) else {
            continue;
        };
        let e = by.entry((k, it.sub.clone())).or_default();
        if it.fault {
            e.1.push(Mark {
                x: it.x,
                y: it.y,
                note: "fault".into(),
                fault: true,
            });
        } else {
            e.0.push((it.x, it.y, it.ci, it.mark.clone()));
        }
    }
    by.into_iter()
        .map(|((k, (rank, sub)), (mut pts, faults))| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            pts.dedup_by(|later, earlier| {
                if later.0 == earlier.0 {
                    std::mem::swap(later, earlier);
                    true
                } else {
                    false
                }
            });
            let label = labels.get(&keys[k]).cloned().unwrap_or_default();
            Series {
                name: if sub.is_empty() {
                    label
                } else {
                    format!("{label} {sub}")
                },
                errors: pts.iter().map(|p| p.2).collect(),
                marks: pts
                    .iter()
                    .filter_map(|p| p.3.clone())
                    .chain(faults)
                    .collect(),
                points: pts.iter().map(|p| (p.0, p.1)).collect(),
                colour: k,
                dash: rank,
            }
        })
        .collect()
}

/// The value axis of a plot of `series`.
pub(crate) fn y_axis(label: &str, scale: YScale, series: &[Series]) -> Axis {
    match scale {
        YScale::Linear => Axis::linear(label),
        YScale::Log => Axis::log(label),
        // The points decide, never their bars: a bar reaching below zero
        // is clipped at the axis, not a reason for a linear one.
        YScale::Auto => Axis::auto(
            label,
            series.iter().flat_map(|s| {
                s.points
                    .iter()
                    .map(|p| p.1)
                    .chain(s.marks.iter().filter(|m| m.fault).map(|m| m.y))
            }),
        ),
    }
}

/// Splits `keys` into groups of at most `max`, each with what its series
/// share (empty when no split was needed). A stack measured under several
/// conditions gets a plot of its own across them ("conditions"); the
/// stacks measured under one condition share a plot per condition
/// ("stacks"), with the condition-varied stacks' series at that condition
/// too when there is room. Groups still too large are cut in order.
pub(crate) fn split(keys: &[SeriesKey], max: usize) -> Vec<(String, Vec<SeriesKey>)> {
    let max = max.max(1);
    if keys.len() <= max {
        return vec![(String::new(), keys.to_vec())];
    }
    let stack_of = |k: &SeriesKey| {
        let mut s = k.clone();
        s.stack.path = Default::default();
        s
    };
    let mut paths: BTreeMap<SeriesKey, BTreeSet<&netgap_core::stack::PathIdentity>> =
        BTreeMap::new();
    for k in keys {
        paths.entry(stack_of(k)).or_default().insert(&k.stack.path);
    }
    let mut groups: Vec<(String, Vec<SeriesKey>)> = Vec::new();
    for (s, p) in &paths {
        if p.len() > 1 {
            let members: Vec<SeriesKey> =
                keys.iter().filter(|k| stack_of(k) == *s).cloned().collect();
            let name = stacks::labels([s]).into_values().next().unwrap_or_default();
            groups.push((format!("{name} under each condition"), members));
        }
    }
    let mut by_path: BTreeMap<&netgap_core::stack::PathIdentity, Vec<SeriesKey>> = BTreeMap::new();
    for k in keys {
        if paths.get(&stack_of(k)).is_some_and(|p| p.len() == 1) {
            by_path.entry(&k.stack.path).or_default().push(k.clone());
        }
    }
    for (path, mut members) in by_path {
        // The condition-varied stacks at this condition, for reference.
        for k in keys {
            if members.len() >= max {
                break;
            }
            if k.stack.path == *path && !members.contains(k) {
                members.push(k.clone());
            }
        }
        members.sort_by_key(SeriesKey::order);
        groups.push((format!("stacks at {}", path_text(path)), members));
    }
    let mut out = Vec::new();
    for (name, members) in groups {
        let parts = members.len().div_ceil(max);
        for (i, chunk) in members.chunks(max).enumerate() {
            let name = if parts > 1 {
                format!("{name}, part {} of {parts}", i + 1)
            } else {
                name.clone()
            };
            out.push((name, chunk.to_vec()));
        }
    }
    out
}

/// A path's conditions as a short text (`testbed, MTU 9000, offload off`),
/// or `the default path` when it names none.
fn path_text(path: &netgap_core::stack::PathIdentity) -> String {
    let probe = netgap_core::stack::Stack {
        transport: String::new(),
        mode: Mode::Event,
        options: Vec::new(),
        path: path.clone(),
        label: None,
        tool: None,
        framing: None,
    };
    let d = probe.describe();
    // The description opens with the transport and the mode.
    let rest: Vec<&str> = d.split(", ").skip(2).collect();
    if rest.is_empty() {
        "the default path".into()
    } else {
        rest.join(", ")
    }
}

/// The value of `metric` of a record with its confidence interval: its
/// headline when it is the record's metric, else an application figure.
fn metric_value(l: &Loaded, metric: &str) -> Option<(f64, Option<(f64, f64)>)> {
    if l.record.metric == metric {
        return Some((l.record.value, l.ci95()));
    }
    l.record
        .workload
        .as_ref()
        .and_then(|w| w.app.as_ref())
        .and_then(|a| a.metrics.get(metric))
        .map(|v| (*v, None))
}

/// The reference lines of a plot of `metric` over `recs`.
fn references(reference: &Reference, metric: &str, recs: &[&Loaded]) -> Vec<RefLine> {
    match reference {
        Reference::None => Vec::new(),
        Reference::Value { y, label } => vec![RefLine {
            y: *y,
            label: label.clone(),
        }],
        Reference::PayloadLimit => {
            if !metric.ends_with("_gbps") {
                return Vec::new();
            }
            // Limits to three significant digits: one line per distinct
            // limit, at most three (else only the largest).
            let mut limits: Vec<f64> = recs
                .iter()
                .filter_map(|l| l.record.physics.as_ref()?.payload_limit_gbps)
                .filter(|v| v.is_finite() && *v > 0.0)
                .map(|v| {
                    let mag = 10f64.powf(v.log10().floor() - 2.0);
                    (v / mag).round() * mag
                })
                .collect();
            limits.sort_by(f64::total_cmp);
            limits.dedup();
            if limits.len() > 3 {
                limits.drain(..limits.len() - 1);
            }
            limits
                .into_iter()
                .map(|y| RefLine {
                    y,
                    label: format!("path limit {} Gbit/s", short(y)),
                })
                .collect()
        }
    }
}

/// A number with up to 3 significant digits.
fn short(v: f64) -> String {
    let digits = (2 - v.abs().log10().floor() as i32).clamp(0, 6) as usize;
    let s = format!("{v:.digits$}");
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    } else {
        s
    }
}

/// A metric's axis label with its unit.
pub(crate) fn metric_label(metric: &str) -> String {
    match metric {
        "latency_us" => "latency (µs, one-way)".into(),
        "bandwidth_gbps" => "bandwidth (Gbit/s of payload)".into(),
        "connections_per_s" => "connections per second".into(),
        "send_overhead_us" => "send overhead o_s (µs)".into(),
        "recv_overhead_us" => "receive overhead o_r (µs)".into(),
        "gap_us" => "gap g (µs)".into(),
        m if m.ends_with("_per_s") => {
            format!(
                "{} per second",
                m.trim_end_matches("_per_s").replace('_', " ")
            )
        }
        m => {
            let unit = m.rsplit('_').next().unwrap_or("");
            let name = m.strip_suffix(unit).unwrap_or(m).trim_end_matches('_');
            format!("{} ({unit})", name.replace('_', " "))
        }
    }
}

/// Label of a CPU axis: the CPU time of netgap's own threads at each end,
/// which on a shared machine (loopback, namespaces) is the part each end
/// is answerable for, unlike the system-wide figure both ends share.
pub(crate) const CPU_LABEL: &str = "CPU of netgap's threads (% of one core)";

/// Label of a workload's CPU axis: each role's, that of its agent's
/// process and of the processes the role started (a server program, a
/// load generator), over the window in which the role's bytes moved.
pub(crate) const ROLE_CPU_LABEL: &str = "CPU of each role's agent and processes (% of one core)";

/// The name a record's count goes by: streams, links, hosts or clients.
fn count_name(test: &str) -> &'static str {
    match test {
        "multistream" => "streams",
        "multirail" => "links",
        "gather" | "pipeline" => "hosts",
        _ => "clients",
    }
}

/// The figures of `spec` over `recs` (see [`figures`]): for each metric,
/// the records that have it and an x, their series, and a figure per
/// group of at most [`FigureSpec::max_series`] series.
pub(crate) fn build(spec: &FigureSpec, recs: &[&Loaded]) -> Vec<Figure> {
    let mut out = Vec::new();
    for metric in &metrics_of(spec, recs) {
        let chosen = choose(spec, metric, recs);
        if chosen.is_empty() {
            continue;
        }
        let plotted = Plotted::of(spec, &chosen);
        for (part, group) in split(&plotted.keys, spec.max_series) {
            out.push(plotted.figure(spec, metric, &part, &group));
        }
    }
    out
}

/// The metrics `spec` plots: its own, or every headline metric of
/// `recs` in the order they first come.
fn metrics_of(spec: &FigureSpec, recs: &[&Loaded]) -> Vec<String> {
    if !spec.metrics.is_empty() {
        return spec.metrics.clone();
    }
    let mut m: Vec<String> = Vec::new();
    for l in recs {
        if !m.contains(&l.record.metric) {
            m.push(l.record.metric.clone());
        }
    }
    m
}

/// A record plotted: its place on the x axis, its value of the metric and
/// the value's interval.
type Chosen<'a> = (&'a Loaded, XValue, f64, Option<(f64, f64)>);

/// The records of `recs` that have both an x and a value of `metric`.
fn choose<'a>(spec: &FigureSpec, metric: &str, recs: &[&'a Loaded]) -> Vec<Chosen<'a>> {
    recs.iter()
        .filter_map(|l| {
            let x = spec.x.value(l)?;
            let (y, ci) = metric_value(l, metric)?;
            Some((*l, x, y, ci))
        })
        .collect()
}

/// The categories of a categorical x axis (pio's shapes) in their order;
/// empty on a numeric one.
fn categories_of(chosen: &[Chosen<'_>]) -> Vec<String> {
    let mut categories: Vec<(u64, u64, String)> = chosen
        .iter()
        .filter_map(|c| match &c.1 {
            XValue::Cat(n, (a, b)) => Some((*a, *b, n.clone())),
            XValue::Num(_) => None,
        })
        .collect();
    categories.sort();
    categories.dedup();
    categories.into_iter().map(|c| c.2).collect()
}

/// The series a record belongs to on `spec`'s figure: its identity,
/// without the option the x axis consumes, and with what the axis does
/// not show but varies among the records (the size, the count).
fn series_key(spec: &FigureSpec, l: &Loaded, sizes_vary: bool, counts_vary: bool) -> SeriesKey {
    let mut k = SeriesKey::of(l);
    if let Some(o) = spec.x.option() {
        k = k.without(o);
        // A point at the option's default is kept apart from one that
        // named the same value, which it may not have had.
        if app_option(l, o).is_none() {
            k = k.with_entry(o, "default");
        }
    }
    if !spec.x.is_size() && sizes_vary {
        k = k.with_entry("size", &format_size(l.record.size_bytes));
    }
    if !spec.x.is_count() && counts_vary {
        if let Some(c) = l.record.clients() {
            k = k.with_entry(count_name(&l.record.test), &c.to_string());
        }
    }
    k
}

/// One metric's points of a figure, by series, before they are split
/// into plots: the value items, the CPU items beside them, the records of
/// each series, and the series in order.
struct Plotted<'a> {
    categories: Vec<String>,
    items: Vec<Item>,
    cpu: Vec<Item>,
    /// Positions of each series' items in `items` and in `cpu`.
    item_ix: BTreeMap<SeriesKey, Vec<usize>>,
    cpu_ix: BTreeMap<SeriesKey, Vec<usize>>,
    rec_of_key: BTreeMap<SeriesKey, Vec<&'a Loaded>>,
    keys: Vec<SeriesKey>,
    /// Some point is a dropout, circled on the plot.
    dropouts: bool,
}

impl<'a> Plotted<'a> {
    fn of(spec: &FigureSpec, chosen: &[Chosen<'a>]) -> Plotted<'a> {
        let categories = categories_of(chosen);
        let sizes: BTreeSet<u64> = chosen.iter().map(|c| c.0.record.size_bytes).collect();
        let counts: BTreeSet<Option<u32>> = chosen.iter().map(|c| c.0.record.clients()).collect();
        let mut items = Vec::new();
        let mut cpu = Vec::new();
        let mut rec_of_key: BTreeMap<SeriesKey, Vec<&Loaded>> = BTreeMap::new();
        for (l, xv, y, ci) in chosen {
            let key = series_key(spec, l, sizes.len() > 1, counts.len() > 1);
            let x = x_position(xv, &categories);
            let mut it = Item::new(key.clone(), l, x, *y);
            it.ci = *ci;
            it.mark = l.record.dropout().map(|d| Mark {
                x,
                y: *y,
                note: format!("dropout -{:.0}%", d.depth_pct),
                fault: false,
            });
            items.push(it);
            if spec.cpu_beside {
                cpu.extend(cpu_items(&key, l, x));
            }
            rec_of_key.entry(key).or_default().push(l);
        }
        let mut keys: Vec<SeriesKey> = rec_of_key.keys().cloned().collect();
        keys.sort_by_key(SeriesKey::order);
        Plotted {
            categories,
            dropouts: items.iter().any(|i| i.mark.is_some()),
            item_ix: key_index(&items),
            cpu_ix: key_index(&cpu),
            items,
            cpu,
            rec_of_key,
            keys,
        }
    }

    /// The figure of the series `group` (`part` says what they share,
    /// when the series were split): the value plot of `metric`, and the
    /// CPU beside it when the records have it.
    fn figure(&self, spec: &FigureSpec, metric: &str, part: &str, group: &[SeriesKey]) -> Figure {
        let in_group = of_group(&self.items, &self.item_ix, group);
        let group_recs: Vec<&Loaded> = group
            .iter()
            .flat_map(|k| self.rec_of_key.get(k).into_iter().flatten().copied())
            .collect();
        let suffix = if part.is_empty() {
            String::new()
        } else {
            format!(" ({part})")
        };
        let main = series(&in_group, group);
        let y_label = metric_label(metric);
        let title = format!(
            "{}: {y_label} against {}{}{suffix}",
            spec.title,
            spec.x.name(),
            if self.dropouts {
                ", dropouts circled"
            } else {
                ""
            }
        );
        let mut panels = vec![Plot::Line(LinePlot {
            title,
            x: spec.x.axis(self.categories.clone()),
            y: y_axis(&y_label, spec.y_scale, &main),
            series: main,
            refs: references(&spec.reference, metric, &group_recs),
        })];
        let cpu_group = of_group(&self.cpu, &self.cpu_ix, group);
        if !cpu_group.is_empty() {
            let ends = group_recs.iter().any(|l| l.record.cpu.is_some());
            panels.push(Plot::Line(LinePlot {
                title: format!(
                    "{}: CPU of {} against {}{suffix}",
                    spec.title,
                    if ends {
                        "both ends"
                    } else {
                        "server and client hosts"
                    },
                    spec.x.name()
                ),
                x: spec.x.axis(self.categories.clone()),
                y: Axis::linear(if ends { CPU_LABEL } else { ROLE_CPU_LABEL }),
                series: series(&cpu_group, group),
                refs: Vec::new(),
            }));
        }
        Figure { panels }
    }
}

/// Where a point sits on the x axis: its number, or its category's
/// position.
fn x_position(v: &XValue, categories: &[String]) -> f64 {
    match v {
        XValue::Num(x) => *x,
        XValue::Cat(n, _) => categories.iter().position(|c| c == n).unwrap_or(0) as f64,
    }
}

/// The positions of each key's items.
fn key_index(items: &[Item]) -> BTreeMap<SeriesKey, Vec<usize>> {
    let mut m: BTreeMap<SeriesKey, Vec<usize>> = BTreeMap::new();
    for (i, it) in items.iter().enumerate() {
        m.entry(it.key.clone()).or_default().push(i);
    }
    m
}

/// The items of `group`'s keys, in their order in `all`.
fn of_group<'a>(
    all: &'a [Item],
    index: &BTreeMap<SeriesKey, Vec<usize>>,
    group: &[SeriesKey],
) -> Vec<&'a Item> {
    let mut v: Vec<usize> = group
        .iter()
        .flat_map(|k| index.get(k).into_iter().flatten().copied())
        .collect();
    v.sort_unstable();
    v.into_iter().map(|i| &all[i]).collect()
}

/// The CPU items of a record: netgap's threads at the client and server
/// ends of a point-to-point test, or the mean over the server and the
/// client hosts of a workload point (each its role's agent and the
/// processes the role started).
fn cpu_items(key: &SeriesKey, l: &Loaded, x: f64) -> Vec<Item> {
    if let Some(c) = l.record.cpu {
        return vec![
            Item::new(key.clone(), l, x, c.local.process_percent).sub(0, "client"),
            Item::new(key.clone(), l, x, c.remote.process_percent).sub(1, "server"),
        ];
    }
    let mut out = Vec::new();
    for (i, role) in ["server", "client"].into_iter().enumerate() {
        let v: Vec<f64> = l
            .record
            .hosts_cpu()
            .iter()
            .filter(|h| h.role == role)
            .map(|h| h.cpu.process_percent)
            .collect();
        if let Some(mean) = netgap_core::stats::mean(&v) {
            let name = if role == "client" {
                "clients (mean)"
            } else {
                role
            };
            out.push(Item::new(key.clone(), l, x, mean).sub(i, name));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use netgap_core::spec::TransportOptions;
    use netgap_core::stack::{PathIdentity, Stack};

    fn key(transport: &str, mtu: u32) -> SeriesKey {
        let path = PathIdentity {
            kind: Some("testbed".into()),
            mtu_bytes: Some(mtu),
            ..PathIdentity::default()
        };
        SeriesKey {
            stack: Stack::new(
                transport,
                Mode::Event,
                &TransportOptions::default(),
                path,
                None,
            ),
            hosts: None,
            variant: Vec::new(),
        }
    }

    #[test]
    fn many_series_split_into_conditions_and_stacks() {
        // tcp under six MTUs, and six other stacks at MTU 1500.
        let mut keys: Vec<SeriesKey> = [1500, 3000, 4000, 6000, 9000, 15000]
            .iter()
            .map(|m| key("tcp", *m))
            .collect();
        for t in ["unix", "shm", "uring", "udp", "xdp", "mptcp"] {
            keys.push(key(t, 1500));
        }
        let groups = split(&keys, 8);
        assert_eq!(groups.len(), 2, "{groups:?}");
        assert!(groups.iter().all(|g| g.1.len() <= 8));
        assert_eq!(groups[0].0, "tcp under each condition");
        assert_eq!(groups[0].1.len(), 6);
        assert!(groups[1].0.starts_with("stacks at testbed, MTU 1500"));
        // The six stacks and tcp at their condition, for reference.
        assert_eq!(groups[1].1.len(), 7);
        let all: BTreeSet<&SeriesKey> = groups.iter().flat_map(|g| g.1.iter()).collect();
        assert_eq!(all.len(), keys.len(), "no series lost");
    }

    /// A web zipf record with the options given, as a results file has it.
    fn zipf(options: &str) -> ResultRecord {
        let line = format!(
            r#"{{"test":"web","transport":"tcp","mode":"event","size_bytes":1024,
            "metric":"transactions_per_s","value":5000.0,"percentiles":null,
            "service_demand_us_per_kib":null,"datagrams":null,"warnings":[],
            "version":"0.1.0","time":"2026-11-22T08:00:00Z","clients":12,
            "app":{{"options":{options}}}}}"#
        );
        serde_json::from_str(&line).expect("a record")
    }

    #[test]
    fn a_zipf_point_without_alpha_is_drawn_at_the_default_apart_from_named_ones() {
        let records = [
            zipf(r#"{"trace":"zipf","alpha":0.8}"#),
            zipf(r#"{"trace":"zipf","alpha":1.0}"#),
            zipf(r#"{"trace":"zipf"}"#),
        ];
        let spec = FigureSpec {
            cpu_beside: false,
            ..FigureSpec::new("Figure 8b", XAxis::Alpha)
        };
        let figs = figures(&spec, &records);
        assert_eq!(figs.len(), 1);
        let Plot::Line(p) = &figs[0].panels[0] else {
            panic!("a line plot")
        };
        let xs: Vec<Vec<f64>> = p
            .series
            .iter()
            .map(|s| s.points.iter().map(|q| q.0).collect())
            .collect();
        assert_eq!(xs, [vec![1.0], vec![0.8, 1.0]], "{:?}", p.series);
        assert!(p.series[0].name.contains("alpha=default"));
        let svg = figure_svg(&spec, &records);
        assert_eq!(svg.matches("<svg").count(), 1);
        assert!(svg.contains("data-x-scale=\"linear\""));
    }

    #[test]
    fn few_series_stay_in_one_plot() {
        let keys = vec![key("tcp", 1500), key("unix", 1500)];
        assert_eq!(split(&keys, 8), vec![(String::new(), keys.clone())]);
    }
}
