//! Host lists as cluster launchers write them: Slurm's compressed node
//! lists (`SLURM_JOB_NODELIST`, such as `node[01-04,07],gpu[1-2]`) and the
//! hostfiles of Open MPI (`host slots=N`) and MPICH (`host:N`). Both expand
//! to host names in order, each once; `--hosts @slurm` and `--hosts
//! @hostfile:FILE` resolve them to the agents' control addresses (see
//! `cluster::HostsArg`). The parsers are plain text in, names out: bad
//! input is refused with one line saying where. The addresses are found
//! here too ([`cluster_address`], [`node_address`]): a node's name
//! resolved, else the `NodeAddr` Slurm knows it by (`scontrol`), else this
//! node's own network, since many nodes resolve their own name to
//! loopback.

use std::net::{IpAddr, SocketAddr, ToSocketAddrs};

/// Most hosts one list may expand to.
pub const MAX_HOSTS: usize = 100_000;
/// Longest host name.
const MAX_NAME_BYTES: usize = 253;

/// Why a host list is unusable.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HostListError {
    /// A Slurm node list that does not parse.
    #[error("node list {list:?}: {detail}")]
    NodeList {
        /// The list as given.
        list: String,
        /// What is wrong.
        detail: String,
    },
    /// A hostfile line that does not parse.
    #[error("line {line}: {detail}")]
    Hostfile {
        /// Its number, from 1.
        line: usize,
        /// What is wrong.
        detail: String,
    },
    /// Nothing in the list.
    #[error("no hosts in it")]
    Empty,
}

/// Why the address of a host or node cannot be found.
#[derive(Debug, thiserror::Error)]
pub enum AddressError {
    /// The name does not resolve.
    #[error("cannot resolve {name}: {source}")]
    Resolve {
        /// The name.
        name: String,
        /// The resolver's error.
        source: std::io::Error,
    },
    /// The name resolves, to no address.
    #[error("{name} has no address")]
    NoAddress {
        /// The name.
        name: String,
    },
    /// A launcher's node, another name of this machine, that resolves to
    /// no address.
    #[error("node {name} has no address")]
    NodeWithoutAddress {
        /// The node's name.
        name: String,
    },
    /// A launcher's node whose name gives no address other nodes reach.
    #[error("node {name}: {source}")]
    Node {
        /// The node's name.
        name: String,
        /// Why its name gives none.
        source: Box<AddressError>,
    },
    /// This very node, whose own address could not be found.
    #[error("node {name} (this node): {source}")]
    ThisNode {
        /// The node's name.
        name: String,
        /// Why this node's address could not be found.
        source: Box<AddressError>,
    },
    /// This host's name could not be read.
    #[error("reading the host name: {0}")]
    HostName(#[source] nix::errno::Errno),
    /// This host's interfaces could not be listed.
    #[error("listing interfaces: {0}")]
    Interfaces(#[source] nix::errno::Errno),
    /// This host's name resolves only to loopback, and it has no other
    /// address.
    #[error("this node's name {name} resolves only to loopback and it has no other address; give --bind ADDRESS")]
    OnlyLoopback {
        /// The host's name.
        name: String,
    },
    /// This host's name resolves only to loopback, there is no default
    /// route, and more than one address could be the node's.
    #[error(
        "this node's name {name} resolves only to loopback, there is no default route, and it has several addresses ({}); give --bind ADDRESS",
        addresses.iter().map(|(i, ip)| format!("{ip} on {i}")).collect::<Vec<_>>().join(", ")
    )]
    Ambiguous {
        /// The host's name.
        name: String,
        /// Each address, with its interface's name.
        addresses: Vec<(String, IpAddr)>,
    },
}

fn node_err(list: &str, detail: impl Into<String>) -> HostListError {
    HostListError::NodeList {
        list: list.to_string(),
        detail: detail.into(),
    }
}

/// Whether `c` may appear in a host name outside brackets.
fn name_char(c: char) -> bool {
    c.is_ascii_alphanumeric() || matches!(c, '-' | '.' | '_')
}

