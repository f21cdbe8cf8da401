//! The result document: one [`ResultRecord`] per measured point. The
//! measurement layer appends each as a JSON line (and optionally a CSV row)
//! the moment the point is measured, so an interrupted run keeps everything
//! it did; reports and comparisons read these files only.

use crate::cpu::CpuUsage;
use crate::datagram::DatagramStats;
use crate::host::HostFacts;
use crate::spec::Mode;
use crate::stats::{Percentiles, Summary};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// The warning of a point run under the preload library whose programs
/// ran without it (its log has none of the point's connections: the
/// loader ignores a library it cannot open): the point names a stack that
/// did not carry it, and no claim is judged from it.
pub const WITHOUT_LIBRARY_WARNING: &str = "preload: the library's log has none of the point's connections: the programs ran without it (the loader ignores a library it cannot open), on the kernel's TCP";

/// Spread of the repetitions of a point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordStats {
    /// Smallest repetition value.
    pub min: f64,
    /// Median repetition value.
    pub median: f64,
    /// Largest repetition value.
    pub max: f64,
    /// Sample standard deviation.
    pub stdev: f64,
    /// Lower end of the 95% confidence interval of the mean; null with
    /// fewer than two repetitions (no interval).
    pub ci95_low: Option<f64>,
    /// Upper end of the 95% confidence interval of the mean; null with
    /// fewer than two repetitions.
    pub ci95_high: Option<f64>,
    /// Coefficient of variation (stdev / mean).
    pub cv: f64,
    /// Each repetition's value, in measurement order.
    pub reps: Vec<f64>,
}

impl RecordStats {
    /// Half-width of the 95% confidence interval in percent of the mean of
    /// the repetitions (2.0 = ±2%); `None` without an interval or with a
    /// zero mean.
    pub fn ci95_half_width_pct(&self) -> Option<f64> {
        let (low, high) = (self.ci95_low?, self.ci95_high?);
        let mean = crate::stats::mean(&self.reps)?;
        (mean != 0.0).then(|| 100.0 * (high - low) / 2.0 / mean.abs())
    }
}

impl From<&Summary> for RecordStats {
    fn from(s: &Summary) -> Self {
        RecordStats {
            min: s.min,
            median: s.median,
            max: s.max,
            stdev: s.stdev,
            ci95_low: s.ci95_low,
            ci95_high: s.ci95_high,
            cv: s.cv,
            reps: s.reps.clone(),
        }
    }
}

/// CPU usage of both ends, averaged over the measured repetitions.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CpuPair {
    /// The coordinator's end (the client role).
    pub local: CpuUsage,
    /// The agent's end (the server role).
    pub remote: CpuUsage,
}

/// Service demand of both ends: CPU microseconds per KiB of payload moved.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct ServiceDemand {
    /// The coordinator's end.
    pub local: f64,
    /// The agent's end.
    pub remote: f64,
}

impl ServiceDemand {
    /// The service demand of both ends over `moved_bytes` of payload;
    /// `None` when either end has none (nothing moved).
    pub fn of(cpu: &CpuPair, moved_bytes: u64) -> Option<ServiceDemand> {
        Some(ServiceDemand {
            local: cpu.local.service_demand_us_per_kib(moved_bytes)?,
            remote: cpu.remote.service_demand_us_per_kib(moved_bytes)?,
        })
    }
}

/// Payload bytes moved over all measured repetitions, as each end counted them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ByteCounts {
    /// Sent by the client.
    pub client_tx: u64,
    /// Received by the client.
    pub client_rx: u64,
    /// Sent by the server.
    pub server_tx: u64,
    /// Received by the server.
    pub server_rx: u64,
}

/// Datagram counters of both ends of an unreliable flow, summed over the
/// measured repetitions (see [`DatagramStats`] for what each count means).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatagramCounts {
    /// The coordinator's end (the client role).
    pub client: DatagramStats,
    /// The agent's end (the server role).
    pub server: DatagramStats,
}

