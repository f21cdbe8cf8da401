//! `pipeline`: a filter-stream application of the Data-Cutter class
//! (seed 000, Figures 8 and 9). A producer cuts a query's data set into
//! units of work (UOWs, the point's size) and streams them through
//! `--filters` filter stages of `--copies` transparent copies each to a
//! consumer. Every copy of a stage has a stream to every copy of the next;
//! an upstream copy hands each UOW to a downstream copy that has credit
//! (demand-driven), each stream carrying at most `--credits` UOWs in
//! flight; a copy returns a credit once it has passed the UOW on. Each
//! filter checks every UOW's checksum, transforms every byte and
//! optionally computes for `--compute-us` per UOW; end-of-work markers
//! close the query. The consumer checks every UOW byte for byte against
//! the producer's data transformed by every stage, and that each arrived
//! once.
//!
//! One query per repetition; its time (from the barrier to the consumer's
//! last end-of-work marker, timed by the consumer) is the headline; the
//! warm-up and `--duration` only bound it. Each role's CPU is its agent's
//! over its run of the query, from before its copies start to after the
//! last has ended: every copy's thread and its readers'. Copies are placed cyclically
//! over the hosts (copy `i` on host `i % hosts`), or all on the first host
//! (`--colocate`, and always for a transport that cannot cross hosts).
//! The placement is staged ([`super::place::Staged`]): a stream between
//! two roles is dialled by the one prepared later, whichever way its data
//! moves.

pub(crate) mod graph;
pub(crate) mod work;

use super::options::{OptionKind, WorkloadArgs, WorkloadOption};
use super::place::{HostView, Placement, RolePlace, Staged};
use super::role::{
    find_transport, parse_params, OpenRole, ReadyRole, RoleContext, RoleError, RoleResult, Stop,
    WindowEdge, PER_FLOW_BYTES,
};
use super::staged::{self, recv_patient, Inbound};
use super::{CountFlag, FlowSample, Refused, StagedWorkload, Workload};
use crate::About;
use graph::{Edge, Graph};
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec};
use netgap_transport::buffer::{AlignedBuffer, BufferLayout};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::{self as transport, FlowConfig, FlowError, Transport};
use std::collections::BTreeMap;
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use work::Frame;

const NAME: &str = "pipeline";

/// Most filter stages.
const MAX_FILTERS: u64 = 8;
/// Most copies of a filter stage.
const MAX_COPIES: u64 = 16;
/// Most UOWs in flight per stream.
const MAX_CREDITS: u64 = 64;
/// Largest data set of one query, bytes.
const MAX_QUERY_BYTES: u64 = 1 << 30;
/// Smallest and largest UOW (the point's size), bytes.
const UOW_RANGE: (u64, u64) = (64, 4 << 20);

/// A failure of a pipeline role, one line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub(crate) struct PipeError(pub String);

impl From<PipeError> for RoleError {
    fn from(e: PipeError) -> RoleError {
        RoleError::Refused {
            workload: NAME,
            detail: e.0,
        }
    }
}

fn flow_err(e: FlowError) -> PipeError {
    PipeError(e.to_string())
}

static PRESET: WorkloadOption = WorkloadOption {
    flag: "preset",
    kind: OptionKind::Choice(&["vm", "iso"]),
    value_name: "APP",
    help: "the study's application: vm (Virtual Microscope, 16 MiB per query; default) or iso (Iso-Surface, 64 MiB); a list makes one point each",
    axis: true,
};
static QUERY: WorkloadOption = WorkloadOption {
    flag: "query-bytes",
    kind: OptionKind::Bytes {
        min: 1,
        max: MAX_QUERY_BYTES,
    },
    value_name: "BYTES",
    help: "bytes of one query's data set, instead of the preset's",
    axis: false,
};
static FILTERS: WorkloadOption = WorkloadOption {
    flag: "filters",
    kind: OptionKind::Count {
        min: 1,
        max: MAX_FILTERS,
    },
    value_name: "N",
    help: "filter stages between the producer and the consumer (default 1)",
    axis: false,
};
static COPIES: WorkloadOption = WorkloadOption {
    flag: "copies",
    kind: OptionKind::Count {
        min: 1,
        max: MAX_COPIES,
    },
    value_name: "N",
    help:
        "pipeline: transparent copies of each filter stage (default 1); a list makes one point each",
    axis: true,
};
static CREDITS: WorkloadOption = WorkloadOption {
    flag: "credits",
    kind: OptionKind::Count {
        min: 1,
        max: MAX_CREDITS,
    },
    value_name: "N",
    help: "UOWs in flight per stream (flow control; default 4)",
    axis: false,
};
static COMPUTE: WorkloadOption = WorkloadOption {
    flag: "compute-us",
    kind: OptionKind::Count {
        min: 0,
        max: 1_000_000,
    },
    value_name: "US",
    help: "fixed compute time each filter spends per UOW, µs (default 0)",
    axis: false,
};
static COLOCATE: WorkloadOption = WorkloadOption {
    flag: "colocate",
    kind: OptionKind::Switch,
    value_name: "",
    help: "every stage on the first host (always so over unix and shm)",
    axis: false,
};
static PLACE: WorkloadOption = WorkloadOption {
    flag: "place",
    kind: OptionKind::CountList {
        min: 0,
        max: 63,
        most: 2 + (MAX_FILTERS * MAX_COPIES) as usize,
    },
    value_name: "H[,H...]",
    help: "the host (0 is the first of the run) of each copy in turn: producer, every filter stage's copies, consumer; a shorter list repeats (default: copy i on host i % hosts)",
    axis: false,
};
static OPTIONS: [&WorkloadOption; 8] = [
    &PRESET, &QUERY, &FILTERS, &COPIES, &CREDITS, &COMPUTE, &COLOCATE, &PLACE,
];

