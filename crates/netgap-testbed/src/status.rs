//! `testbed status`: the state files, the namespaces, the agents and the
//! live links compared with what the testbed was built with.

use crate::agents::pid_alive;
use crate::command::{own_netns, preflight};
use crate::layout::{bridges, link_ends, shaping_points};
use crate::request::check_name;
use crate::shaping::has_nft_loss;
use crate::state::{check_state, read_state};
use crate::{
    live, probe_agent, state_dir, AgentProbe, AgentProbeError, Params, TestbedError, Unhealthy,
};
use netgap_core::hosts::HostsFile;
use netgap_core::link::{LinkConditions, LossMechanism};
use std::io;
use std::path::PathBuf;

/// Whether testbed `name` is complete: hosts file, namespaces, live agents.
pub(crate) fn healthy(name: &str, probe: &dyn AgentProbe) -> Result<(), Unhealthy> {
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
    let host_link_queues = params.as_ref().and_then(|p| {
        let (ns, dev) = link_ends(name, p).into_iter().next()?;
        live::read_mtu_and_queues(&ns, &dev).ok().map(|(_, q)| q)
    });
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
        host_link_queues,
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
    /// The queues each way of the hosts' links, read from the kernel at
    /// the first host's first link (the testbed gives every link end
    /// alike); `None` without parameters or when not read.
    pub host_link_queues: Option<u32>,
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

/// `ends` grouped by namespace, in their order.
pub(crate) fn group_by_ns(ends: &[(String, String)]) -> Vec<(String, Vec<String>)> {
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
pub(crate) fn live_differences(
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
