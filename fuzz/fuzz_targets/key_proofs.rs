//! The shared-key handshake on hostile input: arbitrary payloads parsed as
//! auth frames and fed, in sequence, to an agent's and a coordinator's
//! handshake. Nothing may panic, and no payload that does not carry the
//! key's tag may pass either side.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::auth::{AgentHandshake, AuthFrame, CoordinatorHandshake, Key};

fuzz_target!(|data: &[u8]| {
    let Ok(key) = Key::from_bytes(vec![7; 32]) else {
        return;
    };
    let _ = AuthFrame::parse(data);
    // Up to three frames, split at NUL-free boundaries chosen by the input.
    let mut agent = AgentHandshake::new(key.clone(), [1; 32]);
    let mut coord = CoordinatorHandshake::new(key, [2; 32]);
    for frame in data.split(|&b| b == 0xff).take(3) {
        if let Ok(Some(_)) = agent.on_frame(frame) {
            // Only a response tagged with the key passes, which random
            // input cannot make.
            panic!("the agent accepted a forged response");
        }
        let _ = coord.on_challenge(frame);
        if coord.on_proof(frame).is_ok() {
            panic!("the coordinator accepted a forged proof");
        }
    }
});
