//! 10,000 concurrent flows on loopback through the flow engine, pingpong
//! then connect over tcp, then pingpong over udp, checking that every flow
//! worked, that bytes balance, and that each process's peak memory grows by
//! a bounded amount per flow: for 1-byte pingpong, less than the page that
//! a message buffer of each flow's own would take. The test binary runs other tests beside this
//! one, so both sides run in child processes of their own (this test
//! binary again, running only the ignored `client_child` or `server_child`
//! helper): the server as it would on another host, each side needing only
//! one descriptor per flow, and nothing else in either process while its
//! memory is measured.
#![allow(
    clippy::unwrap_used,
    reason = "test code: a failed unwrap is a failed test"
)]

use crate::common;
use netgap::flows::{self, ClientSpec, EngineConfig, FlowServer, FlowWork};
use std::io::{BufRead, BufReader, Write};
use std::net::SocketAddr;
use std::process::{Child, ChildStdin, Stdio};
use std::time::{Duration, Instant};

const FLOWS: usize = 10_000;
/// Generous bound on memory per flow (client and server side together):
/// buffers, state and a compact histogram are a few KiB; this catches
/// per-flow structures that grow without bound, not slowness.
const MAX_GROWTH_PER_FLOW_BYTES: u64 = 64 * 1024;
/// Bound on memory per 1-byte pingpong flow, on each side: its state,
/// socket handle and histogram come to about 1.1 KiB on the client and
/// 0.4 KiB on the server, its message bytes are its worker's; a buffer of
/// each flow's own at the default layout (a page, as every flow had until
/// the buffers were shared) cannot fit under it.
const MAX_ONE_BYTE_GROWTH_PER_FLOW_BYTES: u64 = 3 * 1024;

/// A field of /proc/self/status in bytes (the file gives kB).
fn status_kib(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with(field)).unwrap();
    line.split_whitespace()
        .nth(1)
        .unwrap()
        .parse::<u64>()
        .unwrap()
        * 1024
}

/// What the child server reported when stopped.
struct ServerSide {
    bytes_rx: u64,
    bytes_tx: u64,
    accepted: u64,
    peak_rss_bytes: u64,
    rss_before_bytes: u64,
}

/// A flow server in a child process.
struct ChildServer {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: std::io::Lines<BufReader<std::process::ChildStdout>>,
    addr: SocketAddr,
}

impl ChildServer {
    fn start(mode: &str) -> ChildServer {
        let mut child = common::child_test(module_path!(), "server_child")
            .env("NETGAP_FLOWS_CHILD", mode)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let stdin = child.stdin.take();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let addr = loop {
            let line = lines
                .next()
                .expect("child server exited before listening")
                .unwrap();
            // The harness prints the test's name on the same line first.
            if let Some(at) = line.find("ADDR ") {
                break line[at + 5..].trim().parse().unwrap();
            }
        };
        ChildServer {
            child,
            stdin,
            lines,
            addr,
        }
    }

