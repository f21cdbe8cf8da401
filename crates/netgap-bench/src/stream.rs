//! `stream`: the client sends N messages of X bytes back to back; the server,
//! on receipt of all N×X bytes (over an unreliable flow: received or counted
//! lost), sends a 1-byte acknowledgment. Bandwidth is
//! N×X over the time from the first send to the ack, minus the one-way
//! latency of the ack (seed 000). The ack latency is measured once per point,
//! in `setup`, by 1-byte round trips on the same flow.

use super::payload::{recv_checked, PatternCursor};
use super::{ClientRole, Metric, RepOutcome, RoleParams, ServerOutcome, ServerRole, Test};
use netgap_core::stats::{self, LatencyHistogram};
use netgap_core::units::{gbps, ns_since};
use netgap_transport::buffer::AlignedBuffer;
use netgap_transport::{Flow, FlowError};
use std::time::Instant;

/// The unidirectional bandwidth test.
pub struct Stream;

/// 1-byte round trips in `setup`, the first [`ACK_PROBE_WARMUP`] not counted.
const ACK_PROBE_ROUND_TRIPS: usize = 200;
/// Uncounted round trips at the start of the ack probe.
const ACK_PROBE_WARMUP: usize = 20;
/// Smallest receive buffer of the server, in bytes: small messages are
/// received in bulk, since a byte stream has no boundaries to honour.
const MIN_RECV_BUFFER_BYTES: usize = 256 * 1024;

struct Client {
    flow: Box<dyn Flow>,
    buf: AlignedBuffer,
    ack_one_way_ns: u64,
    tx: PatternCursor,
}

struct Server {
    flow: Box<dyn Flow>,
    buf: AlignedBuffer,
    size_bytes: u64,
    rx: PatternCursor,
}

/// Median one-way latency of a 1-byte message, in nanoseconds.
fn probe_ack_latency(flow: &mut dyn Flow) -> Result<u64, FlowError> {
    let mut byte = [0u8; 1];
    let mut half_rtts = Vec::with_capacity(ACK_PROBE_ROUND_TRIPS);
    for i in 0..ACK_PROBE_ROUND_TRIPS {
        let t0 = Instant::now();
        flow.send_all(&byte)?;
        flow.recv_exact(&mut byte)?;
        if i >= ACK_PROBE_WARMUP {
            half_rtts.push(ns_since(t0) as f64 / 2.0);
        }
    }
    Ok(stats::median(&half_rtts).unwrap_or(0.0) as u64)
}

impl ClientRole for Client {
    fn run(
        &mut self,
        iterations: u64,
        _rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        let (tx, rx) = self.flow.split();
        let t0 = Instant::now();
        for _ in 0..iterations {
            self.tx.fill(&mut self.buf);
            tx.send_all(&self.buf)?;
        }
        tx.end_burst()?;
        let mut ack = [0u8; 1];
        rx.recv_exact(&mut ack)?;
        let total_ns = ns_since(t0);
        // The ack's own flight is not part of the transfer; never let the
        // correction take more than half of a very short repetition.
        let elapsed_ns = total_ns - self.ack_one_way_ns.min(total_ns / 2);
        let bytes = self.buf.len() as u64 * iterations;
        Ok(RepOutcome {
            elapsed_ns,
            value: gbps(bytes as f64, elapsed_ns as f64),
            bytes_tx: bytes,
            bytes_rx: 1,
            helper_cpu_ns: 0,
        })
    }
}

/// The server's side of [`probe_ack_latency`]: echoes 1-byte messages.
fn echo_ack_probe(flow: &mut dyn Flow) -> Result<(), FlowError> {
    let mut byte = [0u8; 1];
    for _ in 0..ACK_PROBE_ROUND_TRIPS {
        flow.recv_exact(&mut byte)?;
        flow.send_all(&byte)?;
    }
    Ok(())
}

impl ServerRole for Server {
    fn run(&mut self, iterations: u64) -> Result<ServerOutcome, FlowError> {
        let (tx, rx) = self.flow.split();
        let total = self.size_bytes * iterations;
        let lost = recv_checked(rx, total, &mut self.buf, &mut self.rx)?;
        tx.send_all(&[1u8])?;
        Ok(ServerOutcome {
            bytes_rx: total.saturating_sub(lost),
            bytes_tx: 1,
            helper_cpu_ns: 0,
        })
    }
}

impl Test for Stream {
    fn name(&self) -> &'static str {
        "stream"
    }
    fn summary(&self) -> &'static str {
        "unidirectional bandwidth: N messages of X bytes, then a 1-byte ack"
    }
    fn metric(&self) -> Metric {
        Metric::BandwidthGbps
    }
    fn client(
        &self,
        params: RoleParams,
        mut flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ClientRole>, FlowError> {
        let ack_one_way_ns = probe_ack_latency(flow.as_mut())?;
        Ok(Box::new(Client {
            flow,
            buf: netgap_transport::buffer::message_buffer(params.size_bytes, params.buffer),
            ack_one_way_ns,
            tx: PatternCursor::new(params.verify),
        }))
    }
    fn server(
        &self,
        params: RoleParams,
        mut flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ServerRole>, FlowError> {
        echo_ack_probe(flow.as_mut())?;
        Ok(Box::new(Server {
            flow,
            buf: netgap_transport::buffer::message_buffer(
                params.size_bytes.max(MIN_RECV_BUFFER_BYTES),
                params.buffer,
            ),
            size_bytes: params.size_bytes as u64,
            rx: PatternCursor::new(params.verify),
        }))
    }
}
