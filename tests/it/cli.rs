//! The real binary against real agents on loopback: every test × transport ×
//! mode end to end, the results files, and the error cases a user meets.

use serde_json::Value;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{fails_with_one_line, netgap, read_records, run_ok, AgentProc};

const DOCUMENTED_FIELDS: [&str; 14] = [
    "test",
    "transport",
    "mode",
    "size_bytes",
    "metric",
    "value",
    "stats",
    "percentiles",
    "cpu",
    "host",
    "peer_host",
    "options",
    "version",
    "time",
];

fn check_record(r: &Value) {
    for f in DOCUMENTED_FIELDS {
        assert!(r.get(f).is_some(), "field {f} missing in {r}");
    }
    for f in [
        "min",
        "median",
        "max",
        "stdev",
        "ci95_low",
        "ci95_high",
        "reps",
    ] {
        assert!(r["stats"].get(f).is_some(), "stats.{f} missing");
    }
    for side in ["local", "remote"] {
        for f in ["system_busy_percent", "process_percent"] {
            assert!(r["cpu"][side][f].is_number(), "cpu.{side}.{f} missing");
        }
    }
    let b = &r["bytes"];
    assert_eq!(
        b["client_tx"], b["server_rx"],
        "client to server bytes in {r}"
    );
    assert_eq!(
        b["server_tx"], b["client_rx"],
        "server to client bytes in {r}"
    );
    assert!(b["client_tx"].as_u64().unwrap_or(0) > 0);
    let value = r["value"].as_f64().expect("value is a number");
    assert!(value > 0.0 && value.is_finite());
    let s = &r["stats"];
    let (min, med, max) = (
        s["min"].as_f64().unwrap_or(f64::NAN),
        s["median"].as_f64().unwrap_or(f64::NAN),
        s["max"].as_f64().unwrap_or(f64::NAN),
    );
    assert!(
        min <= med && med <= max && min <= value && value <= max,
        "{s}"
    );
    if r["metric"] == "latency_us" {
        let p = &r["percentiles"];
        let ps: Vec<f64> = ["p50", "p90", "p99", "p999", "max"]
            .iter()
            .map(|k| p[*k].as_f64().expect("percentile"))
            .collect();
        assert!(
            ps.windows(2).all(|w| w[0] <= w[1]),
            "percentiles ordered: {p}"
        );
    }
    assert!(r["host"]["hostname"].is_string());
    assert!(r["peer_host"]["kernel"].is_string());
    assert!(r["options"]["placement"].is_object());
}

#[test]
fn every_test_transport_and_mode_moves_every_byte() {
    let agent = AgentProc::start("127.0.0.1");
    let dir = tempfile::tempdir().expect("tempdir");
    for transport in ["tcp", "unix"] {
        for mode in ["event", "poll"] {
            let json = dir.path().join(format!("{transport}-{mode}.jsonl"));
            let out = netgap()
                .args(["run", "pingpong,stream,bibw-pingpong,bibw", "--peer"])
                .arg(&agent.addr)
                .args(["--transport", transport, "--mode", mode])
                .args(["--sizes", "1,4K,1M", "--reps", "3", "--rep-time", "5ms"])
                .arg("--json")
                .arg(&json)
                .output()
                .expect("runs");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{transport} {mode}: {stderr}");
            let records = read_records(&json);
            assert_eq!(records.len(), 4 * 3, "{transport} {mode}");
            for r in &records {
                check_record(r);
                assert_eq!(r["transport"], transport);
                assert_eq!(r["mode"], mode);
                assert_eq!(r["stats"]["reps"].as_array().map(Vec::len), Some(3));
            }
            let stdout = String::from_utf8_lossy(&out.stdout);
            assert!(stdout.starts_with("test"), "table header first: {stdout}");
            assert!(stdout.contains("latency_us") && stdout.contains("bw_gbps"));
            assert_eq!(stdout.lines().count(), 1 + 12, "{stdout}");
        }
    }
}

