//! The flag groups that commands share, each defined once: `run`, `sweep`
//! and `logp` flatten [`StackFlags`], `run` and `logp` [`RepFlags`] too (a
//! sweep has its own), and each command maps its flags to its own typed
//! request in the library ([`StackFlags::request`] for `run` and `logp`). Values
//! are parsed here (sizes, durations, lists, addresses); whether a flag
//! applies to what is asked, and every range, is the library plan's to
//! judge.
//!
//! A flag whose default depends on the command is an `Option` (`None`: not
//! given), so the plan can tell a choice from a default and refuse a flag
//! that would change nothing.

use clap::{Arg, ArgAction, ArgMatches, Args, FromArgMatches};
use netgap::cluster::HostsArg;
use netgap::conditions::ConditionAxis;
use netgap::plan::{
    BufferFlags, CiSpec, Interleaving, MethodSpec, MultiHostSpec, OptionSetting, Outputs, PeerAddr,
    Pin, RunRequest, Target, TransportChoice,
};
use netgap::spec::Mode;
use netgap::transport::options::{self as topt, OptionKind, OptionValue};
use netgap::workload::options as wopt;
use std::path::PathBuf;
use std::time::Duration;

/// Where the agents are.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Target")]
pub(crate) struct TargetFlags {
    /// Agent to drive, `HOST[:PORT]` (default port 7100), `[V6]:PORT` or
    /// `unix:PATH`; without it an agent runs in-process on loopback.
    #[arg(long, value_name = "HOST[:PORT]", value_parser = parse_peer)]
    pub peer: Option<PeerAddr>,
    /// Workloads: the hosts, `@FILE` (a hosts file), `@testbed` (the
    /// hosts file of `netgap testbed up`), `@slurm[:PORT]` (the nodes of
    /// SLURM_JOB_NODELIST), `@hostfile:FILE[:PORT]` (an Open MPI or MPICH
    /// hostfile) or `ADDR,ADDR,...` (agents' control addresses, IP[:PORT]
    /// or unix:PATH); agents of @slurm and @hostfile listen on PORT
    /// (default 7100; `netgap serve --bind auto`) and the run waits for
    /// them (--wait); the first is the server,
    /// the rest client hosts. Without it, in-process agents on loopback
    /// stand in for the hosts. A hosts file or hostfile must be a regular
    /// file of at most 16 MiB.
    #[arg(long, value_name = "@FILE|ADDR,...", value_parser = parse_hosts)]
    pub hosts: Option<HostsArg>,
    /// How long to wait for the agents of `--hosts @slurm` or `@hostfile`
    /// to answer, as a launcher starts them (default: --timeout).
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub wait: Option<Duration>,
    /// Use IPv6 loopback for the in-process agent.
    #[arg(long, short = '6')]
    pub ipv6: bool,
}

/// The agents' shared key.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Target")]
pub(crate) struct KeyFlags {
    /// Shared key file of the agent (see `netgap key new`), or of every
    /// agent of `--hosts` (default: the hosts file's `key_file`).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
}

/// Transports, modes and the transports' own options.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Transport")]
pub(crate) struct TransportFlags {
    /// Transports, comma separated (see `netgap list`).
    #[arg(
        long,
        short = 't',
        default_value = "tcp",
        value_name = "T[,T...]",
        value_parser = parse_names
    )]
    pub transport: NameList,
    /// Completion modes, comma separated: event (block), poll (spin).
    #[arg(
        long,
        default_value = "event",
        value_name = "event|poll",
        value_delimiter = ',',
        value_parser = parse_mode
    )]
    pub mode: Vec<Mode>,
    #[allow(
        missing_docs,
        reason = "a doc comment here would replace the flattened flags' help"
    )]
    #[command(flatten)]
    pub options: TransportOptionFlags,
}

/// The transports' own options, one flag per declaration of
/// `netgap::transport::options`, built with clap's builder API so a new
/// option is declared in its transport and nowhere else.
#[derive(Debug, Clone, Default)]
pub(crate) struct TransportOptionFlags {
    /// The options given, in declaration order.
    pub given: Vec<OptionSetting>,
}

