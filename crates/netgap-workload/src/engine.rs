//! Roles on the flow engine ([`netgap_transport::flows`]), shared by
//! `hotspot` (request/response round trips on long-lived connections) and
//! `connect` (a connection per request): thousands of flows per agent on a
//! few worker threads, over any transport that gives the engine a data
//! path, in the point's completion mode. The server role is a
//! [`FlowServer`] on one listener, or, past what this process's
//! descriptors hold, shard processes sharing one listener
//! ([`crate::shard`]); a client role opens every flow before the barrier
//! and runs them all together after it. Over a datagram path
//! (udp) both roles also report their datagram counters, which the record
//! keeps as its `datagrams`.

use super::role::{
    find_transport, metered_with, window, OpenRole, ReadyRole, RoleContext, RoleError, RoleResult,
    Stop,
};
use super::{FlowSample, Refused};
use crate::shard;
use netgap_core::datagram::DatagramStats;
use netgap_core::spec::PointSpec;
use netgap_core::stats::LatencyHistogram;
use netgap_proto::workload::{
    FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec, MAX_WORKLOAD_FLOWS,
};
use netgap_transport::cpu::peak_rss_kib;
use netgap_transport::flows::{
    self, prepare_clients, ClientSpec, EngineConfig, FlowServer, FlowWork, PreparedClients,
};
use netgap_transport::Transport;
use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

/// Most engine worker threads on one agent.
const MAX_WORKERS: usize = 8;
/// How long a server role keeps serving after the window at least, so the
/// clients' last in-flight exchanges finish before it closes their
/// connections; past it, it serves on until its clients have been quiet
/// for [`SERVER_QUIET`] (no connection open, none accepted, no datagram
/// read) and, on a datagram path, the longest a flow waits to send a lost
/// request again, up to their I/O timeout more: tens of thousands of flows
/// on a busy host take longer than this grace to finish their last round
/// trip and close, client hosts that got the barrier late are still in
/// their window, and a udp flow whose last request was lost is silent
/// until its re-send.
const SERVER_GRACE: Duration = Duration::from_millis(500);
/// How long clients must hold no connection, open none and send no
/// datagram before a server role past its grace stops (on a datagram path,
/// after the longest re-send wait:
/// [`FlowServer::longest_client_silence`]).
const SERVER_QUIET: Duration = Duration::from_millis(200);
/// Most flows of an engine workload's point.
pub(crate) const MAX_ENGINE_FLOWS: u32 = MAX_WORKLOAD_FLOWS;

/// What one engine flow commits besides its message buffer, in bytes, an
/// upper bound: its state machine and socket handle (about 200 bytes), its
/// latency histogram (a `FlowHistogram`: typically under 1 KiB, 4.6 KiB if
/// its round trips spanned 1 ns to an hour), its report (about 100 bytes)
/// and its share of the workers' event buffers. Measured: 8,000 flow pairs
/// in one process added 0.65 KiB per pair.
pub(crate) const ENGINE_PER_FLOW_BYTES: u64 = 8 * 1024;

/// Memory an engine role of `spec` commits, an upper bound: one buffer of
/// the largest message per flow plus [`ENGINE_PER_FLOW_BYTES`]. The
/// engine's flows read and write through their worker's buffers; one
/// buffer per flow is what a server's flows hold if every echo is held
/// back by its socket, each then keeping one of its own.
pub(crate) fn memory_bytes(spec: &WorkloadSpec) -> u64 {
    super::role::largest_message_bytes(spec)
        .saturating_add(ENGINE_PER_FLOW_BYTES)
        .saturating_mul(u64::from(spec.flows))
}

/// Refuses, at plan time, a point the engine cannot run: a transport with
/// no engine data path, or options the engine does not honour.
pub(crate) fn check(
    workload: &str,
    spec: &PointSpec,
    transport: &dyn Transport,
) -> Result<(), Refused> {
    if transport.engine_path().is_none() {
        let carried: Vec<&str> = netgap_transport::registry()
            .iter()
            .filter(|t| t.engine_path().is_some())
            .map(|t| t.name())
            .collect();
        return Err(Refused(format!(
            "{workload} runs on the multi-client flow engine, which carries {}, not {}",
            carried.join(", "),
            spec.transport
        )));
    }
    match flows::per_message_options(&spec.options).first() {
        Some(flag) => Err(Refused(format!(
            "{flag} does not apply to {workload} (it acts on each message of a single flow, and the multi-client flow engine does not apply it)"
        ))),
        None => Ok(()),
    }
}

