//! Which plots a set of records makes. One series per stack (transport and
//! mode, or the peer tool that measured it) and host: latency against size
//! on log-log axes, bandwidth against size on a log size axis, latency
//! percentiles, sweep throughput with its dropouts called out and the
//! signature graph (throughput against block time), metrics against the
//! number of clients or streams, CPU and service demand per stack, and every
//! other metric (LogP's parameters among them) against size.

use super::load::{lower_is_better, Loaded};
use super::svg::{Axis, BarChart, LinePlot, Mark, Plot, Series};
use std::collections::BTreeMap;

/// The name of a record's stack: `tcp/event`, or `tcp [iperf3]` for an
/// imported record; with `@host` when the report spans several hosts.
pub(crate) fn stack_label(l: &Loaded, with_host: bool) -> String {
    let r = &l.record;
    let mut s = match &r.tool {
        Some(tool) => format!("{} [{tool}]", r.transport),
        None => format!("{}/{}", r.transport, r.mode),
    };
    if with_host {
        if let Some(h) = &r.host {
            s.push_str(" @");
            s.push_str(&h.hostname);
        }
    }
    s
}

/// Whether the records come from more than one host.
pub(crate) fn several_hosts(records: &[Loaded]) -> bool {
    let mut hosts = records
        .iter()
        .filter_map(|l| l.record.host.as_ref().map(|h| h.hostname.as_str()));
    match hosts.next() {
        Some(first) => hosts.any(|h| h != first),
        None => false,
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
        m => {
            let unit = m.rsplit('_').next().unwrap_or("");
            let name = m.strip_suffix(unit).unwrap_or(m).trim_end_matches('_');
            format!("{} ({unit})", name.replace('_', " "))
        }
    }
}

/// Groups `(series name, x, y, record)` into series sorted by name then x.
fn series_of<'a>(
    items: impl Iterator<Item = (String, f64, f64, &'a Loaded)>,
    marks: impl Fn(&Loaded, f64, f64) -> Option<Mark>,
) -> Vec<Series> {
    let mut by: BTreeMap<String, Vec<(f64, f64, Option<Mark>)>> = BTreeMap::new();
    for (name, x, y, l) in items {
        by.entry(name).or_default().push((x, y, marks(l, x, y)));
    }
    by.into_iter()
        .map(|(name, mut pts)| {
            pts.sort_by(|a, b| a.0.total_cmp(&b.0));
            // A repeated x (the same point in two files) keeps the last.
            pts.dedup_by(|later, earlier| {
                if later.0 == earlier.0 {
                    std::mem::swap(later, earlier);
                    true
                } else {
                    false
                }
            });
            Series {
                name,
                marks: pts.iter().filter_map(|p| p.2.clone()).collect(),
                points: pts.into_iter().map(|(x, y, _)| (x, y)).collect(),
            }
        })
        .collect()
}

fn no_marks(_: &Loaded, _: f64, _: f64) -> Option<Mark> {
    None
}

