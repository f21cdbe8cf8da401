//! The one way netgap reads a file that a user or a peer names: results
//! files, peer tools' output, hosts files, key files, a testbed's
//! parameters. This module is the single exception to this crate's "no
//! I/O" rule: it only opens and reads, so that both the report crate
//! (which depends on nothing but this one) and the measurement crates share
//! one reader instead of each keeping its own.
//!
//! Every read here:
//! - opens without blocking (`O_NONBLOCK`, so a FIFO with no writer does
//!   not hang) and without taking a terminal as the controlling one
//!   (`O_NOCTTY`);
//! - refuses anything that is not a regular file (a FIFO, a device such
//!   as `/dev/zero`, a directory, a socket), looked at both before opening
//!   (so opening a device has no side effect) and on the open descriptor
//!   (so a file swapped in between is caught);
//! - refuses a file longer than the [`Cap`] of its kind before reading it,
//!   and bounds the read itself at the cap, since files in `/proc` state a
//!   length of 0 and a growing file outgrows the length it stated.

use std::fs::File;
use std::io::Read;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

/// The most bytes netgap reads from one kind of file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cap {
    /// What kind of file, as error messages name it (`a results file`).
    pub what: &'static str,
    /// The most bytes read.
    pub max_bytes: u64,
}

impl Cap {
    /// A results file (`report`, `compare`): 1 GiB, thousands of
    /// workload points of a few MiB each.
    pub const RESULTS: Cap = Cap {
        what: "a results file",
        max_bytes: 1 << 30,
    };
    /// A peer tool's output (`netpipe`, `iperf3 --json`, ...): 256 MiB,
    /// far above any run's output.
    pub const IMPORT: Cap = Cap {
        what: "an imported file",
        max_bytes: 256 << 20,
    };
    /// A hosts file (`--hosts @FILE`, `@hostfile:FILE`, a testbed's): 16
    /// MiB, room for the largest list netgap expands.
    pub const HOSTS: Cap = Cap {
        what: "a hosts file",
        max_bytes: 16 << 20,
    };
    /// A key file (`--key-file`): 64 KiB, well above the longest key.
    pub const KEY: Cap = Cap {
        what: "a key file",
        max_bytes: 64 << 10,
    };
    /// A file a testbed keeps in its directory and reads back (its
    /// `params.json`, a host's process id): 1 MiB.
    pub const TESTBED_STATE: Cap = Cap {
        what: "a testbed's state file",
        max_bytes: 1 << 20,
    };
}

/// Why a file could not be read. Each message names the file.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// It could not be opened (or looked at): missing, no permission.
    #[error("cannot open {}: {source}", path.display())]
    Open {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// It is a FIFO, a device, a directory or a socket.
    #[error("{} is {kind}, not a regular file", path.display())]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// What it is instead (`a FIFO`, `a character device`).
        kind: &'static str,
    },
    /// It is longer than its kind's cap; nothing of it was read.
    #[error(
        "{} holds {size_bytes} bytes, more than the {} ({cap_bytes} bytes) netgap reads from {what}",
        path.display(),
        crate::units::format_size(*cap_bytes)
    )]
    TooLarge {
        /// The file.
        path: PathBuf,
        /// Its length, from its metadata.
        size_bytes: u64,
        /// The cap.
        cap_bytes: u64,
        /// The kind of file ([`Cap::what`]).
        what: &'static str,
    },
    /// It grew past its kind's cap while it was read.
    #[error(
        "{} grew past the {} ({cap_bytes} bytes) netgap reads from {what} while it was read",
        path.display(),
        crate::units::format_size(*cap_bytes)
    )]
    Grew {
        /// The file.
        path: PathBuf,
        /// The cap.
        cap_bytes: u64,
        /// The kind of file ([`Cap::what`]).
        what: &'static str,
    },
    /// Reading failed.
    #[error("cannot read {}: {source}", path.display())]
    Read {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// It is not UTF-8 text.
    #[error("{} is not UTF-8 text", path.display())]
    NotText {
        /// The file.
        path: PathBuf,
    },
}