#[test]
fn embedded_agent_over_ipv6_and_csv() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let csv = dir.path().join("r.csv");
    let out = run_ok(
        netgap()
            .args(["run", "pingpong", "-6", "--sizes", "1,64", "--reps", "3"])
            .args(["--iterations", "200", "--pin", "0,0"])
            .arg("--json")
            .arg(&json)
            .arg("--csv")
            .arg(&csv),
    );
    let records = read_records(&json);
    assert_eq!(records.len(), 2);
    for r in &records {
        check_record(r);
        assert_eq!(r["iterations_per_rep"], 200);
        assert_eq!(r["options"]["peer"], "embedded-ipv6");
        assert_eq!(r["options"]["placement"]["client_cpu"], 0);
        assert_eq!(r["options"]["placement"]["server_cpu"], 0);
        assert_eq!(
            r["bytes"]["client_tx"].as_u64(),
            Some(3 * 200 * r["size_bytes"].as_u64().unwrap_or(0))
        );
    }
    let csv_text = std::fs::read_to_string(&csv).expect("csv written");
    let lines: Vec<&str> = csv_text.lines().collect();
    assert_eq!(lines.len(), 3, "{csv_text}");
    assert!(lines[0].starts_with("time,test,transport,mode,size_bytes,metric,value"));
    // No progress bar when stderr is not a terminal.
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !stderr.contains('\r') && !stderr.contains("eta "),
        "{stderr}"
    );
}

#[test]
fn list_shows_tests_and_transports() {
    let out = netgap().arg("list").output().expect("runs");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for name in ["pingpong", "stream", "bibw-pingpong", "bibw", "tcp", "unix"] {
        assert!(text.contains(name), "{name} missing from {text}");
    }
}

/// Runs netgap with `args`, expecting failure with exactly one line on stderr
/// containing `needle`.
#[test]
fn bad_input_gets_one_clear_line() {
    fails_with_one_line(&["run", "pingpnog"], "unknown test \"pingpnog\"");
    fails_with_one_line(
        &["run", "pingpong", "-t", "carrier-pigeon"],
        "unknown transport",
    );
    fails_with_one_line(&["run", "pingpong", "--sizes", "0"], "out of range");
    fails_with_one_line(&["run", "pingpong", "--sizes", "1G"], "out of range");
    fails_with_one_line(&["run", "pingpong", "--sizes", "12Q"], "12Q");
    fails_with_one_line(&["run", "pingpong", "--mode", "psychic"], "unknown mode");
    fails_with_one_line(
        &["run", "pingpong", "--peer", "no-such-host.invalid"],
        "bad peer",
    );
    fails_with_one_line(&["run", "pingpong", "--reps", "0"], "--reps");
    fails_with_one_line(&["frobnicate"], "frobnicate");
    fails_with_one_line(&["serve", "--bind", "not-an-ip"], "not-an-ip");
}

/// A relay acts only for the interface, hosts and key it was started
/// for: without any of them, or with one it cannot trust, it does not
/// start, and says why in one line (before it needs root or xdp).
#[test]
fn a_relay_without_its_interface_peers_or_key_refuses_to_start_in_one_line() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let key = common::new_key_file(dir.path(), "relay.key");
    let key = key.to_str().expect("utf-8");
    fails_with_one_line(
        &["relay", "--peers", "10.0.0.2", "--key", key],
        "--interface NAME is required",
    );
    fails_with_one_line(
        &["relay", "--interface", "eth1", "--key", key],
        "--peers is required",
    );
    fails_with_one_line(
        &["relay", "--interface", "eth1", "--peers", "10.0.0.2"],
        "--key FILE is required",
    );
    fails_with_one_line(
        &[
            "relay",
            "--interface",
            "eth1",
            "--peers",
            "127.0.0.1",
            "--key",
            key,
        ],
        "never to a loopback",
    );
    fails_with_one_line(
        &[
            "relay",
            "--interface",
            "eth1",
            "--peers",
            "10.0.0.0/40",
            "--key",
            key,
        ],
        "a prefix length of 0 to 32",
    );
    let open = dir.path().join("open.key");
    std::fs::copy(key, &open).expect("copy");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    fails_with_one_line(
        &[
            "relay",
            "--interface",
            "eth1",
            "--peers",
            "10.0.0.2",
            "--key",
            open.to_str().expect("utf-8"),
        ],
        "readable by group or others",
    );
    fails_with_one_line(
        &["serve", "--relay-interface", "eth1"],
        "--relay-interface needs --key",
    );
}

