//! Physics in the product: a record past its path's payload limit is a
//! measurement fault in the report (drawn apart, listed in its notes) and
//! in `netgap compare` (never a win); and a short run over a shaped
//! testbed link records its limit, with every value at or under it or
//! flagged.

use crate::common::testbed::Testbed;
use crate::common::{self, netgap, system_ready};
use serde_json::{json, Value};
use std::path::Path;

/// Payload limit of tcp at MTU 1500 on a 1 Gbit/s link: 1448 of 1514.
const TCP_LIMIT_GBPS: f64 = 1448.0 / 1514.0;

/// A stream record over tcp on a 1 Gbit/s switch testbed at MTU 1500 with
/// repetitions `reps`; no physics section, as an older netgap wrote it.
fn shaped_stream(size: u64, reps: &[f64]) -> Value {
    let s = netgap::stats::Summary::from_reps(reps).expect("finite reps");
    json!({
        "test": "stream", "transport": "tcp", "mode": "event", "size_bytes": size,
        "metric": "bandwidth_gbps", "value": s.value,
        "stats": netgap::record::RecordStats::from(&s),
        "percentiles": null, "service_demand_us_per_kib": null, "datagrams": null,
        "warnings": [], "version": "0.1.0", "time": "2026-11-22T08:00:00Z",
        "stack": {"transport": "tcp", "mode": "event", "options": [],
                  "path": {"kind": "testbed", "topology": "switch", "mtu_bytes": 1500,
                           "rate_bps": 1_000_000_000u64, "qdisc": "tbf"}}
    })
}

fn write(path: &Path, records: &[Value]) {
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).expect("write results");
}

#[test]
fn a_record_above_its_limit_is_a_fault_in_the_report_and_in_compare() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, new) = (dir.path().join("base.jsonl"), dir.path().join("new.jsonl"));
    let clean = |size: u64| shaped_stream(size, &[0.940, 0.942, 0.944, 0.941, 0.943]);
    // At 64 KiB, NEW passes the wire by a quarter: faster, and impossible.
    let planted = shaped_stream(65536, &[1.19, 1.20, 1.21, 1.20, 1.20]);
    write(&base, &[clean(16384), clean(65536), clean(1 << 20)]);
    write(&new, &[clean(16384), planted, clean(1 << 20)]);

    let html_path = dir.path().join("r.html");
    let images = dir.path().join("img");
    let o = netgap()
        .args(["report", "-o"])
        .arg(&html_path)
        .arg("--images")
        .arg(&images)
        .arg(&new)
        .output()
        .expect("runs");
    // Without a font the PNGs cannot be drawn; the page alone still is.
    let o = if o.status.success() {
        o
    } else {
        netgap()
            .args(["report", "-o"])
            .arg(&html_path)
            .arg(&new)
            .output()
            .expect("runs")
    };
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let html = std::fs::read_to_string(&html_path).expect("page written");
    assert!(
        html.contains("stream over tcp, 65536 B: 1.200 Gbit/s is above the 0.966 Gbit/s"),
        "the fault is not in the report's notes"
    );
    assert!(
        html.contains("a measurement fault, not a result"),
        "no fault sentence"
    );
    // The faulted point is drawn as a fault of its own, not on the line.
    assert!(
        html.contains("class=\"fault\""),
        "no fault mark in the page"
    );
    if images.exists() {
        let svgs: String = std::fs::read_dir(&images)
            .expect("images")
            .filter_map(|e| e.ok())
            .filter(|e| e.path().extension().is_some_and(|x| x == "svg"))
            .map(|e| std::fs::read_to_string(e.path()).expect("svg"))
            .collect();
        assert!(svgs.contains("class=\"fault\""), "no fault in the SVGs");
    }

    let o = netgap()
        .arg("compare")
        .arg(&base)
        .arg(&new)
        .output()
        .expect("runs");
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    let row = out
        .lines()
        .find(|l| l.starts_with("stream") && l.contains("64K"))
        .unwrap_or_else(|| panic!("no 64K row in {out}"));
    assert!(row.ends_with("fault"), "{row}");
    assert!(!row.contains("better"), "{row}");
    assert!(
        out.contains("0 better") && out.contains("1 faulted"),
        "{out}"
    );
    assert!(
        err.contains("past what their path allows") || out.contains("past what their path allows"),
        "{out}{err}"
    );
    // The clean points of the same files are judged as before.
    assert_eq!(o.status.code(), Some(0), "{out}{err}");
}

#[test]
fn a_run_over_a_shaped_link_records_its_limit_and_stays_under_it_or_is_flagged() {
    if !system_ready("a_run_over_a_shaped_link_records_its_limit_and_stays_under_it_or_is_flagged")
    {
        return;
    }
    let (tb, _) = Testbed::up("tphys", &["--hosts", "3", "--rate", "1G"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let records = tb.run(
        "stream,pingpong",
        &[
            "-t",
            "tcp,udp",
            "-s",
            "32K",
            "--reps",
            "3",
            "--rep-time",
            "300ms",
        ],
        &json,
    );
    assert_eq!(records.len(), 4, "{records:#?}");
    // Fan-in from two client hosts over a switch: the server's one link.
    let fanin = tb.run(
        "fanin",
        &["--clients", "2", "--reps", "2", "--duration", "300ms"],
        &dir.path().join("fanin.jsonl"),
    );
    assert_eq!(fanin.len(), 1, "{fanin:#?}");
    let fanin_limit = fanin[0]["physics"]["payload_limit_gbps"].as_f64();
    assert!(
        fanin_limit.is_some_and(|l| (l - TCP_LIMIT_GBPS).abs() < 1e-9),
        "{fanin_limit:?}"
    );
    for r in records.iter().chain(&fanin) {
        let what = format!("{} {}", r["test"], r["transport"]);
        let limit = r["physics"]["payload_limit_gbps"]
            .as_f64()
            .unwrap_or_else(|| panic!("{what}: no limit in {r}"));
        assert_eq!(r["stack"]["path"]["rate_bps"], 1_000_000_000u64, "{what}");
        // The framing the limit was found for is the one the transport
        // declared, carried in the stack.
        assert_eq!(r["stack"]["framing"], r["transport"], "{what}");
        if r["transport"] == "tcp" {
            assert!((limit - TCP_LIMIT_GBPS).abs() < 1e-9, "{what}: {limit}");
        } else {
            // One 32 KiB datagram (netgap's 24-byte header and udp's 8)
            // in 23 IP fragments of at most 1480 bytes, each with its IP
            // and Ethernet headers.
            let wire = 32768.0 + 32.0 + 23.0 * 34.0;
            assert!((limit - 32768.0 / wire).abs() < 1e-9, "{what}: {limit}");
        }
        let faulted = !r["physics"]["fault"].is_null();
        eprintln!(
            "{what}: {} {} (limit {limit:.4} Gbit/s, fault {})",
            r["value"], r["metric"], r["physics"]["fault"]
        );
        if r["metric"] == "bandwidth_gbps" {
            let v = common::f(&r["value"]);
            assert!(v <= limit * 1.01 || faulted, "{what}: {v} above {limit}");
        }
        if faulted {
            let warned = r["warnings"]
                .as_array()
                .expect("warnings")
                .iter()
                .any(|w| w.as_str().is_some_and(|w| w.contains("measurement fault")));
            assert!(warned, "{what}: a fault with no warning: {r}");
        }
    }
    tb.down();
}
