//! In-process loopback tests of the flow engine: real sockets, a real
//! server and real clients in one process.

use super::*;
use netgap_core::spec::Mode;
use std::net::TcpListener;
use std::time::Instant;

mod proven;

fn cfg(workers: usize, io_timeout_ms: u64) -> EngineConfig {
    EngineConfig::tcp(workers, Duration::from_millis(io_timeout_ms))
}

/// The engine's configuration over `transport` in `mode`, `None` (with
/// the reason printed) when the transport cannot run here.
fn cfg_over(transport: &str, mode: Mode, workers: usize) -> Option<EngineConfig> {
    let t = crate::find(transport).unwrap();
    if let Err(why) = t.availability() {
        eprintln!("skipped: {transport} not available here: {why}");
        return None;
    }
    Some(EngineConfig {
        mode,
        path: t.engine_path().unwrap(),
        ..cfg(workers, 5_000)
    })
}

fn loopback() -> SocketAddr {
    "127.0.0.1:0".parse().unwrap()
}

fn spec(target: SocketAddr, flows: usize, work: FlowWork) -> ClientSpec {
    ClientSpec {
        target,
        flows,
        work,
        bind_ip: None,
    }
}

#[test]
fn pingpong_100_flows_account_for_every_byte() {
    let size = 100;
    let work = FlowWork::PingPong { size_bytes: size };
    let server = FlowServer::bind(loopback(), work, cfg(2, 5_000)).unwrap();
    let clients = prepare_clients(&spec(server.local_addr(), 100, work), &cfg(2, 5_000)).unwrap();
    let report = clients
        .run(Duration::from_millis(50), Duration::from_millis(300))
        .unwrap();
    let totals = server.stop().unwrap();

    assert_eq!(report.elapsed_ns, 300_000_000);
    assert_eq!(report.flows.len(), 100);
    let size = size as u64;
    for (i, f) in report.flows.iter().enumerate() {
        assert_eq!(f.index as usize, i);
        assert!(
            f.round_trips > 0,
            "flow {i} made no round trip: {:?}",
            report
                .flows
                .iter()
                .map(|f| (f.round_trips, f.bytes_tx, f.bytes_rx))
                .collect::<Vec<_>>()
        );
        assert_eq!(f.hist.len(), f.round_trips);
        assert_eq!(f.window_bytes_tx, f.round_trips * size);
        assert_eq!(f.window_bytes_rx, f.round_trips * size);
        // Every round trip finished: what went out came back.
        assert_eq!(f.bytes_tx, f.bytes_rx);
        assert_eq!(f.bytes_tx % size, 0);
        assert!(f.bytes_tx >= f.window_bytes_tx);
        assert_eq!(f.errors, 0);
    }
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    let rx: u64 = report.flows.iter().map(|f| f.bytes_rx).sum();
    assert_eq!(totals.bytes_rx, tx);
    assert_eq!(totals.bytes_tx, rx);
    assert_eq!(totals.connections_accepted, 100);
}

#[test]
fn pingpong_over_ipv6_loopback() {
    let Ok(probe) = TcpListener::bind("[::1]:0") else {
        eprintln!("skipping: no IPv6 loopback on this host");
        return;
    };
    drop(probe);
    let work = FlowWork::PingPong { size_bytes: 1 };
    let server = FlowServer::bind("[::1]:0".parse().unwrap(), work, cfg(1, 5_000)).unwrap();
    let clients = prepare_clients(&spec(server.local_addr(), 4, work), &cfg(1, 5_000)).unwrap();
    let report = clients
        .run(Duration::ZERO, Duration::from_millis(100))
        .unwrap();
    let totals = server.stop().unwrap();
    assert!(
        report.flows.iter().all(|f| f.round_trips > 0),
        "{:?} {totals:?}",
        report
            .flows
            .iter()
            .map(|f| (f.round_trips, f.bytes_tx, f.bytes_rx))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        totals.bytes_rx,
        report.flows.iter().map(|f| f.bytes_tx).sum::<u64>()
    );
}

