//! Which plots a test's records make, as the studies draw them, through
//! [`crate::figure`]: the metric against the test's own x axis (message
//! size; clients, streams, links or hosts of a workload; a web run's file
//! size, or Zipf alpha for its zipf trace; a pipeline's unit-of-work size;
//! pio's server/client shapes) with CPU beside it, one series per identity
//! ([`SeriesKey`]), at most eight a plot. Then the sweep's signature graph
//! (throughput against block time), latency percentiles and service
//! demand; LogP's parameters share one plot.

use super::figure::{self, metric_label, Figure, FigureSpec, Item, XAxis, YScale};
use super::load::Loaded;
use super::stacks::SeriesKey;
use super::svg::{Axis, LinePlot, Plot};
use std::collections::{BTreeMap, BTreeSet};

/// Labels of a test's series, from [`super::stacks::labels`].
pub type Labels = BTreeMap<SeriesKey, String>;

/// The x axes of a test's records, each with the records it plots: the
/// axis the study draws the test against, chosen per record so that no
/// record is left out (a web run's zipf points against alpha, its single
/// trace points against file size).
fn axes<'a>(recs: &[&'a Loaded]) -> Vec<(XAxis, Vec<&'a Loaded>)> {
    if !recs.iter().any(|l| l.record.clients().is_some()) {
        return vec![(XAxis::MessageSize, recs.to_vec())];
    }
    let varies = |rs: &[&Loaded], f: fn(&Loaded) -> Option<u64>| {
        rs.iter().map(|l| f(l)).collect::<BTreeSet<_>>().len() > 1
    };
    let size = |l: &Loaded| Some(l.record.size_bytes);
    let mut out: Vec<(XAxis, Vec<&Loaded>)> = Vec::new();
    let mut put = |x: XAxis, l: &'a Loaded| match out.iter_mut().find(|(a, _)| *a == x) {
        Some((_, v)) => v.push(l),
        None => out.push((x, vec![l])),
    };
    let single: Vec<&Loaded> = recs.iter().copied().filter(|l| !is_zipf(l)).collect();
    let single_sizes_vary = varies(&single, size);
    let sizes_vary = varies(recs, size);
    for l in recs {
        let x = match l.record.test.as_str() {
            "web" if is_zipf(l) => XAxis::Alpha,
            "web" if single_sizes_vary => XAxis::FileSize,
            "pipeline" if sizes_vary => XAxis::UnitSize,
            "pipeline" | "gather" => XAxis::Hosts,
            "pio" => XAxis::PioShape,
            "multistream" => XAxis::Streams,
            "multirail" => XAxis::Links,
            _ if l.record.clients().is_none() => XAxis::MessageSize,
            _ => XAxis::Clients,
        };
        put(x, l);
    }
    out
}

/// Whether a web record ran the zipf trace.
fn is_zipf(l: &Loaded) -> bool {
    l.record.test == "web"
        && l.record
            .workload
            .as_ref()
            .and_then(|w| w.app.as_ref())
            .and_then(|a| a.options.get("trace"))
            .and_then(|v| v.as_str())
            == Some("zipf")
}

/// Every figure of one test's records (`section` is the test as the report
/// names it), in a stable order.
pub fn figures(section: &str, recs: &[&Loaded]) -> Vec<Figure> {
    if recs.iter().all(|l| l.record.test == "logp") {
        return logp(section, recs);
    }
    let mut out = Vec::new();
    for (x, recs) in axes(recs) {
        let spec = FigureSpec::new(section, x.clone());
        out.extend(figure::build(&spec, &recs));
        if x == XAxis::MessageSize {
            out.extend(size_extras(section, &recs));
        }
    }
    out
}

