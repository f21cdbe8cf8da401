//! What an agent agrees to do for a coordinator: the most flows, the longest
//! run, the highest rate, the largest message and the most memory one
//! request may commit. `netgap serve` takes them as flags; the agent checks
//! every request against them before it opens any data socket or allocates
//! any buffer, so a coordinator cannot make an agent flood a network or
//! hold its memory past what its operator allowed.

use crate::workload::WorkloadSpec;
use netgap_core::spec::{PointSpec, MAX_SIZE_BYTES};
use std::time::Duration;

/// Limits of one agent. Every limit is at least 1 of its unit.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct AgentLimits {
    /// Most concurrent flows one session may open.
    pub max_flows: u32,
    /// Longest one run (a repetition, or a timed workload run) may take.
    pub max_duration: Duration,
    /// The agent's highest data rate, in Gbit/s: everything its flows send
    /// and receive, point-to-point and workload roles alike, shares one
    /// budget of this rate over time (the agent paces its flows to it).
    pub max_rate_gbps: f64,
    /// Largest message, in bytes.
    pub max_message_bytes: u64,
    /// Most memory one request (a point, a workload role) may commit: its
    /// buffers, threads and per-flow state, in bytes, as estimated before
    /// anything is allocated.
    pub max_memory_bytes: u64,
}

/// Default memory budget of one request: 1 GiB, which a small host (a
/// 4 GiB virtual machine) can give one test and still run.
pub const DEFAULT_MAX_MEMORY_BYTES: u64 = 1 << 30;

/// What a point-to-point server role commits besides its buffers: its
/// flow, its thread and the verification state, in bytes (an upper bound).
pub const POINT_OVERHEAD_BYTES: u64 = 1 << 20;

/// Memory a point-to-point point commits on the agent: a send and a
/// receive buffer of the message size (the tests that send both ways hold
/// both), each with its layout's padding (`--align`, `--offset`), and
/// [`POINT_OVERHEAD_BYTES`].
pub fn point_memory_bytes(spec: &PointSpec) -> u64 {
    spec.size_bytes
        .saturating_add(spec.options.buffer_padding_bytes())
        .saturating_mul(2)
        .saturating_add(POINT_OVERHEAD_BYTES)
}

/// Default most flows per session (a host can drive 10,000 flows).
pub const DEFAULT_MAX_FLOWS: u32 = 10_000;
/// Default longest run.
pub(crate) const DEFAULT_MAX_DURATION: Duration = Duration::from_secs(600);
/// Default highest rate, Gbit/s: past any NIC, so only a deliberate limit bites.
pub const DEFAULT_MAX_RATE_GBPS: f64 = 400.0;

impl Default for AgentLimits {
    fn default() -> Self {
        AgentLimits {
            max_flows: DEFAULT_MAX_FLOWS,
            max_duration: DEFAULT_MAX_DURATION,
            max_rate_gbps: DEFAULT_MAX_RATE_GBPS,
            max_message_bytes: MAX_SIZE_BYTES,
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
        }
    }
}

/// A request past a limit: one line naming the limit and the value.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("refused by the agent's limits: {0}")]
pub struct LimitError(pub String);

