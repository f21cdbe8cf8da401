//! Both session machines driven in memory, through the codec.

use super::*;
use crate::codec::{decode_reply, decode_request, encode, FrameDecoder};
use crate::dataproof::test_token;
use crate::message::{ClientRep, Phase, PROTOCOL_VERSION};
use netgap_core::cpu::CpuUsage;
use netgap_core::datagram::DatagramStats;
use netgap_core::host::HostFacts;
use netgap_core::spec::PointSpec;
use netgap_core::spec::{Mode, TransportOptions};

fn host() -> HostFacts {
    HostFacts {
        hostname: "agent-1".into(),
        kernel: "6.8.0".into(),
        cpu_model: "Test CPU".into(),
        cores: 16,
        interface: Some("eth0".into()),
        mtu_bytes: Some(9000),
        sysctls: Default::default(),
        netgap_version: netgap_core::VERSION.into(),
        offloads: None,
        qdisc: None,
    }
}

fn spec() -> PointSpec {
    PointSpec {
        test: "stream".into(),
        transport: "unix".into(),
        mode: Mode::Event,
        size_bytes: 4096,
        options: TransportOptions::default(),
        server_cpu: None,
        io_timeout_ms: 1000,
        verify: false,
    }
}

/// Sends a request over an in-memory wire: encode, push into a decoder in
/// two pieces, take the frame out, decode.
fn wire_request(req: &Request) -> Request {
    let bytes = encode(req).unwrap();
    let mut d = FrameDecoder::new();
    let (a, b) = bytes.split_at(bytes.len() / 2);
    d.push(a);
    assert_eq!(d.next_frame().unwrap(), None);
    d.push(b);
    decode_request(&d.next_frame().unwrap().unwrap()).unwrap()
}

fn wire_reply(reply: &Reply) -> Reply {
    let bytes = encode(reply).unwrap();
    let mut d = FrameDecoder::new();
    d.push(&bytes);
    decode_reply(&d.next_frame().unwrap().unwrap()).unwrap()
}

/// Expects a plain reply and carries it over the wire.
fn reply_of(action: AgentAction) -> Reply {
    match action {
        AgentAction::Reply(r) => wire_reply(&r),
        other => panic!("expected a reply, got {other:?}"),
    }
}

fn handshake(agent: &mut AgentSession, coord: &mut CoordinatorSession) -> HostFacts {
    let hello = wire_request(&coord.hello());
    let reply = reply_of(agent.on_request(&hello).unwrap());
    coord.on_welcome(reply).unwrap()
}

#[test]
fn handshake_through_the_codec() {
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    assert_eq!(handshake(&mut agent, &mut coord), host());
    assert_eq!(agent.state(), AgentState::Idle);
    assert_eq!(coord.state(), CoordinatorState::Idle);
    assert_eq!(agent.coordinator_version(), Some(netgap_core::VERSION));
    assert_eq!(coord.agent_version(), Some(netgap_core::VERSION));
}

#[test]
fn version_mismatch_on_both_sides() {
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    coord.protocol = PROTOCOL_VERSION + 1;
    let hello = wire_request(&coord.hello());
    let action = agent.on_request(&hello).unwrap();
    assert_eq!(
        action,
        AgentAction::ReplyAndClose(Reply::VersionMismatch {
            supported: PROTOCOL_VERSION
        })
    );
    assert_eq!(agent.state(), AgentState::Closed);
    let AgentAction::ReplyAndClose(reply) = action else {
        unreachable!()
    };
    let err = coord.on_welcome(wire_reply(&reply)).unwrap_err();
    assert_eq!(
        err,
        SessionError::VersionMismatch {
            ours: PROTOCOL_VERSION + 1,
            theirs: PROTOCOL_VERSION
        }
    );
    assert_eq!(coord.state(), CoordinatorState::Closed);
    assert_eq!(
        SessionError::VersionMismatch { ours: 1, theirs: 2 }.to_string(),
        "protocol version mismatch: this netgap speaks 1, the agent speaks 2; \
         run the same netgap version on both hosts"
    );
}

