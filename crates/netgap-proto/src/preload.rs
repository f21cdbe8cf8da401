//! The setup exchange of netgap's preload sockets library: the small
//! versioned hello a connecting program sends over a fresh kernel TCP
//! connection to a listener that runs the library too, and the listener's
//! answer. Both are fixed-size, little-endian records; this module only
//! turns them into bytes and back, and refuses anything a peer could send
//! that the library must not act on.
//!
//! The hello names the shared region the connector made: a memfd, by the
//! connector's process id and descriptor number, which the listener opens
//! through `/proc/PID/fd/FD` (only a process of the same user may), and the
//! capacity of each of the region's two rings.

use thiserror::Error;

/// First eight bytes of a hello.
pub const HELLO_MAGIC: [u8; 8] = *b"NGPRELD\0";
/// First eight bytes of an answer.
pub const ANSWER_MAGIC: [u8; 8] = *b"NGPRELA\0";
/// Version of the exchange and of the shared region's layout.
pub const PRELOAD_VERSION: u16 = 1;
/// Bytes of a hello on the wire.
pub const HELLO_BYTES: usize = 32;
/// Bytes of an answer on the wire.
pub const ANSWER_BYTES: usize = 16;
/// Smallest ring capacity a hello may name (one page).
pub const MIN_RING_BYTES: u32 = 4096;
/// Largest ring capacity a hello may name (64 MiB).
pub const MAX_RING_BYTES: u32 = 64 << 20;

/// A connector's hello: where its shared region is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    /// The connector's process id.
    pub pid: u32,
    /// The memfd's descriptor number in that process.
    pub fd: u32,
    /// Bytes of each ring's data region: a power of two between
    /// [`MIN_RING_BYTES`] and [`MAX_RING_BYTES`].
    pub ring_bytes: u32,
}

/// The listener's answer to a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// The listener mapped the region: the connection moves to it.
    Accepted,
    /// The listener could not use the region (the code says why, see
    /// [`Refusal`]); the connection stays on the kernel's TCP.
    Refused(Refusal),
}

/// Why a listener refused a hello.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The hello did not decode.
    BadHello,
    /// The region could not be opened (another user, a process gone).
    Unreachable,
    /// The region was not what the hello said (size, owner, header).
    BadRegion,
    /// A code this version does not know.
    Other(u16),
}

impl Refusal {
    fn code(self) -> u16 {
        match self {
            Refusal::BadHello => 1,
            Refusal::Unreachable => 2,
            Refusal::BadRegion => 3,
            Refusal::Other(c) => c,
        }
    }

    fn from_code(code: u16) -> Refusal {
        match code {
            1 => Refusal::BadHello,
            2 => Refusal::Unreachable,
            3 => Refusal::BadRegion,
            c => Refusal::Other(c),
        }
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Refusal::BadHello => f.write_str("the hello did not decode"),
            Refusal::Unreachable => f.write_str("the shared region could not be opened"),
            Refusal::BadRegion => f.write_str("the shared region is not as announced"),
            Refusal::Other(c) => write!(f, "refusal code {c}"),
        }
    }
}

/// Why bytes are not a hello or an answer.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum HelloError {
    /// Fewer bytes than a record.
    #[error("preload setup record too short: {got_bytes} of {want_bytes} bytes")]
    Short {
        /// Bytes given.
        got_bytes: usize,
        /// Bytes a record has.
        want_bytes: usize,
    },
    /// The magic is not the library's.
    #[error("not a preload setup record (wrong magic)")]
    Magic,
    /// Another version of the exchange.
    #[error("preload setup version {0} (this library speaks {PRELOAD_VERSION})")]
    Version(u16),
    /// A field outside what the exchange allows.
    #[error("preload hello field {field} is {value}, outside what is allowed")]
    Field {
        /// The field's name.
        field: &'static str,
        /// Its value.
        value: u64,
    },
}

fn u16_at(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes([b[at], b[at + 1], b[at + 2], b[at + 3]])
}

/// Whether `bytes` could be the start of a hello (its magic's first
/// bytes): a listener peeks at the first bytes of a connection to tell a
/// connector with the library from one without.
pub fn could_be_hello(bytes: &[u8]) -> bool {
    let n = bytes.len().min(HELLO_MAGIC.len());
    bytes[..n] == HELLO_MAGIC[..n]
}

/// Whether `bytes` could be the start of an answer.
pub fn could_be_answer(bytes: &[u8]) -> bool {
    let n = bytes.len().min(ANSWER_MAGIC.len());
    bytes[..n] == ANSWER_MAGIC[..n]
}

impl Hello {
    /// The hello's bytes: magic, version (u16), flags (u16, zero), pid,
    /// fd, ring bytes (u32 each), eight reserved zero bytes.
    pub fn encode(&self) -> [u8; HELLO_BYTES] {
        let mut b = [0u8; HELLO_BYTES];
        b[..8].copy_from_slice(&HELLO_MAGIC);
        b[8..10].copy_from_slice(&PRELOAD_VERSION.to_le_bytes());
        b[12..16].copy_from_slice(&self.pid.to_le_bytes());
        b[16..20].copy_from_slice(&self.fd.to_le_bytes());
        b[20..24].copy_from_slice(&self.ring_bytes.to_le_bytes());
        b
    }

