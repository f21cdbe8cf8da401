//! What the user sees while a run goes: an aligned table on stdout, one row
//! per point as soon as it is measured, with units in the headers; and a
//! progress bar on stderr once a run has lasted a couple of seconds, never
//! when stderr is not a terminal.

use crate::coordinator::Observer;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use netgap_core::noise::{NoiseDiagnosis, NoiseKind};
use netgap_core::record::ResultRecord;
use netgap_core::spec::PointSpec;
use netgap_core::units::format_size;
use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

/// Runs shorter than this show no progress bar.
const PROGRESS_AFTER: Duration = Duration::from_secs(2);

/// The table's columns: header and width.
const COLUMNS: [(&str, usize); 11] = [
    ("test", 13),
    ("transport", 9),
    ("mode", 5),
    ("size", 6),
    ("latency_us", 11),
    ("p99_us", 10),
    ("bw_gbps", 9),
    ("ci95_%", 7),
    ("cpu_loc_%", 9),
    ("cpu_rem_%", 9),
    ("note", 0),
];

/// The header line of the table.
pub(crate) fn table_header() -> String {
    row(COLUMNS.iter().map(|(h, _)| h.to_string()).collect())
}

fn row(cells: Vec<String>) -> String {
    let mut line = String::new();
    for (i, (cell, (_, width))) in cells.iter().zip(COLUMNS.iter()).enumerate() {
        if i > 0 {
            line.push_str("  ");
        }
        if i < 4 || i == COLUMNS.len() - 1 {
            line.push_str(&format!("{cell:<width$}"));
        } else {
            line.push_str(&format!("{cell:>width$}"));
        }
    }
    line.trim_end().to_string()
}

/// A number with about four significant digits.
pub(crate) fn fmt_num(v: f64) -> String {
    let a = v.abs();
    if a >= 1000.0 {
        format!("{v:.0}")
    } else if a >= 100.0 {
        format!("{v:.1}")
    } else if a >= 10.0 {
        format!("{v:.2}")
    } else {
        format!("{v:.3}")
    }
}

/// The table row of a record.
pub(crate) fn table_row(r: &ResultRecord) -> String {
    let (lat, bw) = if r.metric == "latency_us" {
        (fmt_num(r.value), String::new())
    } else if r.metric != "bandwidth_gbps" {
        // Connections and a workload's own headline go in the notes.
        (String::new(), String::new())
    } else {
        (String::new(), fmt_num(r.value))
    };
    let p99 = r
        .percentiles
        .as_ref()
        .filter(|_| r.metric == "latency_us")
        .map(|p| fmt_num(p.p99))
        .unwrap_or_default();
    // One repetition has no interval: "n/a", never a zero-width one.
    let ci = match &r.stats {
        Some(st) => st
            .ci95_half_width_pct()
            .map_or_else(|| "n/a".to_string(), |pct| format!("±{pct:.1}")),
        None => String::new(),
    };
    // Workload points show the busiest client host and the server.
    let hosts_cpu = r.workload.as_ref().map_or(&[][..], |g| &g.hosts_cpu[..]);
    let workload_cpu = (!hosts_cpu.is_empty()).then(|| {
        let pct = |role: &str, pick: fn(f64, f64) -> f64| {
            hosts_cpu
                .iter()
                .filter(|h| h.role == role)
                .map(|h| h.cpu.process_percent)
                .reduce(pick)
                .map(|v| format!("{v:.0}"))
                .unwrap_or_default()
        };
        (pct("client", f64::max), pct("server", f64::max))
    });
    let cpu = |f: fn(&netgap_core::record::CpuPair) -> f64, side: usize| {
        if let Some((client, server)) = &workload_cpu {
            return if side == 0 {
                client.clone()
            } else {
                server.clone()
            };
        }
        r.cpu
            .as_ref()
            .map(|c| format!("{:.0}", f(c)))
            .unwrap_or_default()
    };
    // What sets the row apart from the others of its run, which the other
    // columns do not show: its conditions, the workload's own options and
    // the count the workload is measured along.
    let mut notes: Vec<String> = set_apart(r);
    if r.metric == "connections_per_s" {
        notes.push(format!("{} conn/s", fmt_num(r.value)));
    } else if !matches!(r.metric.as_str(), "latency_us" | "bandwidth_gbps") {
        notes.push(format!("{} {}", r.metric, fmt_num(r.value)));
    }
    let own_sentences = point_sentences(r);
    use crate::workload_run::summary::{FAILURE_PREFIX, WINDOW_PREFIX};
    if r.warnings.iter().any(|w| {
        !own_sentences.contains(w)
            && !w.starts_with(FAILURE_PREFIX)
            && !w.starts_with(WINDOW_PREFIX)
    }) {
        notes.push("noisy".into());
    }
    if let Some(note) = emulator_note(r).or_else(|| shaper_note(r)) {
        notes.push(note);
    }
    if let Some(f) = r.physics.as_ref().and_then(|p| p.past_forwarding_gbps) {
        notes.push(format!("links past the machine ({f:.1} Gbit/s)"));
    }
    // A repetition whose data path did not read through its window is a
    // measurement fault, not noise.
    let short = r
        .warnings
        .iter()
        .filter(|w| w.starts_with(WINDOW_PREFIX))
        .count();
    if short > 0 {
        notes.push(format!("FAULT: {short} short window(s)"));
    }
    if let Some(f) = r.fault() {
        notes.push(fault_note(f));
    }
    // Failed transactions (mean per repetition, as the record keeps them)
    // mark the point: its figures count only those that completed.
    if let Some(e) = r
        .workload
        .as_ref()
        .and_then(|g| g.app.as_ref())
        .and_then(|a| a.metrics.get("errors"))
        .filter(|e| **e > 0.0)
    {
        notes.push(format!("errors={}", fmt_num(*e)));
    }
    if let Some(d) = r.datagrams.as_ref().and_then(|d| d.note()) {
        notes.push(d);
    }
    if let Some(note) = ci_note(r) {
        notes.push(note);
    }
    let note = notes.join("; ");
    row(vec![
        r.test.clone(),
        r.transport.clone(),
        r.mode.to_string(),
        format_size(r.size_bytes),
        lat,
        p99,
        bw,
        ci,
        cpu(|c| c.local.process_percent, 0),
        cpu(|c| c.remote.process_percent, 1),
        note,
    ])
}

