//! `netgap study`: the studies netgap reproduces, each a data file
//! (`studies/NNN.toml`, built into the binary) read into
//! [`netgap_core::study::Study`]; checked here against the registries of
//! tests, transports and the commands' flags; and turned, for given hosts
//! and a time budget, into typed runs of `netgap run`, `sweep` and `logp`
//! ([`Invocation`]), one per figure and variant. The binary measures each
//! run's typed request through the same function as the command itself,
//! and `--plan` prints each as the command line that measures it by hand.

mod invocation;

use crate::cluster::{HostsArg, HostsSource};
use crate::conditions::ConditionAxis;
use crate::report::study::Outcome;
use crate::spec::Mode;
use netgap_core::sizing::{sweep_sizes, Growth};
use netgap_core::study::{Figure, FigureCommand, Study, StudyError};
use netgap_core::units::parse_size_list;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

pub use invocation::{
    parse_flags, shell_word, Command, FlagError, Flags, Invocation, Request, RunFlag, StackFlag,
    SweepFlag,
};
pub use netgap_core::study as data;

/// The study files, by id.
const FILES: [(&str, &str); 5] = [
    ("000", include_str!("../studies/000.toml")),
    ("001", include_str!("../studies/001.toml")),
    ("002", include_str!("../studies/002.toml")),
    ("003", include_str!("../studies/003.toml")),
    ("004", include_str!("../studies/004.toml")),
];

/// Repetitions below which a point has nothing left after the highest and
/// lowest are dropped.
pub const MIN_REPS: u32 = 3;

/// The shortest repetition of a point-to-point test or a sweep trial.
const MIN_REP_MS: u64 = 2;
/// The shortest window of a workload repetition: longer than TCP's 200 ms
/// minimum retransmission timeout, so a flow that lost a segment at the
/// bridge still moves bytes in it.
const MIN_WINDOW_MS: u64 = 300;
/// The longest repetition the budget is spread into (the study's 100,000
/// iterations take well under this on a fast path).
const MAX_REP_MS: u64 = 2_000;
/// What a repetition costs beyond its own time: a point-to-point
/// repetition's flow, a workload's prepare/ready/go with every agent, a
/// condition's switch of the testbed's links and fresh sessions.
const P2P_OVERHEAD_MS: u64 = 2;
const WORKLOAD_OVERHEAD_MS: u64 = 700;
/// What a workload repetition over a datagram transport adds: the flow
/// engine's server serves on until its flows have been quiet for the
/// longest a datagram flow waits before it sends again (a second) and
/// 200 ms more, so a late re-send never meets a closed port.
const DATAGRAM_QUIET_MS: u64 = 1_200;
const CONDITION_OVERHEAD_MS: u64 = 60;

/// Why `netgap study` refuses to start; one line.
#[derive(Debug, thiserror::Error)]
pub enum StudyCmdError {
    /// A study file is wrong (a bug in netgap's own files).
    #[error(transparent)]
    File(#[from] StudyError),
    /// An id that is no study.
    #[error("no study {0:?}; the studies are {ids}, or all", ids = ids().join(", "))]
    UnknownStudy(String),
    /// A figure no chosen study has.
    #[error("study {study} has no figure {figure}; its figures are {known}")]
    UnknownFigure {
        /// The study.
        study: String,
        /// The figure asked for.
        figure: String,
        /// Its figures.
        known: String,
    },
    /// A figure names a test or transport netgap does not have.
    #[error("study {study} figure {figure}: {what}")]
    UnknownName {
        /// The study.
        study: String,
        /// The figure.
        figure: String,
        /// What is unknown.
        what: String,
    },
    /// A figure's flags are not ones its command takes (a bug in
    /// netgap's own files).
    #[error("study {study} figure {figure}: {source}")]
    Flags {
        /// The study.
        study: String,
        /// The figure.
        figure: String,
        /// What is wrong with them.
        source: FlagError,
    },
    /// The budget cannot hold one repetition of every point.
    #[error("--budget {given}: too small for {MIN_REPS} repetitions of every point of {what}; give at least {need}")]
    Budget {
        /// The budget given.
        given: String,
        /// Which study (or all).
        what: String,
        /// The least that fits.
        need: String,
    },
    /// No figure can be made on these hosts.
    #[error("these hosts can make no figure of study {study}: {why}")]
    NoFigure {
        /// The study.
        study: String,
        /// Why not, figure by figure (the first reason).
        why: String,
    },
}

/// The ids of the studies.
pub fn ids() -> Vec<&'static str> {
    FILES.iter().map(|(id, _)| *id).collect()
}

/// Study `id`, parsed and checked.
pub fn load(id: &str) -> Result<Study, StudyCmdError> {
    let (_, text) = FILES
        .iter()
        .find(|(i, _)| *i == id)
        .ok_or_else(|| StudyCmdError::UnknownStudy(id.to_string()))?;
    let study = Study::parse(&format!("studies/{id}.toml"), text)?;
    check_names(&study)?;
    check_flags(&study)?;
    Ok(study)
}

/// Every study, in order.
pub fn all() -> Result<Vec<Study>, StudyCmdError> {
    ids().into_iter().map(load).collect()
}

