//! The setup of a direct connection, as plain codecs (no I/O): a preload
//! library's connection to another host that runs netgap's xdp transport
//! on an AF_XDP socket of the program's own, made by its host's relay on a
//! queue of the connection's own and handed over (`SCM_RIGHTS`, the
//! transport's `xdp::handover`), instead of passing through the relay's
//! ring. Every decoder refuses anything a peer could send that must not be
//! acted on.
//!
//! 1. Each end's library asks its host's relay with a [`DirectRequest`]
//!    (the connection's key from the hello; the connecting side also names
//!    the other relay's target, from the answer), beside the connection's
//!    TCP socket; the relay checks the asker as for its other requests.
//! 2. The connecting side's relay offers the other relay, over their link,
//!    the queues free at its end ([`QueueOffer`]: the key, a mask of free
//!    queues, its program's flow id); the other relay, once its own program
//!    asked with the same key, answers with the lowest queue free at both
//!    ends ([`agree`]) and its program's flow id, or with none
//!    ([`QueueAnswer`]). Both go over the relays' link as link frames
//!    (`relay::Kind::QueueOffer`, `relay::Kind::QueueAnswer`); the answer
//!    travels with the key it answers ([`KeyedAnswer`]), since several
//!    offers may wait on one link.
//! 3. Each relay makes the socket on that queue, registers the connection
//!    in its steering program (the other host's MAC and its own program's
//!    flow id: only those frames reach the socket), and hands the socket
//!    and its UMEM over with a [`DirectGrant`] saying whom it reaches.
//!
//! Queue 0 is never offered: it is the relay's own port. A queue is one
//! bit of a `u32`, so at most [`MAX_QUEUES`] queues per link.

use crate::preload::{valid_target, HelloError, PRELOAD_VERSION, RELAY_KEY_BYTES};

/// First eight bytes of a library's request for a direct connection.
pub const DIRECT_REQUEST_MAGIC: [u8; 8] = *b"NGDIRCT\0";
/// First eight bytes of a relay's grant of one.
pub const DIRECT_GRANT_MAGIC: [u8; 8] = *b"NGDIRCTG";
/// Bytes of a [`DirectRequest`] (one datagram of the relay's socket, as
/// its other requests).
pub const DIRECT_REQUEST_BYTES: usize = 128;
/// Bytes of a [`DirectGrant`].
pub const DIRECT_GRANT_BYTES: usize = 32;
/// Bytes of a [`QueueOffer`].
pub const QUEUE_OFFER_BYTES: usize = RELAY_KEY_BYTES + 8;
/// Bytes of a [`QueueAnswer`].
pub const QUEUE_ANSWER_BYTES: usize = 4;
/// Bytes of a [`KeyedAnswer`]: the key, then the answer.
pub const KEYED_ANSWER_BYTES: usize = RELAY_KEY_BYTES + QUEUE_ANSWER_BYTES;
/// Most queues a link's mask names (queue 0 included, never offered).
pub const MAX_QUEUES: u16 = 32;
/// Bytes of the target field of a request.
const TARGET_FIELD_BYTES: usize = 64;

/// A MAC address.
pub type Mac = [u8; 6];

/// Which side of the connection asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DirectRole {
    /// The accepting side: waits for the other relay's offer.
    Accept,
    /// The connecting side: offers queues to the relay at `target`
    /// (`IP/MAC/FLOW`, from the answer to its hello).
    Connect {
        /// The other relay's target.
        target: String,
    },
}

/// A library's request to its host's relay for a direct connection.
#[derive(Clone, PartialEq, Eq)]
pub struct DirectRequest {
    /// The connection's key, from the connector's hello.
    pub key: [u8; RELAY_KEY_BYTES],
    /// Which side asks.
    pub role: DirectRole,
}

impl std::fmt::Debug for DirectRequest {
    // The key identifies a connection to the relays: it stays out of logs.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "DirectRequest {{ role: {:?} }}", self.role)
    }
}

/// What a relay hands over with a direct connection's socket: the queue
/// it is bound to, the flow ids of the two ends, and the other end's MAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DirectGrant {
    /// The queue the socket is bound to (1 to `MAX_QUEUES - 1`).
    pub queue: u16,
    /// This end's flow id (not 0).
    pub local_flow: u16,
    /// The other end's flow id (not 0).
    pub peer_flow: u16,
    /// The other host's MAC (a unicast address, not zero).
    pub peer_mac: Mac,
}

