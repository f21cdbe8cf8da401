//! From what the user asked for to what will be measured. A [`RunRequest`]
//! is the typed input: the command line builds it from flags it has already
//! parsed (sizes, durations, lists, addresses), the default battery builds it
//! directly. Every kind of run (point-to-point, sweep, logp, multi-host,
//! MPI) validates its shared flags once into [`Settings`] (stacks, method,
//! agent, outputs, conditions), each from its own raw request under the
//! names of its own flags, and adds only what is its own: its tests, sizes
//! and counts. [`Plan::from_request`] is the point-to-point run's; every
//! check fails with a [`PlanError`] naming the flag.
//!
//! A field of the request that the user did not give is `None` (or empty),
//! so a plan can tell a default from a choice and refuse a flag that does
//! nothing for what is asked.

use crate::bench;
use crate::cluster::{HostsArg, HostsError, HostsSource, TestbedPath};
use crate::conditions::{cross, Condition, ConditionAxis, ConditionError};
use crate::control::ControlAddr;
use crate::runner::{CiTarget, IterationPolicy, Method, DEFAULT_CI_REPS};
use netgap_core::spec::{
    check_size, Mode, PointSpec, RangeError, TransportOptions, MAX_ITERATIONS,
};
use netgap_core::units::format_size;
use netgap_transport as transport;
use netgap_transport::options::{OptionDecl, OptionError, OptionValue};
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::time::Duration;

/// The agent's control port when `--peer` names none.
pub const DEFAULT_PORT: u16 = 7100;
/// Default repetitions per point (the seeds' method).
pub(crate) const DEFAULT_REPS: u32 = 10;
/// Default time budget of one repetition.
pub const DEFAULT_REP_TIME: Duration = Duration::from_millis(100);
/// Default data-path inactivity timeout.
pub(crate) const DEFAULT_TIMEOUT: Duration = Duration::from_secs(3);
/// Default message sizes of point-to-point runs, in bytes.
pub const DEFAULT_SIZES_BYTES: [u64; 6] = [1, 64, 1024, 16 * 1024, 64 * 1024, 1024 * 1024];
/// Most repetitions per point.
pub(crate) const MAX_REPS: u32 = 10_000;
/// Iterations per repetition of `--paper` (the seeds' setting).
pub(crate) const PAPER_ITERATIONS: u64 = 100_000;
/// Shortest `--rep-time`.
const MIN_REP_TIME: Duration = Duration::from_micros(100);
/// Longest `--rep-time`.
const MAX_REP_TIME: Duration = Duration::from_secs(3600);
/// Shortest `--timeout`.
const MIN_TIMEOUT: Duration = Duration::from_millis(10);

/// The tests of the main job, in order: latency and bandwidth, the two
/// halves of the gap.
pub const BATTERY_TESTS: [&str; 2] = ["pingpong", "stream"];
/// The stacks the main job compares on loopback, the baseline (tcp)
/// first: those of them available on this host.
pub const BATTERY_TRANSPORTS: [&str; 5] = ["tcp", "unix", "shm", "uring", "udp"];
/// The main job's sizes: small, medium and large messages (udp leaves out
/// the largest).
pub const BATTERY_SIZES_BYTES: [u64; 3] = [64, 16 << 10, 1 << 20];
/// The main job's time budget per repetition: long enough that a
/// repetition's figure is steady on a small shared machine, short enough
/// that the job takes about a minute.
const BATTERY_REP_TIME: Duration = Duration::from_millis(100);

/// An agent's control address as given to `--peer`, resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerAddr {
    /// As typed, for messages.
    pub label: String,
    /// The resolved control address.
    pub addr: ControlAddr,
}

impl PeerAddr {
    /// Parses and resolves `HOST[:PORT]` (port 7100 by default),
    /// `[V6]:PORT`, a bare IPv6 address or `unix:PATH`.
    pub fn parse(text: &str) -> Result<PeerAddr, PlanError> {
        let t = text.trim();
        let addr = match ControlAddr::parse(t) {
            Some(a @ ControlAddr::Unix(_)) => a,
            _ => ControlAddr::Tcp(resolve_peer(t)?),
        };
        Ok(PeerAddr {
            label: text.to_string(),
            addr,
        })
    }
}

/// Where the agents are.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Target {
    /// `--peer`: the agent of a point-to-point run.
    pub peer: Option<PeerAddr>,
    /// `--hosts`: the agents of a workload run.
    pub hosts: Option<HostsArg>,
    /// `--wait`: how long a run waits for the agents of `@slurm` or
    /// `@hostfile` to answer (default: `--timeout`).
    pub wait: Option<Duration>,
    /// `-6`: IPv6 loopback for the in-process agent.
    pub ipv6: bool,
}

/// One transport option given, with its value.
#[derive(Debug, Clone, PartialEq)]
pub struct OptionSetting {
    /// The option's declaration (by the transport that honours it).
    pub decl: &'static OptionDecl,
    /// The value given.
    pub value: OptionValue,
}

/// Transports, modes and options to measure over.
#[derive(Debug, Clone, PartialEq)]
pub struct TransportChoice {
    /// Transport names, in order (`-t`).
    pub transports: Vec<String>,
    /// Completion modes, in order (`--mode`).
    pub modes: Vec<Mode>,
    /// Transport options given (none: every option at its default).
    pub options: Vec<OptionSetting>,
}

impl Default for TransportChoice {
    /// tcp, event mode, no option.
    fn default() -> Self {
        TransportChoice {
            transports: vec!["tcp".into()],
            modes: vec![Mode::Event],
            options: Vec::new(),
        }
    }
}

/// `--pin C,S`: CPUs of the client and server roles.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pin {
    /// CPU of the client role.
    pub client_cpu: u32,
    /// CPU of the server role.
    pub server_cpu: u32,
}

impl Pin {
    /// Parses `--pin`'s value: `CLIENT_CPU,SERVER_CPU`, or one CPU for
    /// both; the command line and a study's figures alike.
    pub fn parse(text: &str) -> Result<Pin, String> {
        let cpu = |c: &str| {
            c.trim()
                .parse::<u32>()
                .map_err(|_| format!("{c:?} is not a CPU number"))
        };
        match text.split(',').collect::<Vec<_>>().as_slice() {
            [c, s] => Ok(Pin {
                client_cpu: cpu(c)?,
                server_cpu: cpu(s)?,
            }),
            [c] => Ok(Pin {
                client_cpu: cpu(c)?,
                server_cpu: cpu(c)?,
            }),
            _ => Err("expected CLIENT_CPU,SERVER_CPU such as 0,1".into()),
        }
    }
}

/// Parses a list of counts, `N[,N...]` (`--clients`, `-P`, `--links`);
/// empty items are dropped, and at least one count is given.
pub fn parse_counts(text: &str) -> Result<Vec<u32>, String> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        out.push(
            part.parse::<u32>()
                .map_err(|_| format!("{part:?} is not a count"))?,
        );
    }
    if out.is_empty() {
        return Err("no count given".into());
    }
    Ok(out)
}

/// `--ci LEVEL,WIDTH`, unchecked.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CiSpec {
    /// Confidence level in percent.
    pub confidence_pct: f64,
    /// Largest half-width in percent of the mean.
    pub half_width_pct: f64,
}

/// How each point is measured; `None` leaves the command's default.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct MethodSpec {
    /// `--sizes`, in bytes.
    pub sizes: Option<Vec<u64>>,
    /// `--reps`.
    pub reps: Option<u32>,
    /// `--iterations`.
    pub iterations: Option<u64>,
    /// `--rep-time`.
    pub rep_time: Option<Duration>,
    /// `--warmup`, iterations.
    pub warmup: Option<u64>,
    /// `--paper`.
    pub paper: bool,
    /// `--ci`.
    pub ci: Option<CiSpec>,
    /// `--ci-reps MIN,MAX`.
    pub ci_reps: Option<(u32, u32)>,
    /// `--timeout`.
    pub timeout: Option<Duration>,
    /// `--pin`.
    pub pin: Option<Pin>,
    /// `--verify`.
    pub verify: bool,
    /// `--align`, `--offset`.
    pub buffer: BufferFlags,
}

/// Where each message buffer's data starts, as `--align` and `--offset`
/// give it (NetPIPE's `-A` and `-O`); `None` leaves the default (data on a
/// page boundary).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BufferFlags {
    /// `--align BYTES`: a power of two.
    pub align_bytes: Option<u64>,
    /// `--offset BYTES`: below the alignment.
    pub offset_bytes: Option<u64>,
}

