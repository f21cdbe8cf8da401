//! One run of a study's figure, typed: what `netgap run`, `sweep` or
//! `logp` is given, built from the figure without a command line.
//! [`Invocation::request`] is the typed request the command measures from,
//! the same one its own flags map to, and [`Invocation::argv`] the command
//! line that measures it by hand, which `netgap study --plan` prints. The
//! binary's tests parse that line with the commands' own flags and check
//! that it gives the same request, so the two cannot drift apart.
//!
//! A figure's further flags (its `flags`, `quick_flags` and variants) are
//! typed here ([`parse_flags`]) when its study is loaded: each is a flag of
//! its command that the planner does not set itself, parsed by the same
//! library parsers as the command line's, and kept in the order the study
//! file gives it, so the printed line reads like the file.

use crate::cluster::HostsArg;
use crate::conditions::ConditionAxis;
use crate::mpi::launch::LocalBtl;
use crate::mpi::plan::MpiOptions;
use crate::plan::{
    BufferFlags, Interleaving, MethodSpec, MultiHostSpec, OptionSetting, Outputs, Pin, RunRequest,
    Target, TransportChoice,
};
use crate::spec::Mode;
use crate::sweep::{SweepKind, SweepRequest};
use crate::transport::options::{self as topt, OptionKind, OptionValue};
use crate::units::{format_size, parse_duration, parse_size_bytes};
use crate::workload::options as wopt;
use netgap_core::study::FigureCommand;
use std::path::PathBuf;
use std::time::Duration;

/// Why a figure's flags cannot be given to its command; one clause, which
/// the study's error prefixes with the study and figure.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum FlagError {
    /// Not a flag of the command, or not one a figure may give.
    #[error("{flag}: not a flag of netgap {command} that a figure can give (see netgap {command} --help)")]
    Unknown {
        /// The flag as written.
        flag: String,
        /// The command.
        command: &'static str,
    },
    /// A flag the planner sets from the figure's own fields, the budget
    /// and the hosts.
    #[error("{flag}: the study sets it itself; give the figure's own field instead")]
    Planned {
        /// The flag as written.
        flag: String,
    },
    /// A word where a flag should be.
    #[error("{word:?} follows no flag that takes a value")]
    Stray {
        /// The word.
        word: String,
    },
    /// A flag that takes a value, last without one.
    #[error("{flag} needs a value")]
    NoValue {
        /// The flag.
        flag: String,
    },
    /// A switch given a value (`--bidir=yes`).
    #[error("{flag} takes no value")]
    SwitchValue {
        /// The flag.
        flag: String,
    },
    /// A value its flag does not take.
    #[error("{flag} {value}: {why}")]
    BadValue {
        /// The flag.
        flag: String,
        /// The value as written.
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// A flag given twice, or given as a flag and as the figure's own
    /// field (`--clients` beside `clients`).
    #[error("{flag} is given twice")]
    Twice {
        /// The flag.
        flag: String,
    },
    /// Two flags the command takes only one of.
    #[error("{first} and {second} cannot be given together")]
    Conflict {
        /// One flag.
        first: &'static str,
        /// The other.
        second: &'static str,
    },
}

/// A flag every measuring command takes (`run`, `sweep`, `logp`).
#[derive(Debug, Clone, PartialEq)]
pub enum StackFlag {
    /// A transport's own option (`--sndbuf 512K`, `--no-nodelay`).
    Option(OptionSetting),
    /// `--pin C,S`.
    Pin(Pin),
    /// `--warmup N`.
    Warmup(u64),
    /// `--timeout DUR`.
    Timeout(Duration),
    /// `--verify`.
    Verify,
    /// `--align BYTES`.
    Align(u64),
    /// `--offset BYTES`.
    Offset(u64),
}

/// A flag of `netgap run`'s own.
#[derive(Debug, Clone, PartialEq)]
pub enum RunFlag {
    /// A flag every command takes.
    Stack(StackFlag),
    /// A workload's own option (`--preset vm`, `--connection-per-request`):
    /// its flag without the dashes and its value as text (empty for a
    /// switch), which the workload plan parses, as from the command line.
    Workload {
        /// The option's flag, without the leading dashes.
        flag: &'static str,
        /// The value as written.
        value: String,
    },
    /// `--clients N,...`.
    Clients(Vec<u32>),
    /// `-P N,...`.
    Streams(Vec<u32>),
    /// `--links K,...`.
    Links(Vec<u32>),
    /// `--bidir`.
    Bidir,
    /// `--mpi-btl BTL`.
    MpiBtl(LocalBtl),
    /// `--interleave`.
    Interleave,
}

