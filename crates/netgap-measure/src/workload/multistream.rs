//! `multistream`: -P N simultaneous streams from the first client host to the server; the headline is their aggregate bandwidth (seeds 000, 001, 002).

use super::place::{self, HostView, Placement};
use super::role::{parse_params, NoParams, OpenRole, RoleContext, RoleError};
use super::stream::{self, Direction};
use super::{CountFlag, FlowSample, GroupMetric, Refused, Workload};
use netgap_core::spec::PointSpec;
use netgap_proto::group::{FlowReport, GroupRole, GroupSpec};
use netgap_transport::Transport;

const NAME: &str = "multistream";

/// The `multistream` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Multistream;

impl Workload for Multistream {
    fn name(&self) -> &'static str {
        NAME
    }

    fn summary(&self) -> &'static str {
        "-P N parallel streams from one client host to the server; aggregate bandwidth"
    }

    fn metric(&self) -> GroupMetric {
        GroupMetric::BandwidthGbps
    }

    fn count(&self) -> CountFlag {
        CountFlag::Streams
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
        place::streams(count, hosts)
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