/// What a client's report of an engine flow says: the flow's value by
/// `value` from its round trips and the window, its bytes and its
/// percentiles scaled by `scale` (0.5: one-way from round trips). A server
/// reports no flows.
pub(crate) fn sample(
    side: WorkloadRole,
    report: &FlowReport,
    window_ns: u64,
    value: fn(u64, u64) -> f64,
) -> FlowSample {
    if side == WorkloadRole::Server {
        return FlowSample::default();
    }
    FlowSample {
        value: Some(value(report.round_trips, window_ns)),
        bytes_tx: report.bytes_tx,
        bytes_rx: report.bytes_rx,
        window_bytes: report.window_bytes_rx,
        percentiles: report.percentiles.clone(),
    }
}

/// The engine's configuration for a role: the point's transport path,
/// mode, options and I/O timeout, paced by the agent's `rate`.
fn config(
    workload: &'static str,
    spec: &WorkloadSpec,
    token: &netgap_proto::dataproof::DataToken,
    rate: &std::sync::Arc<netgap_transport::rate::RateBudget>,
) -> Result<EngineConfig, RoleError> {
    let t = find_transport(spec)?;
    let path = t.engine_path().ok_or_else(|| RoleError::Refused {
        workload,
        detail: format!(
            "the multi-client flow engine cannot carry {}",
            spec.point.transport
        ),
    })?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    Ok(EngineConfig {
        workers: cpus.clamp(1, MAX_WORKERS),
        io_timeout: Duration::from_millis(u64::from(spec.point.io_timeout_ms.max(1))),
        mode: spec.point.mode,
        options: spec.point.options.clone(),
        path,
        // Every flow proves the session before payload: a connection after
        // connect and accept, a datagram flow in its opening datagrams.
        token: Some(token.clone()),
        // Every byte counts against the agent's --max-rate.
        rate: Some(std::sync::Arc::clone(rate)),
    })
}

/// Opens an engine role doing `work`; latencies are reported scaled by
/// `scale` (0.5 turns round trips into one-way latency).
pub(crate) fn open(
    workload: &'static str,
    work: FlowWork,
    scale: f64,
    ctx: RoleContext<'_>,
) -> Result<Box<dyn OpenRole>, RoleError> {
    let spec = ctx.spec;
    let cfg = config(workload, spec, ctx.data_token, ctx.rate)?;
    let (warmup, duration) = window(spec);
    match spec.role {
        WorkloadRole::Server => {
            let ip: IpAddr = spec.listen_ips.first().copied().unwrap_or(ctx.control_ip);
            let io_timeout = cfg.io_timeout;
            // Every flow may be open here at once: past what this process's
            // descriptors hold, the role is spread over shard processes on
            // one listener; past what they hold, it is refused before
            // binding, saying what to change.
            if !cfg.path.datagrams() {
                let processes = shard::plan(
                    u64::from(spec.flows),
                    cfg.workers as u64,
                    ctx.flows_per_process.map(u64::from),
                )?;
                if let shard::Processes::Shards { count, per_process } = processes {
                    ctx.limits.check_memory(
                        &format!(
                            "a {workload} server role of {} flows in {count} processes",
                            spec.flows
                        ),
                        memory_bytes(spec).saturating_add(
                            u64::from(count).saturating_mul(shard::SHARD_PROCESS_BYTES),
                        ),
                    )?;
                    let listener = flows::bind_listener(SocketAddr::new(ip, 0), &cfg)?;
                    let config =
                        shard::ShardConfig::new(&cfg, work, per_process).sharing_rate(count);
                    let shards = shard::ShardSet::start(listener, &config, count)?;
                    return Ok(Box::new(Engine {
                        warmup,
                        duration,
                        stop: ctx.stop.clone(),
                        kind: Kind::Shards(shards, io_timeout),
                    }));
                }
            }
            // Every flow of the point may come to this server.
            let flows = Some(spec.flows as usize);
            let server = FlowServer::bind_for(SocketAddr::new(ip, 0), work, cfg, flows)?;
            Ok(Box::new(Engine {
                warmup,
                duration,
                stop: ctx.stop.clone(),
                kind: Kind::Server(server, io_timeout),
            }))
        }
        WorkloadRole::Client => {
            let target = spec.targets.first().ok_or(RoleError::Refused {
                workload,
                detail: "a client role needs a target".into(),
            })?;
            let target: SocketAddr = target.parse().map_err(|_| RoleError::Params {
                workload,
                detail: format!("the target {target:?} is not IP:PORT"),
            })?;
            let client = ClientSpec {
                target,
                flows: spec.flows as usize,
                work,
                bind_ip: spec.bind_ips.first().copied(),
            };
            let prepared = prepare_clients(&client, &cfg)?;
            Ok(Box::new(Engine {
                warmup,
                duration,
                stop: ctx.stop.clone(),
                kind: Kind::Clients(prepared, scale),
            }))
        }
    }
}

