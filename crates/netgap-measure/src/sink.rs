//! Where records go as they are measured: a JSON Lines file and a CSV file,
//! each appended and flushed per record so an interrupted run keeps every
//! point it measured.
//!
//! A results file is appended to only when it is a regular file of the
//! user netgap runs as with no other link to it, and never through a link
//! ([`open_results_file`]); a file the caller made and holds open (a
//! study's) is written through its descriptor ([`JsonlSink::on_file`]).
//!
//! A record is written whole or not at all: it is encoded in memory, then
//! written with one call, and when the write fails part way (a full disk)
//! the file is cut back to its length before it. A file that already ends
//! in a torn line (a crash mid-write, by an older netgap or another tool)
//! gets a line end first, so the fragment stays a line of its own that
//! readers skip, never joined to the next record.

use netgap_core::host::HostFacts;
use netgap_core::record::ResultRecord;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
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

/// Why netgap will not append to an existing `path` of this kind, if it
/// will not: only a regular file of the user netgap runs as, with no other
/// link to it, takes records.
fn refusal(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let me = nix::unistd::geteuid().as_raw();
    if meta.file_type().is_symlink() {
        Some("it is a symbolic link".into())
    } else if !meta.file_type().is_file() {
        Some("it is not a regular file".into())
    } else if meta.uid() != me {
        Some(format!(
            "it is owned by uid {}, not by the user netgap runs as (uid {me})",
            meta.uid()
        ))
    } else if meta.nlink() != 1 {
        Some(format!(
            "it has {} hard links (another name for the same file)",
            meta.nlink()
        ))
    } else {
        None
    }
}

/// Opens the results file `path` for reading and appending, making it if
/// missing. A link there is not followed (`O_NOFOLLOW`), and an existing
/// file is taken only when it is a regular file of this user with no other
/// link, looked at before opening (so no device is opened) and again on
/// the open descriptor (so nothing swapped in between is written): a link
/// or a hard link another user planted where a run writes (a shared
/// directory) turns no record onto a file of theirs or of root's. Each
/// refusal is one line naming the file and why, with the remedy.
pub fn open_results_file(path: &Path) -> Result<File, OpenError> {
    use std::os::unix::fs::OpenOptionsExt;
    let refused = |why: String| {
        OpenError {
        path: path.to_path_buf(),
        source: io::Error::other(format!(
            "{why}; netgap appends records only to a file of its own, never through a link: name another file"
        )),
    }
    };
    if let Some(why) = std::fs::symlink_metadata(path)
        .ok()
        .as_ref()
        .and_then(refusal)
    {
        return Err(refused(why));
    }
    let file = OpenOptions::new()
        .create(true)
        .read(true)
        .append(true)
        // O_NONBLOCK and O_NOCTTY: a FIFO or a terminal swapped in after
        // the look above neither hangs the open nor becomes this process's
        // terminal; on a regular file they change nothing.
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(|source| match source.raw_os_error() {
            Some(libc::ELOOP) => refused("it is a symbolic link".into()),
            _ => OpenError {
                path: path.to_path_buf(),
                source,
            },
        })?;
    let meta = file.metadata().map_err(|source| OpenError {
        path: path.to_path_buf(),
        source,
    })?;
    match refusal(&meta) {
        Some(why) => Err(refused(why)),
        None => Ok(file),
    }
}

/// Opens `path` for appending and ends a torn last line (one without its
/// line end) with one; the torn line's length in bytes, if there was one.
fn open_whole(path: &Path) -> Result<(File, Option<u64>), OpenError> {
    end_torn_line(open_results_file(path)?, path)
}

/// Ends the torn last line of `file`, open for reading and appending, with
/// a line end; the file and the torn line's length in bytes, if there was
/// one.
fn end_torn_line(mut file: File, path: &Path) -> Result<(File, Option<u64>), OpenError> {
    let fail = |source| OpenError {
        path: path.to_path_buf(),
        source,
    };
    let torn = torn_tail_bytes(&file).map_err(fail)?;
    if torn.is_some() {
        file.write_all(b"\n").map_err(fail)?;
    }
    Ok((file, torn))
}

