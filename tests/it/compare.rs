//! `netgap compare` on synthetic results with a planted regression, a planted
//! improvement and pure noise: it must find the first two, not the third,
//! and gate on the regression through its exit status. Drift: two stacks of
//! one interleaved run with a planted 10% difference and drift on both are
//! told apart; two separate runs that differ by drift alone are warned
//! about and never called better or worse.

use crate::common;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

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
    let interleaved = |recs: &mut Vec<Value>| {
        for r in recs.iter_mut() {
            r["interleaved"] = json!({"group": "one-run", "with": 2});
        }
    };
    interleaved(&mut base);
    interleaved(&mut new);
    write(&dir.join("base-interleaved.jsonl"), &base);
    write(&dir.join("new-interleaved.jsonl"), &new);
    (bp, np)
}

fn compare(base: &Path, new: &Path, extra: &[&str]) -> (Option<i32>, String) {
    let (code, out, _) = compare_full(&[base, new], extra);
    (code, out)
}

/// Runs `netgap compare FILES... EXTRA...`: exit status, stdout, stderr.
fn compare_full(files: &[&Path], extra: &[&str]) -> (Option<i32>, String, String) {
    let o = common::netgap()
        .arg("compare")
        .args(files)
        .args(extra)
        .output()
        .expect("runs");
    (
        o.status.code(),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
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
    let reg = line(&out, "pingpong tcp 64 latency_us");
    assert!(reg.contains("worse") && reg.contains("REGRESSION"), "{reg}");
    let imp = line(&out, "stream tcp 1M bandwidth_gbps");
    assert!(
        imp.contains("better") && !imp.contains("REGRESSION"),
        "{imp}"
    );
    for label in [
        "pingpong unix 64 ",
        "pingpong unix 1K ",
        "pingpong tcp 1K ",
        "stream unix 1M ",
        "stream unix 64K ",
        "stream tcp 64K ",
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
    // Between separate runs nothing under the threshold counts as real.
    assert!(line(&out, "pingpong tcp 64 latency_us").ends_with("within drift"));
    // Within one interleaved run the test alone decides.
    let (code, out) = compare(
        &dir.path().join("base-interleaved.jsonl"),
        &dir.path().join("new-interleaved.jsonl"),
        &["--threshold", "50"],
    );
    assert_eq!(code, Some(0), "{out}");
    assert!(line(&out, "pingpong tcp 64 latency_us").ends_with("worse"));
}

#[test]
fn bad_threshold_and_disjoint_files_are_one_line_errors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (base, _) = files(dir.path(), true);
    let o = common::netgap()
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
    let o = common::netgap()
        .arg("compare")
        .arg(&base)
        .arg(&other)
        .output()
        .expect("runs");
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("no point in common"), "{err}");
}

/// A stream point's record over `stack` (JSON of a stack identity), with
/// `interleaved` set when the run interleaved its stacks.
fn stack_record(size: u64, reps: &[f64], stack: &Value, group: Option<&str>) -> Value {
    let mut r = record("stream", "tcp", size, "bandwidth_gbps", reps);
    r["stack"] = stack.clone();
    if let Some(g) = group {
        r["interleaved"] = json!({"group": g, "with": 2});
    }
    r
}

fn testbed_stack(mtu: u32, label: Option<&str>) -> Value {
    let mut s = json!({
        "transport": "tcp", "mode": "event", "options": [],
        "path": {"kind": "testbed", "topology": "switch", "mtu_bytes": mtu, "offload": "off"}
    });
    if let Some(l) = label {
        s["label"] = json!(l);
    }
    s
}

/// Drift: a slow multiplicative wander of everything measured, as a
/// function of the repetition's position in the run.
fn drift(t: f64, phase: f64) -> f64 {
    1.0 + 0.06 * (t / 40.0 + phase).sin()
}

const SIZES: [u64; 8] = [64, 256, 1024, 4096, 16384, 65536, 262144, 1 << 20];

fn mean_gbps(size: u64) -> f64 {
    9.0 * size as f64 / (size as f64 + 900.0)
}

