//! The headline metric of every kind of test: its key in results (with
//! the unit in the name) and how the values of concurrent flows combine
//! into one repetition's headline.

/// The headline metric of a test, a workload or an MPI test, with its unit
/// in the name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Metric {
    /// Payload bandwidth in Gbit/s (10^9 bit/s); of concurrent flows, the
    /// sum of what they received in the window.
    BandwidthGbps,
    /// One-way latency in microseconds (half the round trip); of several
    /// clients, their mean.
    LatencyUs,
    /// Connections opened, used and closed per second, all clients together.
    ConnectionsPerS,
    /// A workload's own headline (`transactions_per_s`, `query_time_ms`):
    /// its key, with the unit in the name, and how a repetition's per-flow
    /// values combine into it.
    Other {
        /// The metric's key in results; a name ending in `_us`, `_ms` or
        /// `_ns` is a time, where lower is better.
        key: &'static str,
        /// How the flows' values combine.
        combine: Combine,
    },
}

/// How a repetition's per-flow values combine into its headline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Combine {
    /// Their sum (rates of concurrent flows).
    Sum,
    /// Their mean (each flow's time of the same job).
    Mean,
    /// The largest (the slowest flow's time of a job they share).
    Max,
}

impl Metric {
    /// The metric's key in results.
    pub fn key(self) -> &'static str {
        match self {
            Metric::BandwidthGbps => "bandwidth_gbps",
            Metric::LatencyUs => "latency_us",
            Metric::ConnectionsPerS => "connections_per_s",
            Metric::Other { key, .. } => key,
        }
    }

    /// A repetition's headline from its per-flow values: the sum (aggregate
    /// bandwidth, connections per second) or the mean over clients
    /// (latency). `None` if a client has no latency (no round trip in the
    /// window).
    pub fn headline(self, values: &[f64]) -> Option<f64> {
        let combine = match self {
            Metric::BandwidthGbps | Metric::ConnectionsPerS => Combine::Sum,
            Metric::LatencyUs => Combine::Mean,
            Metric::Other { combine, .. } => combine,
        };
        match combine {
            Combine::Sum => Some(values.iter().sum()),
            Combine::Mean | Combine::Max => {
                if values.is_empty() || values.iter().any(|v| !v.is_finite()) {
                    return None;
                }
                if combine == Combine::Max {
                    return values.iter().copied().reduce(f64::max);
                }
                Some(values.iter().sum::<f64>() / values.len() as f64)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headline_sums_bandwidth_and_averages_latency() {
        use Metric::*;
        assert_eq!(BandwidthGbps.headline(&[1.0, 2.0, 3.0]), Some(6.0));
        assert_eq!(ConnectionsPerS.headline(&[10.0, 5.0]), Some(15.0));
        assert_eq!(LatencyUs.headline(&[10.0, 20.0]), Some(15.0));
        assert_eq!(LatencyUs.headline(&[10.0, f64::NAN]), None);
        assert_eq!(LatencyUs.headline(&[]), None);
    }
}
