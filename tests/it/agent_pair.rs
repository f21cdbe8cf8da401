//! A point-to-point test with both roles on agents: `netgap run pingpong`
//! and `stream` with `--hosts @FILE --key KEY` on a two-host testbed whose
//! hosts file names only the agents (no network namespaces), as a
//! cluster's nodes are: h1's agent serves, h2's agent plays the client,
//! and this process only coordinates (as it does over the testbed's own
//! hosts file, the `testbed` module's runs). The records are those of a
//! run from the client host: bytes both ways, h2 as the host and h1 as the
//! peer, each with its own interface; `sweep` and `logp` place their roles
//! alike. A stopped agent, server or client,
//! is named within the timeout, and every point measured before stays in
//! the results file.
//!
//! Without root or namespaces it says why and passes, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI).

use crate::common::testbed::{link_bytes, Testbed};
use crate::common::{netgap, ok, read_records, system_ready, u};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The testbed's hosts file without the namespaces and the key: hosts that
/// are agents only, as a cluster's nodes are.
fn agents_only(tb: &Testbed, dir: &Path) -> PathBuf {
    let mut file = tb.hosts();
    for h in &mut file.hosts {
        h.netns = None;
    }
    file.key_file = None;
    let path = dir.join("agents.json");
    std::fs::write(&path, serde_json::to_string(&file).expect("hosts file")).expect("written");
    path
}