impl FromArgMatches for TransportOptionFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for decl in topt::all() {
            let value = match decl.kind {
                OptionKind::Switch => m.get_flag(decl.flag).then_some(OptionValue::Switch),
                OptionKind::Bytes | OptionKind::Count => {
                    m.get_one::<u64>(decl.flag).map(|&n| OptionValue::Number(n))
                }
                OptionKind::Name => m
                    .get_one::<String>(decl.flag)
                    .map(|s| OptionValue::Name(s.clone())),
            };
            if let Some(value) = value {
                given.push(OptionSetting { decl, value });
            }
        }
        Ok(TransportOptionFlags { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = TransportOptionFlags::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for TransportOptionFlags {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for decl in topt::all() {
            let takers = topt::transports_taking(decl).join(", ");
            let arg = Arg::new(decl.flag)
                .long(decl.flag)
                .help(decl.help.trim_end_matches('.'))
                .long_help(format!("{} Transports: {takers}.", decl.help))
                .help_heading("Transport options");
            let arg = match decl.kind {
                OptionKind::Switch => arg.action(ArgAction::SetTrue),
                OptionKind::Bytes => arg
                    .value_name(decl.value_name)
                    .value_parser(netgap::units::parse_size_bytes),
                OptionKind::Count => arg
                    .value_name(decl.value_name)
                    .value_parser(clap::value_parser!(u64)),
                OptionKind::Name => arg
                    .value_name(decl.value_name)
                    .value_parser(clap::value_parser!(String)),
            };
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        TransportOptionFlags::augment_args(cmd)
    }
}

/// `--sizes`' long help, with each workload's own default size
/// (over tcp) from the workload registry, so the list never goes stale.
fn sizes_long_help() -> String {
    let mut by_size: Vec<(u64, Vec<&str>)> = Vec::new();
    if let Some(tcp) = netgap::transport::find("tcp") {
        for w in netgap::workload::registry() {
            let size = w.default_size_bytes(tcp);
            match by_size.iter_mut().find(|(s, _)| *s == size) {
                Some((_, names)) => names.push(w.name()),
                None => by_size.push((size, vec![w.name()])),
            }
        }
    }
    by_size.sort_by_key(|(size, _)| *size);
    let defaults: Vec<String> = by_size
        .iter()
        .map(|(size, names)| {
            format!(
                "{} for {}",
                netgap::units::format_size(*size),
                names.join(", ")
            )
        })
        .collect();
    format!(
        "Message sizes: a list 1,64,1K, a range of powers of two 1..4M, or a range with a factor \
         1..4M:x4 [default: 1,64,1K,16K,64K,1M; workloads over tcp: {}]",
        defaults.join("; ")
    )
}

/// Sizes and repetitions of each point (`run` and `logp`; a sweep sets
/// them from its own flags).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Method")]
pub(crate) struct RepFlags {
    /// Message sizes: a list 1,64,1K, a range of powers of two 1..4M, or a
    /// range with a factor 1..4M:x4 [default: 1,64,1K,16K,64K,1M;
    /// workloads: their own, see --help].
    #[arg(
        long,
        short = 's',
        value_name = "LIST",
        value_parser = parse_sizes,
        long_help = sizes_long_help()
    )]
    pub sizes: Option<SizeList>,
    /// Measured repetitions per point; the highest and lowest are dropped
    /// from the headline [default: 10].
    #[arg(long, value_name = "N")]
    pub reps: Option<u32>,
    /// Fixed iterations per repetition (instead of --rep-time).
    #[arg(long, short = 'n', value_name = "N", conflicts_with = "rep_time")]
    pub iterations: Option<u64>,
    /// Time budget per repetition; the iteration count is calibrated to fill
    /// it [default: 100ms].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub rep_time: Option<Duration>,
    /// The seeds' setting: 10 repetitions of 100,000 iterations.
    #[arg(long, conflicts_with_all = ["iterations", "rep_time", "reps", "ci"])]
    pub paper: bool,
}

/// The data path's settings of each point, and its warm-up and confidence
/// target.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Method")]
pub(crate) struct MethodFlags {
    /// Uncounted warm-up iterations before each point.
    #[arg(long, value_name = "N")]
    pub warmup: Option<u64>,
    /// Repeat each point until the LEVEL% confidence interval of the mean is
    /// within ±WIDTH% of it (e.g. 99,2), between the --ci-reps bounds;
    /// results record whether it was met. Without it, --reps repetitions.
    #[arg(long, value_name = "LEVEL,WIDTH", value_parser = parse_ci)]
    pub ci: Option<CiSpec>,
    /// Fewest and most repetitions of a --ci point [default: 3,30].
    #[arg(long, value_name = "MIN,MAX", requires = "ci", value_parser = parse_ci_reps)]
    pub ci_reps: Option<(u32, u32)>,
    /// Data-path inactivity timeout: a peer silent this long is gone
    /// [default: 3s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub timeout: Option<Duration>,
    /// Pin the client and server roles: CLIENT_CPU,SERVER_CPU (e.g. 0,1), or
    /// one CPU for both.
    #[arg(long, value_name = "C,S", value_parser = parse_pin)]
    pub pin: Option<Pin>,
    /// Check every payload byte received against the pattern sent.
    #[arg(long)]
    pub verify: bool,
    /// Message buffers' data starts on a boundary of BYTES, a power of two
    /// (NetPIPE's -A) [default: the page size].
    #[arg(long, value_name = "BYTES")]
    pub align: Option<u64>,
    /// Message buffers' data starts BYTES past the --align boundary, below
    /// it (NetPIPE's -O) [default: 0].
    #[arg(long, value_name = "BYTES")]
    pub offset: Option<u64>,
}

