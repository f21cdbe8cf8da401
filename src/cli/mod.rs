//! The command line: clap's raw arguments. The flags that commands share are
//! defined once, in the groups of [`flags`]; validation into a plan happens
//! in the library (`netgap::plan`).

pub(crate) mod battery;
pub(crate) mod flags;
pub(crate) mod list;
pub(crate) mod measure;
pub(crate) mod relay;
pub(crate) mod results;
pub(crate) mod serve;
pub(crate) mod study;
pub(crate) mod testbed;

use clap::{Parser, Subcommand};
use flags::{InterleaveFlags, MpiFlags, MultiHostFlags, OutputFlags, RepFlags, StackFlags};
use netgap::plan::DEFAULT_PORT;
use std::path::PathBuf;
use std::time::Duration;

/// netgap characterizes communication stacks and shows the gap between them.
///
/// With no command, netgap runs its main job on this machine: pingpong and
/// stream over the stacks available on loopback (tcp, unix, shm, uring,
/// udp), interleaved, client and server pinned apart; it prints a table and
/// each stack against tcp, and writes a results file and its report.
#[derive(Debug, Parser)]
#[command(
    name = "netgap",
    version,
    about,
    long_about,
    mut_arg("json", |a| a.help("Results file of the main job (JSON Lines); default netgap-results-TIMESTAMP.jsonl in the current directory")),
    mut_arg("csv", |a| a.help("Also write the main job's results as CSV")),
    mut_arg("label", |a| a.help("Name the main job's stacks in its records (stack.label)"))
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub output: OutputFlags,
    /// Repetitions of each point of the main job (default 10); fewer make
    /// it shorter.
    #[arg(long, value_name = "N")]
    pub reps: Option<u32>,
}

/// `run`'s one line of help, with the workloads named from their
/// registry, so the list never goes stale.
fn run_about() -> String {
    let names: Vec<&str> = netgap::workload::registry()
        .iter()
        .map(|w| w.name())
        .collect();
    format!(
        "Measure tests over transports and sizes against an agent; workloads ({}) drive the agents of several hosts (--hosts)",
        names.join(", ")
    )
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
    /// Measure tests over transports and sizes against an agent;
    /// workloads drive the agents of several hosts (--hosts).
    #[command(about = run_about())]
    Run(Box<RunFlags>),
    /// Run the agent that serves coordinators' tests.
    Serve(ServeArgs),
    /// Show the tests and transports, with what is available on this host.
    List,
    /// NetPIPE-style sweep: throughput and block time over exponentially
    /// growing block sizes with perturbations, flagging dropouts.
    #[command(
        after_long_help = netgap::sweep::HELP,
        mut_arg("ci", |a| a.help("Repeat each point until the LEVEL% confidence interval of the mean is within ±WIDTH% of it (e.g. 99,2), between the --ci-reps bounds; results record whether it was met. Without it, --trials trials")),
        mut_arg("ci_reps", |a| a.help("Fewest and most trials of a --ci point [default: 3,30]"))
    )]
    Sweep(Box<SweepFlags>),
    /// LogP parameters per message size: send and receive overheads, gap
    /// and latency, each with its spread.
    #[command(
        after_long_help = netgap::logp::HELP,
        mut_arg("sizes", |a| a.help("Message sizes: a list 1,1K,64K, a range 1..1M, or 1..1M:x4 [default: 1,1K,64K,1M]").long_help(None)),
        mut_arg("rep_time", |a| a.help("Time budget of one repetition; the iteration count adapts to it [default: 50ms]"))
    )]
    Logp(Box<LogpFlags>),
    /// Run a study's figures (000, 001, 002, 003, 004 or all) with its
    /// method, on a testbed it builds (root) or on --hosts, into one
    /// results file and a report that judges the study's claims.
    Study(Box<study::StudyArgs>),
    /// Write an HTML report (plots, gap table, environment) of results files.
    Report(ReportArgs),
    /// Compare two results files point by point, or two stacks of one file
    /// (--base-stack, --new-stack); exit status 3 when a significant
    /// regression passes the threshold.
    Compare(CompareArgs),
    /// Turn a peer tool's output into netgap result records (JSON Lines).
    Import(ImportArgs),
    /// Build, show or remove a virtual cluster of network namespaces.
    #[command(subcommand)]
    Testbed(TestbedCommand),
    /// Make shared keys for agents.
    #[command(subcommand)]
    Key(KeyCommand),
    /// One MPI rank of the MPI tests, as mpirun starts it (internal).
    #[command(hide = true)]
    MpiRank(MpiRankArgs),
    /// Runs a command inside a testbed host's namespaces (internal: how
    /// the MPI tests start mpirun on a testbed host).
    #[command(hide = true)]
    MpiExec(MpiExecArgs),
    /// mpirun's launch agent on the testbed (internal): starts mpirun's
    /// daemon inside HOST's namespaces.
    #[command(hide = true)]
    MpiAgent(MpiAgentArgs),
    /// One process of a flow-engine server spread over processes
    /// (internal: an agent starts it on a listener it passes down, with
    /// its configuration on stdin).
    #[command(name = "flow-shard", hide = true)]
    FlowShard,
    /// Internal: `web`'s load generator under the preload library (an
    /// agent starts it with its job on stdin).
    #[command(name = "web-load", hide = true)]
    WebLoad,
    /// Internal: `gather`'s gatherer under the preload library (an agent
    /// starts it with its job on stdin).
    #[command(name = "gather-load", hide = true)]
    GatherLoad,
    /// Internal: a `pipeline` role's stages as a program of their own on
    /// the kernel's TCP sockets, under the preload library over shm or
    /// xdp (`--stages program`; an agent starts it and steps it over
    /// stdin and stdout).
    #[command(name = "pipeline-stages", hide = true)]
    PipelineStages,
    /// Run PROGRAM under netgap's preload sockets library: its TCP
    /// connections to programs on this host that run under it too move
    /// onto shared memory (-t shm), those to other hosts onto xdp through
    /// the hosts' relays (-t xdp); other sockets stay on the kernel.
    Wrap(WrapArgs),
    /// Carry the preload library's connections to other hosts over xdp
    /// (root; foreground; one per host network namespace; needs the xdp
    /// feature).
    Relay(relay::RelayArgs),
}

