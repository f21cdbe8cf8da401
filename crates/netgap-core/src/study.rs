//! A study as data: the paper it reproduces (cited), the figures it shows
//! (each figure's netgap tests and options, its x-axis and series, the
//! hosts it needs) and the claims it makes (the published number, where in
//! the paper, and how to judge it from records). A study file is TOML; it
//! is read into raw types that refuse unknown keys, then checked once into
//! the validated [`Study`]. Whether each figure's tests exist is checked
//! where the registries are (the `netgap` crate).

use crate::record::ResultRecord;
use serde::Deserialize;
use std::collections::BTreeMap;

/// Why a study file was refused; one line naming the study and what failed.
#[derive(Debug, thiserror::Error)]
pub enum StudyError {
    /// Not TOML of the study schema (an unknown key, a missing one).
    #[error("study file {file}: {message}")]
    Syntax {
        /// Which file.
        file: String,
        /// The parser's complaint, on one line.
        message: String,
    },
    /// A value that parses but means nothing.
    #[error("study {study}: {what}")]
    Invalid {
        /// The study's id.
        study: String,
        /// What is wrong, naming the figure or claim.
        what: String,
    },
}

/// The paper a study reproduces, cited as its text gives it.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Citation {
    /// Authors, in the paper's order.
    pub authors: Vec<String>,
    /// Title.
    pub title: String,
    /// Where it appeared (journal, proceedings, slides, web page).
    pub venue: String,
    /// Year of publication, when known.
    #[serde(default)]
    pub year: Option<u16>,
    /// What of the citation the text itself does not give, and so where
    /// it comes from.
    #[serde(default)]
    pub note: Option<String>,
}

impl Citation {
    /// "A, B and C. Title. Venue, year."
    pub fn line(&self) -> String {
        let authors = match self.authors.as_slice() {
            [] => String::new(),
            [one] => one.clone(),
            [init @ .., last] => format!("{} and {last}", init.join(", ")),
        };
        match self.year {
            Some(y) => format!("{authors}. {}. {}, {y}.", self.title, self.venue),
            None => format!("{authors}. {}. {}.", self.title, self.venue),
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStudy {
    id: String,
    citation: Citation,
    method: RawMethod,
    testbed: RawTestbed,
    #[serde(default)]
    figure: Vec<RawFigure>,
    #[serde(default)]
    claim: Vec<RawClaim>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawMethod {
    reps: u32,
    drop_each_side: u32,
    #[serde(default)]
    iterations: Option<u64>,
    text: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTestbed {
    hosts: u32,
    topology: String,
    #[serde(default = "one")]
    links: u32,
    #[serde(default)]
    rate: Option<String>,
    text: String,
}

fn one() -> u32 {
    1
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawFigure {
    id: String,
    caption: String,
    #[serde(default = "run")]
    command: String,
    tests: Vec<String>,
    #[serde(default)]
    transports: Vec<String>,
    #[serde(default)]
    modes: Vec<String>,
    #[serde(default)]
    sizes: Option<String>,
    #[serde(default)]
    conditions: Vec<String>,
    #[serde(default)]
    clients: Vec<u32>,
    #[serde(default)]
    streams: Vec<u32>,
    #[serde(default)]
    links: Vec<u32>,
    #[serde(default)]
    flags: Vec<String>,
    #[serde(default)]
    quick_flags: Vec<String>,
    #[serde(default)]
    quick_sizes: Option<String>,
    #[serde(default)]
    variants: Vec<Vec<String>>,
    x: String,
    y: String,
    series: Vec<String>,
    #[serde(default)]
    cpu: bool,
    hosts: u32,
    #[serde(default)]
    min_rep_ms: Option<u64>,
    paper: String,
    here: String,
}

fn run() -> String {
    "run".into()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawClaim {
    figure: String,
    #[serde(default)]
    from: Vec<String>,
    text: String,
    published: String,
    #[serde(rename = "where")]
    where_: String,
    kind: String,
    #[serde(default)]
    a: Option<BTreeMap<String, String>>,
    #[serde(default)]
    b: Option<BTreeMap<String, String>>,
    #[serde(default)]
    series: Option<BTreeMap<String, String>>,
    #[serde(default)]
    at: Option<String>,
    #[serde(default)]
    vs_at: Option<String>,
    #[serde(default)]
    metric: Option<String>,
    #[serde(default)]
    above: Option<f64>,
    #[serde(default)]
    below: Option<f64>,
    #[serde(default)]
    tolerance_pct: Option<f64>,
    #[serde(default, rename = "from_x")]
    from_x: Option<String>,
    #[serde(default, rename = "to_x")]
    to_x: Option<String>,
    #[serde(default)]
    why: Option<String>,
    #[serde(default)]
    published_value: Option<f64>,
    #[serde(default)]
    no_mechanism: Option<String>,
    #[serde(default)]
    size_tolerance_pct: Option<f64>,
    #[serde(default)]
    size_why: Option<String>,
}

/// A study, validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Study {
    /// Its id, `000` .. `004`.
    pub id: String,
    /// The paper.
    pub citation: Citation,
    /// The paper's method.
    pub method: StudyMethod,
    /// The testbed that makes every figure of the study.
    pub testbed: TestbedNeed,
    /// Its figures, in the paper's order.
    pub figures: Vec<Figure>,
    /// Its claims.
    pub claims: Vec<Claim>,
}

/// The paper's method: repetitions, how many of the highest and lowest
/// are dropped, iterations per repetition.
#[derive(Debug, Clone, PartialEq)]
pub struct StudyMethod {
    /// Repetitions of every experiment.
    pub reps: u32,
    /// Highest and lowest values dropped (each).
    pub drop_each_side: u32,
    /// Iterations of one repetition, when the paper states them.
    pub iterations: Option<u64>,
    /// The method in the paper's words.
    pub text: String,
}

/// How the hosts are wired.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// Every host on one switch.
    Switch,
    /// Direct links between the hosts.
    Mesh,
}

/// The testbed a study's figures need.
#[derive(Debug, Clone, PartialEq)]
pub struct TestbedNeed {
    /// Hosts.
    pub hosts: u32,
    /// Wiring.
    pub topology: Topology,
    /// Links per host pair (mesh).
    pub links: u32,
    /// Link rate, as `netgap testbed up --rate` takes it.
    pub rate: Option<String>,
    /// The paper's testbed and what stands in for it.
    pub text: String,
}

/// The netgap command a figure runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FigureCommand {
    /// `netgap run`.
    Run,
    /// `netgap sweep`.
    Sweep,
    /// `netgap logp`.
    Logp,
}

impl FigureCommand {
    /// The subcommand's name.
    pub fn name(self) -> &'static str {
        match self {
            FigureCommand::Run => "run",
            FigureCommand::Sweep => "sweep",
            FigureCommand::Logp => "logp",
        }
    }
}

/// What a figure plots along x.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum XAxis {
    /// Message size, bytes.
    Size,
    /// Concurrent clients.
    Clients,
    /// Parallel streams.
    Streams,
    /// Links used.
    Links,
    /// Web: the single file's size, bytes.
    FileSize,
    /// Web: the Zipf exponent.
    Alpha,
    /// Pipeline: the unit of work's size, bytes.
    UnitBytes,
    /// Gather: hosts asked.
    Hosts,
    /// Parallel I/O: servers and clients (1S/3C, 3S/1C).
    Shape,
    /// Sweep: each block's transmission time, microseconds (NetPIPE's
    /// signature graph: throughput against the time a block took).
    BlockTime,
}

impl XAxis {
    const ALL: [(&'static str, XAxis); 10] = [
        ("size", XAxis::Size),
        ("clients", XAxis::Clients),
        ("streams", XAxis::Streams),
        ("links", XAxis::Links),
        ("file_size", XAxis::FileSize),
        ("alpha", XAxis::Alpha),
        ("unit_bytes", XAxis::UnitBytes),
        ("hosts", XAxis::Hosts),
        ("shape", XAxis::Shape),
        ("block_time", XAxis::BlockTime),
    ];

    /// The axis's title in a plot.
    pub fn title(self) -> &'static str {
        match self {
            XAxis::Size => "message size (bytes)",
            XAxis::Clients => "clients",
            XAxis::Streams => "streams",
            XAxis::Links => "links",
            XAxis::FileSize => "file size (bytes)",
            XAxis::Alpha => "Zipf alpha",
            XAxis::UnitBytes => "unit of work (bytes)",
            XAxis::Hosts => "hosts",
            XAxis::Shape => "servers/clients",
            XAxis::BlockTime => "block time (µs)",
        }
    }

    /// Whether its values are bytes (a log axis of powers of two).
    pub fn is_bytes(self) -> bool {
        matches!(self, XAxis::Size | XAxis::FileSize | XAxis::UnitBytes)
    }
}

/// What sets one series of a figure apart from another; a record's value
/// of it is read from the record (the report crate).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Attr {
    /// The test.
    Test,
    /// The transport.
    Transport,
    /// The completion mode.
    Mode,
    /// The path's MTU.
    Mtu,
    /// The path's offloads.
    Offload,
    /// Web: the server program.
    Server,
    /// Web: the trace.
    Trace,
    /// Pipeline: the preset.
    Preset,
    /// Parallel I/O: the phase.
    Op,
    /// Parallel I/O: the access pattern.
    Pattern,
    /// Gather: what answers.
    Responder,
    /// Sweep: ping-pong, stream or bidirectional.
    Kind,
    /// The transport options set (`quickack`, `no_nodelay`, ...), or
    /// `defaults`.
    Options,
    /// The record's metric (LogP's overheads, gap and latency).
    Metric,
    /// The path's link rate, as the rate flags write it (`10M`, `1G`):
    /// one series per `rate=` condition.
    Rate,
    /// Links used at once (`--links`), when a figure plots another x.
    Links,
}

impl Attr {
    const ALL: [(&'static str, Attr); 16] = [
        ("test", Attr::Test),
        ("transport", Attr::Transport),
        ("mode", Attr::Mode),
        ("mtu", Attr::Mtu),
        ("offload", Attr::Offload),
        ("server", Attr::Server),
        ("trace", Attr::Trace),
        ("preset", Attr::Preset),
        ("op", Attr::Op),
        ("pattern", Attr::Pattern),
        ("responder", Attr::Responder),
        ("kind", Attr::Kind),
        ("options", Attr::Options),
        ("metric", Attr::Metric),
        ("rate", Attr::Rate),
        ("links", Attr::Links),
    ];

    /// Its name in a study file and in a series' label.
    pub fn name(self) -> &'static str {
        Attr::ALL
            .iter()
            .find(|(_, a)| *a == self)
            .map_or("?", |(n, _)| n)
    }
}

/// A figure: the netgap run that makes it and how it is plotted.
#[derive(Debug, Clone, PartialEq)]
pub struct Figure {
    /// The paper's number, e.g. `3a`.
    pub id: String,
    /// The paper's caption.
    pub caption: String,
    /// The command.
    pub command: FigureCommand,
    /// Tests (point-to-point tests, workloads or MPI tests).
    pub tests: Vec<String>,
    /// Transports (`-t`); empty: the command's default.
    pub transports: Vec<String>,
    /// Completion modes (`--mode`); empty: the default.
    pub modes: Vec<String>,
    /// Sizes (`-s`) as the command line takes them.
    pub sizes: Option<String>,
    /// `--conditions` axes, `KEY=V,V` each.
    pub conditions: Vec<String>,
    /// `--clients`.
    pub clients: Vec<u32>,
    /// `-P`.
    pub streams: Vec<u32>,
    /// `--links`.
    pub links: Vec<u32>,
    /// Further flags, as the command line takes them.
    pub flags: Vec<String>,
    /// Flags added under `--quick` (a smaller data set).
    pub quick_flags: Vec<String>,
    /// Sizes under `--quick`, instead of `sizes`.
    pub quick_sizes: Option<String>,
    /// Runs that make the figure together, each with these flags added
    /// (one run with none when empty): the study's series that one
    /// command line cannot cross, such as a transport option on and off.
    pub variants: Vec<Vec<String>>,
    /// The x-axis.
    pub x: XAxis,
    /// The quantity on y: a metric (`latency_us`, `bandwidth_gbps`, ...),
    /// or `value`: each record's headline, whatever its metric (LogP's
    /// parameters, told apart by the `metric` series).
    pub y: Quantity,
    /// What sets its series apart.
    pub series: Vec<Attr>,
    /// CPU utilisation shown beside.
    pub cpu: bool,
    /// Hosts it needs.
    pub hosts: u32,
    /// The shortest repetition that measures anything (a workload's
    /// window that holds one query), milliseconds.
    pub min_rep_ms: Option<u64>,
    /// What the paper's figure compares.
    pub paper: String,
    /// What stands in for it here.
    pub here: String,
    /// The counts along its clients, streams or links axis that a claim
    /// reads ([`Claim::x_values`], or a link count its series name,
    /// `links = "2"`): a `--quick` run, which keeps only the ends of such
    /// an axis, keeps these too, so no claim loses its point.
    pub claim_counts: Vec<u32>,
}

impl Figure {
    /// Whether it switches link conditions (needs root on a testbed).
    pub fn needs_conditions(&self) -> bool {
        !self.conditions.is_empty()
    }

