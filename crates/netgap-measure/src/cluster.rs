//! The hosts of a workload run: which agents there are, how to reach their
//! control listeners, and which data addresses and links each host has.
//!
//! `netgap testbed up` writes a [`HostsFile`] (its data types live in
//! [`netgap_core::hosts`] and are re-exported here); multi-host commands
//! read it with `--hosts @FILE` (or `--hosts @testbed` for the default
//! testbed), or take a plain list of agent addresses (`--hosts
//! 10.0.0.1,10.0.0.2:7200`) for a real cluster, or the hosts of the
//! cluster's launcher (`--hosts @slurm`, `--hosts @hostfile:FILE`,
//! expanded by [`hostlist`]): a [`HostsArg`], loaded into a [`HostsSource`].

use crate::control::ControlAddr;
use crate::hostlist::{self, AddressError, HostListError};
use netgap_core::files::{self, Cap, ReadError};
use std::net::IpAddr;
use std::path::PathBuf;

pub use netgap_core::hosts::{
    default_hosts_path, state_dir, Forwarding, HostEntry, HostsFile, HostsFileError,
    HostsFileFault, LinkEntry, TestbedPath, DEFAULT_TESTBED, HOSTS_FILE_VERSION,
    TESTBED_STATE_ROOT,
};

/// Why a hosts file or list is unusable.
#[derive(Debug, thiserror::Error)]
pub enum HostsError {
    /// The file could not be read: missing, not a regular file, past
    /// [`Cap::HOSTS`].
    #[error("hosts file: {0}")]
    Read(#[from] ReadError),
    /// `@testbed` named, and no testbed is up.
    #[error("cannot read hosts file {}: no testbed is up (start one with `netgap testbed up`)", path.display())]
    NoTestbed {
        /// The default testbed's hosts file.
        path: PathBuf,
    },
    /// The `--hosts` argument is neither a file reference nor a list of
    /// agents.
    #[error("--hosts {arg}: {detail}")]
    Arg {
        /// As given.
        arg: String,
        /// What is wrong.
        detail: String,
    },
    /// A launcher's port that is not one.
    #[error("--hosts {arg}: {source}")]
    Port {
        /// As given.
        arg: String,
        /// What is wrong with the port.
        source: PortError,
    },
    /// Slurm's node list that does not expand.
    #[error("--hosts {arg}: {source}")]
    NodeList {
        /// As given (`@slurm`).
        arg: String,
        /// What is wrong with the list.
        source: HostListError,
    },
    /// A launcher's node whose agent's address cannot be found.
    #[error("--hosts {arg}: {source}")]
    NodeAddress {
        /// As given (`@slurm`).
        arg: String,
        /// Why the node has no address.
        source: AddressError,
    },
    /// A hostfile that does not parse.
    #[error("hosts file {path}: {source}")]
    Hostfile {
        /// The hostfile.
        path: PathBuf,
        /// Its line that does not parse.
        source: HostListError,
    },
    /// A hostfile's host whose agent's address cannot be found.
    #[error("hosts file {path}: {source}")]
    HostfileAddress {
        /// The hostfile.
        path: PathBuf,
        /// Why the host has no address.
        source: AddressError,
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

impl From<HostsFileError> for HostsError {
    fn from(e: HostsFileError) -> HostsError {
        match e {
            HostsFileError::Read(e) => HostsError::Read(e),
            HostsFileError::Parse { path, detail } => HostsError::Parse { path, detail },
        }
    }
}

/// What `--hosts` names, parsed: a hosts file, a list of agents, or the
/// hosts of a cluster launcher (Slurm's allocation, an MPI hostfile).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostsArg {
    /// `@slurm[:PORT]`: the nodes of the current Slurm allocation
    /// (`SLURM_JOB_NODELIST`), each with an agent on `port`.
    Slurm {
        /// The agents' control port (7100 unless named).
        port: u16,
    },
    /// `@hostfile:FILE[:PORT]`: the hosts of an Open MPI or MPICH hostfile,
    /// each with an agent on `port`.
    Hostfile {
        /// The hostfile.
        path: PathBuf,
        /// The agents' control port (7100 unless named).
        port: u16,
    },
    /// `@testbed` (the default testbed's hosts file) or `@PATH`.
    File {
        /// The hosts file.
        path: PathBuf,
        /// Named as `@testbed`: a missing file means no testbed is up.
        testbed: bool,
    },
    /// `ADDR,ADDR,...`: agents' control addresses (`IP[:PORT]`, port 7100 by
    /// default, or `unix:PATH`); the first serves.
    Addrs(Vec<ControlAddr>),
}

impl std::fmt::Display for HostsArg {
    /// The `--hosts` argument [`HostsArg::parse`] reads back as this one:
    /// `@testbed`, `@slurm[:PORT]`, `@hostfile:FILE:PORT`, `@FILE` (a
    /// relative file named like one of the others gets `./`) or the agents'
    /// addresses.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostsArg::Slurm { port } if *port == DEFAULT_AGENT_PORT => f.write_str("@slurm"),
            HostsArg::Slurm { port } => write!(f, "@slurm:{port}"),
            HostsArg::Hostfile { path, port } => {
                write!(f, "@hostfile:{}:{port}", path.display())
            }
            HostsArg::File { testbed: true, .. } => f.write_str("@testbed"),
            HostsArg::File { path, .. } => {
                let text = path.display().to_string();
                let taken = matches!(text.as_str(), "testbed" | "slurm")
                    || text.starts_with("slurm:")
                    || text.starts_with("hostfile:");
                write!(f, "@{}{text}", if taken { "./" } else { "" })
            }
            HostsArg::Addrs(addrs) => {
                let list: Vec<String> = addrs.iter().map(ToString::to_string).collect();
                f.write_str(&list.join(","))
            }
        }
    }
}

