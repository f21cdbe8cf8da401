//! Session state machines for both ends of the control protocol, driven by
//! messages and by reports of what the caller did; no I/O.
//!
//! [`AgentSession`] decides how an agent answers each [`Request`]: directly,
//! or by asking its caller to act (open a listener, run the server role,
//! close the flow) and then building the reply from the caller's report.
//! [`CoordinatorSession`] builds the requests and checks that each [`Reply`]
//! is the one expected at that step. Sockets, threads and timeouts belong to
//! the agent and coordinator modules, which feed these machines with messages
//! decoded by [`crate::codec`].
//!
//! Session outline (coordinator → agent, then the reply):
//! `hello` → `welcome`; then per point `open` → `listening` → `accepted`,
//! `run` → `done` (any number of times), `close` → `closed`; finally `bye` →
//! `closed`. A busy agent answers `hello` with `busy`, an agent speaking
//! another protocol with `version_mismatch`; both then close the connection.
//!
//! An agent may play a point's client role instead, when a coordinator
//! places the two roles of a point-to-point test on two agents:
//! `client_open` → `client_connected` (after the server's agent announced
//! its listener), then per repetition `client_run` → any number of
//! `group_alive` and `client_buckets` → `client_done`, and `close` →
//! `closed`.

use super::codec::one_line;
use super::dataproof::DataToken;
use super::message::{ClientRep, Phase, Reply, Request, MAX_TEXT_BYTES, PROTOCOL_VERSION};
use super::workload::{
    FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec, BUCKETS_PER_CHUNK, FLOWS_PER_CHUNK,
};
use netgap_core::cpu::CpuUsage;
use netgap_core::datagram::DatagramStats;
use netgap_core::host::HostFacts;
use netgap_core::spec::PointSpec;
use std::fmt;

impl Request {
    /// Name of the message kind as it appears on the wire (`hello`, `open`,
    /// `run`, `close`, `bye`), for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Request::Hello { .. } => "hello",
            Request::Open { .. } => "open",
            Request::Run { .. } => "run",
            Request::Close => "close",
            Request::Bye => "bye",
            Request::WorkloadPrepare { .. } => "group_prepare",
            Request::WorkloadGo => "group_go",
            Request::ClientOpen { .. } => "client_open",
            Request::ClientRun { .. } => "client_run",
        }
    }
}

impl Reply {
    /// Name of the message kind as it appears on the wire (`welcome`,
    /// `version_mismatch`, `busy`, `listening`, `accepted`, `done`, `closed`,
    /// `error`), for error messages.
    pub fn kind(&self) -> &'static str {
        match self {
            Reply::Welcome { .. } => "welcome",
            Reply::VersionMismatch { .. } => "version_mismatch",
            Reply::Busy => "busy",
            Reply::Listening { .. } => "listening",
            Reply::Accepted => "accepted",
            Reply::Done { .. } => "done",
            Reply::Closed => "closed",
            Reply::Error { .. } => "error",
            Reply::WorkloadListening { .. } => "group_listening",
            Reply::WorkloadReady => "group_ready",
            Reply::WorkloadFlows { .. } => "group_flows",
            Reply::WorkloadBuckets { .. } => "group_buckets",
            Reply::WorkloadFinished { .. } => "group_finished",
            Reply::WorkloadAlive => "group_alive",
            Reply::ClientConnected { .. } => "client_connected",
            Reply::ClientBuckets { .. } => "client_buckets",
            Reply::ClientDone { .. } => "client_done",
        }
    }
}

/// Why a session cannot go on. Every message is one line meant for a user.
/// After any error except [`SessionError::Remote`] in the point set-up steps
/// the session is closed: the caller reports the error and drops the
/// connection.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SessionError {
    /// The peer sent a message that is not valid in the current state.
    #[error("protocol error: unexpected {got} message in session state {state}")]
    Unexpected {
        /// Name of the state the session was in ([`AgentState::as_str`] or
        /// [`CoordinatorState::as_str`]).
        state: &'static str,
        /// Kind of the message received ([`Request::kind`] or [`Reply::kind`]).
        got: &'static str,
    },
    /// The agent already runs a test for another coordinator.
    #[error("agent is busy running another test; try again when it is done")]
    Busy,
    /// The two ends speak different protocol versions.
    #[error(
        "protocol version mismatch: this netgap speaks {ours}, the agent speaks {theirs}; run the same netgap version on both hosts"
    )]
    VersionMismatch {
        /// [`PROTOCOL_VERSION`] of this side.
        ours: u32,
        /// Protocol version of the agent.
        theirs: u32,
    },
    /// The agent answered with [`Reply::Error`]; holds its message, on one
    /// line.
    #[error("agent error: {0}")]
    Remote(String),
    /// The local caller used the session out of order (a bug on this side,
    /// never caused by the peer).
    #[error("internal error: {call} called in session state {state}")]
    Misuse {
        /// Name of the state the session was in.
        state: &'static str,
        /// The method called.
        call: &'static str,
    },
}

/// Where an agent session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AgentState {
    /// Waiting for the coordinator's `hello`.
    AwaitHello,
    /// Handshake done, no point open: waiting for `open` or `bye`.
    Idle,
    /// `open` received: the caller is opening the data listener and reports
    /// with [`AgentSession::listening`].
    Opening,
    /// The data listener is open and announced; the caller is accepting the
    /// flow and reports with [`AgentSession::accepted`].
    Listening,
    /// The flow is accepted: waiting for `run`, `close` or `bye`.
    Open,
    /// `run` received: the caller runs the server role and reports with
    /// [`AgentSession::role_done`].
    Running,
    /// `close` received: the caller closes the flow and reports with
    /// [`AgentSession::closed`].
    Closing,
    /// The session is over (after `bye`, a refusal or an error): the caller
    /// closes the connection.
    Closed,
    /// `group_prepare` received: the caller opens listeners or connects
    /// flows and reports with [`AgentSession::workload_listening`] (server) or
    /// [`AgentSession::workload_ready`].
    WorkloadPreparing,
    /// A server role announced its listeners and is accepting its flows;
    /// the caller reports with [`AgentSession::workload_ready`].
    WorkloadListening,
    /// The workload role is prepared: waiting for `group_go` or `bye`.
    WorkloadReady,
    /// `group_go` received: the caller runs the flows and reports with
    /// [`AgentSession::workload_finished`].
    WorkloadRunning,
    /// `client_open` received: the caller connects the client role's flow
    /// and reports with [`AgentSession::client_connected`].
    ClientOpening,
    /// The client role's flow is connected: waiting for `client_run`,
    /// `close` or `bye`.
    ClientOpen,
    /// `client_run` received: the caller runs a repetition of the client
    /// role and reports with [`AgentSession::client_done`].
    ClientRunning,
}

impl AgentState {
    /// Short name for error messages (`await_hello`, `idle`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            AgentState::AwaitHello => "await_hello",
            AgentState::Idle => "idle",
            AgentState::Opening => "opening",
            AgentState::Listening => "listening",
            AgentState::Open => "open",
            AgentState::Running => "running",
            AgentState::Closing => "closing",
            AgentState::Closed => "closed",
            AgentState::WorkloadPreparing => "group_preparing",
            AgentState::WorkloadListening => "group_listening",
            AgentState::WorkloadReady => "group_ready",
            AgentState::WorkloadRunning => "group_running",
            AgentState::ClientOpening => "client_opening",
            AgentState::ClientOpen => "client_open",
            AgentState::ClientRunning => "client_running",
        }
    }
}

