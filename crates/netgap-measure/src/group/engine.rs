//! The bridge from a group role to the epoll flows engine
//! ([`netgap_transport::flows`]): `hotspot` (ping-pong) and `connect` flows, thousands
//! per agent on a few worker threads. The server role is a
//! [`FlowServer`] on one listener; a client role opens every flow before
//! the barrier ([`prepare_clients`]) and runs them all together after it.

use netgap_core::stats::LatencyHistogram;
use netgap_proto::group::{FlowReport, GroupSpec, GroupWork};
use netgap_transport::flows::{
    prepare_clients, ClientSpec, EngineConfig, FlowServer, FlowWork, PreparedClients,
};
use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

/// Most engine worker threads on one agent.
const MAX_WORKERS: usize = 8;
/// How long a server role keeps serving after the window, so the clients'
/// last in-flight exchanges finish before it closes their connections.
const SERVER_GRACE: Duration = Duration::from_millis(500);

/// A prepared engine role.
pub enum Prepared {
    /// Serving on one listener.
    Server(FlowServer),
    /// Every client flow opened.
    Clients(PreparedClients, f64),
}

/// What an engine role moved and measured.
pub struct EngineResult {
    /// Per-flow reports (a server reports none: it does not time exchanges).
    pub flows: Vec<FlowReport>,
    /// Latency of every exchange of every flow, ns (round trip or connect
    /// plus exchange).
    pub hist: LatencyHistogram,
    /// The measured window, ns.
    pub window_ns: u64,
    /// Payload bytes received, all flows.
    pub bytes_rx: u64,
    /// Payload bytes sent, all flows.
    pub bytes_tx: u64,
}

fn config(spec: &GroupSpec) -> EngineConfig {
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    EngineConfig {
        mode: spec.point.mode,
        options: spec.point.options.clone(),
        ..EngineConfig::tcp(
            cpus.clamp(1, MAX_WORKERS),
            Duration::from_millis(u64::from(spec.point.io_timeout_ms.max(1))),
        )
    }
}

/// The engine's work for a group spec, and the scale that turns its
/// recorded latencies into the reported ones (one-way for ping-pong).
fn work(spec: &GroupSpec) -> Result<(FlowWork, f64), String> {
    let size = |b: u64| usize::try_from(b).map_err(|_| "size does not fit in memory".to_string());
    match spec.work {
        GroupWork::PingPong { size_bytes } => Ok((
            FlowWork::PingPong {
                size_bytes: size(size_bytes)?,
            },
            0.5,
        )),
        GroupWork::Connect {
            request_bytes,
            reply_bytes,
        } => Ok((
            FlowWork::Connect {
                request_bytes: size(request_bytes)?,
                reply_bytes: size(reply_bytes)?,
            },
            1.0,
        )),
        GroupWork::Stream { .. } => Err("bandwidth work does not run on the flows engine".into()),
    }
}

fn check_tcp(spec: &GroupSpec) -> Result<(), String> {
    if spec.point.transport != "tcp" {
        return Err(format!(
            "{} runs over tcp only, not {}",
            spec.point.test, spec.point.transport
        ));
    }
    Ok(())
}

/// Starts the server role on `ip`; returns its address (`IP:PORT`).
pub fn listen(spec: &GroupSpec, ip: IpAddr) -> Result<(String, Prepared), String> {
    check_tcp(spec)?;
    let (w, _) = work(spec)?;
    let server =
        FlowServer::bind(SocketAddr::new(ip, 0), w, config(spec)).map_err(|e| e.to_string())?;
    Ok((server.local_addr().to_string(), Prepared::Server(server)))
}

/// Opens every flow of a client role. The target was checked against the
/// session's hosts by [`GroupSpec::validate`].
pub fn connect(spec: &GroupSpec) -> Result<Prepared, String> {
    check_tcp(spec)?;
    let (w, scale) = work(spec)?;
    let target: SocketAddr = spec
        .targets
        .first()
        .ok_or("no target")?
        .parse()
        .map_err(|_| "the target is not IP:PORT".to_string())?;
    let client = ClientSpec {
        target,
        flows: spec.flows as usize,
        work: w,
        bind_ip: spec.bind_ips.first().copied(),
    };
    let prepared = prepare_clients(&client, &config(spec)).map_err(|e| e.to_string())?;
    Ok(Prepared::Clients(prepared, scale))
}

/// Runs a prepared role for `warmup` then `duration`.
pub fn run(p: Prepared, warmup: Duration, duration: Duration) -> Result<EngineResult, String> {
    match p {
        Prepared::Server(server) => {
            std::thread::sleep(warmup + duration + SERVER_GRACE);
            let totals = server.stop().map_err(|e| e.to_string())?;
            Ok(EngineResult {
                flows: Vec::new(),
                hist: LatencyHistogram::new(),
                window_ns: u64::try_from(duration.as_nanos()).unwrap_or(u64::MAX),
                bytes_rx: totals.bytes_rx,
                bytes_tx: totals.bytes_tx,
            })
        }
        Prepared::Clients(clients, scale) => {
            let report = clients.run(warmup, duration).map_err(|e| e.to_string())?;
            let mut hist = LatencyHistogram::new();
            let mut result = EngineResult {
                flows: Vec::with_capacity(report.flows.len()),
                hist: LatencyHistogram::new(),
                window_ns: report.elapsed_ns,
                bytes_rx: 0,
                bytes_tx: 0,
            };
            for f in &report.flows {
                hist.merge(&f.hist);
                result.bytes_rx += f.bytes_rx;
                result.bytes_tx += f.bytes_tx;
                result.flows.push(FlowReport {
                    index: f.index,
                    bytes_tx: f.bytes_tx,
                    bytes_rx: f.bytes_rx,
                    window_bytes_rx: f.window_bytes_rx,
                    round_trips: f.round_trips,
                    percentiles: f.hist.percentiles_us(scale),
                    errors: f.errors,
                });
            }
            result.hist = hist;
            Ok(result)
        }
    }
}