/// The parameters every pipeline role gets.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct PipeParams {
    preset: String,
    query_bytes: u64,
    filters: u32,
    copies: u32,
    credits: u32,
    compute_us: u64,
    colocate: bool,
    /// Host of each copy in turn, repeating (`--place`); empty: cyclic.
    #[serde(default)]
    place: Vec<usize>,
    #[serde(default)]
    staged: Option<Staged>,
}

impl PipeParams {
    fn check(&self, uow_bytes: u64) -> Result<Graph, PipeError> {
        let ok = (1..=MAX_QUERY_BYTES).contains(&self.query_bytes)
            && (1..=MAX_FILTERS as u32).contains(&self.filters)
            && (1..=MAX_COPIES as u32).contains(&self.copies)
            && (1..=MAX_CREDITS as u32).contains(&self.credits)
            && self.compute_us <= 1_000_000
            && (UOW_RANGE.0..=UOW_RANGE.1).contains(&uow_bytes);
        if !ok {
            return Err(PipeError("parameters out of range".into()));
        }
        Ok(Graph {
            filters: self.filters,
            copies: self.copies,
        })
    }
}

/// The `pipeline` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pipeline;

fn preset_bytes(preset: &str) -> u64 {
    if preset == "iso" {
        64 << 20
    } else {
        16 << 20
    }
}

impl StagedWorkload for Pipeline {
    /// The query time the sink measured.
    fn headline(&self, metrics: &BTreeMap<String, f64>) -> Option<f64> {
        metrics.get("query_time_ms").copied().filter(|v| *v > 0.0)
    }
}

/// What `Pipeline` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "filter-stream pipeline (Data-Cutter class): producer, filter copies, consumer; query time, verified",
    metric: Metric::Other {
        key: "query_time_ms",
        combine: netgap_core::metric::Combine::Max,
    },
    count: CountFlag::Hosts,
    max_flows: (2 + MAX_FILTERS * MAX_COPIES) as u32,
    takes_bidir: false,
};

