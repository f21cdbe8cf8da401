//! The engine's flows with a session token: every connection and every
//! udp flow proves it before payload, and flows aimed at a stranger send
//! it none.

use super::*;

/// A configuration whose connections prove `token` before payload.
fn proven(workers: usize, io_timeout_ms: u64, token: u8) -> EngineConfig {
    EngineConfig {
        token: Some(netgap_proto::dataproof::DataToken::from_bytes([token; 32])),
        ..cfg(workers, io_timeout_ms)
    }
}

#[test]
fn paced_setup_opens_more_flows_than_its_window_each_proven_and_every_byte_accounted() {
    let flows = 3 * super::setup::CONNECT_WINDOW + 7;
    let work = FlowWork::PingPong { size_bytes: 8 };
    let server = FlowServer::bind(loopback(), work, proven(2, 5_000, 1)).unwrap();
    let clients = prepare_clients(
        &spec(server.local_addr(), flows, work),
        &proven(2, 5_000, 1),
    )
    .unwrap();
    // Every one of the flows must finish a round trip in the window: a
    // second, so a loaded machine that descheduled both workers for a
    // while does not fail it.
    let report = clients
        .run(Duration::from_millis(20), Duration::from_secs(1))
        .unwrap();
    let totals = server.stop().unwrap();
    assert_eq!(report.flows.len(), flows);
    assert!(report.flows.iter().all(|f| f.round_trips > 0));
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    let rx: u64 = report.flows.iter().map(|f| f.bytes_rx).sum();
    // The proof's bytes are not payload: both sides count payload only.
    assert_eq!(totals.bytes_rx, tx);
    assert_eq!(totals.bytes_tx, rx);
    assert_eq!(totals.connections_accepted, flows as u64);
    assert_eq!((totals.errors, totals.strangers), (0, 0));
}

#[test]
fn connect_mode_proves_every_connection_and_balances_bytes() {
    let work = FlowWork::Connect {
        request_bytes: 10,
        reply_bytes: 20,
    };
    let server = FlowServer::bind(loopback(), work, proven(1, 5_000, 2)).unwrap();
    let clients =
        prepare_clients(&spec(server.local_addr(), 8, work), &proven(1, 5_000, 2)).unwrap();
    let report = clients
        .run(Duration::ZERO, Duration::from_millis(200))
        .unwrap();
    let totals = server.stop().unwrap();
    let done: u64 = report.flows.iter().map(|f| f.round_trips).sum();
    assert!(done > 0);
    assert!(report.flows.iter().all(|f| f.errors == 0));
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    assert_eq!(totals.bytes_rx, tx);
    assert_eq!(tx % 10, 0);
    assert_eq!(totals.strangers, 0);
}

/// A plain TCP sink that is no netgap end: accepts everything, answers
/// nothing, and tells how many bytes each connection sent it.
fn sink() -> (SocketAddr, std::sync::mpsc::Receiver<usize>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for s in l.incoming() {
            let Ok(mut s) = s else { return };
            let tx = tx.clone();
            std::thread::spawn(move || {
                use std::io::Read;
                let _ = s.set_read_timeout(Some(Duration::from_millis(1_500)));
                let mut got = 0;
                let mut buf = [0u8; 4096];
                while let Ok(n) = s.read(&mut buf) {
                    if n == 0 {
                        break;
                    }
                    got += n;
                }
                let _ = tx.send(got);
            });
        }
    });
    (addr, rx)
}

#[test]
fn hotspot_flows_aimed_at_a_plain_sink_send_no_payload_byte() {
    use netgap_proto::dataproof::HELLO_BYTES;
    let (target, got) = sink();
    let work = FlowWork::PingPong { size_bytes: 1000 };
    let e = prepare_clients(&spec(target, 3, work), &proven(1, 500, 3))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("did not prove") && e.contains("no payload"),
        "{e}"
    );
    // Prepare gave up, so nothing runs; each connection the sink saw got
    // the hello and nothing else.
    let mut seen = 0;
    while let Ok(n) = got.recv_timeout(Duration::from_secs(3)) {
        assert!(n <= HELLO_BYTES, "a connection sent {n} bytes");
        seen += 1;
        if seen == 3 {
            break;
        }
    }
    assert!(seen >= 1);
}

