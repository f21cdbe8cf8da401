//! The three MPI tests, named as OSU users know them (`osu_latency`,
//! `osu_bw`, `osu_bibw`), and the point-to-point test each one is the MPI
//! counterpart of: their records carry that test's name with transport
//! `mpi`, so a report draws MPI beside the sockets of the same run (and
//! beside imported OSU output, which `netgap import osu` names alike).

use netgap_core::units::gbps;

/// One MPI test.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MpiTest {
    /// Blocking send and receive ping-pong; half the round trip.
    Latency,
    /// A window of non-blocking sends, then a short acknowledgment.
    Bandwidth,
    /// Both ranks send a window to each other at once.
    Bidirectional,
}

/// Messages in flight per window of the bandwidth tests (OSU's default).
pub const WINDOW: u64 = 64;

impl MpiTest {
    /// Every MPI test, in `netgap list` order.
    pub const ALL: [MpiTest; 3] = [MpiTest::Latency, MpiTest::Bandwidth, MpiTest::Bidirectional];

    /// The name `netgap run` takes.
    pub fn name(self) -> &'static str {
        match self {
            MpiTest::Latency => "mpi-latency",
            MpiTest::Bandwidth => "mpi-bw",
            MpiTest::Bidirectional => "mpi-bibw",
        }
    }

    /// The test its records are named after (transport `mpi`).
    pub fn record_test(self) -> &'static str {
        match self {
            MpiTest::Latency => "pingpong",
            MpiTest::Bandwidth => "stream",
            MpiTest::Bidirectional => "bibw",
        }
    }

    /// The headline metric.
    pub fn metric(self) -> netgap_core::metric::Metric {
        match self {
            MpiTest::Latency => netgap_core::metric::Metric::LatencyUs,
            MpiTest::Bandwidth | MpiTest::Bidirectional => {
                netgap_core::metric::Metric::BandwidthGbps
            }
        }
    }

    /// One line for `netgap list`.
    pub fn summary(self) -> &'static str {
        match self {
            MpiTest::Latency => {
                "MPI blocking send/receive ping-pong, half the round trip (osu_latency's method)"
            }
            MpiTest::Bandwidth => {
                "MPI window of 64 non-blocking sends, then an acknowledgment (osu_bw's method)"
            }
            MpiTest::Bidirectional => {
                "MPI windows of 64 non-blocking sends both ways at once (osu_bibw's method)"
            }
        }
    }

    /// The test called `name`, by its `netgap run` name or its record name.
    pub fn find(name: &str) -> Option<MpiTest> {
        MpiTest::ALL
            .into_iter()
            .find(|t| t.name() == name || t.record_test() == name)
    }

    /// The test called `name` on the command line (`mpi-latency`, ...).
    pub fn by_name(name: &str) -> Option<MpiTest> {
        MpiTest::ALL.into_iter().find(|t| t.name() == name)
    }

    /// The repetition's headline value from `iterations` iterations of
    /// `size_bytes` that took `elapsed_ns`: one-way latency in µs, or
    /// payload bandwidth in Gbit/s (10^9 bit/s).
    pub fn value(self, size_bytes: u64, iterations: u64, elapsed_ns: u64) -> f64 {
        let elapsed_ns = elapsed_ns.max(1) as f64;
        let iterations = iterations as f64;
        match self {
            MpiTest::Latency => elapsed_ns / 1_000.0 / (2.0 * iterations),
            MpiTest::Bandwidth => gbps(iterations * (WINDOW * size_bytes) as f64, elapsed_ns),
            MpiTest::Bidirectional => {
                gbps(2.0 * iterations * (WINDOW * size_bytes) as f64, elapsed_ns)
            }
        }
    }

    /// Payload bytes rank 0 sends and receives in `iterations` iterations
    /// of `size_bytes` (the acknowledgment of `mpi-bw` not counted).
    pub fn bytes(self, size_bytes: u64, iterations: u64) -> (u64, u64) {
        let per = size_bytes.saturating_mul(iterations);
        match self {
            MpiTest::Latency => (per, per),
            MpiTest::Bandwidth => (per.saturating_mul(WINDOW), 0),
            MpiTest::Bidirectional => (per.saturating_mul(WINDOW), per.saturating_mul(WINDOW)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_map_both_ways_and_values_follow_osu() {
        for t in MpiTest::ALL {
            assert_eq!(MpiTest::find(t.name()), Some(t));
            assert_eq!(MpiTest::find(t.record_test()), Some(t));
            assert_eq!(MpiTest::by_name(t.name()), Some(t));
        }
        assert_eq!(MpiTest::by_name("pingpong"), None);
        // 1000 round trips in 20 ms: 10 µs one way.
        assert!((MpiTest::Latency.value(1, 1000, 20_000_000) - 10.0).abs() < 1e-9);
        // 10 windows of 64 KiB messages in 1 ms.
        let gbps = MpiTest::Bandwidth.value(1024, 10, 1_000_000);
        assert!((gbps - 10.0 * 64.0 * 1024.0 * 8.0 / 1e6).abs() < 1e-9);
        assert!((MpiTest::Bidirectional.value(1024, 10, 1_000_000) - 2.0 * gbps).abs() < 1e-9);
        assert_eq!(MpiTest::Bandwidth.bytes(10, 2), (1280, 0));
    }
}
