//! Control messages of workloads: what one agent is asked to
//! do in a workload point and what it reports back. Plain data with range
//! checks, like [`super::message`]; the session machines in
//! [`super::session`] decide when each may come.
//!
//! A workload point runs one workload: its roles placed on agents, one role
//! per agent. The protocol knows a workload only by name (the point's
//! `test`) and carries its parameters as a JSON object that the workload's
//! own module parses and checks on the agent; an agent refuses a name it
//! does not have. A server role listens and announces its data addresses
//! (`group_listening`); any role may connect flows to the session's hosts.
//! Each agent gets a [`WorkloadSpec`] (`group_prepare`), opens or
//! connects its flows and answers `group_ready`; the coordinator then sends
//! `group_go` to every agent at once (the barrier), and each agent answers
//! with its per-flow reports (`group_flows`, in chunks), its latency
//! histogram (`group_buckets`, in chunks) and a closing `group_finished`.

use netgap_core::cpu::CpuUsage;
use netgap_core::datagram::DatagramStats;
use netgap_core::spec::{PointSpec, RangeError};
use netgap_core::stats::Percentiles;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;

/// Most flows of one workload point, and so of one agent's role in it: the
/// server of 100,000 clients spread over several client hosts; anything
/// larger is refused before any data socket opens. An agent's own
/// `--max-flows` (10,000 by default) bounds what it accepts below this.
pub const MAX_WORKLOAD_FLOWS: u32 = 100_000;
/// Longest measured window of one repetition, in milliseconds (10 minutes).
pub const MAX_WORKLOAD_DURATION_MS: u32 = 600_000;
/// Longest uncounted warm-up before the window, in milliseconds.
pub(crate) const MAX_WORKLOAD_WARMUP_MS: u32 = 60_000;
/// Most addresses in the session's host list.
pub(crate) const MAX_SESSION_HOSTS: usize = 1024;
/// Most per-flow addresses (listeners, targets, binds) in one message; a
/// longer list would not fit in a control frame.
pub(crate) const MAX_FLOW_ADDRS: usize = 1024;
/// Most flow reports in one `group_flows` chunk (keeps a frame under the
/// codec's limit even with percentiles on every flow).
pub const FLOWS_PER_CHUNK: usize = 128;
/// Most histogram buckets in one `group_buckets` chunk.
pub const BUCKETS_PER_CHUNK: usize = 1024;
/// Most named figures one role reports in its outcome.
pub const MAX_OUTCOME_METRICS: usize = 32;

/// Which side of a workload point an agent plays.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum WorkloadRole {
    /// Listens and serves every client flow.
    Server,
    /// Opens flows to the server.
    Client,
}

impl WorkloadRole {
    /// `server` or `client`, as written in results.
    pub fn as_str(self) -> &'static str {
        match self {
            WorkloadRole::Server => "server",
            WorkloadRole::Client => "client",
        }
    }
}

/// What one agent must do in a workload point. Invariants (checked by
/// [`WorkloadSpec::validate`]): `flows` in 1..=[`MAX_WORKLOAD_FLOWS`], `duration_ms`
/// in 1..=[`MAX_WORKLOAD_DURATION_MS`], `params` a JSON object, a client has
/// targets, per-flow lists hold 0, 1 or `flows` entries, and every target's
/// IP is in `session_hosts`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadSpec {
    /// Workload (its name is `test`), transport, mode, message size,
    /// options and inactivity timeout of the point (`server_cpu` and
    /// `verify` are not used).
    pub point: PointSpec,
    /// The role this agent plays.
    pub role: WorkloadRole,
    /// The workload's own parameters: a JSON object that only the
    /// workload's module reads (and checks) on the agent.
    #[serde(default = "empty_params")]
    pub params: serde_json::Value,
    /// Flows this agent runs (a server: every client flow of the point).
    pub flows: u32,
    /// Server: the addresses to listen on, one for every flow or one for
    /// all; empty means the address the control connection arrived on.
    #[serde(default)]
    pub listen_ips: Vec<IpAddr>,
    /// The data addresses (`IP:PORT`) this role's flows connect to, one
    /// per flow or one for all (a client must have some).
    #[serde(default)]
    pub targets: Vec<String>,
    /// Client: local addresses to connect from, one per flow or one for
    /// all; empty lets the system choose.
    #[serde(default)]
    pub bind_ips: Vec<IpAddr>,
    /// Addresses of every host of the session: a client role connects only
    /// to these.
    pub session_hosts: Vec<IpAddr>,
    /// Uncounted warm-up after `group_go`, in milliseconds.
    pub warmup_ms: u32,
    /// Measured window after the warm-up, in milliseconds.
    pub duration_ms: u32,
}