/// Expands a Slurm node list: top-level commas separate entries; each
/// bracket group holds numbers and ranges (`01-04,07`), zero padding taken
/// from the lower bound; several groups in one entry multiply
/// (`a[1-2]b[1-2]`). Host names come out in order, each once.
pub fn expand_nodelist(list: &str) -> Result<Vec<String>, HostListError> {
    let text = list.trim();
    let mut hosts: Vec<String> = Vec::new();
    let mut entries = Vec::new();
    let (mut depth, mut start) = (0u32, 0usize);
    for (i, c) in text.char_indices() {
        match c {
            '[' if depth == 0 => depth = 1,
            '[' => return Err(node_err(list, "nested '['")),
            ']' if depth == 1 => depth = 0,
            ']' => return Err(node_err(list, "']' without '['")),
            ',' if depth == 0 => {
                entries.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(node_err(list, "'[' without ']'"));
    }
    entries.push(&text[start..]);
    for entry in entries {
        let entry = entry.trim();
        if entry.is_empty() {
            return Err(node_err(list, "an empty entry"));
        }
        let mut names = vec![String::new()];
        let mut rest = entry;
        while !rest.is_empty() {
            if let Some(body) = rest.strip_prefix('[') {
                // The scan above matched every bracket.
                let end = body.find(']').unwrap_or(body.len());
                let numbers = expand_ranges(list, &body[..end])?;
                if names.len().saturating_mul(numbers.len()) > MAX_HOSTS {
                    return Err(node_err(list, format!("more than {MAX_HOSTS} hosts")));
                }
                names = names
                    .iter()
                    .flat_map(|n| numbers.iter().map(move |x| format!("{n}{x}")))
                    .collect();
                rest = body.get(end + 1..).unwrap_or("");
            } else {
                let end = rest.find('[').unwrap_or(rest.len());
                let part = &rest[..end];
                if let Some(bad) = part.chars().find(|&c| !name_char(c)) {
                    return Err(node_err(list, format!("{bad:?} in a host name")));
                }
                for n in &mut names {
                    n.push_str(part);
                }
                rest = &rest[end..];
            }
        }
        for n in names {
            if n.len() > MAX_NAME_BYTES {
                return Err(node_err(list, "a host name over 253 bytes"));
            }
            if !hosts.contains(&n) {
                hosts.push(n);
            }
            if hosts.len() > MAX_HOSTS {
                return Err(node_err(list, format!("more than {MAX_HOSTS} hosts")));
            }
        }
    }
    Ok(hosts)
}

/// The numbers of one bracket group, as text with their padding.
fn expand_ranges(list: &str, group: &str) -> Result<Vec<String>, HostListError> {
    let mut out = Vec::new();
    for item in group.split(',') {
        let item = item.trim();
        let (lo, hi) = item.split_once('-').unwrap_or((item, item));
        let digits =
            |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lo) || !digits(hi) {
            return Err(node_err(
                list,
                format!("[{group}]: {item:?} is not a number or a range N-M"),
            ));
        }
        let (a, b): (u64, u64) = (
            lo.parse()
                .map_err(|_| node_err(list, "a number too large"))?,
            hi.parse()
                .map_err(|_| node_err(list, "a number too large"))?,
        );
        if a > b {
            return Err(node_err(
                list,
                format!("[{group}]: range {item} runs backwards"),
            ));
        }
        if b - a >= MAX_HOSTS as u64 || out.len() + (b - a) as usize >= MAX_HOSTS {
            return Err(node_err(list, format!("more than {MAX_HOSTS} hosts")));
        }
        let width = lo.len();
        for n in a..=b {
            out.push(format!("{n:0width$}"));
        }
    }
    Ok(out)
}

/// Host names of an Open MPI or MPICH hostfile, in order, each once:
/// `#` starts a comment, blank lines are skipped, each line names one host
/// followed by Open MPI's `slots=N` / `max_slots=N` or MPICH's `:N`.
pub fn parse_hostfile(text: &str) -> Result<Vec<String>, HostListError> {
    let mut hosts: Vec<String> = Vec::new();
    for (i, raw) in text.lines().enumerate() {
        let line = i + 1;
        let bad = |detail: String| HostListError::Hostfile { line, detail };
        let content = raw.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut words = content.split_whitespace();
        let first = words.next().unwrap_or_default();
        let name = match first.split_once(':') {
            Some((name, count)) => {
                if count.parse::<u32>().map_or(true, |n| n == 0) {
                    return Err(bad(format!(
                        "{first:?}: after ':' MPICH wants a process count"
                    )));
                }
                name
            }
            None => first,
        };
        if name.is_empty() || name.len() > MAX_NAME_BYTES || !name.chars().all(name_char) {
            return Err(bad(format!("{name:?} is not a host name")));
        }
        for w in words {
            let ok = w.split_once('=').is_some_and(|(k, v)| {
                matches!(k, "slots" | "max_slots" | "max-slots") && v.parse::<u32>().is_ok()
            });
            if !ok {
                return Err(bad(format!(
                    "{w:?}: want slots=N or max_slots=N after the host name"
                )));
            }
        }
        if !hosts.iter().any(|h| h == name) {
            hosts.push(name.to_string());
        }
        if hosts.len() > MAX_HOSTS {
            return Err(bad(format!("more than {MAX_HOSTS} hosts")));
        }
    }
    if hosts.is_empty() {
        return Err(HostListError::Empty);
    }
    Ok(hosts)
}

/// The address of host `name` at `port`: the name resolved (an IPv4
/// address first), or the address itself.
pub fn resolve(name: &str, port: u16) -> Result<SocketAddr, AddressError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(SocketAddr::new(ip, port));
    }
    let addrs: Vec<SocketAddr> = (name, port)
        .to_socket_addrs()
        .map_err(|source| AddressError::Resolve {
            name: name.to_string(),
            source,
        })?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| AddressError::NoAddress {
            name: name.to_string(),
        })
}

