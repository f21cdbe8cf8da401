//! `web -t shm`: the real web server and netgap's load generator both run
//! under the preload library on one host (the in-process agents), every
//! body verified, and the library's own counters in the record show the
//! bytes moved over shm (the kernel sockets carried under 1% of them).
//! Also: `-t shm` with the library missing is one line before anything
//! starts.
//!
//! Without root or the servers these tests print why and pass, unless
//! NETGAP_REQUIRE_SYSTEM_TESTS=1, where that is a failure.

use crate::common;
use crate::common::{metric, netgap, one_line_error};
use serde_json::Value;
use std::process::Command;

/// Whether `program` is installed; fails when system tests are required.
/// Held by each test that ends by checking that no load generator or
/// gatherer of netgap still runs: tests of one binary run in parallel, and
/// one test's check would otherwise see another's live child.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
    ONE.lock().unwrap_or_else(|p| p.into_inner())
}

/// Runs `web -t shm` with `server` on the in-process agents and checks
/// the record: every response checked and verified, every client's
/// connection on shm, the kernel sockets under 1% of the bytes, no
/// warning, nothing left running.
fn web_over_shm(server: &str) {
    let _one = one_at_a_time();
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let web = ["web", "-t", "shm", "--server", server, "--clients", "3"];
    let once = ["--reps", "1", "--duration", "1s"];
    let (ok, text, recs) = common::run_preloaded(&[&web[..], &once].concat(), &json);
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 1, "{text}");
    let r = &recs[0];
    assert_eq!(r["transport"], "shm");
    let transactions = metric(r, "transactions");
    assert!(transactions > 0.0, "{}", r["app"]);
    assert_eq!(metric(r, "checked"), transactions, "{}", r["app"]);
    assert_eq!(metric(r, "verified"), transactions, "every body verified");
    assert_eq!(metric(r, "errors"), 0.0, "{}", r["app"]);
    // Kept-alive clients: one connection each, every one on shm.
    assert_eq!(metric(r, "preload_shm_connections"), 3.0, "{}", r["app"]);
    assert_eq!(metric(r, "preload_kernel_connections"), 0.0, "{}", r["app"]);
    let shm = metric(r, "preload_shm_bytes");
    let kernel = metric(r, "preload_kernel_tcp_bytes");
    assert!(shm >= metric(r, "payload_bytes"), "{}", r["app"]);
    assert!(kernel < shm / 100.0, "kernel {kernel} of shm {shm} bytes");
    let warnings: Vec<&str> = r["warnings"]
        .as_array()
        .map(|w| w.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    assert!(warnings.is_empty(), "{warnings:?}");
    let services = r["app"]["services"].as_array().expect("services");
    assert_eq!(services[0]["name"], server);
    // Nothing this run started still runs: no load generator, no server
    // of its run directory.
    let pgrep = Command::new("pgrep")
        .args([
            "-f",
            &format!("{} web-load", common::netgap_path().display()),
        ])
        .output()
        .expect("pgrep");
    assert!(pgrep.stdout.is_empty(), "a load generator still runs");
}

#[test]
fn web_with_nginx_and_the_load_generator_over_shm_verifies_every_body() {
    let test = "web_with_nginx_and_the_load_generator_over_shm_verifies_every_body";
    if !common::system_ready(test)
        || !common::installed(test, &[("/usr/sbin/nginx", "nginx-light")])
    {
        return;
    }
    web_over_shm("nginx");
}

#[test]
fn web_with_apache_and_the_load_generator_over_shm_verifies_every_body() {
    let test = "web_with_apache_and_the_load_generator_over_shm_verifies_every_body";
    if !common::system_ready(test) || !common::installed(test, &[("/usr/sbin/apache2", "apache2")])
    {
        return;
    }
    web_over_shm("apache");
}

#[test]
fn web_over_shm_without_the_library_is_one_line() {
    let out = netgap()
        .args([
            "run",
            "web",
            "-t",
            "shm",
            "--reps",
            "1",
            "--duration",
            "100ms",
        ])
        .env("NETGAP_PRELOAD", "/nonexistent/libnetgap_preload.so")
        .output()
        .expect("netgap run");
    one_line_error(
        &out,
        "web -t shm without the library",
        "/nonexistent/libnetgap_preload.so",
    );
}

