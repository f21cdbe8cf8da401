//! The frames two hosts' relays (`netgap relay`) exchange over their link,
//! and the per-connection credit accounting, as plain code (no I/O): the
//! relay reads every frame's header through [`decode`] before it reads the
//! payload, and checks every byte count against [`Inflow`] and
//! [`Outflow`].
//!
//! A frame is an 8-byte header (kind u8, a zero byte, payload length u16
//! little-endian, connection id u32 little-endian) and its payload. Link
//! frames (`PING`, `LINK_HELLO`, `LINK_CLOSE`, and the queue agreement of
//! a direct connection, `QUEUE_OFFER` and `QUEUE_ANSWER`, whose payloads
//! are `netgap_proto::direct`'s records and name the connection by its
//! key) carry id 0; every other frame names a connection (id ≠ 0), whose
//! top bit says which end of the link opened it, so the two relays never
//! pick the same id.

use crate::direct::{KEYED_ANSWER_BYTES, QUEUE_OFFER_BYTES};
use thiserror::Error;

/// Bytes of a frame header.
pub const HEADER_BYTES: usize = 8;
/// Largest `DATA` payload.
pub const CHUNK_BYTES: usize = 16 * 1024;
/// The credit a receiving relay grants each connection when it opens: the
/// most bytes of it that may wait in the receiver's queue.
pub const WINDOW_BYTES: u32 = 256 * 1024;
/// The receiver returns credit in batches of at least this many bytes.
pub const CREDIT_BATCH_BYTES: u32 = WINDOW_BYTES / 4;
/// Bytes of an `OPEN` payload: the connection's flow key.
pub const KEY_BYTES: usize = 32;
/// Longest `LINK_HELLO` payload: the sender's `IP/MAC/FLOW`.
pub const MAX_NAME_BYTES: usize = 64;
/// The id bit of connections opened by the end that connected the link
/// (the listening end's connections have it clear).
pub const CONNECTOR_BIT: u32 = 1 << 31;

/// What a frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A connection's bytes.
    Data,
    /// Wake the program: send one byte on its TCP connection.
    Bell,
    /// The sender's program is done sending (it shut down its sending
    /// side, or closed the connection): no `DATA` of it follows. The
    /// other way stays open until the receiver's own `END`.
    End,
    /// Link keep-alive.
    Ping,
    /// The receiver moved this many more bytes (u32) to its program.
    Credit,
    /// A new connection on the link, with its flow key.
    Open,
    /// The other relay took an `OPEN`.
    OpenOk,
    /// The other relay has no connection waiting with that key.
    OpenRefused,
    /// The connection broke on the sender's side.
    Reset,
    /// The first frame each way: the sender's end of the link, `IP/MAC/FLOW`.
    LinkHello,
    /// The sender closes the link (no connection left for a while).
    LinkClose,
    /// A direct connection's queues free at the sender's end
    /// (`direct::QueueOffer`, with the connection's key).
    QueueOffer,
    /// The answer to a `QUEUE_OFFER` (`direct::KeyedAnswer`: the key and
    /// the agreed queue, or none).
    QueueAnswer,
}

impl Kind {
    fn code(self) -> u8 {
        match self {
            Kind::Data => 1,
            Kind::Bell => 2,
            Kind::End => 3,
            Kind::Ping => 4,
            Kind::Credit => 5,
            Kind::Open => 6,
            Kind::OpenOk => 7,
            Kind::OpenRefused => 8,
            Kind::Reset => 9,
            Kind::LinkHello => 10,
            Kind::LinkClose => 11,
            Kind::QueueOffer => 12,
            Kind::QueueAnswer => 13,
        }
    }

    fn from_code(c: u8) -> Option<Kind> {
        Some(match c {
            1 => Kind::Data,
            2 => Kind::Bell,
            3 => Kind::End,
            4 => Kind::Ping,
            5 => Kind::Credit,
            6 => Kind::Open,
            7 => Kind::OpenOk,
            8 => Kind::OpenRefused,
            9 => Kind::Reset,
            10 => Kind::LinkHello,
            11 => Kind::LinkClose,
            12 => Kind::QueueOffer,
            13 => Kind::QueueAnswer,
            _ => return None,
        })
    }

    /// Whether frames of this kind concern the link rather than one
    /// connection (id 0).
    fn of_link(self) -> bool {
        matches!(
            self,
            Kind::Ping | Kind::LinkHello | Kind::LinkClose | Kind::QueueOffer | Kind::QueueAnswer
        )
    }

