//! `pingpong`: the client sends X bytes, the server returns X bytes; one-way
//! latency is half the mean round trip over N iterations (seeds 000, 001, 004).

use super::payload::PatternCursor;
use super::{ClientRole, Metric, RepOutcome, RoleParams, ServerOutcome, ServerRole, Test};
use netgap_core::stats::LatencyHistogram;
use netgap_transport::buffer::AlignedBuffer;
use netgap_transport::{Flow, FlowError};
use std::time::Instant;

/// The ping-pong latency test.
pub struct PingPong;

/// Client side of a ping-pong: times every round trip.
pub struct PingPongClient {
    flow: Box<dyn Flow>,
    buf: AlignedBuffer,
    tx: PatternCursor,
    rx: PatternCursor,
}

/// Server side of a ping-pong: echoes every message.
pub(crate) struct PingPongServer {
    flow: Box<dyn Flow>,
    buf: AlignedBuffer,
    rx: PatternCursor,
}

impl PingPongClient {
    /// A client for `params` over `flow`.
    pub fn new(params: RoleParams, flow: Box<dyn Flow>) -> Self {
        PingPongClient {
            flow,
            buf: netgap_transport::buffer::message_buffer(params.size_bytes, params.buffer),
            tx: PatternCursor::new(params.verify),
            rx: PatternCursor::new(params.verify),
        }
    }

    /// Runs `iterations` round trips, recording each in `rtt_hist`; returns
    /// the total time in nanoseconds.
    pub fn round_trips(
        &mut self,
        iterations: u64,
        rtt_hist: &mut LatencyHistogram,
    ) -> Result<u64, FlowError> {
        let (tx, rx) = self.flow.split();
        let t0 = Instant::now();
        let mut prev = t0;
        // The latest round trip's time, recorded once the next message has
        // gone: the histogram's work falls in that message's flight, not
        // between a reply and the next message, where it would be timed.
        let mut unrecorded_ns: Option<u64> = None;
        for _ in 0..iterations {
            self.tx.fill(&mut self.buf);
            let sent = tx.send_all(&self.buf);
            if let Some(ns) = unrecorded_ns.take() {
                rtt_hist.record_ns(ns);
            }
            sent?;
            rx.recv_exact(&mut self.buf)?;
            self.rx.check(&self.buf)?;
            let now = Instant::now();
            unrecorded_ns = Some(u64::try_from((now - prev).as_nanos()).unwrap_or(u64::MAX));
            prev = now;
        }
        if let Some(ns) = unrecorded_ns {
            rtt_hist.record_ns(ns);
        }
        Ok(u64::try_from((prev - t0).as_nanos()).unwrap_or(u64::MAX))
    }

    /// Payload bytes one iteration moves each way.
    pub fn size_bytes(&self) -> u64 {
        self.buf.len() as u64
    }
}

impl PingPongServer {
    /// A server for `params` over `flow`.
    pub(crate) fn new(params: RoleParams, flow: Box<dyn Flow>) -> Self {
        PingPongServer {
            flow,
            buf: netgap_transport::buffer::message_buffer(params.size_bytes, params.buffer),
            rx: PatternCursor::new(params.verify),
        }
    }
}

impl ClientRole for PingPongClient {
    fn run(
        &mut self,
        iterations: u64,
        rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        let elapsed_ns = self.round_trips(iterations, rtt_hist)?;
        let bytes = self.size_bytes() * iterations;
        Ok(RepOutcome {
            elapsed_ns,
            value: elapsed_ns as f64 / iterations as f64 / 2.0 / 1000.0,
            bytes_tx: bytes,
            bytes_rx: bytes,
            helper_cpu_ns: 0,
        })
    }
}

impl ServerRole for PingPongServer {
    fn run(&mut self, iterations: u64) -> Result<ServerOutcome, FlowError> {
        let (tx, rx) = self.flow.split();
        for _ in 0..iterations {
            rx.recv_exact(&mut self.buf)?;
            self.rx.check(&self.buf)?;
            tx.send_all(&self.buf)?;
        }
        let bytes = self.buf.len() as u64 * iterations;
        Ok(ServerOutcome {
            bytes_rx: bytes,
            bytes_tx: bytes,
            helper_cpu_ns: 0,
        })
    }
}

impl Test for PingPong {
    fn name(&self) -> &'static str {
        "pingpong"
    }
    fn summary(&self) -> &'static str {
        "one-way latency: half the round trip of X bytes each way"
    }
    fn metric(&self) -> Metric {
        Metric::LatencyUs
    }
    fn has_percentiles(&self) -> bool {
        true
    }
    fn client(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ClientRole>, FlowError> {
        Ok(Box::new(PingPongClient::new(params, flow)))
    }
    fn server(
        &self,
        params: RoleParams,
        flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ServerRole>, FlowError> {
        Ok(Box::new(PingPongServer::new(params, flow)))
    }
}
