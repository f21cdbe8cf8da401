//! Which plots a test's records make, as the studies draw them. One series
//! per stack identity and hosts ([`SeriesKey`]), labelled by what sets it
//! apart from the others of the test; poll and event of one stack are
//! adjacent, in one colour with different dashes. Every point carries its
//! 95% confidence bar. The metric against size (or against clients for
//! multi-client tests) has CPU of both ends beside it, per size (or per
//! number of clients), as 000's Figure 3b puts CPU beside bandwidth. A value
//! axis is logarithmic where the values span more than a decade. Then the
//! sweep's signature graph (throughput against block time), latency
//! percentiles and service demand; LogP's parameters share one plot.

use super::load::Loaded;
use super::stacks::SeriesKey;
use super::svg::{Axis, LinePlot, Mark, Plot, Series};
use netgap_core::spec::Mode;
use netgap_core::units::format_size;
use std::collections::{BTreeMap, BTreeSet};

/// Labels of a test's series, from [`super::stacks::labels`].
pub type Labels = BTreeMap<SeriesKey, String>;

/// Plots shown side by side: a metric and the CPU that went with it, or a
/// single plot.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The panels, left to right.
    pub panels: Vec<Plot>,
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
const CPU_LABEL: &str = "CPU of netgap's threads (% of one core)";

/// One point of a series being built.
struct Item {
    key: SeriesKey,
    /// What the series shows of its stack beyond the metric (`client`,
    /// `p99`, a size), with its rank among such parts.
    sub: (usize, String),
    x: f64,
    y: f64,
    ci: Option<(f64, f64)>,
    mark: Option<Mark>,
    /// The record's result passes its path's limit: drawn as a fault, not
    /// as a point of the line.
    fault: bool,
}

impl Item {
    fn new(l: &Loaded, x: f64, y: f64) -> Item {
        Item {
            key: SeriesKey::of(l),
            sub: (0, String::new()),
            x,
            y,
            ci: None,
            mark: None,
            fault: l.record.fault().is_some(),
        }
    }

    fn sub(mut self, rank: usize, name: impl Into<String>) -> Item {
        self.sub = (rank, name.into());
        self
    }
}

