//! `pipeline --stages program`: each role's stages run as a process of
//! their own on the kernel's TCP sockets (`netgap pipeline-stages`), on
//! one host under the preload library over shm (the in-process agents),
//! and, built with the `xdp` feature, across two testbed hosts over xdp
//! through the hosts' relays (`--preload-relayed`, the record a stack of
//! its own), and again on direct connections (the default, each stream on
//! an AF_XDP socket of its stage's own). Every UOW is verified end to end as the
//! agent's own stages do; the library's counters in the record show every
//! stream on the library's path (none left on the kernel's TCP) and the
//! bytes on it; the record names the stages' program; nothing it started
//! is left. Also: over tcp the same program runs without the library (and
//! the record claims none), and over a transport programs cannot use the
//! run is refused in one line.
//!
//! Without root these tests print why and pass, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1, where that is a failure.

use crate::common;
use crate::common::{metric, netgap, one_line_error, read_records};
use serde_json::Value;
use std::process::Command;

/// Held by each test that ends by checking that no stages' program of
/// netgap still runs: tests of one binary run in parallel, and one
/// test's check would otherwise see another's live program.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Bytes of the query each test runs: 256 UOWs of 16 KiB.
const QUERY_BYTES: f64 = 4.0 * 1024.0 * 1024.0;

fn root(test: &str) -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        return true;
    }
    common::skip(test, "not root");
    false
}

/// `netgap run pipeline ARGS --query-bytes 4M --reps 1 --json FILE` with
/// the library built: its success, its output and the records.
fn run(args: &[&str], json: &std::path::Path) -> (bool, String, Vec<Value>) {
    let mut all = vec!["pipeline", "--stages", "program"];
    all.extend_from_slice(args);
    all.extend(["--query-bytes", "4M", "--reps", "1"]);
    common::run_preloaded(&all, json)
}

/// Every UOW of the query arrived at the consumer and was verified, once.
fn every_uow_verified(r: &Value) {
    assert_eq!(metric(r, "verified_bytes"), QUERY_BYTES, "{}", r["app"]);
    assert_eq!(metric(r, "consumer_uows"), QUERY_BYTES / 16384.0);
    assert_eq!(metric(r, "producer_uows"), QUERY_BYTES / 16384.0);
    assert!(metric(r, "query_time_ms") > 0.0, "{}", r["app"]);
    assert_eq!(r["app"]["options"]["stages"], "program", "{}", r["app"]);
    assert!(
        r["warnings"].as_array().is_none_or(Vec::is_empty),
        "{}",
        r["warnings"]
    );
}

