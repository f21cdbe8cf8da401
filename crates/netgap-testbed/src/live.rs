//! The testbed's links as the kernel has them now: each link end's MTU,
//! queues, offloads and root queueing discipline, read from the kernel rather than
//! from the hosts file, so `status` can say where the two differ and a run
//! can put back exactly what it found.
//!
//! The kernel's own offload state of a freshly built testbed is saved
//! (`kernel-links.json` in its state directory) before any condition
//! touches it: "offload as the kernel set it" is that record, so a testbed
//! switched to `offload=off` and back gets every feature back as it was.

use crate::command::{ip, run};
use crate::netns_ops;
use crate::state::STATE_FILE_MODE;
use crate::TestbedError;
use netgap_core::link::LinkConditions;
use netgap_workload::confined::Dir;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::Path;

/// The name of the file that keeps the kernel's own state of the links.
const KERNEL_LINKS_FILE: &str = "kernel-links.json";

/// One link end (or bridge port) as the kernel has it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct EndState {
    /// Its namespace.
    pub ns: String,
    /// Its interface.
    pub dev: String,
    /// Its MTU in bytes.
    pub mtu_bytes: u32,
    /// Its transmit queues (as many receive queues: the testbed makes
    /// both alike); 0 in a record from before netgap read them.
    #[serde(default)]
    pub queues: u32,
    /// Each offload netgap switches, by `ethtool -k`'s name: on or off.
    pub offloads: BTreeMap<String, bool>,
    /// The kind of its root queueing discipline (`noqueue`, `tbf`,
    /// `netem`).
    pub qdisc: String,
}

/// Reads the state of every end of `ends` (`(namespace, interface)`).
pub(crate) fn read(ends: &[(String, String)]) -> Result<Vec<EndState>, TestbedError> {
    let mut by_ns: Vec<(String, Vec<String>)> = Vec::new();
    for (ns, dev) in ends {
        match by_ns.iter_mut().find(|(n, _)| n == ns) {
            Some((_, devs)) => devs.push(dev.clone()),
            None => by_ns.push((ns.clone(), vec![dev.clone()])),
        }
    }
    let mut out = Vec::with_capacity(ends.len());
    for (ns, devs) in &by_ns {
        let offloads = netns_ops::read_offloads(ns, devs)?;
        for (dev, offloads) in devs.iter().zip(offloads) {
            let (mtu_bytes, queues) = read_mtu_and_queues(ns, dev)?;
            out.push(EndState {
                ns: ns.clone(),
                dev: dev.clone(),
                mtu_bytes,
                queues,
                offloads,
                qdisc: read_root_qdisc(ns, dev)?,
            });
        }
    }
    Ok(out)
}

/// The MTU and the transmit queues of `dev` in `ns` (`ip -d -j link
/// show`).
pub(crate) fn read_mtu_and_queues(ns: &str, dev: &str) -> Result<(u32, u32), TestbedError> {
    let text = ip(&["-n", ns, "-d", "-j", "link", "show", "dev", dev])?;
    let bad = |detail: String| TestbedError::Command {
        cmd: format!("ip -n {ns} -d -j link show dev {dev}"),
        detail,
    };
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
    let field = |key: &str| {
        v.get(0)
            .and_then(|l| l.get(key))
            .and_then(serde_json::Value::as_u64)
            .and_then(|n| u32::try_from(n).ok())
            .ok_or_else(|| bad(format!("no {key} in its answer")))
    };
    Ok((field("mtu")?, field("num_tx_queues")?))
}

/// The kind of the root qdisc of `dev` in `ns` (`tc qdisc show ... root`).
fn read_root_qdisc(ns: &str, dev: &str) -> Result<String, TestbedError> {
    let text = run("tc", &["-n", ns, "qdisc", "show", "dev", dev, "root"])?;
    // "qdisc tbf 1: root refcnt 2 rate 1Gbit ..."
    Ok(text
        .split_whitespace()
        .nth(1)
        .unwrap_or("noqueue")
        .to_string())
}

/// Every qdisc of `dev` in `ns`, one line each as `tc qdisc show` gives
/// them (`tbf 1: root refcnt 2 rate 1Gbit burst 131250b lat 50ms`).
pub(crate) fn qdisc_lines(ns: &str, dev: &str) -> Result<Vec<String>, TestbedError> {
    let text = run("tc", &["-n", ns, "qdisc", "show", "dev", dev])?;
    Ok(text
        .lines()
        .map(|l| l.trim().trim_start_matches("qdisc ").to_string())
        .filter(|l| !l.is_empty())
        .collect())
}

/// The kind of root qdisc a shaping point has under `c`: netem at the root
/// when there is a delay or a loss netem drops, else the TBF, else veth's
/// default.
fn expected_root_qdisc(c: &LinkConditions) -> &'static str {
    match c.qdisc() {
        "netem+tbf" | "netem" => "netem",
        other => other,
    }
}

/// Saves the kernel's own state of a fresh testbed's links in its state
/// directory `dir`, as a new file (once per build: the directory is new).
pub(crate) fn save_kernel(dir: &Dir, ends: &[EndState]) -> Result<(), TestbedError> {
    let text = serde_json::to_string_pretty(ends).map_err(|e| TestbedError::Io {
        what: format!("writing {KERNEL_LINKS_FILE}"),
        source: std::io::Error::other(e),
    })?;
    dir.write_file(KERNEL_LINKS_FILE, (text + "\n").as_bytes(), STATE_FILE_MODE)?;
    Ok(())
}

