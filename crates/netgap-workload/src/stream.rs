//! Bandwidth roles shared by `multistream`, `fanin`, `fanout` and
//! `multirail`: one thread per flow over any transport from
//! [`netgap_transport`], in its own completion mode. The sending end sends
//! messages back to back until the window ends and then closes its flow;
//! the receiving end counts what arrives inside the window by its own
//! clock. A server listens once per flow, so each flow may sit on its own
//! link.
//!
//! With `--bidir` (multistream, multirail) every flow sends both ways at
//! once: each end sends on a thread of its own while it receives on the
//! flow's thread, stops both at the window's end, then closes the flow;
//! each end measures what it received, and the flow is worth the sum.

use super::role::{
    find_transport, meter_window, per_flow, window, OpenRole, ReadyRole, RoleContext, RoleError,
    RoleResult, Stop, ACCEPT_TIMEOUT,
};
use super::FlowSample;
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec};
use netgap_transport::buffer::{AlignedBuffer, BufferLayout};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::rate::{PacedFlow, RateBudget};
use netgap_transport::{self as transport, FlowConfig, FlowError};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most flows of thread-per-flow (bandwidth) work on one agent.
pub(crate) const MAX_STREAM_FLOWS: u32 = 1024;

/// Which way payload moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direction {
    /// Clients send, the server receives.
    ToServer,
    /// The server sends, clients receive.
    FromServer,
    /// Both ends send and receive at once (`--bidir`).
    Both,
}

impl Direction {
    /// Whether the role on `side` sends.
    fn sends(self, side: WorkloadRole) -> bool {
        matches!(
            (side, self),
            (WorkloadRole::Client, Direction::ToServer)
                | (WorkloadRole::Server, Direction::FromServer)
                | (_, Direction::Both)
        )
    }

    /// Whether the role on `side` receives.
    fn receives(self, side: WorkloadRole) -> bool {
        self == Direction::Both || !self.sends(side)
    }

    /// The direction of a point whose workload streams `one_way`: both
    /// ways when its parameters ask for it (`--bidir`), else `one_way`.
    /// Parameters that do not parse leave `one_way`; the role refuses them
    /// when it opens.
    pub(crate) fn of(one_way: Direction, spec: &WorkloadSpec) -> Direction {
        serde_json::from_value::<StreamParams>(spec.params.clone())
            .map_or(one_way, |p| p.direction(one_way))
    }
}

/// The parameters of a bandwidth role.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct StreamParams {
    /// `--bidir`: every flow sends both ways at once.
    #[serde(default)]
    pub(crate) bidir: bool,
}

impl StreamParams {
    /// Which way the flows go: both ways, or the workload's own direction.
    pub(crate) fn direction(self, one_way: Direction) -> Direction {
        if self.bidir {
            Direction::Both
        } else {
            one_way
        }
    }
}

/// Memory a bandwidth role commits: a sending end holds one payload
/// buffer that all its flow threads read, a receiving end one receive
/// buffer per flow (at most [`RECV_BUFFER_BYTES`]), and every flow its
/// thread and state ([`super::role::PER_FLOW_BYTES`]).
pub(crate) fn memory_bytes(direction: Direction, spec: &WorkloadSpec) -> u64 {
    let flows = u64::from(spec.flows);
    let mut buffers = 0u64;
    if direction.sends(spec.role) {
        buffers = spec.point.size_bytes;
    }
    if direction.receives(spec.role) {
        let size = usize::try_from(spec.point.size_bytes).unwrap_or(usize::MAX);
        buffers = buffers.saturating_add((recv_buffer_bytes(size) as u64).saturating_mul(flows));
    }
    buffers.saturating_add(super::role::PER_FLOW_BYTES.saturating_mul(flows))
}

