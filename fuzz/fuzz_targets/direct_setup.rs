//! The setup records of a direct connection on hostile input
//! (`netgap_proto::direct`): the first 128 bytes as a library's request to
//! its relay, the next 32 as a relay's grant, the next 40 as one relay's
//! queue offer and the next 4 as the other's answer, each through its
//! decoder, as a relay or a library reads them. Nothing panics; whatever
//! decodes encodes back to the same bytes; a grant's queue and an answer's
//! queue are never 0 and within the mask; an offer never offers queue 0;
//! the queue `agree` picks is free at both ends and the lowest such; an
//! answer `agreed_in` accepts names a queue the offer named.
#![no_main]

use libfuzzer_sys::fuzz_target;
use netgap_proto::direct::{
    agree, agreed_in, DirectGrant, DirectRequest, QueueAnswer, QueueOffer, DIRECT_GRANT_BYTES,
    DIRECT_REQUEST_BYTES, MAX_QUEUES, QUEUE_ANSWER_BYTES, QUEUE_OFFER_BYTES,
};

fuzz_target!(|data: &[u8]| {
    let mut rest = data;
    let mut take = |n: usize| {
        let (head, tail) = rest.split_at(n.min(rest.len()));
        rest = tail;
        head
    };
    let request = take(DIRECT_REQUEST_BYTES);
    if let Ok(r) = DirectRequest::decode(request) {
        assert_eq!(r.encode().as_slice(), request);
    }
    let grant = take(DIRECT_GRANT_BYTES);
    if let Ok(g) = DirectGrant::decode(grant) {
        assert_eq!(g.encode().as_slice(), grant);
        assert!(g.queue > 0 && g.queue < MAX_QUEUES);
        assert!(g.local_flow > 0 && g.peer_flow > 0);
    }
    let offer = take(QUEUE_OFFER_BYTES).to_vec();
    let answer = take(QUEUE_ANSWER_BYTES).to_vec();
    let offer = QueueOffer::decode(&offer).ok();
    if let Some(o) = &offer {
        assert_eq!(QueueOffer::decode(&o.encode()).as_ref(), Ok(o));
        assert_eq!(o.free_queues & 1, 0, "queue 0 offered");
    }
    if let Ok(a) = QueueAnswer::decode(&answer) {
        assert_eq!(a.encode().as_slice(), answer.as_slice());
        if let QueueAnswer::Agreed { queue, flow } = a {
            assert!(queue > 0 && queue < MAX_QUEUES && flow > 0);
        }
        if let Some(o) = &offer {
            if let (QueueAnswer::Agreed { queue, .. }, true) = (a, agreed_in(o, &a)) {
                assert_ne!(o.free_queues & (1u32 << queue), 0);
            }
        }
    }
    // The rest, read as two masks, through the agreement.
    let masks = take(8);
    if masks.len() == 8 {
        let ours = u32::from_le_bytes([masks[0], masks[1], masks[2], masks[3]]);
        let theirs = u32::from_le_bytes([masks[4], masks[5], masks[6], masks[7]]);
        match agree(ours, theirs) {
            Some(q) => {
                assert!(q > 0 && q < MAX_QUEUES);
                let bit = 1u32 << q;
                assert_ne!(ours & theirs & bit, 0);
                assert_eq!(ours & theirs & (bit - 1) & !1, 0, "a lower queue was free");
            }
            None => assert_eq!(ours & theirs & !1, 0),
        }
    }
});
