//! System limits that thousands of flows run into before anything else: the
//! per-process file-descriptor limit (RLIMIT_NOFILE), raised as far as the
//! system lets the engine raise it, and the ephemeral port range that caps
//! concurrent connections from one address to one target. Each refusal
//! becomes an [`EngineError`] that says what to change.

use super::EngineError;
use nix::sys::resource::{getrlimit, setrlimit, Resource};

/// Descriptors the engine keeps free for everything that is not a flow
/// (epoll instances, listeners, control connections, files of the host).
pub const SPARE_FDS: u64 = 64;

/// Makes sure this process may open at least `needed` file descriptors:
/// raises the soft RLIMIT_NOFILE up to the hard limit, and the hard limit
/// itself when the process is privileged to. Returns the soft limit now in
/// force. Errors name how many descriptors are needed and how to allow them.
pub fn ensure_fd_limit(needed: u64) -> Result<u64, EngineError> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| EngineError::Limit {
        what: "reading RLIMIT_NOFILE".into(),
        source: e.into(),
    })?;
    if soft >= needed {
        return Ok(soft);
    }
    if hard >= needed {
        setrlimit(Resource::RLIMIT_NOFILE, needed, hard).map_err(|e| EngineError::Limit {
            what: format!("raising the open-file soft limit from {soft} to {needed}"),
            source: e.into(),
        })?;
        return Ok(needed);
    }
    // Only a privileged process (CAP_SYS_RESOURCE) may raise the hard limit;
    // try, and explain when it is refused.
    if setrlimit(Resource::RLIMIT_NOFILE, needed, needed).is_ok() {
        return Ok(needed);
    }
    Err(EngineError::TooFewDescriptors { needed, soft, hard })
}

/// The soft and hard RLIMIT_NOFILE of this process.
pub fn fd_limits() -> Result<(u64, u64), EngineError> {
    getrlimit(Resource::RLIMIT_NOFILE).map_err(|e| EngineError::Limit {
        what: "reading RLIMIT_NOFILE".into(),
        source: e.into(),
    })
}

/// How many connections one process of this host may hold open with
/// `workers` engine workers: what its hard descriptor limit `hard` leaves
/// past the workers' epoll instances and [`SPARE_FDS`].
pub fn connections_per_process(hard: u64, workers: u64) -> u64 {
    hard.saturating_sub(workers).saturating_sub(SPARE_FDS)
}

/// The system-wide count of open files and its ceiling
/// (`fs.file-nr`: allocated, unused, `fs.file-max`), if readable: what no
/// number of processes can pass.
pub fn system_files() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/sys/fs/file-nr").ok()?;
    parse_file_nr(&text)
}

/// Parses the three numbers of `fs.file-nr` into (in use, most).
fn parse_file_nr(text: &str) -> Option<(u64, u64)> {
    let mut it = text.split_whitespace().map(str::parse::<u64>);
    let allocated = it.next()?.ok()?;
    let unused = it.next()?.ok()?;
    let max = it.next()?.ok()?;
    Some((allocated.saturating_sub(unused), max))
}

/// The inclusive ephemeral port range of this host
/// (`net.ipv4.ip_local_port_range`, which also governs IPv6), if readable.
pub(crate) fn local_port_range() -> Option<(u32, u32)> {
    let text = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range").ok()?;
    parse_port_range(&text)
}

/// Parses the two numbers of `ip_local_port_range`.
fn parse_port_range(text: &str) -> Option<(u32, u32)> {
    let mut it = text.split_whitespace().map(str::parse::<u32>);
    let low = it.next()?.ok()?;
    let high = it.next()?.ok()?;
    (low <= high).then_some((low, high))
}

/// Checks that `concurrent` connections from one local address to one
/// target fit in the ephemeral port range `range`.
pub(crate) fn check_port_range(
    concurrent: u64,
    range: Option<(u32, u32)>,
    target: std::net::SocketAddr,
) -> Result<(), EngineError> {
    let Some((low, high)) = range else {
        return Ok(());
    };
    let ports = u64::from(high - low) + 1;
    if concurrent > ports {
        return Err(EngineError::TooFewPorts {
            concurrent,
            ports,
            low,
            high,
            target,
        });
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn port_range_parses_the_proc_format() {
        assert_eq!(parse_port_range("32768\t60999\n"), Some((32768, 60999)));
        assert_eq!(parse_port_range("10 5"), None);
        assert_eq!(parse_port_range("x"), None);
    }

    #[test]
    fn too_many_connections_for_the_port_range_is_an_error_with_a_remedy() {
        let target = "10.0.0.2:7000".parse().unwrap();
        assert!(check_port_range(100, Some((1000, 1099)), target).is_ok());
        let e = check_port_range(101, Some((1000, 1099)), target)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("101") && e.contains("100") && e.contains("ip_local_port_range"),
            "{e}"
        );
        assert!(check_port_range(1_000_000, None, target).is_ok());
    }

    #[test]
    fn file_nr_parses_and_a_process_keeps_spare_descriptors() {
        assert_eq!(
            parse_file_nr("3200\t0\t9223372036854775807\n"),
            Some((3200, 9223372036854775807))
        );
        assert_eq!(parse_file_nr("3200 200 100000"), Some((3000, 100000)));
        assert_eq!(parse_file_nr("3200 0"), None);
        assert_eq!(connections_per_process(20_000, 2), 20_000 - 2 - SPARE_FDS);
        assert_eq!(connections_per_process(10, 2), 0);
        let (soft, hard) = fd_limits().unwrap();
        assert!(soft <= hard);
    }

    #[test]
    fn the_current_limit_is_enough_for_a_few_descriptors() {
        assert!(ensure_fd_limit(16).unwrap() >= 16);
    }

    #[test]
    fn an_impossible_descriptor_count_says_what_to_change() {
        // Above fs.nr_open, which even a privileged process cannot pass.
        let e = ensure_fd_limit(u64::from(u32::MAX))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ulimit -n") && e.contains("LimitNOFILE"), "{e}");
    }
}