#[test]
fn welcome_with_another_version_is_a_mismatch() {
    let mut coord = CoordinatorSession::new();
    coord.hello();
    let err = coord
        .on_welcome(Reply::Welcome {
            protocol: 9,
            version: "9.0.0".into(),
            host: host(),
        })
        .unwrap_err();
    assert_eq!(
        err,
        SessionError::VersionMismatch {
            ours: PROTOCOL_VERSION,
            theirs: 9
        }
    );
}

#[test]
fn busy_agent() {
    let mut agent = AgentSession::new(host(), true);
    let mut coord = CoordinatorSession::new();
    let hello = wire_request(&coord.hello());
    let AgentAction::ReplyAndClose(reply) = agent.on_request(&hello).unwrap() else {
        panic!("busy agent must close");
    };
    assert_eq!(reply, Reply::Busy);
    assert_eq!(agent.state(), AgentState::Closed);
    let err = coord.on_welcome(wire_reply(&reply)).unwrap_err();
    assert_eq!(err, SessionError::Busy);
    assert_eq!(
        err.to_string(),
        "agent is busy running another test; try again when it is done"
    );
}

#[test]
fn workload_round_through_both_machines() {
    use crate::workload::{sample_spec, FlowReport, WorkloadOutcome, WorkloadRole};
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    // Server role: prepare, listening, ready.
    let prep =
        wire_request(&coord.workload_prepare(sample_spec(WorkloadRole::Server), test_token()));
    let AgentAction::PrepareWorkload(spec) = agent.on_request(&prep).unwrap() else {
        panic!("expected PrepareWorkload");
    };
    assert_eq!(spec.role, WorkloadRole::Server);
    assert_eq!(agent.state(), AgentState::WorkloadPreparing);
    let r = wire_reply(
        &agent
            .workload_listening(vec!["127.0.0.1:9".into()])
            .unwrap(),
    );
    assert_eq!(coord.on_workload_listening(r).unwrap(), vec!["127.0.0.1:9"]);
    // Go before ready is refused by the agent.
    let early = agent.on_request(&Request::WorkloadGo);
    assert!(early.is_err());
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    let prep =
        wire_request(&coord.workload_prepare(sample_spec(WorkloadRole::Client), test_token()));
    agent.on_request(&prep).unwrap();
    let r = wire_reply(&agent.workload_ready().unwrap());
    coord.on_workload_ready(r).unwrap();
    assert_eq!(coord.state(), CoordinatorState::WorkloadReady);
    let go = wire_request(&coord.workload_go());
    assert_eq!(agent.on_request(&go).unwrap(), AgentAction::RunWorkload);
    let flows: Vec<FlowReport> = (0..300)
        .map(|i| FlowReport {
            index: i,
            bytes_tx: 1,
            bytes_rx: 2,
            window_bytes_rx: 2,
            round_trips: 0,
            percentiles: None,
            errors: 0,
        })
        .collect();
    let outcome = WorkloadOutcome {
        window_ns: 5,
        cpu: CpuUsage::default(),
        peak_rss_kib: None,
        processes: None,
        bytes_rx: 0,
        bytes_tx: 0,
        datagrams: None,
        metrics: Default::default(),
        services: Vec::new(),
        last_error: None,
        data_window_ns: None,
        evidence: Vec::new(),
    };
    assert_eq!(
        wire_reply(&agent.workload_alive().unwrap()),
        Reply::WorkloadAlive
    );
    assert_eq!(
        coord.on_workload_result(Reply::WorkloadAlive).unwrap(),
        WorkloadProgress::Alive
    );
    let replies = agent
        .workload_finished(flows, vec![[1, 1]; 1500], outcome.clone())
        .unwrap();
    // 300 flows in chunks of 128, 1500 buckets in chunks of 1024, end.
    assert_eq!(replies.len(), 3 + 2 + 1);
    assert_eq!(agent.state(), AgentState::Idle);
    let mut seen = 0;
    for r in replies {
        match coord.on_workload_result(wire_reply(&r)).unwrap() {
            WorkloadProgress::Flows(f) => seen += f.len(),
            WorkloadProgress::Buckets(_) | WorkloadProgress::Alive => {}
            WorkloadProgress::Finished(o) => assert_eq!(*o, outcome),
        }
    }
    assert_eq!(seen, 300);
    assert_eq!(coord.state(), CoordinatorState::Idle);
}