    /// The values of `flag`'s lists in the figure's flags, quick flags and
    /// variants; `None` when none of them gives it.
    fn flag_values(&self, flag: &str) -> Option<Vec<String>> {
        let lists = [&self.flags, &self.quick_flags]
            .into_iter()
            .chain(self.variants.iter());
        let mut out: Vec<String> = Vec::new();
        let mut given = false;
        for l in lists {
            for w in l.windows(2) {
                if w[0] == flag {
                    given = true;
                    out.extend(w[1].split(',').map(|v| v.trim().to_string()));
                }
            }
        }
        given.then_some(out)
    }

    /// The values of `attr` this figure's records can have, where its
    /// declaration names them all: its tests, transports and modes, its
    /// conditions (`mtu`, `offload`), and the flags that set a workload's
    /// options (`--op`, `--pattern`, ...). `None` where the records take a
    /// default the figure does not name (and for `options`, `kind` and
    /// `metric`, which the measuring commands name).
    pub fn values_of(&self, attr: Attr) -> Option<Vec<String>> {
        let listed = |l: &[String]| (!l.is_empty()).then(|| l.to_vec());
        let condition = |key: &str| {
            self.conditions.iter().find_map(|c| {
                let (k, v) = c.split_once('=')?;
                (k.trim() == key).then(|| v.split(',').map(|v| v.trim().to_string()).collect())
            })
        };
        match attr {
            Attr::Test if self.command == FigureCommand::Run => listed(&self.tests),
            Attr::Transport => listed(&self.transports),
            Attr::Mode => listed(&self.modes),
            Attr::Mtu => condition("mtu"),
            Attr::Offload => condition("offload"),
            Attr::Server => self.flag_values("--server"),
            Attr::Trace => self.flag_values("--trace"),
            Attr::Preset => self.flag_values("--preset"),
            Attr::Op => self.flag_values("--op"),
            Attr::Pattern => self.flag_values("--pattern"),
            Attr::Responder => self.flag_values("--responder"),
            Attr::Rate => condition("rate"),
            Attr::Links => {
                (!self.links.is_empty()).then(|| self.links.iter().map(u32::to_string).collect())
            }
            _ => None,
        }
    }

    /// The transport options the figure's flags and variants can set, by
    /// the names records give them (`--no-nodelay` is `no_nodelay`; a
    /// record's `sndbuf_bytes=...` is named by `--sndbuf`).
    fn option_flags(&self) -> Vec<String> {
        [&self.flags, &self.quick_flags]
            .into_iter()
            .chain(self.variants.iter())
            .flatten()
            .filter_map(|f| f.strip_prefix("--"))
            .map(|f| f.replace('-', "_"))
            .collect()
    }

    /// Whether a record of this figure can have the options `value` (a
    /// comma-separated list of option names, `name=value` each, or
    /// `defaults`).
    fn admits_options(&self, value: &str) -> bool {
        let flags = self.option_flags();
        value == "defaults"
            || value.split(',').all(|o| {
                let name = o.split_once('=').map_or(o, |(n, _)| n).trim();
                flags
                    .iter()
                    .any(|f| name == f || name.starts_with(&format!("{f}_")))
            })
    }

    /// The x values the figure's declaration lists, where it lists them
    /// all: its sizes (and quick sizes), clients, streams, links or
    /// alphas. `None` for an axis whose values the measuring command
    /// chooses (a sweep's sizes, hosts, shapes).
    pub fn x_values(&self) -> Option<Vec<f64>> {
        let counts = |l: &[u32]| (!l.is_empty()).then(|| l.iter().map(|v| f64::from(*v)).collect());
        match self.x {
            XAxis::Size | XAxis::FileSize | XAxis::UnitBytes => {
                if self.command == FigureCommand::Sweep {
                    return None;
                }
                let mut out = Vec::new();
                for list in [&self.sizes, &self.quick_sizes].into_iter().flatten() {
                    let sizes = crate::units::parse_size_list(list).ok()?;
                    out.extend(sizes.into_iter().map(|b| b as f64));
                }
                (!out.is_empty()).then_some(out)
            }
            XAxis::Clients => counts(&self.clients),
            XAxis::Streams => counts(&self.streams),
            XAxis::Links => counts(&self.links),
            XAxis::Alpha => self
                .flag_values("--alpha")?
                .iter()
                .map(|a| a.parse::<f64>().ok())
                .collect(),
            XAxis::Hosts | XAxis::Shape | XAxis::BlockTime => None,
        }
    }
}

/// Which records a claim reads: every attribute named must match.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Selector(pub Vec<(Attr, String)>);

impl std::fmt::Display for Selector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let parts: Vec<String> = self
            .0
            .iter()
            .map(|(a, v)| format!("{}={v}", a.name()))
            .collect();
        if parts.is_empty() {
            f.write_str("every series")
        } else {
            f.write_str(&parts.join(" "))
        }
    }
}

