//! Reading results of peer tools (iperf3, NetPIPE, sockperf, the OSU
//! micro-benchmarks) into netgap [`ResultRecord`]s, so the report and
//! `compare` treat them like netgap's own points. Each format is one module
//! behind the [`Importer`] trait and one line in [`registry`].
//!
//! Imported records name their tool in `tool`, carry netgap's units (one-way
//! latency in µs, Gbit/s = 10^9 bit/s of payload) and leave empty (`None`)
//! what the tool did not measure: host facts, options, CPU, byte counts, and
//! repetition statistics unless the tool reported repetitions.

mod iperf3;
mod netpipe;
mod osu;
mod sockperf;

use netgap_core::record::{RecordHead, RecordStats, ResultRecord};
use netgap_core::spec::Mode;
use netgap_core::stats::{Percentiles, Summary};
use std::path::{Path, PathBuf};

/// Why a file could not be imported. Displayed as one line naming the file
/// and, when the problem is in one line, the line number.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// No importer has that name.
    #[error("unknown import format {0:?} (known: {known})", known = names().join(", "))]
    UnknownFormat(String),
    /// The file could not be read: missing, not a regular file, past
    /// [`Cap::IMPORT`](netgap_core::files::Cap::IMPORT).
    #[error(transparent)]
    File(#[from] netgap_core::files::ReadError),
    /// The file's content is not what the format expects.
    #[error("{path}{}: {message}", line.map(|l| format!(":{l}")).unwrap_or_default())]
    Malformed {
        /// The file.
        path: PathBuf,
        /// 1-based line number, when one line is at fault.
        line: Option<usize>,
        /// What is wrong, in one sentence.
        message: String,
    },
}

/// A problem found while parsing text, before the file name is attached.
#[derive(Debug, Clone, PartialEq)]
pub struct ParseError {
    /// 1-based line number, when one line is at fault.
    pub line: Option<usize>,
    /// What is wrong.
    pub message: String,
}

impl ParseError {
    fn at(line: usize, message: impl Into<String>) -> ParseError {
        ParseError {
            line: Some(line),
            message: message.into(),
        }
    }

    fn whole(message: impl Into<String>) -> ParseError {
        ParseError {
            line: None,
            message: message.into(),
        }
    }
}

/// What the caller knows that a file may not say.
#[derive(Debug, Clone, Default)]
pub struct ImportContext {
    /// Message size in bytes, for formats whose output omits it (sockperf's
    /// ping-pong summary); ignored when the file states the size.
    pub size_bytes: Option<u64>,
    /// Start time to record (RFC 3339) when the file has none.
    pub time: String,
}

/// One peer tool's output format.
pub trait Importer: Sync {
    /// The format's name on the command line (`iperf3`, `netpipe`, ...).
    fn name(&self) -> &'static str;
    /// One line on what output this reads.
    fn summary(&self) -> &'static str;
    /// Parses the whole output into records; never panics on any input.
    fn parse(&self, text: &str, ctx: &ImportContext) -> Result<Vec<ResultRecord>, ParseError>;
}

/// Every importer, in the order `netgap import --help` lists them.
pub fn registry() -> &'static [&'static dyn Importer] {
    &[
        &iperf3::Iperf3,
        &netpipe::NetPipe,
        &sockperf::Sockperf,
        &osu::Osu,
    ]
}

impl netgap_core::registry::Named for dyn Importer {
    fn name(&self) -> &'static str {
        Importer::name(self)
    }
}

/// The names of the importers.
pub fn names() -> Vec<&'static str> {
    registry().iter().map(|i| i.name()).collect()
}

