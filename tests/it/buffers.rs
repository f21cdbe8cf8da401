//! Message buffer placement (`--align`, `--offset`): a run with an offset
//! moves every byte intact through a separate agent, and its records say
//! the offset in their options and stack, so it is a series apart; a
//! default run's records say nothing of buffers, as before.

use serde_json::Value;

use crate::common::{netgap, read_records, run_ok, AgentProc};

/// The stack's option list of a record.
fn stack_options(r: &Value) -> Vec<String> {
    r["stack"]["options"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|v| v.as_str().expect("options are strings").to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn an_offset_run_records_its_offset_and_a_default_run_nothing_new() {
    let agent = AgentProc::start("127.0.0.1");
    let dir = tempfile::tempdir().expect("tempdir");
    for (test, transport) in [("stream", "tcp"), ("pingpong", "udp")] {
        let run = |extra: &[&str], name: &str| -> Vec<Value> {
            let json = dir.path().join(format!("{test}-{transport}-{name}.jsonl"));
            run_ok(
                netgap()
                    .args(["run", test, "-t", transport, "--peer"])
                    .arg(&agent.addr)
                    .args(["--sizes", "1K,60K", "--reps", "2", "--rep-time", "5ms"])
                    .arg("--verify")
                    .args(extra)
                    .arg("--json")
                    .arg(&json),
            );
            let records = read_records(&json);
            assert_eq!(records.len(), 2, "{test} {transport} {name}");
            records
        };
        for r in run(&["--offset", "16"], "offset") {
            assert_eq!(r["options"]["transport"]["buffer_offset_bytes"], 16);
            assert!(r["options"]["transport"]["buffer_align_bytes"].is_null());
            assert_eq!(stack_options(&r), ["buffer_offset_bytes=16"], "{r}");
        }
        for r in run(&["--align", "64", "--offset", "8"], "align") {
            assert_eq!(
                stack_options(&r),
                ["buffer_align_bytes=64", "buffer_offset_bytes=8"],
                "{r}"
            );
        }
        for r in run(&[], "default") {
            let transport_options = r["options"]["transport"]
                .as_object()
                .expect("transport options");
            assert!(
                transport_options.keys().all(|k| !k.starts_with("buffer_")),
                "{r}"
            );
            assert!(stack_options(&r).is_empty(), "{r}");
        }
    }
}
