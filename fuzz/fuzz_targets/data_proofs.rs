//! The data connection's proof on hostile input: whatever a far end sends
//! as its answer, hello or confirmation, nothing panics and nothing
//! without the point's token passes; likewise for the datagram variant of
//! udp flows.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::dataproof::{
    ConnectorProof, DataToken, DatagramConnectorProof, DatagramListenerProof, ListenerProof,
    DATAGRAM_HELLO_BYTES, HELLO_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let token = DataToken::from_bytes([9; 32]);
    let connector = ConnectorProof::new(token.clone(), [1; 16]);
    assert!(connector.on_answer(data).is_err(), "a forged answer passed");
    let mut listener = ListenerProof::new(token.clone(), [2; 16]);
    let (hello, confirm) = data.split_at(data.len().min(HELLO_BYTES));
    let _ = listener.on_hello(hello);
    assert!(
        listener.on_confirm(confirm).is_err(),
        "a forged confirmation passed"
    );
    let connector = DatagramConnectorProof::new(token.clone(), [1; 16]);
    assert!(
        connector.on_answer(data).is_err(),
        "a forged datagram answer passed"
    );
    let listener = DatagramListenerProof::new(token, [3; 32]);
    let peer = std::net::SocketAddr::from(([10, 0, 0, 1], 4000));
    let (hello, confirm) = data.split_at(data.len().min(DATAGRAM_HELLO_BYTES));
    if let Ok(answer) = listener.on_hello(peer, hello) {
        assert!(
            answer.len() <= hello.len(),
            "an answer bigger than its hello"
        );
    }
    assert!(
        listener.on_confirm(peer, confirm).is_err(),
        "a forged datagram confirmation passed"
    );
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = DataToken::try_from(s.to_string());
    }
});