#[test]
fn gather_with_gmond_and_the_gatherer_over_shm_reads_every_answer() {
    let test = "gather_with_gmond_and_the_gatherer_over_shm_reads_every_answer";
    let _one = one_at_a_time();
    if !common::system_ready(test)
        || !common::installed(test, &[("/usr/sbin/gmond", "ganglia-monitor")])
    {
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("g.jsonl");
    let gather = ["gather", "-t", "shm", "--responder", "gmond"];
    let once = ["--reps", "1", "--duration", "1s"];
    let (ok, text, recs) = common::run_preloaded(&[&gather[..], &once].concat(), &json);
    assert!(ok, "{text}");
    assert_eq!(recs.len(), 1, "{text}");
    let r = &recs[0];
    assert_eq!(r["transport"], "shm");
    let gathers = metric(r, "gathers");
    assert!(gathers > 0.0, "{}", r["app"]);
    assert!(
        metric(r, "xml_metrics") > 0.0,
        "gmond's XML parsed: {}",
        r["app"]
    );
    // Every exchange a connection of its own, every one on shm.
    let hosts = metric(r, "hosts");
    assert!(
        metric(r, "preload_shm_connections") >= gathers * hosts,
        "{}",
        r["app"]
    );
    assert_eq!(metric(r, "preload_kernel_connections"), 0.0, "{}", r["app"]);
    let shm = metric(r, "preload_shm_bytes");
    let kernel = metric(r, "preload_kernel_tcp_bytes");
    assert!(kernel < shm / 100.0, "kernel {kernel} of shm {shm} bytes");
    assert!(
        r["warnings"].as_array().is_none_or(Vec::is_empty),
        "{}",
        r["warnings"]
    );
    let pgrep = Command::new("pgrep")
        .args([
            "-f",
            &format!("{} gather-load", common::netgap_path().display()),
        ])
        .output()
        .expect("pgrep");
    assert!(pgrep.stdout.is_empty(), "a gatherer still runs");
}

#[test]
fn gather_over_shm_with_the_builtin_responder_is_one_line() {
    let out = netgap()
        .args([
            "run",
            "gather",
            "-t",
            "shm",
            "--reps",
            "1",
            "--duration",
            "100ms",
        ])
        .env("NETGAP_PRELOAD", common::preload_library())
        .output()
        .expect("netgap run");
    one_line_error(&out, "gather -t shm, builtin", "--responder gmond");
}

/// `web -t shm` between two agents started on this host: the client
/// agent's load generator runs as its child under the library; killed
/// with SIGKILL mid-run, the agent takes it along within 2 s.
#[test]
fn a_killed_agent_takes_its_load_generator_with_it() {
    let test = "a_killed_agent_takes_its_load_generator_with_it";
    let _one = one_at_a_time();
    if !common::system_ready(test)
        || !common::installed(test, &[("/usr/sbin/nginx", "nginx-light")])
    {
        return;
    }
    // Both agents find the library next to their binary.
    let _ = common::preload_library();
    let server = common::AgentProc::start_with("127.0.0.1", &["--allow-services"]);
    let mut clients = common::AgentProc::start("127.0.0.1");
    let _run = common::procs::Reaped(
        netgap()
            .args([
                "run",
                "web",
                "-t",
                "shm",
                "--reps",
                "1",
                "--duration",
                "30s",
            ])
            .args(["--clients", "2", "--hosts"])
            .arg(format!("{},{}", server.addr, clients.addr))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("netgap run"),
    );
    let t0 = std::time::Instant::now();
    let tree = loop {
        let tree = common::procs::descendants(clients.child.id());
        if tree.iter().any(|(_, _, c)| c.contains("web-load")) {
            break tree;
        }
        assert!(
            t0.elapsed() < std::time::Duration::from_secs(20),
            "the load generator never started: {tree:?}"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    };
    clients.child.kill().expect("SIGKILL the agent");
    let _ = clients.child.wait();
    let left = common::gone_within(std::time::Duration::from_secs(2), || {
        common::procs::still_running(&tree)
    });
    assert_eq!(left, Ok(()), "the load generator outlived its agent");
}
