//! Where the roles of a workload's point run. A [`Placement`] lists roles
//! in the order the coordinator prepares them (a role that connects comes
//! after the server role it connects to), each on one host, with the
//! global numbers of its flows. The coordinator resolves addresses: where a
//! server listens and which of its announced addresses each flow targets
//! (a mesh's own link per client host included), and which local address
//! each flow leaves from when the transport can choose it.
//!
//! The shapes the built-in workloads share are here: one server and
//! clients spread cyclically over the client hosts (`spread`, with
//! `super::allot`), every stream from one client host (`streams`), one
//! flow per link (`rails`).

use super::allot::clients_of;
use super::Refused;
use netgap_proto::workload::WorkloadRole;
use netgap_transport::{ListenAddr, Transport};
use std::net::IpAddr;

/// What a placement may know of a host of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    /// Host name (from the hosts file, else its control address).
    pub name: String,
    /// Its data address, when known.
    pub address: Option<IpAddr>,
    /// Its links (local, remote) to the first host, for multirail.
    pub rails: Vec<(IpAddr, IpAddr)>,
}

/// One role of a point, on one host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RolePlace {
    /// Index of its host in the run's hosts.
    pub host: usize,
    /// A server listens and announces its data addresses; a client only
    /// connects.
    pub side: WorkloadRole,
    /// The global numbers of its flows, in the order the role numbers
    /// them; a server lists every flow it serves.
    pub flows: Vec<u32>,
    /// Index (into [`Placement::roles`]) of the server role its flows
    /// connect to, if they connect.
    pub connects_to: Option<usize>,
    /// Addresses to listen on, one per flow or one for all; `None` lets
    /// the coordinator choose (the host's address, or every address on a
    /// mesh).
    pub listen_ips: Option<Vec<IpAddr>>,
    /// Local addresses its flows leave from, one per flow or one for all;
    /// `None` lets the coordinator choose (the host's own address when the
    /// transport can bind one).
    pub bind_ips: Option<Vec<IpAddr>>,
}

/// Where every role of a point runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Roles in the order they are prepared; at most one per host.
    pub roles: Vec<RolePlace>,
    /// Flows of the point, numbered `0..flows`.
    pub flows: u32,
    /// The (local, remote) link of each flow when flows are pinned to
    /// links, for the record's per-link results; else empty.
    pub links: Vec<(IpAddr, IpAddr)>,
}

impl Placement {
    /// Checks the invariants the coordinator relies on: at most one role
    /// per host, hosts and flows in range, targets that are earlier server
    /// roles.
    pub fn validate(&self, hosts: usize) -> Result<(), Refused> {
        let mut seen = Vec::new();
        for (i, r) in self.roles.iter().enumerate() {
            if r.host >= hosts {
                return Err(Refused(format!(
                    "role {i} is placed on host {} of {hosts}",
                    r.host
                )));
            }
            if seen.contains(&r.host) {
                return Err(Refused(format!(
                    "two roles on host {}: an agent runs one role per point",
                    r.host
                )));
            }
            seen.push(r.host);
            if r.flows.iter().any(|&f| f >= self.flows) {
                return Err(Refused(format!("role {i} has a flow past {}", self.flows)));
            }
            if let Some(s) = r.connects_to {
                if s >= i || self.roles[s].side != WorkloadRole::Server {
                    return Err(Refused(format!(
                        "role {i} connects to role {s}, which is not a server prepared before it"
                    )));
                }
            }
        }
        Ok(())
    }

    /// The host of every flow: the host of the role that opens it (else
    /// of the role that serves it).
    pub fn flow_hosts(&self) -> Vec<usize> {
        let mut host = vec![0; self.flows as usize];
        for r in self.roles.iter().filter(|r| r.side == WorkloadRole::Server) {
            for &f in &r.flows {
                host[f as usize] = r.host;
            }
        }
        // A client of a staged placement connects to no one server.
        let opens = |r: &&RolePlace| r.connects_to.is_some() || r.side == WorkloadRole::Client;
        for r in self.roles.iter().filter(opens) {
            for &f in &r.flows {
                host[f as usize] = r.host;
            }
        }
        host
    }
}

