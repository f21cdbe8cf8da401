//! A record as the report and `compare` read it: the [`ResultRecord`] with
//! the file and line it came from, its stack and what else sets its series
//! apart. Reading the files is [`crate::load`]'s.

use netgap_core::record::ResultRecord;
use netgap_core::stack::Stack;
use std::path::PathBuf;

/// One record as loaded, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The record.
    pub record: ResultRecord,
    /// The file it was read from.
    pub file: PathBuf,
    /// Its 1-based line in that file.
    pub line: usize,
    /// What it measured over ([`Stack::of_record`]); two records belong to
    /// the same series exactly when their stacks (and hosts) are equal.
    pub stack: Stack,
    /// Everything else that changes what the point measured, as sorted
    /// `name=value` entries ([`variant_of`]); part of its series' identity.
    pub variant: Vec<String>,
}

/// What a record's stack does not say but that changes what it measured,
/// as sorted `name=value` entries: every option of the workload's own as
/// the point ran it (`alpha=0.8`, `op=read`, `responder=gmond`), the server
/// program it ran when no option names it (`server=nginx`), the CPUs the
/// roles were pinned to (`pin=2/3`), and `bidir`. Read from the record's
/// sections, never from a list of known options, so a workload's new
/// option sets series apart without a change here.
pub fn variant_of(r: &ResultRecord) -> Vec<String> {
    let mut out = Vec::new();
    if let Some(app) = r.workload.as_ref().and_then(|w| w.app.as_ref()) {
        out.extend(app.variant());
    }
    if let Some(o) = &r.options {
        let p = o.placement;
        if p.client_cpu.is_some() || p.server_cpu.is_some() {
            let cpu = |c: Option<u32>| c.map_or_else(|| "-".to_string(), |c| c.to_string());
            out.push(format!("pin={}/{}", cpu(p.client_cpu), cpu(p.server_cpu)));
        }
        if o.bidir {
            out.push("bidir".to_string());
        }
    }
    out.sort();
    out
}

impl Loaded {
    /// `record`, read from `file` at `line` (an import in memory names
    /// the file it came from and its place there).
    pub fn from_record(mut record: ResultRecord, file: PathBuf, line: usize) -> Loaded {
        // Judged again by this netgap's model, so a record from an older
        // netgap, or one edited, past its path's limit is a fault here too.
        netgap_core::diagnose::reassess_physics(&mut record);
        let stack = Stack::of_record(&record);
        let variant = variant_of(&record);
        Loaded {
            record,
            file,
            line,
            stack,
            variant,
        }
    }

    /// The 95% confidence interval of the mean, `(low, high)` in the
    /// metric's unit; `None` when the record has none: no statistics, a
    /// `null` bound, or fewer than two repetitions (whose zero-width
    /// interval older records wrote would claim a certainty they lack).
    pub fn ci95(&self) -> Option<(f64, f64)> {
        let s = self.record.stats.as_ref()?;
        let (lo, hi) = (s.ci95_low?, s.ci95_high?);
        let enough = s.reps.len() >= 2 || (s.reps.is_empty() && lo < hi);
        (enough && lo.is_finite() && hi.is_finite() && lo <= hi).then_some((lo, hi))
    }

    /// The repetitions' values; empty when the record has none.
    pub fn reps(&self) -> &[f64] {
        self.record
            .stats
            .as_ref()
            .map_or(&[], |s| s.reps.as_slice())
    }

    /// The interleaving group of the run that measured the point, if any
    /// ([`ResultRecord::interleaved_group`]).
    pub fn interleaved_group(&self) -> Option<&str> {
        self.record.interleaved_group()
    }

    /// The test this record is shown with: its own test, with the sweep's
    /// kind (`sweep (stream)`), so that sweeps of different kinds are never
    /// one series. A NetPIPE import's throughput is a ping-pong sweep, so it
    /// is drawn beside `netgap sweep`'s; its latency stays with `pingpong`.
    pub fn section(&self) -> String {
        let r = &self.record;
        let netpipe_throughput = r.tool() == Some("NPtcp") && r.metric == "bandwidth_gbps";
        if netpipe_throughput {
            return "sweep (pingpong)".to_string();
        }
        match r.sweep_kind() {
            Some(kind) => format!("{} ({kind})", r.test),
            None => r.test.clone(),
        }
    }

    /// Where the point ran: the coordinator's host name, with the agent's
    /// when it is another host (`node2 -> node1`); `None` when unknown.
    pub fn hosts(&self) -> Option<String> {
        let r = &self.record;
        let local = r.host.as_ref()?.hostname.clone();
        Some(match &r.peer_host {
            Some(p) if p.hostname != local => format!("{local} -> {}", p.hostname),
            _ => local,
        })
    }
}

/// Records of one file that measured the same point of the same series
/// (a run that listed a point twice) are all kept: the second and later
/// get `repeat=N` in their variant, so they form series of their own
/// instead of shadowing the first. Only records from different files can
/// shadow each other.
pub(crate) fn mark_repeats(records: &mut [Loaded]) {
    let mut seen: std::collections::BTreeMap<String, u32> = std::collections::BTreeMap::new();
    for l in records.iter_mut() {
        let app = l
            .record
            .workload
            .as_ref()
            .map(|w| (w.clients, w.client_hosts));
        let key = format!(
            "{}|{:?}|{:?}|{:?}|{}|{}|{:?}",
            l.section(),
            l.stack,
            l.hosts(),
            l.variant,
            l.record.metric,
            l.record.size_bytes,
            app
        );
        let n = seen.entry(key).or_default();
        *n += 1;
        if *n > 1 {
            l.variant.push(format!("repeat={n}"));
            l.variant.sort();
        }
    }
}

/// Whether a smaller value of `metric` is better: latencies, overheads,
/// gaps and times (`_us`, `_ns`) are; bandwidths and rates are not.
pub fn lower_is_better(metric: &str) -> bool {
    metric.ends_with("_us") || metric.ends_with("_ns") || metric.ends_with("_ms")
}