#[test]
fn unreachable_peer_is_one_line() {
    // A port nobody listens on: bind one, note it, close it.
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("port")
        .port();
    let peer = format!("127.0.0.1:{port}");
    fails_with_one_line(&["run", "pingpong", "--peer", &peer], "cannot connect");
}

#[test]
fn port_in_use_is_one_line() {
    let holder = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = holder.local_addr().expect("addr").port().to_string();
    fails_with_one_line(&["serve", "--port", &port], "already in use");
}

#[test]
fn killing_the_agent_mid_run_fails_fast_and_keeps_points() {
    let mut agent = AgentProc::start("127.0.0.1");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let mut run = netgap()
        .args(["run", "pingpong", "--peer", &agent.addr])
        .args(["--sizes", "1..64K", "--reps", "5", "--rep-time", "40ms"])
        .arg("--json")
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("runs");
    // Wait for two measured points, then kill the agent.
    let t0 = Instant::now();
    while read_records(&json).len() < 2 {
        assert!(t0.elapsed() < Duration::from_secs(60), "no points measured");
        std::thread::sleep(Duration::from_millis(20));
    }
    agent.kill();
    let killed_at = Instant::now();
    let status = loop {
        if let Some(s) = run.try_wait().expect("wait") {
            break s;
        }
        assert!(
            killed_at.elapsed() < Duration::from_secs(5),
            "run still going 5 s after the agent died"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(!status.success());
    let mut stderr = String::new();
    run.stderr
        .take()
        .expect("piped")
        .read_to_string(&mut stderr)
        .expect("read");
    assert!(
        stderr.contains("pingpong over tcp"),
        "names the test: {stderr}"
    );
    assert!(stderr.contains("bytes:"), "names the size: {stderr}");
    let records = read_records(&json);
    assert!(records.len() >= 2);
    records.iter().for_each(check_record);
}

#[test]
fn agent_survives_garbage_and_vanishing_clients() {
    let agent = AgentProc::start("127.0.0.1");
    // Garbage: a huge length prefix, then random bytes.
    let mut s = TcpStream::connect(&agent.addr).expect("connect");
    let _ = s.write_all(&[0xff, 0xff, 0xff, 0xff, 1, 2, 3]);
    drop(s);
    // A well-formed frame that is not JSON.
    let mut s = TcpStream::connect(&agent.addr).expect("connect");
    let _ = s.write_all(&[0, 0, 0, 3, b'a', b'b', b'c']);
    drop(s);
    // A client that says nothing and leaves.
    drop(TcpStream::connect(&agent.addr).expect("connect"));
    run_ok(
        netgap()
            .args(["run", "pingpong", "--peer", &agent.addr, "--sizes", "1"])
            .args(["--reps", "3", "--iterations", "100"]),
    );
}

#[test]
fn a_busy_agent_says_so() {
    use netgap::proto::codec::encode;
    use netgap::proto::message::{Request, PROTOCOL_VERSION};
    let agent = AgentProc::start("127.0.0.1");
    let mut holder = TcpStream::connect(&agent.addr).expect("connect");
    let hello = encode(&Request::Hello {
        protocol: PROTOCOL_VERSION,
        version: "test".into(),
    })
    .expect("encode");
    holder.write_all(&hello).expect("hello");
    let mut len = [0u8; 4];
    holder.read_exact(&mut len).expect("welcome arrives");
    fails_with_one_line(
        &["run", "pingpong", "--peer", &agent.addr, "--sizes", "1"],
        "busy",
    );
}

#[test]
fn plain_netgap_runs_the_main_job_and_compares_each_stack_with_tcp() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Two repetitions keep it short; the shape is what is checked.
    let out = netgap()
        .args(["--reps", "2"])
        .current_dir(dir.path())
        .output()
        .expect("runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let results = stdout
        .lines()
        .find_map(|l| l.strip_prefix("results: "))
        .expect("prints the results path");
    let records = read_records(&dir.path().join(results));
    // Every byte sent arrives, but over udp, which loses datagrams.
    records
        .iter()
        .filter(|r| r["transport"] != "udp")
        .for_each(check_record);
    // The stacks available here, each interleaved with the others at each
    // test and size; the others are skipped with one line each.
    let mut stacks: Vec<String> = Vec::new();
    for r in &records {
        let t = r["transport"].as_str().expect("transport").to_string();
        if !stacks.contains(&t) {
            stacks.push(t);
        }
    }
    for t in ["tcp", "unix", "shm", "uring", "udp"] {
        let skipped = stderr
            .lines()
            .any(|l| l.starts_with(&format!("netgap: note: skipping {t}: ")));
        assert!(stacks.iter().any(|s| s == t) != skipped, "{t}: {stderr}");
    }
    assert!(stacks.len() >= 3 && stacks[0] == "tcp", "{stacks:?}");
    let n = stacks.len() as u64;
    for r in &records {
        // Every stack of the test and size in one group; udp sits out
        // the size it cannot carry.
        let big = common::u(&r["size_bytes"]) > 65_536;
        let with = n - u64::from(big && stacks.iter().any(|s| s == "udp"));
        assert_eq!(common::u(&r["options"]["interleaved"]["with"]), with, "{r}");
        assert!(
            r["test"] == "pingpong" || r["test"] == "stream",
            "{}",
            r["test"]
        );
        assert_eq!(r["stats"]["reps"].as_array().map(Vec::len), Some(2));
        // Pinned apart where this process may use two CPUs.
        let placement = &r["options"]["placement"];
        if netgap::transport::affinity::allowed_cpus().len() >= 2 {
            assert!(placement["client_cpu"].is_u64(), "{placement}");
            assert_ne!(
                placement["client_cpu"], placement["server_cpu"],
                "{placement}"
            );
        }
    }
    // udp skips the size it cannot carry, in one line, and measures the rest.
    if stacks.iter().any(|s| s == "udp") {
        assert!(
            stderr.contains("netgap: note: udp carries at most"),
            "{stderr}"
        );
        assert!(records
            .iter()
            .all(|r| r["transport"] != "udp" || common::u(&r["size_bytes"]) <= 65_536));
    }
    // Each stack against tcp, per test and band, with a verdict.
    let summary = stdout
        .split_once("each stack against the host TCP stack")
        .map(|(_, s)| s)
        .expect("a summary against tcp");
    for test in ["pingpong latency_us", "stream bandwidth_gbps"] {
        assert!(summary.contains(test), "{summary}");
    }
    for s in &stacks[1..] {
        assert!(
            summary
                .lines()
                .any(|l| l.trim_start().starts_with(s.as_str())
                    && (l.contains("real") || l.contains("within noise"))),
            "{s}: {summary}"
        );
    }
    // The job ends with the report beside the results, and as root names
    // the study that comes next.
    let report = stdout
        .lines()
        .find_map(|l| l.strip_prefix("report: "))
        .expect("prints the report path");
    assert_eq!(
        Path::new(report),
        Path::new(results).with_extension("html").as_path()
    );
    assert!(dir.path().join(report).exists());
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    assert_eq!(
        stdout.contains("netgap study 000 --quick"),
        root,
        "{stdout}"
    );
}

#[test]
fn a_size_one_transport_cannot_carry_is_skipped_for_it_in_one_line() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let out = run_ok(
        netgap()
            .args([
                "run", "pingpong", "-t", "tcp,udp", "-s", "1,1M", "--reps", "2", "-n", "20",
                "--json",
            ])
            .arg(&json),
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    let notes: Vec<&str> = stderr.lines().filter(|l| l.contains("skipping")).collect();
    assert_eq!(notes.len(), 1, "{stderr}");
    assert!(
        notes[0].starts_with("netgap: note: udp carries at most ") && notes[0].ends_with("1M"),
        "{stderr}"
    );
    let mut ran: Vec<(String, u64)> = read_records(&json)
        .iter()
        .map(|r| {
            (
                r["transport"].as_str().unwrap_or("").to_string(),
                common::u(&r["size_bytes"]),
            )
        })
        .collect();
    ran.sort();
    assert_eq!(
        ran,
        [
            ("tcp".into(), 1),
            ("tcp".into(), 1 << 20),
            ("udp".into(), 1)
        ]
    );
    // A size none of the run's transports carries is still refused.
    fails_with_one_line(&["run", "pingpong", "-t", "udp", "-s", "1M"], "udp");
}

#[test]
fn one_repetition_has_no_confidence_interval_not_a_zero_width_one() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let out = run_ok(
        netgap()
            .args([
                "run", "pingpong", "-s", "1", "--reps", "1", "-n", "50", "--json",
            ])
            .arg(&json),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let row = stdout
        .lines()
        .find(|l| l.starts_with("pingpong"))
        .expect("a table row");
    assert!(row.contains("n/a") && !row.contains("±0.0"), "{row}");
    let r = &read_records(&json)[0];
    assert!(r["stats"]["ci95_low"].is_null(), "{}", r["stats"]);
    assert!(r["stats"]["ci95_high"].is_null(), "{}", r["stats"]);
}

#[test]
fn run_help_names_every_multi_host_test_of_the_registry() {
    let out = netgap().args(["run", "--help"]).output().expect("help");
    let text = String::from_utf8_lossy(&out.stdout);
    for w in netgap::workload::registry() {
        assert!(
            text.contains(w.name()),
            "run --help leaves out {}: {text}",
            w.name()
        );
    }
}

#[test]
fn run_help_gives_every_multi_host_tests_default_size_from_the_registry() {
    let text = common::ok(netgap().args(["run", "--help"]).output().expect("help"));
    let start = text.find("--sizes <LIST>").expect("--sizes in run --help");
    let end = start + text[start..].find("--reps").expect("--reps after --sizes");
    // The paragraph as one line, clap's wrapping undone.
    let para = text[start..end]
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ");
    let tcp = netgap::transport::find("tcp").expect("tcp");
    for w in netgap::workload::registry() {
        let size = netgap::units::format_size(w.default_size_bytes(tcp));
        let named = para
            .split(['[', ';', ']'])
            .filter_map(|part| part.trim().split_once(" for "))
            .any(|(s, names)| s.ends_with(&size) && names.split(", ").any(|n| n == w.name()));
        assert!(named, "--sizes help lacks {size} for {}: {para}", w.name());
    }
}

/// The guide lists the registries' entries by hand: every point-to-point
/// test, workload and transport is named there, and its synopsis of
/// `netgap import` gives exactly the importers, in their order.
#[test]
fn the_guide_names_everything_the_registries_hold() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("GUIDE.md"))
        .expect("GUIDE.md");
    let names = netgap::bench::registry()
        .iter()
        .map(|t| t.name())
        .chain(netgap::workload::registry().iter().map(|w| w.name()))
        .chain(netgap::transport::registry().iter().map(|t| t.name()));
    for name in names {
        assert!(
            readme.contains(&format!("`{name}`")),
            "GUIDE.md never names `{name}`"
        );
    }
    // The commands' synopses are the README's tour.
    let tour = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let synopsis = tour
        .lines()
        .find_map(|l| l.strip_prefix("netgap import "))
        .and_then(|rest| rest.split_whitespace().next())
        .expect("README.md has a synopsis of netgap import");
    assert_eq!(
        synopsis.split('|').collect::<Vec<_>>(),
        netgap::import::names(),
        "README.md's netgap import synopsis"
    );
}