    /// The payload lengths this kind allows.
    fn lengths(self) -> (usize, usize) {
        match self {
            Kind::Data => (1, CHUNK_BYTES),
            Kind::Credit => (4, 4),
            Kind::Open => (KEY_BYTES, KEY_BYTES),
            Kind::LinkHello => (1, MAX_NAME_BYTES),
            Kind::QueueOffer => (QUEUE_OFFER_BYTES, QUEUE_OFFER_BYTES),
            Kind::QueueAnswer => (KEYED_ANSWER_BYTES, KEYED_ANSWER_BYTES),
            _ => (0, 0),
        }
    }
}

/// A checked frame header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the frame is.
    pub kind: Kind,
    /// Bytes of payload that follow.
    pub len: usize,
    /// The connection (0 for a link frame).
    pub id: u32,
}

/// A header or payload the other relay should never send: the link is
/// broken.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum FrameError {
    /// A kind this relay does not know.
    #[error("unknown frame kind {0}")]
    Kind(u8),
    /// The reserved byte is not zero.
    #[error("frame {kind:?} with reserved byte {byte}, want 0")]
    Reserved {
        /// The frame's kind.
        kind: Kind,
        /// The byte found.
        byte: u8,
    },
    /// A payload length the kind does not allow.
    #[error("frame {kind:?} with {len} payload bytes, want {min} to {max}")]
    Len {
        /// The frame's kind.
        kind: Kind,
        /// The length found.
        len: usize,
        /// The least allowed.
        min: usize,
        /// The most allowed.
        max: usize,
    },
    /// A link frame with a connection id, or a connection frame without.
    #[error("frame {kind:?} with connection id {id}")]
    Id {
        /// The frame's kind.
        kind: Kind,
        /// The id found.
        id: u32,
    },
    /// A credit of zero or past the window.
    #[error("a credit of {0} bytes (want 1 to {WINDOW_BYTES})")]
    Credit(u32),
}

/// The header of a frame of `kind` for connection `id` with `len` bytes
/// of payload.
pub fn encode(kind: Kind, id: u32, len: usize) -> [u8; HEADER_BYTES] {
    let mut h = [0u8; HEADER_BYTES];
    h[0] = kind.code();
    h[2..4].copy_from_slice(&(len.min(usize::from(u16::MAX)) as u16).to_le_bytes());
    h[4..8].copy_from_slice(&id.to_le_bytes());
    h
}

/// A whole frame: header and payload.
pub fn frame(kind: Kind, id: u32, payload: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(HEADER_BYTES + payload.len());
    v.extend_from_slice(&encode(kind, id, payload.len()));
    v.extend_from_slice(payload);
    v
}

/// Checks a received header: a known kind, the reserved byte zero, a
/// payload length the kind allows, id 0 exactly for link frames.
pub fn decode(h: &[u8; HEADER_BYTES]) -> Result<Header, FrameError> {
    let kind = Kind::from_code(h[0]).ok_or(FrameError::Kind(h[0]))?;
    if h[1] != 0 {
        return Err(FrameError::Reserved { kind, byte: h[1] });
    }
    let len = usize::from(u16::from_le_bytes([h[2], h[3]]));
    let (min, max) = kind.lengths();
    if !(min..=max).contains(&len) {
        return Err(FrameError::Len {
            kind,
            len,
            min,
            max,
        });
    }
    let id = u32::from_le_bytes([h[4], h[5], h[6], h[7]]);
    if kind.of_link() != (id == 0) {
        return Err(FrameError::Id { kind, id });
    }
    Ok(Header { kind, len, id })
}

/// The bytes a `CREDIT` payload returns.
pub fn credit_of(payload: [u8; 4]) -> Result<u32, FrameError> {
    let n = u32::from_le_bytes(payload);
    if n == 0 || n > WINDOW_BYTES {
        return Err(FrameError::Credit(n));
    }
    Ok(n)
}

/// More data or credit than the window allows: a protocol fault.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum CreditError {
    /// The sender sent past the credit it had.
    #[error("{arrived} bytes arrived with {queued} queued: past the {WINDOW_BYTES}-byte window")]
    Overrun {
        /// Bytes of the frame.
        arrived: u32,
        /// Bytes already queued.
        queued: u32,
    },
    /// The receiver returned more than was sent.
    #[error(
        "a credit of {granted} bytes with {credit} in hand: past the {WINDOW_BYTES}-byte window"
    )]
    OverGrant {
        /// Bytes returned.
        granted: u32,
        /// Credit the sender had.
        credit: u32,
    },
}

/// The receiving side's account of one connection: bytes queued (arrived,
/// not yet in the program's ring) and bytes moved whose credit is not yet
/// returned. Queued bytes never pass the window, since the sender holds
/// the window less what it sent plus what came back.
#[derive(Debug, Default)]
pub struct Inflow {
    queued_bytes: u32,
    unreturned_bytes: u32,
}

