//! The `netgap` binary: parse the command line, call the library, print one
//! line on error. The work lives in the `netgap` library crate.

mod cli;

use anyhow::{anyhow, Result};
use clap::Parser;
use cli::measure::{self, Results};
use cli::{Cli, Command, KeyCommand, TestbedCommand};
use netgap::text::escape_control;
use std::process::ExitCode;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let _ = e.print();
                return ExitCode::SUCCESS;
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                let _ = e.print();
                return ExitCode::from(2);
            }
            // clap's message may go on over lines ("required arguments were
            // not provided:" then the arguments); keep it whole on one line.
            let text = e.to_string();
            let message = text
                .lines()
                .map(str::trim)
                .take_while(|l| !l.is_empty() && !l.starts_with("Usage:"))
                .collect::<Vec<_>>()
                .join(" ");
            let message = if message.is_empty() {
                "bad arguments".to_string()
            } else {
                message
            };
            eprintln!(
                "netgap: {} (see netgap --help)",
                escape_control(message.trim_start_matches("error: "))
            );
            return ExitCode::from(2);
        }
    };
    let outcome = match cli.command {
        None => cli::battery::battery(cli.output.json, cli.output.csv, cli.output.label, cli.reps),
        Some(Command::Run(args)) => {
            measure::run(&args.request(), &args.mpi.options(), Results::Flags)
        }
        Some(Command::Serve(args)) => cli::serve::serve(&args),
        Some(Command::Sweep(args)) => measure::sweep(&args.request(), Results::Flags),
        Some(Command::Logp(args)) => measure::logp(&args.request(), Results::Flags),
        Some(Command::List) => {
            cli::list::list();
            Ok(())
        }
        Some(Command::Study(args)) => cli::study::run(&args),
        Some(Command::Report(args)) => cli::results::report(&args),
        Some(Command::Compare(args)) => match cli::results::compare(&args) {
            Ok(true) => return ExitCode::from(netgap::compare::REGRESSION_EXIT_CODE),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        },
        Some(Command::Import(args)) => cli::results::import(&args),
        Some(Command::Testbed(cmd)) => testbed(&cmd),
        Some(Command::Key(KeyCommand::New { file })) => cli::serve::new_key(&file),
        Some(Command::MpiRank(args)) => mpi_rank(&args),
        Some(Command::MpiExec(args)) => Err(anyhow!(netgap::mpi::launch::exec_in(
            &args.netns,
            &args.hostname,
            &args.command
        ))),
        Some(Command::MpiAgent(args)) => Err(anyhow!(netgap::mpi::launch::agent(
            &args.host,
            &args.command
        ))),
        Some(Command::FlowShard) => netgap::shard::run_shard().map_err(Into::into),
        Some(Command::GatherLoad) => {
            netgap_workload::run_gather_child().map_err(|e| anyhow::anyhow!(e))
        }
        Some(Command::PipelineStages) => {
            netgap_workload::run_pipeline_stages_child().map_err(|e| anyhow::anyhow!(e))
        }
        Some(Command::WebLoad) => {
            netgap_workload::run_web_load_child().map_err(|e| anyhow::anyhow!(e))
        }
        Some(Command::Wrap(args)) => {
            Err(netgap::wrap::exec(&args.transport, args.relayed, &args.command).into())
        }
        Some(Command::Relay(args)) => args
            .config()
            .and_then(|config| netgap::relay::run(config).map_err(Into::into)),
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netgap: error: {}", escape_control(&one_line(&e)));
            ExitCode::from(1)
        }
    }
}

/// Prints a warning, whose text may quote a results file or a peer, with
/// its control characters escaped.
fn warn(w: &dyn std::fmt::Display) {
    eprintln!("netgap: warning: {}", escape_control(&w.to_string()));
}

/// The error and its causes on one line, leaving out a cause whose text the
/// line already holds (typed errors often quote their source).
fn one_line(e: &anyhow::Error) -> String {
    let mut line = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if line.contains(&text) {
            continue;
        }
        if !line.is_empty() {
            line.push_str(": ");
        }
        line.push_str(&text);
    }
    line.replace('\n', " ")
}

/// `netgap mpi-rank`: one rank of an MPI job.
fn mpi_rank(args: &cli::MpiRankArgs) -> Result<()> {
    let plan = netgap::mpi::wire::RankPlan::from_args(
        &args.points,
        args.reps,
        args.iterations,
        args.rep_time_us,
        args.warmup,
    )?;
    #[cfg(feature = "mpi")]
    {
        netgap::mpi::rank::rank_main(&plan)?;
        Ok(())
    }
    #[cfg(not(feature = "mpi"))]
    {
        let _ = plan;
        Err(anyhow!(
            "this netgap was built without MPI; build it with `cargo build --features mpi`"
        ))
    }
}

fn testbed(cmd: &TestbedCommand) -> Result<()> {
    match cmd {
        TestbedCommand::Up(args) => cli::testbed::up(args),
        TestbedCommand::Set(args) => cli::testbed::set(args),
        TestbedCommand::Status(args) => cli::testbed::status(args),
        TestbedCommand::Down(args) => cli::testbed::down(args),
    }
}