fn empty_params() -> serde_json::Value {
    serde_json::Value::Object(serde_json::Map::new())
}

fn range(field: &'static str, detail: impl Into<String>) -> RangeError {
    RangeError {
        field,
        detail: detail.into(),
    }
}

/// Checks that a per-flow list has 0, 1 or `flows` entries.
fn per_flow(field: &'static str, len: usize, flows: u32) -> Result<(), RangeError> {
    if len > MAX_FLOW_ADDRS || (len > 1 && len != flows as usize) {
        return Err(range(
            field,
            format!("{len} entries for {flows} flows (want 0, 1 or one per flow, at most {MAX_FLOW_ADDRS})"),
        ));
    }
    Ok(())
}

impl WorkloadSpec {
    /// Range-checks every field, including the agent's limits on flows and
    /// duration and the rule that a client targets only session hosts;
    /// never panics on peer input.
    pub fn validate(&self) -> Result<(), RangeError> {
        self.point.validate()?;
        if self.flows == 0 || self.flows > MAX_WORKLOAD_FLOWS {
            return Err(range(
                "flows",
                format!("{} not in 1..={MAX_WORKLOAD_FLOWS}", self.flows),
            ));
        }
        if self.duration_ms == 0 || self.duration_ms > MAX_WORKLOAD_DURATION_MS {
            return Err(range(
                "duration_ms",
                format!("{} not in 1..={MAX_WORKLOAD_DURATION_MS}", self.duration_ms),
            ));
        }
        if self.warmup_ms > MAX_WORKLOAD_WARMUP_MS {
            return Err(range(
                "warmup_ms",
                format!("{} > {MAX_WORKLOAD_WARMUP_MS}", self.warmup_ms),
            ));
        }
        if self.session_hosts.len() > MAX_SESSION_HOSTS {
            return Err(range(
                "session_hosts",
                format!("more than {MAX_SESSION_HOSTS}"),
            ));
        }
        per_flow("listen_ips", self.listen_ips.len(), self.flows)?;
        per_flow("targets", self.targets.len(), self.flows)?;
        per_flow("bind_ips", self.bind_ips.len(), self.flows)?;
        if !self.params.is_object() {
            return Err(range("params", "not a JSON object"));
        }
        if self.role == WorkloadRole::Client && self.targets.is_empty() {
            return Err(range("targets", "a client role needs a target"));
        }
        {
            for t in &self.targets {
                let ip = target_ip(t).ok_or_else(|| {
                    range(
                        "targets",
                        format!("{t:?} is neither IP:PORT nor IP/MAC/FLOW"),
                    )
                })?;
                if !self.session_hosts.contains(&ip) {
                    return Err(range(
                        "targets",
                        format!(
                            "{ip} is not a host of this session; an agent sends test traffic only to the session's hosts"
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The host a flow's target names: `IP:PORT`, or `IP/MAC/FLOW` (an xdp
/// listener's address: frames go to the MAC on the interface that reaches
/// the IP, so the IP is the host they are for). `None` for anything else.
pub fn target_ip(target: &str) -> Option<std::net::IpAddr> {
    if let Ok(a) = target.parse::<std::net::SocketAddr>() {
        return Some(a.ip());
    }
    let mut parts = target.split('/');
    let (Some(ip), Some(mac), Some(flow), None) =
        (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return None;
    };
    let mac_ok = mac.split(':').count() == 6
        && mac
            .split(':')
            .all(|b| b.len() == 2 && b.chars().all(|c| c.is_ascii_hexdigit()));
    let flow_ok = flow.parse::<u16>().is_ok_and(|f| f != 0);
    (mac_ok && flow_ok).then(|| ip.parse().ok()).flatten()
}

/// What one flow did in a workload repetition, as an agent reports it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FlowReport {
    /// The flow's index on this agent, 0-based.
    pub index: u32,
    /// Payload bytes this end sent over the whole repetition.
    pub bytes_tx: u64,
    /// Payload bytes this end received over the whole repetition.
    pub bytes_rx: u64,
    /// Payload bytes this end received inside the measured window.
    pub window_bytes_rx: u64,
    /// Round trips (hotspot) or connections (connect) completed in the window.
    pub round_trips: u64,
    /// Latency percentiles of this flow's round trips or connections, µs
    /// (one-way for hotspot), if it has any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentiles: Option<Percentiles>,
    /// Failed exchanges of this flow (connect), else 0.
    pub errors: u64,
}

/// The end of an agent's answer to `group_go`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WorkloadOutcome {
    /// Length of the measured window as this agent timed it, in ns.
    pub window_ns: u64,
    /// CPU usage of the agent's host and of the role over the window in
    /// which the role's bytes moved (the `--duration` window, or a job's
    /// run or phase): the role's is the agent's process and the processes
    /// the role started (shards, a server program, a load generator, a
    /// relay); `cpu_ns` and `wall_ns` in ns.
    pub cpu: CpuUsage,
    /// Peak resident set size of the agent process (VmHWM), in KiB, if known;
    /// with [`WorkloadOutcome::processes`], the sum over its processes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_kib: Option<u64>,
    /// Processes the role ran in, the agent's included, when it was spread
    /// over more than the agent's own (a server past one process's
    /// descriptor limit), at most [`MAX_OUTCOME_PROCESSES`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
    /// Payload bytes this agent received, all flows, whole repetition.
    #[serde(default)]
    pub bytes_rx: u64,
    /// Payload bytes this agent sent, all flows, whole repetition.
    #[serde(default)]
    pub bytes_tx: u64,
    /// Datagram counters of this agent's flows, all together, whole
    /// repetition, when they are datagrams (the flow engine's and the
    /// bandwidth workloads' over udp, the bandwidth workloads' over xdp);
    /// absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub datagrams: Option<DatagramStats>,
    /// A workload's own figures of this role's repetition, named with their
    /// units (`transactions`, `connect_time_us`), at most
    /// [`MAX_OUTCOME_METRICS`]; empty for the built-in micro-benchmarks.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub metrics: std::collections::BTreeMap<String, f64>,
    /// The real server programs this role started (nginx, Apache, gmond),
    /// at most [`MAX_OUTCOME_SERVICES`]; empty for roles that start none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<netgap_core::record::ServiceRecord>,
    /// The last failure of this role's transactions in the repetition (a
    /// web client's refused connection or wrong status), at most
    /// [`MAX_OUTCOME_ERROR_BYTES`]; absent when none failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// For a role that times its bytes against the window (a stream's
    /// receiving end), the span, in ns, from the first to the last clock
    /// read inside the window where bytes moved. A span short of
    /// `window_ns` by more than [`WINDOW_TOLERANCE`] means the data path
    /// was not reading for part of the window (a thread that woke late),
    /// and the repetition is no clean point. Absent for other roles.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_window_ns: Option<u64>,
    /// What the logs of the programs this role ran say at the end of the
    /// repetition (a server's error log, the preload library's lines other
    /// than its routine moves and closes), each line opening with its
    /// log's name, at most [`MAX_OUTCOME_EVIDENCE_LINES`] of at most
    /// [`MAX_OUTCOME_EVIDENCE_LINE_BYTES`]: the coordinator shows them
    /// with a point whose transactions failed, and drops them otherwise.
    /// Empty for roles that run no program.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub evidence: Vec<String>,
}

/// How far, as a share of the asked window, the data path's own span may
/// fall short of it before a repetition is flagged (5%).
pub const WINDOW_TOLERANCE: f64 = 0.05;

/// Longest last error one role's outcome may carry, bytes.
pub const MAX_OUTCOME_ERROR_BYTES: usize = 512;
/// Most lines of evidence one role's outcome may carry.
pub const MAX_OUTCOME_EVIDENCE_LINES: usize = 12;
/// Longest line of evidence one role's outcome may carry, bytes.
pub const MAX_OUTCOME_EVIDENCE_LINE_BYTES: usize = 240;
/// Most processes one role's outcome may say it ran in.
pub const MAX_OUTCOME_PROCESSES: u32 = 1024;
/// Most services one role's outcome may name.
pub const MAX_OUTCOME_SERVICES: usize = 4;
/// Longest configuration text a service record may carry, in bytes.
pub const MAX_SERVICE_CONFIG_BYTES: usize = 16 * 1024;
/// Longest other text field of a service record, in bytes.
const MAX_SERVICE_FIELD_BYTES: usize = 512;
/// Most facts one service record may carry.
const MAX_SERVICE_FACTS: usize = 16;

impl FlowReport {
    /// Range-checks a report from a peer; never panics.
    pub fn validate(&self) -> Result<(), RangeError> {
        if let Some(p) = &self.percentiles {
            let v = [p.p50, p.p90, p.p99, p.p999, p.max];
            if v.iter().any(|x| !x.is_finite() || *x < 0.0) {
                return Err(range("percentiles", "not finite and non-negative"));
            }
        }
        Ok(())
    }
}

impl WorkloadOutcome {
    /// Range-checks an outcome from a peer; never panics.
    pub fn validate(&self) -> Result<(), RangeError> {
        if !self.cpu.is_finite() {
            return Err(range("cpu", "not a finite number"));
        }
        if let Some(d) = &self.datagrams {
            d.validate()
                .map_err(|e| range("datagrams", e.to_string()))?;
        }
        if let Some(p) = self.processes {
            if !(1..=MAX_OUTCOME_PROCESSES).contains(&p) {
                return Err(range(
                    "processes",
                    format!("{p}, not 1 to {MAX_OUTCOME_PROCESSES}"),
                ));
            }
        }
        if self.metrics.len() > MAX_OUTCOME_METRICS {
            return Err(range(
                "metrics",
                format!("{} names, most {MAX_OUTCOME_METRICS}", self.metrics.len()),
            ));
        }
        for (name, v) in &self.metrics {
            netgap_core::spec::check_name("metrics", name)?;
            if !v.is_finite() {
                return Err(range("metrics", format!("{name} is not a finite number")));
            }
        }
        if self
            .last_error
            .as_ref()
            .is_some_and(|e| e.len() > MAX_OUTCOME_ERROR_BYTES)
        {
            return Err(range(
                "last_error",
                format!("longer than {MAX_OUTCOME_ERROR_BYTES} bytes"),
            ));
        }
        if self.evidence.len() > MAX_OUTCOME_EVIDENCE_LINES
            || self
                .evidence
                .iter()
                .any(|l| l.len() > MAX_OUTCOME_EVIDENCE_LINE_BYTES)
        {
            return Err(range(
                "evidence",
                format!(
                    "more than {MAX_OUTCOME_EVIDENCE_LINES} lines or a line past {MAX_OUTCOME_EVIDENCE_LINE_BYTES} bytes"
                ),
            ));
        }
        if self.data_window_ns.is_some_and(|d| d > self.window_ns) {
            return Err(range(
                "data_window_ns",
                format!("longer than the window of {} ns", self.window_ns),
            ));
        }
        if self.services.len() > MAX_OUTCOME_SERVICES {
            return Err(range(
                "services",
                format!(
                    "{} services, most {MAX_OUTCOME_SERVICES}",
                    self.services.len()
                ),
            ));
        }
        for s in &self.services {
            if s.config.len() > MAX_SERVICE_CONFIG_BYTES {
                return Err(range("services", "a configuration past 16 KiB"));
            }
            let fields = [&s.name, &s.host, &s.program, &s.version, &s.listen];
            let facts = s.facts.iter().flat_map(|(k, v)| [k, v]);
            if s.facts.len() > MAX_SERVICE_FACTS
                || fields
                    .into_iter()
                    .chain(facts)
                    .any(|f| f.len() > MAX_SERVICE_FIELD_BYTES)
            {
                return Err(range("services", "a field or its facts too long"));
            }
        }
        Ok(())
    }
}

/// A valid spec for tests of the protocol.
#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
pub(crate) fn sample_spec(role: WorkloadRole) -> WorkloadSpec {
    tests::spec(role)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use netgap_core::spec::{Mode, TransportOptions};

    pub(super) fn spec(role: WorkloadRole) -> WorkloadSpec {
        WorkloadSpec {
            point: PointSpec {
                test: "fanin".into(),
                transport: "tcp".into(),
                mode: Mode::Event,
                size_bytes: 65536,
                options: TransportOptions::default(),
                server_cpu: None,
                io_timeout_ms: 3000,
                verify: false,
            },
            role,
            params: empty_params(),
            flows: 2,
            listen_ips: vec![],
            targets: if role == WorkloadRole::Client {
                vec!["127.0.0.1:5000".into()]
            } else {
                vec![]
            },
            bind_ips: vec![],
            session_hosts: vec!["127.0.0.1".parse().unwrap()],
            warmup_ms: 100,
            duration_ms: 1000,
        }
    }

    #[test]
    fn limits_are_checked() {
        assert!(spec(WorkloadRole::Client).validate().is_ok());
        let mut s = spec(WorkloadRole::Client);
        s.flows = MAX_WORKLOAD_FLOWS + 1;
        assert_eq!(s.validate().unwrap_err().field, "flows");
        let mut s = spec(WorkloadRole::Server);
        s.duration_ms = MAX_WORKLOAD_DURATION_MS + 1;
        assert_eq!(s.validate().unwrap_err().field, "duration_ms");
        let mut s = spec(WorkloadRole::Server);
        s.duration_ms = 0;
        assert_eq!(s.validate().unwrap_err().field, "duration_ms");
    }

    #[test]
    fn client_targets_only_session_hosts() {
        let mut s = spec(WorkloadRole::Client);
        s.targets = vec!["10.9.9.9:80".into()];
        let e = s.validate().unwrap_err();
        assert_eq!(e.field, "targets");
        assert!(e.detail.contains("not a host of this session"), "{e}");
    }

    #[test]
    fn an_xdp_target_names_its_host_and_is_held_to_the_session_too() {
        assert_eq!(
            target_ip("10.80.1.1/1e:cb:9a:b2:15:a2/64663"),
            "10.80.1.1".parse().ok()
        );
        assert_eq!(target_ip("10.80.1.1:80"), "10.80.1.1".parse().ok());
        for bad in [
            "10.80.1.1/1e:cb:9a:b2:15/1",
            "10.80.1.1/1e:cb:9a:b2:15:zz/1",
            "10.80.1.1/1e:cb:9a:b2:15:a2/0",
            "10.80.1.1/1e:cb:9a:b2:15:a2/1/2",
            "host/1e:cb:9a:b2:15:a2/1",
            "10.80.1.1",
        ] {
            assert_eq!(target_ip(bad), None, "{bad}");
        }
        let mut s = spec(WorkloadRole::Client);
        s.targets = vec!["10.9.9.9/1e:cb:9a:b2:15:a2/7".into()];
        let e = s.validate().unwrap_err();
        assert!(e.detail.contains("not a host of this session"), "{e}");
        s.targets = vec!["10.9.9.9/nonsense".into()];
        let e = s.validate().unwrap_err();
        assert!(e.detail.contains("neither IP:PORT nor IP/MAC/FLOW"), "{e}");
    }

    #[test]
    fn params_are_an_object_and_a_server_targets_only_session_hosts_too() {
        let mut s = spec(WorkloadRole::Client);
        s.params = serde_json::json!([1, 2]);
        assert_eq!(s.validate().unwrap_err().field, "params");
        let mut s = spec(WorkloadRole::Server);
        s.targets = vec!["10.9.9.9:80".into()];
        assert_eq!(s.validate().unwrap_err().field, "targets");
    }

    #[test]
    fn per_flow_lists_have_one_or_all() {
        let mut s = spec(WorkloadRole::Client);
        s.targets = vec!["127.0.0.1:1".into(); 3];
        assert_eq!(s.validate().unwrap_err().field, "targets");
        s.targets = vec!["127.0.0.1:1".into(); 2];
        assert!(s.validate().is_ok());
    }

    #[test]
    fn datagram_counts_that_break_their_invariants_are_refused() {
        let mut outcome = WorkloadOutcome {
            window_ns: 1,
            cpu: CpuUsage::default(),
            peak_rss_kib: None,
            processes: None,
            bytes_rx: 0,
            bytes_tx: 0,
            datagrams: Some(DatagramStats {
                datagrams_sent: 1,
                retries: 1,
                ..DatagramStats::default()
            }),
            metrics: Default::default(),
            services: Vec::new(),
            last_error: None,
            data_window_ns: None,
            evidence: Vec::new(),
        };
        assert!(outcome.validate().is_ok());
        outcome.datagrams = Some(DatagramStats {
            datagrams_sent: 1,
            retries: 2,
            ..DatagramStats::default()
        });
        let e = outcome.validate().unwrap_err();
        assert_eq!(e.field, "datagrams");
    }

    #[test]
    fn outcome_metrics_are_named_finite_and_few() {
        let mut outcome = WorkloadOutcome {
            window_ns: 1,
            cpu: CpuUsage::default(),
            peak_rss_kib: None,
            processes: None,
            bytes_rx: 0,
            bytes_tx: 0,
            datagrams: None,
            metrics: [("connect_time_us".to_string(), 12.5)].into(),
            services: Vec::new(),
            last_error: None,
            data_window_ns: None,
            evidence: Vec::new(),
        };
        assert!(outcome.validate().is_ok());
        outcome.metrics.insert("Bad Name".into(), 1.0);
        assert_eq!(outcome.validate().unwrap_err().field, "metrics");
        outcome.metrics = [("errors".to_string(), f64::NAN)].into();
        assert_eq!(outcome.validate().unwrap_err().field, "metrics");
        outcome.metrics = (0..=MAX_OUTCOME_METRICS)
            .map(|i| (format!("m{i}"), 1.0))
            .collect();
        assert_eq!(outcome.validate().unwrap_err().field, "metrics");
        outcome.metrics = Default::default();
        outcome.last_error = Some("e".repeat(MAX_OUTCOME_ERROR_BYTES));
        assert!(outcome.validate().is_ok());
        outcome.last_error = Some("e".repeat(MAX_OUTCOME_ERROR_BYTES + 1));
        assert_eq!(outcome.validate().unwrap_err().field, "last_error");
        outcome.last_error = None;
        outcome.evidence =
            vec!["e".repeat(MAX_OUTCOME_EVIDENCE_LINE_BYTES); MAX_OUTCOME_EVIDENCE_LINES];
        assert!(outcome.validate().is_ok());
        outcome.evidence.push("e".into());
        assert_eq!(outcome.validate().unwrap_err().field, "evidence");
        outcome.evidence = vec!["e".repeat(MAX_OUTCOME_EVIDENCE_LINE_BYTES + 1)];
        assert_eq!(outcome.validate().unwrap_err().field, "evidence");
    }

    #[test]
    fn an_outcome_runs_in_one_to_the_most_processes() {
        let mut outcome = WorkloadOutcome {
            window_ns: 1,
            cpu: CpuUsage::default(),
            peak_rss_kib: Some(1024),
            processes: Some(7),
            bytes_rx: 0,
            bytes_tx: 0,
            datagrams: None,
            metrics: Default::default(),
            services: Vec::new(),
            last_error: None,
            data_window_ns: None,
            evidence: Vec::new(),
        };
        assert!(outcome.validate().is_ok());
        for bad in [0, MAX_OUTCOME_PROCESSES + 1] {
            outcome.processes = Some(bad);
            assert_eq!(outcome.validate().unwrap_err().field, "processes");
        }
    }
}