/// Groups items into series ordered so that a stack's modes, and its
/// parts, are adjacent: one colour per stack family (poll and event alike),
/// the dash by mode and part. A repeated x in a series (the same point in
/// two files) keeps the later record.
fn series(items: Vec<Item>, labels: &Labels) -> Vec<Series> {
    type Pts = Vec<(f64, f64, Option<(f64, f64)>, Option<Mark>)>;
    type Order = ((SeriesKey, Mode), (usize, String));
    let mut by: BTreeMap<Order, (SeriesKey, Pts)> = BTreeMap::new();
    let mut faults: BTreeMap<Order, Vec<Mark>> = BTreeMap::new();
    for it in items {
        let order = (it.key.order(), it.sub.clone());
        let entry = by
            .entry(order.clone())
            .or_insert_with(|| (it.key.clone(), Vec::new()));
        // A faulted point is no point of its line: only its own mark.
        if it.fault {
            faults.entry(order).or_default().push(Mark {
                x: it.x,
                y: it.y,
                note: "fault".into(),
                fault: true,
            });
        } else {
            entry.1.push((it.x, it.y, it.ci, it.mark));
        }
    }
    let families: Vec<SeriesKey> = by
        .keys()
        .map(|((f, _), _)| f.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    by.into_iter()
        .map(|(order, (key, mut pts))| {
            let fault_marks = faults.remove(&order).unwrap_or_default();
            let ((family, mode), (rank, sub)) = order;
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            pts.dedup_by(|later, earlier| {
                if later.0 == earlier.0 {
                    std::mem::swap(later, earlier);
                    true
                } else {
                    false
                }
            });
            let label = labels.get(&key).cloned().unwrap_or_default();
            let name = if sub.is_empty() {
                label
            } else {
                format!("{label} {sub}")
            };
            let mode_rank = usize::from(mode == Mode::Poll);
            Series {
                name,
                errors: pts.iter().map(|p| p.2).collect(),
                marks: pts
                    .iter()
                    .filter_map(|p| p.3.clone())
                    .chain(fault_marks)
                    .collect(),
                points: pts.iter().map(|p| (p.0, p.1)).collect(),
                colour: families.iter().position(|f| *f == family).unwrap_or(0),
                dash: mode_rank + 2 * rank,
            }
        })
        .collect()
}

/// The y values a plot's series show, confidence bars included.
fn y_values(series: &[Series]) -> Vec<f64> {
    series
        .iter()
        .flat_map(|s| {
            s.points
                .iter()
                .map(|p| p.1)
                .chain(s.errors.iter().flatten().flat_map(|e| [e.0, e.1]))
                .chain(s.marks.iter().filter(|m| m.fault).map(|m| m.y))
        })
        .collect()
}

/// A line plot whose y axis is logarithmic when its values span more than a
/// decade.
fn line(title: String, x: Axis, y_label: &str, series: Vec<Series>) -> Plot {
    let y = Axis::auto(y_label, y_values(&series));
    Plot::Line(LinePlot {
        title,
        x,
        y,
        series,
    })
}

/// Every figure of one test's records (`section` is the test as the report
/// names it), in a stable order.
pub fn figures(section: &str, recs: &[&Loaded], labels: &Labels) -> Vec<Figure> {
    if recs.iter().all(|l| l.record.test == "logp") {
        return vec![logp(section, recs, labels)];
    }
    let mut by_metric: BTreeMap<&str, Vec<&Loaded>> = BTreeMap::new();
    for l in recs {
        by_metric
            .entry(l.record.metric.as_str())
            .or_default()
            .push(l);
    }
    let mut out = Vec::new();
    for (metric, recs) in by_metric {
        if recs.iter().any(|l| l.extras.clients.is_some()) {
            out.push(against_clients(section, metric, &recs, labels));
        } else {
            out.extend(against_size(section, metric, &recs, labels));
        }
    }
    out
}

/// The metric against size with CPU beside it, then the signature graph,
/// the percentiles and service demand where the records have them.
fn against_size(section: &str, metric: &str, recs: &[&Loaded], labels: &Labels) -> Vec<Figure> {
    let mut out = Vec::new();
    let items = recs
        .iter()
        .map(|l| {
            let (x, y) = (l.record.size_bytes as f64, l.record.value);
            let mut it = Item::new(l, x, y);
            it.ci = l.ci95();
            it.mark = l.extras.dropout.as_ref().map(|d| Mark {
                x,
                y,
                note: format!("dropout -{:.0}%", d.depth_pct),
                fault: false,
            });
            it
        })
        .collect();
    let main = series(items, labels);
    let dropouts = main.iter().any(|s| s.marks.iter().any(|m| !m.fault));
    let title = format!(
        "{section}: {} against size{}",
        metric_label(metric),
        if dropouts { ", dropouts circled" } else { "" }
    );
    let mut panels = vec![line(title, Axis::size(), &metric_label(metric), main)];
    let cpu: Vec<Item> = recs
        .iter()
        .filter_map(|l| l.record.cpu.map(|c| (l, c)))
        .flat_map(|(l, c)| {
            let x = l.record.size_bytes as f64;
            [
                Item::new(l, x, c.local.process_percent).sub(0, "client"),
                Item::new(l, x, c.remote.process_percent).sub(1, "server"),
            ]
        })
        .collect();
    if !cpu.is_empty() {
        panels.push(Plot::Line(LinePlot {
            title: format!("{section}: CPU of both ends against size"),
            x: Axis::size(),
            y: Axis::linear(CPU_LABEL),
            series: series(cpu, labels),
        }));
    }
    out.push(Figure { panels });
    if recs.iter().any(|l| l.extras.block_time_us.is_some()) {
        let items = recs
            .iter()
            .filter_map(|l| {
                let t = l.extras.block_time_us?;
                let mut it = Item::new(l, t, l.record.value);
                it.ci = l.ci95();
                Some(it)
            })
            .collect();
        out.push(single(line(
            format!(
                "{section}: signature graph ({} against block time)",
                metric_label(metric)
            ),
            Axis::log("time of one block transfer (µs)"),
            &metric_label(metric),
            series(items, labels),
        )));
    }
    let pct: Vec<Item> = recs
        .iter()
        .filter_map(|l| l.record.percentiles.as_ref().map(|p| (l, p)))
        .flat_map(|(l, p)| {
            let x = l.record.size_bytes as f64;
            [("p50", p.p50), ("p99", p.p99), ("p99.9", p.p999)]
                .into_iter()
                .enumerate()
                .map(move |(i, (n, v))| Item::new(l, x, v).sub(i, n))
        })
        .collect();
    if !pct.is_empty() {
        out.push(single(line(
            format!("{section}: latency percentiles against size"),
            Axis::size(),
            "latency (µs, one-way)",
            series(pct, labels),
        )));
    }
    let demand: Vec<Item> = recs
        .iter()
        .filter_map(|l| l.record.service_demand_us_per_kib.map(|d| (l, d)))
        .flat_map(|(l, d)| {
            let x = l.record.size_bytes as f64;
            [
                Item::new(l, x, d.local).sub(0, "client"),
                Item::new(l, x, d.remote).sub(1, "server"),
            ]
        })
        .collect();
    if !demand.is_empty() {
        out.push(single(line(
            format!("{section}: service demand against size"),
            Axis::size(),
            "service demand (CPU µs per KiB moved)",
            series(demand, labels),
        )));
    }
    out
}

fn single(p: Plot) -> Figure {
    Figure { panels: vec![p] }
}

/// A multi-client test's metric against the number of clients, one series
/// per stack (and size, when several), with the CPU of the server and of
/// the client hosts beside it.
fn against_clients(section: &str, metric: &str, recs: &[&Loaded], labels: &Labels) -> Figure {
    let sizes: BTreeSet<u64> = recs.iter().map(|l| l.record.size_bytes).collect();
    let size_part = |l: &Loaded| {
        if sizes.len() > 1 {
            format!("{} ", format_size(l.record.size_bytes))
        } else {
            String::new()
        }
    };
    let rank = |l: &Loaded| {
        sizes
            .iter()
            .position(|s| *s == l.record.size_bytes)
            .unwrap_or(0)
    };
    let items = recs
        .iter()
        .filter_map(|l| {
            let c = l.extras.clients?;
            let mut it = Item::new(l, f64::from(c), l.record.value)
                .sub(rank(l), size_part(l).trim_end().to_string());
            it.ci = l.ci95();
            Some(it)
        })
        .collect();
    let mut panels = vec![line(
        format!("{section}: {} against clients", metric_label(metric)),
        Axis::linear("concurrent clients, streams or links"),
        &metric_label(metric),
        series(items, labels),
    )];
    let mut cpu = Vec::new();
    for l in recs {
        let Some(c) = l.extras.clients else { continue };
        let x = f64::from(c);
        for (i, role) in ["server", "client"].into_iter().enumerate() {
            let v: Vec<f64> = l
                .extras
                .hosts_cpu
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
                cpu.push(
                    Item::new(l, x, mean).sub(2 * rank(l) + i, format!("{}{name}", size_part(l))),
                );
            }
        }
    }
    if !cpu.is_empty() {
        panels.push(Plot::Line(LinePlot {
            title: format!("{section}: CPU of server and client hosts against clients"),
            x: Axis::linear("concurrent clients, streams or links"),
            y: Axis::linear(CPU_LABEL),
            series: series(cpu, labels),
        }));
    }
    Figure { panels }
}

/// LogP's parameters share a unit (µs), so they are read best together.
fn logp(section: &str, recs: &[&Loaded], labels: &Labels) -> Figure {
    let params: BTreeSet<&str> = recs.iter().map(|l| l.record.metric.as_str()).collect();
    let items = recs
        .iter()
        .map(|l| {
            let m = l.record.metric.as_str();
            let rank = params.iter().position(|p| *p == m).unwrap_or(0);
            let param = m.trim_end_matches("_us").replace('_', " ");
            let mut it = Item::new(l, l.record.size_bytes as f64, l.record.value).sub(rank, param);
            it.ci = l.ci95();
            it
        })
        .collect();
    single(line(
        format!("{section}: LogP parameters (o_s, o_r, g, L) against size"),
        Axis::size(),
        "time (µs)",
        series(items, labels),
    ))
}