/// Where along x a claim reads its series.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum At {
    /// The largest x both series have.
    Largest,
    /// The smallest x both series have.
    Smallest,
    /// Each series' highest value ("maximum bandwidth").
    Peak,
    /// Each series' lowest value ("lowest latency").
    Lowest,
    /// This x.
    X(f64),
}

/// What the measured figure must be for the claim to hold.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Expect {
    /// Above this.
    Above(f64),
    /// Below this.
    Below(f64),
    /// Within `[lo, hi]`.
    Between(f64, f64),
}

impl Expect {
    /// Whether `v` meets it.
    pub fn admits(self, v: f64) -> bool {
        match self {
            Expect::Above(t) => v > t,
            Expect::Below(t) => v < t,
            Expect::Between(a, b) => v >= a && v <= b,
        }
    }
}

/// The size of the effect a paper publishes and how near netgap's figure
/// must come to it: the claim's size holds when netgap's 95% interval
/// overlaps [`Size::band`].
#[derive(Debug, Clone, PartialEq)]
pub struct Size {
    /// The paper's figure, in the unit of the claim's measured figure (a
    /// ratio for ratio and trend claims); finite and positive.
    pub published: f64,
    /// How far from it, in percent of it, still counts as the same size;
    /// above 0 and below 100.
    pub tolerance_pct: f64,
    /// Why that tolerance, in the study file's words.
    pub why: String,
}

impl Size {
    /// `[published × (1 − tolerance), published × (1 + tolerance)]`.
    pub fn band(&self) -> (f64, f64) {
        let t = self.tolerance_pct / 100.0;
        (self.published * (1.0 - t), self.published * (1.0 + t))
    }
}

/// How a claim is evaluated from the records.
#[derive(Debug, Clone, PartialEq)]
pub enum ClaimTest {
    /// `a`'s value over `b`'s at `at`.
    Ratio {
        /// Numerator series.
        a: Selector,
        /// Denominator series.
        b: Selector,
        /// Where.
        at: At,
        /// What both series are read in instead of the figure's y: an
        /// application metric (`connect_time_us`) or a field of the record
        /// by its path (`cpu.local.process_percent`, the CPU a bandwidth
        /// figure shows beside it).
        metric: Option<Quantity>,
        /// What holds.
        expect: Expect,
    },
    /// A series' value at one x over its value at another (by default
    /// the last x over the first): growth, flatness, doubling.
    Trend {
        /// The series.
        series: Selector,
        /// The x of the denominator; `None`: the first.
        from_x: Option<f64>,
        /// The x of the numerator; `None`: the last.
        to_x: Option<f64>,
        /// What holds.
        expect: Expect,
    },
    /// A series' value (or a metric of the application's) at `at`.
    Value {
        /// The series.
        series: Selector,
        /// Where.
        at: At,
        /// An application metric (`app.metrics`) instead of the headline.
        metric: Option<Quantity>,
        /// What holds.
        expect: Expect,
    },
    /// How the ratio of two series changes along x: `a / b` at `at` over
    /// `a / b` at `vs` ("the improvement is smaller at high alpha": above
    /// 1 with `at` the smallest alpha and `vs` the largest).
    RatioChange {
        /// Numerator series.
        a: Selector,
        /// Denominator series.
        b: Selector,
        /// The x of the ratio on top: an x value, the smallest or the
        /// largest x both series have.
        at: At,
        /// The x of the ratio below.
        vs: At,
        /// What holds.
        expect: Expect,
    },
    /// Two series' trends compared: `a`'s value at `to_x` over its value
    /// at `from_x`, over the same of `b` ("similar scalability": within a
    /// tolerance of 1).
    Trends {
        /// The series on top.
        a: Selector,
        /// The series below.
        b: Selector,
        /// The x of each trend's start; `None`: the first x both have.
        from_x: Option<f64>,
        /// The x of each trend's end; `None`: the last x both have.
        to_x: Option<f64>,
        /// What holds.
        expect: Expect,
    },
    /// Dropouts (sweep points NetPIPE's detector flagged: throughput
    /// below that of a smaller block beyond the noise) in one curve and
    /// none in another. Holds when `with` has at least one and `without`
    /// has none; both must have been measured.
    Dropouts {
        /// The curve that shows dropouts.
        with: Selector,
        /// The curve free from them.
        without: Selector,
    },
    /// A knee at `x`: the knee factor, the series' slope from `x` to its
    /// last point over its slope from its first point to `x` (infinite
    /// when it does not rise up to `x` but does past it, 0 when it does
    /// not rise past `x`). `x` must be a measured point between the first
    /// and the last.
    Knee {
        /// The series.
        series: Selector,
        /// Where the slope changes, on the figure's x-axis.
        x: f64,
        /// What the knee factor must be.
        expect: Expect,
    },
    /// How many times the series falls as x grows (from one point to the
    /// next, the whole of the next point's interval below the whole of
    /// the previous one's).
    Falls {
        /// The series.
        series: Selector,
        /// What falls instead of the figure's y, read along the records'
        /// message size whatever the figure's x: on NetPIPE's signature
        /// graph (x the block time) a larger block that took less time
        /// than the one before is a fall of `block_time_us` along size.
        metric: Option<Quantity>,
        /// What the count must be.
        expect: Expect,
    },
    /// Cannot be measured with netgap; why.
    Unmeasurable(String),
}

impl ClaimTest {
    /// What the measured figure must be, for the kinds that judge one
    /// figure against a threshold or band.
    pub fn expect(&self) -> Option<Expect> {
        match self {
            ClaimTest::Ratio { expect, .. }
            | ClaimTest::Trend { expect, .. }
            | ClaimTest::Value { expect, .. }
            | ClaimTest::RatioChange { expect, .. }
            | ClaimTest::Trends { expect, .. }
            | ClaimTest::Knee { expect, .. }
            | ClaimTest::Falls { expect, .. } => Some(*expect),
            ClaimTest::Dropouts { .. } | ClaimTest::Unmeasurable(_) => None,
        }
    }
}

/// A claim of the paper.
#[derive(Debug, Clone, PartialEq)]
pub struct Claim {
    /// The figure it is shown under.
    pub figure: String,
    /// The figures whose records judge it (the figure itself unless the
    /// claim compares two figures, such as MTU 1500 against 9000).
    pub from: Vec<String>,
    /// The claim, in words.
    pub text: String,
    /// The published figure.
    pub published: String,
    /// Where in the paper.
    pub where_: String,
    /// How it is judged: the direction the paper states.
    pub test: ClaimTest,
    /// The size of the effect the paper publishes, when it gives one;
    /// `None`: the paper gives a direction only.
    pub size: Option<Size>,
    /// Why the stand-in here lacks the mechanism the claim rests on (a
    /// segmentation offload has nothing to do for a one-segment message;
    /// the emulated links have no PCI bus): the claim is shown with this
    /// sentence and not judged. `None`: the stand-in has it.
    pub no_mechanism: Option<String>,
}

impl Claim {
    /// The series the claim picks, each under its key in the study file
    /// (`a`, `b`, `series`).
    pub fn selectors(&self) -> Vec<(&'static str, &Selector)> {
        match &self.test {
            ClaimTest::Ratio { a, b, .. }
            | ClaimTest::RatioChange { a, b, .. }
            | ClaimTest::Trends { a, b, .. } => vec![("a", a), ("b", b)],
            ClaimTest::Dropouts { with, without } => vec![("a", with), ("b", without)],
            ClaimTest::Trend { series, .. }
            | ClaimTest::Value { series, .. }
            | ClaimTest::Knee { series, .. }
            | ClaimTest::Falls { series, .. } => vec![("series", series)],
            ClaimTest::Unmeasurable(_) => Vec::new(),
        }
    }

    /// The x values the claim reads by name (`at`, `vs_at`, `from_x`,
    /// `to_x`), each of which its figures must measure for it to be
    /// judged; a run that leaves one out (a `--quick` run keeps only the
    /// ends of a count axis) cannot judge it.
    pub fn x_values(&self) -> Vec<f64> {
        let at = |a: &At| match a {
            At::X(v) => Some(*v),
            _ => None,
        };
        match &self.test {
            ClaimTest::Ratio { at: a, .. } | ClaimTest::Value { at: a, .. } => {
                at(a).into_iter().collect()
            }
            ClaimTest::RatioChange { at: a, vs, .. } => at(a).into_iter().chain(at(vs)).collect(),
            ClaimTest::Trend { from_x, to_x, .. } | ClaimTest::Trends { from_x, to_x, .. } => {
                from_x.iter().chain(to_x.iter()).copied().collect()
            }
            ClaimTest::Knee { x, .. } => vec![*x],
            ClaimTest::Dropouts { .. } | ClaimTest::Falls { .. } | ClaimTest::Unmeasurable(_) => {
                Vec::new()
            }
        }
    }