/// Imports `path` in `format`. The records keep the tool's numbers in
/// netgap's units; their `time` is the tool's own when the file has one, else
/// the file's modification time.
pub fn import_file(
    format: &str,
    path: &Path,
    size_bytes: Option<u64>,
) -> Result<Vec<ResultRecord>, ImportError> {
    let importer = netgap_core::registry::find(registry(), format)
        .ok_or_else(|| ImportError::UnknownFormat(format.to_string()))?;
    let text = netgap_core::files::read_to_string(path, netgap_core::files::Cap::IMPORT)?;
    let modified = std::fs::metadata(path)
        .and_then(|m| m.modified())
        .unwrap_or_else(|_| std::time::SystemTime::now());
    let ctx = ImportContext {
        size_bytes,
        time: humantime::format_rfc3339_seconds(modified).to_string(),
    };
    let records = importer
        .parse(&text, &ctx)
        .map_err(|e| ImportError::Malformed {
            path: path.to_path_buf(),
            line: e.line,
            message: e.message,
        })?;
    if records.is_empty() {
        return Err(ImportError::Malformed {
            path: path.to_path_buf(),
            line: None,
            message: format!("no {format} results found"),
        });
    }
    Ok(records)
}

/// Labels imported records, as `--label` labels a run: the label is part of
/// each record's stack, so two imports of the same tool under different
/// labels are two series in a report instead of one merged line. The
/// stack is the one a record without a stack would be read with
/// ([`Stack::of_record`](netgap_core::stack::Stack::of_record)), labelled.
pub fn label_records(records: &mut [ResultRecord], label: &str) {
    for r in records.iter_mut() {
        let mut stack = netgap_core::stack::Stack::of_record(r);
        stack.label = Some(label.to_string());
        r.stack = Some(stack);
    }
}

/// The measured parts of one imported point; everything else stays empty.
struct Imported<'a> {
    tool: &'a str,
    test: &'a str,
    transport: &'a str,
    size_bytes: u64,
    metric: &'a str,
    value: f64,
    reps: Option<&'a [f64]>,
    percentiles: Option<Percentiles>,
    time: &'a str,
}

impl Imported<'_> {
    fn record(self) -> ResultRecord {
        let stats = self
            .reps
            .and_then(|r| Summary::from_reps(r).ok())
            .map(|s| RecordStats::from(&s));
        let mut record = ResultRecord::new(RecordHead {
            test: self.test.to_string(),
            transport: self.transport.to_string(),
            // The peer tools here block in the kernel by default.
            mode: Mode::Event,
            size_bytes: self.size_bytes,
            metric: self.metric.to_string(),
            value: self.value,
            time: self.time.to_string(),
        })
        .imported_from(self.tool);
        record.stats = stats;
        record.percentiles = self.percentiles;
        record
    }
}

/// Parses a finite, non-negative number, or says what was found instead.
fn number(text: &str, what: &str, line: usize) -> Result<f64, ParseError> {
    match text.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && v >= 0.0 => Ok(v),
        _ => Err(ParseError::at(
            line,
            format!(
                "expected {what} as a non-negative number, found {:?}",
                text.trim()
            ),
        )),
    }
}

/// Parses a whole number of bytes, or says what was found instead.
fn size(text: &str, line: usize) -> Result<u64, ParseError> {
    text.trim().parse::<u64>().map_err(|_| {
        ParseError::at(
            line,
            format!("expected a message size in bytes, found {:?}", text.trim()),
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_importer_has_a_distinct_name() {
        let mut n = names();
        n.sort();
        n.dedup();
        assert_eq!(n.len(), registry().len());
    }

    proptest::proptest! {
        /// Whatever a file holds, every importer answers with records or an
        /// error, never a panic.
        #[test]
        fn no_input_panics_an_importer(text in "(?s).{0,400}", lines in proptest::collection::vec("[ 0-9.#a-zA-Z=:>-]{0,40}", 0..12)) {
            let ctx = ImportContext { size_bytes: Some(64), time: "2026-01-01T00:00:00Z".into() };
            let joined = lines.join("\n");
            for importer in registry() {
                let _ = importer.parse(&text, &ctx);
                let _ = importer.parse(&joined, &ctx);
            }
        }
    }

    #[test]
    fn an_unknown_format_lists_the_known_ones() {
        let e = import_file("gnuplot", Path::new("x"), None).unwrap_err();
        assert_eq!(
            e.to_string(),
            "unknown import format \"gnuplot\" (known: iperf3, netpipe, sockperf, osu)"
        );
    }
}
