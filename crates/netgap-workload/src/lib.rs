//! Multi-host workloads: what runs across several hosts at once, on the
//! agents of a workload run. This crate holds the workloads and their roles,
//! the real server programs some of them start (`service`), the agent's
//! shards that carry a role past one process's limits ([`shard`]), and the
//! agent's confined directories and tethered children ([`confined`],
//! [`tether`]). It knows nothing of the coordinator, plans or sinks
//! (`netgap-measure` drives it).
//!
//! A workload
//! is one module implementing [`Workload`] plus one line in [`registry`],
//! and nothing else names it:
//!
//! - its **plan** part says which count it reads (`--clients`, `-P`, or the
//!   links of the hosts), its default size, which transports, modes and
//!   options it refuses (one line each), and the typed parameters that go
//!   to the agents with every role ([`Workload::params`]);
//! - its **placement** puts roles on hosts ([`Workload::place`]): server
//!   roles that listen and announce their data addresses, client roles
//!   whose flows connect to a server role, on as many server and client
//!   hosts as it wants ([`place`] has the cyclic allotment and the shapes
//!   the built-in workloads share);
//! - its **agent** part opens a role on an agent ([`Workload::open`]): it
//!   parses and checks its own parameters against the agent's limits, then
//!   listens, accepts, connects (or, for a workload with a real server,
//!   starts it) and runs after the coordinator's barrier ([`role`]);
//! - its **reduction** turns each flow report into the flow's value and
//!   bytes ([`Workload::sample`]) and picks the record's percentiles; the
//!   workload coordinator does the rest (statistics over repetitions, CPU of
//!   every host, the record).
//!
//! The workloads of [`registry`] share two role implementations: `stream`
//! (bandwidth, a thread per flow over any cross-host transport) and
//! `engine` (request/response and connect-per-request flows, thousands per
//! agent, on the flow engine over any transport with an engine data path).

mod allot;
pub mod confined;
mod connect;
mod engine;
mod fanin;
mod fanout;
mod gather;
mod hotspot;
mod multirail;
mod multistream;
pub mod options;
mod pio;
mod pipeline;
pub mod place;
pub mod preload;
pub mod role;
mod service;
pub mod shard;
mod staged;
mod stream;
pub mod tether;
mod web;

pub use gather::load_child::run_gather_child;
pub use pipeline::stages_child::{run_stages_child as run_pipeline_stages_child, StagesError};
pub use web::load_child::run_load_child as run_web_load_child;
pub use web::load_child::LoadChildError;

use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::Transport;
use place::{HostView, Placement};
use role::{OpenRole, RoleContext, RoleError};

/// Which count of the run a workload's points are made for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CountFlag {
    /// `--clients N`: clients spread over the client hosts.
    Clients,
    /// `-P N`: parallel streams.
    Streams,
    /// Neither: the hosts decide (one flow per link).
    Hosts,
}

/// A refusal of a workload at plan or placement time: one line naming what
/// cannot be done and what to change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

/// What one report says about its flow, for the reduction to records.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FlowSample {
    /// The flow's value in the workload's unit, when this end measures it.
    pub value: Option<f64>,
    /// Payload bytes the flow sent, as this end counts them.
    pub bytes_tx: u64,
    /// Payload bytes the flow received, as this end counts them.
    pub bytes_rx: u64,
    /// Payload bytes received inside the measured window (a link's bytes).
    pub window_bytes: u64,
    /// The flow's latency percentiles, when this end times it.
    pub percentiles: Option<Percentiles>,
}

/// What a workload is, as `netgap list`, the plan and the command line see
/// it: one constant in its module.
#[derive(Debug, Clone, Copy)]
pub struct About {
    /// Name on the command line, in results and on the wire.
    pub name: &'static str,
    /// One line for `netgap list`.
    pub summary: &'static str,
    /// Headline metric.
    pub metric: Metric,
    /// Which count its points are made for.
    pub count: CountFlag,
    /// Most flows one point may have.
    pub max_flows: u32,
    /// Whether its flows can carry payload both ways at once (`--bidir`,
    /// which then arrives in its parameters as `"bidir": true`).
    pub takes_bidir: bool,
}

/// A multi-host workload. Implementations are unit structs listed once in
/// [`registry`]; everything else finds them by name.
pub trait Workload: Sync {
    /// What it is: name, summary, headline metric, count, flow limit,
    /// `--bidir`.
    fn about(&self) -> &About;

