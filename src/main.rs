//! The `netgap` binary: parse the command line, call the library, print one
//! line on error. The work lives in the `netgap` library crate.

mod cli;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use cli::{Cli, Command, ServeArgs};
use netgap::agent::Agent;
use netgap::coordinator::{run_plan, CoordError};
use netgap::output::TableObserver;
use netgap::plan::{Plan, RunArgs};
use netgap::record::{CsvSink, JsonlSink, RecordSink};
use netgap::{bench, transport};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
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
            let text = e.to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!(
                "netgap: {} (see netgap --help)",
                first.trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    let outcome = match cli.command {
        None => battery(cli.json, cli.csv),
        Some(Command::Run(args)) => run(&args),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::List) => {
            list();
            Ok(())
        }
    };
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("netgap: error: {}", one_line(&e));
            ExitCode::from(1)
        }
    }
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

fn battery(json: Option<PathBuf>, csv: Option<PathBuf>) -> Result<()> {
    let json = json.unwrap_or_else(|| {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace([':', '-'], "");
        PathBuf::from(format!("netgap-results-{stamp}.jsonl"))
    });
    let mut plan = Plan::battery(json.clone());
    plan.csv = csv;
    eprintln!(
        "netgap: default battery: {} points (pingpong, stream, bibw-pingpong, bibw over tcp and unix, 1 B to 4 MiB) on loopback",
        plan.points.len()
    );
    execute(&plan)?;
    println!("results: {}", json.display());
    Ok(())
}

fn run(args: &RunArgs) -> Result<()> {
    if netgap::group::plan::is_group_run(&args.test)? {
        return run_group(args);
    }
    let plan = Plan::from_args(args)?;
    execute(&plan)
}

fn execute(plan: &Plan) -> Result<()> {
    let mut sinks: Vec<Box<dyn RecordSink>> = Vec::new();
    if let Some(p) = &plan.json {
        sinks.push(Box::new(JsonlSink::open(p)?));
    }
    if let Some(p) = &plan.csv {
        sinks.push(Box::new(CsvSink::open(p)?));
    }
    let mut table = TableObserver::new(plan.method.reps);
    let outcome = run_plan(plan, &mut sinks, &mut table);
    table.finish();
    for w in table.warnings() {
        eprintln!("netgap: warning: {w}");
    }
    match outcome {
        Ok(_) => Ok(()),
        Err(e @ CoordError::Point { .. }) => {
            let kept = match sinks.first() {
                Some(s) => format!("; points measured before are in {}", s.path().display()),
                None => String::new(),
            };
            Err(anyhow!("{e}{kept}"))
        }
        Err(e) => Err(e.into()),
    }
}

/// A run of multi-host tests (multistream, hotspot, fanin, fanout, connect,
/// multirail).
fn run_group(args: &RunArgs) -> Result<()> {
    use netgap::group::{coordinator::run_group_plan, plan::GroupPlan};
    let plan = GroupPlan::from_args(args)?;
    let mut sinks: Vec<Box<dyn RecordSink>> = Vec::new();
    if let Some(p) = &plan.json {
        sinks.push(Box::new(JsonlSink::open(p)?));
    }
    if let Some(p) = &plan.csv {
        sinks.push(Box::new(CsvSink::open(p)?));
    }
    let mut table = TableObserver::new(plan.reps);
    let outcome = run_group_plan(&plan, &mut sinks, &mut table);
    table.finish();
    for w in table.warnings() {
        eprintln!("netgap: warning: {w}");
    }
    outcome.map(|_| ()).map_err(|e| {
        let kept = match sinks.first() {
            Some(s) => format!("; points measured before are in {}", s.path().display()),
            None => String::new(),
        };
        anyhow!("{e}{kept}")
    })
}

fn serve(args: &ServeArgs) -> Result<()> {
    let ip: IpAddr = args
        .bind
        .trim_matches(|c| c == '[' || c == ']')
        .parse()
        .with_context(|| format!("--bind {:?} is not an IP address", args.bind))?;
    let agent = Agent::bind(SocketAddr::new(ip, args.port))?;
    let addr = agent
        .local_addr()
        .context("reading the listening address")?;
    if !ip.is_loopback() {
        eprintln!(
            "netgap: warning: the agent listens on {addr}, reachable from other hosts, and serves anyone who connects"
        );
    }
    println!("netgap agent {} listening on {addr}", netgap::VERSION);
    agent.serve().context("serving")?;
    Ok(())
}

fn list() {
    println!("tests:");
    for t in bench::registry() {
        println!(
            "  {:<14} {:<15} {}",
            t.name(),
            t.metric().key(),
            t.summary()
        );
    }
    println!();
    println!("multi-host tests (--hosts, --clients, -P, --duration):");
    for t in netgap::group::registry() {
        println!("  {:<14} {:<17} {}", t.name, t.metric.key(), t.summary);
    }
    println!();
    println!("transports:");
    println!("  name     available  reliable  msg-bound  cross-host  modes       max-msg");
    let yes = |b: bool| if b { "yes" } else { "no" };
    let mut unavailable = Vec::new();
    for t in transport::registry() {
        let c = t.capabilities();
        let avail = match t.availability() {
            Ok(()) => "yes",
            Err(why) => {
                unavailable.push(format!("{}: {why}", t.name()));
                "no"
            }
        };
        let modes = c
            .modes
            .iter()
            .map(|m| m.as_str())
            .collect::<Vec<_>>()
            .join(",");
        let max_msg = t
            .max_message_bytes()
            .map_or_else(|| "-".to_string(), |b| b.to_string());
        let row = format!(
            "  {:<8} {:<10} {:<9} {:<10} {:<11} {:<11} {}",
            t.name(),
            avail,
            yes(c.reliable),
            yes(c.message_boundaries),
            yes(c.cross_host),
            modes,
            max_msg,
        );
        println!("{}", row.trim_end());
    }
    println!();
    for t in transport::registry() {
        println!("  {:<8} {}", t.name(), t.summary());
    }
    for line in unavailable {
        println!("  not available here: {line}");
    }
}