impl DatagramCounts {
    /// A short note for a table when anything went wrong on the wire, such as
    /// `lost 1.25% (40 dgrams), reordered 2, retries 3`; `None` when
    /// nothing was lost, reordered, duplicated, re-sent or dropped. The loss rate is
    /// of the datagrams due for delivery at both ends.
    pub fn note(&self) -> Option<String> {
        let (c, s) = (&self.client, &self.server);
        let lost = c.lost + s.lost;
        let reordered = c.reordered + s.reordered;
        let duplicates = c.duplicates + s.duplicates;
        let retries = c.retries + s.retries;
        let dropped = c.dropped + s.dropped;
        let mut parts = Vec::new();
        if lost > 0 {
            let delivered = (c.datagrams_received + s.datagrams_received)
                .saturating_sub(reordered + duplicates);
            let pct = 100.0 * lost as f64 / (delivered + lost) as f64;
            parts.push(format!("lost {pct:.2}% ({lost} dgrams)"));
        }
        for (n, what) in [
            (reordered, "reordered"),
            (duplicates, "duplicates"),
            (retries, "retries"),
            (dropped, "dropped"),
        ] {
            if n > 0 {
                parts.push(format!("{what} {n}"));
            }
        }
        (!parts.is_empty()).then(|| parts.join(", "))
    }
}

/// Where the roles ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Placement {
    /// CPU the client role was pinned to, or `null` when unpinned.
    pub client_cpu: Option<u32>,
    /// CPU the server role was pinned to, or `null` when unpinned.
    pub server_cpu: Option<u32>,
}

/// The resolved options of a point: enough to reproduce it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RecordOptions {
    /// The agent's control address, or `embedded` for the in-process agent.
    pub peer: String,
    /// Transport options in force on both ends.
    pub transport: crate::spec::TransportOptions,
    /// Every payload byte was checked against the sent pattern; absent
    /// (false) in records made before `--verify` existed.
    #[serde(default)]
    pub verify: bool,
    /// CPU placement of the roles.
    pub placement: Placement,
    /// Measured repetitions.
    pub reps: u32,
    /// Fixed iterations per repetition, when asked for.
    pub iterations: Option<u64>,
    /// Time budget per repetition in milliseconds, when asked for.
    pub rep_time_ms: Option<u64>,
    /// Warm-up iterations asked for.
    pub warmup: Option<u64>,
    /// Data-path inactivity timeout in milliseconds.
    pub io_timeout_ms: u32,
    /// Set when the point's repetitions alternated with those of other
    /// stacks or conditions (`--conditions`, `--interleave`), so that drift
    /// fell on all of them alike; absent for a point measured on its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interleaved: Option<Interleaved>,
    /// Multi-host bandwidth tests run with `--bidir`: every flow carried
    /// payload both ways at once and the headline sums both directions;
    /// absent (false) for one-way flows and for every other test.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bidir: bool,
}

/// How a point's repetitions were interleaved with other stacks': repetition
/// 1 of every member of the group, then repetition 2 of every member, and so
/// on. The records of one group are the fair comparison: time-varying noise
/// fell on each of them alike.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Interleaved {
    /// Names the group; every record of the group carries the same one, and
    /// no other group of any run does (a time stamp, the process and an
    /// index).
    pub group: String,
    /// Members of the group (stacks or conditions alternated), this one
    /// included; `None` when the record does not say (read leniently: a
    /// value of another shape reads as absent).
    #[serde(default, deserialize_with = "lenient")]
    pub with: Option<u32>,
}

