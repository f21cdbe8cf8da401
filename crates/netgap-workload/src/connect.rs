//! `connect`: N clients, spread cyclically over the client hosts, each
//! repeatedly opens a connection to one server, sends a request, reads the
//! reply and closes; the headline is connections per second, all clients
//! together, with the latency of connection setup plus exchange, and the
//! mean setup time alone beside it (`app.metrics.setup_time_us`,
//! `connection_time_us`, `setup_share_pct`; seeds 000, 002).

use super::place::{self, HostView, Placement};
use super::role::{parse_params, OpenRole, RoleContext, RoleError};
use super::{engine, CountFlag, FlowSample, Refused, Workload};
use crate::About;
use netgap_core::metric::Metric;
use netgap_core::spec::PointSpec;
use netgap_core::stats::{LatencyHistogram, Percentiles};
use netgap_proto::workload::{FlowReport, WorkloadRole, WorkloadSpec};
use netgap_transport::flows::FlowWork;
use netgap_transport::Transport;
use serde::{Deserialize, Serialize};

const NAME: &str = "connect";

/// The `connect` workload.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Connect;

/// What every connection exchanges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Params {
    /// Request size, bytes.
    pub request_bytes: u64,
    /// Reply size, bytes.
    pub reply_bytes: u64,
}

/// Connections per second: `connections` completed in `window_ns`.
fn connections_per_s(connections: u64, window_ns: u64) -> f64 {
    if window_ns == 0 {
        return 0.0;
    }
    connections as f64 / (window_ns as f64 / 1e9)
}

/// What `Connect` is, for `netgap list`, the plan and the command line.
const ABOUT: About = About {
    name: NAME,
    summary: "N clients open a connection, exchange one request and reply, close; connections/s",
    metric: Metric::ConnectionsPerS,
    count: CountFlag::Clients,
    max_flows: engine::MAX_ENGINE_FLOWS,
    takes_bidir: false,
};

impl Workload for Connect {
    fn about(&self) -> &About {
        &ABOUT
    }

    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        engine::memory_bytes(spec)
    }

    fn default_size_bytes(&self, _transport: &dyn Transport) -> u64 {
        1
    }

    /// Besides the engine's refusals, a transport whose engine flows are
    /// datagrams: with no connection there is no setup to measure.
    fn check(&self, spec: &PointSpec, transport: &dyn Transport) -> Result<(), Refused> {
        super::check_cross_host(NAME, spec, transport)?;
        if transport.engine_path().is_some_and(|p| p.datagrams()) {
            let connected: Vec<&str> = netgap_transport::registry()
                .iter()
                .filter(|t| t.engine_path().is_some_and(|p| !p.datagrams()))
                .map(|t| t.name())
                .collect();
            return Err(Refused(format!(
                "{NAME} measures connection setup, which {} does not have (it sends datagrams without connections); use {}",
                spec.transport,
                connected.join(", ")
            )));
        }
        engine::check(NAME, spec, transport)
    }

    /// The request and the reply are both the point's size.
    fn params(&self, spec: &PointSpec, _args: &super::options::WorkloadArgs) -> serde_json::Value {
        serde_json::json!(Params {
            request_bytes: spec.size_bytes,
            reply_bytes: spec.size_bytes,
        })
    }

    /// Connection setup alone beside connect-and-exchange, over every
    /// client host's connections.
    fn metrics(
        &self,
        roles: &[(WorkloadRole, &std::collections::BTreeMap<String, f64>)],
        _window_ns: u64,
    ) -> std::collections::BTreeMap<String, f64> {
        engine::connection_times(roles)
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
        let p: Params = parse_params(NAME, ctx.spec)?;
        let size = |field: &str, b: u64| -> Result<usize, RoleError> {
            netgap_core::spec::check_size(b).map_err(|e| RoleError::Params {
                workload: NAME,
                detail: format!("{field}: {e}"),
            })?;
            ctx.limits.check_message_bytes(b)?;
            usize::try_from(b).map_err(|_| RoleError::Params {
                workload: NAME,
                detail: format!("{field} does not fit in memory"),
            })
        };
        let work = FlowWork::Connect {
            request_bytes: size("request_bytes", p.request_bytes)?,
            reply_bytes: size("reply_bytes", p.reply_bytes)?,
        };
        engine::open(NAME, work, 1.0, ctx)
    }

    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        engine::sample(side, report, window_ns, connections_per_s)
    }

    fn percentiles(&self, hist: &LatencyHistogram) -> Option<Percentiles> {
        hist.percentiles_us(1.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connections_per_second_over_the_window() {
        assert!((connections_per_s(500, 500_000_000) - 1000.0).abs() < 1e-9);
        assert_eq!(connections_per_s(5, 0), 0.0);
    }
}