#[test]
fn connect_mode_counts_connections_and_bytes() {
    let work = FlowWork::Connect {
        request_bytes: 32,
        reply_bytes: 200,
    };
    let server = FlowServer::bind(loopback(), work, cfg(2, 5_000)).unwrap();
    let clients = prepare_clients(&spec(server.local_addr(), 20, work), &cfg(2, 5_000)).unwrap();
    let report = clients
        .run(Duration::from_millis(20), Duration::from_millis(300))
        .unwrap();
    let totals = server.stop().unwrap();

    assert_eq!(report.flows.len(), 20);
    for f in &report.flows {
        assert!(
            f.round_trips > 0,
            "flow {} completed no connection",
            f.index
        );
        assert_eq!(f.errors, 0, "flow {}", f.index);
        assert_eq!(f.hist.len(), f.round_trips);
        assert_eq!(f.window_bytes_tx, f.round_trips * 32);
        assert_eq!(f.window_bytes_rx, f.round_trips * 200);
        // Whole connections only: every request had its reply.
        assert_eq!(f.bytes_tx % 32, 0);
        assert_eq!(f.bytes_tx / 32, f.bytes_rx / 200);
    }
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    let rx: u64 = report.flows.iter().map(|f| f.bytes_rx).sum();
    assert_eq!(totals.bytes_rx, tx);
    assert_eq!(totals.bytes_tx, rx);
    // Every connection the server accepted was served and closed by it.
    assert_eq!(totals.connections_accepted, tx / 32);
    assert_eq!(totals.connections_completed, totals.connections_accepted);
    assert_eq!(totals.errors, 0);
}

#[test]
fn connect_mode_with_empty_request_and_reply() {
    let work = FlowWork::Connect {
        request_bytes: 0,
        reply_bytes: 0,
    };
    let server = FlowServer::bind(loopback(), work, cfg(1, 5_000)).unwrap();
    let clients = prepare_clients(&spec(server.local_addr(), 3, work), &cfg(1, 5_000)).unwrap();
    let report = clients
        .run(Duration::ZERO, Duration::from_millis(100))
        .unwrap();
    let totals = server.stop().unwrap();
    assert!(report
        .flows
        .iter()
        .all(|f| f.round_trips > 0 && f.errors == 0));
    assert_eq!(totals.errors, 0);
}

#[test]
fn connect_mode_to_a_closed_port_counts_errors_and_fails_the_run() {
    let target = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let work = FlowWork::Connect {
        request_bytes: 1,
        reply_bytes: 1,
    };
    let clients = prepare_clients(&spec(target, 4, work), &cfg(1, 1_000)).unwrap();
    match clients.run(Duration::ZERO, Duration::from_millis(100)) {
        Err(EngineError::AllFlowsFailed {
            flows,
            errors,
            target: t,
            ..
        }) => {
            assert_eq!(flows, 4);
            assert!(errors >= 4);
            assert_eq!(t, target);
        }
        other => panic!("expected AllFlowsFailed, got {other:?}"),
    }
}

#[test]
fn a_server_that_stops_mid_run_fails_the_run_naming_flow_and_target() {
    let work = FlowWork::PingPong { size_bytes: 8 };
    let server = FlowServer::bind(loopback(), work, cfg(1, 5_000)).unwrap();
    let target = server.local_addr();
    let clients = prepare_clients(&spec(target, 10, work), &cfg(2, 2_000)).unwrap();
    let killer = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        server.stop().unwrap()
    });
    let t0 = Instant::now();
    let err = clients
        .run(Duration::ZERO, Duration::from_secs(30))
        .unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(3),
        "took {:?}",
        t0.elapsed()
    );
    let msg = err.to_string();
    assert!(
        msg.contains("flow ") && msg.contains(&target.to_string()),
        "{msg}"
    );
    killer.join().unwrap();
}