/// Where results go, and what they are called.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Outputs {
    /// `--json`: JSON Lines file to append to.
    pub json: Option<PathBuf>,
    /// `--csv`: CSV file to append to.
    pub csv: Option<PathBuf>,
    /// `--label`: the user's name for the stack, in every record's
    /// `stack.label`.
    pub label: Option<String>,
}

/// Longest `--label`, in bytes.
pub const MAX_LABEL_BYTES: usize = 100;

/// `--conditions` and `--interleave`: what one run alternates between.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Interleaving {
    /// `--conditions KEY=V,V ...`: one axis per key; the run measures the
    /// cross product.
    pub conditions: Vec<ConditionAxis>,
    /// `--interleave`: alternate the repetitions of the stacks of a run
    /// (transports, modes) at each test and size.
    pub interleave: bool,
}

/// The flags of workloads; `None` leaves the default.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MultiHostSpec {
    /// `--clients`: one point per count.
    pub clients: Option<Vec<u32>>,
    /// `--streams`: one point per count (multistream).
    pub streams: Option<Vec<u32>>,
    /// `--duration`: measured window of each repetition.
    pub duration: Option<Duration>,
    /// `--links`: multirail's link counts, one point per count (the first
    /// K links of the hosts file, or K loopback links of an in-process
    /// run).
    pub links: Option<Vec<u32>>,
    /// `--bidir`: every flow of a bandwidth test carries payload both ways
    /// at once (multistream, multirail).
    pub bidir: bool,
    /// `--client-hosts`: in-process client hosts of a workload run.
    pub client_hosts: Option<u32>,
    /// The workloads' own options given (`--trace zipf`), as (flag without
    /// dashes, value as typed; empty for a switch), in command-line order;
    /// the workload plan parses them with their declarations
    /// ([`netgap_workload::options`]).
    pub workload_options: Vec<(String, String)>,
}

/// Everything a run asks for, typed; the input of every plan.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RunRequest {
    /// Test names, in order.
    pub tests: Vec<String>,
    /// Where the agents are.
    pub target: Target,
    /// `--key`: the shared key file of the agents.
    pub key_file: Option<PathBuf>,
    /// Transports, modes, options.
    pub transport: TransportChoice,
    /// Sizes, repetitions and the data-path settings.
    pub method: MethodSpec,
    /// Results files.
    pub outputs: Outputs,
    /// Flags of workloads.
    pub multi_host: MultiHostSpec,
    /// Conditions and stacks to alternate.
    pub interleaving: Interleaving,
}

impl RunRequest {
    /// A request for `tests` with every flag at its default.
    pub fn new(tests: &[&str]) -> RunRequest {
        RunRequest {
            tests: tests.iter().map(|t| t.to_string()).collect(),
            ..RunRequest::default()
        }
    }
}

/// Where the agent is.
#[derive(Debug, Clone)]
pub enum Peer {
    /// An agent started in this process on loopback.
    Embedded {
        /// Use ::1 instead of 127.0.0.1.
        ipv6: bool,
    },
    /// A running `netgap serve`.
    Remote {
        /// As typed.
        label: String,
        /// Resolved control address.
        addr: ControlAddr,
    },
    /// The first two hosts of `--hosts` (a hosts file, a testbed's among
    /// them, a launcher's nodes, a list of agents), neither of them this
    /// process: the first host's agent plays the server role and the second
    /// host's the client role, and this process only coordinates them.
    Agents {
        /// The two hosts, server first, from where `--hosts` named them.
        hosts: HostsSource,
    },
}

/// A validated run: the settings its points share and the points.
#[derive(Debug, Clone)]
pub struct Plan {
    /// Points in measurement order.
    pub points: Vec<PointSpec>,
    /// What every point shares: method, agent, outputs, conditions.
    pub settings: Settings,
    /// The sizes a transport of the run cannot carry, left out of its
    /// points; the other transports measure them.
    pub skipped: Vec<SkippedSizes>,
}

/// The sizes of a run over several transports that one of them cannot
/// carry: left out of that transport's points, and said in one line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedSizes {
    /// The transport.
    pub transport: String,
    /// The largest message it carries, in bytes.
    pub max_bytes: u64,
    /// The sizes left out, in bytes, in the order given.
    pub sizes_bytes: Vec<u64>,
}

impl std::fmt::Display for SkippedSizes {
    /// `udp carries at most 65507 bytes a message: skipping 1M, 4M`; a
    /// sweep's many sizes as their count and range.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        const LISTED: usize = 4;
        let sizes = match (self.sizes_bytes.first(), self.sizes_bytes.last()) {
            (Some(&first), Some(&last)) if self.sizes_bytes.len() > LISTED => format!(
                "its {} sizes from {} to {}",
                self.sizes_bytes.len(),
                format_size(first),
                format_size(last)
            ),
            _ => self
                .sizes_bytes
                .iter()
                .map(|&s| format_size(s))
                .collect::<Vec<_>>()
                .join(", "),
        };
        write!(
            f,
            "{} carries at most {} bytes a message: skipping {sizes}",
            self.transport, self.max_bytes
        )
    }
}

/// The transports, modes and options of a run, validated: each transport
/// is available here and honours every option given.
#[derive(Clone)]
pub struct Stacks {
    /// The transports, in the order given.
    pub transports: Vec<&'static dyn transport::Transport>,
    /// The completion modes, in the order given.
    pub modes: Vec<Mode>,
    /// The options as both ends apply them.
    pub options: TransportOptions,
}

impl std::fmt::Debug for Stacks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.transports.iter().map(|t| t.name()).collect();
        f.debug_struct("Stacks")
            .field("transports", &names)
            .field("modes", &self.modes)
            .field("options", &self.options)
            .finish()
    }
}

/// What the points of every kind of run share (point-to-point, sweep,
/// logp, multi-host, MPI), validated once from a command's raw request:
/// each command adds only what is its own (its tests, sizes, counts).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Transports, modes and options.
    pub stacks: Stacks,
    /// Repetitions, iterations, warm-up.
    pub method: Method,
    /// The data path's inactivity timeout of every point, in ms.
    pub io_timeout_ms: u32,
    /// CPU of the client role, if pinned.
    pub client_cpu: Option<u32>,
    /// CPU of the server role, if pinned.
    pub server_cpu: Option<u32>,
    /// `--verify`: check every payload byte.
    pub verify: bool,
    /// The agent.
    pub peer: Peer,
    /// `--hosts`, loaded once.
    pub hosts: Option<HostsSource>,
    /// JSON Lines output.
    pub json: Option<PathBuf>,
    /// CSV output.
    pub csv: Option<PathBuf>,
    /// Shared key file the agent requires.
    pub key_file: Option<PathBuf>,
    /// `--label`, for every record's `stack.label`.
    pub label: Option<String>,
    /// The testbed the hosts file describes (topology and link
    /// conditions), for every record's `stack.path`; `None` off a testbed.
    pub testbed: Option<TestbedPath>,
    /// The conditions to alternate between (the cross product of
    /// `--conditions`); empty for a run under the conditions in force.
    pub conditions: Vec<Condition>,
    /// The testbed to switch conditions on (its `--name`), when
    /// `conditions` is not empty.
    pub testbed_name: Option<String>,
    /// `--interleave`: alternate the stacks' repetitions at each test and
    /// size.
    pub interleave: bool,
}

/// The flags every measuring command shares, borrowed from its own raw
/// request: each command's request lends its fields here under the names
/// its flags have, so an error names the flag the user typed.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Common<'a> {
    /// Where the agents are.
    pub target: &'a Target,
    /// `--key`.
    pub key_file: Option<&'a PathBuf>,
    /// Transports, modes, options.
    pub transport: &'a TransportChoice,
    /// How many repetitions of what length, with the flags that gave them.
    pub repetitions: Repetitions,
    /// `--warmup`, iterations.
    pub warmup: Option<u64>,
    /// `--ci`.
    pub ci: Option<CiSpec>,
    /// `--ci-reps`.
    pub ci_reps: Option<(u32, u32)>,
    /// `--timeout`.
    pub timeout: Option<Duration>,
    /// `--pin`.
    pub pin: Option<Pin>,
    /// `--verify`.
    pub verify: bool,
    /// `--align`, `--offset`.
    pub buffer: BufferFlags,
    /// Results files and label.
    pub outputs: &'a Outputs,
    /// `--conditions`, `--interleave`.
    pub interleaving: &'a Interleaving,
}

