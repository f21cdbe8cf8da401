//! The agent's end of a control connection: [`AgentSession`], what it asks
//! its caller to do ([`AgentAction`]) and its states.

use crate::codec::one_line;
use crate::message::{ClientRep, Phase, Reply, Request, MAX_TEXT_BYTES, PROTOCOL_VERSION};
use crate::workload::{
    FlowReport, WorkloadOutcome, WorkloadSpec, BUCKETS_PER_CHUNK, FLOWS_PER_CHUNK,
};
use netgap_core::cpu::CpuUsage;
use netgap_core::datagram::DatagramStats;
use netgap_core::host::HostFacts;
use netgap_core::spec::PointSpec;
use std::fmt;

use super::SessionError;

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