/// Flags of `netgap wrap`.
#[derive(Debug, clap::Args)]
pub(crate) struct WrapArgs {
    /// The stack to move connections to: shm (same host) or xdp (other
    /// hosts, through `netgap relay`).
    #[arg(short = 't', long = "transport", value_name = "STACK")]
    pub transport: String,
    /// With xdp: keep the program's connections to other hosts on the
    /// relays instead of asking for direct ones (each on an AF_XDP socket
    /// of the program's own), to compare the two paths (the library's
    /// `NETGAP_PRELOAD_DIRECT=0` does the same).
    #[arg(long)]
    pub relayed: bool,
    /// The program and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "PROGRAM ARGS"
    )]
    pub command: Vec<std::ffi::OsString>,
}

/// Flags of `netgap mpi-rank`: the points both ranks run.
#[derive(Debug, clap::Args)]
pub(crate) struct MpiRankArgs {
    /// Points, `TEST:SIZE,...`.
    #[arg(long)]
    pub points: String,
    /// Measured repetitions per point.
    #[arg(long)]
    pub reps: u32,
    /// Iterations per repetition.
    #[arg(long)]
    pub iterations: Option<u64>,
    /// Time budget of a repetition, in microseconds.
    #[arg(long)]
    pub rep_time_us: Option<u64>,
    /// Warm-up iterations per point.
    #[arg(long)]
    pub warmup: Option<u64>,
}

