//! Reading results files for the report and `compare`: every line is a
//! [`ResultRecord`], read as the result model reads it (leniently, so a
//! file written by any netgap version, or imported from a peer tool,
//! loads); a line that is none is refused naming its file and line.

use netgap_core::record::ResultRecord;
use netgap_core::stack::Stack;
use std::path::{Path, PathBuf};

/// Why a results file could not be loaded; one line naming file and line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read: missing, not a regular file, past
    /// [`Cap::RESULTS`](netgap_core::files::Cap::RESULTS).
    #[error(transparent)]
    File(#[from] netgap_core::files::ReadError),
    /// A line is not a result record.
    #[error("{path}:{line}: not a netgap result record: {message}")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// The parser's complaint.
        message: String,
    },
}

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
    /// A record that did not come from a file line (an import in memory).
    pub fn from_record(record: ResultRecord, file: PathBuf, line: usize) -> Loaded {
        Loaded::new(record, file, line)
    }

    fn new(mut record: ResultRecord, file: PathBuf, line: usize) -> Loaded {
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

/// Longest line a results file may hold, in bytes: far above any record
/// (a workload point with thousands of flows is a few MiB), and a bound
/// on what a file that is no results file (`/dev/zero`) makes us read.
pub const MAX_LINE_BYTES: usize = 64 << 20;

/// A line cut short by a crash or a full disk: a record's beginning whose
/// end was never written. Readers skip it and say so.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TornLine {
    /// The file.
    pub path: PathBuf,
    /// 1-based line number.
    pub line: usize,
    /// Its length in bytes.
    pub bytes: usize,
}

impl std::fmt::Display for TornLine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}: a torn record ({} bytes, cut short by a crash or a full disk) was skipped",
            self.path.display(),
            self.line,
            self.bytes
        )
    }
}

/// The intact records of a results file, and its torn lines.
#[derive(Debug, Clone, Default)]
pub struct LoadedFile {
    /// Every record, in file order.
    pub records: Vec<Loaded>,
    /// Lines that end before their record does.
    pub torn: Vec<TornLine>,
}

/// Reads every record of a JSON Lines results file; blank lines are
/// skipped and a bad line is an error naming its number, except a torn
/// line (a record's beginning, cut short), which is skipped and listed.
/// Reads at most [`MAX_LINE_BYTES`] per line and
/// [`Cap::RESULTS`](netgap_core::files::Cap::RESULTS) in all, and only a
/// regular file.
pub fn load_file_parts(path: &Path) -> Result<LoadedFile, LoadError> {
    use std::io::{BufRead, Read};
    let file = netgap_core::files::open(path, netgap_core::files::Cap::RESULTS)?;
    let mut reader = std::io::BufReader::new(file);
    let read_err = |reader: &std::io::BufReader<netgap_core::files::Bounded>, e| {
        LoadError::File(reader.get_ref().error(e))
    };
    let bad = |line: usize, message: String| LoadError::BadLine {
        path: path.to_path_buf(),
        line,
        message,
    };
    let mut out = LoadedFile::default();
    let mut buf = Vec::new();
    for n in 1.. {
        buf.clear();
        let got = (&mut reader)
            .take(MAX_LINE_BYTES as u64 + 1)
            .read_until(b'\n', &mut buf);
        let got = match got {
            Ok(n) => n,
            Err(e) => return Err(read_err(&reader, e)),
        };
        if got == 0 {
            break;
        }
        if buf.len() > MAX_LINE_BYTES {
            return Err(bad(
                n,
                format!("a line longer than {MAX_LINE_BYTES} bytes: not a results file"),
            ));
        }
        let line = std::str::from_utf8(&buf)
            .map_err(|_| bad(n, "not UTF-8 text: not a results file".into()))?
            .trim_end_matches(['\n', '\r']);
        if line.trim().is_empty() {
            continue;
        }
        let record: ResultRecord = match serde_json::from_str(line) {
            Ok(r) => r,
            Err(e) if e.is_eof() => {
                out.torn.push(TornLine {
                    path: path.to_path_buf(),
                    line: n,
                    bytes: line.len(),
                });
                continue;
            }
            Err(e) => return Err(bad(n, e.to_string())),
        };
        out.records.push(Loaded::new(record, path.to_path_buf(), n));
    }
    mark_repeats(&mut out.records);
    Ok(out)
}

/// Records of one file that measured the same point of the same series
/// (a run that listed a point twice) are all kept: the second and later
/// get `repeat=N` in their variant, so they form series of their own
/// instead of shadowing the first. Only records from different files can
/// shadow each other.
fn mark_repeats(records: &mut [Loaded]) {
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

/// The intact records of a results file (see [`load_file_parts`]).
pub fn load_file(path: &Path) -> Result<Vec<Loaded>, LoadError> {
    load_file_parts(path).map(|f| f.records)
}

/// Reads several results files, in order: every intact record and every
/// torn line.
pub fn load_files_parts(paths: &[PathBuf]) -> Result<LoadedFile, LoadError> {
    let mut all = LoadedFile::default();
    for p in paths {
        let f = load_file_parts(p)?;
        all.records.extend(f.records);
        all.torn.extend(f.torn);
    }
    Ok(all)
}

/// Reads several results files, in order.
pub fn load_files(paths: &[PathBuf]) -> Result<Vec<Loaded>, LoadError> {
    load_files_parts(paths).map(|f| f.records)
}

/// Whether a smaller value of `metric` is better: latencies, overheads,
/// gaps and times (`_us`, `_ns`) are; bandwidths and rates are not.
pub fn lower_is_better(metric: &str) -> bool {
    metric.ends_with("_us") || metric.ends_with("_ns") || metric.ends_with("_ms")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_torn_line_is_skipped_and_named_and_endless_input_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.jsonl");
        std::fs::write(&path, "{\"test\":\"pin\n").expect("write");
        let f = load_file_parts(&path).expect("a torn line is no error");
        assert!(f.records.is_empty());
        assert_eq!(f.torn.len(), 1);
        assert_eq!(f.torn[0].line, 1);
        std::fs::write(&path, "{\"test\": 3}\n").expect("write");
        assert!(
            load_file_parts(&path).is_err(),
            "a complete bad record is an error"
        );
        // Endless input is no regular file: refused before any read.
        let e = load_file_parts(Path::new("/dev/zero")).expect_err("bounded");
        assert!(
            matches!(
                e,
                LoadError::File(netgap_core::files::ReadError::NotRegular { .. })
            ),
            "{e}"
        );
    }
}