#[test]
fn a_server_that_stops_answering_is_an_error_within_the_io_timeout() {
    // Accepts (by the kernel's backlog) but never reads or answers.
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let target = silent.local_addr().unwrap();
    let work = FlowWork::PingPong { size_bytes: 1 };
    let clients = prepare_clients(&spec(target, 3, work), &cfg(1, 300)).unwrap();
    let t0 = Instant::now();
    let err = clients
        .run(Duration::ZERO, Duration::from_secs(30))
        .unwrap_err();
    assert!(
        t0.elapsed() < Duration::from_secs(2),
        "took {:?}",
        t0.elapsed()
    );
    assert!(
        matches!(err, EngineError::FlowStalled { target: t, .. } if t == target),
        "{err}"
    );
    drop(silent);
}

#[test]
fn nothing_is_sent_before_run() {
    let work = FlowWork::PingPong { size_bytes: 16 };
    let server = FlowServer::bind(loopback(), work, cfg(1, 5_000)).unwrap();
    let clients = prepare_clients(&spec(server.local_addr(), 5, work), &cfg(1, 5_000)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    drop(clients);
    let totals = server.stop().unwrap();
    assert_eq!(totals.connections_accepted, 5);
    assert_eq!(totals.bytes_rx, 0);
}

#[test]
fn bad_parameters_are_refused() {
    let target: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let pp = FlowWork::PingPong { size_bytes: 1 };
    assert!(matches!(
        prepare_clients(&spec(target, 1, pp), &cfg(0, 100)),
        Err(EngineError::Invalid(_))
    ));
    assert!(matches!(
        prepare_clients(&spec(target, 0, pp), &cfg(1, 100)),
        Err(EngineError::Invalid(_))
    ));
    assert!(matches!(
        prepare_clients(&spec(target, 1, pp), &cfg(1, 0)),
        Err(EngineError::Invalid(_))
    ));
    let zero = FlowWork::PingPong { size_bytes: 0 };
    assert!(matches!(
        FlowServer::bind(loopback(), zero, cfg(1, 100)),
        Err(EngineError::Invalid(_))
    ));
    let huge = FlowWork::PingPong {
        size_bytes: MAX_PINGPONG_SIZE_BYTES + 1,
    };
    assert!(matches!(
        prepare_clients(&spec(target, 1, huge), &cfg(1, 100)),
        Err(EngineError::Invalid(_))
    ));
}

#[test]
fn opening_a_pingpong_flow_to_nothing_names_the_flow() {
    let target = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let err = prepare_clients(
        &spec(target, 2, FlowWork::PingPong { size_bytes: 1 }),
        &cfg(1, 500),
    )
    .unwrap_err();
    assert!(
        matches!(err, EngineError::Connect { index: 0, .. }),
        "{err}"
    );
    assert!(err.to_string().contains(&target.to_string()));
}

#[test]
fn a_port_in_use_is_a_bind_error() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let err = FlowServer::bind(
        l.local_addr().unwrap(),
        FlowWork::PingPong { size_bytes: 1 },
        cfg(1, 100),
    )
    .unwrap_err();
    assert!(matches!(err, EngineError::Bind { .. }), "{err}");
}

#[test]
fn flows_bound_to_a_local_address_use_it() {
    let work = FlowWork::Connect {
        request_bytes: 4,
        reply_bytes: 4,
    };
    let server = FlowServer::bind(loopback(), work, cfg(1, 5_000)).unwrap();
    let mut s = spec(server.local_addr(), 3, work);
    s.bind_ip = Some("127.0.0.1".parse().unwrap());
    let report = prepare_clients(&s, &cfg(1, 5_000))
        .unwrap()
        .run(Duration::ZERO, Duration::from_millis(100))
        .unwrap();
    server.stop().unwrap();
    assert!(report
        .flows
        .iter()
        .all(|f| f.round_trips > 0 && f.errors == 0));
}

