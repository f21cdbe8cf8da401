//! Reading results files for the report and `compare`: every line is a
//! [`ResultRecord`], plus the fields of tests that add their own (sweep,
//! LogP, multi-host), read leniently so a file written by any netgap
//! version, or imported from a peer tool, loads.

use netgap_core::cpu::CpuUsage;
use netgap_core::record::ResultRecord;
use netgap_core::stack::Stack;
use serde::Deserialize;
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

/// A sweep point's throughput dropout (NetPIPE's signature dip).
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct Dropout {
    /// How far below the reference the throughput fell, percent.
    pub depth_pct: f64,
    /// Size of the reference point, bytes.
    pub reference_size_bytes: u64,
    /// Throughput at the reference point, in the record's metric unit.
    pub reference_value: f64,
}

/// Whether a `--ci` target was met.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct CiOutcome {
    /// Confidence level, percent.
    pub confidence_pct: f64,
    /// Target half-width, percent of the mean.
    pub half_width_pct: f64,
    /// Half-width reached, percent of the mean.
    pub achieved_half_width_pct: f64,
    /// The target was met.
    pub met: bool,
}

/// CPU usage of one host of a workload point.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct HostCpu {
    /// Host name.
    pub host: String,
    /// `server` or `client`.
    pub role: String,
    /// Its usage.
    pub cpu: CpuUsage,
}

/// One flow of a multi-flow point.
#[derive(Debug, Clone, PartialEq, Deserialize)]
pub struct FlowResult {
    /// Host the flow's client ran on.
    pub host: String,
    /// Flow number.
    pub index: u32,
    /// The flow's own headline value, in the record's metric unit.
    pub value: f64,
}

/// The repetition statistics as the report reads them: only what it uses,
/// each field optional, so records whose confidence interval is `null`
/// (fewer than two repetitions) load as well as older ones.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct RepStats {
    /// Lower end of the 95% confidence interval of the mean.
    pub ci95_low: Option<f64>,
    /// Upper end of the 95% confidence interval of the mean.
    pub ci95_high: Option<f64>,
    /// Each repetition's value.
    pub reps: Vec<f64>,
}

/// A point measured in an interleaved run: its repetitions alternated with
/// those of the other stacks of the same group, so drift fell on all alike.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Interleaved {
    /// The run's interleaving group; records sharing it were measured
    /// together.
    pub group: String,
    /// How many stacks the point's repetitions alternated with; `None` when
    /// the record does not say.
    #[serde(default, deserialize_with = "lenient")]
    pub with: Option<u32>,
}

/// Fields other tests add to a record; all optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Extras {
    /// Sweep flavour (`pingpong`, `stream`, `bidir`).
    pub sweep_kind: Option<String>,
    /// Time of one block transfer, µs (sweep).
    pub block_time_us: Option<f64>,
    /// A throughput dropout at this point (sweep).
    #[serde(deserialize_with = "lenient")]
    pub dropout: Option<Dropout>,
    /// Outcome of a `--ci` target.
    #[serde(deserialize_with = "lenient")]
    pub ci_target: Option<CiOutcome>,
    /// Concurrent clients, streams or links of the point.
    pub clients: Option<u32>,
    /// Hosts the clients ran on.
    pub client_hosts: Option<u32>,
    /// Per-flow results.
    pub flows: Vec<FlowResult>,
    /// CPU usage of every host.
    pub hosts_cpu: Vec<HostCpu>,
    /// Repetition statistics, read leniently.
    #[serde(deserialize_with = "lenient")]
    pub stats: Option<RepStats>,
    /// Set when the point was measured in an interleaved run.
    #[serde(deserialize_with = "lenient")]
    pub interleaved: Option<Interleaved>,
}

/// An optional field read leniently: a value of another shape (a field a
/// newer or older netgap writes differently) reads as absent, so the
/// report loses that one detail instead of refusing the whole file.
fn lenient<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: serde::de::DeserializeOwned,
{
    let v = serde_json::Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// One record as loaded, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The record.
    pub record: ResultRecord,
    /// Fields of sweep, LogP and workloads.
    pub extras: Extras,
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
    /// A record that did not come from a file line (an import in memory):
    /// its extra fields are read from the record itself.
    pub fn from_record(record: ResultRecord, file: PathBuf, line: usize) -> Loaded {
        // Serializing a plain data record cannot fail; a default Extras
        // would only lose optional fields.
        let extras = serde_json::to_value(&record)
            .ok()
            .and_then(|v| serde_json::from_value(v).ok())
            .unwrap_or_default();
        Loaded::new(record, extras, file, line)
    }

    fn new(mut record: ResultRecord, extras: Extras, file: PathBuf, line: usize) -> Loaded {
        // Judged again by this netgap's model, so a record from an older
        // netgap, or one edited, past its path's limit is a fault here too.
        if record.stack.is_some() {
            record.physics = netgap_core::physics::assess(&record);
            if let Some(f) = record.fault() {
                let sentence = netgap_core::physics::fault_sentence(&record, f);
                if !record.warnings.contains(&sentence) {
                    record.warnings.push(sentence);
                }
            }
        }
        let stack = Stack::of_record(&record);
        let variant = variant_of(&record);
        Loaded {
            record,
            extras,
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
        let s = self.extras.stats.as_ref()?;
        let (lo, hi) = (s.ci95_low?, s.ci95_high?);
        let enough = s.reps.len() >= 2 || (s.reps.is_empty() && lo < hi);
        (enough && lo.is_finite() && hi.is_finite() && lo <= hi).then_some((lo, hi))
    }

    /// The repetitions' values; empty when the record has none.
    pub fn reps(&self) -> &[f64] {
        self.extras
            .stats
            .as_ref()
            .map_or(&[], |s| s.reps.as_slice())
    }

    /// The interleaving group of the run that measured the point, if any.
    pub fn interleaved_group(&self) -> Option<&str> {
        // netgap writes it under `options`; a top-level one is read too.
        let from_options = self
            .record
            .options
            .as_ref()
            .and_then(|o| o.interleaved.as_ref())
            .map(|i| i.group.as_str());
        from_options
            .or_else(|| self.extras.interleaved.as_ref().map(|i| i.group.as_str()))
            .filter(|g| !g.is_empty())
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
        match &self.extras.sweep_kind {
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
        let extras: Extras = serde_json::from_str(line).map_err(|e| bad(n, e.to_string()))?;
        out.records
            .push(Loaded::new(record, extras, path.to_path_buf(), n));
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

    #[test]
    fn fields_of_another_shape_read_as_absent_instead_of_failing_the_file() {
        let extras: Extras = serde_json::from_str(
            r#"{"interleaved": {"group": "g", "with": ["a", "b"]}, "dropout": {"depth": 3},
                "stats": {"ci95_low": null, "ci95_high": null, "reps": [1.0]}}"#,
        )
        .expect("loads");
        assert_eq!(
            extras.interleaved,
            Some(Interleaved {
                group: "g".into(),
                with: None
            })
        );
        assert_eq!(extras.dropout, None);
        assert_eq!(extras.stats.and_then(|s| s.ci95_low), None);
    }
}
