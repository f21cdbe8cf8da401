//! `pipeline` end to end: a query flows from the producer through a
//! filter stage of two transparent copies to the consumer, which checks
//! every unit of work against the producer's data through every filter,
//! across the hosts of a namespace testbed over tcp and io_uring, and with
//! every stage on one host over unix and shm.
//!
//! Without root, `ip` or network namespaces the testbed test prints why
//! and passes, unless NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI).

use crate::common::testbed::Testbed;
use crate::common::{fails_with_one_line, metric, netgap, ok, read_records, system_ready, u};
use serde_json::Value;

/// Checks a record of a query of `query` bytes in UOWs of `uow` bytes
/// through one filter stage of two copies, the copies on `hosts`
/// (producer, the two filter copies, consumer), one query per repetition.
fn check_query(r: &Value, query: u64, uow: u64, hosts: &[&str]) {
    check_record(r, query, uow, 2, hosts);
}

/// Checks a record of a query of `query` bytes in UOWs of `uow` bytes
/// through one filter stage of `copies` copies, the copies on `hosts`
/// (producer, the filter copies, consumer), one query per repetition.
pub(crate) fn check_record(r: &Value, query: u64, uow: u64, copies: usize, hosts: &[&str]) {
    let reps = r["stats"]["reps"].as_array().map_or(0, Vec::len) as u64;
    let uows = query.div_ceil(uow) as f64;
    assert_eq!(r["test"], "pipeline");
    assert_eq!(r["metric"], "query_time_ms");
    let t = r["value"].as_f64().expect("value");
    assert!(t > 0.0, "{r}");
    assert_eq!(metric(r, "query_time_ms"), t);
    // Every UOW went through every stage and arrived checked, once.
    for stage in ["producer", "filter1", "consumer"] {
        assert_eq!(metric(r, &format!("{stage}_uows")), uows, "{stage}");
        assert!(metric(r, &format!("{stage}_uows_per_s")) > 0.0, "{stage}");
    }
    assert_eq!(metric(r, "verified_bytes") as u64, query);
    let p = &r["percentiles"];
    assert!(p["p50"].as_f64().expect("p50") >= 0.0, "{r}");
    assert!(p["max"].as_f64() >= p["p50"].as_f64(), "{p}");
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), copies + 2, "a copy per flow");
    for (f, host) in flows.iter().zip(hosts) {
        assert_eq!(f["host"], *host, "{f}");
    }
    // The producer sends each query, the consumer receives it, and the
    // filter copies share it by demand (bytes of every repetition).
    let all = query * reps;
    assert_eq!(u(&flows[0]["bytes_tx"]), all);
    assert_eq!(u(&flows[copies + 1]["bytes_rx"]), all);
    let filtered: u64 = flows[1..=copies].iter().map(|f| u(&f["bytes_rx"])).sum();
    assert_eq!(filtered, all);
    let passed: u64 = flows[1..=copies].iter().map(|f| u(&f["bytes_tx"])).sum();
    assert_eq!(passed, all);
    // The option is recorded when given; one copy is the default.
    let recorded = r["app"]["options"]["copies"].as_u64().unwrap_or(1);
    assert_eq!(recorded, copies as u64);
}

