//! The coordinator: the process the user runs. It connects to an agent (or
//! starts one in-process on loopback), opens each point of a [`Plan`], drives
//! the runner, turns each measurement into a [`ResultRecord`] and hands it to
//! the sinks the moment it is measured. The client role runs in this
//! process beside one agent (the in-process one, or `--peer`), or, over
//! `--hosts` ([`Peer::Agents`]: a testbed's hosts, a launcher's nodes, a
//! list of agents), on the second host's agent through the workload
//! coordinator's sessions (`workload_run::point_to_point`), this process
//! only coordinating.

use crate::agent::Agent;
use crate::bench::{self, ClientRole, Metric, RepOutcome, RoleParams};
use crate::cluster::TestbedPath;
use crate::conditions::LinkConditions;
use crate::control::{control_detail, ControlAddr, ControlConn, ControlError};
use crate::handshake::{handshake, LinkError};
use crate::plan::{Peer, Plan};
use crate::point_loop::{run_points, SinkError};
use crate::runner::{self, PeerControl, PointMeasurement, RunError, ServerRep};
use crate::sink::RecordSink;
use crate::workload_run::coordinator::{WorkloadCoordinator, WorkloadError};
use netgap_core::cpu::CpuUsage;
use netgap_core::diagnose::diagnose;
use netgap_core::host::HostFacts;
use netgap_core::record::{
    rfc3339, ByteCounts, CpuPair, DatagramCounts, RecordHead, RecordStats, ResultRecord,
    ServiceDemand,
};
use netgap_core::spec::PointSpec;
use netgap_core::stack::{PathIdentity, Stack};
use netgap_core::stats::{LatencyHistogram, Summary};
use netgap_proto::auth::Key;
use netgap_proto::codec::{decode_reply, CodecError};
use netgap_proto::message::{Phase, Reply};
use netgap_proto::session::{CoordinatorSession, SessionError};
use netgap_transport::{self as transport, DatagramStats, FlowConfig, FlowError, FlowMonitor};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// How long a failed point waits for the agent's reason.
const AGENT_REASON_WAIT: Duration = Duration::from_millis(300);
/// How long the coordinator looks for the agent's reason after the data
/// flow went silent (a reason already sent is there at once).
const SILENT_REASON_WAIT: Duration = Duration::from_millis(20);
/// How long the agent may take to answer a request that does no data work.
const REPLY_TIMEOUT: Duration = Duration::from_secs(5);
/// How long after the client's end of a repetition the agent's answer may
/// come beyond `--timeout`.
const DONE_GRACE: Duration = Duration::from_millis(250);

