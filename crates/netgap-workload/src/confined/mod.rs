//! Directories an agent writes in, confined to what it made itself.
//!
//! Everything an agent writes on its host (a service's configuration and
//! documents, pio's stripes) goes through a `Dir`: a directory held open
//! by its descriptor. A base directory (`Dir::open_base`) is opened once
//! by path without following a final symbolic link and checked on the
//! descriptor (a directory, owned by the agent's user, writable by nobody
//! else); below it the agent only ever makes *fresh* directories
//! (`mkdirat`, which fails if the name exists) and files (`O_CREAT |
//! O_EXCL | O_NOFOLLOW`), relative to the descriptor of the directory
//! they are in, with names of one path component checked here. Nothing
//! is resolved by path again: modes and owners change through descriptors
//! (`fchmod`, `fchown`), and a directory is removed with everything in it
//! by `unlinkat` relative to descriptors, never following a link, so a
//! link another user (or a service running as another user) plants
//! cannot turn a write, a mode change or a removal onto a file outside.
//!
//! The same [`Dir`] serves the commands that write where another user
//! could plant a link: `netgap study` makes its results file and report in
//! its `-o` directory this way, and the testbeds' locks and state
//! directories (`/run/netgap` and a directory per testbed in it, with the
//! testbed's key, hosts file, parameters and its agents' logs and pids)
//! are opened and written through it.
//!
//! The agent's own run directory is [`AgentDirs`]: a base (`--run-dir`,
//! by default `/var/lib/netgap` as root, else `$XDG_RUNTIME_DIR/netgap` or
//! `/tmp/netgap-<uid>`) with one `agent-<pid>-<nonce>` directory below it
//! while something of the agent's is on disk. An agent removes at start
//! what agents that no longer run left there.

mod agent_dirs;
mod at;

pub use agent_dirs::{default_run_base, AgentDirs};
pub(crate) use agent_dirs::{fresh_name, STRIPE_PREFIX};

use at::is_dir_at;
use at::not_a_dir;
use at::open_checked;
use at::remove_at;
use std::fs::File;
use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustix::fs::{AtFlags, Mode, OFlags};

/// Deepest directory tree [`Dir`]'s removal descends into; what a service
/// nested deeper stays (nothing netgap makes is half as deep).
const MAX_REMOVE_DEPTH: usize = 64;

/// A directory could not be used, one line naming it and why.
#[derive(Debug, thiserror::Error)]
pub enum ConfinedError {
    /// A base directory is not one this agent may write in.
    #[error("refusing {path} as {what}: {reason}; {remedy}")]
    Refused {
        /// The directory.
        path: PathBuf,
        /// What it was to be (`the agent's run directory base`).
        what: String,
        /// Why not.
        reason: String,
        /// What to do instead.
        remedy: String,
    },
    /// A name is not a single path component.
    #[error("{name:?} is not a plain file name (one path component, not . or ..)")]
    BadName {
        /// The name given.
        name: String,
    },
    /// A system call on a directory or file failed.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done (`making`, `opening`).
        what: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// Why it failed.
        source: io::Error,
    },
}

fn io_at(what: &'static str, path: &Path) -> impl FnOnce(rustix::io::Errno) -> ConfinedError {
    let path = path.to_path_buf();
    move |e| ConfinedError::Io {
        what,
        path,
        source: e.into(),
    }
}

/// Checks that `name` is one path component: not empty, not `.` or `..`,
/// no `/` and no NUL, at most 255 bytes.
pub(crate) fn check_name(name: &str) -> Result<&str, ConfinedError> {
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && !name.contains('/')
        && !name.contains('\0')
        && name.len() <= 255;
    if ok {
        Ok(name)
    } else {
        Err(ConfinedError::BadName { name: name.into() })
    }
}