/// The agents' control port when `--hosts` names none.
pub const DEFAULT_AGENT_PORT: u16 = 7100;

/// Why a launcher's port is not one.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PortError {
    /// A number past the ports.
    #[error("port {0} is out of range (1-65535)")]
    OutOfRange(u32),
    /// Not a number.
    #[error("{0:?} is not a port (1-65535)")]
    NotANumber(String),
}

/// A launcher's port as written after its last `:`: 1 to 65535.
fn parse_port(text: &str) -> Result<u16, PortError> {
    match text.parse::<u32>() {
        Ok(p) if (1..=u32::from(u16::MAX)).contains(&p) => Ok(p as u16),
        Ok(p) => Err(PortError::OutOfRange(p)),
        Err(_) => Err(PortError::NotANumber(text.to_string())),
    }
}

impl HostsArg {
    /// Parses a `--hosts` argument: `@testbed` is the hosts file of the
    /// default testbed (`netgap testbed up`, see [`default_hosts_path`]),
    /// `@slurm[:PORT]` the Slurm allocation, `@hostfile:FILE[:PORT]` an MPI
    /// hostfile (a trailing `:DIGITS` is the port), `@PATH` the file at
    /// `PATH`, anything else a comma-separated list of agents. Reads no
    /// file.
    pub fn parse(text: &str) -> Result<HostsArg, HostsError> {
        let bad = |detail: String| HostsError::Arg {
            arg: text.to_string(),
            detail,
        };
        let bad_port = |source: PortError| HostsError::Port {
            arg: text.to_string(),
            source,
        };
        if let Some(rest) = text.strip_prefix('@') {
            if let Some(port) = rest.strip_prefix("slurm:") {
                return Ok(HostsArg::Slurm {
                    port: parse_port(port).map_err(bad_port)?,
                });
            }
            if let Some(file) = rest.strip_prefix("hostfile:") {
                let (path, port) = match file.rsplit_once(':') {
                    Some((path, port))
                        if !port.is_empty() && port.bytes().all(|b| b.is_ascii_digit()) =>
                    {
                        (path, parse_port(port).map_err(bad_port)?)
                    }
                    _ => (file, DEFAULT_AGENT_PORT),
                };
                if path.is_empty() {
                    return Err(bad("want @hostfile:FILE or @hostfile:FILE:PORT".into()));
                }
                return Ok(HostsArg::Hostfile {
                    path: PathBuf::from(path),
                    port,
                });
            }
            return match rest {
                "" => Err(bad(
                    "want @testbed, @slurm[:PORT], @hostfile:FILE[:PORT] or @FILE".into(),
                )),
                "slurm" => Ok(HostsArg::Slurm {
                    port: DEFAULT_AGENT_PORT,
                }),
                "testbed" => Ok(HostsArg::File {
                    path: default_hosts_path(),
                    testbed: true,
                }),
                p => Ok(HostsArg::File {
                    path: PathBuf::from(p),
                    testbed: false,
                }),
            };
        }
        let mut addrs = Vec::new();
        for part in text.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let with_port = if part.parse::<IpAddr>().is_ok() {
                format!("{part}:{DEFAULT_AGENT_PORT}")
            } else {
                part.to_string()
            };
            let addr = ControlAddr::parse(&with_port).ok_or_else(|| {
                bad(format!(
                    "{part:?} is not IP[:PORT] or unix:PATH (or give @FILE)"
                ))
            })?;
            addrs.push(addr);
        }
        if addrs.is_empty() {
            return Err(bad("no host given".into()));
        }
        Ok(HostsArg::Addrs(addrs))
    }

    /// Whether the hosts are a launcher's (`@slurm`, `@hostfile`), whose
    /// agents a run waits for.
    pub fn is_launcher(&self) -> bool {
        matches!(self, HostsArg::Slurm { .. } | HostsArg::Hostfile { .. })
    }

    /// The hosts: reads and checks the file, expands the launcher's list
    /// and resolves its names, or takes the list as it is.
    pub fn load(&self) -> Result<HostsSource, HostsError> {
        match self {
            HostsArg::Addrs(a) => Ok(HostsSource::Addrs(a.clone())),
            HostsArg::Slurm { port } => {
                let arg = |detail: String| HostsError::Arg {
                    arg: "@slurm".into(),
                    detail,
                };
                let list = std::env::var("SLURM_JOB_NODELIST")
                    .or_else(|_| std::env::var("SLURM_NODELIST"))
                    .map_err(|_| {
                        arg("SLURM_JOB_NODELIST is not set (run inside a Slurm allocation: salloc, sbatch)".into())
                    })?;
                let names =
                    hostlist::expand_nodelist(&list).map_err(|source| HostsError::NodeList {
                        arg: "@slurm".into(),
                        source,
                    })?;
                resolve_all(Launcher::Slurm, &names, *port).map_err(|source| {
                    HostsError::NodeAddress {
                        arg: "@slurm".into(),
                        source,
                    }
                })
            }
            HostsArg::Hostfile { path, port } => {
                let text = files::read_to_string(path, Cap::HOSTS)?;
                let names =
                    hostlist::parse_hostfile(&text).map_err(|source| HostsError::Hostfile {
                        path: path.clone(),
                        source,
                    })?;
                resolve_all(Launcher::Hostfile, &names, *port).map_err(|source| {
                    HostsError::HostfileAddress {
                        path: path.clone(),
                        source,
                    }
                })
            }
            HostsArg::File { path, testbed } => match HostsFile::load(path) {
                Err(HostsFileError::Read(e)) if *testbed && e.is_not_found() => {
                    Err(HostsError::NoTestbed { path: path.clone() })
                }
                other => Ok(HostsSource::File(other?)),
            },
        }
    }
}