impl Workload for Pipeline {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        16 * 1024
    }

    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        if !transport.capabilities().reliable {
            return Err(Refused(format!(
                "pipeline: transport {} is not reliable; a query needs every byte delivered",
                spec.transport
            )));
        }
        // A cross-host transport's streams are dialled at the addresses
        // the copies' listeners announced, in the transport's own form
        // (xdp's `IP/MAC/FLOW` too), parsed by the transport.
        // The smallest size is checked by each role.
        if spec.size_bytes > UOW_RANGE.1 {
            return Err(Refused(format!(
                "pipeline: the size is the unit of work: {} bytes is not between {} and {}",
                spec.size_bytes, UOW_RANGE.0, UOW_RANGE.1
            )));
        }
        Ok(())
    }

    fn options(&self) -> &'static [&'static WorkloadOption] {
        &OPTIONS
    }

    fn params(&self, spec: &PointSpec, args: &WorkloadArgs) -> serde_json::Value {
        let preset = args.str("preset").unwrap_or("vm").to_string();
        let n = |flag: &str, default: u64| args.u64(flag).unwrap_or(default);
        let cross =
            netgap_transport::find(&spec.transport).is_some_and(|t| t.capabilities().cross_host);
        let p = PipeParams {
            query_bytes: n("query-bytes", preset_bytes(&preset)),
            preset,
            filters: n("filters", 1) as u32,
            copies: n("copies", 1) as u32,
            credits: n("credits", 4) as u32,
            compute_us: n("compute-us", 0),
            colocate: args.switch("colocate") || !cross,
            place: args
                .str("place")
                .map(|l| l.split(',').filter_map(|h| h.parse().ok()).collect())
                .unwrap_or_default(),
            staged: None,
        };
        serde_json::to_value(p).unwrap_or_default()
    }

    fn metrics(
        &self,
        roles: &[(WorkloadRole, &BTreeMap<String, f64>)],
        _window_ns: u64,
    ) -> BTreeMap<String, f64> {
        let mut out: BTreeMap<String, f64> = BTreeMap::new();
        for (_, m) in roles {
            for (k, v) in m.iter() {
                *out.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        if let Some(&ms) = out.get("query_time_ms").filter(|ms| **ms > 0.0) {
            let rates: Vec<(String, f64)> = out
                .iter()
                .filter_map(|(k, v)| {
                    let stage = k.strip_suffix("_uows")?;
                    Some((format!("{stage}_uows_per_s"), v / (ms / 1000.0)))
                })
                .collect();
            out.extend(rates);
        }
        out
    }

    fn place(
        &self,
        params: &serde_json::Value,
        _count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        let p: PipeParams = serde_json::from_value(params.clone())
            .map_err(|e| Refused(format!("pipeline: {e}")))?;
        let graph = Graph {
            filters: p.filters,
            copies: p.copies,
        };
        if p.place.is_empty() {
            return place(graph, p.colocate, hosts);
        }
        if p.colocate {
            return Err(Refused(
                "pipeline: --place lists the hosts; it does not go with --colocate or a transport that stays on one host".into(),
            ));
        }
        if let Some(h) = p.place.iter().find(|&&h| h >= hosts.len()) {
            return Err(Refused(format!(
                "pipeline: --place names host {h}; the run has hosts 0 to {}",
                hosts.len().saturating_sub(1)
            )));
        }
        place_listed(graph, &p.place, hosts.len())
    }

    fn staged(&self) -> Option<&dyn StagedWorkload> {
        Some(self)
    }

    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        // Each copy queues at most its credits on each inbound stream, and
        // holds two UOW buffers; every stream its state.
        let get = |k: &str| {
            spec.params
                .get(k)
                .and_then(serde_json::Value::as_u64)
                .unwrap_or(1)
        };
        let (copies, credits) = (
            get("copies").min(MAX_COPIES),
            get("credits").min(MAX_CREDITS),
        );
        let uow = spec.point.size_bytes;
        let per_copy = uow
            .saturating_mul(credits.saturating_mul(copies).saturating_add(2))
            .saturating_add(PER_FLOW_BYTES.saturating_mul(2 * copies));
        per_copy.saturating_mul(u64::from(spec.flows))
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let params: PipeParams = parse_params(NAME, ctx.spec)?;
        let uow_bytes = ctx.spec.point.size_bytes;
        let graph = params.check(uow_bytes)?;
        ctx.limits.check_message_bytes(uow_bytes)?;
        if params.query_bytes as f64 > ctx.limits.max_run_bytes() {
            return Err(PipeError(format!(
                "a query of {} bytes is past what this agent moves in one run ({:.3e} bytes)",
                params.query_bytes,
                ctx.limits.max_run_bytes()
            ))
            .into());
        }
        let t = find_transport(ctx.spec)?;
        let view = staged::view(NAME, params.staged.clone(), &ctx, t)?;
        let s = &view.staged;
        // Every copy on exactly one role.
        let mut role_of = vec![usize::MAX; graph.total() as usize];
        for (r, role) in s.roles.iter().enumerate() {
            for &c in &role.flows {
                match role_of.get_mut(c as usize) {
                    Some(slot) if *slot == usize::MAX => *slot = r,
                    _ => {
                        return Err(
                            PipeError(format!("copy {c} placed twice or past the group")).into(),
                        )
                    }
                }
            }
        }
        if role_of.contains(&usize::MAX) {
            return Err(PipeError("a copy of the group is placed on no role".into()).into());
        }
        let edges = graph.edges();
        let links = graph::role_links(&edges, &role_of, s.role);
        if !links.internal.is_empty() && !t.capabilities().runs_on_loopback {
            return Err(PipeError(format!(
                "transport {} cannot connect two copies on one host (its flows need two hosts): give a host per copy ({} hosts), or fewer copies",
                ctx.spec.point.transport,
                graph.total()
            ))
            .into());
        }
        let config = FlowConfig::from_spec(&ctx.spec.point);
        let ip = staged::listen_ip(NAME, &ctx, t)?;
        let listening = Inbound::listen(
            t,
            &config,
            ip,
            links.listens.len(),
            ctx.data_token,
            ctx.rate,
        )?;
        let internal = Inbound::listen(
            t,
            &config,
            ip,
            links.internal.len(),
            ctx.data_token,
            ctx.rate,
        )?;
        let mut dialed = Vec::with_capacity(links.dials.len() + links.internal.len());
        for (k, &(e, lo, pos)) in links.dials.iter().enumerate() {
            let addr = view.peers.get(lo).and_then(|a| a.get(pos)).ok_or_else(|| {
                PipeError(format!("role {lo} announced no address for stream {e}"))
            })?;
            dialed.push((
                e,
                staged::dial(t, &config, addr.as_str(), ctx.data_token, k, ctx.rate)?,
            ));
        }
        for (k, (&e, addr)) in links.internal.iter().zip(&internal.addrs).enumerate() {
            let index = links.dials.len() + k;
            dialed.push((
                e,
                staged::dial(t, &config, addr, ctx.data_token, index, ctx.rate)?,
            ));
        }
        Ok(Box::new(PipeOpen {
            spec: ctx.spec.clone(),
            stop: ctx.stop.clone(),
            params,
            graph,
            edges,
            role_of,
            me: s.role,
            my_copies: s.roles[s.role].flows.clone(),
            links,
            listening,
            internal,
            dialed,
        }))
    }

    fn sample(&self, _side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        // A copy's UOWs per second over its role's run.
        FlowSample {
            value: Some(report.round_trips as f64 / (window_ns.max(1) as f64 / 1e9)),
            bytes_tx: report.bytes_tx,
            bytes_rx: report.bytes_rx,
            window_bytes: report.window_bytes_rx,
            percentiles: report.percentiles.clone(),
        }
    }

    fn percentiles(&self, hist: &LatencyHistogram) -> Option<Percentiles> {
        hist.percentiles_us(1.0)
    }
}

