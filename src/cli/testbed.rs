//! The flags of `netgap testbed up|set|status|down`, their mapping to the
//! testbed crate's typed requests ([`netgap::testbed::UpRequest`],
//! [`netgap::testbed::SetRequest`]), and the printing of what it returns.
//! Every string flag is parsed here, by the parsers of `netgap_core::link`,
//! and refused naming its flag.

use anyhow::{anyhow, Result};
use netgap::conditions::{
    parse_delay_us, parse_loss_ppm, parse_mtu, parse_offload, parse_rate_bps, parse_rate_setting,
    Condition, ConditionError,
};
use netgap::testbed::capacity::{rate_text, CARRY_SHARE};
use netgap::testbed::{
    AgentState, LiveLinks, Removed, SetRequest, Status, Topology, UpNote, UpRequest,
    DEFAULT_MTU_BYTES, DEFAULT_NAME,
};
use netgap::testbed_seams::CoordinatorProbe;

/// `--topology`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum TopologyArg {
    /// Every host on one bridge, the bridge in a namespace of its own.
    Switch,
    /// A link (or `--links K`) between every pair of hosts.
    Mesh,
}

impl From<TopologyArg> for Topology {
    fn from(t: TopologyArg) -> Topology {
        match t {
            TopologyArg::Switch => Topology::Switch,
            TopologyArg::Mesh => Topology::Mesh,
        }
    }
}

/// Which testbed (`status`, `down`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct NameArgs {
    /// Testbed name, so several can coexist (namespaces `ngtb-NAME-*`, state
    /// in /run/netgap/NAME).
    #[arg(long, default_value = DEFAULT_NAME)]
    pub name: String,
}

/// Flags of `testbed up`.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct UpArgs {
    /// Number of hosts.
    #[arg(long, default_value_t = 4)]
    pub hosts: u32,
    /// How the hosts are wired.
    #[arg(long, value_enum, default_value = "switch")]
    pub topology: TopologyArg,
    /// Parallel links per host pair, each its own subnet: on a mesh a link
    /// per pair each, on a switch a switch each (`eth0`, `eth1`, ... on
    /// every host).
    #[arg(long, default_value_t = 1)]
    pub links: u32,
    /// MTU of every link, in bytes.
    #[arg(long, default_value_t = DEFAULT_MTU_BYTES)]
    pub mtu: u32,
    /// Rate limit of every link in bit/s (e.g. 1G, 100M), a TBF in the
    /// network toward each host.
    #[arg(long, value_name = "RATE")]
    pub rate: Option<String>,
    /// Segmentation, receive and checksum offloads (TSO, GSO, GRO, rx/tx
    /// checksum) of every link end and bridge port [default: as the kernel
    /// sets them].
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub offload: Option<bool>,
    /// Added one-way delay of every link (netem), e.g. 1ms.
    #[arg(long, value_name = "DUR")]
    pub delay: Option<String>,
    /// Added loss of every link in percent (netem, or nftables where the
    /// kernel has no netem), e.g. 0.1%.
    #[arg(long, value_name = "PCT")]
    pub loss: Option<String>,
    /// What this machine forwards through the testbed's shapers, in bit/s
    /// of payload (e.g. 8G), instead of calibrating it when the links are
    /// first shaped: link rates and studies are held to it.
    #[arg(long, value_name = "RATE")]
    pub forwarding: Option<String>,
    /// Testbed name.
    #[command(flatten)]
    pub name: NameArgs,
}

/// Flags of `testbed set`: the conditions to change; the others stay.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct SetArgs {
    /// MTU of every link, in bytes.
    #[arg(long)]
    pub mtu: Option<u32>,
    /// Segmentation, receive and checksum offloads of every link end and
    /// bridge port.
    #[arg(long, value_name = "on|off", value_parser = parse_on_off)]
    pub offload: Option<bool>,
    /// Rate limit of every link in bit/s, or `none`.
    #[arg(long, value_name = "RATE|none")]
    pub rate: Option<String>,
    /// Added one-way delay of every link end; 0 for none.
    #[arg(long, value_name = "DUR")]
    pub delay: Option<String>,
    /// Added loss of every link end in percent; 0 for none.
    #[arg(long, value_name = "PCT")]
    pub loss: Option<String>,
    /// Testbed name.
    #[command(flatten)]
    pub name: NameArgs,
}

fn parse_on_off(s: &str) -> Result<bool, String> {
    parse_offload(s).map_err(|_| format!("{s:?}: want on or off"))
}

/// A condition flag's value, or the one-line error naming the flag.
fn flag<T>(flag: &str, r: Result<T, ConditionError>) -> Result<T> {
    r.map_err(|e| anyhow!(e.for_flag(flag)))
}