/// The repetitions of each point as one command's flags give them, each
/// with its flag's name (`--reps`, or sweep's `--trials`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Repetitions {
    /// Measured repetitions, and the flag.
    pub reps: (u32, &'static str),
    /// Iterations of each repetition.
    pub iterations: Iterations,
}

/// The iterations of a repetition as a command's flags give them.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Iterations {
    /// `--iterations N`.
    Fixed(u64),
    /// `--paper`: the seeds' fixed count and repetitions.
    Paper,
    /// A time budget, and the flag that gave it (`--rep-time`,
    /// `--trial-time`).
    Budget(Duration, &'static str),
}

impl Repetitions {
    /// The repetitions of `netgap run` and `logp` from their method flags,
    /// `default_rep_time` without `--iterations`, `--rep-time` or `--paper`.
    pub(crate) fn of_method(m: &MethodSpec, default_rep_time: Duration) -> Repetitions {
        let iterations = match (m.paper, m.iterations) {
            (true, _) => Iterations::Paper,
            (false, Some(n)) => Iterations::Fixed(n),
            (false, None) => {
                Iterations::Budget(m.rep_time.unwrap_or(default_rep_time), "--rep-time")
            }
        };
        Repetitions {
            reps: (m.reps.unwrap_or(DEFAULT_REPS), "--reps"),
            iterations,
        }
    }
}

/// The sizes of a run's points, and the flag that gave them.
#[derive(Debug, Clone)]
pub(crate) struct Sizes {
    /// Message sizes, in bytes, in order.
    pub bytes: Vec<u64>,
    /// The flag that gave them (`--sizes`; sweep's `--start/--end`).
    pub flag: &'static str,
}

/// Why a request cannot be measured: one line naming the flag.
#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    /// Links used at once whose limits sum past what the machine under the
    /// testbed carries through its shapers.
    #[error(
        "--links {links}: {shapers} shaped link directions at {rate} carry {need_gbps:.2} Gbit/s \
         of tcp payload at once, more than {share_pct:.0}% of the {forwarding_gbps:.1} Gbit/s \
         this machine forwards through the testbed's shapers, so the emulator, not the links, \
         would bound them; set the links to {carried} or less (netgap testbed set --rate \
         {carried}) or use fewer links"
    )]
    PastForwarding {
        /// Most links of a point.
        links: u32,
        /// Shaped link directions at once (links, twice with `--bidir`).
        shapers: u32,
        /// The links' rate, as the flags take it.
        rate: String,
        /// Their payload limit together, Gbit/s.
        need_gbps: f64,
        /// [`netgap_core::physics::FORWARDING_CARRY_SHARE`] in percent.
        share_pct: f64,
        /// What the machine forwards, Gbit/s.
        forwarding_gbps: f64,
        /// The fastest rate it carries for them, as the flags take it.
        carried: String,
    },
    /// A test name not in the registry.
    #[error("unknown test {name:?}; available: {available}")]
    UnknownTest {
        /// As given.
        name: String,
        /// The registered names.
        available: String,
    },
    /// A transport name not in the registry.
    #[error("unknown transport {name:?}; available: {available}")]
    UnknownTransport {
        /// As given.
        name: String,
        /// The registered names.
        available: String,
    },
    /// A transport this host cannot run.
    #[error("transport {name} is not available here: {why}")]
    Unavailable {
        /// The transport.
        name: String,
        /// Why not.
        why: netgap_transport::Unavailable,
    },
    /// An empty list.
    #[error("no {what} given; {hint}")]
    Empty {
        /// `test`, `transport`, `mode`.
        what: &'static str,
        /// What to give.
        hint: &'static str,
    },
    /// A value out of its range.
    #[error("{flag} {value}: {detail}")]
    Invalid {
        /// The flag, as typed (`--reps`).
        flag: &'static str,
        /// The value given.
        value: String,
        /// The allowed range or what is wrong.
        detail: String,
    },
    /// A message size out of the range every test accepts.
    #[error("{flag}: size {size_bytes} is out of range: sizes go from 1 byte to {max}")]
    SizeOutOfRange {
        /// The flag that gave it (`--sizes`).
        flag: &'static str,
        /// The size, in bytes.
        size_bytes: u64,
        /// The largest size, formatted.
        max: String,
    },
    /// A message size above what a transport carries.
    #[error("{flag}: size {size} is larger than the largest message transport {transport} carries, {max_bytes} bytes")]
    TooLarge {
        /// The flag that gave it (`--sizes`).
        flag: &'static str,
        /// The size, formatted.
        size: String,
        /// The transport.
        transport: String,
        /// Its largest message, in bytes.
        max_bytes: u64,
    },
    /// A flag that would have no effect on what is asked.
    #[error("{flag} does not apply to {what}: {reason}")]
    NoEffect {
        /// The flag, as typed.
        flag: String,
        /// The tests or command asked for.
        what: String,
        /// Why, and what to do instead.
        reason: String,
    },
    /// A transport option a chosen transport does not honour.
    #[error("{flag} does not apply to transport {transport} ({takes})")]
    OptionNotTaken {
        /// The option's flag.
        flag: String,
        /// The transport.
        transport: String,
        /// What it takes instead.
        takes: String,
    },
    /// A transport option's value out of range.
    #[error(transparent)]
    Option(#[from] OptionError),
    /// A `--conditions` list that cannot be used.
    #[error("--conditions: {0}")]
    Conditions(#[from] ConditionError),
    /// A flag that needs another one.
    #[error("{flag} needs {needs}: {reason}")]
    Needs {
        /// The flag given.
        flag: &'static str,
        /// The flags it needs.
        needs: &'static str,
        /// Why.
        reason: &'static str,
    },
    /// A same-host transport toward a remote agent.
    #[error(
        "transport {transport} works only on one host, but --peer {peer} is not a loopback address"
    )]
    SameHostOnly {
        /// The transport.
        transport: String,
        /// The peer as typed.
        peer: String,
    },
    /// A mode the transport lacks.
    #[error("transport {transport} has no {mode} mode")]
    NoMode {
        /// The transport.
        transport: String,
        /// The mode.
        mode: Mode,
    },
    /// `--peer` names no usable agent.
    #[error("bad peer {peer:?}: {detail}")]
    BadPeer {
        /// As typed.
        peer: String,
        /// What is wrong.
        detail: String,
    },
    /// A point the protocol's own checks refuse.
    #[error("invalid option: {0}")]
    Spec(#[from] RangeError),
    /// The hosts file or list is unusable.
    #[error(transparent)]
    Hosts(#[from] HostsError),
    /// Multi-host and point-to-point tests in one run.
    #[error(
        "workloads ({}) cannot be mixed with point-to-point tests in one run",
        netgap_workload::names()
    )]
    MixedTests,
    /// A multi-host workload refuses the transport, mode or options.
    #[error(transparent)]
    Workload(#[from] netgap_workload::Refused),
    /// More in-process flows than this process may hold descriptors for.
    #[error("--clients {clients}: in-process agents hold both ends of every flow in this process, {needed} descriptors, but the limit is {limit}; run `netgap serve` on each host and give --hosts, or raise the hard limit (ulimit -Hn, /etc/security/limits.conf)")]
    Descriptors {
        /// The largest client count asked for.
        clients: u32,
        /// Descriptors needed.
        needed: u64,
        /// The hard limit.
        limit: u64,
    },
}

/// A [`PlanError::NoEffect`].
pub(crate) fn no_effect(flag: &str, what: &str, reason: impl Into<String>) -> PlanError {
    PlanError::NoEffect {
        flag: flag.to_string(),
        what: what.to_string(),
        reason: reason.into(),
    }
}

