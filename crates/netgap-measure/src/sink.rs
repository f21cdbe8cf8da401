//! Where records go as they are measured: a JSON Lines file and a CSV file,
//! each appended and flushed per record so an interrupted run keeps every
//! point it measured.

use netgap_core::host::HostFacts;
use netgap_core::record::ResultRecord;
use std::fs::{File, OpenOptions};
use std::io::{self, BufWriter, Write};
use std::path::{Path, PathBuf};

/// Something that keeps records as they are measured.
pub trait RecordSink {
    /// Appends one record and flushes it to the file.
    fn append(&mut self, record: &ResultRecord) -> io::Result<()>;
    /// The file written to.
    fn path(&self) -> &Path;
}

/// Why a results file could not be opened.
#[derive(Debug, thiserror::Error)]
#[error("cannot open results file {path}: {source}")]
pub struct OpenError {
    /// The file.
    pub path: PathBuf,
    /// Underlying error.
    pub source: io::Error,
}

fn open_append(path: &Path) -> Result<File, OpenError> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|source| OpenError {
            path: path.to_path_buf(),
            source,
        })
}

/// JSON Lines: one record per line, appended.
pub struct JsonlSink {
    file: BufWriter<File>,
    path: PathBuf,
}

impl JsonlSink {
    /// Opens (creating or appending to) `path`.
    pub fn open(path: &Path) -> Result<JsonlSink, OpenError> {
        Ok(JsonlSink {
            file: BufWriter::new(open_append(path)?),
            path: path.to_path_buf(),
        })
    }
}

impl RecordSink for JsonlSink {
    fn append(&mut self, record: &ResultRecord) -> io::Result<()> {
        serde_json::to_writer(&mut self.file, record)?;
        self.file.write_all(b"\n")?;
        self.file.flush()
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

/// The CSV columns, in order.
pub(crate) const CSV_HEADER: [&str; 27] = [
    "time",
    "test",
    "transport",
    "mode",
    "size_bytes",
    "metric",
    "value",
    "min",
    "median",
    "max",
    "stdev",
    "ci95_low",
    "ci95_high",
    "p50_us",
    "p90_us",
    "p99_us",
    "p999_us",
    "max_us",
    "cpu_local_system_pct",
    "cpu_local_process_pct",
    "cpu_remote_system_pct",
    "cpu_remote_process_pct",
    "iterations_per_rep",
    "reps",
    "host",
    "peer_host",
    "version",
];

/// CSV: a header, then one flat row per record.
pub struct CsvSink {
    writer: csv::Writer<File>,
    path: PathBuf,
}

impl CsvSink {
    /// Opens `path`, writing the header when the file is new or empty.
    pub fn open(path: &Path) -> Result<CsvSink, OpenError> {
        let file = open_append(path)?;
        let empty = file.metadata().map(|m| m.len() == 0).unwrap_or(true);
        let mut writer = csv::Writer::from_writer(file);
        if empty {
            writer
                .write_record(CSV_HEADER)
                .and_then(|()| writer.flush().map_err(csv::Error::from))
                .map_err(|e| OpenError {
                    path: path.to_path_buf(),
                    source: io::Error::other(e),
                })?;
        }
        Ok(CsvSink {
            writer,
            path: path.to_path_buf(),
        })
    }
}

fn opt(v: Option<f64>) -> String {
    v.map(|v| v.to_string()).unwrap_or_default()
}

/// The CSV row of a record, in [`CSV_HEADER`] order.
pub(crate) fn csv_row(r: &ResultRecord) -> Vec<String> {
    let p = r.percentiles.as_ref();
    let st = r.stats.as_ref();
    let cpu = r.cpu.as_ref();
    let host = |h: &Option<HostFacts>| h.as_ref().map(|h| h.hostname.clone()).unwrap_or_default();
    vec![
        r.time.clone(),
        r.test.clone(),
        r.transport.clone(),
        r.mode.to_string(),
        r.size_bytes.to_string(),
        r.metric.clone(),
        r.value.to_string(),
        opt(st.map(|s| s.min)),
        opt(st.map(|s| s.median)),
        opt(st.map(|s| s.max)),
        opt(st.map(|s| s.stdev)),
        opt(st.map(|s| s.ci95_low)),
        opt(st.map(|s| s.ci95_high)),
        opt(p.map(|p| p.p50)),
        opt(p.map(|p| p.p90)),
        opt(p.map(|p| p.p99)),
        opt(p.map(|p| p.p999)),
        opt(p.map(|p| p.max)),
        opt(cpu.map(|c| c.local.system_busy_percent)),
        opt(cpu.map(|c| c.local.process_percent)),
        opt(cpu.map(|c| c.remote.system_busy_percent)),
        opt(cpu.map(|c| c.remote.process_percent)),
        r.iterations_per_rep
            .map(|n| n.to_string())
            .unwrap_or_default(),
        st.map(|s| s.reps.len().to_string()).unwrap_or_default(),
        host(&r.host),
        host(&r.peer_host),
        r.version.clone(),
    ]
}

impl RecordSink for CsvSink {
    fn append(&mut self, record: &ResultRecord) -> io::Result<()> {
        self.writer
            .write_record(csv_row(record))
            .map_err(io::Error::other)?;
        self.writer.flush()
    }

    fn path(&self) -> &Path {
        &self.path
    }
}