#[test]
fn an_endless_run_is_refused_not_a_panic() {
    let work = FlowWork::Connect {
        request_bytes: 1,
        reply_bytes: 1,
    };
    let target: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let clients = prepare_clients(&spec(target, 1, work), &cfg(1, 100)).unwrap();
    let err = clients
        .run(Duration::MAX, Duration::from_secs(1))
        .unwrap_err();
    assert!(matches!(err, EngineError::Invalid(_)), "{err}");
}

/// Pingpong and connect flows over every transport the engine carries and
/// in both modes: every byte sent came back, and the server saw them all.
#[test]
fn every_engine_transport_in_both_modes_accounts_for_every_byte() {
    // Long enough that every flow completes a round trip on a loaded
    // 2-CPU machine (150 ms was not): the test checks accounting, not speed.
    const WINDOW: Duration = Duration::from_secs(1);
    for name in ["tcp", "uring"] {
        for mode in Mode::ALL {
            let Some(c) = cfg_over(name, mode, 2) else {
                continue;
            };
            let work = FlowWork::PingPong { size_bytes: 64 };
            let server = FlowServer::bind(loopback(), work, c.clone()).unwrap();
            let report = prepare_clients(&spec(server.local_addr(), 6, work), &c)
                .unwrap()
                .run(Duration::from_millis(20), WINDOW)
                .unwrap();
            let totals = server.stop().unwrap();
            for f in &report.flows {
                assert!(f.round_trips > 0, "{name} {mode}: flow {}", f.index);
                assert_eq!(f.bytes_tx, f.bytes_rx, "{name} {mode}");
                assert_eq!(f.window_bytes_rx, 64 * f.round_trips, "{name} {mode}");
            }
            let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
            assert_eq!(totals.bytes_rx, tx, "{name} {mode}");

            let work = FlowWork::Connect {
                request_bytes: 10,
                reply_bytes: 300,
            };
            let server = FlowServer::bind(loopback(), work, c.clone()).unwrap();
            let report = prepare_clients(&spec(server.local_addr(), 4, work), &c)
                .unwrap()
                .run(Duration::ZERO, WINDOW)
                .unwrap();
            let totals = server.stop().unwrap();
            for f in &report.flows {
                assert!(f.round_trips > 0, "{name} {mode}: flow {}", f.index);
                assert_eq!(f.errors, 0, "{name} {mode}");
                assert_eq!(f.bytes_tx / 10, f.bytes_rx / 300, "{name} {mode}");
            }
            let rx: u64 = report.flows.iter().map(|f| f.bytes_rx).sum();
            assert_eq!(totals.bytes_tx, rx, "{name} {mode}");
        }
    }
}

#[test]
fn options_that_act_per_message_are_refused_in_one_line() {
    let mut c = cfg(1, 100);
    c.options.cork = true;
    c.options.zerocopy = true;
    let e = FlowServer::bind(loopback(), FlowWork::PingPong { size_bytes: 1 }, c)
        .unwrap_err()
        .to_string();
    assert!(e.contains("--zerocopy, --cork"), "{e}");
    assert_eq!(e.lines().count(), 1);
}

/// The engine over the udp data path, `workers` workers in `mode`.
fn udp_cfg(mode: Mode, workers: usize, io_timeout_ms: u64) -> EngineConfig {
    EngineConfig {
        mode,
        path: &DATAGRAMS,
        ..cfg(workers, io_timeout_ms)
    }
}

