//! `fanout`: one server streams to N clients, spread cyclically over the client hosts, at once; the headline is the aggregate bandwidth the clients receive (seeds 000, 001, 002).

use super::place::{self, HostView, Placement};
use super::role::{parse_params, NoParams, OpenRole, RoleContext, RoleError};
use super::stream::{self, Direction};
use super::{CountFlag, FlowSample, GroupMetric, Refused, Workload};
use netgap_core::spec::PointSpec;
use netgap_proto::group::{FlowReport, GroupRole, GroupSpec};
use netgap_transport::Transport;

const NAME: &str = "fanout";

/// The `fanout` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Fanout;

impl Workload for Fanout {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "one server streams to N clients at once; aggregate and per-flow bandwidth"
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
        stream::memory_bytes(Direction::FromServer, spec)
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let NoParams {} = parse_params(NAME, ctx.spec)?;
        stream::open(NAME, Direction::FromServer, ctx)
    }

    fn sample(&self, side: GroupRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        stream::sample(Direction::FromServer, side, report, window_ns)
    }
}
