//! `testbed up`: the namespaces, links and switches built, the key made,
//! the agents started, and what `up` says before it changes a testbed that
//! exists.

use crate::agents::{start_agent, wait_for_agent};
use crate::command::{ip, ns_prefix, own_netns, preflight};
use crate::down::teardown;
use crate::layout::{
    hosts_file, link_ends, mesh_links, neighbour_lines, switch_if, switch_ip, switch_netns,
};
use crate::queue_path::{self, HOST_QUEUES};
use crate::shaping::{check_carried, check_rate, condition_links, resolve};
use crate::state::{
    check_state, load_state, open_state, read_state, save_hosts, save_params, KEY_FILE,
    STATE_FILE_MODE,
};
use crate::status::{healthy, live_differences};
use crate::{
    capacity, live, mptcp, netns_ops, set_conditions, state_dir, status, AgentProbe, Params,
    Status, TestbedError, TestbedLock, Topology, UpRequest,
};
use netgap_core::hosts::HostsFile;
use netgap_core::link::LinkConditions;
use netgap_workload::confined::Dir;
use std::io;
use std::path::PathBuf;
use std::process::{Command, Stdio};

/// Creates a veth pair `a_if` in `a_ns` and `b_if` in `b_ns`, with `mtu`
/// and `queues` queues each way at each end.
fn veth(
    a_ns: &str,
    a_if: &str,
    b_ns: &str,
    b_if: &str,
    mtu: &str,
    queues: u32,
) -> Result<(), TestbedError> {
    let q = queues.to_string();
    ip(&[
        "-n",
        a_ns,
        "link",
        "add",
        a_if,
        "mtu",
        mtu,
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "type",
        "veth",
        "peer",
        "name",
        b_if,
        "mtu",
        mtu,
        "numtxqueues",
        &q,
        "numrxqueues",
        &q,
        "netns",
        b_ns,
    ])?;
    Ok(())
}

/// Makes `port` of `bridge_ns` a port of its bridge, up, keeping netgap
/// frames' queues across it when the links have several.
fn bridge_port(bridge_ns: &str, port: &str, queues: u32) -> Result<(), TestbedError> {
    ip(&["-n", bridge_ns, "link", "set", port, "master", "br0", "up"])?;
    if queues > 1 {
        queue_path::keep_queue(bridge_ns, port)?;
    }
    Ok(())
}

/// The queues of the hosts' links: [`HOST_QUEUES`] where the kernel keeps
/// a frame's queue across a bridge port (tried in `bridge_ns`), else one.
fn link_queues(bridge_ns: &str) -> u32 {
    if queue_path::kernel_keeps_queues(bridge_ns) {
        HOST_QUEUES
    } else {
        1
    }
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
            let mut queues = None;
            for k in 0..p.links {
                let sw = switch_netns(&prefix, k);
                let dev = switch_if(k);
                bridge_netns(&sw, &mtu)?;
                let queues = *queues.get_or_insert_with(|| link_queues(&sw));
                for (i, h) in hosts.hosts.iter().enumerate() {
                    let ns = h.netns.as_deref().unwrap_or_default();
                    let port = h.name.clone();
                    veth(ns, &dev, &sw, &port, &mtu, queues)?;
                    bridge_port(&sw, &port, queues)?;
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
            let mut queues = None;
            for l in mesh_links(p) {
                let a_ns = format!("{prefix}h{}", l.a);
                let b_ns = format!("{prefix}h{}", l.b);
                // The middle of the link: a bridge between a port toward
                // each host, where the link is shaped.
                let mid = format!("{prefix}l{}", l.id);
                bridge_netns(&mid, &mtu)?;
                let queues = *queues.get_or_insert_with(|| link_queues(&mid));
                for (ns, dev, addr, host) in
                    [(&a_ns, &l.a_if, l.a_ip, l.a), (&b_ns, &l.b_if, l.b_ip, l.b)]
                {
                    let port = format!("h{host}");
                    veth(ns, dev, &mid, &port, &mtu, queues)?;
                    bridge_port(&mid, &port, queues)?;
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
pub(crate) enum RatePolicy {
    /// Refuse it in one line, leaving no testbed (or the earlier
    /// conditions) behind: `netgap testbed up`.
    Refuse,
    /// Keep it: a study scales each figure's rate to what the machine
    /// carries ([`scale_rate`]).
    Scale,
}

/// Whether testbed `name`'s rate is one the machine carries.
pub(crate) fn carried(name: &str) -> Result<(), TestbedError> {
    let (params, hosts) = load_state(name)?;
    let c = hosts.conditions.unwrap_or_else(|| params.conditions());
    check_carried(&hosts, &c)
}

pub(crate) fn up_as(
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