#[test]
fn pipeline_queries_run_verified_across_hosts_and_colocated() {
    if !system_ready("pipeline_queries_run_verified_across_hosts_and_colocated") {
        return;
    }
    let (tb, _) = Testbed::up("pipesw", &["--hosts", "4", "--topology", "switch"]);
    let names: Vec<String> = tb.hosts().hosts.iter().map(|h| h.name.clone()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let query = 2u64 << 20;
    let flags = [
        "--copies",
        "2",
        "--query-bytes",
        "2M",
        "-s",
        "16K",
        "--reps",
        "2",
        "--duration",
        "20s",
    ];
    // Across the four hosts: copy i on host i.
    for t in ["tcp", "uring"] {
        let recs = tb.run(
            "pipeline",
            &[&flags[..], &["-t", t]].concat(),
            &dir.path().join(format!("{t}.jsonl")),
        );
        assert_eq!(recs.len(), 1);
        assert_eq!(recs[0]["transport"], t);
        let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
        check_query(&recs[0], query, 16 << 10, &hosts);
        let cpu = recs[0]["hosts_cpu"].as_array().expect("hosts_cpu");
        assert_eq!(cpu.len(), 4, "a role on every host");
    }
    // As listed: the producer on the last host, both filter copies on the
    // second, the consumer on the first: each stream is dialled by the role
    // prepared later, against the way its data moves.
    let recs = tb.run(
        "pipeline",
        &[&flags[..], &["--place", "3,1,1,0"]].concat(),
        &dir.path().join("listed.jsonl"),
    );
    let listed = [&names[3], &names[1], &names[1], &names[0]].map(String::as_str);
    check_query(&recs[0], query, 16 << 10, &listed);
    // Under each of --conditions in turn: one record each, its path saying
    // the condition, and the testbed back as it was afterwards.
    let before = tb.hosts().conditions;
    let recs = tb.run(
        "pipeline",
        &[&flags[..], &["--conditions", "offload=off,on"]].concat(),
        &dir.path().join("cond.jsonl"),
    );
    let offloads: Vec<&str> = recs
        .iter()
        .map(|r| r["stack"]["path"]["offload"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(offloads, ["off", "on"]);
    for r in &recs {
        let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
        check_query(r, query, 16 << 10, &hosts);
    }
    assert_eq!(tb.hosts().conditions, before);
    // Co-located: every stage on the first host.
    for t in ["unix", "shm"] {
        let recs = tb.run(
            "pipeline",
            &[&flags[..], &["-t", t]].concat(),
            &dir.path().join(format!("{t}.jsonl")),
        );
        assert_eq!(recs.len(), 1);
        let first = names[0].as_str();
        check_query(&recs[0], query, 16 << 10, &[first; 4]);
    }
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn pipeline_points_follow_uow_sizes_copies_and_presets_on_loopback() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("p.jsonl");
    ok(netgap()
        .args([
            "run",
            "pipeline",
            "-s",
            "16K,64K",
            "--copies",
            "1,2",
            "--filters",
            "2",
            "--query-bytes",
            "1M",
            "--credits",
            "2",
            "--compute-us",
            "50",
            "--reps",
            "1",
            "--duration",
            "20s",
            "--json",
        ])
        .arg(&json)
        .output()
        .expect("netgap run"));
    let recs = read_records(&json);
    assert_eq!(recs.len(), 4, "two UOW sizes by two copy counts");
    for r in &recs {
        let uow = u(&r["size_bytes"]);
        let uows = (1u64 << 20).div_ceil(uow) as f64;
        for stage in ["producer", "filter1", "filter2", "consumer"] {
            assert_eq!(metric(r, &format!("{stage}_uows")), uows, "{stage}");
        }
        let copies = u(&r["app"]["options"]["copies"]);
        assert_eq!(
            r["flows"].as_array().map(Vec::len),
            Some(2 + 2 * copies as usize)
        );
        // Each filter spends 50 µs per UOW: two stages of them bound the
        // query from below when one copy does each stage's work.
        if copies == 1 {
            assert!(metric(r, "query_time_ms") >= uows * 0.05, "{}", r["app"]);
        }
    }
}

#[test]
fn pipeline_refuses_what_it_cannot_run_in_one_line() {
    fails_with_one_line(
        &["run", "pipeline", "-t", "udp", "--reps", "1"],
        "not reliable",
    );
    fails_with_one_line(&["run", "pipeline", "--copies", "0"], "--copies 0");
    fails_with_one_line(
        &["run", "pipeline", "--preset", "ct"],
        "must be one of vm, iso",
    );
}
