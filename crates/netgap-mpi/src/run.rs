//! Measuring an [`MpiPlan`]: one mpirun job per condition, its points
//! through the one point loop (`point_loop::run_points`), each turned into
//! a `ResultRecord` with netgap's method (trimmed mean, confidence
//! interval, percentiles) and a stack that names the MPI library, its
//! transport and the interface it was pinned to.

use crate::kind::MpiTest;
use crate::launch::{interface_of, Launch, LaunchError, LocalBtl, Placement, RankHost, Selection};
use crate::library::{LibraryError, LibraryJob};
use crate::plan::MpiPlan;
use crate::wire::RankLine;
use netgap_core::cpu::CpuUsage;
use netgap_core::diagnose::diagnose;
use netgap_core::host::HostFacts;
use netgap_core::record::{
    rfc3339, ByteCounts, CpuPair, RecordHead, RecordStats, ResultRecord, ServiceDemand,
};
use netgap_core::spec::PointSpec;
use netgap_core::stack::{PathIdentity, Stack};
use netgap_core::stats::{LatencyHistogram, Summary};
use netgap_measure::conditions::{ConditionGuard, ConditionSwitch, LinkConditions};
use netgap_measure::point_loop::{run_points, Observer, SinkError};
use netgap_measure::runner::IterationPolicy;
use netgap_measure::sink::RecordSink;
use std::net::{IpAddr, Ipv4Addr};
use std::time::{Duration, SystemTime};

/// How long mpirun may take to start both ranks on a cluster's nodes,
/// which it reaches through the cluster's launcher (srun, ssh).
const NODES_START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long mpirun may take to start both ranks on this machine or on two
/// testbed hosts, where it takes well under a second.
const LOCAL_START_TIMEOUT: Duration = Duration::from_secs(20);
/// How many times a job whose ranks never said hello is launched: Open
/// MPI's start-up now and then stalls for good (seen once in tens of jobs
/// across testbed hosts), and a second mpirun starts; no point was measured
/// by the first, and the records say it was stopped.
const START_ATTEMPTS: u32 = 2;
/// How long mpirun may take to exit after the last point.
const FINISH_TIMEOUT: Duration = Duration::from_secs(20);

