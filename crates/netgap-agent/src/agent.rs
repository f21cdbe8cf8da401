//! The agent (`netgap serve`): accepts control sessions from coordinators and
//! runs the server role of each point they open, or its client role when a
//! coordinator places both roles of a point on agents (the client then
//! connects to another agent's server role and reports what it timed). One
//! session at a time runs
//! tests; another coordinator gets an explicit "busy". A client that vanishes
//! or sends garbage ends only its own session; the agent serves the next one.
//!
//! With a key, every connection first proves it ([`crate::auth::challenge`])
//! before any request is decoded. Connections still in that handshake (or
//! before their `Hello`) are few ([`MAX_HANDSHAKES`]), short
//! ([`HANDSHAKE_TIMEOUT`]) and never turned away: a new one closes the
//! oldest unproven connection of the busiest source when the pool is full
//! (see `admission`), and none of them holds the busy slot, so clients that
//! cannot authenticate cannot keep the agent from serving. Requests are
//! checked against the agent's [`AgentLimits`] before any data socket opens.

mod watchdog;

use crate::admission::{RefusalLog, REFUSAL_LOG_INTERVAL};
use crate::control::{ControlAddr, ControlConn, ControlError, ControlStream};
use netgap_bench as bench;
use netgap_core::spec::PointSpec;
use netgap_core::text::escape_control;
use netgap_proto::auth::{is_auth_frame, Key};
use netgap_proto::codec::decode_request;
use netgap_proto::dataproof::DataToken;
use netgap_proto::limits::AgentLimits;
use netgap_proto::message::{Reply, Request};
use netgap_proto::session::{AgentAction, AgentSession};
use netgap_proto::workload::WorkloadRole;
use netgap_transport::cpu::CpuMeter;
use netgap_transport::rate::{PacedFlow, RateBudget};
use netgap_transport::{self as transport, DatagramStats, FlowConfig, FlowMonitor};
use netgap_workload::role::{self, ReadyRole, RoleContext, RoleError, RoleResult, Stop};
use std::io;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::os::fd::AsFd;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long a new connection may take to authenticate and say hello.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most connections at once that have not yet said hello; a new one past
/// them closes the oldest of the source holding the most.
pub const MAX_HANDSHAKES: usize = crate::admission::MAX_UNPROVEN;
/// How long an established session may stay silent between requests, at
/// most: an agent with a shorter `--max-duration` waits that long, but at
/// least [`MIN_IDLE_TIMEOUT`].
const IDLE_TIMEOUT: Duration = Duration::from_secs(60);
/// The shortest wait between requests, whatever `--max-duration` says: a
/// coordinator computes and writes a point's results between requests.
const MIN_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long the agent waits for the coordinator's data connection.
const ACCEPT_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the agent could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot listen on {addr}: {source}")]
pub struct BindError {
    /// The address asked for.
    pub addr: String,
    /// Underlying error (address in use, no permission, ...).
    pub source: io::Error,
}

enum Listener {
    Tcp(TcpListener),
    Unix(UnixListener),
}

impl Listener {
    fn accept(&self) -> io::Result<(ControlStream, String)> {
        match self {
            Listener::Tcp(l) => l
                .accept()
                .map(|(s, peer)| (ControlStream::Tcp(s), peer.to_string())),
            Listener::Unix(l) => l
                .accept()
                .map(|(s, _)| (ControlStream::Unix(s), "a local client".to_string())),
        }
    }
}

/// What every session of an agent shares.
struct Shared {
    busy: AtomicBool,
    unproven: Arc<crate::admission::Pool>,
    /// The connections refused before proving themselves, logged as a
    /// summary at most once per interval.
    refusals: Mutex<RefusalLog>,
    key: Option<Key>,
    limits: AgentLimits,
    data_ip: Option<IpAddr>,
    /// Whether workloads may start real server programs on this host.
    services: bool,
    /// Most connections one process of this agent holds (a server role
    /// past it is spread over processes); `None`: the descriptor limit.
    flows_per_process: Option<u32>,
    /// The only directories the agent writes in: its run directory and
    /// the one pio's stripes go under ([`netgap_workload::confined`]).
    dirs: Arc<netgap_workload::confined::AgentDirs>,
    /// The agent's highest data rate (`--max-rate`) as a budget every
    /// flow of every session charges, point-to-point and workload alike.
    rate: Arc<RateBudget>,
    /// What the relays it starts for `-t xdp` runs take
    /// (`--relay-interface`, and a key derived from its own).
    relay: Option<netgap_workload::preload::RelaySetup>,
}

/// A bound agent, ready to serve.
pub struct Agent {
    listener: Listener,
    shared: Shared,
    quiet: bool,
}

impl Agent {
    /// Binds the control listener at a TCP `addr`.
    pub fn bind(addr: SocketAddr) -> Result<Agent, BindError> {
        let listener = TcpListener::bind(addr).map_err(|source| BindError {
            addr: addr.to_string(),
            source,
        })?;
        Ok(Agent::with_listener(Listener::Tcp(listener)))
    }

