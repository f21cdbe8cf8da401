//! A frame's payload decoded as a request (what an agent reads) and as a
//! reply (what a coordinator reads), then fed to the session machines in
//! every state a peer can drive them to: the agent's first and second
//! request, and the coordinator's handshake and the steps of a client role
//! it placed on an agent. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_core::host::HostFacts;
use netgap_core::spec::{Mode, PointSpec, TransportOptions};
use netgap_proto::codec::{decode_reply, decode_request};
use netgap_proto::dataproof::DataToken;
use netgap_proto::message::{Phase, Reply, PROTOCOL_VERSION};
use netgap_proto::session::{AgentSession, CoordinatorSession};

/// A coordinator past its handshake.
fn welcomed() -> CoordinatorSession {
    let mut coord = CoordinatorSession::new();
    let _ = coord.hello();
    let _ = coord.on_welcome(Reply::Welcome {
        protocol: PROTOCOL_VERSION,
        version: String::new(),
        host: HostFacts::default(),
    });
    coord
}

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode_request(data) {
        let mut agent = AgentSession::new(HostFacts::default(), false);
        let _ = agent.on_request(&req);
        let _ = agent.on_request(&req);
    }
    if let Ok(reply) = decode_reply(data) {
        let mut coord = CoordinatorSession::new();
        let _ = coord.hello();
        let _ = coord.on_welcome(reply.clone());
        // The client role's answers, in each step that waits for one.
        let spec = PointSpec {
            test: "pingpong".into(),
            transport: "tcp".into(),
            mode: Mode::Event,
            size_bytes: 64,
            options: TransportOptions::default(),
            server_cpu: None,
            io_timeout_ms: 1000,
            verify: false,
        };
        let token = DataToken::from_bytes([7; 32]);
        let mut coord = welcomed();
        let _ = coord.client_open(spec.clone(), token.clone(), "10.0.0.1:40000".into(), None);
        let _ = coord.on_client_connected(reply.clone());
        let mut coord = welcomed();
        let _ = coord.client_open(spec, token, "10.0.0.1:40000".into(), Some(0));
        let _ = coord.on_client_connected(Reply::ClientConnected {
            path_choices: Vec::new(),
        });
        let _ = coord.client_run(1, Phase::Measure);
        let _ = coord.on_client_result(reply);
    }
});