/// A [`PlanError::Invalid`].
/// `--align` and `--offset`, checked: the alignment a power of two up to
/// 1 GiB, the offset below it (below this host's page without `--align`).
/// An alignment equal to the default is still recorded: the user asked
/// for it by name.
fn buffer_layout_of(b: BufferFlags) -> Result<(Option<u32>, u32), PlanError> {
    use netgap_core::spec::MAX_BUFFER_ALIGN_BYTES;
    let align = match b.align_bytes {
        None => None,
        Some(a) if !a.is_power_of_two() || a > u64::from(MAX_BUFFER_ALIGN_BYTES) => {
            return Err(invalid(
                "--align",
                a,
                format!("must be a power of two from 1 to {MAX_BUFFER_ALIGN_BYTES} bytes"),
            ))
        }
        Some(a) => Some(a as u32),
    };
    let limit = align.map_or(netgap_transport::buffer::page_bytes() as u64, u64::from);
    let offset = b.offset_bytes.unwrap_or(0);
    if offset >= limit {
        let of = if align.is_some() {
            "--align"
        } else {
            "the page size; --align sets a larger one"
        };
        return Err(invalid(
            "--offset",
            offset,
            format!("must be below the alignment, {limit} bytes ({of})"),
        ));
    }
    Ok((align, offset as u32))
}

pub(crate) fn invalid(
    flag: &'static str,
    value: impl ToString,
    detail: impl Into<String>,
) -> PlanError {
    PlanError::Invalid {
        flag,
        value: value.to_string(),
        detail: detail.into(),
    }
}

/// A duration as a user would type it (`100ms`).
pub(crate) fn show(d: Duration) -> String {
    humantime::format_duration(d).to_string()
}

/// Parses `HOST[:PORT]`, `[V6]:PORT` or a bare IPv6 address.
pub(crate) fn resolve_peer(s: &str) -> Result<SocketAddr, PlanError> {
    let s = s.trim();
    let bad = |detail: String| PlanError::BadPeer {
        peer: s.to_string(),
        detail,
    };
    if s.is_empty() {
        return Err(bad("empty --peer".into()));
    }
    let with_port = if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        SocketAddr::new(ip, DEFAULT_PORT).to_string()
    } else if s.starts_with('[') && s.ends_with(']') {
        format!("{s}:{DEFAULT_PORT}")
    } else if s.contains(':') {
        s.to_string()
    } else {
        format!("{s}:{DEFAULT_PORT}")
    };
    let mut addrs = with_port
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| bad("the name resolves to no address".into()))
}

/// Refuses `--interleave` for `what` (workloads), which do not
/// alternate repetitions; their `--conditions` run every point under one
/// condition after another ([`crate::workload_run::run_workload_plan_under`]).
pub fn refuse_interleaving(r: &RunRequest, what: &str) -> Result<(), PlanError> {
    let i = &r.interleaving;
    let reason = "only point-to-point tests alternate repetitions across stacks";
    if i.interleave {
        return Err(no_effect("--interleave", what, reason));
    }
    Ok(())
}

/// A `--label`: 1 to [`MAX_LABEL_BYTES`] bytes of printable text.
fn check_label(label: Option<&str>) -> Result<Option<String>, PlanError> {
    let Some(l) = label else { return Ok(None) };
    if l.trim().is_empty() || l.len() > MAX_LABEL_BYTES || l.chars().any(char::is_control) {
        return Err(invalid(
            "--label",
            format!("{l:?}"),
            format!("want 1 to {MAX_LABEL_BYTES} bytes of printable text"),
        ));
    }
    Ok(Some(l.trim().to_string()))
}

/// The `--ci` target of a method; `None` without `--ci`.
pub fn ci_target(
    ci: Option<CiSpec>,
    ci_reps: Option<(u32, u32)>,
) -> Result<Option<CiTarget>, PlanError> {
    let Some(ci) = ci else { return Ok(None) };
    let (min, max) = ci_reps.unwrap_or(DEFAULT_CI_REPS);
    for n in [min, max] {
        if n > MAX_REPS {
            return Err(invalid(
                "--ci-reps",
                format!("{min},{max}"),
                format!("{n} is above {MAX_REPS} repetitions"),
            ));
        }
    }
    CiTarget::new(ci.confidence_pct, ci.half_width_pct, min, max)
        .map(Some)
        .map_err(|e| {
            invalid(
                "--ci",
                format!(
                    "{},{} --ci-reps {min},{max}",
                    ci.confidence_pct, ci.half_width_pct
                ),
                e.to_string(),
            )
        })
}

/// Refuses the flags of workloads in a point-to-point request: they
/// would change nothing. `what` names the tests or command in the message.
pub(crate) fn refuse_workload_flags(r: &RunRequest, what: &str) -> Result<(), PlanError> {
    let m = &r.multi_host;
    let reason = format!("it is a flag of workloads ({})", netgap_workload::names());
    for (flag, given) in [
        ("--clients", m.clients.is_some()),
        ("--streams", m.streams.is_some()),
        ("--duration", m.duration.is_some()),
        ("--links", m.links.is_some()),
        ("--client-hosts", m.client_hosts.is_some()),
    ] {
        if given {
            return Err(no_effect(flag, what, reason));
        }
    }
    if let Some((flag, _)) = m.workload_options.first() {
        let takers = netgap_workload::options::workloads_taking(flag).join(", ");
        return Err(no_effect(
            &format!("--{flag}"),
            what,
            format!("it is an option of {takers}"),
        ));
    }
    if r.target.ipv6 && r.target.peer.is_some() {
        return Err(no_effect(
            "-6",
            what,
            "it picks IPv6 loopback for the in-process agent, and --peer names an agent; give --peer an IPv6 address instead",
        ));
    }
    Ok(())
}

/// The transports of a request, looked up and available here.
pub(crate) fn transports_of(
    c: &TransportChoice,
) -> Result<Vec<&'static dyn transport::Transport>, PlanError> {
    let mut out = Vec::new();
    for name in &c.transports {
        let t = transport::find(name).ok_or_else(|| PlanError::UnknownTransport {
            name: name.clone(),
            available: transport::names(),
        })?;
        if let Err(why) = t.availability() {
            return Err(PlanError::Unavailable {
                name: name.clone(),
                why,
            });
        }
        out.push(t);
    }
    if out.is_empty() {
        return Err(PlanError::Empty {
            what: "transport",
            hint: "see `netgap list`",
        });
    }
    Ok(out)
}

/// The point-to-point tests named, looked up; at least one.
pub(crate) fn bench_tests(names: &[String]) -> Result<Vec<&'static dyn bench::Test>, PlanError> {
    let mut tests = Vec::new();
    for name in names {
        tests.push(bench::find(name).ok_or_else(|| PlanError::UnknownTest {
            name: name.clone(),
            available: bench::names(),
        })?);
    }
    if tests.is_empty() {
        return Err(PlanError::Empty {
            what: "test",
            hint: "see `netgap list`",
        });
    }
    Ok(tests)
}

/// The options of a request as both ends apply them and results record
/// them; an option a chosen transport does not honour is refused.
pub(crate) fn options_of(
    c: &TransportChoice,
    transports: &[&'static dyn transport::Transport],
) -> Result<TransportOptions, PlanError> {
    let mut options = TransportOptions::default();
    for s in &c.options {
        for tr in transports {
            let honoured = tr.capabilities().options;
            if !honoured.contains(&s.decl) {
                let takes = if honoured.is_empty() {
                    "it takes no options".to_string()
                } else {
                    let list: Vec<String> = honoured.iter().map(|o| o.long()).collect();
                    format!("it takes {}", list.join(", "))
                };
                return Err(PlanError::OptionNotTaken {
                    flag: s.decl.long(),
                    transport: tr.name().to_string(),
                    takes,
                });
            }
        }
        s.decl.apply_value(&mut options, &s.value)?;
    }
    Ok(options)
}

/// Where the two roles of a point-to-point run over `--hosts` go, and the
/// hosts file's key: on the first two hosts' agents, the first serving,
/// whatever the hosts are (a testbed's namespaces too: the testbed starts an
/// agent in each).
fn p2p_hosts(hosts: HostsSource) -> Result<(Peer, Option<PathBuf>), PlanError> {
    const TWO: &str =
        "a point-to-point test needs two hosts: the first serves, the second is the client";
    if hosts.hosts() < 2 {
        return Err(invalid("--hosts", hosts.label(), TWO));
    }
    Ok(match hosts {
        HostsSource::File(mut f) => {
            let key = f.key_file.clone();
            f.hosts.truncate(2);
            (
                Peer::Agents {
                    hosts: HostsSource::File(f),
                },
                key,
            )
        }
        HostsSource::Addrs(mut a) => {
            a.truncate(2);
            (
                Peer::Agents {
                    hosts: HostsSource::Addrs(a),
                },
                None,
            )
        }
        HostsSource::Nodes {
            launcher,
            mut nodes,
            wait,
        } => {
            nodes.truncate(2);
            (
                Peer::Agents {
                    hosts: HostsSource::Nodes {
                        launcher,
                        nodes,
                        wait,
                    },
                },
                None,
            )
        }
        HostsSource::Embedded { .. } => (
            Peer::Agents {
                hosts: HostsSource::Embedded {
                    client_hosts: 1,
                    links: 1,
                },
            },
            None,
        ),
    })
}

impl RunRequest {
    /// The shared flags of a run (and of logp, which takes the same flags),
    /// with its repetitions at `default_rep_time` unless given.
    pub(crate) fn common(&self, default_rep_time: Duration) -> Common<'_> {
        let m = &self.method;
        Common {
            target: &self.target,
            key_file: self.key_file.as_ref(),
            transport: &self.transport,
            repetitions: Repetitions::of_method(m, default_rep_time),
            warmup: m.warmup,
            ci: m.ci,
            ci_reps: m.ci_reps,
            timeout: m.timeout,
            pin: m.pin,
            verify: m.verify,
            buffer: m.buffer,
            outputs: &self.outputs,
            interleaving: &self.interleaving,
        }
    }

    /// The sizes of point-to-point tests: `--sizes`, or `default`.
    pub(crate) fn sizes(&self, default: &[u64]) -> Sizes {
        Sizes {
            bytes: self
                .method
                .sizes
                .clone()
                .unwrap_or_else(|| default.to_vec()),
            flag: "--sizes",
        }
    }
}