/// Default message size of bandwidth workloads, bytes (64 KiB, or the
/// transport's largest message rounded down to KiB).
pub(crate) fn default_size_bytes(transport: &dyn transport::Transport) -> u64 {
    const SIZE_BYTES: u64 = 64 * 1024;
    SIZE_BYTES.min(transport.max_message_bytes().unwrap_or(u64::MAX) / 1024 * 1024)
}

/// What a report of a bandwidth flow says: the receiving end measures the
/// flow (its value is Gbit/s received in its window), the sending end of a
/// one-way flow counts what it sent. An end that received payload though
/// the workload sends the other way is one end of a bidirectional flow
/// (`--bidir`): it measures what it received too, and the flow's value is
/// the sum of its ends'.
pub(crate) fn sample(
    direction: Direction,
    side: WorkloadRole,
    report: &FlowReport,
    window_ns: u64,
) -> FlowSample {
    if direction.sends(side) && direction != Direction::Both && report.bytes_rx == 0 {
        return FlowSample {
            bytes_tx: report.bytes_tx,
            ..FlowSample::default()
        };
    }
    FlowSample {
        value: Some(netgap_core::units::gbps(
            report.window_bytes_rx as f64,
            window_ns as f64,
        )),
        bytes_tx: report.bytes_tx,
        bytes_rx: report.bytes_rx,
        window_bytes: report.window_bytes_rx,
        ..FlowSample::default()
    }
}

/// Opens a bandwidth role: a server listens once per flow and accepts in
/// the background, a client connects every flow (from its bind address
/// when the spec names one).
pub(crate) fn open(
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
    let layout = BufferLayout::of_options(&spec.point.options).map_err(|e| RoleError::Params {
        workload,
        detail: format!("message buffers: {e}"),
    })?;
    let t = find_transport(&spec)?;
    let config = FlowConfig::from_spec(&spec.point);
    let pace = Pacing {
        rate: Arc::clone(ctx.rate),
        message_boundaries: t.capabilities().message_boundaries,
    };
    match spec.role {
        WorkloadRole::Server => {
            let ip = |i: usize| per_flow(&spec.listen_ips, i).unwrap_or(ctx.control_ip);
            let mut addrs = Vec::new();
            let mut accepts = Vec::new();
            for i in 0..spec.flows as usize {
                let mut listener = t
                    .listen(&config, ip(i))
                    .map_err(|source| RoleError::Open { index: i, source })?;
                addrs.push(listener.addr());
                let token = ctx.data_token.clone();
                let h = std::thread::Builder::new()
                    .name(format!("accept {i}"))
                    .spawn(move || accept_proven(listener.as_mut(), &token, i))
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
                layout,
                addrs,
                accepts,
                stop: ctx.stop.clone(),
                pace,
            }))
        }
        WorkloadRole::Client => {
            let mut flows = Vec::with_capacity(spec.flows as usize);
            for i in 0..spec.flows as usize {
                let target = per_flow(&spec.targets, i).ok_or(RoleError::Refused {
                    workload,
                    detail: "a client role needs a target".into(),
                })?;
                let mut flow = match per_flow(&spec.bind_ips, i) {
                    Some(local) => t.connect_from(&config, &target, local),
                    None => t.connect(&config, &target),
                }
                .map_err(|source| RoleError::Open { index: i, source })?;
                // No payload to an address that is not this point's server.
                netgap_transport::preamble::connector(flow.as_mut(), ctx.data_token)
                    .map_err(|source| RoleError::NotInSession { index: i, source })?;
                flows.push(flow);
            }
            Ok(Box::new(Streams {
                spec,
                direction,
                size,
                layout,
                flows,
                stop: ctx.stop.clone(),
                pace,
            }))
        }
    }
}

type Accept = JoinHandle<Result<Box<dyn transport::Flow>, RoleError>>;