#[test]
fn client_role_round_through_both_machines() {
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    let open =
        wire_request(&coord.client_open(spec(), test_token(), "10.0.0.1:40000".into(), Some(1)));
    let AgentAction::OpenClient {
        spec: s,
        target,
        client_cpu,
    } = agent.on_request(&open).unwrap()
    else {
        panic!("expected OpenClient");
    };
    assert_eq!(
        (s, target.as_str(), client_cpu),
        (spec(), "10.0.0.1:40000", Some(1))
    );
    // A server role's run is refused while the client role opens.
    let mut early = agent.clone();
    assert!(early
        .on_request(&Request::Run {
            iterations: 1,
            phase: Phase::Measure
        })
        .is_err());
    let r = wire_reply(&agent.client_connected(vec!["gso".into()]).unwrap());
    assert_eq!(coord.on_client_connected(r).unwrap(), vec!["gso"]);
    assert_eq!(coord.state(), CoordinatorState::ClientOpen);
    for _ in 0..2 {
        let run = wire_request(&coord.client_run(10, Phase::Measure));
        assert_eq!(
            agent.on_request(&run).unwrap(),
            AgentAction::RunClient {
                iterations: 10,
                phase: Phase::Measure
            }
        );
        let alive = wire_reply(&agent.workload_alive().unwrap());
        assert_eq!(
            coord.on_client_result(alive).unwrap(),
            ClientProgress::Alive
        );
        let rep = ClientRep {
            elapsed_ns: 1000,
            value: 2.5,
            bytes_tx: 40,
            bytes_rx: 40,
            cpu: CpuUsage::default(),
            datagrams: None,
        };
        let replies = agent.client_done(rep, vec![[7, 1]; 1500]).unwrap();
        // 1500 buckets in chunks of 1024, then the end.
        assert_eq!(replies.len(), 3);
        let mut buckets = 0;
        for r in replies {
            match coord.on_client_result(wire_reply(&r)).unwrap() {
                ClientProgress::Buckets(b) => buckets += b.len(),
                ClientProgress::Alive => panic!("alive after the end"),
                ClientProgress::Done(d) => assert_eq!(d, rep),
            }
        }
        assert_eq!(buckets, 1500);
        assert_eq!(agent.state(), AgentState::ClientOpen);
    }
    let close = wire_request(&coord.close());
    assert_eq!(agent.on_request(&close).unwrap(), AgentAction::ClosePoint);
    coord
        .on_closed(wire_reply(&agent.closed().unwrap()))
        .unwrap();
    assert_eq!(agent.state(), AgentState::Idle);
    assert_eq!(coord.state(), CoordinatorState::Idle);
}

#[test]
fn a_client_role_that_cannot_connect_leaves_both_sessions_usable() {
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    let open = wire_request(&coord.client_open(spec(), test_token(), "10.0.0.1:1".into(), None));
    agent.on_request(&open).unwrap();
    let err = wire_reply(&agent.failed("connection refused"));
    assert_eq!(agent.state(), AgentState::Idle);
    assert_eq!(
        coord.on_client_connected(err).unwrap_err(),
        SessionError::Remote("connection refused".into())
    );
    assert_eq!(coord.state(), CoordinatorState::Idle);
    // A failed repetition closes both: the agent dropped the flow.
    let open = wire_request(&coord.client_open(spec(), test_token(), "10.0.0.1:2".into(), None));
    agent.on_request(&open).unwrap();
    coord
        .on_client_connected(wire_reply(&agent.client_connected(Vec::new()).unwrap()))
        .unwrap();
    let run = wire_request(&coord.client_run(1, Phase::Warmup));
    agent.on_request(&run).unwrap();
    let err = wire_reply(&agent.failed("no data moved"));
    assert_eq!(agent.state(), AgentState::Closed);
    assert!(coord.on_client_result(err).is_err());
    assert_eq!(coord.state(), CoordinatorState::Closed);
}