#[test]
fn connect_flows_aimed_at_a_plain_sink_send_no_request_byte() {
    use netgap_proto::dataproof::HELLO_BYTES;
    let (target, got) = sink();
    let work = FlowWork::Connect {
        request_bytes: 1000,
        reply_bytes: 1,
    };
    let clients = prepare_clients(&spec(target, 2, work), &proven(1, 300, 4)).unwrap();
    let r = clients.run(Duration::ZERO, Duration::from_millis(200));
    assert!(
        matches!(r, Err(EngineError::AllFlowsFailed { .. })),
        "{r:?}"
    );
    let mut seen = 0;
    while let Ok(n) = got.recv_timeout(Duration::from_secs(3)) {
        assert!(n <= HELLO_BYTES, "a connection sent {n} bytes");
        seen += 1;
        if seen == 2 {
            break;
        }
    }
    assert!(seen >= 1);
}

#[test]
fn a_server_with_a_token_serves_strangers_nothing_and_counts_them() {
    use std::io::{Read, Write};
    let work = FlowWork::PingPong { size_bytes: 4 };
    let server = FlowServer::bind(loopback(), work, proven(1, 5_000, 5)).unwrap();
    // A stranger speaking pingpong without the proof.
    let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
    s.write_all(&[
        1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20,
    ])
    .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(3))).unwrap();
    let mut buf = [0u8; 64];
    let n = s.read(&mut buf).unwrap_or(0);
    assert_eq!(n, 0, "a stranger got {n} bytes back");
    // Another session's client is refused too.
    let e = prepare_clients(&spec(server.local_addr(), 1, work), &proven(1, 1_000, 6))
        .unwrap_err()
        .to_string();
    assert!(e.contains("does not belong"), "{e}");
    let totals = server.stop().unwrap();
    assert_eq!(totals.strangers, 2);
    assert_eq!(totals.bytes_tx, 0);
}

#[test]
fn a_silent_stranger_is_dropped_within_the_io_timeout() {
    use std::io::Read;
    let work = FlowWork::PingPong { size_bytes: 4 };
    let server = FlowServer::bind(loopback(), work, proven(1, 300, 7)).unwrap();
    let mut s = std::net::TcpStream::connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let t0 = Instant::now();
    let mut buf = [0u8; 8];
    // The server closes it: end of stream (or a reset), not a timeout.
    let r = s.read(&mut buf);
    assert!(matches!(r, Ok(0)) || r.is_err(), "{r:?}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    assert_eq!(server.open_connections(), 0);
    let totals = server.stop().unwrap();
    assert_eq!(totals.strangers, 1);
}

/// The engine over the udp data path with the session token `token`.
fn proven_udp(mode: Mode, workers: usize, io_timeout_ms: u64, token: u8) -> EngineConfig {
    EngineConfig {
        token: Some(netgap_proto::dataproof::DataToken::from_bytes([token; 32])),
        ..udp_cfg(mode, workers, io_timeout_ms)
    }
}

#[test]
fn udp_flows_with_a_token_prove_it_and_balance_bytes() {
    // The opening is the same in both modes; event mode spares the shared
    // machine two spinning workers.
    let c = proven_udp(Mode::Event, 2, 5_000, 8);
    let work = FlowWork::PingPong { size_bytes: 1 };
    let server = FlowServer::bind(loopback(), work, c.clone()).unwrap();
    let report = prepare_clients(&spec(server.local_addr(), 12, work), &c)
        .unwrap()
        .run(Duration::from_millis(20), Duration::from_millis(200))
        .unwrap();
    let totals = server.stop().unwrap();
    assert!(report.flows.iter().all(|f| f.round_trips > 0));
    let tx: u64 = report.flows.iter().map(|f| f.bytes_tx).sum();
    let rx: u64 = report.flows.iter().map(|f| f.bytes_rx).sum();
    // The proof's bytes are not payload: both ends count payload only.
    assert_eq!((totals.bytes_rx, totals.bytes_tx), (tx, rx));
    assert_eq!(totals.connections_accepted, 12);
    assert_eq!((totals.errors, totals.strangers), (0, 0));
}

/// A plain UDP sink that is no netgap end: answers nothing and hands over
/// every datagram it got once `quiet` passes without one.
fn udp_sink(quiet: Duration) -> (SocketAddr, std::thread::JoinHandle<Vec<Vec<u8>>>) {
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.set_read_timeout(Some(quiet)).unwrap();
    let addr = s.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let mut got = Vec::new();
        let mut buf = [0u8; 65536];
        while let Ok(n) = s.recv(&mut buf) {
            got.push(buf[..n].to_vec());
        }
        got
    });
    (addr, h)
}

