//! The conformance matrix: every registered transport × every registered
//! test × every mode the transport supports, end to end through the real
//! binary and a real agent, with `--verify` checking every payload byte and
//! the runner checking that bytes sent equal bytes received (over an
//! unreliable transport: received plus counted lost). A new transport or
//! test is picked up from the registries with no change here; sizes above a
//! transport's largest message are skipped, saying so.

use crate::common;
use netgap::units::{format_size, parse_size_list};
use netgap::{bench, transport};
use serde_json::Value;

/// Sizes that cover one byte, a page, and messages larger than socket
/// buffers and shared-memory rings.
const SIZES: &str = "1,4K,1M,5M";

#[test]
fn every_transport_runs_every_test_in_every_mode_with_verified_payload() {
    let tests: Vec<&str> = bench::registry().iter().map(|t| t.name()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let mut ran = 0;
    for t in transport::registry() {
        if !t.capabilities().runs_on_loopback {
            // Its matrix runs between two testbed hosts (the `xdp` module).
            eprintln!(
                "conformance: skipping transport {}: it needs two hosts",
                t.name()
            );
            continue;
        }
        if let Err(why) = t.availability() {
            // A transport this host lacks is a failure where CI requires
            // the system tests, never a silent pass with fewer transports.
            common::skip(&format!("conformance over {}", t.name()), &why.to_string());
            continue;
        }
        let caps = t.capabilities();
        let max = t.max_message_bytes().unwrap_or(u64::MAX);
        let (sizes, skipped): (Vec<u64>, Vec<u64>) = parse_size_list(SIZES)
            .expect("sizes")
            .into_iter()
            .partition(|&s| s <= max);
        if !skipped.is_empty() {
            eprintln!(
                "conformance: skipping sizes {} over {}: its largest message is {max} bytes",
                skipped
                    .iter()
                    .map(|&s| format_size(s))
                    .collect::<Vec<_>>()
                    .join(","),
                t.name()
            );
        }
        let size_list = sizes
            .iter()
            .map(u64::to_string)
            .collect::<Vec<_>>()
            .join(",");
        for mode in caps.modes {
            let json = dir.path().join(format!("{}-{mode}.jsonl", t.name()));
            let out = common::netgap()
                .args([
                    "run",
                    &tests.join(","),
                    "-t",
                    t.name(),
                    "--mode",
                    mode.as_str(),
                ])
                .args([
                    "--sizes",
                    &size_list,
                    "--reps",
                    "3",
                    "--rep-time",
                    "5ms",
                    "--verify",
                ])
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
            assert_eq!(
                records.len(),
                tests.len() * sizes.len(),
                "{} {mode}",
                t.name()
            );
            for r in &records {
                assert_eq!(r["transport"], t.name());
                assert_eq!(r["mode"], mode.as_str());
                assert_eq!(r["options"]["verify"], true);
                // Every byte arrived, or an unreliable flow counted it lost.
                let d = &r["datagrams"];
                assert_eq!(d.is_null(), caps.reliable, "{r}");
                let lost = |end: &str| d[end]["lost_bytes"].as_u64().unwrap_or(0);
                let n = |k: &str| r["bytes"][k].as_u64().expect("byte count");
                assert_eq!(n("client_tx"), n("server_rx") + lost("server"), "{r}");
                assert_eq!(n("server_tx"), n("client_rx") + lost("client"), "{r}");
                assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{r}");
            }
            ran += records.len();
        }
    }
    assert!(ran > 0, "no transport was available");
}
