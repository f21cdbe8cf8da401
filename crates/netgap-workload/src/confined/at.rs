//! The descriptor-relative system calls a [`Dir`] is built
//! on: opening a directory checked on its descriptor, and removing a tree
//! without following a link out of it.

use super::{euid, ConfinedError, Dir, MAX_REMOVE_DEPTH};
use rustix::fs::{AtFlags, Mode, OFlags};
use std::ffi::CStr;
use std::io;
use std::os::fd::{AsFd, BorrowedFd};
use std::path::Path;
use std::sync::Arc;

/// Makes `name` in `at` with `mode` if missing, opens it without
/// following a link and checks on its descriptor that it is a directory of
/// this process's user that nobody else can write in; `path` names it in a
/// refusal.
pub(super) fn open_checked<P: rustix::path::Arg + Copy>(
    at: BorrowedFd<'_>,
    name: P,
    path: &Path,
    what: &str,
    remedy: &str,
    mode: u32,
) -> Result<Dir, ConfinedError> {
    let refuse = |reason: String| ConfinedError::Refused {
        path: path.to_path_buf(),
        what: what.into(),
        reason,
        remedy: remedy.into(),
    };
    match rustix::fs::mkdirat(at, name, Mode::from_raw_mode(mode)) {
        Ok(()) | Err(rustix::io::Errno::EXIST) => {}
        Err(rustix::io::Errno::NOENT) => {
            return Err(refuse("its parent directory does not exist".into()))
        }
        Err(e) => return Err(refuse(format!("it cannot be made: {}", io::Error::from(e)))),
    }
    let fd = rustix::fs::openat(
        at,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    )
    .map_err(|e| match e {
        rustix::io::Errno::LOOP | rustix::io::Errno::NOTDIR => refuse(not_a_dir(at, name).into()),
        e => refuse(format!("it cannot be opened: {}", io::Error::from(e))),
    })?;
    let st = rustix::fs::fstat(&fd)
        .map_err(|e| refuse(format!("it cannot be read: {}", io::Error::from(e))))?;
    let me = euid();
    if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::Directory {
        return Err(refuse("it is not a directory".into()));
    }
    if st.st_uid != me {
        return Err(refuse(format!(
            "it is owned by uid {}, not by the user netgap runs as (uid {me})",
            st.st_uid
        )));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(refuse(format!(
            "it is writable by {} (mode {:o})",
            if st.st_mode & 0o002 != 0 {
                "every user"
            } else {
                "its group"
            },
            st.st_mode & 0o7777
        )));
    }
    Ok(Dir {
        fd: Arc::new(fd),
        path: path.to_path_buf(),
        remove_from: None,
    })
}

/// Why `name` in `dir`, which could not be opened as a directory without
/// following a link, is not one.
pub(super) fn not_a_dir<P: rustix::path::Arg>(dir: impl AsFd, name: P) -> &'static str {
    match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Ok(st)
            if rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Symlink =>
        {
            "it is a symbolic link"
        }
        _ => "it is not a directory",
    }
}

/// Whether the entry `name` of `dir` is a directory: from its type in the
/// listing, or (when the file system does not say) from `fstatat` without
/// following a link.
pub(super) fn is_dir_at(dir: BorrowedFd<'_>, name: &CStr, t: rustix::fs::FileType) -> bool {
    match t {
        rustix::fs::FileType::Directory => true,
        rustix::fs::FileType::Unknown => rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| {
                rustix::fs::FileType::from_raw_mode(st.st_mode) == rustix::fs::FileType::Directory
            }),
        _ => false,
    }
}

/// Removes `name` in `dir`: a directory is opened without following a
/// link, emptied relative to its own descriptor and removed; anything else
/// (a link included) is unlinked.
pub(super) fn remove_at(dir: BorrowedFd<'_>, name: &CStr, depth: usize) -> rustix::io::Result<()> {
    let sub = rustix::fs::openat(
        dir,
        name,
        OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::RDONLY,
        Mode::empty(),
    );
    match sub {
        Ok(fd) => {
            if depth < MAX_REMOVE_DEPTH {
                let mut names = Vec::new();
                for e in rustix::fs::Dir::read_from(&fd)?.flatten() {
                    let n = e.file_name();
                    if n != c"." && n != c".." {
                        names.push(n.to_owned());
                    }
                }
                for n in names {
                    // An entry that cannot go leaves its directory, whose
                    // removal then fails and is reported.
                    let _ = remove_at(fd.as_fd(), &n, depth + 1);
                }
            }
            drop(fd);
            rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR)
        }
        Err(rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            rustix::fs::unlinkat(dir, name, AtFlags::empty())
        }
        Err(e) => Err(e),
    }
}
