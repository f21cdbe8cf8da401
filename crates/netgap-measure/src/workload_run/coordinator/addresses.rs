//! Where a point's roles go and the addresses they listen on, connect to
//! and leave from: the placement its workload gives, the addresses the
//! servers announced made reachable from each client's host (over its own
//! link on a mesh), and the parameters a staged role learns.

use super::{HostInfo, Link, WorkloadCoordinator, WorkloadError};
use crate::control::ControlAddr;
use crate::workload_run::plan::WorkloadPoint;
use netgap_proto::workload::WorkloadRole;
use netgap_workload::place::{HostView, Placement, Staged, StagedRole};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};

/// Places the roles of `point` on the run's hosts, as its workload says.
pub(crate) fn place(point: &WorkloadPoint, links: &[Link]) -> Result<Placement, WorkloadError> {
    let hosts: Vec<HostView> = links
        .iter()
        .map(|l| HostView {
            name: l.host.name.clone(),
            address: l.host.address,
            rails: l.host.rails.clone(),
        })
        .collect();
    let placement = point
        .workload
        .place(&point.params, point.clients, &hosts)
        .and_then(|p| p.validate(hosts.len()).map(|()| p))
        .and_then(|p| {
            if point.workload.staged().is_some() && p.roles.iter().any(|r| r.connects_to.is_some()) {
                return Err(netgap_workload::Refused(format!(
                    "{}: a staged placement names no server per role; its roles reach each other through the staged addresses",
                    point.workload.name()
                )));
            }
            Ok(p)
        })
        .map_err(|e| WorkloadError::Point(e.to_string()))?;
    Ok(placement)
}

/// An IP:PORT an agent announced on an unspecified address, made
/// reachable with the address its control connection used.
pub(crate) fn fix_unspecified(addr: &str, host: &HostInfo) -> String {
    match (addr.parse::<SocketAddr>(), host.address) {
        (Ok(sa), Some(ip)) if sa.ip().is_unspecified() => {
            SocketAddr::new(ip, sa.port()).to_string()
        }
        _ => addr.to_string(),
    }
}

/// An IP:PORT a server announced on the unspecified address, made
/// reachable at `ip` (the server's end of a client host's link).
pub(crate) fn retarget(addr: &str, ip: IpAddr) -> String {
    match addr.parse::<SocketAddr>() {
        Ok(sa) if sa.ip().is_unspecified() => SocketAddr::new(ip, sa.port()).to_string(),
        _ => addr.to_string(),
    }
}

/// The announced address a flow targets: a server's only address, or the
/// one of its addresses that serves this flow.
pub(crate) fn listener_for(addrs: &[String], server_flows: &[u32], flow: u32) -> Option<String> {
    if addrs.len() == 1 {
        return addrs.first().cloned();
    }
    let i = server_flows.iter().position(|&f| f == flow)?;
    addrs.get(i).cloned()
}

/// The server role flow `flow` of role `client` targets: `default` (the
/// role it connects to) when that serves the flow, else the first server
/// role prepared before `client` that lists it.
pub(crate) fn serving_role(
    placement: &Placement,
    client: usize,
    default: usize,
    flow: u32,
) -> usize {
    let serves = |i: &usize| {
        let r = &placement.roles[*i];
        r.side == WorkloadRole::Server
            && (r.flows.binary_search(&flow).is_ok() || r.flows.contains(&flow))
    };
    if serves(&default) {
        return default;
    }
    (0..client).find(serves).unwrap_or(default)
}

/// A per-flow list with one entry for all when every entry is the same.
pub(crate) fn compact<T: PartialEq>(mut list: Vec<T>) -> Vec<T> {
    if list.windows(2).all(|w| w[0] == w[1]) {
        list.truncate(1);
    }
    list
}

