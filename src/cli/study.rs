//! `netgap study`: the glue that measures a study's figures. The library
//! (`netgap::study`) turns each figure into typed runs of `netgap run`,
//! `sweep` or `logp`; here each run's request is measured by the same
//! function as the command's own, into one results file, whose records
//! are read back typed for the report.

use anyhow::{anyhow, Context, Result};
use netgap::cluster::HostsArg;
use netgap::record::ResultRecord;
use netgap::report::load::LoadError;
use netgap::report::study::{Outcome, StudyRun};
use netgap::study::{self, data::Study, Destination, FigureRun, HostsOffer, Request};
use netgap::testbed_seams::CoordinatorProbe;
use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// The name of the testbed a study builds.
const TESTBED_NAME: &str = "study";

/// Flags of `netgap study`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct StudyArgs {
    /// The study: 000, 001, 002, 003, 004, or all.
    #[arg(value_name = "ID|all")]
    pub id: String,
    /// Only these figures (of a single study), comma separated, e.g. 3a,5b.
    #[arg(long, value_name = "FIG[,FIG...]", value_delimiter = ',')]
    pub figures: Vec<String>,
    /// A few minutes per study: fewer sizes, the two ends of each
    /// clients/streams/links axis, smaller data sets, and unless --budget
    /// says otherwise a budget derived from the study's points: 3
    /// repetitions of the shortest each figure can measure for every
    /// point, and 150 ms a point more.
    #[arg(long)]
    pub quick: bool,
    /// Time to spread over each study's figures; repetition times are
    /// scaled to it, and one too small for 3 repetitions of every point is
    /// refused [default: 30m per study; with --quick, derived from its
    /// points].
    #[arg(long, value_name = "DUR", value_parser = netgap::units::parse_duration)]
    pub budget: Option<Duration>,
    /// The hosts to run on: @FILE (a hosts file), @testbed, @slurm[:PORT],
    /// @hostfile:FILE[:PORT] or agents' addresses A,B,...; the first host
    /// serves, and a point-to-point test's client runs on the second
    /// host's agent.
    /// Figures the hosts cannot make are skipped with one line each.
    /// Without it, as root, each study builds the testbed it needs and
    /// takes it down afterwards.
    #[arg(long, value_name = "@FILE|@slurm[:PORT]|A,B")]
    pub hosts: Option<String>,
    /// The shared key file of the hosts' agents (`netgap serve --key`),
    /// given to every run of the study; a hosts file's own `key_file`
    /// stands in for it.
    #[arg(long, value_name = "FILE", requires = "hosts")]
    pub key: Option<PathBuf>,
    /// Directory of the results file and the report: one of yours that no
    /// other user can write (made, mode 0700, if missing); a study writes
    /// only new files there and refuses ones that exist.
    #[arg(short = 'o', long = "out", value_name = "DIR", default_value = ".")]
    pub out: PathBuf,
    /// What this machine forwards through the testbed's shapers, in bit/s
    /// of payload (e.g. 8G), instead of calibrating it when the study
    /// builds its testbed: a figure whose links at once would take more
    /// than 80% of it runs at a lower link rate, and its records say so.
    #[arg(long, value_name = "RATE")]
    pub forwarding: Option<String>,
    /// Print what would run and run nothing: for each study its hosts and
    /// budget, and for each figure its points, repetitions and their time
    /// with its command lines, or why it would be skipped. Needs no root,
    /// builds no testbed and writes no file.
    #[arg(long)]
    pub plan: bool,
}

/// One study ready to run: its figures, their runs, what was skipped.
struct Prepared {
    study: Study,
    budget: study::Budget,
    runs: Vec<FigureRun>,
    outcomes: BTreeMap<String, Outcome>,
    /// One sentence per figure that ran at a scaled link rate.
    scaled: Vec<String>,
}

/// What the flags ask for, checked before anything runs: the studies,
/// the hosts they run on (`--hosts`, or each study's own testbed) and
/// where the records and the report go.
struct Asked {
    studies: Vec<Study>,
    /// `--hosts`, parsed; `None`: each study builds its own testbed.
    hosts: Option<HostsArg>,
    /// What `--hosts` offers.
    offer: Option<HostsOffer>,
    /// Where every run measures and writes.
    to: Destination,
    /// The report's path.
    html: PathBuf,
}