/// One measured point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResultRecord {
    /// Test name.
    pub test: String,
    /// Transport name.
    pub transport: String,
    /// Completion mode.
    pub mode: Mode,
    /// Message size in bytes.
    pub size_bytes: u64,
    /// Headline metric with its unit (`latency_us`, `bandwidth_gbps`).
    pub metric: String,
    /// Headline: mean of the repetitions without the highest and lowest.
    pub value: f64,
    /// Spread of the repetitions; `null` when the tool that made the record
    /// (an imported one) reported no repetitions. Read leniently: a section
    /// of another shape reads as absent.
    #[serde(default, deserialize_with = "lenient")]
    pub stats: Option<RecordStats>,
    /// Latency percentiles in microseconds (one-way), for latency tests.
    pub percentiles: Option<Percentiles>,
    /// CPU usage of both ends; `null` when not measured (imported records).
    #[serde(default)]
    pub cpu: Option<CpuPair>,
    /// CPU microseconds per KiB moved, for bandwidth tests.
    pub service_demand_us_per_kib: Option<ServiceDemand>,
    /// Iterations in each measured repetition; `null` when unknown.
    #[serde(default)]
    pub iterations_per_rep: Option<u64>,
    /// Uncounted iterations before the measured ones; `null` when unknown.
    #[serde(default)]
    pub warmup_iterations: Option<u64>,
    /// Payload bytes moved in the measured repetitions; `null` when unknown.
    #[serde(default)]
    pub bytes: Option<ByteCounts>,
    /// Datagram counters of an unreliable transport; `null` for a reliable one.
    pub datagrams: Option<DatagramCounts>,
    /// Full-sentence warnings (noisy repetitions, ...).
    pub warnings: Vec<String>,
    /// Facts of the coordinator's host; `null` when unknown (imported records).
    #[serde(default)]
    pub host: Option<HostFacts>,
    /// Facts of the agent's host; `null` when unknown.
    #[serde(default)]
    pub peer_host: Option<HostFacts>,
    /// Resolved options; `null` for records another tool made. Read from
    /// the layout of every netgap version ([`RecordOptions`]).
    #[serde(default, deserialize_with = "options_of_any_version")]
    pub options: Option<RecordOptions>,
    /// netgap version.
    pub version: String,
    /// Start time of the point, RFC 3339 (UTC).
    pub time: String,
    /// The peer tool that made an imported record; absent for netgap's own
    /// measurements.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub import: Option<ImportSection>,
    /// A `sweep` point's own fields; absent for other tests.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub sweep: Option<SweepSection>,
    /// The confidence target of a point measured with `--ci`, and whether the
    /// repetitions reached it. Read leniently: one of another shape reads
    /// as absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub ci_target: Option<CiOutcome>,
    /// What the point measured over: transport, mode, options, path and
    /// label; absent in records made before it existed (see
    /// [`crate::stack::Stack::of_record`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stack: Option<crate::stack::Stack>,
    /// A workload point's own fields (and an application workload's);
    /// absent for other tests.
    #[serde(flatten, default, skip_serializing_if = "Option::is_none")]
    pub workload: Option<WorkloadSection>,
    /// What the wire allows on the record's path (its payload limit) and
    /// whether the result passed it (a measurement fault); set with the
    /// stack when the finished record is diagnosed (the `physics` module's
    /// model), absent for records without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub physics: Option<Physics>,
    /// Where the CPUs of the point's busiest host (on a testbed, of its
    /// machine) went: its own threads, the kernel's packet processing (the
    /// testbed's forwarding) and other work, and what bound the point when
    /// not its links (the emulator, or the shaper's bucket); set by
    /// the diagnosis of the finished record (the `load` module), absent
    /// without CPU readings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cpu_load: Option<CpuLoad>,
    /// An interleaving group named at the top level of the record, as
    /// records edited by hand or made by scripts name it; netgap writes it
    /// under `options` ([`RecordOptions::interleaved`]) and never here
    /// ([`ResultRecord::interleaved_group`] reads either). Read leniently.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub interleaved: Option<Interleaved>,
}

/// A result past what its path's model allows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fault {
    /// `above_payload_limit` (a bandwidth above the model's most) or
    /// `faster_than_wire` (a transfer faster than the model's least time).
    pub kind: String,
    /// The model's bound in the record's metric unit: the most Gbit/s, or
    /// the least µs.
    pub limit: f64,
    /// The path's payload limit in Gbit/s.
    pub limit_gbps: f64,
    /// The result that passed the bound, in the record's metric unit: the
    /// record's value, or one of its repetitions when the value itself
    /// stayed within (a repetition is a measurement of its own: one past
    /// the wire is as much a fault as a mean past it).
    pub value: f64,
}

/// The physics section of a record: its path's payload limit and, when a
/// result passed its model, the fault.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Physics {
    /// Payload the path carries in Gbit/s for the record's stack, test and
    /// links; `null` when unknown (no shaped link, or facts missing).
    pub payload_limit_gbps: Option<f64>,
    /// Set when the record's result passes its model: a measurement fault.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<Fault>,
    /// What the machine under the testbed forwards through its shapers,
    /// Gbit/s of payload, set when the path's limit takes more than
    /// the share the physics model lets a point's links take of it
    /// (`FORWARDING_CARRY_SHARE`): the links could not all be at their rate
    /// at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub past_forwarding_gbps: Option<f64>,
}

/// What bound a point other than its links.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BoundBy {
    /// The testbed's own forwarding and shaping used the CPUs the point
    /// needed.
    Emulator,
    /// The testbed's shaper held a stream below its limit while the CPUs
    /// were idle: its bucket, not the stack, set the pace.
    Shaper,
}