/// What sets a row apart from the other rows of its run: the path's
/// conditions (on a testbed, or when the run compared conditions), the
/// workload's own options as the point ran them (`server=apache`,
/// `alpha=0.8`, `op=read`, `pattern=tile`, `responder=gmond`,
/// `preset=vm`; the server program it started when no option names it),
/// and the count of the point by what it counts (`clients=12`,
/// `streams=4`, `links=3`).
pub(crate) fn set_apart(r: &ResultRecord) -> Vec<String> {
    let mut notes = Vec::new();
    let interleaved = r.options.as_ref().and_then(|o| o.interleaved.as_ref());
    if let Some(stack) = &r.stack {
        let p = &stack.path;
        let conditioned = p.kind.as_deref() == Some("testbed")
            || interleaved.is_some()
            || p.rate_bps.is_some()
            || p.delay_us.is_some()
            || p.loss_ppm.is_some();
        if conditioned {
            let mut c = Vec::new();
            if let Some(m) = p.mtu_bytes {
                c.push(format!("mtu {m}"));
            }
            if let Some(o) = &p.offload {
                c.push(format!("offload {o}"));
            }
            if let Some(rate) = p.rate_bps {
                c.push(format!("{} Mbit/s", fmt_num(rate as f64 / 1e6)));
            }
            if let Some(d) = p.delay_us {
                c.push(format!("delay {d} us"));
            }
            if let Some(l) = p.loss_ppm {
                c.push(format!("loss {}%", fmt_num(f64::from(l) / 10_000.0)));
            }
            if let Some(q) = p.qdisc.as_deref().filter(|q| *q != "noqueue") {
                c.push(q.to_string());
            }
            if !c.is_empty() {
                notes.push(c.join(" "));
            }
        }
    }
    let Some(w) = r.workload.as_ref() else {
        return notes;
    };
    if let Some(app) = &w.app {
        notes.extend(app.variant());
    }
    let count = match netgap_workload::registry()
        .iter()
        .find(|k| k.name() == r.test)
        .map(|k| k.count())
    {
        Some(netgap_workload::CountFlag::Streams) => "streams",
        Some(netgap_workload::CountFlag::Hosts) if !w.links.is_empty() => "links",
        Some(netgap_workload::CountFlag::Hosts) => "hosts",
        _ => "clients",
    };
    notes.push(format!("{count}={}", w.clients));
    notes
}