    /// Binds the control listener at `addr`, TCP or a Unix socket. A stale
    /// socket file nobody listens on is replaced; a live one is an error.
    /// The Unix socket is made accessible to its owner only.
    pub fn bind_control(addr: &ControlAddr) -> Result<Agent, BindError> {
        let path = match addr {
            ControlAddr::Tcp(a) => return Agent::bind(*a),
            ControlAddr::Unix(p) => p,
        };
        let err = |source| BindError {
            addr: addr.to_string(),
            source,
        };
        let is_socket = std::fs::symlink_metadata(path)
            .is_ok_and(|m| std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()));
        // Only a socket is ever removed, never another kind of file.
        if is_socket && std::os::unix::net::UnixStream::connect(path).is_err() {
            std::fs::remove_file(path).map_err(err)?;
        }
        let listener = UnixListener::bind(path).map_err(err)?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).map_err(err)?;
        Ok(Agent::with_listener(Listener::Unix(listener)))
    }

    fn with_listener(listener: Listener) -> Agent {
        Agent {
            listener,
            shared: Shared {
                busy: AtomicBool::new(false),
                unproven: Arc::default(),
                refusals: Mutex::new(RefusalLog::new(REFUSAL_LOG_INTERVAL)),
                key: None,
                limits: AgentLimits::default(),
                data_ip: None,
                services: false,
                flows_per_process: None,
                dirs: Arc::new(netgap_workload::confined::AgentDirs::new(
                    netgap_workload::confined::default_run_base(),
                )),
                rate: Arc::new(RateBudget::new(AgentLimits::default().max_rate_gbps)),
                relay: None,
            },
            quiet: false,
        }
    }

    /// Requires every coordinator to prove `key` before anything else.
    pub fn with_key(mut self, key: Key) -> Agent {
        self.shared.key = Some(key);
        self
    }

    /// Refuses requests past `limits`.
    pub fn with_limits(mut self, limits: AgentLimits) -> Agent {
        self.shared.limits = limits;
        self.shared.rate = Arc::new(RateBudget::new(limits.max_rate_gbps));
        self
    }

    /// Opens data listeners on `ip` (default: the address the control
    /// connection came in on, or 127.0.0.1 over a Unix socket).
    pub fn with_data_ip(mut self, ip: IpAddr) -> Agent {
        self.shared.data_ip = Some(ip);
        self
    }

    /// Lets workloads start the real server programs netgap knows (nginx,
    /// Apache, gmond) on this host, each from a configuration the agent
    /// writes itself into a directory of its own (`netgap_workload`'s services).
    pub fn allow_services(mut self) -> Agent {
        self.shared.services = true;
        self
    }

    /// Writes only under `dirs` (default: a run directory under
    /// [`netgap_workload::confined::default_run_base`], made when first needed).
    /// What a killed agent left there is removed when its base is opened
    /// ([`netgap_workload::confined::AgentDirs::open_base`]).
    pub fn with_dirs(mut self, dirs: netgap_workload::confined::AgentDirs) -> Agent {
        self.shared.dirs = Arc::new(dirs);
        self
    }

    /// Spreads a flow-engine server role over processes past `flows`
    /// connections per process, even when the descriptor limit would hold
    /// more ([`netgap_workload::shard`]); for tests of that path at small scale.
    pub fn with_flows_per_process(mut self, flows: u32) -> Agent {
        self.shared.flows_per_process = Some(flows.max(1));
        self
    }

    /// Starts the host's relay, for a `-t xdp` run under the preload
    /// library when none runs, on `setup`'s interface with its key.
    pub fn with_relay(mut self, setup: netgap_workload::preload::RelaySetup) -> Agent {
        self.shared.relay = Some(setup);
        self
    }

    /// Stops session log lines on stderr (used by the in-process agent).
    pub fn quiet(mut self) -> Agent {
        self.quiet = true;
        self
    }

    /// The TCP address the agent listens on.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        match &self.listener {
            Listener::Tcp(l) => l.local_addr(),
            Listener::Unix(_) => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                "the agent listens on a Unix socket",
            )),
        }
    }

    /// Serves sessions until the process ends, each on its own thread.
    pub fn serve(self) -> io::Result<()> {
        let shared = Arc::new(self.shared);
        if !self.quiet {
            spawn_refusal_summaries(Arc::downgrade(&shared));
        }
        loop {
            let (stream, peer) = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if is_transient_accept_error(&e) => {
                    eprintln!("netgap agent: accept failed: {e}; continuing");
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
                Err(e) => return Err(e),
            };
            // A connection that cannot be closed from outside could not be
            // evicted: it gets no place.
            let Ok(closer) = stream.try_clone() else {
                continue;
            };
            let source = stream.peer_ip();
            let slot = shared.unproven.admit(
                source,
                Box::new(move || {
                    let _ = closer.shutdown();
                }),
            );
            let shared = Arc::clone(&shared);
            let quiet = self.quiet;
            let spawned = std::thread::Builder::new()
                .name(format!("session {peer}"))
                .spawn(move || match run_session(stream, &shared, slot) {
                    Ok(()) => {}
                    Err(_) if quiet => {}
                    Err(SessionEnd::Unproven(why)) => {
                        shared.refused(source, &why.to_string());
                    }
                    Err(e) => eprintln!(
                        "netgap agent: session with {peer} ended: {}",
                        escape_control(&e.to_string())
                    ),
                });
            if let Err(e) = spawned {
                eprintln!("netgap agent: cannot start a session thread: {e}");
            }
        }
    }

    /// Serves on a background thread; for the coordinator's in-process agent.
    pub fn spawn(self) -> io::Result<std::thread::JoinHandle<()>> {
        std::thread::Builder::new()
            .name("agent".into())
            .spawn(move || {
                if let Err(e) = self.serve() {
                    eprintln!("netgap agent: stopped: {e}");
                }
            })
    }
}