impl MethodFlags {
    /// `--align` and `--offset`, typed.
    pub(crate) fn buffer(&self) -> BufferFlags {
        BufferFlags {
            align_bytes: self.align,
            offset_bytes: self.offset,
        }
    }
}

/// Where results go.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Output")]
pub(crate) struct OutputFlags {
    /// Append one JSON line per measured point to FILE.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Append one CSV row per measured point to FILE.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
    /// Name the stack measured in every record (`stack.label`), e.g.
    /// "kernel 6.8"; records of different labels are never merged.
    #[arg(long, value_name = "TEXT")]
    pub label: Option<String>,
}

/// Conditions and stacks one run alternates between (`run`, `sweep`).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Interleaved comparison")]
pub(crate) struct InterleaveFlags {
    /// Measure every point under each condition of a testbed (--hosts
    /// @testbed), alternating the repetitions: one KEY=V1,V2,... per key
    /// (mtu, offload, rate, delay, loss); the run takes the cross product,
    /// e.g. --conditions mtu=1500,9000 offload=on,off. Needs root.
    #[arg(long, value_name = "KEY=V,V", num_args = 1.., value_parser = parse_condition_axis)]
    pub conditions: Vec<ConditionAxis>,
    /// Alternate the repetitions (a sweep's trials) of the run's stacks (-t
    /// and --mode lists) at each test and size, so drift falls on every
    /// stack alike.
    #[arg(long)]
    pub interleave: bool,
}

impl InterleaveFlags {
    /// The typed request.
    pub(crate) fn spec(&self) -> Interleaving {
        Interleaving {
            conditions: self.conditions.clone(),
            interleave: self.interleave,
        }
    }
}

/// The MPI tests' own flags (`run` only).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "MPI tests")]
pub(crate) struct MpiFlags {
    /// The BTL two ranks on this machine meet over: vader (shared memory,
    /// the default) or tcp (TCP over loopback, the path the socket tests
    /// take; the default under the preload library, `-t shm` with MPI
    /// tests alone). Across testbed hosts the ranks always use TCP.
    #[arg(long, value_name = "BTL", value_parser = parse_local_btl)]
    pub mpi_btl: Option<netgap::mpi::launch::LocalBtl>,
}

impl MpiFlags {
    /// The typed options.
    pub(crate) fn options(&self) -> netgap::mpi::plan::MpiOptions {
        netgap::mpi::plan::MpiOptions { btl: self.mpi_btl }
    }
}

fn parse_local_btl(s: &str) -> Result<netgap::mpi::launch::LocalBtl, String> {
    netgap::mpi::launch::LocalBtl::by_name(s)
        .ok_or_else(|| format!("{s:?} is not a BTL netgap runs MPI over; choose vader or tcp"))
}

fn parse_condition_axis(s: &str) -> Result<ConditionAxis, String> {
    ConditionAxis::parse(s).map_err(|e| e.to_string())
}

/// The flags of workloads.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Workloads")]
pub(crate) struct MultiHostFlags {
    /// Concurrent clients, one point per count (e.g. 3,6,9,12) [default: one
    /// per client host].
    #[arg(long, value_name = "N[,N...]", value_parser = parse_counts)]
    pub clients: Option<CountList>,
    /// multistream: parallel streams, one point per count [default: 4].
    #[arg(long, short = 'P', value_name = "N[,N...]", value_parser = parse_counts)]
    pub streams: Option<CountList>,
    /// Measured window of each repetition [default: 1s].
    #[arg(long, value_name = "DUR", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// multirail: links used, one point per count (e.g. 1,2,3): the first K
    /// links to the server in the hosts file, or without --hosts K loopback
    /// links (address pairs) [default: every link; 3 on loopback].
    #[arg(long, value_name = "K[,K...]", value_parser = parse_counts)]
    pub links: Option<CountList>,
    /// multistream, multirail: every flow sends both ways at once; the
    /// headline is the sum of both directions.
    #[arg(long)]
    pub bidir: bool,
    /// Without --hosts: in-process client hosts on loopback (127.0.0.2,
    /// 127.0.0.3, ...) [default: 3].
    #[arg(long, value_name = "N")]
    pub client_hosts: Option<u32>,
    #[allow(
        missing_docs,
        reason = "a doc comment here would replace the flattened flags' help"
    )]
    #[command(flatten)]
    pub workload: WorkloadOptionFlags,
}

