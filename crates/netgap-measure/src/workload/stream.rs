//! Bandwidth roles shared by `multistream`, `fanin`, `fanout` and
//! `multirail`: one thread per flow over any transport from
//! [`netgap_transport`], in its own completion mode. The sending end sends
//! messages back to back until the window ends and then closes its flow;
//! the receiving end counts what arrives inside the window by its own
//! clock. A server listens once per flow, so each flow may sit on its own
//! link.

use super::role::{
    find_transport, meter_window, peak_rss_kib, per_flow, window, OpenRole, ReadyRole, RoleContext,
    RoleError, RoleResult, ACCEPT_TIMEOUT,
};
use super::FlowSample;
use netgap_proto::group::{FlowReport, GroupOutcome, GroupRole, GroupSpec};
use netgap_transport::{self as transport, FlowConfig, FlowError, TransportError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most flows of thread-per-flow (bandwidth) work on one agent.
pub(crate) const MAX_STREAM_FLOWS: u32 = 1024;

/// Which way payload moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Clients send, the server receives.
    ToServer,
    /// The server sends, clients receive.
    FromServer,
}

impl Direction {
    /// Whether the role on `side` is the sending end.
    fn sends(self, side: GroupRole) -> bool {
        matches!(
            (side, self),
            (GroupRole::Client, Direction::ToServer) | (GroupRole::Server, Direction::FromServer)
        )
    }
}

/// Default message size of bandwidth workloads, bytes (64 KiB, or the
/// transport's largest message rounded down to KiB).
pub(crate) fn default_size_bytes(transport: &dyn transport::Transport) -> u64 {
    const SIZE_BYTES: u64 = 64 * 1024;
    SIZE_BYTES.min(transport.max_message_bytes().unwrap_or(u64::MAX) / 1024 * 1024)
}

/// What a report of a bandwidth flow says: the receiving end measures the
/// flow (its value is Gbit/s received in its window), the sending end
/// counts what it sent.
pub fn sample(
    direction: Direction,
    side: GroupRole,
    report: &FlowReport,
    window_ns: u64,
) -> FlowSample {
    if direction.sends(side) {
        return FlowSample {
            bytes_tx: report.bytes_tx,
            ..FlowSample::default()
        };
    }
    FlowSample {
        value: Some(crate::bench::gbps(report.window_bytes_rx, window_ns)),
        bytes_rx: report.bytes_rx,
        window_bytes: report.window_bytes_rx,
        ..FlowSample::default()
    }
}

/// Opens a bandwidth role: a server listens once per flow and accepts in
/// the background, a client connects every flow (from its bind address
/// when the spec names one).
pub fn open(
    workload: &'static str,
    direction: Direction,
    ctx: RoleContext<'_>,
) -> Result<Box<dyn OpenRole>, RoleError> {
    let spec = ctx.spec.clone();
    if spec.flows > MAX_STREAM_FLOWS {
        return Err(RoleError::Refused {
            workload,
            detail: format!(
                "{} flows: bandwidth workloads run at most {MAX_STREAM_FLOWS} flows per agent",
                spec.flows
            ),
        });
    }
    let size = usize::try_from(spec.point.size_bytes).map_err(|_| RoleError::Params {
        workload,
        detail: "the size does not fit in memory".into(),
    })?;
    let t = find_transport(&spec)?;
    let config = FlowConfig::from_spec(&spec.point);
    match spec.role {
        GroupRole::Server => {
            let ip = |i: usize| per_flow(&spec.listen_ips, i).unwrap_or(ctx.control_ip);
            let mut addrs = Vec::new();
            let mut accepts = Vec::new();
            for i in 0..spec.flows as usize {
                let mut listener = t
                    .listen(&config, ip(i))
                    .map_err(|source| RoleError::Open { index: i, source })?;
                addrs.push(listener.addr());
                let h = std::thread::Builder::new()
                    .name(format!("accept {i}"))
                    .spawn(move || listener.accept(ACCEPT_TIMEOUT))
                    .map_err(|source| RoleError::Thread {
                        what: "an accept thread",
                        source,
                    })?;
                accepts.push(h);
            }
            Ok(Box::new(Accepting {
                spec,
                direction,
                size,
                addrs,
                accepts,
            }))
        }
        GroupRole::Client => {
            let mut flows = Vec::with_capacity(spec.flows as usize);
            for i in 0..spec.flows as usize {
                let target = per_flow(&spec.targets, i).ok_or(RoleError::Refused {
                    workload,
                    detail: "a client role needs a target".into(),
                })?;
                let flow = match per_flow(&spec.bind_ips, i) {
                    Some(local) => t.connect_from(&config, &target, local),
                    None => t.connect(&config, &target),
                }
                .map_err(|source| RoleError::Open { index: i, source })?;
                flows.push(flow);
            }
            Ok(Box::new(Streams {
                spec,
                direction,
                size,
                flows,
            }))
        }
    }
}

