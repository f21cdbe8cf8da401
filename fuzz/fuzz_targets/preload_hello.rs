//! The preload library's setup exchange on hostile input: whatever bytes
//! arrive first on a connection, the listener's checks (`could_be_hello`,
//! `Hello::decode`) and the connector's (`could_be_answer`,
//! `Answer::decode`) never panic; a hello that decodes names a positive
//! pid, a descriptor number and a power-of-two ring within the bounds, and
//! encodes back to the same bytes; an answer that decodes encodes back to
//! bytes that decode to it again.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::preload::{
    could_be_answer, could_be_hello, Answer, Hello, HELLO_BYTES, MAX_RING_BYTES, MIN_RING_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let _ = could_be_hello(data);
    let _ = could_be_answer(data);
    if let Ok(h) = Hello::decode(data) {
        assert!(h.pid > 0);
        assert!(i32::try_from(h.fd).is_ok());
        assert!(h.ring_bytes.is_power_of_two());
        assert!((MIN_RING_BYTES..=MAX_RING_BYTES).contains(&h.ring_bytes));
        assert_eq!(&h.encode()[..], &data[..HELLO_BYTES]);
        assert!(could_be_hello(data));
    }
    if let Ok(a) = Answer::decode(data) {
        assert_eq!(Answer::decode(&a.encode()), Ok(a));
    }
});