/// Every plot for `records`, in a stable order.
pub fn plots(records: &[Loaded]) -> Vec<Plot> {
    let hosts = several_hosts(records);
    let mut groups: BTreeMap<(String, String), Vec<&Loaded>> = BTreeMap::new();
    let logp: Vec<&Loaded> = records.iter().filter(|l| l.record.test == "logp").collect();
    for l in records.iter().filter(|l| l.record.test != "logp") {
        groups
            .entry((l.record.test.clone(), l.record.metric.clone()))
            .or_default()
            .push(l);
    }
    let mut out = Vec::new();
    for ((test, metric), recs) in &groups {
        let y_axis = if lower_is_better(metric) {
            Axis::log(&metric_label(metric))
        } else {
            Axis::linear(&metric_label(metric))
        };
        let multi_client = recs.iter().any(|l| l.extras.clients.is_some());
        if multi_client {
            // Metric against clients: one series per stack and size.
            let series = series_of(
                recs.iter().filter_map(|l| {
                    let c = l.extras.clients?;
                    let name = format!(
                        "{} {}",
                        stack_label(l, hosts),
                        netgap_core::units::format_size(l.record.size_bytes)
                    );
                    Some((name, f64::from(c), l.record.value, *l))
                }),
                no_marks,
            );
            out.push(Plot::Line(LinePlot {
                title: format!("{test}: {} against clients", metric_label(metric)),
                x: Axis::linear("concurrent clients, streams or links"),
                y: Axis::linear(&metric_label(metric)),
                series,
            }));
            continue;
        }
        let series = series_of(
            recs.iter().map(|l| {
                (
                    stack_label(l, hosts),
                    l.record.size_bytes as f64,
                    l.record.value,
                    *l,
                )
            }),
            |l, x, y| {
                l.extras.dropout.as_ref().map(|d| Mark {
                    x,
                    y,
                    note: format!("dropout -{:.0}%", d.depth_pct),
                })
            },
        );
        let dropouts = series.iter().any(|s| !s.marks.is_empty());
        let title = if dropouts {
            format!(
                "{test}: {} against size, dropouts circled",
                metric_label(metric)
            )
        } else {
            format!("{test}: {} against size", metric_label(metric))
        };
        out.push(Plot::Line(LinePlot {
            title,
            x: Axis::size(),
            y: y_axis,
            series,
        }));
        if recs.iter().any(|l| l.extras.block_time_us.is_some()) {
            let series = series_of(
                recs.iter().filter_map(|l| {
                    let t = l.extras.block_time_us?;
                    Some((stack_label(l, hosts), t, l.record.value, *l))
                }),
                no_marks,
            );
            out.push(Plot::Line(LinePlot {
                title: format!(
                    "{test}: signature graph ({} against block time)",
                    metric_label(metric)
                ),
                x: Axis::log("time of one block transfer (µs)"),
                y: Axis::linear(&metric_label(metric)),
                series,
            }));
        }
        if recs.iter().any(|l| l.record.percentiles.is_some()) {
            let mut items = Vec::new();
            for l in recs {
                if let Some(p) = &l.record.percentiles {
                    let stack = stack_label(l, hosts);
                    for (n, v) in [("p50", p.p50), ("p99", p.p99), ("p99.9", p.p999)] {
                        items.push((format!("{stack} {n}"), l.record.size_bytes as f64, v, *l));
                    }
                }
            }
            let series = series_of(items.into_iter(), no_marks);
            out.push(Plot::Line(LinePlot {
                title: format!("{test}: latency percentiles against size"),
                x: Axis::size(),
                y: Axis::log("latency (µs, one-way)"),
                series,
            }));
        }
        if recs
            .iter()
            .any(|l| l.record.service_demand_us_per_kib.is_some())
        {
            let mut items = Vec::new();
            for l in recs {
                if let Some(d) = &l.record.service_demand_us_per_kib {
                    let stack = stack_label(l, hosts);
                    for (n, v) in [("client", d.local), ("server", d.remote)] {
                        items.push((format!("{stack} {n}"), l.record.size_bytes as f64, v, *l));
                    }
                }
            }
            let series = series_of(items.into_iter(), no_marks);
            out.push(Plot::Line(LinePlot {
                title: format!("{test}: service demand against size"),
                x: Axis::size(),
                y: Axis::log("service demand (CPU µs per KiB moved)"),
                series,
            }));
        }
    }
    if !logp.is_empty() {
        // LogP's parameters share a unit (µs), so they are read best together.
        let series = series_of(
            logp.iter().map(|l| {
                let param = l.record.metric.trim_end_matches("_us").replace('_', " ");
                let name = format!("{} {param}", stack_label(l, hosts));
                (name, l.record.size_bytes as f64, l.record.value, *l)
            }),
            no_marks,
        );
        out.push(Plot::Line(LinePlot {
            title: "logp: LogP parameters (o_s, o_r, g, L) against size".into(),
            x: Axis::size(),
            y: Axis::log("time (µs)"),
            series,
        }));
    }
    if let Some(cpu) = cpu_bars(records, hosts) {
        out.push(Plot::Bars(cpu));
    }
    out
}

/// CPU per stack and test: the mean, over the stack's points, of each
/// role's CPU time as a percent of one core; multi-host points add one row
/// per host.
fn cpu_bars(records: &[Loaded], hosts: bool) -> Option<BarChart> {
    let mut rows: BTreeMap<String, [Vec<f64>; 2]> = BTreeMap::new();
    for l in records {
        let base = format!("{} {}", l.record.test, stack_label(l, hosts));
        if let Some(c) = &l.record.cpu {
            let e = rows.entry(base.clone()).or_default();
            e[0].push(c.local.process_percent);
            e[1].push(c.remote.process_percent);
        }
        for h in &l.extras.hosts_cpu {
            let e = rows.entry(format!("{base} on {}", h.host)).or_default();
            let i = usize::from(h.role == "server");
            e[i].push(h.cpu.process_percent);
        }
    }
    if rows.is_empty() {
        return None;
    }
    let mean = |v: &[f64]| netgap_core::stats::mean(v);
    Some(BarChart {
        title: "CPU per stack (mean over its points)".into(),
        value_label: "CPU time of netgap's threads (% of one core)".into(),
        groups: vec!["client".into(), "server".into()],
        rows: rows
            .into_iter()
            .map(|(k, [c, s])| (k, vec![mean(&c), mean(&s)]))
            .collect(),
    })
}