/// One relay's offer of queues for a direct connection.
#[derive(Clone, PartialEq, Eq)]
pub struct QueueOffer {
    /// The connection's key.
    pub key: [u8; RELAY_KEY_BYTES],
    /// Bit q set: queue q is free at the offering end (bit 0 never).
    pub free_queues: u32,
    /// The offering end's program's flow id (not 0).
    pub flow: u16,
}

impl std::fmt::Debug for QueueOffer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "QueueOffer {{ free_queues: {:#x}, flow: {} }}",
            self.free_queues, self.flow
        )
    }
}

/// The other relay's answer to a [`QueueOffer`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QueueAnswer {
    /// Queue `queue` is free at both ends; the answering end's program's
    /// flow id is `flow`.
    Agreed {
        /// The queue (1 to `MAX_QUEUES - 1`).
        queue: u16,
        /// The answering end's program's flow id (not 0).
        flow: u16,
    },
    /// No queue is free at both ends: the connection stays on the relay.
    NoQueue,
}

/// A [`QueueAnswer`] with the key of the offer it answers, as it goes
/// over the relays' link.
#[derive(Clone, PartialEq, Eq)]
pub struct KeyedAnswer {
    /// The key of the connection whose offer this answers.
    pub key: [u8; RELAY_KEY_BYTES],
    /// The answer.
    pub answer: QueueAnswer,
}

impl std::fmt::Debug for KeyedAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KeyedAnswer {{ answer: {:?} }}", self.answer)
    }
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn field(field: &'static str, value: u64) -> HelloError {
    HelloError::Field { field, value }
}

fn exact(bytes: &[u8], want_bytes: usize) -> Result<(), HelloError> {
    if bytes.len() != want_bytes {
        return Err(HelloError::Short {
            got_bytes: bytes.len(),
            want_bytes,
        });
    }
    Ok(())
}

fn check_head(b: &[u8], magic: &[u8; 8]) -> Result<(), HelloError> {
    if b[..8] != *magic {
        return Err(HelloError::Magic);
    }
    let version = u16_at(b, 8);
    if version != PRELOAD_VERSION {
        return Err(HelloError::Version(version));
    }
    Ok(())
}

fn check_queue(queue: u16) -> Result<u16, HelloError> {
    if queue == 0 || queue >= MAX_QUEUES {
        return Err(field("queue", u64::from(queue)));
    }
    Ok(queue)
}

fn check_flow(name: &'static str, flow: u16) -> Result<u16, HelloError> {
    if flow == 0 {
        return Err(field(name, 0));
    }
    Ok(flow)
}

impl DirectRequest {
    /// The request's bytes: magic, version (u16), operation (u16: 1
    /// accept, 2 connect), key (32 bytes), the target's length (u16), two
    /// zero bytes, the target (64 bytes, zero padded; empty for accept),
    /// zeros to 128. A target that is no valid target is sent empty, and
    /// refused by the relay.
    pub fn encode(&self) -> [u8; DIRECT_REQUEST_BYTES] {
        let mut b = [0u8; DIRECT_REQUEST_BYTES];
        b[..8].copy_from_slice(&DIRECT_REQUEST_MAGIC);
        b[8..10].copy_from_slice(&PRELOAD_VERSION.to_le_bytes());
        let (op, target) = match &self.role {
            DirectRole::Accept => (1u16, ""),
            DirectRole::Connect { target } if valid_target(target) => (2u16, target.as_str()),
            DirectRole::Connect { .. } => (2u16, ""),
        };
        b[10..12].copy_from_slice(&op.to_le_bytes());
        b[12..44].copy_from_slice(&self.key);
        b[44..46].copy_from_slice(&(target.len() as u16).to_le_bytes());
        b[48..48 + target.len()].copy_from_slice(target.as_bytes());
        b
    }

    /// Decodes a request of exactly [`DIRECT_REQUEST_BYTES`], checking
    /// every field.
    pub fn decode(bytes: &[u8]) -> Result<DirectRequest, HelloError> {
        exact(bytes, DIRECT_REQUEST_BYTES)?;
        let b = bytes;
        check_head(b, &DIRECT_REQUEST_MAGIC)?;
        let mut key = [0u8; RELAY_KEY_BYTES];
        key.copy_from_slice(&b[12..44]);
        let len = usize::from(u16_at(b, 44));
        if len > TARGET_FIELD_BYTES {
            return Err(field("target length", len as u64));
        }
        if b[46..48] != [0, 0] || b[48 + len..].iter().any(|&x| x != 0) {
            return Err(field("reserved", 1));
        }
        let target = std::str::from_utf8(&b[48..48 + len]).map_err(|_| field("target", 1))?;
        let role = match u16_at(b, 10) {
            1 if target.is_empty() => DirectRole::Accept,
            2 if valid_target(target) => DirectRole::Connect {
                target: target.to_string(),
            },
            op => return Err(field("op", u64::from(op))),
        };
        Ok(DirectRequest { key, role })
    }
}