/// A flag of `netgap sweep`'s own.
#[derive(Debug, Clone, PartialEq)]
pub enum SweepFlag {
    /// A flag every command takes.
    Stack(StackFlag),
    /// `--start SIZE`, bytes.
    Start(u64),
    /// `--end SIZE`, bytes.
    End(u64),
    /// `--factor F`.
    Factor(f64),
    /// `--perturbation BYTES`.
    Perturbation(u64),
    /// `--stream`.
    Stream,
    /// `--bidir`.
    Bidir,
    /// `--max-block-time DUR`.
    MaxBlockTime(Duration),
    /// `--interleave`.
    Interleave,
}

/// The command of a figure's run, with what only it takes.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// `netgap run TESTS`.
    Run {
        /// The tests.
        tests: Vec<String>,
        /// Every test is a workload, whose repetition is a window
        /// (`--duration`) instead of a time budget (`--rep-time`).
        workload: bool,
        /// `-s`, bytes; `None`: the tests' own default.
        sizes: Option<Vec<u64>>,
        /// The figure's `--clients` axis.
        clients: Option<Vec<u32>>,
        /// The figure's `-P` axis.
        streams: Option<Vec<u32>>,
        /// The figure's `--links` axis.
        links: Option<Vec<u32>>,
        /// Its further flags, in the study file's order.
        flags: Vec<RunFlag>,
    },
    /// `netgap sweep`.
    Sweep {
        /// Its further flags, in the study file's order.
        flags: Vec<SweepFlag>,
    },
    /// `netgap logp`.
    Logp {
        /// `-s`, bytes; `None`: logp's default.
        sizes: Option<Vec<u64>>,
        /// Its further flags, in the study file's order.
        flags: Vec<StackFlag>,
    },
}

impl Command {
    /// The command's name.
    pub fn name(&self) -> &'static str {
        match self {
            Command::Run { .. } => "run",
            Command::Sweep { .. } => "sweep",
            Command::Logp { .. } => "logp",
        }
    }
}

/// One run of a figure, typed: everything its command line says.
#[derive(Debug, Clone, PartialEq)]
pub struct Invocation {
    /// The command and what only it takes.
    pub command: Command,
    /// `-t`; empty: the command's default (tcp).
    pub transports: Vec<String>,
    /// `--mode`; empty: the default (event).
    pub modes: Vec<Mode>,
    /// Repetitions of each point (`--reps`; a sweep's `--trials`).
    pub reps: u32,
    /// Time of one repetition (`--rep-time`; a workload's `--duration`, a
    /// sweep's `--trial-time`).
    pub rep_time: Duration,
    /// `--conditions`.
    pub conditions: Vec<ConditionAxis>,
    /// `--hosts`.
    pub hosts: HostsArg,
    /// `--key`: the shared key file of the hosts' agents.
    pub key_file: Option<PathBuf>,
    /// `--json`: the results file, named in the records' messages.
    pub json: PathBuf,
    /// `--label`: the study and figure, which the report finds records by.
    pub label: String,
}

/// What a figure's run measures: the typed request of `netgap run`,
/// `sweep` or `logp`, which the command measures through the same function
/// whether its flags or a study made it.
#[derive(Debug, Clone, PartialEq)]
pub enum Request {
    /// `netgap run`.
    Run {
        /// The request.
        request: RunRequest,
        /// The MPI tests' own flags.
        mpi: MpiOptions,
    },
    /// `netgap sweep`.
    Sweep(SweepRequest),
    /// `netgap logp`.
    Logp(RunRequest),
}

/// The flags every command takes, gathered.
#[derive(Default)]
struct Stack {
    options: Vec<OptionSetting>,
    pin: Option<Pin>,
    warmup: Option<u64>,
    timeout: Option<Duration>,
    verify: bool,
    buffer: BufferFlags,
}