/// Every figure's tests and transports are netgap's.
pub fn check_names(study: &Study) -> Result<(), StudyCmdError> {
    for f in &study.figures {
        let bad = |what: String| StudyCmdError::UnknownName {
            study: study.id.clone(),
            figure: f.id.clone(),
            what,
        };
        match f.command {
            FigureCommand::Run => {
                for t in &f.tests {
                    let known = crate::bench::find(t).is_some()
                        || crate::workload::find(t).is_some()
                        || crate::mpi::MpiTest::by_name(t).is_some();
                    if !known {
                        return Err(bad(format!("no test {t:?} (see netgap list)")));
                    }
                }
            }
            FigureCommand::Sweep | FigureCommand::Logp => {
                if !f.tests.is_empty() {
                    return Err(bad(format!("{} takes no tests", f.command.name())));
                }
            }
        }
        for t in &f.transports {
            if crate::transport::find(t).is_none() {
                return Err(bad(format!("no transport {t:?}")));
            }
        }
    }
    Ok(())
}

/// Every figure's flags are its command's, with and without `--quick`,
/// in each of its variants: a study whose runs could not be given to
/// their commands is refused when it is read, before anything runs.
pub fn check_flags(study: &Study) -> Result<(), StudyCmdError> {
    for f in &study.figures {
        for quick in [false, true] {
            for variant in variants_of(f) {
                parse_figure(f, quick, &variant).map_err(|source| StudyCmdError::Flags {
                    study: study.id.clone(),
                    figure: f.id.clone(),
                    source,
                })?;
            }
        }
    }
    Ok(())
}

/// What the hosts of a run offer.
#[derive(Debug, Clone, PartialEq)]
pub struct HostsOffer {
    /// Hosts.
    pub hosts: u32,
    /// Links between the first two hosts.
    pub links: u32,
    /// They are testbed hosts this process may switch the links of (root
    /// and a testbed's hosts file).
    pub conditions: bool,
}

impl HostsOffer {
    /// What a study's own testbed offers.
    pub fn testbed(study: &Study) -> HostsOffer {
        HostsOffer {
            hosts: study.testbed.hosts,
            links: study.testbed.links,
            conditions: true,
        }
    }

    /// What `--hosts` offers.
    pub fn of(arg: &HostsArg, root: bool) -> Result<HostsOffer, crate::cluster::HostsError> {
        Ok(match arg.load()? {
            HostsSource::File(f) => {
                let links = match (f.hosts.first(), f.hosts.get(1)) {
                    (Some(a), Some(b)) => (a.links_to(&b.name).count() as u32).max(1),
                    _ => 1,
                };
                HostsOffer {
                    hosts: f.hosts.len() as u32,
                    links,
                    conditions: root && f.is_testbed(),
                }
            }
            other => HostsOffer {
                hosts: other.hosts(),
                links: 1,
                conditions: false,
            },
        })
    }
}

/// The shaped link directions a point of `fig` keeps busy at once at
/// most, on `study`'s testbed, as the physics check counts a record's
/// links: its most links (`links` axis), or for a workload with servers
/// and clients the links between them (on a switch each host's one link,
/// so the fewer of servers and clients; on a mesh a link per pair), else
/// one; both ways for a bidirectional test.
pub fn shapers_at_once(study: &Study, fig: &Figure) -> u32 {
    let most = |flags: &[String], name: &str| -> Option<u32> {
        let at = flags.iter().position(|f| f == name)?;
        flags
            .get(at + 1)?
            .split(',')
            .filter_map(|v| v.trim().parse::<u32>().ok())
            .max()
    };
    let variants: Vec<Vec<String>> = if fig.variants.is_empty() {
        vec![fig.flags.clone()]
    } else {
        fig.variants
            .iter()
            .map(|v| fig.flags.iter().chain(v).cloned().collect())
            .collect()
    };
    let between = variants
        .iter()
        .filter_map(|flags| {
            let (s, c) = (most(flags, "--servers")?, most(flags, "--clients")?);
            Some(match study.testbed.topology {
                crate::study::data::Topology::Switch => s.min(c),
                crate::study::data::Topology::Mesh => s * c,
            })
        })
        .max()
        .unwrap_or(1);
    let links = fig
        .links
        .iter()
        .copied()
        .max()
        .unwrap_or(1)
        .max(between)
        .max(1);
    let both_ways = fig.flags.iter().any(|f| f == "--bidir")
        || fig
            .tests
            .iter()
            .any(|t| matches!(t.as_str(), "bibw" | "bibw-pingpong" | "mpi-bibw"));
    links * if both_ways { 2 } else { 1 }
}

/// Refuses a figure `study` does not have among `asked` (`--figures`).
pub fn check_figures(study: &Study, asked: &[String]) -> Result<(), StudyCmdError> {
    match asked.iter().find(|f| study.figure(f).is_none()) {
        Some(f) => Err(StudyCmdError::UnknownFigure {
            study: study.id.clone(),
            figure: f.clone(),
            known: study
                .figures
                .iter()
                .map(|f| f.id.as_str())
                .collect::<Vec<_>>()
                .join(", "),
        }),
        None => Ok(()),
    }
}

/// The figures of a study a run makes, and what becomes of the others.
#[derive(Debug, Clone, PartialEq)]
pub struct Chosen<'a> {
    /// The figures to run, in the study's order.
    pub figures: Vec<&'a Figure>,
    /// The figures left out: not asked for, or skipped with why.
    pub outcomes: BTreeMap<String, Outcome>,
}

