//! The agent and its control connection: control addresses and framed
//! messages on sockets ([`control`]), key files and proofs on them
//! ([`auth`]), the coordinator's side of the authenticated handshake
//! ([`handshake`]), who may start what (`admission`), and the daemon that
//! serves sessions ([`agent`]).

mod admission;
pub mod agent;
pub mod auth;
pub mod control;
pub mod handshake;
