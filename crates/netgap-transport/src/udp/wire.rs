//! The udp transport's datagram layout, as plain code: no sockets, no
//! clock. Every datagram starts with a [`HEADER_BYTES`]-byte header,
//! big-endian: magic `NG` (2 bytes), version, kind, flags, 3 reserved
//! bytes (sent as zero, ignored on receipt), the sequence number (8) and
//! the stream offset of the payload in bytes (8); the payload, if any,
//! follows. The flow engine's datagram path (`flows::datagram`) speaks the
//! same layout.
//!
//! [`Header::decode`] names what is wrong with anything that is not one of
//! netgap's datagrams; the data path ignores those (a stranger's datagram
//! on the port is no reason to end a flow).

/// Largest UDP payload of an IPv4 datagram, in bytes.
pub const MAX_DATAGRAM_BYTES: usize = 65_507;
/// Bytes of netgap's header in front of every datagram's payload.
pub const HEADER_BYTES: usize = 24;
/// Largest message the transport carries, in bytes: one datagram.
pub const MAX_MESSAGE_BYTES: usize = MAX_DATAGRAM_BYTES - HEADER_BYTES;
const _: () = assert!(MAX_MESSAGE_BYTES == netgap_core::datagram::MAX_MESSAGE_BYTES);

/// The first two bytes of every datagram.
pub const MAGIC: [u8; 2] = *b"NG";
/// Version of the header layout.
pub const VERSION: u8 = 1;
/// Flag: the sender waits for the receiver and asks for its last datagram.
pub const FLAG_RETRY: u8 = 1;
/// Byte of the header that holds the flags.
pub const FLAGS_AT: usize = 4;

/// What a datagram is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Coordinator to agent (flow engine client to server): please connect
    /// to me. The engine's carries the session proof's hello.
    Hello = 1,
    /// Agent to coordinator (server to client): connected. The engine's
    /// carries the session proof's answer.
    HelloAck = 2,
    /// A message.
    Data = 3,
    /// "I wait for you after a burst; my last data datagram is `seq`."
    Probe = 4,
    /// "Send your last datagram again: I have nothing from `seq` on."
    Nack = 5,
    /// Flow engine client to server: the session proof's confirmation
    /// (see `flows::datagram`); the point-to-point path ignores it.
    Confirm = 6,
    /// Flow engine server to client: the confirmation verified and the
    /// flow is registered.
    ConfirmAck = 7,
    /// "I am receiving: everything before `seq` arrived or was counted
    /// lost." Sent by a receiving end at most every quarter of its
    /// inactivity timeout while data arrives, so a sender that hears
    /// nothing else (a one-way stream) can tell a stopped peer.
    Ack = 8,
}

impl Kind {
    /// The kind with this wire code, if any.
    pub fn from_code(code: u8) -> Option<Kind> {
        Some(match code {
            1 => Kind::Hello,
            2 => Kind::HelloAck,
            3 => Kind::Data,
            4 => Kind::Probe,
            5 => Kind::Nack,
            6 => Kind::Confirm,
            7 => Kind::ConfirmAck,
            8 => Kind::Ack,
            _ => return None,
        })
    }
}

/// Why bytes are not one of netgap's datagrams.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// Shorter than the header.
    #[error("a {len_bytes}-byte datagram is shorter than the {HEADER_BYTES}-byte udp header")]
    TooShort {
        /// The datagram's length.
        len_bytes: usize,
    },
    /// The first two bytes are not [`MAGIC`].
    #[error("udp header magic {found:02x?} is not \"NG\"")]
    BadMagic {
        /// The bytes found.
        found: [u8; 2],
    },
    /// A header version this build does not speak.
    #[error("udp header version {found} (this build speaks {VERSION})")]
    BadVersion {
        /// The version found.
        found: u8,
    },
    /// A kind code no [`Kind`] has.
    #[error("udp datagram kind {found} is unknown")]
    UnknownKind {
        /// The code found.
        found: u8,
    },
}

/// The header in front of every datagram.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Header {
    /// What the datagram is.
    pub kind: Kind,
    /// Flags ([`FLAG_RETRY`]); other bits are carried and ignored.
    pub flags: u8,
    /// Data datagrams sent before this one in its direction.
    pub seq: u64,
    /// Payload bytes sent before this datagram's payload in its direction.
    pub offset_bytes: u64,
}

