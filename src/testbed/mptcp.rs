//! Multipath TCP on a mesh testbed: every host announces the address of each
//! of its link ends as an MPTCP endpoint (`ip mptcp endpoint add ADDR dev IF
//! signal`) and accepts as many announced addresses and extra subflows as a
//! host pair has links (`ip mptcp limits set`). A connection between two
//! hosts then starts on one link; the server announces its addresses on the
//! other links, and the client opens a subflow to each, so the connection
//! uses every link between them. TCP connections are not affected.

use super::{ip, TestbedError};
use netgap_measure::cluster::HostEntry;
use std::path::Path;

/// The kernel's own upper limit on extra subflows and accepted addresses
/// per connection (`MPTCP_PM_ADDR_MAX`).
const KERNEL_MAX: u32 = 8;

/// The `ip mptcp limits` values for a mesh with `links` links per host
/// pair: one extra subflow and one accepted address per link beyond the
/// first, within the kernel's limit.
pub(super) fn limits(links: u32) -> u32 {
    links.saturating_sub(1).min(KERNEL_MAX)
}

/// Whether this kernel has MPTCP at all (its sysctl exists).
pub(super) fn kernel_has_mptcp() -> bool {
    Path::new("/proc/sys/net/mptcp/enabled").exists()
}

/// Configures host `h`'s namespace for a mesh with `links` links per host
/// pair. Does nothing when the kernel lacks MPTCP: TCP needs none of it.
pub(super) fn configure(h: &HostEntry, links: u32) -> Result<(), TestbedError> {
    if !kernel_has_mptcp() || links < 2 {
        return Ok(());
    }
    let ns = h.netns.as_deref().unwrap_or_default();
    let n = limits(links).to_string();
    ip(&[
        "-n",
        ns,
        "mptcp",
        "limits",
        "set",
        "subflow",
        &n,
        "add_addr_accepted",
        &n,
    ])?;
    for l in &h.links {
        let addr = l.local.to_string();
        ip(&[
            "-n", ns, "mptcp", "endpoint", "add", &addr, "dev", &l.ifname, "signal",
        ])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::limits;

    #[test]
    fn limits_allow_a_subflow_per_extra_link_within_the_kernels_cap() {
        assert_eq!(limits(1), 0);
        assert_eq!(limits(3), 2);
        assert_eq!(limits(8), 7);
        assert_eq!(limits(20), 8);
    }
}
