//! The one path every measuring command takes (`run`, `sweep`, `logp`,
//! the main job and a study's runs): its typed request validated into a
//! plan, the plan measured into its results files, a failure at a point
//! naming the file that keeps the points before it.

use crate::warn;
use anyhow::{anyhow, Context, Result};
use netgap::coordinator::CoordError;
use netgap::logp::LogpPlan;
use netgap::mpi::plan::MpiPlan;
use netgap::output::TableObserver;
use netgap::plan::{Plan, RunRequest, Settings};
use netgap::run::run_plan;
use netgap::sink::{CsvSink, JsonlSink, RecordSink};
use netgap::sweep::{SweepPlan, SweepRequest};
use netgap::testbed_seams::Switch;
use netgap::workload_run::plan::WorkloadPlan;

/// Where a measuring command's records go.
#[derive(Clone, Copy)]
pub(crate) enum Results<'a> {
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
pub(crate) fn run(
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

/// What one measuring command runs, validated.
pub(crate) enum Job {
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
pub(crate) fn execute(job: &Job, results: Results<'_>) -> Result<()> {
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
pub(crate) fn sweep(request: &SweepRequest, results: Results<'_>) -> Result<()> {
    execute(&Job::Sweep(SweepPlan::from_request(request)?), results)
}

/// `netgap logp` from its typed request.
pub(crate) fn logp(request: &RunRequest, results: Results<'_>) -> Result<()> {
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