/// Accepts flow `index`: the first connection that proves the point's
/// token within [`ACCEPT_TIMEOUT`]; a stranger's connection is dropped and
/// the wait goes on.
pub(crate) fn accept_proven(
    listener: &mut dyn transport::Listener,
    token: &netgap_proto::dataproof::DataToken,
    index: usize,
) -> Result<Box<dyn transport::Flow>, RoleError> {
    let deadline = Instant::now() + ACCEPT_TIMEOUT;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut flow = listener
            .accept(left.max(Duration::from_millis(1)))
            .map_err(|source| RoleError::Open { index, source })?;
        match netgap_transport::preamble::listener(flow.as_mut(), token) {
            Ok(()) => return Ok(flow),
            Err(source) if Instant::now() >= deadline => {
                return Err(RoleError::NotInSession { index, source })
            }
            Err(_) => {}
        }
    }
}

/// A server role whose listeners are open and whose flows are being
/// accepted in the background.
struct Accepting {
    spec: WorkloadSpec,
    direction: Direction,
    size: usize,
    layout: BufferLayout,
    addrs: Vec<String>,
    accepts: Vec<Accept>,
    stop: Stop,
    pace: Pacing,
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
                Ok(Err(e)) => {
                    first_err.get_or_insert(e);
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
            layout: self.layout,
            flows,
            stop: self.stop,
            pace: self.pace,
        }))
    }
}

/// Every flow of a bandwidth role, connected.
struct Streams {
    spec: WorkloadSpec,
    direction: Direction,
    size: usize,
    /// Where every message buffer's data starts (`--align`, `--offset`).
    layout: BufferLayout,
    flows: Vec<Box<dyn transport::Flow>>,
    /// The session's end: every flow thread stops at its next message.
    stop: Stop,
    /// The agent's highest rate (`--max-rate`), which every flow of the
    /// role charges as it sends and receives.
    pace: Pacing,
}

/// How the flows of a bandwidth role are paced: the agent's rate budget,
/// and whether the transport keeps message boundaries (its messages then
/// go whole).
struct Pacing {
    rate: Arc<RateBudget>,
    message_boundaries: bool,
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
    /// The first and the last clock read inside the window at which bytes
    /// arrived: where the data path itself saw the window.
    window_reads: Option<(Instant, Instant)>,
}

impl StreamCount {
    /// Counts `n` bytes received at `now`: in the window's bytes when
    /// `now` falls inside it.
    fn received(&mut self, n: usize, now: Instant, (window_start, end): (Instant, Instant)) {
        self.bytes_rx += n as u64;
        if now >= window_start && now <= end {
            self.window_bytes_rx += n as u64;
            self.window_reads = Some(match self.window_reads {
                Some((first, _)) => (first, now),
                None => (now, now),
            });
        }
    }
}

/// The span, in ns, from the earliest to the latest clock read inside the
/// window at which any of `counts` received bytes; `None` when none
/// received any in it.
fn data_window_ns<'a>(counts: impl IntoIterator<Item = &'a StreamCount>) -> Option<u64> {
    let (first, last) = counts
        .into_iter()
        .filter_map(|c| c.window_reads)
        .reduce(|(f0, l0), (f1, l1)| (f0.min(f1), l0.max(l1)))?;
    Some(u64::try_from(last.duration_since(first).as_nanos()).unwrap_or(u64::MAX))
}