type Accept = JoinHandle<Result<Box<dyn transport::Flow>, TransportError>>;

/// A server role whose listeners are open and whose flows are being
/// accepted in the background.
struct Accepting {
    spec: GroupSpec,
    direction: Direction,
    size: usize,
    addrs: Vec<String>,
    accepts: Vec<Accept>,
}

impl OpenRole for Accepting {
    fn addrs(&self) -> Vec<String> {
        self.addrs.clone()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        let mut flows = Vec::with_capacity(self.accepts.len());
        let mut first_err = None;
        for (index, h) in self.accepts.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(f)) => flows.push(f),
                Ok(Err(source)) => {
                    first_err.get_or_insert(RoleError::Open { index, source });
                }
                Err(_) => {
                    first_err.get_or_insert(RoleError::Panicked {
                        what: format!("the accept thread of flow {index}"),
                    });
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(Box::new(Streams {
            spec: self.spec,
            direction: self.direction,
            size: self.size,
            flows,
        }))
    }
}

/// Every flow of a bandwidth role, connected.
struct Streams {
    spec: GroupSpec,
    direction: Direction,
    size: usize,
    flows: Vec<Box<dyn transport::Flow>>,
}

impl OpenRole for Streams {
    fn addrs(&self) -> Vec<String> {
        Vec::new()
    }

    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

/// What one flow thread of bandwidth work measured.
#[derive(Debug, Default, Clone, Copy)]
struct StreamCount {
    bytes_tx: u64,
    bytes_rx: u64,
    window_bytes_rx: u64,
}

impl ReadyRole for Streams {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let (warmup, duration) = window(&self.spec);
        let sends = self.direction.sends(self.spec.role);
        let drain = Duration::from_millis(u64::from(self.spec.point.io_timeout_ms));
        let size = self.size;
        let t0 = Instant::now();
        let window_start = t0 + warmup;
        let end = window_start + duration;
        let mut handles = Vec::with_capacity(self.flows.len());
        for (i, flow) in self.flows.into_iter().enumerate() {
            let h = std::thread::Builder::new()
                .name(format!("flow {i}"))
                .spawn(move || {
                    if sends {
                        send_until(flow, size, end)
                    } else {
                        recv_until(flow, size, window_start, end, drain)
                    }
                })
                .map_err(|source| RoleError::Thread {
                    what: "a flow thread",
                    source,
                })?;
            handles.push(h);
        }
        let (cpu, window_ns) = meter_window(window_start, end);
        let mut reports = Vec::with_capacity(handles.len());
        let mut first_err = None;
        for (index, h) in handles.into_iter().enumerate() {
            match h.join() {
                Ok(Ok(c)) => reports.push(FlowReport {
                    index: index as u32,
                    bytes_tx: c.bytes_tx,
                    bytes_rx: c.bytes_rx,
                    window_bytes_rx: c.window_bytes_rx,
                    round_trips: 0,
                    percentiles: None,
                    errors: 0,
                }),
                Ok(Err(source)) => {
                    first_err.get_or_insert(RoleError::Flow { index, source });
                }
                Err(_) => {
                    first_err.get_or_insert(RoleError::Panicked {
                        what: format!("the thread of flow {index}"),
                    });
                }
            }
        }
        if let Some(e) = first_err {
            return Err(e);
        }
        Ok(RoleResult {
            buckets: Vec::new(),
            outcome: GroupOutcome {
                window_ns,
                cpu,
                peak_rss_kib: peak_rss_kib(),
                bytes_rx: reports.iter().map(|r| r.bytes_rx).sum(),
                bytes_tx: reports.iter().map(|r| r.bytes_tx).sum(),
                datagrams: None,
            },
            flows: reports,
        })
    }
}

