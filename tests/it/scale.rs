//! Many flows over several client hosts of a namespace testbed, with the
//! server's listen backlog cut to a handful: the clients' paced setup (a
//! window of non-blocking connects, each done once the server's role
//! answered its session proof, the window narrowed by retransmissions)
//! opens every flow within the I/O timeout, and every flow's bytes are
//! accounted in the record. Flow counts are kept small so the test takes
//! seconds; the 10,000 to 100,000-flow figures are `bench/run-scale.sh`'s.
//!
//! A server role past what one process may hold is spread over shard
//! processes on one listener; the agent's hidden `--flows-per-process`
//! forces that at a small scale on loopback agents, and the tests check
//! that every flow's bytes are accounted, the record says how many
//! processes served, and no shard outlives its role, whether the run ends,
//! its coordinator is killed, or its agent is.
//!
//! The testbed test needs root, `ip` and network namespaces; without them
//! it prints why and passes, unless NETGAP_REQUIRE_SYSTEM_TESTS=1 (as in
//! CI).

use crate::common;
use crate::common::testbed::Testbed;
use crate::common::{netgap, ok, read_records, system_ready, AgentProc};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};

const FLOWS: u64 = 3000;

#[test]
fn a_paced_setup_opens_every_flow_past_a_tiny_backlog_and_accounts_for_every_byte() {
    if !system_ready(
        "a_paced_setup_opens_every_flow_past_a_tiny_backlog_and_accounts_for_every_byte",
    ) {
        return;
    }
    let (tb, _) = Testbed::up("scalepace", &["--hosts", "3", "--topology", "switch"]);
    // The server (the first host) listens after this: its backlog is 16,
    // far below the clients' first window of 256 each.
    ok(Command::new("ip")
        .args(["netns", "exec", &tb.ns("h1"), "sh", "-c"])
        .arg(
            "echo 16 > /proc/sys/net/core/somaxconn && \
             echo 16 > /proc/sys/net/ipv4/tcp_max_syn_backlog",
        )
        .output()
        .expect("setting the backlog"));
    let backlog = ok(Command::new("ip")
        .args([
            "netns",
            "exec",
            &tb.ns("h1"),
            "cat",
            "/proc/sys/net/core/somaxconn",
        ])
        .output()
        .expect("reading the backlog"));
    assert_eq!(backlog.trim(), "16");
    let dir = tempfile::tempdir().expect("tempdir");
    let records = tb.run(
        "hotspot",
        &[
            "--clients",
            &FLOWS.to_string(),
            "--reps",
            "1",
            // Every one of 3,000 clients must complete a round trip in
            // the window, beside the rest of the suite on two vCPUs: 500
            // ms left 118 without one on a slower guest.
            "--duration",
            "1500ms",
        ],
        &dir.path().join("r.jsonl"),
    );
    assert_eq!(records.len(), 1);
    let r = &records[0];
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len() as u64, FLOWS);
    let mut per_host: BTreeMap<String, u64> = BTreeMap::new();
    let (mut tx, mut rx) = (0, 0);
    for (i, f) in flows.iter().enumerate() {
        assert_eq!(f["index"].as_u64(), Some(i as u64), "{f}");
        let (t, x) = (
            f["bytes_tx"].as_u64().expect("bytes_tx"),
            f["bytes_rx"].as_u64().expect("bytes_rx"),
        );
        // 1-byte round trips, every one finished: what went out came back.
        assert!(t > 0 && t == x, "flow {i} moved {t} out, {x} back: {f}");
        tx += t;
        rx += x;
        *per_host
            .entry(f["host"].as_str().expect("host").to_string())
            .or_default() += 1;
    }
    assert_eq!(
        per_host.into_iter().collect::<Vec<_>>(),
        vec![("h2".to_string(), FLOWS / 2), ("h3".to_string(), FLOWS / 2)]
    );
    assert_eq!(tx, rx);
    // Every host's peak memory is in the record.
    let hosts: &Vec<Value> = r["hosts_cpu"].as_array().expect("hosts_cpu");
    assert_eq!(hosts.len(), 3);
    for h in hosts {
        assert!(h["peak_rss_kib"].as_u64().is_some_and(|k| k > 0), "{h}");
    }
    tb.down();
}

/// Flows of the sharded runs, and the most one server process holds:
/// four shard processes.
const SHARDED_FLOWS: u64 = 2000;
const PER_PROCESS: &str = "500";

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Some(child) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{child}/stat")) else {
            continue;
        };
        // "PID (COMM) STATE PPID ...": the command may hold spaces.
        let ppid = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().nth(1))
            .and_then(|p| p.parse::<u32>().ok());
        let zombie = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next())
            == Some("Z");
        if ppid == Some(pid) && !zombie {
            out.push(child);
        }
    }
    out
}

/// Waits up to `within` for `pid` to have no child process left.
fn no_child_within(pid: u32, within: Duration) -> Result<(), Vec<u32>> {
    common::gone_within(within, || children_of(pid))
}

/// A sharded server agent and a client agent on loopback.
fn sharded_agents() -> (AgentProc, AgentProc) {
    (
        AgentProc::start_with("127.0.0.2", &["--flows-per-process", PER_PROCESS]),
        AgentProc::start("127.0.0.3"),
    )
}

