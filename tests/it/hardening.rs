//! An agent that strangers cannot stop, exhaust or aim: the real binary as
//! agent on loopback, attacked the way a hostile client would, and a
//! coordinator that must still get in, be refused in one line, or see its
//! flows end with its session.

use crate::common;
use crate::common::{netgap, new_key_file as key_file, AgentProc as Agent};
use netgap::control::{Connect, ControlAddr, ControlConn};
use netgap::coordinator::Coordinator;
use netgap::proto::auth::{AuthFrame, Key};
use netgap::proto::codec::decode_reply;
use netgap::proto::message::Reply;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn read_key(path: &Path) -> Key {
    Key::from_bytes(std::fs::read(path).expect("key")).expect("a valid key")
}

fn keyed_agent(dir: &Path, flags: &[&str]) -> (Agent, std::path::PathBuf) {
    let key = key_file(dir, "key");
    let mut all = vec!["--key", key.to_str().expect("utf8")];
    all.extend_from_slice(flags);
    (Agent::start_with("127.0.0.1", &all), key)
}

/// Strangers holding `count` connections to `addr`, each renewed as soon as
/// the agent closes it, until dropped. `behave` runs on each fresh
/// connection (say nothing, send garbage, drip bytes).
struct Strangers {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Strangers {
    fn start(addr: SocketAddr, count: usize, behave: fn(&mut TcpStream)) -> Strangers {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::spawn(move || {
            let open = |_| {
                let mut s = TcpStream::connect(addr).ok()?;
                behave(&mut s);
                s.set_nonblocking(true).ok()?;
                Some(s)
            };
            let mut conns: Vec<Option<TcpStream>> = (0..count).map(open).collect();
            let mut renewed = 0;
            let mut buf = [0u8; 256];
            while !flag.load(Ordering::Relaxed) {
                for c in conns.iter_mut() {
                    let closed = match c.as_mut().map(|s| s.read(&mut buf)) {
                        Some(Ok(0)) | None => true,
                        Some(Ok(_)) => false,
                        Some(Err(e)) => e.kind() != std::io::ErrorKind::WouldBlock,
                    };
                    if closed {
                        *c = open(0);
                        renewed += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(5));
            }
            renewed
        });
        Strangers {
            stop,
            thread: Some(thread),
        }
    }
}

impl Strangers {
    /// Stops renewing and closes every connection; how many the agent
    /// closed meanwhile.
    fn stop(mut self) -> usize {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().map_or(0, |t| t.join().unwrap_or(0))
    }
}

impl Drop for Strangers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn silent(_: &mut TcpStream) {}

fn garbage(s: &mut TcpStream) {
    let _ = s.write_all(b"\x00\x00\x00\x10GET / HTTP/1.0\r\n\r\n");
}

fn drip(s: &mut TcpStream) {
    // Half a frame header: the agent waits for the rest.
    let _ = s.write_all(&[0, 0]);
}

#[test]
fn sixty_four_silent_pre_auth_connections_and_a_keyed_run_still_gets_in() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (agent, key_path) = keyed_agent(dir.path(), &[]);
    let key = read_key(&key_path);
    let addr: SocketAddr = agent.addr.parse().expect("addr");
    let control = ControlAddr::Tcp(addr);
    for behave in [silent, garbage, drip] {
        let strangers = Strangers::start(addr, 64, behave);
        std::thread::sleep(Duration::from_millis(300));
        for _ in 0..5 {
            let t0 = Instant::now();
            let coord =
                Coordinator::connect(&control, Some(&key)).expect("a keyed coordinator gets in");
            assert!(
                t0.elapsed() < Duration::from_secs(2),
                "in after {:?}",
                t0.elapsed()
            );
            coord.bye();
        }
        // A whole run through the binary, strangers still at it.
        let json = dir.path().join("r.jsonl");
        let out = netgap()
            .args(["run", "pingpong", "--peer", &agent.addr, "-s", "64"])
            .args(["--reps", "2", "-n", "50", "--json"])
            .arg(&json)
            .arg("--key")
            .arg(&key_path)
            .output()
            .expect("run");
        assert!(out.status.success(), "{out:?}");
        // The pool was full: every coordinator closed a stranger.
        assert!(strangers.stop() >= 5);
    }
}

#[test]
fn pre_auth_connections_from_many_source_addresses_do_not_keep_a_keyed_run_out() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (agent, key_path) = keyed_agent(dir.path(), &[]);
    let key = read_key(&key_path);
    let addr: SocketAddr = agent.addr.parse().expect("addr");
    // 100 sources on 127.0.0.0/8, one silent connection each.
    let held: Vec<TcpStream> = (2..102u8)
        .filter_map(|last| {
            use nix::sys::socket::{self as so, SockaddrIn};
            use std::os::fd::AsRawFd;
            let fd = so::socket(
                so::AddressFamily::Inet,
                so::SockType::Stream,
                so::SockFlag::empty(),
                None,
            )
            .ok()?;
            so::bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 1, last, 0)).ok()?;
            let SocketAddr::V4(to) = addr else {
                return None;
            };
            so::connect(fd.as_raw_fd(), &SockaddrIn::from(to)).ok()?;
            Some(TcpStream::from(fd))
        })
        .collect();
    assert!(held.len() >= 64, "{} connections", held.len());
    let t0 = Instant::now();
    let coord = Coordinator::connect(&ControlAddr::Tcp(addr), Some(&key)).expect("in");
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    coord.bye();
}