/// Why an MPI run failed.
#[derive(Debug, thiserror::Error)]
pub enum MpiRunError {
    /// The job could not start, or failed before a point.
    #[error("MPI job: {0}")]
    Launch(#[from] LaunchError),
    /// A point failed; the points before it are in the results.
    #[error("{test} ({size} bytes): {source}")]
    Point {
        /// The MPI test.
        test: &'static str,
        /// Message size in bytes.
        size: u64,
        /// What went wrong.
        source: Box<MpiRunError>,
    },
    /// Rank 0 reported out of order.
    #[error("rank 0 reported {0}")]
    Order(String),
    /// The repetitions could not be summarized.
    #[error(transparent)]
    Stats(#[from] netgap_core::stats::StatsError),
    /// A results file could not be written.
    #[error(transparent)]
    Sink(#[from] SinkError),
    /// The testbed's conditions could not be switched or restored.
    #[error("conditions: {0}")]
    Conditions(String),
    /// The hosts' facts or interfaces could not be read.
    #[error("{0}")]
    Hosts(String),
    /// The ranks could not run under the preload library, or it moved
    /// none of their connections.
    #[error(transparent)]
    Library(#[from] LibraryError),
}

/// What the ranks said about themselves.
struct Hello {
    library: String,
    mpi_version: String,
    /// The hosts rank 0 and rank 1 ran on (`MPI_Get_processor_name`).
    processors: Vec<String>,
}

/// What one job reported about itself, for each of its records.
struct JobReport {
    hello: Hello,
    /// What Open MPI said it selected.
    selection: Selection,
    /// Warnings every record of the job carries.
    warnings: Vec<String>,
    /// Under the preload library: its stack and whether it relayed.
    library: Option<LibraryReport>,
}

/// The preload library the ranks ran under, which moved their
/// connections.
struct LibraryReport {
    stack: String,
    relayed: bool,
    /// Either rank's sides that went direct.
    direct: u64,
}

/// How long to wait, after rank 0's first line, for Open MPI's reports of
/// its selection on standard error.
const SELECTION_WAIT: Duration = Duration::from_secs(5);
/// Ranks in every job, all on this machine (the testbed's hosts share
/// its cores).
const RANKS: usize = 2;

/// Measures every point of `plan`, under each of its conditions in turn
/// (switched through `switch`), writing each record to every sink the
/// moment it is measured. Returns how many records were written.
pub fn run_mpi(
    plan: &MpiPlan,
    switch: Option<&mut dyn ConditionSwitch>,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<usize, MpiRunError> {
    let base = plan.settings.testbed.as_ref().and_then(|t| t.conditions);
    let targets: Vec<Option<LinkConditions>> = match base {
        Some(b) if !plan.settings.conditions.is_empty() => plan
            .settings
            .conditions
            .iter()
            .map(|c| Some(c.apply_to(&b)))
            .collect(),
        _ => vec![None],
    };
    if targets.iter().any(Option::is_some) && switch.is_none() {
        return Err(MpiRunError::Conditions(
            "this run has conditions but nothing to switch them with".into(),
        ));
    }
    let mut guard = match (base, switch, targets.iter().any(Option::is_some)) {
        (Some(b), Some(s), true) => Some(ConditionGuard::new(s, b)),
        _ => None,
    };
    let mut written = 0;
    let mut outcome = Ok(());
    for target in &targets {
        if let (Some(to), Some(g)) = (target, guard.as_mut()) {
            if let Err(e) = g.switch_to(to) {
                outcome = Err(MpiRunError::Conditions(format!("switching to {to}: {e}")));
                break;
            }
        }
        match one_job(plan, *target, sinks, observer) {
            Ok(n) => written += n,
            Err(e) => {
                outcome = Err(e);
                break;
            }
        }
    }
    // The testbed goes back exactly as it was, also after a failure.
    if let Some(g) = guard {
        let restored = g
            .restore()
            .map_err(|e| MpiRunError::Conditions(format!("putting the links back: {e}")));
        outcome = outcome.and(restored);
    }
    outcome.map(|()| written)
}

/// One mpirun job over every point, under the conditions in force.
fn one_job(
    plan: &MpiPlan,
    conditions: Option<LinkConditions>,
    sinks: &mut [Box<dyn RecordSink>],
    observer: &mut dyn Observer,
) -> Result<usize, MpiRunError> {
    let (placement, facts) = placement_of(plan)?;
    let rank_plan = plan.rank_plan();
    // The library's relays listen before the ranks connect, and stop after
    // the job (dropped after it).
    let library = plan
        .library
        .as_ref()
        .map(|l| LibraryJob::prepare(l, plan.hosts.as_ref()))
        .transpose()?;
    let exports = library.as_ref().map_or(&[][..], LibraryJob::exports);
    let (mut job, hello, stalled) = start_job(&rank_plan, &placement, exports)?;
    let selection = job.selection(SELECTION_WAIT);
    let mut warnings = Vec::new();
    // The ranks connected before rank 0's hello (rank 1 sent its name).
    let library = match &library {
        Some(l) => {
            let c = l.connections()?;
            warnings.extend(c.warning);
            Some(LibraryReport {
                stack: l.library().stack.clone(),
                relayed: l.library().relayed,
                direct: c.direct,
            })
        }
        None => None,
    };
    if let Some(why) = stalled {
        warnings.push(format!(
            "the first mpirun of this job never started the ranks ({why}); a second one ran the points"
        ));
    }
    if selection.ranks_reported() == 0 {
        warnings.push(
            "the MPI library did not report the BTL it used (Open MPI's btl_base_verbose), so the record's stack names none"
                .to_string(),
        );
    }
    let yields = std::env::var("OMPI_MCA_mpi_yield_when_idle").ok();
    // On a cluster's nodes each rank has a machine of its own.
    if plan.nodes.is_none() {
        warnings.extend(spin_warning(RANKS, cores_available(), yields.as_deref()));
    }
    let report = JobReport {
        hello,
        selection,
        warnings,
        library,
    };
    let line_timeout = line_timeout(plan);
    let indexed: Vec<(usize, &(MpiTest, PointSpec))> = plan.points.iter().enumerate().collect();
    let written = run_points(
        &indexed,
        |p| &p.1 .1,
        sinks,
        observer,
        |&(index, (test, spec)), obs| -> Result<Vec<ResultRecord>, MpiRunError> {
            let started = SystemTime::now();
            let mut point = || -> Result<ResultRecord, MpiRunError> {
                let (reps, warmup, hist) = read_point(&mut job, plan, index, line_timeout, obs)?;
                build_record(
                    plan, *test, spec, &reps, warmup, &hist, &report, &placement, &facts,
                    conditions, started,
                )
            };
            point().map(|r| vec![r]).map_err(|e| match e {
                e @ MpiRunError::Sink(_) => e,
                e => MpiRunError::Point {
                    test: test.name(),
                    size: spec.size_bytes,
                    source: Box::new(e),
                },
            })
        },
    )?;
    job.finish(FINISH_TIMEOUT)?;
    Ok(written)
}

/// Launches the job and waits for rank 0's hello, launching it again
/// (up to [`START_ATTEMPTS`] in all) when the ranks never get that far;
/// the job, its hello, and why an earlier launch was stopped.
fn start_job(
    rank_plan: &crate::wire::RankPlan,
    placement: &Placement,
    exports: &[(String, std::ffi::OsString)],
) -> Result<(Launch, Hello, Option<String>), MpiRunError> {
    let timeout = match placement {
        Placement::Nodes { .. } => NODES_START_TIMEOUT,
        Placement::Local(_) | Placement::Testbed { .. } => LOCAL_START_TIMEOUT,
    };
    let mut stalled = None;
    let mut attempt = 1;
    loop {
        let mut job = Launch::start(rank_plan, placement, exports)?;
        match job.next(timeout) {
            Ok(RankLine::Hello {
                library,
                mpi_version,
                processors,
            }) => {
                let hello = Hello {
                    library,
                    mpi_version,
                    processors,
                };
                return Ok((job, hello, stalled));
            }
            Ok(other) => return Err(MpiRunError::Order(format!("{other:?} before hello"))),
            Err(e @ LaunchError::Silent { .. }) if attempt < START_ATTEMPTS => {
                stalled = Some(e.to_string());
                attempt += 1;
            }
            Err(e) => return Err(e.into()),
        }
    }
}

/// The longest silence of rank 0 between two lines: a generous bound on
/// one repetition, with its warm-up and calibration.
fn line_timeout(plan: &MpiPlan) -> Duration {
    match plan.settings.method.iterations {
        IterationPolicy::Budget(d) => Duration::from_secs(30) + d.saturating_mul(20),
        IterationPolicy::Fixed(_) => Duration::from_secs(600),
    }
}

/// One measured repetition: iterations, nanoseconds, and the CPU of rank
/// 0 and rank 1.
type Rep = (u64, u64, CpuUsage, CpuUsage);

/// Reads point `index`'s repetitions and summary, in order.
fn read_point(
    job: &mut Launch,
    plan: &MpiPlan,
    index: usize,
    timeout: Duration,
    observer: &mut dyn Observer,
) -> Result<(Vec<Rep>, u64, LatencyHistogram), MpiRunError> {
    let want = plan.settings.method.reps;
    let mut reps = Vec::with_capacity(want as usize);
    loop {
        match job.next(timeout)? {
            RankLine::Rep {
                point,
                rep,
                iterations,
                elapsed_ns,
                cpu_rank0,
                cpu_rank1,
            } if point as usize == index && rep as usize == reps.len() && rep < want => {
                reps.push((iterations, elapsed_ns, cpu_rank0, cpu_rank1));
                observer.rep_done(rep + 1);
            }
            RankLine::Done {
                point,
                warmup_iterations,
                rtt_buckets,
            } if point as usize == index && reps.len() == want as usize => {
                let mut hist = LatencyHistogram::new();
                for [ns, count] in rtt_buckets {
                    hist.record_n_ns(ns, count);
                }
                return Ok((reps, warmup_iterations, hist));
            }
            other => {
                return Err(MpiRunError::Order(format!(
                    "{other:?} while point {index} had {} of {want} repetitions",
                    reps.len()
                )))
            }
        }
    }
}

/// The facts of both ranks' hosts, for the records.
struct Facts {
    rank0: HostFacts,
    rank1: HostFacts,
}

/// Where the ranks run, with their hosts' facts read now (after any
/// switch of conditions, so offloads and MTU are those in force).
fn placement_of(plan: &MpiPlan) -> Result<(Placement, Facts), MpiRunError> {
    if let Some((n0, n1)) = &plan.nodes {
        // This machine's facts where it is rank 0's node (a batch script
        // runs on the allocation's first node); of another node only its
        // name, which the ranks report too.
        let here = netgap_transport::host::collect(Some(n0.control.ip()));
        let short = |n: &str| n.split('.').next().unwrap_or(n).to_string();
        let named = |name: &str| HostFacts {
            hostname: name.to_string(),
            cores: 1,
            ..HostFacts::default()
        };
        let rank0 = if short(&here.hostname) == short(&n0.name) {
            here
        } else {
            named(&n0.name)
        };
        return Ok((
            Placement::Nodes {
                rank0: n0.name.clone(),
                rank1: n1.name.clone(),
            },
            Facts {
                rank0,
                rank1: named(&n1.name),
            },
        ));
    }
    let Some((h0, h1)) = &plan.hosts else {
        let local = netgap_transport::host::collect(Some(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        return Ok((
            Placement::Local(plan.local_btl),
            Facts {
                rank0: local.clone(),
                rank1: local,
            },
        ));
    };
    let side =
        |h: &netgap_measure::cluster::HostEntry| -> Result<(RankHost, HostFacts), MpiRunError> {
            let netns = h.netns.clone().ok_or_else(|| {
                MpiRunError::Hosts(format!("host {} has no network namespace", h.name))
            })?;
            let (ns, ip) = (netns.clone(), h.address);
            let facts = std::thread::spawn(move || {
                netgap_transport::netns::enter(&ns)
                    .map(|()| netgap_transport::host::collect(Some(ip)))
            })
            .join()
            .map_err(|_| MpiRunError::Hosts("reading host facts panicked".into()))?
            .map_err(|e| MpiRunError::Hosts(e.to_string()))?;
            Ok((
                RankHost {
                    name: h.name.clone(),
                    netns,
                    address: h.address,
                },
                facts,
            ))
        };
    let (r0, f0) = side(h0)?;
    let (r1, f1) = side(h1)?;
    let if0 = interface_of(&r0.netns, r0.address)
        .map_err(|detail| MpiRunError::Hosts(format!("host {}: {detail}", r0.name)))?;
    let if1 = interface_of(&r1.netns, r1.address)
        .map_err(|detail| MpiRunError::Hosts(format!("host {}: {detail}", r1.name)))?;
    if if0 != if1 {
        return Err(MpiRunError::Hosts(format!(
            "hosts {} and {} reach each other over differently named interfaces ({if0}, {if1}); Open MPI pins one name",
            r0.name, r1.name
        )));
    }
    Ok((
        Placement::Testbed {
            rank0: r0,
            rank1: r1,
            interface: if0,
        },
        Facts {
            rank0: f0,
            rank1: f1,
        },
    ))
}

/// The short name of the library: `Open MPI v4.1.4` of Open MPI's
/// `Open MPI v4.1.4, package: ...`.
fn library_short(library: &str) -> String {
    library
        .split(',')
        .next()
        .unwrap_or_default()
        .trim()
        .to_string()
}

#[allow(
    clippy::too_many_arguments,
    reason = "one call site, every part of a record"
)]
fn build_record(
    plan: &MpiPlan,
    test: MpiTest,
    spec: &PointSpec,
    reps: &[Rep],
    warmup_iterations: u64,
    hist: &LatencyHistogram,
    report: &JobReport,
    placement: &Placement,
    facts: &Facts,
    conditions: Option<LinkConditions>,
    started: SystemTime,
) -> Result<ResultRecord, MpiRunError> {
    let values: Vec<f64> = reps
        .iter()
        .map(|&(n, ns, ..)| test.value(spec.size_bytes, n, ns))
        .collect();
    let summary = Summary::from_reps(&values)?;
    let (tx, rx) = reps
        .iter()
        .map(|&(n, ..)| test.bytes(spec.size_bytes, n))
        .fold((0u64, 0u64), |(a, b), (t, r)| {
            (a.saturating_add(t), b.saturating_add(r))
        });
    let local = CpuUsage::mean(&reps.iter().map(|r| r.2).collect::<Vec<_>>());
    let remote = CpuUsage::mean(&reps.iter().map(|r| r.3).collect::<Vec<_>>());
    // Payload moved either way, as the socket tests count it.
    let moved = tx.saturating_add(rx);
    let cpu = CpuPair { local, remote };
    let service_demand_us_per_kib = match test {
        MpiTest::Latency => None,
        _ => ServiceDemand::of(&cpu, moved),
    };
    let path = ranks_path(plan, placement, facts, conditions, report);
    let stack = ranks_stack(plan, spec, path, report, placement);
    let mut options = plan.settings.record_options(spec);
    options.peer = mpirun_peer(placement);
    let mut record = ResultRecord::new(RecordHead {
        test: spec.test.clone(),
        transport: spec.transport.clone(),
        mode: spec.mode,
        size_bytes: spec.size_bytes,
        metric: test.metric().key().into(),
        value: summary.value,
        time: rfc3339(started),
    });
    record.stats = Some(RecordStats::from(&summary));
    record.percentiles = match test {
        MpiTest::Latency => hist.percentiles_us(0.5),
        _ => None,
    };
    record.cpu = Some(cpu);
    record.service_demand_us_per_kib = service_demand_us_per_kib;
    // A budgeted repetition runs whole chunks until its time is spent, so
    // counts differ a little; every repetition ran at least this many.
    record.iterations_per_rep = reps.iter().map(|r| r.0).min();
    record.warmup_iterations = Some(warmup_iterations);
    record.bytes = Some(ByteCounts {
        client_tx: tx,
        client_rx: rx,
        server_tx: rx,
        server_rx: tx,
    });
    // The hosts the ranks ran on, as MPI names them (on the testbed, each
    // rank's UTS namespace carries its host's name).
    let named = |facts: &HostFacts, rank: usize| {
        let mut f = facts.clone();
        if let Some(name) = report.hello.processors.get(rank).filter(|n| !n.is_empty()) {
            f.hostname.clone_from(name);
        }
        f
    };
    record.host = Some(named(&facts.rank0, 0));
    record.peer_host = Some(named(&facts.rank1, 1));
    record.options = Some(options);
    let mut record = record.with_stack(stack);
    diagnose(&mut record);
    record.warnings.extend(report.warnings.iter().cloned());
    Ok(record)
}

/// The path the ranks' bytes took: between the two ranks' hosts, with the
/// testbed's facts under `conditions`, or shared memory on this machine.
fn ranks_path(
    plan: &MpiPlan,
    placement: &Placement,
    facts: &Facts,
    conditions: Option<LinkConditions>,
    report: &JobReport,
) -> PathIdentity {
    let mut path = PathIdentity::from_ends(Some(&facts.rank0), Some(&facts.rank1));
    if let Some(tb) = &plan.settings.testbed {
        let tb = netgap_measure::cluster::TestbedPath {
            conditions: conditions.or(tb.conditions),
            ..tb.clone()
        };
        tb.fill(&mut path);
    }
    let library_shm = report.library.as_ref().is_some_and(|l| !l.relayed);
    if matches!(placement, Placement::Local(LocalBtl::Vader)) || library_shm {
        // Shared memory: the ranks' bytes never reach an interface.
        path = PathIdentity {
            kind: Some("shared-memory".into()),
            ..PathIdentity::default()
        };
    }
    path
}

/// The stack the ranks ran over: the library and standard, what the
/// library said it selected, and the Open MPI parameters set.
fn ranks_stack(
    plan: &MpiPlan,
    spec: &PointSpec,
    path: PathIdentity,
    report: &JobReport,
    placement: &Placement,
) -> Stack {
    let hello = &report.hello;
    let mut stack = Stack::new(
        "mpi",
        spec.mode,
        &spec.options,
        path,
        plan.settings.label.clone(),
    );
    stack
        .options
        .push(format!("mpi_library={}", library_short(&hello.library)));
    stack
        .options
        .push(format!("mpi_standard={}", hello.mpi_version));
    // What the library said it used, never what it was asked for: the
    // BTLs the ranks reached each other over (ob1's BML reports them, so
    // the PML was ob1) and the interfaces its TCP BTL took.
    let btls = report.selection.btls();
    // The ranks' bytes cross a link in kernel TCP's frames when TCP is the
    // one transport (BTL) they reached each other over.
    if btls.len() == 1 && btls.iter().all(|b| b == "tcp") {
        stack.framing = Some(netgap_core::framing::Framing::Tcp);
    }
    // Under the library the ranks' TCP is the program's API only: its
    // bytes take the library's stack (none on a link over shm, the xdp
    // transport's frames, direct or through the relays: the path the
    // ranks' connections took, as the library logged it).
    if let Some(l) = &report.library {
        stack.options.push(format!("preload={}", l.stack));
        if l.relayed {
            let path = if l.direct > 0 { "direct" } else { "relays" };
            stack.options.push(format!("preload_path={path}"));
        }
        stack.framing = if l.relayed {
            netgap_transport::framing(&l.stack)
        } else {
            None
        };
    }
    if !btls.is_empty() {
        stack.options.push("pml=ob1".into());
        stack.options.push(format!("btl={}", btls.join("+")));
        let interfaces = report.selection.interfaces();
        // Only an interface list netgap gave is what the TCP BTL used: on a
        // cluster's nodes the library reports its exclusions the same way.
        let pinned = !matches!(placement, Placement::Nodes { .. });
        if pinned && btls.iter().any(|b| b == "tcp") && !interfaces.is_empty() {
            stack
                .options
                .push(format!("btl_if={}", interfaces.join("+")));
        }
    }
    stack.options.extend(crate::launch::mca_settings());
    stack.options.sort();
    stack
}

/// Where mpirun started the ranks, as the record's peer.
fn mpirun_peer(placement: &Placement) -> String {
    match placement {
        Placement::Local(_) => "mpirun: localhost (2 ranks)".into(),
        Placement::Testbed { rank0, rank1, .. } => {
            format!("mpirun: {} (rank 0), {} (rank 1)", rank0.name, rank1.name)
        }
        Placement::Nodes { rank0, rank1 } => {
            format!("mpirun: {rank0} (rank 0), {rank1} (rank 1)")
        }
    }
}

/// The cores this process (and so mpirun and the ranks, which inherit its
/// affinity: they run with `--bind-to none`) may run on; at least 1.
fn cores_available() -> usize {
    use nix::sched::{sched_getaffinity, CpuSet};
    match sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .count()
            .max(1),
        Err(_) => std::thread::available_parallelism().map_or(1, usize::from),
    }
}

/// A warning when `ranks` outnumber the `cores` they may run on and Open
/// MPI's ranks spin while idle (they do unless `mpi_yield_when_idle`,
/// here the value of `OMPI_MCA_mpi_yield_when_idle`, says yield): a
/// spinning rank holds the core its peer needs to answer, so latency
/// then measures the scheduler's time slice.
fn spin_warning(ranks: usize, cores: usize, yield_when_idle: Option<&str>) -> Option<String> {
    let yields = yield_when_idle.is_some_and(|v| {
        matches!(
            v.trim().to_ascii_lowercase().as_str(),
            "1" | "true" | "yes" | "enabled"
        )
    });
    (ranks > cores && !yields).then(|| {
        let noun = if cores == 1 { "core" } else { "cores" };
        format!(
            "{ranks} MPI ranks spin on {cores} {noun} available to them: an idle rank busy-polls and holds the core its peer needs, so the results measure the scheduler; set OMPI_MCA_mpi_yield_when_idle=1 so idle ranks yield, or give them {ranks} cores"
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_is_named_by_its_first_part() {
        assert_eq!(
            library_short("Open MPI v4.1.4, package: Debian OpenMPI, ident: 4.1.4"),
            "Open MPI v4.1.4"
        );
        assert_eq!(library_short("MPICH Version: 4.0"), "MPICH Version: 4.0");
    }

    #[test]
    fn ranks_that_outnumber_their_cores_are_warned_about_unless_they_yield() {
        let w = spin_warning(2, 1, None).expect("warned");
        assert!(w.contains("2 MPI ranks spin on 1 core"), "{w}");
        assert!(w.contains("OMPI_MCA_mpi_yield_when_idle=1"), "{w}");
        assert_eq!(spin_warning(2, 1, Some("1")), None);
        assert!(spin_warning(2, 1, Some("0")).is_some());
        assert_eq!(spin_warning(2, 2, None), None);
    }
}
