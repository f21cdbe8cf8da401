//! The hosts file as data: which hosts a set has, how to reach their
//! agents' control listeners, which data addresses and links each has and,
//! for a testbed, the conditions of its links and what the machine under
//! it forwards.
//!
//! `netgap testbed up` writes a [`HostsFile`]; multi-host commands read it
//! with `--hosts @FILE` (or `--hosts @testbed` for the default testbed).
//! Plain data and its checks; the one I/O is [`HostsFile::load`], through
//! the bounded reader of [`crate::files`]. Resolving `--hosts` (launchers'
//! node lists, agents' addresses) is the measurement crate's.

use crate::files::{self, Cap, ReadError};
use crate::link::LinkConditions;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};

/// Where an agent's control listener is: `HOST:PORT` for TCP or
/// `unix:PATH` for a Unix-domain socket (the testbed's agents listen on
/// those, so a coordinator outside the testbed's network namespaces
/// reaches them through the file system).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlAddr {
    /// A TCP address.
    Tcp(SocketAddr),
    /// A Unix-domain stream socket at this path.
    Unix(PathBuf),
}

impl fmt::Display for ControlAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ControlAddr::Tcp(a) => write!(f, "{a}"),
            ControlAddr::Unix(p) => write!(f, "unix:{}", p.display()),
        }
    }
}

impl ControlAddr {
    /// Parses `unix:PATH` or a literal `IP:PORT` (names are resolved by the
    /// caller, which knows the default port).
    pub fn parse(s: &str) -> Option<ControlAddr> {
        match s.strip_prefix("unix:") {
            Some(path) if !path.is_empty() => Some(ControlAddr::Unix(PathBuf::from(path))),
            Some(_) => None,
            None => s.parse().ok().map(ControlAddr::Tcp),
        }
    }
}

/// Version of the hosts file format this build reads and writes.
pub const HOSTS_FILE_VERSION: u32 = 1;

/// A set of hosts with agents, in order: by convention the first host is the
/// server of a multi-client test and the rest are client hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostsFile {
    /// [`HOSTS_FILE_VERSION`].
    pub version: u32,
    /// `switch`, `mesh`, or `list` for a plain list of agents.
    pub topology: String,
    /// The shared key every agent of the set requires, if any.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// The hosts, at least one.
    pub hosts: Vec<HostEntry>,
    /// The name of the testbed that wrote the file (`netgap testbed up
    /// --name`); absent for a hand-written file and for testbeds made
    /// before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub testbed: Option<String>,
    /// The conditions of every link, for a testbed: MTU, offloads, rate,
    /// delay, loss; `netgap testbed set` keeps them current.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub conditions: Option<LinkConditions>,
    /// What the machine under a testbed forwards through its shapers,
    /// calibrated when the testbed was first shaped; absent without a rate
    /// and for a hand-written file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forwarding: Option<Forwarding>,
    /// The rate a study asked for, in bit/s, while its links run at a
    /// lower one the machine carries (the figure's links summing past
    /// [`Forwarding`]); absent when the links run at the rate asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rate_scaled_from_bps: Option<u64>,
}

/// What the machine under a testbed forwards through its shapers: the
/// payload of kernel TCP streams crossing the testbed's links at once, the
/// shapers in place but set well above what the machine moves, so that
/// only the machine's CPUs bound them. The testbed's hosts, forwarding and
/// shaping all run on those CPUs: links whose rates sum past this cannot
/// all be at their rate at once, whatever stack runs over them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Forwarding {
    /// Payload moved, in Mbit/s (10^6 bit/s), the best of the calibration's
    /// windows.
    pub payload_mbps: u64,
    /// The links' MTU during the calibration, in bytes.
    pub mtu_bytes: u32,
    /// Streams run at once (each direction of a link has its own shaper);
    /// 0 when declared.
    pub streams: u32,
    /// Declared by the operator (`netgap testbed up --forwarding`), not
    /// measured.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub declared: bool,
}

impl Forwarding {
    /// The payload rate in Gbit/s.
    pub fn payload_gbps(&self) -> f64 {
        self.payload_mbps as f64 / 1e3
    }
}

/// One host of the set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HostEntry {
    /// Short unique name (`h1`, or the address for a plain list).
    pub name: String,
    /// The agent's control address: `IP:PORT` or `unix:PATH`.
    pub control: String,
    /// The address other hosts send test traffic to (over the switch, or the
    /// first link of a mesh).
    pub address: IpAddr,
    /// The network namespace the host lives in, for a testbed host.
    #[serde(default)]
    pub netns: Option<String>,
    /// Point-to-point links to other hosts (mesh topology), in link order.
    #[serde(default)]
    pub links: Vec<LinkEntry>,
}

