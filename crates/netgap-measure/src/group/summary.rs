//! From the agents' per-flow reports of each repetition to the point's
//! [`ResultRecord`]: per-flow values and bytes, the aggregate headline with
//! its statistics over repetitions, latency percentiles, per-link results
//! and the CPU and peak memory of every host.

use super::coordinator::{place, GroupCoordinator, GroupError};
use super::plan::{GroupPlan, GroupPoint};
use super::{GroupMetric, Kind};
use crate::coordinator::Observer;
use netgap_core::cpu::CpuUsage;
use netgap_core::record::{ByteCounts, FlowResult, HostCpu, LinkResult, RecordStats, ResultRecord};
use netgap_core::stats::{noise_warning, LatencyHistogram, Summary, NOISY_CV};
use netgap_proto::group::{Direction, FlowReport};
use std::time::SystemTime;

/// Per-flow accumulation over repetitions.
#[derive(Clone, Default)]
struct FlowAcc {
    values: Vec<f64>,
    bytes_tx: u64,
    bytes_rx: u64,
    window_bytes: u64,
    percentiles: Option<netgap_core::stats::Percentiles>,
}

/// The global index of flow `local` as numbered by link `h`: the server
/// (link 0) numbers every flow of the point; client link `h` numbers its own
/// flows in increasing global order. `None` for a flow the point does not
/// have.
fn global_index(host_of: &[usize], h: usize, local: u32) -> Option<usize> {
    if h == 0 {
        return Some(local as usize).filter(|&g| g < host_of.len());
    }
    host_of
        .iter()
        .enumerate()
        .filter(|(_, &x)| x == h)
        .nth(local as usize)
        .map(|(i, _)| i)
}

/// A flow's value in its test's unit, from the report of the end that
/// measures it over a window of `window_ns`: Gbit/s received in the window
/// (bandwidth, receiving end), mean one-way latency in µs (hotspot; NaN
/// without a round trip), connections per second (connect).
fn flow_value(kind: Kind, fr: &FlowReport, window_ns: u64) -> f64 {
    match kind {
        Kind::Stream(_) => crate::bench::gbps(fr.window_bytes_rx, window_ns),
        // Round trips run back to back, so each took window / count.
        Kind::PingPong if fr.round_trips > 0 => {
            window_ns as f64 / fr.round_trips as f64 / 2.0 / 1000.0
        }
        Kind::PingPong => f64::NAN,
        Kind::Connect if window_ns > 0 => fr.round_trips as f64 / (window_ns as f64 / 1e9),
        Kind::Connect => 0.0,
    }
}

/// A repetition's headline from its per-flow values: the sum (aggregate
/// bandwidth, connections per second) or the mean over clients (latency).
/// `None` if a client has no latency (no round trip in the window).
fn headline(metric: GroupMetric, values: &[f64]) -> Option<f64> {
    match metric {
        GroupMetric::BandwidthGbps | GroupMetric::ConnectionsPerS => Some(values.iter().sum()),
        GroupMetric::LatencyUs => {
            if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
                return None;
            }
            Some(values.iter().sum::<f64>() / values.len() as f64)
        }
    }
}

