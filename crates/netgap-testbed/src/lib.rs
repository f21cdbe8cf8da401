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
//! [`HostsFile`]: netgap_core::hosts::HostsFile
//! [`Dir`]: netgap_workload::confined::Dir
//! [`Dir::replace_file`]: netgap_workload::confined::Dir::replace_file
//!
//! Queues: every host link has [`HOST_QUEUES`] queues each way, and the
//! xdp transport's frames keep their queue across every bridge, through a
//! shaped port too (`queue_path`), so a connection with a queue of its own
//! at both hosts gets its frames there. `kernel-links.json` records each
//! link end's queues.
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
//! ends. `down` (and a study's testbed when it goes) removes the lock file
//! while it still holds the lock, and a taker checks that the file it
//! locked is still the one the name names, so no testbed that is gone
//! leaves its lock file behind and no two commands ever hold one.

mod agents;
pub mod capacity;
mod command;
mod down;
mod error;
mod holder;
mod layout;
mod live;
mod lock;
mod mptcp;
mod netns_ops;
mod queue_path;
mod request;
mod shaping;
mod state;
mod status;
mod switch;
mod up;

pub use agents::probe_agent;
pub use down::{down, Removed};
pub use error::{AgentProbeError, InterruptError, TestbedError, Unhealthy};
pub use holder::Holder;
pub use lock::TestbedLock;
pub use queue_path::HOST_QUEUES;
pub use request::{AgentProbe, Params, ProbeFailure, SetRequest, Topology, UpRequest};
pub use shaping::{scale_rate, set, set_conditions, Scaled};
pub use status::{status, AgentState, LiveLinks, Shaper, Status, UpStatus};
pub use switch::{OwnedTestbed, TestbedSwitch};
pub use up::{up, UpNote};

pub use netgap_core::hosts::{
    default_hosts_path, state_dir, DEFAULT_TESTBED as DEFAULT_NAME,
    TESTBED_STATE_ROOT as STATE_ROOT,
};
pub use netgap_core::link::shaper_bucket_bytes;
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