/// The warnings of a record that name their point themselves: a fault's
/// sentence, that of a bandwidth the emulator, or the shaper, held below
/// its limit, and that of links past what the machine forwards.
fn point_sentences(r: &ResultRecord) -> Vec<String> {
    let fault = r
        .fault()
        .map(|f| netgap_core::physics::fault_sentence(r, f));
    let bound = r
        .cpu_load
        .as_ref()
        .and_then(|l| netgap_core::physics::emulator_bound(r, l))
        .map(|b| netgap_core::physics::bound_sentence(r, &b));
    let held = r
        .cpu_load
        .as_ref()
        .filter(|_| r.shaper_held())
        .and_then(|l| netgap_core::physics::shaper_held(r, l))
        .map(|h| netgap_core::physics::held_sentence(r, &h));
    let past = r.physics.as_ref().and_then(|p| {
        Some(netgap_core::physics::past_forwarding_sentence(
            r,
            p.payload_limit_gbps?,
            p.past_forwarding_gbps?,
        ))
    });
    fault
        .into_iter()
        .chain(bound)
        .chain(held)
        .chain(past)
        .collect()
}

/// The table's note for a point the emulator bound, such as
/// `emulator-bound: forwarding 44%`.
pub(crate) fn emulator_note(r: &ResultRecord) -> Option<String> {
    let load = r.cpu_load.as_ref().filter(|_| r.emulator_bound())?;
    Some(match load.forwarding_percent() {
        Some(f) => format!("emulator-bound: forwarding {f:.0}%"),
        None => "emulator-bound".to_string(),
    })
}

/// The table's note for a point the testbed's shaper held below its
/// limit on idle CPUs, such as `shaper-held: CPUs 15% busy`.
pub(crate) fn shaper_note(r: &ResultRecord) -> Option<String> {
    let load = r.cpu_load.as_ref().filter(|_| r.shaper_held())?;
    Some(format!("shaper-held: CPUs {:.0}% busy", load.busy_percent))
}

/// The table's note for a result past what its path allows, such as
/// `FAULT: above payload limit 0.966 Gbit/s`.
pub(crate) fn fault_note(f: &netgap_core::physics::Fault) -> String {
    match f.kind.as_str() {
        "faster_than_wire" => format!("FAULT: faster than the wire ({:.1} us)", f.limit),
        _ => format!("FAULT: above payload limit {:.3} Gbit/s", f.limit),
    }
}

/// A note for a point measured with `--ci` that missed its target, such as
/// `ci target missed: ±3.1% at 99%`; `None` otherwise.
pub(crate) fn ci_note(r: &ResultRecord) -> Option<String> {
    let ci = r.ci_target.as_ref().filter(|c| !c.met)?;
    let achieved = if ci.achieved_half_width_pct >= 0.0 {
        format!("±{:.1}%", ci.achieved_half_width_pct)
    } else {
        "no interval".to_string()
    };
    Some(format!(
        "ci target missed: {achieved} at {}% (wanted ±{}%)",
        ci.confidence_pct, ci.half_width_pct
    ))
}

/// How every noise warning of a record begins, old or diagnosed.
const NOISE_PREFIX: &str = "repetitions vary by ";

/// Most points a grouped warning names before it only counts the rest.
const POINTS_NAMED: usize = 6;

/// `a, b, c` for a few points; the first [`POINTS_NAMED`] and a count of
/// the rest for many.
fn point_list(points: &[&str]) -> String {
    if points.len() <= POINTS_NAMED {
        return points.join(", ");
    }
    format!(
        "{} and {} more",
        points[..POINTS_NAMED].join(", "),
        points.len() - POINTS_NAMED
    )
}

/// Prints the table and drives the progress bar.
pub struct TableObserver {
    bar: ProgressBar,
    started: Instant,
    bar_shown: bool,
    stderr_is_terminal: bool,
    reps_per_point: u32,
    header_printed: bool,
    /// Warnings other than noise, each with its point.
    warnings: Vec<String>,
    /// Each noisy point: its diagnosis and the point it concerns.
    noisy: Vec<(NoiseDiagnosis, String)>,
    points: usize,
}