/// One role per host that holds a copy, in host order; every role listens
/// (the placement is staged).
fn place(graph: Graph, colocate: bool, hosts: &[HostView]) -> Result<Placement, Refused> {
    if hosts.is_empty() {
        return Err(Refused("pipeline: no host".into()));
    }
    let mut per_host: Vec<Vec<u32>> = vec![Vec::new(); hosts.len()];
    for c in 0..graph.total() {
        per_host[graph::host_of(c, hosts.len(), colocate)].push(c);
    }
    Ok(roles_of(per_host, graph))
}

/// Copy `i` on host `listed[i % listed.len()]`: one role per host that
/// holds a copy, in host order.
fn place_listed(graph: Graph, listed: &[usize], hosts: usize) -> Result<Placement, Refused> {
    let mut per_host: Vec<Vec<u32>> = vec![Vec::new(); hosts];
    for c in 0..graph.total() {
        let h = listed[c as usize % listed.len()];
        per_host
            .get_mut(h)
            .ok_or_else(|| Refused(format!("pipeline: no host {h}")))?
            .push(c);
    }
    Ok(roles_of(per_host, graph))
}

fn roles_of(per_host: Vec<Vec<u32>>, graph: Graph) -> Placement {
    let roles = per_host
        .into_iter()
        .enumerate()
        .filter(|(_, f)| !f.is_empty())
        .map(|(host, flows)| RolePlace {
            host,
            side: WorkloadRole::Server,
            flows,
            connects_to: None,
            listen_ips: None,
            bind_ips: None,
        })
        .collect();
    Placement {
        roles,
        flows: graph.total(),
        links: Vec::new(),
    }
}

/// A role whose listeners are open and whose dialled streams are connected.
struct PipeOpen {
    spec: WorkloadSpec,
    stop: Stop,
    params: PipeParams,
    graph: Graph,
    edges: Vec<Edge>,
    role_of: Vec<usize>,
    me: usize,
    my_copies: Vec<u32>,
    links: graph::RoleLinks,
    listening: Inbound,
    internal: Inbound,
    dialed: Vec<(usize, Box<dyn transport::Flow>)>,
}

impl OpenRole for PipeOpen {
    fn addrs(&self) -> Vec<String> {
        self.listening.addrs.clone()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        let accepted = self.listening.join()?;
        let accepted_internal = self.internal.join()?;
        // Each stream end this role holds, as (edge, upstream end?, flow).
        let mut ends: Vec<(usize, bool, Box<dyn transport::Flow>)> = Vec::new();
        for (&e, f) in self.links.listens.iter().zip(accepted) {
            let up = self.role_of[self.edges[e].up as usize] == self.me;
            ends.push((e, up, f));
        }
        let internal_count = self.links.internal.len();
        let dial_count = self.dialed.len() - internal_count;
        for (k, (e, f)) in self.dialed.into_iter().enumerate() {
            // A dialled internal stream is its upstream end.
            let up = k >= dial_count || self.role_of[self.edges[e].up as usize] == self.me;
            ends.push((e, up, f));
        }
        for (&e, f) in self.links.internal.iter().zip(accepted_internal) {
            ends.push((e, false, f));
        }
        let mut copies: Vec<CopyEnds> = self
            .my_copies
            .iter()
            .map(|&c| CopyEnds {
                copy: c,
                inbound: Vec::new(),
                outbound: Vec::new(),
            })
            .collect();
        for (e, up, f) in ends {
            let edge = self.edges[e];
            let owner = if up { edge.up } else { edge.down };
            let Some(c) = copies.iter_mut().find(|c| c.copy == owner) else {
                return Err(PipeError(format!("stream {e} ends on a copy of another role")).into());
            };
            if up {
                c.outbound.push(f);
            } else {
                c.inbound.push(f);
            }
        }
        Ok(Box::new(PipeReady {
            spec: self.spec,
            stop: self.stop,
            params: self.params,
            graph: self.graph,
            copies,
        }))
    }
}

/// The stream ends of one copy.
struct CopyEnds {
    copy: u32,
    inbound: Vec<Box<dyn transport::Flow>>,
    outbound: Vec<Box<dyn transport::Flow>>,
}

struct PipeReady {
    spec: WorkloadSpec,
    stop: Stop,
    params: PipeParams,
    graph: Graph,
    copies: Vec<CopyEnds>,
}

/// What every copy of a role shares.
#[derive(Clone)]
struct Env {
    graph: Graph,
    uow_bytes: u64,
    query_bytes: u64,
    credits: u32,
    compute: Duration,
    t0: Instant,
    deadline: Instant,
    stop: Stop,
    /// Where every UOW buffer's data starts (`--align`, `--offset`).
    layout: BufferLayout,
}

impl Env {
    fn uows(&self) -> u64 {
        self.query_bytes.div_ceil(self.uow_bytes)
    }
}

/// What one copy did.
#[derive(Default)]
struct CopyDone {
    uows: u64,
    bytes_rx: u64,
    bytes_tx: u64,
    /// ns from the role's start until the copy passed on its last marker
    /// (the consumer: received it).
    done_ns: u64,
    hist: Option<LatencyHistogram>,
}

