//! The point-to-point tests: what is measured. Each test is one module with
//! a client role and a server role that talk over a [`Flow`] and never know
//! which transport carries it; the runner (`netgap_measure`) owns
//! repetitions, warm-up and timing around them, and an agent
//! (`netgap_agent`) plays either role for a coordinator. The crate sits
//! below both so that neither needs the other for the roles.
//!
//! Adding a test is one new module here plus one line in [`registry`].

pub mod bibw;
pub mod bibw_pingpong;
pub mod logp;
pub mod payload;
pub mod pingpong;
pub mod stream;

use netgap_core::stats::LatencyHistogram;
use netgap_transport::{DatagramStats, Flow, FlowError};

pub use netgap_core::metric::Metric;

/// What one repetition of a client role measured.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct RepOutcome {
    /// Wall time of the repetition in nanoseconds, as the test defines it.
    pub elapsed_ns: u64,
    /// The repetition's headline value in the test's [`Metric`] unit.
    pub value: f64,
    /// Payload bytes the client sent.
    pub bytes_tx: u64,
    /// Payload bytes the client received.
    pub bytes_rx: u64,
    /// CPU time of helper threads the role started, in nanoseconds.
    pub helper_cpu_ns: u64,
}

/// What one repetition of a server role moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ServerOutcome {
    /// Payload bytes the server received.
    pub bytes_rx: u64,
    /// Payload bytes the server sent.
    pub bytes_tx: u64,
    /// CPU time of helper threads the role started, in nanoseconds.
    pub helper_cpu_ns: u64,
}

/// What a role needs to know about its point.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RoleParams {
    /// Message size in bytes, at least 1.
    pub size_bytes: usize,
    /// Fill and check every payload byte (`--verify`).
    pub verify: bool,
    /// Where the message buffers' data starts (`--align`, `--offset`).
    pub buffer: netgap_transport::buffer::BufferLayout,
}

/// The client side of a test for one point (one message size). It owns the
/// point's flow, so a role may keep helper threads for the whole point.
pub trait ClientRole: Send {
    /// One repetition of `iterations` iterations. Latency tests record each
    /// iteration's round trip in nanoseconds into `rtt_hist`.
    fn run(
        &mut self,
        iterations: u64,
        rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError>;

    /// The datagram counters of the role's flow since it connected, for an
    /// unreliable flow (see [`netgap_transport::FlowMonitor`]); `None` for a
    /// reliable one. The runner reads them around each repetition.
    fn datagram_stats(&self) -> Option<DatagramStats> {
        None
    }
}

/// The server side of a test for one point; owns the point's flow.
pub trait ServerRole: Send {
    /// One repetition of `iterations` iterations.
    fn run(&mut self, iterations: u64) -> Result<ServerOutcome, FlowError>;
}

/// A test: a pair of roles and the metric they produce.
pub trait Test: Sync {
    /// Name used on the command line and in results.
    fn name(&self) -> &'static str;
    /// One line for `netgap list`.
    fn summary(&self) -> &'static str;
    /// The headline metric.
    fn metric(&self) -> Metric;
    /// Whether repetitions carry per-iteration round trips (latency percentiles).
    fn has_percentiles(&self) -> bool {
        false
    }
    /// The client role of a point over a connected flow. Any per-point
    /// setup runs here, while the server's [`Test::server`] runs on the
    /// other end (stream measures its ack latency, for example).
    fn client(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ClientRole>, FlowError>;
    /// The server role of a point over a connected flow.
    fn server(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ServerRole>, FlowError>;
}

/// Every test netgap has, in the order `netgap list` and the battery use.
pub fn registry() -> &'static [&'static dyn Test] {
    &[
        &pingpong::PingPong,
        &stream::Stream,
        &bibw_pingpong::BibwPingPong,
        &bibw::Bibw,
        &logp::SEND,
        &logp::RECV,
        &logp::HALF_RTT,
    ]
}

/// The test called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static dyn Test> {
    netgap_core::registry::find(registry(), name)
}

/// Names of all tests, comma separated, for error messages.
pub fn names() -> String {
    netgap_core::registry::names(registry())
}

impl netgap_core::registry::Named for dyn Test {
    fn name(&self) -> &'static str {
        Test::name(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_are_unique_and_findable() {
        for t in registry() {
            assert_eq!(find(t.name()).map(|f| f.name()), Some(t.name()));
        }
        let mut n: Vec<_> = registry().iter().map(|t| t.name()).collect();
        n.dedup();
        assert_eq!(n.len(), registry().len());
    }

    #[test]
    fn no_workload_shares_a_test_name() {
        for w in netgap_workload::registry() {
            assert!(find(w.name()).is_none(), "{}", w.name());
        }
    }
}
