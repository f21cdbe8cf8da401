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
    /// Measure tests over transports and sizes against an agent.
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
}

#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// Address to listen on (loopback unless told otherwise).
    #[arg(long, default_value = "127.0.0.1")]
    pub bind: String,
    /// Control port.
    #[arg(long, short = 'p', default_value_t = DEFAULT_PORT)]
    pub port: u16,
}