impl fmt::Display for AgentState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the agent's caller must do after a request.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentAction {
    /// Send this reply and wait for the next request.
    Reply(Reply),
    /// Send this reply, then close the connection (busy, version mismatch,
    /// answer to `bye`).
    ReplyAndClose(Reply),
    /// Open a data listener for this point (already range-checked by the
    /// codec), then call [`AgentSession::listening`] with its address, or
    /// [`AgentSession::failed`].
    OpenPoint(PointSpec),
    /// Run the server role of the open point for `iterations` iterations
    /// (1..=[`netgap_core::spec::MAX_ITERATIONS`]), then call
    /// [`AgentSession::role_done`], or [`AgentSession::failed`].
    RunRole {
        /// Iterations in this repetition.
        iterations: u64,
        /// Warm-up or measured.
        phase: Phase,
    },
    /// Close the point's flow and listener, then call
    /// [`AgentSession::closed`], or [`AgentSession::failed`].
    ClosePoint,
    /// Prepare a workload role (already range-checked by the codec): a server
    /// listens, calls [`AgentSession::workload_listening`], accepts every flow
    /// and calls [`AgentSession::workload_ready`]; a client connects its flows
    /// and calls [`AgentSession::workload_ready`]. On failure call
    /// [`AgentSession::failed`].
    PrepareWorkload(WorkloadSpec),
    /// Run the prepared workload role, then call
    /// [`AgentSession::workload_finished`], or [`AgentSession::failed`].
    RunWorkload,
    /// Connect a client role's flow for this point (already range-checked
    /// by the codec) to `target`, then call
    /// [`AgentSession::client_connected`], or [`AgentSession::failed`].
    OpenClient {
        /// The point.
        spec: PointSpec,
        /// The server role's data address.
        target: String,
        /// The CPU to run the client role on, if pinned.
        client_cpu: Option<u32>,
    },
    /// Run the client role of the open point for `iterations` iterations
    /// (1..=[`netgap_core::spec::MAX_ITERATIONS`]), then call
    /// [`AgentSession::client_done`], or [`AgentSession::failed`].
    RunClient {
        /// Iterations in this repetition.
        iterations: u64,
        /// Warm-up or measured.
        phase: Phase,
    },
}

/// The agent's end of one control connection.
///
/// Feed each decoded request to [`AgentSession::on_request`] and do what the
/// returned [`AgentAction`] says; report the outcome with the matching method,
/// which returns the reply to send. Never panics on peer input: a request out
/// of order is a [`SessionError::Unexpected`] that closes the session.
#[derive(Debug, Clone)]
pub struct AgentSession {
    host: HostFacts,
    busy: bool,
    state: AgentState,
    coordinator_version: Option<String>,
}

impl AgentSession {
    /// A session waiting for `hello`. `host` is sent in the welcome; `busy`
    /// means another session already runs a test on this agent, so the
    /// handshake is answered with [`Reply::Busy`].
    pub fn new(host: HostFacts, busy: bool) -> Self {
        AgentSession {
            host,
            busy,
            state: AgentState::AwaitHello,
            coordinator_version: None,
        }
    }

    /// Current state.
    pub fn state(&self) -> AgentState {
        self.state
    }

    /// netgap version the coordinator announced in its `hello`, for the log.
    pub fn coordinator_version(&self) -> Option<&str> {
        self.coordinator_version.as_deref()
    }

    /// Decides what to do with a request. A request not valid in the current
    /// state (anything before `hello`, `hello` twice, `run` before `open`,
    /// `open` while a point is open, any request while the caller is still
    /// acting on the previous one) returns [`SessionError::Unexpected`] and
    /// closes the session: the caller sends [`AgentSession::failed`]'s reply
    /// and closes the connection. Never panics.
    pub fn on_request(&mut self, req: &Request) -> Result<AgentAction, SessionError> {
        use AgentState as S;
        let (next, action) = match (self.state, req) {
            (S::AwaitHello, Request::Hello { protocol, version }) => {
                self.coordinator_version = Some(one_line(version, MAX_TEXT_BYTES));
                if *protocol != PROTOCOL_VERSION {
                    (
                        S::Closed,
                        AgentAction::ReplyAndClose(Reply::VersionMismatch {
                            supported: PROTOCOL_VERSION,
                        }),
                    )
                } else if self.busy {
                    (S::Closed, AgentAction::ReplyAndClose(Reply::Busy))
                } else {
                    (
                        S::Idle,
                        AgentAction::Reply(Reply::Welcome {
                            protocol: PROTOCOL_VERSION,
                            version: netgap_core::VERSION.to_string(),
                            host: self.host.clone(),
                        }),
                    )
                }
            }
            (S::Idle, Request::Open { spec, .. }) => {
                (S::Opening, AgentAction::OpenPoint(spec.clone()))
            }
            (S::Open, Request::Run { iterations, phase }) => (
                S::Running,
                AgentAction::RunRole {
                    iterations: *iterations,
                    phase: *phase,
                },
            ),
            (S::Open | S::ClientOpen, Request::Close) => (S::Closing, AgentAction::ClosePoint),
            (
                S::Idle,
                Request::ClientOpen {
                    spec,
                    target,
                    client_cpu,
                    ..
                },
            ) => (
                S::ClientOpening,
                AgentAction::OpenClient {
                    spec: spec.clone(),
                    target: target.clone(),
                    client_cpu: *client_cpu,
                },
            ),
            (S::ClientOpen, Request::ClientRun { iterations, phase }) => (
                S::ClientRunning,
                AgentAction::RunClient {
                    iterations: *iterations,
                    phase: *phase,
                },
            ),
            (S::Idle, Request::WorkloadPrepare { spec, .. }) => (
                S::WorkloadPreparing,
                AgentAction::PrepareWorkload(spec.clone()),
            ),
            (S::WorkloadReady, Request::WorkloadGo) => {
                (S::WorkloadRunning, AgentAction::RunWorkload)
            }
            (S::Idle | S::Listening | S::Open | S::WorkloadReady | S::ClientOpen, Request::Bye) => {
                (S::Closed, AgentAction::ReplyAndClose(Reply::Closed))
            }
            (state, req) => {
                self.state = S::Closed;
                return Err(SessionError::Unexpected {
                    state: state.as_str(),
                    got: req.kind(),
                });
            }
        };
        self.state = next;
        Ok(action)
    }

    /// Moves `from` → `to` if the session is in `from`, else reports misuse
    /// (and leaves the state alone).
    fn step(
        &mut self,
        from: AgentState,
        to: AgentState,
        call: &'static str,
    ) -> Result<(), SessionError> {
        if self.state != from {
            return Err(SessionError::Misuse {
                state: self.state.as_str(),
                call,
            });
        }
        self.state = to;
        Ok(())
    }

    /// The caller opened the data listener at `addr` (transport-specific,
    /// at most [`MAX_TEXT_BYTES`] bytes); returns [`Reply::Listening`].
    /// Valid after [`AgentAction::OpenPoint`], else [`SessionError::Misuse`].
    pub fn listening(&mut self, addr: String) -> Result<Reply, SessionError> {
        self.step(AgentState::Opening, AgentState::Listening, "listening")?;
        Ok(Reply::Listening { addr })
    }

    /// The caller accepted the data flow; returns [`Reply::Accepted`]. Valid
    /// after [`AgentSession::listening`], else [`SessionError::Misuse`].
    pub fn accepted(&mut self) -> Result<Reply, SessionError> {
        self.step(AgentState::Listening, AgentState::Open, "accepted")?;
        Ok(Reply::Accepted)
    }

    /// The caller finished a repetition of the server role: `bytes_rx` and
    /// `bytes_tx` are payload bytes received and sent, `cpu` its CPU usage
    /// (finite numbers, or the coordinator refuses the reply), `datagrams`
    /// the counters of an unreliable flow since the previous report.
    /// Returns [`Reply::Done`]. Valid after [`AgentAction::RunRole`], else
    /// [`SessionError::Misuse`].
    pub fn role_done(
        &mut self,
        bytes_rx: u64,
        bytes_tx: u64,
        cpu: CpuUsage,
        datagrams: Option<DatagramStats>,
    ) -> Result<Reply, SessionError> {
        self.step(AgentState::Running, AgentState::Open, "role_done")?;
        Ok(Reply::Done {
            bytes_rx,
            bytes_tx,
            cpu,
            datagrams,
        })
    }