impl Stack {
    /// The method of a run of `sizes` with these stack flags: `reps`
    /// repetitions of `rep_time` each (none: the workload's own window).
    fn method(&self, sizes: Option<Vec<u64>>, reps: u32, rep_time: Option<Duration>) -> MethodSpec {
        MethodSpec {
            sizes,
            reps: Some(reps),
            rep_time,
            warmup: self.warmup,
            timeout: self.timeout,
            pin: self.pin,
            verify: self.verify,
            buffer: self.buffer,
            ..MethodSpec::default()
        }
    }

    fn of<'a>(flags: impl Iterator<Item = &'a StackFlag>) -> Stack {
        let mut s = Stack::default();
        for f in flags {
            match f {
                StackFlag::Option(o) => s.options.push(o.clone()),
                StackFlag::Pin(p) => s.pin = Some(*p),
                StackFlag::Warmup(n) => s.warmup = Some(*n),
                StackFlag::Timeout(d) => s.timeout = Some(*d),
                StackFlag::Verify => s.verify = true,
                StackFlag::Align(n) => s.buffer.align_bytes = Some(*n),
                StackFlag::Offset(n) => s.buffer.offset_bytes = Some(*n),
            }
        }
        // The command line gives the options in their declarations' order,
        // whatever order they were typed in.
        let all = topt::all();
        s.options
            .sort_by_key(|o| all.iter().position(|d| d.flag == o.decl.flag));
        s
    }
}

impl Invocation {
    /// The typed request the command measures: what its flags map to when
    /// [`Invocation::argv`] is given on the command line.
    pub fn request(&self) -> Request {
        match &self.command {
            Command::Run {
                tests,
                workload,
                sizes,
                clients,
                streams,
                links,
                flags,
            } => {
                let axes = MultiHostSpec {
                    clients: clients.clone(),
                    streams: streams.clone(),
                    duration: workload.then_some(self.rep_time),
                    links: links.clone(),
                    ..MultiHostSpec::default()
                };
                self.run_request(tests, *workload, sizes, axes, flags)
            }
            Command::Sweep { flags } => Request::Sweep(self.sweep_request(flags)),
            Command::Logp { sizes, flags } => Request::Logp(self.logp_request(sizes, flags)),
        }
    }

    /// `netgap run`'s request: `tests` at `sizes` over the figure's count
    /// axes (`axes`), its further flags applied in the study file's order.
    fn run_request(
        &self,
        tests: &[String],
        workload: bool,
        sizes: &Option<Vec<u64>>,
        axes: MultiHostSpec,
        flags: &[RunFlag],
    ) -> Request {
        let stack = Stack::of(flags.iter().filter_map(|f| match f {
            RunFlag::Stack(s) => Some(s),
            _ => None,
        }));
        let mut multi_host = axes;
        let mut mpi = MpiOptions::default();
        let mut interleave = false;
        for f in flags {
            match f {
                RunFlag::Stack(_) => {}
                RunFlag::Workload { flag, value } => multi_host
                    .workload_options
                    .push((flag.to_string(), value.clone())),
                RunFlag::Clients(c) => multi_host.clients = Some(c.clone()),
                RunFlag::Streams(c) => multi_host.streams = Some(c.clone()),
                RunFlag::Links(c) => multi_host.links = Some(c.clone()),
                RunFlag::Bidir => multi_host.bidir = true,
                RunFlag::MpiBtl(b) => mpi.btl = Some(*b),
                RunFlag::Interleave => interleave = true,
            }
        }
        // In the declarations' order, as the command line gives them.
        let all = wopt::all();
        multi_host
            .workload_options
            .sort_by_key(|(flag, _)| all.iter().position(|d| d.flag == flag));
        let request = RunRequest {
            tests: tests.to_vec(),
            target: self.target(),
            key_file: self.key_file.clone(),
            // Before `transport`, which takes the stack's options.
            method: stack.method(
                sizes.clone(),
                self.reps,
                (!workload).then_some(self.rep_time),
            ),
            transport: self.transport(stack.options),
            outputs: self.outputs(),
            multi_host,
            interleaving: self.interleaving(interleave),
        };
        Request::Run { request, mpi }
    }

