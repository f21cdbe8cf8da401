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
//! ([`netgap_workload::confined::Dir`]), made fresh (an exclusive create,
//! mode 0600) when missing, else checked to be a regular file of this
//! user's with no other link. It sits beside the testbed's state
//! directory, not in it, because taking a testbed down removes that
//! directory.
//!
//! A lock file lives no longer than its testbed: when the last holder in a
//! process lets go and the testbed has no state directory (it was never
//! built, a refused or failed command left none, `down` or a study's own
//! testbed removed it, or the holder only kept others out), the file goes
//! too, so nothing of a testbed is left in `/run/netgap` once it is gone.
//! The state directory is made and removed only under the lock, so the
//! holder's look at it stays true until it lets go. `down` and a study's
//! own testbed ask for the removal whatever they find
//! ([`TestbedLock::remove_file_on_release`]). Either way the file is
//! unlinked while the lock is still held, then the lock is let go. A
//! process that opened the file before it was unlinked and then waits for
//! its lock would, once it has it, hold the lock of a file that nobody
//! else will ever open again, while a newcomer makes a new file under the
//! name and locks that: two holders. So a taker, once its `flock`
//! succeeds, checks that the name still names the file it locked (its
//! descriptor's device and inode against those of the name, not following
//! a link) and, if not, lets go and starts again from the open.
//!
//! Within one process the lock is re-entrant: a study holds its testbed's
//! lock for the whole study, and its figures' runs, which switch the
//! links through [`super::TestbedSwitch`] in the same process, take it
//! again.

use crate::agents::pid_alive;
use crate::holder::Holder;
use crate::request::check_name;
use crate::state::{STATE_DIR_REMEDY, STATE_ROOT_WHAT};
use crate::{TestbedError, STATE_ROOT};
use netgap_workload::confined::{ConfinedError, Dir};
use nix::fcntl::{AtFlags, Flock, FlockArg};
use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::{Mutex, PoisonError};

/// Longest holder record read back, in bytes.
const MAX_RECORD_BYTES: usize = 512;

/// How many times a taker opens the lock file again after finding that
/// the file it locked had been removed. Each time means another command
/// took the testbed and removed its lock file in the moment between this
/// one's open and its lock; past this many, the testbed is busy.
const MAX_TAKE_ATTEMPTS: usize = 64;

/// Mode of a lock file: its holder's record is for root alone.
const LOCK_FILE_MODE: u32 = 0o600;

/// The lock file's name in its base directory.
fn lock_file_name(name: &str) -> String {
    format!("{name}.lock")
}

/// Opens the lock file `file_name` in `dir`: made fresh with an exclusive
/// create when missing, else the one there, if it is a regular file of
/// this user's with no other link; a link is never followed.
fn open_lock_file(dir: &Dir, file_name: &str) -> Result<File, ConfinedError> {
    match dir.create_file(file_name, LOCK_FILE_MODE) {
        Err(ConfinedError::Io { source, .. }) if source.kind() == io::ErrorKind::AlreadyExists => {
            dir.open_own_file(file_name, LOCK_FILE_MODE)
        }
        made => made,
    }
}

