//! The `xdp` transport (AF_XDP, user-level networking) between two hosts of
//! a namespace testbed: every point-to-point test in both modes with
//! `--verify` (the conformance matrix for a transport that needs two
//! hosts), then the same with 1% of the frames dropped on the link,
//! still verified, with the retransmissions counted in the records.
//!
//! Loss: this kernel may lack netem (and tc's gact action), so the test
//! drops frames with an nftables rule on the testbed's bridge (`numgen
//! random mod 100 < 1 drop` in the bridge's forward hook), which every
//! frame between two hosts crosses, raw Ethernet frames included; an
//! AF_XDP socket's own transmissions bypass the sending host's qdiscs, so
//! a loss at the link ends would not touch them.
//!
//! Runs only in a build with the `xdp` feature (`cargo test --features xdp
//! --test xdp`); otherwise, or without root and namespaces, it prints why
//! and passes (with NETGAP_REQUIRE_SYSTEM_TESTS=1 a missing testbed is a
//! failure, as in CI).

mod common;
use common::testbed::Testbed;
use common::{netgap, ok, system_ready};
use netgap::bench;
use serde_json::Value;
use std::process::Command;

fn xdp_ready(test: &str) -> bool {
    if !cfg!(feature = "xdp") {
        eprintln!("skipping {test}: built without the xdp feature (cargo test --features xdp)");
        return false;
    }
    system_ready(test)
}

fn n(v: &Value) -> u64 {
    v.as_u64().unwrap_or(0)
}

/// Retransmissions both ends counted in a record.
fn retries(r: &Value) -> u64 {
    n(&r["datagrams"]["client"]["retries"]) + n(&r["datagrams"]["server"]["retries"])
}

/// Runs `tests` over xdp in both modes with `--verify`; the records.
fn run_verified(tb: &Testbed, tests: &str, sizes: &str, json: &std::path::Path) -> Vec<Value> {
    tb.run(
        tests,
        &[
            "-t",
            "xdp",
            "--mode",
            "event,poll",
            "--sizes",
            sizes,
            "--reps",
            "2",
            "--rep-time",
            "10ms",
            "--verify",
        ],
        json,
    )
}

fn check_records(recs: &[Value], tests: usize, sizes: usize) {
    assert_eq!(
        recs.len(),
        tests * 2 * sizes,
        "one record per test, mode and size"
    );
    for r in recs {
        assert_eq!(r["transport"], "xdp", "{r}");
        assert_eq!(r["options"]["verify"], true, "{r}");
        // Where the program attached (native or generic XDP) sets the
        // stack apart, so the record says which.
        let choices: Vec<&str> = r["stack"]["options"]
            .as_array()
            .expect("stack options")
            .iter()
            .filter_map(|o| o.as_str())
            .filter(|o| o.starts_with("xdp_attach="))
            .collect();
        assert!(
            choices == ["xdp_attach=native"] || choices == ["xdp_attach=generic"],
            "{r}"
        );
        let b = &r["bytes"];
        assert_eq!(b["client_tx"], b["server_rx"], "{r}");
        assert_eq!(b["server_tx"], b["client_rx"], "{r}");
        // The flow's frame counters are in the record, and nothing was
        // given up as lost: the transport is reliable.
        let d = &r["datagrams"];
        assert!(n(&d["client"]["datagrams_sent"]) > 0, "{r}");
        assert_eq!(
            n(&d["client"]["lost_bytes"]) + n(&d["server"]["lost_bytes"]),
            0
        );
    }
}

#[test]
fn every_test_runs_over_xdp_between_two_hosts_verified_with_and_without_loss() {
    let name = "every_test_runs_over_xdp_between_two_hosts_verified_with_and_without_loss";
    if !xdp_ready(name) {
        return;
    }
    let list = ok(netgap().arg("list").output().expect("list"));
    let row: Vec<&str> = list
        .lines()
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .find(|w| w.first() == Some(&"xdp"))
        .expect("xdp listed");
    assert_eq!(row.get(1), Some(&"yes"), "{list}");

    // Without two hosts it refuses in one line.
    let out = netgap()
        .args(["run", "pingpong", "-t", "xdp", "--reps", "1"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("between two hosts"), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let (tb, _) = Testbed::up("xdp2", &["--hosts", "2"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let tests: Vec<&str> = bench::registry().iter().map(|t| t.name()).collect();
    // One byte, a message of three frames, and one of hundreds.
    let recs = run_verified(
        &tb,
        &tests.join(","),
        "1,4K,256K",
        &dir.path().join("clean.jsonl"),
    );
    check_records(&recs, tests.len(), 3);

    // 1% of the frames crossing the bridge dropped, both ways.
    let sw = tb.ns("sw");
    let nft = |args: &[&str]| {
        ok(Command::new("ip")
            .args(["netns", "exec", &sw, "nft"])
            .args(args)
            .output()
            .expect("nft"))
    };
    nft(&["add", "table", "bridge", "netgap_loss"]);
    nft(&[
        "add",
        "chain",
        "bridge",
        "netgap_loss",
        "lossy",
        "{ type filter hook forward priority 0 ; }",
    ]);
    nft(&[
        "add",
        "rule",
        "bridge",
        "netgap_loss",
        "lossy",
        "numgen",
        "random",
        "mod",
        "100",
        "<",
        "1",
        "counter",
        "drop",
    ]);
    let lossy = "pingpong,stream,bibw,bibw-pingpong";
    let recs = run_verified(&tb, lossy, "1,64K", &dir.path().join("lossy.jsonl"));
    check_records(&recs, 4, 2);
    let ruleset = nft(&["list", "table", "bridge", "netgap_loss"]);
    let dropped: u64 = ruleset
        .split("packets ")
        .nth(1)
        .and_then(|s| s.split_whitespace().next())
        .and_then(|s| s.parse().ok())
        .expect("the rule's counter");
    assert!(dropped > 0, "the bridge dropped nothing: {ruleset}");
    let resent: u64 = recs.iter().map(retries).sum();
    assert!(
        resent > 0,
        "{dropped} frames dropped, but no retransmission was counted"
    );
    let _ = tb.down();
    tb.assert_gone();
}