/// The agents of launcher-named hosts at `port`: each name resolved to the
/// address other nodes reach it at (see [`hostlist::cluster_address`]).
fn resolve_all(
    launcher: Launcher,
    names: &[String],
    port: u16,
) -> Result<HostsSource, AddressError> {
    let mut slurm = hostlist::SlurmNodes::default();
    let nodes = names
        .iter()
        .map(|n| {
            let ip = hostlist::cluster_address(n, &mut slurm)?;
            Ok(ClusterNode {
                name: n.clone(),
                control: std::net::SocketAddr::new(ip, port),
            })
        })
        .collect::<Result<Vec<_>, AddressError>>()?;
    Ok(HostsSource::Nodes {
        launcher,
        nodes,
        wait: None,
    })
}

/// Which launcher named the hosts of a [`HostsSource::Nodes`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Launcher {
    /// `@slurm`.
    Slurm,
    /// `@hostfile`.
    Hostfile,
}

/// One node of a launcher's list, with its agent's control address.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterNode {
    /// The node's name as the launcher gives it.
    pub name: String,
    /// Its agent's control address.
    pub control: std::net::SocketAddr,
}

/// Where the hosts of a run come from.
#[derive(Debug, Clone)]
pub enum HostsSource {
    /// A hosts file (`--hosts @FILE`).
    File(HostsFile),
    /// Agents' control addresses (`--hosts A,B,...`); the first is the server.
    Addrs(Vec<ControlAddr>),
    /// The nodes of a launcher (`@slurm`, `@hostfile`), whose agents may
    /// still be starting: a run waits for them.
    Nodes {
        /// Who named them.
        launcher: Launcher,
        /// The nodes, in the launcher's order; the first is the server.
        nodes: Vec<ClusterNode>,
        /// How long to wait for every agent to answer (`--wait`); `None`:
        /// the run's `--timeout`.
        wait: Option<std::time::Duration>,
    },
    /// In-process agents on loopback: a server on 127.0.0.1 and
    /// `client_hosts` client hosts on 127.0.0.2, 127.0.0.3, ...
    Embedded {
        /// Client hosts.
        client_hosts: u32,
        /// Loopback links of multirail.
        links: u32,
    },
}

impl HostsSource {
    /// Hosts available: the server and the client hosts.
    pub fn hosts(&self) -> u32 {
        match self {
            HostsSource::File(f) => f.hosts.len() as u32,
            HostsSource::Addrs(a) => a.len() as u32,
            HostsSource::Nodes { nodes, .. } => nodes.len() as u32,
            HostsSource::Embedded { client_hosts, .. } => client_hosts + 1,
        }
    }

    /// Client hosts available.
    pub fn client_hosts(&self) -> u32 {
        self.hosts().saturating_sub(1)
    }

