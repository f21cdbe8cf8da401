//! The preload library's setup exchange on hostile input: whatever bytes
//! arrive first on a connection, the listener's checks (`could_be_hello`,
//! `Hello::decode`) and the connector's (`could_be_answer`,
//! `Answer::decode`) never panic; a hello that decodes names a
//! power-of-two ring within the bounds and (same host) a descriptor number
//! that fits a C int, and encodes back to the same bytes; an answer that
//! decodes encodes back to bytes that decode to it again, and a relay's
//! target in it is a valid one. The same bytes as a library's request to
//! its relay (`RelayRequest::decode`, what `netgap relay` reads from any
//! local client) and as a relay's reply: a request that decodes encodes
//! back to the same bytes. And as a UDP probe of another host's connector
//! (`Probe::decode`, what a relay reads from the network) and its answer:
//! each that decodes encodes back to the same bytes, a probe names IP
//! version 4 or 6 and a port above 0. The names the library makes from
//! kernel facts (`beacon_name`, `mailbox_name`) always fit an abstract
//! Unix socket address.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::preload::{
    answer_bytes, beacon_name, could_be_answer, could_be_hello, hello_bytes, mailbox_name,
    valid_target, Answer, Hello, Probe, ProbeAnswer, RelayReply, RelayRequest, MAX_RING_BYTES,
    MIN_RING_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let _ = could_be_hello(data);
    let _ = could_be_answer(data);
    if let Ok(h) = Hello::decode(data) {
        if let Hello::Shm { region_fd, .. } = h {
            assert!(i32::try_from(region_fd).is_ok());
        }
        assert!(h.ring_bytes().is_power_of_two());
        assert!((MIN_RING_BYTES..=MAX_RING_BYTES).contains(&h.ring_bytes()));
        let wire = h.encode();
        assert_eq!(&wire[..], &data[..wire.len()]);
        assert_eq!(hello_bytes(data), Some(wire.len()));
        assert!(could_be_hello(data));
    }
    if data.len() >= 14 {
        let word = u64::from_le_bytes([
            data[0], data[1], data[2], data[3], data[4], data[5], data[6], data[7],
        ]);
        assert!(mailbox_name(word).len() < 107);
        let uid = u32::from_le_bytes([data[8], data[9], data[10], data[11]]);
        assert!(beacon_name(uid, data[12], u16::from(data[13])).len() < 107);
    }
    if let Ok(a) = Answer::decode(data) {
        if let Answer::Relay(t) = &a {
            assert!(valid_target(t));
        }
        let wire = a.encode();
        assert_eq!(answer_bytes(data), Some(wire.len()));
        assert_eq!(Answer::decode(&wire), Ok(a));
    }
    if let Ok(r) = RelayRequest::decode(data) {
        assert_eq!(&r.encode()[..], data);
    }
    if let Ok(r) = RelayReply::decode(data) {
        assert_eq!(RelayReply::decode(&r.encode()), Ok(r));
    }
    if let Ok(p) = Probe::decode(data) {
        assert!(p.family == 4 || p.family == 6);
        assert!(p.port > 0);
        assert_eq!(&p.encode()[..], data);
    }
    if let Ok(a) = ProbeAnswer::decode(data) {
        assert_eq!(&a.encode()[..], data);
    }
});