/// Where the CPUs of the point's busiest host went over its repetitions,
/// in percent of all that host's CPUs (each 0..=100).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CpuLoad {
    /// The hosts whose CPUs these are: one host, or on a testbed every
    /// host of the point (they share the machine's CPUs).
    pub hosts: Vec<String>,
    /// Online CPUs of the host (or machine).
    pub cores: u32,
    /// Busy share of all its CPUs.
    pub busy_percent: f64,
    /// The point's own threads on it (every end there), as a share of all
    /// its CPUs.
    pub own_percent: f64,
    /// The kernel's packet processing (softirq); on a testbed, its
    /// forwarding and shaping. Absent when the readings have none (older
    /// agents and records).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub softirq_percent: Option<f64>,
    /// Other work: the busy share less the point's own and the softirq
    /// share, never below 0.
    pub other_percent: f64,
    /// The hosts are a netgap testbed's, all on one machine: its softirq
    /// share is the emulator's forwarding.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub testbed: bool,
    /// Set when something other than its links' rate bound the point (by
    /// the noise diagnosis, or by the physics check of a
    /// bandwidth below its limit: the `physics` module's `emulator_bound`
    /// and `shaper_held`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_by: Option<BoundBy>,
}

/// An optional field read leniently: a value of another shape (a field
/// that a newer or older netgap, or a hand edit, writes differently) reads
/// as absent, so a reader loses that one detail instead of refusing the
/// whole record.
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// The options of a record in the layout of any netgap version. The first
/// records kept the socket options (`nodelay`, `sndbuf_bytes`,
/// `rcvbuf_bytes`) beside the others, before they became the `transport`
/// object; those read into it, every other transport option at its
/// default, as those versions had no others.
fn options_of_any_version<'de, D>(d: D) -> Result<Option<RecordOptions>, D::Error>
where
    D: serde::Deserializer<'de>,
{
    use serde::de::Error;
    let Some(mut v) = Option::<serde_json::Value>::deserialize(d)? else {
        return Ok(None);
    };
    if let Some(o) = v.as_object_mut().filter(|o| !o.contains_key("transport")) {
        let mut transport = serde_json::to_value(crate::spec::TransportOptions::default())
            .map_err(D::Error::custom)?;
        for key in ["nodelay", "sndbuf_bytes", "rcvbuf_bytes"] {
            if let (Some(value), Some(t)) = (o.remove(key), transport.as_object_mut()) {
                t.insert(key.to_string(), value);
            }
        }
        o.insert("transport".to_string(), transport);
    }
    serde_json::from_value(v)
        .map(Some)
        .map_err(D::Error::custom)
}

/// The section of an imported record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ImportSection {
    /// The peer tool that measured the point (`iperf3`, `NPtcp`, ...).
    pub tool: String,
}

/// The section of a `sweep` point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SweepSection {
    /// What the point moved: `pingpong`, `stream` or `bidir`.
    pub sweep_kind: String,
    /// Time of one block transfer, in microseconds (the x axis of
    /// NetPIPE's signature graph).
    pub block_time_us: f64,
    /// Set on a point whose throughput fell below that of a smaller size
    /// by more than the measurement noise. Read leniently: one of another
    /// shape reads as absent.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        deserialize_with = "lenient"
    )]
    pub dropout: Option<Dropout>,
    /// Set on a point whose trials split into a slow and a fast group (an
    /// intermittent stall); such a point is not judged for a dropout.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unstable: Option<Unstable>,
}

/// The section of a workload point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct WorkloadSection {
    /// Concurrent clients of the point (streams for `multistream`, links
    /// for `multirail`).
    pub clients: u32,
    /// Client hosts the clients were spread over; absent in records made
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_hosts: Option<u32>,
    /// One entry per flow (client), in flow order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub flows: Vec<FlowResult>,
    /// CPU (and peak memory) of every host of the point.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub hosts_cpu: Vec<HostCpu>,
    /// `multirail`: one entry per link used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub links: Vec<LinkResult>,
    /// Application workloads: the workload's own options and its figures
    /// besides the headline.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<AppResult>,
}

/// What every record names, whoever made it: the test, what it ran over,
/// its headline and when. [`ResultRecord::new`] builds a record from it
/// with every other section empty; the maker fills the sections it has.
#[derive(Debug, Clone, PartialEq)]
pub struct RecordHead {
    /// Test name.
    pub test: String,
    /// Transport name.
    pub transport: String,
    /// Completion mode.
    pub mode: Mode,
    /// Message size in bytes.
    pub size_bytes: u64,
    /// Headline metric with its unit (`latency_us`, `bandwidth_gbps`).
    pub metric: String,
    /// The headline.
    pub value: f64,
    /// Start time of the point, RFC 3339 (UTC): [`rfc3339`].
    pub time: String,
}