impl ReadError {
    /// Whether the file does not exist.
    pub fn is_not_found(&self) -> bool {
        matches!(self, ReadError::Open { source, .. } if source.kind() == std::io::ErrorKind::NotFound)
    }

    /// The file.
    pub fn path(&self) -> &Path {
        match self {
            ReadError::Open { path, .. }
            | ReadError::NotRegular { path, .. }
            | ReadError::TooLarge { path, .. }
            | ReadError::Grew { path, .. }
            | ReadError::Read { path, .. }
            | ReadError::NotText { path } => path,
        }
    }
}

/// What a file that is not a regular one is, in words.
fn kind_of(t: std::fs::FileType) -> Option<&'static str> {
    if t.is_file() {
        None
    } else if t.is_fifo() {
        Some("a FIFO")
    } else if t.is_char_device() {
        Some("a character device")
    } else if t.is_block_device() {
        Some("a block device")
    } else if t.is_dir() {
        Some("a directory")
    } else if t.is_socket() {
        Some("a socket")
    } else {
        Some("not a file")
    }
}

/// An open regular file whose reads stop past its cap: reading more than
/// the cap fails with [`ReadError::Grew`] (as the source of an
/// [`std::io::Error`]) instead of going on.
#[derive(Debug)]
pub struct Bounded {
    inner: std::io::Take<File>,
    path: PathBuf,
    cap: Cap,
    read_bytes: u64,
    /// The file's length when it was opened.
    size_bytes: u64,
}

impl Bounded {
    /// The file's length when it was opened, from its metadata (0 for a
    /// file in `/proc`).
    pub fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    /// The typed error of a failed read from this file: [`ReadError::Grew`]
    /// when it grew past its cap, else [`ReadError::Read`].
    pub fn error(&self, source: std::io::Error) -> ReadError {
        let grew = source
            .get_ref()
            .and_then(|e| e.downcast_ref::<ReadError>())
            .is_some_and(|e| matches!(e, ReadError::Grew { .. }));
        if grew {
            ReadError::Grew {
                path: self.path.clone(),
                cap_bytes: self.cap.max_bytes,
                what: self.cap.what,
            }
        } else {
            ReadError::Read {
                path: self.path.clone(),
                source,
            }
        }
    }
}

impl Read for Bounded {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read_bytes += n as u64;
        if self.read_bytes > self.cap.max_bytes {
            return Err(std::io::Error::other(ReadError::Grew {
                path: self.path.clone(),
                cap_bytes: self.cap.max_bytes,
                what: self.cap.what,
            }));
        }
        Ok(n)
    }
}

/// Opens `path` for reading if it is a regular file of at most `cap`
/// bytes; never blocks on a FIFO and never opens a device.
pub fn open(path: &Path, cap: Cap) -> Result<Bounded, ReadError> {
    let open_err = |source| ReadError::Open {
        path: path.to_path_buf(),
        source,
    };
    let not_regular = |kind| ReadError::NotRegular {
        path: path.to_path_buf(),
        kind,
    };
    // Looked at before opening: opening a device may do something.
    let before = std::fs::metadata(path).map_err(open_err)?;
    if let Some(kind) = kind_of(before.file_type()) {
        return Err(not_regular(kind));
    }
    // O_NONBLOCK: a FIFO swapped in after the look above opens at once
    // instead of waiting for a writer; on a regular file it changes
    // nothing. O_NOCTTY: a terminal swapped in never becomes this
    // process's controlling terminal.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)
        .map_err(open_err)?;
    let meta = file.metadata().map_err(open_err)?;
    if let Some(kind) = kind_of(meta.file_type()) {
        return Err(not_regular(kind));
    }
    if meta.len() > cap.max_bytes {
        return Err(ReadError::TooLarge {
            path: path.to_path_buf(),
            size_bytes: meta.len(),
            cap_bytes: cap.max_bytes,
            what: cap.what,
        });
    }
    Ok(Bounded {
        // One byte past the cap, so that a file that grew shows as such.
        inner: file.take(cap.max_bytes.saturating_add(1)),
        path: path.to_path_buf(),
        cap,
        read_bytes: 0,
        size_bytes: meta.len(),
    })
}