/// The stages' programs of this binary still running.
fn stages_left() -> String {
    let out = Command::new("pgrep")
        .args([
            "-a",
            "-f",
            &format!("{} pipeline-stages", common::netgap_path().display()),
        ])
        .output()
        .expect("pgrep");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[test]
fn pipeline_stages_under_the_library_over_shm_verify_every_uow() {
    let test = "pipeline_stages_under_the_library_over_shm_verify_every_uow";
    let _one = one_at_a_time();
    if !root(test) {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    // Two filter stages of two copies: 8 streams, every copy's stream to
    // every copy of the next stage.
    let (ok, text, recs) = run(&["-t", "shm,tcp", "--filters", "2", "--copies", "2"], &json);
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 2, "{text}");
    let shm = &recs[0];
    assert_eq!(shm["transport"], "shm");
    every_uow_verified(shm);
    assert_eq!(
        metric(shm, "preload_shm_connections"),
        8.0,
        "{}",
        shm["app"]
    );
    assert_eq!(metric(shm, "preload_kernel_connections"), 0.0);
    assert_eq!(metric(shm, "preload_xdp_connections"), 0.0);
    // Each UOW crosses three streams, counted sent and received.
    let on_shm = metric(shm, "preload_shm_bytes");
    assert!(on_shm >= 6.0 * QUERY_BYTES, "{}", shm["app"]);
    let kernel = metric(shm, "preload_kernel_tcp_bytes");
    assert!(kernel < on_shm / 100.0, "kernel {kernel} of shm {on_shm}");
    let service = &shm["app"]["services"][0];
    assert_eq!(service["name"], "pipeline-stages", "{}", shm["app"]);
    assert!(
        service["facts"]["sockets"]
            .as_str()
            .is_some_and(|s| s.contains("preload library, stack shm")),
        "{service}"
    );
    // Over tcp the same program runs on the kernel's TCP, and the record
    // claims no library.
    let tcp = &recs[1];
    assert_eq!(tcp["transport"], "tcp");
    every_uow_verified(tcp);
    assert!(
        tcp["app"]["metrics"]
            .get("preload_shm_connections")
            .is_none(),
        "{}",
        tcp["app"]
    );
    assert_eq!(
        tcp["app"]["services"][0]["facts"]["sockets"],
        "kernel TCP sockets"
    );
    assert_eq!(stages_left(), "", "stages' programs left after the run");
}

#[test]
fn pipeline_stages_as_a_program_over_a_transport_programs_cannot_use_is_one_line() {
    // Refused in the plan, before the tcp point runs.
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let out = netgap()
        .args(["run", "pipeline", "-t", "tcp,unix", "--stages", "program"])
        .args(["--query-bytes", "1M", "--reps", "1", "--json"])
        .arg(&json)
        .output()
        .expect("netgap run");
    one_line_error(
        &out,
        "pipeline -t tcp,unix --stages program",
        "pipeline: --stages program runs the stages on the kernel's TCP sockets, as they are or under the preload library; use -t tcp, shm or xdp, not unix",
    );
    assert!(!json.exists() || read_records(&json).is_empty());
    // Over shm without the library: one line naming the path looked at.
    let out = netgap()
        .args(["run", "pipeline", "-t", "shm", "--stages", "program"])
        .args(["--query-bytes", "1M", "--reps", "1"])
        .env("NETGAP_PRELOAD", "/nonexistent/libnetgap_preload.so")
        .output()
        .expect("netgap run");
    one_line_error(
        &out,
        "pipeline -t shm --stages program without the library",
        "/nonexistent/libnetgap_preload.so",
    );
}

#[cfg(feature = "xdp")]
#[test]
fn pipeline_stages_across_testbed_hosts_over_xdp_go_through_the_relays() {
    use common::testbed::Testbed;
    let test = "pipeline_stages_across_testbed_hosts_over_xdp_go_through_the_relays";
    let _one = one_at_a_time();
    if !common::system_ready(test) {
        return;
    }
    // A switch with a second bridge for the relays' xdp flows, as study
    // 000's testbed: the stages' TCP on the first.
    let (tb, _) = Testbed::up(
        "pxpipe",
        &["--hosts", "2", "--topology", "switch", "--links", "2"],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    // Producer and consumer on the first host, the filter on the second:
    // both streams cross hosts.
    let (ok, text, recs) = run(
        &["-t", "xdp", "--preload-relayed", "--hosts", &tb.hosts_arg()],
        &json,
    );
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 1, "{text}");
    let r = &recs[0];
    assert_eq!(r["transport"], "xdp");
    assert_eq!(r["options"]["transport"]["preload_relayed"], true);
    assert!(
        r["stack"]["options"]
            .as_array()
            .is_some_and(|o| o.contains(&Value::from("preload_relayed"))),
        "{}",
        r["stack"]
    );
    every_uow_verified(r);
    assert_eq!(metric(r, "preload_xdp_connections"), 2.0, "{}", r["app"]);
    assert_eq!(metric(r, "preload_kernel_connections"), 0.0, "{}", r["app"]);
    assert_eq!(metric(r, "preload_shm_connections"), 0.0, "{}", r["app"]);
    // Each UOW crosses two relayed streams, counted at both ends.
    let relayed = metric(r, "preload_xdp_bytes");
    assert!(relayed >= 4.0 * QUERY_BYTES, "{}", r["app"]);
    let kernel = metric(r, "preload_kernel_tcp_bytes");
    assert!(kernel < relayed / 20.0, "kernel {kernel} of {relayed}");
    let services = r["app"]["services"].as_array().expect("services");
    assert_eq!(services.len(), 2, "a program per host: {services:?}");
    for s in services {
        assert_eq!(s["name"], "pipeline-stages");
        assert!(
            s["facts"]["relay"]
                .as_str()
                .is_some_and(|f| f.starts_with("started for the run")),
            "{s}"
        );
    }
    assert_eq!(
        tb.run_relays(),
        Vec::<String>::new(),
        "relays left after the run"
    );
    assert_eq!(stages_left(), "", "stages' programs left after the run");

    // The same run as it goes by default, its programs asking for direct
    // connections: both streams direct, on the stages' own AF_XDP
    // sockets, and the record's options left as they default.
    let json = dir.path().join("direct.jsonl");
    let hosts = tb.hosts_arg();
    let (ok, text, recs) = run(&["-t", "xdp", "--hosts", &hosts], &json);
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 1, "{text}");
    let r = &recs[0];
    assert!(r["options"]["transport"].get("preload_relayed").is_none());
    assert!(r["stack"]["options"]
        .as_array()
        .is_none_or(|o| !o.contains(&Value::from("preload_relayed"))));
    for s in r["app"]["services"].as_array().expect("services") {
        assert_eq!(
            s["facts"]["sockets"],
            "kernel TCP sockets under the preload library, stack xdp with direct connections",
            "{s}"
        );
    }
    every_uow_verified(r);
    assert_eq!(metric(r, "preload_direct"), 2.0, "{}", r["app"]);
    assert_eq!(metric(r, "preload_xdp_connections"), 2.0, "{}", r["app"]);
    assert_eq!(metric(r, "preload_kernel_connections"), 0.0, "{}", r["app"]);
    // The direct sockets' bytes, counted at both ends.
    assert!(
        metric(r, "preload_xdp_bytes") >= 4.0 * QUERY_BYTES,
        "{}",
        r["app"]
    );
    assert_eq!(
        tb.run_relays(),
        Vec::<String>::new(),
        "relays left after the direct run"
    );
    assert_eq!(
        stages_left(),
        "",
        "stages' programs left after the direct run"
    );
    tb.down();
    tb.assert_gone();
}