/// `t` as a record's time: RFC 3339 to the second, UTC.
pub fn rfc3339(t: std::time::SystemTime) -> String {
    humantime::format_rfc3339_seconds(t).to_string()
}

impl ResultRecord {
    /// The one constructor of records: `head`, this netgap's version, and
    /// every optional section empty (no stats, CPU, hosts, options, stack,
    /// sweep, multi-host or application section), for the maker to fill.
    pub fn new(head: RecordHead) -> ResultRecord {
        ResultRecord {
            test: head.test,
            transport: head.transport,
            mode: head.mode,
            size_bytes: head.size_bytes,
            metric: head.metric,
            value: head.value,
            stats: None,
            percentiles: None,
            cpu: None,
            service_demand_us_per_kib: None,
            iterations_per_rep: None,
            warmup_iterations: None,
            bytes: None,
            datagrams: None,
            warnings: Vec::new(),
            host: None,
            peer_host: None,
            options: None,
            version: crate::VERSION.to_string(),
            time: head.time,
            import: None,
            sweep: None,
            ci_target: None,
            stack: None,
            workload: None,
            physics: None,
            cpu_load: None,
            interleaved: None,
        }
    }

    /// The record with its stack. Its `physics` section, which depends on
    /// the stack, is set when the finished record is diagnosed
    /// (`netgap_core::diagnose::diagnose`).
    pub fn with_stack(mut self, stack: crate::stack::Stack) -> ResultRecord {
        self.stack = Some(stack);
        self
    }

    /// The measurement fault of the record, when its result passes what its
    /// path allows.
    pub fn fault(&self) -> Option<&Fault> {
        self.physics.as_ref().and_then(|p| p.fault.as_ref())
    }

    /// The record as a peer tool's measurement, imported.
    pub fn imported_from(mut self, tool: &str) -> ResultRecord {
        self.import = Some(ImportSection {
            tool: tool.to_string(),
        });
        self
    }

    /// The record as a `sweep` point.
    pub fn with_sweep(mut self, sweep: SweepSection) -> ResultRecord {
        self.sweep = Some(sweep);
        self
    }

    /// The record as a workload point.
    pub fn with_workload(mut self, workload: WorkloadSection) -> ResultRecord {
        self.workload = Some(workload);
        self
    }

    /// The peer tool of an imported record.
    pub fn tool(&self) -> Option<&str> {
        self.import.as_ref().map(|i| i.tool.as_str())
    }

    /// A sweep point's kind (`pingpong`, `stream`, `bidir`); `None` for
    /// other tests.
    pub fn sweep_kind(&self) -> Option<&str> {
        self.sweep.as_ref().map(|s| s.sweep_kind.as_str())
    }

    /// A sweep point's block time in microseconds; `None` for other tests.
    pub fn block_time_us(&self) -> Option<f64> {
        self.sweep.as_ref().map(|s| s.block_time_us)
    }

    /// A sweep point's throughput dropout, when it has one.
    pub fn dropout(&self) -> Option<&Dropout> {
        self.sweep.as_ref().and_then(|s| s.dropout.as_ref())
    }

    /// A workload point's concurrent clients (streams, links); `None` for
    /// other tests.
    pub fn clients(&self) -> Option<u32> {
        self.workload.as_ref().map(|w| w.clients)
    }

    /// The CPU of every host of a workload point; empty for other tests.
    pub fn hosts_cpu(&self) -> &[HostCpu] {
        self.workload
            .as_ref()
            .map_or(&[], |w| w.hosts_cpu.as_slice())
    }

    /// The interleaving group of the run that measured the point, if any:
    /// the one under `options`, as netgap writes it, else one named at the
    /// top level; never an empty name.
    pub fn interleaved_group(&self) -> Option<&str> {
        let from_options = self
            .options
            .as_ref()
            .and_then(|o| o.interleaved.as_ref())
            .map(|i| i.group.as_str());
        from_options
            .or_else(|| self.interleaved.as_ref().map(|i| i.group.as_str()))
            .filter(|g| !g.is_empty())
    }

    /// Whether the emulator, not the links, bound the point (its
    /// [`CpuLoad::bound_by`]).
    pub fn emulator_bound(&self) -> bool {
        self.cpu_load.as_ref().and_then(|l| l.bound_by) == Some(BoundBy::Emulator)
    }