impl ReadyRole for Streams {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let (warmup, duration) = window(&self.spec);
        let sends = self.direction.sends(self.spec.role);
        let both = self.direction == Direction::Both;
        let size = self.size;
        let t0 = Instant::now();
        let window_start = t0 + warmup;
        let end = window_start + duration;
        // Every sending thread reads the same payload: one buffer for the
        // role, not one per flow.
        let layout = self.layout;
        let job = FlowJob {
            both,
            sends,
            payload: Arc::new(netgap_transport::buffer::message_buffer(
                if sends { size } else { 0 },
                layout,
            )),
            recv: (recv_buffer_bytes(size), layout),
            window: (window_start, end),
            drain: Duration::from_millis(u64::from(self.spec.point.io_timeout_ms)),
        };
        let mut handles = Vec::with_capacity(self.flows.len());
        // A datagram path's counters (udp, xdp), read after the flows
        // closed: the record says what was lost, sent again and dropped.
        let monitors: Vec<Arc<dyn transport::FlowMonitor>> =
            self.flows.iter().filter_map(|f| f.monitor()).collect();
        for (i, flow) in self.flows.into_iter().enumerate() {
            let stop = self.stop.clone();
            let job = job.clone();
            let flow: Box<dyn transport::Flow> = Box::new(
                PacedFlow::new(
                    flow,
                    Arc::clone(&self.pace.rate),
                    self.pace.message_boundaries,
                )
                .stopped_by(self.stop.flag()),
            );
            let h = std::thread::Builder::new()
                .name(format!("flow {i}"))
                .spawn(move || job.run(flow, &stop))
                .map_err(|source| RoleError::Thread {
                    what: "a flow thread",
                    source,
                })?;
            handles.push(h);
        }
        // The CPU meter's thread times only the CPU: the window the bytes
        // are counted in is the one the data path read the clock against,
        // from the go barrier's clock read (`t0`), whenever the meter
        // itself woke.
        let (cpu, _) = meter_window(window_start, end, &self.stop);
        let window_ns = u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX);
        let (counts, reports) = join_flows(handles)?;
        Ok(RoleResult {
            buckets: Vec::new(),
            outcome: WorkloadOutcome {
                window_ns,
                cpu,
                peak_rss_kib: peak_rss_kib(),
                processes: None,
                bytes_rx: reports.iter().map(|r| r.bytes_rx).sum(),
                bytes_tx: reports.iter().map(|r| r.bytes_tx).sum(),
                datagrams: transport::total_datagrams(&monitors),
                metrics: Default::default(),
                services: Vec::new(),
                last_error: None,
                // Only an end that receives times bytes against the window.
                data_window_ns: (both || !sends)
                    .then(|| data_window_ns(&counts).unwrap_or(0).min(window_ns)),
                evidence: Vec::new(),
            },
            flows: reports,
        })
    }
}

/// What every flow thread of a role does, over which window.
#[derive(Clone)]
struct FlowJob {
    /// Payload both ways at once (`--bidir`).
    both: bool,
    /// This end sends (one way); else it receives.
    sends: bool,
    /// The role's one payload buffer, empty on a receiving end.
    payload: Arc<AlignedBuffer>,
    /// A receiving flow's buffer: its bytes and layout.
    recv: (usize, BufferLayout),
    /// The measured window: its start and end.
    window: (Instant, Instant),
    /// How long a receiver waits for the sender's last bytes after the
    /// window.
    drain: Duration,
}

impl FlowJob {
    /// Moves bytes over `flow` until the window ends or the stop; whether
    /// this flow's failure was the first, which stopped the others.
    fn run(
        &self,
        flow: Box<dyn transport::Flow>,
        stop: &Stop,
    ) -> (Result<StreamCount, FlowError>, bool) {
        let (window_start, end) = self.window;
        let counted = if self.both {
            both_ways_until(
                flow,
                Arc::clone(&self.payload),
                self.recv,
                self.window,
                stop,
            )
        } else if self.sends {
            send_until(flow, &self.payload, end, stop)
        } else {
            recv_until(flow, self.recv, window_start, end, self.drain, stop)
        };
        // A failed flow ends the role's window now (the stop is the
        // role's own): the failure, a stopped peer's timeout, is reported
        // at once, not at the window's end, and the other flows stop at
        // their next message. What fails after the stop is its
        // consequence.
        let first = counted.is_err() && !stop.is_set();
        if first {
            stop.set();
        }
        (counted, first)
    }
}