impl Stacks {
    /// The transports and options of a choice, looked up, available here
    /// and honouring every option given.
    fn validate(c: &TransportChoice) -> Result<Stacks, PlanError> {
        let transports = transports_of(c)?;
        if c.modes.is_empty() {
            return Err(PlanError::Empty {
                what: "mode",
                hint: "use event or poll",
            });
        }
        Ok(Stacks {
            options: options_of(c, &transports)?,
            transports,
            modes: c.modes.clone(),
        })
    }

    /// Refuses a size out of the range every test accepts or above what a
    /// transport carries, naming the flag that gave it.
    pub(crate) fn check_size(&self, size_bytes: u64, flag: &'static str) -> Result<(), PlanError> {
        check_size(size_bytes).map_err(|_| PlanError::SizeOutOfRange {
            flag,
            size_bytes,
            max: format_size(netgap_core::spec::MAX_SIZE_BYTES),
        })?;
        self.check_size_on(size_bytes, flag, self.transports.iter().copied())
    }

    /// Refuses a size above what one of `transports` carries.
    pub(crate) fn check_size_on<'t>(
        &self,
        size_bytes: u64,
        flag: &'static str,
        transports: impl IntoIterator<Item = &'t dyn transport::Transport>,
    ) -> Result<(), PlanError> {
        for t in transports {
            let max = t.max_message_bytes().unwrap_or(u64::MAX);
            if size_bytes > max {
                return Err(PlanError::TooLarge {
                    flag,
                    size: format_size(size_bytes),
                    transport: t.name().to_string(),
                    max_bytes: max,
                });
            }
        }
        Ok(())
    }
}

impl Settings {
    /// Validates what every kind of run shares, once. `what` names the
    /// tests or command in messages.
    pub(crate) fn new(c: &Common<'_>, what: &str) -> Result<Settings, PlanError> {
        let t = c.target;
        if c.key_file.is_some() && t.peer.is_none() && t.hosts.is_none() {
            return Err(PlanError::Needs {
                flag: "--key",
                needs: "--peer or --hosts",
                reason: "in-process agents run without a key",
            });
        }
        let mut stacks = Stacks::validate(c.transport)?;
        let (align, offset) = buffer_layout_of(c.buffer)?;
        stacks.options.buffer_align_bytes = align;
        stacks.options.buffer_offset_bytes = offset;
        let method = method_of(c)?;
        let timeout = c.timeout.unwrap_or(DEFAULT_TIMEOUT);
        if timeout < MIN_TIMEOUT
            || timeout.as_millis() > u128::from(netgap_core::spec::MAX_IO_TIMEOUT_MS)
        {
            return Err(invalid(
                "--timeout",
                show(timeout),
                "must be between 10ms and 10m",
            ));
        }
        let (client_cpu, server_cpu) = match c.pin {
            None => (None, None),
            Some(p) => {
                for cpu in [p.client_cpu, p.server_cpu] {
                    if cpu > netgap_core::spec::MAX_CPU_INDEX {
                        return Err(invalid(
                            "--pin",
                            format!("{},{}", p.client_cpu, p.server_cpu),
                            format!("{cpu} is not a CPU number"),
                        ));
                    }
                }
                (Some(p.client_cpu), Some(p.server_cpu))
            }
        };
        let label = check_label(c.outputs.label.as_deref())?;
        let peer = match &t.peer {
            None => Peer::Embedded { ipv6: t.ipv6 },
            Some(p) => Peer::Remote {
                label: p.label.clone(),
                addr: p.addr.clone(),
            },
        };
        if let Peer::Remote {
            addr: ControlAddr::Tcp(addr),
            label,
        } = &peer
        {
            if !addr.ip().is_loopback() {
                if let Some(t) = stacks
                    .transports
                    .iter()
                    .find(|t| !t.capabilities().cross_host)
                {
                    return Err(PlanError::SameHostOnly {
                        transport: t.name().to_string(),
                        peer: label.clone(),
                    });
                }
            }
        }
        let mut hosts = t.hosts.as_ref().map(HostsArg::load).transpose()?;
        if let Some(w) = t.wait {
            match &mut hosts {
                Some(HostsSource::Nodes { wait, .. }) => *wait = Some(w),
                _ => {
                    return Err(invalid(
                        "--wait",
                        humantime::format_duration(w),
                        "only the agents of --hosts @slurm or @hostfile are waited for",
                    ))
                }
            }
        }
        let testbed = match &hosts {
            Some(HostsSource::File(f)) => f.path_facts(),
            _ => None,
        };
        let mut settings = Settings {
            stacks,
            method,
            io_timeout_ms: timeout.as_millis() as u32,
            client_cpu,
            server_cpu,
            verify: c.verify,
            peer,
            hosts,
            json: c.outputs.json.clone(),
            csv: c.outputs.csv.clone(),
            key_file: c.key_file.cloned(),
            label,
            testbed,
            conditions: Vec::new(),
            testbed_name: None,
            interleave: false,
        };
        settings.check_interleaving(c, what)?;
        Ok(settings)
    }