    /// Whether the testbed's shaper, not the stack, held the point below
    /// its limit (its [`CpuLoad::bound_by`]).
    pub fn shaper_held(&self) -> bool {
        self.cpu_load.as_ref().and_then(|l| l.bound_by) == Some(BoundBy::Shaper)
    }
}

/// What an application workload's point ran with and found besides its
/// headline.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AppResult {
    /// The workload's own options as the point ran them, by flag
    /// (`{"trace": "zipf", "alpha": 0.8}`); options not given are absent.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty")]
    pub options: serde_json::Map<String, serde_json::Value>,
    /// Figures besides the headline, named with their units
    /// (`payload_gbps`, `errors`, `connect_share_pct`), each the mean over
    /// the repetitions.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub metrics: BTreeMap<String, f64>,
    /// The real server programs the point ran on its hosts (nginx,
    /// Apache, gmond), one entry per host and program, as the first
    /// repetition started them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub services: Vec<ServiceRecord>,
}

impl AppResult {
    /// What sets this point apart from others of its workload, as
    /// `name=value` entries: every option as the point ran it (`alpha=0.8`,
    /// `op=read`), and the server programs it ran when no option names
    /// them (`server=nginx`; a pipeline's `stages=program` names its
    /// stages' program). The table's notes and the report's series
    /// both read it, so a new option sets points apart in each alike.
    pub fn variant(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .options
            .iter()
            .map(|(name, value)| match value {
                serde_json::Value::String(s) => format!("{name}={s}"),
                other => format!("{name}={other}"),
            })
            .collect();
        let named = ["server", "responder", "stages"]
            .iter()
            .any(|n| self.options.contains_key(*n));
        let mut services: Vec<&str> = self.services.iter().map(|s| s.name.as_str()).collect();
        services.sort_unstable();
        services.dedup();
        if !named && !services.is_empty() {
            out.push(format!("server={}", services.join("+")));
        }
        out
    }
}

/// A real server program a workload started on a host through its agent:
/// what ran, where, and with which configuration, so a result says which
/// server it measured.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceRecord {
    /// The service's name (`nginx`, `apache`, `gmond`).
    pub name: String,
    /// The host it ran on, as its agent names itself.
    pub host: String,
    /// The program's path.
    pub program: String,
    /// The program's version line (`nginx/1.22.1`).
    pub version: String,
    /// The `IP:PORT` it served on.
    pub listen: String,
    /// Worker processes (nginx) or threads per child (Apache), when the
    /// service has them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub workers: Option<u32>,
    /// The configuration file netgap wrote for it, verbatim.
    pub config: String,
    /// What the workload prepared for it (`fileset_files`,
    /// `fileset_bytes`, `fileset_sha256`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub facts: BTreeMap<String, String>,
}

/// A throughput dropout of a sweep point (NetPIPE's "problem points").
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Dropout {
    /// How far the point's throughput lies below the reference, in percent
    /// of the reference (positive; 25.0 = a quarter lower).
    pub depth_pct: f64,
    /// Size of the smaller point it is judged against, in bytes.
    pub reference_size_bytes: u64,
    /// That point's headline value, in the record's metric unit.
    pub reference_value: f64,
}

/// A point whose trials split into a slow and a fast group (see
/// `dropout::split_trials`): an intermittent stall, not a level.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Unstable {
    /// Mean of the slow group, in the record's metric unit.
    pub slow_value: f64,
    /// Mean of the fast group, same unit.
    pub fast_value: f64,
    /// Trials in the slow group.
    pub slow_trials: u32,
    /// All trials of the point.
    pub trials: u32,
}

/// What confidence-driven repetition (`--ci LEVEL,WIDTH`) achieved for a
/// point.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct CiOutcome {
    /// Confidence level asked for, in percent (99.0).
    pub confidence_pct: f64,
    /// Largest half-width asked for, in percent of the mean (2.0).
    pub half_width_pct: f64,
    /// Half-width reached at that confidence, in percent of the mean of the
    /// repetitions.
    pub achieved_half_width_pct: f64,
    /// Whether the half-width reached the target before the repetition
    /// limit.
    pub met: bool,
}