/// Flags of `netgap mpi-exec`.
#[derive(Debug, clap::Args)]
pub(crate) struct MpiExecArgs {
    /// The network namespace to enter.
    #[arg(long)]
    pub netns: String,
    /// The host name of the new UTS namespace.
    #[arg(long)]
    pub hostname: String,
    /// The command and its arguments.
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// Arguments of `netgap mpi-agent`, as mpirun gives them.
#[derive(Debug, clap::Args)]
pub(crate) struct MpiAgentArgs {
    /// The host to start the command on.
    pub host: String,
    /// The command, run through `sh -c` as ssh would.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<std::ffi::OsString>,
}

/// Flags of `netgap run`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct RunFlags {
    /// Tests to run, comma separated (see `netgap list`).
    #[arg(value_name = "TEST[,TEST...]", value_parser = flags::parse_names)]
    pub tests: flags::NameList,
    #[command(flatten)]
    pub stack: StackFlags,
    #[command(flatten)]
    pub reps: RepFlags,
    #[command(flatten)]
    pub multi_host: MultiHostFlags,
    #[command(flatten)]
    pub interleave: InterleaveFlags,
    #[command(flatten)]
    pub mpi: MpiFlags,
}

impl RunFlags {
    /// The typed request.
    pub(crate) fn request(&self) -> netgap::plan::RunRequest {
        netgap::plan::RunRequest {
            interleaving: self.interleave.spec(),
            ..self
                .stack
                .request(&self.tests.0, &self.reps, self.multi_host.spec())
        }
    }
}

/// Flags of `netgap sweep`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SweepFlags {
    /// Smallest block size.
    #[arg(long, default_value = "1", value_name = "SIZE", value_parser = netgap::units::parse_size_bytes)]
    pub start: u64,
    /// Largest block size.
    #[arg(long, default_value = "8M", value_name = "SIZE", value_parser = netgap::units::parse_size_bytes)]
    pub end: u64,
    /// Grow nominal sizes by this factor instead of NetPIPE's sequence
    /// (powers of two and 1.5 times each: 1, 2, 3, 4, 6, 8, 12, ...).
    #[arg(long, value_name = "F")]
    pub factor: Option<f64>,
    /// Also measure n-P and n+P bytes around each nominal size n (NetPIPE's
    /// -p); 0 switches perturbation off.
    #[arg(long, default_value_t = netgap::sweep::DEFAULT_PERTURBATION_BYTES, value_name = "BYTES")]
    pub perturbation: u64,
    /// Stream blocks one way back to back instead of ping-pong.
    #[arg(long, conflicts_with = "bidir")]
    pub stream: bool,
    /// Both sides send blocks at once (bibw) instead of ping-pong.
    #[arg(long)]
    pub bidir: bool,
    /// Target duration of one trial; the repeat count adapts to it.
    #[arg(long, default_value = "40ms", value_name = "DUR", value_parser = netgap::units::parse_duration)]
    pub trial_time: Duration,
    /// Trials per point (min, mean, max and the trimmed mean of them).
    #[arg(long, default_value_t = netgap::sweep::DEFAULT_TRIALS, value_name = "N")]
    pub trials: u32,
    /// Stop a transport's sweep after the first block that takes longer
    /// than this (NetPIPE stops at one second).
    #[arg(long, default_value = "1s", value_name = "DUR", value_parser = netgap::units::parse_duration)]
    pub max_block_time: Duration,
    #[command(flatten)]
    pub stack: StackFlags,
    #[command(flatten)]
    pub interleave: InterleaveFlags,
}

impl SweepFlags {
    /// The typed request.
    pub(crate) fn request(&self) -> netgap::sweep::SweepRequest {
        use netgap::sweep::SweepKind;
        let m = &self.stack.method;
        netgap::sweep::SweepRequest {
            start_bytes: self.start,
            end_bytes: self.end,
            factor: self.factor,
            perturbation_bytes: self.perturbation,
            kind: if self.stream {
                SweepKind::Stream
            } else if self.bidir {
                SweepKind::Bidir
            } else {
                SweepKind::PingPong
            },
            trial_time: self.trial_time,
            trials: self.trials,
            max_block_time: self.max_block_time,
            target: self.stack.target(),
            key_file: self.stack.key.key.clone(),
            transport: self.stack.transport(),
            warmup: m.warmup,
            ci: m.ci,
            ci_reps: m.ci_reps,
            timeout: m.timeout,
            pin: m.pin,
            verify: m.verify,
            buffer: m.buffer(),
            outputs: self.stack.outputs(),
            interleaving: self.interleave.spec(),
        }
    }
}