#[test]
fn workload_error_leaves_both_sessions_usable() {
    use crate::workload::{sample_spec, WorkloadRole};
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    let prep =
        wire_request(&coord.workload_prepare(sample_spec(WorkloadRole::Client), test_token()));
    agent.on_request(&prep).unwrap();
    let err = wire_reply(&agent.failed("cannot connect flow 0"));
    assert_eq!(agent.state(), AgentState::Idle);
    assert!(matches!(
        coord.on_workload_ready(err),
        Err(SessionError::Remote(m)) if m.contains("flow 0")
    ));
    assert_eq!(coord.state(), CoordinatorState::Idle);
}

#[test]
fn workload_limits_are_refused_before_the_role_runs() {
    use crate::workload::{sample_spec, WorkloadRole, MAX_WORKLOAD_FLOWS};
    let mut spec = sample_spec(WorkloadRole::Client);
    spec.flows = MAX_WORKLOAD_FLOWS + 1;
    let bytes = encode(&Request::WorkloadPrepare {
        spec,
        data_token: test_token(),
    })
    .unwrap();
    let mut d = FrameDecoder::new();
    d.push(&bytes);
    let err = decode_request(&d.next_frame().unwrap().unwrap()).unwrap_err();
    assert!(err.to_string().contains("flows"), "{err}");
}

#[test]
fn run_before_open_is_refused() {
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    let run = Request::Run {
        iterations: 10,
        phase: Phase::Measure,
    };
    let err = agent.on_request(&wire_request(&run)).unwrap_err();
    assert_eq!(
        err,
        SessionError::Unexpected {
            state: "idle",
            got: "run"
        }
    );
    assert_eq!(agent.state(), AgentState::Closed);
    // The caller sends the error reply, which carries the message.
    let reply = wire_reply(&agent.failed(&err.to_string()));
    assert_eq!(
        reply,
        Reply::Error {
            message: "protocol error: unexpected run message in session state idle".into()
        }
    );
    assert_eq!(agent.state(), AgentState::Closed);
}

#[test]
fn coordinator_misuse_is_reported() {
    let mut coord = CoordinatorSession::new();
    coord.hello();
    coord
        .on_welcome(Reply::Welcome {
            protocol: PROTOCOL_VERSION,
            version: "0.1.0".into(),
            host: host(),
        })
        .unwrap();
    coord.run(10, Phase::Measure);
    let err = coord.on_done(Reply::Accepted).unwrap_err();
    assert_eq!(
        err,
        SessionError::Misuse {
            state: "idle",
            call: "run"
        }
    );
    // Calling the wrong on_* is misuse too.
    let mut coord = CoordinatorSession::new();
    coord.hello();
    assert!(matches!(
        coord.on_listening(Reply::Listening { addr: "x".into() }),
        Err(SessionError::Misuse {
            call: "on_listening",
            ..
        })
    ));
}

