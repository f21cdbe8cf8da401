//! The testbed's namespaces by name, and the programs (`ip`, `tc`, `nft`)
//! run as child processes that build and change them.

use crate::{TestbedError, DEFAULT_NAME, NETNS_PREFIX};
use std::io;
use std::path::Path;
use std::process::{Command, Stdio};

/// Namespace prefix of testbed `name` (`ngtb-` or `ngtb-NAME-`).
pub(crate) fn ns_prefix(name: &str) -> String {
    if name == DEFAULT_NAME {
        NETNS_PREFIX.to_string()
    } else {
        format!("{NETNS_PREFIX}{name}-")
    }
}

/// Whether `ns` is one of testbed `name`'s namespaces: the prefix then
/// exactly `sw`, `probe`, or `h` (a host), `l` (a mesh link) or `sw` (a
/// switch of a link after the first) and a number (so the default testbed
/// never claims a named one's namespaces).
pub(crate) fn is_own_netns(name: &str, ns: &str) -> bool {
    let numbered = |rest: &str, tag: &str| {
        rest.strip_prefix(tag)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    };
    match ns.strip_prefix(&ns_prefix(name)) {
        Some("sw" | "probe") => true,
        Some(rest) => numbered(rest, "h") || numbered(rest, "l") || numbered(rest, "sw"),
        None => false,
    }
}

/// Checks for root and namespace support.
pub(crate) fn preflight() -> Result<(), TestbedError> {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        return Err(TestbedError::NotRoot);
    }
    if !Path::new("/proc/self/ns/net").exists() {
        return Err(TestbedError::NoNetns);
    }
    Ok(())
}

/// Runs a command, returning its stdout; a failure names the command and
/// carries its stderr.
pub(crate) fn run(program: &str, args: &[&str]) -> Result<String, TestbedError> {
    let cmd = format!("{program} {}", args.join(" "));
    let out = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| TestbedError::Command {
            cmd: cmd.clone(),
            detail: if e.kind() == io::ErrorKind::NotFound {
                format!("{program} is not installed (install iproute2)")
            } else {
                e.to_string()
            },
        })?;
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        return Err(TestbedError::Command {
            cmd,
            detail: stderr.trim().replace('\n', "; "),
        });
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

pub(crate) fn ip(args: &[&str]) -> Result<String, TestbedError> {
    run("ip", args)
}

/// Every network namespace on the machine.
fn list_netns() -> Result<Vec<String>, TestbedError> {
    Ok(ip(&["netns", "list"])?
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(str::to_string)
        .collect())
}

/// The testbed's namespaces that exist now.
pub(crate) fn own_netns(name: &str) -> Result<Vec<String>, TestbedError> {
    Ok(list_netns()?
        .into_iter()
        .filter(|ns| is_own_netns(name, ns))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_namespaces_are_told_apart_from_other_testbeds() {
        assert!(is_own_netns("testbed", "ngtb-h1"));
        assert!(is_own_netns("testbed", "ngtb-sw"));
        assert!(is_own_netns("testbed", "ngtb-h12"));
        assert!(is_own_netns("testbed", "ngtb-l12"));
        assert!(is_own_netns("testbed", "ngtb-probe"));
        assert!(is_own_netns("testbed", "ngtb-sw1"));
        assert!(is_own_netns("testbed", "ngtb-sw7"));
        assert!(is_own_netns("x", "ngtb-x-sw3"));
        assert!(!is_own_netns("testbed", "ngtb-sw1-h1"));
        assert!(!is_own_netns("testbed", "ngtb-swx"));
        assert!(!is_own_netns("testbed", "ngtb-x-sw3"));
        assert!(!is_own_netns("testbed", "ngtb-l3-h1"));
        assert!(!is_own_netns("testbed", "ngtb-x-h1"));
        assert!(!is_own_netns("testbed", "ngtb-h"));
        assert!(!is_own_netns("testbed", "ngtb-h1x"));
        assert!(is_own_netns("x", "ngtb-x-h1"));
        assert!(!is_own_netns("x", "ngtb-h1"));
        assert!(!is_own_netns("testbed", "other"));
    }
}