impl ReadyRole for PipeReady {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let t0 = Instant::now();
        let env = Env {
            graph: self.graph,
            uow_bytes: self.spec.point.size_bytes,
            query_bytes: self.params.query_bytes,
            credits: self.params.credits,
            compute: Duration::from_micros(self.params.compute_us),
            t0,
            deadline: staged::job_deadline(&self.spec, t0),
            stop: self.stop.clone(),
            layout: BufferLayout::of_options(&self.spec.point.options).map_err(|e| {
                RoleError::Params {
                    workload: NAME,
                    detail: format!("message buffers: {e}"),
                }
            })?,
        };
        // The role's CPU is its agent's, every copy's threads and their
        // readers', over the role's run: from before the copies start to
        // after the last has ended.
        let started = WindowEdge::now();
        let mut handles = Vec::with_capacity(self.copies.len());
        let mut names = Vec::with_capacity(self.copies.len());
        for ends in self.copies {
            let env = env.clone();
            let stage = env.graph.stage_of(ends.copy);
            names.push((ends.copy, stage));
            let h = std::thread::Builder::new()
                .name(format!("pipeline copy {}", ends.copy))
                .spawn(move || run_copy(ends, &env))
                .map_err(|source| RoleError::Thread {
                    what: "a pipeline copy",
                    source,
                })?;
            handles.push(h);
        }
        let mut done = Vec::with_capacity(handles.len());
        let mut first_err = None;
        for (i, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(d)) => done.push(d),
                Ok(Err(e)) => {
                    self.stop.set();
                    first_err.get_or_insert(RoleError::from(e));
                }
                Err(_) => {
                    first_err.get_or_insert(RoleError::Panicked {
                        what: format!("pipeline copy {i}"),
                    });
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        let ended = WindowEdge::now();
        let window_ns =
            u64::try_from(ended.at().saturating_duration_since(t0).as_nanos()).unwrap_or(u64::MAX);
        let cpu = started.usage_to(&ended);
        let mut metrics = BTreeMap::new();
        let mut hist = LatencyHistogram::new();
        let mut flows = Vec::with_capacity(done.len());
        for (i, (d, &(copy, stage))) in done.iter().zip(&names).enumerate() {
            *metrics
                .entry(format!("{}_uows", self.graph.stage_name(stage)))
                .or_insert(0.0) += d.uows as f64;
            let mut percentiles = None;
            if let Some(h) = &d.hist {
                hist.merge(h);
                percentiles = h.percentiles_us(1.0);
                metrics.insert("query_time_ms".into(), d.done_ns as f64 / 1e6);
                metrics.insert("verified_bytes".into(), d.bytes_rx as f64);
            }
            let _ = copy;
            flows.push(FlowReport {
                index: i as u32,
                bytes_tx: d.bytes_tx,
                bytes_rx: d.bytes_rx,
                window_bytes_rx: 0,
                round_trips: d.uows,
                percentiles,
                errors: 0,
            });
        }
        Ok(RoleResult {
            buckets: hist.buckets(),
            outcome: WorkloadOutcome {
                window_ns,
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: done.iter().map(|d| d.bytes_rx).sum(),
                bytes_tx: done.iter().map(|d| d.bytes_tx).sum(),
                datagrams: None,
                metrics,
                services: Vec::new(),
                last_error: None,
                data_window_ns: None,
            },
            flows,
        })
    }
}

/// Credits of a copy's outbound streams: how many more UOWs each may
/// carry now.
struct Credits {
    state: Mutex<CreditState>,
    cv: Condvar,
    max: u32,
}

struct CreditState {
    free: Vec<u32>,
    failed: Option<String>,
}

impl Credits {
    fn new(streams: usize, max: u32) -> Credits {
        Credits {
            state: Mutex::new(CreditState {
                free: vec![max; streams],
                failed: None,
            }),
            cv: Condvar::new(),
            max,
        }
    }

    /// Takes a credit of the first stream from `from` on that has one,
    /// waiting for one.
    fn take(&self, from: usize, env: &Env) -> Result<usize, PipeError> {
        let poisoned = || PipeError("a copy's credits were poisoned".into());
        let mut s = self.state.lock().map_err(|_| poisoned())?;
        loop {
            if let Some(why) = &s.failed {
                return Err(PipeError(why.clone()));
            }
            let n = s.free.len();
            if let Some(i) = (0..n).map(|k| (from + k) % n).find(|&i| s.free[i] > 0) {
                s.free[i] -= 1;
                return Ok(i);
            }
            if env.stop.is_set() {
                return Err(PipeError("stopped".into()));
            }
            if Instant::now() >= env.deadline {
                return Err(PipeError(
                    "the query did not finish within the window; lengthen --duration".into(),
                ));
            }
            s = self
                .cv
                .wait_timeout(s, super::role::STOP_TICK)
                .map_err(|_| poisoned())?
                .0;
        }
    }

    fn give(&self, i: usize, n: u32) -> Result<(), PipeError> {
        let mut s = self
            .state
            .lock()
            .map_err(|_| PipeError("a copy's credits were poisoned".into()))?;
        let free = s
            .free
            .get_mut(i)
            .ok_or_else(|| PipeError("no such stream".into()))?;
        *free = free.saturating_add(n);
        if *free > self.max {
            return Err(PipeError(
                "a downstream copy returned more credits than it was sent UOWs".into(),
            ));
        }
        self.cv.notify_all();
        Ok(())
    }

