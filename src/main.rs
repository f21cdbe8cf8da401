//! The `netgap` binary: parse the command line, call the library, print one
//! line on error. The work lives in the `netgap` library crate.

mod cli;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use cli::{Cli, Command, KeyCommand, ServeArgs, TestbedCommand};
use netgap::agent::Agent;
use netgap::control::ControlAddr;
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
        Some(Command::Testbed(cmd)) => testbed(&cmd),
        Some(Command::Key(KeyCommand::New { file })) => new_key(&file),
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

fn serve(args: &ServeArgs) -> Result<()> {
    let control = match ControlAddr::parse(&args.bind) {
        Some(a @ ControlAddr::Unix(_)) => a,
        _ => {
            let ip: IpAddr = args
                .bind
                .trim_matches(|c| c == '[' || c == ']')
                .parse()
                .with_context(|| {
                    format!(
                        "--bind {:?} is neither an IP address nor unix:PATH",
                        args.bind
                    )
                })?;
            ControlAddr::Tcp(SocketAddr::new(ip, args.port))
        }
    };
    if let ControlAddr::Tcp(a) = &control {
        if !a.ip().is_loopback() && args.key.is_none() {
            return Err(anyhow!(
                "refusing to listen on {} without --key: other hosts could drive this agent; make a key with `netgap key new FILE` and pass --key FILE on both ends",
                a.ip()
            ));
        }
    }
    let limits = netgap::limits::AgentLimits {
        max_flows: args.max_flows,
        max_duration: netgap::units::parse_duration(&args.max_duration)
            .map_err(|e| anyhow!("--max-duration: {e}"))?,
        max_rate_gbps: args.max_rate,
        max_message_bytes: netgap::units::parse_size_bytes(&args.max_message)
            .map_err(|e| anyhow!("--max-message: {e}"))?,
    };
    limits.validate().map_err(|e| anyhow!(e))?;
    let key = args
        .key
        .as_deref()
        .map(netgap::auth::load_key)
        .transpose()?;
    let mut agent = Agent::bind_control(&control)?.with_limits(limits);
    if let Some(ip) = &args.data_bind {
        let ip: IpAddr = ip
            .parse()
            .with_context(|| format!("--data-bind {ip:?} is not an IP address"))?;
        agent = agent.with_data_ip(ip);
    }
    let keyed = key.is_some();
    if let Some(key) = key {
        agent = agent.with_key(key);
    }
    let shown = match &control {
        ControlAddr::Tcp(_) => agent
            .local_addr()
            .context("reading the listening address")?
            .to_string(),
        ControlAddr::Unix(_) => control.to_string(),
    };
    println!(
        "netgap agent {} listening on {shown}{}",
        netgap::VERSION,
        if keyed { " (key required)" } else { "" }
    );
    agent.serve().context("serving")?;
    Ok(())
}

fn new_key(file: &std::path::Path) -> Result<()> {
    netgap::auth::new_key_file(file)?;
    println!("wrote a new key to {}", file.display());
    Ok(())
}

fn testbed(cmd: &TestbedCommand) -> Result<()> {
    match cmd {
        TestbedCommand::Up(args) => netgap::testbed::up(args)?,
        TestbedCommand::Status(args) => netgap::testbed::status(args)?,
        TestbedCommand::Down(args) => netgap::testbed::down(args)?,
    }
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