#[test]
fn a_second_key_proof_is_told_the_key_is_already_proven() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (agent, key_path) = keyed_agent(dir.path(), &[]);
    let key = read_key(&key_path);
    let addr = ControlAddr::parse(&agent.addr).expect("addr");
    let mut conn =
        ControlConn::new(addr.connect(Duration::from_secs(2)).expect("connect")).expect("conn");
    netgap::auth::prove(&mut conn, &key, Duration::from_secs(2)).expect("first proof");
    conn.send_payload(&AuthFrame::Begin.encode())
        .expect("begin");
    let reply = conn.recv_payload(Duration::from_secs(2)).expect("reply");
    match decode_reply(&reply) {
        Ok(Reply::Error { message }) => {
            assert!(message.contains("already proven"), "{message}");
            assert!(!message.contains("without a key"), "{message}");
        }
        other => panic!("expected an error reply, got {other:?}"),
    }
}

#[test]
fn framing_errors_get_a_one_line_reply_before_the_close() {
    let agent = Agent::start("127.0.0.1");
    for bad in [&[0xff, 0xff, 0xff, 0xff][..], &[0, 0, 0, 0][..]] {
        let mut s = TcpStream::connect(&agent.addr).expect("connect");
        s.write_all(bad).expect("send");
        let mut conn = ControlConn::new(s).expect("conn");
        let reply = conn.recv_payload(Duration::from_secs(2)).expect("a reply");
        match decode_reply(&reply) {
            Ok(Reply::Error { message }) => {
                assert!(message.contains("bad control frame"), "{message}");
                assert!(!message.contains('\n'));
            }
            other => panic!("expected an error reply, got {other:?}"),
        }
        assert!(conn.recv_payload(Duration::from_secs(2)).is_err(), "closed");
    }
}

/// Threads of process `pid` that belong to a workload role: its flows, the
/// flow engine's workers, the role itself and its CPU meter.
fn role_threads(pid: u32) -> Vec<String> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .map(|c| c.trim().to_string())
        .filter(|c| {
            c.starts_with("flow") || c.starts_with("workload role") || c.starts_with("cpu meter")
        })
        .collect()
}

