//! netgap characterizes communication stacks and shows the gap between them.
//!
//! Data flows one way: a validated [`plan`] becomes points, the
//! [`coordinator`] drives an [`agent`] through the control [`proto`]col,
//! the [`runner`] times repetitions of a [`bench`](mod@bench) test over a
//! [`transport`], and each measured point becomes a [`record`] appended to
//! the results file the moment it is measured.

pub mod affinity;
pub mod agent;
pub mod auth;
pub mod bench;
pub mod cluster;
pub mod compare;
pub mod control;
pub mod coordinator;
pub mod cpu;
pub mod dropout;
pub mod flows;
pub mod group;
pub mod host;
pub mod import;
pub mod limits;
pub mod logp;
pub mod output;
pub mod plan;
pub mod proto;
pub mod record;
pub mod report;
pub mod runner;
pub mod sizing;
pub mod spec;
pub mod stats;
pub mod sweep;
pub mod testbed;
pub mod transport;
pub mod units;

/// netgap's version, recorded in every result.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