    fn fail(&self, why: String) {
        if let Ok(mut s) = self.state.lock() {
            s.failed.get_or_insert(why);
        }
        self.cv.notify_all();
    }
}

/// Reads the credits a downstream copy returns on stream `i` until it
/// closes the stream.
fn read_credits(
    mut rx: Box<dyn transport::Receiver>,
    credits: &Credits,
    i: usize,
    env: &Env,
) -> Result<(), PipeError> {
    let mut buf = [0u8; 64];
    loop {
        match rx.recv_some(&mut buf) {
            Ok(n) => credits.give(i, n as u32)?,
            Err(FlowError::Closed) => return Ok(()),
            Err(FlowError::TimedOut { .. })
                if Instant::now() < env.deadline && !env.stop.is_set() => {}
            Err(e) => return Err(flow_err(e)),
        }
    }
}

/// What an inbound stream hands its copy.
enum Inbox {
    Uow {
        from: usize,
        frame: Frame,
        data: AlignedBuffer,
    },
    Eow,
    Failed(String),
}

/// Reads UOWs from inbound stream `from` until its end-of-work marker.
fn read_uows(
    mut rx: Box<dyn transport::Receiver>,
    from: usize,
    tx: &mpsc::SyncSender<Inbox>,
    env: &Env,
) {
    let r = (|| -> Result<(), PipeError> {
        loop {
            let mut hb = [0u8; work::HEADER_BYTES];
            recv_patient(rx.as_mut(), &mut hb, env.deadline, &env.stop).map_err(flow_err)?;
            let frame = Frame::decode(&hb);
            match frame.kind {
                work::KIND_EOW => {
                    let _ = tx.send(Inbox::Eow);
                    return Ok(());
                }
                work::KIND_UOW => {
                    let want = work::uow_len(frame.seq, env.query_bytes, env.uow_bytes);
                    if frame.seq >= env.uows() || u64::from(frame.len) != want {
                        return Err(PipeError(format!(
                            "a UOW numbered {} of {} bytes is not in the query",
                            frame.seq, frame.len
                        )));
                    }
                    let mut data = AlignedBuffer::zeroed(frame.len as usize, env.layout);
                    rx.recv_exact(&mut data).map_err(flow_err)?;
                    if tx.send(Inbox::Uow { from, frame, data }).is_err() {
                        return Ok(());
                    }
                }
                k => return Err(PipeError(format!("a frame of unknown kind {k}"))),
            }
        }
    })();
    if let Err(e) = r {
        let _ = tx.send(Inbox::Failed(e.0));
    }
}

/// Spins for `d`: a filter's fixed compute time, as real CPU work.
fn compute_for(d: Duration) {
    let t = Instant::now();
    while t.elapsed() < d {
        std::hint::spin_loop();
    }
}

/// Runs one copy: the producer sends the query, a filter passes every UOW
/// on transformed, the consumer checks every UOW.
fn run_copy(ends: CopyEnds, env: &Env) -> Result<CopyDone, PipeError> {
    let stage = env.graph.stage_of(ends.copy);
    let last = env.graph.stages() - 1;
    // Outbound: send halves here, credit readers on threads of their own.
    let credits = Arc::new(Credits::new(ends.outbound.len(), env.credits));
    let mut out_tx = Vec::with_capacity(ends.outbound.len());
    let mut credit_readers = Vec::with_capacity(ends.outbound.len());
    for (i, f) in ends.outbound.into_iter().enumerate() {
        let (tx, rx) = f.into_halves();
        out_tx.push(tx);
        let credits = Arc::clone(&credits);
        let env = env.clone();
        let h = std::thread::Builder::new()
            .name(format!("credits {}:{i}", ends.copy))
            .spawn(move || {
                let r = read_credits(rx, &credits, i, &env);
                if let Err(e) = &r {
                    credits.fail(e.0.clone());
                }
                r
            })
            .map_err(|e| PipeError(format!("cannot start a credit reader: {e}")))?;
        credit_readers.push(h);
    }
    // Inbound: readers on threads of their own, send halves here for
    // credits. At most `credits` UOWs wait per stream.
    let inbound = ends.inbound.len();
    let (itx, irx) = mpsc::sync_channel(inbound * (env.credits as usize + 1));
    let mut in_tx = Vec::with_capacity(inbound);
    let mut readers = Vec::with_capacity(inbound);
    for (i, f) in ends.inbound.into_iter().enumerate() {
        let (tx, rx) = f.into_halves();
        in_tx.push(tx);
        let itx = itx.clone();
        let env = env.clone();
        let h = std::thread::Builder::new()
            .name(format!("uows {}:{i}", ends.copy))
            .spawn(move || read_uows(rx, i, &itx, &env))
            .map_err(|e| PipeError(format!("cannot start a UOW reader: {e}")))?;
        readers.push(h);
    }
    drop(itx);
    let r = if stage == 0 {
        produce(&mut out_tx, &credits, env)
    } else {
        pass_on(
            stage,
            stage == last,
            &irx,
            &mut in_tx,
            &mut out_tx,
            &credits,
            env,
        )
    };
    if r.is_err() {
        credits.fail("the copy failed".into());
    }
    // Closing our ends lets the neighbours' readers finish.
    drop(in_tx);
    drop(irx);
    for h in readers {
        let _ = h.join();
    }
    let mut reader_err = None;
    drop(out_tx);
    for h in credit_readers {
        match h.join() {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                reader_err.get_or_insert(e);
            }
            Err(_) => {
                reader_err.get_or_insert(PipeError("a credit reader panicked".into()));
            }
        }
    }
    let done = r?;
    match reader_err {
        Some(e) => Err(e),
        None => Ok(done),
    }
}

