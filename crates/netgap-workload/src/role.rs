//! A workload's role on an agent: what the agent hands a workload
//! ([`RoleContext`]), the two steps of a role before the barrier
//! ([`OpenRole`]: listening or connecting, then [`ReadyRole`]: every flow
//! ready), what a role reports after its run ([`RoleResult`]), and why a
//! role failed ([`RoleError`], one line for the coordinator); and how a
//! role's CPU is metered: its agent's process, every thread of it, and
//! the processes the role started, between two `WindowEdge`s at the
//! edges of the window in which its bytes moved (`metered`,
//! `meter_window_counting`, or where a job's own parts begin and end).
//!
//! The agent finds the workload by the point's name ([`open`]); everything
//! past that is the workload's own code.

use netgap_core::cpu::CpuUsage;
use netgap_proto::limits::{AgentLimits, LimitError};
use netgap_proto::workload::{FlowReport, WorkloadOutcome, WorkloadSpec};
use netgap_transport::cpu::HostMark;
use netgap_transport::flows::EngineError;
use netgap_transport::{self as transport, FlowError, TransportError};
use serde::de::DeserializeOwned;
use std::net::IpAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a server role waits for all its flows to connect.
pub const ACCEPT_TIMEOUT: Duration = Duration::from_secs(10);

/// What an agent gives a workload to open its role with.
#[derive(Debug, Clone, Copy)]
pub struct RoleContext<'a> {
    /// The role, range-checked by [`WorkloadSpec::validate`] and by the
    /// agent's limits on flows, window and the point's size.
    pub spec: &'a WorkloadSpec,
    /// The address the control connection arrived on: where a server
    /// listens when the spec names no address.
    pub control_ip: IpAddr,
    /// The agent's limits, for the sizes in the workload's parameters.
    pub limits: &'a AgentLimits,
    /// Set when the session that asked for the role ends (or the role
    /// passes the agent's longest run): every flow of the role stops
    /// within [`STOP_TICK`] of it, or of its own I/O timeout when blocked
    /// on a silent peer.
    pub stop: &'a Stop,
    /// The point's data token: every flow proves it at connect or accept
    /// ([`netgap_transport::preamble`]) before payload moves.
    pub data_token: &'a netgap_proto::dataproof::DataToken,
    /// Whether this agent may start the real server programs it knows
    /// (nginx, Apache, gmond) for a workload: only when it was started
    /// with `--allow-services` (`crate::service`).
    pub services: bool,
    /// Most connections one process of this agent holds, set when the
    /// agent started (never by a coordinator): a server role past it is
    /// spread over processes ([`crate::shard`]) even when the descriptor
    /// limit would hold it. `None`: what the descriptor limit holds.
    pub flows_per_process: Option<u32>,
    /// The only directories the role may write in: the agent's run
    /// directory (services) and its I/O directory (pio's stripes), set when
    /// the agent started (never by a coordinator).
    pub dirs: &'a crate::confined::AgentDirs,
    /// The agent's highest data rate (`--max-rate`): every byte the role
    /// sends or receives is charged to it, shared with everything else
    /// the agent moves.
    pub rate: &'a std::sync::Arc<netgap_transport::rate::RateBudget>,
    /// What the relays this agent starts for `-t xdp` runs need (its
    /// `--relay-interface` and the key derived from its own), set when
    /// the agent started (never by a coordinator); `None`: it starts none.
    pub relay: Option<&'a crate::preload::RelaySetup>,
}

/// How often a role that waits checks its [`Stop`].
pub const STOP_TICK: Duration = Duration::from_millis(50);

/// A signal that the role's session is over: cheap to check on every
/// message, shared by every thread of the role.
#[derive(Debug, Clone, Default)]
pub struct Stop(Arc<AtomicBool>);

impl Stop {
    /// A signal not yet given.
    pub fn new() -> Stop {
        Stop::default()
    }

    /// Gives the signal.
    pub fn set(&self) {
        self.0.store(true, Ordering::Relaxed);
    }

    /// Whether the signal was given.
    pub(crate) fn is_set(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    /// The flag itself, for code that polls a bare `AtomicBool`.
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.0)
    }

    /// Sleeps until `t` or until the signal, checking every
    /// [`STOP_TICK`]; `false` when stopped early.
    pub(crate) fn sleep_until(&self, t: Instant) -> bool {
        loop {
            if self.is_set() {
                return false;
            }
            let left = t.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return true;
            }
            std::thread::sleep(left.min(STOP_TICK));
        }
    }
}

/// A role after its first step: a server listening (its flows being
/// accepted), a client connected.
pub trait OpenRole: Send {
    /// The data addresses (`IP:PORT`) to announce, one per flow or one for
    /// all; empty for a role that only connects.
    fn addrs(&self) -> Vec<String>;