fn check_sharded_record(test: &str) {
    let (server, client) = sharded_agents();
    let hosts = format!("{},{}", server.addr, client.addr);
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("r.jsonl");
    let out = netgap()
        .args(["run", test, "--hosts", &hosts])
        .args(["--clients", &SHARDED_FLOWS.to_string()])
        // A window in which each of 2,000 clients completes a round
        // trip while the rest of the suite runs beside it on two vCPUs:
        // 300 ms left 100 of them without one on a slower guest.
        .args(["--reps", "2", "--duration", "1s", "--json"])
        .arg(&path)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let records = read_records(&path);
    assert_eq!(records.len(), 1);
    let r = &records[0];
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len() as u64, SHARDED_FLOWS);
    for (i, f) in flows.iter().enumerate() {
        let (t, x) = (
            f["bytes_tx"].as_u64().expect("bytes_tx"),
            f["bytes_rx"].as_u64().expect("bytes_rx"),
        );
        // 1-byte exchanges, every one finished: what went out came back.
        assert!(t > 0 && t == x, "flow {i} moved {t} out, {x} back: {f}");
    }
    // The shards' totals, summed, are what the clients moved.
    let b = &r["bytes"];
    assert!(b["client_tx"].as_u64().is_some_and(|n| n > 0), "{b}");
    assert_eq!(b["client_tx"], b["server_rx"], "{b}");
    assert_eq!(b["client_rx"], b["server_tx"], "{b}");
    let hosts: &Vec<Value> = r["hosts_cpu"].as_array().expect("hosts_cpu");
    let srv = hosts
        .iter()
        .find(|h| h["role"] == "server")
        .expect("server host");
    // The agent and four shards of 500 connections each.
    assert_eq!(srv["processes"].as_u64(), Some(5), "{srv}");
    assert!(srv["peak_rss_kib"].as_u64().is_some_and(|k| k > 0), "{srv}");
    let cli = hosts
        .iter()
        .find(|h| h["role"] == "client")
        .expect("client host");
    assert!(cli.get("processes").is_none(), "{cli}");
    // The processes metric stays out of the workload's own figures.
    assert!(r["app"]["metrics"].get("processes").is_none(), "{r}");
    // Every shard ended with the role.
    if let Err(left) = no_child_within(server.child.id(), Duration::from_secs(3)) {
        panic!("shard processes left after the run: {left:?}");
    }
}

#[test]
fn hotspot_served_by_four_processes_accounts_for_every_flow() {
    check_sharded_record("hotspot");
}

#[test]
fn connect_served_by_four_processes_accounts_for_every_flow() {
    check_sharded_record("connect");
}

/// Starts a long sharded hotspot run and waits until the server agent has
/// its four shards; the coordinator's process.
fn start_long_sharded_run(server: &AgentProc, client: &AgentProc) -> std::process::Child {
    let hosts = format!("{},{}", server.addr, client.addr);
    let coord = netgap()
        .args(["run", "hotspot", "--hosts", &hosts])
        .args(["--clients", &SHARDED_FLOWS.to_string()])
        .args(["--reps", "1", "--duration", "20s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("coordinator");
    let t0 = Instant::now();
    while children_of(server.child.id()).len() < 4 {
        assert!(t0.elapsed() < Duration::from_secs(20), "no shards started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past the flows' setup: they move data.
    std::thread::sleep(Duration::from_millis(1500));
    coord
}

#[test]
fn a_killed_coordinator_leaves_no_shard_process() {
    let (server, client) = sharded_agents();
    let mut coord = start_long_sharded_run(&server, &client);
    coord.kill().expect("kill");
    let _ = coord.wait();
    if let Err(left) = no_child_within(server.child.id(), Duration::from_secs(3)) {
        panic!("shards still running 3 s after the coordinator died: {left:?}");
    }
    // Nothing holds the agents: the next sharded run gets in at once.
    let hosts = format!("{},{}", server.addr, client.addr);
    common::run_ok(
        netgap()
            .args(["run", "hotspot", "--hosts", &hosts])
            .args(["--clients", &SHARDED_FLOWS.to_string()])
            .args(["--reps", "1", "--duration", "200ms"]),
    );
}

#[test]
fn a_killed_agent_takes_its_shard_processes_with_it() {
    let (mut server, client) = sharded_agents();
    let mut coord = start_long_sharded_run(&server, &client);
    let shards = children_of(server.child.id());
    assert_eq!(shards.len(), 4, "{shards:?}");
    server.kill();
    // A shard's parent-death signal kills it; init reaps it.
    let alive = common::gone_within(Duration::from_secs(3), || {
        shards
            .iter()
            .filter(|p| {
                std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| !s.contains(") Z "))
            })
            .collect::<Vec<_>>()
    });
    assert!(
        alive.is_ok(),
        "shards alive 3 s after their agent was killed: {alive:?}"
    );
    let _ = coord.kill();
    let _ = coord.wait();
}

#[test]
fn a_role_past_the_most_shard_processes_is_refused_in_one_line() {
    // 10 connections per process: 200 flows would need 20 processes.
    let server = AgentProc::start_with("127.0.0.2", &["--flows-per-process", "10"]);
    let client = AgentProc::start("127.0.0.3");
    let hosts = format!("{},{}", server.addr, client.addr);
    common::fails_with_one_line(
        &[
            "run",
            "hotspot",
            "--hosts",
            &hosts,
            "--clients",
            "200",
            "--reps",
            "1",
            "--duration",
            "200ms",
        ],
        "200 flows need 20 server processes of 10 connections each",
    );
    assert!(children_of(server.child.id()).is_empty());
}