/// Most roles of a staged placement.
pub(crate) const MAX_STAGED_ROLES: usize = 64;

/// One role of a staged placement, as every role of it learns it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StagedRole {
    /// The side the placement gave it (every staged role listens on the
    /// wire; the side says which part of the workload it plays).
    pub side: WorkloadRole,
    /// Its global flow numbers.
    pub flows: Vec<u32>,
}

/// What a role of a staged placement
/// ([`super::Workload::staged`]) is told besides the point's parameters,
/// under the key `staged`: roles are prepared in placement order, each
/// listening for the roles after it and connecting to the roles before it,
/// so a role may both accept (a pipeline stage from upstream) and connect
/// (downstream), to any number of earlier roles, whatever way the data
/// then moves.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Staged {
    /// This role's index in [`Staged::roles`].
    pub role: usize,
    /// Every role of the placement, in preparation order.
    pub roles: Vec<StagedRole>,
    /// What each earlier role announced (in its transport's address form,
    /// `IP:PORT` for most, reachable from this role's host), in the order
    /// it announced them.
    pub peers: Vec<Vec<String>>,
}

/// A staged placement a peer sent that this role cannot take, one line
/// naming what is wrong.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum StagedError {
    /// No roles, or more than a point may have.
    #[error("{roles} staged roles (want 1 to {MAX_STAGED_ROLES})")]
    RoleCount {
        /// Roles in the placement.
        roles: usize,
    },
    /// This role is not among the roles, or the earlier roles' addresses
    /// are not one list each.
    #[error("role {role} of {roles} with {peers} earlier roles' addresses")]
    NotThisRole {
        /// This role's index.
        role: usize,
        /// Roles in the placement.
        roles: usize,
        /// Address lists sent.
        peers: usize,
    },
    /// A role has more flows than a point may, or a flow past them.
    #[error("a staged role has flows past {limit}")]
    FlowsPast {
        /// A point's most flows.
        limit: u32,
    },
    /// This role's flows are not the point's.
    #[error("this role's flows differ from the point's")]
    FlowsDiffer,
    /// An earlier role sent more addresses than a point has flows.
    #[error("too many addresses of an earlier role")]
    TooManyAddresses,
    /// An address is not one of the transport's.
    #[error("{reason}")]
    Address {
        /// The transport's reason.
        reason: String,
    },
    /// An address is on a host outside the session.
    #[error("{ip} is not a host of this session")]
    NotInSession {
        /// The address's IP.
        ip: IpAddr,
    },
}

impl Staged {
    /// Range-checks what a peer sent: this role among the roles, one
    /// address list per earlier role, flows in range, and every address
    /// one of `transport`'s, on a host of the session (`session_hosts`), so
    /// no role is aimed elsewhere.
    pub fn validate(
        &self,
        flows: u32,
        session_hosts: &[IpAddr],
        transport: &dyn Transport,
    ) -> Result<Vec<Vec<ListenAddr>>, StagedError> {
        if self.roles.is_empty() || self.roles.len() > MAX_STAGED_ROLES {
            return Err(StagedError::RoleCount {
                roles: self.roles.len(),
            });
        }
        if self.role >= self.roles.len() || self.peers.len() != self.role {
            return Err(StagedError::NotThisRole {
                role: self.role,
                roles: self.roles.len(),
                peers: self.peers.len(),
            });
        }
        let limit = netgap_proto::workload::MAX_WORKLOAD_FLOWS;
        for r in &self.roles {
            if r.flows.len() > limit as usize || r.flows.iter().any(|&f| f >= limit) {
                return Err(StagedError::FlowsPast { limit });
            }
        }
        if self.roles[self.role].flows.len() != flows as usize {
            return Err(StagedError::FlowsDiffer);
        }
        let mut out = Vec::with_capacity(self.peers.len());
        for list in &self.peers {
            if list.len() > limit as usize {
                return Err(StagedError::TooManyAddresses);
            }
            let mut addrs = Vec::with_capacity(list.len());
            for a in list {
                let la = transport
                    .parse_listen_addr(a)
                    .map_err(|e| StagedError::Address {
                        reason: e.to_string(),
                    })?;
                if !session_hosts.contains(&la.ip()) {
                    return Err(StagedError::NotInSession { ip: la.ip() });
                }
                addrs.push(la);
            }
            out.push(addrs);
        }
        Ok(out)
    }
}

