//! A frame's payload decoded as a request (what an agent reads) and as a
//! reply (what a coordinator reads), then fed to the session machines in
//! every state a peer can drive them to. Nothing may panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::codec::{decode_reply, decode_request};
use netgap_proto::session::{AgentSession, CoordinatorSession};

fuzz_target!(|data: &[u8]| {
    if let Ok(req) = decode_request(data) {
        let mut agent = AgentSession::new(netgap_core::host::HostFacts::default(), false);
        let _ = agent.on_request(&req);
        let _ = agent.on_request(&req);
    }
    if let Ok(reply) = decode_reply(data) {
        let mut coord = CoordinatorSession::new();
        let _ = coord.hello();
        let _ = coord.on_welcome(reply);
    }
});
