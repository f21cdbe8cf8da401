//! Multipath TCP across a testbed with several links per host pair:
//! `netgap testbed up --topology mesh --links 3` (or `--topology switch
//! --links 2`, a switch per link) gives every host an MPTCP endpoint per
//! link, so one `mptcp` connection between two hosts opens a subflow on
//! each link. The test runs
//! a verified stream over it and checks each link's interface counters.
//!
//! Without root, `ip` or network namespaces (or without MPTCP in the
//! kernel) the test prints why and passes, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1, where a missing testbed is a failure.

use crate::common;
use crate::common::testbed::{link_bytes, Testbed};
use crate::common::{netgap, ok, system_ready};
use std::process::Command;

#[test]
fn one_mptcp_stream_over_a_three_link_mesh_uses_every_link() {
    let test = "one_mptcp_stream_over_a_three_link_mesh_uses_every_link";
    if !system_ready(test) {
        return;
    }
    if !std::path::Path::new("/proc/sys/net/mptcp/enabled").exists() {
        common::skip(test, "this kernel has no multipath TCP");
        return;
    }
    let (tb, _) = Testbed::up(
        "mptcp3",
        // Each link far slower than one subflow could go, even from a debug
        // build on a busy machine, so the scheduler spreads the stream over
        // every subflow rather than filling one or two.
        &[
            "--hosts",
            "2",
            "--topology",
            "mesh",
            "--links",
            "3",
            "--rate",
            "50M",
        ],
    );
    stream_uses_every_link(&tb, 3);

    // `netgap list` shows the transport as usable here.
    let list = ok(netgap().arg("list").output().expect("list"));
    let row: Vec<&str> = list
        .lines()
        .map(str::split_whitespace)
        .map(Iterator::collect)
        .find(|w: &Vec<&str>| w.first() == Some(&"mptcp"))
        .expect("mptcp listed");
    assert_eq!(row.get(1), Some(&"yes"), "{list}");
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn one_mptcp_stream_over_a_two_link_switch_uses_both_switches() {
    let test = "one_mptcp_stream_over_a_two_link_switch_uses_both_switches";
    if !system_ready(test) {
        return;
    }
    if !std::path::Path::new("/proc/sys/net/mptcp/enabled").exists() {
        common::skip(test, "this kernel has no multipath TCP");
        return;
    }
    // Three hosts: each host's address on a switch is announced once,
    // however many hosts share it.
    let (tb, _) = Testbed::up(
        "mptcpsw",
        &[
            "--hosts",
            "3",
            "--topology",
            "switch",
            "--links",
            "2",
            "--rate",
            "50M",
        ],
    );
    stream_uses_every_link(&tb, 2);
    let _ = tb.down();
    tb.assert_gone();
}

/// One verified `mptcp` stream from the second host of `tb` to the first
/// moves data on each of their `links` links.
fn stream_uses_every_link(tb: &Testbed, links: usize) {
    let hosts = tb.hosts();
    let client = &hosts.hosts[1];
    let server = &hosts.hosts[0];
    let ns = tb.ns(&client.name);
    let endpoints = ok(Command::new("ip")
        .args(["-n", &ns, "mptcp", "endpoint", "show"])
        .output()
        .expect("ip mptcp"));
    let rails: Vec<_> = client.links_to(&server.name).cloned().collect();
    assert_eq!(rails.len(), links);
    for l in &rails {
        assert!(
            endpoints.contains(&l.local.to_string()),
            "no endpoint for {}: {endpoints}",
            l.local
        );
    }
    let before: Vec<u64> = rails.iter().map(|l| link_bytes(&ns, &l.ifname)).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "stream",
        &[
            "-t",
            "mptcp",
            "--sizes",
            "64K",
            "--reps",
            "2",
            // The server announces its other addresses one at a time, each
            // after the previous echo; on a loaded machine the last subflow
            // can join a few hundred milliseconds into the run, so the run
            // is long enough for a late subflow to carry data too.
            "--warmup",
            "64",
            "--rep-time",
            "1s",
            "--verify",
        ],
        &dir.path().join("mptcp.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0]["transport"], "mptcp");
    let reps = recs[0]["stats"]["reps"].as_array().expect("reps");
    assert_eq!(reps.len(), 2, "{}", recs[0]);
    assert!(recs[0]["value"].as_f64().expect("bandwidth") > 0.0);
    for (k, l) in rails.iter().enumerate() {
        let moved = link_bytes(&ns, &l.ifname) - before[k];
        // A subflow on the link carries data, not just its handshake and a
        // few acks.
        assert!(
            moved > 20_000,
            "link {k} ({}) moved only {moved} bytes",
            l.ifname
        );
    }
}