#[test]
fn udp_pingpong_flows_in_both_modes_balance_bytes_with_the_server() {
    for mode in Mode::ALL {
        let c = udp_cfg(mode, 2, 5_000);
        let work = FlowWork::PingPong { size_bytes: 100 };
        let server = FlowServer::bind(loopback(), work, c.clone()).unwrap();
        let report = prepare_clients(&spec(server.local_addr(), 20, work), &c)
            .unwrap()
            .run(Duration::from_millis(20), Duration::from_millis(200))
            .unwrap();
        let totals = server.stop().unwrap();
        assert_eq!(report.flows.len(), 20);
        let mut client = netgap_core::datagram::DatagramStats::default();
        for (i, f) in report.flows.iter().enumerate() {
            assert_eq!(f.index as usize, i);
            assert!(f.round_trips > 0, "{mode}: flow {i} made no round trip");
            assert_eq!(f.hist.len(), f.round_trips);
            assert_eq!(f.window_bytes_rx, 100 * f.round_trips, "{mode}");
            // Every request had its reply, counted once.
            assert_eq!(f.bytes_tx, f.bytes_rx, "{mode}: flow {i}");
            assert_eq!(f.bytes_tx % 100, 0);
            let d = f.datagrams.expect("a datagram flow has counters");
            d.validate().unwrap();
            assert!(d.datagrams_sent >= f.bytes_tx / 100, "{mode}: {d:?}");
            assert_eq!(
                d.datagrams_received - d.duplicates,
                f.bytes_rx / 100,
                "{mode}: {d:?}"
            );
            client = client.plus(&d);
        }
        let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
        let rx: u64 = report.flows.iter().map(|f| f.bytes_rx).sum();
        assert_eq!(totals.bytes_rx, tx, "{mode}: {totals:?}");
        assert_eq!(totals.bytes_tx, rx, "{mode}: {totals:?}");
        assert_eq!(totals.connections_accepted, 20);
        assert_eq!(totals.errors, 0);
        let server = totals.datagrams.expect("server counters");
        server.validate().unwrap();
        // Each new request once; repeats (spurious re-sends on a loaded
        // machine) are duplicates. Answers to the last repeats may land
        // after their flow finished, unread.
        assert_eq!(
            server.datagrams_received - server.duplicates,
            tx / 100,
            "{mode}"
        );
        assert!(server.datagrams_received <= client.datagrams_sent, "{mode}");
        assert!(server.datagrams_sent >= client.datagrams_received, "{mode}");
        assert_eq!(server.lost, 0);
    }
}

#[test]
fn a_lost_udp_datagram_is_sent_again_not_a_hang() {
    use crate::udp::{Header, Kind, HEADER_BYTES};
    // A hand-made server that drops the first request it gets and the
    // reply to the second, then answers everything.
    let raw = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    raw.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let target = raw.local_addr().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let server = {
        let stop = std::sync::Arc::clone(&stop);
        std::thread::spawn(move || {
            let mut data = 0;
            let mut buf = [0u8; 64];
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let Ok((n, from)) = raw.recv_from(&mut buf) else {
                    continue;
                };
                let h = Header::decode(&buf[..n]).unwrap();
                if h.kind == Kind::Hello {
                    raw.send_to(&Header::control(Kind::HelloAck).encode(), from)
                        .unwrap();
                    continue;
                }
                assert_eq!(n, HEADER_BYTES + 1);
                data += 1;
                if data > 2 {
                    raw.send_to(&buf[..n], from).unwrap();
                }
            }
            data
        })
    };
    let c = udp_cfg(Mode::Event, 1, 2_000);
    let work = FlowWork::PingPong { size_bytes: 1 };
    let t0 = Instant::now();
    let report = prepare_clients(&spec(target, 1, work), &c)
        .unwrap()
        .run(Duration::ZERO, Duration::from_millis(150))
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let server_data = server.join().unwrap();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let f = &report.flows[0];
    let d = f.datagrams.unwrap();
    assert!(f.round_trips > 0);
    assert_eq!(f.bytes_tx, f.bytes_rx);
    assert!(d.retries >= 2, "{d:?}");
    assert_eq!(d.datagrams_sent, server_data);
    // The first round trip waited out two retry timeouts, 20 ms then 40.
    let max_us = f.hist.percentiles_us(1.0).unwrap().max;
    let two_timeouts_us = 3.0 * crate::rto::RETRY_INITIAL.as_micros() as f64;
    assert!(max_us >= 0.99 * two_timeouts_us, "{max_us}");
}

