//! `fanin`: clients, spread cyclically over the client hosts, stream to one server at once; the headline is the aggregate bandwidth the server receives (seeds 000, 001, 002).

use super::place::{self, HostView, Placement};
use super::role::{parse_params, NoParams, OpenRole, RoleContext, RoleError};
use super::stream::{self, Direction};
use super::{CountFlag, FlowSample, GroupMetric, Refused, Workload};
use netgap_core::spec::PointSpec;
use netgap_proto::group::{FlowReport, GroupRole, GroupSpec};
use netgap_transport::Transport;

const NAME: &str = "fanin";

/// The `fanin` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fanin;

impl Workload for Fanin {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "N clients stream to one server at once; aggregate and per-flow bandwidth"
    }

    fn metric(&self) -> GroupMetric {
        GroupMetric::BandwidthGbps
    }

    fn count(&self) -> CountFlag {
        CountFlag::Clients
    }

    fn max_flows(&self) -> u32 {
        stream::MAX_STREAM_FLOWS
    }

    fn default_size_bytes(&self, transport: &dyn Transport) -> u64 {
        stream::default_size_bytes(transport)
    }

    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        super::check_cross_host(NAME, spec, transport)
    }

    fn place(&self, count: u32, hosts: &[HostView]) -> Result<Placement, Refused> {
        place::spread(count, hosts)
    }

    fn memory_bytes(&self, spec: &GroupSpec) -> u64 {
        stream::memory_bytes(Direction::ToServer, spec)
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let NoParams {} = parse_params(NAME, ctx.spec)?;
        stream::open(NAME, Direction::ToServer, ctx)
    }

    fn sample(&self, side: GroupRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        stream::sample(Direction::ToServer, side, report, window_ns)
    }
}