/// A relative subdirectory that cannot be used, one line naming it and
/// what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum SubdirError {
    /// It is an absolute path.
    #[error("{sub:?} is an absolute path; name a subdirectory relative to the agent's I/O directory (netgap serve --io-dir)")]
    Absolute {
        /// The subdirectory given.
        sub: String,
    },
    /// It has no component.
    #[error("{sub:?} names no subdirectory")]
    Empty {
        /// The subdirectory given.
        sub: String,
    },
    /// It has more components than allowed.
    #[error("{sub:?} is deeper than {most} directories")]
    TooDeep {
        /// The subdirectory given.
        sub: String,
        /// Most components allowed.
        most: usize,
    },
    /// A component is not a plain name (`..`, `.`).
    #[error("{sub:?} has the component {part:?}; only plain names below the agent's I/O directory are allowed")]
    BadComponent {
        /// The subdirectory given.
        sub: String,
        /// The component refused.
        part: String,
    },
}

/// Splits a relative subdirectory (`a/b`) into its components, refusing an
/// absolute path, `..`, `.` and empty components, and more than `most`
/// components.
pub(crate) fn relative_components(sub: &str, most: usize) -> Result<Vec<&str>, SubdirError> {
    if sub.starts_with('/') {
        return Err(SubdirError::Absolute { sub: sub.into() });
    }
    let parts: Vec<&str> = sub.split('/').filter(|p| !p.is_empty()).collect();
    if parts.is_empty() {
        return Err(SubdirError::Empty { sub: sub.into() });
    }
    if parts.len() > most {
        return Err(SubdirError::TooDeep {
            sub: sub.into(),
            most,
        });
    }
    for p in &parts {
        if check_name(p).is_err() {
            return Err(SubdirError::BadComponent {
                sub: sub.into(),
                part: (*p).into(),
            });
        }
    }
    Ok(parts)
}

/// The effective user id of this process.
fn euid() -> u32 {
    nix::unistd::geteuid().as_raw()
}

/// A directory held open by its descriptor. One the agent made (fresh) is
/// removed with everything in it when dropped; one it opened (a base, an
/// existing subdirectory) is kept.
///
/// Public so that other writers of files where another user could plant a
/// link (a study's output directory, the testbeds' locks and state
/// directories) make them the same way.
#[derive(Debug)]
pub struct Dir {
    fd: Arc<OwnedFd>,
    /// The path, for messages and for programs given a path to it.
    path: PathBuf,
    /// The parent's descriptor and this directory's name in it, when the
    /// agent made it and it goes on drop.
    remove_from: Option<(Arc<OwnedFd>, String)>,
}

impl Dir {
    /// Opens (making it `mode` first if missing, its parent must exist)
    /// the base directory `path` for `what`, and checks on its descriptor
    /// that it is a directory, not a symbolic link, owned by this
    /// process's user and writable by nobody else. A refusal names the
    /// path, the reason and `remedy`.
    pub fn open_base(
        path: &Path,
        what: &str,
        remedy: &str,
        mode: u32,
    ) -> Result<Dir, ConfinedError> {
        if !path.is_absolute() {
            return Err(ConfinedError::Refused {
                path: path.to_path_buf(),
                what: what.into(),
                reason: "it is not an absolute path".into(),
                remedy: remedy.into(),
            });
        }
        open_checked(rustix::fs::CWD, path, path, what, remedy, mode)
    }

    /// [`Dir::open_base`] for the subdirectory `name` of this directory,
    /// made if missing and opened relative to its descriptor, so no part
    /// of its path is looked up again: a directory of this user's, not a
    /// link, that nobody else can write in. It is kept when dropped.
    pub fn open_base_at(
        &self,
        name: &str,
        what: &str,
        remedy: &str,
        mode: u32,
    ) -> Result<Dir, ConfinedError> {
        let name = check_name(name)?;
        open_checked(self.fd(), name, &self.path.join(name), what, remedy, mode)
    }