impl Shared {
    /// Counts a connection refused before it proved itself, and prints the
    /// summary of refusals when one is due.
    fn refused(&self, source: Option<IpAddr>, why: &str) {
        let line = {
            let mut log = self.refusals.lock().unwrap_or_else(PoisonError::into_inner);
            let now = Instant::now();
            log.record(source, why, now);
            log.summary(now)
        };
        if let Some(line) = line {
            eprintln!("netgap agent: {line}");
        }
    }
}

/// Prints the refusals that no later refusal reported, at most once per
/// [`REFUSAL_LOG_INTERVAL`] (the log decides; this thread only asks it
/// every second), for as long as the agent serves.
fn spawn_refusal_summaries(shared: std::sync::Weak<Shared>) {
    let spawned = std::thread::Builder::new()
        .name("refusal log".into())
        .spawn(move || loop {
            std::thread::sleep(Duration::from_secs(1));
            let Some(shared) = shared.upgrade() else {
                return;
            };
            let line = shared
                .refusals
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .summary(Instant::now());
            if let Some(line) = line {
                eprintln!("netgap agent: {line}");
            }
        });
    // Without the thread, refusals are still summarized as they come.
    if let Err(e) = spawned {
        eprintln!("netgap agent: cannot start the refusal log thread: {e}");
    }
}

fn is_transient_accept_error(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EMFILE | libc::ENFILE | libc::ENOBUFS | libc::ENOMEM | libc::ECONNABORTED)
    )
}