    /// The caller connected the client role's flow and set the role up
    /// over it; `path_choices` are the transport's choices of the data
    /// path (at most [`crate::message::MAX_PATH_CHOICES`]). Returns
    /// [`Reply::ClientConnected`]. Valid after [`AgentAction::OpenClient`],
    /// else [`SessionError::Misuse`].
    pub fn client_connected(&mut self, path_choices: Vec<String>) -> Result<Reply, SessionError> {
        self.step(
            AgentState::ClientOpening,
            AgentState::ClientOpen,
            "client_connected",
        )?;
        Ok(Reply::ClientConnected { path_choices })
    }

    /// The caller finished a repetition of the client role: `rep` is what
    /// it measured (finite numbers, or the coordinator refuses the reply)
    /// and `buckets` its round trips as `[value_ns, count]` pairs. Returns
    /// the replies to send in order: the buckets in chunks that fit a
    /// frame, then [`Reply::ClientDone`]. Valid after
    /// [`AgentAction::RunClient`], else [`SessionError::Misuse`].
    pub fn client_done(
        &mut self,
        rep: ClientRep,
        buckets: Vec<[u64; 2]>,
    ) -> Result<Vec<Reply>, SessionError> {
        self.step(
            AgentState::ClientRunning,
            AgentState::ClientOpen,
            "client_done",
        )?;
        let mut replies: Vec<Reply> = buckets
            .chunks(BUCKETS_PER_CHUNK)
            .map(|c| Reply::ClientBuckets {
                buckets: c.to_vec(),
            })
            .collect();
        replies.push(Reply::ClientDone { rep });
        Ok(replies)
    }

    /// The caller closed the point's flow; returns [`Reply::Closed`] and the
    /// session is idle again. Valid after [`AgentAction::ClosePoint`], else
    /// [`SessionError::Misuse`].
    pub fn closed(&mut self) -> Result<Reply, SessionError> {
        self.step(AgentState::Closing, AgentState::Idle, "closed")?;
        Ok(Reply::Closed)
    }

    /// A workload server role listens at `addrs` (one per flow or one for
    /// all); returns [`Reply::WorkloadListening`]. Valid after
    /// [`AgentAction::PrepareWorkload`], else [`SessionError::Misuse`].
    pub fn workload_listening(&mut self, addrs: Vec<String>) -> Result<Reply, SessionError> {
        self.step(
            AgentState::WorkloadPreparing,
            AgentState::WorkloadListening,
            "group_listening",
        )?;
        Ok(Reply::WorkloadListening { addrs })
    }

    /// Every flow of the workload role is prepared; returns
    /// [`Reply::WorkloadReady`]. Valid after [`AgentAction::PrepareWorkload`]
    /// (client) or [`AgentSession::workload_listening`] (server).
    pub fn workload_ready(&mut self) -> Result<Reply, SessionError> {
        if !matches!(
            self.state,
            AgentState::WorkloadPreparing | AgentState::WorkloadListening
        ) {
            return Err(SessionError::Misuse {
                state: self.state.as_str(),
                call: "group_ready",
            });
        }
        self.state = AgentState::WorkloadReady;
        Ok(Reply::WorkloadReady)
    }

    /// The workload role is still being prepared or still running; returns
    /// [`Reply::WorkloadAlive`] to send, so a coordinator can tell a slow setup
    /// or a long run from a silent host. Valid after
    /// [`AgentAction::PrepareWorkload`] until the role is ready or failed, and
    /// after [`AgentAction::RunWorkload`] until
    /// [`AgentSession::workload_finished`], else [`SessionError::Misuse`].
    pub fn workload_alive(&self) -> Result<Reply, SessionError> {
        if !matches!(
            self.state,
            AgentState::WorkloadRunning | AgentState::WorkloadPreparing | AgentState::ClientRunning
        ) {
            return Err(SessionError::Misuse {
                state: self.state.as_str(),
                call: "group_alive",
            });
        }
        Ok(Reply::WorkloadAlive)
    }

    /// The workload repetition is over: returns the replies to send in order,
    /// the flow reports and histogram buckets in chunks that fit a frame,
    /// then [`Reply::WorkloadFinished`]; the session is idle again. Valid after
    /// [`AgentAction::RunWorkload`], else [`SessionError::Misuse`].
    pub fn workload_finished(
        &mut self,
        flows: Vec<FlowReport>,
        buckets: Vec<[u64; 2]>,
        outcome: WorkloadOutcome,
    ) -> Result<Vec<Reply>, SessionError> {
        self.step(
            AgentState::WorkloadRunning,
            AgentState::Idle,
            "group_finished",
        )?;
        let mut replies: Vec<Reply> = flows
            .chunks(FLOWS_PER_CHUNK)
            .map(|c| Reply::WorkloadFlows { flows: c.to_vec() })
            .collect();
        replies.extend(
            buckets
                .chunks(BUCKETS_PER_CHUNK)
                .map(|c| Reply::WorkloadBuckets {
                    buckets: c.to_vec(),
                }),
        );
        replies.push(Reply::WorkloadFinished { outcome });
        Ok(replies)
    }

    /// The caller could not carry out the last action, or `on_request`
    /// refused a request: returns the [`Reply::Error`] to send, holding
    /// `message` on one line, cut to [`MAX_TEXT_BYTES`]. If no flow was open
    /// yet (opening the listener or accepting failed) the session goes back
    /// to idle and may open another point; otherwise it is closed and the
    /// caller closes the connection after sending the reply.
    pub fn failed(&mut self, message: &str) -> Reply {
        self.state = match self.state {
            AgentState::Opening
            | AgentState::Listening
            | AgentState::WorkloadPreparing
            | AgentState::WorkloadListening
            | AgentState::WorkloadReady
            | AgentState::WorkloadRunning
            | AgentState::ClientOpening => AgentState::Idle,
            _ => AgentState::Closed,
        };
        Reply::Error {
            message: one_line(message, MAX_TEXT_BYTES),
        }
    }
}

/// One step of an agent's answer to `group_go`.
#[derive(Debug, Clone, PartialEq)]
pub enum WorkloadProgress {
    /// Reports of some flows.
    Flows(Vec<FlowReport>),
    /// Some `[value_ns, count]` buckets of the agent's latency histogram.
    Buckets(Vec<[u64; 2]>),
    /// The agent is still running.
    Alive,
    /// The last reply: the repetition is over.
    Finished(Box<WorkloadOutcome>),
}

/// One step of an agent's answer to `client_run`.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientProgress {
    /// Some `[value_ns, count]` buckets of the repetition's round trips.
    Buckets(Vec<[u64; 2]>),
    /// The agent is still running the repetition.
    Alive,
    /// The last reply: what the repetition measured.
    Done(ClientRep),
}

/// Where a coordinator session stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CoordinatorState {
    /// Nothing sent yet.
    New,
    /// `hello` sent, waiting for the welcome.
    AwaitWelcome,
    /// Handshake done, no point open.
    Idle,
    /// `open` sent, waiting for `listening`.
    AwaitListening,
    /// Listener announced, waiting for `accepted`.
    AwaitAccepted,
    /// The point's flow is connected.
    Open,
    /// `run` sent, waiting for `done`.
    AwaitDone,
    /// `close` sent, waiting for `closed`.
    AwaitClosed,
    /// `bye` sent; the agent's `closed` may be read with
    /// [`CoordinatorSession::on_bye_reply`] or ignored.
    ByeSent,
    /// The session is over.
    Closed,
    /// `group_prepare` sent to a server role, waiting for `group_listening`.
    AwaitWorkloadListening,
    /// Waiting for `group_ready`.
    AwaitWorkloadReady,
    /// The agent's workload role is prepared; `group_go` may be sent.
    WorkloadReady,
    /// `group_go` sent, waiting for the flow reports and `group_finished`.
    AwaitWorkloadFinished,
    /// `client_open` sent, waiting for `client_connected`.
    AwaitClientConnected,
    /// The agent's client role is connected: `client_run` or `close` may
    /// be sent.
    ClientOpen,
    /// `client_run` sent, waiting for `client_done`.
    AwaitClientDone,
}