/// The figures of `study` that `asked` names (every figure when empty)
/// and the hosts (`offer`) can make; refused when the hosts can make none
/// of them, with the first figure's reason.
pub fn choose_figures<'a>(
    study: &'a Study,
    asked: &[String],
    offer: &HostsOffer,
) -> Result<Chosen<'a>, StudyCmdError> {
    let mut outcomes = BTreeMap::new();
    let mut figures = Vec::new();
    let mut first_why = None;
    for f in &study.figures {
        if !asked.is_empty() && !asked.contains(&f.id) {
            outcomes.insert(f.id.clone(), Outcome::NotAsked);
            continue;
        }
        match cannot_make(f, offer) {
            Some(why) => {
                first_why.get_or_insert_with(|| format!("figure {}: {why}", f.id));
                outcomes.insert(f.id.clone(), Outcome::Skipped(why));
            }
            None => figures.push(f),
        }
    }
    if figures.is_empty() {
        return Err(StudyCmdError::NoFigure {
            study: study.id.clone(),
            why: first_why.unwrap_or_default(),
        });
    }
    Ok(Chosen { figures, outcomes })
}

/// Why the hosts cannot make `fig`, if they cannot; one clause.
pub fn cannot_make(fig: &Figure, offer: &HostsOffer) -> Option<String> {
    if offer.hosts < fig.hosts {
        return Some(format!(
            "needs {} hosts, the hosts have {}",
            fig.hosts, offer.hosts
        ));
    }
    if fig.needs_conditions() && !offer.conditions {
        return Some(format!(
            "switches link conditions ({}), which needs root and testbed hosts",
            fig.conditions.join(" ")
        ));
    }
    if let Some(max) = fig.links.iter().max() {
        if *max > offer.links {
            return Some(format!(
                "needs {max} links between the first two hosts, they have {}",
                offer.links
            ));
        }
    }
    if fig
        .tests
        .iter()
        .any(|t| crate::mpi::MpiTest::by_name(t).is_some())
    {
        if let Err(why) = crate::mpi::availability() {
            return Some(format!("MPI is not available: {why}"));
        }
    }
    if !fig.transports.is_empty() && available_transports(fig).0.is_empty() {
        return Some(format!(
            "none of its stacks is available here ({})",
            available_transports(fig).1.join("; ")
        ));
    }
    None
}

/// The figure's transports this binary can run, and the others with why.
pub fn available_transports(fig: &Figure) -> (Vec<String>, Vec<String>) {
    let mut ok = Vec::new();
    let mut missing = Vec::new();
    for t in &fig.transports {
        match crate::transport::find(t).map(|tr| tr.availability()) {
            Some(Ok(())) => ok.push(t.clone()),
            Some(Err(why)) => missing.push(format!("{t}: {}", why.0)),
            None => missing.push(format!("{t}: unknown")),
        }
    }
    (ok, missing)
}

/// Flags whose comma-separated value makes one point per item.
const LIST_FLAGS: [&str; 9] = [
    "--alpha",
    "--op",
    "--server",
    "--preset",
    "--pattern",
    "--servers",
    "--responder",
    "--gather-mode",
    "--copies",
];

fn flag_value<'a>(flags: &'a [String], name: &str) -> Option<&'a str> {
    flags
        .iter()
        .position(|f| f == name)
        .and_then(|i| flags.get(i + 1))
        .map(String::as_str)
}

/// How a figure is measured: its runs and their method.
#[derive(Debug, Clone, PartialEq)]
pub struct FigureRun {
    /// The figure.
    pub figure: String,
    /// One run per variant.
    pub runs: Vec<Invocation>,
    /// Repetitions per point.
    pub reps: u32,
    /// Time of one repetition, ms.
    pub rep_ms: u64,
    /// Stacks left out, with why.
    pub missing: Vec<String>,
    /// Points it measures (all variants).
    pub points: u64,
    /// What the plan expects it to take: every point's repetitions with
    /// what each costs beyond its own time, ms.
    pub time_ms: u64,
}

/// Where a study's runs measure and what they write: the hosts every run
/// is given (`--hosts`), the key of their agents (`--key`) and the results
/// file the study made (`--json`).
#[derive(Debug, Clone, PartialEq)]
pub struct Destination {
    /// The hosts.
    pub hosts: HostsArg,
    /// The shared key file of the hosts' agents, when given.
    pub key_file: Option<PathBuf>,
    /// The results file.
    pub json: PathBuf,
}

/// Whether the figure's tests are workloads (a repetition is a window).
fn is_workload(fig: &Figure) -> bool {
    fig.command == FigureCommand::Run
        && fig.tests.iter().all(|t| crate::workload::find(t).is_some())
}

fn sizes_of(fig: &Figure, quick: bool) -> Option<&str> {
    if quick {
        fig.quick_sizes.as_deref().or(fig.sizes.as_deref())
    } else {
        fig.sizes.as_deref()
    }
}

/// A count axis (clients, streams, links) of `fig`: whole, or under
/// `--quick` its two ends, which still show whether it rises or stays
/// flat, and the counts a claim reads (004's two links, "two connections
/// double one").
fn axis(fig: &Figure, l: &[u32], quick: bool) -> Vec<u32> {
    match l {
        [first, .., last] if quick && l.len() > 2 => l
            .iter()
            .copied()
            .filter(|v| v == first || v == last || fig.claim_counts.contains(v))
            .collect(),
        _ => l.to_vec(),
    }
}