/// Why a session ended early.
#[derive(Debug, thiserror::Error)]
enum SessionEnd {
    #[error("{0}")]
    Control(#[from] ControlError),
    #[error("{0}")]
    Refused(String),
    /// Ended before the peer proved the key (or, keyless, said hello).
    #[error("{0}")]
    Unproven(Box<SessionEnd>),
}

/// Releases the busy flag when the session that claimed it and every role
/// thread it started have ended: the next session starts only once nothing
/// of this one runs.
struct BusyClaim(Arc<Shared>);

impl Drop for BusyClaim {
    fn drop(&mut self) {
        self.0.busy.store(false, Ordering::Release);
    }
}

/// The role a session plays in its open point; it owns the point's flow.
enum PointRole {
    /// The server role, run by `run`.
    Server(Box<dyn bench::ServerRole>),
    /// The client role, run and timed by `client_run`.
    Client(Box<dyn bench::ClientRole>),
}

/// The point a session has open: its role, which owns the flow, and for an
/// unreliable flow its monitor with the counters last reported.
struct OpenPoint {
    role: PointRole,
    /// Ends the flow from the watchdog of a repetition that runs past the
    /// agent's longest run; `None` for a flow that cannot be ended from
    /// outside, whose repetitions end at their I/O timeout instead.
    abort: Option<netgap_transport::AbortHandle>,
    monitor: Option<Arc<dyn FlowMonitor>>,
    reported: DatagramStats,
    /// The CPU a client role's repetitions run on (`--pin`), if pinned.
    cpu: Option<u32>,
}

impl OpenPoint {
    /// The flow's datagram counters since the last report, for an
    /// unreliable flow.
    fn datagrams_since_report(&mut self) -> Option<DatagramStats> {
        let now = self.monitor.as_ref()?.datagram_stats();
        let since = now.since(&self.reported);
        self.reported = now;
        Some(since)
    }
}

/// Waits for the next request. While a point over an unreliable flow is
/// open, the peer's retries are answered meanwhile: the server role is idle,
/// but the client may still wait for the last datagram of a repetition.
fn next_request(
    conn: &mut ControlConn,
    point: Option<&OpenPoint>,
    idle: Duration,
) -> Result<Vec<u8>, ControlError> {
    let Some(monitor) = point.and_then(|p| p.monitor.as_ref()) else {
        return conn.recv_or_tell(idle);
    };
    let t0 = Instant::now();
    // A broken flow shows in the next repetition; the wait goes on.
    let _ = monitor.serve_idle(conn.stream().as_fd(), idle);
    let left = idle
        .saturating_sub(t0.elapsed())
        .max(Duration::from_millis(1));
    conn.recv_or_tell(left).map_err(|e| match e {
        ControlError::TimedOut(_) => ControlError::TimedOut(idle),
        other => other,
    })
}

/// The key proof, when the agent has a key, and the first request after it.
fn first_request(
    conn: &mut ControlConn,
    shared: &Shared,
    slot: &crate::admission::Ticket,
) -> Result<Request, SessionEnd> {
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    if let Some(key) = &shared.key {
        crate::auth::challenge(conn, key, deadline, &|| slot.started())
            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
    }
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    let first = conn.recv_or_tell(left)?;
    if is_auth_frame(&first) {
        let message = match shared.key {
            Some(_) => crate::auth::ALREADY_PROVEN.to_string(),
            None => crate::auth::no_key_message(),
        };
        return Err(refuse(conn, message));
    }
    match decode_request(&first) {
        Ok(r) => Ok(r),
        Err(e) => Err(refuse(conn, format!("bad first message: {e}"))),
    }
}

fn run_session(
    stream: ControlStream,
    shared: &Arc<Shared>,
    slot: crate::admission::Ticket,
) -> Result<(), SessionEnd> {
    let local_ip = shared
        .data_ip
        .or(stream.local_ip())
        .unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST));
    let mut conn = ControlConn::new(stream)
        .map_err(|e| SessionEnd::Unproven(Box::new(ControlError::Io(e).into())))?;
    let hello =
        first_request(&mut conn, shared, &slot).map_err(|e| SessionEnd::Unproven(Box::new(e)))?;
    drop(slot);
    let busy = &shared.busy;
    let claimed = matches!(hello, Request::Hello { .. })
        && busy
            .compare_exchange(false, true, Ordering::AcqRel, Ordering::Acquire)
            .is_ok();
    let mut claim = claimed.then(|| Arc::new(BusyClaim(Arc::clone(shared))));
    let mut session = AgentSession::new(netgap_transport::host::collect(Some(local_ip)), !claimed);
    let mut point: Option<OpenPoint> = None;
    // One thread for all of the session's repetitions, started with the
    // first.
    let mut watchdog = watchdog::Watchdog::default();
    // A silent coordinator holds the agent no longer than its longest run.
    let idle = shared
        .limits
        .max_duration
        .clamp(MIN_IDLE_TIMEOUT, IDLE_TIMEOUT);
    let mut open_size_bytes = 0u64;
    // The data token of the point being opened or prepared.
    let mut token: Option<DataToken> = None;
    let mut workload: Option<(Box<dyn ReadyRole>, Stop, Duration)> = None;
    let mut request = hello;
    loop {
        // Limits first: nothing past them reaches a data socket.
        let within = match &request {
            Request::Open { spec, data_token } => {
                open_size_bytes = spec.size_bytes;
                token = Some(data_token.clone());
                // A transport this build lacks is refused when the point
                // opens; until then it commits nothing of its own.
                let flow_bytes =
                    netgap_transport::find(&spec.transport).map_or(0, |t| t.flow_memory_bytes());
                shared.limits.check_point(spec, flow_bytes)
            }
            Request::Run { iterations, .. } | Request::ClientRun { iterations, .. } => {
                shared.limits.check_run(*iterations, open_size_bytes)
            }
            Request::ClientOpen {
                spec,
                data_token,
                target,
                ..
            } => {
                open_size_bytes = spec.size_bytes;
                token = Some(data_token.clone());
                let flow_bytes =
                    netgap_transport::find(&spec.transport).map_or(0, |t| t.flow_memory_bytes());
                shared
                    .limits
                    .check_point(spec, flow_bytes)
                    .and_then(|()| keyless_targets_loopback(shared.key.is_some(), target))
            }
            Request::WorkloadPrepare { spec, data_token } => {
                token = Some(data_token.clone());
                shared
                    .limits
                    .check_workload(spec)
                    .and_then(|()| keyless_stays_on_loopback(shared.key.is_some(), spec))
            }
            _ => Ok(()),
        };
        if let Err(e) = within {
            return Err(refuse(&mut conn, e.to_string()));
        }
        let action = match session.on_request(&request) {
            Ok(a) => a,
            Err(e) => return Err(refuse(&mut conn, e.to_string())),
        };
        match action {
            AgentAction::Reply(r) => conn.send(&r)?,
            AgentAction::ReplyAndClose(r) => {
                // Everything of the session goes before the answer: a
                // coordinator that has read it may start the next session
                // at once and finds the agent free.
                drop(point.take());
                drop(workload.take());
                drop(claim.take());
                conn.send(&r)?;
                return Ok(());
            }
            AgentAction::OpenPoint(spec) => {
                let Some(token) = token.as_ref() else {
                    return Err(refuse(&mut conn, "no data token".into()));
                };
                // The previous point's flow goes first: a transport may
                // hold one flow per interface at a time (xdp binds the
                // interface's queue).
                drop(point.take());
                let opened = open_point(
                    &mut conn,
                    &mut session,
                    &spec,
                    (local_ip, token),
                    &shared.rate,
                );
                match opened {
                    Ok(p) => point = Some(p),
                    Err(e) => return Err(refuse(&mut conn, e.to_string())),
                }
            }
            AgentAction::OpenClient {
                spec,
                target,
                client_cpu,
            } => {
                let Some(token) = token.as_ref() else {
                    return Err(refuse(&mut conn, "no data token".into()));
                };
                drop(point.take());
                match open_client(&spec, &target, token, &shared.rate) {
                    Ok((mut p, choices)) => {
                        p.cpu = client_cpu;
                        let reply = session
                            .client_connected(choices)
                            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                        conn.send(&reply)?;
                        point = Some(p);
                    }
                    // Nothing of the point is open: the session stays
                    // usable, as after a listener that could not open.
                    Err(e) => conn.send(&session.failed(&e.to_string()))?,
                }
            }
            AgentAction::RunClient { iterations, .. } => {
                let Some(p) = point.as_mut() else {
                    return Err(refuse(&mut conn, "no point is open".into()));
                };
                let PointRole::Client(role) = &mut p.role else {
                    return Err(refuse(
                        &mut conn,
                        "this point's role is the server's".into(),
                    ));
                };
                let limit = shared.limits.max_duration + REPETITION_GRACE;
                if let Some(abort) = &p.abort {
                    watchdog.arm(abort.clone(), limit);
                }
                let cpu = p.cpu;
                let ran = alive_while(&mut conn, &session, || {
                    if let Some(cpu) = cpu {
                        netgap_transport::affinity::pin_current_thread(cpu)
                            .map_err(|e| format!("client placement: {e}"))?;
                    }
                    // The role's own thread meters it: the meter reads the
                    // CPU clock of the thread that starts it.
                    let meter = CpuMeter::start();
                    let mut hist = netgap_core::stats::LatencyHistogram::new();
                    role.run(iterations, &mut hist)
                        .map(|out| (out, meter.stop(out.helper_cpu_ns), hist))
                        .map_err(|e| e.to_string())
                })?;
                if watchdog.disarm() {
                    return Err(refuse(&mut conn, past_longest_run(shared)));
                }
                match ran {
                    Ok((out, cpu, hist)) => {
                        let rep = netgap_proto::message::ClientRep {
                            elapsed_ns: out.elapsed_ns,
                            value: out.value,
                            bytes_tx: out.bytes_tx,
                            bytes_rx: out.bytes_rx,
                            cpu,
                            datagrams: p.datagrams_since_report(),
                        };
                        let replies = session
                            .client_done(rep, hist.buckets())
                            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                        for r in &replies {
                            conn.send(r)?;
                        }
                    }
                    Err(e) => {
                        return Err(refuse(&mut conn, format!("client role failed: {e}")));
                    }
                }
            }
            AgentAction::RunRole { iterations, .. } => {
                let Some(p) = point.as_mut() else {
                    return Err(refuse(&mut conn, "no point is open".into()));
                };
                let PointRole::Server(role) = &mut p.role else {
                    return Err(refuse(
                        &mut conn,
                        "this point's role is the client's".into(),
                    ));
                };
                let meter = CpuMeter::start();
                let limit = shared.limits.max_duration + REPETITION_GRACE;
                if let Some(abort) = &p.abort {
                    watchdog.arm(abort.clone(), limit);
                }
                let ran = role.run(iterations);
                if watchdog.disarm() {
                    return Err(refuse(&mut conn, past_longest_run(shared)));
                }
                match ran {
                    Ok(out) => {
                        let cpu = meter.stop(out.helper_cpu_ns);
                        let datagrams = p.datagrams_since_report();
                        let reply = session
                            .role_done(out.bytes_rx, out.bytes_tx, cpu, datagrams)
                            .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                        conn.send(&reply)?;
                    }
                    Err(e) => {
                        return Err(refuse(&mut conn, format!("server role failed: {e}")));
                    }
                }
            }
            AgentAction::PrepareWorkload(spec) => {
                // A role of its own: a failing flow engine sets it too.
                let stop = Stop::new();
                let Some(token) = token.as_ref() else {
                    return Err(refuse(&mut conn, "no data token".into()));
                };
                let ctx = RoleContext {
                    spec: &spec,
                    control_ip: local_ip,
                    limits: &shared.limits,
                    stop: &stop,
                    data_token: token,
                    services: shared.services,
                    flows_per_process: shared.flows_per_process,
                    dirs: &shared.dirs,
                    rate: &shared.rate,
                    relay: shared.relay.as_ref(),
                };
                workload = prepare_workload(&mut conn, &mut session, ctx)?
                    .map(|role| (role, stop, role_deadline(&spec)));
            }
            AgentAction::RunWorkload => {
                let outcome = match workload.take() {
                    Some(g) => run_workload(&mut conn, &session, g, claim.clone())?,
                    None => Err(RoleError::NotPrepared),
                };
                let replies = match outcome {
                    Ok(r) => session
                        .workload_finished(r.flows, r.buckets, r.outcome)
                        .map_err(|e| SessionEnd::Refused(e.to_string()))?,
                    Err(msg) => vec![session.failed(&format!("workload role failed: {msg}"))],
                };
                for r in &replies {
                    conn.send(r)?;
                }
            }
            AgentAction::ClosePoint => {
                point = None;
                let reply = session
                    .closed()
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                conn.send(&reply)?;
            }
        }
        let payload = next_request(&mut conn, point.as_ref(), idle)?;
        request = match decode_request(&payload) {
            Ok(r) => r,
            Err(e) => return Err(refuse(&mut conn, format!("bad message: {e}"))),
        };
    }
}