    /// Whether the claim's series and x values are ones its figures
    /// measure, as far as their declarations name them; what is not, in
    /// one line.
    fn check_against(&self, figures: &[Figure]) -> Result<(), String> {
        let from: Vec<&Figure> = figures
            .iter()
            .filter(|f| self.from.contains(&f.id))
            .collect();
        let names = from
            .iter()
            .map(|f| f.id.as_str())
            .collect::<Vec<_>>()
            .join(" and ");
        let (figure_s, measure) = if from.len() == 1 {
            ("figure", "measures")
        } else {
            ("figures", "measure")
        };
        for (key, sel) in self.selectors() {
            for (attr, want) in &sel.0 {
                if *attr == Attr::Options {
                    if !from.iter().any(|f| f.admits_options(want)) {
                        return Err(format!(
                            "claim {:?}: {key}: options {want:?} are none that {figure_s} {names} set",
                            self.text
                        ));
                    }
                    continue;
                }
                let Some(known) = from
                    .iter()
                    .map(|f| f.values_of(*attr))
                    .collect::<Option<Vec<Vec<String>>>>()
                else {
                    continue;
                };
                let known: Vec<String> = known.concat();
                if !known.contains(want) {
                    let mut listed = known.clone();
                    listed.sort();
                    listed.dedup();
                    return Err(format!(
                        "claim {:?}: {key}: {} {want:?} is not a value {figure_s} {names} {measure} ({})",
                        self.text,
                        attr.name(),
                        listed.join(", ")
                    ));
                }
            }
        }
        for x in self.x_values() {
            let Some(known) = from
                .iter()
                .map(|f| f.x_values())
                .collect::<Option<Vec<Vec<f64>>>>()
            else {
                continue;
            };
            if !known.concat().contains(&x) {
                return Err(format!(
                    "claim {:?}: x = {x} is not a point {figure_s} {names} {measure}",
                    self.text
                ));
            }
        }
        Ok(())
    }
}

impl Study {
    /// Parses and checks a study file; `file` names it in errors.
    pub fn parse(file: &str, text: &str) -> Result<Study, StudyError> {
        let raw: RawStudy = toml::from_str(text).map_err(|e| StudyError::Syntax {
            file: file.to_string(),
            message: e.to_string().replace('\n', " "),
        })?;
        raw.validate()
    }

    /// The figure `id`.
    pub fn figure(&self, id: &str) -> Option<&Figure> {
        self.figures.iter().find(|f| f.id == id)
    }

    /// The claims judged from figure `id`.
    pub fn claims_of<'a>(&'a self, id: &'a str) -> impl Iterator<Item = &'a Claim> + 'a {
        self.claims.iter().filter(move |c| c.figure == id)
    }
}

impl RawStudy {
    fn validate(self) -> Result<Study, StudyError> {
        let study = self.id.clone();
        let bad = |what: String| StudyError::Invalid {
            study: study.clone(),
            what,
        };
        if self.id.len() != 3 || !self.id.bytes().all(|b| b.is_ascii_digit()) {
            return Err(bad(format!("id {:?}: want three digits", self.id)));
        }
        if self.citation.authors.is_empty() || self.citation.title.trim().is_empty() {
            return Err(bad("the citation names no authors or no title".into()));
        }
        if self.method.reps <= 2 * self.method.drop_each_side {
            return Err(bad(format!(
                "method: {} repetitions leave none after dropping {} each side",
                self.method.reps, self.method.drop_each_side
            )));
        }
        let topology = match self.testbed.topology.as_str() {
            "switch" => Topology::Switch,
            "mesh" => Topology::Mesh,
            t => return Err(bad(format!("testbed topology {t:?}: want switch or mesh"))),
        };
        if self.testbed.hosts < 2 || self.testbed.links == 0 {
            return Err(bad("testbed: at least two hosts and one link".into()));
        }
        if self.figure.is_empty() {
            return Err(bad("no figure".into()));
        }
        let mut figures: Vec<Figure> = Vec::new();
        for f in self.figure {
            let fig = f.validate().map_err(&bad)?;
            if figures.iter().any(|g| g.id == fig.id) {
                return Err(bad(format!("figure {} appears twice", fig.id)));
            }
            if fig.hosts > self.testbed.hosts {
                return Err(bad(format!(
                    "figure {} needs {} hosts, the study's testbed has {}",
                    fig.id, fig.hosts, self.testbed.hosts
                )));
            }
            figures.push(fig);
        }
        let mut claims = Vec::new();
        for c in self.claim {
            if let Some(f) = c.from.iter().find(|f| !figures.iter().any(|g| &g.id == *f)) {
                return Err(bad(format!(
                    "claim {:?} reads figure {f}, which the study does not have",
                    c.text
                )));
            }
            if !figures.iter().any(|f| f.id == c.figure) {
                return Err(bad(format!(
                    "claim {:?} refers to figure {}, which the study does not have",
                    c.text, c.figure
                )));
            }
            let claim = c.validate().map_err(&bad)?;
            claim.check_against(&figures).map_err(&bad)?;
            claims.push(claim);
        }
        for fig in &mut figures {
            let mine = || claims.iter().filter(|c| c.from.contains(&fig.id));
            let mut counts: Vec<u32> = mine()
                .flat_map(Claim::x_values)
                .filter(|x| x.fract() == 0.0 && *x >= 1.0 && *x <= f64::from(u32::MAX))
                .map(|x| x as u32)
                .collect();
            // A figure plotted against size names its link counts in its
            // series (`links = "2"`): those are kept as an x would be.
            counts.extend(mine().flat_map(|c| {
                c.selectors()
                    .into_iter()
                    .flat_map(|(_, sel)| sel.0.iter())
                    .filter(|(a, _)| *a == Attr::Links)
                    .filter_map(|(_, v)| v.parse::<u32>().ok())
                    .collect::<Vec<_>>()
            }));
            counts.sort_unstable();
            counts.dedup();
            fig.claim_counts = counts;
        }
        Ok(Study {
            id: self.id,
            citation: self.citation,
            method: StudyMethod {
                reps: self.method.reps,
                drop_each_side: self.method.drop_each_side,
                iterations: self.method.iterations,
                text: self.method.text,
            },
            testbed: TestbedNeed {
                hosts: self.testbed.hosts,
                topology,
                links: self.testbed.links,
                rate: self.testbed.rate,
                text: self.testbed.text,
            },
            figures,
            claims,
        })
    }
}

fn lookup<T: Copy>(table: &[(&str, T)], name: &str) -> Option<T> {
    table.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
}

