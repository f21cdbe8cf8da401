//! The data connection's proof on hostile input: whatever a far end sends
//! as its answer, hello or confirmation, nothing panics and nothing
//! without the point's token passes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::dataproof::{ConnectorProof, DataToken, ListenerProof, HELLO_BYTES};

fuzz_target!(|data: &[u8]| {
    let token = DataToken::from_bytes([9; 32]);
    let connector = ConnectorProof::new(token.clone(), [1; 16]);
    assert!(connector.on_answer(data).is_err(), "a forged answer passed");
    let mut listener = ListenerProof::new(token, [2; 16]);
    let (hello, confirm) = data.split_at(data.len().min(HELLO_BYTES));
    let _ = listener.on_hello(hello);
    assert!(
        listener.on_confirm(confirm).is_err(),
        "a forged confirmation passed"
    );
    if let Ok(s) = std::str::from_utf8(data) {
        let _ = DataToken::try_from(s.to_string());
    }
});
