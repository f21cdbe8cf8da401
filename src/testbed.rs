//! The virtual testbed (`netgap testbed up|status|down`): a cluster of hosts
//! on this machine, each a Linux network namespace with a netgap agent, wired
//! through a bridge (`switch`) or by point-to-point links (`mesh`).
//!
//! Everything is made with iproute2 (`ip`, `tc`) run as child processes, and
//! only inside the testbed's own namespaces: each veth pair is created inside
//! a testbed namespace with its peer moved straight into another one, so no
//! interface of the machine's own namespace is ever created or touched.
//!
//! Names: namespaces are `ngtb-h1`, `ngtb-h2`, ... and `ngtb-sw` (the switch)
//! for the default testbed, `ngtb-NAME-h1`, ... for one made with `--name
//! NAME`. State lives in `/run/netgap/NAME/` (`/run/netgap/testbed/` by
//! default): `hosts.json` (the [`HostsFile`] multi-host commands read with
//! `--hosts @testbed`), `params.json`, the shared `key` (mode 0600), and
//! per host the agent's control socket `hN.sock`, its `hN.pid` and `hN.log`.
//!
//! Addresses: on a switch, host N is 10.77.0.N/24 on `eth0`. In a mesh, link
//! K between hosts I < J is its own subnet 10.(80+K).P.0/24, where P counts
//! host pairs from 1; host I is .1 on interface `pJlK`, host J is .2 on
//! `pIlK`. Rate limits are a TBF qdisc on both ends of every link (on a
//! switch: the host's `eth0` and its bridge port), with a burst of
//! [`TBF_BURST_MS`] of traffic at the rate (at least [`TBF_MIN_BURST_BYTES`],
//! so one full-size GSO packet fits) and a queue of [`TBF_LATENCY_MS`].
//!
//! `down` finds what to remove from the namespaces' names and the state
//! directory, not from memory, so it also cleans up after a crash.

use netgap_measure::cluster::{HostEntry, HostsFile, LinkEntry, HOSTS_FILE_VERSION};
use netgap_measure::control::ControlAddr;
use serde::{Deserialize, Serialize};
use std::io;
use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Prints a line to stdout; a closed stdout (`| head`) is not an error
/// worth a panic in the middle of building or removing a testbed.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stdout(), $($arg)*);
    }};
}

pub use netgap_measure::cluster::{
    default_hosts_path, state_dir, DEFAULT_TESTBED as DEFAULT_NAME,
    TESTBED_STATE_ROOT as STATE_ROOT,
};
/// Prefix of every testbed namespace.
pub const NETNS_PREFIX: &str = "ngtb-";
/// Most hosts of a switch testbed.
pub const MAX_SWITCH_HOSTS: u32 = 250;
/// Most hosts of a mesh testbed (host pairs must fit in 255 subnets).
pub const MAX_MESH_HOSTS: u32 = 22;
/// Most parallel links per host pair in a mesh.
pub const MAX_LINKS: u32 = 8;
/// TBF burst, in milliseconds of traffic at the link's rate.
pub const TBF_BURST_MS: u64 = 4;
/// Smallest TBF burst in bytes: one 64 KiB GSO packet and headers.
pub const TBF_MIN_BURST_BYTES: u64 = 70_000;
/// TBF queue length, as the longest a packet may wait, in milliseconds.
pub const TBF_LATENCY_MS: u64 = 50;
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
/// exactly `sw` or `h` and a number (so the default testbed never claims a
/// named one's namespaces).
fn is_own_netns(name: &str, ns: &str) -> bool {
    match ns.strip_prefix(&ns_prefix(name)) {
        Some("sw") => true,
        Some(rest) => rest
            .strip_prefix('h')
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())),
        None => false,
    }
}

/// The topology of a testbed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Topology {
    /// Every host on one bridge, the bridge in a namespace of its own.
    Switch,
    /// A link (or `--links K`) between every pair of hosts.
    Mesh,
}

impl Topology {
    fn as_str(self) -> &'static str {
        match self {
            Topology::Switch => "switch",
            Topology::Mesh => "mesh",
        }
    }
}