/// The refusal of a repetition the watchdog ended.
fn past_longest_run(shared: &Shared) -> String {
    format!(
        "refused by the agent's limits: the repetition ran past its longest run ({}); ask for fewer iterations or a shorter --rep-time",
        humantime::format_duration(shared.limits.max_duration)
    )
}

/// Prepares a workload role with the workload the point names: a server
/// listens, announces its addresses and accepts every flow; a client
/// connects its flows. A failure is answered with an error reply and leaves
/// the session usable; only a broken control connection ends it.
fn prepare_workload(
    conn: &mut ControlConn,
    session: &mut AgentSession,
    ctx: RoleContext<'_>,
) -> Result<Option<Box<dyn ReadyRole>>, SessionEnd> {
    let prepared = match alive_while(conn, session, || role::open(ctx))? {
        Ok(open) => {
            if ctx.spec.role == WorkloadRole::Server {
                let reply = session
                    .workload_listening(open.addrs())
                    .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                conn.send(&reply)?;
            }
            alive_while(conn, session, move || open.ready())?
        }
        Err(e) => Err(e),
    };
    match prepared {
        Ok(p) => {
            let reply = session
                .workload_ready()
                .map_err(|e| SessionEnd::Refused(e.to_string()))?;
            conn.send(&reply)?;
            Ok(Some(p))
        }
        Err(e) => {
            conn.send(&session.failed(&e.to_string()))?;
            Ok(None)
        }
    }
}