impl DirectGrant {
    /// The grant's bytes: magic, version (u16), queue (u16), this end's
    /// flow (u16), the other end's flow (u16), the other host's MAC,
    /// zeros to 32.
    pub fn encode(&self) -> [u8; DIRECT_GRANT_BYTES] {
        let mut b = [0u8; DIRECT_GRANT_BYTES];
        b[..8].copy_from_slice(&DIRECT_GRANT_MAGIC);
        b[8..10].copy_from_slice(&PRELOAD_VERSION.to_le_bytes());
        b[10..12].copy_from_slice(&self.queue.to_le_bytes());
        b[12..14].copy_from_slice(&self.local_flow.to_le_bytes());
        b[14..16].copy_from_slice(&self.peer_flow.to_le_bytes());
        b[16..22].copy_from_slice(&self.peer_mac);
        b
    }

    /// Decodes a grant of exactly [`DIRECT_GRANT_BYTES`], checking every
    /// field: a queue other than 0 within [`MAX_QUEUES`], flow ids not 0,
    /// a unicast MAC other than zero.
    pub fn decode(bytes: &[u8]) -> Result<DirectGrant, HelloError> {
        exact(bytes, DIRECT_GRANT_BYTES)?;
        let b = bytes;
        check_head(b, &DIRECT_GRANT_MAGIC)?;
        if b[22..].iter().any(|&x| x != 0) {
            return Err(field("reserved", 1));
        }
        let mut peer_mac = [0u8; 6];
        peer_mac.copy_from_slice(&b[16..22]);
        if peer_mac == [0; 6] || peer_mac[0] & 1 == 1 {
            return Err(field("peer MAC's first byte", u64::from(peer_mac[0])));
        }
        Ok(DirectGrant {
            queue: check_queue(u16_at(b, 10))?,
            local_flow: check_flow("local flow", u16_at(b, 12))?,
            peer_flow: check_flow("peer flow", u16_at(b, 14))?,
            peer_mac,
        })
    }
}

impl QueueOffer {
    /// The offer's bytes: key (32 bytes), the free queues' mask (u32),
    /// the flow id (u16), two zero bytes.
    pub fn encode(&self) -> [u8; QUEUE_OFFER_BYTES] {
        let mut b = [0u8; QUEUE_OFFER_BYTES];
        b[..32].copy_from_slice(&self.key);
        b[32..36].copy_from_slice(&self.free_queues.to_le_bytes());
        b[36..38].copy_from_slice(&self.flow.to_le_bytes());
        b
    }

    /// Decodes an offer of exactly [`QUEUE_OFFER_BYTES`]: queue 0 never
    /// offered, a flow id not 0.
    pub fn decode(bytes: &[u8]) -> Result<QueueOffer, HelloError> {
        exact(bytes, QUEUE_OFFER_BYTES)?;
        let b = bytes;
        let mut key = [0u8; RELAY_KEY_BYTES];
        key.copy_from_slice(&b[..32]);
        let free_queues = u32::from_le_bytes([b[32], b[33], b[34], b[35]]);
        if free_queues & 1 == 1 {
            return Err(field("free queues", u64::from(free_queues)));
        }
        if b[38..] != [0, 0] {
            return Err(field("reserved", 1));
        }
        Ok(QueueOffer {
            key,
            free_queues,
            flow: check_flow("flow", u16_at(b, 36))?,
        })
    }
}

impl QueueAnswer {
    /// The answer's bytes: the queue (u16, 0 for none) and the flow id
    /// (u16, 0 for none).
    pub fn encode(&self) -> [u8; QUEUE_ANSWER_BYTES] {
        let (queue, flow) = match *self {
            QueueAnswer::Agreed { queue, flow } => (queue, flow),
            QueueAnswer::NoQueue => (0, 0),
        };
        let mut b = [0u8; QUEUE_ANSWER_BYTES];
        b[..2].copy_from_slice(&queue.to_le_bytes());
        b[2..].copy_from_slice(&flow.to_le_bytes());
        b
    }

