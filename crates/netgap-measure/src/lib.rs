//! Measurement: what netgap measures and how. The point-to-point tests
//! ([`bench`](mod@bench)) and the runner that times their repetitions
//! ([`runner`]), the runs of the multi-host workloads of `netgap_workload` ([`workload_run`]), the validated plans
//! ([`plan`]), the coordinator and agent that put the control protocol on
//! sockets ([`coordinator`], [`agent`], [`control`], [`auth`]), the sweep
//! and LogP commands, and the sinks and table that each measured point goes
//! to ([`sink`], [`output`]).
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