/// `netgap study`.
pub(crate) fn run(args: &StudyArgs) -> Result<()> {
    let asked = asked(args)?;
    // Everything is checked before anything runs: the figures the hosts
    // can make and the budget (each figure's flags against its command's
    // were checked when its study was read).
    let mut prepared = asked
        .studies
        .iter()
        .map(|s| prepare(s.clone(), args, asked.offer.as_ref(), &asked.to))
        .collect::<Result<Vec<_>>>()?;
    if args.plan {
        print_plan(&prepared, args.hosts.as_deref());
        return Ok(());
    }

    // The testbed the studies build is theirs from here to the end: a
    // second study, or a `testbed up` or `down` by hand, is refused in one
    // line instead of rebuilding or removing it under this one.
    let command = format!("netgap study {}", args.id);
    let _lock = match asked.hosts {
        Some(_) => None,
        None => Some(netgap::testbed::TestbedLock::acquire(
            TESTBED_NAME,
            &command,
        )?),
    };
    let out = Outputs::create(&args.out, &args.id)?;
    // Said once nothing can be refused any more, so a refusal is the one
    // line a refused study prints.
    for p in &prepared {
        for (id, o) in &p.outcomes {
            if let Outcome::Skipped(why) = o {
                eprintln!("netgap: study {} figure {id}: skipped: {why}", p.study.id);
            }
        }
    }

    let mut failed = 0;
    for p in &mut prepared {
        let testbed = match asked.hosts {
            Some(_) => None,
            None => Some(build_testbed(
                &p.study,
                &command,
                args.forwarding.as_deref(),
            )?),
        };
        for r in &p.runs {
            let on_testbed = testbed.is_some();
            let outcome = measure_figure(&p.study, r, on_testbed, &mut p.scaled, &out, &asked.to)?;
            failed += usize::from(matches!(outcome, Outcome::Failed(_)));
            p.outcomes.insert(r.figure.clone(), outcome);
        }
        drop(testbed);
    }

    write_report(&prepared, args.quick, &out, &asked)?;
    if failed > 0 {
        return Err(anyhow!(
            "{failed} figure run(s) failed; the report says which"
        ));
    }
    Ok(())
}