impl TableObserver {
    /// A table for points of `reps_per_point` repetitions each.
    pub fn new(reps_per_point: u32) -> TableObserver {
        TableObserver {
            bar: ProgressBar::with_draw_target(None, ProgressDrawTarget::hidden()),
            started: Instant::now(),
            bar_shown: false,
            stderr_is_terminal: std::io::stderr().is_terminal(),
            reps_per_point,
            header_printed: false,
            warnings: Vec::new(),
            noisy: Vec::new(),
            points: 0,
        }
    }

    /// Full-sentence warnings collected from the records, for the end of the
    /// run: every warning that is not about noise, then the noisy points,
    /// each one when there are few, else one line per kind of noise (and
    /// remedy) with its count and the points it concerns.
    pub fn warnings(&self) -> Vec<String> {
        const SHOWN_ONE_BY_ONE: usize = 3;
        let mut out = self.warnings.clone();
        if self.noisy.len() <= SHOWN_ONE_BY_ONE {
            out.extend(
                self.noisy
                    .iter()
                    .map(|(d, p)| format!("{p}: {}", d.sentence)),
            );
            return out;
        }
        let mut groups: BTreeMap<(NoiseKind, &str), Vec<&str>> = BTreeMap::new();
        for (d, p) in &self.noisy {
            groups.entry((d.kind, &d.remedy)).or_default().push(p);
        }
        for ((kind, remedy), points) in groups {
            let verb = if points.len() == 1 { "is" } else { "are" };
            out.push(format!(
                "{} of {} points {verb} noisy with {} ({}); {remedy}",
                points.len(),
                self.points,
                kind.title(),
                point_list(&points)
            ));
        }
        out
    }

    /// Removes the progress bar.
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    fn maybe_show_bar(&mut self) {
        if !self.bar_shown && self.stderr_is_terminal && self.started.elapsed() >= PROGRESS_AFTER {
            self.bar.set_draw_target(ProgressDrawTarget::stderr());
            self.bar_shown = true;
        }
    }
}

impl Observer for TableObserver {
    fn point_started(&mut self, spec: &PointSpec, index: usize, total: usize) {
        if !self.header_printed {
            println!("{}", table_header());
            self.header_printed = true;
            let reps = u64::from(self.reps_per_point);
            self.bar.set_length(total as u64 * reps);
            self.bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} reps  {msg}  eta {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
        }
        self.bar
            .set_position(index as u64 * u64::from(self.reps_per_point));
        self.bar.set_message(format!(
            "{} {} {} {}",
            spec.test,
            spec.transport,
            spec.mode,
            format_size(spec.size_bytes)
        ));
        self.maybe_show_bar();
    }

    fn rep_done(&mut self, _rep: u32) {
        self.bar.inc(1);
        self.maybe_show_bar();
    }