    /// Decodes an answer of exactly [`QUEUE_ANSWER_BYTES`]: both zero, or
    /// a queue within [`MAX_QUEUES`] (not 0) and a flow id not 0; a queue
    /// the offer did not name is the caller's to refuse ([`agreed_in`]).
    pub fn decode(bytes: &[u8]) -> Result<QueueAnswer, HelloError> {
        exact(bytes, QUEUE_ANSWER_BYTES)?;
        match (u16_at(bytes, 0), u16_at(bytes, 2)) {
            (0, 0) => Ok(QueueAnswer::NoQueue),
            (queue, flow) => Ok(QueueAnswer::Agreed {
                queue: check_queue(queue)?,
                flow: check_flow("flow", flow)?,
            }),
        }
    }
}

impl KeyedAnswer {
    /// The bytes: the key (32 bytes), then the answer's four.
    pub fn encode(&self) -> [u8; KEYED_ANSWER_BYTES] {
        let mut b = [0u8; KEYED_ANSWER_BYTES];
        b[..RELAY_KEY_BYTES].copy_from_slice(&self.key);
        b[RELAY_KEY_BYTES..].copy_from_slice(&self.answer.encode());
        b
    }

    /// Decodes exactly [`KEYED_ANSWER_BYTES`], the answer checked as
    /// [`QueueAnswer::decode`] checks it.
    pub fn decode(bytes: &[u8]) -> Result<KeyedAnswer, HelloError> {
        exact(bytes, KEYED_ANSWER_BYTES)?;
        let mut key = [0u8; RELAY_KEY_BYTES];
        key.copy_from_slice(&bytes[..RELAY_KEY_BYTES]);
        Ok(KeyedAnswer {
            key,
            answer: QueueAnswer::decode(&bytes[RELAY_KEY_BYTES..])?,
        })
    }
}

/// The lowest queue free at both ends, given each end's mask of free
/// queues; never queue 0.
pub fn agree(ours: u32, theirs: u32) -> Option<u16> {
    let both = ours & theirs & !1;
    (both != 0).then(|| both.trailing_zeros() as u16)
}

/// Whether an answer's queue is one `offer` named: an answer naming
/// another is refused (the answering relay cannot pick a queue the offering
/// end has in use).
pub fn agreed_in(offer: &QueueOffer, answer: &QueueAnswer) -> bool {
    match *answer {
        QueueAnswer::Agreed { queue, .. } => {
            queue < MAX_QUEUES && offer.free_queues & (1u32 << queue) != 0
        }
        QueueAnswer::NoQueue => true,
    }
}