    /// Waits until every flow is ready (at most [`ACCEPT_TIMEOUT`]).
    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError>;
}

/// A role whose flows are all ready, waiting for the barrier.
pub trait ReadyRole: Send {
    /// Runs every flow for the warm-up and the window of the spec, then
    /// reports.
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError>;
}

/// What an agent reports after a workload repetition.
#[derive(Debug, Clone)]
pub struct RoleResult {
    /// Per-flow reports, in the role's flow order.
    pub flows: Vec<FlowReport>,
    /// `[value_ns, count]` buckets of the latency histogram of all flows.
    pub buckets: Vec<[u64; 2]>,
    /// Window, CPU and memory.
    pub outcome: WorkloadOutcome,
}

/// Why a role could not be opened or run: one line for the coordinator.
#[derive(Debug, thiserror::Error)]
pub enum RoleError {
    /// A workload run asked for before any role was prepared.
    #[error("no workload role is prepared")]
    NotPrepared,
    /// The point names a workload this agent does not have.
    #[error("unknown workload {name:?} (this agent has: {known})")]
    UnknownWorkload {
        /// The name asked for.
        name: String,
        /// The workloads this agent has.
        known: String,
    },
    /// The workload's parameters do not parse or are out of range.
    #[error("{workload}: bad parameters: {detail}")]
    Params {
        /// The workload.
        workload: &'static str,
        /// What is wrong.
        detail: String,
    },
    /// A parameter past the agent's limits.
    #[error(transparent)]
    Limit(#[from] LimitError),
    /// The point names a transport this agent does not have.
    #[error("unknown transport {name:?} (this agent has: {known})")]
    UnknownTransport {
        /// The name asked for.
        name: String,
        /// The transports this agent has.
        known: String,
    },
    /// The transport does not work on this host.
    #[error("transport {name} is not available on the agent: {why}")]
    Unavailable {
        /// The transport.
        name: String,
        /// Why not.
        why: transport::Unavailable,
    },
    /// The workload cannot run this way (a transport it cannot drive, more
    /// flows than it runs).
    #[error("{workload}: {detail}")]
    Refused {
        /// The workload.
        workload: &'static str,
        /// What it cannot do.
        detail: String,
    },
    /// A flow could not be opened.
    #[error("flow {index}: {source}")]
    Open {
        /// The flow's index in the role.
        index: usize,
        /// Why.
        source: TransportError,
    },
    /// A flow's far end did not prove it belongs to the session.
    #[error("flow {index}: {source}")]
    NotInSession {
        /// The flow's index in the role.
        index: usize,
        /// Why.
        source: netgap_transport::preamble::PreambleError,
    },
    /// A flow failed while running.
    #[error("flow {index}: {source}")]
    Flow {
        /// The flow's index in the role.
        index: usize,
        /// Why.
        source: FlowError,
    },
    /// The flow engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
    /// A server spread over processes could not be started or failed.
    #[error(transparent)]
    Shard(#[from] crate::shard::ShardError),
    /// A thread could not be started.
    #[error("cannot start {what}: {source}")]
    Thread {
        /// Which thread.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A thread of the role panicked; a bug, not a peer's doing.
    #[error("{what} panicked")]
    Panicked {
        /// Which thread.
        what: String,
    },
}

/// Opens the role `ctx.spec` asks for with the workload it names, once the
/// memory it would commit is within the agent's budget.
pub fn open(ctx: RoleContext<'_>) -> Result<Box<dyn OpenRole>, RoleError> {
    let name = &ctx.spec.point.test;
    let workload = super::find(name).ok_or_else(|| RoleError::UnknownWorkload {
        name: name.clone(),
        known: super::names(),
    })?;
    ctx.limits.check_memory(
        &format!(
            "a {name} {} role of {} flows of {}-byte messages",
            ctx.spec.role.as_str(),
            ctx.spec.flows,
            largest_message_bytes(ctx.spec)
        ),
        workload
            .memory_bytes(ctx.spec)
            .saturating_add(buffer_padding_bytes(ctx.spec)),
    )?;
    workload.open(ctx)
}

/// What the layout of a role's message buffers (`--align`, `--offset`)
/// adds to its memory: each flow's send and receive buffer padded.
fn buffer_padding_bytes(spec: &WorkloadSpec) -> u64 {
    spec.point
        .options
        .buffer_padding_bytes()
        .saturating_mul(2)
        .saturating_mul(u64::from(spec.flows.max(1)))
}

/// What one flow of a role commits besides its message buffers, in bytes:
/// its socket's user-space state, its share of a worker or its own
/// thread's touched stack, its latency histogram (an upper bound; the
/// flow engine measures about 61 KiB per flow at 10,000 flows).
pub(crate) const PER_FLOW_BYTES: u64 = 64 * 1024;

/// The largest message a role's flows carry: the point's size, or any
/// larger `*_bytes` size among the workload's parameters (a request and
/// a reply of their own size).
pub(crate) fn largest_message_bytes(spec: &WorkloadSpec) -> u64 {
    let params = spec.params.as_object().into_iter().flatten();
    params
        .filter(|(k, _)| k.ends_with("_bytes"))
        .filter_map(|(_, v)| v.as_u64())
        .fold(spec.point.size_bytes, u64::max)
}

/// Memory a role commits when every flow holds a send and a receive
/// buffer of its largest message plus [`PER_FLOW_BYTES`]: the bound for a
/// workload that does not say less ([`super::Workload::memory_bytes`]).
pub(crate) fn memory_bytes(spec: &WorkloadSpec) -> u64 {
    largest_message_bytes(spec)
        .saturating_mul(2)
        .saturating_add(PER_FLOW_BYTES)
        .saturating_mul(u64::from(spec.flows))
}

/// Parses a workload's parameters into its own type; unknown fields are
/// refused by the type (`deny_unknown_fields`).
pub(crate) fn parse_params<P: DeserializeOwned>(
    workload: &'static str,
    spec: &WorkloadSpec,
) -> Result<P, RoleError> {
    P::deserialize(&spec.params).map_err(|e| RoleError::Params {
        workload,
        detail: e.to_string(),
    })
}

/// The parameters of a workload that takes none: an empty object.
#[derive(Debug, Clone, Copy, Default, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct NoParams {}

/// The point's transport, available on this host.
pub(crate) fn find_transport(
    spec: &WorkloadSpec,
) -> Result<&'static dyn transport::Transport, RoleError> {
    let t = transport::find(&spec.point.transport).ok_or_else(|| RoleError::UnknownTransport {
        name: spec.point.transport.clone(),
        known: transport::names(),
    })?;
    t.availability().map_err(|why| RoleError::Unavailable {
        name: spec.point.transport.clone(),
        why,
    })?;
    Ok(t)
}

/// Picks entry `i` of a per-flow list of 0, 1 or `flows` entries.
pub(crate) fn per_flow<T: Clone>(list: &[T], i: usize) -> Option<T> {
    match list.len() {
        0 => None,
        1 => list.first().cloned(),
        _ => list.get(i).cloned(),
    }
}

/// The uncounted warm-up and the measured window of the spec.
pub fn window(spec: &WorkloadSpec) -> (Duration, Duration) {
    (
        Duration::from_millis(u64::from(spec.warmup_ms)),
        Duration::from_millis(u64::from(spec.duration_ms)),
    )
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

/// CPU time of process `pid` so far (user and system, from
/// `/proc/PID/stat`, in clock ticks), in nanoseconds; 0 if unreadable.
fn other_process_cpu_ns(pid: u32) -> u64 {
    let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
        return 0;
    };
    // SAFETY: sysconf has no preconditions.
    let ticks_per_s = u64::try_from(unsafe { libc::sysconf(libc::_SC_CLK_TCK) }).unwrap_or(0);
    stat_cpu_ticks(&stat)
        .filter(|_| ticks_per_s > 0)
        .map_or(0, |t| t.saturating_mul(1_000_000_000) / ticks_per_s)
}

/// utime plus stime of a `/proc/PID/stat` line, in clock ticks: the 14th
/// and 15th fields, counted after the command name (which may hold spaces
/// and parentheses, so it ends at the last `)`).
pub(crate) fn stat_cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime.saturating_add(stime))
}