#[test]
fn out_of_order_requests_are_refused() {
    let bye_first = AgentSession::new(host(), false).on_request(&Request::Bye);
    assert_eq!(
        bye_first,
        Err(SessionError::Unexpected {
            state: "await_hello",
            got: "bye"
        })
    );
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    let mut twice = agent.clone();
    assert!(matches!(
        twice.on_request(&coord.clone().hello()),
        Err(SessionError::Unexpected { got: "hello", .. })
    ));
    // Open while a point is open.
    agent
        .on_request(&Request::Open {
            spec: spec(),
            data_token: test_token(),
        })
        .unwrap();
    agent.listening("127.0.0.1:1".into()).unwrap();
    agent.accepted().unwrap();
    assert_eq!(
        agent.on_request(&Request::Open {
            spec: spec(),
            data_token: test_token()
        }),
        Err(SessionError::Unexpected {
            state: "open",
            got: "open"
        })
    );
    assert_eq!(agent.state(), AgentState::Closed);
    // Any request is refused once closed.
    assert!(agent.on_request(&Request::Close).is_err());
}

#[test]
fn agent_caller_misuse_is_an_error() {
    let mut agent = AgentSession::new(host(), false);
    assert_eq!(
        agent.accepted(),
        Err(SessionError::Misuse {
            state: "await_hello",
            call: "accepted"
        })
    );
    assert!(agent.listening("x".into()).is_err());
    assert!(agent.role_done(0, 0, CpuUsage::default(), None).is_err());
    assert!(agent.closed().is_err());
    assert_eq!(agent.state(), AgentState::AwaitHello);
}

#[test]
fn failure_before_the_flow_keeps_the_session() {
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);
    let open = wire_request(&coord.open(spec(), test_token()));
    assert!(matches!(
        agent.on_request(&open).unwrap(),
        AgentAction::OpenPoint(_)
    ));
    let reply = wire_reply(&agent.failed("unknown transport \"unix\"\nsecond line"));
    assert_eq!(agent.state(), AgentState::Idle);
    let err = coord.on_listening(reply).unwrap_err();
    assert_eq!(
        err.to_string(),
        "agent error: unknown transport \"unix\"\\nsecond line"
    );
    assert_eq!(coord.state(), CoordinatorState::Idle);
    // Both can go on with another point.
    let open = wire_request(&coord.open(spec(), test_token()));
    assert!(agent.on_request(&open).is_ok());
}

#[test]
fn failure_with_a_flow_closes_the_session() {
    let mut agent = AgentSession::new(host(), false);
    agent
        .on_request(&Request::Hello {
            protocol: PROTOCOL_VERSION,
            version: "x".into(),
        })
        .unwrap();
    agent
        .on_request(&Request::Open {
            spec: spec(),
            data_token: test_token(),
        })
        .unwrap();
    agent.listening("a".into()).unwrap();
    agent.accepted().unwrap();
    agent
        .on_request(&Request::Run {
            iterations: 1,
            phase: Phase::Warmup,
        })
        .unwrap();
    let reply = agent.failed(&"z".repeat(5000));
    assert_eq!(agent.state(), AgentState::Closed);
    assert!(reply.validate().is_ok(), "message is cut to fit");
}

