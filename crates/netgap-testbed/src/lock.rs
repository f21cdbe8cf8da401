//! One user of a testbed at a time.
//!
//! A command that builds, changes or removes a testbed (`testbed up`,
//! `set` and `down`, a run with `--conditions`, a study on the testbed it
//! builds) holds the testbed's lock while it does: an exclusive `flock` on
//! `/run/netgap/NAME.lock`. A second one is refused in one line that names
//! the holder's command and pid, before it changes anything. The kernel
//! drops the lock when the holder's last descriptor of the file closes, so
//! when the holder ends, however it ends (SIGKILL included), the next
//! command finds it free: there is never a stale lock to clear. The
//! descriptor is close-on-exec, so the agents and programs a holder starts
//! do not keep it.
//!
//! The file is opened relative to a descriptor of `/run/netgap` checked to
//! be root's and writable by nobody else, without following a link
//! ([`netgap_workload::confined::Dir`]). It sits beside the testbed's
//! state directory, not in it, because taking a testbed down removes that
//! directory; and it stays when its holder is done, since removing a lock
//! file that another process may have just opened would let two processes
//! each hold a lock.
//!
//! Within one process the lock is re-entrant: a study holds its testbed's
//! lock for the whole study, and its figures' runs, which switch the
//! links through [`super::TestbedSwitch`] in the same process, take it
//! again.

use crate::agents::pid_alive;
use crate::request::check_name;
use crate::state::{STATE_DIR_REMEDY, STATE_ROOT_WHAT};
use crate::{TestbedError, STATE_ROOT};
use netgap_workload::confined::Dir;
use nix::fcntl::{Flock, FlockArg};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// Longest holder record read back, in bytes.
const MAX_RECORD_BYTES: usize = 512;

/// Who holds a testbed's lock, as the holder recorded it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Holder {
    /// Its process id.
    pub pid: u32,
    /// Its command (`netgap study 000`).
    pub command: String,
}

impl Holder {
    /// The record a holder writes in the lock file: `PID COMMAND`, one line.
    fn record(&self) -> String {
        format!("{} {}\n", self.pid, self.command.replace('\n', " "))
    }

    /// The holder a lock file's text records, if it records one.
    fn parse(text: &str) -> Option<Holder> {
        let (pid, command) = text.lines().next()?.split_once(' ')?;
        Some(Holder {
            pid: pid.parse().ok()?,
            command: command.to_string(),
        })
    }
}

/// Takes the lock of testbed `name` in the base directory `dir` for this
/// process, running `command`; or, when another open file description
/// holds it, refuses with the holder it recorded.
fn take(dir: &Dir, name: &str, command: &str) -> Result<Flock<File>, TestbedError> {
    let file = dir.open_own_file(&format!("{name}.lock"), 0o600)?;
    let path = dir.path().join(format!("{name}.lock"));
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => {
            let record = Holder {
                pid: std::process::id(),
                command: command.to_string(),
            }
            .record();
            lock.set_len(0)
                .and_then(|()| lock.write_all_at(record.as_bytes(), 0))
                .map_err(|source| TestbedError::Io {
                    what: format!("writing {}", path.display()),
                    source,
                })?;
            Ok(lock)
        }
        Err((file, nix::errno::Errno::EWOULDBLOCK)) => {
            let mut buf = vec![0u8; MAX_RECORD_BYTES];
            // A holder that has not written its record yet finds the file
            // empty (a holder empties it when it lets go), or a record of a
            // killed one, whose process is gone: it is named as unknown.
            let n = file.read_at(&mut buf, 0).unwrap_or(0);
            buf.truncate(n);
            Err(TestbedError::Busy {
                name: name.to_string(),
                holder: Holder::parse(&String::from_utf8_lossy(&buf)).filter(|h| pid_alive(h.pid)),
            })
        }
        Err((_, e)) => Err(TestbedError::Io {
            what: format!("locking {}", path.display()),
            source: e.into(),
        }),
    }
}

/// A lock this process holds, with how many [`TestbedLock`]s share it.
struct Held {
    /// The lock file's base directory and the testbed's name.
    key: (std::path::PathBuf, String),
    lock: Flock<File>,
    count: usize,
}

/// The locks this process holds.
static HELD: Mutex<Vec<Held>> = Mutex::new(Vec::new());

/// The lock of a testbed, held until dropped (or the process ends).
#[derive(Debug)]
pub struct TestbedLock {
    key: (std::path::PathBuf, String),
}

impl TestbedLock {
    /// Takes testbed `name`'s lock for this process, running `command`
    /// (recorded so that a refused command can name it), or refuses with
    /// [`TestbedError::Busy`] when another process holds it. Never waits.
    pub fn acquire(name: &str, command: &str) -> Result<TestbedLock, TestbedError> {
        Self::acquire_in(Path::new(STATE_ROOT), name, command)
    }

