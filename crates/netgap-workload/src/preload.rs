//! Where netgap's preload sockets library (`libnetgap_preload.so`) is:
//! `NETGAP_PRELOAD` if set, else next to the running netgap binary. One
//! lookup for `netgap wrap` and for the workloads that run real programs
//! under the library.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The library's file name.
pub const LIBRARY_FILE: &str = "libnetgap_preload.so";
/// Environment variable naming the library, overriding the search next to
/// the netgap binary.
pub const LIBRARY_ENV: &str = "NETGAP_PRELOAD";

/// The library is not where it should be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the preload library {} is missing (build it with `cargo build -p netgap-preload`, or set {LIBRARY_ENV})", .0.display())]
pub struct LibraryMissing(pub PathBuf);

/// The library: `NETGAP_PRELOAD` if set, else next to the running binary;
/// an error naming the path looked at when no file is there.
pub fn library_path() -> Result<PathBuf, LibraryMissing> {
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
        Err(LibraryMissing(path))
    }
}

/// `LD_PRELOAD` with `library` first, keeping what this process's
/// `LD_PRELOAD` held.
pub fn preload_value(library: &Path) -> OsString {
    let mut v = OsString::from(library);
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        v.push(":");
        v.push(old);
    }
    v
}