/// An optional string flag parsed by `parse`, refused naming `name`.
fn parsed<T>(
    name: &str,
    value: Option<&str>,
    parse: fn(&str) -> Result<T, ConditionError>,
) -> Result<Option<T>> {
    value.map(|v| flag(name, parse(v))).transpose()
}

impl UpArgs {
    /// The request the flags ask for; the testbed validates the rest.
    pub(crate) fn request(&self) -> Result<UpRequest> {
        Ok(UpRequest {
            name: self.name.name.clone(),
            hosts: self.hosts,
            topology: self.topology.into(),
            links: self.links,
            mtu_bytes: self.mtu,
            rate_bps: parsed("--rate", self.rate.as_deref(), parse_rate_bps)?,
            offload: self.offload,
            delay_us: parsed("--delay", self.delay.as_deref(), parse_delay_us)?,
            loss_ppm: parsed("--loss", self.loss.as_deref(), parse_loss_ppm)?,
            forwarding_bps: parsed("--forwarding", self.forwarding.as_deref(), parse_rate_bps)?,
        })
    }
}

impl SetArgs {
    /// The request the flags ask for: the condition they set.
    pub(crate) fn request(&self) -> Result<SetRequest> {
        let change = Condition {
            mtu_bytes: self
                .mtu
                .map(|m| flag("--mtu", parse_mtu(&m.to_string())))
                .transpose()?,
            offload: self.offload,
            rate_bps: parsed("--rate", self.rate.as_deref(), parse_rate_setting)?,
            delay_us: parsed("--delay", self.delay.as_deref(), parse_delay_us)?,
            loss_ppm: parsed("--loss", self.loss.as_deref(), parse_loss_ppm)?,
        };
        Ok(SetRequest {
            name: self.name.name.clone(),
            change,
        })
    }
}

/// `netgap testbed up`.
pub(crate) fn up(args: &UpArgs) -> Result<()> {
    let request = args.request()?;
    let name = request.name.clone();
    let status = netgap::testbed::up(&request, &CoordinatorProbe, &mut |n| print_note(&name, &n))?;
    print_status(&status);
    Ok(())
}

/// `netgap testbed set`.
pub(crate) fn set(args: &SetArgs) -> Result<()> {
    let request = args.request()?;
    let status = netgap::testbed::set(&request, &CoordinatorProbe)?;
    say(format!("testbed {}: {} set", request.name, request.change));
    print_status(&status);
    Ok(())
}

/// `netgap testbed status`.
pub(crate) fn status(args: &NameArgs) -> Result<()> {
    print_status(&netgap::testbed::status(&args.name, &CoordinatorProbe)?);
    Ok(())
}

/// `netgap testbed down`.
pub(crate) fn down(args: &NameArgs) -> Result<()> {
    let Removed {
        namespaces,
        processes,
        state_dir_gone,
    } = netgap::testbed::down(&args.name)?;
    say(format!(
        "testbed {} removed: {namespaces} namespaces, {processes} processes stopped{}",
        args.name,
        if state_dir_gone {
            ", state directory gone"
        } else {
            ""
        }
    ));
    Ok(())
}

/// Prints a line to stdout; a closed stdout (`| head`) is not an error
/// worth failing a command that built or removed a testbed. A line may
/// quote the hosts file (host names), which a user can edit: its control
/// characters are escaped.
fn say(line: impl std::fmt::Display) {
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stdout(),
        "{}",
        netgap::text::escape_control_lines(&line.to_string())
    );
}

/// Says what `up` does to a testbed that exists, before it does it.
pub(crate) fn print_note(name: &str, note: &UpNote) {
    say(match note {
        UpNote::Kept => format!("testbed {name} is already up with these parameters; keeping it"),
        UpNote::Changing(c) => {
            format!("testbed {name} is already up; changing its conditions to {c}")
        }
        UpNote::Rebuilding(why) => format!("rebuilding testbed {name}: {why}"),
        UpNote::RemovingRemains { namespaces } => {
            format!("removing the remains of an earlier testbed {name} ({namespaces} namespaces)")
        }
    });
}