/// The figure's own flags; under `--quick` its quick flags replace the
/// value of a flag it already has (`--alpha 0.4,1.0` for five alphas) and
/// are added otherwise.
fn flags_of(f: &Figure, quick: bool) -> Vec<String> {
    let mut flags = f.flags.clone();
    if !quick {
        return flags;
    }
    let mut q = f.quick_flags.iter().peekable();
    while let Some(flag) = q.next() {
        let value = q.next_if(|v| !v.starts_with("--"));
        match (flags.iter().position(|x| x == flag), value) {
            (Some(i), Some(v)) if i + 1 < flags.len() => flags[i + 1] = v.clone(),
            (_, v) => {
                flags.push(flag.clone());
                flags.extend(v.cloned());
            }
        }
    }
    flags
}

/// Points one variant of the figure measures, estimated from its lists.
fn points_of(fig: &Figure, quick: bool, transports: usize) -> u64 {
    let flags = flags_of(fig, quick);
    let sizes: u64 = match fig.command {
        FigureCommand::Sweep => {
            let bytes = |n: &str, d: u64| {
                flag_value(&flags, n)
                    .and_then(|v| netgap_core::units::parse_size_bytes(v).ok())
                    .unwrap_or(d)
            };
            let (start, end) = (bytes("--start", 1).max(1), bytes("--end", 8 << 20));
            let growth = flag_value(&flags, "--factor")
                .and_then(|v| v.parse::<f64>().ok())
                .map_or(Growth::NetPipe, Growth::Factor);
            let perturbation_bytes = flag_value(&flags, "--perturbation")
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(crate::sweep::DEFAULT_PERTURBATION_BYTES);
            // The sizes the sweep's own plan makes (a bad range is the
            // plan's to refuse, in one line, when the figure runs).
            sweep_sizes(start, end, growth, perturbation_bytes).map_or(1, |s| s.len() as u64)
        }
        _ => sizes_of(fig, quick)
            .and_then(|s| parse_size_list(s).ok())
            .map_or(1, |l| l.len() as u64),
    };
    let count = |l: &[u32]| (axis(fig, l, quick).len() as u64).max(1);
    let conditions: u64 = fig
        .conditions
        .iter()
        .map(|c| {
            c.split('=')
                .nth(1)
                .map_or(1, |v| v.split(',').count() as u64)
        })
        .product();
    let lists: u64 = LIST_FLAGS
        .iter()
        .filter_map(|f| flag_value(&flags, f))
        .map(|v| v.split(',').count() as u64)
        .product();
    let tests = match fig.command {
        FigureCommand::Logp => 3,
        _ => (fig.tests.len() as u64).max(1),
    };
    sizes
        * (transports as u64).max(1)
        * (fig.modes.len() as u64).max(1)
        * conditions
        * count(&fig.clients)
        * count(&fig.streams)
        * count(&fig.links)
        * lists
        * tests
}

/// The cost of one repetition beyond its own time, ms.
fn overhead_ms(fig: &Figure) -> u64 {
    let base = if is_workload(fig) {
        WORKLOAD_OVERHEAD_MS + datagram_quiet_ms(fig)
    } else {
        P2P_OVERHEAD_MS
    };
    base + if fig.needs_conditions() {
        CONDITION_OVERHEAD_MS
    } else {
        0
    }
}

/// The datagram servers' quiet wait over the figure's repetitions on
/// average: [`DATAGRAM_QUIET_MS`] times the share of its transports that
/// carry datagrams.
fn datagram_quiet_ms(fig: &Figure) -> u64 {
    let all = fig.transports.len() as u64;
    let datagram = fig
        .transports
        .iter()
        .filter(|t| netgap_transport::framing(t) == Some(netgap_core::framing::Framing::Udp))
        .count() as u64;
    (DATAGRAM_QUIET_MS * datagram).checked_div(all).unwrap_or(0)
}

/// The shortest repetition of the figure, ms.
fn min_rep_ms(fig: &Figure) -> u64 {
    let floor = if is_workload(fig) {
        MIN_WINDOW_MS
    } else {
        MIN_REP_MS
    };
    fig.min_rep_ms.unwrap_or(floor).max(floor)
}

/// What measuring one figure costs: its points and what one repetition of
/// a point takes at the least.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Cost {
    /// Points it measures (all variants, the stacks this build has).
    points: u64,
    /// The shortest repetition it can measure, ms.
    min_rep_ms: u64,
    /// What a repetition costs beyond its own time, ms.
    overhead_ms: u64,
}

impl Cost {
    fn of(f: &Figure, quick: bool) -> Cost {
        let n = available_transports(f).0.len();
        let variants = (f.variants.len() as u64).max(1);
        Cost {
            points: points_of(f, quick, n) * variants,
            min_rep_ms: min_rep_ms(f),
            overhead_ms: overhead_ms(f),
        }
    }

    /// The least time the figure takes: [`MIN_REPS`] repetitions of its
    /// shortest of every point, with their overhead, ms.
    fn least_ms(&self) -> u64 {
        self.points * u64::from(MIN_REPS) * (self.min_rep_ms + self.overhead_ms)
    }
}