/// One end of a point-to-point link between two hosts.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LinkEntry {
    /// Name of the host at the other end.
    pub peer: String,
    /// Index of the link among the links to `peer`, from 0.
    pub index: u32,
    /// This end's address.
    pub local: IpAddr,
    /// The other end's address.
    pub remote: IpAddr,
    /// This end's interface name inside the host's namespace.
    pub ifname: String,
    /// MTU of the link in bytes.
    pub mtu_bytes: u32,
    /// Rate limit of the link in bit/s, if shaped.
    #[serde(default)]
    pub rate_bps: Option<u64>,
}

/// Why a hosts file is unusable.
#[derive(Debug, thiserror::Error)]
pub enum HostsFileError {
    /// The file could not be read: missing, not a regular file, past
    /// [`Cap::HOSTS`].
    #[error("hosts file: {0}")]
    Read(#[from] ReadError),
    /// The file is not a hosts file of this version.
    #[error("hosts file {path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

/// What breaks an invariant of a [`HostsFile`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostsFileFault {
    /// Another format version.
    #[error("version {found} (this netgap reads version {HOSTS_FILE_VERSION})")]
    Version {
        /// The version the file states.
        found: u32,
    },
    /// An empty host list.
    #[error("no hosts")]
    NoHosts,
    /// Two hosts of one name.
    #[error("host name {name:?} appears twice")]
    DuplicateName {
        /// The name.
        name: String,
    },
    /// A control address that does not parse.
    #[error("host {host}: bad control address {control:?} (want IP:PORT or unix:PATH)")]
    BadControl {
        /// The host.
        host: String,
        /// Its control address as written.
        control: String,
    },
    /// A link to a host the file does not have.
    #[error("host {host}: link to unknown host {peer:?}")]
    UnknownLinkPeer {
        /// The host.
        host: String,
        /// The unknown peer.
        peer: String,
    },
}

impl HostsFile {
    /// Reads and checks a hosts file.
    pub fn load(path: &Path) -> Result<HostsFile, HostsFileError> {
        let text = files::read_to_string(path, Cap::HOSTS)?;
        let parse = |detail: String| HostsFileError::Parse {
            path: path.to_path_buf(),
            detail,
        };
        let file: HostsFile = serde_json::from_str(&text).map_err(|e| parse(e.to_string()))?;
        file.check().map_err(|e| parse(e.to_string()))?;
        Ok(file)
    }

    /// Checks the invariants: the version, at least one host, unique names,
    /// parseable control addresses, links that name known hosts.
    pub fn check(&self) -> Result<(), HostsFileFault> {
        if self.version != HOSTS_FILE_VERSION {
            return Err(HostsFileFault::Version {
                found: self.version,
            });
        }
        if self.hosts.is_empty() {
            return Err(HostsFileFault::NoHosts);
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if self.hosts[..i].iter().any(|o| o.name == h.name) {
                return Err(HostsFileFault::DuplicateName {
                    name: h.name.clone(),
                });
            }
        }
        for h in &self.hosts {
            if ControlAddr::parse(&h.control).is_none() {
                return Err(HostsFileFault::BadControl {
                    host: h.name.clone(),
                    control: h.control.clone(),
                });
            }
            if let Some(l) = h.links.iter().find(|l| self.host(&l.peer).is_none()) {
                return Err(HostsFileFault::UnknownLinkPeer {
                    host: h.name.clone(),
                    peer: l.peer.clone(),
                });
            }
        }
        Ok(())
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Option<&HostEntry> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// The file's text as it is written: pretty JSON and a newline.
    pub fn to_text(&self) -> Result<String, serde_json::Error> {
        Ok(serde_json::to_string_pretty(self)? + "\n")
    }

    /// Whether the file describes one of netgap's namespace testbeds (it
    /// names one, or its hosts live in network namespaces of a switch or
    /// mesh, as files of older testbeds do).
    pub fn is_testbed(&self) -> bool {
        self.testbed.is_some()
            || (matches!(self.topology.as_str(), "switch" | "mesh")
                && self.hosts.iter().all(|h| h.netns.is_some()))
    }

    /// What the file says about the path between its hosts: the testbed's
    /// topology and link conditions, for a testbed; `None` otherwise.
    pub fn path_facts(&self) -> Option<TestbedPath> {
        self.is_testbed().then(|| TestbedPath {
            topology: self.topology.clone(),
            forwarding_mbps: self.forwarding.map(|f| f.payload_mbps),
            rate_scaled_from_bps: self.rate_scaled_from_bps,
            conditions: self.conditions.or_else(|| {
                // A testbed from before conditions were recorded: its links
                // say the MTU and rate.
                let l = self.hosts.iter().flat_map(|h| h.links.first()).next()?;
                Some(LinkConditions {
                    rate_bps: l.rate_bps,
                    ..LinkConditions::plain(l.mtu_bytes)
                })
            }),
        })
    }
}

/// What a testbed's hosts file says about the path between its hosts, for
/// the records' `stack.path`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TestbedPath {
    /// `switch` or `mesh`.
    pub topology: String,
    /// The links' conditions, when the file records them.
    pub conditions: Option<LinkConditions>,
    /// What the machine forwards through the testbed's shapers, in Mbit/s
    /// of payload ([`Forwarding`]), when it was calibrated.
    pub forwarding_mbps: Option<u64>,
    /// The rate asked for, when the links run at a lower one the machine
    /// carries ([`HostsFile::rate_scaled_from_bps`]).
    pub rate_scaled_from_bps: Option<u64>,
}

impl TestbedPath {
    /// Adds the testbed's facts to a path built from the ends' host facts
    /// (see [`LinkConditions::fill_path`]).
    pub fn fill(&self, path: &mut crate::stack::PathIdentity) {
        path.forwarding_mbps = self.forwarding_mbps;
        path.rate_scaled_from_bps = self.rate_scaled_from_bps;
        match &self.conditions {
            Some(c) => c.fill_path(path, &self.topology),
            None => {
                path.kind = Some("testbed".into());
                path.topology = Some(self.topology.clone());
            }
        }
    }
}

/// Name of the default testbed, the one `--hosts @testbed` names.
pub const DEFAULT_TESTBED: &str = "testbed";
/// Where testbeds keep their state (pid files, keys, hosts file), one
/// directory per testbed.
pub const TESTBED_STATE_ROOT: &str = "/run/netgap";

/// The hosts file of the default testbed, which `--hosts @testbed` names.
pub fn default_hosts_path() -> PathBuf {
    state_dir(DEFAULT_TESTBED).join("hosts.json")
}

/// The state directory of testbed `name`.
pub fn state_dir(name: &str) -> PathBuf {
    std::path::Path::new(TESTBED_STATE_ROOT).join(name)
}

impl HostEntry {
    /// The parsed control address; [`HostsFile::check`] guarantees it parses.
    pub fn control_addr(&self) -> Option<ControlAddr> {
        ControlAddr::parse(&self.control)
    }