fn server(flows: u32) -> RolePlace {
    RolePlace {
        host: 0,
        side: WorkloadRole::Server,
        flows: (0..flows).collect(),
        connects_to: None,
        listen_ips: None,
        bind_ips: None,
    }
}

fn client(host: usize, flows: Vec<u32>) -> RolePlace {
    RolePlace {
        host,
        side: WorkloadRole::Client,
        flows,
        connects_to: Some(0),
        listen_ips: None,
        bind_ips: None,
    }
}

/// The first host serves; `clients` flows spread cyclically over the
/// other hosts (client `i` on client host `i % client_hosts`).
pub(crate) fn spread(clients: u32, hosts: &[HostView]) -> Result<Placement, Refused> {
    let client_hosts = hosts.len().saturating_sub(1) as u32;
    if client_hosts == 0 {
        return Err(Refused("no client host: give at least two hosts".into()));
    }
    let mut roles = vec![server(clients)];
    for h in 0..client_hosts {
        let flows = clients_of(clients, client_hosts, h);
        if !flows.is_empty() {
            roles.push(client(h as usize + 1, flows));
        }
    }
    Ok(Placement {
        roles,
        flows: clients,
        links: Vec::new(),
    })
}

/// The first host serves; every one of `streams` flows runs from the
/// second host.
pub(crate) fn streams(streams: u32, hosts: &[HostView]) -> Result<Placement, Refused> {
    if hosts.len() < 2 {
        return Err(Refused("no client host: give at least two hosts".into()));
    }
    Ok(Placement {
        roles: vec![server(streams), client(1, (0..streams).collect())],
        flows: streams,
        links: Vec::new(),
    })
}

/// One flow per link between the second host and the first, each listening
/// on the first host's end and leaving from the second host's end.
pub(crate) fn rails(workload: &str, count: u32, hosts: &[HostView]) -> Result<Placement, Refused> {
    let (Some(server_host), Some(client_host)) = (hosts.first(), hosts.get(1)) else {
        return Err(Refused("no client host: give at least two hosts".into()));
    };
    let mut links = client_host.rails.clone();
    if links.is_empty() {
        return Err(Refused(format!(
            "{workload}: no links between {} and {}; give --hosts @FILE of a mesh testbed, or run without --hosts for loopback links",
            client_host.name, server_host.name
        )));
    }
    if count as usize > links.len() {
        return Err(Refused(format!(
            "{workload}: --links {count}, but {} has {} links to {}",
            client_host.name,
            links.len(),
            server_host.name
        )));
    }
    if count > 0 {
        links.truncate(count as usize);
    }
    let n = links.len() as u32;
    let mut s = server(n);
    s.listen_ips = Some(links.iter().map(|l| l.1).collect());
    let mut c = client(1, (0..n).collect());
    c.bind_ips = Some(links.iter().map(|l| l.0).collect());
    Ok(Placement {
        roles: vec![s, c],
        flows: n,
        links,
    })
}