/// Whether `file_name` in `dir` (not following a link) is still the file
/// `file` has open: false when the name is gone or names another file.
fn names_file(dir: &Dir, file_name: &str, file: &File) -> io::Result<bool> {
    let held = nix::sys::stat::fstat(file.as_raw_fd())?;
    match nix::sys::stat::fstatat(
        Some(dir.fd().as_raw_fd()),
        file_name,
        AtFlags::AT_SYMLINK_NOFOLLOW,
    ) {
        Ok(now) => Ok(now.st_dev == held.st_dev && now.st_ino == held.st_ino),
        Err(nix::errno::Errno::ENOENT) => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// Whether testbed `name` has a state directory in the base directory
/// `dir` (not following a link); true when that cannot be told, so a lock
/// file is never removed from under a testbed that may exist.
fn testbed_exists(dir: &Dir, name: &str) -> bool {
    let found = nix::sys::stat::fstatat(
        Some(dir.fd().as_raw_fd()),
        name,
        AtFlags::AT_SYMLINK_NOFOLLOW,
    );
    !matches!(found, Err(nix::errno::Errno::ENOENT))
}

/// Takes the lock of testbed `name` in the base directory `dir` for this
/// process, running `command`, opening the lock file again as long as the
/// file it locked turns out to have been removed meanwhile; or, when
/// another open file description holds it, refuses with the holder it
/// recorded.
fn take(dir: &Dir, name: &str, command: &str) -> Result<Flock<File>, TestbedError> {
    let file_name = lock_file_name(name);
    let path = dir.path().join(&file_name);
    let mut refused = None;
    for _ in 0..MAX_TAKE_ATTEMPTS {
        match open_lock_file(dir, &file_name) {
            Ok(file) => {
                refused = None;
                if let Some(lock) = lock_current(dir, name, file)? {
                    return record_holder(lock, command, &path);
                }
            }
            // A file a holder removed between this open and its checks
            // has no link left, and is refused: the next open finds the
            // name's new file. A refusal that stays is the answer.
            Err(e) => refused = Some(e),
        }
    }
    Err(match refused {
        Some(e) => e.into(),
        None => TestbedError::Busy {
            name: name.to_string(),
            holder: None,
        },
    })
}

/// Locks `file`, opened as testbed `name`'s lock file in `dir`, without
/// waiting: the lock; or `None` when the name no longer names that file,
/// since a holder removed it after it was opened (the lock would guard
/// nothing, and is let go: the caller opens again and finds the file the
/// name names now); or, when another open file description holds it, a
/// refusal with the holder it recorded.
fn lock_current(dir: &Dir, name: &str, file: File) -> Result<Option<Flock<File>>, TestbedError> {
    let file_name = lock_file_name(name);
    let path = dir.path().join(&file_name);
    let lock = lock_or_refuse(file, name, &path)?;
    let current = names_file(dir, &file_name, &lock).map_err(|source| TestbedError::Io {
        what: format!("checking {}", path.display()),
        source,
    })?;
    Ok(current.then_some(lock))
}

/// Writes this process's holder record (running `command`) into the lock
/// file it holds.
fn record_holder(
    lock: Flock<File>,
    command: &str,
    path: &Path,
) -> Result<Flock<File>, TestbedError> {
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

/// Locks `file` (at `path`), the lock file of testbed `name`, without
/// waiting; or, when another open file description holds it, refuses with
/// the holder it recorded.
fn lock_or_refuse(file: File, name: &str, path: &Path) -> Result<Flock<File>, TestbedError> {
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(lock),
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
    /// The base directory, which the lock file is removed from.
    dir: Dir,
    lock: Flock<File>,
    count: usize,
    /// Whether the lock file goes when the last holder lets go, whether or
    /// not the testbed is there.
    remove: bool,
}

impl Held {
    /// Lets go of the lock: the record emptied, so the next refusal never
    /// names a holder that was done, and the file removed first if asked or
    /// if the testbed has no state directory (while the lock is still held,
    /// and only if the name still names the file locked). Dropping the lock
    /// then unlocks and closes the file.
    fn release(self) {
        let _ = self.lock.set_len(0);
        if self.remove || !testbed_exists(&self.dir, &self.key.1) {
            let file_name = lock_file_name(&self.key.1);
            if names_file(&self.dir, &file_name, &self.lock).unwrap_or(false) {
                let _ = self.dir.remove_file(&file_name);
            }
        }
    }
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
            dir,
            lock,
            count: 1,
            remove: false,
        });
        Ok(TestbedLock { key })
    }

    /// Has the lock file removed when this process lets go of the lock
    /// (the last [`TestbedLock`] of the testbed in this process dropped):
    /// for a command that took the testbed down, which leaves nothing of
    /// it behind. The file is unlinked while the lock is still held; a
    /// process waiting to take it finds the name gone and makes a new one.
    pub fn remove_file_on_release(&self) {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(h) = held.iter_mut().find(|h| h.key == self.key) {
            h.remove = true;
        }
    }
}