/// A prepared engine role.
struct Engine {
    warmup: Duration,
    duration: Duration,
    /// The session's end: every flow stops with it.
    stop: Stop,
    kind: Kind,
}

enum Kind {
    /// Serving on one listener; the clients' I/O timeout.
    Server(FlowServer, Duration),
    /// Serving on one listener from shard processes; the clients' I/O
    /// timeout.
    Shards(shard::ShardSet, Duration),
    /// Every client flow opened; the scale of reported latencies.
    Clients(PreparedClients, f64),
}

impl OpenRole for Engine {
    fn addrs(&self) -> Vec<String> {
        match &self.kind {
            Kind::Server(s, _) => vec![s.local_addr().to_string()],
            Kind::Shards(s, _) => vec![s.local_addr().to_string()],
            Kind::Clients(..) => Vec::new(),
        }
    }

    /// The engine accepts while it runs, so a server is ready at once.
    fn ready(self: Box<Self>) -> Result<Box<dyn ReadyRole>, RoleError> {
        Ok(self)
    }
}

impl ReadyRole for Engine {
    fn run(self: Box<Self>) -> Result<RoleResult, RoleError> {
        let Engine {
            warmup,
            duration,
            stop,
            kind,
        } = *self;
        // A server's shard processes work for the role: their CPU is its.
        let shard_pids = match &kind {
            Kind::Shards(s, _) => s.pids().to_vec(),
            _ => Vec::new(),
        };
        let (cpu, run) = metered_with(Instant::now(), warmup, duration, &stop, shard_pids, || {
            run(kind, warmup, duration, &stop)
        })?;
        let ran = run?;
        Ok(RoleResult {
            flows: ran.flows,
            buckets: ran.hist.buckets(),
            outcome: WorkloadOutcome {
                window_ns: ran.window_ns,
                cpu,
                // The agent's own peak, plus its shards' when it has them.
                peak_rss_kib: peak_rss_kib().map(|k| k + ran.shards_rss_kib),
                processes: ran.processes,
                bytes_rx: ran.bytes_rx,
                bytes_tx: ran.bytes_tx,
                datagrams: ran.datagrams,
                metrics: ran.metrics,
                services: Vec::new(),
                last_error: None,
                data_window_ns: None,
                evidence: Vec::new(),
            },
        })
    }
}

/// What a role's run gives back.
struct Ran {
    /// Per-flow reports (none from a server, which does not time exchanges).
    flows: Vec<FlowReport>,
    /// The latency of every exchange, ns.
    hist: LatencyHistogram,
    /// The measured window, ns.
    window_ns: u64,
    /// Payload bytes received, all flows.
    bytes_rx: u64,
    /// Payload bytes sent, all flows.
    bytes_tx: u64,
    /// Datagram counters of all flows, on a datagram path.
    datagrams: Option<DatagramStats>,
    /// The role's own figures: connection setup beside connect-and-exchange
    /// (connect).
    metrics: std::collections::BTreeMap<String, f64>,
    /// The peak resident memory of the role's shard processes, summed, KiB
    /// (0 without shards).
    shards_rss_kib: u64,
    /// Processes whose memory the role's peak counts, when more than the
    /// agent: the agent and its shards.
    processes: Option<u32>,
}