#[test]
fn an_interleaved_ab_run_finds_a_planted_10_percent_difference_under_drift() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut noise = Noise(7);
    let (a, b) = (testbed_stack(1500, None), testbed_stack(9000, None));
    let mut records = Vec::new();
    let mut t = 0.0;
    for size in SIZES {
        // The repetitions alternate between the stacks, so the drift of
        // each moment falls on both; B is 10% faster.
        let (mut ra, mut rb) = (Vec::new(), Vec::new());
        for _ in 0..10 {
            ra.push(mean_gbps(size) * drift(t, 0.0) * noise.reps(1.0, 0.01, 1)[0]);
            rb.push(1.10 * mean_gbps(size) * drift(t + 1.0, 0.0) * noise.reps(1.0, 0.01, 1)[0]);
            t += 2.0;
        }
        records.push(stack_record(size, &ra, &a, Some("run-1")));
        records.push(stack_record(size, &rb, &b, Some("run-1")));
    }
    let run = dir.path().join("run.jsonl");
    write(&run, &records);
    let (code, out, err) = compare_full(
        &[&run],
        &["--base-stack", "MTU 1500", "--new-stack", "MTU 9000"],
    );
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(!err.contains("separate runs"), "{err}");
    for size in ["64 ", "1K ", "1M "] {
        let l = line(
            &out,
            &format!("stream tcp, MTU 1500 -> tcp, MTU 9000 {size}"),
        );
        assert!(l.ends_with("better"), "{l}");
    }
    assert!(
        out.contains("8 points: 8 better, 0 worse, 0 same, 0 untested (Welch's t-test, p < 0.05), all from one interleaved run"),
        "{out}"
    );
}

#[test]
fn separate_runs_with_drift_only_are_warned_about_and_not_called_real() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut noise = Noise(11);
    // Two runs of the same stack minutes apart, at MTU 1500 and at 9000,
    // on a path where MTU changes nothing: only the drift differs.
    let run = |stack: &Value, phase: f64, noise: &mut Noise| -> Vec<Value> {
        let mut t = 0.0;
        SIZES
            .iter()
            .map(|&size| {
                let reps: Vec<f64> = (0..10)
                    .map(|i| {
                        mean_gbps(size)
                            * drift(t + f64::from(i), phase)
                            * noise.reps(1.0, 0.005, 1)[0]
                    })
                    .collect();
                t += 10.0;
                stack_record(size, &reps, stack, None)
            })
            .collect()
    };
    let (bp, np) = (
        dir.path().join("mtu1500.jsonl"),
        dir.path().join("mtu9000.jsonl"),
    );
    write(&bp, &run(&testbed_stack(1500, None), 0.0, &mut noise));
    write(&np, &run(&testbed_stack(9000, None), 2.0, &mut noise));
    let (code, out, err) = compare_full(&[&bp, &np], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    // One line says drift between runs is not in the test, one that the two
    // runs measured different conditions.
    let warnings: Vec<&str> = err.lines().collect();
    assert_eq!(warnings.len(), 2, "{err}");
    assert!(warnings[0].contains("separate runs") && warnings[0].contains("drift allowance"));
    assert!(warnings[1].contains("MTU 1500 in BASE is compared with tcp, MTU 9000 in NEW"));
    assert!(warnings[1].contains("different conditions"));
    assert!(
        !out.lines()
            .any(|l| l.ends_with("better") || l.ends_with("worse")),
        "{out}"
    );
    // Welch's test alone would have called them different: the drift
    // between the runs is far larger than the spread within each.
    let within = out.lines().filter(|l| l.ends_with("within drift")).count();
    assert!(within >= 4, "{out}");
}

/// Two results files in `dir` of one testbed stack over every size, told
/// apart only by their labels, with noise from `seed`.
fn labelled_pair(dir: &Path, seed: u64, base_label: &str, new_label: &str) -> (PathBuf, PathBuf) {
    let mut noise = Noise(seed);
    let mut one = |label: &str| -> Vec<Value> {
        SIZES
            .iter()
            .map(|&s| {
                let reps = noise.reps(mean_gbps(s), 0.01, 8);
                stack_record(s, &reps, &testbed_stack(9000, Some(label)), None)
            })
            .collect()
    };
    let (bp, np) = (dir.join("a.jsonl"), dir.join("b.jsonl"));
    write(&bp, &one(base_label));
    write(&np, &one(new_label));
    (bp, np)
}

