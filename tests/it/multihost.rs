//! Workloads end to end: the real binary as coordinator against real
//! agents on loopback addresses 127.0.0.2..5 (and the in-process default),
//! asserting on the JSON records: per-flow bytes, the cyclic allotment,
//! per-link bytes of multirail, the engine workloads over every transport
//! they carry (udp included), the agents' refusals, and a client host
//! dying mid-run.

use serde_json::Value;
use std::process::Stdio;
use std::time::{Duration, Instant};

use crate::common;
use crate::common::{has_whole_record, netgap, read_records, run_ok, u, AgentProc};

/// A server agent on 127.0.0.2 and `clients` client agents on 127.0.0.3...
fn agents(clients: u8) -> Vec<AgentProc> {
    (0..=clients)
        .map(|i| AgentProc::start(&format!("127.0.0.{}", 2 + i)))
        .collect()
}

fn hosts_arg(agents: &[AgentProc]) -> String {
    agents
        .iter()
        .map(|a| a.addr.clone())
        .collect::<Vec<_>>()
        .join(",")
}

/// Every flow of a bandwidth record delivered what was sent (tcp), and
/// moved something.
fn check_stream_flows(r: &Value, clients: usize) {
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), clients, "{r}");
    for (i, f) in flows.iter().enumerate() {
        assert_eq!(u(&f["index"]), i as u64);
        assert!(u(&f["bytes_tx"]) > 0, "flow {i} sent nothing: {f}");
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "flow {i}: {f}");
        assert!(f["value"].as_f64().expect("value") > 0.0);
    }
    let sum: f64 = flows
        .iter()
        .map(|f| f["value"].as_f64().unwrap_or(0.0))
        .sum();
    let value = r["value"].as_f64().expect("value");
    assert!(value > 0.0);
    // One repetition: the aggregate is the sum of the flows.
    assert!(
        (sum - value).abs() <= 1e-6 * value.max(1.0),
        "{sum} vs {value}"
    );
}

