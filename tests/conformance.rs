//! The conformance matrix: every registered transport × every registered
//! test × every mode the transport supports, end to end through the real
//! binary and a real agent, with `--verify` checking every payload byte and
//! the runner checking that bytes sent equal bytes received. A new transport
//! or test is picked up from the registries with no change here.

use assert_cmd::cargo::CommandCargoExt;
use netgap::{bench, transport};
use serde_json::Value;
use std::process::Command;

/// Sizes that cover one byte, a page, and messages larger than socket
/// buffers and shared-memory rings.
const SIZES: &str = "1,4K,1M,5M";

#[test]
fn every_transport_runs_every_test_in_every_mode_with_verified_payload() {
    let tests: Vec<&str> = bench::registry().iter().map(|t| t.name()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ran = 0;
    for t in transport::registry() {
        if let Err(why) = t.availability() {
            eprintln!("conformance: skipping transport {}: {why}", t.name());
            continue;
        }
        let caps = t.capabilities();
        for mode in caps.modes {
            let json = dir.path().join(format!("{}-{mode}.jsonl", t.name()));
            let out = Command::cargo_bin("netgap")
                .expect("binary")
                .args(["run", &tests.join(","), "-t", t.name(), "--mode", mode.as_str()])
                .args(["--sizes", SIZES, "--reps", "3", "--rep-time", "5ms", "--verify"])
                .arg("--json")
                .arg(&json)
                .output()
                .expect("runs");
            assert!(
                out.status.success(),
                "{} {mode}: {}",
                t.name(),
                String::from_utf8_lossy(&out.stderr)
            );
            let records: Vec<Value> = std::fs::read_to_string(&json)
                .expect("results written")
                .lines()
                .map(|l| serde_json::from_str(l).expect("JSON line"))
                .collect();
            let sizes = SIZES.split(',').count();
            assert_eq!(records.len(), tests.len() * sizes, "{} {mode}", t.name());
            for r in &records {
                assert_eq!(r["transport"], t.name());
                assert_eq!(r["mode"], mode.as_str());
                assert_eq!(r["options"]["verify"], true);
                let b = &r["bytes"];
                assert_eq!(b["client_tx"], b["server_rx"], "{r}");
                assert_eq!(b["server_tx"], b["client_rx"], "{r}");
                assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{r}");
            }
            ran += records.len();
        }
    }
    assert!(ran > 0, "no transport was available");
}