    /// The links to `peer`, in index order.
    pub fn links_to<'a>(&'a self, peer: &'a str) -> impl Iterator<Item = &'a LinkEntry> + 'a {
        self.links.iter().filter(move |l| l.peer == peer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> HostsFile {
        HostsFile {
            version: HOSTS_FILE_VERSION,
            topology: "mesh".into(),
            key_file: None,
            hosts: vec![
                HostEntry {
                    name: "h1".into(),
                    control: "unix:/tmp/h1.sock".into(),
                    address: "10.0.0.1".parse().expect("ip"),
                    netns: Some("netgap-h1".into()),
                    links: vec![LinkEntry {
                        peer: "h2".into(),
                        index: 0,
                        local: "10.0.0.1".parse().expect("ip"),
                        remote: "10.0.0.2".parse().expect("ip"),
                        ifname: "ng0".into(),
                        mtu_bytes: 1500,
                        rate_bps: Some(1_000_000_000),
                    }],
                },
                HostEntry {
                    name: "h2".into(),
                    control: "127.0.0.1:7100".into(),
                    address: "10.0.0.2".parse().expect("ip"),
                    netns: None,
                    links: vec![],
                },
            ],
            testbed: None,
            conditions: None,
            forwarding: Some(Forwarding {
                payload_mbps: 29_743,
                mtu_bytes: 1500,
                streams: 2,
                declared: false,
            }),
            rate_scaled_from_bps: None,
        }
    }

    #[test]
    fn a_hosts_file_round_trips_and_checks() {
        let f = sample();
        assert_eq!(f.check(), Ok(()));
        let text = serde_json::to_string(&f).expect("json");
        assert_eq!(
            serde_json::from_str::<HostsFile>(&text).ok(),
            Some(f.clone())
        );
        assert_eq!(f.hosts[0].links_to("h2").count(), 1);
    }

    #[test]
    fn bad_hosts_files_are_refused_with_a_reason() {
        let mut f = sample();
        f.hosts[1].name = "h1".into();
        assert!(f.check().is_err_and(|e| e.to_string().contains("twice")));
        let mut f = sample();
        f.hosts[1].control = "nowhere".into();
        assert!(f
            .check()
            .is_err_and(|e| e.to_string().contains("control address")));
        let mut f = sample();
        f.hosts[0].links[0].peer = "h9".into();
        assert!(f
            .check()
            .is_err_and(|e| e.to_string().contains("unknown host")));
        let mut f = sample();
        f.version = 9;
        assert!(f.check().is_err());
    }
}