    /// Name on the command line, in results and on the wire.
    fn name(&self) -> &'static str {
        self.about().name
    }

    /// One line for `netgap list`.
    fn summary(&self) -> &'static str {
        self.about().summary
    }

    /// Headline metric.
    fn metric(&self) -> Metric {
        self.about().metric
    }

    /// Which count its points are made for.
    fn count(&self) -> CountFlag {
        self.about().count
    }

    /// Most flows one point may have.
    fn max_flows(&self) -> u32 {
        self.about().max_flows
    }

    /// Message size of a point when the run names none, in bytes.
    fn default_size_bytes(&self, transport: &dyn Transport) -> u64;

    /// Refuses, in one line, a point this workload cannot run as asked: a
    /// transport, mode or option it cannot honour. Runs in the plan, before
    /// any host is contacted.
    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused>;

    /// The workload's own options ([`options`]): flags the command line
    /// offers for it, parsed and range-checked by the plan; none by
    /// default.
    fn options(&self) -> &'static [&'static options::WorkloadOption] {
        &[]
    }

    /// Refuses, in one line, a point whose workload options do not go with
    /// its transport (a pipeline's stages as a sockets program over a
    /// transport programs cannot use). Runs in the plan, before any host
    /// is contacted, beside [`Workload::check`], which sees no options;
    /// any options go with any transport by default.
    fn check_args(
        &self,
        spec: &PointSpec,
        transport: &dyn Transport,
        args: &options::WorkloadArgs,
    ) -> Result<(), Refused> {
        let _ = (spec, transport, args);
        Ok(())
    }

    /// How the command line asks for this workload's points whose roles
    /// run programs under netgap's preload library (`gather --responder
    /// gmond`), for the refusal of `--preload-relayed` elsewhere
    /// ([`preload_relayed_takers`]); `None`, it runs none, by default.
    fn wrapped_programs(&self) -> Option<&'static str> {
        None
    }

    /// Whether the roles of this point, with these options, run programs
    /// under netgap's preload library (the ones whose connections to
    /// other hosts go direct, or stay on the relays with
    /// `--preload-relayed`); none by default.
    fn wraps_programs(&self, spec: &PointSpec, args: &options::WorkloadArgs) -> bool {
        let _ = (spec, args);
        false
    }

    /// The typed parameters every role of the point gets, as the JSON
    /// object its own [`Workload::open`] parses, from the point and the
    /// values of the workload's options for it; none by default.
    fn params(&self, spec: &PointSpec, args: &options::WorkloadArgs) -> serde_json::Value {
        let _ = (spec, args);
        serde_json::Value::Object(serde_json::Map::new())
    }

    /// A repetition's figures besides the headline (`payload_gbps`,
    /// `errors`, `connect_share_pct`), from what each role reported in its
    /// outcome's `metrics`; the record holds their mean over repetitions.
    /// By default each name is summed over the roles.
    fn metrics(
        &self,
        roles: &[(WorkloadRole, &std::collections::BTreeMap<String, f64>)],
        window_ns: u64,
    ) -> std::collections::BTreeMap<String, f64> {
        let _ = window_ns;
        let mut out = std::collections::BTreeMap::new();
        for (_, m) in roles {
            for (k, v) in m.iter() {
                *out.entry(k.clone()).or_insert(0.0) += v;
            }
        }
        out
    }

    /// Whether its flows can carry payload both ways at once (`--bidir`).
    fn takes_bidir(&self) -> bool {
        self.about().takes_bidir
    }

    /// Places the roles of a point of `count` (clients, streams; for
    /// [`CountFlag::Hosts`] the links to use, 0 for every link) on `hosts`;
    /// `params` are the point's ([`Workload::params`]), for a workload
    /// whose options decide its shape (servers, stages) or its limits.
    fn place(
        &self,
        params: &serde_json::Value,
        count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused>;

    /// The workload's staged part, for a workload whose placement is
    /// staged ([`place::Staged`]); `None`, not staged, by default.
    fn staged(&self) -> Option<&dyn StagedWorkload> {
        None
    }

    /// Memory this agent's role of a point would commit (buffers, threads,
    /// per-flow state), in bytes, computed before anything is allocated and
    /// checked against the agent's `--max-memory`. The default bounds a
    /// role whose every flow holds a send and a receive buffer of its
    /// largest message (`role::memory_bytes`); a workload whose flows
    /// share buffers says less.
    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        role::memory_bytes(spec)
    }

    /// Opens this agent's role of a point: parses and checks the
    /// parameters, then listens or connects. Never panics on peer input.
    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError>;

    /// What `report`, from a role on `side`, says about its flow over a
    /// window of `window_ns`.
    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample;

    /// The record's percentiles from every client exchange of the point;
    /// none by default.
    fn percentiles(&self, hist: &LatencyHistogram) -> Option<Percentiles> {
        let _ = hist;
        None
    }
}