/// Runs `work` (a step of preparing a workload role: opening listeners,
/// connecting thousands of flows) on its own thread while this one tells the
/// coordinator every [`netgap_proto::message::WORKLOAD_ALIVE_INTERVAL`] that the
/// agent is alive, so a slow setup is told apart from a silent host.
fn alive_while<T: Send>(
    conn: &mut ControlConn,
    session: &AgentSession,
    work: impl FnOnce() -> T + Send,
) -> Result<T, SessionEnd> {
    use netgap_proto::message::WORKLOAD_ALIVE_INTERVAL;
    use std::sync::mpsc;
    std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel();
        scope.spawn(move || {
            let _ = tx.send(work());
        });
        loop {
            match rx.recv_timeout(WORKLOAD_ALIVE_INTERVAL) {
                Ok(result) => return Ok(result),
                Err(mpsc::RecvTimeoutError::Timeout) => {
                    let alive = session
                        .workload_alive()
                        .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                    conn.send(&alive)?;
                }
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    return Err(SessionEnd::Refused(
                        "preparing the workload role panicked".into(),
                    ))
                }
            }
        }
    })
}

/// How long past its warm-up and window a workload role may run before the
/// agent stops it: its receivers' drain (the I/O timeout) and a grace.
fn role_deadline(spec: &netgap_proto::workload::WorkloadSpec) -> Duration {
    let (warmup, window) = role::window(spec);
    let drain = Duration::from_millis(u64::from(spec.point.io_timeout_ms));
    warmup + window + drain + ROLE_GRACE
}

/// Time a role may take past its window and drain (closing its flows,
/// gathering reports) before the agent stops it.
const ROLE_GRACE: Duration = Duration::from_secs(2);

/// How long past the agent's `--max-duration` a point-to-point repetition
/// may run before its flow is shut down.
const REPETITION_GRACE: Duration = Duration::from_millis(500);

/// Sets a role's stop signal when dropped: whichever way [`run_workload`]
/// returns (the role done, the coordinator gone, the control connection
/// broken), nothing of the role keeps running.
struct StopOnDrop(Stop);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.set();
    }
}

/// Whether the peer of `conn` has closed it (or it broke), without
/// consuming anything it sent.
fn peer_gone(conn: &ControlConn) -> bool {
    use std::os::fd::AsRawFd;
    let mut byte = 0u8;
    // SAFETY: the fd is the open control socket, borrowed for the call;
    // the buffer is one writable byte that outlives it.
    let n = unsafe {
        libc::recv(
            conn.stream().as_fd().as_raw_fd(),
            std::ptr::from_mut(&mut byte).cast(),
            1,
            libc::MSG_PEEK | libc::MSG_DONTWAIT,
        )
    };
    match n {
        0 => true,
        n if n > 0 => false,
        _ => !matches!(
            io::Error::last_os_error().kind(),
            io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted
        ),
    }
}

/// Runs a prepared workload role on its own thread, telling the coordinator
/// every [`WORKLOAD_ALIVE_INTERVAL`] that this agent is still alive. The role
/// stops when the coordinator goes away or when it overruns its deadline;
/// its thread holds the busy claim until its flows are gone.
fn run_workload(
    conn: &mut ControlConn,
    session: &AgentSession,
    (role, stop, deadline): (Box<dyn ReadyRole>, Stop, Duration),
    claim: Option<Arc<BusyClaim>>,
) -> Result<Result<RoleResult, RoleError>, SessionEnd> {
    use netgap_proto::message::WORKLOAD_ALIVE_INTERVAL;
    use std::sync::mpsc;
    let _stop_on_return = StopOnDrop(stop.clone());
    let (tx, rx) = mpsc::channel();
    let spawned = std::thread::Builder::new()
        .name("workload role".into())
        .spawn(move || {
            let _claim = claim;
            let _ = tx.send(role.run());
        });
    let thread = match spawned {
        Ok(t) => t,
        Err(e) => {
            return Ok(Err(RoleError::Thread {
                what: "the workload role",
                source: e,
            }))
        }
    };
    let t0 = Instant::now();
    let mut next_alive = t0 + WORKLOAD_ALIVE_INTERVAL;
    loop {
        match rx.recv_timeout(role::STOP_TICK) {
            Ok(result) => {
                // The thread ends right after its result, releasing its
                // claim: the role is wholly gone before it is reported.
                let _ = thread.join();
                return Ok(result);
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if peer_gone(conn) {
                    return Err(ControlError::Closed.into());
                }
                if t0.elapsed() > deadline {
                    // Past its window and drain: the role waits on a silent
                    // peer; it ends at its next message or I/O timeout.
                    stop.set();
                }
                if Instant::now() >= next_alive {
                    next_alive += WORKLOAD_ALIVE_INTERVAL;
                    let alive = session
                        .workload_alive()
                        .map_err(|e| SessionEnd::Refused(e.to_string()))?;
                    conn.send(&alive)?;
                }
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                return Ok(Err(RoleError::Panicked {
                    what: "the workload role".into(),
                }))
            }
        }
    }
}