#[test]
fn full_point_lifecycle() {
    let mut agent = AgentSession::new(host(), false);
    let mut coord = CoordinatorSession::new();
    handshake(&mut agent, &mut coord);

    let open = wire_request(&coord.open(spec(), test_token()));
    assert_eq!(
        agent.on_request(&open).unwrap(),
        AgentAction::OpenPoint(spec())
    );
    assert_eq!(agent.state(), AgentState::Opening);
    let reply = wire_reply(&agent.listening("/tmp/netgap.sock".into()).unwrap());
    assert_eq!(agent.state(), AgentState::Listening);
    assert_eq!(coord.on_listening(reply).unwrap(), "/tmp/netgap.sock");
    let reply = wire_reply(&agent.accepted().unwrap());
    assert_eq!(agent.state(), AgentState::Open);
    coord.on_accepted(reply).unwrap();
    assert_eq!(coord.state(), CoordinatorState::Open);

    let phases = [Phase::Warmup, Phase::Measure, Phase::Measure];
    for (i, phase) in phases.into_iter().enumerate() {
        let iterations = 100 * (i as u64 + 1);
        let run = wire_request(&coord.run(iterations, phase));
        assert_eq!(
            agent.on_request(&run).unwrap(),
            AgentAction::RunRole { iterations, phase }
        );
        assert_eq!(agent.state(), AgentState::Running);
        let cpu = CpuUsage {
            system_busy_percent: 6.25,
            process_percent: 50.0,
            cpu_ns: 500,
            wall_ns: 1000,
            softirq_percent: Some(1.5),
        };
        let bytes = iterations * 4096;
        // An unreliable flow's counters travel too; a reliable one has none.
        let datagrams = (i == 1).then_some(DatagramStats {
            datagrams_sent: 7,
            datagrams_received: 9,
            lost: 1,
            lost_bytes: 4096,
            reordered: 1,
            duplicates: 2,
            retries: 3,
            dropped: 5,
        });
        let reply = wire_reply(&agent.role_done(bytes, bytes, cpu, datagrams).unwrap());
        assert_eq!(
            coord.on_done(reply).unwrap(),
            (bytes, bytes, cpu, datagrams)
        );
        assert_eq!(agent.state(), AgentState::Open);
        assert_eq!(coord.state(), CoordinatorState::Open);
    }

    let close = wire_request(&coord.close());
    assert_eq!(agent.on_request(&close).unwrap(), AgentAction::ClosePoint);
    assert_eq!(agent.state(), AgentState::Closing);
    coord
        .on_closed(wire_reply(&agent.closed().unwrap()))
        .unwrap();
    assert_eq!(agent.state(), AgentState::Idle);
    assert_eq!(coord.state(), CoordinatorState::Idle);

    let bye = wire_request(&coord.bye());
    let action = agent.on_request(&bye).unwrap();
    assert_eq!(action, AgentAction::ReplyAndClose(Reply::Closed));
    assert_eq!(agent.state(), AgentState::Closed);
    let AgentAction::ReplyAndClose(reply) = action else {
        unreachable!()
    };
    coord.on_bye_reply(wire_reply(&reply)).unwrap();
    assert_eq!(coord.state(), CoordinatorState::Closed);
}

#[test]
fn wrong_reply_is_unexpected() {
    let mut coord = CoordinatorSession::new();
    coord.hello();
    assert_eq!(
        coord.on_welcome(Reply::Accepted),
        Err(SessionError::Unexpected {
            state: "await_welcome",
            got: "accepted"
        })
    );
    assert_eq!(coord.state(), CoordinatorState::Closed);
    let mut coord = CoordinatorSession::new();
    coord.hello();
    assert_eq!(
        coord.on_welcome(Reply::Error {
            message: "no".into()
        }),
        Err(SessionError::Remote("no".into()))
    );
}

#[test]
fn kinds_match_the_wire_tags() {
    let reqs = [
        Request::Hello {
            protocol: 1,
            version: String::new(),
        },
        Request::Open {
            spec: spec(),
            data_token: test_token(),
        },
        Request::Run {
            iterations: 1,
            phase: Phase::Measure,
        },
        Request::Close,
        Request::Bye,
    ];
    for r in reqs {
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.starts_with(&format!("\"{}\"", r.kind()))
                || json.starts_with(&format!("{{\"{}\"", r.kind())),
            "{json}"
        );
    }
    let replies = [
        Reply::Welcome {
            protocol: 1,
            version: String::new(),
            host: host(),
        },
        Reply::VersionMismatch { supported: 2 },
        Reply::Busy,
        Reply::Listening {
            addr: String::new(),
        },
        Reply::Accepted,
        Reply::Done {
            bytes_rx: 0,
            bytes_tx: 0,
            cpu: CpuUsage::default(),
            datagrams: None,
        },
        Reply::Closed,
        Reply::Error {
            message: String::new(),
        },
    ];
    for r in replies {
        let json = serde_json::to_string(&r).unwrap();
        assert!(
            json.starts_with(&format!("\"{}\"", r.kind()))
                || json.starts_with(&format!("{{\"{}\"", r.kind())),
            "{json}"
        );
    }
}