/// The workloads' own options, one flag per distinct declaration of
/// `netgap::workload::options`, built with clap's builder API so a new
/// option is declared in its workload and nowhere else. Values stay text
/// here; the workload plan parses them with their declarations.
#[derive(Debug, Clone, Default)]
pub(crate) struct WorkloadOptionFlags {
    /// (flag, value as typed; empty for a switch), in declaration order.
    pub given: Vec<(String, String)>,
}

impl FromArgMatches for WorkloadOptionFlags {
    fn from_arg_matches(m: &ArgMatches) -> Result<Self, clap::Error> {
        let mut given = Vec::new();
        for decl in wopt::all() {
            let value = match decl.kind {
                wopt::OptionKind::Switch => m.get_flag(decl.flag).then(String::new),
                _ => m.get_one::<String>(decl.flag).cloned(),
            };
            if let Some(value) = value {
                given.push((decl.flag.to_string(), value));
            }
        }
        Ok(WorkloadOptionFlags { given })
    }

    fn update_from_arg_matches(&mut self, m: &ArgMatches) -> Result<(), clap::Error> {
        *self = WorkloadOptionFlags::from_arg_matches(m)?;
        Ok(())
    }
}

impl Args for WorkloadOptionFlags {
    fn augment_args(mut cmd: clap::Command) -> clap::Command {
        for decl in wopt::all() {
            let takers = wopt::workloads_taking(decl.flag).join(", ");
            let list = if decl.axis {
                " A comma-separated list gives one point per value."
            } else {
                ""
            };
            let arg = Arg::new(decl.flag)
                .long(decl.flag)
                .help(format!("{takers}: {}", decl.help.trim_end_matches('.')))
                .long_help(format!("{}{list} Workloads: {takers}.", decl.help))
                .help_heading("Workload options");
            let arg = match decl.kind {
                wopt::OptionKind::Switch => arg.action(ArgAction::SetTrue),
                _ => arg
                    .value_name(decl.value_name)
                    .value_parser(clap::value_parser!(String)),
            };
            cmd = cmd.arg(arg);
        }
        cmd
    }

    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        WorkloadOptionFlags::augment_args(cmd)
    }
}

/// The groups every measuring command takes: target, key, transports,
/// method, outputs.
#[derive(Debug, Clone, Args)]
pub(crate) struct StackFlags {
    #[allow(missing_docs, reason = "flattened: the flags carry their own help")]
    #[command(flatten)]
    pub target: TargetFlags,
    #[allow(missing_docs, reason = "flattened: the flags carry their own help")]
    #[command(flatten)]
    pub key: KeyFlags,
    #[allow(missing_docs, reason = "flattened: the flags carry their own help")]
    #[command(flatten)]
    pub transport: TransportFlags,
    #[allow(missing_docs, reason = "flattened: the flags carry their own help")]
    #[command(flatten)]
    pub method: MethodFlags,
    #[allow(missing_docs, reason = "flattened: the flags carry their own help")]
    #[command(flatten)]
    pub output: OutputFlags,
}

impl StackFlags {
    /// The one step from the raw flags of `run` and `logp` to the library's
    /// typed request; `tests`, the sizes and repetitions and the multi-host
    /// flags come from the command.
    pub(crate) fn request(
        &self,
        tests: &[String],
        reps: &RepFlags,
        multi_host: MultiHostSpec,
    ) -> RunRequest {
        let m = &self.method;
        RunRequest {
            tests: tests.to_vec(),
            target: self.target(),
            key_file: self.key.key.clone(),
            transport: self.transport(),
            method: MethodSpec {
                sizes: reps.sizes.as_ref().map(|s| s.0.clone()),
                reps: reps.reps,
                iterations: reps.iterations,
                rep_time: reps.rep_time,
                warmup: m.warmup,
                paper: reps.paper,
                ci: m.ci,
                ci_reps: m.ci_reps,
                timeout: m.timeout,
                pin: m.pin,
                verify: m.verify,
                buffer: m.buffer(),
            },
            outputs: self.outputs(),
            multi_host,
            interleaving: Interleaving::default(),
        }
    }