impl Inflow {
    /// `len` bytes arrived for the queue.
    pub fn arrive(&mut self, len: u32) -> Result<(), CreditError> {
        match self.queued_bytes.checked_add(len) {
            Some(q) if q <= WINDOW_BYTES => {
                self.queued_bytes = q;
                Ok(())
            }
            _ => Err(CreditError::Overrun {
                arrived: len,
                queued: self.queued_bytes,
            }),
        }
    }

    /// `n` queued bytes went to the program (or were discarded): the
    /// credit to return now, once a batch is due.
    pub fn moved(&mut self, n: u32) -> Option<u32> {
        let n = n.min(self.queued_bytes);
        self.queued_bytes -= n;
        self.unreturned_bytes += n;
        if self.unreturned_bytes >= CREDIT_BATCH_BYTES {
            Some(std::mem::take(&mut self.unreturned_bytes))
        } else {
            None
        }
    }

    /// Bytes waiting in the queue.
    pub fn queued_bytes(&self) -> u32 {
        self.queued_bytes
    }
}

/// The sending side's credit for one connection.
#[derive(Debug)]
pub struct Outflow {
    credit_bytes: u32,
}

impl Default for Outflow {
    fn default() -> Self {
        Outflow {
            credit_bytes: WINDOW_BYTES,
        }
    }
}

impl Outflow {
    /// Bytes that may be sent now.
    pub fn credit_bytes(&self) -> u32 {
        self.credit_bytes
    }

    /// `n` bytes were sent (at most the credit).
    pub fn spend(&mut self, n: u32) {
        self.credit_bytes = self.credit_bytes.saturating_sub(n);
    }

