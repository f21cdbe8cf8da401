//! The workloads through a namespace testbed, end to end: `netgap
//! testbed up` builds the hosts and keyed agents, `netgap run ... --hosts
//! @FILE` authenticates with the testbed's key (named in its hosts file)
//! and runs every workload across the namespaces, and `testbed down`
//! leaves nothing behind. Each test has its own `--name`, so tests run side
//! by side, and a guard takes its testbed down even when the test fails.
//!
//! Without root, `ip` or network namespaces these tests print why and pass,
//! unless NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI), where that is a failure.

use crate::common::testbed::{link_bytes, Testbed};
use crate::common::{has_whole_record, netgap, ok, read_records as records, system_ready, u};
use serde_json::Value;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn flows(r: &Value) -> &Vec<Value> {
    r["flows"].as_array().expect("flows")
}

#[test]
fn every_multi_host_test_runs_through_a_four_host_switch_testbed() {
    if !system_ready("every_multi_host_test_runs_through_a_four_host_switch_testbed") {
        return;
    }
    let (tb, _) = Testbed::up("tmsw", &["--hosts", "4", "--topology", "switch"]);
    let hosts = tb.hosts();
    assert!(hosts.key_file.is_some(), "the testbed names its key");
    let name = |i: usize| hosts.hosts[i].name.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let short = ["--reps", "1", "--duration", "200ms"];

    // multistream: every stream between the server and the first client host.
    let ms = tb.run(
        "multistream",
        &[&["-P", "3"][..], &short].concat(),
        &dir.path().join("ms.jsonl"),
    );
    assert_eq!(ms.len(), 1);
    assert_eq!(flows(&ms[0]).len(), 3);
    for f in flows(&ms[0]) {
        assert_eq!(f["host"], name(1).as_str(), "{f}");
        assert!(u(&f["bytes_tx"]) > 0, "{f}");
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "{f}");
    }

    // The client tests: 4 clients over 3 client hosts. Every flow must
    // move bytes in the window, so the window outlasts TCP's shortest
    // retransmission timeout (200 ms): four senders into one receiver can
    // lose a segment at the bridge, and that flow then waits out the RTO.
    // Each host opens its own window when its role starts; under a full
    // test run one host's start can lag the others' by more than a second
    // (a fan-out client that then found the server's whole transfer in its
    // warm-up), so the windows are 3 s.
    let recs = tb.run(
        "hotspot,fanin,fanout,connect",
        &["--clients", "4", "--reps", "1", "--duration", "3s"],
        &dir.path().join("clients.jsonl"),
    );
    let tests: Vec<&str> = recs
        .iter()
        .map(|r| r["test"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(tests, ["hotspot", "fanin", "fanout", "connect"]);
    for r in &recs {
        let test = r["test"].as_str().unwrap_or("");
        assert_eq!(u(&r["clients"]), 4, "{test}");
        assert_eq!(u(&r["client_hosts"]), 3, "{test}");
        let fl = flows(r);
        assert_eq!(fl.len(), 4, "{test}");
        for (i, f) in fl.iter().enumerate() {
            // Client i runs on client host i % 3.
            assert_eq!(f["host"], name(1 + i % 3).as_str(), "{test} flow {i}");
            assert_eq!(u(&f["index"]), i as u64);
            assert!(f["value"].as_f64().expect("value") > 0.0, "{test} {f}");
            match test {
                "fanin" | "fanout" => {
                    assert!(u(&f["bytes_tx"]) > 0, "{test} flow {i} moved nothing");
                    assert_eq!(f["bytes_tx"], f["bytes_rx"], "{test} flow {i}");
                }
                _ => assert!(
                    u(&f["bytes_tx"]) > 0 && u(&f["bytes_rx"]) > 0,
                    "{test} flow {i}: {f}"
                ),
            }
        }
        let b = |k: &str| u(&r["bytes"][k]);
        assert_eq!(b("client_tx"), b("server_rx"), "{test}: {}", r["bytes"]);
        assert_eq!(b("server_tx"), b("client_rx"), "{test}: {}", r["bytes"]);
        let cpu = r["hosts_cpu"].as_array().expect("hosts_cpu");
        assert_eq!(cpu.len(), 4, "{test}");
        assert_eq!(cpu[0]["role"], "server");
        assert_eq!(cpu[0]["host"], name(0).as_str());
    }
    let b = |r: &Value, k: &str| u(&r["bytes"][k]);
    assert!(b(&recs[1], "client_tx") > 0 && b(&recs[1], "server_tx") == 0);
    assert!(b(&recs[2], "server_tx") > 0 && b(&recs[2], "client_tx") == 0);
    assert_eq!(recs[3]["metric"], "connections_per_s");

    // The engine workloads cross hosts over io_uring too.
    let ur = tb.run(
        "hotspot,connect",
        &[&["--clients", "3", "-t", "uring"][..], &short].concat(),
        &dir.path().join("uring.jsonl"),
    );
    assert_eq!(ur.len(), 2);
    for r in &ur {
        assert_eq!(r["transport"], "uring", "{r}");
        let b = |k: &str| u(&r["bytes"][k]);
        assert!(b("client_tx") > 0, "{r}");
        assert_eq!(b("client_tx"), b("server_rx"), "{r}");
        assert_eq!(b("server_tx"), b("client_rx"), "{r}");
        for (i, f) in flows(r).iter().enumerate() {
            assert_eq!(f["host"], name(1 + i % 3).as_str(), "flow {i}");
            assert!(f["value"].as_f64().expect("value") > 0.0, "{f}");
        }
    }

    // hotspot crosses hosts over udp: each request and reply counts once.
    let udp = tb.run(
        "hotspot",
        &[&["--clients", "3", "-t", "udp"][..], &short].concat(),
        &dir.path().join("udp.jsonl"),
    );
    assert_eq!(udp.len(), 1);
    let r = &udp[0];
    assert_eq!(r["transport"], "udp", "{r}");
    let b = |k: &str| u(&r["bytes"][k]);
    assert!(b("client_tx") > 0, "{r}");
    assert_eq!(b("client_tx"), b("server_rx"), "{r}");
    assert_eq!(b("server_tx"), b("client_rx"), "{r}");
    assert!(r["datagrams"]["client"]["datagrams_sent"].is_u64(), "{r}");
    for (i, f) in flows(r).iter().enumerate() {
        assert_eq!(f["host"], name(1 + i % 3).as_str(), "flow {i}");
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "{f}");
    }

    // The agents require the key: a hosts file that does not name it
    // fails on the first host in one line, and `--key` supplies it.
    let mut keyless = hosts.clone();
    let key = keyless.key_file.take().expect("key file");
    let keyless_path = dir.path().join("keyless.json");
    let out_dir = netgap::confined::Dir::open_base(dir.path(), "the test's directory", "x", 0o700)
        .expect("the test's directory");
    let text = keyless.to_text().expect("hosts file as JSON");
    out_dir
        .replace_file("keyless.json", text.as_bytes(), 0o600)
        .expect("hosts file written");
    let hosts_arg = format!("@{}", keyless_path.display());
    let run = |extra: &[&str]| {
        netgap()
            .args(["run", "hotspot", "--hosts", &hosts_arg, "--clients", "3"])
            .args(["--reps", "1", "--duration", "50ms"])
            .args(extra)
            .output()
            .expect("netgap run")
    };
    let out = run(&[]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains(&format!("host {} ", name(0))) && err.contains("shared key"),
        "{err}"
    );
    ok(run(&["--key", key.to_str().expect("utf-8 path")]));

    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn multirail_over_a_three_link_mesh_carries_payload_on_every_link() {
    if !system_ready("multirail_over_a_three_link_mesh_carries_payload_on_every_link") {
        return;
    }
    let (tb, _) = Testbed::up(
        "tmmr",
        &["--hosts", "2", "--topology", "mesh", "--links", "3"],
    );
    let hosts = tb.hosts();
    let client = &hosts.hosts[1];
    let server = &hosts.hosts[0];
    let rails: Vec<_> = client.links_to(&server.name).cloned().collect();
    assert_eq!(rails.len(), 3);
    // The agents bind their data listener to the first link; the other
    // links must work all the same.
    let before: Vec<u64> = rails
        .iter()
        .map(|l| link_bytes(&tb.ns(&client.name), &l.ifname))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "multirail",
        &["--reps", "1", "--duration", "300ms"],
        &dir.path().join("mr.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(u(&r["clients"]), 3);
    let links = r["links"].as_array().expect("links");
    assert_eq!(links.len(), 3);
    for (l, rail) in links.iter().zip(&rails) {
        assert_eq!(l["local"], rail.local.to_string().as_str(), "{l}");
        assert_eq!(l["remote"], rail.remote.to_string().as_str(), "{l}");
        assert!(u(&l["bytes"]) > 0, "a link carried nothing: {l} in {r}");
        assert!(l["bandwidth_gbps"].as_f64().expect("bw") > 0.0);
    }
    for (k, rail) in rails.iter().enumerate() {
        let moved = link_bytes(&tb.ns(&client.name), &rail.ifname) - before[k];
        let payload = u(&links[k]["bytes"]);
        // The interface carried at least the payload the record counts on
        // it (its counters add headers, acks and the warm-up).
        assert!(
            moved >= payload,
            "link {} ({}) moved {moved} bytes < payload {payload}",
            k,
            rail.ifname
        );
    }
    for f in flows(r) {
        assert_eq!(f["host"], client.name.as_str());
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "{f}");
    }

    // Over udp each flow is bound to its link too.
    let before: Vec<u64> = rails
        .iter()
        .map(|l| link_bytes(&tb.ns(&client.name), &l.ifname))
        .collect();
    let recs = tb.run(
        "multirail",
        &["-t", "udp", "--reps", "1", "--duration", "300ms"],
        &dir.path().join("mr-udp.jsonl"),
    );
    let links = recs[0]["links"].as_array().expect("links");
    assert_eq!(links.len(), 3);
    for (k, rail) in rails.iter().enumerate() {
        let payload = u(&links[k]["bytes"]);
        assert!(payload > 0, "udp link {k} carried nothing");
        let moved = link_bytes(&tb.ns(&client.name), &rail.ifname) - before[k];
        assert!(
            moved >= payload,
            "udp link {k} ({}) moved {moved} bytes < payload {payload}",
            rail.ifname
        );
    }
    let _ = tb.down();
    tb.assert_gone();
}

/// Bytes sent and received by interface `dev` of namespace `ns`.
fn link_tx_rx(ns: &str, dev: &str) -> (u64, u64) {
    let out = ok(Command::new("ip")
        .args(["-n", ns, "-s", "-j", "link", "show", "dev", dev])
        .output()
        .expect("ip -s link"));
    let v: Value = serde_json::from_str(&out).expect("ip -j output");
    let s = &v[0]["stats64"];
    (u(&s["tx"]["bytes"]), u(&s["rx"]["bytes"]))
}

#[test]
fn multirail_bidir_measures_one_to_three_links_in_one_command() {
    if !system_ready("multirail_bidir_measures_one_to_three_links_in_one_command") {
        return;
    }
    let (tb, _) = Testbed::up(
        "tmmrbd",
        &["--hosts", "2", "--topology", "mesh", "--links", "3"],
    );
    let hosts = tb.hosts();
    let client = &hosts.hosts[1];
    let server = &hosts.hosts[0];
    let ns = tb.ns(&client.name);
    let rails: Vec<_> = client.links_to(&server.name).cloned().collect();
    let before: Vec<(u64, u64)> = rails.iter().map(|l| link_tx_rx(&ns, &l.ifname)).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "multirail",
        &[
            "--bidir",
            "--links",
            "1,2,3",
            "--reps",
            "1",
            // Long enough that a flow held up for a moment on a loaded
            // machine (one link's window was empty at 200 ms in a CI run
            // with other testbeds busy) still carries bytes in it.
            "--duration",
            "500ms",
        ],
        &dir.path().join("mr-bidir.jsonl"),
    );
    assert_eq!(recs.len(), 3, "one point per link count");
    for (k, r) in recs.iter().enumerate() {
        let count = k + 1;
        assert_eq!(u(&r["clients"]), count as u64, "{r}");
        assert_eq!(r["options"]["bidir"], true, "{r}");
        let links = r["links"].as_array().expect("links");
        assert_eq!(links.len(), count);
        for (l, rail) in links.iter().zip(&rails) {
            // The first K links, in order.
            assert_eq!(l["local"], rail.local.to_string().as_str(), "{l}");
            assert!(u(&l["bytes"]) > 0, "a link carried nothing: {l} in {r}");
        }
        // Both ends sent and received on every flow.
        let b = &r["bytes"];
        for key in ["client_tx", "client_rx", "server_tx", "server_rx"] {
            assert!(u(&b[key]) > 0, "{key} is 0: {b}");
        }
        // The headline is the sum of both directions of every flow.
        let sum: f64 = flows(r)
            .iter()
            .map(|f| f["value"].as_f64().expect("value"))
            .sum();
        let value = r["value"].as_f64().expect("value");
        assert!(
            (sum - value).abs() <= 1e-6 * value.max(1.0),
            "{sum} vs {value}"
        );
    }
    // Every link carried payload both ways: link K-1 was used by the
    // points with K or more links.
    for (k, rail) in rails.iter().enumerate() {
        let (tx, rx) = link_tx_rx(&ns, &rail.ifname);
        let (tx0, rx0) = before[k];
        assert!(
            tx - tx0 > 100_000 && rx - rx0 > 100_000,
            "link {k} ({}) moved {} out, {} in",
            rail.ifname,
            tx - tx0,
            rx - rx0
        );
    }

    // multistream --bidir: every stream both ways, both ends measuring.
    let recs = tb.run(
        "multistream",
        &["--bidir", "-P", "2", "--reps", "1", "--duration", "200ms"],
        &dir.path().join("ms-bidir.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    assert_eq!(r["options"]["bidir"], true, "{r}");
    assert_eq!(flows(r).len(), 2);
    for key in ["client_tx", "client_rx", "server_tx", "server_rx"] {
        assert!(u(&r["bytes"][key]) > 0, "{key} is 0: {r}");
    }
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn client_tests_cross_a_three_host_mesh_each_over_its_own_link() {
    if !system_ready("client_tests_cross_a_three_host_mesh_each_over_its_own_link") {
        return;
    }
    // On a mesh the server's address is its end of its first link, on a
    // subnet the third host has no route to: each client host must take
    // its own link to the server.
    let (tb, _) = Testbed::up("tmm3", &["--hosts", "3", "--topology", "mesh"]);
    let hosts = tb.hosts();
    let server = &hosts.hosts[0];
    let before: Vec<u64> = hosts.hosts[1..]
        .iter()
        .map(|h| {
            let l = h
                .links_to(&server.name)
                .next()
                .expect("a link to the server");
            link_bytes(&tb.ns(&h.name), &l.ifname)
        })
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "fanin,hotspot,connect",
        &["--clients", "2", "--reps", "1", "--duration", "200ms"],
        &dir.path().join("r.jsonl"),
    );
    assert_eq!(recs.len(), 3);
    let mut fanin_bytes = [0u64; 2];
    for r in &recs {
        for (i, f) in flows(r).iter().enumerate() {
            assert_eq!(f["host"], hosts.hosts[1 + i % 2].name.as_str(), "flow {i}");
            assert!(u(&f["bytes_tx"]) > 0, "{f}");
            if r["test"] == "fanin" {
                fanin_bytes[i] = u(&f["bytes_tx"]);
            }
        }
    }
    for (k, h) in hosts.hosts[1..].iter().enumerate() {
        let l = h
            .links_to(&server.name)
            .next()
            .expect("a link to the server");
        let moved = link_bytes(&tb.ns(&h.name), &l.ifname) - before[k];
        assert!(
            moved >= fanin_bytes[k],
            "{}: its link to {} moved {moved} bytes < its fan-in payload {}",
            h.name,
            server.name,
            fanin_bytes[k]
        );
    }
    let _ = tb.down();
    tb.assert_gone();
}

#[test]
fn a_killed_client_agent_mid_hotspot_is_named_and_points_are_kept() {
    if !system_ready("a_killed_client_agent_mid_hotspot_is_named_and_points_are_kept") {
        return;
    }
    let (tb, _) = Testbed::up("tmkl", &["--hosts", "4", "--topology", "switch"]);
    let victim = tb.hosts().hosts[2].name.clone();
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let mut coord = netgap()
        .args(["run", "hotspot", "--hosts", &tb.hosts_arg()])
        .args(["--clients", "3,3,3,3,3,3,3,3,3,3,3,3"])
        .args(["--reps", "3", "--duration", "500ms", "--json"])
        .arg(&json)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("coordinator starts");
    let t0 = Instant::now();
    // Whole lines only: the coordinator may be writing the first one.
    while !has_whole_record(&json) {
        if t0.elapsed() > Duration::from_secs(30) || coord.try_wait().expect("wait").is_some() {
            let _ = coord.kill();
            let _ = coord.wait();
            panic!("no point completed");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // Mid-point: the next point's repetitions are running.
    std::thread::sleep(Duration::from_millis(300));
    let pid_text = std::fs::read_to_string(tb.dir().join(format!("{victim}.pid")))
        .expect("the agent's pid file");
    let pid: i32 = pid_text.trim().parse().expect("a pid");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .expect("SIGKILL delivered");
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = coord.try_wait().expect("wait") {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(10) {
            let _ = coord.kill();
            let _ = coord.wait();
            panic!("the coordinator did not stop after a host died");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = killed.elapsed();
    let mut err = String::new();
    std::io::Read::read_to_string(&mut coord.stderr.take().expect("stderr"), &mut err)
        .expect("stderr read");
    assert!(!status.success());
    assert!(elapsed < Duration::from_secs(5), "took {elapsed:?}: {err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("netgap: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&format!("host {victim} ")),
        "{} does not name {victim}",
        lines[0]
    );
    let kept = records(&json);
    assert!(!kept.is_empty());
    assert!(kept.iter().all(|r| r["test"] == "hotspot"));
    // A testbed with a dead agent still goes away completely.
    let _ = tb.down();
    tb.assert_gone();
}
