//! Measurement: tests and plans. The runner that times the repetitions of
//! a point-to-point test ([`runner`], [`point_loop`]), the runs of the
//! multi-host workloads of `netgap_workload` ([`workload_run`]), the
//! validated plans ([`plan`]), the coordinators that drive agents over
//! their control connections ([`coordinator`], [`workload_run`]), the sweep
//! and LogP commands, interleaved comparison ([`interleave`]), Slurm host
//! lists ([`hostlist`], [`cluster`]), and the sinks and table that each
//! measured point goes to ([`sink`], [`output`]).
//!
//! The tests' roles are `netgap_bench`'s and the agent with its control
//! connection is `netgap_agent`'s; both are re-exported here under their
//! old paths ([`bench`](mod@bench), [`agent`], [`auth`], [`control`],
//! [`handshake`]).
//!
//! Data flows one way: a validated [`plan`] becomes points, the
//! [`coordinator`] drives an [`agent`] through `netgap_proto`, the [`runner`]
//! times repetitions of a [`bench`](mod@bench) test over a
//! `netgap_transport` transport, and each measured point becomes a
//! `netgap_core::record::ResultRecord` written to every [`sink`] the moment
//! it is measured.

pub mod cluster;
pub mod conditions;
pub mod coordinator;
pub mod hostlist;
pub mod interleave;
pub mod logp;
pub mod output;
pub mod plan;
pub mod point_loop;
pub mod run;
pub mod runner;
pub mod sink;
pub mod sweep;
#[cfg(test)]
mod test_support;
pub mod workload_run;

// The agent, its control connection and the tests' roles live in crates of
// their own; their old paths here keep working.
pub use netgap_agent::{agent, auth, control, handshake};
pub use netgap_bench as bench;