/// Waits for every flow thread: their counts and reports, in flow order,
/// or the error of the flow whose failure stopped the others (else the
/// first error).
fn join_flows(
    handles: Vec<JoinHandle<(Result<StreamCount, FlowError>, bool)>>,
) -> Result<(Vec<StreamCount>, Vec<FlowReport>), RoleError> {
    let mut counts = Vec::with_capacity(handles.len());
    let mut reports = Vec::with_capacity(handles.len());
    let mut first_err = None;
    for (index, h) in handles.into_iter().enumerate() {
        match h.join() {
            // The flow whose failure stopped the others names it.
            Ok((Err(source), true)) => {
                first_err = Some(RoleError::Flow { index, source });
            }
            Ok((Ok(c), _)) => {
                counts.push(c);
                reports.push(FlowReport {
                    index: index as u32,
                    bytes_tx: c.bytes_tx,
                    bytes_rx: c.bytes_rx,
                    window_bytes_rx: c.window_bytes_rx,
                    round_trips: 0,
                    percentiles: None,
                    errors: 0,
                });
            }
            Ok((Err(source), false)) => {
                first_err.get_or_insert(RoleError::Flow { index, source });
            }
            Err(_) => {
                first_err.get_or_insert(RoleError::Panicked {
                    what: format!("the thread of flow {index}"),
                });
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok((counts, reports)),
    }
}

/// Bytes of a receiving flow's buffer: a stream is read in chunks of this
/// size whatever the message size, so receivers need not hold a message
/// each. A transport with message boundaries reads a whole message, at
/// most its largest (64 KiB for the cross-host datagram transport).
pub(crate) const RECV_BUFFER_BYTES: usize = 256 * 1024;

/// The receive buffer of a flow of `size_bytes` messages.
fn recv_buffer_bytes(size_bytes: usize) -> usize {
    size_bytes.clamp(1, RECV_BUFFER_BYTES)
}

/// Sends `payload` back to back until `end` or the stop (no faster than
/// the agent's budget lets the paced flow), then closes the flow
/// (dropping it), which ends the receiver's loop.
fn send_until(
    mut flow: Box<dyn transport::Flow>,
    payload: &[u8],
    end: Instant,
    stop: &Stop,
) -> Result<StreamCount, FlowError> {
    let (tx, _) = flow.split();
    send_half_until(tx, payload, end, stop, false)
}

/// One end of a bidirectional flow: sends on a thread of its own while it
/// receives on this one, both until the window's end (`window.1`), then
/// closes the flow once both have stopped. The peer's end closes at its
/// own window end, so a send or receive that finds the flow closed after
/// this end stopped receiving ends it quietly. The two threads share one
/// clock of no progress: the first to fail ends the flow under the other,
/// which would otherwise wait out a timeout of its own on the same silent
/// peer.
fn both_ways_until(
    flow: Box<dyn transport::Flow>,
    payload: Arc<AlignedBuffer>,
    (buffer_bytes, layout): (usize, BufferLayout),
    window: (Instant, Instant),
    stop: &Stop,
) -> Result<StreamCount, FlowError> {
    let (window_start, end) = window;
    let abort = flow.abort_handle();
    let (mut tx, mut rx) = flow.into_halves();
    let send_stop = stop.clone();
    let send_abort = abort.clone();
    let sender = std::thread::Builder::new()
        .name("flow sender".into())
        .spawn(move || {
            let r = send_half_until(tx.as_mut(), &payload, end, &send_stop, true);
            if let (Err(_), Some(a)) = (&r, &send_abort) {
                a.abort();
            }
            (r, tx)
        })
        .map_err(FlowError::Io)?;
    let mut buf = AlignedBuffer::zeroed(buffer_bytes, layout);
    let mut count = StreamCount::default();
    let mut recv_result = Ok(());
    while !stop.is_set() && Instant::now() < end {
        match rx.recv_some(&mut buf) {
            Ok(n) => count.received(n, Instant::now(), (window_start, end)),
            // The peer reached its window's end first and closed.
            Err(FlowError::Closed) => break,
            Err(FlowError::TimedOut { .. }) if Instant::now() >= end => break,
            Err(e) => {
                if let Some(a) = &abort {
                    a.abort();
                }
                recv_result = Err(e);
                break;
            }
        }
    }
    let (sent, tx) = sender.join().map_err(|_| {
        FlowError::Io(std::io::Error::other(
            "the sending thread of a flow panicked",
        ))
    })?;
    // Both halves go together: the flow closes, which ends the peer's
    // receive (and any send it still has blocked on this end's window).
    drop((tx, rx));
    recv_result?;
    count.bytes_tx = sent?.bytes_tx;
    Ok(count)
}

/// Sends on `tx` as [`send_until`] does; with `closed_ends` a peer that
/// closed the flow ends the sending quietly whenever it happens (the
/// peer of a bidirectional flow closes at its own window end, which may
/// come a little before this end's).
fn send_half_until(
    tx: &mut dyn transport::Sender,
    payload: &[u8],
    end: Instant,
    stop: &Stop,
    closed_ends: bool,
) -> Result<StreamCount, FlowError> {
    let mut count = StreamCount::default();
    while Instant::now() < end && !stop.is_set() {
        match tx.send_all(payload) {
            Ok(()) => count.bytes_tx += payload.len() as u64,
            // The receiver stopped reading at its own end of the window.
            Err(FlowError::Closed | FlowError::TimedOut { .. }) if Instant::now() >= end => break,
            Err(FlowError::Closed) if closed_ends => break,
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
    (buffer_bytes, layout): (usize, BufferLayout),
    window_start: Instant,
    end: Instant,
    drain: Duration,
    stop: &Stop,
) -> Result<StreamCount, FlowError> {
    let mut buf = AlignedBuffer::zeroed(buffer_bytes, layout);
    let (_, rx) = flow.split();
    let mut count = StreamCount::default();
    while !stop.is_set() {
        match rx.recv_some(&mut buf) {
            Ok(n) => {
                let now = Instant::now();
                count.received(n, now, (window_start, end));
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

/// A bandwidth workload (`multistream`, `fanin`, `fanout`): flows that
/// stream one way for a window, a thread per flow over any cross-host
/// transport. Each is one declaration of this in its own module; they differ
/// only in their name, which way the bytes go, which count they read and
/// how their flows are placed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct StreamWorkload {
    /// What it is (its metric is bandwidth and its flow limit
    /// [`MAX_STREAM_FLOWS`], as [`StreamWorkload::about`] makes them).
    pub(crate) about: super::About,
    /// Which way the payload flows.
    pub(crate) direction: Direction,
    /// Where its flows go.
    pub(crate) place:
        fn(u32, &[super::place::HostView]) -> Result<super::place::Placement, super::Refused>,
}

impl StreamWorkload {
    /// A bandwidth workload's [`super::About`]: `name`, `summary`, the
    /// count it reads, whether it takes `--bidir`.
    pub(crate) const fn about(
        name: &'static str,
        summary: &'static str,
        count: super::CountFlag,
        takes_bidir: bool,
    ) -> super::About {
        super::About {
            name,
            summary,
            metric: netgap_core::metric::Metric::BandwidthGbps,
            count,
            max_flows: MAX_STREAM_FLOWS,
            takes_bidir,
        }
    }
}

impl super::Workload for StreamWorkload {
    fn about(&self) -> &super::About {
        &self.about
    }

    fn default_size_bytes(&self, transport: &dyn transport::Transport) -> u64 {
        default_size_bytes(transport)
    }

    fn check(
        &self,
        spec: &netgap_core::spec::PointSpec,
        transport: &dyn transport::Transport,
    ) -> Result<(), super::Refused> {
        // Each flow dials what its listener announced, in the transport's
        // own form: xdp's `IP/MAC/FLOW` as well as `IP:PORT`.
        super::check_crosses_hosts(self.about.name, spec, transport)
    }

    fn place(
        &self,
        _params: &serde_json::Value,
        count: u32,
        hosts: &[super::place::HostView],
    ) -> Result<super::place::Placement, super::Refused> {
        (self.place)(count, hosts)
    }

    fn memory_bytes(&self, spec: &WorkloadSpec) -> u64 {
        memory_bytes(Direction::of(self.direction, spec), spec)
    }

    fn open(&self, ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
        let params: StreamParams = super::role::parse_params(self.about.name, ctx.spec)?;
        if params.bidir && !self.about.takes_bidir {
            return Err(RoleError::Params {
                workload: self.about.name,
                detail: "it does not send both ways (--bidir)".into(),
            });
        }
        open(self.about.name, params.direction(self.direction), ctx)
    }

    fn sample(&self, side: WorkloadRole, report: &FlowReport, window_ns: u64) -> FlowSample {
        sample(self.direction, side, report, window_ns)
    }
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
    fn bytes_count_by_the_data_paths_clock_and_its_span_covers_every_flow() {
        let t0 = Instant::now();
        let ms = Duration::from_millis;
        let window = (t0 + ms(10), t0 + ms(110));
        let mut a = StreamCount::default();
        a.received(100, t0 + ms(5), window); // warm-up: not the window's
        a.received(200, t0 + ms(12), window);
        a.received(300, t0 + ms(60), window);
        a.received(400, t0 + ms(111), window); // after the window
        assert_eq!((a.bytes_rx, a.window_bytes_rx), (1000, 500));
        let mut b = StreamCount::default();
        b.received(50, t0 + ms(108), window);
        // From a's first read in the window to b's last: 96 ms.
        assert_eq!(data_window_ns([&a, &b]), Some(96_000_000));
        assert_eq!(data_window_ns([&StreamCount::default()]), None);
    }

    #[test]
    fn sending_flows_share_one_payload_and_receivers_read_in_bounded_chunks() {
        use netgap_core::spec::{Mode, PointSpec, TransportOptions};
        let mut spec = WorkloadSpec {
            point: PointSpec {
                test: "multistream".into(),
                transport: "tcp".into(),
                mode: Mode::Event,
                size_bytes: 16 << 20,
                options: TransportOptions::default(),
                server_cpu: None,
                io_timeout_ms: 3000,
                verify: false,
            },
            role: WorkloadRole::Client,
            params: serde_json::json!({}),
            flows: 128,
            listen_ips: vec![],
            targets: vec![],
            bind_ips: vec![],
            session_hosts: vec![],
            warmup_ms: 0,
            duration_ms: 1000,
        };
        let per_flow = super::super::role::PER_FLOW_BYTES * 128;
        // Clients send: one 16 MiB payload for 128 flows.
        assert_eq!(
            memory_bytes(Direction::ToServer, &spec),
            (16 << 20) + per_flow
        );
        // The server receives: 256 KiB per flow, whatever the message size.
        spec.role = WorkloadRole::Server;
        assert_eq!(
            memory_bytes(Direction::ToServer, &spec),
            128 * RECV_BUFFER_BYTES as u64 + per_flow
        );
        // The bound for workloads that share nothing is far above.
        assert!(super::super::role::memory_bytes(&spec) > 4 << 30);
    }

    #[test]
    fn the_receiving_end_measures_and_the_sending_end_counts() {
        let second = 1_000_000_000;
        // 1.25e9 bytes in 1 s is 10 Gbit/s.
        let s = sample(
            Direction::ToServer,
            WorkloadRole::Server,
            &report(0, 1_250_000_000),
            second,
        );
        assert!((s.value.unwrap_or(0.0) - 10.0).abs() < 1e-9);
        assert_eq!(s.window_bytes, 1_250_000_000);
        let s = sample(
            Direction::ToServer,
            WorkloadRole::Client,
            &report(7, 0),
            second,
        );
        assert_eq!((s.value, s.bytes_tx), (None, 7));
        let s = sample(
            Direction::FromServer,
            WorkloadRole::Server,
            &report(9, 0),
            second,
        );
        assert_eq!((s.value, s.bytes_tx), (None, 9));
    }
}