/// The length of the file's last line when it lacks its line end; `None`
/// for an empty file or one that ends with a line end. Reads only the tail,
/// through the descriptor (the file is never opened again by path).
fn torn_tail_bytes(f: &File) -> io::Result<Option<u64>> {
    use std::os::unix::fs::FileExt;
    /// How far back a torn line's start is looked for; a longer fragment is
    /// reported as this long.
    const TAIL_BYTES: u64 = 64 * 1024;
    let len = f.metadata()?.len();
    if len == 0 {
        return Ok(None);
    }
    let start = len.saturating_sub(TAIL_BYTES);
    let mut tail = vec![0u8; (len - start) as usize];
    let mut got = 0;
    while got < tail.len() {
        match f.read_at(&mut tail[got..], start + got as u64)? {
            0 => break,
            n => got += n,
        }
    }
    tail.truncate(got);
    if tail.last() == Some(&b'\n') {
        return Ok(None);
    }
    let torn = tail
        .iter()
        .rposition(|&b| b == b'\n')
        .map_or(tail.len(), |i| tail.len() - i - 1);
    Ok(Some(torn as u64))
}

/// Appends `bytes` with one write; on failure cuts the file back to its
/// length before, so no part of them stays.
fn write_whole(file: &mut File, bytes: &[u8]) -> io::Result<()> {
    let before = file.metadata()?.len();
    match file.write_all(bytes).and_then(|()| file.flush()) {
        Ok(()) => Ok(()),
        Err(e) => {
            // Best effort: the write error is the one to report.
            let _ = file.set_len(before);
            Err(e)
        }
    }
}

/// JSON Lines: one record per line, appended.
pub struct JsonlSink {
    file: File,
    path: PathBuf,
    torn_bytes: Option<u64>,
}

impl JsonlSink {
    /// Opens (creating or appending to) `path`.
    pub fn open(path: &Path) -> Result<JsonlSink, OpenError> {
        let (file, torn_bytes) = open_whole(path)?;
        Ok(JsonlSink {
            file,
            path: path.to_path_buf(),
            torn_bytes,
        })
    }

    /// Appends to `file`, a results file the caller made and holds open
    /// (a study's, made in its output directory without following a link),
    /// named `path` in messages; the file is never opened again by path.
    /// Its descriptor is switched to appending, so that its clones, one per
    /// run into it, each write after the last record.
    pub fn on_file(file: File, path: &Path) -> Result<JsonlSink, OpenError> {
        let fail = |source: io::Error| OpenError {
            path: path.to_path_buf(),
            source,
        };
        let flags = rustix::fs::fcntl_getfl(&file).map_err(|e| fail(e.into()))?;
        rustix::fs::fcntl_setfl(&file, flags | rustix::fs::OFlags::APPEND)
            .map_err(|e| fail(e.into()))?;
        let (file, torn_bytes) = end_torn_line(file, path)?;
        Ok(JsonlSink {
            file,
            path: path.to_path_buf(),
            torn_bytes,
        })
    }

    /// The length of a torn last line the file had when it was opened
    /// (ended with a line end so it stays apart from new records).
    pub fn torn_bytes(&self) -> Option<u64> {
        self.torn_bytes
    }
}