#[test]
fn udp_flows_aimed_at_a_plain_udp_sink_send_it_hellos_and_no_payload_byte() {
    use crate::udp::{Header, Kind, HEADER_BYTES};
    use netgap_proto::dataproof::DATAGRAM_HELLO_BYTES;
    let (target, sink) = udp_sink(Duration::from_millis(800));
    let work = FlowWork::PingPong { size_bytes: 1000 };
    let t0 = Instant::now();
    let e = prepare_clients(&spec(target, 2, work), &proven_udp(Mode::Event, 1, 300, 3))
        .unwrap_err()
        .to_string();
    assert!(t0.elapsed() < Duration::from_secs(2), "{:?}", t0.elapsed());
    assert!(
        e.contains(&target.to_string())
            && e.contains("did not prove it belongs to this session")
            && e.contains("no payload was sent"),
        "{e}"
    );
    assert_eq!(e.lines().count(), 1);
    let got = sink.join().unwrap();
    assert!(!got.is_empty());
    for d in &got {
        assert_eq!(d.len(), HEADER_BYTES + DATAGRAM_HELLO_BYTES);
        assert_eq!(Header::decode(d).unwrap().kind, Kind::Hello);
    }
}

#[test]
fn a_udp_server_of_another_session_is_refused_and_serves_nothing() {
    let work = FlowWork::PingPong { size_bytes: 4 };
    let server = FlowServer::bind(loopback(), work, proven_udp(Mode::Event, 1, 5_000, 1)).unwrap();
    let e = prepare_clients(
        &spec(server.local_addr(), 1, work),
        &proven_udp(Mode::Event, 1, 300, 2),
    )
    .unwrap_err()
    .to_string();
    assert!(
        e.contains("did not prove it belongs to this session (it answered with the proof of another session); no payload was sent"),
        "{e}"
    );
    // A client without the token at all: its bare hellos are not answered.
    let e = prepare_clients(
        &spec(server.local_addr(), 1, work),
        &udp_cfg(Mode::Event, 1, 300),
    )
    .unwrap_err()
    .to_string();
    assert!(e.contains("hellos"), "{e}");
    let totals = server.stop().unwrap();
    assert_eq!(totals.connections_accepted, 0);
    assert_eq!((totals.bytes_rx, totals.bytes_tx), (0, 0));
    assert!(totals.strangers > 0, "{totals:?}");
}

