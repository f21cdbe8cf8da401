//! The emulator's own cost, named: on a testbed every host's packets are
//! forwarded and shaped by the one machine's CPUs, and a point held back
//! by that work says the emulator bound it, never "measure on a quieter
//! host" (the multirail run of the issue, over a 3-link mesh at 1 Gbit/s,
//! blamed 88% of the CPUs on other work that was not there); a point
//! beside a process spinning on every CPU names that other work. Three
//! links at 10 Gbit/s with the offloads off (a frame of the MTU at a time,
//! through every link's namespace) are more forwarding than any machine
//! of two CPUs keeps up with.
//!
//! Both situations run in one test, one after the other on one testbed, so
//! the busy loop of the second never lands on the first. The checks are of
//! attribution (which share the record names, and the words it uses),
//! never of a speed. The shares a machine shows depend on what else runs
//! (the softirq share is the machine's: another testbed's traffic counts
//! as forwarding too): each situation is measured again, up to three
//! times, until its figures show what it sets up (the forwarding past the
//! other work; a noisy point beside the loop that names other work), and
//! every record, whatever its figures, must name what they show.

use crate::common::testbed::Testbed;
use crate::common::{netgap, ok, read_records, system_ready, warnings};
use serde_json::Value;
use std::path::Path;
use std::process::{Child, Command};

/// Attempts at each situation before its figures must have shown it.
const ATTEMPTS: usize = 3;

/// The emulator's words in a record's warnings.
const EMULATOR_WORDS: &str = "the emulator, not the links, bound this point";

/// Processes spinning on the CPUs, stopped when the guard goes (also on a
/// panic), each by its own pid.
struct BusyLoop(Vec<Child>);

impl BusyLoop {
    /// Two shells spinning in a loop per online CPU, so they outweigh
    /// whatever else the machine runs.
    fn start() -> BusyLoop {
        let cpus = std::thread::available_parallelism().map_or(2, |n| n.get());
        BusyLoop(
            (0..2 * cpus)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .spawn()
                        .expect("sh spins")
                })
                .collect(),
        )
    }
}

