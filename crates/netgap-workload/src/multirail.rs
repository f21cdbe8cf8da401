//! `multirail`: one client process streams over every link between the
//! first client host and the server at once, one flow per link, each bound
//! to its link's addresses; the headline is the aggregate bandwidth, with
//! each link's bytes and bandwidth in the record (seed 004). With
//! `--bidir` every flow sends both ways at once, as 004 measures
//! aggregation, and `--links 1,2,3` makes one point per link count. Over
//! `xdp` each flow is an AF_XDP socket on its own link's interface.

use super::place::{self, HostView, Placement};
use super::role::{parse_params, OpenRole, RoleContext, RoleError};
use super::stream::{self, Direction, StreamParams};
use super::{CountFlag, FlowSample, Refused, Workload};
use crate::About;
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::Transport;

const NAME: &str = "multirail";

/// The `multirail` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Multirail;

/// What `Multirail` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "one client process streams over every link to the server at once; per-link bandwidth",
    metric: Metric::BandwidthGbps,
    count: CountFlag::Hosts,
    max_flows: stream::MAX_STREAM_FLOWS,
    takes_bidir: true,
};

impl Workload for Multirail {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn default_size_bytes(&self, transport: &dyn Transport) -> u64 {
        stream::default_size_bytes(transport)
    }

    /// Each flow must leave from its own link's address. The clients dial
    /// the addresses the server's listeners announced, one per link, so a
    /// transport with addresses of its own (xdp's `IP/MAC/FLOW`) serves.
    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        super::check_crosses_hosts(NAME, spec, transport)?;
        if !transport.capabilities().binds_local {
            let binding: Vec<&str> = netgap_transport::registry()
                .iter()
                .filter(|t| t.capabilities().binds_local)
                .map(|t| t.name())
                .collect();
            return Err(Refused(format!(
                "{NAME} binds each flow to its link's address, which {} cannot do; use {}",
                spec.transport,
                binding.join(", ")
            )));
        }
        Ok(())
    }

    fn place(
        &self,
        _params: &serde_json::Value,
        count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        place::rails(NAME, count, hosts)
    }

    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        stream::memory_bytes(Direction::of(Direction::ToServer, spec), spec)
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let params: StreamParams = parse_params(NAME, ctx.spec)?;
        stream::open(NAME, params.direction(Direction::ToServer), ctx)
    }

    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        stream::sample(Direction::ToServer, side, report, window_ns)
    }
}
