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

mod copy;
pub(crate) mod graph;
pub(crate) mod program;
mod role;
pub(crate) mod stages_child;
pub(crate) mod work;

use super::options::{OptionKind, WorkloadArgs, WorkloadOption};
use super::place::{HostView, Placement, RolePlace, Staged};
use super::role::{find_transport, parse_params, OpenRole, RoleContext, RoleError, PER_FLOW_BYTES};
use super::staged::{self, Inbound};
use super::{CountFlag, FlowSample, Refused, StagedWorkload, Workload};
use crate::About;
use graph::Graph;
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::{FlowConfig, FlowError, Transport};
use role::PipeOpen;
use std::collections::BTreeMap;

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

/// A stream's failure, with what the copy was doing on which stream: a
/// stalled pipeline names the stream that stalled.
fn flow_err(doing: impl std::fmt::Display) -> impl FnOnce(FlowError) -> PipeError {
    move |e| PipeError(format!("{doing}: {e}"))
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
static STAGES: WorkloadOption = WorkloadOption {
    flag: "stages",
    kind: OptionKind::Choice(&["agent", "program"]),
    value_name: "WHERE",
    help: "pipeline: where the stages run: agent (threads of each host's agent on the transport's own interface; default) or program (a process per host on the kernel's TCP sockets: as it is over tcp, under netgap's preload library over shm on one host or over xdp across hosts through the hosts' relays)",
    axis: false,
};
static OPTIONS: [&WorkloadOption; 9] = [
    &PRESET, &QUERY, &FILTERS, &COPIES, &CREDITS, &COMPUTE, &COLOCATE, &PLACE, &STAGES,
];

/// Where a role's stages run.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Stages {
    /// Threads of the agent, on the point's transport's own interface.
    #[default]
    Agent,
    /// A process of their own per role (`netgap pipeline-stages`) on the
    /// kernel's TCP sockets: over tcp as it is, over shm or xdp under the
    /// preload library, which carries its connections.
    Program,
}

impl Stages {
    fn is_agent(&self) -> bool {
        *self == Stages::Agent
    }
}

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
    /// Where the stages run; a record of stages in the agent, as every
    /// record before the choice, does not name it.
    #[serde(default, skip_serializing_if = "Stages::is_agent")]
    stages: Stages,
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

    /// The stages as a sockets program need a transport programs run
    /// over, and for shm and xdp the preload library.
    fn check_args(
        &self,
        spec: &PointSpec,
        transport: &dyn Transport,
        args: &WorkloadArgs,
    ) -> Result<(), Refused> {
        if args.str("stages") != Some("program") {
            return Ok(());
        }
        let programs = transport.capabilities().programs;
        if programs == netgap_transport::Programs::No {
            return Err(Refused(format!(
                "{NAME}: {}",
                program::no_programs(&spec.transport)
            )));
        }
        if programs.under_library() {
            crate::preload::library_path().map_err(|e| {
                Refused(format!(
                    "{NAME} -t {} --stages program: {e}",
                    spec.transport
                ))
            })?;
        }
        Ok(())
    }

    fn wrapped_programs(&self) -> Option<&'static str> {
        Some("pipeline --stages program")
    }

    /// The stages' program, under the library over shm or xdp.
    fn wraps_programs(&self, spec: &PointSpec, args: &WorkloadArgs) -> bool {
        args.str("stages") == Some("program")
            && netgap_transport::programs(&spec.transport).under_library()
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
            stages: match args.str("stages") {
                Some("program") => Stages::Program,
                _ => Stages::Agent,
            },
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
        if params.stages == Stages::Program {
            return program::open_program(&ctx, params, graph);
        }
        let t = find_transport(ctx.spec)?;
        let ip = staged::listen_ip(NAME, &ctx, t)?;
        let open = open_stages(
            ctx.spec,
            params,
            graph,
            Wire {
                transport: t,
                ip,
                token: ctx.data_token,
                rate: ctx.rate,
            },
            ctx.stop,
        )?;
        Ok(Box::new(open))
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

/// The transport a role's streams take and what they prove and are
/// charged to: the point's own transport in the agent, the kernel's TCP
/// in the stages' program.
pub(crate) struct Wire<'a> {
    /// The transport.
    pub(crate) transport: &'a dyn Transport,
    /// Where the role listens.
    pub(crate) ip: std::net::IpAddr,
    /// The point's data token, proved on every stream.
    pub(crate) token: &'a netgap_proto::dataproof::DataToken,
    /// The rate budget every stream's bytes are charged to.
    pub(crate) rate: &'a std::sync::Arc<netgap_transport::rate::RateBudget>,
}

/// Opens a role's stream ends: its listeners, and its dials to the
/// earlier roles' addresses (parsed by the wire's transport) and to its
/// own listeners for the streams between its own copies.
fn open_stages(
    spec: &WorkloadSpec,
    params: PipeParams,
    graph: Graph,
    wire: Wire<'_>,
    stop: &super::role::Stop,
) -> Result<PipeOpen, RoleError> {
    let Wire {
        transport: t,
        ip,
        token,
        rate,
    } = wire;
    let view = staged::view(NAME, params.staged.clone(), spec, t)?;
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
            spec.point.transport,
            graph.total()
        ))
        .into());
    }
    let config = FlowConfig::from_spec(&spec.point);
    let listening = Inbound::listen(t, &config, ip, links.listens.len(), token, rate)?;
    let internal = Inbound::listen(t, &config, ip, links.internal.len(), token, rate)?;
    let mut dialed = Vec::with_capacity(links.dials.len() + links.internal.len());
    for (k, &(e, lo, pos)) in links.dials.iter().enumerate() {
        let addr =
            view.peers.get(lo).and_then(|a| a.get(pos)).ok_or_else(|| {
                PipeError(format!("role {lo} announced no address for stream {e}"))
            })?;
        dialed.push((e, staged::dial(t, &config, addr.as_str(), token, k, rate)?));
    }
    for (k, (&e, addr)) in links.internal.iter().zip(&internal.addrs).enumerate() {
        let index = links.dials.len() + k;
        dialed.push((e, staged::dial(t, &config, addr, token, index, rate)?));
    }
    Ok(PipeOpen {
        spec: spec.clone(),
        stop: stop.clone(),
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
    })
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
    #[test]
    fn stages_in_the_agent_leave_the_parameters_as_they_were() {
        let before = serde_json::json!({
            "preset": "vm", "query_bytes": 4096, "filters": 1, "copies": 1,
            "credits": 4, "compute_us": 0, "colocate": false
        });
        let p: PipeParams = serde_json::from_value(before.clone()).unwrap();
        assert_eq!(p.stages, Stages::Agent);
        let mut again = serde_json::to_value(&p).unwrap();
        again.as_object_mut().unwrap().remove("place");
        again.as_object_mut().unwrap().remove("staged");
        assert_eq!(again, before, "no key of the choice when it is the agent");
        let mut program = before;
        program["stages"] = "program".into();
        let p: PipeParams = serde_json::from_value(program).unwrap();
        assert_eq!(p.stages, Stages::Program);
        assert_eq!(serde_json::to_value(&p).unwrap()["stages"], "program");
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
