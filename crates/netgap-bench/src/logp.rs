//! `logp-send` and `logp-recv`: the host overheads of the LogP model (seed
//! 004, "Host Overheads"), measured from the client end of a ping-pong whose
//! server simply echoes.
//!
//! Each iteration: the client first waits (see [`SETTLE_BOUNDS`]) after the previous
//! reply, so the server, which went back to its receive call right after
//! replying, is blocked waiting; it then times its send call of X bytes: the
//! send overhead o_s. It then waits until the whole X-byte reply is in its
//! receive buffer (FIONREAD on sockets; on a transport that cannot tell,
//! twice the round trip measured at setup plus [`FALLBACK_MARGIN`]), and
//! times its receive call: the receive overhead o_r. A repetition's value is
//! the median call time of its iterations, in microseconds, so a call the
//! scheduler preempted does not stand for all. `logp-send` reports o_s,
//! `logp-recv` o_r, `logp-rtt` the median half round trip of a plain
//! ping-pong for L (the record's metric says `latency_us` under `netgap
//! run`; `netgap logp` names them).
//!
//! Limits: a message larger than the socket buffers cannot sit whole in the
//! receive buffer nor leave in one send call, so above the buffer sizes o_s
//! includes waiting for the receiver and o_r includes the rest of the
//! transfer (the wait gives up once the buffer stops filling).

use super::payload::PatternCursor;
use super::pingpong::PingPongServer;
use super::{ClientRole, Metric, RepOutcome, RoleParams, ServerRole, Test};
use netgap_core::stats::{self, LatencyHistogram};
use netgap_core::units::ns_since;
use netgap_transport::buffer::AlignedBuffer;
use netgap_transport::{Flow, FlowError, Receiver};
use std::time::{Duration, Instant};

/// Pause after a reply before timing the next send, so the server is
/// blocked in its receive call: half the round trip of the point's size
/// (the server's turnaround from its send back to its receive takes less),
/// within these bounds. Much longer pauses let the server's CPU fall idle,
/// and waking it would then land in the timed send.
pub const SETTLE_BOUNDS: (Duration, Duration) =
    (Duration::from_micros(5), Duration::from_micros(50));
/// Added to twice the round trip when a transport cannot report queued
/// bytes.
pub const FALLBACK_MARGIN: Duration = Duration::from_micros(200);
/// The receive buffer counts as full once it has not grown for this long.
const STALL: Duration = Duration::from_micros(500);
/// Round trips at setup that estimate the round trip of the point's size.
const PROBE_ROUND_TRIPS: usize = 16;

/// Which overhead a test reports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Overhead {
    /// o_s: the send call while the receiver waits.
    Send,
    /// o_r: the receive call once the data has arrived.
    Recv,
    /// Half the round trip of a plain ping-pong, by the same median, for
    /// L = RTT/2 − o_s − o_r.
    HalfRoundTrip,
}

/// The LogP overhead test reporting one of the two overheads.
pub(crate) struct LogpOverhead(pub Overhead);

/// `logp-send`.
pub(crate) const SEND: LogpOverhead = LogpOverhead(Overhead::Send);
/// `logp-recv`.
pub(crate) const RECV: LogpOverhead = LogpOverhead(Overhead::Recv);
/// `logp-rtt`.
pub(crate) const HALF_RTT: LogpOverhead = LogpOverhead(Overhead::HalfRoundTrip);

struct Client {
    which: Overhead,
    flow: Box<dyn Flow>,
    buf: AlignedBuffer,
    rtt: Duration,
    tx: PatternCursor,
    rx: PatternCursor,
}

/// Waits until `size` bytes are queued on `rx`, the queue stops growing, or
/// (when the transport cannot tell) the fallback wait has passed.
fn wait_for_arrival(
    rx: &dyn Receiver,
    size: u64,
    fallback: Duration,
    timeout: Duration,
) -> Result<(), FlowError> {
    let t0 = Instant::now();
    if rx.ready_bytes().is_none() {
        spin_for(fallback);
        return Ok(());
    }
    let mut last = 0u64;
    let mut last_change = t0;
    loop {
        let ready = rx.ready_bytes().unwrap_or(size);
        if ready >= size {
            return Ok(());
        }
        let now = Instant::now();
        if ready != last {
            last = ready;
            last_change = now;
        } else if ready > 0 && now - last_change >= STALL {
            return Ok(());
        }
        if now - t0 >= timeout {
            return Err(FlowError::TimedOut {
                timeout_ms: timeout.as_millis(),
            });
        }
        std::hint::spin_loop();
    }
}

