//! The hosts of a multi-host run: which agents there are, how to reach their
//! control listeners, and which data addresses and links each host has.
//!
//! `netgap testbed up` writes a [`HostsFile`]; multi-host commands read it
//! with `--hosts @FILE`, or build one from a plain list of agent addresses
//! (`--hosts 10.0.0.1,10.0.0.2:7200`) for a real cluster.

use crate::control::ControlAddr;
use serde::{Deserialize, Serialize};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

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

/// Why a hosts file or list is unusable.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The file could not be read.
    #[error("cannot read hosts file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Underlying error.
        source: std::io::Error,
    },
    /// The file is not a hosts file of this version.
    #[error("hosts file {path}: {detail}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        detail: String,
    },
}

impl HostsFile {
    /// Reads and checks a hosts file.
    pub fn load(path: &Path) -> Result<HostsFile, HostsError> {
        let text = std::fs::read_to_string(path).map_err(|source| HostsError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        let parse = |detail: String| HostsError::Parse {
            path: path.to_path_buf(),
            detail,
        };
        let file: HostsFile = serde_json::from_str(&text).map_err(|e| parse(e.to_string()))?;
        file.check().map_err(parse)?;
        Ok(file)
    }

    /// Checks the invariants: the version, at least one host, unique names,
    /// parseable control addresses, links that name known hosts.
    pub fn check(&self) -> Result<(), String> {
        if self.version != HOSTS_FILE_VERSION {
            return Err(format!(
                "version {} (this netgap reads version {HOSTS_FILE_VERSION})",
                self.version
            ));
        }
        if self.hosts.is_empty() {
            return Err("no hosts".into());
        }
        for (i, h) in self.hosts.iter().enumerate() {
            if self.hosts[..i].iter().any(|o| o.name == h.name) {
                return Err(format!("host name {:?} appears twice", h.name));
            }
        }
        for h in &self.hosts {
            if ControlAddr::parse(&h.control).is_none() {
                return Err(format!(
                    "host {}: bad control address {:?} (want IP:PORT or unix:PATH)",
                    h.name, h.control
                ));
            }
            if let Some(l) = h.links.iter().find(|l| self.host(&l.peer).is_none()) {
                return Err(format!(
                    "host {}: link to unknown host {:?}",
                    h.name, l.peer
                ));
            }
        }
        Ok(())
    }

    /// The host called `name`.
    pub fn host(&self, name: &str) -> Option<&HostEntry> {
        self.hosts.iter().find(|h| h.name == name)
    }

    /// Writes the file (pretty JSON).
    pub fn save(&self, path: &Path) -> std::io::Result<()> {
        let text = serde_json::to_string_pretty(self).map_err(std::io::Error::other)?;
        std::fs::write(path, text + "\n")
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

/// Reads the hosts file a `--hosts` argument names: `@testbed` is the hosts
/// file of the default testbed (`netgap testbed up`, see
/// [`default_hosts_path`]); `@PATH` is the file at `PATH`.
/// Anything else is not a file reference (a plain list of agents is parsed by
/// the caller).
pub fn resolve_hosts_arg(arg: &str) -> Result<HostsFile, HostsError> {
    let path = match arg.strip_prefix('@') {
        Some("testbed") => default_hosts_path(),
        Some(p) if !p.is_empty() => PathBuf::from(p),
        _ => {
            return Err(HostsError::Parse {
                path: PathBuf::from(arg),
                detail: "want @testbed or @FILE".into(),
            })
        }
    };
    match HostsFile::load(&path) {
        Err(HostsError::Read { source, .. })
            if arg == "@testbed" && source.kind() == std::io::ErrorKind::NotFound =>
        {
            Err(HostsError::Read {
                path,
                source: std::io::Error::new(
                    source.kind(),
                    "no testbed is up (start one with `netgap testbed up`)",
                ),
            })
        }
        other => other,
    }
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
    fn hosts_arguments_name_a_file_or_the_testbed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts.json");
        sample().save(&path).expect("save");
        let arg = format!("@{}", path.display());
        assert_eq!(resolve_hosts_arg(&arg).ok(), Some(sample()));
        assert!(resolve_hosts_arg("10.0.0.1,10.0.0.2").is_err());
        assert!(resolve_hosts_arg("@").is_err());
        assert!(resolve_hosts_arg("@/nonexistent/hosts.json")
            .is_err_and(|e| e.to_string().contains("/nonexistent/hosts.json")));
    }

    #[test]
    fn bad_hosts_files_are_refused_with_a_reason() {
        let mut f = sample();
        f.hosts[1].name = "h1".into();
        assert!(f.check().is_err_and(|e| e.contains("twice")));
        let mut f = sample();
        f.hosts[1].control = "nowhere".into();
        assert!(f.check().is_err_and(|e| e.contains("control address")));
        let mut f = sample();
        f.hosts[0].links[0].peer = "h9".into();
        assert!(f.check().is_err_and(|e| e.contains("unknown host")));
        let mut f = sample();
        f.version = 9;
        assert!(f.check().is_err());
    }
}
