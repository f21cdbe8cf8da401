//! `bibw-pingpong`: data flows both ways alternately, 2X bytes per round trip;
//! bandwidth is 2X over the round-trip time (seed 004's bidirectional
//! ping-pong bandwidth).

use super::pingpong::{PingPongClient, PingPongServer};
use super::{ClientRole, Metric, RepOutcome, RoleParams, ServerRole, Test};
use netgap_core::stats::LatencyHistogram;
use netgap_core::units::gbps;
use netgap_transport::{Flow, FlowError};

/// The bidirectional ping-pong bandwidth test.
pub(crate) struct BibwPingPong;

struct Client(PingPongClient);

impl ClientRole for Client {
    fn run(
        &mut self,
        iterations: u64,
        rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        let elapsed_ns = self.0.round_trips(iterations, rtt_hist)?;
        let bytes = self.0.size_bytes() * iterations;
        Ok(RepOutcome {
            elapsed_ns,
            value: gbps((2 * bytes) as f64, elapsed_ns as f64),
            bytes_tx: bytes,
            bytes_rx: bytes,
            helper_cpu_ns: 0,
        })
    }
}

impl Test for BibwPingPong {
    fn name(&self) -> &'static str {
        "bibw-pingpong"
    }
    fn summary(&self) -> &'static str {
        "bidirectional ping-pong bandwidth: 2X bytes per round trip"
    }
    fn metric(&self) -> Metric {
        Metric::BandwidthGbps
    }
    fn has_percentiles(&self) -> bool {
        true
    }
    fn client(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ClientRole>, FlowError> {
        Ok(Box::new(Client(PingPongClient::new(params, flow))))
    }
    fn server(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ServerRole>, FlowError> {
        Ok(Box::new(PingPongServer::new(params, flow)))
    }
}