/// Busy-waits for `d`. Waits spin rather than sleep: a sleeping CPU wakes
/// cold (caches, idle states, on a virtual machine an exit to the
/// hypervisor), and that cost would land in the next timed call.
fn spin_for(d: Duration) {
    let t0 = Instant::now();
    while t0.elapsed() < d {
        std::hint::spin_loop();
    }
}

impl ClientRole for Client {
    fn run(
        &mut self,
        iterations: u64,
        rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        let size = self.buf.len() as u64;
        let fallback = 2 * self.rtt + FALLBACK_MARGIN;
        let settle = (self.rtt / 2).clamp(SETTLE_BOUNDS.0, SETTLE_BOUNDS.1);
        let timeout = (100 * self.rtt).max(Duration::from_secs(3));
        let (tx, rx) = self.flow.split();
        let t_start = Instant::now();
        let mut calls = LatencyHistogram::new();
        for _ in 0..iterations {
            self.tx.fill(&mut self.buf);
            if self.which == Overhead::HalfRoundTrip {
                let t0 = Instant::now();
                tx.send_all(&self.buf)?;
                rx.recv_exact(&mut self.buf)?;
                calls.record_ns(ns_since(t0) / 2);
                self.rx.check(&self.buf)?;
                continue;
            }
            spin_for(settle);
            let t0 = Instant::now();
            tx.send_all(&self.buf)?;
            let send_ns = ns_since(t0);
            wait_for_arrival(rx, size, fallback, timeout)?;
            let t1 = Instant::now();
            rx.recv_exact(&mut self.buf)?;
            let recv_ns = ns_since(t1);
            self.rx.check(&self.buf)?;
            let ns = if self.which == Overhead::Send {
                send_ns
            } else {
                recv_ns
            };
            calls.record_ns(ns);
        }
        rtt_hist.merge(&calls);
        let median_us = calls.percentiles_us(1.0).map_or(0.0, |p| p.p50);
        let bytes = size * iterations;
        Ok(RepOutcome {
            elapsed_ns: ns_since(t_start),
            value: median_us,
            bytes_tx: bytes,
            bytes_rx: bytes,
            helper_cpu_ns: 0,
        })
    }
}

/// Median round trip of `size`-byte messages at setup.
fn probe_rtt(flow: &mut dyn Flow, buf: &mut [u8]) -> Result<Duration, FlowError> {
    let mut rtts = Vec::with_capacity(PROBE_ROUND_TRIPS);
    for _ in 0..PROBE_ROUND_TRIPS {
        let t0 = Instant::now();
        flow.send_all(buf)?;
        flow.recv_exact(buf)?;
        rtts.push(ns_since(t0) as f64);
    }
    let median_ns = stats::median(&rtts).unwrap_or(0.0);
    Ok(Duration::from_nanos(median_ns as u64))
}

impl Test for LogpOverhead {
    fn name(&self) -> &'static str {
        match self.0 {
            Overhead::Send => "logp-send",
            Overhead::Recv => "logp-recv",
            Overhead::HalfRoundTrip => "logp-rtt",
        }
    }
    fn summary(&self) -> &'static str {
        match self.0 {
            Overhead::Send => "LogP o_s: time of the send call while the receiver waits (µs)",
            Overhead::Recv => "LogP o_r: time of the receive call once the data is there (µs)",
            Overhead::HalfRoundTrip => "LogP: median half round trip, for L (µs)",
        }
    }
    fn metric(&self) -> Metric {
        Metric::LatencyUs
    }
    fn client(
        &self,
        params: RoleParams,
        mut flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ClientRole>, FlowError> {
        let mut buf = netgap_transport::buffer::message_buffer(params.size_bytes, params.buffer);
        let rtt = probe_rtt(flow.as_mut(), &mut buf)?;
        Ok(Box::new(Client {
            which: self.0,
            flow,
            buf,
            rtt,
            tx: PatternCursor::new(params.verify),
            rx: PatternCursor::new(params.verify),
        }))
    }
    fn server(
        &self,
        params: RoleParams,
        mut flow: Box<dyn Flow>,
    ) -> Result<Box<dyn ServerRole>, FlowError> {
        let mut buf = netgap_transport::buffer::message_buffer(params.size_bytes, params.buffer);
        for _ in 0..PROBE_ROUND_TRIPS {
            flow.recv_exact(&mut buf)?;
            flow.send_all(&buf)?;
        }
        Ok(Box::new(PingPongServer::new(params, flow)))
    }
}
