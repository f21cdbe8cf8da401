//! The coordinator's end of a control connection: [`CoordinatorSession`],
//! its states and the progress of a workload or client role it reports.

use crate::codec::one_line;
use crate::dataproof::DataToken;
use crate::message::{ClientRep, Phase, Reply, Request, MAX_TEXT_BYTES, PROTOCOL_VERSION};
use crate::workload::{FlowReport, WorkloadOutcome, WorkloadRole, WorkloadSpec};
use netgap_core::cpu::CpuUsage;
use netgap_core::datagram::DatagramStats;
use netgap_core::host::HostFacts;
use netgap_core::spec::PointSpec;
use std::fmt;

use super::SessionError;

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
    pub(super) protocol: u32,
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
