//! The links' conditions (`testbed set`, a run's switch): rate, delay and
//! loss as TBF, netem and nftables in the network, what the kernel can
//! apply, and the rate the machine carries.

use crate::command::{ip, ns_prefix, preflight, run};
use crate::layout::{bridges, link_ends, shaping_points, switch_netns};
use crate::request::check_name;
use crate::state::{load_state, open_state, save_hosts, save_params};
use crate::status::group_by_ns;
use crate::up::carried;
use crate::{
    capacity, live, netns_ops, shaper_bucket_bytes, state_dir, status, AgentProbe, Params,
    SetRequest, Status, TestbedError, TestbedLock, Topology, TBF_LATENCY_MS,
};
use netgap_core::hosts::{Forwarding, HostsFile};
use netgap_core::link::{LinkConditions, LossMechanism};

/// Smallest netem queue, in packets (netem's own default).
const NETEM_MIN_LIMIT: u64 = 1000;
/// Largest netem queue, in packets.
const NETEM_MAX_LIMIT: u64 = 1_000_000;
/// The rate a netem queue is sized for when no rate limit is set, bit/s:
/// veth moves some tens of Gbit/s.
const NETEM_ASSUMED_RATE_BPS: u64 = 100_000_000_000;
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
pub(crate) fn nft_loss(ns: &str, loss_ppm: Option<u32>, fresh: bool) -> Result<(), TestbedError> {
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
pub(crate) fn has_nft_loss(ns: &str) -> bool {
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
pub(crate) fn resolve(name: &str, to: &LinkConditions) -> Result<LinkConditions, TestbedError> {
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

/// Puts every link of testbed `name` (built with `p`) under `to` (as
/// [`resolve`] gave it); `from` is what they are under now (resolved too),
/// `None` right after they were made (with `to`'s MTU and no qdisc).
/// Changes only what differs.
pub(crate) fn condition_links(
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
pub(crate) fn check_carried(hosts: &HostsFile, c: &LinkConditions) -> Result<(), TestbedError> {
    match hosts.forwarding {
        Some(f) => check_rate(&f, c),
        None => Ok(()),
    }
}

/// Refuses `c`'s link rate when one link at it takes more than a machine
/// forwarding `f` carries.
pub(crate) fn check_rate(f: &Forwarding, c: &LinkConditions) -> Result<(), TestbedError> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
