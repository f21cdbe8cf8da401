//! Where the agents of a point-to-point run are: the [`Peer`] of the
//! in-process agent, of `--peer`, or of the first two hosts of `--hosts`,
//! whose agents play both roles.

use super::{invalid, PlanError, Settings, DEFAULT_PORT};
use crate::cluster::HostsSource;
use crate::control::ControlAddr;
use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;

/// Where the agent is.
#[derive(Debug, Clone)]
pub enum Peer {
    /// An agent started in this process on loopback.
    Embedded {
        /// Use ::1 instead of 127.0.0.1.
        ipv6: bool,
    },
    /// A running `netgap serve`.
    Remote {
        /// As typed.
        label: String,
        /// Resolved control address.
        addr: ControlAddr,
    },
    /// The first two hosts of `--hosts` (a hosts file, a testbed's among
    /// them, a launcher's nodes, a list of agents), neither of them this
    /// process: the first host's agent plays the server role and the second
    /// host's the client role, and this process only coordinates them.
    Agents {
        /// The two hosts, server first, from where `--hosts` named them.
        hosts: HostsSource,
    },
}

/// Parses `HOST[:PORT]`, `[V6]:PORT` or a bare IPv6 address.
pub(crate) fn resolve_peer(s: &str) -> Result<SocketAddr, PlanError> {
    let s = s.trim();
    let bad = |detail: String| PlanError::BadPeer {
        peer: s.to_string(),
        detail,
    };
    if s.is_empty() {
        return Err(bad("empty --peer".into()));
    }
    let with_port = if let Ok(ip) = s.parse::<std::net::IpAddr>() {
        SocketAddr::new(ip, DEFAULT_PORT).to_string()
    } else if s.starts_with('[') && s.ends_with(']') {
        format!("{s}:{DEFAULT_PORT}")
    } else if s.contains(':') {
        s.to_string()
    } else {
        format!("{s}:{DEFAULT_PORT}")
    };
    let mut addrs = with_port
        .to_socket_addrs()
        .map_err(|e| bad(e.to_string()))?;
    addrs
        .next()
        .ok_or_else(|| bad("the name resolves to no address".into()))
}

/// Where the two roles of a point-to-point run over `--hosts` go, and the
/// hosts file's key: on the first two hosts' agents, the first serving,
/// whatever the hosts are (a testbed's namespaces too: the testbed starts an
/// agent in each).
pub(super) fn p2p_hosts(hosts: HostsSource) -> Result<(Peer, Option<PathBuf>), PlanError> {
    const TWO: &str =
        "a point-to-point test needs two hosts: the first serves, the second is the client";
    if hosts.hosts() < 2 {
        return Err(invalid("--hosts", hosts.label(), TWO));
    }
    Ok(match hosts {
        HostsSource::File(mut f) => {
            let key = f.key_file.clone();
            f.hosts.truncate(2);
            (
                Peer::Agents {
                    hosts: HostsSource::File(f),
                },
                key,
            )
        }
        HostsSource::Addrs(mut a) => {
            a.truncate(2);
            (
                Peer::Agents {
                    hosts: HostsSource::Addrs(a),
                },
                None,
            )
        }
        HostsSource::Nodes {
            launcher,
            mut nodes,
            wait,
        } => {
            nodes.truncate(2);
            (
                Peer::Agents {
                    hosts: HostsSource::Nodes {
                        launcher,
                        nodes,
                        wait,
                    },
                },
                None,
            )
        }
        HostsSource::Embedded { .. } => (
            Peer::Agents {
                hosts: HostsSource::Embedded {
                    client_hosts: 1,
                    links: 1,
                },
            },
            None,
        ),
    })
}

impl Settings {
    /// With `--hosts`, the agents of a point-to-point run
    /// ([`Peer::Agents`]): the first host's serves, the second host's plays
    /// the client. Every transport must cross hosts, and the hosts file's
    /// key stands in for `--key`.
    pub(super) fn place_point_to_point(&mut self) -> Result<(), PlanError> {
        let Some(source) = self.hosts.clone() else {
            return Ok(());
        };
        let label = source.label();
        let (peer, key_file) = p2p_hosts(source)?;
        if let Some(t) = self
            .stacks
            .transports
            .iter()
            .find(|t| !t.capabilities().cross_host)
        {
            return Err(PlanError::SameHostOnly {
                transport: t.name().to_string(),
                peer: format!("--hosts {label}"),
            });
        }
        if self.key_file.is_none() {
            self.key_file = key_file;
        }
        self.peer = peer;
        Ok(())
    }
}
