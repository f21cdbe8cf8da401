//! Multipath TCP on a testbed with several links per host pair (a mesh, or
//! a switch with a switch per link): every host announces the address of
//! each of its link ends as an MPTCP endpoint (`ip mptcp endpoint add ADDR dev IF
//! signal port JOIN_PORT`) and accepts as many announced addresses as a host
//! pair has extra links (`ip mptcp limits set`). A connection between two
//! hosts then starts on one link; the server announces its addresses on the
//! other links, and the client opens a subflow to each, so the connection
//! uses every link between them. TCP connections are not affected.
//!
//! Every host is both client and server, so the client announces its own
//! addresses too, and the server opens subflows to them. An address
//! announced without a port makes the peer join at the connection's own
//! port, which on the client is an ephemeral port nothing listens on: the
//! join is refused, and in about one connection in five the failure took
//! the client's own subflow on that link down with it. So each endpoint is
//! announced with [`JOIN_PORT`], where the kernel listens for joins, and the
//! subflow limit leaves room for a subflow each way on every extra link.

use crate::command::ip;
use crate::TestbedError;
use netgap_core::hosts::HostEntry;
use std::path::Path;

/// The port every endpoint is announced with; the kernel listens on it, on
/// that address, for joins to any connection. Next to netgap's default
/// agent port, outside the ephemeral range, so no test's socket takes it.
pub(super) const JOIN_PORT: u16 = 7199;

/// The kernel's own upper limit on extra subflows and accepted addresses
/// per connection (`MPTCP_PM_ADDR_MAX`).
const KERNEL_MAX: u32 = 8;

/// The `ip mptcp limits` values `(subflows, add_addr_accepted)` for a
/// testbed with `links` links per host pair: one accepted address per link beyond
/// the first, and room for two subflows on each of those links (one each
/// way), within the kernel's limit.
pub(super) fn limits(links: u32) -> (u32, u32) {
    let extra = links.saturating_sub(1);
    ((2 * extra).min(KERNEL_MAX), extra.min(KERNEL_MAX))
}

/// Whether this kernel has MPTCP at all (its sysctl exists).
pub(super) fn kernel_has_mptcp() -> bool {
    Path::new("/proc/sys/net/mptcp/enabled").exists()
}

/// Configures host `h`'s namespace for a testbed with `links` links per
/// host pair. Does nothing when the kernel lacks MPTCP: TCP needs none of
/// it. On a switch a host's end of link k has one address toward every
/// other host: it is announced once.
pub(super) fn configure(h: &HostEntry, links: u32) -> Result<(), TestbedError> {
    if !kernel_has_mptcp() || links < 2 {
        return Ok(());
    }
    let ns = h.netns.as_deref().unwrap_or_default();
    let (subflows, accepted) = limits(links);
    ip(&[
        "-n",
        ns,
        "mptcp",
        "limits",
        "set",
        "subflow",
        &subflows.to_string(),
        "add_addr_accepted",
        &accepted.to_string(),
    ])?;
    let mut announced = Vec::new();
    for l in &h.links {
        if announced.contains(&l.local) {
            continue;
        }
        announced.push(l.local);
        let addr = l.local.to_string();
        ip(&[
            "-n",
            ns,
            "mptcp",
            "endpoint",
            "add",
            &addr,
            "dev",
            &l.ifname,
            "signal",
            "port",
            &JOIN_PORT.to_string(),
        ])?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::limits;

    #[test]
    fn limits_allow_two_subflows_per_extra_link_within_the_kernels_cap() {
        assert_eq!(limits(1), (0, 0));
        assert_eq!(limits(3), (4, 2));
        assert_eq!(limits(5), (8, 4));
        assert_eq!(limits(8), (8, 7));
        assert_eq!(limits(20), (8, 8));
    }
}