    /// Decodes the first [`HELLO_BYTES`] of `bytes`, checking every field.
    pub fn decode(bytes: &[u8]) -> Result<Hello, HelloError> {
        let b = bytes.get(..HELLO_BYTES).ok_or(HelloError::Short {
            got_bytes: bytes.len(),
            want_bytes: HELLO_BYTES,
        })?;
        if b[..8] != HELLO_MAGIC {
            return Err(HelloError::Magic);
        }
        let version = u16_at(b, 8);
        if version != PRELOAD_VERSION {
            return Err(HelloError::Version(version));
        }
        let flags = u16_at(b, 10);
        if flags != 0 {
            return Err(HelloError::Field {
                field: "flags",
                value: u64::from(flags),
            });
        }
        let pid = u32_at(b, 12);
        // Process ids are positive and below 2^22 on Linux.
        if pid == 0 || pid >= 1 << 22 {
            return Err(HelloError::Field {
                field: "pid",
                value: u64::from(pid),
            });
        }
        let fd = u32_at(b, 16);
        if fd > i32::MAX.cast_unsigned() {
            return Err(HelloError::Field {
                field: "fd",
                value: u64::from(fd),
            });
        }
        let ring_bytes = u32_at(b, 20);
        if !ring_bytes.is_power_of_two() || !(MIN_RING_BYTES..=MAX_RING_BYTES).contains(&ring_bytes)
        {
            return Err(HelloError::Field {
                field: "ring_bytes",
                value: u64::from(ring_bytes),
            });
        }
        if b[24..].iter().any(|&x| x != 0) {
            return Err(HelloError::Field {
                field: "reserved",
                value: u64::from_le_bytes([b[24], b[25], b[26], b[27], b[28], b[29], b[30], b[31]]),
            });
        }
        Ok(Hello {
            pid,
            fd,
            ring_bytes,
        })
    }
}

impl Answer {
    /// The answer's bytes: magic, version (u16), refusal code (u16, zero
    /// when accepted), four reserved zero bytes.
    pub fn encode(&self) -> [u8; ANSWER_BYTES] {
        let mut b = [0u8; ANSWER_BYTES];
        b[..8].copy_from_slice(&ANSWER_MAGIC);
        b[8..10].copy_from_slice(&PRELOAD_VERSION.to_le_bytes());
        let code = match self {
            Answer::Accepted => 0,
            Answer::Refused(r) => r.code(),
        };
        b[10..12].copy_from_slice(&code.to_le_bytes());
        b
    }

    /// Decodes the first [`ANSWER_BYTES`] of `bytes`.
    pub fn decode(bytes: &[u8]) -> Result<Answer, HelloError> {
        let b = bytes.get(..ANSWER_BYTES).ok_or(HelloError::Short {
            got_bytes: bytes.len(),
            want_bytes: ANSWER_BYTES,
        })?;
        if b[..8] != ANSWER_MAGIC {
            return Err(HelloError::Magic);
        }
        let version = u16_at(b, 8);
        if version != PRELOAD_VERSION {
            return Err(HelloError::Version(version));
        }
        Ok(match u16_at(b, 10) {
            0 => Answer::Accepted,
            c => Answer::Refused(Refusal::from_code(c)),
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, reason = "a failed unwrap is a failed test")]
mod tests {
    use super::*;

    #[test]
    fn a_hello_and_an_answer_round_trip() {
        let h = Hello {
            pid: 4242,
            fd: 7,
            ring_bytes: 1 << 18,
        };
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
        for a in [
            Answer::Accepted,
            Answer::Refused(Refusal::BadRegion),
            Answer::Refused(Refusal::Other(99)),
        ] {
            assert_eq!(Answer::decode(&a.encode()).unwrap(), a);
        }
    }

    #[test]
    fn bad_hellos_are_refused_by_field() {
        let good = Hello {
            pid: 1,
            fd: 3,
            ring_bytes: 4096,
        }
        .encode();
        assert!(matches!(
            Hello::decode(&good[..10]),
            Err(HelloError::Short { .. })
        ));
        assert_eq!(
            Hello::decode(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n....."),
            Err(HelloError::Magic)
        );
        let mut b = good;
        b[8] = 9;
        assert_eq!(Hello::decode(&b), Err(HelloError::Version(9)));
        let mut b = good;
        b[20..24].copy_from_slice(&5000u32.to_le_bytes());
        assert!(matches!(
            Hello::decode(&b),
            Err(HelloError::Field {
                field: "ring_bytes",
                ..
            })
        ));
        let mut b = good;
        b[31] = 1;
        assert!(matches!(
            Hello::decode(&b),
            Err(HelloError::Field {
                field: "reserved",
                ..
            })
        ));
        assert!(could_be_hello(b"NGPR"));
        assert!(!could_be_hello(b"GET "));
        assert!(could_be_answer(&Answer::Accepted.encode()[..3]));
    }
}
