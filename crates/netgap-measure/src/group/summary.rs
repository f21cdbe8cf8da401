//! From the agents' per-flow reports of each repetition to the point's
//! [`ResultRecord`]: each report becomes its flow's value and bytes by the
//! workload's own rule ([`crate::workload::Workload::sample`]); then the
//! aggregate headline with its statistics over repetitions, latency
//! percentiles, per-link results and the CPU and peak memory of every host.

use super::coordinator::{place, GroupCoordinator, GroupError};
use super::plan::{GroupPlan, GroupPoint};
use crate::coordinator::Observer;
use netgap_core::cpu::CpuUsage;
use netgap_core::record::{
    ByteCounts, DatagramCounts, FlowResult, HostCpu, LinkResult, RecordStats, ResultRecord,
};
use netgap_core::stack::{PathIdentity, Stack};
use netgap_core::stats::{noise_warning, LatencyHistogram, Summary, NOISY_CV};
use netgap_proto::group::GroupRole;
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

/// Measures every repetition of `point` and builds its record.
pub(super) fn measure_point(
    coord: &mut GroupCoordinator,
    point: &GroupPoint,
    plan: &GroupPlan,
    started: SystemTime,
    observer: &mut dyn Observer,
) -> Result<ResultRecord, GroupError> {
    let workload = point.workload;
    let placement = place(point, &coord.links)?;
    let n = placement.flows as usize;
    let flow_hosts = placement.flow_hosts();
    let mut flows = vec![FlowAcc::default(); n];
    let mut rep_values = Vec::new();
    let roles = placement.roles.len();
    let mut cpu: Vec<Vec<CpuUsage>> = vec![Vec::new(); roles];
    let mut rss: Vec<Option<u64>> = vec![None; roles];
    let mut hist = LatencyHistogram::new();
    let mut bytes = ByteCounts {
        client_tx: 0,
        client_rx: 0,
        server_tx: 0,
        server_rx: 0,
    };
    // Only roles whose flows are datagrams report counters.
    let mut datagrams: Option<DatagramCounts> = None;
    for rep in 0..plan.reps {
        let r = coord.rep(point, &placement, plan)?;
        hist.merge(&r.hist);
        let mut per_flow_value = vec![f64::NAN; n];
        for (role_index, reports, outcome) in &r.reports {
            let role = &placement.roles[*role_index];
            cpu[*role_index].push(outcome.cpu);
            if role.side == GroupRole::Server {
                bytes.server_tx += outcome.bytes_tx;
                bytes.server_rx += outcome.bytes_rx;
            } else {
                bytes.client_tx += outcome.bytes_tx;
                bytes.client_rx += outcome.bytes_rx;
            }
            rss[*role_index] = rss[*role_index].max(outcome.peak_rss_kib);
            if let Some(d) = &outcome.datagrams {
                let sum = datagrams.get_or_insert(DatagramCounts {
                    client: Default::default(),
                    server: Default::default(),
                });
                let end = match role.side {
                    GroupRole::Server => &mut sum.server,
                    GroupRole::Client => &mut sum.client,
                };
                *end = end.plus(d);
            }
            for fr in reports {
                let Some(&g) = role.flows.get(fr.index as usize) else {
                    return Err(
                        coord.host_error(role.host, format!("report of unknown flow {}", fr.index))
                    );
                };
                let g = g as usize;
                let sample = workload.sample(role.side, fr, outcome.window_ns);
                let acc = &mut flows[g];
                acc.bytes_tx += sample.bytes_tx;
                acc.bytes_rx += sample.bytes_rx;
                acc.window_bytes += sample.window_bytes;
                if sample.percentiles.is_some() {
                    acc.percentiles = sample.percentiles;
                }
                if let Some(v) = sample.value {
                    per_flow_value[g] = v;
                }
            }
        }
        let Some(value) = workload.metric().headline(&per_flow_value) else {
            let idle = per_flow_value.iter().filter(|v| !v.is_finite()).count();
            return Err(GroupError::Point(format!(
                "{}: {idle} of {n} clients completed no round trip in the window; lengthen --duration",
                workload.name()
            )));
        };
        if per_flow_value.iter().any(|v| !v.is_finite()) {
            return Err(GroupError::Point(format!(
                "{}: a flow was measured by no host; this is a bug in the workload",
                workload.name()
            )));
        }
        for (acc, v) in flows.iter_mut().zip(&per_flow_value) {
            acc.values.push(*v);
        }
        rep_values.push(value);
        observer.rep_done(rep);
    }
    let summary = Summary::from_reps(&rep_values).map_err(|e| GroupError::Point(e.to_string()))?;
    let flow_results: Vec<FlowResult> = flows
        .iter()
        .enumerate()
        .map(|(i, a)| FlowResult {
            host: coord.links[flow_hosts[i]].host.name.clone(),
            index: i as u32,
            value: netgap_core::stats::mean(&a.values).unwrap_or(0.0),
            bytes_tx: a.bytes_tx,
            bytes_rx: a.bytes_rx,
            percentiles: a.percentiles.clone(),
        })
        .collect();
    let links = placement
        .links
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
        .map(|(r, c)| HostCpu {
            host: coord.links[placement.roles[r].host].host.name.clone(),
            role: placement.roles[r].side.as_str().into(),
            cpu: CpuUsage::mean(c),
            peak_rss_kib: rss[r],
            facts: Some(coord.links[placement.roles[r].host].facts.clone()),
        })
        .collect();
    let mut options = plan.base.record_options(&point.spec);
    options.peer = plan.hosts.label();
    options.iterations = None;
    options.rep_time_ms = Some(plan.duration.as_millis() as u64);
    options.warmup = None;
    let client_hosts = {
        let mut h: Vec<usize> = placement
            .roles
            .iter()
            .filter(|r| r.side == GroupRole::Client)
            .map(|r| r.host)
            .collect();
        h.sort_unstable();
        h.dedup();
        h.len()
    };
    let first_server = placement
        .roles
        .iter()
        .find(|r| r.side == GroupRole::Server)
        .map_or(0, |r| r.host);
    let first_client = placement
        .roles
        .iter()
        .find(|r| r.side == GroupRole::Client)
        .map_or(first_server, |r| r.host);
    let mut path = PathIdentity::from_ends(
        Some(&coord.links[first_client].facts),
        Some(&coord.links[first_server].facts),
    );
    if let Some(tb) = match &plan.hosts {
        crate::cluster::HostsSource::File(f) => f.path_facts(),
        _ => None,
    } {
        tb.fill(&mut path);
    }
    Ok(ResultRecord {
        test: workload.name().into(),
        transport: point.spec.transport.clone(),
        mode: point.spec.mode,
        size_bytes: point.spec.size_bytes,
        metric: workload.metric().key().into(),
        value: summary.value,
        stats: Some(RecordStats::from(&summary)),
        percentiles: workload.percentiles(&hist),
        cpu: None,
        service_demand_us_per_kib: None,
        iterations_per_rep: None,
        warmup_iterations: None,
        bytes: Some(bytes),
        datagrams,
        warnings: noise_warning(&summary, NOISY_CV).into_iter().collect(),
        host: Some(coord.local.clone()),
        peer_host: Some(coord.links[first_server].facts.clone()),
        options: Some(options),
        version: netgap_core::VERSION.into(),
        time: humantime::format_rfc3339_seconds(started).to_string(),
        tool: None,
        sweep_kind: None,
        block_time_us: None,
        dropout: None,
        unstable: None,
        ci_target: None,
        clients: Some(n as u32),
        client_hosts: Some(client_hosts as u32),
        flows: flow_results,
        hosts_cpu,
        links,
        stack: Some(Stack::new(
            &point.spec.transport,
            point.spec.mode,
            &point.spec.options,
            path,
            plan.base.label.clone(),
        )),
    })
}