/// Starts a long `test` run between a server agent and a client agent,
/// kills the coordinator once both agents run flows, and checks every flow
/// thread of both agents is gone within a second, and that the agents then
/// serve the next run.
fn flows_end_with_a_killed_coordinator(test: &str, count: &[&str]) {
    let agents = [Agent::start("127.0.0.2"), Agent::start("127.0.0.3")];
    let hosts = format!("{},{}", agents[0].addr, agents[1].addr);
    let mut coord = netgap()
        .args(["run", test, "--hosts", &hosts])
        .args(count)
        .args(["--reps", "1", "--duration", "20s"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("coordinator");
    let t0 = Instant::now();
    while agents.iter().any(|a| role_threads(a.child.id()).is_empty()) {
        assert!(t0.elapsed() < Duration::from_secs(10), "no flows started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // Past group_go: the flows move data.
    std::thread::sleep(Duration::from_millis(300));
    coord.kill().expect("kill");
    let _ = coord.wait();
    let left = common::gone_within(Duration::from_secs(1), || {
        agents
            .iter()
            .flat_map(|a| role_threads(a.child.id()))
            .collect::<Vec<_>>()
    });
    assert!(
        left.is_ok(),
        "still running a second after the coordinator died: {left:?}"
    );
    // Nothing holds the agents: the next run gets in at once.
    common::run_ok(
        netgap()
            .args(["run", test, "--hosts", &hosts])
            .args(count)
            .args(["--reps", "1", "--duration", "200ms"]),
    );
}

#[test]
fn a_coordinator_killed_after_group_go_leaves_no_stream_flow_running() {
    flows_end_with_a_killed_coordinator("multistream", &["-P", "4"]);
}

#[test]
fn a_coordinator_killed_after_group_go_leaves_no_engine_flow_running() {
    flows_end_with_a_killed_coordinator("hotspot", &["--clients", "8"]);
}

/// Peak resident memory of process `pid`, in KiB.
fn peak_rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("status");
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmHWM")
}

#[test]
fn a_workload_request_past_the_memory_budget_is_refused_before_allocation() {
    // 128 flows of 16 MiB: 4 GiB of buffers against the default 1 GiB.
    let agents = [Agent::start("127.0.0.2"), Agent::start("127.0.0.3")];
    let hosts = format!("{},{}", agents[0].addr, agents[1].addr);
    let out = netgap()
        .args(["run", "hotspot", "--hosts", &hosts, "--clients", "128"])
        .args(["-s", "16M", "--reps", "1", "--duration", "1s"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains("--max-memory"), "{stderr}");
    assert!(stderr.contains("128 flows"), "{stderr}");
    for a in &agents {
        let kib = peak_rss_kib(a.child.id());
        assert!(kib < 64 * 1024, "the agent grew to {kib} KiB");
    }
    // A smaller budget refuses a point-to-point point the same way.
    let small = Agent::start_with("127.0.0.1", &["--max-memory", "4M"]);
    let out = netgap()
        .args(["run", "pingpong", "--peer", &small.addr, "-s", "4M"])
        .args(["--reps", "1", "-n", "1"])
        .output()
        .expect("run");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("--max-memory"), "{stderr}");
    assert!(peak_rss_kib(small.child.id()) < 64 * 1024);
}

/// A plain sink that is no netgap agent: accepts connections on `ip`,
/// never answers, and counts every byte it is sent.
struct Sink {
    addr: SocketAddr,
    received: Arc<std::sync::atomic::AtomicU64>,
}

impl Sink {
    fn start(ip: &str) -> Sink {
        let listener = std::net::TcpListener::bind((ip, 0)).expect("sink binds");
        let addr = listener.local_addr().expect("addr");
        let received = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let count = Arc::clone(&received);
        std::thread::spawn(move || {
            for mut s in listener.incoming().flatten() {
                let count = Arc::clone(&count);
                std::thread::spawn(move || {
                    let mut buf = [0u8; 65536];
                    while let Ok(n @ 1..) = s.read(&mut buf) {
                        count.fetch_add(n as u64, Ordering::SeqCst);
                    }
                });
            }
        });
        Sink { addr, received }
    }

    fn received(&self) -> u64 {
        self.received.load(Ordering::SeqCst)
    }
}

/// Asks `agent` for two `test` client flows over `transport` aimed at
/// `target`, which the request itself lists as a host of the session (as a
/// coordinator holding the key could), with a 500 ms I/O timeout; the
/// agent's answer to the preparation and how long it took.
fn client_role_aimed_at(
    agent: &Agent,
    test: &str,
    transport: &str,
    size_bytes: u64,
    target: SocketAddr,
) -> (Result<Reply, netgap::proto::codec::CodecError>, Duration) {
    use netgap::proto::session::CoordinatorSession;
    use netgap::proto::workload::{WorkloadRole, WorkloadSpec};
    let addr = ControlAddr::parse(&agent.addr).expect("addr");
    let mut conn =
        ControlConn::new(addr.connect(Duration::from_secs(2)).expect("connect")).expect("conn");
    let mut session = CoordinatorSession::new();
    conn.send(&session.hello()).expect("hello");
    let welcome = decode_reply(&conn.recv_payload(Duration::from_secs(2)).expect("welcome"));
    session
        .on_welcome(welcome.expect("decodes"))
        .expect("welcome");
    let spec = WorkloadSpec {
        point: netgap::spec::PointSpec {
            test: test.into(),
            transport: transport.into(),
            mode: netgap::spec::Mode::Event,
            size_bytes,
            options: netgap::spec::TransportOptions::default(),
            server_cpu: None,
            io_timeout_ms: 500,
            verify: false,
        },
        role: WorkloadRole::Client,
        params: serde_json::json!({}),
        flows: 2,
        listen_ips: vec![],
        targets: vec![target.to_string()],
        bind_ips: vec![],
        session_hosts: vec![target.ip()],
        warmup_ms: 0,
        duration_ms: 2000,
    };
    let token = netgap::preamble::new_token().expect("token");
    conn.send(&session.workload_prepare(spec, token))
        .expect("prepare");
    let started = Instant::now();
    // The agent says it is alive every second while it prepares.
    let reply = loop {
        let reply = decode_reply(&conn.recv_payload(Duration::from_secs(5)).expect("reply"));
        if !matches!(reply, Ok(Reply::WorkloadAlive)) {
            break reply;
        }
    };
    (reply, started.elapsed())
}

#[test]
fn a_target_that_is_not_an_agent_of_the_session_is_refused_before_any_payload_byte() {
    let sink = Sink::start("127.0.0.9");
    let agent = Agent::start("127.0.0.2");
    // multistream clients aimed at the sink.
    let (reply, _) = client_role_aimed_at(&agent, "multistream", "tcp", 65536, sink.addr);
    match reply {
        Ok(Reply::Error { message }) => {
            assert!(message.contains("no payload was sent"), "{message}")
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(200));
    assert!(
        sink.received() <= netgap::proto::dataproof::HELLO_BYTES as u64,
        "the sink got {} bytes",
        sink.received()
    );
}

/// A UDP sink that is no netgap agent of the session: it acks every hello
/// as a udp flow server without the session's proof would (a bare
/// hello-ack), answers nothing else, and keeps the size and first bytes of
/// every datagram it gets.
struct UdpSink {
    addr: SocketAddr,
    got: Arc<std::sync::Mutex<Vec<Seen>>>,
}

/// A datagram a sink got: its size and first four bytes.
type Seen = (usize, [u8; 4]);

impl UdpSink {
    fn start(ip: &str) -> UdpSink {
        let socket = std::net::UdpSocket::bind((ip, 0)).expect("udp sink binds");
        let addr = socket.local_addr().expect("addr");
        let got = Arc::new(std::sync::Mutex::new(Vec::new()));
        let keep = Arc::clone(&got);
        std::thread::spawn(move || {
            let mut buf = [0u8; 65536];
            while let Ok((n, from)) = socket.recv_from(&mut buf) {
                if buf[..n.min(4)] == *b"NG\x01\x01" {
                    let mut ack = [0u8; 24];
                    ack[..4].copy_from_slice(b"NG\x01\x02");
                    let _ = socket.send_to(&ack, from);
                }
                let mut head = [0u8; 4];
                let k = n.min(4);
                head[..k].copy_from_slice(&buf[..k]);
                keep.lock().expect("sink lock").push((n, head));
            }
        });
        UdpSink { addr, got }
    }

    fn datagrams(&self) -> Vec<Seen> {
        self.got.lock().expect("sink lock").clone()
    }
}

#[test]
fn a_udp_target_that_is_not_an_agent_of_the_session_gets_hellos_and_no_payload_byte() {
    use netgap::proto::dataproof::DATAGRAM_HELLO_BYTES;
    let sink = UdpSink::start("127.0.0.9");
    let agent = Agent::start("127.0.0.2");
    // hotspot clients over udp (the flow engine's datagram flows) aimed
    // at the sink.
    let (reply, took) = client_role_aimed_at(&agent, "hotspot", "udp", 1000, sink.addr);
    // Refused within the I/O timeout and a second's grace, in one line
    // naming the target.
    assert!(took < Duration::from_millis(1500), "{took:?}");
    match reply {
        Ok(Reply::Error { message }) => {
            assert!(
                message.contains(&sink.addr.to_string())
                    && message.contains("did not prove it belongs to this session (it answered, but not as a netgap end)")
                    && message.contains("no payload was sent"),
                "{message}"
            );
            assert_eq!(message.lines().count(), 1, "{message}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    std::thread::sleep(Duration::from_millis(200));
    // Every datagram the sink got is a hello of the udp format, of its
    // fixed size: a nonce and padding, no payload byte.
    let got = sink.datagrams();
    assert!(!got.is_empty());
    for (n, head) in &got {
        assert_eq!(*n, 24 + DATAGRAM_HELLO_BYTES, "a {n}-byte datagram");
        assert_eq!(head, b"NG\x01\x01", "a datagram of another kind");
    }
}

/// An agent on loopback that names `named` as its data listener for every
/// point; its control address.
fn agent_naming(named: String) -> String {
    use netgap::proto::codec::decode_request;
    use netgap::proto::session::{AgentAction, AgentSession};
    let control = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let control_addr = control.local_addr().expect("addr").to_string();
    std::thread::spawn(move || {
        let (s, _) = control.accept().expect("accept");
        let mut conn = ControlConn::new(s).expect("conn");
        let mut session = AgentSession::new(netgap::transport::host::collect(None), false);
        while let Ok(p) = conn.recv_payload(Duration::from_secs(10)) {
            let Ok(req) = decode_request(&p) else { return };
            match session.on_request(&req) {
                Ok(AgentAction::Reply(r)) => conn.send(&r).expect("reply"),
                Ok(AgentAction::OpenPoint(_)) => {
                    let r = session.listening(named.clone()).expect("listening");
                    conn.send(&r).expect("reply");
                }
                _ => return,
            }
        }
    });
    control_addr
}

#[test]
fn a_coordinator_sends_no_payload_to_an_address_its_agent_names() {
    let sink = Sink::start("127.0.0.1");
    let control_addr = agent_naming(sink.addr.to_string());
    let out = netgap()
        .args(["run", "stream", "--peer", &control_addr, "-s", "64K"])
        .args(["--reps", "1", "-n", "100", "--timeout", "1s"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no payload was sent"), "{stderr}");
    assert!(
        sink.received() <= netgap::proto::dataproof::HELLO_BYTES as u64,
        "the sink got {} bytes",
        sink.received()
    );
}

#[test]
fn a_coordinator_sends_no_udp_payload_to_an_address_its_agent_names() {
    use netgap::proto::dataproof::HELLO_BYTES;
    // The point-to-point udp path proves the session over the flow's own
    // data datagrams (`preamble`): a sink that acks the udp hellos gets
    // them, the proof's hello (re-sent while unanswered) and header-only
    // probes, never a payload byte.
    let sink = UdpSink::start("127.0.0.1");
    let control_addr = agent_naming(sink.addr.to_string());
    let out = netgap()
        .args(["run", "stream", "-t", "udp", "--peer", &control_addr])
        .args(["-s", "1K", "--reps", "1", "-n", "100", "--timeout", "1s"])
        .output()
        .expect("run");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no payload was sent"), "{stderr}");
    let got = sink.datagrams();
    assert!(!got.is_empty());
    for (n, head) in &got {
        assert!(*n <= 24 + HELLO_BYTES, "a {n}-byte datagram {head:?}");
    }
    // The proof's hello did go out: the path got as far as the proof.
    assert!(
        got.iter()
            .any(|(n, head)| *n == 24 + HELLO_BYTES && head == b"NG\x01\x03"),
        "{got:?}"
    );
}

#[test]
fn max_rate_paces_bandwidth_roles_to_the_limit() {
    let flags = ["--max-rate", "0.2"];
    let agents = [
        Agent::start_with("127.0.0.2", &flags),
        Agent::start_with("127.0.0.3", &flags),
    ];
    let hosts = format!("{},{}", agents[0].addr, agents[1].addr);
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("r.jsonl");
    let out = netgap()
        .args(["run", "multistream", "--hosts", &hosts, "-P", "2"])
        .args(["--reps", "1", "--duration", "1s", "--json"])
        .arg(&json)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let records = common::read_records(&json);
    let gbps = records[0]["value"].as_f64().expect("value");
    assert!(gbps > 0.0 && gbps <= 0.2 * 1.1, "{gbps} Gbit/s against 0.2");
}

#[test]
fn max_rate_bounds_what_an_agent_moves_over_time_point_to_point_and_over_the_flow_engine() {
    // At --max-rate 1 every byte an agent sends or receives is charged to
    // one budget: a point-to-point stream's repetitions (which once ran
    // back to back at the path's speed, the limit capping only each
    // repetition's bytes) and a udp hotspot over the flow engine both stay
    // within 1 Gbit/s, plus 5% for the budget's burst and timing.
    const LIMIT_GBPS: f64 = 1.0 * 1.05;
    let flags = ["--max-rate", "1"];
    let agents = [
        Agent::start_with("127.0.0.2", &flags),
        Agent::start_with("127.0.0.3", &flags),
    ];
    let dir = tempfile::tempdir().expect("tempdir");
    let json = dir.path().join("stream.jsonl");
    // 3 repetitions of 160 MB: 1.3 s each at the limit.
    let out = netgap()
        .args(["run", "stream", "--peer", &agents[0].addr, "-s", "64K"])
        .args(["--reps", "3", "-n", "2500", "--json"])
        .arg(&json)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let record = &common::read_records(&json)[0];
    let reps = record["stats"]["reps"].as_array().expect("reps");
    assert_eq!(reps.len(), 3);
    for gbps in reps {
        let gbps = gbps.as_f64().expect("a repetition's Gbit/s");
        assert!(
            gbps > 0.0 && gbps <= LIMIT_GBPS,
            "stream ran at {gbps} Gbit/s"
        );
    }
    // Flow-engine udp flows, both agents paced: the server's bytes, both
    // ways, over the run's warm-up (a fifth of its window) and window.
    let json = dir.path().join("hotspot.jsonl");
    let hosts = format!("{},{}", agents[0].addr, agents[1].addr);
    let out = netgap()
        .args(["run", "hotspot", "-t", "udp", "--hosts", &hosts])
        .args(["--clients", "8", "-s", "16K", "--reps", "1"])
        .args(["--duration", "2s", "--json"])
        .arg(&json)
        .output()
        .expect("run");
    assert!(out.status.success(), "{out:?}");
    let record = &common::read_records(&json)[0];
    let bytes = |k: &str| record["bytes"][k].as_u64().expect("a byte count") as f64;
    let span_s = 2.0 * 1.2;
    for end in ["server", "client"] {
        let moved = bytes(&format!("{end}_tx")) + bytes(&format!("{end}_rx"));
        let gbps = moved * 8.0 / span_s / 1e9;
        // Moving nothing would pass the bound too: the run did work.
        assert!(moved > 1e6, "the {end} moved {moved} bytes");
        assert!(gbps <= LIMIT_GBPS, "the hotspot {end} moved {gbps} Gbit/s");
    }
}

#[test]
fn max_duration_stops_a_point_to_point_repetition_that_runs_past_it() {
    // A repetition of many iterations would run for tens of seconds; an
    // agent whose longest run is 1 s ends its flow at 1.5 s and says why,
    // for every test that streams or exchanges and over every transport:
    // a socket's shutdown, an shm ring's abort flag, a udp flow's flag.
    // The agent admits a run of at most --max-rate for --max-duration
    // (at the default 400 Gbit/s, 50 GB in 1 s: shm moves that in about
    // 1.5 s on a quiet machine, as fast as the limit ends it). A higher
    // rate admits runs that take many seconds over every transport.
    let agent = Agent::start_with("127.0.0.1", &["--max-duration", "1s", "--max-rate", "4000"]);
    for transport in ["tcp", "unix", "udp", "shm", "uring"] {
        // Sizes and counts that run several seconds unstopped even where
        // the path is fastest (udp carries one datagram per message).
        let (size, iterations) = match transport {
            "udp" => ("16K", "3000000"),
            _ => ("64K", "5000000"),
        };
        for test in ["stream", "pingpong"] {
            let started = Instant::now();
            let out = netgap()
                .args(["run", test, "-t", transport, "-s", size])
                .args(["--peer", &agent.addr, "--reps", "1", "-n", iterations])
                .output()
                .expect("run");
            let took = started.elapsed();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{test} {transport}: {stderr}");
            assert!(
                stderr.contains("ran past its longest run (1s)"),
                "{test} {transport}: {stderr}"
            );
            // 1 s, the 0.5 s grace, and the run's own start (handshake,
            // setup, warm-up) on a busy machine.
            assert!(
                took < Duration::from_millis(3500),
                "{test} {transport} ran {took:?}"
            );
        }
    }
}

/// `netgap serve ARGS` must fail before it listens, with one line on
/// standard error holding every one of `needles`.
fn serve_refuses(args: &[&str], needles: &[&str]) {
    let out = netgap()
        .args(["serve", "--bind", "127.0.0.1", "--port", "0"])
        .args(args)
        .output()
        .expect("netgap serve runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{args:?} should be refused");
    assert!(
        !String::from_utf8_lossy(&out.stdout).contains("listening"),
        "{args:?}"
    );
    assert_eq!(stderr.trim_end().lines().count(), 1, "{args:?}: {stderr}");
    for n in needles {
        assert!(stderr.contains(n), "{args:?}: {stderr:?} lacks {n:?}");
    }
}

#[test]
fn an_agent_refuses_a_run_directory_another_user_planted_and_touches_nothing_through_it() {
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } != 0 {
        common::skip(
            "an_agent_refuses_a_run_directory_another_user_planted_and_touches_nothing_through_it",
            "the planted directory needs root to give it to another user",
        );
        return;
    }
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let tmp = tempfile::tempdir().expect("tempdir");
    // A root-only file and a root-only directory with a file in it.
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, b"root's own\n").expect("secret");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let private = tmp.path().join("private");
    std::fs::create_dir(&private).expect("private");
    std::fs::write(private.join("f0.bin"), b"private").expect("private file");
    std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    // Another user made the base first, with links to both in it, named
    // as the agent's files would be.
    let planted = tmp.path().join("planted");
    std::fs::create_dir(&planted).expect("planted");
    std::os::unix::fs::symlink(&secret, planted.join("nginx.conf")).expect("link");
    std::os::unix::fs::symlink(&private, planted.join("www")).expect("link");
    std::os::unix::fs::symlink(&secret, planted.join(format!("agent-{}-0", u32::MAX)))
        .expect("link");
    std::os::unix::fs::chown(&planted, Some(65534), Some(65534)).expect("chown");
    let planted_arg = planted.to_str().expect("utf8");
    serve_refuses(
        &["--allow-services", "--run-dir", planted_arg],
        &[
            &format!("refusing {planted_arg} as the agent's run directory base"),
            "owned by uid 65534, not by the user netgap runs as (uid 0)",
            "--run-dir DIR",
        ],
    );
    // Root's, but writable by every user; and a link to a good directory.
    let open = tmp.path().join("open");
    std::fs::create_dir(&open).expect("open");
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
    serve_refuses(
        &[
            "--allow-services",
            "--run-dir",
            open.to_str().expect("utf8"),
        ],
        &["writable by every user"],
    );
    let good = tmp.path().join("good");
    std::fs::create_dir(&good).expect("good");
    let link = tmp.path().join("link");
    std::os::unix::fs::symlink(&good, &link).expect("link");
    serve_refuses(
        &[
            "--allow-services",
            "--run-dir",
            link.to_str().expect("utf8"),
        ],
        &["symbolic link"],
    );
    // Nothing was written, moved or opened up through the links.
    assert_eq!(std::fs::read(&secret).expect("secret"), b"root's own\n");
    let m = std::fs::metadata(&secret).expect("secret");
    assert_eq!((m.mode() & 0o7777, m.uid()), (0o600, 0));
    let m = std::fs::metadata(&private).expect("private");
    assert_eq!(m.mode() & 0o7777, 0o700);
    assert_eq!(
        std::fs::read_dir(&private).expect("private").count(),
        1,
        "nothing added"
    );
    let names: Vec<_> = std::fs::read_dir(&planted)
        .expect("planted")
        .map(|e| e.expect("entry").file_name())
        .collect();
    assert_eq!(names.len(), 3, "{names:?}");
    assert!(std::fs::read_dir(&good).expect("good").next().is_none());

    // A base of the agent's own: made 0711, and what a dead agent left in
    // it removed at start without following its links out.
    let base = tmp.path().join("runs");
    std::fs::create_dir(&base).expect("base");
    let dead = base.join("agent-4194999-1");
    std::fs::create_dir(&dead).expect("dead");
    std::os::unix::fs::symlink(&private, dead.join("www")).expect("link");
    std::os::unix::fs::symlink(&secret, dead.join("nginx.conf")).expect("link");
    let agent = Agent::start_with(
        "127.0.0.1",
        &[
            "--allow-services",
            "--run-dir",
            base.to_str().expect("utf8"),
        ],
    );
    assert!(!dead.exists(), "the dead agent's directory was swept");
    assert_eq!(std::fs::read(&secret).expect("secret"), b"root's own\n");
    assert_eq!(std::fs::read_dir(&private).expect("private").count(), 1);
    drop(agent);
}