/// The flags checked and resolved: `--forwarding` only for a testbed the
/// study builds, the studies and `--figures` of one, `--hosts` parsed (or
/// root, which builds the testbeds), and where the results go.
fn asked(args: &StudyArgs) -> Result<Asked> {
    if let Some(f) = &args.forwarding {
        if args.hosts.is_some() {
            return Err(anyhow!(
                "--forwarding declares what the machine under the study's own testbed forwards; with --hosts the study builds none"
            ));
        }
        netgap::conditions::parse_rate_bps(f).map_err(|e| anyhow!(e.for_flag("--forwarding")))?;
    }
    let studies = if args.id == "all" {
        study::all()?
    } else {
        vec![study::load(&args.id)?]
    };
    if !args.figures.is_empty() && studies.len() > 1 {
        return Err(anyhow!("--figures picks figures of one study, not of all"));
    }
    if let Some(s) = studies.first() {
        study::check_figures(s, &args.figures)?;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let hosts = args
        .hosts
        .as_deref()
        .map(|h| HostsArg::parse(h).with_context(|| format!("--hosts {h}")))
        .transpose()?;
    if hosts.is_none() && !root && !args.plan {
        return Err(anyhow!(
            "without --hosts, netgap study builds the testbed each study needs, which needs root; run it as root or give --hosts @FILE"
        ));
    }
    let offer = hosts
        .as_ref()
        .map(|a| HostsOffer::of(a, root))
        .transpose()
        .context("--hosts")?;
    let to = Destination {
        hosts: hosts.clone().unwrap_or_else(|| HostsArg::File {
            path: netgap::cluster::state_dir(TESTBED_NAME).join("hosts.json"),
            testbed: false,
        }),
        key_file: args.key.clone(),
        json: args.out.join(results_name(&args.id)),
    };
    Ok(Asked {
        studies,
        hosts,
        offer,
        to,
        html: args.out.join(report_name(&args.id)),
    })
}

/// Study `s` planned: the figures asked for that the hosts (`offer`, or
/// its own testbed) can make, its budget, and their runs into `to`.
fn prepare(
    s: Study,
    args: &StudyArgs,
    offer: Option<&HostsOffer>,
    to: &Destination,
) -> Result<Prepared> {
    let offer = offer.cloned().unwrap_or_else(|| HostsOffer::testbed(&s));
    let chosen = study::choose_figures(&s, &args.figures, &offer)?;
    let budget = study::Budget::of(args.budget, args.quick, &chosen.figures);
    let runs = study::plan(&s, &chosen.figures, budget.duration(), args.quick, to)?;
    let outcomes = chosen.outcomes;
    Ok(Prepared {
        study: s,
        budget,
        runs,
        outcomes,
        scaled: Vec::new(),
    })
}

/// Measures figure run `r` of `study` into the study's results file,
/// first putting the links of the study's own testbed (`on_testbed`) at
/// the rate the figure can have (and saying so in `scaled`); what became
/// of it. A failed run is said in one line, and the next figure waits
/// until the agents are free.
fn measure_figure(
    study: &Study,
    r: &FigureRun,
    on_testbed: bool,
    scaled: &mut Vec<String>,
    out: &Outputs,
    to: &Destination,
) -> Result<Outcome> {
    eprintln!(
        "netgap: study {} figure {}: {} points, {} repetitions of {} ms ({})",
        study.id,
        r.figure,
        r.points,
        r.reps,
        r.rep_ms,
        netgap::report::study::beside_paper(r.reps, &study.method)
    );
    let mut outcome = Outcome::Ran {
        reps: r.reps,
        rep_ms: r.rep_ms,
        missing: r.missing.clone(),
    };
    if on_testbed {
        if let Some(note) = scale_for(study, &r.figure)? {
            eprintln!("netgap: study {} figure {}: {note}", study.id, r.figure);
            scaled.push(format!("Figure {}: {note}.", r.figure));
        }
    }
    let t0 = std::time::Instant::now();
    for run in &r.runs {
        if let Err(e) = measure(&run.request(), &out.json, &to.json) {
            let line = crate::one_line(&e);
            eprintln!(
                "netgap: study {} figure {}: failed: {}",
                study.id,
                r.figure,
                netgap::text::escape_control(&line)
            );
            outcome = Outcome::Failed(line);
            wait_for_agents(&to.hosts, to.key_file.as_deref());
            break;
        }
    }
    eprintln!(
        "netgap: study {} figure {}: done in {:.1?}",
        study.id,
        r.figure,
        t0.elapsed()
    );
    Ok(outcome)
}

/// Reads the study's records back and writes the report of `prepared`
/// into `out`, then says where both are.
fn write_report(prepared: &[Prepared], quick: bool, out: &Outputs, asked: &Asked) -> Result<()> {
    use std::io::Write;
    let json = &asked.to.json;
    let records = read_records(&out.json, json)?;
    let runs: Vec<StudyRun<'_>> = prepared
        .iter()
        .map(|p| StudyRun {
            study: &p.study,
            outcomes: p.outcomes.clone(),
            notes: std::iter::once(format!(
                "Budget {} for the study{}; results in {}.",
                p.budget.describe(),
                match p.budget {
                    study::Budget::Given(_) if quick => ", with --quick's points",
                    _ => "",
                },
                json.display()
            ))
            .chain(p.scaled.iter().cloned())
            .collect(),
        })
        .collect();
    let report = netgap::report::study::render(&runs, &records);
    (&out.html)
        .write_all(report.as_bytes())
        .with_context(|| format!("writing {}", asked.html.display()))?;
    println!("results: {}", json.display());
    println!("report: {}", asked.html.display());
    Ok(())
}

/// Prints what `prepared` would run (`--plan`) on `hosts` (`--hosts`, or
/// each study's own testbed).
fn print_plan(prepared: &[Prepared], hosts: Option<&str>) {
    let mut time_ms = 0;
    for p in prepared {
        let not_run: Vec<(String, String)> = p
            .outcomes
            .iter()
            .filter_map(|(id, o)| match o {
                Outcome::Skipped(why) => Some((id.clone(), why.clone())),
                Outcome::NotAsked => Some((id.clone(), "not asked for (--figures)".into())),
                _ => None,
            })
            .collect();
        let hosts = match hosts {
            Some(h) => format!("--hosts {h}"),
            None => study::testbed_text(&p.study),
        };
        print!(
            "{}",
            study::plan_text(&p.study, &p.budget, &hosts, &p.runs, &not_run)
        );
        time_ms += p.runs.iter().map(|r| r.time_ms).sum::<u64>();
    }
    if prepared.len() > 1 {
        println!(
            "all: about {} for the {} studies, with each testbed's building on top",
            humantime::format_duration(Duration::from_secs(time_ms.div_ceil(1000))),
            prepared.len()
        );
    }
}

/// The results file of study (or `all`) `id`.
fn results_name(id: &str) -> String {
    format!("netgap-study-{id}.jsonl")
}

/// The report of study (or `all`) `id`.
fn report_name(id: &str) -> String {
    format!("netgap-study-{id}.html")
}

/// What a study writes in its `-o` directory, made before anything runs:
/// the directory, opened once and checked on its descriptor (this user's,
/// writable by nobody else, not a link; made 0700 if missing), and in it
/// the results file and the report, each created new (`O_CREAT | O_EXCL |
/// O_NOFOLLOW`) relative to the directory's descriptor and written through
/// the descriptor kept here. A link another user plants there, or a file
/// already there, is refused in one line, and nothing is written through
/// it.
struct Outputs {
    /// The results file.
    json: File,
    /// The report, written when the study ends.
    html: File,
}

/// What to do about a refused output directory.
const OUT_REMEDY: &str = "pass -o a directory of yours that no other user can write, or a new one";

impl Outputs {
    /// Opens `dir` and creates study `id`'s results file and report in it.
    fn create(dir: &Path, id: &str) -> Result<Outputs> {
        use netgap::confined::{ConfinedError, Dir};
        let abs = std::path::absolute(dir).with_context(|| format!("-o {}", dir.display()))?;
        let d = Dir::open_base(&abs, "a study's output directory", OUT_REMEDY, 0o700)?;
        let create = |name: &str| {
            d.create_file(name, 0o644).map_err(|e| match e {
                ConfinedError::Io { source, .. }
                    if source.kind() == std::io::ErrorKind::AlreadyExists =>
                {
                    anyhow!(
                        "refusing {}: it exists (a study writes only files it makes new, and never through a link); remove it or pass -o another directory",
                        dir.join(name).display()
                    )
                }
                e => e.into(),
            })
        };
        let json_name = results_name(id);
        let json = create(&json_name)?;
        let html = match create(&report_name(id)) {
            Ok(f) => f,
            Err(e) => {
                // Only what this study made goes.
                let _ = d.remove_file(&json_name);
                return Err(e);
            }
        };
        Ok(Outputs { json, html })
    }
}

/// How long a failed figure's agents get to finish its roles.
const AGENTS_FREE_WITHIN: Duration = Duration::from_secs(20);

/// After a failed figure, waits (up to [`AGENTS_FREE_WITHIN`]) until every
/// agent of the hosts file takes a session again (proving `key`, else the
/// file's own), so the failure's roles, still winding down on an agent, do
/// not fail the next figure too.
fn wait_for_agents(hosts: &HostsArg, key: Option<&Path>) {
    let Ok(netgap::cluster::HostsSource::File(file)) = hosts.load() else {
        return;
    };
    let key = key.or(file.key_file.as_deref());
    let t0 = std::time::Instant::now();
    for h in &file.hosts {
        while netgap::testbed::probe_agent(h, key, &CoordinatorProbe).is_err()
            && t0.elapsed() < AGENTS_FREE_WITHIN
        {
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

/// Puts the study's testbed links at the study's rate, or at the rate the
/// machine carries for figure `figure` ([`netgap::testbed::scale_rate`]);
/// the sentence saying so when it scaled.
fn scale_for(study: &Study, figure: &str) -> Result<Option<String>> {
    let (Some(rate), Some(fig)) = (study.testbed.rate.as_deref(), study.figure(figure)) else {
        return Ok(None);
    };
    let asked = netgap::conditions::parse_rate_bps(rate)
        .map_err(|e| anyhow!("study {}: rate {rate:?}: {e}", study.id))?;
    let shapers = study::shapers_at_once(study, fig);
    let scaled = netgap::testbed::scale_rate(TESTBED_NAME, asked, shapers).with_context(|| {
        format!(
            "study {} figure {figure}: setting its links' rate",
            study.id
        )
    })?;
    Ok(scaled.map(|s| {
        use netgap::testbed::capacity::{rate_text, CARRY_SHARE};
        format!(
            "links at {} instead of the study's {}: {shapers} shaped link directions at once at {} \
             would take more than {:.0}% of the {:.1} Gbit/s this machine forwards through the \
             testbed's shapers (ratios between its points hold at any rate)",
            rate_text(s.to_bps),
            rate_text(s.from_bps),
            rate_text(s.from_bps),
            100.0 * CARRY_SHARE,
            s.forwarding_gbps
        )
    }))
}

/// Builds the testbed `study` needs for `command`, held until dropped.
fn build_testbed(
    study: &Study,
    command: &str,
    forwarding: Option<&str>,
) -> Result<netgap::testbed::OwnedTestbed> {
    let t = &study.testbed;
    let request = testbed_request(study, forwarding)?;
    eprintln!(
        "netgap: study {}: building its testbed ({} hosts, {:?}{})",
        study.id,
        t.hosts,
        t.topology,
        t.rate
            .as_deref()
            .map(|r| format!(", links at {r}"))
            .unwrap_or_default()
    );
    let (testbed, status) =
        netgap::testbed::OwnedTestbed::up(&request, command, &CoordinatorProbe, &mut |n| {
            super::testbed::print_note(&request.name, &n)
        })
        .with_context(|| format!("building study {}'s testbed", study.id))?;
    super::testbed::print_status(&status);
    Ok(testbed)
}

/// The `testbed up` request of the testbed `study` needs, on a machine
/// that forwards `forwarding` when the user declared it.
fn testbed_request(study: &Study, forwarding: Option<&str>) -> Result<netgap::testbed::UpRequest> {
    use netgap::study::data::Topology;
    let t = &study.testbed;
    let rate = |flag: &str, r: &str| {
        netgap::conditions::parse_rate_bps(r).map_err(|e| anyhow!(e.for_flag(flag)))
    };
    Ok(netgap::testbed::UpRequest {
        name: TESTBED_NAME.into(),
        hosts: t.hosts,
        topology: match t.topology {
            Topology::Switch => netgap::testbed::Topology::Switch,
            Topology::Mesh => netgap::testbed::Topology::Mesh,
        },
        links: t.links,
        mtu_bytes: netgap::testbed::DEFAULT_MTU_BYTES,
        rate_bps: t.rate.as_deref().map(|r| rate("--rate", r)).transpose()?,
        offload: None,
        delay_us: None,
        loss_ppm: None,
        forwarding_bps: forwarding.map(|f| rate("--forwarding", f)).transpose()?,
    })
}

/// Measures one run of a figure through its command's own function, on a
/// thread of its own: a run whose client plays in this process pins its
/// thread to the client's CPU (`--pin`), and the next figure, the next
/// testbed's `ip` commands and the teardown must start from this one's
/// thread as it was.
/// Its records go into `results` (held open since the study made it;
/// `path` names it), not into a file opened again by its `--json` path.
fn measure(request: &Request, results: &File, path: &Path) -> Result<()> {
    let results = super::measure::Results::Held {
        file: results,
        path,
    };
    std::thread::scope(|scope| {
        scope
            .spawn(move || match request {
                Request::Run { request, mpi } => super::measure::run(request, mpi, results),
                Request::Sweep(request) => super::measure::sweep(request, results),
                Request::Logp(request) => super::measure::logp(request, results),
            })
            .join()
            .unwrap_or_else(|_| Err(anyhow!("the figure's run panicked")))
    })
}

/// The records of the results file `file` (named `path`), read through its
/// descriptor from the start, typed; a line that is no record is refused
/// in one line naming its number in the file.
fn read_records(file: &File, path: &Path) -> Result<Vec<ResultRecord>> {
    use std::io::{Read, Seek};
    let cap = netgap::files::Cap::RESULTS;
    let reading = || format!("reading {}", path.display());
    let mut f = file;
    f.seek(std::io::SeekFrom::Start(0)).with_context(reading)?;
    let mut bytes = Vec::new();
    f.take(cap.max_bytes.saturating_add(1))
        .read_to_end(&mut bytes)
        .with_context(reading)?;
    if bytes.len() as u64 > cap.max_bytes {
        return Err(anyhow!(
            "{}: past the {} bytes {} may be",
            path.display(),
            cap.max_bytes,
            cap.what
        ));
    }
    let text = String::from_utf8(bytes).with_context(|| format!("{}: not text", path.display()))?;
    records_of(&text, path).map_err(Into::into)
}

/// The records of `text`, the results file `path`'s lines; blank lines
/// are skipped.
fn records_of(text: &str, path: &Path) -> Result<Vec<ResultRecord>, LoadError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|e| LoadError::BadLine {
                path: path.to_path_buf(),
                line: i + 1,
                message: e.to_string(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    /// The words a shell reads from `line`, a line `--plan` prints: only
    /// the quoting [`study::shell_word`] writes (single quotes, `'\''`
    /// for a quote) is undone.
    fn shell_words(line: &str) -> Vec<String> {
        let mut words = Vec::new();
        let (mut word, mut quoted, mut any) = (String::new(), false, false);
        for c in line.chars() {
            match c {
                '\'' => {
                    quoted = !quoted;
                    any = true;
                }
                '\\' if !quoted => {}
                ' ' if !quoted => {
                    if any || !word.is_empty() {
                        words.push(std::mem::take(&mut word));
                    }
                    any = false;
                }
                c => word.push(c),
            }
        }
        if any || !word.is_empty() {
            words.push(word);
        }
        words
    }

    /// What `line`, parsed with netgap's own flags, asks its command for.
    fn parsed(line: &str) -> Request {
        let cli = Cli::try_parse_from(shell_words(line)).unwrap_or_else(|e| panic!("{line}: {e}"));
        match cli.command {
            Some(Command::Run(f)) => Request::Run {
                request: f.request(),
                mpi: f.mpi.options(),
            },
            Some(Command::Sweep(f)) => Request::Sweep(f.request()),
            Some(Command::Logp(f)) => Request::Logp(f.request()),
            other => panic!("{line}: {other:?}"),
        }
    }

    /// Every run `study`'s plan prints, with and without `--quick`, parsed
    /// by clap, is the request the study measures: the line a user pastes
    /// measures what the study measured. The runs, for a caller's checks.
    fn printed_runs_parse_into_their_requests(
        s: &Study,
        to: &Destination,
    ) -> Vec<study::Invocation> {
        let figs: Vec<&study::data::Figure> = s.figures.iter().collect();
        let mut all = Vec::new();
        for quick in [false, true] {
            let budget =
                study::Budget::Given(study::least_budget(&figs, quick).max(study::DEFAULT_BUDGET));
            let runs = study::plan(s, &figs, budget.duration(), quick, to)
                .unwrap_or_else(|e| panic!("study {}: {e}", s.id));
            let text = study::plan_text(s, &budget, "here", &runs, &[]);
            let lines: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("    netgap "))
                .collect();
            let planned: Vec<&study::Invocation> = runs.iter().flat_map(|r| &r.runs).collect();
            assert_eq!(lines.len(), planned.len(), "{text}");
            for (line, run) in lines.iter().zip(planned) {
                let line = format!("netgap {line}");
                assert_eq!(parsed(&line), run.request(), "{line}");
                all.push(run.clone());
            }
        }
        all
    }

    /// The guard that a study's typed runs and the command lines `--plan`
    /// prints for them never drift apart: every study's every run, on its
    /// own testbed and on hosts given as `--hosts` is, read back by clap.
    #[test]
    fn every_planned_run_parsed_by_clap_is_the_request_the_study_measures() {
        for s in study::all().expect("studies") {
            for hosts in ["@/run/netgap/study/hosts.json", "@testbed", "@slurm:7200"] {
                let to = Destination {
                    hosts: HostsArg::parse(hosts).expect("hosts"),
                    // Agents started with a key, named in every run.
                    key_file: hosts
                        .starts_with("@slurm")
                        .then(|| PathBuf::from("/home/me/netgap key")),
                    json: PathBuf::from("./out dir/netgap-study-all.jsonl"),
                };
                printed_runs_parse_into_their_requests(&s, &to);
            }
        }
    }

    /// Every flag a figure may give, in every command that takes it,
    /// reads back through clap as the study typed it.
    #[test]
    fn every_flag_a_figure_gives_parses_by_clap_as_the_study_typed_it() {
        let figure = |id: &str, body: &str| {
            format!(
                "[[figure]]\nid = \"{id}\"\ncaption = \"c\"\ny = \"value\"\nseries = [\"transport\"]\n\
                 hosts = 2\npaper = \"p\"\nhere = \"h\"\n{body}\n"
            )
        };
        let text = [
            "id = \"009\"\n[citation]\nauthors = [\"A\"]\ntitle = \"T\"\nvenue = \"V\"\n\
             [method]\nreps = 10\ndrop_each_side = 1\ntext = \"t\"\n\
             [testbed]\nhosts = 4\ntopology = \"switch\"\nlinks = 2\ntext = \"t\"\n"
                .to_string(),
            figure(
                "p2p",
                "tests = [\"pingpong\", \"stream\"]\ntransports = [\"tcp\", \"unix\"]\n\
                 modes = [\"event\", \"poll\"]\nx = \"size\"\nsizes = \"1..4K\"\n\
                 quick_sizes = \"1,1K\"\n\
                 conditions = [\"mtu=1500,9000\", \"delay=0,250us\", \"loss=0,0.1%\", \"rate=1G\"]\n\
                 flags = [\"--sndbuf=512K\", \"--no-nodelay\", \"--busy-poll\", \"50\", \
                 \"--congestion\", \"bbr\", \"--pin\", \"0,1\", \"--warmup\", \"10\", \
                 \"--timeout\", \"3s\", \"--verify\", \"--align\", \"64\", \"--offset\", \"8\", \
                 \"--interleave\"]\n\
                 variants = [[], [\"--quickack\", \"--rcvbuf\", \"1M\"]]",
            ),
            figure(
                "web",
                "tests = [\"web\"]\nx = \"clients\"\nclients = [3, 6, 9]\n\
                 flags = [\"--server\", \"nginx\", \"--trace\", \"zipf\", \"--alpha\", \"0.4,1.0\", \
                 \"--connection-per-request\", \"--files\", \"72\"]\n\
                 quick_flags = [\"--files\", \"8\", \"--alpha\", \"1.0\"]",
            ),
            figure(
                "pio",
                "tests = [\"pio\"]\nx = \"size\"\nflags = [\"--op\", \"read,write\"]\n\
                 variants = [[\"--servers\", \"1\", \"--clients\", \"3\"], [\"--servers\", \"3\", \"--clients\", \"1\"]]",
            ),
            figure(
                "rail",
                "tests = [\"multirail\"]\nx = \"links\"\nlinks = [1, 2]\nflags = [\"--bidir\"]",
            ),
            figure(
                "streams",
                "tests = [\"multistream\"]\nx = \"streams\"\nflags = [\"-P\", \"1,4\"]",
            ),
            figure(
                "mpi",
                "tests = [\"mpi-latency\"]\nx = \"size\"\nflags = [\"--mpi-btl\", \"tcp\"]",
            ),
            figure(
                "sweep",
                "command = \"sweep\"\ntests = []\nx = \"size\"\nconditions = [\"offload=on,off\"]\n\
                 flags = [\"--start\", \"1K\", \"--end\", \"1M\", \"--factor\", \"1.5\", \
                 \"--stream\", \"--max-block-time\", \"500ms\", \"--interleave\", \"--quickack\"]\n\
                 quick_flags = [\"--perturbation\", \"0\"]",
            ),
            figure("bare-sweep", "command = \"sweep\"\ntests = []\nx = \"size\""),
            figure(
                "logp",
                "command = \"logp\"\ntests = []\nx = \"size\"\nsizes = \"1,1K\"\n\
                 flags = [\"--pin\", \"0\", \"--warmup\", \"5\", \"--sndbuf\", \"64K\"]",
            ),
        ]
        .concat();
        let s = Study::parse("test", &text).expect("parses");
        study::check_names(&s).expect("names");
        study::check_flags(&s).expect("flags");
        let to = Destination {
            hosts: HostsArg::parse("@testbed").expect("hosts"),
            key_file: None,
            json: PathBuf::from("r.jsonl"),
        };
        let runs = printed_runs_parse_into_their_requests(&s, &to);
        // Each flag made it onto a line (a flag lost on both sides would
        // read back the same).
        let lines: Vec<String> = runs.iter().map(|r| r.argv().join(" ")).collect();
        for flag in [
            "--sndbuf 512K", "--no-nodelay", "--busy-poll 50", "--congestion bbr", "--pin 0,1",
            "--warmup 10", "--timeout 3000ms", "--verify", "--align 64", "--offset 8",
            "--interleave", "--quickack --rcvbuf 1M", "-s 1,2,4,8,16,32,64,128,256,512,1K,2K,4K",
            "--mode event,poll", "--conditions mtu=1500,9000 delay=0us,250us loss=0%,0.1% rate=1000000000",
            "--server nginx --trace zipf --alpha 0.4,1.0 --connection-per-request --files 72",
            "--alpha 1.0 --connection-per-request --files 8", "--clients 3,6,9", "--clients 3,9",
            "--servers 3 --clients 1", "--links 1,2", "--bidir", "-P 1,4", "--mpi-btl tcp",
            "--start 1K --end 1M --factor 1.5 --stream --max-block-time 500ms --interleave --quickack --perturbation 0",
            "--conditions offload=on,off", "--pin 0,0 --warmup 5 --sndbuf 64K", "--duration ",
            "--trial-time ",
        ] {
            assert!(lines.iter().any(|l| l.contains(flag)), "{flag}: {lines:#?}");
        }
    }

    /// A study whose testbed is `topology` with `links` links.
    fn study_on(topology: &str, links: u32) -> Study {
        let text = format!(
            r#"
id = "009"
[citation]
authors = ["A. Author"]
title = "T"
venue = "V"
year = 2000
[method]
reps = 3
drop_each_side = 0
text = "3 runs"
[testbed]
hosts = 4
topology = "{topology}"
links = {links}
text = "four hosts"
[[figure]]
id = "1"
caption = "Latency"
tests = ["pingpong"]
x = "size"
y = "latency_us"
series = ["transport"]
hosts = 2
paper = "p"
here = "h"
"#
        );
        Study::parse("test", &text).expect("parses")
    }

    /// A study reads its records back typed, and a line that is none is
    /// refused in one line naming the file's own line number (blank lines
    /// counted).
    #[test]
    fn records_read_back_typed_and_a_bad_line_is_named_in_one_line() {
        let path = Path::new("/out/netgap-study-004.jsonl");
        let record = ResultRecord::new(netgap::record::RecordHead {
            test: "pingpong".into(),
            transport: "tcp".into(),
            mode: netgap::spec::Mode::Event,
            size_bytes: 64,
            metric: "latency_us".into(),
            value: 12.5,
            time: "2024-01-01T00:00:00Z".into(),
        });
        let line = serde_json::to_string(&record).expect("a record writes");
        let read = records_of(&format!("{line}\n\n{line}\n"), path).expect("two records");
        assert_eq!(read, [record.clone(), record]);
        let e = records_of(&format!("{line}\n\n{{\"test\": 3}}\n"), path)
            .expect_err("not a record")
            .to_string();
        assert!(
            e.starts_with("/out/netgap-study-004.jsonl:3: not a netgap result record: "),
            "{e}"
        );
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn a_study_testbed_on_a_switch_may_have_a_switch_per_link() {
        let p = testbed_request(&study_on("switch", 2), None)
            .expect("a request")
            .params()
            .expect("a switch with two links");
        assert_eq!(
            (p.hosts, p.topology, p.links),
            (4, netgap::testbed::Topology::Switch, 2)
        );
        let p = testbed_request(&study_on("mesh", 3), Some("3G"))
            .expect("a request")
            .params()
            .expect("a mesh");
        assert_eq!((p.topology, p.links), (netgap::testbed::Topology::Mesh, 3));
        // A declared machine goes to the testbed as it was given.
        assert_eq!(p.forwarding_bps, Some(3_000_000_000));
    }
}