/// Runs `work` on this thread while a second thread meters host and
/// process CPU over the window, from `t0 + warmup` for `duration` or until
/// `stop` ([`meter_window`]); the window's CPU and what `work` returned.
pub(crate) fn metered<T>(
    t0: Instant,
    warmup: Duration,
    duration: Duration,
    stop: &Stop,
    work: impl FnOnce() -> T,
) -> Result<(CpuUsage, T), RoleError> {
    metered_with(t0, warmup, duration, stop, Vec::new(), work)
}

/// [`metered`], counting the CPU time of the processes `also` (a server's
/// shard processes) as the role's own.
pub(crate) fn metered_with<T>(
    t0: Instant,
    warmup: Duration,
    duration: Duration,
    stop: &Stop,
    also: Vec<u32>,
    work: impl FnOnce() -> T,
) -> Result<(CpuUsage, T), RoleError> {
    let meter_stop = stop.clone();
    let meter = std::thread::Builder::new()
        .name("cpu meter".into())
        .spawn(move || meter_window_with(t0 + warmup, t0 + warmup + duration, &meter_stop, &also))
        .map_err(|source| RoleError::Thread {
            what: "the CPU meter",
            source,
        })?;
    let out = work();
    let (cpu, _) = meter.join().map_err(|_| RoleError::Panicked {
        what: "the CPU meter".into(),
    })?;
    Ok((cpu, out))
}