/// The least budget [`plan`] takes for `figures`: [`MIN_REPS`]
/// repetitions of the shortest each figure can measure, with what each
/// repetition costs beyond it, for every point, rounded up to a second.
pub fn least_budget(figures: &[&Figure], quick: bool) -> Duration {
    let ms: u64 = figures.iter().map(|f| Cost::of(f, quick).least_ms()).sum();
    Duration::from_secs(ms.div_ceil(1000))
}

/// The budget of one study without `--quick` or `--budget`.
pub const DEFAULT_BUDGET: Duration = Duration::from_secs(30 * 60);

/// What `--quick` adds per point to the least its figures take, ms.
/// [`plan`] shares it out equally: a point-to-point test's points then get
/// the paper's 10 repetitions of about 15 ms instead of 3 of 2 ms, a
/// workload's 3 windows about 50 ms longer than its shortest.
pub const QUICK_EXTRA_MS: u64 = 150;

/// A study's budget, and where it came from.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Budget {
    /// Given with `--budget`.
    Given(Duration),
    /// Derived under `--quick` from the figures' own points
    /// ([`Budget::quick`]).
    Quick {
        /// The budget.
        total: Duration,
        /// The least the figures take ([`least_budget`]).
        least: Duration,
        /// Their points.
        points: u64,
    },
    /// [`DEFAULT_BUDGET`], without `--quick` or `--budget`.
    Default,
}

impl Budget {
    /// The budget of `figures`: `given` (`--budget`) when there is one;
    /// else under `--quick` [`Budget::quick`]; else [`DEFAULT_BUDGET`].
    pub fn of(given: Option<Duration>, quick: bool, figures: &[&Figure]) -> Budget {
        match (given, quick) {
            (Some(b), _) => Budget::Given(b),
            (None, true) => Budget::quick(figures),
            (None, false) => Budget::Default,
        }
    }

    /// The budget `--quick` derives from `figures`' own points (the
    /// quick sizes and axes, the stacks this build has): the least they
    /// take ([`MIN_REPS`] repetitions of the shortest each figure can
    /// measure, with what each repetition costs beyond it, for every
    /// point) plus [`QUICK_EXTRA_MS`] a point, rounded up to a second.
    /// Never below the least, so [`plan`] never refuses it.
    pub fn quick(figures: &[&Figure]) -> Budget {
        let costs: Vec<Cost> = figures.iter().map(|f| Cost::of(f, true)).collect();
        let points: u64 = costs.iter().map(|c| c.points).sum();
        let least_ms: u64 = costs.iter().map(Cost::least_ms).sum();
        Budget::Quick {
            total: Duration::from_secs((least_ms + QUICK_EXTRA_MS * points).div_ceil(1000)),
            least: Duration::from_secs(least_ms.div_ceil(1000)),
            points,
        }
    }

    /// The time to spread.
    pub fn duration(&self) -> Duration {
        match *self {
            Budget::Given(d) => d,
            Budget::Quick { total, .. } => total,
            Budget::Default => DEFAULT_BUDGET,
        }
    }

    /// The budget and where it came from, for the plan and the report,
    /// e.g. "4m 2s (--quick: the least its 89 points take, 3m 47s, and
    /// 150 ms a point more)".
    pub fn describe(&self) -> String {
        let d = |d: Duration| humantime::format_duration(d).to_string();
        match *self {
            Budget::Given(b) => format!("{} (--budget)", d(b)),
            Budget::Quick {
                total,
                least,
                points,
            } => format!(
                "{} (--quick: the least its {points} points take, {} repetitions of each \
                 figure's shortest, {}, and {QUICK_EXTRA_MS} ms a point more)",
                d(total),
                MIN_REPS,
                d(least)
            ),
            Budget::Default => format!("{} (the default without --quick)", d(DEFAULT_BUDGET)),
        }
    }
}

/// Spreads `budget` over `figures` into each figure's repetitions and
/// repetition time, and its typed runs on `to`'s hosts into its results
/// file: every point gets [`MIN_REPS`] repetitions of the shortest
/// its figure can measure, and the rest of the budget is shared equally
/// among the points. Refuses a budget that cannot hold that least
/// ([`least_budget`]). The figures' [`FigureRun::time_ms`] sum to at most
/// the budget.
pub fn plan(
    study: &Study,
    figures: &[&Figure],
    budget: Duration,
    quick: bool,
    to: &Destination,
) -> Result<Vec<FigureRun>, StudyCmdError> {
    let budget_ms = budget.as_millis() as u64;
    let shape: Vec<Cost> = figures.iter().map(|f| Cost::of(f, quick)).collect();
    let need_ms: u64 = shape.iter().map(Cost::least_ms).sum();
    if budget_ms < need_ms {
        return Err(StudyCmdError::Budget {
            given: humantime::format_duration(budget).to_string(),
            what: format!("study {}", study.id),
            need: humantime::format_duration(least_budget(figures, quick)).to_string(),
        });
    }
    let total_points: u64 = shape.iter().map(|c| c.points).sum::<u64>().max(1);
    let mut runs = Vec::new();
    for (f, cost) in figures.iter().zip(shape) {
        let Cost {
            points,
            min_rep_ms: min,
            overhead_ms: over,
        } = cost;
        // Every point first gets the least it can be measured in (MIN_REPS
        // repetitions of its shortest), and what the budget holds beyond
        // the least is shared equally among all the points, so a figure
        // of costly repetitions (a workload's) never takes more than its
        // share. A point's share goes to the study's repetitions, fewer
        // (down to MIN_REPS) only when a repetition would be shorter than
        // the figure can measure.
        let per_point = u64::from(MIN_REPS) * (min + over) + (budget_ms - need_ms) / total_points;
        let mut reps = study.method.reps;
        while reps > MIN_REPS && per_point / u64::from(reps) < min + over {
            reps -= 1;
        }
        let rep_ms = (per_point / u64::from(reps))
            .saturating_sub(over)
            .clamp(min, MAX_REP_MS.max(min));
        let (transports, missing) = available_transports(f);
        let invocations = variants_of(f)
            .iter()
            .map(|variant| {
                let parsed =
                    parse_figure(f, quick, variant).map_err(|source| StudyCmdError::Flags {
                        study: study.id.clone(),
                        figure: f.id.clone(),
                        source,
                    })?;
                Ok(Invocation {
                    command: parsed.command,
                    transports: transports.clone(),
                    modes: parsed.modes,
                    reps,
                    rep_time: Duration::from_millis(rep_ms),
                    conditions: parsed.conditions,
                    hosts: to.hosts.clone(),
                    key_file: to.key_file.clone(),
                    json: to.json.clone(),
                    label: crate::report::study::figure_label(&study.id, &f.id),
                })
            })
            .collect::<Result<Vec<_>, StudyCmdError>>()?;
        runs.push(FigureRun {
            figure: f.id.clone(),
            runs: invocations,
            reps,
            rep_ms,
            missing,
            points,
            time_ms: points * u64::from(reps) * (rep_ms + over),
        });
    }
    Ok(runs)
}