    /// `netgap sweep`'s request, its further flags applied in the study
    /// file's order.
    fn sweep_request(&self, flags: &[SweepFlag]) -> SweepRequest {
        let stack = Stack::of(flags.iter().filter_map(|f| match f {
            SweepFlag::Stack(s) => Some(s),
            _ => None,
        }));
        let mut r = SweepRequest {
            trial_time: self.rep_time,
            trials: self.reps,
            target: self.target(),
            key_file: self.key_file.clone(),
            transport: self.transport(stack.options),
            warmup: stack.warmup,
            timeout: stack.timeout,
            pin: stack.pin,
            verify: stack.verify,
            buffer: stack.buffer,
            outputs: self.outputs(),
            ..SweepRequest::new()
        };
        let mut interleave = false;
        for f in flags {
            match f {
                SweepFlag::Stack(_) => {}
                SweepFlag::Start(b) => r.start_bytes = *b,
                SweepFlag::End(b) => r.end_bytes = *b,
                SweepFlag::Factor(x) => r.factor = Some(*x),
                SweepFlag::Perturbation(b) => r.perturbation_bytes = *b,
                SweepFlag::Stream => r.kind = SweepKind::Stream,
                SweepFlag::Bidir => r.kind = SweepKind::Bidir,
                SweepFlag::MaxBlockTime(d) => r.max_block_time = *d,
                SweepFlag::Interleave => interleave = true,
            }
        }
        r.interleaving = self.interleaving(interleave);
        r
    }

    /// `netgap logp`'s request at `sizes`.
    fn logp_request(&self, sizes: &Option<Vec<u64>>, flags: &[StackFlag]) -> RunRequest {
        let stack = Stack::of(flags.iter());
        RunRequest {
            tests: Vec::new(),
            target: self.target(),
            key_file: self.key_file.clone(),
            method: stack.method(sizes.clone(), self.reps, Some(self.rep_time)),
            transport: self.transport(stack.options),
            outputs: self.outputs(),
            multi_host: MultiHostSpec::default(),
            interleaving: Interleaving::default(),
        }
    }

    /// `-t` and `--mode` (the command's defaults when the figure gives
    /// none) with the stack's transport `options`.
    fn transport(&self, options: Vec<OptionSetting>) -> TransportChoice {
        let defaults = TransportChoice::default();
        TransportChoice {
            transports: if self.transports.is_empty() {
                defaults.transports
            } else {
                self.transports.clone()
            },
            modes: if self.modes.is_empty() {
                defaults.modes
            } else {
                self.modes.clone()
            },
            options,
        }
    }

    /// `--hosts`.
    fn target(&self) -> Target {
        Target {
            hosts: Some(self.hosts.clone()),
            ..Target::default()
        }
    }

    /// `--json` and `--label`.
    fn outputs(&self) -> Outputs {
        Outputs {
            json: Some(self.json.clone()),
            csv: None,
            label: Some(self.label.clone()),
        }
    }

    /// `--conditions`, interleaved when the figure says `--interleave`.
    fn interleaving(&self, interleave: bool) -> Interleaving {
        Interleaving {
            conditions: self.conditions.clone(),
            interleave,
        }
    }

    /// The command line that measures this run by hand, without the
    /// program's name: the command, its tests, `-t`, `--mode`, `-s`, the
    /// count axes, the repetitions and their time, the figure's further
    /// flags in the study file's order, `--conditions`, and the hosts,
    /// results file and label.
    pub fn argv(&self) -> Vec<String> {
        let mut a: Vec<String> = vec![self.command.name().to_string()];
        let push = |a: &mut Vec<String>, flag: &str, value: String| {
            a.push(flag.to_string());
            a.push(value);
        };
        if let Command::Run { tests, .. } = &self.command {
            a.push(tests.join(","));
        }
        if !self.transports.is_empty() {
            push(&mut a, "-t", self.transports.join(","));
        }
        if !self.modes.is_empty() {
            let modes: Vec<&str> = self.modes.iter().map(|m| m.as_str()).collect();
            push(&mut a, "--mode", modes.join(","));
        }
        match &self.command {
            Command::Run {
                workload,
                sizes,
                clients,
                streams,
                links,
                flags,
                ..
            } => {
                if let Some(s) = sizes {
                    push(&mut a, "-s", sizes_text(s));
                }
                for (flag, counts) in [("--clients", clients), ("-P", streams), ("--links", links)]
                {
                    if let Some(c) = counts {
                        push(&mut a, flag, counts_text(c));
                    }
                }
                push(&mut a, "--reps", self.reps.to_string());
                let time = if *workload {
                    "--duration"
                } else {
                    "--rep-time"
                };
                push(&mut a, time, duration_text(self.rep_time));
                for f in flags {
                    f.words(&mut a);
                }
            }
            Command::Sweep { flags } => {
                push(&mut a, "--trials", self.reps.to_string());
                push(&mut a, "--trial-time", duration_text(self.rep_time));
                for f in flags {
                    f.words(&mut a);
                }
            }
            Command::Logp { sizes, flags } => {
                if let Some(s) = sizes {
                    push(&mut a, "-s", sizes_text(s));
                }
                push(&mut a, "--reps", self.reps.to_string());
                push(&mut a, "--rep-time", duration_text(self.rep_time));
                for f in flags {
                    f.words(&mut a);
                }
            }
        }
        if !self.conditions.is_empty() {
            a.push("--conditions".into());
            a.extend(self.conditions.iter().map(ToString::to_string));
        }
        push(&mut a, "--hosts", self.hosts.to_string());
        if let Some(k) = &self.key_file {
            push(&mut a, "--key", k.display().to_string());
        }
        push(&mut a, "--json", self.json.display().to_string());
        push(&mut a, "--label", self.label.clone());
        a
    }

