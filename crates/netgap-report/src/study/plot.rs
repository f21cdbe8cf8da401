//! A figure's plots in the study report: its series against its own
//! x-axis, and the CPU of both ends beside bandwidth.

use super::format::{fmt_num, unit_label};
use super::series::{series_name, series_of};
use crate::svg::{Axis, LinePlot, Plot, RefLine, Series};
use netgap_core::record::ResultRecord;
use netgap_core::study::{CpuEnd, CpuShare, Figure, Quantity};
use std::collections::BTreeMap;

/// The figure's plot: its series against its x-axis; a log axis where the
/// values span more than a decade, interval bars clipped at the axis, and
/// the path's payload limit drawn as a reference line.
pub(crate) fn figure_plot(fig: &Figure, recs: &[&ResultRecord]) -> Option<Plot> {
    let series = series_of(recs, &fig.series, fig.x, &fig.y);
    if series.is_empty() {
        return None;
    }
    let ys: Vec<f64> = series.values().flatten().map(|p| p.y).collect();
    let y_axis = Axis::auto(&unit_label(&fig.y), ys.iter().copied());
    let x_axis = if fig.x.is_bytes() {
        Axis {
            label: fig.x.title().to_string(),
            ..Axis::size()
        }
    } else {
        Axis::auto(fig.x.title(), series.values().flatten().map(|p| p.x))
    };
    let floor = ys
        .iter()
        .copied()
        .filter(|v| *v > 0.0)
        .fold(f64::MAX, f64::min);
    let lines: Vec<Series> = series
        .iter()
        .enumerate()
        .map(|(k, (name, pts))| Series {
            name: name.clone(),
            points: pts.iter().map(|p| (p.x, p.y)).collect(),
            errors: pts
                .iter()
                .map(|p| {
                    p.ci.map(|(lo, hi)| {
                        // A log axis cannot show a bar below zero: clip
                        // it at the axis' floor instead of dropping it.
                        let lo = if y_axis.log { lo.max(floor / 2.0) } else { lo };
                        (lo, hi)
                    })
                })
                .collect(),
            marks: Vec::new(),
            colour: k,
            dash: 0,
        })
        .collect();
    // The path's physical limit, drawn as the report's other figures
    // draw it: a reference line at the largest limit of the figure's
    // records.
    let mut refs = Vec::new();
    if fig.y == Quantity::Metric("bandwidth_gbps".into()) {
        if let Some(l) = recs
            .iter()
            .filter_map(|r| r.physics.as_ref()?.payload_limit_gbps)
            .fold(None, |m: Option<f64>, v| Some(m.map_or(v, |m| m.max(v))))
        {
            refs.push(RefLine {
                y: l,
                label: format!("path limit {} Gbit/s", fmt_num(l)),
            });
        }
    }
    Some(Plot::Line(LinePlot {
        title: format!("Figure {}", fig.id),
        x: x_axis,
        y: y_axis,
        series: lines,
        refs,
    }))
}

/// CPU beside bandwidth: each series' client and server process CPU.
pub(crate) fn cpu_plot(fig: &Figure, recs: &[&ResultRecord]) -> Option<Plot> {
    let mut lines = Vec::new();
    // One colour per series, solid for the client, dashed for the server.
    let names: Vec<String> = series_of(recs, &fig.series, fig.x, &fig.y)
        .into_keys()
        .collect();
    for (side, end) in [("client", CpuEnd::Local), ("server", CpuEnd::Remote)] {
        let cpu = Quantity::Cpu(end, CpuShare::Process);
        let mut by: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
        for r in recs {
            let (Some(x), Some((c, _))) = (fig.x.of(r), cpu.of(r)) else {
                continue;
            };
            by.entry(series_name(r, &fig.series))
                .or_default()
                .push((x, c));
        }
        for (name, mut pts) in by {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            lines.push(Series {
                colour: names.iter().position(|n| *n == name).unwrap_or(0),
                name: format!("{name} {side}"),
                points: pts,
                dash: usize::from(side == "server"),
                ..Series::default()
            });
        }
    }
    if lines.is_empty() {
        return None;
    }
    let x_axis = if fig.x.is_bytes() {
        Axis {
            label: fig.x.title().to_string(),
            ..Axis::size()
        }
    } else {
        Axis::linear(fig.x.title())
    };
    Some(Plot::Line(LinePlot {
        title: format!("Figure {}: CPU", fig.id),
        x: x_axis,
        y: Axis::linear("CPU (% of one core)"),
        series: lines,
        refs: Vec::new(),
    }))
}
