//! CPU cost of a measurement as data: the busy share of the host and the CPU
//! time of netgap's own threads over one measured interval. Measuring it is
//! the data path's business (`netgap_transport::cpu`); this module only holds
//! and combines the readings.

use serde::{Deserialize, Serialize};

/// CPU usage over one measured interval.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CpuUsage {
    /// Busy share of all CPUs of the host over the interval, 0..=100.
    pub system_busy_percent: f64,
    /// CPU time of the role's threads as a percent of one core (may exceed 100
    /// when a role uses several threads).
    pub process_percent: f64,
    /// CPU time of the role's threads in nanoseconds.
    pub cpu_ns: u64,
    /// Wall-clock length of the interval in nanoseconds.
    pub wall_ns: u64,
    /// Share of all CPUs of the host the kernel spent in softirq over the
    /// interval, 0..=100, part of `system_busy_percent`: its packet
    /// processing (receiving, and on a testbed forwarding and shaping for
    /// every namespace, `ksoftirqd` included). Absent in readings made
    /// before it was recorded, never guessed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softirq_percent: Option<f64>,
}

impl CpuUsage {
    /// Combines the usage of several intervals: the field-wise mean of
    /// `system_busy_percent`, `process_percent` and `softirq_percent` (this
    /// one only when every sample has it), and the sums (saturating) of
    /// `cpu_ns` and `wall_ns`. An empty slice gives all zeros.
    pub fn mean(samples: &[CpuUsage]) -> CpuUsage {
        if samples.is_empty() {
            return CpuUsage::default();
        }
        let n = samples.len() as f64;
        let softirq: Option<Vec<f64>> = samples.iter().map(|s| s.softirq_percent).collect();
        CpuUsage {
            system_busy_percent: samples.iter().map(|s| s.system_busy_percent).sum::<f64>() / n,
            process_percent: samples.iter().map(|s| s.process_percent).sum::<f64>() / n,
            cpu_ns: samples
                .iter()
                .fold(0u64, |acc, s| acc.saturating_add(s.cpu_ns)),
            wall_ns: samples
                .iter()
                .fold(0u64, |acc, s| acc.saturating_add(s.wall_ns)),
            softirq_percent: softirq.map(|v| v.iter().sum::<f64>() / n),
        }
    }

    /// Whether every percentage is a finite number, as a reading from a
    /// peer must be before it is used.
    pub fn is_finite(&self) -> bool {
        self.system_busy_percent.is_finite()
            && self.process_percent.is_finite()
            && self.softirq_percent.is_none_or(f64::is_finite)
    }

    /// Service demand: CPU microseconds (`cpu_ns / 1000`) spent per KiB
    /// (1024 bytes) of `bytes` moved in the interval. `None` when `bytes` is 0.
    pub fn service_demand_us_per_kib(&self, bytes: u64) -> Option<f64> {
        if bytes == 0 {
            return None;
        }
        let cpu_us = self.cpu_ns as f64 / 1000.0;
        let kib = bytes as f64 / 1024.0;
        Some(cpu_us / kib)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mean_of_two_samples() {
        let a = CpuUsage {
            system_busy_percent: 10.0,
            process_percent: 50.0,
            cpu_ns: 1_000,
            wall_ns: 2_000,
            softirq_percent: Some(4.0),
        };
        let b = CpuUsage {
            system_busy_percent: 30.0,
            process_percent: 100.0,
            cpu_ns: 3_000,
            wall_ns: 3_000,
            softirq_percent: Some(8.0),
        };
        let m = CpuUsage::mean(&[a, b]);
        assert_eq!(
            m,
            CpuUsage {
                system_busy_percent: 20.0,
                process_percent: 75.0,
                cpu_ns: 4_000,
                wall_ns: 5_000,
                softirq_percent: Some(6.0),
            }
        );
        assert_eq!(CpuUsage::mean(&[]), CpuUsage::default());
        assert_eq!(CpuUsage::mean(&[a]), a);
        // A sample without the softirq share leaves the mean without it.
        let old = CpuUsage {
            softirq_percent: None,
            ..b
        };
        assert_eq!(CpuUsage::mean(&[a, old]).softirq_percent, None);
    }

    #[test]
    fn a_reading_without_the_softirq_share_reads_and_writes_without_it() {
        let old = r#"{"system_busy_percent":1.0,"process_percent":2.0,"cpu_ns":3,"wall_ns":4}"#;
        let u: CpuUsage = serde_json::from_str(old).expect("an older reading");
        assert_eq!(u.softirq_percent, None);
        assert_eq!(serde_json::to_string(&u).expect("encoded"), old);
        assert!(u.is_finite());
        let nan = CpuUsage {
            softirq_percent: Some(f64::NAN),
            ..u
        };
        assert!(!nan.is_finite());
    }

    #[test]
    fn service_demand_arithmetic() {
        let usage = CpuUsage {
            cpu_ns: 2_000_000, // 2000 us
            ..CpuUsage::default()
        };
        // 4 MiB = 4096 KiB -> 2000 / 4096 us per KiB.
        let demand = usage
            .service_demand_us_per_kib(4 * 1024 * 1024)
            .expect("bytes > 0");
        assert!((demand - 2000.0 / 4096.0).abs() < 1e-12);
        assert_eq!(usage.service_demand_us_per_kib(1024), Some(2000.0));
        assert_eq!(usage.service_demand_us_per_kib(0), None);
    }
}