/// The mask of queues `1..queues` (at most [`MAX_QUEUES`]) not in
/// `taken`: what an end offers.
pub fn free_queues(queues: u16, taken: impl IntoIterator<Item = u16>) -> u32 {
    let n = u32::from(queues.min(MAX_QUEUES));
    let all = if n >= 32 { u32::MAX } else { (1u32 << n) - 1 };
    let mut free = all & !1;
    for q in taken {
        if q < MAX_QUEUES {
            free &= !(1u32 << q);
        }
    }
    free
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    const KEY: [u8; RELAY_KEY_BYTES] = [7; RELAY_KEY_BYTES];

    #[test]
    fn requests_round_trip_and_bad_ones_are_refused() {
        let connect = DirectRequest {
            key: KEY,
            role: DirectRole::Connect {
                target: "10.77.1.2/02:00:00:00:00:02/7".into(),
            },
        };
        let accept = DirectRequest {
            key: KEY,
            role: DirectRole::Accept,
        };
        for r in [&connect, &accept] {
            assert_eq!(DirectRequest::decode(&r.encode()).unwrap(), *r);
        }
        assert!(
            !format!("{connect:?}").contains("7, 7"),
            "the key stays out"
        );
        let good = connect.encode();
        let mut bad = good;
        bad[10] = 9;
        assert!(DirectRequest::decode(&bad).is_err(), "an unknown op");
        let mut bad = good;
        bad[120] = 1;
        assert!(DirectRequest::decode(&bad).is_err(), "trailing bytes");
        let mut bad = accept.encode();
        bad[44] = 3;
        bad[48..51].copy_from_slice(b"a/b");
        assert!(
            DirectRequest::decode(&bad).is_err(),
            "an accept with a target"
        );
        let mut bad = good;
        bad[44] = 200;
        assert!(
            DirectRequest::decode(&bad).is_err(),
            "a target past its field"
        );
        let mut bad = good;
        bad[8] = 99;
        assert!(matches!(
            DirectRequest::decode(&bad),
            Err(HelloError::Version(_))
        ));
        assert!(DirectRequest::decode(&good[..100]).is_err());
        let no_target = DirectRequest {
            key: KEY,
            role: DirectRole::Connect {
                target: "not a target!".into(),
            },
        };
        assert!(
            DirectRequest::decode(&no_target.encode()).is_err(),
            "a bad target is sent empty and refused"
        );
    }

    #[test]
    fn grants_round_trip_and_bad_ones_are_refused() {
        let g = DirectGrant {
            queue: 3,
            local_flow: 11,
            peer_flow: 22,
            peer_mac: [0x02, 0, 0, 0, 0, 0xb1],
        };
        assert_eq!(DirectGrant::decode(&g.encode()).unwrap(), g);
        for bad in [
            DirectGrant { queue: 0, ..g },
            DirectGrant {
                queue: MAX_QUEUES,
                ..g
            },
            DirectGrant { local_flow: 0, ..g },
            DirectGrant { peer_flow: 0, ..g },
            DirectGrant {
                peer_mac: [0x01, 0, 0x5e, 0, 0, 1],
                ..g
            },
            DirectGrant {
                peer_mac: [0; 6],
                ..g
            },
        ] {
            assert!(DirectGrant::decode(&bad.encode()).is_err(), "{bad:?}");
        }
        let mut bad = g.encode();
        bad[31] = 1;
        assert!(DirectGrant::decode(&bad).is_err(), "trailing bytes");
    }

    #[test]
    fn offers_and_answers_round_trip_and_queue_zero_is_never_offered() {
        let o = QueueOffer {
            key: KEY,
            free_queues: 0b1010_0110,
            flow: 5,
        };
        assert_eq!(QueueOffer::decode(&o.encode()).unwrap(), o);
        let zero = QueueOffer {
            free_queues: 0b11,
            ..o.clone()
        };
        assert!(QueueOffer::decode(&zero.encode()).is_err(), "queue 0");
        let no_flow = QueueOffer {
            flow: 0,
            ..o.clone()
        };
        assert!(QueueOffer::decode(&no_flow.encode()).is_err());
        for a in [
            QueueAnswer::Agreed { queue: 2, flow: 9 },
            QueueAnswer::NoQueue,
        ] {
            assert_eq!(QueueAnswer::decode(&a.encode()).unwrap(), a);
        }
        for bad in [[0, 0, 9, 0], [2, 0, 0, 0], [32, 0, 1, 0]] {
            assert!(QueueAnswer::decode(&bad).is_err(), "{bad:?}");
        }
        let keyed = KeyedAnswer {
            key: KEY,
            answer: QueueAnswer::Agreed { queue: 2, flow: 9 },
        };
        assert_eq!(KeyedAnswer::decode(&keyed.encode()).unwrap(), keyed);
        assert!(!format!("{keyed:?}").contains("7, 7"), "the key stays out");
        let mut bad = keyed.encode();
        bad[RELAY_KEY_BYTES + 2] = 0;
        assert!(KeyedAnswer::decode(&bad).is_err(), "a queue without a flow");
        assert!(KeyedAnswer::decode(&bad[..10]).is_err());
        assert!(agreed_in(&o, &QueueAnswer::Agreed { queue: 2, flow: 9 }));
        assert!(!agreed_in(&o, &QueueAnswer::Agreed { queue: 3, flow: 9 }));
    }

    #[test]
    fn the_agreed_queue_is_the_lowest_free_at_both_ends_and_never_zero() {
        assert_eq!(agree(0b1110, 0b1100), Some(2));
        assert_eq!(agree(0b0110, 0b1000), None);
        assert_eq!(agree(u32::MAX, u32::MAX), Some(1));
        assert_eq!(agree(1, 1), None, "queue 0 is the relay's own");
        assert_eq!(free_queues(16, [1, 2, 15]), 0b0111_1111_1111_1000);
        assert_eq!(free_queues(1, []), 0, "one queue: none to offer");
        assert_eq!(free_queues(40, [31, 50]), !1 & !(1 << 31));
    }
}
