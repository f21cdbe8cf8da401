//! Where the `unix` and `shm` transports' listeners put their socket
//! files: a directory of this process's own, made fresh below the system's
//! temporary directory, never a predictable path in it.
//!
//! A socket file named after the pid in `/tmp` can be taken first by any
//! local user (the point then fails), and a root agent that removed
//! whatever stood at that name would remove another user's file. So the
//! directory is made with an exclusive `mkdir` under a name no one can
//! guess (mode 0711: the peer can reach a socket whose name it was told,
//! not list them), checked to be a directory of this user's, and only
//! this process makes or removes anything in it. It lives as long as a
//! listener does, and goes with the last one.

use std::io;
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError, Weak};

/// The directory, removed when its last socket path goes.
#[derive(Debug)]
struct SocketDir {
    path: PathBuf,
}

impl Drop for SocketDir {
    fn drop(&mut self) {
        // Every socket file in it was removed with its `SocketPath`.
        let _ = std::fs::remove_dir(&self.path);
    }
}

/// The directory this process's listeners use now, if any is alive.
static CURRENT: Mutex<Weak<SocketDir>> = Mutex::new(Weak::new());

/// Distinguishes the socket files of one process.
static NEXT_ID: AtomicU64 = AtomicU64::new(0);

/// A name no other process can guess: the pid and a hash under this
/// process's random keys.
fn unguessable(attempt: u32) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u32(std::process::id());
    h.write_u32(attempt);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    h.write_u128(nanos);
    format!("netgap-sock-{}-{:016x}", std::process::id(), h.finish())
}

fn current_dir() -> io::Result<Arc<SocketDir>> {
    let mut current = CURRENT.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(dir) = current.upgrade() {
        return Ok(dir);
    }
    let base = std::env::temp_dir();
    let mut last = None;
    for attempt in 0..16 {
        let path = base.join(unguessable(attempt));
        // mkdir makes a new directory or fails: it neither follows a link
        // nor reuses what another user made.
        match std::fs::DirBuilder::new().mode(0o711).create(&path) {
            Ok(()) => {
                let meta = std::fs::symlink_metadata(&path)?;
                if !meta.is_dir() || meta.uid() != nix::unistd::geteuid().as_raw() {
                    return Err(io::Error::other(format!(
                        "{} is not a directory of this user's",
                        path.display()
                    )));
                }
                let dir = Arc::new(SocketDir { path });
                *current = Arc::downgrade(&dir);
                return Ok(dir);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some(e),
            Err(e) => {
                return Err(io::Error::new(
                    e.kind(),
                    format!("making a socket directory in {}: {e}", base.display()),
                ))
            }
        }
    }
    Err(last.unwrap_or_else(|| io::Error::other("no fresh socket directory")))
}

/// A socket file's path in this process's own directory; the file (if the
/// listener made it) is removed when this is dropped.
#[derive(Debug)]
pub(crate) struct SocketPath {
    path: PathBuf,
    /// Keeps the directory alive while the socket is.
    _dir: Arc<SocketDir>,
}

impl SocketPath {
    /// A path no socket of this process has used, `PREFIX-N.sock`.
    pub(crate) fn new(prefix: &str) -> io::Result<SocketPath> {
        let dir = current_dir()?;
        let id = NEXT_ID.fetch_add(1, Ordering::Relaxed);
        Ok(SocketPath {
            path: dir.path.join(format!("{prefix}-{id}.sock")),
            _dir: dir,
        })
    }

    /// The path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for SocketPath {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn sockets_share_a_fresh_private_directory_that_goes_with_the_last() {
        let a = SocketPath::new("t").unwrap();
        let b = SocketPath::new("t").unwrap();
        assert_ne!(a.path(), b.path());
        let dir = a.path().parent().unwrap().to_path_buf();
        assert_eq!(Some(dir.as_path()), b.path().parent());
        let meta = std::fs::symlink_metadata(&dir).unwrap();
        assert!(meta.is_dir());
        assert_eq!(meta.mode() & 0o777, 0o711);
        let _l = std::os::unix::net::UnixListener::bind(a.path()).unwrap();
        drop(a);
        assert!(dir.exists(), "b still holds it");
        drop(b);
        // Other tests of this process may hold it too; once none does, it
        // is gone.
        let held = CURRENT.lock().unwrap().upgrade().is_some();
        assert!(
            held || !dir.exists(),
            "the last socket took the directory with it"
        );
    }
}