/// The kernel's own state of the links, as saved when the testbed was
/// built; `None` for a testbed built before netgap saved it.
pub(crate) fn load_kernel(dir: &Path) -> Option<Vec<EndState>> {
    let text = std::fs::read_to_string(dir.join(KERNEL_LINKS_FILE)).ok()?;
    serde_json::from_str(&text).ok()
}

/// Where the live state differs from `expected` (the hosts file's
/// conditions; "offload as the kernel set it" read against `kernel`), one
/// line each. Only the `shaping` points carry netgap's qdiscs; every other
/// end keeps veth's default.
pub(crate) fn differences(
    live: &[EndState],
    expected: &LinkConditions,
    kernel: Option<&[EndState]>,
    shaping: &[(String, String)],
) -> Vec<String> {
    let mut out = Vec::new();
    for end in live {
        let at = format!("{}/{}", end.ns, end.dev);
        if end.mtu_bytes != expected.mtu_bytes {
            out.push(format!(
                "{at}: MTU {} (hosts file: {})",
                end.mtu_bytes, expected.mtu_bytes
            ));
        }
        let shaped = shaping
            .iter()
            .any(|(ns, dev)| *ns == end.ns && *dev == end.dev);
        let want_qdisc = if shaped {
            expected_root_qdisc(expected)
        } else {
            "noqueue"
        };
        if end.qdisc != want_qdisc {
            out.push(format!(
                "{at}: root qdisc {} (hosts file: {want_qdisc})",
                end.qdisc
            ));
        }
        let kernel_end = kernel.and_then(|k| k.iter().find(|k| k.ns == end.ns && k.dev == end.dev));
        for (feature, &on) in &end.offloads {
            let want = match expected.offload {
                Some(all) => Some(all),
                None => kernel_end.and_then(|k| k.offloads.get(feature).copied()),
            };
            let Some(want) = want else { continue };
            if on != want {
                let said = match expected.offload {
                    Some(_) => "",
                    None => "as the kernel set it: ",
                };
                out.push(format!(
                    "{at}: {feature} {} (hosts file: {said}{})",
                    on_off(on),
                    on_off(want)
                ));
            }
        }
    }
    out
}

fn on_off(on: bool) -> &'static str {
    if on {
        "on"
    } else {
        "off"
    }
}

/// Puts each end's offloads back to exactly what `kernel` recorded.
pub(crate) fn restore_offloads(
    ends: &[(String, String)],
    kernel: &[EndState],
) -> Result<(), TestbedError> {
    for (ns, dev) in ends {
        let Some(k) = kernel.iter().find(|k| &k.ns == ns && &k.dev == dev) else {
            return Err(TestbedError::Args(format!(
                "the testbed recorded no kernel offloads for {ns}/{dev}; rebuild it with `netgap testbed up`"
            )));
        };
        netns_ops::restore_offloads(ns, dev, &k.offloads)?;
    }
    Ok(())
}

/// Puts the MTU and offloads of every end back to `snapshot` (what a run
/// found), where the live state differs.
pub(crate) fn restore_snapshot(snapshot: &[EndState]) -> Result<(), TestbedError> {
    let ends: Vec<(String, String)> = snapshot
        .iter()
        .map(|e| (e.ns.clone(), e.dev.clone()))
        .collect();
    let live = read(&ends)?;
    for (was, now) in snapshot.iter().zip(&live) {
        if was.offloads != now.offloads {
            netns_ops::restore_offloads(&was.ns, &was.dev, &was.offloads)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(mtu: u32, gso: bool, qdisc: &str) -> EndState {
        EndState {
            ns: "ngtb-h1".into(),
            dev: "eth0".into(),
            mtu_bytes: mtu,
            queues: 32,
            offloads: [("generic-segmentation-offload".to_string(), gso)].into(),
            qdisc: qdisc.into(),
        }
    }

    #[test]
    fn differences_name_each_end_and_read_kernel_offloads_against_the_record() {
        let c = LinkConditions::plain(1500);
        let kernel = [end(1500, true, "noqueue")];
        let shaping = [("ngtb-h1".to_string(), "eth0".to_string())];
        assert!(differences(&kernel, &c, Some(&kernel), &shaping).is_empty());
        let live = [end(9000, false, "tbf")];
        let d = differences(&live, &c, Some(&kernel), &shaping);
        assert_eq!(d.len(), 3, "{d:?}");
        assert!(d[0].contains("ngtb-h1/eth0: MTU 9000 (hosts file: 1500)"));
        assert!(d[1].contains("root qdisc tbf (hosts file: noqueue)"));
        assert!(
            d[2].contains(
                "generic-segmentation-offload off (hosts file: as the kernel set it: on)"
            ),
            "{d:?}"
        );
        let mut off = c;
        off.offload = Some(false);
        assert!(differences(&[end(1500, false, "noqueue")], &off, None, &shaping).is_empty());
        // An end that is not a shaping point keeps veth's default under a
        // rate limit; a TBF there is a difference.
        let mut rated = c;
        rated.rate_bps = Some(1_000_000_000);
        assert!(differences(&[end(1500, true, "noqueue")], &rated, None, &[]).is_empty());
        assert_eq!(
            differences(&[end(1500, true, "tbf")], &rated, None, &[]).len(),
            1
        );
    }
}