/// Prints a testbed's status: hosts, addresses, links, conditions, the
/// shapers and live links as the kernel has them, and each agent.
pub(crate) fn print_status(status: &Status) {
    let t = match status {
        Status::NotUp { name } => return say(format!("no testbed {name} is up")),
        Status::Incomplete { name, namespaces } => {
            return say(format!(
                "testbed {name} is incomplete (namespaces {} but no hosts file); run `netgap testbed down --name {name}`",
                namespaces.join(", ")
            ))
        }
        Status::Up(t) => t,
    };
    let hosts = &t.hosts;
    say(format!(
        "testbed {}: {} hosts, {}",
        t.name,
        hosts.hosts.len(),
        hosts.topology
    ));
    if let Some(c) = t.conditions {
        say(format!(
            "conditions: {c} (each direction of a link, shaped in the network)"
        ));
        if let Some(f) = hosts.forwarding {
            let how = if f.declared {
                "declared with --forwarding".to_string()
            } else {
                format!(
                    "{} kernel TCP streams at MTU {}, calibrated when first shaped",
                    f.streams, f.mtu_bytes
                )
            };
            say(format!(
                "forwarding: this machine moves {:.1} Gbit/s through the testbed's shapers ({how}); a figure's links may sum to {:.0}% of it",
                f.payload_gbps(),
                100.0 * CARRY_SHARE
            ));
        }
        if let Some(from) = hosts.rate_scaled_from_bps {
            say(format!(
                "rate scaled from {} to what this machine carries for the figure running now",
                rate_text(from)
            ));
        }
        for s in &t.shapers {
            let qdiscs = match &s.qdiscs {
                Ok(q) => q.join("; "),
                Err(e) => format!("not read ({e})"),
            };
            let nft = if s.nft_loss {
                ", nftables loss table"
            } else {
                ""
            };
            say(format!(
                "shaper {} ({} ports toward hosts: {}): {}: {qdiscs}{nft}",
                s.netns,
                s.ports.len(),
                s.ports.join(","),
                s.ports.first().map(String::as_str).unwrap_or_default()
            ));
        }
        match t.host_link_queues {
            Some(1) => say("host links: 1 queue each way (this kernel keeps no netgap frame's queue across the switch)"),
            Some(q) => say(format!(
                "host links: {q} queues each way; a netgap frame arrives on the queue it was sent on"
            )),
            None => {}
        }
        match &t.live_links {
            Some(LiveLinks::AsRecorded) => {
                say("live links: as the hosts file says (read from the kernel)")
            }
            Some(LiveLinks::Differ(d)) => {
                say("live links DIFFER from the hosts file (read from the kernel):");
                for line in d {
                    say(format!("  {line}"));
                }
            }
            Some(LiveLinks::NotRead(e)) => say(format!("live links: not read ({e})")),
            None => {}
        }
    }
    say(format!("hosts file: {}", t.hosts_path.display()));
    if let Some(k) = &hosts.key_file {
        say(format!("key: {}", k.display()));
    }
    for (h, agent) in hosts.hosts.iter().zip(&t.agents) {
        let agent = match agent {
            AgentState::Answers { pid } => format!("agent answers (pid {})", pid.unwrap_or(0)),
            AgentState::Silent { pid, why } => {
                format!("agent pid {pid} alive, not answering: {why}")
            }
            AgentState::Down => "agent DOWN".to_string(),
        };
        say(format!(
            "  {:<4} {:<16} {:<15} {:<24} {agent}",
            h.name,
            h.netns.as_deref().unwrap_or("-"),
            h.address,
            h.control
        ));
        for l in &h.links {
            say(format!(
                "       link {}#{} {} {} -> {}",
                l.peer, l.index, l.ifname, l.local, l.remote
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn set_args() -> SetArgs {
        SetArgs {
            mtu: None,
            offload: None,
            rate: None,
            delay: None,
            loss: None,
            name: NameArgs {
                name: "testbed".into(),
            },
        }
    }

    #[test]
    fn set_flags_are_refused_naming_the_flag() {
        let mut a = set_args();
        a.rate = Some("none".into());
        a.offload = Some(false);
        let c = a.request().expect("valid").change;
        assert_eq!(
            (c.rate_bps, c.offload, c.mtu_bytes),
            (Some(None), Some(false), None)
        );
        a.loss = Some("300%".into());
        let e = a.request().expect_err("bad loss").to_string();
        assert_eq!(e, "--loss 300%: want 0% to 100%");
        a.loss = None;
        a.mtu = Some(10);
        assert!(a
            .request()
            .is_err_and(|e| e.to_string().starts_with("--mtu 10")));
    }

    #[test]
    fn up_flags_are_refused_naming_the_flag() {
        let mut a = UpArgs {
            hosts: 4,
            topology: TopologyArg::Switch,
            links: 1,
            mtu: 1500,
            rate: None,
            offload: None,
            delay: None,
            loss: None,
            forwarding: None,
            name: NameArgs {
                name: "testbed".into(),
            },
        };
        assert!(a.request().is_ok());
        a.rate = Some("x".into());
        assert!(a
            .request()
            .is_err_and(|e| e.to_string().starts_with("--rate")));
        a.rate = None;
        a.forwarding = Some("lots".into());
        assert!(a
            .request()
            .is_err_and(|e| e.to_string().starts_with("--forwarding")));
        a.forwarding = Some("3G".into());
        assert_eq!(
            a.request().expect("valid").forwarding_bps,
            Some(3_000_000_000)
        );
    }
}
