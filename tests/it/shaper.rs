//! The testbed's shaper, in the network: a link held to 1 Gbit/s holds
//! every stack's stream at or under its payload limit (tcp, udp, and xdp
//! when built with the `xdp` feature, whose frames skip the sending host's
//! qdiscs), a 1 MiB ping-pong takes at least what its model allows after
//! the bucket, `testbed status` shows the shaping namespace's qdisc, a loss
//! is applied (by netem, or nftables where the kernel has no netem) and
//! named in the records, and `down` leaves no namespace.
//!
//! The checks are upper bounds the wire sets, never a speed the machine
//! must reach: a loaded machine measures less, never more. Without root and
//! namespaces each test says why and passes (with
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 it fails, as in CI).

use crate::common::testbed::Testbed;
use crate::common::{netgap, ok, system_ready};
use serde_json::Value;
use std::process::Command;

/// The link's rate, bit/s.
const RATE_BPS: f64 = 1e9;
/// The testbed's MTU.
const MTU: f64 = 1500.0;
/// Ethernet's header, which the shaper counts in each frame.
const ETH_BYTES: f64 = 14.0;

fn sh(program: &str, args: &[&str]) -> String {
    ok(Command::new(program)
        .args(args)
        .output()
        .expect("command runs"))
}

/// The most payload a stack's frames can carry at the link's rate, Gbit/s:
/// tcp after IP and TCP headers with timestamps (1448 of 1514), udp's
/// fragments after IP's (1480 of 1514, the UDP header aside), and xdp's
/// frames at most their whole IP-sized part (its own header aside).
fn payload_limit_gbps(transport: &str) -> f64 {
    let payload = match transport {
        "tcp" => MTU - 52.0,
        "udp" => MTU - 20.0,
        _ => MTU,
    };
    RATE_BPS / 1e9 * payload / (MTU + ETH_BYTES)
}

/// Every repetition of every record at or under its transport's payload
/// limit plus 1%.
fn assert_within_limits(recs: &[Value]) {
    for r in recs {
        let transport = r["transport"].as_str().expect("transport");
        let limit = payload_limit_gbps(transport);
        assert_eq!(r["stack"]["path"]["rate_bps"], 1_000_000_000u64, "{r}");
        assert!(
            r["stack"]["path"]["bucket_bytes"].as_u64().is_some(),
            "the record states the bucket: {}",
            r["stack"]["path"]
        );
        for v in r["stats"]["reps"].as_array().expect("reps") {
            let v = v.as_f64().expect("value");
            assert!(
                v > 0.0 && v <= limit * 1.01,
                "{transport}: {v} Gbit/s over its payload limit {limit:.4} (+1%)"
            );
        }
    }
}

#[test]
fn streams_of_every_stack_and_a_ping_pong_are_held_by_the_link() {
    if !system_ready("streams_of_every_stack_and_a_ping_pong_are_held_by_the_link") {
        return;
    }
    let (tb, _) = Testbed::up("tshape", &["--hosts", "2", "--rate", "1G"]);
    let dir = tempfile::tempdir().expect("tempdir");
    // Long enough repetitions that the bucket (64 KiB, half a millisecond at
    // the rate) is under 1% of each.
    let recs = tb.run(
        "stream",
        &[
            "-t",
            "tcp,udp",
            "-s",
            "32K",
            "--reps",
            "3",
            "--rep-time",
            "300ms",
        ],
        &dir.path().join("s.jsonl"),
    );
    assert_eq!(recs.len(), 2, "tcp and udp");
    assert_within_limits(&recs);
    let bucket = recs[0]["stack"]["path"]["bucket_bytes"]
        .as_u64()
        .expect("bucket");

    // A 1 MiB ping-pong: after an idle moment only the bucket passes at
    // memory speed, the rest at the rate.
    let recs = tb.run(
        "pingpong",
        &["-s", "1M", "--reps", "3", "-n", "5"],
        &dir.path().join("p.jsonl"),
    );
    let size = recs[0]["size_bytes"].as_u64().expect("size");
    let model_min_us = (size - bucket) as f64 * 8.0 / RATE_BPS * 1e6;
    for v in recs[0]["stats"]["reps"].as_array().expect("reps") {
        let us = v.as_f64().expect("value");
        assert!(
            us >= model_min_us,
            "a {size}-byte one-way transfer in {us} us, under the model's {model_min_us:.0} us"
        );
    }
    let _ = tb.down();
    tb.assert_gone();
}