/// One flow of a workload point, summed (bytes) or averaged (value)
/// over the repetitions.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FlowResult {
    /// Name of the client host the flow ran from.
    pub host: String,
    /// Flow index in the point, 0-based; flow `i` runs on client host
    /// `i % client_hosts` (cyclic allotment).
    pub index: u32,
    /// The flow's own value in the record's metric unit: Gbit/s received
    /// in the window, one-way latency in µs, or connections per second.
    pub value: f64,
    /// Payload bytes the flow's sending end sent (bandwidth tests), or the
    /// client end sent (hotspot, connect).
    pub bytes_tx: u64,
    /// Payload bytes the flow's receiving end received (bandwidth tests),
    /// or the client end received (hotspot, connect).
    pub bytes_rx: u64,
    /// Latency percentiles of this flow, µs, over every repetition (each
    /// repetition's percentiles pooled, weighted by its exchanges; hotspot:
    /// one-way; connect: connect plus exchange).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub percentiles: Option<Percentiles>,
}

/// CPU of one host of a workload point, averaged over the repetitions'
/// measured windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HostCpu {
    /// Host name.
    pub host: String,
    /// `server` or `client`.
    pub role: String,
    /// System-wide busy % and the agent process's %; a role that runs a
    /// server program (web's nginx or Apache) counts every process of the
    /// program too.
    pub cpu: CpuUsage,
    /// Peak resident set size (VmHWM) of the agent process, KiB, when
    /// known. In-process agents (no `--hosts`) share the coordinator's
    /// process, so they report the same peak.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub peak_rss_kib: Option<u64>,
    /// Processes whose peak memory `peak_rss_kib` sums, when more than the
    /// agent's own: a server role spread over processes past a descriptor
    /// limit counts the agent and its shard processes. Absent: the agent
    /// alone.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub processes: Option<u32>,
    /// Facts of the host (as its agent reported them at the start of the
    /// run); absent in records made before they were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub facts: Option<HostFacts>,
}

/// One link of a `multirail` point.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LinkResult {
    /// Local (client-side) address of the link.
    pub local: String,
    /// Remote (server-side) address of the link.
    pub remote: String,
    /// Payload bytes received over the link in the measured windows.
    pub bytes: u64,
    /// Mean bandwidth of the link over the repetitions, Gbit/s.
    pub bandwidth_gbps: f64,
}

