//! Running this thread's traffic from inside a named network namespace
//! (`ip netns add NAME`, as the testbed makes its hosts), so a coordinator
//! outside the testbed can play one of its hosts.

use std::fs::File;
use std::path::{Path, PathBuf};

/// Where `ip netns` keeps its named namespaces.
const NETNS_DIR: &str = "/run/netns";

/// Why the thread could not enter a network namespace.
#[derive(Debug, thiserror::Error)]
pub enum NetnsError {
    /// The namespace's file could not be opened.
    #[error("network namespace {name}: cannot open {path}: {source}")]
    Open {
        /// The namespace.
        name: String,
        /// Its file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The kernel refused to switch (`setns` needs CAP_SYS_ADMIN).
    #[error("network namespace {name}: cannot enter it: {source} (it needs root)")]
    Enter {
        /// The namespace.
        name: String,
        /// Why.
        source: nix::Error,
    },
    /// The name is not a plain file name.
    #[error("network namespace {0:?}: not a namespace name")]
    BadName(String),
}

/// Moves the calling thread into the network namespace `name`: sockets it
/// opens from now on live there. Other threads, and the file system (so
/// Unix-socket control connections), are unaffected. Threads it spawns later
/// start in the namespace too.
pub fn enter(name: &str) -> Result<(), NetnsError> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(NetnsError::BadName(name.to_string()));
    }
    let path = Path::new(NETNS_DIR).join(name);
    let file = File::open(&path).map_err(|source| NetnsError::Open {
        name: name.to_string(),
        path: path.clone(),
        source,
    })?;
    nix::sched::setns(&file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|source| {
        NetnsError::Enter {
            name: name.to_string(),
            source,
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_are_paths_are_refused_and_missing_ones_named() {
        for bad in ["", "a/b", "..", "."] {
            assert!(matches!(enter(bad), Err(NetnsError::BadName(_))), "{bad:?}");
        }
        let e = enter("netgap-no-such-namespace").expect_err("missing");
        assert!(e.to_string().contains("netgap-no-such-namespace"), "{e}");
    }
}
