//! The agent's side of a group point: prepare this agent's role (listen and
//! accept, or connect), then, after the coordinator's barrier, run every
//! flow for the warm-up and the measured window and report per flow.
//!
//! Bandwidth work ([`GroupWork::Stream`]) runs one thread per flow over any
//! transport from [`netgap_transport`]; the sending end sends messages back
//! to back until the window ends and then closes its flow, the receiving
//! end counts what arrives inside the window by its own clock. The
//! latency and connection work of `hotspot` and `connect` runs on the
//! epoll engine of [`crate::group::engine`].

use super::engine;
use netgap_core::cpu::CpuUsage;
use netgap_proto::group::{Direction, FlowReport, GroupOutcome, GroupRole, GroupSpec, GroupWork};
use netgap_transport::cpu::CpuMeter;
use netgap_transport::{self as transport, FlowConfig, FlowError};
use std::net::IpAddr;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// How long a server role waits for all its flows to connect.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);
/// Most flows of thread-per-flow (bandwidth) work on one agent.
pub const MAX_STREAM_FLOWS: u32 = 1024;

/// A prepared group role, waiting for the barrier.
pub struct PreparedRole {
    spec: GroupSpec,
    kind: Prepared,
}

enum Prepared {
    /// Connected flows of bandwidth work, in flow order.
    Stream(Vec<Box<dyn transport::Flow>>),
    /// Work on the flows engine.
    Engine(engine::Prepared),
}

/// A server role whose listeners are open and whose flows are being
/// accepted in the background.
pub struct Accepting {
    spec: GroupSpec,
    kind: AcceptingKind,
}

enum AcceptingKind {
    Stream(Vec<JoinHandle<Result<Box<dyn transport::Flow>, String>>>),
    Engine(engine::Prepared),
}

fn stream_limit(spec: &GroupSpec) -> Result<(), String> {
    if matches!(spec.work, GroupWork::Stream { .. }) && spec.flows > MAX_STREAM_FLOWS {
        return Err(format!(
            "{} flows: bandwidth tests run at most {MAX_STREAM_FLOWS} flows per agent",
            spec.flows
        ));
    }
    Ok(())
}

fn find_transport(spec: &GroupSpec) -> Result<&'static dyn transport::Transport, String> {
    let t = transport::find(&spec.point.transport).ok_or_else(|| {
        format!(
            "unknown transport {:?} (this agent has: {})",
            spec.point.transport,
            transport::names()
        )
    })?;
    t.availability().map_err(|why| {
        format!(
            "transport {} is not available on the agent: {why}",
            spec.point.transport
        )
    })?;
    Ok(t)
}

/// Picks entry `i` of a per-flow list of 0, 1 or `flows` entries.
fn per_flow<T: Clone>(list: &[T], i: usize) -> Option<T> {
    match list.len() {
        0 => None,
        1 => list.first().cloned(),
        _ => list.get(i).cloned(),
    }
}

/// Opens the server role's listeners (on `spec.listen_ips`, else on
/// `control_ip`) and starts accepting. Returns the data addresses to
/// announce. Errors are one line for the coordinator.
pub fn listen(spec: GroupSpec, control_ip: IpAddr) -> Result<(Vec<String>, Accepting), String> {
    debug_assert_eq!(spec.role, GroupRole::Server);
    stream_limit(&spec)?;
    let ip = |i: usize| per_flow(&spec.listen_ips, i).unwrap_or(control_ip);
    if !matches!(spec.work, GroupWork::Stream { .. }) {
        let (addr, prepared) = engine::listen(&spec, ip(0))?;
        return Ok((
            vec![addr],
            Accepting {
                spec,
                kind: AcceptingKind::Engine(prepared),
            },
        ));
    }
    let t = find_transport(&spec)?;
    let config = FlowConfig::from_spec(&spec.point);
    let mut addrs = Vec::new();
    let mut handles = Vec::new();
    for i in 0..spec.flows as usize {
        let mut listener = t.listen(&config, ip(i)).map_err(|e| e.to_string())?;
        addrs.push(listener.addr());
        let h = std::thread::Builder::new()
            .name(format!("accept {i}"))
            .spawn(move || {
                listener
                    .accept(ACCEPT_TIMEOUT)
                    .map_err(|e| format!("flow {i}: {e}"))
            })
            .map_err(|e| format!("cannot start an accept thread: {e}"))?;
        handles.push(h);
    }
    Ok((
        addrs,
        Accepting {
            spec,
            kind: AcceptingKind::Stream(handles),
        },
    ))
}