/// What a staged workload (pipeline, pio) adds to [`Workload`]. Its
/// placement is staged ([`place::Staged`]): roles are prepared in order,
/// every role listens for the roles after it and is told the placement
/// and the addresses of the roles before it, so one role may accept from
/// some roles and connect to several others (a pipeline's filter stage; a
/// client of several I/O servers). A staged placement names no
/// `connects_to`.
pub trait StagedWorkload: Sync {
    /// A repetition's headline from its figures ([`Workload::metrics`],
    /// combined over roles), which is not a combination of per-flow
    /// values (all bytes over the slowest client's time). `None`: the
    /// repetition gave none.
    fn headline(&self, metrics: &std::collections::BTreeMap<String, f64>) -> Option<f64>;
}

impl<'a> dyn Workload + 'a {
    /// A repetition's headline from its per-flow values and its figures
    /// ([`Workload::metrics`], combined over roles): a staged workload's
    /// own ([`StagedWorkload::headline`]), else the metric's combination of
    /// the values ([`Metric::headline`]). `None`: the repetition gave
    /// none.
    pub fn headline(
        &self,
        values: &[f64],
        metrics: &std::collections::BTreeMap<String, f64>,
    ) -> Option<f64> {
        match self.staged() {
            Some(staged) => staged.headline(metrics),
            None => self.metric().headline(values),
        }
    }
}

/// Every workload, in the order `netgap list` shows them.
pub fn registry() -> &'static [&'static dyn Workload] {
    &[
        &multistream::MULTISTREAM,
        &hotspot::Hotspot,
        &fanin::FANIN,
        &fanout::FANOUT,
        &connect::Connect,
        &multirail::Multirail,
        &web::Web,
        &gather::Gather,
        &pipeline::Pipeline,
        &pio::Pio,
    ]
}

/// The workload called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn Workload> {
    netgap_core::registry::find(registry(), name)
}

/// Names of all workloads, comma separated.
pub fn names() -> String {
    netgap_core::registry::names(registry())
}

impl netgap_core::registry::Named for dyn Workload {
    fn name(&self) -> &'static str {
        Workload::name(self)
    }
}

/// The workloads whose points may run programs under the preload
/// library, as the command line asks for them: `web, gather --responder
/// gmond, pipeline --stages program`.
pub fn preload_relayed_takers() -> String {
    registry()
        .iter()
        .filter_map(|w| w.wrapped_programs())
        .collect::<Vec<_>>()
        .join(", ")
}

/// Refuses, in one line, `--preload-relayed` for a point whose roles run
/// no programs under the preload library: it would change nothing.
pub fn check_preload_relayed(
    workload: &dyn Workload,
    spec: &PointSpec,
    args: &options::WorkloadArgs,
) -> Result<(), Refused> {
    if !spec.options.preload_relayed || workload.wraps_programs(spec, args) {
        return Ok(());
    }
    Err(Refused(format!(
        "--preload-relayed does not apply to this {} point: it runs no programs under the preload library; it acts on {}",
        workload.name(),
        preload_relayed_takers()
    )))
}

/// Refuses a transport that cannot connect two hosts, or whose flows are
/// not addressed by `IP:PORT` (the workloads that aim a flow at a host's
/// address need that).
pub(crate) fn check_cross_host(
    workload: &str,
    spec: &PointSpec,
    transport: &dyn Transport,
) -> Result<(), Refused> {
    check_crosses_hosts(workload, spec, transport)?;
    check_ip_port(workload, spec, transport)
}

/// Refuses a transport whose flows are not addressed by `IP:PORT` (xdp's
/// are `IP/MAC/FLOW`), for the workloads that compose `IP:PORT` targets
/// themselves (the flow engine's, `gather`); the bandwidth ones and the
/// staged ones (`pipeline`, `pio`) dial what their listeners announced, in
/// the transport's own form, and do not call this.
pub(crate) fn check_ip_port(
    workload: &str,
    spec: &PointSpec,
    transport: &dyn Transport,
) -> Result<(), Refused> {
    if !transport.capabilities().ip_port_addresses {
        return Err(Refused(format!(
            "{workload}: transport {} has flows not addressed by IP:PORT; run pingpong, stream, bibw, bibw-pingpong, multistream, fanin, fanout, multirail, pipeline or pio over it",
            spec.transport
        )));
    }
    Ok(())
}

