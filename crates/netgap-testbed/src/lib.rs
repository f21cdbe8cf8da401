//! The virtual testbed (`netgap testbed up|set|status|down`): a cluster of
//! hosts on this machine, each a Linux network namespace with a netgap
//! agent, wired through a bridge (`switch`) or by point-to-point links
//! (`mesh`).
//!
//! Its place: a layer crate beside the measurement crate, seeing neither
//! it nor the command line. It holds its state in core's plain data
//! (`netgap_core::hosts::HostsFile`, `netgap_core::link::LinkConditions`),
//! takes typed requests ([`UpRequest`], [`SetRequest`], a testbed's name),
//! returns typed results ([`Status`], [`Removed`], and [`UpNote`]s said
//! before `up` changes a testbed that exists) and typed errors
//! ([`TestbedError`]), and prints nothing but the lines of its interrupt
//! handler. Whether an agent answers is asked through [`AgentProbe`],
//! which the binary implements with the coordinator's handshake; the
//! binary hands a run the [`TestbedSwitch`] as measure's `ConditionSwitch`.
//!
//! Everything is made with iproute2 (`ip`, `tc`) run as child processes, and
//! only inside the testbed's own namespaces: each veth pair is created inside
//! a testbed namespace with its peer moved straight into another one, so no
//! interface of the machine's own namespace is ever created or touched.
//!
//! Names: namespaces are `ngtb-h1`, `ngtb-h2`, ..., `ngtb-sw` (the switch;
//! with `--links K` also `ngtb-sw1`, `ngtb-sw2`, ..., a switch per link)
//! and `ngtb-l0`, `ngtb-l1`, ... (a mesh's links) for the default testbed,
//! `ngtb-NAME-h1`, ... for one made with `--name NAME`. State lives in
//! `/run/netgap/NAME/` (`/run/netgap/testbed/` by default): `hosts.json`
//! (the [`HostsFile`] multi-host commands read with `--hosts @testbed`),
//! `params.json`, the shared `key`, the kernel's own state of the links
//! (`kernel-links.json`), and per host the agent's control socket
//! `hN.sock`, its `hN.pid` and `hN.log`. The root and the testbed's
//! directory are opened through [`Dir`] and checked to be root's, mode
//! 0700 when netgap makes them, writable by nobody else and not links;
//! one that is not is refused in one line before anything reads or
//! changes the testbed. Every file is made relative to the directory's
//! descriptor, mode 0600, with an exclusive create that follows no link;
//! the hosts file and `params.json`, which `testbed set` rewrites while
//! runs may read them, are replaced whole ([`Dir::replace_file`]).
//!
//! Conditions: every link end (and bridge port) has the same MTU and offloads
//! (`--offload on|off`: TSO, GSO, GRO, rx and tx checksum, switched with the
//! `SIOCETHTOOL` ioctl from a thread inside each namespace). Rate limit,
//! delay and loss are applied in the network, not in a host's stack, so every
//! stack's frames (AF_XDP's too, which skip the sender's qdiscs) pass the
//! same shaper: on a switch at the bridge's port toward each host (of every
//! switch, when there is one per link), on a mesh in the middle of each link,
//! a namespace of the link's own (`ngtb-lK`) holding a bridge between two
//! veths, one to each host, shaped on the egress toward each host. A delay or
//! loss is a netem qdisc at the root of that port, with the TBF of a rate
//! limit as its child, so a packet is delayed (or dropped) first and then
//! paced at the rate. Where the kernel has no netem, a loss is a random drop
//! of nftables in the shaping namespace (table `bridge netgap`) and a delay
//! is refused; what the kernel can apply is tried first in a scratch
//! namespace (`ngtb-probe`), so a refusal changes nothing. `netgap testbed
//! set` changes them on a running testbed without touching its agents, and
//! rewrites the hosts file and `params.json` to match; a run with
//! `--conditions` switches them through [`TestbedSwitch`]. Every host
//! namespace has `net.ipv4.tcp_no_metrics_save` set, so a TCP connection does
//! not start from what an earlier one (under other conditions) learnt.
//!
//! Addresses: on a switch, host N is 10.77.0.N/24 on `eth0`; with `--links
//! K`, link k (from 0) is a switch of its own (namespace `swk`; the first
//! keeps `sw`) and subnet 10.77.k.0/24, host N being 10.77.k.N on `ethk`, so no switch
//! subnet meets a mesh's 10.80.0.0 and above. A switch with one link has no
//! `links` in its hosts file (its hosts' `address` is the one path); with
//! several, each host lists its K links to every other host as a mesh host
//! does, link k to host M being `ethk` from 10.77.k.N to 10.77.k.M. In a
//! mesh, link K between hosts I < J is its own subnet 10.(80+K).P.0/24, where
//! P counts host pairs from 1; host I is .1 on interface `pJlK`, host J is .2
//! on `pIlK`. On every link after the first, each host's neighbour table
//! holds a permanent entry (the MAC of the other end's interface) for
//! every other host on it: a host's relay (`netgap relay`) opens xdp flows
//! there only to the MAC its neighbour table holds, and while a relay's
//! port is open every frame of its interface, ARP's too, goes to the
//! relay, so the kernel could not resolve them. A rate limit is a TBF
//! qdisc whose bucket is [`shaper_bucket_bytes`] (two GSO packets and
//! their headers, or 840 µs of a faster rate: the smallest that held every
//! rate here without the shaper's timer costing more CPU than the stacks
//! it carries; on a link slower than 1 Gbit/s 1.1 ms of its rate or two
//! frames, so the bucket is not most of a short trial) and whose queue is
//! [`TBF_LATENCY_MS`] long.
//!
//! Multipath TCP: on a mesh or switch with several links per host pair,
//! every host has an MPTCP endpoint (`signal`) for each of its link
//! addresses and path manager limits of one extra subflow per extra link
//! (`mptcp.rs`), so one `mptcp` connection between two hosts uses
//! every link.
//!
//! `down` finds what to remove from the namespaces' names and the state
//! directory, not from memory, so it also cleans up after a crash.
//!
//! One command at a time changes a testbed: `up`, `set`, `down`, a run's
//! [`TestbedSwitch`] and a study's [`OwnedTestbed`] hold its lock
//! (`/run/netgap/NAME.lock`, [`TestbedLock`]) while they do, and a second
//! one is refused in one line naming the holder, before it touches
//! anything. The kernel releases the lock when its holder ends, however it
//! ends.

pub mod capacity;
mod live;
mod lock;
mod mptcp;
mod netns_ops;

pub use lock::{Holder, TestbedLock};

use netgap_core::hosts::{
    ControlAddr, Forwarding, HostEntry, HostsFile, HostsFileError, LinkEntry, HOSTS_FILE_VERSION,
};
pub use netgap_core::link::shaper_bucket_bytes;
use netgap_core::link::{parse_mtu, Condition, ConditionError, LinkConditions, LossMechanism};
use netgap_workload::confined::Dir;
use serde::{Deserialize, Serialize};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

pub use netgap_core::hosts::{
    default_hosts_path, state_dir, DEFAULT_TESTBED as DEFAULT_NAME,
    TESTBED_STATE_ROOT as STATE_ROOT,
};
/// MTU of a testbed's links when `up` names none, in bytes.
pub const DEFAULT_MTU_BYTES: u32 = 1500;
/// Prefix of every testbed namespace.
pub const NETNS_PREFIX: &str = "ngtb-";
/// Most hosts of a switch testbed.
pub const MAX_SWITCH_HOSTS: u32 = 250;
/// Most hosts of a mesh testbed (host pairs must fit in 255 subnets).
pub const MAX_MESH_HOSTS: u32 = 22;
/// Most parallel links per host pair (a mesh's, or a switch's switches).
pub const MAX_LINKS: u32 = 8;
/// Most hosts of a switch testbed with more than one link: each host lists
/// its links to every other in the hosts file, which at this many hosts
/// and [`MAX_LINKS`] stays under the 16 MiB a hosts file may be.
pub const MAX_MULTILINK_SWITCH_HOSTS: u32 = 64;
/// TBF queue length, as the longest a packet may wait, in milliseconds.
pub const TBF_LATENCY_MS: u64 = 50;
/// Smallest netem queue, in packets (netem's own default).
const NETEM_MIN_LIMIT: u64 = 1000;
/// Largest netem queue, in packets.
const NETEM_MAX_LIMIT: u64 = 1_000_000;
/// The rate a netem queue is sized for when no rate limit is set, bit/s:
/// veth moves some tens of Gbit/s.
const NETEM_ASSUMED_RATE_BPS: u64 = 100_000_000_000;
/// How long `up` waits for each agent to answer on its socket.
const AGENT_START_TIMEOUT: Duration = Duration::from_secs(10);

/// Namespace prefix of testbed `name` (`ngtb-` or `ngtb-NAME-`).
fn ns_prefix(name: &str) -> String {
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
fn is_own_netns(name: &str, ns: &str) -> bool {
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

/// The topology of a testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Every host on one bridge, the bridge in a namespace of its own.
    Switch,
    /// A link (or `--links K`) between every pair of hosts.
    Mesh,
}

impl Topology {
    /// Its name, as the hosts file and `--topology` spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            Topology::Switch => "switch",
            Topology::Mesh => "mesh",
        }
    }
}

/// What `up` is asked to build, as typed values; [`UpRequest::params`]
/// validates it into the [`Params`] the testbed is built with.
#[derive(Debug, Clone, PartialEq)]
pub struct UpRequest {
    /// Testbed name, so several can coexist (namespaces `ngtb-NAME-*`,
    /// state in /run/netgap/NAME): 1 to 12 of `a-z0-9`.
    pub name: String,
    /// Number of hosts.
    pub hosts: u32,
    /// How the hosts are wired.
    pub topology: Topology,
    /// Parallel links per host pair, each its own subnet: on a mesh a link
    /// per pair each, on a switch a switch each.
    pub links: u32,
    /// MTU of every link, in bytes.
    pub mtu_bytes: u32,
    /// Rate limit of every link in bit/s, a TBF in the network toward each
    /// host.
    pub rate_bps: Option<u64>,
    /// Segmentation, receive and checksum offloads of every link end and
    /// bridge port all on or all off; `None`: as the kernel sets them.
    pub offload: Option<bool>,
    /// Added one-way delay of every link, in microseconds; 0 is none.
    pub delay_us: Option<u64>,
    /// Added loss of every link, in parts per million; 0 is none.
    pub loss_ppm: Option<u32>,
    /// What this machine forwards through the testbed's shapers, in bit/s
    /// of payload, declared instead of calibrated when the links are first
    /// shaped.
    pub forwarding_bps: Option<u64>,
}

/// What `set` is asked to change on a running testbed: the keys of
/// `change` it sets; the others stay.
#[derive(Debug, Clone, PartialEq)]
pub struct SetRequest {
    /// Testbed name.
    pub name: String,
    /// The conditions to change.
    pub change: Condition,
}

/// Why a probe found an agent not answering: the prober's own error,
/// boxed, so the caller keeps its typed errors.
pub type ProbeFailure = Box<dyn std::error::Error + Send + Sync + 'static>;

/// How the testbed asks whether one of its agents answers: connect to its
/// control address with the testbed's key and shake hands. The handshake
/// is the measurement layer's, which this crate does not see; the binary
/// implements the probe over its coordinator.
pub trait AgentProbe {
    /// Whether the agent at `control` answers, proving `key_file`'s key
    /// when one is given; returns within a few seconds.
    fn probe(&self, control: &ControlAddr, key_file: Option<&Path>) -> Result<(), ProbeFailure>;
}

/// A condition flag's value, or the one-line error naming the flag.
fn flag<T>(flag: &str, r: Result<T, ConditionError>) -> Result<T, TestbedError> {
    r.map_err(|e| TestbedError::Args(e.for_flag(flag)))
}

impl SetRequest {
    /// The change, checked: at least one key, each in its range.
    fn checked(&self) -> Result<Condition, TestbedError> {
        let c = self.change;
        if let Some(m) = c.mtu_bytes {
            flag("--mtu", parse_mtu(&m.to_string()))?;
        }
        c.apply_to(&LinkConditions::plain(DEFAULT_MTU_BYTES))
            .check()
            .map_err(|e| TestbedError::Args(e.to_string()))?;
        if c.is_empty() {
            return Err(TestbedError::Args(
                "testbed set: give at least one of --mtu, --offload, --rate, --delay, --loss"
                    .into(),
            ));
        }
        Ok(c)
    }
}

/// What a testbed was built with; `up` compares it to decide whether an
/// existing testbed can stay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Hosts.
    pub hosts: u32,
    /// Topology.
    pub topology: Topology,
    /// Links per host pair (on a switch, its switches).
    pub links: u32,
    /// MTU in bytes.
    pub mtu_bytes: u32,
    /// Rate limit in bit/s.
    pub rate_bps: Option<u64>,
    /// The agent binary the testbed runs.
    pub agent_exe: PathBuf,
    /// Offloads all on or all off; `None`: as the kernel set them.
    #[serde(default)]
    pub offload: Option<bool>,
    /// Added delay in microseconds.
    #[serde(default)]
    pub delay_us: Option<u64>,
    /// Added loss in parts per million.
    #[serde(default)]
    pub loss_ppm: Option<u32>,
    /// What the machine forwards through the shapers, bit/s of payload,
    /// when declared (`--forwarding`) rather than calibrated.
    #[serde(default)]
    pub forwarding_bps: Option<u64>,
}

