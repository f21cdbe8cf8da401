//! Multi-host (group) tests: one server host and client hosts driven
//! together by the coordinator.
//!
//! A [`plan::GroupPlan`] lists the points; the [`coordinator`] connects to
//! every host's agent, places the server role and the client roles
//! ([`allot`]: clients spread cyclically over the client hosts), prepares
//! them all, starts every flow at once (a barrier) and gathers per-flow and
//! aggregate results into one record per point. On each agent, [`role`]
//! runs the flows: a thread per flow for bandwidth work over any
//! cross-host transport, the epoll flows engine ([`engine`]) for the
//! thousands of flows of `hotspot` and `connect`.
//!
//! Adding a group test is one entry in [`registry`].

pub mod allot;
pub mod coordinator;
pub mod engine;
pub mod plan;
pub mod role;
pub mod summary;

use netgap_proto::group::{Direction, GroupWork};

/// The headline metric of a group test.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GroupMetric {
    /// Aggregate payload bandwidth received in the window, Gbit/s.
    BandwidthGbps,
    /// Mean one-way latency over all clients, µs.
    LatencyUs,
    /// Connections opened, used and closed per second, all clients together.
    ConnectionsPerS,
}

impl GroupMetric {
    /// The metric's key in results.
    pub fn key(self) -> &'static str {
        match self {
            GroupMetric::BandwidthGbps => "bandwidth_gbps",
            GroupMetric::LatencyUs => "latency_us",
            GroupMetric::ConnectionsPerS => "connections_per_s",
        }
    }
}

/// How a test places its flows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    /// `--clients N` flows spread cyclically over every client host.
    Spread,
    /// `--streams P` flows from the first client host.
    Streams,
    /// One flow per link between the first client host and the server,
    /// each bound to its link's addresses.
    Rails,
}

/// What each flow of a test does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Bandwidth, one way.
    Stream(Direction),
    /// Back-to-back ping-pong (flows engine).
    PingPong,
    /// Connect, exchange, close (flows engine).
    Connect,
}

/// A group test: a name, a placement and the work of its flows.
#[derive(Debug, Clone, Copy)]
pub struct GroupTest {
    /// Name on the command line and in results.
    pub name: &'static str,
    /// One line for `netgap list`.
    pub summary: &'static str,
    /// Headline metric.
    pub metric: GroupMetric,
    /// Placement of flows.
    pub shape: Shape,
    /// Work of each flow.
    pub kind: Kind,
}

impl GroupTest {
    /// The work of every flow of a point of `size_bytes`.
    pub fn work(&self, size_bytes: u64) -> GroupWork {
        match self.kind {
            Kind::Stream(direction) => GroupWork::Stream {
                size_bytes,
                direction,
            },
            Kind::PingPong => GroupWork::PingPong { size_bytes },
            Kind::Connect => GroupWork::Connect {
                request_bytes: size_bytes,
                reply_bytes: size_bytes,
            },
        }
    }

    /// Whether the test runs on the flows engine (tcp only).
    pub fn uses_engine(&self) -> bool {
        !matches!(self.kind, Kind::Stream(_))
    }
}

/// Every group test, in the order `netgap list` shows them.
pub fn registry() -> &'static [GroupTest] {
    &[
        GroupTest {
            name: "multistream",
            summary: "-P N parallel streams from one client host to the server; aggregate bandwidth",
            metric: GroupMetric::BandwidthGbps,
            shape: Shape::Streams,
            kind: Kind::Stream(Direction::ToServer),
        },
        GroupTest {
            name: "hotspot",
            summary: "N clients run pingpong against one server at once; mean and per-client latency",
            metric: GroupMetric::LatencyUs,
            shape: Shape::Spread,
            kind: Kind::PingPong,
        },
        GroupTest {
            name: "fanin",
            summary: "N clients stream to one server at once; aggregate and per-flow bandwidth",
            metric: GroupMetric::BandwidthGbps,
            shape: Shape::Spread,
            kind: Kind::Stream(Direction::ToServer),
        },
        GroupTest {
            name: "fanout",
            summary: "one server streams to N clients at once; aggregate and per-flow bandwidth",
            metric: GroupMetric::BandwidthGbps,
            shape: Shape::Spread,
            kind: Kind::Stream(Direction::FromServer),
        },
        GroupTest {
            name: "connect",
            summary: "N clients open a connection, exchange one request and reply, close; connections/s",
            metric: GroupMetric::ConnectionsPerS,
            shape: Shape::Spread,
            kind: Kind::Connect,
        },
        GroupTest {
            name: "multirail",
            summary: "one client process streams over every link to the server at once; per-link bandwidth",
            metric: GroupMetric::BandwidthGbps,
            shape: Shape::Rails,
            kind: Kind::Stream(Direction::ToServer),
        },
    ]
}

/// The group test called `name`, if there is one.
pub fn find(name: &str) -> Option<&'static GroupTest> {
    registry().iter().find(|t| t.name == name)
}

/// Names of all group tests, comma separated.
pub fn names() -> String {
    registry()
        .iter()
        .map(|t| t.name)
        .collect::<Vec<_>>()
        .join(", ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_not_point_to_point_tests() {
        for t in registry() {
            assert_eq!(find(t.name).map(|f| f.name), Some(t.name));
            assert!(crate::bench::find(t.name).is_none(), "{}", t.name);
            netgap_core::spec::check_name("test", t.name).expect("valid wire name");
        }
    }
}