impl CoordinatorState {
    /// Short name for error messages (`await_welcome`, `idle`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            CoordinatorState::New => "new",
            CoordinatorState::AwaitWelcome => "await_welcome",
            CoordinatorState::Idle => "idle",
            CoordinatorState::AwaitListening => "await_listening",
            CoordinatorState::AwaitAccepted => "await_accepted",
            CoordinatorState::Open => "open",
            CoordinatorState::AwaitDone => "await_done",
            CoordinatorState::AwaitClosed => "await_closed",
            CoordinatorState::ByeSent => "bye_sent",
            CoordinatorState::Closed => "closed",
            CoordinatorState::AwaitWorkloadListening => "await_group_listening",
            CoordinatorState::AwaitWorkloadReady => "await_group_ready",
            CoordinatorState::WorkloadReady => "group_ready",
            CoordinatorState::AwaitWorkloadFinished => "await_group_finished",
            CoordinatorState::AwaitClientConnected => "await_client_connected",
            CoordinatorState::ClientOpen => "client_open",
            CoordinatorState::AwaitClientDone => "await_client_done",
        }
    }
}

impl fmt::Display for CoordinatorState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The coordinator's end of one control connection.
///
/// Each request builder (`hello`, `open`, `run`, `close`, `bye`) returns the
/// request to send and records which reply is due; the matching `on_*`
/// method checks the reply and extracts its content. Never panics on peer
/// input: a reply that is not the one due is [`SessionError::Unexpected`],
/// [`Reply::Error`] is [`SessionError::Remote`]. A builder called out of order
/// still returns its request (the agent will refuse it), and the next `on_*`
/// call returns [`SessionError::Misuse`].
#[derive(Debug, Clone)]
pub struct CoordinatorSession {
    state: CoordinatorState,
    /// Protocol version announced in `hello` (differs from
    /// [`PROTOCOL_VERSION`] only in tests).
    protocol: u32,
    /// First out-of-order builder call, reported by the next `on_*` call.
    misuse: Option<SessionError>,
    agent_version: Option<String>,
}

impl Default for CoordinatorSession {
    fn default() -> Self {
        Self::new()
    }
}

impl CoordinatorSession {
    /// A session that has sent nothing yet.
    pub fn new() -> Self {
        CoordinatorSession {
            state: CoordinatorState::New,
            protocol: PROTOCOL_VERSION,
            misuse: None,
            agent_version: None,
        }
    }

    /// Current state.
    pub fn state(&self) -> CoordinatorState {
        self.state
    }

    /// netgap version the agent announced in its welcome, for the log.
    pub fn agent_version(&self) -> Option<&str> {
        self.agent_version.as_deref()
    }

    /// Records a request about to be sent: moves to `next`, remembering a
    /// misuse if the session was not in `from`.
    fn sent(&mut self, from: CoordinatorState, next: CoordinatorState, call: &'static str) {
        if self.state != from && self.misuse.is_none() {
            self.misuse = Some(SessionError::Misuse {
                state: self.state.as_str(),
                call,
            });
        }
        self.state = next;
    }

    /// Checks that a reply is due in state `due`; on error the session closes.
    fn due(&mut self, due: CoordinatorState, call: &'static str) -> Result<(), SessionError> {
        let err = if let Some(err) = self.misuse.take() {
            err
        } else if self.state != due {
            SessionError::Misuse {
                state: self.state.as_str(),
                call,
            }
        } else {
            return Ok(());
        };
        self.state = CoordinatorState::Closed;
        Err(err)
    }

    /// The error for a reply that is not the one due. [`Reply::Error`] while
    /// setting up a point (no flow yet) leaves the session idle and usable;
    /// anything else closes it.
    fn reject(&mut self, reply: &Reply) -> SessionError {
        let state = self.state;
        match reply {
            Reply::Error { message } => {
                self.state = match state {
                    CoordinatorState::AwaitListening
                    | CoordinatorState::AwaitAccepted
                    | CoordinatorState::AwaitWorkloadListening
                    | CoordinatorState::AwaitWorkloadReady
                    | CoordinatorState::AwaitWorkloadFinished
                    | CoordinatorState::AwaitClientConnected => CoordinatorState::Idle,
                    _ => CoordinatorState::Closed,
                };
                SessionError::Remote(one_line(message, MAX_TEXT_BYTES))
            }
            other => {
                self.state = CoordinatorState::Closed;
                SessionError::Unexpected {
                    state: state.as_str(),
                    got: other.kind(),
                }
            }
        }
    }

    /// The first request: `hello` with [`PROTOCOL_VERSION`] and
    /// [`netgap_core::VERSION`]. Then call [`CoordinatorSession::on_welcome`].
    pub fn hello(&mut self) -> Request {
        self.sent(
            CoordinatorState::New,
            CoordinatorState::AwaitWelcome,
            "hello",
        );
        Request::Hello {
            protocol: self.protocol,
            version: netgap_core::VERSION.to_string(),
        }
    }

    /// Checks the answer to `hello` and returns the agent's host facts.
    /// [`Reply::Busy`] is [`SessionError::Busy`], a version mismatch (refused
    /// or announced in the welcome) is [`SessionError::VersionMismatch`];
    /// after any error the session is closed.
    pub fn on_welcome(&mut self, reply: Reply) -> Result<HostFacts, SessionError> {
        self.due(CoordinatorState::AwaitWelcome, "on_welcome")?;
        let ours = self.protocol;
        let err = match reply {
            Reply::Welcome {
                protocol,
                version,
                host,
            } if protocol == ours => {
                self.agent_version = Some(one_line(&version, MAX_TEXT_BYTES));
                self.state = CoordinatorState::Idle;
                return Ok(host);
            }
            Reply::Welcome { protocol, .. } => SessionError::VersionMismatch {
                ours,
                theirs: protocol,
            },
            Reply::VersionMismatch { supported } if supported != ours => {
                SessionError::VersionMismatch {
                    ours,
                    theirs: supported,
                }
            }
            Reply::Busy => SessionError::Busy,
            other => return Err(self.reject(&other)),
        };
        self.state = CoordinatorState::Closed;
        Err(err)
    }

    /// Asks the agent to prepare `spec` (which should pass
    /// [`PointSpec::validate`], or the agent refuses it). Valid when idle.
    /// Then call [`CoordinatorSession::on_listening`]. The point's data
    /// connection proves `data_token`.
    pub fn open(&mut self, spec: PointSpec, data_token: DataToken) -> Request {
        self.sent(
            CoordinatorState::Idle,
            CoordinatorState::AwaitListening,
            "open",
        );
        Request::Open { spec, data_token }
    }