/// Serves past the window until the clients are done: at least
/// [`SERVER_GRACE`] after the window, then until they have held no
/// connection, opened none and sent nothing for `quiet`, at most
/// `io_timeout` more, or until `stop`. `counts` gives what the clients
/// did so far (connections accepted and datagrams read: a count that only
/// grows) and the connections open now.
fn serve_out(
    (warmup, duration): (Duration, Duration),
    (quiet, io_timeout): (Duration, Duration),
    stop: &Stop,
    counts: impl Fn() -> (u64, u64),
) {
    let grace_end = Instant::now() + warmup + duration + SERVER_GRACE;
    if stop.sleep_until(grace_end) {
        let last = grace_end + io_timeout;
        let (mut done, mut active) = (counts().0, Instant::now());
        loop {
            let now = Instant::now();
            let (d, open) = counts();
            if d != done || open > 0 {
                (done, active) = (d, now);
            }
            if now.duration_since(active) >= quiet || now >= last || stop.is_set() {
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// Runs a prepared role for `warmup` then `duration`, or until `stop`.
fn run(kind: Kind, warmup: Duration, duration: Duration, stop: &Stop) -> Result<Ran, RoleError> {
    match kind {
        Kind::Server(server, io_timeout) => {
            let quiet = SERVER_QUIET + server.longest_client_silence();
            serve_out((warmup, duration), (quiet, io_timeout), stop, || {
                (
                    server.accepted_connections() + server.datagrams_received(),
                    server.open_connections() as u64,
                )
            });
            let totals = server.stop()?;
            Ok(Ran {
                flows: Vec::new(),
                hist: LatencyHistogram::new(),
                window_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
                bytes_rx: totals.bytes_rx,
                bytes_tx: totals.bytes_tx,
                datagrams: totals.datagrams,
                metrics: Default::default(),
                shards_rss_kib: 0,
                processes: None,
            })
        }
        Kind::Shards(shards, io_timeout) => {
            // Shards serve connections only: an open one shows a client.
            serve_out((warmup, duration), (SERVER_QUIET, io_timeout), stop, || {
                (shards.accepted_connections(), shards.open_connections())
            });
            let out = shards.stop()?;
            Ok(Ran {
                flows: Vec::new(),
                hist: LatencyHistogram::new(),
                window_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
                bytes_rx: out.totals.bytes_rx,
                bytes_tx: out.totals.bytes_tx,
                datagrams: None,
                metrics: Default::default(),
                shards_rss_kib: out.peak_rss_kib,
                processes: Some(out.processes.saturating_add(1)),
            })
        }
        Kind::Clients(clients, scale) => {
            let report = clients.run_stoppable(warmup, duration, stop.flag())?;
            let mut hist = LatencyHistogram::new();
            let (mut rx, mut tx) = (0, 0);
            let mut datagrams: Option<DatagramStats> = None;
            let mut flows = Vec::with_capacity(report.flows.len());
            for f in &report.flows {
                f.hist.merge_into(&mut hist);
                rx += f.bytes_rx;
                tx += f.bytes_tx;
                if let Some(d) = &f.datagrams {
                    datagrams = Some(datagrams.unwrap_or_default().plus(d));
                }
                flows.push(FlowReport {
                    index: f.index,
                    bytes_tx: f.bytes_tx,
                    bytes_rx: f.bytes_rx,
                    window_bytes_rx: f.window_bytes_rx,
                    round_trips: f.round_trips,
                    percentiles: f.hist.percentiles_us(scale),
                    errors: f.errors,
                });
            }
            let metrics = setup_metrics(&report.flows, &hist);
            Ok(Ran {
                flows,
                hist,
                window_ns: report.elapsed_ns,
                bytes_rx: rx,
                bytes_tx: tx,
                datagrams,
                metrics,
                shards_rss_kib: 0,
                processes: None,
            })
        }
    }
}

/// Connect: the sums [`connection_times`] turns into means: the setup time
/// of the window's connections (`setup_ns`), their setup-and-exchange time
/// (`connection_ns`, from `hist`) and their count (`timed_connections`);
/// none for flows without connection setup.
fn setup_metrics(
    flows: &[flows::FlowOutcome],
    hist: &LatencyHistogram,
) -> std::collections::BTreeMap<String, f64> {
    let mut m = std::collections::BTreeMap::new();
    let setup_ns: u64 = flows.iter().map(|f| f.window_setup_ns).sum();
    let count: u64 = flows.iter().map(|f| f.round_trips).sum();
    if setup_ns == 0 || count == 0 {
        return m;
    }
    let total_ns = hist
        .buckets()
        .iter()
        .fold(0f64, |s, [v, c]| s + *v as f64 * *c as f64);
    m.insert("setup_ns".into(), setup_ns as f64);
    m.insert("connection_ns".into(), total_ns);
    m.insert("timed_connections".into(), count as f64);
    m
}

/// Connect: from the roles' sums of `setup_metrics`, the mean connection
/// setup time (`setup_time_us`: the TCP handshake, from opening the socket
/// to the connection being established), beside the mean of setup plus
/// exchange (`connection_time_us`, which also holds the session proof's
/// round trip between handshake and request) and the setup's share of it
/// (`setup_share_pct`).
pub(crate) fn connection_times(
    roles: &[(WorkloadRole, &std::collections::BTreeMap<String, f64>)],
) -> std::collections::BTreeMap<String, f64> {
    let sum = |k: &str| roles.iter().filter_map(|(_, m)| m.get(k)).sum::<f64>();
    let (setup, total, n) = (
        sum("setup_ns"),
        sum("connection_ns"),
        sum("timed_connections"),
    );
    let mut m = std::collections::BTreeMap::new();
    if n > 0.0 && total > 0.0 {
        m.insert("setup_time_us".into(), setup / n / 1e3);
        m.insert("connection_time_us".into(), total / n / 1e3);
        m.insert("setup_share_pct".into(), 100.0 * setup / total);
    }
    m
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The bug: a udp hotspot of 2,000 clients failed with "Connection
    /// refused". Its server role counted only connections, which datagram
    /// flows never open, so it stopped a fixed 700 ms after the window,
    /// while flows whose last request had been lost (the server's sockets
    /// overflow under 2,000 clients) were still waiting, up to a second,
    /// to send it again; the re-send met a closed port. A server now serves
    /// while anything arrives, and until nothing has for `quiet`.
    #[test]
    fn a_server_serves_until_its_clients_have_sent_nothing_for_the_quiet_time() {
        let quiet = Duration::from_millis(300);
        let t0 = Instant::now();
        // Datagrams keep coming until 900 ms, well past the grace.
        let busy_until = t0 + Duration::from_millis(900);
        let received = std::sync::atomic::AtomicU64::new(0);
        let counts = || {
            if Instant::now() < busy_until {
                received.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
            (received.load(std::sync::atomic::Ordering::Relaxed), 0)
        };
        let zero = (Duration::ZERO, Duration::ZERO);
        serve_out(zero, (quiet, Duration::from_secs(10)), &Stop::new(), counts);
        let took = t0.elapsed();
        // The last datagram was seen within a 10 ms look of 900 ms.
        assert!(
            took >= Duration::from_millis(880) + quiet && took < Duration::from_secs(5),
            "{took:?}"
        );
        // Nothing at all: the grace, then the quiet time.
        let t0 = Instant::now();
        serve_out(zero, (quiet, Duration::from_secs(10)), &Stop::new(), || {
            (0, 0)
        });
        let took = t0.elapsed();
        assert!(
            took >= SERVER_GRACE + quiet && took < Duration::from_secs(5),
            "{took:?}"
        );
        // Clients that never go quiet have their I/O timeout past the grace.
        let t0 = Instant::now();
        let io_timeout = Duration::from_millis(200);
        serve_out(zero, (quiet, io_timeout), &Stop::new(), || (0, 1));
        let took = t0.elapsed();
        assert!(
            took >= SERVER_GRACE + io_timeout && took < Duration::from_secs(5),
            "{took:?}"
        );
    }
}
