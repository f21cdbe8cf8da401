//! The frames one relay reads from another over their link, on hostile
//! input: whatever bytes arrive, read as the relay's receiving thread
//! reads them (an 8-byte header through `decode`, then the payload it
//! announces), nothing panics; a decoded header encodes back to the same
//! bytes, with a payload length its kind allows and id 0 exactly for link
//! frames; a `CREDIT` is 1 to the window; the credit accounting of every
//! connection (`Inflow` for what arrives, `Outflow` for what the other
//! side grants, each `DATA` standing for 16 times its size) never lets
//! more than the window be queued or in hand, and a refused arrival
//! changes nothing; a `LINK_HELLO`'s name, where it is a valid target
//! that parses as `IP/MAC/FLOW`, parses again to the same address from
//! its own spelling; and a `QUEUE_OFFER` or `QUEUE_ANSWER` payload that
//! decodes as its record (`netgap_proto::direct`) encodes back to the
//! same bytes, never offering or agreeing on queue 0.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::direct::{KeyedAnswer, QueueAnswer, QueueOffer, MAX_QUEUES};
use netgap_proto::preload::valid_target;
use netgap_proto::relay::{
    credit_of, decode, encode, Inflow, Kind, Outflow, CHUNK_BYTES, HEADER_BYTES, KEY_BYTES,
    MAX_NAME_BYTES, WINDOW_BYTES,
};
use netgap_transport::xdp::parse_addr;
use std::collections::HashMap;

/// Connections whose accounting is kept (the relay keeps only its own).
const MAX_CONNS: usize = 16;
/// How many bytes of a connection's queue one `DATA` byte stands for.
const SCALE: u32 = 16;

fuzz_target!(|data: &[u8]| {
    let mut inflows: HashMap<u32, Inflow> = HashMap::new();
    let mut outflows: HashMap<u32, Outflow> = HashMap::new();
    let mut rest = data;
    while rest.len() >= HEADER_BYTES {
        let (h, tail) = rest.split_at(HEADER_BYTES);
        let h: [u8; HEADER_BYTES] = h.try_into().expect("eight bytes");
        rest = tail;
        let Ok(hd) = decode(&h) else {
            // The relay breaks the link here; the fuzzer reads on.
            continue;
        };
        assert_eq!(encode(hd.kind, hd.id, hd.len), h);
        let link = matches!(
            hd.kind,
            Kind::Ping | Kind::LinkHello | Kind::LinkClose | Kind::QueueOffer | Kind::QueueAnswer
        );
        assert_eq!(link, hd.id == 0);
        let Some(payload) = rest.get(..hd.len) else {
            return;
        };
        rest = &rest[hd.len..];
        match hd.kind {
            Kind::Data => {
                assert!((1..=CHUNK_BYTES).contains(&payload.len()));
                if inflows.len() < MAX_CONNS || inflows.contains_key(&hd.id) {
                    let i = inflows.entry(hd.id).or_default();
                    let before = i.queued_bytes();
                    // Each DATA stands for SCALE of its size, so an input
                    // of at most 64 KiB can pass the 256 KiB window.
                    match i.arrive(payload.len() as u32 * SCALE) {
                        Ok(()) => assert!(i.queued_bytes() <= WINDOW_BYTES),
                        Err(_) => assert_eq!(i.queued_bytes(), before),
                    }
                    // The program takes what the first payload byte says.
                    let taken = u32::from(payload[0]) * 1024;
                    if let Some(back) = i.moved(taken) {
                        assert!(back > 0 && back <= WINDOW_BYTES);
                    }
                }
            }
            Kind::Credit => {
                let b: [u8; 4] = payload.try_into().expect("a credit is four bytes");
                if let Ok(n) = credit_of(b) {
                    assert!((1..=WINDOW_BYTES).contains(&n));
                    if outflows.len() < MAX_CONNS || outflows.contains_key(&hd.id) {
                        let o = outflows.entry(hd.id).or_default();
                        let _ = o.grant(n);
                        assert!(o.credit_bytes() <= WINDOW_BYTES);
                        o.spend(n / 2);
                    }
                }
            }
            Kind::Open => assert_eq!(payload.len(), KEY_BYTES),
            Kind::LinkHello => {
                assert!((1..=MAX_NAME_BYTES).contains(&payload.len()));
                if let Some(name) = std::str::from_utf8(payload).ok().filter(|n| valid_target(n)) {
                    if let Ok(a) = parse_addr(name) {
                        assert_eq!(parse_addr(&a.to_string()), Ok(a));
                    }
                }
            }
            Kind::QueueOffer => {
                if let Ok(o) = QueueOffer::decode(payload) {
                    assert_eq!(o.encode().as_slice(), payload);
                    assert_eq!(o.free_queues & 1, 0, "queue 0 offered");
                }
            }
            Kind::QueueAnswer => {
                if let Ok(a) = KeyedAnswer::decode(payload) {
                    assert_eq!(a.encode().as_slice(), payload);
                    if let QueueAnswer::Agreed { queue, flow } = a.answer {
                        assert!(queue > 0 && queue < MAX_QUEUES && flow > 0);
                    }
                }
            }
            _ => assert!(payload.is_empty()),
        }
    }
});
