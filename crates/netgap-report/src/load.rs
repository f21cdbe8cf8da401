//! Reading results files for the report and `compare`: every line is a
//! [`ResultRecord`], plus the fields of tests that add their own (sweep,
//! LogP, multi-host), read leniently so a file written by any netgap
//! version, or imported from a peer tool, loads.

use netgap_core::cpu::CpuUsage;
use netgap_core::record::ResultRecord;
use serde::Deserialize;
use std::path::{Path, PathBuf};

/// Why a results file could not be loaded; one line naming file and line.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file could not be read.
    #[error("cannot read results file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
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

/// CPU usage of one host of a multi-host point.
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

/// Fields other tests add to a record; all optional.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(default)]
pub struct Extras {
    /// Sweep flavour (`pingpong`, `stream`, `bidir`).
    pub sweep_kind: Option<String>,
    /// Time of one block transfer, µs (sweep).
    pub block_time_us: Option<f64>,
    /// A throughput dropout at this point (sweep).
    pub dropout: Option<Dropout>,
    /// Outcome of a `--ci` target.
    pub ci_target: Option<CiOutcome>,
    /// Concurrent clients, streams or links of the point.
    pub clients: Option<u32>,
    /// Hosts the clients ran on.
    pub client_hosts: Option<u32>,
    /// Per-flow results.
    pub flows: Vec<FlowResult>,
    /// CPU usage of every host.
    pub hosts_cpu: Vec<HostCpu>,
}

/// One record as loaded, with where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct Loaded {
    /// The record.
    pub record: ResultRecord,
    /// Fields of sweep, LogP and multi-host tests.
    pub extras: Extras,
    /// The file it was read from.
    pub file: PathBuf,
}

/// Reads every record of a JSON Lines results file; blank lines are
/// skipped and a bad line is an error naming its number.
pub fn load_file(path: &Path) -> Result<Vec<Loaded>, LoadError> {
    let text = std::fs::read_to_string(path).map_err(|source| LoadError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |line: usize, e: serde_json::Error| LoadError::BadLine {
        path: path.to_path_buf(),
        line,
        message: e.to_string(),
    };
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let record: ResultRecord = serde_json::from_str(line).map_err(|e| bad(i + 1, e))?;
        let extras: Extras = serde_json::from_str(line).map_err(|e| bad(i + 1, e))?;
        out.push(Loaded {
            record,
            extras,
            file: path.to_path_buf(),
        });
    }
    Ok(out)
}

/// Reads several results files, in order.
pub fn load_files(paths: &[PathBuf]) -> Result<Vec<Loaded>, LoadError> {
    let mut all = Vec::new();
    for p in paths {
        all.extend(load_file(p)?);
    }
    Ok(all)
}

/// Whether a smaller value of `metric` is better: latencies, overheads,
/// gaps and times (`_us`, `_ns`) are; bandwidths and rates are not.
pub fn lower_is_better(metric: &str) -> bool {
    metric.ends_with("_us") || metric.ends_with("_ns") || metric.ends_with("_ms")
}