/// Measures host and process CPU over the window on the calling thread,
/// which sleeps meanwhile: from `window_start` to `end`, or until `stop`.
/// Returns the usage and the window's length as timed, in ns.
pub(crate) fn meter_window(window_start: Instant, end: Instant, stop: &Stop) -> (CpuUsage, u64) {
    meter_window_with(window_start, end, stop, &[])
}

/// [`meter_window`], counting the CPU time of the processes `also` too.
fn meter_window_with(
    window_start: Instant,
    end: Instant,
    stop: &Stop,
    also: &[u32],
) -> (CpuUsage, u64) {
    meter_window_counting(window_start, end, stop, &|| {
        also.iter()
            .map(|&pid| other_process_cpu_ns(pid))
            .fold(0, u64::saturating_add)
    })
}

/// One edge of a role's window: the clock and the host's counters
/// ([`HostMark`]) with the role's CPU time so far, ns: this agent
/// process's (every thread of it, those that ended included) and what the
/// caller counts besides (the processes the role started).
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowEdge {
    host: HostMark,
    cpu_ns: u64,
}

impl WindowEdge {
    /// The edge now, the role's CPU time being this process's.
    pub(crate) fn now() -> WindowEdge {
        WindowEdge::counting(&|| 0)
    }

    /// The edge now, the role's CPU time being this process's and what
    /// `extra_ns` reads.
    pub(crate) fn counting(extra_ns: &dyn Fn() -> u64) -> WindowEdge {
        let cpu_ns = process_cpu_ns().saturating_add(extra_ns());
        WindowEdge {
            host: HostMark::now(),
            cpu_ns,
        }
    }

    /// When the edge was read.
    pub(crate) fn at(&self) -> Instant {
        self.host.at()
    }

    /// The role's usage over the window from this edge to `end`.
    pub(crate) fn usage_to(&self, end: &WindowEdge) -> CpuUsage {
        self.host
            .usage_to(&end.host, end.cpu_ns.saturating_sub(self.cpu_ns))
    }
}

/// [`meter_window`], counting as the role's own the CPU time, ns, that
/// `extra_ns` reads at each end of the window (a server program's
/// processes, which the kernel accounts apart from the agent's).
pub(crate) fn meter_window_counting(
    window_start: Instant,
    end: Instant,
    stop: &Stop,
    extra_ns: &dyn Fn() -> u64,
) -> (CpuUsage, u64) {
    stop.sleep_until(window_start);
    let opened = WindowEdge::counting(extra_ns);
    stop.sleep_until(end);
    let closed = WindowEdge::counting(extra_ns);
    // The flows count their window's bytes by the instants `window_start`
    // and `end` (or until the stop), not by when this thread woke: on a
    // busy host it may wake late, even past the end, and a window timed
    // from then would divide the whole window's bytes by a moment.
    let window_ns = u64::try_from(
        closed
            .at()
            .min(end)
            .saturating_duration_since(window_start)
            .as_nanos(),
    )
    .unwrap_or(u64::MAX);
    (opened.usage_to(&closed), window_ns)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_window_is_timed_from_its_start_even_by_a_thread_that_wakes_late() {
        // The window began 300 ms ago and ends in 50 ms, as for a meter
        // thread scheduled late on a busy host.
        let now = Instant::now();
        let start = now.checked_sub(Duration::from_millis(300)).unwrap();
        let (_, ns) = meter_window(start, now + Duration::from_millis(50), &Stop::new());
        assert!((340_000_000..2_000_000_000).contains(&ns), "{ns}");
        // Woken after the window ended: the window's own length.
        let now = Instant::now();
        let (_, ns) = meter_window(
            now.checked_sub(Duration::from_millis(500)).unwrap(),
            now.checked_sub(Duration::from_millis(200)).unwrap(),
            &Stop::new(),
        );
        assert_eq!(ns, 300_000_000);
    }

    #[test]
    fn cpu_ticks_are_read_past_a_command_name_with_spaces() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 7 5 0 0 20 0 1 0 9 1000 200";
        assert_eq!(stat_cpu_ticks(stat), Some(12));
        assert_eq!(stat_cpu_ticks("42 (x) S 1"), None);
        let me = std::process::id();
        assert!(
            stat_cpu_ticks(&std::fs::read_to_string(format!("/proc/{me}/stat")).unwrap()).is_some()
        );
    }
}
