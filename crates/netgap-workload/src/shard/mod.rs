//! A flow-engine server spread over processes, for a role whose flows are
//! more than one process may hold descriptors for (a hard `RLIMIT_NOFILE`
//! the agent cannot raise). The agent binds the listener once and starts
//! shard processes that inherit it, the way a pre-forked server's workers
//! share one listening socket: each shard is this binary again
//! (`/proc/self/exe` with the hidden `SUBCOMMAND`), runs a
//! [`FlowServer`](flows::FlowServer) on the inherited socket, and holds at most its cap of
//! connections, so the kernel's accept queue hands the rest to the others.
//!
//! A shard takes its configuration over its stdin as one JSON line
//! (`ShardConfig`: engine configuration, data token, cap), never from its
//! arguments, and reports over its stdout (`FromShard`): that it serves,
//! its counts of connections every `STATUS_EVERY`, and at the end its
//! [`ServerTotals`](flows::ServerTotals) and its own peak memory. It stops when the agent says
//! so or closes its stdin, and dies with the thread that started it
//! (`PR_SET_PDEATHSIG`), so no shard outlives its role, however the agent
//! or its session ends. The seam is the server's today; a client host past
//! its limit could spread its flows the same way.

mod child;
mod message;
mod set;

pub use child::run_shard;
pub(crate) use message::ShardConfig;
pub(crate) use set::ShardSet;

use netgap_transport::flows::{self, EngineError};
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Duration;

/// The hidden subcommand of the binary that runs one shard.
pub(crate) const SUBCOMMAND: &str = "flow-shard";
/// Most shard processes one server role starts: past them a point is
/// refused in one line, as a single process past its limit is.
pub(crate) const MAX_SHARDS: u32 = 16;
/// Most engine workers a shard runs.
pub(crate) const MAX_SHARD_WORKERS: u32 = 64;
/// What one shard process commits besides its flows, in bytes, an upper
/// bound: the binary's mapped and touched pages, its threads' stacks and
/// the workers' event buffers (an idle agent is about 6 MiB resident).
pub(crate) const SHARD_PROCESS_BYTES: u64 = 16 << 20;
/// The descriptor a shard finds the shared listener on.
const LISTENER_FD: RawFd = 3;
/// Longest line either side sends: a configuration is a few hundred bytes.
const MAX_LINE_BYTES: u64 = 64 * 1024;
/// How often a shard reports its counts of connections.
pub(crate) const STATUS_EVERY: Duration = Duration::from_millis(20);
/// How long the agent waits for a shard to say it serves, or to report
/// once told to stop (its drain is 100 ms; a busy host takes longer).
const REPORT_TIMEOUT: Duration = Duration::from_secs(10);
/// Longest I/O timeout a shard accepts, ms (the point's own is smaller).
const MAX_IO_TIMEOUT_MS: u64 = 3_600_000;

/// Why a server could not be spread over processes, or a shard failed: one
/// line.
#[derive(Debug, thiserror::Error)]
pub enum ShardError {
    /// Even the most shards do not hold the flows.
    #[error(
        "{flows} flows need {needed} server processes of {per_process} connections each \
         (descriptor limit {soft}, hard limit {hard}), more than the {max} one agent starts; \
         raise the hard limit (`ulimit -Hn`, LimitNOFILE= in the service unit) or use fewer flows"
    )]
    TooManyShards {
        /// Flows of the role.
        flows: u64,
        /// Processes they would need.
        needed: u64,
        /// Connections one process holds.
        per_process: u64,
        /// Soft descriptor limit.
        soft: u64,
        /// Hard descriptor limit.
        hard: u64,
        /// `MAX_SHARDS`.
        max: u32,
    },
    /// The system-wide count of open files would pass `fs.file-max`.
    #[error(
        "{flows} flows need {flows} more open files but the system has {in_use} of its \
         fs.file-max {max} open; raise it with `sysctl -w fs.file-max=N` or use fewer flows"
    )]
    SystemFiles {
        /// Flows of the role.
        flows: u64,
        /// Open files now.
        in_use: u64,
        /// fs.file-max.
        max: u64,
    },
    /// The shard's configuration is out of range or does not parse.
    #[error("shard configuration: {0}")]
    Config(String),
    /// The descriptor a shard should serve on is not a listening TCP socket.
    #[error("descriptor {LISTENER_FD} is not a listening TCP socket (a shard runs only as the agent starts it)")]
    NoListener,
    /// Starting or talking to a shard failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Why it failed.
        source: std::io::Error,
    },
    /// A shard said it failed, ended without its report, or was late.
    #[error("server process {index} of {count}: {detail}")]
    Shard {
        /// The shard, 0-based.
        index: usize,
        /// Shards of the role.
        count: usize,
        /// What happened.
        detail: ShardFailure,
    },
    /// The engine failed.
    #[error(transparent)]
    Engine(#[from] EngineError),
}