    /// The points of `tests` at `sizes` over every stack, test-major, each
    /// checked as the protocol will check it. A size that some transports
    /// carry and others do not is left out of those others' points (and
    /// listed in what is returned beside them); a size no transport of the
    /// run carries is refused.
    pub(crate) fn points(
        &self,
        tests: &[&'static dyn bench::Test],
        sizes: &Sizes,
    ) -> Result<(Vec<PointSpec>, Vec<SkippedSizes>), PlanError> {
        for &s in &sizes.bytes {
            check_size(s).map_err(|_| PlanError::SizeOutOfRange {
                flag: sizes.flag,
                size_bytes: s,
                max: format_size(netgap_core::spec::MAX_SIZE_BYTES),
            })?;
            let carried = self
                .stacks
                .transports
                .iter()
                .any(|t| t.max_message_bytes().is_none_or(|max| s <= max));
            if !carried {
                self.stacks.check_size(s, sizes.flag)?;
            }
        }
        let mut skipped: Vec<SkippedSizes> = Vec::new();
        for tr in &self.stacks.transports {
            let Some(max_bytes) = tr.max_message_bytes() else {
                continue;
            };
            let over: Vec<u64> = sizes
                .bytes
                .iter()
                .copied()
                .filter(|&s| s > max_bytes)
                .collect();
            if !over.is_empty() {
                skipped.push(SkippedSizes {
                    transport: tr.name().to_string(),
                    max_bytes,
                    sizes_bytes: over,
                });
            }
        }
        let mut points = Vec::new();
        for t in tests {
            for tr in &self.stacks.transports {
                for &mode in &self.stacks.modes {
                    if !tr.capabilities().modes.contains(&mode) {
                        return Err(PlanError::NoMode {
                            transport: tr.name().to_string(),
                            mode,
                        });
                    }
                    for &size in &sizes.bytes {
                        if tr.max_message_bytes().is_some_and(|max| size > max) {
                            continue;
                        }
                        let point = self.point(t.name(), tr.name(), mode, size);
                        point.validate()?;
                        points.push(point);
                    }
                }
            }
        }
        Ok((points, skipped))
    }

    /// The settings of a point-to-point run's request whose points have a
    /// stack of their own (MPI's): `transport` stands for the request's
    /// transports, modes and options. The flags of workloads are
    /// refused, naming `what`.
    pub fn with_stack(
        r: &RunRequest,
        transport: &TransportChoice,
        what: &str,
    ) -> Result<Settings, PlanError> {
        refuse_workload_flags(r, what)?;
        let c = Common {
            transport,
            ..r.common(DEFAULT_REP_TIME)
        };
        let mut settings = Settings::new(&c, what)?;
        settings.place_point_to_point()?;
        Ok(settings)
    }

    /// Refuses a size out of range or above what the stacks carry, naming
    /// `--sizes`.
    pub fn check_sizes(&self, sizes_bytes: &[u64]) -> Result<(), PlanError> {
        for &s in sizes_bytes {
            self.stacks.check_size(s, "--sizes")?;
        }
        Ok(())
    }

    /// With `--hosts`, the agents of a point-to-point run
    /// ([`Peer::Agents`]): the first host's serves, the second host's plays
    /// the client. Every transport must cross hosts, and the hosts file's
    /// key stands in for `--key`.
    fn place_point_to_point(&mut self) -> Result<(), PlanError> {
        let Some(source) = self.hosts.clone() else {
            return Ok(());
        };
        let label = source.label();
        let (peer, key_file) = p2p_hosts(source)?;
        if let Some(t) = self
            .stacks
            .transports
            .iter()
            .find(|t| !t.capabilities().cross_host)
        {
            return Err(PlanError::SameHostOnly {
                transport: t.name().to_string(),
                peer: format!("--hosts {label}"),
            });
        }
        if self.key_file.is_none() {
            self.key_file = key_file;
        }
        self.peer = peer;
        Ok(())
    }

    /// One point of `test` with these settings.
    pub fn point(&self, test: &str, transport: &str, mode: Mode, size: u64) -> PointSpec {
        PointSpec {
            test: test.to_string(),
            transport: transport.to_string(),
            mode,
            size_bytes: size,
            options: self.stacks.options.clone(),
            server_cpu: self.server_cpu,
            io_timeout_ms: self.io_timeout_ms,
            verify: self.verify,
        }
    }

    /// Validates `--conditions` and `--interleave`: the conditions need a
    /// testbed whose hosts file records its links' state, and neither goes
    /// with `--ci` (interleaving alternates a fixed count of repetitions).
    fn check_interleaving(&mut self, c: &Common<'_>, what: &str) -> Result<(), PlanError> {
        let i = c.interleaving;
        let conditions = cross(&i.conditions)?;
        if conditions.is_empty() && !i.interleave {
            return Ok(());
        }
        let flag = if conditions.is_empty() {
            "--interleave"
        } else {
            "--conditions"
        };
        if c.ci.is_some() {
            return Err(no_effect(
                "--ci",
                &format!("{what} with {flag}"),
                format!(
                    "interleaved repetitions alternate a fixed count; give {}",
                    c.repetitions.reps.1
                ),
            ));
        }
        if !conditions.is_empty() {
            const WHY: &str = "conditions are set on netgap's testbed: give --hosts @testbed (or a testbed's hosts file) after `netgap testbed up`";
            let (Some(HostsArg::File { path, .. }), Some(HostsSource::File(file))) =
                (&c.target.hosts, &self.hosts)
            else {
                return Err(invalid("--conditions", what, WHY));
            };
            let (Some(name), Some(tb)) = (file.testbed.clone(), self.testbed.as_ref()) else {
                return Err(invalid(
                    "--conditions",
                    path.display(),
                    "this hosts file names no testbed made by this netgap; rebuild it with `netgap testbed up`",
                ));
            };
            if tb.conditions.is_none() {
                return Err(invalid(
                    "--conditions",
                    path.display(),
                    "the testbed's hosts file records no link conditions; rebuild it with `netgap testbed up`",
                ));
            }
            self.testbed_name = Some(name);
        }
        if i.interleave {
            let stacks: std::collections::HashSet<(&str, Mode)> = self
                .stacks
                .transports
                .iter()
                .flat_map(|t| self.stacks.modes.iter().map(|&m| (t.name(), m)))
                .collect();
            if stacks.len() < 2 {
                return Err(no_effect(
                    "--interleave",
                    what,
                    "it alternates the repetitions of several stacks; give several with -t or --mode (--conditions alone alternates its conditions)",
                ));
            }
        }
        self.conditions = conditions;
        self.interleave = i.interleave;
        Ok(())
    }

    /// Options as recorded in results.
    pub fn record_options(&self, spec: &PointSpec) -> netgap_core::record::RecordOptions {
        let (iterations, rep_time_ms) = match self.method.iterations {
            IterationPolicy::Fixed(n) => (Some(n), None),
            IterationPolicy::Budget(d) => (None, Some(d.as_millis() as u64)),
        };
        netgap_core::record::RecordOptions {
            peer: match &self.peer {
                Peer::Embedded { ipv6: false } => "embedded".into(),
                Peer::Embedded { ipv6: true } => "embedded-ipv6".into(),
                Peer::Remote { addr, .. } => addr.to_string(),
                Peer::Agents { hosts } => format!("agents: {}", hosts.label()),
            },
            transport: spec.options.clone(),
            verify: spec.verify,
            placement: netgap_core::record::Placement {
                client_cpu: self.client_cpu,
                server_cpu: spec.server_cpu,
            },
            reps: self.method.reps,
            iterations,
            rep_time_ms,
            warmup: self.method.warmup,
            io_timeout_ms: spec.io_timeout_ms,
            interleaved: None,
            bidir: false,
        }
    }
}

/// The method of the shared flags: repetitions and iterations checked
/// under the names of the flags that gave them, the warm-up and `--ci`.
fn method_of(c: &Common<'_>) -> Result<Method, PlanError> {
    let r = c.repetitions;
    let (reps, iterations) = match r.iterations {
        Iterations::Paper => (DEFAULT_REPS, IterationPolicy::Fixed(PAPER_ITERATIONS)),
        Iterations::Fixed(n) => {
            if n == 0 || n > MAX_ITERATIONS {
                return Err(invalid(
                    "--iterations",
                    n,
                    format!("must be between 1 and {MAX_ITERATIONS}"),
                ));
            }
            (r.reps.0, IterationPolicy::Fixed(n))
        }
        Iterations::Budget(d, flag) => {
            if !(MIN_REP_TIME..=MAX_REP_TIME).contains(&d) {
                return Err(invalid(flag, show(d), "must be between 100us and 1h"));
            }
            (r.reps.0, IterationPolicy::Budget(d))
        }
    };
    if reps == 0 || reps > MAX_REPS {
        return Err(invalid(
            r.reps.1,
            reps,
            format!("must be between 1 and {MAX_REPS}"),
        ));
    }
    if let Some(w) = c.warmup {
        if w > MAX_ITERATIONS {
            return Err(invalid("--warmup", w, format!("at most {MAX_ITERATIONS}")));
        }
    }
    Ok(Method {
        reps,
        iterations,
        warmup: c.warmup,
        ci: ci_target(c.ci, c.ci_reps)?,
    })
}

impl Plan {
    /// Validates a run of point-to-point tests.
    pub fn from_request(r: &RunRequest) -> Result<Plan, PlanError> {
        let tests = bench_tests(&r.tests)?;
        Plan::point_to_point(
            r,
            &tests,
            &DEFAULT_SIZES_BYTES,
            DEFAULT_REP_TIME,
            &r.tests.join(","),
        )
    }