    fn point_done(&mut self, record: &ResultRecord) {
        self.points += 1;
        let line = table_row(record);
        self.bar.suspend(|| {
            println!("{line}");
            let _ = std::io::stdout().flush();
        });
        let point = format!(
            "{} {} {} {}",
            record.test,
            record.transport,
            record.mode,
            format_size(record.size_bytes)
        );
        // The noise warning of a record (whichever words it was written
        // with) is replaced by the diagnosis, so noisy points group by kind.
        let diagnosis = netgap_core::noise::diagnose_record(record);
        // A fault's sentence, and a bound one's, names its point itself.
        let own_sentences = point_sentences(record);
        for w in &record.warnings {
            match &diagnosis {
                Some(d) if w == &d.sentence || w.starts_with(NOISE_PREFIX) => {}
                _ if own_sentences.contains(w) => self.warnings.push(w.clone()),
                _ => self.warnings.push(format!("{point}: {w}")),
            }
        }
        if let Some(d) =
            diagnosis.filter(|_| record.warnings.iter().any(|w| w.starts_with(NOISE_PREFIX)))
        {
            self.noisy.push((d, point));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use netgap_core::diagnose::diagnose;
    use netgap_core::record::RecordStats;
    use netgap_core::stats::Summary;

    /// `r` as its builder leaves it: diagnosed.
    fn diagnosed(mut r: ResultRecord) -> ResultRecord {
        diagnose(&mut r);
        r
    }

    /// A pingpong point of `size_bytes` with repetitions `reps`, its
    /// warnings as the record builders write them.
    fn point(size_bytes: u64, reps: &[f64]) -> ResultRecord {
        let mut r = crate::test_support::record(reps[0]);
        r.size_bytes = size_bytes;
        r.iterations_per_rep = Some(100_000);
        r.stats = Some(RecordStats::from(&Summary::from_reps(reps).unwrap()));
        diagnosed(r)
    }

    const DRIFT: [f64; 8] = [10.0, 10.6, 11.1, 11.5, 12.2, 12.6, 13.1, 13.7];
    const TWO_GROUPS: [f64; 8] = [10.0, 13.0, 10.1, 13.1, 9.9, 12.9, 10.0, 13.0];
    const QUIET: [f64; 4] = [10.0, 10.1, 9.9, 10.0];

    /// A workload point of `test` with `clients` and its own `options`,
    /// run with the `services` named.
    fn workload_point(
        test: &str,
        clients: u32,
        options: serde_json::Value,
        services: &[&str],
    ) -> ResultRecord {
        let mut r = crate::test_support::record(1000.0);
        r.test = test.to_string();
        r.metric = "transactions_per_s".into();
        let app = netgap_core::record::AppResult {
            options: options.as_object().cloned().unwrap_or_default(),
            services: services
                .iter()
                .map(|s| netgap_core::record::ServiceRecord {
                    name: s.to_string(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        };
        r.with_workload(netgap_core::record::WorkloadSection {
            clients,
            client_hosts: Some(3),
            flows: Vec::new(),
            hosts_cpu: Vec::new(),
            links: Vec::new(),
            app: Some(app),
        })
    }

    #[test]
    fn rows_of_a_run_show_what_sets_them_apart() {
        // A Figure 8a-style run over a list of servers, and a zipf run.
        let rows: Vec<String> = [
            workload_point(
                "web",
                12,
                serde_json::json!({"server": "nginx"}),
                &["nginx"],
            ),
            workload_point(
                "web",
                12,
                serde_json::json!({"server": "apache"}),
                &["apache"],
            ),
            workload_point("web", 12, serde_json::json!({}), &["nginx"]),
            workload_point(
                "web",
                12,
                serde_json::json!({"trace": "zipf", "alpha": 0.8}),
                &["nginx"],
            ),
        ]
        .iter()
        .map(table_row)
        .collect();
        let mut distinct = rows.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3, "{rows:#?}");
        assert!(rows[0].contains("server=nginx") && rows[0].contains("clients=12"));
        assert!(rows[1].contains("server=apache"));
        // No option named: the server it started.
        assert!(rows[2].contains("server=nginx"));
        assert!(rows[3].contains("alpha=0.8") && rows[3].contains("trace=zipf"));
        let pio = table_row(&workload_point(
            "pio",
            3,
            serde_json::json!({"servers": 1, "op": "read", "pattern": "tile"}),
            &[],
        ));
        assert!(
            pio.contains("op=read") && pio.contains("pattern=tile") && pio.contains("servers=1"),
            "{pio}"
        );
        let streams = table_row(&workload_point(
            "multistream",
            4,
            serde_json::json!({}),
            &[],
        ));
        assert!(streams.contains("streams=4"), "{streams}");
    }

    #[test]
    fn noisy_points_are_grouped_by_kind_with_their_count_and_points() {
        let mut t = TableObserver::new(8);
        for size in 1..=4 {
            t.point_done(&point(size, &DRIFT));
        }
        t.point_done(&point(5, &TWO_GROUPS));
        t.point_done(&point(6, &QUIET));
        let mut dropout = point(7, &QUIET);
        dropout.warnings.push("throughput drops".into());
        t.point_done(&dropout);
        let w = t.warnings();
        assert_eq!(w.len(), 3, "{w:#?}");
        assert_eq!(w[0], "pingpong tcp event 7: throughput drops");
        assert!(
            w[1].starts_with(
                "4 of 7 points are noisy with drift across repetitions (pingpong tcp event 1, "
            ),
            "{}",
            w[1]
        );
        assert!(
            w[1].ends_with("--interleave so drift falls on all of them alike"),
            "{}",
            w[1]
        );
        assert!(
            w[2].starts_with(
                "1 of 7 points is noisy with two groups of repetitions (pingpong tcp event 5); pin"
            ),
            "{}",
            w[2]
        );
    }

    #[test]
    fn a_point_above_its_payload_limit_is_a_fault_in_the_table_and_the_warnings() {
        use netgap_core::spec::{Mode, TransportOptions};
        use netgap_core::stack::{PathIdentity, Stack};
        let mut r = crate::test_support::record(1.2);
        r.test = "stream".into();
        r.metric = "bandwidth_gbps".into();
        r.size_bytes = 65536;
        r.stats = Some(RecordStats::from(&Summary::from_reps(&QUIET).unwrap()));
        let path = PathIdentity {
            kind: Some("testbed".into()),
            topology: Some("switch".into()),
            mtu_bytes: Some(1500),
            rate_bps: Some(1_000_000_000),
            ..PathIdentity::default()
        };
        let stack = Stack::new("tcp", Mode::Event, &TransportOptions::default(), path, None)
            .with_framing(Some(netgap_core::framing::Framing::Tcp));
        let r = diagnosed(r.with_stack(stack));
        let row = table_row(&r);
        assert!(
            row.contains("FAULT: above payload limit 0.966 Gbit/s"),
            "{row}"
        );
        assert!(!row.contains("noisy"), "{row}");
        let mut t = TableObserver::new(1);
        t.point_done(&r);
        let w = t.warnings();
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].starts_with("stream over tcp, 65536 B: 1.200 Gbit/s is above the 0.966 Gbit/s"),
            "{}",
            w[0]
        );
    }

    /// A stream record of `value` Gbit/s over a 1 Gbit/s testbed link at
    /// MTU 1500 (limit 0.956 Gbit/s), with repetitions `reps`, both ends'
    /// CPU readings (`busy`, `softirq`, each end's own percent of a core)
    /// on a 2-CPU machine, diagnosed.
    fn on_testbed(value: f64, reps: &[f64], busy: f64, softirq: f64, own: f64) -> ResultRecord {
        use netgap_core::cpu::CpuUsage;
        use netgap_core::host::HostFacts;
        use netgap_core::record::CpuPair;
        use netgap_core::spec::{Mode, TransportOptions};
        use netgap_core::stack::{PathIdentity, Stack};
        let mut r = crate::test_support::record(value);
        r.test = "stream".into();
        r.metric = "bandwidth_gbps".into();
        r.size_bytes = 65536;
        r.stats = Some(RecordStats::from(&Summary::from_reps(reps).unwrap()));
        let usage = CpuUsage {
            system_busy_percent: busy,
            process_percent: own,
            softirq_percent: Some(softirq),
            ..CpuUsage::default()
        };
        r.cpu = Some(CpuPair {
            local: usage,
            remote: usage,
        });
        let facts = |name: &str| HostFacts {
            hostname: name.into(),
            cores: 2,
            ..HostFacts::default()
        };
        r.host = Some(facts("h2"));
        r.peer_host = Some(facts("h1"));
        let path = PathIdentity {
            kind: Some("testbed".into()),
            topology: Some("mesh".into()),
            mtu_bytes: Some(1500),
            rate_bps: Some(1_000_000_000),
            ..PathIdentity::default()
        };
        let stack = Stack::new("tcp", Mode::Event, &TransportOptions::default(), path, None)
            .with_framing(Some(netgap_core::framing::Framing::Tcp));
        diagnosed(r.with_stack(stack))
    }

    #[test]
    fn a_quiet_point_held_below_its_limit_by_the_forwarding_names_the_emulator() {
        // 0.5 of 0.956 Gbit/s, quiet, the machine full: a third of it
        // forwarding, netgap's two ends 60% of a core each.
        let r = on_testbed(0.5, &[0.5, 0.5, 0.501, 0.499], 99.0, 35.0, 60.0);
        let load = r.cpu_load.as_ref().unwrap();
        assert_eq!(load.bound_by, Some(netgap_core::load::BoundBy::Emulator));
        let row = table_row(&r);
        assert!(row.contains("emulator-bound: forwarding 35%"), "{row}");
        assert!(!row.contains("noisy"), "{row}");
        let mut t = TableObserver::new(1);
        t.point_done(&r);
        let w = t.warnings();
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].starts_with(
                "stream over tcp, 65536 B: 0.500 Gbit/s is 52% of the 0.956 Gbit/s its path can \
                 carry while the testbed's forwarding used 35% of the CPUs: the emulator, not the \
                 links, bound this point; lower the links' rate"
            ),
            "{}",
            w[0]
        );
        assert!(!w[0].contains("quieter host"), "{}", w[0]);
        // At its limit the links bound it, whatever the forwarding.
        let r = on_testbed(0.95, &[0.95, 0.95, 0.951, 0.949], 99.0, 35.0, 60.0);
        assert_eq!(r.cpu_load.as_ref().unwrap().bound_by, None);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert!(!table_row(&r).contains("emulator"));
        // A machine with CPU to spare did not bind it.
        let r = on_testbed(0.5, &[0.5, 0.5, 0.501, 0.499], 70.0, 35.0, 20.0);
        assert_eq!(r.cpu_load.as_ref().unwrap().bound_by, None);
    }

