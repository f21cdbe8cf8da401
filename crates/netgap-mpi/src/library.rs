//! The ranks under netgap's preload sockets library (`netgap run
//! mpi-latency -t shm|xdp`): Open MPI's tcp BTL as an unmodified program,
//! its connection between the ranks moved by the library as `web` and
//! `gather` move a real server's (on one host onto shared memory; across
//! testbed hosts onto xdp through each host's relay, which the job starts
//! in both hosts' namespaces and stops when it ends). mpirun and its
//! daemons stay plain: only the ranks get the library (`mpirun -x`).
//!
//! What the library did is read from its log, which both ranks append to:
//! a connection it kept on the kernel's TCP is a warning in every record
//! of the job, and a job whose ranks' connections all stayed there is an
//! error, never a record of the library's stack.

use netgap_core::hosts::HostEntry;
use netgap_transport::Programs;
use netgap_workload::preload::{
    await_relay, library_path, relay_present_in, LogSummary, RelayError, DIRECT_ENV, STACK_ENV,
};
use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// The stack the ranks' TCP connections take under the library, as `-t`
/// named it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Library {
    /// The transport's name (`shm`, `xdp`), which the library takes as its
    /// stack.
    pub stack: String,
    /// Whether connections to other hosts go through the hosts' relays
    /// (the transport's [`Programs::LibraryWithRelay`]).
    pub relayed: bool,
}

impl Library {
    /// The library's stack for transport `name`, or `None` when unmodified
    /// programs do not run under the library over it.
    pub fn for_transport(name: &str) -> Option<Library> {
        match netgap_transport::programs(name) {
            Programs::Library => Some(Library {
                stack: name.to_string(),
                relayed: false,
            }),
            Programs::LibraryWithRelay => Some(Library {
                stack: name.to_string(),
                relayed: true,
            }),
            Programs::No | Programs::Kernel => None,
        }
    }
}

/// Why the ranks cannot run under the library, one line.
#[derive(Debug, thiserror::Error)]
pub enum LibraryError {
    /// The library is not where it should be.
    #[error("-t {stack}: {source}")]
    Missing {
        /// The stack asked for.
        stack: String,
        /// Where it was looked for.
        source: netgap_workload::preload::LibraryMissing,
    },
    /// The job's directory for the library's log and the relays' key.
    #[error("-t {stack}: a directory for the library's log: {detail}")]
    Dir {
        /// The stack asked for.
        stack: String,
        /// Why.
        detail: String,
    },
    /// The relays' key could not be made.
    #[error("-t {stack}: the relays' key: {detail}")]
    Key {
        /// The stack asked for.
        stack: String,
        /// Why.
        detail: String,
    },
    /// A host has no second link for its relay's xdp flows.
    #[error("-t {stack}: host {host} has no second link to {peer} for its relay (the ranks' TCP takes the first; make the testbed with --links 2)")]
    NoRelayLink {
        /// The stack asked for.
        stack: String,
        /// The host.
        host: String,
        /// The other host.
        peer: String,
    },
    /// A relay already runs on a host: its key is not the job's.
    #[error("-t {stack}: a relay already runs on host {host}; the MPI job starts its own on both hosts (stop the other, or wait for the run that started it)")]
    RelayRuns {
        /// The stack asked for.
        stack: String,
        /// The host.
        host: String,
    },
    /// A relay could not be started or did not listen.
    #[error("-t {stack}: the relay on host {host}: {detail}")]
    Relay {
        /// The stack asked for.
        stack: String,
        /// The host.
        host: String,
        /// Why, with the relay's last word.
        detail: String,
    },
    /// No connection between the ranks moved to the library's stack.
    #[error("-t {stack}: no connection between the ranks moved to {stack} ({why}); the record would name a stack the ranks did not use")]
    NotMoved {
        /// The stack asked for.
        stack: String,
        /// What the library said, or that it said nothing.
        why: String,
    },
}

/// What the library logged of a job's connections.
pub struct Connections {
    /// Those between programs under the library that it kept on the
    /// kernel's TCP, if any.
    pub warning: Option<String>,
    /// Either rank's sides that went direct, each on an AF_XDP socket of
    /// the rank's own (the rest of the xdp ones went through the relays).
    pub direct: u64,
}

/// One job's use of the library: its directory (the log, the relays'
/// key), the relays it started, and what mpirun exports to the ranks.
/// Dropping it stops the relays and removes the directory.
pub struct LibraryJob {
    library: Library,
    dir: PathBuf,
    log: PathBuf,
    exports: Vec<(String, OsString)>,
    relays: Vec<RelayProcess>,
}