/// The addresses of Slurm's nodes as its controller knows them (`NodeAddr`
/// of `scontrol -o show node`), asked once and only inside an allocation
/// or a job step, where a controller answers.
#[derive(Debug, Default)]
pub struct SlurmNodes {
    /// `None` until asked; then each node's name and `NodeAddr`.
    known: Option<Vec<(String, String)>>,
}

impl SlurmNodes {
    /// Slurm's `NodeAddr` of node `name`, if Slurm is here and knows it.
    pub fn node_addr(&mut self, name: &str) -> Option<String> {
        let known = self.known.get_or_insert_with(|| {
            let in_slurm = ["SLURM_JOB_ID", "SLURMD_NODENAME", "SLURM_CONF"]
                .iter()
                .any(|v| std::env::var_os(v).is_some());
            if !in_slurm {
                return Vec::new();
            }
            std::process::Command::new("scontrol")
                .args(["-o", "show", "node"])
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .ok()
                .filter(|o| o.status.success())
                .map(|o| parse_scontrol_nodes(&String::from_utf8_lossy(&o.stdout)))
                .unwrap_or_default()
        });
        known
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, a)| a.clone())
    }
}

/// Each node's name and `NodeAddr` from `scontrol -o show node` (one node
/// a line, `KEY=VALUE` words).
pub fn parse_scontrol_nodes(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter_map(|line| {
            let word = |key: &str| {
                line.split_whitespace()
                    .find_map(|w| w.strip_prefix(key))
                    .filter(|v| !v.is_empty() && !v.starts_with('('))
                    .map(str::to_string)
            };
            Some((word("NodeName=")?, word("NodeAddr=")?))
        })
        .collect()
}

/// The addresses `name` resolves to, IPv4 first, without loopback; and
/// the loopback ones apart (for a name of this very machine).
fn resolve_non_loopback(name: &str) -> Result<(Vec<IpAddr>, Vec<IpAddr>), AddressError> {
    let all: Vec<IpAddr> = (name, 0)
        .to_socket_addrs()
        .map_err(|source| AddressError::Resolve {
            name: name.to_string(),
            source,
        })?
        .map(|a| a.ip())
        .collect();
    let (mut out, lo): (Vec<IpAddr>, Vec<IpAddr>) =
        all.into_iter().partition(|ip| !ip.is_loopback());
    out.sort_by_key(|ip| !ip.is_ipv4());
    Ok((out, lo))
}

/// The address other nodes reach node `name` at, for `--hosts @slurm` and
/// `@hostfile`: the address itself; else what its name resolves to, if
/// that is not loopback; else the `NodeAddr` Slurm knows it by; else, for
/// this very node (its own name resolving to loopback, as Debian installs
/// it), the address `netgap serve --bind auto` picks here
/// ([`node_address`]); else, for another name of this machine
/// (`localhost`), loopback.
pub fn cluster_address(name: &str, slurm: &mut SlurmNodes) -> Result<IpAddr, AddressError> {
    if let Ok(ip) = name.parse::<IpAddr>() {
        return Ok(ip);
    }
    let resolved = resolve_non_loopback(name);
    if let Ok((good, _)) = &resolved {
        if let Some(ip) = good.first() {
            return Ok(*ip);
        }
    }
    if let Some(addr) = slurm.node_addr(name) {
        if let Ok(ip) = addr.parse::<IpAddr>() {
            return Ok(ip);
        }
        if let Ok((good, _)) = resolve_non_loopback(&addr) {
            if let Some(ip) = good.first() {
                return Ok(*ip);
            }
        }
    }
    let own = nix::unistd::gethostname()
        .ok()
        .map(|h| h.to_string_lossy().into_owned());
    let short = |n: &str| n.split('.').next().unwrap_or(n).to_string();
    if own.as_deref().map(short) == Some(short(name)) {
        return node_address()
            .map(|a| a.ip)
            .map_err(|e| AddressError::ThisNode {
                name: name.to_string(),
                source: Box::new(e),
            });
    }
    match resolved {
        // Another name of this machine (`localhost`): its agent listens
        // on loopback.
        Ok((_, lo)) => lo
            .iter()
            .find(|ip| ip.is_ipv4())
            .or_else(|| lo.first())
            .copied()
            .ok_or_else(|| AddressError::NodeWithoutAddress {
                name: name.to_string(),
            }),
        Err(e) => Err(AddressError::Node {
            name: name.to_string(),
            source: Box::new(e),
        }),
    }
}