#[test]
fn stacks_that_differ_only_by_label_are_paired_and_said_to() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bp, np) = labelled_pair(dir.path(), 3, "kernel 6.1", "kernel 6.8");
    let (code, out, err) = compare_full(&[&bp, &np], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    assert!(err.contains("differ only by label"), "{err}");
    assert!(out.contains("8 points:"), "{out}");
}

#[test]
fn one_file_needs_two_stacks_named_and_a_name_must_match() {
    let dir = tempfile::tempdir().expect("tempdir");
    let run = dir.path().join("run.jsonl");
    let mut noise = Noise(5);
    write(
        &run,
        &[
            stack_record(
                64,
                &noise.reps(1.0, 0.01, 5),
                &testbed_stack(1500, None),
                Some("g"),
            ),
            stack_record(
                64,
                &noise.reps(1.1, 0.01, 5),
                &testbed_stack(9000, None),
                Some("g"),
            ),
        ],
    );
    for (args, needle) in [
        (&[][..], "--base-stack and --new-stack"),
        (
            &["--base-stack", "MTU 4000", "--new-stack", "MTU 9000"][..],
            "matches no stack",
        ),
        (
            &["--base-stack", "tcp", "--new-stack", "tcp"][..],
            "pick the same stack",
        ),
    ] {
        let (code, _, err) = compare_full(&[&run], args);
        assert_eq!(code, Some(1), "{args:?}: {err}");
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

#[test]
fn the_stacks_of_one_interleaved_run_compare_without_a_drift_warning() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("ab.jsonl");
    common::run_ok(
        common::netgap()
            .args(["run", "pingpong", "-s", "1", "--reps", "3", "-n", "20"])
            .args(["--interleave", "-t", "tcp,unix", "--json"])
            .arg(&json),
    );
    let out = common::netgap()
        .arg("compare")
        .arg(&json)
        .args(["--base-stack", "tcp", "--new-stack", "unix"])
        .output()
        .expect("compare");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stdout.contains("all from one interleaved run"), "{stdout}");
    assert!(!stderr.contains("drift"), "{stderr}");
}

/// A label is text from a results file: its escape sequences (clear the
/// screen, retitle the window) reach neither the table nor the warnings
/// raw, but escaped.
#[test]
fn escape_bytes_in_a_label_are_printed_escaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (bp, np) = labelled_pair(
        dir.path(),
        5,
        "old\u{1b}[2J\u{1b}[H",
        "new\u{1b}]0;owned\u{7}\u{9b}31m",
    );
    let (code, out, err) = compare_full(&[&bp, &np], &[]);
    assert_eq!(code, Some(0), "{out}{err}");
    for text in [&out, &err] {
        assert!(
            !text.chars().any(|c| c.is_control() && c != '\n'),
            "a raw control character in {text:?}"
        );
    }
    assert!(out.contains("old\\u{1b}[2J\\u{1b}[H"), "{out}");
    assert!(out.contains("new\\u{1b}]0;owned\\u{7}\\u{9b}31m"), "{out}");
    assert!(out.contains("8 points:"), "{out}");
}

/// Points of one run that differ only in a workload's options (nginx and
/// Apache, two alphas, read and write) are each matched with their own,
/// never collapsed: a file compared with itself matches every record.
#[test]
fn points_that_differ_in_workload_options_are_matched_each_with_its_own() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/report/apps.jsonl");
    let recs = netgap::report::load::load_files(&[path]).expect("fixture loads");
    let c = netgap::compare::compare(
        &recs,
        &recs,
        &netgap::compare::CompareOptions {
            threshold_pct: 5.0,
            ..Default::default()
        },
    )
    .expect("compares");
    assert_eq!(c.changes.len(), recs.len());
    assert!(c.only_base.is_empty() && c.only_new.is_empty());
    assert!(c
        .changes
        .iter()
        .any(|ch| ch.label().contains("server=apache")));
}