/// The figures of `items` split into plots of at most eight series.
fn split_figures(title: &str, x: &Axis, y_label: &str, items: &[Item]) -> Vec<Figure> {
    let mut keys: Vec<SeriesKey> = items
        .iter()
        .map(|i| i.key.clone())
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    keys.sort_by_key(SeriesKey::order);
    figure::split(&keys, figure::MAX_SERIES)
        .into_iter()
        .map(|(part, group)| {
            let in_group: Vec<&Item> = items.iter().filter(|i| group.contains(&i.key)).collect();
            let series = figure::series(&in_group, &group);
            let title = if part.is_empty() {
                title.to_string()
            } else {
                format!("{title} ({part})")
            };
            single(Plot::Line(LinePlot {
                title,
                x: x.clone(),
                y: figure::y_axis(y_label, YScale::Auto, &series),
                series,
                refs: Vec::new(),
            }))
        })
        .collect()
}

/// The signature graph, the percentiles and service demand of a test
/// plotted against size, where the records have them.
fn size_extras(section: &str, recs: &[&Loaded]) -> Vec<Figure> {
    let mut out = Vec::new();
    let mut by_metric: BTreeMap<&str, Vec<&Loaded>> = BTreeMap::new();
    for l in recs {
        by_metric
            .entry(l.record.metric.as_str())
            .or_default()
            .push(l);
    }
    for (metric, recs) in by_metric {
        let signature: Vec<Item> = recs
            .iter()
            .filter_map(|l| {
                let t = l.record.block_time_us()?;
                let mut it = Item::new(SeriesKey::of(l), l, t, l.record.value);
                it.ci = l.ci95();
                Some(it)
            })
            .collect();
        if !signature.is_empty() {
            out.extend(split_figures(
                &format!(
                    "{section}: signature graph ({} against block time)",
                    metric_label(metric)
                ),
                &Axis::log("time of one block transfer (µs)"),
                &metric_label(metric),
                &signature,
            ));
        }
    }
    let pct: Vec<Item> = recs
        .iter()
        .filter_map(|l| l.record.percentiles.as_ref().map(|p| (l, p)))
        .flat_map(|(l, p)| {
            let x = l.record.size_bytes as f64;
            [("p50", p.p50), ("p99", p.p99), ("p99.9", p.p999)]
                .into_iter()
                .enumerate()
                .map(move |(i, (n, v))| Item::new(SeriesKey::of(l), l, x, v).sub(i, n))
        })
        .collect();
    if !pct.is_empty() {
        out.extend(split_figures(
            &format!("{section}: latency percentiles against size"),
            &Axis::size(),
            "latency (µs, one-way)",
            &pct,
        ));
    }
    let demand: Vec<Item> = recs
        .iter()
        .filter_map(|l| l.record.service_demand_us_per_kib.map(|d| (l, d)))
        .flat_map(|(l, d)| {
            let x = l.record.size_bytes as f64;
            [
                Item::new(SeriesKey::of(l), l, x, d.local).sub(0, "client"),
                Item::new(SeriesKey::of(l), l, x, d.remote).sub(1, "server"),
            ]
        })
        .collect();
    if !demand.is_empty() {
        out.extend(split_figures(
            &format!("{section}: service demand against size"),
            &Axis::size(),
            "service demand (CPU µs per KiB moved)",
            &demand,
        ));
    }
    out
}

fn single(p: Plot) -> Figure {
    Figure { panels: vec![p] }
}

/// LogP's parameters share a unit (µs), so they are read best together.
fn logp(section: &str, recs: &[&Loaded]) -> Vec<Figure> {
    let params: BTreeSet<&str> = recs.iter().map(|l| l.record.metric.as_str()).collect();
    let items: Vec<Item> = recs
        .iter()
        .map(|l| {
            let m = l.record.metric.as_str();
            let rank = params.iter().position(|p| *p == m).unwrap_or(0);
            let param = m.trim_end_matches("_us").replace('_', " ");
            let mut it = Item::new(
                SeriesKey::of(l),
                l,
                l.record.size_bytes as f64,
                l.record.value,
            )
            .sub(rank, param);
            it.ci = l.ci95();
            it
        })
        .collect();
    split_figures(
        &format!("{section}: LogP parameters (o_s, o_r, g, L) against size"),
        &Axis::size(),
        "time (µs)",
        &items,
    )
}
