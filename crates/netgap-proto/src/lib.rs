//! The control protocol between a coordinator and an agent, with no I/O.
//!
//! This crate sits above `netgap-core` (the data it carries) and below
//! everything that touches a socket; it cannot import the transports, so a
//! message can never grow a dependency on how bytes move.
//!
//! The coordinator tells an agent which point to prepare, when to run a
//! repetition and when to close; the agent answers with what it did. This
//! crate only turns messages into bytes and back ([`codec`]) and decides
//! which message may come when ([`session`]); it never touches a socket, a
//! clock or a thread. The agent and the coordinator put the sockets at the
//! edge: they read bytes into a [`FrameDecoder`], hand decoded messages to
//! an [`AgentSession`] or a [`CoordinatorSession`], carry out the action the
//! session asks for, and write the encoded answer back.
//!
//! Everything here is driven by peer input and never panics on it: a
//! malformed or out-of-order message is a typed [`CodecError`] or
//! [`SessionError`] whose message says what failed.

pub mod auth;
pub mod codec;
pub mod dataproof;
pub mod direct;
pub mod limits;
pub mod message;
pub mod preload;
pub mod relay;
pub mod session;
pub mod workload;

pub use codec::{
    decode_reply, decode_request, encode, CodecError, FrameDecoder, HEADER_BYTES,
    MAX_BUFFERED_BYTES, MAX_FRAME_BYTES,
};
pub use message::{ClientRep, Phase, Reply, Request, MAX_TEXT_BYTES, PROTOCOL_VERSION};
pub use session::{
    AgentAction, AgentSession, AgentState, ClientProgress, CoordinatorSession, CoordinatorState,
    SessionError, WorkloadProgress,
};