/// A limit that is not positive and finite, naming its flag.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{0}")]
pub struct BadLimit(pub &'static str);

impl AgentLimits {
    /// Checks the limits themselves: every one positive and finite.
    pub fn validate(&self) -> Result<(), BadLimit> {
        if self.max_flows == 0 {
            return Err(BadLimit("--max-flows must be at least 1"));
        }
        if self.max_duration.is_zero() {
            return Err(BadLimit("--max-duration must be positive"));
        }
        if !(self.max_rate_gbps.is_finite() && self.max_rate_gbps > 0.0) {
            return Err(BadLimit("--max-rate must be a positive rate"));
        }
        if self.max_message_bytes == 0 {
            return Err(BadLimit("--max-message must be at least 1 byte"));
        }
        if self.max_memory_bytes < POINT_OVERHEAD_BYTES {
            return Err(BadLimit(
                "--max-memory must be at least 1M (what one flow of the smallest point commits)",
            ));
        }
        Ok(())
    }

    /// Checks a number of concurrent flows.
    pub fn check_flows(&self, flows: u64) -> Result<(), LimitError> {
        if flows > u64::from(self.max_flows) {
            return Err(LimitError(format!(
                "{flows} flows > the most this agent serves, {}",
                self.max_flows
            )));
        }
        Ok(())
    }

    /// Checks the length of one run.
    pub fn check_duration(&self, d: Duration) -> Result<(), LimitError> {
        if d > self.max_duration {
            return Err(LimitError(format!(
                "a run of {} > the longest this agent allows, {}",
                humantime::format_duration(d),
                humantime::format_duration(self.max_duration)
            )));
        }
        Ok(())
    }

    /// Checks a requested rate in Gbit/s.
    pub fn check_rate_gbps(&self, rate_gbps: f64) -> Result<(), LimitError> {
        if !rate_gbps.is_finite() || rate_gbps > self.max_rate_gbps {
            return Err(LimitError(format!(
                "{rate_gbps} Gbit/s > the highest rate this agent allows, {} Gbit/s",
                self.max_rate_gbps
            )));
        }
        Ok(())
    }

    /// Checks a message size.
    pub fn check_message_bytes(&self, size_bytes: u64) -> Result<(), LimitError> {
        if size_bytes > self.max_message_bytes {
            return Err(LimitError(format!(
                "{size_bytes}-byte messages > the largest this agent allows, {} bytes",
                self.max_message_bytes
            )));
        }
        Ok(())
    }

    /// Checks the memory a request would commit, `bytes`, as `what` (one
    /// line names both).
    pub fn check_memory(&self, what: &str, bytes: u64) -> Result<(), LimitError> {
        if bytes > self.max_memory_bytes {
            return Err(LimitError(format!(
                "{what} would commit {} of memory > this agent's budget for one request, {} (--max-memory)",
                mib(bytes),
                mib(self.max_memory_bytes)
            )));
        }
        Ok(())
    }

    /// Checks a point of the two-host protocol (one flow): its message size
    /// and the memory of its buffers plus `flow_bytes`, what the point's
    /// transport commits for a flow beyond them (a user-level transport's
    /// registered memory). Its repetitions are checked one by one with
    /// [`AgentLimits::check_run`].
    pub fn check_point(&self, spec: &PointSpec, flow_bytes: u64) -> Result<(), LimitError> {
        self.check_flows(1)?;
        self.check_message_bytes(spec.size_bytes)?;
        self.check_memory(
            &if flow_bytes == 0 {
                format!("a point of {}-byte messages", spec.size_bytes)
            } else {
                format!(
                    "a point of {}-byte messages over a transport that keeps {} per flow",
                    spec.size_bytes,
                    mib(flow_bytes)
                )
            },
            point_memory_bytes(spec).saturating_add(flow_bytes),
        )
    }

    /// Checks a workload role: its flows, its warm-up plus window, and its
    /// message sizes. No rate is asked for: the agent paces the role's
    /// flows to its own highest rate.
    pub fn check_workload(&self, spec: &WorkloadSpec) -> Result<(), LimitError> {
        self.check_flows(u64::from(spec.flows))?;
        let run_ms = u64::from(spec.warmup_ms) + u64::from(spec.duration_ms);
        self.check_duration(Duration::from_millis(run_ms))?;
        // A workload's own sizes in its parameters are checked by its
        // module against these same limits before any socket opens.
        self.check_message_bytes(spec.point.size_bytes)
    }

    /// The most payload bytes one run may move: the highest rate held for
    /// the longest run. A point-to-point repetition names iterations, not a
    /// time: one of more bytes could not end within the longest run at the
    /// agent's pace, so it is refused before it starts.
    pub fn max_run_bytes(&self) -> f64 {
        self.max_rate_gbps * 1e9 / 8.0 * self.max_duration.as_secs_f64()
    }

    /// Checks one repetition of `iterations` messages of `size_bytes` each.
    pub fn check_run(&self, iterations: u64, size_bytes: u64) -> Result<(), LimitError> {
        let bytes = iterations as f64 * size_bytes as f64;
        if bytes > self.max_run_bytes() {
            return Err(LimitError(format!(
                "{iterations} iterations of {size_bytes} bytes ({bytes:.3e} bytes) > what this agent moves in one run at its highest rate ({} Gbit/s for {}), {:.3e} bytes",
                self.max_rate_gbps,
                humantime::format_duration(self.max_duration),
                self.max_run_bytes()
            )));
        }
        Ok(())
    }
}

/// A byte count in MiB, for messages.
fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1u32 << 20))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_refuse_past_each_bound_and_accept_at_it() {
        let l = AgentLimits {
            max_flows: 4,
            max_duration: Duration::from_secs(10),
            max_rate_gbps: 1.0,
            max_message_bytes: 1024,
            max_memory_bytes: 4 << 20,
        };
        assert!(l.validate().is_ok());
        assert!(l.check_memory("x", 4 << 20).is_ok());
        assert!(l
            .check_memory("a role of 9 flows", (4 << 20) + 1)
            .is_err_and(|e| e.0.contains("a role of 9 flows") && e.0.contains("--max-memory")));
        assert!(l.check_flows(4).is_ok());
        assert!(l.check_flows(5).is_err_and(|e| e.0.contains("flows")));
        assert!(l.check_duration(Duration::from_secs(10)).is_ok());
        assert!(l.check_duration(Duration::from_secs(11)).is_err());
        assert!(l.check_rate_gbps(1.0).is_ok());
        assert!(l.check_rate_gbps(1.5).is_err());
        assert!(l.check_rate_gbps(f64::NAN).is_err());
        assert!(l.check_message_bytes(1024).is_ok());
        assert!(l.check_message_bytes(1025).is_err());
        // 1 Gbit/s for 10 s is 1.25e9 bytes.
        assert!(l.check_run(1_000_000, 1024).is_ok());
        assert!(l.check_run(2_000_000, 1024).is_err());
        assert!(AgentLimits { max_flows: 0, ..l }.validate().is_err());
        assert!(AgentLimits::default().validate().is_ok());
    }

    #[test]
    fn a_point_counts_its_transports_own_memory_against_the_budget() {
        use netgap_core::spec::{Mode, TransportOptions};
        let spec = PointSpec {
            test: "pingpong".into(),
            transport: "xdp".into(),
            mode: Mode::Event,
            size_bytes: 1024,
            options: TransportOptions::default(),
            server_cpu: None,
            io_timeout_ms: 1000,
            verify: false,
        };
        let l = AgentLimits {
            max_memory_bytes: 8 << 20,
            ..AgentLimits::default()
        };
        assert!(l.check_point(&spec, 0).is_ok());
        assert!(l.check_point(&spec, 6 << 20).is_ok());
        assert!(
            l.check_point(&spec, 7 << 20).is_err_and(
                |e| e.0.contains("keeps 7.0 MiB per flow") && e.0.contains("--max-memory")
            )
        );
    }

    #[test]
    fn a_buffer_layout_counts_against_the_budget() {
        use netgap_core::spec::{Mode, TransportOptions};
        // A peer's largest alignment and an offset just below it would
        // have the agent reserve 2 GiB a buffer for a 1-byte message.
        let spec = PointSpec {
            test: "pingpong".into(),
            transport: "tcp".into(),
            mode: Mode::Event,
            size_bytes: 1,
            options: TransportOptions {
                buffer_align_bytes: Some(1 << 30),
                buffer_offset_bytes: (1 << 30) - 1,
                ..TransportOptions::default()
            },
            server_cpu: None,
            io_timeout_ms: 1000,
            verify: false,
        };
        let l = AgentLimits::default();
        assert!(l
            .check_point(&spec, 0)
            .is_err_and(|e| e.0.contains("--max-memory")));
        let page = PointSpec {
            options: TransportOptions {
                buffer_align_bytes: Some(4096),
                buffer_offset_bytes: 16,
                ..TransportOptions::default()
            },
            ..spec
        };
        assert!(l.check_point(&page, 0).is_ok());
    }

    #[test]
    fn workload_roles_are_checked_for_flows_window_and_message_sizes() {
        use crate::workload::WorkloadRole;
        use netgap_core::spec::{Mode, TransportOptions};
        let l = AgentLimits {
            max_flows: 4,
            max_duration: Duration::from_secs(1),
            max_rate_gbps: 1.0,
            max_message_bytes: 1024,
            max_memory_bytes: DEFAULT_MAX_MEMORY_BYTES,
        };
        let spec = WorkloadSpec {
            point: PointSpec {
                test: "connect".into(),
                transport: "tcp".into(),
                mode: Mode::Event,
                size_bytes: 1,
                options: TransportOptions::default(),
                server_cpu: None,
                io_timeout_ms: 1000,
                verify: false,
            },
            role: WorkloadRole::Client,
            params: serde_json::json!({"request_bytes": 1, "reply_bytes": 1024}),
            flows: 4,
            listen_ips: vec![],
            targets: vec![],
            bind_ips: vec![],
            session_hosts: vec![],
            warmup_ms: 200,
            duration_ms: 800,
        };
        assert!(l.check_workload(&spec).is_ok());
        let with = |f: &dyn Fn(&mut WorkloadSpec)| {
            let mut s = spec.clone();
            f(&mut s);
            l.check_workload(&s)
        };
        assert!(with(&|s| s.flows = 5).is_err_and(|e| e.0.contains("flows")));
        // The warm-up counts towards the run's length.
        assert!(with(&|s| s.warmup_ms = 201).is_err());
        assert!(with(&|s| s.point.size_bytes = 2048).is_err());
    }
}