    /// [`TestbedLock::acquire`] with the lock file in `base`.
    fn acquire_in(base: &Path, name: &str, command: &str) -> Result<TestbedLock, TestbedError> {
        check_name(name)?;
        let key = (base.to_path_buf(), name.to_string());
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.iter_mut().find(|h| h.key == key) {
            h.count += 1;
            return Ok(TestbedLock { key });
        }
        let dir = Dir::open_base(base, STATE_ROOT_WHAT, STATE_DIR_REMEDY, 0o700)?;
        let lock = take(&dir, name, command)?;
        held.push(Held {
            key: key.clone(),
            lock,
            count: 1,
        });
        Ok(TestbedLock { key })
    }
}

impl Drop for TestbedLock {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = held.iter().position(|h| h.key == self.key) {
            held[i].count -= 1;
            if held[i].count == 0 {
                let h = held.swap_remove(i);
                // The record goes with the holder, so the next refusal
                // never names a holder that was done. Dropping the lock
                // then unlocks and closes the file.
                let _ = h.lock.set_len(0);
            }
        }
    }
}

/// How a refusal names the holder of a testbed's lock.
pub(super) fn holder_text(holder: &Option<Holder>) -> String {
    match holder {
        Some(h) => format!("`{}` (pid {})", h.command, h.pid),
        None => "another netgap process".to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base(t: &tempfile::TempDir) -> std::path::PathBuf {
        let p = t.path().join("run");
        std::fs::create_dir(&p).expect("base");
        p
    }

    #[test]
    fn a_held_lock_refuses_another_holder_and_names_this_one() {
        let t = tempfile::tempdir().expect("tempdir");
        let dir = Dir::open_base(&base(&t), "a test base", "x", 0o700).expect("base");
        let first = take(&dir, "tb1", "netgap study 004").expect("free");
        // A second open file description: what another process has.
        let e = take(&dir, "tb1", "netgap testbed down").expect_err("held");
        assert!(
            matches!(&e, TestbedError::Busy { name, holder: Some(h) }
                if name == "tb1" && h.pid == std::process::id() && h.command == "netgap study 004"),
            "{e:?}"
        );
        let line = e.to_string();
        assert!(
            line.starts_with("testbed tb1 is in use by `netgap study 004` (pid ")
                && line.contains("nothing was changed"),
            "{line}"
        );
        assert_eq!(line.lines().count(), 1);
        // Another testbed's lock is another file.
        drop(take(&dir, "tb2", "netgap testbed up").expect("another testbed"));
        drop(first);
        let again = take(&dir, "tb1", "netgap testbed down").expect("released");
        let text = std::fs::read_to_string(dir.path().join("tb1.lock")).expect("record");
        assert_eq!(
            Holder::parse(&text).map(|h| h.command),
            Some("netgap testbed down".to_string()),
            "the record is the new holder's alone"
        );
        // A killed holder leaves its record; a refusal does not name a
        // process that is gone.
        std::fs::write(dir.path().join("tb1.lock"), format!("{} gone\n", u32::MAX))
            .expect("a dead holder's record");
        let e = take(&dir, "tb1", "x").expect_err("held");
        assert!(
            matches!(&e, TestbedError::Busy { holder: None, .. }),
            "{e:?}"
        );
        assert!(e.to_string().contains("another netgap process"), "{e}");
        drop(again);
    }

    #[test]
    fn the_lock_is_reentrant_in_a_process_and_released_by_the_last_holder() {
        let t = tempfile::tempdir().expect("tempdir");
        let base = base(&t);
        let dir = Dir::open_base(&base, "a test base", "x", 0o700).expect("base");
        let a = TestbedLock::acquire_in(&base, "tb3", "netgap study 000").expect("free");
        let b = TestbedLock::acquire_in(&base, "tb3", "netgap run").expect("re-entrant");
        drop(a);
        assert!(
            matches!(take(&dir, "tb3", "x"), Err(TestbedError::Busy { .. })),
            "still held by the second"
        );
        drop(b);
        assert_eq!(
            std::fs::read_to_string(dir.path().join("tb3.lock")).expect("file"),
            "",
            "the last holder empties its record when it lets go"
        );
        drop(take(&dir, "tb3", "x").expect("released with the last"));
        assert!(TestbedLock::acquire_in(&base, "Bad/Name", "x").is_err());
    }

    #[test]
    fn a_link_planted_as_the_lock_file_is_not_followed() {
        let t = tempfile::tempdir().expect("tempdir");
        let base = base(&t);
        let target = t.path().join("secret");
        std::fs::write(&target, b"keep").expect("target");
        std::os::unix::fs::symlink(&target, base.join("tb4.lock")).expect("link");
        let e = TestbedLock::acquire_in(&base, "tb4", "netgap testbed up")
            .expect_err("a link")
            .to_string();
        assert!(e.contains("tb4.lock") && e.contains("symbolic link"), "{e}");
        assert_eq!(std::fs::read(&target).expect("target"), b"keep");
    }

    #[test]
    fn a_holder_record_is_read_back_or_unknown() {
        let h = Holder {
            pid: 42,
            command: "netgap study 000".into(),
        };
        assert_eq!(Holder::parse(&h.record()), Some(h));
        assert_eq!(Holder::parse(""), None);
        assert_eq!(Holder::parse("x y"), None);
        assert_eq!(holder_text(&None), "another netgap process");
    }
}
