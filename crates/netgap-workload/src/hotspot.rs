//! `hotspot`: N clients, spread cyclically over the client hosts, run
//! back-to-back ping-pong against one server at once; the headline is the
//! mean one-way latency over the clients (seeds 000, 001, 002).

use super::place::{self, HostView, Placement};
use super::role::{parse_params, NoParams, OpenRole, RoleContext, RoleError};
use super::{engine, CountFlag, FlowSample, Refused, Workload};
use crate::About;
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::flows::FlowWork;
use netgap_transport::Transport;

const NAME: &str = "hotspot";

/// The `hotspot` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Hotspot;

/// Mean one-way latency in µs of `round_trips` back-to-back round trips
/// in `window_ns` (each took window / count); NaN without a round trip.
fn one_way_latency_us(round_trips: u64, window_ns: u64) -> f64 {
    if round_trips == 0 {
        return f64::NAN;
    }
    window_ns as f64 / round_trips as f64 / 2.0 / 1000.0
}

/// What `Hotspot` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "N clients run pingpong against one server at once; mean and per-client latency",
    metric: Metric::LatencyUs,
    count: CountFlag::Clients,
    max_flows: engine::MAX_ENGINE_FLOWS,
    takes_bidir: false,
};

impl Workload for Hotspot {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        engine::memory_bytes(spec)
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        1
    }

    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        super::check_cross_host(NAME, spec, transport)?;
        engine::check(NAME, spec, transport)
    }

    fn place(
        &self,
        _params: &serde_json::Value,
        count: u32,
        hosts: &[HostView],
    ) -> Result<Placement, Refused> {
        place::spread(count, hosts)
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let NoParams {} = parse_params(NAME, ctx.spec)?;
        let size_bytes =
            usize::try_from(ctx.spec.point.size_bytes).map_err(|_| RoleError::Params {
                workload: NAME,
                detail: "the size does not fit in memory".into(),
            })?;
        engine::open(NAME, FlowWork::PingPong { size_bytes }, 0.5, ctx)
    }

    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        engine::sample(side, report, window_ns, one_way_latency_us)
    }

    fn percentiles(&self, hist: &LatencyHistogram) -> Option<Percentiles> {
        hist.percentiles_us(0.5)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_is_half_the_round_trip_of_back_to_back_exchanges() {
        // 10,000 back-to-back round trips in 1 s: 100 us each, 50 us one way.
        assert!((one_way_latency_us(10_000, 1_000_000_000) - 50.0).abs() < 1e-9);
        assert!(one_way_latency_us(0, 1_000_000_000).is_nan());
    }
}