impl Accepting {
    /// Waits until every flow is accepted (at most [`ACCEPT_TIMEOUT`]).
    pub fn wait(self) -> Result<PreparedRole, String> {
        let kind = match self.kind {
            AcceptingKind::Engine(p) => Prepared::Engine(p),
            AcceptingKind::Stream(handles) => {
                let mut flows = Vec::with_capacity(handles.len());
                let mut first_err = None;
                for h in handles {
                    match h.join() {
                        Ok(Ok(f)) => flows.push(f),
                        Ok(Err(e)) => {
                            first_err.get_or_insert(e);
                        }
                        Err(_) => {
                            first_err.get_or_insert("an accept thread panicked".into());
                        }
                    }
                }
                if let Some(e) = first_err {
                    return Err(e);
                }
                Prepared::Stream(flows)
            }
        };
        Ok(PreparedRole {
            spec: self.spec,
            kind,
        })
    }
}

/// Connects a client role's flows. Every target was checked against the
/// session's hosts by [`GroupSpec::validate`] before this runs.
pub fn connect(spec: GroupSpec) -> Result<PreparedRole, String> {
    debug_assert_eq!(spec.role, GroupRole::Client);
    stream_limit(&spec)?;
    if !matches!(spec.work, GroupWork::Stream { .. }) {
        let prepared = engine::connect(&spec)?;
        return Ok(PreparedRole {
            spec,
            kind: Prepared::Engine(prepared),
        });
    }
    let t = find_transport(&spec)?;
    let config = FlowConfig::from_spec(&spec.point);
    let mut flows = Vec::with_capacity(spec.flows as usize);
    for i in 0..spec.flows as usize {
        let target = per_flow(&spec.targets, i).ok_or("no target")?;
        let flow = match per_flow(&spec.bind_ips, i) {
            Some(local) => t.connect_from(&config, &target, local),
            None => t.connect(&config, &target),
        }
        .map_err(|e| format!("flow {i}: {e}"))?;
        flows.push(flow);
    }
    Ok(PreparedRole {
        spec,
        kind: Prepared::Stream(flows),
    })
}

/// What one flow thread of bandwidth work measured.
#[derive(Debug, Default, Clone, Copy)]
struct StreamCount {
    bytes_tx: u64,
    bytes_rx: u64,
    window_bytes_rx: u64,
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

/// Peak resident set size of this process (VmHWM), in KiB, if readable.
pub fn peak_rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

/// CPU time of this whole process so far, in nanoseconds
/// (`CLOCK_PROCESS_CPUTIME_ID`); 0 if unreadable.
fn process_cpu_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec that outlives the call, and
    // CLOCK_PROCESS_CPUTIME_ID is a clock id every Linux kernel supports.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_PROCESS_CPUTIME_ID, &mut ts) };
    if rc != 0 {
        return 0;
    }
    let secs = u64::try_from(ts.tv_sec).unwrap_or(0);
    let nanos = u64::try_from(ts.tv_nsec).unwrap_or(0);
    secs.saturating_mul(1_000_000_000).saturating_add(nanos)
}

/// Measures host and process CPU over the window on the calling thread,
/// which sleeps meanwhile: from `window_start` to `end`.
fn meter_window(window_start: Instant, end: Instant) -> (CpuUsage, u64) {
    sleep_until(window_start);
    let meter = CpuMeter::start();
    let p0 = process_cpu_ns();
    let t0 = Instant::now();
    sleep_until(end);
    let mut cpu = meter.stop(0);
    let window_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
    cpu.cpu_ns = process_cpu_ns().saturating_sub(p0);
    cpu.process_percent = if cpu.wall_ns == 0 {
        0.0
    } else {
        100.0 * cpu.cpu_ns as f64 / cpu.wall_ns as f64
    };
    (cpu, window_ns)
}