/// Refuses a transport that cannot connect two hosts. A workload whose
/// clients dial only the addresses the servers announced (their listeners'
/// own, whatever their form) needs no more.
pub(crate) fn check_crosses_hosts(
    workload: &str,
    spec: &PointSpec,
    transport: &dyn Transport,
) -> Result<(), Refused> {
    if !transport.capabilities().cross_host {
        let cross: Vec<&str> = netgap_transport::registry()
            .iter()
            .filter(|t| t.capabilities().cross_host)
            .map(|t| t.name())
            .collect();
        return Err(Refused(format!(
            "{workload}: transport {} cannot cross hosts; use {}",
            spec.transport,
            cross.join(", ")
        )));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_transport_without_ip_port_addresses_is_refused_in_one_line() {
        use netgap_core::spec::{Mode, TransportOptions};
        let mut spec = PointSpec {
            test: "multistream".into(),
            transport: "xdp".into(),
            mode: Mode::Event,
            size_bytes: 65536,
            options: TransportOptions::default(),
            server_cpu: None,
            io_timeout_ms: 3000,
            verify: false,
        };
        for w in ["hotspot", "connect"] {
            spec.test = w.into();
            let e = find(w)
                .unwrap()
                .check(&spec, &netgap_transport::xdp::Xdp)
                .unwrap_err();
            assert!(e.0.contains("not addressed by IP:PORT"), "{w}: {e}");
        }
        spec.transport = "tcp".into();
        assert!(check_cross_host("hotspot", &spec, &netgap_transport::tcp::Tcp).is_ok());
        // The bandwidth and staged workloads dial only what listeners
        // announced, in the transport's own form: xdp passes their checks.
        spec.transport = "xdp".into();
        for (w, size) in [
            ("multistream", 65536),
            ("fanin", 65536),
            ("fanout", 65536),
            ("multirail", 65536),
            ("pipeline", 16384),
            ("pio", 65536),
        ] {
            spec.test = w.into();
            spec.size_bytes = size;
            let workload = find(w).unwrap();
            assert!(
                workload.check(&spec, &netgap_transport::xdp::Xdp).is_ok(),
                "{w}"
            );
        }
    }

    #[test]
    fn preload_relayed_is_refused_for_a_point_that_wraps_no_programs() {
        use netgap_core::spec::{Mode, TransportOptions};
        use options::{OptionValue, WorkloadArgs};
        let args = |pairs: &[(&'static str, &str)]| {
            WorkloadArgs(
                pairs
                    .iter()
                    .map(|(k, v)| (*k, OptionValue::Name((*v).into())))
                    .collect(),
            )
        };
        let mut spec = PointSpec {
            test: "web".into(),
            transport: "xdp".into(),
            mode: Mode::Event,
            size_bytes: 1024,
            options: TransportOptions {
                preload_relayed: true,
                ..TransportOptions::default()
            },
            server_cpu: None,
            io_timeout_ms: 3000,
            verify: false,
        };
        assert_eq!(
            preload_relayed_takers(),
            "web, gather --responder gmond, pipeline --stages program"
        );
        let check = |w: &str, spec: &PointSpec, a: &WorkloadArgs| {
            check_preload_relayed(find(w).unwrap(), spec, a)
        };
        // The workloads' programs under the library over xdp.
        assert!(check("web", &spec, &args(&[])).is_ok());
        assert!(check("gather", &spec, &args(&[("responder", "gmond")])).is_ok());
        assert!(check("pipeline", &spec, &args(&[("stages", "program")])).is_ok());
        // Points whose roles are netgap's own.
        for (w, a) in [
            ("multistream", args(&[])),
            ("gather", args(&[("responder", "builtin")])),
            ("pipeline", args(&[])),
            ("pipeline", args(&[("stages", "agent")])),
        ] {
            let e = check(w, &spec, &a).unwrap_err().to_string();
            assert_eq!(
                e,
                format!("--preload-relayed does not apply to this {w} point: it runs no programs under the preload library; it acts on web, gather --responder gmond, pipeline --stages program"),
            );
        }
        // Without the option nothing is refused.
        spec.options.preload_relayed = false;
        assert!(check("multistream", &spec, &args(&[])).is_ok());
    }

    #[test]
    fn names_are_unique_and_valid_wire_names() {
        for w in registry() {
            assert_eq!(find(w.name()).map(|f| f.name()), Some(w.name()));
            netgap_core::spec::check_name("test", w.name()).expect("valid wire name");
        }
    }
}