    /// Validates a point-to-point run of `tests` from a request of `run`'s
    /// flags, with the command's default sizes and time budget; the flags
    /// of workloads are refused, naming `what` (the tests, or the
    /// command that measures them).
    pub(crate) fn point_to_point(
        r: &RunRequest,
        tests: &[&'static dyn bench::Test],
        default_sizes: &[u64],
        default_rep_time: Duration,
        what: &str,
    ) -> Result<Plan, PlanError> {
        refuse_workload_flags(r, what)?;
        Plan::of_settings(
            &r.common(default_rep_time),
            tests,
            &r.sizes(default_sizes),
            what,
        )
    }

    /// Validates a point-to-point run of `tests` at `sizes` from a
    /// command's shared flags: the settings, the agent of `--hosts`, the
    /// points.
    pub(crate) fn of_settings(
        c: &Common<'_>,
        tests: &[&'static dyn bench::Test],
        sizes: &Sizes,
        what: &str,
    ) -> Result<Plan, PlanError> {
        let mut settings = Settings::new(c, what)?;
        let (points, skipped) = settings.points(tests, sizes)?;
        settings.place_point_to_point()?;
        Ok(Plan {
            points,
            settings,
            skipped,
        })
    }

    /// The main job, plain `netgap`: pingpong and stream over the stacks
    /// of [`BATTERY_TRANSPORTS`] available here, on loopback, their
    /// repetitions interleaved at each test and size, the client and
    /// server on two different CPUs when the process may use two.
    /// `reps` overrides the repetitions (a shorter job).
    pub fn battery(json: PathBuf, reps: Option<u32>) -> Result<Battery, PlanError> {
        let mut transports = Vec::new();
        let mut unavailable = Vec::new();
        for name in BATTERY_TRANSPORTS {
            match transport::find(name).map(|t| t.availability()) {
                Some(Ok(())) => transports.push(name.to_string()),
                Some(Err(why)) => unavailable.push((name.to_string(), why.0)),
                None => unavailable.push((name.to_string(), "not built in".to_string())),
            }
        }
        let cpus = netgap_transport::affinity::allowed_cpus();
        let pin = match cpus.as_slice() {
            [client, server, ..] => Some(Pin {
                client_cpu: *client,
                server_cpu: *server,
            }),
            _ => None,
        };
        let request = RunRequest {
            interleaving: Interleaving {
                conditions: Vec::new(),
                interleave: transports.len() > 1,
            },
            transport: TransportChoice {
                transports,
                ..TransportChoice::default()
            },
            method: MethodSpec {
                sizes: Some(BATTERY_SIZES_BYTES.to_vec()),
                rep_time: Some(BATTERY_REP_TIME),
                reps,
                pin,
                ..MethodSpec::default()
            },
            outputs: Outputs {
                json: Some(json),
                ..Outputs::default()
            },
            ..RunRequest::new(&BATTERY_TESTS)
        };
        Ok(Battery {
            plan: Plan::from_request(&request)?,
            unavailable,
        })
    }
}

/// The main job's plan, and the stacks it leaves out.
#[derive(Debug, Clone)]
pub struct Battery {
    /// The points.
    pub plan: Plan,
    /// The stacks of [`BATTERY_TRANSPORTS`] not available here, with why.
    pub unavailable: Vec<(String, String)>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(test: &str) -> RunRequest {
        let mut r = RunRequest::new(&[test]);
        r.method.sizes = Some(vec![1]);
        r
    }

    fn err(r: &RunRequest) -> String {
        Plan::from_request(r).expect_err("refused").to_string()
    }

    fn option(flag: &str, value: OptionValue) -> OptionSetting {
        OptionSetting {
            decl: netgap_transport::options::find(flag).expect("declared"),
            value,
        }
    }

    #[test]
    fn sizes_a_transport_cannot_carry_are_skipped_for_it_alone() {
        let mut r = req("pingpong");
        r.transport.transports = vec!["tcp".into(), "udp".into()];
        r.method.sizes = Some(vec![1, 1 << 20]);
        let p = Plan::from_request(&r).expect("valid");
        let points: Vec<(&str, u64)> = p
            .points
            .iter()
            .map(|s| (s.transport.as_str(), s.size_bytes))
            .collect();
        assert_eq!(points, [("tcp", 1), ("tcp", 1 << 20), ("udp", 1)]);
        assert_eq!(p.skipped.len(), 1);
        assert_eq!(p.skipped[0].transport, "udp");
        assert_eq!(p.skipped[0].sizes_bytes, [1 << 20]);
        assert!(
            p.skipped[0].to_string().starts_with("udp carries at most ")
                && p.skipped[0].to_string().ends_with(": skipping 1M"),
            "{}",
            p.skipped[0]
        );
        // A size no transport of the run carries is refused.
        r.transport.transports = vec!["udp".into()];
        assert!(err(&r).contains("larger than the largest message transport udp"));
        // Nothing to skip: nothing said.
        r.transport.transports = vec!["tcp".into(), "unix".into()];
        assert!(Plan::from_request(&r).expect("valid").skipped.is_empty());
    }

    #[test]
    fn the_main_job_interleaves_the_available_stacks_on_loopback() {
        let b = Plan::battery(PathBuf::from("x.jsonl"), None).expect("valid");
        let p = &b.plan;
        let stacks: std::collections::BTreeSet<&str> =
            p.points.iter().map(|s| s.transport.as_str()).collect();
        assert_eq!(stacks.len() + b.unavailable.len(), BATTERY_TRANSPORTS.len());
        assert!(
            stacks.contains("tcp") && stacks.contains("unix"),
            "{stacks:?}"
        );
        assert!(p.settings.interleave);
        assert!(
            matches!(p.settings.peer, Peer::Embedded { ipv6: false }),
            "{:?}",
            p.settings.peer
        );
        // udp leaves out the size it cannot carry, and says so.
        assert!(!p
            .points
            .iter()
            .any(|s| s.transport == "udp" && s.size_bytes > 65_536));
        assert_eq!(p.skipped.len(), 1);
        assert_eq!(p.skipped[0].transport, "udp");
        // Pinned apart where the process may use two CPUs.
        if netgap_transport::affinity::allowed_cpus().len() >= 2 {
            assert!(p.settings.client_cpu.is_some());
            assert_ne!(p.settings.client_cpu, p.settings.server_cpu);
        }
        let b = Plan::battery(PathBuf::from("x.jsonl"), Some(2)).expect("valid");
        assert_eq!(b.plan.settings.method.reps, 2);
    }

    #[test]
    fn unknown_names_are_refused_with_the_list() {
        let e = err(&req("pingpnog"));
        assert!(
            e.contains("unknown test \"pingpnog\"") && e.contains("pingpong"),
            "{e}"
        );
        let mut r = req("pingpong");
        r.transport.transports = vec!["carrier-pigeon".into()];
        assert!(err(&r).contains("unknown transport"));
    }

    #[test]
    fn size_zero_and_oversize_are_refused() {
        let mut r = req("pingpong");
        r.method.sizes = Some(vec![0]);
        assert!(err(&r).contains("out of range"));
        r.method.sizes = Some(vec![1 << 30]);
        assert!(err(&r).contains("out of range"));
    }

    #[test]
    fn pin_and_paper_resolve() {
        let mut r = req("pingpong");
        r.method.pin = Some(Pin {
            client_cpu: 0,
            server_cpu: 1,
        });
        r.method.paper = true;
        let p = Plan::from_request(&r).expect("valid");
        assert_eq!(p.settings.client_cpu, Some(0));
        assert_eq!(p.points[0].server_cpu, Some(1));
        assert_eq!(
            p.settings.method.iterations,
            IterationPolicy::Fixed(PAPER_ITERATIONS)
        );
        r.method.pin = Some(Pin {
            client_cpu: 1 << 20,
            server_cpu: 0,
        });
        assert!(err(&r).contains("--pin"));
    }

    #[test]
    fn peer_forms_resolve() {
        assert_eq!(
            resolve_peer("127.0.0.1").map(|a| a.port()).ok(),
            Some(DEFAULT_PORT)
        );
        assert_eq!(resolve_peer("127.0.0.1:9").map(|a| a.port()).ok(), Some(9));
        assert_eq!(resolve_peer("::1").map(|a| a.is_ipv6()).ok(), Some(true));
        assert_eq!(resolve_peer("[::1]:9").map(|a| a.port()).ok(), Some(9));
        assert!(resolve_peer("no such host.invalid").is_err());
        assert!(matches!(
            PeerAddr::parse("unix:/tmp/a.sock").map(|p| p.addr),
            Ok(ControlAddr::Unix(_))
        ));
    }

    #[test]
    fn sizes_above_a_transports_largest_message_are_refused() {
        let mut r = req("pingpong");
        r.transport.transports = vec!["udp".into()];
        r.method.sizes = Some(vec![1, 60 * 1024]);
        assert!(Plan::from_request(&r).is_ok());
        r.method.sizes = Some(vec![1, 100 * 1024]);
        let e = err(&r);
        assert!(
            e.contains("100K") && e.contains("udp") && e.contains("65483 bytes"),
            "{e}"
        );
    }

    #[test]
    fn ci_targets_check_their_bounds() {
        let mut m = MethodSpec {
            ci: Some(CiSpec {
                confidence_pct: 99.0,
                half_width_pct: 2.0,
            }),
            ..MethodSpec::default()
        };
        let t = ci_target(m.ci, m.ci_reps).expect("valid").expect("some");
        assert_eq!((t.confidence_pct, t.half_width_pct), (99.0, 2.0));
        assert_eq!((t.min_reps, t.max_reps), DEFAULT_CI_REPS);
        assert!(ci_target(None, None).expect("valid").is_none());
        for (level, width, reps) in [
            (99.0, 2.0, (1, 30)),
            (100.0, 2.0, (3, 30)),
            (99.0, 2.0, (9, 3)),
            (99.0, 0.0, (3, 30)),
            (99.0, 2.0, (3, MAX_REPS + 1)),
        ] {
            m.ci = Some(CiSpec {
                confidence_pct: level,
                half_width_pct: width,
            });
            m.ci_reps = Some(reps);
            assert!(
                ci_target(m.ci, m.ci_reps).is_err(),
                "{level} {width} {reps:?}"
            );
        }
    }

    #[test]
    fn unix_is_refused_for_a_remote_peer() {
        let mut r = req("pingpong");
        r.transport.transports = vec!["unix".into()];
        r.target.peer = Some(PeerAddr {
            label: "192.0.2.1".into(),
            addr: ControlAddr::Tcp("192.0.2.1:7100".parse().expect("addr")),
        });
        assert!(err(&r).contains("one host"));
    }

    #[test]
    fn an_option_a_transport_ignores_is_refused() {
        let mut r = req("pingpong");
        r.transport.transports = vec!["unix".into()];
        r.transport.options = vec![option("cork", OptionValue::Switch)];
        let e = err(&r);
        assert!(
            e.contains("--cork does not apply to transport unix (it takes --sndbuf, --rcvbuf)"),
            "{e}"
        );
        r.transport.transports = vec!["tcp".into()];
        let p = Plan::from_request(&r).expect("tcp corks");
        assert!(p.points[0].options.cork);
        r.transport.transports = vec!["shm".into()];
        r.transport.options = vec![option("sndbuf", OptionValue::Number(64 * 1024))];
        assert!(err(&r).contains("takes no options"));
        r.transport.transports = vec!["tcp".into()];
        r.transport.options = vec![option("sndbuf", OptionValue::Number(0))];
        assert!(err(&r).contains("--sndbuf 0: must be between"));
    }

    #[test]
    fn flags_of_multi_host_tests_are_refused_for_point_to_point_tests() {
        let mut r = req("pingpong");
        r.multi_host.clients = Some(vec![3]);
        let e = err(&r);
        assert!(e.starts_with("--clients does not apply to pingpong"), "{e}");
        let mut r = req("pingpong");
        r.multi_host.duration = Some(Duration::from_secs(5));
        assert!(err(&r).starts_with("--duration does not apply"));
        let mut r = req("stream");
        r.target.ipv6 = true;
        r.target.peer = PeerAddr::parse("127.0.0.1").ok();
        assert!(err(&r).starts_with("-6 does not apply"));
    }

    #[test]
    fn labels_are_checked_and_kept() {
        let mut r = req("pingpong");
        r.outputs.label = Some(" kernel 6.8 ".into());
        assert_eq!(
            Plan::from_request(&r)
                .expect("valid")
                .settings
                .label
                .as_deref(),
            Some("kernel 6.8")
        );
        for bad in ["", "  ", "a\nb", &"x".repeat(MAX_LABEL_BYTES + 1)] {
            r.outputs.label = Some(bad.to_string());
            assert!(err(&r).starts_with("--label"), "{bad:?}");
        }
    }

    /// A testbed's hosts file in `dir`, with or without its name and
    /// conditions.
    fn testbed_file(dir: &std::path::Path, named: bool) -> HostsArg {
        let host = |n: u32| {
            serde_json::json!({
                "name": format!("h{n}"), "control": format!("unix:/tmp/h{n}.sock"),
                "address": format!("10.77.0.{n}"), "netns": format!("ngtb-t-h{n}"),
            })
        };
        let mut file = serde_json::json!({
            "version": 1, "topology": "switch", "hosts": [host(1), host(2)],
        });
        if named {
            file["testbed"] = "t".into();
            file["conditions"] = serde_json::json!({"mtu_bytes": 1500, "offload": true});
        }
        let path = dir.join(format!("hosts-{named}.json"));
        std::fs::write(&path, file.to_string()).expect("written");
        HostsArg::File {
            path,
            testbed: false,
        }
    }

    #[test]
    fn a_point_to_point_run_over_hosts_places_both_roles_on_the_first_two_agents() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A testbed's hosts, namespaces and all: their agents play both
        // roles, whoever runs netgap.
        let file = testbed_file(dir.path(), false).load().expect("hosts");
        let (peer, _) = p2p_hosts(file).expect("placed");
        let Peer::Agents {
            hosts: HostsSource::File(f),
        } = &peer
        else {
            panic!("{peer:?}");
        };
        let names: Vec<&str> = f.hosts.iter().map(|h| h.name.as_str()).collect();
        assert_eq!(names, ["h1", "h2"]);
        // A list of agents: its first two.
        let three = HostsArg::parse("127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")
            .and_then(|a| a.load())
            .expect("list");
        let (peer, key) = p2p_hosts(three).expect("placed");
        assert!(key.is_none());
        let Peer::Agents { hosts } = &peer else {
            panic!("{peer:?}");
        };
        assert_eq!(hosts.label(), "127.0.0.1:7101,127.0.0.1:7102");
        let one = HostsArg::parse("127.0.0.1:7101")
            .and_then(|a| a.load())
            .expect("list");
        let e = p2p_hosts(one).err().map(|e| e.to_string());
        assert!(
            e.as_deref().is_some_and(|e| e.contains("needs two hosts")),
            "{e:?}"
        );
    }

    #[test]
    fn conditions_need_a_testbed_and_a_fixed_repetition_count() {
        let axes = || {
            vec![
                ConditionAxis::parse("mtu=1500,9000").expect("axis"),
                ConditionAxis::parse("offload=on,off").expect("axis"),
            ]
        };
        let mut r = req("stream");
        r.interleaving.conditions = axes();
        assert!(err(&r).contains("conditions are set on netgap's testbed"));
        let dir = tempfile::tempdir().expect("tempdir");
        r.target.hosts = Some(testbed_file(dir.path(), false));
        assert!(err(&r).contains("names no testbed"), "{}", err(&r));
        r.target.hosts = Some(testbed_file(dir.path(), true));
        let p = Plan::from_request(&r).expect("valid");
        assert_eq!(p.settings.conditions.len(), 4);
        assert_eq!(p.settings.testbed_name.as_deref(), Some("t"));
        let tb = p.settings.testbed.expect("testbed facts");
        assert_eq!(tb.topology, "switch");
        assert_eq!(tb.conditions.map(|c| c.mtu_bytes), Some(1500));
        r.method.ci = Some(CiSpec {
            confidence_pct: 90.0,
            half_width_pct: 5.0,
        });
        assert!(err(&r).starts_with("--ci does not apply to stream with --conditions"));
    }

    #[test]
    fn interleave_needs_several_stacks() {
        let mut r = req("pingpong");
        r.interleaving.interleave = true;
        assert!(err(&r).starts_with("--interleave does not apply to pingpong"));
        r.transport.modes = vec![Mode::Event, Mode::Poll];
        let p = Plan::from_request(&r).expect("two modes are two stacks");
        assert!(p.settings.interleave && p.settings.conditions.is_empty());
    }

    #[test]
    fn defaults_are_the_documented_ones() {
        let p = Plan::from_request(&RunRequest::new(&["pingpong"])).expect("valid");
        let sizes: Vec<u64> = p.points.iter().map(|s| s.size_bytes).collect();
        assert_eq!(sizes, DEFAULT_SIZES_BYTES);
        assert_eq!(p.settings.method.reps, DEFAULT_REPS);
        assert_eq!(
            p.settings.method.iterations,
            IterationPolicy::Budget(DEFAULT_REP_TIME)
        );
        assert_eq!(p.points[0].io_timeout_ms, 3000);
        assert_eq!(p.points[0].options, TransportOptions::default());
    }
}