fn names<T>(table: &[(&str, T)]) -> String {
    table.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

impl RawFigure {
    fn validate(self) -> Result<Figure, String> {
        let id = self.id.clone();
        let command = match self.command.as_str() {
            "run" => FigureCommand::Run,
            "sweep" => FigureCommand::Sweep,
            "logp" => FigureCommand::Logp,
            c => {
                return Err(format!(
                    "figure {id}: command {c:?}: want run, sweep or logp"
                ))
            }
        };
        let x = lookup(&XAxis::ALL, &self.x).ok_or_else(|| {
            format!(
                "figure {id}: x-axis {:?}: want one of {}",
                self.x,
                names(&XAxis::ALL)
            )
        })?;
        let series = self
            .series
            .iter()
            .map(|s| {
                lookup(&Attr::ALL, s).ok_or_else(|| {
                    format!(
                        "figure {id}: series {s:?}: want one of {}",
                        names(&Attr::ALL)
                    )
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if self.tests.is_empty() && command == FigureCommand::Run {
            return Err(format!("figure {id}: no test"));
        }
        if self.caption.trim().is_empty() {
            return Err(format!("figure {id}: no caption"));
        }
        if self.hosts < 2 {
            return Err(format!("figure {id}: a figure needs at least two hosts"));
        }
        for c in &self.conditions {
            if !c.contains('=') {
                return Err(format!("figure {id}: condition {c:?}: want KEY=V,V"));
            }
        }
        Ok(Figure {
            id: self.id,
            caption: self.caption,
            command,
            tests: self.tests,
            transports: self.transports,
            modes: self.modes,
            sizes: self.sizes,
            conditions: self.conditions,
            clients: self.clients,
            streams: self.streams,
            links: self.links,
            flags: self.flags,
            quick_flags: self.quick_flags,
            quick_sizes: self.quick_sizes,
            variants: self.variants,
            x,
            y: Quantity::parse(&self.y).map_err(|e| format!("figure {id}: y {e}"))?,
            series,
            cpu: self.cpu,
            hosts: self.hosts,
            min_rep_ms: self.min_rep_ms,
            paper: self.paper,
            here: self.here,
            claim_counts: Vec::new(),
        })
    }
}

fn selector(
    what: &str,
    claim: &str,
    m: Option<BTreeMap<String, String>>,
) -> Result<Selector, String> {
    let m = m.ok_or_else(|| format!("claim {claim:?}: no {what}"))?;
    m.into_iter()
        .map(|(k, v)| {
            lookup(&Attr::ALL, &k)
                .map(|a| (a, v))
                .ok_or_else(|| format!("claim {claim:?}: {what}: unknown attribute {k:?}"))
        })
        .collect::<Result<Vec<_>, _>>()
        .map(Selector)
}

impl RawClaim {
    /// The claim's `metric`, when it names one: a quantity
    /// ([`Quantity`]), or the claim is refused.
    fn quantity(&self, text: &str) -> Result<Option<Quantity>, String> {
        self.metric
            .as_deref()
            .map(Quantity::parse)
            .transpose()
            .map_err(|e| format!("claim {text:?}: metric {e}"))
    }

    fn at(&self) -> Result<At, String> {
        self.at_text(self.at.as_deref())
    }

    fn x_value(&self, x: Option<&str>) -> Result<Option<f64>, String> {
        match x {
            None => Ok(None),
            Some(_) => match self.at_text(x)? {
                At::X(v) => Ok(Some(v)),
                _ => Err(format!(
                    "claim {:?}: from_x, to_x and a knee's at are x values",
                    self.text
                )),
            },
        }
    }

    fn at_text(&self, at: Option<&str>) -> Result<At, String> {
        match at {
            None | Some("largest") => Ok(At::Largest),
            Some("smallest") => Ok(At::Smallest),
            Some("peak") => Ok(At::Peak),
            Some("lowest") => Ok(At::Lowest),
            Some(x) => crate::units::parse_size_bytes(x)
                .map(|b| At::X(b as f64))
                .or_else(|_| x.parse::<f64>().map(At::X))
                .map_err(|_| {
                    format!(
                        "claim {:?}: at {x:?}: want largest, smallest, peak, lowest or an x value",
                        self.text
                    )
                }),
        }
    }

    fn expect(&self) -> Result<Expect, String> {
        match (self.above, self.below) {
            (Some(a), Some(b)) if a < b => Ok(Expect::Between(a, b)),
            (Some(a), None) => Ok(Expect::Above(a)),
            (None, Some(b)) => Ok(Expect::Below(b)),
            _ => Err(format!(
                "claim {:?}: give above, below, or both with above < below",
                self.text
            )),
        }
    }

    /// The published size, all three keys or none, agreeing with the
    /// claim's direction.
    fn size(&self, test: &ClaimTest) -> Result<Option<Size>, String> {
        let text = &self.text;
        let (published, tolerance_pct, why) = match (
            self.published_value,
            self.size_tolerance_pct,
            &self.size_why,
        ) {
            (None, None, None) => return Ok(None),
            (Some(p), Some(t), Some(w)) => (p, t, w.trim()),
            _ => {
                return Err(format!(
                "claim {text:?}: give published_value, size_tolerance_pct and size_why together"
            ))
            }
        };
        if !(published.is_finite() && published > 0.0) {
            return Err(format!(
                "claim {text:?}: published_value {published}: want a positive number"
            ));
        }
        if !(tolerance_pct > 0.0 && tolerance_pct < 100.0) {
            return Err(format!(
                "claim {text:?}: size_tolerance_pct {tolerance_pct}: want a percent above 0 and below 100"
            ));
        }
        if why.is_empty() {
            return Err(format!(
                "claim {text:?}: size_why is empty: say why the tolerance"
            ));
        }
        let expect = match test {
            ClaimTest::Falls { .. } | ClaimTest::Dropouts { .. } | ClaimTest::Unmeasurable(_) => {
                return Err(format!(
                    "claim {text:?}: a claim of kind {} has no size to judge; leave out published_value",
                    self.kind
                ))
            }
            t => t.expect().ok_or_else(|| format!("claim {text:?}: no direction"))?,
        };
        if !expect.admits(published) {
            return Err(format!(
                "claim {text:?}: published_value {published} contradicts the claim's direction (above/below)"
            ));
        }
        Ok(Some(Size {
            published,
            tolerance_pct,
            why: why.to_string(),
        }))
    }

    /// The optional keys this claim gives.
    fn given(&self) -> Vec<&'static str> {
        [
            ("a", self.a.is_some()),
            ("b", self.b.is_some()),
            ("series", self.series.is_some()),
            ("at", self.at.is_some()),
            ("vs_at", self.vs_at.is_some()),
            ("metric", self.metric.is_some()),
            ("above", self.above.is_some()),
            ("below", self.below.is_some()),
            ("tolerance_pct", self.tolerance_pct.is_some()),
            ("from_x", self.from_x.is_some()),
            ("to_x", self.to_x.is_some()),
            ("why", self.why.is_some()),
            ("published_value", self.published_value.is_some()),
            ("size_tolerance_pct", self.size_tolerance_pct.is_some()),
            ("size_why", self.size_why.is_some()),
        ]
        .into_iter()
        .filter_map(|(k, given)| given.then_some(k))
        .collect()
    }

    /// `above`/`below`, or `tolerance_pct` for a band around 1 (no
    /// change).
    fn expect_or_band(&self) -> Result<Expect, String> {
        match self.tolerance_pct {
            Some(t) if t > 0.0 && t < 100.0 && self.above.is_none() && self.below.is_none() => {
                Ok(Expect::Between(1.0 - t / 100.0, 1.0 + t / 100.0))
            }
            Some(_) => Err(format!(
                "claim {:?}: tolerance_pct is a percent above 0 and below 100, without above or below",
                self.text
            )),
            None => self.expect(),
        }
    }

    /// `at` (or `vs_at`) of a kind that compares two x: an x value, the
    /// smallest or the largest.
    fn end(&self, key: &str, at: Option<&str>) -> Result<At, String> {
        match self.at_text(at)? {
            At::Peak | At::Lowest => Err(format!(
                "claim {:?}: {key} of a ratio_change is an x value, smallest or largest",
                self.text
            )),
            a => Ok(a),
        }
    }

    fn validate(self) -> Result<Claim, String> {
        let text = self.text.clone();
        const SIZE: [&str; 3] = ["published_value", "size_tolerance_pct", "size_why"];
        let unknown = |k: &str| {
            format!(
                "claim {text:?}: kind {k:?}: want ratio, trend, value, ratio_change, trends, knee, falls, dropouts or unmeasurable"
            )
        };
        let takes: &[&str] = match self.kind.as_str() {
            "ratio" => &["a", "b", "at", "metric", "above", "below", "tolerance_pct"],
            "trend" => &[
                "series",
                "from_x",
                "to_x",
                "above",
                "below",
                "tolerance_pct",
            ],
            "trends" => &[
                "a",
                "b",
                "from_x",
                "to_x",
                "above",
                "below",
                "tolerance_pct",
            ],
            "value" => &["series", "at", "metric", "above", "below"],
            "ratio_change" => &["a", "b", "at", "vs_at", "above", "below", "tolerance_pct"],
            "knee" => &["series", "at", "above", "below"],
            "falls" => &["series", "metric", "above", "below"],
            "dropouts" => &["a", "b"],
            "unmeasurable" => &["why"],
            k => return Err(unknown(k)),
        };
        let sized = !matches!(self.kind.as_str(), "falls" | "dropouts" | "unmeasurable");
        if let Some(k) = self
            .given()
            .into_iter()
            .find(|k| !(takes.contains(k) || (sized && SIZE.contains(k))))
        {
            return Err(format!(
                "claim {text:?}: a claim of kind {} takes no {k}",
                self.kind
            ));
        }
        let test = match self.kind.as_str() {
            "ratio" => ClaimTest::Ratio {
                a: selector("a", &text, self.a.clone())?,
                b: selector("b", &text, self.b.clone())?,
                at: self.at()?,
                metric: self.quantity(&text)?,
                expect: self.expect_or_band()?,
            },
            "trend" => ClaimTest::Trend {
                series: selector("series", &text, self.series.clone())?,
                from_x: self.x_value(self.from_x.as_deref())?,
                to_x: self.x_value(self.to_x.as_deref())?,
                expect: self.expect_or_band()?,
            },
            "value" => ClaimTest::Value {
                series: selector("series", &text, self.series.clone())?,
                at: self.at()?,
                metric: self.quantity(&text)?,
                expect: self.expect()?,
            },
            "ratio_change" => {
                ClaimTest::RatioChange {
                    a: selector("a", &text, self.a.clone())?,
                    b: selector("b", &text, self.b.clone())?,
                    at: self.end("at", self.at.as_deref())?,
                    vs: self.end(
                        "vs_at",
                        Some(self.vs_at.as_deref().ok_or_else(|| {
                            format!("claim {text:?}: a ratio_change needs vs_at")
                        })?),
                    )?,
                    expect: self.expect_or_band()?,
                }
            }
            "trends" => ClaimTest::Trends {
                a: selector("a", &text, self.a.clone())?,
                b: selector("b", &text, self.b.clone())?,
                from_x: self.x_value(self.from_x.as_deref())?,
                to_x: self.x_value(self.to_x.as_deref())?,
                expect: self.expect_or_band()?,
            },
            "knee" => ClaimTest::Knee {
                series: selector("series", &text, self.series.clone())?,
                x: self
                    .x_value(Some(self.at.as_deref().ok_or_else(|| {
                        format!("claim {text:?}: a knee needs at, the x where the slope changes")
                    })?))?
                    .ok_or_else(|| format!("claim {text:?}: a knee's at is an x value"))?,
                expect: self.expect()?,
            },
            "falls" => ClaimTest::Falls {
                series: selector("series", &text, self.series.clone())?,
                metric: self.quantity(&text)?,
                expect: self.expect()?,
            },
            "dropouts" => ClaimTest::Dropouts {
                with: selector("a", &text, self.a.clone())?,
                without: selector("b", &text, self.b.clone())?,
            },
            "unmeasurable" => ClaimTest::Unmeasurable(
                self.why
                    .clone()
                    .ok_or_else(|| format!("claim {text:?}: unmeasurable needs `why`"))?,
            ),
            k => return Err(unknown(k)),
        };
        let size = self.size(&test)?;
        let from = if self.from.is_empty() {
            vec![self.figure.clone()]
        } else {
            self.from.clone()
        };
        Ok(Claim {
            from,
            figure: self.figure,
            text: self.text,
            published: self.published,
            where_: self.where_,
            test,
            size,
            no_mechanism: match self.no_mechanism {
                Some(why) if why.trim().is_empty() => {
                    return Err(format!(
                        "claim {text:?}: no_mechanism says why the stand-in lacks the claim's mechanism; it is empty"
                    ))
                }
                m => m,
            },
        })
    }
}

/// What a figure reads on y, or a claim reads its series in, as the study
/// file names it: parsed when the study loads (a name that is none of
/// these is refused), and read from a record with [`Quantity::of`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quantity {
    /// `value`: each record's headline, whatever its metric (LogP's
    /// parameters, told apart by the `metric` series).
    Headline,
    /// A metric by its key, the unit in the name (`latency_us`,
    /// `connect_time_us`): the headline of a record whose metric it is,
    /// else the application's figure of that name (`app.metrics`).
    Metric(String),
    /// `block_time_us`: a sweep point's block time, its interval the
    /// throughput's turned over.
    BlockTime,
    /// `dropouts`: 1 for a point flagged as a dropout, else 0.
    Dropouts,
    /// `cpu.END.SHARE`: the CPU of one end, percent
    /// (`cpu.local.process_percent`).
    Cpu(CpuEnd, CpuShare),
}

/// One end of a point-to-point record's CPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuEnd {
    /// The coordinator's end (`local`).
    Local,
    /// The agent's end (`remote`).
    Remote,
}

/// A share of one end's CPU, percent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuShare {
    /// The netgap process's, of one core (`process_percent`).
    Process,
    /// The host's busy share of all its CPUs (`system_busy_percent`).
    SystemBusy,
}

/// Units a metric's key may end in.
const METRIC_UNITS: [&str; 7] = ["_us", "_ms", "_ns", "_gbps", "_pct", "_percent", "_per_s"];

impl Quantity {
    /// The quantity the study file names `name`; `Err` says what it takes.
    fn parse(name: &str) -> Result<Quantity, String> {
        let cpu = |end: &str, share: &str| {
            let end = match end {
                "local" => CpuEnd::Local,
                "remote" => CpuEnd::Remote,
                _ => return None,
            };
            let share = match share {
                "process_percent" => CpuShare::Process,
                "system_busy_percent" => CpuShare::SystemBusy,
                _ => return None,
            };
            Some(Quantity::Cpu(end, share))
        };
        let key = |n: &str| {
            n.bytes()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
                && n.starts_with(|c: char| c.is_ascii_lowercase())
                && METRIC_UNITS.iter().any(|u| n.ends_with(u))
        };
        let parts: Vec<&str> = name.split('.').collect();
        let q = match parts.as_slice() {
            ["value"] => Some(Quantity::Headline),
            ["block_time_us"] => Some(Quantity::BlockTime),
            ["dropouts"] => Some(Quantity::Dropouts),
            ["cpu", end, share] => cpu(end, share),
            [n] if key(n) => Some(Quantity::Metric((*n).to_string())),
            _ => None,
        };
        q.ok_or_else(|| {
            format!(
                "{name:?} is no quantity: value, dropouts, block_time_us, \
                 cpu.local|remote.process_percent|system_busy_percent, or a metric's key \
                 with its unit ({})",
                METRIC_UNITS.join(", ")
            )
        })
    }

    /// The quantity's name as the study file gives it.
    pub fn name(&self) -> String {
        match self {
            Quantity::Headline => "value".into(),
            Quantity::Metric(key) => key.clone(),
            Quantity::BlockTime => "block_time_us".into(),
            Quantity::Dropouts => "dropouts".into(),
            Quantity::Cpu(end, share) => {
                let end = match end {
                    CpuEnd::Local => "local",
                    CpuEnd::Remote => "remote",
                };
                let share = match share {
                    CpuShare::Process => "process_percent",
                    CpuShare::SystemBusy => "system_busy_percent",
                };
                format!("cpu.{end}.{share}")
            }
        }
    }

    /// `record`'s value of the quantity with its 95% interval, when it has
    /// one; `None` when the record does not carry it.
    pub fn of(&self, record: &ResultRecord) -> Option<(f64, Option<(f64, f64)>)> {
        let interval = || {
            let s = record.stats.as_ref()?;
            s.ci95_low.zip(s.ci95_high)
        };
        match self {
            Quantity::Dropouts => Some((if record.dropout().is_some() { 1.0 } else { 0.0 }, None)),
            Quantity::Headline => Some((record.value, interval())),
            Quantity::Metric(key) if *key == record.metric => Some((record.value, interval())),
            Quantity::Metric(key) => record
                .workload
                .as_ref()
                .and_then(|w| w.app.as_ref())
                .and_then(|a| a.metrics.get(key))
                .map(|v| (*v, None)),
            Quantity::BlockTime => {
                // A sweep's block time is its size over its throughput: its
                // interval is the throughput's, turned over.
                let t = record.block_time_us()?;
                let v = record.value;
                let ci = match interval() {
                    Some((lo, hi)) if lo > 0.0 && v > 0.0 => Some((t * v / hi, t * v / lo)),
                    _ => None,
                };
                Some((t, ci))
            }
            Quantity::Cpu(end, share) => {
                let cpu = record.cpu.as_ref()?;
                let usage = match end {
                    CpuEnd::Local => &cpu.local,
                    CpuEnd::Remote => &cpu.remote,
                };
                let v = match share {
                    CpuShare::Process => usage.process_percent,
                    CpuShare::SystemBusy => usage.system_busy_percent,
                };
                Some((v, None))
            }
        }
    }
}

impl std::fmt::Display for Quantity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// A value of an application's option or figure as a series names it: a
/// string as it is, a number as JSON writes it, a switch `on` or `off`.
fn text_of(v: &serde_json::Value) -> Option<String> {
    match v {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Number(n) => Some(n.to_string()),
        serde_json::Value::Bool(b) => Some(if *b { "on" } else { "off" }.to_string()),
        _ => None,
    }
}

/// An option of `record`'s application workload, as the point ran it.
fn app_option<'a>(record: &'a ResultRecord, key: &str) -> Option<&'a serde_json::Value> {
    record
        .workload
        .as_ref()
        .and_then(|w| w.app.as_ref())
        .and_then(|a| a.options.get(key))
}

