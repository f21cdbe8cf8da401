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

mod agent;
mod coordinator;
#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests;

pub use agent::{AgentAction, AgentSession, AgentState};
pub use coordinator::{ClientProgress, CoordinatorSession, CoordinatorState, WorkloadProgress};

use crate::message::{Reply, Request};

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
        /// [`PROTOCOL_VERSION`](crate::message::PROTOCOL_VERSION) of this side.
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