impl LibraryJob {
    /// Prepares the library for a job: on testbed hosts (`hosts`, rank 0's
    /// and rank 1's) with a relayed stack, starts a relay in each host's
    /// namespace on its second link to the other, serving the other's
    /// address, the two keyed alike from a key made for the job.
    pub fn prepare(
        library: &Library,
        hosts: Option<&(HostEntry, HostEntry)>,
    ) -> Result<LibraryJob, LibraryError> {
        let stack = || library.stack.clone();
        let path = library_path().map_err(|source| LibraryError::Missing {
            stack: stack(),
            source,
        })?;
        let dir = crate::launch::scratch_dir().map_err(|e| LibraryError::Dir {
            stack: stack(),
            detail: e.to_string(),
        })?;
        let log = dir.join("preload.log");
        let mut job = LibraryJob {
            library: library.clone(),
            dir,
            log,
            exports: Vec::new(),
            relays: Vec::new(),
        };
        job.exports = vec![
            ("LD_PRELOAD".into(), path.into_os_string()),
            (STACK_ENV.into(), library.stack.clone().into()),
            // Direct connections across hosts, said so that an agent's own
            // environment does not decide.
            (DIRECT_ENV.into(), "1".into()),
            (
                "NETGAP_PRELOAD_LOG".into(),
                job.log.clone().into_os_string(),
            ),
        ];
        if let (true, Some((h0, h1))) = (library.relayed, hosts) {
            job.start_relays(h0, h1)?;
        }
        Ok(job)
    }

    /// What mpirun exports to the ranks (`-x NAME=VALUE`), and only to
    /// them.
    pub fn exports(&self) -> &[(String, OsString)] {
        &self.exports
    }

    /// The library's stack.
    pub fn library(&self) -> &Library {
        &self.library
    }

    /// What the library has logged so far of the ranks' connections (both
    /// ranks append to one log): a warning naming those between programs
    /// under the library that it kept on the kernel's TCP, if any, and how
    /// many of either rank's sides went direct; an error when none moved to
    /// the library's stack.
    pub fn connections(&self) -> Result<Connections, LibraryError> {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let summary = LogSummary::parse(&text);
        if moved(&summary, self.library.relayed) == 0 {
            let why = summary.fallback_reasons.iter().next().map_or_else(
                || "the library logged no connection".to_string(),
                |(r, _)| format!("the library kept them on the kernel's TCP: {r}"),
            );
            return Err(LibraryError::NotMoved {
                stack: self.library.stack.clone(),
                why,
            });
        }
        Ok(Connections {
            warning: kept_warning(&summary),
            direct: summary.connected_direct + summary.accepted_direct,
        })
    }

    fn start_relays(&mut self, h0: &HostEntry, h1: &HostEntry) -> Result<(), LibraryError> {
        let stack = self.library.stack.clone();
        let key = self.dir.join("relay.key");
        netgap_measure::auth::new_key_file(&key).map_err(|e| LibraryError::Key {
            stack: stack.clone(),
            detail: e.to_string(),
        })?;
        for (me, other) in [(h0, h1), (h1, h0)] {
            let Some(netns) = me.netns.clone() else {
                continue;
            };
            let Some(link) = me
                .links
                .iter()
                .find(|l| l.peer == other.name && l.index == 1)
            else {
                return Err(LibraryError::NoRelayLink {
                    stack,
                    host: me.name.clone(),
                    peer: other.name.clone(),
                });
            };
            if relay_present_in(Some(&netns)) {
                return Err(LibraryError::RelayRuns {
                    stack,
                    host: me.name.clone(),
                });
            }
            let log = self.dir.join(format!("relay-{}.log", me.name));
            let args: Vec<OsString> = vec![
                "relay".into(),
                "--interface".into(),
                link.ifname.clone().into(),
                "--peers".into(),
                other.address.to_string().into(),
                "--key".into(),
                key.clone().into_os_string(),
            ];
            let relay =
                RelayProcess::start(&netns, &args, &log).map_err(|e| LibraryError::Relay {
                    stack: stack.clone(),
                    host: me.name.clone(),
                    detail: e.to_string(),
                })?;
            let listens = await_relay(Some(&netns), &log, || relay.exited());
            self.relays.push(relay);
            listens.map_err(|e| LibraryError::Relay {
                stack: stack.clone(),
                host: me.name.clone(),
                detail: match e {
                    // The relay's own word, as it said it.
                    RelayError::Exited { said } | RelayError::Late { said } => said,
                    other => other.to_string(),
                },
            })?;
        }
        Ok(())
    }
}