impl WorkloadCoordinator {
    /// On a mesh, where server role `server` listens for each of its flows
    /// when its transport cannot listen on every address: on its end of
    /// the link from the host of the client role that opens the flow (its
    /// own address when no link is known).
    pub(crate) fn mesh_listen_ips(&self, placement: &Placement, server: usize) -> Vec<IpAddr> {
        let host = placement.roles[server].host;
        let name = &self.links[host].host.name;
        let own = self.links[host]
            .host
            .address
            .unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED));
        placement.roles[server]
            .flows
            .iter()
            .map(|&f| {
                placement
                    .roles
                    .iter()
                    .enumerate()
                    .find(|(c, r)| {
                        r.side == WorkloadRole::Client
                            && r.flows.contains(&f)
                            && r.connects_to
                                .is_some_and(|d| serving_role(placement, *c, d, f) == server)
                    })
                    .and_then(|(_, r)| {
                        let links = &self.links[r.host].host.peer_links;
                        links.iter().find(|p| &p.0 == name).map(|p| p.2)
                    })
                    .unwrap_or(own)
            })
            .collect()
    }

    /// Whether every role of a staged placement reaches every earlier
    /// role's host at that host's own address, over a link of its own to
    /// it: where a transport that listens on one interface (xdp) listens.
    /// True on a switch, with one link or several (each host's own address
    /// sits on the first); false on a mesh, whose links are per pair.
    pub(crate) fn staged_hosts_meet(&self, placement: &Placement) -> bool {
        placement.roles.iter().enumerate().all(|(r, role)| {
            let here = &self.links[role.host].host;
            placement.roles[..r].iter().all(|earlier| {
                let there = &self.links[earlier.host].host;
                there.address.is_some_and(|a| {
                    here.peer_links
                        .iter()
                        .any(|(peer, _, remote)| *peer == there.name && *remote == a)
                })
            })
        })
    }

    pub(crate) fn session_hosts(&self) -> Vec<IpAddr> {
        let mut ips = Vec::new();
        for l in &self.links {
            ips.extend(l.host.address);
            if let ControlAddr::Tcp(sa) = &l.host.control {
                ips.push(sa.ip());
            }
            for (a, b) in &l.host.rails {
                ips.push(*a);
                ips.push(*b);
            }
            for (_, a, b) in &l.host.peer_links {
                ips.push(*a);
                ips.push(*b);
            }
        }
        ips.sort();
        ips.dedup();
        ips
    }

    /// The parameters of staged role `r`: the point's own, with
    /// [`Staged`] under the key `staged`: the role's index, every role's
    /// side and flows, and what each earlier role announced, made
    /// reachable from this role's host (over their own link on a mesh).
    pub(crate) fn staged_params(
        &self,
        params: &serde_json::Value,
        placement: &Placement,
        r: usize,
        announced: &[Vec<String>],
    ) -> Result<serde_json::Value, WorkloadError> {
        let h = placement.roles[r].host;
        let here = &self.links[h].host;
        let peers = (0..r)
            .map(|j| {
                let there = &self.links[placement.roles[j].host].host;
                let link = here.peer_links.iter().find(|p| p.0 == there.name);
                announced[j]
                    .iter()
                    .map(|a| match link {
                        Some((_, _, remote)) => retarget(a, *remote),
                        None => fix_unspecified(a, there),
                    })
                    .collect()
            })
            .collect();
        let staged = Staged {
            role: r,
            roles: placement
                .roles
                .iter()
                .map(|p| StagedRole {
                    side: p.side,
                    flows: p.flows.clone(),
                })
                .collect(),
            peers,
        };
        let mut params = params.clone();
        let value =
            serde_json::to_value(&staged).map_err(|e| WorkloadError::Point(e.to_string()))?;
        match params.as_object_mut() {
            Some(map) => {
                map.insert("staged".into(), value);
            }
            None => {
                return Err(WorkloadError::Point(
                    "a workload's parameters are not an object".into(),
                ))
            }
        }
        Ok(params)
    }
}