fn send_frame(tx: &mut dyn transport::Sender, frame: Frame, data: &[u8]) -> Result<(), PipeError> {
    tx.send_all(&frame.encode()).map_err(flow_err)?;
    if !data.is_empty() {
        tx.send_all(data).map_err(flow_err)?;
    }
    Ok(())
}

fn end_of_work(out_tx: &mut [Box<dyn transport::Sender>]) -> Result<(), PipeError> {
    let eow = Frame {
        kind: work::KIND_EOW,
        len: 0,
        seq: 0,
        sent_ns: 0,
        sum: 0,
    };
    for tx in out_tx.iter_mut() {
        send_frame(tx.as_mut(), eow, &[])?;
    }
    Ok(())
}

/// The producer: every UOW of the query to whichever downstream copy has
/// credit, then an end-of-work marker to each.
fn produce(
    out_tx: &mut [Box<dyn transport::Sender>],
    credits: &Credits,
    env: &Env,
) -> Result<CopyDone, PipeError> {
    let mut done = CopyDone::default();
    let mut buf = AlignedBuffer::zeroed(
        usize::try_from(env.uow_bytes).unwrap_or(usize::MAX),
        env.layout,
    );
    let mut next = 0;
    for seq in 0..env.uows() {
        let n = work::uow_len(seq, env.query_bytes, env.uow_bytes) as usize;
        let data = &mut buf[..n];
        work::produce(seq, env.uow_bytes, data);
        let i = credits.take(next, env)?;
        next = i + 1;
        let frame = Frame {
            kind: work::KIND_UOW,
            len: n as u32,
            seq,
            sent_ns: netgap_core::units::ns_since(env.t0),
            sum: work::checksum(data),
        };
        send_frame(out_tx[i].as_mut(), frame, data)?;
        done.uows += 1;
        done.bytes_tx += n as u64;
    }
    end_of_work(out_tx)?;
    done.done_ns = netgap_core::units::ns_since(env.t0);
    Ok(done)
}