impl Drop for BusyLoop {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `netgap run TEST --hosts @FILE FLAGS --json JSON`: its table and
/// warnings (stdout and stderr) and its records.
fn run(tb: &Testbed, test: &str, flags: &[&str], json: &Path) -> (String, String, Vec<Value>) {
    let _ = std::fs::remove_file(json);
    let out = netgap()
        .args(["run", test, "--hosts", &tb.hosts_arg()])
        .args(flags)
        .arg("--json")
        .arg(json)
        .output()
        .expect("netgap run");
    let err = String::from_utf8_lossy(&out.stderr).into_owned();
    (ok(out), err, read_records(json))
}

/// A share of the record's `cpu_load`, percent.
fn share(r: &Value, key: &str) -> f64 {
    r["cpu_load"][key]
        .as_f64()
        .unwrap_or_else(|| panic!("no cpu_load.{key} in {}", r["cpu_load"]))
}

/// Checks that `r` names what its figures show: the emulator when the
/// testbed's forwarding was named (and the point noisy or held below its
/// limit), other work in a noise warning only when it outweighed the
/// forwarding, and never both.
fn assert_names_what_it_measured(r: &Value) {
    let load = &r["cpu_load"];
    assert_eq!(load["testbed"], true, "{load}");
    let (forwarding, other) = (share(r, "softirq_percent"), share(r, "other_percent"));
    let w = warnings(r).join(" | ");
    let named = load["bound_by"] == "emulator";
    if named {
        assert!(forwarding >= 20.0 && forwarding >= other, "{load}");
        assert!(w.contains(EMULATOR_WORDS), "{w}");
        assert!(!w.contains("quieter host"), "{w}");
    } else {
        assert!(!w.contains(EMULATOR_WORDS), "{load}: {w}");
    }
    if w.contains("other work kept") {
        assert!(other > forwarding || forwarding < 20.0, "{load}: {w}");
    }
}

#[test]
fn the_testbeds_forwarding_is_named_as_the_emulator_and_a_busy_loop_as_other_work() {
    let test = "the_testbeds_forwarding_is_named_as_the_emulator_and_a_busy_loop_as_other_work";
    if !system_ready(test) {
        return;
    }
    // The testbed's shape: two hosts of a mesh, three links, each
    // forwarded and shaped in a namespace of its own; at 10 Gbit/s and
    // with the offloads off, so the forwarding outruns the machine. The
    // machine is declared to forward far more than it does: calibrated, it
    // would refuse three such links (tests/it/forwarding.rs), and this
    // test is of what a run past it says.
    let (tb, _) = Testbed::up(
        "temu",
        &[
            "--hosts",
            "2",
            "--topology",
            "mesh",
            "--links",
            "3",
            "--rate",
            "10G",
            "--offload",
            "off",
            "--forwarding",
            "1000G",
        ],
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");

    // 1. A stream over every link at once: three links' worth of
    // forwarding, more than the two CPUs keep up with.
    let mut seen = Vec::new();
    let named = (0..ATTEMPTS).find_map(|_| {
        let (table, err, recs) = run(
            &tb,
            "multirail",
            &["--reps", "3", "--duration", "500ms"],
            &json,
        );
        assert_eq!(recs.len(), 1, "{recs:#?}");
        let r = recs.into_iter().next().expect("one record");
        assert_names_what_it_measured(&r);
        seen.push(r["cpu_load"].to_string());
        eprintln!("multirail: {} Gbit/s, {}", r["value"], r["cpu_load"]);
        (r["cpu_load"]["bound_by"] == "emulator").then_some((table, err, r))
    });
    let (table, err, r) = named
        .unwrap_or_else(|| panic!("the forwarding was never named in {ATTEMPTS} runs: {seen:#?}"));
    let row = table
        .lines()
        .find(|l| l.starts_with("multirail"))
        .unwrap_or_else(|| panic!("no row in {table}"));
    assert!(row.contains("emulator-bound: forwarding "), "{row}");
    assert!(err.contains(EMULATOR_WORDS), "{err}");
    assert!(!err.contains("quieter host"), "{err}");
    // Every end's threads are the point's own: the other host's agent is
    // not other work.
    let hosts = r["cpu_load"]["hosts"].as_array().expect("hosts").len();
    assert_eq!(hosts, 2, "{}", r["cpu_load"]);
    for h in r["hosts_cpu"].as_array().expect("hosts_cpu") {
        assert!(
            h["cpu"]["softirq_percent"].as_f64().is_some(),
            "every reading has its softirq share: {h}"
        );
    }

    // 2. Beside processes spinning on every CPU, a ping-pong whose
    // forwarding is light: the busy CPUs are other work.
    let busy = BusyLoop::start();
    let mut seen = Vec::new();
    let noisy = (0..ATTEMPTS).find_map(|_| {
        let (_, _, recs) = run(
            &tb,
            "pingpong",
            &["-s", "1K,64K", "--reps", "5", "--rep-time", "100ms"],
            &json,
        );
        assert_eq!(recs.len(), 2, "{recs:#?}");
        for r in &recs {
            assert_names_what_it_measured(r);
            eprintln!("pingpong {}: {}", r["size_bytes"], r["cpu_load"]);
            seen.push(r["cpu_load"].to_string());
        }
        recs.into_iter().find(|r| {
            warnings(r)
                .iter()
                .any(|w| w.starts_with("repetitions vary") && w.contains("other work kept"))
        })
    });
    drop(busy);
    let r = noisy.unwrap_or_else(|| {
        panic!("no noisy point named other work beside the loop in {ATTEMPTS} runs: {seen:#?}")
    });
    let (forwarding, other) = (share(&r, "softirq_percent"), share(&r, "other_percent"));
    assert!(other >= 20.0 && other > forwarding, "{}", r["cpu_load"]);
    assert!(r["cpu_load"].get("bound_by").is_none(), "{}", r["cpu_load"]);
    let w = warnings(&r).join(" | ");
    assert!(
        w.contains("while other work kept") && w.contains("of the testbed machine's CPUs busy"),
        "{w}"
    );
    assert!(w.contains("measure on a quieter host"), "{w}");
    assert!(!w.contains(EMULATOR_WORDS), "{w}");
    tb.down();
}