/// The address `netgap serve --bind auto` chose, and how it found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeAddress {
    /// The address.
    pub ip: IpAddr,
    /// How it was found, for the line the agent prints.
    pub how: String,
}

/// This node's own address, for an agent that listens where other nodes
/// reach it (`netgap serve --bind auto` under srun or mpirun), in order:
/// the host name resolved to an address that is not loopback; the
/// `NodeAddr` Slurm knows this node by (`SLURMD_NODENAME`, in a job step);
/// the source address of the default route; the one address of this host
/// that is not loopback. Many installations resolve the host's own name to
/// 127.0.1.1, so the name alone is not enough.
pub fn node_address() -> Result<NodeAddress, AddressError> {
    let name = nix::unistd::gethostname()
        .map_err(AddressError::HostName)?
        .to_string_lossy()
        .into_owned();
    let resolved = resolve_non_loopback(&name);
    if let Ok((good, _)) = &resolved {
        if let Some(ip) = good.first() {
            return Ok(NodeAddress {
                ip: *ip,
                how: format!("the address of this node's name {name}"),
            });
        }
    }
    if let Ok(node) = std::env::var("SLURMD_NODENAME") {
        if let Some(addr) = SlurmNodes::default().node_addr(&node) {
            let ip = addr.parse::<IpAddr>().ok().or_else(|| {
                resolve_non_loopback(&addr)
                    .ok()
                    .and_then(|(g, _)| g.first().copied())
            });
            if let Some(ip) = ip.filter(|ip| !ip.is_loopback()) {
                return Ok(NodeAddress {
                    ip,
                    how: format!("Slurm's NodeAddr of node {node}"),
                });
            }
        }
    }
    if let Some(ip) = default_route_source() {
        return Ok(NodeAddress {
            ip,
            how: "the source address of the default route".into(),
        });
    }
    let own = interface_addresses()?;
    match own.as_slice() {
        [(ifname, ip)] => Ok(NodeAddress {
            ip: *ip,
            how: format!(
                "the one address of this node that is not loopback, on {ifname}: {name} resolves only to loopback and there is no default route"
            ),
        }),
        [] => Err(AddressError::OnlyLoopback { name }),
        many => Err(AddressError::Ambiguous {
            name,
            addresses: many.to_vec(),
        }),
    }
}

/// The local address of the default route: a UDP socket "connected" to a
/// documentation address (RFC 5737) sends nothing but picks its route.
fn default_route_source() -> Option<IpAddr> {
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").ok()?;
    sock.connect("192.0.2.1:9").ok()?;
    let ip = sock.local_addr().ok()?.ip();
    (!ip.is_loopback() && !ip.is_unspecified()).then_some(ip)
}