    fn stop(mut self) -> ServerSide {
        writeln!(self.stdin.take().unwrap(), "stop").unwrap();
        let line = loop {
            let line = self
                .lines
                .next()
                .expect("child server exited without totals")
                .unwrap();
            if let Some(at) = line.find("TOTALS ") {
                break line[at + 7..].to_string();
            }
        };
        let v: Vec<u64> = line
            .split_whitespace()
            .map(|x| x.parse().unwrap())
            .collect();
        assert!(self.child.wait().unwrap().success());
        ServerSide {
            bytes_rx: v[0],
            bytes_tx: v[1],
            accepted: v[2],
            peak_rss_bytes: v[3],
            rss_before_bytes: v[4],
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        // Only reached with the child still running if the test failed.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The server side, run by [`ChildServer`] in a child process; does nothing
/// when run directly.
#[test]
#[ignore = "helper run in a child process by the 10,000-flow test"]
fn server_child() {
    let mode = std::env::var("NETGAP_FLOWS_CHILD");
    let work = match mode.as_deref() {
        Ok("pingpong" | "udp") => FlowWork::PingPong { size_bytes: 1 },
        Ok("connect") => FlowWork::Connect {
            request_bytes: 16,
            reply_bytes: 64,
        },
        _ => return,
    };
    let rss_before = status_kib("VmRSS:");
    let mut cfg = EngineConfig::tcp(2, Duration::from_secs(10));
    if mode.as_deref() == Ok("udp") {
        cfg.path = &flows::DATAGRAMS;
        cfg.token = Some(udp_token());
    }
    let server = FlowServer::bind("127.0.0.1:0".parse().unwrap(), work, cfg).unwrap();
    println!("ADDR {}", server.local_addr());
    let mut line = String::new();
    std::io::stdin().read_line(&mut line).unwrap();
    let t = server.stop().unwrap();
    println!(
        "TOTALS {} {} {} {} {}",
        t.bytes_rx,
        t.bytes_tx,
        t.connections_accepted,
        status_kib("VmHWM:"),
        rss_before
    );
}

/// The session token of the udp flows, which prove it in their opening.
fn udp_token() -> netgap::proto::dataproof::DataToken {
    netgap::proto::dataproof::DataToken::from_bytes([5; 32])
}

#[test]
fn ten_thousand_flows_pingpong_and_connect_with_bounded_memory() {
    let out = common::child_test(module_path!(), "client_child")
        .env("NETGAP_FLOWS_CLIENT", "1")
        .output()
        .expect("the client's process runs");
    // The child's report, for this test's own output.
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "the client's process failed: {stdout}"
    );
    assert!(
        stdout.contains("1 passed"),
        "the client's process ran no test: {stdout}"
    );
}

/// The client side and the checks of
/// [`ten_thousand_flows_pingpong_and_connect_with_bounded_memory`], run by
/// it in a process of their own; does nothing when run directly.
#[test]
#[ignore = "helper run in a child process by the 10,000-flow test"]
fn client_child() {
    if std::env::var_os("NETGAP_FLOWS_CLIENT").is_none() {
        return;
    }
    if let Err(e) = flows::ensure_fd_limit(FLOWS as u64 + 2 * flows::limits::SPARE_FDS) {
        common::skip(
            "ten_thousand_flows_pingpong_and_connect_with_bounded_memory",
            &e.to_string(),
        );
        return;
    }
    let cfg = EngineConfig::tcp(2, Duration::from_secs(10));
    let rss_before = status_kib("VmRSS:");

    let t0 = Instant::now();
    let work = FlowWork::PingPong { size_bytes: 1 };
    let server = ChildServer::start("pingpong");
    let spec = ClientSpec {
        target: server.addr,
        flows: FLOWS,
        work,
        bind_ip: None,
    };
    let clients = flows::prepare_clients(&spec, &cfg).unwrap();
    let prepared = t0.elapsed();
    let report = clients
        .run(Duration::from_secs(1), Duration::from_secs(1))
        .unwrap();
    let totals = server.stop();
    let hwm_pingpong = status_kib("VmHWM:");

    assert_eq!(report.flows.len(), FLOWS);
    assert_eq!(totals.accepted, FLOWS as u64);
    let round_trips: u64 = report.flows.iter().map(|f| f.round_trips).sum();
    let idle = report.flows.iter().filter(|f| f.round_trips == 0).count();
    for f in &report.flows {
        assert_eq!(f.bytes_tx, f.bytes_rx, "flow {}", f.index);
        assert_eq!(f.hist.len(), f.round_trips);
    }
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    assert_eq!(totals.bytes_rx, tx);
    assert_eq!(totals.bytes_tx, tx);
    // Every flow took part: each made at least one round trip over the run.
    assert!(report.flows.iter().all(|f| f.bytes_tx > 0));
    let mut merged = netgap::stats::LatencyHistogram::new();
    for f in &report.flows {
        f.hist.merge_into(&mut merged);
    }
    let p = merged.percentiles_us(1.0).unwrap();
    eprintln!(
        "pingpong: {FLOWS} flows opened in {prepared:?}; {round_trips} round trips in 1 s \
         ({idle} flows with none in the window); round trip p50 {:.0} us p99 {:.0} us; \
         client peak RSS {} MiB (from {} MiB), server peak RSS {} MiB (from {} MiB)",
        p.p50,
        p.p99,
        hwm_pingpong >> 20,
        rss_before >> 20,
        totals.peak_rss_bytes >> 20,
        totals.rss_before_bytes >> 20
    );
    let server_growth = totals
        .peak_rss_bytes
        .saturating_sub(totals.rss_before_bytes)
        / FLOWS as u64;
    let client_growth = hwm_pingpong.saturating_sub(rss_before) / FLOWS as u64;
    eprintln!(
        "pingpong: {client_growth} bytes per flow on the client, {server_growth} on the server"
    );
    assert!(
        server_growth < MAX_ONE_BYTE_GROWTH_PER_FLOW_BYTES,
        "server: {server_growth} bytes per 1-byte flow"
    );
    assert!(
        client_growth < MAX_ONE_BYTE_GROWTH_PER_FLOW_BYTES,
        "client: {client_growth} bytes per 1-byte flow"
    );
    // The bound is per flow of one run: the ping-pong run's per-flow
    // histograms go before the connect run's flows are opened.
    drop(report);

    let work = FlowWork::Connect {
        request_bytes: 16,
        reply_bytes: 64,
    };
    let server = ChildServer::start("connect");
    let spec = ClientSpec {
        target: server.addr,
        flows: FLOWS,
        work,
        bind_ip: None,
    };
    let clients = flows::prepare_clients(&spec, &cfg).unwrap();
    let report = clients
        .run(Duration::from_secs(1), Duration::from_secs(1))
        .unwrap();
    let totals = server.stop();
    let hwm_connect = status_kib("VmHWM:");

    let connections: u64 = report.flows.iter().map(|f| f.round_trips).sum();
    let errors: u64 = report.flows.iter().map(|f| f.errors).sum();
    assert!(connections > 0);
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    let rx: u64 = report.flows.iter().map(|f| f.bytes_rx).sum();
    assert_eq!(totals.bytes_rx, tx);
    assert_eq!(totals.bytes_tx, rx);
    assert!(
        report.flows.iter().all(|f| f.bytes_rx > 0),
        "every flow completed a connection"
    );
    eprintln!(
        "connect: {FLOWS} flows, {connections} connections in 1 s, {errors} failed; \
         client peak RSS {} MiB, server peak RSS {} MiB",
        hwm_connect >> 20,
        totals.peak_rss_bytes >> 20
    );
    let server_growth = totals
        .peak_rss_bytes
        .saturating_sub(totals.rss_before_bytes)
        / FLOWS as u64;
    assert!(
        server_growth < MAX_GROWTH_PER_FLOW_BYTES,
        "server: {server_growth} bytes per flow"
    );

    drop(report);

    // Pingpong over udp: a datagram socket per client flow, each proving
    // the session in its opening, a few bytes of state per flow on the
    // server.
    let udp_cfg = EngineConfig {
        path: &flows::DATAGRAMS,
        token: Some(udp_token()),
        ..cfg.clone()
    };
    let server = ChildServer::start("udp");
    let spec = ClientSpec {
        target: server.addr,
        flows: FLOWS,
        work: FlowWork::PingPong { size_bytes: 1 },
        bind_ip: None,
    };
    let t0 = Instant::now();
    let clients = flows::prepare_clients(&spec, &udp_cfg).unwrap();
    let prepared = t0.elapsed();
    let report = clients
        .run(Duration::from_secs(1), Duration::from_secs(1))
        .unwrap();
    let totals = server.stop();
    let hwm_udp = status_kib("VmHWM:");
    assert_eq!(report.flows.len(), FLOWS);
    assert_eq!(totals.accepted, FLOWS as u64);
    for f in &report.flows {
        assert!(f.bytes_tx > 0, "flow {}", f.index);
        assert_eq!(f.bytes_tx, f.bytes_rx, "flow {}", f.index);
    }
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    assert_eq!(totals.bytes_rx, tx);
    assert_eq!(totals.bytes_tx, tx);
    let round_trips: u64 = report.flows.iter().map(|f| f.round_trips).sum();
    let retries: u64 = report
        .flows
        .iter()
        .filter_map(|f| f.datagrams)
        .map(|d| d.retries)
        .sum();
    eprintln!(
        "udp: {FLOWS} flows opened in {prepared:?}; {round_trips} round trips in 1 s, \
         {retries} re-sends; client peak RSS {} MiB, server peak RSS {} MiB (from {} MiB)",
        hwm_udp >> 20,
        totals.peak_rss_bytes >> 20,
        totals.rss_before_bytes >> 20
    );
    let server_growth = totals
        .peak_rss_bytes
        .saturating_sub(totals.rss_before_bytes)
        / FLOWS as u64;
    assert!(
        server_growth < MAX_GROWTH_PER_FLOW_BYTES,
        "udp server: {server_growth} bytes per flow"
    );

    let growth = hwm_connect
        .max(hwm_pingpong)
        .max(hwm_udp)
        .saturating_sub(rss_before);
    let per_flow = growth / FLOWS as u64;
    eprintln!(
        "client peak RSS growth {} MiB, {per_flow} bytes per flow",
        growth >> 20
    );
    assert!(
        per_flow < MAX_GROWTH_PER_FLOW_BYTES,
        "{per_flow} bytes per flow"
    );
}