/// The hosts of a study's own testbed, which `netgap study` builds (as
/// root) when it runs, in words.
pub fn testbed_text(study: &Study) -> String {
    let t = &study.testbed;
    let wiring = match t.topology {
        data::Topology::Switch if t.links > 1 => format!("on {} switches", t.links),
        data::Topology::Switch => "on a switch".to_string(),
        data::Topology::Mesh if t.links > 1 => format!("meshed by {} links a pair", t.links),
        data::Topology::Mesh => "meshed".to_string(),
    };
    let rate = t
        .rate
        .as_deref()
        .map(|r| format!(", links at {r}"))
        .unwrap_or_default();
    format!(
        "its own testbed, built as root when it runs: {} hosts {wiring}{rate}",
        t.hosts
    )
}

/// What `netgap study --plan` prints of one study: where it runs
/// (`hosts`), its budget, then every figure in the paper's order, either
/// planned (points, repetitions beside the paper's, the time it takes, at
/// most for a job run to completion, and its command lines) or with why it would not run (`not_run`: figure id
/// and reason), and what the planned figures take together.
pub fn plan_text(
    study: &Study,
    budget: &Budget,
    hosts: &str,
    runs: &[FigureRun],
    not_run: &[(String, String)],
) -> String {
    use std::fmt::Write as _;
    // Whole seconds: the plan's times are estimates.
    let d =
        |ms: u64| humantime::format_duration(Duration::from_secs(ms.div_ceil(1000))).to_string();
    let year = study
        .citation
        .year
        .map(|y| format!(" ({y})"))
        .unwrap_or_default();
    let mut out = format!(
        "study {}: {}{year}\n  hosts: {hosts}\n  budget: {}\n",
        study.id,
        study.citation.title,
        budget.describe()
    );
    for f in &study.figures {
        if let Some(r) = runs.iter().find(|r| r.figure == f.id) {
            let _ = writeln!(
                out,
                "  figure {}: {} point{}, {} repetitions of {} ms ({}), {}about {}",
                f.id,
                r.points,
                if r.points == 1 { "" } else { "s" },
                r.reps,
                r.rep_ms,
                crate::report::study::beside_paper(r.reps, &study.method),
                if ends_with_its_job(f) { "at most " } else { "" },
                d(r.time_ms)
            );
            for m in &r.missing {
                let _ = writeln!(out, "    not measured: {m}");
            }
            for run in &r.runs {
                let _ = writeln!(out, "    {}", run.text());
            }
        } else if let Some((_, why)) = not_run.iter().find(|(id, _)| *id == f.id) {
            let _ = writeln!(out, "  figure {}: skipped: {why}", f.id);
        }
    }
    let time_ms: u64 = runs.iter().map(|r| r.time_ms).sum();
    let _ = writeln!(
        out,
        "  {} of {} figures, about {} of the {} budget",
        runs.len(),
        study.figures.len(),
        d(time_ms),
        humantime::format_duration(budget.duration())
    );
    out
}

/// Whether the figure's repetitions each run one job to completion
/// (pipeline's query, pio's write and read), its window only their upper
/// bound, so they often end sooner than planned.
fn ends_with_its_job(fig: &Figure) -> bool {
    is_workload(fig)
        && fig
            .tests
            .iter()
            .all(|t| crate::workload::find(t).is_some_and(|w| w.staged().is_some()))
}

/// The figure's variants' own flags: one run with none when it has no
/// variants.
fn variants_of(f: &Figure) -> Vec<Vec<String>> {
    if f.variants.is_empty() {
        vec![Vec::new()]
    } else {
        f.variants.clone()
    }
}

/// What a figure's run takes from the figure: its command with tests,
/// sizes, count axes and further flags, its modes and its conditions.
struct Parsed {
    command: Command,
    modes: Vec<Mode>,
    conditions: Vec<ConditionAxis>,
}