/// Sends messages until `end`, then closes the flow (dropping it), which
/// ends the receiver's loop.
fn send_until(
    mut flow: Box<dyn transport::Flow>,
    size_bytes: usize,
    end: Instant,
) -> Result<StreamCount, FlowError> {
    let buf = crate::bench::message_buffer(size_bytes);
    let (tx, _) = flow.split();
    let mut count = StreamCount::default();
    while Instant::now() < end {
        match tx.send_all(&buf) {
            Ok(()) => count.bytes_tx += buf.len() as u64,
            // The receiver stopped reading at its own end of the window.
            Err(FlowError::Closed | FlowError::TimedOut { .. }) if Instant::now() >= end => break,
            Err(e) => return Err(e),
        }
    }
    let _ = tx.end_burst();
    Ok(count)
}

/// Receives until the sender closes the flow (or, on a flow that cannot
/// tell, until it goes silent after `end`), counting the bytes that arrive
/// between `window_start` and `end`.
fn recv_until(
    mut flow: Box<dyn transport::Flow>,
    size_bytes: usize,
    window_start: Instant,
    end: Instant,
    drain: Duration,
) -> Result<StreamCount, FlowError> {
    let mut buf = crate::bench::message_buffer(size_bytes.max(256 * 1024));
    let (_, rx) = flow.split();
    let mut count = StreamCount::default();
    loop {
        match rx.recv_some(&mut buf) {
            Ok(n) => {
                count.bytes_rx += n as u64;
                let now = Instant::now();
                if now >= window_start && now <= end {
                    count.window_bytes_rx += n as u64;
                }
                if now > end + drain {
                    break;
                }
            }
            Err(FlowError::Closed) => break,
            Err(FlowError::TimedOut { .. }) if Instant::now() >= end => break,
            Err(e) => return Err(e),
        }
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(bytes_tx: u64, window_bytes_rx: u64) -> FlowReport {
        FlowReport {
            index: 0,
            bytes_tx,
            bytes_rx: window_bytes_rx,
            window_bytes_rx,
            round_trips: 0,
            percentiles: None,
            errors: 0,
        }
    }

    #[test]
    fn the_receiving_end_measures_and_the_sending_end_counts() {
        let second = 1_000_000_000;
        // 1.25e9 bytes in 1 s is 10 Gbit/s.
        let s = sample(
            Direction::ToServer,
            GroupRole::Server,
            &report(0, 1_250_000_000),
            second,
        );
        assert!((s.value.unwrap_or(0.0) - 10.0).abs() < 1e-9);
        assert_eq!(s.window_bytes, 1_250_000_000);
        let s = sample(
            Direction::ToServer,
            GroupRole::Client,
            &report(7, 0),
            second,
        );
        assert_eq!((s.value, s.bytes_tx), (None, 7));
        let s = sample(
            Direction::FromServer,
            GroupRole::Server,
            &report(9, 0),
            second,
        );
        assert_eq!((s.value, s.bytes_tx), (None, 9));
    }
}
