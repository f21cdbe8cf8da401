//! Reading results files for the report and `compare`: every line is a
//! [`ResultRecord`], read as the result model reads it (leniently, so a
//! file written by any netgap version, or imported from a peer tool,
//! loads); a line that is none is refused naming its file and line.

pub use crate::loaded::{lower_is_better, variant_of, Loaded};
use netgap_core::record::ResultRecord;
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
        out.records
            .push(Loaded::from_record(record, path.to_path_buf(), n));
    }
    crate::loaded::mark_repeats(&mut out.records);
    Ok(out)
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