impl Attr {
    /// `record`'s value of the attribute, as a study file's selectors name
    /// it; `None` when the record does not say.
    pub fn of(self, record: &ResultRecord) -> Option<String> {
        let app = |k: &str| app_option(record, k).and_then(text_of);
        let path = record.stack.as_ref().map(|s| &s.path);
        match self {
            Attr::Test => Some(record.test.clone()),
            Attr::Transport => Some(record.transport.clone()),
            Attr::Mode => Some(record.mode.as_str().to_string()),
            Attr::Mtu => path?.mtu_bytes.map(|m| m.to_string()),
            Attr::Offload => path?.offload.clone(),
            Attr::Server => app("server"),
            Attr::Trace => app("trace"),
            Attr::Preset => app("preset"),
            Attr::Op => app("op"),
            Attr::Pattern => app("pattern"),
            Attr::Responder => app("responder"),
            Attr::Kind => record.sweep_kind().map(str::to_string),
            Attr::Metric => Some(record.metric.clone()),
            Attr::Rate => path?.rate_bps.map(crate::units::rate_text),
            Attr::Links => XAxis::Links.of(record).map(|n| format!("{n:.0}")),
            Attr::Options => {
                let opts = record
                    .stack
                    .as_ref()
                    .map_or(&[][..], |s| s.options.as_slice());
                Some(if opts.is_empty() {
                    "defaults".to_string()
                } else {
                    opts.join(",")
                })
            }
        }
    }
}