#[test]
fn a_proven_udp_server_answers_no_datagram_of_a_stranger() {
    use crate::udp::{Header, Kind, HEADER_BYTES};
    let work = FlowWork::PingPong { size_bytes: 4 };
    let server = FlowServer::bind(loopback(), work, proven_udp(Mode::Event, 1, 5_000, 1)).unwrap();
    let s = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    s.connect(server.local_addr()).unwrap();
    s.set_read_timeout(Some(Duration::from_millis(300)))
        .unwrap();
    let mut request = Header {
        kind: Kind::Data,
        flags: 0,
        seq: 0,
        offset_bytes: 0,
    }
    .encode()
    .to_vec();
    request.extend_from_slice(&[1, 2, 3, 4]);
    let mut confirm = Header::control(Kind::Confirm).encode().to_vec();
    confirm.extend_from_slice(&[0; 48]);
    for d in [
        &request[..],
        &Header::control(Kind::Hello).encode()[..],
        &confirm[..],
        &request[..],
    ] {
        s.send(d).unwrap();
    }
    let mut buf = [0u8; 128];
    let r = s.recv(&mut buf);
    assert!(r.is_err(), "a stranger got an answer: {r:?}");
    let totals = server.stop().unwrap();
    assert_eq!(totals.strangers, 4);
    assert_eq!((totals.bytes_rx, totals.bytes_tx), (0, 0));
    assert_eq!(HEADER_BYTES + 4, request.len());
}

#[test]
fn a_udp_flow_proves_the_session_through_loss_of_each_opening_datagram() {
    use crate::udp::{Header, Kind};
    use std::collections::HashSet;
    let work = FlowWork::PingPong { size_bytes: 2 };
    let c = proven_udp(Mode::Event, 1, 3_000, 4);
    let server = FlowServer::bind(loopback(), work, c.clone()).unwrap();
    let upstream = server.local_addr();
    // A relay between one flow and the server that drops the first
    // datagram of each kind, either way.
    let relay = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let toward = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    toward.connect(upstream).unwrap();
    let target = relay.local_addr().unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flag = std::sync::Arc::clone(&stop);
    let relayed = std::thread::spawn(move || {
        relay.set_nonblocking(true).unwrap();
        toward.set_nonblocking(true).unwrap();
        let mut dropped = HashSet::new();
        let mut client = None;
        let mut buf = [0u8; 256];
        while !flag.load(std::sync::atomic::Ordering::Relaxed) {
            let mut idle = true;
            if let Ok((n, from)) = relay.recv_from(&mut buf) {
                idle = false;
                client = Some(from);
                let kind = Header::decode(&buf[..n]).unwrap().kind;
                if !dropped.insert(("up", kind as u8)) {
                    toward.send(&buf[..n]).unwrap();
                }
            }
            if let (Ok(n), Some(to)) = (toward.recv(&mut buf), client) {
                idle = false;
                let kind = Header::decode(&buf[..n]).unwrap().kind;
                if !dropped.insert(("down", kind as u8)) {
                    relay.send_to(&buf[..n], to).unwrap();
                }
            }
            if idle {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        dropped
    });
    // The first data datagram each way is lost and sent again on its
    // timer: a window of a second, so a loaded machine that descheduled
    // the relay's thread or a worker for a while still sees a round trip.
    let report = prepare_clients(&spec(target, 1, work), &c)
        .unwrap()
        .run(Duration::ZERO, Duration::from_secs(1))
        .unwrap();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let dropped = relayed.join().unwrap();
    for way_kind in [
        ("up", Kind::Hello as u8),
        ("down", Kind::HelloAck as u8),
        ("up", Kind::Confirm as u8),
        ("down", Kind::ConfirmAck as u8),
        ("up", Kind::Data as u8),
        ("down", Kind::Data as u8),
    ] {
        assert!(dropped.contains(&way_kind), "{way_kind:?} never dropped");
    }
    let totals = server.stop().unwrap();
    let f = &report.flows[0];
    assert!(f.round_trips > 0);
    assert_eq!((totals.bytes_rx, totals.bytes_tx), (f.bytes_tx, f.bytes_rx));
    assert_eq!(totals.connections_accepted, 1);
    assert_eq!(totals.strangers, 0);
}
