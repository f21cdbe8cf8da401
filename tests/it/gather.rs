//! `gather` end to end on a 4-host namespace testbed: the first host reads
//! every other host's whole answer, from real gmond on every host (its XML
//! parsed, every host present, gmond stopped afterwards) and from netgap's
//! own responder over tcp and uring, one host after another and all at
//! once; and `connect`'s connection setup time beside its
//! connect-and-exchange time. Also the refusals.
//!
//! Without root, namespaces or gmond these tests print why and pass, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI), where that is a failure.

use crate::common;
use crate::common::testbed::Testbed;
use crate::common::{fails_with_one_line, metric, system_ready};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn gmond_ready(test: &str) -> bool {
    if Path::new("/usr/sbin/gmond").exists() {
        return true;
    }
    common::skip(test, "gmond is missing (apt-get install ganglia-monitor)");
    false
}

/// Checks what every gather record says: a positive time per gather, every
/// other host answered in each, the connection's share a real share.
fn check_gather(r: &Value, hosts: usize) {
    assert_eq!(r["test"], "gather");
    assert_eq!(r["metric"], "gather_time_ms");
    let ms = r["value"].as_f64().expect("value");
    assert!(ms > 0.0, "{r}");
    assert_eq!(metric(r, "hosts"), hosts as f64);
    assert!(metric(r, "gathers") >= 1.0);
    let share = metric(r, "connect_share_pct");
    assert!(share > 0.0 && share < 100.0, "{share}");
    assert!(metric(r, "connect_time_us") < metric(r, "exchange_time_us"));
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), hosts);
    for f in flows {
        assert!(f["bytes_rx"].as_u64().unwrap_or(0) > 0, "{f}");
    }
}

#[test]
fn gather_reads_gmond_and_the_builtin_responder_on_every_host() {
    let test = "gather_reads_gmond_and_the_builtin_responder_on_every_host";
    if !system_ready(test) || !gmond_ready(test) {
        return;
    }
    let (tb, _) = Testbed::up("i12gat", &["--hosts", "4", "--topology", "switch"]);
    let names: Vec<String> = tb.hosts().hosts.iter().map(|h| h.name.clone()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let short = ["--reps", "1", "--duration", "300ms"];

    // Real gmond on every other host, asked in turn and all at once.
    let recs = tb.run(
        "gather",
        &[
            &[
                "--responder",
                "gmond",
                "--gather-mode",
                "sequential,parallel",
            ][..],
            &short,
        ]
        .concat(),
        &dir.path().join("gmond.jsonl"),
    );
    assert_eq!(recs.len(), 2);
    for (r, mode) in recs.iter().zip(["sequential", "parallel"]) {
        check_gather(r, 3);
        assert_eq!(r["app"]["options"]["gather-mode"], mode);
        // gmond's connections carry no handshake of netgap's.
        assert!(r["app"]["metrics"].get("handshake_time_us").is_none());
        // Each gmond reports only itself: three hosts in three answers.
        assert_eq!(metric(r, "xml_hosts"), 3.0, "{}", r["app"]);
        assert!(metric(r, "xml_metrics") >= 3.0);
        // Each answering host's CPU is gmond's, which builds an XML answer
        // of its metrics for every gather (hundreds of microseconds each
        // here), and its agent's, which alone spends a few microseconds a
        // gather: at least 20 µs an answer, every gather of the window
        // asking each host once.
        let answering = r["hosts_cpu"].as_array().expect("hosts_cpu");
        for h in answering.iter().filter(|h| h["role"] == "server") {
            let cpu_ns = h["cpu"]["cpu_ns"].as_f64().expect("cpu_ns");
            assert!(cpu_ns >= 20_000.0 * metric(r, "gathers"), "{h}");
        }
        let services = r["app"]["services"].as_array().expect("services");
        let mut hosts: Vec<&str> = services
            .iter()
            .map(|s| {
                assert_eq!(s["name"], "gmond");
                let config = s["config"].as_str().expect("config");
                assert!(!config.contains("mcast"), "{config}");
                assert!(config.contains("tcp_accept_channel"));
                assert!(s["version"].as_str().unwrap_or("").contains("gmond"));
                s["host"].as_str().expect("host")
            })
            .collect();
        hosts.sort_unstable();
        assert_eq!(
            hosts,
            names[1..].iter().map(String::as_str).collect::<Vec<_>>()
        );
    }
    let left = Command::new("pgrep")
        .args(["-f", "/agent-[0-9]+-[0-9a-f]+/gmond-"])
        .output()
        .expect("pgrep");
    assert!(
        left.stdout.is_empty(),
        "gmond left running: {}",
        String::from_utf8_lossy(&left.stdout)
    );

    // netgap's responder over tcp and uring: every answer the point's size.
    let recs = tb.run(
        "gather",
        &[&["-t", "tcp,uring", "-s", "4K"][..], &short].concat(),
        &dir.path().join("builtin.jsonl"),
    );
    assert_eq!(recs.len(), 2);
    for (r, transport) in recs.iter().zip(["tcp", "uring"]) {
        check_gather(r, 3);
        assert_eq!(r["transport"], transport);
        assert_eq!(metric(r, "gather_bytes"), 3.0 * 4096.0);
        // netgap's own handshake on each connection is timed apart and left
        // out of the exchange, so the connect share is the stack's connect
        // over what the program would see.
        assert!(metric(r, "handshake_time_us") > 0.0, "{}", r["app"]);
        let share = 100.0 * metric(r, "connect_time_us") / metric(r, "exchange_time_us");
        assert!(
            (metric(r, "connect_share_pct") - share).abs() < 1e-6 * share.max(1.0),
            "{}",
            r["app"]
        );
        assert!(r["app"].get("services").is_none());
    }
    let recs = tb.run(
        "gather",
        &[&["--gather-mode", "parallel"][..], &short].concat(),
        &dir.path().join("parallel.jsonl"),
    );
    check_gather(&recs[0], 3);

    // connect beside it: connection setup alone and connect-and-exchange,
    // over both transports.
    let recs = tb.run(
        "connect",
        &[&["-t", "tcp,uring", "--clients", "3"][..], &short].concat(),
        &dir.path().join("connect.jsonl"),
    );
    assert_eq!(recs.len(), 2);
    for r in &recs {
        let setup = metric(r, "setup_time_us");
        let whole = metric(r, "connection_time_us");
        assert!(setup > 0.0 && setup < whole, "{}", r["app"]);
        let share = metric(r, "setup_share_pct");
        assert!((share - 100.0 * setup / whole).abs() < 1e-6, "{share}");
    }
    tb.down();
    tb.assert_gone();
}

#[test]
fn bad_gather_requests_are_refused_in_one_line() {
    fails_with_one_line(&["run", "gather", "--responder", "x"], "--responder x");
    fails_with_one_line(&["run", "gather", "-t", "udp"], "use tcp");
    fails_with_one_line(&["run", "gather", "-t", "unix"], "cannot cross hosts");
    fails_with_one_line(
        &["run", "gather", "--gather-mode", "both"],
        "--gather-mode both",
    );
    fails_with_one_line(
        &[
            "run",
            "gather",
            "--responder",
            "gmond",
            "-t",
            "uring",
            "--client-hosts",
            "1",
            "--duration",
            "100ms",
            "--reps",
            "1",
        ],
        "gmond answers over the host's TCP, or through the preload library over shm or xdp",
    );
}