    /// [`Invocation::argv`] as one line a shell reads back into it,
    /// `netgap` first.
    pub fn text(&self) -> String {
        let words: Vec<String> = self.argv().iter().map(|w| shell_word(w)).collect();
        format!("netgap {}", words.join(" "))
    }
}

/// `word` as a shell reads it back: as it is when it holds only
/// characters a shell leaves alone, else in single quotes.
pub fn shell_word(word: &str) -> String {
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "@%+=:,./_-".contains(c));
    if plain {
        word.to_string()
    } else {
        format!("'{}'", word.replace('\'', "'\\''"))
    }
}

/// Sizes as `-s` reads them (`1,1K,16K`).
fn sizes_text(sizes: &[u64]) -> String {
    let s: Vec<String> = sizes.iter().map(|b| format_size(*b)).collect();
    s.join(",")
}

/// Counts as `--clients` reads them (`3,12`).
fn counts_text(counts: &[u32]) -> String {
    let s: Vec<String> = counts.iter().map(u32::to_string).collect();
    s.join(",")
}

/// A duration as the command line reads it back exactly, in the largest
/// of ms, us and ns that holds it whole (`2000ms`, never `2s`, as the
/// planner's times are milliseconds).
fn duration_text(d: Duration) -> String {
    let ns = d.as_nanos();
    if ns.is_multiple_of(1_000_000) {
        format!("{}ms", ns / 1_000_000)
    } else if ns.is_multiple_of(1_000) {
        format!("{}us", ns / 1_000)
    } else {
        format!("{ns}ns")
    }
}

/// A typed flag written back as the command line takes it.
trait AsWords {
    /// Appends the flag and its value, if it takes one.
    fn words(&self, a: &mut Vec<String>);

    /// The flag's name as [`AsWords::words`] writes it: one per flag,
    /// however the study file spelt it (`-P`, `--streams`).
    fn name(&self) -> String {
        let mut w = Vec::new();
        self.words(&mut w);
        w.swap_remove(0)
    }
}

impl AsWords for StackFlag {
    fn words(&self, a: &mut Vec<String>) {
        let (flag, value) = match self {
            StackFlag::Option(o) => (
                o.decl.long(),
                match &o.value {
                    OptionValue::Switch => None,
                    OptionValue::Number(n) if o.decl.kind == OptionKind::Bytes => {
                        Some(format_size(*n))
                    }
                    OptionValue::Number(n) => Some(n.to_string()),
                    OptionValue::Name(s) => Some(s.clone()),
                },
            ),
            StackFlag::Pin(p) => (
                "--pin".into(),
                Some(format!("{},{}", p.client_cpu, p.server_cpu)),
            ),
            StackFlag::Warmup(n) => ("--warmup".into(), Some(n.to_string())),
            StackFlag::Timeout(d) => ("--timeout".into(), Some(duration_text(*d))),
            StackFlag::Verify => ("--verify".into(), None),
            StackFlag::Align(n) => ("--align".into(), Some(n.to_string())),
            StackFlag::Offset(n) => ("--offset".into(), Some(n.to_string())),
        };
        a.push(flag);
        a.extend(value);
    }
}

