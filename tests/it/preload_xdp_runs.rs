//! netgap's own runs of real applications across testbed hosts through
//! the preload library and the hosts' relays (`-t xdp`): `web` with nginx
//! on one host and the load generator on the other, every response
//! verified; `gather` with real gmond answering over xdp; both with every
//! connection relayed (none left on the kernel's TCP), the payload on the
//! relays rather than the kernel sockets, the relays the runs started
//! gone afterwards, and netgap's own responder (aimed at IP:PORT) refused
//! over xdp in one line.
//!
//! Built only with the `xdp` feature; without root, namespaces, nginx or
//! gmond these tests print why and pass (with NETGAP_REQUIRE_SYSTEM_TESTS=1
//! that is a failure).

use crate::common::testbed::Testbed;
use crate::common::{self, netgap, read_records, system_ready};
use serde_json::Value;
use std::path::Path;
use std::process::Command;

fn metric(r: &Value, name: &str) -> f64 {
    r["app"]["metrics"][name]
        .as_f64()
        .unwrap_or_else(|| panic!("metric {name} in {}", r["app"]))
}

/// The relays a run starts name their limits on the command line; a
/// relay started by hand or by another test does not.
fn run_relays() -> String {
    let out = Command::new("pgrep")
        .args(["-af", "relay --max-per-uid"])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `netgap run ARGS --hosts @TESTBED --json FILE`: its success, its
/// output and the records.
fn run(tb: &Testbed, args: &[&str], json: &Path) -> (bool, String, Vec<Value>) {
    let out = netgap()
        .arg("run")
        .args(args)
        .args(["--hosts", &tb.hosts_arg(), "--json"])
        .arg(json)
        .env("NETGAP_PRELOAD", common::preload_library())
        .output()
        .expect("netgap run");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text, read_records(json))
}

#[test]
fn nginx_and_gmond_serve_across_testbed_hosts_over_xdp_through_the_relays() {
    let test = "nginx_and_gmond_serve_across_testbed_hosts_over_xdp_through_the_relays";
    if !system_ready(test) {
        return;
    }
    for p in ["/usr/sbin/nginx", "/usr/sbin/gmond"] {
        if !Path::new(p).exists() {
            common::skip(test, &format!("{p} is missing"));
            return;
        }
    }
    let (tb, _) = Testbed::up(
        "pxruns",
        &["--hosts", "2", "--topology", "mesh", "--links", "2"],
    );
    let dir = tempfile::tempdir().expect("tempdir");

    // nginx on one host, the load generator on the other.
    let json = dir.path().join("web.jsonl");
    let (ok, text, recs) = run(
        &tb,
        &[
            "web",
            "-t",
            "xdp",
            "--reps",
            "1",
            "--duration",
            "1s",
            "-s",
            "1k,64k",
        ],
        &json,
    );
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 2, "{text}");
    for r in &recs {
        assert_eq!(r["transport"], "xdp");
        let transactions = metric(r, "transactions");
        assert!(transactions > 0.0, "{}", r["app"]);
        assert_eq!(metric(r, "errors"), 0.0, "{}", r["app"]);
        assert_eq!(metric(r, "verified_share"), 1.0, "{}", r["app"]);
        assert!(metric(r, "preload_xdp_connections") >= 1.0, "{}", r["app"]);
        assert_eq!(metric(r, "preload_kernel_connections"), 0.0, "{}", r["app"]);
        assert_eq!(metric(r, "preload_shm_connections"), 0.0, "{}", r["app"]);
        let relayed = metric(r, "preload_xdp_bytes");
        let kernel = metric(r, "preload_kernel_tcp_bytes");
        assert!(
            relayed >= metric(r, "payload_bytes"),
            "relayed {relayed}: {}",
            r["app"]
        );
        assert!(
            kernel < relayed / 20.0,
            "kernel {kernel} of {relayed} bytes"
        );
        assert!(
            r["warnings"].as_array().is_none_or(Vec::is_empty),
            "{}",
            r["warnings"]
        );
        let facts = &r["app"]["services"][0]["facts"];
        assert!(
            facts["relay"]
                .as_str()
                .is_some_and(|f| f.starts_with("started for the run")),
            "{facts}"
        );
    }
    assert_eq!(run_relays(), "", "relays left after the web run");

    // gmond on the second host, the gatherer on the first.
    let json = dir.path().join("gather.jsonl");
    let (ok, text, recs) = run(
        &tb,
        &[
            "gather",
            "-t",
            "xdp",
            "--responder",
            "gmond",
            "--reps",
            "1",
            "--duration",
            "1s",
        ],
        &json,
    );
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 1, "{text}");
    let r = &recs[0];
    assert_eq!(r["transport"], "xdp");
    let gathers = metric(r, "gathers");
    assert!(gathers > 0.0, "{}", r["app"]);
    assert!(metric(r, "xml_metrics") > 0.0, "{}", r["app"]);
    // Every exchange a connection of its own, every one relayed.
    assert!(
        metric(r, "preload_xdp_connections") >= gathers,
        "{}",
        r["app"]
    );
    assert_eq!(metric(r, "preload_kernel_connections"), 0.0, "{}", r["app"]);
    assert!(
        r["warnings"].as_array().is_none_or(Vec::is_empty),
        "{}",
        r["warnings"]
    );
    assert_eq!(run_relays(), "", "relays left after the gather run");

    // netgap's own responder is aimed at IP:PORT: refused over xdp.
    let json = dir.path().join("builtin.jsonl");
    let (ok, text, recs) = run(&tb, &["gather", "-t", "xdp", "--reps", "1"], &json);
    assert!(!ok, "{text}");
    assert!(recs.is_empty(), "{text}");
    assert!(text.contains("add --responder gmond"), "{text}");
    assert!(!text.contains("panicked"), "{text}");

    tb.down();
    tb.assert_gone();
}
