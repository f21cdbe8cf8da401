//! `netgap wrap`: runs a program with netgap's preload sockets library
//! (`libnetgap_preload.so`), which moves the program's TCP connections to
//! peers on this host that run the library too onto shared memory, and
//! (`-t xdp`) those to other hosts onto xdp through the hosts' relays
//! (`netgap relay`): the same library, where the relay's presence
//! decides.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use thiserror::Error;

/// The library's file name.
pub const LIBRARY_FILE: &str = "libnetgap_preload.so";
/// Environment variable naming the library, overriding the search next to
/// the netgap binary.
pub const LIBRARY_ENV: &str = "NETGAP_PRELOAD";

/// Why a program could not be wrapped.
#[derive(Debug, Error)]
pub enum WrapError {
    /// A stack the library does not provide.
    #[error("wrap: stack {0:?} is not provided by the preload library (it provides: shm, xdp)")]
    Stack(String),
    /// No program given.
    #[error("wrap: no program given (netgap wrap -t shm -- PROGRAM ARGS)")]
    NoProgram,
    /// The library is not where it should be.
    #[error("wrap: the preload library {} is missing (build it with `cargo build -p netgap-preload`, or set {LIBRARY_ENV})", .0.display())]
    Missing(PathBuf),
    /// The program could not be started.
    #[error("wrap: cannot run {program}: {source}")]
    Exec {
        /// The program as given.
        program: String,
        /// What `execvp` said.
        source: std::io::Error,
    },
}

/// The library: `NETGAP_PRELOAD` if set, else next to the running binary.
pub fn library_path() -> Result<PathBuf, WrapError> {
    let path = match std::env::var_os(LIBRARY_ENV) {
        Some(p) => PathBuf::from(p),
        None => std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(|d| d.join(LIBRARY_FILE)))
            .unwrap_or_else(|| PathBuf::from(LIBRARY_FILE)),
    };
    if path.is_file() {
        Ok(path)
    } else {
        Err(WrapError::Missing(path))
    }
}

/// `LD_PRELOAD` with `library` first, keeping what was there.
fn preload_value(library: &Path) -> OsString {
    let mut v = OsString::from(library);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}

/// Replaces this process with `command` (program and arguments) under the
/// library for `stack`; returns only on failure.
pub fn exec(stack: &str, command: &[OsString]) -> WrapError {
    if stack != "shm" && stack != "xdp" {
        return WrapError::Stack(stack.to_string());
    }
    if stack == "xdp" && !relay_present() {
        eprintln!("netgap wrap: no relay runs in this network namespace (start `netgap relay`): connections to other hosts stay on the kernel's TCP");
    }
    let Some((program, args)) = command.split_first() else {
        return WrapError::NoProgram;
    };
    let library = match library_path() {
        Ok(l) => l,
        Err(e) => return e,
    };
    let source = Command::new(program)
        .args(args)
        .env("LD_PRELOAD", preload_value(&library))
        .exec();
    WrapError::Exec {
        program: program.to_string_lossy().into_owned(),
        source,
    }
}

/// Whether a relay (`netgap relay`) listens in this network namespace.
pub fn relay_present() -> bool {
    // The relay's socket is a SOCK_SEQPACKET one: a stream socket cannot
    // connect to it.
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let Ok(fd) = socket(
        AddressFamily::Unix,
        SockType::SeqPacket,
        SockFlag::SOCK_CLOEXEC,
        None,
    ) else {
        return false;
    };
    let Ok(a) = UnixAddr::new_abstract(b"netgap-relay") else {
        return false;
    };
    connect(fd.as_raw_fd(), &a).is_ok()
}
