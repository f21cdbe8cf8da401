//! The `netgap` binary: parse the command line, call the library, print one
//! line on error. The work lives in the `netgap` library crate.

mod cli;

use anyhow::{anyhow, Context, Result};
use clap::Parser;
use cli::{
    Cli, Command, CompareArgs, ImportArgs, KeyCommand, ReportArgs, ServeArgs, TestbedCommand,
};
use netgap::agent::Agent;
use netgap::control::ControlAddr;
use netgap::coordinator::CoordError;
use netgap::logp::LogpPlan;
use netgap::mpi::plan::MpiPlan;
use netgap::output::TableObserver;
use netgap::plan::{Plan, RunRequest, Settings};
use netgap::run::run_plan;
use netgap::sink::{CsvSink, JsonlSink, RecordSink};
use netgap::sweep::{SweepPlan, SweepRequest};
use netgap::testbed_seams::Switch;
use netgap::text::{escape_control, escape_control_lines};
use netgap::workload_run::plan::WorkloadPlan;
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
                escape_control(message.trim_start_matches("error: "))
            );
            return ExitCode::from(2);
        }
    };
    let outcome = match cli.command {
        None => battery(cli.output.json, cli.output.csv, cli.output.label, cli.reps),
        Some(Command::Run(args)) => run(&args.request(), &args.mpi.options(), Results::Flags),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Sweep(args)) => sweep(&args.request(), Results::Flags),
        Some(Command::Logp(args)) => logp(&args.request(), Results::Flags),
        Some(Command::List) => {
            list();
            Ok(())
        }
        Some(Command::Study(args)) => cli::study::run(&args),
        Some(Command::Report(args)) => report(&args),
        Some(Command::Compare(args)) => match compare(&args) {
            Ok(true) => return ExitCode::from(netgap::compare::REGRESSION_EXIT_CODE),
            Ok(false) => Ok(()),
            Err(e) => Err(e),
        },
        Some(Command::Import(args)) => import(&args),
        Some(Command::Testbed(cmd)) => testbed(&cmd),
        Some(Command::Key(KeyCommand::New { file })) => new_key(&file),
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
        Some(Command::WebLoad) => {
            netgap_workload::run_web_load_child().map_err(|e| anyhow::anyhow!(e))
        }
        Some(Command::Wrap(args)) => Err(netgap::wrap::exec(&args.transport, &args.command).into()),
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

fn battery(
    json: Option<PathBuf>,
    csv: Option<PathBuf>,
    label: Option<String>,
    reps: Option<u32>,
) -> Result<()> {
    let json = json.unwrap_or_else(|| {
        let stamp = humantime::format_rfc3339_seconds(std::time::SystemTime::now())
            .to_string()
            .replace([':', '-'], "");
        PathBuf::from(format!("netgap-results-{stamp}.jsonl"))
    });
    let battery = Plan::battery(json.clone(), reps)?;
    for (name, why) in &battery.unavailable {
        eprintln!("netgap: note: skipping {name}: {}", escape_control(why));
    }
    let mut plan = battery.plan;
    plan.settings.csv = csv;
    plan.settings.label = label;
    let mut stacks: Vec<&str> = Vec::new();
    for p in &plan.points {
        if !stacks.contains(&p.transport.as_str()) {
            stacks.push(&p.transport);
        }
    }
    let pinned = match (plan.settings.client_cpu, plan.settings.server_cpu) {
        (Some(c), Some(s)) => format!(", client on CPU {c}, server on CPU {s}"),
        _ => String::new(),
    };
    eprintln!(
        "netgap: main job: {} points ({} over {} on loopback, interleaved{pinned})",
        plan.points.len(),
        netgap::plan::BATTERY_TESTS.join(" and "),
        stacks.join(", ")
    );
    execute(&Job::Points(plan), Results::Flags)?;
    print!("{}", escape_control_lines(&gap_summary(&json)?));
    println!("results: {}", json.display());
    let html = json.with_extension("html");
    netgap::report::write_report(std::slice::from_ref(&json), &html, None)
        .with_context(|| format!("writing the report of {}", json.display()))?;
    println!("report: {}", html.display());
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        println!("next: `netgap study 000 --quick` runs a study's figures on a testbed it builds");
    }
    Ok(())
}

