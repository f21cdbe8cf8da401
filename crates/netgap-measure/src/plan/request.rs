//! The typed input of every plan: what the command line (or the default
//! battery, or a study) asks for, each field `None` or empty unless given,
//! and the shared flags a command lends its checks under its own flags'
//! names ([`Common`]).

use super::{resolve_peer, PlanError, DEFAULT_REPS};
use crate::cluster::HostsArg;
use crate::conditions::ConditionAxis;
use crate::control::ControlAddr;
use netgap_core::spec::Mode;
use netgap_transport::options::{OptionDecl, OptionValue};
use std::path::PathBuf;
use std::time::Duration;

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

/// Why a `--pin` value does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PinError {
    /// An item that is not a number.
    #[error("{0:?} is not a CPU number")]
    NotACpu(String),
    /// Neither one CPU nor two.
    #[error("expected CLIENT_CPU,SERVER_CPU such as 0,1")]
    Shape,
}

impl Pin {
    /// Parses `--pin`'s value: `CLIENT_CPU,SERVER_CPU`, or one CPU for
    /// both; the command line and a study's figures alike.
    pub fn parse(text: &str) -> Result<Pin, PinError> {
        let cpu = |c: &str| {
            c.trim()
                .parse::<u32>()
                .map_err(|_| PinError::NotACpu(c.to_string()))
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
            _ => Err(PinError::Shape),
        }
    }
}

/// Why a list of counts does not parse.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CountsError {
    /// An item that is not a count.
    #[error("{0:?} is not a count")]
    NotACount(String),
    /// Nothing but commas and blanks.
    #[error("no count given")]
    Empty,
}

/// Parses a list of counts, `N[,N...]` (`--clients`, `-P`, `--links`);
/// empty items are dropped, and at least one count is given.
pub fn parse_counts(text: &str) -> Result<Vec<u32>, CountsError> {
    let mut out = Vec::new();
    for part in text.split(',').map(str::trim).filter(|x| !x.is_empty()) {
        out.push(
            part.parse::<u32>()
                .map_err(|_| CountsError::NotACount(part.to_string()))?,
        );
    }
    if out.is_empty() {
        return Err(CountsError::Empty);
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