    #[test]
    fn a_quiet_stream_held_below_its_limit_on_idle_cpus_names_the_shaper() {
        // 0.67 of 0.956 Gbit/s, quiet, the machine 15% busy, each end 30%
        // of a core.
        let r = on_testbed(0.67, &[0.67, 0.67, 0.671, 0.669], 15.0, 5.0, 30.0);
        let load = r.cpu_load.as_ref().unwrap();
        assert_eq!(load.bound_by, Some(netgap_core::load::BoundBy::Shaper));
        assert!(r.shaper_held() && !r.emulator_bound());
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        let row = table_row(&r);
        assert!(row.contains("; shaper-held: CPUs 15% busy"), "{row}");
        assert!(!row.contains("noisy") && !row.contains("emulator"), "{row}");
        let mut t = TableObserver::new(1);
        t.point_done(&r);
        let w = t.warnings();
        assert_eq!(w.len(), 1, "{w:#?}");
        assert!(
            w[0].starts_with(
                "stream over tcp, 65536 B: 0.670 Gbit/s is 70% of the 0.956 Gbit/s its path can \
                 carry while the CPUs were 15% busy: the testbed's shaper, not the stack, held \
                 this point; compare with the unshaped link (netgap testbed set --rate none)"
            ),
            "{}",
            w[0]
        );
        // A busy end, or a busy machine: not the shaper.
        let r = on_testbed(0.67, &[0.67, 0.67, 0.671, 0.669], 15.0, 5.0, 90.0);
        assert_eq!(r.cpu_load.as_ref().unwrap().bound_by, None);
        assert!(r.warnings.is_empty(), "{:?}", r.warnings);
        assert!(!table_row(&r).contains("shaper"));
        let r = on_testbed(0.67, &[0.67, 0.67, 0.671, 0.669], 60.0, 5.0, 30.0);
        assert_eq!(r.cpu_load.as_ref().unwrap().bound_by, None);
    }

