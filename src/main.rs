//! The `netgap` binary: parse the command line, call the library, print one
//! line on error. The work lives in the `netgap` library crate.

mod cli;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use cli::{Cli, Command, CompareArgs, ImportArgs, ReportArgs, ServeArgs};
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
                message.trim_start_matches("error: ")
            );
            return ExitCode::from(2);
        }
    };
    let outcome = match cli.command {
        None => battery(cli.json, cli.csv),
        Some(Command::Run(args)) => run(&args),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Sweep(args)) => sweep(&args),
        Some(Command::Logp(args)) => logp(&args),
        Some(Command::List) => {
            list();
            Ok(())
        }
        Some(Command::Report(args)) => report(&args),
        Some(Command::Compare(args)) => match compare(&args) {
            Ok(true) => return ExitCode::from(netgap::compare::REGRESSION_EXIT_CODE),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        },
        Some(Command::Import(args)) => import(&args),
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
    let html = json.with_extension("html");
    netgap::report::write_report(std::slice::from_ref(&json), &html, None)
        .with_context(|| format!("writing the report of {}", json.display()))?;
    println!("report: {}", html.display());
    Ok(())
}

fn report(args: &ReportArgs) -> Result<()> {
    let written =
        netgap::report::write_report(&args.results, &args.output, args.images.as_deref())?;
    println!("report: {}", written.html.display());
    for p in &written.images {
        println!("image: {}", p.display());
    }
    Ok(())
}

/// Prints the comparison; `Ok(true)` when a regression passes the threshold.
fn compare(args: &CompareArgs) -> Result<bool> {
    if !(args.threshold.is_finite() && args.threshold >= 0.0) {
        return Err(anyhow!(
            "--threshold {} is not a non-negative percentage",
            args.threshold
        ));
    }
    let base = netgap::report::load::load_file(&args.base)?;
    let new = netgap::report::load::load_file(&args.new)?;
    let c = netgap::compare::compare(&base, &new, args.threshold);
    if c.changes.is_empty() {
        return Err(anyhow!(
            "{} and {} have no point in common",
            args.base.display(),
            args.new.display()
        ));
    }
    print!("{}", netgap::compare::render(&c));
    let regressed = c.regressions().next().is_some();
    Ok(regressed)
}

fn import(args: &ImportArgs) -> Result<()> {
    use std::io::Write;
    let records = netgap::import::import_file(&args.format, &args.file, args.size)?;
    let mut text = String::new();
    for r in &records {
        text.push_str(&serde_json::to_string(r).context("encoding a record")?);
        text.push('\n');
    }
    match &args.output {
        Some(out) => {
            let mut f = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(out)
                .with_context(|| format!("opening {}", out.display()))?;
            f.write_all(text.as_bytes())
                .with_context(|| format!("writing {}", out.display()))?;
            eprintln!(
                "netgap: imported {} records from {} into {}",
                records.len(),
                args.file.display(),
                out.display()
            );
        }
        None => std::io::stdout()
            .write_all(text.as_bytes())
            .context("writing to standard output")?,
    }
    Ok(())
}

fn run(args: &RunArgs) -> Result<()> {
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

fn sweep(args: &netgap::sweep::SweepArgs) -> Result<()> {
    let plan = netgap::sweep::SweepPlan::from_args(args)?;
    let mut sinks = open_sinks(&plan.run)?;
    let outcome = netgap::sweep::run_sweep(&plan, &mut sinks, &mut std::io::stdout());
    outcome.map(|_| ()).map_err(|e| kept_points(e, &sinks))
}

fn logp(args: &netgap::logp::LogpArgs) -> Result<()> {
    let plan = netgap::logp::LogpPlan::from_args(args)?;
    if args.stack.pin.is_none() {
        eprintln!(
            "netgap: note: without --pin the woken server may run on the client's CPU, and its work then lands in o_s; pin them apart, e.g. --pin 0,1"
        );
    }
    let mut sinks = open_sinks(&plan.run)?;
    let outcome = netgap::logp::run_logp(&plan, &mut sinks, &mut std::io::stdout());
    outcome.map(|_| ()).map_err(|e| kept_points(e, &sinks))
}

fn open_sinks(plan: &Plan) -> Result<Vec<Box<dyn RecordSink>>> {
    let mut sinks: Vec<Box<dyn RecordSink>> = Vec::new();
    if let Some(p) = &plan.json {
        sinks.push(Box::new(JsonlSink::open(p)?));
    }
    if let Some(p) = &plan.csv {
        sinks.push(Box::new(CsvSink::open(p)?));
    }
    Ok(sinks)
}

/// A failed point's error, naming the file that keeps the points before it.
fn kept_points(e: CoordError, sinks: &[Box<dyn RecordSink>]) -> anyhow::Error {
    match (&e, sinks.first()) {
        (CoordError::Point { .. }, Some(s)) => {
            anyhow!("{e}; points measured before are in {}", s.path().display())
        }
        _ => e.into(),
    }
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