impl Header {
    /// A header-only datagram's header of `kind`, every field zero.
    pub fn control(kind: Kind) -> Header {
        Header {
            kind,
            flags: 0,
            seq: 0,
            offset_bytes: 0,
        }
    }

    /// The header's bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut b = [0u8; HEADER_BYTES];
        b[..2].copy_from_slice(&MAGIC);
        b[2] = VERSION;
        b[3] = self.kind as u8;
        b[FLAGS_AT] = self.flags;
        b[8..16].copy_from_slice(&self.seq.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset_bytes.to_be_bytes());
        b
    }

    /// The header at the start of `b` (the rest of `b` is the payload),
    /// or what makes `b` no datagram of ours.
    pub fn decode(b: &[u8]) -> Result<Header, WireError> {
        let Some(b) = b.first_chunk::<HEADER_BYTES>() else {
            return Err(WireError::TooShort { len_bytes: b.len() });
        };
        if b[..2] != MAGIC {
            return Err(WireError::BadMagic {
                found: [b[0], b[1]],
            });
        }
        if b[2] != VERSION {
            return Err(WireError::BadVersion { found: b[2] });
        }
        let kind = Kind::from_code(b[3]).ok_or(WireError::UnknownKind { found: b[3] })?;
        let word = |i: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&b[i..i + 8]);
            u64::from_be_bytes(w)
        };
        Ok(Header {
            kind,
            flags: b[FLAGS_AT],
            seq: word(8),
            offset_bytes: word(16),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn header_round_trips_and_rejects_strangers() {
        let h = Header {
            kind: Kind::Data,
            flags: FLAG_RETRY,
            seq: 7,
            offset_bytes: u64::MAX,
        };
        assert_eq!(Header::decode(&h.encode()), Ok(h));
        assert_eq!(
            Header::decode(&h.encode()[..HEADER_BYTES - 1]),
            Err(WireError::TooShort {
                len_bytes: HEADER_BYTES - 1
            })
        );
        let mut b = h.encode();
        b[0] = b'X';
        assert_eq!(
            Header::decode(&b),
            Err(WireError::BadMagic {
                found: [b'X', b'G']
            })
        );
        let mut b = h.encode();
        b[2] = 2;
        assert_eq!(Header::decode(&b), Err(WireError::BadVersion { found: 2 }));
        let mut b = h.encode();
        b[3] = 9;
        assert_eq!(Header::decode(&b), Err(WireError::UnknownKind { found: 9 }));
        assert_eq!(
            Header::decode(&[]),
            Err(WireError::TooShort { len_bytes: 0 })
        );
    }

    #[test]
    fn the_layout_is_the_documented_one() {
        let h = Header {
            kind: Kind::Probe,
            flags: 0x81,
            seq: 0x0102_0304_0506_0708,
            offset_bytes: 0x1112_1314_1516_1718,
        };
        assert_eq!(
            h.encode(),
            [
                b'N', b'G', 1, 4, 0x81, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8, 0x11, 0x12, 0x13, 0x14,
                0x15, 0x16, 0x17, 0x18
            ]
        );
        assert_eq!(Header::control(Kind::Hello).encode()[3], 1);
    }

    proptest! {
        #[test]
        fn every_header_round_trips(code in 1u8..=8, flags: u8, seq: u64, offset_bytes: u64,
                                    tail in proptest::collection::vec(any::<u8>(), 0..32)) {
            let kind = Kind::from_code(code).expect("a known code");
            let h = Header { kind, flags, seq, offset_bytes };
            let mut b = h.encode().to_vec();
            b.extend_from_slice(&tail);
            prop_assert_eq!(Header::decode(&b), Ok(h));
        }

        #[test]
        fn any_bytes_decode_or_say_why(b in proptest::collection::vec(any::<u8>(), 0..64)) {
            match Header::decode(&b) {
                Ok(h) => prop_assert_eq!(&h.encode()[..4], &b[..4]),
                Err(e) => prop_assert!(!e.to_string().is_empty()),
            }
        }
    }
}
