//! The plain data of netgap, with no I/O: units and their parsing, the
//! statistics of repetitions, the validated description of a point, host
//! facts and CPU readings as data, and the result model that every results
//! file holds. Every other crate builds on this one; it depends on none of
//! them. The one exception to "no I/O" is [`files`], the bounded reader
//! every crate uses for a file a user or a peer names: it only opens and
//! reads.

pub mod cpu;
pub mod datagram;
pub mod diagnose;
pub mod dropout;
pub mod files;
pub mod framing;
pub mod host;
pub mod hosts;
pub mod link;
pub mod load;
pub mod metric;
pub mod noise;
pub mod physics;
pub mod record;
pub mod registry;
pub mod sizing;
pub mod spec;
pub mod stack;
pub mod stats;
pub mod study;
pub mod text;
pub mod units;

/// netgap's version, recorded in every result.
pub const VERSION: &str = env!("CARGO_PKG_VERSION");