/// The bytes of a regular file of at most `cap` bytes.
pub fn read_bytes(path: &Path, cap: Cap) -> Result<Vec<u8>, ReadError> {
    let mut file = open(path, cap)?;
    // The stated length is a hint only; the read is bounded by the cap.
    let hint = usize::try_from(file.size_bytes()).unwrap_or(0);
    let mut bytes = Vec::with_capacity(hint);
    if let Err(e) = file.read_to_end(&mut bytes) {
        return Err(file.error(e));
    }
    Ok(bytes)
}

/// The text of a regular UTF-8 file of at most `cap` bytes.
pub fn read_to_string(path: &Path, cap: Cap) -> Result<String, ReadError> {
    String::from_utf8(read_bytes(path, cap)?).map_err(|_| ReadError::NotText {
        path: path.to_path_buf(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::io::Write;

    fn tiny(max_bytes: u64) -> Cap {
        Cap {
            what: "a test file",
            max_bytes,
        }
    }

    fn temp_dir(name: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("netgap-files-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        dir
    }

    #[test]
    fn a_regular_file_within_its_cap_is_read_whole() {
        let dir = temp_dir("within");
        let path = dir.join("f");
        std::fs::write(&path, "hello\n").unwrap();
        assert_eq!(read_to_string(&path, tiny(6)).unwrap(), "hello\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_past_its_cap_is_refused_naming_path_cap_and_size() {
        let dir = temp_dir("past");
        let path = dir.join("f");
        std::fs::write(&path, vec![b'x'; 2048]).unwrap();
        let e = read_bytes(&path, tiny(1024)).unwrap_err();
        assert!(matches!(
            e,
            ReadError::TooLarge {
                size_bytes: 2048,
                ..
            }
        ));
        let text = e.to_string();
        for needle in [path.to_str().unwrap(), "2048 bytes", "1K", "a test file"] {
            assert!(text.contains(needle), "{text} lacks {needle}");
        }
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_file_that_states_no_length_is_still_bounded() {
        // /proc files state a length of 0 and hold more.
        let path = Path::new("/proc/self/maps");
        let e = read_bytes(path, tiny(16)).unwrap_err();
        assert!(matches!(e, ReadError::Grew { .. }), "{e}");
        assert!(read_bytes(path, tiny(1 << 24)).is_ok());
    }

    #[test]
    fn devices_directories_and_fifos_are_refused_at_once() {
        let e = read_bytes(Path::new("/dev/zero"), tiny(1 << 20)).unwrap_err();
        assert_eq!(
            e.to_string(),
            "/dev/zero is a character device, not a regular file"
        );
        let dir = temp_dir("kinds");
        let e = read_bytes(&dir, tiny(1 << 20)).unwrap_err();
        assert!(e
            .to_string()
            .ends_with("is a directory, not a regular file"));
        let fifo = dir.join("fifo");
        let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
        // SAFETY: `c` is a valid NUL-terminated path for the call.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let t0 = std::time::Instant::now();
        let e = read_bytes(&fifo, tiny(1 << 20)).unwrap_err();
        assert!(t0.elapsed() < std::time::Duration::from_secs(2));
        assert!(
            e.to_string().ends_with("is a FIFO, not a regular file"),
            "{e}"
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_file_says_so() {
        let e = read_bytes(Path::new("/nonexistent/netgap"), tiny(1)).unwrap_err();
        assert!(e.is_not_found());
        assert!(e.to_string().starts_with("cannot open /nonexistent/netgap"));
    }

    #[test]
    fn the_bounded_reader_stops_past_the_cap() {
        let dir = temp_dir("reader");
        let path = dir.join("f");
        let mut f = File::create(&path).unwrap();
        f.write_all(b"0123456789").unwrap();
        let mut r = open(&path, tiny(10)).unwrap();
        // Grows after the open.
        f.write_all(b"abc").unwrap();
        let mut out = Vec::new();
        let e = r.read_to_end(&mut out).unwrap_err();
        assert!(e.to_string().contains("grew past"), "{e}");
        assert!(!read_to_string(&path, tiny(13)).unwrap().is_empty());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