/// Each stack of a results file against tcp, per test and size band, with
/// whether each gap is real (Welch's t-test) or noise: the report's gap
/// tables, as text.
fn gap_summary(json: &std::path::Path) -> Result<String> {
    let records = netgap::report::load::load_file(json)?;
    let report = netgap::report::Report::build(
        &[json.to_path_buf()],
        &records,
        &netgap::report::ReportOptions::default(),
    );
    let mut text = format!("\neach stack against {}:\n", report.baseline);
    for s in &report.sections {
        text.push_str(&netgap::report::gap::render_text(&s.gap));
    }
    Ok(text)
}

fn report(args: &ReportArgs) -> Result<()> {
    let mut options = netgap::report::ReportOptions::default();
    if let Some(b) = &args.baseline {
        options.baseline = netgap::report::stacks::Baseline::Select(
            netgap::report::stacks::StackSelector::parse(b).context("--baseline")?,
        );
    }
    let written = netgap::report::write_report_with(
        &args.results,
        &args.output,
        args.images.as_deref(),
        &options,
    )?;
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
    let select = |text: &Option<String>, flag: &str| -> Result<_> {
        text.as_deref()
            .map(netgap::report::stacks::StackSelector::parse)
            .transpose()
            .with_context(|| flag.to_string())
    };
    let options = netgap::compare::CompareOptions {
        threshold_pct: args.threshold,
        base_stack: select(&args.base_stack, "--base-stack")?,
        new_stack: select(&args.new_stack, "--new-stack")?,
    };
    // Torn records (a crash, a full disk) are skipped with a warning; the
    // intact ones are compared.
    let load = |path: &std::path::Path| -> Result<Vec<netgap::report::load::Loaded>> {
        let f = netgap::report::load::load_file_parts(path)?;
        for t in &f.torn {
            warn(&t);
        }
        Ok(f.records)
    };
    let base = load(&args.base)?;
    let (new, sides) = match &args.new {
        Some(path) => (
            load(path)?,
            format!("{} and {}", args.base.display(), path.display()),
        ),
        None if options.base_stack.is_some() && options.new_stack.is_some() => (
            base.clone(),
            format!("the two stacks of {}", args.base.display()),
        ),
        None => {
            return Err(anyhow!(
                "compare needs a second results file, or --base-stack and --new-stack to compare two stacks of {}",
                args.base.display()
            ))
        }
    };
    let c = netgap::compare::compare(&base, &new, &options)
        .with_context(|| format!("comparing {sides}"))?;
    for w in &c.warnings {
        warn(&w);
    }
    print!(
        "{}",
        netgap::text::escape_control_lines(&netgap::compare::render(&c))
    );
    let regressed = c.regressions().next().is_some();
    Ok(regressed)
}

fn import(args: &ImportArgs) -> Result<()> {
    use std::io::Write;
    let mut records = netgap::import::import_file(&args.format, &args.file, args.size)?;
    if let Some(label) = &args.label {
        netgap::import::label_records(&mut records, label);
    }
    match &args.output {
        Some(out) => {
            // Appended as a run appends: never through a link, each record
            // whole or not at all.
            let mut sink = JsonlSink::open(out)?;
            for r in &records {
                sink.append(r)
                    .with_context(|| format!("writing {}", out.display()))?;
            }
            eprintln!(
                "netgap: imported {} records from {} into {}",
                records.len(),
                args.file.display(),
                out.display()
            );
        }
        None => {
            let mut text = String::new();
            for r in &records {
                text.push_str(&serde_json::to_string(r).context("encoding a record")?);
                text.push('\n');
            }
            std::io::stdout()
                .write_all(text.as_bytes())
                .context("writing to standard output")?
        }
    }
    Ok(())
}

/// Where a measuring command's records go.
#[derive(Clone, Copy)]
enum Results<'a> {
    /// The files its `--json` and `--csv` flags name, opened when it starts.
    Flags,
    /// In place of the file `--json` names, a results file the caller made
    /// and holds open (a study's, in its output directory), written through
    /// a clone of its descriptor and never opened again by path; `--csv`
    /// as its flag says.
    Held {
        /// The file.
        file: &'a std::fs::File,
        /// Its path, for messages.
        path: &'a std::path::Path,
    },
}