/// Sends a last error reply (best effort) and ends the session.
fn refuse(conn: &mut ControlConn, message: String) -> SessionEnd {
    let _ = conn.send(&Reply::Error {
        message: message.clone(),
    });
    SessionEnd::Refused(message)
}

/// Why the agent could not open a point; sent to the coordinator as one
/// line.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenPointError {
    /// The agent does not have the test.
    #[error("unknown test {0:?} (this agent has: {known})", known = bench::names())]
    UnknownTest(String),
    /// The agent does not have the transport.
    #[error("unknown transport {0:?} (this agent has: {known})", known = transport::names())]
    UnknownTransport(String),
    /// The transport does not work on the agent's host.
    #[error("transport {name} is not available on the agent: {why}")]
    Unavailable {
        /// The transport.
        name: String,
        /// Why not.
        why: transport::Unavailable,
    },
    /// The server role could not be pinned.
    #[error(transparent)]
    Pin(#[from] netgap_transport::affinity::PinError),
    /// The message size does not fit in the agent's memory.
    #[error("size {0} bytes does not fit in memory")]
    TooLarge(u64),
    /// The message buffers cannot be placed as the point asks on this host.
    #[error("message buffers: {0}")]
    Buffer(#[from] netgap_transport::buffer::LayoutError),
    /// The size exceeds what the transport carries in one message.
    #[error("{size} bytes is larger than the largest {transport} message, {max} bytes")]
    TooLargeFor {
        /// The size asked for.
        size: u64,
        /// The transport.
        transport: String,
        /// Its largest message.
        max: u64,
    },
    /// Listening or accepting the flow failed.
    #[error(transparent)]
    Transport(#[from] transport::TransportError),
    /// The session refused the step.
    #[error(transparent)]
    Session(#[from] netgap_proto::session::SessionError),
    /// No data connection proved it belongs to the session.
    #[error("data connection: {0}")]
    Preamble(#[from] netgap_transport::preamble::PreambleError),
    /// The control connection failed.
    #[error(transparent)]
    Control(#[from] ControlError),
    /// The test's server role could not be set up on the flow.
    #[error("{test} setup failed: {source}")]
    Setup {
        /// The test.
        test: String,
        /// Why.
        source: transport::FlowError,
    },
}

/// Accepts the point's flow: the first connection that proves the point's
/// token within [`ACCEPT_TIMEOUT`]; a stranger's connection is dropped and
/// the wait goes on.
fn accept_proven(
    listener: &mut dyn transport::Listener,
    token: &DataToken,
) -> Result<Box<dyn transport::Flow>, OpenPointError> {
    let deadline = Instant::now() + ACCEPT_TIMEOUT;
    // Why the last connection was dropped: when no other comes, that says
    // more than the wait that ran out.
    let mut dropped: Option<netgap_transport::preamble::PreambleError> = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut flow = match listener.accept(left.max(Duration::from_millis(1))) {
            Ok(f) => f,
            Err(e) => {
                return Err(match dropped {
                    Some(p) => p.into(),
                    None => e.into(),
                })
            }
        };
        match netgap_transport::preamble::listener(flow.as_mut(), token) {
            Ok(()) => return Ok(flow),
            Err(e) if Instant::now() >= deadline => return Err(e.into()),
            Err(e) => dropped = Some(e),
        }
    }
}

/// Refuses, on an agent without a key, a role that would listen or send
/// beyond loopback: anyone on the host can drive such an agent, so its
/// data stays on the host.
fn keyless_stays_on_loopback(
    keyed: bool,
    spec: &netgap_proto::workload::WorkloadSpec,
) -> Result<(), netgap_proto::limits::LimitError> {
    if keyed {
        return Ok(());
    }
    let targets = spec
        .targets
        .iter()
        .filter_map(|t| t.parse::<std::net::SocketAddr>().ok().map(|a| a.ip()));
    let ips = spec.listen_ips.iter().chain(&spec.bind_ips).copied();
    // A staged role connects to the addresses of the roles before it
    // (`workload::place::Staged`), in its parameters.
    let staged = spec
        .params
        .get("staged")
        .and_then(|s| s.get("peers"))
        .and_then(serde_json::Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_array)
        .flatten()
        .filter_map(|a| a.as_str()?.parse::<std::net::SocketAddr>().ok())
        .map(|a| a.ip());
    match targets
        .chain(ips)
        .chain(staged)
        .find(|ip| !ip.is_loopback())
    {
        Some(ip) => Err(netgap_proto::limits::LimitError(format!(
            "{ip} is not a loopback address; an agent without --key keeps its data on loopback"
        ))),
        None => Ok(()),
    }
}

/// Refuses, on an agent without a key, a client role whose server is
/// beyond loopback, as [`keyless_stays_on_loopback`] does a workload's.
fn keyless_targets_loopback(
    keyed: bool,
    target: &str,
) -> Result<(), netgap_proto::limits::LimitError> {
    match target.parse::<SocketAddr>() {
        Ok(a) if !keyed && !a.ip().is_loopback() => Err(netgap_proto::limits::LimitError(format!(
            "{} is not a loopback address; an agent without --key keeps its data on loopback",
            a.ip()
        ))),
        _ => Ok(()),
    }
}

/// The test, transport and message buffers of `spec`, checked against
/// this host: what either role of a point needs before a socket opens.
fn point_parts(
    spec: &PointSpec,
) -> Result<
    (
        &'static dyn bench::Test,
        &'static dyn transport::Transport,
        bench::RoleParams,
    ),
    OpenPointError,
> {
    let test =
        bench::find(&spec.test).ok_or_else(|| OpenPointError::UnknownTest(spec.test.clone()))?;
    let transport = transport::find(&spec.transport)
        .ok_or_else(|| OpenPointError::UnknownTransport(spec.transport.clone()))?;
    transport
        .availability()
        .map_err(|why| OpenPointError::Unavailable {
            name: spec.transport.clone(),
            why,
        })?;
    let size =
        usize::try_from(spec.size_bytes).map_err(|_| OpenPointError::TooLarge(spec.size_bytes))?;
    let buffer = netgap_transport::buffer::BufferLayout::of_options(&spec.options)?;
    if let Some(max) = transport
        .max_message_bytes()
        .filter(|&m| spec.size_bytes > m)
    {
        return Err(OpenPointError::TooLargeFor {
            size: spec.size_bytes,
            transport: spec.transport.clone(),
            max,
        });
    }
    let params = bench::RoleParams {
        size_bytes: size,
        verify: spec.verify,
        buffer,
    };
    Ok((test, transport, params))
}

/// Connects the client role's flow of `spec` to the server role another
/// agent opened at `target`, proves `token` over it and sets the test's
/// client role up, paced by the agent's `rate`: the open point and the
/// transport's choices of its data path. Errors are one line for the
/// coordinator.
fn open_client(
    spec: &PointSpec,
    target: &str,
    token: &DataToken,
    rate: &Arc<RateBudget>,
) -> Result<(OpenPoint, Vec<String>), OpenPointError> {
    let (test, transport, params) = point_parts(spec)?;
    let config = FlowConfig::from_spec(spec);
    let mut flow = transport.connect(&config, target)?;
    // Whatever address the coordinator named, no payload goes there
    // unless it proves it is this point's server.
    netgap_transport::preamble::connector(flow.as_mut(), token)?;
    let choices: Vec<String> = flow
        .path_choices()
        .into_iter()
        .take(netgap_proto::message::MAX_PATH_CHOICES)
        .collect();
    let flow = paced(flow, rate, transport);
    let point = open_role(spec, flow, |flow| {
        test.client(params, flow).map(PointRole::Client)
    })?;
    Ok((point, choices))
}

/// `flow`, with every byte the role moves counted against the agent's
/// `rate` (--max-rate).
fn paced(
    flow: Box<dyn transport::Flow>,
    rate: &Arc<RateBudget>,
    transport: &dyn transport::Transport,
) -> Box<dyn transport::Flow> {
    Box::new(PacedFlow::new(
        flow,
        Arc::clone(rate),
        transport.capabilities().message_boundaries,
    ))
}

/// Sets `spec`'s role up over `flow` with `open`: the open point, with
/// the flow's monitor, its abort handle and its datagram counts so far.
fn open_role(
    spec: &PointSpec,
    flow: Box<dyn transport::Flow>,
    open: impl FnOnce(Box<dyn transport::Flow>) -> Result<PointRole, transport::FlowError>,
) -> Result<OpenPoint, OpenPointError> {
    let monitor = flow.monitor();
    let abort = netgap_transport::abort_handle(flow.as_ref());
    let role = open(flow).map_err(|source| OpenPointError::Setup {
        test: spec.test.clone(),
        source,
    })?;
    let reported = monitor
        .as_ref()
        .map(|m| m.datagram_stats())
        .unwrap_or_default();
    Ok(OpenPoint {
        role,
        abort,
        monitor,
        reported,
        cpu: None,
    })
}

/// Opens the data listener for `spec`, tells the coordinator where it is,
/// accepts the flow and runs the server role's setup over it, paced by the
/// agent's `rate`. Errors are one line for the coordinator.
fn open_point(
    conn: &mut ControlConn,
    session: &mut AgentSession,
    spec: &PointSpec,
    (local_ip, token): (IpAddr, &DataToken),
    rate: &Arc<RateBudget>,
) -> Result<OpenPoint, OpenPointError> {
    let (test, transport, params) = point_parts(spec)?;
    if let Some(cpu) = spec.server_cpu {
        netgap_transport::affinity::pin_current_thread(cpu)?;
    }
    let config = FlowConfig::from_spec(spec);
    let mut listener = transport.listen(&config, local_ip)?;
    let reply = session.listening(listener.addr())?;
    conn.send(&reply)?;
    let flow = accept_proven(listener.as_mut(), token)?;
    drop(listener);
    let flow = paced(flow, rate, transport);
    let reply = session.accepted()?;
    conn.send(&reply)?;
    open_role(spec, flow, |flow| {
        test.server(params, flow).map(PointRole::Server)
    })
}