/// This host's IPv4 addresses that are not loopback, on interfaces that
/// are up, with their interface names.
fn interface_addresses() -> Result<Vec<(String, IpAddr)>, AddressError> {
    use nix::net::if_::InterfaceFlags;
    let addrs = nix::ifaddrs::getifaddrs().map_err(AddressError::Interfaces)?;
    let mut out: Vec<(String, IpAddr)> = Vec::new();
    for a in addrs {
        if !a.flags.contains(InterfaceFlags::IFF_UP)
            || a.flags.contains(InterfaceFlags::IFF_LOOPBACK)
        {
            continue;
        }
        let Some(ip) = a
            .address
            .as_ref()
            .and_then(|s| s.as_sockaddr_in())
            .map(|s| IpAddr::V4(s.ip()))
        else {
            continue;
        };
        if !ip.is_loopback() && !out.iter().any(|(_, o)| *o == ip) {
            out.push((a.interface_name.clone(), ip));
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &str) -> Vec<String> {
        expand_nodelist(list).expect("expands")
    }

    #[test]
    fn slurm_node_lists_expand_ranges_keeping_zero_padding() {
        assert_eq!(names("node01"), ["node01"]);
        assert_eq!(
            names("node[01-04,07]"),
            ["node01", "node02", "node03", "node04", "node07"]
        );
        assert_eq!(names("n[8-11]"), ["n8", "n9", "n10", "n11"]);
        assert_eq!(names("n[098-101]"), ["n098", "n099", "n100", "n101"]);
        assert_eq!(names("a[1-2],b3"), ["a1", "a2", "b3"]);
        assert_eq!(
            names("rack[1-2]-n[1-2]"),
            ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]
        );
        assert_eq!(names("x[1,1],x1,y.lan"), ["x1", "y.lan"]);
        assert_eq!(
            names("gpu[1-2],cpu[003-004]"),
            ["gpu1", "gpu2", "cpu003", "cpu004"]
        );
    }

    #[test]
    fn bad_node_lists_are_refused_in_one_line() {
        for (bad, why) in [
            ("", "empty entry"),
            ("a,,b", "empty entry"),
            ("node[01-04", "without ']'"),
            ("node01-04]", "without '['"),
            ("n[[1]]", "nested"),
            ("n[4-1]", "backwards"),
            ("n[a-b]", "not a number"),
            ("n[1-]", "not a number"),
            ("n[]", "not a number"),
            ("n[0-999999999]", "more than"),
            ("no de", "in a host name"),
        ] {
            let e = expand_nodelist(bad).expect_err(bad).to_string();
            assert!(e.contains(why), "{bad:?}: {e}");
            assert!(!e.contains('\n'), "{e}");
        }
    }

    #[test]
    fn hostfiles_of_open_mpi_and_mpich_give_their_hosts() {
        let text = "# the allocation\n\nnode01 slots=4\nnode02 slots=4 max_slots=8  # two\nnode03:2\nnode04\nnode01 slots=1\n";
        assert_eq!(
            parse_hostfile(text).expect("parses"),
            ["node01", "node02", "node03", "node04"]
        );
        for (bad, line, why) in [
            ("a\nb slots=x\n", 2, "slots=N"),
            ("a:zero\n", 1, "process count"),
            ("a:0\n", 1, "process count"),
            ("a b\n", 1, "slots=N"),
            ("bad/name\n", 1, "not a host name"),
        ] {
            let e = parse_hostfile(bad).expect_err(bad);
            assert!(
                matches!(&e, HostListError::Hostfile { line: l, .. } if *l == line),
                "{bad:?}: {e}"
            );
            assert!(e.to_string().contains(why), "{e}");
        }
        assert_eq!(parse_hostfile("# nothing\n\n"), Err(HostListError::Empty));
    }

    #[test]
    fn addresses_resolve_as_they_are() {
        assert_eq!(
            resolve("127.0.0.1", 7100).ok(),
            Some("127.0.0.1:7100".parse().expect("addr"))
        );
        assert!(resolve("localhost", 7100).is_ok_and(|a| a.ip().is_loopback()));
        let mut slurm = SlurmNodes::default();
        assert_eq!(
            cluster_address("10.1.2.3", &mut slurm).ok(),
            Some("10.1.2.3".parse().expect("ip"))
        );
        let e = resolve("no such host.invalid", 7100).expect_err("does not resolve");
        assert!(
            matches!(&e, AddressError::Resolve { name, .. } if name == "no such host.invalid"),
            "{e}"
        );
        assert!(e
            .to_string()
            .starts_with("cannot resolve no such host.invalid: "));
    }

    #[test]
    fn scontrol_lines_give_each_node_its_address() {
        let text = "NodeName=h1 Arch=x86_64 CoresPerSocket=1 NodeAddr=10.77.0.1 NodeHostName=h1 OS=Linux 6.1 #1 SMP\n\
                    NodeName=gpu02 NodeAddr=gpu02-ib State=IDLE\n\
                    NodeName=odd State=DOWN\n\
                    garbage\n";
        assert_eq!(
            parse_scontrol_nodes(text),
            [
                ("h1".to_string(), "10.77.0.1".to_string()),
                ("gpu02".to_string(), "gpu02-ib".to_string())
            ]
        );
    }
}