impl AsWords for RunFlag {
    fn words(&self, a: &mut Vec<String>) {
        let (flag, value): (String, Option<String>) = match self {
            RunFlag::Stack(s) => return s.words(a),
            RunFlag::Workload { flag, value } => {
                let switch = wopt::all()
                    .iter()
                    .any(|d| d.flag == *flag && d.kind == wopt::OptionKind::Switch);
                (format!("--{flag}"), (!switch).then(|| value.clone()))
            }
            RunFlag::Clients(c) => ("--clients".into(), Some(counts_text(c))),
            RunFlag::Streams(c) => ("-P".into(), Some(counts_text(c))),
            RunFlag::Links(c) => ("--links".into(), Some(counts_text(c))),
            RunFlag::Bidir => ("--bidir".into(), None),
            RunFlag::MpiBtl(b) => ("--mpi-btl".into(), Some(b.name().to_string())),
            RunFlag::Interleave => ("--interleave".into(), None),
        };
        a.push(flag);
        a.extend(value);
    }
}

impl AsWords for SweepFlag {
    fn words(&self, a: &mut Vec<String>) {
        let (flag, value): (&str, Option<String>) = match self {
            SweepFlag::Stack(s) => return s.words(a),
            SweepFlag::Start(b) => ("--start", Some(format_size(*b))),
            SweepFlag::End(b) => ("--end", Some(format_size(*b))),
            SweepFlag::Factor(x) => ("--factor", Some(x.to_string())),
            SweepFlag::Perturbation(b) => ("--perturbation", Some(b.to_string())),
            SweepFlag::Stream => ("--stream", None),
            SweepFlag::Bidir => ("--bidir", None),
            SweepFlag::MaxBlockTime(d) => ("--max-block-time", Some(duration_text(*d))),
            SweepFlag::Interleave => ("--interleave", None),
        };
        a.push(flag.to_string());
        a.extend(value);
    }
}

/// A figure's further flags, typed for its command.
#[derive(Debug, Clone, PartialEq)]
pub enum Flags {
    /// `run`'s.
    Run(Vec<RunFlag>),
    /// `sweep`'s.
    Sweep(Vec<SweepFlag>),
    /// `logp`'s.
    Logp(Vec<StackFlag>),
}

/// The flags the planner sets itself, per command: a figure giving one
/// would give it twice.
fn planned(command: FigureCommand) -> &'static [&'static str] {
    match command {
        FigureCommand::Run => &[
            "-t",
            "--transport",
            "--mode",
            "-s",
            "--sizes",
            "--reps",
            "--rep-time",
            "--duration",
            "--conditions",
            "--hosts",
            "--json",
            "--label",
        ],
        FigureCommand::Sweep => &[
            "-t",
            "--transport",
            "--mode",
            "--trials",
            "--trial-time",
            "--conditions",
            "--hosts",
            "--json",
            "--label",
        ],
        FigureCommand::Logp => &[
            "-t",
            "--transport",
            "--mode",
            "-s",
            "--sizes",
            "--reps",
            "--rep-time",
            "--hosts",
            "--json",
            "--label",
        ],
    }
}

/// The words after a flag: its value, written after `=` or as the next
/// word.
struct Words<'a> {
    rest: std::slice::Iter<'a, String>,
    flag: String,
    inline: Option<String>,
}

impl Words<'_> {
    /// The flag's value.
    fn value(&mut self) -> Result<String, FlagError> {
        match self.inline.take() {
            Some(v) => Ok(v),
            None => self.rest.next().cloned().ok_or_else(|| FlagError::NoValue {
                flag: self.flag.clone(),
            }),
        }
    }

    /// The flag's value, parsed by `parse`.
    fn parsed<T, E: std::fmt::Display>(
        &mut self,
        parse: impl FnOnce(&str) -> Result<T, E>,
    ) -> Result<T, FlagError> {
        let value = self.value()?;
        parse(&value).map_err(|e| FlagError::BadValue {
            flag: self.flag.clone(),
            value: value.clone(),
            why: e.to_string(),
        })
    }
}

/// Parses a number as clap parses `u64`, `u32` and `f64` values.
fn number<T: std::str::FromStr>(text: &str) -> Result<T, String> {
    text.parse::<T>()
        .map_err(|_| format!("{text:?} is not a number"))
}