#[test]
fn a_udp_server_that_goes_silent_fails_the_flow_within_the_io_timeout() {
    let c = udp_cfg(Mode::Event, 1, 300);
    let work = FlowWork::PingPong { size_bytes: 1 };
    let server = FlowServer::bind(loopback(), work, c.clone()).unwrap();
    let target = server.local_addr();
    let clients = prepare_clients(&spec(target, 3, work), &c).unwrap();
    // Stopped, its sockets close: requests now meet a closed port, which
    // the kernel reports on the connected sockets.
    server.stop().unwrap();
    let t0 = Instant::now();
    let err = clients
        .run(Duration::ZERO, Duration::from_secs(30))
        .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    let msg = err.to_string();
    assert!(msg.contains(&target.to_string()), "{msg}");
    // No one at all: the hellos go unanswered.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let err = prepare_clients(&spec(silent.local_addr().unwrap(), 1, work), &c).unwrap_err();
    assert!(
        matches!(err, EngineError::Connect { index: 0, .. }) && err.to_string().contains("hellos"),
        "{err}"
    );
}

/// What a server's owner needs to tell clients at work from clients done
/// when they hold no connection: every datagram read, from anyone, is
/// counted, and a datagram path says that its clients may be silent for a
/// whole retry timeout while a lost request waits for its re-send.
#[test]
fn a_udp_server_counts_the_datagrams_it_reads_and_says_how_long_clients_may_be_silent() {
    let work = FlowWork::PingPong { size_bytes: 1 };
    let server = FlowServer::bind(loopback(), work, udp_cfg(Mode::Event, 2, 1_000)).unwrap();
    assert_eq!(server.datagrams_received(), 0);
    assert!(server.longest_client_silence() >= crate::rto::RETRY_MAX);
    let peer = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    // Not netgap's, and data before any hello: read and counted all the
    // same, though never answered.
    for _ in 0..3 {
        peer.send_to(b"not a netgap datagram", server.local_addr())
            .unwrap();
    }
    let t0 = Instant::now();
    while server.datagrams_received() < 3 {
        assert!(t0.elapsed() < Duration::from_secs(5), "datagrams unread");
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(server.datagrams_received(), 3);
    let totals = server.stop().unwrap();
    assert_eq!(totals.errors, 3);
    // Connections show their clients at work while open.
    let tcp = FlowServer::bind(loopback(), work, cfg(1, 1_000)).unwrap();
    assert_eq!(tcp.longest_client_silence(), Duration::ZERO);
    assert_eq!(tcp.datagrams_received(), 0);
    tcp.stop().unwrap();
}

#[test]
fn udp_carries_no_connect_mode_and_no_message_over_one_datagram() {
    let c = udp_cfg(Mode::Event, 1, 100);
    let work = FlowWork::Connect {
        request_bytes: 1,
        reply_bytes: 1,
    };
    let e = FlowServer::bind(loopback(), work, c.clone()).unwrap_err();
    assert!(e.to_string().contains("no connections"), "{e}");
    let huge = FlowWork::PingPong {
        size_bytes: crate::udp::MAX_MESSAGE_BYTES + 1,
    };
    let e = prepare_clients(&spec("127.0.0.1:9".parse().unwrap(), 1, huge), &c).unwrap_err();
    assert!(e.to_string().contains("one udp datagram"), "{e}");
}

/// The regression of a 1-byte hotspot whose every flow took a page: the
/// buffers of either side are a set per worker, whatever the flows, over
/// tcp and udp and in connect mode too. (Each flow held a page-aligned
/// buffer of its own, a page for a 1-byte message, 5.3 KiB per flow of a
/// client agent's memory at 10,000 flows.)
#[test]
fn one_byte_hotspot_flows_take_no_page_each() {
    const FLOWS: usize = 500;
    const WORKERS: u64 = 2;
    let page = crate::buffer::page_bytes() as u64;
    let hotspot = FlowWork::PingPong { size_bytes: 1 };
    let connect = FlowWork::Connect {
        request_bytes: 16,
        reply_bytes: 64,
    };
    let runs = [
        ("tcp", hotspot, cfg(2, 5_000)),
        ("udp", hotspot, udp_cfg(Mode::Event, 2, 5_000)),
        ("connect", connect, cfg(2, 5_000)),
    ];
    for (name, work, c) in runs {
        let server = FlowServer::bind(loopback(), work, c.clone()).unwrap();
        let clients = prepare_clients(&spec(server.local_addr(), FLOWS, work), &c).unwrap();
        let held = clients.buffer_bytes();
        let report = clients
            .run(Duration::from_millis(20), Duration::from_millis(300))
            .unwrap();
        let peak = server.peak_buffer_bytes();
        server.stop().unwrap();
        assert!(report.flows.iter().all(|f| f.bytes_tx > 0), "{name}");
        // A send and a receive buffer per worker, a page each at the
        // default layout.
        assert!(
            held > 0 && held <= 2 * WORKERS * page,
            "{name}: {held} bytes"
        );
        // The server's are too; a flow whose echo a full socket held back
        // would add one of its own, which a 1-byte echo all but never is.
        assert!(
            peak > 0 && peak < FLOWS as u64 * page / 8,
            "{name}: {peak} bytes"
        );
    }
}

/// Echoes that full sockets held back, on flows of one server worker that
/// share its buffers, come back byte for byte on every flow: what waits
/// for the socket is in the flow's own buffer, not the worker's.
#[test]
fn held_back_echoes_come_back_intact_on_every_flow_of_a_worker() {
    use std::io::{Read, Write};
    const SIZE: usize = 1 << 20;
    const FLOWS: usize = 4;
    let work = FlowWork::PingPong { size_bytes: SIZE };
    let mut c = cfg(1, 5_000);
    // Small socket buffers, so an echo the client does not read yet cannot
    // all leave.
    c.options.sndbuf_bytes = Some(16 * 1024);
    let server = FlowServer::bind(loopback(), work, c).unwrap();
    let addr = server.local_addr();
    let flows: Vec<_> = (0..FLOWS)
        .map(|i| {
            std::thread::spawn(move || {
                let socket =
                    socket2::Socket::new(socket2::Domain::IPV4, socket2::Type::STREAM, None)
                        .unwrap();
                socket.set_recv_buffer_size(16 * 1024).unwrap();
                socket.connect(&addr.into()).unwrap();
                let stream: std::net::TcpStream = socket.into();
                stream
                    .set_read_timeout(Some(Duration::from_secs(10)))
                    .unwrap();
                let message: Vec<u8> = (0..SIZE).map(|j| ((j * 7 + i * 13) % 251) as u8).collect();
                let mut writer = stream.try_clone().unwrap();
                let sent = message.clone();
                let w = std::thread::spawn(move || writer.write_all(&sent).unwrap());
                // Read only once the server has had to hold echoes back.
                std::thread::sleep(Duration::from_millis(200));
                let mut back = vec![0u8; SIZE];
                (&stream).read_exact(&mut back).unwrap();
                w.join().unwrap();
                back == message
            })
        })
        .collect();
    for (i, f) in flows.into_iter().enumerate() {
        assert!(
            f.join().unwrap(),
            "flow {i}'s echo differs from what it sent"
        );
    }
    let peak = server.peak_buffer_bytes();
    let totals = server.stop().unwrap();
    let all = (FLOWS * SIZE) as u64;
    assert_eq!((totals.bytes_rx, totals.bytes_tx), (all, all));
    // The worker's receive buffer and at least one flow's own.
    assert!(peak >= 2 * SIZE as u64, "{peak} bytes");
}