    /// Opens a directory the operator named (`--io-dir`): it must be a
    /// directory; its owner and mode are the operator's choice, since
    /// everything below it is made exclusively and without following links.
    pub(crate) fn open_operator(path: &Path) -> Result<Dir, ConfinedError> {
        let fd = rustix::fs::openat(
            rustix::fs::CWD,
            path,
            OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::RDONLY,
            Mode::empty(),
        )
        .map_err(io_at("opening the directory", path))?;
        Ok(Dir {
            fd: Arc::new(fd),
            path: path.to_path_buf(),
            remove_from: None,
        })
    }

    /// The directory's path, for messages and for a program that is given
    /// it (never reopened by the agent).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's descriptor.
    pub fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }

    /// Makes the fresh subdirectory `name` with `mode` (it must not exist),
    /// opens it without following a link and checks it is this user's
    /// directory; it is removed with everything in it when dropped.
    pub(crate) fn fresh_subdir(&self, name: &str, mode: u32) -> Result<Dir, ConfinedError> {
        let name = check_name(name)?;
        let path = self.path.join(name);
        rustix::fs::mkdirat(&*self.fd, name, Mode::from_raw_mode(mode))
            .map_err(io_at("making", &path))?;
        let fd = self.open_child_dir(name, &path);
        let fd = match fd {
            Ok(fd) => fd,
            Err(e) => {
                let _ = rustix::fs::unlinkat(&*self.fd, name, AtFlags::REMOVEDIR);
                return Err(e);
            }
        };
        let dir = Dir {
            fd: Arc::new(fd),
            path,
            remove_from: Some((Arc::clone(&self.fd), name.to_string())),
        };
        let st = rustix::fs::fstat(dir.fd()).map_err(io_at("reading", &dir.path))?;
        if st.st_uid != euid() {
            return Err(ConfinedError::Io {
                what: "checking",
                path: dir.path.clone(),
                source: io::Error::other(format!(
                    "it is owned by uid {}, not by this agent",
                    st.st_uid
                )),
            });
        }
        // The mode as asked, whatever the umask took away.
        rustix::fs::fchmod(dir.fd(), Mode::from_raw_mode(mode))
            .map_err(io_at("setting the mode of", &dir.path))?;
        Ok(dir)
    }

    /// Opens the existing subdirectory `name` without following a link;
    /// it is kept when dropped.
    pub(crate) fn open_subdir(&self, name: &str) -> Result<Dir, ConfinedError> {
        let name = check_name(name)?;
        let path = self.path.join(name);
        let fd = self.open_child_dir(name, &path)?;
        Ok(Dir {
            fd: Arc::new(fd),
            path,
            remove_from: None,
        })
    }

    fn open_child_dir(&self, name: &str, path: &Path) -> Result<OwnedFd, ConfinedError> {
        rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
            Mode::empty(),
        )
        .map_err(|e| ConfinedError::Io {
            what: "opening the directory",
            path: path.to_path_buf(),
            source: match e {
                rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => {
                    io::Error::other(not_a_dir(self.fd(), name))
                }
                e => e.into(),
            },
        })
    }

    /// Creates the file `name` (it must not exist, and a link of that name
    /// is not followed) with `mode`, open for reading and writing.
    pub fn create_file(&self, name: &str, mode: u32) -> Result<File, ConfinedError> {
        let name = check_name(name)?;
        let path = self.path.join(name);
        let fd = rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDWR,
            Mode::from_raw_mode(mode),
        )
        .map_err(io_at("creating", &path))?;
        rustix::fs::fchmod(&fd, Mode::from_raw_mode(mode))
            .map_err(io_at("setting the mode of", &path))?;
        Ok(File::from(fd))
    }

    /// Opens the file `name` for reading and writing, creating it with
    /// `mode` when missing, without following a link, and checks on its
    /// descriptor that it is a regular file of this process's user with no
    /// other link to it: a file that outlives the process and is opened
    /// again by later ones (a lock).
    pub fn open_own_file(&self, name: &str, mode: u32) -> Result<File, ConfinedError> {
        let name = check_name(name)?;
        let path = self.path.join(name);
        let refuse = |reason: String| ConfinedError::Io {
            what: "opening",
            path: path.clone(),
            source: io::Error::other(reason),
        };
        let fd = rustix::fs::openat(
            &*self.fd,
            name,
            OFlags::CREATE | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDWR,
            Mode::from_raw_mode(mode),
        )
        .map_err(|e| match e {
            rustix::io::Errno::LOOP => refuse("it is a symbolic link".into()),
            e => refuse(io::Error::from(e).to_string()),
        })?;
        let st = rustix::fs::fstat(&fd).map_err(io_at("reading", &path))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(refuse("it is not a regular file".into()));
        }
        let me = euid();
        if st.st_uid != me {
            return Err(refuse(format!(
                "it is owned by uid {}, not by this user (uid {me})",
                st.st_uid
            )));
        }
        if st.st_nlink != 1 {
            return Err(refuse(format!(
                "it has {} hard links (another name for the same file)",
                st.st_nlink
            )));
        }
        Ok(File::from(fd))
    }

    /// Creates the file `name` with `mode` and writes `bytes` to it.
    pub fn write_file(&self, name: &str, bytes: &[u8], mode: u32) -> Result<File, ConfinedError> {
        use std::io::Write;
        let mut f = self.create_file(name, mode)?;
        f.write_all(bytes).map_err(|source| ConfinedError::Io {
            what: "writing",
            path: self.path.join(name),
            source,
        })?;
        Ok(f)
    }

    /// Replaces the file `name` with one holding `bytes`, with `mode`: the
    /// bytes go into `NAME.new`, made fresh (a `NAME.new` left by a writer
    /// that died, file or link, is removed first, never followed) and
    /// synced, and that file is renamed over `name` relative to this
    /// directory's descriptor. A link at `name` is replaced, never written
    /// through. The rename is atomic: a process that opens `name` while it
    /// is replaced (a run reading a testbed's hosts file while `testbed
    /// set` rewrites it) reads the old file or the new one whole, never
    /// one cut short or half written. The `.new` name is fixed, so two
    /// writers of one name at once must be kept apart by the caller (the
    /// testbed's lock does): each would remove the other's. Returns the
    /// new file, open for reading and writing.
    pub fn replace_file(&self, name: &str, bytes: &[u8], mode: u32) -> Result<File, ConfinedError> {
        let name = check_name(name)?;
        let tmp = format!("{name}.new");
        let tmp = check_name(&tmp)?;
        match rustix::fs::unlinkat(&*self.fd, tmp, AtFlags::empty()) {
            Ok(()) | Err(rustix::io::Errno::NOENT) => {}
            Err(e) => return Err(io_at("removing", &self.path.join(tmp))(e)),
        }
        let mut file = self.create_file(tmp, mode)?;
        let done = std::io::Write::write_all(&mut file, bytes)
            .and_then(|()| file.sync_all())
            .map_err(|source| ConfinedError::Io {
                what: "writing",
                path: self.path.join(tmp),
                source,
            })
            .and_then(|()| {
                rustix::fs::renameat(&*self.fd, tmp, &*self.fd, name)
                    .map_err(io_at("renaming into place", &self.path.join(name)))
            });
        if let Err(e) = done {
            // The file this call made goes; the one it was to replace
            // stays as it was.
            let _ = rustix::fs::unlinkat(&*self.fd, tmp, AtFlags::empty());
            return Err(e);
        }
        Ok(file)
    }

    /// Removes the file `name` (a link of that name is removed, never
    /// followed).
    pub fn remove_file(&self, name: &str) -> Result<(), ConfinedError> {
        let name = check_name(name)?;
        rustix::fs::unlinkat(&*self.fd, name, AtFlags::empty())
            .map_err(io_at("removing", &self.path.join(name)))
    }

    /// Hands the directory to `uid`:`gid` (through its descriptor).
    pub(crate) fn chown(&self, uid: u32, gid: u32) -> Result<(), ConfinedError> {
        rustix::fs::fchown(
            self.fd(),
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )
        .map_err(io_at("handing over", &self.path))
    }

    /// Free bytes for an unprivileged user and total bytes of the
    /// directory's file system.
    pub(crate) fn space_bytes(&self) -> Result<(u64, u64), ConfinedError> {
        let s = rustix::fs::fstatvfs(self.fd())
            .map_err(io_at("reading the file system of", &self.path))?;
        Ok((
            s.f_bavail.saturating_mul(s.f_frsize),
            s.f_blocks.saturating_mul(s.f_frsize),
        ))
    }

    /// Whether the directory is on tmpfs (its files live in memory).
    pub(crate) fn on_tmpfs(&self) -> bool {
        rustix::fs::fstatfs(self.fd()).is_ok_and(|s| s.f_type == libc::TMPFS_MAGIC)
    }

    /// The names of the directory's entries (not `.` and `..`) with
    /// whether each is a directory (never following a link).
    pub(crate) fn entries(&self) -> Result<Vec<(String, bool)>, ConfinedError> {
        let mut out = Vec::new();
        for e in rustix::fs::Dir::read_from(self.fd()).map_err(io_at("listing", &self.path))? {
            let e = e.map_err(io_at("listing", &self.path))?;
            let name = e.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let Ok(name) = name.to_str() else { continue };
            let is_dir = is_dir_at(self.fd(), e.file_name(), e.file_type());
            out.push((name.to_string(), is_dir));
        }
        Ok(out)
    }

    /// Removes the entry `name` and, for a directory, everything in it,
    /// relative to this directory's descriptor and never following a link.
    pub fn remove_all(&self, name: &str) -> Result<(), ConfinedError> {
        let name = check_name(name)?;
        let c = std::ffi::CString::new(name)
            .map_err(|_| ConfinedError::BadName { name: name.into() })?;
        remove_at(self.fd(), &c, 0).map_err(|e| ConfinedError::Io {
            what: "removing",
            path: self.path.join(name),
            source: e.into(),
        })
    }

    /// Keeps the directory when dropped (it is no longer removed).
    pub(crate) fn keep(&mut self) {
        self.remove_from = None;
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        if let Some((parent, name)) = self.remove_from.take() {
            if let Ok(c) = std::ffi::CString::new(name) {
                let _ = remove_at(parent.as_fd(), &c, 0);
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn base(t: &tempfile::TempDir) -> Dir {
        let p = t.path().join("base");
        Dir::open_base(&p, "a test base", "remove it", 0o700).unwrap()
    }

    #[test]
    fn files_and_directories_are_made_exclusively() {
        let t = tempfile::tempdir().unwrap();
        let b = base(&t);
        let d = b.fresh_subdir("d", 0o700).unwrap();
        assert!(b.fresh_subdir("d", 0o700).is_err());
        d.write_file("f", b"x", 0o600).unwrap();
        let e = d.write_file("f", b"y", 0o600).unwrap_err().to_string();
        assert!(e.contains("creating") && e.contains("/d/f"), "{e}");
        assert_eq!(std::fs::read(d.path().join("f")).unwrap(), b"x");
        let m = std::fs::metadata(d.path()).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
    }

    #[test]
    fn names_are_single_components() {
        for bad in ["", ".", "..", "a/b", "/etc", "a\0b"] {
            assert!(check_name(bad).is_err(), "{bad:?}");
        }
        assert!(check_name("nginx.conf").is_ok());
        assert!(relative_components("/etc", 8).is_err());
        assert!(relative_components("../x", 8).is_err());
        assert!(relative_components("a/./b", 8).is_err());
        assert_eq!(relative_components("a//b/", 8).unwrap(), vec!["a", "b"]);
    }

    #[test]
    fn a_symbolic_link_named_like_the_file_or_directory_is_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let b = base(&t);
        let target = t.path().join("secret");
        std::fs::write(&target, b"keep").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::symlink(&target, b.path().join("x.conf")).unwrap();
        assert!(b.write_file("x.conf", b"overwritten", 0o644).is_err());
        std::os::unix::fs::symlink(t.path(), b.path().join("sub")).unwrap();
        assert!(b.open_subdir("sub").is_err());
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        let m = std::fs::metadata(&target).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
    }

    #[test]
    fn a_replaced_file_is_whole_and_a_planted_link_is_replaced_not_followed() {
        let t = tempfile::tempdir().unwrap();
        let b = base(&t);
        b.replace_file("hosts.json", b"old", 0o600).unwrap();
        let reader = std::fs::File::open(b.path().join("hosts.json")).unwrap();
        b.replace_file("hosts.json", b"new", 0o600).unwrap();
        // One opened before the rename keeps the old file, whole.
        assert_eq!(std::io::read_to_string(reader).unwrap(), "old");
        assert_eq!(std::fs::read(b.path().join("hosts.json")).unwrap(), b"new");
        let m = std::fs::metadata(b.path().join("hosts.json")).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        assert!(!b.path().join("hosts.json.new").exists());

        // Links another user planted at NAME.new and at NAME: the files
        // they name keep their bytes and mode, and NAME is a file of ours.
        let target = t.path().join("secret");
        std::fs::write(&target, b"keep").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o600)).unwrap();
        let other = t.path().join("other");
        std::fs::write(&other, b"keep too").unwrap();
        std::os::unix::fs::symlink(&target, b.path().join("params.json.new")).unwrap();
        std::os::unix::fs::symlink(&other, b.path().join("params.json")).unwrap();
        b.replace_file("params.json", b"{}", 0o644).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
        assert_eq!(std::fs::read(&other).unwrap(), b"keep too");
        let m = std::fs::metadata(&target).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o600);
        let m = std::fs::symlink_metadata(b.path().join("params.json")).unwrap();
        assert!(m.file_type().is_file(), "the link was replaced");
        assert_eq!(m.permissions().mode() & 0o777, 0o644);
        assert_eq!(m.uid(), euid());
        assert_eq!(std::fs::read(b.path().join("params.json")).unwrap(), b"{}");
        assert!(std::fs::symlink_metadata(b.path().join("params.json.new")).is_err());

        // A directory where the file goes is not replaced, and what was
        // made for it goes.
        std::fs::create_dir(b.path().join("d")).unwrap();
        let e = b.replace_file("d", b"x", 0o600).unwrap_err().to_string();
        assert!(e.contains("renaming into place") && e.contains("/d"), "{e}");
        assert!(b.path().join("d").is_dir() && !b.path().join("d.new").exists());
        assert!(b.replace_file("../x", b"x", 0o600).is_err());
    }

    #[test]
    fn a_checked_subdirectory_is_made_or_refused_like_a_base() {
        let t = tempfile::tempdir().unwrap();
        let b = base(&t);
        let d = b
            .open_base_at("tb", "a test state directory", "remove it", 0o700)
            .unwrap();
        let m = std::fs::metadata(d.path()).unwrap();
        assert_eq!(m.permissions().mode() & 0o777, 0o700);
        drop(d);
        assert!(b.path().join("tb").is_dir(), "kept when dropped");
        assert!(
            b.open_base_at("tb", "x", "x", 0o700).is_ok(),
            "opened again"
        );
        let open = b.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = b
            .open_base_at("open", "a test state directory", "remove it", 0o700)
            .unwrap_err()
            .to_string();
        assert_eq!(
            e,
            format!(
                "refusing {} as a test state directory: it is writable by every user (mode 777); remove it",
                open.display()
            )
        );
        std::os::unix::fs::symlink(t.path(), b.path().join("link")).unwrap();
        let e = b
            .open_base_at("link", "x", "x", 0o700)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        assert!(b.open_base_at("a/b", "x", "x", 0o700).is_err());
    }

    #[test]
    fn a_base_writable_by_others_or_a_link_is_refused_in_one_line() {
        let t = tempfile::tempdir().unwrap();
        let open = t.path().join("open");
        std::fs::create_dir(&open).unwrap();
        std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
        let e = Dir::open_base(&open, "the base", "pass --run-dir DIR", 0o700)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(&open.display().to_string()) && e.contains("writable by every user"),
            "{e}"
        );
        assert_eq!(e.lines().count(), 1);
        let link = t.path().join("link");
        let real = t.path().join("real");
        std::fs::create_dir(&real).unwrap();
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let e = Dir::open_base(&link, "the base", "pass --run-dir DIR", 0o700)
            .unwrap_err()
            .to_string();
        assert!(e.contains("symbolic link"), "{e}");
        let missing = t.path().join("no/such");
        let e = Dir::open_base(&missing, "the base", "x", 0o700)
            .unwrap_err()
            .to_string();
        assert!(e.contains("parent directory does not exist"), "{e}");
    }

    #[test]
    fn a_base_owned_by_another_user_is_refused() {
        if euid() != 0 {
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let p = t.path().join("theirs");
        std::fs::create_dir(&p).unwrap();
        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).unwrap();
        let e = Dir::open_base(&p, "the base", "pass --run-dir DIR", 0o700)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("owned by uid 65534") && e.contains("(uid 0)"),
            "{e}"
        );
        let b = base(&t);
        std::fs::create_dir(b.path().join("theirs")).unwrap();
        std::os::unix::fs::chown(b.path().join("theirs"), Some(65534), Some(65534)).unwrap();
        let e = b
            .open_base_at("theirs", "the state", "remove it", 0o700)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("owned by uid 65534") && e.contains("(uid 0)"),
            "{e}"
        );
    }

    #[test]
    fn an_own_file_is_opened_again_but_never_through_a_link_or_another_name() {
        let t = tempfile::tempdir().unwrap();
        let b = base(&t);
        let mut f = b.open_own_file("x.lock", 0o600).unwrap();
        std::io::Write::write_all(&mut f, b"1").unwrap();
        drop(f);
        let f = b.open_own_file("x.lock", 0o600).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 1, "the same file, kept");
        let target = t.path().join("secret");
        std::fs::write(&target, b"keep").unwrap();
        std::os::unix::fs::symlink(&target, b.path().join("link.lock")).unwrap();
        let e = b.open_own_file("link.lock", 0o600).unwrap_err().to_string();
        assert!(
            e.contains("symbolic link") && e.contains("link.lock"),
            "{e}"
        );
        std::fs::hard_link(&target, b.path().join("hard.lock")).unwrap();
        let e = b.open_own_file("hard.lock", 0o600).unwrap_err().to_string();
        assert!(e.contains("2 hard links"), "{e}");
        assert_eq!(std::fs::read(&target).unwrap(), b"keep");
    }

    #[test]
    fn removal_does_not_follow_links_out_of_the_directory() {
        let t = tempfile::tempdir().unwrap();
        let outside = t.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("keep"), b"k").unwrap();
        let b = base(&t);
        let d = b.fresh_subdir("d", 0o700).unwrap();
        let path = d.path().to_path_buf();
        let inner = d.fresh_subdir("inner", 0o700).unwrap();
        inner.write_file("f", b"f", 0o600).unwrap();
        std::mem::forget(inner);
        std::os::unix::fs::symlink(&outside, path.join("out")).unwrap();
        std::os::unix::fs::symlink(outside.join("keep"), path.join("inner/keep-link")).unwrap();
        drop(d);
        assert!(!path.exists());
        assert_eq!(std::fs::read(outside.join("keep")).unwrap(), b"k");
        assert!(b.path().exists(), "the base is kept");
    }
}