/// What went wrong with one shard process, as its agent saw it.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ShardFailure {
    /// The thread that starts the shard processes ended before this one.
    #[error("the thread starting it ended")]
    StarterEnded,
    /// Its stdout closed before its report.
    #[error("ended without its report")]
    Ended,
    /// A line of its stdout could not be read.
    #[error("unreadable report: {0}")]
    Unreadable(Arc<std::io::Error>),
    /// A line of its stdout is not one of its messages.
    #[error("unreadable report: {0}")]
    Garbled(Arc<serde_json::Error>),
    /// It said it failed, and why.
    #[error("{0}")]
    Failed(String),
    /// It did not say it serves within `REPORT_TIMEOUT`.
    #[error("not serving within {0:?}")]
    NotServing(Duration),
    /// It sent no report within `REPORT_TIMEOUT` of being told to stop.
    #[error("no report within {0:?} of being stopped")]
    NoReport(Duration),
}

/// How a server role of `flows` connections is served.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Processes {
    /// By the agent's own process, whose descriptor limit now holds them.
    One,
    /// By `count` shard processes holding at most `per_process`
    /// connections each.
    Shards {
        /// Shard processes.
        count: u32,
        /// Most connections each holds.
        per_process: u64,
    },
}

/// Decides how `flows` connections with `workers` engine workers per
/// process are served: in this process when its descriptor limit (raised
/// as far as allowed) holds them and they are within `forced` (an
/// agent-start cap of connections per process), else over as many shard
/// processes as the hard limit (and `forced`) needs. Refuses in one line
/// what [`MAX_SHARDS`] processes, or the system's `fs.file-max`, cannot
/// hold.
pub(crate) fn plan(flows: u64, workers: u64, forced: Option<u64>) -> Result<Processes, ShardError> {
    let needed = flows + workers + flows::limits::SPARE_FDS;
    if forced.is_none_or(|cap| flows <= cap) {
        match flows::ensure_fd_limit(needed) {
            Ok(_) => return Ok(Processes::One),
            Err(EngineError::TooFewDescriptors { .. }) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let (_, hard) = flows::limits::fd_limits()?;
    let per_process =
        flows::limits::connections_per_process(hard, workers).min(forced.unwrap_or(u64::MAX));
    let (soft, _) = flows::limits::fd_limits()?;
    let count = if per_process == 0 {
        u64::MAX
    } else {
        flows.div_ceil(per_process)
    };
    if count > u64::from(MAX_SHARDS) {
        return Err(ShardError::TooManyShards {
            flows,
            needed: count,
            per_process,
            soft,
            hard,
            max: MAX_SHARDS,
        });
    }
    if let Some((in_use, max)) = flows::limits::system_files() {
        check_system_files(flows, in_use, max)?;
    }
    Ok(Processes::Shards {
        count: u32::try_from(count).unwrap_or(MAX_SHARDS),
        per_process,
    })
}

/// Refuses `flows` more open files when the system's `fs.file-max` would
/// not hold them.
fn check_system_files(flows: u64, in_use: u64, max: u64) -> Result<(), ShardError> {
    if in_use.saturating_add(flows) > max {
        return Err(ShardError::SystemFiles { flows, in_use, max });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn the_plan_keeps_a_role_in_one_process_when_it_fits_and_caps_shards() {
        assert_eq!(plan(10, 2, None).unwrap(), Processes::One);
        assert_eq!(plan(400, 2, Some(500)).unwrap(), Processes::One);
        assert_eq!(
            plan(2000, 2, Some(500)).unwrap(),
            Processes::Shards {
                count: 4,
                per_process: 500
            }
        );
        assert_eq!(
            plan(2001, 2, Some(500)).unwrap(),
            Processes::Shards {
                count: 5,
                per_process: 500
            }
        );
        let e = plan(500 * u64::from(MAX_SHARDS) + 1, 2, Some(500))
            .unwrap_err()
            .to_string();
        assert!(e.contains("server processes") && e.contains("16"), "{e}");
        assert!(check_system_files(1000, 100, 2000).is_ok());
        let e = check_system_files(1000, 1500, 2000)
            .unwrap_err()
            .to_string();
        assert!(e.contains("fs.file-max"), "{e}");
    }
}
