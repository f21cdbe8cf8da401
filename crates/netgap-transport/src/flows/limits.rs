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
