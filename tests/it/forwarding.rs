//! A rate the machine can carry: a testbed knows what its machine forwards
//! through its shapers (calibrated when first shaped, or declared with
//! `--forwarding`), refuses a link rate or a run whose links at once would
//! take more than it carries, in one line naming the rate it does carry,
//! before anything runs, and every record of a shaped run carries the
//! machine's forwarding in its path. The checks are of structure and
//! refusals, never of a speed: the declared machine makes the refusals
//! the same on every machine.

use crate::common::testbed::Testbed;
use crate::common::{netgap, one_line_error, read_records, system_ready};
use std::process::Command;

/// The namespaces of testbed `name` the kernel has.
fn namespaces_of(name: &str) -> Vec<String> {
    let out = Command::new("ip")
        .args(["netns", "list"])
        .output()
        .expect("ip netns");
    let prefix = format!("ngtb-{name}-");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| n.starts_with(&prefix))
        .map(str::to_string)
        .collect()
}

#[test]
fn a_shaped_testbed_calibrates_what_its_machine_forwards() {
    if !system_ready("forwarding::a_shaped_testbed_calibrates") {
        return;
    }
    let (tb, out) = Testbed::up("tfwdcal", &["--hosts", "2", "--rate", "1G"]);
    assert!(out.contains("forwarding: this machine moves "), "{out}");
    let f = tb.hosts().forwarding.expect("calibrated");
    assert!(!f.declared && f.streams >= 2 && f.payload_mbps > 0, "{f:?}");
    assert_eq!(f.mtu_bytes, 1500);
    // The calibration put the links back as they were.
    let status = String::from_utf8_lossy(
        &netgap()
            .args(["testbed", "status", "--name", &tb.name])
            .output()
            .expect("status")
            .stdout,
    )
    .into_owned();
    assert!(
        status.contains("live links: as the hosts file says"),
        "{status}"
    );
    assert!(status.contains("rate 1Gbit"), "{status}");
}

#[test]
fn rates_and_runs_past_what_the_machine_carries_are_refused_in_one_line() {
    if !system_ready("forwarding::rates_and_runs_past") {
        return;
    }
    // A link rate past a declared machine: refused before anything is
    // built, naming the rate it carries (80% of 2 Gbit/s over tcp's share
    // of a 1500-byte frame: 1.67, down to 1.6G).
    let _ = netgap()
        .args(["testbed", "down", "--name", "tfwdno"])
        .output();
    let out = netgap()
        .args([
            "testbed",
            "up",
            "--name",
            "tfwdno",
            "--hosts",
            "2",
            "--rate",
            "3G",
            "--forwarding",
            "2G",
        ])
        .output()
        .expect("testbed up");
    one_line_error(
        &out,
        "testbed up --rate 3G --forwarding 2G",
        "--rate 3G: this machine forwards 2.0 Gbit/s through the testbed's shapers",
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("give --rate 1.6G or less"));
    assert!(namespaces_of("tfwdno").is_empty(), "nothing was built");

    // Three links at 1 Gbit/s on that machine: each link alone is carried,
    // all three at once are not.
    let (tb, out) = Testbed::up(
        "tfwd",
        &[
            "--hosts",
            "2",
            "--topology",
            "mesh",
            "--links",
            "3",
            "--rate",
            "1G",
            "--forwarding",
            "2G",
        ],
    );
    assert!(out.contains("declared with --forwarding"), "{out}");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let run = |links: &str| {
        netgap()
            .args(["run", "multirail", "--hosts", &tb.hosts_arg()])
            .args(["--links", links, "--reps", "2", "--duration", "300ms"])
            .arg("--json")
            .arg(&json)
            .output()
            .expect("netgap run")
    };
    let line = one_line_error(
        &run("1,3"),
        "multirail over 3 links",
        "--links 3: 3 shaped link directions at 1G carry 2.87 Gbit/s",
    );
    assert!(line.contains("set the links to 550M or less"), "{line}");
    assert!(read_records(&json).is_empty(), "nothing ran");

    let out = run("1");
    assert!(out.status.success(), "{out:?}");
    let records = read_records(&json);
    assert_eq!(records.len(), 1, "{records:#?}");
    let r = &records[0];
    assert_eq!(r["stack"]["path"]["forwarding_mbps"], 2000, "{r:#}");
    assert!(
        r["physics"]["past_forwarding_gbps"].is_null(),
        "one link is carried: {r:#}"
    );
    assert!(r["physics"]["fault"].is_null(), "{r:#}");

    // A faster rate for every link: refused before the links change.
    one_line_error(
        &netgap()
            .args(["testbed", "set", "--name", &tb.name, "--rate", "3G"])
            .output()
            .expect("testbed set"),
        "testbed set --rate 3G",
        "give --rate 1.6G or less",
    );
    let c = tb.hosts().conditions.expect("conditions");
    assert_eq!(c.rate_bps, Some(1_000_000_000), "the rate stayed");
}