/// A stack read off a record, here beside the record so that the stack's
/// module needs nothing of the record's.
impl crate::stack::Stack {
    /// The record's stack: its `stack` field, or for records without one
    /// (older netgap, imported results) what its other fields say.
    pub fn of_record(r: &ResultRecord) -> crate::stack::Stack {
        if let Some(s) = &r.stack {
            return s.clone();
        }
        let options = r
            .options
            .as_ref()
            .map(|o| crate::stack::option_entries(&o.transport))
            .unwrap_or_default();
        crate::stack::Stack {
            transport: r.transport.clone(),
            mode: r.mode,
            framing: crate::framing::Framing::written_by_name(&r.transport, &options),
            options,
            path: crate::stack::PathIdentity::from_ends(r.host.as_ref(), r.peer_host.as_ref()),
            label: None,
            tool: r.tool().map(str::to_string),
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A record's head for tests (diagnosis's too).
    pub(crate) fn head() -> RecordHead {
        RecordHead {
            test: "sweep".into(),
            transport: "tcp".into(),
            mode: Mode::Event,
            size_bytes: 64,
            metric: "bandwidth_gbps".into(),
            value: 1.5,
            time: "2026-01-01T00:00:00Z".into(),
        }
    }

    #[test]
    fn sections_keep_their_fields_at_the_top_level_and_round_trip() {
        let plain = ResultRecord::new(head());
        let json = serde_json::to_value(&plain).expect("encoded");
        for key in ["tool", "sweep_kind", "block_time_us", "clients", "flows"] {
            assert!(json.get(key).is_none(), "{key} in {json}");
        }
        let back: ResultRecord = serde_json::from_value(json).expect("decoded");
        assert_eq!(back, plain);

        let sweep = ResultRecord::new(head()).with_sweep(SweepSection {
            sweep_kind: "stream".into(),
            block_time_us: 2.5,
            dropout: None,
            unstable: None,
        });
        let json = serde_json::to_value(&sweep).expect("encoded");
        assert_eq!(json["sweep_kind"], "stream");
        assert_eq!(json["block_time_us"], 2.5);
        assert!(json.get("dropout").is_none() && json.get("clients").is_none());
        assert_eq!(
            serde_json::from_value::<ResultRecord>(json).ok(),
            Some(sweep)
        );

        let workload = ResultRecord::new(head()).with_workload(WorkloadSection {
            clients: 3,
            client_hosts: None,
            flows: Vec::new(),
            hosts_cpu: Vec::new(),
            links: Vec::new(),
            app: None,
        });
        let json = serde_json::to_value(&workload).expect("encoded");
        assert_eq!(json["clients"], 3);
        assert!(json.get("client_hosts").is_none() && json.get("sweep_kind").is_none());
        assert_eq!(
            serde_json::from_value::<ResultRecord>(json).ok(),
            Some(workload)
        );

        let imported = ResultRecord::new(head()).imported_from("iperf3");
        let text = serde_json::to_string(&imported).expect("encoded");
        assert!(
            text.contains(r#""time":"2026-01-01T00:00:00Z","tool":"iperf3""#),
            "{text}"
        );
        let back: ResultRecord = serde_json::from_str(&text).expect("decoded");
        assert_eq!(back.tool(), Some("iperf3"));
    }

    /// The first records kept the socket options beside the others; they
    /// read into the `transport` object, every other option at its default.
    #[test]
    fn options_of_the_first_records_read_into_the_transport_object() {
        let options: serde_json::Value = serde_json::json!({
            "peer": "embedded", "nodelay": false, "sndbuf_bytes": 262144, "rcvbuf_bytes": null,
            "placement": {"client_cpu": null, "server_cpu": 1}, "reps": 5, "iterations": 100,
            "rep_time_ms": null, "warmup": 10, "io_timeout_ms": 3000
        });
        let mut json = serde_json::to_value(ResultRecord::new(head())).expect("encoded");
        json["options"] = options;
        let r: ResultRecord = serde_json::from_value(json).expect("decoded");
        let o = r.options.expect("options");
        assert!(!o.transport.nodelay && !o.verify);
        assert_eq!(o.transport.sndbuf_bytes, Some(262144));
        assert_eq!(
            o.transport,
            crate::spec::TransportOptions {
                nodelay: false,
                sndbuf_bytes: Some(262144),
                ..crate::spec::TransportOptions::default()
            }
        );
        assert_eq!(o.placement.server_cpu, Some(1));
    }

    /// What the report has always read leniently reads so in the record:
    /// a field of another shape is absent, the rest of the record loads.
    #[test]
    fn fields_of_another_shape_read_as_absent_instead_of_failing_the_record() {
        let mut json = serde_json::to_value(ResultRecord::new(head()).with_sweep(SweepSection {
            sweep_kind: "stream".into(),
            block_time_us: 2.5,
            dropout: None,
            unstable: None,
        }))
        .expect("encoded");
        json["interleaved"] = serde_json::json!({"group": "g", "with": ["a", "b"]});
        json["dropout"] = serde_json::json!({"depth": 3});
        json["ci_target"] = serde_json::json!({"met": "no"});
        json["stats"] = serde_json::json!({"ci95_low": null, "ci95_high": null, "reps": [1.0]});
        let r: ResultRecord = serde_json::from_value(json).expect("loads");
        assert_eq!(
            r.interleaved,
            Some(Interleaved {
                group: "g".into(),
                with: None
            })
        );
        assert_eq!(r.interleaved_group(), Some("g"));
        assert_eq!(r.sweep_kind(), Some("stream"));
        assert_eq!(r.block_time_us(), Some(2.5));
        assert_eq!(r.dropout(), None);
        assert_eq!(r.ci_target, None);
        assert_eq!(r.stats, None);
        // Written back, the top-level group stays where it was read.
        let again = serde_json::to_value(&r).expect("encoded");
        assert_eq!(
            again["interleaved"],
            serde_json::json!({"group": "g", "with": null})
        );
        assert!(again.get("dropout").is_none(), "{again}");
    }

    #[test]
    fn a_clean_flow_has_no_note_and_a_lossy_one_says_how_lossy() {
        let clean = DatagramStats {
            datagrams_sent: 100,
            datagrams_received: 100,
            ..DatagramStats::default()
        };
        let pair = DatagramCounts {
            client: clean,
            server: clean,
        };
        assert_eq!(pair.note(), None);
        let lossy = DatagramCounts {
            client: DatagramStats {
                retries: 2,
                ..clean
            },
            server: DatagramStats {
                datagrams_received: 96,
                lost: 5,
                lost_bytes: 5 * 1024,
                reordered: 1,
                dropped: 3,
                ..clean
            },
        };
        assert_eq!(
            lossy.note().as_deref(),
            Some("lost 2.50% (5 dgrams), reordered 1, retries 2, dropped 3")
        );
    }
}
