//! What the user sees while a run goes: an aligned table on stdout, one row
//! per point as soon as it is measured, with units in the headers; and a
//! progress bar on stderr once a run has lasted a couple of seconds, never
//! when stderr is not a terminal.

use crate::coordinator::Observer;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use netgap_core::record::ResultRecord;
use netgap_core::spec::PointSpec;
use netgap_core::units::format_size;
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
    } else if r.metric == "connections_per_s" {
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
    // Multi-host points show the busiest client host and the server.
    let group_cpu = (!r.hosts_cpu.is_empty()).then(|| {
        let pct = |role: &str, pick: fn(f64, f64) -> f64| {
            r.hosts_cpu
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
        if let Some((client, server)) = &group_cpu {
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
    let mut notes: Vec<String> = Vec::new();
    // Rows of an interleaved comparison differ in their conditions, which
    // the other columns do not show.
    if let (Some(stack), Some(_)) = (
        &r.stack,
        r.options.as_ref().and_then(|o| o.interleaved.as_ref()),
    ) {
        let p = &stack.path;
        let mut c = Vec::new();
        if let Some(m) = p.mtu_bytes {
            c.push(format!("mtu {m}"));
        }
        if let Some(o) = &p.offload {
            c.push(format!("offload {o}"));
        }
        if let Some(q) = p.qdisc.as_deref().filter(|q| *q != "noqueue") {
            c.push(q.to_string());
        }
        if !c.is_empty() {
            notes.push(c.join(" "));
        }
    }
    if let Some(n) = r.clients {
        notes.push(format!("clients={n}"));
    }
    if r.metric == "connections_per_s" {
        notes.push(format!("{} conn/s", fmt_num(r.value)));
    }
    if !r.warnings.is_empty() {
        notes.push("noisy".into());
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

/// Prints the table and drives the progress bar.
pub struct TableObserver {
    bar: ProgressBar,
    started: Instant,
    bar_shown: bool,
    stderr_is_terminal: bool,
    reps_per_point: u32,
    header_printed: bool,
    warnings: Vec<String>,
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
            points: 0,
        }
    }

    /// Full-sentence warnings collected from the records, for the end of the
    /// run: each one when there are few, else one line that counts them.
    pub fn warnings(&self) -> Vec<String> {
        const SHOWN_ONE_BY_ONE: usize = 3;
        if self.warnings.len() <= SHOWN_ONE_BY_ONE {
            return self.warnings.clone();
        }
        vec![format!(
            "{} of {} points are noisy (their repetitions vary by more than {:.0}%; each is marked in the table and its results record); pin the client and server with --pin, close other work on the machine, or raise --reps",
            self.warnings.len(),
            self.points,
            netgap_core::stats::NOISY_CV * 100.0
        )]
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
        for w in &record.warnings {
            self.warnings.push(format!(
                "{} {} {} {}: {w}",
                record.test,
                record.transport,
                record.mode,
                format_size(record.size_bytes)
            ));
        }
    }
}