    /// Checks the answer to `open` and returns the data listener's address
    /// (transport-specific: `IP:PORT`, a socket path, ...). Connect the flow
    /// to it, then call [`CoordinatorSession::on_accepted`]. An agent error
    /// here leaves the session idle.
    pub fn on_listening(&mut self, reply: Reply) -> Result<String, SessionError> {
        self.due(CoordinatorState::AwaitListening, "on_listening")?;
        match reply {
            Reply::Listening { addr } => {
                self.state = CoordinatorState::AwaitAccepted;
                Ok(addr)
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Checks that the agent accepted the flow; the point is then open. An
    /// agent error here leaves the session idle.
    pub fn on_accepted(&mut self, reply: Reply) -> Result<(), SessionError> {
        self.due(CoordinatorState::AwaitAccepted, "on_accepted")?;
        match reply {
            Reply::Accepted => {
                self.state = CoordinatorState::Open;
                Ok(())
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Asks the agent to run the server role for `iterations` iterations
    /// (1..=[`netgap_core::spec::MAX_ITERATIONS`], or the agent refuses them).
    /// Valid while a point is open. Then call [`CoordinatorSession::on_done`].
    pub fn run(&mut self, iterations: u64, phase: Phase) -> Request {
        self.sent(CoordinatorState::Open, CoordinatorState::AwaitDone, "run");
        Request::Run { iterations, phase }
    }

    /// Checks the answer to `run` and returns `(bytes_rx, bytes_tx, cpu,
    /// datagrams)`: payload bytes the agent received and sent, its CPU usage
    /// over the repetition and, for an unreliable flow, its datagram
    /// counters. The point stays open.
    pub fn on_done(
        &mut self,
        reply: Reply,
    ) -> Result<(u64, u64, CpuUsage, Option<DatagramStats>), SessionError> {
        self.due(CoordinatorState::AwaitDone, "on_done")?;
        match reply {
            Reply::Done {
                bytes_rx,
                bytes_tx,
                cpu,
                datagrams,
            } => {
                self.state = CoordinatorState::Open;
                Ok((bytes_rx, bytes_tx, cpu, datagrams))
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Asks the agent to close the point's flow. Valid while a point is
    /// open, with the agent playing its server role or its client role.
    /// Then call [`CoordinatorSession::on_closed`].
    pub fn close(&mut self) -> Request {
        let from = match self.state {
            CoordinatorState::ClientOpen => CoordinatorState::ClientOpen,
            _ => CoordinatorState::Open,
        };
        self.sent(from, CoordinatorState::AwaitClosed, "close");
        Request::Close
    }

    /// Asks the agent to play the client role of `spec` (which should pass
    /// [`PointSpec::validate`], or the agent refuses it): to connect to
    /// the server role at `target` and prove `data_token`, running the
    /// role on CPU `client_cpu` when given. Valid when idle. Then call
    /// [`CoordinatorSession::on_client_connected`].
    pub fn client_open(
        &mut self,
        spec: PointSpec,
        data_token: DataToken,
        target: String,
        client_cpu: Option<u32>,
    ) -> Request {
        self.sent(
            CoordinatorState::Idle,
            CoordinatorState::AwaitClientConnected,
            "client_open",
        );
        Request::ClientOpen {
            spec,
            data_token,
            target,
            client_cpu,
        }
    }

    /// Checks the answer to `client_open` and returns the transport's
    /// choices of the flow's data path. An agent error here leaves the
    /// session idle.
    pub fn on_client_connected(&mut self, reply: Reply) -> Result<Vec<String>, SessionError> {
        self.due(
            CoordinatorState::AwaitClientConnected,
            "on_client_connected",
        )?;
        match reply {
            Reply::ClientConnected { path_choices } => {
                self.state = CoordinatorState::ClientOpen;
                Ok(path_choices)
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Asks the agent to run the client role for `iterations` iterations
    /// (1..=[`netgap_core::spec::MAX_ITERATIONS`], or the agent refuses
    /// them). Valid while its client role is open. Then call
    /// [`CoordinatorSession::on_client_result`] until it returns
    /// [`ClientProgress::Done`].
    pub fn client_run(&mut self, iterations: u64, phase: Phase) -> Request {
        self.sent(
            CoordinatorState::ClientOpen,
            CoordinatorState::AwaitClientDone,
            "client_run",
        );
        Request::ClientRun { iterations, phase }
    }

    /// Checks one reply to `client_run`: liveness and histogram chunks
    /// keep the session waiting, `client_done` ends the repetition with
    /// the client role still open. An agent error closes the session (the
    /// agent dropped the flow).
    pub fn on_client_result(&mut self, reply: Reply) -> Result<ClientProgress, SessionError> {
        self.due(CoordinatorState::AwaitClientDone, "on_client_result")?;
        match reply {
            Reply::WorkloadAlive => Ok(ClientProgress::Alive),
            Reply::ClientBuckets { buckets } => Ok(ClientProgress::Buckets(buckets)),
            Reply::ClientDone { rep } => {
                self.state = CoordinatorState::ClientOpen;
                Ok(ClientProgress::Done(rep))
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Checks the answer to `close`; the session is then idle.
    pub fn on_closed(&mut self, reply: Reply) -> Result<(), SessionError> {
        self.due(CoordinatorState::AwaitClosed, "on_closed")?;
        match reply {
            Reply::Closed => {
                self.state = CoordinatorState::Idle;
                Ok(())
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Asks the agent to prepare its role in a workload point (the spec should
    /// pass [`WorkloadSpec::validate`], or the agent refuses it). Valid when
    /// idle. Then call [`CoordinatorSession::on_workload_listening`] for a
    /// server role, [`CoordinatorSession::on_workload_ready`] for a client.
    /// Every role of one point gets the same `data_token`.
    pub fn workload_prepare(&mut self, spec: WorkloadSpec, data_token: DataToken) -> Request {
        let next = match spec.role {
            WorkloadRole::Server => CoordinatorState::AwaitWorkloadListening,
            WorkloadRole::Client => CoordinatorState::AwaitWorkloadReady,
        };
        self.sent(CoordinatorState::Idle, next, "group_prepare");
        Request::WorkloadPrepare { spec, data_token }
    }

    /// Checks a server role's answer to `group_prepare` and returns its
    /// data addresses; then wait for [`CoordinatorSession::on_workload_ready`].
    /// An agent error leaves the session idle.
    pub fn on_workload_listening(&mut self, reply: Reply) -> Result<Vec<String>, SessionError> {
        self.due(
            CoordinatorState::AwaitWorkloadListening,
            "on_workload_listening",
        )?;
        match reply {
            Reply::WorkloadListening { addrs } => {
                self.state = CoordinatorState::AwaitWorkloadReady;
                Ok(addrs)
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Checks that the agent's workload role is prepared. An agent error
    /// leaves the session idle.
    pub fn on_workload_ready(&mut self, reply: Reply) -> Result<(), SessionError> {
        self.due(CoordinatorState::AwaitWorkloadReady, "on_workload_ready")?;
        match reply {
            Reply::WorkloadReady => {
                self.state = CoordinatorState::WorkloadReady;
                Ok(())
            }
            other => Err(self.reject(&other)),
        }
    }

    /// The barrier: tells a prepared agent to run. Then call
    /// [`CoordinatorSession::on_workload_result`] until it returns
    /// [`WorkloadProgress::Finished`].
    pub fn workload_go(&mut self) -> Request {
        self.sent(
            CoordinatorState::WorkloadReady,
            CoordinatorState::AwaitWorkloadFinished,
            "group_go",
        );
        Request::WorkloadGo
    }

    /// Checks one reply to `group_go`: flow reports and histogram chunks
    /// keep the session waiting, `group_finished` makes it idle again. An
    /// agent error leaves it idle too (the agent dropped its flows).
    pub fn on_workload_result(&mut self, reply: Reply) -> Result<WorkloadProgress, SessionError> {
        self.due(
            CoordinatorState::AwaitWorkloadFinished,
            "on_workload_result",
        )?;
        match reply {
            Reply::WorkloadFlows { flows } => Ok(WorkloadProgress::Flows(flows)),
            Reply::WorkloadAlive => Ok(WorkloadProgress::Alive),
            Reply::WorkloadBuckets { buckets } => Ok(WorkloadProgress::Buckets(buckets)),
            Reply::WorkloadFinished { outcome } => {
                self.state = CoordinatorState::Idle;
                Ok(WorkloadProgress::Finished(Box::new(outcome)))
            }
            other => Err(self.reject(&other)),
        }
    }

    /// Ends the session; valid in any state (an agent that has not seen
    /// `hello` answers with an error). The agent answers [`Reply::Closed`]
    /// and closes; reading that answer with
    /// [`CoordinatorSession::on_bye_reply`] is optional.
    pub fn bye(&mut self) -> Request {
        self.state = CoordinatorState::ByeSent;
        Request::Bye
    }

    /// Optionally checks the agent's answer to `bye` ([`Reply::Closed`]),
    /// confirming it ended the session cleanly. The session is closed after.
    pub fn on_bye_reply(&mut self, reply: Reply) -> Result<(), SessionError> {
        self.due(CoordinatorState::ByeSent, "on_bye_reply")?;
        match reply {
            Reply::Closed => {
                self.state = CoordinatorState::Closed;
                Ok(())
            }
            other => Err(self.reject(&other)),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use crate::codec::{decode_reply, decode_request, encode, FrameDecoder};
    use crate::dataproof::test_token;
    use netgap_core::spec::{Mode, TransportOptions};

    fn host() -> HostFacts {
        HostFacts {
            hostname: "agent-1".into(),
            kernel: "6.8.0".into(),
            cpu_model: "Test CPU".into(),
            cores: 16,
            interface: Some("eth0".into()),
            mtu_bytes: Some(9000),
            sysctls: Default::default(),
            netgap_version: netgap_core::VERSION.into(),
            offloads: None,
            qdisc: None,
        }
    }

    fn spec() -> PointSpec {
        PointSpec {
            test: "stream".into(),
            transport: "unix".into(),
            mode: Mode::Event,
            size_bytes: 4096,
            options: TransportOptions::default(),
            server_cpu: None,
            io_timeout_ms: 1000,
            verify: false,
        }
    }

    /// Sends a request over an in-memory wire: encode, push into a decoder in
    /// two pieces, take the frame out, decode.
    fn wire_request(req: &Request) -> Request {
        let bytes = encode(req).unwrap();
        let mut d = FrameDecoder::new();
        let (a, b) = bytes.split_at(bytes.len() / 2);
        d.push(a);
        assert_eq!(d.next_frame().unwrap(), None);
        d.push(b);
        decode_request(&d.next_frame().unwrap().unwrap()).unwrap()
    }

    fn wire_reply(reply: &Reply) -> Reply {
        let bytes = encode(reply).unwrap();
        let mut d = FrameDecoder::new();
        d.push(&bytes);
        decode_reply(&d.next_frame().unwrap().unwrap()).unwrap()
    }

    /// Expects a plain reply and carries it over the wire.
    fn reply_of(action: AgentAction) -> Reply {
        match action {
            AgentAction::Reply(r) => wire_reply(&r),
            other => panic!("expected a reply, got {other:?}"),
        }
    }

    fn handshake(agent: &mut AgentSession, coord: &mut CoordinatorSession) -> HostFacts {
        let hello = wire_request(&coord.hello());
        let reply = reply_of(agent.on_request(&hello).unwrap());
        coord.on_welcome(reply).unwrap()
    }

    #[test]
    fn handshake_through_the_codec() {
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        assert_eq!(handshake(&mut agent, &mut coord), host());
        assert_eq!(agent.state(), AgentState::Idle);
        assert_eq!(coord.state(), CoordinatorState::Idle);
        assert_eq!(agent.coordinator_version(), Some(netgap_core::VERSION));
        assert_eq!(coord.agent_version(), Some(netgap_core::VERSION));
    }

    #[test]
    fn version_mismatch_on_both_sides() {
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        coord.protocol = PROTOCOL_VERSION + 1;
        let hello = wire_request(&coord.hello());
        let action = agent.on_request(&hello).unwrap();
        assert_eq!(
            action,
            AgentAction::ReplyAndClose(Reply::VersionMismatch {
                supported: PROTOCOL_VERSION
            })
        );
        assert_eq!(agent.state(), AgentState::Closed);
        let AgentAction::ReplyAndClose(reply) = action else {
            unreachable!()
        };
        let err = coord.on_welcome(wire_reply(&reply)).unwrap_err();
        assert_eq!(
            err,
            SessionError::VersionMismatch {
                ours: PROTOCOL_VERSION + 1,
                theirs: PROTOCOL_VERSION
            }
        );
        assert_eq!(coord.state(), CoordinatorState::Closed);
        assert_eq!(
            SessionError::VersionMismatch { ours: 1, theirs: 2 }.to_string(),
            "protocol version mismatch: this netgap speaks 1, the agent speaks 2; \
             run the same netgap version on both hosts"
        );
    }

    #[test]
    fn welcome_with_another_version_is_a_mismatch() {
        let mut coord = CoordinatorSession::new();
        coord.hello();
        let err = coord
            .on_welcome(Reply::Welcome {
                protocol: 9,
                version: "9.0.0".into(),
                host: host(),
            })
            .unwrap_err();
        assert_eq!(
            err,
            SessionError::VersionMismatch {
                ours: PROTOCOL_VERSION,
                theirs: 9
            }
        );
    }

    #[test]
    fn busy_agent() {
        let mut agent = AgentSession::new(host(), true);
        let mut coord = CoordinatorSession::new();
        let hello = wire_request(&coord.hello());
        let AgentAction::ReplyAndClose(reply) = agent.on_request(&hello).unwrap() else {
            panic!("busy agent must close");
        };
        assert_eq!(reply, Reply::Busy);
        assert_eq!(agent.state(), AgentState::Closed);
        let err = coord.on_welcome(wire_reply(&reply)).unwrap_err();
        assert_eq!(err, SessionError::Busy);
        assert_eq!(
            err.to_string(),
            "agent is busy running another test; try again when it is done"
        );
    }

    #[test]
    fn workload_round_through_both_machines() {
        use crate::workload::{sample_spec, FlowReport, WorkloadOutcome, WorkloadRole};
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        // Server role: prepare, listening, ready.
        let prep =
            wire_request(&coord.workload_prepare(sample_spec(WorkloadRole::Server), test_token()));
        let AgentAction::PrepareWorkload(spec) = agent.on_request(&prep).unwrap() else {
            panic!("expected PrepareWorkload");
        };
        assert_eq!(spec.role, WorkloadRole::Server);
        assert_eq!(agent.state(), AgentState::WorkloadPreparing);
        let r = wire_reply(
            &agent
                .workload_listening(vec!["127.0.0.1:9".into()])
                .unwrap(),
        );
        assert_eq!(coord.on_workload_listening(r).unwrap(), vec!["127.0.0.1:9"]);
        // Go before ready is refused by the agent.
        let early = agent.on_request(&Request::WorkloadGo);
        assert!(early.is_err());
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        let prep =
            wire_request(&coord.workload_prepare(sample_spec(WorkloadRole::Client), test_token()));
        agent.on_request(&prep).unwrap();
        let r = wire_reply(&agent.workload_ready().unwrap());
        coord.on_workload_ready(r).unwrap();
        assert_eq!(coord.state(), CoordinatorState::WorkloadReady);
        let go = wire_request(&coord.workload_go());
        assert_eq!(agent.on_request(&go).unwrap(), AgentAction::RunWorkload);
        let flows: Vec<FlowReport> = (0..300)
            .map(|i| FlowReport {
                index: i,
                bytes_tx: 1,
                bytes_rx: 2,
                window_bytes_rx: 2,
                round_trips: 0,
                percentiles: None,
                errors: 0,
            })
            .collect();
        let outcome = WorkloadOutcome {
            window_ns: 5,
            cpu: CpuUsage::default(),
            peak_rss_kib: None,
            processes: None,
            bytes_rx: 0,
            bytes_tx: 0,
            datagrams: None,
            metrics: Default::default(),
            services: Vec::new(),
            last_error: None,
            data_window_ns: None,
        };
        assert_eq!(
            wire_reply(&agent.workload_alive().unwrap()),
            Reply::WorkloadAlive
        );
        assert_eq!(
            coord.on_workload_result(Reply::WorkloadAlive).unwrap(),
            WorkloadProgress::Alive
        );
        let replies = agent
            .workload_finished(flows, vec![[1, 1]; 1500], outcome.clone())
            .unwrap();
        // 300 flows in chunks of 128, 1500 buckets in chunks of 1024, end.
        assert_eq!(replies.len(), 3 + 2 + 1);
        assert_eq!(agent.state(), AgentState::Idle);
        let mut seen = 0;
        for r in replies {
            match coord.on_workload_result(wire_reply(&r)).unwrap() {
                WorkloadProgress::Flows(f) => seen += f.len(),
                WorkloadProgress::Buckets(_) | WorkloadProgress::Alive => {}
                WorkloadProgress::Finished(o) => assert_eq!(*o, outcome),
            }
        }
        assert_eq!(seen, 300);
        assert_eq!(coord.state(), CoordinatorState::Idle);
    }

    #[test]
    fn client_role_round_through_both_machines() {
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        let open = wire_request(&coord.client_open(
            spec(),
            test_token(),
            "10.0.0.1:40000".into(),
            Some(1),
        ));
        let AgentAction::OpenClient {
            spec: s,
            target,
            client_cpu,
        } = agent.on_request(&open).unwrap()
        else {
            panic!("expected OpenClient");
        };
        assert_eq!(
            (s, target.as_str(), client_cpu),
            (spec(), "10.0.0.1:40000", Some(1))
        );
        // A server role's run is refused while the client role opens.
        let mut early = agent.clone();
        assert!(early
            .on_request(&Request::Run {
                iterations: 1,
                phase: Phase::Measure
            })
            .is_err());
        let r = wire_reply(&agent.client_connected(vec!["gso".into()]).unwrap());
        assert_eq!(coord.on_client_connected(r).unwrap(), vec!["gso"]);
        assert_eq!(coord.state(), CoordinatorState::ClientOpen);
        for _ in 0..2 {
            let run = wire_request(&coord.client_run(10, Phase::Measure));
            assert_eq!(
                agent.on_request(&run).unwrap(),
                AgentAction::RunClient {
                    iterations: 10,
                    phase: Phase::Measure
                }
            );
            let alive = wire_reply(&agent.workload_alive().unwrap());
            assert_eq!(
                coord.on_client_result(alive).unwrap(),
                ClientProgress::Alive
            );
            let rep = ClientRep {
                elapsed_ns: 1000,
                value: 2.5,
                bytes_tx: 40,
                bytes_rx: 40,
                cpu: CpuUsage::default(),
                datagrams: None,
            };
            let replies = agent.client_done(rep, vec![[7, 1]; 1500]).unwrap();
            // 1500 buckets in chunks of 1024, then the end.
            assert_eq!(replies.len(), 3);
            let mut buckets = 0;
            for r in replies {
                match coord.on_client_result(wire_reply(&r)).unwrap() {
                    ClientProgress::Buckets(b) => buckets += b.len(),
                    ClientProgress::Alive => panic!("alive after the end"),
                    ClientProgress::Done(d) => assert_eq!(d, rep),
                }
            }
            assert_eq!(buckets, 1500);
            assert_eq!(agent.state(), AgentState::ClientOpen);
        }
        let close = wire_request(&coord.close());
        assert_eq!(agent.on_request(&close).unwrap(), AgentAction::ClosePoint);
        coord
            .on_closed(wire_reply(&agent.closed().unwrap()))
            .unwrap();
        assert_eq!(agent.state(), AgentState::Idle);
        assert_eq!(coord.state(), CoordinatorState::Idle);
    }

    #[test]
    fn a_client_role_that_cannot_connect_leaves_both_sessions_usable() {
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        let open =
            wire_request(&coord.client_open(spec(), test_token(), "10.0.0.1:1".into(), None));
        agent.on_request(&open).unwrap();
        let err = wire_reply(&agent.failed("connection refused"));
        assert_eq!(agent.state(), AgentState::Idle);
        assert_eq!(
            coord.on_client_connected(err).unwrap_err(),
            SessionError::Remote("connection refused".into())
        );
        assert_eq!(coord.state(), CoordinatorState::Idle);
        // A failed repetition closes both: the agent dropped the flow.
        let open =
            wire_request(&coord.client_open(spec(), test_token(), "10.0.0.1:2".into(), None));
        agent.on_request(&open).unwrap();
        coord
            .on_client_connected(wire_reply(&agent.client_connected(Vec::new()).unwrap()))
            .unwrap();
        let run = wire_request(&coord.client_run(1, Phase::Warmup));
        agent.on_request(&run).unwrap();
        let err = wire_reply(&agent.failed("no data moved"));
        assert_eq!(agent.state(), AgentState::Closed);
        assert!(coord.on_client_result(err).is_err());
        assert_eq!(coord.state(), CoordinatorState::Closed);
    }

    #[test]
    fn workload_error_leaves_both_sessions_usable() {
        use crate::workload::{sample_spec, WorkloadRole};
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        let prep =
            wire_request(&coord.workload_prepare(sample_spec(WorkloadRole::Client), test_token()));
        agent.on_request(&prep).unwrap();
        let err = wire_reply(&agent.failed("cannot connect flow 0"));
        assert_eq!(agent.state(), AgentState::Idle);
        assert!(matches!(
            coord.on_workload_ready(err),
            Err(SessionError::Remote(m)) if m.contains("flow 0")
        ));
        assert_eq!(coord.state(), CoordinatorState::Idle);
    }

    #[test]
    fn workload_limits_are_refused_before_the_role_runs() {
        use crate::workload::{sample_spec, WorkloadRole, MAX_WORKLOAD_FLOWS};
        let mut spec = sample_spec(WorkloadRole::Client);
        spec.flows = MAX_WORKLOAD_FLOWS + 1;
        let bytes = encode(&Request::WorkloadPrepare {
            spec,
            data_token: test_token(),
        })
        .unwrap();
        let mut d = FrameDecoder::new();
        d.push(&bytes);
        let err = decode_request(&d.next_frame().unwrap().unwrap()).unwrap_err();
        assert!(err.to_string().contains("flows"), "{err}");
    }

    #[test]
    fn run_before_open_is_refused() {
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        let run = Request::Run {
            iterations: 10,
            phase: Phase::Measure,
        };
        let err = agent.on_request(&wire_request(&run)).unwrap_err();
        assert_eq!(
            err,
            SessionError::Unexpected {
                state: "idle",
                got: "run"
            }
        );
        assert_eq!(agent.state(), AgentState::Closed);
        // The caller sends the error reply, which carries the message.
        let reply = wire_reply(&agent.failed(&err.to_string()));
        assert_eq!(
            reply,
            Reply::Error {
                message: "protocol error: unexpected run message in session state idle".into()
            }
        );
        assert_eq!(agent.state(), AgentState::Closed);
    }

    #[test]
    fn coordinator_misuse_is_reported() {
        let mut coord = CoordinatorSession::new();
        coord.hello();
        coord
            .on_welcome(Reply::Welcome {
                protocol: PROTOCOL_VERSION,
                version: "0.1.0".into(),
                host: host(),
            })
            .unwrap();
        coord.run(10, Phase::Measure);
        let err = coord.on_done(Reply::Accepted).unwrap_err();
        assert_eq!(
            err,
            SessionError::Misuse {
                state: "idle",
                call: "run"
            }
        );
        // Calling the wrong on_* is misuse too.
        let mut coord = CoordinatorSession::new();
        coord.hello();
        assert!(matches!(
            coord.on_listening(Reply::Listening { addr: "x".into() }),
            Err(SessionError::Misuse {
                call: "on_listening",
                ..
            })
        ));
    }

    #[test]
    fn out_of_order_requests_are_refused() {
        let bye_first = AgentSession::new(host(), false).on_request(&Request::Bye);
        assert_eq!(
            bye_first,
            Err(SessionError::Unexpected {
                state: "await_hello",
                got: "bye"
            })
        );
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        let mut twice = agent.clone();
        assert!(matches!(
            twice.on_request(&coord.clone().hello()),
            Err(SessionError::Unexpected { got: "hello", .. })
        ));
        // Open while a point is open.
        agent
            .on_request(&Request::Open {
                spec: spec(),
                data_token: test_token(),
            })
            .unwrap();
        agent.listening("127.0.0.1:1".into()).unwrap();
        agent.accepted().unwrap();
        assert_eq!(
            agent.on_request(&Request::Open {
                spec: spec(),
                data_token: test_token()
            }),
            Err(SessionError::Unexpected {
                state: "open",
                got: "open"
            })
        );
        assert_eq!(agent.state(), AgentState::Closed);
        // Any request is refused once closed.
        assert!(agent.on_request(&Request::Close).is_err());
    }

    #[test]
    fn agent_caller_misuse_is_an_error() {
        let mut agent = AgentSession::new(host(), false);
        assert_eq!(
            agent.accepted(),
            Err(SessionError::Misuse {
                state: "await_hello",
                call: "accepted"
            })
        );
        assert!(agent.listening("x".into()).is_err());
        assert!(agent.role_done(0, 0, CpuUsage::default(), None).is_err());
        assert!(agent.closed().is_err());
        assert_eq!(agent.state(), AgentState::AwaitHello);
    }

    #[test]
    fn failure_before_the_flow_keeps_the_session() {
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);
        let open = wire_request(&coord.open(spec(), test_token()));
        assert!(matches!(
            agent.on_request(&open).unwrap(),
            AgentAction::OpenPoint(_)
        ));
        let reply = wire_reply(&agent.failed("unknown transport \"unix\"\nsecond line"));
        assert_eq!(agent.state(), AgentState::Idle);
        let err = coord.on_listening(reply).unwrap_err();
        assert_eq!(
            err.to_string(),
            "agent error: unknown transport \"unix\"\\nsecond line"
        );
        assert_eq!(coord.state(), CoordinatorState::Idle);
        // Both can go on with another point.
        let open = wire_request(&coord.open(spec(), test_token()));
        assert!(agent.on_request(&open).is_ok());
    }

    #[test]
    fn failure_with_a_flow_closes_the_session() {
        let mut agent = AgentSession::new(host(), false);
        agent
            .on_request(&Request::Hello {
                protocol: PROTOCOL_VERSION,
                version: "x".into(),
            })
            .unwrap();
        agent
            .on_request(&Request::Open {
                spec: spec(),
                data_token: test_token(),
            })
            .unwrap();
        agent.listening("a".into()).unwrap();
        agent.accepted().unwrap();
        agent
            .on_request(&Request::Run {
                iterations: 1,
                phase: Phase::Warmup,
            })
            .unwrap();
        let reply = agent.failed(&"z".repeat(5000));
        assert_eq!(agent.state(), AgentState::Closed);
        assert!(reply.validate().is_ok(), "message is cut to fit");
    }

    #[test]
    fn full_point_lifecycle() {
        let mut agent = AgentSession::new(host(), false);
        let mut coord = CoordinatorSession::new();
        handshake(&mut agent, &mut coord);

        let open = wire_request(&coord.open(spec(), test_token()));
        assert_eq!(
            agent.on_request(&open).unwrap(),
            AgentAction::OpenPoint(spec())
        );
        assert_eq!(agent.state(), AgentState::Opening);
        let reply = wire_reply(&agent.listening("/tmp/netgap.sock".into()).unwrap());
        assert_eq!(agent.state(), AgentState::Listening);
        assert_eq!(coord.on_listening(reply).unwrap(), "/tmp/netgap.sock");
        let reply = wire_reply(&agent.accepted().unwrap());
        assert_eq!(agent.state(), AgentState::Open);
        coord.on_accepted(reply).unwrap();
        assert_eq!(coord.state(), CoordinatorState::Open);

        let phases = [Phase::Warmup, Phase::Measure, Phase::Measure];
        for (i, phase) in phases.into_iter().enumerate() {
            let iterations = 100 * (i as u64 + 1);
            let run = wire_request(&coord.run(iterations, phase));
            assert_eq!(
                agent.on_request(&run).unwrap(),
                AgentAction::RunRole { iterations, phase }
            );
            assert_eq!(agent.state(), AgentState::Running);
            let cpu = CpuUsage {
                system_busy_percent: 6.25,
                process_percent: 50.0,
                cpu_ns: 500,
                wall_ns: 1000,
                softirq_percent: Some(1.5),
            };
            let bytes = iterations * 4096;
            // An unreliable flow's counters travel too; a reliable one has none.
            let datagrams = (i == 1).then_some(DatagramStats {
                datagrams_sent: 7,
                datagrams_received: 9,
                lost: 1,
                lost_bytes: 4096,
                reordered: 1,
                duplicates: 2,
                retries: 3,
                dropped: 5,
            });
            let reply = wire_reply(&agent.role_done(bytes, bytes, cpu, datagrams).unwrap());
            assert_eq!(
                coord.on_done(reply).unwrap(),
                (bytes, bytes, cpu, datagrams)
            );
            assert_eq!(agent.state(), AgentState::Open);
            assert_eq!(coord.state(), CoordinatorState::Open);
        }

        let close = wire_request(&coord.close());
        assert_eq!(agent.on_request(&close).unwrap(), AgentAction::ClosePoint);
        assert_eq!(agent.state(), AgentState::Closing);
        coord
            .on_closed(wire_reply(&agent.closed().unwrap()))
            .unwrap();
        assert_eq!(agent.state(), AgentState::Idle);
        assert_eq!(coord.state(), CoordinatorState::Idle);

        let bye = wire_request(&coord.bye());
        let action = agent.on_request(&bye).unwrap();
        assert_eq!(action, AgentAction::ReplyAndClose(Reply::Closed));
        assert_eq!(agent.state(), AgentState::Closed);
        let AgentAction::ReplyAndClose(reply) = action else {
            unreachable!()
        };
        coord.on_bye_reply(wire_reply(&reply)).unwrap();
        assert_eq!(coord.state(), CoordinatorState::Closed);
    }

    #[test]
    fn wrong_reply_is_unexpected() {
        let mut coord = CoordinatorSession::new();
        coord.hello();
        assert_eq!(
            coord.on_welcome(Reply::Accepted),
            Err(SessionError::Unexpected {
                state: "await_welcome",
                got: "accepted"
            })
        );
        assert_eq!(coord.state(), CoordinatorState::Closed);
        let mut coord = CoordinatorSession::new();
        coord.hello();
        assert_eq!(
            coord.on_welcome(Reply::Error {
                message: "no".into()
            }),
            Err(SessionError::Remote("no".into()))
        );
    }

    #[test]
    fn kinds_match_the_wire_tags() {
        let reqs = [
            Request::Hello {
                protocol: 1,
                version: String::new(),
            },
            Request::Open {
                spec: spec(),
                data_token: test_token(),
            },
            Request::Run {
                iterations: 1,
                phase: Phase::Measure,
            },
            Request::Close,
            Request::Bye,
        ];
        for r in reqs {
            let json = serde_json::to_string(&r).unwrap();
            assert!(
                json.starts_with(&format!("\"{}\"", r.kind()))
                    || json.starts_with(&format!("{{\"{}\"", r.kind())),
                "{json}"
            );
        }
        let replies = [
            Reply::Welcome {
                protocol: 1,
                version: String::new(),
                host: host(),
            },
            Reply::VersionMismatch { supported: 2 },
            Reply::Busy,
            Reply::Listening {
                addr: String::new(),
            },
            Reply::Accepted,
            Reply::Done {
                bytes_rx: 0,
                bytes_tx: 0,
                cpu: CpuUsage::default(),
                datagrams: None,
            },
            Reply::Closed,
            Reply::Error {
                message: String::new(),
            },
        ];
        for r in replies {
            let json = serde_json::to_string(&r).unwrap();
            assert!(
                json.starts_with(&format!("\"{}\"", r.kind()))
                    || json.starts_with(&format!("{{\"{}\"", r.kind())),
                "{json}"
            );
        }
    }
}