/// Which testbed (`status`, `down`).
#[derive(Debug, Clone, clap::Args)]
pub struct NameArgs {
    /// Testbed name, so several can coexist (namespaces `ngtb-NAME-*`, state
    /// in /run/netgap/NAME).
    #[arg(long, default_value = DEFAULT_NAME)]
    pub name: String,
}

/// Flags of `testbed up`.
#[derive(Debug, Clone, clap::Args)]
pub struct UpArgs {
    /// Number of hosts.
    #[arg(long, default_value_t = 4)]
    pub hosts: u32,
    /// How the hosts are wired.
    #[arg(long, value_enum, default_value = "switch")]
    pub topology: Topology,
    /// Parallel links per host pair (mesh only), each its own subnet.
    #[arg(long, default_value_t = 1)]
    pub links: u32,
    /// MTU of every link, in bytes.
    #[arg(long, default_value_t = 1500)]
    pub mtu: u32,
    /// Rate limit of every link in bit/s (e.g. 1G, 100M), a TBF on both ends.
    #[arg(long, value_name = "RATE")]
    pub rate: Option<String>,
    /// Testbed name.
    #[command(flatten)]
    pub name: NameArgs,
}

/// What a testbed was built with; `up` compares it to decide whether an
/// existing testbed can stay.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Params {
    /// Hosts.
    pub hosts: u32,
    /// Topology.
    pub topology: Topology,
    /// Links per host pair (1 on a switch).
    pub links: u32,
    /// MTU in bytes.
    pub mtu_bytes: u32,
    /// Rate limit in bit/s.
    pub rate_bps: Option<u64>,
    /// The agent binary the testbed runs.
    pub agent_exe: PathBuf,
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
    /// The testbed's key file is unusable.
    #[error(transparent)]
    Key(#[from] netgap_measure::auth::KeyFileError),
    /// Connecting or the handshake failed.
    #[error(transparent)]
    Coordinator(#[from] netgap_measure::coordinator::CoordError),
    /// The agent's process is gone.
    #[error("it exited")]
    Exited,
}

/// Why a testbed that is up cannot be kept as it is.
#[derive(Debug, thiserror::Error)]
pub enum Unhealthy {
    /// Its hosts file is missing or bad.
    #[error(transparent)]
    Hosts(#[from] netgap_measure::cluster::HostsError),
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

/// A `--rate` that is not a rate in range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RateError {
    /// Not a number with an optional K, M or G.
    #[error("--rate {0:?}: want a rate like 1G, 100M or 10000000")]
    Syntax(String),
    /// Outside 8 kbit/s to 1000 Gbit/s.
    #[error("--rate {0:?}: want 8K to 1000G bit/s")]
    Range(String),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> TestbedError {
    let what = what.into();
    move |source| TestbedError::Io { what, source }
}

/// Parses a rate in bit/s: a number with an optional K, M or G (powers of
/// 1000) and an optional `bit`/`bps` (`1G`, `100Mbit`, `2.5G`).
pub fn parse_rate_bps(s: &str) -> Result<u64, RateError> {
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let lower = lower
        .strip_suffix("bps")
        .or_else(|| lower.strip_suffix("bit"))
        .unwrap_or(&lower);
    let (num, mult) = match lower.chars().last() {
        Some('k') => (&lower[..lower.len() - 1], 1e3),
        Some('m') => (&lower[..lower.len() - 1], 1e6),
        Some('g') => (&lower[..lower.len() - 1], 1e9),
        _ => (lower, 1.0),
    };
    let v: f64 = num
        .trim()
        .parse()
        .map_err(|_| RateError::Syntax(t.to_string()))?;
    let bps = v * mult;
    if !(bps.is_finite() && (8_000.0..=1e12).contains(&bps)) {
        return Err(RateError::Range(t.to_string()));
    }
    Ok(bps as u64)
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

impl UpArgs {
    /// Validates the flags into [`Params`].
    pub fn params(&self) -> Result<Params, TestbedError> {
        check_name(&self.name.name)?;
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
        if self.topology == Topology::Switch && self.links != 1 {
            return bad("--links applies to --topology mesh only".into());
        }
        if !(576..=65_535).contains(&self.mtu) {
            return bad(format!("--mtu {}: want 576 to 65535 bytes", self.mtu));
        }
        let rate_bps = self
            .rate
            .as_deref()
            .map(parse_rate_bps)
            .transpose()
            .map_err(|e| TestbedError::Args(e.to_string()))?;
        let agent_exe = std::env::current_exe().map_err(io_err("finding netgap's own binary"))?;
        Ok(Params {
            hosts: self.hosts,
            topology: self.topology,
            links: self.links,
            mtu_bytes: self.mtu,
            rate_bps,
            agent_exe,
        })
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
    a: u32,
    b: u32,
    index: u32,
    a_if: String,
    b_if: String,
    a_ip: Ipv4Addr,
    b_ip: Ipv4Addr,
}

fn mesh_links(p: &Params) -> Vec<LinkPlan> {
    let mut out = Vec::new();
    let mut pair = 0u8;
    for a in 1..=p.hosts {
        for b in a + 1..=p.hosts {
            pair += 1;
            for k in 0..p.links {
                let net = 80 + k as u8;
                out.push(LinkPlan {
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

fn switch_ip(host: u32) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, host as u8)
}

/// The hosts file the testbed `name` with `p` is described by.
fn hosts_file(name: &str, p: &Params) -> HostsFile {
    let dir = state_dir(name);
    let prefix = ns_prefix(name);
    let links = mesh_links(p);
    let hosts = (1..=p.hosts)
        .map(|h| {
            let mut ends: Vec<LinkEntry> = Vec::new();
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
                Topology::Switch => IpAddr::V4(switch_ip(h)),
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
    }
}

/// The TBF burst for `rate_bps` and `mtu_bytes`, in bytes.
pub fn tbf_burst_bytes(rate_bps: u64, mtu_bytes: u32) -> u64 {
    (rate_bps / 8 * TBF_BURST_MS / 1000)
        .max(TBF_MIN_BURST_BYTES)
        .max(2 * u64::from(mtu_bytes))
}

fn shape(ns: &str, dev: &str, p: &Params) -> Result<(), TestbedError> {
    let Some(rate) = p.rate_bps else {
        return Ok(());
    };
    let rate = format!("{rate}bit");
    let burst = tbf_burst_bytes(p.rate_bps.unwrap_or(0), p.mtu_bytes).to_string();
    let latency = format!("{TBF_LATENCY_MS}ms");
    run(
        "tc",
        &[
            "-n", ns, "qdisc", "replace", "dev", dev, "root", "tbf", "rate", &rate, "burst",
            &burst, "latency", &latency,
        ],
    )?;
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

fn build_network(name: &str, p: &Params, hosts: &HostsFile) -> Result<(), TestbedError> {
    let prefix = ns_prefix(name);
    let mtu = p.mtu_bytes.to_string();
    for h in &hosts.hosts {
        let ns = h.netns.as_deref().unwrap_or_default();
        ip(&["netns", "add", ns])?;
        ip(&["-n", ns, "link", "set", "lo", "up"])?;
    }
    match p.topology {
        Topology::Switch => {
            let sw = format!("{prefix}sw");
            ip(&["netns", "add", &sw])?;
            ip(&["-n", &sw, "link", "set", "lo", "up"])?;
            ip(&[
                "-n", &sw, "link", "add", "br0", "mtu", &mtu, "type", "bridge",
            ])?;
            ip(&["-n", &sw, "link", "set", "br0", "up"])?;
            for (i, h) in hosts.hosts.iter().enumerate() {
                let ns = h.netns.as_deref().unwrap_or_default();
                let port = h.name.clone();
                veth(ns, "eth0", &sw, &port, &mtu)?;
                ip(&["-n", &sw, "link", "set", &port, "master", "br0", "up"])?;
                let addr = format!("{}/24", switch_ip(i as u32 + 1));
                ip(&["-n", ns, "addr", "add", &addr, "dev", "eth0"])?;
                ip(&["-n", ns, "link", "set", "eth0", "up"])?;
                shape(ns, "eth0", p)?;
                shape(&sw, &port, p)?;
            }
        }
        Topology::Mesh => {
            for l in mesh_links(p) {
                let a_ns = format!("{prefix}h{}", l.a);
                let b_ns = format!("{prefix}h{}", l.b);
                veth(&a_ns, &l.a_if, &b_ns, &l.b_if, &mtu)?;
                for (ns, dev, addr) in [(&a_ns, &l.a_if, l.a_ip), (&b_ns, &l.b_if, l.b_ip)] {
                    ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
                    ip(&["-n", ns, "link", "set", dev, "up"])?;
                    shape(ns, dev, p)?;
                }
            }
        }
    }
    Ok(())
}

/// Starts the agent of host `h` in its namespace, detached (own session,
/// output to its log), and records its pid.
fn start_agent(dir: &Path, p: &Params, h: &HostEntry) -> Result<u32, TestbedError> {
    let log_path = dir.join(format!("{}.log", h.name));
    let log = std::fs::File::create(&log_path)
        .map_err(io_err(format!("creating {}", log_path.display())))?;
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
        .arg(dir.join("key"))
        .stdin(Stdio::null())
        .stdout(log)
        .stderr(log2);
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
    let pid_path = dir.join(format!("{}.pid", h.name));
    std::fs::write(&pid_path, format!("{pid}\n"))
        .map_err(io_err(format!("writing {}", pid_path.display())))?;
    Ok(pid)
}

/// Connects to a testbed agent with the key and shakes hands: whether it
/// answers, or why not.
pub fn probe_agent(h: &HostEntry, key_file: Option<&Path>) -> Result<(), AgentProbeError> {
    let addr = h
        .control_addr()
        .ok_or_else(|| AgentProbeError::BadAddress(h.control.clone()))?;
    let key = key_file.map(netgap_measure::auth::load_key).transpose()?;
    let coord = netgap_measure::coordinator::Coordinator::connect(&addr, key.as_ref())?;
    coord.bye();
    Ok(())
}

fn wait_for_agent(h: &HostEntry, key_file: &Path, pid: u32) -> Result<(), AgentProbeError> {
    let t0 = Instant::now();
    loop {
        if !pid_alive(pid) {
            return Err(AgentProbeError::Exited);
        }
        match probe_agent(h, Some(key_file)) {
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
/// with the same parameters. Prints the hosts and addresses.
pub fn up(args: &UpArgs) -> Result<(), TestbedError> {
    preflight()?;
    let name = &args.name.name;
    let params = args.params()?;
    let dir = state_dir(name);
    let existing: Option<Params> = std::fs::read_to_string(dir.join("params.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let leftovers = own_netns(name)?;
    if let Some(old) = existing {
        if old == params && healthy(name).is_ok() {
            say!("testbed {name} is already up with these parameters; keeping it");
            return status(&args.name);
        }
        let why = if old != params {
            "its parameters differ".to_string()
        } else {
            healthy(name)
                .err()
                .map(|e| e.to_string())
                .unwrap_or_default()
        };
        say!("rebuilding testbed {name}: {why}");
        teardown(name, true)?;
    } else if !leftovers.is_empty() || dir.exists() {
        say!(
            "removing the remains of an earlier testbed {name} ({} namespaces)",
            leftovers.len()
        );
        teardown(name, true)?;
    }
    match build(name, &params) {
        Ok(()) => status(&args.name),
        Err(e) => {
            // Leave nothing half-built behind.
            let _ = teardown(name, true);
            Err(e)
        }
    }
}

fn build(name: &str, p: &Params) -> Result<(), TestbedError> {
    let dir = state_dir(name);
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(&dir)
        .map_err(io_err(format!("creating {}", dir.display())))?;
    let key_file = dir.join("key");
    netgap_measure::auth::new_key_file(&key_file).map_err(|e| TestbedError::Io {
        what: "making the testbed's key".into(),
        source: io::Error::other(e.to_string()),
    })?;
    let hosts = hosts_file(name, p);
    build_network(name, p, &hosts)?;
    let mut pids = Vec::new();
    for h in &hosts.hosts {
        pids.push(start_agent(&dir, p, h)?);
    }
    for (h, pid) in hosts.hosts.iter().zip(pids) {
        wait_for_agent(h, &key_file, pid).map_err(|source| TestbedError::Agent {
            host: h.name.clone(),
            source: Box::new(source),
            log: dir.join(format!("{}.log", h.name)).display().to_string(),
        })?;
    }
    let text = serde_json::to_string_pretty(p).map_err(|e| TestbedError::Io {
        what: "writing params.json".into(),
        source: io::Error::other(e),
    })?;
    std::fs::write(dir.join("params.json"), text + "\n").map_err(io_err("writing params.json"))?;
    // The hosts file last: its presence means the testbed is complete.
    hosts
        .save(&dir.join("hosts.json"))
        .map_err(io_err("writing hosts.json"))
}

/// Whether testbed `name` is complete: hosts file, namespaces, live agents.
fn healthy(name: &str) -> Result<(), Unhealthy> {
    let dir = state_dir(name);
    let hosts = HostsFile::load(&dir.join("hosts.json"))?;
    let present = own_netns(name)?;
    for h in &hosts.hosts {
        let ns = h.netns.clone().unwrap_or_default();
        if !present.contains(&ns) {
            return Err(Unhealthy::MissingNamespace(ns));
        }
        probe_agent(h, hosts.key_file.as_deref()).map_err(|source| Unhealthy::Agent {
            host: h.name.clone(),
            source,
        })?;
    }
    Ok(())
}

/// Prints the testbed (`netgap testbed status`): hosts, addresses, links and
/// whether each agent answers.
pub fn status(args: &NameArgs) -> Result<(), TestbedError> {
    check_name(&args.name)?;
    let name = &args.name;
    let dir = state_dir(name);
    let hosts_path = dir.join("hosts.json");
    if !hosts_path.exists() {
        preflight()?;
        let left = own_netns(name)?;
        if left.is_empty() {
            say!("no testbed {name} is up");
        } else {
            say!(
                "testbed {name} is incomplete (namespaces {} but no hosts file); run `netgap testbed down --name {name}`",
                left.join(", ")
            );
        }
        return Ok(());
    }
    let hosts = HostsFile::load(&hosts_path).map_err(|e| TestbedError::Io {
        what: "reading the hosts file".into(),
        source: io::Error::other(e.to_string()),
    })?;
    let params: Option<Params> = std::fs::read_to_string(dir.join("params.json"))
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok());
    let shaping = params.as_ref().map_or(String::new(), |p| {
        format!(
            ", MTU {} bytes{}",
            p.mtu_bytes,
            p.rate_bps
                .map_or(String::new(), |r| format!(", TBF {r} bit/s per link end"))
        )
    });
    say!(
        "testbed {name}: {} hosts, {}{shaping}",
        hosts.hosts.len(),
        hosts.topology
    );
    say!("hosts file: {}", hosts_path.display());
    if let Some(k) = &hosts.key_file {
        say!("key: {}", k.display());
    }
    for h in &hosts.hosts {
        let pid = std::fs::read_to_string(dir.join(format!("{}.pid", h.name)))
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok());
        let agent = match (pid, probe_agent(h, hosts.key_file.as_deref())) {
            (_, Ok(())) => format!("agent answers (pid {})", pid.unwrap_or(0)),
            (Some(p), Err(e)) if pid_alive(p) => format!("agent pid {p} alive, not answering: {e}"),
            (_, Err(_)) => "agent DOWN".to_string(),
        };
        say!(
            "  {:<4} {:<16} {:<15} {:<24} {agent}",
            h.name,
            h.netns.as_deref().unwrap_or("-"),
            h.address,
            h.control
        );
        for l in &h.links {
            say!(
                "       link {}#{} {} {} -> {}",
                l.peer,
                l.index,
                l.ifname,
                l.local,
                l.remote
            );
        }
    }
    Ok(())
}

/// Removes the testbed (`netgap testbed down`).
pub fn down(args: &NameArgs) -> Result<(), TestbedError> {
    check_name(&args.name)?;
    preflight()?;
    teardown(&args.name, false)
}

/// Stops the agents (their pid files, then any process left in a testbed
/// namespace), deletes the namespaces (which deletes their links) and the
/// state directory. Works from what exists, so also after a crash.
fn teardown(name: &str, quiet: bool) -> Result<(), TestbedError> {
    let dir = state_dir(name);
    let mut pids: Vec<i32> = Vec::new();
    if let Ok(entries) = std::fs::read_dir(&dir) {
        for e in entries.flatten() {
            let path = e.path();
            if path.extension().is_some_and(|x| x == "pid") {
                let pid = std::fs::read_to_string(&path)
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
    stop_processes(&pids);
    let mut errors = Vec::new();
    for ns in &namespaces {
        if let Err(e) = ip(&["netns", "del", ns]) {
            errors.push(e.to_string());
        }
    }
    if dir.exists() {
        if let Err(e) = std::fs::remove_dir_all(&dir) {
            errors.push(format!("removing {}: {e}", dir.display()));
        }
    }
    if !quiet {
        say!(
            "testbed {name} removed: {} namespaces, {} processes stopped{}",
            namespaces.len(),
            pids.len(),
            if dir.exists() {
                ""
            } else {
                ", state directory gone"
            }
        );
    }
    match errors.first() {
        None => Ok(()),
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
        }
    }

    #[test]
    fn own_namespaces_are_told_apart_from_other_testbeds() {
        assert!(is_own_netns("testbed", "ngtb-h1"));
        assert!(is_own_netns("testbed", "ngtb-sw"));
        assert!(is_own_netns("testbed", "ngtb-h12"));
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
    fn a_switch_hosts_file_puts_every_host_on_one_subnet() {
        let f = hosts_file("testbed", &params(Topology::Switch, 4, 1));
        assert_eq!(f.check(), Ok(()));
        let addrs: Vec<String> = f.hosts.iter().map(|h| h.address.to_string()).collect();
        assert_eq!(addrs, ["10.77.0.1", "10.77.0.2", "10.77.0.3", "10.77.0.4"]);
        assert_eq!(f.hosts[0].control, "unix:/run/netgap/testbed/h1.sock");
        assert_eq!(f.key_file, Some(PathBuf::from("/run/netgap/testbed/key")));
    }

    #[test]
    fn rates_parse_and_bursts_hold_a_gso_packet() {
        assert_eq!(parse_rate_bps("1G"), Ok(1_000_000_000));
        assert_eq!(parse_rate_bps("100Mbit"), Ok(100_000_000));
        assert_eq!(parse_rate_bps("2.5g"), Ok(2_500_000_000));
        assert_eq!(parse_rate_bps("10000000"), Ok(10_000_000));
        assert!(parse_rate_bps("fast").is_err());
        assert!(parse_rate_bps("0").is_err());
        assert_eq!(tbf_burst_bytes(1_000_000_000, 1500), 500_000);
        assert_eq!(tbf_burst_bytes(10_000_000, 1500), TBF_MIN_BURST_BYTES);
    }

    #[test]
    fn bad_flags_are_refused_with_a_reason() {
        let mut a = UpArgs {
            hosts: 4,
            topology: Topology::Switch,
            links: 1,
            mtu: 1500,
            rate: None,
            name: NameArgs {
                name: "testbed".into(),
            },
        };
        assert!(a.params().is_ok());
        a.links = 2;
        assert!(a.params().is_err());
        a.topology = Topology::Mesh;
        assert!(a.params().is_ok());
        a.hosts = 1;
        assert!(a.params().is_err());
        a.hosts = 2;
        a.name.name = "Bad/Name".into();
        assert!(a.params().is_err());
        a.name.name = "ok1".into();
        a.rate = Some("x".into());
        assert!(a.params().is_err());
    }
}
