//! The agent and its control, one job: a control connection that is
//! authenticated and admitted, and the agent daemon that serves it.
//!
//! Control addresses and framed messages on TCP or Unix-domain sockets
//! ([`control`]), key files and the key proof on a socket ([`auth`]), the
//! coordinator's side of the authenticated handshake ([`handshake`]: both
//! ends of one protocol stay together), who may start what and the budgets
//! of connections that have not proven the key yet (`admission`), and the
//! daemon that runs `netgap_proto`'s session machine on those sockets
//! ([`agent`]). The session machines themselves do no I/O and live in
//! `netgap_proto`; the roles an agent opens for a point are `netgap_bench`'s
//! tests or `netgap_workload`'s roles. The runner, plans and coordinators
//! that drive an agent are `netgap_measure`'s, which this crate cannot see.

mod admission;
pub mod agent;
pub mod auth;
pub mod control;
pub mod handshake;