/// Flags of `netgap logp`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct LogpFlags {
    #[command(flatten)]
    pub stack: StackFlags,
    #[command(flatten)]
    pub reps: RepFlags,
}

impl LogpFlags {
    /// The typed request (its tests are logp's own).
    pub(crate) fn request(&self) -> netgap::plan::RunRequest {
        self.stack.request(&[], &self.reps, Default::default())
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct ReportArgs {
    /// Results files (JSON Lines, netgap's own or imported): regular files
    /// of at most 1 GiB each.
    #[arg(required = true, value_name = "RESULTS")]
    pub results: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short = 'o', long, default_value = "report.html", value_name = "FILE")]
    pub output: PathBuf,
    /// Also write every plot as SVG and PNG into this directory.
    #[arg(long, value_name = "DIR")]
    pub images: Option<PathBuf>,
    /// The stack the gap tables measure every other against, by parts of
    /// its description ("tcp, MTU 1500", "unix", "tcp/poll", a label);
    /// default: tcp with event completion and no options.
    #[arg(long, value_name = "STACK")]
    pub baseline: Option<String>,
}

#[derive(Debug, clap::Args)]
pub(crate) struct CompareArgs {
    /// The reference results file (a regular file of at most 1 GiB).
    pub base: PathBuf,
    /// The results file to judge against it (at most 1 GiB); without it,
    /// two stacks of BASE (--base-stack, --new-stack) are compared.
    pub new: Option<PathBuf>,
    /// Smallest significant worsening, in percent, that fails the comparison.
    #[arg(long, default_value_t = 5.0, value_name = "PCT")]
    pub threshold: f64,
    /// Compare only these stacks of BASE, by parts of their description
    /// ("MTU 1500", "offload off", "tcp/poll", a label).
    #[arg(long, value_name = "STACK")]
    pub base_stack: Option<String>,
    /// Compare only these stacks of NEW (or of BASE, given one file).
    #[arg(long, value_name = "STACK")]
    pub new_stack: Option<String>,
}

/// `import`'s help on its format, named from the importers' registry so
/// the list never goes stale: the names (`-h`), or each with what output it
/// reads (`--help`).
fn import_format_help(long: bool) -> String {
    let importers = netgap::import::registry();
    if long {
        let width = importers.iter().map(|i| i.name().len()).max().unwrap_or(0);
        let lines: Vec<String> = importers
            .iter()
            .map(|i| format!("  {:width$}  {}", i.name(), i.summary()))
            .collect();
        format!("The format, one of:\n{}", lines.join("\n"))
    } else {
        let names: Vec<&str> = importers.iter().map(|i| i.name()).collect();
        format!("The format: {}", names.join(", "))
    }
}

#[derive(Debug, clap::Args)]
pub(crate) struct ImportArgs {
    /// The format of the peer tool's output (see `--help`).
    #[arg(help = import_format_help(false), long_help = import_format_help(true))]
    pub format: String,
    /// The peer tool's output file: a regular file of at most 256 MiB.
    pub file: PathBuf,
    /// Where to append the records (JSON Lines); standard output if absent.
    #[arg(short = 'o', long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Message size in bytes, for output that does not state it (sockperf
    /// ping-pong); K, M, G suffixes allowed.
    #[arg(long, value_name = "BYTES", value_parser = netgap::units::parse_size_bytes)]
    pub size: Option<u64>,
    /// Name the stack of every imported record (`stack.label`), as `run
    /// --label` does: two imports under different labels are two series.
    #[arg(long, value_name = "TEXT", value_parser = import_label)]
    pub label: Option<String>,
}

/// An import's `--label`: some text, on one line.
fn import_label(text: &str) -> Result<String, String> {
    let t = text.trim();
    if t.is_empty() {
        return Err("an empty label; name the series, e.g. --label \"kernel 6.8\"".into());
    }
    if t.chars().any(char::is_control) {
        return Err("a label is one line of text, without control characters".into());
    }
    Ok(t.to_string())
}

