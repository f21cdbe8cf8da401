//! `web` end to end: real nginx and Apache on the first host of a 4-host
//! namespace testbed, netgap's HTTP/1.1 clients spread cyclically over the
//! other three, single-file and Zipf traces; every response checked and
//! every body verified, the placement read back from the record's flows,
//! the server stopped and its run directory gone afterwards. Also the
//! refusals: bad options, and an agent not started with --allow-services.
//!
//! Without root, namespaces or the servers these tests print why and pass,
//! unless NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in CI), where that is a failure.

use crate::common;
use crate::common::testbed::Testbed;
use crate::common::{
    fails_with_one_line, metric, netgap, ok, read_records, system_ready, AgentProc,
};
use serde_json::Value;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

/// Whether the servers are installed; fails when system tests are
/// required.
fn servers_ready(test: &str) -> bool {
    let missing = [
        ("/usr/sbin/nginx", "nginx-light"),
        ("/usr/sbin/apache2", "apache2"),
    ]
    .into_iter()
    .find(|(p, _)| !Path::new(p).exists());
    match missing {
        None => true,
        Some((p, pkg)) => {
            common::skip(test, &format!("{p} is missing (apt-get install {pkg})"));
            false
        }
    }
}

/// The run directory a service's configuration names (its pid or
/// ServerRoot line), which must be gone.
fn run_dir_of(config: &str) -> String {
    let line = config
        .lines()
        .find(|l| l.starts_with("pid ") || l.starts_with("ServerRoot "))
        .expect("the configuration names its run directory");
    let path = line
        .split_whitespace()
        .nth(1)
        .expect("a path")
        .trim_matches(|c| c == '"' || c == ';');
    match path.strip_suffix("/nginx.pid") {
        Some(dir) => dir.to_string(),
        None => path.to_string(),
    }
}

/// Checks one web record: every response checked and verified, no error,
/// the clients spread cyclically over the client hosts, the server named
/// with its version and configuration, and its run directory removed.
fn check_web(r: &Value, server: &str, clients: usize, names: &[String]) {
    assert_eq!(r["test"], "web");
    assert_eq!(r["metric"], "transactions_per_s");
    assert!(r["value"].as_f64().unwrap_or(0.0) > 0.0, "{r}");
    let transactions = metric(r, "transactions");
    let checked = metric(r, "checked");
    assert!(transactions > 0.0, "{}", r["app"]);
    assert_eq!(
        checked, transactions,
        "the window's responses: {}",
        r["app"]
    );
    assert_eq!(metric(r, "verified"), checked, "every body verified");
    assert_eq!(metric(r, "errors"), 0.0, "{}", r["app"]);
    assert!(metric(r, "payload_gbps") > 0.0);
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), clients);
    for (i, f) in flows.iter().enumerate() {
        assert_eq!(
            f["host"].as_str(),
            Some(names[1 + i % (names.len() - 1)].as_str()),
            "client {i} placed cyclically: {f}"
        );
        assert!(f["value"].as_f64().unwrap_or(0.0) > 0.0, "{f}");
    }
    let p = &r["percentiles"];
    assert!(p["p50"].as_f64() <= p["p99"].as_f64(), "{p}");
    let services = r["app"]["services"].as_array().expect("services");
    assert_eq!(services.len(), 1);
    let s = &services[0];
    assert_eq!(s["name"], server);
    assert_eq!(s["host"].as_str(), Some(names[0].as_str()));
    assert!(!s["version"].as_str().unwrap_or("").is_empty());
    let config = s["config"].as_str().expect("config");
    assert!(config.contains("sendfile") || config.contains("EnableSendfile On"));
    let dir = run_dir_of(config);
    assert!(!Path::new(&dir).exists(), "{dir} left behind");
    let pgrep = Command::new("pgrep")
        .args(["-f", &dir])
        .output()
        .expect("pgrep");
    assert!(pgrep.stdout.is_empty(), "{server} of {dir} still runs");
}

