//! `netgap compare` on synthetic results with a planted regression, a planted
//! improvement and pure noise: it must find the first two, not the third,
//! and gate on the regression through its exit status.

use assert_cmd::cargo::CommandCargoExt;
use serde_json::{json, Value};
use std::path::Path;
use std::process::Command;

/// Deterministic noise: a linear congruential generator giving roughly
/// normal values (sum of four uniforms) with the given relative spread.
struct Noise(u64);

impl Noise {
    fn uniform(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }

    fn reps(&mut self, mean: f64, rel: f64, n: usize) -> Vec<f64> {
        (0..n)
            .map(|_| {
                let z = (0..4).map(|_| self.uniform()).sum::<f64>() - 2.0;
                mean * (1.0 + rel * z)
            })
            .collect()
    }
}

fn record(test: &str, transport: &str, size: u64, metric: &str, reps: &[f64]) -> Value {
    let s = netgap::stats::Summary::from_reps(reps).expect("finite reps");
    json!({
        "test": test, "transport": transport, "mode": "event", "size_bytes": size,
        "metric": metric, "value": s.value,
        "stats": netgap::record::RecordStats::from(&s),
        "percentiles": null, "service_demand_us_per_kib": null, "datagrams": null,
        "warnings": [], "version": "0.1.0", "time": "2026-11-22T08:00:00Z"
    })
}

/// Points: (test, transport, size, metric, base mean, new mean).
const POINTS: [(&str, &str, u64, &str, f64, f64); 8] = [
    ("pingpong", "tcp", 64, "latency_us", 10.0, 12.0), // regression: +20% latency
    ("stream", "tcp", 1 << 20, "bandwidth_gbps", 20.0, 25.0), // improvement
    ("pingpong", "unix", 64, "latency_us", 5.0, 5.0),
    ("pingpong", "unix", 1024, "latency_us", 6.0, 6.0),
    ("pingpong", "tcp", 1024, "latency_us", 11.0, 11.0),
    ("stream", "unix", 1 << 20, "bandwidth_gbps", 40.0, 40.0),
    ("stream", "unix", 65536, "bandwidth_gbps", 30.0, 30.0),
    ("stream", "tcp", 65536, "bandwidth_gbps", 15.0, 15.0),
];

fn write(path: &Path, records: &[Value]) {
    let text: String = records.iter().map(|r| format!("{r}\n")).collect();
    std::fs::write(path, text).expect("write results");
}

/// BASE and NEW files; `plant` false keeps the planted points unchanged.
fn files(dir: &Path, plant: bool) -> (std::path::PathBuf, std::path::PathBuf) {
    let mut noise = Noise(42);
    let (mut base, mut new) = (Vec::new(), Vec::new());
    for (test, transport, size, metric, b, n) in POINTS {
        let n = if plant { n } else { b };
        base.push(record(
            test,
            transport,
            size,
            metric,
            &noise.reps(b, 0.02, 10),
        ));
        new.push(record(
            test,
            transport,
            size,
            metric,
            &noise.reps(n, 0.02, 10),
        ));
    }
    let (bp, np) = (dir.join("base.jsonl"), dir.join("new.jsonl"));
    write(&bp, &base);
    write(&np, &new);
    (bp, np)
}

fn compare(base: &Path, new: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let o = Command::cargo_bin("netgap")
        .expect("binary built")
        .arg("compare")
        .arg(base)
        .arg(new)
        .args(extra)
        .output()
        .expect("runs");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
    )
}

fn line<'a>(out: &'a str, label: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(label))
        .unwrap_or_else(|| panic!("no line for {label:?} in\n{out}"))
}

#[test]
fn finds_the_planted_regression_and_improvement_and_not_the_noise() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, new) = files(dir.path(), true);
    let (code, out) = compare(&base, &new, &[]);
    assert_eq!(code, Some(3), "{out}");
    let reg = line(&out, "pingpong tcp/event 64 latency_us");
    assert!(reg.contains("worse") && reg.contains("REGRESSION"), "{reg}");
    let imp = line(&out, "stream tcp/event 1M bandwidth_gbps");
    assert!(
        imp.contains("better") && !imp.contains("REGRESSION"),
        "{imp}"
    );
    for label in [
        "pingpong unix/event 64 ",
        "pingpong unix/event 1K ",
        "pingpong tcp/event 1K ",
        "stream unix/event 1M ",
        "stream unix/event 64K ",
        "stream tcp/event 64K ",
    ] {
        assert!(line(&out, label).ends_with("same"), "{}", line(&out, label));
    }
    assert!(out.contains("8 points: 1 better, 1 worse, 6 same"), "{out}");
}

#[test]
fn pure_noise_passes_the_gate() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, new) = files(dir.path(), false);
    let (code, out) = compare(&base, &new, &[]);
    assert_eq!(code, Some(0), "{out}");
    assert!(!out.contains("REGRESSION"), "{out}");
}

#[test]
fn a_regression_under_the_threshold_is_reported_but_does_not_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, new) = files(dir.path(), true);
    let (code, out) = compare(&base, &new, &["--threshold", "50"]);
    assert_eq!(code, Some(0), "{out}");
    assert!(line(&out, "pingpong tcp/event 64 latency_us").ends_with("worse"));
}

#[test]
fn bad_threshold_and_disjoint_files_are_one_line_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, _) = files(dir.path(), true);
    let o = Command::cargo_bin("netgap")
        .expect("binary built")
        .args(["compare", "--threshold", "-3"])
        .arg(&base)
        .arg(&base)
        .output()
        .expect("runs");
    assert_ne!(o.status.code(), Some(0));
    assert_eq!(String::from_utf8_lossy(&o.stderr).lines().count(), 1);
    let other = dir.path().join("other.jsonl");
    write(
        &other,
        &[record("bibw", "tcp", 1, "bandwidth_gbps", &[1.0, 1.1])],
    );
    let o = Command::cargo_bin("netgap")
        .expect("binary built")
        .arg("compare")
        .arg(&base)
        .arg(&other)
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no point in common"), "{err}");
}