/// A flag every command takes, if `name` is one.
fn stack_flag(name: &str, w: &mut Words<'_>) -> Option<Result<StackFlag, FlagError>> {
    Some(match name {
        "--pin" => w.parsed(Pin::parse).map(StackFlag::Pin),
        "--warmup" => w.parsed(number).map(StackFlag::Warmup),
        "--timeout" => w.parsed(parse_duration).map(StackFlag::Timeout),
        "--verify" => Ok(StackFlag::Verify),
        "--align" => w.parsed(number).map(StackFlag::Align),
        "--offset" => w.parsed(number).map(StackFlag::Offset),
        _ => {
            let decl = topt::find(name.strip_prefix("--")?)?;
            let value = match decl.kind {
                OptionKind::Switch => Ok(OptionValue::Switch),
                OptionKind::Bytes => w.parsed(parse_size_bytes).map(OptionValue::Number),
                OptionKind::Count => w.parsed(number).map(OptionValue::Number),
                OptionKind::Name => w.value().map(OptionValue::Name),
            };
            value.map(|value| StackFlag::Option(OptionSetting { decl, value }))
        }
    })
}

/// A flag of `run`, if `name` is one.
fn run_flag(name: &str, w: &mut Words<'_>) -> Option<Result<RunFlag, FlagError>> {
    Some(match name {
        "--clients" => w.parsed(crate::plan::parse_counts).map(RunFlag::Clients),
        "-P" | "--streams" => w.parsed(crate::plan::parse_counts).map(RunFlag::Streams),
        "--links" => w.parsed(crate::plan::parse_counts).map(RunFlag::Links),
        "--bidir" => Ok(RunFlag::Bidir),
        "--interleave" => Ok(RunFlag::Interleave),
        "--mpi-btl" => w
            .parsed(|v| {
                LocalBtl::by_name(v).ok_or("not a BTL netgap runs MPI over; choose vader or tcp")
            })
            .map(RunFlag::MpiBtl),
        _ => {
            let Some(decl) = name
                .strip_prefix("--")
                .and_then(|f| wopt::all().into_iter().find(|d| d.flag == f))
            else {
                return stack_flag(name, w).map(|f| f.map(RunFlag::Stack));
            };
            let value = match decl.kind {
                wopt::OptionKind::Switch => Ok(String::new()),
                _ => w.value(),
            };
            value.map(|value| RunFlag::Workload {
                flag: decl.flag,
                value,
            })
        }
    })
}

/// A flag of `sweep`, if `name` is one.
fn sweep_flag(name: &str, w: &mut Words<'_>) -> Option<Result<SweepFlag, FlagError>> {
    Some(match name {
        "--start" => w.parsed(parse_size_bytes).map(SweepFlag::Start),
        "--end" => w.parsed(parse_size_bytes).map(SweepFlag::End),
        "--factor" => w.parsed(number).map(SweepFlag::Factor),
        "--perturbation" => w.parsed(number).map(SweepFlag::Perturbation),
        "--stream" => Ok(SweepFlag::Stream),
        "--bidir" => Ok(SweepFlag::Bidir),
        "--max-block-time" => w.parsed(parse_duration).map(SweepFlag::MaxBlockTime),
        "--interleave" => Ok(SweepFlag::Interleave),
        _ => return stack_flag(name, w).map(|f| f.map(SweepFlag::Stack)),
    })
}