/// Reads the figure (under `--quick`, its quick sizes, axes and flags) and
/// one `variant`'s flags as its command would: refuses what the command
/// line would refuse, and a flag the planner sets itself.
fn parse_figure(f: &Figure, quick: bool, variant: &[String]) -> Result<Parsed, FlagError> {
    let bad = |flag: &str, value: &str, why: String| FlagError::BadValue {
        flag: flag.to_string(),
        value: value.to_string(),
        why,
    };
    let modes = f
        .modes
        .iter()
        .map(|m| {
            Mode::by_name(m.trim()).ok_or_else(|| {
                bad(
                    "--mode",
                    m,
                    "not a completion mode; use event or poll".into(),
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let sizes = sizes_of(f, quick)
        .map(|s| parse_size_list(s).map_err(|e| bad("-s", s, e.to_string())))
        .transpose()?;
    let conditions = f
        .conditions
        .iter()
        .map(|c| ConditionAxis::parse(c).map_err(|e| bad("--conditions", c, e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    let counts = |l: &[u32]| (!l.is_empty()).then(|| axis(f, l, quick));
    let (clients, streams, links) = (counts(&f.clients), counts(&f.streams), counts(&f.links));
    let taken: Vec<&str> = [
        ("--clients", &clients),
        ("-P", &streams),
        ("--links", &links),
    ]
    .iter()
    .filter(|(_, axis)| axis.is_some())
    .map(|(flag, _)| *flag)
    .collect();
    let words: Vec<String> = flags_of(f, quick)
        .into_iter()
        .chain(variant.iter().cloned())
        .collect();
    // Only `run` has count axes and only `run` and `sweep` conditions, as
    // on the command line.
    let not_for = |flag: &str| FlagError::Unknown {
        flag: flag.to_string(),
        command: f.command.name(),
    };
    let command = match parse_flags(f.command, &words, &taken)? {
        Flags::Run(flags) => Command::Run {
            tests: f.tests.clone(),
            workload: is_workload(f),
            sizes,
            clients,
            streams,
            links,
            flags,
        },
        Flags::Sweep(_) | Flags::Logp(_) if !taken.is_empty() => return Err(not_for(taken[0])),
        Flags::Sweep(flags) => Command::Sweep { flags },
        Flags::Logp(_) if !conditions.is_empty() => return Err(not_for("--conditions")),
        Flags::Logp(flags) => Command::Logp { sizes, flags },
    };
    Ok(Parsed {
        command,
        modes,
        conditions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The study testbed's hosts and a results file.
    fn testbed_destination() -> Destination {
        Destination {
            hosts: HostsArg::File {
                path: "/run/netgap/study/hosts.json".into(),
                testbed: false,
            },
            key_file: None,
            json: "netgap-study-all.jsonl".into(),
        }
    }

    /// Figures not asked for are left out, ones the hosts cannot make are
    /// skipped with why, and hosts that can make none are refused with the
    /// first figure's reason; a figure the study lacks is refused naming
    /// the ones it has.
    #[test]
    fn figures_are_chosen_by_what_was_asked_and_what_the_hosts_make() {
        let s = load("003").expect("003");
        let offer = HostsOffer::testbed(&s);
        let all = choose_figures(&s, &[], &offer).expect("every figure");
        assert_eq!(all.figures.len(), s.figures.len());
        assert!(all.outcomes.is_empty(), "{:?}", all.outcomes);
        let two = choose_figures(&s, &["2".to_string()], &offer).expect("figure 2");
        let ids: Vec<&str> = two.figures.iter().map(|f| f.id.as_str()).collect();
        assert_eq!(ids, ["2"]);
        assert_eq!(two.outcomes.get("1"), Some(&Outcome::NotAsked));
        let no_conditions = HostsOffer {
            conditions: false,
            ..offer
        };
        let e = choose_figures(&s, &["1".to_string()], &no_conditions).expect_err("none left");
        assert!(
            e.to_string().starts_with(
                "these hosts can make no figure of study 003: figure 1: switches link conditions"
            ),
            "{e}"
        );
        check_figures(&s, &["2".to_string()]).expect("figure 2 is one");
        let e = check_figures(&s, &["9".to_string()]).expect_err("no figure 9");
        assert_eq!(
            e.to_string(),
            "study 003 has no figure 9; its figures are 1, 2, 3"
        );
    }

    #[test]
    fn a_figure_keeps_busy_the_links_its_records_are_judged_against() {
        let s000 = load("000").expect("000");
        let s004 = load("004").expect("004");
        let fig = |s: &Study, id: &str| s.figure(id).expect("figure").clone();
        // One link: a ping-pong; striped I/O of one server or one client on
        // a switch.
        assert_eq!(shapers_at_once(&s000, &fig(&s000, "3a")), 1);
        assert_eq!(shapers_at_once(&s000, &fig(&s000, "11")), 1);
        // Two servers and two clients on a switch: both servers' links.
        assert_eq!(shapers_at_once(&s000, &fig(&s000, "12")), 2);
        // Both ways over one link; three links both ways.
        assert_eq!(shapers_at_once(&s004, &fig(&s004, "3")), 2);
        assert_eq!(shapers_at_once(&s004, &fig(&s004, "5")), 6);
    }

    #[test]
    fn a_quick_axis_keeps_its_ends_and_the_counts_a_claim_reads() {
        let s004 = load("004").expect("004");
        let fig5 = s004.figure("5").expect("figure 5");
        // "Two connections double one" reads two links.
        assert!(fig5.claim_counts.contains(&2), "{:?}", fig5.claim_counts);
        assert_eq!(axis(fig5, &fig5.links, true), [1, 2, 3]);
        let mut bare = fig5.clone();
        bare.claim_counts.clear();
        assert_eq!(axis(&bare, &[1, 2, 3, 4], true), [1, 4]);
        assert_eq!(axis(&bare, &[1, 2, 3, 4], false), [1, 2, 3, 4]);
    }

    #[test]
    fn a_sweeps_points_are_the_sizes_its_own_plan_makes() {
        let s003 = load("003").expect("003");
        // Figure 1, quick: --factor 2 from 1 B to 256 KiB without
        // perturbation is 19 sizes, at each of three rates.
        let fig1 = s003.figure("1").expect("figure 1");
        let sizes = sweep_sizes(1, 256 << 10, Growth::Factor(2.0), 0).expect("sizes");
        assert_eq!(sizes.len(), 19);
        assert_eq!(points_of(fig1, true, 1), 19 * 3);
        // Figure 2, quick: NetPIPE's sequence to 4 MiB, no perturbation.
        let fig2 = s003.figure("2").expect("figure 2");
        let netpipe = sweep_sizes(1, 4 << 20, Growth::NetPipe, 0).expect("sizes");
        assert_eq!(points_of(fig2, true, 1), netpipe.len() as u64);
    }

    /// The bug: `netgap study 000 --quick`, the first study a newcomer
    /// runs, stopped at once: the fixed 150 s of `--quick` was below the
    /// least its points take (3m 48s, and 5m 34s with the xdp stacks).
    /// The budget `--quick` derives holds every study, whichever of its
    /// figures are chosen, in every build.
    #[test]
    fn a_workload_figure_over_udp_costs_its_servers_quiet_wait() {
        // Study 002's hot spot runs over tcp, uring and udp: one repetition
        // in three waits for the udp server's clients to go quiet.
        let s002 = load("002").expect("002");
        let hotspot = s002.figure("hotspot").expect("hotspot");
        assert_eq!(datagram_quiet_ms(hotspot), DATAGRAM_QUIET_MS / 3);
        assert_eq!(
            overhead_ms(hotspot),
            WORKLOAD_OVERHEAD_MS + DATAGRAM_QUIET_MS / 3
        );
        let mut tcp_only = hotspot.clone();
        tcp_only.transports = vec!["tcp".into()];
        assert_eq!(overhead_ms(&tcp_only), WORKLOAD_OVERHEAD_MS);
    }

    #[test]
    fn quick_derives_a_budget_every_study_and_figure_plans_in() {
        let to = testbed_destination();
        for s in all().expect("studies") {
            let every: Vec<&Figure> = s.figures.iter().collect();
            let mut choices: Vec<Vec<&Figure>> = every.iter().map(|f| vec![*f]).collect();
            choices.push(every);
            for figs in choices {
                let budget = Budget::of(None, true, &figs);
                let Budget::Quick { total, least, .. } = budget else {
                    panic!("--quick without --budget derives its budget: {budget:?}");
                };
                assert!(total >= least && least == least_budget(&figs, true));
                let runs = plan(&s, &figs, total, true, &to).unwrap_or_else(|e| {
                    panic!("study {}: {e}", s.id);
                });
                assert_eq!(runs.len(), figs.len());
            }
        }
        let s = load("000").expect("000");
        let figs: Vec<&Figure> = s.figures.iter().collect();
        assert_eq!(
            Budget::of(Some(Duration::from_secs(9)), true, &figs),
            Budget::Given(Duration::from_secs(9)),
            "--budget stands under --quick"
        );
        assert_eq!(Budget::of(None, false, &figs).duration(), DEFAULT_BUDGET);
    }

    /// The bug: each figure got the same share per point whatever its
    /// repetitions cost, so at a budget near the least a workload's
    /// repetitions were held at their shortest beyond their share while
    /// ping-pongs took long ones, and the study ran well past its budget.
    #[test]
    fn a_plan_stays_within_its_budget_and_gives_every_point_its_least() {
        let to = testbed_destination();
        for s in all().expect("studies") {
            let figs: Vec<&Figure> = s.figures.iter().collect();
            for quick in [false, true] {
                let least = least_budget(&figs, quick);
                for budget in [least, least * 2, Duration::from_secs(30 * 60)] {
                    let runs = plan(&s, &figs, budget, quick, &to).expect("plan");
                    let total_ms: u64 = runs.iter().map(|r| r.time_ms).sum();
                    assert!(
                        total_ms <= budget.as_millis() as u64,
                        "study {} (quick {quick}): {total_ms} ms planned in {budget:?}",
                        s.id
                    );
                    for (r, f) in runs.iter().zip(&figs) {
                        assert!((MIN_REPS..=s.method.reps).contains(&r.reps), "{r:?}");
                        assert!(r.rep_ms >= min_rep_ms(f), "{r:?}");
                    }
                }
                let short = least - Duration::from_secs(1);
                assert!(plan(&s, &figs, short, quick, &to).is_err());
            }
        }
    }
}