impl RecordSink for JsonlSink {
    fn append(&mut self, record: &ResultRecord) -> io::Result<()> {
        let mut line = serde_json::to_vec(record)?;
        line.push(b'\n');
        write_whole(&mut self.file, &line)
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
    file: File,
    path: PathBuf,
}

/// One CSV row, quoted as needed, with its line end.
fn csv_line<I: IntoIterator<Item = S>, S: AsRef<[u8]>>(fields: I) -> io::Result<Vec<u8>> {
    let mut w = csv::Writer::from_writer(Vec::new());
    w.write_record(fields).map_err(io::Error::other)?;
    w.into_inner().map_err(|e| io::Error::other(e.to_string()))
}

impl CsvSink {
    /// Opens `path`, writing the header when the file is new or empty.
    pub fn open(path: &Path) -> Result<CsvSink, OpenError> {
        let (mut file, _) = open_whole(path)?;
        let empty = file.metadata().map(|m| m.len() == 0).unwrap_or(true);
        if empty {
            csv_line(CSV_HEADER)
                .and_then(|line| write_whole(&mut file, &line))
                .map_err(|source| OpenError {
                    path: path.to_path_buf(),
                    source,
                })?;
        }
        Ok(CsvSink {
            file,
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
        opt(st.and_then(|s| s.ci95_low)),
        opt(st.and_then(|s| s.ci95_high)),
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
        let line = csv_line(csv_row(record))?;
        write_whole(&mut self.file, &line)
    }

    fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_support::record;

    #[test]
    fn a_torn_last_line_is_kept_apart_from_the_next_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("r.jsonl");
        let whole = serde_json::to_string(&record(1.0)).expect("json");
        std::fs::write(&path, format!("{whole}\n{{\"test\":\"pin")).expect("write");
        let mut sink = JsonlSink::open(&path).expect("open");
        assert_eq!(sink.torn_bytes(), Some(12));
        sink.append(&record(2.0)).expect("append");
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 3, "{text}");
        assert_eq!(lines[1], "{\"test\":\"pin");
        for l in [lines[0], lines[2]] {
            serde_json::from_str::<ResultRecord>(l).expect("an intact record");
        }
        // A file that ends cleanly has nothing torn.
        let sink = JsonlSink::open(&path).expect("open again");
        assert_eq!(sink.torn_bytes(), None);
    }

    #[test]
    fn runs_on_a_held_file_append_after_each_other() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("held.jsonl");
        // Made as a study makes it: read and write, not appending.
        let held = OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .expect("create");
        for v in [1.0, 2.0] {
            let mut sink =
                JsonlSink::on_file(held.try_clone().expect("clone"), &path).expect("on file");
            assert_eq!(sink.path(), path);
            sink.append(&record(v)).expect("append");
        }
        let text = std::fs::read_to_string(&path).expect("read");
        let values: Vec<f64> = text
            .lines()
            .map(|l| {
                serde_json::from_str::<ResultRecord>(l)
                    .expect("a record")
                    .value
            })
            .collect();
        assert_eq!(values, [1.0, 2.0]);
    }

    #[test]
    fn a_results_file_is_never_written_through_a_link_or_another_name() {
        let dir = tempfile::tempdir().expect("tempdir");
        let secret = dir.path().join("secret");
        std::fs::write(&secret, b"keep\n").expect("secret");
        let link = dir.path().join("link.jsonl");
        std::os::unix::fs::symlink(&secret, &link).expect("link");
        let e = JsonlSink::open(&link).err().expect("a link").to_string();
        assert!(
            e.contains("link.jsonl") && e.contains("symbolic link"),
            "{e}"
        );
        let dangling = dir.path().join("dangling.csv");
        std::os::unix::fs::symlink(dir.path().join("made"), &dangling).expect("link");
        let e = CsvSink::open(&dangling).err().expect("a link").to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(!dir.path().join("made").exists(), "nothing made through it");
        let hard = dir.path().join("hard.jsonl");
        std::fs::hard_link(&secret, &hard).expect("hard link");
        let e = JsonlSink::open(&hard).err().expect("two names").to_string();
        assert!(e.contains("2 hard links"), "{e}");
        let e = JsonlSink::open(dir.path())
            .err()
            .expect("a directory")
            .to_string();
        assert!(e.contains("not a regular file"), "{e}");
        assert_eq!(std::fs::read(&secret).expect("secret"), b"keep\n");
        assert_eq!(e.lines().count(), 1);
        // A file of one's own is appended to, and made when missing.
        let own = dir.path().join("own.jsonl");
        JsonlSink::open(&own)
            .expect("made")
            .append(&record(1.0))
            .expect("append");
        JsonlSink::open(&own)
            .expect("again")
            .append(&record(2.0))
            .expect("append");
        assert_eq!(
            std::fs::read_to_string(&own).expect("own").lines().count(),
            2
        );
    }

    #[test]
    fn a_failed_write_leaves_the_file_as_it_was() {
        // /dev/full fails every write with ENOSPC, as a full disk does.
        let mut full = OpenOptions::new()
            .append(true)
            .open("/dev/full")
            .expect("/dev/full");
        assert!(write_whole(&mut full, b"{\"x\":1}\n").is_err());
    }
}
