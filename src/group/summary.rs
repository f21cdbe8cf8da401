//! From the agents' per-flow reports of each repetition to the point's
//! [`ResultRecord`]: per-flow values and bytes, the aggregate headline with
//! its statistics over repetitions, latency percentiles, per-link results
//! and the CPU and peak memory of every host.

use super::coordinator::{place, GroupCoordinator, GroupError};
use super::plan::{GroupPlan, GroupPoint};
use super::{GroupMetric, Kind};
use crate::coordinator::Observer;
use crate::cpu::CpuUsage;
use crate::proto::group::Direction;
use crate::record::{ByteCounts, FlowResult, HostCpu, LinkResult, RecordStats, ResultRecord};
use crate::stats::{noise_warning, LatencyHistogram, Summary, NOISY_CV};
use std::time::SystemTime;

/// Per-flow accumulation over repetitions.
#[derive(Clone, Default)]
struct FlowAcc {
    values: Vec<f64>,
    bytes_tx: u64,
    bytes_rx: u64,
    window_bytes: u64,
    percentiles: Option<crate::stats::Percentiles>,
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
        // Global flow index of a link's local flow index.
        let global = |h: usize, local: u32| -> Option<usize> {
            if h == 0 {
                Some(local as usize)
            } else {
                placement
                    .host_of
                    .iter()
                    .enumerate()
                    .filter(|(_, &x)| x == h)
                    .nth(local as usize)
                    .map(|(i, _)| i)
            }
        };
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
                let Some(g) = global(*h, fr.index).filter(|&g| g < n) else {
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
                            per_flow_value[g] =
                                crate::bench::gbps(fr.window_bytes_rx, outcome.window_ns);
                        } else {
                            acc.bytes_tx += fr.bytes_tx;
                        }
                    }
                    Kind::PingPong | Kind::Connect if is_client => {
                        acc.bytes_tx += fr.bytes_tx;
                        acc.bytes_rx += fr.bytes_rx;
                        acc.percentiles = fr.percentiles.clone();
                        let secs = outcome.window_ns as f64 / 1e9;
                        per_flow_value[g] = match point.test.kind {
                            Kind::PingPong if fr.round_trips > 0 => {
                                outcome.window_ns as f64 / fr.round_trips as f64 / 2.0 / 1000.0
                            }
                            Kind::PingPong => f64::NAN,
                            _ if secs > 0.0 => fr.round_trips as f64 / secs,
                            _ => 0.0,
                        };
                    }
                    _ => {}
                }
            }
        }
        for (acc, v) in flows.iter_mut().zip(&per_flow_value) {
            acc.values.push(*v);
        }
        let value = match metric {
            GroupMetric::BandwidthGbps | GroupMetric::ConnectionsPerS => {
                per_flow_value.iter().sum::<f64>()
            }
            GroupMetric::LatencyUs => {
                let ok: Vec<f64> = per_flow_value
                    .iter()
                    .copied()
                    .filter(|v| v.is_finite())
                    .collect();
                if ok.len() != n {
                    return Err(GroupError::Point(format!(
                        "{}: {} of {n} clients completed no round trip in the window; lengthen --duration",
                        point.test.name,
                        n - ok.len()
                    )));
                }
                ok.iter().sum::<f64>() / n.max(1) as f64
            }
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
            value: crate::stats::mean(&a.values).unwrap_or(0.0),
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
        version: crate::VERSION.into(),
        time: humantime::format_rfc3339_seconds(started).to_string(),
        tool: None,
        clients: Some(n as u32),
        client_hosts: Some(used_hosts.len() as u32),
        flows: flow_results,
        hosts_cpu,
        links,
    })
}