#[test]
fn web_serves_single_and_zipf_traces_from_nginx_and_apache_on_a_testbed() {
    let test = "web_serves_single_and_zipf_traces_from_nginx_and_apache_on_a_testbed";
    if !system_ready(test) || !servers_ready(test) {
        return;
    }
    let (tb, _) = Testbed::up("i12web", &["--hosts", "4", "--topology", "switch"]);
    let names: Vec<String> = tb.hosts().hosts.iter().map(|h| h.name.clone()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let short = ["--reps", "1", "--duration", "300ms", "--clients", "5"];

    // single: one point per server and file size.
    let recs = tb.run(
        "web",
        &[&["--server", "nginx,apache", "-s", "1K,100K"][..], &short].concat(),
        &dir.path().join("single.jsonl"),
    );
    assert_eq!(recs.len(), 4);
    let mut seen = Vec::new();
    for r in &recs {
        let server = r["app"]["options"]["server"]
            .as_str()
            .expect("server")
            .to_string();
        let size = r["size_bytes"].as_u64().expect("size");
        check_web(r, &server, 5, &names);
        let facts = &r["app"]["services"][0]["facts"];
        assert_eq!(facts["fileset_bytes"], size.to_string().as_str());
        assert_eq!(facts["fileset_files"], "1");
        seen.push((server, size));
    }
    seen.sort();
    assert_eq!(
        seen,
        [
            ("apache".to_string(), 1024),
            ("apache".to_string(), 102_400),
            ("nginx".to_string(), 1024),
            ("nginx".to_string(), 102_400)
        ]
    );

    // zipf: one point per server and exponent, a new connection per request
    // for Apache.
    let recs = tb.run(
        "web",
        &[
            &["--server", "nginx", "--trace", "zipf", "--alpha", "0.5,1.0"][..],
            &["--files", "36", "--file-seed", "7"],
            &short,
        ]
        .concat(),
        &dir.path().join("zipf.jsonl"),
    );
    assert_eq!(recs.len(), 2);
    for (r, alpha) in recs.iter().zip([0.5, 1.0]) {
        check_web(r, "nginx", 5, &names);
        assert_eq!(r["app"]["options"]["alpha"], alpha);
        assert_eq!(r["app"]["options"]["trace"], "zipf");
        let facts = &r["app"]["services"][0]["facts"];
        assert_eq!(facts["fileset_files"], "36");
        assert_eq!(facts["fileset_sha256"].as_str().map(str::len), Some(64));
    }
    assert_eq!(
        recs[0]["app"]["services"][0]["facts"]["fileset_sha256"],
        recs[1]["app"]["services"][0]["facts"]["fileset_sha256"],
        "the same seed makes the same file set"
    );
    let recs = tb.run(
        "web",
        &[
            &["--server", "apache", "--trace", "zipf", "--files", "36"][..],
            &["--connection-per-request"],
            &short,
        ]
        .concat(),
        &dir.path().join("apache-zipf.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    check_web(&recs[0], "apache", 5, &names);
    assert!(
        metric(&recs[0], "connections") >= metric(&recs[0], "checked"),
        "a connection per request: {}",
        recs[0]["app"]
    );

    // Under the testbed's conditions, one after another.
    let recs = tb.run(
        "web",
        &[&["--conditions", "offload=on,off"][..], &short].concat(),
        &dir.path().join("conditions.jsonl"),
    );
    assert_eq!(recs.len(), 2);
    for (r, offload) in recs.iter().zip(["on", "off"]) {
        check_web(r, "nginx", 5, &names);
        assert_eq!(r["stack"]["path"]["offload"], offload, "{}", r["stack"]);
    }

    // A coordinator that dies mid-run: the agents' sessions end, and the
    // server goes with them.
    let mut run = netgap()
        .args(["run", "web", "--reps", "1", "--duration", "30s", "--hosts"])
        .arg(tb.hosts_arg())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("netgap run");
    let nginx_runs = || {
        let out = Command::new("pgrep")
            .args(["-f", "/agent-[0-9]+-[0-9a-f]+/nginx-"])
            .output()
            .expect("pgrep");
        !out.stdout.is_empty()
    };
    let t0 = Instant::now();
    while !nginx_runs() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "nginx never started"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    run.kill().expect("kill the coordinator");
    let _ = run.wait();
    let t0 = Instant::now();
    while nginx_runs() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "nginx outlived its coordinator"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    tb.down();
    tb.assert_gone();
}

#[test]
fn bad_web_options_are_refused_in_one_line() {
    fails_with_one_line(
        &["run", "web", "--trace", "nope"],
        "--trace nope: must be one of single, zipf",
    );
    fails_with_one_line(
        &["run", "web", "--alpha", "0.5,9"],
        "--alpha 9: must be between 0 and 3",
    );
    fails_with_one_line(&["run", "web", "--server", "iis"], "--server iis");
    fails_with_one_line(&["run", "web", "-t", "uring"], "use -t tcp");
    fails_with_one_line(
        &["run", "web", "--verify-fraction", "2"],
        "--verify-fraction 2",
    );
    fails_with_one_line(&["run", "hotspot", "--alpha", "1"], "--alpha");
}

#[test]
fn an_agent_without_allow_services_refuses_to_start_a_server() {
    let a = AgentProc::start("127.0.0.1");
    let b = AgentProc::start("127.0.0.1");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let out = netgap()
        .args([
            "run",
            "web",
            "--reps",
            "1",
            "--duration",
            "100ms",
            "--hosts",
        ])
        .arg(format!("{},{}", a.addr, b.addr))
        .arg("--json")
        .arg(&json)
        .output()
        .expect("runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--allow-services"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(read_records(&json).is_empty());
}

/// Clients of the scale test: more than one nginx worker's old 4,096
/// connections, over two client hosts.
const SCALE_CLIENTS: usize = 3000;

#[test]
fn thousands_of_web_clients_over_two_hosts_get_every_response_checked() {
    let test = "thousands_of_web_clients_over_two_hosts_get_every_response_checked";
    if !system_ready(test) || !servers_ready(test) {
        return;
    }
    let (tb, _) = Testbed::up("webscale", &["--hosts", "3", "--topology", "switch"]);
    let names: Vec<String> = tb.hosts().hosts.iter().map(|h| h.name.clone()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    // Every client must finish a transaction in the window: under a full
    // test run one of thousands once had none within 1 s, so the window
    // is 3 s.
    let recs = tb.run(
        "web",
        &[
            "--clients",
            &SCALE_CLIENTS.to_string(),
            "--reps",
            "1",
            "--duration",
            "3s",
        ],
        &dir.path().join("scale.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    check_web(r, "nginx", SCALE_CLIENTS, &names);
    // Every client's bytes are accounted, and the hosts' totals agree.
    let flows = r["flows"].as_array().expect("flows");
    let sum = |k: &str| flows.iter().map(|f| f[k].as_u64().expect(k)).sum::<u64>();
    assert!(flows.iter().all(|f| f["bytes_tx"].as_u64() > Some(0)));
    assert_eq!(
        sum("bytes_tx"),
        r["bytes"]["client_tx"].as_u64().expect("client_tx")
    );
    assert_eq!(
        sum("bytes_rx"),
        r["bytes"]["client_rx"].as_u64().expect("client_rx")
    );
    // Every host's peak memory is in the record.
    let cpu = r["hosts_cpu"].as_array().expect("hosts_cpu");
    assert_eq!(cpu.len(), 3);
    assert!(
        cpu.iter().all(|h| h["peak_rss_kib"].as_u64() > Some(0)),
        "{cpu:?}"
    );
    // nginx was sized to the clients: its workers together hold them all,
    // each may open its share, and they share one port by reuseport.
    let s = &r["app"]["services"][0];
    let config = s["config"].as_str().expect("config");
    let value = |key: &str| -> u64 {
        config
            .lines()
            .find_map(|l| l.trim().strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches(';').parse().ok())
            .unwrap_or_else(|| panic!("{key} in {config}"))
    };
    let workers = value("worker_processes ");
    assert_eq!(s["workers"].as_u64(), Some(workers));
    assert!(value("worker_connections ") * workers >= SCALE_CLIENTS as u64);
    assert!(value("worker_rlimit_nofile ") > value("worker_connections "));
    assert!(config.contains(" reuseport"), "{config}");
    // ... and the server host's memory for the clients is nginx's own.
    let nginx_kib: u64 = s["facts"]["peak_rss_kib"]
        .as_str()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("nginx's peak memory in {}", s["facts"]));
    assert!(nginx_kib > 0);

    // A client host's share past what one process may open is refused in
    // one line before any client connects (where the limit is low enough
    // that such a share is a valid count).
    let hard: u64 = ok(Command::new("sh")
        .args(["-c", "ulimit -Hn"])
        .output()
        .expect("ulimit"))
    .trim()
    .parse()
    .unwrap_or(u64::MAX);
    if hard < 49_000 {
        let too_many = (2 * (hard + 1)).to_string();
        let out = netgap()
            .args([
                "run",
                "web",
                "--hosts",
                &tb.hosts_arg(),
                "--clients",
                &too_many,
            ])
            .args(["--reps", "1", "--duration", "200ms"])
            .output()
            .expect("netgap run");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success());
        assert_eq!(stderr.trim_end().lines().count(), 1, "{stderr}");
        assert!(
            stderr.contains(&format!("{} clients on this host", hard + 1))
                && stderr.contains("file descriptors"),
            "{stderr}"
        );
    } else {
        eprintln!("{test}: the descriptor limit {hard} is too high to refuse a share");
    }
    tb.down();
    tb.assert_gone();
}

#[test]
fn more_clients_than_apache_serves_are_refused_in_one_line() {
    let a = AgentProc::start_with("127.0.0.1", &["--allow-services"]);
    let b = AgentProc::start("127.0.0.1");
    let hosts = format!("{},{}", a.addr, b.addr);
    fails_with_one_line(
        &[
            "run",
            "web",
            "--server",
            "apache",
            "--server-workers",
            "1",
            "--clients",
            "16000",
            "--hosts",
            &hosts,
        ],
        "past the most its ThreadLimit may be (20000)",
    );
}

/// The server host's entry of `hosts_cpu`: on the first host, the server
/// role, with CPU time at least `per_transaction_ns` a transaction of the
/// window (the agent alone spends next to nothing serving; the server
/// program's processes spend at least that on each request's system calls).
fn check_server_cpu(r: &Value, server_host: &str, per_transaction_ns: f64) {
    let cpu = r["hosts_cpu"].as_array().expect("hosts_cpu");
    let servers: Vec<&Value> = cpu.iter().filter(|h| h["role"] == "server").collect();
    assert_eq!(servers.len(), 1, "{cpu:?}");
    let s = servers[0];
    assert_eq!(s["host"].as_str(), Some(server_host), "{s}");
    let cpu_ns = s["cpu"]["cpu_ns"].as_f64().expect("cpu_ns");
    let wall_ns = s["cpu"]["wall_ns"].as_f64().expect("wall_ns");
    let transactions = metric(r, "transactions");
    eprintln!(
        "{} on {server_host}: {:.1}% of a core, {cpu_ns} ns for {transactions} transactions",
        r["app"]["options"]["server"], s["cpu"]["process_percent"]
    );
    assert!(
        cpu_ns >= per_transaction_ns * transactions,
        "{} ns of server CPU for {transactions} transactions: {s}",
        cpu_ns
    );
    let pct = s["cpu"]["process_percent"]
        .as_f64()
        .expect("process_percent");
    assert!(
        (pct - 100.0 * cpu_ns / wall_ns).abs() < 1e-6 * pct.max(1.0),
        "{s}"
    );
}

#[test]
fn the_servers_own_cpu_is_counted_and_apache_serves_more_clients_than_its_default_workers() {
    let test =
        "the_servers_own_cpu_is_counted_and_apache_serves_more_clients_than_its_default_workers";
    if !system_ready(test) || !servers_ready(test) {
        return;
    }
    let (tb, _) = Testbed::up("webcpu", &["--hosts", "3", "--topology", "switch"]);
    let names: Vec<String> = tb.hosts().hosts.iter().map(|h| h.name.clone()).collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let recs = tb.run(
        "web",
        &[
            "--server",
            "nginx,apache",
            "--clients",
            "4",
            "--reps",
            "1",
            "--duration",
            "500ms",
        ],
        &dir.path().join("cpu.jsonl"),
    );
    assert_eq!(recs.len(), 2);
    for r in &recs {
        let server = r["app"]["options"]["server"].as_str().expect("server");
        check_web(r, server, 4, &names);
        check_server_cpu(r, &names[0], 2_000.0);
    }
    // Apache's default is a child of 64 threads per CPU; more clients than
    // that are served with no error, its workers sized to them.
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let clients = 64 * cpus + 100;
    let recs = tb.run(
        "web",
        &[
            "--server",
            "apache",
            "--clients",
            &clients.to_string(),
            "--reps",
            "1",
            "--duration",
            "1s",
        ],
        &dir.path().join("apache.jsonl"),
    );
    assert_eq!(recs.len(), 1);
    let r = &recs[0];
    check_web(r, "apache", clients, &names);
    check_server_cpu(r, &names[0], 2_000.0);
    let s = &r["app"]["services"][0];
    assert!(s["workers"].as_u64() >= Some(clients as u64), "{s}");
    let config = s["config"].as_str().expect("config");
    let max: u64 = config
        .lines()
        .find_map(|l| l.strip_prefix("MaxRequestWorkers "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("MaxRequestWorkers in {config}"));
    assert!(max >= clients as u64, "{config}");
    tb.down();
    tb.assert_gone();
}

/// A server killed in the middle of the window: the requests that fail
/// after it mark the point (its `errors`, a warning with the last error,
/// the table's note, and one with what the server's logs said, its end
/// among it), and `checked` still counts the window's transactions only.
#[test]
fn a_point_whose_server_dies_mid_window_is_marked() {
    let test = "a_point_whose_server_dies_mid_window_is_marked";
    if !system_ready(test) || !servers_ready(test) {
        return;
    }
    let server_agent = AgentProc::start_with("127.0.0.1", &["--allow-services"]);
    let clients = AgentProc::start("127.0.0.1");
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    // A 3 s window after a 0.6 s warm-up.
    let run = netgap()
        .args(["run", "web", "--server", "nginx", "--clients", "4"])
        .args(["--reps", "1", "--duration", "3s", "--hosts"])
        .arg(format!("{},{}", server_agent.addr, clients.addr))
        .arg("--json")
        .arg(&json)
        .stdout(std::fs::File::create(dir.path().join("out")).expect("out"))
        .stderr(std::fs::File::create(dir.path().join("err")).expect("err"))
        .spawn()
        .expect("netgap run");
    let mut run = common::procs::Reaped(run);
    let is_nginx = |c: &str| c.starts_with("nginx") || c.starts_with("/usr/sbin/nginx");
    let t0 = Instant::now();
    loop {
        let tree = common::procs::descendants(server_agent.child.id());
        if tree.iter().filter(|(_, _, c)| is_nginx(c)).count() >= 2 {
            break;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "nginx never started: {tree:?}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // Well into the window: every nginx process of this agent goes.
    std::thread::sleep(Duration::from_millis(1800));
    for (pid, _, c) in common::procs::descendants(server_agent.child.id()) {
        if is_nginx(&c) {
            let _ = Command::new("kill")
                .args(["-KILL", &pid.to_string()])
                .status();
        }
    }
    let status = run.0.wait().expect("netgap run ends");
    let stdout = std::fs::read_to_string(dir.path().join("out")).expect("out");
    let stderr = std::fs::read_to_string(dir.path().join("err")).expect("err");
    assert!(status.success(), "{stdout}{stderr}");
    let recs = read_records(&json);
    assert_eq!(recs.len(), 1, "{stderr}");
    let r = &recs[0];
    assert!(metric(r, "errors") > 0.0, "{}", r["app"]);
    assert!(metric(r, "transactions") > 0.0, "{}", r["app"]);
    assert_eq!(
        metric(r, "checked"),
        metric(r, "transactions"),
        "{}",
        r["app"]
    );
    let warnings = crate::common::warnings(r);
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("failed transactions: ") && w.contains("; last error: ")),
        "{warnings:?}"
    );
    // What explains the failures comes back with them: the server's end,
    // from its agent, in the record and the run's output alike.
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("what the logs said: the server on ")
                && w.contains("nginx: exited before the run's end")),
        "{warnings:?}"
    );
    let all = format!("{stdout}{stderr}");
    assert!(all.contains("errors="), "the table's note: {all}");
    assert!(all.contains("failed transactions: "), "the warning: {all}");
    assert!(all.contains("what the logs said: "), "the evidence: {all}");
}

/// Whether the unprivileged user may make a user namespace here (where it
/// may not, its agent's workers are not in a namespace of their own).
fn user_namespaces_allowed() -> bool {
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(["unshare", "--user", "--map-current-user", "--pid", "--fork"])
        .args(["--kill-child=SIGKILL", "--", "true"])
        .status()
        .is_ok_and(|s| s.success())
}

/// An agent that is not root (uid 65534) serves nginx and then Apache for
/// `web` and is killed with SIGKILL mid-run: within 2 s nothing it started
/// runs, the servers' workers included.
#[test]
fn a_killed_agent_that_is_not_root_takes_its_servers_with_it() {
    let test = "a_killed_agent_that_is_not_root_takes_its_servers_with_it";
    if !system_ready(test) || !servers_ready(test) {
        return;
    }
    if !user_namespaces_allowed() {
        common::skip(test, "this kernel allows no unprivileged user namespaces");
        return;
    }
    // The agent's run directories, in a directory of its own user.
    let tmp = tempfile::tempdir().expect("tempdir");
    std::os::unix::fs::chown(tmp.path(), Some(65534), Some(65534)).expect("chown");
    for server in ["nginx", "apache"] {
        let mut agent = common::procs::Reaped(
            Command::new("setpriv")
                .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                .arg(common::netgap_path())
                .args([
                    "serve",
                    "--bind",
                    "127.0.0.1",
                    "--port",
                    "0",
                    "--allow-services",
                    "--run-dir",
                ])
                // A base in the test's own directory, which goes with it:
                // the killed agent cannot remove its run directory itself.
                .arg(tmp.path().join("run"))
                .env("TMPDIR", tmp.path())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("agent starts"),
        );
        let addr = common::agent_addr(&mut agent.0);
        let clients = AgentProc::start("127.0.0.1");
        let _run = common::procs::Reaped(
            netgap()
                .args(["run", "web", "--server", server, "--reps", "1"])
                .args(["--duration", "30s", "--clients", "2", "--hosts"])
                .arg(format!("{addr},{}", clients.addr))
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("netgap run"),
        );
        let program = if server == "nginx" {
            "nginx"
        } else {
            "apache2"
        };
        // The server's own processes, not unshare naming it.
        let is_server = |cmdline: &str| {
            cmdline.starts_with(program) || cmdline.starts_with(&format!("/usr/sbin/{program}"))
        };
        let t0 = Instant::now();
        let tree = loop {
            let tree = common::procs::descendants(agent.0.id());
            // The master and at least one worker.
            let servers = tree.iter().filter(|(_, _, c)| is_server(c)).count();
            if servers >= 2 {
                break tree;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(20),
                "{server} never started: {tree:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // The servers run as the agent's user, in a PID namespace that is
        // not this one.
        let own_ns = std::fs::read_link("/proc/self/ns/pid").expect("own pid ns");
        let server_pid = tree
            .iter()
            .find(|(_, _, c)| is_server(c))
            .map(|(p, _, _)| *p)
            .expect("a server process");
        assert_ne!(
            std::fs::read_link(format!("/proc/{server_pid}/ns/pid")).expect("its pid ns"),
            own_ns
        );
        agent.0.kill().expect("SIGKILL the agent");
        let _ = agent.0.wait();
        let left = common::gone_within(Duration::from_secs(2), || {
            common::procs::still_running(&tree)
        });
        assert_eq!(left, Ok(()), "{server}: processes outlived their agent");
    }
}