    /// The receiver returned `n` bytes of credit.
    pub fn grant(&mut self, n: u32) -> Result<(), CreditError> {
        match self.credit_bytes.checked_add(n) {
            Some(c) if c <= WINDOW_BYTES => {
                self.credit_bytes = c;
                Ok(())
            }
            _ => Err(CreditError::OverGrant {
                granted: n,
                credit: self.credit_bytes,
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    const ALL: [Kind; 13] = [
        Kind::Data,
        Kind::Bell,
        Kind::End,
        Kind::Ping,
        Kind::Credit,
        Kind::Open,
        Kind::OpenOk,
        Kind::OpenRefused,
        Kind::Reset,
        Kind::LinkHello,
        Kind::LinkClose,
        Kind::QueueOffer,
        Kind::QueueAnswer,
    ];

    #[test]
    fn every_kind_round_trips_with_its_lengths_and_ids() {
        for kind in ALL {
            let (min, max) = kind.lengths();
            let id = if kind.of_link() { 0 } else { 0x8000_0007 };
            for len in [min, max] {
                let h = encode(kind, id, len);
                assert_eq!(decode(&h), Ok(Header { kind, len, id }), "{kind:?}");
            }
            if max < usize::from(u16::MAX) {
                let h = encode(kind, id, max + 1);
                assert!(
                    matches!(decode(&h), Err(FrameError::Len { .. })),
                    "{kind:?}"
                );
            }
            if min > 0 {
                let h = encode(kind, id, min - 1);
                assert!(
                    matches!(decode(&h), Err(FrameError::Len { .. })),
                    "{kind:?}"
                );
            }
            let wrong_id = if kind.of_link() { 5 } else { 0 };
            let h = encode(kind, wrong_id, min);
            assert_eq!(decode(&h), Err(FrameError::Id { kind, id: wrong_id }));
        }
    }

    #[test]
    fn unknown_kinds_and_a_set_reserved_byte_are_refused() {
        for code in [0u8, 14, 200, 255] {
            let mut h = encode(Kind::Bell, 1, 0);
            h[0] = code;
            assert_eq!(decode(&h), Err(FrameError::Kind(code)));
        }
        let mut h = encode(Kind::Bell, 1, 0);
        h[1] = 1;
        assert_eq!(
            decode(&h),
            Err(FrameError::Reserved {
                kind: Kind::Bell,
                byte: 1
            })
        );
    }

    #[test]
    fn the_queue_agreement_frames_are_link_frames_of_their_records_length() {
        use crate::direct::{KeyedAnswer, QueueAnswer, QueueOffer};
        let offer = QueueOffer {
            key: [3; KEY_BYTES],
            free_queues: 0b1110,
            flow: 9,
        };
        let f = frame(Kind::QueueOffer, 0, &offer.encode());
        let h: [u8; HEADER_BYTES] = f[..HEADER_BYTES].try_into().unwrap();
        assert_eq!(decode(&h).unwrap().len, QUEUE_OFFER_BYTES);
        let answer = KeyedAnswer {
            key: [3; KEY_BYTES],
            answer: QueueAnswer::Agreed { queue: 2, flow: 4 },
        };
        let f = frame(Kind::QueueAnswer, 0, &answer.encode());
        let h: [u8; HEADER_BYTES] = f[..HEADER_BYTES].try_into().unwrap();
        assert_eq!(decode(&h).unwrap().len, KEYED_ANSWER_BYTES);
        assert_eq!(KeyedAnswer::decode(&f[HEADER_BYTES..]).unwrap(), answer);
        // A connection's id on either is refused, as a short payload is.
        let h = encode(Kind::QueueOffer, 7, QUEUE_OFFER_BYTES);
        assert!(matches!(decode(&h), Err(FrameError::Id { .. })));
        let h = encode(Kind::QueueAnswer, 0, KEYED_ANSWER_BYTES - 1);
        assert!(matches!(decode(&h), Err(FrameError::Len { .. })));
    }

    #[test]
    fn a_whole_frame_is_its_header_then_its_payload() {
        let f = frame(Kind::Data, 3, b"abc");
        assert_eq!(f.len(), HEADER_BYTES + 3);
        let h: [u8; HEADER_BYTES] = f[..HEADER_BYTES].try_into().unwrap();
        assert_eq!(
            decode(&h),
            Ok(Header {
                kind: Kind::Data,
                len: 3,
                id: 3
            })
        );
        assert_eq!(&f[HEADER_BYTES..], b"abc");
    }

    #[test]
    fn credit_payloads_are_within_the_window() {
        assert_eq!(credit_of(1u32.to_le_bytes()), Ok(1));
        assert_eq!(credit_of(WINDOW_BYTES.to_le_bytes()), Ok(WINDOW_BYTES));
        assert_eq!(credit_of(0u32.to_le_bytes()), Err(FrameError::Credit(0)));
        assert!(credit_of((WINDOW_BYTES + 1).to_le_bytes()).is_err());
    }

    #[test]
    fn a_sender_within_its_credit_never_overruns_the_receiver() {
        let mut out = Outflow::default();
        let mut inn = Inflow::default();
        let mut in_flight_credit = 0u32;
        let chunk = CHUNK_BYTES as u32;
        // Send a window's worth: all of it fits the queue.
        while out.credit_bytes() > 0 {
            let n = out.credit_bytes().min(chunk);
            out.spend(n);
            inn.arrive(n).unwrap();
        }
        assert_eq!(inn.queued_bytes(), WINDOW_BYTES);
        // One byte more is an overrun.
        assert!(inn.arrive(1).is_err());
        // Moving bytes out returns credit in batches only.
        assert_eq!(inn.moved(CREDIT_BATCH_BYTES - 1), None);
        let back = inn.moved(1).unwrap();
        assert_eq!(back, CREDIT_BATCH_BYTES);
        in_flight_credit += back;
        out.grant(in_flight_credit).unwrap();
        assert_eq!(out.credit_bytes(), CREDIT_BATCH_BYTES);
        // The receiver's queue has exactly that much room again.
        inn.arrive(out.credit_bytes()).unwrap();
        out.spend(CREDIT_BATCH_BYTES);
        assert!(inn.arrive(1).is_err());
    }

    #[test]
    fn credit_past_the_window_is_refused() {
        let mut out = Outflow::default();
        assert!(out.grant(1).is_err());
        out.spend(100);
        out.grant(100).unwrap();
        assert_eq!(out.credit_bytes(), WINDOW_BYTES);
        assert!(out.grant(1).is_err());
    }

    #[test]
    fn a_stalled_sender_always_gets_credit_back_once_the_queue_drains() {
        // Whatever the interleaving, a sender out of credit finds the
        // receiver with at least a batch to move: no deadlock.
        let mut out = Outflow::default();
        let mut inn = Inflow::default();
        let mut rounds = 0;
        for step in [7000u32, 16384, 1, 9999, 16384, 300] {
            while out.credit_bytes() > 0 {
                let n = out.credit_bytes().min(step);
                out.spend(n);
                inn.arrive(n).unwrap();
            }
            assert!(inn.queued_bytes() > WINDOW_BYTES - CREDIT_BATCH_BYTES);
            let mut got = None;
            while got.is_none() {
                let n = inn.queued_bytes().min(step);
                assert!(n > 0, "the queue drained without a credit");
                got = inn.moved(n);
            }
            out.grant(got.unwrap()).unwrap();
            rounds += 1;
        }
        assert_eq!(rounds, 6);
    }
}