impl Drop for LibraryJob {
    fn drop(&mut self) {
        // The relays go first: they hold the key file open no longer, but
        // their logs are in the directory.
        self.relays.clear();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A relay this job started in a host's namespace: its process group and
/// the thread that started it there and waits for it (the relay dies with
/// that thread: `PR_SET_PDEATHSIG`). Stopped when dropped.
struct RelayProcess {
    pid: i32,
    waiter: Option<std::thread::JoinHandle<()>>,
}

impl RelayProcess {
    /// Starts this netgap with `args` in network namespace `netns` (a
    /// thread enters it and spawns the relay, which inherits it), its
    /// standard error to `log`.
    fn start(
        netns: &str,
        args: &[OsString],
        log: &Path,
    ) -> Result<RelayProcess, netgap_workload::preload::RelayError> {
        use std::os::unix::fs::OpenOptionsExt;
        // Made fresh in the job's own directory, never through a link.
        let log = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW)
            .open(log)
            .map_err(|source| netgap_workload::preload::RelayError::Log { source })?;
        let (pid, waiter) = netgap_workload::preload::spawn_relay(Some(netns), args.to_vec(), log)?;
        Ok(RelayProcess {
            pid,
            waiter: Some(waiter),
        })
    }

    /// Whether the relay has exited.
    fn exited(&self) -> bool {
        self.waiter.as_ref().is_none_or(|w| w.is_finished())
    }
}

impl Drop for RelayProcess {
    fn drop(&mut self) {
        if let Some(waiter) = self.waiter.take() {
            // SAFETY: a signal to the process group of the relay this job
            // started, still unreaped (its waiter holds it).
            unsafe { libc::kill(-self.pid, libc::SIGTERM) };
            let _ = waiter.join();
        }
    }
}

/// Why the library keeps a connection to a program without it on the
/// kernel's TCP, as its log says: the ranks' connections to mpirun and its
/// daemons, which run plain by design.
const NO_LIBRARY_THERE: &str = "no listener with the library there";

/// A warning naming the connections in `s` the library kept on the
/// kernel's TCP (or whose setup failed) other than those to programs
/// without it, and the first reason given; `None` when there are none.
fn kept_warning(s: &LogSummary) -> Option<String> {
    let plain = s
        .fallback_reasons
        .get(NO_LIBRARY_THERE)
        .copied()
        .unwrap_or(0);
    let kept = (s.kernel_connections() + s.failed).saturating_sub(plain);
    if kept == 0 {
        return None;
    }
    let why = s
        .fallback_reasons
        .keys()
        .find(|r| r.as_str() != NO_LIBRARY_THERE)
        .map_or(String::new(), |r| format!(": {r}"));
    Some(format!(
        "{kept} connections of the ranks stayed on the kernel's TCP under the preload library{why}"
    ))
}

/// How many of the ranks' connections in `s` the library moved to its
/// stack (`relayed`: xdp, through the relays or direct; else shm), either
/// rank's side of each.
fn moved(s: &LogSummary, relayed: bool) -> u64 {
    if relayed {
        s.connected_xdp + s.accepted_xdp + s.connected_direct + s.accepted_direct
    } else {
        s.connected_shm + s.accepted_shm
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_library_runs_over_the_stacks_that_carry_unmodified_programs() {
        let shm = Library::for_transport("shm").expect("shm");
        assert!(!shm.relayed);
        assert_eq!(shm.stack, "shm");
        assert!(Library::for_transport("tcp").is_none());
        assert!(Library::for_transport("unix").is_none());
        assert!(Library::for_transport("nonesuch").is_none());
    }

    #[test]
    fn the_ranks_connections_are_counted_from_both_sides() {
        let log = "netgap-preload[10]: fd 7: connection to port 1024 moved to xdp via the relay\n\
                   netgap-preload[11]: fd 9: accepted connection moved to xdp via the relay\n\
                   netgap-preload[11]: fd 12: accepted connection stays on the kernel's TCP: the peer sent no hello\n";
        let s = LogSummary::parse(log);
        assert_eq!(moved(&s, true), 2);
        assert_eq!(moved(&s, false), 0);
        assert_eq!(s.connected_direct + s.accepted_direct, 0);
        let warning = kept_warning(&s).expect("one kept");
        assert!(
            warning.starts_with("1 connections of the ranks") && warning.ends_with("no hello"),
            "{warning}"
        );
        // Those to mpirun and its daemons, without the library, are theirs.
        let plain = "netgap-preload[10]: fd 3: connection to port 40000 stays on the kernel's TCP: no listener with the library there\n";
        assert_eq!(kept_warning(&LogSummary::parse(plain)), None);
    }
}