fn sleep_until(t: Instant) {
    let left = t.saturating_duration_since(Instant::now());
    if !left.is_zero() {
        std::thread::sleep(left);
    }
}

/// What an agent reports after a group repetition.
pub struct RoleResult {
    /// Per-flow reports, in flow order.
    pub flows: Vec<FlowReport>,
    /// `[value_ns, count]` buckets of the latency histogram of all flows.
    pub buckets: Vec<[u64; 2]>,
    /// Window, CPU and memory.
    pub outcome: GroupOutcome,
}

impl PreparedRole {
    /// Runs every flow after the barrier: warm-up, window, stop, report.
    pub fn run(self) -> Result<RoleResult, String> {
        let warmup = Duration::from_millis(u64::from(self.spec.warmup_ms));
        let duration = Duration::from_millis(u64::from(self.spec.duration_ms));
        match self.kind {
            Prepared::Engine(p) => {
                let t0 = Instant::now();
                let meter = std::thread::Builder::new()
                    .name("cpu meter".into())
                    .spawn(move || meter_window(t0 + warmup, t0 + warmup + duration))
                    .map_err(|e| format!("cannot start the CPU meter: {e}"))?;
                let run = engine::run(p, warmup, duration);
                let (cpu, _) = meter.join().map_err(|_| "the CPU meter panicked")?;
                let r = run?;
                Ok(RoleResult {
                    flows: r.flows,
                    buckets: r.hist.buckets(),
                    outcome: GroupOutcome {
                        window_ns: r.window_ns,
                        cpu,
                        peak_rss_kib: peak_rss_kib(),
                        bytes_rx: r.bytes_rx,
                        bytes_tx: r.bytes_tx,
                    },
                })
            }
            Prepared::Stream(flows) => run_stream(&self.spec, flows, warmup, duration),
        }
    }
}

fn run_stream(
    spec: &GroupSpec,
    flows: Vec<Box<dyn transport::Flow>>,
    warmup: Duration,
    duration: Duration,
) -> Result<RoleResult, String> {
    let GroupWork::Stream {
        size_bytes,
        direction,
    } = spec.work
    else {
        return Err("not bandwidth work".into());
    };
    let size = usize::try_from(size_bytes).map_err(|_| "size does not fit in memory")?;
    let sends = matches!(
        (spec.role, direction),
        (GroupRole::Client, Direction::ToServer) | (GroupRole::Server, Direction::FromServer)
    );
    let drain = Duration::from_millis(u64::from(spec.point.io_timeout_ms));
    let t0 = Instant::now();
    let window_start = t0 + warmup;
    let end = window_start + duration;
    let mut handles = Vec::with_capacity(flows.len());
    for (i, flow) in flows.into_iter().enumerate() {
        let h = std::thread::Builder::new()
            .name(format!("flow {i}"))
            .spawn(move || {
                if sends {
                    send_until(flow, size, end)
                } else {
                    recv_until(flow, size, window_start, end, drain)
                }
            })
            .map_err(|e| format!("cannot start a flow thread: {e}"))?;
        handles.push(h);
    }
    let (cpu, window_ns) = meter_window(window_start, end);
    let mut reports = Vec::with_capacity(handles.len());
    let mut first_err = None;
    for (i, h) in handles.into_iter().enumerate() {
        match h.join() {
            Ok(Ok(c)) => reports.push(FlowReport {
                index: i as u32,
                bytes_tx: c.bytes_tx,
                bytes_rx: c.bytes_rx,
                window_bytes_rx: c.window_bytes_rx,
                round_trips: 0,
                percentiles: None,
                errors: 0,
            }),
            Ok(Err(e)) => {
                first_err.get_or_insert(format!("flow {i}: {e}"));
            }
            Err(_) => {
                first_err.get_or_insert(format!("flow {i}: its thread panicked"));
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
        },
        flows: reports,
    })
}