/// Measures every repetition of `point` and builds its record.
pub(super) fn measure_point(
    coord: &mut GroupCoordinator,
    point: &GroupPoint,
    plan: &GroupPlan,
    started: SystemTime,
    observer: &mut dyn Observer,
) -> Result<ResultRecord, GroupError> {
    let placement = place(point, &coord.links)?;
    let n = placement.host_of.len();
    let mut flows = vec![FlowAcc::default(); n];
    let mut rep_values = Vec::new();
    let mut cpu: Vec<Vec<CpuUsage>> = vec![Vec::new(); coord.links.len()];
    let mut rss: Vec<Option<u64>> = vec![None; coord.links.len()];
    let mut hist = LatencyHistogram::new();
    let mut bytes = ByteCounts {
        client_tx: 0,
        client_rx: 0,
        server_tx: 0,
        server_rx: 0,
    };
    let metric = point.test.metric;
    let receiver_is_server = matches!(point.test.kind, Kind::Stream(Direction::ToServer));
    for rep in 0..plan.reps {
        let r = coord.rep(point, &placement, plan)?;
        hist.merge(&r.hist);
        let mut per_flow_value = vec![0.0; n];
        for (h, reports, outcome) in &r.reports {
            cpu[*h].push(outcome.cpu);
            if *h == 0 {
                bytes.server_tx += outcome.bytes_tx;
                bytes.server_rx += outcome.bytes_rx;
            } else {
                bytes.client_tx += outcome.bytes_tx;
                bytes.client_rx += outcome.bytes_rx;
            }
            rss[*h] = rss[*h].max(outcome.peak_rss_kib);
            for fr in reports {
                let Some(g) = global_index(&placement.host_of, *h, fr.index) else {
                    return Err(
                        coord.host_error(*h, format!("report of unknown flow {}", fr.index))
                    );
                };
                let acc = &mut flows[g];
                let is_client = *h != 0;
                match point.test.kind {
                    Kind::Stream(_) => {
                        if is_client != receiver_is_server {
                            // The receiving end.
                            acc.bytes_rx += fr.bytes_rx;
                            acc.window_bytes += fr.window_bytes_rx;
                            per_flow_value[g] = flow_value(point.test.kind, fr, outcome.window_ns);
                        } else {
                            acc.bytes_tx += fr.bytes_tx;
                        }
                    }
                    Kind::PingPong | Kind::Connect if is_client => {
                        acc.bytes_tx += fr.bytes_tx;
                        acc.bytes_rx += fr.bytes_rx;
                        acc.percentiles = fr.percentiles.clone();
                        per_flow_value[g] = flow_value(point.test.kind, fr, outcome.window_ns);
                    }
                    _ => {}
                }
            }
        }
        for (acc, v) in flows.iter_mut().zip(&per_flow_value) {
            acc.values.push(*v);
        }
        let Some(value) = headline(metric, &per_flow_value) else {
            let idle = per_flow_value.iter().filter(|v| !v.is_finite()).count();
            return Err(GroupError::Point(format!(
                "{}: {idle} of {n} clients completed no round trip in the window; lengthen --duration",
                point.test.name
            )));
        };
        rep_values.push(value);
        observer.rep_done(rep);
    }
    let summary = Summary::from_reps(&rep_values).map_err(|e| GroupError::Point(e.to_string()))?;
    let flow_results: Vec<FlowResult> = flows
        .iter()
        .enumerate()
        .map(|(i, a)| FlowResult {
            host: coord.links[placement.host_of[i]].host.name.clone(),
            index: i as u32,
            value: netgap_core::stats::mean(&a.values).unwrap_or(0.0),
            bytes_tx: a.bytes_tx,
            bytes_rx: a.bytes_rx,
            percentiles: a.percentiles.clone(),
        })
        .collect();
    let links = placement
        .rails
        .iter()
        .zip(&flow_results)
        .zip(&flows)
        .map(|(((local, remote), f), a)| LinkResult {
            local: local.to_string(),
            remote: remote.to_string(),
            bytes: a.window_bytes,
            bandwidth_gbps: f.value,
        })
        .collect();
    let hosts_cpu = cpu
        .iter()
        .enumerate()
        .filter(|(_, c)| !c.is_empty())
        .map(|(h, c)| HostCpu {
            host: coord.links[h].host.name.clone(),
            role: if h == 0 { "server" } else { "client" }.into(),
            cpu: CpuUsage::mean(c),
            peak_rss_kib: rss[h],
        })
        .collect();
    let percentiles = match point.test.kind {
        Kind::PingPong => hist.percentiles_us(0.5),
        Kind::Connect => hist.percentiles_us(1.0),
        Kind::Stream(_) => None,
    };
    let mut options = plan.base.record_options(&point.spec);
    options.peer = plan.hosts.label();
    options.iterations = None;
    options.rep_time_ms = Some(plan.duration.as_millis() as u64);
    options.warmup = None;
    let used_hosts: Vec<usize> = {
        let mut h = placement.host_of.clone();
        h.sort_unstable();
        h.dedup();
        h
    };
    Ok(ResultRecord {
        test: point.test.name.into(),
        transport: point.spec.transport.clone(),
        mode: point.spec.mode,
        size_bytes: point.spec.size_bytes,
        metric: metric.key().into(),
        value: summary.value,
        stats: Some(RecordStats::from(&summary)),
        percentiles,
        cpu: None,
        service_demand_us_per_kib: None,
        iterations_per_rep: None,
        warmup_iterations: None,
        bytes: Some(bytes),
        datagrams: None,
        warnings: noise_warning(&summary, NOISY_CV).into_iter().collect(),
        host: Some(coord.local.clone()),
        peer_host: Some(coord.links[0].facts.clone()),
        options: Some(options),
        version: netgap_core::VERSION.into(),
        time: humantime::format_rfc3339_seconds(started).to_string(),
        tool: None,
        sweep_kind: None,
        block_time_us: None,
        dropout: None,
        ci_target: None,
        clients: Some(n as u32),
        client_hosts: Some(used_hosts.len() as u32),
        flows: flow_results,
        hosts_cpu,
        links,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(index: u32, window_bytes_rx: u64, round_trips: u64) -> FlowReport {
        FlowReport {
            index,
            bytes_tx: 0,
            bytes_rx: window_bytes_rx,
            window_bytes_rx,
            round_trips,
            percentiles: None,
            errors: 0,
        }
    }

    #[test]
    fn clients_number_their_flows_in_global_order() {
        // 4 clients over 3 client hosts (links 1..=3): 1, 2, 3, 1.
        let host_of = [1, 2, 3, 1];
        assert_eq!(global_index(&host_of, 1, 0), Some(0));
        assert_eq!(global_index(&host_of, 1, 1), Some(3));
        assert_eq!(global_index(&host_of, 3, 0), Some(2));
        assert_eq!(global_index(&host_of, 3, 1), None);
        assert_eq!(global_index(&host_of, 0, 3), Some(3));
        assert_eq!(global_index(&host_of, 0, 4), None);
    }

    #[test]
    fn flow_values_in_their_units() {
        let second = 1_000_000_000;
        // 1.25e9 bytes in 1 s is 10 Gbit/s.
        let bw = flow_value(
            Kind::Stream(Direction::ToServer),
            &report(0, 1_250_000_000, 0),
            second,
        );
        assert!((bw - 10.0).abs() < 1e-9);
        // 10,000 back-to-back round trips in 1 s: 100 us each, 50 us one way.
        let lat = flow_value(Kind::PingPong, &report(0, 0, 10_000), second);
        assert!((lat - 50.0).abs() < 1e-9);
        assert!(flow_value(Kind::PingPong, &report(0, 0, 0), second).is_nan());
        let cps = flow_value(Kind::Connect, &report(0, 0, 500), second / 2);
        assert!((cps - 1000.0).abs() < 1e-9);
    }

    #[test]
    fn headline_sums_bandwidth_and_averages_latency() {
        assert_eq!(
            headline(GroupMetric::BandwidthGbps, &[1.0, 2.0, 3.0]),
            Some(6.0)
        );
        assert_eq!(
            headline(GroupMetric::ConnectionsPerS, &[10.0, 5.0]),
            Some(15.0)
        );
        assert_eq!(headline(GroupMetric::LatencyUs, &[10.0, 20.0]), Some(15.0));
        assert_eq!(headline(GroupMetric::LatencyUs, &[10.0, f64::NAN]), None);
        assert_eq!(headline(GroupMetric::LatencyUs, &[]), None);
    }
}