#[test]
fn fanin_and_fanout_spread_clients_cyclically_over_real_agents() {
    let agents = agents(3);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts = hosts_arg(&agents);
    run_ok(netgap().args([
        "run",
        "fanin,fanout",
        "--hosts",
        &hosts,
        "--clients",
        "4",
        "--reps",
        "1",
        "--duration",
        "200ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r["metric"], "bandwidth_gbps");
        assert_eq!(u(&r["clients"]), 4);
        assert_eq!(u(&r["client_hosts"]), 3);
        check_stream_flows(r, 4);
        // Client i runs on client host i % 3.
        for (i, f) in r["flows"].as_array().expect("flows").iter().enumerate() {
            assert_eq!(f["host"], agents[1 + i % 3].addr.as_str(), "flow {i}");
        }
        let cpu = r["hosts_cpu"].as_array().expect("hosts_cpu");
        assert_eq!(cpu.len(), 4);
        assert_eq!(cpu[0]["role"], "server");
        assert_eq!(cpu[0]["host"], agents[0].addr.as_str());
        assert!(cpu[1..].iter().all(|h| h["role"] == "client"));
        assert!(cpu.iter().all(|h| u(&h["peak_rss_kib"]) > 0));
    }
    assert_eq!(records[0]["test"], "fanin");
    assert_eq!(records[1]["test"], "fanout");
    // fan-in: clients send; fan-out: the server sends.
    let b = |r: &Value, k: &str| u(&r["bytes"][k]);
    assert!(b(&records[0], "client_tx") > 0 && b(&records[0], "server_tx") == 0);
    assert!(b(&records[1], "server_tx") > 0 && b(&records[1], "client_tx") == 0);
}

/// An agent answers a coordinator's goodbye only once nothing of the
/// session runs, and the coordinator waits for that answer: commands run
/// one right after another (as scripts do) never find an agent busy with
/// the one before.
#[test]
fn a_run_started_right_after_another_finds_the_agents_free() {
    let agents = agents(2);
    let hosts = hosts_arg(&agents);
    for test in [
        "multistream",
        "hotspot",
        "multistream",
        "fanin",
        "connect",
        "fanout",
        "multistream",
        "hotspot",
    ] {
        run_ok(netgap().args([
            "run",
            test,
            "--hosts",
            &hosts,
            "--reps",
            "1",
            "--duration",
            "50ms",
        ]));
    }
}

#[test]
fn multistream_runs_every_stream_from_the_first_client_host() {
    let agents = agents(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts = hosts_arg(&agents);
    run_ok(netgap().args([
        "run",
        "multistream",
        "--hosts",
        &hosts,
        "-P",
        "1,3",
        "--reps",
        "1",
        "--duration",
        "200ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 2);
    for (r, p) in records.iter().zip([1, 3]) {
        check_stream_flows(r, p);
        assert_eq!(u(&r["client_hosts"]), 1);
        assert!(r["flows"]
            .as_array()
            .expect("flows")
            .iter()
            .all(|f| f["host"] == agents[1].addr.as_str()));
    }
}

#[test]
fn multirail_uses_every_link_of_a_hosts_file() {
    multirail_over_links("tcp", "2");
}

#[test]
fn multirail_runs_over_udp_with_each_flow_bound_to_its_link() {
    multirail_over_links("udp", "1");
}

/// multirail over `transport` on three loopback links of a hosts file:
/// each link's flow leaves from its own address and carries bytes.
fn multirail_over_links(transport: &str, reps: &str) {
    let agents = agents(1);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts_file = dir.path().join("hosts.json");
    let links: Vec<Value> = (1..=3)
        .map(|k| {
            serde_json::json!({
                "peer": "h1", "index": k - 1,
                "local": format!("127.0.1.{k}"), "remote": format!("127.0.2.{k}"),
                "ifname": "lo", "mtu_bytes": 65536
            })
        })
        .collect();
    let file = serde_json::json!({
        "version": 1,
        "topology": "list",
        "hosts": [
            {"name": "h1", "control": agents[0].addr, "address": "127.0.0.2"},
            {"name": "h2", "control": agents[1].addr, "address": "127.0.0.3", "links": links},
        ]
    });
    std::fs::write(&hosts_file, file.to_string()).expect("hosts file written");
    let hosts = format!("@{}", hosts_file.display());
    run_ok(netgap().args([
        "run",
        "multirail",
        "--hosts",
        &hosts,
        "-t",
        transport,
        "--reps",
        reps,
        "--duration",
        "200ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["transport"], transport);
    assert_eq!(u(&r["clients"]), 3);
    let links = r["links"].as_array().expect("links");
    assert_eq!(links.len(), 3);
    for (k, l) in links.iter().enumerate() {
        assert_eq!(l["local"], format!("127.0.1.{}", k + 1));
        assert_eq!(l["remote"], format!("127.0.2.{}", k + 1));
        assert!(u(&l["bytes"]) > 0, "link {k} carried nothing: {l}");
        assert!(l["bandwidth_gbps"].as_f64().expect("bw") > 0.0);
    }
    for f in r["flows"].as_array().expect("flows") {
        assert_eq!(f["host"], "h2");
        if transport == "udp" {
            // Datagrams lost on the way are sent but not received.
            assert!(u(&f["bytes_rx"]) > 0, "{f}");
            assert!(u(&f["bytes_rx"]) <= u(&f["bytes_tx"]), "{f}");
        } else {
            assert_eq!(f["bytes_tx"], f["bytes_rx"]);
        }
    }
}

#[test]
fn in_process_hosts_run_without_any_agent() {
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    run_ok(netgap().args([
        "run",
        "fanin,multirail",
        "--client-hosts",
        "2",
        "--links",
        "2",
        "--reps",
        "1",
        "--duration",
        "100ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 2);
    check_stream_flows(&records[0], 2);
    assert_eq!(records[0]["flows"][1]["host"], "127.0.0.3");
    let links = records[1]["links"].as_array().expect("links");
    assert_eq!(links.len(), 2);
    assert_ne!(links[0]["local"], links[1]["local"]);
    assert!(links.iter().all(|l| u(&l["bytes"]) > 0));
}

#[test]
fn bad_workload_flags_are_one_line_errors() {
    for (args, want) in [
        (vec!["run", "fanin", "--clients", "0"], "--clients"),
        (vec!["run", "fanin", "--clients", "5000"], "--clients"),
        (vec!["run", "fanin", "--duration", "3h"], "--duration"),
        (vec!["run", "fanin,pingpong"], "cannot be mixed"),
        (vec!["run", "connect", "--cork"], "--cork"),
        (
            vec!["run", "connect", "-t", "udp"],
            "connect measures connection setup, which udp does not have",
        ),
        (vec!["run", "fanin", "--hosts", "127.0.0.1"], "--hosts"),
    ] {
        let out = netgap().args(&args).output().expect("netgap runs");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

/// Sends `spec` as a `group_prepare` to a fresh session of `agent` and
/// returns the agent's answer.
fn prepare_raw(
    agent: &AgentProc,
    spec: netgap::proto::workload::WorkloadSpec,
) -> netgap::proto::Reply {
    use netgap::control::ControlConn;
    use netgap::proto::{decode_reply, CoordinatorSession};
    // The previous session's end may still be releasing the agent.
    let deadline = Instant::now() + Duration::from_secs(5);
    let (mut conn, mut session) = loop {
        let stream = std::net::TcpStream::connect(&agent.addr).expect("agent reachable");
        let mut conn = ControlConn::new(stream).expect("control connection");
        let mut session = CoordinatorSession::new();
        conn.send(&session.hello()).expect("hello sent");
        let welcome = decode_reply(&conn.recv_payload(Duration::from_secs(5)).expect("welcome"))
            .expect("welcome decodes");
        match session.on_welcome(welcome) {
            Ok(_) => break (conn, session),
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("welcome: {e}"),
        }
    };
    let token = netgap::preamble::new_token().expect("a data token");
    conn.send(&session.workload_prepare(spec, token))
        .expect("prepare sent");
    // An agent preparing a role says it is alive every second meanwhile;
    // the answer is the first other reply.
    loop {
        let reply = decode_reply(
            &conn
                .recv_payload(Duration::from_secs(5))
                .expect("an answer"),
        )
        .expect("answer decodes");
        if reply != netgap::proto::Reply::WorkloadAlive {
            return reply;
        }
    }
}

/// A pipeline's parameters for role `role` of a two-role staged placement
/// whose first role announced `peer`.
fn staged_pipeline(role: usize, peer: &str) -> serde_json::Value {
    serde_json::json!({
        "preset": "vm", "query_bytes": 1024, "filters": 1, "copies": 1, "credits": 1,
        "compute_us": 0, "colocate": false,
        "staged": {
            "role": role,
            "roles": [{"side": "server", "flows": [0, 1]}, {"side": "server", "flows": [2]}],
            "peers": [[peer]],
        },
    })
}

fn raw_spec(target: &str) -> netgap::proto::workload::WorkloadSpec {
    use netgap::proto::workload::{WorkloadRole, WorkloadSpec};
    use netgap::spec::{Mode, PointSpec, TransportOptions};
    WorkloadSpec {
        point: PointSpec {
            test: "fanin".into(),
            transport: "tcp".into(),
            mode: Mode::Event,
            size_bytes: 1024,
            options: TransportOptions::default(),
            server_cpu: None,
            io_timeout_ms: 1000,
            verify: false,
        },
        role: WorkloadRole::Client,
        params: serde_json::json!({}),
        flows: 1,
        listen_ips: vec![],
        targets: vec![target.into()],
        bind_ips: vec![],
        session_hosts: vec!["127.0.0.2".parse().expect("ip")],
        warmup_ms: 0,
        duration_ms: 100,
    }
}

#[test]
fn agent_refuses_parameters_past_its_limits_before_any_data_socket() {
    use netgap::proto::Reply;
    // A listener that must never see a connection.
    let bait = std::net::TcpListener::bind("127.0.0.2:0").expect("bait listener");
    bait.set_nonblocking(true).expect("nonblocking");
    let target = bait.local_addr().expect("addr").to_string();
    let agent = AgentProc::start("127.0.0.3");
    let cases: Vec<(netgap::proto::workload::WorkloadSpec, &str)> = vec![
        (
            {
                let mut s = raw_spec(&target);
                s.flows = netgap::proto::workload::MAX_WORKLOAD_FLOWS + 1;
                s
            },
            "flows",
        ),
        (
            {
                let mut s = raw_spec(&target);
                s.duration_ms = netgap::proto::workload::MAX_WORKLOAD_DURATION_MS + 1;
                s
            },
            "duration_ms",
        ),
        (
            {
                // The target is not a host of the session.
                let mut s = raw_spec(&target);
                s.session_hosts = vec!["127.0.0.9".parse().expect("ip")];
                s
            },
            "not a host of this session",
        ),
        (
            {
                let mut s = raw_spec(&target);
                s.point.test = "nosuchload".into();
                s
            },
            "unknown workload \"nosuchload\"",
        ),
        (
            {
                // A field the workload does not know is refused by its own
                // parameter type.
                let mut s = raw_spec(&target);
                s.params = serde_json::json!({"direction": "from_server"});
                s
            },
            "fanin: bad parameters",
        ),
        (
            {
                let mut s = raw_spec(&target);
                s.point.test = "connect".into();
                s.params = serde_json::json!({"request_bytes": "many"});
                s
            },
            "connect: bad parameters",
        ),
        (
            {
                // A staged role told to reach an earlier role that is not
                // a host of the session.
                let mut s = raw_spec(&target);
                s.point.test = "pipeline".into();
                s.role = netgap::proto::workload::WorkloadRole::Server;
                s.targets = vec![];
                s.params = staged_pipeline(1, "127.0.0.9:7");
                s
            },
            "127.0.0.9 is not a host of this session",
        ),
        (
            {
                // Nor, without a key, off loopback.
                let mut s = raw_spec(&target);
                s.point.test = "pipeline".into();
                s.role = netgap::proto::workload::WorkloadRole::Server;
                s.targets = vec![];
                s.session_hosts.push("192.0.2.1".parse().expect("ip"));
                s.params = staged_pipeline(1, "192.0.2.1:7");
                s
            },
            "192.0.2.1 is not a loopback address",
        ),
    ];
    for (spec, want) in cases {
        match prepare_raw(&agent, spec) {
            Reply::Error { message } => assert!(message.contains(want), "{message}"),
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert!(
        bait.accept().is_err(),
        "the agent opened a data connection for a refused request"
    );
    // Within limits and to a session host, the same agent connects, and
    // the bait, which is no netgap agent, gets no payload.
    match prepare_raw(&agent, raw_spec(&target)) {
        Reply::Error { message } => assert!(message.contains("no payload was sent"), "{message}"),
        other => panic!("expected a refusal of the bait, got {other:?}"),
    }
}

#[test]
fn agent_refuses_workload_roles_past_its_own_limits_before_any_data_socket() {
    use netgap::proto::Reply;
    let bait = std::net::TcpListener::bind("127.0.0.2:0").expect("bait listener");
    bait.set_nonblocking(true).expect("nonblocking");
    let target = bait.local_addr().expect("addr").to_string();
    let agent = AgentProc::start_with(
        "127.0.0.3",
        &[
            "--max-flows",
            "2",
            "--max-duration",
            "1s",
            "--max-message",
            "4K",
        ],
    );
    let mut too_many = raw_spec(&target);
    too_many.flows = 3;
    too_many.targets = vec![target.clone()];
    let mut too_long = raw_spec(&target);
    too_long.warmup_ms = 500;
    too_long.duration_ms = 600;
    let mut too_big = raw_spec(&target);
    too_big.point.test = "hotspot".into();
    too_big.point.size_bytes = 8192;
    // A size inside the workload's own parameters meets the same limit.
    let mut too_big_reply = raw_spec(&target);
    too_big_reply.point.test = "connect".into();
    too_big_reply.params = serde_json::json!({"request_bytes": 1, "reply_bytes": 8192});
    let cases = [
        (too_many, "3 flows"),
        (too_long, "longest this agent allows"),
        (too_big, "8192-byte messages"),
        (too_big_reply, "8192-byte messages"),
    ];
    for (spec, want) in cases {
        match prepare_raw(&agent, spec) {
            Reply::Error { message } => {
                assert!(message.contains("agent's limits"), "{message}");
                assert!(message.contains(want), "{message}");
            }
            other => panic!("expected a refusal, got {other:?}"),
        }
    }
    assert!(
        bait.accept().is_err(),
        "the agent opened a data connection for a refused request"
    );
    match prepare_raw(&agent, raw_spec(&target)) {
        Reply::Error { message } => assert!(message.contains("no payload was sent"), "{message}"),
        other => panic!("expected a refusal of the bait, got {other:?}"),
    }
}

/// `hotspot` and `connect` over `transport` in `mode` against real agents:
/// the record says how it was measured, and every flow's bytes add up.
fn engine_workloads_over(transport: &str, mode: &str) {
    let agents = agents(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts = hosts_arg(&agents);
    run_ok(netgap().args([
        "run",
        "hotspot,connect",
        "--hosts",
        &hosts,
        "--clients",
        "3",
        "-t",
        transport,
        "--mode",
        mode,
        "--sizes",
        "100",
        "--reps",
        "1",
        "--duration",
        "200ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 2);
    for r in &records {
        assert_eq!(r["transport"], transport, "{r}");
        assert_eq!(r["mode"], mode, "{r}");
        assert_eq!(u(&r["clients"]), 3);
        let flows = r["flows"].as_array().expect("flows");
        assert_eq!(flows.len(), 3);
        for (i, f) in flows.iter().enumerate() {
            assert_eq!(f["host"], agents[1 + i % 2].addr.as_str(), "flow {i}");
            assert!(u(&f["bytes_tx"]) > 0, "flow {i} sent nothing: {f}");
            assert!(f["value"].as_f64().expect("value") > 0.0, "{f}");
        }
        // What the clients sent the server received, and the other way.
        let b = |k: &str| u(&r["bytes"][k]);
        assert_eq!(b("client_tx"), b("server_rx"), "{r}");
        assert_eq!(b("server_tx"), b("client_rx"), "{r}");
        let sent: u64 = flows.iter().map(|f| u(&f["bytes_tx"])).sum();
        assert_eq!(sent, b("client_tx"));
    }
    let (hotspot, connect) = (&records[0], &records[1]);
    assert_eq!(hotspot["test"], "hotspot");
    assert_eq!(hotspot["metric"], "latency_us");
    // Every round trip finished: each flow got back what it sent.
    for f in hotspot["flows"].as_array().expect("flows") {
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "{f}");
        assert_eq!(u(&f["bytes_tx"]) % 100, 0, "{f}");
    }
    assert_eq!(connect["test"], "connect");
    assert_eq!(connect["metric"], "connections_per_s");
    // Whole connections: a 100-byte request for every 100-byte reply.
    for f in connect["flows"].as_array().expect("flows") {
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "{f}");
    }
}

#[test]
fn hotspot_and_connect_run_over_uring() {
    if let Err(why) = netgap::transport::find("uring")
        .expect("uring is a transport")
        .availability()
    {
        common::skip(
            "hotspot_and_connect_run_over_uring",
            &format!("uring is not available: {why}"),
        );
        return;
    }
    engine_workloads_over("uring", "event");
}

#[test]
fn hotspot_and_connect_honour_poll_mode() {
    engine_workloads_over("tcp", "poll");
}

/// `hotspot` over udp in `mode` against real agents, 100-byte messages:
/// the record says how it was measured, the clients sit cyclically on the
/// client hosts, and every request and reply counts once at each end
/// however often its datagram was sent.
fn hotspot_over_udp(mode: &str) {
    let agents = agents(2);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts = hosts_arg(&agents);
    run_ok(netgap().args([
        "run",
        "hotspot",
        "--hosts",
        &hosts,
        "--clients",
        "3",
        "-t",
        "udp",
        "--mode",
        mode,
        "--sizes",
        "100",
        "--reps",
        "1",
        "--duration",
        "200ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["test"], "hotspot");
    assert_eq!(r["transport"], "udp", "{r}");
    assert_eq!(r["mode"], mode, "{r}");
    assert_eq!(r["metric"], "latency_us");
    assert_eq!(u(&r["clients"]), 3);
    assert_eq!(u(&r["client_hosts"]), 2);
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 3);
    for (i, f) in flows.iter().enumerate() {
        assert_eq!(f["host"], agents[1 + i % 2].addr.as_str(), "flow {i}");
        assert!(u(&f["bytes_tx"]) > 0, "flow {i} sent nothing: {f}");
        // Every request had its reply.
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "flow {i}: {f}");
        assert_eq!(u(&f["bytes_tx"]) % 100, 0, "{f}");
        assert!(f["value"].as_f64().expect("value") > 0.0, "{f}");
    }
    let b = |k: &str| u(&r["bytes"][k]);
    assert_eq!(b("client_tx"), b("server_rx"), "{}", r["bytes"]);
    assert_eq!(b("server_tx"), b("client_rx"), "{}", r["bytes"]);
    let sent: u64 = flows.iter().map(|f| u(&f["bytes_tx"])).sum();
    assert_eq!(sent, b("client_tx"));
    // Both ends' datagrams are in the record: each request and reply
    // delivered once, repeats counted as duplicates.
    let d = &r["datagrams"];
    let (c, s) = (&d["client"], &d["server"]);
    assert!(u(&c["datagrams_sent"]) >= b("client_tx") / 100, "{d}");
    assert_eq!(
        u(&c["datagrams_received"]) - u(&c["duplicates"]),
        b("client_rx") / 100,
        "{d}"
    );
    assert_eq!(
        u(&s["datagrams_received"]) - u(&s["duplicates"]),
        b("server_rx") / 100,
        "{d}"
    );
    assert!(
        u(&s["datagrams_received"]) <= u(&c["datagrams_sent"]),
        "{d}"
    );
}

/// The bug: `netgap run hotspot -t udp --clients 2000` failed with
/// "Connection refused" (400 clients worked). The server role ended a fixed
/// 700 ms after the window, since it waited for its clients' connections
/// to close and datagram flows have none; 2,000 clients overflow the
/// server's sockets, and a flow whose last request was lost waits up to a
/// second to send it again, by then to a closed port. The server now serves
/// until its clients have sent nothing for longer than that wait, so every
/// flow ends its last exchange and the bytes balance at both ends.
#[test]
fn a_udp_hotspot_of_2000_clients_ends_every_exchange_with_the_server_still_there() {
    const CLIENTS: u64 = 2000;
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    run_ok(netgap().args([
        "run",
        "hotspot",
        "-t",
        "udp",
        "--clients",
        &CLIENTS.to_string(),
        "--reps",
        "1",
        "--duration",
        "1s",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 1);
    let r = &records[0];
    assert_eq!(r["transport"], "udp", "{r}");
    let flows = r["flows"].as_array().expect("flows");
    assert_eq!(flows.len() as u64, CLIENTS);
    for (i, f) in flows.iter().enumerate() {
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "flow {i}: {f}");
    }
    let b = |k: &str| u(&r["bytes"][k]);
    assert_eq!(b("client_tx"), b("server_rx"), "{}", r["bytes"]);
    assert_eq!(b("server_tx"), b("client_rx"), "{}", r["bytes"]);
}

#[test]
fn hotspot_runs_over_udp_in_event_mode() {
    hotspot_over_udp("event");
}

#[test]
fn hotspot_runs_over_udp_in_poll_mode() {
    hotspot_over_udp("poll");
}

/// How a client host fails mid-run.
#[derive(Clone, Copy)]
enum Failure {
    /// Its agent process is killed (its connections close).
    Killed,
    /// Its agent process is stopped (SIGSTOP): silent, connections open.
    Stopped,
}

/// Makes one client host's agent fail once the first point is written and
/// checks the coordinator names that host within 5 seconds and keeps every
/// completed point.
fn dead_client_host_is_named(test: &str) {
    failed_client_host_is_named(test, Failure::Killed);
}

fn failed_client_host_is_named(test: &str, how: Failure) {
    let mut agents = agents(3);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts = hosts_arg(&agents);
    let mut coord = netgap()
        .args([
            "run",
            test,
            "--hosts",
            &hosts,
            "--clients",
            "3,3,3,3,3,3,3,3,3,3,3,3",
            "--reps",
            "3",
            "--duration",
            "500ms",
            "--json",
            json.to_str().expect("utf-8 path"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("coordinator starts");
    let t0 = Instant::now();
    while !has_whole_record(&json) {
        assert!(t0.elapsed() < Duration::from_secs(30), "no point completed");
        assert!(coord.try_wait().expect("wait").is_none(), "run ended early");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Mid-point: the next point's repetitions are running.
    std::thread::sleep(Duration::from_millis(300));
    let victim = agents[2].addr.clone();
    match how {
        Failure::Killed => agents[2].kill(),
        Failure::Stopped => {
            let pid = nix::unistd::Pid::from_raw(agents[2].child.id() as i32);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP)
                .expect("SIGSTOP delivered");
        }
    }
    let killed = Instant::now();
    let status = loop {
        if let Some(s) = coord.try_wait().expect("wait") {
            break s;
        }
        if killed.elapsed() > Duration::from_secs(10) {
            let _ = coord.kill();
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
    let line = err
        .lines()
        .find(|l| l.starts_with("netgap: error:"))
        .unwrap_or_else(|| panic!("no error line: {err}"));
    assert!(line.contains(&victim), "{line} does not name {victim}");
    assert!(line.contains("points measured before are in"), "{line}");
    let kept = read_records(&json);
    assert!(!kept.is_empty());
    assert!(kept.iter().all(|r| r["test"] == test));
}

#[test]
fn dead_client_host_mid_fanin_is_named_and_points_are_kept() {
    dead_client_host_is_named("fanin");
}

#[test]
fn dead_client_host_mid_hotspot_is_named_and_points_are_kept() {
    dead_client_host_is_named("hotspot");
}

#[test]
fn hotspot_and_connect_report_every_client_over_real_agents() {
    let agents = agents(3);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts = hosts_arg(&agents);
    run_ok(netgap().args([
        "run",
        "hotspot,connect",
        "--hosts",
        &hosts,
        "--clients",
        "3,6",
        "--reps",
        "2",
        "--duration",
        "200ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 4);
    for r in &records {
        let n = u(&r["clients"]) as usize;
        let flows = r["flows"].as_array().expect("flows");
        assert_eq!(flows.len(), n);
        for (i, f) in flows.iter().enumerate() {
            assert_eq!(f["host"], agents[1 + i % 3].addr.as_str(), "flow {i}");
            assert!(u(&f["bytes_tx"]) > 0, "flow {i}: {f}");
            assert!(f["value"].as_f64().expect("value") > 0.0);
            let p = &f["percentiles"];
            assert!(p["p50"].as_f64() <= p["p99"].as_f64(), "{p}");
        }
        // What every client sent, the server received, and back.
        let b = |k: &str| u(&r["bytes"][k]);
        assert_eq!(b("client_tx"), b("server_rx"), "{}", r["bytes"]);
        let p = &r["percentiles"];
        assert!(p["p50"].as_f64() <= p["p99"].as_f64() && p["p99"].as_f64() <= p["max"].as_f64());
        assert_eq!(r["hosts_cpu"].as_array().expect("hosts_cpu").len(), 4);
    }
    let hotspot = &records[0];
    assert_eq!(hotspot["metric"], "latency_us");
    // The headline is the mean of the clients' latencies.
    let flows = hotspot["flows"].as_array().expect("flows");
    let mean: f64 = flows
        .iter()
        .map(|f| f["value"].as_f64().unwrap_or(0.0))
        .sum::<f64>()
        / flows.len() as f64;
    let st = &hotspot["stats"];
    assert!(mean >= st["min"].as_f64().expect("min") * 0.999);
    assert!(mean <= st["max"].as_f64().expect("max") * 1.001);
    for f in flows {
        // Pingpong: a client receives exactly what it sends.
        assert_eq!(f["bytes_tx"], f["bytes_rx"]);
    }
    assert_eq!(records[2]["metric"], "connections_per_s");
    assert!(records[2]["value"].as_f64().expect("value") > 0.0);
}

#[test]
fn silent_client_host_mid_fanin_is_named_within_5_seconds() {
    failed_client_host_is_named("fanin", Failure::Stopped);
}

#[test]
fn bandwidth_tests_run_over_every_transport_that_crosses_hosts() {
    let mut transports = vec!["tcp", "udp"];
    match netgap::transport::find("uring")
        .expect("uring is a transport")
        .availability()
    {
        Ok(()) => transports.push("uring"),
        Err(why) => common::skip(
            "bandwidth_tests_run_over_every_transport_that_crosses_hosts over uring",
            &format!("uring is not available: {why}"),
        ),
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    run_ok(netgap().args([
        "run",
        "fanin,fanout",
        "-t",
        &transports.join(","),
        "--client-hosts",
        "2",
        "--clients",
        "2",
        "--reps",
        "1",
        "--duration",
        "100ms",
        "--timeout",
        "500ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 2 * transports.len());
    for r in &records {
        let flows = r["flows"].as_array().expect("flows");
        assert_eq!(flows.len(), 2, "{r}");
        for f in flows {
            assert!(u(&f["bytes_rx"]) > 0, "{f}");
            if r["transport"] == "udp" {
                // Datagrams lost on the way are sent but not received.
                assert!(u(&f["bytes_rx"]) <= u(&f["bytes_tx"]), "{f}");
            } else {
                assert_eq!(f["bytes_tx"], f["bytes_rx"], "{f}");
            }
        }
        // A datagram path's counters are in the record, its sender's
        // datagrams beside what the receiver took and lost; a stream has
        // none.
        let d = &r["datagrams"];
        if r["transport"] == "udp" {
            let (sender, receiver) = if r["test"] == "fanin" {
                (&d["client"], &d["server"])
            } else {
                (&d["server"], &d["client"])
            };
            assert!(u(&sender["datagrams_sent"]) > 0, "{r}");
            assert!(u(&receiver["datagrams_received"]) > 0, "{r}");
            assert!(
                u(&receiver["datagrams_received"]) + u(&receiver["lost"])
                    <= u(&sender["datagrams_sent"])
                        + u(&receiver["duplicates"])
                        + u(&receiver["reordered"]),
                "{r}"
            );
        } else {
            assert!(d.is_null(), "{r}");
        }
    }
}

#[test]
fn in_process_engine_runs_refuse_more_flows_than_descriptors_allow() {
    use std::os::unix::process::CommandExt;
    // The run gets a hard limit of its own, below what 16,384 flows (the
    // most a run takes) need, whatever the limit of this process.
    const HARD_LIMIT: u64 = 4096;
    // Both ends of every flow plus 256 spare must fit under the hard limit:
    // one flow more than fits.
    let flows = (HARD_LIMIT - 256) / 2 + 1;
    let mut cmd = netgap();
    cmd.args(["run", "connect", "--client-hosts", "1", "--clients"])
        .arg(flows.to_string());
    // SAFETY: the closure runs in the child between fork and exec and only
    // makes one system call (setrlimit), which is async-signal-safe; it
    // allocates nothing and takes no lock.
    unsafe {
        cmd.pre_exec(|| {
            nix::sys::resource::setrlimit(
                nix::sys::resource::Resource::RLIMIT_NOFILE,
                HARD_LIMIT,
                HARD_LIMIT,
            )
            .map_err(std::io::Error::from)
        });
    }
    let out = cmd.output().expect("netgap runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{flows} in-process flows ran: {err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("descriptors") && err.contains("--hosts"),
        "{err}"
    );
}

/// A client host's agent stopped (SIGSTOP) as a point's flows are being set
/// up is named within the I/O timeout (3 s by default) and a second, as a
/// host silent while running is: the run fails in one line naming it.
#[test]
fn silent_client_host_during_setup_is_named_within_the_timeout() {
    let agents = agents(3);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let hosts = hosts_arg(&agents);
    // Many flows per client host, so that setting them up takes a while.
    let mut coord = netgap()
        .args([
            "run",
            "hotspot",
            "--hosts",
            &hosts,
            "--clients",
            "1500,1500,1500,1500",
            "--reps",
            "1",
            "--duration",
            "200ms",
            "--json",
            json.to_str().expect("utf-8 path"),
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("coordinator starts");
    let t0 = Instant::now();
    // The first point is written just before the next point's roles are
    // prepared: stop the victim then.
    while !has_whole_record(&json) {
        assert!(t0.elapsed() < Duration::from_secs(60), "no point completed");
        assert!(coord.try_wait().expect("wait").is_none(), "run ended early");
        std::thread::sleep(Duration::from_millis(1));
    }
    let victim = agents[2].addr.clone();
    let pid = nix::unistd::Pid::from_raw(agents[2].child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP delivered");
    let stopped = Instant::now();
    let status = loop {
        if let Some(s) = coord.try_wait().expect("wait") {
            break s;
        }
        if stopped.elapsed() > Duration::from_secs(20) {
            let _ = coord.kill();
            break coord.wait().expect("reaped");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let elapsed = stopped.elapsed();
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT);
    let mut err = String::new();
    std::io::Read::read_to_string(&mut coord.stderr.take().expect("stderr"), &mut err)
        .expect("stderr read");
    assert!(!status.success());
    assert!(
        elapsed < Duration::from_secs(4),
        "took {elapsed:?} (the I/O timeout is 3 s): {err}"
    );
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.starts_with("netgap: error:"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(
        lines[0].contains(&victim),
        "{} does not name {victim}",
        lines[0]
    );
}

/// A host that no point uses for longer than its agent's idle time (here
/// 5 s, from `--max-duration 5s`) has its session ended by that agent: the
/// run goes on, and the next point that needs the host opens a fresh one.
#[test]
fn a_host_left_idle_past_its_agents_idle_time_is_met_again_by_a_later_point() {
    let agents: Vec<AgentProc> = (0..3)
        .map(|i| AgentProc::start_with(&format!("127.0.0.{}", 2 + i), &["--max-duration", "5s"]))
        .collect();
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let t0 = Instant::now();
    // multistream uses the first two hosts only, for more than 5 s; fanin
    // then needs all three.
    run_ok(netgap().args([
        "run",
        "multistream,fanin",
        "--hosts",
        &hosts_arg(&agents),
        "-P",
        "1,2,3",
        "--reps",
        "3",
        "--duration",
        "500ms",
        "--json",
        json.to_str().expect("utf-8 path"),
    ]));
    let records = read_records(&json);
    assert_eq!(records.len(), 4, "{records:?}");
    assert!(t0.elapsed() > Duration::from_secs(6), "{:?}", t0.elapsed());
    let fanin = &records[3];
    assert_eq!(fanin["test"], "fanin");
    let flows = fanin["flows"].as_array().expect("flows");
    assert_eq!(flows.len(), 2, "{fanin}");
    for f in flows {
        assert!(u(&f["bytes_tx"]) > 0, "{f}");
        assert_eq!(f["bytes_tx"], f["bytes_rx"], "{f}");
    }
    assert!(flows.iter().any(|f| f["host"] == agents[2].addr.as_str()));
}
