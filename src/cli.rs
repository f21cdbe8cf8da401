//! The command line: clap's raw arguments. Validation into a plan happens in
//! the library (`netgap::plan`).

use clap::{Parser, Subcommand};
use netgap::plan::{RunArgs, DEFAULT_PORT};
use std::path::PathBuf;

/// netgap characterizes communication stacks and shows the gap between them.
///
/// With no command, netgap runs its default battery on this machine: pingpong,
/// stream, bibw-pingpong and bibw over tcp and unix on loopback, sizes 1 B to
/// 4 MiB; it prints a table and writes a results file.
#[derive(Debug, Parser)]
#[command(name = "netgap", version, about, long_about)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Results file of the default battery (JSON Lines); default
    /// netgap-results-TIMESTAMP.jsonl in the current directory.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
    /// Also write the default battery's results as CSV.
    #[arg(long, value_name = "FILE")]
    pub csv: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Measure tests over transports and sizes against an agent; multi-host
    /// tests (multistream, hotspot, fanin, fanout, connect, multirail)
    /// drive the agents of several hosts (--hosts).
    Run(Box<RunArgs>),
    /// Run the agent that serves coordinators' tests.
    Serve(ServeArgs),
    /// Show the tests and transports, with what is available on this host.
    List,
    /// NetPIPE-style sweep: throughput and block time over exponentially
    /// growing block sizes with perturbations, flagging dropouts.
    #[command(after_long_help = netgap::sweep::HELP)]
    Sweep(Box<netgap::sweep::SweepArgs>),
    /// LogP parameters per message size: send and receive overheads, gap
    /// and latency, each with its spread.
    #[command(after_long_help = netgap::logp::HELP)]
    Logp(Box<netgap::logp::LogpArgs>),
    /// Write an HTML report (plots, gap table, environment) of results files.
    Report(ReportArgs),
    /// Compare two results files point by point; exit status 3 when a
    /// significant regression passes the threshold.
    Compare(CompareArgs),
    /// Turn a peer tool's output into netgap result records (JSON Lines).
    Import(ImportArgs),
    /// Build, show or remove a virtual cluster of network namespaces.
    #[command(subcommand)]
    Testbed(TestbedCommand),
    /// Make shared keys for agents.
    #[command(subcommand)]
    Key(KeyCommand),
}

#[derive(Debug, clap::Args)]
pub struct ReportArgs {
    /// Results files (JSON Lines, netgap's own or imported).
    #[arg(required = true, value_name = "RESULTS")]
    pub results: Vec<PathBuf>,
    /// The HTML file to write.
    #[arg(short = 'o', long, default_value = "report.html", value_name = "FILE")]
    pub output: PathBuf,
    /// Also write every plot as SVG and PNG into this directory.
    #[arg(long, value_name = "DIR")]
    pub images: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct CompareArgs {
    /// The reference results file.
    pub base: PathBuf,
    /// The results file to judge against it.
    pub new: PathBuf,
    /// Smallest significant worsening, in percent, that fails the comparison.
    #[arg(long, default_value_t = 5.0, value_name = "PCT")]
    pub threshold: f64,
}

#[derive(Debug, clap::Args)]
pub struct ImportArgs {
    /// The format: iperf3 (-J JSON), netpipe (NPtcp -o file), sockperf
    /// (client output), osu (osu_latency, osu_bw, osu_bibw output).
    pub format: String,
    /// The peer tool's output file.
    pub file: PathBuf,
    /// Where to append the records (JSON Lines); standard output if absent.
    #[arg(short = 'o', long, value_name = "OUT")]
    pub output: Option<PathBuf>,
    /// Message size in bytes, for output that does not state it (sockperf
    /// ping-pong); K, M, G suffixes allowed.
    #[arg(long, value_name = "BYTES", value_parser = netgap::units::parse_size_bytes)]
    pub size: Option<u64>,
}

#[derive(Debug, Subcommand)]
pub enum TestbedCommand {
    /// Create the namespaces, links and agents, and write the hosts file.
    Up(netgap::testbed::UpArgs),
    /// Show the hosts, addresses, links and whether each agent is alive.
    Status(netgap::testbed::NameArgs),
    /// Remove everything the testbed made (also after a crash).
    Down(netgap::testbed::NameArgs),
}

#[derive(Debug, Subcommand)]
pub enum KeyCommand {
    /// Write a new random 32-byte key to FILE (mode 0600; never overwrites).
    New {
        /// The key file to create.
        file: PathBuf,
    },
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on: an IP address (loopback unless told otherwise;
    /// any other needs --key) or unix:PATH.
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// Control port.
    #[arg(long, short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
    /// Address data listeners bind to (default: the address the control
    /// connection came in on; 127.0.0.1 over a Unix socket).
    #[arg(long, value_name = "IP")]
    pub data_bind: Option<String>,
    /// Shared key file every coordinator must prove (mode 0600).
    #[arg(long, value_name = "FILE")]
    pub key: Option<PathBuf>,
    /// Most concurrent flows one session may open.
    #[arg(long, default_value_t = netgap::limits::DEFAULT_MAX_FLOWS)]
    pub max_flows: u32,
    /// Longest one run may take.
    #[arg(long, default_value = "10m", value_name = "DUR")]
    pub max_duration: String,
    /// Highest rate a session may ask for, in Gbit/s.
    #[arg(long, default_value_t = netgap::limits::DEFAULT_MAX_RATE_GBPS, value_name = "GBPS")]
    pub max_rate: f64,
    /// Largest message a session may use (e.g. 64K, 4M).
    #[arg(long, default_value = "256M", value_name = "SIZE")]
    pub max_message: String,
}
