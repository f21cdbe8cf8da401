//! A point's role on the agent: the test, transport and buffers of its
//! spec checked against this host, its flow accepted (server) or connected
//! (client) and proven, and the test's role set up over it.

use super::ACCEPT_TIMEOUT;
use crate::control::{ControlConn, ControlError};
use netgap_bench as bench;
use netgap_core::spec::PointSpec;
use netgap_proto::dataproof::DataToken;
use netgap_proto::session::AgentSession;
use netgap_transport::rate::{PacedFlow, RateBudget};
use netgap_transport::{self as transport, DatagramStats, FlowConfig, FlowMonitor};
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// The role a session plays in its open point; it owns the point's flow.
pub(crate) enum PointRole {
    /// The server role, run by `run`.
    Server(Box<dyn bench::ServerRole>),
    /// The client role, run and timed by `client_run`.
    Client(Box<dyn bench::ClientRole>),
}

/// The point a session has open: its role, which owns the flow, and for an
/// unreliable flow its monitor with the counters last reported.
pub(crate) struct OpenPoint {
    pub(crate) role: PointRole,
    /// Ends the flow from the watchdog of a repetition that runs past the
    /// agent's longest run; `None` for a flow that cannot be ended from
    /// outside, whose repetitions end at their I/O timeout instead.
    pub(crate) abort: Option<netgap_transport::AbortHandle>,
    pub(crate) monitor: Option<Arc<dyn FlowMonitor>>,
    pub(crate) reported: DatagramStats,
    /// The CPU a client role's repetitions run on (`--pin`), if pinned.
    pub(crate) cpu: Option<u32>,
}

impl OpenPoint {
    /// The flow's datagram counters since the last report, for an
    /// unreliable flow.
    pub(crate) fn datagrams_since_report(&mut self) -> Option<DatagramStats> {
        let now = self.monitor.as_ref()?.datagram_stats();
        let since = now.since(&self.reported);
        self.reported = now;
        Some(since)
    }
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
pub(crate) fn open_client(
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
pub(crate) fn open_point(
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