/// `n` hosts named h0, h1, ... with no address and no rails, for the
/// placement tests of this module and of the workloads.
#[cfg(test)]
pub(crate) fn test_hosts(n: usize) -> Vec<HostView> {
    (0..n)
        .map(|i| HostView {
            name: format!("h{i}"),
            address: None,
            rails: Vec::new(),
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    use super::test_hosts as hosts;

    #[test]
    fn spread_allots_clients_cyclically_and_skips_idle_hosts() {
        let p = spread(4, &hosts(4)).unwrap();
        p.validate(4).unwrap();
        assert_eq!(p.roles[0].flows, vec![0, 1, 2, 3]);
        assert_eq!(p.roles[1].flows, vec![0, 3]);
        assert_eq!(p.flow_hosts(), vec![1, 2, 3, 1]);
        let p = spread(2, &hosts(4)).unwrap();
        assert_eq!(p.roles.len(), 3);
    }

    #[test]
    fn rails_need_links_and_pin_each_flow_to_one() {
        let e = rails("multirail", 0, &hosts(2)).unwrap_err();
        assert!(e.0.contains("no links"), "{e}");
        let mut h = hosts(2);
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        h[1].rails = vec![
            (ip("10.0.1.2"), ip("10.0.1.1")),
            (ip("10.0.2.2"), ip("10.0.2.1")),
        ];
        let p = rails("multirail", 0, &h).unwrap();
        assert_eq!(
            p.roles[0].listen_ips,
            Some(vec![ip("10.0.1.1"), ip("10.0.2.1")])
        );
        assert_eq!(
            p.roles[1].bind_ips,
            Some(vec![ip("10.0.1.2"), ip("10.0.2.2")])
        );
        // A link count takes the first links only, and no more than exist.
        let p = rails("multirail", 1, &h).unwrap();
        assert_eq!((p.flows, p.links.len()), (1, 1));
        assert_eq!(p.roles[1].bind_ips, Some(vec![ip("10.0.1.2")]));
        let e = rails("multirail", 3, &h).unwrap_err();
        assert!(e.0.contains("--links 3, but h1 has 2 links"), "{e}");
    }

    #[test]
    fn staged_addresses_must_be_session_hosts_and_one_list_per_earlier_role() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let role = |flows: Vec<u32>| StagedRole {
            side: WorkloadRole::Server,
            flows,
        };
        let mut s = Staged {
            role: 1,
            roles: vec![role(vec![0]), role(vec![1, 2])],
            peers: vec![vec!["10.0.0.1:5000".into()]],
        };
        let hosts = [ip("10.0.0.1"), ip("10.0.0.2")];
        let tcp = &netgap_transport::tcp::Tcp;
        let peers = s.validate(2, &hosts, tcp).unwrap();
        assert_eq!(peers[0][0].as_str(), "10.0.0.1:5000");
        // Not this role's flow count.
        assert!(s.validate(3, &hosts, tcp).is_err());
        // An address outside the session.
        s.peers[0][0] = "192.0.2.9:5000".into();
        assert!(s
            .validate(2, &hosts, tcp)
            .unwrap_err()
            .to_string()
            .contains("not a host"));
        // Not one address list per earlier role.
        s.peers.clear();
        assert!(s.validate(2, &hosts, tcp).is_err());
        s.role = 7;
        assert!(s.validate(2, &hosts, tcp).is_err());
    }

    #[test]
    fn staged_addresses_are_parsed_by_their_transport() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let role = |flows: Vec<u32>| StagedRole {
            side: WorkloadRole::Server,
            flows,
        };
        let xdp_addr = "10.0.0.1/02:00:00:00:00:01/77";
        let mut s = Staged {
            role: 1,
            roles: vec![role(vec![0]), role(vec![1])],
            peers: vec![vec![xdp_addr.into()]],
        };
        let hosts = [ip("10.0.0.1"), ip("10.0.0.2")];
        let xdp = &netgap_transport::xdp::Xdp;
        let peers = s.validate(1, &hosts, xdp).unwrap();
        assert_eq!(
            (peers[0][0].ip(), peers[0][0].as_str()),
            (hosts[0], xdp_addr)
        );
        // Each transport takes its own form only.
        let e = s
            .validate(1, &hosts, &netgap_transport::tcp::Tcp)
            .unwrap_err();
        assert!(e.to_string().contains("not IP:PORT"), "{e}");
        s.peers[0][0] = "10.0.0.1:5000".into();
        assert!(s.validate(1, &hosts, xdp).is_err());
        // Its IP is still checked against the session's hosts.
        s.peers[0][0] = "192.0.2.9/02:00:00:00:00:01/77".into();
        let e = s.validate(1, &hosts, xdp).unwrap_err();
        assert!(e.to_string().contains("192.0.2.9 is not a host"), "{e}");
    }

    #[test]
    fn bad_placements_are_refused() {
        let mut p = spread(2, &hosts(3)).unwrap();
        p.roles[2].host = 1;
        assert!(p.validate(3).unwrap_err().0.contains("one role per point"));
        let mut p = spread(2, &hosts(3)).unwrap();
        p.roles[1].connects_to = Some(2);
        assert!(p.validate(3).is_err());
    }
}