/// `netgap run` from its typed request, as its flags map to it or as a
/// study plans it: the one function both measure through.
fn run(
    request: &RunRequest,
    mpi: &netgap::mpi::plan::MpiOptions,
    results: Results<'_>,
) -> Result<()> {
    let (mpi_tests, rest) = netgap::mpi::plan::split_tests(&request.tests);
    if !mpi_tests.is_empty() {
        return run_with_mpi(request, &mpi_tests, mpi, rest, results);
    }
    if mpi.btl.is_some() {
        return Err(anyhow!(
            "--mpi-btl has no effect without an MPI test (mpi-latency, mpi-bw, mpi-bibw)"
        ));
    }
    if netgap::workload_run::plan::is_workload_run(&request.tests)? {
        return execute(
            &Job::Workload(WorkloadPlan::from_request(request)?),
            results,
        );
    }
    execute(&Job::Points(Plan::from_request(request)?), results)
}

/// A run with MPI tests: the socket tests first (when there are any), then
/// the MPI tests on the same path, into the same results files.
fn run_with_mpi(
    request: &RunRequest,
    mpi_tests: &[netgap::mpi::MpiTest],
    mpi: &netgap::mpi::plan::MpiOptions,
    rest: Vec<String>,
    results: Results<'_>,
) -> Result<()> {
    let mpi_plan = MpiPlan::from_request(
        request,
        mpi_tests,
        mpi,
        netgap::mpi::launch::environment(),
        rest.is_empty(),
    )?;
    netgap::mpi::availability().map_err(|why| anyhow!("the MPI tests cannot run here: {why}"))?;
    if !rest.is_empty() {
        let sockets = RunRequest {
            tests: rest,
            ..request.clone()
        };
        if netgap::workload_run::plan::is_workload_run(&sockets.tests)? {
            return Err(anyhow!(
                "MPI tests run beside point-to-point tests (pingpong, stream, bibw, ...), not beside workloads; run those apart"
            ));
        }
        execute(&Job::Points(Plan::from_request(&sockets)?), results)?;
    }
    execute(&Job::Mpi(mpi_plan), results)
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

/// What one measuring command runs, validated.
enum Job {
    /// Point-to-point tests (`netgap run`, the main job).
    Points(Plan),
    /// Workloads.
    Workload(WorkloadPlan),
    /// MPI tests.
    Mpi(MpiPlan),
    /// `netgap sweep`, with its own table on stdout.
    Sweep(SweepPlan),
    /// `netgap logp`, with its own table on stdout.
    Logp(LogpPlan),
}

impl Job {
    /// What the job's points share: outputs, repetitions, conditions.
    fn settings(&self) -> &Settings {
        match self {
            Job::Points(p) => &p.settings,
            Job::Workload(p) => &p.settings,
            Job::Mpi(p) => &p.settings,
            Job::Sweep(p) => &p.run.settings,
            Job::Logp(p) => &p.run.settings,
        }
    }

    /// The sizes a transport of the job cannot carry, left out of its
    /// points.
    fn skipped(&self) -> &[netgap::plan::SkippedSizes] {
        match self {
            Job::Points(p) => &p.skipped,
            Job::Sweep(p) => &p.run.skipped,
            Job::Logp(p) => &p.run.skipped,
            Job::Workload(_) | Job::Mpi(_) => &[],
        }
    }

    /// Measures the job into the sinks; the table observes the kinds of
    /// run that share it (sweep and logp print their own).
    fn measure(
        &self,
        switch: Option<&mut dyn netgap::conditions::ConditionSwitch>,
        sinks: &mut [Box<dyn RecordSink>],
        table: &mut TableObserver,
    ) -> Result<(), Failed> {
        let coord = |e: CoordError| match e {
            e @ CoordError::Point { .. } => Failed::AtPoint(e.into()),
            e => Failed::Before(e.into()),
        };
        match self {
            Job::Points(plan) => run_plan(plan, switch, sinks, table)
                .map(|_| ())
                .map_err(coord),
            Job::Workload(plan) => {
                use netgap::workload_run::{run_workload_plan, run_workload_plan_under};
                match switch {
                    Some(s) => run_workload_plan_under(plan, s, sinks, table),
                    None => run_workload_plan(plan, sinks, table),
                }
                .map(|_| ())
                .map_err(|e| Failed::AtPoint(e.into()))
            }
            Job::Mpi(plan) => netgap::mpi::run::run_mpi(plan, switch, sinks, table)
                .map(|_| ())
                .map_err(|e| Failed::AtPoint(e.into())),
            Job::Sweep(plan) => {
                netgap::sweep::run_sweep(plan, switch, sinks, &mut std::io::stdout())
                    .map(|_| ())
                    .map_err(coord)
            }
            Job::Logp(plan) => netgap::logp::run_logp(plan, sinks, &mut std::io::stdout())
                .map(|_| ())
                .map_err(coord),
        }
    }
}

/// The one way every run of points (point-to-point, multi-host, MPI,
/// sweep, logp) is measured: the switch of its testbed opened when it has
/// conditions, its results files opened, the job measured into them, then
/// the table closed, its warnings said, and a failure at a point naming
/// the file that keeps the points before it.
fn execute(job: &Job, results: Results<'_>) -> Result<()> {
    let settings = job.settings();
    for s in job.skipped() {
        eprintln!("netgap: note: {s}");
    }
    let mut switch = match settings.testbed_name.as_deref() {
        Some(name) if !settings.conditions.is_empty() => Some(
            netgap::testbed::TestbedSwitch::open(name)
                .map(Switch)
                .with_context(|| format!("--conditions on testbed {name}"))?,
        ),
        _ => None,
    };
    let mut sinks = open_sinks(settings.json.as_deref(), settings.csv.as_deref(), results)?;
    let mut table = TableObserver::new(settings.method.reps);
    let outcome = job.measure(
        switch
            .as_mut()
            .map(|s| s as &mut dyn netgap::conditions::ConditionSwitch),
        &mut sinks,
        &mut table,
    );
    table.finish();
    for w in table.warnings() {
        warn(&w);
    }
    match outcome {
        Ok(()) => Ok(()),
        Err(Failed::Before(e)) => Err(e),
        Err(Failed::AtPoint(e)) => Err(with_kept_points(e, &sinks)),
    }
}

/// How a run failed: before any point (nothing was measured), or at a
/// point (the points before it are in the results).
enum Failed {
    Before(anyhow::Error),
    AtPoint(anyhow::Error),
}

/// `netgap sweep` from its typed request.
fn sweep(request: &SweepRequest, results: Results<'_>) -> Result<()> {
    execute(&Job::Sweep(SweepPlan::from_request(request)?), results)
}

/// `netgap logp` from its typed request.
fn logp(request: &RunRequest, results: Results<'_>) -> Result<()> {
    let plan = LogpPlan::from_request(request)?;
    if plan.run.settings.client_cpu.is_none() {
        eprintln!(
            "netgap: note: without --pin the woken server may run on the client's CPU, and its work then lands in o_s; pin them apart, e.g. --pin 0,1"
        );
    }
    execute(&Job::Logp(plan), results)
}

/// The results files of a run: JSON Lines and CSV, each where asked, or
/// the held file in place of the JSON Lines file.
fn open_sinks(
    json: Option<&std::path::Path>,
    csv: Option<&std::path::Path>,
    results: Results<'_>,
) -> Result<Vec<Box<dyn RecordSink>>> {
    let mut sinks: Vec<Box<dyn RecordSink>> = Vec::new();
    match (results, json) {
        (Results::Held { file, path }, _) => {
            let clone = file
                .try_clone()
                .with_context(|| format!("opening {}", path.display()))?;
            sinks.push(Box::new(JsonlSink::on_file(clone, path)?));
        }
        (Results::Flags, Some(p)) => sinks.push(Box::new(JsonlSink::open(p)?)),
        (Results::Flags, None) => {}
    }
    if let Some(p) = csv {
        sinks.push(Box::new(CsvSink::open(p)?));
    }
    Ok(sinks)
}

/// `e`, naming the first results file, which keeps the points measured
/// before it.
fn with_kept_points(e: anyhow::Error, sinks: &[Box<dyn RecordSink>]) -> anyhow::Error {
    match sinks.first() {
        Some(s) => anyhow!("{e}; points measured before are in {}", s.path().display()),
        None => e,
    }
}

fn serve(args: &ServeArgs) -> Result<()> {
    let control = match ControlAddr::parse(&args.bind) {
        Some(a @ ControlAddr::Unix(_)) => a,
        _ if args.bind == "auto" => {
            let a = netgap::hostlist::node_address().map_err(|e| anyhow!("--bind auto: {e}"))?;
            println!("--bind auto: {} ({})", a.ip, a.how);
            ControlAddr::Tcp(SocketAddr::new(a.ip, args.port))
        }
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
        max_duration: args.max_duration,
        max_rate_gbps: args.max_rate,
        max_message_bytes: args.max_message,
        max_memory_bytes: args.max_memory,
    };
    limits.validate().map_err(|e| anyhow!(e))?;
    let key = args
        .key
        .as_deref()
        .map(netgap::auth::load_key)
        .transpose()?;
    let relay = match (&args.relay_interface, &key) {
        (None, _) => None,
        (Some(_), None) => {
            return Err(anyhow!(
            "--relay-interface needs --key: the relays' shared key is derived from the agents' key"
        ))
        }
        (Some(name), Some(key)) => Some(
            netgap::workload::preload::RelaySetup::new(name, key)
                .map_err(|e| anyhow!("--relay-interface: {e}"))?,
        ),
    };
    // The directories the agent writes in are checked (and what killed
    // agents left in them removed) before anything is written or bound.
    let run_base = match &args.run_dir {
        Some(d) if d.is_relative() => std::env::current_dir()
            .context("reading the current directory for --run-dir")?
            .join(d),
        Some(d) => d.clone(),
        None => netgap::confined::default_run_base(),
    };
    let mut dirs = netgap::confined::AgentDirs::new(run_base);
    dirs.open_base()?;
    if let Some(io) = &args.io_dir {
        dirs = dirs.with_io_dir(io).map_err(|e| anyhow!("--io-dir: {e}"))?;
    }
    let mut agent = Agent::bind_control(&control)?
        .with_limits(limits)
        .with_dirs(dirs);
    if args.allow_services {
        agent = agent.allow_services();
    }
    if let Some(n) = args.flows_per_process {
        agent = agent.with_flows_per_process(n);
    }
    if let Some(ip) = &args.data_bind {
        let ip: IpAddr = ip
            .parse()
            .with_context(|| format!("--data-bind {ip:?} is not an IP address"))?;
        if !ip.is_loopback() && args.key.is_none() {
            return Err(anyhow!(
                "refusing data listeners on {ip} without --key: other hosts could connect to them; make a key with `netgap key new FILE` and pass --key FILE on both ends"
            ));
        }
        agent = agent.with_data_ip(ip);
    }
    if let Some(relay) = relay {
        agent = agent.with_relay(relay);
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
        TestbedCommand::Up(args) => cli::testbed::up(args),
        TestbedCommand::Set(args) => cli::testbed::set(args),
        TestbedCommand::Status(args) => cli::testbed::status(args),
        TestbedCommand::Down(args) => cli::testbed::down(args),
    }
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
    println!("workloads (--hosts, --clients, -P, --duration):");
    for t in netgap::workload::registry() {
        println!(
            "  {:<14} {:<17} {}",
            t.name(),
            t.metric().key(),
            t.summary()
        );
    }
    println!();
    println!("MPI tests (mpirun, two ranks; records name test pingpong, stream, bibw over transport mpi):");
    for t in netgap::mpi::MpiTest::ALL {
        println!(
            "  {:<14} {:<15} {}",
            t.name(),
            t.metric().key(),
            t.summary()
        );
    }
    match netgap::mpi::availability() {
        Ok(()) => println!("  MPI: built in, mpirun found"),
        Err(why) => println!("  MPI: not available: {why}"),
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
    println!();
    println!("transport options:");
    for o in transport::options::all() {
        let flag = format!("{} {}", o.long(), o.value_name);
        println!(
            "  {:<20} {:<22} {}",
            flag.trim_end(),
            transport::options::transports_taking(o).join(","),
            o.help
        );
    }
    for line in unavailable {
        println!("  not available here: {line}");
    }
    println!();
    println!("peer tools' output (netgap import FORMAT FILE):");
    for i in netgap::import::registry() {
        println!("  {:<8} {}", i.name(), i.summary());
    }
}