/// On a switch a host's link holds what it sends as well as what it
/// receives: one server streaming to two client hosts at once (fan-out)
/// shares its one 1 Gbit/s uplink, though each client's port could take
/// the rate by itself.
#[test]
fn a_host_sending_to_several_at_once_is_held_by_its_own_link() {
    if !system_ready("a_host_sending_to_several_at_once_is_held_by_its_own_link") {
        return;
    }
    let (tb, _) = Testbed::up("tshapeup", &["--hosts", "3", "--rate", "1G"]);
    let dir = tempfile::tempdir().expect("tempdir");
    // Each client host counts its own window, opened when its role
    // starts: under load the two start some milliseconds apart, and the
    // first counts a moment of the whole uplink. Windows of 2 s keep that
    // under the 1% the check allows.
    let recs = tb.run(
        "fanout",
        &["--clients", "2", "--reps", "2", "--duration", "2s"],
        &dir.path().join("f.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    assert_eq!(recs[0]["client_hosts"], 2, "{}", recs[0]);
    // Each client host counts its own window, and under a full test run
    // their windows can fall apart enough for the sum to pass the uplink:
    // then the record must say so (its physics names the fault), never
    // pass it off as a clean point.
    if recs[0]["physics"]["fault"].is_null() {
        assert_within_limits(&recs);
    } else {
        assert_eq!(
            recs[0]["physics"]["fault"]["kind"], "above_payload_limit",
            "{}",
            recs[0]["physics"]
        );
    }
    let _ = tb.down();
    tb.assert_gone();
}

/// xdp's frames skip the sending host's qdiscs; shaped in the network, the
/// link holds them as it holds the kernel's.
#[cfg(feature = "xdp")]
#[test]
fn an_xdp_stream_is_held_by_the_link() {
    if !system_ready("an_xdp_stream_is_held_by_the_link") {
        return;
    }
    let (tb, _) = Testbed::up("tshapex", &["--hosts", "2", "--rate", "1G"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "stream",
        &[
            "-t",
            "xdp",
            "-s",
            "32K",
            "--reps",
            "3",
            "--rep-time",
            "300ms",
        ],
        &dir.path().join("x.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    assert_within_limits(&recs);
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn a_mesh_is_shaped_in_its_links_namespaces_with_loss_named_and_down_removes_them() {
    if !system_ready(
        "a_mesh_is_shaped_in_its_links_namespaces_with_loss_named_and_down_removes_them",
    ) {
        return;
    }
    let (tb, out) = Testbed::up(
        "tshapem",
        &[
            "--hosts",
            "2",
            "--topology",
            "mesh",
            "--links",
            "2",
            "--rate",
            "1G",
        ],
    );
    // Status reads the shaper from the link's own namespace.
    for k in 0..2 {
        let ns = tb.ns(&format!("l{k}"));
        let line = out
            .lines()
            .find(|l| l.starts_with(&format!("shaper {ns} ")))
            .unwrap_or_else(|| panic!("no shaper line for {ns}: {out}"));
        assert!(
            line.contains("tbf") && line.contains("rate 1Gbit"),
            "{line}"
        );
    }
    assert!(out.contains("live links: as the hosts file says"), "{out}");
    let before = tb.hosts().conditions.expect("conditions");
    assert_eq!(before.bucket_bytes, Some(131_328));

    // A delay needs netem: where the kernel lacks it, one line and nothing
    // changed.
    let out = netgap()
        .args(["testbed", "set", "--name", "tshapem", "--delay", "1ms"])
        .output()
        .expect("set");
    if !out.status.success() {
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains("netem") && stderr.contains("nothing was changed"),
            "{stderr}"
        );
        assert_eq!(tb.hosts().conditions, Some(before));
    } else {
        let q = sh("tc", &["-n", &tb.ns("l0"), "qdisc", "show", "dev", "h1"]);
        assert!(q.contains("netem") && q.contains("tbf"), "{q}");
        ok(netgap()
            .args(["testbed", "set", "--name", "tshapem", "--delay", "0"])
            .output()
            .expect("set"));
    }

    // A loss: netem where the kernel has it, else nftables in the link's
    // namespace; the record names which.
    let out = ok(netgap()
        .args(["testbed", "set", "--name", "tshapem", "--loss", "1%"])
        .output()
        .expect("set"));
    assert!(out.contains("live links: as the hosts file says"), "{out}");
    let c = tb.hosts().conditions.expect("conditions");
    let by = c.loss_by.expect("loss mechanism").as_str();
    let ruleset = sh(
        "ip",
        &["netns", "exec", &tb.ns("l0"), "nft", "list", "ruleset"],
    );
    if by == "nftables" {
        assert!(
            ruleset.contains("numgen random mod 1000000 < 10000"),
            "{ruleset}"
        );
    } else {
        assert!(!ruleset.contains("netgap"), "{ruleset}");
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "stream",
        &["-s", "16K", "--reps", "2", "-n", "200"],
        &dir.path().join("l.jsonl"),
    );
    let path = &recs[0]["stack"]["path"];
    assert_eq!(path["loss_ppm"], 10_000, "{path}");
    assert_eq!(path["loss_by"], by, "{path}");
    // Back to no loss: the table goes.
    ok(netgap()
        .args(["testbed", "set", "--name", "tshapem", "--loss", "0"])
        .output()
        .expect("set"));
    let ruleset = sh(
        "ip",
        &["netns", "exec", &tb.ns("l0"), "nft", "list", "ruleset"],
    );
    assert!(!ruleset.contains("netgap"), "{ruleset}");

    let out = tb.down();
    assert!(out.contains("4 namespaces"), "2 hosts and 2 links: {out}");
    tb.assert_gone();
}