impl Params {
    /// The link conditions these parameters set.
    pub fn conditions(&self) -> LinkConditions {
        LinkConditions {
            mtu_bytes: self.mtu_bytes,
            offload: self.offload,
            rate_bps: self.rate_bps,
            delay_us: self.delay_us,
            loss_ppm: self.loss_ppm,
            bucket_bytes: None,
            loss_by: None,
        }
    }

    /// These parameters with `c` as the link conditions.
    fn with_conditions(&self, c: &LinkConditions) -> Params {
        Params {
            mtu_bytes: c.mtu_bytes,
            offload: c.offload,
            rate_bps: c.rate_bps,
            delay_us: c.delay_us,
            loss_ppm: c.loss_ppm,
            ..self.clone()
        }
    }

    /// Whether a testbed built with `other` has the same namespaces, links
    /// and agents (the conditions aside), so it can be kept.
    fn same_build(&self, other: &Params) -> bool {
        self.hosts == other.hosts
            && self.topology == other.topology
            && self.links == other.links
            && self.agent_exe == other.agent_exe
            && self.forwarding_bps == other.forwarding_bps
    }
}

/// Why a testbed command failed. Each is one line.
#[derive(Debug, thiserror::Error)]
pub enum TestbedError {
    /// Not root.
    #[error("the testbed needs root (it creates network namespaces); run it as root")]
    NotRoot,
    /// No network namespaces here.
    #[error("this system has no network namespace support (/proc/self/ns/net is missing)")]
    NoNetns,
    /// Bad flags.
    #[error("{0}")]
    Args(String),
    /// A command failed.
    #[error("`{cmd}` failed: {detail}")]
    Command {
        /// The command line.
        cmd: String,
        /// Its stderr, or why it did not run.
        detail: String,
    },
    /// A file of the state directory.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// Underlying error.
        source: io::Error,
    },
    /// A thread could not enter a testbed namespace.
    #[error(transparent)]
    Netns(#[from] netgap_transport::netns::NetnsError),
    /// The kernel has no netem qdisc, and a delay was asked for.
    #[error("a delay needs the kernel's netem qdisc (sch_netem), which this kernel does not have; nothing was changed")]
    NoNetem,
    /// The kernel has neither netem nor nftables' bridge family, and a
    /// loss was asked for.
    #[error("a loss needs the kernel's netem qdisc or nftables (bridge family); this system has neither ({0}); nothing was changed")]
    NoLoss(String),
    /// Another process holds the testbed ([`TestbedLock`]).
    #[error("testbed {name} is in use by {}; nothing was changed: wait for it to end, or stop it", lock::holder_text(.holder))]
    Busy {
        /// The testbed.
        name: String,
        /// Who holds it, when its record could be read.
        holder: Option<Holder>,
    },
    /// A directory or file of the testbeds' state could not be used safely.
    #[error(transparent)]
    Confined(#[from] netgap_workload::confined::ConfinedError),
    /// No testbed of that name is up.
    #[error("no testbed {0} is up (start one with `netgap testbed up --name {0}`)")]
    NotUp(String),
    /// An agent did not come up.
    #[error("the agent of {host} did not start: {source} (see {log})")]
    Agent {
        /// The host.
        host: String,
        /// What went wrong.
        source: Box<AgentProbeError>,
        /// Its log file.
        log: String,
    },
}

/// Why a testbed agent does not answer.
#[derive(Debug, thiserror::Error)]
pub enum AgentProbeError {
    /// The hosts file's control address does not parse.
    #[error("bad control address {0:?}")]
    BadAddress(String),
    /// The probe failed: the key file is unusable, or connecting or the
    /// handshake failed.
    #[error(transparent)]
    Failed(ProbeFailure),
    /// The agent's process is gone.
    #[error("it exited")]
    Exited,
}

/// Why a testbed that is up cannot be kept as it is.
#[derive(Debug, thiserror::Error)]
pub enum Unhealthy {
    /// Its hosts file is missing or bad.
    #[error(transparent)]
    Hosts(#[from] HostsFileError),
    /// Its namespaces could not be listed.
    #[error(transparent)]
    Listing(#[from] TestbedError),
    /// One of its namespaces is gone.
    #[error("namespace {0} is missing")]
    MissingNamespace(String),
    /// One of its agents does not answer.
    #[error("the agent of {host} does not answer: {source}")]
    Agent {
        /// The host.
        host: String,
        /// Why.
        source: AgentProbeError,
    },
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TestbedError {
    let what = what.into();
    move |source| TestbedError::Io { what, source }
}

/// Checks a testbed name: 1 to 12 of `a-z0-9`.
fn check_name(name: &str) -> Result<(), TestbedError> {
    let ok = !name.is_empty()
        && name.len() <= 12
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if ok {
        Ok(())
    } else {
        Err(TestbedError::Args(format!(
            "--name {name:?}: want 1 to 12 lowercase letters or digits"
        )))
    }
}

impl UpRequest {
    /// Validates the request into [`Params`]; its refusals name the flag
    /// of `netgap testbed up` that sets the value.
    pub fn params(&self) -> Result<Params, TestbedError> {
        check_name(&self.name)?;
        let bad = |m: String| Err(TestbedError::Args(m));
        let max = match self.topology {
            Topology::Switch => MAX_SWITCH_HOSTS,
            Topology::Mesh => MAX_MESH_HOSTS,
        };
        if !(2..=max).contains(&self.hosts) {
            return bad(format!(
                "--hosts {}: a {} testbed has 2 to {max} hosts",
                self.hosts,
                self.topology.as_str()
            ));
        }
        if !(1..=MAX_LINKS).contains(&self.links) {
            return bad(format!("--links {}: want 1 to {MAX_LINKS}", self.links));
        }
        if self.topology == Topology::Switch
            && self.links > 1
            && self.hosts > MAX_MULTILINK_SWITCH_HOSTS
        {
            return bad(format!(
                "--hosts {} --links {}: a switch testbed with more than one link has 2 to {MAX_MULTILINK_SWITCH_HOSTS} hosts",
                self.hosts, self.links
            ));
        }
        let mtu_bytes = flag("--mtu", parse_mtu(&self.mtu_bytes.to_string()))?;
        let delay_us = self.delay_us.filter(|&d| d > 0);
        let loss_ppm = self.loss_ppm.filter(|&l| l > 0);
        let rate_bps = self.rate_bps;
        let forwarding_bps = self.forwarding_bps;
        if let Some(bps) = forwarding_bps {
            let forwarding = LinkConditions {
                rate_bps: Some(bps),
                ..LinkConditions::plain(mtu_bytes)
            };
            forwarding
                .check()
                .map_err(|e| TestbedError::Args(format!("--forwarding: {e}")))?;
        }
        let agent_exe = std::env::current_exe().map_err(io_err("finding netgap's own binary"))?;
        let params = Params {
            hosts: self.hosts,
            topology: self.topology,
            links: self.links,
            mtu_bytes,
            rate_bps,
            agent_exe,
            offload: self.offload,
            delay_us,
            loss_ppm,
            forwarding_bps,
        };
        params
            .conditions()
            .check()
            .map_err(|e| TestbedError::Args(e.to_string()))?;
        Ok(params)
    }
}

/// Checks for root and namespace support.
fn preflight() -> Result<(), TestbedError> {
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
fn run(program: &str, args: &[&str]) -> Result<String, TestbedError> {
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

fn ip(args: &[&str]) -> Result<String, TestbedError> {
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
fn own_netns(name: &str) -> Result<Vec<String>, TestbedError> {
    Ok(list_netns()?
        .into_iter()
        .filter(|ns| is_own_netns(name, ns))
        .collect())
}

/// One planned link end, for the hosts file and the build.
struct LinkPlan {
    /// Its number among all the testbed's links: its namespace is `lID`.
    id: u32,
    a: u32,
    b: u32,
    index: u32,
    a_if: String,
    b_if: String,
    a_ip: Ipv4Addr,
    b_ip: Ipv4Addr,
}

/// The links of a mesh testbed (none on a switch, whose host pairs may
/// outnumber the subnets a mesh numbers them into).
fn mesh_links(p: &Params) -> Vec<LinkPlan> {
    let mut out = Vec::new();
    if p.topology != Topology::Mesh {
        return out;
    }
    let mut pair = 0u8;
    for a in 1..=p.hosts {
        for b in a + 1..=p.hosts {
            pair += 1;
            for k in 0..p.links {
                let net = 80 + k as u8;
                out.push(LinkPlan {
                    id: out.len() as u32,
                    a,
                    b,
                    index: k,
                    a_if: format!("p{b}l{k}"),
                    b_if: format!("p{a}l{k}"),
                    a_ip: Ipv4Addr::new(10, net, pair, 1),
                    b_ip: Ipv4Addr::new(10, net, pair, 2),
                });
            }
        }
    }
    out
}

/// The address of host `host` on switch link `link`: 10.77.link.host.
fn switch_ip(link: u32, host: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, link as u8, host as u8)
}

/// The namespace of switch link `link` of a testbed with namespace prefix
/// `prefix`: `sw` for the first (as before a switch could have more),
/// `swK` for the others.
fn switch_netns(prefix: &str, link: u32) -> String {
    if link == 0 {
        format!("{prefix}sw")
    } else {
        format!("{prefix}sw{link}")
    }
}

/// A host's interface on switch link `link`.
fn switch_if(link: u32) -> String {
    format!("eth{link}")
}

/// The hosts file the testbed `name` with `p` is described by.
fn hosts_file(name: &str, p: &Params) -> HostsFile {
    let dir = state_dir(name);
    let prefix = ns_prefix(name);
    let links = mesh_links(p);
    let hosts = (1..=p.hosts)
        .map(|h| {
            let mut ends: Vec<LinkEntry> = Vec::new();
            // One switch link: the host's address is the one path, and the
            // hosts file stays as it always was.
            if p.topology == Topology::Switch && p.links > 1 {
                for peer in (1..=p.hosts).filter(|&o| o != h) {
                    for k in 0..p.links {
                        ends.push(LinkEntry {
                            peer: format!("h{peer}"),
                            index: k,
                            local: IpAddr::V4(switch_ip(k, h)),
                            remote: IpAddr::V4(switch_ip(k, peer)),
                            ifname: switch_if(k),
                            mtu_bytes: p.mtu_bytes,
                            rate_bps: p.rate_bps,
                        });
                    }
                }
            }
            if p.topology == Topology::Mesh {
                for l in &links {
                    let (peer, ifname, local, remote) = if l.a == h {
                        (l.b, &l.a_if, l.a_ip, l.b_ip)
                    } else if l.b == h {
                        (l.a, &l.b_if, l.b_ip, l.a_ip)
                    } else {
                        continue;
                    };
                    ends.push(LinkEntry {
                        peer: format!("h{peer}"),
                        index: l.index,
                        local: IpAddr::V4(local),
                        remote: IpAddr::V4(remote),
                        ifname: ifname.clone(),
                        mtu_bytes: p.mtu_bytes,
                        rate_bps: p.rate_bps,
                    });
                }
            }
            let address = match p.topology {
                Topology::Switch => IpAddr::V4(switch_ip(0, h)),
                // Every mesh host has at least one link (2 hosts or more).
                Topology::Mesh => ends
                    .first()
                    .map_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED), |l| l.local),
            };
            HostEntry {
                name: format!("h{h}"),
                control: ControlAddr::Unix(dir.join(format!("h{h}.sock"))).to_string(),
                address,
                netns: Some(format!("{prefix}h{h}")),
                links: ends,
            }
        })
        .collect();
    HostsFile {
        version: HOSTS_FILE_VERSION,
        topology: p.topology.as_str().into(),
        key_file: Some(dir.join("key")),
        hosts,
        testbed: Some(name.to_string()),
        conditions: Some(p.conditions()),
        forwarding: None,
        rate_scaled_from_bps: None,
    }
}

/// The netem queue for `c`, in packets: twice what the link holds in
/// flight over the delay, at the rate (or a fast veth's), in MTU-sized
/// packets, so the queue never drops what the delay holds back.
fn netem_limit_packets(c: &LinkConditions) -> u64 {
    let rate = c.rate_bps.unwrap_or(NETEM_ASSUMED_RATE_BPS);
    let in_flight_bytes = u128::from(rate / 8) * u128::from(c.delay_us.unwrap_or(0)) / 1_000_000;
    let packets = in_flight_bytes / u128::from(c.mtu_bytes.max(1));
    u64::try_from(2 * packets)
        .unwrap_or(u64::MAX)
        .clamp(NETEM_MIN_LIMIT, NETEM_MAX_LIMIT)
}

/// Puts shaping point `dev` of namespace `ns` under the qdiscs of `c`: none
/// of netgap's, a TBF, a netem, or a netem with the TBF as its child.
/// `fresh`: the port was just made and has no qdisc of netgap's yet.
fn shape(ns: &str, dev: &str, c: &LinkConditions, fresh: bool) -> Result<(), TestbedError> {
    if !fresh {
        // Going back to veth's default; fails harmlessly when only the
        // default is there.
        let _ = run("tc", &["-n", ns, "qdisc", "del", "dev", dev, "root"]);
    }
    let tbf = |parent: &[&str]| -> Result<(), TestbedError> {
        let Some(rate_bps) = c.rate_bps else {
            return Ok(());
        };
        let rate = format!("{rate_bps}bit");
        let burst = c
            .bucket_bytes
            .unwrap_or_else(|| shaper_bucket_bytes(c.mtu_bytes, rate_bps))
            .to_string();
        let latency = format!("{TBF_LATENCY_MS}ms");
        let mut args = vec!["-n", ns, "qdisc", "add", "dev", dev];
        args.extend_from_slice(parent);
        args.extend_from_slice(&["tbf", "rate", &rate, "burst", &burst, "latency", &latency]);
        run("tc", &args).map(|_| ())
    };
    if !c.needs_netem() {
        return tbf(&["root", "handle", "1:"]);
    }
    let delay = format!("{}us", c.delay_us.unwrap_or(0));
    let limit = netem_limit_packets(c).to_string();
    let mut args = vec![
        "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "netem", "limit", &limit,
        "delay", &delay,
    ];
    let loss = c
        .loss_ppm
        .filter(|_| c.loss_by != Some(LossMechanism::Nftables))
        .map(|l| format!("{}%", f64::from(l) / 10_000.0));
    if let Some(loss) = &loss {
        args.extend_from_slice(&["loss", loss]);
    }
    run("tc", &args).map_err(netem_missing)?;
    tbf(&["parent", "1:1", "handle", "10:"])
}

/// Holds what host port `port` of switch namespace `ns` sends into the
/// switch to `c`'s rate: the port's ingress is redirected to an IFB device
/// of its own (`u` and the port's name) whose TBF is the host's uplink, so
/// a host sending to several others at once is held to its one link, as a
/// NIC is, whatever stack made the frames (AF_XDP's skip the host's own
/// qdiscs, not the switch's ingress). Only the rate: delay and loss stay
/// once on the path, at the port toward the receiving host. Without a rate
/// the redirect and the device go. `fresh`: the port was just made.
fn shape_uplink(ns: &str, port: &str, c: &LinkConditions, fresh: bool) -> Result<(), TestbedError> {
    let ifb = format!("u{port}");
    if !fresh {
        // Both fail harmlessly when the port had no uplink shaper.
        let _ = run("tc", &["-n", ns, "qdisc", "del", "dev", port, "ingress"]);
        let _ = ip(&["-n", ns, "link", "del", "dev", &ifb]);
    }
    if c.rate_bps.is_none() {
        return Ok(());
    }
    ip(&["-n", ns, "link", "add", &ifb, "type", "ifb"])?;
    ip(&[
        "-n",
        ns,
        "link",
        "set",
        "dev",
        &ifb,
        "mtu",
        &c.mtu_bytes.to_string(),
        "up",
    ])?;
    run(
        "tc",
        &[
            "-n", ns, "qdisc", "add", "dev", port, "handle", "ffff:", "ingress",
        ],
    )?;
    run(
        "tc",
        &[
            "-n", ns, "filter", "add", "dev", port, "parent", "ffff:", "protocol", "all", "u32",
            "match", "u32", "0", "0", "action", "mirred", "egress", "redirect", "dev", &ifb,
        ],
    )?;
    let rate_only = LinkConditions {
        delay_us: None,
        loss_ppm: None,
        ..*c
    };
    shape(ns, &ifb, &rate_only, true)
}

/// The nftables table of netgap's own in a shaping namespace, which drops
/// the loss where the kernel has no netem.
const NFT_TABLE: &str = "netgap";

/// Runs `nft` inside namespace `ns` with `args` (nft joins them into one
/// command).
fn nft(ns: &str, args: &[&str]) -> Result<String, TestbedError> {
    let mut all = vec!["netns", "exec", ns, "nft"];
    all.extend_from_slice(args);
    ip(&all)
}

/// Puts the nftables loss of shaping namespace `ns` at `loss_ppm` (none:
/// no table of netgap's): every frame the namespace's bridge forwards is
/// dropped when a random number below a million falls under it, so each
/// direction of a link loses that share once.
fn nft_loss(ns: &str, loss_ppm: Option<u32>, fresh: bool) -> Result<(), TestbedError> {
    if !fresh {
        // Absent when no loss was set; that failure is harmless.
        let _ = nft(ns, &["delete", "table", "bridge", NFT_TABLE]);
    }
    let Some(ppm) = loss_ppm else {
        return Ok(());
    };
    nft(ns, &["add", "table", "bridge", NFT_TABLE])?;
    nft(
        ns,
        &[
            "add", "chain", "bridge", NFT_TABLE, "loss", "{", "type", "filter", "hook", "forward",
            "priority", "0", ";", "}",
        ],
    )?;
    let below = ppm.to_string();
    nft(
        ns,
        &[
            "add", "rule", "bridge", NFT_TABLE, "loss", "numgen", "random", "mod", "1000000", "<",
            &below, "counter", "drop",
        ],
    )
    .map(|_| ())
}

/// Whether shaping namespace `ns` has netgap's nftables loss table.
fn has_nft_loss(ns: &str) -> bool {
    nft(ns, &["list", "table", "bridge", NFT_TABLE]).is_ok()
}

/// A tc failure that means the kernel lacks netem, as [`TestbedError::NoNetem`].
fn netem_missing(e: TestbedError) -> TestbedError {
    match &e {
        TestbedError::Command { detail, .. } if detail.contains("qdisc kind is unknown") => {
            TestbedError::NoNetem
        }
        _ => e,
    }
}

/// What this kernel can apply for a delay and a loss, tried in a scratch
/// namespace of the testbed's (so a crash leaves nothing `down` misses)
/// before anything of the testbed changes.
struct KernelShapers {
    netem: bool,
    /// Why nftables cannot drop frames, if it cannot.
    nft_missing: Option<String>,
}

fn probe_shapers(name: &str) -> Result<KernelShapers, TestbedError> {
    let ns = format!("{}probe", ns_prefix(name));
    // A probe namespace left by a crash.
    let _ = ip(&["netns", "del", &ns]);
    ip(&["netns", "add", &ns])?;
    let netem = run(
        "tc",
        &[
            "-n", &ns, "qdisc", "add", "dev", "lo", "root", "handle", "1:", "netem",
        ],
    )
    .map_err(netem_missing);
    let nft_missing = match nft(&ns, &["add", "table", "bridge", NFT_TABLE]) {
        Ok(_) => None,
        Err(e) => Some(e.to_string()),
    };
    let removed = ip(&["netns", "del", &ns]);
    let netem = match netem {
        Ok(_) => true,
        Err(TestbedError::NoNetem) => false,
        Err(e) => return Err(e),
    };
    removed?;
    Ok(KernelShapers { netem, nft_missing })
}

/// `to` as this kernel applies it: the bucket of the rule and what drops
/// the loss (netem where the kernel has it, else nftables). Refuses, before
/// anything changes, a condition out of range or one this kernel cannot
/// apply (a delay without netem, a loss with neither).
fn resolve(name: &str, to: &LinkConditions) -> Result<LinkConditions, TestbedError> {
    to.check().map_err(|e| TestbedError::Args(e.to_string()))?;
    if to.delay_us.is_none() && to.loss_ppm.is_none() {
        return Ok(to.shaped_by(LossMechanism::Netem));
    }
    let k = probe_shapers(name)?;
    if k.netem {
        return Ok(to.shaped_by(LossMechanism::Netem));
    }
    if to.delay_us.is_some() {
        return Err(TestbedError::NoNetem);
    }
    match k.nft_missing {
        None => Ok(to.shaped_by(LossMechanism::Nftables)),
        Some(why) => Err(TestbedError::NoLoss(why)),
    }
}

/// Every veth end of the testbed, `(namespace, interface)`: each host's
/// end and the shaping point facing it (on a switch its bridge port, of
/// each switch in turn, on a mesh the port of the link's own namespace).
/// MTU and offloads are the same on all of them.
fn link_ends(name: &str, p: &Params) -> Vec<(String, String)> {
    let prefix = ns_prefix(name);
    let mut ends = Vec::new();
    match p.topology {
        Topology::Switch => {
            for k in 0..p.links {
                let sw = switch_netns(&prefix, k);
                for h in 1..=p.hosts {
                    ends.push((format!("{prefix}h{h}"), switch_if(k)));
                    ends.push((sw.clone(), format!("h{h}")));
                }
            }
        }
        Topology::Mesh => {
            for l in mesh_links(p) {
                let mid = format!("{prefix}l{}", l.id);
                ends.push((format!("{prefix}h{}", l.a), l.a_if));
                ends.push((mid.clone(), format!("h{}", l.a)));
                ends.push((format!("{prefix}h{}", l.b), l.b_if));
                ends.push((mid, format!("h{}", l.b)));
            }
        }
    }
    ends
}

/// The shaping points, `(namespace, interface)`: the ports in the network
/// whose egress goes toward a host, where rate, delay and loss are applied.
fn shaping_points(name: &str, p: &Params) -> Vec<(String, String)> {
    let prefix = ns_prefix(name);
    link_ends(name, p)
        .into_iter()
        .filter(|(ns, _)| !is_host_netns(&prefix, ns))
        .collect()
}

/// Whether `ns` is a host's namespace (`PREFIXhN`).
fn is_host_netns(prefix: &str, ns: &str) -> bool {
    ns.strip_prefix(prefix)
        .and_then(|r| r.strip_prefix('h'))
        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// The bridges of the testbed, `(namespace, interface)`: each switch's,
/// or on a mesh the one in each link's namespace.
fn bridges(name: &str, p: &Params) -> Vec<(String, String)> {
    let prefix = ns_prefix(name);
    match p.topology {
        Topology::Switch => (0..p.links)
            .map(|k| (switch_netns(&prefix, k), "br0".into()))
            .collect(),
        Topology::Mesh => mesh_links(p)
            .iter()
            .map(|l| (format!("{prefix}l{}", l.id), "br0".into()))
            .collect(),
    }
}

/// Puts every link of testbed `name` (built with `p`) under `to` (as
/// [`resolve`] gave it); `from` is what they are under now (resolved too),
/// `None` right after they were made (with `to`'s MTU and no qdisc).
/// Changes only what differs.
fn condition_links(
    name: &str,
    p: &Params,
    from: Option<&LinkConditions>,
    to: &LinkConditions,
) -> Result<(), TestbedError> {
    let ends = link_ends(name, p);
    let mtu_changed = from.is_some_and(|f| f.mtu_bytes != to.mtu_bytes);
    if mtu_changed {
        let mtu = to.mtu_bytes.to_string();
        // The ports before the bridges: a bridge takes no MTU above its
        // ports'.
        for (ns, dev) in ends.iter().chain(bridges(name, p).iter()) {
            ip(&["-n", ns, "link", "set", "dev", dev, "mtu", &mtu])?;
        }
    }
    let qdiscs = |c: &LinkConditions| (c.rate_bps, c.bucket_bytes, c.delay_us, c.needs_netem());
    let netem_loss = |c: &LinkConditions| c.loss_ppm.filter(|_| c.needs_netem());
    let nft_ppm = |c: &LinkConditions| {
        c.loss_ppm
            .filter(|_| c.loss_by == Some(LossMechanism::Nftables))
    };
    // A TBF's bucket follows the MTU, so an MTU change reshapes too.
    let reshape = match from {
        None => qdiscs(to) != (None, None, None, false),
        Some(f) => {
            qdiscs(f) != qdiscs(to)
                || netem_loss(f) != netem_loss(to)
                || (mtu_changed && to.rate_bps.is_some())
        }
    };
    let points = shaping_points(name, p);
    if reshape {
        for (ns, dev) in &points {
            shape(ns, dev, to, from.is_none())?;
        }
        if p.topology == Topology::Switch {
            for k in 0..p.links {
                let sw = switch_netns(&ns_prefix(name), k);
                for h in 1..=p.hosts {
                    shape_uplink(&sw, &format!("h{h}"), to, from.is_none())?;
                }
            }
        }
    }
    if from.and_then(nft_ppm) != nft_ppm(to) {
        for (ns, _) in &bridges(name, p) {
            nft_loss(ns, nft_ppm(to), from.is_none())?;
        }
    }
    match to.offload {
        Some(on) if from.is_none_or(|f| f.offload != Some(on)) => {
            // The bridge ports are link ends; the bridge device itself
            // carries no test traffic (it has no address) and takes no
            // receive checksum setting.
            for (ns, devs) in &group_by_ns(&ends) {
                netns_ops::set_offloads(ns, devs, on)?;
            }
        }
        // Back to the kernel's own offloads, feature by feature, as they
        // were when the testbed was built.
        None if from.is_some_and(|f| f.offload.is_some()) => {
            let kernel = live::load_kernel(&state_dir(name)).ok_or_else(|| {
                TestbedError::Args(format!(
                    "testbed {name} recorded no kernel offloads to go back to (built by an older netgap); rebuild it with `netgap testbed up --name {name}`"
                ))
            })?;
            live::restore_offloads(&ends, &kernel)?;
        }
        _ => {}
    }
    Ok(())
}

/// Creates a veth pair `a_if` in `a_ns` and `b_if` in `b_ns`, with `mtu`.
fn veth(a_ns: &str, a_if: &str, b_ns: &str, b_if: &str, mtu: &str) -> Result<(), TestbedError> {
    ip(&[
        "-n", a_ns, "link", "add", a_if, "mtu", mtu, "type", "veth", "peer", "name", b_if, "mtu",
        mtu, "netns", b_ns,
    ])?;
    Ok(())
}

/// Makes a namespace with its loopback up and a bridge `br0` of `mtu`.
fn bridge_netns(ns: &str, mtu: &str) -> Result<(), TestbedError> {
    ip(&["netns", "add", ns])?;
    ip(&["-n", ns, "link", "set", "lo", "up"])?;
    ip(&["-n", ns, "link", "add", "br0", "mtu", mtu, "type", "bridge"])?;
    ip(&["-n", ns, "link", "set", "br0", "up"])?;
    Ok(())
}

/// Builds the namespaces and links of testbed `name`, under the conditions
/// `applied` (as [`resolve`] gave them).
fn build_network(
    name: &str,
    p: &Params,
    hosts: &HostsFile,
    applied: &LinkConditions,
    dir: &Dir,
) -> Result<(), TestbedError> {
    let prefix = ns_prefix(name);
    let mtu = p.mtu_bytes.to_string();
    for h in &hosts.hosts {
        let ns = h.netns.as_deref().unwrap_or_default();
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    for h in &hosts.hosts {
        let ns = h.netns.as_deref().unwrap_or_default();
        // A connection must not start from the window and threshold an
        // earlier one to the same host learnt, perhaps under other
        // conditions.
        netns_ops::set_sysctl(ns, "net/ipv4/tcp_no_metrics_save", "1")?;
        // A client host of a many-flow run holds tens of thousands of
        // connections to one server address, one local port each; the
        // default range (32768-60999) gives 28,232.
        netns_ops::set_sysctl(ns, "net/ipv4/ip_local_port_range", "1024 65535")?;
    }
    match p.topology {
        Topology::Switch => {
            for k in 0..p.links {
                let sw = switch_netns(&prefix, k);
                let dev = switch_if(k);
                bridge_netns(&sw, &mtu)?;
                for (i, h) in hosts.hosts.iter().enumerate() {
                    let ns = h.netns.as_deref().unwrap_or_default();
                    let port = h.name.clone();
                    veth(ns, &dev, &sw, &port, &mtu)?;
                    ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
                    let addr = format!("{}/24", switch_ip(k, i as u32 + 1));
                    ip(&["-n", ns, "addr", "add", &addr, "dev", &dev])?;
                    ip(&["-n", ns, "link", "set", &dev, "up"])?;
                }
            }
            for h in &hosts.hosts {
                mptcp::configure(h, p.links)?;
            }
        }
        Topology::Mesh => {
            for l in mesh_links(p) {
                let a_ns = format!("{prefix}h{}", l.a);
                let b_ns = format!("{prefix}h{}", l.b);
                // The middle of the link: a bridge between a port toward
                // each host, where the link is shaped.
                let mid = format!("{prefix}l{}", l.id);
                bridge_netns(&mid, &mtu)?;
                for (ns, dev, addr, host) in
                    [(&a_ns, &l.a_if, l.a_ip, l.a), (&b_ns, &l.b_if, l.b_ip, l.b)]
                {
                    let port = format!("h{host}");
                    veth(ns, dev, &mid, &port, &mtu)?;
                    ip(&["-n", &mid, "link", "set", &port, "master", "br0", "up"])?;
                    ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
                    ip(&["-n", ns, "link", "set", dev, "up"])?;
                }
            }
            for h in &hosts.hosts {
                mptcp::configure(h, p.links)?;
            }
        }
    }
    set_neighbours(hosts)?;
    // The kernel's own state of the links, before any condition touches
    // it: what "offload as the kernel set it" puts back.
    live::save_kernel(dir, &live::read(&link_ends(name, p))?)?;
    condition_links(name, p, None, applied)
}

/// The interface a host's relay takes for its xdp flows: its end of the
/// links after the first, when that is one interface (every link 1 of a
/// switch with `--links 2` or more, the one link 1 of a two-host mesh);
/// None otherwise (one link: the relay would take the TCP connections'
/// interface; a larger mesh: one interface per peer, no one to choose).
fn relay_interface(h: &HostEntry) -> Option<String> {
    let mut names: Vec<&str> = h
        .links
        .iter()
        .filter(|l| l.index == 1)
        .map(|l| l.ifname.as_str())
        .collect();
    names.sort_unstable();
    names.dedup();
    match names.as_slice() {
        [one] => Some((*one).to_string()),
        _ => None,
    }
}

/// The permanent neighbour entries of the testbed's links after the
/// first, per host namespace, as `ip -batch` lines, given each host's
/// interfaces' MACs (`macs[(host, interface)]`). A relay opens a flow
/// only to the MAC its host's neighbour table holds, and while a relay's
/// xdp port is open its interface's frames (ARP too) go to the relay, so
/// these links are never resolved by the kernel: the testbed states them.
fn neighbour_lines(
    hosts: &HostsFile,
    macs: &std::collections::HashMap<(String, String), String>,
) -> Vec<(String, Vec<String>)> {
    let mut out = Vec::new();
    for h in &hosts.hosts {
        let Some(ns) = &h.netns else { continue };
        let mut lines = Vec::new();
        for l in h.links.iter().filter(|l| l.index >= 1) {
            let peer_if = hosts
                .host(&l.peer)
                .and_then(|p| p.links_to(&h.name).find(|b| b.index == l.index))
                .map(|b| b.ifname.clone());
            let Some(mac) = peer_if.and_then(|i| macs.get(&(l.peer.clone(), i))) else {
                continue;
            };
            lines.push(format!(
                "neigh replace {} lladdr {mac} dev {} nud permanent",
                l.remote, l.ifname
            ));
        }
        if !lines.is_empty() {
            out.push((ns.clone(), lines));
        }
    }
    out
}

/// Writes [`neighbour_lines`] into the hosts' namespaces, reading each
/// host's MACs first.
fn set_neighbours(hosts: &HostsFile) -> Result<(), TestbedError> {
    if hosts
        .hosts
        .iter()
        .all(|h| h.links.iter().all(|l| l.index == 0))
    {
        return Ok(());
    }
    let mut macs = std::collections::HashMap::new();
    for h in &hosts.hosts {
        let Some(ns) = &h.netns else { continue };
        let text = ip(&["-j", "-n", ns, "link", "show"])?;
        let list: Vec<serde_json::Value> =
            serde_json::from_str(&text).map_err(|e| TestbedError::Command {
                cmd: format!("ip -j -n {ns} link show"),
                detail: format!("unreadable output: {e}"),
            })?;
        for dev in list {
            if let (Some(name), Some(mac)) = (dev["ifname"].as_str(), dev["address"].as_str()) {
                macs.insert((h.name.clone(), name.to_string()), mac.to_string());
            }
        }
    }
    for (ns, lines) in neighbour_lines(hosts, &macs) {
        ip_batch(&ns, &lines)?;
    }
    Ok(())
}

/// Runs `ip -n NS -batch -` with `lines` on its standard input.
fn ip_batch(ns: &str, lines: &[String]) -> Result<(), TestbedError> {
    use std::io::Write as _;
    let cmd = format!("ip -n {ns} -batch - ({} lines)", lines.len());
    let fail = |detail: String| TestbedError::Command {
        cmd: cmd.clone(),
        detail,
    };
    let mut child = Command::new("ip")
        .args(["-n", ns, "-batch", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| fail(e.to_string()))?;
    let mut text = lines.join("\n");
    text.push('\n');
    let written = child.stdin.take().map(|mut i| i.write_all(text.as_bytes()));
    let out = child.wait_with_output().map_err(|e| fail(e.to_string()))?;
    if let Some(Err(e)) = written {
        return Err(fail(e.to_string()));
    }
    if !out.status.success() {
        return Err(fail(
            String::from_utf8_lossy(&out.stderr)
                .trim()
                .replace('\n', "; "),
        ));
    }
    Ok(())
}

/// Starts the agent of host `h` in its namespace, detached (own session,
/// output to its log), and records its pid.
fn start_agent(dir: &Dir, p: &Params, h: &HostEntry) -> Result<u32, TestbedError> {
    let log_path = dir.path().join(format!("{}.log", h.name));
    let log = dir.create_file(&format!("{}.log", h.name), STATE_FILE_MODE)?;
    let log2 = log
        .try_clone()
        .map_err(io_err(format!("opening {}", log_path.display())))?;
    let ns = h.netns.as_deref().unwrap_or_default();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", ns])
        .arg(&p.agent_exe)
        .args(["serve", "--bind", &h.control, "--data-bind"])
        .arg(h.address.to_string())
        .arg("--key")
        .arg(dir.path().join(KEY_FILE))
        // The testbed's hosts are this machine's: its agents take the
        // largest workload point there is, so the scale of a run is the
        // run's choice (each agent raises its descriptor limit as needed).
        .args([
            "--max-flows",
            &netgap_proto::workload::MAX_WORKLOAD_FLOWS.to_string(),
        ])
        .arg("--allow-services");
    if let Some(dev) = relay_interface(h) {
        cmd.args(["--relay-interface", &dev]);
    }
    cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
    // The agent gets a UTS namespace of its own named after its host, so the
    // host facts it records (and every report's environment table) tell the
    // testbed's hosts apart.
    let hostname = h.name.clone().into_bytes();
    // SAFETY: setsid, unshare and sethostname are async-signal-safe system
    // calls; `hostname` was allocated before the fork and is only read. They
    // detach the agent from our terminal and process group and give it its
    // own host name; the namespace needs root, which the testbed has.
    unsafe {
        cmd.pre_exec(move || {
            libc::setsid();
            if libc::unshare(libc::CLONE_NEWUTS) != 0
                || libc::sethostname(hostname.as_ptr().cast(), hostname.len()) != 0
            {
                return Err(io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| TestbedError::Command {
        cmd: format!("ip netns exec {ns} netgap serve"),
        detail: e.to_string(),
    })?;
    let pid = child.id();
    // `ip netns exec` replaces itself with the agent: this pid is the agent.
    // The child is not waited for; it outlives `up` and init reaps it.
    drop(child);
    dir.write_file(
        &format!("{}.pid", h.name),
        format!("{pid}\n").as_bytes(),
        STATE_FILE_MODE,
    )?;
    Ok(pid)
}

/// Connects to a testbed agent with the key and shakes hands: whether it
/// answers, or why not.
pub fn probe_agent(
    h: &HostEntry,
    key_file: Option<&Path>,
    probe: &dyn AgentProbe,
) -> Result<(), AgentProbeError> {
    let addr = h
        .control_addr()
        .ok_or_else(|| AgentProbeError::BadAddress(h.control.clone()))?;
    probe
        .probe(&addr, key_file)
        .map_err(AgentProbeError::Failed)
}

fn wait_for_agent(
    h: &HostEntry,
    key_file: &Path,
    pid: u32,
    probe: &dyn AgentProbe,
) -> Result<(), AgentProbeError> {
    let t0 = Instant::now();
    loop {
        if !pid_alive(pid) {
            return Err(AgentProbeError::Exited);
        }
        match probe_agent(h, Some(key_file), probe) {
            Ok(()) => return Ok(()),
            Err(e) if t0.elapsed() > AGENT_START_TIMEOUT => return Err(e),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

fn pid_alive(pid: u32) -> bool {
    let Ok(pid) = i32::try_from(pid) else {
        return false;
    };
    // A zombie still answers kill(0); /proc tells the states apart.
    let state = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let running = state
        .rsplit_once(") ")
        .is_some_and(|(_, rest)| !rest.starts_with('Z'));
    // SAFETY: signal 0 only checks that the process exists.
    running && unsafe { libc::kill(pid, 0) } == 0
}

/// Builds the testbed (`netgap testbed up`), or keeps one that is already up
/// with the same parameters, saying through `notes` what it does to one
/// that exists before it does it; returns the testbed's [`Status`].
pub fn up(
    req: &UpRequest,
    probe: &dyn AgentProbe,
    notes: &mut dyn FnMut(UpNote),
) -> Result<Status, TestbedError> {
    up_as(req, RatePolicy::Refuse, probe, notes)
}

/// What `up` does with a link rate beyond what the machine carries
/// ([`check_carried`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum RatePolicy {
    /// Refuse it in one line, leaving no testbed (or the earlier
    /// conditions) behind: `netgap testbed up`.
    Refuse,
    /// Keep it: a study scales each figure's rate to what the machine
    /// carries ([`scale_rate`]).
    Scale,
}

/// Whether testbed `name`'s rate is one the machine carries.
fn carried(name: &str) -> Result<(), TestbedError> {
    let (params, hosts) = load_state(name)?;
    let c = hosts.conditions.unwrap_or_else(|| params.conditions());
    check_carried(&hosts, &c)
}

fn up_as(
    req: &UpRequest,
    policy: RatePolicy,
    probe: &dyn AgentProbe,
    notes: &mut dyn FnMut(UpNote),
) -> Result<Status, TestbedError> {
    preflight()?;
    let name = &req.name;
    let params = req.params()?;
    // A declared machine refuses its rate before anything is built.
    if let (Some(bps), RatePolicy::Refuse) = (params.forwarding_bps, policy) {
        check_rate(
            &capacity::declared(bps, params.mtu_bytes),
            &params.conditions(),
        )?;
    }
    let _lock = TestbedLock::acquire(name, "netgap testbed up")?;
    check_state(name)?;
    // A condition this kernel cannot apply is refused before an existing
    // testbed is touched.
    resolve(name, &params.conditions())?;
    let dir = state_dir(name);
    let existing: Option<Params> = read_state(&dir.join("params.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let leftovers = own_netns(name)?;
    if let Some(old) = existing {
        let healthy_now = healthy(name, probe).is_ok();
        // The links as the kernel has them, against what the testbed's
        // files say: a testbed is kept only if they agree.
        let drift = if healthy_now {
            let recorded = load_state(name)
                .ok()
                .and_then(|(_, h)| h.conditions)
                .unwrap_or_else(|| old.conditions());
            match live_differences(name, &old, &recorded) {
                Ok(d) => d.into_iter().next(),
                Err(e) => Some(e.to_string()),
            }
        } else {
            None
        };
        if old == params && healthy_now && drift.is_none() {
            notes(UpNote::Kept);
            return status(name, probe);
        }
        // A testbed built before netgap kept the kernel's own offloads
        // cannot get them back: it is rebuilt.
        let offloads_back =
            params.offload.is_none() && old.offload.is_some() && live::load_kernel(&dir).is_none();
        if old.same_build(&params) && healthy_now && !offloads_back && drift.is_none() {
            notes(UpNote::Changing(params.conditions()));
            let before = load_state(name)?.1.conditions;
            set_conditions(name, &params.conditions())?;
            if policy == RatePolicy::Refuse {
                if let Err(e) = carried(name) {
                    if let Some(b) = before {
                        let _ = set_conditions(name, &b);
                    }
                    return Err(e);
                }
            }
            return status(name, probe);
        }
        let why = if let Some(d) = drift {
            format!("its links are not as its hosts file says ({d})")
        } else if offloads_back {
            "its offloads go back to the kernel's defaults".to_string()
        } else if old != params {
            "its parameters differ".to_string()
        } else {
            healthy(name, probe)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        notes(UpNote::Rebuilding(why));
        teardown(name)?;
    } else if !leftovers.is_empty() || dir.exists() {
        notes(UpNote::RemovingRemains {
            namespaces: leftovers.len(),
        });
        teardown(name)?;
    }
    match build(name, &params, probe) {
        Ok(()) if policy == RatePolicy::Refuse => match carried(name) {
            Ok(()) => status(name, probe),
            Err(e) => {
                let _ = teardown(name);
                Err(e)
            }
        },
        Ok(()) => status(name, probe),
        Err(e) => {
            // Leave nothing half-built behind.
            let _ = teardown(name);
            Err(e)
        }
    }
}

fn build(name: &str, p: &Params, probe: &dyn AgentProbe) -> Result<(), TestbedError> {
    let dir = open_state(name)?;
    let key_file = new_key_in(&dir, KEY_FILE).map_err(|e| TestbedError::Io {
        what: "making the testbed's key".into(),
        source: io::Error::other(e.to_string()),
    })?;
    let mut hosts = hosts_file(name, p);
    let applied = resolve(name, &p.conditions())?;
    hosts.conditions = Some(applied);
    build_network(name, p, &hosts, &applied, &dir)?;
    let mut pids = Vec::new();
    for h in &hosts.hosts {
        pids.push(start_agent(&dir, p, h)?);
    }
    for (h, pid) in hosts.hosts.iter().zip(pids) {
        wait_for_agent(h, &key_file, pid, probe).map_err(|source| TestbedError::Agent {
            host: h.name.clone(),
            source: Box::new(source),
            log: dir
                .path()
                .join(format!("{}.log", h.name))
                .display()
                .to_string(),
        })?;
    }
    hosts.forwarding = match p.forwarding_bps {
        Some(bps) => Some(capacity::declared(bps, applied.mtu_bytes)),
        None if applied.rate_bps.is_some() => Some(capacity::calibrate(name, p, &hosts, &applied)?),
        None => None,
    };
    save_params(&dir, p)?;
    // The hosts file last: its presence means the testbed is complete.
    save_hosts(&dir, &hosts)
}

/// Bytes of the key `up` makes for a testbed's agents.
const KEY_BYTES: usize = 32;

/// Writes a new random key of [`KEY_BYTES`] bytes as the file `name` of
/// `dir`, mode 0600, made fresh relative to the directory's descriptor (an
/// existing file or a link of that name is refused, never followed);
/// returns its path.
fn new_key_in(dir: &Dir, name: &str) -> Result<PathBuf, netgap_workload::confined::ConfinedError> {
    let path = dir.path().join(name);
    let io_err = |what| {
        let path = path.clone();
        move |source| netgap_workload::confined::ConfinedError::Io { what, path, source }
    };
    let mut bytes = [0u8; KEY_BYTES];
    netgap_transport::random::fill_random(&mut bytes)
        .map_err(io_err("drawing random bytes for"))?;
    let f = dir.write_file(name, &bytes, STATE_FILE_MODE)?;
    f.sync_all().map_err(io_err("writing"))?;
    Ok(path)
}

/// Whether testbed `name` is complete: hosts file, namespaces, live agents.
fn healthy(name: &str, probe: &dyn AgentProbe) -> Result<(), Unhealthy> {
    let dir = state_dir(name);
    let hosts = HostsFile::load(&dir.join("hosts.json"))?;
    let present = own_netns(name)?;
    for h in &hosts.hosts {
        let ns = h.netns.clone().unwrap_or_default();
        if !present.contains(&ns) {
            return Err(Unhealthy::MissingNamespace(ns));
        }
        probe_agent(h, hosts.key_file.as_deref(), probe).map_err(|source| Unhealthy::Agent {
            host: h.name.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Reads the testbed (`netgap testbed status`): hosts, addresses, links and
/// whether each agent answers.
pub fn status(name: &str, probe: &dyn AgentProbe) -> Result<Status, TestbedError> {
    check_name(name)?;
    let dir = state_dir(name);
    let hosts_path = dir.join("hosts.json");
    if !hosts_path.exists() {
        preflight()?;
        let namespaces = own_netns(name)?;
        return Ok(if namespaces.is_empty() {
            Status::NotUp {
                name: name.to_string(),
            }
        } else {
            Status::Incomplete {
                name: name.to_string(),
                namespaces,
            }
        });
    }
    check_state(name)?;
    let hosts = HostsFile::load(&hosts_path).map_err(|e| TestbedError::Io {
        what: "reading the hosts file".into(),
        source: io::Error::other(e.to_string()),
    })?;
    let params: Option<Params> = read_state(&dir.join("params.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let conditions = hosts
        .conditions
        .or_else(|| params.as_ref().map(Params::conditions));
    let mut shapers = Vec::new();
    let mut live_links = None;
    if let (Some(c), Some(p)) = (conditions, &params) {
        for (ns, ports) in group_by_ns(&shaping_points(name, p)) {
            let Some(dev) = ports.first().cloned() else {
                continue;
            };
            shapers.push(Shaper {
                qdiscs: live::qdisc_lines(&ns, &dev),
                nft_loss: has_nft_loss(&ns),
                netns: ns,
                ports,
            });
        }
        live_links = Some(match live_differences(name, p, &c) {
            Ok(d) if d.is_empty() => LiveLinks::AsRecorded,
            Ok(d) => LiveLinks::Differ(d),
            Err(e) => LiveLinks::NotRead(e),
        });
    }
    let agents = hosts
        .hosts
        .iter()
        .map(|h| {
            let pid = read_state(&dir.join(format!("{}.pid", h.name)))
                .ok()
                .and_then(|t| t.trim().parse::<u32>().ok());
            match (pid, probe_agent(h, hosts.key_file.as_deref(), probe)) {
                (_, Ok(())) => AgentState::Answers { pid },
                (Some(p), Err(e)) if pid_alive(p) => AgentState::Silent { pid: p, why: e },
                (_, Err(_)) => AgentState::Down,
            }
        })
        .collect();
    Ok(Status::Up(Box::new(UpStatus {
        name: name.to_string(),
        hosts_path,
        conditions,
        shapers,
        live_links,
        agents,
        hosts,
    })))
}

/// What `status` found: no testbed, the remains of one, or a testbed up.
#[derive(Debug)]
pub enum Status {
    /// Neither a hosts file nor a namespace of the testbed exists.
    NotUp {
        /// The testbed.
        name: String,
    },
    /// Namespaces without a hosts file: a build or teardown that did not
    /// finish; `down` removes them.
    Incomplete {
        /// The testbed.
        name: String,
        /// Its namespaces that exist.
        namespaces: Vec<String>,
    },
    /// A testbed with a hosts file.
    Up(Box<UpStatus>),
}

/// A testbed that is up, as its files record it and the kernel has it.
#[derive(Debug)]
pub struct UpStatus {
    /// The testbed.
    pub name: String,
    /// Its hosts file, as read.
    pub hosts: HostsFile,
    /// Where the hosts file is.
    pub hosts_path: PathBuf,
    /// The links' conditions, from the hosts file (or, for a testbed from
    /// before they were recorded there, its parameters).
    pub conditions: Option<LinkConditions>,
    /// Each shaping namespace's shapers as the kernel has them; empty
    /// without conditions or parameters.
    pub shapers: Vec<Shaper>,
    /// The live links against the hosts file; `None` without conditions or
    /// parameters.
    pub live_links: Option<LiveLinks>,
    /// Each host's agent, in the hosts file's order.
    pub agents: Vec<AgentState>,
}

/// The shapers of one shaping namespace: its ports toward the hosts and
/// the queueing disciplines of the first (every port has the same).
#[derive(Debug)]
pub struct Shaper {
    /// The namespace.
    pub netns: String,
    /// Its ports toward the hosts.
    pub ports: Vec<String>,
    /// `tc qdisc show` of the first port, a line per qdisc, or why it was
    /// not read.
    pub qdiscs: Result<Vec<String>, TestbedError>,
    /// Whether the namespace has the nftables loss table.
    pub nft_loss: bool,
}

/// The links as the kernel has them, against the hosts file.
#[derive(Debug)]
pub enum LiveLinks {
    /// As the hosts file says.
    AsRecorded,
    /// Where they differ, a line each.
    Differ(Vec<String>),
    /// They could not be read.
    NotRead(TestbedError),
}

/// One host's agent.
#[derive(Debug)]
pub enum AgentState {
    /// It answers the probe; its pid file's pid, when readable.
    Answers {
        /// The agent's pid.
        pid: Option<u32>,
    },
    /// Its process lives but does not answer.
    Silent {
        /// The agent's pid.
        pid: u32,
        /// What the probe met.
        why: AgentProbeError,
    },
    /// Its process is gone.
    Down,
}

/// What `up` does to a testbed that exists, said before it does it.
#[derive(Debug, Clone, PartialEq)]
pub enum UpNote {
    /// It is up with the same parameters, and stays.
    Kept,
    /// It is up, built alike; only its conditions change, to these.
    Changing(LinkConditions),
    /// It is rebuilt, for this reason.
    Rebuilding(String),
    /// What an earlier testbed of the name left is removed first.
    RemovingRemains {
        /// Its namespaces.
        namespaces: usize,
    },
}

/// `ends` grouped by namespace, in their order.
fn group_by_ns(ends: &[(String, String)]) -> Vec<(String, Vec<String>)> {
    let mut by_ns: Vec<(String, Vec<String>)> = Vec::new();
    for (ns, dev) in ends {
        match by_ns.iter_mut().find(|(n, _)| n == ns) {
            Some((_, devs)) => devs.push(dev.clone()),
            None => by_ns.push((ns.clone(), vec![dev.clone()])),
        }
    }
    by_ns
}

/// Where the links of testbed `name` (built with `p`), read from the
/// kernel, differ from `expected`, one line each.
fn live_differences(
    name: &str,
    p: &Params,
    expected: &LinkConditions,
) -> Result<Vec<String>, TestbedError> {
    preflight()?;
    let links = live::read(&link_ends(name, p))?;
    let kernel = live::load_kernel(&state_dir(name));
    let points = shaping_points(name, p);
    let mut out = live::differences(&links, expected, kernel.as_deref(), &points);
    let want_nft = expected.loss_ppm.is_some() && expected.loss_by == Some(LossMechanism::Nftables);
    for (ns, _) in bridges(name, p) {
        if has_nft_loss(&ns) != want_nft {
            out.push(format!(
                "{ns}: nftables loss table {} (hosts file: {})",
                if want_nft { "missing" } else { "present" },
                if want_nft { "loss by nftables" } else { "none" }
            ));
        }
    }
    Ok(out)
}

/// Changes a running testbed's conditions (`netgap testbed set`): only the
/// keys given, on every link end, without restarting its agents; then
/// returns its status.
pub fn set(req: &SetRequest, probe: &dyn AgentProbe) -> Result<Status, TestbedError> {
    check_name(&req.name)?;
    let change = req.checked()?;
    preflight()?;
    let name = &req.name;
    let _lock = TestbedLock::acquire(name, "netgap testbed set")?;
    let (_, hosts) = load_state(name)?;
    let from = hosts
        .conditions
        .ok_or_else(|| TestbedError::Args(format!("testbed {name} records no conditions; rebuild it with `netgap testbed up --name {name}`")))?;
    let to = change.apply_to(&from);
    // Refused before anything changes when the machine is calibrated; else
    // once the first rate calibrated it, going back.
    check_carried(&hosts, &to)?;
    set_conditions(name, &to)?;
    if let Err(e) = carried(name) {
        let _ = set_conditions(name, &from);
        return Err(e);
    }
    status(name, probe)
}

/// A file of the testbed's state directory, read as every file a user
/// names is (a regular file, bounded).
fn read_state(path: &Path) -> Result<String, netgap_core::files::ReadError> {
    netgap_core::files::read_to_string(path, netgap_core::files::Cap::TESTBED_STATE)
}

/// The hosts file in a testbed's state directory.
const HOSTS_FILE: &str = "hosts.json";
/// The testbed's parameters in its state directory.
const PARAMS_FILE: &str = "params.json";
/// The shared key in a testbed's state directory.
const KEY_FILE: &str = "key";
/// The mode of every file the testbed writes in its state directory. The
/// agents that read the key, and every command that reads the rest, run as
/// root: nothing there is for other users to read.
const STATE_FILE_MODE: u32 = 0o600;
/// The mode of the state root and of each testbed's directory.
const STATE_DIR_MODE: u32 = 0o700;
/// How a refusal names the state root.
const STATE_ROOT_WHAT: &str = "the testbeds' state directory";
/// What a refused state directory tells the operator to do.
const STATE_DIR_REMEDY: &str = "remove it; netgap makes it again, root's with mode 0700";

/// The testbeds' state root (`/run/netgap`), made if missing, opened
/// without following a link and checked to be root's and writable by
/// nobody else.
fn state_root() -> Result<Dir, TestbedError> {
    Ok(Dir::open_base(
        Path::new(STATE_ROOT),
        STATE_ROOT_WHAT,
        STATE_DIR_REMEDY,
        STATE_DIR_MODE,
    )?)
}

/// Testbed `name`'s state directory in the checked `root`, made if
/// missing, opened relative to the root's descriptor and checked the same
/// way: every file of the testbed is made relative to this one.
fn state_in(root: &Dir, name: &str) -> Result<Dir, TestbedError> {
    Ok(root.open_base_at(
        name,
        &format!("testbed {name}'s state directory"),
        STATE_DIR_REMEDY,
        STATE_DIR_MODE,
    )?)
}

/// Testbed `name`'s state directory, opened and checked ([`state_in`]).
fn open_state(name: &str) -> Result<Dir, TestbedError> {
    state_in(&state_root()?, name)
}

/// Refuses, in one line and before anything reads or changes it, a state
/// directory of testbed `name` that is not root's own (another user's, one
/// others can write in, a link): its pid files would name the processes
/// `down` stops, its hosts file the agents a run hands the key to. A
/// missing one is no testbed's.
fn check_state(name: &str) -> Result<(), TestbedError> {
    match std::fs::symlink_metadata(state_dir(name)) {
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
        _ => open_state(name).map(drop),
    }
}

/// Writes `p` as the testbed's `params.json`, replacing the old one
/// whole ([`Dir::replace_file`]).
fn save_params(dir: &Dir, p: &Params) -> Result<(), TestbedError> {
    let text = serde_json::to_string_pretty(p).map_err(|e| TestbedError::Io {
        what: format!("writing {PARAMS_FILE}"),
        source: io::Error::other(e),
    })?;
    dir.replace_file(PARAMS_FILE, (text + "\n").as_bytes(), STATE_FILE_MODE)?;
    Ok(())
}

/// Writes `hosts` as the testbed's hosts file, replacing the old one
/// whole ([`Dir::replace_file`]), so a run that reads it while `testbed
/// set` rewrites it sees the old file or the new one, never half of one,
/// and a link planted at the name is replaced, not written through.
fn save_hosts(dir: &Dir, hosts: &HostsFile) -> Result<(), TestbedError> {
    let text = hosts.to_text().map_err(|e| TestbedError::Io {
        what: format!("writing {HOSTS_FILE}"),
        source: io::Error::other(e),
    })?;
    dir.replace_file(HOSTS_FILE, text.as_bytes(), STATE_FILE_MODE)?;
    Ok(())
}

/// The parameters and hosts file of the running testbed `name`.
fn load_state(name: &str) -> Result<(Params, HostsFile), TestbedError> {
    check_state(name)?;
    let dir = state_dir(name);
    let text = match read_state(&dir.join("params.json")) {
        Ok(t) => t,
        Err(e) if e.is_not_found() => return Err(TestbedError::NotUp(name.to_string())),
        Err(e) => return Err(io_err("reading params.json")(io::Error::other(e))),
    };
    let params: Params = serde_json::from_str(&text).map_err(|e| TestbedError::Io {
        what: "reading params.json".into(),
        source: io::Error::other(e),
    })?;
    let hosts = HostsFile::load(&dir.join("hosts.json")).map_err(|e| TestbedError::Io {
        what: "reading the hosts file".into(),
        source: io::Error::other(e.to_string()),
    })?;
    Ok((params, hosts))
}

/// Puts the links of the running testbed `name` under `to` and records it
/// in its hosts file and parameters; returns it as applied (the shaper's
/// bucket, what drops a loss). Its agents keep running.
pub fn set_conditions(name: &str, to: &LinkConditions) -> Result<LinkConditions, TestbedError> {
    let (params, mut hosts) = load_state(name)?;
    let from = hosts.conditions.unwrap_or_else(|| params.conditions());
    let to = &resolve(name, to)?;
    // Unknown while the links change: a failure halfway must not leave the
    // files claiming either state.
    hosts.conditions = None;
    let dir = open_state(name)?;
    save_hosts(&dir, &hosts)?;
    condition_links(name, &params, Some(&from), to)?;
    let params = params.with_conditions(to);
    save_params(&dir, &params)?;
    for h in &mut hosts.hosts {
        for l in &mut h.links {
            l.mtu_bytes = to.mtu_bytes;
            l.rate_bps = to.rate_bps;
        }
    }
    // The first rate calibrates what the machine forwards: a testbed built
    // unshaped had no need to.
    if to.rate_bps.is_some() && hosts.forwarding.is_none() {
        hosts.forwarding = Some(capacity::calibrate(name, &params, &hosts, to)?);
    }
    hosts.conditions = Some(*to);
    save_hosts(&dir, &hosts)?;
    Ok(*to)
}

/// Refuses a link rate beyond what the machine under testbed `hosts`
/// carries through its shapers ([`capacity::carried_rate_bps`] of one
/// link): one line naming the rate it carries. Nothing to refuse without a
/// rate or a calibration.
fn check_carried(hosts: &HostsFile, c: &LinkConditions) -> Result<(), TestbedError> {
    match hosts.forwarding {
        Some(f) => check_rate(&f, c),
        None => Ok(()),
    }
}

/// Refuses `c`'s link rate when one link at it takes more than a machine
/// forwarding `f` carries.
fn check_rate(f: &Forwarding, c: &LinkConditions) -> Result<(), TestbedError> {
    let Some(rate_bps) = c.rate_bps else {
        return Ok(());
    };
    let carried = capacity::carried_rate_bps(f, 1, c.mtu_bytes);
    if rate_bps <= carried {
        return Ok(());
    }
    Err(TestbedError::Args(format!(
        "--rate {}: this machine forwards {:.1} Gbit/s through the testbed's shapers, and one link at that rate would take more than {:.0}% of \
         it: the emulator, not the link, would bound what runs over it; give --rate {} or less",
        capacity::rate_text(rate_bps),
        f.payload_gbps(),
        100.0 * capacity::CARRY_SHARE,
        capacity::rate_text(carried)
    )))
}

/// A figure's link rate scaled to what the machine carries.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Scaled {
    /// The rate asked for, bit/s.
    pub from_bps: u64,
    /// The rate the links run at, bit/s.
    pub to_bps: u64,
    /// What the machine forwards through the shapers, Gbit/s of payload.
    pub forwarding_gbps: f64,
}

/// Puts the links of testbed `name` at `asked_bps`, or, when `shapers`
/// shaped link directions at once at that rate take more than the machine
/// carries ([`capacity::carried_rate_bps`]), at the fastest rate it carries
/// for them, recording the rate asked in the hosts file (and so in every
/// record's path). `None` when the rate asked is carried, or the machine
/// was not calibrated.
pub fn scale_rate(
    name: &str,
    asked_bps: u64,
    shapers: u32,
) -> Result<Option<Scaled>, TestbedError> {
    let (params, hosts) = load_state(name)?;
    let c = hosts.conditions.unwrap_or_else(|| params.conditions());
    let scaled = hosts.forwarding.and_then(|f| {
        let carried = capacity::carried_rate_bps(&f, shapers, c.mtu_bytes);
        (asked_bps > carried && carried > 0).then_some(Scaled {
            from_bps: asked_bps,
            to_bps: carried,
            forwarding_gbps: f.payload_gbps(),
        })
    });
    let rate_bps = scaled.map_or(asked_bps, |s| s.to_bps);
    if c.rate_bps != Some(rate_bps) {
        set_conditions(
            name,
            &LinkConditions {
                rate_bps: Some(rate_bps),
                bucket_bytes: None,
                ..c
            },
        )?;
    }
    let (_, mut hosts) = load_state(name)?;
    let from = scaled.map(|s| s.from_bps);
    if hosts.rate_scaled_from_bps != from {
        hosts.rate_scaled_from_bps = from;
        save_hosts(&open_state(name)?, &hosts)?;
    }
    Ok(scaled)
}

/// What a run found on a testbed's links when it opened its switch: the
/// conditions its hosts file recorded and every link end as the kernel had
/// it. Restoring puts back exactly this.
#[derive(Debug, Clone)]
struct Found {
    name: String,
    conditions: LinkConditions,
    links: Vec<live::EndState>,
}

impl Found {
    /// Puts the links back as found: the recorded conditions (MTU, queueing
    /// disciplines, the hosts file), then each end's offloads feature by
    /// feature where they still differ.
    fn put_back(&self) -> Result<(), TestbedError> {
        set_conditions(&self.name, &self.conditions)?;
        live::restore_snapshot(&self.links)
    }
}

/// The testbed links a run has changed and not yet put back, for the
/// interrupt handler; every switch and restore holds this lock, so an
/// interrupt waits for a switch under way before it puts the links back.
static HELD: std::sync::Mutex<Option<Found>> = std::sync::Mutex::new(None);

/// The write end of the pipe the interrupt handler wakes its thread
/// through; -1 until [`restore_on_interrupt`] installs it.
static WAKE_FD: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(-1);

extern "C" fn on_interrupt(_signal: libc::c_int) {
    let fd = WAKE_FD.load(std::sync::atomic::Ordering::Relaxed);
    if fd >= 0 {
        let byte = 1u8;
        // SAFETY: write is async-signal-safe; `byte` lives for the call and
        // `fd` is the pipe's write end, open for the life of the process.
        unsafe {
            libc::write(fd, std::ptr::from_ref(&byte).cast(), 1);
        }
    }
}

/// Makes Ctrl-C (SIGINT), SIGTERM and SIGHUP put back the links a run has
/// changed before the process exits (status 130). Installed once, when the
/// first switch opens; until a run holds links, an interrupt only exits.
fn restore_on_interrupt() -> Result<(), TestbedError> {
    static ONCE: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    ONCE.get_or_init(|| {
        let (read, write) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC)
            .map_err(|e| format!("making the interrupt pipe: {e}"))?;
        std::thread::Builder::new()
            .name("interrupt".into())
            .spawn(move || {
                let mut file = std::fs::File::from(read);
                let mut byte = [0u8; 1];
                let _ = io::Read::read(&mut file, &mut byte);
                let held = HELD
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(found) = held.as_ref() {
                    eprintln!(
                        "netgap: interrupted: putting testbed {}'s links back as they were",
                        found.name
                    );
                    if let Err(e) = found.put_back() {
                        eprintln!("netgap: error: the links could not be put back: {e}");
                    }
                }
                let owned = OWNED
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                if let Some(name) = owned.as_ref() {
                    eprintln!("netgap: interrupted: taking testbed {name} down");
                    if let Err(e) = teardown(name) {
                        eprintln!("netgap: error: testbed {name} could not be taken down: {e}");
                    }
                }
                std::process::exit(130);
            })
            .map_err(|e| format!("starting the interrupt thread: {e}"))?;
        WAKE_FD.store(
            std::os::fd::IntoRawFd::into_raw_fd(write),
            std::sync::atomic::Ordering::Relaxed,
        );
        let action = nix::sys::signal::SigAction::new(
            nix::sys::signal::SigHandler::Handler(on_interrupt),
            nix::sys::signal::SaFlags::SA_RESTART,
            nix::sys::signal::SigSet::empty(),
        );
        for sig in [
            nix::sys::signal::Signal::SIGINT,
            nix::sys::signal::Signal::SIGTERM,
            nix::sys::signal::Signal::SIGHUP,
        ] {
            // SAFETY: the handler only loads an atomic and calls write(2),
            // both async-signal-safe.
            unsafe { nix::sys::signal::sigaction(sig, &action) }
                .map_err(|e| format!("handling {sig}: {e}"))?;
        }
        Ok(())
    })
    .clone()
    .map_err(TestbedError::Args)
}

/// The switch of a running testbed's conditions: what a run with
/// `--conditions` switches the links with, through [`set_conditions`]
/// (the binary hands it to the measurement crate as its
/// `ConditionSwitch`). It reads the links' live state when opened, and its
/// restore (and an interrupt while it holds the links) puts back exactly
/// that.
pub struct TestbedSwitch {
    found: Found,
    /// The testbed's lock, held while the run may switch its links.
    _lock: TestbedLock,
}

impl TestbedSwitch {
    /// The switch of testbed `name`; needs root and the testbed up.
    pub fn open(name: &str) -> Result<TestbedSwitch, TestbedError> {
        check_name(name)?;
        preflight()?;
        let lock = TestbedLock::acquire(name, "netgap run --conditions")?;
        let (params, hosts) = load_state(name)?;
        let found = Found {
            name: name.to_string(),
            conditions: hosts.conditions.unwrap_or_else(|| params.conditions()),
            links: live::read(&link_ends(name, &params))?,
        };
        restore_on_interrupt()?;
        Ok(TestbedSwitch { found, _lock: lock })
    }
}

impl TestbedSwitch {
    /// Puts every link under `to` (the whole state, not a change),
    /// rewriting the hosts file; returns the conditions as applied (the
    /// shaper's bucket and what drops a loss).
    pub fn switch(&mut self, to: &LinkConditions) -> Result<LinkConditions, TestbedError> {
        let mut held = HELD
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        held.get_or_insert_with(|| self.found.clone());
        set_conditions(&self.found.name, to)
    }

    /// Puts the links back exactly as they were when the switch was
    /// opened, whatever was switched since.
    pub fn restore(&mut self) -> Result<(), TestbedError> {
        let mut held = HELD
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.found.put_back()?;
        *held = None;
        Ok(())
    }
}

/// The testbed a command built for itself and takes down when done
/// ([`OwnedTestbed`]), for the interrupt handler.
static OWNED: std::sync::Mutex<Option<String>> = std::sync::Mutex::new(None);

/// A testbed a command builds for its own run (`netgap study`): brought up
/// with [`up`] under the testbed's lock, and taken down when the guard is
/// dropped (on success, on error) or on Ctrl-C, SIGTERM or SIGHUP, which
/// take it down before the process exits. The lock is released after the
/// teardown, so no other command builds the testbed while it goes.
pub struct OwnedTestbed {
    name: String,
    /// Dropped after [`Drop::drop`] has taken the testbed down.
    _lock: TestbedLock,
}

impl OwnedTestbed {
    /// Builds testbed `req.name` for `command` (taking down what an
    /// earlier, killed run left under that name) and holds it; refuses,
    /// changing nothing, when another process holds the testbed.
    pub fn up(
        req: &UpRequest,
        command: &str,
        probe: &dyn AgentProbe,
        notes: &mut dyn FnMut(UpNote),
    ) -> Result<(OwnedTestbed, Status), TestbedError> {
        req.params()?;
        preflight()?;
        let name = req.name.clone();
        let lock = TestbedLock::acquire(&name, command)?;
        restore_on_interrupt()?;
        teardown(&name)?;
        *OWNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(name.clone());
        let guard = OwnedTestbed { name, _lock: lock };
        let status = up_as(req, RatePolicy::Scale, probe, notes)?;
        Ok((guard, status))
    }

    /// Its hosts file.
    pub fn hosts_file(&self) -> PathBuf {
        state_dir(&self.name).join("hosts.json")
    }
}

impl Drop for OwnedTestbed {
    fn drop(&mut self) {
        let mut owned = OWNED
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if let Err(e) = teardown(&self.name) {
            eprintln!(
                "netgap: error: testbed {} could not be taken down: {e}",
                self.name
            );
        }
        *owned = None;
    }
}

/// Removes the testbed (`netgap testbed down`).
pub fn down(name: &str) -> Result<Removed, TestbedError> {
    check_name(name)?;
    preflight()?;
    let _lock = TestbedLock::acquire(name, "netgap testbed down")?;
    teardown(name)
}

/// What `down` removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Removed {
    /// Namespaces deleted.
    pub namespaces: usize,
    /// Processes stopped (agents, and anything else left in a namespace).
    pub processes: usize,
    /// Whether the state directory is gone.
    pub state_dir_gone: bool,
}

/// Stops the agents (their pid files, then any process left in a testbed
/// namespace), deletes the namespaces (which deletes their links) and the
/// state directory. Works from what exists, so also after a crash.
fn teardown(name: &str) -> Result<Removed, TestbedError> {
    let dir = state_dir(name);
    check_state(name)?;
    let mut pids: Vec<i32> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "pid") {
                let pid = read_state(&path)
                    .ok()
                    .and_then(|t| t.trim().parse::<i32>().ok());
                // Only a netgap agent of this testbed: the pid may have been
                // reused since a crash.
                if let Some(pid) = pid.filter(|&p| is_our_agent(p, &dir)) {
                    pids.push(pid);
                }
            }
        }
    }
    let namespaces = own_netns(name)?;
    for ns in &namespaces {
        if let Ok(out) = ip(&["netns", "pids", ns]) {
            pids.extend(out.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
        }
    }
    pids.sort_unstable();
    pids.dedup();
    // This process may have a thread in a host's namespace (a run that
    // played a testbed host); it never stops itself.
    let own = i32::try_from(std::process::id()).unwrap_or(-1);
    pids.retain(|&p| p != own);
    stop_processes(&pids);
    let mut errors = Vec::new();
    for ns in &namespaces {
        if let Err(e) = ip(&["netns", "del", ns]) {
            errors.push(e.to_string());
        }
    }
    if dir.exists() {
        // Relative to the root's descriptor, never following a link.
        let removed = state_root().and_then(|root| root.remove_all(name).map_err(Into::into));
        if let Err(e) = removed {
            errors.push(e.to_string());
        }
    }
    match errors.first() {
        None => Ok(Removed {
            namespaces: namespaces.len(),
            processes: pids.len(),
            state_dir_gone: !dir.exists(),
        }),
        Some(e) => Err(TestbedError::Command {
            cmd: "testbed down".into(),
            detail: e.clone(),
        }),
    }
}

/// Whether `pid` is a netgap agent serving on a socket in `dir`.
fn is_our_agent(pid: i32, dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let dir = dir.to_string_lossy();
    args.iter().any(|a| *a == b"serve")
        && args
            .iter()
            .any(|a| String::from_utf8_lossy(a).contains(dir.as_ref()))
}

/// SIGTERM, up to 2 s to exit, then SIGKILL.
fn stop_processes(pids: &[i32]) {
    for &p in pids {
        // SAFETY: sending a signal has no memory effects here.
        unsafe { libc::kill(p, libc::SIGTERM) };
    }
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(2)
        && pids.iter().any(|&p| u32::try_from(p).is_ok_and(pid_alive))
    {
        std::thread::sleep(Duration::from_millis(20));
    }
    for &p in pids {
        if u32::try_from(p).is_ok_and(pid_alive) {
            // SAFETY: as above.
            unsafe { libc::kill(p, libc::SIGKILL) };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(topology: Topology, hosts: u32, links: u32) -> Params {
        Params {
            hosts,
            topology,
            links,
            mtu_bytes: 9000,
            rate_bps: Some(1_000_000_000),
            agent_exe: PathBuf::from("/bin/true"),
            offload: None,
            delay_us: None,
            loss_ppm: None,
            forwarding_bps: None,
        }
    }

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

    #[test]
    fn a_mesh_hosts_file_has_every_link_on_both_ends() {
        let p = params(Topology::Mesh, 3, 2);
        let f = hosts_file("t1", &p);
        assert_eq!(f.check(), Ok(()));
        assert_eq!(f.hosts.len(), 3);
        for h in &f.hosts {
            // Two peers, two links each.
            assert_eq!(h.links.len(), 4, "{}", h.name);
            for l in &h.links {
                let peer = f.host(&l.peer).expect("peer");
                let back = peer
                    .links_to(&h.name)
                    .find(|b| b.index == l.index)
                    .expect("the other end");
                assert_eq!((back.local, back.remote), (l.remote, l.local));
                assert_eq!(l.mtu_bytes, 9000);
            }
            assert_eq!(h.address, h.links[0].local);
            assert_eq!(h.netns.as_deref(), Some(&*format!("ngtb-t1-{}", h.name)));
        }
        let subnets: std::collections::HashSet<_> = f
            .hosts
            .iter()
            .flat_map(|h| h.links.iter().map(|l| l.local.to_string()))
            .map(|a| a.rsplit_once('.').map(|(n, _)| n.to_string()))
            .collect();
        assert_eq!(subnets.len(), 6, "each of 3 pairs x 2 links its own subnet");
    }

    #[test]
    fn relays_take_the_second_link_where_it_is_one_interface() {
        let on = |t, n, k| {
            hosts_file("t", &params(t, n, k))
                .hosts
                .iter()
                .map(relay_interface)
                .collect::<Vec<_>>()
        };
        let s = |v: &str| Some(v.to_string());
        assert_eq!(on(Topology::Mesh, 2, 2), [s("p2l1"), s("p1l1")]);
        assert_eq!(
            on(Topology::Switch, 3, 2),
            [s("eth1"), s("eth1"), s("eth1")]
        );
        assert_eq!(on(Topology::Switch, 3, 1), [None, None, None]);
        assert_eq!(on(Topology::Mesh, 2, 1), [None, None]);
        // One interface per peer: none to choose.
        assert_eq!(on(Topology::Mesh, 3, 2), [None, None, None]);
    }

    #[test]
    fn links_after_the_first_get_permanent_neighbours_with_the_peers_macs() {
        let f = hosts_file("t", &params(Topology::Mesh, 2, 2));
        let mut macs = std::collections::HashMap::new();
        for (h, dev, mac) in [
            ("h1", "p2l0", "02:00:00:00:01:00"),
            ("h1", "p2l1", "02:00:00:00:01:01"),
            ("h2", "p1l0", "02:00:00:00:02:00"),
            ("h2", "p1l1", "02:00:00:00:02:01"),
        ] {
            macs.insert((h.to_string(), dev.to_string()), mac.to_string());
        }
        let lines = neighbour_lines(&f, &macs);
        assert_eq!(
            lines,
            [
                (
                    "ngtb-t-h1".to_string(),
                    vec![
                        "neigh replace 10.81.1.2 lladdr 02:00:00:00:02:01 dev p2l1 nud permanent"
                            .to_string()
                    ]
                ),
                (
                    "ngtb-t-h2".to_string(),
                    vec![
                        "neigh replace 10.81.1.1 lladdr 02:00:00:00:01:01 dev p1l1 nud permanent"
                            .to_string()
                    ]
                ),
            ]
        );
        // A switch with two links: every other host on eth1.
        let f = hosts_file("t", &params(Topology::Switch, 3, 2));
        let mut macs = std::collections::HashMap::new();
        for h in 1..=3 {
            for k in 0..2 {
                macs.insert(
                    (format!("h{h}"), format!("eth{k}")),
                    format!("02:00:00:00:0{h}:0{k}"),
                );
            }
        }
        let lines = neighbour_lines(&f, &macs);
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0].1,
            [
                "neigh replace 10.77.1.2 lladdr 02:00:00:00:02:01 dev eth1 nud permanent",
                "neigh replace 10.77.1.3 lladdr 02:00:00:00:03:01 dev eth1 nud permanent"
            ]
        );
        // One link: nothing.
        assert!(neighbour_lines(&hosts_file("t", &params(Topology::Mesh, 2, 1)), &macs).is_empty());
    }

    #[test]
    fn a_switch_hosts_file_puts_every_host_on_one_subnet() {
        let f = hosts_file("testbed", &params(Topology::Switch, 4, 1));
        assert_eq!(f.check(), Ok(()));
        let addrs: Vec<String> = f.hosts.iter().map(|h| h.address.to_string()).collect();
        assert_eq!(addrs, ["10.77.0.1", "10.77.0.2", "10.77.0.3", "10.77.0.4"]);
        assert_eq!(f.hosts[0].control, "unix:/run/netgap/testbed/h1.sock");
        assert_eq!(f.key_file, Some(PathBuf::from("/run/netgap/testbed/key")));
        // A switch has no mesh links to number, however many host pairs.
        let big = hosts_file("testbed", &params(Topology::Switch, MAX_SWITCH_HOSTS, 1));
        assert_eq!(big.check(), Ok(()));
        assert_eq!(big.hosts.len(), MAX_SWITCH_HOSTS as usize);
        assert!(big.hosts.iter().all(|h| h.links.is_empty()));
        assert_eq!(big.hosts[249].address.to_string(), "10.77.0.250");
        assert_eq!(
            link_ends("testbed", &params(Topology::Switch, 64, 1)).len(),
            128
        );
    }

    /// A switch with one link is built and described exactly as it was
    /// before a switch could have more: studies and tests read its names,
    /// addresses and hosts file.
    #[test]
    fn a_one_link_switch_keeps_its_hosts_file_names_and_ends() {
        let p = params(Topology::Switch, 3, 1);
        let json = serde_json::to_string(&hosts_file("t1", &p)).expect("serializes");
        assert_eq!(
            json,
            concat!(
                r#"{"version":1,"topology":"switch","key_file":"/run/netgap/t1/key","hosts":["#,
                r#"{"name":"h1","control":"unix:/run/netgap/t1/h1.sock","address":"10.77.0.1","netns":"ngtb-t1-h1","links":[]},"#,
                r#"{"name":"h2","control":"unix:/run/netgap/t1/h2.sock","address":"10.77.0.2","netns":"ngtb-t1-h2","links":[]},"#,
                r#"{"name":"h3","control":"unix:/run/netgap/t1/h3.sock","address":"10.77.0.3","netns":"ngtb-t1-h3","links":[]}],"#,
                r#""testbed":"t1","conditions":{"mtu_bytes":9000,"offload":null,"rate_bps":1000000000,"#,
                r#""delay_us":null,"loss_ppm":null,"bucket_bytes":null,"loss_by":null}}"#
            )
        );
        let shown = |v: Vec<(String, String)>| -> Vec<String> {
            v.iter().map(|(n, d)| format!("{n}/{d}")).collect()
        };
        assert_eq!(
            shown(link_ends("t1", &p)),
            [
                "ngtb-t1-h1/eth0",
                "ngtb-t1-sw/h1",
                "ngtb-t1-h2/eth0",
                "ngtb-t1-sw/h2",
                "ngtb-t1-h3/eth0",
                "ngtb-t1-sw/h3"
            ]
        );
        assert_eq!(shown(bridges("t1", &p)), ["ngtb-t1-sw/br0"]);
        assert_eq!(
            shown(shaping_points("t1", &p)),
            ["ngtb-t1-sw/h1", "ngtb-t1-sw/h2", "ngtb-t1-sw/h3"]
        );
    }

    #[test]
    fn a_switch_with_two_links_is_two_switches_each_host_on_both() {
        let p = params(Topology::Switch, 3, 2);
        let f = hosts_file("t1", &p);
        assert_eq!(f.check(), Ok(()));
        let addrs: Vec<String> = f.hosts.iter().map(|h| h.address.to_string()).collect();
        assert_eq!(addrs, ["10.77.0.1", "10.77.0.2", "10.77.0.3"]);
        let h2 = &f.hosts[1];
        let shown: Vec<String> = h2
            .links
            .iter()
            .map(|l| {
                format!(
                    "{}#{} {} {}->{}",
                    l.peer, l.index, l.ifname, l.local, l.remote
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                "h1#0 eth0 10.77.0.2->10.77.0.1",
                "h1#1 eth1 10.77.1.2->10.77.1.1",
                "h3#0 eth0 10.77.0.2->10.77.0.3",
                "h3#1 eth1 10.77.1.2->10.77.1.3",
            ]
        );
        for h in &f.hosts {
            assert_eq!(h.links.len(), 4, "{}: two peers, two links each", h.name);
            for l in &h.links {
                let peer = f.host(&l.peer).expect("peer");
                let back = peer
                    .links_to(&h.name)
                    .find(|b| b.index == l.index)
                    .expect("the other end");
                assert_eq!((back.local, back.remote), (l.remote, l.local));
                assert_eq!(back.ifname, l.ifname);
                assert_eq!((l.mtu_bytes, l.rate_bps), (9000, Some(1_000_000_000)));
            }
        }
        let shown = |v: Vec<(String, String)>| -> Vec<String> {
            v.iter().map(|(n, d)| format!("{n}/{d}")).collect()
        };
        assert_eq!(
            shown(link_ends("t1", &p)),
            [
                "ngtb-t1-h1/eth0",
                "ngtb-t1-sw/h1",
                "ngtb-t1-h2/eth0",
                "ngtb-t1-sw/h2",
                "ngtb-t1-h3/eth0",
                "ngtb-t1-sw/h3",
                "ngtb-t1-h1/eth1",
                "ngtb-t1-sw1/h1",
                "ngtb-t1-h2/eth1",
                "ngtb-t1-sw1/h2",
                "ngtb-t1-h3/eth1",
                "ngtb-t1-sw1/h3",
            ]
        );
        assert_eq!(
            shown(bridges("t1", &p)),
            ["ngtb-t1-sw/br0", "ngtb-t1-sw1/br0"]
        );
        assert_eq!(
            shown(shaping_points("t1", &p)),
            [
                "ngtb-t1-sw/h1",
                "ngtb-t1-sw/h2",
                "ngtb-t1-sw/h3",
                "ngtb-t1-sw1/h1",
                "ngtb-t1-sw1/h2",
                "ngtb-t1-sw1/h3",
            ]
        );
        // `down` finds every switch by its name.
        for (ns, _) in bridges("t1", &params(Topology::Switch, 2, MAX_LINKS)) {
            assert!(is_own_netns("t1", &ns), "{ns}");
        }
        // The last switch's subnet is still 10.77's, below any mesh subnet.
        let last = hosts_file("t1", &params(Topology::Switch, 2, MAX_LINKS));
        let l = last.hosts[0].links.last().expect("a link");
        assert_eq!(
            (l.ifname.as_str(), l.local.to_string()),
            ("eth7", "10.77.7.1".to_string())
        );
    }

    #[test]
    fn the_largest_multilink_switch_hosts_file_fits_what_a_hosts_file_may_be() {
        let f = hosts_file(
            "testbed",
            &params(Topology::Switch, MAX_MULTILINK_SWITCH_HOSTS, MAX_LINKS),
        );
        assert_eq!(f.check(), Ok(()));
        let text = serde_json::to_string_pretty(&f).expect("serializes");
        assert!(
            (text.len() as u64) < netgap_core::files::Cap::HOSTS.max_bytes,
            "{} bytes",
            text.len()
        );
    }

    #[test]
    fn bursts_hold_a_gso_packet_and_netem_queues_hold_the_delay() {
        assert_eq!(shaper_bucket_bytes(1500, 1_000_000_000), 131_328);
        assert_eq!(shaper_bucket_bytes(9000, 1_000_000_000), 131_328);
        assert_eq!(shaper_bucket_bytes(65_535, 1_000_000_000), 131_328);
        assert_eq!(shaper_bucket_bytes(9000, 10_000_000_000), 1_050_000);
        let mut c = LinkConditions::plain(1500);
        assert_eq!(netem_limit_packets(&c), NETEM_MIN_LIMIT);
        // 1 Gbit/s for 100 ms is 12.5 MB in flight, 8333 packets of 1500.
        c.rate_bps = Some(1_000_000_000);
        c.delay_us = Some(100_000);
        assert_eq!(netem_limit_packets(&c), 2 * 8333);
        c.rate_bps = None;
        c.delay_us = Some(10_000_000);
        assert_eq!(netem_limit_packets(&c), NETEM_MAX_LIMIT);
    }

    #[test]
    fn every_link_end_is_conditioned_and_shaped_in_the_network() {
        let ends = link_ends("t1", &params(Topology::Switch, 2, 1));
        let shown: Vec<String> = ends.iter().map(|(n, d)| format!("{n}/{d}")).collect();
        assert_eq!(
            shown,
            [
                "ngtb-t1-h1/eth0",
                "ngtb-t1-sw/h1",
                "ngtb-t1-h2/eth0",
                "ngtb-t1-sw/h2"
            ]
        );
        assert_eq!(
            bridges("t1", &params(Topology::Switch, 2, 1)),
            [("ngtb-t1-sw".to_string(), "br0".to_string())]
        );
        let shaped: Vec<String> = shaping_points("t1", &params(Topology::Switch, 2, 1))
            .iter()
            .map(|(n, d)| format!("{n}/{d}"))
            .collect();
        assert_eq!(shaped, ["ngtb-t1-sw/h1", "ngtb-t1-sw/h2"]);
        let mesh = params(Topology::Mesh, 3, 2);
        let ends = link_ends("testbed", &mesh);
        assert_eq!(
            ends.len(),
            3 * 2 * 4,
            "3 pairs, 2 links, 2 ends and 2 ports"
        );
        let shaped: Vec<String> = shaping_points("testbed", &mesh)
            .iter()
            .map(|(n, d)| format!("{n}/{d}"))
            .collect();
        assert_eq!(shaped.len(), 3 * 2 * 2);
        assert_eq!(
            shaped[..4],
            ["ngtb-l0/h1", "ngtb-l0/h2", "ngtb-l1/h1", "ngtb-l1/h2"]
        );
        assert_eq!(bridges("testbed", &mesh).len(), 6, "one per link");
        for (ns, _) in bridges("testbed", &mesh) {
            assert!(is_own_netns("testbed", &ns), "{ns}");
        }
    }

    #[test]
    fn set_takes_the_keys_given_and_refuses_nothing_or_nonsense() {
        let mut a = SetRequest {
            name: "testbed".into(),
            change: Condition::default(),
        };
        assert!(a
            .checked()
            .is_err_and(|e| e.to_string().contains("at least one")));
        a.change.rate_bps = Some(None);
        a.change.offload = Some(false);
        let c = a.checked().expect("valid");
        assert_eq!(
            (c.rate_bps, c.offload, c.mtu_bytes),
            (Some(None), Some(false), None)
        );
        a.change.loss_ppm = Some(3_000_000);
        let e = a.checked().expect_err("bad loss").to_string();
        assert_eq!(e, "loss=3000000ppm: want 0% to 100%");
        a.change.loss_ppm = None;
        a.change.mtu_bytes = Some(10);
        assert!(a
            .checked()
            .is_err_and(|e| e.to_string().starts_with("--mtu 10")));
    }

    #[test]
    fn bad_requests_are_refused_with_a_reason() {
        let mut a = UpRequest {
            name: "testbed".into(),
            hosts: 4,
            topology: Topology::Switch,
            links: 1,
            mtu_bytes: 1500,
            rate_bps: None,
            offload: None,
            delay_us: None,
            loss_ppm: None,
            forwarding_bps: None,
        };
        assert!(a.params().is_ok());
        a.links = 2;
        assert!(a.params().is_ok(), "a switch per link");
        a.links = MAX_LINKS + 1;
        assert!(a
            .params()
            .is_err_and(|e| e.to_string() == "--links 9: want 1 to 8"));
        a.links = 2;
        a.hosts = MAX_MULTILINK_SWITCH_HOSTS + 1;
        assert!(a.params().is_err_and(|e| e
            .to_string()
            .starts_with("--hosts 65 --links 2: a switch testbed")));
        a.links = 1;
        assert!(a.params().is_ok(), "one switch takes more hosts");
        a.hosts = 4;
        a.links = 2;
        a.topology = Topology::Mesh;
        assert!(a.params().is_ok());
        a.hosts = 1;
        assert!(a.params().is_err());
        a.hosts = 2;
        a.name = "Bad/Name".into();
        assert!(a.params().is_err());
        a.name = "ok1".into();
        a.rate_bps = Some(1);
        assert!(a.params().is_err());
        a.rate_bps = None;
        a.delay_us = Some(0);
        a.loss_ppm = Some(0);
        let p = a.params().expect("valid");
        assert_eq!((p.delay_us, p.loss_ppm), (None, None), "0 is none");
        a.forwarding_bps = Some(1);
        assert!(a
            .params()
            .is_err_and(|e| e.to_string().starts_with("--forwarding")));
    }

    #[test]
    fn a_rate_past_what_the_machine_carries_is_refused_naming_the_rate_it_carries() {
        let c = LinkConditions {
            rate_bps: Some(3_000_000_000),
            ..LinkConditions::plain(1500)
        };
        let two = capacity::declared(2_000_000_000, 1500);
        let e = check_rate(&two, &c).expect_err("3G past 2 Gbit/s");
        let line = e.to_string();
        assert!(
            line.starts_with("--rate 3G: this machine forwards 2.0 Gbit/s"),
            "{line}"
        );
        assert!(line.ends_with("give --rate 1.6G or less"), "{line}");
        assert!(!line.contains('\n'));
        let ten = capacity::declared(10_000_000_000, 1500);
        assert!(check_rate(&ten, &c).is_ok());
        assert!(
            check_rate(&two, &LinkConditions::plain(1500)).is_ok(),
            "no rate"
        );
    }
}