fn check_records(records: &[Value], tests: &[&str]) {
    let names: Vec<&str> = records
        .iter()
        .map(|r| r["test"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(names, tests);
    for r in records {
        let test = r["test"].as_str().unwrap_or("");
        // The client's host is h2, the server's h1, each as its agent
        // reported it from its namespace.
        assert_eq!(r["host"]["hostname"], "h2", "{test}: {}", r["host"]);
        assert_eq!(
            r["peer_host"]["hostname"], "h1",
            "{test}: {}",
            r["peer_host"]
        );
        assert_eq!(r["host"]["interface"], "eth0", "{test}: {}", r["host"]);
        assert_eq!(r["peer_host"]["interface"], "eth0", "{test}");
        assert_eq!(r["options"]["peer"], "agents: hosts-file", "{test}");
        let b = &r["bytes"];
        assert!(u(&b["client_tx"]) > 0, "{test}: {b}");
        assert!(u(&b["server_tx"]) > 0, "{test}: {b}");
        assert_eq!(u(&b["client_tx"]), u(&b["server_rx"]), "{test}: {b}");
        assert_eq!(u(&b["server_tx"]), u(&b["client_rx"]), "{test}: {b}");
        assert!(r["value"].as_f64().is_some_and(|v| v > 0.0), "{test}: {r}");
        assert!(r["cpu"]["local"].is_object() && r["cpu"]["remote"].is_object());
        assert!(r["stack"]["path"].is_object(), "{test}: {r}");
        if test == "pingpong" {
            assert!(r["percentiles"]["p50"].as_f64().is_some(), "{test}: {r}");
        }
    }
}

/// The pid of `host`'s agent on the testbed.
fn agent_pid(tb: &Testbed, host: &str) -> nix::unistd::Pid {
    let text = std::fs::read_to_string(tb.dir().join(format!("{host}.pid"))).expect("pid file");
    nix::unistd::Pid::from_raw(text.trim().parse().expect("a pid"))
}

/// Runs many pingpong points against the agents, stops `host`'s agent
/// once the first point is written, and checks the run ends naming `host`
/// within `--timeout` and two seconds (and a moment to wake), keeping the
/// points it measured.
fn stop_one(tb: &Testbed, hosts: &str, key: &Path, dir: &Path, host: &str) {
    use nix::sys::signal::{kill, Signal};
    let json = dir.join(format!("stopped-{host}.jsonl"));
    let mut run = netgap()
        .args(["run", "pingpong", "--hosts", hosts, "--key"])
        .arg(key)
        .args(["-s", "1..64K", "--reps", "3", "--rep-time", "50ms"])
        .args(["--timeout", "1s", "--json"])
        .arg(&json)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("run starts");
    let t0 = Instant::now();
    while !crate::common::has_whole_record(&json) {
        assert!(t0.elapsed() < Duration::from_secs(30), "no point measured");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Into the next point's repetitions (a point takes its calibration and
    // three of 50 ms), past the moment its roles open.
    std::thread::sleep(Duration::from_millis(100));
    let pid = agent_pid(tb, host);
    kill(pid, Signal::SIGSTOP).expect("stop the agent");
    let stopped = Instant::now();
    let out = loop {
        if run.try_wait().expect("wait").is_some() || stopped.elapsed() > Duration::from_secs(30) {
            let _ = run.kill();
            break run.wait_with_output().expect("output");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = stopped.elapsed();
    kill(pid, Signal::SIGCONT).expect("continue the agent");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the run went on: {stderr}");
    let error = stderr
        .lines()
        .find(|l| l.starts_with("netgap: error:"))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    eprintln!("{host}'s agent stopped: named {took:?} after the stop: {error}");
    assert!(error.contains(&format!("host {host} (")), "{error}");
    // The coordinator names a silent agent once nothing has been heard
    // from it for --timeout and two seconds; the stop may fall just after
    // its last word, so the run ends up to that long after the stop, plus
    // the coordinator's wake-up on a loaded machine.
    assert!(
        took <= Duration::from_millis(3_500),
        "named {took:?} after the stop: {error}"
    );
    let kept = read_records(&json);
    assert!(!kept.is_empty(), "the points measured before are kept");
    assert!(kept.iter().all(|r| r["test"] == "pingpong"));
}

#[test]
fn pingpong_and_stream_run_with_both_roles_on_agents() {
    const TEST: &str = "pingpong_and_stream_run_with_both_roles_on_agents";
    if !system_ready(TEST) {
        return;
    }
    let (tb, _) = Testbed::up("tpair", &["--hosts", "2"]);
    let dir = tempfile::tempdir().expect("tempdir");
    let file = agents_only(&tb, dir.path());
    let hosts = format!("@{}", file.display());
    let key = tb.key();
    let json = dir.path().join("pair.jsonl");
    let before = link_bytes(&tb.ns("h2"), "eth0");
    ok(netgap()
        .args(["run", "pingpong,stream", "--hosts", &hosts, "--key"])
        .arg(&key)
        .args(["-s", "1K", "--reps", "2", "-n", "200", "--json"])
        .arg(&json)
        .output()
        .expect("run"));
    let after = link_bytes(&tb.ns("h2"), "eth0");
    let records = read_records(&json);
    check_records(&records, &["pingpong", "stream"]);
    // The payload crossed h2's link: the client ran there, not here.
    let moved: u64 = records
        .iter()
        .map(|r| u(&r["bytes"]["client_tx"]) + u(&r["bytes"]["client_rx"]))
        .sum();
    assert!(
        after - before >= moved,
        "h2's link carried {} bytes, the points moved {moved}",
        after - before
    );
    // A sweep and LogP take the same placement.
    let json = dir.path().join("sweep.jsonl");
    ok(netgap()
        .args(["sweep", "--hosts", &hosts, "--key"])
        .arg(&key)
        .args(["--end", "64", "--json"])
        .arg(&json)
        .output()
        .expect("sweep"));
    let sweep = read_records(&json);
    assert!(!sweep.is_empty());
    for r in &sweep {
        assert_eq!(r["test"], "sweep", "{r}");
        assert_eq!(r["host"]["hostname"], "h2", "{r}");
        assert_eq!(r["peer_host"]["hostname"], "h1", "{r}");
    }
    let json = dir.path().join("logp.jsonl");
    ok(netgap()
        .args(["logp", "--hosts", &hosts, "--key"])
        .arg(&key)
        .args(["--sizes", "1", "--reps", "3", "--pin", "1,0", "--json"])
        .arg(&json)
        .output()
        .expect("logp"));
    let logp = read_records(&json);
    assert_eq!(logp.len(), 4, "o_s, o_r, g and L");
    for r in &logp {
        assert_eq!(r["host"]["hostname"], "h2", "{r}");
        assert_eq!(r["peer_host"]["hostname"], "h1", "{r}");
        // The client's agent ran its role on the CPU asked for.
        assert_eq!(r["options"]["placement"]["client_cpu"], 1, "{r}");
    }

    // Without the key the keyed agents refuse, in one line.
    let out = netgap()
        .args([
            "run", "pingpong", "--hosts", &hosts, "-s", "1", "--reps", "1",
        ])
        .output()
        .expect("run");
    crate::common::one_line_error(&out, "a run without the key", "key");

    // A stopped server, then a stopped client, each named.
    stop_one(&tb, &hosts, &key, dir.path(), "h1");
    stop_one(&tb, &hosts, &key, dir.path(), "h2");
}