#[derive(Debug, Subcommand)]
pub(crate) enum TestbedCommand {
    /// Create the namespaces, links and agents, and write the hosts file.
    Up(testbed::UpArgs),
    /// Change a running testbed's conditions (MTU, offloads, rate, delay,
    /// loss) without restarting its agents.
    Set(testbed::SetArgs),
    /// Show the hosts, addresses, links, conditions and whether each agent
    /// is alive.
    Status(testbed::NameArgs),
    /// Remove everything the testbed made (also after a crash).
    Down(testbed::NameArgs),
}

#[derive(Debug, Subcommand)]
pub(crate) enum KeyCommand {
    /// Write a new random 32-byte key to FILE (mode 0600; never overwrites).
    New {
        /// The key file to create.
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
pub(crate) struct ServeArgs {
    /// Address to listen on: an IP address (loopback unless told otherwise;
    /// any other needs --key), `auto` (this node's address, from its host
    /// name: one agent per node under srun or mpirun; needs --key) or
    /// unix:PATH.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// Control port.
    #[arg(long, short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Address data listeners bind to (default: the address the control
    /// connection came in on; 127.0.0.1 over a Unix socket); any but a
    /// loopback address needs --key.
    #[arg(long, value_name = "IP")]
    pub data_bind: Option<String>,
    /// Shared key file every coordinator must prove (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Most concurrent flows one session may open.
    #[arg(long, default_value_t = netgap::limits::DEFAULT_MAX_FLOWS)]
    pub max_flows: u32,
    /// Longest one run may take.
    #[arg(long, default_value = "10m", value_name = "DUR", value_parser = netgap::units::parse_duration)]
    pub max_duration: Duration,
    /// The agent's highest data rate, in Gbit/s: all it sends and
    /// receives, over every flow of every test, is paced to it.
    #[arg(long, default_value_t = netgap::limits::DEFAULT_MAX_RATE_GBPS, value_name = "GBPS")]
    pub max_rate: f64,
    /// Largest message a session may use (e.g. 64K, 4M).
    #[arg(long, default_value = "256M", value_name = "SIZE", value_parser = netgap::units::parse_size_bytes)]
    pub max_message: u64,
    /// Most memory one request may commit (buffers, threads and state of
    /// its flows, computed before anything is allocated), e.g. 512M, 4G.
    #[arg(long, default_value = "1G", value_name = "SIZE", value_parser = netgap::units::parse_size_bytes)]
    pub max_memory: u64,
    /// Let workloads start the server programs netgap knows (nginx,
    /// Apache, gmond) on this host, each from a configuration netgap writes
    /// into a directory of its own, stopped when the workload ends.
    #[arg(long)]
    pub allow_services: bool,
    /// The directory under which the agent makes its own run directory
    /// (agent-PID-NONCE, 0711) for its services' files and pio's stripes;
    /// it must be the agent user's and writable by nobody else (default:
    /// /var/lib/netgap as root, else $XDG_RUNTIME_DIR/netgap or
    /// /tmp/netgap-UID). What agents that no longer run left there is
    /// removed at start.
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
    /// The directory pio's stripe files go under (default: the agent's run
    /// directory); a coordinator's `pio --dir SUB` names only a relative
    /// subdirectory of it. Stripes of agents that no longer run are
    /// removed from it at start.
    #[arg(long, value_name = "DIR")]
    pub io_dir: Option<PathBuf>,
    /// The interface the host's relay takes for its xdp flows when a
    /// `-t xdp` run under the preload library (web, gather) starts it:
    /// never the one the runs' TCP connections use. Needs --key: the
    /// relays' shared key is derived from it.
    #[arg(long, value_name = "NAME")]
    pub relay_interface: Option<String>,
    /// Most connections one process holds: a flow-engine server role past
    /// it is spread over processes even when the descriptor limit would
    /// hold it (internal: tests that path at small scale).
    #[arg(long, hide = true, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub flows_per_process: Option<u32>,
}