/// A filter or the consumer: takes UOWs as they come from any upstream
/// copy, checks each, transforms it (a filter) or checks it against what
/// it must be (the consumer), passes it on to a downstream copy with
/// credit, and returns the upstream stream's credit.
#[allow(clippy::too_many_arguments, reason = "one copy's whole state")]
fn pass_on(
    stage: u32,
    consumer: bool,
    irx: &mpsc::Receiver<Inbox>,
    in_tx: &mut [Box<dyn transport::Sender>],
    out_tx: &mut [Box<dyn transport::Sender>],
    credits: &Credits,
    env: &Env,
) -> Result<CopyDone, PipeError> {
    let mut done = CopyDone::default();
    let uows = env.uows();
    let mut seen = if consumer {
        vec![false; usize::try_from(uows).unwrap_or(0)]
    } else {
        Vec::new()
    };
    let mut hist = LatencyHistogram::new();
    let mut expect = AlignedBuffer::zeroed(
        usize::try_from(env.uow_bytes).unwrap_or(usize::MAX),
        env.layout,
    );
    let mut open = in_tx.len();
    let mut next = 0;
    while open > 0 {
        let msg = loop {
            match irx.recv_timeout(super::role::STOP_TICK) {
                Ok(m) => break m,
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    if env.stop.is_set() {
                        return Err(PipeError("stopped".into()));
                    }
                    if Instant::now() >= env.deadline {
                        return Err(PipeError(
                            "the query did not finish within the window; lengthen --duration"
                                .into(),
                        ));
                    }
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(PipeError("an upstream stream ended early".into()))
                }
            }
        };
        let (from, frame, mut data) = match msg {
            Inbox::Eow => {
                open -= 1;
                continue;
            }
            Inbox::Failed(why) => return Err(PipeError(why)),
            Inbox::Uow { from, frame, data } => (from, frame, data),
        };
        done.bytes_rx += data.len() as u64;
        if work::checksum(&data) != frame.sum {
            return Err(PipeError(format!(
                "UOW {} arrived with a bad checksum",
                frame.seq
            )));
        }
        if consumer {
            let n = data.len();
            work::expected(
                frame.seq,
                env.uow_bytes,
                env.graph.filters,
                &mut expect[..n],
            );
            if data[..] != expect[..n] {
                return Err(PipeError(format!(
                    "UOW {} differs from the producer's data through every filter",
                    frame.seq
                )));
            }
            let slot = seen
                .get_mut(frame.seq as usize)
                .ok_or_else(|| PipeError("a UOW past the query".into()))?;
            if *slot {
                return Err(PipeError(format!("UOW {} arrived twice", frame.seq)));
            }
            *slot = true;
            hist.record_ns(netgap_core::units::ns_since(env.t0).saturating_sub(frame.sent_ns));
        } else {
            work::transform(stage, &mut data);
            compute_for(env.compute);
            let i = credits.take(next, env)?;
            next = i + 1;
            let out = Frame {
                sum: work::checksum(&data),
                ..frame
            };
            send_frame(out_tx[i].as_mut(), out, &data)?;
            done.bytes_tx += data.len() as u64;
        }
        done.uows += 1;
        in_tx
            .get_mut(from)
            .ok_or_else(|| PipeError("no such stream".into()))?
            .send_all(&[1])
            .map_err(flow_err)?;
    }
    if consumer {
        let got = seen.iter().filter(|s| **s).count() as u64;
        if got != uows {
            return Err(PipeError(format!(
                "the query ended with {got} of {uows} UOWs"
            )));
        }
        done.hist = Some(hist);
    } else {
        end_of_work(out_tx)?;
    }
    done.done_ns = netgap_core::units::ns_since(env.t0);
    Ok(done)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    use crate::place::test_hosts as hosts;

    #[test]
    fn copies_go_round_the_hosts_or_all_on_the_first() {
        let g = Graph {
            filters: 1,
            copies: 2,
        };
        let p = place(g, false, &hosts(4)).unwrap();
        p.validate(4).unwrap();
        let flows: Vec<Vec<u32>> = p.roles.iter().map(|r| r.flows.clone()).collect();
        assert_eq!(flows, vec![vec![0], vec![1], vec![2], vec![3]]);
        let g = Graph {
            filters: 2,
            copies: 2,
        };
        let p = place(g, false, &hosts(4)).unwrap();
        assert_eq!(p.roles[0].flows, vec![0, 4]);
        let p = place(g, true, &hosts(4)).unwrap();
        assert_eq!(p.roles.len(), 1);
        assert_eq!(p.roles[0].flows.len(), 6);
        // As listed, repeating: host 2, 0, 1, 2, 0, 1 for copies 0 to 5.
        let p = place_listed(g, &[2, 0, 1], 4).unwrap();
        p.validate(4).unwrap();
        let got: Vec<(usize, Vec<u32>)> =
            p.roles.iter().map(|r| (r.host, r.flows.clone())).collect();
        assert_eq!(got, vec![(0, vec![1, 4]), (1, vec![2, 5]), (2, vec![0, 3])]);
    }

    fn env() -> Env {
        Env {
            graph: Graph {
                filters: 1,
                copies: 1,
            },
            uow_bytes: 1024,
            query_bytes: 4096,
            credits: 2,
            compute: Duration::ZERO,
            t0: Instant::now(),
            deadline: Instant::now() + Duration::from_secs(2),
            stop: Stop::new(),
            layout: BufferLayout::default(),
        }
    }

    /// What a UOW reader hands its copy for `bytes` from upstream.
    fn read(bytes: &[u8]) -> Vec<Inbox> {
        let (down, mut up) = crate::staged::flow_pair();
        up.send_all(bytes).unwrap();
        drop(up);
        let (tx, rx) = mpsc::sync_channel(8);
        let (_, r) = down.into_halves();
        read_uows(r, 0, &tx, &env());
        drop(tx);
        rx.iter().collect()
    }

    fn frame(kind: u8, len: u32, seq: u64) -> Vec<u8> {
        Frame {
            kind,
            len,
            seq,
            sent_ns: 0,
            sum: 0,
        }
        .encode()
        .to_vec()
    }

    #[test]
    fn frames_outside_the_query_end_the_stream_with_one_line() {
        let failed = |v: Vec<Inbox>| match v.last() {
            Some(Inbox::Failed(why)) => why.clone(),
            _ => panic!("not failed"),
        };
        // A UOW numbered past the query (4 UOWs of 1 KiB).
        assert!(failed(read(&frame(work::KIND_UOW, 1024, 4))).contains("not in the query"));
        // A UOW of a length that is not its own.
        assert!(failed(read(&frame(work::KIND_UOW, 1 << 30, 0))).contains("not in the query"));
        assert!(failed(read(&frame(7, 0, 0))).contains("unknown kind 7"));
        // A closed stream before the end-of-work marker.
        assert!(!failed(read(&[])).is_empty());
        // A UOW and the marker are handed on.
        let mut ok = frame(work::KIND_UOW, 1024, 3);
        ok.extend(vec![0u8; 1024]);
        ok.extend(frame(work::KIND_EOW, 0, 0));
        let got = read(&ok);
        assert!(matches!(got[0], Inbox::Uow { ref frame, .. } if frame.seq == 3));
        assert!(matches!(got[1], Inbox::Eow));
    }

    #[test]
    fn stage_rates_follow_the_query_time() {
        let a = BTreeMap::from([("producer_uows".to_string(), 100.0)]);
        let b = BTreeMap::from([
            ("consumer_uows".to_string(), 100.0),
            ("query_time_ms".to_string(), 500.0),
        ]);
        let m = Pipeline.metrics(&[(WorkloadRole::Server, &a), (WorkloadRole::Server, &b)], 0);
        assert_eq!(m.get("producer_uows_per_s"), Some(&200.0));
        assert_eq!((&Pipeline as &dyn Workload).headline(&[], &m), Some(500.0));
    }
}