/// Parses `words`, a figure's further flags as the command line of
/// `command` takes them, into typed flags in
/// their order. `taken` are flags the figure's own fields already give
/// (`--clients` for its `clients`). Refuses what the command line would
/// (a flag it does not have, a bad value, a flag given twice, `--stream`
/// with `--bidir`) and a flag the planner sets itself.
pub fn parse_flags(
    command: FigureCommand,
    words: &[String],
    taken: &[&str],
) -> Result<Flags, FlagError> {
    let mut flags = match command {
        FigureCommand::Run => Flags::Run(Vec::new()),
        FigureCommand::Sweep => Flags::Sweep(Vec::new()),
        FigureCommand::Logp => Flags::Logp(Vec::new()),
    };
    let mut names: Vec<String> = taken.iter().map(|t| t.to_string()).collect();
    let mut rest = words.iter();
    while let Some(word) = rest.next() {
        if !word.starts_with('-') {
            return Err(FlagError::Stray { word: word.clone() });
        }
        let (name, inline) = match word.split_once('=') {
            Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
            _ => (word.clone(), None),
        };
        if planned(command).contains(&name.as_str()) {
            return Err(FlagError::Planned { flag: name });
        }
        let mut w = Words {
            rest,
            flag: name.clone(),
            inline,
        };
        let unknown = || FlagError::Unknown {
            flag: name.clone(),
            command: command.name(),
        };
        let canonical = match &mut flags {
            Flags::Run(l) => {
                let f = run_flag(&name, &mut w).ok_or_else(unknown)??;
                let n = f.name();
                l.push(f);
                n
            }
            Flags::Sweep(l) => {
                let f = sweep_flag(&name, &mut w).ok_or_else(unknown)??;
                let n = f.name();
                l.push(f);
                n
            }
            Flags::Logp(l) => {
                let f = stack_flag(&name, &mut w).ok_or_else(unknown)??;
                let n = f.name();
                l.push(f);
                n
            }
        };
        if w.inline.is_some() {
            return Err(FlagError::SwitchValue { flag: name });
        }
        rest = w.rest;
        if names.contains(&canonical) {
            return Err(FlagError::Twice { flag: canonical });
        }
        names.push(canonical);
    }
    if let Flags::Sweep(l) = &flags {
        let kinds = l
            .iter()
            .filter(|f| matches!(f, SweepFlag::Stream | SweepFlag::Bidir))
            .count();
        if kinds > 1 {
            return Err(FlagError::Conflict {
                first: "--stream",
                second: "--bidir",
            });
        }
    }
    Ok(flags)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn a_duration_reads_back_whole() {
        for d in [
            Duration::from_millis(2000),
            Duration::from_millis(8),
            Duration::from_micros(1500),
            Duration::from_nanos(2_000_001),
        ] {
            assert_eq!(parse_duration(&duration_text(d)), Ok(d));
        }
        assert_eq!(duration_text(Duration::from_secs(2)), "2000ms");
    }

    #[test]
    fn a_planned_command_line_reads_back_in_a_shell() {
        assert_eq!(shell_word("--rep-time"), "--rep-time");
        assert_eq!(
            shell_word("@/run/netgap/study/hosts.json"),
            "@/run/netgap/study/hosts.json"
        );
        assert_eq!(shell_word("study 000 figure 3a"), "'study 000 figure 3a'");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
        assert_eq!(shell_word(""), "''");
    }

    #[test]
    fn a_figure_s_flags_are_refused_as_the_command_line_refuses_them() {
        use FigureCommand::{Logp, Run, Sweep};
        let err = |command, text: &str| {
            parse_flags(command, &words(text), &["--clients"])
                .expect_err(text)
                .to_string()
        };
        assert!(err(Run, "--nope 3").starts_with("--nope: not a flag of netgap run"));
        assert!(err(Sweep, "--op read").starts_with("--op: not a flag of netgap sweep"));
        assert!(err(Logp, "--bidir").starts_with("--bidir: not a flag of netgap logp"));
        assert!(err(Run, "--reps 3").contains("the study sets it itself"));
        assert!(err(Run, "--pin 0,1 --pin 1").contains("--pin is given twice"));
        assert!(err(Run, "--clients 3").contains("--clients is given twice"));
        assert!(err(Run, "-P 1 --streams 2").contains("-P is given twice"));
        assert!(err(Run, "--sndbuf").contains("--sndbuf needs a value"));
        assert!(err(Run, "--sndbuf lots").starts_with("--sndbuf lots: "));
        assert!(err(Run, "--bidir=yes").contains("--bidir takes no value"));
        assert!(err(Run, "--pin 0,1 3").contains("\"3\" follows no flag"));
        assert!(err(Sweep, "--stream --bidir").contains("cannot be given together"));
        let f = parse_flags(Run, &words("--sndbuf=512K --bidir --preset vm"), &[]).expect("ok");
        let Flags::Run(f) = f else {
            panic!("run's flags: {f:?}")
        };
        assert_eq!(f.len(), 3);
        assert!(matches!(&f[2], RunFlag::Workload { flag: "preset", value } if value == "vm"));
    }
}
