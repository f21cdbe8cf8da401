//! The typed requests `up` and `set` take, the parameters a testbed is built
//! with and kept in `params.json`, and the probe that asks whether an agent
//! answers.

use crate::error::io_err;
use crate::{
    TestbedError, DEFAULT_MTU_BYTES, MAX_LINKS, MAX_MESH_HOSTS, MAX_MULTILINK_SWITCH_HOSTS,
    MAX_SWITCH_HOSTS,
};
use netgap_core::hosts::ControlAddr;
use netgap_core::link::{parse_mtu, Condition, ConditionError, LinkConditions};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

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
    pub(crate) fn checked(&self) -> Result<Condition, TestbedError> {
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
    pub(crate) fn with_conditions(&self, c: &LinkConditions) -> Params {
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
    pub(crate) fn same_build(&self, other: &Params) -> bool {
        self.hosts == other.hosts
            && self.topology == other.topology
            && self.links == other.links
            && self.agent_exe == other.agent_exe
            && self.forwarding_bps == other.forwarding_bps
    }
}

/// Checks a testbed name: 1 to 12 of `a-z0-9`.
pub(crate) fn check_name(name: &str) -> Result<(), TestbedError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