impl Drop for TestbedLock {
    fn drop(&mut self) {
        let mut held = HELD.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(i) = held.iter().position(|h| h.key == self.key) {
            held[i].count -= 1;
            if held[i].count == 0 {
                held.swap_remove(i).release();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::holder::holder_text;

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
        // The testbed is up: its lock file stays when the lock is let go.
        std::fs::create_dir(base.join("tb3")).expect("state directory");
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

    /// Lets go of `lock`, testbed `name`'s lock in `base`, as the last
    /// holder of a process does; `remove` as after a `down`.
    fn release(base: &Path, name: &str, lock: Flock<File>, remove: bool) {
        Held {
            key: (base.to_path_buf(), name.to_string()),
            dir: Dir::open_base(base, "a test base", "x", 0o700).expect("base"),
            lock,
            count: 0,
            remove,
        }
        .release();
    }

    /// The interleaving that would give two holders: a taker opens the
    /// lock file, a `down` holding it removes it and lets go, a newcomer
    /// makes and locks a new one, and only then does the first taker lock
    /// the file it opened. It must find that file gone from the name.
    #[test]
    fn a_taker_that_opened_a_removed_lock_file_does_not_hold_the_lock() {
        let t = tempfile::tempdir().expect("tempdir");
        let base = base(&t);
        let dir = Dir::open_base(&base, "a test base", "x", 0o700).expect("base");
        let down = take(&dir, "tb6", "netgap testbed down").expect("free");
        let opened = open_lock_file(&dir, "tb6.lock").expect("opened before the removal");
        release(&base, "tb6", down, true);
        let newcomer = take(&dir, "tb6", "netgap testbed up").expect("a new file");
        assert!(
            lock_current(&dir, "tb6", opened).expect("locks").is_none(),
            "the removed file's lock is not the testbed's"
        );
        let e = take(&dir, "tb6", "netgap study 000").expect_err("the newcomer holds it");
        assert!(
            matches!(&e, TestbedError::Busy { holder: Some(h), .. } if h.command == "netgap testbed up"),
            "{e:?}"
        );
        drop(newcomer);
        drop(take(&dir, "tb6", "netgap study 000").expect("free again"));
    }

    /// Two takers and a remover (what `down` does: it takes the lock,
    /// removes the file, lets go) race on one lock file, each taker
    /// pausing between its open and its lock, where the race is: at no
    /// moment do two of them hold the lock.
    #[test]
    fn two_takers_racing_a_remover_are_never_two_holders() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        const ROUNDS: usize = 2000;
        let t = tempfile::tempdir().expect("tempdir");
        let base = base(&t);
        let dir = Dir::open_base(&base, "a test base", "x", 0o700).expect("base");
        // The testbed is up: only the remover removes the file.
        std::fs::create_dir(base.join("race")).expect("state directory");
        let holders = AtomicUsize::new(0);
        let most = AtomicUsize::new(0);
        let taken = AtomicUsize::new(0);
        let attempt = |remove: bool| {
            let lock = loop {
                let Ok(file) = open_lock_file(&dir, "race.lock") else {
                    continue; // removed between the open and its checks
                };
                std::thread::sleep(std::time::Duration::from_micros(20));
                match lock_current(&dir, "race", file) {
                    Ok(Some(lock)) => break lock,
                    Ok(None) => continue,
                    Err(TestbedError::Busy { .. }) => return,
                    Err(e) => panic!("{e}"),
                }
            };
            let n = holders.fetch_add(1, Ordering::SeqCst) + 1;
            most.fetch_max(n, Ordering::SeqCst);
            taken.fetch_add(1, Ordering::SeqCst);
            std::thread::sleep(std::time::Duration::from_micros(50));
            holders.fetch_sub(1, Ordering::SeqCst);
            release(&base, "race", lock, remove);
        };
        std::thread::scope(|s| {
            for remove in [false, false, true] {
                s.spawn(move || (0..ROUNDS).for_each(|_| attempt(remove)));
            }
        });
        assert_eq!(most.load(Ordering::SeqCst), 1, "two holders at once");
        assert!(taken.load(Ordering::SeqCst) > 0, "nobody took the lock");
    }

    #[test]
    fn down_removes_the_lock_file_and_the_next_taker_makes_a_new_one() {
        let t = tempfile::tempdir().expect("tempdir");
        let base = base(&t);
        let path = base.join("tb5.lock");
        // What `up` makes under the lock.
        std::fs::create_dir(base.join("tb5")).expect("state directory");
        let a = TestbedLock::acquire_in(&base, "tb5", "netgap testbed up").expect("free");
        drop(a);
        assert!(
            path.exists(),
            "a holder that did not take the testbed down keeps it"
        );
        let b = TestbedLock::acquire_in(&base, "tb5", "netgap study 000").expect("free");
        let c = TestbedLock::acquire_in(&base, "tb5", "netgap testbed down").expect("re-entrant");
        c.remove_file_on_release();
        drop(c);
        assert!(path.exists(), "removed only when the last holder lets go");
        drop(b);
        assert!(!path.exists(), "the last holder removed it");
        let d = TestbedLock::acquire_in(&base, "tb5", "netgap testbed up").expect("free again");
        let meta = std::fs::symlink_metadata(&path).expect("made again");
        assert!(meta.is_file());
        assert_eq!(
            std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o777,
            0o600
        );
        drop(d);
    }

    /// The bug: CI's study steps left an empty `/run/netgap/study.lock`
    /// behind, from holders of the study's lock that built no testbed (a
    /// test holding it to keep studies out, a study refused after taking
    /// it). A lock file now goes with the last holder whenever the testbed
    /// has no state directory, and stays while it has one.
    #[test]
    fn a_lock_file_outlives_no_testbed() {
        let t = tempfile::tempdir().expect("tempdir");
        let base = base(&t);
        let path = base.join("tb7.lock");
        // Held where no testbed is: gone with the last holder.
        let a = TestbedLock::acquire_in(&base, "tb7", "netgap study 000").expect("free");
        let b = TestbedLock::acquire_in(&base, "tb7", "netgap run").expect("re-entrant");
        drop(a);
        assert!(path.exists(), "still held");
        drop(b);
        assert!(!path.exists(), "no testbed, no lock file");
        // A testbed built under the lock keeps it; taken down under the
        // lock, its file goes too.
        let up = TestbedLock::acquire_in(&base, "tb7", "netgap testbed up").expect("free");
        std::fs::create_dir(base.join("tb7")).expect("state directory");
        drop(up);
        assert!(path.exists(), "the testbed is up");
        let down = TestbedLock::acquire_in(&base, "tb7", "netgap study 000").expect("free");
        std::fs::remove_dir(base.join("tb7")).expect("state directory");
        drop(down);
        assert!(!path.exists(), "the testbed went, and its lock file");
        // Whatever names the testbed's state directory counts: a link is
        // not followed, and is not taken for nothing.
        std::os::unix::fs::symlink(t.path(), base.join("tb7")).expect("link");
        drop(TestbedLock::acquire_in(&base, "tb7", "x").expect("free"));
        assert!(path.exists(), "kept while something holds the name");
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