    #[test]
    fn a_noisy_point_says_the_emulator_once_and_busy_loops_are_other_work() {
        let r = on_testbed(0.5, &DRIFT.map(|v| v / 20.0), 99.0, 35.0, 60.0);
        assert_eq!(r.warnings.len(), 1, "{:?}", r.warnings);
        assert!(
            r.warnings[0].contains("forwarding used 35% of the CPUs: the emulator"),
            "{}",
            r.warnings[0]
        );
        let row = table_row(&r);
        assert!(
            row.contains("noisy; emulator-bound: forwarding 35%"),
            "{row}"
        );
        let mut t = TableObserver::new(1);
        t.point_done(&r);
        assert!(
            t.warnings()[0].starts_with("stream tcp event 64K: repetitions vary by"),
            "{:?}",
            t.warnings()
        );
        // A process spinning beside the testbed: other work, never the
        // emulator.
        let r = on_testbed(0.5, &DRIFT.map(|v| v / 20.0), 100.0, 5.0, 20.0);
        assert_eq!(r.cpu_load.as_ref().unwrap().bound_by, None);
        assert!(
            r.warnings[0].contains("while other work kept 75% of the testbed machine's CPUs busy"),
            "{}",
            r.warnings[0]
        );
        assert!(!table_row(&r).contains("emulator"));
    }

    #[test]
    fn a_few_noisy_points_are_shown_one_by_one() {
        let mut t = TableObserver::new(8);
        t.point_done(&point(1, &DRIFT));
        let w = t.warnings();
        assert_eq!(w.len(), 1);
        assert!(
            w[0].starts_with("pingpong tcp event 1: repetitions vary by"),
            "{}",
            w[0]
        );
    }

    #[test]
    fn a_long_list_of_points_is_cut_with_a_count() {
        let many: Vec<String> = (0..9).map(|i| i.to_string()).collect();
        let refs: Vec<&str> = many.iter().map(String::as_str).collect();
        assert_eq!(point_list(&refs), "0, 1, 2, 3, 4, 5 and 3 more");
        assert_eq!(point_list(&refs[..2]), "0, 1");
    }
}
