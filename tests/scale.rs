//! Many flows over several client hosts of a namespace testbed, with the
//! server's listen backlog cut to a handful: the clients' paced setup (a
//! window of non-blocking connects, each done once the server's role
//! answered its session proof, the window narrowed by retransmissions)
//! opens every flow within the I/O timeout, and every flow's bytes are
//! accounted in the record. Flow counts are kept small so the test takes
//! seconds; the 10,000 to 100,000-flow figures are `bench/run-scale.sh`'s.
//!
//! Without root, `ip` or network namespaces it prints why and passes,
//! unless NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI).

mod common;
use common::testbed::Testbed;
use common::{ok, system_ready};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;

const FLOWS: u64 = 3000;

#[test]
fn a_paced_setup_opens_every_flow_past_a_tiny_backlog_and_accounts_for_every_byte() {
    if !system_ready(
        "a_paced_setup_opens_every_flow_past_a_tiny_backlog_and_accounts_for_every_byte",
    ) {
        return;
    }
    let (tb, _) = Testbed::up("scalepace", &["--hosts", "3", "--topology", "switch"]);
    // The server (the first host) listens after this: its backlog is 16,
    // far below the clients' first window of 256 each.
    ok(Command::new("ip")
        .args(["netns", "exec", &tb.ns("h1"), "sh", "-c"])
        .arg(
            "echo 16 > /proc/sys/net/core/somaxconn && \
             echo 16 > /proc/sys/net/ipv4/tcp_max_syn_backlog",
        )
        .output()
        .expect("setting the backlog"));
    let backlog = ok(Command::new("ip")
        .args([
            "netns",
            "exec",
            &tb.ns("h1"),
            "cat",
            "/proc/sys/net/core/somaxconn",
        ])
        .output()
        .expect("reading the backlog"));
    assert_eq!(backlog.trim(), "16");
    let dir = tempfile::tempdir().expect("tempdir");
    let records = tb.run(
        "hotspot",
        &[
            "--clients",
            &FLOWS.to_string(),
            "--reps",
            "1",
            "--duration",
            "500ms",
        ],
        &dir.path().join("r.jsonl"),
    );
    assert_eq!(records.len(), 1);
    let r = &records[0];
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len() as u64, FLOWS);
    let mut per_host: BTreeMap<String, u64> = BTreeMap::new();
    let (mut tx, mut rx) = (0, 0);
    for (i, f) in flows.iter().enumerate() {
        assert_eq!(f["index"].as_u64(), Some(i as u64), "{f}");
        let (t, x) = (
            f["bytes_tx"].as_u64().expect("bytes_tx"),
            f["bytes_rx"].as_u64().expect("bytes_rx"),
        );
        // 1-byte round trips, every one finished: what went out came back.
        assert!(t > 0 && t == x, "flow {i} moved {t} out, {x} back: {f}");
        tx += t;
        rx += x;
        *per_host
            .entry(f["host"].as_str().expect("host").to_string())
            .or_default() += 1;
    }
    assert_eq!(
        per_host.into_iter().collect::<Vec<_>>(),
        vec![("h2".to_string(), FLOWS / 2), ("h3".to_string(), FLOWS / 2)]
    );
    assert_eq!(tx, rx);
    // Every host's peak memory is in the record.
    let hosts: &Vec<Value> = r["hosts_cpu"].as_array().expect("hosts_cpu");
    assert_eq!(hosts.len(), 3);
    for h in hosts {
        assert!(h["peak_rss_kib"].as_u64().is_some_and(|k| k > 0), "{h}");
    }
    tb.down();
}