    /// The typed target.
    pub(crate) fn target(&self) -> Target {
        Target {
            peer: self.target.peer.clone(),
            hosts: self.target.hosts.clone(),
            wait: self.target.wait,
            ipv6: self.target.ipv6,
        }
    }

    /// The typed transports, modes and options.
    pub(crate) fn transport(&self) -> TransportChoice {
        TransportChoice {
            transports: self.transport.transport.0.clone(),
            modes: self.transport.mode.clone(),
            options: self.transport.options.given.clone(),
        }
    }

    /// The typed outputs.
    pub(crate) fn outputs(&self) -> Outputs {
        Outputs {
            json: self.output.json.clone(),
            csv: self.output.csv.clone(),
            label: self.output.label.clone(),
        }
    }
}

impl MultiHostFlags {
    /// The typed multi-host flags.
    pub(crate) fn spec(&self) -> MultiHostSpec {
        MultiHostSpec {
            clients: self.clients.as_ref().map(|c| c.0.clone()),
            streams: self.streams.as_ref().map(|c| c.0.clone()),
            duration: self.duration,
            links: self.links.as_ref().map(|c| c.0.clone()),
            bidir: self.bidir,
            client_hosts: self.client_hosts,
            workload_options: self.workload.given.clone(),
        }
    }
}

/// A comma-separated list of names (tests, transports), empty items
/// dropped; the registries judge the names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct NameList(pub Vec<String>);

/// Splits a comma-separated list of names.
pub(crate) fn parse_names(s: &str) -> Result<NameList, String> {
    Ok(NameList(
        s.split(',')
            .map(str::trim)
            .filter(|x| !x.is_empty())
            .map(str::to_string)
            .collect(),
    ))
}

/// Parsed `--sizes`, bytes (a newtype so clap takes the list as one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct SizeList(pub Vec<u64>);

/// Parsed `--clients` or `--streams` (a newtype so clap takes the list as
/// one value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct CountList(pub Vec<u32>);

fn parse_sizes(s: &str) -> Result<SizeList, netgap::units::UnitError> {
    netgap::units::parse_size_list(s).map(SizeList)
}

fn parse_duration(s: &str) -> Result<Duration, netgap::units::UnitError> {
    netgap::units::parse_duration(s)
}

fn parse_peer(s: &str) -> Result<PeerAddr, String> {
    PeerAddr::parse(s).map_err(|e| e.to_string())
}

fn parse_hosts(s: &str) -> Result<HostsArg, String> {
    HostsArg::parse(s).map_err(|e| match e {
        netgap::cluster::HostsError::Arg { detail, .. } => detail,
        other => other.to_string(),
    })
}

fn parse_mode(s: &str) -> Result<Mode, String> {
    let name = s.trim();
    Mode::by_name(name).ok_or_else(|| format!("unknown mode {name:?}; use event or poll"))
}

fn parse_counts(s: &str) -> Result<CountList, String> {
    netgap::plan::parse_counts(s)
        .map(CountList)
        .map_err(|e| e.to_string())
}

/// Two comma-separated items, as `A,B`.
fn pair(s: &str) -> Result<(&str, &str), String> {
    match s.split(',').map(str::trim).collect::<Vec<_>>().as_slice() {
        [a, b] => Ok((a, b)),
        _ => Err("expected two numbers separated by a comma".into()),
    }
}

fn parse_ci(s: &str) -> Result<CiSpec, String> {
    let (level, width) = pair(s)?;
    let num = |t: &str| {
        t.trim_end_matches('%')
            .parse::<f64>()
            .map_err(|_| format!("{t:?} is not a number"))
    };
    Ok(CiSpec {
        confidence_pct: num(level)?,
        half_width_pct: num(width)?,
    })
}

fn parse_ci_reps(s: &str) -> Result<(u32, u32), String> {
    let (min, max) = pair(s)?;
    let count = |t: &str| {
        t.parse::<u32>()
            .map_err(|_| format!("{t:?} is not a count"))
    };
    Ok((count(min)?, count(max)?))
}

fn parse_pin(s: &str) -> Result<Pin, String> {
    Pin::parse(s).map_err(|e| e.to_string())
}