    /// How the hosts were given, for the record's options.
    pub fn label(&self) -> String {
        match self {
            HostsSource::File(_) => "hosts-file".into(),
            HostsSource::Addrs(a) => a
                .iter()
                .map(|a| a.to_string())
                .collect::<Vec<_>>()
                .join(","),
            HostsSource::Nodes {
                launcher, nodes, ..
            } => format!(
                "{}:{}",
                match launcher {
                    Launcher::Slurm => "slurm",
                    Launcher::Hostfile => "hostfile",
                },
                nodes
                    .iter()
                    .map(|n| n.name.as_str())
                    .collect::<Vec<_>>()
                    .join(",")
            ),
            HostsSource::Embedded { .. } => "embedded".into(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use netgap_workload::confined::Dir;

    #[test]
    fn a_hosts_argument_reads_back_from_its_text() {
        for text in [
            "@testbed",
            "@slurm",
            "@slurm:7200",
            "@hostfile:/etc/hosts.mpi:7100",
            "@hostfile:hosts:7300",
            "@/run/netgap/study/hosts.json",
            "@./hosts.json",
            "@./slurm",
            "@./hostfile:x",
            "127.0.0.1:7100,[::1]:7101,unix:/tmp/a.sock",
        ] {
            let arg = HostsArg::parse(text).expect("parses");
            assert_eq!(arg.to_string(), text);
            assert_eq!(HostsArg::parse(&arg.to_string()).expect("reads back"), arg);
        }
        // What the default fills in is written out.
        assert_eq!(
            HostsArg::parse("10.0.0.1").expect("parses").to_string(),
            "10.0.0.1:7100"
        );
        assert_eq!(
            HostsArg::parse("@hostfile:h").expect("parses").to_string(),
            "@hostfile:h:7100"
        );
    }

    /// A hosts file of one agent (core's tests hold the file's own checks).
    fn sample() -> HostsFile {
        HostsFile {
            version: HOSTS_FILE_VERSION,
            topology: "switch".into(),
            key_file: None,
            hosts: vec![HostEntry {
                name: "h1".into(),
                control: "127.0.0.1:7100".into(),
                address: "127.0.0.1".parse().expect("ip"),
                netns: None,
                links: vec![],
            }],
            testbed: None,
            conditions: None,
            forwarding: None,
            rate_scaled_from_bps: None,
        }
    }

    #[test]
    fn hosts_arguments_name_a_file_the_testbed_or_agents() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("hosts.json");
        let confined =
            Dir::open_base(dir.path(), "a test directory", "x", 0o700).expect("the directory");
        let text = sample().to_text().expect("json");
        confined
            .replace_file("hosts.json", text.as_bytes(), 0o600)
            .expect("save");
        let arg = HostsArg::parse(&format!("@{}", path.display())).expect("parses");
        assert!(matches!(arg.load(), Ok(HostsSource::File(f)) if f == sample()));
        assert_eq!(
            HostsArg::parse("@testbed").ok(),
            Some(HostsArg::File {
                path: default_hosts_path(),
                testbed: true
            })
        );
        let list = HostsArg::parse("10.0.0.1,unix:/tmp/a.sock").expect("parses");
        assert!(matches!(&list, HostsArg::Addrs(a) if a.len() == 2));
        assert_eq!(list.load().map(|h| h.hosts()).ok(), Some(2));
        assert!(HostsArg::parse("@").is_err());
        assert_eq!(
            HostsArg::parse("@slurm").ok(),
            Some(HostsArg::Slurm { port: 7100 })
        );
        assert_eq!(
            HostsArg::parse("@slurm:7101").ok(),
            Some(HostsArg::Slurm { port: 7101 })
        );
        assert_eq!(
            HostsArg::parse("@hostfile:/a:b/hosts:7200").ok(),
            Some(HostsArg::Hostfile {
                path: "/a:b/hosts".into(),
                port: 7200
            })
        );
        assert_eq!(
            HostsArg::parse("@hostfile:hosts").ok(),
            Some(HostsArg::Hostfile {
                path: "hosts".into(),
                port: 7100
            })
        );
        for (bad, why) in [
            ("@slurm:0", "out of range"),
            ("@slurm:65536", "out of range"),
            ("@slurm:", "not a port"),
            ("@hostfile:h:99999", "out of range"),
            ("@hostfile:", "want @hostfile:FILE"),
            ("@hostfile::7100", "want @hostfile:FILE"),
        ] {
            let e = HostsArg::parse(bad).expect_err(bad).to_string();
            assert!(e.contains(why) && !e.contains('\n'), "{bad}: {e}");
        }
        assert!(HostsArg::parse("10.0.0.1,nowhere").is_err());
        assert!(HostsArg::parse("@/nonexistent/hosts.json")
            .expect("parses")
            .load()
            .is_err_and(|e| e.to_string().contains("/nonexistent/hosts.json")));
    }
}