/// Why a run failed.
#[derive(Debug, thiserror::Error)]
pub enum CoordError {
    /// No agent could be reached.
    /// The agent could not be reached, or the handshake with it failed.
    #[error("agent at {addr}: {source}")]
    Link {
        /// The agent's address.
        addr: ControlAddr,
        /// What went wrong.
        source: LinkError,
    },
    /// A point failed.
    #[error("{test} over {transport} ({mode}), {size} bytes: {source}")]
    Point {
        /// Test name.
        test: String,
        /// Transport name.
        transport: String,
        /// Mode.
        mode: String,
        /// Message size in bytes.
        size: u64,
        /// What went wrong.
        source: Box<PointError>,
    },
    /// A results file could not be written.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The in-process agent could not listen.
    #[error("cannot start the in-process agent: {0}")]
    EmbeddedBind(#[source] crate::agent::BindError),
    /// The in-process agent's address or thread could not be had.
    #[error("cannot start the in-process agent: {0}")]
    EmbeddedIo(#[source] std::io::Error),
    /// This thread, which plays the client role, could not be pinned to
    /// the client's CPU.
    #[error("cannot start the in-process agent: client placement: {0}")]
    ClientPlacement(#[source] netgap_transport::affinity::PinError),
    /// The key file is unusable.
    #[error("{0}")]
    Key(#[from] crate::auth::KeyFileError),
    /// A run with conditions on a testbed whose hosts file records none of
    /// its links' state.
    #[error("conditions: the testbed records no link conditions")]
    NoTestbedConditions,
    /// A run with conditions and no switch to set them through.
    #[error("conditions: this run has conditions but nothing to switch them with")]
    NoSwitch,
    /// The links could not be put under a condition.
    #[error("conditions: switching to {to}: {source}")]
    Switch {
        /// The condition asked for.
        to: LinkConditions,
        /// What the switch said.
        source: crate::conditions::SwitchFailure,
    },
    /// The links could not be put back as they were.
    #[error("conditions: putting the links back: {0}")]
    Restore(#[source] crate::conditions::SwitchFailure),
    /// A point measured under a condition gave no record.
    #[error("conditions: no record measured")]
    NoRecord,
    /// The agents of a point-to-point run's two hosts could not be reached.
    #[error(transparent)]
    Agents(Box<WorkloadError>),
}

/// Why one point could not be measured.
#[derive(Debug, thiserror::Error)]
pub enum PointError {
    /// The plan names a test this build does not have.
    #[error("unknown test {0:?}")]
    UnknownTest(String),
    /// The plan names a transport this build does not have.
    #[error("unknown transport {0:?}")]
    UnknownTransport(String),
    /// The message size does not fit in this host's memory.
    #[error("a message of {0} bytes does not fit in memory")]
    TooLarge(u64),
    /// The message buffers cannot be placed as `--align`/`--offset` ask.
    #[error("message buffers: {0}")]
    Buffer(#[from] netgap_transport::buffer::LayoutError),
    /// The control connection failed.
    #[error("{}", control_detail(.0))]
    Control(#[from] ControlError),
    /// The agent's answer does not decode.
    #[error("bad reply from agent: {0}")]
    BadReply(#[from] CodecError),
    /// The agent's answer is out of order or out of range.
    #[error(transparent)]
    Session(#[from] SessionError),
    /// The data flow could not be connected.
    #[error(transparent)]
    Connect(#[from] transport::TransportError),
    /// The test's client role could not be set up on the flow.
    #[error("setup: {0}")]
    Setup(#[source] FlowError),
    /// The data connection's far end did not prove it belongs to the
    /// session, or no token could be drawn.
    #[error("data connection: {0}")]
    Preamble(#[from] netgap_transport::preamble::PreambleError),
    /// The agent refused or failed, in its own words.
    #[error("agent error: {0}")]
    Agent(String),
    /// A repetition failed.
    #[error(transparent)]
    Run(#[from] RunError),
    /// The repetitions could not be summarized.
    #[error(transparent)]
    Stats(#[from] netgap_core::stats::StatsError),
    /// A host whose agent played one of the point's roles failed, died or
    /// went silent, or the point could not be placed on them.
    #[error(transparent)]
    Placed(Box<WorkloadError>),
}

pub use crate::point_loop::Observer;

impl CoordError {
    /// The failure of point `spec`, shown under the name `test` (a sweep or
    /// LogP names its own command).
    pub fn point(spec: &PointSpec, test: &str, source: PointError) -> CoordError {
        CoordError::Point {
            test: test.to_string(),
            transport: spec.transport.clone(),
            mode: spec.mode.to_string(),
            size: spec.size_bytes,
            source: Box::new(source),
        }
    }
}

/// The control sessions of a point-to-point run: with the agent that
/// serves while this process plays the client, or with the two agents that
/// play both roles.
pub struct Coordinator {
    ends: Ends,
    /// Facts of the client's host.
    local_host: HostFacts,
    /// Facts of the server's host.
    peer_host: HostFacts,
}

/// Where a point's roles run.
enum Ends {
    /// The client role here, the server role on the agent of `conn`.
    Here {
        conn: ControlConn,
        session: CoordinatorSession,
        /// The agent's IP address, for data addresses it reports
        /// unspecified.
        agent_ip: IpAddr,
    },
    /// Both roles on agents, the server's host first; the client role on
    /// CPU `client_cpu` of its host, when pinned.
    Agents {
        agents: Box<WorkloadCoordinator>,
        client_cpu: Option<u32>,
    },
}

impl Coordinator {
    /// Connects to the agent at `addr`, proves `key` if given (see
    /// [`crate::auth::prove`]) and shakes hands.
    pub fn connect(addr: &ControlAddr, key: Option<&Key>) -> Result<Coordinator, CoordError> {
        let link = handshake(addr, key).map_err(|source| CoordError::Link {
            addr: addr.clone(),
            source,
        })?;
        Ok(Coordinator {
            ends: Ends::Here {
                conn: link.conn,
                session: link.session,
                agent_ip: link.agent_ip.unwrap_or(IpAddr::V4(Ipv4Addr::LOCALHOST)),
            },
            local_host: netgap_transport::host::collect(link.local_ip),
            peer_host: link.peer_host,
        })
    }

    /// Connects to the agents of `hosts` (the server's host first, then the
    /// client's), proving `key` to each when given: a run whose two roles
    /// both run on agents, the client role on CPU `client_cpu` of its host
    /// when given. `io_timeout_ms` bounds the wait for a launcher's agents
    /// that are still starting when `hosts` sets no wait of its own.
    pub fn connect_agents(
        hosts: &crate::cluster::HostsSource,
        key: Option<&Key>,
        client_cpu: Option<u32>,
        io_timeout_ms: u32,
    ) -> Result<Coordinator, CoordError> {
        let agents = crate::workload_run::coordinator::open_hosts(hosts, key, io_timeout_ms)
            .map_err(|e| CoordError::Agents(Box::new(e)))?;
        let (local_host, peer_host) = agents
            .pair_facts()
            .map_err(|e| CoordError::Agents(Box::new(e)))?;
        Ok(Coordinator {
            ends: Ends::Agents {
                agents: Box::new(agents),
                client_cpu,
            },
            local_host,
            peer_host,
        })
    }

    /// Facts of the server's host, from its agent's handshake.
    pub fn peer_host(&self) -> &HostFacts {
        &self.peer_host
    }

    /// Facts of the client's host: this host, or the agent's that plays
    /// the client role.
    pub fn local_host(&self) -> &HostFacts {
        &self.local_host
    }

    /// Measures one point; `on_rep` is called after each measured repetition.
    pub fn measure(
        &mut self,
        spec: &PointSpec,
        method: &runner::Method,
        on_rep: &mut dyn FnMut(u32),
    ) -> Result<PointMeasurement, PointError> {
        match &mut self.ends {
            Ends::Here {
                conn,
                session,
                agent_ip,
            } => measure_here(conn, session, *agent_ip, spec, method, on_rep),
            Ends::Agents { agents, client_cpu } => agents
                .measure_pair(spec, method, *client_cpu, on_rep)
                .map_err(|e| PointError::Placed(Box::new(e))),
        }
    }

    /// Measures one point of `plan` and builds its record; `on_rep` is
    /// called after each measured repetition.
    pub fn measure_record(
        &mut self,
        spec: &PointSpec,
        plan: &Plan,
        on_rep: &mut dyn FnMut(u32),
    ) -> Result<(PointMeasurement, ResultRecord), PointError> {
        let started = SystemTime::now();
        let m = self.measure(spec, &plan.settings.method, on_rep)?;
        let record = build_record(
            spec,
            &m,
            plan,
            &self.local_host,
            &self.peer_host,
            started,
            None,
        )?;
        Ok((m, record))
    }

    /// Ends the session politely and waits, up to two seconds, for the
    /// agent's answer, which it sends once nothing of the session runs: a
    /// run started right after finds the agent free.
    pub fn bye(self) {
        match self.ends {
            Ends::Here {
                mut conn,
                mut session,
                ..
            } => {
                let bye = session.bye();
                let _ = conn.send(&bye);
                let _ = recv_reply(&mut conn, Duration::from_secs(2));
            }
            Ends::Agents { agents, .. } => agents.bye(),
        }
    }
}

/// Measures one point with the client role in this process and the
/// server role on the agent of `conn`.
fn measure_here(
    conn: &mut ControlConn,
    session: &mut CoordinatorSession,
    agent_ip: IpAddr,
    spec: &PointSpec,
    method: &runner::Method,
    on_rep: &mut dyn FnMut(u32),
) -> Result<PointMeasurement, PointError> {
    let test = bench::find(&spec.test).ok_or_else(|| PointError::UnknownTest(spec.test.clone()))?;
    let transport = transport::find(&spec.transport)
        .ok_or_else(|| PointError::UnknownTransport(spec.transport.clone()))?;
    let size =
        usize::try_from(spec.size_bytes).map_err(|_| PointError::TooLarge(spec.size_bytes))?;
    let buffer = netgap_transport::buffer::BufferLayout::of_options(&spec.options)?;
    let token = netgap_transport::preamble::new_token()?;
    let open = session.open(spec.clone(), token.clone());
    conn.send(&open)?;
    let reply = recv_reply(conn, REPLY_TIMEOUT)?;
    let data_addr = session.on_listening(reply)?;
    let data_addr = fix_unspecified(&data_addr, agent_ip);
    let config = FlowConfig::from_spec(spec);
    let mut flow = transport.connect(&config, &data_addr)?;
    // Whatever address the agent named, no payload goes there unless
    // it proves it is this session's end.
    netgap_transport::preamble::connector(flow.as_mut(), &token)?;
    let monitor = flow.monitor();
    // The agent answers once the proof's last message has reached it. A
    // flow whose own end resends what is lost (xdp) must be served
    // meanwhile, or a lost confirmation is never sent again.
    let mut wait = REPLY_TIMEOUT;
    if let Some(m) = &monitor {
        let t0 = Instant::now();
        let _ = m.serve_idle(conn.stream().as_fd(), wait);
        wait = wait
            .saturating_sub(t0.elapsed())
            .max(Duration::from_millis(1));
    }
    let reply = recv_reply(conn, wait)?;
    session.on_accepted(reply)?;
    let path_choices = flow.path_choices();
    let role = test
        .client(
            RoleParams {
                size_bytes: size,
                verify: spec.verify,
                buffer,
            },
            flow,
        )
        .map_err(PointError::Setup)?;
    let mut role: Box<dyn ClientRole> = match &monitor {
        Some(m) => Box::new(MonitoredRole {
            role,
            monitor: Arc::clone(m),
        }),
        None => role,
    };
    // The agent answers as soon as its end of the repetition is over,
    // which follows the client's end by the time its queued bytes take
    // to arrive: a short grace, so a stopped agent is named within
    // --timeout of the last byte that moved.
    let done_timeout = config.io_timeout + DONE_GRACE;
    let mut peer = AgentControl {
        conn,
        session,
        done_timeout,
        monitor,
    };
    let measured = runner::measure_point(role.as_mut(), &mut peer, method, on_rep);
    let mut m = match measured {
        Ok(m) => m,
        Err(e) => {
            // When the agent refused a repetition (a limit, a failed
            // role), the data flow breaks too; the agent's reason, sent
            // just before, says more than the broken flow.
            let silent = matches!(
                &e,
                runner::RunError::Flow(netgap_transport::FlowError::TimedOut { .. })
                    | runner::RunError::PeerSilent(_)
            );
            // A silent data flow mostly means a silent agent: no
            // reason will come, and a long wait for one would only
            // delay the error. But an agent that ended the point
            // itself (its --max-duration) may have said so while its
            // stopped role left the flow to stall: a glance at the
            // control connection names that cause instead.
            let wait = if silent {
                SILENT_REASON_WAIT
            } else {
                AGENT_REASON_WAIT
            };
            if let Ok(payload) = conn.recv_payload(wait) {
                if let Ok(Reply::Error { message }) = decode_reply(&payload) {
                    return Err(PointError::Agent(message));
                }
            }
            return Err(e.into());
        }
    };
    drop(role);
    let close = session.close();
    conn.send(&close)?;
    let reply = recv_reply(conn, REPLY_TIMEOUT)?;
    session.on_closed(reply)?;
    m.path_choices = path_choices;
    Ok(m)
}

/// An agent bound to 0.0.0.0 or :: reports that address; connect to the
/// address the control connection used instead.
fn fix_unspecified(addr: &str, agent_ip: IpAddr) -> String {
    match addr.parse::<SocketAddr>() {
        Ok(sa) if sa.ip().is_unspecified() => SocketAddr::new(agent_ip, sa.port()).to_string(),
        _ => addr.to_string(),
    }
}

fn recv_reply(conn: &mut ControlConn, timeout: Duration) -> Result<Reply, PointError> {
    let payload = conn.recv_payload(timeout)?;
    Ok(decode_reply(&payload)?)
}

/// A client role over an unreliable flow, with the flow's counters.
struct MonitoredRole {
    role: Box<dyn ClientRole>,
    monitor: Arc<dyn FlowMonitor>,
}

impl ClientRole for MonitoredRole {
    fn run(
        &mut self,
        iterations: u64,
        rtt_hist: &mut LatencyHistogram,
    ) -> Result<RepOutcome, FlowError> {
        self.role.run(iterations, rtt_hist)
    }

    fn datagram_stats(&self) -> Option<DatagramStats> {
        Some(self.monitor.datagram_stats())
    }
}

struct AgentControl<'a> {
    conn: &'a mut ControlConn,
    session: &'a mut CoordinatorSession,
    done_timeout: Duration,
    /// The client end of an unreliable flow, served while waiting for the
    /// agent: it may still wait for this end's last datagram.
    monitor: Option<Arc<dyn FlowMonitor>>,
}

impl PeerControl for AgentControl<'_> {
    fn start(&mut self, iterations: u64, phase: Phase) -> Result<(), RunError> {
        let req = self.session.run(iterations, phase);
        self.conn
            .send(&req)
            .map_err(|e| RunError::Peer(control_detail(&e)))
    }

    fn finish(&mut self) -> Result<ServerRep, RunError> {
        let mut timeout = self.done_timeout;
        if let Some(m) = &self.monitor {
            let t0 = Instant::now();
            // A broken flow shows in the next repetition; the wait goes on.
            let _ = m.serve_idle(self.conn.stream().as_fd(), timeout);
            timeout = timeout
                .saturating_sub(t0.elapsed())
                .max(Duration::from_millis(1));
        }
        let reply = recv_reply(self.conn, timeout).map_err(|e| {
            // Name the whole wait, not what was left of it after serving
            // the flow's last datagrams.
            match e {
                PointError::Control(ControlError::TimedOut(_)) => {
                    RunError::PeerSilent(ControlError::TimedOut(self.done_timeout).to_string())
                }
                e => RunError::Peer(e.to_string()),
            }
        })?;
        let (bytes_rx, bytes_tx, cpu, datagrams) = self
            .session
            .on_done(reply)
            .map_err(|e| RunError::Peer(e.to_string()))?;
        Ok(ServerRep {
            bytes_rx,
            bytes_tx,
            cpu,
            datagrams,
        })
    }
}

/// Share of the payload sent in a repetition that arrived, 0..=1.
fn delivered_fraction(r: &runner::RepMeasurement) -> f64 {
    let sent = r.client.bytes_tx + r.server.bytes_tx;
    let received = r.server.bytes_rx + r.client.bytes_rx;
    if sent == 0 {
        return 1.0;
    }
    (received as f64 / sent as f64).min(1.0)
}

/// The path of a point between `host` and `peer_host`: what their facts
/// say, and on a testbed its topology and link conditions (`conditions`
/// when the run put the links under them, else the hosts file's).
pub(crate) fn path_of(
    plan: &Plan,
    host: &HostFacts,
    peer_host: &HostFacts,
    conditions: Option<LinkConditions>,
) -> PathIdentity {
    let mut path = PathIdentity::from_ends(Some(host), Some(peer_host));
    if let Some(tb) = &plan.settings.testbed {
        let tb = TestbedPath {
            conditions: conditions.or(tb.conditions),
            ..tb.clone()
        };
        tb.fill(&mut path);
    }
    path
}

/// Turns a measurement into the point's result record; `conditions` are
/// the testbed's link conditions the run put in place, if it did.
pub(crate) fn build_record(
    spec: &PointSpec,
    m: &PointMeasurement,
    plan: &Plan,
    host: &HostFacts,
    peer_host: &HostFacts,
    started: SystemTime,
    conditions: Option<LinkConditions>,
) -> Result<ResultRecord, PointError> {
    let test = bench::find(&spec.test).ok_or_else(|| PointError::UnknownTest(spec.test.clone()))?;
    // Bandwidth is of payload delivered: over a lossy transport the bytes
    // lost on the way do not count (as iperf3 reports the receiver's rate).
    let bandwidth = test.metric() == Metric::BandwidthGbps;
    let values: Vec<f64> = m
        .reps
        .iter()
        .map(|r| {
            if bandwidth {
                r.client.value * delivered_fraction(r)
            } else {
                r.client.value
            }
        })
        .collect();
    let summary = Summary::from_reps(&values)?;
    let local = CpuUsage::mean(&m.reps.iter().map(|r| r.client_cpu).collect::<Vec<_>>());
    let remote = CpuUsage::mean(&m.reps.iter().map(|r| r.server.cpu).collect::<Vec<_>>());
    let bytes = ByteCounts {
        client_tx: m.reps.iter().map(|r| r.client.bytes_tx).sum(),
        client_rx: m.reps.iter().map(|r| r.client.bytes_rx).sum(),
        server_tx: m.reps.iter().map(|r| r.server.bytes_tx).sum(),
        server_rx: m.reps.iter().map(|r| r.server.bytes_rx).sum(),
    };
    let sum = |side: &dyn Fn(&runner::RepMeasurement) -> Option<DatagramStats>| {
        m.reps
            .iter()
            .filter_map(side)
            .fold(DatagramStats::default(), |a, d| a.plus(&d))
    };
    let datagrams = m
        .reps
        .iter()
        .any(|r| r.client_datagrams.is_some() || r.server.datagrams.is_some())
        .then(|| DatagramCounts {
            client: sum(&|r| r.client_datagrams),
            server: sum(&|r| r.server.datagrams),
        });
    // All payload moved in either direction; stream's 1-byte acks included.
    let moved = bytes.client_tx + bytes.server_tx;
    let cpu = CpuPair { local, remote };
    let service_demand_us_per_kib = if bandwidth {
        ServiceDemand::of(&cpu, moved)
    } else {
        None
    };
    let percentiles = if test.has_percentiles() {
        m.rtt_hist.percentiles_us(0.5)
    } else {
        None
    };
    let mut record = ResultRecord::new(RecordHead {
        test: spec.test.clone(),
        transport: spec.transport.clone(),
        mode: spec.mode,
        size_bytes: spec.size_bytes,
        metric: test.metric().key().into(),
        value: summary.value,
        time: rfc3339(started),
    });
    record.stats = Some(RecordStats::from(&summary));
    record.percentiles = percentiles;
    record.cpu = Some(cpu);
    record.service_demand_us_per_kib = service_demand_us_per_kib;
    record.iterations_per_rep = Some(m.iterations_per_rep);
    record.warmup_iterations = Some(m.warmup_iterations);
    record.bytes = Some(bytes);
    record.datagrams = datagrams;
    record.host = Some(host.clone());
    record.peer_host = Some(peer_host.clone());
    record.options = Some(plan.settings.record_options(spec));
    record.ci_target = m.ci;
    let stack = Stack::new(
        &spec.transport,
        spec.mode,
        &spec.options,
        path_of(plan, host, peer_host, conditions),
        plan.settings.label.clone(),
    )
    .with_choices(&m.path_choices)
    .with_framing(transport::framing(&spec.transport));
    let mut record = record.with_stack(stack);
    diagnose(&mut record);
    Ok(record)
}

/// Opens the control session of `plan`: starts the in-process agent on
/// loopback when the plan has no remote peer, pins this thread when the
/// plan places the client, and connects.
pub(crate) fn open_session(plan: &Plan) -> Result<Coordinator, CoordError> {
    let key = || {
        plan.settings
            .key_file
            .as_deref()
            .map(crate::auth::load_key)
            .transpose()
    };
    let addr = match &plan.settings.peer {
        Peer::Agents { hosts } => {
            // Neither role runs here: the client's agent places its role.
            return Coordinator::connect_agents(
                hosts,
                key()?.as_ref(),
                plan.settings.client_cpu,
                plan.settings.io_timeout_ms,
            );
        }
        Peer::Remote { addr, .. } => addr.clone(),
        Peer::Embedded { ipv6 } => {
            let ip: IpAddr = if *ipv6 {
                Ipv6Addr::LOCALHOST.into()
            } else {
                Ipv4Addr::LOCALHOST.into()
            };
            let agent = Agent::bind(SocketAddr::new(ip, 0))
                .map_err(CoordError::EmbeddedBind)?
                .quiet();
            let addr = agent.local_addr().map_err(CoordError::EmbeddedIo)?;
            let addr = ControlAddr::Tcp(addr);
            agent.spawn().map_err(CoordError::EmbeddedIo)?;
            addr
        }
    };
    if let Some(cpu) = plan.settings.client_cpu {
        netgap_transport::affinity::pin_current_thread(cpu).map_err(CoordError::ClientPlacement)?;
    }
    Coordinator::connect(&addr, key()?.as_ref())
}

/// What a run did.
#[derive(Debug, Clone, Default)]
pub struct RunSummary {
    /// Points measured and written.
    pub points: usize,
}

/// Runs a plan's points one after another against its agent, each point
/// whole before the next, writing each record to every sink as soon as it
/// is measured. On failure, every point measured before is already in the
/// sinks. [`crate::run::run_plan`] chooses between this and an
/// interleaved run.
pub(crate) fn run_in_order(
    plan: &Plan,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<RunSummary, CoordError> {
    let mut coord = open_session(plan)?;
    let points = run_points(
        &plan.points,
        |spec| spec,
        sinks,
        observer,
        |spec, observer| {
            let (_, record) = coord
                .measure_record(spec, plan, &mut |rep| observer.rep_done(rep))
                .map_err(|e| CoordError::point(spec, &spec.test, e))?;
            Ok::<_, CoordError>(vec![record])
        },
    )?;
    coord.bye();
    Ok(RunSummary { points })
}
