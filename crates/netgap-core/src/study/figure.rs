//! A figure of a study: the netgap command and options that make it,
//! what it plots along x and which attributes set its series apart, and
//! how each reads its part of a record.

use super::Quantity;
use crate::record::ResultRecord;

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
    pub(crate) const ALL: [(&'static str, XAxis); 10] = [
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
    pub(crate) const ALL: [(&'static str, Attr); 16] = [
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
    /// reads ([`Claim::x_values`](super::Claim::x_values), or a link
    /// count its series name, `links = "2"`): a `--quick` run, which keeps
    /// only the ends of such an axis, keeps these too, so no claim loses
    /// its point.
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
    pub(crate) fn admits_options(&self, value: &str) -> bool {
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