impl XAxis {
    /// `record`'s place on the axis; `None` when the record does not say.
    pub fn of(self, record: &ResultRecord) -> Option<f64> {
        let clients = || record.clients().map(f64::from);
        let app_number = |k: &str| app_option(record, k).and_then(serde_json::Value::as_f64);
        match self {
            XAxis::Size | XAxis::FileSize | XAxis::UnitBytes => Some(record.size_bytes as f64),
            XAxis::Clients | XAxis::Streams => clients(),
            XAxis::Links => record
                .workload
                .as_ref()
                .map(|w| w.links.len() as f64)
                .filter(|n| *n > 0.0)
                .or_else(clients),
            XAxis::Alpha => app_number("alpha"),
            XAxis::Hosts => record
                .workload
                .as_ref()
                .and_then(|w| w.app.as_ref())
                .and_then(|a| a.metrics.get("hosts").copied())
                .or_else(clients),
            XAxis::Shape => app_number("servers"),
            XAxis::BlockTime => record.block_time_us(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"
id = "009"
[citation]
authors = ["A. Author", "B. Author"]
title = "T"
venue = "V"
year = 2000
[method]
reps = 10
drop_each_side = 1
text = "10 runs"
[testbed]
hosts = 2
topology = "switch"
text = "two hosts"
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
[[claim]]
figure = "1"
text = "tcp below udp"
published = "x"
where = "Fig 1"
kind = "ratio"
a = { transport = "tcp" }
b = { transport = "udp" }
below = 1.0
"#;

    #[test]
    fn a_minimal_study_parses() {
        let s = Study::parse("min", MINIMAL).expect("parses");
        assert_eq!(s.figures[0].x, XAxis::Size);
        assert_eq!(s.citation.line(), "A. Author and B. Author. T. V, 2000.");
        assert!(matches!(
            s.claims[0].test,
            ClaimTest::Ratio {
                expect: Expect::Below(_),
                ..
            }
        ));
    }

    #[test]
    fn a_published_size_is_read_with_its_tolerance_and_refused_when_incomplete_or_contrary() {
        let sized = MINIMAL.replace(
            "below = 1.0\n",
            "below = 1.0\npublished_value = 0.86\nsize_tolerance_pct = 10\nsize_why = \"read off a figure\"\n",
        );
        let s = Study::parse("x", &sized).expect("parses");
        let size = s.claims[0].size.as_ref().expect("a size");
        let (lo, hi) = size.band();
        assert!((lo - 0.774).abs() < 1e-9 && (hi - 0.946).abs() < 1e-9);
        assert!(Study::parse("x", MINIMAL).expect("parses").claims[0]
            .size
            .is_none());
        for (bad, needle) in [
            (
                sized.replace("size_why = \"read off a figure\"\n", ""),
                "together",
            ),
            (
                sized.replace("published_value = 0.86", "published_value = 1.5"),
                "contradicts the claim's direction",
            ),
            (
                sized.replace("size_tolerance_pct = 10", "size_tolerance_pct = 100"),
                "below 100",
            ),
            (
                sized.replace("published_value = 0.86", "published_value = -1"),
                "positive",
            ),
            (sized.replace("\"read off a figure\"", "\" \""), "size_why"),
        ] {
            let e = Study::parse("x", &bad).expect_err(needle);
            let line = e.to_string();
            assert!(line.contains(needle) && !line.contains('\n'), "{line}");
        }
    }

    /// MINIMAL with its claim's rule (from `kind` on) replaced by `rule`.
    fn with_rule(rule: &str) -> String {
        let at = MINIMAL.find("kind = ").expect("a kind");
        format!("{}{rule}\n", &MINIMAL[..at])
    }

    #[test]
    fn every_rule_kind_parses_with_its_keys() {
        type Case = (&'static str, fn(&ClaimTest) -> bool);
        let cases: [Case; 7] = [
            (
                "kind = \"ratio_change\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"smallest\"\nvs_at = \"largest\"\nabove = 1.0",
                |t: &ClaimTest| matches!(t, ClaimTest::RatioChange { at: At::Smallest, vs: At::Largest, .. }),
            ),
            (
                "kind = \"trends\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\ntolerance_pct = 20",
                |t: &ClaimTest| matches!(t, ClaimTest::Trends { expect: Expect::Between(..), .. }),
            ),
            (
                "kind = \"dropouts\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }",
                |t: &ClaimTest| matches!(t, ClaimTest::Dropouts { .. }),
            ),
            (
                "kind = \"knee\"\nseries = { transport = \"tcp\" }\nat = \"1K\"\nabove = 2.0",
                |t: &ClaimTest| matches!(t, ClaimTest::Knee { x, .. } if *x == 1024.0),
            ),
            (
                "kind = \"falls\"\nseries = { transport = \"tcp\" }\nabove = 0.5",
                |t: &ClaimTest| matches!(t, ClaimTest::Falls { metric: None, .. }),
            ),
            (
                "kind = \"falls\"\nseries = { transport = \"tcp\" }\nmetric = \"block_time_us\"\nabove = 0.5",
                |t: &ClaimTest| matches!(t, ClaimTest::Falls { metric: Some(m), .. } if *m == Quantity::BlockTime),
            ),
            (
                "kind = \"ratio\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"largest\"\nmetric = \"cpu.local.process_percent\"\nbelow = 1.0",
                |t: &ClaimTest| matches!(t, ClaimTest::Ratio { metric: Some(m), .. } if *m == Quantity::Cpu(CpuEnd::Local, CpuShare::Process)),
            ),
        ];
        for (rule, ok) in cases {
            let s = Study::parse("x", &with_rule(rule)).unwrap_or_else(|e| panic!("{rule}: {e}"));
            assert!(ok(&s.claims[0].test), "{rule}: {:?}", s.claims[0].test);
        }
    }

    #[test]
    fn a_rule_with_a_key_its_kind_does_not_read_is_refused_in_one_line() {
        for (rule, needle) in [
            (
                "kind = \"trend\"\na = { transport = \"tcp\" }\nseries = { transport = \"tcp\" }\nabove = 1.0",
                "kind trend takes no a",
            ),
            (
                "kind = \"ratio_change\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nabove = 1.0",
                "needs vs_at",
            ),
            (
                "kind = \"ratio_change\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"peak\"\nvs_at = \"1K\"\nabove = 1.0",
                "smallest or largest",
            ),
            (
                "kind = \"knee\"\nseries = { transport = \"tcp\" }\nat = \"peak\"\nabove = 2.0",
                "x values",
            ),
            (
                "kind = \"dropouts\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nbelow = 0.5",
                "kind dropouts takes no below",
            ),
            (
                "kind = \"falls\"\nseries = { transport = \"tcp\" }\nabove = 0.5\npublished_value = 2.0\nsize_tolerance_pct = 10\nsize_why = \"w\"",
                "takes no published_value",
            ),
            ("kind = \"slope\"", "kind \"slope\": want ratio"),
            (
                "kind = \"value\"\nseries = { transport = \"tcp\" }\nat = \"largest\"\nmetric = \"connect_time\"\nabove = 1.0",
                "metric \"connect_time\" is no quantity",
            ),
            (
                "kind = \"falls\"\nseries = { transport = \"tcp\" }\nmetric = \"cpu.local.busy\"\nabove = 0.5",
                "metric \"cpu.local.busy\" is no quantity",
            ),
        ] {
            let e = Study::parse("x", &with_rule(rule)).expect_err(rule);
            let line = e.to_string();
            assert!(line.contains(needle) && !line.contains('\n'), "{rule}: {line}");
        }
    }

    /// MINIMAL whose figure names its transports, sizes and offloads.
    fn declared() -> String {
        MINIMAL.replace(
            "tests = [\"pingpong\"]\n",
            "tests = [\"pingpong\"]\ntransports = [\"tcp\", \"udp\"]\nsizes = \"1,1K,64K\"\nconditions = [\"offload=on,off\"]\nflags = [\"--no-nodelay\", \"--sndbuf\", \"512K\"]\n",
        )
    }

    #[test]
    fn a_claim_naming_a_value_or_x_its_figure_does_not_measure_is_refused_in_one_line() {
        let ok = Study::parse("x", &declared()).expect("parses");
        assert_eq!(
            ok.figures[0].values_of(Attr::Transport),
            Some(vec!["tcp".to_string(), "udp".to_string()])
        );
        let with = |rule: &str| {
            let text = declared();
            let at = text.find("kind = ").expect("a kind");
            format!("{}{rule}\n", &text[..at])
        };
        for (bad, needle) in [
            (
                declared().replace("b = { transport = \"udp\" }", "b = { transport = \"udpp\" }"),
                "b: transport \"udpp\" is not a value figure 1 measures (tcp, udp)",
            ),
            (
                with("kind = \"ratio\"\na = { offload = \"yes\" }\nb = { offload = \"off\" }\nabove = 1.0"),
                "offload \"yes\"",
            ),
            (
                with("kind = \"ratio\"\na = { options = \"quickack\" }\nb = { options = \"no_nodelay\" }\nabove = 1.0"),
                "options \"quickack\"",
            ),
            (
                with("kind = \"ratio\"\na = { transport = \"tcp\" }\nb = { transport = \"udp\" }\nat = \"4K\"\nabove = 1.0"),
                "x = 4096 is not a point figure 1 measures",
            ),
            (
                with("kind = \"trend\"\nseries = { transport = \"tcp\" }\nfrom_x = \"1\"\nto_x = \"2K\"\nabove = 1.0"),
                "x = 2048",
            ),
        ] {
            let e = Study::parse("x", &bad).expect_err(needle);
            let line = e.to_string();
            assert!(line.contains(needle) && !line.contains('\n'), "{line}");
        }
        // What the figure declares is accepted: an option it sets, with
        // its value, and the defaults.
        for good in [
            "kind = \"ratio\"\na = { options = \"no_nodelay,sndbuf_bytes=524288\" }\nb = { options = \"defaults\" }\nat = \"64K\"\nabove = 1.0",
            "kind = \"trend\"\nseries = { offload = \"on\", transport = \"tcp\" }\nfrom_x = \"1\"\nto_x = \"1K\"\nabove = 1.0",
        ] {
            Study::parse("x", &with(good)).unwrap_or_else(|e| panic!("{good}: {e}"));
        }
    }

    #[test]
    fn the_x_values_a_claim_reads_are_listed() {
        let s = Study::parse(
            "x",
            &with_rule("kind = \"trend\"\nseries = { transport = \"tcp\" }\nfrom_x = \"1\"\nto_x = \"2\"\nabove = 1.0"),
        )
        .expect("parses");
        assert_eq!(s.claims[0].x_values(), vec![1.0, 2.0]);
        assert!(Study::parse("x", MINIMAL).expect("parses").claims[0]
            .x_values()
            .is_empty());
    }

    /// A figure of rates (`rate=` conditions) and of links plotted against
    /// size names them as series; a claim naming a link count keeps it in
    /// a `--quick` run as it keeps an x it reads, and one naming a rate or
    /// a link count the figure does not measure is refused.
    #[test]
    fn rates_and_link_counts_are_series_a_claim_can_name() {
        let text = MINIMAL
            .replace(
                "tests = [\"pingpong\"]\n",
                "tests = [\"multirail\"]\nsizes = \"1K,64K\"\nlinks = [1, 2, 3]\nconditions = [\"rate=10M,1G\"]\n",
            )
            .replace("series = [\"transport\"]", "series = [\"links\", \"rate\"]")
            .replace(
                "a = { transport = \"tcp\" }\nb = { transport = \"udp\" }",
                "a = { links = \"2\", rate = \"1G\" }\nb = { links = \"1\", rate = \"1G\" }",
            );
        let s = Study::parse("x", &text).expect("parses");
        let fig = &s.figures[0];
        assert_eq!(
            fig.values_of(Attr::Rate),
            Some(vec!["10M".to_string(), "1G".to_string()])
        );
        assert_eq!(
            fig.values_of(Attr::Links),
            Some(vec!["1".to_string(), "2".to_string(), "3".to_string()])
        );
        assert!(fig.claim_counts.contains(&2), "{:?}", fig.claim_counts);
        for (from, to, needle) in [
            (
                "links = \"2\", rate",
                "links = \"4\", rate",
                "links \"4\" is not a value",
            ),
            (
                "rate = \"1G\" }\nb",
                "rate = \"100M\" }\nb",
                "rate \"100M\" is not a value",
            ),
        ] {
            let e = Study::parse("x", &text.replace(from, to)).expect_err(needle);
            assert!(e.to_string().contains(needle), "{e}");
        }
    }

    #[test]
    fn a_figure_whose_y_is_no_quantity_is_refused_in_one_line() {
        let bad = MINIMAL.replacen("y = \"latency_us\"", "y = \"latency\"", 1);
        assert_ne!(bad, MINIMAL, "MINIMAL names its y");
        let e = Study::parse("x", &bad).expect_err("no unit").to_string();
        assert!(
            e.contains("y \"latency\" is no quantity") && !e.contains('\n'),
            "{e}"
        );
    }

    /// Each quantity reads its own part of a record: the headline with its
    /// interval, an application's figure, a sweep's block time with the
    /// throughput's interval turned over, a flagged dropout, one end's CPU.
    #[test]
    fn quantities_read_their_part_of_a_record() {
        use crate::cpu::CpuUsage;
        use crate::record::{
            AppResult, CpuPair, Dropout, RecordHead, RecordStats, SweepSection, WorkloadSection,
        };
        let mut r = ResultRecord::new(RecordHead {
            test: "sweep".into(),
            transport: "tcp".into(),
            mode: crate::spec::Mode::Event,
            size_bytes: 1000,
            metric: "bandwidth_gbps".into(),
            value: 2.0,
            time: "t".into(),
        });
        r.stats = Some(RecordStats {
            min: 1.0,
            median: 2.0,
            max: 3.0,
            stdev: 0.5,
            ci95_low: Some(1.0),
            ci95_high: Some(4.0),
            cv: 0.25,
            reps: vec![1.0, 2.0, 3.0],
        });
        let q = |name: &str| Quantity::parse(name).expect(name);
        assert_eq!(q("value").of(&r), Some((2.0, Some((1.0, 4.0)))));
        assert_eq!(q("bandwidth_gbps").of(&r), Some((2.0, Some((1.0, 4.0)))));
        assert_eq!(q("latency_us").of(&r), None);
        assert_eq!(q("block_time_us").of(&r), None);
        assert_eq!(q("dropouts").of(&r), Some((0.0, None)));
        assert_eq!(q("cpu.remote.process_percent").of(&r), None);
        r.sweep = Some(SweepSection {
            sweep_kind: "stream".into(),
            block_time_us: 4.0,
            dropout: Some(Dropout {
                depth_pct: 20.0,
                reference_size_bytes: 500,
                reference_value: 2.5,
            }),
            unstable: None,
        });
        assert_eq!(q("block_time_us").of(&r), Some((4.0, Some((2.0, 8.0)))));
        assert_eq!(q("dropouts").of(&r), Some((1.0, None)));
        let usage = |process_percent: f64| CpuUsage {
            process_percent,
            system_busy_percent: 50.0,
            ..CpuUsage::default()
        };
        r.cpu = Some(CpuPair {
            local: usage(30.0),
            remote: usage(40.0),
        });
        assert_eq!(q("cpu.remote.process_percent").of(&r), Some((40.0, None)));
        assert_eq!(
            q("cpu.local.system_busy_percent").of(&r),
            Some((50.0, None))
        );
        r.workload = Some(WorkloadSection {
            clients: 4,
            client_hosts: None,
            flows: Vec::new(),
            hosts_cpu: Vec::new(),
            links: Vec::new(),
            app: Some(AppResult {
                metrics: [("connect_time_us".to_string(), 7.0)].into(),
                ..AppResult::default()
            }),
        });
        assert_eq!(q("connect_time_us").of(&r), Some((7.0, None)));
        assert_eq!(XAxis::Clients.of(&r), Some(4.0));
        assert_eq!(Attr::Kind.of(&r).as_deref(), Some("stream"));
        assert_eq!(Attr::Options.of(&r).as_deref(), Some("defaults"));
        for name in [
            "value",
            "dropouts",
            "block_time_us",
            "cpu.local.process_percent",
            "query_time_ms",
        ] {
            assert_eq!(q(name).name(), name);
        }
    }

    #[test]
    fn unknown_keys_and_dangling_claims_are_refused() {
        let extra = MINIMAL.replace("hosts = 2\npaper", "hosts = 2\ncolour = 1\npaper");
        let e = Study::parse("x", &extra).expect_err("unknown key");
        assert!(e.to_string().contains("colour"), "{e}");
        let dangling = MINIMAL.replace("figure = \"1\"\ntext", "figure = \"2\"\ntext");
        let e = Study::parse("x", &dangling).expect_err("dangling");
        assert!(e.to_string().contains("figure 2"), "{e}");
    }
}
